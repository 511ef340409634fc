//! `kafka-lock status`: who holds a lock and who waits, read from the group coordinator with
//! DescribeGroups and the members' own metadata and assignment bytes. It never joins the group,
//! so looking does not disturb the lock. With a ledger it also shows the last hold and the last
//! checkpoint, which outlive the group.

use std::io::Write;
use std::time::Duration;

use kafka_lock::assign::{
    decode_consumer_assignment, MemberMetadata, NativeAssignment, CONSUMER_PROTOCOL_TYPE,
    PROTOCOL_TYPE,
};
use kafka_lock::backoff::Backoff;
use kafka_lock::driver::{connect_any, BootstrapConfig, ConnConfig, Connection};
use kafka_lock::wire::coordinator::{find_coordinator_request, found_coordinator};
use kafka_lock::wire::Response;
use kafka_lock::{
    Checkpoint, CheckpointSource, Error, Hold, HoldEnd, KafkaCode, LockOptions, Result,
};
use kafka_protocol::messages::describe_groups_request::DescribeGroupsRequest;
use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::{ApiKey, GroupId};
use kafka_protocol::protocol::StrBytes;

use crate::exit::{self, Failure};
use crate::history;
use crate::json::{self, Obj};

/// FindCoordinator answers worth asking again (the coordinator is moving or loading).
const COORDINATOR_RETRIES: u32 = 5;
async fn ledger_view(opts: &LockOptions, topic: &str) -> Result<LedgerView> {
    let history = opts.history().await?;
    let checkpoint = match opts.committed_checkpoint().await? {
        Some(c) => Some(c),
        None => history
            .last_checkpoint()
            .map(|(value, token, _)| Checkpoint {
                value: value.to_owned(),
                token,
                source: CheckpointSource::Ledger,
            }),
    };
    Ok(LedgerView {
        topic: topic.to_owned(),
        last_hold: history.last_hold().cloned(),
        checkpoint,
    })
}

fn ledger_text(l: &LedgerView) -> String {
    let hold = match &l.last_hold {
        Some(h) => {
            let began = h
                .acquired_unix_ms
                .map(|t| format!(", began {}", history::time(t)))
                .unwrap_or_default();
            let end = match &h.end {
                HoldEnd::Released { unix_ms, .. } => {
                    format!("released at {}", history::time(*unix_ms))
                }
                HoldEnd::Lost {
                    unix_ms, reason, ..
                } => {
                    format!("lost ({reason}) at {}", history::time(*unix_ms))
                }
                HoldEnd::Open => "no end record yet (still holding, or died)".to_owned(),
                other => other.name().to_owned(),
            };
            let who = match &h.label {
                Some(l) => format!("{l} (member {})", h.member_id),
                None => format!("member {}", h.member_id),
            };
            format!("token {} by {who}{began}, {end}", h.token)
        }
        None => "none recorded".to_owned(),
    };
    let checkpoint = match &l.checkpoint {
        Some(c) => format!(
            "{:?} (stored during token {}; read from the {})",
            c.value,
            c.token,
            match c.source {
                CheckpointSource::Group => "group",
                CheckpointSource::Ledger => "ledger, the group no longer has it",
            }
        ),
        None => "none".to_owned(),
    };
    format!(
        "ledger {:?}: last hold: {hold}\ncheckpoint: {checkpoint}",
        l.topic
    )
}

fn ledger_json(l: &LedgerView) -> String {
    let hold = l.last_hold.as_ref().map(|h| {
        Obj::new()
            .int("token", h.token)
            .int("generation", h.generation)
            .str("member_id", &h.member_id)
            .opt_str("label", h.label.as_deref())
            .opt_int("acquired_unix_ms", h.acquired_unix_ms)
            .str("end", h.end.name())
            .opt_int("ended_unix_ms", h.end.unix_ms())
            .finish()
    });
    let checkpoint = l.checkpoint.as_ref().map(|c| {
        Obj::new()
            .str("value", &c.value)
            .int("token", c.token)
            .str(
                "source",
                match c.source {
                    CheckpointSource::Group => "group",
                    CheckpointSource::Ledger => "ledger",
                },
            )
            .finish()
    });
    let mut o = Obj::new().str("topic", &l.topic);
    o = match hold {
        Some(h) => o.raw("last_hold", &h),
        None => o.null("last_hold"),
    };
    o = match checkpoint {
        Some(c) => o.raw("checkpoint", &c),
        None => o.null("checkpoint"),
    };
    o.finish()
}

#[derive(Debug, Clone)]
pub struct StatusConfig {
    pub bootstrap: String,
    pub lock: String,
    pub json: bool,
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    pub client_id: String,
    pub ledger_topic: Option<String>,
}

/// What the ledger says about the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerView {
    pub topic: String,
    pub last_hold: Option<Hold>,
    pub checkpoint: Option<Checkpoint>,
}

/// One member as the coordinator describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub member_id: String,
    pub client_id: String,
    pub client_host: String,
    pub label: Option<String>,
    /// Place in the queue from its assignment: 0 holds, 1 is next; None if unknown.
    pub position: Option<i32>,
}

/// What is known about the holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderView {
    /// This member holds it; the token is unknown in consumer-compatible mode.
    Known {
        member_id: String,
        label: Option<String>,
        token: Option<i32>,
    },
    /// The group has members but no assignment names a holder (forming, or nobody may hold).
    Nobody,
    /// The coordinator's answer does not say; the reason is shown as is.
    Unknown(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub lock: String,
    pub coordinator: String,
    pub state: String,
    pub protocol_type: String,
    pub protocol: String,
    pub holder: HolderView,
    /// Native mode: every holder, `holder` first, as (permit slot, member id, label, token).
    pub holders: Vec<(u16, String, Option<String>, i32)>,
    /// The group's number of permits, from the assignment (native mode).
    pub permits: Option<u16>,
    /// Everyone but the holders, in queue order where known.
    pub waiters: Vec<Member>,
}

pub async fn status(c: StatusConfig) -> Result<u8, Failure> {
    let mut opts = LockOptions::new(&c.bootstrap, c.lock.clone())
        .client_id(c.client_id.clone())
        .request_timeout(c.request_timeout)
        .connect_timeout(c.connect_timeout);
    if let Some(t) = &c.ledger_topic {
        opts = opts.ledger_topic(t.clone());
    }
    opts.validate()
        .map_err(|e| exit::failure(&e, &c.lock, &c.bootstrap))?;
    let report = describe(&c)
        .await
        .map_err(|e| exit::failure(&e, &c.lock, &c.bootstrap))?;
    let ledger = match &c.ledger_topic {
        Some(topic) => Some(
            ledger_view(&opts, topic)
                .await
                .map_err(|e| exit::failure(&e, &c.lock, &c.bootstrap))?,
        ),
        None => None,
    };
    let out = match (c.json, &ledger) {
        (false, None) => to_text(&report),
        (true, None) => to_json(&report),
        (false, Some(l)) => format!("{}\n{}", to_text(&report), ledger_text(l)),
        (true, Some(l)) => {
            // The same object, one key more.
            let base = to_json(&report);
            format!(
                "{},\"ledger\":{}}}",
                base.strip_suffix('}').unwrap_or(&base),
                ledger_json(l)
            )
        }
    };
    // A closed stdout or one whose reader is gone loses the answer but not the exit status
    // (println! would panic, and the release build aborts on a panic).
    let _ = writeln!(std::io::stdout(), "{out}");
    Ok(exit_status(&report.holder))
}

/// What scripts branch on: 0 held, 3 free, 4 unknown (`status --help`).
pub fn exit_status(holder: &HolderView) -> u8 {
    match holder {
        HolderView::Known { .. } => 0,
        HolderView::Nobody => exit::STATUS_FREE,
        HolderView::Unknown(_) => exit::STATUS_UNKNOWN,
    }
}

async fn describe(c: &StatusConfig) -> Result<Report> {
    let bootstrap: Vec<String> = c
        .bootstrap
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let cfg = ConnConfig::default()
        .with_client_id(Some(c.client_id.clone()))
        .with_connect_timeout(c.connect_timeout)
        .with_request_timeout(c.request_timeout);
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1), 2.0, 0.5);
    let limits = BootstrapConfig::default()
        .with_deadline(c.connect_timeout * 3)
        .with_max_rounds(3);
    let first = connect_any(&bootstrap, &cfg, &mut backoff, &limits).await?;
    let coordinator = find_coordinator(&first, &c.lock, c.request_timeout, &mut backoff).await?;
    let conn = if coordinator == first.peer() {
        first
    } else {
        first.close();
        Connection::connect(&coordinator, &cfg).await?
    };
    let mut req = DescribeGroupsRequest::default();
    req.groups = vec![GroupId(StrBytes::from_string(c.lock.clone()))];
    let resp = match conn.request(req).await? {
        Response::DescribeGroups(r) => r,
        other => {
            return Err(Error::Protocol(format!(
                "expected DescribeGroups, got {:?}",
                other.api_key()
            )))
        }
    };
    conn.close();
    let Some(group) = resp
        .groups
        .into_iter()
        .find(|g| g.group_id.0.as_str() == c.lock)
    else {
        return Err(Error::Protocol(format!(
            "DescribeGroups did not describe group {:?}",
            c.lock
        )));
    };
    // Apache Kafka answers DescribeGroups v6+ for a group that does not exist (never used, or
    // deleted while empty) with GROUP_ID_NOT_FOUND: a lock nobody holds or waits for, like the
    // "Dead" state older versions report (with a ledger, its story is told from there).
    let mut group = group;
    if group.error_code == KafkaCode::GROUP_ID_NOT_FOUND.0 {
        group.error_code = 0;
        group.group_state = StrBytes::from_static_str("Dead");
        group.members.clear();
    }
    if group.error_code != 0 {
        return Err(Error::broker(
            ApiKey::DescribeGroups,
            KafkaCode(group.error_code),
            group.error_message.as_ref().map(|m| m.as_str()),
        ));
    }
    Ok(analyse(&c.lock, &coordinator, &group))
}

async fn find_coordinator(
    conn: &Connection,
    group: &str,
    timeout: Duration,
    backoff: &mut Backoff,
) -> Result<String> {
    let Some(version) = conn.versions().get(ApiKey::FindCoordinator) else {
        return Err(Error::Protocol(format!(
            "broker {} does not offer FindCoordinator",
            conn.peer()
        )));
    };
    // v4 moved the key into a batch; kafka-lock builds up to v4 (what Kafka 3.x-4.x offers).
    let version = version.min(4);
    let mut attempt = 0;
    loop {
        let req = find_coordinator_request(group, version);
        let r = match conn.request_at(req, version, timeout).await? {
            Response::FindCoordinator(r) => r,
            other => {
                return Err(Error::Protocol(format!(
                    "expected FindCoordinator, got {:?}",
                    other.api_key()
                )))
            }
        };
        match found_coordinator(&r) {
            Ok(c) => return Ok(format!("{}:{}", c.host, c.port)),
            Err(e) => {
                attempt += 1;
                if !e.is_retriable() || attempt >= COORDINATOR_RETRIES {
                    return Err(e);
                }
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Reads holder and queue out of the description. Peer bytes that do not decode are shown as
/// unknown rather than trusted.
pub fn analyse(lock: &str, coordinator: &str, g: &DescribedGroup) -> Report {
    let protocol_type = g.protocol_type.to_string();
    let mut report = Report {
        lock: lock.to_owned(),
        coordinator: coordinator.to_owned(),
        state: g.group_state.to_string(),
        protocol_type: protocol_type.clone(),
        protocol: g.protocol_data.to_string(),
        holder: HolderView::Nobody,
        holders: Vec::new(),
        permits: None,
        waiters: Vec::new(),
    };
    if g.members.is_empty() {
        return report;
    }
    if g.members
        .iter()
        .all(|m| m.member_metadata.is_empty() && m.member_assignment.is_empty())
    {
        report.holder =
            HolderView::Unknown("the broker does not report member assignments".to_owned());
        report.waiters = g
            .members
            .iter()
            .map(|m| Member {
                member_id: m.member_id.to_string(),
                client_id: m.client_id.to_string(),
                client_host: m.client_host.to_string(),
                label: None,
                position: None,
            })
            .collect();
        return report;
    }
    let mut members = Vec::new();
    let mut holder: Option<HolderView> = None;
    let mut saw_assignment = false;
    for m in &g.members {
        let mut row = Member {
            member_id: m.member_id.to_string(),
            client_id: m.client_id.to_string(),
            client_host: m.client_host.to_string(),
            label: None,
            position: None,
        };
        if protocol_type == PROTOCOL_TYPE {
            row.label = MemberMetadata::decode(&m.member_metadata)
                .ok()
                .and_then(|md| md.label);
            if let Ok(a) = NativeAssignment::decode(&m.member_assignment) {
                saw_assignment = true;
                row.position = (a.position >= 0).then_some(a.position);
                if report.permits.is_none() {
                    report.permits = Some(a.permits);
                }
                if let Some(h) = a.holder.clone() {
                    let newer = match &holder {
                        Some(HolderView::Known { token: Some(t), .. }) => h.generation > *t,
                        _ => true,
                    };
                    if newer {
                        report.permits = Some(a.permits);
                        report.holders = a
                            .holders()
                            .map(|o| (o.slot, o.member_id.clone(), o.label.clone(), o.generation))
                            .collect();
                        holder = Some(HolderView::Known {
                            member_id: h.member_id,
                            label: h.label,
                            token: Some(h.generation),
                        });
                    }
                }
            }
        } else if protocol_type == CONSUMER_PROTOCOL_TYPE && !m.member_assignment.is_empty() {
            // An empty consumer assignment decodes as "nothing assigned", which is not known
            // here: Apache sends empty bytes while the group rebalances.
            if let Ok(topics) = decode_consumer_assignment(&m.member_assignment) {
                saw_assignment = true;
                let holds = topics.iter().any(|(_, parts)| parts.contains(&0));
                row.position = Some(if holds { 0 } else { 1 });
                if holds {
                    holder = Some(HolderView::Known {
                        member_id: row.member_id.clone(),
                        label: None,
                        token: None,
                    });
                }
            }
        }
        members.push(row);
    }
    report.holder = match holder {
        Some(h) => h,
        None if protocol_type != PROTOCOL_TYPE && protocol_type != CONSUMER_PROTOCOL_TYPE => HolderView::Unknown(format!(
            "the group speaks protocol type {protocol_type:?}, not kafka-lock's; another application uses this group id"
        )),
        None if !saw_assignment => HolderView::Unknown(format!(
            "no assignment is in force (the group is {}); ask again in a moment",
            report.state
        )),
        None => HolderView::Nobody,
    };
    if let HolderView::Known {
        member_id, label, ..
    } = &mut report.holder
    {
        // The holder's own metadata has the current label; the assignment's is as old as it.
        if let Some(row) = members.iter().find(|r| &r.member_id == member_id) {
            if row.label.is_some() {
                *label = row.label.clone();
            }
        }
        let id = member_id.clone();
        members.retain(|r| r.member_id != id);
    }
    for (_, id, label, _) in &mut report.holders {
        if let Some(row) = members.iter().find(|r| &r.member_id == id) {
            if row.label.is_some() {
                *label = row.label.clone();
            }
        }
        members.retain(|r| &r.member_id != id);
    }
    members.sort_by(|a, b| {
        let key = |m: &Member| m.position.unwrap_or(i32::MAX);
        key(a)
            .cmp(&key(b))
            .then_with(|| a.member_id.cmp(&b.member_id))
    });
    report.waiters = members;
    report
}

fn member_text(m: &Member) -> String {
    let mut s = match &m.label {
        Some(l) => format!("{l} (member {})", m.member_id),
        None => format!("member {}", m.member_id),
    };
    if !m.client_host.is_empty() {
        s.push_str(&format!(" from {}", m.client_host));
    }
    s
}

pub fn to_text(r: &Report) -> String {
    let mut out = format!("lock {:?} (coordinator {})\n", r.lock, r.coordinator);
    let protocol = match (r.protocol_type.as_str(), r.protocol.as_str()) {
        ("", _) => String::new(),
        (t, "") => format!(", protocol type {t}"),
        (t, p) => format!(", protocol {t}/{p}"),
    };
    out.push_str(&format!("state: {}{protocol}\n", r.state));
    let holder = match &r.holder {
        HolderView::Known {
            member_id,
            label,
            token,
        } => {
            let token = token.map(|t| format!(", token {t}")).unwrap_or_default();
            match label {
                Some(l) => format!("{l} (member {member_id}{token})"),
                None => format!("member {member_id}{token}"),
            }
        }
        HolderView::Nobody if r.waiters.is_empty() => "nobody (no members)".to_owned(),
        HolderView::Nobody => "nobody".to_owned(),
        HolderView::Unknown(why) => format!("unknown: {why}"),
    };
    match r.permits {
        Some(n) if n > 1 => {
            out.push_str(&format!("holders ({} of {n} permits):\n", r.holders.len()));
            for (slot, id, label, token) in &r.holders {
                let who = match label {
                    Some(l) => format!("{l} (member {id}, token {token})"),
                    None => format!("member {id} (token {token})"),
                };
                out.push_str(&format!("  - permit {slot}: {who}\n"));
            }
        }
        _ => out.push_str(&format!("holder: {holder}\n")),
    }
    match &r.holder {
        HolderView::Unknown(_) => {
            out.push_str(&format!(
                "members ({}, holder and order unknown):",
                r.waiters.len()
            ));
            for m in &r.waiters {
                out.push_str(&format!("\n  - {}", member_text(m)));
            }
        }
        _ => {
            out.push_str(&format!("waiters ({}):", r.waiters.len()));
            for (i, m) in r.waiters.iter().enumerate() {
                out.push_str(&format!("\n  {}. {}", i + 1, member_text(m)));
            }
        }
    }
    out
}

pub fn to_json(r: &Report) -> String {
    let member = |m: &Member| {
        Obj::new()
            .str("member_id", &m.member_id)
            .opt_str("label", m.label.as_deref())
            .opt_int("position", m.position)
            .str("client_id", &m.client_id)
            .str("client_host", &m.client_host)
            .finish()
    };
    let members: Vec<String> = r.waiters.iter().map(member).collect();
    let mut obj = Obj::new()
        .str("lock", &r.lock)
        .str("coordinator", &r.coordinator)
        .str("state", &r.state)
        .str("protocol_type", &r.protocol_type)
        .str("protocol", &r.protocol)
        .opt_int("permits", r.permits);
    if !r.holders.is_empty() {
        let holders: Vec<String> = r
            .holders
            .iter()
            .map(|(slot, id, label, token)| {
                Obj::new()
                    .int("permit", *slot)
                    .str("member_id", id)
                    .opt_str("label", label.as_deref())
                    .int("token", *token)
                    .finish()
            })
            .collect();
        obj = obj.raw("holders", &json::array(&holders));
    }
    obj = match &r.holder {
        HolderView::Known {
            member_id,
            label,
            token,
        } => obj
            .bool("holder_known", true)
            .raw(
                "holder",
                &Obj::new()
                    .str("member_id", member_id)
                    .opt_str("label", label.as_deref())
                    .opt_int("token", *token)
                    .finish(),
            )
            .null("holder_unknown_reason")
            .raw("waiters", &json::array(&members)),
        HolderView::Nobody => obj
            .bool("holder_known", true)
            .null("holder")
            .null("holder_unknown_reason")
            .raw("waiters", &json::array(&members)),
        HolderView::Unknown(why) => obj
            .bool("holder_known", false)
            .null("holder")
            .str("holder_unknown_reason", why)
            .raw("members", &json::array(&members)),
    };
    obj.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_lock::assign::{Holder, NATIVE_PROTOCOL};
    use kafka_protocol::messages::describe_groups_response::DescribedGroupMember;

    fn member(id: &str, meta: bytes::Bytes, assignment: bytes::Bytes) -> DescribedGroupMember {
        let mut m = DescribedGroupMember::default();
        m.member_id = StrBytes::from_string(id.to_owned());
        m.member_metadata = meta;
        m.member_assignment = assignment;
        m
    }

    fn group(members: Vec<DescribedGroupMember>) -> DescribedGroup {
        let mut g = DescribedGroup::default();
        g.group_state = StrBytes::from_static_str("Stable");
        g.protocol_type = StrBytes::from_static_str(PROTOCOL_TYPE);
        g.protocol_data = StrBytes::from_static_str(NATIVE_PROTOCOL);
        g.members = members;
        g
    }

    fn meta(label: &str, holds: bool) -> bytes::Bytes {
        MemberMetadata {
            holds,
            first_joined_generation: 1,
            holder_generation: -1,
            label: Some(label.into()),
            permits: 1,
            slot: 0,
        }
        .encode()
    }

    fn assignment(position: i32) -> bytes::Bytes {
        NativeAssignment {
            holder: Some(Holder {
                member_id: "a".into(),
                label: Some("job a".into()),
                generation: 7,
                slot: 0,
            }),
            position,
            members: 3,
            permits: 1,
            other_holders: Vec::new(),
        }
        .encode()
    }

    #[test]
    fn native_assignments_name_holder_and_queue() {
        let g = group(vec![
            member("c", meta("job c", false), assignment(2)),
            member("a", meta("job a", true), assignment(0)),
            member("b", meta("job b", false), assignment(1)),
        ]);
        let r = analyse("l", "h:1", &g);
        assert_eq!(
            r.holder,
            HolderView::Known {
                member_id: "a".into(),
                label: Some("job a".into()),
                token: Some(7)
            }
        );
        let ids: Vec<&str> = r.waiters.iter().map(|m| m.member_id.as_str()).collect();
        assert_eq!(ids, ["b", "c"]);
        assert!(to_text(&r).contains("holder: job a (member a, token 7)"));
        assert_eq!(exit_status(&r.holder), 0);
        assert!(to_json(&r).contains(r#""holder":{"member_id":"a","label":"job a","token":7}"#));
    }

    #[test]
    fn empty_member_bytes_mean_holder_unknown() {
        let g = group(vec![member("a", Default::default(), Default::default())]);
        let r = analyse("l", "h:1", &g);
        assert!(
            matches!(r.holder, HolderView::Unknown(ref w) if w.contains("does not report member assignments"))
        );
        assert!(to_json(&r).contains(r#""holder_known":false"#));
        assert_eq!(exit_status(&r.holder), exit::STATUS_UNKNOWN);
    }

    #[test]
    fn a_group_without_members_or_holder_is_free() {
        let r = analyse("l", "h:1", &group(Vec::new()));
        assert_eq!(r.holder, HolderView::Nobody);
        assert_eq!(exit_status(&r.holder), exit::STATUS_FREE);
    }

    #[test]
    fn garbage_bytes_are_not_trusted() {
        let g = group(vec![member(
            "a",
            bytes::Bytes::from_static(b"\xff\xff"),
            bytes::Bytes::from_static(b"junk"),
        )]);
        let r = analyse("l", "h:1", &g);
        assert!(matches!(r.holder, HolderView::Unknown(_)), "{:?}", r.holder);
    }
}

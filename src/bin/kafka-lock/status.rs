//! `kafka-lock status`: who holds a lock and who waits, as [`LockOptions::describe`] reads them
//! from the group coordinator (it never joins the group, so looking does not disturb the lock).
//! With a ledger it also shows the last hold and the last checkpoint, which outlive the group.
//! This file only prints.

use std::io::Write;
use std::time::Duration;

use kafka_lock::{
    CheckpointSource, HoldEnd, LedgerSummary, LockDescription, LockHolder, LockMember, LockOptions,
    LockState,
};

use crate::exit::{self, Failure};
use crate::history;
use crate::json::{self, Obj};
use crate::output::shown;

fn ledger_text(l: &LedgerSummary) -> String {
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
                    format!("lost ({}) at {}", shown(reason), history::time(*unix_ms))
                }
                HoldEnd::Open => "no end record yet (still holding, or died)".to_owned(),
                other => other.name().to_owned(),
            };
            let who = match &h.label {
                Some(l) => format!("{} (member {})", shown(l), shown(&h.member_id)),
                None => format!("member {}", shown(&h.member_id)),
            };
            let permit = if h.slot > 0 {
                format!(" (permit {})", h.slot)
            } else {
                String::new()
            };
            format!("token {}{permit} by {who}{began}, {end}", h.token)
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
                _ => "place this version does not name",
            }
        ),
        None => "none".to_owned(),
    };
    format!(
        "ledger {:?}: last hold: {hold}\ncheckpoint: {checkpoint}",
        l.topic
    )
}

fn ledger_json(l: &LedgerSummary) -> String {
    let hold = l.last_hold.as_ref().map(|h| {
        Obj::new()
            .int("token", h.token)
            .int("permit", h.slot)
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
                    _ => "unknown",
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
    pub security: kafka_lock::Security,
    pub retry_backoff: Option<(Duration, Duration)>,
}

pub async fn status(c: StatusConfig) -> Result<u8, Failure> {
    let mut opts = LockOptions::new(&c.bootstrap, c.lock.clone())
        .client_id(c.client_id.clone())
        .request_timeout(c.request_timeout)
        .connect_timeout(c.connect_timeout)
        .security(c.security.clone());
    if let Some((initial, max)) = c.retry_backoff {
        opts = opts.retry_backoff(initial, max);
    }
    if let Some(t) = &c.ledger_topic {
        opts = opts.ledger_topic(t.clone());
    }
    let d = opts
        .describe()
        .await
        .map_err(|e| exit::failure(&e, &c.lock, &c.bootstrap))?;
    let out = match (c.json, &d.ledger) {
        (false, None) => to_text(&d),
        (true, None) => to_json(&d),
        (false, Some(l)) => format!("{}\n{}", to_text(&d), ledger_text(l)),
        (true, Some(l)) => {
            // The same object, one key more.
            let base = to_json(&d);
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
    Ok(exit_status(&d))
}

/// What scripts branch on: 0 held, 3 free, 4 unknown (`status --help`).
pub fn exit_status(d: &LockDescription) -> u8 {
    match d.state {
        LockState::Held => 0,
        LockState::Free => exit::STATUS_FREE,
        _ => exit::STATUS_UNKNOWN,
    }
}

/// Whether the holder (or that there is none) is known: held or free.
fn holder_known(d: &LockDescription) -> bool {
    matches!(d.state, LockState::Held | LockState::Free)
}

fn reason(d: &LockDescription) -> &str {
    d.reason.as_deref().unwrap_or("unknown")
}

fn member_text(m: &LockMember) -> String {
    let mut s = match &m.label {
        Some(l) => format!("{} (member {})", shown(l), shown(&m.member_id)),
        None => format!("member {}", shown(&m.member_id)),
    };
    if !m.client_host.is_empty() {
        s.push_str(&format!(" from {}", shown(&m.client_host)));
    }
    if let Some(why) = &m.undecodable {
        s.push_str(&format!(" [undecodable: {why}]"));
    }
    s
}

/// The state the driver (and brokers before DescribeGroups v6) give a group that does not exist.
const NO_GROUP: &str = "Dead";

pub fn to_text(d: &LockDescription) -> String {
    let mut out = format!("lock {:?} (coordinator {})\n", d.lock, d.coordinator);
    if d.group_state == NO_GROUP && d.holders.is_empty() && d.waiters.is_empty() {
        // Kafka's word for it means nothing to someone asking about a lock.
        out.push_str("no such lock (no group by that name): free");
        return out;
    }
    let protocol = match (d.protocol_type.as_str(), d.protocol_name.as_str()) {
        ("", _) => String::new(),
        (t, "") => format!(", protocol type {t}"),
        (t, p) => format!(", protocol {t}/{p}"),
    };
    let generation = d
        .generation
        .map(|g| format!(", generation {g}"))
        .unwrap_or_default();
    out.push_str(&format!("state: {}{protocol}{generation}\n", d.group_state));
    let holder = if let Some(h) = d.holders.first() {
        holder_text(h)
    } else if holder_known(d) && d.waiters.is_empty() {
        "nobody (no members)".to_owned()
    } else if holder_known(d) {
        "nobody".to_owned()
    } else {
        format!("unknown: {}", reason(d))
    };
    match d.permits {
        // A semaphore: every holder, with its permit.
        Some(n) if n > 1 && !d.holders.is_empty() => {
            out.push_str(&format!("holders ({} of {n} permits):\n", d.holders.len()));
            for h in &d.holders {
                out.push_str(&format!("  - permit {}: {}\n", h.permit, holder_text(h)));
            }
        }
        _ => out.push_str(&format!("holder: {holder}\n")),
    }
    if holder_known(d) {
        out.push_str(&format!("waiters ({}):", d.waiters.len()));
        for (i, m) in d.waiters.iter().enumerate() {
            out.push_str(&format!("\n  {}. {}", i + 1, member_text(m)));
        }
    } else {
        out.push_str(&format!(
            "members ({}, holder and order unknown):",
            d.waiters.len()
        ));
        for m in &d.waiters {
            out.push_str(&format!("\n  - {}", member_text(m)));
        }
    }
    out
}

fn holder_text(h: &LockHolder) -> String {
    let m = &h.member;
    let mut token = h
        .generation
        .map(|g| format!(", generation {g}"))
        .unwrap_or_default();
    // The fencing token is the ledger's: without an open hold read from it, say so rather than
    // give the generation under the token's name.
    match h.ledger_token {
        Some(t) => token.push_str(&format!(", token {t}")),
        None => token.push_str(", token unknown (only its ledger hold tells it: --ledger-topic)"),
    }
    match &m.label {
        Some(l) => format!("{} (member {}{token})", shown(l), shown(&m.member_id)),
        None => format!("member {}{token}", shown(&m.member_id)),
    }
}

fn holder_json(h: &LockHolder) -> String {
    Obj::new()
        .str("member_id", &h.member.member_id)
        .opt_str("label", h.member.label.as_deref())
        .opt_int("generation", h.generation)
        // The fencing token, null when no ledger hold of this holder was read.
        .opt_int("token", h.ledger_token)
        .opt_int("ledger_token", h.ledger_token)
        .str("client_id", &h.member.client_id)
        .str("client_host", &h.member.client_host)
        .int("permit", h.permit)
        .finish()
}

fn member_json(m: &LockMember) -> String {
    Obj::new()
        .str("member_id", &m.member_id)
        .opt_str("label", m.label.as_deref())
        .opt_int("position", m.position)
        .str("client_id", &m.client_id)
        .str("client_host", &m.client_host)
        .opt_str("undecodable", m.undecodable.as_deref())
        .finish()
}

pub fn to_json(d: &LockDescription) -> String {
    let members: Vec<String> = d.waiters.iter().map(member_json).collect();
    let mut obj = Obj::new()
        .str("lock", &d.lock)
        .str("coordinator", &d.coordinator)
        .str("state", &d.group_state)
        .str("lock_state", d.state.as_str())
        .opt_int("generation", d.generation)
        .str("protocol_type", &d.protocol_type)
        .str("protocol", &d.protocol_name)
        .opt_int("permits", d.permits);
    let holders: Vec<String> = d.holders.iter().map(holder_json).collect();
    // Every holder with its permit; `holder` is the first of them.
    obj = obj.raw("holders", &json::array(&holders));
    obj = match (d.holders.first(), holder_known(d)) {
        (Some(h), _) => obj
            .bool("holder_known", true)
            .raw("holder", &holder_json(h))
            .null("holder_unknown_reason")
            .raw("waiters", &json::array(&members)),
        (None, true) => obj
            .bool("holder_known", true)
            .null("holder")
            .null("holder_unknown_reason")
            .raw("waiters", &json::array(&members)),
        (None, false) => obj
            .bool("holder_known", false)
            .null("holder")
            .str("holder_unknown_reason", reason(d))
            .raw("members", &json::array(&members)),
    };
    obj.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_lock::internals::assign::{
        Holder, MemberMetadata, NativeAssignment, NATIVE_PROTOCOL, PROTOCOL_TYPE,
    };
    use kafka_lock::internals::describe::analyse;
    use kafka_protocol::messages::describe_groups_response::{
        DescribedGroup, DescribedGroupMember,
    };
    use kafka_protocol::protocol::StrBytes;

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
            ledger: None,
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
            ledger: None,
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
        let d = analyse("l", "h:1", &g);
        assert!(to_text(&d).contains(
            "holder: job a (member a, generation 7, token unknown (only its ledger hold tells it"
        ));
        assert_eq!(exit_status(&d), 0);
        assert!(to_json(&d)
            .contains(r#""holder":{"member_id":"a","label":"job a","generation":7,"token":null"#));
        assert!(to_json(&d).contains(r#""lock_state":"held","generation":7"#));
    }

    #[test]
    fn empty_member_bytes_mean_holder_unknown() {
        let g = group(vec![member("a", Default::default(), Default::default())]);
        let d = analyse("l", "h:1", &g);
        let j = to_json(&d);
        assert!(j.contains(r#""holder_known":false"#), "{j}");
        assert!(j.contains("does not report member assignments"), "{j}");
        assert_eq!(exit_status(&d), exit::STATUS_UNKNOWN);
    }

    #[test]
    fn a_group_without_members_or_holder_is_free() {
        let d = analyse("l", "h:1", &group(Vec::new()));
        assert_eq!(exit_status(&d), exit::STATUS_FREE);
        assert!(to_text(&d).contains("holder: nobody (no members)"));
    }

    #[test]
    fn a_group_that_does_not_exist_is_no_such_lock() {
        let mut g = group(Vec::new());
        g.group_state = StrBytes::from_static_str("Dead");
        let d = analyse("l", "h:1", &g);
        assert_eq!(exit_status(&d), exit::STATUS_FREE);
        let text = to_text(&d);
        assert!(
            text.ends_with("\nno such lock (no group by that name): free")
                && !text.contains("Dead"),
            "{text}"
        );
    }

    #[test]
    fn garbage_bytes_are_shown_not_trusted() {
        let g = group(vec![member(
            "a",
            bytes::Bytes::from_static(b"\xff\xff"),
            bytes::Bytes::from_static(b"junk"),
        )]);
        let d = analyse("l", "h:1", &g);
        assert_eq!(exit_status(&d), exit::STATUS_UNKNOWN);
        assert!(
            to_text(&d).contains("[undecodable: metadata"),
            "{}",
            to_text(&d)
        );
        assert!(to_json(&d).contains(r#""undecodable":"metadata"#));
    }
}

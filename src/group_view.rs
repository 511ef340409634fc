//! What a lock looks like from outside: who holds it, who waits, in which generation, at which
//! coordinator. [`LockOptions::describe`](crate::LockOptions::describe) shows it, and a lock
//! looks before joining ([`LockOptions::try_acquire`](crate::LockOptions::try_acquire)).
//!
//! The coordinator's DescribeGroups answer carries every member's JoinGroup metadata and the
//! assignment the group leader gave it; [`analyse`] reads holders and queue out of those bytes.
//! It is sans-I/O and total: the bytes come from other members and are untrusted, so a member
//! whose bytes do not decode is listed with the reason ([`LockMember::undecodable`]) and never
//! counted as a holder. Describing never joins the group, so it never causes a rebalance.

use kafka_protocol::messages::describe_groups_response::DescribedGroup;

use crate::assign::{
    decode_consumer_assignment, MemberMetadata, NativeAssignment, CONSUMER_PROTOCOL_TYPE,
    PROTOCOL_TYPE,
};
use crate::ledger::{Checkpoint, Hold};

/// Whether the lock is held, as far as the coordinator's answer tells.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockState {
    /// At least one member holds it.
    Held,
    /// Nobody holds it: no members (the group is empty or does not exist), or an assignment in
    /// force names no holder.
    Free,
    /// The group is between generations and no assignment is in force.
    Rebalancing,
    /// The answer does not say (the broker does not report assignments, or the group id is
    /// used by another application); [`LockDescription::reason`] says why.
    Unknown,
}

impl LockState {
    /// `held`, `free`, `rebalancing` or `unknown`.
    pub fn as_str(&self) -> &'static str {
        match self {
            LockState::Held => "held",
            LockState::Free => "free",
            LockState::Rebalancing => "rebalancing",
            LockState::Unknown => "unknown",
        }
    }
}

/// Which group protocol the lock's members speak.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockProtocol {
    /// kafka-lock's own (protocol type `kafka-lock`).
    Native,
    /// Consumer-compatible (protocol type `consumer`); tokens are not visible from outside.
    ConsumerCompatible,
    /// No members, so no protocol.
    None,
    /// Something else: another application uses this group id.
    Other,
}

/// One member of the lock's group as the coordinator describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockMember {
    /// Its member id.
    pub member_id: String,
    /// The client id it connected with.
    pub client_id: String,
    /// The address the coordinator sees it connect from.
    pub client_host: String,
    /// The label from its own metadata.
    pub label: Option<String>,
    /// Its place in the queue from its assignment: 0 holds, 1 is next; `None` if unknown.
    pub position: Option<i32>,
    /// Why its metadata or assignment could not be read, if it could not: such a member is
    /// never counted as a holder.
    pub undecodable: Option<String>,
}

/// A member that holds the lock (one of its permits, for a semaphore).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockHolder {
    /// The member.
    pub member: LockMember,
    /// The generation that granted the hold: with the member id, the fencing token in native
    /// mode without a ledger. `None` in consumer-compatible mode.
    pub generation: Option<i32>,
    /// The ledger token of the hold (the offset of its ACQUIRED record), when a ledger was read
    /// and its last hold is this member's and has not ended.
    pub ledger_token: Option<i64>,
    /// Which permit slot it holds (`LockOptions::permits`); always 0 for a mutex.
    pub permit: u32,
}

/// What a lock's ledger says (see [`LockOptions::history`](crate::LockOptions::history)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LedgerSummary {
    /// The ledger topic.
    pub topic: String,
    /// The last hold recorded, ended or not.
    pub last_hold: Option<Hold>,
    /// The last checkpoint: the group's committed one, else the ledger's copy.
    pub checkpoint: Option<Checkpoint>,
}

/// A lock as seen from outside its group.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockDescription {
    /// The lock's name (the group id).
    pub lock: String,
    /// The group coordinator, `host:port`.
    pub coordinator: String,
    /// Held, free, rebalancing or unknown.
    pub state: LockState,
    /// Why the state is unknown or rebalancing, in words.
    pub reason: Option<String>,
    /// The group's state as the broker names it (`Stable`, `PreparingRebalance`, `Empty`,
    /// `Dead`, ...).
    pub group_state: String,
    /// The protocol family.
    pub protocol: LockProtocol,
    /// The group's protocol type as the broker reports it (`kafka-lock`, `consumer`, ...).
    pub protocol_type: String,
    /// The chosen protocol (assignor) name.
    pub protocol_name: String,
    /// The generation of the assignment in force, when an assignment tells it.
    pub generation: Option<i32>,
    /// The holders, by ascending permit: at most one for a mutex, at most `permits` for a
    /// semaphore.
    pub holders: Vec<LockHolder>,
    /// The group's number of permits, from the assignment in force (native mode; 1 for a
    /// mutex); `None` when no native assignment tells it.
    pub permits: Option<u16>,
    /// Everyone else, in queue order where known (FIFO), then by member id.
    pub waiters: Vec<LockMember>,
    /// The ledger's view, when the options name a ledger topic.
    pub ledger: Option<LedgerSummary>,
}

impl LockDescription {
    /// The holder, if exactly one member holds the lock.
    pub fn holder(&self) -> Option<&LockHolder> {
        match self.holders.as_slice() {
            [one] => Some(one),
            _ => None,
        }
    }

    /// Adds the ledger's view, and the ledger token of a holder whose hold it records as open.
    pub(crate) fn with_ledger(
        mut self,
        topic: &str,
        last_hold: Option<Hold>,
        checkpoint: Option<Checkpoint>,
    ) -> Self {
        if let Some(h) = &last_hold {
            if h.end == crate::ledger::HoldEnd::Open {
                for holder in &mut self.holders {
                    if holder.member.member_id == h.member_id {
                        holder.ledger_token = Some(h.token);
                    }
                }
            }
        }
        self.ledger = Some(LedgerSummary {
            topic: topic.to_owned(),
            last_hold,
            checkpoint,
        });
        self
    }
}

/// Reads holders and queue out of a DescribeGroups answer for `lock`, got from `coordinator`.
///
/// Total over any bytes: a member whose metadata or assignment does not decode is listed with
/// [`LockMember::undecodable`] set and is never a holder. Hidden: users call
/// [`LockOptions::describe`](crate::LockOptions::describe); the CLI's tests print its results.
#[doc(hidden)]
pub fn analyse(lock: &str, coordinator: &str, g: &DescribedGroup) -> LockDescription {
    let protocol_type = g.protocol_type.to_string();
    let protocol = match protocol_type.as_str() {
        PROTOCOL_TYPE => LockProtocol::Native,
        CONSUMER_PROTOCOL_TYPE => LockProtocol::ConsumerCompatible,
        "" => LockProtocol::None,
        _ => LockProtocol::Other,
    };
    let group_state = g.group_state.to_string();
    let mut d = LockDescription {
        lock: lock.to_owned(),
        coordinator: coordinator.to_owned(),
        state: LockState::Free,
        reason: None,
        group_state: group_state.clone(),
        protocol: protocol.clone(),
        protocol_type: protocol_type.clone(),
        protocol_name: g.protocol_data.to_string(),
        generation: None,
        holders: Vec::new(),
        permits: None,
        waiters: Vec::new(),
        ledger: None,
    };
    if g.members.is_empty() {
        return d;
    }
    let rebalancing = matches!(
        group_state.as_str(),
        "PreparingRebalance" | "CompletingRebalance"
    );
    if g.members
        .iter()
        .all(|m| m.member_metadata.is_empty() && m.member_assignment.is_empty())
    {
        // Apache Kafka leaves the bytes out between generations; tansu always does.
        if rebalancing {
            d.state = LockState::Rebalancing;
            d.reason = Some(format!(
                "no assignment is in force (the group is {group_state}); ask again in a moment"
            ));
        } else {
            d.state = LockState::Unknown;
            d.reason = Some("the broker does not report member assignments".to_owned());
        }
        d.waiters = g.members.iter().map(bare_member).collect();
        return d;
    }
    let read = read_members(g, &protocol, &mut d.permits);
    let mut members = read.members;
    let nobody_holds = read.holders.is_empty();
    place_holders(&mut d, &mut members, read.holders);
    if nobody_holds && protocol == LockProtocol::Other {
        d.state = LockState::Unknown;
        d.reason = Some(format!(
            "the group speaks protocol type {protocol_type:?}, not kafka-lock's; another application uses this group id"
        ));
    } else if nobody_holds && !read.saw_assignment {
        d.state = if rebalancing {
            LockState::Rebalancing
        } else {
            LockState::Unknown
        };
        d.reason = Some(format!(
            "no assignment is in force (the group is {group_state}); ask again in a moment"
        ));
    }
    members.sort_by(|a, b| {
        let key = |m: &LockMember| m.position.unwrap_or(i32::MAX);
        key(a)
            .cmp(&key(b))
            .then_with(|| a.member_id.cmp(&b.member_id))
    });
    d.waiters = members;
    d
}

/// A member as the coordinator names it, before its bytes are read.
fn bare_member(
    m: &kafka_protocol::messages::describe_groups_response::DescribedGroupMember,
) -> LockMember {
    LockMember {
        member_id: m.member_id.to_string(),
        client_id: m.client_id.to_string(),
        client_host: m.client_host.to_string(),
        label: None,
        position: None,
        undecodable: None,
    }
}

/// Per holder: (member id, label from the assignment, generation, permit).
type HolderRow = (String, Option<String>, Option<i32>, u32);

/// What the members' own bytes say, before holders are told apart from waiters.
struct ReadMembers {
    /// Every member, holders included, with what its bytes decoded to.
    members: Vec<LockMember>,
    /// From the newest assignment that names any.
    holders: Vec<HolderRow>,
    /// Whether any member's assignment decoded.
    saw_assignment: bool,
}

/// Decodes every member's metadata and assignment. `permits` is set from the assignment the
/// holders are taken from (or, while none names a holder, from the first that decodes).
fn read_members(
    g: &DescribedGroup,
    protocol: &LockProtocol,
    permits: &mut Option<u16>,
) -> ReadMembers {
    let mut members = Vec::new();
    let mut holders: Vec<HolderRow> = Vec::new();
    let mut saw_assignment = false;
    for m in &g.members {
        let mut row = bare_member(m);
        if *protocol == LockProtocol::Native {
            match MemberMetadata::decode(&m.member_metadata) {
                Ok(md) => row.label = md.label,
                Err(e) => row.undecodable = Some(format!("metadata: {e}")),
            }
            match NativeAssignment::decode(&m.member_assignment) {
                Ok(a) => {
                    saw_assignment = true;
                    row.position = (a.position >= 0).then_some(a.position);
                    if let Some(h) = &a.holder {
                        let newer = match holders.first() {
                            Some((_, _, Some(g), _)) => h.generation > *g,
                            _ => true,
                        };
                        if newer {
                            *permits = Some(a.permits);
                            holders = a
                                .holders()
                                .map(|h| {
                                    let (id, label) = (h.member_id.clone(), h.label.clone());
                                    (id, label, Some(h.generation), u32::from(h.slot))
                                })
                                .collect();
                        }
                    } else if permits.is_none() {
                        *permits = Some(a.permits);
                    }
                }
                Err(e) if row.undecodable.is_none() => {
                    row.undecodable = Some(format!("assignment: {e}"))
                }
                Err(_) => {}
            }
        } else if *protocol == LockProtocol::ConsumerCompatible && !m.member_assignment.is_empty() {
            // An empty consumer assignment decodes as "nothing assigned", which is not known
            // here: Apache sends empty bytes while the group rebalances.
            match decode_consumer_assignment(&m.member_assignment) {
                Ok(topics) => {
                    saw_assignment = true;
                    let holds = topics.iter().any(|(_, parts)| parts.contains(&0));
                    row.position = Some(if holds { 0 } else { 1 });
                    if holds {
                        holders = vec![(row.member_id.clone(), None, None, 0)];
                    }
                }
                Err(e) => row.undecodable = Some(format!("assignment: {e}")),
            }
        }
        members.push(row);
    }
    ReadMembers {
        members,
        holders,
        saw_assignment,
    }
}

/// Moves each holder out of `members` into `d.holders`, marking the lock held.
fn place_holders(d: &mut LockDescription, members: &mut Vec<LockMember>, holders: Vec<HolderRow>) {
    for (member_id, label, generation, permit) in holders {
        d.state = LockState::Held;
        d.generation = generation;
        // The holder's own metadata has the current label; the assignment's is as old as
        // the hold. A holder named by assignments but no longer a member (it left after
        // the last SyncGroup) is still reported: the assignment is what is in force.
        let member = match members.iter().position(|r| r.member_id == member_id) {
            Some(i) => {
                let mut row = members.remove(i);
                if row.label.is_none() {
                    row.label = label;
                }
                row
            }
            None => LockMember {
                member_id,
                client_id: String::new(),
                client_host: String::new(),
                label,
                position: Some(0),
                undecodable: None,
            },
        };
        d.holders.push(LockHolder {
            member,
            generation,
            ledger_token: None,
            permit,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assign::{consumer_assignment, Holder, NATIVE_PROTOCOL};
    use bytes::Bytes;
    use kafka_protocol::messages::describe_groups_response::DescribedGroupMember;
    use kafka_protocol::protocol::StrBytes;

    fn member(id: &str, meta: Bytes, assignment: Bytes) -> DescribedGroupMember {
        let mut m = DescribedGroupMember::default();
        m.member_id = StrBytes::from_string(id.to_owned());
        m.client_host = StrBytes::from_static_str("/127.0.0.1");
        m.member_metadata = meta;
        m.member_assignment = assignment;
        m
    }

    fn group(
        state: &'static str,
        ptype: &'static str,
        members: Vec<DescribedGroupMember>,
    ) -> DescribedGroup {
        let mut g = DescribedGroup::default();
        g.group_state = StrBytes::from_static_str(state);
        g.protocol_type = StrBytes::from_static_str(ptype);
        g.protocol_data = StrBytes::from_static_str(NATIVE_PROTOCOL);
        g.members = members;
        g
    }

    fn meta(label: &str) -> Bytes {
        MemberMetadata {
            holds: false,
            first_joined_generation: 1,
            holder_generation: -1,
            label: Some(label.into()),
            permits: 1,
            slot: 0,
            ledger: None,
        }
        .encode()
    }

    fn assignment(position: i32, generation: i32) -> Bytes {
        NativeAssignment {
            holder: Some(Holder {
                member_id: "a".into(),
                label: Some("old label".into()),
                generation,
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

    /// Three permits, "a" in slot 0 and "c" in slot 2 at generation 9, "b" waiting.
    fn semaphore_assignment(position: i32) -> Bytes {
        let holder = |id: &str, slot| Holder {
            member_id: id.into(),
            label: None,
            generation: 9,
            slot,
        };
        NativeAssignment {
            holder: Some(holder("a", 0)),
            position,
            members: 3,
            permits: 3,
            other_holders: vec![holder("c", 2)],
            ledger: None,
        }
        .encode()
    }

    #[test]
    fn every_holder_of_a_semaphore_with_its_permit() {
        let g = group(
            "Stable",
            PROTOCOL_TYPE,
            vec![
                member("b", meta("job b"), semaphore_assignment(1)),
                member("c", meta("job c"), semaphore_assignment(0)),
                member("a", meta("job a"), semaphore_assignment(0)),
            ],
        );
        let d = analyse("l", "h:1", &g);
        assert_eq!(d.state, LockState::Held);
        assert_eq!(d.permits, Some(3));
        let held: Vec<(&str, u32, Option<&str>)> = d
            .holders
            .iter()
            .map(|h| {
                (
                    h.member.member_id.as_str(),
                    h.permit,
                    h.member.label.as_deref(),
                )
            })
            .collect();
        assert_eq!(held, [("a", 0, Some("job a")), ("c", 2, Some("job c"))]);
        assert!(d.holder().is_none(), "more than one holder");
        let waiting: Vec<&str> = d.waiters.iter().map(|w| w.member_id.as_str()).collect();
        assert_eq!(waiting, ["b"]);
    }

    #[test]
    fn holder_queue_and_generation_from_native_assignments() {
        let g = group(
            "Stable",
            PROTOCOL_TYPE,
            vec![
                member("c", meta("job c"), assignment(2, 7)),
                member("a", meta("job a"), assignment(0, 7)),
                member("b", meta("job b"), assignment(1, 7)),
            ],
        );
        let d = analyse("l", "h:1", &g);
        assert_eq!(d.state, LockState::Held);
        assert_eq!(d.generation, Some(7));
        assert_eq!(d.protocol, LockProtocol::Native);
        let h = d.holder().expect("one holder");
        assert_eq!(h.member.member_id, "a");
        assert_eq!(h.member.label.as_deref(), Some("job a"));
        assert_eq!(h.generation, Some(7));
        let ids: Vec<&str> = d.waiters.iter().map(|m| m.member_id.as_str()).collect();
        assert_eq!(ids, ["b", "c"]);
    }

    #[test]
    fn a_garbage_member_is_undecodable_and_never_a_holder() {
        let g = group(
            "Stable",
            PROTOCOL_TYPE,
            vec![
                member("a", meta("job a"), assignment(0, 3)),
                member(
                    "z",
                    Bytes::from_static(b"\xff\xff\x00"),
                    Bytes::from_static(b"ka\x01\x00\x01"),
                ),
            ],
        );
        let d = analyse("l", "h:1", &g);
        assert_eq!(d.state, LockState::Held);
        assert_eq!(d.holder().unwrap().member.member_id, "a");
        let z = &d.waiters[0];
        assert_eq!(z.member_id, "z");
        assert!(
            z.undecodable.as_deref().unwrap().starts_with("metadata"),
            "{z:?}"
        );
    }

    #[test]
    fn only_garbage_is_unknown_not_free() {
        let g = group(
            "Stable",
            PROTOCOL_TYPE,
            vec![member(
                "a",
                Bytes::from_static(b"\xff"),
                Bytes::from_static(b"junk"),
            )],
        );
        let d = analyse("l", "h:1", &g);
        assert_eq!(d.state, LockState::Unknown);
        assert!(d.holders.is_empty());
        assert!(d.waiters[0].undecodable.is_some());
    }

    #[test]
    fn an_assignment_naming_no_holder_is_free() {
        let nobody = |position| {
            NativeAssignment {
                holder: None,
                position,
                members: 2,
                permits: 1,
                other_holders: Vec::new(),
                ledger: None,
            }
            .encode()
        };
        let g = group(
            "Stable",
            PROTOCOL_TYPE,
            vec![
                member("b", meta("job b"), nobody(1)),
                member("a", meta("job a"), nobody(0)),
            ],
        );
        let d = analyse("l", "h:1", &g);
        assert_eq!(d.state, LockState::Free);
        assert_eq!(d.reason, None);
        assert_eq!(d.permits, Some(1));
        assert!(d.holders.is_empty());
        let waiting: Vec<&str> = d.waiters.iter().map(|w| w.member_id.as_str()).collect();
        assert_eq!(waiting, ["a", "b"]);
    }

    #[test]
    fn no_members_is_free() {
        let d = analyse("l", "h:1", &group("Dead", "", Vec::new()));
        assert_eq!(d.state, LockState::Free);
        assert_eq!(d.protocol, LockProtocol::None);
    }

    #[test]
    fn between_generations_is_rebalancing() {
        let g = group(
            "PreparingRebalance",
            PROTOCOL_TYPE,
            vec![member("a", Bytes::new(), Bytes::new())],
        );
        let d = analyse("l", "h:1", &g);
        assert_eq!(d.state, LockState::Rebalancing);
        let g = group(
            "Stable",
            PROTOCOL_TYPE,
            vec![member("a", Bytes::new(), Bytes::new())],
        );
        assert_eq!(analyse("l", "h:1", &g).state, LockState::Unknown);
    }

    #[test]
    fn another_applications_group_is_unknown() {
        let g = group(
            "Stable",
            "connect",
            vec![member("a", meta("x"), Bytes::from_static(b"x"))],
        );
        let d = analyse("l", "h:1", &g);
        assert_eq!(d.state, LockState::Unknown);
        assert_eq!(d.protocol, LockProtocol::Other);
    }

    #[test]
    fn consumer_partition_zero_holds() {
        let g = group(
            "Stable",
            CONSUMER_PROTOCOL_TYPE,
            vec![
                member("a", Bytes::new(), consumer_assignment("t", &[0])),
                member("b", Bytes::new(), consumer_assignment("t", &[])),
            ],
        );
        let d = analyse("l", "h:1", &g);
        assert_eq!(d.holder().unwrap().member.member_id, "a");
        assert_eq!(d.holder().unwrap().generation, None);
        assert_eq!(d.protocol, LockProtocol::ConsumerCompatible);
    }

    proptest::proptest! {
        #[test]
        fn any_member_bytes_are_analysed_without_panic(
            junk_meta in proptest::collection::vec(proptest::num::u8::ANY, 0..128),
            junk_asg in proptest::collection::vec(proptest::num::u8::ANY, 0..128),
        ) {
            let g = group("Stable", PROTOCOL_TYPE, vec![
                member("a", meta("ok"), assignment(0, 2)),
                member("x", Bytes::from(junk_meta), Bytes::from(junk_asg)),
            ]);
            let d = analyse("l", "h:1", &g);
            proptest::prop_assert!(d.holders.len() <= usize::from(d.permits.unwrap_or(1)));
        }
    }
}

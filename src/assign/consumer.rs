//! Consumer-compatible mode: Kafka's consumer protocol bytes and the `cooperative-sticky`,
//! `range` and `roundrobin` assignors, restricted to a one-partition lock topic.
//!
//! The layouts are ConsumerProtocolSubscription and ConsumerProtocolAssignment from Apache Kafka
//! (`clients/src/main/resources/common/message/ConsumerProtocol*.json`): an i16 version followed by
//! the struct at that version, classic (non-flexible) encoding at every version. kafka-protocol has
//! the same types, but its decoders reserve memory for whatever element count the peer claims, so
//! this module decodes with its own bounded reader and uses kafka-protocol only in tests.

use std::cmp::Ordering;

use bytes::{BufMut, Bytes, BytesMut};

use super::reader::Reader;
use super::{truncate_utf8, PeerDataError};

/// JoinGroup `protocol_type` of Kafka consumers.
pub const CONSUMER_PROTOCOL_TYPE: &str = "consumer";

/// Version of the ConsumerProtocolSubscription we write for `range` and `roundrobin`.
///
/// Version 0 (topics, user data) is what librdkafka wrote for years and what every reader accepts:
/// Java reads any version ≥ 0 (newer ones as its highest, since fields are only ever appended) and
/// librdkafka reads 0 to 3. The fields of versions 1 to 3 (owned partitions, generation, rack)
/// only serve the sticky and rack-aware assignors; the eager ones ignore them.
pub const CONSUMER_SUBSCRIPTION_VERSION: i16 = 0;

/// Version of the ConsumerProtocolSubscription we write for `cooperative-sticky`: version 1 added
/// the owned partitions (KIP-429) and version 2 the generation they date from (KIP-792), which
/// the sticky assignor needs to keep partition 0 with its owner and to tell a current claim from a
/// stale one. Version 3 adds only the rack.
pub const COOPERATIVE_SUBSCRIPTION_VERSION: i16 = 2;

/// Version of the ConsumerProtocolAssignment we write. Versions 0 to 3 share one layout; 0 is
/// readable by every consumer ever released.
pub const CONSUMER_ASSIGNMENT_VERSION: i16 = 0;

/// Highest consumer-protocol version whose layout this module knows. Like Java's
/// `ConsumerProtocol`, higher versions are read as this one and their extra bytes ignored.
const HIGHEST_KNOWN_VERSION: i16 = 3;

/// A Kafka string's length is an i16.
const MAX_KAFKA_STRING: usize = i16::MAX as usize;

/// Smallest encodings, used to reject impossible element counts before reading: a string is at
/// least its i16 length, a topic entry at least a string plus an i32 array count.
const MIN_STRING: usize = 2;
const MIN_TOPIC_PARTITIONS: usize = MIN_STRING + 4;
const PARTITION_ID: usize = 4;

/// The consumer assignors kafka-lock can run as leader (see [`assign_consumer`]). On a
/// one-partition topic `range` and `roundrobin` agree: both give partition 0 to the subscribed
/// member that sorts first. `cooperative-sticky` keeps it with the member that owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConsumerStrategy {
    /// Java's `RangeAssignor`, librdkafka's `range`. Eager.
    Range,
    /// Java's `RoundRobinAssignor`, librdkafka's `roundrobin`. Eager.
    RoundRobin,
    /// Java's `CooperativeStickyAssignor`, librdkafka's `cooperative-sticky`: the cooperative
    /// (incremental) protocol of KIP-429, in which members keep their partitions through a
    /// rebalance.
    CooperativeSticky,
}

impl ConsumerStrategy {
    /// The JoinGroup protocol name: `"range"`, `"roundrobin"` or `"cooperative-sticky"`.
    pub const fn protocol_name(self) -> &'static str {
        match self {
            ConsumerStrategy::Range => "range",
            ConsumerStrategy::RoundRobin => "roundrobin",
            ConsumerStrategy::CooperativeSticky => "cooperative-sticky",
        }
    }

    /// The strategy the broker selected, from JoinGroup's `protocol_name`.
    pub fn from_protocol_name(name: &str) -> Option<Self> {
        match name {
            "range" => Some(ConsumerStrategy::Range),
            "roundrobin" => Some(ConsumerStrategy::RoundRobin),
            "cooperative-sticky" => Some(ConsumerStrategy::CooperativeSticky),
            _ => None,
        }
    }

    /// Whether members keep their partitions through a rebalance (the cooperative protocol)
    /// rather than giving them all up when it starts (eager).
    pub const fn is_cooperative(self) -> bool {
        matches!(self, ConsumerStrategy::CooperativeSticky)
    }
}

/// The leader's plan for one generation in consumer-compatible mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerPlan {
    /// Member id that gets partition 0, if any member is subscribed to the topic.
    pub holder: Option<String>,
    /// One encoded ConsumerProtocolAssignment per member, in the order the members were given:
    /// `[(topic, [0])]` for the holder, no partitions for everyone else.
    pub assignments: Vec<(String, Bytes)>,
    /// Members whose subscription could not be decoded, for the leader to log.
    pub rejected: Vec<(String, PeerDataError)>,
}

fn put_kafka_string(buf: &mut BytesMut, s: &str) {
    let s = truncate_utf8(s, MAX_KAFKA_STRING);
    buf.put_i16(s.len() as i16);
    buf.put_slice(s.as_bytes());
}

/// Empty rather than null user data: Kafka 0.9 consumers cannot read null here (librdkafka writes
/// empty for the same reason).
fn put_empty_user_data(buf: &mut BytesMut) {
    buf.put_i32(0);
}

/// ConsumerProtocolSubscription v0 for one topic, as JoinGroup `protocols[].metadata`.
///
/// Kafka topic names are at most 249 bytes; a longer `topic` (which no broker accepts) would be
/// cut at 32767 bytes.
pub fn consumer_subscription(topic: &str) -> Bytes {
    let topic = truncate_utf8(topic, MAX_KAFKA_STRING);
    let mut buf = BytesMut::with_capacity(2 + 4 + 2 + topic.len() + 4);
    buf.put_i16(CONSUMER_SUBSCRIPTION_VERSION);
    buf.put_i32(1);
    put_kafka_string(&mut buf, topic);
    put_empty_user_data(&mut buf);
    buf.freeze()
}

/// ConsumerProtocolSubscription v2 for the `cooperative-sticky` protocol: subscribed to `topic`,
/// owning partition 0 of it if `owns_lock`, as of `generation` (the generation of the member's
/// last completed join, -1 before any).
///
/// The user data repeats the generation as one i32, the format of Java's
/// `CooperativeStickyAssignor` user data: consumers older than subscription version 2 (Kafka
/// 2.4 to 2.8) read the generation of the owned partitions from there.
pub fn cooperative_subscription(topic: &str, owns_lock: bool, generation: i32) -> Bytes {
    let topic = truncate_utf8(topic, MAX_KAFKA_STRING);
    let mut buf = BytesMut::with_capacity(2 + 2 * (4 + 2 + topic.len()) + 8 + 4 + 8 + 4);
    buf.put_i16(COOPERATIVE_SUBSCRIPTION_VERSION);
    buf.put_i32(1);
    put_kafka_string(&mut buf, topic);
    buf.put_i32(4);
    buf.put_i32(generation);
    if owns_lock {
        buf.put_i32(1);
        put_kafka_string(&mut buf, topic);
        buf.put_i32(1);
        buf.put_i32(0);
    } else {
        buf.put_i32(0);
    }
    buf.put_i32(generation);
    buf.freeze()
}

/// ConsumerProtocolAssignment v0 giving `partitions` of `topic`; with no partitions, an
/// assignment with no topics at all (what Java's assignors send to members that get nothing).
pub fn consumer_assignment(topic: &str, partitions: &[i32]) -> Bytes {
    let topic = truncate_utf8(topic, MAX_KAFKA_STRING);
    let partitions = &partitions[..partitions.len().min(i32::MAX as usize)];
    let mut buf = BytesMut::with_capacity(2 + 4 + 2 + topic.len() + 4 + 4 * partitions.len() + 4);
    buf.put_i16(CONSUMER_ASSIGNMENT_VERSION);
    if partitions.is_empty() {
        buf.put_i32(0);
    } else {
        buf.put_i32(1);
        put_kafka_string(&mut buf, topic);
        buf.put_i32(partitions.len() as i32);
        for &p in partitions {
            buf.put_i32(p);
        }
    }
    put_empty_user_data(&mut buf);
    buf.freeze()
}

fn read_version(r: &mut Reader<'_>, what: &'static str) -> Result<i16, PeerDataError> {
    let version = r.i16(what)?;
    if version < 0 {
        return Err(PeerDataError::UnsupportedConsumerVersion(version));
    }
    Ok(version.min(HIGHEST_KNOWN_VERSION))
}

/// Skips a classic STRING or NULLABLE_STRING without allocating or checking its text: fields we
/// only need to step over should not make us stricter than Java, which decodes them leniently.
fn skip_kafka_string(
    r: &mut Reader<'_>,
    nullable: bool,
    what: &'static str,
) -> Result<(), PeerDataError> {
    match r.i16(what)? {
        -1 if nullable => Ok(()),
        n if n < 0 => Err(PeerDataError::OutOfRange {
            what,
            value: i64::from(n),
        }),
        n => r.take(n as usize, what).map(drop),
    }
}

/// Decodes a ConsumerProtocolSubscription (any version ≥ 0) and returns its topics.
///
/// Every field of the declared version is checked; versions above 3 are read as 3 and bytes after
/// the known fields are ignored, as Java's `ConsumerProtocol` does.
pub fn decode_consumer_subscription(data: &[u8]) -> Result<Vec<String>, PeerDataError> {
    decode_subscription(data, None).map(|s| s.topics)
}

/// A consumer's subscription as the `cooperative-sticky` assignor reads it for one lock topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerSubscription {
    /// The topics the member subscribes to.
    pub topics: Vec<String>,
    /// Whether its owned partitions (version 1 and later) include partition 0 of the lock topic:
    /// it holds the lock, or believes it does.
    pub owns_lock: bool,
    /// The generation its owned partitions date from, as Java's `CooperativeStickyAssignor`
    /// reads it: the field of version 2 and later; before that the first four bytes of the user
    /// data as an i32 (that assignor's user data format); -1 when neither is there.
    pub generation: i32,
}

/// Decodes a ConsumerProtocolSubscription (any version ≥ 0) with what the cooperative-sticky
/// assignor needs about `lock_topic`. Owned-partition topic names are compared as bytes, never
/// interpreted.
pub fn decode_consumer_subscription_of(
    data: &[u8],
    lock_topic: &str,
) -> Result<ConsumerSubscription, PeerDataError> {
    decode_subscription(data, Some(lock_topic))
}

fn decode_subscription(
    data: &[u8],
    lock_topic: Option<&str>,
) -> Result<ConsumerSubscription, PeerDataError> {
    if data.is_empty() {
        return Err(PeerDataError::Empty {
            what: "consumer subscription",
        });
    }
    let mut r = Reader::new(data);
    let version = read_version(&mut r, "consumer subscription version")?;
    let count = r.array_len(MIN_STRING, "subscribed topics")?;
    // Not `with_capacity(count)`: the count is the peer's claim; growth follows real elements.
    let mut topics = Vec::new();
    for _ in 0..count {
        topics.push(r.kafka_string("subscribed topic")?);
    }
    let user_data = match r.i32("subscription user data")? {
        -1 => &[][..],
        n if n < 0 => {
            return Err(PeerDataError::OutOfRange {
                what: "subscription user data",
                value: i64::from(n),
            })
        }
        n => r.take(n as usize, "subscription user data")?,
    };
    let mut owns_lock = false;
    if version >= 1 {
        let owned = r.array_len(MIN_TOPIC_PARTITIONS, "owned partitions")?;
        for _ in 0..owned {
            let name = take_kafka_string(&mut r, "owned partitions topic")?;
            let n = r.array_len(PARTITION_ID, "owned partition ids")?;
            let ids = r.take(n * PARTITION_ID, "owned partition ids")?;
            if lock_topic.is_some_and(|t| t.as_bytes() == name)
                && ids.chunks_exact(PARTITION_ID).any(|id| id == [0; 4])
            {
                owns_lock = true;
            }
        }
    }
    let generation = if version >= 2 {
        r.i32("subscription generation id")?
    } else if let Some(g) = user_data.first_chunk::<4>() {
        i32::from_be_bytes(*g)
    } else {
        -1
    };
    if version >= 3 {
        skip_kafka_string(&mut r, true, "subscription rack id")?;
    }
    Ok(ConsumerSubscription {
        topics,
        owns_lock,
        generation,
    })
}

/// A classic STRING's bytes, unchecked (see [`skip_kafka_string`]).
fn take_kafka_string<'a>(
    r: &mut Reader<'a>,
    what: &'static str,
) -> Result<&'a [u8], PeerDataError> {
    match r.i16(what)? {
        n if n < 0 => Err(PeerDataError::OutOfRange {
            what,
            value: i64::from(n),
        }),
        n => r.take(n as usize, what),
    }
}

/// Decodes a ConsumerProtocolAssignment (any version ≥ 0) into `(topic, partitions)` pairs.
///
/// Empty input is an empty assignment: the broker sends exactly that to members the leader left
/// out. Versions above 3 are read as 3 and trailing bytes ignored, as in Java.
pub fn decode_consumer_assignment(data: &[u8]) -> Result<Vec<(String, Vec<i32>)>, PeerDataError> {
    if data.is_empty() {
        return Ok(Vec::new());
    }
    let mut r = Reader::new(data);
    read_version(&mut r, "consumer assignment version")?;
    let count = r.array_len(MIN_TOPIC_PARTITIONS, "assigned topics")?;
    let mut assigned = Vec::new();
    for _ in 0..count {
        let topic = r.kafka_string("assigned topic")?;
        let n = r.array_len(PARTITION_ID, "assigned partition ids")?;
        // Safe to reserve: `array_len` proved the n ids are present in the input.
        let mut partitions = Vec::with_capacity(n);
        for _ in 0..n {
            partitions.push(r.i32("assigned partition id")?);
        }
        assigned.push((topic, partitions));
    }
    r.skip_kafka_nullable_bytes("assignment user data")?;
    Ok(assigned)
}

/// Java's `String.compareTo`: UTF-16 code units, which differs from byte order only between
/// characters above U+FFFF and those in U+E000..=U+FFFF.
fn java_str_cmp(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

/// Java's `AbstractPartitionAssignor.MemberInfo.compareTo`: static members (with a
/// group.instance.id) first, by instance id; then dynamic members by member id.
fn java_member_cmp(a: (&str, Option<&str>), b: (&str, Option<&str>)) -> Ordering {
    match (a.1, b.1) {
        (Some(x), Some(y)) => java_str_cmp(x, y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => java_str_cmp(a.0, b.0),
    }
}

/// The leader's assignor for a one-partition `topic`, as the group's selected `strategy` runs it.
///
/// `members` is the leader's JoinGroup response as `(member_id, group_instance_id, metadata)`.
///
/// **`range` and `roundrobin`**: partition 0 goes to the first member, in Java's `MemberInfo`
/// order, among those whose subscription decodes and includes `topic`: static members first by
/// `group.instance.id`, then dynamic members by member id (UTF-16 order, as `String.compareTo`).
/// With one partition Java's range assignor gives it to the first member of that order, and its
/// round-robin assignor walks the same order from the start, skipping members not subscribed to
/// the topic, so both name the same holder.
///
/// **`cooperative-sticky`**: partition 0 stays with the member that owns it, i.e. claims it in
/// its subscription's owned partitions with a generation higher than any other claim (the rule of
/// Java's `AbstractStickyAssignor`), if that member is still subscribed. Otherwise it would go to
/// the first member in Java's order, but the cooperative protocol first takes a partition away
/// from whoever claims it: while any other member claims it, it goes to nobody in this
/// generation, that member gives it up when it sees its assignment, and its rejoin starts the
/// next generation (Java's `CooperativeStickyAssignor.adjustAssignment`). Two claims at the same
/// highest generation cannot both be current; both are refused and the partition withheld.
///
/// Known differences, documented in `docs/protocol.md`: Java's rack-aware range assignment (3.5+,
/// when consumers set `client.rack`) may prefer a member in the partition's rack; a round-robin
/// over several topics can shift who gets the lock topic; librdkafka orders mixed static/dynamic
/// groups differently; and Java's sticky assignor gives a partition nobody owns by balance, not
/// by member order. Only the leader's choice counts in any one generation.
pub fn assign_consumer(
    strategy: ConsumerStrategy,
    topic: &str,
    members: &[(String, Option<String>, Bytes)],
) -> ConsumerPlan {
    let mut rejected = Vec::new();
    let mut eligible = Vec::new();
    // (member index, generation) of every member that claims partition 0.
    let mut claims: Vec<(usize, i32)> = Vec::new();
    for (i, (id, _, metadata)) in members.iter().enumerate() {
        let sub = match decode_consumer_subscription_of(metadata, topic) {
            Ok(s) => s,
            Err(e) => {
                rejected.push((id.clone(), e));
                continue;
            }
        };
        if sub.owns_lock {
            claims.push((i, sub.generation));
        }
        if sub.topics.iter().any(|t| t == topic) {
            eligible.push(i);
        }
    }
    let first = first_in_java_order(members, &eligible);
    let holder = if strategy.is_cooperative() {
        let newest = claims.iter().map(|&(_, g)| g).max();
        let owners: Vec<usize> = claims
            .iter()
            .filter(|&&(_, g)| Some(g) == newest)
            .map(|&(i, _)| i)
            .collect();
        match owners[..] {
            [owner] if eligible.contains(&owner) => Some(owner),
            _ => first.filter(|f| claims.iter().all(|(i, _)| i == f)),
        }
    } else {
        first
    };

    let assignments = members
        .iter()
        .enumerate()
        .map(|(i, (id, _, _))| {
            let partitions: &[i32] = if Some(i) == holder { &[0] } else { &[] };
            (id.clone(), consumer_assignment(topic, partitions))
        })
        .collect();

    ConsumerPlan {
        holder: holder.map(|h| members[h].0.clone()),
        assignments,
        rejected,
    }
}

/// The first of `candidates` (indexes into `members`) in Java's `MemberInfo` order; ties
/// (impossible among real members) keep the earlier index.
fn first_in_java_order(
    members: &[(String, Option<String>, Bytes)],
    candidates: &[usize],
) -> Option<usize> {
    candidates.iter().copied().reduce(|best, i| {
        let key = |j: usize| (members[j].0.as_str(), members[j].1.as_deref());
        if java_member_cmp(key(i), key(best)) == Ordering::Less {
            i
        } else {
            best
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::consumer_protocol_assignment as cpa;
    use kafka_protocol::messages::consumer_protocol_subscription as cps;
    use kafka_protocol::messages::{
        ConsumerProtocolAssignment, ConsumerProtocolSubscription, TopicName,
    };
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
    use proptest::prelude::*;

    fn s(x: &str) -> StrBytes {
        StrBytes::from_string(x.to_owned())
    }

    /// The bytes a Java or librdkafka consumer puts in JoinGroup: version, then the struct.
    fn kp_subscription(msg: &ConsumerProtocolSubscription, version: i16) -> Bytes {
        let mut buf = BytesMut::new();
        buf.put_i16(version);
        msg.encode(&mut buf, version).expect("encodable");
        buf.freeze()
    }

    fn kp_assignment(msg: &ConsumerProtocolAssignment, version: i16) -> Bytes {
        let mut buf = BytesMut::new();
        buf.put_i16(version);
        msg.encode(&mut buf, version).expect("encodable");
        buf.freeze()
    }

    fn full_subscription(topics: &[&str]) -> ConsumerProtocolSubscription {
        ConsumerProtocolSubscription::default()
            .with_topics(topics.iter().map(|t| s(t)).collect())
            .with_user_data(Some(Bytes::from_static(b"\x00\x01user")))
            .with_owned_partitions(vec![cps::TopicPartition::default()
                .with_topic(TopicName(s("lock")))
                .with_partitions(vec![0])])
            .with_generation_id(17)
            .with_rack_id(Some(s("rack-a")))
    }

    #[test]
    fn subscription_layout() {
        assert_eq!(
            &consumer_subscription("lk")[..],
            &[0, 0, 0, 0, 0, 1, 0, 2, b'l', b'k', 0, 0, 0, 0][..]
        );
    }

    #[test]
    fn our_subscription_is_what_kafka_protocol_reads() {
        let mut bytes = &consumer_subscription("jobs.nightly-lock")[..];
        let version = i16::from_be_bytes([bytes[0], bytes[1]]);
        bytes = &bytes[2..];
        let mut buf = Bytes::copy_from_slice(bytes);
        let msg = ConsumerProtocolSubscription::decode(&mut buf, version).expect("decodes");
        assert_eq!(msg.topics, vec![s("jobs.nightly-lock")]);
        assert_eq!(msg.user_data, Some(Bytes::new()));
        assert!(buf.is_empty());
    }

    #[test]
    fn reads_subscriptions_at_every_version_kafka_clients_write() {
        for version in 0..=3 {
            let bytes = kp_subscription(&full_subscription(&["a", "lock", "z"]), version);
            assert_eq!(
                decode_consumer_subscription(&bytes),
                Ok(vec!["a".into(), "lock".into(), "z".into()]),
                "version {version}"
            );
            // Null user data and an empty topic list are legal too.
            let bare = ConsumerProtocolSubscription::default();
            assert_eq!(
                decode_consumer_subscription(&kp_subscription(&bare, version)),
                Ok(vec![]),
                "version {version}"
            );
        }
    }

    #[test]
    fn newer_subscription_versions_read_as_the_highest_known() {
        let mut bytes = kp_subscription(&full_subscription(&["lock"]), 3).to_vec();
        bytes[..2].copy_from_slice(&7i16.to_be_bytes());
        bytes.extend_from_slice(b"a field from the future");
        assert_eq!(
            decode_consumer_subscription(&bytes),
            Ok(vec!["lock".into()])
        );
    }

    #[test]
    fn every_subscription_prefix_is_an_error() {
        let bytes = kp_subscription(&full_subscription(&["a", "lock"]), 3);
        for cut in 0..bytes.len() {
            assert!(
                decode_consumer_subscription(&bytes[..cut]).is_err(),
                "prefix {cut}"
            );
        }
    }

    #[test]
    fn huge_counts_are_rejected_without_allocating() {
        // Six bytes claiming 2^31 - 1 topics: kafka-protocol would reserve ~48 GiB for this.
        let claim = [0x00, 0x00, 0x7f, 0xff, 0xff, 0xff];
        assert_eq!(
            decode_consumer_subscription(&claim),
            Err(PeerDataError::Truncated {
                what: "subscribed topics"
            })
        );
        assert_eq!(
            decode_consumer_assignment(&claim),
            Err(PeerDataError::Truncated {
                what: "assigned topics"
            })
        );
        // -2^31 is not a count.
        let negative = [0x00, 0x00, 0x80, 0x00, 0x00, 0x00];
        assert!(matches!(
            decode_consumer_subscription(&negative),
            Err(PeerDataError::OutOfRange { .. })
        ));
        // A huge partition count inside an otherwise valid assignment.
        let mut inner = vec![0, 0, 0, 0, 0, 1, 0, 1, b't'];
        inner.extend_from_slice(&i32::MAX.to_be_bytes());
        assert_eq!(
            decode_consumer_assignment(&inner),
            Err(PeerDataError::Truncated {
                what: "assigned partition ids"
            })
        );
        // The same inside owned partitions (subscription v1).
        let mut owned = vec![0, 1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff];
        owned.extend_from_slice(&0x7fff_ffffi32.to_be_bytes());
        assert_eq!(
            decode_consumer_subscription(&owned),
            Err(PeerDataError::Truncated {
                what: "owned partitions"
            })
        );
    }

    #[test]
    fn bad_versions_and_nulls() {
        assert_eq!(
            decode_consumer_subscription(&[0xff, 0xff, 0, 0, 0, 0]),
            Err(PeerDataError::UnsupportedConsumerVersion(-1))
        );
        assert_eq!(
            decode_consumer_assignment(&[0x80, 0x00]),
            Err(PeerDataError::UnsupportedConsumerVersion(i16::MIN))
        );
        assert!(matches!(
            decode_consumer_subscription(b""),
            Err(PeerDataError::Empty { .. })
        ));
        // A null topic name.
        assert!(matches!(
            decode_consumer_subscription(&[0, 0, 0, 0, 0, 1, 0xff, 0xff, 0, 0, 0, 0]),
            Err(PeerDataError::OutOfRange {
                what: "subscribed topic",
                value: -1
            })
        ));
        // Invalid UTF-8 in a topic name.
        assert!(matches!(
            decode_consumer_subscription(&[0, 0, 0, 0, 0, 1, 0, 1, 0xff, 0, 0, 0, 0]),
            Err(PeerDataError::InvalidUtf8 { .. })
        ));
        // Version 3 (no topics, null user data, nothing owned, generation -1): a null rack is
        // legal, any other negative length is not a length.
        let v3 = |rack: i16| {
            let mut b = vec![0, 3, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];
            b.extend_from_slice(&(-1i32).to_be_bytes());
            b.extend_from_slice(&rack.to_be_bytes());
            b
        };
        assert_eq!(decode_consumer_subscription(&v3(-1)), Ok(vec![]));
        // The same for user data (-1 is null) and, from version 1, an owned partition's topic
        // name (never null).
        assert_eq!(
            decode_consumer_subscription(&[0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xfe]),
            Err(PeerDataError::OutOfRange {
                what: "subscription user data",
                value: -2
            })
        );
        // An empty owned-partition topic name is read, not refused: Java reads it leniently, and
        // it names no lock topic.
        let empty_owned = [
            0, 1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0,
        ];
        assert_eq!(decode_consumer_subscription(&empty_owned), Ok(vec![]));
        let null_owned = [
            0, 1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 0xff, 0xff, 0, 0, 0, 0,
        ];
        assert_eq!(
            decode_consumer_subscription(&null_owned),
            Err(PeerDataError::OutOfRange {
                what: "owned partitions topic",
                value: -1
            })
        );
        assert_eq!(
            decode_consumer_subscription(&v3(-2)),
            Err(PeerDataError::OutOfRange {
                what: "subscription rack id",
                value: -2
            })
        );
    }

    #[test]
    fn assignment_layout_and_kafka_protocol_agreement() {
        let bytes = consumer_assignment("lk", &[0]);
        assert_eq!(
            &bytes[..],
            &[0, 0, 0, 0, 0, 1, 0, 2, b'l', b'k', 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0][..]
        );
        let mut body = bytes.slice(2..);
        let msg = ConsumerProtocolAssignment::decode(&mut body, 0).expect("decodes");
        assert_eq!(msg.assigned_partitions.len(), 1);
        assert_eq!(msg.assigned_partitions[0].topic, TopicName(s("lk")));
        assert_eq!(msg.assigned_partitions[0].partitions, vec![0]);

        let nothing = consumer_assignment("lk", &[]);
        assert_eq!(&nothing[..], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0][..]);
        assert_eq!(decode_consumer_assignment(&nothing), Ok(vec![]));
    }

    #[test]
    fn reads_assignments_at_every_version() {
        let msg = ConsumerProtocolAssignment::default()
            .with_assigned_partitions(vec![
                cpa::TopicPartition::default()
                    .with_topic(TopicName(s("lock")))
                    .with_partitions(vec![0]),
                cpa::TopicPartition::default()
                    .with_topic(TopicName(s("other")))
                    .with_partitions(vec![3, 1]),
            ])
            .with_user_data(None);
        for version in 0..=3 {
            assert_eq!(
                decode_consumer_assignment(&kp_assignment(&msg, version)),
                Ok(vec![("lock".into(), vec![0]), ("other".into(), vec![3, 1])]),
                "version {version}"
            );
        }
        assert_eq!(decode_consumer_assignment(b""), Ok(vec![]));
    }

    #[test]
    fn every_nonempty_assignment_prefix_is_an_error() {
        let bytes = consumer_assignment("lock", &[0]);
        for cut in 1..bytes.len() {
            assert!(
                decode_consumer_assignment(&bytes[..cut]).is_err(),
                "prefix {cut}"
            );
        }
    }

    #[test]
    fn strategy_names() {
        for st in [
            ConsumerStrategy::Range,
            ConsumerStrategy::RoundRobin,
            ConsumerStrategy::CooperativeSticky,
        ] {
            assert_eq!(
                ConsumerStrategy::from_protocol_name(st.protocol_name()),
                Some(st)
            );
        }
        assert_eq!(ConsumerStrategy::Range.protocol_name(), "range");
        assert_eq!(ConsumerStrategy::RoundRobin.protocol_name(), "roundrobin");
        assert_eq!(
            ConsumerStrategy::from_protocol_name("cooperative-sticky"),
            Some(ConsumerStrategy::CooperativeSticky)
        );
        assert!(ConsumerStrategy::CooperativeSticky.is_cooperative());
        assert!(!ConsumerStrategy::Range.is_cooperative());
        assert_eq!(ConsumerStrategy::from_protocol_name("sticky"), None);
    }

    fn holds(plan: &ConsumerPlan, id: &str) -> bool {
        let (_, bytes) = plan
            .assignments
            .iter()
            .find(|(m, _)| m == id)
            .expect("member present");
        decode_consumer_assignment(bytes)
            .expect("own encoding")
            .iter()
            .any(|(t, p)| t == "lock" && p.contains(&0))
    }

    #[test]
    fn dynamic_members_smallest_member_id_holds() {
        let members = [
            ("rdkafka-b".to_owned(), None, consumer_subscription("lock")),
            ("rdkafka-a".to_owned(), None, consumer_subscription("lock")),
            ("rdkafka-c".to_owned(), None, consumer_subscription("lock")),
        ];
        for st in [ConsumerStrategy::Range, ConsumerStrategy::RoundRobin] {
            let plan = assign_consumer(st, "lock", &members);
            assert_eq!(plan.holder.as_deref(), Some("rdkafka-a"));
            assert!(holds(&plan, "rdkafka-a"));
            assert!(!holds(&plan, "rdkafka-b"));
            assert!(!holds(&plan, "rdkafka-c"));
            let ids: Vec<&str> = plan.assignments.iter().map(|(id, _)| id.as_str()).collect();
            assert_eq!(ids, ["rdkafka-b", "rdkafka-a", "rdkafka-c"]);
        }
    }

    #[test]
    fn static_members_sort_first_by_instance_id() {
        let members = [
            ("a-dynamic".to_owned(), None, consumer_subscription("lock")),
            (
                "z-static".to_owned(),
                Some("instance-1".to_owned()),
                consumer_subscription("lock"),
            ),
            (
                "b-static".to_owned(),
                Some("instance-2".to_owned()),
                consumer_subscription("lock"),
            ),
        ];
        let plan = assign_consumer(ConsumerStrategy::Range, "lock", &members);
        assert_eq!(plan.holder.as_deref(), Some("z-static"));
    }

    #[test]
    fn only_subscribers_of_the_topic_are_eligible_and_garbage_is_rejected() {
        let v3 = kp_subscription(&full_subscription(&["lock"]), 3);
        let members = [
            ("a-other".to_owned(), None, consumer_subscription("other")),
            ("b-garbage".to_owned(), None, Bytes::from_static(b"\x00")),
            ("c-java".to_owned(), None, v3),
        ];
        let plan = assign_consumer(ConsumerStrategy::RoundRobin, "lock", &members);
        assert_eq!(plan.holder.as_deref(), Some("c-java"));
        assert_eq!(plan.rejected.len(), 1);
        assert_eq!(plan.rejected[0].0, "b-garbage");
        assert_eq!(plan.assignments.len(), 3);
        assert!(holds(&plan, "c-java"));

        let nobody = assign_consumer(ConsumerStrategy::Range, "lock", &members[..2]);
        assert_eq!(nobody.holder, None);
        assert!(nobody
            .assignments
            .iter()
            .all(|(_, b)| decode_consumer_assignment(b) == Ok(vec![])));
    }

    #[test]
    fn member_order_is_javas_utf16_order() {
        // Bytewise, U+FF61 (EF BD A1) sorts before U+10000 (F0 90 80 80); in UTF-16 the
        // surrogate D800 sorts before FF61, and Java follows UTF-16.
        let members = [
            ("\u{FF61}".to_owned(), None, consumer_subscription("lock")),
            ("\u{10000}".to_owned(), None, consumer_subscription("lock")),
        ];
        let plan = assign_consumer(ConsumerStrategy::Range, "lock", &members);
        assert_eq!(plan.holder.as_deref(), Some("\u{10000}"));
    }

    #[test]
    fn cooperative_subscription_layout_and_kafka_protocol_agreement() {
        let bytes = cooperative_subscription("lk", true, 7);
        #[rustfmt::skip]
        let want = [
            0, 2,                                   // version 2
            0, 0, 0, 1, 0, 2, b'l', b'k',           // topics ["lk"]
            0, 0, 0, 4, 0, 0, 0, 7,                 // user data: generation 7 (i32)
            0, 0, 0, 1, 0, 2, b'l', b'k', 0, 0, 0, 1, 0, 0, 0, 0, // owned [("lk", [0])]
            0, 0, 0, 7,                             // generation id
        ];
        assert_eq!(&bytes[..], &want[..]);
        let mut body = bytes.slice(2..);
        let msg = ConsumerProtocolSubscription::decode(&mut body, 2).expect("decodes");
        assert!(body.is_empty());
        assert_eq!(msg.topics, vec![s("lk")]);
        assert_eq!(msg.owned_partitions.len(), 1);
        assert_eq!(msg.owned_partitions[0].topic, TopicName(s("lk")));
        assert_eq!(msg.owned_partitions[0].partitions, vec![0]);
        assert_eq!(msg.generation_id, 7);

        let none = cooperative_subscription("lk", false, -1);
        let mut body = none.slice(2..);
        let msg = ConsumerProtocolSubscription::decode(&mut body, 2).expect("decodes");
        assert!(msg.owned_partitions.is_empty());
        assert_eq!(msg.generation_id, -1);
        assert_eq!(
            decode_consumer_subscription_of(&none, "lk"),
            Ok(ConsumerSubscription {
                topics: vec!["lk".into()],
                owns_lock: false,
                generation: -1
            })
        );
    }

    #[test]
    fn claims_are_read_as_javas_sticky_assignor_reads_them() {
        let owning = |topic: &str, partitions: Vec<i32>| {
            ConsumerProtocolSubscription::default()
                .with_topics(vec![s("lock")])
                .with_owned_partitions(vec![cps::TopicPartition::default()
                    .with_topic(TopicName(s(topic)))
                    .with_partitions(partitions)])
                .with_generation_id(9)
                .with_user_data(Some(Bytes::from_static(&[0, 0, 0, 3])))
        };
        let read = |msg: &ConsumerProtocolSubscription, v| {
            decode_consumer_subscription_of(&kp_subscription(msg, v), "lock").unwrap()
        };
        // v0 has no owned partitions; v1 takes the generation from the user data (Java's
        // CooperativeStickyAssignor format); v2 and v3 from the field.
        let claim = owning("lock", vec![2, 0]);
        assert_eq!(
            (read(&claim, 0).owns_lock, read(&claim, 0).generation),
            (false, 3)
        );
        assert_eq!(
            (read(&claim, 1).owns_lock, read(&claim, 1).generation),
            (true, 3)
        );
        assert_eq!(
            (read(&claim, 2).owns_lock, read(&claim, 2).generation),
            (true, 9)
        );
        assert_eq!(
            (read(&claim, 3).owns_lock, read(&claim, 3).generation),
            (true, 9)
        );
        // Another partition of the topic, or partition 0 of another topic, is no claim.
        assert!(!read(&owning("lock", vec![1]), 3).owns_lock);
        assert!(!read(&owning("other", vec![0]), 3).owns_lock);
        // Without user data a v1 claim has no generation.
        let bare = owning("lock", vec![0]).with_user_data(None);
        assert_eq!(read(&bare, 1).generation, -1);
        assert_eq!(read(&bare, 1).topics, ["lock"]);
    }

    fn coop(owns: bool, generation: i32) -> Bytes {
        cooperative_subscription("lock", owns, generation)
    }

    fn plan(strategy: ConsumerStrategy, members: &[(&str, Bytes)]) -> ConsumerPlan {
        let members: Vec<_> = members
            .iter()
            .map(|(id, b)| (id.to_string(), None, b.clone()))
            .collect();
        assign_consumer(strategy, "lock", &members)
    }

    #[test]
    fn cooperative_sticky_keeps_partition_zero_with_its_owner() {
        let members = [("a", coop(false, -1)), ("z", coop(true, 4))];
        let sticky = plan(ConsumerStrategy::CooperativeSticky, &members);
        assert_eq!(sticky.holder.as_deref(), Some("z"));
        assert!(holds(&sticky, "z") && !holds(&sticky, "a"));
        // Range ignores ownership: the smallest member id.
        assert_eq!(
            plan(ConsumerStrategy::Range, &members).holder.as_deref(),
            Some("a")
        );
        // Nobody owns it: the first member in Java's order.
        let fresh = [("b", coop(false, 3)), ("a", coop(false, 3))];
        assert_eq!(
            plan(ConsumerStrategy::CooperativeSticky, &fresh)
                .holder
                .as_deref(),
            Some("a")
        );
    }

    #[test]
    fn cooperative_sticky_believes_the_newest_claim_and_withholds_a_disputed_one() {
        let stale = [
            ("a", coop(true, 3)),
            ("b", coop(true, 5)),
            ("c", coop(false, 5)),
        ];
        assert_eq!(
            plan(ConsumerStrategy::CooperativeSticky, &stale)
                .holder
                .as_deref(),
            Some("b")
        );
        // Two claims from one generation cannot both be current: neither gets it, nor anyone.
        let disputed = [
            ("a", coop(true, 5)),
            ("b", coop(true, 5)),
            ("c", coop(false, 5)),
        ];
        let p = plan(ConsumerStrategy::CooperativeSticky, &disputed);
        assert_eq!(p.holder, None);
        assert!(p
            .assignments
            .iter()
            .all(|(_, b)| decode_consumer_assignment(b) == Ok(vec![])));
    }

    #[test]
    fn cooperative_sticky_withholds_the_partition_while_its_owner_must_give_it_up() {
        // The owner no longer subscribes to the lock topic: it must revoke partition 0 before
        // anyone else may have it, so this generation gives it to nobody.
        let still_claiming = kp_subscription(
            &ConsumerProtocolSubscription::default()
                .with_topics(vec![s("other")])
                .with_owned_partitions(vec![cps::TopicPartition::default()
                    .with_topic(TopicName(s("lock")))
                    .with_partitions(vec![0])])
                .with_generation_id(8),
            2,
        );
        let members = [("a", coop(false, 8)), ("z", still_claiming)];
        let p = plan(ConsumerStrategy::CooperativeSticky, &members);
        assert_eq!(p.holder, None, "withheld for one generation");
        // The next generation, with the claim gone, gives it out.
        let members = [
            ("a", coop(false, 9)),
            ("z", cooperative_subscription("other", false, 8)),
        ];
        assert_eq!(
            plan(ConsumerStrategy::CooperativeSticky, &members)
                .holder
                .as_deref(),
            Some("a")
        );
    }

    #[test]
    fn cooperative_sticky_reads_eager_subscriptions_as_owning_nothing() {
        // A member whose metadata for this protocol is version 0 (no owned partitions).
        let members = [
            ("b", consumer_subscription("lock")),
            ("a", consumer_subscription("lock")),
        ];
        assert_eq!(
            plan(ConsumerStrategy::CooperativeSticky, &members)
                .holder
                .as_deref(),
            Some("a")
        );
        let garbage = [("a", Bytes::from_static(b"\x00")), ("b", coop(true, 2))];
        let p = plan(ConsumerStrategy::CooperativeSticky, &garbage);
        assert_eq!(p.holder.as_deref(), Some("b"));
        assert_eq!(p.rejected.len(), 1);
    }

    fn arb_subscription() -> impl Strategy<Value = (ConsumerProtocolSubscription, Vec<String>)> {
        (
            proptest::collection::vec("[a-zA-Z0-9._-]{0,40}", 0..6),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..32)),
            proptest::collection::vec(
                ("[a-z]{1,10}", proptest::collection::vec(any::<i32>(), 0..5)),
                0..4,
            ),
            any::<i32>(),
            proptest::option::of("[a-z0-9-]{0,12}"),
        )
            .prop_map(|(topics, user_data, owned, generation, rack)| {
                let msg = ConsumerProtocolSubscription::default()
                    .with_topics(topics.iter().map(|t| s(t)).collect())
                    .with_user_data(user_data.map(Bytes::from))
                    .with_owned_partitions(
                        owned
                            .into_iter()
                            .map(|(t, p)| {
                                cps::TopicPartition::default()
                                    .with_topic(TopicName(s(&t)))
                                    .with_partitions(p)
                            })
                            .collect(),
                    )
                    .with_generation_id(generation)
                    .with_rack_id(rack.map(|r| s(&r)));
                (msg, topics)
            })
    }

    proptest! {
        #[test]
        fn decodes_what_kafka_protocol_encodes((msg, topics) in arb_subscription(), version in 0i16..=3) {
            let bytes = kp_subscription(&msg, version);
            prop_assert_eq!(decode_consumer_subscription(&bytes), Ok(topics));
        }

        #[test]
        fn assignment_round_trips(topic in "[a-zA-Z0-9._-]{1,249}", partitions in proptest::collection::vec(any::<i32>(), 0..8)) {
            let got = decode_consumer_assignment(&consumer_assignment(&topic, &partitions));
            let want = if partitions.is_empty() { vec![] } else { vec![(topic, partitions)] };
            prop_assert_eq!(got, Ok(want));
        }

        #[test]
        fn subscription_round_trips(topic in "\\PC{0,100}") {
            prop_assert_eq!(decode_consumer_subscription(&consumer_subscription(&topic)), Ok(vec![topic]));
        }

        #[test]
        fn never_panics_on_garbage(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_consumer_subscription(&data);
            let _ = decode_consumer_assignment(&data);
        }

        #[test]
        fn never_panics_on_mutated_subscriptions(
            (msg, _) in arb_subscription(),
            version in 0i16..=3,
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        ) {
            let mut bytes = kp_subscription(&msg, version).to_vec();
            for (at, xor) in flips {
                let i = at % bytes.len();
                bytes[i] ^= xor;
            }
            let _ = decode_consumer_subscription(&bytes);
            let _ = decode_consumer_assignment(&bytes);
        }
    }
}

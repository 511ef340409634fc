//! What group members put in JoinGroup metadata and what the leader hands out in SyncGroup.
//!
//! Sans-I/O: bytes in, bytes out, no tokio and no clock. Two lock flavours share one group
//! protocol machinery and differ only in these bytes:
//!
//! - **Native** ([`PROTOCOL_TYPE`] `"kafka-lock"`, protocol [`NATIVE_PROTOCOL`]): our own small,
//!   versioned binary formats ([`MemberMetadata`], [`NativeAssignment`]) and a sticky-then-FIFO
//!   assignor ([`assign_native`]). No topic is needed; the group id is the lock's name.
//! - **Consumer-compatible** ([`CONSUMER_PROTOCOL_TYPE`] `"consumer"`): Kafka's
//!   ConsumerProtocolSubscription / ConsumerProtocolAssignment and the `cooperative-sticky`,
//!   `range` and `roundrobin` assignors on a one-partition topic ([`assign_consumer`]), so
//!   kafka-lock can share a lock with Java and librdkafka consumers that treat "partition 0
//!   assigned" as holding it.
//!
//! The byte layouts, the assignor rules and the fencing token are specified in `docs/protocol.md`.
//!
//! Everything decoded here comes from other group members and is untrusted: decoders return
//! [`PeerDataError`] and never panic, and they allocate only in proportion to the bytes actually
//! present, never from a count or length the peer claims. [`fuzz_peer_bytes`] is the single entry
//! point a fuzz target drives.

mod consumer;
mod native;
mod reader;

pub use consumer::{
    assign_consumer, consumer_subscription, cooperative_subscription, decode_consumer_assignment,
    decode_consumer_subscription, decode_consumer_subscription_of, ConsumerStrategy,
    CONSUMER_PROTOCOL_TYPE,
};
// The membership machine's scripted tests play a consumer-protocol leader.
#[cfg(test)]
pub(crate) use consumer::{consumer_assignment, ConsumerSubscription};
pub use native::{
    assign_native, Holder, MemberMetadata, NativeAssignment, MAX_LABEL_LEN, MAX_PERMITS,
    NATIVE_MAJOR_VERSION, NATIVE_PROTOCOL, PROTOCOL_TYPE,
};

/// Bytes from another group member that cannot be understood.
///
/// `what` names the field being read when the problem was found, so a log line points at the
/// exact place in the layouts of `docs/protocol.md`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerDataError {
    /// No bytes at all where a kafka-lock structure was expected.
    #[error(
        "empty {what}: the peer sent no data (a member that has not finished joining, \
         or a leader that left this member out of the assignment)"
    )]
    Empty {
        /// Which structure was empty.
        what: &'static str,
    },
    /// The input ended in the middle of a field.
    #[error("truncated peer data: input ended while reading {what}")]
    Truncated {
        /// The field being read.
        what: &'static str,
    },
    /// The bytes do not start with the kafka-lock magic for this structure.
    #[error(
        "{what} does not start with the kafka-lock magic (found {found:#06x}); \
         is another application using this group id?"
    )]
    BadMagic {
        /// The structure being decoded.
        what: &'static str,
        /// The first two bytes, big-endian.
        found: u16,
    },
    /// A native structure with a major version this build does not know; the peer runs an
    /// incompatible kafka-lock and the group must agree on a common protocol name first.
    #[error(
        "unsupported kafka-lock format major version {0} (this build reads version {major}); \
         upgrade this member or keep every member on a common protocol",
        major = NATIVE_MAJOR_VERSION
    )]
    UnsupportedVersion(u8),
    /// A consumer-protocol structure with a negative version.
    #[error("unsupported consumer protocol version {0}: versions start at 0")]
    UnsupportedConsumerVersion(i16),
    /// A length above the format's bound.
    #[error("{what} is {len} bytes long, more than the allowed {max}")]
    TooLong {
        /// The field.
        what: &'static str,
        /// The length the peer claimed.
        len: usize,
        /// The bound for this field.
        max: usize,
    },
    /// A text field that is not UTF-8.
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 {
        /// The field.
        what: &'static str,
    },
    /// A number outside the range the format allows (a negative count, a generation below -1,
    /// a null where null is not allowed, ...).
    #[error("{what} has invalid value {value}")]
    OutOfRange {
        /// The field.
        what: &'static str,
        /// The value found.
        value: i64,
    },
    /// Flag bits this minor version does not define.
    #[error("{what} has undefined flag bits set ({flags:#04x}) for its declared minor version")]
    UnknownFlags {
        /// The structure.
        what: &'static str,
        /// The whole flags byte.
        flags: u8,
    },
    /// Bytes after the last field, in a version whose layout says there are none.
    #[error("{len} unexpected bytes after the end of {what}")]
    TrailingBytes {
        /// The structure.
        what: &'static str,
        /// How many bytes were left.
        len: usize,
    },
}

/// Runs every decoder and assignor of this module on `data`; the fuzz target's single entry point.
///
/// It asserts nothing: the property under test is that nothing panics, aborts or allocates out of
/// proportion to `data`, whatever the bytes.
pub fn fuzz_peer_bytes(data: &[u8]) {
    use std::hint::black_box;

    black_box(MemberMetadata::decode(data).ok());
    black_box(NativeAssignment::decode(data).ok());
    black_box(decode_consumer_subscription(data).ok());
    black_box(decode_consumer_assignment(data).ok());
    black_box(decode_consumer_subscription_of(data, "t").ok());

    // The assignors must survive one hostile member among well-behaved ones.
    let good = MemberMetadata {
        holds: false,
        first_joined_generation: 1,
        holder_generation: -1,
        label: None,
        permits: 1,
        slot: 0,
        ledger: None,
    }
    .encode();
    let members = [
        ("a".to_owned(), None, good),
        (
            "b".to_owned(),
            Some("i".to_owned()),
            bytes::Bytes::copy_from_slice(data),
        ),
    ];
    black_box(assign_native(2, &members));
    let subscription = consumer_subscription("t");
    let members = [
        ("a".to_owned(), None, subscription),
        (
            "b".to_owned(),
            Some("i".to_owned()),
            bytes::Bytes::copy_from_slice(data),
        ),
    ];
    black_box(assign_consumer(ConsumerStrategy::Range, "t", &members));
    let members = [
        ("a".to_owned(), None, cooperative_subscription("t", true, 3)),
        ("b".to_owned(), None, bytes::Bytes::copy_from_slice(data)),
    ];
    black_box(assign_consumer(
        ConsumerStrategy::CooperativeSticky,
        "t",
        &members,
    ));
}

/// Appends `s` with a u16 length prefix, cut at a character boundary to at most `max` bytes.
///
/// Encoders are infallible by contract; inputs longer than a bound can only come from local
/// configuration (labels) or would already be impossible on the wire (member ids are Kafka
/// strings), so cutting is preferable to failing a rebalance.
fn put_u16_str(buf: &mut bytes::BytesMut, s: &str, max: usize) {
    use bytes::BufMut;
    let s = truncate_utf8(s, max);
    // `max` is always ≤ i16::MAX here, so the length fits.
    buf.put_u16(s.len() as u16);
    buf.put_slice(s.as_bytes());
}

/// The longest prefix of `s` that is at most `max` bytes and ends on a character boundary.
fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_utf8_respects_char_boundaries() {
        assert_eq!(truncate_utf8("héllo", 2), "h");
        assert_eq!(truncate_utf8("héllo", 3), "hé");
        assert_eq!(truncate_utf8("abc", 10), "abc");
        assert_eq!(truncate_utf8("€", 2), "");
    }

    #[test]
    fn fuzz_entry_survives_edge_inputs() {
        for input in [
            &b""[..],
            &[0xff; 64][..],
            &[0x00, 0x00, 0x7f, 0xff, 0xff, 0xff][..],
            &[0x00, 0x00, 0x80, 0x00, 0x00, 0x00][..],
            &MemberMetadata {
                holds: true,
                first_joined_generation: 0,
                holder_generation: 3,
                label: Some("x".into()),
                permits: 1,
                slot: 0,
                ledger: None,
            }
            .encode()[..],
        ] {
            fuzz_peer_bytes(input);
        }
    }

    proptest::proptest! {
        #[test]
        fn fuzz_entry_never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            fuzz_peer_bytes(&data);
        }
    }
}

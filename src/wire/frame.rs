//! Length-prefixed framing: every Kafka request and response is a 4-byte big-endian signed length
//! followed by that many bytes.
//!
//! The length is validated from the 4-byte prefix alone, before anything is reserved or copied, so
//! a hostile or confused peer cannot make the reader allocate more than the configured limit.

use bytes::{Buf, Bytes, BytesMut};

/// Bytes in the length prefix.
pub const LENGTH_PREFIX_SIZE: usize = 4;

/// Default largest frame body accepted from a broker: 1 MiB.
///
/// The responses kafka-lock reads are small: a JoinGroup response to the leader of a group of
/// 1000 waiters, or a DescribeGroups of it, is around 100–200 KiB, so 1 MiB leaves ample headroom
/// while capping what a broken peer can make us buffer (and, with the decoding guard's
/// amplification bound, what a decoded response can occupy). Raise it only for large Metadata
/// responses.
pub const DEFAULT_MAX_FRAME_SIZE: usize = 1024 * 1024;

/// A frame that cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The length prefix is larger than the configured limit.
    #[error("frame of {size} bytes exceeds the {limit}-byte limit{}", peer_hint(*.size))]
    TooLarge {
        /// The length the prefix announced.
        size: usize,
        /// The configured maximum.
        limit: usize,
    },
    /// The length prefix is zero; no Kafka message is empty.
    #[error("frame with a zero length prefix; the peer is not speaking the Kafka protocol")]
    Empty,
    /// The length prefix is negative.
    #[error("frame with a negative length prefix ({length}); the peer is not speaking the Kafka protocol{}", peer_hint(*.length as u32 as usize))]
    Negative {
        /// The length as read.
        length: i32,
    },
}

/// Recognises the two classic misconfigurations from the first four bytes read as a length.
fn peer_hint(size: usize) -> &'static str {
    let b = (size as u32).to_be_bytes();
    if &b == b"HTTP" {
        " (the peer answered with HTTP: check the address and port)"
    } else if (b[0] == 0x15 || b[0] == 0x16) && b[1] == 0x03 {
        " (the peer answered with TLS: it expects an encrypted connection)"
    } else {
        " (raise the maximum frame size only if the broker legitimately sends responses this large)"
    }
}

/// Validates a length prefix against `max` and returns the body length it announces.
pub fn frame_length(prefix: [u8; LENGTH_PREFIX_SIZE], max: usize) -> Result<usize, FrameError> {
    let length = i32::from_be_bytes(prefix);
    if length < 0 {
        return Err(FrameError::Negative { length });
    }
    if length == 0 {
        return Err(FrameError::Empty);
    }
    let size = length as usize;
    if size > max {
        return Err(FrameError::TooLarge { size, limit: max });
    }
    Ok(size)
}

/// Splits one complete frame off the front of `buf` and returns its body (without the prefix).
///
/// Returns `Ok(None)` when `buf` does not yet hold a whole frame; nothing is consumed or reserved
/// then, so the caller reads more and calls again. A bad prefix is reported as soon as its four
/// bytes are in `buf`, however little of the body has arrived.
pub fn decode_frame(buf: &mut BytesMut, max: usize) -> Result<Option<Bytes>, FrameError> {
    let Some(prefix) = buf.get(..LENGTH_PREFIX_SIZE) else {
        return Ok(None);
    };
    let mut p = [0u8; LENGTH_PREFIX_SIZE];
    p.copy_from_slice(prefix);
    let size = frame_length(p, max)?;
    if buf.len() - LENGTH_PREFIX_SIZE < size {
        return Ok(None);
    }
    buf.advance(LENGTH_PREFIX_SIZE);
    Ok(Some(buf.split_to(size).freeze()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;
    use proptest::prelude::*;

    /// Appends `body` to `out` as one frame (prefix and body).
    ///
    /// Fails only when `body` is empty or longer than a frame can announce (`i32::MAX`). Only
    /// these tests frame bodies by hand: requests are framed whole by `codec::encode_request`.
    fn encode_frame(body: &[u8], out: &mut BytesMut) -> Result<(), FrameError> {
        let length = match i32::try_from(body.len()) {
            Ok(0) => return Err(FrameError::Empty),
            Ok(n) => n,
            Err(_) => {
                return Err(FrameError::TooLarge {
                    size: body.len(),
                    limit: i32::MAX as usize,
                })
            }
        };
        out.reserve(LENGTH_PREFIX_SIZE + body.len());
        out.put_i32(length);
        out.put_slice(body);
        Ok(())
    }

    #[test]
    fn incomplete_prefix_and_body_wait_for_more() {
        let mut buf = BytesMut::from(&[0u8, 0, 0][..]);
        assert_eq!(decode_frame(&mut buf, 100), Ok(None));
        assert_eq!(buf.len(), 3);
        buf.extend_from_slice(&[5, 1, 2]);
        assert_eq!(decode_frame(&mut buf, 100), Ok(None));
        assert_eq!(buf.len(), 6);
        buf.extend_from_slice(&[3, 4, 5, 9]);
        assert_eq!(
            decode_frame(&mut buf, 100),
            Ok(Some(Bytes::from_static(&[1, 2, 3, 4, 5])))
        );
        assert_eq!(&buf[..], &[9]);
    }

    #[test]
    fn bad_prefixes_are_typed_errors_before_the_body_arrives() {
        let cases: [(&[u8], FrameError); 5] = [
            (&[0, 0, 0, 0], FrameError::Empty),
            (
                &[0xff, 0xff, 0xff, 0xff],
                FrameError::Negative { length: -1 },
            ),
            (&[0x80, 0, 0, 0], FrameError::Negative { length: i32::MIN }),
            (
                &[0, 0, 0, 101],
                FrameError::TooLarge {
                    size: 101,
                    limit: 100,
                },
            ),
            (
                &[0x7f, 0xff, 0xff, 0xff],
                FrameError::TooLarge {
                    size: i32::MAX as usize,
                    limit: 100,
                },
            ),
        ];
        for (prefix, expected) in cases {
            let mut buf = BytesMut::from(prefix);
            let cap = buf.capacity();
            assert_eq!(decode_frame(&mut buf, 100), Err(expected));
            assert_eq!(
                buf.capacity(),
                cap,
                "nothing reserved for a rejected prefix"
            );
        }
    }

    #[test]
    fn exact_limit_is_accepted() {
        let mut buf = BytesMut::new();
        encode_frame(&[7; 100], &mut buf).unwrap();
        assert_eq!(decode_frame(&mut buf, 100).unwrap().unwrap().len(), 100);
        assert!(buf.is_empty());
    }

    #[test]
    fn messages_point_at_common_misconfigurations() {
        let http = frame_length(*b"HTTP", DEFAULT_MAX_FRAME_SIZE).unwrap_err();
        assert!(http.to_string().contains("HTTP"), "{http}");
        let tls = frame_length([0x15, 0x03, 0x03, 0x00], DEFAULT_MAX_FRAME_SIZE).unwrap_err();
        assert!(tls.to_string().contains("TLS"), "{tls}");
    }

    #[test]
    fn empty_body_is_not_encoded() {
        assert_eq!(
            encode_frame(&[], &mut BytesMut::new()),
            Err(FrameError::Empty)
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_and_frames_round_trip(
            bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..64), 0..8),
            junk in proptest::collection::vec(any::<u8>(), 0..64),
            max in 0usize..128,
        ) {
            let mut buf = BytesMut::new();
            for b in &bodies {
                encode_frame(b, &mut buf).unwrap();
            }
            buf.extend_from_slice(&junk);
            let mut seen = Vec::new();
            while let Ok(Some(frame)) = decode_frame(&mut buf, max) {
                prop_assert!(!frame.is_empty() && frame.len() <= max);
                seen.push(frame);
            }
            for (got, want) in seen.iter().zip(&bodies) {
                prop_assert_eq!(&got[..], &want[..]);
            }
            if bodies.iter().all(|b| b.len() <= max) {
                prop_assert!(seen.len() >= bodies.len());
            }
        }
    }
}

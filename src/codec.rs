//! The response decoder kafka-lock runs on every broker answer, as a stable entry point.
//!
//! Everything kafka-lock reads from a broker passes through the same checks: the frame's length
//! prefix against a limit, the response header's correlation id, and a pre-scan of the body that
//! bounds the time and memory of decoding it. [`check_response`] and [`check_response_frame`] run
//! exactly those checks and the decode itself on bytes of your choosing, and answer `Ok` or a typed
//! [`DecodeError`]. For any input they return in time and memory bounded by a small multiple of its
//! length and never panic: that is the promise the fuzz targets hold the library to
//! (docs/fuzzing.md), and what a program that relays or inspects Kafka bytes from an untrusted
//! peer can rely on.
//!
//! The decoded messages themselves are the types of the codec library kafka-lock builds on, which
//! may change with any of its releases; they are not part of this API, so these functions only
//! say whether the bytes are a valid response and, if not, why.
//!
//! ```
//! use kafka_lock::codec::{check_response, DecodeError};
//! use kafka_lock::Api;
//!
//! // A Heartbeat v0 body: error code 0.
//! assert!(check_response(Api::Heartbeat, 0, &[0, 0]).is_ok());
//! // One byte short.
//! assert!(check_response(Api::Heartbeat, 0, &[0]).is_err());
//! // One byte too many.
//! assert!(matches!(
//!     check_response(Api::Heartbeat, 0, &[0, 0, 0]),
//!     Err(DecodeError::TrailingBytes { api: Api::Heartbeat, left: 1, .. })
//! ));
//! ```

use kafka_protocol::messages::ApiKey;

use crate::api::Api;
use crate::wire;

pub use crate::wire::codec::{BoxError, DecodeError, EncodeError};
pub use crate::wire::frame::{
    frame_length, FrameError, DEFAULT_MAX_FRAME_SIZE, LENGTH_PREFIX_SIZE,
};
pub use crate::wire::guard::{Location, Malformation};

/// Decodes a response body (no length prefix, no response header) of `api` at `version` as
/// kafka-lock does, and says whether it is valid.
///
/// Leftover bytes are [`DecodeError::TrailingBytes`]; an API or version outside
/// [`supported_versions`] is [`DecodeError::UnsupportedVersion`]. ApiVersions follows KIP-511: an
/// ApiVersions body whose error code is UNSUPPORTED_VERSION (35) and that is valid as v0 is
/// decoded as v0, whatever version was asked for, as brokers answer that way.
pub fn check_response(api: Api, version: i16, body: &[u8]) -> Result<(), DecodeError> {
    wire::codec::decode_response(key(api, version)?, version, body).map(drop)
}

/// [`check_response`] for a whole response frame body (what follows the 4-byte length prefix):
/// the response header of `api` at `version`, whose correlation id must be
/// `expected_correlation_id` ([`DecodeError::CorrelationMismatch`] otherwise), then the body.
pub fn check_response_frame(
    frame: &[u8],
    api: Api,
    version: i16,
    expected_correlation_id: i32,
) -> Result<(), DecodeError> {
    wire::codec::decode_response_frame(frame, key(api, version)?, version, expected_correlation_id)
        .map(drop)
}

/// The versions of `api` kafka-lock implements (inclusive), or `None` for an API it does not
/// speak.
pub fn supported_versions(api: Api) -> Option<(i16, i16)> {
    ApiKey::try_from(api.key())
        .ok()
        .and_then(wire::versions::supported_range)
}

fn key(api: Api, version: i16) -> Result<ApiKey, DecodeError> {
    ApiKey::try_from(api.key()).map_err(|_| DecodeError::UnsupportedVersion { api, version })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_api_is_reachable_by_its_key() {
        for &(codec_key, min, max) in wire::versions::SUPPORTED {
            let api = Api::of(codec_key);
            assert_eq!(supported_versions(api), Some((min, max)), "{api}");
        }
        assert_eq!(supported_versions(Api::Other(i16::MAX)), None);
    }

    #[test]
    fn unknown_apis_are_typed_errors() {
        for api in [Api::Other(-7), Api::Other(i16::MAX), Api::Other(20)] {
            assert!(
                matches!(
                    check_response(api, 0, &[0, 0]),
                    Err(DecodeError::UnsupportedVersion { api: a, version: 0 }) if a == api
                ),
                "{api}"
            );
        }
    }

    #[test]
    fn frames_are_checked_with_their_header() {
        // Correlation id 7, then a Heartbeat v0 body.
        let frame = [0, 0, 0, 7, 0, 0];
        assert!(check_response_frame(&frame, Api::Heartbeat, 0, 7).is_ok());
        assert!(matches!(
            check_response_frame(&frame, Api::Heartbeat, 0, 8),
            Err(DecodeError::CorrelationMismatch {
                expected: 8,
                actual: 7
            })
        ));
    }
}

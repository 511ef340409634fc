//! Request encoding and response decoding for the APIs kafka-lock speaks.
//!
//! Requests go out as complete frames ([`encode_request_as`]): length prefix, request header v1 or v2
//! (v2 for flexible versions), body. Responses come back as frame bodies
//! ([`decode_response_frame`]): response header v0 or v1, a correlation-id check, then the body,
//! which passes the [bounded-decoding guard](super::guard) before kafka-protocol decodes it.
//! [`decode_response`] decodes a bare body and is the entry point for users and fuzzers.

use std::error::Error as StdError;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, DescribeConfigsRequest,
    DescribeConfigsResponse, DescribeGroupsRequest, DescribeGroupsResponse, FetchRequest,
    FetchResponse, FindCoordinatorRequest, FindCoordinatorResponse, HeartbeatRequest,
    HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
    ListOffsetsRequest, ListOffsetsResponse, MetadataRequest, MetadataResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    ProduceRequest, ProduceResponse, RequestHeader, SaslAuthenticateRequest,
    SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse, SyncGroupRequest,
    SyncGroupResponse,
};
use kafka_protocol::protocol::buf::ByteBuf;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use super::frame::{FrameError, LENGTH_PREFIX_SIZE};
use super::guard::{self, Location, Malformation};
use super::versions;
use crate::api::Api;

/// The error type kafka-protocol's failures are carried in.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

macro_rules! api_enums {
    ($($variant:ident($req:ty, $resp:ty)),* $(,)?) => {
        /// A request kafka-lock can send.
        #[derive(Debug, Clone, PartialEq)]
        #[non_exhaustive]
        pub enum Request { $($variant($req)),* }

        /// A decoded response body.
        #[derive(Debug, Clone, PartialEq)]
        #[non_exhaustive]
        pub enum Response { $($variant($resp)),* }

        impl Request {
            /// The API this request belongs to.
            pub fn api_key(&self) -> ApiKey {
                match self { $(Request::$variant(_) => ApiKey::$variant),* }
            }

            fn encode_body(&self, out: &mut BytesMut, version: i16) -> Result<(), BoxError> {
                match self { $(Request::$variant(r) => r.encode(out, version).map_err(Into::into)),* }
            }
        }

        impl Response {
            /// The API this response belongs to.
            pub fn api_key(&self) -> ApiKey {
                match self { $(Response::$variant(_) => ApiKey::$variant),* }
            }
        }

        $(
            impl From<$req> for Request {
                fn from(r: $req) -> Self { Request::$variant(r) }
            }
            impl From<$resp> for Response {
                fn from(r: $resp) -> Self { Response::$variant(r) }
            }
        )*

        /// kafka-protocol's decoder for `api`.
        fn decode_body<B: ByteBuf>(
            api: ApiKey,
            version: i16,
            buf: &mut B,
        ) -> Result<Response, DecodeError> {
            match api {
                $(ApiKey::$variant => match <$resp as Decodable>::decode(buf, version) {
                    // The scan already proved nothing is left over; this only guards against a
                    // table that disagrees with kafka-protocol.
                    Ok(_) if buf.remaining() != 0 => Err(DecodeError::TrailingBytes {
                        api: crate::api::Api::of(api),
                        version,
                        left: buf.remaining(),
                    }),
                    Ok(r) => Ok(Response::$variant(r)),
                    Err(e) => Err(DecodeError::Protocol { api: crate::api::Api::of(api), version, source: e.into() }),
                },)*
                _ => Err(DecodeError::UnsupportedVersion { api: crate::api::Api::of(api), version }),
            }
        }
    };
}

api_enums! {
    ApiVersions(ApiVersionsRequest, ApiVersionsResponse),
    Metadata(MetadataRequest, MetadataResponse),
    FindCoordinator(FindCoordinatorRequest, FindCoordinatorResponse),
    JoinGroup(JoinGroupRequest, JoinGroupResponse),
    SyncGroup(SyncGroupRequest, SyncGroupResponse),
    Heartbeat(HeartbeatRequest, HeartbeatResponse),
    LeaveGroup(LeaveGroupRequest, LeaveGroupResponse),
    DescribeGroups(DescribeGroupsRequest, DescribeGroupsResponse),
    OffsetCommit(OffsetCommitRequest, OffsetCommitResponse),
    OffsetFetch(OffsetFetchRequest, OffsetFetchResponse),
    Produce(ProduceRequest, ProduceResponse),
    Fetch(FetchRequest, FetchResponse),
    ListOffsets(ListOffsetsRequest, ListOffsetsResponse),
    DescribeConfigs(DescribeConfigsRequest, DescribeConfigsResponse),
    SaslHandshake(SaslHandshakeRequest, SaslHandshakeResponse),
    SaslAuthenticate(SaslAuthenticateRequest, SaslAuthenticateResponse),
}

/// Why a response could not be decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Framing failed before the body was reached.
    #[error(transparent)]
    Frame(#[from] FrameError),

    /// kafka-lock has no decoder for this API at this version.
    #[error(
        "kafka-lock does not decode {api} responses at version {version}; only negotiated versions may be sent"
    )]
    UnsupportedVersion {
        /// The API.
        api: Api,
        /// The version asked for.
        version: i16,
    },

    /// The bounded-decoding guard rejected the bytes (see `wire::guard`).
    #[error(
        "malformed {api} v{version} response: {reason}, in {at}; the peer sent bytes that are not a valid response of this version"
    )]
    Malformed {
        /// The API.
        api: Api,
        /// The version.
        version: i16,
        /// Where the scan stopped.
        at: Location,
        /// What was wrong.
        reason: Malformation,
    },

    /// The body was followed by bytes that belong to no field.
    #[error(
        "{left} bytes left over after a {api} v{version} response body; the broker probably answered with a different version than the one requested"
    )]
    TrailingBytes {
        /// The API.
        api: Api,
        /// The version.
        version: i16,
        /// How many bytes were left.
        left: usize,
    },

    /// The response header's correlation id is not the request's.
    #[error(
        "response has correlation id {actual} but {expected} was expected; the connection is out of step and must be closed"
    )]
    CorrelationMismatch {
        /// The request's correlation id.
        expected: i32,
        /// The response's.
        actual: i32,
    },

    /// The bytes were well-formed but kafka-protocol rejected a value (for instance a string that
    /// is not UTF-8, or a null where none is allowed).
    #[error("invalid {api} v{version} response: {source}")]
    Protocol {
        /// The API.
        api: Api,
        /// The version.
        version: i16,
        /// kafka-protocol's error.
        source: BoxError,
    },
}

/// Why a request could not be encoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// kafka-lock does not implement the API at this version.
    #[error(
        "kafka-lock does not implement {api} v{version}{}; use a negotiated version",
        .ours.map(|(min, max)| format!(" (it implements v{min} to v{max})")).unwrap_or_default()
    )]
    UnsupportedVersion {
        /// The API.
        api: Api,
        /// The version asked for.
        version: i16,
        /// The versions kafka-lock implements for the API, if any.
        ours: Option<(i16, i16)>,
    },

    /// kafka-protocol refused the value, typically a field set that the chosen version cannot
    /// carry, or a string longer than the protocol allows.
    #[error("cannot encode {api} v{version}: {source}")]
    Protocol {
        /// The API.
        api: Api,
        /// The version.
        version: i16,
        /// kafka-protocol's error.
        source: BoxError,
    },

    /// The encoded request is larger than a frame can announce.
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// [`encode_request_as`] with a `&str` client id, for tests that build frames by hand.
#[cfg(test)]
pub(crate) fn encode_request(
    req: &Request,
    version: i16,
    correlation_id: i32,
    client_id: Option<&str>,
    out: &mut BytesMut,
) -> Result<(), EncodeError> {
    let client_id = client_id.map(|c| StrBytes::from_string(c.to_owned()));
    encode_request_as(req, version, correlation_id, client_id, out)
}

/// Appends one complete frame to `out`: the length prefix, the request header (v1, or v2 when the
/// API's `version` is flexible) and the body. The client id is a [`StrBytes`]: a connection keeps
/// its own and clones it per request (a reference count), where a `&str` costs an allocation
/// each time.
///
/// On error `out` is left exactly as it was, so a failed encode never leaves half a frame behind.
pub(crate) fn encode_request_as(
    req: &Request,
    version: i16,
    correlation_id: i32,
    client_id: Option<StrBytes>,
    out: &mut BytesMut,
) -> Result<(), EncodeError> {
    let api = req.api_key();
    let ours = versions::supported_range(api);
    if !ours.is_some_and(|(min, max)| min <= version && version <= max) {
        return Err(EncodeError::UnsupportedVersion {
            api: crate::api::Api::of(api),
            version,
            ours,
        });
    }
    let header = RequestHeader::default()
        .with_request_api_key(api as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(client_id);
    let header_version = api.request_header_version(version);

    let start = out.len();
    out.put_i32(0);
    let encoded = header
        .encode(out, header_version)
        .map_err(BoxError::from)
        .and_then(|()| req.encode_body(out, version));
    if let Err(source) = encoded {
        out.truncate(start);
        return Err(EncodeError::Protocol {
            api: crate::api::Api::of(api),
            version,
            source,
        });
    }
    let size = out.len() - start - LENGTH_PREFIX_SIZE;
    let Ok(length) = i32::try_from(size) else {
        out.truncate(start);
        return Err(FrameError::TooLarge {
            size,
            limit: i32::MAX as usize,
        }
        .into());
    };
    out[start..start + LENGTH_PREFIX_SIZE].copy_from_slice(&length.to_be_bytes());
    Ok(())
}

/// The correlation id at the start of a response frame body, if it has one; lets a connection
/// find the request a frame answers before decoding it.
pub fn peek_correlation_id(frame: &[u8]) -> Option<i32> {
    let prefix: [u8; 4] = frame.get(..4)?.try_into().ok()?;
    Some(i32::from_be_bytes(prefix))
}

/// Decodes a response frame body (what [`decode_frame`](super::frame::decode_frame) returns):
/// the response header for `api_key` at `version`, the correlation-id check, then the body as
/// [`decode_response`] does.
pub fn decode_response_frame(
    frame: &[u8],
    api_key: ApiKey,
    version: i16,
    expected_correlation_id: i32,
) -> Result<Response, DecodeError> {
    let body_start = check_header(frame, api_key, version, expected_correlation_id)?;
    decode_response(api_key, version, &frame[body_start..])
}

/// [`decode_response_frame`] for a frame already in [`Bytes`]: strings and byte fields of the
/// result share the frame's buffer instead of being copied.
pub fn decode_response_frame_bytes(
    frame: Bytes,
    api_key: ApiKey,
    version: i16,
    expected_correlation_id: i32,
) -> Result<Response, DecodeError> {
    let body_start = check_header(&frame, api_key, version, expected_correlation_id)?;
    decode_response_bytes(api_key, version, frame.slice(body_start..))
}

fn check_header(
    frame: &[u8],
    api: ApiKey,
    version: i16,
    expected: i32,
) -> Result<usize, DecodeError> {
    if !guard::covered_versions(api).is_some_and(|(min, max)| min <= version && version <= max) {
        return Err(DecodeError::UnsupportedVersion {
            api: crate::api::Api::of(api),
            version,
        });
    }
    // Checked first: a mismatch means the stream is out of step, which matters more than
    // whatever else is wrong with the header.
    if let Some(actual) = peek_correlation_id(frame) {
        if actual != expected {
            return Err(DecodeError::CorrelationMismatch { expected, actual });
        }
    }
    let header_version = api.response_header_version(version);
    guard::scan_response_header(frame, header_version)
        .map(|(_, len)| len)
        .map_err(|(at, reason)| DecodeError::Malformed {
            api: crate::api::Api::of(api),
            version,
            at,
            reason,
        })
}

/// Decodes a response body (no length prefix, no response header) for `api_key` at `version`.
///
/// Every input is safe: bodies that contain arrays are scanned by the guard
/// first, and those without are decoded by kafka-protocol directly, which is bounded for them (the
/// guard's docs explain both), so this returns in time and memory bounded by a small multiple of
/// `body.len()`, and never panics. Leftover bytes are [`DecodeError::TrailingBytes`]; an
/// (API, version) pair outside [`SUPPORTED`](super::versions::SUPPORTED) is
/// [`DecodeError::UnsupportedVersion`].
///
/// ApiVersions follows KIP-511: a broker that does not support the requested ApiVersions version
/// answers UNSUPPORTED_VERSION in a **v0** body whatever version was asked for, so an ApiVersions
/// body whose error code is 35 and that is valid as v0 is decoded as v0 (the Java client does the
/// same). Pass the result to `versions::api_versions_fallback`.
pub fn decode_response(
    api_key: ApiKey,
    version: i16,
    body: &[u8],
) -> Result<Response, DecodeError> {
    let version = body_version(api_key, version, body);
    if guard::needs_scan(api_key, version) == Some(false) {
        // No arrays: kafka-protocol's decoder is bounded on its own (see the guard's docs).
        let mut buf = body;
        return decode_body(api_key, version, &mut buf);
    }
    let scan = guard::scan_response(api_key, version, body)?;
    if scan.allocations >= ZERO_COPY_MIN_ALLOCATIONS {
        // One copy of the body instead of one allocation per string or byte field: the decoded
        // fields then share it. Cheaper from about six such fields on (see BENCHMARKS.md); the
        // price is that any field kept alive keeps the whole body (at most one frame) alive.
        let mut buf = Bytes::copy_from_slice(body);
        decode_body(api_key, version, &mut buf)
    } else {
        let mut buf = body;
        decode_body(api_key, version, &mut buf)
    }
}

/// From how many non-empty string or byte fields [`decode_response`] copies the body once into
/// shared [`Bytes`] rather than letting each field allocate.
const ZERO_COPY_MIN_ALLOCATIONS: usize = 6;

/// [`decode_response`] for a body already in [`Bytes`], without copying strings and byte fields.
pub fn decode_response_bytes(
    api_key: ApiKey,
    version: i16,
    body: Bytes,
) -> Result<Response, DecodeError> {
    let version = body_version(api_key, version, &body);
    if guard::needs_scan(api_key, version) != Some(false) {
        guard::scan_response(api_key, version, &body)?;
    }
    let mut buf = body;
    decode_body(api_key, version, &mut buf)
}

const UNSUPPORTED_VERSION: [u8; 2] = 35i16.to_be_bytes();

#[inline]
fn body_version(api: ApiKey, version: i16, body: &[u8]) -> i16 {
    // Only for versions we could have sent: any other version must stay UnsupportedVersion.
    if api == ApiKey::ApiVersions
        && version > 0
        && guard::covered_versions(api).is_some_and(|(_, max)| version <= max)
        && body.get(..2) == Some(&UNSUPPORTED_VERSION[..])
        && guard::scan_response(api, 0, body).is_ok()
    {
        0
    } else {
        version
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frame::{decode_frame, DEFAULT_MAX_FRAME_SIZE};
    use crate::wire::guard::tests::{all_covered, generate};
    use kafka_protocol::messages::{
        api_versions_response::ApiVersion, join_group_response::JoinGroupResponseMember,
        ResponseHeader,
    };
    use kafka_protocol::protocol::decode_request_header_from_buffer;
    use proptest::prelude::*;

    fn sample_requests() -> Vec<Request> {
        vec![
            ApiVersionsRequest::default()
                .with_client_software_name(StrBytes::from_static_str("kafka-lock"))
                .with_client_software_version(StrBytes::from_static_str("0.1.0"))
                .into(),
            HeartbeatRequest::default()
                .with_group_id(StrBytes::from_static_str("g").into())
                .with_generation_id(3)
                .with_member_id(StrBytes::from_static_str("m"))
                .into(),
        ]
    }

    #[test]
    fn requests_are_framed_with_the_right_header_version() {
        for req in sample_requests() {
            let api = req.api_key();
            let (min, max) = versions::supported_range(api).unwrap();
            for version in min..=max {
                if api == ApiKey::ApiVersions && version < 3 {
                    // v0-2 cannot carry the software name and version; kafka-protocol refuses.
                    continue;
                }
                let mut out = BytesMut::new();
                encode_request(&req, version, 77, Some("cli"), &mut out).unwrap();
                let mut frame = decode_frame(&mut out, DEFAULT_MAX_FRAME_SIZE)
                    .unwrap()
                    .unwrap();
                assert!(out.is_empty());
                let header = decode_request_header_from_buffer(&mut frame).unwrap();
                assert_eq!(header.request_api_key, api as i16);
                assert_eq!(header.request_api_version, version);
                assert_eq!(header.correlation_id, 77);
                assert_eq!(header.client_id.as_deref(), Some("cli"));
                let decoded = match api {
                    ApiKey::ApiVersions => {
                        Request::from(ApiVersionsRequest::decode(&mut frame, version).unwrap())
                    }
                    ApiKey::Heartbeat => {
                        Request::from(HeartbeatRequest::decode(&mut frame, version).unwrap())
                    }
                    _ => unreachable!(),
                };
                assert!(frame.is_empty(), "{api:?} v{version}: body fully consumed");
                assert_eq!(decoded, req);
            }
        }
    }

    /// Requests are appended to whatever the buffer already holds: each frame's prefix counts its
    /// own bytes, not the buffer's.
    #[test]
    fn frames_appended_to_a_buffer_each_announce_their_own_length() {
        let reqs = sample_requests();
        let mut out = BytesMut::new();
        for (i, req) in reqs.iter().enumerate() {
            let (_, max) = versions::supported_range(req.api_key()).unwrap();
            encode_request(req, max, i as i32, Some("cli"), &mut out).unwrap();
        }
        for (i, req) in reqs.iter().enumerate() {
            let mut frame = decode_frame(&mut out, DEFAULT_MAX_FRAME_SIZE)
                .unwrap()
                .unwrap_or_else(|| panic!("frame {i} incomplete"));
            let header = decode_request_header_from_buffer(&mut frame).unwrap();
            assert_eq!(header.request_api_key, req.api_key() as i16);
            assert_eq!(header.correlation_id, i as i32);
        }
        assert!(out.is_empty(), "{} bytes left", out.len());
    }

    #[test]
    fn api_versions_v3_uses_request_header_v2() {
        let mut out = BytesMut::new();
        encode_request(&sample_requests()[0], 3, 1, None, &mut out).unwrap();
        // prefix(4) key(2) version(2) correlation(4) client id null(2) tagged fields(1)
        assert_eq!(&out[4..15], &[0, 18, 0, 3, 0, 0, 0, 1, 0xff, 0xff, 0]);
    }

    #[test]
    fn encode_errors_leave_the_buffer_untouched() {
        let mut out = BytesMut::from(&b"keep"[..]);
        let req = &sample_requests()[1];
        let err = encode_request(req, 5, 1, None, &mut out).unwrap_err();
        assert!(
            matches!(
                err,
                EncodeError::UnsupportedVersion {
                    ours: Some((0, 4)),
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("v0 to v4"), "{err}");
        // v0 Heartbeat has no group instance id: kafka-protocol refuses to drop it silently.
        let req = Request::from(
            HeartbeatRequest::default()
                .with_group_instance_id(Some(StrBytes::from_static_str("i"))),
        );
        let err = encode_request(&req, 0, 1, None, &mut out).unwrap_err();
        assert!(matches!(err, EncodeError::Protocol { .. }), "{err}");
        assert_eq!(&out[..], b"keep");
    }

    fn response_frame(header_version: i16, correlation_id: i32, body: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        ResponseHeader::default()
            .with_correlation_id(correlation_id)
            .encode(&mut out, header_version)
            .unwrap();
        out.extend_from_slice(body);
        out.to_vec()
    }

    #[test]
    fn frames_of_every_covered_version_decode_with_header_and_correlation_check() {
        for (api, version) in all_covered() {
            let body = generate(api, version, 42);
            let frame = response_frame(api.response_header_version(version), 9, &body);
            let resp = decode_response_frame(&frame, api, version, 9)
                .unwrap_or_else(|e| panic!("{api:?} v{version}: {e}"));
            assert_eq!(resp.api_key(), api);
            let same =
                decode_response_frame_bytes(Bytes::from(frame.clone()), api, version, 9).unwrap();
            assert_eq!(resp, same);
            let err = decode_response_frame(&frame, api, version, 10).unwrap_err();
            assert!(matches!(
                err,
                DecodeError::CorrelationMismatch {
                    expected: 10,
                    actual: 9
                }
            ));
        }
    }

    #[test]
    fn join_group_round_trip_keeps_values() {
        let members = (0..5)
            .map(|i| {
                JoinGroupResponseMember::default()
                    .with_member_id(StrBytes::from_string(format!("member-{i}")))
                    .with_group_instance_id(Some(StrBytes::from_static_str("inst")))
                    .with_metadata(Bytes::from(vec![i as u8; 50]))
            })
            .collect();
        let resp = JoinGroupResponse::default()
            .with_generation_id(12)
            .with_protocol_type(Some(StrBytes::from_static_str("lock")))
            .with_protocol_name(Some(StrBytes::from_static_str("sticky")))
            .with_leader(StrBytes::from_static_str("member-0"))
            .with_member_id(StrBytes::from_static_str("member-0"))
            .with_members(members);
        for version in 7..=9 {
            let mut body = BytesMut::new();
            resp.encode(&mut body, version).unwrap();
            let decoded = decode_response(ApiKey::JoinGroup, version, &body).unwrap();
            assert_eq!(decoded, Response::JoinGroup(resp.clone()));
            let decoded = decode_response_bytes(ApiKey::JoinGroup, version, body.freeze()).unwrap();
            assert_eq!(decoded, Response::JoinGroup(resp.clone()));
        }
    }

    #[test]
    fn value_errors_from_kafka_protocol_are_typed() {
        // SyncGroup v5 with a protocol name that is not UTF-8.
        let body = [0, 0, 0, 0, 0, 0, 0, 2, 0xff, 1, 0];
        let err = decode_response(ApiKey::SyncGroup, 5, &body).unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::Protocol {
                    api: Api::SyncGroup,
                    version: 5,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn unsupported_version_api_versions_reply_is_read_as_v0() {
        // What a broker sends when it does not know ApiVersions v3: error 35 and its own range
        // for ApiVersions, in a v0 body.
        let v0 = ApiVersionsResponse::default()
            .with_error_code(35)
            .with_api_keys(vec![ApiVersion::default()
                .with_api_key(18)
                .with_min_version(0)
                .with_max_version(2)]);
        let mut body = BytesMut::new();
        v0.encode(&mut body, 0).unwrap();
        let frame = response_frame(0, 5, &body);
        let Response::ApiVersions(resp) =
            decode_response_frame(&frame, ApiKey::ApiVersions, 3, 5).unwrap()
        else {
            panic!("wrong variant");
        };
        assert_eq!(resp, v0);
        assert_eq!(versions::api_versions_fallback(&resp), Some(2));
        // A real v3 body with error 35 still decodes as v3.
        let v3 = v0.clone().with_throttle_time_ms(4);
        let mut body = BytesMut::new();
        v3.encode(&mut body, 3).unwrap();
        let Response::ApiVersions(resp) = decode_response(ApiKey::ApiVersions, 3, &body).unwrap()
        else {
            panic!("wrong variant");
        };
        assert_eq!(resp, v3);
    }

    #[test]
    fn every_truncation_is_an_error_scanned_or_not() {
        for (api, version) in all_covered() {
            let body = generate(api, version, 7);
            for cut in 0..body.len() {
                let err = decode_response(api, version, &body[..cut])
                    .err()
                    .unwrap_or_else(|| panic!("{api:?} v{version} cut {cut} decoded"));
                assert!(
                    matches!(
                        err,
                        DecodeError::Malformed { .. } | DecodeError::Protocol { .. }
                    ),
                    "{api:?} v{version} cut {cut}: {err}"
                );
            }
            let mut longer = body.clone();
            longer.push(0);
            assert!(matches!(
                decode_response(api, version, &longer),
                Err(DecodeError::TrailingBytes { left: 1, .. })
            ));
        }
    }

    #[test]
    fn truncated_headers_are_typed_errors() {
        for (api, version) in [(ApiKey::Heartbeat, 0), (ApiKey::Heartbeat, 4)] {
            for frame in [&[][..], &[0, 0, 0][..]] {
                let err = decode_response_frame(frame, api, version, 0).unwrap_err();
                assert!(matches!(err, DecodeError::Malformed { .. }), "{err}");
            }
        }
        assert_eq!(peek_correlation_id(&[0, 0, 1, 0, 9]), Some(256));
        assert_eq!(peek_correlation_id(&[0, 0, 1]), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn decoding_random_bytes_never_panics(
            api in prop::sample::select(versions::SUPPORTED.iter().map(|s| s.0).collect::<Vec<_>>()),
            version in -1i16..15,
            body in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let _ = decode_response(api, version, &body);
            let _ = decode_response_frame(&body, api, version, 0);
        }

        #[test]
        fn decoding_mutated_frames_never_panics(
            pick in any::<prop::sample::Index>(),
            seed in any::<u64>(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let pairs: Vec<_> = all_covered().collect();
            let (api, version) = *pick.get(&pairs);
            let mut body = generate(api, version, seed);
            if !body.is_empty() {
                for (at, byte) in flips {
                    let i = at.index(body.len());
                    body[i] = byte;
                }
            }
            if let Ok(resp) = decode_response(api, version, &body) {
                prop_assert_eq!(resp.api_key(), api);
            }
        }
    }

    #[test]
    fn large_random_inputs_finish_quickly() {
        let mut rng = crate::wire::guard::tests::Rng(1);
        let body: Vec<u8> = (0..DEFAULT_MAX_FRAME_SIZE)
            .map(|_| rng.next() as u8)
            .collect();
        let started = std::time::Instant::now();
        for (api, version) in all_covered() {
            let _ = decode_response(api, version, &body);
            let _ = decode_response(api, version, &body[1..]);
        }
        // Generous: the scan is linear and usually stops within the first few bytes.
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
    }
}

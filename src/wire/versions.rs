//! Version negotiation: what we implement, what the broker supports, and the highest version both
//! sides share per API.
//!
//! The first request on a connection is ApiVersions at [`API_VERSIONS_REQUEST_VERSION`] (v3:
//! flexible, carries the client's software name and version, KIP-511; every broker since Kafka 2.4
//! accepts it, and v4 differs only in how feature flags are reported). An older broker answers
//! UNSUPPORTED_VERSION with a v0 body listing its own ApiVersions range; [`api_versions_fallback`]
//! picks the version to retry with. [`negotiate`] then intersects the broker's ranges with
//! [`SUPPORTED`].
//!
//! # References
//! - KIP-511: <https://cwiki.apache.org/confluence/display/KAFKA/KIP-511%3A+Collect+and+Expose+Client%27s+Name+and+Version+in+the+Brokers>

use std::fmt;

use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};

use crate::api::Api;
use crate::wire::code::KafkaCode;

/// The versions kafka-lock implements, per API: `(api, min, max)`.
///
/// These are all the versions kafka-protocol 0.18 has for these messages, and exactly the versions
/// the decoding guard (`wire::guard`) has tables for (a test keeps the two equal). Produce,
/// Fetch and ListOffsets (for the ledger, see `wire::log`) are optional: they are absent
/// from the result of `negotiate` when the broker shares no version of them, and Produce starts
/// at v3, the first with record batches (message format v2), which is also where Apache Kafka 4
/// starts. ListOffsets starts at v1, kafka-protocol's first and Apache Kafka 4's (KIP-896).
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::Metadata, 0, 13),
    (ApiKey::FindCoordinator, 0, 6),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::DescribeGroups, 0, 6),
    (ApiKey::OffsetCommit, 2, 10),
    (ApiKey::OffsetFetch, 1, 10),
    (ApiKey::Produce, 3, 13),
    (ApiKey::Fetch, 4, 18),
    (ApiKey::ListOffsets, 1, 10),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
];

/// APIs without which kafka-lock cannot work; [`negotiate`] fails if the broker lacks one.
pub const REQUIRED: &[ApiKey] = &[
    ApiKey::FindCoordinator,
    ApiKey::JoinGroup,
    ApiKey::SyncGroup,
    ApiKey::Heartbeat,
    ApiKey::LeaveGroup,
];

/// The ApiVersions version sent first on every connection. v3 is the first flexible version and
/// the one KIP-511's fallback is defined for; a broker that does not know it tells us what it
/// does know.
pub const API_VERSIONS_REQUEST_VERSION: i16 = 3;

/// The versions kafka-lock implements for `api`, if any.
pub fn supported_range(api: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED
        .iter()
        .find(|(a, _, _)| *a == api)
        .map(|&(_, min, max)| (min, max))
}

/// Version negotiation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VersionError {
    /// The broker does not support any version of a required API that kafka-lock implements.
    #[error(
        "the broker supports no version of {api} that kafka-lock implements: kafka-lock implements v{}-v{}, the broker {}; use a broker that supports the classic consumer-group protocol (Kafka 0.9 or newer)",
        .ours.0, .ours.1, BrokerRange(*.broker)
    )]
    Unsupported {
        /// The API.
        api: Api,
        /// What kafka-lock implements.
        ours: (i16, i16),
        /// What the broker listed, `None` if it did not list the API at all.
        broker: Option<(i16, i16)>,
    },

    /// The address is a KRaft controller's listener, not a broker's: it lists the APIs brokers
    /// send controllers (BrokerRegistration, BrokerHeartbeat) and none of the group APIs.
    #[error(
        "this is a KRaft controller's listener (controller.listener.names), not a broker's: it answers only the APIs brokers send their controllers; give a broker listener (listeners, advertised.listeners) to --bootstrap"
    )]
    ControllerListener,

    /// The ApiVersions response itself carried an error.
    #[error("the broker refused ApiVersions: {code}")]
    ApiVersions {
        /// The response's error code.
        code: KafkaCode,
    },
}

struct BrokerRange(Option<(i16, i16)>);

impl fmt::Display for BrokerRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some((min, max)) => write!(f, "supports v{min}-v{max}"),
            None => f.write_str("does not list it at all"),
        }
    }
}

/// The version to use for each API on one broker connection.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NegotiatedVersions {
    versions: Vec<(ApiKey, i16)>,
}

impl NegotiatedVersions {
    /// The version to send for `api`, or `None` when the broker and kafka-lock share none.
    pub fn get(&self, api: ApiKey) -> Option<i16> {
        self.versions
            .iter()
            .find(|(a, _)| *a == api)
            .map(|&(_, v)| v)
    }

    /// Every API with a common version, in [`SUPPORTED`] order.
    pub fn iter(&self) -> impl Iterator<Item = (ApiKey, i16)> + '_ {
        self.versions.iter().copied()
    }
}

/// Per API, the highest version both kafka-lock ([`SUPPORTED`]) and the broker support.
///
/// Fails with [`VersionError::Unsupported`] when a [`REQUIRED`] API has no common version, and with
/// [`VersionError::ApiVersions`] when the response carries an error code (for
/// UNSUPPORTED_VERSION, see [`api_versions_fallback`] first). Optional APIs without a common
/// version are simply absent.
pub fn negotiate(resp: &ApiVersionsResponse) -> Result<NegotiatedVersions, VersionError> {
    negotiate_within(resp, SUPPORTED)
}

/// [`negotiate`] against a narrower set of our own ranges, e.g. to cap versions for a broker
/// with a known bug.
pub fn negotiate_within(
    resp: &ApiVersionsResponse,
    ours: &[(ApiKey, i16, i16)],
) -> Result<NegotiatedVersions, VersionError> {
    if resp.error_code != 0 {
        return Err(VersionError::ApiVersions {
            code: KafkaCode(resp.error_code),
        });
    }
    if is_controller(resp) {
        return Err(VersionError::ControllerListener);
    }
    let mut versions = Vec::with_capacity(ours.len());
    for &(api, our_min, our_max) in ours {
        let broker = broker_range(resp, api);
        let common = broker.and_then(|(min, max)| {
            let (lo, hi) = (min.max(our_min), max.min(our_max));
            (lo <= hi).then_some(hi)
        });
        match common {
            Some(v) => versions.push((api, v)),
            None if REQUIRED.contains(&api) => {
                return Err(VersionError::Unsupported {
                    api: crate::api::Api::of(api),
                    ours: (our_min, our_max),
                    broker,
                })
            }
            None => {}
        }
    }
    for &api in REQUIRED {
        if !ours.iter().any(|(a, _, _)| *a == api) {
            return Err(VersionError::Unsupported {
                api: crate::api::Api::of(api),
                ours: supported_range(api).unwrap_or((0, -1)),
                broker: broker_range(resp, api),
            });
        }
    }
    Ok(NegotiatedVersions { versions })
}

/// Whether the ApiVersions answer is a KRaft controller's: Apache Kafka lists, per listener, the
/// APIs whose message definition names that listener. BrokerRegistration and BrokerHeartbeat
/// are `"listeners": ["controller"]` only (clients/src/main/resources/common/message/
/// BrokerRegistrationRequest.json, BrokerHeartbeatRequest.json at 4.1.2) and JoinGroup is
/// `["broker"]` only (JoinGroupRequest.json), so a listener that lists the first and lacks the
/// second is a controller's, whatever else it lists.
fn is_controller(resp: &ApiVersionsResponse) -> bool {
    let lists = |api: ApiKey| broker_range(resp, api).is_some();
    !lists(ApiKey::JoinGroup)
        && (lists(ApiKey::BrokerRegistration) || lists(ApiKey::BrokerHeartbeat))
}

/// The broker's advertised range for `api` (the first entry if it lists one twice).
pub fn broker_range(resp: &ApiVersionsResponse, api: ApiKey) -> Option<(i16, i16)> {
    resp.api_keys
        .iter()
        .find(|k| k.api_key == api as i16)
        .map(|k| (k.min_version, k.max_version))
}

/// KIP-511 fallback: when the broker answered our ApiVersions with UNSUPPORTED_VERSION and listed
/// its own ApiVersions range, the version to retry with (its maximum, capped to ours).
///
/// Such a response is always a v0 body whatever version was sent;
/// [`decode_response`](super::codec::decode_response) reads it as v0. Returns `None` when the
/// response is not UNSUPPORTED_VERSION, when the broker listed no ApiVersions range, or when the
/// ranges do not overlap (nothing to retry with).
pub fn api_versions_fallback(resp: &ApiVersionsResponse) -> Option<i16> {
    if resp.error_code != KafkaCode::UNSUPPORTED_VERSION.0 {
        return None;
    }
    let (our_min, our_max) = supported_range(ApiKey::ApiVersions)?;
    let (min, max) = broker_range(resp, ApiKey::ApiVersions)?;
    let version = max.min(our_max);
    (version >= min.max(our_min)).then_some(version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::api_versions_response::ApiVersion;

    fn broker(ranges: &[(ApiKey, i16, i16)]) -> ApiVersionsResponse {
        ApiVersionsResponse::default().with_api_keys(
            ranges
                .iter()
                .map(|&(api, min, max)| {
                    ApiVersion::default()
                        .with_api_key(api as i16)
                        .with_min_version(min)
                        .with_max_version(max)
                })
                .collect(),
        )
    }

    /// Kafka 4.0.0: it removed JoinGroup v0-1 (restored in 4.0.1), lists Produce from v0 although
    /// it refuses v0-2 (KAFKA-18659: librdkafka needs to see them), Produce up to v12 and Fetch up
    /// to v17 (4.1 adds Produce v13 and Fetch v18); plus an API we do not implement.
    fn kafka_4_0() -> ApiVersionsResponse {
        broker(&[
            (ApiKey::Produce, 0, 12),
            (ApiKey::Fetch, 4, 17),
            (ApiKey::ListOffsets, 1, 9),
            (ApiKey::Metadata, 0, 13),
            (ApiKey::OffsetCommit, 2, 9),
            (ApiKey::OffsetFetch, 1, 9),
            (ApiKey::FindCoordinator, 0, 6),
            (ApiKey::JoinGroup, 2, 9),
            (ApiKey::Heartbeat, 0, 4),
            (ApiKey::LeaveGroup, 0, 5),
            (ApiKey::SyncGroup, 0, 5),
            (ApiKey::DescribeGroups, 0, 6),
            (ApiKey::DescribeConfigs, 1, 4),
            (ApiKey::ApiVersions, 0, 4),
            (ApiKey::SaslHandshake, 0, 1),
            (ApiKey::SaslAuthenticate, 0, 2),
        ])
    }

    #[test]
    fn supported_matches_the_guard() {
        for &(api, min, max) in SUPPORTED {
            assert_eq!(
                super::super::guard::covered_versions(api),
                Some((min, max)),
                "{api:?}"
            );
        }
        assert_eq!(SUPPORTED.len(), super::super::guard::MESSAGES.len());
        for api in REQUIRED {
            assert!(supported_range(*api).is_some());
        }
    }

    #[test]
    fn picks_the_highest_common_version() {
        let n = negotiate(&kafka_4_0()).unwrap();
        assert_eq!(n.get(ApiKey::JoinGroup), Some(9));
        assert_eq!(n.get(ApiKey::OffsetCommit), Some(9));
        assert_eq!(n.get(ApiKey::Metadata), Some(13));
        assert_eq!(n.get(ApiKey::ApiVersions), Some(4));
        assert_eq!(n.get(ApiKey::Produce), Some(12));
        assert_eq!(n.get(ApiKey::Fetch), Some(17));
        assert_eq!(n.get(ApiKey::ListOffsets), Some(9));
        assert_eq!(n.iter().count(), SUPPORTED.len());
    }

    #[test]
    fn a_controller_listener_is_named_as_such() {
        // What a KRaft controller lists: no group APIs, the broker-to-controller ones.
        let controller = broker(&[
            (ApiKey::ApiVersions, 0, 4),
            (ApiKey::Metadata, 0, 13),
            (ApiKey::Vote, 0, 2),
            (ApiKey::BrokerRegistration, 0, 4),
            (ApiKey::BrokerHeartbeat, 0, 1),
        ]);
        assert_eq!(
            negotiate(&controller),
            Err(VersionError::ControllerListener)
        );
        assert!(VersionError::ControllerListener
            .to_string()
            .contains("KRaft controller"));
        // A broker that lists a controller API as well is still a broker.
        let mut both = kafka_4_0();
        both.api_keys.push(
            ApiVersion::default()
                .with_api_key(ApiKey::BrokerHeartbeat as i16)
                .with_max_version(1),
        );
        assert!(negotiate(&both).is_ok());
    }

    #[test]
    fn narrower_ranges_cap_the_result() {
        let ours = [
            (ApiKey::FindCoordinator, 0, 2),
            (ApiKey::JoinGroup, 0, 5),
            (ApiKey::SyncGroup, 0, 3),
            (ApiKey::Heartbeat, 0, 3),
            (ApiKey::LeaveGroup, 0, 1),
        ];
        let n = negotiate_within(&kafka_4_0(), &ours).unwrap();
        assert_eq!(n.get(ApiKey::JoinGroup), Some(5));
        assert_eq!(n.get(ApiKey::LeaveGroup), Some(1));
        assert_eq!(n.get(ApiKey::Metadata), None);
    }

    #[test]
    fn optional_apis_may_be_missing() {
        let only_required = broker(&[
            (ApiKey::FindCoordinator, 0, 2),
            (ApiKey::JoinGroup, 0, 5),
            (ApiKey::SyncGroup, 0, 3),
            (ApiKey::Heartbeat, 0, 3),
            (ApiKey::LeaveGroup, 0, 1),
        ]);
        let n = negotiate(&only_required).unwrap();
        assert_eq!(n.get(ApiKey::DescribeGroups), None);
        assert_eq!(n.get(ApiKey::Produce), None);
        assert_eq!(n.get(ApiKey::Fetch), None);
        assert_eq!(n.get(ApiKey::ListOffsets), None);
        // Produce v0-2 (message format v0/v1) is not ours: an old broker's Produce is unusable.
        let mut old = only_required.clone();
        old.api_keys.push(
            ApiVersion::default()
                .with_api_key(ApiKey::Produce as i16)
                .with_min_version(0)
                .with_max_version(2),
        );
        assert_eq!(negotiate(&old).unwrap().get(ApiKey::Produce), None);
        assert_eq!(n.get(ApiKey::Heartbeat), Some(3));
    }

    #[test]
    fn a_missing_or_disjoint_required_api_names_api_and_ranges() {
        let mut resp = kafka_4_0();
        resp.api_keys
            .retain(|k| k.api_key != ApiKey::SyncGroup as i16);
        let err = negotiate(&resp).unwrap_err();
        assert_eq!(
            err,
            VersionError::Unsupported {
                api: Api::SyncGroup,
                ours: (0, 5),
                broker: None
            }
        );
        let msg = err.to_string();
        assert!(
            msg.contains("SyncGroup") && msg.contains("v0-v5") && msg.contains("does not list"),
            "{msg}"
        );

        let mut resp = kafka_4_0();
        for k in &mut resp.api_keys {
            if k.api_key == ApiKey::Heartbeat as i16 {
                k.min_version = 5;
                k.max_version = 7;
            }
        }
        let msg = negotiate(&resp).unwrap_err().to_string();
        assert!(
            msg.contains("Heartbeat") && msg.contains("v0-v4") && msg.contains("supports v5-v7"),
            "{msg}"
        );
    }

    #[test]
    fn an_error_response_is_not_negotiated() {
        let resp = kafka_4_0().with_error_code(35);
        assert!(
            matches!(negotiate(&resp), Err(VersionError::ApiVersions { code }) if code.0 == 35)
        );
    }

    #[test]
    fn kip_511_fallback() {
        let old = broker(&[(ApiKey::ApiVersions, 0, 2)]).with_error_code(35);
        assert_eq!(api_versions_fallback(&old), Some(2));
        let newer = broker(&[(ApiKey::ApiVersions, 0, 7)]).with_error_code(35);
        assert_eq!(api_versions_fallback(&newer), Some(4));
        let none_listed = ApiVersionsResponse::default().with_error_code(35);
        assert_eq!(api_versions_fallback(&none_listed), None);
        let disjoint = broker(&[(ApiKey::ApiVersions, 5, 7)]).with_error_code(35);
        assert_eq!(api_versions_fallback(&disjoint), None);
        assert_eq!(api_versions_fallback(&kafka_4_0()), None);
    }
}

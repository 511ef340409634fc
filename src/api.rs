//! [`Api`]: the Kafka APIs, as errors name them.
//!
//! Errors say which request failed. They do so with this enum of kafka-lock's own rather than the
//! codec's key type, so that the codec library can change without changing the public API.

use std::fmt;

use kafka_protocol::messages::ApiKey;

/// A Kafka API (a request kind), by its protocol key.
///
/// The named variants are the APIs kafka-lock speaks; any other key is [`Api::Other`]. A later
/// release may name more keys, so a key that is `Other` today may get its own variant: compare
/// [`Api::key`] when a program must recognise keys this version does not name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Api {
    /// Produce (key 0).
    Produce,
    /// Fetch (key 1).
    Fetch,
    /// ListOffsets (key 2).
    ListOffsets,
    /// Metadata (key 3).
    Metadata,
    /// OffsetCommit (key 8).
    OffsetCommit,
    /// OffsetFetch (key 9).
    OffsetFetch,
    /// FindCoordinator (key 10).
    FindCoordinator,
    /// JoinGroup (key 11).
    JoinGroup,
    /// Heartbeat (key 12).
    Heartbeat,
    /// LeaveGroup (key 13).
    LeaveGroup,
    /// SyncGroup (key 14).
    SyncGroup,
    /// DescribeGroups (key 15).
    DescribeGroups,
    /// SaslHandshake (key 17).
    SaslHandshake,
    /// ApiVersions (key 18).
    ApiVersions,
    /// DescribeConfigs (key 32).
    DescribeConfigs,
    /// SaslAuthenticate (key 36).
    SaslAuthenticate,
    /// A key this version of kafka-lock does not name.
    Other(i16),
}

/// (variant, key, name), the one table both directions read.
const NAMED: [(Api, i16, &str); 16] = [
    (Api::Produce, 0, "Produce"),
    (Api::Fetch, 1, "Fetch"),
    (Api::ListOffsets, 2, "ListOffsets"),
    (Api::Metadata, 3, "Metadata"),
    (Api::OffsetCommit, 8, "OffsetCommit"),
    (Api::OffsetFetch, 9, "OffsetFetch"),
    (Api::FindCoordinator, 10, "FindCoordinator"),
    (Api::JoinGroup, 11, "JoinGroup"),
    (Api::Heartbeat, 12, "Heartbeat"),
    (Api::LeaveGroup, 13, "LeaveGroup"),
    (Api::SyncGroup, 14, "SyncGroup"),
    (Api::DescribeGroups, 15, "DescribeGroups"),
    (Api::SaslHandshake, 17, "SaslHandshake"),
    (Api::ApiVersions, 18, "ApiVersions"),
    (Api::DescribeConfigs, 32, "DescribeConfigs"),
    (Api::SaslAuthenticate, 36, "SaslAuthenticate"),
];

impl Api {
    /// The API with protocol key `key`.
    pub fn from_key(key: i16) -> Api {
        NAMED
            .iter()
            .find(|(_, k, _)| *k == key)
            .map_or(Api::Other(key), |(api, _, _)| *api)
    }

    /// The protocol key.
    pub fn key(self) -> i16 {
        match self {
            Api::Other(key) => key,
            named => NAMED
                .iter()
                .find(|(api, _, _)| *api == named)
                .map_or(-1, |(_, key, _)| *key),
        }
    }

    /// The API's name as the protocol specification spells it, e.g. `"JoinGroup"`; `None` for
    /// [`Api::Other`].
    pub fn name(self) -> Option<&'static str> {
        NAMED
            .iter()
            .find(|(api, _, _)| *api == self)
            .map(|(_, _, name)| *name)
    }

    /// The codec's key as this crate's type (keeps the codec's type out of the public API).
    pub(crate) fn of(key: ApiKey) -> Api {
        Api::from_key(key as i16)
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "API key {}", self.key()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_names_match_the_codec() {
        for (api, key, name) in NAMED {
            let codec = ApiKey::try_from(key).expect("a key the codec knows");
            assert_eq!(Api::of(codec), api);
            assert_eq!(format!("{codec:?}"), name);
            assert_eq!(api.key(), key);
            assert_eq!(api.to_string(), name);
        }
    }

    #[test]
    fn other_keys_round_trip() {
        for key in [-1, 4, 16, 37, 1000, i16::MAX] {
            assert_eq!(Api::from_key(key), Api::Other(key));
            assert_eq!(Api::from_key(key).key(), key);
            assert_eq!(Api::Other(key).to_string(), format!("API key {key}"));
        }
    }
}

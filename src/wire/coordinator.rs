//! FindCoordinator for a group, in both shapes: v0-3 carry one key and answer at the top level,
//! v4+ (KIP-699) carry a list of keys and answer one entry per key.

use kafka_protocol::messages::{FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;

use crate::api::Api;
use crate::wire::code::KafkaCode;

/// Why a FindCoordinator answer names no coordinator. The crate's `Error` wraps it (as a broker
/// error, or as a protocol error for an unusable address) with the same words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoordinatorError {
    /// The broker answered with an error code.
    #[error("{} failed: {code}{}", Api::FindCoordinator, .message.as_deref().map(|m| format!(" (broker says: {m})")).unwrap_or_default())]
    Broker {
        /// The code.
        code: KafkaCode,
        /// The broker's own message, when it sent one that is not empty.
        message: Option<String>,
    },
    /// A success that names no host or a port outside 1..=65535.
    #[error("FindCoordinator named an unusable coordinator {host:?}:{port}")]
    Unusable {
        /// The host the answer named.
        host: String,
        /// The port the answer named.
        port: i32,
    },
}

impl CoordinatorError {
    /// Whether asking again may name a coordinator (see [`KafkaCode::is_retriable`]); an unusable
    /// address is not.
    pub fn is_retriable(&self) -> bool {
        match self {
            CoordinatorError::Broker { code, .. } => code.is_retriable(),
            CoordinatorError::Unusable { .. } => false,
        }
    }
}

/// A coordinator the broker named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundCoordinator {
    /// Broker id.
    pub node_id: i32,
    /// Host to connect to.
    pub host: String,
    /// Port to connect to.
    pub port: u16,
}

/// The request that asks for `group`'s coordinator, shaped for `version`.
pub fn find_coordinator_request(group: &str, version: i16) -> FindCoordinatorRequest {
    let mut req = FindCoordinatorRequest::default();
    let key = StrBytes::from_string(group.to_owned());
    if version >= 4 {
        req.coordinator_keys = vec![key];
    } else {
        req.key = key;
    }
    req
}

/// The coordinator in an answer of either shape. A broker error code is
/// `CoordinatorError::Broker` (check `CoordinatorError::is_retriable`); a success without a
/// usable address is `CoordinatorError::Unusable`.
pub fn found_coordinator(
    resp: &FindCoordinatorResponse,
) -> Result<FoundCoordinator, CoordinatorError> {
    let (code, node_id, host, port, message) = match resp.coordinators.first() {
        Some(c) => (c.error_code, c.node_id.0, &c.host, c.port, &c.error_message),
        None => (
            resp.error_code,
            resp.node_id.0,
            &resp.host,
            resp.port,
            &resp.error_message,
        ),
    };
    if code != 0 {
        return Err(CoordinatorError::Broker {
            code: KafkaCode(code),
            message: message
                .as_ref()
                .map(|m| m.as_str())
                .filter(|m| !m.is_empty())
                .map(str::to_owned),
        });
    }
    match u16::try_from(port) {
        Ok(port) if port != 0 && !host.is_empty() => Ok(FoundCoordinator {
            node_id,
            host: host.to_string(),
            port,
        }),
        _ => Err(CoordinatorError::Unusable {
            host: host.to_string(),
            port,
        }),
    }
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::find_coordinator_response::Coordinator;

    use super::*;

    #[test]
    fn both_shapes_and_bad_answers() {
        assert_eq!(find_coordinator_request("g", 3).key.as_str(), "g");
        assert_eq!(
            find_coordinator_request("g", 4).coordinator_keys[0].as_str(),
            "g"
        );

        let mut old = FindCoordinatorResponse::default();
        old.host = StrBytes::from_static_str("127.0.0.1");
        old.port = 9092;
        assert_eq!(found_coordinator(&old).unwrap().port, 9092);

        let mut new = FindCoordinatorResponse::default();
        let mut c = Coordinator::default();
        c.host = StrBytes::from_static_str("127.0.0.1");
        c.port = 70000;
        new.coordinators = vec![c.clone()];
        assert!(matches!(
            found_coordinator(&new),
            Err(CoordinatorError::Unusable { .. })
        ));

        c.error_code = 15;
        new.coordinators = vec![c];
        match found_coordinator(&new) {
            Err(e @ CoordinatorError::Broker { .. }) => assert!(e.is_retriable()),
            other => panic!("{other:?}"),
        }
    }
}

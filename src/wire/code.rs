//! [`KafkaCode`]: the error codes brokers put in responses.
//!
//! Every Kafka error code from -1 to 133 (Kafka 4.1) has a name, a retriable/fatal flag and a
//! sentence saying what to do about it. The names and the retriable flags are Apache Kafka's
//! (`Errors.java`: a code is retriable when its exception is a `RetriableException`); a test checks
//! both against kafka-protocol's `ResponseError` table so the two cannot drift apart. Codes newer than
//! this table are reported as `UNKNOWN_CODE_<n>` and treated as fatal, which is also what the Java
//! client does with codes it does not know.
//!
//! "Retriable" means "sending the same request again, possibly after a backoff or to a rediscovered
//! coordinator, may succeed". The group-state codes (REBALANCE_IN_PROGRESS, UNKNOWN_MEMBER_ID,
//! ILLEGAL_GENERATION, MEMBER_ID_REQUIRED) are *not* retriable in that sense: they ask the member to
//! change state (rejoin, reset its id) before it tries again, and the group machine handles them.

use std::fmt;

/// A Kafka error code as found in a response (`0` means no error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KafkaCode(pub i16);

impl KafkaCode {
    /// No error.
    pub const NONE: KafkaCode = KafkaCode(0);
    /// The coordinator is still loading the group's state.
    pub const COORDINATOR_LOAD_IN_PROGRESS: KafkaCode = KafkaCode(14);
    /// No coordinator is available for the group yet.
    pub const COORDINATOR_NOT_AVAILABLE: KafkaCode = KafkaCode(15);
    /// The broker asked is not the group's coordinator.
    pub const NOT_COORDINATOR: KafkaCode = KafkaCode(16);
    /// The member's generation is stale.
    pub const ILLEGAL_GENERATION: KafkaCode = KafkaCode(22);
    /// The member's protocol type or protocols do not match the group's.
    pub const INCONSISTENT_GROUP_PROTOCOL: KafkaCode = KafkaCode(23);
    /// The group id is empty or otherwise invalid.
    pub const INVALID_GROUP_ID: KafkaCode = KafkaCode(24);
    /// The coordinator does not know this member id.
    pub const UNKNOWN_MEMBER_ID: KafkaCode = KafkaCode(25);
    /// The session timeout is outside the broker's allowed range.
    pub const INVALID_SESSION_TIMEOUT: KafkaCode = KafkaCode(26);
    /// The group is rebalancing; rejoin.
    pub const REBALANCE_IN_PROGRESS: KafkaCode = KafkaCode(27);
    /// The principal may not use this group.
    pub const GROUP_AUTHORIZATION_FAILED: KafkaCode = KafkaCode(30);
    /// The broker does not support the request's version.
    pub const UNSUPPORTED_VERSION: KafkaCode = KafkaCode(35);
    /// The coordinator assigned a member id; rejoin with it (KIP-394).
    pub const MEMBER_ID_REQUIRED: KafkaCode = KafkaCode(79);
    /// The group is full.
    pub const GROUP_MAX_SIZE_REACHED: KafkaCode = KafkaCode(81);
    /// Another member registered the same group instance id.
    pub const FENCED_INSTANCE_ID: KafkaCode = KafkaCode(82);
    /// The group does not exist (DescribeGroups v6+, DeleteGroups).
    pub const GROUP_ID_NOT_FOUND: KafkaCode = KafkaCode(69);

    /// Wraps a raw code.
    pub const fn from_code(code: i16) -> Self {
        KafkaCode(code)
    }

    /// The raw code.
    pub const fn code(self) -> i16 {
        self.0
    }

    /// `true` for code 0.
    pub const fn is_ok(self) -> bool {
        self.0 == 0
    }

    /// `true` when the code is known to this crate (see the module docs for the table's source).
    pub fn is_known(self) -> bool {
        entry(self.0).is_some()
    }

    /// Apache Kafka's name for the code, e.g. `"REBALANCE_IN_PROGRESS"`, or `"UNKNOWN_CODE"` for a
    /// code this crate does not know (the [`Display`](fmt::Display) form adds the number:
    /// `UNKNOWN_CODE_<n>`).
    pub fn name(self) -> &'static str {
        entry(self.0).map_or("UNKNOWN_CODE", |e| e.0)
    }

    /// Whether sending the same request again may succeed. Unknown codes are fatal.
    pub fn is_retriable(self) -> bool {
        entry(self.0).is_some_and(|e| e.1)
    }

    /// A sentence saying what the code means and what to do about it.
    pub fn description(self) -> &'static str {
        entry(self.0).map_or(
            "The broker returned an error code this version of kafka-lock does not know; check the \
             broker's logs and upgrade kafka-lock if the broker is newer.",
            |e| e.2,
        )
    }
}

impl From<i16> for KafkaCode {
    fn from(code: i16) -> Self {
        KafkaCode(code)
    }
}

impl fmt::Display for KafkaCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match entry(self.0) {
            Some((name, _, desc)) => write!(f, "{name} ({}): {desc}", self.0),
            None => write!(f, "UNKNOWN_CODE_{0} ({0}): {1}", self.0, self.description()),
        }
    }
}

impl std::error::Error for KafkaCode {}

fn entry(code: i16) -> Option<&'static (&'static str, bool, &'static str)> {
    let index = usize::try_from(i32::from(code) + 1).ok()?;
    CODES.get(index)
}

/// Indexed by `code + 1`: (name, retriable, what to do). Codes are contiguous from -1.
#[rustfmt::skip]
static CODES: [(&str, bool, &str); 135] = [
    ("UNKNOWN_SERVER_ERROR", false, "The broker hit an unexpected error while handling the request; look in the broker's logs."),
    ("NONE", false, "No error: the request succeeded."),
    ("OFFSET_OUT_OF_RANGE", false, "The requested offset is outside the range the broker holds; reset the position."),
    ("CORRUPT_MESSAGE", true, "A message failed its CRC check or is otherwise corrupt; the request may be retried."),
    ("UNKNOWN_TOPIC_OR_PARTITION", true, "The broker does not host this topic or partition; check the name, or wait for metadata to propagate."),
    ("INVALID_FETCH_SIZE", false, "The requested fetch size is invalid."),
    ("LEADER_NOT_AVAILABLE", true, "The partition has no leader right now (an election is running); retry after a short backoff."),
    ("NOT_LEADER_OR_FOLLOWER", true, "This broker is not the partition's leader or a replica; refresh metadata and retry."),
    ("REQUEST_TIMED_OUT", true, "The broker timed the request out; retry, and check broker load if it keeps happening."),
    ("BROKER_NOT_AVAILABLE", false, "The broker is not available; check that it is running and reachable."),
    ("REPLICA_NOT_AVAILABLE", true, "The replica is not available for this partition; retry after a short backoff."),
    ("MESSAGE_TOO_LARGE", false, "The request carried a message larger than the broker accepts; send less or raise the broker's limit."),
    ("STALE_CONTROLLER_EPOCH", false, "The controller moved to another broker."),
    ("OFFSET_METADATA_TOO_LARGE", false, "The offset commit's metadata string is longer than the broker allows (offset.metadata.max.bytes); shorten it."),
    ("NETWORK_EXCEPTION", true, "The broker disconnected before answering; retry on a new connection."),
    ("COORDINATOR_LOAD_IN_PROGRESS", true, "The group coordinator is still loading the group's state (usually right after a broker restart or failover); retry after a short backoff."),
    ("COORDINATOR_NOT_AVAILABLE", true, "No coordinator is available for the group yet (the __consumer_offsets partition has no leader or is being created); find the coordinator again after a backoff, and check broker health if it persists."),
    ("NOT_COORDINATOR", true, "The broker asked is no longer the group's coordinator; send FindCoordinator again and retry on the new coordinator."),
    ("INVALID_TOPIC_EXCEPTION", false, "The request named an invalid topic; fix the topic name."),
    ("RECORD_LIST_TOO_LARGE", false, "The record batch is larger than the broker's segment size."),
    ("NOT_ENOUGH_REPLICAS", true, "Fewer in-sync replicas than min.insync.replicas; retry once replicas catch up."),
    ("NOT_ENOUGH_REPLICAS_AFTER_APPEND", true, "Written, but to fewer in-sync replicas than required; retry once replicas catch up."),
    ("INVALID_REQUIRED_ACKS", false, "The produce request's acks setting is invalid."),
    ("ILLEGAL_GENERATION", false, "The member's generation is no longer the group's current one (a rebalance happened without it); any lock held under the old generation is lost: rejoin the group."),
    ("INCONSISTENT_GROUP_PROTOCOL", false, "The member's protocol type or protocol names do not match the group's (another application, or a consumer, uses the same group id); use a group id of its own for each lock."),
    ("INVALID_GROUP_ID", false, "The group id is empty or invalid; give the lock a non-empty name."),
    ("UNKNOWN_MEMBER_ID", false, "The coordinator does not know this member id (its session expired or it was removed); reset the member id and rejoin."),
    ("INVALID_SESSION_TIMEOUT", false, "The session timeout is outside the broker's allowed range (group.min.session.timeout.ms, default 6 s, to group.max.session.timeout.ms, default 30 min); change the session timeout or the broker's limits."),
    ("REBALANCE_IN_PROGRESS", false, "The group is rebalancing; rejoin the group (JoinGroup) to take part in the new generation."),
    ("INVALID_COMMIT_OFFSET_SIZE", false, "The offset commit's data size is not valid."),
    ("TOPIC_AUTHORIZATION_FAILED", false, "The client's principal is not allowed to use this topic; grant it the needed ACLs."),
    ("GROUP_AUTHORIZATION_FAILED", false, "The client's principal is not allowed to use this group; grant it READ (and DESCRIBE) ACLs on the group id."),
    ("CLUSTER_AUTHORIZATION_FAILED", false, "The client's principal is not allowed to perform this cluster operation; grant it the needed ACLs."),
    ("INVALID_TIMESTAMP", false, "A message timestamp is outside the accepted range."),
    ("UNSUPPORTED_SASL_MECHANISM", false, "The broker does not support the requested SASL mechanism; pick one it enables."),
    ("ILLEGAL_SASL_STATE", false, "The request is not valid in the current SASL state."),
    ("UNSUPPORTED_VERSION", false, "The broker does not support this version of the request; negotiate versions with ApiVersions first (for ApiVersions itself, retry with the highest version the broker listed)."),
    ("TOPIC_ALREADY_EXISTS", false, "A topic with this name already exists."),
    ("INVALID_PARTITIONS", false, "The number of partitions is invalid (below 1)."),
    ("INVALID_REPLICATION_FACTOR", false, "The replication factor is below 1 or larger than the number of brokers."),
    ("INVALID_REPLICA_ASSIGNMENT", false, "The replica assignment is invalid."),
    ("INVALID_CONFIG", false, "A configuration value in the request is invalid."),
    ("NOT_CONTROLLER", true, "This broker is not the controller; refresh metadata and retry."),
    ("INVALID_REQUEST", false, "The broker could not parse the request or found it malformed; see the broker's logs (this usually means a client bug or an incompatible broker)."),
    ("UNSUPPORTED_FOR_MESSAGE_FORMAT", false, "The broker's message format version does not support the request."),
    ("POLICY_VIOLATION", false, "The request violates a policy configured on the broker."),
    ("OUT_OF_ORDER_SEQUENCE_NUMBER", false, "The broker received an out-of-order producer sequence number."),
    ("DUPLICATE_SEQUENCE_NUMBER", false, "The broker received a duplicate producer sequence number."),
    ("INVALID_PRODUCER_EPOCH", false, "The producer's epoch is stale."),
    ("INVALID_TXN_STATE", false, "The transactional operation is invalid in the current transaction state."),
    ("INVALID_PRODUCER_ID_MAPPING", false, "The producer id is not assigned to this transactional id."),
    ("INVALID_TRANSACTION_TIMEOUT", false, "The transaction timeout exceeds transaction.max.timeout.ms."),
    ("CONCURRENT_TRANSACTIONS", false, "Another operation on the same transaction is in progress."),
    ("TRANSACTION_COORDINATOR_FENCED", false, "The transaction coordinator sending the marker is no longer current."),
    ("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", false, "The principal is not allowed to use this transactional id; grant it the needed ACLs."),
    ("SECURITY_DISABLED", false, "Security features are disabled on the broker."),
    ("OPERATION_NOT_ATTEMPTED", false, "The broker did not attempt this part of a batched request because another part failed; fix the other error."),
    ("KAFKA_STORAGE_ERROR", true, "The broker hit a disk error; retry, and check the broker's disks if it persists."),
    ("LOG_DIR_NOT_FOUND", false, "The requested log directory is not configured on the broker."),
    ("SASL_AUTHENTICATION_FAILED", false, "SASL authentication failed; check the credentials and mechanism."),
    ("UNKNOWN_PRODUCER_ID", false, "The broker has no state for this producer id."),
    ("REASSIGNMENT_IN_PROGRESS", false, "A partition reassignment is in progress."),
    ("DELEGATION_TOKEN_AUTH_DISABLED", false, "Delegation tokens are not enabled on the broker."),
    ("DELEGATION_TOKEN_NOT_FOUND", false, "The delegation token was not found."),
    ("DELEGATION_TOKEN_OWNER_MISMATCH", false, "The principal is not the token's owner or renewer."),
    ("DELEGATION_TOKEN_REQUEST_NOT_ALLOWED", false, "Delegation token requests are not allowed on this channel."),
    ("DELEGATION_TOKEN_AUTHORIZATION_FAILED", false, "Delegation token authorization failed."),
    ("DELEGATION_TOKEN_EXPIRED", false, "The delegation token has expired; obtain a new one."),
    ("INVALID_PRINCIPAL_TYPE", false, "The principal type is not supported."),
    ("NON_EMPTY_GROUP", false, "The group still has members, so it cannot be deleted."),
    ("GROUP_ID_NOT_FOUND", false, "The group does not exist."),
    ("FETCH_SESSION_ID_NOT_FOUND", true, "The fetch session was not found; retry with a new session."),
    ("INVALID_FETCH_SESSION_EPOCH", true, "The fetch session epoch is invalid; retry with a new session."),
    ("LISTENER_NOT_FOUND", true, "The leader has no listener matching the one the metadata request came in on; check the brokers' listener configuration."),
    ("TOPIC_DELETION_DISABLED", false, "Topic deletion is disabled on the broker."),
    ("FENCED_LEADER_EPOCH", true, "The request's leader epoch is older than the broker's; refresh metadata and retry."),
    ("UNKNOWN_LEADER_EPOCH", true, "The request's leader epoch is newer than the broker's; retry after a short backoff."),
    ("UNSUPPORTED_COMPRESSION_TYPE", false, "The client does not support the partition's compression type."),
    ("STALE_BROKER_EPOCH", false, "The broker epoch has changed."),
    ("OFFSET_NOT_AVAILABLE", true, "The leader's high watermark has not caught up after an election; retry after a short backoff."),
    ("MEMBER_ID_REQUIRED", false, "The coordinator assigned this member an id (KIP-394); send JoinGroup again at once with the member id from this response."),
    ("PREFERRED_LEADER_NOT_AVAILABLE", true, "The preferred leader is not available; retry later."),
    ("GROUP_MAX_SIZE_REACHED", false, "The group already has group.max.size members; stop some waiters or raise group.max.size on the brokers."),
    ("FENCED_INSTANCE_ID", false, "Another process joined with the same group instance id and replaced this member; give each process its own instance id (or none), and treat the lock as lost."),
    ("ELIGIBLE_LEADERS_NOT_AVAILABLE", true, "No eligible leader is available for the partition; retry later."),
    ("ELECTION_NOT_NEEDED", true, "No leader election was needed for the partition."),
    ("NO_REASSIGNMENT_IN_PROGRESS", false, "No partition reassignment is in progress."),
    ("GROUP_SUBSCRIBED_TO_TOPIC", false, "Offsets of a topic cannot be deleted while the group is subscribed to it."),
    ("INVALID_RECORD", false, "The broker rejected a record that failed validation."),
    ("UNSTABLE_OFFSET_COMMIT", true, "There are pending transactional offsets for the partition; retry after they are resolved."),
    ("THROTTLING_QUOTA_EXCEEDED", true, "A throttling quota was exceeded; retry after the throttle time."),
    ("PRODUCER_FENCED", false, "A newer producer with the same transactional id fenced this one."),
    ("RESOURCE_NOT_FOUND", false, "The request referred to a resource that does not exist."),
    ("DUPLICATE_RESOURCE", false, "The request referred to the same resource twice."),
    ("UNACCEPTABLE_CREDENTIAL", false, "The requested credential does not meet the acceptability criteria."),
    ("INCONSISTENT_VOTER_SET", false, "The sender or recipient of a voter-only request is not an expected voter."),
    ("INVALID_UPDATE_VERSION", false, "The given update version is invalid."),
    ("FEATURE_UPDATE_FAILED", false, "Finalized features could not be updated because of a broker error."),
    ("PRINCIPAL_DESERIALIZATION_FAILURE", false, "The request principal could not be deserialized during forwarding; check the cluster's security setup."),
    ("SNAPSHOT_NOT_FOUND", false, "The requested snapshot was not found."),
    ("POSITION_OUT_OF_RANGE", false, "The requested snapshot position is out of range."),
    ("UNKNOWN_TOPIC_ID", true, "The broker does not host this topic id; refresh metadata and retry."),
    ("DUPLICATE_BROKER_REGISTRATION", false, "This broker id is already registered."),
    ("BROKER_ID_NOT_REGISTERED", false, "The broker id is not registered."),
    ("INCONSISTENT_TOPIC_ID", true, "The log's topic id does not match the request's; refresh metadata and retry."),
    ("INCONSISTENT_CLUSTER_ID", false, "The request's cluster id does not match the broker's; check that the client points at the right cluster."),
    ("TRANSACTIONAL_ID_NOT_FOUND", false, "The transactional id was not found."),
    ("FETCH_SESSION_TOPIC_ID_ERROR", true, "The fetch session used topic ids inconsistently; retry with a new session."),
    ("INELIGIBLE_REPLICA", false, "The new ISR contains an ineligible replica."),
    ("NEW_LEADER_ELECTED", false, "The partition state was updated but the leader changed."),
    ("OFFSET_MOVED_TO_TIERED_STORAGE", false, "The requested offset has moved to tiered storage."),
    ("FENCED_MEMBER_EPOCH", false, "The member epoch was fenced by the group coordinator (KIP-848 groups); the member must rejoin."),
    ("UNRELEASED_INSTANCE_ID", false, "The instance id is still used by another member, which must leave first."),
    ("UNSUPPORTED_ASSIGNOR", false, "The assignor or its version range is not supported by the group."),
    ("STALE_MEMBER_EPOCH", false, "The member epoch is stale (KIP-848 groups)."),
    ("MISMATCHED_ENDPOINT_TYPE", false, "The request was sent to an endpoint of the wrong type (broker vs controller); check the bootstrap addresses."),
    ("UNSUPPORTED_ENDPOINT_TYPE", false, "This endpoint type is not supported yet."),
    ("UNKNOWN_CONTROLLER_ID", false, "The controller id is not known."),
    ("UNKNOWN_SUBSCRIPTION_ID", false, "The telemetry subscription id is invalid or outdated."),
    ("TELEMETRY_TOO_LARGE", false, "The telemetry push is larger than the broker accepts."),
    ("INVALID_REGISTRATION", false, "The controller considers the broker registration invalid."),
    ("TRANSACTION_ABORTABLE", false, "The transaction hit an error; abort it to continue using the transactional id."),
    ("INVALID_RECORD_STATE", false, "The record state is invalid; the delivery acknowledgement could not be completed."),
    ("SHARE_SESSION_NOT_FOUND", true, "The share session was not found; retry with a new session."),
    ("INVALID_SHARE_SESSION_EPOCH", true, "The share session epoch is invalid; retry with a new session."),
    ("FENCED_STATE_EPOCH", false, "The share coordinator rejected the request because the share-group state epoch did not match."),
    ("INVALID_VOTER_KEY", false, "The voter key does not match the receiving replica's key."),
    ("DUPLICATE_VOTER", false, "The voter is already part of the voter set."),
    ("VOTER_NOT_FOUND", false, "The voter is not part of the voter set."),
    ("INVALID_REGULAR_EXPRESSION", false, "The regular expression is not valid."),
    ("REBOOTSTRAP_REQUIRED", false, "The client's metadata is stale; reconnect through the bootstrap servers."),
    ("STREAMS_INVALID_TOPOLOGY", false, "The supplied Streams topology is invalid."),
    ("STREAMS_INVALID_TOPOLOGY_EPOCH", false, "The supplied Streams topology epoch is invalid."),
    ("STREAMS_TOPOLOGY_FENCED", false, "The supplied Streams topology epoch is outdated."),
    ("SHARE_SESSION_LIMIT_REACHED", true, "The broker's limit of share sessions has been reached; retry later."),
];

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::error::ResponseError;

    fn screaming_snake(camel: &str) -> String {
        let mut out = String::new();
        for (i, c) in camel.chars().enumerate() {
            if c.is_ascii_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_uppercase());
        }
        out
    }

    #[test]
    fn table_matches_kafka_protocol_names_and_retriability() {
        for code in i16::MIN..=i16::MAX {
            let ours = KafkaCode(code);
            match ResponseError::try_from_code(code) {
                None => assert!(ours.is_ok() && ours.name() == "NONE"),
                Some(ResponseError::Unknown(_)) => {
                    assert!(
                        !ours.is_known(),
                        "{code} known to us but not to kafka-protocol"
                    );
                    assert!(!ours.is_retriable());
                    assert_eq!(ours.name(), "UNKNOWN_CODE");
                }
                Some(theirs) => {
                    assert!(ours.is_known(), "{code} ({theirs}) missing from our table");
                    assert_eq!(
                        ours.name(),
                        screaming_snake(&theirs.to_string()),
                        "code {code}"
                    );
                    assert_eq!(ours.is_retriable(), theirs.is_retriable(), "code {code}");
                }
            }
        }
    }

    #[test]
    fn every_known_code_has_a_sentence() {
        for (i, (name, _, desc)) in CODES.iter().enumerate() {
            assert!(!name.is_empty() && desc.ends_with('.'), "index {i}");
            assert!(desc.len() > 10, "index {i}");
        }
    }

    #[test]
    fn unknown_codes_are_fatal_and_never_panic() {
        for code in [i16::MIN, -2, 134, 1000, i16::MAX] {
            let c = KafkaCode::from_code(code);
            assert!(!c.is_retriable());
            assert!(!c.is_ok());
            assert_eq!(c.name(), "UNKNOWN_CODE");
            let shown = c.to_string();
            assert!(
                shown.starts_with(&format!("UNKNOWN_CODE_{code} ({code}): ")),
                "{shown}"
            );
        }
    }

    #[test]
    fn group_codes_read_well() {
        let c = KafkaCode::REBALANCE_IN_PROGRESS;
        assert_eq!(c.name(), "REBALANCE_IN_PROGRESS");
        assert!(!c.is_retriable());
        assert!(c.to_string().starts_with("REBALANCE_IN_PROGRESS (27): "));
        for (code, name, retriable) in [
            (14, "COORDINATOR_LOAD_IN_PROGRESS", true),
            (15, "COORDINATOR_NOT_AVAILABLE", true),
            (16, "NOT_COORDINATOR", true),
            (22, "ILLEGAL_GENERATION", false),
            (23, "INCONSISTENT_GROUP_PROTOCOL", false),
            (24, "INVALID_GROUP_ID", false),
            (25, "UNKNOWN_MEMBER_ID", false),
            (26, "INVALID_SESSION_TIMEOUT", false),
            (30, "GROUP_AUTHORIZATION_FAILED", false),
            (35, "UNSUPPORTED_VERSION", false),
            (79, "MEMBER_ID_REQUIRED", false),
            (81, "GROUP_MAX_SIZE_REACHED", false),
            (82, "FENCED_INSTANCE_ID", false),
        ] {
            let c = KafkaCode(code);
            assert_eq!((c.name(), c.is_retriable()), (name, retriable));
        }
        assert!(KafkaCode::NONE.is_ok());
    }
}

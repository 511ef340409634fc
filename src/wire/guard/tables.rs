//! The schema tables: every response the guard scans, described once per struct with the versions
//! each field appears in, in the order kafka-protocol's generated decoders
//! (`src/messages/*_response.rs`) read them. `tests.rs` proves them equal to those decoders.
//!
//! `schema!` states each struct as kafka-protocol names it (the name labels scan errors, the
//! type gives the `size_of` the memory bound charges per array element), then its fields as
//! `name: Type [versions]` and its known tagged fields as `tag => name: Type [versions]`.
//! Versions are written as Rust ranges: `[0..]` for "every version", `[5..]`, `[8..=9]`.

use std::mem::size_of;

use kafka_protocol::messages::{
    api_versions_response, describe_configs_response, describe_groups_response, fetch_response,
    find_coordinator_response, heartbeat_response, join_group_response, leave_group_response,
    list_offsets_response, metadata_response, offset_commit_response, offset_fetch_response,
    produce_response, sasl_authenticate_response, sasl_handshake_response, sync_group_response,
    ApiKey,
};

/// The wire type of a field. Nullability is not tracked: a null has the same layout as an empty
/// value's prefix, and kafka-protocol itself rejects a null where none is allowed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ty {
    Bool,
    Int8,
    Int16,
    Int32,
    Int64,
    Uuid,
    /// `STRING` (i16 length) or, in flexible versions, `COMPACT_STRING`.
    Str,
    /// `BYTES` (i32 length) or, in flexible versions, `COMPACT_BYTES`. Record sets too: the
    /// records of a Fetch response are opaque bytes to kafka-protocol and to the guard alike
    /// (`wire::records` reads them, with its own bounds).
    Blob,
    /// An array of int32.
    Int32Array,
    /// An array of `STRING` (`COMPACT_STRING` in flexible versions).
    StrArray,
    /// An array of structs.
    Array(&'static StructSchema),
    /// A struct embedded in its parent; in our responses only ever as a tagged field.
    Struct(&'static StructSchema),
}

#[derive(Debug)]
pub(crate) struct Field {
    pub(crate) name: &'static str,
    pub(crate) ty: Ty,
    pub(crate) min: i16,
    pub(crate) max: i16,
}

#[derive(Debug)]
pub(crate) struct TaggedField {
    pub(crate) tag: u32,
    pub(crate) name: &'static str,
    pub(crate) ty: Ty,
    /// Versions in which kafka-protocol decodes the tag as this field; at other versions the
    /// tag is unknown to the scan (kafka-protocol rejects some of those, a typed error either way).
    pub(crate) min: i16,
    pub(crate) max: i16,
}

#[derive(Debug)]
pub(crate) struct StructSchema {
    pub(crate) name: &'static str,
    /// `size_of` the Rust type kafka-protocol decodes this struct into.
    pub(crate) mem: usize,
    pub(crate) fields: &'static [Field],
    /// Known tagged fields (flexible versions only).
    pub(crate) tagged: &'static [TaggedField],
}

#[derive(Debug)]
pub(crate) struct MessageSchema {
    pub(crate) api: ApiKey,
    pub(crate) min: i16,
    pub(crate) max: i16,
    /// First flexible version.
    pub(crate) flexible: i16,
    pub(crate) root: &'static StructSchema,
}

/// The open end of a version range.
pub(crate) const ANY: i16 = i16::MAX;

impl Field {
    #[inline(always)]
    pub(crate) fn present(&self, version: i16) -> bool {
        self.min <= version && version <= self.max
    }
}

impl TaggedField {
    pub(crate) fn present(&self, version: i16) -> bool {
        self.min <= version && version <= self.max
    }
}

macro_rules! versions {
    ($min:literal ..) => {
        ($min, ANY)
    };
    ($min:literal ..= $max:literal) => {
        ($min, $max)
    };
}

macro_rules! ty {
    (Array $s:ident) => {
        Ty::Array(&$s)
    };
    (Struct $s:ident) => {
        Ty::Struct(&$s)
    };
    ($t:ident) => {
        Ty::$t
    };
}

macro_rules! schema {
    ($(
        static $id:ident = $module:ident :: $ty:ident {
            $($field:ident: $fty:ident $(($fel:ident))? [$($fv:tt)+]),* $(,)?
        } $(tagged {
            $($tag:literal => $tname:ident: $tty:ident $(($tel:ident))? [$($tv:tt)+]),* $(,)?
        })?
    )*) => {$(
        pub(crate) static $id: StructSchema = StructSchema {
            name: stringify!($ty),
            mem: size_of::<$module::$ty>(),
            fields: &[$({
                let (min, max) = versions!($($fv)+);
                Field { name: stringify!($field), ty: ty!($fty $($fel)?), min, max }
            }),*],
            tagged: &[$($({
                let (min, max) = versions!($($tv)+);
                TaggedField { tag: $tag, name: stringify!($tname), ty: ty!($tty $($tel)?), min, max }
            }),*)?],
        };
    )*};
}

schema! {
    static API_VERSION = api_versions_response::ApiVersion {
        api_key: Int16 [0..],
        min_version: Int16 [0..],
        max_version: Int16 [0..],
    }
    static SUPPORTED_FEATURE_KEY = api_versions_response::SupportedFeatureKey {
        name: Str [3..],
        min_version: Int16 [3..],
        max_version: Int16 [3..],
    }
    static FINALIZED_FEATURE_KEY = api_versions_response::FinalizedFeatureKey {
        name: Str [3..],
        max_version_level: Int16 [3..],
        min_version_level: Int16 [3..],
    }
    static API_VERSIONS_RESPONSE = api_versions_response::ApiVersionsResponse {
        error_code: Int16 [0..],
        api_keys: Array(API_VERSION) [0..],
        throttle_time_ms: Int32 [1..],
    } tagged {
        0 => supported_features: Array(SUPPORTED_FEATURE_KEY) [3..],
        1 => finalized_features_epoch: Int64 [3..],
        2 => finalized_features: Array(FINALIZED_FEATURE_KEY) [3..],
        3 => zk_migration_ready: Bool [3..],
    }
}

schema! {
    static METADATA_BROKER = metadata_response::MetadataResponseBroker {
        node_id: Int32 [0..],
        host: Str [0..],
        port: Int32 [0..],
        rack: Str [1..],
    }
    static METADATA_PARTITION = metadata_response::MetadataResponsePartition {
        error_code: Int16 [0..],
        partition_index: Int32 [0..],
        leader_id: Int32 [0..],
        leader_epoch: Int32 [7..],
        replica_nodes: Int32Array [0..],
        isr_nodes: Int32Array [0..],
        offline_replicas: Int32Array [5..],
    }
    static METADATA_TOPIC = metadata_response::MetadataResponseTopic {
        error_code: Int16 [0..],
        name: Str [0..],
        topic_id: Uuid [10..],
        is_internal: Bool [1..],
        partitions: Array(METADATA_PARTITION) [0..],
        topic_authorized_operations: Int32 [8..],
    }
    static METADATA_RESPONSE = metadata_response::MetadataResponse {
        throttle_time_ms: Int32 [3..],
        brokers: Array(METADATA_BROKER) [0..],
        cluster_id: Str [2..],
        controller_id: Int32 [1..],
        topics: Array(METADATA_TOPIC) [0..],
        cluster_authorized_operations: Int32 [8..=10],
        error_code: Int16 [13..],
    }
}

schema! {
    static COORDINATOR = find_coordinator_response::Coordinator {
        key: Str [4..],
        node_id: Int32 [4..],
        host: Str [4..],
        port: Int32 [4..],
        error_code: Int16 [4..],
        error_message: Str [4..],
    }
    static FIND_COORDINATOR_RESPONSE = find_coordinator_response::FindCoordinatorResponse {
        throttle_time_ms: Int32 [1..],
        error_code: Int16 [0..=3],
        error_message: Str [1..=3],
        node_id: Int32 [0..=3],
        host: Str [0..=3],
        port: Int32 [0..=3],
        coordinators: Array(COORDINATOR) [4..],
    }
}

schema! {
    static JOIN_GROUP_MEMBER = join_group_response::JoinGroupResponseMember {
        member_id: Str [0..],
        group_instance_id: Str [5..],
        metadata: Blob [0..],
    }
    static JOIN_GROUP_RESPONSE = join_group_response::JoinGroupResponse {
        throttle_time_ms: Int32 [2..],
        error_code: Int16 [0..],
        generation_id: Int32 [0..],
        protocol_type: Str [7..],
        protocol_name: Str [0..],
        leader: Str [0..],
        skip_assignment: Bool [9..],
        member_id: Str [0..],
        members: Array(JOIN_GROUP_MEMBER) [0..],
    }
}

schema! {
    static SYNC_GROUP_RESPONSE = sync_group_response::SyncGroupResponse {
        throttle_time_ms: Int32 [1..],
        error_code: Int16 [0..],
        protocol_type: Str [5..],
        protocol_name: Str [5..],
        assignment: Blob [0..],
    }
    static HEARTBEAT_RESPONSE = heartbeat_response::HeartbeatResponse {
        throttle_time_ms: Int32 [1..],
        error_code: Int16 [0..],
    }
}

schema! {
    static SASL_HANDSHAKE_RESPONSE = sasl_handshake_response::SaslHandshakeResponse {
        error_code: Int16 [0..],
        mechanisms: StrArray [0..],
    }
    static SASL_AUTHENTICATE_RESPONSE = sasl_authenticate_response::SaslAuthenticateResponse {
        error_code: Int16 [0..],
        error_message: Str [0..],
        auth_bytes: Blob [0..],
        session_lifetime_ms: Int64 [1..],
    }
}

schema! {
    static LEAVE_GROUP_MEMBER = leave_group_response::MemberResponse {
        member_id: Str [3..],
        group_instance_id: Str [3..],
        error_code: Int16 [3..],
    }
    static LEAVE_GROUP_RESPONSE = leave_group_response::LeaveGroupResponse {
        throttle_time_ms: Int32 [1..],
        error_code: Int16 [0..],
        members: Array(LEAVE_GROUP_MEMBER) [3..],
    }
}

schema! {
    static DESCRIBED_GROUP_MEMBER = describe_groups_response::DescribedGroupMember {
        member_id: Str [0..],
        group_instance_id: Str [4..],
        client_id: Str [0..],
        client_host: Str [0..],
        member_metadata: Blob [0..],
        member_assignment: Blob [0..],
    }
    static DESCRIBED_GROUP = describe_groups_response::DescribedGroup {
        error_code: Int16 [0..],
        error_message: Str [6..],
        group_id: Str [0..],
        group_state: Str [0..],
        protocol_type: Str [0..],
        protocol_data: Str [0..],
        members: Array(DESCRIBED_GROUP_MEMBER) [0..],
        authorized_operations: Int32 [3..],
    }
    static DESCRIBE_GROUPS_RESPONSE = describe_groups_response::DescribeGroupsResponse {
        throttle_time_ms: Int32 [1..],
        groups: Array(DESCRIBED_GROUP) [0..],
    }
}

schema! {
    static OFFSET_COMMIT_PARTITION = offset_commit_response::OffsetCommitResponsePartition {
        partition_index: Int32 [0..],
        error_code: Int16 [0..],
    }
    static OFFSET_COMMIT_TOPIC = offset_commit_response::OffsetCommitResponseTopic {
        name: Str [0..=9],
        topic_id: Uuid [10..],
        partitions: Array(OFFSET_COMMIT_PARTITION) [0..],
    }
    static OFFSET_COMMIT_RESPONSE = offset_commit_response::OffsetCommitResponse {
        throttle_time_ms: Int32 [3..],
        topics: Array(OFFSET_COMMIT_TOPIC) [0..],
    }
}

// OffsetFetch has two layouts: v1-7 answer one group (topics at the top level), v8+ answer a
// batch of groups; kafka-protocol keeps them as distinct types.
schema! {
    static OFFSET_FETCH_PARTITION = offset_fetch_response::OffsetFetchResponsePartition {
        partition_index: Int32 [0..=7],
        committed_offset: Int64 [0..=7],
        committed_leader_epoch: Int32 [5..=7],
        metadata: Str [0..=7],
        error_code: Int16 [0..=7],
    }
    static OFFSET_FETCH_TOPIC = offset_fetch_response::OffsetFetchResponseTopic {
        name: Str [0..=7],
        partitions: Array(OFFSET_FETCH_PARTITION) [0..=7],
    }
    static OFFSET_FETCH_PARTITIONS = offset_fetch_response::OffsetFetchResponsePartitions {
        partition_index: Int32 [8..],
        committed_offset: Int64 [8..],
        committed_leader_epoch: Int32 [8..],
        metadata: Str [8..],
        error_code: Int16 [8..],
    }
    static OFFSET_FETCH_TOPICS = offset_fetch_response::OffsetFetchResponseTopics {
        name: Str [8..=9],
        topic_id: Uuid [10..],
        partitions: Array(OFFSET_FETCH_PARTITIONS) [8..],
    }
    static OFFSET_FETCH_GROUP = offset_fetch_response::OffsetFetchResponseGroup {
        group_id: Str [8..],
        topics: Array(OFFSET_FETCH_TOPICS) [8..],
        error_code: Int16 [8..],
    }
    static OFFSET_FETCH_RESPONSE = offset_fetch_response::OffsetFetchResponse {
        throttle_time_ms: Int32 [3..],
        topics: Array(OFFSET_FETCH_TOPIC) [0..=7],
        error_code: Int16 [2..=7],
        groups: Array(OFFSET_FETCH_GROUP) [8..],
    }
}

// Produce v13 and Fetch v13+ name topics by id instead of by name (KIP-516). The leader hints of
// KIP-951 are tagged fields, decoded by kafka-protocol only from the version that introduced them.
schema! {
    static PRODUCE_RECORD_ERROR = produce_response::BatchIndexAndErrorMessage {
        batch_index: Int32 [8..],
        batch_index_error_message: Str [8..],
    }
    static PRODUCE_LEADER = produce_response::LeaderIdAndEpoch {
        leader_id: Int32 [10..],
        leader_epoch: Int32 [10..],
    }
    static PRODUCE_PARTITION = produce_response::PartitionProduceResponse {
        index: Int32 [0..],
        error_code: Int16 [0..],
        base_offset: Int64 [0..],
        log_append_time_ms: Int64 [0..],
        log_start_offset: Int64 [5..],
        record_errors: Array(PRODUCE_RECORD_ERROR) [8..],
        error_message: Str [8..],
    } tagged {
        0 => current_leader: Struct(PRODUCE_LEADER) [10..],
    }
    static PRODUCE_TOPIC = produce_response::TopicProduceResponse {
        name: Str [0..=12],
        topic_id: Uuid [13..],
        partition_responses: Array(PRODUCE_PARTITION) [0..],
    }
    static PRODUCE_NODE_ENDPOINT = produce_response::NodeEndpoint {
        node_id: Int32 [10..],
        host: Str [10..],
        port: Int32 [10..],
        rack: Str [10..],
    }
    static PRODUCE_RESPONSE = produce_response::ProduceResponse {
        responses: Array(PRODUCE_TOPIC) [0..],
        throttle_time_ms: Int32 [0..],
    } tagged {
        0 => node_endpoints: Array(PRODUCE_NODE_ENDPOINT) [10..],
    }
}

schema! {
    static FETCH_ABORTED_TRANSACTION = fetch_response::AbortedTransaction {
        producer_id: Int64 [0..],
        first_offset: Int64 [0..],
    }
    static FETCH_DIVERGING_EPOCH = fetch_response::EpochEndOffset {
        epoch: Int32 [12..],
        end_offset: Int64 [12..],
    }
    static FETCH_LEADER = fetch_response::LeaderIdAndEpoch {
        leader_id: Int32 [12..],
        leader_epoch: Int32 [12..],
    }
    static FETCH_SNAPSHOT_ID = fetch_response::SnapshotId {
        end_offset: Int64 [0..],
        epoch: Int32 [0..],
    }
    static FETCH_PARTITION = fetch_response::PartitionData {
        partition_index: Int32 [0..],
        error_code: Int16 [0..],
        high_watermark: Int64 [0..],
        last_stable_offset: Int64 [0..],
        log_start_offset: Int64 [5..],
        aborted_transactions: Array(FETCH_ABORTED_TRANSACTION) [0..],
        preferred_read_replica: Int32 [11..],
        records: Blob [0..],
    } tagged {
        0 => diverging_epoch: Struct(FETCH_DIVERGING_EPOCH) [12..],
        1 => current_leader: Struct(FETCH_LEADER) [12..],
        2 => snapshot_id: Struct(FETCH_SNAPSHOT_ID) [12..],
    }
    static FETCH_TOPIC = fetch_response::FetchableTopicResponse {
        topic: Str [0..=12],
        topic_id: Uuid [13..],
        partitions: Array(FETCH_PARTITION) [0..],
    }
    static FETCH_NODE_ENDPOINT = fetch_response::NodeEndpoint {
        node_id: Int32 [16..],
        host: Str [16..],
        port: Int32 [16..],
        rack: Str [16..],
    }
    static FETCH_RESPONSE = fetch_response::FetchResponse {
        throttle_time_ms: Int32 [0..],
        error_code: Int16 [7..],
        session_id: Int32 [7..],
        responses: Array(FETCH_TOPIC) [0..],
    } tagged {
        0 => node_endpoints: Array(FETCH_NODE_ENDPOINT) [16..],
    }
}

// ListOffsets finds a partition's first or next offset (the ledger's readers start there); v1 is
// kafka-protocol's first version and Apache Kafka 4's (KIP-896 removed v0).
schema! {
    static LIST_OFFSETS_PARTITION = list_offsets_response::ListOffsetsPartitionResponse {
        partition_index: Int32 [0..],
        error_code: Int16 [0..],
        timestamp: Int64 [0..],
        offset: Int64 [0..],
        leader_epoch: Int32 [4..],
    }
    static LIST_OFFSETS_TOPIC = list_offsets_response::ListOffsetsTopicResponse {
        name: Str [0..],
        partitions: Array(LIST_OFFSETS_PARTITION) [0..],
    }
    static LIST_OFFSETS_RESPONSE = list_offsets_response::ListOffsetsResponse {
        throttle_time_ms: Int32 [2..],
        topics: Array(LIST_OFFSETS_TOPIC) [0..],
    }
}

// DescribeConfigs reads the ledger topic's compression.type at start (a recompressing topic is
// refused); v1 is kafka-protocol's first version.
schema! {
    static DESCRIBE_CONFIGS_SYNONYM = describe_configs_response::DescribeConfigsSynonym {
        name: Str [0..],
        value: Str [0..],
        source: Int8 [0..],
    }
    static DESCRIBE_CONFIGS_ENTRY = describe_configs_response::DescribeConfigsResourceResult {
        name: Str [0..],
        value: Str [0..],
        read_only: Bool [0..],
        config_source: Int8 [0..],
        is_sensitive: Bool [0..],
        synonyms: Array(DESCRIBE_CONFIGS_SYNONYM) [0..],
        config_type: Int8 [3..],
        documentation: Str [3..],
    }
    static DESCRIBE_CONFIGS_RESULT = describe_configs_response::DescribeConfigsResult {
        error_code: Int16 [0..],
        error_message: Str [0..],
        resource_type: Int8 [0..],
        resource_name: Str [0..],
        configs: Array(DESCRIBE_CONFIGS_ENTRY) [0..],
    }
    static DESCRIBE_CONFIGS_RESPONSE = describe_configs_response::DescribeConfigsResponse {
        throttle_time_ms: Int32 [0..],
        results: Array(DESCRIBE_CONFIGS_RESULT) [0..],
    }
}

const fn message(
    api: ApiKey,
    (min, max): (i16, i16),
    flexible: i16,
    root: &'static StructSchema,
) -> MessageSchema {
    MessageSchema {
        api,
        min,
        max,
        flexible,
        root,
    }
}

/// Every response the guard covers, with the versions its tables describe. These ranges are
/// exactly kafka-protocol 0.18's for these messages (and, for Produce and Fetch, exactly what
/// Apache Kafka 4.1 advertises).
pub(crate) static MESSAGES: [MessageSchema; 16] = [
    message(ApiKey::ApiVersions, (0, 4), 3, &API_VERSIONS_RESPONSE),
    message(ApiKey::Metadata, (0, 13), 9, &METADATA_RESPONSE),
    message(
        ApiKey::FindCoordinator,
        (0, 6),
        3,
        &FIND_COORDINATOR_RESPONSE,
    ),
    message(ApiKey::JoinGroup, (0, 9), 6, &JOIN_GROUP_RESPONSE),
    message(ApiKey::SyncGroup, (0, 5), 4, &SYNC_GROUP_RESPONSE),
    message(ApiKey::Heartbeat, (0, 4), 4, &HEARTBEAT_RESPONSE),
    message(ApiKey::LeaveGroup, (0, 5), 4, &LEAVE_GROUP_RESPONSE),
    message(ApiKey::DescribeGroups, (0, 6), 5, &DESCRIBE_GROUPS_RESPONSE),
    message(ApiKey::OffsetCommit, (2, 10), 8, &OFFSET_COMMIT_RESPONSE),
    message(ApiKey::OffsetFetch, (1, 10), 6, &OFFSET_FETCH_RESPONSE),
    message(ApiKey::Produce, (3, 13), 9, &PRODUCE_RESPONSE),
    message(ApiKey::Fetch, (4, 18), 12, &FETCH_RESPONSE),
    message(ApiKey::ListOffsets, (1, 10), 6, &LIST_OFFSETS_RESPONSE),
    message(
        ApiKey::DescribeConfigs,
        (1, 4),
        4,
        &DESCRIBE_CONFIGS_RESPONSE,
    ),
    // SaslHandshake has no flexible version.
    message(ApiKey::SaslHandshake, (0, 1), ANY, &SASL_HANDSHAKE_RESPONSE),
    message(
        ApiKey::SaslAuthenticate,
        (0, 2),
        2,
        &SASL_AUTHENTICATE_RESPONSE,
    ),
];

/// [`MESSAGES`]' index per API key, for a lookup that costs one load on every decode.
static INDEX: [u8; 128] = {
    let mut index = [u8::MAX; 128];
    let mut i = 0;
    while i < MESSAGES.len() {
        index[MESSAGES[i].api as i16 as usize] = i as u8;
        i += 1;
    }
    index
};

#[inline]
pub(crate) fn message_index(api: ApiKey) -> Option<usize> {
    match INDEX.get(api as i16 as usize) {
        Some(&i) if i != u8::MAX => Some(usize::from(i)),
        _ => None,
    }
}

pub(crate) fn schema(api: ApiKey) -> Option<&'static MessageSchema> {
    message_index(api).map(|i| &MESSAGES[i])
}

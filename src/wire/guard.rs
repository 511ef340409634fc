//! Bounded decoding: a pre-scan that every response body passes before kafka-protocol decodes it.
//!
//! # The problem
//!
//! kafka-protocol 0.18 decodes an array by reading its element count from the wire and calling
//! `Vec::with_capacity(count)` before it reads a single element (`src/protocol/types.rs`, the
//! `Array` and `CompactArray` decoders). A response of a dozen bytes can claim 2^31 elements of a
//! 100-byte struct; the allocation fails and the allocator *aborts the process*, which no
//! `catch_unwind` can stop. Byte and string decoders that copy into a `Vec<u8>` do the same with a
//! length prefix. A lock client that any broker (or anything answering on its port) can kill with one
//! packet is not acceptable.
//!
//! # The design
//!
//! Before kafka-protocol sees a body, [`scan_response`] walks it with a small interpreter driven by a
//! static description of every response we decode: for each API, the fields of each struct with
//! the versions they appear in, the version from which the message is "flexible" (compact lengths
//! and a tagged-field section at the end of every struct, KIP-482), and the known tagged fields
//! with their types. The tables were written from kafka-protocol's generated decoders
//! (`src/messages/*_response.rs`) and are checked against them by a test that generates random
//! valid bodies from the tables for every (API, version) we support, decodes them with
//! kafka-protocol, re-encodes them, and requires identical bytes and an exact scan.
//!
//! The scan allocates nothing and rejects, with a typed [`Malformation`]:
//! - any read past the end (truncation);
//! - a negative length other than -1 (null) for strings, bytes and arrays;
//! - any array whose count exceeds *remaining bytes / minimal encoded size of one element* (the
//!   minimal size is computed from the table for that version, at least 1 byte), so a count can
//!   never promise more elements than the bytes could hold;
//! - unsigned varints longer than 5 bytes or with bits beyond 32;
//! - more tagged fields than the remaining bytes could hold, and known tagged fields whose
//!   declared size differs from what their value occupies (kafka-protocol decodes known tags by type
//!   and ignores the size, so a lying size would desynchronise it);
//! - bytes left over after the body ([`DecodeError::TrailingBytes`]).
//!
//! Only bodies that pass are handed to kafka-protocol, whose decoders then follow exactly the path
//! the scan took.
//!
//! **Messages without arrays skip the scan** when decoded through
//! [`decode_response`](super::codec::decode_response) (Heartbeat, SyncGroup, LeaveGroup v0–2,
//! FindCoordinator v0–3: [`needs_scan`] says which). There kafka-protocol's own decoder is already
//! bounded: its only input-sized allocations are string and byte fields, which it takes with
//! `try_get_bytes` after checking that the bytes are present, and unknown tagged fields, at most
//! about 100 bytes of `BTreeMap` each for at least 2 input bytes. Skipping the scan keeps the
//! guard's cost near zero on the hottest responses (see BENCHMARKS.md). Malformed bodies of these
//! messages are then reported as [`DecodeError::Protocol`] rather than [`DecodeError::Malformed`];
//! [`scan_response`] itself always scans.
//!
//! # The bounds
//!
//! *Time:* every step of the scan consumes at least one byte, except array elements whose minimal
//! size is 0 (none of ours), which are bounded by the remaining bytes anyway, so the scan is linear
//! in the input. The table's nesting is at most three structs deep, so the scan's recursion depth
//! is fixed by the tables, never by the input. kafka-protocol's decode after a successful scan is
//! linear too (plus UTF-8 checks, also linear).
//!
//! *Memory:* the scan also adds up what the decode will allocate: `count × size_of::<Element>()`
//! for every array (the tables carry the real `size_of` of kafka-protocol's types), the length
//! plus [`ALLOCATION_OVERHEAD`] for every string or byte field (decoding from a `&[u8]` copies
//! each), and [`UNKNOWN_TAG_COST`] for every unknown tagged field (each lands in a `BTreeMap`).
//! A body whose total exceeds [`MAX_AMPLIFICATION`] × its length + [`AMPLIFICATION_SLACK`] is
//! rejected. A test proves the ratio for every struct at every version is at most
//! [`MAX_AMPLIFICATION`] / 2 (the worst is 32: an OffsetCommit or OffsetFetch v8–9 topic with an
//! empty name and no partitions, then 31 for a DescribeGroups member whose strings are all empty),
//! so only bodies padded with many unknown tagged fields can ever hit the budget. Because a
//! body never exceeds the frame limit, a decoded response never occupies more than about
//! 64 × the frame limit, and in practice far less.
//!
//! # What cannot be reached
//!
//! None of the responses we decode contains a record batch, so kafka-protocol's record decoder
//! (which also pre-allocates from wire counts) and its decompressors are never called: the crate is
//! built without any compression feature, and `src/records.rs` is not on any path from these
//! decoders. The response header (v0/v1) is parsed here, not by kafka-protocol.

use std::mem::size_of;
use std::sync::OnceLock;

use kafka_protocol::messages::{
    api_versions_response, describe_groups_response, find_coordinator_response,
    join_group_response, leave_group_response, metadata_response, offset_commit_response,
    offset_fetch_response, ApiKey,
};

use super::codec::DecodeError;

/// Largest allowed ratio between the heap a decode may use and the body's length.
pub const MAX_AMPLIFICATION: usize = 64;
/// Fixed allowance on top of the proportional budget, so that small bodies with a few unknown
/// tagged fields are not rejected.
pub const AMPLIFICATION_SLACK: usize = 64 * 1024;
/// What one unknown tagged field is charged (a `BTreeMap` leaf node of `i32` keys and `Bytes`
/// values is about 400 bytes).
pub const UNKNOWN_TAG_COST: usize = 512;
/// What one separate heap allocation is charged on top of its size.
pub const ALLOCATION_OVERHEAD: usize = 32;

/// Why the scan rejected a body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Malformation {
    /// The body ends in the middle of a field.
    #[error("truncated: {needed} more bytes needed, {available} left")]
    Truncated {
        /// Bytes the field needs.
        needed: usize,
        /// Bytes left in the body (or in the enclosing tagged field).
        available: usize,
    },
    /// A length prefix below -1.
    #[error("invalid length {length}")]
    NegativeLength {
        /// The length as read.
        length: i64,
    },
    /// An array count that the remaining bytes cannot hold.
    #[error(
        "array claims {count} elements of at least {min_size} bytes each, but only {available} bytes are left"
    )]
    ArrayTooLong {
        /// The count as read.
        count: u64,
        /// Smallest encoding of one element at this version.
        min_size: usize,
        /// Bytes left.
        available: usize,
    },
    /// An unsigned varint longer than 5 bytes or larger than `u32::MAX`.
    #[error("malformed varint")]
    BadVarint,
    /// More tagged fields than the remaining bytes can hold.
    #[error("{count} tagged fields cannot fit in the {available} bytes left")]
    TooManyTaggedFields {
        /// The count as read.
        count: u64,
        /// Bytes left.
        available: usize,
    },
    /// A known tagged field whose value does not fill exactly its declared size.
    #[error("tagged field {tag} declares {declared} bytes but its value occupies {actual}")]
    TaggedFieldSize {
        /// The tag.
        tag: u32,
        /// The size the field declared.
        declared: usize,
        /// The size its value occupied.
        actual: usize,
    },
    /// Decoding would allocate more than the amplification budget allows.
    #[error(
        "decoding would allocate about {estimate} bytes, more than the {budget} bytes allowed for a {input}-byte body"
    )]
    MemoryBudget {
        /// Estimated heap use of the decoded value.
        estimate: usize,
        /// The budget for this body.
        budget: usize,
        /// The body's length.
        input: usize,
    },
}

/// Where in the body the scan stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// Byte offset into the body.
    pub offset: usize,
    /// The struct being read, as kafka-protocol names it, e.g. `JoinGroupResponseMember`.
    pub structure: &'static str,
    /// The field being read, e.g. `metadata`, or `_tagged_fields`.
    pub field: &'static str,
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}.{} at byte {}",
            self.structure, self.field, self.offset
        )
    }
}

/// What a successful scan found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    /// Bytes the body occupies (always the whole input when returned by [`scan_response`]).
    pub consumed: usize,
    /// Estimated heap bytes the decoded value will use (see the module docs).
    pub heap_estimate: usize,
    /// Non-empty string and byte fields: the allocations a decode from a `&[u8]` makes for them
    /// (a decode from [`Bytes`](bytes::Bytes) shares the input instead).
    pub allocations: usize,
}

// ---------------------------------------------------------------------------------------------
// Schema tables.

/// The wire type of a field. Nullability is not tracked: a null has the same layout as an empty
/// value's prefix, and kafka-protocol itself rejects a null where none is allowed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ty {
    Bool,
    Int16,
    Int32,
    Int64,
    Uuid,
    /// `STRING` (i16 length) or, in flexible versions, `COMPACT_STRING`.
    Str,
    /// `BYTES` (i32 length) or, in flexible versions, `COMPACT_BYTES`.
    Blob,
    /// An array of int32.
    Int32Array,
    /// An array of structs.
    Array(&'static StructSchema),
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

const ANY: i16 = i16::MAX;

const fn f(name: &'static str, ty: Ty, min: i16, max: i16) -> Field {
    Field { name, ty, min, max }
}

impl Field {
    #[inline(always)]
    fn present(&self, version: i16) -> bool {
        self.min <= version && version <= self.max
    }
}

use Ty::*;

static API_VERSION: StructSchema = StructSchema {
    name: "ApiVersion",
    mem: size_of::<api_versions_response::ApiVersion>(),
    fields: &[
        f("api_key", Int16, 0, ANY),
        f("min_version", Int16, 0, ANY),
        f("max_version", Int16, 0, ANY),
    ],
    tagged: &[],
};
static SUPPORTED_FEATURE_KEY: StructSchema = StructSchema {
    name: "SupportedFeatureKey",
    mem: size_of::<api_versions_response::SupportedFeatureKey>(),
    fields: &[
        f("name", Str, 3, ANY),
        f("min_version", Int16, 3, ANY),
        f("max_version", Int16, 3, ANY),
    ],
    tagged: &[],
};
static FINALIZED_FEATURE_KEY: StructSchema = StructSchema {
    name: "FinalizedFeatureKey",
    mem: size_of::<api_versions_response::FinalizedFeatureKey>(),
    fields: &[
        f("name", Str, 3, ANY),
        f("max_version_level", Int16, 3, ANY),
        f("min_version_level", Int16, 3, ANY),
    ],
    tagged: &[],
};
static API_VERSIONS_RESPONSE: StructSchema = StructSchema {
    name: "ApiVersionsResponse",
    mem: 0,
    fields: &[
        f("error_code", Int16, 0, ANY),
        f("api_keys", Array(&API_VERSION), 0, ANY),
        f("throttle_time_ms", Int32, 1, ANY),
    ],
    tagged: &[
        TaggedField {
            tag: 0,
            name: "supported_features",
            ty: Array(&SUPPORTED_FEATURE_KEY),
        },
        TaggedField {
            tag: 1,
            name: "finalized_features_epoch",
            ty: Int64,
        },
        TaggedField {
            tag: 2,
            name: "finalized_features",
            ty: Array(&FINALIZED_FEATURE_KEY),
        },
        TaggedField {
            tag: 3,
            name: "zk_migration_ready",
            ty: Bool,
        },
    ],
};

static METADATA_BROKER: StructSchema = StructSchema {
    name: "MetadataResponseBroker",
    mem: size_of::<metadata_response::MetadataResponseBroker>(),
    fields: &[
        f("node_id", Int32, 0, ANY),
        f("host", Str, 0, ANY),
        f("port", Int32, 0, ANY),
        f("rack", Str, 1, ANY),
    ],
    tagged: &[],
};
static METADATA_PARTITION: StructSchema = StructSchema {
    name: "MetadataResponsePartition",
    mem: size_of::<metadata_response::MetadataResponsePartition>(),
    fields: &[
        f("error_code", Int16, 0, ANY),
        f("partition_index", Int32, 0, ANY),
        f("leader_id", Int32, 0, ANY),
        f("leader_epoch", Int32, 7, ANY),
        f("replica_nodes", Int32Array, 0, ANY),
        f("isr_nodes", Int32Array, 0, ANY),
        f("offline_replicas", Int32Array, 5, ANY),
    ],
    tagged: &[],
};
static METADATA_TOPIC: StructSchema = StructSchema {
    name: "MetadataResponseTopic",
    mem: size_of::<metadata_response::MetadataResponseTopic>(),
    fields: &[
        f("error_code", Int16, 0, ANY),
        f("name", Str, 0, ANY),
        f("topic_id", Uuid, 10, ANY),
        f("is_internal", Bool, 1, ANY),
        f("partitions", Array(&METADATA_PARTITION), 0, ANY),
        f("topic_authorized_operations", Int32, 8, ANY),
    ],
    tagged: &[],
};
static METADATA_RESPONSE: StructSchema = StructSchema {
    name: "MetadataResponse",
    mem: 0,
    fields: &[
        f("throttle_time_ms", Int32, 3, ANY),
        f("brokers", Array(&METADATA_BROKER), 0, ANY),
        f("cluster_id", Str, 2, ANY),
        f("controller_id", Int32, 1, ANY),
        f("topics", Array(&METADATA_TOPIC), 0, ANY),
        f("cluster_authorized_operations", Int32, 8, 10),
        f("error_code", Int16, 13, ANY),
    ],
    tagged: &[],
};

static COORDINATOR: StructSchema = StructSchema {
    name: "Coordinator",
    mem: size_of::<find_coordinator_response::Coordinator>(),
    fields: &[
        f("key", Str, 4, ANY),
        f("node_id", Int32, 4, ANY),
        f("host", Str, 4, ANY),
        f("port", Int32, 4, ANY),
        f("error_code", Int16, 4, ANY),
        f("error_message", Str, 4, ANY),
    ],
    tagged: &[],
};
static FIND_COORDINATOR_RESPONSE: StructSchema = StructSchema {
    name: "FindCoordinatorResponse",
    mem: 0,
    fields: &[
        f("throttle_time_ms", Int32, 1, ANY),
        f("error_code", Int16, 0, 3),
        f("error_message", Str, 1, 3),
        f("node_id", Int32, 0, 3),
        f("host", Str, 0, 3),
        f("port", Int32, 0, 3),
        f("coordinators", Array(&COORDINATOR), 4, ANY),
    ],
    tagged: &[],
};

static JOIN_GROUP_MEMBER: StructSchema = StructSchema {
    name: "JoinGroupResponseMember",
    mem: size_of::<join_group_response::JoinGroupResponseMember>(),
    fields: &[
        f("member_id", Str, 0, ANY),
        f("group_instance_id", Str, 5, ANY),
        f("metadata", Blob, 0, ANY),
    ],
    tagged: &[],
};
static JOIN_GROUP_RESPONSE: StructSchema = StructSchema {
    name: "JoinGroupResponse",
    mem: 0,
    fields: &[
        f("throttle_time_ms", Int32, 2, ANY),
        f("error_code", Int16, 0, ANY),
        f("generation_id", Int32, 0, ANY),
        f("protocol_type", Str, 7, ANY),
        f("protocol_name", Str, 0, ANY),
        f("leader", Str, 0, ANY),
        f("skip_assignment", Bool, 9, ANY),
        f("member_id", Str, 0, ANY),
        f("members", Array(&JOIN_GROUP_MEMBER), 0, ANY),
    ],
    tagged: &[],
};

static SYNC_GROUP_RESPONSE: StructSchema = StructSchema {
    name: "SyncGroupResponse",
    mem: 0,
    fields: &[
        f("throttle_time_ms", Int32, 1, ANY),
        f("error_code", Int16, 0, ANY),
        f("protocol_type", Str, 5, ANY),
        f("protocol_name", Str, 5, ANY),
        f("assignment", Blob, 0, ANY),
    ],
    tagged: &[],
};

static HEARTBEAT_RESPONSE: StructSchema = StructSchema {
    name: "HeartbeatResponse",
    mem: 0,
    fields: &[
        f("throttle_time_ms", Int32, 1, ANY),
        f("error_code", Int16, 0, ANY),
    ],
    tagged: &[],
};

static LEAVE_GROUP_MEMBER: StructSchema = StructSchema {
    name: "MemberResponse",
    mem: size_of::<leave_group_response::MemberResponse>(),
    fields: &[
        f("member_id", Str, 3, ANY),
        f("group_instance_id", Str, 3, ANY),
        f("error_code", Int16, 3, ANY),
    ],
    tagged: &[],
};
static LEAVE_GROUP_RESPONSE: StructSchema = StructSchema {
    name: "LeaveGroupResponse",
    mem: 0,
    fields: &[
        f("throttle_time_ms", Int32, 1, ANY),
        f("error_code", Int16, 0, ANY),
        f("members", Array(&LEAVE_GROUP_MEMBER), 3, ANY),
    ],
    tagged: &[],
};

static DESCRIBED_GROUP_MEMBER: StructSchema = StructSchema {
    name: "DescribedGroupMember",
    mem: size_of::<describe_groups_response::DescribedGroupMember>(),
    fields: &[
        f("member_id", Str, 0, ANY),
        f("group_instance_id", Str, 4, ANY),
        f("client_id", Str, 0, ANY),
        f("client_host", Str, 0, ANY),
        f("member_metadata", Blob, 0, ANY),
        f("member_assignment", Blob, 0, ANY),
    ],
    tagged: &[],
};
static DESCRIBED_GROUP: StructSchema = StructSchema {
    name: "DescribedGroup",
    mem: size_of::<describe_groups_response::DescribedGroup>(),
    fields: &[
        f("error_code", Int16, 0, ANY),
        f("error_message", Str, 6, ANY),
        f("group_id", Str, 0, ANY),
        f("group_state", Str, 0, ANY),
        f("protocol_type", Str, 0, ANY),
        f("protocol_data", Str, 0, ANY),
        f("members", Array(&DESCRIBED_GROUP_MEMBER), 0, ANY),
        f("authorized_operations", Int32, 3, ANY),
    ],
    tagged: &[],
};
static DESCRIBE_GROUPS_RESPONSE: StructSchema = StructSchema {
    name: "DescribeGroupsResponse",
    mem: 0,
    fields: &[
        f("throttle_time_ms", Int32, 1, ANY),
        f("groups", Array(&DESCRIBED_GROUP), 0, ANY),
    ],
    tagged: &[],
};

static OFFSET_COMMIT_PARTITION: StructSchema = StructSchema {
    name: "OffsetCommitResponsePartition",
    mem: size_of::<offset_commit_response::OffsetCommitResponsePartition>(),
    fields: &[
        f("partition_index", Int32, 0, ANY),
        f("error_code", Int16, 0, ANY),
    ],
    tagged: &[],
};
static OFFSET_COMMIT_TOPIC: StructSchema = StructSchema {
    name: "OffsetCommitResponseTopic",
    mem: size_of::<offset_commit_response::OffsetCommitResponseTopic>(),
    fields: &[
        f("name", Str, 0, 9),
        f("topic_id", Uuid, 10, ANY),
        f("partitions", Array(&OFFSET_COMMIT_PARTITION), 0, ANY),
    ],
    tagged: &[],
};
static OFFSET_COMMIT_RESPONSE: StructSchema = StructSchema {
    name: "OffsetCommitResponse",
    mem: 0,
    fields: &[
        f("throttle_time_ms", Int32, 3, ANY),
        f("topics", Array(&OFFSET_COMMIT_TOPIC), 0, ANY),
    ],
    tagged: &[],
};

// OffsetFetch has two layouts: v1-7 answer one group (topics at the top level), v8+ answer a
// batch of groups; kafka-protocol keeps them as distinct types.
static OFFSET_FETCH_PARTITION: StructSchema = StructSchema {
    name: "OffsetFetchResponsePartition",
    mem: size_of::<offset_fetch_response::OffsetFetchResponsePartition>(),
    fields: &[
        f("partition_index", Int32, 0, 7),
        f("committed_offset", Int64, 0, 7),
        f("committed_leader_epoch", Int32, 5, 7),
        f("metadata", Str, 0, 7),
        f("error_code", Int16, 0, 7),
    ],
    tagged: &[],
};
static OFFSET_FETCH_TOPIC: StructSchema = StructSchema {
    name: "OffsetFetchResponseTopic",
    mem: size_of::<offset_fetch_response::OffsetFetchResponseTopic>(),
    fields: &[
        f("name", Str, 0, 7),
        f("partitions", Array(&OFFSET_FETCH_PARTITION), 0, 7),
    ],
    tagged: &[],
};
static OFFSET_FETCH_PARTITIONS: StructSchema = StructSchema {
    name: "OffsetFetchResponsePartitions",
    mem: size_of::<offset_fetch_response::OffsetFetchResponsePartitions>(),
    fields: &[
        f("partition_index", Int32, 8, ANY),
        f("committed_offset", Int64, 8, ANY),
        f("committed_leader_epoch", Int32, 8, ANY),
        f("metadata", Str, 8, ANY),
        f("error_code", Int16, 8, ANY),
    ],
    tagged: &[],
};
static OFFSET_FETCH_TOPICS: StructSchema = StructSchema {
    name: "OffsetFetchResponseTopics",
    mem: size_of::<offset_fetch_response::OffsetFetchResponseTopics>(),
    fields: &[
        f("name", Str, 8, 9),
        f("topic_id", Uuid, 10, ANY),
        f("partitions", Array(&OFFSET_FETCH_PARTITIONS), 8, ANY),
    ],
    tagged: &[],
};
static OFFSET_FETCH_GROUP: StructSchema = StructSchema {
    name: "OffsetFetchResponseGroup",
    mem: size_of::<offset_fetch_response::OffsetFetchResponseGroup>(),
    fields: &[
        f("group_id", Str, 8, ANY),
        f("topics", Array(&OFFSET_FETCH_TOPICS), 8, ANY),
        f("error_code", Int16, 8, ANY),
    ],
    tagged: &[],
};
static OFFSET_FETCH_RESPONSE: StructSchema = StructSchema {
    name: "OffsetFetchResponse",
    mem: 0,
    fields: &[
        f("throttle_time_ms", Int32, 3, ANY),
        f("topics", Array(&OFFSET_FETCH_TOPIC), 0, 7),
        f("error_code", Int16, 2, 7),
        f("groups", Array(&OFFSET_FETCH_GROUP), 8, ANY),
    ],
    tagged: &[],
};

/// Every response the guard covers, with the versions its tables describe. These ranges are
/// exactly kafka-protocol 0.18's for these messages.
pub(crate) static MESSAGES: [MessageSchema; 10] = [
    MessageSchema {
        api: ApiKey::ApiVersions,
        min: 0,
        max: 4,
        flexible: 3,
        root: &API_VERSIONS_RESPONSE,
    },
    MessageSchema {
        api: ApiKey::Metadata,
        min: 0,
        max: 13,
        flexible: 9,
        root: &METADATA_RESPONSE,
    },
    MessageSchema {
        api: ApiKey::FindCoordinator,
        min: 0,
        max: 6,
        flexible: 3,
        root: &FIND_COORDINATOR_RESPONSE,
    },
    MessageSchema {
        api: ApiKey::JoinGroup,
        min: 0,
        max: 9,
        flexible: 6,
        root: &JOIN_GROUP_RESPONSE,
    },
    MessageSchema {
        api: ApiKey::SyncGroup,
        min: 0,
        max: 5,
        flexible: 4,
        root: &SYNC_GROUP_RESPONSE,
    },
    MessageSchema {
        api: ApiKey::Heartbeat,
        min: 0,
        max: 4,
        flexible: 4,
        root: &HEARTBEAT_RESPONSE,
    },
    MessageSchema {
        api: ApiKey::LeaveGroup,
        min: 0,
        max: 5,
        flexible: 4,
        root: &LEAVE_GROUP_RESPONSE,
    },
    MessageSchema {
        api: ApiKey::DescribeGroups,
        min: 0,
        max: 6,
        flexible: 5,
        root: &DESCRIBE_GROUPS_RESPONSE,
    },
    MessageSchema {
        api: ApiKey::OffsetCommit,
        min: 2,
        max: 10,
        flexible: 8,
        root: &OFFSET_COMMIT_RESPONSE,
    },
    MessageSchema {
        api: ApiKey::OffsetFetch,
        min: 1,
        max: 10,
        flexible: 6,
        root: &OFFSET_FETCH_RESPONSE,
    },
];

pub(crate) fn schema(api: ApiKey) -> Option<&'static MessageSchema> {
    MESSAGES.iter().find(|m| m.api == api)
}

/// The response versions the guard has tables for, per API.
pub fn covered_versions(api: ApiKey) -> Option<(i16, i16)> {
    schema(api).map(|m| (m.min, m.max))
}

/// Whether a body of `api` at `version` contains an array, so that kafka-protocol's decoder
/// would pre-allocate from a wire count and the scan must run first; `None` when the guard has
/// no table for the pair.
#[inline]
pub fn needs_scan(api: ApiKey, version: i16) -> Option<bool> {
    program(api, version).map(|p| p.needs_scan)
}

// ---------------------------------------------------------------------------------------------
// The scanner.
//
// The tables above are "compiled" once per (API, version) into a flat list of operations: fields
// absent at that version are dropped, classic or compact encodings are chosen, consecutive
// fixed-size fields are merged into one skip, and every array carries its element's minimal size
// and memory cost. Scanning a body is then a tight loop over that list, which is what keeps the
// guard's cost small next to kafka-protocol's own decoding (see BENCHMARKS.md).

/// One step of a compiled scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Fixed-size fields: skip this many bytes.
    Skip(u32),
    /// `n` consecutive `STRING` or `BYTES` fields (at most 8): bit `j` of `wide` set means the
    /// `j`-th has an i32 length (`BYTES`), clear an i16 length (`STRING`); -1 is null.
    Classic { n: u8, wide: u8 },
    /// `n` consecutive `COMPACT_STRING` or `COMPACT_BYTES` fields: unsigned varint length + 1,
    /// 0 for null.
    Compacts(u32),
    /// Array of int32.
    Int32s { compact: bool },
    /// Array of structs; the element's operations are the next `len` ones.
    Array {
        compact: bool,
        /// Minimal encoded size of one element (at least 1).
        min: u32,
        /// `size_of` one decoded element.
        mem: u32,
        len: u32,
    },
    /// A tagged-field section; `known` indexes [`Program::tag_sets`], `NO_KNOWN_TAGS` for none.
    Tags { known: u32 },
}

const NO_KNOWN_TAGS: u32 = u32::MAX;

/// Struct and field an operation reads, for error messages.
type Label = (&'static str, &'static str);

struct KnownTag {
    tag: u32,
    name: &'static str,
    ops: Vec<Op>,
    labels: Vec<Label>,
}

#[derive(Default)]
struct Program {
    ops: Vec<Op>,
    labels: Vec<Label>,
    tag_sets: Vec<Vec<KnownTag>>,
    /// Whether any operation, known tagged fields included, reads an array.
    needs_scan: bool,
    /// For messages made of fixed-size fields only (Heartbeat): their size, and whether a tagged
    /// section follows. Such a body is accepted with one length check when its tagged section
    /// is empty; anything else takes the full scan, which reports what is wrong.
    fixed: Option<(usize, bool)>,
}

fn min_size(ty: Ty, flexible: bool) -> usize {
    match ty {
        Bool => 1,
        Int16 => 2,
        Int32 => 4,
        Int64 => 8,
        Uuid => 16,
        Str if !flexible => 2,
        Blob | Int32Array | Array(_) if !flexible => 4,
        Str | Blob | Int32Array | Array(_) => 1,
    }
}

fn min_struct_size(s: &StructSchema, version: i16, flexible: bool) -> usize {
    let fields: usize = s
        .fields
        .iter()
        .filter(|f| f.present(version))
        .map(|f| min_size(f.ty, flexible))
        .sum();
    fields + usize::from(flexible)
}

struct Compiler<'p> {
    version: i16,
    flexible: bool,
    tag_sets: &'p mut Vec<Vec<KnownTag>>,
}

impl Compiler<'_> {
    fn structure(&mut self, s: &'static StructSchema, ops: &mut Vec<Op>, labels: &mut Vec<Label>) {
        // Index of a skip this struct emitted last, which the next fixed-size field may extend.
        let mut open_skip: Option<usize> = None;
        // Likewise for a run of string and byte fields, with the names of the fields in it.
        let mut open_run: Option<(usize, Vec<&'static str>)> = None;
        let version = self.version;
        for field in s.fields.iter().filter(|f| f.present(version)) {
            let label = (s.name, field.name);
            if matches!(field.ty, Str | Blob) {
                open_skip = None;
                let wide = matches!(field.ty, Blob);
                let last_index = ops.len().wrapping_sub(1);
                let extended = match (&mut open_run, ops.last_mut()) {
                    (Some((at, names)), Some(last)) if *at == last_index => match last {
                        Op::Compacts(n) => {
                            *n += 1;
                            names.push(field.name);
                            true
                        }
                        Op::Classic { n, wide: w } if *n < 8 => {
                            *w |= u8::from(wide) << *n;
                            *n += 1;
                            names.push(field.name);
                            true
                        }
                        _ => false,
                    },
                    _ => false,
                };
                if !extended {
                    close_run(&mut open_run, labels);
                    open_run = Some((ops.len(), vec![field.name]));
                    self.ty(field.ty, label, ops, labels);
                }
                continue;
            }
            close_run(&mut open_run, labels);
            match field.ty {
                Bool | Int16 | Int32 | Int64 | Uuid => {
                    let n = min_size(field.ty, self.flexible) as u32;
                    match open_skip {
                        Some(i) => {
                            if let Op::Skip(m) = &mut ops[i] {
                                *m += n;
                            }
                        }
                        None => {
                            open_skip = Some(ops.len());
                            ops.push(Op::Skip(n));
                            labels.push(label);
                        }
                    }
                }
                ty => {
                    open_skip = None;
                    self.ty(ty, label, ops, labels);
                }
            }
        }
        close_run(&mut open_run, labels);
        if self.flexible {
            let known = self.known_tags(s.tagged);
            ops.push(Op::Tags { known });
            labels.push((s.name, "_tagged_fields"));
        }
    }

    fn ty(&mut self, ty: Ty, label: Label, ops: &mut Vec<Op>, labels: &mut Vec<Label>) {
        let op = match ty {
            Bool | Int16 | Int32 | Int64 | Uuid => Op::Skip(min_size(ty, self.flexible) as u32),
            Str | Blob if self.flexible => Op::Compacts(1),
            Str => Op::Classic { n: 1, wide: 0 },
            Blob => Op::Classic { n: 1, wide: 1 },
            Int32Array => Op::Int32s {
                compact: self.flexible,
            },
            Array(elem) => {
                let at = ops.len();
                ops.push(Op::Skip(0));
                labels.push(label);
                self.structure(elem, ops, labels);
                ops[at] = Op::Array {
                    compact: self.flexible,
                    min: min_struct_size(elem, self.version, self.flexible).max(1) as u32,
                    mem: elem.mem as u32,
                    len: (ops.len() - at - 1) as u32,
                };
                return;
            }
        };
        ops.push(op);
        labels.push(label);
    }

    fn known_tags(&mut self, tagged: &'static [TaggedField]) -> u32 {
        if tagged.is_empty() {
            return NO_KNOWN_TAGS;
        }
        let mut set = Vec::new();
        for t in tagged {
            let (mut ops, mut labels) = (Vec::new(), Vec::new());
            self.ty(t.ty, ("", t.name), &mut ops, &mut labels);
            set.push(KnownTag {
                tag: t.tag,
                name: t.name,
                ops,
                labels,
            });
        }
        self.tag_sets.push(set);
        (self.tag_sets.len() - 1) as u32
    }
}

/// Ends a run of string fields: a run of several gets a label naming them all. The names are
/// leaked on purpose: programs are built once per process and live as long as it does.
fn close_run(open_run: &mut Option<(usize, Vec<&'static str>)>, labels: &mut [Label]) {
    if let Some((at, names)) = open_run.take() {
        if names.len() > 1 {
            if let Some(label) = labels.get_mut(at) {
                label.1 = Box::leak(names.join(" or ").into_boxed_str());
            }
        }
    }
}

fn compile(m: &'static MessageSchema, version: i16) -> Program {
    let mut program = Program::default();
    let (mut ops, mut labels) = (Vec::new(), Vec::new());
    let mut c = Compiler {
        version,
        flexible: version >= m.flexible,
        tag_sets: &mut program.tag_sets,
    };
    c.structure(m.root, &mut ops, &mut labels);
    program.fixed = match ops[..] {
        [Op::Skip(n)] => Some((n as usize, false)),
        [Op::Skip(n), Op::Tags {
            known: NO_KNOWN_TAGS,
        }] => Some((n as usize, true)),
        [Op::Tags {
            known: NO_KNOWN_TAGS,
        }] => Some((0, true)),
        _ => None,
    };
    let is_array = |op: &Op| matches!(op, Op::Array { .. } | Op::Int32s { .. });
    program.needs_scan = ops.iter().any(is_array)
        || program
            .tag_sets
            .iter()
            .flatten()
            .any(|k| k.ops.iter().any(is_array));
    program.ops = ops;
    program.labels = labels;
    program
}

/// Compiled programs, per entry of [`MESSAGES`], per version from its `min`.
fn programs() -> &'static [Vec<Program>] {
    static PROGRAMS: OnceLock<Vec<Vec<Program>>> = OnceLock::new();
    PROGRAMS.get_or_init(|| {
        MESSAGES
            .iter()
            .map(|m| (m.min..=m.max).map(|v| compile(m, v)).collect())
            .collect()
    })
}

#[inline]
fn program(api: ApiKey, version: i16) -> Option<&'static Program> {
    let i = message_index(api)?;
    let m = &MESSAGES[i];
    if m.min <= version && version <= m.max {
        programs()[i].get((version - m.min) as usize)
    } else {
        None
    }
}

#[inline]
fn message_index(api: ApiKey) -> Option<usize> {
    Some(match api {
        ApiKey::ApiVersions => 0,
        ApiKey::Metadata => 1,
        ApiKey::FindCoordinator => 2,
        ApiKey::JoinGroup => 3,
        ApiKey::SyncGroup => 4,
        ApiKey::Heartbeat => 5,
        ApiKey::LeaveGroup => 6,
        ApiKey::DescribeGroups => 7,
        ApiKey::OffsetCommit => 8,
        ApiKey::OffsetFetch => 9,
        _ => return None,
    })
}

/// Scans a response body of `api` at `version` and checks every bound listed in the module docs.
///
/// On success the whole body was consumed and kafka-protocol may decode it. Errors:
/// [`DecodeError::UnsupportedVersion`] when the guard has no table for (`api`, `version`),
/// [`DecodeError::Malformed`] for any rejected construct, [`DecodeError::TrailingBytes`] when
/// bytes are left after the body.
pub fn scan_response(api: ApiKey, version: i16, body: &[u8]) -> Result<Scan, DecodeError> {
    let Some(program) = program(api, version) else {
        return Err(DecodeError::UnsupportedVersion { api, version });
    };
    if let Some((n, tagged)) = program.fixed {
        let fits = if tagged {
            body.len() == n + 1 && body[n] == 0
        } else {
            body.len() == n
        };
        if fits {
            return Ok(Scan {
                consumed: body.len(),
                heap_estimate: body.len(),
                allocations: 0,
            });
        }
    }
    let mut s = Scanner::new(body);
    if s.run(program, &program.ops, &program.labels).is_err() {
        return Err(s.into_error(api, version));
    }
    if s.pos != body.len() {
        return Err(DecodeError::TrailingBytes {
            api,
            version,
            left: body.len() - s.pos,
        });
    }
    let heap_estimate = s.heap.saturating_add(body.len());
    let budget = body
        .len()
        .saturating_mul(MAX_AMPLIFICATION)
        .saturating_add(AMPLIFICATION_SLACK);
    if heap_estimate > budget {
        return Err(DecodeError::Malformed {
            api,
            version,
            at: Location {
                offset: s.pos,
                structure: program.labels.first().map_or("", |l| l.0),
                field: "",
            },
            reason: Malformation::MemoryBudget {
                estimate: heap_estimate,
                budget,
                input: body.len(),
            },
        });
    }
    Ok(Scan {
        consumed: s.pos,
        heap_estimate,
        allocations: s.allocations,
    })
}

/// Reads a response header (v0: correlation id; v1: correlation id and a tagged-field section)
/// and returns the correlation id and the header's length. Unknown header tags are skipped.
pub(crate) fn scan_response_header(
    frame: &[u8],
    header_version: i16,
) -> Result<(i32, usize), (Location, Malformation)> {
    static NONE: Program = Program {
        ops: Vec::new(),
        labels: Vec::new(),
        tag_sets: Vec::new(),
        needs_scan: false,
        fixed: None,
    };
    let mut s = Scanner::new(frame);
    let label = ("ResponseHeader", "correlation_id");
    let cid = match s.take_array::<4>() {
        Ok(b) => i32::from_be_bytes(b),
        Err(Stop) => {
            s.at.get_or_insert((label, s.pos));
            return Err(s.into_parts());
        }
    };
    if header_version >= 1 && s.tags(&NONE, NO_KNOWN_TAGS).is_err() {
        s.at.get_or_insert((("ResponseHeader", "_tagged_fields"), s.pos));
        return Err(s.into_parts());
    }
    Ok((cid, s.pos))
}

/// Signals that the scan stopped; the reason is in [`Scanner::error`]. A zero-sized error keeps
/// the hot path's results in registers.
struct Stop;

struct Scanner<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Exclusive end of the region being read: the body, or a known tagged field's value.
    end: usize,
    heap: usize,
    allocations: usize,
    error: Option<Malformation>,
    /// The innermost operation that failed, and the offset it started at.
    at: Option<(Label, usize)>,
}

impl<'a> Scanner<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Scanner {
            buf,
            pos: 0,
            end: buf.len(),
            heap: 0,
            allocations: 0,
            error: None,
            at: None,
        }
    }

    fn into_parts(self) -> (Location, Malformation) {
        let ((structure, field), offset) = self.at.unwrap_or((("", ""), self.pos));
        let reason = self.error.unwrap_or(Malformation::Truncated {
            needed: 0,
            available: 0,
        });
        (
            Location {
                offset,
                structure,
                field,
            },
            reason,
        )
    }

    fn into_error(self, api: ApiKey, version: i16) -> DecodeError {
        let (at, reason) = self.into_parts();
        DecodeError::Malformed {
            api,
            version,
            at,
            reason,
        }
    }

    #[cold]
    fn fail(&mut self, reason: Malformation) -> Stop {
        self.error = Some(reason);
        Stop
    }

    #[inline(always)]
    fn available(&self) -> usize {
        self.end - self.pos
    }

    #[inline(always)]
    fn skip(&mut self, n: usize) -> Result<(), Stop> {
        if n > self.available() {
            let available = self.available();
            return Err(self.fail(Malformation::Truncated {
                needed: n,
                available,
            }));
        }
        self.pos += n;
        Ok(())
    }

    #[inline(always)]
    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], Stop> {
        let start = self.pos;
        self.skip(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[start..start + N]);
        Ok(out)
    }

    /// Same value as kafka-protocol's `UnsignedVarInt` for every canonical encoding; rejects what
    /// it would silently truncate.
    #[inline(always)]
    fn uvarint(&mut self) -> Result<u32, Stop> {
        // Nearly every varint on these paths (lengths, counts, tag sections) is one byte.
        if self.pos < self.end {
            if let Some(&b) = self.buf.get(self.pos) {
                if b < 0x80 {
                    self.pos += 1;
                    return Ok(u32::from(b));
                }
            }
        }
        self.uvarint_slow()
    }

    fn uvarint_slow(&mut self) -> Result<u32, Stop> {
        let mut value: u32 = 0;
        for i in 0..5 {
            let [b] = self.take_array::<1>()?;
            if i == 4 && b > 0x0f {
                return Err(self.fail(Malformation::BadVarint));
            }
            value |= u32::from(b & 0x7f) << (i * 7);
            if b < 0x80 {
                return Ok(value);
            }
        }
        Err(self.fail(Malformation::BadVarint))
    }

    /// A classic length or count: -1 is null (`None`), below that is an error.
    #[inline(always)]
    fn classic(&mut self, n: i32) -> Result<Option<usize>, Stop> {
        match n {
            -1 => Ok(None),
            n if n >= 0 => Ok(Some(n as usize)),
            length => Err(self.fail(Malformation::NegativeLength {
                length: i64::from(length),
            })),
        }
    }

    /// A compact length or count: stored plus one, 0 is null.
    #[inline(always)]
    fn compact(&mut self) -> Result<Option<usize>, Stop> {
        Ok(match self.uvarint()? {
            0 => None,
            n => Some(n as usize - 1),
        })
    }

    #[inline(always)]
    fn count(&mut self, compact: bool) -> Result<Option<usize>, Stop> {
        if compact {
            self.compact()
        } else {
            let n = i32::from_be_bytes(self.take_array::<4>()?);
            self.classic(n)
        }
    }

    #[inline(always)]
    fn data(&mut self, len: Option<usize>) -> Result<(), Stop> {
        if let Some(len) = len {
            self.skip(len)?;
            if len > 0 {
                self.allocations += 1;
                self.charge(len.saturating_add(ALLOCATION_OVERHEAD));
            }
        }
        Ok(())
    }

    #[inline(always)]
    fn charge(&mut self, bytes: usize) {
        self.heap = self.heap.saturating_add(bytes);
    }

    /// Checks an array count against the bytes left.
    #[inline(always)]
    fn fits(&mut self, count: usize, min: usize) -> Result<(), Stop> {
        let available = self.available();
        if count > available / min {
            return Err(self.fail(Malformation::ArrayTooLong {
                count: count as u64,
                min_size: min,
                available,
            }));
        }
        Ok(())
    }

    fn run(
        &mut self,
        p: &'static Program,
        ops: &'static [Op],
        labels: &'static [Label],
    ) -> Result<(), Stop> {
        let mut i = 0;
        while let Some(&op) = ops.get(i) {
            let (at, start) = (i, self.pos);
            let step = match op {
                Op::Skip(n) => self.skip(n as usize),
                Op::Classic { n, wide } => self.classic_run(n, wide),
                Op::Compacts(n) => self.compact_run(n),
                Op::Int32s { compact } => self.count(compact).and_then(|count| match count {
                    Some(count) => {
                        self.fits(count, 4)?;
                        self.charge(count * 4);
                        self.skip(count * 4)
                    }
                    None => Ok(()),
                }),
                Op::Array {
                    compact,
                    min,
                    mem,
                    len,
                } => {
                    let body = i + 1..i + 1 + len as usize;
                    i += len as usize;
                    self.array(
                        p,
                        compact,
                        min as usize,
                        mem as usize,
                        &ops[body.clone()],
                        &labels[body],
                    )
                }
                // Almost every tagged section is empty: one zero byte, checked inline.
                Op::Tags { .. } if self.pos < self.end && self.buf.get(self.pos) == Some(&0) => {
                    self.pos += 1;
                    Ok(())
                }
                Op::Tags { known } => self.tags(p, known),
            };
            if step.is_err() {
                if self.at.is_none() {
                    self.at = labels.get(at).map(|&l| (l, start));
                }
                return step;
            }
            i += 1;
        }
        Ok(())
    }

    #[inline(always)]
    fn compact_run(&mut self, n: u32) -> Result<(), Stop> {
        for _ in 0..n {
            let len = self.compact()?;
            self.data(len)?;
        }
        Ok(())
    }

    #[inline(always)]
    fn classic_run(&mut self, n: u8, wide: u8) -> Result<(), Stop> {
        for j in 0..n {
            let len = if wide & (1 << j) != 0 {
                i32::from_be_bytes(self.take_array::<4>()?)
            } else {
                i32::from(i16::from_be_bytes(self.take_array::<2>()?))
            };
            let len = self.classic(len)?;
            self.data(len)?;
        }
        Ok(())
    }

    fn array(
        &mut self,
        p: &'static Program,
        compact: bool,
        min: usize,
        mem: usize,
        ops: &'static [Op],
        labels: &'static [Label],
    ) -> Result<(), Stop> {
        let Some(count) = self.count(compact)? else {
            return Ok(());
        };
        self.fits(count, min)?;
        self.charge(count.saturating_mul(mem));
        for _ in 0..count {
            self.run(p, ops, labels)?;
        }
        Ok(())
    }

    fn tags(&mut self, p: &'static Program, known: u32) -> Result<(), Stop> {
        let count = self.uvarint()? as usize;
        // Each tagged field needs at least a tag byte and a size byte.
        if count > self.available() / 2 {
            let available = self.available();
            return Err(self.fail(Malformation::TooManyTaggedFields {
                count: count as u64,
                available,
            }));
        }
        let set = p.tag_sets.get(known as usize).map_or(&[][..], |s| &s[..]);
        for _ in 0..count {
            let tag = self.uvarint()?;
            let size = self.uvarint()? as usize;
            if size > self.available() {
                let available = self.available();
                return Err(self.fail(Malformation::Truncated {
                    needed: size,
                    available,
                }));
            }
            match set.iter().find(|k| k.tag == tag) {
                None => {
                    self.pos += size;
                    self.charge(UNKNOWN_TAG_COST);
                }
                Some(k) => {
                    let (start, outer_end) = (self.pos, self.end);
                    self.end = start + size;
                    let scanned = self.run(p, &k.ops, &k.labels);
                    self.end = outer_end;
                    if scanned.is_err() {
                        if let Some(((s, f), _)) = &mut self.at {
                            if s.is_empty() {
                                *s = "tagged field";
                                *f = k.name;
                            }
                        }
                        return scanned;
                    }
                    if self.pos - start != size {
                        let actual = self.pos - start;
                        return Err(self.fail(Malformation::TaggedFieldSize {
                            tag,
                            declared: size,
                            actual,
                        }));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use bytes::Buf;
    use kafka_protocol::messages::{
        ApiVersionsResponse, DescribeGroupsResponse, FindCoordinatorResponse, HeartbeatResponse,
        JoinGroupResponse, LeaveGroupResponse, MetadataResponse, OffsetCommitResponse,
        OffsetFetchResponse, SyncGroupResponse,
    };
    use kafka_protocol::protocol::{Decodable, Encodable, Message};
    use proptest::prelude::*;

    /// A tiny deterministic generator so the schema test needs no extra dependency.
    pub(crate) struct Rng(pub(crate) u64);
    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        pub(crate) fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn put_uvarint(out: &mut Vec<u8>, mut v: u32) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    struct Gen<'r> {
        rng: &'r mut Rng,
        version: i16,
        flexible: bool,
        /// Maximum array length; shrinks with depth so bodies stay small.
        fanout: u64,
    }

    impl Gen<'_> {
        fn length(&mut self, out: &mut Vec<u8>, n: usize, classic_width: usize) {
            if self.flexible {
                put_uvarint(out, n as u32 + 1);
            } else if classic_width == 2 {
                out.extend_from_slice(&(n as i16).to_be_bytes());
            } else {
                out.extend_from_slice(&(n as i32).to_be_bytes());
            }
        }

        fn ty(&mut self, out: &mut Vec<u8>, ty: Ty, non_default: bool) {
            match ty {
                Bool => out.push(if non_default {
                    1
                } else {
                    self.rng.below(2) as u8
                }),
                Int16 => out.extend_from_slice(&(self.rng.next() as i16).to_be_bytes()),
                Int32 => out.extend_from_slice(&(self.rng.next() as i32).to_be_bytes()),
                Int64 => {
                    let mut v = self.rng.next() as i64;
                    if v == -1 {
                        v = 7;
                    }
                    out.extend_from_slice(&v.to_be_bytes())
                }
                Uuid => {
                    for _ in 0..16 {
                        out.push(self.rng.next() as u8);
                    }
                }
                Str => {
                    let n = self.rng.below(12) as usize;
                    self.length(out, n, 2);
                    for _ in 0..n {
                        out.push(b'a' + self.rng.below(26) as u8);
                    }
                }
                Blob => {
                    let n = self.rng.below(40) as usize;
                    self.length(out, n, 4);
                    for _ in 0..n {
                        out.push(self.rng.next() as u8);
                    }
                }
                Int32Array => {
                    let n = self.rng.below(5) as usize;
                    self.length(out, n, 4);
                    for _ in 0..n {
                        out.extend_from_slice(&(self.rng.next() as i32).to_be_bytes());
                    }
                }
                Array(s) => {
                    let n = self.rng.below(self.fanout + 1) as usize;
                    let n = if non_default { n.max(1) } else { n };
                    self.length(out, n, 4);
                    let saved = self.fanout;
                    self.fanout = (self.fanout / 2).max(1);
                    for _ in 0..n {
                        self.structure(out, s);
                    }
                    self.fanout = saved;
                }
            }
        }

        fn structure(&mut self, out: &mut Vec<u8>, s: &StructSchema) {
            let version = self.version;
            for field in s.fields.iter().filter(|f| f.present(version)) {
                self.ty(out, field.ty, false);
            }
            if !self.flexible {
                return;
            }
            // Known tags with values kafka-protocol re-encodes (non-default), unknown tags with
            // numbers above every known one, all ascending as its encoder writes them.
            let mut fields: Vec<(u32, Vec<u8>)> = Vec::new();
            for k in s.tagged {
                if self.rng.below(2) == 0 {
                    let mut v = Vec::new();
                    self.ty(&mut v, k.ty, true);
                    fields.push((k.tag, v));
                }
            }
            let mut next_unknown = s.tagged.iter().map(|k| k.tag + 1).max().unwrap_or(0);
            for _ in 0..self.rng.below(3) {
                next_unknown += 1 + self.rng.below(3) as u32;
                let v = (0..self.rng.below(6))
                    .map(|_| self.rng.next() as u8)
                    .collect();
                fields.push((next_unknown, v));
            }
            put_uvarint(out, fields.len() as u32);
            for (tag, v) in fields {
                put_uvarint(out, tag);
                put_uvarint(out, v.len() as u32);
                out.extend_from_slice(&v);
            }
        }
    }

    /// A random body, valid by the guard's tables, for `api` at `version`.
    pub(crate) fn generate(api: ApiKey, version: i16, seed: u64) -> Vec<u8> {
        let m = schema(api).expect("covered api");
        let mut rng = Rng(seed);
        let mut g = Gen {
            rng: &mut rng,
            version,
            flexible: version >= m.flexible,
            fanout: 4,
        };
        let mut out = Vec::new();
        g.structure(&mut out, m.root);
        out
    }

    /// Decodes with kafka-protocol, requires every byte consumed, re-encodes and returns the bytes.
    fn kp_round_trip(
        api: ApiKey,
        version: i16,
        body: &[u8],
    ) -> Result<Vec<u8>, std::string::String> {
        fn rt<T: Decodable + Encodable>(
            body: &[u8],
            version: i16,
        ) -> Result<Vec<u8>, std::string::String> {
            let mut buf = bytes::Bytes::copy_from_slice(body);
            let value = T::decode(&mut buf, version).map_err(|e| format!("decode: {e:#}"))?;
            if buf.has_remaining() {
                return Err(format!("kafka-protocol left {} bytes", buf.remaining()));
            }
            let mut out = bytes::BytesMut::new();
            value
                .encode(&mut out, version)
                .map_err(|e| format!("encode: {e:#}"))?;
            Ok(out.to_vec())
        }
        match api {
            ApiKey::ApiVersions => rt::<ApiVersionsResponse>(body, version),
            ApiKey::Metadata => rt::<MetadataResponse>(body, version),
            ApiKey::FindCoordinator => rt::<FindCoordinatorResponse>(body, version),
            ApiKey::JoinGroup => rt::<JoinGroupResponse>(body, version),
            ApiKey::SyncGroup => rt::<SyncGroupResponse>(body, version),
            ApiKey::Heartbeat => rt::<HeartbeatResponse>(body, version),
            ApiKey::LeaveGroup => rt::<LeaveGroupResponse>(body, version),
            ApiKey::DescribeGroups => rt::<DescribeGroupsResponse>(body, version),
            ApiKey::OffsetCommit => rt::<OffsetCommitResponse>(body, version),
            ApiKey::OffsetFetch => rt::<OffsetFetchResponse>(body, version),
            other => Err(format!("{other:?} not covered")),
        }
    }

    pub(crate) fn all_covered() -> impl Iterator<Item = (ApiKey, i16)> {
        MESSAGES
            .iter()
            .flat_map(|m| (m.min..=m.max).map(move |v| (m.api, v)))
    }

    #[test]
    fn version_ranges_are_kafka_protocols() {
        fn range<T: Message>() -> (i16, i16) {
            (T::VERSIONS.min, T::VERSIONS.max)
        }
        let expected = [
            (ApiKey::ApiVersions, range::<ApiVersionsResponse>()),
            (ApiKey::Metadata, range::<MetadataResponse>()),
            (ApiKey::FindCoordinator, range::<FindCoordinatorResponse>()),
            (ApiKey::JoinGroup, range::<JoinGroupResponse>()),
            (ApiKey::SyncGroup, range::<SyncGroupResponse>()),
            (ApiKey::Heartbeat, range::<HeartbeatResponse>()),
            (ApiKey::LeaveGroup, range::<LeaveGroupResponse>()),
            (ApiKey::DescribeGroups, range::<DescribeGroupsResponse>()),
            (ApiKey::OffsetCommit, range::<OffsetCommitResponse>()),
            (ApiKey::OffsetFetch, range::<OffsetFetchResponse>()),
        ];
        for (api, range) in expected {
            assert_eq!(covered_versions(api), Some(range), "{api:?}");
            let m = schema(api).unwrap();
            // The first flexible version is where the response header becomes v1 (except for
            // ApiVersions, whose response header is always v0).
            if api != ApiKey::ApiVersions {
                for v in m.min..=m.max {
                    assert_eq!(
                        api.response_header_version(v),
                        i16::from(v >= m.flexible),
                        "{api:?} v{v}"
                    );
                }
            }
        }
    }

    /// The central proof: bodies generated from our tables are exactly what kafka-protocol reads
    /// and writes, for every covered (API, version), in many shapes.
    #[test]
    fn tables_match_kafka_protocol_for_every_version() {
        for (api, version) in all_covered() {
            for seed in 0..200u64 {
                let body = generate(
                    api,
                    version,
                    seed ^ ((api as u64) << 32) ^ ((version as u64) << 48),
                );
                let scan = scan_response(api, version, &body).unwrap_or_else(|e| {
                    panic!("{api:?} v{version} seed {seed}: scan rejected: {e}")
                });
                assert_eq!(scan.consumed, body.len());
                let again = kp_round_trip(api, version, &body)
                    .unwrap_or_else(|e| panic!("{api:?} v{version} seed {seed}: {e}\n{body:?}"));
                assert_eq!(
                    again, body,
                    "{api:?} v{version} seed {seed}: re-encoding differs"
                );
            }
        }
    }

    #[test]
    fn default_values_encoded_by_kafka_protocol_scan_exactly() {
        fn enc<T: Default + Encodable>(version: i16) -> Vec<u8> {
            let mut out = bytes::BytesMut::new();
            T::default().encode(&mut out, version).unwrap();
            out.to_vec()
        }
        for (api, v) in all_covered() {
            let body = match api {
                ApiKey::ApiVersions => enc::<ApiVersionsResponse>(v),
                ApiKey::Metadata => enc::<MetadataResponse>(v),
                ApiKey::FindCoordinator => enc::<FindCoordinatorResponse>(v),
                ApiKey::JoinGroup => enc::<JoinGroupResponse>(v),
                ApiKey::SyncGroup => enc::<SyncGroupResponse>(v),
                ApiKey::Heartbeat => enc::<HeartbeatResponse>(v),
                ApiKey::LeaveGroup => enc::<LeaveGroupResponse>(v),
                ApiKey::DescribeGroups => enc::<DescribeGroupsResponse>(v),
                ApiKey::OffsetCommit => enc::<OffsetCommitResponse>(v),
                ApiKey::OffsetFetch => enc::<OffsetFetchResponse>(v),
                _ => unreachable!(),
            };
            assert_eq!(
                scan_response(api, v, &body).unwrap().consumed,
                body.len(),
                "{api:?} v{v}"
            );
        }
    }

    /// The amplification budget never rejects a body without unknown tagged fields: every struct,
    /// at every version it occurs in, costs at most half the budget per byte.
    #[test]
    fn amplification_of_every_struct_is_within_half_the_budget() {
        fn visit(
            s: &'static StructSchema,
            v: i16,
            flexible: bool,
            worst: &mut Vec<(&'static str, i16, usize)>,
        ) {
            let min = min_struct_size(s, v, flexible).max(1);
            worst.push((s.name, v, s.mem.div_ceil(min)));
            for f in s.fields.iter().filter(|f| f.present(v)) {
                if let Array(e) = f.ty {
                    visit(e, v, flexible, worst);
                }
            }
            for t in s.tagged.iter().filter(|_| flexible) {
                if let Array(e) = t.ty {
                    visit(e, v, flexible, worst);
                }
            }
        }
        let mut worst = Vec::new();
        for m in &MESSAGES {
            for v in m.min..=m.max {
                for f in m.root.fields.iter().filter(|f| f.present(v)) {
                    if let Array(e) = f.ty {
                        visit(e, v, v >= m.flexible, &mut worst);
                    }
                }
                for t in m.root.tagged.iter().filter(|_| v >= m.flexible) {
                    if let Array(e) = t.ty {
                        visit(e, v, v >= m.flexible, &mut worst);
                    }
                }
            }
        }
        worst.sort_by_key(|w| std::cmp::Reverse(w.2));
        // A non-empty string or byte field costs its length plus the overhead, and occupies at
        // least its length plus one byte of prefix: at worst (1 + overhead) per 2 input bytes.
        assert!((ALLOCATION_OVERHEAD + 1).div_ceil(2) <= MAX_AMPLIFICATION / 2);
        eprintln!(
            "worst structs (name, version, heap bytes per input byte): {:?}",
            &worst[..6]
        );
        assert!(
            worst[0].2 <= MAX_AMPLIFICATION / 2,
            "worst structs: {:?}",
            &worst[..5]
        );
    }

    #[test]
    fn compiled_programs_merge_fixed_fields_only_within_a_struct() {
        let heartbeat = &programs()[message_index(ApiKey::Heartbeat).unwrap()][4];
        assert_eq!(
            heartbeat.ops,
            [
                Op::Skip(6),
                Op::Tags {
                    known: NO_KNOWN_TAGS
                }
            ]
        );
        assert_eq!(heartbeat.fixed, Some((6, true)));
        let skipped: Vec<_> = all_covered()
            .filter(|&(api, v)| needs_scan(api, v) == Some(false))
            .collect();
        let mut expected: Vec<_> = (0..=4).map(|v| (ApiKey::Heartbeat, v)).collect();
        expected.extend((0..=5).map(|v| (ApiKey::SyncGroup, v)));
        expected.extend((0..=2).map(|v| (ApiKey::LeaveGroup, v)));
        expected.extend((0..=3).map(|v| (ApiKey::FindCoordinator, v)));
        expected.sort_by_key(|&(a, v)| (a as i16, v));
        let mut skipped = skipped;
        skipped.sort_by_key(|&(a, v)| (a as i16, v));
        assert_eq!(skipped, expected);
        assert_eq!(
            programs()[message_index(ApiKey::Heartbeat).unwrap()][0].fixed,
            Some((2, false))
        );
        assert_eq!(
            programs()[message_index(ApiKey::SyncGroup).unwrap()][0].fixed,
            None
        );
        // ApiVersions v1: error code, the api_keys array (each element three int16), throttle.
        let api_versions = &programs()[message_index(ApiKey::ApiVersions).unwrap()][1];
        assert!(
            matches!(
                api_versions.ops[..],
                [
                    Op::Skip(2),
                    Op::Array {
                        compact: false,
                        min: 6,
                        len: 1,
                        ..
                    },
                    Op::Skip(6),
                    Op::Skip(4)
                ]
            ),
            "{:?}",
            api_versions.ops
        );
        assert_eq!(api_versions.ops.len(), api_versions.labels.len());
        let join = &programs()[message_index(ApiKey::JoinGroup).unwrap()];
        assert!(
            matches!(
                join[9].ops[..],
                [
                    Op::Skip(10),
                    Op::Compacts(3),
                    Op::Skip(1),
                    Op::Compacts(1),
                    Op::Array { len: 2, .. },
                    Op::Compacts(3),
                    Op::Tags { .. },
                    Op::Tags { .. }
                ]
            ),
            "{:?}",
            join[9].ops
        );
        assert!(
            matches!(
                join[5].ops[..],
                [
                    Op::Skip(10),
                    Op::Classic { n: 3, wide: 0 },
                    Op::Array { len: 1, .. },
                    Op::Classic { n: 3, wide: 0b100 }
                ]
            ),
            "{:?}",
            join[5].ops
        );
        assert_eq!(
            join[5].labels[3],
            (
                "JoinGroupResponseMember",
                "member_id or group_instance_id or metadata"
            )
        );
        for (i, m) in MESSAGES.iter().enumerate() {
            assert_eq!(message_index(m.api), Some(i));
        }
    }

    #[test]
    fn huge_counts_in_a_few_bytes_are_rejected_before_any_allocation() {
        // JoinGroup v5: throttle, error, generation, 3 empty strings, then 2^31-1 members.
        let mut body = vec![0u8; 4 + 2 + 4];
        body.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        body.extend_from_slice(&i32::MAX.to_be_bytes());
        let err = scan_response(ApiKey::JoinGroup, 5, &body).unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::Malformed {
                    reason: Malformation::ArrayTooLong {
                        count: 0x7fff_ffff,
                        ..
                    },
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("JoinGroupResponse.members"),
            "{err}"
        );

        // Flexible (v9): compact count 2^32-2 via a maximal varint.
        let mut body = vec![0u8; 4 + 2 + 4];
        body.extend_from_slice(&[1, 1, 1, 0, 1]); // protocol_type, protocol_name, leader, skip, member_id
        body.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        let err = scan_response(ApiKey::JoinGroup, 9, &body).unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::Malformed {
                    reason: Malformation::ArrayTooLong { .. },
                    ..
                }
            ),
            "{err}"
        );

        // A nested array: Metadata v1, one broker-less, one topic whose partition claims 10^9
        // replica ids.
        let mut body = Vec::new();
        body.extend_from_slice(&0i32.to_be_bytes()); // brokers
        body.extend_from_slice(&0i32.to_be_bytes()); // controller
        body.extend_from_slice(&1i32.to_be_bytes()); // topics
        body.extend_from_slice(&[0, 0, 0, 0, 0]); // error, name "", internal
        body.extend_from_slice(&1i32.to_be_bytes()); // partitions
        body.extend_from_slice(&[0; 10]);
        body.extend_from_slice(&1_000_000_000i32.to_be_bytes());
        body.extend_from_slice(&0i32.to_be_bytes()); // isr_nodes
        let err = scan_response(ApiKey::Metadata, 1, &body).unwrap_err();
        assert!(err.to_string().contains("replica_nodes"), "{err}");

        // A byte field claiming 2 GiB.
        let mut body = vec![0, 0, 0, 0, 0, 0];
        body.extend_from_slice(&i32::MAX.to_be_bytes());
        let err = scan_response(ApiKey::SyncGroup, 1, &body).unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::Malformed {
                    reason: Malformation::Truncated { .. },
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn negative_lengths_and_bad_varints_are_rejected() {
        // SyncGroup v0: error code, then assignment length -2.
        let body = [0, 0, 0xff, 0xff, 0xff, 0xfe];
        let err = scan_response(ApiKey::SyncGroup, 0, &body).unwrap_err();
        assert!(matches!(
            err,
            DecodeError::Malformed {
                reason: Malformation::NegativeLength { length: -2 },
                ..
            }
        ));
        // Null is a layout the scan accepts (kafka-protocol decides whether it is allowed).
        let body = [0, 0, 0xff, 0xff, 0xff, 0xff];
        assert!(scan_response(ApiKey::SyncGroup, 0, &body).is_ok());
        // Heartbeat v4: throttle, error, then a six-byte varint as the tagged-field count.
        let body = [0, 0, 0, 0, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01];
        let err = scan_response(ApiKey::Heartbeat, 4, &body).unwrap_err();
        assert!(matches!(
            err,
            DecodeError::Malformed {
                reason: Malformation::BadVarint,
                ..
            }
        ));
    }

    #[test]
    fn lying_known_tag_size_is_rejected() {
        // ApiVersions v3: error, empty api_keys, throttle, one tag (3 = zk_migration_ready) that
        // claims 2 bytes but holds a 1-byte bool.
        let body = [0, 0, 1, 0, 0, 0, 0, 1, 3, 2, 1, 0];
        let err = scan_response(ApiKey::ApiVersions, 3, &body).unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::Malformed {
                    reason: Malformation::TaggedFieldSize {
                        tag: 3,
                        declared: 2,
                        actual: 1
                    },
                    ..
                }
            ),
            "{err}"
        );
        // A known array tag whose count runs past its declared size.
        let body = [0, 0, 1, 0, 0, 0, 0, 1, 0, 1, 5, 0];
        assert!(scan_response(ApiKey::ApiVersions, 3, &body).is_err());
    }

    #[test]
    fn many_unknown_tags_hit_the_memory_budget() {
        // Heartbeat v4 with 40000 empty unknown tagged fields: 80 KB of input, charged
        // UNKNOWN_TAG_COST each (20 MB), over the 5.2 MB budget. (decode_response does not scan
        // Heartbeat at all; there the BTreeMap's ~100 bytes per entry stay within the bound.)
        let n = 40_000u32;
        let mut body = vec![0, 0, 0, 0, 0, 0];
        put_uvarint(&mut body, n);
        for tag in 0..n {
            put_uvarint(&mut body, tag);
            body.push(0);
        }
        let err = scan_response(ApiKey::Heartbeat, 4, &body).unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::Malformed {
                    reason: Malformation::MemoryBudget { .. },
                    ..
                }
            ),
            "{err}"
        );
        // A handful is fine.
        let body = [0, 0, 0, 0, 0, 0, 2, 7, 1, 9, 8, 0];
        assert!(scan_response(ApiKey::Heartbeat, 4, &body).is_ok());
    }

    #[test]
    fn every_truncation_of_valid_bodies_is_a_typed_error() {
        for (api, version) in all_covered() {
            for seed in 0..8u64 {
                let body = generate(api, version, seed.wrapping_mul(7919) + version as u64);
                for cut in 0..body.len() {
                    match scan_response(api, version, &body[..cut]) {
                        Err(DecodeError::Malformed { .. }) => {}
                        other => panic!("{api:?} v{version} cut {cut}/{}: {other:?}", body.len()),
                    }
                }
                let mut longer = body.clone();
                longer.extend_from_slice(&[1, 2, 3]);
                assert!(matches!(
                    scan_response(api, version, &longer),
                    Err(DecodeError::TrailingBytes { left: 3, .. })
                ));
            }
        }
    }

    #[test]
    fn unsupported_versions_are_typed_errors() {
        for (api, v) in [
            (ApiKey::JoinGroup, 10),
            (ApiKey::OffsetCommit, 1),
            (ApiKey::Produce, 0),
            (ApiKey::Heartbeat, -1),
        ] {
            assert!(matches!(
                scan_response(api, v, &[0; 16]),
                Err(DecodeError::UnsupportedVersion { .. })
            ));
        }
    }

    #[test]
    fn header_scan() {
        assert_eq!(scan_response_header(&[0, 0, 0, 7, 9], 0), Ok((7, 4)));
        assert_eq!(
            scan_response_header(&[0, 0, 0, 7, 1, 5, 2, 0, 0, 9], 1),
            Ok((7, 9))
        );
        assert!(scan_response_header(&[0, 0, 0], 0).is_err());
        assert!(scan_response_header(&[0, 0, 0, 7, 1, 5, 9], 1).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn random_bytes_never_panic(
            which in 0usize..MESSAGES.len(),
            version in -1i16..15,
            body in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let api = MESSAGES[which].api;
            if let Ok(scan) = scan_response(api, version, &body) {
                prop_assert_eq!(scan.consumed, body.len());
            }
        }

        #[test]
        fn mutated_valid_bodies_never_panic(
            which in 0usize..MESSAGES.len(),
            seed in any::<u64>(),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        ) {
            let m = &MESSAGES[which];
            let version = m.min + (seed % (m.max - m.min + 1) as u64) as i16;
            let mut body = generate(m.api, version, seed);
            if body.is_empty() { return Ok(()); }
            for (at, byte) in flips {
                let i = at % body.len();
                body[i] = byte;
            }
            if let Ok(scan) = scan_response(m.api, version, &body) {
                prop_assert_eq!(scan.consumed, body.len());
                prop_assert!(scan.heap_estimate <= body.len() * MAX_AMPLIFICATION + AMPLIFICATION_SLACK);
            }
        }
    }
}

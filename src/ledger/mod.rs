//! The ledger, sans-I/O: a one-partition topic whose record offsets are fencing tokens that never
//! go backwards, a lock's history, a broker-fenced checkpoint, and the waiters' long poll.
//!
//! The membership machine ([`crate::membership`]) decides who holds the lock; this machine sits
//! between it and the lock's users when the lock has a ledger. It is fed the membership's events
//! and a [`MemberView`] of its state, and the answers to the requests it asked for; it hands back
//! requests ([`Transmit`]), the events the users see ([`Event`], the membership's own type),
//! commands for the membership machine ([`Command`]), the outcome of checkpoints, and when it
//! next needs to be woken. Like the membership machine it never reads a clock or touches a socket.
//!
//! ```text
//!   Waiting ── membership Acquired ──► Appending ── ACQUIRED acknowledged, lease running ──► Held
//!   (long-polls the ledger; a            │  (Produce acks=all; nothing published yet)         │
//!    RELEASED/LOST of this lock          │ acknowledged after the lease end, or not           │
//!    → HoldEnded)                        │ within the deadline: Lost(ledger) + Leave          │
//!                                        ▼                                       membership   │
//!                                      Ending ◄────────────────────────── Released / Lost ────┘
//!                                        │ membership Left/Failed: RELEASED or LOST appended
//!                                        ▼ (once, when the offset is known), then Left/Failed
//!                                       Over                           published
//! ```
//!
//! # The decisions
//!
//! - **A hold begins only when its ACQUIRED record is durable and acknowledged before the lease
//!   ends.** The membership's `Acquired` is held back; the record is appended with acks=all; when
//!   the answer arrives the machine asks the [`MemberView`] whether the lease still runs *now*. If
//!   it does, the hold begins with the record's offset as the token; if not, the record names no
//!   hold, the users are told the lock was lost ([`LossReason::Ledger`]) and the membership is
//!   asked to leave. With [`LedgerConfig::read_at_grant`] the lock's last checkpoint is read
//!   beside the append ([`Ledger::poll_read`]), and the hold begins only once both are in, in
//!   either order, the lease checked when the later one arrives.
//! - **End records come after the membership has ended** (LeaveGroup answered or given up), so a
//!   waiter that reads RELEASED and rejoins finds the rebalance already begun. A failure to
//!   write one is logged, never fatal; the users' `Left` waits for it, bounded by the request
//!   timeout, so a process that exits after `release()` has written it.
//! - **Waiters long-poll** the partition from its end with one parked Fetch at a time (at most
//!   [`LedgerConfig::poll_wait`], at most [`LedgerConfig::poll_max_bytes`]), keep only this lock's
//!   records (by key), and on a RELEASED or LOST record tell the membership
//!   ([`Command::HoldEnded`]): it rejoins at once when the record names its own generation (the
//!   holder left after its last join), and heartbeats at once otherwise. The coordinator's
//!   answer, not the record, decides: a record proves nothing about the group. Once the
//!   poll has found its starting point it heartbeats once too: a release recorded before that
//!   point is not in any Fetch from it.
//! - **Checkpoints** are OffsetCommits on the lock's group for the ledger partition, with the
//!   hold's generation and member id, so the broker rejects a holder that is no longer current.
//!   An accepted one is copied into the ledger (a CHECKPOINT record), which outlives the group,
//!   and only once that copy is acknowledged is the checkpoint reported stored: the group's copy
//!   alone can be deleted or expire, and a reader would then find an older one in the ledger.
//!
//! Appends go out one at a time on one connection, in order. The partition's leader is found
//! with Metadata and looked up again after NOT_LEADER_OR_FOLLOWER and similar answers or a
//! transport failure.

pub(crate) mod error;
mod failure;
mod history;
mod record;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::{
    ApiKey, DescribeConfigsRequest, DescribeConfigsResponse, GroupId, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tracing::{debug, info, warn};

pub use error::{compression_fix, create_topic_command, LedgerError, SINGLE_BROKER_SETTINGS};
pub use failure::{Failure, Unanswered};
pub use history::{fold, Checkpoint, CheckpointSource, History, Hold, HoldEnd, Unreadable};
pub use record::{LedgerRecord, RecordKind, MAX_CHECKPOINT};

use crate::api::Api;
use crate::backoff::Backoff;
use crate::membership::{self, Broker, Command, Event, FencingToken, LossReason};
use crate::wire::code::KafkaCode;
use crate::wire::log::{
    fetch_request, fetched, list_offsets_request, listed, produce_request, produced, Appended,
    FetchOptions, Isolation, LogError, OffsetSpec, TopicPartition, Uuid, TOPIC_ID_VERSION,
};
use crate::wire::records::{encode_batch, BatchError, NewRecord, RecordBatches};
use crate::wire::versions::NegotiatedVersions;
use crate::wire::{Request, Response};

/// Kafka's default `offset.metadata.max.bytes`: the longest checkpoint a broker accepts unless
/// configured otherwise.
pub const DEFAULT_CHECKPOINT_MAX_BYTES: usize = 4096;
/// How long a waiter's Fetch may stay parked at the broker by default.
pub const DEFAULT_POLL_WAIT: Duration = Duration::from_secs(5);
/// The most record bytes a waiter's Fetch asks for by default: a ledger record is about 100
/// bytes, so this is hundreds of records of every lock sharing the topic.
pub const DEFAULT_POLL_MAX_BYTES: i32 = 64 * 1024;
/// The largest response frame accepted on connections that Fetch from the ledger. Kafka sends
/// the first batch of a Fetch whole even when it is larger than the Fetch's limit (KIP-74), and
/// its default `message.max.bytes` is 1048588, above the 1 MiB default frame limit: with this
/// much room a batch the broker accepts by default still arrives, and is read or skipped, rather
/// than failing the connection at the same offset again and again. (The topic should cap
/// `max.message.bytes` far lower anyway; see the creation command in [`LedgerError::TopicMissing`].)
pub const LEDGER_MAX_FRAME_SIZE: usize = crate::wire::DEFAULT_MAX_FRAME_SIZE + 64 * 1024;
/// Highest OffsetCommit and OffsetFetch versions kafka-protocol 0.18 can *encode* (its response
/// decoders go one further).
const OFFSET_REQUEST_MAX_VERSION: i16 = 9;
/// Apache Kafka's default `offsets.commit.timeout.ms`: how long its group coordinator may hold
/// an OffsetCommit while the offsets partition's replicas catch up before answering
/// REQUEST_TIMED_OUT (GroupCoordinatorService.commitOffsets schedules the write with it).
pub const BROKER_COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// The local timeout of a request the broker bounds itself (`broker_bound`): that bound plus
/// the request timeout for the way there and back, so the broker's own answer (a clean
/// REQUEST_TIMED_OUT) arrives before the connection is given up. A local timeout that fired
/// first would close the connection under the request and fail whatever waits behind it.
pub fn parked_timeout(broker_bound: Duration, request_timeout: Duration) -> Duration {
    broker_bound.saturating_add(request_timeout)
}

/// What the machine needs up front.
#[derive(Debug, Clone)]
pub struct LedgerConfig {
    /// The lock's name: the group id and every record's key.
    pub lock: String,
    /// The ledger topic (one partition).
    pub topic: String,
    /// Our label, written into every record.
    pub label: Option<String>,
    /// Our host name, written into every record.
    pub host: Option<String>,
    /// Our process id, written into every record.
    pub pid: Option<u32>,
    /// The lease a renewal buys, recorded in ACQUIRED records.
    pub lease_length: Duration,
    /// Bound on each request (a parked Fetch gets `poll_wait` on top).
    pub request_timeout: Duration,
    /// How long the ACQUIRED append may take in all, retries included, before the machine gives
    /// up on the hold (the lease still bounds it first).
    pub append_deadline: Duration,
    /// Whether waiters long-poll the ledger to learn of a release at once.
    pub push: bool,
    /// How long a waiter's Fetch may stay parked at the broker.
    pub poll_wait: Duration,
    /// The most record bytes one Fetch may return.
    pub poll_max_bytes: i32,
    /// The longest checkpoint accepted (checked before anything is sent).
    pub checkpoint_max_bytes: usize,
    /// First retry delay.
    pub retry_backoff: Duration,
    /// Whether each hold begins with its lock's last checkpoint read, started when the
    /// membership is assigned the lock, beside the ACQUIRED append ([`Ledger::poll_read`]).
    pub read_at_grant: bool,
}

/// The ledger partition: where it is and what it is called on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Its leader.
    pub leader: Broker,
    /// The topic's id (nil when Metadata was older than v10).
    pub topic_id: Uuid,
}

/// The membership machine's state as the ledger needs to see it; the driver builds it afresh
/// each time it calls in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberView {
    /// The membership machine holds the lock (its lease has not run out).
    pub holding: bool,
    /// Its lease end while holding.
    pub lease_end: Option<Instant>,
    /// The group coordinator, when known.
    pub coordinator: Option<Broker>,
    /// The current generation (-1 before a join).
    pub generation: i32,
    /// Our member id ("" before a join).
    pub member_id: String,
    /// Holding, and a JoinGroup answer has moved `generation` past the hold's while no SyncGroup
    /// answer has yet said who holds the new one: a commit at `generation` now could be stored
    /// for a member that is no longer the holder.
    pub awaiting_sync: bool,
}

/// Whether a retry time has come (none set means at once).
fn due(t: Option<Instant>, now: Now) -> bool {
    t.is_none_or(|t| t <= now.mono)
}

/// The time, both ways: the monotonic clock decides, the wall clock is written into records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// The monotonic clock.
    pub mono: Instant,
    /// Milliseconds since the Unix epoch.
    pub unix_ms: i64,
}

/// Which connection to the partition leader a request uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaderLane {
    /// Produce and ListOffsets. An acks=all Produce waits for the replicas, up to its own
    /// timeout; nothing of the membership goes here.
    Append,
    /// The waiters' parked Fetch: a broker answers one connection's requests in order, so
    /// nothing else may queue behind it.
    Poll,
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Any bootstrap broker (Metadata).
    Any,
    /// The partition's leader.
    Leader {
        /// The leader.
        broker: Broker,
        /// The connection.
        lane: LeaderLane,
    },
    /// The group coordinator, on a connection of the ledger's own (OffsetCommit): Apache may
    /// hold a commit for up to `offsets.commit.timeout.ms` and answers a connection's requests
    /// in order, so it must never sit in front of a heartbeat.
    Coordinator(Broker),
}

/// What a request does; [`build`] makes the wire request for the versions a connection offers.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Metadata for the ledger topic.
    Metadata {
        /// The topic.
        topic: String,
    },
    /// The partition's first or next offset.
    ListOffsets {
        /// The partition.
        tp: TopicPartition,
        /// Which.
        spec: OffsetSpec,
    },
    /// Append one batch (acks=all).
    Produce {
        /// The partition.
        tp: TopicPartition,
        /// The encoded batch.
        batch: Bytes,
        /// How long the broker may wait for the replicas.
        timeout: Duration,
    },
    /// Read from `offset`, parked up to `options.max_wait`.
    Fetch {
        /// The partition.
        tp: TopicPartition,
        /// Where to start.
        offset: i64,
        /// Wait and size.
        options: FetchOptions,
    },
    /// Store a checkpoint, fenced by generation and member id.
    Commit {
        /// The lock's group.
        group: String,
        /// The hold's generation.
        generation: i32,
        /// Our member id.
        member_id: String,
        /// The partition.
        tp: TopicPartition,
        /// The committed offset: the hold's token.
        offset: i64,
        /// The checkpoint.
        metadata: String,
    },
}

impl Op {
    /// The request's API name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Metadata { .. } => "Metadata",
            Op::ListOffsets { .. } => "ListOffsets",
            Op::Produce { .. } => "Produce",
            Op::Fetch { .. } => "Fetch",
            Op::Commit { .. } => "OffsetCommit",
        }
    }
}

/// One request for the driver. Answer it with [`Ledger::handle_response`], the same id and the
/// version [`build`] chose.
#[derive(Debug, Clone)]
pub struct Transmit {
    /// Identifies the answer.
    pub id: u64,
    /// Where it goes.
    pub target: Target,
    /// What it does.
    pub op: Op,
    /// Give up on the answer after this long.
    pub timeout: Duration,
}

/// The wire request for `op` at the highest version both `versions` and kafka-lock offer.
pub fn build(op: &Op, versions: &NegotiatedVersions) -> Result<(Request, i16), Failure> {
    let need = |api: ApiKey| {
        versions
            .get(api)
            .ok_or(Failure::Ledger(LedgerError::Unsupported {
                api: Api::of(api),
            }))
    };
    // Requests that name topics by id need the id, which only Metadata v10+ gives.
    let by_id = |tp: &TopicPartition, v: i16| {
        if tp.topic_id.is_nil() {
            v.min(TOPIC_ID_VERSION - 1)
        } else {
            v
        }
    };
    let log = |e: LogError| Failure::Protocol(e.to_string());
    Ok(match op {
        Op::Metadata { topic } => {
            let v = need(ApiKey::Metadata)?;
            let mut t = MetadataRequestTopic::default();
            t.name = Some(TopicName(StrBytes::from_string(topic.clone())));
            let mut req = MetadataRequest::default();
            req.topics = Some(vec![t]);
            if v >= 4 {
                // A ledger is never created by accident: a typo must not start a new token
                // sequence at 0, and a broker's default partition count may not be one.
                req.allow_auto_topic_creation = false;
            }
            (req.into(), v)
        }
        Op::ListOffsets { tp, spec } => {
            let v = need(ApiKey::ListOffsets)?;
            let req = list_offsets_request(
                tp,
                *spec,
                Isolation::ReadCommitted,
                Duration::from_secs(5),
                v,
            );
            (req.into(), v)
        }
        Op::Produce { tp, batch, timeout } => {
            let v = by_id(tp, need(ApiKey::Produce)?);
            let req = produce_request(tp, batch.clone(), *timeout, v).map_err(log)?;
            (req.into(), v)
        }
        Op::Fetch {
            tp,
            offset,
            options,
        } => {
            let v = by_id(tp, need(ApiKey::Fetch)?);
            let req = fetch_request(tp, *offset, options, v).map_err(log)?;
            (req.into(), v)
        }
        Op::Commit {
            group,
            generation,
            member_id,
            tp,
            offset,
            metadata,
        } => {
            let v = need(ApiKey::OffsetCommit)?.min(OFFSET_REQUEST_MAX_VERSION);
            let mut p = OffsetCommitRequestPartition::default();
            p.partition_index = tp.partition;
            p.committed_offset = *offset;
            p.committed_metadata = Some(StrBytes::from_string(metadata.clone()));
            let mut t = OffsetCommitRequestTopic::default();
            t.name = TopicName(tp.topic.clone());
            t.partitions = vec![p];
            let mut req = OffsetCommitRequest::default();
            req.group_id = GroupId(StrBytes::from_string(group.clone()));
            req.generation_id_or_member_epoch = *generation;
            req.member_id = StrBytes::from_string(member_id.clone());
            req.topics = vec![t];
            (req.into(), v)
        }
    })
}

/// An OffsetFetch for the ledger partition's committed offset in `group`, at the highest version
/// `versions` allows (for reading checkpoints; no membership needed).
///
/// From v7 it sets `require_stable`, which Apache's coordinator serves as a write without
/// records (GroupCoordinatorService `fetchOffsets`): it reads every offset written to the
/// group's partition and answers once the last of them is committed. Without it the read is at
/// `lastCommittedOffset`, which on a coordinator that has just taken over is the new leader's
/// high watermark, and that can lag commits the old leader already acknowledged
/// (CoordinatorLoaderImpl `load`): the new holder would read an older checkpoint.
pub fn offset_fetch_request(
    group: &str,
    topic: &str,
    versions: &NegotiatedVersions,
) -> Result<(Request, i16), Failure> {
    let v = versions
        .get(ApiKey::OffsetFetch)
        .ok_or(Failure::UnsupportedApi {
            api: Api::OffsetFetch,
        })?
        .min(OFFSET_REQUEST_MAX_VERSION);
    let topic = TopicName(StrBytes::from_string(topic.to_owned()));
    let mut req = OffsetFetchRequest::default();
    req.require_stable = v >= 7;
    if v >= 8 {
        let mut t = OffsetFetchRequestTopics::default();
        t.name = topic;
        t.partition_indexes = vec![0];
        let mut g = OffsetFetchRequestGroup::default();
        g.group_id = GroupId(StrBytes::from_string(group.to_owned()));
        g.topics = Some(vec![t]);
        req.groups = vec![g];
    } else {
        let mut t = OffsetFetchRequestTopic::default();
        t.name = topic;
        t.partition_indexes = vec![0];
        req.group_id = GroupId(StrBytes::from_string(group.to_owned()));
        req.topics = Some(vec![t]);
    }
    Ok((req.into(), v))
}

/// What an OffsetFetch answer says is committed for partition 0 of `topic`: `(offset, metadata)`,
/// or `None` when nothing is (no commit, or the group is gone).
pub fn offset_fetched(resp: &Response, topic: &str) -> Result<Option<(i64, String)>, Failure> {
    let Response::OffsetFetch(r) = resp else {
        return Err(Failure::Protocol(membership::wrong_answer(
            ApiKey::OffsetFetch,
            resp.api_key(),
        )));
    };
    let broker = |code: i16| Failure::broker(Api::OffsetFetch, KafkaCode(code), None);
    let found = if r.groups.is_empty() {
        if r.error_code != 0 {
            return Err(broker(r.error_code));
        }
        r.topics
            .iter()
            .filter(|t| t.name.0.as_str() == topic)
            .flat_map(|t| &t.partitions)
            .find(|p| p.partition_index == 0)
            .map(|p| (p.error_code, p.committed_offset, p.metadata.clone()))
    } else {
        let g = &r.groups[0];
        if g.error_code != 0 {
            return Err(broker(g.error_code));
        }
        g.topics
            .iter()
            .filter(|t| t.name.0.as_str() == topic)
            .flat_map(|t| &t.partitions)
            .find(|p| p.partition_index == 0)
            .map(|p| (p.error_code, p.committed_offset, p.metadata.clone()))
    };
    match found {
        None => Ok(None),
        Some((code, _, _)) if code != 0 => Err(broker(code)),
        Some((_, offset, _)) if offset < 0 => Ok(None),
        Some((_, offset, metadata)) => Ok(Some((
            offset,
            metadata.map(|m| m.to_string()).unwrap_or_default(),
        ))),
    }
}

/// Whether `tail`, a lock's history folded from its records in `[tail.first_offset, end)`, shows
/// the lock's last checkpoint in the whole ledger. The last one is that of the newest hold that
/// stored any, so finding *a* checkpoint does not settle it: a copy can be appended late (it
/// follows the commit, and other records in between), so a copy of hold T can lie above a newer
/// hold's copy. But every record of a hold T' > T lies above its ACQUIRED record at offset T',
/// so once the read covers every offset above T, no newer hold's checkpoint is left unread.
pub fn tail_settles_checkpoint(tail: &History) -> bool {
    tail.last_checkpoint()
        .is_some_and(|(_, hold, _)| tail.first_offset <= hold.saturating_add(1))
}

/// The ledger topic's config key kafka-lock checks at start.
pub const COMPRESSION_TYPE: &str = "compression.type";
/// DescribeConfigs' resource type for a topic.
const TOPIC_RESOURCE: i8 = 2;

/// DescribeConfigs for `topic`'s `compression.type` only.
pub fn compression_request(topic: &str) -> DescribeConfigsRequest {
    let mut r = DescribeConfigsResource::default();
    r.resource_type = TOPIC_RESOURCE;
    r.resource_name = StrBytes::from_string(topic.to_owned());
    r.configuration_keys = Some(vec![StrBytes::from_static_str(COMPRESSION_TYPE)]);
    let mut req = DescribeConfigsRequest::default();
    req.resources = vec![r];
    req
}

/// What a DescribeConfigs answer says about the ledger topic's compression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compression {
    /// `producer` or `uncompressed`: the broker keeps kafka-lock's batches as written.
    Kept,
    /// The principal may not describe the topic's configs (TOPIC_AUTHORIZATION_FAILED): the
    /// setting is unknown.
    NotAuthorized,
    /// The broker answered without the setting (or with an error for it): unknown.
    Unknown(String),
}

/// Reads `compression.type` for `topic` from a DescribeConfigs answer. A recompressing setting is
/// [`LedgerError::Compressed`]; an answer about some other resource is a protocol error.
pub fn ledger_compression(
    resp: &DescribeConfigsResponse,
    topic: &str,
) -> Result<Compression, Failure> {
    let Some(r) = resp
        .results
        .iter()
        .find(|r| r.resource_type == TOPIC_RESOURCE && r.resource_name.as_str() == topic)
    else {
        return Err(Failure::Protocol(format!(
            "DescribeConfigs answered without a result for topic {topic:?}"
        )));
    };
    match r.error_code {
        0 => {}
        29 => return Ok(Compression::NotAuthorized),
        code => {
            return Ok(Compression::Unknown(format!(
                "DescribeConfigs error {code}{}",
                r.error_message
                    .as_ref()
                    .map(|m| format!(": {}", m.as_str()))
                    .unwrap_or_default()
            )))
        }
    }
    let Some(c) = r
        .configs
        .iter()
        .find(|c| c.name.as_str() == COMPRESSION_TYPE)
    else {
        return Ok(Compression::Unknown(format!(
            "no {COMPRESSION_TYPE} in the answer"
        )));
    };
    match c.value.as_ref().map(|v| v.as_str()) {
        Some("producer" | "uncompressed") => Ok(Compression::Kept),
        Some(codec) => Err(LedgerError::Compressed {
            topic: topic.to_owned(),
            codec: codec.to_owned(),
        }
        .into()),
        None => Ok(Compression::Unknown(format!(
            "{COMPRESSION_TYPE} has no value"
        ))),
    }
}

/// What a Metadata answer says about the ledger topic: its leader and id, or why it cannot serve.
/// `Ok(None)`: the topic is there but has no leader right now (an election); ask again.
pub fn ledger_partition(
    resp: &MetadataResponse,
    topic: &str,
) -> Result<Option<Partition>, Failure> {
    let Some(t) = resp
        .topics
        .iter()
        .find(|t| t.name.as_ref().map(|n| n.0.as_str()) == Some(topic))
    else {
        return Err(LedgerError::TopicMissing {
            topic: topic.to_owned(),
        }
        .into());
    };
    match t.error_code {
        0 => {}
        3 => {
            return Err(LedgerError::TopicMissing {
                topic: topic.to_owned(),
            }
            .into())
        }
        5 => return Ok(None),
        code => return Err(Failure::broker(Api::Metadata, KafkaCode(code), None)),
    }
    if t.partitions.len() != 1 {
        return Err(LedgerError::NotOnePartition {
            topic: topic.to_owned(),
            partitions: t.partitions.len(),
        }
        .into());
    }
    let p = &t.partitions[0];
    if p.partition_index != 0 {
        return Err(Failure::Protocol(format!(
            "Metadata names partition {} as the only partition of {topic:?}",
            p.partition_index
        )));
    }
    if p.error_code != 0 || p.leader_id.0 < 0 {
        return Ok(None);
    }
    let Some(b) = resp.brokers.iter().find(|b| b.node_id == p.leader_id) else {
        return Ok(None);
    };
    Ok(Some(Partition {
        leader: Broker {
            node_id: b.node_id.0,
            host: b.host.to_string(),
            port: b.port,
        },
        topic_id: t.topic_id,
    }))
}

/// How a hold (or a try at one) ended, for its end record.
#[derive(Debug, Clone, PartialEq, Eq)]
enum EndKind {
    Released,
    Lost(LossReason, String),
    /// The hold never began for the users (the acquire was abandoned before the record was
    /// acknowledged): a LOST record says the offset names no hold.
    Abandoned,
}

#[derive(Debug, Clone)]
enum HoldState {
    /// Not holding; waiters long-poll.
    Waiting,
    /// The membership holds; the ACQUIRED record is on its way.
    Appending {
        attempt: u64,
        token: FencingToken,
        since: Instant,
        deadline: Instant,
        /// The membership's permit slot, passed on when the hold begins.
        permit: u16,
    },
    /// The hold, with its token.
    Held {
        attempt: u64,
        token: FencingToken,
        since: Instant,
    },
    /// The hold (or the try) is over; the end record goes out once the membership has ended.
    Ending {
        attempt: u64,
        token: FencingToken,
        since: Option<Instant>,
        ended: Instant,
        end: EndKind,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    Acquired,
    End,
    Checkpoint,
}

/// Which try an ACQUIRED answer speaks for: the one appending, the one ending (the try ended
/// while its record was on its way), or one long over.
#[derive(PartialEq)]
enum Try {
    Appending,
    Ending,
    Over,
}

#[derive(Debug, Clone)]
struct Append {
    purpose: Purpose,
    batch: Bytes,
    /// Given up on after this (and logged), except ACQUIRED, which has the hold's deadline.
    deadline: Instant,
    /// For an ACQUIRED record: the try it begins and the token it was written with. Its answer
    /// counts for that try only; a later try has a record of its own.
    attempt: Option<(u64, FencingToken)>,
    /// For a CHECKPOINT record: the ticket of the checkpoint it copies, which is reported stored
    /// only once this record is acknowledged.
    ticket: Option<u64>,
}

/// A checkpoint on its way to the coordinator, with the hold it was sent under: its answer
/// speaks of that hold, whatever the machine is doing when it arrives.
#[derive(Debug)]
struct SentCommit<F> {
    id: u64,
    op: CheckpointOp<F>,
    attempt: u64,
    token: FencingToken,
}

#[derive(Debug)]
struct CheckpointOp<F> {
    ticket: u64,
    value: String,
    deadline: Instant,
    last_error: Option<Failure<F>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Poll {
    /// Not polling (holding, leaving, or push is off).
    Off,
    /// Polling from this offset; `None`: ask for the partition's end first.
    At(Option<i64>),
}

/// Requests awaiting an answer. An append or a checkpoint leaves its queue while it is sent, so
/// an answer is always applied to what was sent, never to whatever is queued first by then.
#[derive(Debug)]
struct InFlight<F> {
    metadata: Option<u64>,
    append: Option<(u64, Append)>,
    /// The ListOffsets or Fetch of the long poll.
    poll: Option<u64>,
    commit: Option<SentCommit<F>>,
}

impl<F> Default for InFlight<F> {
    fn default() -> Self {
        InFlight {
            metadata: None,
            append: None,
            poll: None,
            commit: None,
        }
    }
}

/// What a checkpoint read started at the grant found: the lock's last checkpoint, if any, or why
/// it could not be read.
pub type GrantRead<F> = Result<Option<Checkpoint>, F>;

/// The ledger machine. See the [module docs](self). `F` is the driver's failure, which the
/// machine is told of and hands back inside its own ([`Failure::Unanswered`]).
pub struct Ledger<F> {
    cfg: LedgerConfig,
    partition: Option<Partition>,
    hold: HoldState,
    appends: VecDeque<Append>,
    poll: Poll,
    poll_retry_at: Option<Instant>,
    poll_backoff: Backoff,
    metadata_retry_at: Option<Instant>,
    append_retry_at: Option<Instant>,
    backoff: Backoff,
    checkpoints: VecDeque<CheckpointOp<F>>,
    checkpoint_retry_at: Option<Instant>,
    /// The membership has ended (Left or Failed seen); its event waits in `terminal` until the
    /// end record is settled.
    member_done: bool,
    terminal: Option<Event<Failure<F>>>,
    /// The users were told the hold began.
    published_hold: bool,
    in_flight: InFlight<F>,
    next_id: u64,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event<Failure<F>>>,
    commands: VecDeque<Command>,
    checkpoint_results: VecDeque<(u64, Result<(), Failure<F>>)>,
    /// The last compressed batch reported, so a waiter warns once per batch, not per poll.
    warned_at: Option<i64>,
    /// Counts tries at a hold, so an answer is matched to the try whose record it acknowledges.
    attempts: u64,
    /// The checkpoint read of a try (`read_at_grant`): the try's attempt, and the read's outcome
    /// once it is in. The hold waits for both it and the ACQUIRED answer.
    grant_read: Option<(u64, Option<GrantRead<F>>)>,
    /// Reads to start, by attempt.
    reads: VecDeque<u64>,
    /// The read of the hold that just began, handed out before its `Acquired` event.
    granted: VecDeque<GrantRead<F>>,
    /// The ledger topic's id as first seen: a topic deleted and created again under the same
    /// name starts its offsets at 0 again, so it cannot go on serving this process's tokens.
    topic_id: Option<Uuid>,
    /// The permit slot of the current (or last) hold, written into its records: a semaphore's
    /// tokens increase within each slot, and readers fold each slot's holds apart.
    slot: u16,
}

impl<F> std::fmt::Debug for Ledger<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("lock", &self.cfg.lock)
            .field("topic", &self.cfg.topic)
            .field("hold", &self.hold)
            .finish_non_exhaustive()
    }
}

impl<F: Unanswered> Ledger<F> {
    /// A machine for `cfg`; `partition` when the caller already looked it up.
    pub fn new(cfg: LedgerConfig, partition: Option<Partition>, backoff: Backoff) -> Self {
        let topic_id = partition
            .as_ref()
            .map(|p| p.topic_id)
            .filter(|id| !id.is_nil());
        let poll_backoff = Backoff::new(
            cfg.retry_backoff,
            cfg.poll_wait.max(cfg.retry_backoff),
            2.0,
            0.5,
        );
        Ledger {
            cfg,
            partition,
            hold: HoldState::Waiting,
            appends: VecDeque::new(),
            poll: Poll::Off,
            poll_retry_at: None,
            poll_backoff,
            metadata_retry_at: None,
            append_retry_at: None,
            backoff,
            checkpoints: VecDeque::new(),
            checkpoint_retry_at: None,
            member_done: false,
            terminal: None,
            published_hold: false,
            in_flight: InFlight::default(),
            next_id: 1,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            commands: VecDeque::new(),
            checkpoint_results: VecDeque::new(),
            warned_at: None,
            attempts: 0,
            grant_read: None,
            reads: VecDeque::new(),
            granted: VecDeque::new(),
            topic_id,
            slot: 0,
        }
    }

    /// The token of the current hold, once it began (read by the tests only).
    #[cfg(test)]
    pub fn token(&self) -> Option<&FencingToken> {
        match &self.hold {
            HoldState::Held { token, .. } => Some(token),
            _ => None,
        }
    }

    /// The ledger partition as last looked up.
    pub fn partition(&self) -> Option<&Partition> {
        self.partition.as_ref()
    }

    /// The ledger topic's check (made beside the membership's first steps) found `p`: the
    /// partition and its leader, unless a lookup of the machine's own has answered already.
    pub fn found_partition(&mut self, p: Partition) {
        if self.partition.is_some() {
            return;
        }
        if self.topic_id.is_none() && !p.topic_id.is_nil() {
            self.topic_id = Some(p.topic_id);
        }
        self.partition = Some(p);
    }

    /// Next request to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// Next event for the users.
    pub fn poll_event(&mut self) -> Option<Event<Failure<F>>> {
        self.events.pop_front()
    }

    /// Next command for the membership machine.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// Next checkpoint read to start (`read_at_grant`), for the try with this attempt number; its
    /// outcome goes to [`Ledger::on_read`].
    pub fn poll_read(&mut self) -> Option<u64> {
        self.reads.pop_front()
    }

    /// The read of the hold that began, handed out just before its `Acquired` event.
    pub fn poll_granted(&mut self) -> Option<GrantRead<F>> {
        self.granted.pop_front()
    }

    /// The checkpoint read asked for by [`Ledger::poll_read`] for try `attempt` is done. A read
    /// of a try that is over is dropped.
    pub fn on_read(&mut self, attempt: u64, read: GrantRead<F>, view: &MemberView, now: Now) {
        match &mut self.grant_read {
            Some((a, slot @ None)) if *a == attempt => {
                *slot = Some(read);
                self.begin_when_ready(view, now);
            }
            _ => {
                debug!(lock = %self.cfg.lock, attempt, "a checkpoint read of a try that is over; dropped")
            }
        }
        self.drive(view, now);
    }

    /// Next finished checkpoint: the ticket given to [`Ledger::checkpoint`] and its outcome.
    pub fn poll_checkpoint(&mut self) -> Option<(u64, Result<(), Failure<F>>)> {
        self.checkpoint_results.pop_front()
    }

    /// True once the membership has ended and everything the ledger had to write is settled.
    pub fn is_done(&self) -> bool {
        self.member_done
            && self.terminal.is_none()
            && self.appends.is_empty()
            && self.in_flight.append.is_none()
            && self.checkpoints.is_empty()
            && self.in_flight.commit.is_none()
    }

    /// When to call [`Ledger::handle_timeout`] next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut at: Option<Instant> = None;
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                at = Some(at.map_or(t, |a| a.min(t)));
            }
        };
        if let HoldState::Appending {
            deadline, token, ..
        } = &self.hold
        {
            if token.ledger_offset.is_none() {
                consider(Some(*deadline));
            }
        }
        if self.in_flight.metadata.is_none() && self.partition.is_none() && self.wants_leader() {
            consider(self.metadata_retry_at);
        }
        // Retry times count only where `drive` can act on them; one it cannot act on would be
        // due forever and wake the driver in a loop.
        if self.in_flight.append.is_none() && !self.appends.is_empty() {
            if self.partition.is_some() {
                consider(self.append_retry_at);
            }
            consider(self.appends.front().map(|a| a.deadline));
        }
        if self.in_flight.poll.is_none()
            && matches!(self.poll, Poll::At(_))
            && self.partition.is_some()
        {
            consider(self.poll_retry_at);
        }
        if self.in_flight.commit.is_none() && !self.checkpoints.is_empty() {
            consider(self.checkpoint_retry_at);
            consider(self.checkpoints.front().map(|c| c.deadline));
        }
        at
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, view: &MemberView, now: Now) {
        self.drive(view, now);
    }

    /// Stores `value` as the lock's checkpoint, fenced; the outcome comes from
    /// [`Ledger::poll_checkpoint`] with `ticket`.
    pub fn checkpoint(&mut self, ticket: u64, value: String, view: &MemberView, now: Now) {
        if value.len() > self.cfg.checkpoint_max_bytes.min(MAX_CHECKPOINT) {
            let max = self.cfg.checkpoint_max_bytes.min(MAX_CHECKPOINT);
            self.checkpoint_results.push_back((
                ticket,
                Err(LedgerError::CheckpointTooLarge {
                    len: value.len(),
                    max,
                }
                .into()),
            ));
            return;
        }
        if let Some(at) = value.find('\0') {
            self.checkpoint_results
                .push_back((ticket, Err(LedgerError::CheckpointHasNul { at }.into())));
            return;
        }
        self.checkpoints.push_back(CheckpointOp {
            ticket,
            value,
            deadline: now.mono + self.checkpoint_window(),
            last_error: None,
        });
        self.drive(view, now);
    }

    /// An event of the membership machine. `view` is its state after the event.
    pub fn on_membership(&mut self, e: Event, view: &MemberView, now: Now) {
        let e = e.map_failure(Failure::Member);
        match e {
            Event::Acquired { token, permit, .. } => self.on_acquired(token, permit, now),
            Event::TokenChanged { token } => match &mut self.hold {
                HoldState::Appending { token: t, .. } => t.generation = token.generation,
                HoldState::Held { token: t, .. } => {
                    t.generation = token.generation;
                    let token = t.clone();
                    self.events.push_back(Event::TokenChanged { token });
                }
                _ => {}
            },
            Event::RebalanceWhileHeld => {
                if self.published_hold {
                    self.events.push_back(Event::RebalanceWhileHeld);
                }
            }
            Event::Lost { reason, lease_end } => self.on_lost(reason, lease_end, now),
            Event::Released => self.on_released(now),
            Event::Waiting { .. } => {
                if self.cfg.push
                    && matches!(self.hold, HoldState::Waiting)
                    && self.poll == Poll::Off
                {
                    self.poll = Poll::At(None);
                }
                self.events.push_back(e);
            }
            Event::Left { .. } | Event::Failed(_) => {
                self.member_done = true;
                self.poll = Poll::Off;
                self.queue_end_record(false, now);
                self.terminal = Some(e);
            }
            other => self.events.push_back(other),
        }
        self.drive(view, now);
    }

    /// The membership assigned the lock: a waiting machine appends ACQUIRED before the hold
    /// begins (see the module docs).
    fn on_acquired(&mut self, token: FencingToken, permit: u16, now: Now) {
        if matches!(self.hold, HoldState::Waiting) {
            debug!(lock = %self.cfg.lock, generation = token.generation,
                   "assigned; appending ACQUIRED to the ledger before the hold begins");
            self.poll = Poll::Off;
            self.slot = permit;
            let batch = self.record_batch(
                &token,
                -1,
                RecordKind::Acquired {
                    lease_ms: millis32(self.cfg.lease_length),
                },
                now,
            );
            let deadline = now.mono + self.cfg.append_deadline;
            self.attempts += 1;
            let attempt = self.attempts;
            // First in line: end and checkpoint records of earlier holds wait for it,
            // and one already sent keeps its own answer (see `InFlight`).
            self.appends.push_front(Append {
                purpose: Purpose::Acquired,
                batch,
                deadline,
                attempt: Some((attempt, token.clone())),
                ticket: None,
            });
            self.hold = HoldState::Appending {
                attempt,
                token,
                since: now.mono,
                deadline,
                permit,
            };
            self.published_hold = false;
            // Beside the append, not after it: see docs/design.md, "Checkpoint".
            self.grant_read = self.cfg.read_at_grant.then_some((attempt, None));
            if self.cfg.read_at_grant {
                self.reads.push_back(attempt);
            }
        }
    }

    /// The membership lost the lock (or, in eager mode, had it revoked).
    fn on_lost(&mut self, reason: LossReason, lease_end: Instant, now: Now) {
        let live = matches!(
            self.hold,
            HoldState::Appending { .. } | HoldState::Held { .. }
        );
        let detail = reason.to_string();
        self.end(
            EndKind::Lost(reason.clone(), detail),
            lease_end.min(now.mono),
            now,
        );
        if reason == LossReason::Revoked {
            // Eager consumer mode: the member stays and may be assigned the lock again,
            // which is a new hold with a record of its own; this one ends now.
            self.queue_end_record(true, now);
            self.hold = HoldState::Waiting;
        }
        // An eager revocation of a try the users never saw is no loss to them: the member
        // stays in the group and waits, and the acquire with it.
        let unseen = reason == LossReason::Revoked && !self.published_hold;
        if live && !unseen {
            self.events.push_back(Event::Lost { reason, lease_end });
        }
    }

    /// The user released the lock.
    fn on_released(&mut self, now: Now) {
        let live = matches!(
            self.hold,
            HoldState::Appending { .. } | HoldState::Held { .. }
        );
        if self.published_hold && live {
            self.end(EndKind::Released, now.mono, now);
            self.events.push_back(Event::Released);
        } else {
            self.end(EndKind::Abandoned, now.mono, now);
        }
    }

    /// The answer (or failure) for transmit `id`, with the version the request was built for.
    pub fn handle_response(
        &mut self,
        id: u64,
        result: Result<(Response, i16), F>,
        view: &MemberView,
        now: Now,
    ) {
        let result = result.map_err(Failure::Unanswered);
        if self.in_flight.metadata == Some(id) {
            self.in_flight.metadata = None;
            self.on_metadata(result, now);
        } else if self
            .in_flight
            .append
            .as_ref()
            .is_some_and(|(i, _)| *i == id)
        {
            let (_, sent) = self.in_flight.append.take().expect("checked");
            self.on_append(sent, result, view, now);
        } else if self.in_flight.poll == Some(id) {
            self.in_flight.poll = None;
            self.on_poll(result, now);
        } else if self.in_flight.commit.as_ref().is_some_and(|c| c.id == id) {
            let sent = self.in_flight.commit.take().expect("checked");
            self.on_commit(sent, result, view, now);
        } else {
            debug!(lock = %self.cfg.lock, id, "ignoring a ledger answer nobody waits for");
        }
        self.drive(view, now);
    }

    // ---- transitions -------------------------------------------------------------------------

    /// The hold, or the try at one, is over for `end`; it lasted until `ended`.
    fn end(&mut self, end: EndKind, ended: Instant, _now: Now) {
        self.poll = Poll::Off;
        let (attempt, token, since) = match &self.hold {
            HoldState::Appending { attempt, token, .. } => (*attempt, token.clone(), None),
            HoldState::Held {
                attempt,
                token,
                since,
            } => (*attempt, token.clone(), Some(*since)),
            HoldState::Waiting | HoldState::Ending { .. } => return,
        };
        // Its checkpoint read, in flight or done, is for a hold that will not begin.
        self.grant_read = None;
        self.hold = HoldState::Ending {
            attempt,
            token,
            since,
            ended,
            end,
        };
        // An ACQUIRED record not yet sent names no hold: it is not sent at all. One in flight
        // keeps its answer (`on_append`), and is not sent again.
        self.appends.retain(|a| a.purpose != Purpose::Acquired);
        // Checkpoints need the hold. One already sent waits for its answer: the broker may have
        // stored it while the hold was current.
        while let Some(op) = self.checkpoints.pop_front() {
            self.checkpoint_results.push_back((
                op.ticket,
                Err(LedgerError::NotHeld {
                    lock: self.cfg.lock.clone(),
                }
                .into()),
            ));
        }
    }

    /// Once the membership has ended (or `now_anyway`), the end record of a hold whose ACQUIRED
    /// offset is known.
    fn queue_end_record(&mut self, now_anyway: bool, now: Now) {
        if !(self.member_done || now_anyway) {
            return;
        }
        let HoldState::Ending {
            token,
            since,
            ended,
            end,
            ..
        } = &self.hold
        else {
            return;
        };
        let Some(offset) = token.ledger_offset else {
            return;
        };
        let held_ms = since.map_or(0, |s| ended.saturating_duration_since(s).as_millis() as u64);
        let kind = match end {
            EndKind::Released => RecordKind::Released { held_ms },
            EndKind::Lost(reason, detail) => RecordKind::Lost {
                held_ms,
                reason: reason.as_str().to_owned(),
                detail: detail.clone(),
            },
            EndKind::Abandoned => RecordKind::Lost {
                held_ms: 0,
                reason: LossReason::Ledger.as_str().to_owned(),
                detail: "the acquire was abandoned before the ACQUIRED record was acknowledged; \
                         this offset names no hold"
                    .to_owned(),
            },
        };
        let token = token.clone();
        let batch = self.record_batch(&token, offset, kind, now);
        self.appends.push_back(Append {
            purpose: Purpose::End,
            batch,
            deadline: now.mono + self.cfg.request_timeout,
            attempt: None,
            ticket: None,
        });
        // Written once: the state keeps the offset, but the record is queued now.
        if let HoldState::Ending { token, .. } = &mut self.hold {
            token.ledger_offset = None;
        }
    }

    fn record_batch(&self, token: &FencingToken, hold: i64, kind: RecordKind, now: Now) -> Bytes {
        let value = LedgerRecord {
            unix_ms: now.unix_ms,
            hold,
            generation: token.generation,
            member_id: token.member_id.clone(),
            label: self.cfg.label.clone(),
            host: self.cfg.host.clone(),
            pid: self.cfg.pid,
            slot: self.slot,
            kind,
        }
        .encode();
        let record = NewRecord {
            timestamp: now.unix_ms,
            key: Some(Bytes::copy_from_slice(self.cfg.lock.as_bytes())),
            value: Some(value),
            headers: Vec::new(),
        };
        let mut out = BytesMut::new();
        // One small record always fits the format's 32-bit lengths.
        encode_batch(&[record], &mut out).expect("a ledger record is far below the batch limits");
        out.freeze()
    }

    /// How long a checkpoint's commit is tried: one the broker holds to its bound, and retries
    /// for a request timeout after that.
    fn checkpoint_window(&self) -> Duration {
        parked_timeout(BROKER_COMMIT_TIMEOUT, self.cfg.request_timeout)
            .saturating_add(self.cfg.request_timeout)
    }

    fn tp(&self) -> TopicPartition {
        let tp = TopicPartition::new(self.cfg.topic.clone(), 0);
        match &self.partition {
            Some(p) => tp.with_topic_id(p.topic_id),
            None => tp,
        }
    }

    fn wants_leader(&self) -> bool {
        !self.appends.is_empty() || matches!(self.poll, Poll::At(_))
    }

    fn push(&mut self, target: Target, op: Op, timeout: Duration) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.transmits.push_back(Transmit {
            id,
            target,
            op,
            timeout,
        });
        id
    }

    fn forget_leader(&mut self, now: Now) {
        if self.partition.take().is_some() {
            info!(lock = %self.cfg.lock, topic = %self.cfg.topic, "ledger leader changed or unreachable; looking it up again");
        }
        self.metadata_retry_at = Some(now.mono + self.backoff.next_delay());
    }

    fn drive(&mut self, view: &MemberView, now: Now) {
        self.expire(view, now);
        self.send_metadata(now);
        if let Some(p) = self.partition.clone() {
            self.send_append(&p, view, now);
            self.send_poll(&p, now);
        }
        self.drive_checkpoints(view, now);
        self.settle(now);
    }

    /// Gives up what ran out of time.
    fn expire(&mut self, view: &MemberView, now: Now) {
        // An ACQUIRED append that did not make it in time: the hold never begins.
        // Once it is acknowledged, only the lease bounds the wait for the checkpoint read, whose
        // requests are bounded themselves.
        if let HoldState::Appending {
            deadline, token, ..
        } = &self.hold
        {
            if token.ledger_offset.is_none() && now.mono >= *deadline {
                warn!(lock = %self.cfg.lock, topic = %self.cfg.topic,
                      "the ledger did not acknowledge the ACQUIRED record in time; giving the lock up");
                self.give_up_hold(view, now);
            }
        }
        // Appends that ran out of time are dropped (an end record is best effort; a checkpoint
        // whose copy is dropped is not reported stored).
        while let Some(a) = self.appends.front() {
            if a.purpose != Purpose::Acquired && now.mono >= a.deadline {
                warn!(lock = %self.cfg.lock, topic = %self.cfg.topic, purpose = ?a.purpose,
                      "could not append a record to the ledger in time; it is missing from the history");
                let a = self.appends.pop_front().expect("front exists");
                self.not_copied(&a, "the ledger did not acknowledge it in time".into());
            } else {
                break;
            }
        }
    }

    /// Looks the ledger's leader up when an append or a poll needs it.
    fn send_metadata(&mut self, now: Now) {
        if self.partition.is_none()
            && self.wants_leader()
            && self.in_flight.metadata.is_none()
            && due(self.metadata_retry_at, now)
        {
            let id = self.push(
                Target::Any,
                Op::Metadata {
                    topic: self.cfg.topic.clone(),
                },
                self.cfg.request_timeout,
            );
            self.in_flight.metadata = Some(id);
            self.metadata_retry_at = None;
        }
    }

    /// Sends the next append to the leader `p`, one at a time, in order.
    fn send_append(&mut self, p: &Partition, view: &MemberView, now: Now) {
        // An ACQUIRED record goes out only while the membership holds and its lease runs: a
        // lease that ended a moment ago is reported to this machine after this call.
        let may_send = |a: &Append| {
            a.purpose != Purpose::Acquired
                || (view.holding && view.lease_end.is_some_and(|end| now.mono < end))
        };
        if self.in_flight.append.is_none() && due(self.append_retry_at, now) {
            if self.appends.front().is_some_and(may_send) {
                let a = self.appends.pop_front().expect("front exists");
                let op = Op::Produce {
                    tp: self.tp(),
                    batch: a.batch.clone(),
                    timeout: self.cfg.request_timeout,
                };
                let target = Target::Leader {
                    broker: p.leader.clone(),
                    lane: LeaderLane::Append,
                };
                // acks=all: the broker holds it up to the Produce's own timeout.
                let timeout = parked_timeout(self.cfg.request_timeout, self.cfg.request_timeout);
                let id = self.push(target, op, timeout);
                self.in_flight.append = Some((id, a));
            }
            // Sent, or waiting for the membership's news (which calls in again): either way
            // no retry time is left that would wake the machine for nothing.
            self.append_retry_at = None;
        }
    }

    /// Sends the waiter's next look at the ledger's end (push handover) to the leader `p`.
    fn send_poll(&mut self, p: &Partition, now: Now) {
        if let Poll::At(at) = self.poll {
            if self.in_flight.poll.is_none() && due(self.poll_retry_at, now) {
                // ListOffsets is answered at once, so it goes on the append lane, which it
                // opens for the ACQUIRED record this waiter may append later.
                let lane = match at {
                    None => LeaderLane::Append,
                    Some(_) => LeaderLane::Poll,
                };
                let target = Target::Leader {
                    broker: p.leader.clone(),
                    lane,
                };
                let (op, timeout) = match at {
                    None => (
                        Op::ListOffsets {
                            tp: self.tp(),
                            spec: OffsetSpec::Latest,
                        },
                        self.cfg.request_timeout,
                    ),
                    Some(offset) => (
                        Op::Fetch {
                            tp: self.tp(),
                            offset,
                            options: FetchOptions {
                                max_wait: self.cfg.poll_wait,
                                min_bytes: 1,
                                max_bytes: self.cfg.poll_max_bytes,
                                isolation: Isolation::ReadCommitted,
                            },
                        },
                        self.cfg.poll_wait + self.cfg.request_timeout,
                    ),
                };
                let id = self.push(target, op, timeout);
                self.in_flight.poll = Some(id);
                self.poll_retry_at = None;
            }
        }
    }

    /// Publishes the membership's last event once nothing of the hold is left to write.
    fn settle(&mut self, now: Now) {
        if self.terminal.is_none() {
            return;
        }
        self.queue_end_record(false, now);
        let end_pending = self.in_flight.append.is_some()
            || self.appends.iter().any(|a| a.purpose == Purpose::End);
        if !end_pending {
            if let Some(e) = self.terminal.take() {
                self.events.push_back(e);
            }
        }
    }

    /// The ACQUIRED record will not make it (deadline, or acknowledged after the lease end, or a
    /// fatal error): tell the users the lock is lost, and the membership to leave.
    fn give_up_hold(&mut self, view: &MemberView, now: Now) {
        let HoldState::Appending { .. } = self.hold else {
            return;
        };
        let lease_end = view.lease_end.unwrap_or(now.mono).min(now.mono);
        self.end(
            EndKind::Lost(
                LossReason::Ledger,
                "the ACQUIRED record was not acknowledged before the lease ended; this offset names no hold"
                    .to_owned(),
            ),
            now.mono,
            now,
        );
        self.events.push_back(Event::Lost {
            reason: LossReason::Ledger,
            lease_end,
        });
        self.commands.push_back(Command::Leave);
    }

    fn fail_hold(&mut self, error: Failure<F>, now: Now) {
        let HoldState::Appending { .. } = self.hold else {
            return;
        };
        warn!(lock = %self.cfg.lock, topic = %self.cfg.topic, %error, "the ledger refused the ACQUIRED record; giving the lock up");
        self.end(
            EndKind::Lost(LossReason::Fatal, error.to_string()),
            now.mono,
            now,
        );
        self.events.push_back(Event::Failed(error));
        self.commands.push_back(Command::Leave);
    }

    // ---- answers -----------------------------------------------------------------------------

    fn on_metadata(&mut self, result: Result<(Response, i16), Failure<F>>, now: Now) {
        let found = match result {
            Ok((Response::Metadata(r), _)) => {
                ledger_partition(&r, &self.cfg.topic).map_err(Failure::widen)
            }
            Ok((other, _)) => Err(Failure::Protocol(membership::wrong_answer(
                ApiKey::Metadata,
                other.api_key(),
            ))),
            Err(e) => Err(e),
        };
        match found {
            Ok(Some(p))
                if self
                    .topic_id
                    .is_some_and(|id| !p.topic_id.is_nil() && p.topic_id != id) =>
            {
                let e: Failure<F> = LedgerError::TopicReplaced {
                    topic: self.cfg.topic.clone(),
                }
                .into();
                warn!(lock = %self.cfg.lock, error = %e, "the ledger topic cannot serve");
                self.poll = Poll::Off;
                self.fail_hold(e, now);
                // Records of this process's holds would land among the new topic's tokens.
                for a in std::mem::take(&mut self.appends) {
                    self.not_copied(&a, "the ledger topic was deleted and created again".into());
                }
                self.metadata_retry_at = Some(now.mono + self.cfg.poll_wait);
            }
            Ok(Some(p)) => {
                debug!(lock = %self.cfg.lock, topic = %self.cfg.topic, leader = %p.leader, "ledger leader found");
                if self.topic_id.is_none() && !p.topic_id.is_nil() {
                    self.topic_id = Some(p.topic_id);
                }
                self.partition = Some(p);
                self.metadata_retry_at = None;
            }
            Ok(None) => self.metadata_retry_at = Some(now.mono + self.backoff.next_delay()),
            Err(e) if e.cannot_serve() => {
                // The topic is gone or was given other partitions: no hold can begin on it, and
                // waiters fall back to their heartbeats.
                warn!(lock = %self.cfg.lock, error = %e, "the ledger topic cannot serve");
                self.poll = Poll::Off;
                self.fail_hold(e, now);
                self.metadata_retry_at = Some(now.mono + self.cfg.poll_wait);
            }
            Err(e) => {
                debug!(lock = %self.cfg.lock, error = %e, "Metadata for the ledger failed");
                self.metadata_retry_at = Some(now.mono + self.backoff.next_delay());
            }
        }
    }

    fn on_append(
        &mut self,
        sent: Append,
        result: Result<(Response, i16), Failure<F>>,
        view: &MemberView,
        now: Now,
    ) {
        let try_state = self.try_of(&sent);
        match self.append_outcome(result) {
            Ok(appended) => self.on_appended(sent, try_state, appended, view, now),
            Err(e) => self.on_append_failed(sent, try_state, e, now),
        }
        // The end record waited for this answer, which told the offset (or that there is none).
        self.queue_end_record(false, now);
    }

    /// Which try the ACQUIRED record `sent` speaks for; `None` for other records.
    fn try_of(&self, sent: &Append) -> Option<Try> {
        sent.attempt.as_ref().map(|(attempt, _)| match &self.hold {
            HoldState::Appending { attempt: a, .. } if a == attempt => Try::Appending,
            HoldState::Ending { attempt: a, .. } if a == attempt => Try::Ending,
            _ => Try::Over,
        })
    }

    /// What a Produce answer says: where the batch landed, or why it did not.
    fn append_outcome(
        &self,
        result: Result<(Response, i16), Failure<F>>,
    ) -> Result<Appended, Failure<F>> {
        match result {
            Ok((Response::Produce(r), v)) => {
                produced(&r, &self.tp(), v).map_err(|e| log_error(None, e))
            }
            Ok((other, _)) => Err(Failure::Protocol(membership::wrong_answer(
                ApiKey::Produce,
                other.api_key(),
            ))),
            Err(e) => Err(e),
        }
    }

    /// The broker stored `sent` at `appended`.
    fn on_appended(
        &mut self,
        sent: Append,
        try_state: Option<Try>,
        appended: Appended,
        view: &MemberView,
        now: Now,
    ) {
        self.backoff.reset();
        let offset = appended.base_offset;
        if let Some(ticket) = sent.ticket {
            info!(lock = %self.cfg.lock, copy = offset, "checkpoint stored");
            self.checkpoint_results.push_back((ticket, Ok(())));
        }
        match (try_state, sent.attempt) {
            (Some(Try::Appending), _) => self.acquired_at(offset, view, now),
            // The end record will name it.
            (Some(Try::Ending), _) => {
                if let HoldState::Ending { token, .. } = &mut self.hold {
                    token.ledger_offset = Some(offset);
                }
            }
            // A try that is over and forgotten (eager mode went back to waiting): its
            // record names no hold, and a LOST record says so.
            (Some(Try::Over), Some((_, token))) => {
                info!(lock = %self.cfg.lock, offset, generation = token.generation,
                      "an earlier try's ACQUIRED record was acknowledged after that try ended; it names no hold");
                let batch = self.record_batch(
                    &token,
                    offset,
                    RecordKind::Lost {
                        held_ms: 0,
                        reason: LossReason::Ledger.as_str().to_owned(),
                        detail: "the try ended before the ACQUIRED record was \
                                 acknowledged; this offset names no hold"
                            .to_owned(),
                    },
                    now,
                );
                self.appends.push_back(Append {
                    purpose: Purpose::End,
                    batch,
                    deadline: now.mono + self.cfg.request_timeout,
                    attempt: None,
                    ticket: None,
                });
            }
            _ => {}
        }
    }

    /// `sent` was not stored: it is sent again, given up, or ends the try it was for.
    fn on_append_failed(&mut self, sent: Append, try_state: Option<Try>, e: Failure<F>, now: Now) {
        let purpose = sent.purpose;
        let leader_gone = match e.broker_code() {
            Some(code) => matches!(code.0, 3 | 5 | 6 | 56 | 74 | 75 | 100 | 103),
            None => e.is_retriable(),
        };
        if leader_gone {
            // The lookup waits out the backoff; the next append goes once it answers.
            self.forget_leader(now);
        }
        let try_over = try_state.as_ref().is_some_and(|t| *t != Try::Appending);
        if try_over {
            // Its try ended: the record would name no hold, so it is not sent again.
            // If this attempt did land, it lies before the end of that try.
            debug!(lock = %self.cfg.lock, error = %e,
                   "an ACQUIRED append failed after its try ended; not resending it");
        } else if e.is_retriable() {
            debug!(lock = %self.cfg.lock, error = %e, ?purpose, "ledger append failed; retrying");
            self.append_retry_at = (!leader_gone).then(|| now.mono + self.backoff.next_delay());
            self.appends.push_front(sent);
        } else if purpose == Purpose::Acquired {
            self.fail_hold(e, now);
        } else {
            warn!(lock = %self.cfg.lock, error = %e, ?purpose,
                  "the ledger refused a record; it is missing from the history");
            self.not_copied(&sent, e.to_string());
        }
    }

    /// `a` will not be appended; a checkpoint it copies fails, though its group has it.
    fn not_copied(&mut self, a: &Append, reason: String) {
        if let Some(ticket) = a.ticket {
            let e = LedgerError::CheckpointNotCopied {
                lock: self.cfg.lock.clone(),
                reason,
            };
            self.checkpoint_results.push_back((ticket, Err(e.into())));
        }
    }

    /// The ACQUIRED record of the try now appending is durable at `offset`.
    fn acquired_at(&mut self, offset: i64, view: &MemberView, now: Now) {
        let HoldState::Appending { token, .. } = &mut self.hold else {
            return;
        };
        token.ledger_offset = Some(offset);
        self.begin_when_ready(view, now);
    }

    /// The try appending begins its hold once its ACQUIRED record is acknowledged and its
    /// checkpoint read, if one was asked for, is done, provided the lease still runs now.
    fn begin_when_ready(&mut self, view: &MemberView, now: Now) {
        let HoldState::Appending {
            attempt,
            token,
            since,
            permit,
            ..
        } = &self.hold
        else {
            return;
        };
        let Some(offset) = token.ledger_offset else {
            return;
        };
        if matches!(&self.grant_read, Some((a, None)) if a == attempt) {
            debug!(lock = %self.cfg.lock, offset,
                   "ACQUIRED acknowledged; the hold begins once the checkpoint read is done");
            return;
        }
        let (attempt, token, since, permit) = (*attempt, token.clone(), *since, *permit);
        let lease_end = view.lease_end.filter(|end| view.holding && now.mono < *end);
        match lease_end {
            Some(lease_end) => {
                info!(lock = %self.cfg.lock, token = offset, generation = token.generation,
                      "lock acquired; the ledger token is the ACQUIRED record's offset");
                self.hold = HoldState::Held {
                    attempt,
                    token: token.clone(),
                    since,
                };
                self.published_hold = true;
                if let Some((a, Some(read))) = self.grant_read.take() {
                    if a == attempt {
                        self.granted.push_back(read);
                    }
                }
                self.events.push_back(Event::Acquired {
                    token,
                    lease_end,
                    permit,
                });
            }
            None => {
                warn!(lock = %self.cfg.lock, offset,
                      "the ACQUIRED record (or the checkpoint read) came in after the lease ended; it names no hold");
                self.give_up_hold(view, now);
            }
        }
    }

    fn on_poll(&mut self, result: Result<(Response, i16), Failure<F>>, now: Now) {
        let Poll::At(at) = self.poll else {
            return;
        };
        let tp = self.tp();
        let outcome: Result<Option<i64>, Failure<F>> = match (at, result) {
            (None, Ok((Response::ListOffsets(r), _))) => listed(&r, &tp)
                .map(Some)
                .map_err(|e| log_error(Some(Api::ListOffsets), e)),
            (Some(offset), Ok((Response::Fetch(r), v))) => match fetched(&r, &tp, v) {
                Ok(f) => Ok(Some(self.read_polled(offset, &f))),
                Err(e) => Err(log_error(Some(Api::Fetch), e)),
            },
            (_, Ok((other, _))) => Err(Failure::Protocol(format!(
                "unexpected {:?} answer to the ledger's long poll",
                other.api_key()
            ))),
            (_, Err(e)) => Err(e),
        };
        match outcome {
            Ok(next) => {
                if at.is_none() {
                    // A release recorded before this position was found is not in any Fetch
                    // from here; a heartbeat now catches it (the group is still rebalancing).
                    self.commands.push_back(Command::HeartbeatNow);
                }
                self.poll_backoff.reset();
                self.poll = Poll::At(next);
                self.poll_retry_at = None;
            }
            Err(Failure::Unanswered(e)) if e.bad_frame().is_some() => {
                let cause = e.bad_frame().expect("checked");
                // An answer too large for any frame we accept (a batch above even
                // LEDGER_MAX_FRAME_SIZE): every Fetch from here would fail the same way, so the
                // poll starts again from the end. Heartbeats still tell of a release.
                warn!(lock = %self.cfg.lock, topic = %self.cfg.topic, error = %cause,
                      "a ledger batch too large to read; the long poll goes on from the ledger's end \
                       (cap the topic's max.message.bytes)");
                self.poll = Poll::At(None);
                self.poll_retry_at = Some(now.mono + self.poll_backoff.next_delay());
            }
            Err(e) => {
                debug!(lock = %self.cfg.lock, error = %e, "ledger long poll failed");
                match e.broker_code() {
                    Some(code) if code.0 == 1 => self.poll = Poll::At(None),
                    Some(code) if matches!(code.0, 3 | 5 | 6 | 74 | 75 | 100) => {
                        self.forget_leader(now)
                    }
                    _ if e.is_retriable() => self.forget_leader(now),
                    _ => {}
                }
                self.poll_retry_at = Some(now.mono + self.poll_backoff.next_delay());
            }
        }
    }

    /// Reads one long-poll answer from `offset`; returns where the next one starts.
    fn read_polled(&mut self, offset: i64, f: &crate::wire::log::Fetched) -> i64 {
        let mut batches: RecordBatches = f.batches();
        let mut next = offset;
        // The newest generation whose hold is seen ending, if any: an earlier try's LOST record
        // may be appended after a later hold's RELEASED, and only the newest can be the
        // waiter's own (the one that makes it rejoin at once).
        let mut news: Option<(i32, String)> = None;
        for batch in batches.by_ref() {
            match batch {
                Ok(b) => {
                    for r in &b.records {
                        if r.offset < offset || r.key.as_deref() != Some(self.cfg.lock.as_bytes()) {
                            continue;
                        }
                        if let Some(Ok(LedgerRecord {
                            kind: RecordKind::Released { .. } | RecordKind::Lost { .. },
                            generation,
                            member_id,
                            ..
                        })) = r.value.as_deref().map(LedgerRecord::decode)
                        {
                            if news.as_ref().is_none_or(|(g, _)| generation >= *g) {
                                news = Some((generation, member_id));
                            }
                        }
                    }
                }
                Err(BatchError::Compressed {
                    base_offset,
                    last_offset,
                    ..
                }) => {
                    if self.warned_at != Some(base_offset) {
                        warn!(lock = %self.cfg.lock, topic = %self.cfg.topic, base_offset,
                              "a compressed batch in the ledger cannot be read; set the topic's compression.type to producer");
                        self.warned_at = Some(base_offset);
                    }
                    next = next.max(last_offset.saturating_add(1));
                }
                Err(e) => {
                    // What cannot be read cannot be waited on: go on past it, or from the end
                    // when not even its length can be read.
                    warn!(lock = %self.cfg.lock, topic = %self.cfg.topic, error = %e, "unreadable ledger batch skipped");
                    if matches!(e, BatchError::BadLength { .. }) {
                        next = next.max(f.high_watermark);
                    }
                }
            }
        }
        if let Some(n) = batches.resume_offset() {
            next = next.max(n);
        }
        if next <= offset {
            // A first batch that did not arrive whole (a broker older than KIP-74, or one cut
            // by a size limit): no later Fetch from here gets further, so skip it.
            if let Some(end) = batches.truncated_end() {
                warn!(lock = %self.cfg.lock, topic = %self.cfg.topic, offset, end,
                      "a ledger batch too large to read was skipped; cap the topic's max.message.bytes");
                next = end;
            }
        }
        if let Some((generation, member_id)) = news {
            debug!(lock = %self.cfg.lock, generation, %member_id, "the ledger shows a hold ended");
            self.commands.push_back(Command::HoldEnded {
                generation,
                member_id,
            });
        }
        next
    }

    fn drive_checkpoints(&mut self, view: &MemberView, now: Now) {
        if self.in_flight.commit.is_some() {
            return;
        }
        let Some(op) = self.checkpoints.front() else {
            return;
        };
        if now.mono >= op.deadline {
            let op = self.checkpoints.pop_front().expect("front exists");
            let error = op.last_error.unwrap_or(Failure::Timeout {
                op: "storing the checkpoint (OffsetCommit)".into(),
                after: self.checkpoint_window(),
            });
            self.checkpoint_results.push_back((op.ticket, Err(error)));
            return;
        }
        if self.checkpoint_retry_at.is_some_and(|t| t > now.mono) {
            return;
        }
        let HoldState::Held { attempt, token, .. } = &self.hold else {
            // Still appending: the checkpoint waits for the hold to begin.
            if matches!(self.hold, HoldState::Appending { .. }) {
                return;
            }
            let op = self.checkpoints.pop_front().expect("front exists");
            self.checkpoint_results.push_back((
                op.ticket,
                Err(LedgerError::NotHeld {
                    lock: self.cfg.lock.clone(),
                }
                .into()),
            ));
            return;
        };
        let settled = view.holding && !view.awaiting_sync;
        let Some(coordinator) = view.coordinator.clone().filter(|_| settled) else {
            // The membership is finding the coordinator again, or is between the JoinGroup and
            // SyncGroup answers of a new generation (once the group is Stable, Apache's
            // ClassicGroup.validateOffsetCommit takes a commit from any member of the current
            // generation, holder or not); try shortly.
            self.checkpoint_retry_at = Some(now.mono + self.backoff.next_delay());
            return;
        };
        let (attempt, token) = (*attempt, token.clone());
        let request = Op::Commit {
            group: self.cfg.lock.clone(),
            generation: view.generation,
            member_id: view.member_id.clone(),
            tp: self.tp(),
            offset: token.ledger_offset.unwrap_or(0),
            metadata: op.value.clone(),
        };
        let timeout = parked_timeout(BROKER_COMMIT_TIMEOUT, self.cfg.request_timeout);
        let id = self.push(Target::Coordinator(coordinator), request, timeout);
        let op = self.checkpoints.pop_front().expect("front exists");
        self.in_flight.commit = Some(SentCommit {
            id,
            op,
            attempt,
            token,
        });
        self.checkpoint_retry_at = None;
    }

    fn on_commit(
        &mut self,
        sent: SentCommit<F>,
        result: Result<(Response, i16), Failure<F>>,
        view: &MemberView,
        now: Now,
    ) {
        let code = match result {
            Ok((Response::OffsetCommit(r), _)) => Ok(r
                .topics
                .iter()
                .flat_map(|t| &t.partitions)
                .find(|p| p.partition_index == 0)
                .map_or(-1, |p| p.error_code)),
            Ok((other, _)) => Err(Failure::Protocol(membership::wrong_answer(
                ApiKey::OffsetCommit,
                other.api_key(),
            ))),
            Err(e) => Err(e),
        };
        let SentCommit {
            mut op,
            attempt,
            token,
            ..
        } = sent;
        let error = match code {
            Ok(0) => None,
            Ok(-1) => Some(Failure::Protocol(
                "the OffsetCommit answer has no entry for the ledger partition".into(),
            )),
            Ok(c) => Some(Failure::broker(Api::OffsetCommit, KafkaCode(c), None)),
            Err(e) => Some(e),
        };
        match error {
            None => {
                // Stored under the hold it was sent with, even if that hold has ended since:
                // the broker checked the generation when it took it.
                debug!(lock = %self.cfg.lock, hold = token.ledger_offset,
                       "checkpoint committed; copying it into the ledger");
                let batch = self.record_batch(
                    &token,
                    token.ledger_offset.unwrap_or(0),
                    RecordKind::Checkpoint {
                        value: op.value.clone(),
                    },
                    now,
                );
                // Reported stored once the copy is acknowledged too (`on_append`).
                self.appends.push_back(Append {
                    purpose: Purpose::Checkpoint,
                    batch,
                    deadline: now.mono + self.cfg.request_timeout.saturating_mul(2),
                    attempt: None,
                    ticket: Some(op.ticket),
                });
            }
            Some(e) => {
                let fenced = e
                    .broker_code()
                    .is_some_and(|code| matches!(code.0, 22 | 25 | 82));
                let same_hold =
                    matches!(&self.hold, HoldState::Held { attempt: a, .. } if *a == attempt);
                let retry = match e.broker_code() {
                    // REBALANCE_IN_PROGRESS: the generation is completing; the holder keeps the
                    // lock through it (native mode) and the next try carries the new generation.
                    // ILLEGAL_GENERATION while the hold goes on: the group moved to a generation
                    // this member has not learned yet. The membership settles it (the heartbeat
                    // below) and the retry waits until a SyncGroup answer names us again at the
                    // new generation, or the hold ends and the checkpoint is NotHeld.
                    Some(code) => {
                        matches!(code.0, 7 | 14 | 15 | 16 | 27) || (code.0 == 22 && same_hold)
                    }
                    None => e.is_retriable(),
                };
                if retry && same_hold {
                    debug!(lock = %self.cfg.lock, error = %e, "checkpoint not stored yet; retrying");
                    if fenced {
                        self.commands.push_back(Command::HeartbeatNow);
                    }
                    op.last_error = Some(e);
                    self.checkpoint_retry_at = Some(now.mono + self.backoff.next_delay());
                    self.checkpoints.push_front(op);
                } else if retry {
                    // The hold ended while the checkpoint was on its way. A broker's refusal
                    // says it was not stored; no answer at all leaves that open.
                    let error = match e {
                        _ if e.broker_code().is_some() => LedgerError::NotHeld {
                            lock: self.cfg.lock.clone(),
                        },
                        other => LedgerError::CheckpointUnknown {
                            lock: self.cfg.lock.clone(),
                            reason: other.to_string(),
                        },
                    };
                    self.checkpoint_results
                        .push_back((op.ticket, Err(error.into())));
                } else {
                    if fenced {
                        warn!(lock = %self.cfg.lock, error = %e, generation = view.generation,
                              "the broker rejected the checkpoint: this member is no longer the current holder");
                        // The coordinator says our membership is gone; its next answer ends the hold.
                        self.commands.push_back(Command::HeartbeatNow);
                    }
                    self.checkpoint_results.push_back((op.ticket, Err(e)));
                }
            }
        }
    }
}

/// A log answer's complaint as the ledger reports it: a broker code under `api` (or the API the
/// answer names), anything else as a protocol error.
fn log_error<F>(api: Option<Api>, e: LogError) -> Failure<F> {
    match e {
        LogError::Broker {
            api: named,
            code,
            message,
        } => Failure::Broker {
            api: api.unwrap_or(Api::of(named)),
            code,
            message,
        },
        other => Failure::Protocol(other.to_string()),
    }
}

fn millis32(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// Decodes `data` as a ledger record and folds histories from it; the fuzz entry point (via the
/// `peer_bytes` target: ledger records come from other members). Asserts what the decoder
/// promises: whatever decodes re-encodes to the same bytes.
pub fn fuzz_ledger_bytes(data: &[u8]) {
    if let Ok(r) = LedgerRecord::decode(data) {
        assert_eq!(
            &r.encode()[..],
            data,
            "a decoded record re-encodes differently"
        );
    }
    // Cut the input into records at each zero byte, as a stream of one lock's values.
    let values: Vec<(i64, Option<&[u8]>)> = data
        .split(|b| *b == 0)
        .enumerate()
        .map(|(i, v)| (i as i64, (!v.is_empty()).then_some(v)))
        .collect();
    let h = fold(values.iter().copied(), 0, values.len() as i64);
    for w in h.holds.windows(2) {
        assert!(w[0].token < w[1].token, "holds out of token order");
    }
    let _ = h.since(i64::MIN);
    let _ = h.last_checkpoint();
}

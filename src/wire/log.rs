//! Produce, Fetch and ListOffsets on one partition of one topic: the requests that append a
//! record batch (acks=all), that read or long-poll a partition and that find where it begins
//! and ends, and what to take from their answers.
//!
//! Sans-I/O like the rest of `wire`: build a request here for the version the connection
//! negotiated, send it with [`encode_request_as`](super::codec::encode_request_as), decode the answer
//! with [`decode_response_frame`](super::codec::decode_response_frame) (which passes the
//! [guard](super::guard)), then read it with [`produced`], [`fetched`] or [`listed`]. The batches of a fetched
//! partition are read by [`records::RecordBatches`](super::records::RecordBatches).
//!
//! # Versions
//!
//! Produce v3–13, Fetch v4–18 and ListOffsets v1–10 (all that kafka-protocol 0.18 and Apache
//! Kafka 4.1 have in common). Produce v13 and Fetch v13+ name the topic by its id instead of its name (KIP-516): the
//! [`TopicPartition`] must then carry the id, which Metadata v10+ reports.
//!
//! # Sizes
//!
//! A Fetch answer must fit the connection's frame limit
//! ([`DEFAULT_MAX_FRAME_SIZE`](super::frame::DEFAULT_MAX_FRAME_SIZE), 1 MiB), so
//! [`FetchOptions::max_bytes`] stays well below it. A broker returns the first batch whole even
//! when it is larger than that (KIP-74), so a topic read here must not hold batches near the frame
//! limit; its `max.message.bytes` is the bound.
//!
//! # References
//! - KIP-516 (topic ids): <https://cwiki.apache.org/confluence/display/KAFKA/KIP-516%3A+Topic+Identifiers>
//! - KIP-74 (fetch sizes): <https://cwiki.apache.org/confluence/display/KAFKA/KIP-74%3A+Add+Fetch+Response+Size+Limit+in+Bytes>

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse,
    ProduceRequest, ProduceResponse,
};
use kafka_protocol::protocol::StrBytes;
pub use uuid::Uuid;

use super::records::RecordBatches;
use crate::wire::code::KafkaCode;

/// The first Produce and Fetch version that names topics by id (KIP-516).
pub const TOPIC_ID_VERSION: i16 = 13;

/// One partition of one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicPartition {
    /// The topic's name (Produce v3–12, Fetch v4–12).
    pub topic: StrBytes,
    /// The topic's id, nil when unknown (Produce v13, Fetch v13+ need it).
    pub topic_id: Uuid,
    /// The partition index.
    pub partition: i32,
}

impl TopicPartition {
    /// `partition` of the topic named `topic`, its id unknown.
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        TopicPartition {
            topic: StrBytes::from_string(topic.into()),
            topic_id: Uuid::nil(),
            partition,
        }
    }

    /// The same partition, with the topic's id.
    pub fn with_topic_id(mut self, topic_id: Uuid) -> Self {
        self.topic_id = topic_id;
        self
    }

    fn check(&self, api: ApiKey, version: i16) -> Result<(), LogError> {
        if version >= TOPIC_ID_VERSION && self.topic_id.is_nil() {
            return Err(LogError::TopicIdRequired { api, version });
        }
        Ok(())
    }

    /// Whether a response entry names this topic: by id from [`TOPIC_ID_VERSION`] on.
    fn is(&self, name: &StrBytes, id: &Uuid, version: i16) -> bool {
        if version >= TOPIC_ID_VERSION {
            *id == self.topic_id
        } else {
            *name == self.topic
        }
    }
}

/// Why a request could not be built or an answer holds no result for the partition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// The version names topics by id and the [`TopicPartition`] has none.
    #[error("{api:?} v{version} names topics by id, and the topic's id is not known; take it from a Metadata v10+ answer or use a lower version")]
    TopicIdRequired {
        /// The API.
        api: ApiKey,
        /// The version.
        version: i16,
    },
    /// The answer has no entry for the partition asked about.
    #[error("the {api:?} answer has no entry for {topic} partition {partition}; the broker answered a different request")]
    Missing {
        /// The API.
        api: ApiKey,
        /// The topic's name.
        topic: String,
        /// The partition.
        partition: i32,
    },
    /// The broker answered with an error code, for the whole request or for the partition.
    #[error("{api:?} failed: {code}{}", .message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Broker {
        /// The API.
        api: ApiKey,
        /// The error code.
        code: KafkaCode,
        /// The broker's message, if it sent one.
        message: Option<String>,
    },
}

impl LogError {
    fn missing(api: ApiKey, tp: &TopicPartition) -> Self {
        LogError::Missing {
            api,
            topic: tp.topic.to_string(),
            partition: tp.partition,
        }
    }
}

fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

/// A Produce request appending `batch` (one or more encoded record batches, see
/// [`encode_batch`](super::records::encode_batch)) to `tp`, shaped for `version`.
///
/// It always asks for acks=all (-1): the answer comes once every in-sync replica has the batch,
/// the only acknowledgement a ledger can build on. (acks=0 would get no answer at all, which a
/// request-response connection cannot wait for.) `timeout` is how long the broker may wait for
/// the replicas, saturated at `i32::MAX` milliseconds; the answer then says REQUEST_TIMED_OUT.
pub fn produce_request(
    tp: &TopicPartition,
    batch: Bytes,
    timeout: Duration,
    version: i16,
) -> Result<ProduceRequest, LogError> {
    tp.check(ApiKey::Produce, version)?;
    Ok(ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(millis(timeout))
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(tp.topic.clone().into())
            .with_topic_id(tp.topic_id)
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(tp.partition)
                .with_records(Some(batch))])]))
}

/// Where a Produce request's batch landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The offset of the batch's first record.
    pub base_offset: i64,
    /// The broker's append time when the topic uses `LogAppendTime`, else `None`.
    pub log_append_time: Option<i64>,
    /// The partition's first offset (v5+; -1 before).
    pub log_start_offset: i64,
}

/// The result for `tp` in a Produce answer decoded at `version`.
///
/// A partition error is `LogError::Broker` with the broker's message, or, when it sent none,
/// with the messages it gave for single records (v8+, e.g. for INVALID_RECORD).
pub fn produced(
    resp: &ProduceResponse,
    tp: &TopicPartition,
    version: i16,
) -> Result<Appended, LogError> {
    let api = ApiKey::Produce;
    let partition = resp
        .responses
        .iter()
        .filter(|t| tp.is(&t.name.0, &t.topic_id, version))
        .flat_map(|t| &t.partition_responses)
        .find(|p| p.index == tp.partition)
        .ok_or_else(|| LogError::missing(api, tp))?;
    if partition.error_code != 0 {
        let message = partition.error_message.as_ref().map(|m| m.to_string());
        let records = partition
            .record_errors
            .iter()
            .map(|e| match &e.batch_index_error_message {
                Some(m) => format!("record {}: {m}", e.batch_index),
                None => format!("record {}", e.batch_index),
            })
            .collect::<Vec<_>>();
        let message = message.or_else(|| (!records.is_empty()).then(|| records.join("; ")));
        return Err(LogError::Broker {
            api,
            code: KafkaCode(partition.error_code),
            message,
        });
    }
    Ok(Appended {
        base_offset: partition.base_offset,
        log_append_time: (partition.log_append_time_ms >= 0)
            .then_some(partition.log_append_time_ms),
        log_start_offset: partition.log_start_offset,
    })
}

/// Which records a Fetch may return.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isolation {
    /// Up to the high watermark: every record all in-sync replicas have.
    ReadUncommitted,
    /// Up to the last stable offset: not past a transaction still open. For a topic nobody
    /// writes to transactionally the two are the same.
    #[default]
    ReadCommitted,
}

/// How a Fetch waits and how much it may return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchOptions {
    /// How long the broker may park the request waiting for `min_bytes` (a long poll).
    pub max_wait: Duration,
    /// How many bytes of records make the broker answer before `max_wait`; 1 answers as soon as
    /// anything is there.
    pub min_bytes: i32,
    /// The most record bytes to return, for the whole answer and for the partition.
    pub max_bytes: i32,
    /// Which records may be returned.
    pub isolation: Isolation,
}

impl Default for FetchOptions {
    /// Half a second of long poll, an answer at the first byte, at most 256 KiB of records
    /// (a quarter of the default frame limit), read committed.
    fn default() -> Self {
        FetchOptions {
            max_wait: Duration::from_millis(500),
            min_bytes: 1,
            max_bytes: 256 * 1024,
            isolation: Isolation::ReadCommitted,
        }
    }
}

/// A Fetch request reading `tp` from `offset`, shaped for `version`.
///
/// It is a consumer's fetch (replica id -1) outside any fetch session (session 0, epoch -1, the
/// "full fetch, no session" pair): a one-partition long poll gains nothing from a session, and
/// sessions are a broker resource. The leader epoch is not checked (-1). A long poll
/// (`max_wait`) must end well before the connection's own request timeout.
pub fn fetch_request(
    tp: &TopicPartition,
    offset: i64,
    options: &FetchOptions,
    version: i16,
) -> Result<FetchRequest, LogError> {
    tp.check(ApiKey::Fetch, version)?;
    let isolation = match options.isolation {
        Isolation::ReadUncommitted => 0,
        Isolation::ReadCommitted => 1,
    };
    Ok(FetchRequest::default()
        .with_max_wait_ms(millis(options.max_wait))
        .with_min_bytes(options.min_bytes)
        .with_max_bytes(options.max_bytes)
        .with_isolation_level(isolation)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(tp.topic.clone().into())
            .with_topic_id(tp.topic_id)
            .with_partitions(vec![FetchPartition::default()
                .with_partition(tp.partition)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(options.max_bytes)])]))
}

/// What a Fetch answer holds for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The offset after the last record every in-sync replica has.
    pub high_watermark: i64,
    /// The offset after the last record not in an open transaction (-1 if the broker did not
    /// say).
    pub last_stable_offset: i64,
    /// The partition's first offset (-1 if the broker did not say).
    pub log_start_offset: i64,
    /// Transactions whose records in `records` were aborted, as (producer id, first offset).
    pub aborted_transactions: Vec<(i64, i64)>,
    /// The record batches, undecoded; shares the answer's buffer.
    pub records: Bytes,
}

impl Fetched {
    /// The batches of [`records`](Self::records).
    ///
    /// The first batch may begin before the offset fetched from (the broker sends whole batches),
    /// and the last may be cut off (see [`RecordBatches::truncated`]).
    pub fn batches(&self) -> RecordBatches {
        RecordBatches::new(self.records.clone())
    }
}

/// The result for `tp` in a Fetch answer decoded at `version`.
///
/// An error for the whole request (v7+) or for the partition is [`LogError::Broker`], e.g.
/// OFFSET_OUT_OF_RANGE or NOT_LEADER_OR_FOLLOWER.
pub fn fetched(
    resp: &FetchResponse,
    tp: &TopicPartition,
    version: i16,
) -> Result<Fetched, LogError> {
    let api = ApiKey::Fetch;
    if resp.error_code != 0 {
        return Err(LogError::Broker {
            api,
            code: KafkaCode(resp.error_code),
            message: None,
        });
    }
    let partition = resp
        .responses
        .iter()
        .filter(|t| tp.is(&t.topic.0, &t.topic_id, version))
        .flat_map(|t| &t.partitions)
        .find(|p| p.partition_index == tp.partition)
        .ok_or_else(|| LogError::missing(api, tp))?;
    if partition.error_code != 0 {
        return Err(LogError::Broker {
            api,
            code: KafkaCode(partition.error_code),
            message: None,
        });
    }
    Ok(Fetched {
        high_watermark: partition.high_watermark,
        last_stable_offset: partition.last_stable_offset,
        log_start_offset: partition.log_start_offset,
        aborted_transactions: partition
            .aborted_transactions
            .iter()
            .flatten()
            .map(|a| (a.producer_id.0, a.first_offset))
            .collect(),
        records: partition.records.clone().unwrap_or_default(),
    })
}

/// Which offset a ListOffsets request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    /// The partition's first offset (the log start: retention moves it forward).
    Earliest,
    /// The offset the next record will get, as far as the isolation level lets a reader see:
    /// the high watermark (read uncommitted) or the last stable offset (read committed).
    Latest,
}

impl OffsetSpec {
    /// The timestamp the protocol uses for it.
    fn timestamp(self) -> i64 {
        match self {
            OffsetSpec::Earliest => -2,
            OffsetSpec::Latest => -1,
        }
    }
}

/// A ListOffsets request asking for `spec` of `tp`, shaped for `version` (1–10). It names the
/// topic by name at every version; the leader epoch is not checked (-1). v1 has no isolation
/// level (it reads uncommitted), and only v10 carries `timeout` (for tiered storage reads).
pub fn list_offsets_request(
    tp: &TopicPartition,
    spec: OffsetSpec,
    isolation: Isolation,
    timeout: Duration,
    version: i16,
) -> ListOffsetsRequest {
    let isolation = match isolation {
        Isolation::ReadCommitted if version >= 2 => 1,
        _ => 0,
    };
    let timeout = if version >= 10 { millis(timeout) } else { 0 };
    ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(isolation)
        .with_timeout_ms(timeout)
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(tp.topic.clone().into())
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(tp.partition)
                .with_current_leader_epoch(-1)
                .with_timestamp(spec.timestamp())])])
}

/// The offset a ListOffsets answer gives for `tp`. A partition error is [`LogError::Broker`]
/// (NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, OFFSET_NOT_AVAILABLE...).
pub fn listed(resp: &ListOffsetsResponse, tp: &TopicPartition) -> Result<i64, LogError> {
    let api = ApiKey::ListOffsets;
    let partition = resp
        .topics
        .iter()
        .filter(|t| t.name.0 == tp.topic)
        .flat_map(|t| &t.partitions)
        .find(|p| p.partition_index == tp.partition)
        .ok_or_else(|| LogError::missing(api, tp))?;
    if partition.error_code != 0 {
        return Err(LogError::Broker {
            api,
            code: KafkaCode(partition.error_code),
            message: None,
        });
    }
    Ok(partition.offset)
}

#[cfg(test)]
#[path = "log_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "log_golden.rs"]
mod golden;

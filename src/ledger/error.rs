//! Why the ledger cannot be used, and the commands that set its topic right, which the errors
//! quote. Below the crate's `Error`, which wraps [`LedgerError`]; it needs nothing of the machine.

use crate::api::Api;

/// Why the ledger cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// The ledger topic does not exist. kafka-lock never creates it: a typo must not start a new
    /// ledger, whose offsets would start again at 0.
    #[error(
        "ledger topic {topic:?} does not exist; create it once with exactly one partition, e.g. \
         {create} (on a single broker: {single}; docs/design.md, \"The ledger\")",
        create = create_topic_command(.topic),
        single = SINGLE_BROKER_SETTINGS
    )]
    TopicMissing {
        /// The topic.
        topic: String,
    },
    /// The ledger topic has more or fewer than one partition: offsets of different partitions
    /// are unrelated, so they cannot be one token sequence.
    #[error(
        "ledger topic {topic:?} has {partitions} partitions; a ledger must have exactly one, \
         because offsets of different partitions are unrelated and could not be one sequence of \
         tokens; use a topic with one partition"
    )]
    NotOnePartition {
        /// The topic.
        topic: String,
        /// How many it has.
        partitions: usize,
    },
    /// The ledger topic's `compression.type` makes the broker recompress kafka-lock's records
    /// (anything but `producer` or `uncompressed`). kafka-lock writes and reads its own records
    /// uncompressed, so on such a topic history would list no holds, and push handover and the
    /// checkpoint copies would stop working without a word.
    #[error(
        "ledger topic {topic:?} has compression.type={codec}, so the broker recompresses \
         kafka-lock's records and they cannot be read back; set it with \
         {fix}",
        fix = compression_fix(.topic)
    )]
    Compressed {
        /// The topic.
        topic: String,
        /// The topic's setting.
        codec: String,
    },
    /// A checkpoint longer than the limit.
    #[error(
        "checkpoint is {len} bytes; the limit is {max} (the broker's offset.metadata.max.bytes, \
         4096 by default; raise both together if the broker allows more)"
    )]
    CheckpointTooLarge {
        /// Its length in bytes (UTF-8).
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A checkpoint holding a NUL character: it could be stored, but no holder could be given
    /// it in an environment variable (a C string), so it is refused before anything is sent.
    #[error(
        "checkpoint holds a NUL character at byte {at}; a checkpoint must be text without NUL, \
         since the next holder may receive it in an environment variable"
    )]
    CheckpointHasNul {
        /// The byte offset of the first NUL.
        at: usize,
    },
    /// A checkpoint was asked of a lock without a ledger.
    #[error("checkpoints are stored beside the ledger; set a ledger topic for lock {lock:?}")]
    NoLedger {
        /// The lock.
        lock: String,
    },
    /// A checkpoint was asked when the lock is not held (any more).
    #[error("lock {lock:?} is not held, so no checkpoint can be stored under it")]
    NotHeld {
        /// The lock.
        lock: String,
    },
    /// The hold ended while a checkpoint was on its way and no answer came: the broker may or
    /// may not have stored it (it checked the generation when the request arrived).
    #[error(
        "the hold on lock {lock:?} ended before the broker answered the checkpoint ({reason}); \
         it may or may not be stored: read it back before relying on either"
    )]
    CheckpointUnknown {
        /// The lock.
        lock: String,
        /// Why no answer came.
        reason: String,
    },
    /// The broker accepted the checkpoint's fenced commit, but its copy in the ledger could not
    /// be appended. It is not reported stored: the group's copy alone can be deleted or expire,
    /// and the last checkpoint would then read back older. Storing it again is safe.
    #[error(
        "the checkpoint of lock {lock:?} was committed to its group, but its copy in the ledger          could not be appended ({reason}); it is not reported stored, since the group's copy          alone can be deleted or expire and an older checkpoint would then read back: store it          again"
    )]
    CheckpointNotCopied {
        /// The lock.
        lock: String,
        /// Why the copy failed.
        reason: String,
    },
    /// The ledger topic was deleted and created again (its id changed) while this process used
    /// it: the new topic's offsets start again at 0, below tokens already given out.
    #[error(
        "ledger topic {topic:?} was deleted and created again while in use; its offsets start \
         again at 0, below tokens already given out, so this process stops using it"
    )]
    TopicReplaced {
        /// The topic.
        topic: String,
    },
    /// The broker does not offer an API the ledger needs.
    #[error("the broker offers no version of {api}, which the ledger needs; use Apache Kafka 2.8 or newer")]
    Unsupported {
        /// The API.
        api: Api,
    },
}

/// What follows `kafka-topics.sh --create --topic T` for a ledger topic: one partition, and the
/// settings docs/design.md ("The ledger") explains. The error for a missing topic, `history
/// --help` and the README give this same text (a test compares the README's).
pub const LEDGER_TOPIC_SETTINGS: &str = "--partitions 1 --replication-factor 3 \
     --config min.insync.replicas=2 --config unclean.leader.election.enable=false \
     --config cleanup.policy=delete --config retention.ms=7776000000 \
     --config compression.type=producer --config max.message.bytes=65536";

/// What replaces the replication settings of `LEDGER_TOPIC_SETTINGS` on a single broker (with
/// `min.insync.replicas=2` and one replica every append fails).
pub const SINGLE_BROKER_SETTINGS: &str = "--replication-factor 1 --config min.insync.replicas=1";

/// The command that creates `topic` as a ledger.
pub fn create_topic_command(topic: &str) -> String {
    format!("kafka-topics.sh --create --topic {topic} {LEDGER_TOPIC_SETTINGS}")
}

/// The command that gives `topic` a compression setting kafka-lock can read.
pub fn compression_fix(topic: &str) -> String {
    format!(
        "kafka-configs.sh --alter --entity-type topics --entity-name {topic} \
         --add-config compression.type=producer"
    )
}

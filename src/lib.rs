//! kafka-lock: a distributed lock with fencing tokens on Kafka's classic group protocol.
//!
//! Start at [`LockOptions`]: `LockOptions::new(bootstrap, name).acquire(wait)` gives a
//! [`LockGuard`] with the [`FencingToken`], a local lease, and `lost()` / `release()`.
//!
//! # Layout
//! - [`lock`]: the public API (options, guard, events, stats).
//! - [`describe`]: a lock seen from outside its group (holders, queue, generation).
//! - [`election`]: leader election on the lock ([`Election`]) and observers that never join
//!   ([`Observer`]).
//! - [`membership`]: the sans-I/O group membership state machine and the lease (diagram inside).
//! - [`ledger`]: the sans-I/O ledger (tokens that never go backwards, history, checkpoints, the
//!   waiters' long poll) and its record format.
//! - [`assign`]: member metadata and assignment bytes, the sticky-FIFO and consumer assignors.
//! - [`wire`]: sans-I/O framing, codecs with bounded decoding, version negotiation (no tokio).
//! - [`driver`]: the tokio side, the only place that owns sockets, tasks and clocks.
//! - [`backoff`]: jittered exponential backoff with an injectable random source.
//! - [`error`]: typed errors, Kafka error codes with retriable/fatal classification.
//! - [`metrics`]: the names of the metrics reported through the `metrics` facade.
//!
//! # Feature flags
//! - `cli` (default): builds the `kafka-lock` binary (clap, humantime, tracing-subscriber, rustix,
//!   the Prometheus exporter) and enables `metrics`. Library users turn default features off and
//!   compile none of it. The library never depends on C.
//! - `metrics`: reports acquisition latency, holds, hold lengths, rebalances while held and
//!   losses through the [`metrics`](https://docs.rs/metrics) facade ([`crate::metrics`] names them).
//!   On with `cli`, off for library users unless they ask; without it the code is not compiled.
#![deny(rustdoc::broken_intra_doc_links)]

pub mod assign;
pub mod backoff;
pub mod describe;
pub mod driver;
pub mod election;
pub mod error;
#[cfg(test)]
mod fuzz_replay;
pub mod ledger;
pub mod lock;
pub mod membership;
pub mod metrics;
pub mod wire;

pub use describe::{LockDescription, LockHolder, LockMember, LockState};
pub use election::{Election, Leader, Leadership, Observer};
pub use error::{Error, KafkaCode, Result};
pub use ledger::{History, Hold, HoldEnd, LedgerError};
pub use lock::{
    Checkpoint, CheckpointSource, FencingToken, HoldWatch, LockEvent, LockGuard, LockOptions,
    LockStats, LossReason, Release,
};

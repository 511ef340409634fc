//! kafka-lock: a distributed lock with fencing tokens on Kafka's classic group protocol.
//!
//! # Layout
//! - [`wire`]: sans-I/O framing and codecs for the group APIs (no tokio).
//! - [`error`]: typed errors, Kafka error codes with retriable/fatal classification.
//! - `driver`: the tokio side: broker connections, the only place that owns sockets and clocks.
#![deny(rustdoc::broken_intra_doc_links)]

pub mod assign;
pub mod backoff;
pub mod driver;
pub mod error;
#[cfg(test)]
mod fuzz_replay;
pub mod lock;
pub mod membership;
pub mod wire;

pub use error::{Error, KafkaCode, Result};
pub use lock::{FencingToken, LockEvent, LockGuard, LockOptions, LockStats, LossReason};

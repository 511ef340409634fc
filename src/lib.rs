//! kafka-lock: a distributed lock with fencing tokens on Kafka's classic group protocol.
//!
//! The lock's name is a consumer group's id; the group's leader hands the lock to exactly one
//! member per generation. kafka-lock speaks the protocol itself (no librdkafka, no C), holds a
//! lease on the local monotonic clock that ends before the broker can give the lock to anyone
//! else, and hands out a [`FencingToken`] that grows from holder to holder.
//!
//! # Quick start
//!
//! ```no_run
//! # use std::time::Duration;
//! # async fn write_report(_token: i64, _from: Option<String>) -> kafka_lock::Result<()> { Ok(()) }
//! # async fn run() -> kafka_lock::Result<()> {
//! let lock = kafka_lock::LockOptions::new("127.0.0.1:9092", "nightly-report")
//!     .ledger_topic("kafka-lock-ledger");    // one partition; kafka-lock never creates it
//! let guard = lock.acquire(Some(Duration::from_secs(60))).await?;
//! let token = guard.token().value();         // the ACQUIRED record's offset: only ever grows
//! let from = guard.last_checkpoint().await?.map(|c| c.value); // where the last holder got to
//! tokio::select! {
//!     r = write_report(token, from) => r?,   // the token fences late writes
//!     why = guard.lost() => panic!("lock lost: {why}"),
//! }
//! guard.checkpoint("2026-11-29").await?;     // refused by the broker if we are no longer the holder
//! guard.release().await?;                    // LeaveGroup, RELEASED; waiters take over at once
//! # Ok(()) }
//! ```
//!
//! Without a ledger the same works with `LockOptions::new(bootstrap, name)` alone; the token is
//! then the group generation (see below). `examples/` has runnable programs: `basic.rs`,
//! `fenced_write.rs` and `graceful_shutdown.rs`.
//!
//! [`LockOptions::acquire`] waits at most its `wait` for the lock, then at most the leave timeout
//! ([`LockOptions::leave_timeout`], default 2 s) for the coordinator to confirm that the waiter
//! left the group: it returns within `wait + leave_timeout`, plus scheduling delays. Connecting
//! to the cluster counts against the wait. [`LockOptions::try_acquire`] answers "busy" from one
//! DescribeGroups, without joining, when a stable group holds the lock (so probing does not
//! disturb the holder); otherwise it joins, answers once the first generation completes, then
//! leaves within the same leave timeout.
//!
//! # The fencing token
//!
//! A lock alone cannot stop a holder that was paused (a long GC, a stopped VM, a lost network)
//! from acting after its lease ran out and someone else took over. The [`FencingToken`] can: pass
//! [`FencingToken::value`] with every write to the resource the lock protects, and have the
//! resource remember the highest value it has accepted and reject writes that carry a lower one.
//! A late write from an old holder then fails instead of overwriting the new holder's work.
//! `examples/fenced_write.rs` shows such a store.
//!
//! With [`LockOptions::ledger_topic`] the token is the offset of the hold's ACQUIRED record in
//! the ledger topic: it never goes backwards, not even if the group is deleted. Without a ledger
//! it is the group generation, which grows only within one life of the group: Apache Kafka
//! deletes an empty group with no committed offsets after a while, and the next generation starts
//! again at 1. Use a ledger when the resource outlives the group.
//!
//! # Losing the lock
//!
//! A hold ends without a release when the lease runs out before a renewal, when the coordinator
//! fences the member, or when a rebalance hands the lock to someone else. The guard says so in
//! three ways: [`LockGuard::is_held`] reads the lease on the monotonic clock (it turns false on
//! time even if the background task is starved); [`LockGuard::lost`] resolves with the
//! [`LossReason`]; [`LockGuard::watch`] gives a [`HoldWatch`], cloneable and `Send`, that other
//! tasks can keep and await. Stop acting on the resource when any of them says so; the fencing
//! token covers the writes already in flight. `examples/graceful_shutdown.rs` stops a worker task
//! through a [`HoldWatch`] and releases on Ctrl-C.
//!
//! Dropping a [`LockGuard`] releases the lock at once, in the background: keep the guard alive
//! for as long as the work needs the lock, and prefer [`LockGuard::release`], which says whether
//! the coordinator confirmed the leave ([`Release`]).
//!
//! # Feature flags
//! - `cli` (default): builds the `kafka-lock` binary (clap, humantime, tracing-subscriber, rustix,
//!   the Prometheus exporter) and enables `metrics` and `tls`. `cli-base` is the same without
//!   `tls` (for targets where ring's C cannot be cross-compiled). Library users turn default features off and
//!   compile none of it. Without `tls` the library never depends on C.
//! - `metrics`: reports acquisition latency, holds, hold lengths, rebalances while held and
//!   losses through the [`metrics`](https://docs.rs/metrics) facade ([`crate::metrics`] names them).
//!   On with `cli`, off for library users unless they ask; without it the code is not compiled.
//! - `tls`: TLS to the brokers (`security.protocol` SSL and SASL_SSL) with rustls, tokio-rustls
//!   and the `ring` crypto provider, and Mozilla's roots (webpki-roots). On with `cli`. ring
//!   contains C and assembly: this feature is the only way C enters the build. SASL (PLAIN,
//!   SCRAM) needs no feature and is pure Rust.
//!
//! # Dependencies in the API
//!
//! kafka-lock is a tokio library: its futures need a tokio runtime with the time and I/O drivers
//! enabled, and [`LockOptions::events`] takes a `tokio::sync::mpsc::UnboundedSender`. tokio is a
//! deliberate public dependency; no other crate's types are part of the API. Kafka APIs are named
//! by [`Api`], this crate's own type.
//!
//! # What is stable
//!
//! The stable API is what these docs show: the items at the crate root, [`codec`] and
//! [`metrics`]. The crate also has a module these docs hide, `internals`: it is public only so
//! that the `kafka-lock` binary, the integration tests, the benchmarks and the fuzz targets can
//! reach the internals they need, it is **not part of the stable API**, and it may change in any
//! release.
#![deny(rustdoc::broken_intra_doc_links)]

mod api;
mod client;
pub mod codec;
mod error;
#[cfg(test)]
mod fuzz_replay;
pub mod metrics;

// Internal: every module below is private; the binary, the integration tests, the fuzz targets
// and the benchmark reach what they need of them through `internals` (see "What is stable"
// above). The stable items they define are re-exported below.
mod assign;
mod backoff;
mod config;
mod describe;
mod driver;
mod election;
mod group_view;
#[doc(hidden)]
pub mod internals;
mod ledger;
mod lock;
mod membership;
#[cfg(feature = "oauth")]
mod oauth;
mod security;
mod wire;

pub use api::Api;
pub use client::{
    Client, DEFAULT_ACQUISITIONS_AT_ONCE, DEFAULT_PARKING_LANES, DEFAULT_QUICK_CONNECTIONS,
};
pub use config::{ClientConfig, ConfigError, Timeouts};
pub use describe::{
    LedgerSummary, LockDescription, LockHolder, LockMember, LockProtocol, LockState,
};
pub use driver::{BootstrapAttempt, BootstrapError, DEFAULT_CONNECT_TIMEOUT};
pub use election::{
    Election, Leader, Leadership, ObserveVia, Observer, DEFAULT_LEDGER_WAIT, DEFAULT_MIN_TERM,
    DEFAULT_OBSERVE_INTERVAL, MIN_OBSERVE_INTERVAL,
};
pub use error::{Error, Result};
pub use ledger::{History, Hold, HoldEnd, LedgerError, Unreadable, DEFAULT_CHECKPOINT_MAX_BYTES};
pub use lock::{
    Checkpoint, CheckpointSource, FencingToken, HoldWatch, HolderInfo, LockEvent, LockGuard,
    LockOptions, LockStats, LossReason, Release, DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_LEASE_MARGIN,
    DEFAULT_LEAVE_TIMEOUT, DEFAULT_REBALANCE_TIMEOUT, DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_RETRY_BACKOFF, DEFAULT_RETRY_BACKOFF_MAX, DEFAULT_SESSION_TIMEOUT, MAX_SETTING,
};
#[cfg(feature = "oauth")]
pub use oauth::OAuthBearer;
pub use security::{
    AuthFailure, Pem, Sasl, SaslMechanism, SaslTokenProvider, Secret, Security, SecurityError,
    SecurityProtocol, Tls, TlsProvider, TokenFuture,
};
pub use wire::code::KafkaCode;
pub use wire::versions::VersionError;

/// The README's Rust example, compiled as a doctest exactly as the README shows it.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

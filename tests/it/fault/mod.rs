//! The fault-injection safety suite on real Apache Kafka: contenders on two locks (a native one
//! with ledger tokens, a consumer-compatible one with generation tokens) write to a fenced store while a seeded schedule of nemeses pauses, kills and cuts them off
//! and kills, pauses and slows the coordinator broker; the checker then looks for overlapping
//! holds and stale writes the store accepted. RELIABILITY.md has the figures of a long run and
//! what they mean.
//!
//! - [`checker`]: the fenced store, the event log and the analysis.
//! - [`kproxy`]: the Kafka-aware proxy that cuts one contender off (addresses rewritten in
//!   Metadata and FindCoordinator answers, so its traffic stays on its own proxies).
//! - [`nemesis`]: the nemeses and the seeded schedule.
//! - [`roles`]: the contender processes (this binary run again): the library contender, the
//!   broken one, and the job `kafka-lock run` runs.
//! - [`pool`]: keeps the contender slots filled, under the lifeline wrapper.
//! - [`suite`]: one run: cluster, self-test, episodes, analysis, report.
//!
//! `suite_ci` runs in the ordinary suite (scripts/test.sh): every nemesis once, a few minutes.
//! `suite_long` is the long mode for the documentation: `scripts/fault-suite.sh --long`.
//! Both take `KAFKA_LOCK_FAULT_SEED` and `KAFKA_LOCK_FAULT_EPISODES`.

mod checker;
pub(crate) mod kproxy;
mod nemesis;
mod pool;
mod roles;
mod suite;

use std::time::Duration;

/// Apache Kafka's minimum session timeout (`group.min.session.timeout.ms`): the shortest
/// failover, and so the most episodes per hour.
pub const SESSION: Duration = Duration::from_secs(6);
/// Well under a third of the lease, so one late heartbeat does not lose the lock.
pub const HEARTBEAT: Duration = Duration::from_millis(500);

/// CI mode: every nemesis at least once; fails on any overlap or accepted stale write, and if
/// the checker does not catch a contender that ignores its loss.
#[test]
fn suite_ci() {
    crate::support::init_tracing();
    suite::run(suite::Config::from_env(true));
}

/// The long mode (200 episodes by default, about half an hour): `scripts/fault-suite.sh --long`.
#[test]
#[ignore = "half an hour long; run by scripts/fault-suite.sh --long"]
fn suite_long() {
    crate::support::init_tracing();
    suite::run(suite::Config::from_env(false));
}

//! The locks' key figures through the [`metrics`](https://docs.rs/metrics) facade, with the
//! `metrics` feature: install any recorder (the `kafka-lock` CLI serves them in Prometheus text
//! format with `--metrics-listen`) and every lock taken in the process reports to it. Without
//! the feature nothing here is compiled but these names, and [`crate::LockStats`] stays the
//! recorder-free way to read the same figures.
//!
//! Every metric carries the label `lock` (the lock's name, which is the group id): keep the
//! number of distinct lock names per process small, as for any label.
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | [`ACQUIRE_SECONDS`] | histogram | `lock` | from the call to acquire to holding, per acquisition |
//! | [`HELD`] | gauge | `lock` | holds of the lock in this process now (0 or 1 for one contender) |
//! | [`HOLD_SECONDS`] | histogram | `lock` | how long each hold lasted, recorded when it ends |
//! | [`REBALANCES_WHILE_HELD`] | counter | `lock` | rebalances that began while the lock was held |
//! | [`LOSSES`] | counter | `lock`, `reason` | holds that ended without a release, by [`crate::LossReason::as_str`] |
//!
//! A histogram's count is the number of acquisitions (or ended holds), its sum the total time.
//! The loss counters of every reason and the gauge are registered at 0 when an acquisition
//! starts, so a scrape shows them before anything happened.

/// Histogram, seconds: acquisition latency, from the call to acquire to holding.
pub const ACQUIRE_SECONDS: &str = "kafka_lock_acquire_seconds";
/// Gauge: holds of the lock in this process at the moment.
pub const HELD: &str = "kafka_lock_held";
/// Histogram, seconds: the length of each hold, recorded when it ends (released, lost, or the
/// session gone).
pub const HOLD_SECONDS: &str = "kafka_lock_hold_seconds";
/// Counter: rebalances that began while the lock was held (each moves the generation on).
pub const REBALANCES_WHILE_HELD: &str = "kafka_lock_rebalances_while_held_total";
/// Counter: holds lost, labelled `reason` ([`LOSS_REASONS`]).
pub const LOSSES: &str = "kafka_lock_losses_total";
/// The label with the lock's name, on every metric.
pub const LOCK_LABEL: &str = "lock";
/// The label with the loss reason, on [`LOSSES`].
pub const REASON_LABEL: &str = "reason";
/// Every value of the `reason` label: [`crate::LossReason::as_str`] of each reason.
pub const LOSS_REASONS: [&str; 6] = [
    "lease_expired",
    "fenced",
    "reassigned",
    "revoked",
    "fatal",
    "ledger",
];

pub(crate) use imp::LockMetrics;

#[cfg(feature = "metrics")]
mod imp {
    use std::time::{Duration, Instant};

    use metrics::{Counter, Gauge, Histogram, Unit};

    use super::*;

    /// One session's reports. The session's event task owns it; a hold still open when it is
    /// dropped (the session ended without a release or loss event, or the runtime went away) is
    /// closed then, so the gauge never stays up for a hold that is over.
    pub(crate) struct LockMetrics {
        lock: String,
        acquire: Histogram,
        held: Gauge,
        hold: Histogram,
        rebalances: Counter,
        held_since: Option<Instant>,
    }

    impl LockMetrics {
        pub(crate) fn new(lock: &str) -> Self {
            // Described every time rather than once per process: a recorder installed after the
            // first lock would otherwise never learn the help texts.
            metrics::describe_histogram!(
                ACQUIRE_SECONDS,
                Unit::Seconds,
                "Time from the call to acquire to holding the lock"
            );
            metrics::describe_gauge!(HELD, "Holds of the lock in this process now");
            metrics::describe_histogram!(
                HOLD_SECONDS,
                Unit::Seconds,
                "Length of each hold of the lock, recorded when it ends"
            );
            metrics::describe_counter!(
                REBALANCES_WHILE_HELD,
                "Rebalances of the lock's group that began while it was held"
            );
            metrics::describe_counter!(
                LOSSES,
                "Holds of the lock that ended without a release, by reason"
            );
            let name = lock.to_owned();
            for reason in LOSS_REASONS {
                metrics::counter!(LOSSES, LOCK_LABEL => name.clone(), REASON_LABEL => reason)
                    .increment(0);
            }
            let held = metrics::gauge!(HELD, LOCK_LABEL => name.clone());
            held.increment(0.0);
            let rebalances = metrics::counter!(REBALANCES_WHILE_HELD, LOCK_LABEL => name.clone());
            rebalances.increment(0);
            LockMetrics {
                acquire: metrics::histogram!(ACQUIRE_SECONDS, LOCK_LABEL => name.clone()),
                hold: metrics::histogram!(HOLD_SECONDS, LOCK_LABEL => name.clone()),
                held,
                rebalances,
                lock: name,
                held_since: None,
            }
        }

        pub(crate) fn acquired(&mut self, latency: Duration) {
            self.acquire.record(latency.as_secs_f64());
            if self.held_since.is_none() {
                self.held.increment(1.0);
                self.held_since = Some(Instant::now());
            }
        }

        pub(crate) fn rebalance_while_held(&mut self) {
            self.rebalances.increment(1);
        }

        pub(crate) fn lost(&mut self, reason: &'static str) {
            metrics::counter!(LOSSES, LOCK_LABEL => self.lock.clone(), REASON_LABEL => reason)
                .increment(1);
            self.hold_ended();
        }

        pub(crate) fn released(&mut self) {
            self.hold_ended();
        }

        fn hold_ended(&mut self) {
            if let Some(since) = self.held_since.take() {
                self.held.decrement(1.0);
                self.hold.record(since.elapsed().as_secs_f64());
            }
        }
    }

    impl Drop for LockMetrics {
        fn drop(&mut self) {
            self.hold_ended();
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    use std::time::Duration;

    /// Without the feature: nothing, and calls to it compile to nothing.
    pub(crate) struct LockMetrics;

    impl LockMetrics {
        #[inline(always)]
        pub(crate) fn new(_lock: &str) -> Self {
            LockMetrics
        }
        #[inline(always)]
        pub(crate) fn acquired(&mut self, _latency: Duration) {}
        #[inline(always)]
        pub(crate) fn rebalance_while_held(&mut self) {}
        #[inline(always)]
        pub(crate) fn lost(&mut self, _reason: &'static str) {}
        #[inline(always)]
        pub(crate) fn released(&mut self) {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::LossReason;
    use crate::wire::code::KafkaCode;

    #[test]
    fn every_loss_reason_is_a_registered_label_value() {
        let all = [
            LossReason::LeaseExpired,
            LossReason::Fenced(KafkaCode(25)),
            LossReason::Reassigned,
            LossReason::Revoked,
            LossReason::Fatal,
            LossReason::Ledger,
        ];
        // A new reason must be added to this list and to LOSS_REASONS alike: the match fails to
        // compile first.
        for r in &all {
            match r {
                LossReason::LeaseExpired
                | LossReason::Fenced(_)
                | LossReason::Reassigned
                | LossReason::Revoked
                | LossReason::Fatal
                | LossReason::Ledger => {}
            }
            assert!(LOSS_REASONS.contains(&r.as_str()), "{}", r.as_str());
        }
        assert_eq!(all.len(), LOSS_REASONS.len());
    }

    /// A hold the session never reported the end of (the task dropped mid-hold) must not leave
    /// the gauge up.
    #[cfg(feature = "metrics")]
    #[test]
    fn the_held_gauge_follows_holds_and_falls_when_the_reports_stop() {
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::sync::Arc;
        use std::time::Duration;

        use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString};

        /// Keeps the value of the held gauge, ignores the rest.
        struct HeldOnly(Arc<AtomicU64>);
        impl Recorder for HeldOnly {
            fn describe_counter(&self, _: KeyName, _: Option<metrics::Unit>, _: SharedString) {}
            fn describe_gauge(&self, _: KeyName, _: Option<metrics::Unit>, _: SharedString) {}
            fn describe_histogram(&self, _: KeyName, _: Option<metrics::Unit>, _: SharedString) {}
            fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
                Counter::noop()
            }
            fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
                if key.name() == HELD {
                    Gauge::from_arc(self.0.clone())
                } else {
                    Gauge::noop()
                }
            }
            fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
                Histogram::noop()
            }
        }

        let held = Arc::new(AtomicU64::new(0));
        let value = || f64::from_bits(held.load(Ordering::SeqCst));
        let recorder = HeldOnly(held.clone());
        metrics::with_local_recorder(&recorder, || {
            let mut m = LockMetrics::new("l");
            assert_eq!(value(), 0.0);
            m.acquired(Duration::from_millis(5));
            assert_eq!(value(), 1.0);
            m.lost("fenced");
            assert_eq!(value(), 0.0);
            m.acquired(Duration::from_millis(5));
            assert_eq!(value(), 1.0);
            drop(m);
            assert_eq!(value(), 0.0);
        });
    }
}

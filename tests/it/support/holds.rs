//! Who held a lock, and when, judged from each holder's own events: the shared checker of the
//! tests that must show that nobody ever overlaps and that tokens only go up (Jepsen's
//! "lock-set" checker, on CLOCK_MONOTONIC so that Java and Python peers' intervals compare too).
//!
//! A hold starts when its `Acquired` event reaches the recorder and ends at the earlier of the
//! `Lost` event's lease end and its arrival, or at the `Released` event's arrival: the guard
//! itself stops claiming the lock at the lease end (`is_held` reads the clock), so that is when
//! the holder's belief ends even if the event is late. Stamping on arrival makes every interval
//! end late and start late by the same forwarding delay (microseconds on a quiet runtime), far
//! less than any handover, which always includes a broker round trip.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use kafka_lock::{LockEvent, LockOptions, LossReason};
use tokio::sync::mpsc;

use super::mono_ns;

/// One uninterrupted hold.
#[derive(Debug, Clone)]
pub struct Hold {
    /// Which contender (a test's own name for it).
    pub who: String,
    /// The generations it held under, in order: the acquisition's, then each kept through a
    /// rebalance.
    pub generations: Vec<i32>,
    /// CLOCK_MONOTONIC nanoseconds.
    pub start: i64,
    /// `None` while it lasts.
    pub end: Option<i64>,
    /// Why it ended, if it was lost rather than released.
    pub lost: Option<LossReason>,
    /// Its permit slot (0 for a mutex and for external holders).
    pub permit: u16,
}

impl Hold {
    fn end_or_max(&self) -> i64 {
        self.end.unwrap_or(i64::MAX)
    }
}

/// The holds of one lock, by every contender recorded here.
#[derive(Clone, Default)]
pub struct Holds {
    log: Arc<Mutex<Vec<Hold>>>,
}

impl Holds {
    pub fn new() -> Holds {
        Holds::default()
    }

    /// `options` whose events are recorded here under `who`, and passed on to the returned
    /// receiver for the test to wait on.
    pub fn record(
        &self,
        who: &str,
        options: LockOptions,
    ) -> (LockOptions, mpsc::UnboundedReceiver<LockEvent>) {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (live_tx, live) = mpsc::unbounded_channel();
        let (log, who) = (self.log.clone(), who.to_owned());
        tokio::spawn(async move {
            let mut open: Option<usize> = None;
            while let Some(e) = rx.recv().await {
                let now = mono_ns();
                {
                    let mut log = log.lock().unwrap();
                    match &e {
                        LockEvent::Acquired { token, permit, .. } => {
                            log.push(Hold {
                                who: who.clone(),
                                generations: vec![token.generation],
                                start: now,
                                end: None,
                                lost: None,
                                permit: *permit,
                            });
                            open = Some(log.len() - 1);
                        }
                        LockEvent::TokenChanged { token } => {
                            if let Some(i) = open {
                                log[i].generations.push(token.generation);
                            }
                        }
                        LockEvent::Lost { reason, lease_end } => {
                            if let Some(i) = open.take() {
                                log[i].end = Some(now.min(instant_ns(*lease_end)));
                                log[i].lost = Some(reason.clone());
                            }
                        }
                        LockEvent::Released | LockEvent::Left => {
                            if let Some(i) = open.take() {
                                log[i].end = Some(now);
                            }
                        }
                        _ => {}
                    }
                }
                let _ = live_tx.send(e);
            }
        });
        (options.events(tx), live)
    }

    /// A hold seen from outside the library (a Java or librdkafka peer's own callbacks).
    pub fn add_external(&self, who: &str, start: i64, end: i64, generation: Option<i32>) {
        self.log.lock().unwrap().push(Hold {
            who: who.to_owned(),
            generations: generation.into_iter().collect(),
            start,
            end: (end != i64::MAX).then_some(end),
            lost: None,
            permit: 0,
        });
    }

    /// Every hold so far, in order of start.
    pub fn holds(&self) -> Vec<Hold> {
        let mut holds = self.log.lock().unwrap().clone();
        holds.sort_by_key(|h| h.start);
        holds
    }

    /// [`Holds::check`], once every hold recorded so far has ended: a `Released` event can reach
    /// the recorder just after `LockGuard::release` returned.
    ///
    /// # Panics
    /// When a hold is still open after `bound`, or on a violation.
    pub async fn check_when_ended(&self, bound: std::time::Duration) -> Vec<Hold> {
        self.wait_ended(bound).await;
        self.check()
    }

    async fn wait_ended(&self, bound: std::time::Duration) {
        let deadline = Instant::now() + bound;
        while self.holds().iter().any(|h| h.end.is_none()) {
            assert!(
                Instant::now() < deadline,
                "a hold never ended: {:#?}",
                self.holds()
            );
            // Polling the recorders' log: they run as tasks of their own.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Checks that no two holds overlap and that each hold's first generation is greater than
    /// every generation of every earlier hold; returns the holds.
    ///
    /// # Panics
    /// On a violation, with every hold.
    pub fn check(&self) -> Vec<Hold> {
        check_holds(self.holds())
    }

    /// The semaphore's checker: at no instant more than `permits` holds; per permit slot, no two
    /// holds overlap and each hold's first generation is greater than every generation of every
    /// earlier hold of that slot. Returns the holds.
    ///
    /// # Panics
    /// On a violation, with every hold.
    pub fn check_semaphore(&self, permits: u16) -> Vec<Hold> {
        let holds = self.holds();
        let most = max_concurrent(&holds);
        assert!(
            most <= usize::from(permits),
            "{most} holds at once with {permits} permits: {holds:#?}"
        );
        assert!(
            holds.iter().all(|h| h.permit < permits),
            "a permit slot out of range: {holds:#?}"
        );
        for slot in 0..permits {
            check_holds(holds.iter().filter(|h| h.permit == slot).cloned().collect());
        }
        holds
    }

    /// [`Holds::check_semaphore`], once every hold recorded so far has ended.
    pub async fn check_semaphore_when_ended(
        &self,
        permits: u16,
        bound: std::time::Duration,
    ) -> Vec<Hold> {
        self.wait_ended(bound).await;
        self.check_semaphore(permits)
    }
}

/// The largest number of holds that overlap at one instant (a hold's end is exclusive).
pub fn max_concurrent(holds: &[Hold]) -> usize {
    let mut edges: Vec<(i64, i32)> = holds
        .iter()
        .flat_map(|h| [(h.start, 1), (h.end_or_max(), -1)])
        .collect();
    // At equal times, ends before starts.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

/// No two of `holds` overlap, and tokens only go up; returns them.
fn check_holds(mut holds: Vec<Hold>) -> Vec<Hold> {
    holds.sort_by_key(|h| h.start);
    for (i, a) in holds.iter().enumerate() {
        if let Some(w) = a.generations.windows(2).find(|w| w[0] >= w[1]) {
            panic!(
                "{}'s token went from {} to {}: {holds:#?}",
                a.who, w[0], w[1]
            );
        }
        for b in &holds[i + 1..] {
            assert!(
                a.end_or_max() <= b.start,
                "{} and {} held the lock at once: {holds:#?}",
                a.who,
                b.who
            );
            if let (Some(last), Some(first)) = (a.generations.iter().max(), b.generations.first()) {
                assert!(
                        first > last,
                        "{} took the lock with token {first} after {} had held it with {last}: {holds:#?}",
                        b.who,
                        a.who
                    );
            }
        }
    }
    holds
}

/// An `Instant` as CLOCK_MONOTONIC nanoseconds: on Linux `Instant` reads that clock.
pub fn instant_ns(t: Instant) -> i64 {
    let (now, now_ns) = (Instant::now(), mono_ns());
    if t <= now {
        now_ns - (now - t).as_nanos() as i64
    } else {
        now_ns + (t - now).as_nanos() as i64
    }
}

#[test]
fn the_checker_catches_overlaps_and_tokens_that_do_not_increase() {
    let overlap = Holds::new();
    overlap.add_external("a", 0, 10, Some(1));
    overlap.add_external("b", 9, 20, Some(2));
    assert!(std::panic::catch_unwind(|| overlap.check()).is_err());

    let open = Holds::new();
    open.add_external("a", 0, i64::MAX, Some(1));
    open.add_external("b", 30, 40, Some(2));
    assert!(std::panic::catch_unwind(|| open.check()).is_err());

    let stale = Holds::new();
    stale.add_external("a", 0, 10, Some(3));
    stale.add_external("b", 10, 20, Some(3));
    assert!(std::panic::catch_unwind(|| stale.check()).is_err());

    let fine = Holds::new();
    fine.add_external("a", 0, 10, Some(3));
    fine.add_external("b", 10, 20, Some(4));
    fine.add_external("c", 25, i64::MAX, None);
    assert_eq!(fine.check().len(), 3);
}

#[test]
fn the_semaphore_checker_counts_holders_and_fences_per_slot() {
    let hold = |who: &str, start, end, generation, permit| Hold {
        who: who.to_owned(),
        generations: vec![generation],
        start,
        end: Some(end),
        lost: None,
        permit,
    };
    let two = Holds::new();
    two.log.lock().unwrap().extend([
        hold("a", 0, 10, 3, 0),
        hold("b", 5, 15, 3, 1),
        hold("c", 10, 20, 4, 0),
    ]);
    assert_eq!(two.check_semaphore(2).len(), 3);
    assert!(std::panic::catch_unwind(|| two.check()).is_err());
    // Three at once with two permits.
    let three = Holds::new();
    three.log.lock().unwrap().extend([
        hold("a", 0, 10, 3, 0),
        hold("b", 5, 15, 3, 1),
        hold("c", 9, 20, 4, 1),
    ]);
    assert!(std::panic::catch_unwind(|| three.check_semaphore(3)).is_err());
    assert!(std::panic::catch_unwind(|| three.check_semaphore(2)).is_err());
    // A slot's token going back.
    let back = Holds::new();
    back.log
        .lock()
        .unwrap()
        .extend([hold("a", 0, 10, 5, 1), hold("b", 10, 20, 4, 1)]);
    assert!(std::panic::catch_unwind(|| back.check_semaphore(2)).is_err());
}

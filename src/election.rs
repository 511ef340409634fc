//! Leader election on a lock, and observers that learn who leads without ever joining the group.
//!
//! Leadership *is* holding the lock: [`Election::campaign`] returns a [`LockGuard`] with the
//! lock's lease and fencing token, and everything a guard promises holds for a leader
//! ([`LockGuard::is_held`], [`LockGuard::lost`], fencing with [`LockGuard::token`]). Resigning is
//! [`LockGuard::release`]; campaigning again is calling [`Election::campaign`] again. Terms that
//! end quickly delay the next campaign (doubling from [`Election::min_term`]), so a leader whose
//! work fails at once does not churn the group.
//!
//! ```no_run
//! # async fn run() -> kafka_lock::Result<()> {
//! use kafka_lock::{Election, LockOptions};
//! let mut election = Election::new(LockOptions::new("127.0.0.1:9092", "scheduler"));
//! loop {
//!     let leader = election.campaign().await?;
//!     println!("leading with token {}", leader.token());
//!     tokio::select! {
//!         reason = leader.lost() => println!("lost the leadership: {reason}"),
//!         _ = tokio::time::sleep(std::time::Duration::from_secs(60)) => {
//!             leader.release().await?; // resign
//!         }
//!     }
//! }
//! # }
//! ```
//!
//! An [`Observer`] ([`LockOptions::observer`]) reports the initial leadership and then every
//! change of leader, in order. It never joins the group, so it never causes a rebalance:
//!
//! - without a ledger it polls the coordinator with one DescribeGroups per
//!   [`Observer::interval`] (default [`DEFAULT_OBSERVE_INTERVAL`], at least
//!   [`MIN_OBSERVE_INTERVAL`]) on one kept connection; it reports a change at most one interval
//!   (plus a round trip) after the new leader's SyncGroup;
//! - with a ledger topic it follows the ledger with parked Fetches at the partition's leader
//!   (one every [`DEFAULT_LEDGER_WAIT`] when nothing happens, none at the coordinator) and reports
//!   a hold as soon as its ACQUIRED record is appended, which is before the holder uses the lock.
//!
//! Neither can see a change faster than the group makes it: a leader that dies is replaced only
//! after its session times out, and until then both report it.

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime};

use tracing::debug;

use crate::backoff::Backoff;
use crate::driver::describe::GroupWatch;
use crate::driver::ledger::LedgerTail;
use crate::error::Result;
use crate::group_view::{LockDescription, LockState};
use crate::ledger::{HoldEnd, LedgerRecord, RecordKind};
use crate::lock::{LockGuard, LockOptions};

/// How often an observer polls the coordinator by default.
pub const DEFAULT_OBSERVE_INTERVAL: Duration = Duration::from_secs(1);
/// The shortest poll interval an observer accepts: ten DescribeGroups a second per observer.
pub const MIN_OBSERVE_INTERVAL: Duration = Duration::from_millis(100);
/// How long a ledger observer's Fetch stays parked at the broker when nothing is appended.
pub const DEFAULT_LEDGER_WAIT: Duration = Duration::from_secs(5);
/// A term shorter than this delays the next campaign.
pub const DEFAULT_MIN_TERM: Duration = Duration::from_secs(1);
/// The longest delay before a campaign after short terms.
const MAX_TERM_BACKOFF: Duration = Duration::from_secs(60);

/// Campaigns for leadership of a lock, term after term.
#[derive(Debug)]
pub struct Election {
    opts: LockOptions,
    min_term: Duration,
    short_terms: Backoff,
    retry: Backoff,
    last_won: Option<Instant>,
}

impl Election {
    /// An election on the lock `opts` describes; its label is what observers show.
    pub fn new(opts: LockOptions) -> Self {
        let min_term = DEFAULT_MIN_TERM;
        let retry = Backoff::new(
            Duration::from_millis(200),
            Duration::from_secs(10),
            2.0,
            0.5,
        );
        Election {
            opts,
            min_term,
            short_terms: Backoff::new(min_term, MAX_TERM_BACKOFF, 2.0, 0.0),
            retry,
            last_won: None,
        }
    }

    /// A term that lasted less than `d` (from winning to the next [`Election::campaign`]) delays
    /// the next campaign by `d`, doubling with each further short term up to 60 s; a longer term
    /// resets it. Zero turns the delay off. Default [`DEFAULT_MIN_TERM`].
    pub fn min_term(mut self, d: Duration) -> Self {
        self.min_term = d;
        self.short_terms = Backoff::new(d, MAX_TERM_BACKOFF.max(d), 2.0, 0.0);
        self
    }

    /// The lock's options.
    pub fn options(&self) -> &LockOptions {
        &self.opts
    }

    /// Waits until this candidate leads, however long that takes, and returns the leadership.
    ///
    /// Errors the cluster may recover from (unreachable, coordinator moving) are retried with
    /// backoff; settings the lock or the broker refuses are returned. Dropping the future
    /// withdraws the candidate (its session leaves the group).
    pub async fn campaign(&mut self) -> Result<LockGuard> {
        if let Some(won) = self.last_won.take() {
            if !self.min_term.is_zero() && won.elapsed() < self.min_term {
                let delay = self.short_terms.next_delay();
                debug!(lock = %self.opts.name(), ?delay, "the last term was short; waiting before campaigning");
                tokio::time::sleep(delay).await;
            } else {
                self.short_terms.reset();
            }
        }
        loop {
            match self.opts.acquire(None).await {
                Ok(guard) => {
                    self.retry.reset();
                    self.last_won = Some(Instant::now());
                    return Ok(guard);
                }
                Err(e) if e.is_retriable() => {
                    debug!(lock = %self.opts.name(), error = %e, "campaign failed; trying again");
                    tokio::time::sleep(self.retry.next_delay()).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// How an observer learns of changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ObserveVia {
    /// DescribeGroups polls at the coordinator.
    Describe,
    /// Parked Fetches on the lock's ledger.
    Ledger,
}

impl ObserveVia {
    /// `describe` or `ledger`.
    pub fn as_str(self) -> &'static str {
        match self {
            ObserveVia::Describe => "describe",
            ObserveVia::Ledger => "ledger",
        }
    }
}

/// The leader as an observer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// Its member id.
    pub member_id: String,
    /// Its label.
    pub label: Option<String>,
    /// Its host: the address the coordinator sees, or the host name it wrote in the ledger.
    pub host: Option<String>,
    /// The generation that granted the leadership (native mode).
    pub generation: Option<i32>,
    /// The ledger token of its hold (ledger observers, and describing with a ledger).
    pub ledger_token: Option<i64>,
    /// When the leadership began on the leader's wall clock, in milliseconds since the Unix
    /// epoch (ledger observers only: from the ACQUIRED record).
    pub since_unix_ms: Option<i64>,
}

/// One observation: who leads, if anyone.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leadership {
    /// The leader, if the lock is held.
    pub leader: Option<Leader>,
    /// Held, free, rebalancing or unknown (only the first observation can be one of the last
    /// two: later ones are reported only once the group has settled).
    pub state: LockState,
    /// Why the state is unknown or rebalancing.
    pub reason: Option<String>,
    /// When the observer learned it.
    pub observed_at: SystemTime,
    /// How it learned it.
    pub via: ObserveVia,
}

impl Leadership {
    fn from_description(d: LockDescription) -> Self {
        let leader = d.holder().map(|h| Leader {
            member_id: h.member.member_id.clone(),
            label: h.member.label.clone(),
            host: Some(h.member.client_host.clone()).filter(|s| !s.is_empty()),
            generation: h.generation,
            ledger_token: h.ledger_token,
            since_unix_ms: None,
        });
        Leadership {
            leader,
            state: d.state,
            reason: d.reason,
            observed_at: SystemTime::now(),
            via: ObserveVia::Describe,
        }
    }

    fn settled(&self) -> bool {
        matches!(self.state, LockState::Held | LockState::Free)
    }

    /// What tells two leaderships apart: the ledger token where there is one (a new hold is a
    /// new record), else the member id (a leader that resigns and wins again rejoins with a new
    /// one).
    fn key(&self) -> Option<(String, Option<i64>)> {
        self.leader
            .as_ref()
            .map(|l| (l.member_id.clone(), l.ledger_token))
    }
}

impl LockOptions {
    /// An observer of the lock's leadership that never joins its group ([`Observer`]):
    /// DescribeGroups polls at most once per [`Observer::interval`], or, with a ledger topic,
    /// the ledger's records as they are appended. Options made by
    /// [`Client::lock`](crate::Client::lock) observe through the client's connections.
    pub fn observer(&self) -> Observer {
        Observer::new(self.clone())
    }
}

/// Reports who leads a lock and every change, without joining its group. Made by
/// [`LockOptions::observer`].
#[derive(Debug)]
pub struct Observer {
    opts: LockOptions,
    interval: Duration,
    ledger_wait: Duration,
    via: ObserveVia,
    group: Option<GroupWatchBox>,
    tail: Option<LedgerTail>,
    /// The ledger's current hold: the leader as the ledger tells it.
    current: Option<Leader>,
    pending: VecDeque<Leadership>,
    last: Option<Leadership>,
    next_poll: Option<tokio::time::Instant>,
    retry: Backoff,
}

/// Keeps `Observer: Debug` without making the driver's types so.
struct GroupWatchBox(GroupWatch);

impl std::fmt::Debug for GroupWatchBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupWatch")
    }
}

impl std::fmt::Debug for LedgerTail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LedgerTail")
    }
}

impl Observer {
    pub(crate) fn new(opts: LockOptions) -> Self {
        let via = if opts.ledger().is_some() {
            ObserveVia::Ledger
        } else {
            ObserveVia::Describe
        };
        Observer {
            opts,
            interval: DEFAULT_OBSERVE_INTERVAL,
            ledger_wait: DEFAULT_LEDGER_WAIT,
            via,
            group: None,
            tail: None,
            current: None,
            pending: VecDeque::new(),
            last: None,
            next_poll: None,
            retry: Backoff::new(Duration::from_millis(200), Duration::from_secs(5), 2.0, 0.5),
        }
    }

    /// The time between DescribeGroups polls; values below [`MIN_OBSERVE_INTERVAL`] are raised
    /// to it. Default [`DEFAULT_OBSERVE_INTERVAL`].
    pub fn interval(mut self, d: Duration) -> Self {
        self.interval = d.max(MIN_OBSERVE_INTERVAL);
        self
    }

    /// Poll the coordinator even though the lock has a ledger (by default a lock with a ledger
    /// is observed through it).
    pub fn via_describe(mut self) -> Self {
        self.via = ObserveVia::Describe;
        self
    }

    /// How this observer learns of changes.
    pub fn via(&self) -> ObserveVia {
        self.via
    }

    /// The first call returns the leadership as it is; each later call returns the next change
    /// of leader (or from a leader to none, or back), waiting as long as that takes.
    ///
    /// Errors: the first observation's, whatever they are; later, only errors the cluster
    /// cannot recover from (settings, a ledger topic that is gone); while the cluster is
    /// unreachable the observer keeps trying with backoff and reports nothing.
    pub async fn next(&mut self) -> Result<Leadership> {
        self.opts.validate()?;
        loop {
            if let Some(l) = self.pending.pop_front() {
                self.last = Some(l.clone());
                return Ok(l);
            }
            let observed = match self.via {
                ObserveVia::Describe => self.poll_group().await,
                ObserveVia::Ledger => self.poll_ledger().await,
            };
            if let Err(e) = observed {
                if self.last.is_none() || !e.is_retriable() {
                    return Err(e);
                }
                debug!(lock = %self.opts.name(), error = %e, "observing failed; trying again");
                tokio::time::sleep(self.retry.next_delay()).await;
            } else {
                self.retry.reset();
            }
        }
    }

    /// Queues `l` if it is the first observation or a settled change of leader.
    fn offer(&mut self, l: Leadership) {
        let before = self.pending.back().or(self.last.as_ref()).map(|b| b.key());
        match before {
            None => self.pending.push_back(l),
            Some(key) if l.settled() && key != l.key() => self.pending.push_back(l),
            Some(_) => {}
        }
    }

    async fn poll_group(&mut self) -> Result<()> {
        if let Some(at) = self.next_poll {
            tokio::time::sleep_until(at).await;
        }
        self.next_poll = Some(tokio::time::Instant::now() + self.interval);
        let watch = self.group.get_or_insert_with(|| {
            GroupWatchBox(GroupWatch::new(self.opts.reach(), self.opts.name()))
        });
        let d = watch.0.describe().await?;
        self.offer(Leadership::from_description(d));
        Ok(())
    }

    async fn poll_ledger(&mut self) -> Result<()> {
        let Some(topic) = self.opts.ledger().map(str::to_owned) else {
            return Err(crate::ledger::LedgerError::NoLedger {
                lock: self.opts.name().to_owned(),
            }
            .into());
        };
        let Some(tail) = &mut self.tail else {
            let history = self.opts.history().await?;
            self.current = history
                .last_hold()
                .filter(|h| h.end == HoldEnd::Open)
                .map(|h| Leader {
                    member_id: h.member_id.clone(),
                    label: h.label.clone(),
                    host: h.host.clone(),
                    generation: Some(h.generation),
                    ledger_token: Some(h.token),
                    since_unix_ms: h.acquired_unix_ms,
                });
            self.tail = Some(LedgerTail::new(
                self.opts.reach(),
                self.opts.name(),
                &topic,
                Some(history.end_offset),
            ));
            let l = self.ledger_leadership();
            self.offer(l);
            return Ok(());
        };
        let records = tail.poll(self.ledger_wait).await?;
        for (offset, record) in records {
            match record {
                Ok(r) => {
                    if self.apply(offset, r) {
                        let l = self.ledger_leadership();
                        self.offer(l);
                    }
                }
                Err(why) => {
                    debug!(lock = %self.opts.name(), offset, %why, "an unreadable ledger record is skipped")
                }
            }
        }
        Ok(())
    }

    /// Applies one of the lock's ledger records; whether the leader changed.
    fn apply(&mut self, offset: i64, r: LedgerRecord) -> bool {
        match r.kind {
            RecordKind::Acquired { .. } => {
                self.current = Some(Leader {
                    member_id: r.member_id,
                    label: r.label,
                    host: r.host,
                    generation: Some(r.generation),
                    ledger_token: Some(offset),
                    since_unix_ms: Some(r.unix_ms),
                });
                true
            }
            RecordKind::Released { .. } | RecordKind::Lost { .. } => {
                let ends_current = self
                    .current
                    .as_ref()
                    .is_some_and(|c| c.ledger_token == Some(r.hold));
                if ends_current {
                    self.current = None;
                }
                ends_current
            }
            _ => false,
        }
    }

    fn ledger_leadership(&self) -> Leadership {
        Leadership {
            state: if self.current.is_some() {
                LockState::Held
            } else {
                LockState::Free
            },
            leader: self.current.clone(),
            reason: None,
            observed_at: SystemTime::now(),
            via: ObserveVia::Ledger,
        }
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        if let Some(g) = &mut self.group {
            g.0.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(id: &str, token: Option<i64>) -> Leader {
        Leader {
            member_id: id.into(),
            label: None,
            host: None,
            generation: Some(1),
            ledger_token: token,
            since_unix_ms: None,
        }
    }

    fn seen(state: LockState, leader: Option<Leader>) -> Leadership {
        Leadership {
            leader,
            state,
            reason: None,
            observed_at: SystemTime::now(),
            via: ObserveVia::Describe,
        }
    }

    #[test]
    fn campaigns_and_observations_can_move_between_threads() {
        fn is_send<T: Send>(_: &T) {}
        let mut o = LockOptions::new("127.0.0.1:1", "l").observer();
        is_send(&o.next());
        let mut e = Election::new(LockOptions::new("127.0.0.1:1", "l"));
        is_send(&e.campaign());
    }

    #[test]
    fn only_settled_changes_of_leader_are_reported_after_the_first() {
        let mut o = LockOptions::new("127.0.0.1:1", "l").observer();
        o.offer(seen(LockState::Rebalancing, None));
        assert_eq!(
            o.pending.len(),
            1,
            "the first observation is always reported"
        );
        o.offer(seen(LockState::Rebalancing, None));
        o.offer(seen(LockState::Unknown, Some(leader("a", None))));
        assert_eq!(o.pending.len(), 1);
        o.offer(seen(LockState::Held, Some(leader("a", None))));
        o.offer(seen(LockState::Held, Some(leader("a", None))));
        assert_eq!(o.pending.len(), 2);
        o.offer(seen(LockState::Held, Some(leader("b", None))));
        o.offer(seen(LockState::Free, None));
        o.offer(seen(LockState::Free, None));
        assert_eq!(o.pending.len(), 4);
    }

    #[test]
    fn ledger_records_move_the_leader_and_stale_ends_do_not() {
        let mut o = LockOptions::new("127.0.0.1:1", "l").observer();
        let rec = |kind, hold, member: &str| LedgerRecord {
            unix_ms: 1,
            hold,
            generation: 2,
            member_id: member.into(),
            label: None,
            host: None,
            pid: None,
            slot: 0,
            kind,
        };
        assert!(o.apply(10, rec(RecordKind::Acquired { lease_ms: 1000 }, -1, "a")));
        assert!(o.apply(11, rec(RecordKind::Acquired { lease_ms: 1000 }, -1, "b")));
        // a's hold ended after b's began (a died, its LOST was written late): b still leads.
        assert!(!o.apply(
            12,
            rec(
                RecordKind::Lost {
                    held_ms: 1,
                    reason: "x".into(),
                    detail: String::new()
                },
                10,
                "a"
            )
        ));
        assert_eq!(o.current.as_ref().unwrap().member_id, "b");
        assert!(o.apply(13, rec(RecordKind::Released { held_ms: 1 }, 11, "b")));
        assert!(o.current.is_none());
        let _ = leader("x", Some(1));
    }
}

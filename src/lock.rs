//! The public lock API: [`LockOptions`] → [`LockGuard`].
//!
//! ```no_run
//! # async fn run() -> kafka_lock::Result<()> {
//! use std::time::Duration;
//! let guard = kafka_lock::LockOptions::new("127.0.0.1:9092", "nightly-report")
//!     .acquire(Some(Duration::from_secs(60)))
//!     .await?;
//! println!("holding with fencing token {}", guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! With a ledger topic ([`LockOptions::ledger_topic`]) the token is the offset of the hold's
//! record in the ledger, which never goes backwards, and the lock has a history
//! ([`LockOptions::history`]) and a broker-fenced checkpoint ([`LockGuard::checkpoint`]):
//!
//! ```no_run
//! # async fn run() -> kafka_lock::Result<()> {
//! use std::time::Duration;
//! let lock = kafka_lock::LockOptions::new("127.0.0.1:9092", "nightly-report")
//!     .ledger_topic("kafka-lock-ledger");
//! let guard = lock.acquire(Some(Duration::from_secs(60))).await?;
//! let resume_from = guard.last_checkpoint().await?.map(|c| c.value);
//! // ... work, fencing writes with guard.token() ...
//! guard.checkpoint("processed up to 2026-11-29").await?; // rejected by the broker if stale
//! guard.release().await?;
//! # let _ = resume_from; Ok(()) }
//! ```
//!
//! While a [`LockGuard`] lives, a background task heartbeats for it; user code never blocks
//! renewals. [`LockGuard::is_held`] reads the local lease on the monotonic clock directly, so it
//! turns false on time even if that task is starved. [`LockGuard::lost`] resolves when the hold
//! ends for any reason other than release.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
use kafka_protocol::messages::{ApiKey, TopicName};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::{mpsc, watch};

use crate::backoff::Backoff;
use crate::driver::ledger::Reach;
use crate::driver::session::{
    self, End, EventSink, Places, SessionCommand, SessionEvent, SessionHandle, SessionParams,
    SessionState,
};
use crate::driver::{BootstrapConfig, ConnConfig, Connection};
use crate::error::{Error, KafkaCode, Result};
use crate::ledger::{History, Ledger, LedgerConfig, LedgerError};
use crate::membership::{Command, Event, GroupVersions, Membership, MembershipConfig, Mode};
use crate::security::Security;
use crate::wire::Response;

pub use crate::ledger::{
    Checkpoint, CheckpointSource, DEFAULT_CHECKPOINT_MAX_BYTES, DEFAULT_POLL_MAX_BYTES,
    DEFAULT_POLL_WAIT,
};
pub use crate::membership::{FencingToken, HolderInfo, LossReason};

/// Default session timeout: long enough to ride out a broker hiccup, short enough that a crashed
/// holder is replaced within seconds (Apache Kafka's minimum is 6 s by default).
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// Default heartbeat interval: waiters learn of a release within one interval, and the holder's
/// lease is renewed ten times per session.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
/// Default rebalance timeout: equal to the session timeout, so it does not shorten the lease.
pub const DEFAULT_REBALANCE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default per-request timeout.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Default lease safety margin: the holder gives up this long before the broker could.
pub const DEFAULT_LEASE_MARGIN: Duration = Duration::from_secs(1);
/// Default first retry delay.
pub const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_millis(100);
/// Default largest retry delay.
pub const DEFAULT_RETRY_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Default bound on waiting for a LeaveGroup's answer (after a release, or when an acquire gives
/// up): a healthy coordinator answers in milliseconds; past this the call returns and the
/// session finishes leaving in the background.
pub const DEFAULT_LEAVE_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest any duration setting may be: Kafka's `i32` milliseconds (about 24.8 days).
pub const MAX_SETTING: Duration = Duration::from_millis(i32::MAX as u64);

/// What happened to a lock attempt, for callers that want to watch (the CLI prints these).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LockEvent {
    /// Queued behind `holder` (None: no holder yet), at `position` (1 = next; -1 unknown).
    Waiting {
        /// Our own member id.
        member_id: String,
        /// The lock's holder as the assignment named it (with several permits, the holder of
        /// the lowest occupied slot).
        holder: Option<HolderInfo>,
        /// Every holder the assignment named, by ascending permit slot (native mode).
        holders: Vec<HolderInfo>,
        /// Place in the queue.
        position: i32,
    },
    /// The lock is held.
    Acquired {
        /// The fencing token.
        token: FencingToken,
        /// Our member id.
        member_id: String,
        /// The permit slot held, `0..permits` (always 0 for a mutex).
        permit: u16,
    },
    /// Still held after a rebalance, under a new token.
    TokenChanged {
        /// The new token.
        token: FencingToken,
    },
    /// The hold ended without a release.
    Lost {
        /// Why.
        reason: LossReason,
        /// When the lease ran out (may be before the event if the process was paused).
        lease_end: Instant,
    },
    /// Released by the user.
    Released,
    /// The group membership has ended (LeaveGroup done or not needed).
    Left,
}

/// Counters for one [`LockOptions`] (and every guard it made).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct LockStats {
    /// Successful acquisitions.
    pub acquisitions: u64,
    /// Acquisition latency (from the call to acquire to holding), 50th percentile.
    pub acquisition_p50: Option<Duration>,
    /// Acquisition latency, 99th percentile.
    pub acquisition_p99: Option<Duration>,
    /// Rebalances that started while the lock was held.
    pub rebalances_while_held: u64,
    /// Losses by reason (`lease_expired`, `fenced`, `reassigned`, `revoked`, `fatal`).
    pub losses: Vec<(&'static str, u64)>,
}

#[derive(Debug, Default)]
struct StatsInner {
    acquisitions: u64,
    latencies: VecDeque<Duration>,
    rebalances_while_held: u64,
    losses: Vec<(&'static str, u64)>,
}

/// Enough samples for a stable p99 without growing forever.
const LATENCY_SAMPLES: usize = 1024;

impl StatsInner {
    fn snapshot(&self) -> LockStats {
        let mut sorted: Vec<Duration> = self.latencies.iter().copied().collect();
        sorted.sort();
        let pct = |p: f64| {
            if sorted.is_empty() {
                None
            } else {
                let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
                Some(sorted[i])
            }
        };
        LockStats {
            acquisitions: self.acquisitions,
            acquisition_p50: pct(0.50),
            acquisition_p99: pct(0.99),
            rebalances_while_held: self.rebalances_while_held,
            losses: self.losses.clone(),
        }
    }

    fn lost(&mut self, reason: &'static str) {
        match self.losses.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += 1,
            None => self.losses.push((reason, 1)),
        }
    }
}

/// How to take a lock: where the cluster is, the lock's name, and the timeouts.
#[derive(Debug, Clone)]
pub struct LockOptions {
    bootstrap: Vec<String>,
    name: String,
    mode: Mode,
    label: Option<String>,
    client_id: String,
    session_timeout: Duration,
    heartbeat_interval: Duration,
    rebalance_timeout: Duration,
    request_timeout: Duration,
    connect_timeout: Duration,
    retry_backoff: Duration,
    retry_backoff_max: Duration,
    lease_margin: Duration,
    leave_timeout: Duration,
    max_frame_size: usize,
    security: Security,
    ledger_topic: Option<String>,
    ledger_push: bool,
    checkpoint_max_bytes: usize,
    read_checkpoint_on_acquire: bool,
    permits: u16,
    events: Option<mpsc::UnboundedSender<LockEvent>>,
    stats: Arc<Mutex<StatsInner>>,
    /// The client whose connections the lock uses; `None`: connections of its own.
    client: Option<crate::client::Client>,
}

fn split_bootstrap(bootstrap: &str) -> Vec<String> {
    bootstrap
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

impl LockOptions {
    /// A lock named `name` (the group id) on the cluster reachable at `bootstrap`
    /// (`host:port[,host:port...]`), with defaults suited to locks.
    pub fn new(bootstrap: impl AsRef<str>, name: impl Into<String>) -> Self {
        LockOptions {
            bootstrap: split_bootstrap(bootstrap.as_ref()),
            name: name.into(),
            mode: Mode::Native,
            label: None,
            client_id: "kafka-lock".into(),
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            rebalance_timeout: DEFAULT_REBALANCE_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: crate::driver::DEFAULT_CONNECT_TIMEOUT,
            retry_backoff: DEFAULT_RETRY_BACKOFF,
            retry_backoff_max: DEFAULT_RETRY_BACKOFF_MAX,
            lease_margin: DEFAULT_LEASE_MARGIN,
            leave_timeout: DEFAULT_LEAVE_TIMEOUT,
            max_frame_size: crate::wire::DEFAULT_MAX_FRAME_SIZE,
            security: Security::default(),
            ledger_topic: None,
            ledger_push: true,
            checkpoint_max_bytes: DEFAULT_CHECKPOINT_MAX_BYTES,
            read_checkpoint_on_acquire: false,
            permits: 1,
            events: None,
            stats: Arc::default(),
            client: None,
        }
    }

    pub(crate) fn with_client(mut self, client: crate::client::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// What a pool of connections for these options is made with.
    pub(crate) fn pool_config(&self, parking_lanes: usize) -> crate::driver::pool::PoolConfig {
        crate::client::pool_config(
            self.bootstrap.clone(),
            self.conn_config(),
            self.bootstrap_limits(),
            (self.retry_backoff, self.retry_backoff_max),
            parking_lanes,
        )
    }

    /// The connections the lock uses, and whether they are its own (closed with its session).
    fn pool(&self) -> (Arc<crate::driver::pool::Pool>, bool) {
        match &self.client {
            Some(c) => (c.pool().clone(), false),
            None => (
                Arc::new(crate::driver::pool::Pool::new(
                    self.pool_config(crate::client::DEFAULT_PARKING_LANES),
                )),
                true,
            ),
        }
    }

    /// Uses `topic`, a topic with exactly one partition that kafka-lock never creates, as the
    /// lock's ledger (one topic can serve many locks; records are keyed by the lock's name):
    ///
    /// - a hold begins only once its ACQUIRED record is durable there (acks=all) and acknowledged
    ///   before the lease ends, and the [`FencingToken`] is that record's offset: it never goes
    ///   backwards, not even when the group is deleted (`docs/design.md`);
    /// - RELEASED and LOST records follow, so [`LockOptions::history`] can tell who held the
    ///   lock, when, for how long, and how it ended;
    /// - waiters long-poll the ledger and learn of a release at once (see
    ///   [`LockOptions::ledger_push`]);
    /// - the holder can store a broker-fenced checkpoint ([`LockGuard::checkpoint`]).
    ///
    /// A topic that does not exist, or has more or fewer than one partition, is refused
    /// ([`LedgerError`]). Give it replication factor 3, `min.insync.replicas=2`,
    /// `unclean.leader.election.enable=false`, `cleanup.policy=delete` with a retention as long as
    /// the history should reach back, and `compression.type=producer`.
    ///
    /// Every member of the lock must use the same ledger topic, or none: in native mode a member
    /// whose setting is not the group's never holds and fails with [`Error::LedgerMismatch`].
    #[must_use = "the options are changed in the value returned"]
    pub fn ledger_topic(mut self, topic: impl Into<String>) -> Self {
        self.ledger_topic = Some(topic.into());
        self
    }

    /// Whether waiters long-poll the ledger to learn of a release at once (default true): one
    /// parked Fetch per waiter at a time, for at most 5 s and 64 KiB
    /// of records. Without it a waiter learns of a release at its next heartbeat.
    #[must_use = "the options are changed in the value returned"]
    pub fn ledger_push(mut self, push: bool) -> Self {
        self.ledger_push = push;
        self
    }

    /// The longest checkpoint accepted, checked before anything is sent (default 4096 bytes,
    /// the broker's default `offset.metadata.max.bytes`; raise both together). The broker counts
    /// UTF-16 units, which are never more than the UTF-8 bytes counted here.
    #[must_use = "the options are changed in the value returned"]
    pub fn checkpoint_max_bytes(mut self, max: usize) -> Self {
        self.checkpoint_max_bytes = max;
        self
    }

    /// Whether an acquisition reads the lock's last checkpoint for its guard (default false):
    /// the read starts when the group assigns the lock, beside the ACQUIRED append, rather than
    /// after the hold began, which takes about a round trip off the time from the assignment to
    /// the checkpoint in hand. The hold still begins only once both are in. The guard's first
    /// [`LockGuard::last_checkpoint`] while the hold runs answers with what the read found (a
    /// read that failed answers its error there; a call after that, after
    /// [`LockGuard::checkpoint`], or once the hold has ended, reads afresh). Needs a ledger
    /// topic and one permit.
    #[must_use = "the options are changed in the value returned"]
    pub fn read_checkpoint_on_acquire(mut self, read: bool) -> Self {
        self.read_checkpoint_on_acquire = read;
        self
    }

    /// The ledger topic, if the lock has one.
    pub fn ledger(&self) -> Option<&str> {
        self.ledger_topic.as_deref()
    }

    /// Consumer-compatible mode: protocol type "consumer" on `topic`, which must have exactly one
    /// partition; holding partition 0 is holding the lock. Shares the lock with Java or
    /// librdkafka consumers in the same group. kafka-lock offers cooperative-sticky, range and
    /// roundrobin, in that order: under cooperative-sticky a holder keeps partition 0 through
    /// rebalances; under an eager protocol (range, roundrobin) a rebalance ends the hold.
    #[must_use = "the options are changed in the value returned"]
    pub fn consumer_topic(mut self, topic: impl Into<String>) -> Self {
        self.mode = Mode::Consumer {
            topic: topic.into(),
        };
        self
    }

    /// How many members may hold the lock at once (default 1, a mutex; at most 1024): a
    /// semaphore. Each holder gets a permit
    /// slot ([`LockGuard::permit`]) that it keeps for the whole hold; the token fences per slot
    /// (see `docs/recipes/semaphore.md`). Every member of a lock must use the same number: a
    /// member that disagrees with the group gets [`Error::PermitsMismatch`]. Native mode only.
    /// With a ledger topic each slot's tokens are ledger offsets that increase within the slot,
    /// and the records name the slot; checkpoints need one permit.
    pub fn permits(mut self, n: u16) -> Self {
        self.permits = n;
        self
    }

    /// A human label (host, pid, job) that waiters and `kafka-lock status` show for the holder.
    #[must_use = "the options are changed in the value returned"]
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// The client id in request headers (and the prefix of member ids).
    #[must_use = "the options are changed in the value returned"]
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.client_id = id.into();
        self
    }

    /// Session timeout: how long the broker keeps a silent member (and so how long a crashed
    /// holder blocks the lock).
    #[must_use = "the options are changed in the value returned"]
    pub fn session_timeout(mut self, d: Duration) -> Self {
        self.session_timeout = d;
        self
    }

    /// Heartbeat interval.
    #[must_use = "the options are changed in the value returned"]
    pub fn heartbeat_interval(mut self, d: Duration) -> Self {
        self.heartbeat_interval = d;
        self
    }

    /// Rebalance timeout.
    #[must_use = "the options are changed in the value returned"]
    pub fn rebalance_timeout(mut self, d: Duration) -> Self {
        self.rebalance_timeout = d;
        self
    }

    /// Per-request timeout.
    #[must_use = "the options are changed in the value returned"]
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    /// TCP connect (plus version handshake) timeout.
    #[must_use = "the options are changed in the value returned"]
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// How connections are secured (TLS, SASL): see [`Security`](crate::Security). Default: plaintext.
    /// Checked by [`LockOptions::validate`].
    pub fn security(mut self, security: Security) -> Self {
        self.security = security;
        self
    }

    /// The security settings.
    pub fn security_settings(&self) -> &Security {
        &self.security
    }

    /// Retry backoff bounds.
    #[must_use = "the options are changed in the value returned"]
    pub fn retry_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.retry_backoff = initial;
        self.retry_backoff_max = max;
        self
    }

    /// Replaces the bootstrap list (`host:port[,host:port...]`); for settings read from
    /// `bootstrap.servers`.
    pub(crate) fn set_bootstrap(mut self, bootstrap: &str) -> Self {
        self.bootstrap = split_bootstrap(bootstrap);
        self
    }

    /// The retry backoff bounds (initial, largest).
    pub(crate) fn retry_backoff_bounds(&self) -> (Duration, Duration) {
        (self.retry_backoff, self.retry_backoff_max)
    }

    /// Lease safety margin.
    #[must_use = "the options are changed in the value returned"]
    pub fn lease_margin(mut self, d: Duration) -> Self {
        self.lease_margin = d;
        self
    }

    /// How long [`LockGuard::release`], and an acquire that gives up, wait for the coordinator to
    /// confirm the LeaveGroup before returning (default [`DEFAULT_LEAVE_TIMEOUT`]). Leaving goes
    /// on in the background after that; a member that never says goodbye is dropped by the
    /// broker when its session times out. The hold itself always ends before the LeaveGroup is
    /// sent.
    #[must_use = "the options are changed in the value returned"]
    pub fn leave_timeout(mut self, d: Duration) -> Self {
        self.leave_timeout = d;
        self
    }

    /// Receive every [`LockEvent`] of locks taken with these options.
    #[must_use = "the options are changed in the value returned"]
    pub fn events(mut self, tx: mpsc::UnboundedSender<LockEvent>) -> Self {
        self.events = Some(tx);
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Counters for every lock taken with these options (and their clones).
    pub fn stats(&self) -> LockStats {
        self.stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .snapshot()
    }

    /// The lease a renewal buys: `min(session, rebalance) − margin`.
    pub fn lease_length(&self) -> Duration {
        self.membership_config().lease_length()
    }

    /// Checks the settings locally, before any broker sees them.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        self.security.validate()?;
        if let Some(client) = &self.client {
            let c = client.settings();
            if split_bootstrap(&c.bootstrap) != self.bootstrap
                || c.client_id != self.client_id
                || c.connect_timeout != self.connect_timeout
                || c.security != self.security
            {
                return bad(format!(
                    "lock {:?} was made by a Client, whose connections it shares: set the \
                     bootstrap list, client id, connect timeout and security on the Client, \
                     not on the lock",
                    self.name
                ));
            }
        }
        if self.bootstrap.is_empty() {
            return bad("no bootstrap broker given; pass host:port[,host:port...]".into());
        }
        for b in &self.bootstrap {
            match b.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
                _ => return bad(format!("bootstrap address {b:?} is not host:port")),
            }
        }
        if self.name.is_empty()
            || self.name.len() > 249
            || self.name.chars().any(|c| c.is_control())
        {
            return bad(format!(
                "lock name {:?} must be 1 to 249 printable characters (it is the Kafka group id)",
                self.name
            ));
        }
        // Kafka carries timeouts as 32-bit milliseconds; nothing longer makes sense for a client
        // either, and the bound keeps every `Instant + setting` in the crate far from overflow.
        for (what, d) in [
            ("session timeout", self.session_timeout),
            ("rebalance timeout", self.rebalance_timeout),
            ("heartbeat interval", self.heartbeat_interval),
            ("request timeout", self.request_timeout),
            ("connect timeout", self.connect_timeout),
            ("retry backoff", self.retry_backoff),
            ("largest retry backoff", self.retry_backoff_max),
            ("leave timeout", self.leave_timeout),
        ] {
            if d.as_millis() < 1 || d > MAX_SETTING {
                return bad(format!(
                    "{what} {d:?} is out of range: it must be between 1ms and {MAX_SETTING:?} (Kafka's 32-bit milliseconds)"
                ));
            }
        }
        if self.retry_backoff > self.retry_backoff_max {
            return bad(format!(
                "retry backoff {:?} is longer than the largest retry backoff {:?}",
                self.retry_backoff, self.retry_backoff_max
            ));
        }
        let lease = self.lease_length();
        if lease.is_zero() {
            return bad(format!(
                "lease margin {:?} leaves no lease: it must be shorter than min(session timeout {:?}, rebalance timeout {:?})",
                self.lease_margin, self.session_timeout, self.rebalance_timeout
            ));
        }
        if self.heartbeat_interval * 2 > lease {
            return bad(format!(
                "heartbeat interval {:?} must be at most half the lease ({lease:?} = min(session, rebalance) - margin), \
                 or one late heartbeat loses the lock; lower it (a third of the session timeout is usual)",
                self.heartbeat_interval
            ));
        }
        if let Some(label) = &self.label {
            if label.len() > crate::assign::MAX_LABEL_LEN {
                return bad(format!(
                    "label is {} bytes; the limit is {}",
                    label.len(),
                    crate::assign::MAX_LABEL_LEN
                ));
            }
            // Labels are shown on other people's terminals (status, waiting lines): an escape
            // sequence in one would be run there. The label itself is not quoted back.
            if let Some((at, c)) = label.char_indices().find(|(_, c)| c.is_control()) {
                return bad(format!(
                    "label holds a control character (U+{:04X} at byte {at}); a label is shown on \
                     other terminals and must be printable text",
                    u32::from(c)
                ));
            }
        }
        if self.permits == 0 || self.permits > crate::assign::MAX_PERMITS {
            return bad(format!(
                "permits {} is out of range: it must be between 1 and {}",
                self.permits,
                crate::assign::MAX_PERMITS
            ));
        }
        if let Mode::Consumer { topic } = &self.mode {
            if topic.is_empty() {
                return bad("consumer-compatible mode needs a topic name".into());
            }
            if self.permits > 1 {
                return bad(format!(
                    "consumer-compatible mode cannot have {} permits: holding there means owning \
                     partition 0 of a one-partition topic, which one member at a time can; use \
                     the native mode for a semaphore",
                    self.permits
                ));
            }
        }
        if let Some(topic) = &self.ledger_topic {
            if topic.is_empty()
                || topic.len() > 249
                || topic == "."
                || topic == ".."
                || !topic
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            {
                return bad(format!(
                    "ledger topic {topic:?} is not a valid Kafka topic name (1 to 249 of a-z, A-Z, 0-9, '.', '_', '-')"
                ));
            }
        }
        if self.read_checkpoint_on_acquire && (self.ledger_topic.is_none() || self.permits > 1) {
            return bad(format!(
                "reading the checkpoint on acquire needs a ledger topic and one permit (lock {:?} \
                 has {}, and {} permits)",
                self.name,
                self.ledger_topic
                    .as_deref()
                    .map_or_else(|| "no ledger topic".to_owned(), |t| format!("ledger {t:?}")),
                self.permits
            ));
        }
        if self.checkpoint_max_bytes == 0
            || self.checkpoint_max_bytes > crate::ledger::MAX_CHECKPOINT
        {
            return bad(format!(
                "the checkpoint limit {} is out of range: 1 to {} bytes",
                self.checkpoint_max_bytes,
                crate::ledger::MAX_CHECKPOINT
            ));
        }
        Ok(())
    }

    /// The lock's history from its ledger: every hold still retained there, oldest first, with
    /// how it ended. Reads the whole retained partition (about 100 bytes per record of every
    /// lock sharing the topic); needs no membership, so it never disturbs the lock.
    pub async fn history(&self) -> Result<History> {
        self.validate()?;
        let topic = self.ledger_required()?;
        crate::driver::ledger::read_history(&self.reach(), &self.name, topic).await
    }

    /// The lock's last checkpoint: the one its group has committed, or, when the group has none
    /// (deleted, or its offsets expired: see `docs/design.md`, "Checkpoints"), the ledger's copy
    /// of the newest hold's last checkpoint among its most recent records. Either way it is never
    /// older than a checkpoint [`LockGuard::checkpoint`] reported stored. The ledger is read back
    /// from its end in growing windows until it shows a checkpoint of hold T and every offset
    /// above T (no newer hold's copy can lie below), at most 32768 offsets (about 3 MiB of
    /// records of every lock sharing the topic), so its cost does not grow with the ledger; an
    /// older checkpoint is not found (a warning says so), but
    /// [`LockOptions::history`] reads the whole ledger and its
    /// [`History::last_checkpoint`] finds it. Needs no membership.
    pub async fn last_checkpoint(&self) -> Result<Option<Checkpoint>> {
        self.validate()?;
        let reach = self.reach();
        let found = self.last_checkpoint_via(&reach, &Places::default()).await;
        reach.close();
        found
    }

    /// [`LockOptions::last_checkpoint`] over `reach`, starting at the places already `known`.
    async fn last_checkpoint_via(
        &self,
        reach: &Reach,
        known: &Places,
    ) -> Result<Option<Checkpoint>> {
        let topic = self.ledger_required()?;
        // The ledger's ends are asked together with the group's checkpoint, not after it: on
        // one broker both go out on one connection in one round trip, and when the group has
        // no checkpoint (a lock that never stored one, its group deleted or its offsets
        // expired) the tail's Fetch follows at once. Reading the ends before the OffsetFetch is
        // answered changes nothing the fallback promises: it finds every copy acknowledged
        // before this call began, and each of those lies below an end read after the call
        // began. A failure here is not one of the read: the tail asks again. Only where the
        // leader is known (a hold's read): looking it up costs a Metadata and a DescribeConfigs
        // that a group with a checkpoint never needed.
        let (committed, ends) = match &known.ledger {
            Some(leader) => {
                let ends = crate::driver::ledger::ledger_ends(
                    reach,
                    &self.name,
                    topic,
                    Some(leader.clone()),
                );
                let (committed, ends) = tokio::join!(self.committed_via(reach, known), ends);
                (committed, ends.ok())
            }
            None => (self.committed_via(reach, known).await, None),
        };
        if let Some(c) = committed? {
            return Ok(Some(c));
        }
        let max = crate::driver::ledger::TAIL_MAX_OFFSETS;
        let history = crate::driver::ledger::read_checkpoint_tail(
            reach,
            &self.name,
            topic,
            max,
            known.ledger.clone(),
            ends,
        )
        .await?;
        let found = history
            .last_checkpoint()
            .map(|(value, token, _)| Checkpoint {
                value: value.to_owned(),
                token,
                source: CheckpointSource::Ledger,
            });
        Ok(found)
    }

    /// The checkpoint the lock's group has committed for the ledger partition, if any (no
    /// fallback to the ledger's copy; see [`LockOptions::last_checkpoint`]).
    pub async fn committed_checkpoint(&self) -> Result<Option<Checkpoint>> {
        self.validate()?;
        let reach = self.reach();
        let found = self.committed_via(&reach, &Places::default()).await;
        reach.close();
        found
    }

    async fn committed_via(&self, reach: &Reach, known: &Places) -> Result<Option<Checkpoint>> {
        let topic = self.ledger_required()?;
        let committed = crate::driver::ledger::read_committed(
            reach,
            &self.name,
            topic,
            known.coordinator.clone(),
        )
        .await?;
        Ok(committed.map(|(token, value)| Checkpoint {
            value,
            token,
            source: CheckpointSource::Group,
        }))
    }

    fn ledger_required(&self) -> Result<&str> {
        self.ledger_topic.as_deref().ok_or_else(|| {
            LedgerError::NoLedger {
                lock: self.name.clone(),
            }
            .into()
        })
    }

    /// The connections of a read outside any membership: the client's, else a pool of its own.
    pub(crate) fn reach(&self) -> Reach {
        let (pool, own) = self.pool();
        self.reach_over(pool, own)
    }

    /// A read's connections over `pool` (`own`: closed by [`Reach::close`]), with these timeouts.
    fn reach_over(&self, pool: Arc<crate::driver::pool::Pool>, own: bool) -> Reach {
        Reach {
            pool,
            own,
            request_timeout: self.request_timeout,
            retry_backoff: self.retry_backoff,
            retry_backoff_max: self.retry_backoff_max,
        }
    }

    fn ledger_config(&self, topic: &str) -> LedgerConfig {
        let lease = self.lease_length();
        LedgerConfig {
            lock: self.name.clone(),
            topic: topic.to_owned(),
            label: self.label.clone(),
            host: host_name(),
            pid: Some(std::process::id()),
            lease_length: lease,
            request_timeout: self.request_timeout,
            // The lease already bounds the append while it is not renewed; this bounds it while
            // heartbeats keep renewing a hold that the ledger cannot confirm.
            append_deadline: self.request_timeout.max(lease),
            push: self.ledger_push,
            poll_wait: DEFAULT_POLL_WAIT,
            poll_max_bytes: DEFAULT_POLL_MAX_BYTES,
            checkpoint_max_bytes: self.checkpoint_max_bytes,
            retry_backoff: self.retry_backoff,
            read_at_grant: self.read_checkpoint_on_acquire,
        }
    }

    fn membership_config(&self) -> MembershipConfig {
        MembershipConfig {
            group_id: self.name.clone(),
            mode: self.mode.clone(),
            label: self.label.clone(),
            session_timeout: self.session_timeout,
            rebalance_timeout: self.rebalance_timeout,
            heartbeat_interval: self.heartbeat_interval,
            request_timeout: self.request_timeout,
            lease_margin: self.lease_margin,
            permits: self.permits,
            ledger: self.ledger_topic.clone(),
        }
    }

    fn conn_config(&self) -> ConnConfig {
        ConnConfig::default()
            .with_client_id(Some(self.client_id.clone()))
            .with_connect_timeout(self.connect_timeout)
            .with_request_timeout(self.request_timeout)
            .with_max_frame_size(self.max_frame_size)
            .with_security(self.security.clone())
    }

    fn bootstrap_limits(&self) -> BootstrapConfig {
        // Reaching the cluster at all is bounded, so "cannot reach the cluster" is reported
        // promptly instead of being folded into the acquire wait: every listed broker gets one
        // full connect timeout first, then later rounds share three connect timeouts.
        BootstrapConfig::default()
            .with_deadline(self.connect_timeout.saturating_mul(3))
            .with_max_rounds(3)
    }

    /// A connection to a bootstrap broker, with the lock topic checked on it in consumer mode.
    ///
    /// A broker that goes away during the check (restarted, shut down, its connection reset) is
    /// not the cluster going away: on a retriable error the check is made again on a fresh
    /// connection, within the same time budget as connecting. Found by the fault suite: a
    /// controlled shutdown of one broker of three failed a consumer-mode acquire that was
    /// checking its topic there.
    async fn first_connection(
        &self,
        pool: &Arc<crate::driver::pool::Pool>,
        backoff: &mut Backoff,
    ) -> Result<Connection> {
        let limits = self.bootstrap_limits();
        let give_up = Instant::now().checked_add(limits.deadline);
        loop {
            let conn = pool.quick(None, 0).await?;
            // Before the session picks its stripe from it.
            pool.learn_offsets_partitions(&conn).await;
            let Mode::Consumer { topic } = &self.mode else {
                return Ok(conn);
            };
            match check_lock_topic(&conn, topic).await {
                Ok(()) => return Ok(conn),
                Err(e) if e.is_retriable() && give_up.is_none_or(|t| Instant::now() < t) => {
                    tracing::debug!(lock = %self.name, error = %e, "checking the lock topic failed; trying again");
                    // On a fresh connection, as the broker answering may be on its way out.
                    conn.close();
                    tokio::time::sleep(backoff.next_delay()).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits up to `wait` (forever if `None`) for the lock.
    ///
    /// Bounded: reaching the cluster counts against `wait`, and a waiter that gives up then
    /// waits at most the leave timeout ([`LockOptions::leave_timeout`], default 2 s) for the
    /// coordinator to confirm that it left, so the call returns within `wait` plus the leave
    /// timeout, plus scheduling delays. An unconfirmed leave finishes in the background.
    ///
    /// Errors: [`Error::NotAcquired`] when the wait ends (the group is left before returning),
    /// [`Error::Config`] for invalid settings, connection errors when the cluster cannot be
    /// reached, and [`Error::Broker`] when the broker rejects the settings. With a ledger also
    /// [`Error::Ledger`] when the topic cannot serve (missing, not one partition, replaced). A
    /// hold that ends before it is handed to the caller (the group gave us the lock but its
    /// ACQUIRED record was not acknowledged within the lease, or the first lease ran out before a
    /// heartbeat renewed it) is no acquisition: the group is left and the wait goes on with a
    /// new membership, at the back of the queue. The ledger topic's check before joining is
    /// bounded by the request timeout, not by `wait`.
    pub async fn acquire(&self, wait: Option<Duration>) -> Result<LockGuard> {
        // A bounded wait may end before our own join's rebalance completes, when the session
        // cannot name the holder yet: a look before joining (bounded by the wait) can.
        let seen = match wait {
            // Boxed, as are the other awaits of an acquisition that end before its wait: a
            // future holds room for the largest of its awaits for as long as it lives, and a
            // process may have thousands of acquisitions waiting (4.9 KB each unboxed).
            Some(w) => tokio::time::timeout(w, Box::pin(self.look()))
                .await
                .ok()
                .flatten()
                .and_then(|d| d.holders.first().map(describe_lock_holder)),
            None => None,
        };
        let name_holder = |e: Error| match e {
            Error::NotAcquired {
                lock,
                waited,
                holder: None,
            } => Error::NotAcquired {
                lock,
                waited,
                holder: seen.clone(),
            },
            other => other,
        };
        self.acquire_inner(wait, false)
            .await
            .map_err(|e| name_holder(self.name_refusal(e)))?
            .ok_or_else(|| {
                name_holder(Error::NotAcquired {
                    lock: self.name.clone(),
                    waited: wait.unwrap_or_default(),
                    holder: None,
                })
            })
    }

    /// Takes the lock only if it is free; otherwise returns `Ok(None)`. The CLI's `--wait 0`.
    ///
    /// It looks first (one DescribeGroups, which does not join the group): a stable group
    /// whose assignment in force names a holder for every permit answers `Ok(None)` at once,
    /// so probing a held lock never makes its holder rebalance. Otherwise it joins, takes the
    /// lock if the first completed generation gives it to us, and else leaves the group
    /// (waiting at most the leave timeout for the coordinator to confirm it).
    ///
    /// The look can be out of date by the time it is answered: a lock released just after it
    /// is reported busy, as if the try had come a moment earlier. The reverse cannot happen:
    /// "free" is never read from the look, only from a generation that gave us the lock.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.validate()?;
        if let Some(holders) = self.busy_at_a_look().await {
            if let Some(tx) = &self.events {
                let _ = tx.send(LockEvent::Waiting {
                    member_id: String::new(),
                    holder: holders.first().cloned(),
                    holders,
                    position: -1,
                });
            }
            return Ok(None);
        }
        self.acquire_inner(None, true)
            .await
            .map_err(|e| self.name_refusal(e))
    }

    /// One DescribeGroups of the lock's group in native mode (consumer-compatible groups do not
    /// show their holder from outside), one attempt: a failed look costs what comes next
    /// nothing but the time of that attempt.
    async fn look(&self) -> Option<crate::group_view::LockDescription> {
        if !matches!(self.mode, Mode::Native) {
            return None;
        }
        let mut watch = crate::driver::describe::GroupWatch::new(self.reach(), &self.name);
        let d = watch.describe_once().await;
        watch.close();
        d.ok()
    }

    /// The holders, when one DescribeGroups shows the lock held by a stable group on every
    /// permit this lock has. Anything less certain (an error, a rebalance, another protocol or
    /// number of permits, a free permit) is `None`: the join then decides, and reports errors.
    async fn busy_at_a_look(&self) -> Option<Vec<HolderInfo>> {
        let d = self.look().await?;
        let full = d.state == crate::group_view::LockState::Held
            && d.group_state == "Stable"
            && d.protocol == crate::group_view::LockProtocol::Native
            && d.permits == Some(self.permits)
            && d.holders.len() >= usize::from(self.permits);
        if !full {
            return None;
        }
        d.holders
            .iter()
            .map(|h| {
                Some(HolderInfo {
                    member_id: h.member.member_id.clone(),
                    label: h.member.label.clone(),
                    generation: h.generation?,
                    slot: u16::try_from(h.permit).ok()?,
                })
            })
            .collect()
    }

    /// An ACL refusal of the lock's group or topic, named as such (the broker's code alone does
    /// not say which group or topic).
    fn name_refusal(&self, e: Error) -> Error {
        use crate::security::SecurityError;
        match &e {
            Error::Broker { code, .. } if *code == KafkaCode::GROUP_AUTHORIZATION_FAILED => {
                Error::Security(SecurityError::GroupAuthorizationFailed {
                    group: self.name.clone(),
                })
            }
            Error::Broker { code, .. } if code.0 == 29 => {
                let topic = match &self.mode {
                    Mode::Consumer { topic } => topic.clone(),
                    Mode::Native => self.ledger_topic.clone().unwrap_or_default(),
                };
                Error::Security(SecurityError::TopicAuthorizationFailed { topic })
            }
            _ => e,
        }
    }

    async fn acquire_inner(&self, wait: Option<Duration>, once: bool) -> Result<Option<LockGuard>> {
        let started = Instant::now();
        loop {
            let left = wait.map(|w| w.saturating_sub(started.elapsed()));
            match self.acquire_session(left, once).await {
                // A hold that ended before the caller had it is no acquisition; a try has its
                // answer, a wait goes on under a new membership.
                Err(Error::Lost { .. }) if once => return Ok(None),
                Err(Error::Lost { lock, reason }) => {
                    if wait.is_some_and(|w| started.elapsed() >= w) {
                        return Err(Error::NotAcquired {
                            lock,
                            waited: wait.unwrap_or_default(),
                            holder: None,
                        });
                    }
                    tracing::info!(lock = %lock, %reason, "the hold ended before it was handed over; waiting on");
                }
                Err(Error::NotAcquired { lock, holder, .. }) => {
                    return Err(Error::NotAcquired {
                        lock,
                        waited: wait.unwrap_or_default(),
                        holder,
                    })
                }
                other => return other,
            }
        }
    }

    async fn acquire_session(
        &self,
        wait: Option<Duration>,
        once: bool,
    ) -> Result<Option<LockGuard>> {
        self.validate()?;
        let started = Instant::now();
        // A wait too long to represent is no deadline at all.
        let deadline = wait.and_then(|w| tokio::time::Instant::now().checked_add(w));
        let (pool, private) = self.pool();
        // A client's acquisitions run in waves: the place is held until the member is in a
        // generation (`wait_for_hold`).
        let admitted = match deadline {
            _ if private => None,
            None => pool.admit().await,
            Some(d) => match tokio::time::timeout_at(d, pool.admit()).await {
                Ok(p) => p,
                Err(_) if once => return Ok(None),
                Err(_) => {
                    return Err(Error::NotAcquired {
                        lock: self.name.clone(),
                        waited: wait.unwrap_or_default(),
                        holder: None,
                    })
                }
            },
        };
        let admitted = admitted.map(|p| {
            let until = tokio::time::Instant::now() + crate::driver::pool::ADMITTED_FOR;
            (p, until)
        });
        // Boxed: a client's acquisitions wait for their admission thousands at once, and each
        // waiting future would otherwise keep room for every await of the session below (about
        // 2.5 KB); boxed, that room is taken only by the few admitted.
        let at = (started, deadline);
        Box::pin(self.admitted_session(wait, once, at, (pool, private), admitted)).await
    }

    /// [`LockOptions::acquire_session`] once admitted: reaches the cluster, runs the session,
    /// and waits for the hold.
    async fn admitted_session(
        &self,
        wait: Option<Duration>,
        once: bool,
        (started, deadline): (Instant, Option<tokio::time::Instant>),
        (pool, private): (Arc<crate::driver::pool::Pool>, bool),
        mut admitted: Admitted,
    ) -> Result<Option<LockGuard>> {
        let mut backoff = Backoff::new(self.retry_backoff, self.retry_backoff_max, 2.0, 0.5);
        // The place's time counts from the admission: reaching the cluster and checking the
        // lock's topic (retried for three connect timeouts while its leader is not available)
        // are part of it.
        let connect = self.connect_by(&pool, &mut backoff, deadline);
        let Some(first) = while_admitted(&mut admitted, connect).await? else {
            return if once {
                Ok(None)
            } else {
                Err(Error::NotAcquired {
                    lock: self.name.clone(),
                    waited: wait.unwrap_or_default(),
                    holder: None,
                })
            };
        };
        // The ledger topic is checked beside the membership's first steps (the coordinator's
        // lookup, the connects), not before them; the JoinGroup waits for the check.
        let ledger = self.ledger_topic.as_ref().map(|topic| {
            Ledger::new(
                self.ledger_config(topic),
                None,
                Backoff::new(self.retry_backoff, self.retry_backoff_max, 2.0, 0.5),
            )
        });
        let checking = ledger.is_some();
        let check_on = first.clone();
        let machine = self.membership_for(&first)?;
        let member_rx = MemberId::default();
        let sink = self.event_sink(started, member_rx.clone());
        let read = (ledger.is_some() && self.read_checkpoint_on_acquire)
            .then(|| self.checkpoint_read(&pool));
        let mut handle = session::spawn(
            &self.name,
            machine,
            SessionParams {
                pool,
                private,
                first,
                ledger,
                read,
                checking,
            },
            Some(sink),
        );
        let outcome = self
            .wait_for_checked_hold(&mut handle, deadline, once, admitted, &check_on)
            .await;
        self.conclude(outcome, handle, member_rx, wait, once).await
    }

    /// [`LockOptions::wait_for_hold`], with the ledger topic's check (when the lock has a
    /// ledger) made meanwhile on `first`: a topic that cannot serve fails the acquisition with
    /// the check's error, and one that can lets the session's JoinGroup go.
    async fn wait_for_checked_hold(
        &self,
        handle: &mut SessionHandle,
        deadline: Option<tokio::time::Instant>,
        once: bool,
        admitted: Admitted,
        first: &Connection,
    ) -> Result<Option<(FencingToken, Instant, u16)>> {
        let Some(topic) = &self.ledger_topic else {
            return self.wait_for_hold(handle, deadline, once, admitted).await;
        };
        let commands = handle.commands.clone();
        let check = Box::pin(crate::driver::ledger::check_ledger_topic(
            first,
            topic,
            self.request_timeout,
        ));
        let mut check = std::pin::pin!(check);
        let wait = Box::pin(self.wait_for_hold(handle, deadline, once, admitted));
        let mut wait = std::pin::pin!(wait);
        tokio::select! {
            checked = &mut check => {
                let partition = checked?;
                let _ = commands.send(Box::new(SessionCommand::LedgerChecked(partition)));
                wait.await
            }
            // Over before the check: no hold began (the JoinGroup is still held back), so this
            // is a wait that ended; the check's refusal, if it comes, says more.
            outcome = &mut wait => match check.await {
                Err(e) => Err(e),
                Ok(_) => outcome,
            },
        }
    }

    /// The read a hold's session starts at the grant: [`LockGuard::last_checkpoint`]'s, over the
    /// session's connections, from the places it knows then.
    fn checkpoint_read(&self, pool: &Arc<crate::driver::pool::Pool>) -> session::CheckpointRead {
        // Without the event sender (the session would keep the users' channel open) and the
        // client (the pool is passed in).
        let options = Arc::new(LockOptions {
            events: None,
            client: None,
            ..self.clone()
        });
        let pool = pool.clone();
        Box::new(move |known| {
            let (options, reach) = (options.clone(), options.reach_over(pool.clone(), false));
            Box::pin(async move { options.last_checkpoint_via(&reach, &known).await })
        })
    }

    /// The first connection to the cluster, or `None` when `deadline` comes first.
    async fn connect_by(
        &self,
        pool: &Arc<crate::driver::pool::Pool>,
        backoff: &mut Backoff,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Option<Connection>> {
        // The wait bounds reaching the cluster too: a caller that gave 2 s gets its answer
        // after 2 s, not after every bootstrap broker's connect timeout.
        let connect = Box::pin(self.first_connection(pool, backoff));
        match deadline {
            Some(d) => match tokio::time::timeout_at(d, connect).await {
                Ok(first) => first.map(Some),
                Err(_) => Ok(None),
            },
            None => connect.await.map(Some),
        }
    }

    /// The membership machine, speaking the versions the first broker supports.
    fn membership_for(&self, first: &Connection) -> Result<Membership> {
        let versions = GroupVersions::fit(first.versions())?;
        let mut machine = Membership::new(
            self.membership_config(),
            versions,
            Backoff::new(self.retry_backoff, self.retry_backoff_max, 2.0, 0.5),
        );
        if let Some((host, port)) = first.peer().rsplit_once(':') {
            if let Ok(port) = port.parse() {
                machine.versions_from(host.trim_start_matches('[').trim_end_matches(']'), port);
            }
        }
        Ok(machine)
    }

    /// What the session does with each event: the stats, the metrics, the user's channel.
    fn event_sink(&self, started: Instant, member_tx: MemberId) -> EventSink {
        // Events go to the user and into the stats as the session emits them, on its task: each
        // step is a send on an unbounded channel or a counter, so the lease's timers never wait.
        let (user_tx, stats, name) = (self.events.clone(), self.stats.clone(), self.name.clone());
        let mut metrics = crate::metrics::LockMetrics::new(&self.name);
        let sink = move |e: SessionEvent| {
            let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
            let out = match e {
                Event::Joined { member_id, .. } => {
                    *member_tx.lock().unwrap_or_else(|p| p.into_inner()) = member_id;
                    None
                }
                Event::Waiting {
                    holder,
                    holders,
                    position,
                    ..
                } => Some(LockEvent::Waiting {
                    member_id: member_tx.lock().unwrap_or_else(|p| p.into_inner()).clone(),
                    holder,
                    holders,
                    position,
                }),
                Event::Acquired { token, permit, .. } => {
                    s.acquisitions += 1;
                    if s.latencies.len() == LATENCY_SAMPLES {
                        s.latencies.pop_front();
                    }
                    s.latencies.push_back(started.elapsed());
                    metrics.acquired(started.elapsed());
                    Some(LockEvent::Acquired {
                        member_id: token.member_id.clone(),
                        token,
                        permit,
                    })
                }
                Event::TokenChanged { token } => Some(LockEvent::TokenChanged { token }),
                Event::RebalanceWhileHeld => {
                    s.rebalances_while_held += 1;
                    metrics.rebalance_while_held();
                    None
                }
                Event::Lost { reason, lease_end } => {
                    s.lost(reason.as_str());
                    metrics.lost(reason.as_str());
                    Some(LockEvent::Lost { reason, lease_end })
                }
                Event::Released => {
                    metrics.released();
                    Some(LockEvent::Released)
                }
                Event::Left { .. } => Some(LockEvent::Left),
                Event::Failed(err) => {
                    tracing::warn!(lock = %name, error = %err, "lock session failed");
                    None
                }
                _ => None,
            };
            drop(s);
            if let (Some(tx), Some(ev)) = (&user_tx, out) {
                let _ = tx.send(ev);
            }
        };
        Box::new(sink)
    }

    /// Waits for the first hold, the deadline, or the end of the session. `Ok(None)`: the
    /// deadline came, or (`once`) a generation completed without making this member a holder.
    async fn wait_for_hold(
        &self,
        handle: &mut SessionHandle,
        deadline: Option<tokio::time::Instant>,
        once: bool,
        mut admitted: Admitted,
    ) -> Result<Option<(FencingToken, Instant, u16)>> {
        loop {
            let current = handle.state.borrow_and_update().clone();
            match current {
                SessionState::Held(token, lease_end, permit) => {
                    if let Some((place, _)) = admitted.take() {
                        place.completed();
                    }
                    return Ok(Some((token, lease_end, permit)));
                }
                SessionState::Ended(End::Failed(e)) => return Err(unwrap_error(e)),
                SessionState::Ended(End::Lost(reason)) => {
                    return Err(Error::Lost {
                        lock: self.name.clone(),
                        reason: reason.to_string(),
                    })
                }
                SessionState::Ended(_) => return Err(Error::Closed),
                // Any completed generation that did not make us the holder answers a single try,
                // whatever the assignment said (consumer mode and undecodable assignments name no
                // holder and no position).
                SessionState::Waiting { generation, .. } => {
                    // In a generation, queued: the next acquisition of the client may start,
                    // and this one counts towards widening the window (a try's too).
                    if generation >= 0 {
                        if let Some((place, _)) = admitted.take() {
                            place.completed();
                        }
                    }
                    if once && generation >= 0 {
                        return Ok(None);
                    }
                }
            }
            let until = admitted.as_ref().map(|(_, until)| *until);
            let changed = async {
                match until {
                    Some(until) => tokio::select! {
                        r = handle.state.changed() => r.map(|()| true),
                        () = tokio::time::sleep_until(until) => Ok(false),
                    },
                    None => handle.state.changed().await.map(|()| true),
                }
            };
            let changed = match deadline {
                Some(d) => match tokio::time::timeout_at(d, changed).await {
                    Ok(r) => r,
                    Err(_) => return Ok(None),
                },
                None => changed.await,
            };
            match changed {
                Ok(true) => {}
                // Admitted for long enough: the next acquisition may start.
                Ok(false) => admitted = None,
                Err(_) => return Err(Error::Closed),
            }
        }
    }

    /// Hands the hold over as a guard, or leaves the group and says why there is none.
    async fn conclude(
        &self,
        outcome: Result<Option<(FencingToken, Instant, u16)>>,
        mut handle: SessionHandle,
        member_rx: MemberId,
        wait: Option<Duration>,
        once: bool,
    ) -> Result<Option<LockGuard>> {
        match outcome {
            Ok(Some((token, lease_end, permit))) => Ok(Some(LockGuard {
                options: self.ledger_topic.is_some().then(|| {
                    Box::new(LockOptions {
                        events: None,
                        ..self.clone()
                    })
                }),
                name: self.name.clone(),
                handle,
                token,
                lease_end,
                permit,
                member_id: member_rx,
                released: false,
                leave_timeout: self.leave_timeout,
            })),
            Ok(None) => {
                let holder = match &*handle.state.borrow() {
                    SessionState::Waiting {
                        holder: Some(h), ..
                    } => Some(describe_holder(h)),
                    _ => None,
                };
                Box::pin(leave(&mut handle, self.leave_timeout)).await;
                if once {
                    Ok(None)
                } else {
                    Err(Error::NotAcquired {
                        lock: self.name.clone(),
                        waited: wait.unwrap_or_default(),
                        holder,
                    })
                }
            }
            Err(e) => {
                Box::pin(leave(&mut handle, self.leave_timeout)).await;
                Err(e)
            }
        }
    }
}

/// As [`describe_holder`], from a look at the group.
fn describe_lock_holder(h: &crate::group_view::LockHolder) -> String {
    let generation = h
        .generation
        .map(|g| format!(", generation {g}"))
        .unwrap_or_default();
    match &h.member.label {
        Some(l) => format!("{l} (member {}{generation})", h.member.member_id),
        None => format!("member {}{generation}", h.member.member_id),
    }
}

/// The generation is named as such: with a ledger the holder's fencing token is another
/// number, which a waiter does not know.
fn describe_holder(h: &HolderInfo) -> String {
    match &h.label {
        Some(l) => format!("{l} (member {}, generation {})", h.member_id, h.generation),
        None => format!("member {} (generation {})", h.member_id, h.generation),
    }
}

fn unwrap_error(e: Arc<Error>) -> Error {
    Arc::try_unwrap(e).unwrap_or_else(|shared| match &*shared {
        Error::Broker { api, code, message } => Error::Broker {
            api: *api,
            code: *code,
            message: message.clone(),
        },
        Error::Config(m) => Error::Config(m.clone()),
        Error::Protocol(m) => Error::Protocol(m.clone()),
        Error::PermitsMismatch { lock, ours, group } => Error::PermitsMismatch {
            lock: lock.clone(),
            ours: *ours,
            group: *group,
        },
        Error::LedgerMismatch { lock, ours, group } => Error::LedgerMismatch {
            lock: lock.clone(),
            ours: ours.clone(),
            group: group.clone(),
        },
        _ => Error::Poisoned(shared.clone()),
    })
}

/// Asks the session to leave and waits at most `bound` for the coordinator's answer. The
/// session goes on leaving in the background if the answer is late (within its own bound); a
/// member that never says goodbye is dropped by the broker when its session times out.
async fn leave(handle: &mut SessionHandle, bound: Duration) -> Release {
    let _ = handle.commands.send(Command::Leave.into());
    match tokio::time::timeout(bound, handle.left.wait()).await {
        Ok(true) => Release::Confirmed,
        _ => Release::Unconfirmed,
    }
}

/// This host's name, for the ledger's records (Linux; elsewhere none).
fn host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_owned())
}

/// The member id of the lock's membership, set by its session when the membership joins (empty
/// before). Read only, never waited for: a mutex costs a held lock 48 bytes where a `watch` cost
/// 360 (BENCHMARKS.md, "Memory per held lock").
type MemberId = Arc<Mutex<String>>;

/// An admission place with the instant its time is over.
type Admitted = Option<(crate::driver::pool::Admit, tokio::time::Instant)>;

/// Runs `work`, giving the admission place up when its time is over while `work` goes on: a
/// step before the session starts that cannot progress (a lock topic without a leader) would
/// otherwise keep the place past its bound, and every later acquisition of the client with it.
async fn while_admitted<T>(
    admitted: &mut Admitted,
    work: impl std::future::Future<Output = T>,
) -> T {
    let Some(until) = admitted.as_ref().map(|(_, until)| *until) else {
        return work.await;
    };
    // Boxed: the acquisition's future keeps room for its largest await.
    let mut work = Box::pin(work);
    tokio::select! {
        r = &mut work => return r,
        () = tokio::time::sleep_until(until) => {}
    }
    *admitted = None;
    work.await
}

/// Refuses topics that cannot serve as a lock: missing, or not exactly one partition (with four
/// partitions, four consumers each get one and all believe they hold the lock).
async fn check_lock_topic(conn: &Connection, topic: &str) -> Result<()> {
    let mut t = MetadataRequestTopic::default();
    t.name = Some(TopicName(StrBytes::from_string(topic.to_owned())));
    let mut req = MetadataRequest::default();
    req.topics = Some(vec![t]);
    // A lock must never create its own topic: a typo would silently make a new lock (and a
    // broker's default partition count may not be one).
    if conn.versions().get(ApiKey::Metadata).unwrap_or(0) >= 4 {
        req.allow_auto_topic_creation = false;
    }
    let resp = match conn.request(req).await? {
        Response::Metadata(r) => r,
        other => {
            return Err(Error::Protocol(format!(
                "expected Metadata, got {:?}",
                other.api_key()
            )))
        }
    };
    let Some(found) = resp
        .topics
        .iter()
        .find(|t| t.name.as_ref().map(|n| n.0.as_str()) == Some(topic))
    else {
        return Err(Error::Config(format!(
            "topic {topic:?} does not exist; create it with exactly one partition"
        )));
    };
    if found.error_code == 3 {
        return Err(Error::Config(format!(
            "topic {topic:?} does not exist; create it with exactly one partition"
        )));
    }
    if found.error_code != 0 {
        return Err(Error::broker(
            ApiKey::Metadata,
            KafkaCode(found.error_code),
            None,
        ));
    }
    if found.partitions.len() != 1 {
        return Err(Error::Config(format!(
            "topic {topic:?} has {} partitions; a lock topic must have exactly one, or several \
             consumers each get a partition and all believe they hold the lock",
            found.partitions.len()
        )));
    }
    Ok(())
}

/// A held lock. Dropping it releases the lock in the background (best effort); prefer
/// [`LockGuard::release`], which waits for the LeaveGroup.
///
/// A guard dropped as soon as it is taken is a mistake the compiler points out:
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// async fn work(opts: kafka_lock::LockOptions) -> kafka_lock::Result<()> {
///     opts.acquire(None).await?; // unused `LockGuard` that must be used
///     Ok(())
/// }
/// ```
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    /// The options it was taken with (without the event sender), for the checkpoints, which
    /// need a ledger: a lock without one keeps none (about 600 bytes a held lock).
    options: Option<Box<LockOptions>>,
    name: String,
    handle: SessionHandle,
    token: FencingToken,
    lease_end: Instant,
    permit: u16,
    member_id: MemberId,
    released: bool,
    leave_timeout: Duration,
}

impl std::fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle").finish_non_exhaustive()
    }
}

impl LockGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The current fencing token: with a ledger, the offset of this hold's ACQUIRED record
    /// (see [`FencingToken`]). In native mode a rebalance while holding moves its generation on
    /// (the token only grows); the ledger offset stays.
    pub fn token(&self) -> FencingToken {
        match &*self.handle.state.borrow() {
            SessionState::Held(t, _, _) => t.clone(),
            _ => self.token.clone(),
        }
    }

    /// The permit slot this hold has, `0..permits` (always 0 for a mutex). It stays the same for
    /// the whole hold; a resource with one instance per slot fences with [`LockGuard::token`]
    /// per slot (`docs/recipes/semaphore.md`).
    pub fn permit(&self) -> u16 {
        self.permit
    }

    /// Our member id.
    pub fn member_id(&self) -> String {
        let id = self
            .member_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if id.is_empty() {
            self.token.member_id.clone()
        } else {
            id
        }
    }

    /// When the hold ends unless renewed (monotonic clock).
    pub fn lease_end(&self) -> Instant {
        match &*self.handle.state.borrow() {
            SessionState::Held(_, l, _) => *l,
            _ => self.lease_end,
        }
    }

    /// Whether the lock is still held, judged on the local monotonic clock.
    pub fn is_held(&self) -> bool {
        match &*self.handle.state.borrow() {
            SessionState::Held(_, lease_end, _) => Instant::now() < *lease_end,
            _ => false,
        }
    }

    /// Resolves when the hold ends without a release, with the reason. Cancel-safe.
    pub async fn lost(&self) -> LossReason {
        self.watch().lost().await
    }

    /// A cloneable, `Send` view of this hold that other tasks can keep and await: the lease end
    /// as renewals move it, and the loss. It never keeps the lock alive: dropping the guard
    /// still releases it.
    pub fn watch(&self) -> HoldWatch {
        HoldWatch {
            rx: self.handle.state.clone(),
        }
    }

    /// Stores `value` as the lock's checkpoint: an OffsetCommit on the lock's group for the
    /// ledger partition, carrying the hold's generation and member id, so the broker itself
    /// rejects it ([`Error::Broker`] with ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID or
    /// FENCED_INSTANCE_ID) if this holder is no longer the current one. Once accepted it is also
    /// copied into the ledger, which outlives the group, and `Ok` comes only once that copy is
    /// acknowledged too: a checkpoint reported stored never reads back older, even after the
    /// group's offsets are deleted or expire. When the copy fails the outcome is
    /// [`LedgerError::CheckpointNotCopied`] (the group has the value; storing it again is safe).
    /// A value longer than
    /// [`LockOptions::checkpoint_max_bytes`] is refused before anything is sent. If the hold
    /// ends while the request is on its way, its answer still decides; when none comes the
    /// outcome is [`LedgerError::CheckpointUnknown`]: the broker may have stored it. A lock with
    /// more than one permit has no checkpoint ([`Error::Config`]).
    pub async fn checkpoint(&self, value: impl Into<String>) -> Result<()> {
        let value = value.into();
        let options = self.ledgered()?;
        if options.permits > 1 {
            return Err(Error::Config(format!(
                "lock {:?} has {} permits: a checkpoint is one per lock, and its holders would \
                 overwrite each other's; checkpoints need a lock with one permit",
                self.name, options.permits
            )));
        }
        let max = options.checkpoint_max_bytes;
        if value.len() > max {
            return Err(LedgerError::CheckpointTooLarge {
                len: value.len(),
                max,
            }
            .into());
        }
        if !self.is_held() {
            return Err(LedgerError::NotHeld {
                lock: self.name.clone(),
            }
            .into());
        }
        // What was read at the grant is older than what this may store.
        self.handle
            .granted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.handle
            .commands
            .send(Box::new(SessionCommand::Checkpoint(value, reply)))
            .map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }

    /// The options of a lock with a ledger; for one without, the error a checkpoint gets.
    fn ledgered(&self) -> Result<&LockOptions> {
        match &self.options {
            Some(options) => Ok(options),
            None => Err(LedgerError::NoLedger {
                lock: self.name.clone(),
            }
            .into()),
        }
    }

    /// The lock's last checkpoint, as [`LockOptions::last_checkpoint`] reads it: taken right
    /// after acquiring, it is the previous holders' last one (each committed its checkpoints
    /// before it let go). It goes over the hold's own connections, starting at the coordinator
    /// and ledger leader the hold already knows, so it opens no connection and looks nothing up
    /// while they stay where they were.
    ///
    /// With [`LockOptions::read_checkpoint_on_acquire`], the first call, while the hold still
    /// runs, answers with the read made when the lock was assigned, which the hold waited for.
    pub async fn last_checkpoint(&self) -> Result<Option<Checkpoint>> {
        // Taken at the grant, after every checkpoint the previous holders could still store
        // (docs/design.md, "Checkpoint"). While the hold it was taken for still runs, only this
        // hold can have stored one since, and storing one drops it; once that hold is lost (a
        // later hold has an ACQUIRED offset of its own), a later holder may have stored a newer
        // one, so the read starts afresh.
        let granted = self
            .handle
            .granted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(read) = granted {
            if self.is_held() && self.token().ledger_offset == self.token.ledger_offset {
                return read;
            }
        }
        let known = self
            .handle
            .places
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let options = self.ledgered()?;
        let reach = options.reach_over(self.handle.pool.clone(), false);
        options.last_checkpoint_via(&reach, &known).await
    }

    /// Releases the lock and leaves the group. The hold ends locally before the LeaveGroup is
    /// sent; the call then waits for the coordinator's answer (and, with a ledger, for the
    /// RELEASED record appended after it) for at most the leave timeout
    /// ([`LockOptions::leave_timeout`]) and says whether the leave was confirmed:
    /// [`Release::Unconfirmed`] means the next holder may have to wait for this member's
    /// session to time out.
    pub async fn release(mut self) -> Result<Release> {
        self.released = true;
        Ok(leave(&mut self.handle, self.leave_timeout).await)
    }
}

/// How a [`LockGuard::release`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Release {
    /// The coordinator answered the LeaveGroup: the group no longer has this member, and a
    /// waiter can take the lock in the rebalance that follows.
    Confirmed,
    /// No answer within the leave timeout (the coordinator is unreachable or slow). The hold
    /// ended anyway; the broker drops the member when its session times out, and only then can
    /// a waiter take the lock.
    Unconfirmed,
}

/// A view of a hold that can be cloned and sent to other tasks (see [`LockGuard::watch`]).
#[derive(Debug, Clone)]
#[must_use = "a watch does nothing unless it is asked or awaited"]
pub struct HoldWatch {
    rx: watch::Receiver<SessionState>,
}

impl HoldWatch {
    /// The end of the current lease on the monotonic clock, or `None` once the hold is over.
    /// It only moves forward while the hold lasts.
    pub fn lease_end(&self) -> Option<Instant> {
        match &*self.rx.borrow() {
            SessionState::Held(_, lease_end, _) => Some(*lease_end),
            _ => None,
        }
    }

    /// Whether the lock is still held, judged on the local monotonic clock.
    pub fn is_held(&self) -> bool {
        self.lease_end().is_some_and(|end| Instant::now() < end)
    }

    /// Resolves at the next change: a renewal (new lease end), a new token, or the end of the
    /// hold. Returns false once nothing can change any more. Cancel-safe.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }

    /// Resolves when the hold ends without a release, with the reason. Cancel-safe.
    pub async fn lost(&self) -> LossReason {
        let mut rx = self.rx.clone();
        loop {
            let lease = match &*rx.borrow_and_update() {
                SessionState::Held(_, lease_end, _) => *lease_end,
                SessionState::Ended(End::Lost(reason)) => return reason.clone(),
                SessionState::Ended(End::Failed(_)) => return LossReason::Fatal,
                SessionState::Ended(_) | SessionState::Waiting { .. } => return LossReason::Fatal,
            };
            // The guard's own timer backs up the session task's: the loss is reported at the
            // lease end even if that task cannot run.
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return LossReason::Fatal },
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(lease)) => {
                    if Instant::now() >= lease {
                        if let SessionState::Held(_, l, _) = &*rx.borrow() {
                            if *l <= lease {
                                return LossReason::LeaseExpired;
                            }
                        }
                    }
                }
            }
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released {
            // The session task leaves the group on its own once it gets this.
            let _ = self.handle.commands.send(Command::Leave.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A label reaches other people's terminals: control characters are refused, and the
    /// message does not quote the label back. Printable text of any script is fine.
    #[test]
    fn a_label_with_a_control_character_is_refused_without_being_quoted() {
        let o = |label: &str| {
            LockOptions::new("127.0.0.1:9092", "l")
                .label(label)
                .validate()
        };
        assert!(o("job 7 on host-1 (Grüße, 作业)").is_ok());
        for bad in [
            "job \u{1b}]0;owned\u{7}",
            "a\nholder: fake",
            "tab\there",
            "c1\u{9b}31m",
        ] {
            let e = o(bad).expect_err(bad).to_string();
            assert!(e.contains("control character"), "{bad:?}: {e}");
            assert!(!e.contains("owned") && !e.contains("fake"), "{e}");
        }
    }

    /// The checkpoint read on acquire is a read of the ledger's one checkpoint per lock: without
    /// a ledger, or with more than one permit, the options are refused with a typed error, not
    /// left to do nothing. Breaks if `validate` did not check it.
    #[test]
    fn a_checkpoint_read_on_acquire_needs_a_ledger_and_one_permit() {
        let o = LockOptions::new("127.0.0.1:9092", "l").read_checkpoint_on_acquire(true);
        assert!(matches!(o.validate(), Err(Error::Config(_))));
        let o = o.ledger_topic("ledger");
        assert!(o.validate().is_ok());
        assert!(matches!(o.permits(2).validate(), Err(Error::Config(_))));
    }

    /// Durations from zero to `Duration::MAX`, weighted towards the edges where overflow lives.
    fn any_duration() -> impl Strategy<Value = Duration> {
        prop_oneof![
            Just(Duration::ZERO),
            Just(Duration::MAX),
            Just(MAX_SETTING),
            Just(MAX_SETTING + Duration::from_nanos(1)),
            (0u64..100_000).prop_map(Duration::from_millis),
            any::<u64>().prop_map(Duration::from_millis),
            (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        ]
    }

    proptest! {
        /// Whatever the settings, validation answers with a value, and a machine built from
        /// settings it accepts survives being driven far into the future.
        #[test]
        fn any_durations_validate_or_run_without_panicking(
            d in proptest::collection::vec(any_duration(), 9),
        ) {
            let opts = LockOptions::new("127.0.0.1:9092", "lock")
                .session_timeout(d[0])
                .rebalance_timeout(d[1])
                .heartbeat_interval(d[2])
                .request_timeout(d[3])
                .connect_timeout(d[4])
                .retry_backoff(d[5], d[6])
                .lease_margin(d[7]);
            if opts.validate().is_err() {
                return Ok(());
            }
            let _ = opts.lease_length();
            let cfg = opts.membership_config();
            let _ = cfg.join_timeout();
            let mut m = Membership::new(
                cfg,
                GroupVersions::LATEST,
                Backoff::new(opts.retry_backoff, opts.retry_backoff_max, 2.0, 0.5),
            );
            let mut now = Instant::now();
            for _ in 0..20 {
                m.handle_timeout(now);
                while let Some(t) = m.poll_transmit() {
                    m.handle_response(t.id, Err(Error::Closed), now);
                }
                while m.poll_event().is_some() {}
                now = m.poll_timeout().map_or(now, |t| t.max(now)) + d[8].min(MAX_SETTING);
            }
            m.handle_command(Command::Leave, now);
        }
    }

    // ---- the lease clock of a guard whose session task cannot run --------------------------

    /// A guard and a watch of it over a session state that says `Held` until `lease_end`; the
    /// returned sender stands for the session task, which never gets to send anything.
    fn held_guard(lease_end: Instant) -> (LockGuard, watch::Sender<SessionState>) {
        let (guard, state_tx, _) = held_guard_commands(lease_end);
        (guard, state_tx)
    }

    /// [`held_guard`], with what the guard sends its session task.
    fn held_guard_commands(
        lease_end: Instant,
    ) -> (
        LockGuard,
        watch::Sender<SessionState>,
        crate::driver::inbox::Receiver<Box<session::SessionCommand>>,
    ) {
        let token = FencingToken::new(Some(7), 3, "m-1");
        let (state_tx, state) = watch::channel(SessionState::Held(token.clone(), lease_end, 0));
        let (commands, commands_rx) = crate::driver::inbox::inbox();
        let (_, left) = crate::driver::inbox::left();
        let member_id = MemberId::new(Mutex::new("m-1".to_owned()));
        let options = LockOptions::new("127.0.0.1:9", "lock");
        let pool = Arc::new(crate::driver::pool::Pool::new(options.pool_config(1)));
        let guard = LockGuard {
            name: options.name.clone(),
            leave_timeout: options.leave_timeout,
            options: Some(Box::new(options)),
            handle: SessionHandle {
                commands,
                state,
                left,
                pool,
                places: Arc::default(),
                granted: Arc::default(),
            },
            token,
            lease_end,
            permit: 0,
            member_id,
            released: false,
        };
        (guard, state_tx, commands_rx)
    }

    /// Blocks the calling thread (the runtime's only one) until the monotonic clock has passed
    /// `t`: no task of that runtime runs meanwhile.
    fn block_until(t: Instant) {
        while let Some(left) = t.checked_duration_since(Instant::now()) {
            std::thread::sleep(left.max(Duration::from_millis(1)));
        }
    }

    /// lock.rs promises that `is_held` "turns false on time even if that task is starved": the
    /// session task that would report the loss shares a current-thread runtime with code that
    /// blocks it past the lease end. `run` chooses between `released` and `lost` with this.
    #[test]
    fn is_held_turns_false_at_the_lease_end_even_if_the_session_task_is_starved() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let lease_end = Instant::now() + Duration::from_millis(200);
            let (guard, state_tx) = held_guard(lease_end);
            let watch = guard.watch();
            // What the session task would do at the lease end, on this same thread.
            let session = tokio::spawn(async move {
                tokio::time::sleep_until(tokio::time::Instant::from_std(lease_end)).await;
                let _ = state_tx.send(SessionState::Ended(End::Lost(LossReason::LeaseExpired)));
                state_tx
            });
            assert!(
                guard.is_held() && watch.is_held(),
                "held before the lease end"
            );
            block_until(lease_end);
            assert!(
                matches!(*watch.rx.borrow(), SessionState::Held(..)),
                "the session task ran although the runtime's only thread was blocked"
            );
            assert!(!guard.is_held(), "LockGuard::is_held past the lease end");
            assert!(!watch.is_held(), "HoldWatch::is_held past the lease end");
            assert_eq!(guard.lease_end(), lease_end);
            assert_eq!(watch.lease_end(), Some(lease_end));
            session.abort();
        });
    }

    /// A guard of a lock without a ledger keeps no options (the acquisition gives it none): its
    /// checkpoints and reads are refused as before, at once, and nothing goes to its session.
    #[tokio::test]
    async fn a_guard_without_a_ledger_refuses_checkpoints_and_reads_without_its_options() {
        let (mut guard, _session) = held_guard(Instant::now() + Duration::from_secs(60));
        guard.options = None;
        let (commands, mut queued) = crate::driver::inbox::inbox();
        guard.handle.commands = commands;
        let bound = Duration::from_secs(10);
        let stored = tokio::time::timeout(bound, guard.checkpoint("v"))
            .await
            .expect("a checkpoint without a ledger waited");
        assert!(
            matches!(stored, Err(Error::Ledger(LedgerError::NoLedger { .. }))),
            "{stored:?}"
        );
        let read = tokio::time::timeout(bound, guard.last_checkpoint())
            .await
            .expect("a read without a ledger waited");
        assert!(
            matches!(read, Err(Error::Ledger(LedgerError::NoLedger { .. }))),
            "{read:?}"
        );
        drop(guard);
        let cmd = tokio::time::timeout(bound, queued.recv())
            .await
            .expect("the dropped guard's leave")
            .map(|c| *c);
        assert!(
            matches!(cmd, Some(SessionCommand::Member(Command::Leave))),
            "the session got a command other than the leave"
        );
    }

    /// A checkpoint for a session that has ended (its command queue gone) fails at once as
    /// closed: the command and its reply are given back and dropped, so nobody waits for an
    /// answer that cannot come.
    #[tokio::test]
    async fn a_checkpoint_for_a_session_that_ended_fails_closed_instead_of_waiting() {
        let (mut guard, _session) = held_guard(Instant::now() + Duration::from_secs(60));
        guard.options = Some(Box::new(
            LockOptions::new("127.0.0.1:9", "lock").ledger_topic("ledger"),
        ));
        let stored = tokio::time::timeout(Duration::from_secs(10), guard.checkpoint("v"))
            .await
            .expect("a checkpoint for an ended session waited");
        assert!(matches!(stored, Err(Error::Closed)), "{stored:?}");
    }

    /// `lost` has a timer of its own: with a session task that never reports anything, it still
    /// resolves at the lease end, as a lease expiry.
    #[test]
    fn lost_resolves_at_the_lease_end_without_the_session_task() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let lease_end = Instant::now() + Duration::from_millis(200);
            let (guard, _silent_session) = held_guard(lease_end);
            let reason = tokio::time::timeout(Duration::from_secs(30), guard.lost())
                .await
                .expect("lost() resolves without the session task");
            assert_eq!(reason, LossReason::LeaseExpired);
            assert!(Instant::now() >= lease_end, "lost before the lease end");
            assert!(!guard.is_held());
        });
    }

    /// A guard and its watch read the hold as the session task last published it: a renewal's
    /// lease end and a rebalance's token while held, the guard's own once the hold is over,
    /// and the loss with its reason. The guard's name, permit slot and member id are its own.
    #[tokio::test]
    async fn a_guard_and_its_watch_read_the_hold_the_session_publishes() {
        const PROMPTLY: Duration = Duration::from_secs(10);
        let lease_end = Instant::now() + Duration::from_secs(600);
        let (mut guard, state_tx) = held_guard(lease_end);
        guard.permit = 2;
        let mut watch = guard.watch();
        assert_eq!(
            (guard.name(), guard.permit(), guard.member_id().as_str()),
            ("lock", 2, "m-1")
        );
        assert!(guard.is_held() && watch.is_held());
        assert_eq!(watch.lease_end(), Some(lease_end));

        // A renewal and a rebalance while held: a later lease end, the next generation.
        let renewed = lease_end + Duration::from_secs(5);
        let moved = FencingToken::new(Some(7), 4, "m-1");
        state_tx.send_replace(SessionState::Held(moved.clone(), renewed, 2));
        let changed = tokio::time::timeout(PROMPTLY, watch.changed()).await;
        assert_eq!(changed, Ok(true), "a watch hears of a renewal");
        assert_eq!((guard.token(), guard.lease_end()), (moved, renewed));
        assert_eq!(watch.lease_end(), Some(renewed));

        // Lost: neither says held, the guard falls back to the hold it was handed.
        state_tx.send_replace(SessionState::Ended(End::Lost(LossReason::Fenced(
            crate::KafkaCode(22),
        ))));
        assert!(!guard.is_held() && !watch.is_held());
        assert_eq!(watch.lease_end(), None);
        assert_eq!(
            (guard.token(), guard.lease_end()),
            (FencingToken::new(Some(7), 3, "m-1"), lease_end)
        );
        let lost = tokio::time::timeout(PROMPTLY, guard.lost()).await;
        assert_eq!(lost, Ok(LossReason::Fenced(crate::KafkaCode(22))));
        let changed = tokio::time::timeout(PROMPTLY, watch.changed()).await;
        assert_eq!(changed, Ok(true), "a watch hears of the end");
        drop(state_tx);
        let changed = tokio::time::timeout(PROMPTLY, watch.changed()).await;
        assert_eq!(
            changed,
            Ok(false),
            "nothing changes once the session is gone"
        );
    }

    /// A guard dropped without `release` asks its session task to leave, once; a released one
    /// asks nothing more when dropped.
    #[tokio::test]
    async fn a_dropped_guard_asks_its_session_to_leave_and_a_released_one_only_once() {
        let leaves = |rx: &mut crate::driver::inbox::Receiver<Box<session::SessionCommand>>| {
            let mut n = 0;
            while let Some(c) = rx.try_recv() {
                assert!(
                    matches!(*c, session::SessionCommand::Member(Command::Leave)),
                    "only a Leave"
                );
                n += 1;
            }
            n
        };
        let lease_end = Instant::now() + Duration::from_secs(600);
        let (guard, _state, mut commands) = held_guard_commands(lease_end);
        assert_eq!(leaves(&mut commands), 0);
        drop(guard);
        assert_eq!(leaves(&mut commands), 1, "a dropped guard leaves");

        let (guard, _state, mut commands) = held_guard_commands(lease_end);
        // The leave goes unanswered here: `release` waits out a short leave timeout.
        let mut guard = guard;
        guard.leave_timeout = Duration::from_millis(10);
        let release = tokio::time::timeout(Duration::from_secs(10), guard.release()).await;
        assert!(
            matches!(release, Ok(Ok(Release::Unconfirmed))),
            "{release:?}"
        );
        assert_eq!(leaves(&mut commands), 1, "a released guard leaves once");
    }

    /// What a guard refuses before anything is sent: a checkpoint of a lock with more than one
    /// permit, one longer than `checkpoint_max_bytes` (one of exactly that length is sent), and
    /// one once the hold is over. Here the session task is gone, so what is sent fails `Closed`.
    #[tokio::test]
    async fn a_guard_refuses_a_checkpoint_too_large_of_a_semaphore_or_after_the_hold() {
        let lease_end = Instant::now() + Duration::from_secs(600);
        let (mut guard, state_tx) = held_guard(lease_end);
        let options = LockOptions::new("127.0.0.1:9", "lock")
            .ledger_topic("ledger")
            .checkpoint_max_bytes(4);
        guard.options = Some(Box::new(options.clone().permits(2)));
        let e = guard.checkpoint("c").await.expect_err("two permits");
        assert!(matches!(e, Error::Config(_)), "{e}");

        guard.options = Some(Box::new(options));
        let e = guard.checkpoint("12345").await.expect_err("too large");
        assert!(
            matches!(
                e,
                Error::Ledger(LedgerError::CheckpointTooLarge { len: 5, max: 4 })
            ),
            "{e}"
        );
        let e = guard.checkpoint("1234").await.expect_err("no session task");
        assert!(matches!(e, Error::Closed), "{e}");

        state_tx.send_replace(SessionState::Ended(End::Lost(LossReason::LeaseExpired)));
        let e = guard.checkpoint("1234").await.expect_err("not held");
        assert!(
            matches!(e, Error::Ledger(LedgerError::NotHeld { .. })),
            "{e}"
        );
    }

    // ---- the admission window --------------------------------------------------------------

    /// A try (`try_acquire`) whose first generation completes with someone else holding the
    /// lock has reached its first generation as much as a waiter has: its place counts towards
    /// widening the admission window. Otherwise a client that tries contended locks keeps a
    /// window narrowed by one slow Heartbeat for good, its tries one at a time.
    #[tokio::test]
    async fn a_try_that_completes_its_first_generation_widens_the_admission_window() {
        let options = LockOptions::new("127.0.0.1:9", "lock");
        let pool = Arc::new(crate::driver::pool::Pool::new(
            crate::driver::pool::PoolConfig {
                acquisitions_at_once: 2,
                ..options.pool_config(1)
            },
        ));
        let long_ago = tokio::time::Instant::now()
            .checked_sub(Duration::from_secs(2))
            .expect("the clock has run for two seconds");
        pool.heartbeat_answered(long_ago, Duration::from_secs(1));
        assert_eq!(pool.admission_window(), Some(1), "a slow Heartbeat cuts");
        let place = tokio::time::timeout(Duration::from_secs(5), pool.admit())
            .await
            .expect("the window has a free place")
            .expect("a client's pool has a window");
        let (_session, state) = watch::channel(SessionState::Waiting {
            holder: None,
            generation: 4,
        });
        let (commands, _) = crate::driver::inbox::inbox();
        let (_, left) = crate::driver::inbox::left();
        let mut handle = SessionHandle {
            commands,
            state,
            left,
            pool: pool.clone(),
            places: Arc::default(),
            granted: Arc::default(),
        };
        let until = tokio::time::Instant::now() + crate::driver::pool::ADMITTED_FOR;
        let outcome = tokio::time::timeout(
            Duration::from_secs(5),
            options.wait_for_hold(&mut handle, None, true, Some((place, until))),
        )
        .await
        .expect("a completed generation answers a try at once");
        assert!(matches!(outcome, Ok(None)), "{outcome:?}");
        assert_eq!(
            pool.admission_window(),
            Some(2),
            "a window's worth of first generations widens the window"
        );
    }
}

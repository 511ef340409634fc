//! One cluster's connections, shared by every lock a process takes there.
//!
//! ```no_run
//! # async fn run() -> kafka_lock::Result<()> {
//! let client = kafka_lock::Client::new("127.0.0.1:9092");
//! let mut guards = Vec::new();
//! for shard in 0..1000 {
//!     let lock = client.lock(format!("shard-{shard}"));
//!     guards.push(lock.acquire(None).await?);
//! }
//! # Ok(()) }
//! ```
//!
//! Every lock still is its own group member, with its own heartbeats, lease, generation and
//! fencing token; what the locks share is the sockets: per broker one connection for the
//! requests the broker answers at once (heartbeats of every lock), and a bounded pool of
//! connections for the requests it may hold back (joins, appends, commits, long polls). See
//! `docs/design.md`, "Many locks over one client".

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::driver::pool::{Pool, PoolConfig};
use crate::driver::{BootstrapConfig, ConnConfig};
use crate::lock::LockOptions;
use crate::security::Security;

pub use crate::driver::pool::{
    DEFAULT_ACQUISITIONS_AT_ONCE, DEFAULT_PARKING_LANES, DEFAULT_QUICK_CONNECTIONS,
};

/// A cluster's connections, shared by the locks made from it ([`Client::lock`]).
///
/// Cheap to clone: clones share the connections. Make one per cluster and process. Connections
/// open on first use and close when unused for a minute or when the last clone and every lock
/// made from it are gone.
#[derive(Clone)]
pub struct Client {
    settings: Arc<Settings>,
    pool: Arc<Pool>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    pub(crate) bootstrap: String,
    pub(crate) client_id: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) security: Security,
    pub(crate) retry_backoff: Duration,
    pub(crate) retry_backoff_max: Duration,
    pub(crate) parking_lanes: usize,
    pub(crate) quick_connections: usize,
    pub(crate) acquisitions_at_once: usize,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("bootstrap", &self.settings.bootstrap)
            .field("parking_lanes", &self.settings.parking_lanes)
            .field("quick_connections", &self.settings.quick_connections)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client of the cluster reachable at `bootstrap` (`host:port[,host:port...]`). Nothing
    /// is connected until a lock is acquired.
    pub fn new(bootstrap: impl AsRef<str>) -> Self {
        let defaults = LockOptions::new(bootstrap.as_ref(), "-");
        let (retry_backoff, retry_backoff_max) = defaults.retry_backoff_bounds();
        Self::with_settings(Settings {
            bootstrap: bootstrap.as_ref().to_owned(),
            client_id: "kafka-lock".into(),
            connect_timeout: crate::driver::DEFAULT_CONNECT_TIMEOUT,
            security: Security::default(),
            retry_backoff,
            retry_backoff_max,
            parking_lanes: DEFAULT_PARKING_LANES,
            quick_connections: DEFAULT_QUICK_CONNECTIONS,
            acquisitions_at_once: DEFAULT_ACQUISITIONS_AT_ONCE,
        })
    }

    fn with_settings(settings: Settings) -> Self {
        let pool = Arc::new(Pool::new(settings.pool_config()));
        Client {
            settings: Arc::new(settings),
            pool,
        }
    }

    fn change(self, f: impl FnOnce(&mut Settings)) -> Self {
        let mut s = (*self.settings).clone();
        f(&mut s);
        Self::with_settings(s)
    }

    /// How connections are secured (TLS, SASL): see [`Security`](crate::Security). Default: plaintext.
    /// Every connection authenticates once, and re-authenticates on its own schedule (KIP-368).
    #[must_use = "the client is changed in the value returned"]
    pub fn security(self, security: Security) -> Self {
        self.change(|s| s.security = security)
    }

    /// The client id in request headers (and the prefix of member ids). Default `kafka-lock`.
    #[must_use = "the client is changed in the value returned"]
    pub fn client_id(self, id: impl Into<String>) -> Self {
        let id = id.into();
        self.change(|s| s.client_id = id)
    }

    /// TCP connect plus TLS, version handshake and SASL, per connection. Default 10 s.
    #[must_use = "the client is changed in the value returned"]
    pub fn connect_timeout(self, d: Duration) -> Self {
        self.change(|s| s.connect_timeout = d)
    }

    /// Retry backoff bounds, for reaching the cluster and for every lock made from the client.
    #[must_use = "the client is changed in the value returned"]
    pub fn retry_backoff(self, initial: Duration, max: Duration) -> Self {
        self.change(|s| {
            s.retry_backoff = initial;
            s.retry_backoff_max = max;
        })
    }

    /// The most connections to one broker that carry a request the broker may hold back
    /// (JoinGroup, SyncGroup, acks=all Produce, OffsetCommit, a waiter's long poll), one such
    /// request each (default [`DEFAULT_PARKING_LANES`], at least 1). A quarter of them is kept
    /// for members that already belong to a generation (rejoins, appends, checkpoints), so a
    /// burst of first joins never delays a rebalance of a held lock; such a request that finds
    /// every lane busy opens one beyond the cap for its one request rather than wait (a parked
    /// rejoin may be what the busy lanes wait for). `docs/design.md` gives the throughput this
    /// implies.
    #[must_use = "the client is changed in the value returned"]
    pub fn parking_lanes(self, n: usize) -> Self {
        self.change(|s| s.parking_lanes = n.max(1))
    }

    /// How many connections to one broker carry the requests it answers without parking them
    /// (Heartbeat, LeaveGroup, FindCoordinator, Metadata, ...), shared by every lock (default
    /// [`DEFAULT_QUICK_CONNECTIONS`], at least 1). A lock's requests always take the same one,
    /// chosen by its group's `__consumer_offsets` partition: Apache serves a connection one
    /// request at a time, so this bounds the heartbeats a second the client can have answered
    /// per broker, and a Heartbeat the broker defers while its partition has uncommitted writes
    /// holds back only the locks that share its connection.
    #[must_use = "the client is changed in the value returned"]
    pub fn quick_connections(self, n: usize) -> Self {
        self.change(|s| s.quick_connections = n.max(1))
    }

    /// How many of the client's acquisitions (`acquire`, `try_acquire`) may be between their
    /// start and their first completed generation at once (default
    /// [`DEFAULT_ACQUISITIONS_AT_ONCE`], at least 1); later ones wait their turn, in order. An
    /// acquisition holds its place until its member is in a generation (holding or queued) or
    /// for 10 s at most, so one that cannot progress delays the others by no more than that.
    /// A burst of thousands of acquisitions then runs in waves: the requests, answers and
    /// tasks of an acquisition in flight exist for that many at a time, which bounds the
    /// memory the burst takes (and the process keeps after it) and the parking lanes it opens.
    /// This is a ceiling: the client halves the number when its locks' Heartbeats come back
    /// late (after a quarter of the request timeout: the coordinators' `__consumer_offsets`
    /// partitions behind on the burst's writes, where the held locks' renewals wait too) and
    /// raises it by one each time as many acquisitions as it lets in have completed.
    #[must_use = "the client is changed in the value returned"]
    pub fn acquisitions_at_once(self, n: usize) -> Self {
        self.change(|s| s.acquisitions_at_once = n.max(1))
    }

    /// Options for the lock `name` taken through this client's connections. Connection settings
    /// (bootstrap, security, client id, connect timeout) are the client's; everything else can
    /// be set on the options as usual.
    pub fn lock(&self, name: impl Into<String>) -> LockOptions {
        let s = &self.settings;
        LockOptions::new(&s.bootstrap, name)
            .client_id(s.client_id.clone())
            .connect_timeout(s.connect_timeout)
            .security(s.security.clone())
            .retry_backoff(s.retry_backoff, s.retry_backoff_max)
            .with_client(self.clone())
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    pub(crate) fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }
}

impl Settings {
    fn pool_config(&self) -> PoolConfig {
        let opts = LockOptions::new(&self.bootstrap, "-")
            .client_id(self.client_id.clone())
            .connect_timeout(self.connect_timeout)
            .security(self.security.clone())
            .retry_backoff(self.retry_backoff, self.retry_backoff_max);
        let mut cfg = opts.pool_config(self.parking_lanes);
        cfg.quick_connections = self.quick_connections;
        cfg.acquisitions_at_once = self.acquisitions_at_once;
        cfg
    }
}

/// Builds what a pool needs from the options a lock has.
pub(crate) fn pool_config(
    bootstrap: Vec<String>,
    conn: ConnConfig,
    limits: BootstrapConfig,
    backoff: (Duration, Duration),
    parking_lanes: usize,
) -> PoolConfig {
    PoolConfig {
        bootstrap,
        conn,
        limits,
        retry_backoff: backoff.0,
        retry_backoff_max: backoff.1,
        parking_lanes,
        quick_connections: 1,
        acquisitions_at_once: 0,
    }
}

//! The connections of one client, shared by every lock it makes.
//!
//! Apache Kafka serves a connection one request at a time, in order: the socket server mutes a
//! channel once it has read a request and unmutes it only after the response is sent
//! (SocketServer.scala `processCompletedReceives`, `selector.mute`). A request the broker parks
//! therefore blocks every later request on its connection, whatever the client pipelines. So
//! requests are split by how the broker answers them:
//!
//! - **quick**: one connection per broker (and one to a bootstrap broker) for the requests
//!   Apache answers without parking them on purpose: Heartbeat, LeaveGroup, FindCoordinator,
//!   Metadata, ListOffsets, DescribeGroups, OffsetFetch. Every lock of the client shares it.
//! - **parking lanes**: per broker, an elastic pool of connections that each carry at most one
//!   request at a time: JoinGroup, SyncGroup, the waiters' long-poll Fetch, acks=all Produce,
//!   OffsetCommit. A lane is opened when no idle one is left, goes back to the pool when its
//!   answer is in, and is closed after [`IDLE_AFTER`] unused. At most `cap` lanes per broker
//!   exist at once, but for urgent ones (below); a first join or a poll that finds them all
//!   busy waits for one.
//!
//! First joins (a member that has never completed a generation) and waiters' polls may take at
//! most `cap - reserve` lanes, so the `reserve` lanes left are always there for the requests a
//! membership in force needs in time: a rejoin during a rebalance (missing the rebalance timeout
//! costs the member its membership), the ACQUIRED append and a holder's checkpoint. Those
//! never wait: with every lane busy they get an overflow lane beyond the cap, closed after
//! their request, since a rejoin parked behind requests that themselves wait for it (another
//! member of its group, in the same client) would only end at the rebalance timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::bootstrap::{connect_any, BootstrapConfig};
use super::conn::{ConnConfig, Connection};
use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::membership::Broker;

/// Default cap on the parking lanes of one client to one broker. Each lane is a socket (with
/// its TLS session and SASL exchange) the broker keeps, and small managed brokers allow a few
/// hundred client connections in all; 32 leaves room for several processes per broker while
/// letting 24 first joins park at once (about 8 acquisitions a second per broker under Apache's
/// default 3 s `group.initial.rebalance.delay.ms`; with a delay of 0 a lane is busy for a round
/// trip only).
pub const DEFAULT_PARKING_LANES: usize = 32;

/// A connection unused this long is closed: lanes after a burst of acquisitions, and the quick
/// connection of a broker that coordinates none of the client's locks any more.
pub(crate) const IDLE_AFTER: Duration = Duration::from_secs(60);

/// Default bound on a client's acquisitions between their start and their first completed
/// generation (`Client::acquisitions_at_once`): the ceiling of the admission window, which
/// narrows while Heartbeats come back late.
pub const DEFAULT_ACQUISITIONS_AT_ONCE: usize = 128;

/// A Heartbeat answered after more than this share of its request timeout (or not answered)
/// cuts the admission window: its group's `__consumer_offsets` partition is behind on commits.
const SLOW_HEARTBEAT_DIVISOR: u32 = 4;

/// How long an admitted acquisition keeps its place among them at most: one whose first
/// generation does not complete (a coordinator that cannot be reached, a join parked by a long
/// initial delay) lets the next one in after this, so the bound paces bursts and never stops
/// a client's acquisitions behind a few that cannot progress.
pub(crate) const ADMITTED_FOR: Duration = Duration::from_secs(10);

/// Default number of quick connections per broker (`Client::quick_connections`): a lock's
/// Heartbeats take the one of its group's `__consumer_offsets` partition.
pub const DEFAULT_QUICK_CONNECTIONS: usize = 4;

/// Apache's default `offsets.topic.num.partitions`: a group's coordinator partition is
/// `Utils.abs(groupId.hashCode()) % partitions` (GroupCoordinatorService `partitionFor`). Used
/// until the cluster's own count is known ([`Pool::learn_offsets_partitions`]), and for good when
/// the client may not describe `__consumer_offsets`.
const OFFSETS_PARTITIONS: u32 = 50;

/// The places among a client's acquisitions at once: a window between one and the ceiling
/// (`Client::acquisitions_at_once`), halved when a Heartbeat of the client's is slow and widened
/// by one for each window's worth of acquisitions that reach their first generation with no
/// slow Heartbeat among them (additive increase, multiplicative decrease).
///
/// Apache runs a classic Heartbeat as a coordinator write (GroupCoordinatorService `heartbeat`:
/// `scheduleWriteOperation`) that writes no records, and CoordinatorRuntime answers such a
/// write only once every earlier write of its `__consumer_offsets` partition is committed, that
/// is replicated to the in-sync replicas. Every first acquisition writes its group's metadata
/// twice (GroupMetadataManager `classicGroupJoin`: a new group's empty metadata; the leader's
/// SyncGroup: the generation and its assignment), so a burst of them fills those partitions'
/// replication and the Heartbeats of the client's members wait behind it: on three nodes, 128
/// acquisitions at once cost most of 10,000 holds their leases (BENCHMARKS.md). A Heartbeat's
/// delay is the one signal of that backlog the client sees, so admission follows it. This
/// paces acquisitions only: leases, renewals and fencing are the membership's, untouched.
pub(crate) struct Admission {
    places: Arc<Semaphore>,
    ceiling: usize,
    window: Mutex<Window>,
}

struct Window {
    /// Places in the window, given out or free.
    size: usize,
    /// Places cut while given out, taken out of use as they come back.
    owed: usize,
    /// First generations completed since the window last grew.
    completed: usize,
    /// When the window was last cut: a Heartbeat sent before then waited behind the backlog
    /// that cut it, and does not cut again.
    cut_at: Option<Instant>,
}

impl Admission {
    fn new(ceiling: usize) -> Admission {
        // A semaphore holds at most MAX_PERMITS (`Semaphore::new` panics beyond): a larger
        // setting means no bound, as that many could never be in use.
        let ceiling = ceiling.clamp(1, Semaphore::MAX_PERMITS);
        Admission {
            places: Arc::new(Semaphore::new(ceiling)),
            ceiling,
            window: Mutex::new(Window {
                size: ceiling,
                owed: 0,
                completed: 0,
                cut_at: None,
            }),
        }
    }

    fn window(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A Heartbeat sent at `sent` came back slow (or not at all): halves the window, not below
    /// one, unless an earlier cut came after it was sent; either way the window does not grow
    /// on the acquisitions completed before it. The free places go at once, the given-out ones
    /// as they come back.
    fn slow(&self, sent: Instant) {
        let mut w = self.window();
        // The backlog is still there: what completed before this answer does not count.
        w.completed = 0;
        if w.size <= 1 || w.cut_at.is_some_and(|at| sent <= at) {
            return;
        }
        w.cut_at = Some(Instant::now());
        let cut = w.size - w.size / 2;
        w.size -= cut;
        w.owed += cut - self.places.forget_permits(cut);
        tracing::debug!(
            window = w.size,
            "a slow Heartbeat narrowed the acquisitions at once"
        );
    }

    /// An admitted acquisition reached its first generation.
    fn grow(&self) {
        let mut w = self.window();
        w.completed += 1;
        if w.size >= self.ceiling || w.completed < w.size {
            return;
        }
        w.completed = 0;
        w.size += 1;
        tracing::debug!(window = w.size, "the acquisitions at once widened");
        if w.owed > 0 {
            w.owed -= 1;
        } else {
            self.places.add_permits(1);
        }
    }
}

/// A place among the acquisitions at once ([`Pool::admit`]), given back when dropped.
pub(crate) struct Admit {
    permit: Option<OwnedSemaphorePermit>,
    admission: Arc<Admission>,
}

impl Admit {
    /// The acquisition reached its first generation: gives the place back, and counts towards
    /// widening the window.
    pub(crate) fn completed(self) {
        self.admission.grow();
    }
}

impl Drop for Admit {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            // Given back under the window's lock: a cut meanwhile counts it as free or as owed,
            // never as both.
            let mut w = self.admission.window();
            if w.owed > 0 {
                w.owed -= 1;
                permit.forget();
            } else {
                drop(permit);
            }
        }
    }
}

/// Which lanes a parked request may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Park {
    /// A first join or a waiter's poll: never more than `cap - reserve` at once.
    Fresh,
    /// A membership in force (rejoin), the ACQUIRED append, a checkpoint: may take any lane.
    Urgent,
}

/// Where the connections go, and the ones open now.
pub(crate) struct Pool {
    pub(crate) bootstrap: Vec<String>,
    pub(crate) conn: ConnConfig,
    /// For parking lanes, which may carry ledger Fetches (larger frames).
    park_conn: ConnConfig,
    pub(crate) limits: BootstrapConfig,
    pub(crate) retry_backoff: Duration,
    pub(crate) retry_backoff_max: Duration,
    cap: usize,
    stripes: usize,
    /// Quick connections by broker (`None`: the bootstrap connection) and stripe. A cell is
    /// locked while its connection is being opened, so two requests never race to open the
    /// same one.
    quick: Mutex<HashMap<QuickKey, Arc<QuickCell>>>,
    parking: Mutex<HashMap<Broker, Arc<Lanes>>>,
    reaper: AtomicBool,
    /// FindCoordinator lookups waiting to go out together (`super::lookup`).
    pub(crate) lookups: super::lookup::Lookups,
    /// Acquisitions between their start and their first completed generation (`None`: no
    /// bound, a lock's own pool).
    admission: Option<Arc<Admission>>,
    /// `__consumer_offsets`' partitions and their stripes, once the cluster told them.
    offsets_partitions: tokio::sync::OnceCell<Placement>,
    /// Where the grid of the locks' deferrable timers starts (`session::wake_at`): one grid for
    /// all the client's locks, so their Heartbeats line up.
    pub(crate) origin: std::time::Instant,
}

/// Where the groups of each `__consumer_offsets` partition go, as read once per client.
struct Placement {
    partitions: u32,
    /// For a partition whose leader leads fewer partitions than there are stripes, the stripes
    /// its groups spread over (the others go on `partition % stripes`): `(i, n)` for those `s`
    /// with `s % n == i`, computed when asked, as a listing would take memory in proportion to
    /// the stripe count (any `usize` the client was given).
    spread: HashMap<u32, (usize, usize)>,
}

impl Placement {
    /// Apache defers a Heartbeat only behind its own partition's writes, so groups of one
    /// partition may share a connection with each other at no cost, never with another
    /// partition's. A broker that leads fewer partitions than there are stripes (three nodes
    /// and three partitions: one each) would use one connection of its stripes and leave the
    /// rest idle: its partitions share the stripes out instead, each its own disjoint set, and
    /// a partition's groups spread over its set.
    fn new(partitions: u32, leaders: &[(u32, i32)], stripes: usize) -> Placement {
        let mut led: HashMap<i32, Vec<u32>> = HashMap::new();
        for &(p, leader) in leaders {
            if p < partitions {
                led.entry(leader).or_default().push(p);
            }
        }
        let mut spread = HashMap::new();
        for mut ps in led.into_values() {
            if ps.len() >= stripes {
                continue;
            }
            ps.sort_unstable();
            ps.dedup();
            let n = ps.len();
            for (i, p) in ps.into_iter().enumerate() {
                spread.insert(p, (i, n));
            }
        }
        Placement { partitions, spread }
    }
}

/// A broker (`None`: the bootstrap connection) and a stripe.
type QuickKey = (Option<Broker>, usize);

#[derive(Default)]
struct QuickCell {
    conn: tokio::sync::Mutex<Option<Connection>>,
    last_used: Mutex<Option<Instant>>,
}

struct Lanes {
    all: Arc<Semaphore>,
    fresh: Arc<Semaphore>,
    idle: Mutex<Vec<(Connection, Instant)>>,
}

/// A parking lane lent to one request. Dropped before [`Lane::done`] (its request cancelled or
/// timed out with an answer maybe still to come), its connection is closed rather than lent
/// again: the next request would queue behind the parked one.
pub(crate) struct Lane {
    conn: Option<Connection>,
    lanes: Arc<Lanes>,
    /// `None`: an overflow lane, lent to an urgent request beyond the cap and closed after it.
    all: Option<OwnedSemaphorePermit>,
    _fresh: Option<OwnedSemaphorePermit>,
}

impl Lane {
    pub(crate) fn conn(&self) -> &Connection {
        self.conn.as_ref().expect("taken only by done or drop")
    }

    /// The request is answered: the lane may serve another (an overflow lane is closed).
    pub(crate) fn done(mut self) {
        if let Some(c) = self.conn.take() {
            if self.all.is_none() {
                c.close();
            } else if !c.is_closed() {
                let mut idle = self.lanes.idle.lock().unwrap_or_else(|p| p.into_inner());
                idle.push((c, Instant::now()));
            }
        }
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take() {
            c.close();
        }
    }
}

/// The settings a pool is made with.
pub(crate) struct PoolConfig {
    pub(crate) bootstrap: Vec<String>,
    pub(crate) conn: ConnConfig,
    pub(crate) limits: BootstrapConfig,
    pub(crate) retry_backoff: Duration,
    pub(crate) retry_backoff_max: Duration,
    pub(crate) parking_lanes: usize,
    pub(crate) quick_connections: usize,
    /// 0: no bound.
    pub(crate) acquisitions_at_once: usize,
}

impl Pool {
    pub(crate) fn new(cfg: PoolConfig) -> Pool {
        let frame = cfg
            .conn
            .max_frame_size
            .max(crate::ledger::LEDGER_MAX_FRAME_SIZE);
        Pool {
            bootstrap: cfg.bootstrap,
            park_conn: cfg.conn.clone().with_max_frame_size(frame),
            conn: cfg.conn,
            limits: cfg.limits,
            retry_backoff: cfg.retry_backoff,
            retry_backoff_max: cfg.retry_backoff_max,
            // A semaphore holds at most MAX_PERMITS (`Semaphore::new` panics beyond): a larger
            // setting means no bound, as that many could never be in use.
            cap: cfg.parking_lanes.clamp(1, Semaphore::MAX_PERMITS),
            stripes: cfg.quick_connections.max(1),
            quick: Mutex::new(HashMap::new()),
            parking: Mutex::new(HashMap::new()),
            reaper: AtomicBool::new(false),
            lookups: Default::default(),
            admission: (cfg.acquisitions_at_once > 0)
                .then(|| Arc::new(Admission::new(cfg.acquisitions_at_once))),
            offsets_partitions: tokio::sync::OnceCell::new(),
            origin: Instant::now().into_std(),
        }
    }

    /// A place among the acquisitions at once, waited for in turn (FIFO); `None` when there is
    /// no bound. Held from an acquisition's start to its first completed generation, at most
    /// [`ADMITTED_FOR`]. How many there are follows the Heartbeats ([`Admission`]).
    pub(crate) async fn admit(&self) -> Option<Admit> {
        let admission = self.admission.clone()?;
        let permit = admission.places.clone().acquire_owned().await.ok()?;
        Some(Admit {
            permit: Some(permit),
            admission,
        })
    }

    /// A Heartbeat of one of the client's members, sent at `sent`, was answered now, or its
    /// request timeout `timeout` ran out: one that took more than a quarter of it cuts the
    /// admission window ([`Admission::slow`]).
    pub(crate) fn heartbeat_answered(&self, sent: Instant, timeout: Duration) {
        let Some(admission) = &self.admission else {
            return;
        };
        if sent.elapsed() > timeout / SLOW_HEARTBEAT_DIVISOR {
            admission.slow(sent);
        }
    }

    /// The admission window now (`None`: no bound).
    #[cfg(test)]
    pub(crate) fn admission_window(&self) -> Option<usize> {
        let admission = self.admission.as_ref()?;
        Some(
            admission
                .window
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .size,
        )
    }

    /// Lanes kept for [`Park::Urgent`]: a quarter of the cap, at least one when the cap allows
    /// two lanes.
    fn reserve(&self) -> usize {
        if self.cap < 2 {
            0
        } else {
            (self.cap / 4).max(1)
        }
    }

    /// Which of a broker's quick connections carries the requests of `group`. Apache serves a
    /// connection one request at a time and may defer a Heartbeat while the group's
    /// `__consumer_offsets` partition has uncommitted writes, holding every later request on
    /// the connection; groups of one partition go on one stripe, so a deferral holds the
    /// groups whose partition is slow anyway and the other stripes' go on. The partition is
    /// Apache's `Utils.abs(groupId.hashCode()) % offsets.topic.num.partitions`, with the
    /// cluster's partition count once [`Pool::learn_offsets_partitions`] has read it, 50 (the
    /// default) until then or when it cannot be read; with a wrong count this is still a hash of
    /// the group id, which spreads groups over the stripes, only without following partitions.
    /// A partition whose leader (as read then) leads fewer partitions than there are stripes
    /// has several stripes of its own ([`Placement`]); after a leader change the placement is
    /// still a hash of the group id.
    pub(crate) fn stripe(&self, group: &str) -> usize {
        // Java's String.hashCode, over UTF-16 code units.
        let h = group
            .encode_utf16()
            .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)));
        // Utils.abs: Integer.MIN_VALUE maps to 0.
        let abs = if h == i32::MIN { 0 } else { h.unsigned_abs() };
        let Some(placement) = self.offsets_partitions.get() else {
            return (abs % OFFSETS_PARTITIONS) as usize % self.stripes;
        };
        let partition = abs % placement.partitions;
        match placement.spread.get(&partition) {
            // The rest of the hash, past the partition, picks within the partition's set: the
            // stripes below `stripes` that are `i` more than a multiple of `n` (i < n < stripes).
            Some(&(i, n)) if i < n && i < self.stripes => {
                let size = (self.stripes - i).div_ceil(n);
                i + (abs / placement.partitions) as usize % size * n
            }
            _ => partition as usize % self.stripes,
        }
    }

    /// Whether [`Pool::learn_offsets_partitions`] would ask.
    pub(crate) fn offsets_partitions_unknown(&self) -> bool {
        self.stripes > 1 && !self.offsets_partitions.initialized()
    }

    /// Reads `__consumer_offsets`' partition count on `conn` (a bootstrap connection), unless it
    /// is known or there is one stripe (then it places nothing). Failures leave the default:
    /// a lock's stripe only chooses among equivalent connections.
    pub(crate) async fn learn_offsets_partitions(&self, conn: &Connection) {
        if !self.offsets_partitions_unknown() {
            return;
        }
        let timeout = self.conn.request_timeout;
        if let Some((n, leaders)) =
            super::lookup::offsets_partitions(conn, timeout, OFFSETS_PARTITIONS).await
        {
            let _ = self
                .offsets_partitions
                .set(Placement::new(n, &leaders, self.stripes));
        }
    }

    /// The quick connection to `broker` (`None`: any bootstrap broker) of `stripe`
    /// ([`Pool::stripe`]; the bootstrap connection has one stripe but for lookups:
    /// [`Pool::lookup_conn`]), opened if needed.
    pub(crate) async fn quick(
        self: &Arc<Self>,
        broker: Option<&Broker>,
        stripe: usize,
    ) -> Result<Connection> {
        let key = (broker.cloned(), if broker.is_some() { stripe } else { 0 });
        self.open_quick(key).await
    }

    /// The bootstrap connection that carries the FindCoordinator lookups of `stripe`
    /// (`super::lookup`): stripe 0 is the one every other bootstrap request takes.
    pub(crate) async fn lookup_conn(self: &Arc<Self>, stripe: usize) -> Result<Connection> {
        self.open_quick((None, stripe)).await
    }

    async fn open_quick(self: &Arc<Self>, key: QuickKey) -> Result<Connection> {
        self.start_reaper();
        let broker = key.0.clone();
        let cell = {
            let mut quick = self.quick.lock().unwrap_or_else(|p| p.into_inner());
            quick.entry(key).or_default().clone()
        };
        *cell.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        let mut guard = cell.conn.lock().await;
        if let Some(c) = guard.as_ref() {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let conn = match &broker {
            None => {
                let mut backoff =
                    Backoff::new(self.retry_backoff, self.retry_backoff_max, 2.0, 0.5);
                connect_any(&self.bootstrap, &self.conn, &mut backoff, &self.limits).await?
            }
            Some(b) => Connection::connect(&address(b), &self.conn).await?,
        };
        *guard = Some(conn.clone());
        Ok(conn)
    }

    /// [`Pool::quick`] if it is open and nobody is opening it, without waiting.
    pub(crate) fn quick_open(&self, broker: Option<&Broker>, stripe: usize) -> Option<Connection> {
        let key = (broker.cloned(), if broker.is_some() { stripe } else { 0 });
        let cell = self
            .quick
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)?
            .clone();
        *cell.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        let guard = cell.conn.try_lock().ok()?;
        guard.as_ref().filter(|c| !c.is_closed()).cloned()
    }

    /// Stops lending `conn` as the quick connection to `broker`: later requests get a fresh
    /// one. `conn` itself stays open for the requests still on it and closes when the last
    /// handle goes.
    pub(crate) fn retire_quick(&self, broker: Option<&Broker>, stripe: usize, conn: &Connection) {
        let key = (broker.cloned(), if broker.is_some() { stripe } else { 0 });
        let cell = match self
            .quick
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            Some(cell) => cell.clone(),
            None => return,
        };
        if let Ok(mut g) = cell.conn.try_lock() {
            if g.as_ref().is_some_and(|c| c.same(conn)) {
                *g = None;
            }
        };
    }

    /// Makes `conn` the bootstrap connection unless one is open already.
    pub(crate) fn offer_bootstrap(&self, conn: &Connection) {
        let cell = {
            let mut quick = self.quick.lock().unwrap_or_else(|p| p.into_inner());
            quick.entry((None, 0)).or_default().clone()
        };
        let offered = match cell.conn.try_lock() {
            Ok(mut g) if g.as_ref().is_none_or(Connection::is_closed) => {
                *g = Some(conn.clone());
                true
            }
            _ => false,
        };
        if offered {
            *cell.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        }
    }

    /// A parking lane to `broker`: an idle one, or a new one while fewer than the cap exist;
    /// otherwise waits for one to come free.
    pub(crate) async fn lane(self: &Arc<Self>, broker: &Broker, park: Park) -> Result<Lane> {
        self.start_reaper();
        let lanes = {
            let mut parking = self.parking.lock().unwrap_or_else(|p| p.into_inner());
            parking
                .entry(broker.clone())
                .or_insert_with(|| {
                    Arc::new(Lanes {
                        all: Arc::new(Semaphore::new(self.cap)),
                        fresh: Arc::new(Semaphore::new(self.cap - self.reserve())),
                        idle: Mutex::new(Vec::new()),
                    })
                })
                .clone()
        };
        let fresh = match park {
            Park::Fresh => Some(
                lanes
                    .fresh
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| Error::Closed)?,
            ),
            Park::Urgent => None,
        };
        // A membership in force never waits for a lane: its parked rejoin may be what the
        // requests holding every lane wait for (the broker ends a join phase only when all of
        // the group's members have rejoined, and they may all be this client's), and waiting
        // past the rebalance timeout costs it its membership. It opens one beyond the cap
        // instead; such lanes number at most the client's memberships rebalancing at once.
        let all = match park {
            Park::Urgent => lanes.all.clone().try_acquire_owned().ok(),
            Park::Fresh => Some(
                lanes
                    .all
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| Error::Closed)?,
            ),
        };
        let reuse = {
            let mut idle = lanes.idle.lock().unwrap_or_else(|p| p.into_inner());
            idle.retain(|(c, _)| !c.is_closed());
            idle.pop().map(|(c, _)| c)
        };
        let conn = match reuse {
            Some(c) => c,
            None => Connection::connect(&address(broker), &self.park_conn).await?,
        };
        Ok(Lane {
            conn: Some(conn),
            lanes,
            all,
            _fresh: fresh,
        })
    }

    /// An idle parking lane to `broker` for an urgent request, taken now or not at all: no
    /// connect, no wait. A rejoin takes one before its task is spawned, so a request spawned
    /// earlier in the same turn (a waiter's long poll, re-armed by the same answer that made the
    /// member rejoin) cannot take the lane the rejoin's JoinGroup would otherwise find idle and
    /// send it to a new connection (its connect, ApiVersions and handshake on the handover's
    /// critical path). Overflow when every lane is lent, as [`Pool::lane`]'s urgent ones.
    pub(crate) fn idle_lane(&self, broker: &Broker) -> Option<Lane> {
        let lanes = self
            .parking
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(broker)?
            .clone();
        let conn = {
            let mut idle = lanes.idle.lock().unwrap_or_else(|p| p.into_inner());
            idle.retain(|(c, _)| !c.is_closed());
            idle.pop().map(|(c, _)| c)
        }?;
        let all = lanes.all.clone().try_acquire_owned().ok();
        Some(Lane {
            conn: Some(conn),
            lanes,
            all,
            _fresh: None,
        })
    }

    /// Closes every connection the pool holds now (the pool stays usable; later requests open
    /// fresh ones).
    /// The quick connections' cells as they are now, so none of their locks is taken under the
    /// map's.
    fn quick_cells(&self) -> Vec<Arc<QuickCell>> {
        let map = self.quick.lock().unwrap_or_else(|p| p.into_inner());
        map.values().cloned().collect()
    }

    /// Every broker's parking lanes as they are now (see `quick_cells`).
    fn all_lanes(&self) -> Vec<Arc<Lanes>> {
        let map = self.parking.lock().unwrap_or_else(|p| p.into_inner());
        map.values().cloned().collect()
    }

    pub(crate) fn close_all(&self) {
        let quick = self.quick_cells();
        for cell in quick {
            if let Ok(g) = cell.conn.try_lock() {
                if let Some(c) = g.as_ref() {
                    c.close();
                }
            }
        }
        let parking = self.all_lanes();
        for lanes in parking {
            for (c, _) in lanes
                .idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .drain(..)
            {
                c.close();
            }
        }
    }

    fn start_reaper(self: &Arc<Self>) {
        if self.reaper.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(reap(Arc::downgrade(self)));
    }

    /// Closes what has been unused for [`IDLE_AFTER`].
    fn reap_once(&self, now: Instant) {
        let cells = self.quick_cells();
        for cell in cells {
            let stale = cell
                .last_used
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some_and(|t| now.saturating_duration_since(t) >= IDLE_AFTER);
            if stale {
                if let Ok(mut g) = cell.conn.try_lock() {
                    if let Some(c) = g.take() {
                        c.close();
                    }
                }
            }
        }
        let parking = self.all_lanes();
        for lanes in parking {
            let mut idle = lanes.idle.lock().unwrap_or_else(|p| p.into_inner());
            idle.retain(|(c, since)| {
                let keep = !c.is_closed() && now.saturating_duration_since(*since) < IDLE_AFTER;
                if !keep {
                    c.close();
                }
                keep
            });
        }
    }
}

async fn reap(pool: Weak<Pool>) {
    loop {
        tokio::time::sleep(IDLE_AFTER / 4).await;
        match pool.upgrade() {
            Some(p) => p.reap_once(Instant::now()),
            None => return,
        }
    }
}

fn address(b: &Broker) -> String {
    format!("{}:{}", b.host, b.port)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What has been unused for [`IDLE_AFTER`] is closed, a quick connection and an idle lane
    /// alike, and nothing sooner: the reaper is driven by hand with the instants on either side.
    #[tokio::test]
    async fn what_is_unused_for_idle_after_is_closed_and_nothing_sooner() {
        let (broker, _accepted) = crate::driver::tests::lane_broker().await;
        let pool = Arc::new(Pool::new(PoolConfig {
            bootstrap: vec![],
            conn: ConnConfig::default(),
            limits: BootstrapConfig::default(),
            retry_backoff: Duration::from_millis(10),
            retry_backoff_max: Duration::from_millis(100),
            parking_lanes: 4,
            quick_connections: 1,
            acquisitions_at_once: 0,
        }));
        let before = Instant::now();
        let bound = Duration::from_secs(10);
        let quick = tokio::time::timeout(bound, pool.quick(Some(&broker), 0))
            .await
            .expect("a loopback connection opens at once")
            .unwrap();
        let lane = tokio::time::timeout(bound, pool.lane(&broker, Park::Fresh))
            .await
            .expect("a loopback connection opens at once")
            .unwrap();
        let parked = lane.conn().clone();
        lane.done();

        pool.reap_once(before + IDLE_AFTER - Duration::from_millis(1));
        assert!(
            !quick.is_closed(),
            "a quick connection closed before it was idle long enough"
        );
        assert!(
            !parked.is_closed(),
            "an idle lane closed before it was idle long enough"
        );

        // Unused for exactly IDLE_AFTER is unused long enough, for both kinds. The quick
        // connection was last used before the lane went idle, so it is reaped first.
        let since = pool.all_lanes()[0]
            .idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())[0]
            .1;
        let used = pool.quick_cells()[0]
            .last_used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .expect("the quick connection was used");
        pool.reap_once(used + IDLE_AFTER);
        assert!(
            quick.is_closed(),
            "a quick connection idle for IDLE_AFTER was kept"
        );
        pool.reap_once(since + IDLE_AFTER);
        assert!(parked.is_closed(), "a lane idle for IDLE_AFTER was kept");
    }

    /// The reaper the pool starts with its first connection runs `reap_once` every quarter of
    /// [`IDLE_AFTER`] on its own: what nobody uses is closed within `IDLE_AFTER` and a quarter,
    /// without any call from the pool's users. Tokio's clock (which the pool reads) is paused
    /// once the connections are open, so the wait costs no real time.
    #[tokio::test]
    async fn the_reaper_closes_idle_connections_on_its_own() {
        let (broker, _accepted) = crate::driver::tests::lane_broker().await;
        let pool = Arc::new(Pool::new(PoolConfig {
            bootstrap: vec![],
            conn: ConnConfig::default(),
            limits: BootstrapConfig::default(),
            retry_backoff: Duration::from_millis(10),
            retry_backoff_max: Duration::from_millis(100),
            parking_lanes: 4,
            quick_connections: 1,
            acquisitions_at_once: 0,
        }));
        let bound = Duration::from_secs(10);
        let quick = tokio::time::timeout(bound, pool.quick(Some(&broker), 0))
            .await
            .expect("a loopback connection opens at once")
            .unwrap();
        let lane = tokio::time::timeout(bound, pool.lane(&broker, Park::Fresh))
            .await
            .expect("a loopback connection opens at once")
            .unwrap();
        let parked = lane.conn().clone();
        // The lane goes idle an eighth of IDLE_AFTER after the reaper started, so that the
        // pass due IDLE_AFTER after its start finds it idle for less, whatever the timer's
        // rounding: it is closed by the pass after, IDLE_AFTER and a quarter from the start.
        tokio::time::pause();
        tokio::time::advance(IDLE_AFTER / 8).await;
        lane.done();
        tokio::time::sleep(IDLE_AFTER + IDLE_AFTER / 8 + Duration::from_secs(1)).await;
        assert!(parked.is_closed(), "an idle lane was kept");
        assert!(quick.is_closed(), "an idle quick connection was kept");
    }

    /// The Heartbeat path's fast lookup lends an open quick connection and never a closed one
    /// (a closed one is opened again by [`Pool::quick`]); a connection offered as the bootstrap
    /// one is lent as such, but never in place of one still open.
    #[tokio::test]
    async fn only_open_connections_are_lent_and_an_open_bootstrap_is_kept() {
        let (broker, _accepted) = crate::driver::tests::lane_broker().await;
        let pool = Arc::new(Pool::new(PoolConfig {
            bootstrap: vec![],
            conn: ConnConfig::default(),
            limits: BootstrapConfig::default(),
            retry_backoff: Duration::from_millis(10),
            retry_backoff_max: Duration::from_millis(100),
            parking_lanes: 4,
            quick_connections: 1,
            acquisitions_at_once: 0,
        }));
        let bound = Duration::from_secs(10);
        let quick = tokio::time::timeout(bound, pool.quick(Some(&broker), 0))
            .await
            .expect("a loopback connection opens at once")
            .unwrap();
        let lent = pool
            .quick_open(Some(&broker), 0)
            .expect("the open one is lent");
        assert!(lent.same(&quick));
        quick.close();
        assert!(
            pool.quick_open(Some(&broker), 0).is_none(),
            "a closed quick connection was lent"
        );

        let at = address(&broker);
        let first = tokio::time::timeout(bound, Connection::connect(&at, &pool.conn))
            .await
            .expect("a loopback connection opens at once")
            .unwrap();
        let second = tokio::time::timeout(bound, Connection::connect(&at, &pool.conn))
            .await
            .expect("a loopback connection opens at once")
            .unwrap();
        pool.offer_bootstrap(&first);
        pool.offer_bootstrap(&second);
        // The bootstrap list is empty: only an offered connection can be lent.
        let boot = tokio::time::timeout(bound, pool.quick(None, 0))
            .await
            .expect("an offered connection is lent at once")
            .expect("the offered connection is the bootstrap one");
        assert!(
            boot.same(&first),
            "an open bootstrap connection was replaced"
        );
        // A session's close (`close_all`) closes what the pool holds.
        pool.close_all();
        assert!(
            first.is_closed(),
            "close_all left the bootstrap connection open"
        );
    }

    /// Whatever the order of admissions, places given back, first generations and cuts, the
    /// window lets an acquisition in exactly when fewer than the window are in: never more (the
    /// places cut while given out are owed, not handed out again), and never fewer, so nothing
    /// waits while the window has room (with none in, there always is: the window is at least
    /// one). Once every place is back, the window's worth are free again.
    #[test]
    fn the_window_admits_exactly_while_fewer_than_it_are_in() {
        use proptest::prelude::*;
        proptest!(|(ceiling in 1usize..12, steps in proptest::collection::vec((0u8..4, 0usize..16), 0..120))| {
            let admission = Arc::new(Admission::new(ceiling));
            let size = |a: &Admission| a.window().size;
            let try_admit = |a: &Arc<Admission>| {
                a.places.clone().try_acquire_owned().ok().map(|permit| Admit {
                    permit: Some(permit),
                    admission: a.clone(),
                })
            };
            let mut out: Vec<Admit> = Vec::new();
            for (op, at) in steps {
                match op {
                    0 => {
                        let room = out.len() < size(&admission);
                        let admitted = try_admit(&admission);
                        prop_assert_eq!(admitted.is_some(), room, "in: {}, window: {}", out.len(), size(&admission));
                        out.extend(admitted);
                    }
                    1 if !out.is_empty() => drop(out.swap_remove(at % out.len())),
                    2 if !out.is_empty() => out.swap_remove(at % out.len()).completed(),
                    _ => {
                        let before = size(&admission);
                        admission.slow(Instant::now());
                        let after = size(&admission);
                        prop_assert!(after == before || (before > 1 && after == before / 2));
                    }
                }
                let w = size(&admission);
                prop_assert!((1..=ceiling).contains(&w), "window {} of {}", w, ceiling);
            }
            drop(out);
            let w = size(&admission);
            let free: Vec<_> = (0..w).map_while(|_| try_admit(&admission)).collect();
            prop_assert_eq!(free.len(), w, "places lost");
            prop_assert!(try_admit(&admission).is_none(), "places beyond the window");
        });
    }
}

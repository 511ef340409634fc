//! A Kafka-aware loopback proxy: the network nemesis.
//!
//! A plain TCP proxy in front of the bootstrap address is bypassed as soon as the client asks
//! for the coordinator, because brokers answer with their own advertised addresses. So each
//! contender gets a [`ProxySet`]: one proxy per broker, and every Metadata and FindCoordinator
//! answer that passes through is rewritten to name that contender's own proxies. All of one
//! contender's traffic then stays on its proxies, and a fault set on them is a fault between
//! that contender and that broker, and nobody else (only loopback addresses are used, a project
//! rule, so network namespaces with private subnets are not an option).
//!
//! Requests are read as frames to learn the API key and version of each correlation id (the
//! first eight bytes of a request header); answers to Metadata and FindCoordinator are decoded
//! with kafka-lock's own codec and re-encoded with kafka-protocol's encoders. Everything else,
//! including the Java client's Fetch and ListOffsets, passes through as opaque frames.
//!
//! Faults, per proxy and direction ("up" is client to broker):
//! - [`Fault::Blackhole`]: stop forwarding but keep every socket open; frames already read are
//!   held and delivered after the heal, as TCP would retransmit them across a partition that
//!   healed before the peers gave up.
//! - [`Fault::Reset`]: close every connection with an RST (zero linger), and reset new ones.
//!   [`Fault::ResetFrom`] does so only to the connections numbered from a bound on (those opened
//!   after a stall began), and [`Fault::StallAndReset`] also stalls the older ones.
//! - [`Fault::Delay`]: deliver each frame that long after it was read, in order.
//! - [`Fault::Stall`] ([`ProxySet::stall`]): hold, both ways, only the connections open when it
//!   began, as a path that stopped carrying some flows; new connections pass. A client that gave
//!   up on a stalled request and resent it on a new connection has its resend delivered first,
//!   and the stale request after the heal, even if it closed the old connection meanwhile (a
//!   client's frames read before its end of stream are delivered before the proxy closes).
//!
//! [`ProxySet::hold_heartbeats`] holds every Heartbeat answer the broker sends for a while,
//! and, since a connection's answers go out in order, every answer behind it on its connection:
//! what a client sees when Apache defers a Heartbeat (a coordinator write) while the group's
//! offsets partition has uncommitted writes. A held answer whose connection the client closes
//! before it is delivered is counted ([`ProxyStats::heartbeats_abandoned`]).
//!
//! [`ProxySet::hold_fetches`] does the same to every Fetch answer (the ledger's long polls):
//! a waiter whose poll answer is held past the poll's wait learns of a release only through its
//! Heartbeats, and one held past its request bound gives the poll up.
//!
//! [`ProxySet::cut_after_sync`] arms a trigger instead: the next SyncGroup answer through any of
//! the set's proxies is delivered, and then every proxy of the set black-holes both ways. A
//! member whose assignment names it is cut off before its first Heartbeat can get out.
//! [`ProxySet::cut_when_granted`] sets a fault on one broker's proxy right after the SyncGroup
//! answer that makes the contender a holder, before its first request to that broker as one.
//! [`ProxySet::stall_next_join`] arms another: the next JoinGroup through any of the set's
//! proxies is held, with the connection it came on (a stall of that proxy's open connections),
//! and the client's side of that connection is shut down, so the client resends at once on a
//! new one while the broker receives the stalled JoinGroup only at the heal.
//! [`ProxySet::hold_next_commit`] arms a third: the next OffsetCommit answer through any of the
//! set's proxies is held, with every later answer of that broker, until the proxy's fault is
//! cleared: the broker has committed the checkpoint, the client does not know yet.
//! [`ProxySet::cut_at_next_commit`] cuts earlier: the next OffsetCommit request is held, with
//! that broker's proxy black-holed both ways before it is forwarded, so the broker sees the
//! commit only after the heal (and refuses it if it has dropped the member meanwhile).
//! [`ProxySet::hold_ledger_checks`] holds the answers to the DescribeConfigs requests naming a
//! topic (the last step of an acquisition's check of its ledger topic) read within a window,
//! each until the window's end, and counts every JoinGroup without a member id (an
//! acquisition's first) read while one of them is held ([`ProxyStats::joins_before_check`]).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_lock::internals::assign::NativeAssignment;
use kafka_lock::internals::wire::{decode_response_frame, Response};
use kafka_protocol::messages::{ApiKey, ResponseHeader};
use kafka_protocol::protocol::{Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Larger than any frame a lock client or the Java consumer on an empty topic exchanges.
const MAX_FRAME: usize = 64 << 20;

/// Which way a fault applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Client to broker only.
    Up,
    /// Broker to client only.
    Down,
    Both,
}

impl Dir {
    fn covers(self, d: Dir) -> bool {
        self == Dir::Both || self == d
    }
}

/// What a proxy does to the traffic through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Clear,
    Blackhole(Dir),
    Reset,
    Delay(Duration, Dir),
    /// Hold the connections numbered below this (the set's connection count when it began).
    Stall(u64),
    /// Hold the connections numbered below this and reset the others, new ones too.
    StallAndReset(u64),
    /// Reset the connections numbered from this on, new ones too; the older ones pass.
    ResetFrom(u64),
}

impl Fault {
    fn holds(self, d: Dir, connection: u64) -> bool {
        match self {
            Fault::Blackhole(x) => x.covers(d),
            Fault::Stall(before) | Fault::StallAndReset(before) => connection < before,
            _ => false,
        }
    }

    fn resets(self, connection: u64) -> bool {
        match self {
            Fault::Reset => true,
            Fault::StallAndReset(from) | Fault::ResetFrom(from) => connection >= from,
            _ => false,
        }
    }

    fn delay(self, d: Dir) -> Duration {
        match self {
            Fault::Delay(t, x) if x.covers(d) => t,
            _ => Duration::ZERO,
        }
    }
}

/// Counters shared by the proxies of one set.
#[derive(Debug, Default)]
pub struct ProxyStats {
    pub connections: AtomicU64,
    pub rewritten: AtomicU64,
    /// Answers that could not be rewritten and went through unchanged: the client may then
    /// bypass the proxies, so a run reports them.
    pub rewrite_failures: AtomicU64,
    pub last_failure: Mutex<Option<String>>,
    /// Requests forwarded, by API key: what a client costs the brokers.
    pub requests: Mutex<HashMap<i16, u64>>,
    /// Heartbeat answers held by [`ProxySet::hold_heartbeats`].
    pub heartbeats_held: AtomicU64,
    /// Held Heartbeat answers never delivered because the client closed their connection
    /// first: it gave up on a Heartbeat the broker was still holding, and every request queued
    /// behind it on that connection with it.
    pub heartbeats_abandoned: AtomicU64,
    /// Fetch answers held by [`ProxySet::hold_fetches`].
    pub fetches_held: AtomicU64,
    /// DescribeConfigs requests naming the held topic by [`ProxySet::hold_ledger_checks`], and how
    /// many of them are still unanswered to the client (the client's connection open).
    pub checks_held: AtomicU64,
    pub checks_pending: AtomicU64,
    /// JoinGroups without a member id read while a held DescribeConfigs answer naming the
    /// ledger topic was not let out: an acquisition that joined before its ledger topic's check
    /// passed.
    pub joins_before_check: AtomicU64,
}

/// The state of [`ProxySet::hold_ledger_checks`], shared by every connection of a set.
#[derive(Default)]
struct CheckHold {
    /// The topic whose DescribeConfigs requests are held, and the end of the window: answers
    /// to those read before it are let out at it.
    window: Mutex<Option<(Vec<u8>, Instant)>>,
}

impl CheckHold {
    /// The window's end, if `frame` is a DescribeConfigs request naming the held topic read
    /// within it. Not the check's Metadata: the check sends it on the acquisition's first
    /// connection, and the coordinator's lookup often follows it there, so a held Metadata
    /// answer holds the FindCoordinator answer queued behind it (answers go out in order) and
    /// no JoinGroup could go early anyway. The DescribeConfigs, sent once the Metadata is
    /// answered, finds the lookup answered already.
    fn holds(&self, frame: &[u8]) -> Option<Instant> {
        if frame.len() < 2
            || ApiKey::try_from(i16::from_be_bytes([frame[0], frame[1]]))
                != Ok(ApiKey::DescribeConfigs)
        {
            return None;
        }
        let window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let (topic, until) = window.as_ref()?;
        // The name's bytes anywhere in the request: the topic names are unique to the run and
        // no header field carries them, so this holds for every version alike.
        (*until > Instant::now() && frame.windows(topic.len()).any(|w| w == &topic[..]))
            .then_some(*until)
    }
}

/// The state of [`ProxySet::hold_heartbeats`] (or [`ProxySet::hold_fetches`]), shared by every
/// connection of a set.
#[derive(Default)]
struct HeartbeatHold {
    /// Heartbeat answers read before this instant are delivered at it.
    until: Mutex<Option<Instant>>,
}

impl HeartbeatHold {
    fn until(&self) -> Option<Instant> {
        let until = *self.until.lock().unwrap_or_else(|p| p.into_inner());
        until.filter(|&u| u > Instant::now())
    }
}

struct BrokerProxy {
    node_id: i32,
    port: u16,
    fault: watch::Sender<Fault>,
    accept: tokio::task::AbortHandle,
}

/// One contender's proxies, one per broker. Dropped, every listener and connection closes.
pub struct ProxySet {
    proxies: Vec<BrokerProxy>,
    stats: Arc<ProxyStats>,
    sync_cut: Arc<SyncCut>,
    join_stall: Arc<JoinStall>,
    hb_hold: Arc<HeartbeatHold>,
    fetch_hold: Arc<HeartbeatHold>,
    commit_hold: Arc<CommitHold>,
    check_hold: Arc<CheckHold>,
}

/// The trigger of [`ProxySet::hold_next_commit`], shared by every connection of a set.
#[derive(Default)]
struct CommitHold {
    armed: std::sync::atomic::AtomicBool,
    /// [`ProxySet::cut_at_next_commit`]'s trigger: it fires on the request, not the answer.
    cut: std::sync::atomic::AtomicBool,
    /// The node whose OffsetCommit answer (or, for the cut, request) is held, once one is.
    node: Mutex<Option<i32>>,
}

/// What a connection may trip: the set's triggers, and its own proxy's fault, which a stalled
/// JoinGroup sets.
#[derive(Clone)]
struct Triggers {
    sync_cut: Arc<SyncCut>,
    join_stall: Arc<JoinStall>,
    hb_hold: Arc<HeartbeatHold>,
    fetch_hold: Arc<HeartbeatHold>,
    commit_hold: Arc<CommitHold>,
    check_hold: Arc<CheckHold>,
    fault: watch::Sender<Fault>,
    node: i32,
}

/// The trigger of [`ProxySet::stall_next_join`], shared by every connection of a set.
#[derive(Default)]
struct JoinStall {
    armed: std::sync::atomic::AtomicBool,
    fired: std::sync::atomic::AtomicBool,
    /// The node the stalled JoinGroup was for, and the stall's bound.
    stalled: Mutex<Option<(i32, u64)>>,
    /// The stalled JoinGroup's connection, correlation id and version, and what the broker
    /// answered to it once it was let out (the client no longer reads it; the proxy does).
    pending: Mutex<Option<(u64, i32, i16)>>,
    answer: Mutex<Option<String>>,
}

impl JoinStall {
    /// A request was read from the client on `client`: if it is a JoinGroup and the trigger
    /// is armed, stall the connections of this proxy open now, this one included, before it is
    /// forwarded, and shut the client's side of this one down (it sees the connection end and
    /// resends on a new one at once) while the stalled JoinGroup waits for the heal, as the
    /// data a client's kernel still holds for a closed socket reaches the peer once a path
    /// heals.
    fn request_read(
        &self,
        frame: &[u8],
        (connection, client): (u64, std::os::fd::RawFd),
        (node, fault): (i32, &watch::Sender<Fault>),
        stats: &ProxyStats,
    ) {
        if joins_as_member(frame) && self.armed.swap(false, Ordering::SeqCst) {
            let before = stats.connections.load(Ordering::SeqCst);
            fault.send_replace(Fault::Stall(before));
            *self.stalled.lock().unwrap_or_else(|p| p.into_inner()) = Some((node, before));
            let version = i16::from_be_bytes([frame[2], frame[3]]);
            let correlation = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
            *self.pending.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((connection, correlation, version));
            // SAFETY: shutdown(2) on the client's socket, which the caller's read half keeps
            // open; no memory is shared.
            #[allow(unsafe_code)]
            unsafe {
                libc::shutdown(client, libc::SHUT_RDWR);
            }
            self.fired.store(true, Ordering::SeqCst);
        }
    }

    /// Whether `connection` carries the stalled JoinGroup.
    fn is_stalled(&self, connection: u64) -> bool {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|(c, _, _)| c == connection)
    }

    /// An answer was read from the broker on `connection`: if it answers the stalled
    /// JoinGroup, keep what it says.
    fn answer_read(&self, connection: u64, frame: &[u8]) {
        let Some((c, correlation, version)) =
            *self.pending.lock().unwrap_or_else(|p| p.into_inner())
        else {
            return;
        };
        if c != connection || frame.get(..4) != Some(&correlation.to_be_bytes()[..]) {
            return;
        }
        let said = match decode_response_frame(frame, ApiKey::JoinGroup, version, correlation) {
            Ok(Response::JoinGroup(r)) => format!(
                "generation {} error {} member {}",
                r.generation_id, r.error_code, r.member_id
            ),
            other => format!("undecodable: {other:?}"),
        };
        *self.answer.lock().unwrap_or_else(|p| p.into_inner()) = Some(said);
    }
}

/// Whether `frame` is a JoinGroup under a member id: one with an empty id can only make a new
/// pending member, never re-arm an existing one.
fn joins_as_member(frame: &[u8]) -> bool {
    use kafka_protocol::messages::{JoinGroupRequest, RequestHeader};
    use kafka_protocol::protocol::{Decodable, HeaderVersion};
    if frame.len() < 4
        || ApiKey::try_from(i16::from_be_bytes([frame[0], frame[1]])) != Ok(ApiKey::JoinGroup)
    {
        return false;
    }
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let mut buf = Bytes::copy_from_slice(frame);
    RequestHeader::decode(&mut buf, JoinGroupRequest::header_version(version))
        .and_then(|_| JoinGroupRequest::decode(&mut buf, version))
        .is_ok_and(|r| !r.member_id.is_empty())
}

/// The triggers of [`ProxySet::cut_after_sync`] and [`ProxySet::cut_when_granted`], shared by
/// every connection of a set.
#[derive(Default)]
struct SyncCut {
    armed: std::sync::atomic::AtomicBool,
    /// Every proxy's node and fault, set once the set is built.
    faults: std::sync::OnceLock<Vec<(i32, watch::Sender<Fault>)>>,
    /// [`ProxySet::cut_when_granted`]: the node and the fault to set on its proxy.
    granted: Mutex<Option<(i32, Fault)>>,
    granted_fired: std::sync::atomic::AtomicBool,
}

impl SyncCut {
    /// A SyncGroup answer is on its way to the client: if armed, cut everything after it; if
    /// the grant trigger is armed and the answer makes the client a holder of a native lock,
    /// set its fault on its node's proxy.
    fn sync_answered(&self, frame: &[u8], version: i16, correlation: i32) {
        if self.armed.swap(false, Ordering::SeqCst) {
            for (_, f) in self.faults.get().into_iter().flatten() {
                f.send_replace(Fault::Blackhole(Dir::Both));
            }
        }
        let mut granted = self.granted.lock().unwrap_or_else(|p| p.into_inner());
        let Some((node, fault)) = *granted else {
            return;
        };
        // Every member's assignment names the holder; only a holder's has position 0.
        let holds = match decode_response_frame(frame, ApiKey::SyncGroup, version, correlation) {
            Ok(Response::SyncGroup(r)) => {
                r.error_code == 0
                    && NativeAssignment::decode(&r.assignment)
                        .is_ok_and(|a| a.position == 0 && a.holder.is_some())
            }
            _ => false,
        };
        if holds {
            *granted = None;
            for (_, f) in self
                .faults
                .get()
                .into_iter()
                .flatten()
                .filter(|(n, _)| *n == node)
            {
                f.send_replace(fault);
            }
            self.granted_fired.store(true, Ordering::SeqCst);
        }
    }
}

impl ProxySet {
    /// A proxy on a free loopback port for each `(node id, address)` broker, on `rt`.
    pub fn start(rt: &Handle, brokers: &[(i32, SocketAddr)]) -> ProxySet {
        let listeners: Vec<std::net::TcpListener> = brokers
            .iter()
            .map(|_| {
                let l = std::net::TcpListener::bind("127.0.0.1:0")
                    .unwrap_or_else(|e| panic!("proxy cannot bind a loopback port: {e}"));
                l.set_nonblocking(true).expect("non-blocking listener");
                l
            })
            .collect();
        let ports: Arc<HashMap<i32, u16>> = Arc::new(
            brokers
                .iter()
                .zip(&listeners)
                .map(|((id, _), l)| (*id, l.local_addr().expect("bound").port()))
                .collect(),
        );
        let stats = Arc::new(ProxyStats::default());
        let sync_cut = Arc::new(SyncCut::default());
        let join_stall = Arc::new(JoinStall::default());
        let hb_hold = Arc::new(HeartbeatHold::default());
        let fetch_hold = Arc::new(HeartbeatHold::default());
        let commit_hold = Arc::new(CommitHold::default());
        let check_hold = Arc::new(CheckHold::default());
        let proxies: Vec<BrokerProxy> = brokers
            .iter()
            .zip(listeners)
            .map(|(&(node_id, target), listener)| {
                let port = ports[&node_id];
                let (fault, rx) = watch::channel(Fault::Clear);
                let (ports, stats) = (ports.clone(), stats.clone());
                let triggers = Triggers {
                    sync_cut: sync_cut.clone(),
                    join_stall: join_stall.clone(),
                    hb_hold: hb_hold.clone(),
                    fetch_hold: fetch_hold.clone(),
                    commit_hold: commit_hold.clone(),
                    check_hold: check_hold.clone(),
                    fault: fault.clone(),
                    node: node_id,
                };
                let accept = rt
                    .spawn(async move {
                        let listener = TcpListener::from_std(listener).expect("register listener");
                        accept_loop(listener, target, ports, rx, stats, triggers).await;
                    })
                    .abort_handle();
                BrokerProxy {
                    node_id,
                    port,
                    fault,
                    accept,
                }
            })
            .collect();
        let _ = sync_cut.faults.set(
            proxies
                .iter()
                .map(|p| (p.node_id, p.fault.clone()))
                .collect(),
        );
        ProxySet {
            proxies,
            stats,
            sync_cut,
            join_stall,
            hb_hold,
            fetch_hold,
            commit_hold,
            check_hold,
        }
    }

    /// Holds the answer to every DescribeConfigs request naming `topic` read from now for `length`,
    /// until then, with the answers queued behind it on its connection.
    pub fn hold_ledger_checks(&self, topic: &str, length: Duration) {
        *self
            .check_hold
            .window
            .lock()
            .unwrap_or_else(|p| p.into_inner()) =
            Some((topic.as_bytes().to_vec(), Instant::now() + length));
    }

    /// Arms the trigger: the next OffsetCommit answer to this contender is held, with every
    /// answer after it from that broker (a [`Fault::Blackhole`] of answers on that broker's
    /// proxy, set before the answer is queued), until [`ProxySet::set`] or
    /// [`ProxySet::set_all`] clears it. `false` disarms it if it has not fired.
    pub fn hold_next_commit(&self, arm: bool) {
        if arm {
            *self
                .commit_hold
                .node
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = None;
        }
        self.commit_hold.armed.store(arm, Ordering::SeqCst);
    }

    /// Arms the trigger: the next OffsetCommit request from this contender is held, and the
    /// proxy in front of its broker black-holes both ways from then on (set before the request
    /// is forwarded), until [`ProxySet::set`] or [`ProxySet::set_all`] clears it. The broker
    /// reads the commit only after the heal. `false` disarms it if it has not fired.
    pub fn cut_at_next_commit(&self, arm: bool) {
        if arm {
            *self
                .commit_hold
                .node
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = None;
        }
        self.commit_hold.cut.store(arm, Ordering::SeqCst);
    }

    /// The broker whose OffsetCommit answer the trigger of [`ProxySet::hold_next_commit`]
    /// holds (or whose proxy [`ProxySet::cut_at_next_commit`] cut), once one is.
    pub fn commit_held(&self) -> Option<i32> {
        *self
            .commit_hold
            .node
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Holds every Heartbeat answer read from now for `length` and delivers it then, with the
    /// answers queued behind it on its connection (they go out in order).
    pub fn hold_heartbeats(&self, length: Duration) {
        *self.hb_hold.until.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Instant::now() + length);
    }

    /// Holds every Fetch answer read from now for `length` and delivers it then, with the
    /// answers queued behind it on its connection.
    pub fn hold_fetches(&self, length: Duration) {
        *self
            .fetch_hold
            .until
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + length);
    }

    /// Arms the trigger: the next SyncGroup answer to this contender is delivered, then every
    /// proxy of the set black-holes both ways (until [`ProxySet::set_all`] clears it).
    pub fn cut_after_sync(&self) {
        self.sync_cut.armed.store(true, Ordering::SeqCst);
    }

    /// Arms (or with `None` disarms) the trigger: the next SyncGroup answer that makes this
    /// contender a holder of a native lock (position 0 in its assignment) is delivered, and
    /// then `fault` is set on the proxy in front of `node` (until [`ProxySet::set`] clears it).
    pub fn cut_when_granted(&self, cut: Option<(i32, Fault)>) {
        self.sync_cut.granted_fired.store(false, Ordering::SeqCst);
        *self
            .sync_cut
            .granted
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = cut;
    }

    /// Whether the trigger armed by [`ProxySet::cut_when_granted`] has set its fault.
    pub fn granted_cut_fired(&self) -> bool {
        self.sync_cut.granted_fired.load(Ordering::SeqCst)
    }

    /// Whether the trigger armed by [`ProxySet::cut_after_sync`] is still waiting.
    pub fn cut_after_sync_pending(&self) -> bool {
        self.sync_cut.armed.load(Ordering::SeqCst)
    }

    /// Arms the trigger: the next JoinGroup from this contender is held, with every connection
    /// open then to the broker it was sent to (a [`Fault::Stall`] of that proxy), until
    /// [`ProxySet::set`] or [`ProxySet::set_all`] clears it; the client's side of the connection
    /// it came on is shut down. New connections pass, so a resend is answered while the stalled
    /// JoinGroup waits.
    pub fn stall_next_join(&self) {
        *self
            .join_stall
            .stalled
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        *self
            .join_stall
            .answer
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        self.join_stall.fired.store(false, Ordering::SeqCst);
        self.join_stall.armed.store(true, Ordering::SeqCst);
    }

    /// Whether the trigger armed by [`ProxySet::stall_next_join`] has held a JoinGroup.
    pub fn join_stalled(&self) -> bool {
        self.join_stall.fired.load(Ordering::SeqCst)
    }

    /// What the broker answered to the stalled JoinGroup, once let out (`None`: no answer yet).
    pub fn stalled_join_answer(&self) -> Option<String> {
        self.join_stall
            .answer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The broker the stalled JoinGroup was for, and the [`Fault::Stall`] bound that holds it.
    pub fn stalled_join(&self) -> Option<(i32, u64)> {
        *self
            .join_stall
            .stalled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The proxies' addresses, for the contender's bootstrap list.
    pub fn bootstrap(&self) -> String {
        self.proxies
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Sets the fault on the proxy in front of broker `node_id`.
    pub fn set(&self, node_id: i32, fault: Fault) {
        for p in self.proxies.iter().filter(|p| p.node_id == node_id) {
            p.fault.send_replace(fault);
        }
    }

    /// Stalls the connections to broker `node_id` open now; later ones pass. Cleared by `set`.
    pub fn stall(&self, node_id: i32) {
        let open = self.stats.connections.load(Ordering::SeqCst);
        self.set(node_id, Fault::Stall(open));
    }

    /// Sets the fault on every proxy of the set: the contender cut off from the whole cluster.
    /// Disarms [`ProxySet::cut_after_sync`], [`ProxySet::stall_next_join`],
    /// [`ProxySet::hold_next_commit`] and [`ProxySet::cut_at_next_commit`] if they have not
    /// fired.
    pub fn set_all(&self, fault: Fault) {
        self.sync_cut.armed.store(false, Ordering::SeqCst);
        self.join_stall.armed.store(false, Ordering::SeqCst);
        self.commit_hold.armed.store(false, Ordering::SeqCst);
        self.commit_hold.cut.store(false, Ordering::SeqCst);
        for p in &self.proxies {
            p.fault.send_replace(fault);
        }
    }

    pub fn stats(&self) -> &ProxyStats {
        &self.stats
    }
}

impl Drop for ProxySet {
    fn drop(&mut self) {
        for p in &self.proxies {
            // Connections watch the fault channel; a reset closes them before the sender goes.
            p.fault.send_replace(Fault::Reset);
            p.accept.abort();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    ports: Arc<HashMap<i32, u16>>,
    fault: watch::Receiver<Fault>,
    stats: Arc<ProxyStats>,
    triggers: Triggers,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let number = stats.connections.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(connection(
            number,
            client,
            target,
            ports.clone(),
            fault.clone(),
            stats.clone(),
            triggers.clone(),
        ));
    }
}

/// Closes with an RST rather than a FIN, as a broker host that lost the connection would.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

async fn connection(
    number: u64,
    client: TcpStream,
    target: SocketAddr,
    ports: Arc<HashMap<i32, u16>>,
    mut fault: watch::Receiver<Fault>,
    stats: Arc<ProxyStats>,
    triggers: Triggers,
) {
    if fault.borrow_and_update().resets(number) {
        reset(&client);
        return;
    }
    let upstream = match TcpStream::connect(target).await {
        Ok(s) => s,
        Err(_) => {
            // The broker is down: the client sees what it would see without the proxy.
            reset(&client);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let client_fd = std::os::fd::AsRawFd::as_raw_fd(&client);
    let (cr, mut cw) = client.into_split();
    let (ur, mut uw) = upstream.into_split();
    // Correlation id -> (API, version) of the requests whose answers are rewritten.
    let inflight: Arc<Mutex<HashMap<i32, (ApiKey, i16)>>> = Arc::default();
    let (up_tx, up_rx) = mpsc::unbounded_channel();
    let (down_tx, down_rx) = mpsc::unbounded_channel();
    let requests = inflight.clone();
    let counts = stats.clone();
    let seen = stats.clone();
    let Triggers {
        sync_cut: cut,
        join_stall,
        hb_hold,
        fetch_hold,
        commit_hold,
        check_hold,
        fault: own_fault,
        node,
    } = triggers;
    // The connection's OffsetCommits in flight (correlation ids).
    let commits: Arc<Mutex<std::collections::HashSet<i32>>> = Arc::default();
    let (asked_commit, answered_commit) = (commits.clone(), commits);
    let commit_fault = own_fault.clone();
    let commit_cut = commit_hold.clone();
    // The connection's Heartbeats in flight (correlation ids), and how many of their answers
    // are held and not yet written to the client.
    let heartbeats: Arc<Mutex<std::collections::HashSet<i32>>> = Arc::default();
    let (asked, answered_hb) = (heartbeats.clone(), heartbeats);
    // The same for its Fetches.
    let fetches: Arc<Mutex<std::collections::HashSet<i32>>> = Arc::default();
    let (asked_fetch, answered_fetch) = (fetches.clone(), fetches);
    let pending_held = Arc::new(AtomicU64::new(0));
    let (held_in, held_out) = (pending_held.clone(), pending_held.clone());
    // The connection's held DescribeConfigs requests naming the ledger topic (correlation ids, with
    // the window's end), and how many of their answers are not yet written to the client.
    let checks: Arc<Mutex<HashMap<i32, Instant>>> = Arc::default();
    let (asked_check, answered_check) = (checks.clone(), checks);
    let checks_here = Arc::new(AtomicU64::new(0));
    let (check_in, check_out) = (checks_here.clone(), checks_here.clone());
    let (check_stats, check_out_stats, check_end_stats) =
        (stats.clone(), stats.clone(), stats.clone());
    let (hold_stats, abandon_stats) = (stats.clone(), stats.clone());
    let answered = join_stall.clone();
    let answered_here = join_stall.clone();
    let read = move |frame: &Bytes| {
        join_stall.request_read(frame, (number, client_fd), (node, &own_fault), &seen);
        if frame.len() >= 8 {
            let correlation = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
            if let Some(until) = check_hold.holds(frame) {
                asked_check
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(correlation, until);
                check_stats.checks_held.fetch_add(1, Ordering::SeqCst);
                check_stats.checks_pending.fetch_add(1, Ordering::SeqCst);
                check_in.fetch_add(1, Ordering::SeqCst);
            }
            // Counted as the proxy reads it: the JoinGroup left the client before the answer.
            if ApiKey::try_from(i16::from_be_bytes([frame[0], frame[1]])) == Ok(ApiKey::JoinGroup)
                && !joins_as_member(frame)
                && check_stats.checks_pending.load(Ordering::SeqCst) > 0
            {
                check_stats
                    .joins_before_check
                    .fetch_add(1, Ordering::SeqCst);
            }
            let key = ApiKey::try_from(i16::from_be_bytes([frame[0], frame[1]]));
            // Set before the request is forwarded: `pump_in` then holds it with the black-hole.
            if key == Ok(ApiKey::OffsetCommit) && commit_cut.cut.swap(false, Ordering::SeqCst) {
                own_fault.send_replace(Fault::Blackhole(Dir::Both));
                *commit_cut.node.lock().unwrap_or_else(|p| p.into_inner()) = Some(node);
            }
            match key {
                Ok(ApiKey::Heartbeat) => &asked,
                Ok(ApiKey::Fetch) => &asked_fetch,
                Ok(ApiKey::OffsetCommit) => &asked_commit,
                _ => return None,
            }
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(correlation);
        }
        None
    };
    let up_read = pump_in(
        cr,
        Dir::Up,
        number,
        fault.clone(),
        up_tx,
        read,
        move |frame| {
            note_request(&frame, &requests);
            if frame.len() >= 2 {
                let key = i16::from_be_bytes([frame[0], frame[1]]);
                *counts
                    .requests
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(key)
                    .or_default() += 1;
            }
            frame
        },
    );
    let answers = inflight;
    // The frame handed back is queued for the client whatever the fault becomes meanwhile, so
    // a cut set here comes right after it.
    let down_read = pump_in(
        ur,
        Dir::Down,
        number,
        fault.clone(),
        down_tx,
        move |frame: &Bytes| {
            answered.answer_read(number, frame);
            let correlation = frame
                .get(..4)
                .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))?;
            let heartbeat = answered_hb
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&correlation);
            let fetch = answered_fetch
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&correlation);
            let commit = answered_commit
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&correlation);
            let check = answered_check
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&correlation);
            if let Some(until) = check {
                return Some((until, Held::Check));
            }
            // Set before the frame is queued: `pump_in` then holds it with the black-hole.
            if commit && commit_hold.armed.swap(false, Ordering::SeqCst) {
                commit_fault.send_replace(Fault::Blackhole(Dir::Down));
                *commit_hold.node.lock().unwrap_or_else(|p| p.into_inner()) = Some(node);
            }
            if let Some(until) = fetch_hold.until().filter(|_| fetch) {
                hold_stats.fetches_held.fetch_add(1, Ordering::SeqCst);
                // Not counted as a held Heartbeat: a client may give a held poll up.
                return Some((until, Held::No));
            }
            let until = hb_hold.until().filter(|_| heartbeat)?;
            hold_stats.heartbeats_held.fetch_add(1, Ordering::SeqCst);
            held_in.fetch_add(1, Ordering::SeqCst);
            Some((until, Held::Heartbeat))
        },
        move |frame| rewrite_answer(frame, &answers, &ports, &stats, &cut),
    );
    let reset_now = async {
        loop {
            if fault.borrow_and_update().resets(number) {
                return;
            }
            if fault.changed().await.is_err() {
                return;
            }
        }
    };
    // At the client's end of stream, what it sent before is still delivered (its sender is
    // dropped with `up_read`, so `pump_out` ends once it has written the rest).
    let up = async {
        let _ = tokio::join!(up_read, pump_out(&mut uw, up_rx));
        // A stalled JoinGroup let out after its client left: keep the connection to the broker
        // open until its answer is read (the write to the gone client then fails), so the run
        // can tell whether the broker counted it. A JoinGroup is parked at most the rebalance
        // timeout.
        if answered_here.is_stalled(number) {
            tokio::time::sleep(Duration::from_secs(15)).await;
        }
    };
    let check_written = || {
        check_out.fetch_sub(1, Ordering::SeqCst);
        check_out_stats
            .checks_pending
            .fetch_sub(1, Ordering::SeqCst);
    };
    let was_reset = tokio::select! {
        _ = up => false,
        _ = down_read => false,
        _ = pump_out_counting(&mut cw, down_rx, &held_out, &check_written) => false,
        _ = reset_now => true,
    };
    // Held checks never let out: the connection is gone, so they hold nothing back any more.
    check_end_stats
        .checks_pending
        .fetch_sub(checks_here.swap(0, Ordering::SeqCst), Ordering::SeqCst);
    // A reset is the proxy's own doing, not the client giving up.
    let abandoned = pending_held.load(Ordering::SeqCst);
    if abandoned > 0 && !was_reset {
        abandon_stats
            .heartbeats_abandoned
            .fetch_add(abandoned, Ordering::SeqCst);
    }
    if was_reset {
        reset(cw.as_ref());
        reset(uw.as_ref());
    }
}

/// What a frame held back is, for the counts taken as it is written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Held {
    No,
    Heartbeat,
    /// An answer held by [`ProxySet::hold_ledger_checks`].
    Check,
}

/// A frame, when it is due at the other side, and what it is if held.
type Timed = (Bytes, Instant, Held);

/// Reads frames from one side and queues them, each with the time it is due at the other side.
/// `read` sees each frame as soon as it is read, and may set a fault that holds it, or return
/// an instant before which it is not delivered, and whether it is a held Heartbeat answer.
async fn pump_in(
    mut from: OwnedReadHalf,
    dir: Dir,
    connection: u64,
    mut fault: watch::Receiver<Fault>,
    to: mpsc::UnboundedSender<Timed>,
    mut read: impl FnMut(&Bytes) -> Option<(Instant, Held)>,
    mut each: impl FnMut(Bytes) -> Bytes,
) -> io::Result<()> {
    loop {
        wait_unheld(&mut fault, dir, connection).await;
        let Some(frame) = read_frame(&mut from).await? else {
            return Ok(());
        };
        let read_at = Instant::now();
        let not_before = read(&frame);
        // A frame read just before a black-hole began is held with the rest.
        wait_unheld(&mut fault, dir, connection).await;
        let due = read_at + fault.borrow().delay(dir);
        let held = not_before.map_or(Held::No, |(_, held)| held);
        let due = not_before.map_or(due, |(n, _)| n.max(due));
        if to.send((each(frame), due, held)).is_err() {
            return Ok(());
        }
    }
}

async fn wait_unheld(fault: &mut watch::Receiver<Fault>, dir: Dir, connection: u64) {
    while fault.borrow_and_update().holds(dir, connection) {
        if fault.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

async fn pump_out(to: &mut OwnedWriteHalf, from: mpsc::UnboundedReceiver<Timed>) {
    pump_out_counting(to, from, &AtomicU64::new(0), &|| {}).await
}

/// [`pump_out`], taking each held Heartbeat answer written off `held`, and calling `check_out`
/// as each held check's answer is written.
async fn pump_out_counting(
    to: &mut OwnedWriteHalf,
    mut from: mpsc::UnboundedReceiver<Timed>,
    held: &AtomicU64,
    check_out: &(dyn Fn() + Sync),
) {
    while let Some((frame, due, was_held)) = from.recv().await {
        tokio::time::sleep_until(due).await;
        let len = (frame.len() as u32).to_be_bytes();
        if to.write_all(&len).await.is_err() || to.write_all(&frame).await.is_err() {
            return;
        }
        match was_held {
            Held::Heartbeat => {
                held.fetch_sub(1, Ordering::SeqCst);
            }
            Held::Check => check_out(),
            Held::No => {}
        }
    }
}

/// One frame's body (without its length prefix), or `None` at a clean end of stream.
async fn read_frame(from: &mut OwnedReadHalf) -> io::Result<Option<Bytes>> {
    let mut len = [0u8; 4];
    match from.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = i32::from_be_bytes(len);
    if len < 0 || len as usize > MAX_FRAME {
        return Err(io::Error::other(format!("frame length {len}")));
    }
    let mut body = BytesMut::zeroed(len as usize);
    from.read_exact(&mut body).await?;
    Ok(Some(body.freeze()))
}

fn note_request(frame: &[u8], inflight: &Mutex<HashMap<i32, (ApiKey, i16)>>) {
    if frame.len() < 8 {
        return;
    }
    let key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    if let Ok(api @ (ApiKey::Metadata | ApiKey::FindCoordinator | ApiKey::SyncGroup)) =
        ApiKey::try_from(key)
    {
        inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(correlation, (api, version));
    }
}

fn rewrite_answer(
    frame: Bytes,
    inflight: &Mutex<HashMap<i32, (ApiKey, i16)>>,
    ports: &HashMap<i32, u16>,
    stats: &ProxyStats,
    cut: &SyncCut,
) -> Bytes {
    let Some(correlation) = frame
        .get(..4)
        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    else {
        return frame;
    };
    let Some((api, version)) = inflight
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&correlation)
    else {
        return frame;
    };
    if api == ApiKey::SyncGroup {
        cut.sync_answered(&frame, version, correlation);
        return frame;
    }
    match rewrite(&frame, api, version, correlation, ports) {
        Ok(out) => {
            stats.rewritten.fetch_add(1, Ordering::Relaxed);
            out
        }
        Err(e) => {
            stats.rewrite_failures.fetch_add(1, Ordering::Relaxed);
            *stats.last_failure.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(format!("{api:?} v{version}: {e}"));
            frame
        }
    }
}

/// The answer with every broker address replaced by this set's proxy for that broker.
pub fn rewrite(
    frame: &[u8],
    api: ApiKey,
    version: i16,
    correlation: i32,
    ports: &HashMap<i32, u16>,
) -> Result<Bytes, String> {
    let answer =
        decode_response_frame(frame, api, version, correlation).map_err(|e| e.to_string())?;
    let mut out = BytesMut::new();
    let mut header = ResponseHeader::default();
    header.correlation_id = correlation;
    header
        .encode(&mut out, api.response_header_version(version))
        .map_err(|e| e.to_string())?;
    let proxy = |node: i32, host: &mut StrBytes, port: &mut i32| {
        if let Some(p) = ports.get(&node) {
            *host = StrBytes::from_static_str("127.0.0.1");
            *port = i32::from(*p);
        }
    };
    match answer {
        Response::Metadata(mut m) => {
            for b in &mut m.brokers {
                proxy(b.node_id.0, &mut b.host, &mut b.port);
            }
            m.encode(&mut out, version).map_err(|e| e.to_string())?;
        }
        Response::FindCoordinator(mut f) => {
            if f.error_code == 0 {
                proxy(f.node_id.0, &mut f.host, &mut f.port);
            }
            for c in f.coordinators.iter_mut().filter(|c| c.error_code == 0) {
                proxy(c.node_id.0, &mut c.host, &mut c.port);
            }
            f.encode(&mut out, version).map_err(|e| e.to_string())?;
        }
        other => return Err(format!("unexpected answer {:?}", other.api_key())),
    }
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::find_coordinator_response::Coordinator;
    use kafka_protocol::messages::metadata_response::MetadataResponseBroker;
    use kafka_protocol::messages::{BrokerId, FindCoordinatorResponse, MetadataResponse};

    #[test]
    fn only_a_join_group_under_a_member_id_trips_the_join_stall() {
        use kafka_protocol::messages::{GroupId, JoinGroupRequest, RequestHeader};
        use kafka_protocol::protocol::HeaderVersion;
        let request = |version: i16, member: &str| {
            let mut out = BytesMut::new();
            let mut header = RequestHeader::default();
            header.request_api_key = ApiKey::JoinGroup as i16;
            header.request_api_version = version;
            header.correlation_id = 3;
            header
                .encode(&mut out, JoinGroupRequest::header_version(version))
                .unwrap();
            let mut req = JoinGroupRequest::default();
            req.group_id = GroupId(StrBytes::from_static_str("g"));
            req.member_id = StrBytes::from_string(member.to_owned());
            req.encode(&mut out, version).unwrap();
            out.to_vec()
        };
        for version in [5, 9] {
            assert!(joins_as_member(&request(version, "m-1")), "v{version}");
            assert!(!joins_as_member(&request(version, "")), "v{version}");
        }
        let mut heartbeat = request(5, "m-1");
        heartbeat[..2].copy_from_slice(&(ApiKey::Heartbeat as i16).to_be_bytes());
        assert!(!joins_as_member(&heartbeat));
        assert!(!joins_as_member(&[0, 11, 0]));
    }

    fn frame_of(correlation: i32, api: ApiKey, version: i16, body: &impl Encodable) -> Vec<u8> {
        let mut out = BytesMut::new();
        let mut header = ResponseHeader::default();
        header.correlation_id = correlation;
        header
            .encode(&mut out, api.response_header_version(version))
            .unwrap();
        body.encode(&mut out, version).unwrap();
        out.to_vec()
    }

    fn ports() -> HashMap<i32, u16> {
        HashMap::from([(1, 40001), (2, 40002)])
    }

    #[test]
    fn metadata_brokers_are_renamed_to_the_sets_proxies() {
        for version in [0i16, 1, 9, 12, 13] {
            let mut m = MetadataResponse::default();
            for (id, port) in [(1, 9092), (2, 9093), (7, 9099)] {
                let mut b = MetadataResponseBroker::default();
                b.node_id = BrokerId(id);
                b.host = StrBytes::from_static_str("broker.example");
                b.port = port;
                m.brokers.push(b);
            }
            let frame = frame_of(42, ApiKey::Metadata, version, &m);
            let out = rewrite(&frame, ApiKey::Metadata, version, 42, &ports()).unwrap();
            let Response::Metadata(got) =
                decode_response_frame(&out, ApiKey::Metadata, version, 42).unwrap()
            else {
                panic!("not Metadata");
            };
            let seen: Vec<(i32, &str, i32)> = got
                .brokers
                .iter()
                .map(|b| (b.node_id.0, b.host.as_str(), b.port))
                .collect();
            // A broker the set has no proxy for keeps its address: nothing to send it to.
            assert_eq!(
                seen,
                [
                    (1, "127.0.0.1", 40001),
                    (2, "127.0.0.1", 40002),
                    (7, "broker.example", 9099)
                ],
                "v{version}"
            );
        }
    }

    #[test]
    fn find_coordinator_answers_old_and_new_name_the_proxy() {
        for version in [0i16, 3, 4, 6] {
            let mut f = FindCoordinatorResponse::default();
            if version < 4 {
                f.node_id = BrokerId(2);
                f.host = StrBytes::from_static_str("127.0.0.1");
                f.port = 9093;
            } else {
                let mut c = Coordinator::default();
                c.key = StrBytes::from_static_str("lock");
                c.node_id = BrokerId(2);
                c.host = StrBytes::from_static_str("127.0.0.1");
                c.port = 9093;
                f.coordinators.push(c);
            }
            let frame = frame_of(7, ApiKey::FindCoordinator, version, &f);
            let out = rewrite(&frame, ApiKey::FindCoordinator, version, 7, &ports()).unwrap();
            let Response::FindCoordinator(got) =
                decode_response_frame(&out, ApiKey::FindCoordinator, version, 7).unwrap()
            else {
                panic!("not FindCoordinator");
            };
            let port = if version < 4 {
                got.port
            } else {
                got.coordinators[0].port
            };
            assert_eq!(port, 40002, "v{version}");
        }
    }

    /// The stall nemesis reorders a client's requests as a per-flow cut does: a request sent on
    /// a connection open when the stall began is held, even after the client closed that
    /// connection; the resend on a new connection goes through; the stale request reaches the
    /// broker only after the heal, second.
    #[test]
    fn a_stalled_connections_request_reaches_the_broker_after_a_resend_on_a_new_one() {
        use std::io::{Read, Write};
        use std::sync::mpsc as std_mpsc;
        let rt = tokio::runtime::Runtime::new().unwrap();
        let broker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = broker.local_addr().unwrap();
        let (got_tx, got) = std_mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || {
            for conn in broker.incoming() {
                let Ok(mut conn) = conn else { return };
                let got_tx = got_tx.clone();
                std::thread::spawn(move || loop {
                    let mut len = [0u8; 4];
                    if conn.read_exact(&mut len).is_err() {
                        return;
                    }
                    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
                    if conn.read_exact(&mut body).is_err() || got_tx.send(body).is_err() {
                        return;
                    }
                });
            }
        });
        let set = ProxySet::start(rt.handle(), &[(1, addr)]);
        let proxy = set.bootstrap();
        let frame = |tag: u8| {
            // A JoinGroup-like header (key 11, version 5, correlation 1) and one byte.
            let body = [0u8, 11, 0, 5, 0, 0, 0, 1, tag];
            let mut out = (body.len() as u32).to_be_bytes().to_vec();
            out.extend_from_slice(&body);
            out
        };
        let bound = Duration::from_secs(10);
        let mut old = std::net::TcpStream::connect(&proxy).unwrap();
        old.write_all(&frame(b'0')).unwrap();
        assert_eq!(
            got.recv_timeout(bound).expect("the first frame").last(),
            Some(&b'0')
        );
        set.stall(1);
        old.write_all(&frame(b'x')).unwrap();
        drop(old);
        let mut new = std::net::TcpStream::connect(&proxy).unwrap();
        new.write_all(&frame(b'y')).unwrap();
        assert_eq!(
            got.recv_timeout(bound)
                .expect("the resend on a new connection")
                .last(),
            Some(&b'y')
        );
        set.set(1, Fault::Clear);
        assert_eq!(
            got.recv_timeout(bound)
                .expect("the stale frame after the heal")
                .last(),
            Some(&b'x')
        );
        drop(new);
        drop(set);
    }
}

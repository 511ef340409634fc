//! The group membership state machine, sans-I/O: it is fed responses, commands and the current
//! monotonic time, and it hands back requests to send, events, and the instant it next needs to be
//! woken. It never reads a clock and never touches a socket, so every interleaving can be replayed
//! in a test with a manual clock.
//!
//! ```text
//!                  start
//!                    │
//!                    ▼        coordinator error / transport failure (from any phase below;
//!   ┌──────────► Discover ◄── the phase to resume is remembered, the lease keeps running)
//!   │                │ FindCoordinator ok
//!   │                ▼
//!   │              Probe      ApiVersions to a coordinator not asked before (skipped otherwise)
//!   │                │
//!   │                ▼
//!   │   ┌──────►   Join  ◄──────────────┐ MEMBER_ID_REQUIRED: take the id, rejoin at once
//!   │   │            │ JoinGroup ok     │ UNKNOWN_MEMBER_ID: forget the id, rejoin at once
//!   │   │            ▼                  │ REBALANCE_IN_PROGRESS / ILLEGAL_GENERATION: rejoin
//!   │   │          Sync ────────────────┘
//!   │   │            │ SyncGroup ok: the assignment decides holder / waiting
//!   │   │            ▼
//!   │   └─────── Stable (heartbeat every interval, one in flight; at once after an
//!   │  REBALANCE_IN_PROGRESS    assignment naming us: its NONE renews the hold)
//!   │                │ leave command, or the lock was lost
//!   │                ▼
//!   └─────────────  Leave ── LeaveGroup answered or failed ──► Done
//! ```
//!
//! # The lock on top of membership
//! A SyncGroup answer whose assignment names the member starts the hold if it is handled before
//! the assignment's deadline: the send instant of the first JoinGroup of the generation (or of an
//! earlier JoinGroup of the same member id that was never answered, which the broker may still
//! receive and count) + the lease length. Completing that join phase re-armed the broker's
//! session timer for every member after that JoinGroup arrived, so the first lease ends at the
//! deadline; the Heartbeat sent at
//! once renews it. A SyncGroup is never answered blindly (a coordinator still loading the group
//! answers it with an error), unlike a Heartbeat. An assignment handled at or after its deadline
//! starts nothing: the member leaves under its id and joins again as a new member, at the back of
//! the queue unless only a lost JoinGroup cut the deadline short. The member holds until one of: the local lease
//! runs out, the broker says the membership is gone (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
//! FENCED_INSTANCE_ID), a later assignment names someone else, a rebalance starts while the
//! group runs an eager consumer protocol (`range`, `roundrobin`), or the user releases it. Every
//! one of those ends the hold *for good*: a hold only ever starts from an assignment of a new
//! generation, so "a late success never revives the lock" holds by construction. After a loss the
//! machine leaves the group and stops, except for the eager surrender of consumer-compatible mode,
//! where the member stays (as every consumer does) and may be assigned partition 0 again: a new
//! acquisition with a new token.
//!
//! # Consumer-compatible mode: eager or cooperative
//! The member offers `cooperative-sticky` first, then `range` and `roundrobin`; the broker picks
//! one every member offers, by vote. Under an eager protocol the holder gives partition 0 up as
//! soon as it hears of a rebalance. Under `cooperative-sticky` it keeps it, as a native holder
//! does, because the next generation cannot hand it to anyone else while it is a member: it
//! rejoins offering *only* `cooperative-sticky` with partition 0 in its owned partitions, so the
//! next generation runs the cooperative protocol too, and the sticky assignment keeps a partition
//! with its owner or withholds it for a generation. If the broker refuses that join
//! (INCONSISTENT_GROUP_PROTOCOL: a member that cannot run cooperative-sticky has joined), no join
//! phase can complete before this member rejoins, so it gives partition 0 up there and then and
//! rejoins with every protocol, as an eager member.
//!
//! The lease ends at `send_time(last renewal) + min(session, rebalance timeout) − margin`, where a
//! renewal is a **Heartbeat answered NONE** and nothing else. Apache Kafka re-arms a member's
//! session timer when such a Heartbeat *arrives*, which is after it was built here, so the lease
//! ends before the broker can drop the member. A new hold's first lease ends at the assignment's
//! deadline, timed from the JoinGroup whose join phase re-armed the timer. A JoinGroup or
//! SyncGroup answered NONE renews nothing: the broker answers a follower's rejoin of a STABLE
//! group and a SyncGroup in STABLE at once, without re-arming the timer. The rebalance timeout is in the formula because a broker
//! drops a member that does not rejoin within it once a rebalance starts. REBALANCE_IN_PROGRESS
//! heartbeats do not renew: the rebalance may have started before them. docs/design.md cites the
//! broker code each step relies on.
//!
//! # Connections
//! [`Target`] tells the driver where a request goes: FindCoordinator to any broker, JoinGroup and
//! SyncGroup on the coordinator's *join lane*, everything else on its *control lane*. A JoinGroup
//! can be parked by the broker for seconds; heartbeats and leaves must never queue behind it.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::heartbeat_request::HeartbeatRequest;
use kafka_protocol::messages::join_group_request::{JoinGroupRequest, JoinGroupRequestProtocol};
use kafka_protocol::messages::join_group_response::JoinGroupResponse;
use kafka_protocol::messages::leave_group_request::{LeaveGroupRequest, MemberIdentity};
use kafka_protocol::messages::sync_group_request::{SyncGroupRequest, SyncGroupRequestAssignment};
use kafka_protocol::messages::sync_group_response::SyncGroupResponse;
use kafka_protocol::messages::{ApiKey, GroupId};
use kafka_protocol::protocol::StrBytes;
use tracing::{debug, info, warn};

use crate::api::Api;
use crate::assign::{self, ConsumerStrategy, MemberMetadata, NativeAssignment};
use crate::backoff::Backoff;
use crate::wire::code::KafkaCode;
use crate::wire::coordinator::{find_coordinator_request, found_coordinator, CoordinatorError};
use crate::wire::versions::VersionError;
use crate::wire::{Response, Unanswered};

/// Why the membership ended on an error no retry can fix. The crate's `Error` wraps it, each
/// variant as the `Error` of the same words (`Broker`, `Config`, `Version`, `Protocol`,
/// `PermitsMismatch`, `LedgerMismatch`); a failed request the machine was told of is never one:
/// those are retried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The broker answered a group request with a code no retry can fix (misconfiguration,
    /// authorization).
    #[error("{api} failed: {code}")]
    Broker {
        /// The API whose answer carried the code.
        api: Api,
        /// The code.
        code: KafkaCode,
    },
    /// The coordinator offers no version of an API group membership needs.
    #[error("invalid configuration: {}", missing_api(.0))]
    MissingApi(ApiKey),
    /// The coordinator and kafka-lock have no version in common of an API every connection needs.
    #[error(transparent)]
    Version(#[from] VersionError),
    /// A request was answered with a response of another API.
    #[error("unexpected answer from the cluster: {}", wrong_answer(*.want, *.got))]
    WrongAnswer {
        /// The API asked.
        want: ApiKey,
        /// The API of the answer.
        got: ApiKey,
    },
    /// The group runs with another number of permits than this member was given.
    #[error("{}", permits_mismatch(.lock, *.ours, *.group))]
    PermitsMismatch {
        /// The lock's name.
        lock: String,
        /// This member's number of permits.
        ours: u16,
        /// The group's.
        group: u16,
    },
    /// The group takes its tokens from another ledger setting than this member's.
    #[error("{}", ledger_mismatch(.lock, .ours.as_deref(), .group.as_deref()))]
    LedgerMismatch {
        /// The lock's name.
        lock: String,
        /// This member's ledger topic.
        ours: Option<String>,
        /// The group's, as its leader decided it.
        group: Option<String>,
    },
}

// The words of the failures above, which the crate's `Error` says too.

/// What `Error::Config` says of an API the coordinator lacks.
pub(crate) fn missing_api(api: &ApiKey) -> String {
    format!("the broker does not offer {api:?}, which kafka-lock needs for group membership")
}

/// What `Error::Protocol` says of an answer of the wrong API.
pub(crate) fn wrong_answer(want: ApiKey, got: ApiKey) -> String {
    format!("expected {want:?}, got {got:?}")
}

/// What `Error::PermitsMismatch` says.
pub(crate) fn permits_mismatch(lock: &str, ours: u16, group: u16) -> String {
    format!(
        "lock {lock:?} has {group} permit(s) but this member was configured with {ours}; \
         every member of a lock must use the same number of permits"
    )
}

/// What `Error::LedgerMismatch` says.
pub(crate) fn ledger_mismatch(lock: &str, ours: Option<&str>, group: Option<&str>) -> String {
    format!(
        "lock {lock:?} runs with {} but this member was configured with {}; every member of a \
         lock must use the same ledger topic, or none",
        ledger_setting(group),
        ledger_setting(ours)
    )
}

fn ledger_setting(topic: Option<&str>) -> String {
    match topic {
        Some(t) => format!("ledger topic {t:?}"),
        None => "no ledger topic".to_owned(),
    }
}

/// Which protocol the group speaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// kafka-lock's own protocol type: no topic, sticky then FIFO.
    Native,
    /// Protocol type "consumer" on a one-partition topic: holding partition 0 is holding the lock.
    /// Cooperative (the holder keeps partition 0 through a rebalance) when every member offers
    /// `cooperative-sticky`, else eager (it surrenders as soon as a rebalance starts).
    Consumer {
        /// The one-partition topic whose partition 0 is the lock.
        topic: String,
    },
}

/// Everything the machine needs to know up front.
#[derive(Debug, Clone)]
pub struct MembershipConfig {
    /// The group id, which is the lock's name.
    pub group_id: String,
    /// Native or consumer-compatible.
    pub mode: Mode,
    /// Human label carried in native member metadata (host, pid, job).
    pub label: Option<String>,
    /// Broker-side session timeout.
    pub session_timeout: Duration,
    /// How long the broker waits for members to rejoin a rebalance.
    pub rebalance_timeout: Duration,
    /// Heartbeat period.
    pub heartbeat_interval: Duration,
    /// Per-request timeout (JoinGroup and SyncGroup get the rebalance timeout on top).
    pub request_timeout: Duration,
    /// Subtracted from the lease so the holder gives up before the broker can move on.
    pub lease_margin: Duration,
    /// How many members may hold at once (native mode; 1 = a mutex). Every member of the group
    /// must use the same number.
    pub permits: u16,
    /// The ledger topic the lock's tokens come from, advertised in native member metadata so
    /// that members which disagree never hold; `None` without a ledger.
    pub ledger: Option<String>,
}

impl MembershipConfig {
    /// The lease length after a renewal: `min(session, rebalance) − margin`.
    pub fn lease_length(&self) -> Duration {
        self.session_timeout
            .min(self.rebalance_timeout)
            .saturating_sub(self.lease_margin)
    }

    /// How long a JoinGroup (and the SyncGroup after it) may take: the broker may legitimately
    /// park it for the whole rebalance timeout, and Apache Kafka's Java client allows 5 s more.
    pub fn join_timeout(&self) -> Duration {
        self.request_timeout
            .max(self.rebalance_timeout + Duration::from_secs(5))
    }
}

/// API versions the coordinator and the bootstrap broker agreed to, for the APIs this machine builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupVersions {
    /// FindCoordinator version.
    pub find_coordinator: i16,
    /// JoinGroup version.
    pub join_group: i16,
    /// SyncGroup version.
    pub sync_group: i16,
    /// Heartbeat version.
    pub heartbeat: i16,
    /// LeaveGroup version.
    pub leave_group: i16,
}

impl GroupVersions {
    /// The highest versions kafka-lock builds (what Apache Kafka 3.9–4.x and tansu offer).
    pub const LATEST: GroupVersions = GroupVersions {
        find_coordinator: 4,
        join_group: 9,
        sync_group: 5,
        heartbeat: 4,
        leave_group: 5,
    };

    /// The versions to build with for a broker that negotiated `v`, capped at [`Self::LATEST`].
    pub fn fit(v: &crate::wire::versions::NegotiatedVersions) -> Result<GroupVersions, Failure> {
        let need = |api: ApiKey, latest: i16| {
            v.get(api)
                .map(|x| x.min(latest))
                .ok_or(Failure::MissingApi(api))
        };
        let l = GroupVersions::LATEST;
        Ok(GroupVersions {
            find_coordinator: need(ApiKey::FindCoordinator, l.find_coordinator)?,
            join_group: need(ApiKey::JoinGroup, l.join_group)?,
            sync_group: need(ApiKey::SyncGroup, l.sync_group)?,
            heartbeat: need(ApiKey::Heartbeat, l.heartbeat)?,
            leave_group: need(ApiKey::LeaveGroup, l.leave_group)?,
        })
    }
}

/// A broker address as the coordinator lookup returned it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Broker {
    /// Broker id.
    pub node_id: i32,
    /// Host name or address.
    pub host: String,
    /// Port.
    pub port: i32,
}

impl fmt::Display for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{} (node {})", self.host, self.port, self.node_id)
    }
}

/// Which coordinator connection a request uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// JoinGroup and SyncGroup, which the broker may hold for seconds.
    Join,
    /// Heartbeat and LeaveGroup, which must never wait behind a parked JoinGroup.
    Control,
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Any bootstrap broker.
    Any,
    /// The group coordinator, on one of its two lanes.
    Coordinator {
        /// The coordinator.
        broker: Broker,
        /// The lane.
        lane: Lane,
    },
}

/// One request for the driver to send. Answer it with [`Membership::handle_response`] and the same id.
#[derive(Debug, Clone)]
pub struct Transmit {
    /// Identifies the answer.
    pub id: u64,
    /// Where to send it.
    pub target: Target,
    /// The request, built for the versions given to the machine.
    pub request: crate::wire::Request,
    /// The version to encode it with.
    pub version: i16,
    /// Give up on the answer after this long (the driver then answers with its timeout).
    pub timeout: Duration,
}

/// The proof of holding the lock, to hand to the protected resource.
///
/// **With a ledger** (`LockOptions::ledger_topic`) the token is [`ledger_offset`]: the offset of
/// the hold's ACQUIRED record in the ledger's one partition. Every later holder's is strictly
/// greater, across group deletion, coordinator failover and broker restarts (the argument is in
/// `docs/design.md`); it stays the same for the whole hold.
///
/// **Without one** it is the group generation, with the member id beside it: every later holder
/// gets a greater generation *within one life of the group*. A group that is deleted (by an
/// administrator, or by the broker 0–10 minutes after it is left empty with no committed offsets)
/// starts again at generation 1, and a static-member replacement keeps the generation, which is
/// why the member id is part of the token (`docs/protocol.md`).
///
/// # Ordering
///
/// `Ord` compares [`ledger_offset`] first (`None` sorts before every offset), then
/// [`generation`], then [`member_id`]. So among the tokens of one lock taken with the same ledger,
/// a later holder's token is greater; within one hold the offset stays and the generation can only
/// grow (a native-mode holder keeps the lock through a rebalance), so a guard's token never
/// decreases. Tokens taken without a ledger compare by generation, with its limits. Do not mix
/// the two for one resource: a generation-only token sorts below every ledger token.
///
/// [`ledger_offset`]: Self::ledger_offset
/// [`generation`]: Self::generation
/// [`member_id`]: Self::member_id
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub struct FencingToken {
    /// The offset of the hold's ACQUIRED record in the ledger, when the lock uses one.
    pub ledger_offset: Option<i64>,
    /// The group generation in which the assignment was made (a native-mode holder that keeps
    /// the lock through a rebalance moves to the new generation).
    pub generation: i32,
    /// The member the assignment named.
    pub member_id: String,
}

impl FencingToken {
    /// A token with these parts, for tests of code that takes tokens; a lock's own tokens come
    /// from [`LockGuard::token`](crate::LockGuard::token) and [`LockEvent`](crate::LockEvent).
    pub fn new(ledger_offset: Option<i64>, generation: i32, member_id: impl Into<String>) -> Self {
        FencingToken {
            ledger_offset,
            generation,
            member_id: member_id.into(),
        }
    }

    /// The number to hand to a resource: the ledger offset when there is one, else the
    /// generation. It is what the token displays as, and the CLI's `KAFKA_LOCK_TOKEN`.
    pub fn value(&self) -> i64 {
        self.ledger_offset
            .unwrap_or_else(|| i64::from(self.generation))
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.value())
    }
}

/// Who holds the lock, as a waiter's assignment tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// The holder's member id.
    pub member_id: String,
    /// Its label, if it gave one.
    pub label: Option<String>,
    /// The generation of the assignment.
    pub generation: i32,
    /// The permit slot it holds (always 0 for a mutex and in consumer-compatible mode).
    pub slot: u16,
}

/// Why a hold ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// No renewal before the local lease ran out (coordinator unreachable, paused process...).
    LeaseExpired,
    /// The broker no longer knows this member at this generation.
    Fenced(KafkaCode),
    /// A new assignment named another member.
    Reassigned,
    /// Consumer-compatible mode under an eager protocol: a rebalance started, so partition 0 was
    /// surrendered.
    Revoked,
    /// A fatal error ended the membership.
    Fatal,
    /// The ledger did not acknowledge the hold's ACQUIRED record before the lease ended (or
    /// within its deadline), or the checkpoint read the hold waited for came in after it ended
    /// ([`crate::LockOptions::read_checkpoint_on_acquire`]): the hold never began.
    Ledger,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::LeaseExpired => f.write_str("the lease ran out before a renewal"),
            LossReason::Fenced(code) => write!(f, "the coordinator fenced this member ({code})"),
            LossReason::Reassigned => f.write_str("a new assignment named another member"),
            LossReason::Revoked => {
                f.write_str("partition 0 was given up for a rebalance (eager consumer protocol)")
            }
            LossReason::Fatal => f.write_str("a fatal error ended the membership"),
            LossReason::Ledger => f.write_str(
                "the ledger did not acknowledge the ACQUIRED record before the lease ended",
            ),
        }
    }
}

impl LossReason {
    /// A short stable name for metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            LossReason::LeaseExpired => "lease_expired",
            LossReason::Fenced(_) => "fenced",
            LossReason::Reassigned => "reassigned",
            LossReason::Revoked => "revoked",
            LossReason::Fatal => "fatal",
            LossReason::Ledger => "ledger",
        }
    }
}

/// What the machine tells its owner. `E` is what a failure is reported as: the machine's own
/// [`Failure`], and each layer above turns it into its own ([`Event::map_failure`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Event<E = Failure> {
    /// A JoinGroup completed.
    Joined {
        /// Our member id.
        member_id: String,
    },
    /// The lock is held, from now until `lease_end` unless renewed.
    Acquired {
        /// The fencing token.
        token: FencingToken,
        /// When the hold ends without a renewal.
        lease_end: Instant,
        /// The permit slot held, `0..permits`; it stays the same for the whole hold.
        permit: u16,
    },
    /// The holder went through a rebalance and still holds, under a new token.
    TokenChanged {
        /// The new token (strictly greater generation).
        token: FencingToken,
    },
    /// A rebalance started while holding (native mode keeps the lock through it).
    RebalanceWhileHeld,
    /// The lock is held by someone else (or nobody yet); we are queued.
    Waiting {
        /// The holder of the lowest occupied slot named by our assignment.
        holder: Option<HolderInfo>,
        /// Every holder named by our assignment, by ascending slot.
        holders: Vec<HolderInfo>,
        /// Our place in the queue (1 = next), -1 if unknown.
        position: i32,
        /// The generation.
        generation: i32,
    },
    /// The hold ended without being released.
    Lost {
        /// Why.
        reason: LossReason,
        /// The instant the lease ran out or would have run out; may be earlier than now.
        lease_end: Instant,
    },
    /// The user released the hold (sent before LeaveGroup goes out).
    Released,
    /// A peer sent bytes we could not use (garbage metadata or assignment).
    PeerData {
        /// Which member or which part (the decoder's complaint is logged where it is found).
        /// Only the scripted tests read it: the driver has nothing to do about a peer's bytes.
        #[cfg_attr(not(test), allow(dead_code))]
        what: String,
    },
    /// The membership ended (LeaveGroup answered, failed, given up on, or not needed).
    Left {
        /// The coordinator has no member for us any more, as far as the machine knows: it
        /// answered the LeaveGroup (NONE, or UNKNOWN_MEMBER_ID), or we never had a member id.
        /// False when the LeaveGroup failed or was given up on: the broker then drops the member
        /// when its session times out.
        confirmed: bool,
    },
    /// The membership ended on an error no retry can fix.
    Failed(E),
}

impl<E> Event<E> {
    /// The same event, a failure turned into `G` by `f`.
    pub fn map_failure<G>(self, f: impl FnOnce(E) -> G) -> Event<G> {
        match self {
            Event::Joined { member_id } => Event::Joined { member_id },
            Event::Acquired {
                token,
                lease_end,
                permit,
            } => Event::Acquired {
                token,
                lease_end,
                permit,
            },
            Event::TokenChanged { token } => Event::TokenChanged { token },
            Event::RebalanceWhileHeld => Event::RebalanceWhileHeld,
            Event::Waiting {
                holder,
                holders,
                position,
                generation,
            } => Event::Waiting {
                holder,
                holders,
                position,
                generation,
            },
            Event::Lost { reason, lease_end } => Event::Lost { reason, lease_end },
            Event::Released => Event::Released,
            Event::PeerData { what } => Event::PeerData { what },
            Event::Left { confirmed } => Event::Left { confirmed },
            Event::Failed(e) => Event::Failed(f(e)),
        }
    }
}

/// Commands from the lock's owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Release the lock if held and leave the group.
    Leave,
    /// Heartbeat now rather than at the next interval (after the one in flight, if any): someone
    /// has news (the ledger showed a release) that only the coordinator's answer can confirm.
    HeartbeatNow,
    /// The ledger shows that a hold recorded under `generation` ended (a RELEASED or LOST
    /// record). When that is this waiter's generation, the holder left the group after the
    /// waiter's last join, and its leave began a rebalance (a member removed from a stable
    /// group): the waiter sends its JoinGroup at once instead of a Heartbeat that could only
    /// answer REBALANCE_IN_PROGRESS. Only a record naming a holder of the waiter's own
    /// assignment counts: anyone who may write the ledger topic could append a RELEASED naming
    /// the current generation, and each such record would otherwise make every waiter rejoin (and
    /// a leader among them start a rebalance). In consumer-compatible mode the assignment names
    /// no holder, so there it is always a heartbeat. Otherwise, and while holding, it is
    /// `HeartbeatNow`.
    HoldEnded {
        /// The generation the record names.
        generation: i32,
        /// The member the record names as the holder.
        member_id: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Discover,
    /// Asking a newly found coordinator which versions it speaks.
    Probe,
    Join,
    Sync,
    Stable,
    Leave,
    Done,
}

/// What a SyncGroup answer told us.
struct Read {
    /// Our permit slot, if the assignment gives us one.
    slot: Option<u16>,
    /// Every holder, by ascending slot (empty in consumer-compatible mode).
    holders: Vec<HolderInfo>,
    /// Our place in the queue: 0 holding, 1 next, -1 unknown.
    position: i32,
}

#[derive(Debug, Clone)]
struct Hold {
    token: FencingToken,
    lease_end: Instant,
    /// The generation that first granted this unbroken hold (what member metadata advertises,
    /// so the metadata stays the same across rebalances).
    since: i32,
    /// The permit slot; a hold never changes slot.
    slot: u16,
}

#[derive(Debug, Default)]
struct InFlight {
    find: Option<u64>,
    probe: Option<u64>,
    join: Option<u64>,
    sync: Option<u64>,
    /// Id, when it was built (never later than sent, so never later than the broker saw it),
    /// and the generation it speaks for.
    heartbeat: Option<(u64, Instant, i32)>,
    leave: Option<u64>,
    /// The LeaveGroup of a member id given up after an unconfirmed assignment.
    parting: Option<u64>,
}

/// The membership state machine. See the [module docs](self).
pub struct Membership {
    cfg: MembershipConfig,
    versions: GroupVersions,
    phase: Phase,
    /// The phase to go back to once the coordinator is found again.
    resume: Phase,
    coordinator: Option<Broker>,
    /// The coordinator whose versions `versions` were last fitted to.
    probed: Option<Broker>,
    member_id: String,
    generation: i32,
    leader: bool,
    /// The generation of our first completed join: our place in the FIFO queue.
    first_joined: i32,
    /// The protocol the broker selected for the current generation.
    protocol: Option<String>,
    /// The JoinGroup in flight offered only `cooperative-sticky` (consumer mode, holding).
    offered_cooperative_only: bool,
    hold: Option<Hold>,
    /// When the first JoinGroup since the machine last learned a generation was sent.
    join_sent: Option<Instant>,
    /// The transmit `join_sent` was taken for: the driver may say it left later
    /// ([`Membership::handle_sent`]).
    join_sent_by: Option<u64>,
    /// No later than the broker's last re-arm of our session timer by a completed join phase of
    /// the current generation: when the earliest JoinGroup that can have been counted in that
    /// phase was sent. An assignment's deadline, and a new hold's first lease, are timed from it.
    generation_anchor: Option<Instant>,
    /// No later than the send of the earliest JoinGroup under the current member id that was
    /// never answered. The broker may still receive it (a cut connection's data is retransmitted
    /// when the cut heals) after a later JoinGroup of ours was answered, count it in a join phase
    /// and complete that phase before our next JoinGroup is sent: that completion is then our
    /// last re-arm. So every assignment's deadline is timed from it too, for as long as the id
    /// lives.
    unanswered_join: Option<Instant>,
    /// The user asked to leave; nothing may be acquired any more.
    leaving: bool,
    /// Leaving is best effort: past this instant the machine stops trying to reach the
    /// coordinator and just ends (the broker expires the member after its session timeout).
    leave_deadline: Option<Instant>,
    last_waiting: Option<(Vec<HolderInfo>, i32)>,
    /// We wait first in line for a held lock (native mode): heartbeats are how a waiter learns
    /// that the holder let go, so this one member heartbeats faster (see `heartbeat_period`).
    next_in_line: bool,
    /// A `HeartbeatNow` came while a heartbeat was in flight: send the next one at once.
    heartbeat_again: bool,
    in_flight: InFlight,
    /// When the current phase may send its next request (backoff).
    retry_at: Option<Instant>,
    next_heartbeat: Option<Instant>,
    backoff: Backoff,
    next_id: u64,
    /// Both queues give their storage back once drained ([`Membership::poll_transmit`]): they
    /// hold one or two entries at a time, rarely, and a held lock would otherwise keep room for
    /// four of each (1.5 KB) for its whole life.
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
}

impl fmt::Debug for Membership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Membership")
            .field("group", &self.cfg.group_id)
            .field("phase", &self.phase)
            .field("member_id", &self.member_id)
            .field("generation", &self.generation)
            .field("holding", &self.hold.is_some())
            .finish()
    }
}

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

impl Membership {
    /// A machine that starts looking for the coordinator at the first call that passes a time.
    pub fn new(cfg: MembershipConfig, versions: GroupVersions, backoff: Backoff) -> Self {
        Membership {
            cfg,
            versions,
            phase: Phase::Discover,
            resume: Phase::Join,
            coordinator: None,
            probed: None,
            member_id: String::new(),
            generation: -1,
            leader: false,
            first_joined: -1,
            protocol: None,
            offered_cooperative_only: false,
            hold: None,
            join_sent: None,
            join_sent_by: None,
            generation_anchor: None,
            unanswered_join: None,
            leaving: false,
            leave_deadline: None,
            last_waiting: None,
            next_in_line: false,
            heartbeat_again: false,
            in_flight: InFlight::default(),
            retry_at: None,
            next_heartbeat: None,
            backoff,
            next_id: 1,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// Our member id ("" until the broker gave one).
    pub fn member_id(&self) -> &str {
        &self.member_id
    }

    /// The generation of the last completed join (-1 before).
    pub fn generation(&self) -> i32 {
        self.generation
    }

    /// The token while the lock is held.
    pub fn token(&self) -> Option<&FencingToken> {
        self.hold.as_ref().map(|h| &h.token)
    }

    /// When the current hold ends unless renewed.
    pub fn lease_end(&self) -> Option<Instant> {
        self.hold.as_ref().map(|h| h.lease_end)
    }

    /// True once the machine has nothing more to do.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// The coordinator currently believed in.
    pub fn coordinator(&self) -> Option<&Broker> {
        self.coordinator.as_ref()
    }

    /// The versions changed (e.g. a new coordinator connection negotiated lower ones). Only the
    /// tests set them: the machine asks a newly found coordinator for its versions itself.
    #[cfg(test)]
    pub fn set_versions(&mut self, versions: GroupVersions) {
        self.versions = versions;
    }

    /// The versions given to [`Membership::new`] were negotiated with the broker at
    /// `host:port`: if FindCoordinator names that same address, there is nothing to ask it.
    pub fn versions_from(&mut self, host: &str, port: i32) {
        self.probed = Some(Broker {
            node_id: -1,
            host: host.to_owned(),
            port,
        });
    }

    /// Next request to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let next = self.transmits.pop_front();
        if self.transmits.is_empty() {
            self.transmits.shrink_to_fit();
        }
        next
    }

    /// Next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        let next = self.events.pop_front();
        if self.events.is_empty() {
            self.events.shrink_to_fit();
        }
        next
    }

    /// When to call [`Membership::handle_timeout`] next, if anything is scheduled.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut at: Option<Instant> = self.hold.as_ref().map(|h| h.lease_end);
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                at = Some(at.map_or(t, |a| a.min(t)));
            }
        };
        match self.phase {
            Phase::Discover if self.in_flight.find.is_none() => consider(self.retry_at),
            Phase::Join if self.in_flight.join.is_none() => consider(self.retry_at),
            Phase::Stable if self.in_flight.heartbeat.is_none() => consider(self.next_heartbeat),
            _ => {}
        }
        if self.phase != Phase::Done {
            consider(self.leave_deadline);
        }
        at
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.drive(now);
    }

    /// A command from the owner.
    pub fn handle_command(&mut self, cmd: Command, now: Instant) {
        self.check_lease(now);
        match cmd {
            Command::Leave => self.begin_leave(now),
            Command::HoldEnded {
                generation,
                ref member_id,
            } if self.phase == Phase::Stable
                && self.hold.is_none()
                && !self.leaving
                && generation >= 0
                && generation == self.generation
                && self.names_as_holder(member_id, generation) =>
            {
                // The holder's LeaveGroup was answered before its RELEASED record was written, so
                // the group is rebalancing; a JoinGroup from a known member then joins the
                // rebalance, as after REBALANCE_IN_PROGRESS. Were the group stable after all (a
                // leave that was never confirmed), a follower's JoinGroup with unchanged metadata
                // is answered with the current generation, and a leader's starts the rebalance
                // any joining member can start: neither gives anyone the lock.
                debug!(group = %self.cfg.group_id, member_id = %self.member_id, generation,
                       "the ledger shows this generation's holder left; rejoining");
                self.heartbeat_again = false;
                self.rejoin(now, true);
            }
            Command::HeartbeatNow | Command::HoldEnded { .. } => {
                if self.in_flight.heartbeat.is_some() {
                    // It may have been sent before the news: one more goes out once it is answered.
                    self.heartbeat_again = true;
                } else if self.phase == Phase::Stable {
                    self.next_heartbeat = Some(now);
                }
            }
        }
        self.drive(now);
    }

    /// Whether the assignment this waiter last read names `member_id` as a holder in
    /// `generation`.
    fn names_as_holder(&self, member_id: &str, generation: i32) -> bool {
        self.last_waiting.as_ref().is_some_and(|(holders, _)| {
            holders
                .iter()
                .any(|h| h.member_id == member_id && h.generation == generation)
        })
    }

    /// The transmit `id` leaves for the broker at `at`, later than the machine emitted it: the
    /// driver kept it back (a JoinGroup waiting for a free connection behind other locks'
    /// joins). The broker cannot have read it before `at`, so an assignment's deadline timed
    /// from its first JoinGroup may start there; timed from the emission instead, a wait longer
    /// than the lease would make every assignment arrive too late, and the member would join
    /// again at the back of the same line. `at` must be no later than the request's first byte
    /// is written; an earlier or unknown `at` changes nothing.
    pub fn handle_sent(&mut self, id: u64, at: Instant) {
        if self.in_flight.join != Some(id) || self.join_sent_by != Some(id) {
            return;
        }
        if let Some(sent) = &mut self.join_sent {
            *sent = (*sent).max(at);
        }
    }

    /// The answer (or failure) for the transmit `id`. Answers the machine no longer waits for are
    /// ignored, which is what stops a late success from reviving anything.
    /// A failed request (`Err`) is the driver's to describe: the machine asks it only what
    /// [`Unanswered`] offers, and retries.
    pub fn handle_response<F: Unanswered>(
        &mut self,
        id: u64,
        result: Result<Response, F>,
        now: Instant,
    ) {
        // The lease is judged before the answer is looked at: an answer that arrives after the
        // lease ran out must not count, even if it was sent in time.
        self.check_lease(now);
        if self.in_flight.find == Some(id) {
            self.in_flight.find = None;
            self.on_find(result, now);
        } else if self.in_flight.probe == Some(id) {
            self.in_flight.probe = None;
            self.on_probe(result, now);
        } else if self.in_flight.join == Some(id) {
            self.in_flight.join = None;
            self.on_join(result, now);
        } else if self.in_flight.sync == Some(id) {
            self.in_flight.sync = None;
            self.on_sync(result, now);
        } else if matches!(self.in_flight.heartbeat, Some((i, _, _)) if i == id) {
            let (_, sent, generation) = self.in_flight.heartbeat.take().expect("matched above");
            self.on_heartbeat(result, sent, generation, now);
            if std::mem::take(&mut self.heartbeat_again) && self.phase == Phase::Stable {
                self.next_heartbeat = Some(now);
            }
        } else if self.in_flight.leave == Some(id) {
            self.in_flight.leave = None;
            self.on_leave(result);
        } else if self.in_flight.parting == Some(id) {
            self.in_flight.parting = None;
            debug!(group = %self.cfg.group_id, ok = result.is_ok(), "LeaveGroup of a given-up member id answered");
        } else {
            debug!(group = %self.cfg.group_id, id, "ignoring an answer nobody waits for");
        }
        self.drive(now);
    }

    // ---- transitions -------------------------------------------------------------------------

    fn check_lease(&mut self, now: Instant) {
        if let Some(hold) = &self.hold {
            if now >= hold.lease_end {
                self.lose(LossReason::LeaseExpired, now);
            }
        }
    }

    /// An assignment naming us was handled at or after its deadline: the broker may have dropped
    /// us by then, so no hold begins. A rejoin under the same id may be answered at once with
    /// this same generation, which re-arms nothing and so could never start a hold; so the member
    /// leaves under its old id and starts over under a new one. The LeaveGroup matters for
    /// progress: a member id left to expire would hold up the next join phase for up to a
    /// rebalance timeout, longer than the new assignment's deadline, over and over. And the
    /// member gives up its place in the queue when its join phase was too slow (`slow_join`): a
    /// member whose joins keep outlasting a lease (a slow coordinator, a slow link) would
    /// otherwise be named again at every generation, and the lock would stay free while everyone
    /// behind it waits. A deadline cut short by a lost JoinGroup (`unanswered_join`) is the old
    /// id's alone, so that member keeps its place.
    fn assignment_ran_out(&mut self, generation: i32, now: Instant, slow_join: bool) {
        warn!(group = %self.cfg.group_id, member_id = %self.member_id, generation,
              slow_join, "assigned the lock after the assignment's deadline; leaving, then joining again as a new member");
        if let Some(target) = self.coordinator_target(Lane::Control) {
            let old = self.member_id.clone();
            let id = self.push_leave(target, &old, "kafka-lock: assignment came too late");
            self.in_flight.parting = Some(id);
        }
        self.reset_member();
        if slow_join {
            self.first_joined = -1;
        }
        self.generation_anchor = None;
        self.rejoin(now, false);
    }

    fn drive(&mut self, now: Instant) {
        self.check_lease(now);
        if self.leave_deadline.is_some_and(|d| now >= d) {
            debug!(group = %self.cfg.group_id, "giving up on a clean leave");
            self.finish(false);
        }
        let due = |t: Option<Instant>| t.is_none_or(|t| t <= now);
        match self.phase {
            Phase::Discover => {
                if self.in_flight.find.is_none() && due(self.retry_at) {
                    self.send_find(now);
                }
            }
            Phase::Join => {
                if self.in_flight.join.is_none() && due(self.retry_at) {
                    self.send_join(now);
                }
            }
            Phase::Stable => {
                if self.in_flight.heartbeat.is_none() && due(self.next_heartbeat) {
                    self.send_heartbeat(now);
                }
            }
            Phase::Leave => {
                if self.in_flight.leave.is_none() {
                    self.send_leave(now);
                }
            }
            Phase::Probe | Phase::Sync | Phase::Done => {}
        }
    }

    fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn push(
        &mut self,
        target: Target,
        request: crate::wire::Request,
        version: i16,
        timeout: Duration,
    ) -> u64 {
        let id = self.next_id();
        if self.transmits.capacity() == 0 {
            // Room for the one request usually queued is a small block for the allocator; the
            // first growth's room for four (1.2 KB) is a large one, which glibc pays for by
            // consolidating its free lists, at every Heartbeat of every held lock.
            self.transmits.reserve_exact(1);
        }
        self.transmits.push_back(Transmit {
            id,
            target,
            request,
            version,
            timeout,
        });
        id
    }

    fn coordinator_target(&self, lane: Lane) -> Option<Target> {
        self.coordinator
            .clone()
            .map(|broker| Target::Coordinator { broker, lane })
    }

    fn schedule_retry(&mut self, now: Instant) {
        self.retry_at = Some(now + self.backoff.next_delay());
    }

    fn retry_now(&mut self, now: Instant) {
        self.retry_at = Some(now);
    }

    /// The coordinator moved or is unreachable: look it up again, then resume `phase`.
    fn rediscover(&mut self, resume: Phase, now: Instant) {
        info!(group = %self.cfg.group_id, member_id = %self.member_id, generation = self.generation,
              "coordinator lost; looking it up again");
        self.coordinator = None;
        self.resume = resume;
        self.phase = Phase::Discover;
        self.schedule_retry(now);
    }

    fn rejoin(&mut self, now: Instant, immediately: bool) {
        self.phase = Phase::Join;
        self.in_flight.heartbeat = None;
        if immediately {
            self.retry_now(now);
        } else {
            self.schedule_retry(now);
        }
    }

    fn reset_member(&mut self) {
        self.member_id.clear();
        self.unanswered_join = None;
        self.generation = -1;
        self.leader = false;
        self.protocol = None;
    }

    /// Consumer mode, and the current generation runs the cooperative protocol.
    fn cooperative(&self) -> bool {
        matches!(self.cfg.mode, Mode::Consumer { .. })
            && self
                .protocol
                .as_deref()
                .and_then(ConsumerStrategy::from_protocol_name)
                .is_some_and(ConsumerStrategy::is_cooperative)
    }

    fn emit(&mut self, e: Event) {
        self.events.push_back(e);
    }

    /// The hold ends for a reason other than release. Terminal for this machine.
    fn lose(&mut self, reason: LossReason, now: Instant) {
        if let Some(hold) = self.hold.take() {
            warn!(group = %self.cfg.group_id, member_id = %self.member_id, generation = hold.token.generation,
                  %reason, "lock lost");
            self.emit(Event::Lost {
                reason: reason.clone(),
                lease_end: hold.lease_end.min(now),
            });
        }
        if matches!(reason, LossReason::Fenced(KafkaCode(25))) {
            // The broker already forgot us: a LeaveGroup would only be answered with the same error.
            self.reset_member();
        }
        self.begin_leave(now);
    }

    fn fail(&mut self, error: Failure, now: Instant) {
        warn!(group = %self.cfg.group_id, member_id = %self.member_id, %error, "membership failed");
        if self.hold.is_some() {
            let reason = match &error {
                Failure::Broker { code, .. } => LossReason::Fenced(*code),
                _ => LossReason::Fatal,
            };
            if let Some(hold) = self.hold.take() {
                self.emit(Event::Lost {
                    reason,
                    lease_end: hold.lease_end.min(now),
                });
            }
        }
        self.phase = Phase::Done;
        self.emit(Event::Failed(error));
    }

    fn finish(&mut self, confirmed: bool) {
        if self.phase != Phase::Done {
            self.phase = Phase::Done;
            info!(group = %self.cfg.group_id, member_id = %self.member_id, confirmed, "left the group");
            self.emit(Event::Left { confirmed });
        }
    }

    fn begin_leave(&mut self, now: Instant) {
        if self.phase == Phase::Done {
            return;
        }
        if !self.leaving {
            self.leaving = true;
            // Room for a parked JoinGroup, the leader's SyncGroup, then the LeaveGroup itself.
            self.leave_deadline = Some(now + self.cfg.join_timeout() + self.cfg.request_timeout);
            if self.hold.take().is_some() {
                info!(group = %self.cfg.group_id, member_id = %self.member_id, "lock released");
                self.emit(Event::Released);
            }
        }
        // A JoinGroup or SyncGroup in flight decides what comes next: the answer may make us the
        // leader, and a leader that leaves before its SyncGroup can wedge a group (tansu keeps
        // naming the departed leader), so it syncs first. Those handlers check `leaving`.
        if self.in_flight.join.is_some() || self.in_flight.sync.is_some() {
            return;
        }
        self.in_flight.heartbeat = None;
        if self.member_id.is_empty() {
            self.finish(true);
        } else if self.coordinator.is_none() {
            self.phase = Phase::Discover;
            self.resume = Phase::Leave;
            if self.in_flight.find.is_none() {
                self.retry_now(now);
            }
        } else {
            self.phase = Phase::Leave;
        }
    }

    // ---- requests ----------------------------------------------------------------------------

    fn send_find(&mut self, _now: Instant) {
        let v = self.versions.find_coordinator;
        let req = find_coordinator_request(&self.cfg.group_id, v);
        let id = self.push(Target::Any, req.into(), v, self.cfg.request_timeout);
        self.in_flight.find = Some(id);
    }

    fn metadata(&self) -> Vec<JoinGroupRequestProtocol> {
        match &self.cfg.mode {
            Mode::Native => {
                let meta = MemberMetadata {
                    holds: self.hold.is_some(),
                    first_joined_generation: self.first_joined,
                    holder_generation: self.hold.as_ref().map_or(-1, |h| h.since),
                    label: self.cfg.label.clone(),
                    permits: self.cfg.permits,
                    slot: self.hold.as_ref().map_or(0, |h| h.slot),
                    ledger: self.cfg.ledger.clone(),
                };
                let mut p = JoinGroupRequestProtocol::default();
                p.name = sb(assign::NATIVE_PROTOCOL);
                p.metadata = meta.encode();
                vec![p]
            }
            Mode::Consumer { topic } => {
                let protocol = |s: ConsumerStrategy, metadata: Bytes| {
                    let mut p = JoinGroupRequestProtocol::default();
                    p.name = sb(s.protocol_name());
                    p.metadata = metadata;
                    p
                };
                // Only a hold kept under the cooperative protocol is claimed; an eager holder
                // has already given partition 0 up by the time it rejoins.
                let owns = self.hold.is_some() && self.cooperative();
                let cooperative = protocol(
                    ConsumerStrategy::CooperativeSticky,
                    assign::cooperative_subscription(topic, owns, self.generation),
                );
                if owns {
                    // See the module docs: the next generation must be cooperative too.
                    return vec![cooperative];
                }
                let sub = assign::consumer_subscription(topic);
                vec![
                    cooperative,
                    protocol(ConsumerStrategy::Range, sub.clone()),
                    protocol(ConsumerStrategy::RoundRobin, sub),
                ]
            }
        }
    }

    fn protocol_type(&self) -> &'static str {
        match self.cfg.mode {
            Mode::Native => assign::PROTOCOL_TYPE,
            Mode::Consumer { .. } => "consumer",
        }
    }

    fn send_join(&mut self, now: Instant) {
        let Some(target) = self.coordinator_target(Lane::Join) else {
            self.rediscover(Phase::Join, now);
            return;
        };
        let v = self.versions.join_group;
        let mut req = JoinGroupRequest::default();
        req.group_id = GroupId(sb(&self.cfg.group_id));
        req.session_timeout_ms = duration_ms(self.cfg.session_timeout);
        if v >= 1 {
            req.rebalance_timeout_ms = duration_ms(self.cfg.rebalance_timeout);
        }
        req.member_id = sb(&self.member_id);
        req.protocol_type = sb(self.protocol_type());
        req.protocols = self.metadata();
        self.offered_cooperative_only =
            matches!(self.cfg.mode, Mode::Consumer { .. }) && req.protocols.len() == 1;
        debug!(group = %self.cfg.group_id, member_id = %self.member_id, version = v, "JoinGroup");
        let id = self.push(target, req.into(), v, self.cfg.join_timeout());
        self.in_flight.join = Some(id);
        if self.join_sent.is_none() {
            self.join_sent = Some(now);
            self.join_sent_by = Some(id);
        }
        self.retry_at = None;
    }

    fn send_sync(
        &mut self,
        assignments: Vec<(String, Bytes)>,
        protocol_name: Option<StrBytes>,
        now: Instant,
    ) {
        let Some(target) = self.coordinator_target(Lane::Join) else {
            self.rediscover(Phase::Join, now);
            return;
        };
        let v = self.versions.sync_group;
        let mut req = SyncGroupRequest::default();
        req.group_id = GroupId(sb(&self.cfg.group_id));
        req.generation_id = self.generation;
        req.member_id = sb(&self.member_id);
        if v >= 5 {
            req.protocol_type = Some(sb(self.protocol_type()));
            req.protocol_name = protocol_name;
        }
        req.assignments = assignments
            .into_iter()
            .map(|(member, bytes)| {
                let mut a = SyncGroupRequestAssignment::default();
                a.member_id = StrBytes::from_string(member);
                a.assignment = bytes;
                a
            })
            .collect();
        let id = self.push(target, req.into(), v, self.cfg.join_timeout());
        self.in_flight.sync = Some(id);
        self.phase = Phase::Sync;
    }

    fn send_heartbeat(&mut self, now: Instant) {
        let Some(target) = self.coordinator_target(Lane::Control) else {
            self.rediscover(Phase::Stable, now);
            return;
        };
        let v = self.versions.heartbeat;
        let mut req = HeartbeatRequest::default();
        req.group_id = GroupId(sb(&self.cfg.group_id));
        req.generation_id = self.generation;
        req.member_id = sb(&self.member_id);
        let id = self.push(target, req.into(), v, self.cfg.request_timeout);
        self.in_flight.heartbeat = Some((id, now, self.generation));
        self.next_heartbeat = Some(now + self.heartbeat_period());
        self.heartbeat_again = false;
    }

    /// A waiter learns of a release only from its next heartbeat (REBALANCE_IN_PROGRESS), so
    /// the handover waits for up to one interval on top of the broker's rebalance. The member
    /// first in line heartbeats four times as often, cutting that to a quarter interval; the
    /// rest of the queue, and the holder, keep the configured interval, so the extra load is
    /// one member's.
    fn heartbeat_period(&self) -> Duration {
        if self.next_in_line {
            (self.cfg.heartbeat_interval / 4)
                .max(Duration::from_millis(50))
                .min(self.cfg.heartbeat_interval)
        } else {
            self.cfg.heartbeat_interval
        }
    }

    fn send_leave(&mut self, now: Instant) {
        let Some(target) = self.coordinator_target(Lane::Control) else {
            self.rediscover(Phase::Leave, now);
            return;
        };
        info!(group = %self.cfg.group_id, member_id = %self.member_id, "LeaveGroup");
        let id = self.push_leave(target, &self.member_id.clone(), "kafka-lock: released");
        self.in_flight.leave = Some(id);
    }

    fn push_leave(&mut self, target: Target, member_id: &str, reason: &str) -> u64 {
        let v = self.versions.leave_group;
        let mut req = LeaveGroupRequest::default();
        req.group_id = GroupId(sb(&self.cfg.group_id));
        if v >= 3 {
            let mut m = MemberIdentity::default();
            m.member_id = sb(member_id);
            if v >= 5 {
                m.reason = Some(sb(reason));
            }
            req.members = vec![m];
        } else {
            req.member_id = sb(member_id);
        }
        self.push(target, req.into(), v, self.cfg.request_timeout)
    }

    // ---- answers -----------------------------------------------------------------------------

    /// Common handling of a broker error code for Join/Sync/Heartbeat; returns true if handled.
    fn on_group_error(&mut self, api: ApiKey, code: i16, resume: Phase, now: Instant) -> bool {
        let kc = KafkaCode(code);
        match code {
            0 => false,
            15 | 16 => {
                self.rediscover(resume, now);
                true
            }
            14 => {
                // COORDINATOR_LOAD_IN_PROGRESS: same coordinator, try again shortly.
                self.phase = resume;
                if resume == Phase::Stable {
                    self.next_heartbeat = Some(now + self.backoff.next_delay());
                } else {
                    self.schedule_retry(now);
                }
                true
            }
            // Misconfiguration or authorization: nothing a retry can fix.
            23 | 24 | 26 | 30 | 35 | 81 | 82 => {
                self.fail(
                    Failure::Broker {
                        api: Api::of(api),
                        code: kc,
                    },
                    now,
                );
                true
            }
            _ if !kc.is_retriable() && !matches!(code, 22 | 25 | 27 | 79) => {
                self.fail(
                    Failure::Broker {
                        api: Api::of(api),
                        code: kc,
                    },
                    now,
                );
                true
            }
            _ => false,
        }
    }

    fn on_find<F: Unanswered>(&mut self, result: Result<Response, F>, now: Instant) {
        if self.phase != Phase::Discover {
            return;
        }
        // Why no coordinator came: the broker's code if there is one, and the words to log.
        let found = match result {
            Ok(Response::FindCoordinator(r)) => found_coordinator(&r)
                .map(|c| Broker {
                    node_id: c.node_id,
                    host: c.host,
                    port: i32::from(c.port),
                })
                .map_err(|e| match &e {
                    CoordinatorError::Broker { code, .. } => (Some(*code), e.to_string()),
                    CoordinatorError::Unusable { .. } => {
                        (None, format!("unexpected answer from the cluster: {e}"))
                    }
                }),
            Ok(other) => Err((
                None,
                format!(
                    "unexpected answer from the cluster: {}",
                    wrong_answer(ApiKey::FindCoordinator, other.api_key())
                ),
            )),
            Err(e) => Err((e.broker_code(), e.to_string())),
        };
        match found {
            Ok(broker) => {
                info!(group = %self.cfg.group_id, coordinator = %broker, "coordinator found");
                // The backoff is not reset here: a coordinator that is named but cannot be
                // reached would otherwise be looked up at the shortest delay forever. Only an
                // answer from the coordinator itself resets it.
                // Compared by address: the broker the starting versions came from is known by
                // the address we dialled, not by a node id.
                let known = self
                    .probed
                    .as_ref()
                    .is_some_and(|p| p.host == broker.host && p.port == broker.port);
                self.coordinator = Some(broker);
                if known {
                    self.resume_after_discovery(now);
                } else {
                    self.send_probe(now);
                }
            }
            Err((Some(code), _)) if matches!(code.0, 30) => {
                self.fail(
                    Failure::Broker {
                        api: Api::FindCoordinator,
                        code,
                    },
                    now,
                );
            }
            Err((_, e)) => {
                debug!(group = %self.cfg.group_id, error = %e, "FindCoordinator failed; retrying");
                self.schedule_retry(now);
            }
        }
    }

    /// Back to the phase that was interrupted, now that the coordinator is known and its
    /// versions fitted.
    fn resume_after_discovery(&mut self, now: Instant) {
        match self.resume {
            Phase::Stable => {
                self.phase = Phase::Stable;
                self.next_heartbeat = Some(now);
            }
            Phase::Leave => self.phase = Phase::Leave,
            _ => {
                if self.leaving {
                    self.begin_leave(now);
                } else {
                    self.phase = Phase::Join;
                    self.retry_now(now);
                }
            }
        }
    }

    /// The versions the machine starts with were negotiated with a bootstrap broker; the
    /// coordinator may be another broker with a narrower range (a rolling upgrade), and a request
    /// above its range is refused. So every newly named coordinator is asked first. ApiVersions
    /// v0 is the one version every broker since Kafka 0.10 answers.
    fn send_probe(&mut self, _now: Instant) {
        let Some(target) = self.coordinator_target(Lane::Control) else {
            return;
        };
        self.phase = Phase::Probe;
        let req = kafka_protocol::messages::ApiVersionsRequest::default();
        let id = self.push(target, req.into(), 0, self.cfg.request_timeout);
        self.in_flight.probe = Some(id);
    }

    fn on_probe<F: Unanswered>(&mut self, result: Result<Response, F>, now: Instant) {
        if self.phase != Phase::Probe {
            return;
        }
        let resp = match result {
            Ok(Response::ApiVersions(r)) => r,
            Ok(other) => {
                self.wrong_kind(ApiKey::ApiVersions, &other, now);
                return;
            }
            Err(e) => {
                debug!(group = %self.cfg.group_id, error = %e, "ApiVersions to the coordinator failed");
                let resume = self.resume;
                self.rediscover(resume, now);
                return;
            }
        };
        let fitted = crate::wire::versions::negotiate(&resp)
            .map_err(Failure::Version)
            .and_then(|v| GroupVersions::fit(&v));
        match fitted {
            Ok(versions) => {
                if versions != self.versions {
                    info!(group = %self.cfg.group_id, ?versions, "the coordinator's versions differ from the bootstrap broker's");
                }
                self.versions = versions;
                self.probed = self.coordinator.clone();
                self.resume_after_discovery(now);
            }
            Err(e) => self.fail(e, now),
        }
    }

    /// The connection answered a request with a response of another API: nothing about this
    /// connection can be trusted any more.
    fn wrong_kind(&mut self, want: ApiKey, got: &Response, now: Instant) {
        let error = Failure::WrongAnswer {
            want,
            got: got.api_key(),
        };
        self.fail(error, now);
    }

    /// A JoinGroup or SyncGroup got no answer (transport failure or timeout): the coordinator
    /// may have moved, so look it up again and rejoin, unless we were on our way out.
    fn join_phase_unanswered(&mut self, api: ApiKey, e: impl fmt::Display, now: Instant) {
        debug!(group = %self.cfg.group_id, ?api, error = %e, "no answer");
        if self.leaving {
            self.begin_leave(now);
        } else {
            self.rediscover(Phase::Join, now);
        }
    }

    /// UNKNOWN_MEMBER_ID on JoinGroup or SyncGroup: the broker forgot us (an expired pending id
    /// or session). A holder has lost the lock; a waiter forgets the id and rejoins at once.
    fn unknown_member(&mut self, now: Instant) {
        if self.hold.is_some() {
            self.lose(LossReason::Fenced(KafkaCode(25)), now);
            return;
        }
        self.reset_member();
        if self.leaving {
            self.begin_leave(now);
        } else {
            self.rejoin(now, true);
        }
    }

    fn on_join<F: Unanswered>(&mut self, result: Result<Response, F>, now: Instant) {
        let resp: JoinGroupResponse = match result {
            Ok(Response::JoinGroup(r)) => r,
            Ok(other) => {
                self.wrong_kind(ApiKey::JoinGroup, &other, now);
                return;
            }
            Err(e) => {
                // Under an empty id the broker would make a new pending member: not us.
                if !self.member_id.is_empty() {
                    if let Some(sent) = self.join_sent {
                        self.unanswered_join.get_or_insert(sent);
                    }
                }
                self.join_phase_unanswered(ApiKey::JoinGroup, e, now);
                return;
            }
        };
        let code = resp.error_code;
        match code {
            0 => {}
            79 => {
                // KIP-394: the broker parked a pending member under this id; rejoin with it now.
                self.member_id = resp.member_id.to_string();
                debug!(group = %self.cfg.group_id, member_id = %self.member_id, "MEMBER_ID_REQUIRED");
                if self.leaving {
                    self.begin_leave(now);
                } else {
                    self.rejoin(now, true);
                }
                return;
            }
            25 => {
                self.unknown_member(now);
                return;
            }
            23 if self.offered_cooperative_only && !self.leaving => {
                // A member that cannot run cooperative-sticky is in the group, so the next
                // generation will be eager: give partition 0 up now, as an eager member does
                // before rejoining. Our rejoin is still outstanding, so the join phase cannot
                // complete (and nobody can be given the partition) before we have let go.
                info!(group = %self.cfg.group_id, member_id = %self.member_id,
                      "the group cannot stay cooperative; partition 0 surrendered");
                if let Some(hold) = self.hold.take() {
                    self.emit(Event::Lost {
                        reason: LossReason::Revoked,
                        lease_end: hold.lease_end.min(now),
                    });
                }
                self.rejoin(now, true);
                return;
            }
            _ if self.on_group_error(ApiKey::JoinGroup, code, Phase::Join, now) => {
                if self.leaving && self.phase != Phase::Done {
                    self.begin_leave(now);
                }
                return;
            }
            _ => {
                // REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION and other retriable codes.
                if self.leaving {
                    self.begin_leave(now);
                } else {
                    self.rejoin(now, false);
                }
                return;
            }
        }

        self.backoff.reset();
        self.member_id = resp.member_id.to_string();
        // A generation new to us completed a join phase that counted one of the JoinGroups sent
        // since we learned the last one, and re-armed our timer then (GMM
        // completeClassicGroupJoin). The same generation again completed nothing (an answer at
        // once), so the anchor stays.
        let sent = self.join_sent.take();
        if resp.generation_id != self.generation || self.generation_anchor.is_none() {
            self.generation_anchor = sent;
        }
        self.generation = resp.generation_id;
        self.leader = resp.leader == resp.member_id;
        self.protocol = resp.protocol_name.as_ref().map(|p| p.to_string());
        if self.first_joined < 0 {
            self.first_joined = self.generation;
        }
        info!(group = %self.cfg.group_id, member_id = %self.member_id, generation = self.generation,
              leader = self.leader, "joined");
        self.emit(Event::Joined {
            member_id: self.member_id.clone(),
        });
        // No renewal here: a JoinGroup answered at once (a follower of a STABLE group rejoining
        // with unchanged metadata) did not re-arm the broker's session timer for us.

        if self.leaving && !self.leader {
            self.begin_leave(now);
            return;
        }
        let assignments = if self.leader {
            self.plan(&resp)
        } else {
            Vec::new()
        };
        // Copied, not cut from the answer: a slice would keep the whole buffer the answer was
        // read into (a connection's read room, 8 KB or more) until the SyncGroup is answered.
        let protocol_name = resp.protocol_name.as_deref().map(sb);
        self.send_sync(assignments, protocol_name, now);
    }

    /// The leader's assignment for every member of the generation.
    fn plan(&mut self, resp: &JoinGroupResponse) -> Vec<(String, Bytes)> {
        let members: Vec<(String, Option<String>, Bytes)> = resp
            .members
            .iter()
            .map(|m| {
                let id = m.member_id.to_string();
                // A leader that is leaving must not hand the lock to itself: it gives its own entry
                // bytes no decoder accepts, which makes it ineligible under both assignors.
                let meta = if self.leaving && id == self.member_id {
                    Bytes::new()
                } else {
                    m.metadata.clone()
                };
                (
                    id,
                    m.group_instance_id.as_ref().map(|s| s.to_string()),
                    meta,
                )
            })
            .collect();
        let (holder, assignments, rejected) = match &self.cfg.mode {
            Mode::Native => {
                let plan = assign::assign_native(self.generation, &members);
                for (member, permits) in &plan.mismatched {
                    warn!(group = %self.cfg.group_id, %member, member_permits = permits, group_permits = plan.permits,
                          "a member expects another number of permits; it cannot hold");
                }
                for (member, ledger) in &plan.ledger_mismatched {
                    warn!(group = %self.cfg.group_id, %member, member_ledger = ?ledger, group_ledger = ?plan.ledger,
                          "a member uses another ledger setting; nobody new holds until it has left");
                }
                if plan.permits > 1 {
                    info!(group = %self.cfg.group_id, generation = self.generation, holders = ?plan.holders,
                          permits = plan.permits, "leader assigned the permits");
                }
                (plan.holder, plan.assignments, plan.rejected)
            }
            Mode::Consumer { topic } => {
                let strategy = resp
                    .protocol_name
                    .as_deref()
                    .and_then(ConsumerStrategy::from_protocol_name)
                    .unwrap_or(ConsumerStrategy::Range);
                let plan = assign::assign_consumer(strategy, topic, &members);
                (plan.holder, plan.assignments, plan.rejected)
            }
        };
        for (member, error) in rejected {
            if !(self.leaving && member == self.member_id) {
                warn!(group = %self.cfg.group_id, %member, %error, "ignoring a member whose metadata does not decode");
                self.emit(Event::PeerData {
                    what: format!("metadata of member {member}"),
                });
            }
        }
        info!(group = %self.cfg.group_id, generation = self.generation, holder = ?holder, members = members.len(),
              "leader assigned the lock");
        assignments
    }

    fn on_sync<F: Unanswered>(&mut self, result: Result<Response, F>, now: Instant) {
        let resp: SyncGroupResponse = match result {
            Ok(Response::SyncGroup(r)) => r,
            Ok(other) => {
                self.wrong_kind(ApiKey::SyncGroup, &other, now);
                return;
            }
            Err(e) => {
                self.join_phase_unanswered(ApiKey::SyncGroup, e, now);
                return;
            }
        };
        let code = resp.error_code;
        if code == 25 {
            self.unknown_member(now);
            return;
        }
        if code != 0 {
            if !self.on_group_error(ApiKey::SyncGroup, code, Phase::Join, now) {
                // REBALANCE_IN_PROGRESS / ILLEGAL_GENERATION: the generation moved on; rejoin now.
                self.phase = Phase::Join;
                self.retry_now(now);
            }
            if self.leaving && self.phase != Phase::Done {
                self.begin_leave(now);
            }
            return;
        }
        if self.leaving {
            self.begin_leave(now);
            return;
        }

        self.phase = Phase::Stable;
        let Some(read) = self.read_assignment(&resp.assignment, now) else {
            return;
        };
        let Read {
            slot: ours,
            holders,
            position,
        } = read;
        self.next_in_line =
            ours.is_none() && self.hold.is_none() && !holders.is_empty() && position == 1;
        if let Some(slot) = ours {
            if self.hold.as_ref().is_some_and(|h| h.slot != slot) {
                // A hold never moves between slots: the resource of the old slot may already
                // belong to someone else, and the new one is a new acquisition.
                self.next_heartbeat = Some(now + self.heartbeat_period());
                self.lose(LossReason::Reassigned, now);
                return;
            }
            let token = FencingToken {
                ledger_offset: None,
                generation: self.generation,
                member_id: self.member_id.clone(),
            };
            // A SyncGroup answer proves the assignment but not that the broker re-armed our
            // session timer (in STABLE it answers at once without doing so), so it renews
            // nothing. The next Heartbeat goes out now: its NONE is the renewal.
            self.next_heartbeat = Some(now);
            match &mut self.hold {
                Some(hold) => {
                    if hold.token != token {
                        hold.token = token.clone();
                        info!(group = %self.cfg.group_id, member_id = %self.member_id, generation = self.generation,
                              "still holding after a rebalance");
                        self.emit(Event::TokenChanged { token });
                    }
                }
                None => {
                    // The join phase that formed this generation re-armed our session timer
                    // after the anchor (see `generation_anchor`), and this answer is not blind:
                    // a coordinator still loading the group answers SyncGroup with an error. So
                    // no removal that the lease covers can drop us before the anchor + the lease
                    // length, and the hold runs until then unless a Heartbeat renews it. Without
                    // an anchor (never expected) the deadline is now: nothing begins.
                    // A JoinGroup of this id never answered may have been counted in a later
                    // join phase than the one it was sent for (see `unanswered_join`).
                    let joined_in_time = self
                        .generation_anchor
                        .map_or(now, |a| a + self.cfg.lease_length());
                    let deadline = self.unanswered_join.map_or(joined_in_time, |u| {
                        joined_in_time.min(u + self.cfg.lease_length())
                    });
                    if now >= deadline {
                        // Only a slow join phase costs the place in the queue: a lost
                        // JoinGroup is the old id's alone, and a new id starts without one.
                        self.assignment_ran_out(token.generation, now, now >= joined_in_time);
                        return;
                    }
                    info!(group = %self.cfg.group_id, member_id = %self.member_id, generation = self.generation,
                          permit = slot, "lock acquired");
                    self.hold = Some(Hold {
                        token: token.clone(),
                        lease_end: deadline,
                        since: self.generation,
                        slot,
                    });
                    self.emit(Event::Acquired {
                        token,
                        lease_end: deadline,
                        permit: slot,
                    });
                }
            }
            self.last_waiting = None;
            return;
        }
        self.next_heartbeat = Some(now + self.heartbeat_period());
        if self.hold.is_some() {
            self.lose(LossReason::Reassigned, now);
        } else if self.last_waiting.as_ref() != Some(&(holders.clone(), position)) {
            self.last_waiting = Some((holders.clone(), position));
            self.emit(Event::Waiting {
                holder: holders.first().cloned(),
                holders,
                position,
                generation: self.generation,
            });
        }
    }

    /// Our slot if the assignment gives us a permit, who holds, and our queue position; `None`
    /// when the assignment says the group runs with another number of permits (the membership
    /// then fails and leaves).
    fn read_assignment(&mut self, bytes: &Bytes, now: Instant) -> Option<Read> {
        let unknown = Read {
            slot: None,
            holders: Vec::new(),
            position: -1,
        };
        match &self.cfg.mode {
            Mode::Native => match NativeAssignment::decode(bytes) {
                Ok(a) => {
                    if a.permits != self.cfg.permits {
                        self.refuse(
                            Failure::PermitsMismatch {
                                lock: self.cfg.group_id.clone(),
                                ours: self.cfg.permits,
                                group: a.permits,
                            },
                            now,
                        );
                        return None;
                    }
                    if a.ledger != self.cfg.ledger {
                        self.refuse(
                            Failure::LedgerMismatch {
                                lock: self.cfg.group_id.clone(),
                                ours: self.cfg.ledger.clone(),
                                group: a.ledger,
                            },
                            now,
                        );
                        return None;
                    }
                    let holders: Vec<HolderInfo> = a
                        .holders()
                        .map(|h| HolderInfo {
                            member_id: h.member_id.clone(),
                            label: h.label.clone(),
                            generation: h.generation,
                            slot: h.slot,
                        })
                        .collect();
                    let slot = holders
                        .iter()
                        .find(|h| h.member_id == self.member_id && h.generation == self.generation)
                        .map(|h| h.slot);
                    Some(Read {
                        slot,
                        holders,
                        position: a.position,
                    })
                }
                Err(e) => {
                    warn!(group = %self.cfg.group_id, error = %e, "the leader's assignment does not decode");
                    self.emit(Event::PeerData {
                        what: "assignment from the leader".into(),
                    });
                    Some(unknown)
                }
            },
            Mode::Consumer { topic } => {
                if bytes.is_empty() {
                    return Some(unknown);
                }
                match assign::decode_consumer_assignment(bytes) {
                    Ok(parts) => {
                        let ours = parts.iter().any(|(t, p)| t == topic && p.contains(&0));
                        Some(Read {
                            slot: ours.then_some(0),
                            ..unknown
                        })
                    }
                    Err(e) => {
                        warn!(group = %self.cfg.group_id, error = %e, "the leader's assignment does not decode");
                        self.emit(Event::PeerData {
                            what: "assignment from the leader".into(),
                        });
                        Some(unknown)
                    }
                }
            }
        }
    }

    /// The group runs with another number of permits or another ledger setting than ours: no
    /// retry can fix that. A hold is lost at once; the membership reports `error`
    /// ([`Failure::PermitsMismatch`], [`Failure::LedgerMismatch`]) and leaves, so the group does
    /// not keep a member that can never hold.
    fn refuse(&mut self, error: Failure, now: Instant) {
        warn!(group = %self.cfg.group_id, member_id = %self.member_id, %error, "membership failed");
        if let Some(hold) = self.hold.take() {
            self.emit(Event::Lost {
                reason: LossReason::Fatal,
                lease_end: hold.lease_end.min(now),
            });
        }
        self.emit(Event::Failed(error));
        self.begin_leave(now);
    }

    fn renew(&mut self, sent: Instant) {
        let lease = self.cfg.lease_length();
        if let Some(hold) = &mut self.hold {
            hold.lease_end = hold.lease_end.max(sent + lease);
        }
    }

    fn on_heartbeat<F: Unanswered>(
        &mut self,
        result: Result<Response, F>,
        sent: Instant,
        generation: i32,
        now: Instant,
    ) {
        if self.phase != Phase::Stable || generation != self.generation {
            return;
        }
        let code = match result {
            Ok(Response::Heartbeat(r)) => r.error_code,
            Ok(other) => {
                self.wrong_kind(ApiKey::Heartbeat, &other, now);
                return;
            }
            Err(e) => {
                debug!(group = %self.cfg.group_id, error = %e, "Heartbeat failed");
                self.rediscover(Phase::Stable, now);
                return;
            }
        };
        match code {
            0 => {
                self.backoff.reset();
                self.renew(sent);
            }
            27 => {
                info!(group = %self.cfg.group_id, member_id = %self.member_id, generation = self.generation,
                      "rebalance started");
                if let Some(hold) = &self.hold {
                    if matches!(self.cfg.mode, Mode::Consumer { .. }) && !self.cooperative() {
                        // Eager protocol: give partition 0 up before rejoining, as every consumer
                        // in the group does. The member stays and may be assigned it again, which
                        // is a new acquisition under a new generation.
                        let lease_end = hold.lease_end.min(now);
                        self.hold = None;
                        info!(group = %self.cfg.group_id, member_id = %self.member_id, "partition 0 surrendered for the rebalance");
                        self.emit(Event::Lost {
                            reason: LossReason::Revoked,
                            lease_end,
                        });
                    } else {
                        self.emit(Event::RebalanceWhileHeld);
                    }
                }
                self.rejoin(now, true);
            }
            22 | 25 => {
                if self.hold.is_some() {
                    self.lose(LossReason::Fenced(KafkaCode(code)), now);
                    return;
                }
                if code == 25 {
                    self.reset_member();
                }
                self.rejoin(now, true);
            }
            _ => {
                if !self.on_group_error(ApiKey::Heartbeat, code, Phase::Stable, now) {
                    self.next_heartbeat = Some(now + self.backoff.next_delay());
                }
            }
        }
    }

    fn on_leave<F: Unanswered>(&mut self, result: Result<Response, F>) {
        let confirmed = match result {
            Ok(Response::LeaveGroup(r)) => {
                let code = r.members.first().map_or(r.error_code, |m| {
                    if r.error_code != 0 {
                        r.error_code
                    } else {
                        m.error_code
                    }
                });
                if code != 0 {
                    debug!(group = %self.cfg.group_id, code = %KafkaCode(code), "LeaveGroup answered an error");
                }
                // UNKNOWN_MEMBER_ID: the coordinator had already dropped us; the member is gone
                // either way.
                code == 0 || code == KafkaCode::UNKNOWN_MEMBER_ID.0
            }
            Ok(_) => false,
            Err(e) => {
                debug!(group = %self.cfg.group_id, error = %e, "LeaveGroup failed");
                false
            }
        };
        self.finish(confirmed);
    }
}

fn duration_ms(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

#[cfg(test)]
#[path = "membership_tests.rs"]
mod tests;

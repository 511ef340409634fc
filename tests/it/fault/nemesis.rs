//! The nemeses and the seeded schedule: one seed gives the same sequence of faults, targets'
//! locks and durations every time, so a failing run can be replayed with its seed.

use std::fmt;
use std::time::Duration;

use super::kproxy::Dir;

/// A small, fast PRNG (splitmix64): the schedule needs reproducibility, not cryptography.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.range(0, items.len() as u64 - 1) as usize]
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.range(0, i as u64) as usize;
            items.swap(i, j);
        }
    }
}

/// The kinds of fault, each reported on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// SIGSTOP of the holder's process tree for longer than the session timeout, then SIGCONT.
    PauseHolder,
    /// SIGKILL of the holder (for the CLI: kafka-lock itself; its supervisor must stop the job).
    KillHolder,
    /// The holder's link to the coordinator black-holed, one or both ways.
    CutBlackhole,
    /// The holder's connections to the coordinator reset, and new ones refused.
    CutReset,
    /// Every frame between the holder and the coordinator delayed, one or both ways.
    CutDelay,
    /// SIGKILL of the coordinator broker, then a restart.
    BrokerKill,
    /// SIGSTOP of the coordinator broker for longer than the session timeout, then SIGCONT.
    BrokerPause,
    /// SIGTERM (controlled shutdown) of the coordinator broker, then a restart.
    BrokerTerm,
    /// Every proxied client's traffic with the coordinator broker delayed past the request
    /// timeout.
    SlowBroker,
    /// 20 to 50 contenders join the lock at once and leave within seconds.
    Herd,
    /// A holder fault (pause, kill, or the holder cut off from every broker) during a fault of
    /// the coordinator broker (kill, pause, controlled shutdown, or slowed down).
    Mixed,
    /// The holder, or the waiter the next assignment names (cut right after that SyncGroup
    /// answer), cut off from every broker past its session timeout; then the coordinator
    /// broker killed, and the cut healed as soon as a new coordinator is named, while it loads.
    CutMove,
    /// A waiter's next JoinGroup stalled with its connection, whose client side is shut (it
    /// resends on a new connection and carries on), and delivered to the broker only when a
    /// later rebalance begins, while the waiter's other connections to the coordinator are
    /// refused (for a few seconds more); then the waiter cut right after its next SyncGroup
    /// answer.
    StallJoin,
    /// The Heartbeat answers to the holder that reads the lock through its own client
    /// (describe, history, an observer, with a short request timeout) held, with everything
    /// behind them on their connections, while those reads go on. Not in CI mode.
    HoldHeartbeat,
    /// The contender whose command cannot exec: its supervisor stopped at an acquisition and
    /// kafka-lock cut off from every broker, past the session timeout, so the loss comes while
    /// the command's start is pending. Not in CI mode.
    NoexecLoss,
    /// Two of the nemeses above ([`Kind::PAIRABLE`]) aimed at different targets, the second
    /// started 0 to 2 s after the first, each healed on its own schedule. Not in CI mode.
    Pair,
    /// The coordinator broker killed or shut down (SIGTERM) the moment the holder reports its
    /// release, so the waiters rejoin and the next generation forms across a coordinator
    /// move. Not in CI mode.
    HandoverMove,
    /// The `stall` contender's only runtime thread blocked while it holds, for the session
    /// timeout plus 1 to 3 s; then it asks `is_held()` and writes only if told it holds. In CI
    /// mode once, after the other kinds ([`Kind::CI_EXTRA`]).
    RuntimeStall,
    /// A producer appending RELEASED, LOST and ACQUIRED records to the native lock's ledger
    /// that name the current holder's hold, member and generation (or the next generation),
    /// while it holds. Not in CI mode.
    LedgerForger,
    /// A contender's links to the ledger partition's leader reset (new ones refused) or
    /// black-holed, either the next holder's right after the SyncGroup answer that grants it
    /// (during its ACQUIRED append and checkpoint read) or every waiter's while they long-poll
    /// the ledger. Not in CI mode.
    CutLedger,
    /// The many-locks contenders (`--many`, at least 4 locks each) built with one parking lane,
    /// while the holders of their locks are killed in a loop; every one of their locks must be
    /// acquired again within the recovery bound. Not in CI mode.
    LaneStarvation,
    /// The ledger partition's leader killed or shut down (SIGTERM, a controlled shutdown that
    /// moves its leadership) the moment a holder of the native lock reports its release, so
    /// the RELEASED append, the waiters' long polls and the next ACQUIRED append and checkpoint
    /// read meet a leader that moved. Not in CI mode.
    HandoverLedgerMove,
    /// At a release of the native lock, the waiters' long-poll Fetch answers held by their
    /// proxies past the poll's wait (or their connections open then to the ledger leader
    /// black-holed; new ones pass), so a
    /// waiter learns of the release only through its Heartbeats. Not in CI mode.
    AbandonedPolls,
    /// The coordinator broker killed the moment a holder of the native lock reports its grant
    /// (or, `pending`, its release, just after its last checkpoint was stored), and the third
    /// broker (the follower left) stopped (SIGSTOP) for 1 to 2 s as soon as another node is
    /// named coordinator, so the new coordinator's high watermark stays behind the old
    /// leader's while the next checkpoint read meets it. Not in CI mode.
    CoordMoveAtGrant,
    /// From a release of the native lock, every DescribeConfigs answer naming its ledger topic
    /// (the last step of an acquisition's check of it) held by the proxies of every
    /// single-lock contender of it, 0.5 s to past the session timeout and a request's bound;
    /// in some episodes the contender whose check is held first is then SIGINTed or SIGKILLed
    /// mid-check. No acquisition may send its JoinGroup before its check's answer is let out.
    /// Not in CI mode.
    SlowLedgerCheck,
    /// The CLI contenders' kafka-lock processes started with their start of the supervisor
    /// (which runs beside the acquisition) held back 0.2 to 4 s, before or after the spawn, or
    /// failed after the wait, by a preloaded shim (tests/it/slow_spawn.c); meanwhile, in a loop,
    /// a CLI contender is killed so it starts again slowed, sometimes the holder too so the
    /// lock is granted during a start, and 0.1 to 3 s later the new kafka-lock is SIGKILLed or
    /// stopped past the session timeout while its start is likely under way. Not in CI mode.
    SlowSupervisorStart,
    /// A `kafka-lock run` holder of the native lock whose job exited 0 cut off from the
    /// broker its checkpoint's OffsetCommit goes to, both ways, from that request on (the
    /// request held too) for the session timeout plus 1 to 3.5 s, so the broker drops it and
    /// another contender holds meanwhile; the commit reaches the broker after the heal. The
    /// hold must be reported ended at its lease end, not when the commit's answer comes. In CI
    /// mode once, after the other kinds ([`Kind::CI_EXTRA`]).
    CutAtCheckpoint,
}

impl Kind {
    pub const ALL: [Kind; 13] = [
        Kind::PauseHolder,
        Kind::KillHolder,
        Kind::CutBlackhole,
        Kind::CutReset,
        Kind::CutDelay,
        Kind::BrokerKill,
        Kind::BrokerPause,
        Kind::BrokerTerm,
        Kind::SlowBroker,
        Kind::Herd,
        Kind::Mixed,
        Kind::CutMove,
        Kind::StallJoin,
    ];

    /// Drawn only when named (`--kinds`), but for [`Kind::CI_EXTRA`]: most need a contender of
    /// their own or take long, and CI mode keeps its time.
    pub const OPTIONAL: [Kind; 14] = [
        Kind::HoldHeartbeat,
        Kind::NoexecLoss,
        Kind::Pair,
        Kind::HandoverMove,
        Kind::RuntimeStall,
        Kind::LedgerForger,
        Kind::CutLedger,
        Kind::LaneStarvation,
        Kind::HandoverLedgerMove,
        Kind::AbandonedPolls,
        Kind::CoordMoveAtGrant,
        Kind::SlowLedgerCheck,
        Kind::SlowSupervisorStart,
        Kind::CutAtCheckpoint,
    ];

    /// The kinds that strike the handover's ledger traffic, or need the CLI's jobs to leave
    /// checkpoints: drawing one turns checkpoint continuity on (the contenders store and read
    /// checkpoints, the checker judges them).
    pub const CHECKPOINTS: [Kind; 4] = [
        Kind::HandoverLedgerMove,
        Kind::AbandonedPolls,
        Kind::CoordMoveAtGrant,
        Kind::CutAtCheckpoint,
    ];

    /// Optional kinds CI mode runs once anyway, after its schedule (so the kinds of [`Kind::ALL`]
    /// keep theirs for every seed): cheap (about 15 s each, and no more than one contender
    /// process), and what they catch nothing else in CI mode catches but by chance.
    pub const CI_EXTRA: [Kind; 2] = [Kind::RuntimeStall, Kind::CutAtCheckpoint];

    /// What a pair draws from: the single faults (mixed and cut-move are combinations already;
    /// the optional ones need contenders of their own).
    pub const PAIRABLE: [Kind; 11] = [
        Kind::PauseHolder,
        Kind::KillHolder,
        Kind::CutBlackhole,
        Kind::CutReset,
        Kind::CutDelay,
        Kind::BrokerKill,
        Kind::BrokerPause,
        Kind::BrokerTerm,
        Kind::SlowBroker,
        Kind::Herd,
        Kind::StallJoin,
    ];

    /// The holder faults a mixed episode draws from.
    pub const HOLDER: [Kind; 4] = [
        Kind::PauseHolder,
        Kind::KillHolder,
        Kind::CutBlackhole,
        Kind::CutReset,
    ];
    /// The broker faults a mixed episode draws from.
    pub const BROKER: [Kind; 4] = [
        Kind::BrokerKill,
        Kind::BrokerPause,
        Kind::BrokerTerm,
        Kind::SlowBroker,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::PauseHolder => "pause-holder",
            Kind::KillHolder => "kill-holder",
            Kind::CutBlackhole => "cut-blackhole",
            Kind::CutReset => "cut-reset",
            Kind::CutDelay => "cut-delay",
            Kind::BrokerKill => "broker-kill",
            Kind::BrokerPause => "broker-pause",
            Kind::BrokerTerm => "broker-term",
            Kind::SlowBroker => "slow-broker",
            Kind::Herd => "herd",
            Kind::Mixed => "mixed",
            Kind::CutMove => "cut-move",
            Kind::StallJoin => "stall-join",
            Kind::HoldHeartbeat => "hold-heartbeat",
            Kind::NoexecLoss => "noexec-loss",
            Kind::Pair => "pair",
            Kind::HandoverMove => "handover-move",
            Kind::RuntimeStall => "runtime-stall",
            Kind::LedgerForger => "ledger-forger",
            Kind::CutLedger => "cut-ledger",
            Kind::LaneStarvation => "lane-starvation",
            Kind::HandoverLedgerMove => "handover-ledger-move",
            Kind::AbandonedPolls => "abandoned-polls",
            Kind::CoordMoveAtGrant => "coord-move-at-grant",
            Kind::SlowLedgerCheck => "slow-ledger-check",
            Kind::SlowSupervisorStart => "slow-supervisor-start",
            Kind::CutAtCheckpoint => "cut-at-checkpoint",
        }
    }

    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .chain(Kind::OPTIONAL)
            .find(|k| k.name() == name)
    }
}

/// Which of the suite's locks an episode aims at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The native lock: library and CLI contenders.
    Native,
    /// The consumer-compatible lock: library contenders in consumer mode and the Java seed
    /// client.
    Consumer,
}

/// One planned episode: everything random about it is drawn when the schedule is made.
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    pub kind: Kind,
    pub target: Target,
    /// How long the fault lasts (pauses: on top of the session timeout).
    pub length: Duration,
    /// Cut and slow-broker directions.
    pub dir: Dir,
    /// Delay per frame for cut-delay and slow-broker.
    pub delay: Duration,
    /// Contenders in a herd.
    pub herd: usize,
    /// Seed for choices made while the episode runs (which herd member waits how long).
    pub seed: u64,
    /// Mixed episodes: the holder fault and the broker fault, each with its own length.
    pub holder_fault: Kind,
    pub broker_fault: Kind,
    pub broker_length: Duration,
    /// Cut-move episodes: cut the waiter the next assignment names rather than the holder.
    /// Cut-ledger episodes: cut the next holder at its grant rather than the waiters.
    pub pending: bool,
    /// A holder fault in a pair whose other half is a holder fault on the same lock: aimed at
    /// a contender that does not hold, so the two targets differ.
    pub waiter: bool,
    /// Pair episodes: the two nemeses, the second started `offset` after the first.
    pub parts: Vec<Episode>,
    pub offset: Duration,
    /// Slow-ledger-check episodes: the signal sent to a contender mid-check, if any.
    pub signal: Option<i32>,
}

impl Kind {
    /// A fault of the coordinator broker (or of every contender's link to it).
    fn broker(self) -> bool {
        Kind::BROKER.contains(&self)
    }

    /// A fault aimed at one contender (the holder, or in a pair a waiter).
    fn at_contender(self) -> bool {
        matches!(
            self,
            Kind::PauseHolder
                | Kind::KillHolder
                | Kind::CutBlackhole
                | Kind::CutReset
                | Kind::CutDelay
        )
    }

    /// Whether two nemeses can run as a pair: one broker fault at most (there is one
    /// coordinator to aim at), one herd and one stalled join at most, and no slowed broker with
    /// a fault set on one contender's proxies (the proxies keep one fault per broker: one
    /// heal would end the other's fault).
    fn pairs_with(self, other: Kind) -> bool {
        let proxied = |k: Kind| {
            matches!(
                k,
                Kind::CutBlackhole | Kind::CutReset | Kind::CutDelay | Kind::StallJoin
            )
        };
        !(self.broker() && other.broker()
            || self == other && matches!(self, Kind::Herd | Kind::StallJoin)
            || self == Kind::SlowBroker && proxied(other)
            || other == Kind::SlowBroker && proxied(self))
    }
}

impl fmt::Display for Episode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind == Kind::Pair {
            // Each half names its own lock.
            write!(f, "{}", self.kind.name())?;
        } else {
            write!(f, "{} on {:?}", self.kind.name(), self.target)?;
        }
        match self.kind {
            Kind::CutBlackhole => write!(f, ", {:?}, {:?}", self.dir, self.length),
            Kind::CutReset => write!(f, ", {:?}", self.length),
            Kind::CutDelay | Kind::SlowBroker => write!(
                f,
                ", {:?} each frame {:?}, for {:?}",
                self.delay, self.dir, self.length
            ),
            Kind::Herd => write!(f, ", {} contenders", self.herd),
            Kind::PauseHolder | Kind::BrokerPause => {
                write!(f, ", session timeout + {:?}", self.length)
            }
            Kind::KillHolder | Kind::BrokerKill | Kind::BrokerTerm => {
                write!(f, ", down {:?}", self.length)
            }
            Kind::CutMove => write!(
                f,
                ", the {} cut for session timeout + {:?}, node down {:?}",
                if self.pending {
                    "next holder"
                } else {
                    "holder"
                },
                self.length,
                self.broker_length
            ),
            Kind::HoldHeartbeat => write!(f, ", Heartbeat answers held {:?}", self.length),
            Kind::NoexecLoss => write!(
                f,
                ", supervisor stopped and kafka-lock cut off past the lease"
            ),
            Kind::StallJoin => write!(
                f,
                ", a waiter's JoinGroup stalled until a later rebalance, its connections \
                 refused {:?} after the heal",
                self.delay
            ),
            Kind::Pair => {
                let (a, b) = (&self.parts[0], &self.parts[1]);
                write!(
                    f,
                    ": [{a}{}] + {:.1} s later [{b}{}]",
                    if a.waiter { ", a waiter" } else { "" },
                    self.offset.as_secs_f64(),
                    if b.waiter { ", a waiter" } else { "" }
                )
            }
            Kind::HandoverMove => write!(
                f,
                ", node {} at the holder's release, down {:?}",
                if self.broker_fault == Kind::BrokerTerm {
                    "shut down"
                } else {
                    "killed"
                },
                self.length
            ),
            Kind::RuntimeStall => {
                write!(f, ", runtime blocked session timeout + {:?}", self.length)
            }
            Kind::LedgerForger => write!(f, ", records forged for {:?}", self.length),
            Kind::LaneStarvation => write!(f, ", holders killed for {:?}", self.length),
            Kind::HandoverLedgerMove => write!(
                f,
                ", the ledger leader {} at the holder's release, down {:?}",
                if self.broker_fault == Kind::BrokerTerm {
                    "shut down"
                } else {
                    "killed"
                },
                self.length
            ),
            Kind::CoordMoveAtGrant => write!(
                f,
                ", the coordinator shut down at a held checkpoint answer, the third node stopped \
                 {:?}",
                self.length
            ),
            Kind::SlowSupervisorStart => write!(
                f,
                ", the CLI's supervisor starts slowed or failed for {:?}, new kafka-locks {}",
                self.length,
                if self.holder_fault == Kind::KillHolder {
                    "killed"
                } else {
                    "stopped past the session timeout"
                }
            ),
            Kind::CutAtCheckpoint => write!(
                f,
                ", a CLI holder cut both ways from its checkpoint's commit on, session timeout + \
                 {:?}",
                self.length
            ),
            Kind::SlowLedgerCheck => write!(
                f,
                ", ledger topic checks held {:?} from a release{}",
                self.length,
                match self.signal {
                    Some(libc::SIGINT) => ", the first SIGINTed mid-check",
                    Some(_) => ", the first SIGKILLed mid-check",
                    None => "",
                }
            ),
            Kind::AbandonedPolls => write!(
                f,
                ", the waiters' {} at a release for {:?}",
                if self.pending {
                    "long-poll answers held"
                } else {
                    "connections to the ledger leader black-holed"
                },
                self.length
            ),
            Kind::CutLedger => write!(
                f,
                ", {} cut from the ledger leader ({}), {:?}",
                if self.pending {
                    "the next holder at its grant"
                } else {
                    "the waiters"
                },
                if self.holder_fault == Kind::CutReset {
                    "reset".to_owned()
                } else {
                    format!("black-holed {:?}", self.dir)
                },
                self.length
            ),
            Kind::Mixed => write!(
                f,
                ": {} ({:?}) during {} ({:?}, slowed {:?})",
                self.holder_fault.name(),
                self.length,
                self.broker_fault.name(),
                self.broker_length,
                self.delay
            ),
        }
    }
}

/// The schedule for `seed`, drawn from `only` (every kind if empty): in CI mode
/// (`every_kind`), each kind once in a seeded order and then kinds at random; otherwise kinds
/// at random from the start.
pub fn schedule(seed: u64, episodes: usize, every_kind: bool, only: &[Kind]) -> Vec<Episode> {
    let mut rng = Rng::new(seed);
    let pool: &[Kind] = if only.is_empty() { &Kind::ALL } else { only };
    let mut kinds: Vec<Kind> = Vec::new();
    if every_kind {
        kinds.extend(pool);
        rng.shuffle(&mut kinds);
    }
    while kinds.len() < episodes {
        kinds.push(*rng.pick(pool));
    }
    kinds.truncate(episodes.max(if every_kind { pool.len() } else { 0 }));
    if every_kind && only.is_empty() {
        kinds.extend(Kind::CI_EXTRA);
    }
    kinds.into_iter().map(|kind| draw(kind, &mut rng)).collect()
}

/// One episode of `kind`, everything random about it drawn from `rng`. The draws for the kinds
/// added later come after the others' and only for those kinds, so the older kinds' schedules
/// stay as they were for every seed.
fn draw(kind: Kind, rng: &mut Rng) -> Episode {
    let holder_fault = *rng.pick(&Kind::HOLDER);
    let broker_fault = *rng.pick(&Kind::BROKER);
    // A stalled join aims at the native lock's waiters, library or CLI.
    let broker_wide = matches!(
        kind,
        Kind::BrokerKill
            | Kind::BrokerPause
            | Kind::BrokerTerm
            | Kind::SlowBroker
            | Kind::StallJoin
            | Kind::HoldHeartbeat
            | Kind::NoexecLoss
            | Kind::RuntimeStall
            | Kind::LedgerForger
            | Kind::CutLedger
            | Kind::LaneStarvation
            | Kind::HandoverLedgerMove
            | Kind::AbandonedPolls
            | Kind::CoordMoveAtGrant
            | Kind::SlowLedgerCheck
            | Kind::SlowSupervisorStart
            | Kind::CutAtCheckpoint
    );
    let target = if broker_wide || rng.range(0, 2) > 0 {
        Target::Native
    } else {
        Target::Consumer
    };
    let dir = match kind {
        Kind::CutReset | Kind::SlowBroker => Dir::Both,
        _ => *rng.pick(&[Dir::Up, Dir::Down, Dir::Both]),
    };
    let length = match kind {
        Kind::PauseHolder | Kind::BrokerPause => rng.millis(500, 3000),
        Kind::KillHolder => Duration::ZERO,
        Kind::CutBlackhole | Kind::CutReset | Kind::CutDelay => rng.millis(2000, 10_000),
        Kind::SlowBroker => rng.millis(4000, 10_000),
        Kind::BrokerKill | Kind::BrokerTerm => rng.millis(1000, 4000),
        Kind::Herd => Duration::ZERO,
        // The holder fault's length; a pause lasts the session timeout on top.
        Kind::Mixed => rng.millis(2000, 10_000),
        // On top of the session timeout, so the group has dropped the member.
        Kind::CutMove => rng.millis(500, 4000),
        // Until the next release: no length of its own.
        Kind::StallJoin => Duration::ZERO,
        // Apache defers a Heartbeat up to offsets.commit.timeout.ms (5 s); the lease
        // is 5 s from a renewal's send, so up to that bound the holder keeps its lock
        // unless load delays it, and near it may lose it (correctly).
        Kind::HoldHeartbeat => rng.millis(2000, 4500),
        Kind::NoexecLoss => Duration::ZERO,
        // Drawn below, after the draws every kind makes.
        Kind::Pair
        | Kind::HandoverMove
        | Kind::RuntimeStall
        | Kind::LedgerForger
        | Kind::CutLedger
        | Kind::LaneStarvation
        | Kind::HandoverLedgerMove
        | Kind::AbandonedPolls
        | Kind::CoordMoveAtGrant
        | Kind::SlowLedgerCheck
        | Kind::SlowSupervisorStart
        | Kind::CutAtCheckpoint => Duration::ZERO,
    };
    let delay = match kind {
        Kind::CutDelay => rng.millis(300, 8000),
        // Past the 5 s request timeout.
        Kind::SlowBroker | Kind::Mixed => rng.millis(5500, 8000),
        // Heartbeats refused after the stalled JoinGroup is delivered: the waiter learns
        // late of the rebalance it completed. Under the session timeout.
        Kind::StallJoin => rng.millis(1500, 4500),
        _ => Duration::ZERO,
    };
    let broker_length = rng.millis(1000, 8000);
    let pending = kind == Kind::CutMove && rng.range(0, 1) == 1;
    let mut e = Episode {
        kind,
        target,
        length,
        dir,
        delay,
        herd: rng.range(20, 50) as usize,
        seed: rng.next_u64(),
        holder_fault,
        broker_fault,
        broker_length,
        pending,
        waiter: false,
        parts: Vec::new(),
        offset: Duration::ZERO,
        signal: None,
    };
    match kind {
        Kind::Pair => {
            let a = *rng.pick(&Kind::PAIRABLE);
            let b = loop {
                let b = *rng.pick(&Kind::PAIRABLE);
                if a.pairs_with(b) {
                    break b;
                }
            };
            let first = draw(a, rng);
            let mut second = draw(b, rng);
            // Two faults at one contender would be one fault: on the same lock the
            // second aims at a contender that does not hold.
            second.waiter = a.at_contender() && b.at_contender() && first.target == second.target;
            e.offset = rng.millis(0, 2000);
            e.parts = vec![first, second];
        }
        Kind::HandoverMove => {
            e.length = rng.millis(1000, 4000);
            if rng.range(0, 1) == 1 {
                e.broker_fault = Kind::BrokerTerm;
            } else {
                e.broker_fault = Kind::BrokerKill;
            }
        }
        Kind::RuntimeStall => e.length = rng.millis(1000, 3000),
        Kind::LedgerForger => e.length = rng.millis(3000, 8000),
        Kind::LaneStarvation => e.length = rng.millis(8000, 15_000),
        Kind::HandoverLedgerMove => {
            e.length = rng.millis(1000, 4000);
            e.broker_fault = if rng.range(0, 1) == 1 {
                Kind::BrokerTerm
            } else {
                Kind::BrokerKill
            };
        }
        // Past the poll's 5 s wait, some past its 10 s bound (wait plus request timeout), so
        // a waiter also gives a poll up and opens another connection.
        Kind::AbandonedPolls => {
            e.length = rng.millis(5500, 12_000);
            e.pending = rng.range(0, 1) == 1;
        }
        // On top of the session timeout, so the broker has dropped the member and another
        // contender holds before the commit reaches the broker; short of the commit request's
        // local bound (the broker's 5 s plus the 5 s request timeout), so a holder that waits
        // for the commit ends on the broker's refusal after the heal, as in the finding
        // (RELIABILITY.md, "What the suite found").
        Kind::CutAtCheckpoint => e.length = rng.millis(1000, 3500),
        // The follower's stop: short of the session timeouts, long against one fetch round.
        Kind::CoordMoveAtGrant => e.length = rng.millis(1000, 2000),
        // Up to past the session timeout (6 s) and a request's bound, so a contender's own
        // timers run out during the check too.
        Kind::SlowLedgerCheck => {
            e.length = rng.millis(500, 12_000);
            e.signal = match rng.range(0, 2) {
                0 => None,
                1 => Some(libc::SIGINT),
                _ => Some(libc::SIGKILL),
            };
        }
        // Long enough for a few rounds of restarts and strikes.
        Kind::SlowSupervisorStart => {
            e.length = rng.millis(8000, 15_000);
            e.holder_fault = if rng.range(0, 1) == 1 {
                Kind::KillHolder
            } else {
                Kind::PauseHolder
            };
        }
        Kind::CutLedger => {
            e.length = rng.millis(2000, 8000);
            e.pending = rng.range(0, 1) == 1;
            e.holder_fault = if rng.range(0, 1) == 1 {
                Kind::CutReset
            } else {
                Kind::CutBlackhole
            };
        }
        _ => {}
    }
    e
}

#[test]
fn a_seed_replays_the_same_schedule_and_ci_mode_has_every_kind() {
    assert_eq!(schedule(7, 30, false, &[]), schedule(7, 30, false, &[]));
    assert_ne!(schedule(7, 30, false, &[]), schedule(8, 30, false, &[]));
    let ci = schedule(99, 3, true, &[]);
    assert_eq!(ci.len(), Kind::ALL.len() + Kind::CI_EXTRA.len());
    for kind in Kind::ALL.into_iter().chain(Kind::CI_EXTRA) {
        assert!(ci.iter().any(|e| e.kind == kind), "{kind:?} missing");
        assert_eq!(Kind::from_name(kind.name()), Some(kind));
    }
    for kind in Kind::OPTIONAL {
        assert_eq!(
            ci.iter().any(|e| e.kind == kind),
            Kind::CI_EXTRA.contains(&kind),
            "{kind:?} in CI mode"
        );
        assert_eq!(Kind::from_name(kind.name()), Some(kind));
        // A pair's halves and a coordinator move at a release aim at either lock.
        let either = matches!(kind, Kind::Pair | Kind::HandoverMove);
        assert!(schedule(7, 3, true, &[kind])
            .iter()
            .all(|e| e.kind == kind && (either || e.target == Target::Native)));
    }
    for e in schedule(3, 200, false, &[Kind::Pair]) {
        let [a, b] = &e.parts[..] else {
            panic!("a pair of {} nemeses", e.parts.len())
        };
        assert!(a.parts.is_empty() && b.parts.is_empty());
        assert!(Kind::PAIRABLE.contains(&a.kind) && Kind::PAIRABLE.contains(&b.kind));
        assert!(a.kind.pairs_with(b.kind), "{a} with {b}");
        assert!(!(a.kind.broker() && b.kind.broker()));
        // Two faults aimed at contenders of one lock: the second is not at the holder.
        if a.kind.at_contender() && b.kind.at_contender() && a.target == b.target {
            assert!(b.waiter && !a.waiter);
        }
        assert!(e.offset <= Duration::from_secs(2));
    }
    let only = schedule(7, 5, false, &[Kind::StallJoin]);
    assert!(only
        .iter()
        .all(|e| e.kind == Kind::StallJoin && e.target == Target::Native));
}

//! One run of the fault suite: a three-node Apache Kafka cluster, two locks with their
//! contenders, the checker's self-test, then the seeded episodes, then the analysis and the
//! report.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::checker::{
    self, analyse, analyse_permits, judged, Analysis, Checker, Event, Kind as Ev,
};
use super::kproxy::{Fault, ProxySet};
use super::nemesis::{schedule, Episode, Kind, Rng, Target};
use super::pool::{self, Env, Pool, Role, SlotSpec};
use super::roles::{options, to_mono, Flavour};
use super::SESSION;
use crate::support::kafka::probe::{create_topic, offsets_partition};
use crate::support::kafka::{KafkaCluster, KafkaOptions};
use crate::support::lifeline::{Output, Supervised};
use crate::support::{mono_ns, repo_root, unique_group};

/// The slots of the contenders only some runs have: the `reads` role (hold-heartbeat's
/// target), `kafka-lock run` with a command that cannot exec (noexec-loss's), and the
/// contender that never reads its events (`--slow-consumer`).
const READS: &str = "read1";
const NOEXEC: &str = "nox1";
const SLOW: &str = "slow1";
/// The `stall` contender's slot (runtime-stall's target).
const STALL: &str = "stall1";

/// Bound on a lock having a holder to aim a fault at.
const HOLDER_BOUND: Duration = Duration::from_secs(60);
/// Bound on the lock being acquired again after a fault healed. Generous: a restarted broker
/// and a cluster catching up take several seconds on two busy cores, and this is about
/// liveness, which the suite reports but does not fail on.
const RECOVERY_BOUND: Duration = Duration::from_secs(120);

#[derive(Debug, Clone)]
pub struct Config {
    pub seed: u64,
    pub episodes: usize,
    pub ci: bool,
    /// Permits of the native lock (`KAFKA_LOCK_FAULT_PERMITS`, 1 = a mutex): above 1 it is a
    /// semaphore and the checker runs in semaphore mode on it.
    pub permits: u16,
    /// The nemeses drawn (`KAFKA_LOCK_FAULT_KINDS`, names separated by commas; empty: all).
    pub kinds: Vec<Kind>,
    /// Locks per many-locks contender (`KAFKA_LOCK_FAULT_MANY`; 0, the default: none). Above
    /// 1, two more contender processes each take the native lock and the same `many - 1`
    /// other locks through one client, so the nemeses hit connections many locks share.
    pub many: usize,
    /// A contender that never reads its lock's events stream joins the native lock
    /// (`KAFKA_LOCK_FAULT_SLOW_CONSUMER=1`).
    pub slow_consumer: bool,
    /// Checkpoint continuity (`KAFKA_LOCK_FAULT_CHECKPOINTS=1`; by default in CI mode and
    /// whenever a nemesis aimed at the handover's ledger traffic is drawn): the native lock's
    /// contenders store checkpoints while they hold and read the last one at their grant, and
    /// the checker judges them.
    pub checkpoints: bool,
}

impl Config {
    /// From `KAFKA_LOCK_FAULT_SEED` (else from the clock, printed so it can be replayed) and
    /// `KAFKA_LOCK_FAULT_EPISODES` (else one of each kind in CI mode, 200 in the long mode),
    /// and `KAFKA_LOCK_FAULT_KINDS` (e.g. `stall-join,cut-move`: only those nemeses).
    pub fn from_env(ci: bool) -> Config {
        let kinds: Vec<Kind> = std::env::var("KAFKA_LOCK_FAULT_KINDS")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                Kind::from_name(s).unwrap_or_else(|| {
                    let names: Vec<_> = Kind::ALL
                        .iter()
                        .chain(&Kind::OPTIONAL)
                        .map(|k| k.name())
                        .collect();
                    panic!("KAFKA_LOCK_FAULT_KINDS: no nemesis {s:?}; the names: {names:?}")
                })
            })
            .collect();
        let seed = std::env::var("KAFKA_LOCK_FAULT_SEED")
            .ok()
            .map(|s| s.parse().expect("KAFKA_LOCK_FAULT_SEED must be a number"))
            .unwrap_or_else(|| (mono_ns() as u64) % 1_000_000);
        let episodes = std::env::var("KAFKA_LOCK_FAULT_EPISODES")
            .ok()
            .map(|s| {
                s.parse()
                    .expect("KAFKA_LOCK_FAULT_EPISODES must be a number")
            })
            .unwrap_or(if ci {
                if kinds.is_empty() {
                    Kind::ALL.len()
                } else {
                    kinds.len()
                }
            } else {
                200
            });
        let permits = std::env::var("KAFKA_LOCK_FAULT_PERMITS")
            .ok()
            .map_or(1, |s| {
                s.parse()
                    .ok()
                    .filter(|&n| n >= 1)
                    .expect("KAFKA_LOCK_FAULT_PERMITS must be a number from 1")
            });
        let many = std::env::var("KAFKA_LOCK_FAULT_MANY").ok().map_or(0, |s| {
            s.parse().expect("KAFKA_LOCK_FAULT_MANY must be a number")
        });
        let slow_consumer = std::env::var("KAFKA_LOCK_FAULT_SLOW_CONSUMER")
            .is_ok_and(|v| !v.is_empty() && v != "0");
        // On in CI mode: it adds no episode, and it is what catches a new holder reading an
        // older checkpoint than one already reported stored (RELIABILITY.md). `=0` turns it
        // off there.
        let checkpoints = match std::env::var("KAFKA_LOCK_FAULT_CHECKPOINTS") {
            Ok(v) if !v.is_empty() => v != "0",
            _ => ci || kinds.iter().any(|k| Kind::CHECKPOINTS.contains(k)),
        };
        Config {
            seed,
            episodes,
            ci,
            permits,
            kinds,
            many,
            slow_consumer,
            checkpoints,
        }
    }
}

/// What happened in one episode.
#[derive(Debug, Clone)]
struct Record {
    n: usize,
    plan: Episode,
    lock: String,
    target: Option<String>,
    note: String,
    start: i64,
    healed: i64,
    end: i64,
    recovered: Option<Duration>,
}

struct Run {
    cfg: Config,
    out: PathBuf,
    /// Shared by the two halves of a pair; each call takes it briefly (a restart waits for the
    /// node, so the other half's next call may wait too).
    cluster: std::sync::Mutex<KafkaCluster>,
    rt: tokio::runtime::Runtime,
    checker: Arc<Checker>,
    pool: Pool,
    native: String,
    consumer: String,
    /// The native lock's ledger.
    ledger: Flavour,
    /// The locks only the many-locks contenders take (besides the native lock).
    extra: Vec<String>,
    records: Vec<Record>,
    /// What the nemeses that judge for themselves found wrong (runtime-stall).
    failures: std::sync::Mutex<Vec<String>>,
}

pub fn run(mut cfg: Config) {
    let mode = if cfg.ci { "ci" } else { "long" };
    let out = repo_root().join("target/fault-suite").join(format!(
        "{mode}-seed{}-{}",
        cfg.seed,
        unique_group("run")
    ));
    let logs = out.join("logs");
    std::fs::create_dir_all(&logs).expect("create the run's directory");
    let plan = schedule(cfg.seed, cfg.episodes, cfg.ci, &cfg.kinds);
    println!(
        "fault suite ({mode}): seed {}, {} episodes; replay with KAFKA_LOCK_FAULT_SEED={} \
         KAFKA_LOCK_FAULT_EPISODES={}; files in {}",
        cfg.seed,
        plan.len(),
        cfg.seed,
        cfg.episodes,
        out.display()
    );
    let began = Instant::now();
    // Lane starvation aims at the many-locks contenders, with enough locks to queue on a lane.
    let starve = plan.iter().any(|e| e.kind == Kind::LaneStarvation);
    if starve {
        cfg.many = cfg.many.max(4);
    }

    let cluster = KafkaCluster::start(KafkaOptions::three_nodes());
    let native = unique_group("fault-native");
    let consumer = unique_group("fault-consumer");
    create_topic(&cluster.bootstrap(), &consumer, 1);
    // The native lock's tokens are ledger offsets: the checker then judges the tokens that are
    // meant to survive everything, and the nemeses hit the ledger's leader as well. A semaphore
    // (--permits N) too: its tokens are ledger offsets per permit slot, judged per slot.
    let ledger = Flavour::Ledger(unique_group("fault-ledger"));
    let consumed = Flavour::Consumer(consumer.clone());
    if let Flavour::Ledger(topic) = &ledger {
        create_topic(&cluster.bootstrap(), topic, 1);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let checker = Arc::new(Checker::start());
    let brokers: Vec<(i32, SocketAddr)> = cluster
        .nodes()
        .iter()
        .map(|n| (n.id(), n.addr().parse().expect("node address")))
        .collect();
    let env = Env {
        checker: checker.clone(),
        bootstrap: cluster.bootstrap(),
        logs: logs.clone(),
        exe: std::env::current_exe().expect("the test binary"),
        kafka_lock: PathBuf::from(env!("CARGO_BIN_EXE_kafka-lock")),
        // A checkpoint is one per lock: a semaphore has none.
        checkpoints: cfg.checkpoints && cfg.permits == 1,
    };
    let permits = cfg.permits;
    let spec = |name: &str, role, lock: &str, flavour: &Flavour| SlotSpec {
        name: name.to_owned(),
        role,
        lock: lock.to_owned(),
        flavour: flavour.clone(),
        permits: if matches!(flavour, Flavour::Consumer(_)) {
            1
        } else {
            permits
        },
        extra: Vec::new(),
        lanes: 0,
    };
    let prefix = unique_group("fault-many");
    let extra: Vec<String> = (1..cfg.many).map(|i| format!("{prefix}-{i}")).collect();
    let mut specs = vec![
        spec("lib1", Role::Lib, &native, &ledger),
        spec("lib2", Role::Lib, &native, &ledger),
        spec("lib3", Role::Lib, &native, &ledger),
        spec("cli1", Role::Cli, &native, &ledger),
        spec("cli2", Role::Cli, &native, &ledger),
        spec("clib1", Role::Lib, &consumer, &consumed),
        spec("clib2", Role::Lib, &consumer, &consumed),
        spec("java1", Role::Java, &consumer, &consumed),
    ];
    // Each optional nemesis aims at a contender of its own, there only when it is drawn.
    if plan.iter().any(|e| e.kind == Kind::HoldHeartbeat) {
        specs.push(spec(READS, Role::Reads, &native, &ledger));
    }
    if plan.iter().any(|e| e.kind == Kind::NoexecLoss) {
        specs.push(spec(NOEXEC, Role::NoExec, &native, &ledger));
    }
    if cfg.slow_consumer {
        specs.push(spec(SLOW, Role::Slow, &native, &ledger));
    }
    if plan.iter().any(|e| e.kind == Kind::RuntimeStall) {
        specs.push(spec(STALL, Role::Stall, &native, &ledger));
    }
    if cfg.many > 1 {
        for name in ["many1", "many2"] {
            specs.push(SlotSpec {
                extra: extra.clone(),
                lanes: usize::from(starve),
                ..spec(name, Role::Many, &native, &ledger)
            });
        }
    }
    let handle = rt.handle().clone();
    let pool = Pool::start(
        env,
        specs,
        || ProxySet::start(&handle, &brokers),
        cfg.seed ^ 0x5eed,
    );
    let mut run = Run {
        cfg,
        out,
        cluster: std::sync::Mutex::new(cluster),
        rt,
        checker,
        pool,
        native,
        consumer,
        ledger,
        extra,
        records: Vec::new(),
        failures: std::sync::Mutex::new(Vec::new()),
    };
    let selfcheck = run.self_check();
    run.warm_up();
    let started = mono_ns();
    for (n, episode) in plan.into_iter().enumerate() {
        let record = run.episode(n + 1, episode);
        println!(
            "[{:>5.0}s] episode {:>3} {}: {}{}",
            began.elapsed().as_secs_f64(),
            record.n,
            record.plan,
            record.note,
            match record.recovered {
                Some(d) => format!(", acquired again {:.1} s after the heal", d.as_secs_f64()),
                None => ", NOT acquired again in time".to_owned(),
            }
        );
        run.records.push(record);
    }
    run.pool.stop();
    let finished = mono_ns();
    run.finish(started, finished, &selfcheck, began.elapsed());
}

/// What the checker's self-test found.
struct SelfCheck {
    lock: String,
    analysis: Analysis,
}

impl Run {
    fn cluster(&self) -> std::sync::MutexGuard<'_, KafkaCluster> {
        self.cluster.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_of(&self, t: Target) -> &str {
        match t {
            Target::Native => &self.native,
            Target::Consumer => &self.consumer,
        }
    }

    fn flavour_of(&self, lock: &str) -> Flavour {
        if lock == self.consumer {
            Flavour::Consumer(self.consumer.clone())
        } else {
            self.ledger.clone()
        }
    }

    /// Proves on the real cluster that the suite can fail: a contender that ignores its loss is
    /// paused past the session timeout while an honest one waits; the honest one takes over,
    /// the broken one goes on writing, and the checker must report the overlap.
    fn self_check(&mut self) -> SelfCheck {
        let lock = unique_group("fault-selfcheck");
        let env = self.pool.env();
        let bootstrap = self.cluster().bootstrap();
        let start = |id: &str, broken: bool, seed: u64| {
            let cmd = pool::lib_command(env, id, &lock, &bootstrap, &Flavour::Plain, broken, seed);
            let log = env.logs.join(format!("{id}.log"));
            Supervised::spawn(&cmd, Output::Log(&log), None)
                .unwrap_or_else(|e| panic!("cannot start {id}: {e}"))
                .0
        };
        let mut broken = start("broken.1", true, 1);
        self.wait_for(HOLDER_BOUND, "the broken contender to acquire", |c| {
            c.acquired_since(&lock, 0, |id| id == "broken.1") > 0
        });
        let mut honest = start("honest.1", false, 2);
        let paused_at = mono_ns();
        broken.signal(libc::SIGSTOP);
        std::thread::sleep(SESSION + Duration::from_secs(2));
        broken.signal(libc::SIGCONT);
        self.wait_for(HOLDER_BOUND, "the honest contender to take over", |c| {
            c.acquired_since(&lock, paused_at, |id| id == "honest.1") > 0
        });
        self.wait_for(
            Duration::from_secs(20),
            "a fenced write from the broken one",
            |c| {
                c.lock()
                    .writes
                    .iter()
                    .any(|w| w.lock == lock && w.id == "broken.1" && !w.accepted)
            },
        );
        for (id, p) in [("broken.1", &mut broken), ("honest.1", &mut honest)] {
            p.stop(Duration::from_secs(10));
            self.checker.event(Event {
                lock: lock.clone(),
                id: id.to_owned(),
                kind: Ev::Killed,
                mono: mono_ns(),
                token: None,
                lease_end: None,
            });
        }
        let log = self.checker.lock();
        let events: Vec<_> = log
            .events
            .iter()
            .filter(|e| e.lock == lock)
            .cloned()
            .collect();
        let writes: Vec<_> = log
            .writes
            .iter()
            .filter(|w| w.lock == lock)
            .cloned()
            .collect();
        drop(log);
        let analysis = analyse(&events, &writes, mono_ns());
        println!(
            "self-check (a contender that ignores its loss): {} overlap(s), {} stale write(s) \
             accepted, {} write(s) fenced off",
            analysis.judged_overlaps().count(),
            analysis.stale_accepted.len(),
            analysis.rejected.len()
        );
        SelfCheck { lock, analysis }
    }

    /// Waits until every path has taken its lock once: the suite proves nothing otherwise.
    fn warm_up(&self) {
        for (lock, prefix) in [
            (&self.native, "lib"),
            (&self.native, "cli"),
            (&self.consumer, "clib"),
        ] {
            self.wait_for(
                Duration::from_secs(120),
                &format!("a {prefix} contender to acquire {lock}"),
                |c| c.acquired_since(lock, 0, |id| id.starts_with(prefix)) > 0,
            );
        }
        for slot in [READS, NOEXEC, SLOW, STALL] {
            if self.pool.has_slot(slot) {
                self.wait_for(
                    Duration::from_secs(120),
                    &format!("{slot} to acquire {}", self.native),
                    |c| c.acquired_since(&self.native, 0, |id| id.starts_with(slot)) > 0,
                );
            }
        }
        for lock in &self.extra {
            self.wait_for(
                Duration::from_secs(120),
                &format!("a many-locks contender to acquire {lock}"),
                |c| c.acquired_since(lock, 0, |id| id.starts_with("many")) > 0,
            );
        }
    }

    /// Polls the checker: the events arrive from other processes, with nothing to wait on.
    fn wait_for(&self, bound: Duration, what: &str, done: impl Fn(&Checker) -> bool) {
        let deadline = Instant::now() + bound;
        while !done(&self.checker) {
            assert!(
                Instant::now() < deadline,
                "fault suite: no {what} within {bound:?}; files in {}",
                self.out.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The latest holder of `lock` that is a running contender, waiting up to `bound`.
    fn holder(&self, lock: &str, bound: Duration) -> Option<String> {
        let deadline = Instant::now() + bound;
        loop {
            if let Some(id) = self
                .checker
                .holders(lock)
                .into_iter()
                .find(|id| self.pool.role_of(id).is_some())
            {
                return Some(id);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn episode(&mut self, n: usize, plan: Episode) -> Record {
        let lock = self
            .lock_of(plan.parts.first().unwrap_or(&plan).target)
            .to_owned();
        let (target, note, start) = self.strike(n, &plan);
        // Every lock a fault was aimed at must be taken again (a pair's halves may aim at both).
        let mut locks = vec![lock.clone()];
        if plan.kind == Kind::LaneStarvation {
            locks.extend(self.extra.iter().cloned());
        }
        for part in &plan.parts {
            let l = self.lock_of(part.target).to_owned();
            if !locks.contains(&l) {
                locks.push(l);
            }
        }
        let healed = mono_ns();
        let heal_instant = Instant::now();
        let deadline = heal_instant + RECOVERY_BOUND;
        let recovered = loop {
            if locks
                .iter()
                .all(|l| self.checker.acquired_since(l, healed, judged) > 0)
            {
                break Some(heal_instant.elapsed());
            }
            if Instant::now() >= deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if plan.kind == Kind::LaneStarvation && target.is_some() && recovered.is_none() {
            self.failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(format!(
                    "lane-starvation, episode {n}: a lock of the one-lane clients not acquired \
                     within {RECOVERY_BOUND:?} of the last kill"
                ));
        }
        // The waiters' fallback is the point of these two: the lock must be taken again.
        if matches!(
            plan.kind,
            Kind::AbandonedPolls
                | Kind::HandoverLedgerMove
                | Kind::CoordMoveAtGrant
                | Kind::SlowLedgerCheck
                | Kind::SlowSupervisorStart
        ) && target.is_some()
            && recovered.is_none()
        {
            self.failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(format!(
                    "{}, episode {n}: the lock not acquired again within {RECOVERY_BOUND:?} of \
                     the heal",
                    plan.kind.name()
                ));
        }
        Record {
            n,
            plan,
            lock,
            target,
            note,
            start,
            healed,
            end: mono_ns(),
            recovered,
        }
    }

    /// Runs the fault `plan` describes and heals it. Returns its target (none: nothing to aim
    /// at, nothing done), what was done, and when the fault began.
    fn strike(&self, n: usize, plan: &Episode) -> (Option<String>, String, i64) {
        let lock = self.lock_of(plan.target).to_owned();
        let mut rng = Rng::new(plan.seed);
        let mut target = None;
        let mut note = String::new();
        let start;
        match plan.kind {
            Kind::PauseHolder => {
                target = self.aim(plan, &lock, &mut rng);
                start = mono_ns();
                if let Some(id) = &target {
                    let pids = self.pool.pause(id);
                    std::thread::sleep(SESSION + plan.length);
                    self.pool.resume(&pids);
                    note = format!("{id} ({} processes) stopped", pids.len());
                }
            }
            Kind::KillHolder => {
                target = self.aim(plan, &lock, &mut rng);
                start = mono_ns();
                if let Some(id) = &target {
                    self.pool.kill(id);
                    note = format!("{id} killed");
                }
            }
            Kind::CutBlackhole | Kind::CutReset | Kind::CutDelay => {
                target = self.aim(plan, &lock, &mut rng);
                let coordinator = self.cluster().coordinator(&lock);
                let fault = match plan.kind {
                    Kind::CutBlackhole => Fault::Blackhole(plan.dir),
                    Kind::CutReset => Fault::Reset,
                    _ => Fault::Delay(plan.delay, plan.dir),
                };
                start = mono_ns();
                if let Some(id) = &target {
                    self.pool.proxies_of(id, |p| p.set(coordinator, fault));
                    std::thread::sleep(plan.length);
                    self.pool
                        .proxies_of(id, |p| p.set(coordinator, Fault::Clear));
                    note = format!("{id} cut from coordinator node {coordinator}");
                }
            }
            Kind::BrokerKill | Kind::BrokerPause | Kind::BrokerTerm | Kind::SlowBroker => {
                let node = self.cluster().coordinator(&lock);
                start = mono_ns();
                note = self.broker_fault(plan.kind, node, plan.length, plan.delay);
                target = Some(format!("node {node}"));
            }
            Kind::Mixed => {
                let cut = matches!(plan.holder_fault, Kind::CutBlackhole | Kind::CutReset);
                target = if cut {
                    self.cut_target(&lock, &mut rng)
                } else {
                    self.holder(&lock, HOLDER_BOUND)
                };
                let node = self.cluster().coordinator(&lock);
                start = mono_ns();
                let heal_at = Instant::now()
                    + match plan.holder_fault {
                        Kind::PauseHolder => SESSION + plan.length,
                        Kind::KillHolder => Duration::ZERO,
                        _ => plan.length,
                    };
                let mut paused = Vec::new();
                if let Some(id) = &target {
                    match plan.holder_fault {
                        Kind::PauseHolder => paused = self.pool.pause(id),
                        Kind::KillHolder => {
                            self.pool.kill(id);
                        }
                        Kind::CutBlackhole => {
                            self.pool
                                .proxies_of(id, |p| p.set_all(Fault::Blackhole(plan.dir)));
                        }
                        _ => {
                            self.pool.proxies_of(id, |p| p.set_all(Fault::Reset));
                        }
                    }
                }
                let broker =
                    self.broker_fault(plan.broker_fault, node, plan.broker_length, plan.delay);
                std::thread::sleep(heal_at.saturating_duration_since(Instant::now()));
                self.pool.resume(&paused);
                if let (Some(id), true) = (&target, cut) {
                    self.pool.proxies_of(id, |p| p.set_all(Fault::Clear));
                }
                if let Some(id) = &target {
                    note = format!("{id}: {} during {broker}", plan.holder_fault.name());
                }
            }
            Kind::CutMove => {
                start = mono_ns();
                let (t, n) = self.cut_move(plan, &lock, &mut rng);
                target = t;
                note = n;
            }
            Kind::StallJoin => {
                start = mono_ns();
                let (t, n) = self.stall_join(plan, &lock);
                target = t;
                note = n;
            }
            Kind::HoldHeartbeat => {
                start = mono_ns();
                let (t, n) = self.hold_heartbeat(plan, &lock);
                target = t;
                note = n;
            }
            Kind::NoexecLoss => {
                start = mono_ns();
                let (t, n) = self.noexec_loss(&lock);
                target = t;
                note = n;
            }
            Kind::Herd => {
                start = mono_ns();
                let acquired = self.herd(n, plan, &lock, &mut rng);
                note = format!("{} joined at once, {acquired} acquired", plan.herd);
            }
            Kind::Pair => {
                let (a, b) = (&plan.parts[0], &plan.parts[1]);
                // Each half runs and heals on its own schedule; the second starts `offset`
                // after the first, whatever the first is doing then.
                let (first, second) = std::thread::scope(|s| {
                    let later = s.spawn(|| {
                        std::thread::sleep(plan.offset);
                        self.strike(n, b)
                    });
                    let first = self.strike(n, a);
                    (first, later.join().expect("the pair's second nemesis"))
                });
                start = first.2.min(second.2);
                let said = |half: &(Option<String>, String, i64), k: &Episode| {
                    format!(
                        "{} at {:+.1} s: {}",
                        k.kind.name(),
                        (half.2 - start) as f64 / 1e9,
                        half.1
                    )
                };
                if first.0.is_some() || second.0.is_some() {
                    target = Some(
                        [&first.0, &second.0]
                            .into_iter()
                            .map(|t| t.as_deref().unwrap_or("-"))
                            .collect::<Vec<_>>()
                            .join(" + "),
                    );
                }
                note = format!("{}; {}", said(&first, a), said(&second, b));
            }
            Kind::HandoverMove | Kind::HandoverLedgerMove => {
                start = mono_ns();
                let ledger = plan.kind == Kind::HandoverLedgerMove;
                let (t, n) = self.handover_move(plan, &lock, ledger);
                target = t;
                note = n;
            }
            Kind::CoordMoveAtGrant => {
                start = mono_ns();
                let (t, n) = self.coord_move_at_grant(plan, &lock);
                target = t;
                note = n;
            }
            Kind::SlowLedgerCheck => {
                start = mono_ns();
                let (t, n) = self.slow_ledger_check(plan, &lock);
                target = t;
                note = n;
            }
            Kind::AbandonedPolls => {
                start = mono_ns();
                let (t, n) = self.abandoned_polls(plan, &lock);
                target = t;
                note = n;
            }
            Kind::RuntimeStall => {
                start = mono_ns();
                let (t, n) = self.runtime_stall(plan, &lock);
                target = t;
                note = n;
            }
            Kind::LedgerForger => {
                start = mono_ns();
                let (t, n) = self.ledger_forger(plan, &lock);
                target = t;
                note = n;
            }
            Kind::LaneStarvation => {
                start = mono_ns();
                let (t, n) = self.lane_starvation(plan, &mut rng);
                target = t;
                note = n;
            }
            Kind::CutLedger => {
                start = mono_ns();
                let (t, n) = self.cut_ledger(plan, &lock);
                target = t;
                note = n;
            }
            Kind::SlowSupervisorStart => {
                start = mono_ns();
                let (t, n) = self.slow_supervisor_start(plan, &lock, &mut rng);
                target = t;
                note = n;
            }
            Kind::CutAtCheckpoint => {
                start = mono_ns();
                let (t, n) = self.cut_at_checkpoint(plan, &lock);
                target = t;
                note = n;
            }
        }
        if target.is_none() && plan.kind != Kind::Herd {
            note = if note.is_empty() {
                "no holder to aim at: nothing done".into()
            } else {
                format!("{note}: nothing done")
            };
        }
        (target, note, start)
    }

    /// The cut-move nemesis: a member is cut off from every broker for longer than its session
    /// timeout, either the holder or (`pending`) a waiter armed to be cut right after its next
    /// SyncGroup answer while the holder is killed, so that the assignment naming it is never
    /// confirmed. Then the coordinator's node is killed and the cut heals as soon as another
    /// node is named coordinator, while it loads the group: the member's next Heartbeat may meet
    /// a coordinator that answers NONE blindly. Returns the target and what was done.
    fn cut_move(&self, plan: &Episode, lock: &str, rng: &mut Rng) -> (Option<String>, String) {
        let holder = self.holder(lock, HOLDER_BOUND);
        let target = if plan.pending {
            let waiters: Vec<String> = self
                .pool
                .proxied(lock)
                .into_iter()
                .filter(|id| Some(id) != holder.as_ref())
                .collect();
            let (Some(h), false) = (&holder, waiters.is_empty()) else {
                return (None, String::new());
            };
            let w = rng.pick(&waiters).clone();
            self.pool.proxies_of(&w, |p| p.cut_after_sync());
            self.pool.kill(h);
            w
        } else {
            match holder.filter(|id| self.pool.role_of(id) != Some(Role::Java)) {
                Some(h) => {
                    self.pool.proxies_of(&h, |p| {
                        p.set_all(Fault::Blackhole(super::kproxy::Dir::Both))
                    });
                    h
                }
                None => return (None, String::new()),
            }
        };
        std::thread::sleep(SESSION + plan.length);
        let node = self.cluster().coordinator(lock);
        self.cluster().kill(node);
        let down = Instant::now();
        let new = self.cluster().wait_for_new_coordinator(lock, node);
        self.pool.proxies_of(&target, |p| p.set_all(Fault::Clear));
        std::thread::sleep(plan.broker_length.saturating_sub(down.elapsed()));
        self.cluster().restart(node);
        let what = if plan.pending {
            "cut after its next assignment while the holder was killed"
        } else {
            "holder cut"
        };
        (
            Some(target.clone()),
            format!("{target}: {what}; node {node} killed, cut healed when node {new} was named"),
        )
    }

    /// The stall-join nemesis: a waiter's next JoinGroup under its member id is held with its
    /// connection, whose client side is shut, so the waiter resends at once on a new connection
    /// and goes on with the answer to that. When another contender releases a hold begun later,
    /// the waiter's newer connections to that broker are reset (and new ones refused), and the
    /// stalled JoinGroup is delivered as the rebalance that release starts is under way: the
    /// broker counts it in that join phase and re-arms the waiter's session timer then, unknown
    /// to the waiter, which learns of that generation only when the refusal ends. It is then
    /// cut off right after its next SyncGroup answer for longer than the session timeout: if
    /// that answer begins a hold counted from its late JoinGroup, the broker drops it before
    /// the hold's lease ends.
    fn stall_join(&self, plan: &Episode, lock: &str) -> (Option<String>, String) {
        let holder = self.holder(lock, HOLDER_BOUND);
        let mut waiters: Vec<(i64, String)> = {
            let log = self.checker.lock();
            self.pool
                .proxied(lock)
                .into_iter()
                .filter(|id| Some(id) != holder.as_ref())
                .map(|id| {
                    let since = log
                        .events
                        .iter()
                        .filter(|e| e.id == id && e.kind == Ev::Waiting)
                        .map(|e| e.mono)
                        .next_back()
                        .unwrap_or(i64::MAX);
                    (since, id)
                })
                .collect()
        };
        if waiters.is_empty() {
            return (None, String::new());
        }
        // The queue is served in order of waiting: the second in line stays a waiter through
        // the next hold, and is named at the rebalance that hold's release starts, the one the
        // stalled JoinGroup is delivered in. (The first would acquire on its resend's answer,
        // and a member that acquires leaves with its id: the stalled JoinGroup is then refused.)
        waiters.sort();
        let w = waiters[1.min(waiters.len() - 1)].1.clone();
        // The proxies belong to the slot: a CLI contender exits after its hold, and the faults
        // set on its proxies must still be healed.
        let slot = w.rsplit_once('.').map_or(w.as_str(), |(s, _)| s).to_owned();
        let mine = |id: &str| {
            id.strip_prefix(slot.as_str())
                .is_some_and(|r| r.starts_with('.'))
        };
        let stalled = |pool: &Pool| {
            let mut fired = false;
            pool.slot_proxies(&slot, |p| fired = p.join_stalled());
            fired
        };
        self.pool.slot_proxies(&slot, |p| p.stall_next_join());
        // The holders release within seconds, so the waiter joins a rebalance soon.
        let deadline = Instant::now() + HOLDER_BOUND;
        while !stalled(&self.pool) {
            // A CLI waiter that acquires exits; the next one in its slot joins under an id too.
            if Instant::now() >= deadline {
                self.pool.slot_proxies(&slot, |p| p.set_all(Fault::Clear));
                return (None, String::new());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The waiter saw its connection end and resent at once on a new one (a stall past its
        // join timeout would outlast the rebalance timeout: the broker would drop the member
        // and the stalled JoinGroup would meet UNKNOWN_MEMBER_ID, harmless). The first in line
        // acquires at this rebalance; its release starts the next.
        let resent = mono_ns() - Duration::from_millis(100).as_nanos() as i64;
        // Heal as another contender releases a hold begun after the resend. If the waiter
        // itself acquires or exits first, its member id is gone and the stalled JoinGroup can
        // only be refused: heal then.
        let heal_bound = Instant::now() + RECOVERY_BOUND;
        let (released, moot) = loop {
            let (released, moot) = {
                let log = self.checker.lock();
                let recent = || {
                    log.events
                        .iter()
                        .filter(|e| checker::base(&e.lock) == lock && e.mono > resent)
                };
                let moot = recent().any(|e| mine(&e.id) && e.kind != Ev::Waiting)
                    || self.pool.role_of(&w).is_none();
                let released = recent()
                    .filter(|e| e.kind == Ev::Acquired && !mine(&e.id))
                    .map(|e| (e.id.clone(), e.mono))
                    .next_back()
                    .and_then(|(id, at)| {
                        recent()
                            .any(|e| e.id == id && e.kind == Ev::Released && e.mono > at)
                            .then_some(id)
                    });
                (released, moot)
            };
            if released.is_some() || moot || Instant::now() >= heal_bound {
                break (released, moot);
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // From here the waiter's own connections to that broker are refused: it cannot rejoin
        // this join phase itself, and learns of it late. The release is reported just before
        // the LeaveGroup; the other members rejoin within a heartbeat interval of it, so the join
        // phase is under way a little after, and the stalled JoinGroup is let out then.
        let mut stalled = None;
        self.pool
            .slot_proxies(&slot, |p| stalled = p.stalled_join());
        let (coordinator, before) = stalled.unwrap_or((self.cluster().coordinator(lock), 0));
        self.pool
            .slot_proxies(&slot, |p| p.set(coordinator, Fault::StallAndReset(before)));
        std::thread::sleep(super::HEARTBEAT / 3);
        self.pool
            .slot_proxies(&slot, |p| p.set(coordinator, Fault::ResetFrom(before)));
        std::thread::sleep(plan.delay);
        self.pool.slot_proxies(&slot, |p| {
            p.set_all(Fault::Clear);
            p.cut_after_sync();
        });
        let cut_bound = Instant::now() + 3 * SESSION;
        let mut cut = false;
        while Instant::now() < cut_bound && !cut {
            self.pool
                .slot_proxies(&slot, |p| cut = !p.cut_after_sync_pending());
            std::thread::sleep(Duration::from_millis(20));
        }
        if cut {
            std::thread::sleep(SESSION + Duration::from_secs(1));
        }
        self.pool.slot_proxies(&slot, |p| p.set_all(Fault::Clear));
        let mut answer = None;
        self.pool
            .slot_proxies(&slot, |p| answer = p.stalled_join_answer());
        let answer = answer.unwrap_or_else(|| "no answer seen".to_owned());
        let when = match (released, moot) {
            (Some(h), _) => format!("as {h} released"),
            (None, true) => format!("after {slot} acquired or exited (moot)"),
            (None, false) => "with no release seen".to_owned(),
        };
        (
            Some(w.clone()),
            format!(
                "{w}: JoinGroup stalled, delivered {when} to node {coordinator} (answered: \
                 {answer}); {}",
                if cut {
                    "cut after its next SyncGroup answer"
                } else {
                    "no SyncGroup answer to cut after"
                }
            ),
        )
    }

    /// The first running contender of slot `slot` to hold `lock` from now, waiting up to
    /// [`HOLDER_BOUND`].
    fn slot_holder(&self, lock: &str, slot: &str) -> Option<String> {
        let deadline = Instant::now() + HOLDER_BOUND;
        let prefix = format!("{slot}.");
        loop {
            if let Some(id) = self
                .checker
                .holders(lock)
                .into_iter()
                .find(|id| id.starts_with(&prefix) && self.pool.role_of(id).is_some())
            {
                return Some(id);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The hold-heartbeat nemesis: while the `reads` contender holds, every Heartbeat answer
    /// the brokers send it is held for the episode's length (and what is queued behind it on
    /// its connection with it), as Apache holds a Heartbeat while the group's offsets partition
    /// has uncommitted writes; its client's describe, history and observer, with a 1 s request
    /// timeout, queue behind those answers and give up. Whatever gives up, the connection a
    /// held Heartbeat is on must stay open until its answer comes: a held answer the client
    /// closed its connection on ([`super::kproxy::ProxyStats::heartbeats_abandoned`]) fails the
    /// run.
    fn hold_heartbeat(&self, plan: &Episode, lock: &str) -> (Option<String>, String) {
        let Some(id) = self.slot_holder(lock, READS) else {
            return (None, String::new());
        };
        let counts = |pool: &Pool| {
            pool.slot_stats(READS, |s| {
                (
                    s.heartbeats_held.load(std::sync::atomic::Ordering::SeqCst),
                    s.heartbeats_abandoned
                        .load(std::sync::atomic::Ordering::SeqCst),
                    s.connections.load(std::sync::atomic::Ordering::SeqCst),
                )
            })
            .unwrap_or_default()
        };
        let before = counts(&self.pool);
        let from = mono_ns();
        self.pool
            .slot_proxies(READS, |p| p.hold_heartbeats(plan.length));
        // The held answers go out at the end; a connection closed under one shows by then.
        std::thread::sleep(plan.length + Duration::from_secs(1));
        let after = counts(&self.pool);
        let (held, abandoned, opened) =
            (after.0 - before.0, after.1 - before.1, after.2 - before.2);
        let ended = {
            let log = self.checker.lock();
            log.events
                .iter()
                .filter(|e| e.id == id && e.mono >= from)
                .find(|e| matches!(e.kind, Ev::Lost | Ev::Released))
                .map(|e| e.kind.name())
        };
        (
            Some(id.clone()),
            format!(
                "{id}: {held} Heartbeat answer(s) held, {abandoned} abandoned by the client, \
                 {opened} connection(s) opened meanwhile; its hold {}",
                ended.map_or("went on".to_owned(), |k| format!("ended: {k}"))
            ),
        )
    }

    /// The noexec-loss nemesis: the supervisor of the `kafka-lock run` whose command cannot
    /// exec is stopped the moment its acquisition is seen, and that kafka-lock is cut
    /// off from every broker (black-holed both ways), so its lease runs out with the command's
    /// start pending; past the session timeout the supervisor is continued and the cut healed:
    /// the supervisor then fails the exec and ends while kafka-lock already knows of the loss.
    /// The hold must be reported ended once.
    fn noexec_loss(&self, lock: &str) -> (Option<String>, String) {
        self.pool.stop_after_spawn(NOEXEC);
        let deadline = Instant::now() + HOLDER_BOUND;
        let sprung = loop {
            if let Some(s) = self.pool.sprung(NOEXEC) {
                break Some(s);
            }
            if Instant::now() >= deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let Some((pid, id, at)) = sprung else {
            self.pool.disarm(NOEXEC);
            return (None, String::new());
        };
        self.pool.watch_stopped(pid);
        // No renewal from here: the loss comes at the lease end, while the supervisor waits.
        self.pool.slot_proxies(NOEXEC, |p| {
            p.set_all(Fault::Blackhole(super::kproxy::Dir::Both))
        });
        std::thread::sleep(SESSION + Duration::from_secs(1));
        self.pool.cont(pid);
        self.pool.slot_proxies(NOEXEC, |p| p.set_all(Fault::Clear));
        // Its end reports, once it has handled what waited.
        std::thread::sleep(Duration::from_secs(2));
        let said: Vec<&str> = {
            let log = self.checker.lock();
            log.events
                .iter()
                .filter(|e| e.id == id && e.mono >= at && checker::base(&e.lock) == lock)
                .map(|e| e.kind.name())
                .collect()
        };
        (
            Some(id.clone()),
            format!(
                "{id}: its supervisor stopped at the acquisition and kafka-lock cut off, both \
                 undone after the session timeout + 1 s; it then reported: {}",
                if said.is_empty() {
                    "nothing".to_owned()
                } else {
                    said.join(", ")
                }
            ),
        )
    }

    /// The handover-move nemesis: the coordinator broker killed or shut down (SIGTERM) the
    /// moment a kafka-lock holder of `lock` reports its release (reported just before its
    /// LeaveGroup), so the waiters' rejoin and the next generation happen across a coordinator
    /// move; the node is restarted after the episode's length. With `ledger`
    /// (handover-ledger-move) the node is the ledger partition's leader instead, so the
    /// RELEASED append, the waiters' long polls, the next ACQUIRED append and its checkpoint
    /// read meet a leader that moved (NOT_LEADER_OR_FOLLOWER after a controlled shutdown,
    /// connections refused after a kill).
    fn handover_move(&self, plan: &Episode, lock: &str, ledger: bool) -> (Option<String>, String) {
        // handover-ledger-move: the ledger partition's leader rather than the coordinator.
        let locate = || {
            if ledger {
                let Flavour::Ledger(topic) = &self.ledger else {
                    return None;
                };
                self.rt
                    .block_on(leader_of(&self.live_nodes(), topic))
                    .map(|(n, _)| n)
            } else {
                Some(self.cluster().coordinator(lock))
            }
        };
        let Some(mut node) = locate() else {
            return (None, String::new());
        };
        // A node restarted by an earlier episode may have taken the group (or the ledger's
        // leadership) back since.
        let Some((id, released)) = self.next_release(lock, || node = locate().unwrap_or(node))
        else {
            return (None, String::new());
        };
        let term = plan.broker_fault == Kind::BrokerTerm;
        let coordinator_too = ledger && self.cluster().coordinator(lock) == node;
        let struck = mono_ns();
        let how = if term {
            let took = self.cluster().terminate(node, Duration::from_secs(120));
            format!(
                "shut down (controlled shutdown took {:.1} s)",
                took.as_secs_f64()
            )
        } else {
            self.cluster().kill(node);
            "killed".to_owned()
        };
        std::thread::sleep(plan.length);
        self.cluster().restart(node);
        let now = self.cluster().coordinator(lock);
        (
            Some(id.clone()),
            format!(
                "{id} released; {}node {node} {how} {:.0} ms later, restarted after {:?}; {}; \
                 coordinator now node {now}{}",
                match (ledger, coordinator_too) {
                    (true, true) => "ledger leader and coordinator ",
                    (true, false) => "ledger leader ",
                    _ => "",
                },
                (struck - released) as f64 / 1e6,
                plan.length,
                match self.next_hold(lock, released) {
                    Some((who, at, token)) => format!(
                        "next hold {who} {:.1} s after the release (token {})",
                        (at - released) as f64 / 1e9,
                        token.map_or("-".to_owned(), |t| t.to_string())
                    ),
                    None => "no hold yet at the restart".to_owned(),
                },
                match (ledger, locate()) {
                    (true, Some(n)) => format!(", ledger leader now node {n}"),
                    _ => String::new(),
                }
            ),
        )
    }

    /// The coord-move-at-grant nemesis, aimed at the one place a checkpoint read without
    /// `require_stable` can answer older than an acknowledged checkpoint: a coordinator that
    /// has just taken over with a high watermark short of it. The next OffsetCommit answer any
    /// contender of `lock` gets is held at its proxy (the broker has committed the checkpoint:
    /// Apache answers a commit only once its high watermark passed it). Then the committed
    /// state is read at the old coordinator, the replica of the group's `__consumer_offsets`
    /// partition that is not next in line is stopped (SIGSTOP, in the ISR, not fenced: the new
    /// leader's high watermark cannot pass what it last heard from the old one), and the old
    /// coordinator is shut down (SIGTERM, a controlled shutdown, so the leadership moves at once
    /// while the other two nodes keep a controller quorum, and before the follower's parked
    /// Fetch, DelayedFetch up to `replica.fetch.wait.max.ms`, can bring it the new high
    /// watermark). Plain OffsetFetches (no `require_stable`) are sent to the new leader from
    /// then on, every 5 ms; the held answer is let out at the first one answered; the third
    /// node is resumed `plan.length` later. The note says what the plain reads answered, next
    /// to the committed state read before: the window the grant read must not fall in. The
    /// checker's checkpoint continuity judges the contenders' own reads.
    fn coord_move_at_grant(&self, plan: &Episode, lock: &str) -> (Option<String>, String) {
        let contenders = self.pool.proxied(lock);
        for id in &contenders {
            self.pool.proxies_of(id, |p| p.hold_next_commit(true));
        }
        let deadline = Instant::now() + HOLDER_BOUND;
        let held = loop {
            let mut found = None;
            for id in &contenders {
                self.pool.proxies_of(id, |p| {
                    if let Some(n) = p.commit_held() {
                        found = Some((id.clone(), n));
                    }
                });
                if found.is_some() {
                    break;
                }
            }
            if found.is_some() || Instant::now() >= deadline {
                break found;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        for id in &contenders {
            self.pool.proxies_of(id, |p| p.hold_next_commit(false));
        }
        let Some((id, old)) = held else {
            return (None, String::new());
        };
        // Another holder (permits, or the many-locks contenders) may have tripped its trigger
        // before it was disarmed: only the first answer held is the episode's.
        for other in contenders.iter().filter(|o| **o != id) {
            self.pool.proxies_of(other, |p| {
                if let Some(n) = p.commit_held() {
                    p.set(n, Fault::Clear);
                }
            });
        }
        let let_out = || {
            self.pool.proxies_of(&id, |p| p.set(old, Fault::Clear));
        };
        let nodes: Vec<(i32, String)> = self
            .cluster()
            .nodes()
            .iter()
            .filter(|n| n.is_live())
            .map(|n| (n.id(), n.addr()))
            .collect();
        let addr = |n: i32| {
            nodes
                .iter()
                .find(|(id, _)| *id == n)
                .map(|(_, a)| a.clone())
        };
        let Some(old_addr) = addr(old) else {
            let_out();
            return (Some(id), format!("node {old} not running: nothing done"));
        };
        let before = self.rt.block_on(plain_offsets(old_addr, lock.to_owned()));
        let partition = offsets_partition(lock, self.cluster().offsets_partitions());
        let replicas = self.rt.block_on(replicas_of(
            nodes.iter().map(|(_, a)| a.clone()).collect(),
            "__consumer_offsets",
            partition,
        ));
        // The controller elects the first replica in assignment order that is in the ISR and
        // may lead (KRaft PartitionChangeBuilder): that one is next; the other one is stopped.
        let others: Vec<i32> = replicas
            .iter()
            .flatten()
            .copied()
            .filter(|&n| n != old)
            .collect();
        let (next, third) = (others.first().copied(), others.get(1).copied());
        if let Some(t) = third {
            self.cluster().pause(t);
        }
        self.cluster().begin_terminate(old);
        let struck = Instant::now();
        let struck_mono = mono_ns();
        let mut resumed_mono = None;
        let ms = |d: Duration| d.as_millis();
        // Every distinct answer of the plain reads at `next`, with when it first came.
        let mut seen: Vec<(u128, String)> = Vec::new();
        let mut resumed_at = None;
        let mut stop_until = None;
        let bound = struck + Duration::from_secs(20);
        while let Some(n) = next {
            let now = Instant::now();
            if now >= bound {
                break;
            }
            if let Some(a) = addr(n) {
                if let Ok(v) = self.rt.block_on(plain_offsets(a, lock.to_owned())) {
                    if seen.is_empty() {
                        let_out();
                        stop_until = Some(now + plan.length);
                    }
                    if seen.last().is_none_or(|(_, last)| *last != v) {
                        seen.push((ms(struck.elapsed()), v));
                    }
                }
            }
            if resumed_at.is_none() && stop_until.is_some_and(|u| Instant::now() >= u) {
                if let Some(t) = third {
                    self.cluster().resume(t);
                }
                resumed_at = Some(ms(struck.elapsed()));
                resumed_mono = Some(mono_ns());
                // Watch the plain reads catch up for a second after the resume.
                stop_until = Some(Instant::now() + Duration::from_secs(1));
            } else if resumed_at.is_some() && stop_until.is_some_and(|u| Instant::now() >= u) {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let_out();
        if resumed_at.is_none() {
            if let Some(t) = third {
                self.cluster().resume(t);
            }
        }
        self.cluster().terminate(old, Duration::from_secs(120));
        self.cluster().restart(old);
        let before = before.unwrap_or_else(|e| format!("unread ({e})"));
        let stale = seen.first().is_some_and(|(_, v)| *v != before);
        // What the contenders did while the third node was stopped: a grant there would have
        // read in the window the plain reads show.
        let (grants, reads) = {
            let until = resumed_mono.unwrap_or_else(mono_ns);
            let log = self.checker.lock();
            let during = |k: Ev| {
                log.events
                    .iter()
                    .filter(|e| {
                        e.kind == k
                            && e.mono > struck_mono
                            && e.mono < until
                            && checker::base(&e.lock) == lock
                    })
                    .count()
            };
            (during(Ev::Acquired), during(Ev::CkRead))
        };
        (
            Some(id.clone()),
            format!(
                "{id}: OffsetCommit answer held; node {old} read {before}, shut down; node {} \
                 next, node {} stopped {:?}{}, meanwhile {grants} grant(s) and {reads} grant \
                 read(s); plain reads at node {}: {}{}",
                next.map_or("-".to_owned(), |n| n.to_string()),
                third.map_or("-".to_owned(), |n| n.to_string()),
                plan.length,
                resumed_at.map_or(String::new(), |t| format!(" (resumed at {t} ms)")),
                next.map_or("-".to_owned(), |n| n.to_string()),
                if seen.is_empty() {
                    "none answered".to_owned()
                } else {
                    seen.iter()
                        .map(|(t, v)| format!("{t} ms: {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
                if stale {
                    "; STALE PLAIN READ (older than the held commit)"
                } else {
                    ""
                }
            ),
        )
    }

    /// The cut-at-checkpoint nemesis: the proxies of every `kafka-lock run` contender of the
    /// native lock are armed to cut it off at its next OffsetCommit, the checkpoint its job left,
    /// which kafka-lock stores after the job exits 0, inside the lease. The first to fire has
    /// that broker's proxy black-holed both ways before the request is forwarded, for the
    /// session timeout plus `plan.length`: no renewal gets through, the broker drops the member
    /// and another contender holds, and the commit reaches the broker only after the heal, which
    /// refuses it. The hold must be reported ended at its lease end (`lost`, with it); one
    /// reported ended by a `failed` after the heal, the commit's refusal, is a hold claimed past
    /// its lease, and the checker counts it against the holds begun meanwhile. The heal goes to
    /// the slot's proxies, whoever runs there by then: a kafka-lock that reported its loss at
    /// the lease end may have exited and been replaced during the cut.
    fn cut_at_checkpoint(&self, plan: &Episode, lock: &str) -> (Option<String>, String) {
        if !self.pool.env().checkpoints {
            return (None, "no checkpoints in this run".into());
        }
        let slot = |id: &str| id.rsplit_once('.').map_or(id, |(s, _)| s).to_owned();
        let slots: Vec<String> = self
            .pool
            .proxied(lock)
            .into_iter()
            .filter(|id| self.pool.role_of(id) == Some(Role::Cli))
            .map(|id| slot(&id))
            .collect();
        for s in &slots {
            self.pool.slot_proxies(s, |p| p.cut_at_next_commit(true));
        }
        let fired = |s: &str| {
            let mut node = None;
            self.pool.slot_proxies(s, |p| node = p.commit_held());
            node
        };
        let deadline = Instant::now() + HOLDER_BOUND;
        let cut = loop {
            let found = slots.iter().find_map(|s| fired(s).map(|n| (s.clone(), n)));
            if found.is_some() || Instant::now() >= deadline {
                break found;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let cut_at = mono_ns();
        for s in &slots {
            self.pool.slot_proxies(s, |p| p.cut_at_next_commit(false));
        }
        // Another may have fired before it was disarmed: only the first cut is the episode's.
        for other in slots
            .iter()
            .filter(|s| cut.as_ref().is_none_or(|(c, _)| c != *s))
        {
            if let Some(n) = fired(other) {
                self.pool.slot_proxies(other, |p| p.set(n, Fault::Clear));
            }
        }
        let Some((slot, node)) = cut else {
            return (None, String::new());
        };
        // The contender whose commit was cut: the slot's holder by the checker's log (not
        // waited for: the cut's length runs from now).
        let prefix = format!("{slot}.");
        let id = self
            .checker
            .holders(lock)
            .into_iter()
            .find(|id| id.starts_with(&prefix));
        std::thread::sleep(SESSION + plan.length);
        self.pool.slot_proxies(&slot, |p| p.set(node, Fault::Clear));
        let healed = mono_ns();
        let Some(id) = id else {
            return (
                Some(slot.clone()),
                format!("{slot}: OffsetCommit cut to node {node}, its holder not in the log"),
            );
        };
        // How the hold was said to end, waited for a while after the heal (a report that never
        // comes leaves the hold open to the end of the run, which the checker judges too).
        let bound = Instant::now() + Duration::from_secs(30);
        let end = loop {
            let seen = {
                let log = self.checker.lock();
                log.events
                    .iter()
                    .find(|e| e.id == id && e.kind == Ev::Lost && e.mono > cut_at - 1_000_000_000)
                    .map(|e| (e.mono, e.lease_end))
            };
            if seen.is_some() || Instant::now() >= bound {
                break seen;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let others = {
            let log = self.checker.lock();
            log.events
                .iter()
                .filter(|x| {
                    x.kind == Ev::Acquired
                        && x.mono > cut_at
                        && x.mono < healed
                        && x.id != id
                        && checker::base(&x.lock) == lock
                })
                .count()
        };
        let s = |ns: i64| ns as f64 / 1e9;
        let said = match end {
            Some((at, Some(lease_end))) => format!(
                "lost reported {:+.1} s from the cut ({:+.1} s from the heal), its lease end \
                 {:+.1} s",
                s(at - cut_at),
                s(at - healed),
                s(lease_end - cut_at)
            ),
            Some((at, None)) => format!(
                "its end reported by `failed` {:+.1} s from the cut, {:+.1} s from the heal, \
                 with no lease end: a HOLD CLAIMED PAST ITS LEASE",
                s(at - cut_at),
                s(at - healed)
            ),
            None => "no end reported within 30 s of the heal".into(),
        };
        (
            Some(id.clone()),
            format!(
                "{id}: its checkpoint's OffsetCommit cut to node {node} both ways for {:.1} s; \
                 {said}; {others} acquisition(s) by others during the cut",
                s(healed - cut_at)
            ),
        )
    }

    /// The release of the native lock a nemesis times itself on: the first `released` of a
    /// kafka-lock contender reported from now, polled every 2 ms; `relocate` runs every 2 s
    /// meanwhile. None when nobody releases within the holder bound.
    fn next_release(&self, lock: &str, relocate: impl FnMut()) -> Option<(String, i64)> {
        self.next_report(lock, Ev::Released, relocate)
    }

    /// As [`Self::next_release`], for the first report of `kind`.
    fn next_report(
        &self,
        lock: &str,
        kind: Ev,
        mut relocate: impl FnMut(),
    ) -> Option<(String, i64)> {
        let deadline = Instant::now() + HOLDER_BOUND;
        let mut looked_up = Instant::now();
        let from = mono_ns();
        loop {
            let seen = {
                let log = self.checker.lock();
                log.events
                    .iter()
                    .rev()
                    .take_while(|e| e.mono > from - 10_000_000_000)
                    .find(|e| {
                        e.kind == kind
                            && e.mono > from
                            && judged(&e.id)
                            && checker::base(&e.lock) == lock
                    })
                    .map(|e| (e.id.clone(), e.mono))
            };
            if seen.is_some() || Instant::now() >= deadline {
                return seen;
            }
            if looked_up.elapsed() > Duration::from_secs(2) {
                relocate();
                looked_up = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The first acquisition of `lock` by a kafka-lock contender after `released`: who, when,
    /// with which token.
    fn next_hold(&self, lock: &str, released: i64) -> Option<(String, i64, Option<i64>)> {
        let log = self.checker.lock();
        log.events
            .iter()
            .filter(|e| {
                e.kind == Ev::Acquired
                    && e.mono > released
                    && judged(&e.id)
                    && checker::base(&e.lock) == lock
            })
            .min_by_key(|e| e.mono)
            .map(|e| (e.id.clone(), e.mono, e.token))
    }

    /// The slow-ledger-check nemesis: the moment a holder of the native lock reports its
    /// release, every single-lock contender of it with proxies has the answers to its
    /// DescribeConfigs requests naming the ledger topic held for `plan.length` (those read
    /// within it, each until its end; [`super::kproxy`] says why not the check's Metadata). The releaser starts its next acquisition at once, whose check of the
    /// ledger topic meets the hold; so does any CLI run or respawn meanwhile. With
    /// `plan.signal`, the first contender seen with a held answer is sent that signal, mid-check.
    /// The checker: no JoinGroup without a member id (an acquisition's first) reaches a proxy
    /// while an answer it holds is not let out ([`super::kproxy::ProxyStats::joins_before_check`],
    /// judged over the run); a contender joins only through its check.
    fn slow_ledger_check(&self, plan: &Episode, lock: &str) -> (Option<String>, String) {
        use std::sync::atomic::Ordering::SeqCst;
        let Flavour::Ledger(topic) = self.ledger.clone() else {
            return (None, String::new());
        };
        let Some((id, released)) = self.next_release(lock, || {}) else {
            return (None, String::new());
        };
        // By slot: a CLI slot's id changes with each run, and the hold is for the next runs.
        // A many-locks contender takes locks without a ledger through the same client: their
        // JoinGroups would not wait for this lock's check.
        let slot = |c: &str| c.split('.').next().unwrap_or(c).to_owned();
        let slots: Vec<String> = self
            .pool
            .proxied(lock)
            .iter()
            .filter(|c| self.pool.role_of(c) != Some(Role::Many))
            .map(|c| slot(c))
            .collect();
        let count = |f: fn(&super::kproxy::ProxyStats) -> u64| {
            let mut n = 0;
            self.pool.all_proxies(|p| n += f(p.stats()));
            n
        };
        let held_before = count(|s| s.checks_held.load(SeqCst));
        let early_before = count(|s| s.joins_before_check.load(SeqCst));
        for name in &slots {
            self.pool
                .slot_proxies(name, |p| p.hold_ledger_checks(&topic, plan.length));
        }
        let from = Instant::now();
        let until = from + plan.length;
        let mut signalled = String::new();
        if let Some(sig) = plan.signal {
            let name = if sig == libc::SIGINT {
                "SIGINT"
            } else {
                "SIGKILL"
            };
            let pending = |s: &String| {
                let mut n = 0;
                self.pool
                    .slot_proxies(s, |p| n = p.stats().checks_pending.load(SeqCst));
                n > 0
            };
            signalled = format!("; nobody seen mid-check for the {name}");
            while Instant::now() < until {
                let running = slots
                    .iter()
                    .filter(|s| pending(s))
                    .find_map(|s| self.pool.proxied(lock).into_iter().find(|c| slot(c) == *s));
                if let Some(c) = running {
                    signalled = if self.pool.signal_recorded(&c, sig) {
                        format!(
                            "; {c} sent {name} mid-check {:.2} s into the hold",
                            from.elapsed().as_secs_f64()
                        )
                    } else {
                        format!("; {c} gone before its {name}")
                    };
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        // Every answer held is let out at the window's end.
        std::thread::sleep(
            until.saturating_duration_since(Instant::now()) + Duration::from_millis(500),
        );
        let held = count(|s| s.checks_held.load(SeqCst)) - held_before;
        let early = count(|s| s.joins_before_check.load(SeqCst)) - early_before;
        (
            Some(id.clone()),
            format!(
                "{id} released; the ledger topic checks of {} slots ({}) held {:?}: {held} \
                 held, {early} JoinGroups before a check's answer{signalled}; {}",
                slots.len(),
                slots.join(", "),
                plan.length,
                match self.next_hold(lock, released) {
                    Some((who, at, token)) => format!(
                        "next hold {who} {:.2} s after the release (token {})",
                        (at - released) as f64 / 1e9,
                        token.map_or("-".to_owned(), |t| t.to_string())
                    ),
                    None => "no hold yet".to_owned(),
                }
            ),
        )
    }

    /// The abandoned-polls nemesis: the moment a holder of the native lock reports its release,
    /// every other proxied contender of it (the waiters) has its Fetch answers held for
    /// `plan.length` (`pending`; the long poll that would carry the RELEASED record comes
    /// after the poll's wait, or never, if the client gives it up first), or its connections
    /// open then to the ledger leader black-holed both ways for as long (new ones pass). A waiter then learns of the release
    /// only from its Heartbeats (REBALANCE_IN_PROGRESS once the LeaveGroup has landed). The
    /// checker judges the holds as always.
    fn abandoned_polls(&self, plan: &Episode, lock: &str) -> (Option<String>, String) {
        let Flavour::Ledger(topic) = self.ledger.clone() else {
            return (None, String::new());
        };
        let Some((mut leader, _)) = self.rt.block_on(leader_of(&self.live_nodes(), &topic)) else {
            return (None, String::new());
        };
        let Some((id, released)) = self.next_release(lock, || {
            if let Some((n, _)) = self.rt.block_on(leader_of(&self.live_nodes(), &topic)) {
                leader = n;
            }
        }) else {
            return (None, String::new());
        };
        let waiters: Vec<String> = self
            .pool
            .proxied(lock)
            .into_iter()
            .filter(|w| w != &id)
            .collect();
        // Over every proxy set: a CLI slot's id changes with each run, and only these hold.
        let held = || {
            let mut n = 0;
            self.pool.all_proxies(|p| {
                n += p
                    .stats()
                    .fetches_held
                    .load(std::sync::atomic::Ordering::SeqCst)
            });
            n
        };
        let before = held();
        for w in &waiters {
            if plan.pending {
                self.pool.proxies_of(w, |p| p.hold_fetches(plan.length));
            } else {
                // Only the connections open now, the long poll's among them: a black-hole of
                // every link would hold the next holder's ACQUIRED append too (cut-ledger).
                self.pool.proxies_of(w, |p| p.stall(leader));
            }
        }
        let armed = mono_ns();
        std::thread::sleep(plan.length);
        if !plan.pending {
            for w in &waiters {
                self.pool.proxies_of(w, |p| p.set(leader, Fault::Clear));
            }
        }
        let healed = mono_ns();
        let what = if plan.pending {
            format!(
                "Fetch answers held ({} held)",
                held().saturating_sub(before)
            )
        } else {
            format!("connections to ledger leader node {leader} black-holed")
        };
        (
            Some(id.clone()),
            format!(
                "{id} released; {} waiters ({}) had their {what} {:.1} ms later, for {:?}; {}",
                waiters.len(),
                waiters.join(", "),
                (armed - released) as f64 / 1e6,
                plan.length,
                match self.next_hold(lock, released) {
                    Some((who, at, token)) => format!(
                        "next hold {who} {:.2} s after the release ({} the heal; token {})",
                        (at - released) as f64 / 1e9,
                        if at < healed { "before" } else { "after" },
                        token.map_or("-".to_owned(), |t| t.to_string())
                    ),
                    None => "no hold yet at the heal".to_owned(),
                }
            ),
        )
    }

    /// The runtime-stall nemesis: the `stall` contender's only runtime thread is blocked while
    /// it holds, for the session timeout plus the episode's length, so nothing of the library
    /// runs: no renewal, no timer. On waking it asks `is_held()` at once (a `stalled` event)
    /// and writes only if told it holds. An answer of "held" at an instant after the lease end
    /// it read before the block fails the run: nothing renewed that lease meanwhile.
    fn runtime_stall(&self, plan: &Episode, lock: &str) -> (Option<String>, String) {
        if self.slot_holder(lock, STALL).is_none() {
            return (None, String::new());
        }
        let block = SESSION + plan.length;
        let file = pool::stall_file(&self.pool.env().logs, STALL);
        let partial = file.with_extension("partial");
        let from = mono_ns();
        std::fs::write(&partial, block.as_millis().to_string()).expect("write the stall request");
        std::fs::rename(&partial, &file).expect("place the stall request");
        let prefix = format!("{STALL}.");
        // A hold that ended before the contender read the request blocks the next one.
        let bound = Instant::now() + block + HOLDER_BOUND;
        let stalled = loop {
            let seen = {
                let log = self.checker.lock();
                log.events
                    .iter()
                    .rev()
                    .find(|e| e.kind == Ev::Stalled && e.mono > from && e.id.starts_with(&prefix))
                    .cloned()
            };
            if seen.is_some() || Instant::now() >= bound {
                break seen;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let Some(e) = stalled else {
            let _ = std::fs::remove_file(&file);
            return (None, String::new());
        };
        let held = e.token == Some(1);
        let lease_end = e.lease_end.unwrap_or(i64::MAX);
        let past = (e.mono - lease_end) as f64 / 1e9;
        if held && e.mono >= lease_end {
            self.failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(format!(
                    "runtime-stall: {} was told it still held {past:.1} s after the lease end it \
                     read before its runtime was blocked {block:?}",
                    e.id
                ));
        }
        // Give the loss (or the write) a moment to be reported, for the note.
        std::thread::sleep(Duration::from_secs(2));
        let (others, writes) = {
            let log = self.checker.lock();
            let others = log
                .events
                .iter()
                .filter(|x| {
                    x.kind == Ev::Acquired
                        && x.mono > from
                        && x.mono < e.mono
                        && x.id != e.id
                        && checker::base(&x.lock) == lock
                })
                .count();
            let writes: Vec<&str> = log
                .writes
                .iter()
                .filter(|w| w.id == e.id && w.sent >= e.mono)
                .take(1)
                .map(|w| if w.accepted { "accepted" } else { "fenced off" })
                .collect();
            (others, writes.join(""))
        };
        (
            Some(e.id.clone()),
            format!(
                "{}: runtime blocked {:.1} s while holding; is_held() then {} ({past:+.1} s from \
                 the lease end read before the block); {others} acquisition(s) by others \
                 meanwhile; {}",
                e.id,
                block.as_secs_f64(),
                if held { "TRUE" } else { "false" },
                if writes.is_empty() {
                    "no write after the block".to_owned()
                } else {
                    format!("its write after the block {writes}")
                }
            ),
        )
    }

    /// The ledger-forger nemesis: while a kafka-lock contender holds the native lock, a
    /// producer in this process appends, every 300 ms for the episode's length, records under
    /// the lock's key that name the current hold (its token, its member id) and its generation
    /// or the next: RELEASED, LOST or ACQUIRED, drawn each time. Anyone who can write to the
    /// ledger topic can do this. The waiters that read a RELEASED or LOST naming their own
    /// generation rejoin at once (src/ledger/mod.rs, "Waiters long-poll"): a rebalance the
    /// holder did not cause. The checker judges every hold as always.
    fn ledger_forger(&self, plan: &Episode, lock: &str) -> (Option<String>, String) {
        use kafka_lock::internals::ledger::{LedgerRecord, RecordKind};
        let Flavour::Ledger(topic) = self.ledger.clone() else {
            return (None, String::new());
        };
        let Some(id) = self.holder(lock, HOLDER_BOUND) else {
            return (None, String::new());
        };
        let bootstrap = self.cluster().bootstrap();
        let nodes: Vec<String> = self
            .cluster()
            .nodes()
            .iter()
            .filter(|n| n.is_live())
            .map(|n| n.addr())
            .collect();
        let reader = options(&bootstrap, lock, &self.ledger, self.cfg.permits);
        // The newest hold the ledger shows, read again before each record (holds last 0.3 to
        // 3 s, the forging longer), other than those the forged ACQUIRED records make up.
        let mut ours = std::collections::BTreeSet::new();
        let newest = |ours: &std::collections::BTreeSet<i64>| {
            self.rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(10), reader.history())
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .and_then(|h| h.holds.into_iter().rev().find(|h| !ours.contains(&h.token)))
            })
        };
        let mut rng = Rng::new(plan.seed);
        let from = mono_ns();
        let until = Instant::now() + plan.length;
        let (mut forged, mut refused) = (BTreeMap::<&str, usize>::new(), 0);
        let mut named = std::collections::BTreeSet::new();
        while Instant::now() < until {
            let Some(hold) = newest(&ours) else {
                refused += 1;
                std::thread::sleep(Duration::from_millis(300));
                continue;
            };
            named.insert(hold.token);
            let generation = hold.generation + i32::from(rng.range(0, 1) == 1);
            let (name, kind, of) = match rng.range(0, 2) {
                0 => ("released", RecordKind::Released { held_ms: 1 }, hold.token),
                1 => (
                    "lost",
                    RecordKind::Lost {
                        held_ms: 1,
                        reason: "session".into(),
                        detail: "written by another producer".into(),
                    },
                    hold.token,
                ),
                _ => ("acquired", RecordKind::Acquired { lease_ms: 5000 }, -1),
            };
            let record = LedgerRecord {
                unix_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64),
                hold: of,
                generation,
                member_id: hold.member_id.clone(),
                label: None,
                host: None,
                pid: None,
                slot: hold.slot,
                kind,
            };
            match self
                .rt
                .block_on(append(&nodes, &topic, lock, record.encode()))
            {
                Some(offset) => {
                    *forged.entry(name).or_default() += 1;
                    if name == "acquired" {
                        ours.insert(offset);
                    }
                }
                None => refused += 1,
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        let to = mono_ns();
        // Against as long a time just before: the rebalances the records caused are the
        // difference, roughly (the contenders' own comings and goings cause some).
        let counts = |a: i64, b: i64| {
            let log = self.checker.lock();
            let inside = |e: &&Event| checker::base(&e.lock) == lock && e.mono > a && e.mono <= b;
            let n = |k: Ev| {
                log.events
                    .iter()
                    .filter(inside)
                    .filter(|e| e.kind == k)
                    .count()
            };
            (n(Ev::Acquired), n(Ev::Token))
        };
        let (acquired, changed) = counts(from, to);
        let (acquired_before, changed_before) = counts(2 * from - to, from);
        (
            Some(id.clone()),
            format!(
                "{id} held first; forged {} ({refused} not appended) naming {} hold(s) ({}); \
                 meanwhile {acquired} acquisition(s) and {changed} token change(s) of a hold \
                 (the same time before: {acquired_before} and {changed_before})",
                forged
                    .iter()
                    .map(|(k, n)| format!("{n} {k}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                named.len(),
                named
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    }

    /// The cut-ledger nemesis: the links of contenders of `lock` to the ledger partition's
    /// leader (on three nodes often not the coordinator, which every other cut aims at) reset
    /// or black-holed for `plan.length`. Either (`pending`) the next holder's, armed on every
    /// proxied contender that does not hold and set right after the SyncGroup answer that
    /// grants one of them, so its ACQUIRED append and checkpoint read meet the cut; or every
    /// waiter's, while they long-poll the ledger for a RELEASED record. The checker judges the
    /// holds as always.
    fn cut_ledger(&self, plan: &Episode, lock: &str) -> (Option<String>, String) {
        let Flavour::Ledger(topic) = self.ledger.clone() else {
            return (None, String::new());
        };
        let nodes = self.live_nodes();
        let Some((leader, _)) = self.rt.block_on(leader_of(&nodes, &topic)) else {
            return (None, String::new());
        };
        let fault = if plan.holder_fault == Kind::CutReset {
            Fault::Reset
        } else {
            Fault::Blackhole(plan.dir)
        };
        let coordinator = self.cluster().coordinator(lock);
        let also = if coordinator == leader {
            " (also the coordinator)"
        } else {
            ""
        };
        let holders = self.checker.holders(lock);
        let others: Vec<String> = self
            .pool
            .proxied(lock)
            .into_iter()
            .filter(|id| !holders.contains(id))
            .collect();
        if others.is_empty() {
            return (None, String::new());
        }
        let cut: Vec<String> = if plan.pending {
            for id in &others {
                self.pool
                    .proxies_of(id, |p| p.cut_when_granted(Some((leader, fault))));
            }
            let deadline = Instant::now() + HOLDER_BOUND;
            let fired = loop {
                let fired: Vec<String> = others
                    .iter()
                    .filter(|id| {
                        let mut f = false;
                        self.pool.proxies_of(id, |p| f = p.granted_cut_fired());
                        f
                    })
                    .cloned()
                    .collect();
                if !fired.is_empty() || Instant::now() >= deadline {
                    break fired;
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            for id in &others {
                self.pool.proxies_of(id, |p| p.cut_when_granted(None));
            }
            fired
        } else {
            for id in &others {
                self.pool.proxies_of(id, |p| p.set(leader, fault));
            }
            others
        };
        if cut.is_empty() {
            return (None, String::new());
        }
        std::thread::sleep(plan.length);
        for id in &cut {
            self.pool.proxies_of(id, |p| p.set(leader, Fault::Clear));
        }
        let who = if plan.pending {
            "granted, then cut"
        } else {
            "waiting, cut"
        };
        (
            Some(cut.join(",")),
            format!(
                "{} {who} from ledger leader node {leader}{also}",
                cut.join(", ")
            ),
        )
    }

    /// The lane-starvation nemesis: for `plan.length`, the holder of one of the many-locks
    /// contenders' locks (the native lock or one of theirs), drawn each round, is killed, then
    /// 0.5 to 2 s pass. Killing a many-locks process ends every hold it had, so the other one,
    /// whose client parks every waiting lock on its one lane, must acquire them all; the run
    /// fails if some lock is not acquired again within the recovery bound after the last kill.
    fn lane_starvation(&self, plan: &Episode, rng: &mut Rng) -> (Option<String>, String) {
        if self.extra.is_empty() {
            return (None, String::new());
        }
        let locks: Vec<String> = std::iter::once(self.native.clone())
            .chain(self.extra.iter().cloned())
            .collect();
        let until = Instant::now() + plan.length;
        let mut killed = Vec::new();
        while Instant::now() < until {
            let lock = rng.pick(&locks);
            if let Some(id) = self.holder(lock, Duration::from_secs(10)) {
                self.pool.kill(&id);
                killed.push(id);
            }
            std::thread::sleep(rng.millis(500, 2000));
        }
        if killed.is_empty() {
            return (None, String::new());
        }
        (
            Some(killed.join(",")),
            format!(
                "{} holder(s) killed: {} (one parking lane per many-locks client)",
                killed.len(),
                killed.join(", ")
            ),
        )
    }

    /// The slow-supervisor-start nemesis: the CLI contenders' kafka-locks start with the
    /// supervisor's start held back or failed ([`Pool::slow_starts`]), and in rounds until the
    /// episode's length has passed, one CLI contender is killed so that it starts again so,
    /// and then the lock's holder too, so that the lock is granted while that start is under
    /// way; 0.1 to 3 s later the new kafka-lock is SIGKILLed or stopped
    /// for the session timeout plus 0.5 to 2 s, its supervisor or job with it if there are any
    /// yet. The lock must be acquired again after it, and the checker judges every hold.
    fn slow_supervisor_start(
        &self,
        plan: &Episode,
        lock: &str,
        rng: &mut Rng,
    ) -> (Option<String>, String) {
        const CLI: [&str; 2] = ["cli1", "cli2"];
        let shim = self.slow_spawn_shim();
        for name in CLI {
            self.pool.slow_starts(name, Some(shim.clone()));
        }
        let until = Instant::now() + plan.length;
        let mut struck = Vec::new();
        let mut freed = 0;
        while Instant::now() < until {
            let name = *rng.pick(&CLI);
            let old = self.pool.running(name);
            if let Some(old) = &old {
                self.pool.kill(old);
            }
            // The slot starts again 0.1 to 0.6 s after its kafka-lock's exit is seen.
            let deadline = Instant::now() + Duration::from_secs(5);
            let id = loop {
                match self.pool.running(name) {
                    Some(id) if Some(&id) != old.as_ref() => break Some(id),
                    _ if Instant::now() >= deadline => break None,
                    _ => std::thread::sleep(Duration::from_millis(20)),
                }
            };
            let Some(id) = id else { continue };
            // The lock freed while the new kafka-lock's start is under way: it may be the one
            // granted.
            if let Some(holder) = self.checker.holders(lock).into_iter().next() {
                if self.pool.kill(&holder) {
                    freed += 1;
                }
            }
            std::thread::sleep(rng.millis(100, 3000));
            if self.pool.role_of(&id).is_none() {
                continue;
            }
            if plan.holder_fault == Kind::KillHolder {
                self.pool.kill(&id);
            } else {
                let pids = self.pool.pause(&id);
                std::thread::sleep(SESSION + rng.millis(500, 2000));
                self.pool.resume(&pids);
            }
            struck.push(id);
            std::thread::sleep(rng.millis(500, 2000));
        }
        let (mut slowed, mut failed) = (0, 0);
        for name in CLI {
            let (s, f) = self.pool.slow_starts(name, None);
            slowed += s;
            failed += f;
        }
        if struck.is_empty() {
            return (None, String::new());
        }
        (
            Some(struck.join(",")),
            format!(
                "{slowed} kafka-locks started slowed ({failed} told to fail), {} {} 0.1 to 3 s \
                 into their start, {freed} holder(s) killed to free the lock",
                struck.join(", "),
                if plan.holder_fault == Kind::KillHolder {
                    "killed"
                } else {
                    "stopped"
                }
            ),
        )
    }

    /// tests/it/slow_spawn.c built into the run's directory (once). Without a C compiler the
    /// run fails and says how to get one: a nemesis named with --kinds never skips.
    fn slow_spawn_shim(&self) -> PathBuf {
        crate::support::slow_spawn_shim(&self.out)
    }

    /// The addresses of the nodes that run.
    fn live_nodes(&self) -> Vec<String> {
        self.cluster()
            .nodes()
            .iter()
            .filter(|n| n.is_live())
            .map(|n| n.addr())
            .collect()
    }

    /// The target of a fault aimed at one contender: the holder (for a cut, one with proxies),
    /// or in a pair whose other half is at the holder, a proxied contender of the lock that does
    /// not hold it.
    fn aim(&self, plan: &Episode, lock: &str, rng: &mut Rng) -> Option<String> {
        if plan.waiter {
            let holders = self.checker.holders(lock);
            let waiters: Vec<String> = self
                .pool
                .proxied(lock)
                .into_iter()
                .filter(|id| !holders.contains(id))
                .collect();
            return (!waiters.is_empty()).then(|| rng.pick(&waiters).clone());
        }
        match plan.kind {
            Kind::PauseHolder | Kind::KillHolder => self.holder(lock, HOLDER_BOUND),
            _ => self.cut_target(lock, rng),
        }
    }

    /// The holder if it has proxies (the Java client connects directly), else any contender of
    /// the lock that has.
    fn cut_target(&self, lock: &str, rng: &mut Rng) -> Option<String> {
        self.holder(lock, HOLDER_BOUND)
            .filter(|id| self.pool.role_of(id) != Some(Role::Java))
            .or_else(|| {
                let ids = self.pool.proxied(lock);
                (!ids.is_empty()).then(|| rng.pick(&ids).clone())
            })
    }

    /// Kills, pauses, shuts down or slows broker `node` for `length` (a pause: the session
    /// timeout on top), then brings it back to full strength. Returns what was done.
    fn broker_fault(&self, kind: Kind, node: i32, length: Duration, delay: Duration) -> String {
        match kind {
            Kind::BrokerKill => {
                self.cluster().kill(node);
                std::thread::sleep(length);
                self.cluster().restart(node);
                format!("node {node} killed")
            }
            Kind::BrokerPause => {
                self.cluster().pause(node);
                std::thread::sleep(SESSION + length);
                self.cluster().resume(node);
                self.cluster().wait_for_full_isr();
                format!("node {node} paused")
            }
            Kind::BrokerTerm => {
                let took = self.cluster().terminate(node, Duration::from_secs(120));
                std::thread::sleep(length);
                self.cluster().restart(node);
                format!(
                    "node {node} shut down (controlled shutdown took {:.1} s)",
                    took.as_secs_f64()
                )
            }
            _ => {
                let fault = Fault::Delay(delay, super::kproxy::Dir::Both);
                self.pool.all_proxies(|p| p.set(node, fault));
                std::thread::sleep(length);
                self.pool.all_proxies(|p| p.set(node, Fault::Clear));
                format!("node {node} slowed for every proxied contender")
            }
        }
    }

    /// 20 to 50 contenders in this process join at once, each waiting 1 to 6 s; whoever gets
    /// the lock writes, holds 200 ms and releases. Returns how many acquired.
    fn herd(&self, n: usize, plan: &Episode, lock: &str, rng: &mut Rng) -> usize {
        let flavour = self.flavour_of(lock);
        let permits = if matches!(flavour, Flavour::Consumer(_)) {
            1
        } else {
            self.cfg.permits
        };
        let bootstrap = self.cluster().bootstrap();
        let members: Vec<(String, Duration)> = (0..plan.herd)
            .map(|i| (format!("herd{n}.{i}"), rng.millis(1000, 6000)))
            .collect();
        self.rt.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for (id, wait) in members {
                let (checker, lock, flavour, bootstrap) = (
                    self.checker.clone(),
                    lock.to_owned(),
                    flavour.clone(),
                    bootstrap.clone(),
                );
                tasks.spawn(async move {
                    herd_member(&checker, &bootstrap, &lock, &flavour, permits, &id, wait).await
                });
            }
            let mut acquired = 0;
            while let Some(r) = tasks.join_next().await {
                acquired += usize::from(r.unwrap_or(false));
            }
            acquired
        })
    }

    fn finish(self, started: i64, finished: i64, selfcheck: &SelfCheck, took: Duration) {
        let log = self.checker.lock();
        let events: Vec<_> = log
            .events
            .iter()
            .filter(|e| e.lock != selfcheck.lock)
            .cloned()
            .collect();
        let writes: Vec<_> = log
            .writes
            .iter()
            .filter(|w| w.lock != selfcheck.lock)
            .cloned()
            .collect();
        dump(&self.out, &log.events, &log.writes, &self.records);
        drop(log);
        let mut permits = std::collections::HashMap::new();
        if self.cfg.permits > 1 {
            permits.insert(self.native.clone(), self.cfg.permits);
        }
        let analysis = analyse_permits(&events, &writes, finished, &permits);
        let (rewritten, rewrite_failures, last_failure) = self.pool.rewrite_failures();
        let report = report(
            &self, &analysis, selfcheck, started, finished, took, rewritten,
        );
        std::fs::write(self.out.join("report.md"), &report).expect("write the report");
        println!("{report}");

        let mut failures = Vec::new();
        if analysis.unsafe_() {
            failures.push(format!(
                "SAFETY VIOLATED (seed {}):\n{}",
                self.cfg.seed,
                analysis.violations(10)
            ));
        }
        if !analysis.unmatched_ends.is_empty() {
            failures.push(format!(
                "{} end report(s) with no open hold (seed {}):\n{}",
                analysis.unmatched_ends.len(),
                self.cfg.seed,
                analysis.unmatched(10)
            ));
        }
        if !selfcheck.analysis.unsafe_() {
            failures.push(
                "the checker did not catch the contender that ignores its loss: the suite \
                 cannot fail, so its passing means nothing"
                    .into(),
            );
        }
        if self.cfg.ci {
            let kinds: Vec<Kind> = if self.cfg.kinds.is_empty() {
                Kind::ALL.into_iter().chain(Kind::CI_EXTRA).collect()
            } else {
                self.cfg.kinds.clone()
            };
            // Without checkpoints (turned off, or a semaphore) no CLI job leaves one to cut at.
            let checkpoints = self.pool.env().checkpoints;
            for kind in kinds
                .into_iter()
                .filter(|k| checkpoints || *k != Kind::CutAtCheckpoint)
            {
                let ran = self
                    .records
                    .iter()
                    .any(|r| r.plan.kind == kind && (r.target.is_some() || kind == Kind::Herd));
                if !ran {
                    failures.push(format!("{} never found a target", kind.name()));
                }
            }
        }
        failures.extend(
            self.failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned(),
        );
        // The stall contender writes after a block only when told it holds: that write
        // accepted while it did not hold by its own account went out on a wrong answer.
        let prefix = format!("{STALL}.");
        let after_block = |w: &checker::WriteRec| {
            events.iter().any(|e| {
                e.kind == Ev::Stalled
                    && e.id == w.id
                    && (e.mono..e.mono + 1_000_000_000).contains(&w.sent)
            })
        };
        for w in analysis
            .late
            .iter()
            .filter(|w| w.accepted && w.id.starts_with(&prefix) && after_block(w))
        {
            failures.push(format!(
                "runtime-stall: {} wrote with token {} outside its hold and the store accepted it",
                w.id, w.token
            ));
        }
        let early = self.pool.joins_before_check();
        if early > 0 {
            failures.push(format!(
                "{early} JoinGroup(s) without a member id reached a proxy while it held the answer \
                 to a DescribeConfigs request naming the ledger topic: an acquisition joined before its \
                 ledger topic's check passed (slow-ledger-check episodes in episodes.tsv)"
            ));
        }
        let abandoned = self.pool.heartbeats_abandoned();
        if abandoned > 0 {
            failures.push(format!(
                "{abandoned} held Heartbeat answer(s) abandoned: the client closed a connection \
                 under a Heartbeat the broker was still holding (hold-heartbeat episodes in \
                 episodes.tsv)"
            ));
        }
        if rewrite_failures > 0 {
            failures.push(format!(
                "{rewrite_failures} broker answers could not be rewritten (last: {last_failure:?}): \
                 contenders may have bypassed their proxies"
            ));
        }
        assert!(
            failures.is_empty(),
            "{}\nreplay: KAFKA_LOCK_FAULT_SEED={} KAFKA_LOCK_FAULT_EPISODES={}; events, writes \
             and every process's log in {}",
            failures.join("\n"),
            self.cfg.seed,
            self.cfg.episodes,
            self.out.display()
        );
    }
}

async fn herd_member(
    checker: &Checker,
    bootstrap: &str,
    lock: &str,
    flavour: &Flavour,
    permits: u16,
    id: &str,
    wait: Duration,
) -> bool {
    let slot = std::sync::Mutex::new(None::<u16>);
    let ev = |kind, token: Option<i64>, lease_end: Option<i64>| Event {
        lock: checker::key(lock, *slot.lock().unwrap()),
        id: id.to_owned(),
        kind,
        mono: mono_ns(),
        token,
        lease_end,
    };
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    checker.event(ev(Ev::Waiting, None, None));
    let guard = match options(bootstrap, lock, flavour, permits)
        .events(tx)
        .acquire(Some(wait))
        .await
    {
        Ok(g) => g,
        Err(_) => {
            checker.event(ev(Ev::GaveUp, None, None));
            return false;
        }
    };
    let token = guard.token().value();
    if permits > 1 {
        *slot.lock().unwrap() = Some(guard.permit());
    }
    let store = checker::key(lock, *slot.lock().unwrap());
    checker.event(ev(
        Ev::Acquired,
        Some(token),
        Some(to_mono(guard.lease_end())),
    ));
    if guard.is_held() {
        checker.write(&store, id, token, mono_ns()).ok();
    }
    let lost = tokio::select! {
        _ = guard.lost() => Some(mono_ns()),
        // A starved runtime can wake this after the lease ran out: that hold was lost.
        _ = tokio::time::sleep(Duration::from_millis(200)) => {
            (!guard.is_held()).then(mono_ns)
        }
    };
    if let Some(lost_at) = lost {
        let said = tokio::time::timeout(Duration::from_secs(2), async {
            while let Some(e) = events.recv().await {
                if let kafka_lock::LockEvent::Lost { lease_end, .. } = e {
                    return Some(to_mono(lease_end));
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        checker.event(Event {
            mono: lost_at,
            ..ev(Ev::Lost, None, said)
        });
    } else {
        checker.write(&store, id, token, mono_ns()).ok();
        checker.event(ev(Ev::Released, None, Some(to_mono(guard.lease_end()))));
        let _ = guard.release().await;
    }
    true
}

/// Figures for one group of episodes (or the time between them).
#[derive(Debug, Default, Clone)]
struct Figures {
    episodes: usize,
    recovered: usize,
    worst_recovery: Duration,
    acquisitions: usize,
    overlaps: usize,
    unjudged: usize,
    stale: usize,
    rejected: usize,
    late: usize,
    free_native: i64,
    free_consumer: i64,
}

fn figures_in(a: &Analysis, windows: &[(i64, i64)], native: &str, consumer: &str) -> Figures {
    let inside = |t: i64| windows.iter().any(|&(s, e)| s <= t && t < e);
    let mut f = Figures {
        acquisitions: a
            .holds
            .iter()
            .filter(|h| judged(&h.id) && inside(h.start))
            .count(),
        overlaps: a.judged_overlaps().filter(|o| inside(o.start())).count(),
        unjudged: a
            .overlaps
            .iter()
            .filter(|o| !o.judged && inside(o.start()))
            .count(),
        stale: a
            .stale_accepted
            .iter()
            .filter(|(w, _)| inside(w.decided))
            .count(),
        rejected: a.rejected.iter().filter(|w| inside(w.decided)).count(),
        late: a.late.iter().filter(|w| inside(w.decided)).count(),
        ..Figures::default()
    };
    for (lock, s, e) in &a.free_waiting {
        for &(ws, we) in windows {
            let len = (*e).min(we) - (*s).max(ws);
            if len > 0 {
                let slot = if lock == native {
                    &mut f.free_native
                } else if lock == consumer {
                    &mut f.free_consumer
                } else {
                    // The many-locks contenders' other locks: two contenders, often both away.
                    continue;
                };
                *slot = (*slot).max(len);
            }
        }
    }
    f
}

fn report(
    run: &Run,
    a: &Analysis,
    selfcheck: &SelfCheck,
    started: i64,
    finished: i64,
    took: Duration,
    rewritten: u64,
) -> String {
    let mut by_kind: BTreeMap<Kind, Vec<&Record>> = BTreeMap::new();
    for r in &run.records {
        by_kind.entry(r.plan.kind).or_default().push(r);
    }
    let ms = |ns: i64| format!("{:.1}", ns as f64 / 1e9);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Fault suite report\n\nMode {}, seed {}, {} episodes in {:.0} s; Apache Kafka 4.1.2, \
         three nodes; session timeout {:?}, heartbeat {:?}, lease margin: the library's and \
         the CLI's defaults.\n",
        if run.cfg.ci { "CI" } else { "long" },
        run.cfg.seed,
        run.records.len(),
        took.as_secs_f64(),
        SESSION,
        super::HEARTBEAT
    );
    let _ = writeln!(
        s,
        "| nemesis | episodes | recovered | worst recovery s | acquisitions | overlaps | stale \
         writes accepted | writes fenced off | late writes | longest free while waiting s \
         (native / consumer) | overlaps not judged (Java held first) |\n|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let mut row = |name: &str, f: &Figures| {
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} |",
            f.episodes,
            f.recovered,
            if f.episodes == 0 {
                "-".to_owned()
            } else {
                format!("{:.1}", f.worst_recovery.as_secs_f64())
            },
            f.acquisitions,
            f.overlaps,
            f.stale,
            f.rejected,
            f.late,
            ms(f.free_native),
            ms(f.free_consumer),
            f.unjudged
        );
    };
    for (kind, records) in &by_kind {
        let windows: Vec<(i64, i64)> = records.iter().map(|r| (r.start, r.end)).collect();
        let mut f = figures_in(a, &windows, &run.native, &run.consumer);
        f.episodes = records.len();
        f.recovered = records.iter().filter(|r| r.recovered.is_some()).count();
        f.worst_recovery = records
            .iter()
            .filter_map(|r| r.recovered)
            .max()
            .unwrap_or_default();
        row(kind.name(), &f);
    }
    // The whole run, the few seconds between episodes (finding a holder to aim at) included.
    let mut all = figures_in(a, &[(started, finished + 1)], &run.native, &run.consumer);
    all.episodes = run.records.len();
    all.recovered = run.records.iter().filter(|r| r.recovered.is_some()).count();
    all.worst_recovery = run
        .records
        .iter()
        .filter_map(|r| r.recovered)
        .max()
        .unwrap_or_default();
    row("**all**", &all);

    let _ = writeln!(
        s,
        "\nOverlaps count only where a kafka-lock contender held first: the Java seed client has \
         no lease, so a hold of its that outlives its membership is its own failing.\n\nWrites: \
         {} accepted, {} fenced off. Holds by path: {}. Proxied broker answers rewritten: \
         {rewritten}.\n",
        a.accepted,
        a.rejected.len(),
        path_counts(a)
    );
    let _ = writeln!(
        s,
        "Token order: {} hold(s) began with a token not above that of an earlier hold of the \
         same lock or permit slot.\n",
        a.inversions.len()
    );
    if run.cfg.checkpoints && run.cfg.permits == 1 {
        let c = &a.checkpoints;
        let _ = writeln!(
            s,
            "Checkpoint continuity: {} checkpoint(s) reported stored; {} read at a grant, {} of \
             them after an earlier hold's was reported stored; {} violation(s) (a read older \
             than one reported stored before the grant, a read of one no earlier hold stored, \
             or one reported stored after the store fenced its token off).\n",
            c.acked,
            c.reads,
            c.reads_bound,
            c.violations.len()
        );
    }
    let _ = writeln!(
        s,
        "End reports with no open hold (`lost` or `released` when the contender held nothing, \
         e.g. one hold ended twice): {}.\n",
        a.unmatched_ends.len()
    );
    if !a.unmatched_ends.is_empty() {
        let _ = writeln!(s, "```\n{}```\n", a.unmatched(20));
    }
    if !run.extra.is_empty() {
        let other = |lock: &str| run.extra.iter().any(|l| l == lock);
        let many = |id: &str| id.starts_with("many");
        let _ =
            writeln!(
            s,
            "Many locks in one process: 2 contenders, each taking the native lock and the same \
             {} other locks through one client: {} holds of the native lock and {} of the \
             others by them; on the others, {} overlap(s), {} stale write(s) accepted, {} \
             token inversion(s) (counted in the figures above too).\n",
            run.extra.len(),
            a.holds
                .iter()
                .filter(|h| many(&h.id) && checker::base(&h.lock) == run.native)
                .count(),
            a.holds
                .iter()
                .filter(|h| many(&h.id) && other(&h.lock))
                .count(),
            a.judged_overlaps().filter(|o| other(&o.first.lock)).count(),
            a.stale_accepted.iter().filter(|(w, _)| other(&w.lock)).count(),
            a.inversions.iter().filter(|(h, _)| other(&h.lock)).count(),
        );
    }
    for (lock, n, most) in &a.most_at_once {
        let lock = if lock == &run.native { "native" } else { lock };
        let _ = writeln!(
            s,
            "Semaphore mode: the {lock} lock has {n} permits; at most {most} holds at once; {} \
             instant(s) with more than {n}; overlaps and stale writes above are judged per \
             permit slot.\n",
            a.too_many.len()
        );
    }
    let _ = writeln!(
        s,
        "Checker self-test (a contender that ignores its loss, paused past the session \
         timeout): {} overlap(s), {} stale write(s) accepted, {} write(s) fenced off: {}.\n",
        selfcheck.analysis.judged_overlaps().count(),
        selfcheck.analysis.stale_accepted.len(),
        selfcheck.analysis.rejected.len(),
        if selfcheck.analysis.unsafe_() {
            "caught"
        } else {
            "NOT CAUGHT"
        }
    );
    if a.unsafe_() {
        let _ = writeln!(s, "## Violations\n\n```\n{}```\n", a.violations(20));
    }
    let unrecovered: Vec<String> = run
        .records
        .iter()
        .filter(|r| r.recovered.is_none())
        .map(|r| format!("episode {} ({})", r.n, r.plan))
        .collect();
    if !unrecovered.is_empty() {
        let _ = writeln!(
            s,
            "Not acquired again within {RECOVERY_BOUND:?} of the heal: {}.\n",
            unrecovered.join(", ")
        );
    }
    s
}

fn path_counts(a: &Analysis) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for h in &a.holds {
        let path =
            h.id.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
        *counts.entry(path.to_owned()).or_default() += 1;
    }
    counts
        .iter()
        .map(|(p, n)| format!("{p} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Everything the analysis saw, as tab-separated files beside the report.
fn dump(out: &std::path::Path, events: &[Event], writes: &[checker::WriteRec], records: &[Record]) {
    let mut e = String::from("mono_ns\tlock\tid\tevent\ttoken\tlease_end_ns\n");
    for v in events {
        let _ = writeln!(
            e,
            "{}\t{}\t{}\t{}\t{}\t{}",
            v.mono,
            v.lock,
            v.id,
            v.kind.name(),
            v.token.map_or("-".into(), |t| t.to_string()),
            v.lease_end.map_or("-".into(), |t| t.to_string())
        );
    }
    let mut w = String::from("decided_ns\tsent_ns\tlock\tid\ttoken\taccepted\n");
    for x in writes {
        let _ = writeln!(
            w,
            "{}\t{}\t{}\t{}\t{}\t{}",
            x.decided, x.sent, x.lock, x.id, x.token, x.accepted
        );
    }
    let mut r =
        String::from("n\tstart_ns\thealed_ns\tend_ns\tepisode\tlock\ttarget\tnote\trecovered_s\n");
    for x in records {
        let _ = writeln!(
            r,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            x.n,
            x.start,
            x.healed,
            x.end,
            x.plan,
            x.lock,
            x.target.as_deref().unwrap_or("-"),
            x.note,
            x.recovered
                .map_or("-".into(), |d| format!("{:.2}", d.as_secs_f64()))
        );
    }
    for (name, text) in [("events.tsv", e), ("writes.tsv", w), ("episodes.tsv", r)] {
        let _ = std::fs::write(out.join(name), text);
    }
}

/// The node id and address of the leader of partition 0 of `topic`, found with Metadata from
/// the first of `nodes` that names one.
async fn leader_of(nodes: &[String], topic: &str) -> Option<(i32, String)> {
    use kafka_lock::internals::driver::{ConnConfig, Connection};
    use kafka_lock::internals::wire::Response;
    use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::StrBytes;
    let bound = Duration::from_secs(5);
    let cfg = ConnConfig::default();
    for addr in nodes {
        let Ok(Ok(conn)) = tokio::time::timeout(bound, Connection::connect(addr, &cfg)).await
        else {
            continue;
        };
        let mut t = MetadataRequestTopic::default();
        t.name = Some(TopicName(StrBytes::from_string(topic.to_owned())));
        let mut req = MetadataRequest::default();
        req.topics = Some(vec![t]);
        let answer = tokio::time::timeout(bound, conn.request(req)).await;
        conn.close();
        if let Ok(Ok(Response::Metadata(r))) = answer {
            let id = r
                .topics
                .first()
                .and_then(|t| t.partitions.first())
                .map(|p| p.leader_id.0);
            let leader = id
                .filter(|&id| id >= 0)
                .and_then(|id| r.brokers.iter().find(|b| b.node_id.0 == id))
                .map(|b| (b.node_id.0, format!("{}:{}", b.host, b.port)));
            if leader.is_some() {
                return leader;
            }
        }
    }
    None
}

/// Appends one record under `key` to partition 0 of `topic` through its leader, found with
/// Metadata from the first of `nodes` that answers, as any producer could. Its offset, or
/// none if it could not be appended (no leader, a broker down): the forger goes on.
async fn append(nodes: &[String], topic: &str, key: &str, value: bytes::Bytes) -> Option<i64> {
    use kafka_lock::internals::driver::{ConnConfig, Connection};
    use kafka_lock::internals::ledger::{build, Op};
    use kafka_lock::internals::wire::log::{produced, TopicPartition};
    use kafka_lock::internals::wire::records::{encode_batch, NewRecord};
    use kafka_lock::internals::wire::Response;
    let bound = Duration::from_secs(5);
    let cfg = ConnConfig::default();
    let (_, leader) = leader_of(nodes, topic).await?;
    let Ok(Ok(conn)) = tokio::time::timeout(bound, Connection::connect(&leader, &cfg)).await else {
        return None;
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let record = NewRecord {
        timestamp: now_ms,
        key: Some(bytes::Bytes::copy_from_slice(key.as_bytes())),
        value: Some(value),
        headers: Vec::new(),
    };
    let mut out = bytes::BytesMut::new();
    if encode_batch(&[record], &mut out).is_err() {
        conn.close();
        return None;
    }
    let tp = TopicPartition::new(topic, 0);
    let op = Op::Produce {
        tp: tp.clone(),
        batch: out.freeze(),
        timeout: bound,
    };
    let offset = match build(&op, conn.versions()) {
        Ok((req, v)) => match conn.request_at(req, v, bound).await {
            Ok(Response::Produce(r)) => produced(&r, &tp, v).ok().map(|a| a.base_offset),
            _ => None,
        },
        Err(_) => None,
    };
    conn.close();
    offset
}

/// The group's committed offsets as a plain OffsetFetch (v8, no `require_stable`) at the
/// broker at `addr` reads them: every partition as `topic/partition@offset`, with a prefix of
/// its metadata. A broker error (NOT_COORDINATOR while it has not loaded the group) is an `Err`.
async fn plain_offsets(addr: String, group: String) -> Result<String, String> {
    use kafka_lock::internals::driver::{ConnConfig, Connection};
    use kafka_lock::internals::wire::Response;
    use kafka_protocol::messages::offset_fetch_request::{
        OffsetFetchRequest, OffsetFetchRequestGroup,
    };
    use kafka_protocol::messages::GroupId;
    use kafka_protocol::protocol::StrBytes;
    let bound = Duration::from_secs(2);
    let conn = tokio::time::timeout(bound, Connection::connect(&addr, &ConnConfig::default()))
        .await
        .map_err(|_| "connect timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    let mut g = OffsetFetchRequestGroup::default();
    g.group_id = GroupId(StrBytes::from_string(group));
    g.topics = None;
    let mut req = OffsetFetchRequest::default();
    req.require_stable = false;
    req.groups = vec![g];
    let answer = conn.request_at(req, 8, bound).await;
    conn.close();
    let Response::OffsetFetch(r) = answer.map_err(|e| e.to_string())? else {
        return Err("not an OffsetFetch answer".to_owned());
    };
    let g = r.groups.first().ok_or("no group in the answer")?;
    if g.error_code != 0 {
        return Err(format!("error {}", g.error_code));
    }
    let mut out: Vec<String> = g
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(move |p| {
                let meta: String = p
                    .metadata
                    .as_deref()
                    .unwrap_or("")
                    .chars()
                    .take(24)
                    .collect();
                format!(
                    "{}/{}@{} {meta:?}",
                    t.name.0.as_str(),
                    p.partition_index,
                    p.committed_offset
                )
            })
        })
        .collect();
    out.sort();
    Ok(if out.is_empty() {
        "nothing committed".to_owned()
    } else {
        out.join(" ")
    })
}

/// The replicas of `topic`'s partition `partition` in assignment order, from Metadata at the
/// first of `nodes` that answers.
async fn replicas_of(nodes: Vec<String>, topic: &'static str, partition: i32) -> Option<Vec<i32>> {
    use kafka_lock::internals::driver::{ConnConfig, Connection};
    use kafka_lock::internals::wire::Response;
    use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::StrBytes;
    let bound = Duration::from_secs(5);
    for addr in nodes {
        let Ok(Ok(conn)) =
            tokio::time::timeout(bound, Connection::connect(&addr, &ConnConfig::default())).await
        else {
            continue;
        };
        let mut t = MetadataRequestTopic::default();
        t.name = Some(TopicName(StrBytes::from_static_str(topic)));
        let mut req = MetadataRequest::default();
        req.topics = Some(vec![t]);
        let answer = tokio::time::timeout(bound, conn.request(req)).await;
        conn.close();
        if let Ok(Ok(Response::Metadata(r))) = answer {
            if let Some(p) = r
                .topics
                .first()
                .and_then(|t| t.partitions.iter().find(|p| p.partition_index == partition))
            {
                return Some(p.replica_nodes.iter().map(|n| n.0).collect());
            }
        }
    }
    None
}

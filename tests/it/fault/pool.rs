//! The contenders of a run: a fixed set of slots, each kept filled with a running contender
//! process by a keeper thread (a CLI contender exits after every job, a killed one is
//! replaced). Every process runs under the lifeline wrapper, so none outlives the test process,
//! and dropping the pool kills them all.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::checker::{Checker, Event, Kind};
use super::kproxy::ProxySet;
use super::nemesis::Rng;
use super::roles::{role_args, Flavour};
use super::{HEARTBEAT, SESSION};
use crate::support::kafka::peer::{PeerEventKind, SeedPeer, SeedPeerOptions};
use crate::support::lifeline::{Output, Supervised};
use crate::support::mono_ns;

/// What runs in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A library contender process (`roles` `lib`), native or consumer-compatible mode.
    Lib,
    /// `kafka-lock run` with the `writer` job.
    Cli,
    /// The Java seed client (`SeedLockPeer`), consumer mode only.
    Java,
    /// A library contender process (`roles` `many`) on the slot's lock and its extra locks,
    /// through one client.
    Many,
    /// A library contender process (`roles` `reads`) whose client reads the lock all the time.
    Reads,
    /// A library contender process (`roles` `slow`) that never reads its events stream.
    Slow,
    /// `kafka-lock run` with a command that cannot exec (it does not exist).
    NoExec,
    /// A library contender process (`roles` `stall`) on a current_thread runtime that blocks
    /// that thread while it holds when the suite asks ([`stall_file`]).
    Stall,
}

/// Where the suite asks slot `name`'s `stall` contender to block its runtime: a file holding
/// the milliseconds, renamed into place.
pub fn stall_file(logs: &Path, name: &str) -> std::path::PathBuf {
    logs.join(format!("{name}.stall"))
}

/// The trap of [`Pool::stop_after_spawn`]: armed, it stops the supervisor of the slot's next
/// kafka-lock to acquire the moment the acquisition is seen.
#[derive(Default)]
pub struct ExecTrap {
    armed: AtomicBool,
    /// The stopped supervisor's pid, its kafka-lock's id, and when it was stopped.
    sprung: Mutex<Option<(u32, String, i64)>>,
}

pub struct SlotSpec {
    pub name: String,
    pub role: Role,
    pub lock: String,
    pub flavour: Flavour,
    /// Above 1: the lock is a semaphore with this many permits.
    pub permits: u16,
    /// [`Role::Many`]: the locks it takes besides `lock` (generation tokens, one permit).
    pub extra: Vec<String>,
    /// [`Role::Many`]: its client's parking lanes (`Client::parking_lanes`; 0: the default).
    pub lanes: usize,
}

impl SlotSpec {
    /// Every lock the slot's contender takes.
    fn locks(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.lock).chain(&self.extra)
    }
}

enum Running {
    Proc {
        id: String,
        process: Supervised,
    },
    Java {
        id: String,
        peer: Box<SeedPeer>,
        forwarded: usize,
        holding: bool,
    },
}

impl Running {
    fn id(&self) -> &str {
        match self {
            Running::Proc { id, .. } | Running::Java { id, .. } => id,
        }
    }

    fn pid(&self) -> u32 {
        match self {
            Running::Proc { process, .. } => process.pid(),
            Running::Java { peer, .. } => peer.pid(),
        }
    }
}

struct Slot {
    spec: SlotSpec,
    proxies: Option<ProxySet>,
    trap: Arc<ExecTrap>,
    generation: u32,
    running: Option<Running>,
    respawn_at: Instant,
    /// [`Pool::slow_starts`]: the shim preloaded into the slot's next kafka-locks.
    slow: Option<PathBuf>,
    /// Of the kafka-locks started with the shim: how many, and how many told to fail.
    slowed: (u32, u32),
}

/// What every spawn needs.
pub struct Env {
    pub checker: Arc<Checker>,
    /// The cluster's own addresses, for contenders without proxies (Java, the herd).
    pub bootstrap: String,
    pub logs: PathBuf,
    pub exe: PathBuf,
    pub kafka_lock: PathBuf,
    /// Checkpoint continuity: contenders store and read checkpoints (`FAULT_CHECKPOINTS`).
    pub checkpoints: bool,
}

pub struct Pool {
    janitor: Janitor,
    env: Arc<Env>,
    slots: Arc<Mutex<Vec<Slot>>>,
    stop: Arc<AtomicBool>,
    keeper: Option<JoinHandle<()>>,
}

impl Pool {
    /// Starts a contender in every slot; library and CLI slots get a proxy set each from
    /// `proxies`.
    pub fn start(
        env: Env,
        specs: Vec<SlotSpec>,
        mut proxies: impl FnMut() -> ProxySet,
        seed: u64,
    ) -> Pool {
        let slots: Vec<Slot> = specs
            .into_iter()
            .map(|spec| Slot {
                proxies: (spec.role != Role::Java).then(&mut proxies),
                trap: Arc::default(),
                spec,
                generation: 0,
                running: None,
                respawn_at: Instant::now(),
                slow: None,
                slowed: (0, 0),
            })
            .collect();
        let env = Arc::new(env);
        let slots = Arc::new(Mutex::new(slots));
        let stop = Arc::new(AtomicBool::new(false));
        let keeper = {
            let (env, slots, stop) = (env.clone(), slots.clone(), stop.clone());
            std::thread::Builder::new()
                .name("fault-keeper".into())
                .spawn(move || {
                    let mut rng = Rng::new(seed);
                    while !stop.load(Ordering::SeqCst) {
                        for slot in slots.lock().unwrap_or_else(|p| p.into_inner()).iter_mut() {
                            keep(&env, slot, &mut rng);
                        }
                        // Polling: exits and the Java peer's events have no common wait.
                        std::thread::sleep(Duration::from_millis(50));
                    }
                })
                .expect("keeper thread")
        };
        Pool {
            janitor: Janitor::start(),
            env,
            slots,
            stop,
            keeper: Some(keeper),
        }
    }

    pub fn env(&self) -> &Env {
        &self.env
    }

    fn with_slot<T>(&self, id: &str, f: impl FnOnce(&mut Slot) -> T) -> Option<T> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .iter_mut()
            .find(|s| s.running.as_ref().is_some_and(|r| r.id() == id))
            .map(f)
    }

    /// Whether `id` is a running contender of this pool, and its role.
    pub fn role_of(&self, id: &str) -> Option<Role> {
        self.with_slot(id, |s| s.spec.role)
    }

    /// The ids of the running contenders on `lock` that have proxies.
    pub fn proxied(&self, lock: &str) -> Vec<String> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .iter()
            .filter(|s| s.spec.lock == lock && s.proxies.is_some())
            .filter_map(|s| s.running.as_ref().map(|r| r.id().to_owned()))
            .collect()
    }

    /// Runs `f` on the proxies of the slot contender `id` runs or ran in (ids are
    /// `<slot>.<n>`): a heal must reach them even when the contender it was aimed at has exited
    /// during the fault (a cut `kafka-lock run` says `lost` at its lease end and exits) and its
    /// slot runs the next one, or that one would stay cut.
    pub fn proxies_of(&self, id: &str, f: impl FnOnce(&ProxySet)) -> bool {
        let slot = id.rsplit_once('.').map_or(id, |(slot, _)| slot);
        self.slot_proxies(slot, f)
    }

    /// Runs `f` on the proxies of slot `name` (ids are `<slot>.<n>`), whoever runs in it now:
    /// a fault outlives the contender it was aimed at.
    pub fn slot_proxies(&self, name: &str, f: impl FnOnce(&ProxySet)) -> bool {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .iter()
            .find(|s| s.spec.name == name)
            .and_then(|s| s.proxies.as_ref())
            .map(f)
            .is_some()
    }

    /// Runs `f` on every slot's proxies.
    pub fn all_proxies(&self, mut f: impl FnMut(&ProxySet)) {
        for s in self.slots.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if let Some(p) = &s.proxies {
                f(p);
            }
        }
    }

    /// Rewrite failures summed over every proxy set, with the last message.
    pub fn rewrite_failures(&self) -> (u64, u64, Option<String>) {
        let (mut ok, mut failed, mut last) = (0, 0, None);
        self.all_proxies(|p| {
            ok += p.stats().rewritten.load(Ordering::Relaxed);
            failed += p.stats().rewrite_failures.load(Ordering::Relaxed);
            if let Some(m) = p
                .stats()
                .last_failure
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
            {
                last = Some(m);
            }
        });
        (ok, failed, last)
    }

    /// SIGKILLs contender `id` (for the CLI, kafka-lock itself: its supervisor must then stop
    /// the job) and records the kill.
    pub fn kill(&self, id: &str) -> bool {
        self.signal_recorded(id, libc::SIGKILL)
    }

    /// Sends `sig` to contender `id` and records it as a kill (the contender's process ends
    /// whether or not it releases first).
    pub fn signal_recorded(&self, id: &str, sig: i32) -> bool {
        let done = self.with_slot(id, |s| {
            signal(s.running.as_ref().expect("running").pid(), sig);
            s.spec.locks().cloned().collect::<Vec<_>>()
        });
        for lock in done.iter().flatten() {
            self.env.checker.event(Event {
                lock: lock.clone(),
                id: id.to_owned(),
                kind: Kind::Killed,
                mono: mono_ns(),
                token: None,
                lease_end: None,
            });
        }
        done.is_some()
    }

    /// From now on (`Some`), slot `name`'s kafka-locks start with `shim`
    /// (tests/it/slow_spawn.c) preloaded, each holding back its start of the supervisor 0.2 to
    /// 4 s, before or after the spawn, or failing it; `None` ends that for the next ones.
    /// Returns how many were started so, and how many of them told to fail.
    pub fn slow_starts(&self, name: &str, shim: Option<PathBuf>) -> (u32, u32) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let Some(s) = slots.iter_mut().find(|s| s.spec.name == name) else {
            return (0, 0);
        };
        s.slow = shim;
        std::mem::take(&mut s.slowed)
    }

    /// The id of slot `name`'s running contender.
    pub fn running(&self, name: &str) -> Option<String> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .iter()
            .find(|s| s.spec.name == name)
            .and_then(|s| s.running.as_ref())
            .map(|r| r.id().to_owned())
    }

    /// Arms slot `name`'s trap: the supervisor of its next kafka-lock to acquire is SIGSTOPped
    /// the moment the acquisition is seen. See [`Pool::sprung`].
    pub fn stop_after_spawn(&self, name: &str) -> bool {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let Some(s) = slots.iter().find(|s| s.spec.name == name) else {
            return false;
        };
        *s.trap.sprung.lock().unwrap_or_else(|p| p.into_inner()) = None;
        s.trap.armed.store(true, Ordering::SeqCst);
        true
    }

    /// What slot `name`'s trap stopped: the pid and id, and when; disarms it once sprung.
    pub fn sprung(&self, name: &str) -> Option<(u32, String, i64)> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let s = slots.iter().find(|s| s.spec.name == name)?;
        let sprung = s
            .trap
            .sprung
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        sprung
    }

    /// Disarms slot `name`'s trap.
    pub fn disarm(&self, name: &str) {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = slots.iter().find(|s| s.spec.name == name) {
            s.trap.armed.store(false, Ordering::SeqCst);
        }
    }

    /// Whether the pool has a slot named `name`.
    pub fn has_slot(&self, name: &str) -> bool {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.iter().any(|s| s.spec.name == name)
    }

    /// Held Heartbeat answers whose connection the client closed first, over every proxy set.
    /// [`super::kproxy::ProxyStats::joins_before_check`] summed over every proxy set.
    pub fn joins_before_check(&self) -> u64 {
        let mut n = 0;
        self.all_proxies(|p| n += p.stats().joins_before_check.load(Ordering::SeqCst));
        n
    }

    pub fn heartbeats_abandoned(&self) -> u64 {
        let mut n = 0;
        self.all_proxies(|p| n += p.stats().heartbeats_abandoned.load(Ordering::SeqCst));
        n
    }

    /// Puts a process stopped by a trap in the janitor's care, in case the test ends first.
    pub fn watch_stopped(&self, pid: u32) {
        self.janitor.watch(&[pid]);
    }

    /// SIGCONTs one process a trap stopped.
    pub fn cont(&self, pid: u32) {
        signal(pid, libc::SIGCONT);
        self.janitor.watch(&[]);
    }

    /// Runs `f` on the proxies' counters of slot `name`.
    pub fn slot_stats<T>(
        &self,
        name: &str,
        f: impl FnOnce(&super::kproxy::ProxyStats) -> T,
    ) -> Option<T> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .iter()
            .find(|s| s.spec.name == name)
            .and_then(|s| s.proxies.as_ref())
            .map(|p| f(p.stats()))
    }

    /// SIGSTOPs contender `id`'s whole process tree; the pids, for [`Pool::resume`].
    pub fn pause(&self, id: &str) -> Vec<u32> {
        let pids = self
            .with_slot(id, |s| {
                stop_tree(s.running.as_ref().expect("running").pid())
            })
            .unwrap_or_default();
        // The root is the lifeline's to kill; a stopped descendant (the CLI's supervisor and
        // job) would never see kafka-lock die, so the janitor kills it if the test does.
        self.janitor.watch(pids.get(1..).unwrap_or_default());
        pids
    }

    /// SIGCONTs what [`Pool::pause`] stopped, in the same order.
    pub fn resume(&self, pids: &[u32]) {
        for &pid in pids {
            signal(pid, libc::SIGCONT);
        }
        self.janitor.watch(&[]);
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(k) = self.keeper.take() {
            let _ = k.join();
        }
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        for slot in slots.iter_mut() {
            if let Some(r) = slot.running.take() {
                let id = r.id().to_owned();
                drop(r);
                for lock in slot.spec.locks() {
                    self.env.checker.event(Event {
                        lock: lock.clone(),
                        id: id.clone(),
                        kind: Kind::Killed,
                        mono: mono_ns(),
                        token: None,
                        lease_end: None,
                    });
                }
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Kills the processes a pause left stopped when the test process ends while they are: the
/// lifeline kills each contender's own process, but a stopped CLI supervisor and job would wait
/// for a SIGCONT that never comes. A shell reading the pids from a pipe this process holds: at
/// end of input, however this process ended, it SIGKILLs the last list it was given (which a
/// stopped process cannot dodge) and exits; an empty line means nothing is stopped.
struct Janitor {
    list: Mutex<Option<std::process::ChildStdin>>,
    shell: Mutex<std::process::Child>,
}

const JANITOR: &str = r#"pids=; while IFS= read -r line; do pids=$line; done; [ -z "$pids" ] || kill -KILL $pids 2>/dev/null; exit 0"#;

impl Janitor {
    fn start() -> Janitor {
        let mut shell = Command::new("sh")
            .args(["-c", JANITOR])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start the pause janitor");
        Janitor {
            list: Mutex::new(shell.stdin.take()),
            shell: Mutex::new(shell),
        }
    }

    fn watch(&self, pids: &[u32]) {
        let line: Vec<String> = pids.iter().map(u32::to_string).collect();
        if let Some(w) = self.list.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            let _ = writeln!(w, "{}", line.join(" "));
        }
    }
}

impl Drop for Janitor {
    fn drop(&mut self) {
        drop(self.list.lock().unwrap_or_else(|p| p.into_inner()).take());
        let _ = self.shell.lock().unwrap_or_else(|p| p.into_inner()).wait();
    }
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) with plain integers; no memory is shared.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Stops `root` and every descendant, top down, until a pass finds nothing new: a process
/// that was starting a child when its parent stopped is caught on the next pass.
fn stop_tree(root: u32) -> Vec<u32> {
    let mut stopped: Vec<u32> = Vec::new();
    for _ in 0..5 {
        let fresh: Vec<u32> = descendants(root)
            .into_iter()
            .filter(|p| !stopped.contains(p))
            .collect();
        if fresh.is_empty() {
            break;
        }
        for pid in fresh {
            signal(pid, libc::SIGSTOP);
            stopped.push(pid);
        }
    }
    stopped
}

/// `root` and its descendants, parents before children, from /proc.
fn descendants(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // The parent is the second field after the parenthesised command name.
            if let Some(ppid) = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok())
            {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        if let Some(kids) = children.get(&out[i]) {
            out.extend(kids);
        }
        i += 1;
    }
    out
}

fn keep(env: &Env, slot: &mut Slot, rng: &mut Rng) {
    let exited = match &mut slot.running {
        None => {
            if Instant::now() >= slot.respawn_at {
                slot.generation += 1;
                let id = format!("{}.{}", slot.spec.name, slot.generation);
                match spawn(env, slot, &id, rng) {
                    Ok(r) => slot.running = Some(r),
                    Err(e) => {
                        eprintln!("fault suite: cannot start {id}: {e}");
                        slot.respawn_at = Instant::now() + Duration::from_secs(1);
                    }
                }
            }
            return;
        }
        Some(Running::Proc { process, .. }) => process.exited().is_some(),
        Some(Running::Java {
            id,
            peer,
            forwarded,
            holding,
        }) => {
            let events = peer.drain();
            for e in &events[*forwarded..] {
                let (kinds, token): (&[Kind], _) = match e.kind {
                    PeerEventKind::Started => (&[Kind::Waiting], None),
                    PeerEventKind::Acquired => {
                        *holding = true;
                        (&[Kind::Acquired], e.generation)
                    }
                    PeerEventKind::Revoked => {
                        *holding = false;
                        (&[Kind::Released, Kind::Waiting], None)
                    }
                    PeerEventKind::Lost => {
                        *holding = false;
                        (&[Kind::Lost, Kind::Waiting], None)
                    }
                    PeerEventKind::Closed if *holding => (&[Kind::Released], None),
                    _ => (&[], None),
                };
                for &kind in kinds {
                    env.checker.event(Event {
                        lock: slot.spec.lock.clone(),
                        id: id.clone(),
                        kind,
                        mono: e.mono_ns,
                        token: token.map(i64::from),
                        lease_end: None,
                    });
                }
            }
            *forwarded = events.len();
            peer.exited().is_some()
        }
    };
    if exited {
        let r = slot.running.take().expect("running");
        // Closes a wait that never ended in a hold (a CLI run that gave up during a broker
        // fault); ignored after a hold's own end.
        for lock in slot.spec.locks() {
            env.checker.event(Event {
                lock: lock.clone(),
                id: r.id().to_owned(),
                kind: Kind::GaveUp,
                mono: mono_ns(),
                token: None,
                lease_end: None,
            });
        }
        slot.respawn_at = Instant::now() + rng.millis(100, 600);
    }
}

fn spawn(env: &Env, slot: &mut Slot, id: &str, rng: &mut Rng) -> Result<Running, String> {
    let spec = &slot.spec;
    let log = env.logs.join(format!("{id}.log"));
    match spec.role {
        Role::Lib => {
            let bootstrap = slot.proxies.as_ref().expect("proxies").bootstrap();
            let mut cmd = lib_command(
                env,
                id,
                &spec.lock,
                &bootstrap,
                &spec.flavour,
                false,
                rng.next_u64(),
            );
            cmd.env("FAULT_PERMITS", spec.permits.to_string());
            let (process, _) = Supervised::spawn(&cmd, Output::Log(&log), None)?;
            Ok(Running::Proc {
                id: id.to_owned(),
                process,
            })
        }
        Role::Reads | Role::Slow | Role::Stall => {
            let bootstrap = slot.proxies.as_ref().expect("proxies").bootstrap();
            let mut cmd = lib_command(
                env,
                id,
                &spec.lock,
                &bootstrap,
                &spec.flavour,
                false,
                rng.next_u64(),
            );
            cmd.env(
                "FAULT_ROLE",
                match spec.role {
                    Role::Reads => "reads",
                    Role::Slow => "slow",
                    _ => "stall",
                },
            )
            .env("FAULT_PERMITS", spec.permits.to_string())
            .env("FAULT_STALL_FILE", stall_file(&env.logs, &spec.name));
            let (process, _) = Supervised::spawn(&cmd, Output::Log(&log), None)?;
            Ok(Running::Proc {
                id: id.to_owned(),
                process,
            })
        }
        Role::Many => {
            let bootstrap = slot.proxies.as_ref().expect("proxies").bootstrap();
            let mut cmd = lib_command(
                env,
                id,
                &spec.lock,
                &bootstrap,
                &spec.flavour,
                false,
                rng.next_u64(),
            );
            cmd.env("FAULT_ROLE", "many")
                .env("FAULT_EXTRA_LOCKS", spec.extra.join(","))
                .env("FAULT_PERMITS", spec.permits.to_string())
                .env("FAULT_PARKING_LANES", spec.lanes.to_string());
            let (process, _) = Supervised::spawn(&cmd, Output::Log(&log), None)?;
            Ok(Running::Proc {
                id: id.to_owned(),
                process,
            })
        }
        Role::Cli | Role::NoExec => {
            let bootstrap = slot.proxies.as_ref().expect("proxies").bootstrap();
            let secs = |d: Duration| format!("{}ms", d.as_millis());
            let mut cmd = Command::new("sh");
            // kafka-lock prints its events on stderr; one pipe carries them and the job's output.
            cmd.args(["-c", "exec \"$@\" 2>&1", "sh"])
                .arg(&env.kafka_lock)
                .args(["run", "--bootstrap", &bootstrap, "--lock", &spec.lock])
                .args(["--session-timeout", &secs(SESSION)])
                .args(["--rebalance-timeout", &secs(SESSION)])
                .args(["--heartbeat-interval", &secs(HEARTBEAT)])
                .args(spec.flavour.cli_args())
                .args(["--permits", &spec.permits.to_string()])
                .args(["--events", "json", "--label", id, "--"]);
            if spec.role == Role::NoExec {
                // No such file: the supervisor's exec fails with ENOENT.
                cmd.arg(env.logs.join("no-such-command"));
            } else {
                cmd.arg(&env.exe)
                    .args(role_args())
                    .env("FAULT_ROLE", "writer")
                    .env("FAULT_CHECKER", env.checker.addr().to_string())
                    .env("FAULT_LOCK", &spec.lock)
                    .env("FAULT_ID", id)
                    .env("FAULT_PERMITS", spec.permits.to_string())
                    .env("FAULT_HOLD_MS", rng.range(300, 3000).to_string());
                if env.checkpoints
                    && spec.permits == 1
                    && matches!(spec.flavour, Flavour::Ledger(_))
                {
                    cmd.env("FAULT_CHECKPOINTS", "1");
                }
            }
            if let Some(shim) = &slot.slow {
                // Only kafka-lock's spawn of `__supervise` is hindered (the shim checks argv),
                // so the supervisor and the job, which inherit it, start as ever.
                cmd.env("LD_PRELOAD", shim)
                    .env("SLOW_SPAWN_MS", rng.range(200, 4000).to_string());
                slot.slowed.0 += 1;
                match rng.range(0, 3) {
                    0 => {}
                    1 => {
                        cmd.env("SLOW_SPAWN_FAIL", "1");
                        slot.slowed.1 += 1;
                    }
                    _ => {
                        cmd.env("SLOW_SPAWN_AFTER", "1");
                    }
                }
            }
            env.checker.event(Event {
                lock: spec.lock.clone(),
                id: id.to_owned(),
                kind: Kind::Waiting,
                mono: mono_ns(),
                token: None,
                lease_end: None,
            });
            let (process, stdout) = Supervised::spawn(&cmd, Output::Piped { stderr: &log }, None)?;
            let stdout = stdout.expect("piped");
            let (checker, lock, who) = (env.checker.clone(), spec.lock.clone(), id.to_owned());
            let permits = spec.permits;
            let (trap, pid) = (slot.trap.clone(), process.pid());
            std::thread::spawn(move || {
                forward_cli_events(stdout, &log, &checker, &lock, &who, permits, (&trap, pid))
            });
            Ok(Running::Proc {
                id: id.to_owned(),
                process,
            })
        }
        Role::Java => {
            let Flavour::Consumer(topic) = spec.flavour.clone() else {
                panic!("a Java peer needs the lock's topic (consumer mode)");
            };
            let options = SeedPeerOptions {
                group: spec.lock.clone(),
                // Range gives partition 0 to the member id that sorts first: kafka-lock's
                // members ("kafka-lock-...") sort before this one, so the Java client holds
                // when no kafka-lock contender is in the group, and the lock changes hands
                // between the two kinds.
                client_id: Some(format!("zz-seed-{}", id.replace('.', "-"))),
                session_timeout: SESSION,
                heartbeat_interval: HEARTBEAT,
                ..SeedPeerOptions::new(&env.bootstrap, &topic)
            };
            Ok(Running::Java {
                id: id.to_owned(),
                peer: Box::new(SeedPeer::start(&options)),
                forwarded: 0,
                holding: false,
            })
        }
    }
}

/// The command line of a library contender process.
pub fn lib_command(
    env: &Env,
    id: &str,
    lock: &str,
    bootstrap: &str,
    flavour: &Flavour,
    broken: bool,
    seed: u64,
) -> Command {
    let mut cmd = Command::new(&env.exe);
    cmd.args(role_args())
        .env("FAULT_ROLE", if broken { "broken" } else { "lib" })
        .env("FAULT_CHECKER", env.checker.addr().to_string())
        .env("FAULT_LOCK", lock)
        .env("FAULT_ID", id)
        .env("FAULT_BOOTSTRAP", bootstrap)
        .env("FAULT_SEED", seed.to_string());
    if env.checkpoints {
        cmd.env("FAULT_CHECKPOINTS", "1");
    }
    if let Some((k, v)) = flavour.env() {
        cmd.env(k, v);
    }
    cmd
}

/// Copies kafka-lock's output into its log and turns its `--events json` lines into events.
fn forward_cli_events(
    stdout: std::process::ChildStdout,
    log: &Path,
    checker: &Checker,
    lock: &str,
    id: &str,
    permits: u16,
    (trap, pid): (&ExecTrap, u32),
) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .ok();
    // Whether a hold is open by kafka-lock's own events.
    let mut holding = false;
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        if let Some(f) = file.as_mut() {
            let _ = writeln!(f, "{line}");
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let kind = match v["event"].as_str() {
            Some("acquired") => Kind::Acquired,
            Some("token_changed") => Kind::Token,
            Some("lost") => Kind::Lost,
            Some("released") => Kind::Released,
            // A run whose command's checkpoint the broker refused, or whose supervisor died,
            // ended with `failed` alone (RELIABILITY.md, "Checkpoints across handovers"; it
            // says `released` or `lost` first now): its command and every process of it are
            // gone by then, so the hold ends there at the latest.
            Some("failed") if holding => Kind::Lost,
            // The job's checkpoint stored; the value is the one the job last reported writing.
            Some("checkpoint") => Kind::CkAcked,
            _ => continue,
        };
        let Some(mono) = v["mono_ns"].as_i64() else {
            continue;
        };
        match kind {
            Kind::Acquired => holding = true,
            Kind::Lost | Kind::Released => holding = false,
            _ => {}
        }
        if kind == Kind::Acquired && trap.armed.swap(false, Ordering::SeqCst) {
            spring(trap, pid, id);
        }
        // Semaphore mode: the acquisition says under which slot's key the hold counts.
        let slot = v["permit"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .filter(|_| permits > 1);
        if kind == Kind::CkAcked {
            checker.event(Event {
                lock: super::checker::key(lock, slot),
                id: id.to_owned(),
                kind,
                mono,
                token: None,
                lease_end: None,
            });
            continue;
        }
        checker.event(Event {
            lock: super::checker::key(lock, slot),
            id: id.to_owned(),
            kind,
            mono,
            token: v["token"].as_i64(),
            // A release says until when the hold is claimed (the instant the lease was read),
            // which is before the event's line if kafka-lock was stopped in between.
            lease_end: v["lease_end_mono_ns"]
                .as_i64()
                .or_else(|| v["held_until_mono_ns"].as_i64()),
        });
    }
}

/// Stops the first child of kafka-lock `pid`: its supervisor, which it starts before it waits
/// for the lock and which idles until told the hold's environment and lease, so it is stopped
/// before it can start the command; gives up after a few seconds.
fn spring(trap: &ExecTrap, pid: u32, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Some(child) = first_child(pid) {
            signal(child, libc::SIGSTOP);
            *trap.sprung.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((child, id.to_owned(), mono_ns()));
            return;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A child of any thread of `pid` (`/proc/<pid>/task/<tid>/children`).
fn first_child(pid: u32) -> Option<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    tasks.flatten().find_map(|t| {
        std::fs::read_to_string(t.path().join("children"))
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// The janitor kills what it was last told is stopped once its pipe closes, as it does when the
/// test process dies, and leaves alone what was resumed.
#[test]
fn the_janitor_kills_stopped_processes_when_its_pipe_closes() {
    // Killed and reaped on drop, whatever happens below.
    let spawn = || {
        crate::support::ChildGuard::new(
            Command::new("sleep")
                .arg("600")
                .spawn()
                .expect("start sleep"),
        )
    };
    let (mut stopped, resumed) = (spawn(), spawn());
    let janitor = Janitor::start();
    signal(resumed.id(), libc::SIGSTOP);
    janitor.watch(&[resumed.id()]);
    signal(resumed.id(), libc::SIGCONT);
    janitor.watch(&[]);
    signal(stopped.id(), libc::SIGSTOP);
    janitor.watch(&[stopped.id()]);
    drop(janitor);
    let status = stopped.wait().expect("reap");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    assert!(crate::support::pid_alive(resumed.id()));
}

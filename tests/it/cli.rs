//! The `kafka-lock` binary against the real broker: every exit status, the token in the
//! command's environment, signal forwarding, mutual exclusion judged from kafka-lock's own
//! `--events json` timestamps (CLOCK_MONOTONIC, one clock for every process), the command and
//! everything it started being stopped when the lease runs out, when kafka-lock or its
//! supervisor dies and when the command exits, output that cannot block the lock, and `status`.
//! The supervisor process is also driven directly over its socket (`supervisor_*` tests).
//!
//! Every kafka-lock is started through `setpriv --pdeathsig KILL`, so the kernel SIGKILLs it
//! when the test's thread ends, however the test process ends (a failing test, an abort, a
//! SIGKILL); its supervisor then stops the command's whole tree, which is the behaviour the
//! tests below prove. [`Run`] also kills kafka-lock and the command's process group when dropped.
//! A supervisor started directly holds the other end of a socket the test owns, which the
//! kernel closes when the test process ends: that end of file makes it stop everything too.

use std::collections::HashSet;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::proxy::Proxy;
use crate::support;
use crate::support::kafka::{KafkaCluster, KafkaOptions};

// The environment, events apart from the command's output, the event schema, exit statuses,
// metrics, completions and man pages.
pub(crate) mod conventions;
// elect and observe.
mod election;
use conventions::check_event;
// run and status on secured listeners (TLS, SASL), configured as Kafka clients are.
mod secured;
// run with SASL/OAUTHBEARER: a good token, a refused one, an unreachable token endpoint.
mod oauth;
// Help, value forms, hints, completions, man pages and the docs' command lines.
mod surface;
// One meaning of "token", tries that do not join, terminals, quiet and setting errors.
mod ux;

const BIN: &str = env!("CARGO_BIN_EXE_kafka-lock");

/// Bound for anything that takes one acquisition or handover, or a session timeout and a
/// rebalance, on a loaded two-core machine.
const STEP: Duration = Duration::from_secs(60);

/// Session timeout for tests with one holder at a time: Apache Kafka's smallest by default
/// (`group.min.session.timeout.ms` = 6000), so a lost holder is replaced quickly.
const QUICK: &[&str] = &["--session-timeout", "6s"];
/// Timeouts for tests where waiters join while a holder holds: the holder must rejoin each
/// rebalance well within its lease (session − margin), and waiters learn of a release from a
/// heartbeat.
const CONTENDED: &[&str] = &["--session-timeout", "6s", "--heartbeat-interval", "500ms"];

/// The shared Apache Kafka broker (initial rebalance delay 0) most tests use.
fn broker() -> &'static KafkaCluster {
    support::kafka::kafka()
}

/// One line kafka-lock wrote to stderr: an event, or anything else.
#[derive(Debug, Clone)]
enum Line {
    Event(Value),
    Text(String),
}

/// A running `kafka-lock`, its stderr parsed line by line, its stdout (shared with the command)
/// line by line. Dropping it SIGKILLs kafka-lock and every process group the command ran in.
struct Run {
    pid: u32,
    stdin: Option<ChildStdin>,
    exited: Receiver<ExitStatus>,
    status: Option<ExitStatus>,
    stderr: Receiver<Line>,
    stdout: Receiver<String>,
    /// Every stderr line read so far, for assertions and failure messages.
    seen: Vec<Line>,
    /// Process groups of commands kafka-lock started, filled in by the stderr reader itself so
    /// they are known even if the test never reads that far.
    groups: Arc<Mutex<Vec<u32>>>,
    /// Lets a stderr reader that was told to stall go on reading.
    resume: Option<mpsc::Sender<()>>,
    /// The CPU time kafka-lock and the descendants it reaped used, once it has exited.
    cpu: Arc<Mutex<Option<Duration>>>,
}

struct Spec {
    args: Vec<OsString>,
    env: Vec<(String, String)>,
    bootstrap_env: bool,
    /// Stop reading kafka-lock's stderr (keeping the pipe open) after this event, until
    /// [`Run::resume_stderr`].
    stall_after: Option<String>,
}

/// `kafka-lock` as the kernel's parent-death signal ties it to the calling test thread.
fn kafka_lock() -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--pdeathsig", "KILL", "--", BIN]);
    hermetic(&mut cmd);
    cmd
}

/// Every flag has a KAFKA_LOCK_* variable: none of the test process's own (KAFKA_LOCK_TANSU and
/// the like, or a developer's KAFKA_LOCK_BOOTSTRAP) may reach a kafka-lock under test.
fn hermetic(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("KAFKA_LOCK_") {
            cmd.env_remove(k);
        }
    }
}

impl Spec {
    fn new<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Spec {
        Spec {
            args: args.iter().map(|s| s.as_ref().to_owned()).collect(),
            env: Vec::new(),
            bootstrap_env: false,
            stall_after: None,
        }
    }

    fn env(mut self, k: &str, v: &str) -> Spec {
        self.env.push((k.to_owned(), v.to_owned()));
        self.bootstrap_env |= k == "KAFKA_LOCK_BOOTSTRAP";
        self
    }

    fn stall_stderr_after(mut self, event: &str) -> Spec {
        self.stall_after = Some(event.to_owned());
        self
    }

    fn spawn(self) -> Run {
        let mut cmd = kafka_lock();
        cmd.args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN} through setpriv: {e}"));
        Run::watch(child, self.stall_after)
    }
}

/// `kafka-lock run --bootstrap B --lock L --events json <extra> -- <command>`.
fn run_cmd(bootstrap: &str, lock: &str, extra: &[&str], command: &[&str]) -> Spec {
    let mut args: Vec<String> = vec![
        "run".into(),
        "--bootstrap".into(),
        bootstrap.into(),
        "--lock".into(),
        lock.into(),
        "--events".into(),
        "json".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push("--".into());
    args.extend(command.iter().map(|s| s.to_string()));
    Spec::new(&args)
}

fn sh(script: &str) -> Vec<&str> {
    vec!["sh", "-c", script]
}

impl Run {
    fn watch(mut child: Child, stall_after: Option<String>) -> Run {
        let pid = child.id();
        let stdin = child.stdin.take();
        let err = child.stderr.take().expect("stderr was piped");
        let out = child.stdout.take().expect("stdout was piped");
        let groups = Arc::new(Mutex::new(Vec::new()));
        let (err_tx, stderr) = mpsc::channel();
        let (resume, resumed) = mpsc::channel::<()>();
        let reader_groups = groups.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                let parsed = match serde_json::from_str::<Value>(&line) {
                    Ok(v) if v.is_object() => Line::Event(v),
                    _ => Line::Text(line),
                };
                let mut stall = false;
                if let Line::Event(v) = &parsed {
                    if v["event"] == "child_started" {
                        if let Some(pgid) = v["child_pid"].as_u64() {
                            reader_groups.lock().unwrap().push(pgid as u32);
                        }
                    }
                    stall = stall_after.as_deref().is_some_and(|e| v["event"] == e);
                }
                if err_tx.send(parsed).is_err() {
                    break;
                }
                if stall {
                    // Keeps the pipe open without reading it; a dropped Run ends the wait.
                    let _ = resumed.recv();
                }
            }
        });
        let (out_tx, stdout) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if out_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let (exit_tx, exited) = mpsc::channel();
        let cpu = Arc::new(Mutex::new(None));
        let used = cpu.clone();
        std::thread::spawn(move || {
            // wait4, not Child::wait: its rusage is kafka-lock's own CPU time.
            let (status, usage) = wait_with_usage(&child);
            if let Some(usage) = usage {
                *used.lock().unwrap_or_else(|p| p.into_inner()) = Some(usage);
            }
            if let Some(status) = status {
                let _ = exit_tx.send(status);
            }
        });
        Run {
            pid,
            stdin,
            exited,
            status: None,
            stderr,
            stdout,
            seen: Vec::new(),
            groups,
            resume: Some(resume),
            cpu,
        }
    }

    /// The CPU time (user and system) kafka-lock used, with that of the descendants it reaped
    /// (its supervisor, and what was re-parented to it); after [`Run::finish`].
    fn cpu_time(&self) -> Duration {
        self.cpu
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .expect("kafka-lock has exited and was reaped with its rusage")
    }

    fn resume_stderr(&mut self) {
        if let Some(r) = &self.resume {
            let _ = r.send(());
        }
    }

    fn transcript(&self) -> String {
        self.seen
            .iter()
            .map(|l| match l {
                Line::Event(v) => v.to_string(),
                Line::Text(t) => t.clone(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Keeps a stderr line; an event must follow the documented schema.
    fn record(&mut self, line: Line) {
        if let Line::Event(v) = &line {
            check_event(v);
        }
        self.seen.push(line);
    }

    /// Reads stderr until the event `name` and returns it.
    fn event(&mut self, name: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    self.record(line.clone());
                    if let Line::Event(v) = line {
                        if v["event"] == name {
                            return v;
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!(
                    "no {name:?} event from kafka-lock (pid {}) within {within:?}; stderr so far:\n{}",
                    self.pid,
                    self.transcript()
                ),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "kafka-lock (pid {}) closed stderr without a {name:?} event; stderr:\n{}",
                    self.pid,
                    self.transcript()
                ),
            }
        }
    }

    /// Reads the command's stdout until a line equal to `want`.
    fn stdout_line(&mut self, want: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(line) if line == want => return,
                Ok(_) => {}
                Err(e) => panic!(
                    "no stdout line {want:?} from the command of kafka-lock (pid {}) within {within:?} ({e:?}); stderr:\n{}",
                    self.pid,
                    self.transcript()
                ),
            }
        }
    }

    /// Writes to kafka-lock's stdin, which the command inherited.
    fn write_stdin(&mut self, text: &str) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().expect("stdin still open");
        stdin
            .write_all(text.as_bytes())
            .and_then(|()| stdin.flush())
            .expect("write to kafka-lock's stdin");
    }

    /// Closes kafka-lock's stdin, which the command inherited.
    fn close_stdin(&mut self) {
        self.stdin.take();
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid.to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -{sig} {} failed", self.pid);
    }

    /// Waits for kafka-lock to exit, then collects the rest of stderr. Returns the status code.
    fn finish(&mut self, within: Duration) -> i32 {
        let status = match self.exited.recv_timeout(within) {
            Ok(s) => s,
            Err(_) => panic!(
                "kafka-lock (pid {}) did not exit within {within:?}; stderr so far:\n{}",
                self.pid,
                self.transcript()
            ),
        };
        self.status = Some(status);
        // The stderr pipe may stay open a little longer in a command's leftover processes; the
        // bound keeps such a test from hanging, and the guard kills them afterwards.
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Ok(line) = self
            .stderr
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.record(line);
        }
        status
            .code()
            .unwrap_or_else(|| panic!("kafka-lock was killed by a signal: {status:?}"))
    }

    fn events(&self) -> Vec<&Value> {
        self.seen
            .iter()
            .filter_map(|l| match l {
                Line::Event(v) => Some(v),
                Line::Text(_) => None,
            })
            .collect()
    }

    fn named(&self, name: &str) -> Vec<&Value> {
        self.events()
            .into_iter()
            .filter(|v| v["event"] == name)
            .collect()
    }

    fn texts(&self) -> Vec<&str> {
        self.seen
            .iter()
            .filter_map(|l| match l {
                Line::Text(t) => Some(t.as_str()),
                Line::Event(_) => None,
            })
            .collect()
    }

    /// Kafka-lock's own failure: exactly one line, which starts with "kafka-lock: ".
    fn failure_line(&self) -> String {
        let texts = self.texts();
        assert_eq!(
            texts.len(),
            1,
            "expected exactly one non-event line on stderr, got:\n{}",
            self.transcript()
        );
        assert!(
            texts[0].starts_with("kafka-lock: "),
            "unexpected line: {}",
            texts[0]
        );
        texts[0].to_owned()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let running = self.status.is_none() && self.exited.try_recv().is_err();
        if running {
            let _ = Command::new("kill")
                .args(["-KILL", &self.pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        for pgid in self.groups.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{pgid}")])
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn mono(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("event has no numeric {field}: {v}"))
}

fn token(v: &Value) -> i64 {
    v["token"]
        .as_i64()
        .unwrap_or_else(|| panic!("event has no token: {v}"))
}

fn lock_name(prefix: &str) -> String {
    support::unique_group(&format!("cli-{prefix}"))
}

/// Runs kafka-lock to completion with no stdin and returns (status, stderr lines, stdout).
fn run_to_end<S: AsRef<std::ffi::OsStr>>(
    args: &[S],
    within: Duration,
) -> (i32, Vec<String>, String) {
    run_to_end_env(args, &[], within)
}

/// [`run_to_end`] with these variables set.
fn run_to_end_env<S: AsRef<std::ffi::OsStr>>(
    args: &[S],
    env: &[(&str, &str)],
    within: Duration,
) -> (i32, Vec<String>, String) {
    let mut cmd = kafka_lock();
    cmd.args(args.iter().map(|a| a.as_ref()))
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    let mut run = Run::watch(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}")),
        None,
    );
    let code = run.finish(within);
    let mut out = String::new();
    while let Ok(line) = run.stdout.recv_timeout(Duration::from_secs(5)) {
        out.push_str(&line);
        out.push('\n');
    }
    let lines = run.seen.iter().map(|l| match l {
        Line::Event(v) => v.to_string(),
        Line::Text(t) => t.clone(),
    });
    (code, lines.collect(), out)
}

/// CLOCK_MONOTONIC now, in nanoseconds: the clock of kafka-lock's `mono_ns` event fields.
fn mono_now() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Samples whether a process (not a child of the test) still runs, from /proc, with the
/// CLOCK_MONOTONIC reading of each sample: if the process was seen alive after another holder's
/// `acquired` event, the two provably overlapped.
struct Liveness {
    pid: u32,
    /// The start of the last sample that saw the process alive.
    last_alive_ns: Arc<AtomicU64>,
    /// The start of the last sample taken.
    last_sample_ns: Arc<AtomicU64>,
    gone: Arc<AtomicBool>,
    done: Receiver<u64>,
}

impl Liveness {
    fn watch(pid: u32) -> Liveness {
        let last_alive_ns = Arc::new(AtomicU64::new(0));
        let last_sample_ns = Arc::new(AtomicU64::new(0));
        let gone = Arc::new(AtomicBool::new(false));
        let (tx, done) = mpsc::channel();
        let (alive, sample, g) = (last_alive_ns.clone(), last_sample_ns.clone(), gone.clone());
        std::thread::spawn(move || loop {
            let at = mono_now();
            if !support::pid_alive(pid) {
                g.store(true, Ordering::SeqCst);
                sample.store(at, Ordering::SeqCst);
                let _ = tx.send(at);
                return;
            }
            alive.store(at, Ordering::SeqCst);
            sample.store(at, Ordering::SeqCst);
            // Sampling, not synchronisation: nothing announces the death of a process that is
            // not our child.
            std::thread::sleep(Duration::from_millis(5));
            if Arc::strong_count(&alive) == 1 {
                return;
            }
        });
        Liveness {
            pid,
            last_alive_ns,
            last_sample_ns,
            gone,
            done,
        }
    }

    /// Waits until the process is gone; returns when that was first seen (CLOCK_MONOTONIC).
    fn gone_within(&self, within: Duration) -> u64 {
        self.done
            .recv_timeout(within)
            .unwrap_or_else(|_| panic!("process {} still runs after {within:?}", self.pid))
    }

    /// Whether the process was seen alive at or after `t_ns`, once a sample after `t_ns` exists.
    fn seen_alive_after(&self, t_ns: u64) -> bool {
        let deadline = Instant::now() + STEP;
        while self.last_sample_ns.load(Ordering::SeqCst) <= t_ns
            && !self.gone.load(Ordering::SeqCst)
        {
            assert!(Instant::now() < deadline, "the liveness sampler stalled");
            std::thread::sleep(Duration::from_millis(5));
        }
        self.last_alive_ns.load(Ordering::SeqCst) >= t_ns
    }

    fn last_alive_ns(&self) -> u64 {
        self.last_alive_ns.load(Ordering::SeqCst)
    }

    fn is_gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst) || !support::pid_alive(self.pid)
    }
}

/// Waits for `child` to exit, at most `within`; SIGKILLs it and panics after that.
fn wait_bounded(child: Child, within: Duration) -> ExitStatus {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut child = child;
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(within) {
        Ok(Ok(status)) => status,
        other => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("process {pid} did not exit within {within:?}: {other:?}")
        }
    }
}

/// The state letter of a process in /proc (T: stopped).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// Reaps `child` with wait4(2): its status, and the CPU time it and the descendants it reaped
/// used. `None`s if it was reaped elsewhere.
fn wait_with_usage(child: &Child) -> (Option<ExitStatus>, Option<Duration>) {
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: rusage is plain old data, which wait4 fills in.
    #[allow(unsafe_code)]
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 on our own child's pid, with pointers to locals that outlive the call;
        // nothing else waits for this child (the Child is only borrowed).
        #[allow(unsafe_code)]
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            let time = |t: libc::timeval| {
                Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
            };
            let cpu = time(usage.ru_utime) + time(usage.ru_stime);
            return (Some(ExitStatus::from_raw(status)), Some(cpu));
        }
        if r == -1 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        return (None, None);
    }
}

/// The CPU time (user and system) process `pid` has used so far, from /proc.
fn cpu_so_far(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/stat: {e}"));
    // Fields 14 and 15 (utime, stime), counted after the command name's closing parenthesis.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf only reads a configuration value.
    #[allow(unsafe_code)]
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(support::unique_group(name));
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}

/// A loopback port with nothing listening on it.
fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("local address").port()
}

#[test]
fn command_runs_with_the_token_in_its_environment_and_exit_zero() {
    let lock = lock_name("env");
    // The bootstrap list comes from the environment here, as in a container.
    let mut args = vec!["run", "--lock", &lock, "--events", "json"];
    args.extend(QUICK);
    args.extend([
        "--",
        "sh",
        "-c",
        r#"printf '%s|%s|%s\n' "$KAFKA_LOCK_NAME" "$KAFKA_LOCK_TOKEN" "$KAFKA_LOCK_MEMBER_ID""#,
    ]);
    let mut run = Spec::new(&args)
        .env("KAFKA_LOCK_BOOTSTRAP", &broker().bootstrap())
        .spawn();
    let acquired = run.event("acquired", STEP);
    let code = run.finish(STEP);
    assert_eq!(code, 0, "stderr:\n{}", run.transcript());
    let line = run
        .stdout
        .recv_timeout(Duration::from_secs(10))
        .expect("the command printed its environment");
    let member = acquired["member_id"].as_str().expect("member id");
    assert_eq!(line, format!("{lock}|{}|{member}", token(&acquired)));

    let names: Vec<&str> = run
        .events()
        .iter()
        .map(|v| v["event"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(
        names,
        [
            "acquired",
            "child_started",
            "child_exited",
            "released",
            "exit"
        ],
        "{}",
        run.transcript()
    );
    let mut last = 0;
    for v in run.events() {
        assert_eq!(v["lock"], lock.as_str());
        assert_eq!(v["member_id"], member);
        assert_eq!(v["token"], acquired["token"]);
        assert!(
            v["unix_ms"].as_u64().unwrap_or(0) > 1_600_000_000_000,
            "{v}"
        );
        let m = mono(v, "mono_ns");
        assert!(m >= last, "mono_ns went backwards: {}", run.transcript());
        last = m;
    }
    let exited = &run.named("child_exited")[0];
    assert_eq!(exited["exit_code"], 0);
    assert_eq!(exited["signal"], Value::Null);
    assert!(
        run.texts().is_empty(),
        "unexpected stderr: {}",
        run.transcript()
    );
}

#[test]
fn exit_status_is_the_commands_and_128_plus_the_signal_that_ended_it() {
    let broker = broker();
    let lock = lock_name("status");
    let mut run = run_cmd(&broker.bootstrap(), &lock, QUICK, &sh("exit 3")).spawn();
    assert_eq!(run.finish(STEP), 3, "{}", run.transcript());
    assert_eq!(run.named("child_exited")[0]["exit_code"], 3);
    assert_eq!(
        run.named("released").len(),
        1,
        "a command's failure still releases the lock"
    );
    assert!(
        run.texts().is_empty(),
        "the command's own status prints nothing: {}",
        run.transcript()
    );

    let mut run = run_cmd(&broker.bootstrap(), &lock, QUICK, &sh("kill -KILL $$")).spawn();
    assert_eq!(run.finish(STEP), 128 + 9, "{}", run.transcript());
    let exited = &run.named("child_exited")[0];
    assert_eq!(exited["signal"], 9);
    assert_eq!(exited["exit_code"], Value::Null);
    assert_eq!(exited["status"], 137);
}

#[test]
fn a_command_that_cannot_run_exits_127_and_releases() {
    let lock = lock_name("enoent");
    let mut run = run_cmd(
        &broker().bootstrap(),
        &lock,
        QUICK,
        &["/nonexistent/kafka-lock-test-command"],
    )
    .spawn();
    assert_eq!(run.finish(STEP), 127, "{}", run.transcript());
    assert!(run.failure_line().contains("cannot run"));
    assert_eq!(run.named("released").len(), 1);
    assert!(run.named("child_started").is_empty());
}

/// A supervisor that cannot be started ends the run with 71 and the line it always had, with
/// the command not run and the lock free for the next run at once. The start runs beside the
/// acquire, so the failure may come before the grant (the acquire is dropped and its session
/// leaves) or after it (the lock is released); the outcome must be the same either way. Here
/// kafka-lock runs from a copy deleted after its exec: re-executing itself finds no file.
#[test]
fn a_supervisor_that_cannot_start_exits_71_runs_nothing_and_frees_the_lock() {
    let bootstrap = broker().bootstrap();
    let lock = lock_name("no-supervisor");
    let dir = scratch_dir("cli-no-supervisor");
    let copy = dir.join("kafka-lock");
    std::fs::copy(BIN, &copy).expect("copy the binary");
    let marker = dir.join("ran");
    let spec = run_cmd(
        &bootstrap,
        &lock,
        QUICK,
        &sh(&format!("touch {}", marker.display())),
    );
    let mut cmd = Command::new("setpriv");
    // Opened, deleted, then executed through the open descriptor: /proc/self/exe names a file
    // that is gone.
    cmd.args(["--pdeathsig", "KILL", "--", "sh", "-c"])
        .arg(r#"exec 3<"$0" && rm -f "$0" && exec /proc/self/fd/3 "$@""#)
        .arg(&copy)
        .args(&spec.args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    hermetic(&mut cmd);
    let mut run = Run::watch(
        cmd.spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", copy.display())),
        None,
    );
    assert_eq!(run.finish(STEP), 71, "{}", run.transcript());
    let line = run.failure_line();
    assert!(
        line.contains("cannot start the supervisor process")
            && line.contains("the command was not run"),
        "{}",
        run.transcript()
    );
    assert!(
        run.named("child_started").is_empty(),
        "{}",
        run.transcript()
    );
    assert!(!marker.exists(), "the command ran without a supervisor");
    // One try finds the lock free: no member of the failed run is left in the group.
    let mut next = run_cmd(
        &bootstrap,
        &lock,
        &["--wait", "0", "--session-timeout", "6s"],
        &["true"],
    )
    .spawn();
    assert_eq!(next.finish(STEP), 0, "{}", next.transcript());
}

/// A holder that holds until the test closes its stdin (its command is `cat`).
fn start_holder(bootstrap: &str, lock: &str, label: &str) -> (Run, Value) {
    let mut extra = vec!["--label", label];
    extra.extend(CONTENDED);
    let mut holder = run_cmd(bootstrap, lock, &extra, &sh("cat >/dev/null")).spawn();
    let acquired = holder.event("acquired", STEP);
    holder.event("child_started", STEP);
    (holder, acquired)
}

#[test]
fn not_acquired_exits_75_with_wait_zero_and_with_a_short_wait() {
    let broker = broker();
    let lock = lock_name("busy");
    let dir = scratch_dir("cli-busy");
    let (mut holder, acquired) = start_holder(&broker.bootstrap(), &lock, "busy holder");

    let marker = dir.join("ran");
    let touch = format!("touch {}", marker.display());
    let mut args = vec!["--wait", "0"];
    args.extend(CONTENDED);
    let mut once = run_cmd(&broker.bootstrap(), &lock, &args, &sh(&touch)).spawn();
    // One try is over once a generation completed without us: only the LeaveGroup is left.
    once.event("waiting", STEP);
    assert_eq!(once.finish(LEAVE), 75, "{}", once.transcript());
    let line = once.failure_line();
    assert!(line.contains("not acquired"), "{line}");
    assert!(
        line.contains("busy holder"),
        "the message names the holder: {line}"
    );
    let waiting = once.named("waiting");
    assert!(!waiting.is_empty(), "{}", once.transcript());
    assert_eq!(waiting[0]["holder"]["member_id"], acquired["member_id"]);
    assert_eq!(waiting[0]["holder"]["label"], "busy holder");

    let mut args = vec!["--wait", "2s"];
    args.extend(CONTENDED);
    let started = Instant::now();
    let mut short = run_cmd(&broker.bootstrap(), &lock, &args, &sh(&touch)).spawn();
    assert_eq!(short.finish(STEP), 75, "{}", short.transcript());
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "gave up before --wait ran out"
    );
    assert!(short.failure_line().contains("not acquired within"));
    assert!(
        !marker.exists(),
        "a command ran while another kafka-lock held the lock"
    );

    // The waiters joining and leaving never took the lock from the holder.
    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());
    assert!(
        holder.named("lost").is_empty(),
        "the holder lost the lock: {}",
        holder.transcript()
    );
}

/// How long kafka-lock may take to leave and exit once the outcome is known: one LeaveGroup on
/// loopback, with room for a loaded machine.
const LEAVE: Duration = Duration::from_secs(5);

/// `--wait 0` and `--wait 2s` on a held lock return within their documented bounds (the wait,
/// or the first generation for `--wait 0`, then the 2 s leave timeout, plus starting and
/// stopping a process) and leave no member behind, on Apache Kafka and on tansu.
fn a_bounded_wait_gives_up_in_time_and_leaves(broker: support::brokers::Broker) {
    let bootstrap = broker.bootstrap();
    let lock = lock_name("bounded");
    let (mut holder, acquired) = start_holder(&bootstrap, &lock, "bounded holder");
    let holder_id = acquired["member_id"]
        .as_str()
        .expect("member_id")
        .to_owned();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let heartbeat = Duration::from_millis(500);
    let cases = [
        ("0", broker.rebalance_bound(heartbeat)),
        ("2s", Duration::from_secs(2)),
    ];
    for (wait, waits) in cases {
        let mut args = vec!["--wait", wait];
        args.extend(CONTENDED);
        let bound = waits + LEAVE + support::brokers::SLACK;
        let started = Instant::now();
        let mut run = run_cmd(&bootstrap, &lock, &args, &["true"]).spawn();
        assert_eq!(run.finish(bound), 75, "{}", run.transcript());
        let took = started.elapsed();
        assert!(
            took < bound,
            "--wait {wait} exited after {took:?} (bound {bound:?})"
        );
        assert!(
            run.named("child_started").is_empty(),
            "{}",
            run.transcript()
        );
        // Asked a few times over one second, far less than the 6 s session after which a member
        // that never left would be gone as well.
        let mut members = Vec::new();
        for _ in 0..5 {
            members = rt.block_on(broker.members(&lock));
            if members == [holder_id.as_str()] {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(
            members,
            [holder_id.as_str()],
            "--wait {wait} left a member behind"
        );
    }
    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());
    assert!(holder.named("lost").is_empty(), "{}", holder.transcript());
}

#[test]
fn a_bounded_wait_gives_up_in_time_and_leaves_on_apache() {
    a_bounded_wait_gives_up_in_time_and_leaves(support::brokers::Broker::Apache);
}

#[test]
fn a_bounded_wait_gives_up_in_time_and_leaves_on_tansu() {
    a_bounded_wait_gives_up_in_time_and_leaves(support::brokers::Broker::Tansu);
}

/// `--wait 0` in consumer-compatible mode: the assignment there names no holder and no queue
/// position, so only the completed generation tells the single try it is over.
#[test]
fn wait_zero_answers_at_the_first_generation_in_consumer_mode() {
    let b = broker().bootstrap();
    let lock = lock_name("busy-consumer");
    support::kafka::probe::create_topic(&b, &lock, 1);
    // The range assignor gives partition 0 to the member id that sorts first; member ids start
    // with the client id, so the holder keeps it.
    let mut args = vec!["--topic", &lock, "--client-id", "a-holder"];
    args.extend(CONTENDED);
    let mut holder = run_cmd(&b, &lock, &args, &sh("cat >/dev/null")).spawn();
    holder.event("child_started", STEP);

    let mut args = vec!["--topic", &lock, "--client-id", "z-try", "--wait", "0"];
    args.extend(CONTENDED);
    let mut once = run_cmd(&b, &lock, &args, &["true"]).spawn();
    once.event("waiting", STEP);
    assert_eq!(once.finish(LEAVE), 75, "{}", once.transcript());
    assert!(once.named("child_started").is_empty());
    holder.close_stdin();
    holder.finish(STEP);
}

#[test]
fn sigterm_and_sigint_are_forwarded_and_the_lock_released_after_the_command() {
    let broker = broker();
    let lock = lock_name("signal");
    let script = r#"trap 'echo got-TERM; exit 7' TERM; echo ready; while :; do sleep 1; done"#;
    let mut run = run_cmd(&broker.bootstrap(), &lock, QUICK, &sh(script)).spawn();
    run.stdout_line("ready", STEP);
    run.signal("TERM");
    run.stdout_line("got-TERM", STEP);
    assert_eq!(
        run.finish(STEP),
        7,
        "the command's own status after it handled SIGTERM: {}",
        run.transcript()
    );
    let names: Vec<&str> = run
        .events()
        .iter()
        .map(|v| v["event"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(
        names,
        [
            "acquired",
            "child_started",
            "child_exited",
            "released",
            "exit"
        ]
    );
    // The LeaveGroup was sent and answered before kafka-lock exited: the group is empty.
    let status = status_json(&broker.bootstrap(), &lock);
    assert_eq!(
        member_count(&status),
        0,
        "still a member after exit: {status}"
    );

    // A command without a handler dies of the forwarded signal: 128 + SIGINT.
    let mut run = run_cmd(
        &broker.bootstrap(),
        &lock,
        QUICK,
        &sh("echo ready; exec sleep 600"),
    )
    .spawn();
    run.stdout_line("ready", STEP);
    run.signal("INT");
    assert_eq!(run.finish(STEP), 128 + 2, "{}", run.transcript());
    assert_eq!(run.named("child_exited")[0]["signal"], 2);
    assert_eq!(run.named("released").len(), 1);
}

#[test]
fn a_signal_while_waiting_leaves_and_exits_128_plus_n() {
    let broker = broker();
    let lock = lock_name("sigwait");
    let dir = scratch_dir("cli-sigwait");
    let (mut holder, _) = start_holder(&broker.bootstrap(), &lock, "holder");
    let marker = dir.join("ran");
    let mut waiter = run_cmd(
        &broker.bootstrap(),
        &lock,
        CONTENDED,
        &sh(&format!("touch {}", marker.display())),
    )
    .spawn();
    waiter.event("waiting", STEP);
    // The supervisor already runs while kafka-lock waits; it must be gone, reaped, when
    // kafka-lock returns.
    let early = early_supervisor(waiter.pid);
    waiter.signal("TERM");
    assert_eq!(waiter.finish(STEP), 128 + 15, "{}", waiter.transcript());
    assert_eq!(
        proc_state(early),
        None,
        "supervisor {early} outlived its run"
    );
    let line = waiter.failure_line();
    assert!(
        line.contains("SIGTERM") && line.contains("while waiting"),
        "{line}"
    );
    assert!(!marker.exists(), "the waiter ran its command");
    // It left the group: only the holder is a member.
    let status = status_json(&broker.bootstrap(), &lock);
    assert_eq!(member_count(&status), 1, "{status}");

    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());
    assert!(holder.named("lost").is_empty(), "{}", holder.transcript());
}

#[test]
fn runs_on_one_lock_never_overlap_and_tokens_increase() {
    let broker = broker();
    let lock = lock_name("exclusive");
    let runs: Vec<Run> = (0..3)
        .map(|i| {
            let label = format!("contender {i}");
            let mut extra = vec!["--label", label.as_str()];
            extra.extend(CONTENDED);
            run_cmd(&broker.bootstrap(), &lock, &extra, &sh("sleep 0.3")).spawn()
        })
        .collect();
    let mut intervals = Vec::new();
    for mut run in runs {
        assert_eq!(
            run.finish(Duration::from_secs(180)),
            0,
            "{}",
            run.transcript()
        );
        let started = run.named("child_started");
        let exited = run.named("child_exited");
        let acquired = run.named("acquired");
        let released = run.named("released");
        assert_eq!(
            (started.len(), exited.len(), acquired.len(), released.len()),
            (1, 1, 1, 1),
            "{}",
            run.transcript()
        );
        assert!(mono(acquired[0], "mono_ns") <= mono(started[0], "mono_ns"));
        assert!(mono(exited[0], "mono_ns") <= mono(released[0], "mono_ns"));
        assert!(run.named("lost").is_empty(), "{}", run.transcript());
        intervals.push((
            mono(acquired[0], "mono_ns"),
            mono(released[0], "mono_ns"),
            token(acquired[0]),
            run.transcript(),
        ));
    }
    intervals.sort_by_key(|i| i.0);
    for pair in intervals.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(
            a.1 < b.0,
            "holds overlap: one released at {} ns, the next acquired at {} ns\n{}\n--\n{}",
            a.1,
            b.0,
            a.3,
            b.3
        );
        assert!(
            b.2 > a.2,
            "token {} of a later holder is not greater than {}",
            b.2,
            a.2
        );
    }
}

/// The children of `pid` in /proc, with their command lines (NULs as spaces).
fn children_of(pid: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
            out.push((child, String::from_utf8_lossy(&cmdline).replace('\0', " ")));
        }
    }
    out
}

/// The supervisor starts while kafka-lock waits for the lock, so that its start is off the path
/// from the grant to the command; it must start nothing before the hold begins, and the command
/// must get the token of the hold it runs under, which exists only after the grant.
#[test]
fn a_waiters_supervisor_starts_early_and_runs_nothing_before_the_hold() {
    let bootstrap = broker().bootstrap();
    let lock = lock_name("early-supervisor");
    let (mut holder, held) = start_holder(&bootstrap, &lock, "first");
    let mut waiter = run_cmd(
        &bootstrap,
        &lock,
        CONTENDED,
        &sh(r#"printf '%s|%s\n' "$KAFKA_LOCK_TOKEN" "$KAFKA_LOCK_MEMBER_ID""#),
    )
    .spawn();
    waiter.event("waiting", STEP);
    let supervisors: Vec<(u32, String)> = children_of(waiter.pid)
        .into_iter()
        .filter(|(_, cmd)| cmd.contains("__supervise"))
        .collect();
    assert_eq!(
        supervisors.len(),
        1,
        "one supervisor below the waiting kafka-lock, got {supervisors:?}"
    );
    let early = supervisors[0].0;
    // The holder rejoins every rebalance within its lease; waiting through a few heartbeats
    // gives an early start of the command every chance to show.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        assert!(
            children_of(early).is_empty(),
            "the waiter's supervisor started {:?} while the lock was held by another",
            children_of(early)
        );
        assert!(
            waiter.stdout.try_recv().is_err(),
            "the waiter's command ran while the lock was held by another: {}",
            waiter.transcript()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());
    let acquired = waiter.event("acquired", STEP);
    let started = waiter.event("child_started", STEP);
    assert_eq!(waiter.finish(STEP), 0, "{}", waiter.transcript());
    assert_eq!(started["supervisor_pid"].as_u64(), Some(u64::from(early)));
    let released = &holder.named("released")[0];
    assert!(mono(&acquired, "mono_ns") > mono(released, "mono_ns"));
    assert!(mono(&started, "mono_ns") >= mono(&acquired, "mono_ns"));
    assert!(token(&acquired) > token(&held));
    let line = waiter
        .stdout
        .recv_timeout(STEP)
        .expect("the command printed its environment");
    assert_eq!(
        line,
        format!(
            "{}|{}",
            token(&acquired),
            acquired["member_id"].as_str().unwrap_or("?")
        )
    );
    // The supervisor ended with the run.
    assert_eq!(
        proc_state(early),
        None,
        "supervisor {early} outlived its run"
    );
}

/// The one supervisor below a waiting kafka-lock.
fn early_supervisor(kafka_lock: u32) -> u32 {
    let supervisors: Vec<(u32, String)> = children_of(kafka_lock)
        .into_iter()
        .filter(|(_, cmd)| cmd.contains("__supervise"))
        .collect();
    assert_eq!(
        supervisors.len(),
        1,
        "one supervisor below the waiting kafka-lock, got {supervisors:?}"
    );
    supervisors[0].0
}

/// kafka-lock SIGKILLed while it waits: its early supervisor sees end of file, exits at once,
/// and never starts the command, even once the lock is free.
#[test]
fn a_waiter_killed_while_waiting_leaves_no_supervisor_and_runs_nothing() {
    let bootstrap = broker().bootstrap();
    let lock = lock_name("killed-waiter");
    let dir = scratch_dir("cli-killed-waiter");
    let marker = dir.join("ran");
    let (mut holder, _) = start_holder(&bootstrap, &lock, "holder");
    let mut waiter = run_cmd(
        &bootstrap,
        &lock,
        CONTENDED,
        &sh(&format!("touch {}", marker.display())),
    )
    .spawn();
    waiter.event("waiting", STEP);
    let early = Liveness::watch(early_supervisor(waiter.pid));
    waiter.signal("KILL");
    early.gone_within(STEP);
    // Only the supervisor could have started the command; with it gone, the marker's absence
    // now is final, and freeing the lock cannot change it.
    assert!(!marker.exists(), "the killed waiter's command ran");
    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());
    assert!(!marker.exists(), "the killed waiter's command ran");
}

/// A holder behind a proxy that can cut it off from the broker: a private Apache Kafka advertises
/// the proxy's address, so the coordinator connections pass through it too.
fn partitioned_holder(extra: &[&str], script: &str) -> (Arc<Proxy>, KafkaCluster, Run, Value) {
    let proxy = Arc::new(Proxy::start());
    let forward = proxy.clone();
    let broker = KafkaCluster::start(
        KafkaOptions::single_node()
            .property(
                "advertised.listeners",
                format!("PLAINTEXT://127.0.0.1:{}", proxy.port()),
            )
            .on_ports(move |ports| forward.set_target(([127, 0, 0, 1], ports[0]).into())),
    );
    let lock = lock_name("partition");
    let mut run = run_cmd(&proxy.bootstrap(), &lock, extra, &sh(script)).spawn();
    let acquired = run.event("acquired", STEP);
    run.stdout_line("ready", STEP);
    (proxy, broker, run, acquired)
}

#[test]
fn the_command_is_stopped_when_the_lease_runs_out_and_kafka_lock_exits_74() {
    // The shell's own stderr is silenced: it reports its killed `sleep` there, and the test
    // checks that kafka-lock's stderr holds exactly one line of its own.
    let script = r#"exec 2>/dev/null; trap 'echo got-TERM; exit 0' TERM; echo ready; while :; do sleep 1; done"#;
    let (proxy, _broker, mut run, _) = partitioned_holder(
        &[
            "--session-timeout",
            "6s",
            "--kill-grace",
            "1s",
            "--request-timeout",
            "2s",
        ],
        script,
    );
    let (session, grace) = (Duration::from_secs(6), Duration::from_secs(1));
    let cut = Instant::now();
    let cut_ns = mono_now();
    proxy.blackhole();
    let lost = run.event("lost", STEP);
    let detected = cut.elapsed();
    assert_eq!(lost["reason"], "lease_expired", "{lost}");
    let lease_end = mono(&lost, "lease_end_mono_ns");
    assert!(
        lease_end <= mono(&lost, "mono_ns"),
        "reported before the lease ended: {lost}"
    );
    // The lease is session − margin from the last renewal; the bound only catches a holder that
    // keeps running long after its lease.
    assert!(
        detected < Duration::from_secs(20),
        "loss noticed only after {detected:?}"
    );
    run.stdout_line("got-TERM", STEP);
    assert_eq!(run.finish(STEP), 74, "{}", run.transcript());
    let exited = &run.named("child_exited")[0];
    assert_eq!(
        exited["exit_code"], 0,
        "the command ended through its handler: {exited}"
    );
    // It was not stopped before its lease ended, and (ending through its SIGTERM handler with
    // status 0 rather than by SIGKILL) not later than a grace after it.
    let exited_at = mono(exited, "mono_ns");
    assert!(
        exited_at >= lease_end,
        "the command was stopped before its lease ended: {}",
        run.transcript()
    );
    assert!(
        exited_at <= lease_end + grace.as_nanos() as u64,
        "the command's end was reported {} ms after its lease ended, past the {grace:?} grace: {}",
        (exited_at - lease_end) / 1_000_000,
        run.transcript()
    );
    // And, from nothing kafka-lock says: before the broker may give the lock away, a session
    // timeout after the last heartbeat that got through the proxy.
    assert!(
        exited_at <= cut_ns + session.as_nanos() as u64,
        "the command ended {} ms after the holder was cut off; the broker may give the lock \
         away {} ms after it",
        (exited_at - cut_ns) / 1_000_000,
        session.as_millis()
    );
    assert!(
        run.named("released").is_empty(),
        "a lost lock is not released: {}",
        run.transcript()
    );
    let line = run.failure_line();
    assert!(line.contains("lost lock"), "{line}");
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace() {
    // SIG_IGN survives exec, so the `sleep` children ignore SIGTERM too.
    let script = r#"exec 2>/dev/null; trap '' TERM; echo ready; while :; do sleep 1; done"#;
    let (proxy, _broker, mut run, _) = partitioned_holder(
        &[
            "--session-timeout",
            "6s",
            "--kill-grace",
            "1500ms",
            "--request-timeout",
            "2s",
        ],
        script,
    );
    proxy.blackhole();
    let lost = run.event("lost", STEP);
    let exited = run.event("child_exited", STEP);
    assert_eq!(exited["signal"], 9, "{exited}");
    // SIGTERM goes out at the lease end at the earliest (the supervisor's own deadline, or
    // kafka-lock's STOP when it sees the lease end), SIGKILL one grace after SIGTERM, and the
    // command's end is reported after it died: so its report comes at least a grace after the
    // lease end, however late kafka-lock itself got to report the loss.
    let grace_ns =
        i128::from(mono(&exited, "mono_ns")) - i128::from(mono(&lost, "lease_end_mono_ns"));
    assert!(
        grace_ns >= 1_500_000_000,
        "the command died {grace_ns} ns after the lease end, before the 1.5 s grace"
    );
    assert_eq!(run.finish(STEP), 74, "{}", run.transcript());
    assert!(run.failure_line().contains("SIGKILL after 1s 500ms"));
}

/// After a SIGTERM passed on to a command that ignores it, kafka-lock waits out the grace with a
/// deadline set (the SIGKILL); it sleeps until then. A hold that does not wait for its deadline
/// spins on its one runtime thread for the whole grace, about a core's worth of CPU: the CPU it
/// used from the SIGTERM to its exit stays well under a quarter of the grace.
#[test]
fn kafka_lock_waits_out_the_grace_after_a_sigterm_without_spinning() {
    let broker = broker();
    let lock = lock_name("grace-idle");
    let grace = Duration::from_secs(6);
    let mut run = run_cmd(
        &broker.bootstrap(),
        &lock,
        &["--session-timeout", "30s", "--kill-grace", "6s"],
        &sh("exec 2>/dev/null; trap '' TERM; echo ready; exec sleep 600"),
    )
    .spawn();
    run.event("child_started", STEP);
    run.stdout_line("ready", STEP);
    let before = cpu_so_far(run.pid);
    let termed = Instant::now();
    run.signal("TERM");
    let exited = run.event("child_exited", grace + STEP);
    assert_eq!(exited["signal"], 9, "{}", run.transcript());
    assert_eq!(run.finish(STEP), 137, "{}", run.transcript());
    let wall = termed.elapsed();
    let cpu = run.cpu_time().saturating_sub(before);
    eprintln!("kafka-lock used {cpu:?} of CPU in the {wall:?} from the SIGTERM to its exit");
    assert!(wall >= grace, "SIGKILL came {wall:?} after the SIGTERM");
    assert!(
        cpu < grace / 4,
        "kafka-lock used {cpu:?} of CPU in the {wall:?} after the SIGTERM: it did not sleep \
         until the grace's end"
    );
}

/// A pseudo-terminal: its master end, and its slave end opened without becoming the test's
/// controlling terminal.
fn pty() -> (OwnedFd, std::fs::File) {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    // SAFETY: posix_openpt returns a new descriptor we own (or -1, checked).
    #[allow(unsafe_code)]
    let fd = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    assert!(fd >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
    // SAFETY: fd is open and owned by nothing else.
    #[allow(unsafe_code)]
    let master = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: calls on the open master; ptsname_r writes at most name.len() bytes, NUL included.
    #[allow(unsafe_code)]
    let ok = unsafe {
        libc::grantpt(fd) == 0
            && libc::unlockpt(fd) == 0
            && libc::ptsname_r(fd, name.as_mut_ptr(), name.len()) == 0
    };
    assert!(ok, "the pty's slave: {}", std::io::Error::last_os_error());
    // SAFETY: ptsname_r succeeded, so name holds a NUL-terminated path.
    #[allow(unsafe_code)]
    let path = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_str()
        .expect("a pty path")
        .to_owned();
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    (master, slave)
}

/// Run from a terminal, kafka-lock hands it to the command (whose group is then the foreground
/// one, so it can read it) and takes it back once the command has ended: kafka-lock's group is
/// the foreground one again while it stops what the command left (a process ignoring SIGTERM,
/// which keeps kafka-lock there for the grace) and releases. Here kafka-lock leads the session
/// the terminal belongs to, as a login shell would (setsid, then TIOCSCTTY on its stdin).
#[test]
fn the_terminal_is_the_commands_while_it_runs_and_kafka_locks_after() {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let broker = broker();
    let lock = lock_name("terminal");
    let (master, slave) = pty();
    let spec = run_cmd(
        &broker.bootstrap(),
        &lock,
        &["--session-timeout", "20s", "--kill-grace", "5s"],
        &sh("exec 2>/dev/null; trap '' TERM; sleep 600 & echo ready; read line; exit 0"),
    );
    let mut cmd = kafka_lock();
    cmd.args(&spec.args)
        .stdin(Stdio::from(slave))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setsid and ioctl are async-signal-safe, and touch only the child being started.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() == -1 || libc::ioctl(0, libc::TIOCSCTTY, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut run = Run::watch(
        cmd.spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN} on a terminal: {e}")),
        None,
    );
    let started = run.event("child_started", STEP);
    let child = started["child_pid"].as_u64().expect("child pid") as i32;
    run.stdout_line("ready", STEP);
    let foreground = || {
        rustix::termios::tcgetpgrp(master.as_fd())
            .map(|p| p.as_raw_nonzero().get())
            .unwrap_or_else(|e| panic!("the terminal's foreground group: {e}"))
    };
    assert_eq!(
        foreground(),
        child,
        "the command's group was not given the terminal"
    );
    let mut tty = std::fs::File::from(master.try_clone().expect("the pty's master"));
    tty.write_all(b"go\n")
        .expect("a line to the command on the terminal");
    run.event("child_exited", STEP);
    let after = foreground();
    assert!(
        run.exited.try_recv().is_err(),
        "kafka-lock exited before the terminal was looked at: {}",
        run.transcript()
    );
    assert_eq!(
        after, run.pid as i32,
        "the terminal's foreground group after the command is not kafka-lock's"
    );
    assert_eq!(run.finish(STEP), 0, "{}", run.transcript());
}

/// A shell script that leaves processes behind, then ends with `last`: one process in the
/// command's process group, one that left it with setsid and was orphaned when the subshell
/// that started it exited (so it is re-parented to the nearest child subreaper). setsid does
/// not fork here (it is not a group leader), so `$!` is the orphan's pid. The script prints
/// both pids before `ready`.
fn leaves_processes(last: &str) -> String {
    format!(
        r#"sleep 300 & echo "group $!"
(setsid sleep 300 & echo "orphan $!")
echo ready; {last}"#
    )
}

/// Reads the `group PID` and `orphan PID` lines of [`leaves_processes`] and its `ready`.
fn left_behind(run: &mut Run) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut ready = false;
    let deadline = Instant::now() + STEP;
    while pids.len() < 2 || !ready {
        let line = run
            .stdout
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|e| {
                panic!(
                    "the command did not print its pids ({e:?}): {}",
                    run.transcript()
                )
            });
        match line.split_once(' ') {
            Some((_, pid)) => pids.push(pid.parse().expect("a pid")),
            None => ready |= line == "ready",
        }
    }
    pids
}

/// Old code: PR_SET_PDEATHSIG reached only the direct child; the sleep in its group and the
/// orphan kept running after a SIGKILL of kafka-lock.
#[test]
fn killing_kafka_lock_stops_everything_the_command_started() {
    let lock = lock_name("sigkill");
    let mut run = run_cmd(
        &broker().bootstrap(),
        &lock,
        &["--session-timeout", "6s", "--kill-grace", "1s"],
        &sh(&leaves_processes("exec sleep 600")),
    )
    .spawn();
    let started = run.event("child_started", STEP);
    let command = started["child_pid"].as_u64().expect("child pid") as u32;
    let mut pids = left_behind(&mut run);
    pids.push(command);
    let watched: Vec<Liveness> = pids.iter().map(|p| Liveness::watch(*p)).collect();
    let killed = Instant::now();
    run.signal("KILL");
    // The supervisor sees end of file at once and stops the tree: SIGTERM, SIGKILL after the 1 s
    // grace. The bound adds a generous allowance for a loaded machine.
    for w in &watched {
        w.gone_within(Duration::from_secs(1) + Duration::from_secs(15));
    }
    // Everything that held the command's stdout is gone, the supervisor included.
    let deadline = Instant::now() + STEP;
    loop {
        match run
            .stdout
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            Ok(_) => {}
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {
                panic!("something still holds the command's stdout {:?} after kafka-lock was SIGKILLed", killed.elapsed())
            }
        }
    }
}

/// The command inherits no socket: kafka-lock's end of the socket to the supervisor is
/// close-on-exec, so neither the supervisor nor the command holds it. A command holding it could
/// speak to the supervisor as kafka-lock (a lease end of its own) or read what the supervisor
/// tells kafka-lock, and would keep the socket open after kafka-lock died, so the supervisor
/// would not see the end of file that stops the command at once.
#[test]
fn the_command_inherits_no_socket() {
    let lock = lock_name("nosocket");
    let bootstrap = broker().bootstrap();
    let mut args = vec!["run", "--bootstrap", &bootstrap, "--lock", &lock];
    args.extend(QUICK);
    args.extend([
        "--",
        "sh",
        "-c",
        r#"for f in /proc/$$/fd/*; do printf '%s ' "$(readlink "$f")"; done; echo"#,
    ]);
    let (code, stderr, out) = run_to_end(&args, STEP);
    assert_eq!(code, 0, "{stderr:?}");
    // The listing worked: the command's stdout is the test's pipe.
    assert!(out.contains("pipe:"), "{out}");
    assert!(
        !out.contains("socket:"),
        "the command inherited a socket: {out}"
    );
}

#[test]
fn an_unreachable_cluster_exits_69_within_the_connect_timeouts() {
    let lock = lock_name("unreachable");
    let dead = format!("127.0.0.1:{}", dead_port());
    let started = Instant::now();
    let (code, stderr, _) = run_to_end(
        &[
            "run",
            "--bootstrap",
            &dead,
            "--lock",
            &lock,
            "--connect-timeout",
            "1s",
            "--",
            "true",
        ],
        STEP,
    );
    assert_eq!(code, 69, "{stderr:?}");
    assert_eq!(stderr.len(), 1, "{stderr:?}");
    assert!(stderr[0].contains(&dead), "{stderr:?}");
    assert!(started.elapsed() < Duration::from_secs(20));

    // A broker that accepts connections but never answers: only the timeouts end the attempt.
    let silent = Proxy::start();
    silent.blackhole();
    let started = Instant::now();
    let (code, stderr, _) = run_to_end(
        &[
            "run",
            "--bootstrap",
            &silent.bootstrap(),
            "--lock",
            &lock,
            "--connect-timeout",
            "1s",
            "--",
            "true",
        ],
        STEP,
    );
    let took = started.elapsed();
    assert_eq!(code, 69, "{stderr:?}");
    assert_eq!(stderr.len(), 1, "{stderr:?}");
    assert!(
        took >= Duration::from_secs(1),
        "gave up before one connect timeout: {took:?}"
    );
    // Three rounds of one 1 s attempt plus backoff; the bound only rules out waiting forever.
    assert!(
        took < Duration::from_secs(20),
        "took {took:?} with --connect-timeout 1s"
    );
    assert!(silent.accepted() >= 1);
    drop(silent);

    let (code, stderr, _) = run_to_end(&["status", "--bootstrap", &dead, "--lock", &lock], STEP);
    assert_eq!(code, 69, "{stderr:?}");
    assert_eq!(stderr.len(), 1, "{stderr:?}");
}

/// In a PID namespace whose /proc is another namespace's (`unshare --pid` without
/// `--mount-proc`), the pids /proc lists are not this namespace's: the stop could not find the
/// command's processes, and would signal whatever has those pids here. kafka-lock refuses (71)
/// before it joins or runs anything.
#[test]
fn a_proc_of_another_pid_namespace_is_refused_before_the_command_runs() {
    let lock = lock_name("foreign-proc");
    let dir = scratch_dir("foreign-proc");
    let ran = dir.join("ran");
    let mut cmd = Command::new("setpriv");
    cmd.args(["--pdeathsig", "KILL", "--", "unshare"])
        .args([
            "--map-root-user",
            "--pid",
            "--fork",
            "--kill-child",
            "--",
            BIN,
        ])
        .args(["run", "--bootstrap", "127.0.0.1:9", "--lock", &lock, "--"])
        .args(["sh", "-c", &format!("touch {}", ran.display())]);
    hermetic(&mut cmd);
    let mut run = Run::watch(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run unshare (util-linux) to give kafka-lock a PID namespace of its own"),
        None,
    );
    let code = run.finish(STEP);
    assert_eq!(code, 71, "{}", run.transcript());
    let line = run.failure_line();
    assert!(
        line.contains("belongs to another PID namespace") && line.contains("not run"),
        "{line}"
    );
    assert!(!ran.exists(), "the command ran: {}", run.transcript());
}

#[test]
fn invalid_or_rejected_settings_exit_78() {
    let broker = broker();
    let b = broker.bootstrap();
    let lock = lock_name("config");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--session-timeout", "6s", "--heartbeat-interval", "10s"],
            "--heartbeat-interval",
        ),
        (
            vec!["--session-timeout", "6s", "--kill-grace", "6s"],
            "--kill-grace",
        ),
        (vec!["--lease-margin", "20s"], "--lease-margin"),
        // Issue: a margin shorter than the grace let the command outlive the lease by the
        // difference (old code: accepted, the command ran and kafka-lock exited 0).
        (
            vec!["--kill-grace", "2s", "--lease-margin", "1s"],
            "--lease-margin",
        ),
        (
            vec!["--rebalance-timeout", "2s", "--kill-grace", "2s"],
            "--kill-grace",
        ),
        // Issue: absurd durations overflowed an Instant and panicked (old code: exit 101 in a
        // debug build, an abort in the release build).
        (vec!["--wait", "300000000000y"], "--wait"),
        (vec!["--wait", "99999999999999999999999y"], "--wait"),
        (
            vec!["--connect-timeout", "300000000000y"],
            "--connect-timeout",
        ),
        (
            vec!["--request-timeout", "300000000000y"],
            "--request-timeout",
        ),
        (
            vec!["--heartbeat-interval", "300000000000y"],
            "--heartbeat-interval",
        ),
        (vec!["--kill-grace", "300000000000y"], "--kill-grace"),
        (
            vec!["--session-timeout", "300000000000y"],
            "--session-timeout",
        ),
    ];
    for (extra, flag) in cases {
        let mut args = vec!["run", "--bootstrap", &b, "--lock", &lock];
        args.extend(&extra);
        args.extend(["--", "true"]);
        let (code, stderr, _) = run_to_end(&args, STEP);
        assert_eq!(code, 78, "{extra:?}: {stderr:?}");
        assert_eq!(stderr.len(), 1, "{stderr:?}");
        assert!(stderr[0].contains(flag), "{stderr:?}");
    }
    let (code, stderr, _) = run_to_end(
        &["run", "--bootstrap", &b, "--lock", "", "--", "true"],
        STEP,
    );
    assert_eq!(code, 78, "empty lock name: {stderr:?}");
    let (code, stderr, _) = run_to_end(
        &[
            "status",
            "--bootstrap",
            &b,
            "--lock",
            &lock,
            "--connect-timeout",
            "300000000000y",
        ],
        STEP,
    );
    assert_eq!(code, 78, "{stderr:?}");
    assert!(stderr[0].contains("--connect-timeout"), "{stderr:?}");

    // Consumer-compatible mode refuses topics that cannot be a lock.
    let wide = lock_name("wide-topic");
    support::kafka::probe::create_topic(&b, &wide, 3);
    let (code, stderr, _) = run_to_end(
        &[
            "run",
            "--bootstrap",
            &b,
            "--lock",
            &lock,
            "--topic",
            &wide,
            "--",
            "true",
        ],
        STEP,
    );
    assert_eq!(code, 78, "{stderr:?}");
    assert!(stderr[0].contains("3 partitions"), "{stderr:?}");
    let missing = lock_name("missing-topic");
    let (code, stderr, _) = run_to_end(
        &[
            "run",
            "--bootstrap",
            &b,
            "--lock",
            &lock,
            "--topic",
            &missing,
            "--",
            "true",
        ],
        STEP,
    );
    assert_eq!(code, 78, "{stderr:?}");
    assert!(stderr[0].contains("does not exist"), "{stderr:?}");
}

#[test]
fn a_setting_the_broker_rejects_exits_78() {
    let b = broker().bootstrap();
    // Apache Kafka refuses a session timeout below group.min.session.timeout.ms (6 s by default)
    // with INVALID_SESSION_TIMEOUT; the message names the broker setting to change.
    let lock = lock_name("short-session");
    let (code, stderr, _) = run_to_end(
        &[
            "run",
            "--bootstrap",
            &b,
            "--lock",
            &lock,
            "--session-timeout",
            "3s",
            "--",
            "true",
        ],
        STEP,
    );
    assert_eq!(code, 78, "{stderr:?}");
    assert_eq!(stderr.len(), 1, "{stderr:?}");
    assert!(stderr[0].contains("INVALID_SESSION_TIMEOUT"), "{stderr:?}");
    assert!(
        stderr[0].contains("group.min.session.timeout.ms"),
        "{stderr:?}"
    );

    // A member whose protocol differs from the group's (a consumer-mode run on a natively held
    // lock) is refused with INCONSISTENT_GROUP_PROTOCOL.
    let lock = lock_name("protocol");
    let topic = lock_name("protocol-topic");
    support::kafka::probe::create_topic(&b, &topic, 1);
    let (mut holder, _) = start_holder(&b, &lock, "native holder");
    let mut args = vec!["run", "--bootstrap", &b, "--lock", &lock, "--topic", &topic];
    args.extend(CONTENDED);
    args.extend(["--", "true"]);
    let (code, stderr, _) = run_to_end(&args, STEP);
    assert_eq!(code, 78, "{stderr:?}");
    assert_eq!(stderr.len(), 1, "{stderr:?}");
    assert!(
        stderr[0].contains("INCONSISTENT_GROUP_PROTOCOL"),
        "{stderr:?}"
    );
    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());
}

#[test]
fn usage_errors_exit_64_and_help_exits_0() {
    let cases: Vec<Vec<&str>> = vec![
        vec![],
        vec!["frobnicate"],
        vec!["run", "--bootstrap", "127.0.0.1:9", "--lock", "x"],
        vec!["run", "--bootstrap", "127.0.0.1:9", "--", "true"],
        vec!["run", "--lock", "x", "--", "true"],
        vec![
            "run",
            "--bootstrap",
            "127.0.0.1:9",
            "--lock",
            "x",
            "--wait",
            "soon",
            "--",
            "true",
        ],
        vec![
            "run",
            "--bootstrap",
            "127.0.0.1:9",
            "--lock",
            "x",
            "--events",
            "xml",
            "--",
            "true",
        ],
        vec![
            "run",
            "--bootstrap",
            "127.0.0.1:9",
            "--lock",
            "x",
            "--bogus",
            "--",
            "true",
        ],
        vec!["status", "--bootstrap", "127.0.0.1:9"],
    ];
    for args in cases {
        let (code, stderr, _) = run_to_end(&args, STEP);
        assert_eq!(code, 64, "{args:?}: {stderr:?}");
        assert_eq!(stderr.len(), 1, "{args:?}: {stderr:?}");
        assert!(stderr[0].starts_with("kafka-lock: "), "{stderr:?}");
    }
    for args in [
        vec!["--help"],
        vec!["run", "--help"],
        vec!["status", "--help"],
        vec!["--version"],
    ] {
        let (code, stderr, stdout) = run_to_end(&args, STEP);
        assert_eq!(code, 0, "{args:?}: {stderr:?}");
        assert!(!stdout.is_empty(), "{args:?} printed nothing");
    }
}

/// `status --json`, whose exit status must agree with what it printed: 0 held, 3 free, 4 unknown.
fn status_json(bootstrap: &str, lock: &str) -> Value {
    let (code, stderr, stdout) = run_to_end(
        &["status", "--bootstrap", bootstrap, "--lock", lock, "--json"],
        STEP,
    );
    let s: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("status --json printed invalid JSON ({e}): {stdout}"));
    let expected = match (&s["holder_known"], s["holder"].is_object()) {
        (Value::Bool(true), true) => 0,
        (Value::Bool(true), false) => 3,
        _ => 4,
    };
    assert_eq!(code, expected, "{s} {stderr:?}");
    s
}

fn member_count(status: &Value) -> usize {
    let list = if status["holder_known"] == true {
        &status["waiters"]
    } else {
        &status["members"]
    };
    let others = list.as_array().map_or(0, Vec::len);
    others + usize::from(status["holder"].is_object())
}

/// Apache Kafka's DescribeGroups carries every member's metadata and assignment, and from those
/// `status` names the holder, its label and token, and the queue in order.
#[test]
fn status_names_the_holder_its_token_and_the_queue() {
    let b = broker().bootstrap();
    let lock = lock_name("describe");

    let empty = status_json(&b, &lock);
    assert_eq!(empty["lock"], lock.as_str());
    assert_eq!(member_count(&empty), 0, "{empty}");
    assert_eq!(empty["holder"], Value::Null);

    let (mut holder, acquired) = start_holder(&b, &lock, "status holder");
    let mut waiters = Vec::new();
    for label in ["first waiter", "second waiter"] {
        let mut extra = vec!["--label", label];
        extra.extend(CONTENDED);
        let mut w = run_cmd(&b, &lock, &extra, &["true"]).spawn();
        // Queued before the next one starts, so the queue order is known.
        wait_for_position(&mut w, waiters.len() as i64 + 1);
        waiters.push(w);
    }

    let s = status_json(&b, &lock);
    assert_eq!(s["protocol_type"], "kafka-lock", "{s}");
    assert_eq!(s["holder_known"], true, "{s}");
    assert_eq!(member_count(&s), 3, "{s}");
    let holder_id = acquired["member_id"].as_str().expect("member id");
    assert_eq!(s["holder"]["member_id"], holder_id, "{s}");
    assert_eq!(s["holder"]["label"], "status holder", "{s}");
    // Without a ledger read the fencing token is unknown to status; the generation is not
    // given in its place.
    assert!(
        s["holder"]["generation"].as_i64() >= acquired["generation"].as_i64(),
        "{s}"
    );
    assert_eq!(s["holder"]["token"], Value::Null, "{s}");
    let queue: Vec<&str> = s["waiters"]
        .as_array()
        .expect("waiters")
        .iter()
        .map(|w| w["label"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(queue, ["first waiter", "second waiter"], "{s}");
    let (code, stderr, text) = run_to_end(&["status", "--bootstrap", &b, "--lock", &lock], STEP);
    assert_eq!(code, 0, "{stderr:?}");
    assert!(text.contains(holder_id), "{text}");
    assert!(text.contains("holder: status holder"), "{text}");

    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());
    // The first waiter takes over and its command (`true`) ends at once, then the second.
    let mut last = token(&acquired);
    for mut w in waiters {
        let next = w.event("acquired", STEP);
        assert!(token(&next) > last);
        last = token(&next);
        assert_eq!(w.finish(STEP), 0, "{}", w.transcript());
    }
}

/// A label with control characters is refused (78) without being echoed; text a peer chose (its
/// member id, which Apache makes from its client id) reaches `status`'s human output escaped,
/// never as the escape sequences themselves. Fails if labels are checked for length only, or if
/// `status` prints member ids raw.
#[test]
fn peer_text_reaches_the_terminal_escaped_and_labels_are_printable() {
    let b = broker().bootstrap();
    let lock = lock_name("escape");
    let evil = "job \u{1b}]0;owned\u{7}\u{1b}[2J\u{1b}[31mRED\r\nholder: fake";
    let (code, stderr, _) = run_to_end(
        &[
            "run",
            "--bootstrap",
            &b,
            "--lock",
            &lock,
            "--label",
            evil,
            "--",
            "true",
        ],
        STEP,
    );
    assert_eq!(code, 78, "{stderr:?}");
    let all = stderr.concat();
    assert!(all.contains("control character"), "{all}");
    assert!(!all.contains('\u{1b}') && !all.contains("owned"), "{all:?}");

    // Apache accepts any client id and makes the member id from it.
    let mut extra = vec!["--client-id", evil];
    extra.extend(QUICK);
    let mut holder = run_cmd(&b, &lock, &extra, &["cat"]).spawn();
    holder.event("child_started", STEP);
    let (code, stderr, text) = run_to_end(&["status", "--bootstrap", &b, "--lock", &lock], STEP);
    assert_eq!(code, 0, "{stderr:?}");
    assert!(
        !text.contains(|c: char| c.is_control() && c != '\n'),
        "status printed control characters: {text:?}"
    );
    assert!(
        text.contains("job \\u{1b}]0;owned\\u{7}\\u{1b}[2J\\u{1b}[31mRED\\u{d}\\u{a}holder: fake"),
        "{text}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("holder: fake")),
        "{text}"
    );
    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());
}

/// Waits until `run` reports the given place in the queue.
fn wait_for_position(run: &mut Run, position: i64) {
    let deadline = Instant::now() + STEP;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = run.event("waiting", left);
        if ev["position"].as_i64() == Some(position) {
            return;
        }
    }
}

/// tansu's DescribeGroups carries no member metadata or assignments: a real broker on which
/// `status` cannot know the holder, and must say so rather than guess.
#[test]
fn status_says_so_when_the_broker_reports_no_assignments() {
    let tansu = support::broker();
    let b = tansu.bootstrap();
    let lock = lock_name("describe-tansu");
    let (mut holder, acquired) = start_holder(&b, &lock, "status holder");
    let s = status_json(&b, &lock);
    assert_eq!(s["holder_known"], false, "{s}");
    assert_eq!(
        s["holder_unknown_reason"], "the broker does not report member assignments",
        "{s}"
    );
    let holder_id = acquired["member_id"].as_str().expect("member id");
    let ids: HashSet<&str> = s["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter_map(|m| m["member_id"].as_str())
        .collect();
    assert!(ids.contains(holder_id), "{s}");
    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());
}

/// The seed design's first failure: a paused holder (a GC pause, a stopped VM) woke up still
/// believing it held the lock. Here the holder's kafka-lock is frozen with SIGSTOP for longer than
/// its session, another contender takes the lock, and the holder is resumed. Its lease must have
/// ended before the new holder acquired, it must report the loss at once with that lease end,
/// stop its command, and exit 74; the new holder's token is greater.
#[test]
fn a_paused_holder_wakes_up_to_a_lost_lock_that_ended_before_the_next_holder_began() {
    let broker = broker();
    let lock = lock_name("paused");
    let (mut paused, acquired) = start_holder(&broker.bootstrap(), &lock, "paused");
    let mut extra = vec!["--label", "next"];
    extra.extend(CONTENDED);
    let mut next = run_cmd(&broker.bootstrap(), &lock, &extra, &sh("cat >/dev/null")).spawn();
    next.event("waiting", STEP);

    paused.signal("STOP");
    let next_acquired = next.event("acquired", Duration::from_secs(90));
    paused.signal("CONT");

    let lost = paused.event("lost", STEP);
    assert_eq!(paused.finish(STEP), 74, "{}", paused.transcript());
    assert_eq!(lost["reason"], "lease_expired", "{}", paused.transcript());
    let lease_end = mono(&lost, "lease_end_mono_ns");
    assert!(
        lease_end < mono(&next_acquired, "mono_ns"),
        "the paused holder's lease ended at {lease_end} ns, after the next holder acquired at {} ns\n{}",
        mono(&next_acquired, "mono_ns"),
        paused.transcript()
    );
    assert!(
        token(&next_acquired) > token(&acquired),
        "{}",
        next.transcript()
    );
    let exited = paused.named("child_exited");
    assert_eq!(
        exited.len(),
        1,
        "the command was stopped: {}",
        paused.transcript()
    );
    next.close_stdin();
    assert_eq!(next.finish(STEP), 0, "{}", next.transcript());
}

/// Issue: after the command exited, the lock was released while what it had started kept
/// running (old code: `sh -c 'sleep 300 & exit 0'` exited 0, released, and the sleep ran on).
#[test]
fn what_an_exited_command_left_running_is_stopped_before_the_release() {
    let broker = broker();
    let lock = lock_name("leftovers");
    let mut run = run_cmd(
        &broker.bootstrap(),
        &lock,
        QUICK,
        &sh(&leaves_processes("exit 0")),
    )
    .spawn();
    let pids = left_behind(&mut run);
    run.event("released", STEP);
    // `released` is printed only once the supervisor said every descendant was gone.
    for pid in &pids {
        assert!(
            !support::pid_alive(*pid),
            "process {pid} the command started still runs after the release:\n{}",
            run.transcript()
        );
    }
    assert_eq!(run.finish(STEP), 0, "{}", run.transcript());
    let names: Vec<&str> = run
        .events()
        .iter()
        .map(|v| v["event"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(
        names,
        [
            "acquired",
            "child_started",
            "child_exited",
            "released",
            "exit"
        ]
    );
    let status = status_json(&broker.bootstrap(), &lock);
    assert_eq!(member_count(&status), 0, "{status}");
}

/// If the supervisor dies, kafka-lock (a subreaper too) inherits the command's tree, stops it,
/// then releases the lock and exits 71.
#[test]
fn a_dead_supervisor_is_replaced_by_kafka_lock_stopping_everything_then_releasing() {
    let broker = broker();
    let lock = lock_name("supervisor-dies");
    let mut run = run_cmd(
        &broker.bootstrap(),
        &lock,
        &["--session-timeout", "6s", "--kill-grace", "1s"],
        &sh(&leaves_processes("exec sleep 600")),
    )
    .spawn();
    let started = run.event("child_started", STEP);
    let supervisor = started["supervisor_pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no supervisor_pid: {started}"));
    let mut pids = left_behind(&mut run);
    pids.push(started["child_pid"].as_u64().expect("child pid") as u32);
    let ok = Command::new("kill")
        .args(["-KILL", &supervisor.to_string()])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill -KILL {supervisor}");
    assert_eq!(run.finish(STEP), 71, "{}", run.transcript());
    for pid in &pids {
        assert!(
            !support::pid_alive(*pid),
            "process {pid} outlived the supervisor and kafka-lock:\n{}",
            run.transcript()
        );
    }
    let line = run.failure_line();
    assert!(line.contains("supervisor"), "{line}");
    // Of all the exits kafka-lock reaped, the line names the supervisor's own (the SIGKILL
    // above) and the event the command's own (the SIGTERM of kafka-lock's stop).
    assert!(
        line.contains("failed: it exited unexpectedly (SIGKILL);"),
        "{line}"
    );
    let exited = run.named("child_exited");
    assert_eq!(exited.len(), 1, "{}", run.transcript());
    assert_eq!(exited[0]["signal"], 15, "{}", run.transcript());
    let status = status_json(&broker.bootstrap(), &lock);
    assert_eq!(
        member_count(&status),
        0,
        "the lock was not released: {status}"
    );
}

/// Issue: events, logs and the status line were written with blocking writes on the runtime
/// thread. With stderr a pipe nobody reads and the command filling it, kafka-lock blocked in
/// write(), never heartbeated, never stopped its command, and the next member held the lock
/// while that command still ran (old code: the Liveness assertion below fails).
#[test]
fn a_stalled_stderr_never_lets_two_commands_run_at_once() {
    let broker = broker();
    let lock = lock_name("stalled");
    let mut extra = vec!["--label", "stalled"];
    extra.extend(CONTENDED);
    let mut first = run_cmd(
        &broker.bootstrap(),
        &lock,
        &extra,
        // It fills the pipe only once the test has stopped reading it: zeros read before
        // `child_started` would glue themselves to that event's line.
        &sh("echo ready; read _; head -c 300000 /dev/zero >&2 & exec sleep 600"),
    )
    .env("KAFKA_LOCK_LOG", "debug")
    .stall_stderr_after("child_started")
    .spawn();
    let started = first.event("child_started", STEP);
    first.stdout_line("ready", STEP);
    first.write_stdin("go\n");
    let command = started["child_pid"].as_u64().expect("child pid") as u32;
    let alive = Liveness::watch(command);

    let mut extra = vec!["--label", "next"];
    extra.extend(CONTENDED);
    let mut next = run_cmd(&broker.bootstrap(), &lock, &extra, &["true"]).spawn();
    // A holder whose runtime is blocked loses its session 6 s (the session timeout) after its
    // last heartbeat, and the broker then hands the lock on in one rebalance: three session
    // timeouts cover that on a loaded machine. A holder that still heartbeats keeps the lock
    // all along.
    let window_end = Instant::now() + Duration::from_secs(18);
    let early = loop {
        let left = window_end.saturating_duration_since(Instant::now());
        match next.stderr.recv_timeout(left) {
            Ok(line) => {
                next.record(line.clone());
                if let Line::Event(v) = line {
                    if v["event"] == "acquired" {
                        break Some(v);
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => break None,
            Err(RecvTimeoutError::Disconnected) => panic!("{}", next.transcript()),
        }
    };
    let acquired = match early {
        Some(v) => v,
        None => {
            // The holder kept the lock while its stderr was stalled, through the rebalance the
            // newcomer's join caused; end its command.
            assert!(
                !next.named("waiting").is_empty(),
                "the next member never joined: {}",
                next.transcript()
            );
            assert!(!alive.is_gone(), "the command ended on its own");
            let ok = Command::new("kill")
                .args(["-TERM", &command.to_string()])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            assert!(ok);
            next.event("acquired", STEP)
        }
    };
    let acquired_at = mono(&acquired, "mono_ns");
    assert!(
        !alive.seen_alive_after(acquired_at),
        "the stalled holder's command was alive at {} ns, after the next holder acquired at {acquired_at} ns",
        alive.last_alive_ns()
    );
    assert_eq!(next.finish(STEP), 0, "{}", next.transcript());
    // The stalled kafka-lock exits (its stderr still unread) with its command's status.
    assert_eq!(first.finish(STEP), 128 + 15);
    first.resume_stderr();
}

/// Issue: the runtime thread of kafka-lock itself stopped (SIGSTOP of kafka-lock alone) kept
/// the command running. The supervisor must stop it at the lease end on its own; after SIGCONT
/// kafka-lock reports the loss and exits 74 (old code: the command ran on while it was
/// stopped).
#[test]
fn a_stopped_kafka_lock_cannot_keep_its_command_running_past_the_lease() {
    let lock = lock_name("stopped");
    let session = Duration::from_secs(6);
    // Margin 1 s (the default for a 6 s session), grace 800 ms: a command that ignored SIGTERM
    // would die 200 ms before the broker may move on. This one dies on SIGTERM, at the lease
    // end, a margin before. Heartbeats every 300 ms keep the last renewal close to the STOP, so
    // a lease end handed to the supervisor even a second late shows as a death past the bound.
    let mut run = run_cmd(
        &broker().bootstrap(),
        &lock,
        &[
            "--session-timeout",
            "6s",
            "--kill-grace",
            "800ms",
            "--heartbeat-interval",
            "300ms",
        ],
        &sh("echo ready; exec sleep 600"),
    )
    .spawn();
    let started = run.event("child_started", STEP);
    run.stdout_line("ready", STEP);
    let command = Liveness::watch(started["child_pid"].as_u64().expect("pid") as u32);
    // Taken before the signal is sent: kafka-lock's last heartbeat reached the broker before
    // this instant, so the broker may drop it a session timeout after it at the earliest.
    let stopped_at = mono_now();
    run.signal("STOP");
    // A bound on the wait only; the assertions below are what count.
    let gone_at = command.gone_within(session + Duration::from_secs(30));
    assert_eq!(
        proc_state(run.pid),
        Some('T'),
        "kafka-lock was not stopped while its command was stopped"
    );
    // What the broker allows, computed from nothing kafka-lock or its supervisor says: the
    // command must be gone before the session timeout after the STOP, with no allowance on top
    // (the margin is the allowance, and a grace of it is promised to the command).
    let broker_may_move_on = stopped_at + session.as_nanos() as u64;
    assert!(
        gone_at <= broker_may_move_on,
        "the command died {} ms after kafka-lock was stopped; the broker may give the lock away \
         {} ms after it",
        (gone_at - stopped_at) / 1_000_000,
        session.as_millis()
    );
    run.signal("CONT");
    let lost = run.event("lost", STEP);
    assert_eq!(lost["reason"], "lease_expired", "{lost}");
    let lease_end = mono(&lost, "lease_end_mono_ns");
    // The contract: SIGTERM at the lease end, not before.
    assert!(
        command.last_alive_ns() >= lease_end.saturating_sub(1_000_000_000),
        "the command was stopped long before its lease ended"
    );
    assert_eq!(run.finish(STEP), 74, "{}", run.transcript());
    assert_eq!(run.named("child_exited")[0]["signal"], 15);
}

/// A kafka-lock stopped after its command ended, and resumed only once the broker has given the
/// lock to the next holder, does not claim a hold up to the instant it woke: it says the hold was
/// lost at its lease end, before the next holder's acquisition, and exits 74; it never says
/// `released`. (The fault suite's mixed pause-during-slow-broker episode found the `released`.)
#[test]
fn a_kafka_lock_stopped_after_its_command_ended_does_not_claim_the_hold_past_its_lease() {
    let lock = lock_name("stopped-after");
    let dir = scratch_dir("stopped-after");
    let pidfile = dir.join("pid");
    // The command stops kafka-lock (not its own supervisor) and ends: kafka-lock is stopped
    // before it can learn of the end.
    let script = format!(
        "while [ ! -s '{p}' ]; do sleep 0.05; done; kill -STOP \"$(cat '{p}')\"; echo stopped",
        p = pidfile.display()
    );
    let mut run = run_cmd(&broker().bootstrap(), &lock, CONTENDED, &sh(&script)).spawn();
    run.event("child_started", STEP);
    std::fs::write(&pidfile, run.pid.to_string()).expect("write the pid file");
    run.stdout_line("stopped", STEP);
    let deadline = Instant::now() + STEP;
    while proc_state(run.pid) != Some('T') {
        assert!(Instant::now() < deadline, "kafka-lock was never stopped");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The next holder gets the lock once the broker has dropped the stopped member.
    let mut next = run_cmd(&broker().bootstrap(), &lock, CONTENDED, &["true"]).spawn();
    let next_acquired = mono(&next.event("acquired", STEP), "mono_ns");
    assert_eq!(next.finish(STEP), 0, "{}", next.transcript());
    run.signal("CONT");
    let status = run.finish(STEP);
    assert!(
        run.named("released").is_empty(),
        "a hold reported released after the next holder acquired: {}",
        run.transcript()
    );
    let lost = run.named("lost");
    assert_eq!(lost.len(), 1, "{}", run.transcript());
    assert_eq!(lost[0]["reason"], "lease_expired", "{}", run.transcript());
    let lease_end = mono(lost[0], "lease_end_mono_ns");
    assert!(
        lease_end < next_acquired,
        "the stopped hold's lease ended {} ms after the next holder acquired",
        (lease_end - next_acquired) / 1_000_000
    );
    assert_eq!(status, 74, "{}", run.transcript());
}

/// A command that exits 0 inside its lease leaves a checkpoint; kafka-lock stores it, and the
/// broker commits it, but its answer is held by a proxy, and then the holder is cut off from
/// the broker both ways (no renewal gets through). The hold must be reported `lost` at its lease
/// end while the cut lasts, not when the commit's answer (after the heal) or its local bound
/// comes (the broker's 5 s plus the request timeout, 30 s here so that it is far from the lease
/// end); kafka-lock then exits 74 saying the checkpoint may or may not have been stored, and the
/// next holder reads it: the broker had it. (The fault suite's CI mode found the hold claimed
/// past its lease: RELIABILITY.md, "What the suite found".) Break: the commit not raced with the
/// guard's loss (src/bin/kafka-lock/run.rs, `Action::CommitCheckpoint`: the commit awaited
/// alone), and no `lost` comes during the cut.
#[test]
fn a_hold_whose_checkpoint_commit_waits_in_a_cut_is_lost_at_its_lease_end() {
    use crate::fault::kproxy::{Dir, Fault, ProxySet};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime for the proxies");
    let node = &broker().nodes()[0];
    let brokers = [(node.id(), node.addr().parse().expect("the node's address"))];
    let proxies = ProxySet::start(rt.handle(), &brokers);
    let ledger = support::unique_group("cli-ckpt-cut-ledger");
    support::kafka::probe::create_topic(&broker().bootstrap(), &ledger, 1);
    let lock = lock_name("ckpt-cut");
    let ledger_args = ["--ledger-topic", ledger.as_str()];
    let extra: Vec<&str> = CONTENDED
        .iter()
        .copied()
        .chain(ledger_args)
        .chain(["--request-timeout", "30s"])
        .collect();
    // The command exits when told to on its stdin, so the trigger is armed before its commit.
    let script = r#"printf v1 > "$KAFKA_LOCK_CHECKPOINT_FILE"; echo ready; read _go"#;
    let mut run = run_cmd(&proxies.bootstrap(), &lock, &extra, &sh(script)).spawn();
    run.event("child_started", STEP);
    run.stdout_line("ready", STEP);
    proxies.hold_next_commit(true);
    run.write_stdin("go\n");
    run.event("child_exited", STEP);
    // The proxy has no event to wait on: its trigger's state is polled, bounded.
    let deadline = Instant::now() + STEP;
    let held = loop {
        if let Some(n) = proxies.commit_held() {
            break n;
        }
        assert!(
            Instant::now() < deadline,
            "no OffsetCommit answer held within {STEP:?}: {}",
            run.transcript()
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    proxies.set(held, Fault::Blackhole(Dir::Both));
    // The lease is session − margin from the last renewal that got an answer; the margin on top
    // is for a loaded machine, and still short of the commit's local bound (35 s).
    let session = Duration::from_secs(6);
    let lost = run.event("lost", session + Duration::from_secs(15));
    let lost_before_heal = mono_now();
    proxies.set(held, Fault::Clear);
    assert_eq!(lost["reason"], "lease_expired", "{lost}");
    let lease_end = mono(&lost, "lease_end_mono_ns");
    assert!(
        lease_end <= mono(&lost, "mono_ns") && mono(&lost, "mono_ns") <= lost_before_heal,
        "lost reported before its lease end, or not during the cut: {lost}"
    );
    assert_eq!(run.finish(STEP), 74, "{}", run.transcript());
    assert!(
        run.named("released").is_empty() && run.named("checkpoint").is_empty(),
        "a hold lost while its checkpoint was stored reported released or stored: {}",
        run.transcript()
    );
    let failed = &run.named("failed")[0];
    assert_eq!(failed["kind"], "lost", "{failed}");
    let line = run.failure_line();
    assert!(
        line.contains("may or may not have been stored"),
        "{}",
        run.transcript()
    );
    // The broker had committed it (only its answer was held): the next holder reads it.
    let mut next = run_cmd(
        &broker().bootstrap(),
        &lock,
        &extra,
        &sh(r#"printf '%s\n' "${KAFKA_LOCK_CHECKPOINT-none}""#),
    )
    .spawn();
    next.stdout_line("v1", STEP);
    assert_eq!(next.finish(STEP), 0, "{}", next.transcript());
    drop(proxies);
}

/// Issue: SIGHUP killed kafka-lock (129) without passing it on or releasing. HUP, QUIT and
/// USR1 are passed on to the command's group like TERM and INT; HUP while waiting leaves.
#[test]
fn hup_quit_and_usr1_are_forwarded_and_hup_while_waiting_leaves_the_group() {
    let broker = broker();
    for sig in ["HUP", "QUIT", "USR1"] {
        let lock = lock_name(&format!("sig-{sig}"));
        let script =
            format!("trap 'echo got-{sig}; exit 5' {sig}; echo ready; while :; do sleep 1; done");
        let mut run = run_cmd(&broker.bootstrap(), &lock, QUICK, &sh(&script)).spawn();
        run.stdout_line("ready", STEP);
        run.signal(sig);
        run.stdout_line(&format!("got-{sig}"), STEP);
        assert_eq!(run.finish(STEP), 5, "{sig}: {}", run.transcript());
        assert_eq!(run.named("released").len(), 1, "{}", run.transcript());
        let status = status_json(&broker.bootstrap(), &lock);
        assert_eq!(member_count(&status), 0, "{sig}: still a member: {status}");
    }

    let lock = lock_name("sighup-wait");
    let (mut holder, _) = start_holder(&broker.bootstrap(), &lock, "holder");
    let mut waiter = run_cmd(&broker.bootstrap(), &lock, CONTENDED, &["true"]).spawn();
    waiter.event("waiting", STEP);
    waiter.signal("HUP");
    assert_eq!(waiter.finish(STEP), 128 + 1, "{}", waiter.transcript());
    assert!(waiter.failure_line().contains("SIGHUP"));
    assert_eq!(member_count(&status_json(&broker.bootstrap(), &lock)), 1);
    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());
}

/// Issue: after the command ended, a release that could not reach the coordinator ignored
/// SIGINT for as long as the LeaveGroup could take. A signal now cuts it short: kafka-lock
/// exits at once with the command's status (old code: it exited only after the release's own
/// bound, well past the 5 s allowed here).
#[test]
fn a_signal_during_the_final_release_cuts_it_short() {
    let (proxy, _broker, mut run, _) = partitioned_holder(
        &["--session-timeout", "20s", "--request-timeout", "15s"],
        "echo ready; read _; exit 4",
    );
    proxy.blackhole();
    run.close_stdin();
    run.event("released", STEP);
    let signalled = Instant::now();
    run.signal("INT");
    let code = run.finish(STEP);
    let took = signalled.elapsed();
    assert_eq!(code, 4, "{}", run.transcript());
    assert!(
        took < Duration::from_secs(5),
        "kafka-lock took {took:?} to exit after SIGINT during the release"
    );
    let line = run.failure_line();
    assert!(line.contains("cut short by SIGINT"), "{line}");
}

/// Issue: non-UTF-8 arguments with a usage error panicked (std::env::args).
#[test]
fn arguments_that_are_not_utf8_are_a_usage_error() {
    use std::os::unix::ffi::OsStringExt;
    let args: Vec<OsString> = vec![
        "run".into(),
        "--bootstrap".into(),
        "127.0.0.1:9".into(),
        "--lock".into(),
        "x".into(),
        OsString::from_vec(b"--b\xffgus".to_vec()),
        "--".into(),
        "true".into(),
    ];
    let (code, stderr, _) = run_to_end(&args, STEP);
    assert_eq!(code, 64, "{stderr:?}");
    assert_eq!(stderr.len(), 1, "{stderr:?}");
    assert!(stderr[0].starts_with("kafka-lock: "), "{stderr:?}");
    let (code, stderr, _) = run_to_end(&[OsString::from_vec(b"st\xfeatus".to_vec())], STEP);
    assert_eq!(code, 64, "{stderr:?}");
}

/// Issue: eprintln!/println! panic on EPIPE, turning kafka-lock's status into an abort. The
/// status must survive a stderr or stdout whose reader is gone, and a closed stderr.
#[test]
fn a_broken_or_closed_stderr_or_stdout_keeps_the_exit_status() {
    let broker = broker();
    let b = broker.bootstrap();
    let run_with_broken = |args: &[&str], broken_stdout: bool| -> ExitStatus {
        let mut cmd = kafka_lock();
        cmd.args(args).stdin(Stdio::null());
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // The reader goes away before kafka-lock writes anything.
        drop(child.stderr.take());
        if broken_stdout {
            drop(child.stdout.take());
        }
        wait_bounded(child, STEP)
    };
    let code = |st: ExitStatus| {
        st.code()
            .unwrap_or_else(|| panic!("killed by signal {:?}", st.signal()))
    };
    assert_eq!(code(run_with_broken(&["run", "--bogus"], false)), 64);
    assert_eq!(
        code(run_with_broken(
            &[
                "run",
                "--bootstrap",
                &b,
                "--lock",
                "x",
                "--session-timeout",
                "0s",
                "--",
                "true"
            ],
            false
        )),
        78
    );
    let lock = lock_name("epipe");
    let mut args = vec![
        "run",
        "--bootstrap",
        &b,
        "--lock",
        &lock,
        "--events",
        "json",
    ];
    args.extend(QUICK);
    args.extend([
        "--", "sh", "-c",
        // The command writes nothing: a write of its own would end it with SIGPIPE (141),
        // which kafka-lock would faithfully pass on.
        "exit 3",
    ]);
    assert_eq!(code(run_with_broken(&args, true)), 3);
    // The lock was released: free.
    assert_eq!(
        code(run_with_broken(
            &["status", "--bootstrap", &b, "--lock", &lock, "--json"],
            true
        )),
        3
    );

    // A closed stderr (2>&-).
    let closed = |args: &[&str]| -> i32 {
        let status = Command::new("setpriv")
            .args([
                "--pdeathsig",
                "KILL",
                "--",
                "sh",
                "-c",
                r#"exec "$0" "$@" 2>&-"#,
                BIN,
            ])
            .args(args)
            .env_remove("KAFKA_LOCK_BOOTSTRAP")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .expect("run sh");
        status
            .code()
            .unwrap_or_else(|| panic!("killed: {status:?}"))
    };
    assert_eq!(closed(&["run", "--bogus"]), 64);
    let lock = lock_name("closed-stderr");
    let mut args = vec![
        "run",
        "--bootstrap",
        &b,
        "--lock",
        &lock,
        "--events",
        "json",
    ];
    args.extend(QUICK);
    args.extend(["--", "sh", "-c", "exit 3"]);
    assert_eq!(closed(&args), 3);
}

/// The supervisor driven directly, as kafka-lock run drives it: the socket's other end is
/// the test's. Dropping it closes that end, which makes the supervisor stop everything.
struct Sup {
    sock: Option<OwnedFd>,
    child: Option<Child>,
    stdout: Receiver<String>,
}

fn supervisor(grace: Duration, command: &[&str]) -> Sup {
    supervisor_with_queued(grace, command, &[], false, None)
}

/// A supervisor that finds `queued` already waiting on its socket when it starts (as when
/// kafka-lock run sends faster than a starved or stopped supervisor reads), followed by end of
/// file if `then_eof` (kafka-lock died after sending them). With `trace`, the supervisor stamps
/// its steps into that file (KAFKA_LOCK_TRACE_FILE).
fn supervisor_with_queued(
    grace: Duration,
    command: &[&str],
    queued: &[String],
    then_eof: bool,
    trace: Option<&Path>,
) -> Sup {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let (ours, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .expect("socketpair");
    for msg in queued {
        rustix::net::send(&ours, msg.as_bytes(), rustix::net::SendFlags::NOSIGNAL)
            .expect("queue a message for the supervisor");
    }
    if then_eof {
        rustix::net::shutdown(&ours, rustix::net::Shutdown::Write).expect("shutdown");
    }
    // The supervisor's end goes in as stdin and is moved to descriptor 3 by the shell, so no
    // other process the tests start (concurrently, from other threads) can inherit it.
    let mut sh = Command::new("sh");
    if let Some(trace) = trace {
        sh.env("KAFKA_LOCK_TRACE_FILE", trace);
    }
    let mut child = sh
        .arg("-c")
        .arg(r#"bin=$0; grace=$1; shift; exec "$bin" __supervise 3 "$grace" -- "$@" 3<&0 </dev/null"#)
        .arg(BIN)
        .arg(grace.as_nanos().to_string())
        .args(command)
        .stdin(Stdio::from(theirs))
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the supervisor");
    let out = child.stdout.take().expect("piped");
    let (tx, stdout) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Sup {
        sock: Some(ours),
        child: Some(child),
        stdout,
    }
}

impl Sup {
    fn send(&self, msg: &str) {
        assert!(self.try_send(msg), "cannot send {msg:?} to the supervisor");
    }

    /// Sends unless the supervisor has closed its end (it exits right after GONE).
    fn try_send(&self, msg: &str) -> bool {
        let sock = self.sock.as_ref().expect("open");
        rustix::net::send(sock, msg.as_bytes(), rustix::net::SendFlags::NOSIGNAL).is_ok()
    }

    /// The next message within `within`, or None if none came.
    fn try_recv(&self, within: Duration) -> Option<String> {
        use rustix::event::{PollFd, PollFlags, Timespec};
        let sock = self.sock.as_ref().expect("open");
        let ts = Timespec {
            tv_sec: within.as_secs() as i64,
            tv_nsec: within.subsec_nanos() as _,
        };
        let mut fds = [PollFd::new(sock, PollFlags::IN)];
        if rustix::event::poll(&mut fds, Some(&ts)).expect("poll") == 0 {
            return None;
        }
        let mut buf = [0u8; 512];
        let (n, _) = loop {
            match rustix::net::recv(sock.as_fd(), &mut buf[..], rustix::net::RecvFlags::empty()) {
                // The supervisor exited with some of our LEASE messages unread: reported once,
                // before what it sent us.
                Err(rustix::io::Errno::CONNRESET) => {}
                other => break other.expect("recv"),
            }
        };
        assert!(n > 0, "the supervisor closed the socket");
        Some(String::from_utf8_lossy(&buf[..n]).trim_end().to_owned())
    }

    fn recv(&self) -> String {
        self.try_recv(STEP)
            .unwrap_or_else(|| panic!("no message from the supervisor within {STEP:?}"))
    }

    /// Waits for the supervisor's exit status.
    fn exit(&mut self) -> ExitStatus {
        wait_bounded(self.child.take().expect("not waited for yet"), STEP)
    }
}

impl Drop for Sup {
    fn drop(&mut self) {
        // End of file: the supervisor stops whatever still runs and exits on its own.
        self.sock.take();
        if let Some(child) = self.child.take() {
            if !std::thread::panicking() {
                wait_bounded(child, STEP);
            }
        }
    }
}

/// Without any help from kafka-lock, the supervisor sends SIGTERM at the lease end and SIGKILL
/// at the lease end plus the grace to a command that ignores SIGTERM (issue 7 item 8: the kill
/// timer no longer waits on anything else).
#[test]
fn supervisor_kills_at_the_lease_end_plus_the_grace_on_its_own() {
    let grace = Duration::from_millis(300);
    let sup = supervisor(
        grace,
        &[
            "sh",
            "-c",
            "trap '' TERM; echo ready; while :; do sleep 0.05; done",
        ],
    );
    let end = mono_now() + 700_000_000;
    sup.send(&format!("LEASE {end}"));
    assert!(sup.recv().starts_with("PID "));
    assert_eq!(sup.recv(), format!("EXPIRED {end}"));
    assert_eq!(sup.recv(), "EXIT SIGNAL 9");
    let killed_seen = mono_now();
    assert_eq!(sup.recv(), "GONE");
    let kill_at = end + grace.as_nanos() as u64;
    assert!(
        killed_seen >= kill_at,
        "SIGKILL before the lease end plus the grace"
    );
    assert!(
        killed_seen <= kill_at + 5_000_000_000,
        "SIGKILL {} ms after the lease end plus the grace",
        (killed_seen - kill_at) / 1_000_000
    );
}

/// A command that exits and leaves a process behind: the supervisor reports the command's own
/// status once, stops what is left, and says GONE; nothing it reaps later passes for the
/// command's end.
#[test]
fn supervisor_reports_the_commands_end_once_when_it_left_a_process_behind() {
    command_leaves_a_process_behind(
        Duration::from_secs(5),
        "sleep 600 & echo $!; exit 3",
        "EXIT CODE 3",
    );
}

/// What the command left behind ignores SIGTERM: it is SIGKILLed a grace later and GONE follows
/// at once, though neither kafka-lock nor the command (reaped already) wakes the supervisor.
#[test]
fn supervisor_kills_leftovers_that_ignore_sigterm_and_says_gone() {
    command_leaves_a_process_behind(
        Duration::from_millis(300),
        "trap '' TERM; sleep 600 & echo $!; exit 0",
        "EXIT CODE 0",
    );
}

/// Runs `script` (which prints the pid of a process it leaves behind, then exits) under a
/// supervisor with `grace`: the command's end is reported once as `exit`, then GONE, and the
/// process left behind is gone too.
fn command_leaves_a_process_behind(grace: Duration, script: &str, exit: &str) {
    let sup = supervisor(grace, &["sh", "-c", script]);
    sup.send(&format!("LEASE {}", mono_now() + 600_000_000_000));
    assert!(sup.recv().starts_with("PID "));
    let left: u32 = sup
        .stdout
        .recv_timeout(STEP)
        .expect("the pid of what the command left")
        .parse()
        .expect("a pid");
    let watched = Liveness::watch(left);
    assert_eq!(sup.recv(), exit);
    assert_eq!(sup.recv(), "GONE");
    watched.gone_within(STEP);
}

#[test]
fn supervisor_keeps_a_command_whose_lease_is_renewed() {
    let mut sup = supervisor(Duration::from_millis(200), &["sh", "-c", "sleep 2; exit 6"]);
    let mut got = Vec::new();
    while got.last().map(String::as_str) != Some("GONE") {
        sup.try_send(&format!("LEASE {}", mono_now() + 2_000_000_000));
        if let Some(m) = sup.try_recv(Duration::from_millis(100)) {
            got.push(m);
        }
        assert!(got.len() < 10, "{got:?}");
    }
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got[0].starts_with("PID "), "{got:?}");
    assert_eq!(got[1..], ["EXIT CODE 6", "GONE"]);
    assert!(sup.exit().success());
}

#[test]
fn supervisor_stops_the_command_on_bad_input() {
    let sup = supervisor(Duration::from_secs(1), &["sleep", "600"]);
    sup.send(&format!("LEASE {}", mono_now() + 600_000_000_000));
    assert!(sup.recv().starts_with("PID "));
    sup.send("LEASE soon");
    assert!(sup.recv().starts_with("ERROR "));
    assert_eq!(sup.recv(), "EXIT SIGNAL 15");
    assert_eq!(sup.recv(), "GONE");
}

#[test]
fn supervisor_never_starts_a_command_on_a_lease_that_has_ended() {
    let dir = scratch_dir("cli-sup-expired");
    let marker = dir.join("ran");
    let mut sup = supervisor(
        Duration::from_secs(1),
        &["touch", marker.to_str().expect("utf-8 path")],
    );
    sup.send("LEASE 1");
    assert_eq!(sup.recv(), "EXPIRED 1");
    assert_eq!(sup.recv(), "GONE");
    assert!(sup.exit().success());
    assert!(!marker.exists(), "the command ran");
}

/// The hold was lost (STOP), or kafka-lock died (end of file), after it sent the hold's
/// environment and lease end but before the supervisor read them: the command must not start
/// under a hold kafka-lock already knows is over, not even until the STOP is read. The
/// supervisor's own trace stamps show whether it spawned the command.
#[test]
fn supervisor_starts_nothing_when_a_stop_or_eof_is_queued_behind_the_lease() {
    for then_eof in [false, true] {
        let dir = scratch_dir("cli-sup-queued-stop");
        let marker = dir.join("ran");
        let trace = dir.join("trace");
        let mut queued = vec![
            "ENV KAFKA_LOCK_TOKEN=7".to_owned(),
            format!("LEASE {}", mono_now() + 600_000_000_000),
        ];
        if !then_eof {
            queued.push("STOP".to_owned());
        }
        let mut sup = supervisor_with_queued(
            Duration::from_secs(1),
            &[
                "sh",
                "-c",
                &format!("touch {}; sleep 600", marker.display()),
            ],
            &queued,
            then_eof,
            Some(&trace),
        );
        if !then_eof {
            let first = sup.recv();
            assert_eq!(
                first, "GONE",
                "the command was started: the supervisor said {first:?} first"
            );
        }
        // Without K (end of file) the supervisor reports nothing; its exit is the end.
        assert!(sup.exit().success());
        let stamps = std::fs::read_to_string(&trace).unwrap_or_default();
        assert!(
            !stamps.contains("command-spawned"),
            "the command was started (then_eof {then_eof}):\n{stamps}"
        );
        assert!(!marker.exists(), "the command ran (then_eof {then_eof})");
    }
}

#[test]
fn supervisor_stops_everything_when_kafka_lock_goes_away() {
    let mut sup = supervisor(
        Duration::from_millis(500),
        &["sh", "-c", &leaves_processes("exec sleep 600")],
    );
    sup.send(&format!("LEASE {}", mono_now() + 600_000_000_000));
    let pid: u32 = sup.recv()["PID ".len()..].parse().expect("pid");
    let mut pids = vec![pid];
    let mut ready = false;
    while pids.len() < 3 || !ready {
        let line = sup.stdout.recv_timeout(STEP).expect("the command's output");
        match line.split_once(' ') {
            Some((_, p)) => pids.push(p.parse().expect("pid")),
            None => ready |= line == "ready",
        }
    }
    let watched: Vec<Liveness> = pids.iter().map(|p| Liveness::watch(*p)).collect();
    sup.sock.take();
    for w in &watched {
        w.gone_within(Duration::from_millis(500) + Duration::from_secs(15));
    }
    assert!(sup.exit().success());
}

/// SIG_IGN for SIGCHLD survives exec: kafka-lock must undo it, or the kernel reaps the command
/// before the supervisor can read its status.
#[test]
fn an_ignored_sigchld_does_not_lose_the_commands_status() {
    let lock = lock_name("sigchld");
    let mut args = vec![
        "--pdeathsig",
        "KILL",
        "--",
        // dash's trap '' CHLD does not set SIG_IGN; bash's does.
        "bash",
        "-c",
        r#"trap '' CHLD; exec "$0" "$@""#,
        BIN,
        "run",
        "--bootstrap",
    ];
    let b = broker().bootstrap();
    args.extend([b.as_str(), "--lock", &lock]);
    args.extend(QUICK);
    args.extend(["--", "sh", "-c", "sleep 0.2; exit 3"]);
    let child = Command::new("setpriv")
        .args(&args)
        .env_remove("KAFKA_LOCK_BOOTSTRAP")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("start");
    assert_eq!(wait_bounded(child, STEP).code(), Some(3));
}

/// `--permits 2`: two commands run at once, each with its own `KAFKA_LOCK_PERMIT`; a third waits
/// and is told both holders; `status` lists both; a run with another number exits 78 naming
/// both numbers; a release hands its permit to the waiter.
#[test]
fn permits_let_two_commands_run_at_once_each_with_its_slot() {
    let b = broker().bootstrap();
    let lock = lock_name("permits");
    let mut extra = vec!["--permits", "2"];
    extra.extend(CONTENDED);
    let print_and_hold = sh(r#"echo "permit=$KAFKA_LOCK_PERMIT"; cat >/dev/null"#);
    let mut holders = Vec::new();
    let mut slots = Vec::new();
    for label in ["h0", "h1"] {
        let mut e = extra.clone();
        e.extend(["--label", label]);
        let mut h = run_cmd(&b, &lock, &e, &print_and_hold).spawn();
        let acquired = h.event("acquired", STEP);
        let line = h
            .stdout
            .recv_timeout(STEP)
            .expect("the command printed its permit");
        assert_eq!(
            line,
            format!("permit={}", acquired["permit"]),
            "{}",
            h.transcript()
        );
        slots.push(acquired["permit"].as_i64().expect("permit"));
        holders.push((h, acquired));
    }
    slots.sort_unstable();
    assert_eq!(slots, [0, 1]);

    let mut e = extra.clone();
    e.extend(["--label", "waiter"]);
    let mut waiter = run_cmd(&b, &lock, &e, &sh(r#"echo "permit=$KAFKA_LOCK_PERMIT""#)).spawn();
    let deadline = Instant::now() + STEP;
    let told = loop {
        let ev = waiter.event(
            "waiting",
            deadline.saturating_duration_since(Instant::now()),
        );
        if ev["position"] == 1 && ev["holders"].as_array().is_some_and(|h| h.len() == 2) {
            break ev;
        }
    };
    let mut named: Vec<i64> = told["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["permit"].as_i64().unwrap())
        .collect();
    named.sort_unstable();
    assert_eq!(named, [0, 1], "{told}");

    let s = status_json(&b, &lock);
    assert_eq!(s["permits"], 2, "{s}");
    assert_eq!(s["holders"].as_array().map(Vec::len), Some(2), "{s}");
    let (code, stderr, text) = run_to_end(&["status", "--bootstrap", &b, "--lock", &lock], STEP);
    assert_eq!(code, 0, "{stderr:?}");
    assert!(text.contains("holders (2 of 2 permits)"), "{text}");

    // Another number of permits: refused with both numbers, status 78, and the group goes on.
    let mut wrong = vec!["--permits", "3"];
    wrong.extend(CONTENDED);
    let mut w = run_cmd(&b, &lock, &wrong, &["true"]).spawn();
    assert_eq!(w.finish(STEP), 78, "{}", w.transcript());
    let line = w.failure_line();
    assert!(
        line.contains("has 2 permit(s)") && line.contains("configured with 3"),
        "{line}"
    );
    assert_eq!(w.named("failed")[0]["kind"], "config");
    // An election has one leader: --permits does not apply there.
    let (code, stderr, _) = run_to_end(
        &[
            "elect",
            "--bootstrap",
            &b,
            "--lock",
            &lock,
            "--permits",
            "2",
            "--",
            "true",
        ],
        STEP,
    );
    assert_eq!(code, 64, "{stderr:?}");
    assert!(
        format!("{stderr:?}").contains("--permits does not apply"),
        "{stderr:?}"
    );

    // The first holder's release hands its permit to the waiter.
    let (mut first, acquired) = holders.remove(0);
    first.close_stdin();
    assert_eq!(first.finish(STEP), 0, "{}", first.transcript());
    let next = waiter.event("acquired", STEP);
    assert_eq!(next["permit"], acquired["permit"]);
    assert!(token(&next) > token(&acquired));
    assert_eq!(waiter.finish(STEP), 0, "{}", waiter.transcript());
    for (mut h, _) in holders {
        h.close_stdin();
        assert_eq!(h.finish(STEP), 0, "{}", h.transcript());
    }
}

/// How long [`slow_start`] holds back the supervisor's start: far longer than an acquire.
const SPAWN_DELAY: Duration = Duration::from_secs(6);

/// How [`slow_start`] holds back the supervisor's start.
#[derive(Clone, Copy, PartialEq)]
enum Slow {
    /// The wait, then the spawn.
    Before,
    /// The spawn (the supervisor runs), then the wait.
    After,
    /// The wait, then ENOENT: the supervisor is never started.
    Fail,
}

/// kafka-lock with its start of the supervisor held back [`SPAWN_DELAY`] by a preloaded shim
/// (tests/it/slow_spawn.c, built into `dir`), so that the start is not over long after the
/// grant. Without a C compiler the test fails and says how to get one: the suite never skips.
fn slow_start(spec: Spec, dir: &Path, how: Slow) -> Run {
    slow_start_by(spec, dir, how, SPAWN_DELAY)
}

/// [`slow_start`], held back `delay`.
fn slow_start_by(spec: Spec, dir: &Path, how: Slow, delay: Duration) -> Run {
    let shim = crate::support::slow_spawn_shim(dir);
    let mut spec = spec
        .env("LD_PRELOAD", &shim.to_string_lossy())
        .env("SLOW_SPAWN_MS", &delay.as_millis().to_string());
    match how {
        Slow::Before => {}
        Slow::After => spec = spec.env("SLOW_SPAWN_AFTER", "1"),
        Slow::Fail => spec = spec.env("SLOW_SPAWN_FAIL", "1"),
    }
    spec.spawn()
}

/// Polls `status --json` until `label` holds `lock`; false if it did not within `within`.
fn held_by_within(bootstrap: &str, lock: &str, label: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let s = status_json(bootstrap, lock);
        if s["holder"]["label"] == label {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The supervisor's start runs beside the acquire: a start that takes long does not hold up
/// the grant (the lock is held while the supervisor is still starting), `acquired` comes only
/// once the supervisor is there, and the command then runs under the hold with its token.
#[test]
fn a_slow_supervisor_start_does_not_hold_up_the_grant_and_the_command_runs_after_it() {
    let bootstrap = broker().bootstrap();
    let lock = lock_name("slow-start");
    let dir = scratch_dir("cli-slow-start");
    let mut extra = vec!["--label", "slow start"];
    extra.extend(QUICK);
    let spec = run_cmd(
        &bootstrap,
        &lock,
        &extra,
        // Holds until the test closes its stdin: a short hold could come and go between two
        // looks at the group.
        &sh(r#"printf '%s\n' "$KAFKA_LOCK_TOKEN"; cat >/dev/null"#),
    );
    let mut slow = slow_start(spec, &dir, Slow::Before);
    assert!(
        held_by_within(&bootstrap, &lock, "slow start", STEP),
        "kafka-lock never held the lock: {}",
        slow.transcript()
    );
    // Its supervisor's start is held back SPAWN_DELAY: the lock was granted first.
    let supervisors: Vec<_> = children_of(slow.pid)
        .into_iter()
        .filter(|(_, cmd)| cmd.contains("__supervise"))
        .collect();
    assert!(
        supervisors.is_empty(),
        "the lock was only granted once the supervisor had started: {supervisors:?}"
    );
    let acquired = slow.event("acquired", STEP);
    let started = slow.event("child_started", STEP);
    slow.close_stdin();
    assert_eq!(slow.finish(STEP), 0, "{}", slow.transcript());
    assert!(mono(&started, "mono_ns") >= mono(&acquired, "mono_ns"));
    let line = slow.stdout.recv_timeout(STEP).expect("the command ran");
    assert_eq!(line, token(&acquired).to_string());
}

/// A `kafka-lock run` labelled "late failure" whose supervisor's start is held back and then
/// fails ([`Slow::Fail`]), once it holds the lock: the bootstrap, the lock, the file its command
/// would create, and the run.
fn held_while_the_start_fails(name: &str) -> (String, String, PathBuf, Run) {
    let bootstrap = broker().bootstrap();
    let lock = lock_name(name);
    let dir = scratch_dir(&format!("cli-{name}"));
    let marker = dir.join("ran");
    let mut extra = vec!["--label", "late failure"];
    extra.extend(QUICK);
    let script = format!(": > {}", marker.display());
    let spec = run_cmd(&bootstrap, &lock, &extra, &sh(&script));
    let slow = slow_start(spec, &dir, Slow::Fail);
    assert!(
        held_by_within(&bootstrap, &lock, "late failure", STEP),
        "kafka-lock never held the lock: {}",
        slow.transcript()
    );
    (bootstrap, lock, marker, slow)
}

/// A supervisor whose start fails after the grant: the lock is released, `acquired` is never
/// reported, the command never runs, and the run exits 71 with the start's own line.
#[test]
fn a_supervisor_that_cannot_start_after_the_grant_releases_the_lock_and_exits_71() {
    let (bootstrap, lock, marker, mut slow) = held_while_the_start_fails("no-supervisor-late");
    assert_eq!(slow.finish(STEP), 71, "{}", slow.transcript());
    let line = slow.failure_line();
    assert!(
        line.contains("cannot start the supervisor process")
            && line.contains("the command was not run"),
        "{}",
        slow.transcript()
    );
    for never in ["acquired", "child_started"] {
        assert!(
            slow.named(never).is_empty(),
            "{never} without a supervisor: {}",
            slow.transcript()
        );
    }
    assert!(!marker.exists(), "the command ran without a supervisor");
    // Released, not left to a session timeout: one try gets it.
    let mut next = run_cmd(&bootstrap, &lock, &["--wait", "0"], &["true"]).spawn();
    assert_eq!(next.finish(STEP), 0, "{}", next.transcript());
}

/// The wait for the lock ends (a signal, `--wait` running out) while the supervisor is still
/// starting: kafka-lock waits for that start, then stops and reaps the supervisor it made; none
/// is left behind, and nothing ran.
#[test]
fn a_wait_that_ends_during_a_slow_supervisor_start_leaves_no_supervisor() {
    let bootstrap = broker().bootstrap();
    let lock = lock_name("slow-start-wait");
    let dir = scratch_dir("cli-slow-start-wait");
    let (mut holder, _) = start_holder(&bootstrap, &lock, "holder");
    for (how, extra, status) in [
        ("TERM", CONTENDED.to_vec(), 128 + 15),
        ("--wait", [CONTENDED, &["--wait", "1s"]].concat(), 75),
    ] {
        let marker = dir.join(format!("ran-{}", how.trim_start_matches('-')));
        let script = format!(": > {}", marker.display());
        let spec = run_cmd(&bootstrap, &lock, &extra, &sh(&script));
        let sub = dir.join(how.trim_start_matches('-'));
        std::fs::create_dir_all(&sub).expect("a directory for the run");
        let mut slow = slow_start(spec, &sub, Slow::After);
        // The supervisor runs, but kafka-lock's start of it is not over.
        let deadline = Instant::now() + STEP;
        let starting = loop {
            if let Some((pid, _)) = children_of(slow.pid).into_iter().next() {
                break pid;
            }
            assert!(
                Instant::now() < deadline && support::pid_alive(slow.pid),
                "{how}: no supervisor start began: {}",
                slow.transcript()
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let starting = Liveness::watch(starting);
        if how == "TERM" {
            slow.event("waiting", STEP);
            slow.signal("TERM");
        }
        assert_eq!(slow.finish(STEP), status, "{}", slow.transcript());
        assert!(
            starting.is_gone(),
            "{how}: supervisor {} outlived its run",
            starting.pid
        );
        assert!(!marker.exists(), "{how}: the waiter ran its command");
    }
    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());
    assert!(holder.named("lost").is_empty(), "{}", holder.transcript());
}

/// A signal that arrives after the grant, while the supervisor's start is still under way and
/// then fails: the run still ends with the start's 71, and the lock is still released (the
/// signal came before the release began, so it does not cut the release short: that is for a
/// signal during it).
#[test]
fn a_signal_while_a_failing_supervisor_start_is_awaited_after_the_grant_still_releases() {
    let (bootstrap, lock, marker, mut slow) = held_while_the_start_fails("no-supervisor-signal");
    slow.signal("TERM");
    assert_eq!(slow.finish(STEP), 71, "{}", slow.transcript());
    let line = slow.failure_line();
    assert!(
        line.contains("cannot start the supervisor process"),
        "{}",
        slow.transcript()
    );
    assert!(!marker.exists(), "the command ran without a supervisor");
    let mut next = run_cmd(&bootstrap, &lock, &["--wait", "0"], &["true"]).spawn();
    assert_eq!(
        next.finish(STEP),
        0,
        "the lock was not released: {}\n{}",
        slow.transcript(),
        next.transcript()
    );
}

/// A signal that arrives after the grant, while the supervisor's start is still under way:
/// nothing is left behind, and the lock is released, whatever the command made of the signal.
#[test]
fn a_signal_while_a_slow_supervisor_start_is_awaited_after_the_grant_leaves_nothing() {
    let bootstrap = broker().bootstrap();
    let lock = lock_name("slow-start-signal");
    let dir = scratch_dir("cli-slow-start-signal");
    let mut extra = vec!["--label", "slow start"];
    extra.extend(QUICK);
    let script = "exec sleep 600";
    let spec = run_cmd(&bootstrap, &lock, &extra, &sh(script));
    let mut slow = slow_start(spec, &dir, Slow::Before);
    assert!(
        held_by_within(&bootstrap, &lock, "slow start", STEP),
        "kafka-lock never held the lock: {}",
        slow.transcript()
    );
    slow.signal("TERM");
    // The signal waits in the hold, as one between the grant and the command's start always
    // did: the command starts and gets it at once. It may or may not have written its marker.
    assert_eq!(slow.finish(STEP), 128 + 15, "{}", slow.transcript());
    let mut next = run_cmd(&bootstrap, &lock, &["--wait", "0"], &["true"]).spawn();
    assert_eq!(next.finish(STEP), 0, "{}", next.transcript());
    for started in slow.named("child_started") {
        let pid = started["child_pid"].as_u64().expect("a pid") as u32;
        assert!(
            !support::pid_alive(pid),
            "the command {pid} outlived its run"
        );
    }
}

/// The lease runs out (the broker cut off) after the grant, while the supervisor is still
/// starting: the command never starts, and kafka-lock exits 75 (granted, but not in time to run
/// anything), as for a lease that ran out between the grant and the start for any reason.
#[test]
fn a_lease_that_runs_out_while_the_supervisor_is_still_starting_runs_nothing() {
    let proxy = Arc::new(Proxy::start());
    let forward = proxy.clone();
    let _broker = KafkaCluster::start(
        KafkaOptions::single_node()
            .property(
                "advertised.listeners",
                format!("PLAINTEXT://127.0.0.1:{}", proxy.port()),
            )
            .on_ports(move |ports| forward.set_target(([127, 0, 0, 1], ports[0]).into())),
    );
    let lock = lock_name("slow-start-lost");
    let dir = scratch_dir("cli-slow-start-lost");
    let marker = dir.join("ran");
    let script = format!(": > {}", marker.display());
    let extra = [
        "--label",
        "cut off",
        "--session-timeout",
        "6s",
        "--request-timeout",
        "2s",
    ];
    let spec = run_cmd(&proxy.bootstrap(), &lock, &extra, &sh(&script));
    // Far longer than the lease, which the cut leaves to run out within the session timeout.
    let delay = Duration::from_secs(20);
    let mut slow = slow_start_by(spec, &dir, Slow::Before, delay);
    assert!(
        held_by_within(&proxy.bootstrap(), &lock, "cut off", STEP),
        "kafka-lock never held the lock: {}",
        slow.transcript()
    );
    proxy.blackhole();
    assert_eq!(slow.finish(STEP), 75, "{}", slow.transcript());
    let line = slow.failure_line();
    assert!(
        line.contains("lease ran out before the command could start")
            && line.contains("the command was not run"),
        "{line}"
    );
    assert!(
        slow.named("child_started").is_empty(),
        "{}",
        slow.transcript()
    );
    assert!(!marker.exists(), "the command ran after its lease");
}

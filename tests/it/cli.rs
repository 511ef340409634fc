//! The `kafka-lock` binary against the real broker: every exit status, the token in the
//! command's environment, signal forwarding, mutual exclusion judged from kafka-lock's own
//! `--events json` timestamps (CLOCK_MONOTONIC, one clock for every process), the command being
//! stopped when a partition makes the lease run out, and `status`.
//!
//! Every process is started through [`Run`], which kills kafka-lock and the command's whole
//! process group when dropped, so a failing test leaves nothing running.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::proxy::Proxy;
use crate::support::{self, TestBroker};

const BIN: &str = env!("CARGO_BIN_EXE_kafka-lock");

/// Bound for anything that takes one acquisition or handover on tansu (whose JoinGroup parks for
/// about session/2), on a loaded two-core machine.
const STEP: Duration = Duration::from_secs(60);

/// Session timeout for tests with one holder at a time: short, so each acquisition is quick.
const QUICK: &[&str] = &["--session-timeout", "4s"];
/// Timeouts for tests where waiters join while a holder holds: the holder must rejoin each
/// rebalance (about session/2 on tansu) well within its lease (session − 1 s).
const CONTENDED: &[&str] = &["--session-timeout", "6s", "--heartbeat-interval", "500ms"];

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
}

struct Spec {
    args: Vec<String>,
    env: Vec<(String, String)>,
    bootstrap_env: bool,
}

impl Spec {
    fn new<S: AsRef<str>>(args: &[S]) -> Spec {
        Spec {
            args: args.iter().map(|s| s.as_ref().to_owned()).collect(),
            env: Vec::new(),
            bootstrap_env: false,
        }
    }

    fn env(mut self, k: &str, v: &str) -> Spec {
        self.env.push((k.to_owned(), v.to_owned()));
        self.bootstrap_env |= k == "KAFKA_LOCK_BOOTSTRAP";
        self
    }

    fn spawn(self) -> Run {
        let mut cmd = Command::new(BIN);
        cmd.args(&self.args)
            .env_remove("KAFKA_LOCK_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if !self.bootstrap_env {
            cmd.env_remove("KAFKA_LOCK_BOOTSTRAP");
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        Run::watch(child)
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
    fn watch(mut child: Child) -> Run {
        let pid = child.id();
        let stdin = child.stdin.take();
        let err = child.stderr.take().expect("stderr was piped");
        let out = child.stdout.take().expect("stdout was piped");
        let groups = Arc::new(Mutex::new(Vec::new()));
        let (err_tx, stderr) = mpsc::channel();
        let reader_groups = groups.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                let parsed = match serde_json::from_str::<Value>(&line) {
                    Ok(v) if v.is_object() => Line::Event(v),
                    _ => Line::Text(line),
                };
                if let Line::Event(v) = &parsed {
                    if v["event"] == "child_started" {
                        if let Some(pgid) = v["child_pid"].as_u64() {
                            reader_groups.lock().unwrap().push(pgid as u32);
                        }
                    }
                }
                if err_tx.send(parsed).is_err() {
                    break;
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
        std::thread::spawn(move || {
            if let Ok(status) = child.wait() {
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

    /// Reads stderr until the event `name` and returns it.
    fn event(&mut self, name: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
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
            self.seen.push(line);
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

/// Runs kafka-lock to completion with no stdin and returns (status, stderr lines).
fn run_to_end<S: AsRef<str>>(args: &[S], within: Duration) -> (i32, Vec<String>, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args.iter().map(|a| a.as_ref()))
        .env_remove("KAFKA_LOCK_BOOTSTRAP")
        .env_remove("KAFKA_LOCK_LOG")
        .stdin(Stdio::null());
    let mut run = Run::watch(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}")),
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
        .env("KAFKA_LOCK_BOOTSTRAP", &support::broker().bootstrap())
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
        ["acquired", "child_started", "child_exited", "released"],
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
    let broker = support::broker();
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
        &support::broker().bootstrap(),
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
    let broker = support::broker();
    let lock = lock_name("busy");
    let dir = scratch_dir("cli-busy");
    let (mut holder, acquired) = start_holder(&broker.bootstrap(), &lock, "busy holder");

    let marker = dir.join("ran");
    let touch = format!("touch {}", marker.display());
    let mut args = vec!["--wait", "0"];
    args.extend(CONTENDED);
    let mut once = run_cmd(&broker.bootstrap(), &lock, &args, &sh(&touch)).spawn();
    assert_eq!(once.finish(STEP), 75, "{}", once.transcript());
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

#[test]
fn sigterm_and_sigint_are_forwarded_and_the_lock_released_after_the_command() {
    let broker = support::broker();
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
        ["acquired", "child_started", "child_exited", "released"]
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
    let broker = support::broker();
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
    waiter.signal("TERM");
    assert_eq!(waiter.finish(STEP), 128 + 15, "{}", waiter.transcript());
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
    let broker = support::broker();
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

/// A holder behind a proxy that can cut it off from the broker (tansu advertises the proxy, so
/// the coordinator connections pass through it too).
fn partitioned_holder(extra: &[&str], script: &str) -> (Proxy, TestBroker, Run, Value) {
    let proxy = Proxy::start();
    let broker = TestBroker::start_private_advertising(proxy.port());
    proxy.set_target(broker.addr());
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
            "4s",
            "--kill-grace",
            "1s",
            "--request-timeout",
            "2s",
        ],
        script,
    );
    let cut = Instant::now();
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
    assert!(mono(exited, "mono_ns") >= mono(&lost, "mono_ns"));
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
            "4s",
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
    let grace_ns = mono(&exited, "mono_ns") - mono(&lost, "mono_ns");
    assert!(
        grace_ns >= 1_400_000_000,
        "SIGKILL came {grace_ns} ns after the loss, before the 1.5 s grace"
    );
    assert_eq!(run.finish(STEP), 74, "{}", run.transcript());
    assert!(run.failure_line().contains("SIGKILL after 1s 500ms"));
}

#[test]
fn killing_kafka_lock_kills_the_command() {
    let lock = lock_name("pdeathsig");
    let mut run = run_cmd(
        &support::broker().bootstrap(),
        &lock,
        QUICK,
        &sh("echo ready; exec sleep 600"),
    )
    .spawn();
    run.stdout_line("ready", STEP);
    run.signal("KILL");
    // The command holds the other end of the stdout pipe: EOF means it is gone.
    let deadline = Instant::now() + STEP;
    loop {
        match run
            .stdout
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            Ok(_) => {}
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {
                panic!("the command outlived the SIGKILLed kafka-lock by {STEP:?}")
            }
        }
    }
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

#[test]
fn invalid_or_rejected_settings_exit_78() {
    let broker = support::broker();
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

    // Consumer-compatible mode refuses topics that cannot be a lock.
    let wide = lock_name("wide-topic");
    support::create_topic(&b, &wide, 3);
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
    // tansu accepts any session timeout, but it refuses a member whose protocol differs from the
    // group's (INCONSISTENT_GROUP_PROTOCOL): a consumer-mode run on a natively held lock.
    let broker = support::broker();
    let b = broker.bootstrap();
    let lock = lock_name("protocol");
    let topic = lock_name("protocol-topic");
    support::create_topic(&b, &topic, 1);
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

fn status_json(bootstrap: &str, lock: &str) -> Value {
    let (code, stderr, stdout) = run_to_end(
        &["status", "--bootstrap", bootstrap, "--lock", lock, "--json"],
        STEP,
    );
    assert_eq!(code, 0, "{stderr:?}");
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("status --json printed invalid JSON ({e}): {stdout}"))
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

#[test]
fn status_names_the_members_and_what_it_knows_of_the_holder() {
    let broker = support::broker();
    let b = broker.bootstrap();
    let lock = lock_name("describe");

    let empty = status_json(&b, &lock);
    assert_eq!(empty["lock"], lock.as_str());
    assert_eq!(member_count(&empty), 0, "{empty}");
    assert_eq!(empty["holder"], Value::Null);

    let (mut holder, acquired) = start_holder(&b, &lock, "status holder");
    let mut extra = vec!["--label", "status waiter"];
    extra.extend(CONTENDED);
    let mut waiter = run_cmd(&b, &lock, &extra, &["true"]).spawn();
    waiter.event("waiting", STEP);

    let s = status_json(&b, &lock);
    assert_eq!(s["protocol_type"], "kafka-lock", "{s}");
    assert_eq!(member_count(&s), 2, "{s}");
    let holder_id = acquired["member_id"].as_str().expect("member id");
    if s["holder_known"] == true {
        // Apache Kafka reports member assignments: the holder is named with its label and token.
        assert_eq!(s["holder"]["member_id"], holder_id, "{s}");
        assert_eq!(s["holder"]["label"], "status holder", "{s}");
        assert!(s["holder"]["token"].as_i64() >= acquired["token"].as_i64());
        assert_eq!(s["waiters"][0]["label"], "status waiter", "{s}");
    } else {
        // tansu sends empty member metadata and assignments: status must say it cannot know.
        assert_eq!(
            s["holder_unknown_reason"],
            "the broker does not report member assignments"
        );
        let ids: HashSet<&str> = s["members"]
            .as_array()
            .expect("members")
            .iter()
            .filter_map(|m| m["member_id"].as_str())
            .collect();
        assert!(ids.contains(holder_id), "{s}");
    }
    let (code, stderr, text) = run_to_end(&["status", "--bootstrap", &b, "--lock", &lock], STEP);
    assert_eq!(code, 0, "{stderr:?}");
    assert!(text.contains(holder_id), "{text}");
    assert!(text.contains("holder: "), "{text}");

    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());
    // The waiter takes over and its command (`true`) ends at once.
    let next = waiter.event("acquired", STEP);
    assert!(token(&next) > token(&acquired));
    assert_eq!(waiter.finish(STEP), 0, "{}", waiter.transcript());
}

/// Apache Kafka's DescribeGroups carries every member's metadata and assignment (tansu's does
/// not), and from those `status` names the holder, its label and token, and the queue. A scripted
/// coordinator answers as Apache would, with bytes kafka-lock's own members would have sent.
#[test]
fn status_names_the_holder_from_an_apache_style_describe() {
    use kafka_lock::assign::{Holder, MemberMetadata, NativeAssignment};
    use kafka_protocol::messages::describe_groups_response::{
        DescribeGroupsResponse, DescribedGroup, DescribedGroupMember,
    };
    use kafka_protocol::messages::{ApiKey, GroupId};
    use kafka_protocol::protocol::StrBytes;

    let lock = lock_name("apache-status");
    let member = |id: &str, label: &str, holds: bool, first: i32, position: i32| {
        let mut m = DescribedGroupMember::default();
        m.member_id = StrBytes::from_string(id.to_owned());
        m.client_id = StrBytes::from_static_str("kafka-lock");
        m.client_host = StrBytes::from_static_str("/127.0.0.1");
        m.member_metadata = MemberMetadata {
            holds,
            first_joined_generation: first,
            holder_generation: if holds { 7 } else { -1 },
            label: Some(label.to_owned()),
        }
        .encode();
        m.member_assignment = NativeAssignment {
            holder: Some(Holder {
                member_id: "kafka-lock-holder".into(),
                label: Some("nightly on host-a".into()),
                generation: 9,
            }),
            position,
            members: 3,
        }
        .encode();
        m
    };
    let group = {
        let mut g = DescribedGroup::default();
        g.group_id = GroupId(StrBytes::from_string(lock.clone()));
        g.group_state = StrBytes::from_static_str("Stable");
        g.protocol_type = StrBytes::from_static_str(kafka_lock::assign::PROTOCOL_TYPE);
        g.protocol_data = StrBytes::from_static_str(kafka_lock::assign::NATIVE_PROTOCOL);
        g.members = vec![
            member("kafka-lock-waiter-2", "retry on host-c", false, 8, 2),
            member("kafka-lock-holder", "nightly on host-a", true, 5, 0),
            member("kafka-lock-waiter-1", "nightly on host-b", false, 6, 1),
        ];
        g
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fake = rt.block_on(crate::fake_broker::start(std::sync::Arc::new(
        move |api: ApiKey, version: i16, _body: &mut bytes::BytesMut| {
            (api == ApiKey::DescribeGroups).then(|| {
                let mut r = DescribeGroupsResponse::default();
                r.groups = vec![group.clone()];
                crate::fake_broker::encode(&r, version)
            })
        },
    )));
    let status = status_json(&fake.addr.to_string(), &lock);
    assert_eq!(status["holder_known"], true, "{status}");
    assert_eq!(
        status["holder"]["member_id"], "kafka-lock-holder",
        "{status}"
    );
    assert_eq!(status["holder"]["label"], "nightly on host-a", "{status}");
    assert_eq!(status["holder"]["token"], 9, "{status}");
    let waiters: Vec<&str> = status["waiters"]
        .as_array()
        .expect("waiters listed")
        .iter()
        .map(|w| w["member_id"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(
        waiters,
        ["kafka-lock-waiter-1", "kafka-lock-waiter-2"],
        "queue order: {status}"
    );
    drop(fake);
}

/// The seed design's first failure: a paused holder (a GC pause, a stopped VM) woke up still
/// believing it held the lock. Here the holder's kafka-lock is frozen with SIGSTOP for longer than
/// its session, another contender takes the lock, and the holder is resumed. Its lease must have
/// ended before the new holder acquired, it must report the loss at once with that lease end,
/// stop its command, and exit 74; the new holder's token is greater.
#[test]
fn a_paused_holder_wakes_up_to_a_lost_lock_that_ended_before_the_next_holder_began() {
    let broker = support::broker();
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

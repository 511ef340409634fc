//! The seed design's Java lock peer (`tests/java/SeedLockPeer.java`) as a process a test drives:
//! start it, read its events, ask it to close, or kill it.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{jvm, new_log_path};
use crate::support::lifeline::{Output, Supervised};
use crate::support::log_tail;

/// The partition assignors the peer offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignors {
    /// Java's default, `[range, cooperative-sticky]`: the coordinator picks range while every
    /// member offers it (eager rebalancing: every rebalance revokes everything first).
    JavaDefault,
    /// `cooperative-sticky` only: incremental rebalancing, the holder keeps partition 0.
    CooperativeSticky,
}

/// How to start a [`SeedPeer`].
#[derive(Debug, Clone)]
pub struct SeedPeerOptions {
    pub bootstrap: String,
    pub group: String,
    /// A topic with exactly one partition; the peer refuses any other.
    pub topic: String,
    /// `client.id`; member ids start with it, which decides who range gives partition 0 to.
    pub client_id: Option<String>,
    pub session_timeout: Duration,
    pub heartbeat_interval: Duration,
    pub assignors: Assignors,
}

impl SeedPeerOptions {
    /// The seed design's settings on the given lock topic: session 10 s, heartbeat 3 s, Java's
    /// default assignors. Group id = topic, as the seed design does it.
    pub fn new(bootstrap: &str, topic: &str) -> SeedPeerOptions {
        SeedPeerOptions {
            bootstrap: bootstrap.to_owned(),
            group: topic.to_owned(),
            topic: topic.to_owned(),
            client_id: None,
            session_timeout: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(3),
            assignors: Assignors::JavaDefault,
        }
    }
}

/// What a peer reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerEventKind {
    Started,
    Acquired,
    Revoked,
    Lost,
    Now,
    Closed,
}

/// One line of a peer's stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerEvent {
    pub kind: PeerEventKind,
    /// `System.nanoTime()` when it happened: CLOCK_MONOTONIC, comparable with
    /// [`crate::support::mono_ns`].
    pub mono_ns: i64,
    /// The group generation and member id, for ACQUIRED, REVOKED and LOST.
    pub generation: Option<i32>,
    pub member_id: Option<String>,
}

impl PeerEvent {
    fn parse(line: &str) -> Option<PeerEvent> {
        let mut fields = line.split_whitespace();
        let kind = match fields.next()? {
            "STARTED" => PeerEventKind::Started,
            "ACQUIRED" => PeerEventKind::Acquired,
            "REVOKED" => PeerEventKind::Revoked,
            "LOST" => PeerEventKind::Lost,
            "NOW" => PeerEventKind::Now,
            "CLOSED" => PeerEventKind::Closed,
            _ => return None,
        };
        Some(PeerEvent {
            kind,
            mono_ns: fields.next()?.parse().ok()?,
            generation: fields.next().and_then(|g| g.parse().ok()),
            member_id: fields.next().map(str::to_owned),
        })
    }
}

/// A running SeedLockPeer. Dropped, it is killed (SIGKILL), and it dies with the test process.
pub struct SeedPeer {
    process: Supervised,
    events: mpsc::Receiver<PeerEvent>,
    /// Every event received so far, in order.
    log: Vec<PeerEvent>,
    /// The peer's stderr (the Java client's warnings, exceptions).
    stderr: PathBuf,
}

impl SeedPeer {
    /// Starts a peer. It subscribes at once; watch for [`PeerEventKind::Acquired`].
    ///
    /// # Panics
    /// When Java or the jars are missing, or the process cannot start.
    pub fn start(options: &SeedPeerOptions) -> SeedPeer {
        let mut cmd = jvm().source_command("SeedLockPeer.java");
        cmd.args(["--bootstrap", &options.bootstrap])
            .args(["--group", &options.group])
            .args(["--topic", &options.topic])
            .arg("--session-timeout-ms")
            .arg(options.session_timeout.as_millis().to_string())
            .arg("--heartbeat-interval-ms")
            .arg(options.heartbeat_interval.as_millis().to_string())
            .arg("--assignors")
            .arg(match options.assignors {
                Assignors::JavaDefault => "default",
                Assignors::CooperativeSticky => "cooperative-sticky",
            });
        if let Some(id) = &options.client_id {
            cmd.args(["--client-id", id]);
        }
        let stderr = new_log_path("seed-peer");
        let (process, stdout) = Supervised::spawn(&cmd, Output::Piped { stderr: &stderr }, None)
            .unwrap_or_else(|e| panic!("cannot start SeedLockPeer: {e}"));
        let stdout = stdout.expect("stdout is piped");
        let (tx, events) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(event) = PeerEvent::parse(&line) {
                    if tx.send(event).is_err() {
                        return;
                    }
                }
            }
        });
        SeedPeer {
            process,
            events,
            log: Vec::new(),
            stderr,
        }
    }

    /// Waits up to `bound` for the next event of `kind`, keeping every event on the way.
    ///
    /// # Panics
    /// When none comes in time or the peer's output ends; the message has its events and the
    /// end of its stderr.
    pub fn wait_for(&mut self, kind: PeerEventKind, bound: Duration) -> PeerEvent {
        let deadline = Instant::now() + bound;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(event) => {
                    self.log.push(event.clone());
                    if event.kind == kind {
                        return event;
                    }
                }
                Err(e) => panic!(
                    "SeedLockPeer (pid {}): no {kind:?} within {bound:?} ({e}); events: {:?}\n{}",
                    self.process.pid(),
                    self.log,
                    self.stderr_tail()
                ),
            }
        }
    }

    /// Takes whatever events have arrived, without waiting.
    pub fn drain(&mut self) -> &[PeerEvent] {
        while let Ok(event) = self.events.try_recv() {
            self.log.push(event);
        }
        &self.log
    }

    /// Every event received so far.
    pub fn events(&self) -> &[PeerEvent] {
        &self.log
    }

    /// Asks the peer for its `System.nanoTime()`.
    pub fn now(&mut self) -> i64 {
        self.send("now");
        self.wait_for(PeerEventKind::Now, Duration::from_secs(10))
            .mono_ns
    }

    /// Asks the peer to close its consumer (LeaveGroup) and exit, and waits up to `bound` for
    /// [`PeerEventKind::Closed`] and a clean exit.
    pub fn quit(&mut self, bound: Duration) -> PeerEvent {
        self.send("quit");
        let closed = self.wait_for(PeerEventKind::Closed, bound);
        match self.process.wait_exit(bound) {
            Some(status) if status.success() => closed,
            other => panic!(
                "SeedLockPeer closed but exited with {other:?}\n{}",
                self.stderr_tail()
            ),
        }
    }

    /// Sends `signal` (`libc::SIG*`) to the JVM.
    pub fn signal(&mut self, signal: i32) {
        self.process.signal(signal);
    }

    /// The JVM's exit status once it has ended (killed, or closed), without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.process.exited()
    }

    /// The JVM's pid.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    fn send(&mut self, line: &str) {
        if let Err(e) = self.process.send_line(line) {
            panic!("cannot write to SeedLockPeer: {e}\n{}", self.stderr_tail());
        }
    }

    /// The intervals during which this peer held partition 0: from each ACQUIRED to the next
    /// REVOKED, LOST or CLOSED (or `i64::MAX` while it still holds).
    pub fn held_intervals(&self) -> Vec<(i64, i64)> {
        let mut out = Vec::new();
        let mut start = None;
        for event in &self.log {
            match event.kind {
                PeerEventKind::Acquired => start = Some(event.mono_ns),
                PeerEventKind::Revoked | PeerEventKind::Lost | PeerEventKind::Closed => {
                    if let Some(s) = start.take() {
                        out.push((s, event.mono_ns));
                    }
                }
                _ => {}
            }
        }
        out.extend(start.map(|s| (s, i64::MAX)));
        out
    }

    /// The end of the peer's stderr, for failure messages.
    pub fn stderr_tail(&self) -> String {
        format!(
            "--- last lines of {} ---\n{}\n--- end ---",
            self.stderr.display(),
            log_tail(&self.stderr, 30)
        )
    }
}

#[test]
fn peer_lines_parse() {
    let e = PeerEvent::parse("ACQUIRED 123 4 consumer-g-1-abc").unwrap();
    assert_eq!(e.kind, PeerEventKind::Acquired);
    assert_eq!(
        (e.mono_ns, e.generation, e.member_id.as_deref()),
        (123, Some(4), Some("consumer-g-1-abc"))
    );
    let e = PeerEvent::parse("CLOSED 9").unwrap();
    assert_eq!((e.kind, e.generation), (PeerEventKind::Closed, None));
    assert!(PeerEvent::parse("[2026-12-01] WARN something").is_none());
    assert!(PeerEvent::parse("ACQUIRED soon").is_none());
}

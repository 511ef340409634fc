//! `kafka-lock run`: take the lock, run the command while holding it, stop the command if the
//! lock is lost, release the lock when the command ends.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use kafka_lock::lock::{
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_LEASE_MARGIN, DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_SESSION_TIMEOUT,
};
use kafka_lock::{LockEvent, LockGuard, LockOptions, LossReason};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;

use crate::exit::{self, Failure};
use crate::report::{ChildEnd, Reporter};
use crate::sys;

/// The longest default grace between SIGTERM and SIGKILL.
const MAX_DEFAULT_KILL_GRACE: Duration = Duration::from_secs(2);
/// How long to wait for the session to report a loss it has already decided, so the `lost`
/// event can carry the lease end it computed. The child is signalled before this wait.
const LOSS_REPORT_BOUND: Duration = Duration::from_millis(500);

/// Everything `run` was given, already parsed.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub bootstrap: String,
    pub lock: String,
    pub topic: Option<String>,
    pub wait: Option<Duration>,
    pub session_timeout: Option<Duration>,
    pub heartbeat_interval: Option<Duration>,
    pub rebalance_timeout: Option<Duration>,
    pub request_timeout: Option<Duration>,
    pub connect_timeout: Option<Duration>,
    pub lease_margin: Option<Duration>,
    pub kill_grace: Option<Duration>,
    pub label: Option<String>,
    pub client_id: String,
    pub events_json: bool,
    pub command: Vec<OsString>,
}

/// The timeouts after defaults are filled in and checked against each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub session: Duration,
    pub rebalance: Duration,
    pub heartbeat: Duration,
    pub request: Duration,
    pub connect: Duration,
    pub margin: Duration,
    pub kill_grace: Duration,
}

impl Timing {
    /// Fills in defaults that follow the session timeout, so that setting only
    /// `--session-timeout` always gives a consistent set, and rejects inconsistent explicit ones
    /// with a message that names the flags involved.
    pub fn resolve(c: &RunConfig) -> Result<Timing, Failure> {
        let bad = |m: String| Err(Failure::new(exit::CONFIG, m));
        let session = c.session_timeout.unwrap_or(DEFAULT_SESSION_TIMEOUT);
        if session.is_zero() {
            return bad("--session-timeout must be positive".into());
        }
        // A rebalance timeout shorter than the session would shorten the lease; equal is the
        // natural default for a lock.
        let rebalance = c.rebalance_timeout.unwrap_or(session);
        let kill_grace = c
            .kill_grace
            .unwrap_or(MAX_DEFAULT_KILL_GRACE.min(session / 5));
        if kill_grace >= session {
            return bad(format!(
                "--kill-grace {} must be shorter than --session-timeout {}: after a loss the command \
                 must be stopped before the broker can give the lock to another member",
                sys::human(kill_grace),
                sys::human(session)
            ));
        }
        // The command is SIGKILLed at the lease end plus the grace; a margin at least as long as
        // the grace makes that happen before the broker could give the lock to anyone else.
        let margin = c
            .lease_margin
            .unwrap_or(DEFAULT_LEASE_MARGIN.min(session / 4).max(kill_grace));
        let lease = session.min(rebalance).saturating_sub(margin);
        if lease.is_zero() {
            return bad(format!(
                "--lease-margin {} leaves no lease: it must be shorter than the smaller of \
                 --session-timeout ({}) and --rebalance-timeout ({}); lower it or raise them",
                sys::human(margin),
                sys::human(session),
                sys::human(rebalance)
            ));
        }
        let heartbeat = c
            .heartbeat_interval
            .unwrap_or(DEFAULT_HEARTBEAT_INTERVAL.min(lease / 3));
        if heartbeat.is_zero() {
            return bad("--heartbeat-interval must be positive".into());
        }
        if heartbeat * 2 > lease {
            return bad(format!(
                "--heartbeat-interval {} is too long for a lease of {} (the smaller of \
                 --session-timeout and --rebalance-timeout, minus the {} lease margin): the lease must \
                 be renewed at least twice before it runs out; lower --heartbeat-interval (a tenth of \
                 the session timeout is usual) or raise --session-timeout",
                sys::human(heartbeat),
                sys::human(lease),
                sys::human(margin)
            ));
        }
        let request = c.request_timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT);
        if request.is_zero() {
            return bad("--request-timeout must be positive".into());
        }
        let connect = c
            .connect_timeout
            .unwrap_or(kafka_lock::driver::DEFAULT_CONNECT_TIMEOUT);
        if connect.is_zero() {
            return bad("--connect-timeout must be positive".into());
        }
        Ok(Timing {
            session,
            rebalance,
            heartbeat,
            request,
            connect,
            margin,
            kill_grace,
        })
    }
}

/// SIGINT and SIGTERM, caught from the start so neither kills kafka-lock while it holds the lock.
struct Signals {
    int: Signal,
    term: Signal,
}

impl Signals {
    fn new() -> Result<Signals, Failure> {
        let install = |kind| {
            signal(kind).map_err(|e| {
                Failure::new(exit::OSERR, format!("cannot install a signal handler: {e}; this is a bug or a very unusual system"))
            })
        };
        Ok(Signals {
            int: install(SignalKind::interrupt())?,
            term: install(SignalKind::terminate())?,
        })
    }

    /// The next signal's number. Cancel-safe.
    async fn recv(&mut self) -> i32 {
        tokio::select! {
            Some(()) = self.int.recv() => libc::SIGINT,
            Some(()) = self.term.recv() => libc::SIGTERM,
        }
    }
}

/// Runs `kafka-lock run`. `Ok` carries the command's status; `Err` kafka-lock's own failure.
pub async fn run(c: RunConfig) -> Result<u8, Failure> {
    let t = Timing::resolve(&c)?;
    let label = c
        .label
        .clone()
        .unwrap_or_else(|| format!("{} pid {}", sys::hostname(), std::process::id()));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut opts = LockOptions::new(&c.bootstrap, c.lock.clone())
        .session_timeout(t.session)
        .rebalance_timeout(t.rebalance)
        .heartbeat_interval(t.heartbeat)
        .request_timeout(t.request)
        .connect_timeout(t.connect)
        .lease_margin(t.margin)
        .label(label)
        .client_id(c.client_id.clone())
        .events(tx);
    if let Some(topic) = &c.topic {
        opts = opts.consumer_topic(topic.clone());
    }
    opts.validate()
        .map_err(|e| exit::failure(&e, &c.lock, &c.bootstrap))?;
    let mut signals = Signals::new()?;
    let mut rep = Reporter::new(&c.lock, c.events_json);

    // Waiting for the lock. `--wait 0` is one try: the first completed generation decides.
    let outcome = {
        let once = c.wait == Some(Duration::ZERO);
        let acquire = async {
            if once {
                opts.try_acquire().await
            } else {
                opts.acquire(c.wait).await.map(Some)
            }
        };
        tokio::pin!(acquire);
        let mut ticks = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                res = &mut acquire => break Ok(res),
                Some(ev) = rx.recv() => waiting_event(&mut rep, ev),
                sig = signals.recv() => break Err(sig),
                _ = ticks.tick(), if rep.wants_ticks() => rep.tick(),
            }
        }
    };
    let guard = match outcome {
        Ok(Ok(Some(guard))) => guard,
        Ok(Ok(None)) => {
            while let Ok(ev) = rx.try_recv() {
                waiting_event(&mut rep, ev);
            }
            rep.close_line();
            let held_by = rep
                .holder_text()
                .map(|h| format!("it is held by {h}"))
                .unwrap_or_else(|| "another member was chosen".to_owned());
            return Err(Failure::new(
                exit::NOT_ACQUIRED,
                format!(
                    "lock {:?} was not acquired on the one try --wait 0 allows: {held_by}; try again \
                     later, or wait for it with a longer --wait",
                    c.lock
                ),
            ));
        }
        Ok(Err(e)) => {
            rep.close_line();
            return Err(exit::failure(&e, &c.lock, &c.bootstrap));
        }
        Err(sig) => {
            rep.close_line();
            // The acquire was dropped, which makes its session leave the group. The session's
            // event sender goes away when it has left; with ours dropped too, the channel closes
            // exactly then (or at once if no session was started yet).
            drop(opts);
            let bound = t.request + t.connect + Duration::from_secs(1);
            let _ = tokio::time::timeout(bound, async { while rx.recv().await.is_some() {} }).await;
            return Err(Failure::new(
                128 + sig as u8,
                format!(
                    "interrupted by {} while waiting for lock {:?}; left the group without running the command",
                    sys::signal_name(sig),
                    c.lock
                ),
            ));
        }
    };
    // Waiting events already forwarded belong before `acquired`; later ones are stale.
    while let Ok(ev) = rx.try_recv() {
        waiting_event(&mut rep, ev);
    }
    rep.acquired(&guard.token());
    hold(&c, t, guard, rx, signals, rep).await
}

fn waiting_event(rep: &mut Reporter, ev: LockEvent) {
    if let LockEvent::Waiting {
        member_id,
        holder,
        position,
    } = ev
    {
        rep.waiting(member_id, holder, position);
    }
}

/// Runs the command under `guard` and returns its status, or 74 if the lock was lost meanwhile.
async fn hold(
    c: &RunConfig,
    t: Timing,
    guard: LockGuard,
    mut rx: mpsc::UnboundedReceiver<LockEvent>,
    mut signals: Signals,
    mut rep: Reporter,
) -> Result<u8, Failure> {
    let token = guard.token();
    if !guard.is_held() {
        // The lease ran out between the grant and now (a paused process): starting the command
        // would run it without the lock.
        let _ = guard.release().await;
        return Err(Failure::new(
            exit::NOT_ACQUIRED,
            format!(
                "lock {:?} was granted but its lease ran out before the command could start (was \
                 kafka-lock paused?); the command was not run; try again",
                c.lock
            ),
        ));
    }
    let program = &c.command[0];
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&c.command[1..])
        .env("KAFKA_LOCK_NAME", &c.lock)
        .env("KAFKA_LOCK_TOKEN", token.generation.to_string())
        .env("KAFKA_LOCK_MEMBER_ID", &token.member_id)
        // Its own process group, so a loss stops everything it started, and a Ctrl-C on the
        // terminal reaches it only through kafka-lock, which then releases the lock after it.
        .process_group(0);
    sys::die_with_parent(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            let status = if e.kind() == std::io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
            rep.released();
            let _ = guard.release().await;
            return Err(Failure::new(
                status,
                format!(
                    "cannot run {:?}: {e}; check the command name, its permissions and $PATH (the lock was \
                     released without running it)",
                    program
                ),
            ));
        }
    };
    let Some(pgid) = child.id() else {
        return Err(Failure::new(
            exit::OSERR,
            "the command ended before its process id could be read; this is a bug",
        ));
    };
    rep.child_started(pgid);

    let mut lost: Option<LossReason> = None;
    let mut kill_at: Option<tokio::time::Instant> = None;
    let mut killed = false;
    let waited = loop {
        tokio::select! {
            // The command's end first: if it ended, nothing else matters any more.
            biased;
            st = child.wait() => break st,
            reason = guard.lost(), if lost.is_none() => {
                stop(pgid, t.kill_grace, &mut kill_at, &mut killed);
                let lease_end = loss_lease_end(&mut rx, &guard).await;
                rep.lost(&reason, lease_end);
                lost = Some(reason);
            }
            Some(ev) = rx.recv() => match ev {
                LockEvent::Lost { reason, lease_end } if lost.is_none() => {
                    stop(pgid, t.kill_grace, &mut kill_at, &mut killed);
                    rep.lost(&reason, Some(lease_end));
                    lost = Some(reason);
                }
                LockEvent::TokenChanged { token } if lost.is_none() => rep.token_changed(&token),
                _ => {}
            },
            _ = sleep_until(kill_at), if !killed => {
                let _ = sys::kill_group(pgid, libc::SIGKILL);
                killed = true;
            }
            sig = signals.recv() => {
                // Passed on to the whole group; the lock is released once the command is gone.
                let _ = sys::kill_group(pgid, sig);
            }
        }
    };
    let status = match waited {
        Ok(status) => status,
        Err(e) => {
            let _ = sys::kill_group(pgid, libc::SIGKILL);
            return Err(Failure::new(
                exit::OSERR,
                format!(
                    "cannot wait for the command: {e}; it was killed, and the lock is released"
                ),
            ));
        }
    };
    let end = child_end(status);
    // The lease may have run out in the same instant the command ended: then it ran without the
    // lock at the end, and that must not be reported as success.
    if lost.is_none() && !guard.is_held() {
        let reason = LossReason::LeaseExpired;
        rep.lost(&reason, Some(guard.lease_end()));
        lost = Some(reason);
    }
    rep.child_exited(end);
    match lost {
        None => {
            // The hold ends here, before the LeaveGroup goes out.
            rep.released();
            let _ = guard.release().await;
            Ok(end.status)
        }
        Some(reason) => {
            if !killed {
                // Anything the command left behind in its group runs without the lock.
                let _ = sys::kill_group(pgid, libc::SIGKILL);
            }
            let _ = guard.release().await;
            Err(Failure::new(
                exit::LOST,
                format!(
                    "lost lock {:?} while the command ran ({reason}); the command was stopped (SIGTERM, \
                     then SIGKILL after {}) and ended with status {}; check the network path to the \
                     Kafka cluster, or raise --session-timeout if the host pauses for long",
                    c.lock,
                    sys::human(t.kill_grace),
                    end.status
                ),
            ))
        }
    }
}

/// Sends SIGTERM to the command's group and arms the SIGKILL timer (at once for a zero grace).
fn stop(pgid: u32, grace: Duration, kill_at: &mut Option<tokio::time::Instant>, killed: &mut bool) {
    if grace.is_zero() {
        let _ = sys::kill_group(pgid, libc::SIGKILL);
        *killed = true;
    } else {
        let _ = sys::kill_group(pgid, libc::SIGTERM);
        *kill_at = Some(tokio::time::Instant::now() + grace);
    }
}

/// The lease end of a loss the guard reported: the session announces the same loss with the
/// instant it computed; the guard only knows its last lease if it is still the current one.
async fn loss_lease_end(
    rx: &mut mpsc::UnboundedReceiver<LockEvent>,
    guard: &LockGuard,
) -> Option<Instant> {
    let fallback = guard.lease_end();
    let found = tokio::time::timeout(LOSS_REPORT_BOUND, async {
        while let Some(ev) = rx.recv().await {
            if let LockEvent::Lost { lease_end, .. } = ev {
                return Some(lease_end);
            }
        }
        None
    })
    .await;
    match found {
        Ok(Some(at)) => Some(at),
        _ if fallback <= Instant::now() => Some(fallback),
        _ => None,
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn child_end(status: ExitStatus) -> ChildEnd {
    let code = status.code();
    let signal = status.signal();
    let status = match (code, signal) {
        (Some(c), _) => (c & 0xff) as u8,
        (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
        // Neither exited nor signalled cannot happen for a reaped child.
        (None, None) => exit::OSERR,
    };
    ChildEnd {
        code,
        signal,
        status,
    }
}

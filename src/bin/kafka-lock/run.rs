//! `kafka-lock run`: take the lock, have the supervisor process run the command while the lock
//! is held, release the lock once everything the command started is gone.
//!
//! This process (K) keeps the lock session, reports events and takes signals. It never stops
//! the command itself while its supervisor (P, `supervise.rs`) lives: P owns the lease end, which
//! K moves forward at each renewal, and stops the command there on its own. So nothing that can
//! block or starve K (a stalled stderr, a busy runtime, a SIGSTOP of K alone) can keep the
//! command running past the lease.

use std::ffi::OsString;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use kafka_lock::lock::{
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_LEASE_MARGIN, DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_SESSION_TIMEOUT,
};
use kafka_lock::{LockEvent, LockGuard, LockOptions, LossReason};
use rustix::io::{Errno, FdFlags};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
use rustix::process::Signal;
use tokio::io::Interest;
use tokio::net::UnixStream;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::environ::{self, FromEnv};
use crate::exit::{self, Failure};
use crate::proto::{self, ChildExit, FromSupervisor, ProtoError, ToSupervisor, MAX_MESSAGE};
use crate::report::{ChildEnd, Reporter, Source};
use crate::trace::stamp;
use crate::{serve, settings, supervise, sys, tree};

/// The longest default grace between SIGTERM and SIGKILL.
const MAX_DEFAULT_KILL_GRACE: Duration = Duration::from_secs(2);
/// How long to wait for the session to report a loss the guard's own timer has seen, so the
/// `lost` event can carry the lease end the session computed. Nothing waits on it: the
/// supervisor was told to stop the command before.
const LOSS_REPORT_BOUND: Duration = Duration::from_millis(500);
/// The largest timeout Kafka's int32 milliseconds can carry.
pub const MAX_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);
/// The longest `--wait`; without `--wait`, kafka-lock waits without limit.
pub const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

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
    /// `--permits`: 1 is a mutex.
    pub permits: u16,
    pub client_id: String,
    pub ledger_topic: Option<String>,
    pub checkpoint_max_bytes: usize,
    /// TLS and SASL, from the Kafka client settings.
    pub security: kafka_lock::security::Security,
    /// Initial and largest retry backoff, when the settings give them.
    pub retry_backoff: Option<(Duration, Duration)>,
    /// Lines about the settings (keys ignored, host name checks off), shown before anything.
    pub warnings: Vec<String>,
    pub events_json: bool,
    /// Replaces 75 (`-E`, `--conflict-exit-code`).
    pub conflict_exit_code: Option<u8>,
    /// Replaces 74 (`--lost-exit-code`).
    pub lost_exit_code: Option<u8>,
    pub metrics_listen: Option<SocketAddr>,
    /// Flags set through their variables, named in failure lines.
    pub from_env: FromEnv,
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
    pub wait: Option<Duration>,
}

/// A duration flag's upper bound, with how to say it.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    pub max: Duration,
    pub text: &'static str,
}

/// Kafka's timeouts are int32 milliseconds; longer ones are refused (and would overflow clocks
/// further down).
pub const TIMEOUT_BOUND: Bound = Bound {
    max: MAX_TIMEOUT,
    text: "2147483647ms (24 days 20 hours), Kafka's largest timeout",
};
const WAIT_BOUND: Bound = Bound {
    max: MAX_WAIT,
    text: "365 days; leave --wait out to wait without limit",
};

/// Checks one duration flag's range: positive unless `zero_ok`, at most `bound`.
pub fn in_range(flag: &str, d: Duration, bound: Bound, zero_ok: bool) -> Result<Duration, Failure> {
    if d.is_zero() && !zero_ok {
        return Err(Failure::new(
            exit::CONFIG,
            format!("{flag} must be positive"),
        ));
    }
    if d > bound.max {
        return Err(Failure::new(
            exit::CONFIG,
            format!("{flag} is out of range: it must be at most {}", bound.text),
        ));
    }
    Ok(d)
}

impl Timing {
    /// Fills in defaults that follow the session and rebalance timeouts, so that setting only
    /// `--session-timeout` always gives a consistent set, and rejects inconsistent explicit ones
    /// with a message that names the flags involved.
    ///
    /// The command must be dead before the broker can give the lock to anyone else. The broker
    /// can drop us no earlier than `min(session, rebalance)` after we sent the renewal that
    /// re-armed its timer; the lease ends `margin` before that, the supervisor sends SIGTERM at
    /// the lease end and SIGKILL `kill_grace` later. Hence `kill_grace <= margin <
    /// min(session, rebalance)`, and the lease must be renewed (every heartbeat) at least twice
    /// within it.
    pub fn resolve(c: &RunConfig) -> Result<Timing, Failure> {
        let bad = |m: String| Err(Failure::new(exit::CONFIG, m));
        let session = in_range(
            "--session-timeout",
            c.session_timeout.unwrap_or(DEFAULT_SESSION_TIMEOUT),
            TIMEOUT_BOUND,
            false,
        )?;
        // A rebalance timeout shorter than the session shortens the lease; equal is the natural
        // default for a lock.
        let rebalance = in_range(
            "--rebalance-timeout",
            c.rebalance_timeout.unwrap_or(session),
            TIMEOUT_BOUND,
            false,
        )?;
        let window = session.min(rebalance);
        let kill_grace = in_range(
            "--kill-grace",
            c.kill_grace
                .unwrap_or(MAX_DEFAULT_KILL_GRACE.min(window / 5)),
            TIMEOUT_BOUND,
            true,
        )?;
        if kill_grace >= window {
            return bad(format!(
                "--kill-grace {} must be shorter than --session-timeout {} and --rebalance-timeout \
                 {}: after a loss the command must be stopped before the broker can give the lock \
                 to another member",
                sys::human(kill_grace),
                sys::human(session),
                sys::human(rebalance)
            ));
        }
        // The command is SIGKILLed at the lease end plus the grace; a margin at least as long as
        // the grace makes that happen before the broker could give the lock to anyone else.
        let margin = in_range(
            "--lease-margin",
            c.lease_margin
                .unwrap_or(DEFAULT_LEASE_MARGIN.min(window / 4).max(kill_grace)),
            TIMEOUT_BOUND,
            true,
        )?;
        if margin < kill_grace {
            return bad(format!(
                "--lease-margin {} is shorter than --kill-grace {}: the command is SIGKILLed at the \
                 lease end plus the grace, but the broker may give the lock away at the lease end \
                 plus the margin; raise --lease-margin to at least {} or lower --kill-grace",
                sys::human(margin),
                sys::human(kill_grace),
                sys::human(kill_grace)
            ));
        }
        let lease = window.saturating_sub(margin);
        if lease.is_zero() {
            return bad(format!(
                "--lease-margin {} leaves no lease: it must be shorter than the smaller of \
                 --session-timeout ({}) and --rebalance-timeout ({}); lower it or raise them",
                sys::human(margin),
                sys::human(session),
                sys::human(rebalance)
            ));
        }
        let heartbeat = in_range(
            "--heartbeat-interval",
            c.heartbeat_interval.unwrap_or(
                DEFAULT_HEARTBEAT_INTERVAL
                    .min(lease / 3)
                    .max(Duration::from_millis(1)),
            ),
            TIMEOUT_BOUND,
            false,
        )?;
        if heartbeat.saturating_mul(2) > lease {
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
        let request = in_range(
            "--request-timeout",
            c.request_timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT),
            TIMEOUT_BOUND,
            false,
        )?;
        let connect = in_range(
            "--connect-timeout",
            c.connect_timeout
                .unwrap_or(kafka_lock::driver::DEFAULT_CONNECT_TIMEOUT),
            TIMEOUT_BOUND,
            false,
        )?;
        let wait = match c.wait {
            Some(w) => Some(in_range("--wait", w, WAIT_BOUND, true)?),
            None => None,
        };
        Ok(Timing {
            session,
            rebalance,
            heartbeat,
            request,
            connect,
            margin,
            kill_grace,
            wait,
        })
    }
}

/// The terminating signals kafka-lock takes over, so none of them kills it while it holds the
/// lock. While the command runs they are passed on to its process group; while waiting they
/// make kafka-lock leave the group and exit 128+N; during the final release they cut it short.
/// SIGPIPE stays ignored (Rust's default): kafka-lock sees EPIPE on a write instead.
const CAUGHT: [i32; 6] = [
    Signal::HUP.as_raw(),
    Signal::INT.as_raw(),
    Signal::QUIT.as_raw(),
    Signal::TERM.as_raw(),
    Signal::USR1.as_raw(),
    Signal::USR2.as_raw(),
];

pub(crate) struct Signals {
    streams: Vec<(i32, tokio::signal::unix::Signal)>,
    /// The last signal received: `elect` stops campaigning after SIGINT or SIGTERM.
    pub(crate) last: Option<i32>,
    /// Never read. Installing a SIGCHLD handler undoes an ignored SIGCHLD inherited from our
    /// parent (SIG_IGN survives exec, a handler does not): with SIGCHLD ignored the kernel reaps
    /// children on its own, and neither we nor the supervisor could wait for them or learn the
    /// command's status.
    _child: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn new() -> Result<Signals, Failure> {
        let mut streams = Vec::with_capacity(CAUGHT.len());
        for n in CAUGHT {
            let s = signal(SignalKind::from_raw(n)).map_err(|e| {
                Failure::new(
                    exit::OSERR,
                    format!(
                        "cannot install a handler for {}: {e}; this is a bug or a very unusual system",
                        sys::signal_name(n)
                    ),
                )
            })?;
            streams.push((n, s));
        }
        let child = signal(SignalKind::child()).map_err(|e| {
            Failure::new(
                exit::OSERR,
                format!("cannot install a handler for SIGCHLD: {e}; this is a bug or a very unusual system"),
            )
        })?;
        Ok(Signals {
            streams,
            last: None,
            _child: child,
        })
    }

    /// The next signal's number. Cancel-safe.
    pub(crate) async fn recv(&mut self) -> i32 {
        std::future::poll_fn(|cx| {
            for (n, s) in &mut self.streams {
                if let std::task::Poll::Ready(Some(())) = s.poll_recv(cx) {
                    self.last = Some(*n);
                    return std::task::Poll::Ready(*n);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}

/// Runs `kafka-lock run`. `Ok` carries the command's status; `Err` kafka-lock's own failure,
/// with the status --conflict-exit-code or --lost-exit-code chose. Either way the last event
/// says which it is.
pub async fn run(c: RunConfig) -> Result<u8, Failure> {
    let mut rep = Reporter::new(&c.lock, c.events_json);
    for w in &c.warnings {
        rep.warning(w);
    }
    let result = take_and_run(&c, &mut rep).await;
    conclude(&c, &mut rep, result)
}

/// The `failed` and `exit` events of a `run` whose settings could not be put together.
pub fn failed_before_start(
    lock: &str,
    events_json: bool,
    from_env: &FromEnv,
    f: Failure,
) -> Result<u8, Failure> {
    let mut rep = Reporter::new(lock, events_json);
    let f = environ::annotate(f, from_env);
    rep.failed(f.status, exit::kind(f.status), &f.line);
    rep.exit(f.status, Source::KafkaLock);
    Err(f)
}

/// The `failed` and `exit` events, and the statuses that replace 75 and 74.
pub(crate) fn conclude(
    c: &RunConfig,
    rep: &mut Reporter,
    result: Result<u8, Failure>,
) -> Result<u8, Failure> {
    match result {
        Ok(status) => {
            rep.exit(status, Source::Command);
            Ok(status)
        }
        Err(f) => {
            let mut f = environ::annotate(f, &c.from_env);
            let kind = exit::kind(f.status);
            f.status = match f.status {
                exit::NOT_ACQUIRED => c.conflict_exit_code.unwrap_or(f.status),
                exit::LOST => c.lost_exit_code.unwrap_or(f.status),
                other => other,
            };
            rep.failed(f.status, kind, &f.line);
            rep.exit(f.status, Source::KafkaLock);
            // `-E 0` asked for a busy lock to be a success, and a success says nothing (as
            // flock's): a cron job probing a held lock sends no mail.
            if f.status == 0 && kind == exit::kind(exit::NOT_ACQUIRED) {
                return Ok(0);
            }
            Err(f)
        }
    }
}

async fn take_and_run(c: &RunConfig, rep: &mut Reporter) -> Result<u8, Failure> {
    environ::refuse_nested(&c.lock)?;
    let t = Timing::resolve(c)?;
    let (opts, rx) = options(c, &t)?;
    if let Some(addr) = c.metrics_listen {
        let bound = serve::start(addr).await?;
        rep.metrics_listening(&bound.to_string());
    }
    let mut signals = Signals::new()?;
    term(c, t, opts, rx, &mut signals, rep, &mut None).await
}

/// The lock's options for one term, with the channel its events come on.
pub(crate) fn options(
    c: &RunConfig,
    t: &Timing,
) -> Result<(LockOptions, mpsc::UnboundedReceiver<LockEvent>), Failure> {
    let label = c
        .label
        .clone()
        .unwrap_or_else(|| format!("{} pid {}", sys::hostname(), std::process::id()));
    let (tx, rx) = mpsc::unbounded_channel();
    let mut opts = LockOptions::new(&c.bootstrap, c.lock.clone())
        .session_timeout(t.session)
        .rebalance_timeout(t.rebalance)
        .heartbeat_interval(t.heartbeat)
        .request_timeout(t.request)
        .connect_timeout(t.connect)
        .lease_margin(t.margin)
        .label(label)
        .permits(c.permits)
        .client_id(c.client_id.clone())
        .security(c.security.clone())
        .events(tx);
    if let Some((initial, max)) = c.retry_backoff {
        opts = opts.retry_backoff(initial, max);
    }
    if let Some(topic) = &c.topic {
        opts = opts.consumer_topic(topic.clone());
    }
    if let Some(ledger) = &c.ledger_topic {
        opts = opts
            .ledger_topic(ledger.clone())
            .checkpoint_max_bytes(c.checkpoint_max_bytes);
    }
    opts.validate()
        .map_err(|e| exit::failure(&e, &c.lock, &c.bootstrap))?;
    Ok((opts, rx))
}

/// One term: waits for the lock and runs the command while it is held. `acquired_at` is set
/// when the lock is granted.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn term(
    c: &RunConfig,
    t: Timing,
    opts: LockOptions,
    rx: mpsc::UnboundedReceiver<LockEvent>,
    signals: &mut Signals,
    rep: &mut Reporter,
    acquired_at: &mut Option<Instant>,
) -> Result<u8, Failure> {
    // The supervisor starts now, while the lock is still to be had: its start (a fork and exec)
    // is then off the path from the grant to the command. It only idles until it is told the
    // hold's environment and the lease end, which exist only once the lock is held, and exits
    // when this process goes (end of file on its socket) or drops the link.
    // Should the supervisor die, the command and its descendants are re-parented here, where
    // they can still be found and stopped before the lock is released.
    if let Err(e) = sys::become_subreaper() {
        return Err(Failure::new(
            exit::OSERR,
            format!("cannot become a child subreaper (PR_SET_CHILD_SUBREAPER, Linux 3.4+): {e}; the command was not run"),
        ));
    }
    stamp("run", "supervisor-spawn");
    let link = Link::spawn(c, t.kill_grace)?;
    let result = wait_and_hold(c, t, opts, rx, &link, signals, rep, acquired_at).await;
    // After GONE it has exited; otherwise the closed socket tells it to.
    link.close().await;
    result
}

/// The rest of a term, with its supervisor started.
#[allow(clippy::too_many_arguments)]
async fn wait_and_hold(
    c: &RunConfig,
    t: Timing,
    opts: LockOptions,
    mut rx: mpsc::UnboundedReceiver<LockEvent>,
    link: &Link,
    signals: &mut Signals,
    rep: &mut Reporter,
    acquired_at: &mut Option<Instant>,
) -> Result<u8, Failure> {
    // Waiting for the lock. `--wait 0` is one try: the first completed generation decides.
    let outcome = {
        let once = t.wait == Some(Duration::ZERO);
        stamp("run", "acquire");
        let acquire = async {
            if once {
                opts.try_acquire().await
            } else {
                opts.acquire(t.wait).await.map(Some)
            }
        };
        tokio::pin!(acquire);
        let mut ticks = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                res = &mut acquire => break Ok(res),
                Some(ev) = rx.recv() => waiting_event(rep, ev),
                sig = signals.recv() => break Err(sig),
                _ = ticks.tick(), if rep.wants_ticks() => rep.tick(),
            }
        }
    };
    let guard = match outcome {
        Ok(Ok(Some(guard))) => guard,
        Ok(Ok(None)) => {
            while let Ok(ev) = rx.try_recv() {
                waiting_event(rep, ev);
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
            // exactly then (or at once if no session was started yet). A second signal stops
            // waiting for that.
            drop(opts);
            let bound = t.request.saturating_add(t.connect) + Duration::from_secs(1);
            let left = async { while rx.recv().await.is_some() {} };
            let how = tokio::select! {
                r = tokio::time::timeout(bound, left) => match r {
                    Ok(()) => "left the group",
                    Err(_) => "the broker did not confirm the leave in time (it drops the member after the session timeout)",
                },
                _ = signals.recv() => "leaving the group was cut short by a second signal (the broker drops the member after the session timeout)",
            };
            return Err(Failure::new(
                128 + sig as u8,
                format!(
                    "interrupted by {} while waiting for lock {:?}; {how}; the command was not run",
                    sys::signal_name(sig),
                    c.lock
                ),
            ));
        }
    };
    // Waiting events already forwarded belong before `acquired`; later ones are stale.
    while let Ok(ev) = rx.try_recv() {
        waiting_event(rep, ev);
    }
    stamp("run", "acquired");
    *acquired_at = Some(Instant::now());
    rep.acquired(&guard.token(), guard.permit());
    hold(c, t, guard, link, rx, signals, rep).await
}

fn waiting_event(rep: &mut Reporter, ev: LockEvent) {
    if let LockEvent::Waiting {
        member_id,
        holder,
        holders,
        position,
    } = ev
    {
        rep.waiting(member_id, holder, holders, position);
    }
}

/// K's end of the socket to the supervisor, and the supervisor's pid.
struct Link {
    /// A SOCK_SEQPACKET socket; tokio's UnixStream only provides the readiness, every read and
    /// write is a rustix recv/send of one whole datagram.
    sock: UnixStream,
    pid: u32,
    /// Readable once the supervisor has exited; None without pidfd support (Linux before 5.3).
    pidfd: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
    /// Set once the supervisor is reaped (its pid may then be another process's).
    reaped: std::cell::Cell<bool>,
}

impl Link {
    /// Starts the supervisor (this binary, re-executed) with the command to run. It waits for
    /// the hold's environment ([`Link::send_env`]) and a lease end before it starts anything.
    fn spawn(c: &RunConfig, grace: Duration) -> Result<Link, Failure> {
        let oserr = |what: &str, e: &dyn std::fmt::Display| {
            Failure::new(
                exit::OSERR,
                format!(
                    "{what}: {e}; the command was not run (kafka-lock run needs Linux with /proc \
                     mounted)"
                ),
            )
        };
        let exe = std::env::current_exe().map_err(|e| {
            oserr(
                "cannot find kafka-lock's own executable to start the supervisor process",
                &e,
            )
        })?;
        let (ours, theirs) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .map_err(|e| oserr("cannot create a socket pair for the supervisor", &e))?;
        // Only the supervisor may inherit this end: this process starts no other program, so
        // clearing close-on-exec here, for the one spawn below, leaks it nowhere else (the
        // supervisor sets it again at once, before starting the command).
        rustix::io::fcntl_setfd(&theirs, FdFlags::empty())
            .map_err(|e| oserr("cannot pass a socket to the supervisor", &e))?;
        let argv = supervise::Args {
            fd: theirs.as_raw_fd(),
            grace_ns: sys::nanos(grace),
            command: c.command.clone(),
        }
        .to_argv();
        let mut cmd = std::process::Command::new(&exe);
        // The secrets stay in this (non-dumpable) process: neither the supervisor's nor the
        // command's /proc/<pid>/environ may hold them, since the command can read both.
        for (name, _) in std::env::vars_os() {
            if settings::is_secret_variable(&name) {
                cmd.env_remove(name);
            }
        }
        cmd.args(argv)
            .env("KAFKA_LOCK_NAME", &c.lock)
            // Its own process group: a signal to ours (a terminal's Ctrl-C, `kill -9 -PGID`)
            // must not take the supervisor along with us.
            .process_group(0);
        let child = cmd.spawn().map_err(|e| {
            oserr(
                &format!("cannot start the supervisor process ({})", exe.display()),
                &e,
            )
        })?;
        drop(theirs);
        let pid = child.id();
        // Reaped with waitpid below, not through the std handle.
        drop(child);
        let sock = UnixStream::from_std(std::os::unix::net::UnixStream::from(ours))
            .map_err(|e| oserr("cannot watch the supervisor's socket", &e))?;
        // Our unreaped child: the pid is still the supervisor's.
        let pidfd = sys::pid(pid)
            .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok())
            .and_then(watch_pidfd);
        Ok(Link {
            sock,
            pid,
            pidfd,
            reaped: std::cell::Cell::new(false),
        })
    }

    /// Passes the variables the command gets for this hold, one ENV datagram each. Unlike the
    /// other messages a failed send is an error: the command must not start without them.
    fn send_env(&self, env: &[(&str, OsString)]) -> io::Result<()> {
        for (name, value) in env {
            let msg = proto::encode_env(name, value)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
            rustix::net::send(&self.sock, &msg, SendFlags::DONTWAIT | SendFlags::NOSIGNAL)?;
        }
        Ok(())
    }

    /// Ends the link: the supervisor, if it still runs, sees end of file and exits (it has
    /// started nothing, or stops what it started); then it is reaped.
    async fn close(&self) {
        let _ = rustix::net::shutdown(&self.sock, rustix::net::Shutdown::Both);
        self.reap().await;
    }

    /// Sends without waiting. A full socket (a stopped supervisor) drops the message: the
    /// supervisor then keeps the older, earlier lease end, which is the safe side.
    fn send(&self, msg: ToSupervisor) {
        let _ = rustix::net::send(
            &self.sock,
            msg.encode().as_bytes(),
            SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
        );
    }

    /// The next message; `None` at end of file (the supervisor has exited). Cancel-safe: a
    /// datagram is only taken off the socket by a call that returns it.
    async fn recv(&self) -> io::Result<Option<Result<FromSupervisor, ProtoError>>> {
        let mut buf = [0u8; MAX_MESSAGE + 1];
        loop {
            self.sock.readable().await?;
            let got = self.sock.try_io(Interest::READABLE, || {
                rustix::net::recv(
                    &self.sock,
                    &mut buf[..],
                    RecvFlags::DONTWAIT | RecvFlags::TRUNC,
                )
                .map_err(io::Error::from)
            });
            match got {
                Ok((_, 0)) => return Ok(None),
                Ok((n, len)) if len > n => return Ok(Some(Err(ProtoError::TooLong(len)))),
                Ok((n, _)) => return Ok(Some(FromSupervisor::parse(&buf[..n]))),
                // ECONNRESET: the supervisor exited with one of our LEASE messages unread. It is
                // reported once, before the datagrams still queued for us (GONE among them) and
                // the end of file.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted
                            | io::ErrorKind::WouldBlock
                            | io::ErrorKind::ConnectionReset
                    ) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// SIGKILLs a supervisor that broke the protocol. It is our unreaped child, so its pid is
    /// still its own.
    fn kill(&self) {
        if let Some(p) = sys::pid(self.pid) {
            let _ = rustix::process::kill_process(p, Signal::KILL);
        }
    }

    /// Reaps the supervisor after it said GONE (it exits right after). Its pidfd, readable once
    /// it has exited, wakes us the moment it has, instead of a poll: the release waits on this.
    async fn reap(&self) {
        if self.reaped.get() {
            return;
        }
        let Some(p) = sys::pid(self.pid) else { return };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        if let Some(fd) = &self.pidfd {
            let _ = tokio::time::timeout_at(deadline, fd.readable()).await;
        }
        loop {
            match rustix::process::waitpid(Some(p), rustix::process::WaitOptions::NOHANG) {
                Ok(None) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(2)).await
                }
                Err(Errno::INTR) => {}
                Ok(Some(_)) | Err(Errno::CHILD) => {
                    self.reaped.set(true);
                    return;
                }
                _ => return,
            }
        }
    }
}

/// A pidfd registered with the runtime, readable once its process has exited.
#[allow(unsafe_code)]
fn watch_pidfd(fd: std::os::fd::OwnedFd) -> Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: the AsyncFd takes the descriptor by value and owns it from here on; nothing else
    // holds, replaces or closes it while it is registered.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, Interest::READABLE).ok() }
}

/// How the hold ended, from the supervisor's side.
enum Ending {
    /// The supervisor said GONE.
    Gone,
    /// The supervisor is gone or broken without saying GONE; `why` says what happened.
    SupervisorLost { why: String },
}

/// Runs the command under `guard` through the supervisor and returns its status, or 74 if the
/// lock was lost meanwhile.
async fn hold(
    c: &RunConfig,
    t: Timing,
    guard: LockGuard,
    link: &Link,
    mut rx: mpsc::UnboundedReceiver<LockEvent>,
    signals: &mut Signals,
    rep: &mut Reporter,
) -> Result<u8, Failure> {
    let token = guard.token();
    let mut watch = guard.watch();
    // The last checkpoint, and a place for the command to leave the next one; read before the
    // lease end is taken, since reading may take a while (the ledger's copy, read when the group
    // has none, comes from the ledger's tail, a few MiB at most).
    // A read that outlasts the lease (a broker cut off) ends with the lease, as a loss.
    let checkpoint = tokio::select! {
        biased;
        _ = guard.lost() => None,
        prepared = CheckpointDir::prepare(c, &guard) => match prepared {
            Ok(dir) => dir,
            Err(f) => {
                let _ = give_back(guard, signals, rep).await;
                return Err(f);
            }
        },
    };
    let lease_end = match watch.lease_end() {
        Some(end) if end > Instant::now() => end,
        _ => {
            // The lease ran out between the grant and now (a paused process, a slow checkpoint
            // read): starting the command would run it without the lock.
            let _ = give_back(guard, signals, rep).await;
            return Err(Failure::new(
                exit::NOT_ACQUIRED,
                format!(
                    "lock {:?} was granted but its lease ran out before the command could start (was \
                     kafka-lock paused?); the command was not run; try again",
                    c.lock
                ),
            ));
        }
    };
    let mut env = checkpoint
        .as_ref()
        .map(CheckpointDir::env)
        .unwrap_or_default();
    if let Some(file) = checkpoint.as_ref().and_then(|d| d.last_file.as_deref()) {
        rep.warning(&format!(
            "the last checkpoint of lock {:?} cannot be passed in KAFKA_LOCK_CHECKPOINT (it holds a \
             NUL character or is too long for an environment variable); the command finds it in \
             the file named by KAFKA_LOCK_LAST_CHECKPOINT_FILE ({}) instead",
            c.lock,
            file.display()
        ));
    }
    env.push(("KAFKA_LOCK_PERMIT", guard.permit().to_string().into()));
    env.push(("KAFKA_LOCK_TOKEN", token.value().to_string().into()));
    env.push(("KAFKA_LOCK_GENERATION", token.generation.to_string().into()));
    env.push(("KAFKA_LOCK_MEMBER_ID", token.member_id.clone().into()));
    // The environment first: the supervisor starts the command only on the LEASE after it.
    if let Err(e) = link.send_env(&env) {
        let _ = give_back(guard, signals, rep).await;
        return Err(Failure::new(
            exit::OSERR,
            format!(
                "cannot pass the hold's environment to the supervisor process: {e}; the command \
                 was not run and the lock is released"
            ),
        ));
    }
    let mut sent_lease = lease_end;
    link.send(ToSupervisor::Lease {
        end_ns: sys::mono_ns_of(lease_end),
    });
    stamp("run", "lease-sent");

    let mut child: Option<u32> = None;
    let mut child_group: Option<tree::PinnedGroup> = None;
    let mut end: Option<ChildExit> = None;
    let mut spawn_errno: Option<i32> = None;
    let mut lost: Option<LossReason> = None;
    let mut lost_reported = false;
    let mut report_lost_by: Option<tokio::time::Instant> = None;
    let mut watching = true;
    let mut pending_signal: Option<i32> = None;
    let mut sup_error: Option<String> = None;
    // A command still running --kill-grace after a SIGTERM passed on to it is killed, as on a
    // loss: kafka-lock asked to stop must not wait forever for a command that ignores it.
    let mut kill_after_term: Option<tokio::time::Instant> = None;
    // Dropped (the terminal taken back) when the command ends, or however this returns.
    let mut terminal: Option<TakeTerminalBack> = None;
    let ending = loop {
        tokio::select! {
            // The supervisor's news first: it is what actually happened to the command.
            biased;
            msg = link.recv() => match msg {
                Ok(Some(Ok(m))) => match m {
                    FromSupervisor::Pid(pid) => {
                        stamp("run", "child-started");
                        child = Some(pid);
                        child_group = tree::PinnedGroup::pin(pid, &[link.pid, std::process::id()]);
                        // An interactive command reads the terminal: its group must be the
                        // foreground one, or the first read stops it (SIGTTIN) for good.
                        // Ignored before the hand-over: from then on a line of ours must not
                        // stop us (stty tostop) while the lease is ours to renew.
                        sys::ignore_sigttou(true);
                        if sys::give_terminal(pid) {
                            terminal = Some(TakeTerminalBack);
                        } else {
                            sys::ignore_sigttou(false);
                        }
                        rep.child_started(pid, link.pid);
                        if let Some(sig) = pending_signal.take() {
                            link.send(ToSupervisor::Signal(sig));
                        }
                    }
                    FromSupervisor::Failed { errno } => spawn_errno = Some(errno),
                    FromSupervisor::Expired { lease_end_ns } => {
                        if lost.is_none() {
                            lost = Some(LossReason::LeaseExpired);
                        }
                        if !lost_reported {
                            rep.lost(&LossReason::LeaseExpired, Some(lease_end_ns));
                            lost_reported = true;
                        }
                    }
                    FromSupervisor::Exit(e) => {
                        stamp("run", "child-exited");
                        terminal.take();
                        // The lease may have run out in the same instant the command ended: then
                        // it ran without the lock at the end, and that must not pass as success.
                        if lost.is_none() && !watch.is_held() {
                            lost = Some(LossReason::LeaseExpired);
                            rep.lost(&LossReason::LeaseExpired, watch.lease_end().map(sys::mono_ns_of).or(Some(sys::mono_ns_of(sent_lease))));
                            lost_reported = true;
                        }
                        end = Some(e);
                        rep.child_exited(child_end(e));
                    }
                    FromSupervisor::Gone => {
                        stamp("run", "gone");
                        break Ending::Gone;
                    }
                    FromSupervisor::Error(text) => {
                        exit::print_line(&format!("the supervisor process reports: {text}"));
                        sup_error = Some(text);
                    }
                },
                Ok(Some(Err(e))) => {
                    link.kill();
                    break Ending::SupervisorLost { why: format!("it sent {e}") };
                }
                Ok(None) => break Ending::SupervisorLost {
                    why: sup_error.take().unwrap_or_else(|| "it exited unexpectedly".to_owned()),
                },
                Err(e) => {
                    link.kill();
                    break Ending::SupervisorLost { why: format!("its socket failed: {e}") };
                }
            },
            reason = guard.lost(), if lost.is_none() => {
                link.send(ToSupervisor::Stop);
                lost = Some(reason);
                report_lost_by = Some(tokio::time::Instant::now() + LOSS_REPORT_BOUND);
            }
            changed = watch.changed(), if watching && lost.is_none() => {
                if !changed {
                    watching = false;
                } else if let Some(new_end) = watch.lease_end() {
                    if new_end != sent_lease {
                        sent_lease = new_end;
                        link.send(ToSupervisor::Lease { end_ns: sys::mono_ns_of(new_end) });
                    }
                }
            }
            Some(ev) = rx.recv() => match ev {
                LockEvent::Lost { reason, lease_end } => {
                    if lost.is_none() {
                        link.send(ToSupervisor::Stop);
                        lost = Some(reason.clone());
                    }
                    if !lost_reported {
                        rep.lost(&reason, Some(sys::mono_ns_of(lease_end)));
                        lost_reported = true;
                    }
                }
                LockEvent::TokenChanged { token } if lost.is_none() => rep.token_changed(&token),
                _ => {}
            },
            _ = sleep_until(report_lost_by), if !lost_reported && lost.is_some() => {
                report_lost_fallback(rep, lost.as_ref(), &watch, sent_lease);
                lost_reported = true;
            }
            sig = signals.recv() => {
                // Passed on to the command's group; the lock is released once it is gone.
                match (child, end) {
                    (Some(_), None) => link.send(ToSupervisor::Signal(sig)),
                    (None, None) => pending_signal = Some(sig),
                    _ => {}
                }
                if sig == Signal::TERM.as_raw() && end.is_none() && kill_after_term.is_none() {
                    kill_after_term = Some(tokio::time::Instant::now() + t.kill_grace);
                }
            }
            _ = sleep_until(kill_after_term), if kill_after_term.is_some() && end.is_none() => {
                kill_after_term = None;
                match child {
                    Some(_) => link.send(ToSupervisor::Signal(Signal::KILL.as_raw())),
                    None => pending_signal = Some(Signal::KILL.as_raw()),
                }
            }
        }
    };
    if let Some(reason) = &lost {
        if !lost_reported {
            // The session's own report may be queued already; it carries its lease end.
            let mut lease_end_ns = None;
            while let Ok(ev) = rx.try_recv() {
                if let LockEvent::Lost { lease_end, .. } = ev {
                    lease_end_ns = Some(sys::mono_ns_of(lease_end));
                }
            }
            match lease_end_ns {
                Some(ns) => rep.lost(reason, Some(ns)),
                None => report_lost_fallback(rep, Some(reason), &watch, sent_lease),
            }
        }
    }

    match ending {
        Ending::Gone => {
            link.reap().await;
            stamp("run", "supervisor-reaped");
        }
        Ending::SupervisorLost { why } => {
            // Everything the supervisor started is re-parented here (we are a subreaper): stop
            // it all the way the supervisor would have, then release.
            let group = child_group.take().filter(|_| end.is_none());
            // On CLOCK_BOOTTIME, as the supervisor counts: a suspend during the stop counts.
            let kill_by = sent_lease
                .checked_add(t.kill_grace)
                .map(|at| sys::mono_to_boot(sys::mono_ns_of(at), sys::mono_ns(), sys::boot_ns()));
            let grace = t.kill_grace;
            let reaped = tokio::task::spawn_blocking(move || {
                let mut exits = Vec::new();
                tree::stop_everything(group, grace, kill_by, |pid, e| exits.push((pid, e)));
                exits
            })
            .await
            .unwrap_or_default();
            // It ran until no child was left: the supervisor is among the reaped.
            link.reaped.set(true);
            let how = reaped
                .iter()
                .find(|(pid, _)| *pid == link.pid)
                .and_then(|(_, e)| *e)
                .map(|e| match e {
                    ChildExit::Code(c) => format!("status {c}"),
                    ChildExit::Signal(s) => sys::signal_name(s),
                })
                .unwrap_or_else(|| "status unknown".to_owned());
            if end.is_none() {
                if let Some(e) = child
                    .and_then(|pid| reaped.iter().find(|(p, _)| *p == pid).and_then(|(_, e)| *e))
                {
                    rep.child_exited(child_end(e));
                }
            }
            let cut = release(guard, signals).await;
            return Err(Failure::new(
                exit::OSERR,
                format!(
                    "the supervisor process (pid {}) of lock {:?} failed: {why} ({how}); everything the \
                     command started was stopped (SIGTERM, then SIGKILL after {}){}",
                    link.pid,
                    c.lock,
                    sys::human(t.kill_grace),
                    release_note(cut, t.session)
                ),
            ));
        }
    }

    if let Some(errno) = spawn_errno {
        let e = io::Error::from_raw_os_error(errno);
        let status = if e.kind() == io::ErrorKind::NotFound {
            exit::NOT_FOUND
        } else {
            exit::CANNOT_EXECUTE
        };
        report_end(&guard, rep).await;
        let cut = release(guard, signals).await;
        return Err(Failure::new(
            status,
            format!(
                "cannot run {:?}: {e}; check the command name, its permissions and $PATH (the lock was \
                 released without running it){}",
                c.command[0],
                release_note(cut, t.session)
            ),
        ));
    }
    let Some(end) = end.map(child_end) else {
        // The supervisor never started the command: the lease had run out when it got it.
        let cut = release(guard, signals).await;
        return Err(Failure::new(
            exit::NOT_ACQUIRED,
            format!(
                "lock {:?} was granted but its lease ran out before the command could start (was \
                 kafka-lock paused?); the command was not run; try again{}",
                c.lock,
                release_note(cut, t.session)
            ),
        ));
    };
    // A command that succeeded may leave a checkpoint; it is stored, fenced, before the lock
    // goes: the next holder must see it, and a holder that is no longer current must not write.
    if let (None, 0, Some(dir)) = (&lost, end.status, &checkpoint) {
        if let Some(f) = dir.commit(&guard, rep).await {
            let cut = release(guard, signals).await;
            return Err(Failure::new(
                f.status,
                format!("{}{}", f.line, release_note(cut, t.session)),
            ));
        }
    }
    // A lease that ran out after the command ended (kafka-lock stopped or starved in between)
    // is a loss: the hold cannot be claimed up to the release.
    let ran_out = lost.is_none();
    let lost = match lost {
        Some(reason) => Some(reason),
        None => report_end(&guard, rep).await,
    };
    match lost {
        None => {
            stamp("run", "release");
            let cut = release(guard, signals).await;
            stamp("run", "release-answered");
            if let Some(sig) = cut {
                exit::print_line(&format!(
                    "releasing lock {:?} was cut short by {}; the broker frees it after the session \
                     timeout ({})",
                    c.lock,
                    sys::signal_name(sig),
                    sys::human(t.session)
                ));
            }
            Ok(end.status)
        }
        Some(reason) if ran_out => {
            let cut = release(guard, signals).await;
            Err(Failure::new(
                exit::LOST,
                format!(
                    "the lease of lock {:?} ran out after the command ended with status {} and \
                     before the lock could be released ({reason}; was kafka-lock stopped?): the \
                     next holder may already hold it{}",
                    c.lock,
                    end.status,
                    release_note(cut, t.session)
                ),
            ))
        }
        Some(reason) => {
            let cut = release(guard, signals).await;
            Err(Failure::new(
                exit::LOST,
                format!(
                    "lost lock {:?} while the command ran ({reason}); the command was stopped (SIGTERM, \
                     then SIGKILL after {}) and ended with status {}; check the network path to the \
                     Kafka cluster, or raise --session-timeout if the host pauses for long{}",
                    c.lock,
                    sys::human(t.kill_grace),
                    end.status,
                    release_note(cut, t.session)
                ),
            ))
        }
    }
}

/// Gives the terminal's foreground back to kafka-lock's process group when dropped.
struct TakeTerminalBack;

impl Drop for TakeTerminalBack {
    fn drop(&mut self) {
        sys::take_terminal();
        // In the foreground again: a supervisor started later must not inherit SIGTTOU ignored.
        sys::ignore_sigttou(false);
    }
}

/// The checkpoint hand-over with the command: `KAFKA_LOCK_CHECKPOINT` (the last one) in, and the
/// file named by `KAFKA_LOCK_CHECKPOINT_FILE` out, in a directory only this user can enter, removed
/// when the run ends.
struct CheckpointDir {
    dir: std::path::PathBuf,
    last: Option<String>,
    /// Where the last checkpoint was written when it cannot go in the environment.
    last_file: Option<std::path::PathBuf>,
    max: usize,
    lock: String,
}

/// How long the command's checkpoint file may take to open and read (a file on a network file
/// system that hangs): the read runs on a thread of its own, so the lock's session goes on
/// meanwhile, and the run gives up on it after this.
const CHECKPOINT_READ_BOUND: Duration = Duration::from_secs(10);

/// The longest checkpoint passed in `KAFKA_LOCK_CHECKPOINT`. Linux refuses an execve with one
/// environment string over 128 KiB (MAX_ARG_STRLEN); a longer one goes in a file instead.
const MAX_CHECKPOINT_IN_ENV: usize = 64 * 1024;

/// Why the command's checkpoint file was not read.
#[derive(Debug, thiserror::Error)]
enum FileRefused {
    #[error(
        "it is not a regular file (a FIFO, a device, a directory or a symbolic link is refused)"
    )]
    NotRegular,
    #[error("it cannot be read ({0})")]
    Io(#[from] io::Error),
    #[error("reading it took longer than {}", sys::human(CHECKPOINT_READ_BOUND))]
    TimedOut,
}

/// Reads at most `limit` bytes of the regular file `path`, `None` if there is none. Never
/// follows a symbolic link and never waits for a writer: a FIFO, a terminal or a device is
/// refused after an open that cannot block.
fn read_regular_file(path: &std::path::Path, limit: u64) -> Result<Option<Vec<u8>>, FileRefused> {
    use rustix::fs::{FileType, Mode, OFlags};
    use std::io::Read;
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = match rustix::fs::open(path, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        // O_NOFOLLOW on a symbolic link.
        Err(Errno::LOOP) => return Err(FileRefused::NotRegular),
        Err(e) => return Err(FileRefused::Io(e.into())),
    };
    let st = rustix::fs::fstat(&fd).map_err(io::Error::from)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(FileRefused::NotRegular);
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(limit)
        .read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

impl CheckpointDir {
    /// Reads the last checkpoint and makes the directory; `None` without a ledger, and for a
    /// semaphore (a checkpoint is one per lock, which holders of several permits would
    /// overwrite). A checkpoint that cannot be read stops the run (status 69) rather than let the
    /// command believe there is none.
    async fn prepare(c: &RunConfig, guard: &LockGuard) -> Result<Option<CheckpointDir>, Failure> {
        if c.ledger_topic.is_none() || c.permits > 1 {
            return Ok(None);
        }
        let last = guard.last_checkpoint().await.map_err(|e| {
            let f = exit::failure(&e, &c.lock, &c.bootstrap);
            Failure::new(
                f.status,
                format!(
                    "cannot read the last checkpoint of lock {:?}, so the command was not run and the lock \
                     is released: {}",
                    c.lock, f.line
                ),
            )
        })?;
        let dir = std::env::temp_dir().join(format!(
            "kafka-lock-{}-{}",
            std::process::id(),
            sys::mono_ns()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| {
                Failure::new(
                    exit::OSERR,
                    format!(
                        "cannot create {} for the command's checkpoint: {e}; the command was not run and \
                         the lock is released (set TMPDIR to a writable directory)",
                        dir.display()
                    ),
                )
            })?;
        let mut prepared = CheckpointDir {
            dir,
            last: last.map(|c| c.value),
            last_file: None,
            max: c.checkpoint_max_bytes,
            lock: c.lock.clone(),
        };
        // Any writer of the group's offsets or of the ledger can leave a value that execve
        // would refuse; it must not keep every later holder from running its command.
        if let Some(last) = prepared
            .last
            .as_ref()
            .filter(|v| v.contains('\0') || v.len() > MAX_CHECKPOINT_IN_ENV)
        {
            let path = prepared.dir.join("last-checkpoint");
            std::fs::write(&path, last).map_err(|e| {
                Failure::new(
                    exit::OSERR,
                    format!(
                        "cannot write {} for the command's last checkpoint: {e}; the command was not \
                         run and the lock is released (set TMPDIR to a writable directory)",
                        path.display()
                    ),
                )
            })?;
            prepared.last_file = Some(path);
        }
        Ok(Some(prepared))
    }

    fn file(&self) -> std::path::PathBuf {
        self.dir.join("checkpoint")
    }

    fn env(&self) -> Vec<(&'static str, OsString)> {
        let mut env = vec![("KAFKA_LOCK_CHECKPOINT_FILE", self.file().into_os_string())];
        match (&self.last, &self.last_file) {
            (_, Some(file)) => env.push(("KAFKA_LOCK_LAST_CHECKPOINT_FILE", file.into())),
            (Some(last), None) => env.push(("KAFKA_LOCK_CHECKPOINT", OsString::from(last))),
            (None, None) => {}
        }
        env
    }

    /// Stores the file's content, if the command wrote one; the failure to report otherwise.
    async fn commit(&self, guard: &LockGuard, rep: &mut Reporter) -> Option<Failure> {
        // One byte more than allowed is enough to tell that it is too long.
        let limit = u64::try_from(self.max)
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let path = self.file();
        // A thread of its own, not spawn_blocking: a read that never returns must not hold up
        // the runtime's shutdown at exit.
        let started = std::thread::Builder::new()
            .name("checkpoint-read".into())
            .spawn(move || {
                let _ = tx.send(read_regular_file(&path, limit));
            });
        let read = match started {
            Ok(_) => match tokio::time::timeout(CHECKPOINT_READ_BOUND, rx).await {
                Ok(Ok(read)) => read,
                Ok(Err(_)) | Err(_) => Err(FileRefused::TimedOut),
            },
            Err(e) => Err(FileRefused::Io(e)),
        };
        let bytes = match read {
            Ok(None) => return None,
            Ok(Some(bytes)) => bytes,
            Err(e) => {
                return Some(Failure::new(
                    exit::CONFIG,
                    format!(
                        "the command exited 0 but its checkpoint file {} was not read: {e}; it was \
                         not stored and lock {:?} keeps its previous checkpoint",
                        self.file().display(),
                        self.lock
                    ),
                ))
            }
        };
        if bytes.len() > self.max {
            return Some(Failure::new(
                exit::CONFIG,
                format!(
                    "the command's checkpoint is more than {} bytes (--checkpoint-max-bytes, the                      brokers' offset.metadata.max.bytes); it was not stored and lock {:?} keeps                      its previous checkpoint",
                    self.max, self.lock
                ),
            ));
        }
        let Ok(value) = String::from_utf8(bytes) else {
            return Some(Failure::new(
                exit::CONFIG,
                format!(
                    "the command's checkpoint is not UTF-8 text; it was not stored and lock {:?}                      keeps its previous checkpoint",
                    self.lock
                ),
            ));
        };
        match guard.checkpoint(value.clone()).await {
            Ok(()) => {
                rep.checkpoint(&value);
                None
            }
            Err(e) => {
                let status = match &e {
                    kafka_lock::Error::Ledger(
                        kafka_lock::LedgerError::CheckpointTooLarge { .. }
                        | kafka_lock::LedgerError::CheckpointHasNul { .. },
                    ) => exit::CONFIG,
                    _ => exit::LOST,
                };
                let why = match &e {
                    kafka_lock::Error::Broker { code, .. }
                        if matches!(code.code(), 22 | 25 | 82) =>
                    {
                        "the broker rejected it because this holder is no longer the lock's current \
                         holder (its generation or member id is stale)"
                    }
                    _ => "it could not be stored",
                };
                // Either may have left the new value in the group: the previous one is not kept.
                if let kafka_lock::Error::Ledger(
                    kafka_lock::LedgerError::CheckpointUnknown { .. }
                    | kafka_lock::LedgerError::CheckpointNotCopied { .. },
                ) = &e
                {
                    return Some(Failure::new(
                        status,
                        format!(
                            "the command exited 0 but {e}; `kafka-lock status --lock {}` shows \
                             which checkpoint lock {:?} has",
                            self.lock, self.lock
                        ),
                    ));
                }
                Some(Failure::new(
                    status,
                    format!(
                        "the command exited 0 but its checkpoint was not stored: {why} ({e}); \
                         lock {:?} keeps its previous checkpoint",
                        self.lock
                    ),
                ))
            }
        }
    }
}

impl Drop for CheckpointDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `lost` event without the session's lease end: the guard's last one, if it has run out.
fn report_lost_fallback(
    rep: &mut Reporter,
    reason: Option<&LossReason>,
    watch: &kafka_lock::lock::HoldWatch,
    sent_lease: Instant,
) {
    let Some(reason) = reason else { return };
    let last = watch.lease_end().unwrap_or(sent_lease);
    let ns = (last <= Instant::now()).then(|| sys::mono_ns_of(last));
    rep.lost(reason, ns);
}

/// Ends a hold under which the command never started, saying in the events how it ended (see
/// [`report_end`]); without this the events would show an acquisition that never ends.
async fn give_back(guard: LockGuard, signals: &mut Signals, rep: &mut Reporter) -> Option<i32> {
    report_end(&guard, rep).await;
    release(guard, signals).await
}

/// Says in the events how a hold ends once the command and its tree are gone, before the
/// LeaveGroup goes out: `released` if the lease still runs, else `lost` at its lease end, and
/// then returns why it was lost.
///
/// The lease is read once, and the instant it was read is the last one the hold is claimed for
/// (`held_until_mono_ns`): a kafka-lock stopped (SIGSTOP, a starved runtime) between the
/// command's exit and this line says its hold ended at the lease end, not when it woke, which
/// may be after the broker gave the lock to someone else.
async fn report_end(guard: &LockGuard, rep: &mut Reporter) -> Option<LossReason> {
    let watch = guard.watch();
    let now = std::time::Instant::now();
    if watch.lease_end().is_some_and(|end| now < end) {
        rep.released(sys::mono_ns_of(now));
        return None;
    }
    let reason = guard.lost().await;
    let lease_end = watch.lease_end().unwrap_or_else(|| guard.lease_end());
    rep.lost(&reason, Some(sys::mono_ns_of(lease_end)));
    Some(reason)
}

/// Releases the lock (bounded by the library), unless one of the caught signals arrives first:
/// then the broker frees the lock after the session timeout. Returns that signal.
async fn release(guard: LockGuard, signals: &mut Signals) -> Option<i32> {
    tokio::select! {
        _ = guard.release() => None,
        sig = signals.recv() => Some(sig),
    }
}

fn release_note(cut: Option<i32>, session: Duration) -> String {
    match cut {
        None => String::new(),
        Some(sig) => format!(
            "; releasing the lock was cut short by {}, the broker frees it after the session \
             timeout ({})",
            sys::signal_name(sig),
            sys::human(session)
        ),
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn child_end(e: ChildExit) -> ChildEnd {
    match e {
        ChildExit::Code(c) => ChildEnd {
            code: Some(c),
            signal: None,
            status: (c & 0xff) as u8,
        },
        ChildExit::Signal(s) => ChildEnd {
            code: None,
            signal: Some(s),
            status: u8::try_from(128 + s).unwrap_or(255),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config() -> RunConfig {
        RunConfig {
            bootstrap: "127.0.0.1:9092".into(),
            lock: "l".into(),
            topic: None,
            wait: None,
            session_timeout: None,
            heartbeat_interval: None,
            rebalance_timeout: None,
            request_timeout: None,
            connect_timeout: None,
            lease_margin: None,
            kill_grace: None,
            label: None,
            permits: 1,
            client_id: "kafka-lock".into(),
            ledger_topic: None,
            checkpoint_max_bytes: 4096,
            security: Default::default(),
            retry_backoff: None,
            warnings: Vec::new(),
            events_json: false,
            conflict_exit_code: None,
            lost_exit_code: None,
            metrics_listen: None,
            from_env: FromEnv::default(),
            command: vec!["true".into()],
        }
    }

    fn refused(c: &RunConfig, flag: &str) {
        match Timing::resolve(c) {
            Ok(t) => panic!("accepted {t:?} for {c:?}"),
            Err(f) => {
                assert_eq!(f.status, exit::CONFIG, "{}", f.line);
                assert!(f.line.contains(flag), "{flag} not named in: {}", f.line);
                assert!(!f.line.contains('\n'), "{}", f.line);
            }
        }
    }

    const S: fn(u64) -> Option<Duration> = |s| Some(Duration::from_secs(s));
    const MS: fn(u64) -> Option<Duration> = |ms| Some(Duration::from_millis(ms));

    #[test]
    fn a_lease_margin_shorter_than_the_kill_grace_is_refused() {
        let mut c = config();
        c.kill_grace = S(2);
        c.lease_margin = MS(1500);
        refused(&c, "--lease-margin");
        c.lease_margin = S(2);
        let t = Timing::resolve(&c).expect("margin equal to the grace");
        assert_eq!(
            (t.margin, t.kill_grace),
            (Duration::from_secs(2), Duration::from_secs(2))
        );
        // Defaults never conflict: the margin follows the grace.
        c.lease_margin = None;
        c.kill_grace = S(3);
        assert_eq!(Timing::resolve(&c).unwrap().margin, Duration::from_secs(3));
    }

    #[test]
    fn the_grace_and_the_margin_must_fit_in_the_smaller_timeout() {
        let mut c = config();
        c.session_timeout = S(10);
        c.rebalance_timeout = S(3);
        c.kill_grace = S(3);
        refused(&c, "--kill-grace");
        c.kill_grace = S(1);
        c.lease_margin = S(3);
        refused(&c, "--lease-margin");
        // A short rebalance timeout shortens the lease, and the defaults follow it.
        c.kill_grace = None;
        c.lease_margin = None;
        let t = Timing::resolve(&c).unwrap();
        assert!(
            t.kill_grace <= t.margin && t.margin < Duration::from_secs(3),
            "{t:?}"
        );
        assert!(
            t.heartbeat * 2 <= Duration::from_secs(3) - t.margin,
            "{t:?}"
        );
    }

    #[test]
    fn a_heartbeat_that_cannot_renew_the_lease_twice_is_refused() {
        let mut c = config();
        c.session_timeout = S(6);
        c.heartbeat_interval = MS(2600);
        refused(&c, "--heartbeat-interval");
        c.heartbeat_interval = MS(2400);
        assert!(Timing::resolve(&c).is_ok());
    }

    #[test]
    fn absurd_durations_exit_78_naming_the_flag() {
        type Set = fn(&mut RunConfig, Option<Duration>);
        let flags: [(&str, Set); 8] = [
            ("--wait", |c, d| c.wait = d),
            ("--session-timeout", |c, d| c.session_timeout = d),
            ("--rebalance-timeout", |c, d| c.rebalance_timeout = d),
            ("--heartbeat-interval", |c, d| c.heartbeat_interval = d),
            ("--request-timeout", |c, d| c.request_timeout = d),
            ("--connect-timeout", |c, d| c.connect_timeout = d),
            ("--lease-margin", |c, d| c.lease_margin = d),
            ("--kill-grace", |c, d| c.kill_grace = d),
        ];
        for (flag, set) in flags {
            for d in [
                Duration::MAX,
                Duration::from_secs(300_000_000_000 * 31_557_600),
            ] {
                let mut c = config();
                set(&mut c, Some(d));
                refused(&c, flag);
            }
        }
        let mut c = config();
        c.connect_timeout = Some(MAX_TIMEOUT);
        assert!(
            Timing::resolve(&c).is_ok(),
            "the largest Kafka timeout is accepted"
        );
    }

    fn duration() -> impl Strategy<Value = Option<Duration>> {
        prop_oneof![
            Just(None),
            Just(Some(Duration::ZERO)),
            Just(Some(Duration::MAX)),
            (0u64..20_000).prop_map(|ms| Some(Duration::from_millis(ms))),
            (0u64..=u64::MAX, 0u32..1_000_000_000).prop_map(|(s, n)| Some(Duration::new(s, n))),
            (0u64..=(i32::MAX as u64) * 2).prop_map(|ms| Some(Duration::from_millis(ms))),
        ]
    }

    proptest! {
        /// Whatever the flags, resolve does not panic, and what it accepts keeps the command
        /// inside the lease and cannot overflow a clock downstream.
        #[test]
        fn resolve_never_panics_and_what_it_accepts_is_safe(
            wait in duration(), session in duration(), rebalance in duration(),
            heartbeat in duration(), request in duration(), connect in duration(),
            margin in duration(), grace in duration(),
        ) {
            let mut c = config();
            c.wait = wait;
            c.session_timeout = session;
            c.rebalance_timeout = rebalance;
            c.heartbeat_interval = heartbeat;
            c.request_timeout = request;
            c.connect_timeout = connect;
            c.lease_margin = margin;
            c.kill_grace = grace;
            match Timing::resolve(&c) {
                Err(f) => prop_assert_eq!(f.status, exit::CONFIG),
                Ok(t) => {
                    let window = t.session.min(t.rebalance);
                    prop_assert!(t.kill_grace <= t.margin && t.margin < window, "{:?}", t);
                    prop_assert!(!t.heartbeat.is_zero() && t.heartbeat * 2 <= window - t.margin, "{:?}", t);
                    let now = Instant::now();
                    for d in [t.session, t.rebalance, t.heartbeat, t.request, t.connect, t.margin, t.kill_grace] {
                        prop_assert!(d <= MAX_TIMEOUT);
                        prop_assert!(now.checked_add(d.saturating_mul(4)).is_some());
                        prop_assert!(tokio::time::Instant::now().checked_add(d.saturating_mul(4)).is_some());
                    }
                    if let Some(w) = t.wait {
                        prop_assert!(w <= MAX_WAIT && now.checked_add(w).is_some());
                    }
                    let opts = LockOptions::new(&c.bootstrap, c.lock.clone())
                        .session_timeout(t.session)
                        .rebalance_timeout(t.rebalance)
                        .heartbeat_interval(t.heartbeat)
                        .request_timeout(t.request)
                        .connect_timeout(t.connect)
                        .lease_margin(t.margin);
                    prop_assert!(opts.validate().is_ok(), "{:?}", opts.validate());
                }
            }
        }
    }
}

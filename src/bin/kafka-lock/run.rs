//! `kafka-lock run`: take the lock, have the supervisor process run the command while the lock
//! is held, release the lock once everything the command started is gone.
//!
//! This process (K) keeps the lock session, reports events and takes signals. It never stops
//! the command itself while its supervisor (P, `supervise.rs`) lives: P owns the lease end, which
//! K moves forward at each renewal, and stops the command there on its own. So nothing that can
//! block or starve K (a stalled stderr, a busy runtime, a SIGSTOP of K alone) can keep the
//! command running past the lease.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::DirBuilderExt;
use std::time::{Duration, Instant};

use kafka_lock::{
    LockEvent, LockGuard, LockOptions, LossReason, DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_LEASE_MARGIN, DEFAULT_REQUEST_TIMEOUT, DEFAULT_SESSION_TIMEOUT,
};
use rustix::io::Errno;
use rustix::process::Signal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::environ::{self, FromEnv};
use crate::exit::{self, Failure};
use crate::hold::{Action, Hold, Input, Outcome, Phase, Seen};
use crate::link::{beside, with_supervisor, Link, Start};
use crate::proto::{ChildExit, FromSupervisor, ToSupervisor};
use crate::report::{ChildEnd, Reporter, Source};
use crate::trace::stamp;
use crate::{serve, sys, tree};

/// The longest default grace between SIGTERM and SIGKILL.
const MAX_DEFAULT_KILL_GRACE: Duration = Duration::from_secs(2);
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
    pub security: kafka_lock::Security,
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
                .unwrap_or(kafka_lock::DEFAULT_CONNECT_TIMEOUT),
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

    /// Takes the signals already received, without waiting for more (`last` keeps the latest).
    async fn drain(&mut self) {
        loop {
            tokio::select! {
                biased;
                _ = self.recv() => {}
                () = std::future::ready(()) => return,
            }
        }
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
            .checkpoint_max_bytes(c.checkpoint_max_bytes)
            // The command gets the last checkpoint before it starts (`CheckpointDir::prepare`):
            // read beside the ACQUIRED append, it is in hand when the hold begins.
            .read_checkpoint_on_acquire(c.permits == 1);
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
    // Should the supervisor die, the command and its descendants are re-parented here, where
    // they can still be found and stopped before the lock is released. Set before the
    // supervisor's start begins, so that no moment exists with a supervisor and no subreaper.
    if let Err(e) = sys::become_subreaper() {
        return Err(Failure::new(
            exit::OSERR,
            format!("cannot become a child subreaper (PR_SET_CHILD_SUBREAPER, Linux 3.4+): {e}; the command was not run"),
        ));
    }
    if let Err(e) = sys::check_proc() {
        return Err(Failure::new(
            exit::OSERR,
            format!("{e}; the command was not run"),
        ));
    }
    // The supervisor starts now, beside the acquire, on a thread of its own: its start (a fork
    // and exec, which block) is then off the path from here to the grant, and from the grant to
    // the command. It only idles until it is told the hold's environment and the lease end,
    // which exist only once the lock is held, and exits when this process goes (end of file on
    // its socket) or drops the link.
    stamp("run", "supervisor-spawn");
    let mut start = Link::start(c, t.kill_grace);
    let result = wait_and_hold(c, t, opts, rx, &mut start, signals, rep, acquired_at).await;
    // However the term ended (a signal, `--wait` running out, the lock not granted), a start
    // still under way is waited for, so that the supervisor it made is closed and reaped here,
    // never left behind. After GONE it has exited; otherwise the closed socket tells it to.
    if let Some(link) = start.finish().await {
        link.close().await;
    }
    result
}

/// How the wait for the lock ended other than with the acquire's answer.
enum Stopped {
    Signal(i32),
    /// The supervisor could not be started.
    NoSupervisor(Failure),
}

/// The rest of a term, with its supervisor's start under way.
#[allow(clippy::too_many_arguments)]
async fn wait_and_hold(
    c: &RunConfig,
    t: Timing,
    opts: LockOptions,
    mut rx: mpsc::UnboundedReceiver<LockEvent>,
    start: &mut Start<Link>,
    signals: &mut Signals,
    rep: &mut Reporter,
    acquired_at: &mut Option<Instant>,
) -> Result<u8, Failure> {
    // Waiting for the lock. `--wait 0` is one try: the first completed generation decides.
    let outcome = {
        let once = t.wait == Some(Duration::ZERO);
        stamp("run", "acquire");
        let acquire = beside(
            async {
                if once {
                    opts.try_acquire().await
                } else {
                    opts.acquire(t.wait).await.map(Some)
                }
            },
            start,
        );
        tokio::pin!(acquire);
        let mut ticks = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                res = &mut acquire => break res.map_err(Stopped::NoSupervisor),
                Some(ev) = rx.recv() => waiting_event(rep, ev),
                sig = signals.recv() => break Err(Stopped::Signal(sig)),
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
        Err(Stopped::NoSupervisor(f)) => {
            // The acquire is dropped before any grant: nothing ran, and the session leaves the
            // group, so no one waits out a session timeout for a member that never held it.
            rep.close_line();
            leave(opts, &mut rx, t, signals).await;
            return Err(f);
        }
        Err(Stopped::Signal(sig)) => {
            rep.close_line();
            let how = leave(opts, &mut rx, t, signals).await;
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
    // The link is needed from here on (the hold's first message to it comes after the
    // checkpoint's read): a start still under way is waited for, and one that failed releases
    // the lock, with the command never started (only LEASE starts it, and no LEASE was sent).
    let session = t.session;
    let releasing = &mut *signals;
    let joined = with_supervisor(guard, start, |guard| async move {
        // A signal that came while the start was awaited is not one during the release: the run
        // ends anyway, and only a later signal cuts the release short (as in `leave`).
        releasing.drain().await;
        release_note(release(guard, releasing).await, session)
    })
    .await;
    let (guard, link) = joined?;
    // Waiting events already forwarded belong before `acquired`; later ones are stale.
    while let Ok(ev) = rx.try_recv() {
        waiting_event(rep, ev);
    }
    stamp("run", "acquired");
    *acquired_at = Some(Instant::now());
    rep.acquired(&guard.token(), guard.permit());
    hold(c, t, guard, link, rx, signals, rep).await
}

/// Leaves the group after an acquire that was dropped (a signal, a supervisor that could not
/// start); says how that went.
async fn leave(
    opts: LockOptions,
    rx: &mut mpsc::UnboundedReceiver<LockEvent>,
    t: Timing,
    signals: &mut Signals,
) -> &'static str {
    // The acquire was dropped, which makes its session leave the group. The session's event
    // sender goes away when it has left; with ours dropped too, the channel closes exactly then
    // (or at once if no session was started yet). A second signal stops waiting for that.
    drop(opts);
    let bound = t.request.saturating_add(t.connect) + Duration::from_secs(1);
    let left = async { while rx.recv().await.is_some() {} };
    tokio::select! {
        r = tokio::time::timeout(bound, left) => match r {
            Ok(()) => "left the group",
            Err(_) => "the broker did not confirm the leave in time (it drops the member after the session timeout)",
        },
        _ = signals.recv() => "leaving the group was cut short by a second signal (the broker drops the member after the session timeout)",
    }
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

/// Runs the command under `guard` through the supervisor and returns its status, or 74 if the
/// lock was lost meanwhile. What happens when is the machine's ([`Hold`], hold.rs); this turns
/// the runtime's events into its inputs and does what it answers.
async fn hold(
    c: &RunConfig,
    t: Timing,
    guard: LockGuard,
    link: &Link,
    mut rx: mpsc::UnboundedReceiver<LockEvent>,
    signals: &mut Signals,
    rep: &mut Reporter,
) -> Result<u8, Failure> {
    let mut m = Hold::new(t.kill_grace);
    let mut io = HoldIo {
        c,
        t,
        token: guard.token(),
        watch: guard.watch(),
        guard: Some(guard),
        link,
        signals,
        rep,
        checkpoint: None,
        child_group: None,
        terminal: None,
        lease_sent: false,
        renewed_to: None,
    };
    let mut actions: VecDeque<Action> = m.start().into();
    loop {
        let input = match actions.pop_front() {
            Some(Action::Conclude { outcome, cut }) => return io.conclude(outcome, cut),
            Some(action) => match io.perform(action).await {
                Some(input) => input,
                None => continue,
            },
            // Outside Running the machine always waits on an action of its own (the release is
            // followed by the conclusion): an empty queue there would wait forever.
            None if m.phase() != Phase::Running || io.guard.is_none() => {
                return Err(Failure::new(
                    exit::OSERR,
                    format!(
                        "the hold of lock {:?} stopped in {:?} with nothing to wait for; this is \
                         a bug",
                        c.lock,
                        m.phase()
                    ),
                ))
            }
            None => match io.next(&m, &mut rx).await {
                Some(input) => input,
                None => continue,
            },
        };
        let seen = io.seen();
        actions.extend(m.handle(seen, input));
    }
}

/// What the hold's driver owns: the lock, the supervisor's link, the command's group and the
/// terminal while it has them.
struct HoldIo<'a> {
    c: &'a RunConfig,
    t: Timing,
    token: kafka_lock::FencingToken,
    watch: kafka_lock::HoldWatch,
    /// Until the release.
    guard: Option<LockGuard>,
    link: &'a Link,
    signals: &'a mut Signals,
    rep: &'a mut Reporter,
    checkpoint: Option<CheckpointDir>,
    child_group: Option<tree::PinnedGroup>,
    /// Dropped (the terminal taken back) when the command ends, or however the hold ends.
    terminal: Option<TakeTerminalBack>,
    lease_sent: bool,
    /// The latest lease end a renewal moved the hold to while the checkpoint was stored (no
    /// input tells the machine of those); `LockGuard::lease_end` of a hold over is the grant's.
    renewed_to: Option<Instant>,
}

impl HoldIo<'_> {
    fn seen(&self) -> Seen {
        let now = Instant::now();
        let granted = self.guard.as_ref().map_or(now, LockGuard::lease_end);
        Seen {
            now,
            lease_end: self.watch.lease_end(),
            last_lease: self.renewed_to.map_or(granted, |r| r.max(granted)),
        }
    }

    /// The next thing that happened while the command runs; `None` for what the hold ignores.
    async fn next(
        &mut self,
        m: &Hold,
        rx: &mut mpsc::UnboundedReceiver<LockEvent>,
    ) -> Option<Input> {
        // Asked for only while the command may run, which is before the release.
        let guard = self.guard.as_ref()?;
        let deadline = m.deadline();
        tokio::select! {
            // The supervisor's news first: it is what actually happened to the command.
            biased;
            msg = self.link.recv() => Some(match msg {
                Ok(Some(Ok(FromSupervisor::Gone))) => {
                    stamp("run", "gone");
                    Input::Gone { queued_loss: queued_loss(rx) }
                }
                Ok(Some(Ok(msg))) => Input::Supervisor(msg),
                Ok(Some(Err(e))) => Input::SupervisorBroken {
                    why: format!("it sent {e}"),
                    queued_loss: queued_loss(rx),
                },
                Ok(None) => Input::SupervisorExited { queued_loss: queued_loss(rx) },
                Err(e) => Input::SupervisorBroken {
                    why: format!("its socket failed: {e}"),
                    queued_loss: queued_loss(rx),
                },
            }),
            reason = guard.lost(), if m.wants_loss() => Some(Input::Lost(reason)),
            changed = self.watch.changed(), if m.wants_lease() => Some(if changed {
                Input::LeaseMoved
            } else {
                Input::WatchClosed
            }),
            Some(ev) = rx.recv() => match ev {
                LockEvent::Lost { reason, lease_end } => {
                    Some(Input::LossReported { reason, lease_end })
                }
                LockEvent::TokenChanged { token } => Some(Input::TokenChanged(token)),
                _ => None,
            },
            _ = sleep_until(deadline.map(tokio::time::Instant::from_std)), if deadline.is_some() => {
                Some(Input::Deadline)
            }
            sig = self.signals.recv() => Some(Input::Signal(sig)),
        }
    }

    /// Does what the machine asked; the input it then needs, if any.
    async fn perform(&mut self, action: Action) -> Option<Input> {
        match action {
            Action::ReadCheckpoint => return self.read_checkpoint().await,
            Action::SendEnv => return Some(self.send_env()),
            Action::SendLease(end) => {
                self.link.send(ToSupervisor::Lease {
                    end_ns: sys::mono_ns_of(end),
                });
                if !self.lease_sent {
                    self.lease_sent = true;
                    stamp("run", "lease-sent");
                }
            }
            Action::Stop => self.link.send(ToSupervisor::Stop),
            Action::Signal(sig) => self.link.send(ToSupervisor::Signal(sig)),
            Action::KillSupervisor => self.link.kill(),
            Action::ChildStarted(pid) => self.child_started(pid),
            Action::SupervisorSays(text) => {
                exit::print_line(&format!("the supervisor process reports: {text}"))
            }
            Action::TakeTerminal => {
                stamp("run", "child-exited");
                self.terminal.take();
            }
            Action::ChildExited(e) => self.rep.child_exited(child_end(e)),
            Action::ReportTokenChanged(token) => self.rep.token_changed(&token),
            Action::ReportLost { reason, lease_end } => {
                self.rep.lost(&reason, lease_end.map(sys::mono_ns_of))
            }
            Action::ReportExpired { lease_end_ns } => {
                self.rep.lost(&LossReason::LeaseExpired, Some(lease_end_ns))
            }
            Action::ReportReleased { held_until } => self.rep.released(sys::mono_ns_of(held_until)),
            Action::AwaitLoss => return Some(Input::Lost(self.guard.as_ref()?.lost().await)),
            Action::Reap => {
                self.link.reap().await;
                stamp("run", "supervisor-reaped");
                return Some(Input::Reaped);
            }
            Action::StopTree {
                running,
                child,
                kill_by,
            } => return Some(self.stop_tree(running, child, kill_by).await),
            Action::CommitCheckpoint => {
                let (Some(dir), Some(guard)) = (&self.checkpoint, &self.guard) else {
                    return Some(Input::Committed(None));
                };
                // A cut broker answers the commit only after the lease end, or never (its bound is
                // past the broker's offsets.commit.timeout.ms): the hold ends at the lease end all
                // the same. The request is left to the session; no one waits for its answer.
                let commit = dir.commit(guard, self.rep);
                tokio::pin!(commit);
                let mut watching = true;
                return Some(loop {
                    tokio::select! {
                        biased;
                        reason = guard.lost() => break Input::Lost(reason),
                        // Heartbeats go on renewing while the commit waits (for the offsets'
                        // replication, say): a loss the session ends the hold with leaves none
                        // of them in the guard, and the hold lasted to the last.
                        changed = self.watch.changed(), if watching => {
                            watching = changed;
                            if let Some(l) = self.watch.lease_end() {
                                self.renewed_to = Some(self.renewed_to.map_or(l, |r| r.max(l)));
                            }
                        }
                        failed = &mut commit => break Input::Committed(failed),
                    }
                });
            }
            Action::Release => {
                stamp("run", "release");
                let cut = match self.guard.take() {
                    Some(guard) => release(guard, self.signals).await,
                    None => None,
                };
                stamp("run", "release-answered");
                return Some(Input::Released(cut));
            }
            // Taken by the loop.
            Action::Conclude { .. } => {}
        }
        None
    }

    /// The last checkpoint, and a place for the command to leave the next one; read before the
    /// lease end is taken, since reading may take a while (the ledger's copy, read when the
    /// group has none, comes from the ledger's tail, a few MiB at most). A read that outlasts the
    /// lease (a broker cut off) ends with the lease.
    async fn read_checkpoint(&mut self) -> Option<Input> {
        let guard = self.guard.as_ref()?;
        Some(tokio::select! {
            biased;
            _ = guard.lost() => Input::LostWhilePreparing,
            prepared = CheckpointDir::prepare(self.c, guard) => match prepared {
                Ok(dir) => {
                    self.checkpoint = dir;
                    Input::Prepared { checkpoint: self.checkpoint.is_some() }
                }
                Err(f) => Input::PrepareFailed(f),
            },
        })
    }

    fn child_started(&mut self, pid: u32) {
        stamp("run", "child-started");
        self.child_group = tree::PinnedGroup::pin(pid, &[self.link.pid, std::process::id()]);
        // An interactive command reads the terminal: its group must be the foreground one, or
        // the first read stops it (SIGTTIN) for good. Ignored before the hand-over: from then on
        // a line of ours must not stop us (stty tostop) while the lease is ours to renew.
        sys::ignore_sigttou(true);
        if sys::give_terminal(pid) {
            self.terminal = Some(TakeTerminalBack);
        } else {
            sys::ignore_sigttou(false);
        }
        self.rep.child_started(pid, self.link.pid);
    }

    /// Passes the variables the command gets for this hold.
    fn send_env(&mut self) -> Input {
        let c = self.c;
        let checkpoint = self.checkpoint.as_ref();
        let mut env = checkpoint.map(CheckpointDir::env).unwrap_or_default();
        if let Some(file) = checkpoint.and_then(|d| d.last_file.as_deref()) {
            self.rep.warning(&format!(
                "the last checkpoint of lock {:?} cannot be passed in KAFKA_LOCK_CHECKPOINT (it holds \
                 a NUL character or is too long for an environment variable); the command finds it \
                 in the file named by KAFKA_LOCK_LAST_CHECKPOINT_FILE ({}) instead",
                c.lock,
                file.display()
            ));
        }
        let permit = self.guard.as_ref().map_or(0, LockGuard::permit);
        env.push(("KAFKA_LOCK_PERMIT", permit.to_string().into()));
        env.push(("KAFKA_LOCK_TOKEN", self.token.value().to_string().into()));
        env.push((
            "KAFKA_LOCK_GENERATION",
            self.token.generation.to_string().into(),
        ));
        env.push(("KAFKA_LOCK_MEMBER_ID", self.token.member_id.clone().into()));
        match self.link.send_env(&env) {
            Ok(()) => Input::EnvSent,
            Err(e) => Input::EnvFailed(e.to_string()),
        }
    }

    /// Stops everything the dead supervisor started, which is re-parented here (we are a
    /// subreaper), the way the supervisor would have.
    async fn stop_tree(
        &mut self,
        running: bool,
        child: Option<u32>,
        kill_by: Option<Instant>,
    ) -> Input {
        let group = self.child_group.take().filter(|_| running);
        // On CLOCK_BOOTTIME, as the supervisor counts: a suspend during the stop counts.
        let kill_by = kill_by
            .map(|at| sys::mono_to_boot(sys::mono_ns_of(at), sys::mono_ns(), sys::boot_ns()));
        let grace = self.t.kill_grace;
        let reaped = tokio::task::spawn_blocking(move || {
            let mut exits = Vec::new();
            tree::stop_everything(group, grace, kill_by, |pid, e| exits.push((pid, e)));
            exits
        })
        .await
        .unwrap_or_default();
        // It ran until no child was left: the supervisor is among the reaped.
        self.link.reaped.set(true);
        let exit_of = |pid: u32| reaped.iter().find(|(p, _)| *p == pid).and_then(|(_, e)| *e);
        let how = exit_of(self.link.pid)
            .map(|e| match e {
                ChildExit::Code(c) => format!("status {c}"),
                ChildExit::Signal(s) => sys::signal_name(s),
            })
            .unwrap_or_else(|| "status unknown".to_owned());
        Input::TreeStopped {
            child: child.and_then(exit_of),
            how,
        }
    }

    /// The run's end, worded.
    fn conclude(&mut self, outcome: Outcome, cut: Option<i32>) -> Result<u8, Failure> {
        let (c, t) = (self.c, self.t);
        let note = release_note(cut, t.session);
        let (status, line) = match outcome {
            Outcome::Status(status) => {
                if let Some(sig) = cut {
                    exit::print_line(&format!(
                        "releasing lock {:?} was cut short by {}; the broker frees it after the \
                         session timeout ({})",
                        c.lock,
                        sys::signal_name(sig),
                        sys::human(t.session)
                    ));
                }
                return Ok(status);
            }
            Outcome::PrepareFailed(f) => return Err(f),
            Outcome::LeaseGoneBeforeStart => (
                exit::NOT_ACQUIRED,
                format!(
                    "lock {:?} was granted but its lease ran out before the command could start \
                     (kafka-lock or its supervisor paused or starved, or the brokers out of reach \
                     meanwhile); the command was not run; try again",
                    c.lock
                ),
            ),
            Outcome::EnvFailed(e) => (
                exit::OSERR,
                format!(
                    "cannot pass the hold's environment to the supervisor process: {e}; the command \
                     was not run and the lock is released"
                ),
            ),
            Outcome::NeverStarted => (
                exit::NOT_ACQUIRED,
                format!(
                    "lock {:?} was granted but its lease ran out before the command could start \
                     (kafka-lock or its supervisor paused or starved, or the brokers out of reach \
                     meanwhile); the command was not run; try again{note}",
                    c.lock,
                ),
            ),
            Outcome::CannotRun(errno) => {
                let e = io::Error::from_raw_os_error(errno);
                let status = if e.kind() == io::ErrorKind::NotFound {
                    exit::NOT_FOUND
                } else {
                    exit::CANNOT_EXECUTE
                };
                (
                    status,
                    format!(
                        "cannot run {:?}: {e}; check the command name, its permissions and $PATH (the \
                         lock was released without running it){note}",
                        c.command[0],
                    ),
                )
            }
            Outcome::CheckpointFailed(f) => (f.status, format!("{}{note}", f.line)),
            Outcome::CheckpointUnknown { reason } => (
                exit::LOST,
                format!(
                    "the command exited 0, but lock {:?} was lost ({reason}) while its checkpoint was \
                     being stored: it may or may not have been stored; `kafka-lock status --lock {}` \
                     shows which checkpoint the lock has{note}",
                    c.lock, c.lock,
                ),
            ),
            Outcome::RanOut { reason, status } => (
                exit::LOST,
                format!(
                    "the lease of lock {:?} ran out after the command ended with status {status} and \
                     before the lock could be released ({reason}; was kafka-lock stopped?): the \
                     next holder may already hold it{note}",
                    c.lock,
                ),
            ),
            Outcome::Lost { reason, status } => (
                exit::LOST,
                format!(
                    "lost lock {:?} while the command ran ({reason}); the command was stopped (SIGTERM, \
                     then SIGKILL after {}) and ended with status {status}; check the network path to \
                     the Kafka cluster, or raise --session-timeout if the host pauses for long{note}",
                    c.lock,
                    sys::human(t.kill_grace),
                ),
            ),
            Outcome::SupervisorFailed { why, how } => (
                exit::OSERR,
                format!(
                    "the supervisor process (pid {}) of lock {:?} failed: {why} ({how}); everything \
                     the command started was stopped (SIGTERM, then SIGKILL after {}){note}",
                    self.link.pid,
                    c.lock,
                    sys::human(t.kill_grace),
                ),
            ),
        };
        Err(Failure::new(status, line))
    }
}

/// The lease end of a loss the session has queued for us, if it has.
fn queued_loss(rx: &mut mpsc::UnboundedReceiver<LockEvent>) -> Option<Instant> {
    let mut at = None;
    while let Ok(ev) = rx.try_recv() {
        if let LockEvent::Lost { lease_end, .. } = ev {
            at = Some(lease_end);
        }
    }
    at
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
        CheckpointDir::create(c, last.map(|c| c.value)).map(Some)
    }

    /// The directory, with `last` placed where the command can have it: in the environment if
    /// execve can carry it, else in a file beside the one the command writes.
    fn create(c: &RunConfig, last: Option<String>) -> Result<CheckpointDir, Failure> {
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
            last,
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
        Ok(prepared)
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
        let value = match self.written().await {
            Ok(Some(value)) => value,
            Ok(None) => return None,
            Err(f) => return Some(f),
        };
        match guard.checkpoint(value.clone()).await {
            Ok(()) => {
                rep.checkpoint(&value);
                None
            }
            Err(e) => Some(self.not_stored(&e)),
        }
    }

    /// What the command left in its checkpoint file, if anything, refused before anything is
    /// sent when it cannot be a checkpoint.
    async fn written(&self) -> Result<Option<String>, Failure> {
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
            Ok(None) => return Ok(None),
            Ok(Some(bytes)) => bytes,
            Err(e) => {
                return Err(Failure::new(
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
            return Err(Failure::new(
                exit::CONFIG,
                format!(
                    "the command's checkpoint is more than {} bytes (--checkpoint-max-bytes, the \
                     brokers' offset.metadata.max.bytes); it was not stored and lock {:?} keeps \
                     its previous checkpoint",
                    self.max, self.lock
                ),
            ));
        }
        String::from_utf8(bytes).map(Some).map_err(|_| {
            Failure::new(
                exit::CONFIG,
                format!(
                    "the command's checkpoint is not UTF-8 text; it was not stored and lock {:?} \
                     keeps its previous checkpoint",
                    self.lock
                ),
            )
        })
    }

    /// Why the library did not store the command's checkpoint, and the status that says it.
    fn not_stored(&self, e: &kafka_lock::Error) -> Failure {
        let status = match e {
            kafka_lock::Error::Ledger(
                kafka_lock::LedgerError::CheckpointTooLarge { .. }
                | kafka_lock::LedgerError::CheckpointHasNul { .. },
            ) => exit::CONFIG,
            _ => exit::LOST,
        };
        let why = match e {
            kafka_lock::Error::Broker { code, .. } if matches!(code.code(), 22 | 25 | 82) => {
                "the broker rejected it because this holder is no longer the lock's current \
                 holder (its generation or member id is stale)"
            }
            _ => "it could not be stored",
        };
        // Either may have left the new value in the group: the previous one is not kept.
        if let kafka_lock::Error::Ledger(
            kafka_lock::LedgerError::CheckpointUnknown { .. }
            | kafka_lock::LedgerError::CheckpointNotCopied { .. },
        ) = e
        {
            return Failure::new(
                status,
                format!(
                    "the command exited 0 but {e}; `kafka-lock status --lock {}` shows \
                     which checkpoint lock {:?} has",
                    self.lock, self.lock
                ),
            );
        }
        Failure::new(
            status,
            format!(
                "the command exited 0 but its checkpoint was not stored: {why} ({e}); \
                 lock {:?} keeps its previous checkpoint",
                self.lock
            ),
        )
    }
}

impl Drop for CheckpointDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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

pub(crate) fn child_end(e: ChildExit) -> ChildEnd {
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

    /// `--wait` goes up to a year, a second more is refused: past that, "wait" means "without
    /// limit", which is said by leaving the flag out.
    #[test]
    fn the_longest_wait_is_a_year() {
        let year = Duration::from_secs(365 * 24 * 3600);
        let mut c = config();
        c.wait = Some(year);
        assert_eq!(Timing::resolve(&c).expect("a year's wait").wait, Some(year));
        c.wait = Some(year + Duration::from_secs(1));
        refused(&c, "--wait");
    }

    /// `-E` and `-L` replace 75 and 74 and nothing else; `-E 0` makes a busy lock a success,
    /// while `-L 0` keeps a lost lock a failure (exit 0, but said as one).
    #[test]
    fn the_conflict_and_lost_codes_replace_only_their_own_statuses() {
        let mut c = config();
        let mut rep = Reporter::new(&c.lock, true);
        let busy = || Err(Failure::new(exit::NOT_ACQUIRED, "busy"));
        let lost = || Err(Failure::new(exit::LOST, "lost"));
        assert_eq!(conclude(&c, &mut rep, Ok(5)), Ok(5));
        assert_eq!(conclude(&c, &mut rep, busy()).unwrap_err().status, 75);
        assert_eq!(conclude(&c, &mut rep, lost()).unwrap_err().status, 74);
        c.conflict_exit_code = Some(3);
        c.lost_exit_code = Some(4);
        assert_eq!(conclude(&c, &mut rep, busy()).unwrap_err().status, 3);
        assert_eq!(conclude(&c, &mut rep, lost()).unwrap_err().status, 4);
        let config_error = Err(Failure::new(exit::CONFIG, "bad"));
        assert_eq!(conclude(&c, &mut rep, config_error).unwrap_err().status, 78);
        c.conflict_exit_code = Some(0);
        c.lost_exit_code = Some(0);
        assert_eq!(conclude(&c, &mut rep, busy()), Ok(0));
        let f = conclude(&c, &mut rep, lost()).expect_err("-L 0 made a lost lock a success");
        assert_eq!(f.status, 0);
    }

    /// Settings that cannot be put together end the run with their own status, and the line
    /// says which variable set the flag it names.
    #[test]
    fn a_run_that_cannot_start_fails_with_the_settings_status() {
        let from_env = FromEnv(vec![(
            "session-timeout".into(),
            "KAFKA_LOCK_SESSION_TIMEOUT".into(),
        )]);
        let f = failed_before_start(
            "l",
            true,
            &from_env,
            Failure::new(exit::CONFIG, "--session-timeout must be positive"),
        )
        .expect_err("a run that could not start succeeded");
        assert_eq!(f.status, exit::CONFIG);
        assert!(f.line.contains("KAFKA_LOCK_SESSION_TIMEOUT"), "{}", f.line);
    }

    /// The command's end as kafka-lock passes it on: its code, or 128 + the signal (255 past
    /// what a status holds).
    #[test]
    fn a_commands_end_is_its_code_or_128_plus_its_signal() {
        let e = child_end(ChildExit::Code(3));
        assert_eq!((e.code, e.signal, e.status), (Some(3), None, 3));
        let e = child_end(ChildExit::Code(255));
        assert_eq!((e.code, e.signal, e.status), (Some(255), None, 255));
        let e = child_end(ChildExit::Signal(9));
        assert_eq!((e.code, e.signal, e.status), (None, Some(9), 137));
        let e = child_end(ChildExit::Signal(64));
        assert_eq!((e.code, e.signal, e.status), (None, Some(64), 192));
        assert_eq!(child_end(ChildExit::Signal(200)).status, 255);
    }

    /// A release cut short by a signal says so, with the session timeout after which the broker
    /// frees the lock; a whole release adds nothing.
    #[test]
    fn a_release_cut_short_names_the_signal_and_the_session_timeout() {
        assert_eq!(release_note(None, Duration::from_secs(10)), "");
        let note = release_note(Some(15), Duration::from_secs(10));
        assert!(note.contains("SIGTERM"), "{note}");
        assert!(
            note.contains(&sys::human(Duration::from_secs(10))),
            "{note}"
        );
    }

    /// The lease end of the last loss queued, past any other event; none if none is queued.
    #[test]
    fn a_queued_loss_is_found_among_the_events() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        assert_eq!(queued_loss(&mut rx), None);
        let at = Instant::now();
        let later = at + Duration::from_secs(1);
        tx.send(LockEvent::Released).unwrap();
        tx.send(LockEvent::Lost {
            reason: LossReason::LeaseExpired,
            lease_end: at,
        })
        .unwrap();
        tx.send(LockEvent::Lost {
            reason: LossReason::Reassigned,
            lease_end: later,
        })
        .unwrap();
        tx.send(LockEvent::Released).unwrap();
        assert_eq!(queued_loss(&mut rx), Some(later));
        assert_eq!(queued_loss(&mut rx), None, "the events were not taken");
    }

    /// The command's checkpoint file is read only if it is a regular file, at most `limit`
    /// bytes of it, and never through a symbolic link or from a FIFO that would block.
    #[test]
    fn only_a_regular_files_checkpoint_is_read() {
        let dir = std::env::temp_dir().join(format!("kafka-lock-run-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let file = dir.join("checkpoint");
        assert!(matches!(read_regular_file(&file, 10), Ok(None)));
        std::fs::write(&file, b"0123456789abc").unwrap();
        assert_eq!(
            read_regular_file(&file, 10).unwrap(),
            Some(b"0123456789".to_vec())
        );
        let link = dir.join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(matches!(
            read_regular_file(&link, 10),
            Err(FileRefused::NotRegular)
        ));
        let fifo = dir.join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
        // On a thread: an open that waits for a writer must fail the test, not hang it.
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let _ = tx.send(matches!(
                    read_regular_file(&fifo, 10),
                    Err(FileRefused::NotRegular)
                ));
            })
        };
        let refused = rx.recv_timeout(Duration::from_secs(60));
        if refused.is_err() {
            // A writer's open lets the waiting one through.
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        }
        reader.join().unwrap();
        assert_eq!(refused, Ok(true), "a FIFO was not refused at once");
        assert!(matches!(
            read_regular_file(&dir, 10),
            Err(FileRefused::NotRegular)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A lock with a ledger and this `--checkpoint-max-bytes`, which has a checkpoint directory.
    fn ledgered(max: usize) -> RunConfig {
        let mut c = config();
        c.ledger_topic = Some("ledger".into());
        c.checkpoint_max_bytes = max;
        c
    }

    fn has_var(env: &[(&'static str, OsString)], name: &str) -> bool {
        env.iter().any(|(k, _)| *k == name)
    }

    /// The last checkpoint reaches the command in `KAFKA_LOCK_CHECKPOINT` up to 64 KiB, which
    /// execve takes (one string may be up to 128 KiB, MAX_ARG_STRLEN), and in the file named by
    /// `KAFKA_LOCK_LAST_CHECKPOINT_FILE` past that or with a NUL (a C string cannot carry it).
    #[test]
    fn the_last_checkpoint_is_in_the_environment_up_to_64_kib_and_in_a_file_past_it() {
        let c = ledgered(4096);
        for len in [2000, 64 * 1024] {
            let last = "x".repeat(len);
            let dir = CheckpointDir::create(&c, Some(last.clone())).expect("the directory");
            let env = dir.env();
            assert!(
                dir.last_file.is_none() && !has_var(&env, "KAFKA_LOCK_LAST_CHECKPOINT_FILE"),
                "a checkpoint of {len} bytes was put in a file"
            );
            let out = std::process::Command::new("sh")
                .args(["-c", "printf %s \"$KAFKA_LOCK_CHECKPOINT\""])
                .envs(env)
                .output()
                .expect("a command given the checkpoint in its environment");
            assert!(out.status.success(), "{out:?}");
            assert!(
                out.stdout == last.as_bytes(),
                "a checkpoint of {len} bytes did not reach the command whole in its environment \
                 ({} bytes did)",
                out.stdout.len()
            );
        }
        for last in ["x".repeat(64 * 1024 + 1), "a\0b".to_owned()] {
            let dir = CheckpointDir::create(&c, Some(last.clone())).expect("the directory");
            let env = dir.env();
            let file = dir.last_file.clone().unwrap_or_else(|| {
                panic!("a checkpoint of {} bytes was not put in a file", last.len())
            });
            assert!(!has_var(&env, "KAFKA_LOCK_CHECKPOINT"), "{}", last.len());
            assert!(env.contains(&("KAFKA_LOCK_LAST_CHECKPOINT_FILE", file.clone().into())));
            assert!(std::fs::read(&file).unwrap() == last.as_bytes());
        }
    }

    /// The directory the checkpoints are handed over in is removed with what it holds when the
    /// run is done with it, not left in `$TMPDIR`.
    #[test]
    fn the_checkpoint_directory_is_removed_when_dropped() {
        let dir =
            CheckpointDir::create(&ledgered(4096), Some("a\0b".into())).expect("the directory");
        std::fs::write(dir.file(), "next").unwrap();
        let path = dir.dir.clone();
        assert!(path.join("last-checkpoint").is_file() && path.join("checkpoint").is_file());
        drop(dir);
        assert!(!path.exists(), "{} was left behind", path.display());
    }

    /// A checkpoint of exactly `--checkpoint-max-bytes` is taken, one byte more is refused (78)
    /// before anything is sent; no file is no checkpoint.
    #[tokio::test]
    async fn a_checkpoint_of_exactly_the_limit_is_taken_and_one_byte_more_refused() {
        let dir = CheckpointDir::create(&ledgered(16), None).expect("the directory");
        assert_eq!(dir.written().await, Ok(None));
        std::fs::write(dir.file(), "x".repeat(16)).unwrap();
        assert_eq!(dir.written().await, Ok(Some("x".repeat(16))));
        std::fs::write(dir.file(), "x".repeat(17)).unwrap();
        let f = dir
            .written()
            .await
            .expect_err("17 bytes over a limit of 16");
        assert_eq!(f.status, exit::CONFIG, "{}", f.line);
        assert!(f.line.contains("more than 16 bytes"), "{}", f.line);
    }

    /// What the library refuses to store says why: a checkpoint it can never take (a NUL, too
    /// long) is the command's to fix (78); a holder the broker no longer knows has lost the
    /// lock (74), and the line says so; anything else could not be stored (74).
    #[test]
    fn a_checkpoint_the_library_refuses_says_why_with_its_status() {
        use kafka_lock::{Api, Error, KafkaCode, LedgerError};
        let dir = CheckpointDir::create(&ledgered(16), None).expect("the directory");
        let stale = "no longer the lock's current holder";
        for e in [
            Error::Ledger(LedgerError::CheckpointHasNul { at: 1 }),
            Error::Ledger(LedgerError::CheckpointTooLarge { len: 17, max: 16 }),
        ] {
            let f = dir.not_stored(&e);
            assert_eq!(f.status, exit::CONFIG, "{}", f.line);
            assert!(
                f.line.contains("it could not be stored") && !f.line.contains(stale),
                "{}",
                f.line
            );
            assert!(f.line.contains(&e.to_string()), "{}", f.line);
        }
        for code in [
            KafkaCode::ILLEGAL_GENERATION,
            KafkaCode::UNKNOWN_MEMBER_ID,
            KafkaCode::FENCED_INSTANCE_ID,
        ] {
            let f = dir.not_stored(&Error::Broker {
                api: Api::OffsetCommit,
                code,
                message: None,
            });
            assert_eq!(f.status, exit::LOST, "{}", f.line);
            assert!(f.line.contains(stale), "{}", f.line);
        }
        let f = dir.not_stored(&Error::Broker {
            api: Api::OffsetCommit,
            code: KafkaCode::COORDINATOR_NOT_AVAILABLE,
            message: None,
        });
        assert_eq!(f.status, exit::LOST, "{}", f.line);
        assert!(
            f.line.contains("it could not be stored") && !f.line.contains(stale),
            "{}",
            f.line
        );
    }

    /// A signal sent to kafka-lock comes out of `recv` by its number, and `drain` takes those
    /// already received, keeping the latest in `last` (SIGUSR1 and SIGUSR2 only: the test's
    /// own process receives them).
    #[tokio::test]
    async fn signals_are_received_by_number_and_drained_to_the_latest() {
        let mut signals = Signals::new().expect("the handlers");
        let me = rustix::process::getpid();
        rustix::process::kill_process(me, Signal::USR2).unwrap();
        let n = tokio::time::timeout(Duration::from_secs(60), signals.recv())
            .await
            .expect("the signal was not received");
        assert_eq!(n, Signal::USR2.as_raw());
        assert_eq!(signals.last, Some(Signal::USR2.as_raw()));
        rustix::process::kill_process(me, Signal::USR1).unwrap();
        // Delivered before `kill` returns (to this process, unblocked); the stream has it once
        // the runtime's signal driver has read it, which `drain` polls for.
        tokio::time::timeout(Duration::from_secs(60), async {
            while signals.last != Some(Signal::USR1.as_raw()) {
                signals.drain().await;
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("drain did not take the signal received");
    }

    /// With only a short `--session-timeout`, the grace, the margin and the heartbeat shrink
    /// with it (a fifth, a quarter and a third of what is left) instead of keeping defaults
    /// that no longer fit.
    #[test]
    fn a_short_session_scales_the_defaults_down() {
        let mut c = config();
        c.session_timeout = S(2);
        let t = Timing::resolve(&c).expect("a 2 s session with every other default");
        assert_eq!(
            (t.kill_grace, t.margin, t.heartbeat),
            (
                Duration::from_millis(400),
                Duration::from_millis(500),
                Duration::from_millis(500)
            ),
            "{t:?}"
        );
    }

    /// Zero is a valid `--wait` (one try), `--kill-grace` (SIGKILL at the lease end) and
    /// `--lease-margin` (with a zero grace); every other timeout must be positive.
    #[test]
    fn zero_is_refused_only_where_it_means_nothing() {
        type Set = fn(&mut RunConfig, Option<Duration>);
        let positive: [(&str, Set); 5] = [
            ("--session-timeout", |c, d| c.session_timeout = d),
            ("--rebalance-timeout", |c, d| c.rebalance_timeout = d),
            ("--heartbeat-interval", |c, d| c.heartbeat_interval = d),
            ("--request-timeout", |c, d| c.request_timeout = d),
            ("--connect-timeout", |c, d| c.connect_timeout = d),
        ];
        for (flag, set) in positive {
            let mut c = config();
            set(&mut c, Some(Duration::ZERO));
            refused(&c, flag);
        }
        let mut c = config();
        c.wait = Some(Duration::ZERO);
        c.kill_grace = Some(Duration::ZERO);
        c.lease_margin = Some(Duration::ZERO);
        let t = Timing::resolve(&c).expect("zero wait, grace and margin");
        assert_eq!(
            (t.wait, t.kill_grace, t.margin),
            (Some(Duration::ZERO), Duration::ZERO, Duration::ZERO)
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

//! The one task that runs a [`Membership`], and the lock's [`Ledger`] when it has one: it owns the
//! broker connections and the clock, feeds the machines answers, commands and time, and publishes
//! what they say. With a ledger, the membership's events go through the ledger machine, which
//! holds back the hold until its ACQUIRED record is acknowledged and may ask the membership to
//! heartbeat or leave.
//!
//! The task never awaits a connection or an answer in line with its timers: connecting to a
//! broker can take the whole connect timeout, and the lease must end on time even when every
//! connection is hanging. Heartbeats and LeaveGroups, nearly all a held lock sends, are futures
//! the task polls beside its timers ([`Control`]); the other requests run on short-lived tasks
//! of their own and answer through a channel.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, warn, Instrument};

use super::conn::Connection;
use super::inbox;
use super::pool::{self, Park, Pool};
use crate::error::{Error, Result};
use crate::ledger::{self, LeaderLane, LedgerError, MemberView, Now};
use crate::membership::{Broker, Command, Event, Lane, Membership, Target, Transmit};
use crate::wire::Response;
use kafka_protocol::messages::ApiKey;

/// The lock's ledger machine, told of the driver's failures as they are.
pub(crate) type Ledger = ledger::Ledger<Error>;

/// An event as the session publishes it: a machine's failure turned into the crate's error.
pub(crate) type SessionEvent = Event<Arc<Error>>;

/// `e` with its failure, if any, in the crate's words.
fn published(e: Event<impl Into<Error>>) -> SessionEvent {
    e.map_failure(|f| Arc::new(f.into()))
}

/// What the session publishes for guards and waiters.
#[derive(Debug, Clone)]
pub(crate) enum SessionState {
    /// Not holding; the assignment of `generation` (-1: none completed yet) names this holder.
    Waiting {
        holder: Option<crate::membership::HolderInfo>,
        generation: i32,
    },
    /// Holding with this token until `lease_end` unless renewed, in this permit slot.
    Held(crate::membership::FencingToken, Instant, u16),
    /// The hold (or the wait) is over; the string says why.
    Ended(End),
}

#[derive(Debug, Clone)]
pub(crate) enum End {
    Lost(crate::membership::LossReason),
    Released,
    Failed(Arc<Error>),
    Left,
}

/// What the lock's owner can ask of the session. Sent boxed ([`Commands`]).
#[derive(Debug)]
pub(crate) enum SessionCommand {
    /// A command for the membership machine.
    Member(Command),
    /// Store a checkpoint, fenced (needs a ledger); the outcome goes to the sender.
    Checkpoint(String, oneshot::Sender<Result<()>>),
    /// The ledger topic passed its check (`driver::ledger::check_ledger_topic`), with its
    /// partition when that has a leader: the member's JoinGroup, held until now, may go out.
    LedgerChecked(Option<ledger::Partition>),
}

/// The lock's commands to its session, on an [`inbox`](super::inbox), not a tokio channel: a
/// held lock sends a command or two in its life (a release, a checkpoint), and a channel would
/// cost it 800 bytes for its whole life (BENCHMARKS.md, "Memory per held lock"). Boxed, so
/// that the queue of a lock that took a command is small.
pub(crate) type Commands = inbox::Sender<Box<SessionCommand>>;

impl From<Command> for Box<SessionCommand> {
    fn from(c: Command) -> Self {
        Box::new(SessionCommand::Member(c))
    }
}

/// Handle to a running session.
pub(crate) struct SessionHandle {
    pub(crate) commands: Commands,
    pub(crate) state: watch::Receiver<SessionState>,
    /// Set once the membership has ended: whether the coordinator confirmed that it has no
    /// member for us any more (see [`Event::Left`]).
    pub(crate) left: Arc<inbox::Left>,
    /// The session's connections: a guard's reads (its last checkpoint) go over them rather
    /// than open their own.
    pub(crate) pool: Arc<Pool>,
    /// Where the session last found the coordinator and the ledger's leader.
    pub(crate) places: Arc<Mutex<Places>>,
    /// The checkpoint read made for the hold that began (see [`CheckpointRead`]), until the
    /// guard takes it.
    pub(crate) granted: Granted,
}

/// What a checkpoint read found: the lock's last checkpoint, if any, or why it could not be read.
pub(crate) type ReadOutcome = Result<Option<ledger::Checkpoint>>;

/// The read of the hold that began, left for its guard.
pub(crate) type Granted = Arc<Mutex<Option<ReadOutcome>>>;

/// Starts a read of the lock's last checkpoint from the places the session knows. With one,
/// the ledger machine asks for it when the membership is assigned the lock, beside the ACQUIRED
/// append, and the hold begins once both are in.
pub(crate) type CheckpointRead =
    Box<dyn Fn(Places) -> Pin<Box<dyn Future<Output = ReadOutcome> + Send>> + Send>;

/// Where the session last found the lock's coordinator and its ledger partition's leader, as
/// its machines know them. A read that starts there skips the lookups; a place that is out of
/// date costs that read one retriable error (NOT_COORDINATOR, NOT_LEADER_OR_FOLLOWER), after
/// which it looks up as any read does.
#[derive(Debug, Clone, Default)]
pub(crate) struct Places {
    pub(crate) coordinator: Option<Broker>,
    pub(crate) ledger: Option<ledger::Partition>,
}

impl Places {
    fn note(places: &Mutex<Places>, m: &Membership, l: Option<&Ledger>) {
        let (coordinator, partition) = (m.coordinator(), l.and_then(Ledger::partition));
        let mut p = places.lock().unwrap_or_else(|p| p.into_inner());
        if p.coordinator.as_ref() != coordinator {
            p.coordinator = coordinator.cloned();
        }
        if p.ledger.as_ref() != partition {
            p.ledger = partition.cloned();
        }
    }
}

pub(crate) struct SessionParams {
    /// The client's connections, shared with its other locks.
    pub(crate) pool: Arc<Pool>,
    /// Whether the pool is this lock's alone: its connections then close with the session.
    pub(crate) private: bool,
    pub(crate) first: Connection,
    /// The lock's ledger machine, if it has a ledger.
    pub(crate) ledger: Option<Ledger>,
    /// The read the ledger machine asks for when its config has `read_at_grant`.
    pub(crate) read: Option<CheckpointRead>,
    /// The ledger topic is still being checked: the member finds its coordinator and opens its
    /// connections meanwhile, but its JoinGroup waits for [`SessionCommand::LedgerChecked`].
    pub(crate) checking: bool,
}

/// Takes every event of the membership, in order, on the session task. It must return at once:
/// the lease's timers wait while it runs. A sink instead of a channel and a task of its own
/// saves a held lock about 4.5 KB (BENCHMARKS.md, "Memory per held lock").
pub(crate) type EventSink = Box<dyn FnMut(SessionEvent) + Send>;

/// Where the session task publishes: the hold's state for guards, the end of the membership
/// for leaves, and every event for whoever listens.
struct Outputs {
    state: watch::Sender<SessionState>,
    left: inbox::LeftSender,
    events: Option<EventSink>,
    places: Arc<Mutex<Places>>,
    granted: Granted,
}

/// Starts the driver task for `machine`.
pub(crate) fn spawn(
    group: &str,
    machine: Membership,
    params: SessionParams,
    events: Option<EventSink>,
) -> SessionHandle {
    let (cmd_tx, cmd_rx) = inbox::inbox();
    let (state_tx, state_rx) = watch::channel(SessionState::Waiting {
        holder: None,
        generation: -1,
    });
    let stripe = params.pool.stripe(group);
    let (gate, join_gate) = match params.checking {
        true => {
            let (tx, rx) = watch::channel(false);
            (Some(tx), Some(rx))
        }
        false => (None, None),
    };
    let net = Session {
        pool: params.pool,
        private: params.private,
        join_lane: Arc::default(),
        sent: Arc::default(),
        stripe,
        join_gate,
    };
    net.pool.offer_bootstrap(&params.first);
    let (left_tx, left_rx) = inbox::left();
    let places = Arc::new(Mutex::new(Places::default()));
    let granted = Granted::default();
    let pool = net.pool.clone();
    let span = tracing::info_span!("kafka_lock", group = %group);
    let session = Run {
        m: Box::new(machine),
        ledger: params.ledger.map(Box::new),
        lock: group.to_owned(),
        net,
        answers: None,
        control: Control::default(),
        commands_open: true,
        replies: HashMap::new(),
        next_ticket: 0,
        read: params.read,
        reading: None,
        gate,
        outputs: Outputs {
            state: state_tx,
            left: left_tx,
            events,
            places: places.clone(),
            granted: granted.clone(),
        },
    };
    tokio::spawn(run(session, cmd_rx).instrument(span));
    SessionHandle {
        commands: cmd_tx,
        state: state_rx,
        left: left_rx,
        pool,
        places,
        granted,
    }
}

/// The ACQUIRED record is on the acquisition's critical path: a lane to the ledger's leader is
/// opened as soon as the leader is known, while the membership joins.
fn open_append_lane(pool: &Arc<Pool>, p: &ledger::Partition) {
    let (pool, leader) = (pool.clone(), p.leader.clone());
    tokio::spawn(async move {
        if let Ok(lane) = pool.lane(&leader, Park::Urgent).await {
            lane.done();
        }
    });
}

fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

fn clock() -> Now {
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    Now {
        mono: now(),
        unix_ms,
    }
}

/// What the ledger machine needs to know of the membership machine.
fn view(m: &Membership) -> MemberView {
    MemberView {
        holding: m.token().is_some(),
        lease_end: m.lease_end(),
        coordinator: m.coordinator().cloned(),
        generation: m.generation(),
        member_id: m.member_id().to_owned(),
        awaiting_sync: m.token().is_some_and(|t| t.generation != m.generation()),
    }
}

/// Which machine a request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    Member,
    Ledger,
}

/// An answer for one of the machines. Boxed in the session's channel: a tokio channel allocates
/// its slots 32 at a time, and 32 unboxed answers (216 bytes each) would cost every lock 7 KB.
pub(super) type Answer = Box<(Source, u64, Result<(Response, i16)>)>;

pub(super) type AnswerChannel = (
    mpsc::UnboundedSender<Answer>,
    mpsc::UnboundedReceiver<Answer>,
);

/// The session task's state: the machines, the connections, and where answers and outcomes go.
/// Each `select!` arm of [`run`] is one method here.
struct Run {
    // The machines are boxed so that the task's future, which every lock keeps, holds pointers,
    // not the machines (and a ledger machine's 1.3 KB also when the lock has no ledger).
    m: Box<Membership>,
    ledger: Option<Box<Ledger>>,
    lock: String,
    net: Session,
    /// Answers of the requests that run on tasks of their own (joins, lookups, the ledger's).
    /// Made when one goes out and dropped once none is out: a held lock sends its Heartbeats
    /// without it, and the channel (its head and first block, 800 bytes) would otherwise stay
    /// with every held lock.
    answers: Option<AnswerChannel>,
    /// The member's requests on quick connections, polled by this task.
    control: Control,
    commands_open: bool,
    replies: HashMap<u64, oneshot::Sender<Result<()>>>,
    next_ticket: u64,
    read: Option<CheckpointRead>,
    /// The checkpoint read under way, with the try it is for. On a task of its own: its work
    /// (a tail's decoding, a lookup's waits) must not hold up the lease's timers.
    reading: Option<(u64, tokio::task::JoinHandle<ReadOutcome>)>,
    /// Opens the JoinGroup's gate ([`Session::join_gate`]) once the ledger topic passed its
    /// check; dropped then. Dropped unopened with the session when the check fails.
    gate: Option<watch::Sender<bool>>,
    outputs: Outputs,
}

async fn run(mut run: Run, mut commands: inbox::Receiver<Box<SessionCommand>>) {
    run.m.handle_timeout(now());
    loop {
        if run.flush() {
            // What the membership did about the ledger's command is flushed before anything
            // else happens.
            continue;
        }
        run.publish_lease();
        if run.is_done() {
            break;
        }
        drop_idle_answers(&mut run.answers);
        let deadline = run.deadline();
        tokio::select! {
            biased;
            // Timers first: an expired lease must be reported before any answer is considered.
            _ = sleep_until(deadline) => run.on_timeout(),
            // Right after the timers: a request pushed on the last turn is written when this
            // arm is first polled.
            (id, result) = run.control.next() => run.on_member_answer(id, result),
            cmd = commands.recv(), if run.commands_open => run.on_command(cmd),
            Some(answer) = next_answer(&mut run.answers), if run.answers.is_some() => {
                run.on_answer(*answer);
            }
            read = read_done(&mut run.reading), if run.reading.is_some() => run.on_read(read),
        }
    }
    run.finish();
}

impl Run {
    /// Sends what the machines ask for and publishes what they say. Returns whether the ledger
    /// nudged the membership, whose requests and events must then be flushed first.
    fn flush(&mut self) -> bool {
        // Before anything is published: a guard handed out below reads from here.
        Places::note(&self.outputs.places, &self.m, self.ledger.as_deref());
        while let Some(t) = self.m.poll_transmit() {
            // A member of a completed generation rejoins to keep what it has: its JoinGroup
            // may take the lanes first joins cannot.
            let park = if self.m.generation() >= 0 || self.m.token().is_some() {
                Park::Urgent
            } else {
                Park::Fresh
            };
            let answers = &mut self.answers;
            if let Some(request) = send(&self.net, t, park, || answer_to(answers)) {
                self.control.push(request);
            }
        }
        while let Some(e) = self.m.poll_event() {
            match &mut self.ledger {
                Some(l) => l.on_membership(e, &view(&self.m), clock()),
                None => self.outputs.emit(published(e)),
            }
        }
        let Some(l) = &mut self.ledger else {
            return false;
        };
        // The membership hears the ledger's news before the ledger's own requests go out, and
        // its answer (a rejoin's JoinGroup, on the next turn of the loop) is sent first: the
        // long poll that the same news re-armed waits, and the JoinGroup finds the lane that
        // poll just gave back still idle.
        let mut nudged = false;
        while let Some(c) = l.poll_command() {
            self.m.handle_command(c, now());
            nudged = true;
        }
        if nudged {
            return true;
        }
        while let Some(t) = l.poll_transmit() {
            let answers = answer_to(&mut self.answers);
            send_ledger(&self.net.pool, self.net.stripe, t, answers);
        }
        while let Some(attempt) = l.poll_read() {
            if let Some(read) = &self.read {
                let places = self
                    .outputs
                    .places
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                let task = tokio::spawn(read(places).in_current_span());
                if let Some((_, earlier)) = self.reading.replace((attempt, task)) {
                    earlier.abort();
                }
            }
        }
        // Before the `Acquired` event it goes with: the guard handed out on it takes it.
        while let Some(read) = l.poll_granted() {
            *self
                .outputs
                .granted
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(read);
        }
        while let Some(e) = l.poll_event() {
            self.outputs.emit(published(e));
        }
        while let Some((ticket, result)) = l.poll_checkpoint() {
            if let Some(reply) = self.replies.remove(&ticket) {
                let _ = reply.send(result.map_err(Error::from));
            }
        }
        false
    }

    /// Renewals emit no event; without this the guard would time the lease from the
    /// acquisition and report a loss while heartbeats still succeed.
    fn publish_lease(&self) {
        if let Some(lease) = self.m.lease_end() {
            self.outputs.state.send_if_modified(|s| match s {
                SessionState::Held(_, l, _) if *l != lease => {
                    *l = lease;
                    true
                }
                _ => false,
            });
        }
    }

    fn is_done(&self) -> bool {
        self.m.is_done() && self.ledger.as_deref().is_none_or(Ledger::is_done)
    }

    fn deadline(&self) -> Option<tokio::time::Instant> {
        wake_at(
            self.m.poll_timeout(),
            self.m.lease_end(),
            self.ledger.as_deref().and_then(Ledger::poll_timeout),
            now(),
            self.net.pool.origin,
        )
        .map(tokio::time::Instant::from_std)
    }

    fn on_timeout(&mut self) {
        self.m.handle_timeout(now());
        if let Some(l) = &mut self.ledger {
            l.handle_timeout(&view(&self.m), clock());
        }
    }

    fn on_command(&mut self, cmd: Option<Box<SessionCommand>>) {
        match cmd.map(|c| *c) {
            Some(SessionCommand::Member(c)) => {
                if c == Command::Leave {
                    // A JoinGroup held for the ledger topic's check is not sent.
                    self.gate = None;
                }
                self.m.handle_command(c, now());
            }
            Some(SessionCommand::Checkpoint(value, reply)) => match &mut self.ledger {
                Some(l) => {
                    self.next_ticket += 1;
                    self.replies.insert(self.next_ticket, reply);
                    l.checkpoint(self.next_ticket, value, &view(&self.m), clock());
                }
                None => {
                    let _ = reply.send(Err(LedgerError::NoLedger {
                        lock: self.lock.clone(),
                    }
                    .into()));
                }
            },
            Some(SessionCommand::LedgerChecked(partition)) => {
                if let (Some(l), Some(p)) = (&mut self.ledger, partition) {
                    open_append_lane(&self.net.pool, &p);
                    l.found_partition(p);
                }
                if let Some(gate) = self.gate.take() {
                    let _ = gate.send(true);
                }
                self.net.join_gate = None;
            }
            // Every handle is gone: nobody can use the lock any more, so leave.
            None => {
                self.gate = None;
                self.commands_open = false;
                self.m.handle_command(Command::Leave, now());
            }
        }
    }

    fn on_answer(&mut self, answer: (Source, u64, Result<(Response, i16)>)) {
        match (answer, &mut self.ledger) {
            ((Source::Member, id, result), _) => self.on_member_answer(id, result),
            ((Source::Ledger, id, result), Some(l)) => {
                l.handle_response(id, result, &view(&self.m), clock());
            }
            ((Source::Ledger, ..), None) => {}
        }
    }

    fn on_read(&mut self, (attempt, read): (u64, ReadOutcome)) {
        self.reading = None;
        if let Some(l) = &mut self.ledger {
            l.on_read(attempt, read, &view(&self.m), clock());
        }
    }

    fn on_member_answer(&mut self, id: u64, result: Result<(Response, i16)>) {
        // Written before the request, so it is here before the answer.
        let sent = self
            .net
            .sent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some((sent, at)) = sent {
            self.m.handle_sent(sent, at);
        }
        self.m.handle_response(id, result.map(|(r, _)| r), now());
    }

    fn finish(self) {
        if let Some((_, task)) = &self.reading {
            task.abort();
        }
        // A session that ended without leaving (a fatal error) left nothing confirmed.
        self.outputs.left.set(false, false);
        if let Some((_, lane)) = self
            .net
            .join_lane
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            lane.done();
        }
        // The member's last requests still go out, as they would on tasks of their own: a
        // LeaveGroup for a member id given up just before the end frees the broker of it.
        self.control.detach();
        if self.net.private {
            self.net.pool.close_all();
        }
        debug!("session ended");
    }
}

impl Outputs {
    fn emit(&mut self, e: SessionEvent) {
        publish(&self.state, &e);
        if let Event::Left { confirmed } = e {
            self.left.set(confirmed, true);
        }
        if let Some(sink) = &mut self.events {
            sink(e);
        }
    }
}

/// Drops the answer channel when no request can answer on it any more: only the session task
/// makes its senders, so with its own the last one and nothing queued, nothing can arrive. A
/// request still out holds a sender, and must: a join waiting for a lane would take the
/// channel's end for its session's, leave the line, and never be answered.
pub(super) fn drop_idle_answers(answers: &mut Option<AnswerChannel>) {
    if let Some((tx, rx)) = answers {
        if tx.strong_count() == 1 && rx.is_empty() {
            *answers = None;
        }
    }
}

/// A sender for a request's answer, making the channel if there is none.
pub(super) fn answer_to(answers: &mut Option<AnswerChannel>) -> mpsc::UnboundedSender<Answer> {
    answers
        .get_or_insert_with(mpsc::unbounded_channel)
        .0
        .clone()
}

/// The next answer on the channel; pending while there is none (the arm is off then).
pub(super) async fn next_answer(answers: &mut Option<AnswerChannel>) -> Option<Answer> {
    match answers {
        Some((_, rx)) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// The outcome of the checkpoint read under way, with its try's attempt number.
async fn read_done(
    reading: &mut Option<(u64, tokio::task::JoinHandle<ReadOutcome>)>,
) -> (u64, ReadOutcome) {
    match reading {
        Some((attempt, task)) => {
            let read = task.await.unwrap_or_else(|e| {
                Err(Error::Protocol(format!(
                    "the checkpoint read did not finish: {e}"
                )))
            });
            (*attempt, read)
        }
        None => std::future::pending().await,
    }
}

/// A member request on a quick connection, with the id of its transmit.
pub(super) type ControlRequest =
    Pin<Box<dyn Future<Output = (u64, Result<(Response, i16)>)> + Send>>;

/// The member's Heartbeats and LeaveGroups (one or two at a time), polled by the session task
/// itself: they are nearly all a held lock sends, and a task of their own would cost each one a
/// spawn, two more wake-ups and a trip through the answer channel.
#[derive(Default)]
pub(super) struct Control(Vec<ControlRequest>);

impl Control {
    pub(super) fn push(&mut self, request: ControlRequest) {
        self.0.push(request);
    }

    /// The next answer. Requests are polled in turn until one is answered, the first poll
    /// writing a request; with none out this is pending until the loop's next turn polls what
    /// was pushed meanwhile.
    pub(super) fn next(&mut self) -> impl Future<Output = (u64, Result<(Response, i16)>)> + '_ {
        std::future::poll_fn(move |cx| {
            let mut answered = None;
            for (i, request) in self.0.iter_mut().enumerate() {
                if let Poll::Ready(answer) = request.as_mut().poll(cx) {
                    answered = Some((i, answer));
                    break;
                }
            }
            match answered {
                Some((i, answer)) => {
                    drop(self.0.swap_remove(i));
                    Poll::Ready(answer)
                }
                None => Poll::Pending,
            }
        })
    }

    /// Hands the requests still out to tasks of their own, their answers going nowhere.
    pub(super) fn detach(self) {
        for request in self.0 {
            tokio::spawn(request);
        }
    }
}

/// The spacing of the grid the membership's deferrable timers are rounded up to.
pub(super) const TIMER_GRID: Duration = Duration::from_millis(20);

/// When the session task wakes next. The lease's end and the ledger's deadlines stand as they
/// are. The membership's other timers (its next Heartbeat, a retry, the bound on a leave) are
/// rounded up to the next point of a grid of [`TIMER_GRID`] counted from `origin`, the client's,
/// unless already due (a Heartbeat asked for now goes now), and never past the lease's end:
/// the Heartbeats of a client's locks then go out a few at a time, in one wake-up of the
/// runtime each, instead of one wake-up per Heartbeat. The lease is untouched: it is timed from
/// when the machine sent its Heartbeat, so one sent later renews later, never longer; and a
/// timer of the machine firing late is what any busy runtime does anyway, acted on with the
/// time it actually fired.
pub(super) fn wake_at(
    member: Option<Instant>,
    lease_end: Option<Instant>,
    ledger: Option<Instant>,
    now: Instant,
    origin: Instant,
) -> Option<Instant> {
    let member = member.map(|at| {
        let rounded = match at.checked_duration_since(origin) {
            Some(since) if at > now => {
                let grid = TIMER_GRID.as_nanos();
                let points = since.as_nanos().div_ceil(grid);
                let nanos = points.saturating_mul(grid) - since.as_nanos();
                at.checked_add(Duration::from_nanos(u64::try_from(nanos).unwrap_or(0)))
                    .unwrap_or(at)
            }
            _ => at,
        };
        lease_end.map_or(rounded, |end| rounded.min(end.max(at)))
    });
    earliest(member, ledger)
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn publish(state: &watch::Sender<SessionState>, e: &SessionEvent) {
    let next = match e {
        Event::Acquired {
            token,
            lease_end,
            permit,
        } => SessionState::Held(token.clone(), *lease_end, *permit),
        Event::TokenChanged { token } => match &*state.borrow() {
            SessionState::Held(_, lease, permit) => {
                SessionState::Held(token.clone(), *lease, *permit)
            }
            other => other.clone(),
        },
        Event::Waiting {
            holder, generation, ..
        } => SessionState::Waiting {
            holder: holder.clone(),
            generation: *generation,
        },
        Event::Lost { reason, .. } => SessionState::Ended(End::Lost(reason.clone())),
        Event::Released => SessionState::Ended(End::Released),
        Event::Failed(err) => match &*state.borrow() {
            // A loss reported just before stays the headline.
            SessionState::Ended(End::Lost(..)) => return,
            _ => SessionState::Ended(End::Failed(err.clone())),
        },
        Event::Left { .. } => match &*state.borrow() {
            SessionState::Ended(_) => return,
            _ => SessionState::Ended(End::Left),
        },
        _ => return,
    };
    state.send_replace(next);
}

/// The session's view of the client's connections.
pub(super) struct Session {
    pub(super) pool: Arc<Pool>,
    pub(super) private: bool,
    /// The lane the member's join phase goes on, kept from its first JoinGroup to its SyncGroup's
    /// answer. Without it each step of a join (MEMBER_ID_REQUIRED, the JoinGroup that parks, the
    /// SyncGroup) would queue for a lane again, behind every other lock's first join: with a
    /// line longer than the session timeout the broker can drop the pending member id
    /// meanwhile, and the join starts over.
    pub(super) join_lane: JoinLane,
    /// The member's last request that left later than the machine emitted it (a join that
    /// waited for a lane), and when it left: see [`Membership::handle_sent`].
    pub(super) sent: SentAt,
    /// Which of a broker's quick connections the lock's requests take ([`Pool::stripe`]).
    pub(super) stripe: usize,
    /// While the ledger topic is being checked: opens when it passed. A JoinGroup waits for it
    /// on the lane it was given, so the lookup and the connects overlap the check, while a
    /// topic that cannot serve is refused before the member joins the group.
    pub(super) join_gate: Option<watch::Receiver<bool>>,
}

pub(super) type SentAt = Arc<Mutex<Option<(u64, Instant)>>>;

pub(super) type JoinLane = Arc<Mutex<Option<(Broker, pool::Lane)>>>;

/// The kept join lane if it goes to `broker` and is open; a lane to another broker goes back.
fn take_join_lane(kept: &JoinLane, broker: &Broker) -> Option<pool::Lane> {
    let (to, lane) = kept.lock().unwrap_or_else(|p| p.into_inner()).take()?;
    if to == *broker && !lane.conn().is_closed() {
        Some(lane)
    } else {
        lane.done();
        None
    }
}

fn keep_join_lane(kept: &JoinLane, broker: Broker, lane: pool::Lane) {
    let old = kept
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .replace((broker, lane));
    if let Some((_, old)) = old {
        old.done();
    }
}

/// Sends `request` on the connection its kind calls for: the broker's quick connection, or a
/// parking lane lent for this one request.
async fn exchange(
    pool: &Arc<Pool>,
    stripe: usize,
    route: Route,
    build: impl FnOnce(&Connection) -> Result<(crate::wire::Request, i16)>,
    timeout: Duration,
) -> Result<(Response, i16)> {
    match route {
        Route::Quick(broker) => {
            let conn = pool.quick(broker.as_ref(), stripe).await?;
            let (request, version) = build(&conn)?;
            let api = request.api_key();
            if api == ApiKey::ApiVersions {
                return Ok((versions_answer(&conn), version));
            }
            if !held_by_the_broker(api) {
                return Ok((conn.request_at(request, version, timeout).await?, version));
            }
            // The caller hears of a timeout at `timeout`, as on a connection of its own, but
            // the request stays registered with the connection until past the broker's own
            // bound: its late answer is then read and dropped, and the connection, shared by
            // every lock of the client, is not closed under the requests queued behind it.
            // Later requests go on a fresh connection, in case this one is dead rather than
            // held (a black hole would otherwise keep every retry until the longer bound).
            let keep = ledger::parked_timeout(ledger::BROKER_COMMIT_TIMEOUT, timeout);
            match tokio::time::timeout(timeout, conn.request_at(request, version, keep)).await {
                Ok(r) => Ok((r?, version)),
                Err(_) => {
                    pool.retire_quick(broker.as_ref(), stripe, &conn);
                    Err(Error::Timeout {
                        op: format!("{api:?}"),
                        after: timeout,
                    })
                }
            }
        }
        Route::Lane(broker, park) => {
            let lane = pool.lane(&broker, park).await?;
            let (request, version) = build(lane.conn())?;
            let response = lane.conn().request_at(request, version, timeout).await?;
            lane.done();
            Ok((response, version))
        }
    }
}

/// A membership asks a newly named coordinator for its versions (ApiVersions) before its first
/// group request. The connection that request would go on asked that broker the same when it
/// opened, so its answer is at hand: sending it again cost one request per lock whose
/// coordinator is not the bootstrap broker (on three nodes, about two thirds of all
/// acquisitions). Each API's range is the version the connection negotiated, which is what the
/// membership then negotiates from it.
fn versions_answer(conn: &Connection) -> Response {
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    let mut r = kafka_protocol::messages::ApiVersionsResponse::default();
    r.api_keys = conn
        .versions()
        .iter()
        .map(|(api, v)| {
            let mut a = ApiVersion::default();
            a.api_key = api as i16;
            a.min_version = v;
            a.max_version = v;
            a
        })
        .collect();
    Response::ApiVersions(r)
}

/// Requests Apache runs as coordinator writes (GroupCoordinatorService `heartbeat` and
/// `leaveGroup`: `scheduleWriteOperation(..., offsetCommitTimeoutMs)`): it may defer their
/// answer for up to `offsets.commit.timeout.ms` while the group's offsets partition has
/// uncommitted writes, and answers them by then. A local timeout counted from when the request
/// was queued fires first.
fn held_by_the_broker(api: ApiKey) -> bool {
    matches!(api, ApiKey::Heartbeat | ApiKey::LeaveGroup)
}

enum Route {
    Quick(Option<crate::membership::Broker>),
    Lane(crate::membership::Broker, Park),
}

/// Sends a member request: on a task of its own, its answer going to `answers`, but for a
/// Heartbeat or LeaveGroup on the coordinator's quick connection, returned for the session task
/// to poll (see [`Control`]).
#[must_use]
pub(super) fn send(
    net: &Session,
    t: Transmit,
    park: Park,
    answers: impl FnOnce() -> mpsc::UnboundedSender<Answer>,
) -> Option<ControlRequest> {
    let pool = &net.pool;
    let stripe = net.stripe;
    let join_to = match &t.target {
        Target::Any => None,
        Target::Coordinator {
            broker,
            lane: Lane::Control,
        } => {
            let broker = broker.clone();
            return Some(Box::pin(control(pool.clone(), stripe, broker, t)));
        }
        Target::Coordinator {
            broker,
            lane: Lane::Join,
        } => {
            // The first Heartbeat follows the SyncGroup at once, on the quick connection:
            // opening it now, while the JoinGroup is with the broker, keeps its connect off the
            // acquisition's path.
            let (pool, quick) = (pool.clone(), broker.clone());
            let connect_timeout = pool.conn.connect_timeout;
            tokio::spawn(async move {
                let _ =
                    tokio::time::timeout(connect_timeout, pool.quick(Some(&quick), stripe)).await;
            });
            Some(broker.clone())
        }
    };
    let pool = pool.clone();
    let kept = net.join_lane.clone();
    // A member in force takes an idle lane now, before anything spawned after this call can
    // (`Pool::idle_lane`).
    let ready = match &join_to {
        Some(broker) if park == Park::Urgent => {
            take_join_lane(&kept, broker).or_else(|| pool.idle_lane(broker))
        }
        _ => None,
    };
    let sent = net.sent.clone();
    let answers = answers();
    let gate = match t.request.api_key() {
        ApiKey::JoinGroup => net.join_gate.clone(),
        _ => None,
    };
    tokio::spawn(async move {
        let (id, api) = (t.id, t.request.api_key());
        let result = match join_to {
            Some(broker) => {
                let to = JoinTo {
                    broker,
                    ready,
                    gate,
                };
                match on_join_lane(&pool, &kept, &sent, to, park, t, &answers).await {
                    Some(result) => result,
                    None => return,
                }
            }
            None => to_any_broker(&pool, stripe, t).await,
        };
        if let Err(e) = &result {
            warn!(?api, error = %e, "request failed");
        }
        let _ = answers.send(Box::new((Source::Member, id, result)));
    });
    None
}

/// Where a member request on the join lane goes, and the lane a member in force already
/// claimed for it when it was sent (`send`).
struct JoinTo {
    broker: Broker,
    ready: Option<pool::Lane>,
    /// The ledger topic's check, which a JoinGroup waits for ([`Session::join_gate`]).
    gate: Option<watch::Receiver<bool>>,
}

/// A JoinGroup or SyncGroup (`t`) on the member's join lane to `to.broker`: the lane claimed
/// when it was sent, the lane kept from the join's last step, or one the pool lends. The lane
/// is kept after a JoinGroup, for the step that follows, and given back after a SyncGroup.
/// `None` when the session ended while this waited for a lane: the member it was for is gone,
/// and nobody waits for the answer.
async fn on_join_lane(
    pool: &Arc<Pool>,
    kept: &JoinLane,
    sent: &SentAt,
    to: JoinTo,
    park: Park,
    t: Transmit,
    answers: &mpsc::UnboundedSender<Answer>,
) -> Option<Result<(Response, i16)>> {
    let api = t.request.api_key();
    let version = t.version;
    let request = t.request;
    // The connect and the request together stay within the transmit's timeout plus the connect
    // timeout, so the machine always hears back.
    let bound = t.timeout.saturating_add(pool.conn.connect_timeout);
    let JoinTo {
        broker,
        ready,
        gate,
    } = to;
    let lane = match ready.or_else(|| take_join_lane(kept, &broker)) {
        Some(lane) => Ok(lane),
        // A first join has no lease at stake: it waits its turn for a lane (the semaphore is
        // FIFO) outside the bound, instead of timing out and joining the back of the line
        // again. The acquire's own wait bounds it for the caller. If the session ends meanwhile
        // the wait ends with it: a dead member's place in line would delay the live ones
        // behind it.
        None if park == Park::Fresh => tokio::select! {
            lane = pool.lane(&broker, park) => lane,
            () = answers.closed() => return None,
        },
        None => bounded(bound, pool.lane(&broker, park), || format!("{api:?}")).await,
    };
    match lane {
        // The session ended while this waited: the member it was for is gone.
        Ok(lane) if answers.is_closed() => {
            lane.done();
            None
        }
        Ok(lane) => {
            if let Some(mut gate) = gate {
                // The lane is open (its connect done) while the check is out; the request waits.
                // A check that failed drops the gate with the session.
                // A member that leaves before the check is done never joins: the session then
                // drops the gate, and the JoinGroup is answered as never sent, which lets the
                // leave finish (a member leaving waits for its JoinGroup's answer).
                let open = tokio::select! {
                    r = gate.wait_for(|open| *open) => r.is_ok(),
                    () = answers.closed() => {
                        lane.done();
                        return None;
                    }
                };
                if !open {
                    lane.done();
                    return Some(Err(Error::Closed));
                }
            }
            // Nothing of it can have reached the broker before now, however long it waited
            // for the lane or the check.
            *sent.lock().unwrap_or_else(|p| p.into_inner()) = Some((t.id, now()));
            let exchange = async {
                let response = lane.conn().request_at(request, version, t.timeout).await?;
                if api == ApiKey::SyncGroup {
                    lane.done();
                } else {
                    keep_join_lane(kept, broker, lane);
                }
                Ok((response, version))
            };
            Some(bounded(bound, exchange, || format!("{api:?}")).await)
        }
        Err(e) => Some(Err(e)),
    }
}

/// A member request for any broker (`t`, a FindCoordinator): a lookup that may go out with
/// other locks' in one request when the version allows, else a request of its own on a quick
/// connection. Bounded as on the join lane.
async fn to_any_broker(pool: &Arc<Pool>, stripe: usize, t: Transmit) -> Result<(Response, i16)> {
    let api = t.request.api_key();
    let version = t.version;
    let request = t.request;
    let bound = t.timeout.saturating_add(pool.conn.connect_timeout);
    match batchable(&request, version) {
        Some(group) => {
            let lookup = super::lookup::find_coordinator(pool, &group, t.timeout);
            bounded(bound, lookup, || format!("{api:?}")).await
        }
        None => {
            let route = Route::Quick(None);
            let exchange = exchange(pool, stripe, route, |_| Ok((request, version)), t.timeout);
            bounded(bound, exchange, || format!("{api:?}")).await
        }
    }
}

/// [`send`], with a control request run on a task of its own and answered on `answers` like
/// the others.
#[cfg(test)]
pub(super) fn send_on_task(
    net: &Session,
    t: Transmit,
    park: Park,
    answers: mpsc::UnboundedSender<Answer>,
) {
    if let Some(request) = send(net, t, park, || answers.clone()) {
        tokio::spawn(async move {
            let (id, result) = request.await;
            let _ = answers.send(Box::new((Source::Member, id, result)));
        });
    }
}

/// A Heartbeat or LeaveGroup (`t`) on the quick connection of `stripe` to `broker`, with one
/// timer: it runs until the connection is at hand (within the request's timeout plus the
/// connect timeout, as on any route), then is moved to the request's own timeout from there,
/// never past that first bound.
///
/// Apache may defer the answer to either (see [`held_by_the_broker`]), so the request stays
/// registered with the connection past the broker's own bound while its caller hears of a
/// timeout at the request's: the connection, shared by every lock of the client, is not
/// closed under the requests queued behind it. A retry goes on a fresh connection, in case this
/// one is dead rather than held. The membership judges its lease by its own clock; a timeout
/// here is only an answer that did not come.
fn control(
    pool: Arc<Pool>,
    stripe: usize,
    broker: Broker,
    t: Transmit,
) -> impl Future<Output = (u64, Result<(Response, i16)>)> + Send {
    // An async block, not an async fn: the future then holds the request once, not also the
    // transmit it came in.
    let Transmit {
        id,
        request,
        version,
        timeout,
        ..
    } = t;
    async move {
        let api = request.api_key();
        let bound = timeout.saturating_add(pool.conn.connect_timeout);
        let started = tokio::time::Instant::now();
        let end = started + bound.min(FOREVER);
        // Not polled (so not armed) while the connection is open, as it nearly always is.
        let timer = tokio::time::sleep_until(end);
        tokio::pin!(timer);
        let timed_out = |after| Error::Timeout {
            op: format!("{api:?}"),
            after,
        };
        let conn = match pool.quick_open(Some(&broker), stripe) {
            Some(conn) => Ok(conn),
            // Boxed: opening a connection takes a future of several KB, which every
            // Heartbeat's own future would otherwise carry (and allocate) for nothing.
            None => tokio::select! {
                biased;
                conn = Box::pin(pool.quick(Some(&broker), stripe)) => conn,
                () = &mut timer => Err(timed_out(bound)),
            },
        };
        let result = match conn {
            // The connection asked this broker the same when it opened.
            Ok(conn) if api == ApiKey::ApiVersions => Ok((versions_answer(&conn), version)),
            Ok(conn) => {
                let mut after = bound;
                if let Some(at) = tokio::time::Instant::now().checked_add(timeout) {
                    if at < end {
                        timer.as_mut().reset(at);
                        after = timeout;
                    }
                }
                // Only a request the broker may hold outlives its caller's timeout (the
                // control lane carries no other); any other expires with it and fails the
                // connection.
                let keep = if held_by_the_broker(api) {
                    ledger::parked_timeout(ledger::BROKER_COMMIT_TIMEOUT, timeout)
                } else {
                    timeout
                };
                let asked = tokio::time::Instant::now();
                let result = tokio::select! {
                    biased;
                    response = conn.request_kept(&request, version, keep) => {
                        response.map(|r| (r, version))
                    }
                    () = &mut timer => {
                        pool.retire_quick(Some(&broker), stripe, &conn);
                        Err(timed_out(after))
                    }
                };
                // How long the coordinator held a Heartbeat paces the client's acquisitions
                // (`pool::Admission`); a broken connection says nothing of it. The answer goes
                // on to its member as it is.
                if api == ApiKey::Heartbeat && matches!(result, Ok(_) | Err(Error::Timeout { .. }))
                {
                    pool.heartbeat_answered(asked, timeout);
                }
                result
            }
            Err(e) => Err(e),
        };
        if let Err(e) = &result {
            warn!(?api, error = %e, "request failed");
        }
        (id, result)
    }
}

/// Longer than any deadline that matters (tokio's own "far future"): a timeout configured as
/// [`Duration::MAX`] waits this long instead of overflowing the clock.
const FOREVER: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// The group of a FindCoordinator lookup that may go out with others (KIP-699, v4+).
fn batchable(request: &crate::wire::Request, version: i16) -> Option<String> {
    match request {
        crate::wire::Request::FindCoordinator(r)
            if version >= super::lookup::BATCH_VERSION
                && r.key_type == 0
                && r.coordinator_keys.len() == 1 =>
        {
            r.coordinator_keys.first().map(|k| k.to_string())
        }
        _ => None,
    }
}

/// `exchange`, or a timeout error naming `op` once `bound` has passed.
async fn bounded<T>(
    bound: Duration,
    exchange: impl std::future::Future<Output = Result<T>>,
    op: impl FnOnce() -> String,
) -> Result<T> {
    match tokio::time::timeout(bound, exchange).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout {
            op: op(),
            after: bound,
        }),
    }
}

/// Sends a ledger request, built for the versions the connection it goes out on negotiated.
fn send_ledger(
    pool: &Arc<Pool>,
    stripe: usize,
    t: ledger::Transmit,
    answers: mpsc::UnboundedSender<Answer>,
) {
    let route = match &t.target {
        ledger::Target::Any => Route::Quick(None),
        // The ACQUIRED, RELEASED and LOST appends wait for the replicas (acks=all).
        ledger::Target::Leader {
            broker,
            lane: LeaderLane::Append,
        } => Route::Lane(broker.clone(), Park::Urgent),
        // A waiter's long poll: never in the way of a membership in force.
        ledger::Target::Leader {
            broker,
            lane: LeaderLane::Poll,
        } => Route::Lane(broker.clone(), Park::Fresh),
        // Apache may hold an OffsetCommit for up to `offsets.commit.timeout.ms` while the
        // offsets partition's replicas catch up.
        ledger::Target::Coordinator(broker) => Route::Lane(broker.clone(), Park::Urgent),
    };
    let pool = pool.clone();
    tokio::spawn(async move {
        let op = t.op;
        let result = exchange(
            &pool,
            stripe,
            route,
            |conn| Ok(ledger::build(&op, conn.versions())?),
            t.timeout,
        );
        let bound = t.timeout.saturating_add(pool.conn.connect_timeout);
        let result = bounded(bound, result, || op.name().into()).await;
        if let Err(e) = &result {
            debug!(op = op.name(), error = %e, "ledger request failed");
        }
        let _ = answers.send(Box::new((Source::Ledger, t.id, result)));
    });
}

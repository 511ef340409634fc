//! The one task that runs a [`Membership`], and the lock's [`Ledger`] when it has one: it owns the
//! broker connections and the clock, feeds the machines answers, commands and time, and publishes
//! what they say. With a ledger, the membership's events go through the ledger machine, which
//! holds back the hold until its ACQUIRED record is acknowledged and may ask the membership to
//! heartbeat or leave.
//!
//! Requests are sent from short-lived tasks so that connecting to a broker (which can take the
//! whole connect timeout) never delays the machine's timers: the lease must end on time even when
//! every connection is hanging.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, warn, Instrument};

use super::bootstrap::{connect_any, BootstrapConfig};
use super::conn::{ConnConfig, Connection};
use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::ledger::{
    self, LeaderLane, Ledger, LedgerError, MemberView, Now, LEDGER_MAX_FRAME_SIZE,
};
use crate::membership::{Broker, Command, Event, Lane, Membership, Target, Transmit};
use crate::wire::Response;

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

/// Where the connections go.
struct Net {
    bootstrap: Vec<String>,
    conn: ConnConfig,
    limits: BootstrapConfig,
    retry_backoff: Duration,
    retry_backoff_max: Duration,
    /// Cached connections; a slot is locked while it is being (re)connected so two lanes never
    /// race to open the same one.
    slots: Mutex<HashMap<Slot, Arc<tokio::sync::Mutex<Option<Connection>>>>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Slot {
    Bootstrap,
    Coordinator(Broker, Lane),
    /// The ledger partition's leader, on one of its two lanes.
    Leader(Broker, LeaderLane),
    /// The group coordinator, for the ledger's OffsetCommits: Apache may hold one for up to
    /// `offsets.commit.timeout.ms` while the offsets partition's replicas catch up, and answers
    /// a connection's requests in order, so a commit on the heartbeats' connection would delay
    /// them and, timed out locally, fail them with it.
    Commit(Broker),
}

impl Net {
    async fn connection(&self, slot: &Slot) -> Result<Connection> {
        let cell = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            slots.entry(slot.clone()).or_default().clone()
        };
        let mut guard = cell.lock().await;
        if let Some(c) = guard.as_ref() {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let conn = match slot {
            Slot::Bootstrap => {
                let mut backoff =
                    Backoff::new(self.retry_backoff, self.retry_backoff_max, 2.0, 0.5);
                connect_any(&self.bootstrap, &self.conn, &mut backoff, &self.limits).await?
            }
            Slot::Coordinator(broker, _) | Slot::Commit(broker) => {
                Connection::connect(&format!("{}:{}", broker.host, broker.port), &self.conn).await?
            }
            Slot::Leader(broker, _) => {
                let max = self.conn.max_frame_size.max(LEDGER_MAX_FRAME_SIZE);
                let cfg = self.conn.clone().with_max_frame_size(max);
                Connection::connect(&format!("{}:{}", broker.host, broker.port), &cfg).await?
            }
        };
        *guard = Some(conn.clone());
        Ok(conn)
    }

    fn close_all(&self) {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        for cell in slots.values() {
            if let Ok(g) = cell.try_lock() {
                if let Some(c) = g.as_ref() {
                    c.close();
                }
            }
        }
    }
}

/// What the lock's owner can ask of the session.
#[derive(Debug)]
pub(crate) enum SessionCommand {
    /// A command for the membership machine.
    Member(Command),
    /// Store a checkpoint, fenced (needs a ledger); the outcome goes to `reply`.
    Checkpoint {
        value: String,
        reply: oneshot::Sender<Result<()>>,
    },
}

impl From<Command> for SessionCommand {
    fn from(c: Command) -> Self {
        SessionCommand::Member(c)
    }
}

/// Handle to a running session.
pub(crate) struct SessionHandle {
    pub(crate) commands: mpsc::UnboundedSender<SessionCommand>,
    pub(crate) state: watch::Receiver<SessionState>,
    /// Set once the membership has ended: whether the coordinator confirmed that it has no
    /// member for us any more (see [`Event::Left`]).
    pub(crate) left: watch::Receiver<Option<bool>>,
}

pub(crate) struct SessionParams {
    pub(crate) bootstrap: Vec<String>,
    pub(crate) conn: ConnConfig,
    pub(crate) limits: BootstrapConfig,
    pub(crate) retry_backoff: Duration,
    pub(crate) retry_backoff_max: Duration,
    pub(crate) first: Connection,
    /// The lock's ledger machine, if it has a ledger.
    pub(crate) ledger: Option<Ledger>,
}

/// Where the session task publishes: the hold's state for guards, the end of the membership
/// for leaves, and every event for whoever listens.
struct Outputs {
    state: watch::Sender<SessionState>,
    left: watch::Sender<Option<bool>>,
    events: Option<mpsc::UnboundedSender<Event>>,
}

/// Starts the driver task for `machine`.
pub(crate) fn spawn(
    group: &str,
    machine: Membership,
    params: SessionParams,
    events: Option<mpsc::UnboundedSender<Event>>,
) -> SessionHandle {
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let (state_tx, state_rx) = watch::channel(SessionState::Waiting {
        holder: None,
        generation: -1,
    });
    let net = Arc::new(Net {
        bootstrap: params.bootstrap,
        conn: params.conn,
        limits: params.limits,
        retry_backoff: params.retry_backoff,
        retry_backoff_max: params.retry_backoff_max,
        slots: Mutex::new(HashMap::new()),
    });
    {
        let mut slots = net.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.insert(
            Slot::Bootstrap,
            Arc::new(tokio::sync::Mutex::new(Some(params.first))),
        );
    }
    // The ACQUIRED record is on the acquisition's critical path: its connection is opened now,
    // while the membership joins.
    if let Some(p) = params.ledger.as_ref().and_then(Ledger::partition) {
        let (net, slot) = (
            net.clone(),
            Slot::Leader(p.leader.clone(), LeaderLane::Append),
        );
        tokio::spawn(async move {
            let _ = net.connection(&slot).await;
        });
    }
    let (left_tx, left_rx) = watch::channel(None);
    let span = tracing::info_span!("kafka_lock", group = %group);
    tokio::spawn(
        run(
            machine,
            params.ledger,
            group.to_owned(),
            net,
            cmd_rx,
            Outputs {
                state: state_tx,
                left: left_tx,
                events,
            },
        )
        .instrument(span),
    );
    SessionHandle {
        commands: cmd_tx,
        state: state_rx,
        left: left_rx,
    }
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
    }
}

/// Which machine a request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Member,
    Ledger,
}

type Answer = (Source, u64, Result<(Response, i16)>);

async fn run(
    mut m: Membership,
    mut ledger: Option<Ledger>,
    lock: String,
    net: Arc<Net>,
    mut commands: mpsc::UnboundedReceiver<SessionCommand>,
    outputs: Outputs,
) {
    let Outputs {
        state,
        left,
        events,
    } = outputs;
    let (answers_tx, mut answers) = mpsc::unbounded_channel::<Answer>();
    let mut commands_open = true;
    let mut replies: HashMap<u64, oneshot::Sender<Result<()>>> = HashMap::new();
    let mut next_ticket = 0u64;
    let out = |e: Event| {
        publish(&state, &e);
        if let Event::Left { confirmed } = e {
            left.send_replace(Some(confirmed));
        }
        if let Some(tx) = &events {
            let _ = tx.send(e);
        }
    };
    m.handle_timeout(now());
    loop {
        while let Some(t) = m.poll_transmit() {
            send(&net, t, answers_tx.clone());
        }
        while let Some(e) = m.poll_event() {
            match &mut ledger {
                Some(l) => l.on_membership(e, &view(&m), clock()),
                None => out(e),
            }
        }
        if let Some(l) = &mut ledger {
            while let Some(t) = l.poll_transmit() {
                send_ledger(&net, t, answers_tx.clone());
            }
            while let Some(e) = l.poll_event() {
                out(e);
            }
            while let Some((ticket, result)) = l.poll_checkpoint() {
                if let Some(reply) = replies.remove(&ticket) {
                    let _ = reply.send(result);
                }
            }
            let mut nudged = false;
            while let Some(c) = l.poll_command() {
                m.handle_command(c, now());
                nudged = true;
            }
            if nudged {
                // What the membership did about it is flushed before anything else happens.
                continue;
            }
        }
        // Renewals emit no event; without this the guard would time the lease from the
        // acquisition and report a loss while heartbeats still succeed.
        if let Some(lease) = m.lease_end() {
            state.send_if_modified(|s| match s {
                SessionState::Held(_, l, _) if *l != lease => {
                    *l = lease;
                    true
                }
                _ => false,
            });
        }
        if m.is_done() && ledger.as_ref().is_none_or(Ledger::is_done) {
            break;
        }
        let deadline = earliest(
            m.poll_timeout(),
            ledger.as_ref().and_then(Ledger::poll_timeout),
        )
        .map(tokio::time::Instant::from_std);
        tokio::select! {
            biased;
            // Timers first: an expired lease must be reported before any answer is considered.
            _ = sleep_until(deadline) => {
                m.handle_timeout(now());
                if let Some(l) = &mut ledger {
                    l.handle_timeout(&view(&m), clock());
                }
            }
            cmd = commands.recv(), if commands_open => match cmd {
                Some(SessionCommand::Member(c)) => m.handle_command(c, now()),
                Some(SessionCommand::Checkpoint { value, reply }) => match &mut ledger {
                    Some(l) => {
                        next_ticket += 1;
                        replies.insert(next_ticket, reply);
                        l.checkpoint(next_ticket, value, &view(&m), clock());
                    }
                    None => {
                        let _ = reply.send(Err(LedgerError::NoLedger { lock: lock.clone() }.into()));
                    }
                },
                // Every handle is gone: nobody can use the lock any more, so leave.
                None => {
                    commands_open = false;
                    m.handle_command(Command::Leave, now());
                }
            },
            Some((source, id, result)) = answers.recv() => match (source, &mut ledger) {
                (Source::Member, _) => m.handle_response(id, result.map(|(r, _)| r), now()),
                (Source::Ledger, Some(l)) => l.handle_response(id, result, &view(&m), clock()),
                (Source::Ledger, None) => {}
            },
        }
    }
    // A session that ended without leaving (a fatal error) left nothing confirmed.
    left.send_if_modified(|l| {
        let unset = l.is_none();
        if unset {
            *l = Some(false);
        }
        unset
    });
    net.close_all();
    debug!("session ended");
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

fn publish(state: &watch::Sender<SessionState>, e: &Event) {
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

fn send(net: &Arc<Net>, t: Transmit, answers: mpsc::UnboundedSender<Answer>) {
    if let Target::Coordinator {
        broker,
        lane: Lane::Join,
    } = &t.target
    {
        // The first Heartbeat follows the SyncGroup at once, on the other lane: opening it now,
        // while the JoinGroup is with the broker, keeps its connect off the acquisition's path.
        let (net, control) = (
            net.clone(),
            Slot::Coordinator(broker.clone(), Lane::Control),
        );
        tokio::spawn(async move {
            let _ = tokio::time::timeout(net.conn.connect_timeout, net.connection(&control)).await;
        });
    }
    let net = net.clone();
    tokio::spawn(async move {
        let slot = match &t.target {
            Target::Any => Slot::Bootstrap,
            Target::Coordinator { broker, lane } => Slot::Coordinator(broker.clone(), *lane),
        };
        let api = t.request.api_key();
        let version = t.version;
        let result = async {
            let conn = net.connection(&slot).await?;
            conn.request_at(t.request, version, t.timeout).await
        };
        // The connect and the request together stay within the transmit's timeout plus the
        // connect timeout, so the machine always hears back.
        let bound = t.timeout.saturating_add(net.conn.connect_timeout);
        let result = match tokio::time::timeout(bound, result).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout {
                op: format!("{api:?}"),
                after: bound,
            }),
        };
        if let Err(e) = &result {
            warn!(?api, error = %e, "request failed");
        }
        let _ = answers.send((Source::Member, t.id, result.map(|r| (r, version))));
    });
}

/// Sends a ledger request, built for the versions the connection it goes out on negotiated.
fn send_ledger(net: &Arc<Net>, t: ledger::Transmit, answers: mpsc::UnboundedSender<Answer>) {
    let net = net.clone();
    tokio::spawn(async move {
        let slot = match &t.target {
            ledger::Target::Any => Slot::Bootstrap,
            ledger::Target::Leader { broker, lane } => Slot::Leader(broker.clone(), *lane),
            ledger::Target::Coordinator(broker) => Slot::Commit(broker.clone()),
        };
        let result = async {
            let conn = net.connection(&slot).await?;
            let (request, version) = ledger::build(&t.op, conn.versions())?;
            let response = conn.request_at(request, version, t.timeout).await?;
            Ok((response, version))
        };
        let bound = t.timeout.saturating_add(net.conn.connect_timeout);
        let result = match tokio::time::timeout(bound, result).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout {
                op: t.op.name().into(),
                after: bound,
            }),
        };
        if let Err(e) = &result {
            debug!(op = t.op.name(), error = %e, "ledger request failed");
        }
        let _ = answers.send((Source::Ledger, t.id, result));
    });
}

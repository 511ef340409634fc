//! The one task that runs a [`Membership`]: it owns the broker connections and the clock, feeds
//! the machine answers, commands and time, and publishes what the machine says.
//!
//! Requests are sent from short-lived tasks so that connecting to a broker (which can take the
//! whole connect timeout) never delays the machine's timers: the lease must end on time even when
//! every connection is hanging.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tracing::{debug, warn, Instrument};

use super::bootstrap::{connect_any, BootstrapConfig};
use super::conn::{ConnConfig, Connection};
use crate::backoff::Backoff;
use crate::error::{Error, Result};
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
    /// Holding with this token until `lease_end` unless renewed.
    Held(crate::membership::FencingToken, Instant),
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
            Slot::Coordinator(broker, _) => {
                Connection::connect(&format!("{}:{}", broker.host, broker.port), &self.conn).await?
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

/// Handle to a running session.
pub(crate) struct SessionHandle {
    pub(crate) commands: mpsc::UnboundedSender<Command>,
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
    let (left_tx, left_rx) = watch::channel(None);
    let span = tracing::info_span!("kafka_lock", group = %group);
    tokio::spawn(run(machine, net, cmd_rx, state_tx, left_tx, events).instrument(span));
    SessionHandle {
        commands: cmd_tx,
        state: state_rx,
        left: left_rx,
    }
}

fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

async fn run(
    mut m: Membership,
    net: Arc<Net>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    state: watch::Sender<SessionState>,
    left: watch::Sender<Option<bool>>,
    events: Option<mpsc::UnboundedSender<Event>>,
) {
    let (answers_tx, mut answers) = mpsc::unbounded_channel::<(u64, Result<Response>)>();
    let mut commands_open = true;
    m.handle_timeout(now());
    loop {
        while let Some(t) = m.poll_transmit() {
            send(&net, t, answers_tx.clone());
        }
        while let Some(e) = m.poll_event() {
            publish(&state, &e);
            if let Event::Left { confirmed } = e {
                left.send_replace(Some(confirmed));
            }
            if let Some(tx) = &events {
                let _ = tx.send(e);
            }
        }
        // Renewals emit no event; without this the guard would time the lease from the
        // acquisition and report a loss while heartbeats still succeed.
        if let Some(lease) = m.lease_end() {
            state.send_if_modified(|s| match s {
                SessionState::Held(_, l) if *l != lease => {
                    *l = lease;
                    true
                }
                _ => false,
            });
        }
        if m.is_done() {
            break;
        }
        let deadline = m.poll_timeout().map(tokio::time::Instant::from_std);
        tokio::select! {
            biased;
            // Timers first: an expired lease must be reported before any answer is considered.
            _ = sleep_until(deadline) => m.handle_timeout(now()),
            cmd = commands.recv(), if commands_open => match cmd {
                Some(c) => m.handle_command(c, now()),
                // Every handle is gone: nobody can use the lock any more, so leave.
                None => {
                    commands_open = false;
                    m.handle_command(Command::Leave, now());
                }
            },
            Some((id, result)) = answers.recv() => m.handle_response(id, result, now()),
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

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn publish(state: &watch::Sender<SessionState>, e: &Event) {
    let next = match e {
        Event::Acquired { token, lease_end } => SessionState::Held(token.clone(), *lease_end),
        Event::TokenChanged { token } => match &*state.borrow() {
            SessionState::Held(_, lease) => SessionState::Held(token.clone(), *lease),
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

fn send(net: &Arc<Net>, t: Transmit, answers: mpsc::UnboundedSender<(u64, Result<Response>)>) {
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
        let result = async {
            let conn = net.connection(&slot).await?;
            conn.request_at(t.request, t.version, t.timeout).await
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
        let _ = answers.send((t.id, result));
    });
}

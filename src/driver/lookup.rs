//! FindCoordinator lookups of many groups in one request (KIP-699: v4 carries a list of keys
//! and answers one entry per key).
//!
//! A lookup that finds none in flight goes out at once, alone; lookups queued while one is with
//! the broker go out together in the next request, once it is answered. So a burst of
//! acquisitions through one client costs two or three FindCoordinator requests instead of one
//! per lock, and no lookup ever waits for a timer. Each lock still gets an answer of its own
//! (its key's entry alone, with its own error code), which its membership machine reads exactly
//! as the answer to a request of its own.
//!
//! A bootstrap connection that negotiated no v4 (a broker older than 3.0) gets one request per
//! key, in the same turns.
//!
//! Lookups are striped like the quick connections ([`Pool::stripe`]): each stripe has a
//! bootstrap connection and a line of its own. A batch whose request times out (an overloaded
//! broker) closes its connection and fails every lookup in it; on one connection that was
//! every lock being looked up at the time (a burst of 10,000 acquisitions logged thousands of
//! such failures), on a stripe it is the locks of that stripe, and the other stripes' batches
//! are neither in that request nor queued behind it.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{ApiKey, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::oneshot;

use super::pool::Pool;
use crate::error::{Error, Result};
use crate::wire::coordinator::find_coordinator_request;
use crate::wire::Response;

/// The first FindCoordinator version with a list of keys.
pub(crate) const BATCH_VERSION: i16 = 4;

/// Keys in one request at most: bounds the request and its answer (about 60 bytes per entry
/// plus the group id) well inside the frame limit. Lookups beyond it wait for the next turn.
const MAX_KEYS: usize = 500;

/// The lookups of one client waiting for their turn, by stripe.
#[derive(Default)]
pub(crate) struct Lookups {
    state: Mutex<HashMap<usize, State>>,
}

#[derive(Default)]
struct State {
    /// Whether a task is sending the queued lookups.
    running: bool,
    queued: Vec<Waiter>,
}

struct Waiter {
    key: String,
    timeout: Duration,
    reply: oneshot::Sender<Result<(Response, i16)>>,
}

impl Lookups {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, State>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `group`'s coordinator, asked on the bootstrap connection of its stripe together with the
/// lookups queued with it. The answer is shaped as the answer to a v4 request for `group` alone.
/// `timeout` bounds the request it goes out in (the shortest of its lookups' bounds it).
pub(crate) async fn find_coordinator(
    pool: &Arc<Pool>,
    group: &str,
    timeout: Duration,
) -> Result<(Response, i16)> {
    let (reply, answer) = oneshot::channel();
    let stripe = pool.stripe(group);
    let start = {
        let mut stripes = pool.lookups.lock();
        let state = stripes.entry(stripe).or_default();
        state.queued.push(Waiter {
            key: group.to_owned(),
            timeout,
            reply,
        });
        !std::mem::replace(&mut state.running, true)
    };
    // Sent by a task of its own, so a caller that gives up (its future dropped) never strands
    // the lookups queued behind it.
    if start {
        tokio::spawn(run(Arc::downgrade(pool), stripe));
    }
    answer.await.map_err(|_| Error::Closed)?
}

/// Sends the queued lookups of `stripe`, a batch per turn, until none is left.
async fn run(pool: Weak<Pool>, stripe: usize) {
    let mut turn = Turn {
        pool: pool.clone(),
        stripe,
        given_back: false,
    };
    loop {
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let batch: Vec<Waiter> = {
            let mut stripes = pool.lookups.lock();
            let state = stripes.entry(stripe).or_default();
            // Callers that gave up need no answer.
            state.queued.retain(|w| !w.reply.is_closed());
            if state.queued.is_empty() {
                state.running = false;
                turn.given_back = true;
                return;
            }
            let n = state.queued.len().min(MAX_KEYS);
            state.queued.drain(..n).collect()
        };
        send(&pool, stripe, batch).await;
    }
}

/// The sending task's turn. A task that ends before the queue is empty (dropped with the runtime
/// it ran on while a client outlives it, or a panic) gives the turn back on its way out: else
/// `running` would stay set and every later lookup of the client would queue behind no one.
struct Turn {
    pool: Weak<Pool>,
    stripe: usize,
    given_back: bool,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if !self.given_back {
            if let Some(pool) = self.pool.upgrade() {
                if let Some(state) = pool.lookups.lock().get_mut(&self.stripe) {
                    state.running = false;
                }
            }
        }
    }
}

async fn send(pool: &Arc<Pool>, stripe: usize, batch: Vec<Waiter>) {
    // The shortest: no lookup waits past its own timeout (the connection then closes, as it
    // would under that lookup alone).
    let timeout = batch.iter().map(|w| w.timeout).min().unwrap_or_default();
    let conn = match pool.lookup_conn(stripe).await {
        Ok(c) => c,
        Err(e) => return fail(batch, e),
    };
    let Some(version) = conn.versions().get(ApiKey::FindCoordinator) else {
        return fail(
            batch,
            Error::UnsupportedApi {
                api: crate::api::Api::of(ApiKey::FindCoordinator),
            },
        );
    };
    if version < BATCH_VERSION {
        // One request per key, pipelined on the connection.
        for w in batch {
            let conn = conn.clone();
            tokio::spawn(async move {
                let req = find_coordinator_request(&w.key, version);
                let r = conn.request_at(req, version, w.timeout).await;
                let _ = w.reply.send(r.map(|r| (r, version)));
            });
        }
        return;
    }
    let version = version.min(BATCH_VERSION);
    let mut keys: Vec<StrBytes> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for w in &batch {
        if seen.insert(w.key.as_str()) {
            keys.push(StrBytes::from_string(w.key.clone()));
        }
    }
    let req = FindCoordinatorRequest::default().with_coordinator_keys(keys);
    match conn.request_at(req, version, timeout).await {
        Ok(Response::FindCoordinator(resp)) => answer(batch, resp, version),
        Ok(other) => fail(
            batch,
            Error::Protocol(format!(
                "expected FindCoordinator, got {:?}",
                other.api_key()
            )),
        ),
        Err(e) => fail(batch, e),
    }
}

/// Hands every lookup its key's entry of `resp`, alone.
fn answer(batch: Vec<Waiter>, resp: FindCoordinatorResponse, version: i16) {
    let throttle = resp.throttle_time_ms;
    let mut by_key: HashMap<String, Coordinator> = HashMap::new();
    for c in resp.coordinators {
        by_key.entry(c.key.to_string()).or_insert(c);
    }
    for w in batch {
        let r = match by_key.get(&w.key) {
            Some(c) => Ok((
                Response::FindCoordinator(
                    FindCoordinatorResponse::default()
                        .with_throttle_time_ms(throttle)
                        .with_coordinators(vec![c.clone()]),
                ),
                version,
            )),
            None => Err(Error::Protocol(format!(
                "FindCoordinator answered no entry for group {:?}",
                w.key
            ))),
        };
        let _ = w.reply.send(r);
    }
}

/// Tells every lookup of `batch` that its request failed for `e`: the first gets `e` itself.
fn fail(batch: Vec<Waiter>, e: Error) {
    let mut batch = batch.into_iter();
    let Some(first) = batch.next() else {
        return;
    };
    let e = Arc::new(e);
    for w in batch {
        let _ = w.reply.send(Err(copy(&e)));
    }
    let e = Arc::try_unwrap(e).unwrap_or_else(|e| copy(&e));
    let _ = first.reply.send(Err(e));
}

/// An error like `e` for one more lookup (errors are not `Clone`): the transport failures every
/// lookup reacts to in the same way keep their kind.
fn copy(e: &Arc<Error>) -> Error {
    match &**e {
        Error::Closed => Error::Closed,
        Error::Timeout { op, after } => Error::Timeout {
            op: op.clone(),
            after: *after,
        },
        Error::Io { op, source } => Error::Io {
            op,
            source: io::Error::new(source.kind(), source.to_string()),
        },
        Error::UnsupportedApi { api } => Error::UnsupportedApi { api: *api },
        _ => Error::Poisoned(Arc::clone(e)),
    }
}

/// The topic whose partition count places a group at its coordinator.
const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// `__consumer_offsets`' partitions as a Metadata request on `conn` tells them: `Some` with the
/// count and each partition's leader when the broker names them, `Some(default)` with no leaders
/// when it refuses to describe the topic (no DESCRIBE ACL on it: that answer will not change),
/// `None` when the topic does not exist yet (Apache creates it at the first FindCoordinator) or
/// the request failed: ask again later.
pub(crate) async fn offsets_partitions(
    conn: &super::conn::Connection,
    timeout: Duration,
    default: u32,
) -> Option<(u32, Vec<(u32, i32)>)> {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{MetadataRequest, TopicName};
    let mut t = MetadataRequestTopic::default();
    t.name = Some(TopicName(StrBytes::from_static_str(OFFSETS_TOPIC)));
    let mut req = MetadataRequest::default();
    req.topics = Some(vec![t]);
    if conn.versions().get(ApiKey::Metadata).unwrap_or(0) >= 4 {
        req.allow_auto_topic_creation = false;
    }
    let resp = match conn.request_with_timeout(req, timeout).await {
        Ok(Response::Metadata(r)) => r,
        Ok(_) | Err(_) => return None,
    };
    let topic = resp
        .topics
        .iter()
        .find(|t| t.name.as_ref().map(|n| n.0.as_str()) == Some(OFFSETS_TOPIC))?;
    match topic.error_code {
        0 => {
            let n = u32::try_from(topic.partitions.len())
                .ok()
                .filter(|&n| n > 0)?;
            let leaders = topic
                .partitions
                .iter()
                .filter_map(|p| Some((u32::try_from(p.partition_index).ok()?, p.leader_id.0)))
                .collect();
            Some((n, leaders))
        }
        // TOPIC_AUTHORIZATION_FAILED
        29 => Some((default, Vec::new())),
        _ => None,
    }
}

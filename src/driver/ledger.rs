//! The ledger's one-shot reads, outside any lock session: the topic check before a session
//! starts, the whole history of a lock, and the committed checkpoint. Each is a short sequence of
//! requests on a [`Reach`]'s connections (a client's, shared with its locks, or a pool of the
//! read's own); the sans-I/O parts (building requests, reading answers, folding the history)
//! are in [`crate::ledger`].

use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, warn};

use super::conn::Connection;
use super::pool::{Lane, Park, Pool};
use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::ledger::{self, fold, Compression, History, LedgerError, Op, Partition};
use crate::membership::Broker;
use crate::wire::coordinator::found_coordinator;
use crate::wire::log::{
    fetched, listed, FetchOptions, Fetched, Isolation, LogError, OffsetSpec, TopicPartition,
};
use crate::wire::records::BatchError;
use crate::wire::Response;
use kafka_protocol::messages::ApiKey;

/// How often a read starts again after the leader moved or the coordinator was not ready.
const ATTEMPTS: u32 = 5;
/// Record bytes per Fetch when reading a history: well inside the 1 MiB frame limit.
const READ_BYTES: i32 = 512 * 1024;

/// The connections a read outside any membership (history, checkpoints, a description, an
/// observer) goes through, and its timeouts.
///
/// The pool is the client's when the lock was made from one: such reads then share its
/// connections with its locks, on the same terms as the locks' own requests. What the broker
/// answers at once (Metadata, FindCoordinator, DescribeGroups, ListOffsets, OffsetFetch,
/// DescribeConfigs) goes on a quick connection; a Fetch of the ledger, whose answer is large or
/// parked, takes a parking lane for that one request, so it never sits in front of a
/// Heartbeat. Without a client the pool is the read's own, and its connections close with it.
#[derive(Clone)]
pub(crate) struct Reach {
    pub(crate) pool: Arc<Pool>,
    /// Whether `pool` belongs to this read alone (closed by [`Reach::close`]).
    pub(crate) own: bool,
    pub(crate) request_timeout: Duration,
    pub(crate) retry_backoff: Duration,
    pub(crate) retry_backoff_max: Duration,
}

impl Reach {
    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::new(self.retry_backoff, self.retry_backoff_max, 2.0, 0.5)
    }

    /// The quick connection to a bootstrap broker.
    pub(crate) async fn bootstrap(&self) -> Result<Connection> {
        self.pool.quick(None, 0).await
    }

    /// The quick connection to `broker` that `group`'s requests take.
    pub(crate) async fn quick(&self, broker: &Broker, group: &str) -> Result<Connection> {
        if self.pool.offsets_partitions_unknown() {
            let first = self.bootstrap().await?;
            self.pool.learn_offsets_partitions(&first).await;
        }
        self.pool.quick(Some(broker), self.pool.stripe(group)).await
    }

    /// Sends `req` at `version` on `conn`, `group`'s quick connection to `broker`, which the
    /// client's locks share. Apache answers a connection's requests one at a time, in order
    /// (SocketServer's Processor mutes the channel from a request's receipt until its response
    /// is sent), and may hold a lock's Heartbeat or LeaveGroup on it for up to
    /// `offsets.commit.timeout.ms` (GroupCoordinatorService `heartbeat`, `leaveGroup`:
    /// `scheduleWriteOperation`), so a read behind one can wait past its own timeout. As for
    /// those requests (`session::exchange`), the caller hears of the timeout at
    /// `request_timeout`, but the request stays registered until past the broker's bound and
    /// later requests take a fresh connection: the timeout never closes the connection under
    /// the Heartbeats queued on it.
    pub(crate) async fn ask(
        &self,
        broker: &Broker,
        group: &str,
        conn: &Connection,
        req: crate::wire::Request,
        version: i16,
    ) -> Result<Response> {
        self.ask_within(broker, group, conn, req, version, self.request_timeout)
            .await
    }

    /// [`Reach::ask`] for a request the broker may hold up to its commit timeout and then
    /// answers itself (an OffsetFetch with `require_stable`): waited for past that bound, so
    /// the broker's own REQUEST_TIMED_OUT arrives before the connection is given up.
    pub(crate) async fn ask_broker_bounded(
        &self,
        broker: &Broker,
        group: &str,
        conn: &Connection,
        req: crate::wire::Request,
        version: i16,
    ) -> Result<Response> {
        let within = ledger::parked_timeout(ledger::BROKER_COMMIT_TIMEOUT, self.request_timeout);
        self.ask_within(broker, group, conn, req, version, within)
            .await
    }

    async fn ask_within(
        &self,
        broker: &Broker,
        group: &str,
        conn: &Connection,
        req: crate::wire::Request,
        version: i16,
        within: Duration,
    ) -> Result<Response> {
        let api = req.api_key();
        let keep = ledger::parked_timeout(ledger::BROKER_COMMIT_TIMEOUT, self.request_timeout);
        match tokio::time::timeout(within, conn.request_at(req, version, keep)).await {
            Ok(r) => r,
            Err(_) => {
                self.pool
                    .retire_quick(Some(broker), self.pool.stripe(group), conn);
                Err(Error::Timeout {
                    op: format!("{api:?}"),
                    after: within,
                })
            }
        }
    }

    /// A parking lane to `broker` for one request that may be parked or answered at length.
    /// Waits its turn like a first join: a read has no lease at stake.
    pub(crate) async fn lane(&self, broker: &Broker) -> Result<Lane> {
        self.pool.lane(broker, Park::Fresh).await
    }

    /// Closes the connections if they are this read's own; a client's stay for its locks.
    pub(crate) fn close(&self) {
        if self.own {
            self.pool.close_all();
        }
    }
}

async fn call(conn: &Connection, op: &Op, timeout: Duration) -> Result<(Response, i16)> {
    let (req, v) = ledger::build(op, conn.versions())?;
    let resp = conn.request_at(req, v, timeout).await?;
    Ok((resp, v))
}

/// Metadata for the ledger topic: it must exist and have exactly one partition. `Ok(None)`: it
/// does, but the partition has no leader right now.
pub(crate) async fn check_ledger_topic(
    conn: &Connection,
    topic: &str,
    timeout: Duration,
) -> Result<Option<Partition>> {
    for api in [ApiKey::Produce, ApiKey::Fetch, ApiKey::ListOffsets] {
        if conn.versions().get(api).is_none() {
            return Err(LedgerError::Unsupported {
                api: crate::api::Api::of(api),
            }
            .into());
        }
    }
    let op = Op::Metadata {
        topic: topic.to_owned(),
    };
    let partition = match call(conn, &op, timeout).await? {
        (Response::Metadata(r), _) => ledger::ledger_partition(&r, topic)?,
        (other, _) => {
            return Err(Error::Protocol(format!(
                "expected Metadata, got {:?}",
                other.api_key()
            )))
        }
    };
    check_compression(conn, topic, timeout).await?;
    Ok(partition)
}

/// Refuses a ledger topic whose `compression.type` makes the broker recompress kafka-lock's
/// records ([`LedgerError::Compressed`]). When the setting cannot be known (no DescribeConfigs
/// on the broker, or no DescribeConfigs ACL on the topic) the check warns and lets the ledger run.
async fn check_compression(conn: &Connection, topic: &str, timeout: Duration) -> Result<()> {
    let Some(v) = conn.versions().get(ApiKey::DescribeConfigs) else {
        debug!(
            topic,
            "the broker has no DescribeConfigs; the ledger's compression.type is not checked"
        );
        return Ok(());
    };
    let resp = conn
        .request_at(ledger::compression_request(topic), v, timeout)
        .await?;
    let Response::DescribeConfigs(r) = resp else {
        return Err(Error::Protocol(format!(
            "expected DescribeConfigs, got {:?}",
            resp.api_key()
        )));
    };
    match ledger::ledger_compression(&r, topic)? {
        Compression::Kept => {}
        Compression::NotAuthorized => warn!(
            topic,
            "not allowed to describe the ledger topic's configs (grant DescribeConfigs on the \
             topic); its compression.type is not checked, and anything but producer or \
             uncompressed would make the ledger's records unreadable"
        ),
        Compression::Unknown(why) => warn!(
            topic,
            why = %why,
            "the ledger topic's compression.type is unknown; anything but producer or \
             uncompressed would make the ledger's records unreadable"
        ),
    }
    Ok(())
}

/// The ledger partition's leader, asked of `first` until it names one.
async fn find_leader(first: &Connection, reach: &Reach, topic: &str) -> Result<Partition> {
    let mut backoff = reach.backoff();
    for _ in 0..ATTEMPTS {
        if let Some(p) = check_ledger_topic(first, topic, reach.request_timeout).await? {
            return Ok(p);
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
    Err(Error::Broker {
        api: crate::api::Api::of(ApiKey::Metadata),
        code: crate::KafkaCode(5),
        message: Some(format!("the ledger topic {topic:?} has no leader")),
    })
}

fn log_err(api: ApiKey, e: LogError) -> Error {
    match e {
        LogError::Broker { code, message, .. } => Error::Broker {
            api: crate::api::Api::of(api),
            code,
            message,
        },
        other => Error::Protocol(other.to_string()),
    }
}

/// Offsets read at first when looking for the last checkpoint from the ledger's end; each
/// further window back is twice as long.
const TAIL_WINDOW: i64 = 2048;
/// The most offsets read from the ledger's end when looking for the last checkpoint: about
/// 3 MiB of ledger records (~100 bytes each), whatever the partition's length.
pub(crate) const TAIL_MAX_OFFSETS: i64 = 32 * 1024;

/// How much of the ledger a read covers.
#[derive(Debug, Clone, Copy)]
enum Span {
    /// All that is retained.
    Whole,
    /// From the end backwards, in growing windows, until what was read shows the lock's last
    /// checkpoint ([`ledger::tail_settles_checkpoint`]), the start is reached, or `max` offsets
    /// were read.
    CheckpointTail { max: i64 },
}

/// Reads `lock`'s records from the whole retained ledger and folds them into its history.
pub(crate) async fn read_history(reach: &Reach, lock: &str, topic: &str) -> Result<History> {
    read_ledger(reach, lock, topic, Span::Whole, None, None).await
}

/// Reads `lock`'s records from the ledger's end backwards until its last checkpoint is settled
/// (one is found and every offset above its hold's token is read), at most `max` offsets: a
/// history of that tail ([`History::first_offset`] tells where it begins). A checkpoint older
/// than that is not found; the whole history is. `known`: the partition as a lock session last
/// found it, read first without a lookup.
/// `ends`: the partition and its first and next offsets, read a moment ago
/// ([`ledger_ends`]), used for the first try instead of asking again.
pub(crate) async fn read_checkpoint_tail(
    reach: &Reach,
    lock: &str,
    topic: &str,
    max: i64,
    known: Option<Partition>,
    ends: Option<Ends>,
) -> Result<History> {
    read_ledger(
        reach,
        lock,
        topic,
        Span::CheckpointTail { max },
        known,
        ends,
    )
    .await
}

/// The ledger partition as found, and its log start and end offsets (ListOffsets earliest and
/// latest, read committed).
pub(crate) type Ends = (Partition, i64, i64);

/// The ledger partition's ends, read once (no retry: a caller that needs them reads again
/// through [`read_checkpoint_tail`]). `known`: the partition as a lock session last found it.
pub(crate) async fn ledger_ends(
    reach: &Reach,
    lock: &str,
    topic: &str,
    known: Option<Partition>,
) -> Result<Ends> {
    let p = match known {
        Some(p) => p,
        None => {
            let first = reach.bootstrap().await?;
            find_leader(&first, reach, topic).await?
        }
    };
    let conn = reach.quick(&p.leader, lock).await?;
    let tp = TopicPartition::new(topic, 0).with_topic_id(p.topic_id);
    let offset_of = |spec| {
        let op = Op::ListOffsets {
            tp: tp.clone(),
            spec,
        };
        let conn = conn.clone();
        let tp = tp.clone();
        let leader = &p.leader;
        async move {
            let (req, v) = ledger::build(&op, conn.versions())?;
            match (reach.ask(leader, lock, &conn, req, v).await?, v) {
                (Response::ListOffsets(r), _) => {
                    listed(&r, &tp).map_err(|e| log_err(ApiKey::ListOffsets, e))
                }
                (other, _) => Err(Error::Protocol(format!(
                    "expected ListOffsets, got {:?}",
                    other.api_key()
                ))),
            }
        }
    };
    // Both on the connection at once: the broker answers them in order, one round trip.
    let (start, end) = tokio::try_join!(
        offset_of(OffsetSpec::Earliest),
        offset_of(OffsetSpec::Latest)
    )?;
    Ok((p, start, end))
}

async fn read_ledger(
    reach: &Reach,
    lock: &str,
    topic: &str,
    span: Span,
    mut known: Option<Partition>,
    mut ends: Option<Ends>,
) -> Result<History> {
    let mut backoff = reach.backoff();
    let mut attempt = 0;
    loop {
        attempt += 1;
        // A partition known from before is tried once; after a failure the leader is looked up.
        match read_history_once(reach, lock, topic, span, known.take(), ends.take()).await {
            Ok(h) => return Ok(h),
            // The leader moved or a connection broke: look it up again and start over.
            Err(e) if e.is_retriable() && attempt < ATTEMPTS => {
                debug!(%lock, error = %e, "reading the ledger failed; starting over");
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn read_history_once(
    reach: &Reach,
    lock: &str,
    topic: &str,
    span: Span,
    known: Option<Partition>,
    ends: Option<Ends>,
) -> Result<History> {
    let (p, start, end) = match ends {
        Some(ends) => ends,
        None => ledger_ends(reach, lock, topic, known).await?,
    };
    let tp = TopicPartition::new(topic, 0).with_topic_id(p.topic_id);
    let timeout = reach.request_timeout;
    let floor = match span {
        Span::Whole => start,
        Span::CheckpointTail { max } => start.max(end.saturating_sub(max.max(0))),
    };
    if floor >= end {
        // Nothing to read: no lane, no Fetch.
        return Ok(folded(&[], Vec::new(), start, end));
    }
    // The Fetches carry up to READ_BYTES each: on a lane of their own, so no Heartbeat of the
    // client's locks waits behind the transfer.
    let lane = reach.lane(&p.leader).await?;
    let fetch = lane.conn();
    let key = lock.as_bytes();
    let history = match span {
        Span::Whole => {
            let (values, unreadable) = read_range(fetch, &tp, key, start, end, timeout).await?;
            folded(&values, unreadable, start, end)
        }
        Span::CheckpointTail { .. } => {
            let mut values = Vec::new();
            let mut unreadable = Vec::new();
            let mut lo = end;
            let mut window = TAIL_WINDOW;
            loop {
                let hi = lo;
                lo = hi.saturating_sub(window).max(floor);
                let (mut v, mut u) = read_range(fetch, &tp, key, lo, hi, timeout).await?;
                v.append(&mut values);
                values = v;
                u.append(&mut unreadable);
                unreadable = u;
                let h = folded(&values, unreadable.clone(), lo, end);
                // A closed connection: a batch too large to read ended the read (noted in `h`).
                let settled = ledger::tail_settles_checkpoint(&h);
                if settled || lo <= floor || fetch.is_closed() {
                    if !settled && floor > start {
                        match h.last_checkpoint() {
                            None => warn!(%lock, %topic, from = floor, to = end,
                                "no checkpoint of this lock among the ledger's last records; \
                                 older ones were not read (`kafka-lock history` reads them all)"),
                            Some((_, hold, _)) => warn!(%lock, %topic, from = floor, to = end,
                                hold, "the last checkpoint found among the ledger's last records \
                                 is of a hold that began before them; a later hold's checkpoint \
                                 could lie before them (`kafka-lock history` reads them all)"),
                        }
                    }
                    break h;
                }
                window = window.saturating_mul(2);
            }
        }
    };
    lane.done();
    Ok(history)
}

fn folded(
    values: &[(i64, Option<bytes::Bytes>)],
    unreadable: Vec<ledger::Unreadable>,
    start: i64,
    end: i64,
) -> History {
    let mut h = fold(values.iter().map(|(o, v)| (*o, v.as_deref())), start, end);
    h.unreadable.extend(unreadable);
    h.unreadable.sort_by_key(|u| u.offset);
    h
}

/// The values of `key`'s records in `[from, to)`, and what could not be read there.
async fn read_range(
    conn: &Connection,
    tp: &TopicPartition,
    key: &[u8],
    from: i64,
    to: i64,
    timeout: Duration,
) -> Result<(Vec<(i64, Option<bytes::Bytes>)>, Vec<ledger::Unreadable>)> {
    let mut range = Range {
        key,
        to,
        values: Vec::new(),
        unreadable: Vec::new(),
    };
    let mut at = from;
    while at < to {
        match fetch_at(conn, tp, at, timeout).await? {
            Ok(f) => match range.take(&f, at) {
                Some(next) => at = next,
                None => break,
            },
            Err(end) => {
                range.unreadable.push(end);
                break;
            }
        }
    }
    Ok((range.values, range.unreadable))
}

/// One Fetch from `at`; `Ok(Err(_))` when the read must end there, saying why.
async fn fetch_at(
    conn: &Connection,
    tp: &TopicPartition,
    at: i64,
    timeout: Duration,
) -> Result<std::result::Result<Fetched, ledger::Unreadable>> {
    let op = Op::Fetch {
        tp: tp.clone(),
        offset: at,
        options: FetchOptions {
            max_wait: Duration::ZERO,
            min_bytes: 1,
            max_bytes: READ_BYTES,
            isolation: Isolation::ReadCommitted,
        },
    };
    let answer = match call(conn, &op, timeout).await {
        // A first batch larger than any frame accepted (KIP-74 sends it whole): every Fetch
        // from here fails alike and the connection is gone, so the read ends here, saying so.
        Err(Error::Poisoned(cause)) if matches!(*cause, Error::Frame(_)) => {
            return Ok(Err(ledger::Unreadable {
                offset: at,
                error: format!(
                    "a batch too large to read ({cause}); the ledger from here on was not \
                     read (cap the topic's max.message.bytes)"
                ),
            }));
        }
        other => other?,
    };
    match answer {
        (Response::Fetch(r), v) => Ok(Ok(
            fetched(&r, tp, v).map_err(|e| log_err(ApiKey::Fetch, e))?
        )),
        (other, _) => Err(Error::Protocol(format!(
            "expected Fetch, got {:?}",
            other.api_key()
        ))),
    }
}

/// What [`read_range`] has found so far of `key`'s records below `to`.
struct Range<'a> {
    key: &'a [u8],
    to: i64,
    values: Vec<(i64, Option<bytes::Bytes>)>,
    unreadable: Vec<ledger::Unreadable>,
}

impl Range<'_> {
    /// Takes what the Fetch from `at` answered; gives the offset to fetch from next, or `None`
    /// when the rest cannot be read.
    fn take(&mut self, f: &Fetched, at: i64) -> Option<i64> {
        let mut batches = f.batches();
        let mut next = at;
        for batch in batches.by_ref() {
            match batch {
                Ok(b) => {
                    for r in b.records {
                        if r.offset >= at
                            && r.offset < self.to
                            && r.key.as_deref() == Some(self.key)
                        {
                            self.values.push((r.offset, r.value));
                        }
                    }
                }
                Err(BatchError::Compressed { base_offset, .. }) => {
                    self.unreadable.push(ledger::Unreadable {
                        offset: base_offset,
                        error: "a compressed batch (the topic's compression.type must be \
                                producer or uncompressed for kafka-lock to read it)"
                            .into(),
                    });
                }
                Err(e) => {
                    // Only this batch is skipped (`resume_offset`); a length that cannot be
                    // read leaves no way to the next one, so the read goes on from the end.
                    let offset = batch_offset(&e).unwrap_or(at);
                    if matches!(e, BatchError::BadLength { .. }) {
                        next = next.max(f.high_watermark.min(self.to));
                    }
                    self.unreadable.push(ledger::Unreadable {
                        offset,
                        error: e.to_string(),
                    });
                }
            }
        }
        if let Some(n) = batches.resume_offset() {
            next = next.max(n);
        }
        if next > at {
            return Some(next);
        }
        // Nothing readable here: a gap left by aborted transactions, or a first batch cut at
        // the size limit (a broker older than KIP-74 does not send it whole).
        match (batches.truncated(), batches.truncated_end()) {
            (Some(t), Some(past)) if past > at => {
                self.unreadable.push(ledger::Unreadable {
                    offset: at,
                    error: format!(
                        "a batch larger than {READ_BYTES} bytes ({:?} needed); it is skipped",
                        t.needed
                    ),
                });
                Some(past)
            }
            (Some(t), _) => {
                self.unreadable.push(ledger::Unreadable {
                    offset: at,
                    error: format!(
                        "a batch larger than {READ_BYTES} bytes ({:?} needed); the rest of \
                         the ledger from here was not read",
                        t.needed
                    ),
                });
                None
            }
            (None, _) => None,
        }
    }
}

fn batch_offset(e: &BatchError) -> Option<i64> {
    match e {
        BatchError::UnsupportedMagic { base_offset, .. }
        | BatchError::CrcMismatch { base_offset, .. }
        | BatchError::Compressed { base_offset, .. }
        | BatchError::Malformed { base_offset, .. } => Some(*base_offset),
        _ => None,
    }
}

/// The group coordinator of `group`, asked on the bootstrap connection (together with the
/// other lookups of the pool queued at the same time).
pub(crate) async fn coordinator(group: &str, reach: &Reach) -> Result<Broker> {
    let mut backoff = reach.backoff();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let r = match super::lookup::find_coordinator(&reach.pool, group, reach.request_timeout)
            .await?
        {
            (Response::FindCoordinator(r), _) => r,
            (other, _) => {
                return Err(Error::Protocol(format!(
                    "expected FindCoordinator, got {:?}",
                    other.api_key()
                )))
            }
        };
        match found_coordinator(&r) {
            Ok(c) => {
                return Ok(Broker {
                    node_id: c.node_id,
                    host: c.host,
                    port: i32::from(c.port),
                })
            }
            Err(e) if e.is_retriable() && attempt < ATTEMPTS => {
                tokio::time::sleep(backoff.next_delay()).await
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// What `lock`'s group has committed for the ledger partition: `(the committing hold's token,
/// the checkpoint)`, or `None` (never committed, or the group is gone). `known`: the
/// coordinator as a lock session last found it, asked first without a lookup.
///
/// The OffsetFetch sets `require_stable` (from v7, [`ledger::offset_fetch_request`]): Apache
/// serves it as a write without records (GroupCoordinatorService `fetchOffsets`:
/// `scheduleWriteOperation`), which reads every offset written to the group's partition and is
/// answered once the last of them is committed. An OffsetCommit is answered only once its write
/// is committed (`commitOffsets`: `scheduleWriteOperation`), so an OffsetFetch sent after a
/// commit was acknowledged reads it or a later one, whichever connection carries it, and also
/// on a coordinator that has just taken over, whose last committed offset (its own high
/// watermark) can lag the old leader's. The broker bounds the wait itself
/// (`offsets.commit.timeout.ms`), so the request is waited for past that bound. It may sit in
/// front of other groups' Heartbeats on the stripe's quick connection only as long as a
/// Heartbeat of its own group, which Apache defers behind the same partition's writes.
pub(crate) async fn read_committed(
    reach: &Reach,
    lock: &str,
    topic: &str,
    mut known: Option<Broker>,
) -> Result<Option<(i64, String)>> {
    let mut backoff = reach.backoff();
    let mut attempt = 0;
    loop {
        attempt += 1;
        // A coordinator known from before is asked once; after a failure it is looked up.
        let at = match known.take() {
            Some(b) => b,
            None => coordinator(lock, reach).await?,
        };
        let conn = reach.quick(&at, lock).await?;
        let (req, v) = ledger::offset_fetch_request(lock, topic, conn.versions())?;
        let answer = reach.ask_broker_bounded(&at, lock, &conn, req, v).await;
        match answer.and_then(|r| Ok(ledger::offset_fetched(&r, topic)?)) {
            Ok(found) => return Ok(found),
            // NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS...: ask again.
            Err(e) if e.is_retriable() && attempt < ATTEMPTS => {
                tokio::time::sleep(backoff.next_delay()).await
            }
            Err(e) => return Err(e),
        }
    }
}

/// Follows the ledger from its end with parked Fetches and hands back `lock`'s records as they
/// are appended: the ledger observers' push. Keeps one connection to the partition's leader;
/// after an error it starts over from a fresh lookup, where it left off.
pub(crate) struct LedgerTail {
    reach: Reach,
    lock: String,
    topic: String,
    /// The partition as last looked up; `None` after an error, to look it up again.
    at: Option<Partition>,
    /// The next offset to read; `None` until the first ListOffsets.
    next: Option<i64>,
}

impl LedgerTail {
    /// A tail that starts at `from` (the end of a history just read), or at the end.
    pub(crate) fn new(reach: Reach, lock: &str, topic: &str, from: Option<i64>) -> Self {
        LedgerTail {
            reach,
            lock: lock.to_owned(),
            topic: topic.to_owned(),
            at: None,
            next: from,
        }
    }

    /// One parked Fetch of at most `wait`: `lock`'s records appended since the last call, in
    /// offset order, each decoded or with the reason it could not be.
    pub(crate) async fn poll(
        &mut self,
        wait: Duration,
    ) -> Result<Vec<(i64, std::result::Result<ledger::LedgerRecord, String>)>> {
        let result = self.poll_once(wait).await;
        if result.is_err() {
            self.at = None;
        }
        result
    }

    async fn poll_once(
        &mut self,
        wait: Duration,
    ) -> Result<Vec<(i64, std::result::Result<ledger::LedgerRecord, String>)>> {
        if self.at.is_none() {
            let first = self.reach.bootstrap().await?;
            self.at = Some(find_leader(&first, &self.reach, &self.topic).await?);
        }
        let Some(p) = &self.at else {
            return Ok(Vec::new());
        };
        let tp = TopicPartition::new(&self.topic, 0).with_topic_id(p.topic_id);
        let timeout = self.reach.request_timeout;
        let from = match self.next {
            Some(n) => n,
            None => {
                let conn = &self.reach.quick(&p.leader, &self.lock).await?;
                let op = Op::ListOffsets {
                    tp: tp.clone(),
                    spec: OffsetSpec::Latest,
                };
                let (req, v) = ledger::build(&op, conn.versions())?;
                let end = match (
                    self.reach.ask(&p.leader, &self.lock, conn, req, v).await?,
                    v,
                ) {
                    (Response::ListOffsets(r), _) => {
                        listed(&r, &tp).map_err(|e| log_err(ApiKey::ListOffsets, e))?
                    }
                    (other, _) => {
                        return Err(Error::Protocol(format!(
                            "expected ListOffsets, got {:?}",
                            other.api_key()
                        )))
                    }
                };
                self.next = Some(end);
                end
            }
        };
        let op = Op::Fetch {
            tp: tp.clone(),
            offset: from,
            options: FetchOptions {
                max_wait: wait,
                min_bytes: 1,
                max_bytes: READ_BYTES,
                isolation: Isolation::ReadCommitted,
            },
        };
        // Parked by the broker for up to `wait`: a lane of its own for this one request, never
        // a connection a Heartbeat takes.
        let lane = self.reach.lane(&p.leader).await?;
        let answer = call(lane.conn(), &op, timeout + wait).await?;
        lane.done();
        let f = match answer {
            (Response::Fetch(r), v) => fetched(&r, &tp, v).map_err(|e| match e {
                // The retained log moved past us: go on from its end.
                LogError::Broker { code, .. } if code.0 == 1 => {
                    self.next = None;
                    log_err(ApiKey::Fetch, e)
                }
                e => log_err(ApiKey::Fetch, e),
            })?,
            (other, _) => {
                return Err(Error::Protocol(format!(
                    "expected Fetch, got {:?}",
                    other.api_key()
                )))
            }
        };
        let key = self.lock.as_bytes();
        let mut out = Vec::new();
        let mut next = from;
        let mut batches = f.batches();
        for batch in batches.by_ref() {
            match batch {
                Ok(b) => {
                    for r in b.records {
                        if r.offset >= from && r.key.as_deref() == Some(key) {
                            let decoded = match r.value.as_deref() {
                                Some(v) => {
                                    ledger::LedgerRecord::decode(v).map_err(|e| e.to_string())
                                }
                                None => Err("a record without a value".to_owned()),
                            };
                            out.push((r.offset, decoded));
                        }
                    }
                }
                Err(BatchError::Compressed { last_offset, .. }) => {
                    next = next.max(last_offset.saturating_add(1))
                }
                // What cannot be read cannot be followed: go on from the end.
                Err(_) => next = next.max(f.high_watermark),
            }
        }
        if let Some(n) = batches.next_offset() {
            next = next.max(n);
        }
        self.next = Some(next);
        Ok(out)
    }
}

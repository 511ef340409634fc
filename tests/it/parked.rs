//! Requests Apache Kafka may hold before answering, on a scripted broker that holds them as
//! Apache does (its socket server answers a connection's requests one at a time, in order): a
//! held request must never sit in front of a heartbeat, and its local timeout must outlast the
//! broker's own bound, so the broker's answer arrives instead of a closed connection.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use kafka_lock::LockOptions;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    ApiKey, BrokerId, HeartbeatResponse, LeaveGroupResponse, MetadataResponse,
    OffsetCommitResponse, ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::fake_broker::{self, encode};

const LEDGER: &str = "ledger";
const MEMBER: &str = "m-1";
/// Bound on anything the test waits for; reached only when it fails.
const BOUND: Duration = Duration::from_secs(60);
/// How long the scripted coordinator holds the first OffsetCommit before answering
/// REQUEST_TIMED_OUT, as Apache does while the offsets partition's replicas catch up (at most
/// `offsets.commit.timeout.ms`, 5 s by default): longer than the request timeout below.
const HELD: Duration = Duration::from_secs(4);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// What the scripted broker received: when, on which connection, what.
type Log = Arc<Mutex<Vec<(Instant, usize, ApiKey)>>>;

fn script(addr: Arc<OnceLock<std::net::SocketAddr>>, log: Log) -> Arc<fake_broker::ParkingScript> {
    let produced = Arc::new(Mutex::new(0i64));
    Arc::new(move |conn, api, version, body: &mut BytesMut| {
        let commits = {
            let mut log = log.lock().unwrap();
            log.push((Instant::now(), conn, api));
            log.iter().filter(|e| e.2 == ApiKey::OffsetCommit).count()
        };
        let at_once = |b: BytesMut| Some((b, Duration::ZERO));
        match api {
            ApiKey::Metadata => {
                let addr = addr.get().expect("the address is known before any request");
                let broker = MetadataResponseBroker::default()
                    .with_node_id(BrokerId(1))
                    .with_host(StrBytes::from_string(addr.ip().to_string()))
                    .with_port(i32::from(addr.port()));
                let topic = MetadataResponseTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_static_str(LEDGER))))
                    .with_partitions(vec![MetadataResponsePartition::default()
                        .with_partition_index(0)
                        .with_leader_id(BrokerId(1))]);
                let r = MetadataResponse::default()
                    .with_brokers(vec![broker])
                    .with_topics(vec![topic]);
                at_once(encode(&r, version))
            }
            ApiKey::JoinGroup => at_once(crate::fake_broker::join_alone(body, version, MEMBER)),
            // The only member leads: it gets the assignment it computed for itself.
            ApiKey::SyncGroup => at_once(crate::fake_broker::sync_alone(body, version, MEMBER)),
            ApiKey::Heartbeat => at_once(encode(&HeartbeatResponse::default(), version)),
            ApiKey::Produce => {
                let mut next = produced.lock().unwrap();
                let r =
                    ProduceResponse::default().with_responses(vec![TopicProduceResponse::default(
                    )
                    .with_name(TopicName(StrBytes::from_static_str(LEDGER)))
                    .with_partition_responses(vec![PartitionProduceResponse::default()
                        .with_index(0)
                        .with_base_offset(*next)])]);
                *next += 1;
                at_once(encode(&r, version))
            }
            ApiKey::OffsetCommit => {
                // The first is held, then timed out by the broker itself; the next is taken.
                let (code, hold) = if commits == 1 {
                    (7, HELD)
                } else {
                    (0, Duration::ZERO)
                };
                let r = OffsetCommitResponse::default().with_topics(vec![
                    OffsetCommitResponseTopic::default()
                        .with_name(TopicName(StrBytes::from_static_str(LEDGER)))
                        .with_partitions(vec![OffsetCommitResponsePartition::default()
                            .with_partition_index(0)
                            .with_error_code(code)]),
                ]);
                Some((encode(&r, version), hold))
            }
            ApiKey::LeaveGroup => {
                let r =
                    LeaveGroupResponse::default()
                        .with_members(vec![MemberResponse::default()
                            .with_member_id(StrBytes::from_static_str(MEMBER))]);
                at_once(encode(&r, version))
            }
            _ => None,
        }
    })
}

/// A checkpoint's OffsetCommit that the coordinator holds (as Apache does for up to
/// `offsets.commit.timeout.ms` while the offsets partition's replicas catch up) delays no
/// heartbeat, and its answer, REQUEST_TIMED_OUT after the broker's bound, is awaited and retried
/// rather than the connection given up at the request timeout. Breaks if the commit went on the
/// heartbeats' connection (a heartbeat shares its connection), or if its local timeout were the
/// request timeout (the retry goes out before the broker answered the first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_checkpoint_commit_delays_no_heartbeat_and_gets_the_brokers_answer() {
    crate::support::init_tracing();
    let addr = Arc::new(OnceLock::new());
    let log: Log = Arc::default();
    let fake = fake_broker::start_parking(script(addr.clone(), log.clone())).await;
    addr.set(fake.addr).expect("set once");
    let o = LockOptions::new(fake.addr.to_string(), "lock")
        .session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(300))
        .lease_margin(Duration::from_secs(1))
        .request_timeout(REQUEST_TIMEOUT)
        .ledger_topic(LEDGER)
        .ledger_push(false);
    let guard = o.acquire(Some(BOUND)).await.expect("acquire");
    tokio::time::timeout(BOUND, guard.checkpoint("c"))
        .await
        .expect("the checkpoint's outcome within the bound")
        .expect("stored once the broker takes the second commit");
    assert!(guard.is_held(), "the hold survived the held commit");
    tokio::time::timeout(BOUND, guard.release())
        .await
        .expect("release within the bound")
        .expect("release");

    let log = log.lock().unwrap().clone();
    let commits: Vec<(Instant, usize)> = log
        .iter()
        .filter(|e| e.2 == ApiKey::OffsetCommit)
        .map(|e| (e.0, e.1))
        .collect();
    assert_eq!(commits.len(), 2, "{log:?}");
    let shared: Vec<usize> = log
        .iter()
        .filter(|e| e.2 == ApiKey::Heartbeat && commits.iter().any(|c| c.1 == e.1))
        .map(|e| e.1)
        .collect();
    assert!(
        shared.is_empty(),
        "heartbeats went on the connection of a held commit: {log:?}"
    );
    // The retry follows the broker's answer, which came no sooner than HELD after the first.
    assert!(
        commits[1].0.duration_since(commits[0].0) >= HELD,
        "the commit was retried before the broker answered it: {log:?}"
    );
    let heartbeats_while_held = log
        .iter()
        .filter(|e| e.2 == ApiKey::Heartbeat && e.0 > commits[0].0 && e.0 < commits[1].0)
        .count();
    assert!(
        heartbeats_while_held > 0,
        "no heartbeat while the commit was held: {log:?}"
    );
}

/// A holder's renewal is applied only before its lease end, also when the Heartbeat was built
/// before the lease end and its connection was opened inside the request: the coordinator closes
/// the connection on the fourth Heartbeat, so the fifth goes out, after the coordinator is looked
/// up again, on a connection opened for it, and the coordinator holds its NONE for longer than a
/// lease (as Apache holds a Heartbeat until its earlier writes are committed). The hold is lost
/// at its lease end, timed from the third Heartbeat (the last NONE in time), before that late
/// NONE is even sent, and the NONE revives nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_on_a_connection_opened_inside_the_request_counts_only_before_the_lease_end() {
    const LEASE: Duration = Duration::from_secs(5);
    const HELD_NONE: Duration = Duration::from_secs(6);
    crate::support::init_tracing();
    let held_answer: Arc<Mutex<Option<Instant>>> = Arc::default();
    let fourth: Arc<Mutex<Option<Instant>>> = Arc::default();
    let heartbeats = Arc::new(Mutex::new(0usize));
    let (held, beats, cut) = (held_answer.clone(), heartbeats.clone(), fourth.clone());
    let base = script(Arc::new(OnceLock::new()), Log::default());
    let fake =
        fake_broker::start_parking(Arc::new(move |conn, api, version, body: &mut BytesMut| {
            if api != ApiKey::Heartbeat {
                return base(conn, api, version, body);
            }
            let n = {
                let mut b = beats.lock().unwrap();
                *b += 1;
                *b
            };
            let none = encode(&HeartbeatResponse::default(), version);
            match n {
                1..=3 => Some((none, Duration::ZERO)),
                4 => {
                    *cut.lock().unwrap() = Some(Instant::now());
                    None
                }
                5 => {
                    *held.lock().unwrap() = Some(Instant::now() + HELD_NONE);
                    Some((none, HELD_NONE))
                }
                _ => Some((none, Duration::ZERO)),
            }
        }))
        .await;
    let o = LockOptions::new(fake.addr.to_string(), "lock")
        .session_timeout(LEASE + Duration::from_secs(1))
        .rebalance_timeout(LEASE + Duration::from_secs(1))
        .heartbeat_interval(Duration::from_millis(300))
        .lease_margin(Duration::from_secs(1))
        .request_timeout(Duration::from_secs(10));
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let guard = o.events(tx).acquire(Some(BOUND)).await.expect("acquire");
    let reason = tokio::time::timeout(BOUND, guard.lost())
        .await
        .expect("the hold ends within the bound");
    let lost_at = Instant::now();
    assert_eq!(reason, kafka_lock::LossReason::LeaseExpired);
    let answered = held_answer
        .lock()
        .unwrap()
        .expect("the fifth heartbeat reached the coordinator");
    assert!(
        lost_at < answered,
        "the hold lasted until the late NONE ({:?} after it)",
        lost_at.duration_since(answered)
    );
    // The late NONE arrives: nothing is held again.
    tokio::time::sleep_until(tokio::time::Instant::from_std(
        answered + Duration::from_millis(500),
    ))
    .await;
    assert!(!guard.is_held());
    assert!(*heartbeats.lock().unwrap() >= 5);
    // The loss's lease end is the one the last NONE in time gave: before the fourth Heartbeat
    // arrived + a lease. A renewal by the late NONE would put it after.
    let cut = fourth
        .lock()
        .unwrap()
        .expect("the fourth heartbeat arrived");
    let lease_end = loop {
        match tokio::time::timeout(BOUND, events.recv()).await {
            Ok(Some(kafka_lock::LockEvent::Lost { lease_end, .. })) => break lease_end,
            Ok(Some(_)) => {}
            other => panic!("no Lost event: {other:?}"),
        }
    };
    eprintln!(
        "lost at {:?} after the fourth heartbeat, lease end {:?} after it; the late NONE {:?} after it",
        lost_at.duration_since(cut),
        lease_end.duration_since(cut),
        answered.duration_since(cut)
    );
    assert!(
        lease_end < cut + LEASE,
        "the lease was renewed by a NONE handled after it ended ({:?} past the fourth heartbeat + a lease)",
        lease_end.duration_since(cut + LEASE)
    );
}

/// Every event reaches the user's stream, the loss included and in order, while nobody reads
/// the stream: the session hands its events over on its own task, so it must neither wait for
/// a reader nor drop what the reader has not taken yet. The guard and its watch see the loss
/// too, and the stream ends once the session has (the guard dropped, the membership left).
/// Breaks if the hand-over skipped or delayed a Lost event, or blocked the session (the
/// fencing heartbeat would then never be sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_event_stream_still_gets_every_event_the_loss_included() {
    /// Heartbeats answered NONE before the coordinator fences the member.
    const RENEWALS: usize = 5;
    crate::support::init_tracing();
    let heartbeats = Arc::new(Mutex::new(0usize));
    let beats = heartbeats.clone();
    let base = script(Arc::new(OnceLock::new()), Log::default());
    let fake =
        fake_broker::start_parking(Arc::new(move |conn, api, version, body: &mut BytesMut| {
            if api != ApiKey::Heartbeat {
                return base(conn, api, version, body);
            }
            let n = {
                let mut b = beats.lock().unwrap();
                *b += 1;
                *b
            };
            // UNKNOWN_MEMBER_ID: the coordinator no longer knows the holder.
            let code = if n <= RENEWALS { 0 } else { 25 };
            let r = HeartbeatResponse::default().with_error_code(code);
            Some((encode(&r, version), Duration::ZERO))
        }))
        .await;
    let o = LockOptions::new(fake.addr.to_string(), "lock")
        .session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(200))
        .lease_margin(Duration::from_secs(1))
        .request_timeout(REQUEST_TIMEOUT);
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let guard = o.events(tx).acquire(Some(BOUND)).await.expect("acquire");
    let watch = guard.watch();
    let reason = tokio::time::timeout(BOUND, watch.lost())
        .await
        .expect("the hold ends within the bound");
    assert!(!guard.is_held() && !watch.is_held());
    assert!(*heartbeats.lock().unwrap() > RENEWALS);
    drop(guard);
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(BOUND, events.recv()).await {
            Ok(Some(e)) => seen.push(e),
            Ok(None) => break,
            Err(_) => panic!("the stream did not end with the session: {seen:?}"),
        }
    }
    let at = |want: fn(&kafka_lock::LockEvent) -> bool| -> Vec<usize> {
        (0..seen.len()).filter(|&i| want(&seen[i])).collect()
    };
    let acquired = at(|e| matches!(e, kafka_lock::LockEvent::Acquired { .. }));
    let lost = at(|e| matches!(e, kafka_lock::LockEvent::Lost { .. }));
    assert_eq!(acquired.len(), 1, "{seen:?}");
    assert_eq!(lost.len(), 1, "{seen:?}");
    assert!(acquired[0] < lost[0], "{seen:?}");
    assert!(
        matches!(&seen[lost[0]], kafka_lock::LockEvent::Lost { reason: r, .. } if *r == reason),
        "the stream and the watch disagree on the loss: {seen:?}"
    );
}

/// What the scripted coordinator of a rebalance test knows: the group's generation and state,
/// the SyncGroup answer it holds, and every OffsetCommit it received.
#[derive(Default)]
struct Rebalance {
    /// Set by the test: the holder's Heartbeats are told to rejoin (REBALANCE_IN_PROGRESS).
    start: AtomicBool,
    generation: AtomicI32,
    /// The current generation is STABLE (else COMPLETING_REBALANCE).
    stable: AtomicBool,
    /// The held SyncGroup answer of generation 2 was let go.
    released: AtomicBool,
    /// (generation, whether the SyncGroup answer had been let go) of every OffsetCommit.
    commits: Mutex<Vec<(i32, bool)>>,
}

const RIVAL: &str = "r-0";

/// How long the SyncGroup answer stays held after the checkpoint is asked. Only the detection
/// of a wrong commit rests on it (one goes out within milliseconds of the command, or of the
/// ledger's first retry, 100 ms); nothing waits on it for the right outcome.
const SYNC_WINDOW: Duration = Duration::from_secs(2);

/// A JoinGroup answer of `generation` led by `leader`: the leader gets the member list (only
/// the holder, with the metadata it sent), a follower none, as Apache answers.
fn join_answer(
    body: &mut BytesMut,
    version: i16,
    generation: i32,
    leader: &'static str,
) -> BytesMut {
    use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
    use kafka_protocol::messages::{JoinGroupRequest, JoinGroupResponse};
    use kafka_protocol::protocol::Decodable;
    let req = JoinGroupRequest::decode(body, version).expect("JoinGroup");
    let protocol = req.protocols.first().expect("a protocol");
    let members = if leader == MEMBER {
        vec![JoinGroupResponseMember::default()
            .with_member_id(StrBytes::from_static_str(MEMBER))
            .with_metadata(protocol.metadata.clone())]
    } else {
        Vec::new()
    };
    let r = JoinGroupResponse::default()
        .with_generation_id(generation)
        .with_protocol_type(Some(req.protocol_type.clone()))
        .with_protocol_name(Some(protocol.name.clone()))
        .with_leader(StrBytes::from_static_str(leader))
        .with_member_id(StrBytes::from_static_str(MEMBER))
        .with_members(members);
    encode(&r, version)
}

/// The SyncGroup answer of a follower whose leader, `RIVAL`, assigned the lock to itself at
/// `generation`.
fn rivals_assignment(body: &mut BytesMut, version: i16, generation: i32) -> BytesMut {
    use kafka_lock::internals::assign::{Holder, NativeAssignment};
    use kafka_protocol::messages::{SyncGroupRequest, SyncGroupResponse};
    use kafka_protocol::protocol::Decodable;
    let req = SyncGroupRequest::decode(body, version).expect("SyncGroup");
    let assignment = NativeAssignment {
        holder: Some(Holder {
            member_id: RIVAL.into(),
            label: None,
            generation,
            slot: 0,
        }),
        position: 1,
        members: 2,
        permits: 1,
        other_holders: Vec::new(),
        ledger: Some(LEDGER.into()),
    };
    let r = SyncGroupResponse::default()
        .with_protocol_type(req.protocol_type.clone())
        .with_protocol_name(req.protocol_name.clone())
        .with_assignment(assignment.encode());
    encode(&r, version)
}

/// A holder is asked to rejoin, its JoinGroup is answered with generation 2, and the answer to
/// its SyncGroup of generation 2 is held until the test lets it go; a checkpoint asked meanwhile
/// must send no OffsetCommit (at either generation) before that answer. With `ours` the holder
/// leads generation 2 and its own assignment keeps the lock: Apache holds a leader's SyncGroup
/// until the group's assignment record is written, and keeps the group COMPLETING_REBALANCE
/// until then (GroupMetadataManager.classicGroupSyncToClassicGroup: the append future's
/// callback propagates the assignment and moves the group to STABLE), so the checkpoint goes out
/// after the answer, at generation 2. Without, `RIVAL` leads and takes the lock, and the group is
/// STABLE from the moment the holder's SyncGroup arrives while the answer is on its way (held):
/// ClassicGroup.validateOffsetCommit then accepts a commit from any member of generation 2
/// (member and generation checked, no assignment), so a commit at 2 before the answer would be
/// stored for a member that no longer holds; the checkpoint must fail `NotHeld`, with no commit
/// sent at all.
async fn checkpoint_asked_between_the_join_and_sync_answers(ours: bool) {
    use kafka_protocol::messages::offset_commit_response::{
        OffsetCommitResponsePartition, OffsetCommitResponseTopic,
    };
    use kafka_protocol::messages::{OffsetCommitRequest, OffsetCommitResponse, SyncGroupRequest};
    use kafka_protocol::protocol::Decodable;

    crate::support::init_tracing();
    let addr = Arc::new(OnceLock::new());
    let base = script(addr.clone(), Log::default());
    let st = Arc::new(Rebalance::default());
    st.generation.store(1, Ordering::SeqCst);
    st.stable.store(true, Ordering::SeqCst);
    let (synced_tx, mut synced) = tokio::sync::watch::channel(false);
    let (gate, gate_rx) = tokio::sync::watch::channel(false);
    let st2 = st.clone();
    let fake =
        fake_broker::start_gated(Arc::new(move |conn, api, version, body: &mut BytesMut| {
            let st = &st2;
            let now = |b: BytesMut| Some((b, fake_broker::ready()));
            match api {
                ApiKey::Heartbeat => {
                    let rejoin = st.start.load(Ordering::SeqCst)
                        && st.generation.load(Ordering::SeqCst) == 1;
                    let r =
                        HeartbeatResponse::default().with_error_code(if rejoin { 27 } else { 0 });
                    now(encode(&r, version))
                }
                ApiKey::JoinGroup if st.start.load(Ordering::SeqCst) => {
                    st.generation.store(2, Ordering::SeqCst);
                    st.stable.store(false, Ordering::SeqCst);
                    now(join_answer(
                        body,
                        version,
                        2,
                        if ours { MEMBER } else { RIVAL },
                    ))
                }
                ApiKey::SyncGroup => {
                    let req =
                        SyncGroupRequest::decode(&mut body.clone(), version).expect("SyncGroup");
                    if req.generation_id < 2 {
                        return now(fake_broker::sync_alone(body, version, MEMBER));
                    }
                    let answer = if ours {
                        fake_broker::sync_alone(body, version, MEMBER)
                    } else {
                        // The rival's assignment is in: STABLE, while our answer travels.
                        st.stable.store(true, Ordering::SeqCst);
                        rivals_assignment(body, version, 2)
                    };
                    synced_tx.send_replace(true);
                    let (mut gate, st) = (gate_rx.clone(), st.clone());
                    let hold: fake_broker::Hold = Box::pin(async move {
                        let _ = gate.wait_for(|open| *open).await;
                        // The assignment's record is written: STABLE, and the answer goes.
                        st.stable.store(true, Ordering::SeqCst);
                        st.released.store(true, Ordering::SeqCst);
                    });
                    Some((answer, hold))
                }
                ApiKey::OffsetCommit => {
                    let req = OffsetCommitRequest::decode(body, version).expect("OffsetCommit");
                    let generation = req.generation_id_or_member_epoch;
                    st.commits
                        .lock()
                        .unwrap()
                        .push((generation, st.released.load(Ordering::SeqCst)));
                    // ClassicGroup.validateOffsetCommit: the generation first, then the state.
                    let code = if generation != st.generation.load(Ordering::SeqCst) {
                        22
                    } else if !st.stable.load(Ordering::SeqCst) {
                        27
                    } else {
                        0
                    };
                    let r = OffsetCommitResponse::default().with_topics(vec![
                        OffsetCommitResponseTopic::default()
                            .with_name(TopicName(StrBytes::from_static_str(LEDGER)))
                            .with_partitions(vec![OffsetCommitResponsePartition::default()
                                .with_partition_index(0)
                                .with_error_code(code)]),
                    ]);
                    now(encode(&r, version))
                }
                _ => base(conn, api, version, body)
                    .map(|(b, hold)| (b, Box::pin(tokio::time::sleep(hold)) as fake_broker::Hold)),
            }
        }))
        .await;
    addr.set(fake.addr).expect("set once");
    let o = LockOptions::new(fake.addr.to_string(), "lock")
        .session_timeout(Duration::from_secs(10))
        .rebalance_timeout(Duration::from_secs(10))
        .heartbeat_interval(Duration::from_millis(300))
        .lease_margin(Duration::from_secs(1))
        .request_timeout(REQUEST_TIMEOUT)
        .ledger_topic(LEDGER)
        .ledger_push(false);
    let guard = tokio::time::timeout(BOUND, o.acquire(Some(BOUND)))
        .await
        .expect("acquired within the bound")
        .expect("acquire");
    st.start.store(true, Ordering::SeqCst);
    tokio::time::timeout(BOUND, synced.wait_for(|s| *s))
        .await
        .expect("the holder's SyncGroup of generation 2 within the bound")
        .expect("the fake runs");
    assert!(guard.is_held(), "the hold ended in the rebalance");

    let stored = {
        let mut checkpoint = std::pin::pin!(guard.checkpoint("c"));
        let early = tokio::time::timeout(SYNC_WINDOW, &mut checkpoint).await;
        let commits = st.commits.lock().unwrap().clone();
        assert!(
            early.is_err(),
            "the checkpoint ended before the SyncGroup answer: {early:?}; commits {commits:?}"
        );
        assert!(
            commits.is_empty(),
            "OffsetCommits (generation, after the SyncGroup answer) sent before the SyncGroup \
         answer: {commits:?}"
        );

        gate.send_replace(true);
        tokio::time::timeout(BOUND, checkpoint)
            .await
            .expect("the checkpoint's outcome within the bound")
    };
    let commits = st.commits.lock().unwrap().clone();
    if ours {
        stored.expect("stored once the SyncGroup answer names the holder again");
        assert_eq!(
            commits,
            [(2, true)],
            "one commit, at generation 2, after the answer"
        );
        assert!(guard.is_held());
        tokio::time::timeout(BOUND, guard.release())
            .await
            .expect("release within the bound")
            .expect("release");
    } else {
        assert!(
            matches!(
                stored,
                Err(kafka_lock::Error::Ledger(
                    kafka_lock::LedgerError::NotHeld { .. }
                ))
            ),
            "{stored:?}"
        );
        assert!(commits.is_empty(), "a commit for a lost hold: {commits:?}");
        let reason = tokio::time::timeout(BOUND, guard.lost())
            .await
            .expect("lost within the bound");
        assert_eq!(reason, kafka_lock::LossReason::Reassigned);
        drop(guard);
    }
}

/// See [`checkpoint_asked_between_the_join_and_sync_answers`]. Breaks if the session's view
/// never sets `awaiting_sync` (commits at generation 2 while the group is still
/// COMPLETING_REBALANCE), or sets it and never clears it (the checkpoint times out after the
/// answer), or if the gate lifts before the answer (at the ledger's first retry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_asked_in_a_rebalance_waits_for_the_sync_answer_and_is_stored_at_the_new_generation(
) {
    checkpoint_asked_between_the_join_and_sync_answers(true).await;
}

/// See [`checkpoint_asked_between_the_join_and_sync_answers`]. Breaks if the session's view
/// never sets `awaiting_sync`, or the gate lifts before the answer: the commit at generation 2
/// is taken while the group is STABLE under the rival, and the checkpoint is reported stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_asked_in_a_rebalance_the_holder_loses_sends_nothing_and_fails_not_held() {
    checkpoint_asked_between_the_join_and_sync_answers(false).await;
}

/// Two checkpoints asked at once on one guard each get their own outcome: the coordinator
/// refuses the first's commit (OFFSET_METADATA_TOO_LARGE, which is not retried) and takes the
/// second's, and the commits go out in the order asked. Breaks if the session gave two
/// checkpoints one ticket (the first caller's reply is then dropped, and the first outcome goes
/// to the second caller).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_checkpoints_asked_at_once_each_get_their_own_outcome() {
    use kafka_protocol::messages::offset_commit_response::{
        OffsetCommitResponsePartition, OffsetCommitResponseTopic,
    };
    use kafka_protocol::messages::{OffsetCommitRequest, OffsetCommitResponse};
    use kafka_protocol::protocol::Decodable;
    use std::future::Future;

    crate::support::init_tracing();
    let addr = Arc::new(OnceLock::new());
    let base = script(addr.clone(), Log::default());
    let values: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = values.clone();
    let fake =
        fake_broker::start_parking(Arc::new(move |conn, api, version, body: &mut BytesMut| {
            if api != ApiKey::OffsetCommit {
                return base(conn, api, version, body);
            }
            let req = OffsetCommitRequest::decode(body, version).expect("OffsetCommit");
            let value = req
                .topics
                .first()
                .and_then(|t| t.partitions.first())
                .and_then(|p| p.committed_metadata.as_ref())
                .map(|m| m.to_string())
                .unwrap_or_default();
            let code = if value == "first" { 12 } else { 0 };
            seen.lock().unwrap().push(value);
            let r = OffsetCommitResponse::default().with_topics(vec![
                OffsetCommitResponseTopic::default()
                    .with_name(TopicName(StrBytes::from_static_str(LEDGER)))
                    .with_partitions(vec![OffsetCommitResponsePartition::default()
                        .with_partition_index(0)
                        .with_error_code(code)]),
            ]);
            Some((encode(&r, version), Duration::ZERO))
        }))
        .await;
    addr.set(fake.addr).expect("set once");
    let o = LockOptions::new(fake.addr.to_string(), "lock")
        .session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(300))
        .lease_margin(Duration::from_secs(1))
        .request_timeout(REQUEST_TIMEOUT)
        .ledger_topic(LEDGER)
        .ledger_push(false);
    let guard = tokio::time::timeout(BOUND, o.acquire(Some(BOUND)))
        .await
        .expect("acquired within the bound")
        .expect("acquire");
    let (first, second) = {
        let mut first = std::pin::pin!(guard.checkpoint("first"));
        // One poll sends the first's command, so that it is the first asked.
        std::future::poll_fn(|cx| {
            let _ = first.as_mut().poll(cx);
            std::task::Poll::Ready(())
        })
        .await;
        tokio::time::timeout(BOUND, async {
            tokio::join!(first, guard.checkpoint("second"))
        })
        .await
        .expect("both outcomes within the bound")
    };
    assert!(
        matches!(&first, Err(kafka_lock::Error::Broker { code, .. }) if code.0 == 12),
        "first: {first:?}"
    );
    second.expect("second stored");
    assert_eq!(*values.lock().unwrap(), ["first", "second"]);
    tokio::time::timeout(BOUND, guard.release())
        .await
        .expect("release within the bound")
        .expect("release");
}

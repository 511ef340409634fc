//! Requests Apache Kafka may hold before answering, on a scripted broker that holds them as
//! Apache does (its socket server answers a connection's requests one at a time, in order): a
//! held request must never sit in front of a heartbeat, and its local timeout must outlast the
//! broker's own bound, so the broker's answer arrives instead of a closed connection.

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

//! Many locks through one `Client` on Apache Kafka: every lock still excludes and fences on its
//! own while the locks share their connections, and a request the broker parks on one lock's
//! behalf never holds back another lock's heartbeats. On three nodes, a paused coordinator
//! costs only the locks it coordinates their holds.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kafka_lock::{Client, FencingToken, LockEvent, LockGuard, LockOptions, LossReason};
use tokio::task::{block_in_place, JoinHandle};

use crate::support;
use crate::support::brokers::SLACK;
use crate::support::holds::Holds;
use crate::support::kafka::probe::group_on_partition;
use crate::support::kafka::{kafka, kafka_default_delay, KafkaCluster, KafkaOptions};

const HEARTBEAT: Duration = Duration::from_millis(500);

/// Apache Kafka's smallest session by default, a short heartbeat: handovers are quick.
fn tune(o: LockOptions) -> LockOptions {
    o.session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(6))
        .heartbeat_interval(HEARTBEAT)
        .lease_margin(Duration::from_secs(1))
}

/// LOCKS locks, each contended by a member of the shared client and a member of a second client
/// (connections of its own, as another process would have): per lock, the holds never overlap
/// and each holder's token is greater than every earlier holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_locks_through_one_client_exclude_and_fence_each_lock_on_its_own() {
    support::init_tracing();
    const LOCKS: usize = 24;
    const ROUNDS: usize = 2;
    let shared = Client::new(kafka().bootstrap());
    let other = Client::new(kafka().bootstrap());
    let prefix = support::unique_group("many");
    let work = Duration::from_millis(300);
    // Each round of each contender: at most a handover, a rebalance and the work.
    let wait = Duration::from_secs(60);
    let mut per_lock = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..LOCKS {
        let name = format!("{prefix}-{i}");
        let holds = Holds::new();
        for (who, client) in [("shared", &shared), ("other", &other)] {
            let (options, _events) = holds.record(who, tune(client.lock(&name)).label(who));
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = options.acquire(Some(wait)).await.expect("acquire");
                    tokio::time::sleep(work).await;
                    assert!(guard.is_held(), "lost while working: {:?}", options.stats());
                    guard.release().await.expect("release");
                }
                options.stats()
            }));
        }
        per_lock.push(holds);
    }
    for t in tasks {
        let stats = tokio::time::timeout(wait * ROUNDS as u32 * 2 + SLACK, t)
            .await
            .expect("every contender finishes its rounds")
            .unwrap();
        assert_eq!(stats.acquisitions, ROUNDS as u64);
        assert!(stats.losses.is_empty(), "{stats:?}");
    }
    for (i, holds) in per_lock.iter().enumerate() {
        // No overlap; strictly increasing generations (the token without a ledger).
        let held = holds.check_when_ended(SLACK).await;
        assert_eq!(held.len(), 2 * ROUNDS, "lock {i}: {held:#?}");
        assert!(held.iter().all(|h| h.lost.is_none()), "lock {i}: {held:#?}");
    }
}

/// On a broker with Apache's default 3 s `group.initial.rebalance.delay.ms`, lock B's first
/// JoinGroup is parked for 3 s. Lock A, held through the same client on the same broker, keeps
/// renewing its lease meanwhile: its heartbeats do not queue behind B's JoinGroup (a connection
/// serves one request at a time, so on a shared connection they would wait the whole 3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_join_of_one_lock_does_not_hold_back_another_locks_heartbeats() {
    support::init_tracing();
    let delay = Duration::from_millis(3000);
    let heartbeat = Duration::from_millis(300);
    let client = Client::new(kafka_default_delay().bootstrap());
    let a = tune(client.lock(support::unique_group("parked-a"))).heartbeat_interval(heartbeat);
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let b = tune(client.lock(support::unique_group("parked-b")))
        .heartbeat_interval(heartbeat)
        .events(tx);
    let held_a = a.acquire(Some(delay * 3 + SLACK)).await.expect("acquire A");
    let mut watch = held_a.watch();

    let started = Instant::now();
    let acquire_b = tokio::spawn(async move { b.acquire(Some(delay * 3 + SLACK)).await });
    // A's renewals until B holds; B's acquisition includes its 3 s parked JoinGroup.
    let mut renewals = 0;
    let bound = delay * 3 + SLACK;
    loop {
        tokio::select! {
            changed = tokio::time::timeout(bound, watch.changed()) => {
                assert!(
                    matches!(changed, Ok(true)) && watch.is_held(),
                    "A's hold ended while B joined"
                );
                renewals += 1;
            }
            e = tokio::time::timeout(bound, events.recv()) => match e {
                Ok(Some(LockEvent::Acquired { .. })) => break,
                Ok(Some(_)) => {}
                other => panic!("B never acquired: {other:?}"),
            },
        }
    }
    let window = started.elapsed();
    let held_b = acquire_b.await.unwrap().expect("acquire B");
    eprintln!("A renewed {renewals} times while B's acquisition took {window:?}");
    assert!(window >= delay, "B's join was not parked: {window:?}");
    // A heartbeat every 300 ms: about ten renewals in the window; two at most if they queued
    // behind B's JoinGroup (one before it reached the broker, one after it was answered).
    assert!(
        renewals >= 3,
        "A renewed only {renewals} times in {window:?}"
    );
    assert!(held_a.is_held());
    held_b.release().await.unwrap();
    held_a.release().await.unwrap();
}

/// A holder and a newcomer to the same lock through one client whose parking lanes are all
/// taken (a cap of 1 makes it one lane): the newcomer's JoinGroup parks on the lane until every
/// member of the group has rejoined, and the holder's rejoin must not wait for that lane, or
/// the group's rebalance ends at the rebalance timeout without the holder and the holder loses a
/// lock it was renewing all along. (With any cap, the members of groups rebalancing at once in
/// one client can outnumber the lanes: their parked rejoins wait for each other.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holders_rejoin_never_waits_for_a_lane_its_own_groups_newcomer_parks() {
    support::init_tracing();
    let client = Client::new(kafka().bootstrap()).parking_lanes(1);
    let name = support::unique_group("lanes-rejoin");
    let rebalance = Duration::from_secs(6);
    let held = tune(client.lock(&name))
        .acquire(Some(rebalance * 3 + SLACK))
        .await
        .expect("acquire");
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let newcomer = tune(client.lock(&name)).events(tx);
    let waiter = tokio::spawn(async move { newcomer.acquire(Some(rebalance * 4 + SLACK)).await });
    // The rebalance the newcomer starts ends with both members: it waits behind the holder.
    let first = loop {
        match tokio::time::timeout(rebalance * 3 + SLACK, events.recv()).await {
            Ok(Some(e @ (LockEvent::Waiting { .. } | LockEvent::Acquired { .. }))) => break e,
            Ok(Some(_)) => {}
            other => panic!("the newcomer never joined: {other:?}"),
        }
    };
    assert!(
        matches!(first, LockEvent::Waiting { .. }),
        "the newcomer took the lock from a holder that kept renewing: {first:?}"
    );
    assert!(held.is_held(), "the holder lost the lock in the rebalance");
    held.release().await.expect("release");
    let next = tokio::time::timeout(rebalance * 3 + SLACK, waiter)
        .await
        .expect("the newcomer acquires after the release")
        .unwrap()
        .expect("acquire");
    next.release().await.expect("release");
}

/// A burst of first acquisitions larger than the parking lanes, on a broker with Apache's
/// default 3 s `group.initial.rebalance.delay.ms`: with one lane, the locks' first JoinGroups
/// take turns on it, 3 s each, so the later ones wait in line for longer than a lease (5 s
/// here). The broker only sees a JoinGroup when it leaves the line, so each assignment's
/// deadline is timed from then; timed from when the join was queued, every lock but the first
/// is assigned after its deadline, leaves, joins the back of the line again, and none ever
/// gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_first_joins_waiting_in_line_for_a_lane_all_acquire() {
    support::init_tracing();
    const LOCKS: usize = 4;
    let delay = Duration::from_millis(3000);
    let client = Client::new(kafka_default_delay().bootstrap()).parking_lanes(1);
    let prefix = support::unique_group("lanes-burst");
    // The joins take turns: a delay each, plus a round of rejoins if an unlucky one started over.
    let wait = delay * (2 * LOCKS as u32) + SLACK;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..LOCKS {
        let lock = tune(client.lock(format!("{prefix}-{i}")));
        tasks.spawn(async move { lock.acquire(Some(wait)).await.map(|g| (g, lock.stats())) });
    }
    let mut guards = Vec::new();
    let mut failed = Vec::new();
    while let Some(joined) = tokio::time::timeout(wait + SLACK, tasks.join_next())
        .await
        .expect("every acquisition ends within its wait")
    {
        match joined.unwrap() {
            Ok(g) => guards.push(g),
            Err(e) => failed.push(e.to_string()),
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {LOCKS} acquired in {:?} with one lane; the others: {failed:#?}",
        guards.len(),
        started.elapsed()
    );
    for (guard, stats) in guards {
        assert!(guard.is_held(), "{stats:?}");
        guard.release().await.expect("release");
    }
}

/// Bound on a three-node cluster settling after a broker is paused: the controller fences it
/// after `broker.session.timeout.ms` (3 s), plus a controller election if it was the active
/// controller, plus loading the groups it coordinated, plus the dropped holder's session (6 s)
/// at the new coordinator and a rebalance; with room for a loaded machine.
const FAILOVER_BOUND: Duration = Duration::from_secs(30);

/// How long a contender holds a lock once it has it.
const BRIEF_HOLD: Duration = Duration::from_millis(300);

/// One lock held through the shared client, with a contender of another client queued behind.
struct Spread {
    name: String,
    coordinator: i32,
    holds: Holds,
    guard: LockGuard,
    token: FencingToken,
    events: tokio::sync::mpsc::UnboundedReceiver<LockEvent>,
    contender: JoinHandle<()>,
}

/// A contender that takes the lock when it can, holds it briefly and releases it.
fn contend(who: String, options: LockOptions) -> JoinHandle<()> {
    tokio::spawn(async move {
        // Unbounded here: every caller bounds the task.
        let g = options
            .acquire(None)
            .await
            .unwrap_or_else(|e| panic!("{who}: {e}"));
        tokio::time::sleep(BRIEF_HOLD).await;
        assert!(g.is_held(), "{who} lost the lock: {:?}", options.stats());
        g.release().await.unwrap();
    })
}

/// Three Apache Kafka nodes; locks through ONE client whose groups' coordinators are on
/// different nodes (a few per `__consumer_offsets` partition, each partition's leader read with
/// FindCoordinator), each with a contender of another client queued behind its holder. One
/// coordinator's node is paused (SIGSTOP: its sockets stay open and nothing answers, the worst
/// case for a shared connection). With a 5 s lease, no longer than the request timeout, a
/// heartbeat hanging there cannot renew in time, so:
/// - the locks that node coordinated are lost, as `LeaseExpired`, by their lease end; the
///   contender and this client again each take them later, under greater generations, with no
///   overlap (the holds checker);
/// - every lock coordinated elsewhere is held all along: never reported lost, renewed after the
///   pause, the same token as before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_coordinator_costs_only_the_locks_it_coordinates_on_three_nodes() {
    support::init_tracing();
    const PER_PARTITION: usize = 3;
    let mut cluster = block_in_place(|| KafkaCluster::start(KafkaOptions::three_nodes()));
    let bootstrap = cluster.bootstrap();
    let shared = Client::new(&bootstrap);
    let other = Client::new(&bootstrap);
    let prefix = support::unique_group("spread");
    let partitions = cluster.offsets_partitions();
    let coordinators = || {
        let mut named = Vec::new();
        for p in 0..partitions {
            for j in 0..PER_PARTITION {
                let name = group_on_partition(&format!("{prefix}-p{p}-{j}"), p, partitions);
                let node = block_in_place(|| cluster.coordinator(&name));
                named.push((node, name));
            }
        }
        named
    };
    block_in_place(|| cluster.spread_offsets_leaders());
    let named = coordinators();
    let nodes: BTreeSet<i32> = named.iter().map(|(n, _)| *n).collect();
    assert!(
        nodes.len() >= 2,
        "one node leads every offsets partition, nothing to compare: {named:?}"
    );

    let mut locks = Vec::new();
    for (coordinator, name) in named {
        let holds = Holds::new();
        let (o, events) = holds.record("shared", tune(shared.lock(&name)).label("shared"));
        let guard = o
            .acquire(Some(FAILOVER_BOUND))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let (o, mut waiting) = holds.record("other", tune(other.lock(&name)).label("other"));
        let contender = contend(format!("{name}: other"), o);
        // The holder keeps the lock through the contender's rebalance under a new generation;
        // once it has it, the group is settled.
        let generation = loop {
            match tokio::time::timeout(FAILOVER_BOUND, waiting.recv()).await {
                Ok(Some(LockEvent::Waiting {
                    holder: Some(h), ..
                })) => break h.generation,
                Ok(Some(_)) => {}
                other => panic!("{name}: the contender never queued: {other:?}"),
            }
        };
        let deadline = Instant::now() + FAILOVER_BOUND;
        while guard.token().generation < generation {
            assert!(
                Instant::now() < deadline,
                "{name}: the holder never took generation {generation}"
            );
            // Polling: the guard's token moves without an event this test still receives.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let token = guard.token();
        locks.push(Spread {
            name,
            coordinator,
            holds,
            guard,
            token,
            events,
            contender,
        });
    }
    let lease = tune(shared.lock("any")).lease_length();

    let paused = locks[0].coordinator;
    let paused_at = Instant::now();
    block_in_place(|| cluster.pause(paused));
    let (mut lost, mut kept): (Vec<Spread>, Vec<Spread>) =
        locks.into_iter().partition(|l| l.coordinator == paused);
    eprintln!(
        "node {paused} paused: {} locks coordinated there, {} elsewhere",
        lost.len(),
        kept.len()
    );
    for l in &lost {
        let reason = tokio::time::timeout(lease + HEARTBEAT, l.guard.lost())
            .await
            .unwrap_or_else(|_| panic!("{}: not lost within its lease", l.name));
        assert_eq!(reason, LossReason::LeaseExpired, "{}", l.name);
    }
    eprintln!(
        "the locks on node {paused} lost {:?} after the pause",
        paused_at.elapsed()
    );
    // This client takes each lost lock again too, from wherever its group has moved.
    let mut takeovers = Vec::new();
    for l in lost.iter() {
        let (o, _) = l.holds.record(
            "shared-again",
            tune(shared.lock(&l.name)).label("shared-again"),
        );
        takeovers.push(contend(format!("{}: shared-again", l.name), o));
    }

    takeovers.extend(
        lost.iter_mut()
            .map(|l| std::mem::replace(&mut l.contender, tokio::spawn(async {}))),
    );
    let deadline = Instant::now() + FAILOVER_BOUND * 4;
    while !takeovers.iter().all(JoinHandle::is_finished) {
        for k in &kept {
            assert!(
                k.guard.is_held(),
                "{} (node {}) lost while node {paused} was paused: {:?}",
                k.name,
                k.coordinator,
                k.holds.holds()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the locks of node {paused} were not all taken over: {:#?}",
            lost.iter().map(|l| l.holds.holds()).collect::<Vec<_>>()
        );
        // Polling: `is_held` reads the lease clock; a lapse between two looks still shows
        // as a hold that ended, checked below.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for t in takeovers {
        t.await.unwrap();
    }
    eprintln!(
        "the locks on node {paused} taken over twice {:?} after the pause",
        paused_at.elapsed()
    );
    for l in &lost {
        let held = l.holds.check_when_ended(SLACK).await;
        assert_eq!(held.len(), 3, "{}: {held:#?}", l.name);
        assert_eq!(held[0].who, "shared", "{}: {held:#?}", l.name);
        assert_eq!(
            held[0].lost,
            Some(LossReason::LeaseExpired),
            "{}: {held:#?}",
            l.name
        );
        assert!(
            held[1..]
                .iter()
                .all(|h| h.generations[0] > l.token.generation && h.lost.is_none()),
            "{}: {held:#?}",
            l.name
        );
    }
    for k in kept.iter_mut() {
        assert!(k.guard.is_held(), "{}", k.name);
        assert_eq!(k.guard.token(), k.token, "{}: a new token", k.name);
        assert!(
            k.guard.lease_end() > paused_at + lease,
            "{}: not renewed since the pause",
            k.name
        );
        let held = k.holds.holds();
        assert!(
            held.len() == 1 && held[0].end.is_none(),
            "{}: {held:#?}",
            k.name
        );
        while let Ok(e) = k.events.try_recv() {
            assert!(!matches!(e, LockEvent::Lost { .. }), "{}: {e:?}", k.name);
        }
    }
    block_in_place(|| {
        cluster.resume(paused);
        cluster.wait_for_full_isr();
    });
    for k in kept {
        k.guard.release().await.unwrap();
        tokio::time::timeout(FAILOVER_BOUND * 2, k.contender)
            .await
            .unwrap_or_else(|_| panic!("{}: the contender never held", k.name))
            .unwrap();
        let held = k.holds.check_when_ended(SLACK).await;
        assert_eq!(held.len(), 2, "{}: {held:#?}", k.name);
        assert!(
            held.iter().all(|h| h.lost.is_none()),
            "{}: {held:#?}",
            k.name
        );
    }
}

/// What reads a lock from outside (an observer, `describe`, `history`, `last_checkpoint`),
/// made through the client that holds it, go over the client's connections and see what its
/// lock does: the observer reports the hold with its ledger token as its ACQUIRED record is
/// appended and its end; the description, the history and the checkpoint all name that hold;
/// and the holder keeps its lease throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_history_and_an_observer_through_the_client_that_holds_the_lock() {
    use kafka_lock::{CheckpointSource, Leadership, LockState, ObserveVia};
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let ledger = support::unique_group("client-reads-ledger");
    crate::support::kafka::admin::create_topic(&bootstrap, &ledger, 1);
    let client = Client::new(&bootstrap);
    let name = support::unique_group("client-reads");
    let options = tune(client.lock(&name)).ledger_topic(&ledger);

    let (tx, mut reports) = tokio::sync::mpsc::unbounded_channel::<Leadership>();
    let mut observer = options.observer();
    let observing = tokio::spawn(async move {
        loop {
            let l = observer.next().await.expect("observe");
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    let first = next_report(&mut reports).await;
    assert_eq!(first.via, ObserveVia::Ledger);
    assert_eq!(first.state, LockState::Free);

    let guard = options.acquire(Some(SLACK)).await.expect("acquire");
    let token = guard.token().ledger_offset.expect("a ledger token");
    let held = next_report(&mut reports).await;
    assert_eq!(
        held.leader.as_ref().and_then(|l| l.ledger_token),
        Some(token),
        "{held:?}"
    );
    guard.checkpoint("step-1").await.expect("checkpoint");

    let d = options.describe().await.expect("describe");
    assert_eq!(
        d.holder().and_then(|h| h.ledger_token),
        Some(token),
        "{d:?}"
    );
    let history = options.history().await.expect("history");
    assert_eq!(
        history.last_hold().map(|h| h.token),
        Some(token),
        "{history:?}"
    );
    let c = options
        .last_checkpoint()
        .await
        .expect("last checkpoint")
        .expect("a checkpoint");
    assert_eq!((c.value.as_str(), c.token), ("step-1", token));
    assert_eq!(c.source, CheckpointSource::Group);
    assert!(guard.is_held());
    assert!(options.stats().losses.is_empty(), "{:?}", options.stats());

    guard.release().await.expect("release");
    let free = next_report(&mut reports).await;
    assert_eq!(free.state, LockState::Free, "{free:?}");
    observing.abort();
}

async fn next_report(
    reports: &mut tokio::sync::mpsc::UnboundedReceiver<kafka_lock::Leadership>,
) -> kafka_lock::Leadership {
    tokio::time::timeout(Duration::from_secs(60), reports.recv())
        .await
        .expect("a report within the bound")
        .expect("the observer runs")
}

/// LOCKS locks acquired at once through one client cost a few FindCoordinator requests, not one
/// per lock: lookups queued while one is with the broker go out together (KIP-699's key list).
/// Counted by a proxy in front of the broker; every lock still acquires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_acquisitions_at_once_share_their_find_coordinator_requests() {
    use crate::fault::kproxy::ProxySet;
    use kafka_protocol::messages::ApiKey;
    const LOCKS: usize = 40;
    support::init_tracing();
    let node = &kafka().nodes()[0];
    let brokers = [(node.id(), node.addr().parse().expect("node address"))];
    let proxies = ProxySet::start(&tokio::runtime::Handle::current(), &brokers);
    let client = Client::new(proxies.bootstrap());
    let prefix = support::unique_group("lookups");
    let tasks: Vec<_> = (0..LOCKS)
        .map(|i| {
            let options = tune(client.lock(format!("{prefix}-{i}")));
            tokio::spawn(async move { options.acquire(Some(Duration::from_secs(60))).await })
        })
        .collect();
    let mut guards = Vec::new();
    for t in tasks {
        let g = tokio::time::timeout(Duration::from_secs(60) + SLACK, t)
            .await
            .expect("every acquire ends")
            .unwrap()
            .expect("acquire");
        guards.push(g);
    }
    let lookups = proxies
        .stats()
        .requests
        .lock()
        .unwrap()
        .get(&(ApiKey::FindCoordinator as i16))
        .copied()
        .unwrap_or(0);
    println!("{LOCKS} locks acquired at once: {lookups} FindCoordinator requests");
    // Without coalescing: one per lock, and one more per look before joining (2 × LOCKS).
    assert!(
        lookups > 0 && (lookups as usize) < LOCKS,
        "{lookups} FindCoordinator requests for {LOCKS} locks"
    );
    for g in guards {
        g.release().await.expect("release");
    }
}

/// A scripted broker that grants every lock to its only member: JoinGroup makes the joiner the
/// leader of generation 1, SyncGroup hands it its own assignment, Heartbeat and LeaveGroup answer
/// at once, and Metadata names `__consumer_offsets` with four partitions.
fn granting_script() -> std::sync::Arc<crate::fake_broker::Script> {
    use crate::fake_broker::encode;
    use kafka_protocol::messages::leave_group_response::MemberResponse;
    use kafka_protocol::messages::metadata_response::{
        MetadataResponsePartition, MetadataResponseTopic,
    };
    use kafka_protocol::messages::{
        ApiKey, HeartbeatResponse, LeaveGroupResponse, MetadataResponse, TopicName,
    };
    use kafka_protocol::protocol::StrBytes;
    const MEMBER: &str = "m-1";
    std::sync::Arc::new(|api, version, body: &mut bytes::BytesMut| match api {
        ApiKey::Metadata => {
            let topic = MetadataResponseTopic::default()
                .with_name(Some(TopicName(StrBytes::from_static_str(
                    "__consumer_offsets",
                ))))
                .with_partitions(
                    (0..4)
                        .map(|i| MetadataResponsePartition::default().with_partition_index(i))
                        .collect(),
                );
            Some(encode(
                &MetadataResponse::default().with_topics(vec![topic]),
                version,
            ))
        }
        ApiKey::JoinGroup => Some(crate::fake_broker::join_alone(body, version, MEMBER)),
        // The only member leads: it gets the assignment it computed for itself.
        ApiKey::SyncGroup => Some(crate::fake_broker::sync_alone(body, version, MEMBER)),
        ApiKey::Heartbeat => Some(encode(&HeartbeatResponse::default(), version)),
        ApiKey::LeaveGroup => Some(encode(
            &LeaveGroupResponse::default().with_members(vec![
                MemberResponse::default().with_member_id(StrBytes::from_static_str(MEMBER))
            ]),
            version,
        )),
        _ => None,
    })
}

/// LOCKS locks taken one after another through one client open a handful of connections, not
/// some per acquisition: the bootstrap connections and the coordinator's quick connections (one
/// each per stripe) and a parking lane or two, reused. The bootstrap address names the scripted broker
/// `localhost` and FindCoordinator names it `127.0.0.1`, as a cluster names every coordinator
/// but the bootstrap node: a newly named coordinator's versions are read from the connection
/// that asked it when it opened, so every ApiVersions the broker sees opens a connection (one
/// more per lock before: on three nodes, 752 ApiVersions for 1,000 locks read as connections).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_through_one_client_open_a_handful_of_connections() {
    use std::sync::atomic::Ordering;
    const LOCKS: usize = 20;
    support::init_tracing();
    let fake = crate::fake_broker::start(granting_script()).await;
    let client = Client::new(format!("localhost:{}", fake.addr.port()));
    let mut guards = Vec::new();
    for i in 0..LOCKS {
        let options = client
            .lock(format!("handful-{i}"))
            .heartbeat_interval(Duration::from_secs(1));
        let guard = tokio::time::timeout(Duration::from_secs(30), options.acquire(None))
            .await
            .expect("the acquire ends")
            .expect("acquire");
        guards.push(guard);
    }
    let connections = fake.connections.load(Ordering::SeqCst);
    let asked = fake.api_versions.load(Ordering::SeqCst);
    println!("{LOCKS} locks acquired: {connections} connections, {asked} ApiVersions");
    // A bootstrap connection per stripe (lookups are striped), the coordinator's quick
    // connection per stripe, and the lanes.
    let bound = 2 * kafka_lock::DEFAULT_QUICK_CONNECTIONS + 2;
    assert!(
        connections <= bound,
        "{connections} connections for {LOCKS} acquisitions (at most {bound})"
    );
    assert_eq!(
        asked, connections,
        "ApiVersions beyond the connections' own handshakes"
    );
    for g in guards {
        tokio::time::timeout(Duration::from_secs(30), g.release())
            .await
            .expect("the release ends")
            .expect("release");
    }
}

/// LOCKS acquisitions started at once through a client that admits AT_ONCE at a time run in
/// waves: on a scripted broker that holds every JoinGroup a while, no more than AT_ONCE of the
/// client's members are ever between their JoinGroup and their SyncGroup (the broker sees a
/// member's SyncGroup before the client can let the next acquisition in), and every lock is
/// acquired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_acquisitions_through_a_client_runs_in_waves() {
    use kafka_protocol::messages::{ApiKey, JoinGroupRequest, SyncGroupRequest};
    use kafka_protocol::protocol::Decodable;
    use std::sync::{Arc, Mutex};
    const LOCKS: usize = 8;
    const AT_ONCE: usize = 2;
    support::init_tracing();
    // Groups between JoinGroup and SyncGroup now, and the most there were.
    let joining: Arc<Mutex<(BTreeSet<String>, usize)>> = Arc::default();
    let inner = granting_script();
    let seen = joining.clone();
    let fake = crate::fake_broker::start_parking(Arc::new(
        move |_conn, api, version, body: &mut bytes::BytesMut| {
            let mut hold = Duration::ZERO;
            match api {
                ApiKey::JoinGroup => {
                    let req = JoinGroupRequest::decode(&mut body.clone(), version).ok()?;
                    let mut j = seen.lock().unwrap();
                    j.0.insert(req.group_id.to_string());
                    j.1 = j.1.max(j.0.len());
                    hold = Duration::from_millis(300);
                }
                ApiKey::SyncGroup => {
                    let req = SyncGroupRequest::decode(&mut body.clone(), version).ok()?;
                    seen.lock().unwrap().0.remove(req.group_id.as_str());
                }
                _ => {}
            }
            inner(api, version, body).map(|b| (b, hold))
        },
    ))
    .await;
    let client = Client::new(fake.addr.to_string()).acquisitions_at_once(AT_ONCE);
    let tasks: Vec<_> = (0..LOCKS)
        .map(|i| {
            let options = client
                .lock(format!("wave-{i}"))
                .heartbeat_interval(Duration::from_secs(1));
            tokio::spawn(async move { options.acquire(None).await })
        })
        .collect();
    let mut guards = Vec::new();
    for t in tasks {
        let g = tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("every acquire ends")
            .unwrap()
            .expect("acquire");
        guards.push(g);
    }
    let most = joining.lock().unwrap().1;
    println!("{LOCKS} acquisitions, {AT_ONCE} at once: at most {most} joining together");
    assert!(
        (1..=AT_ONCE).contains(&most),
        "{most} members joining at once, the client admits {AT_ONCE}"
    );
    for g in guards {
        tokio::time::timeout(Duration::from_secs(30), g.release())
            .await
            .expect("the release ends")
            .expect("release");
    }
}

/// A scripted broker granting every lock as [`granting_script`] does, except that the JoinGroup
/// of group `held` is never answered and a Metadata request naming topic `offline` hears
/// LEADER_NOT_AVAILABLE for it (a retriable answer: the consumer-mode check of that lock's topic
/// is made again until its bound). `seen` is set once the broker has `held`'s JoinGroup or a
/// Metadata request for `offline`.
async fn withholding_broker(
    seen: tokio::sync::watch::Sender<bool>,
) -> crate::fake_broker::FakeBroker {
    use crate::fake_broker::encode;
    use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
    use kafka_protocol::messages::{
        ApiKey, JoinGroupRequest, MetadataRequest, MetadataResponse, TopicName,
    };
    use kafka_protocol::protocol::{Decodable, StrBytes};
    use std::sync::Arc;
    let inner = granting_script();
    crate::fake_broker::start_parking(Arc::new(
        move |_conn, api, version, body: &mut bytes::BytesMut| match api {
            ApiKey::JoinGroup => {
                let req = JoinGroupRequest::decode(&mut body.clone(), version).ok()?;
                let hold = if req.group_id.as_str() == "held" {
                    seen.send_replace(true);
                    Duration::from_secs(3600)
                } else {
                    Duration::ZERO
                };
                inner(api, version, body).map(|b| (b, hold))
            }
            ApiKey::Metadata => {
                let req = MetadataRequest::decode(&mut body.clone(), version).ok()?;
                let offline = req
                    .topics
                    .iter()
                    .flatten()
                    .any(|t| t.name.as_ref().is_some_and(|n| n.as_str() == "offline"));
                if !offline {
                    return inner(api, version, body).map(|b| (b, Duration::ZERO));
                }
                seen.send_replace(true);
                let topic = MetadataResponseTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_static_str("offline"))))
                    .with_error_code(5);
                let r = MetadataResponse::default().with_topics(vec![topic]);
                Some((encode(&r, version), Duration::ZERO))
            }
            _ => inner(api, version, body).map(|b| (b, Duration::ZERO)),
        },
    ))
    .await
}

/// An acquisition whose member never gets into a generation (the coordinator holds its
/// JoinGroup) keeps its admission place for 10 s at most: with one place, the next lock's
/// acquisition starts after it and is granted while the first is still held in its join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_held_in_its_join_gives_its_place_up_after_its_time() {
    support::init_tracing();
    let (seen_tx, mut seen) = tokio::sync::watch::channel(false);
    let fake = withholding_broker(seen_tx).await;
    let client = Client::new(fake.addr.to_string()).acquisitions_at_once(1);
    let held = client
        .lock("held")
        .heartbeat_interval(Duration::from_secs(1));
    let held = tokio::spawn(async move { held.acquire(None).await });
    tokio::time::timeout(Duration::from_secs(30), seen.wait_for(|s| *s))
        .await
        .expect("the held lock's JoinGroup reaches the broker")
        .unwrap();
    let started = Instant::now();
    let free = client
        .lock("free")
        .heartbeat_interval(Duration::from_secs(1));
    let guard = tokio::time::timeout(Duration::from_secs(60), free.acquire(None))
        .await
        .expect("the next acquisition is let in while the first is held in its join")
        .expect("acquire");
    println!("granted {:?} after the held JoinGroup", started.elapsed());
    assert!(!held.is_finished(), "the held acquisition is still waiting");
    held.abort();
    tokio::time::timeout(Duration::from_secs(30), guard.release())
        .await
        .expect("the release ends")
        .expect("release");
}

/// An acquisition whose future is dropped (the caller's timeout, a task aborted) gives its
/// admission place back at once, not after its 10 s: the next lock is granted promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquisition_gives_its_place_back_at_once() {
    support::init_tracing();
    let (seen_tx, mut seen) = tokio::sync::watch::channel(false);
    let fake = withholding_broker(seen_tx).await;
    let client = Client::new(fake.addr.to_string()).acquisitions_at_once(1);
    let held = client
        .lock("held")
        .heartbeat_interval(Duration::from_secs(1));
    let held = tokio::spawn(async move { held.acquire(None).await });
    tokio::time::timeout(Duration::from_secs(30), seen.wait_for(|s| *s))
        .await
        .expect("the held lock's JoinGroup reaches the broker")
        .unwrap();
    held.abort();
    let _ = held.await;
    let started = Instant::now();
    let free = client
        .lock("free")
        .heartbeat_interval(Duration::from_secs(1));
    // Well inside the 10 s a place that was not given back would be kept.
    let guard = tokio::time::timeout(Duration::from_secs(7), free.acquire(None))
        .await
        .expect("the next acquisition is let in once the first is cancelled")
        .expect("acquire");
    println!("granted {:?} after the cancel", started.elapsed());
    tokio::time::timeout(Duration::from_secs(30), guard.release())
        .await
        .expect("the release ends")
        .expect("release");
}

/// The 10 s an admitted acquisition keeps its place count from its admission, reaching the
/// cluster included: a consumer-mode lock whose topic's leader is not available checks it
/// again until three connect timeouts (30 s by default) have passed, and the next lock's
/// acquisition is let in after 10 s of it and granted while the check is still being made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_checking_its_topic_gives_its_place_up_after_its_time() {
    support::init_tracing();
    let (seen_tx, mut seen) = tokio::sync::watch::channel(false);
    let fake = withholding_broker(seen_tx).await;
    let client = Client::new(fake.addr.to_string()).acquisitions_at_once(1);
    let checking = client
        .lock("checking")
        .consumer_topic("offline")
        .heartbeat_interval(Duration::from_secs(1));
    let checking = tokio::spawn(async move { checking.acquire(None).await });
    tokio::time::timeout(Duration::from_secs(30), seen.wait_for(|s| *s))
        .await
        .expect("the lock topic's check reaches the broker")
        .unwrap();
    let started = Instant::now();
    let free = client
        .lock("free")
        .heartbeat_interval(Duration::from_secs(1));
    let guard = tokio::time::timeout(Duration::from_secs(60), free.acquire(None))
        .await
        .expect("the next acquisition ends")
        .expect("acquire");
    println!("granted {:?} after the first check", started.elapsed());
    assert!(
        !checking.is_finished(),
        "the next lock was let in only once the first gave up: {:?}",
        checking.await
    );
    checking.abort();
    tokio::time::timeout(Duration::from_secs(30), guard.release())
        .await
        .expect("the release ends")
        .expect("release");
}

/// A holder's rejoin never waits for an admission place: with the client's one place taken by
/// an acquisition held in its join, the coordinator asks the holder to rejoin
/// (REBALANCE_IN_PROGRESS to its Heartbeat) and the holder's JoinGroup reaches it at once, not
/// after the held acquisition's 10 s (a member that waits past the rebalance timeout loses its
/// membership).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holders_rejoin_does_not_wait_for_an_admission_place() {
    use crate::fake_broker::encode;
    use kafka_protocol::messages::{ApiKey, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest};
    use kafka_protocol::protocol::Decodable;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    support::init_tracing();
    let inner = granting_script();
    // Set once `held` is in its join: the holder's next Heartbeat is told to rejoin, once.
    let rebalance = Arc::new(AtomicBool::new(false));
    let (held_tx, mut held_seen) = tokio::sync::watch::channel(false);
    let (rejoin_tx, mut rejoin_seen) = tokio::sync::watch::channel(None::<Instant>);
    let (told_tx, mut told) = tokio::sync::watch::channel(None::<Instant>);
    let told_once = Arc::new(AtomicBool::new(false));
    let (rb, once) = (rebalance.clone(), told_once.clone());
    let fake = crate::fake_broker::start_parking(Arc::new(
        move |_conn, api, version, body: &mut bytes::BytesMut| {
            let plain =
                |body: &mut bytes::BytesMut| inner(api, version, body).map(|b| (b, Duration::ZERO));
            match api {
                ApiKey::JoinGroup => {
                    let req = JoinGroupRequest::decode(&mut body.clone(), version).ok()?;
                    match req.group_id.as_str() {
                        "held" => {
                            held_tx.send_replace(true);
                            inner(api, version, body).map(|b| (b, Duration::from_secs(3600)))
                        }
                        "holder" if once.load(Ordering::SeqCst) => {
                            rejoin_tx.send_replace(Some(Instant::now()));
                            plain(body)
                        }
                        _ => plain(body),
                    }
                }
                ApiKey::Heartbeat => {
                    let req = HeartbeatRequest::decode(&mut body.clone(), version).ok()?;
                    if req.group_id.as_str() == "holder"
                        && rb.load(Ordering::SeqCst)
                        && !once.swap(true, Ordering::SeqCst)
                    {
                        told_tx.send_replace(Some(Instant::now()));
                        let r = HeartbeatResponse::default().with_error_code(27);
                        return Some((encode(&r, version), Duration::ZERO));
                    }
                    plain(body)
                }
                _ => plain(body),
            }
        },
    ))
    .await;
    let client = Client::new(fake.addr.to_string()).acquisitions_at_once(1);
    let holder = client
        .lock("holder")
        .heartbeat_interval(Duration::from_millis(200));
    let guard = tokio::time::timeout(Duration::from_secs(30), holder.acquire(None))
        .await
        .expect("the holder's acquire ends")
        .expect("acquire");
    let held = client
        .lock("held")
        .heartbeat_interval(Duration::from_secs(1));
    let held = tokio::spawn(async move { held.acquire(None).await });
    tokio::time::timeout(Duration::from_secs(30), held_seen.wait_for(|s| *s))
        .await
        .expect("the held lock's JoinGroup reaches the broker")
        .unwrap();
    rebalance.store(true, Ordering::SeqCst);
    let told = *tokio::time::timeout(Duration::from_secs(30), told.wait_for(|t| t.is_some()))
        .await
        .expect("the holder heartbeats")
        .unwrap();
    let rejoined = *tokio::time::timeout(
        Duration::from_secs(30),
        rejoin_seen.wait_for(|t| t.is_some()),
    )
    .await
    .expect("the holder rejoins")
    .unwrap();
    let after = rejoined.unwrap() - told.unwrap();
    println!("the holder rejoined {after:?} after it was told to");
    // Well inside the 10 s the held acquisition keeps the place.
    assert!(
        after < Duration::from_secs(5),
        "the rejoin waited {after:?}"
    );
    assert!(
        !held.is_finished(),
        "the held acquisition still has the place"
    );
    held.abort();
    let _ = tokio::time::timeout(Duration::from_secs(30), guard.release()).await;
}

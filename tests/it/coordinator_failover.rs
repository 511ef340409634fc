//! The lock group's coordinator fails over on a three-node Apache Kafka cluster while a holder
//! holds and two waiters wait: SIGKILL, SIGSTOP and a controlled shutdown (SIGTERM) of the
//! coordinator's broker, one after the other on one cluster (three JVMs are expensive).
//!
//! Expected, from docs/design.md: every client rediscovers the coordinator; the new coordinator
//! replays the group as STABLE at the same generation, with the same members, and re-arms every
//! member's session timer when it has loaded the group; the holder keeps the lock if a heartbeat
//! reaches the new coordinator within its lease, and otherwise reports it lost, at its lease end,
//! before anyone else can hold; nobody ever overlaps; tokens only go up. On the way, the new
//! coordinator is caught answering heartbeats NONE blindly while it loads the group.

use std::time::{Duration, Instant};

use kafka_lock::internals::driver::{ConnConfig, Connection};
use kafka_lock::internals::wire::Response;
use kafka_lock::{KafkaCode, LockEvent, LockGuard, LockOptions, LossReason};
use kafka_protocol::messages::heartbeat_request::HeartbeatRequest;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{ApiKey, GroupId, OffsetCommitRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::mpsc;
use tokio::task::{block_in_place, JoinHandle};

use crate::support::holds::Holds;
use crate::support::kafka::probe::{self, describe_group, group_on_partition};
use crate::support::kafka::{KafkaCluster, KafkaOptions};
use crate::support::{init_tracing, unique_group};

const HEARTBEAT: Duration = Duration::from_millis(500);

/// Bound on the cluster settling after a disruption: the controller fences a silent broker after
/// `broker.session.timeout.ms` (3 s), plus a controller election when the broker was the active
/// controller (seen: 7 s in all), plus loading the group; then clients' backoff (at most 1 s),
/// and room for a loaded machine.
const FAILOVER_BOUND: Duration = Duration::from_secs(30);

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

async fn connect(addr: &str) -> Connection {
    let cfg = ConnConfig::default()
        .with_client_id(Some("kafka-lock-tests-load".into()))
        .with_connect_timeout(Duration::from_secs(1))
        .with_request_timeout(Duration::from_secs(2));
    Connection::connect(addr, &cfg)
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
}

/// Writes `records` offset commits of `filler` (a group without members) to its
/// `__consumer_offsets` partition, in requests that each stay well under one record batch.
async fn fill(conn: &Connection, filler: &str, topic: &str, records: usize) {
    const PER_REQUEST: usize = 4000;
    let version = conn.versions().get(ApiKey::OffsetCommit).unwrap().min(9);
    let mut left = records;
    let mut offset = 0i64;
    while left > 0 {
        let n = left.min(PER_REQUEST);
        let partitions = (0..n)
            .map(|i| {
                OffsetCommitRequestPartition::default()
                    .with_partition_index(0)
                    .with_committed_offset(offset + i as i64)
                    .with_committed_metadata(Some(sb("")))
            })
            .collect();
        let req = OffsetCommitRequest::default()
            .with_group_id(GroupId(sb(filler)))
            .with_generation_id_or_member_epoch(-1)
            .with_member_id(sb(""))
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName(sb(topic)))
                .with_partitions(partitions)]);
        match conn.request_at(req, version, Duration::from_secs(30)).await {
            Ok(Response::OffsetCommit(r)) => {
                let codes: std::collections::BTreeSet<i16> = r.topics[0]
                    .partitions
                    .iter()
                    .map(|p| p.error_code)
                    .collect();
                assert_eq!(codes.into_iter().collect::<Vec<_>>(), [0], "commit");
            }
            other => panic!("OffsetCommit: {other:?}"),
        }
        left -= n;
        offset += n as i64;
    }
}

/// Offset commits written to the failing-over `__consumer_offsets` partition before the
/// SIGKILL, so that loading it takes long enough to be seen: about 0.2 s per 100 000 on the
/// project's machine (0.4 s → 1 s under load); filling takes about 1 s per 100 000.
const FILL: usize = 200_000;

/// How long each waiter holds the lock once it has it.
const WAITER_HOLD: Duration = Duration::from_millis(300);

/// A holder and two queued waiters, every one of them recorded in `holds`. A waiter that gets
/// the lock holds it briefly and releases it.
struct Contenders {
    holder: LockGuard,
    holder_events: mpsc::UnboundedReceiver<LockEvent>,
    waiters: Vec<JoinHandle<()>>,
    ids: Vec<String>,
    lease: Duration,
}

async fn contenders(options: &dyn Fn() -> LockOptions, holds: &Holds) -> Contenders {
    let (o, holder_events) = holds.record("holder", options().label("holder"));
    let lease = o.lease_length();
    let holder = o
        .acquire(Some(FAILOVER_BOUND))
        .await
        .expect("the holder acquires");
    let mut ids = vec![holder.member_id()];
    let mut waiters = Vec::new();
    let mut generation = holder.token().generation;
    for i in 1..=2 {
        let who = format!("waiter-{i}");
        let (o, mut events) = holds.record(&who, options().label(&who));
        waiters.push(tokio::spawn(async move {
            let g = o.acquire(None).await.expect("a waiter acquires in the end");
            tokio::time::sleep(WAITER_HOLD).await;
            assert!(g.is_held(), "a waiter lost the lock: {:?}", o.stats());
            g.release().await.unwrap();
        }));
        generation = loop {
            match tokio::time::timeout(FAILOVER_BOUND, events.recv()).await {
                Ok(Some(LockEvent::Waiting {
                    member_id,
                    holder: Some(h),
                    ..
                })) => {
                    ids.push(member_id);
                    break h.generation;
                }
                Ok(Some(_)) => {}
                other => panic!("{who} never queued: {other:?}"),
            }
        };
    }
    ids.sort();
    // The holder keeps the lock through the waiters' rebalances under a new token each time;
    // once it has the last one, the group is settled.
    let deadline = Instant::now() + FAILOVER_BOUND;
    while holder.token().generation < generation {
        assert!(
            Instant::now() < deadline,
            "the holder never took token {generation}"
        );
        // Polling: the guard's token moves without an event the test still receives.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Contenders {
        holder,
        holder_events,
        waiters,
        ids,
        lease,
    }
}

impl Contenders {
    /// The holder releases (if it still holds), the waiters take the lock in turn, and the
    /// checker judges every hold.
    async fn finish(self, holds: &Holds) {
        if self.holder.is_held() {
            self.holder.release().await.unwrap();
        }
        for w in self.waiters {
            tokio::time::timeout(FAILOVER_BOUND * 2, w)
                .await
                .expect("every waiter gets the lock in turn")
                .unwrap();
        }
        let held = holds.check_when_ended(FAILOVER_BOUND).await;
        assert_eq!(held.len(), 3, "{held:#?}");
        eprintln!(
            "holds: {:?}",
            held.iter()
                .map(|h| (h.who.as_str(), h.generations.clone(), h.lost.clone()))
                .collect::<Vec<_>>()
        );
    }

    /// Waits until the holder has renewed its lease with a heartbeat sent after `after`.
    async fn renewed_after(&mut self, after: Instant) {
        let deadline = Instant::now() + FAILOVER_BOUND;
        while self.holder.lease_end() <= after + self.lease {
            if !self.holder.is_held() {
                let mut events = Vec::new();
                while let Ok(e) = self.holder_events.try_recv() {
                    events.push(e);
                }
                panic!("the holder lost the lock: {events:?}");
            }
            assert!(Instant::now() < deadline, "no renewal after the failover");
            // Polling: a renewal moves the lease end without an event.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The group as its current coordinator describes it: state, and member ids, sorted.
async fn members(cluster: &KafkaCluster, group: &str) -> (String, Vec<String>) {
    let live = cluster.nodes().iter().find(|n| n.is_live()).unwrap().addr();
    let g = describe_group(&live, group).await.unwrap();
    let mut ids: Vec<String> = g.members.iter().map(|m| m.member_id.to_string()).collect();
    ids.sort();
    (g.group_state.to_string(), ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_failover_keeps_or_loses_the_lock_in_time_and_never_overlaps() {
    init_tracing();
    let mut cluster = block_in_place(|| KafkaCluster::start(KafkaOptions::three_nodes()));
    let bootstrap = cluster.bootstrap();
    let options = |group: &str, session: Duration| {
        let (b, g) = (bootstrap.clone(), group.to_owned());
        move || {
            LockOptions::new(&b, &g)
                .session_timeout(session)
                .rebalance_timeout(session)
                .heartbeat_interval(HEARTBEAT)
                .lease_margin(Duration::from_secs(1))
        }
    };

    // 1. SIGKILL. A 15 s session (lease 14 s) outlasts fencing, an election and the load, so
    //    the holder must keep the lock.
    let group = unique_group("failover-kill");
    let holds = Holds::new();
    let mut c = contenders(&options(&group, Duration::from_secs(15)), &holds).await;
    let before = c.holder.token();
    let old = block_in_place(|| cluster.coordinator(&group));
    fill_offsets_partition(&cluster, &group, old).await;
    let probe = watch_load(&cluster, &group, old);
    let killed_at = Instant::now();
    block_in_place(|| cluster.kill(old));
    let (new, answers) = probe.await.unwrap();
    eprintln!(
        "SIGKILL: node {old} -> node {new} after {:?}; the new coordinator answered {answers:?}",
        killed_at.elapsed()
    );
    assert!(
        answers.contains(&KafkaCode::NONE),
        "the new coordinator never answered blindly while loading: {answers:?}"
    );
    c.renewed_after(killed_at).await;
    eprintln!(
        "SIGKILL: the holder renewed {:?} after the kill",
        killed_at.elapsed()
    );
    assert_eq!(c.holder.token(), before, "no rebalance, the same token");
    assert_eq!(
        members(&cluster, &group).await,
        ("Stable".to_owned(), c.ids.clone())
    );
    c.finish(&holds).await;
    block_in_place(|| cluster.restart(old));

    // 2. SIGSTOP. With a 6 s session the lease is 5 s, no longer than the request timeout
    //    (5 s): the heartbeat that hangs on the frozen coordinator cannot be answered before the
    //    lease ends, so the holder must lose the lock, at its lease end, and nobody may hold
    //    before it has. The paused broker's session at the new coordinator expires 6 s after
    //    the load; then a waiter takes over.
    let group = unique_group("failover-stop");
    let holds = Holds::new();
    let c = contenders(&options(&group, Duration::from_secs(6)), &holds).await;
    let frozen = block_in_place(|| cluster.coordinator(&group));
    let paused_at = Instant::now();
    block_in_place(|| cluster.pause(frozen));
    let reason = tokio::time::timeout(c.lease + HEARTBEAT, c.holder.lost())
        .await
        .expect("the holder loses the lock within its lease");
    assert_eq!(reason, LossReason::LeaseExpired);
    assert!(!c.holder.is_held());
    eprintln!(
        "SIGSTOP: the holder lost the lock {:?} after the pause",
        paused_at.elapsed()
    );
    // A waiter takes over once the holder's membership has expired at the new coordinator.
    let deadline = Instant::now() + FAILOVER_BOUND * 2;
    while holds.holds().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "no waiter took over: {:#?}",
            holds.holds()
        );
        // Polling the recorder: the waiters' guards live in their tasks.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "SIGSTOP: a waiter took over {:?} after the pause",
        paused_at.elapsed()
    );
    block_in_place(|| {
        cluster.resume(frozen);
        cluster.wait_for_full_isr();
    });
    c.finish(&holds).await;

    // 3. SIGTERM: a controlled shutdown moves the coordinator within seconds; the holder keeps
    //    the lock.
    let group = unique_group("failover-term");
    let holds = Holds::new();
    let mut c = contenders(&options(&group, Duration::from_secs(15)), &holds).await;
    let before = c.holder.token();
    let stopping = block_in_place(|| cluster.coordinator(&group));
    let took = block_in_place(|| cluster.terminate(stopping, Duration::from_secs(120)));
    let exited_at = Instant::now();
    let new = block_in_place(|| cluster.wait_for_new_coordinator(&group, stopping));
    eprintln!("SIGTERM: node {stopping} shut down in {took:?}, node {new} coordinates");
    c.renewed_after(exited_at).await;
    assert_eq!(c.holder.token(), before);
    assert_eq!(
        members(&cluster, &group).await,
        ("Stable".to_owned(), c.ids.clone())
    );
    c.finish(&holds).await;
}

/// Writes [`FILL`] offset commits of a group without members to the `__consumer_offsets`
/// partition of `group`, through its coordinator `node`, and waits until every replica has
/// them (the new leader must be in sync to be elected).
async fn fill_offsets_partition(cluster: &KafkaCluster, group: &str, node: i32) {
    let topic = unique_group("filler-topic");
    let bootstrap = cluster.bootstrap();
    block_in_place(|| probe::create_topic(&bootstrap, &topic, 1));
    let partitions = cluster.offsets_partitions();
    let filler = group_on_partition(
        "filler",
        probe::offsets_partition(group, partitions),
        partitions,
    );
    let conn = connect(&cluster.node(node).addr()).await;
    let started = Instant::now();
    fill(&conn, &filler, &topic, FILL).await;
    conn.close();
    block_in_place(|| cluster.wait_for_full_isr());
    eprintln!("{FILL} offset commits written in {:?}", started.elapsed());
}

/// Asks the nodes other than `old` with a heartbeat from a member nobody knows, over and over,
/// until one answers UNKNOWN_MEMBER_ID: that one has loaded the group. Returns it and the
/// distinct answers it gave before, in order. A loaded coordinator can only answer that member
/// UNKNOWN_MEMBER_ID; NOT_COORDINATOR comes before the node is elected, NONE only while it loads.
fn watch_load(cluster: &KafkaCluster, group: &str, old: i32) -> JoinHandle<(i32, Vec<KafkaCode>)> {
    let others: Vec<(i32, String)> = cluster
        .nodes()
        .iter()
        .filter(|n| n.id() != old)
        .map(|n| (n.id(), n.addr()))
        .collect();
    let group = group.to_owned();
    tokio::spawn(async move {
        let mut seen: Vec<Vec<KafkaCode>> = vec![Vec::new(); others.len()];
        let deadline = Instant::now() + FAILOVER_BOUND;
        loop {
            for (i, (id, addr)) in others.iter().enumerate() {
                let Ok(code) = stranger_heartbeat(addr, &group).await else {
                    continue;
                };
                if seen[i].last() != Some(&code) {
                    seen[i].push(code);
                }
                if code == KafkaCode::UNKNOWN_MEMBER_ID {
                    return (*id, seen.swap_remove(i));
                }
            }
            assert!(
                Instant::now() < deadline,
                "no node loaded the group: {seen:?}"
            );
        }
    })
}

async fn stranger_heartbeat(addr: &str, group: &str) -> Result<KafkaCode, String> {
    let cfg = ConnConfig::default()
        .with_client_id(Some("kafka-lock-tests-load".into()))
        .with_connect_timeout(Duration::from_secs(1))
        .with_request_timeout(Duration::from_secs(2));
    let conn = Connection::connect(addr, &cfg)
        .await
        .map_err(|e| e.to_string())?;
    let mut req = HeartbeatRequest::default();
    req.group_id = GroupId(sb(group));
    req.generation_id = 1;
    req.member_id = sb("nobody");
    let r = conn
        .request_at(req, 4, Duration::from_secs(2))
        .await
        .map_err(|e| e.to_string());
    conn.close();
    match r? {
        Response::Heartbeat(h) => Ok(KafkaCode(h.error_code)),
        other => Err(format!("{other:?}")),
    }
}

/// The path of a hold begun late, on three Apache Kafka nodes with a ledger: member A's
/// connections are cut (every frame held, both ways) right after its SyncGroup answer names it
/// holder, so neither its renewing Heartbeat nor its ACQUIRED record gets out; the coordinator
/// drops it after its session timeout and member B holds at the next generation; the
/// coordinator's node is killed, so the group moves, and the cut heals as soon as FindCoordinator
/// names the new coordinator, while it loads a filled offsets partition (and would answer a
/// Heartbeat NONE blindly). A's old membership's hold ends at its first lease end and is never
/// handed to A: A holds only later, under a new member id and a larger generation; no two holds
/// overlap; ledger tokens only go up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cut_off_after_its_assignment_holds_nothing_when_the_group_moves() {
    use crate::fault::kproxy::{Fault, ProxySet};
    init_tracing();
    let mut cluster = block_in_place(|| KafkaCluster::start(KafkaOptions::three_nodes()));
    let bootstrap = cluster.bootstrap();
    let group = unique_group("stale-assignment");
    let ledger = unique_group("stale-ledger");
    block_in_place(|| probe::create_topic(&bootstrap, &ledger, 1));
    let options = |bootstrap: &str, who: &str| {
        LockOptions::new(bootstrap, &group)
            .session_timeout(Duration::from_secs(6))
            .rebalance_timeout(Duration::from_secs(6))
            .heartbeat_interval(HEARTBEAT)
            .lease_margin(Duration::from_secs(1))
            .ledger_topic(&ledger)
            .label(who)
    };
    let brokers: Vec<(i32, std::net::SocketAddr)> = cluster
        .nodes()
        .iter()
        .map(|n| (n.id(), n.addr().parse().expect("a node's address")))
        .collect();
    let proxies = ProxySet::start(&tokio::runtime::Handle::current(), &brokers);
    let holds = Holds::new();

    let (o, _holder_events) = holds.record("holder", options(&bootstrap, "holder"));
    let holder = o
        .acquire(Some(FAILOVER_BOUND))
        .await
        .expect("the holder acquires");

    // A, through its proxies, queues first; B, direct, second. Each takes the lock when it can,
    // holds it briefly (B: until it loses it or 20 s passed) and releases.
    let spawn = |who: &'static str, o: LockOptions, hold: Duration| {
        tokio::spawn(async move {
            let g = o
                .acquire(None)
                .await
                .unwrap_or_else(|e| panic!("{who}: {e}"));
            let _ = tokio::time::timeout(hold, g.lost()).await;
            let _ = g.release().await;
        })
    };
    let queued = |mut events: mpsc::UnboundedReceiver<LockEvent>, who: &'static str| async move {
        loop {
            match tokio::time::timeout(FAILOVER_BOUND, events.recv()).await {
                Ok(Some(LockEvent::Waiting { member_id, .. })) => return (member_id, events),
                Ok(Some(_)) => {}
                other => panic!("{who} never queued: {other:?}"),
            }
        }
    };
    let (o, a_events) = holds.record("a", options(&proxies.bootstrap(), "a"));
    let a = spawn("a", o, WAITER_HOLD);
    let (a_id, mut a_events) = queued(a_events, "a").await;
    let (o, b_events) = holds.record("b", options(&bootstrap, "b"));
    let b = spawn("b", o, Duration::from_secs(20));
    let (_, mut b_events) = queued(b_events, "b").await;

    let old = block_in_place(|| cluster.coordinator(&group));
    fill_offsets_partition(&cluster, &group, old).await;

    // The holder lets go; the next assignment names A, and A is cut off right after it.
    proxies.cut_after_sync();
    holder.release().await.unwrap();
    let b_token = loop {
        match tokio::time::timeout(FAILOVER_BOUND, b_events.recv()).await {
            Ok(Some(LockEvent::Acquired { token, .. })) => break token,
            Ok(Some(_)) => {}
            other => panic!("B never held after A was dropped: {other:?}"),
        }
    };
    block_in_place(|| cluster.kill(old));
    let new = block_in_place(|| cluster.wait_for_new_coordinator(&group, old));
    proxies.set_all(Fault::Clear);
    eprintln!("coordinator {old} killed, {new} named; A's cut healed");

    let a_token = loop {
        match tokio::time::timeout(FAILOVER_BOUND * 3, a_events.recv()).await {
            Ok(Some(LockEvent::Acquired { token, .. })) => break token,
            Ok(Some(_)) => {}
            other => panic!("A never held: {other:?}"),
        }
    };
    assert_ne!(
        a_token.member_id, a_id,
        "a hold began for the membership the coordinator had dropped: {a_token:?}, B held {b_token:?}"
    );
    assert!(
        a_token.generation > b_token.generation,
        "{a_token:?} after {b_token:?}"
    );
    assert!(
        a_token.ledger_offset > b_token.ledger_offset,
        "ledger tokens went backwards: {a_token:?} after {b_token:?}"
    );
    for (who, task) in [("a", a), ("b", b)] {
        tokio::time::timeout(FAILOVER_BOUND * 2, task)
            .await
            .unwrap_or_else(|_| panic!("{who} never finished"))
            .unwrap();
    }
    let held = holds.check_when_ended(FAILOVER_BOUND).await;
    eprintln!(
        "holds: {:?}",
        held.iter()
            .map(|h| (h.who.as_str(), h.generations.clone(), h.lost.clone()))
            .collect::<Vec<_>>()
    );
    drop(proxies);
}

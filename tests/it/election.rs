//! Describing a lock, leader election and observers on Apache Kafka: the description a
//! candidate's peers and `kafka-lock status` read (holder, queue, generation, coordinator), a
//! member with garbage metadata listed as undecodable, leadership passed on in order with an
//! observer reporting each leader, an observer that never makes the group rebalance, and the
//! ledger observer's push.

use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_lock::internals::assign::{NATIVE_PROTOCOL, PROTOCOL_TYPE};
use kafka_lock::internals::driver::Connection;
use kafka_lock::internals::wire::Response;
use kafka_lock::{
    Election, FencingToken, KafkaCode, Leadership, LockEvent, LockOptions, LockState, ObserveVia,
    MIN_OBSERVE_INTERVAL,
};
use kafka_protocol::messages::heartbeat_request::HeartbeatRequest;
use kafka_protocol::messages::join_group_request::{JoinGroupRequest, JoinGroupRequestProtocol};
use kafka_protocol::messages::sync_group_request::SyncGroupRequest;
use kafka_protocol::messages::{ApiKey, GroupId};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::{mpsc, oneshot};

use crate::support::brokers::SLACK;
use crate::support::kafka::admin::create_topic;
use crate::support::kafka::kafka;
use crate::support::kafka::probe::coordinator_connection;
use crate::support::{init_tracing, unique_group};

const HEARTBEAT: Duration = Duration::from_millis(500);
/// A handover: the leaver's LeaveGroup, one rebalance (bounded by the 6 s rebalance timeout of
/// members that miss it) and a SyncGroup, on a loaded machine.
const HANDOVER: Duration = Duration::from_secs(60);

fn opts(group: &str) -> LockOptions {
    LockOptions::new(kafka().bootstrap(), group)
        .session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(6))
        .heartbeat_interval(HEARTBEAT)
        .lease_margin(Duration::from_secs(1))
}

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

/// Starts a waiter on `group` and returns its task once it is queued.
async fn queued_waiter(
    group: &str,
    label: &str,
) -> tokio::task::JoinHandle<kafka_lock::Result<kafka_lock::LockGuard>> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let o = opts(group).label(label).events(tx);
    let task = tokio::spawn(async move { o.acquire(None).await });
    loop {
        match tokio::time::timeout(HEARTBEAT + SLACK, rx.recv()).await {
            Ok(Some(LockEvent::Waiting { .. })) => return task,
            Ok(Some(_)) => {}
            other => panic!("{label}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_names_holder_queue_generation_and_coordinator() {
    init_tracing();
    let group = unique_group("describe-lib");
    let free = opts(&group)
        .describe()
        .await
        .expect("describe an unused lock");
    assert_eq!(free.state, LockState::Free, "{free:?}");
    assert!(
        free.holders.is_empty() && free.waiters.is_empty(),
        "{free:?}"
    );

    let holder = opts(&group)
        .label("leader a")
        .acquire(Some(SLACK))
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for label in ["first waiter", "second waiter"] {
        waiters.push(queued_waiter(&group, label).await);
    }
    // The description and the holder's token agree once the holder has heard of the last
    // generation (each waiter's join made one).
    let deadline = Instant::now() + HEARTBEAT + SLACK;
    let d = loop {
        let d = opts(&group).describe().await.unwrap();
        if d.state == LockState::Held
            && d.waiters.len() == 2
            && d.generation == Some(holder.token().generation)
        {
            break d;
        }
        assert!(Instant::now() < deadline, "{d:#?} vs {:?}", holder.token());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let h = d.holder().expect("one holder");
    assert_eq!(h.member.member_id, holder.member_id());
    assert_eq!(h.member.label.as_deref(), Some("leader a"));
    assert_eq!(h.generation, Some(holder.token().generation));
    assert!(h.member.client_host.contains("127.0.0.1"), "{h:?}");
    let queue: Vec<_> = d
        .waiters
        .iter()
        .map(|w| (w.position, w.label.as_deref()))
        .collect();
    assert_eq!(
        queue,
        [
            (Some(1), Some("first waiter")),
            (Some(2), Some("second waiter"))
        ]
    );
    assert!(d.waiters.iter().all(|w| w.undecodable.is_none()), "{d:?}");
    let coordinator = coordinator_connection(&kafka().bootstrap(), &group)
        .await
        .unwrap();
    assert_eq!(d.coordinator, coordinator.peer());
    coordinator.close();
    assert_eq!(d.protocol_type, PROTOCOL_TYPE);
    assert_eq!(d.protocol_name, NATIVE_PROTOCOL);

    for w in waiters {
        w.abort();
    }
    holder.release().await.unwrap();
}

/// A member that joins with bytes no kafka-lock wrote: the leader's assignor rejects its
/// metadata (it can never hold), and the description lists it as undecodable without failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_member_is_listed_as_undecodable() {
    init_tracing();
    let group = unique_group("describe-junk");
    let holder = opts(&group)
        .label("holder")
        .acquire(Some(SLACK))
        .await
        .unwrap();
    let conn = coordinator_connection(&kafka().bootstrap(), &group)
        .await
        .unwrap();
    let (generation, member) = junk_join(&conn, &group).await;

    let deadline = Instant::now() + HEARTBEAT + SLACK;
    let d = loop {
        heartbeat(&conn, &group, generation, &member).await;
        let d = opts(&group)
            .describe()
            .await
            .expect("describe with junk inside");
        if d.state == LockState::Held && d.waiters.len() == 1 {
            break d;
        }
        assert!(Instant::now() < deadline, "{d:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(d.holder().unwrap().member.member_id, holder.member_id());
    let junk = &d.waiters[0];
    assert_eq!(junk.member_id, member);
    let why = junk.undecodable.as_deref().expect("undecodable");
    assert!(why.starts_with("metadata"), "{why}");
    assert!(holder.is_held());
    conn.close();
    holder.release().await.unwrap();
}

/// Joins `group` as a kafka-lock member whose metadata is junk; returns (generation, member id).
async fn junk_join(conn: &Connection, group: &str) -> (i32, String) {
    let mut p = JoinGroupRequestProtocol::default();
    p.name = sb(NATIVE_PROTOCOL);
    p.metadata = Bytes::from_static(b"\xde\xad\xbe\xef junk");
    let mut req = JoinGroupRequest::default();
    req.group_id = GroupId(sb(group));
    req.session_timeout_ms = 6000;
    req.rebalance_timeout_ms = 6000;
    req.protocol_type = sb(PROTOCOL_TYPE);
    req.protocols = vec![p];
    let mut member = String::new();
    let joined = loop {
        req.member_id = sb(&member);
        match conn.request_at(req.clone(), 5, HANDOVER).await {
            Ok(Response::JoinGroup(r)) if r.error_code == KafkaCode::MEMBER_ID_REQUIRED.0 => {
                member = r.member_id.to_string();
            }
            Ok(Response::JoinGroup(r)) if r.error_code == 0 => break r,
            other => panic!("JoinGroup: {other:?}"),
        }
    };
    let mut sync = SyncGroupRequest::default();
    sync.group_id = GroupId(sb(group));
    sync.generation_id = joined.generation_id;
    sync.member_id = joined.member_id.clone();
    sync.protocol_type = Some(sb(PROTOCOL_TYPE));
    sync.protocol_name = Some(sb(NATIVE_PROTOCOL));
    match conn.request_at(sync, 5, HANDOVER).await {
        Ok(Response::SyncGroup(r)) => assert_eq!(r.error_code, 0, "{r:?}"),
        other => panic!("SyncGroup: {other:?}"),
    }
    (joined.generation_id, joined.member_id.to_string())
}

async fn heartbeat(conn: &Connection, group: &str, generation: i32, member: &str) {
    let mut req = HeartbeatRequest::default();
    req.group_id = GroupId(sb(group));
    req.generation_id = generation;
    req.member_id = sb(member);
    match conn.request_at(req, 4, Duration::from_secs(10)).await {
        Ok(Response::Heartbeat(_)) => {}
        other => panic!("Heartbeat: {other:?}"),
    }
}

/// What a candidate task says and is told.
enum Order {
    /// Release the leadership and campaign again.
    Resign,
    /// Drop the guard without releasing and stop campaigning (a leader that goes away).
    Vanish,
}

struct Candidate {
    orders: mpsc::UnboundedSender<Order>,
    task: tokio::task::JoinHandle<()>,
}

/// A candidate campaigning term after term; reports (label, token, when it won, and a channel
/// telling when its term ended).
fn candidate(
    group: &str,
    label: &'static str,
    wins: mpsc::UnboundedSender<(
        &'static str,
        FencingToken,
        Instant,
        oneshot::Receiver<Instant>,
    )>,
) -> Candidate {
    let (orders_tx, mut orders) = mpsc::unbounded_channel();
    let mut election = Election::new(opts(group).label(label)).min_term(Duration::ZERO);
    let task = tokio::spawn(async move {
        loop {
            let leader = election.campaign().await.expect("campaign");
            let (ended_tx, ended_rx) = oneshot::channel();
            let _ = wins.send((label, leader.token(), Instant::now(), ended_rx));
            match orders.recv().await {
                Some(Order::Resign) => {
                    let _ = ended_tx.send(Instant::now());
                    leader.release().await.expect("resign");
                }
                Some(Order::Vanish) | None => {
                    let _ = ended_tx.send(Instant::now());
                    drop(leader);
                    return;
                }
            }
        }
    });
    Candidate {
        orders: orders_tx,
        task,
    }
}

/// Runs an observer, forwarding each report with the instant it arrived.
fn observe(
    o: kafka_lock::Observer,
) -> (
    mpsc::UnboundedReceiver<(Instant, Leadership)>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut o = o;
    let task = tokio::spawn(async move {
        loop {
            let l = o.next().await.expect("observe");
            if tx.send((Instant::now(), l)).is_err() {
                return;
            }
        }
    });
    (rx, task)
}

async fn next_report(
    rx: &mut mpsc::UnboundedReceiver<(Instant, Leadership)>,
) -> (Instant, Leadership) {
    tokio::time::timeout(HANDOVER, rx.recv())
        .await
        .expect("a report within the bound")
        .expect("the observer runs")
}

/// Three candidates; the leader resigns, then the next one vanishes: each time another becomes
/// leader with a greater token, and an observer that polls the coordinator reports every leader
/// in order, never before the previous one's term ended, and within its documented lag (one
/// interval plus a round trip, bounded here by the request timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_passes_on_in_order_and_an_observer_reports_each_leader() {
    init_tracing();
    let group = unique_group("elect");
    let (mut reports, observer) = observe(opts(&group).observer().interval(MIN_OBSERVE_INTERVAL));
    let (_, first) = next_report(&mut reports).await;
    assert_eq!(first.state, LockState::Free, "{first:?}");
    assert_eq!(first.via, ObserveVia::Describe);

    let (wins_tx, mut wins) = mpsc::unbounded_channel();
    let mut candidates = Vec::new();
    for label in ["a", "b", "c"] {
        candidates.push((label, candidate(&group, label, wins_tx.clone())));
    }
    let mut leaders = Vec::new();
    let mut last_token: Option<FencingToken> = None;
    let mut previous_end: Option<Instant> = None;
    for order in [Order::Resign, Order::Vanish, Order::Resign] {
        let (label, token, won_at, ended) = tokio::time::timeout(HANDOVER, wins.recv())
            .await
            .expect("a leader within the bound")
            .unwrap();
        if let Some(t) = &last_token {
            assert!(token > *t, "{t:?} then {token:?}");
        }
        // The observer reports this leader, after the previous term ended.
        let (seen_at, l) = loop {
            let (at, l) = next_report(&mut reports).await;
            if l.leader.is_some() {
                break (at, l);
            }
        };
        let leader = l.leader.as_ref().unwrap();
        assert_eq!(leader.member_id, token.member_id, "{l:?}");
        assert_eq!(leader.label.as_deref(), Some(label));
        assert_eq!(leader.generation, Some(token.generation));
        if let Some(end) = previous_end {
            assert!(
                seen_at > end,
                "{label} was reported before its predecessor's term ended"
            );
        }
        let lag = seen_at.saturating_duration_since(won_at);
        assert!(
            lag <= MIN_OBSERVE_INTERVAL + Duration::from_secs(5),
            "{label} reported {lag:?} after it won"
        );
        leaders.push(label);
        let who = &candidates.iter().find(|(l, _)| *l == label).unwrap().1;
        who.orders.send(order).unwrap();
        previous_end = Some(ended.await.expect("term end"));
        last_token = Some(token);
    }
    // Three terms, three distinct leaders in a row (each leaver rejoins at the back).
    assert_eq!(leaders.len(), 3);
    assert_ne!(leaders[0], leaders[1]);
    assert_ne!(leaders[1], leaders[2]);
    observer.abort();
    for (_, c) in candidates {
        c.task.abort();
    }
}

/// An observer polling ten times a second for a while: the holder's generation does not move
/// (no TokenChanged), so observing caused no rebalance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observing_causes_no_rebalance() {
    init_tracing();
    let group = unique_group("observe-quiet");
    let (tx, mut events) = mpsc::unbounded_channel();
    let holder = opts(&group).events(tx).acquire(Some(SLACK)).await.unwrap();
    let before = holder.token();
    let mut o = opts(&group).observer().interval(MIN_OBSERVE_INTERVAL);
    let first = o.next().await.unwrap();
    assert_eq!(first.leader.unwrap().member_id, before.member_id);
    // Twenty polls; the next report would be a change, which there must not be.
    let quiet = tokio::time::timeout(MIN_OBSERVE_INTERVAL * 20, o.next()).await;
    assert!(quiet.is_err(), "a change was reported: {quiet:?}");
    drop(o);
    assert_eq!(holder.token(), before);
    let d = opts(&group).describe().await.unwrap();
    assert_eq!(d.generation, Some(before.generation));
    while let Ok(ev) = events.try_recv() {
        assert!(!matches!(ev, LockEvent::TokenChanged { .. }), "{ev:?}");
    }
    holder.release().await.unwrap();
}

/// With a ledger, the observer follows the ledger: each hold is reported with its ledger token
/// as its ACQUIRED record is appended, and its end with the RELEASED record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_observer_reports_holds_as_they_are_recorded() {
    init_tracing();
    let bootstrap = kafka().bootstrap();
    let ledger = unique_group("observe-ledger");
    create_topic(&bootstrap, &ledger, 1);
    let group = unique_group("observe-ledger-lock");
    let o = opts(&group).ledger_topic(&ledger);
    let (mut reports, observer) = observe(o.observer());
    let (_, first) = next_report(&mut reports).await;
    assert_eq!(first.via, ObserveVia::Ledger);
    assert_eq!(first.state, LockState::Free);

    let mut last = -1;
    for _ in 0..2 {
        let g = o.acquire(Some(SLACK)).await.unwrap();
        let token = g.token().ledger_offset.expect("a ledger token");
        let (_, l) = next_report(&mut reports).await;
        let leader = l.leader.expect("held");
        assert_eq!(leader.ledger_token, Some(token));
        assert_eq!(leader.member_id, g.member_id());
        assert!(leader.since_unix_ms.is_some());
        assert!(token > last);
        last = token;
        // Described with the ledger, the holder carries the same token.
        let d = o.describe().await.unwrap();
        assert_eq!(
            d.holder().and_then(|h| h.ledger_token),
            Some(token),
            "{d:?}"
        );
        g.release().await.unwrap();
        let (_, l) = next_report(&mut reports).await;
        assert_eq!(l.state, LockState::Free, "{l:?}");
    }
    observer.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_of_an_unreachable_cluster_fails_at_once() {
    let mut o = LockOptions::new("127.0.0.1:9", "nowhere")
        .connect_timeout(Duration::from_millis(200))
        .observer();
    let e = tokio::time::timeout(HANDOVER, o.next())
        .await
        .expect("an answer")
        .unwrap_err();
    assert!(e.is_retriable(), "{e}");
}

/// A candidate for the benchmark: resigns when told, campaigns again after a loss.
fn bench_candidate(
    o: LockOptions,
    label: &'static str,
    wins: mpsc::UnboundedSender<(&'static str, FencingToken, Instant)>,
) -> (mpsc::UnboundedSender<()>, tokio::task::JoinHandle<()>) {
    let (resign_tx, mut resign) = mpsc::unbounded_channel::<()>();
    let mut election = Election::new(o.label(label)).min_term(Duration::ZERO);
    let task = tokio::spawn(async move {
        loop {
            let leader = election.campaign().await.expect("campaign");
            let _ = wins.send((label, leader.token(), Instant::now()));
            tokio::select! {
                r = resign.recv() => {
                    if r.is_none() {
                        return;
                    }
                    let _ = leader.release().await;
                }
                _ = leader.lost() => {}
            }
        }
    });
    (resign_tx, task)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn summary(xs: &[f64]) -> String {
    if xs.is_empty() {
        return "no samples".into();
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    format!(
        "n={} min={:.0} median={:.0} max={:.0} ms",
        v.len(),
        v[0],
        v[v.len() / 2],
        v[v.len() - 1]
    )
}

/// Leader failover (graceful resign, and a leader cut off from the network as a crashed host
/// is) and observer lag and load, in both modes. Each observer and candidate talks through
/// proxies of its own that count its requests. BENCHMARKS.md has the numbers and the command:
/// `cargo test --all-features --test it -- --ignored --nocapture election::bench`
/// (`KAFKA_LOCK_BENCH_ROUNDS`, default 6: three resigns and three crashes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark; run explicitly (BENCHMARKS.md)"]
async fn bench_failover_and_observer_lag() {
    use crate::fault::kproxy::{Dir, Fault, ProxySet};
    use std::net::SocketAddr;
    init_tracing();
    let rounds: usize = std::env::var("KAFKA_LOCK_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(6);
    let cluster = kafka();
    let bootstrap = cluster.bootstrap();
    let ledger = unique_group("bench-ledger");
    create_topic(&bootstrap, &ledger, 1);
    let group = unique_group("bench-elect");
    let brokers: Vec<(i32, SocketAddr)> = cluster
        .nodes()
        .iter()
        .map(|n| (n.id(), n.addr().parse().unwrap()))
        .collect();
    let handle = tokio::runtime::Handle::current();
    let on = |p: &ProxySet| {
        LockOptions::new(p.bootstrap(), &group)
            .session_timeout(Duration::from_secs(6))
            .rebalance_timeout(Duration::from_secs(6))
            .heartbeat_interval(HEARTBEAT)
            .lease_margin(Duration::from_secs(1))
            .ledger_topic(&ledger)
    };

    let started = Instant::now();
    let mut observers = Vec::new();
    for (name, interval, ledger_mode) in [
        ("describe, 1s interval", Duration::from_secs(1), false),
        ("describe, 100ms interval", MIN_OBSERVE_INTERVAL, false),
        ("ledger", Duration::from_secs(1), true),
    ] {
        let proxies = ProxySet::start(&handle, &brokers);
        let mut o = on(&proxies).observer().interval(interval);
        if !ledger_mode {
            o = o.via_describe();
        }
        let (rx, task) = observe(o);
        observers.push((name, proxies, rx, task, Vec::<f64>::new()));
    }
    let (wins_tx, mut wins) = mpsc::unbounded_channel();
    let mut candidates = Vec::new();
    for label in ["a", "b"] {
        let proxies = ProxySet::start(&handle, &brokers);
        let (resign, task) = bench_candidate(on(&proxies), label, wins_tx.clone());
        candidates.push((label, proxies, resign, task));
    }
    let mut resign_failover = Vec::new();
    let mut crash_failover = Vec::new();
    let mut win = tokio::time::timeout(HANDOVER, wins.recv())
        .await
        .unwrap()
        .unwrap();
    for round in 0..=rounds {
        let (label, token, won_at) = win.clone();
        for (name, _, rx, _, lags) in &mut observers {
            let (at, _) = loop {
                let (at, l) = next_report(rx).await;
                if l.leader
                    .as_ref()
                    .is_some_and(|x| x.member_id == token.member_id)
                {
                    break (at, l);
                }
            };
            let lag = if at >= won_at {
                ms(at - won_at)
            } else {
                -ms(won_at - at)
            };
            lags.push(lag);
            tracing::info!(%name, %label, lag_ms = lag, "observed");
        }
        if round == rounds {
            break;
        }
        let (_, proxies, resign, _) = candidates.iter().find(|c| c.0 == label).unwrap();
        let crash = round % 2 == 1;
        let t0 = Instant::now();
        if crash {
            proxies.set_all(Fault::Blackhole(Dir::Both));
        } else {
            resign.send(()).unwrap();
        }
        win = tokio::time::timeout(HANDOVER, wins.recv())
            .await
            .unwrap()
            .unwrap();
        assert_ne!(win.0, label);
        assert!(win.1 > token);
        let failover = ms(win.2 - t0);
        if crash {
            crash_failover.push(failover);
            proxies.set_all(Fault::Clear);
        } else {
            resign_failover.push(failover);
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    // The cost of watching a lock where nothing happens: requests over an idle window.
    let snapshot = |observers: &Vec<(&str, ProxySet, _, _, Vec<f64>)>| -> Vec<u64> {
        observers
            .iter()
            .map(|o| o.1.stats().requests.lock().unwrap().values().sum())
            .collect()
    };
    let during: Vec<std::collections::HashMap<i16, u64>> = observers
        .iter()
        .map(|o| o.1.stats().requests.lock().unwrap().clone())
        .collect();
    let idle_before = snapshot(&observers);
    let idle = Duration::from_secs(20);
    tokio::time::sleep(idle).await;
    let idle_after = snapshot(&observers);
    println!("election benchmark: {rounds} handovers in {elapsed:.1} s, session timeout 6 s, heartbeat 500 ms");
    println!(
        "failover after a resign:             {}",
        summary(&resign_failover)
    );
    println!(
        "failover after the leader is cut off: {}",
        summary(&crash_failover)
    );
    for (i, (name, _, _, task, lags)) in observers.iter().enumerate() {
        task.abort();
        println!(
            "observer {name}: idle {:.2} requests/s",
            (idle_after[i] - idle_before[i]) as f64 / idle.as_secs_f64()
        );
        let counts = &during[i];
        let total: u64 = counts.values().sum();
        let per_s = |k: ApiKey| *counts.get(&(k as i16)).unwrap_or(&0) as f64 / elapsed;
        println!(
            "observer {name}: lag {} ; {:.2} requests/s ({:.2} DescribeGroups/s, {:.2} Fetch/s, {total} requests in all)",
            summary(lags),
            total as f64 / elapsed,
            per_s(ApiKey::DescribeGroups),
            per_s(ApiKey::Fetch),
        );
    }
    for (_, _, resign, task) in candidates {
        drop(resign);
        task.abort();
    }
}

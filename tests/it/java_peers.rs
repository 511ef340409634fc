//! The seed design's lock, Java KafkaConsumers on a one-partition topic, on a real Apache Kafka
//! broker: what kafka-lock is measured against and must share a lock with, in
//! consumer-compatible mode, with the Java consumer's default assignors and with
//! `cooperative-sticky` alone.

use std::time::{Duration, Instant};

use kafka_lock::{LockEvent, LockOptions};
use tokio::sync::mpsc;
use tokio::task::block_in_place;

use crate::support::holds::Holds;
use crate::support::kafka::admin::{create_topic, describe_group};
use crate::support::kafka::peer::{Assignors, PeerEventKind, SeedPeer, SeedPeerOptions};
use crate::support::kafka::{kafka, probe};
use crate::support::{init_tracing, mono_ns, unique_group};

const BOUND: Duration = Duration::from_secs(60);

/// Options for a fast peer on the shared broker: the broker's minimum session (6 s) and a short
/// heartbeat, so a handover takes under a second.
fn fast_peer(topic: &str, client_id: &str) -> SeedPeerOptions {
    SeedPeerOptions {
        client_id: Some(client_id.to_owned()),
        session_timeout: Duration::from_secs(6),
        heartbeat_interval: Duration::from_millis(500),
        ..SeedPeerOptions::new(&kafka().bootstrap(), topic)
    }
}

fn new_lock_topic(prefix: &str) -> String {
    let topic = unique_group(prefix);
    create_topic(&kafka().bootstrap(), &topic, 1);
    topic
}

/// HotSpot on Linux implements System.nanoTime with clock_gettime(CLOCK_MONOTONIC): a reading
/// the peer takes between two of ours must fall between them. CLOCK_MONOTONIC_RAW and
/// CLOCK_REALTIME differ from CLOCK_MONOTONIC by far more than the bracket on a machine that
/// has been up a while (the former by NTP's accumulated slew); CLOCK_BOOTTIME equals it until
/// the machine first suspends, so only that one this check cannot tell apart.
#[test]
fn java_nano_time_is_clock_monotonic() {
    let topic = new_lock_topic("java-clock");
    let mut peer = SeedPeer::start(&fast_peer(&topic, "clock"));
    peer.wait_for(PeerEventKind::Started, BOUND);
    for _ in 0..5 {
        let before = mono_ns();
        let java = peer.now();
        let after = mono_ns();
        assert!(
            before <= java && java <= after,
            "System.nanoTime() {java} is not within CLOCK_MONOTONIC [{before}, {after}]"
        );
    }
    peer.quit(BOUND);
}

/// Two seed-design peers on one lock: while both are members exactly one holds partition 0,
/// and when the holder closes (LeaveGroup) the other takes over, never overlapping.
#[test]
fn two_seed_peers_never_hold_at_once_and_hand_over_on_close() {
    let topic = new_lock_topic("java-two");
    // Range gives partition 0 to the member id that sorts first, and member ids start with the
    // client id: "a-..." keeps the lock when "b-..." joins.
    let mut a = SeedPeer::start(&fast_peer(&topic, "a-holder"));
    let first = a.wait_for(PeerEventKind::Acquired, BOUND);

    let mut b = SeedPeer::start(&fast_peer(&topic, "b-waiter"));
    b.wait_for(PeerEventKind::Started, BOUND);
    // B's join rebalances the group; eager range revokes A's partition and gives it back.
    let again = loop {
        let e = a.wait_for(PeerEventKind::Acquired, BOUND);
        if e.generation > first.generation {
            break e;
        }
    };
    let group = describe_group(&kafka().bootstrap(), &topic).expect("describe the lock group");
    assert_eq!(group.state, "Stable", "{group:?}");
    assert_eq!(
        (group.protocol_type.as_str(), group.protocol.as_str()),
        ("consumer", "range"),
        "{group:?}"
    );
    assert_eq!(group.members.len(), 2, "{group:?}");
    let holders: Vec<_> = group
        .members
        .iter()
        .filter(|m| m.partitions == [(topic.clone(), 0)])
        .collect();
    assert_eq!(holders.len(), 1, "{group:?}");
    assert_eq!(
        Some(&holders[0].member_id),
        again.member_id.as_ref(),
        "{group:?}"
    );

    let closed = a.quit(BOUND);
    let taken = b.wait_for(PeerEventKind::Acquired, BOUND);
    let released = a
        .events()
        .iter()
        .rev()
        .find(|e| e.kind == PeerEventKind::Revoked)
        .expect("close() revokes the partition first")
        .clone();
    eprintln!(
        "handover: A revoked at +0, closed at +{:.1} ms, B acquired at +{:.1} ms (generation {:?} -> {:?})",
        (closed.mono_ns - released.mono_ns) as f64 / 1e6,
        (taken.mono_ns - released.mono_ns) as f64 / 1e6,
        again.generation,
        taken.generation
    );
    assert!(taken.generation > again.generation);
    b.drain();
    for x in a.held_intervals() {
        for y in b.held_intervals() {
            assert!(
                x.1 <= y.0 || y.1 <= x.0,
                "holders overlap: A {x:?} vs B {y:?}\nA: {:?}\nB: {:?}",
                a.events(),
                b.events()
            );
        }
    }
    b.quit(BOUND);
}

/// With cooperative-sticky only, a member that joins later does not take the lock, whatever its
/// member id, and the holder is not even asked to give it back: the contrast with Java's
/// default (range first), where every join revokes the lock for a moment and the smallest
/// member id wins.
#[test]
fn cooperative_sticky_holder_keeps_the_lock_when_another_joins() {
    let topic = new_lock_topic("java-sticky");
    let sticky = |client_id: &str| SeedPeerOptions {
        assignors: Assignors::CooperativeSticky,
        ..fast_peer(&topic, client_id)
    };
    // "z-..." sorts after "a-...": range would hand the lock to the newcomer.
    let mut holder = SeedPeer::start(&sticky("z-holder"));
    holder.wait_for(PeerEventKind::Acquired, BOUND);
    let mut newcomer = SeedPeer::start(&sticky("a-newcomer"));
    newcomer.wait_for(PeerEventKind::Started, BOUND);

    let deadline = Instant::now() + BOUND;
    // Polling the group: the peers report no event for a join that leaves their partitions
    // alone. Each describe is a JVM run of about two seconds, so the loop needs no pause.
    let group = loop {
        let group = describe_group(&kafka().bootstrap(), &topic).expect("describe");
        if group.state == "Stable" && group.members.len() == 2 {
            break group;
        }
        assert!(
            Instant::now() < deadline,
            "the newcomer never joined: {group:?}"
        );
    };
    assert_eq!(group.protocol, "cooperative-sticky", "{group:?}");
    let holding: Vec<&str> = group
        .members
        .iter()
        .filter(|m| !m.partitions.is_empty())
        .map(|m| m.client_id.as_str())
        .collect();
    assert_eq!(holding, ["z-holder"], "{group:?}");
    let kinds: Vec<PeerEventKind> = holder.drain().iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [PeerEventKind::Started, PeerEventKind::Acquired],
        "the holder was disturbed"
    );

    holder.quit(BOUND);
    newcomer.wait_for(PeerEventKind::Acquired, BOUND);
    newcomer.quit(BOUND);
}

/// kafka-lock in consumer-compatible mode on `topic`, with the Java peers' timeouts.
fn lock_options(topic: &str) -> LockOptions {
    LockOptions::new(kafka().bootstrap(), topic)
        .consumer_topic(topic)
        .session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(500))
}

/// A Java peer with Java's own default client id (`consumer-<group>-<n>`): its member ids sort
/// before kafka-lock's (`kafka-lock-...`), so the range assignor prefers it.
fn java_peer(topic: &str, assignors: Assignors) -> SeedPeer {
    let options = SeedPeerOptions {
        client_id: None,
        assignors,
        ..fast_peer(topic, "unused")
    };
    let mut peer = SeedPeer::start(&options);
    peer.wait_for(PeerEventKind::Started, BOUND);
    peer
}

/// The peer's holds, for the checker.
fn add_java_holds(holds: &Holds, peer: &SeedPeer) {
    let acquired: Vec<_> = peer
        .events()
        .iter()
        .filter(|e| e.kind == PeerEventKind::Acquired)
        .collect();
    for ((start, end), a) in peer.held_intervals().into_iter().zip(acquired) {
        holds.add_external("java", start, end, a.generation);
    }
}

/// Waits for a kafka-lock event matching `pred`, failing on `Acquired` when `never_acquire`.
async fn lock_event(
    rx: &mut mpsc::UnboundedReceiver<LockEvent>,
    what: &str,
    pred: impl Fn(&LockEvent) -> bool,
) -> LockEvent {
    loop {
        match tokio::time::timeout(BOUND, rx.recv()).await {
            Ok(Some(e)) if pred(&e) => return e,
            Ok(Some(_)) => {}
            other => panic!("kafka-lock: no {what}: {other:?}"),
        }
    }
}

/// A Java peer holds; kafka-lock joins, waits without disturbing it, and gets the lock when the
/// peer closes (LeaveGroup). With the default assignors the group runs range (both offer it and
/// the vote is tied, which Apache breaks towards `range`), and the peer's member id sorts first,
/// so it keeps partition 0 through the eager rebalance; with cooperative-sticky alone the group
/// runs cooperative-sticky and the peer is not even asked to give the partition back.
async fn java_holds_then_kafka_lock_takes_over_on_close(assignors: Assignors) {
    init_tracing();
    let topic = unique_group("java-to-lock");
    probe::create_topic(&kafka().bootstrap(), &topic, 1);
    let holds = Holds::new();
    let mut java = block_in_place(|| {
        let mut p = java_peer(&topic, assignors);
        p.wait_for(PeerEventKind::Acquired, BOUND);
        p
    });
    let (options, mut rx) = holds.record("kafka-lock", lock_options(&topic));
    let acquire = tokio::spawn({
        let o = options.clone();
        async move { o.acquire(None).await }
    });
    lock_event(&mut rx, "wait behind the Java holder", |e| match e {
        LockEvent::Acquired { .. } => panic!("kafka-lock took the lock from a running Java holder"),
        e => matches!(e, LockEvent::Waiting { .. }),
    })
    .await;
    let group = block_in_place(|| describe_group(&kafka().bootstrap(), &topic)).unwrap();
    eprintln!("{assignors:?}: the group runs {:?}", group.protocol);
    let want = match assignors {
        Assignors::JavaDefault => "range",
        Assignors::CooperativeSticky => "cooperative-sticky",
    };
    assert_eq!(group.protocol, want, "{group:?}");
    let revoked = java
        .drain()
        .iter()
        .filter(|e| e.kind == PeerEventKind::Revoked)
        .count();
    match assignors {
        // Eager: the peer gave partition 0 up for the rebalance and got it back.
        Assignors::JavaDefault => assert!(revoked >= 1, "{:?}", java.events()),
        Assignors::CooperativeSticky => assert_eq!(revoked, 0, "{:?}", java.events()),
    }
    let closed_at = mono_ns();
    block_in_place(|| java.quit(BOUND));
    let guard = tokio::time::timeout(BOUND, acquire)
        .await
        .expect("kafka-lock takes over after the Java peer closed")
        .unwrap()
        .expect("acquired");
    eprintln!(
        "{assignors:?}: Java closed, kafka-lock held {:.1} ms later",
        (mono_ns() - closed_at) as f64 / 1e6
    );
    guard.release().await.unwrap();
    add_java_holds(&holds, &java);
    holds.check_when_ended(BOUND).await;
}

/// kafka-lock holds; a Java peer whose member id sorts first joins. kafka-lock keeps the lock:
/// while it holds it offers only `cooperative-sticky`, so the group runs the cooperative protocol
/// and the sticky assignment keeps partition 0 with its owner, whoever leads. On release the
/// peer takes over.
async fn kafka_lock_holds_then_java_takes_over_on_release(assignors: Assignors) {
    init_tracing();
    let topic = unique_group("lock-to-java");
    probe::create_topic(&kafka().bootstrap(), &topic, 1);
    let holds = Holds::new();
    let (options, mut rx) = holds.record("kafka-lock", lock_options(&topic));
    let guard = options.acquire(Some(BOUND)).await.expect("a free lock");
    let mut java = block_in_place(|| java_peer(&topic, assignors));
    // The peer's join rebalances the group; wait until the peer is a member of a stable group.
    let deadline = Instant::now() + BOUND;
    let group = loop {
        let g = block_in_place(|| describe_group(&kafka().bootstrap(), &topic)).unwrap();
        if g.state == "Stable" && g.members.len() == 2 {
            break g;
        }
        assert!(
            Instant::now() < deadline,
            "no stable group of kafka-lock and the peer: {g:?}; kafka-lock holds: {}, {:?}",
            guard.is_held(),
            options.stats()
        );
    };
    eprintln!("{assignors:?}: the group runs {:?}", group.protocol);
    let holding: Vec<&str> = group
        .members
        .iter()
        .filter(|m| !m.partitions.is_empty())
        .map(|m| m.client_id.as_str())
        .collect();
    assert_eq!(holding, ["kafka-lock"], "{group:?}");
    assert_eq!(group.protocol, "cooperative-sticky", "{group:?}");
    assert!(guard.is_held(), "kafka-lock lost the lock to the newcomer");
    assert_eq!(options.stats().losses, vec![], "{:?}", options.stats());
    while let Ok(e) = rx.try_recv() {
        assert!(!matches!(e, LockEvent::Lost { .. }), "{e:?}");
    }
    let released_at = mono_ns();
    guard.release().await.unwrap();
    let taken = block_in_place(|| java.wait_for(PeerEventKind::Acquired, BOUND));
    eprintln!(
        "{assignors:?}: kafka-lock released, Java held {:.1} ms later",
        (taken.mono_ns - released_at) as f64 / 1e6
    );
    block_in_place(|| java.quit(BOUND));
    add_java_holds(&holds, &java);
    holds.check_when_ended(BOUND).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_default_holds_then_kafka_lock_takes_over_on_close() {
    java_holds_then_kafka_lock_takes_over_on_close(Assignors::JavaDefault).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_cooperative_holds_then_kafka_lock_takes_over_on_close() {
    java_holds_then_kafka_lock_takes_over_on_close(Assignors::CooperativeSticky).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_lock_holds_then_java_default_takes_over_on_release() {
    kafka_lock_holds_then_java_takes_over_on_release(Assignors::JavaDefault).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_lock_holds_then_java_cooperative_takes_over_on_release() {
    kafka_lock_holds_then_java_takes_over_on_release(Assignors::CooperativeSticky).await;
}

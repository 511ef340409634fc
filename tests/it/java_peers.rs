//! The seed design's lock, Java KafkaConsumers on a one-partition topic, on a real Apache Kafka
//! broker: what kafka-lock is measured against and must share a lock with.

use std::time::{Duration, Instant};

use crate::support::kafka::admin::{create_topic, describe_group};
use crate::support::kafka::kafka;
use crate::support::kafka::peer::{Assignors, PeerEventKind, SeedPeer, SeedPeerOptions};
use crate::support::{mono_ns, unique_group};

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

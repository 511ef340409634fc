//! Tests of the Apache Kafka support: the shared broker answers, a broker cannot outlive the
//! test process, the three-node cluster moves a group's coordinator when its node dies, and the
//! admin helpers work.

use std::time::{Duration, Instant};

use super::admin::{create_topic, delete_group, describe_group};
use super::probe::{find_coordinator, group_on_partition};
use super::*;
use crate::support::selftest::{refuses_connections, spawn_holder, wait_until};
use crate::support::{pid_alive, unique_group};

/// Set in the child process of `private_kafka_dies_with_sigkilled_test_process`.
const HOLD_ENV: &str = "KAFKA_LOCK_SELFTEST_HOLD_KAFKA";

#[test]
fn shared_apache_broker_answers_find_coordinator() {
    let a = kafka();
    assert!(
        std::ptr::eq(a, kafka()),
        "kafka() must return one shared broker"
    );
    assert_eq!(a.nodes().len(), 1);
    assert_eq!(a.bootstrap(), format!("127.0.0.1:{}", a.port()));
    let found = find_coordinator(&a.bootstrap(), &unique_group("selftest-fc"))
        .expect("FindCoordinator answers with no error");
    assert_eq!(
        (found.node_id, found.host.as_str(), found.port),
        (1, "127.0.0.1", a.port())
    );
    assert!(pid_alive(a.nodes()[0].pid().expect("running")));
}

#[test]
fn admin_helpers_create_describe_and_delete() {
    let bootstrap = kafka().bootstrap();
    let topic = unique_group("selftest-admin");
    create_topic(&bootstrap, &topic, 1);
    let again = std::panic::catch_unwind(|| create_topic(&bootstrap, &topic, 1));
    assert!(again.is_err(), "creating an existing topic must fail");

    let missing = unique_group("selftest-nogroup");
    let err = describe_group(&bootstrap, &missing).unwrap_err();
    assert!(err.contains("GroupIdNotFoundException"), "{err}");
    let err = delete_group(&bootstrap, &missing).unwrap_err();
    assert!(err.contains("GroupIdNotFoundException"), "{err}");
}

/// The two shared brokers differ in `group.initial.rebalance.delay.ms` (0 and 3000): the first
/// member of a new group waits that long for its assignment.
#[test]
fn default_delay_broker_delays_the_first_join() {
    let first_join = |broker: &KafkaCluster| {
        let topic = unique_group("selftest-delay");
        create_topic(&broker.bootstrap(), &topic, 1);
        let mut p = peer::SeedPeer::start(&peer::SeedPeerOptions::new(&broker.bootstrap(), &topic));
        let started = p.wait_for(peer::PeerEventKind::Started, Duration::from_secs(60));
        let acquired = p.wait_for(peer::PeerEventKind::Acquired, Duration::from_secs(60));
        p.quit(Duration::from_secs(30));
        Duration::from_nanos((acquired.mono_ns - started.mono_ns) as u64)
    };
    let (delayed, immediate) = std::thread::scope(|s| {
        let delayed = s.spawn(|| first_join(kafka_default_delay()));
        let immediate = first_join(kafka());
        (delayed.join().expect("delayed peer"), immediate)
    });
    eprintln!(
        "first join to assignment: {delayed:?} with the 3000 ms delay, {immediate:?} without"
    );
    assert!(!std::ptr::eq(kafka(), kafka_default_delay()));
    assert!(delayed >= Duration::from_secs(3), "{delayed:?}");
    // Both include the same client start-up; only one includes the 3 s wait.
    assert!(
        immediate + Duration::from_secs(2) < delayed,
        "{immediate:?} vs {delayed:?}"
    );
}

#[test]
fn missing_java_or_jars_name_the_install_script() {
    let err = check_libs(Path::new("/nonexistent/kafka-lock/libs")).unwrap_err();
    assert!(err.contains("scripts/install-test-deps.sh"), "{err}");
    let empty = crate::support::kafka::scratch::ScratchDir::new("selftest-empty-libs");
    let err = check_libs(empty.path()).unwrap_err();
    assert!(
        err.contains("kafka_2.13-") && err.contains("scripts/install-test-deps.sh"),
        "{err}"
    );
}

#[test]
fn java_versions_parse() {
    let v = |s| java_major_version(s);
    assert_eq!(v("openjdk version \"17.0.15\" 2025-04-15"), Some(17));
    assert_eq!(v("openjdk version \"25\" 2025-09-16"), Some(25));
    assert_eq!(v("java version \"1.8.0_402\""), Some(8));
    assert_eq!(v("openjdk version \"21-ea\" 2023-09-19"), Some(21));
    assert_eq!(v("no version here"), None);
}

#[test]
fn private_kafka_dies_with_sigkilled_test_process() {
    let (mut child, fields) =
        spawn_holder("support::kafka::selftest::hold_private_kafka", HOLD_ENV);
    let [port, pid, dir] = &fields[..] else {
        panic!("bad HOLDING line {fields:?}");
    };
    let (port, pid, dir): (u16, u32, &Path) =
        (port.parse().unwrap(), pid.parse().unwrap(), Path::new(dir));
    assert!(pid_alive(pid));
    assert!(dir.is_dir());
    find_coordinator(&format!("127.0.0.1:{port}"), "selftest").expect("the child's broker answers");

    child.kill().expect("SIGKILL the child test process");
    child.wait().expect("reap the child test process");

    assert!(
        wait_until(Duration::from_secs(10), || !pid_alive(pid)),
        "Kafka pid {pid} outlived its SIGKILLed test process"
    );
    assert!(
        wait_until(Duration::from_secs(10), || refuses_connections(port)),
        "port {port} still accepts connections"
    );
    assert!(
        wait_until(Duration::from_secs(10), || !dir.exists()),
        "{} outlived its SIGKILLed test process",
        dir.display()
    );
}

/// The child half of `private_kafka_dies_with_sigkilled_test_process`.
#[test]
#[ignore = "run by private_kafka_dies_with_sigkilled_test_process in a child process"]
fn hold_private_kafka() {
    if std::env::var_os(HOLD_ENV).is_none() {
        return;
    }
    let k = KafkaCluster::start(KafkaOptions::single_node());
    println!(
        "HOLDING {} {} {}",
        k.port(),
        k.nodes()[0].pid().expect("running"),
        k.dir().display()
    );
    // Block until the parent kills us (or, if the parent dies first, until stdin closes).
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
}

#[test]
fn three_node_cluster_moves_a_coordinator_off_a_killed_node() {
    let mut cluster = KafkaCluster::start(KafkaOptions::three_nodes());
    let ids: Vec<i32> = cluster.nodes().iter().map(|n| n.id()).collect();
    assert_eq!(ids, [1, 2, 3]);
    assert_eq!(cluster.bootstrap().split(',').count(), 3);
    let group = unique_group("selftest-failover");
    let old = cluster.coordinator(&group);
    // Every live node agrees.
    for node in cluster.nodes() {
        let found = find_coordinator(&node.addr(), &group).expect("FindCoordinator");
        assert_eq!(found.node_id, old, "asked node {}", node.id());
    }

    let killed_at = Instant::now();
    cluster.kill(old);
    let new = cluster.wait_for_new_coordinator(&group, old);
    eprintln!(
        "coordinator of {group} moved from node {old} to node {new} {:?} after SIGKILL",
        killed_at.elapsed()
    );
    assert_ne!(new, old);
    assert!(cluster.node(new).is_live());

    cluster.restart(old);
    assert!(cluster.node(old).is_live());
    // Leadership stays where it moved (auto.leader.rebalance.enable=false), and the restarted
    // node answers for it.
    let found = find_coordinator(&cluster.node(old).addr(), &group).expect("FindCoordinator");
    assert_eq!(found.node_id, new);

    // The restarted node leads nothing now; the spread gives every node one offsets partition.
    cluster.spread_offsets_leaders();
    let partitions = cluster.offsets_partitions();
    let leaders: std::collections::BTreeSet<i32> = (0..partitions)
        .map(|p| cluster.coordinator(&group_on_partition("selftest-spread", p, partitions)))
        .collect();
    assert_eq!(leaders.len(), 3, "{leaders:?}");
}

#[test]
fn three_node_cluster_pauses_and_stops_a_node() {
    let mut cluster = KafkaCluster::start(KafkaOptions::three_nodes());
    let group = unique_group("selftest-pause");
    let old = cluster.coordinator(&group);

    // A paused coordinator goes silent: the controller fences it like a dead one.
    cluster.pause(old);
    assert!(!cluster.node(old).is_live());
    let new = cluster.wait_for_new_coordinator(&group, old);
    cluster.resume(old);
    assert!(cluster.node(old).is_live());
    // The resumed node was dropped from the in-sync replicas; until it is back, stopping the
    // new coordinator would leave the group's partition without a leader.
    cluster.wait_for_full_isr();

    // A controlled shutdown hands the leadership over before the node exits.
    let took = cluster.terminate(new, Duration::from_secs(120));
    eprintln!("node {new} shut down (SIGTERM) in {took:?}");
    assert!(cluster.node(new).pid().is_none());
    let third = cluster.wait_for_new_coordinator(&group, new);
    assert_ne!(third, new);
    cluster.restart(new);
}

/// The numbers in docs/testing.md: start-up time (spawn to FindCoordinator answered) and
/// resident memory of each JVM, single node and three nodes, and a killed node's restart.
///
/// `cargo test --all-features --test it -- --ignored --nocapture measure_apache_kafka`
#[test]
#[ignore = "a measurement, run by hand"]
fn measure_apache_kafka() {
    for options in [KafkaOptions::single_node(), KafkaOptions::three_nodes()] {
        let began = Instant::now();
        let mut cluster = KafkaCluster::start(options);
        let total = began.elapsed();
        let n = cluster.nodes().len();
        let report = |cluster: &KafkaCluster, when: &str| {
            for node in cluster.nodes() {
                println!(
                    "{n} node(s), node {}: FindCoordinator answered {:.2} s after spawn; RSS {when}: {} MiB",
                    node.id(),
                    node.startup_time().expect("ready").as_secs_f64(),
                    node.rss_kib().expect("running") / 1024
                );
            }
        };
        println!(
            "{n} node(s): start() took {:.2} s (format, spawn, FindCoordinator, full ISR)",
            total.as_secs_f64()
        );
        report(&cluster, "when ready");
        // Memory once the brokers have settled, after a lock group has been used.
        let topic = unique_group("measure");
        admin::create_topic(&cluster.bootstrap(), &topic, 1);
        let mut peer =
            peer::SeedPeer::start(&peer::SeedPeerOptions::new(&cluster.bootstrap(), &topic));
        peer.wait_for(peer::PeerEventKind::Acquired, Duration::from_secs(60));
        println!(
            "SeedLockPeer JVM: RSS {} MiB",
            rss_kib(peer.pid()).unwrap_or(0) / 1024
        );
        peer.quit(Duration::from_secs(30));
        // Not a synchronisation: the memory of interest is the settled one, some time after the
        // start-up burst.
        std::thread::sleep(Duration::from_secs(20));
        report(&cluster, "20 s later");
        if n > 1 {
            cluster.kill(1);
            let began = Instant::now();
            cluster.restart(1);
            println!(
                "3 node(s): killed node 1 restarted: FindCoordinator answered {:.2} s after \
                 spawn, restart() (with full ISR) took {:.2} s",
                cluster.node(1).startup_time().expect("ready").as_secs_f64(),
                began.elapsed().as_secs_f64()
            );
        }
    }
}

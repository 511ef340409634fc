//! The ledger on Apache Kafka: tokens that keep increasing across group deletion and coordinator
//! failover, a checkpoint the broker fences, history that tells the truth after crashes, the
//! refusal of a ledger topic with two partitions, and the waiters' push.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kafka_lock::driver::{ConnConfig, Connection};
use kafka_lock::ledger::LedgerError;
use kafka_lock::wire::coordinator::{find_coordinator_request, found_coordinator};
use kafka_lock::wire::Response;
use kafka_lock::{CheckpointSource, Error, FencingToken, HoldEnd, LockEvent, LockOptions};
use kafka_protocol::messages::leave_group_request::{LeaveGroupRequest, MemberIdentity};
use kafka_protocol::messages::{ApiKey, GroupId};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::mpsc;

use crate::support::kafka::admin::{create_topic, delete_group};
use crate::support::kafka::{kafka, KafkaCluster, KafkaOptions};
use crate::support::{self, ChildGuard};

/// Anything that involves a rebalance or a broker's answer, generously.
const BOUND: Duration = Duration::from_secs(60);

/// Apache's minimum session, a short heartbeat: a crashed holder is replaced within seconds.
fn opts(bootstrap: &str, group: &str, ledger: &str) -> LockOptions {
    LockOptions::new(bootstrap, group)
        .session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(500))
        .lease_margin(Duration::from_secs(1))
        .ledger_topic(ledger)
}

fn new_ledger(bootstrap: &str, prefix: &str) -> String {
    let topic = support::unique_group(prefix);
    create_topic(bootstrap, &topic, 1);
    topic
}

async fn hold_once(o: &LockOptions) -> FencingToken {
    let guard = o.acquire(Some(BOUND)).await.expect("acquire");
    let token = guard.token();
    assert!(guard.is_held());
    guard.release().await.expect("release");
    token
}

/// The generation restarts at 1 when the group is deleted; the ledger token does not. Breaks if
/// the token were the generation, or if the ledger offset were not what `Ord` compares first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_across_a_group_deletion() {
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let ledger = new_ledger(&bootstrap, "ledger-del");
    let group = support::unique_group("ledger-del-lock");
    let o = opts(&bootstrap, &group, &ledger);

    let t1 = hold_once(&o).await;
    let t2 = hold_once(&o).await;
    assert!(t1.ledger_offset.is_some(), "{t1:?}");
    assert!(t2 > t1, "{t1:?} then {t2:?}");
    assert!(t2.generation > t1.generation, "{t1:?} then {t2:?}");

    // The group is empty after the release; an administrator deletes it (the broker does the same
    // on its own 0-10 minutes after it empties, when it has no committed offsets).
    delete_group(&bootstrap, &group).expect("delete the empty group");
    let t3 = hold_once(&o).await;
    assert!(
        t3.generation <= t1.generation,
        "the group was not deleted: generation {} after {} and {}",
        t3.generation,
        t1.generation,
        t2.generation
    );
    assert!(
        t3 > t2,
        "the token went backwards across the deletion: {t2:?} then {t3:?}"
    );
    assert!(t3.ledger_offset > t2.ledger_offset);

    // Every hold is in the history, released, in token order.
    let h = o.history().await.expect("history");
    let got: Vec<(i64, &str)> = h.holds.iter().map(|x| (x.token, x.end.name())).collect();
    let want: Vec<(i64, &str)> = [&t1, &t2, &t3]
        .iter()
        .map(|t| (t.value(), "released"))
        .collect();
    assert_eq!(got, want);
}

/// A ledger topic with two partitions could hand out unrelated offsets: it is refused before
/// the lock is joined, and so is a topic that does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_topic_with_two_partitions_is_refused() {
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let two = support::unique_group("ledger-two");
    create_topic(&bootstrap, &two, 2);
    let group = support::unique_group("ledger-two-lock");
    let err = opts(&bootstrap, &group, &two)
        .acquire(Some(BOUND))
        .await
        .expect_err("a two-partition ledger must be refused");
    assert!(
        matches!(
            err,
            Error::Ledger(LedgerError::NotOnePartition { partitions: 2, .. })
        ),
        "{err}"
    );
    let missing = support::unique_group("ledger-missing");
    let err = opts(&bootstrap, &group, &missing)
        .acquire(Some(BOUND))
        .await
        .expect_err("a missing ledger must be refused");
    assert!(
        matches!(err, Error::Ledger(LedgerError::TopicMissing { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("--partitions 1"), "{err}");
}

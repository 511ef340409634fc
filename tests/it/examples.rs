//! The programs in examples/, run against the test brokers: users start from them, so they must
//! work, not only compile. Each example keeps its logic in a `run` function that its `main`
//! calls with the command line; these tests call `run` with the test broker.

use std::time::Duration;

use kafka_lock::{LockOptions, Release};

use crate::support;
use crate::support::brokers::{on_brokers, Broker};

#[allow(dead_code)] // `main`: the command line, which the tests do not use.
#[path = "../../examples/basic.rs"]
mod basic;
#[allow(dead_code)]
#[path = "../../examples/fenced_write.rs"]
mod fenced_write;
#[allow(dead_code)]
#[path = "../../examples/graceful_shutdown.rs"]
mod graceful_shutdown;

on_brokers!(basic_takes_works_and_releases: apache, tansu);
async fn basic_takes_works_and_releases(broker: Broker) {
    let group = support::unique_group("example-basic");
    let release = basic::run(&broker.bootstrap(), &group).await.unwrap();
    assert_eq!(release, Release::Confirmed);
}

on_brokers!(fenced_write_refuses_the_former_holders_late_write: apache, tansu);
async fn fenced_write_refuses_the_former_holders_late_write(broker: Broker) {
    let group = support::unique_group("example-fenced");
    let kept = fenced_write::run(LockOptions::new(broker.bootstrap(), &group))
        .await
        .unwrap();
    assert_eq!(kept, "second holder");
}

on_brokers!(fenced_write_with_a_ledger: apache);
async fn fenced_write_with_a_ledger(broker: Broker) {
    let group = support::unique_group("example-fenced-ledger");
    let topic = format!("{group}-ledger");
    broker.create_topic(&topic, 1);
    let options = LockOptions::new(broker.bootstrap(), &group).ledger_topic(topic);
    let kept = fenced_write::run(options).await.unwrap();
    assert_eq!(kept, "second holder");
}

on_brokers!(graceful_shutdown_stops_the_worker_and_releases: apache, tansu);
async fn graceful_shutdown_stops_the_worker_and_releases(broker: Broker) {
    let group = support::unique_group("example-shutdown");
    // In place of Ctrl-C: a shutdown request 2 s after the start (at once if acquiring took
    // longer).
    let shutdown = tokio::time::sleep(Duration::from_secs(2));
    let (ended, release) = graceful_shutdown::run(&broker.bootstrap(), &group, shutdown)
        .await
        .unwrap();
    assert_eq!(ended, "asked to stop");
    assert_eq!(release, Release::Confirmed);
}

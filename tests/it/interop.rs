//! kafka-lock in consumer-compatible mode and a librdkafka consumer (Python confluent-kafka) in one
//! group on a one-partition topic: while either holds partition 0, the other waits. On Apache
//! Kafka both ways; one way on tansu too, whose coordinator picks the group's protocol from the
//! first member instead of by vote.
//!
//! librdkafka offers only `range` here, so the group runs the eager range protocol and range gives
//! partition 0 to the member id that sorts first; member ids start with the client id, so each
//! test picks client ids that make the first holder sort first: that is the consumer protocol's
//! rule, not ours (the native protocol is sticky instead).

use std::io::{BufRead, BufReader};
use std::process::Command;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use kafka_lock::{LockEvent, LockOptions};
use tokio::sync::mpsc;

use crate::support::brokers::{on_brokers, Broker};
use crate::support::kafka::new_log_path;
use crate::support::lifeline::{Output, Supervised};
use crate::support::{self, log_tail, mono_ns};

/// Bound on anything a librdkafka consumer waits for: its first join, and a rebalance, on tansu
/// about 3 s each (parked joins); on Apache Kafka a heartbeat interval and a few round trips,
/// plus, for a rebalance the eager protocol starts, every member's rejoin. The start of a Python
/// interpreter with librdkafka comes on top.
const BOUND: Duration = Duration::from_secs(60);

/// One line the Python consumer printed.
#[derive(Debug, Clone)]
struct PyEvent {
    event: String,
    partitions: Vec<i64>,
    mono_ns: i64,
}

fn parse(line: &str) -> Option<PyEvent> {
    // The script prints flat JSON objects with known keys; a tiny reader keeps the test free of a
    // JSON dependency.
    let field = |key: &str| -> Option<&str> {
        let start = line.find(&format!("\"{key}\": "))? + key.len() + 4;
        let rest = &line[start..];
        let end = rest.find([',', '}']).map(|i| {
            if rest.starts_with('[') {
                rest.find(']').unwrap() + 1
            } else {
                i
            }
        })?;
        Some(rest[..end].trim())
    };
    let event = field("event")?.trim_matches('"').to_owned();
    let mono_ns = field("mono_ns")?.parse().ok()?;
    let partitions = field("partitions")
        .map(|p| {
            p.trim_matches(['[', ']'])
                .split(',')
                .filter_map(|x| x.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default();
    Some(PyEvent {
        event,
        partitions,
        mono_ns,
    })
}

/// A running librdkafka consumer; killed when dropped, and with the test process however it ends.
struct PyConsumer {
    process: Supervised,
    lines: std_mpsc::Receiver<PyEvent>,
    log: Vec<PyEvent>,
    stderr: std::path::PathBuf,
}

impl PyConsumer {
    fn start(broker: Broker, group: &str, topic: &str, client_id: &str) -> PyConsumer {
        let script = support::repo_root().join("tests/interop/rdkafka_lock.py");
        let mut cmd = Command::new(support::python());
        cmd.arg(script)
            .args([&broker.bootstrap(), group, topic, client_id, "6000", "500"]);
        let stderr = new_log_path("rdkafka");
        let (process, out) = Supervised::spawn(&cmd, Output::Piped { stderr: &stderr }, None)
            .unwrap_or_else(|e| panic!("start the librdkafka consumer: {e}"));
        let out = out.expect("stdout is piped");
        let (tx, rx) = std_mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(e) = parse(&line) {
                    let _ = tx.send(e);
                }
            }
        });
        PyConsumer {
            process,
            lines: rx,
            log: Vec::new(),
            stderr,
        }
    }

    /// Waits for the first event matching `pred`, keeping every event in the log.
    fn wait_for(&mut self, what: &str, pred: impl Fn(&PyEvent) -> bool) -> PyEvent {
        let deadline = std::time::Instant::now() + BOUND;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let e = self.lines.recv_timeout(left).unwrap_or_else(|_| {
                panic!(
                    "librdkafka consumer: no {what}; saw {:?}\n--- its stderr ---\n{}",
                    self.log,
                    log_tail(&self.stderr, 30)
                )
            });
            self.log.push(e.clone());
            if pred(&e) {
                return e;
            }
        }
    }

    fn close(&mut self) {
        self.process
            .send_line("close")
            .expect("write to the librdkafka consumer");
    }

    /// Every interval during which librdkafka held partition 0, from its own callbacks.
    fn held_intervals(&self) -> Vec<(i64, i64)> {
        let mut out = Vec::new();
        let mut start = None;
        for e in &self.log {
            match e.event.as_str() {
                "assigned" if e.partitions.contains(&0) => start = Some(e.mono_ns),
                "revoked" | "lost" | "closed" => {
                    if let Some(s) = start.take() {
                        out.push((s, e.mono_ns));
                    }
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            out.push((s, i64::MAX));
        }
        out
    }
}

/// Our own held intervals, from the lock's events stamped on arrival.
fn our_intervals(log: &[(i64, LockEvent)]) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let mut start = None;
    for (t, e) in log {
        match e {
            LockEvent::Acquired { .. } => start = Some(*t),
            LockEvent::Lost { .. } | LockEvent::Released | LockEvent::Left => {
                if let Some(s) = start.take() {
                    out.push((s, *t));
                }
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, i64::MAX));
    }
    out
}

fn assert_disjoint(a: &[(i64, i64)], b: &[(i64, i64)]) {
    for x in a {
        for y in b {
            assert!(
                x.1 <= y.0 || y.1 <= x.0,
                "holders overlap: librdkafka {x:?} vs kafka-lock {y:?}"
            );
        }
    }
}

fn options(
    broker: Broker,
    topic: &str,
    client_id: &str,
    tx: mpsc::UnboundedSender<LockEvent>,
) -> LockOptions {
    LockOptions::new(broker.bootstrap(), topic)
        .consumer_topic(topic)
        .client_id(client_id)
        .session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(500))
        .events(tx)
}

/// Stamps our events on arrival and keeps them (returned once every sender is gone), passing
/// each one on to `live` for the test to wait on.
fn record(
    mut rx: mpsc::UnboundedReceiver<LockEvent>,
) -> (
    tokio::task::JoinHandle<Vec<(i64, LockEvent)>>,
    mpsc::UnboundedReceiver<LockEvent>,
) {
    let (live_tx, live) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut log = Vec::new();
        while let Some(e) = rx.recv().await {
            log.push((mono_ns(), e.clone()));
            let _ = live_tx.send(e);
        }
        log
    });
    (task, live)
}

on_brokers!(librdkafka_holds_then_hands_over_to_kafka_lock: apache, tansu);
async fn librdkafka_holds_then_hands_over_to_kafka_lock(broker: Broker) {
    support::init_tracing();
    let topic = support::unique_group("interop-a");
    broker.create_topic(&topic, 1);
    let mut py = PyConsumer::start(broker, &topic, &topic, "a-rdkafka");
    py.wait_for("assignment of partition 0", |e| {
        e.event == "assigned" && e.partitions == [0]
    });

    let (tx, rx) = mpsc::unbounded_channel();
    let (recorder, mut wrx) = record(rx);
    let opts = options(broker, &topic, "kafka-lock", tx);
    let acquire = tokio::spawn({
        let opts = opts.clone();
        async move { opts.acquire(Some(Duration::from_secs(90))).await }
    });
    // kafka-lock completes a generation without partition 0: it waits.
    loop {
        match tokio::time::timeout(BOUND, wrx.recv())
            .await
            .expect("kafka-lock waits")
        {
            Some(LockEvent::Waiting { .. }) => break,
            Some(LockEvent::Acquired { .. }) => {
                panic!("kafka-lock took the lock from a running librdkafka holder")
            }
            Some(_) => {}
            None => panic!("kafka-lock ended early"),
        }
    }
    py.wait_for("reassignment of partition 0", |e| {
        e.event == "assigned" && e.partitions == [0]
    });
    py.close();
    py.wait_for("close", |e| e.event == "closed");
    let guard = tokio::time::timeout(BOUND, acquire)
        .await
        .expect("kafka-lock acquires after close")
        .unwrap()
        .expect("acquired");
    guard.release().await.unwrap();
    drop(opts);
    let ours = tokio::time::timeout(Duration::from_secs(5), recorder)
        .await
        .unwrap()
        .unwrap();
    assert!(!our_intervals(&ours).is_empty());
    assert_disjoint(&py.held_intervals(), &our_intervals(&ours));
}

on_brokers!(kafka_lock_holds_then_hands_over_to_librdkafka: apache);
async fn kafka_lock_holds_then_hands_over_to_librdkafka(broker: Broker) {
    support::init_tracing();
    let topic = support::unique_group("interop-b");
    broker.create_topic(&topic, 1);
    let (tx, rx) = mpsc::unbounded_channel();
    let (recorder, mut live) = record(rx);
    let opts = options(broker, &topic, "a-kafka-lock", tx);
    let guard = opts
        .acquire(Some(BOUND))
        .await
        .expect("kafka-lock acquires a free lock");

    let mut py = PyConsumer::start(broker, &topic, &topic, "z-rdkafka");
    // Alone, kafka-lock voted for cooperative-sticky and holds under it. librdkafka offers only
    // range, so kafka-lock's rejoin, which offers only cooperative-sticky while it holds, is
    // refused (INCONSISTENT_GROUP_PROTOCOL): it surrenders partition 0 and rejoins with every
    // protocol; the eager range rebalance gives partition 0 back to the member that sorts first.
    py.wait_for("an assignment without partition 0", |e| {
        e.event == "assigned" && e.partitions.is_empty()
    });
    let mut acquisitions = 0;
    while acquisitions < 2 {
        match tokio::time::timeout(BOUND, live.recv())
            .await
            .expect("kafka-lock holds again")
        {
            Some(LockEvent::Acquired { .. }) => acquisitions += 1,
            Some(_) => {}
            None => panic!("kafka-lock ended early"),
        }
    }
    assert!(guard.is_held());
    guard.release().await.unwrap();
    py.wait_for("partition 0 after kafka-lock released", |e| {
        e.event == "assigned" && e.partitions == [0]
    });
    drop(opts);
    py.close();
    py.wait_for("close", |e| e.event == "closed");
    let ours = tokio::time::timeout(Duration::from_secs(5), recorder)
        .await
        .unwrap()
        .unwrap();
    assert_disjoint(&py.held_intervals(), &our_intervals(&ours));
}

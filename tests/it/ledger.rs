//! The ledger on Apache Kafka: tokens that keep increasing across group deletion and coordinator
//! failover, a checkpoint the broker fences, history that tells the truth after crashes, the
//! refusal of a ledger topic with two partitions, and the waiters' push.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kafka_lock::internals::driver::{ConnConfig, Connection};
use kafka_lock::internals::wire::coordinator::{find_coordinator_request, found_coordinator};
use kafka_lock::internals::wire::Response;
use kafka_lock::{
    CheckpointSource, Error, FencingToken, HoldEnd, LedgerError, LockEvent, LockOptions,
};
use kafka_protocol::messages::leave_group_request::{LeaveGroupRequest, MemberIdentity};
use kafka_protocol::messages::{ApiKey, GroupId};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::mpsc;

use crate::support::kafka::admin::{delete_group, delete_offsets};
use crate::support::kafka::probe::{create_topic, create_topic_with};
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

/// A ledger topic whose compression.type makes the broker recompress kafka-lock's records is
/// refused before the lock is joined, with the command that fixes it; `producer` is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recompressing_ledger_topic_is_refused() {
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let gzip = support::unique_group("ledger-gzip");
    create_topic_with(&bootstrap, &gzip, 1, &[("compression.type", "gzip")]);
    let group = support::unique_group("ledger-gzip-lock");
    let err = opts(&bootstrap, &group, &gzip)
        .acquire(Some(BOUND))
        .await
        .expect_err("a gzip ledger must be refused");
    assert!(
        matches!(&err, Error::Ledger(LedgerError::Compressed { codec, .. }) if codec == "gzip"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains(&kafka_lock::internals::ledger::compression_fix(&gzip)),
        "{err}"
    );
    let producer = support::unique_group("ledger-producer");
    create_topic_with(
        &bootstrap,
        &producer,
        1,
        &[("compression.type", "producer")],
    );
    hold_once(&opts(&bootstrap, &group, &producer)).await;
}

/// The coordinator of `group`, connected.
async fn coordinator(bootstrap: &str, group: &str) -> Connection {
    let first = Connection::connect(bootstrap.split(',').next().unwrap(), &ConnConfig::default())
        .await
        .expect("connect");
    let v = first
        .versions()
        .get(ApiKey::FindCoordinator)
        .unwrap()
        .min(4);
    let Response::FindCoordinator(r) = first
        .request_at(find_coordinator_request(group, v), v, BOUND)
        .await
        .expect("FindCoordinator")
    else {
        panic!("not a FindCoordinator answer")
    };
    let c = found_coordinator(&r).expect("a coordinator");
    Connection::connect(&format!("{}:{}", c.host, c.port), &ConnConfig::default())
        .await
        .expect("connect to the coordinator")
}

/// Commits `metadata` for partition 0 of `topic` in the empty group `group` as any client may
/// (generation -1, no member id: Apache accepts it while the group has no members), i.e. what
/// another writer of the group's offsets can leave as the lock's checkpoint.
async fn raw_commit(bootstrap: &str, group: &str, topic: &str, metadata: &str) {
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::TopicName;
    let conn = coordinator(bootstrap, group).await;
    let mut p = OffsetCommitRequestPartition::default();
    p.partition_index = 0;
    p.committed_offset = 0;
    p.committed_metadata = Some(StrBytes::from_string(metadata.to_owned()));
    let mut t = OffsetCommitRequestTopic::default();
    t.name = TopicName(StrBytes::from_string(topic.to_owned()));
    t.partitions = vec![p];
    let mut req = OffsetCommitRequest::default();
    req.group_id = GroupId(StrBytes::from_string(group.to_owned()));
    req.generation_id_or_member_epoch = -1;
    req.topics = vec![t];
    let v = conn.versions().get(ApiKey::OffsetCommit).unwrap().min(8);
    let Response::OffsetCommit(r) = conn.request_at(req, v, BOUND).await.expect("OffsetCommit")
    else {
        panic!("not an OffsetCommit answer")
    };
    assert_eq!(r.topics[0].partitions[0].error_code, 0, "{r:?}");
}

/// Removes `member` from `group` at once, as an administrator can (a LeaveGroup naming it): the
/// member is gone at the broker while the process still believes it holds the lock.
async fn remove_member(bootstrap: &str, group: &str, member: &str) {
    let first = Connection::connect(bootstrap.split(',').next().unwrap(), &ConnConfig::default())
        .await
        .expect("connect");
    let v = first
        .versions()
        .get(ApiKey::FindCoordinator)
        .unwrap()
        .min(4);
    let Response::FindCoordinator(r) = first
        .request_at(find_coordinator_request(group, v), v, BOUND)
        .await
        .expect("FindCoordinator")
    else {
        panic!("not a FindCoordinator answer")
    };
    let c = found_coordinator(&r).expect("a coordinator");
    let conn = Connection::connect(&format!("{}:{}", c.host, c.port), &ConnConfig::default())
        .await
        .expect("connect to the coordinator");
    let mut m = MemberIdentity::default();
    m.member_id = StrBytes::from_string(member.to_owned());
    m.reason = Some(StrBytes::from_static_str(
        "test: an administrator removes the holder",
    ));
    let mut req = LeaveGroupRequest::default();
    req.group_id = GroupId(StrBytes::from_string(group.to_owned()));
    req.members = vec![m];
    let v = conn.versions().get(ApiKey::LeaveGroup).unwrap();
    assert!(v >= 3, "LeaveGroup v{v} cannot name a member");
    let Response::LeaveGroup(r) = conn.request_at(req, v, BOUND).await.expect("LeaveGroup") else {
        panic!("not a LeaveGroup answer")
    };
    assert_eq!(r.error_code, 0, "{r:?}");
    assert_eq!(r.members[0].error_code, 0, "{r:?}");
}

/// A holder the broker no longer knows still believes it holds (until its next heartbeat), and
/// its checkpoint carries its generation and member id, so the broker itself rejects it. Breaks
/// if the commit went out without them (generation -1 and no member id are accepted by an empty
/// group) or if the library did not wait for the broker's verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holders_checkpoint_is_rejected_by_the_broker() {
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let ledger = new_ledger(&bootstrap, "ledger-stale");
    let group = support::unique_group("ledger-stale-lock");
    // Long heartbeats: once removed, the holder hears of it only seconds later.
    let o = LockOptions::new(&bootstrap, &group)
        .session_timeout(Duration::from_secs(10))
        .rebalance_timeout(Duration::from_secs(10))
        .heartbeat_interval(Duration::from_secs(4))
        .lease_margin(Duration::from_secs(1))
        .ledger_topic(&ledger);
    let mut rejected = None;
    for _ in 0..3 {
        let guard = o.acquire(Some(BOUND)).await.expect("acquire");
        guard
            .checkpoint("first")
            .await
            .expect("the current holder's checkpoint is stored");
        // Just after a renewal, the next heartbeat is a whole interval away.
        let mut w = guard.watch();
        assert!(w.changed().await, "a renewal");
        remove_member(&bootstrap, &group, &guard.member_id()).await;
        assert!(
            guard.is_held(),
            "the removed holder still believes it holds"
        );
        match guard.checkpoint("stale").await {
            Err(Error::Broker {
                api: kafka_lock::Api::OffsetCommit,
                code,
                ..
            }) => {
                rejected = Some(code);
                break;
            }
            // Its heartbeat won the race and it learned first: try again.
            Err(Error::Ledger(LedgerError::NotHeld { .. })) => continue,
            other => panic!("a stale checkpoint was not rejected: {other:?}"),
        }
    }
    let code = rejected.expect("the broker rejected a stale holder's checkpoint");
    assert!(
        matches!(code.code(), 22 | 25),
        "rejected with {code}, not ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID"
    );
    let c = o
        .last_checkpoint()
        .await
        .expect("read the checkpoint")
        .expect("a checkpoint");
    assert_eq!(
        (c.value.as_str(), c.source),
        ("first", CheckpointSource::Group)
    );
}

/// With the ledger's push, waiters learn of a release from their parked Fetch, not from their
/// next heartbeat. The second waiter's heartbeats are 14 s apart here, and Apache completes the
/// rebalance only once every member has rejoined, so without the push the handover takes about
/// 12 s or more; with it, milliseconds (BENCHMARKS.md). Breaks if the Fetch did not wake the
/// waiters (wrong key filter, the poll started from the wrong place, no heartbeat on RELEASED).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_learn_of_a_release_from_the_ledger_at_once() {
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let ledger = new_ledger(&bootstrap, "ledger-push");
    let group = support::unique_group("ledger-push-lock");
    let slow = |label: &str| {
        LockOptions::new(&bootstrap, &group)
            .session_timeout(Duration::from_secs(30))
            .rebalance_timeout(Duration::from_secs(30))
            .heartbeat_interval(Duration::from_secs(14))
            .lease_margin(Duration::from_secs(1))
            .ledger_topic(&ledger)
            .label(label)
    };
    // The holder heartbeats often, so the waiters' joins complete quickly.
    let holder = slow("holder")
        .heartbeat_interval(Duration::from_millis(500))
        .acquire(Some(BOUND))
        .await
        .expect("the holder acquires");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (done_tx, mut done) = mpsc::unbounded_channel();
    for name in ["b", "c"] {
        let (o, tx, done_tx) = (slow(name), tx.clone(), done_tx.clone());
        tokio::spawn(async move {
            let (etx, mut erx) = mpsc::unbounded_channel();
            let o = o.events(etx);
            let forward = tokio::spawn(async move {
                while let Some(e) = erx.recv().await {
                    let _ = tx.send(e);
                }
            });
            let guard = o.acquire(Some(Duration::from_secs(120))).await;
            forward.abort();
            let _ = done_tx.send(guard);
        });
        // Each waiter is in the queue before the next one joins.
        let want = if name == "b" { 1 } else { 2 };
        loop {
            match tokio::time::timeout(BOUND, rx.recv())
                .await
                .expect("waiting")
            {
                Some(LockEvent::Waiting {
                    holder: Some(h),
                    position,
                    ..
                }) if h.label.as_deref() == Some("holder") && position == want => break,
                Some(_) => {}
                None => panic!("events ended"),
            }
        }
    }
    // The waiters find where their long polls start with one request each; three of the
    // holder's renewals later (1.5 s) they are long done, so the release reaches them through a
    // parked Fetch. The handover needs both: Apache completes the rebalance only once every
    // member has rejoined, and the second waiter's next heartbeat is 14 s away.
    let mut renewals = holder.watch();
    for _ in 0..3 {
        assert!(renewals.changed().await, "the holder renews");
    }
    let released = Instant::now();
    holder.release().await.expect("release");
    let first = tokio::time::timeout(BOUND, done.recv())
        .await
        .expect("a waiter acquires in time")
        .expect("a waiter's outcome")
        .expect("a waiter acquires");
    let took = released.elapsed();
    eprintln!("handover through the ledger took {took:?}");
    assert!(
        took < Duration::from_secs(3),
        "the handover took {took:?}: the waiters waited for their heartbeats"
    );
    let first_token = first.token();
    first.release().await.expect("release");
    let last = tokio::time::timeout(BOUND, done.recv())
        .await
        .expect("the last waiter acquires in time")
        .expect("its outcome")
        .expect("the last waiter acquires");
    assert!(last.token() > first_token);
    last.release().await.expect("release");
}

fn kafka_lock() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kafka-lock"));
    cmd.env_remove("KAFKA_LOCK_LOG")
        .env_remove("KAFKA_LOCK_LEDGER_TOPIC")
        .stdin(Stdio::null());
    cmd
}

/// `kafka-lock run` under the tests' usual timeouts, with the ledger.
fn run_cmd(bootstrap: &str, group: &str, ledger: &str, script: &str) -> Command {
    let mut cmd = kafka_lock();
    cmd.args(["run", "--bootstrap", bootstrap, "--lock", group])
        .args(["--ledger-topic", ledger])
        .args(["--session-timeout", "6s", "--heartbeat-interval", "500ms"])
        .args([
            "--events", "json", "--wait", "60s", "--", "sh", "-c", script,
        ]);
    cmd
}

/// The JSON events on a `--events json` run's stderr, each checked against docs/events.md.
fn events_in(stderr: &str) -> Vec<serde_json::Value> {
    let events: Vec<serde_json::Value> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|v: &serde_json::Value| v.get("event").is_some())
        .collect();
    events.iter().for_each(crate::cli::conventions::check_event);
    events
}

/// Runs a short-lived `kafka-lock` to its end (bounded), returning status, stdout and stderr.
fn run_to_end(mut cmd: Command) -> (i32, String, String) {
    let child = ChildGuard::new(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kafka-lock"),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let child = child.into_inner();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(out) => out.expect("kafka-lock's output"),
        Err(_) => {
            // SAFETY: kill(2) on our own child's pid, which is not reaped yet (the waiting
            // thread has not returned).
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
            panic!("kafka-lock did not finish within 120 s");
        }
    };
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The command finds the last checkpoint in its environment and leaves the next one in a file;
/// kafka-lock stores it only when the command exits 0, takes one of exactly
/// `--checkpoint-max-bytes` and refuses one byte more. The token in the environment is the
/// ledger offset. No run leaves its checkpoint directory in `$TMPDIR`. After the group is
/// deleted, `status` still shows the last hold and the checkpoint (from the ledger's copy).
#[test]
fn the_command_hands_its_checkpoint_to_the_next_holder() {
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let ledger = new_ledger(&bootstrap, "ledger-cli");
    let group = support::unique_group("ledger-cli-lock");
    let dir = std::env::temp_dir().join(support::unique_group("ledger-cli-out"));
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = RemoveDir(dir.clone());
    let tmp = dir.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let step = |n: u32, write: &str, exit: i32| {
        let script = format!(
            "printf '%s %s' \"$KAFKA_LOCK_TOKEN\" \"${{KAFKA_LOCK_CHECKPOINT-none}}\" > {out}; \
             {write}; exit {exit}",
            out = dir.join(format!("seen{n}")).display()
        );
        let mut cmd = run_cmd(&bootstrap, &group, &ledger, &script);
        cmd.env("TMPDIR", &tmp);
        let (status, _, stderr) = run_to_end(cmd);
        let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
        assert!(
            left.is_empty(),
            "run {n} left {left:?} in its TMPDIR: {stderr}"
        );
        let seen = std::fs::read_to_string(dir.join(format!("seen{n}"))).unwrap_or_default();
        let (token, checkpoint) = seen.split_once(' ').unwrap_or(("", ""));
        (
            status,
            token.parse::<i64>().unwrap_or(-1),
            checkpoint.to_owned(),
            stderr,
        )
    };
    let (s1, t1, c1, e1) = step(1, "printf v1 > \"$KAFKA_LOCK_CHECKPOINT_FILE\"", 0);
    assert_eq!((s1, c1.as_str()), (0, "none"), "{e1}");
    let stored: Vec<_> = events_in(&e1)
        .into_iter()
        .filter(|e| e["event"] == "checkpoint")
        .collect();
    assert_eq!(stored.len(), 1, "{e1}");
    assert_eq!(stored[0]["bytes"], 2, "{e1}");
    assert_eq!(stored[0]["token"], t1, "{e1}");
    let (s2, t2, c2, e2) = step(2, "printf v2 > \"$KAFKA_LOCK_CHECKPOINT_FILE\"", 0);
    assert_eq!((s2, c2.as_str()), (0, "v1"), "{e2}");
    assert!(t2 > t1 && t1 >= 0, "tokens {t1} then {t2}");
    // A failed command's checkpoint is not stored.
    let (s3, _, c3, e3) = step(3, "printf v3 > \"$KAFKA_LOCK_CHECKPOINT_FILE\"", 3);
    assert_eq!((s3, c3.as_str()), (3, "v2"), "{e3}");
    // One longer than the limit is refused locally: status 78, the checkpoint stays.
    let (s4, _, c4, e4) = step(
        4,
        "head -c 5000 /dev/zero | tr '\\0' x > \"$KAFKA_LOCK_CHECKPOINT_FILE\"",
        0,
    );
    assert_eq!((s4, c4.as_str()), (78, "v2"), "{e4}");
    assert!(e4.contains("more than 4096 bytes"), "{e4}");
    // So is one byte more than the limit (4096, the brokers' offset.metadata.max.bytes); one of
    // exactly the limit is stored, and the next holder finds it in its environment.
    let (s5, _, c5, e5) = step(
        5,
        "head -c 4097 /dev/zero | tr '\\0' x > \"$KAFKA_LOCK_CHECKPOINT_FILE\"",
        0,
    );
    assert_eq!((s5, c5.as_str()), (78, "v2"), "{e5}");
    let (s6, _, c6, e6) = step(
        6,
        "head -c 4096 /dev/zero | tr '\\0' y > \"$KAFKA_LOCK_CHECKPOINT_FILE\"",
        0,
    );
    assert_eq!((s6, c6.as_str()), (0, "v2"), "{e6}");
    let (s7, _, c7, e7) = step(7, "printf v2 > \"$KAFKA_LOCK_CHECKPOINT_FILE\"", 0);
    assert_eq!((s7, c7 == "y".repeat(4096)), (0, true), "{e7}");
    let (s8, t8, c8, e8) = step(8, "true", 0);
    assert_eq!((s8, c8.as_str()), (0, "v2"), "{e8}");

    // The group is gone; the ledger is not.
    delete_group(&bootstrap, &group).expect("delete the empty group");
    let mut status = kafka_lock();
    status
        .args(["status", "--bootstrap", &bootstrap, "--lock", &group])
        .args(["--ledger-topic", &ledger, "--json"]);
    let (code, out, err) = run_to_end(status);
    // 3: nobody holds the lock (docs/cli.md); the ledger still tells its story.
    assert_eq!(code, 3, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    assert_eq!(v["state"], "Dead", "{out}");
    assert_eq!(v["ledger"]["last_hold"]["token"], t8, "{out}");
    assert_eq!(v["ledger"]["last_hold"]["end"], "released", "{out}");
    assert_eq!(v["ledger"]["checkpoint"]["value"], "v2", "{out}");
    assert_eq!(v["ledger"]["checkpoint"]["source"], "ledger", "{out}");
}

/// Whatever the command leaves at KAFKA_LOCK_CHECKPOINT_FILE instead of a regular file (a FIFO,
/// a symbolic link to one, a link to /dev/stdin, a directory) is refused at once, without
/// following a link and without waiting for a writer: kafka-lock exits 78 within the bound,
/// and the lock keeps its checkpoint. Fails on a plain open (it blocks on the FIFO
/// for good, and the run never ends) or one that follows links.
#[test]
fn a_checkpoint_file_that_is_not_a_regular_file_is_refused_without_waiting() {
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let ledger = new_ledger(&bootstrap, "ledger-fifo");
    let group = support::unique_group("ledger-fifo-lock");
    let (status, _, stderr) = run_to_end(run_cmd(
        &bootstrap,
        &group,
        &ledger,
        "printf v1 > \"$KAFKA_LOCK_CHECKPOINT_FILE\"",
    ));
    assert_eq!(status, 0, "{stderr}");
    for hostile in [
        "mkfifo \"$KAFKA_LOCK_CHECKPOINT_FILE\"",
        "mkfifo \"$KAFKA_LOCK_CHECKPOINT_FILE.fifo\" && ln -s \"$KAFKA_LOCK_CHECKPOINT_FILE.fifo\" \"$KAFKA_LOCK_CHECKPOINT_FILE\"",
        "ln -s /dev/stdin \"$KAFKA_LOCK_CHECKPOINT_FILE\"",
        "mkdir \"$KAFKA_LOCK_CHECKPOINT_FILE\"",
    ] {
        let started = Instant::now();
        let (status, _, stderr) = run_to_end(run_cmd(&bootstrap, &group, &ledger, hostile));
        assert_eq!(status, 78, "{hostile}: {stderr}");
        assert!(stderr.contains("not a regular file"), "{hostile}: {stderr}");
        let failed = events_in(&stderr);
        assert!(
            failed.iter().any(|e| e["event"] == "failed" && e["status"] == 78),
            "{hostile}: {stderr}"
        );
        eprintln!("{hostile}: refused after {:?}", started.elapsed());
    }
    let (status, out, stderr) = run_to_end(run_cmd(
        &bootstrap,
        &group,
        &ledger,
        "printf '%s' \"$KAFKA_LOCK_CHECKPOINT\"",
    ));
    assert_eq!((status, out.as_str()), (0, "v1"), "{stderr}");
}

/// A checkpoint with a NUL in it, committed to the lock's group by another writer, cannot reach
/// the command through its environment; the next holder still runs its command, which finds
/// the value in the file named by KAFKA_LOCK_LAST_CHECKPOINT_FILE, and a `warning` event says
/// so. A command that leaves a NUL is refused (78) before anything is sent, and the lock keeps
/// its checkpoint. Fails if the value is put in the environment (the spawn fails, status 71) or
/// if a NUL is stored.
#[test]
fn a_checkpoint_with_a_nul_never_stops_the_next_holder() {
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let ledger = new_ledger(&bootstrap, "ledger-nul");
    let group = support::unique_group("ledger-nul-lock");
    // A first hold makes the group; it is empty afterwards, so anyone may commit to it.
    let (status, _, stderr) = run_to_end(run_cmd(&bootstrap, &group, &ledger, "true"));
    assert_eq!(status, 0, "{stderr}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(raw_commit(&bootstrap, &group, &ledger, "bad\0value"));

    let script = "printf '[%s]' \"${KAFKA_LOCK_CHECKPOINT-unset}\"; \
                  tr '\\0' '@' < \"$KAFKA_LOCK_LAST_CHECKPOINT_FILE\"";
    let (status, out, stderr) = run_to_end(run_cmd(&bootstrap, &group, &ledger, script));
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(out, "[unset]bad@value", "{stderr}");
    let warned = events_in(&stderr)
        .into_iter()
        .filter(|e| e["event"] == "warning")
        .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
        .collect::<Vec<_>>();
    assert!(
        warned
            .iter()
            .any(|m| m.contains("KAFKA_LOCK_LAST_CHECKPOINT_FILE")),
        "{stderr}"
    );

    // The command leaves a NUL: refused, nothing stored.
    let (status, _, stderr) = run_to_end(run_cmd(
        &bootstrap,
        &group,
        &ledger,
        "printf 'x\\000y' > \"$KAFKA_LOCK_CHECKPOINT_FILE\"",
    ));
    assert_eq!(status, 78, "{stderr}");
    assert!(stderr.contains("NUL"), "{stderr}");
    assert!(
        !events_in(&stderr)
            .iter()
            .any(|e| e["event"] == "checkpoint"),
        "{stderr}"
    );
}

/// A directory removed when dropped, even when the test fails.
struct RemoveDir(std::path::PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A holder SIGKILLed while it holds writes no end record; the history says so (its hold ended
/// without a word before the next one began) and does not invent a release. Breaks if a record
/// were written on the holder's behalf, or if the fold paired the next holder's RELEASED with
/// the dead holder's hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_after_a_crash_tells_the_truth() {
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let ledger = new_ledger(&bootstrap, "ledger-crash");
    let group = support::unique_group("ledger-crash-lock");
    let mut holder_cmd = kafka_lock();
    holder_cmd
        .args(["run", "--bootstrap", &bootstrap, "--lock", &group])
        .args(["--ledger-topic", &ledger, "--label", "doomed"])
        .args(["--session-timeout", "6s", "--heartbeat-interval", "500ms"])
        .args(["--events", "json", "--", "sleep", "600"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut holder = ChildGuard::new(holder_cmd.spawn().expect("start kafka-lock run"));
    let stderr = holder.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let acquired = loop {
        let line = rx.recv_timeout(BOUND).expect("the holder process acquires");
        if line.contains("\"event\":\"child_started\"") {
            break line;
        }
    };
    let v: serde_json::Value = serde_json::from_str(&acquired).unwrap();
    let dead_token = v["token"].as_i64().expect("a token");
    // kafka-lock and, through its supervisor, the command: no goodbye to anyone.
    holder.kill().expect("SIGKILL the holder");
    let _ = holder.wait();

    let next = opts(&bootstrap, &group, &ledger);
    let t2 = hold_once(&next).await;
    assert!(t2.value() > dead_token, "{dead_token} then {t2:?}");

    let h = next.history().await.expect("history");
    assert_eq!(h.holds.len(), 2, "{h:?}");
    assert_eq!(h.holds[0].token, dead_token);
    assert_eq!(h.holds[0].label.as_deref(), Some("doomed"));
    assert_eq!(
        h.holds[0].end,
        HoldEnd::Silent {
            next_token: t2.value(),
            before_unix_ms: h.holds[1].acquired_unix_ms
        }
    );
    assert!(matches!(h.holds[1].end, HoldEnd::Released { .. }));

    // The CLI tells the same.
    let mut history = kafka_lock();
    history
        .args(["history", "--bootstrap", &bootstrap, "--lock", &group])
        .args(["--ledger-topic", &ledger, "--json"]);
    let (code, out, err) = run_to_end(history);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    let ends: Vec<(i64, String)> = v["holds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["token"].as_i64().unwrap(),
                h["end"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        ends,
        [
            (dead_token, "silent".to_owned()),
            (t2.value(), "released".to_owned())
        ]
    );
    let mut text = kafka_lock();
    text.args(["history", "--bootstrap", &bootstrap, "--lock", &group])
        .args(["--ledger-topic", &ledger]);
    let (code, out, err) = run_to_end(text);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("ended without a word before token {}", t2.value())),
        "{out}"
    );
}

/// Metadata's leader for partition 0 of `topic`, asked of any live node of the cluster.
async fn ledger_leader(cluster: &KafkaCluster, topic: &str) -> i32 {
    use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
    use kafka_protocol::messages::TopicName;
    for node in cluster.nodes().iter().filter(|n| n.is_live()) {
        let Ok(conn) = Connection::connect(&node.addr(), &ConnConfig::default()).await else {
            continue;
        };
        let mut t = MetadataRequestTopic::default();
        t.name = Some(TopicName(StrBytes::from_string(topic.to_owned())));
        let mut req = MetadataRequest::default();
        req.topics = Some(vec![t]);
        if let Ok(Response::Metadata(r)) = conn.request(req).await {
            if let Some(p) = r.topics.first().and_then(|t| t.partitions.first()) {
                if p.leader_id.0 >= 0 {
                    return p.leader_id.0;
                }
            }
        }
    }
    panic!("no live node names a leader for {topic}")
}

/// Coordinator failover and the loss of the ledger's leader on three nodes: every new holder's
/// token is still greater than every earlier one's, and no hold is missing from the history.
/// Breaks if the ledger machine did not look the leader up again (the next hold never begins).
#[test]
fn tokens_keep_increasing_across_coordinator_and_ledger_leader_failover() {
    support::init_tracing();
    let mut cluster = KafkaCluster::start(KafkaOptions::three_nodes());
    let bootstrap = cluster.bootstrap();
    let ledger = support::unique_group("ledger-failover");
    create_topic(&bootstrap, &ledger, 1);
    cluster.wait_for_full_isr();
    let group = support::unique_group("ledger-failover-lock");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let o = opts(&bootstrap, &group, &ledger);
    let mut tokens = Vec::new();

    // A holds while its coordinator dies.
    let a = rt.block_on(o.acquire(Some(BOUND))).expect("A acquires");
    tokens.push(a.token());
    let coordinator = cluster.coordinator(&group);
    cluster.kill(coordinator);
    cluster.wait_for_new_coordinator(&group, coordinator);
    // Kept through the failover or lost: either way it ends here.
    rt.block_on(a.release()).expect("release");
    tokens.push(rt.block_on(hold_once(&o)));
    cluster.restart(coordinator);
    cluster.wait_for_full_isr();

    // The ledger's leader dies: the next ACQUIRED record goes to its successor.
    let leader = rt.block_on(ledger_leader(&cluster, &ledger));
    cluster.kill(leader);
    tokens.push(rt.block_on(hold_once(&o)));
    cluster.restart(leader);
    cluster.wait_for_full_isr();
    tokens.push(rt.block_on(hold_once(&o)));

    for w in tokens.windows(2) {
        assert!(w[1] > w[0], "{:?} then {:?}", w[0], w[1]);
        assert!(w[1].ledger_offset > w[0].ledger_offset);
    }
    let h = rt.block_on(o.history()).expect("history");
    let held: Vec<i64> = h
        .holds
        .iter()
        .filter(|x| !matches!(x.end, HoldEnd::Retried { .. }))
        .map(|x| x.token)
        .collect();
    let want: Vec<i64> = tokens.iter().map(FencingToken::value).collect();
    assert_eq!(held, want, "{h:?}");
}

/// Appends `records` (key `key`, each with `value`) in batches of `per_batch` to partition 0 of
/// `topic`, as any producer could: the ledger is shared, and not only by kafka-lock.
async fn append_raw(
    bootstrap: &str,
    topic: &str,
    key: &str,
    value: &[u8],
    records: usize,
    per_batch: usize,
) {
    use kafka_lock::internals::ledger::{build, Op};
    use kafka_lock::internals::wire::log::{produced, TopicPartition};
    use kafka_lock::internals::wire::records::{encode_batch, NewRecord};
    let cfg = ConnConfig::default().with_max_frame_size(8 << 20);
    let conn = Connection::connect(bootstrap.split(',').next().unwrap(), &cfg)
        .await
        .expect("connect");
    let tp = TopicPartition::new(topic, 0);
    let mut left = records;
    while left > 0 {
        let n = left.min(per_batch);
        left -= n;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let batch: Vec<NewRecord> = (0..n)
            .map(|_| NewRecord {
                timestamp: now_ms,
                key: Some(bytes::Bytes::copy_from_slice(key.as_bytes())),
                value: Some(bytes::Bytes::copy_from_slice(value)),
                headers: Vec::new(),
            })
            .collect();
        let mut out = bytes::BytesMut::new();
        encode_batch(&batch, &mut out).expect("encode");
        let op = Op::Produce {
            tp: tp.clone(),
            batch: out.freeze(),
            timeout: BOUND,
        };
        let (req, v) = build(&op, conn.versions()).expect("build");
        let resp = conn.request_at(req, v, BOUND).await.expect("produce");
        let Response::Produce(r) = resp else {
            panic!("{resp:?}")
        };
        produced(&r, &tp, v).expect("appended");
    }
    conn.close();
}

/// Without a committed checkpoint (the group was deleted), the last checkpoint comes from the
/// ledger's copy, read from the end backwards and only so far: a checkpoint behind tens of
/// thousands of other locks' records is not looked for (the whole history still has it), one
/// among the last records is found. Breaks if `last_checkpoint` read the whole partition, as it
/// did on every `kafka-lock run` of a lock without a committed checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledgers_checkpoint_copy_is_read_only_from_its_tail() {
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let ledger = new_ledger(&bootstrap, "ledger-tail");
    let group = support::unique_group("ledger-tail-lock");
    let o = opts(&bootstrap, &group, &ledger);
    let checkpoint_once = |value: &'static str| {
        let o = o.clone();
        async move {
            let guard = o.acquire(Some(BOUND)).await.expect("acquire");
            guard.checkpoint(value).await.expect("checkpoint");
            guard.release().await.expect("release");
        }
    };
    checkpoint_once("old").await;
    // More of other locks' records than the tail read goes back.
    append_raw(&bootstrap, &ledger, "another-lock", b"x", 40_000, 4_000).await;
    delete_group(&bootstrap, &group).expect("delete the empty group");
    assert_eq!(o.committed_checkpoint().await.expect("committed"), None);
    let found = o.last_checkpoint().await.expect("last checkpoint");
    assert_eq!(found, None, "read beyond the tail: {found:?}");
    let whole = o.history().await.expect("history");
    assert_eq!(whole.last_checkpoint().map(|c| c.0), Some("old"));

    checkpoint_once("new").await;
    append_raw(&bootstrap, &ledger, "another-lock", b"x", 5_000, 5_000).await;
    delete_group(&bootstrap, &group).expect("delete the empty group");
    let found = o
        .last_checkpoint()
        .await
        .expect("last checkpoint")
        .expect("found");
    assert_eq!(
        (found.value.as_str(), found.source),
        ("new", CheckpointSource::Ledger)
    );
}

/// A checkpoint reported stored reads back after the group's copy is gone (DeleteGroups here;
/// OffsetDelete and the expiry of consumer-mode offsets leave the same empty group): the ledger
/// holds a copy of every checkpoint reported stored. The ledger topic's max.message.bytes lets
/// the broker commit a long checkpoint (offset.metadata.max.bytes 4096) but refuse its copy.
/// Breaks if a checkpoint were reported stored once committed, its copy best effort: the long
/// one is reported stored and the read after the deletion finds the short one, older.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_reported_stored_reads_back_when_the_group_is_deleted() {
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let ledger = support::unique_group("ledger-copy");
    create_topic_with(&bootstrap, &ledger, 1, &[("max.message.bytes", "1024")]);
    let group = support::unique_group("ledger-copy-lock");
    let o = opts(&bootstrap, &group, &ledger);
    let guard = o.acquire(Some(BOUND)).await.expect("acquire");
    let long = format!("long {}", "x".repeat(2000));
    let mut stored = Vec::new();
    let mut refused = Vec::new();
    for value in ["short", long.as_str()] {
        match guard.checkpoint(value).await {
            Ok(()) => stored.push(value.to_owned()),
            Err(e) => refused.push(e),
        }
    }
    // The group has the long one: the broker took the commit.
    let committed = o.committed_checkpoint().await.expect("committed");
    assert_eq!(committed.map(|c| c.value), Some(long.clone()));
    guard.release().await.expect("release");
    delete_group(&bootstrap, &group).expect("delete the empty group");
    assert_eq!(o.committed_checkpoint().await.expect("committed"), None);
    let read = o
        .last_checkpoint()
        .await
        .expect("last checkpoint")
        .map(|c| (c.value, c.source));
    let last_stored = stored
        .last()
        .cloned()
        .map(|v| (v, CheckpointSource::Ledger));
    // Long values are compared whole but shown by their start.
    let short = |c: &Option<(String, CheckpointSource)>| {
        c.as_ref()
            .map(|(v, s)| (v.chars().take(24).collect::<String>(), v.len(), *s))
    };
    assert!(
        read == last_stored,
        "the last checkpoint reported stored does not read back: read {:?}, stored {:?}",
        short(&read),
        short(&last_stored)
    );
    assert_eq!(stored, ["short"]);
    assert!(
        matches!(
            refused[..],
            [Error::Ledger(LedgerError::CheckpointNotCopied { .. })]
        ),
        "{refused:?}"
    );
}

/// The next holder after a push handover reads the previous holder's last checkpoint with
/// `LockGuard::last_checkpoint` (what `kafka-lock run` does once it holds), also when the read
/// started at the grant, beside the ACQUIRED append: from the group, and,
/// once the group's copy is deleted (OffsetDelete while held, consumer-compatible mode), from
/// the ledger's tail, whose ends are read beside the OffsetFetch. Breaks if the read trusted an
/// OffsetFetch without a checkpoint and skipped the ledger (the second read finds nothing), or
/// if the ends it reads beside the OffsetFetch were not the partition's (the copy is missed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_holder_reads_the_previous_holders_checkpoint() {
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    // As `LockGuard::last_checkpoint` reads after the hold began, and as the read started at
    // the grant, beside the ACQUIRED append, does (`read_checkpoint_on_acquire`, the CLI's).
    for at_grant in [false, true] {
        let ledger = new_ledger(&bootstrap, "ledger-next");
        let topic = new_ledger(&bootstrap, "ledger-next-topic");
        let group = support::unique_group("ledger-next-lock");
        let o = opts(&bootstrap, &group, &ledger).consumer_topic(&topic);
        let first = o.acquire(Some(BOUND)).await.expect("acquire");
        let next = {
            let o = o.clone().read_checkpoint_on_acquire(at_grant);
            tokio::spawn(async move { o.acquire(Some(BOUND)).await })
        };
        first.checkpoint("one").await.expect("checkpoint");
        first.checkpoint("two").await.expect("checkpoint");
        let token = first.token();
        first.release().await.expect("release");
        let next = tokio::time::timeout(BOUND, next)
            .await
            .expect("the next holder within the bound")
            .expect("task")
            .expect("acquire");
        let found = tokio::time::timeout(BOUND, next.last_checkpoint())
            .await
            .expect("read within the bound")
            .expect("read")
            .expect("the previous holder's checkpoint");
        assert_eq!(
            (found.value.as_str(), found.source, found.token),
            ("two", CheckpointSource::Group, token.value())
        );
        delete_offsets(&bootstrap, &group, &ledger).expect("OffsetDelete while held");
        let found = tokio::time::timeout(BOUND, next.last_checkpoint())
            .await
            .expect("read within the bound")
            .expect("read")
            .expect("the ledger's copy");
        assert_eq!(
            (found.value.as_str(), found.source, found.token),
            ("two", CheckpointSource::Ledger, token.value())
        );
        next.release().await.expect("release");
    }
}

/// The same, with the group's copy deleted by OffsetDelete while the lock is held in
/// consumer-compatible mode (its members subscribe to the lock topic, not the ledger, so Apache
/// lets the ledger partition's offset go while the group is active, as the offsets' expiry does
/// 7 days after the last commit). Breaks as the test above does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_reported_stored_reads_back_after_an_offset_delete_while_held() {
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let ledger = support::unique_group("ledger-odel");
    create_topic_with(&bootstrap, &ledger, 1, &[("max.message.bytes", "1024")]);
    let topic = new_ledger(&bootstrap, "ledger-odel-topic");
    let group = support::unique_group("ledger-odel-lock");
    let o = opts(&bootstrap, &group, &ledger).consumer_topic(&topic);
    let guard = o.acquire(Some(BOUND)).await.expect("acquire");
    let long = format!("long {}", "x".repeat(2000));
    let mut stored = Vec::new();
    for value in ["short", long.as_str()] {
        if guard.checkpoint(value).await.is_ok() {
            stored.push(value.to_owned());
        }
    }
    delete_offsets(&bootstrap, &group, &ledger).expect("OffsetDelete while held");
    assert_eq!(o.committed_checkpoint().await.expect("committed"), None);
    let read = o
        .last_checkpoint()
        .await
        .expect("last checkpoint")
        .map(|c| (c.value, c.source));
    assert!(guard.is_held());
    guard.release().await.expect("release");
    let last_stored = stored
        .last()
        .cloned()
        .map(|v| (v, CheckpointSource::Ledger));
    assert!(
        read == last_stored,
        "the last checkpoint reported stored does not read back: read {:?}, stored {:?}",
        read.as_ref().map(|(v, _)| v.len()),
        last_stored.as_ref().map(|(v, _)| v.len())
    );
}

/// The last checkpoint is the newest hold's, even when an older hold's copy was appended late,
/// above it (a copy follows its commit, and can be retried past a leader change while the lock
/// changes hands). The late copy is written here as its holder would have written it; the newer
/// hold's copy lies just below the first window the tail read looks at (2048 offsets). Breaks if
/// the tail read stopped at the first window holding any checkpoint of the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_an_older_hold_does_not_hide_a_newer_checkpoint() {
    use kafka_lock::internals::ledger::{LedgerRecord, RecordKind};
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let ledger = new_ledger(&bootstrap, "ledger-late");
    let group = support::unique_group("ledger-late-lock");
    let o = opts(&bootstrap, &group, &ledger);
    let older = o.acquire(Some(BOUND)).await.expect("acquire");
    let (t_old, member_old) = (older.token(), older.member_id());
    older.release().await.expect("release");
    let newer = o.acquire(Some(BOUND)).await.expect("acquire");
    newer.checkpoint("new").await.expect("checkpoint");
    let t_new = newer.token();
    newer.release().await.expect("release");
    assert!(t_new.value() > t_old.value());
    append_raw(&bootstrap, &ledger, "another-lock", b"x", 2100, 2100).await;
    let late = LedgerRecord {
        unix_ms: 1_800_000_000_000,
        hold: t_old.value(),
        generation: t_old.generation,
        member_id: member_old,
        label: None,
        host: None,
        pid: None,
        slot: 0,
        kind: RecordKind::Checkpoint {
            value: "old, copied late".into(),
        },
    };
    append_raw(&bootstrap, &ledger, &group, &late.encode(), 1, 1).await;
    delete_group(&bootstrap, &group).expect("delete the empty group");
    let found = o
        .last_checkpoint()
        .await
        .expect("last checkpoint")
        .expect("found");
    assert_eq!(
        (found.value.as_str(), found.token, found.source),
        ("new", t_new.value(), CheckpointSource::Ledger)
    );
}

/// A batch as large as the broker accepts by default (message.max.bytes 1048588, above the
/// default 1 MiB frame limit) in a ledger topic created without max.message.bytes: Kafka sends
/// a Fetch's first batch whole (KIP-74), so it must fit a ledger connection's frame. History,
/// the checkpoint fallback and later holds go on past it. Breaks if the ledger's reads used the
/// 1 MiB frame limit (every Fetch from that offset failed the connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_the_brokers_default_size_does_not_blind_the_ledger() {
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let ledger = new_ledger(&bootstrap, "ledger-big");
    let group = support::unique_group("ledger-big-lock");
    let o = opts(&bootstrap, &group, &ledger);
    let t1 = hold_once(&o).await;
    // One record: a batch of 1048585 bytes, just under message.max.bytes, over 1 MiB framed.
    append_raw(
        &bootstrap,
        &ledger,
        "another-lock",
        &vec![b'x'; 1_048_500],
        1,
        1,
    )
    .await;
    let guard = o.acquire(Some(BOUND)).await.expect("acquire");
    guard.checkpoint("after").await.expect("checkpoint");
    let t2 = guard.token();
    guard.release().await.expect("release");
    let h = o.history().await.expect("history past the large batch");
    let got: Vec<i64> = h.holds.iter().map(|x| x.token).collect();
    assert_eq!(got, [t1.value(), t2.value()], "{h:?}");
    delete_group(&bootstrap, &group).expect("delete the empty group");
    let c = o
        .last_checkpoint()
        .await
        .expect("last checkpoint")
        .expect("found");
    assert_eq!(c.value, "after");
}

/// Members that disagree about the ledger never hold: with a holder on ledger A in the group, a
/// member without a ledger and one on ledger B are refused at once with an error naming both
/// settings, and `kafka-lock run` without `--ledger-topic` exits 78 with a `failed` event of
/// kind `config`. The holder keeps its lock throughout. Breaks if the setting were not
/// advertised, not compared by the leader, or not checked by the member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_that_disagree_about_the_ledger_are_refused_with_both_settings() {
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let ledger = new_ledger(&bootstrap, "ledger-mixed");
    let other = new_ledger(&bootstrap, "ledger-mixed-other");
    let group = support::unique_group("ledger-mixed-lock");
    let holder = opts(&bootstrap, &group, &ledger)
        .acquire(Some(BOUND))
        .await
        .expect("the first member holds");
    let no_ledger = LockOptions::new(&bootstrap, &group)
        .session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(500))
        .lease_margin(Duration::from_secs(1));
    for (o, ours) in [
        (no_ledger, None),
        (opts(&bootstrap, &group, &other), Some(other.clone())),
    ] {
        let started = Instant::now();
        match o.acquire(Some(BOUND)).await {
            Err(e @ Error::LedgerMismatch { .. }) => {
                let Error::LedgerMismatch {
                    lock,
                    ours: got,
                    group: theirs,
                } = &e
                else {
                    unreachable!()
                };
                assert_eq!(lock, &group);
                assert_eq!(got, &ours);
                assert_eq!(theirs.as_deref(), Some(ledger.as_str()));
                let text = e.to_string();
                assert!(text.contains(&format!("{ledger:?}")), "{text}");
            }
            other => panic!("{ours:?}: {other:?}"),
        }
        assert!(started.elapsed() < BOUND, "refused at once, not by timeout");
        assert!(holder.is_held(), "the group keeps its holder");
    }

    let mut cmd = kafka_lock();
    cmd.args(["run", "--bootstrap", &bootstrap, "--lock", &group])
        .args(["--session-timeout", "6s", "--heartbeat-interval", "500ms"])
        .args(["--events", "json", "--wait", "60s", "--", "true"]);
    let (status, _, stderr) = run_to_end(cmd);
    assert_eq!(status, 78, "{stderr}");
    let events = events_in(&stderr);
    let failed = events
        .iter()
        .find(|e| e["event"] == "failed")
        .unwrap_or_else(|| panic!("a failed event: {stderr}"));
    assert_eq!(failed["kind"], "config");
    let message = failed["message"].as_str().unwrap();
    assert!(
        message.contains("no ledger topic") && message.contains(&ledger),
        "{message}"
    );
    assert!(!events.iter().any(|e| e["event"] == "acquired"));
    assert!(holder.is_held(), "the group keeps its holder");
    holder.release().await.expect("release");
}

/// `kafka-lock run --permits 2 --ledger-topic`: the command gets a ledger token and its permit,
/// and no checkpoint file (a semaphore has no checkpoint); `history --json` names the permit of
/// each hold. Breaks if the CLI refused the pair again or records lost the slot.
#[test]
fn the_cli_runs_a_semaphore_with_a_ledger() {
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let ledger = new_ledger(&bootstrap, "ledger-cli-sem");
    let group = support::unique_group("ledger-cli-sem-lock");
    let mut cmd = kafka_lock();
    cmd.args(["run", "--bootstrap", &bootstrap, "--lock", &group])
        .args(["--ledger-topic", &ledger, "--permits", "2"])
        .args(["--session-timeout", "6s", "--heartbeat-interval", "500ms"])
        .args(["--wait", "60s", "--", "sh", "-c"])
        .arg("echo \"$KAFKA_LOCK_TOKEN $KAFKA_LOCK_PERMIT ${KAFKA_LOCK_CHECKPOINT_FILE-none}\"");
    let (status, stdout, stderr) = run_to_end(cmd);
    assert_eq!(status, 0, "{stderr}");
    let seen: Vec<&str> = stdout.split_whitespace().collect();
    let [token, permit, file] = seen[..] else {
        panic!("{stdout}")
    };
    assert_eq!(file, "none", "no checkpoint file for a semaphore");
    let token: i64 = token.parse().expect("a token");
    let permit: u16 = permit.parse().expect("a permit");
    assert!(permit < 2);

    let mut history = kafka_lock();
    history
        .args(["history", "--bootstrap", &bootstrap, "--lock", &group])
        .args(["--ledger-topic", &ledger, "--json"]);
    let (status, stdout, stderr) = run_to_end(history);
    assert_eq!(status, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("history JSON");
    let holds = v["holds"].as_array().expect("holds");
    assert_eq!(holds.len(), 1, "{stdout}");
    assert_eq!(holds[0]["token"], token, "{stdout}");
    assert_eq!(holds[0]["permit"], permit, "{stdout}");
    assert_eq!(holds[0]["end"], "released", "{stdout}");
}

/// Not a test: the time `checkpoint()` takes on the shared single-node Apache broker, 50
/// checkpoints under one hold (BENCHMARKS.md). Run with
/// `cargo test --all-features --test it -- --ignored ledger::checkpoint_latency --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a test"]
async fn checkpoint_latency() {
    support::init_tracing();
    let bootstrap = kafka().bootstrap();
    let ledger = new_ledger(&bootstrap, "ledger-bench");
    let group = support::unique_group("ledger-bench-lock");
    let o = opts(&bootstrap, &group, &ledger);
    let guard = o.acquire(Some(BOUND)).await.expect("acquire");
    let mut took = Vec::new();
    for i in 0..50 {
        let start = Instant::now();
        guard.checkpoint(format!("c{i}")).await.expect("checkpoint");
        took.push(start.elapsed());
    }
    guard.release().await.expect("release");
    took.sort();
    println!(
        "checkpoint: p50 {:?}, p90 {:?}, max {:?} (n = {})",
        took[took.len() / 2],
        took[took.len() * 9 / 10],
        took[took.len() - 1],
        took.len()
    );
}

/// A hold's read of the last checkpoint, on a scripted coordinator that counts connections.
mod scripted {
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    use std::sync::{Arc, Mutex, OnceLock};
    use std::time::Duration;

    use bytes::BytesMut;
    use kafka_lock::internals::assign::NativeAssignment;
    use kafka_lock::{CheckpointSource, LockOptions};
    use kafka_protocol::messages::leave_group_response::MemberResponse;
    use kafka_protocol::messages::list_offsets_response::{
        ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
    };
    use kafka_protocol::messages::metadata_response::{
        MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
    };
    use kafka_protocol::messages::offset_fetch_response::{
        OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
        OffsetFetchResponseTopic, OffsetFetchResponseTopics,
    };
    use kafka_protocol::messages::produce_response::{
        PartitionProduceResponse, TopicProduceResponse,
    };
    use kafka_protocol::messages::{
        ApiKey, BrokerId, HeartbeatResponse, LeaveGroupResponse, ListOffsetsResponse,
        MetadataResponse, OffsetFetchRequest, OffsetFetchResponse, ProduceResponse, TopicName,
    };
    use kafka_protocol::protocol::{Decodable, StrBytes};

    use crate::fake_broker::{self, encode};

    const LEDGER: &str = "ledger";
    const MEMBER: &str = "m-1";
    const BOUND: Duration = Duration::from_secs(60);

    /// Every scripted request's API, in order (ApiVersions and FindCoordinator the fake answers
    /// itself; a new connection shows in its accept count).
    type Log = Arc<Mutex<Vec<ApiKey>>>;

    fn name(s: &'static str) -> TopicName {
        TopicName(StrBytes::from_static_str(s))
    }

    /// One member that leads and holds; OffsetFetch answers `committed` (offset 5, "c5") or
    /// nothing; the ledger is empty (ListOffsets: 0).
    fn script(
        addr: Arc<OnceLock<std::net::SocketAddr>>,
        log: Log,
        committed: Arc<AtomicBool>,
    ) -> Arc<fake_broker::Script> {
        let produced = Arc::new(AtomicI64::new(0));
        Arc::new(move |api, version, body: &mut BytesMut| {
            log.lock().unwrap().push(api);
            match api {
                ApiKey::Metadata => {
                    let addr = addr.get().expect("the address is known before any request");
                    let broker = MetadataResponseBroker::default()
                        .with_node_id(BrokerId(1))
                        .with_host(StrBytes::from_string(addr.ip().to_string()))
                        .with_port(i32::from(addr.port()));
                    let topic = MetadataResponseTopic::default()
                        .with_name(Some(name(LEDGER)))
                        .with_partitions(vec![MetadataResponsePartition::default()
                            .with_partition_index(0)
                            .with_leader_id(BrokerId(1))]);
                    let r = MetadataResponse::default()
                        .with_brokers(vec![broker])
                        .with_topics(vec![topic]);
                    Some(encode(&r, version))
                }
                ApiKey::JoinGroup => Some(crate::fake_broker::join_alone(body, version, MEMBER)),
                // The only member leads: it gets the assignment it computed for itself.
                ApiKey::SyncGroup => Some(crate::fake_broker::sync_alone(body, version, MEMBER)),
                ApiKey::Heartbeat => Some(encode(&HeartbeatResponse::default(), version)),
                ApiKey::Produce => {
                    let at = produced.fetch_add(1, Ordering::SeqCst);
                    let r = ProduceResponse::default().with_responses(vec![
                        TopicProduceResponse::default()
                            .with_name(name(LEDGER))
                            .with_partition_responses(vec![PartitionProduceResponse::default()
                                .with_index(0)
                                .with_base_offset(at)]),
                    ]);
                    Some(encode(&r, version))
                }
                ApiKey::OffsetFetch => {
                    let _ = OffsetFetchRequest::decode(body, version).expect("OffsetFetch");
                    let (offset, metadata) = if committed.load(Ordering::SeqCst) {
                        (5, Some(StrBytes::from_static_str("c5")))
                    } else {
                        (-1, None)
                    };
                    let r = if version >= 8 {
                        OffsetFetchResponse::default().with_groups(vec![
                            OffsetFetchResponseGroup::default()
                                .with_group_id(StrBytes::from_static_str("lock").into())
                                .with_topics(vec![OffsetFetchResponseTopics::default()
                                    .with_name(name(LEDGER))
                                    .with_partitions(vec![
                                        OffsetFetchResponsePartitions::default()
                                            .with_partition_index(0)
                                            .with_committed_offset(offset)
                                            .with_metadata(metadata),
                                    ])]),
                        ])
                    } else {
                        OffsetFetchResponse::default().with_topics(vec![
                            OffsetFetchResponseTopic::default()
                                .with_name(name(LEDGER))
                                .with_partitions(vec![OffsetFetchResponsePartition::default()
                                    .with_partition_index(0)
                                    .with_committed_offset(offset)
                                    .with_metadata(metadata)]),
                        ])
                    };
                    Some(encode(&r, version))
                }
                ApiKey::ListOffsets => {
                    let r = ListOffsetsResponse::default().with_topics(vec![
                        ListOffsetsTopicResponse::default()
                            .with_name(name(LEDGER))
                            .with_partitions(vec![ListOffsetsPartitionResponse::default()
                                .with_partition_index(0)
                                .with_offset(0)]),
                    ]);
                    Some(encode(&r, version))
                }
                ApiKey::LeaveGroup => {
                    let r = LeaveGroupResponse::default()
                        .with_members(vec![MemberResponse::default()
                            .with_member_id(StrBytes::from_static_str(MEMBER))]);
                    Some(encode(&r, version))
                }
                _ => None,
            }
        })
    }

    /// A lock name whose lookups the pool stripes onto the second bootstrap connection (by Java's
    /// String.hashCode, as the pool stripes groups), not the first.
    fn group_on_the_second_stripe() -> String {
        let stripe = |g: &str| {
            let h = g
                .encode_utf16()
                .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)));
            (h.unsigned_abs() % 50) % 2
        };
        (0..)
            .map(|i| format!("lock-{i}"))
            .find(|g| stripe(g) == 1)
            .expect("a group on the second stripe")
    }

    /// The ledger topic's check (its Metadata, held here for `HOLD`) goes out beside the
    /// membership's first steps: the coordinator is looked up while the check is out, and the
    /// JoinGroup waits for the check's answer, so a topic that cannot serve is still refused
    /// before the member joins. The client has two quick connections and the group's stripe is
    /// not the first connection's, so the lookup does not queue behind the held Metadata (the
    /// fake, like Apache, answers one connection's requests in order). Breaks if the check came
    /// before the session again (no FindCoordinator until the Metadata is answered), or if the
    /// JoinGroup did not wait for it (a JoinGroup during the hold).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_ledger_topic_check_goes_out_beside_the_lookup_and_the_join_waits_for_it() {
        use kafka_protocol::messages::MetadataRequest;
        use std::time::Instant;
        const HOLD: Duration = Duration::from_secs(2);
        crate::support::init_tracing();
        let addr = Arc::new(OnceLock::new());
        let log: Log = Arc::default();
        let common = script(addr.clone(), log.clone(), Arc::new(AtomicBool::new(false)));
        let joined: Arc<Mutex<Option<Instant>>> = Arc::default();
        let released: Arc<Mutex<Option<Instant>>> = Arc::default();
        let (joined2, released2) = (joined.clone(), released.clone());
        let fake = fake_broker::start_parking(Arc::new(
            move |_conn, api, version, body: &mut BytesMut| {
                let now = Instant::now();
                let mut hold = Duration::ZERO;
                if api == ApiKey::JoinGroup {
                    joined2.lock().unwrap().get_or_insert(now);
                }
                if api == ApiKey::Metadata {
                    let req =
                        MetadataRequest::decode(&mut body.clone(), version).expect("Metadata");
                    let ledger = req
                        .topics
                        .iter()
                        .flatten()
                        .any(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == LEDGER));
                    let mut released = released2.lock().unwrap();
                    if ledger && released.is_none() {
                        *released = Some(now + HOLD);
                        hold = HOLD;
                    }
                }
                common(api, version, body).map(|b| (b, hold))
            },
        ))
        .await;
        addr.set(fake.addr).expect("set once");
        // A group whose lookups go on the second bootstrap connection, not on the first, which
        // carries the check.
        let group = group_on_the_second_stripe();
        let client = kafka_lock::Client::new(fake.addr.to_string()).quick_connections(2);
        let o = client
            .lock(group)
            .session_timeout(Duration::from_secs(6))
            .rebalance_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_secs(1))
            .lease_margin(Duration::from_secs(1))
            .ledger_topic(LEDGER)
            .ledger_push(false);
        let lookups = fake.lookups.clone();
        // No wait given: a bounded `acquire` looks at the group first (DescribeGroups, after a
        // FindCoordinator of its own), which this test must not count.
        let acquire = tokio::spawn(async move { o.acquire(None).await });
        // The fake counts its lookups but cannot signal them: looked at every millisecond.
        let looked_up = tokio::time::timeout(BOUND, async {
            while lookups.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Instant::now()
        })
        .await
        .expect("a FindCoordinator within the bound");
        let guard = tokio::time::timeout(BOUND, acquire)
            .await
            .expect("acquired within the bound")
            .expect("the acquire's task")
            .expect("acquire");
        let released = released
            .lock()
            .unwrap()
            .expect("the ledger's Metadata was asked for");
        let joined = joined.lock().unwrap().expect("a JoinGroup");
        assert!(
            looked_up < released,
            "the coordinator was looked up only once the ledger topic's check was answered"
        );
        assert!(
            joined >= released,
            "the JoinGroup went out before the ledger topic's check was answered"
        );
        tokio::time::timeout(BOUND, guard.release())
            .await
            .expect("release within the bound")
            .expect("release");
    }

    /// How the fake answers the ledger topic's check in [`gated_acquire`].
    #[derive(Clone, Copy)]
    enum Check {
        /// The topic is there, with a leader.
        Passes,
        /// UNKNOWN_TOPIC_OR_PARTITION.
        Missing,
    }

    /// A client of a fake that holds the ledger topic's Metadata for `hold` and then answers it
    /// as `check` says; every other request as `script` does. The group's lookups go on the
    /// second quick connection, not on the first, which carries the check, so the member finds
    /// its coordinator and opens its join lane while the check is held, and its JoinGroup waits
    /// at the gate. Returns the lock's options, how many JoinGroups the fake received, and the
    /// fake (kept for the test's length).
    async fn gated_acquire(
        hold: Duration,
        check: Check,
    ) -> (
        LockOptions,
        Arc<std::sync::atomic::AtomicUsize>,
        fake_broker::FakeBroker,
    ) {
        use kafka_protocol::messages::MetadataRequest;
        use std::sync::atomic::AtomicUsize;
        crate::support::init_tracing();
        let addr = Arc::new(OnceLock::new());
        let log: Log = Arc::default();
        let common = script(addr.clone(), log.clone(), Arc::new(AtomicBool::new(false)));
        let joins = Arc::new(AtomicUsize::new(0));
        let (joins2, held) = (joins.clone(), Arc::new(AtomicBool::new(false)));
        let fake = fake_broker::start_parking(Arc::new(
            move |_conn, api, version, body: &mut BytesMut| {
                if api == ApiKey::JoinGroup {
                    joins2.fetch_add(1, Ordering::SeqCst);
                }
                if api == ApiKey::Metadata {
                    let req =
                        MetadataRequest::decode(&mut body.clone(), version).expect("Metadata");
                    let ledger = req
                        .topics
                        .iter()
                        .flatten()
                        .any(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == LEDGER));
                    if ledger && !held.swap(true, Ordering::SeqCst) {
                        let answer = match check {
                            Check::Passes => common(api, version, body)?,
                            Check::Missing => encode(
                                &MetadataResponse::default().with_topics(vec![
                                    MetadataResponseTopic::default()
                                        .with_name(Some(name(LEDGER)))
                                        .with_error_code(3),
                                ]),
                                version,
                            ),
                        };
                        return Some((answer, hold));
                    }
                }
                common(api, version, body).map(|b| (b, Duration::ZERO))
            },
        ))
        .await;
        addr.set(fake.addr).expect("set once");
        let group = group_on_the_second_stripe();
        let client = kafka_lock::Client::new(fake.addr.to_string()).quick_connections(2);
        let o = client
            .lock(group)
            .session_timeout(Duration::from_secs(3))
            .rebalance_timeout(Duration::from_secs(3))
            .heartbeat_interval(Duration::from_secs(1))
            .lease_margin(Duration::from_millis(500))
            // Well past the longest hold of the check.
            .request_timeout(Duration::from_secs(10))
            .ledger_topic(LEDGER)
            .ledger_push(false);
        (o, joins, fake)
    }

    /// An acquisition that ends while the ledger topic's check is out (its wait ran out, or the
    /// check refused the topic) never joins the group: the member's JoinGroup, ready on its lane,
    /// is dropped with the gate instead of going out, and the refusal is the check's typed error,
    /// as when the check came first. Breaks if the gate opened on a Leave instead of closing, if
    /// a check that passed after the wait ended still let the JoinGroup go, or if a refused
    /// check still let it go (any of them: a JoinGroup reaches the broker, and the member, which
    /// leaves only once its JoinGroup is answered, has joined by the time `acquire` returns).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_acquisition_that_ends_during_the_ledger_topic_check_never_joins() {
        const HOLD: Duration = Duration::from_secs(2);
        // The wait runs out while the check is held; the check then passes.
        let (o, joins, fake) = gated_acquire(HOLD, Check::Passes).await;
        let err = tokio::time::timeout(BOUND, o.acquire(Some(Duration::from_millis(300))))
            .await
            .expect("the acquire ends within the bound")
            .expect_err("no hold within the wait");
        assert!(
            matches!(err, kafka_lock::Error::NotAcquired { .. }),
            "{err}"
        );
        assert!(
            fake.lookups.load(Ordering::SeqCst) > 0,
            "the member looked its coordinator up during the check"
        );
        assert_eq!(joins.load(Ordering::SeqCst), 0, "a JoinGroup went out");
        // The check refuses the topic while the JoinGroup waits for it.
        let (o, joins, fake) = gated_acquire(HOLD, Check::Missing).await;
        let err = tokio::time::timeout(BOUND, o.acquire(Some(BOUND)))
            .await
            .expect("the acquire ends within the bound")
            .expect_err("a missing ledger topic is refused");
        assert!(
            matches!(
                err,
                kafka_lock::Error::Ledger(kafka_lock::LedgerError::TopicMissing { .. })
            ),
            "{err}"
        );
        assert!(
            fake.lookups.load(Ordering::SeqCst) > 0,
            "the member looked its coordinator up during the check"
        );
        assert_eq!(joins.load(Ordering::SeqCst), 0, "a JoinGroup went out");
    }

    /// A check longer than the lease still gives a hold from the first JoinGroup: the lease is
    /// timed from the JoinGroup's leaving the gate, not from the machine's emitting it before
    /// the wait. Breaks if the driver stamped the JoinGroup as sent before the gate (the first
    /// lease would end before the JoinGroup was answered, and the member would join again).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_ledger_topic_check_longer_than_the_lease_still_holds_from_the_first_join() {
        // The lease is min(session, rebalance) - margin = 2.5 s.
        const HOLD: Duration = Duration::from_secs(4);
        let (o, joins, _fake) = gated_acquire(HOLD, Check::Passes).await;
        let guard = tokio::time::timeout(BOUND, o.acquire(Some(BOUND)))
            .await
            .expect("acquired within the bound")
            .expect("acquire");
        assert_eq!(
            joins.load(Ordering::SeqCst),
            1,
            "the hold came from a second JoinGroup: the first one's lease was lost to the check"
        );
        tokio::time::timeout(BOUND, guard.release())
            .await
            .expect("release within the bound")
            .expect("release");
    }

    /// An acquisition whose wait ends while the ledger topic's check is out leaves at once
    /// once the check is answered: its Leave drops the JoinGroup's gate, the held JoinGroup is
    /// answered as never sent, and the member, which has no id yet, is done. Breaks if the Leave
    /// left the gate shut: the member would wait for the answer of a JoinGroup that never goes
    /// out until its leave deadline (join timeout plus request timeout: 60 s with these timeouts), and
    /// `acquire` with it, its leave timeout being longer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_that_ends_during_the_ledger_topic_check_leaves_without_joining() {
        const HOLD: Duration = Duration::from_secs(2);
        // Far below the 60 s the break takes, far above the fix's HOLD and a few round trips.
        const PROMPTLY: Duration = Duration::from_secs(20);
        let (o, joins, _fake) = gated_acquire(HOLD, Check::Passes).await;
        let o = o
            .session_timeout(Duration::from_secs(6))
            .rebalance_timeout(Duration::from_secs(6))
            .lease_margin(Duration::from_secs(1))
            .request_timeout(Duration::from_secs(30))
            .leave_timeout(Duration::from_secs(90));
        let err = tokio::time::timeout(PROMPTLY, o.acquire(Some(Duration::from_millis(200))))
            .await
            .expect("the acquisition ended soon after the check was answered")
            .expect_err("the wait ended before the lock could be had");
        assert!(
            matches!(err, kafka_lock::Error::NotAcquired { .. }),
            "{err}"
        );
        assert_eq!(joins.load(Ordering::SeqCst), 0, "a JoinGroup went out");
    }

    /// `LockGuard::last_checkpoint` goes over the hold's own connections and starts at the
    /// coordinator and ledger leader the hold knows: no connection is opened and nothing looked
    /// up (no FindCoordinator, no Metadata), both when the group has the checkpoint (one
    /// OffsetFetch with the ledger's two ListOffsets beside it) and when it has none (the same;
    /// the ledger is empty, so no Fetch). Breaks if the guard read through
    /// `LockOptions::last_checkpoint` (a pool of its own: new connections, FindCoordinator,
    /// Metadata), or if the read looked the coordinator or the leader up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_holds_checkpoint_read_opens_no_connection_and_looks_nothing_up() {
        crate::support::init_tracing();
        let addr = Arc::new(OnceLock::new());
        let log: Log = Arc::default();
        let committed = Arc::new(AtomicBool::new(true));
        let fake = fake_broker::start(script(addr.clone(), log.clone(), committed.clone())).await;
        addr.set(fake.addr).expect("set once");
        let o = LockOptions::new(fake.addr.to_string(), "lock")
            .session_timeout(Duration::from_secs(6))
            .rebalance_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_secs(1))
            .lease_margin(Duration::from_secs(1))
            .ledger_topic(LEDGER)
            .ledger_push(false);
        let guard = tokio::time::timeout(BOUND, o.acquire(Some(BOUND)))
            .await
            .expect("acquired within the bound")
            .expect("acquire");

        let connections = fake.connections.load(Ordering::SeqCst);
        let lookups = fake.lookups.load(Ordering::SeqCst);
        let before = log.lock().unwrap().len();
        let found = tokio::time::timeout(BOUND, guard.last_checkpoint())
            .await
            .expect("read within the bound")
            .expect("read")
            .expect("the group's checkpoint");
        assert_eq!(
            (found.value.as_str(), found.token, found.source),
            ("c5", 5, CheckpointSource::Group)
        );
        let mut read: Vec<ApiKey> = log.lock().unwrap()[before..]
            .iter()
            .copied()
            .filter(|a| *a != ApiKey::Heartbeat)
            .collect();
        // The ledger's ends are asked together with the OffsetFetch (in any order), for the
        // case where the group has none.
        read.sort_by_key(|a| *a as i16);
        assert_eq!(
            read,
            [
                ApiKey::ListOffsets,
                ApiKey::ListOffsets,
                ApiKey::OffsetFetch
            ]
        );
        assert_eq!(
            fake.connections.load(Ordering::SeqCst),
            connections,
            "the read opened a connection"
        );
        assert_eq!(
            fake.lookups.load(Ordering::SeqCst),
            lookups,
            "the read looked the coordinator up"
        );

        committed.store(false, Ordering::SeqCst);
        let before = log.lock().unwrap().len();
        let found = tokio::time::timeout(BOUND, guard.last_checkpoint())
            .await
            .expect("read within the bound")
            .expect("read");
        assert_eq!(found, None);
        let mut read: Vec<ApiKey> = log.lock().unwrap()[before..]
            .iter()
            .copied()
            .filter(|a| *a != ApiKey::Heartbeat)
            .collect();
        read.sort_by_key(|a| *a as i16);
        assert_eq!(
            read,
            [
                ApiKey::ListOffsets,
                ApiKey::ListOffsets,
                ApiKey::OffsetFetch
            ]
        );
        assert_eq!(
            fake.connections.load(Ordering::SeqCst),
            connections,
            "the read opened a connection"
        );
        assert_eq!(
            fake.lookups.load(Ordering::SeqCst),
            lookups,
            "the read looked the coordinator up"
        );
        tokio::time::timeout(BOUND, guard.release())
            .await
            .expect("release within the bound")
            .expect("release");
    }

    /// A waiter that reads RELEASED in its long poll rejoins on a lane it already has open: the
    /// JoinGroup goes on a connection opened before the news, not a new one (connect, ApiVersions
    /// and handshake on the handover's path). The member `h-1` holds generation 1 (it sorts
    /// before `m-1` among members who never held); the first Fetch answers a RELEASED record of
    /// `h-1`'s generation 1, the next ones park; the first Metadata finds no leader. Breaks if the long poll that the same answer
    /// re-arms is sent before the JoinGroup and takes the idle lane (the session's flush sending
    /// the ledger's requests before the membership's answer to its news, with the JoinGroup's
    /// lane taken on its own task rather than at once). Current-thread, as the CLI runs.
    #[tokio::test]
    async fn a_waiters_rejoin_after_released_opens_no_connection() {
        use kafka_lock::internals::ledger::{LedgerRecord, RecordKind};
        use kafka_lock::internals::wire::records::{encode_batch, NewRecord};
        use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
        use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
        use kafka_protocol::messages::{FetchResponse, JoinGroupRequest, JoinGroupResponse};
        use std::sync::atomic::AtomicUsize;

        crate::support::init_tracing();
        let addr = Arc::new(OnceLock::new());
        let accepted: Arc<OnceLock<Arc<AtomicUsize>>> = Arc::new(OnceLock::new());
        let common = script(
            addr.clone(),
            Arc::default(),
            Arc::new(AtomicBool::new(false)),
        );
        // (connection, API) of every scripted request; the connections open when RELEASED went out.
        let seen: Arc<Mutex<Vec<(usize, ApiKey)>>> = Arc::default();
        let open_at_release = Arc::new(AtomicUsize::new(0));
        let joins = Arc::new(AtomicUsize::new(0));
        let fetches = Arc::new(AtomicUsize::new(0));
        let looked_up = AtomicBool::new(false);
        let (seen2, open2, accepted2) = (seen.clone(), open_at_release.clone(), accepted.clone());
        let released = LedgerRecord {
            unix_ms: 1_800_000_000_000,
            hold: 0,
            generation: 1,
            member_id: "h-1".into(),
            label: None,
            host: None,
            pid: None,
            slot: 0,
            kind: RecordKind::Released { held_ms: 1 },
        };
        let mut batch = BytesMut::new();
        encode_batch(
            &[NewRecord {
                timestamp: 1_800_000_000_000,
                key: Some(bytes::Bytes::from_static(b"lock")),
                value: Some(released.encode()),
                headers: Vec::new(),
            }],
            &mut batch,
        )
        .expect("encode");
        let batch = batch.freeze();
        let fake =
            fake_broker::start_parking(Arc::new(move |conn, api, version, body: &mut BytesMut| {
                seen2.lock().unwrap().push((conn, api));
                let now = Duration::ZERO;
                match api {
                    ApiKey::JoinGroup => {
                        let n = joins.fetch_add(1, Ordering::SeqCst) + 1;
                        let req = JoinGroupRequest::decode(body, version).expect("JoinGroup");
                        let protocol = req.protocols.first().expect("a protocol");
                        let member = |id: &'static str| {
                            JoinGroupResponseMember::default()
                                .with_member_id(StrBytes::from_static_str(id))
                                .with_metadata(protocol.metadata.clone())
                        };
                        let members = if n == 1 {
                            vec![member("h-1"), member(MEMBER)]
                        } else {
                            vec![member(MEMBER)]
                        };
                        let r = JoinGroupResponse::default()
                            .with_generation_id(n as i32)
                            .with_protocol_type(Some(req.protocol_type.clone()))
                            .with_protocol_name(Some(protocol.name.clone()))
                            .with_leader(StrBytes::from_static_str(MEMBER))
                            .with_member_id(StrBytes::from_static_str(MEMBER))
                            .with_members(members);
                        Some((encode(&r, version), now))
                    }
                    ApiKey::Fetch => {
                        let first = fetches.fetch_add(1, Ordering::SeqCst) == 0;
                        let mut p = PartitionData::default()
                            .with_partition_index(0)
                            .with_high_watermark(1)
                            .with_last_stable_offset(1);
                        if first {
                            p = p.with_records(Some(batch.clone()));
                            let open = accepted2.get().expect("set before any request");
                            open2.store(open.load(Ordering::SeqCst), Ordering::SeqCst);
                        }
                        let r = FetchResponse::default().with_responses(vec![
                            FetchableTopicResponse::default()
                                .with_topic(name(LEDGER))
                                .with_partitions(vec![p]),
                        ]);
                        // Later polls park as Apache parks them, with nothing new.
                        let hold = if first { now } else { Duration::from_secs(1) };
                        Some((encode(&r, version), hold))
                    }
                    // No leader at first: the session starts without the partition, so no lane is
                    // opened ahead for the ACQUIRED record, and the waiter has one lane to the
                    // broker, as when that lane's connect wins the race with the first JoinGroup's.
                    ApiKey::Metadata if !looked_up.swap(true, Ordering::SeqCst) => {
                        let r = MetadataResponse::default().with_topics(vec![
                            MetadataResponseTopic::default()
                                .with_name(Some(name(LEDGER)))
                                .with_error_code(5),
                        ]);
                        Some((encode(&r, version), now))
                    }
                    _ => common(api, version, body).map(|b| (b, now)),
                }
            }))
            .await;
        addr.set(fake.addr).expect("set once");
        accepted.set(fake.connections.clone()).expect("set once");
        let o = LockOptions::new(fake.addr.to_string(), "lock")
            .session_timeout(Duration::from_secs(6))
            .rebalance_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_secs(1))
            .lease_margin(Duration::from_secs(1))
            .ledger_topic(LEDGER);
        let guard = tokio::time::timeout(BOUND, o.acquire(Some(BOUND)))
            .await
            .expect("acquired within the bound")
            .expect("acquire");
        let seen = seen.lock().unwrap().clone();
        let rejoin = seen
            .iter()
            .filter(|(_, api)| *api == ApiKey::JoinGroup)
            .nth(1)
            .map(|(conn, _)| *conn)
            .expect("a waiter first, then a rejoin after RELEASED");
        let open = open_at_release.load(Ordering::SeqCst);
        assert!(open > 0, "RELEASED was read");
        assert!(
            rejoin <= open,
            "the rejoin's JoinGroup went on connection {rejoin}, opened after RELEASED was sent \
             ({open} were open then): {seen:?}"
        );
        tokio::time::timeout(BOUND, guard.release())
            .await
            .expect("release within the bound")
            .expect("release");
    }

    /// A hold's checkpoint read asks the ledger's ends while the group's OffsetFetch is still
    /// unanswered, so a group without a checkpoint costs one round trip before the tail's Fetch,
    /// not two. The ledger's leader is a second scripted broker; the coordinator holds the
    /// OffsetFetch answer for `HOLD`, and the leader notes whether a ListOffsets arrived before
    /// that answer could have been sent. Breaks if the ends are asked only after the OffsetFetch
    /// is answered (the read in sequence, as before).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_holds_checkpoint_read_asks_the_ledgers_ends_beside_the_offset_fetch() {
        use std::time::Instant;
        const HOLD: Duration = Duration::from_secs(3);
        crate::support::init_tracing();
        let leader_addr = Arc::new(OnceLock::new());
        let committed = Arc::new(AtomicBool::new(false));
        let asked: Arc<Mutex<Option<Instant>>> = Arc::default();
        let overlapped = Arc::new(AtomicBool::new(false));
        let leader_script = script(leader_addr.clone(), Arc::default(), committed.clone());
        let (asked2, overlapped2) = (asked.clone(), overlapped.clone());
        // The ledger's leader: its ListOffsets notes whether it came while the OffsetFetch was
        // held.
        let leader = fake_broker::start(Arc::new(move |api, version, body: &mut BytesMut| {
            if api == ApiKey::ListOffsets {
                if let Some(t) = *asked2.lock().unwrap() {
                    if t.elapsed() < HOLD {
                        overlapped2.store(true, Ordering::SeqCst);
                    }
                }
            }
            leader_script(api, version, body)
        }))
        .await;
        leader_addr.set(leader.addr).expect("set once");
        // The coordinator and bootstrap broker; its Metadata names the leader.
        let coordinator_script = script(leader_addr.clone(), Arc::default(), committed.clone());
        let park = Arc::new(AtomicBool::new(false));
        let (park2, asked2) = (park.clone(), asked.clone());
        let coordinator = fake_broker::start_parking(Arc::new(
            move |_conn, api, version, body: &mut BytesMut| {
                let hold = if api == ApiKey::OffsetFetch && park2.load(Ordering::SeqCst) {
                    *asked2.lock().unwrap() = Some(Instant::now());
                    HOLD
                } else {
                    Duration::ZERO
                };
                coordinator_script(api, version, body).map(|b| (b, hold))
            },
        ))
        .await;
        let o = LockOptions::new(coordinator.addr.to_string(), "lock")
            .session_timeout(Duration::from_secs(6))
            .rebalance_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_secs(1))
            .lease_margin(Duration::from_secs(1))
            .ledger_topic(LEDGER)
            .ledger_push(false);
        let guard = tokio::time::timeout(BOUND, o.acquire(Some(BOUND)))
            .await
            .expect("acquired within the bound")
            .expect("acquire");
        park.store(true, Ordering::SeqCst);
        let found = tokio::time::timeout(BOUND, guard.last_checkpoint())
            .await
            .expect("read within the bound")
            .expect("read");
        assert_eq!(found, None);
        assert!(asked.lock().unwrap().is_some(), "the group was asked");
        assert!(
            overlapped.load(Ordering::SeqCst),
            "the ledger's ends were asked only after the OffsetFetch was answered"
        );
        tokio::time::timeout(BOUND, guard.release())
            .await
            .expect("release within the bound")
            .expect("release");
    }

    /// The ledger's ends read beside the group's OffsetFetch are only a head start: when that
    /// read fails (here NOT_LEADER_OR_FOLLOWER, as from a leader that just moved) and the group
    /// has no checkpoint, the tail is read with ends asked again, and the previous holder's copy
    /// in the ledger is found. Breaks if a failed read of the ends were taken for an empty
    /// ledger (the read answers that no checkpoint was ever stored).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_read_of_the_ledgers_ends_beside_the_offset_fetch_is_read_again() {
        use kafka_lock::internals::ledger::{LedgerRecord, RecordKind};
        use kafka_lock::internals::wire::records::{encode_batch, NewRecord};
        use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
        use kafka_protocol::messages::{FetchResponse, ListOffsetsRequest};
        use std::sync::atomic::AtomicUsize;

        crate::support::init_tracing();
        let addr = Arc::new(OnceLock::new());
        let common = script(
            addr.clone(),
            Arc::default(),
            Arc::new(AtomicBool::new(false)),
        );
        // The previous holder's copy of its checkpoint, the ledger's only record of this lock.
        let copy = LedgerRecord {
            unix_ms: 1_800_000_000_000,
            hold: 0,
            generation: 1,
            member_id: "h-1".into(),
            label: None,
            host: None,
            pid: None,
            slot: 0,
            kind: RecordKind::Checkpoint {
                value: "theirs".into(),
            },
        };
        let mut batch = BytesMut::new();
        encode_batch(
            &[NewRecord {
                timestamp: 1_800_000_000_000,
                key: Some(bytes::Bytes::from_static(b"lock")),
                value: Some(copy.encode()),
                headers: Vec::new(),
            }],
            &mut batch,
        )
        .expect("encode");
        let batch = batch.freeze();
        // Set once the lock is held: the next two ListOffsets (the ends asked beside the
        // OffsetFetch) fail.
        let failing = Arc::new(AtomicUsize::new(0));
        let failing2 = failing.clone();
        let fake = fake_broker::start(Arc::new(move |api, version, body: &mut BytesMut| {
            match api {
                ApiKey::ListOffsets => {
                    let req = ListOffsetsRequest::decode(body, version).expect("ListOffsets");
                    let timestamp = req
                        .topics
                        .first()
                        .and_then(|t| t.partitions.first())
                        .map(|p| p.timestamp)
                        .expect("one partition");
                    let fail = failing2
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                    let p = ListOffsetsPartitionResponse::default().with_partition_index(0);
                    let p = if fail {
                        p.with_error_code(6)
                    } else {
                        // Earliest (-2): 0; latest (-1): 1, past the copy.
                        p.with_offset(if timestamp == -2 { 0 } else { 1 })
                    };
                    let r = ListOffsetsResponse::default().with_topics(vec![
                        ListOffsetsTopicResponse::default()
                            .with_name(name(LEDGER))
                            .with_partitions(vec![p]),
                    ]);
                    Some(encode(&r, version))
                }
                ApiKey::Fetch => {
                    let p = PartitionData::default()
                        .with_partition_index(0)
                        .with_high_watermark(1)
                        .with_last_stable_offset(1)
                        .with_records(Some(batch.clone()));
                    let r = FetchResponse::default().with_responses(vec![
                        FetchableTopicResponse::default()
                            .with_topic(name(LEDGER))
                            .with_partitions(vec![p]),
                    ]);
                    Some(encode(&r, version))
                }
                _ => common(api, version, body),
            }
        }))
        .await;
        addr.set(fake.addr).expect("set once");
        let o = LockOptions::new(fake.addr.to_string(), "lock")
            .session_timeout(Duration::from_secs(6))
            .rebalance_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_secs(1))
            .lease_margin(Duration::from_secs(1))
            .ledger_topic(LEDGER)
            .ledger_push(false);
        let guard = tokio::time::timeout(BOUND, o.acquire(Some(BOUND)))
            .await
            .expect("acquired within the bound")
            .expect("acquire");
        failing.store(2, Ordering::SeqCst);
        let found = tokio::time::timeout(BOUND, guard.last_checkpoint())
            .await
            .expect("read within the bound")
            .expect("read")
            .expect("the previous holder's copy in the ledger");
        assert_eq!(
            (found.value.as_str(), found.token, found.source),
            ("theirs", 0, CheckpointSource::Ledger)
        );
        assert_eq!(
            failing.load(Ordering::SeqCst),
            0,
            "the ends read beside failed"
        );
        tokio::time::timeout(BOUND, guard.release())
            .await
            .expect("release within the bound")
            .expect("release");
    }
    /// With `read_checkpoint_on_acquire`, the checkpoint read (OffsetFetch, the ledger's ends
    /// beside it) goes out while the ACQUIRED append is still unanswered, and the hold begins
    /// only once both are answered, whichever is answered last: first the Produce is held for
    /// `HOLD` (the OffsetFetch must arrive meanwhile, and `acquire` return only after), then the
    /// OffsetFetch is (`acquire` returns only after it). The guard's first `last_checkpoint` is
    /// that read, with no request of its own. Breaks if the read starts only once ACQUIRED is
    /// acknowledged (the OffsetFetch comes after the held Produce), or if either answer alone
    /// begins the hold (`acquire` returns before the held answer).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_checkpoint_read_goes_out_beside_the_acquired_append_and_the_hold_waits_for_both() {
        use std::time::Instant;
        const HOLD: Duration = Duration::from_secs(1);
        crate::support::init_tracing();
        for parked in [ApiKey::Produce, ApiKey::OffsetFetch] {
            let addr = Arc::new(OnceLock::new());
            let log: Log = Arc::default();
            let common = script(addr.clone(), log.clone(), Arc::new(AtomicBool::new(true)));
            // When each API first arrived, and when the parked answer was let go.
            let arrived: Arc<Mutex<Vec<(ApiKey, Instant)>>> = Arc::default();
            let released: Arc<Mutex<Option<Instant>>> = Arc::default();
            let (arrived2, released2) = (arrived.clone(), released.clone());
            let fake = fake_broker::start_parking(Arc::new(
                move |_conn, api, version, body: &mut BytesMut| {
                    let now = Instant::now();
                    arrived2.lock().unwrap().push((api, now));
                    let mut released = released2.lock().unwrap();
                    let hold = if api == parked && released.is_none() {
                        *released = Some(now + HOLD);
                        HOLD
                    } else {
                        Duration::ZERO
                    };
                    common(api, version, body).map(|b| (b, hold))
                },
            ))
            .await;
            addr.set(fake.addr).expect("set once");
            let o = LockOptions::new(fake.addr.to_string(), "lock")
                .session_timeout(Duration::from_secs(6))
                .rebalance_timeout(Duration::from_secs(6))
                .heartbeat_interval(Duration::from_secs(1))
                .lease_margin(Duration::from_secs(1))
                .ledger_topic(LEDGER)
                .ledger_push(false)
                .read_checkpoint_on_acquire(true);
            let guard = tokio::time::timeout(BOUND, o.acquire(Some(BOUND)))
                .await
                .expect("acquired within the bound")
                .expect("acquire");
            let returned = Instant::now();
            let released = released
                .lock()
                .unwrap()
                .expect("the parked answer was asked for");
            let arrived = arrived.lock().unwrap().clone();
            let first = |api: ApiKey| {
                arrived
                    .iter()
                    .find(|(a, _)| *a == api)
                    .map(|(_, t)| *t)
                    .unwrap_or_else(|| panic!("no {api:?}: {arrived:?}"))
            };
            let other = if parked == ApiKey::Produce {
                ApiKey::OffsetFetch
            } else {
                ApiKey::Produce
            };
            assert!(
                first(other) < released,
                "{other:?} came only after the parked {parked:?} was answered"
            );
            assert!(
                returned >= released,
                "the hold began before the {parked:?} was answered"
            );
            let fetches = |log: &Log| {
                log.lock()
                    .unwrap()
                    .iter()
                    .filter(|a| **a == ApiKey::OffsetFetch)
                    .count()
            };
            assert_eq!(fetches(&log), 1);
            let found = tokio::time::timeout(BOUND, guard.last_checkpoint())
                .await
                .expect("read within the bound")
                .expect("read")
                .expect("the group's checkpoint");
            assert_eq!(
                (found.value.as_str(), found.token, found.source),
                ("c5", 5, CheckpointSource::Group)
            );
            assert_eq!(fetches(&log), 1, "the guard read again");
            tokio::time::timeout(BOUND, guard.release())
                .await
                .expect("release within the bound")
                .expect("release");
        }
    }

    /// A guard's first `last_checkpoint` answers with the read made at the grant only while
    /// that hold still runs: once it is lost, another holder may have stored a newer checkpoint
    /// (here the coordinator forgets the holder, and the group's checkpoint appears after), and
    /// the call reads afresh, as it does without `read_checkpoint_on_acquire`: it finds "c5", or
    /// fails as that read fails once the lost session has closed its connections. Breaks if the
    /// grant's read were handed out after the hold ended: the call would answer the older
    /// checkpoint (none) although "c5" was stored after the loss and before the call.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_guard_does_not_answer_with_the_read_made_at_its_grant() {
        use kafka_protocol::messages::JoinGroupResponse;
        crate::support::init_tracing();
        let addr = Arc::new(OnceLock::new());
        let log: Log = Arc::default();
        let committed = Arc::new(AtomicBool::new(false));
        let common = script(addr.clone(), log.clone(), committed.clone());
        let fenced = Arc::new(AtomicBool::new(false));
        let fenced_now = fenced.clone();
        let fake = fake_broker::start(Arc::new(move |api, version, body: &mut BytesMut| {
            if fenced_now.load(Ordering::SeqCst) {
                match api {
                    // UNKNOWN_MEMBER_ID: the coordinator no longer knows the holder.
                    ApiKey::Heartbeat => {
                        let r = HeartbeatResponse::default().with_error_code(25);
                        return Some(encode(&r, version));
                    }
                    // COORDINATOR_NOT_AVAILABLE: no new hold for this member meanwhile.
                    ApiKey::JoinGroup => {
                        let r = JoinGroupResponse::default().with_error_code(15);
                        return Some(encode(&r, version));
                    }
                    _ => {}
                }
            }
            common(api, version, body)
        }))
        .await;
        addr.set(fake.addr).expect("set once");
        let o = LockOptions::new(fake.addr.to_string(), "lock")
            .session_timeout(Duration::from_secs(6))
            .rebalance_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_secs(1))
            .lease_margin(Duration::from_secs(1))
            .ledger_topic(LEDGER)
            .ledger_push(false)
            .read_checkpoint_on_acquire(true);
        let guard = tokio::time::timeout(BOUND, o.acquire(Some(BOUND)))
            .await
            .expect("acquired within the bound")
            .expect("acquire");
        fenced.store(true, Ordering::SeqCst);
        tokio::time::timeout(BOUND, guard.lost())
            .await
            .expect("lost within the bound");
        committed.store(true, Ordering::SeqCst);
        let read = tokio::time::timeout(BOUND, guard.last_checkpoint())
            .await
            .expect("read within the bound");
        match read {
            Ok(found) => assert_eq!(
                found.map(|c| (c.value, c.token)),
                Some(("c5".to_owned(), 5)),
                "a read begun after c5 was stored answered an older checkpoint"
            ),
            Err(e) => assert!(matches!(e, kafka_lock::Error::Closed), "{e}"),
        }
        drop(guard);
    }

    // ---- reads of the ledger outside any hold: a whole history, the checkpoint's tail -----------

    /// Fetches whose answer the fake cuts after this many batches, whatever the limit asked:
    /// a read of more batches than that needs several Fetches, as one of more bytes than a
    /// Fetch's limit does on Apache.
    const BATCHES_PER_FETCH: usize = 2;

    /// A ledger partition served by the fake: its retained batches (base offset, record count,
    /// the batch as written), and the ends ListOffsets reports (earliest, latest). The batches
    /// may run past `end`: records appended after the ends were read.
    struct Ledger {
        start: i64,
        end: i64,
        batches: Vec<(i64, i64, bytes::Bytes)>,
        /// The base offsets of the batches the fake only ever sends the first bytes of, as a
        /// broker older than KIP-74 cuts a batch at the Fetch's limit.
        cut: Vec<i64>,
        /// While above 0, each Fetch takes one from it and is answered with bytes that do not
        /// decode as a Fetch answer.
        garbled: Arc<std::sync::atomic::AtomicUsize>,
    }

    /// Each Fetch the fake was asked: its offset, its byte limit, when it came.
    type Fetches = Arc<Mutex<Vec<(i64, i32, std::time::Instant)>>>;

    /// One record of the ledger: its key (the lock's name) and what it says.
    fn rec(
        key: &'static str,
        hold: i64,
        kind: kafka_lock::internals::ledger::RecordKind,
    ) -> (&'static str, kafka_lock::internals::ledger::LedgerRecord) {
        let r = kafka_lock::internals::ledger::LedgerRecord {
            unix_ms: 1_800_000_000_000,
            hold,
            generation: 1,
            member_id: format!("{key}-member"),
            label: None,
            host: None,
            pid: None,
            slot: 0,
            kind,
        };
        (key, r)
    }

    fn acquired(key: &'static str) -> (&'static str, kafka_lock::internals::ledger::LedgerRecord) {
        rec(
            key,
            -1,
            kafka_lock::internals::ledger::RecordKind::Acquired { lease_ms: 5000 },
        )
    }

    fn released(
        key: &'static str,
        hold: i64,
    ) -> (&'static str, kafka_lock::internals::ledger::LedgerRecord) {
        rec(
            key,
            hold,
            kafka_lock::internals::ledger::RecordKind::Released { held_ms: 10 },
        )
    }

    fn checkpoint(
        key: &'static str,
        hold: i64,
        value: &str,
    ) -> (&'static str, kafka_lock::internals::ledger::LedgerRecord) {
        rec(
            key,
            hold,
            kafka_lock::internals::ledger::RecordKind::Checkpoint {
                value: value.into(),
            },
        )
    }

    impl Ledger {
        fn new(start: i64, end: i64) -> Self {
            Ledger {
                start,
                end,
                batches: Vec::new(),
                cut: Vec::new(),
                garbled: Arc::default(),
            }
        }

        /// Adds a batch of `records` at `base` (batches in offset order).
        fn batch(
            mut self,
            base: i64,
            records: &[(&'static str, kafka_lock::internals::ledger::LedgerRecord)],
        ) -> Self {
            use kafka_lock::internals::wire::records::{encode_batch, NewRecord};
            let recs: Vec<NewRecord> = records
                .iter()
                .map(|(key, r)| NewRecord {
                    timestamp: r.unix_ms,
                    key: Some(bytes::Bytes::from_static(key.as_bytes())),
                    value: Some(r.encode()),
                    headers: Vec::new(),
                })
                .collect();
            let mut out = BytesMut::new();
            encode_batch(&recs, &mut out).expect("encode");
            // The base offset lies outside the CRC: the batch stays valid.
            out[..8].copy_from_slice(&base.to_be_bytes());
            self.batches
                .push((base, records.len() as i64, out.freeze()));
            self
        }

        /// [`Ledger::batch`] with a byte of its last record changed: its CRC no longer matches.
        fn corrupt_batch(
            self,
            base: i64,
            records: &[(&'static str, kafka_lock::internals::ledger::LedgerRecord)],
        ) -> Self {
            let mut l = self.batch(base, records);
            let (b, n, bytes) = l.batches.pop().expect("just added");
            let mut bytes = BytesMut::from(&bytes[..]);
            let last = bytes.len() - 1;
            bytes[last] ^= 0xff;
            l.batches.push((b, n, bytes.freeze()));
            l
        }

        /// [`Ledger::batch`], always sent cut after its first 40 bytes (its header's base
        /// offset, length and last offset delta among them).
        fn cut_batch(
            mut self,
            base: i64,
            records: &[(&'static str, kafka_lock::internals::ledger::LedgerRecord)],
        ) -> Self {
            self.cut.push(base);
            self.batch(base, records)
        }

        /// A batch at `base` of one record of this lock with a value of 2 MiB: sent whole (the
        /// first batch of an answer always is), it is past a ledger connection's frame limit
        /// (1 MiB + 64 KiB).
        fn big_batch(mut self, base: i64) -> Self {
            use kafka_lock::internals::wire::records::{encode_batch, NewRecord};
            let mut out = BytesMut::new();
            encode_batch(
                &[NewRecord {
                    timestamp: 1_800_000_000_000,
                    key: Some(bytes::Bytes::from_static(b"lock")),
                    value: Some(bytes::Bytes::from(vec![b'x'; 2 << 20])),
                    headers: Vec::new(),
                }],
                &mut out,
            )
            .expect("encode");
            out[..8].copy_from_slice(&base.to_be_bytes());
            self.batches.push((base, 1, out.freeze()));
            self
        }

        /// The Fetch answer from `offset`, as Apache gives it: whole batches from the one that
        /// holds `offset`, at least one, no more bytes than `max_bytes` after the first (and
        /// no more than [`BATCHES_PER_FETCH`]).
        fn fetch(&self, offset: i64, max_bytes: i32) -> BytesMut {
            let mut records = BytesMut::new();
            let mut taken = 0;
            for (base, count, b) in &self.batches {
                if base + count <= offset {
                    continue;
                }
                let fits = records.len() + b.len() <= usize::try_from(max_bytes).unwrap_or(0);
                if taken == BATCHES_PER_FETCH || (taken > 0 && !fits) {
                    break;
                }
                if self.cut.contains(base) {
                    records.extend_from_slice(&b[..40]);
                    break;
                }
                records.extend_from_slice(b);
                taken += 1;
            }
            records
        }

        /// The fake's answers for the ledger partition (ListOffsets, Fetch) over `common`'s for
        /// the rest; each Fetch goes to `fetches`. A Fetch answered while `failing` is above 0
        /// takes one from it and answers NOT_LEADER_OR_FOLLOWER (retriable: the read starts
        /// over).
        fn serve(
            self,
            common: Arc<fake_broker::Script>,
            fetches: Fetches,
            failing: Arc<std::sync::atomic::AtomicUsize>,
        ) -> Arc<fake_broker::Script> {
            use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
            use kafka_protocol::messages::{FetchRequest, FetchResponse, ListOffsetsRequest};
            Arc::new(move |api, version, body: &mut BytesMut| {
                let fail = || {
                    failing
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok()
                };
                match api {
                    ApiKey::ListOffsets => {
                        let req = ListOffsetsRequest::decode(body, version).expect("ListOffsets");
                        let timestamp = req.topics[0].partitions[0].timestamp;
                        // Earliest (-2) and latest (-1), read committed.
                        let p = ListOffsetsPartitionResponse::default()
                            .with_partition_index(0)
                            .with_offset(if timestamp == -2 {
                                self.start
                            } else {
                                self.end
                            });
                        let r = ListOffsetsResponse::default().with_topics(vec![
                            ListOffsetsTopicResponse::default()
                                .with_name(name(LEDGER))
                                .with_partitions(vec![p]),
                        ]);
                        Some(encode(&r, version))
                    }
                    ApiKey::Fetch => {
                        let req = FetchRequest::decode(body, version).expect("Fetch");
                        let asked = &req.topics[0].partitions[0];
                        let (offset, max) = (asked.fetch_offset, asked.partition_max_bytes);
                        fetches
                            .lock()
                            .unwrap()
                            .push((offset, max, std::time::Instant::now()));
                        let garble = self
                            .garbled
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                            .is_ok();
                        if garble {
                            return Some(BytesMut::from(&[0xffu8; 7][..]));
                        }
                        let p = PartitionData::default().with_partition_index(0);
                        let p = if fail() {
                            p.with_error_code(6)
                        } else {
                            let hw = self
                                .batches
                                .last()
                                .map_or(self.end, |(b, n, _)| (b + n).max(self.end));
                            p.with_high_watermark(hw)
                                .with_last_stable_offset(hw)
                                .with_log_start_offset(self.start)
                                .with_records(Some(self.fetch(offset, max).freeze()))
                        };
                        let r = FetchResponse::default().with_responses(vec![
                            FetchableTopicResponse::default()
                                .with_topic(name(LEDGER))
                                .with_partitions(vec![p]),
                        ]);
                        Some(encode(&r, version))
                    }
                    _ => common(api, version, body),
                }
            })
        }
    }

    /// A fake serving `ledger` (no checkpoint committed in the group), the options of a lock
    /// named "lock" on it with a short retry backoff, and the log of its Fetches.
    async fn ledger_fake(
        ledger: Ledger,
        failing: Arc<std::sync::atomic::AtomicUsize>,
    ) -> (fake_broker::FakeBroker, LockOptions, Fetches) {
        let addr = Arc::new(OnceLock::new());
        let common = script(
            addr.clone(),
            Arc::default(),
            Arc::new(AtomicBool::new(false)),
        );
        let fetches: Fetches = Arc::default();
        let fake = fake_broker::start(ledger.serve(common, fetches.clone(), failing)).await;
        addr.set(fake.addr).expect("set once");
        let o = LockOptions::new(fake.addr.to_string(), "lock")
            .ledger_topic(LEDGER)
            .retry_backoff(Duration::from_millis(5), Duration::from_millis(20));
        (fake, o, fetches)
    }

    /// A whole history read over several Fetches keeps exactly this lock's records between the
    /// ends read at its start: not another lock's sharing the topic, not those of a batch that
    /// begins before the log start (Apache sends whole batches), not those appended after the
    /// end was read. Each Fetch asks for hundreds of KiB (`READ_BYTES`), within a connection's
    /// 1 MiB frame limit. Breaks if the read kept records by another key or outside its range,
    /// stopped after the first Fetch, or asked for a few KiB per Fetch.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_history_read_over_several_fetches_keeps_only_this_locks_records_in_its_range() {
        let ledger = Ledger::new(10, 22)
            // Offsets 8 and 9 lie before the log start: a hold that began before it.
            .batch(
                8,
                &[acquired("lock"), released("lock", 8), acquired("lock")],
            )
            .batch(11, &[acquired("other"), released("other", 11)])
            .batch(13, &[checkpoint("lock", 10, "c"), released("lock", 10)])
            // Unreadable: skipped, and named by its own offset.
            .corrupt_batch(15, &[acquired("other"), released("other", 15)])
            .batch(17, &[acquired("other"), released("other", 17)])
            .batch(21, &[acquired("lock")])
            // Appended after the ends were read.
            .batch(22, &[released("lock", 21), acquired("lock")]);
        let (_fake, o, fetches) = ledger_fake(ledger, Arc::default()).await;
        let h = tokio::time::timeout(BOUND, o.history())
            .await
            .expect("read within the bound")
            .expect("history");
        let holds: Vec<(i64, &str, Option<&str>)> = h
            .holds
            .iter()
            .map(|x| {
                let c = x.checkpoint.as_ref().map(|(v, _)| v.as_str());
                (x.token, x.end.name(), c)
            })
            .collect();
        assert_eq!(
            holds,
            vec![(10, "released", Some("c")), (21, "open", None)],
            "{h:?}"
        );
        let unreadable: Vec<i64> = h.unreadable.iter().map(|u| u.offset).collect();
        assert_eq!(unreadable, vec![15], "{:?}", h.unreadable);
        assert_eq!((h.first_offset, h.end_offset), (10, 22));
        // The third Fetch ends at the end read at the start: no fourth.
        let fetches = fetches.lock().unwrap().clone();
        let offsets: Vec<i64> = fetches.iter().map(|f| f.0).collect();
        assert_eq!(offsets, vec![10, 13, 17], "{fetches:?}");
        for (_, max, _) in fetches {
            assert!(
                (256 * 1024..1024 * 1024).contains(&max),
                "a history Fetch asked for {max} bytes"
            );
        }
    }

    /// The last checkpoint without one in the group: the ledger is read back from its end in
    /// windows of 2048 offsets and then twice as many each time, and no further than a window
    /// that shows a checkpoint of hold T and every offset above T. Here a checkpoint of hold
    /// 4000 is settled by the first window (no Fetch below it), one of hold 100 only by the
    /// second. Breaks if the read stopped after a window that settles nothing, or went on past
    /// one that does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_checkpoint_tail_is_read_back_in_growing_windows_until_a_checkpoint_is_settled() {
        let old = || {
            Ledger::new(0, 5001)
                .batch(100, &[acquired("lock")])
                .batch(101, &[checkpoint("lock", 100, "old")])
                .batch(3000, &[acquired("other")])
        };
        for (ledger, want, offsets) in [
            // No batch above 3000 though the end is 5001 (a transaction's aborted records,
            // which a read-committed Fetch skips): the Fetch from 3001 answers nothing.
            (old(), ("old", 100), vec![2953, 3001, 0, 102]),
            (
                old()
                    .batch(4000, &[acquired("lock")])
                    .batch(4001, &[checkpoint("lock", 4000, "new")])
                    .batch(5000, &[acquired("other")]),
                ("new", 4000),
                vec![2953, 4001],
            ),
        ] {
            let (_fake, o, fetches) = ledger_fake(ledger, Arc::default()).await;
            let found = tokio::time::timeout(BOUND, o.last_checkpoint())
                .await
                .expect("read within the bound")
                .expect("read")
                .expect("a checkpoint in the ledger");
            assert_eq!(
                (found.value.as_str(), found.token, found.source),
                (want.0, want.1, CheckpointSource::Ledger)
            );
            let asked: Vec<i64> = fetches.lock().unwrap().iter().map(|f| f.0).collect();
            assert_eq!(asked, offsets, "the Fetches of the read for {want:?}");
        }
    }

    /// The tail read stops 32768 offsets below the end (`TAIL_MAX_OFFSETS`): a checkpoint just
    /// above that bound is found, one below it is not read at all (no Fetch below the bound),
    /// and without one above the bound the answer is none, though `history` would find it.
    /// Breaks if the bound were a thousand offsets (the checkpoint above it is missed) or none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_checkpoint_tail_reads_no_further_than_its_bound() {
        const END: i64 = 40_000;
        const FLOOR: i64 = END - 32 * 1024;
        let below = || {
            Ledger::new(0, END)
                .batch(100, &[acquired("lock")])
                .batch(101, &[checkpoint("lock", 100, "too old")])
        };
        for (ledger, want) in [
            (
                below()
                    .batch(FLOOR + 68, &[acquired("lock")])
                    .batch(FLOOR + 69, &[checkpoint("lock", FLOOR + 68, "kept")])
                    .batch(39_000, &[acquired("other")]),
                Some(("kept".to_owned(), FLOOR + 68)),
            ),
            (below().batch(39_000, &[acquired("other")]), None),
        ] {
            let (_fake, o, fetches) = ledger_fake(ledger, Arc::default()).await;
            let found = tokio::time::timeout(BOUND, o.last_checkpoint())
                .await
                .expect("read within the bound")
                .expect("read");
            assert_eq!(found.map(|c| (c.value, c.token)), want);
            let asked: Vec<i64> = fetches.lock().unwrap().iter().map(|f| f.0).collect();
            assert!(
                asked.iter().all(|&at| at >= FLOOR) && asked.contains(&FLOOR),
                "the tail read reached {asked:?}, bound {FLOOR}"
            );
        }
    }

    /// A read of the ledger that fails with a retriable error starts over after the lock's
    /// retry backoff, and gives up after five tries with that error. Breaks if the read gave up
    /// at the first failure, tried a sixth time or without end, or waited the default backoff
    /// (100 ms) instead of the one set (a second here).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_ledger_read_starts_over_after_the_backoff_five_times_at_most() {
        use std::sync::atomic::AtomicUsize;
        const BACKOFF: Duration = Duration::from_secs(1);
        let ledger = || {
            Ledger::new(0, 2)
                .batch(0, &[acquired("lock")])
                .batch(1, &[released("lock", 0)])
        };
        // One failure: read again after the backoff (drawn from half of it to all of it).
        let (_fake, o, fetches) = ledger_fake(ledger(), Arc::new(AtomicUsize::new(1))).await;
        let o = o.retry_backoff(BACKOFF, BACKOFF);
        let h = tokio::time::timeout(BOUND, o.history())
            .await
            .expect("read within the bound")
            .expect("history after one failure");
        let tokens: Vec<i64> = h.holds.iter().map(|x| x.token).collect();
        assert_eq!(tokens, vec![0]);
        let fetches = fetches.lock().unwrap().clone();
        assert_eq!(fetches.len(), 2, "{fetches:?}");
        let waited = fetches[1].2 - fetches[0].2;
        assert!(
            waited >= BACKOFF / 2,
            "read again {waited:?} after a failure, backoff {BACKOFF:?}"
        );

        // Failing for ever: five tries, then the error.
        let (_fake, o, fetches) =
            ledger_fake(ledger(), Arc::new(AtomicUsize::new(usize::MAX))).await;
        let e = tokio::time::timeout(BOUND, o.history())
            .await
            .expect("read within the bound")
            .expect_err("a read that never succeeds");
        assert!(
            matches!(&e, kafka_lock::Error::Broker { code, .. } if code.0 == 6),
            "{e}"
        );
        assert_eq!(fetches.lock().unwrap().len(), 5);
    }

    /// The group's checkpoint read (OffsetFetch) answered COORDINATOR_LOAD_IN_PROGRESS is asked
    /// again, and given up after five answers so. Breaks if the read failed at the first such
    /// answer, or asked a sixth time or without end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_committed_checkpoint_read_is_asked_again_while_the_coordinator_loads_five_times_at_most(
    ) {
        use kafka_protocol::messages::OffsetFetchResponse;
        use std::sync::atomic::AtomicUsize;
        for (loading, want) in [(2, Ok(("c5".to_owned(), 5))), (usize::MAX, Err(14))] {
            let addr = Arc::new(OnceLock::new());
            let common = script(
                addr.clone(),
                Arc::default(),
                Arc::new(AtomicBool::new(true)),
            );
            let left = Arc::new(AtomicUsize::new(loading));
            let asked = Arc::new(AtomicUsize::new(0));
            let (left2, asked2) = (left.clone(), asked.clone());
            let fake = fake_broker::start(Arc::new(move |api, version, body: &mut BytesMut| {
                if api == ApiKey::OffsetFetch {
                    asked2.fetch_add(1, Ordering::SeqCst);
                    let loading = left2
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                    if loading {
                        let r = if version >= 8 {
                            OffsetFetchResponse::default().with_groups(vec![
                                OffsetFetchResponseGroup::default()
                                    .with_group_id(StrBytes::from_static_str("lock").into())
                                    .with_error_code(14),
                            ])
                        } else {
                            OffsetFetchResponse::default().with_error_code(14)
                        };
                        return Some(encode(&r, version));
                    }
                }
                common(api, version, body)
            }))
            .await;
            addr.set(fake.addr).expect("set once");
            let o = LockOptions::new(fake.addr.to_string(), "lock")
                .ledger_topic(LEDGER)
                .retry_backoff(Duration::from_millis(5), Duration::from_millis(20));
            let read = tokio::time::timeout(BOUND, o.committed_checkpoint())
                .await
                .expect("read within the bound");
            match (read, want) {
                (Ok(found), Ok(want)) => {
                    assert_eq!(found.map(|c| (c.value, c.token)), Some(want));
                    assert_eq!(asked.load(Ordering::SeqCst), 3);
                }
                (Err(e), Err(code)) => {
                    assert!(
                        matches!(&e, kafka_lock::Error::Broker { code: c, .. } if c.0 == code),
                        "{e}"
                    );
                    assert_eq!(asked.load(Ordering::SeqCst), 5);
                }
                (read, want) => panic!("read {read:?}, wanted {want:?}"),
            }
        }
    }

    /// `release` says whether the coordinator answered the LeaveGroup: `Confirmed` for an
    /// answer without error, `Unconfirmed` for COORDINATOR_NOT_AVAILABLE (the member may stay
    /// in the group until its session times out, and a waiter with it). Breaks if `release`
    /// reported a leave confirmed whatever the answer, or never.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_says_whether_the_coordinator_answered_the_leave() {
        for (code, want) in [
            (0, kafka_lock::Release::Confirmed),
            (15, kafka_lock::Release::Unconfirmed),
        ] {
            let addr = Arc::new(OnceLock::new());
            let common = script(
                addr.clone(),
                Arc::default(),
                Arc::new(AtomicBool::new(false)),
            );
            let fake = fake_broker::start(Arc::new(move |api, version, body: &mut BytesMut| {
                if api == ApiKey::LeaveGroup && code != 0 {
                    let r = LeaveGroupResponse::default().with_error_code(code);
                    return Some(encode(&r, version));
                }
                common(api, version, body)
            }))
            .await;
            addr.set(fake.addr).expect("set once");
            let o = LockOptions::new(fake.addr.to_string(), "lock")
                .session_timeout(Duration::from_secs(6))
                .rebalance_timeout(Duration::from_secs(6))
                .heartbeat_interval(Duration::from_secs(1))
                .lease_margin(Duration::from_secs(1));
            let guard = tokio::time::timeout(BOUND, o.acquire(Some(BOUND)))
                .await
                .expect("acquired within the bound")
                .expect("acquire");
            let release = tokio::time::timeout(BOUND, guard.release())
                .await
                .expect("released within the bound")
                .expect("release");
            assert_eq!(release, want, "LeaveGroup answered {code}");
        }
    }

    /// A read of the ledger checks the topic's `compression.type` first when the broker offers
    /// DescribeConfigs: `gzip` (the broker would recompress kafka-lock's batches) is refused
    /// before anything is fetched, `producer` is read. Breaks if the check were skipped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_history_read_refuses_a_ledger_topic_that_recompresses() {
        use kafka_protocol::messages::describe_configs_response::{
            DescribeConfigsResourceResult, DescribeConfigsResult,
        };
        use kafka_protocol::messages::DescribeConfigsResponse;
        for codec in ["gzip", "producer"] {
            let addr = Arc::new(OnceLock::new());
            let common = script(
                addr.clone(),
                Arc::default(),
                Arc::new(AtomicBool::new(false)),
            );
            let fetches: Fetches = Arc::default();
            let ledger = Ledger::new(0, 1).batch(0, &[acquired("lock")]).serve(
                common,
                fetches.clone(),
                Arc::default(),
            );
            let fake = fake_broker::start_with_apis(
                Arc::new(move |api, version, body: &mut BytesMut| {
                    if api != ApiKey::DescribeConfigs {
                        return ledger(api, version, body);
                    }
                    let r = DescribeConfigsResponse::default().with_results(vec![
                        DescribeConfigsResult::default()
                            .with_resource_type(2)
                            .with_resource_name(StrBytes::from_static_str(LEDGER))
                            .with_configs(vec![DescribeConfigsResourceResult::default()
                                .with_name(StrBytes::from_static_str("compression.type"))
                                .with_value(Some(StrBytes::from_static_str(codec)))]),
                    ]);
                    Some(encode(&r, version))
                }),
                &[(ApiKey::DescribeConfigs, 0, 4)],
            )
            .await;
            addr.set(fake.addr).expect("set once");
            let o = LockOptions::new(fake.addr.to_string(), "lock").ledger_topic(LEDGER);
            let read = tokio::time::timeout(BOUND, o.history())
                .await
                .expect("read within the bound");
            match codec {
                "gzip" => {
                    let e = read.expect_err("a gzip ledger is refused");
                    assert!(
                        matches!(&e, kafka_lock::Error::Ledger(kafka_lock::LedgerError::Compressed { codec, .. }) if codec == "gzip"),
                        "{e}"
                    );
                    assert!(fetches.lock().unwrap().is_empty(), "fetched a gzip ledger");
                }
                _ => {
                    let h = read.expect("a producer ledger is read");
                    assert_eq!(h.holds.len(), 1, "{h:?}");
                }
            }
        }
    }

    /// The coordinator lookup of a checkpoint read answered COORDINATOR_NOT_AVAILABLE is made
    /// again, five times at most. Breaks if the read failed at the first such answer, or
    /// looked up a sixth time or without end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_committed_checkpoint_reads_coordinator_lookup_is_made_again_five_times_at_most() {
        for (refused, want) in [(2, Ok(("c5".to_owned(), 5))), (usize::MAX, Err(15))] {
            let addr = Arc::new(OnceLock::new());
            let common = script(
                addr.clone(),
                Arc::default(),
                Arc::new(AtomicBool::new(true)),
            );
            let fake = fake_broker::start(common).await;
            addr.set(fake.addr).expect("set once");
            fake.refuse_lookups.store(refused, Ordering::SeqCst);
            let o = LockOptions::new(fake.addr.to_string(), "lock")
                .ledger_topic(LEDGER)
                .retry_backoff(Duration::from_millis(5), Duration::from_millis(20));
            let read = tokio::time::timeout(BOUND, o.committed_checkpoint())
                .await
                .expect("read within the bound");
            let lookups = fake.lookups.load(Ordering::SeqCst);
            match (read, want) {
                (Ok(found), Ok(want)) => {
                    assert_eq!(found.map(|c| (c.value, c.token)), Some(want));
                    assert_eq!(lookups, 3);
                }
                (Err(e), Err(code)) => {
                    assert!(
                        matches!(&e, kafka_lock::Error::Broker { code: c, .. } if c.0 == code),
                        "{e}"
                    );
                    assert_eq!(lookups, 5);
                }
                (read, want) => panic!("read {read:?}, wanted {want:?}"),
            }
        }
    }

    /// A batch the broker sends cut short (a broker older than KIP-74, at the Fetch's limit) is
    /// listed as skipped and the read goes on past it, where its header says it ends. Breaks if
    /// the read ended there, or skipped nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_cut_short_in_a_history_read_is_skipped_and_the_read_goes_on() {
        let ledger = Ledger::new(0, 4)
            .batch(0, &[acquired("lock")])
            .cut_batch(1, &[released("lock", 0), acquired("other")])
            .batch(3, &[acquired("lock")])
            // Appended after the ends were read, at the end offset itself: not read.
            .batch(4, &[released("lock", 3)]);
        let (_fake, o, fetches) = ledger_fake(ledger, Arc::default()).await;
        let h = tokio::time::timeout(BOUND, o.history())
            .await
            .expect("read within the bound")
            .expect("history");
        let holds: Vec<(i64, &str)> = h.holds.iter().map(|x| (x.token, x.end.name())).collect();
        assert_eq!(holds, vec![(0, "retried"), (3, "open")], "{h:?}");
        assert_eq!(h.unreadable.len(), 1, "{:?}", h.unreadable);
        assert_eq!(h.unreadable[0].offset, 1);
        assert!(
            h.unreadable[0].error.contains("skipped"),
            "{:?}",
            h.unreadable
        );
        let asked: Vec<i64> = fetches.lock().unwrap().iter().map(|f| f.0).collect();
        assert_eq!(asked, vec![0, 1, 3]);
    }

    /// A Fetch answer larger than a ledger connection's frame limit ends the read there, noted
    /// as unreadable, and the history read so far is kept; an answer that does not decode is
    /// only a broken connection: the read starts over and reads everything. Breaks if the
    /// first were an error, or the second taken for the first.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fetch_too_large_to_read_ends_the_history_and_an_undecodable_one_is_read_again() {
        let ledger = Ledger::new(0, 3)
            .batch(0, &[acquired("lock")])
            .big_batch(1)
            .batch(2, &[acquired("lock")]);
        let (_fake, o, _) = ledger_fake(ledger, Arc::default()).await;
        let h = tokio::time::timeout(BOUND, o.history())
            .await
            .expect("read within the bound")
            .expect("history up to the batch too large");
        let tokens: Vec<i64> = h.holds.iter().map(|x| x.token).collect();
        assert_eq!(tokens, vec![0], "{h:?}");
        let unreadable: Vec<i64> = h.unreadable.iter().map(|u| u.offset).collect();
        assert_eq!(unreadable, vec![1], "{:?}", h.unreadable);

        let ledger = Ledger::new(0, 2)
            .batch(0, &[acquired("lock")])
            .batch(1, &[acquired("lock")]);
        ledger.garbled.store(1, Ordering::SeqCst);
        let (_fake, o, fetches) = ledger_fake(ledger, Arc::default()).await;
        let h = tokio::time::timeout(BOUND, o.history())
            .await
            .expect("read within the bound")
            .expect("history after a garbled answer");
        let tokens: Vec<i64> = h.holds.iter().map(|x| x.token).collect();
        assert_eq!(tokens, vec![0, 1], "{h:?}");
        assert!(h.unreadable.is_empty(), "{:?}", h.unreadable);
        assert_eq!(fetches.lock().unwrap().len(), 2, "read again once");
    }

    /// A try on a free lock takes it: the look before the join (one DescribeGroups, which this
    /// fake does not answer) says nothing, so the join decides. Breaks if a try read "busy"
    /// from a look that showed no holder.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_try_on_a_free_lock_takes_it() {
        let addr = Arc::new(OnceLock::new());
        let common = script(
            addr.clone(),
            Arc::default(),
            Arc::new(AtomicBool::new(false)),
        );
        let fake = fake_broker::start(common).await;
        addr.set(fake.addr).expect("set once");
        let o = LockOptions::new(fake.addr.to_string(), "lock")
            .session_timeout(Duration::from_secs(6))
            .rebalance_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_secs(1))
            .lease_margin(Duration::from_secs(1));
        let guard = tokio::time::timeout(BOUND, o.try_acquire())
            .await
            .expect("tried within the bound")
            .expect("try")
            .expect("a free lock is taken");
        assert!(guard.is_held());
        tokio::time::timeout(BOUND, guard.release())
            .await
            .expect("released within the bound")
            .expect("release");
    }

    /// A try refused by an ACL names what was refused: the lock's group for
    /// GROUP_AUTHORIZATION_FAILED at the JoinGroup, the ledger topic for
    /// TOPIC_AUTHORIZATION_FAILED in its check (the broker's code alone names neither); any other
    /// refusal (INVALID_SESSION_TIMEOUT) is the broker's error as it came. Breaks if either
    /// code were passed on as a bare broker error, or another code named as a refusal.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_try_refused_by_an_acl_names_the_group_or_the_ledger_topic() {
        use kafka_lock::SecurityError;
        use kafka_protocol::messages::JoinGroupResponse;
        for (refused, code) in [
            (ApiKey::JoinGroup, 30),
            (ApiKey::Metadata, 29),
            (ApiKey::JoinGroup, 26),
        ] {
            let addr = Arc::new(OnceLock::new());
            let common = script(
                addr.clone(),
                Arc::default(),
                Arc::new(AtomicBool::new(false)),
            );
            let fake =
                fake_broker::start(Arc::new(
                    move |api, version, body: &mut BytesMut| match api {
                        ApiKey::JoinGroup if refused == api => {
                            let r = JoinGroupResponse::default().with_error_code(code);
                            Some(encode(&r, version))
                        }
                        ApiKey::Metadata if refused == api => {
                            let r = MetadataResponse::default().with_topics(vec![
                                MetadataResponseTopic::default()
                                    .with_name(Some(name(LEDGER)))
                                    .with_error_code(29),
                            ]);
                            Some(encode(&r, version))
                        }
                        _ => common(api, version, body),
                    },
                ))
                .await;
            addr.set(fake.addr).expect("set once");
            let o = LockOptions::new(fake.addr.to_string(), "lock")
                .session_timeout(Duration::from_secs(6))
                .rebalance_timeout(Duration::from_secs(6))
                .heartbeat_interval(Duration::from_secs(1))
                .lease_margin(Duration::from_secs(1))
                .ledger_topic(LEDGER);
            let e = tokio::time::timeout(BOUND, o.try_acquire())
                .await
                .expect("tried within the bound")
                .expect_err("refused");
            match code {
                26 => assert!(
                    matches!(&e, kafka_lock::Error::Broker { code, .. } if code.0 == 26),
                    "{e}"
                ),
                30 => assert!(
                    matches!(&e, kafka_lock::Error::Security(SecurityError::GroupAuthorizationFailed { group }) if group == "lock"),
                    "{e}"
                ),
                _ => assert!(
                    matches!(&e, kafka_lock::Error::Security(SecurityError::TopicAuthorizationFailed { topic }) if topic == LEDGER),
                    "{e}"
                ),
            }
        }
    }

    /// A DescribeGroups answer for group "lock": `members` (id, label, assignment) of a native
    /// group in `state`.
    fn described(
        state: &'static str,
        members: &[(&str, &str, NativeAssignment)],
    ) -> impl Fn(i16) -> BytesMut + Send + Sync + 'static {
        use kafka_lock::internals::assign::{MemberMetadata, NATIVE_PROTOCOL, PROTOCOL_TYPE};
        use kafka_protocol::messages::describe_groups_response::{
            DescribedGroup, DescribedGroupMember,
        };
        use kafka_protocol::messages::{DescribeGroupsResponse, GroupId};
        let members: Vec<DescribedGroupMember> = members
            .iter()
            .map(|(id, label, a)| {
                let held = a
                    .holder
                    .iter()
                    .chain(&a.other_holders)
                    .find(|h| h.member_id == *id);
                let meta = MemberMetadata {
                    holds: held.is_some(),
                    first_joined_generation: 1,
                    holder_generation: held.map_or(-1, |h| h.generation),
                    label: Some((*label).into()),
                    permits: a.permits,
                    slot: held.map_or(0, |h| h.slot),
                    ledger: None,
                };
                DescribedGroupMember::default()
                    .with_member_id(StrBytes::from_string((*id).to_owned()))
                    .with_client_host(StrBytes::from_static_str("/127.0.0.1"))
                    .with_member_metadata(meta.encode())
                    .with_member_assignment(a.encode())
            })
            .collect();
        let group = DescribedGroup::default()
            .with_group_id(GroupId(StrBytes::from_static_str("lock")))
            .with_group_state(StrBytes::from_static_str(state))
            .with_protocol_type(StrBytes::from_static_str(PROTOCOL_TYPE))
            .with_protocol_data(StrBytes::from_static_str(NATIVE_PROTOCOL))
            .with_members(members);
        move |version| {
            encode(
                &DescribeGroupsResponse::default().with_groups(vec![group.clone()]),
                version,
            )
        }
    }

    /// The assignment a member of a group of `permits` permits was given at generation 7, the
    /// holders by slot, the member at `position`.
    fn assigned(permits: u16, holders: &[&str], position: i32) -> NativeAssignment {
        use kafka_lock::internals::assign::Holder;
        let holder = |(slot, id): (usize, &&str)| Holder {
            member_id: (*id).to_owned(),
            label: None,
            generation: 7,
            slot: u16::try_from(slot).expect("a slot"),
        };
        let mut all = holders.iter().enumerate().map(holder);
        NativeAssignment {
            holder: all.next(),
            position,
            members: 3,
            permits,
            other_holders: all.collect(),
            ledger: None,
        }
    }

    /// A try looks before it joins, and only a look that leaves no doubt answers it: a stable
    /// native group whose assignment in force names a holder for every permit the try asks for
    /// is busy at once, with no JoinGroup, and the try's Waiting event names those holders with
    /// position -1 (a try that never joined has no place in the queue) and no member id. A free
    /// permit of a semaphore, a group between generations (whose members' bytes a broker may
    /// still report), or another number of permits than the try's leave it to the join, which
    /// the scripted coordinator grants. Breaks if the look were skipped or read wrongly: a join
    /// on a busy lock (its holder would have to rebalance), another position in the event, or
    /// "busy" read from any of the three uncertain looks.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_try_is_busy_at_a_look_only_when_every_permit_it_asks_for_is_held() {
        use kafka_lock::{HolderInfo, LockEvent};
        let holder = |id: &'static str, label: &'static str, slot: u16| (id, label, slot);
        let seen = |h: &HolderInfo| {
            assert_eq!(h.generation, 7, "{h:?}");
            (h.member_id.clone(), h.label.clone(), h.slot)
        };
        // (what the look shows, the try's permits, the holders of a busy answer or None: joins)
        let cases = [
            (
                "a held mutex",
                described(
                    "Stable",
                    &[
                        ("h", "h's", assigned(1, &["h"], 0)),
                        ("w", "w's", assigned(1, &["h"], 1)),
                    ],
                ),
                1,
                Some(vec![holder("h", "h's", 0)]),
            ),
            (
                "a semaphore with every permit held",
                described(
                    "Stable",
                    &[
                        ("h", "h's", assigned(2, &["h", "g"], 0)),
                        ("g", "g's", assigned(2, &["h", "g"], 0)),
                    ],
                ),
                2,
                Some(vec![holder("h", "h's", 0), holder("g", "g's", 1)]),
            ),
            (
                "a semaphore with a free permit",
                described("Stable", &[("h", "h's", assigned(2, &["h"], 0))]),
                2,
                None,
            ),
            (
                "a held mutex between generations",
                described(
                    "CompletingRebalance",
                    &[("h", "h's", assigned(1, &["h"], 0))],
                ),
                1,
                None,
            ),
            (
                "a semaphore of two permits, both held, tried as a mutex",
                described(
                    "Stable",
                    &[
                        ("h", "h's", assigned(2, &["h", "g"], 0)),
                        ("g", "g's", assigned(2, &["h", "g"], 0)),
                    ],
                ),
                1,
                None,
            ),
        ];
        for (what, answer, permits, busy) in cases {
            let addr = Arc::new(OnceLock::new());
            let log: Log = Arc::default();
            let common = script(addr.clone(), log.clone(), Arc::new(AtomicBool::new(false)));
            let fake = fake_broker::start(Arc::new(move |api, version, body: &mut BytesMut| {
                if api == ApiKey::DescribeGroups {
                    return Some(answer(version));
                }
                common(api, version, body)
            }))
            .await;
            addr.set(fake.addr).expect("set once");
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let o = LockOptions::new(fake.addr.to_string(), "lock")
                .permits(permits)
                .session_timeout(Duration::from_secs(6))
                .rebalance_timeout(Duration::from_secs(6))
                .heartbeat_interval(Duration::from_secs(1))
                .lease_margin(Duration::from_secs(1))
                .events(tx);
            let tried = tokio::time::timeout(BOUND, o.try_acquire())
                .await
                .expect("tried within the bound")
                .expect("try");
            let joined = log.lock().unwrap().contains(&ApiKey::JoinGroup);
            match busy {
                Some(holders) => {
                    assert!(tried.is_none(), "{what}: taken");
                    assert!(!joined, "{what}: the try joined a busy lock");
                    match rx.try_recv() {
                        Ok(LockEvent::Waiting {
                            member_id,
                            holder,
                            holders: named,
                            position,
                        }) => {
                            let want: Vec<_> = holders
                                .iter()
                                .map(|(id, label, slot)| {
                                    ((*id).to_owned(), Some((*label).to_owned()), *slot)
                                })
                                .collect();
                            assert_eq!(member_id, "", "{what}");
                            assert_eq!(holder.as_ref().map(seen).as_ref(), want.first(), "{what}");
                            assert_eq!(named.iter().map(seen).collect::<Vec<_>>(), want, "{what}");
                            assert_eq!(position, -1, "{what}");
                        }
                        other => panic!("{what}: {other:?} instead of a Waiting event"),
                    }
                }
                None => {
                    assert!(joined, "{what}: answered busy without joining");
                    let guard =
                        tried.unwrap_or_else(|| panic!("{what}: the join's grant not taken"));
                    tokio::time::timeout(BOUND, guard.release())
                        .await
                        .expect("released within the bound")
                        .expect("release");
                }
            }
        }
    }

    /// A hold lost before it was handed over (the coordinator no longer knows the member while
    /// its ACQUIRED record is still unanswered, so the hold never begins) is no acquisition: a
    /// try answers that it did not take the lock, without joining again, and a wait goes on
    /// under a new membership and takes the lock with it. Breaks if a try tried again (it would
    /// take the lock on its second join), if a wait gave up at the loss with time left
    /// (`NotAcquired`), or ended there with no guard.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hold_lost_before_its_hand_over_ends_a_try_and_a_wait_goes_on() {
        use std::sync::atomic::AtomicUsize;
        // Long after the first Heartbeat's answer, which follows the SyncGroup at once; within
        // the request timeout.
        const LATE: Duration = Duration::from_secs(3);
        for once in [true, false] {
            let addr = Arc::new(OnceLock::new());
            let log: Log = Arc::default();
            let common = script(addr.clone(), log.clone(), Arc::new(AtomicBool::new(false)));
            let (produces, heartbeats) = (Arc::new(AtomicUsize::new(0)), AtomicUsize::new(0));
            let fake = fake_broker::start_parking(Arc::new(
                move |_conn, api, version, body: &mut BytesMut| {
                    // The first membership's first Heartbeat: UNKNOWN_MEMBER_ID.
                    if api == ApiKey::Heartbeat && heartbeats.fetch_add(1, Ordering::SeqCst) == 0 {
                        let r = HeartbeatResponse::default().with_error_code(25);
                        return Some((encode(&r, version), Duration::ZERO));
                    }
                    // The first Produce is the first hold's ACQUIRED record.
                    let late =
                        api == ApiKey::Produce && produces.fetch_add(1, Ordering::SeqCst) == 0;
                    let hold = if late { LATE } else { Duration::ZERO };
                    common(api, version, body).map(|b| (b, hold))
                },
            ))
            .await;
            addr.set(fake.addr).expect("set once");
            let o = LockOptions::new(fake.addr.to_string(), "lock")
                .session_timeout(Duration::from_secs(3))
                .rebalance_timeout(Duration::from_secs(3))
                .heartbeat_interval(Duration::from_secs(1))
                .lease_margin(Duration::from_millis(500))
                .request_timeout(Duration::from_secs(10))
                .ledger_topic(LEDGER)
                .ledger_push(false);
            let joins = || {
                log.lock()
                    .unwrap()
                    .iter()
                    .filter(|a| **a == ApiKey::JoinGroup)
                    .count()
            };
            if once {
                let tried = tokio::time::timeout(BOUND, o.try_acquire())
                    .await
                    .expect("tried within the bound")
                    .expect("try");
                assert!(
                    tried.is_none(),
                    "a try took a hold lost before its hand-over"
                );
                assert_eq!(joins(), 1, "the try joined again");
            } else {
                let guard = tokio::time::timeout(BOUND, o.acquire(Some(BOUND)))
                    .await
                    .expect("acquired within the bound")
                    .expect("the wait goes on after the loss and takes the lock");
                assert!(joins() >= 2, "taken without a second join");
                tokio::time::timeout(BOUND, guard.release())
                    .await
                    .expect("released within the bound")
                    .expect("release");
            }
        }
    }
}

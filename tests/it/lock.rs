//! The lock against the real broker: exclusion, token order, release, crash failover,
//! stickiness, try-acquire and giving up.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_lock::driver::{ConnConfig, Connection};
use kafka_lock::wire::coordinator::find_coordinator_request;
use kafka_lock::wire::Response;
use kafka_lock::{Error, LockEvent, LockOptions};
use kafka_protocol::messages::describe_groups_request::DescribeGroupsRequest;
use kafka_protocol::messages::GroupId;
use kafka_protocol::protocol::StrBytes;
use tokio::sync::mpsc;

use crate::support;

/// Timeouts that keep tests short on tansu, whose JoinGroup takes about session/2.
fn opts(group: &str) -> LockOptions {
    LockOptions::new(support::broker().bootstrap(), group)
        .session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(500))
        .lease_margin(Duration::from_secs(1))
}

/// Generous bound for anything that involves one rebalance on tansu.
const REBALANCE_BOUND: Duration = Duration::from_secs(40);

/// The protected resource of the Jepsen-style "lock-set" workload: it notices two holders at
/// once and accepts a write only with a token at least as large as every earlier one.
#[derive(Default)]
struct Resource {
    occupied: AtomicBool,
    max_token: AtomicI32,
    holders: Mutex<Vec<(i32, String)>>,
}

impl Resource {
    fn enter(&self, generation: i32, member: &str) {
        assert!(
            !self.occupied.swap(true, Ordering::SeqCst),
            "two holders at once: {member} entered while another held the lock"
        );
        let prev = self.max_token.fetch_max(generation, Ordering::SeqCst);
        assert!(
            generation > prev,
            "token {generation} is not greater than an earlier holder's {prev}"
        );
        self.holders
            .lock()
            .unwrap()
            .push((generation, member.to_owned()));
    }

    fn leave(&self) {
        assert!(self.occupied.swap(false, Ordering::SeqCst));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contenders_take_turns_with_increasing_tokens() {
    support::init_tracing();
    let group = support::unique_group("turns");
    let resource = Arc::new(Resource::default());
    resource.max_token.store(-1, Ordering::SeqCst);
    let mut tasks = Vec::new();
    for i in 0..4 {
        let (resource, group) = (resource.clone(), group.clone());
        tasks.push(tokio::spawn(async move {
            let options = opts(&group).label(format!("contender-{i}"));
            let guard = options
                .acquire(Some(Duration::from_secs(120)))
                .await
                .expect("acquire");
            let token = guard.token();
            resource.enter(token.generation, &token.member_id);
            // Work while holding, long enough for the others' joins to rebalance the group.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            assert!(
                guard.is_held(),
                "lost the lock while working: {:?}",
                options.stats()
            );
            resource.leave();
            guard.release().await.expect("release");
            options.stats()
        }));
    }
    for t in tasks {
        let stats = tokio::time::timeout(Duration::from_secs(150), t)
            .await
            .expect("all contenders finish")
            .unwrap();
        assert_eq!(stats.acquisitions, 1);
        assert!(stats.losses.is_empty(), "{stats:?}");
    }
    let holders = resource.holders.lock().unwrap();
    assert_eq!(holders.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_hands_the_lock_to_a_waiter() {
    support::init_tracing();
    let group = support::unique_group("release");
    let first = opts(&group)
        .label("first")
        .acquire(Some(REBALANCE_BOUND))
        .await
        .expect("first acquires");
    let t1 = first.token();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let waiter = tokio::spawn({
        let o = opts(&group).label("second").events(tx);
        async move { o.acquire(Some(Duration::from_secs(90))).await }
    });
    // The waiter is told who holds the lock before the holder lets go.
    let holder = loop {
        match tokio::time::timeout(REBALANCE_BOUND, rx.recv())
            .await
            .expect("waiting event")
        {
            Some(LockEvent::Waiting {
                holder: Some(h), ..
            }) => break h,
            Some(_) => continue,
            None => panic!("event stream ended"),
        }
    };
    assert_eq!(holder.label.as_deref(), Some("first"));
    assert!(
        first.is_held(),
        "a new waiter must not take the lock from a running holder"
    );
    let released_at = Instant::now();
    first.release().await.unwrap();
    let second = tokio::time::timeout(REBALANCE_BOUND, waiter)
        .await
        .expect("handover in time")
        .unwrap()
        .expect("second acquires");
    assert!(
        second.token().generation > t1.generation,
        "{:?} then {:?}",
        t1,
        second.token()
    );
    eprintln!("handover took {:?}", released_at.elapsed());
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newly_joining_waiters_never_take_the_lock_from_the_holder() {
    support::init_tracing();
    let group = support::unique_group("sticky");
    let holder = opts(&group)
        .label("holder")
        .acquire(Some(REBALANCE_BOUND))
        .await
        .unwrap();
    let token = holder.token();
    let mut waiters = Vec::new();
    for i in 0..3 {
        let (tx, rx) = mpsc::unbounded_channel();
        let o = opts(&group)
            .label(format!("waiter-{i}"))
            .client_id("a-smaller-client-id")
            .events(tx);
        waiters.push((
            tokio::spawn(async move { o.acquire(Some(Duration::from_secs(120))).await }),
            rx,
        ));
    }
    // Every waiter completes a generation naming the original holder.
    for (_, rx) in waiters.iter_mut() {
        loop {
            match tokio::time::timeout(REBALANCE_BOUND, rx.recv())
                .await
                .expect("waiter event")
            {
                Some(LockEvent::Waiting {
                    holder: Some(h), ..
                }) if h.member_id == token.member_id => break,
                Some(LockEvent::Acquired { .. }) => panic!("a joining waiter took the lock"),
                Some(_) => {}
                None => panic!("waiter ended early"),
            }
        }
    }
    assert!(holder.is_held());
    assert!(
        holder.token().generation >= token.generation,
        "the token only moves forward"
    );
    holder.release().await.unwrap();
    // They get it one at a time, in whatever order the queue gives, each after the previous one
    // released.
    let mut set = tokio::task::JoinSet::new();
    for (task, _) in waiters {
        set.spawn(task);
    }
    let mut generations = Vec::new();
    while let Some(joined) = tokio::time::timeout(Duration::from_secs(150), set.join_next())
        .await
        .expect("waiters finish")
    {
        let guard = joined
            .unwrap()
            .unwrap()
            .expect("each waiter acquires in turn");
        generations.push(guard.token().generation);
        guard.release().await.unwrap();
    }
    assert_eq!(generations.len(), 3);
    assert!(
        generations.windows(2).all(|w| w[0] < w[1]),
        "tokens in acquisition order: {generations:?}"
    );
    assert!(generations.iter().all(|g| *g > token.generation));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_is_prompt_both_ways() {
    support::init_tracing();
    let group = support::unique_group("try");
    let started = Instant::now();
    let got = opts(&group)
        .try_acquire()
        .await
        .unwrap()
        .expect("a free lock is taken");
    assert!(started.elapsed() < REBALANCE_BOUND);
    let (tx, rx) = mpsc::unbounded_channel();
    let waiting = first_waiting(rx);
    let other = opts(&group).events(tx).try_acquire().await.unwrap();
    let returned = Instant::now();
    assert!(other.is_none(), "a held lock is not taken");
    // The try is over once the first generation completed without us; only the LeaveGroup is
    // left, which is one request.
    let waiting_at = waiting.await.unwrap().expect("the generation was reported");
    assert!(
        returned.duration_since(waiting_at) < LEAVE_BOUND,
        "try_acquire returned {:?} after its generation completed",
        returned.duration_since(waiting_at)
    );
    assert!(got.is_held());
    got.release().await.unwrap();
}

/// How long leaving may take after the outcome is known: one LeaveGroup on loopback, with room
/// for a loaded machine.
const LEAVE_BOUND: Duration = Duration::from_secs(5);

/// Resolves to when the first `Waiting` event arrived, stamped on arrival.
fn first_waiting(
    mut rx: mpsc::UnboundedReceiver<LockEvent>,
) -> tokio::task::JoinHandle<Option<Instant>> {
    tokio::spawn(async move {
        while let Some(e) = rx.recv().await {
            if matches!(e, LockEvent::Waiting { .. }) {
                return Some(Instant::now());
            }
        }
        None
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_times_out_leaves_the_group() {
    support::init_tracing();
    let group = support::unique_group("timeout");
    let holder = opts(&group).acquire(Some(REBALANCE_BOUND)).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let err = opts(&group)
        .events(tx)
        .acquire(Some(Duration::from_secs(8)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotAcquired { .. }), "{err}");
    // The waiter's own session reports that it left the group.
    let mut left = false;
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
        if matches!(e, LockEvent::Left) {
            left = true;
            break;
        }
    }
    assert!(left, "the waiter never reported leaving");
    // And the broker agrees: only the holder remains a member.
    let members = group_members(&group).await;
    assert_eq!(
        members,
        vec![holder.member_id()],
        "the waiter must have left"
    );
    holder.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_settings_are_rejected_before_the_broker_sees_them() {
    let err = opts("x")
        .heartbeat_interval(Duration::from_secs(30))
        .acquire(None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    let err = opts("").acquire(None).await.unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    let err = LockOptions::new("not-an-address", "x")
        .acquire(None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_mode_refuses_a_topic_with_several_partitions() {
    let topic = support::unique_group("multi");
    support::create_topic(&support::broker().bootstrap(), &topic, 3);
    let err = opts(&topic)
        .consumer_topic(&topic)
        .acquire(Some(Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(m) if m.contains("3 partitions")),
        "{err}"
    );
    let err = opts(&topic)
        .consumer_topic("no-such-topic-here")
        .acquire(Some(Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(m) if m.contains("does not exist")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_mode_takes_partition_zero() {
    support::init_tracing();
    let topic = support::unique_group("one");
    support::create_topic(&support::broker().bootstrap(), &topic, 1);
    let guard = opts(&topic)
        .consumer_topic(&topic)
        .acquire(Some(REBALANCE_BOUND))
        .await
        .expect("acquire");
    assert!(guard.token().generation >= 0);
    guard.release().await.unwrap();
}

/// Member ids of `group` as the coordinator reports them.
pub async fn group_members(group: &str) -> Vec<String> {
    let conn = Connection::connect(&support::broker().bootstrap(), &ConnConfig::default())
        .await
        .unwrap();
    let version = conn
        .versions()
        .get(kafka_protocol::messages::ApiKey::FindCoordinator)
        .unwrap_or(0)
        .min(4);
    let find = find_coordinator_request(group, version);
    let Response::FindCoordinator(_) = conn
        .request_at(find, version, Duration::from_secs(10))
        .await
        .unwrap()
    else {
        panic!("FindCoordinator")
    };
    // tansu is its own coordinator.
    let mut req = DescribeGroupsRequest::default();
    req.groups = vec![GroupId(StrBytes::from_string(group.to_owned()))];
    match conn.request(req).await.unwrap() {
        Response::DescribeGroups(r) => r.groups[0]
            .members
            .iter()
            .map(|m| m.member_id.to_string())
            .collect(),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_keeps_the_lock_across_many_lease_lengths() {
    support::init_tracing();
    let group = support::unique_group("long-hold");
    let options = opts(&group);
    let lease = options.lease_length();
    let guard = options.acquire(Some(REBALANCE_BOUND)).await.unwrap();
    // Renewals must reach the guard: holding for three lease lengths only works if every
    // heartbeat pushes the lease end forward.
    let held_for = lease * 3;
    tokio::select! {
        reason = guard.lost() => panic!("lost a healthy lock: {reason}"),
        _ = tokio::time::sleep(held_for) => {}
    }
    assert!(guard.is_held());
    assert!(
        guard.lease_end() > Instant::now(),
        "the lease end moved forward"
    );
    assert_eq!(options.stats().acquisitions, 1);
    guard.release().await.unwrap();
}

/// Jepsen's "ambiguous acquire" and Curator's orphaned waiters: an acquire whose future is
/// dropped mid-wait must not leave a member behind that could later be handed the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquire_leaves_no_member_behind() {
    support::init_tracing();
    let group = support::unique_group("cancelled");
    let holder = opts(&group).acquire(Some(REBALANCE_BOUND)).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let waiter = opts(&group).events(tx);
    let pending = tokio::spawn(async move { waiter.acquire(None).await });
    // Cancel once the waiter is queued behind the holder.
    loop {
        match tokio::time::timeout(REBALANCE_BOUND, rx.recv())
            .await
            .expect("waiting event")
        {
            Some(LockEvent::Waiting { .. }) => break,
            Some(_) => {}
            None => panic!("waiter ended early"),
        }
    }
    pending.abort();
    // The abandoned session leaves by itself.
    loop {
        match tokio::time::timeout(REBALANCE_BOUND, rx.recv())
            .await
            .expect("the abandoned waiter leaves")
        {
            Some(LockEvent::Left) => break,
            Some(LockEvent::Acquired { .. }) => panic!("an abandoned waiter acquired the lock"),
            Some(_) => {}
            None => panic!("the waiter's session ended without leaving"),
        }
    }
    assert_eq!(group_members(&group).await, vec![holder.member_id()]);
    assert!(holder.is_held());
    holder.release().await.unwrap();
}

/// A single try in consumer-compatible mode ends at the first completed generation that gives
/// partition 0 to someone else. Consumer assignments name no holder and no queue position, so
/// only the generation tells the try that it is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_in_consumer_mode_answers_at_the_first_generation() {
    support::init_tracing();
    let topic = support::unique_group("try-consumer");
    support::create_topic(&support::broker().bootstrap(), &topic, 1);
    // The range assignor gives partition 0 to the member id that sorts first; member ids start
    // with the client id, so the holder keeps it.
    let holder = opts(&topic)
        .consumer_topic(&topic)
        .client_id("a-holder")
        .acquire(Some(REBALANCE_BOUND))
        .await
        .expect("acquire");
    let (tx, rx) = mpsc::unbounded_channel();
    let waiting = first_waiting(rx);
    let attempt = opts(&topic)
        .consumer_topic(&topic)
        .client_id("z-try")
        .events(tx);
    let got = tokio::time::timeout(REBALANCE_BOUND, attempt.try_acquire())
        .await
        .expect("a single try must end once a generation has completed")
        .expect("try_acquire");
    let returned = Instant::now();
    assert!(
        got.is_none(),
        "partition 0 went to the member sorting first"
    );
    drop(attempt);
    let waiting_at = waiting
        .await
        .unwrap()
        .expect("the completed generation was reported");
    assert!(
        returned.duration_since(waiting_at) < LEAVE_BOUND,
        "try_acquire returned {:?} after its generation completed",
        returned.duration_since(waiting_at)
    );
    holder.release().await.unwrap();
}

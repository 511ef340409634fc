//! The lock against real brokers: exclusion, token order, release, stickiness, try-acquire,
//! giving up, cancellation. Each test is written once for a broker; `on_brokers!` runs it on
//! Apache Kafka and, for the subset whose paths tansu's coordinator exercises differently, on
//! tansu too (docs/testing.md, "Which broker runs what").

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_lock::{Error, LockEvent, LockOptions, Release};
use tokio::sync::mpsc;

use crate::support;
use crate::support::brokers::{on_brokers, Broker, SLACK};
use crate::support::holds::Holds;

/// Heartbeat of every test contender: the first waiter in line checks every quarter of it.
const HEARTBEAT: Duration = Duration::from_millis(500);

/// Apache Kafka's `group.min.session.timeout.ms` (6 s), the shortest session a broker accepts by
/// default; the rebalance timeout equals it so it does not shorten the 5 s lease.
fn opts(broker: Broker, group: &str) -> LockOptions {
    LockOptions::new(broker.bootstrap(), group)
        .session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(6))
        .heartbeat_interval(HEARTBEAT)
        .lease_margin(Duration::from_secs(1))
}

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

on_brokers!(contenders_take_turns_with_increasing_tokens: apache, tansu);
async fn contenders_take_turns_with_increasing_tokens(broker: Broker) {
    support::init_tracing();
    let group = support::unique_group("turns");
    let resource = Arc::new(Resource::default());
    resource.max_token.store(-1, Ordering::SeqCst);
    let holds = Holds::new();
    // Long enough for the others' joins to rebalance the group while one holds.
    let work = Duration::from_millis(1500);
    let contenders = 4;
    let wait = (work + broker.rebalance_bound(HEARTBEAT)) * contenders;
    let mut tasks = Vec::new();
    for i in 0..contenders {
        let (resource, group) = (resource.clone(), group.clone());
        let (options, _events) = holds.record(
            &format!("contender-{i}"),
            opts(broker, &group).label(format!("contender-{i}")),
        );
        tasks.push(tokio::spawn(async move {
            let guard = options.acquire(Some(wait)).await.expect("acquire");
            let token = guard.token();
            resource.enter(token.generation, &token.member_id);
            tokio::time::sleep(work).await;
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
        let stats = tokio::time::timeout(wait + SLACK, t)
            .await
            .expect("all contenders finish")
            .unwrap();
        assert_eq!(stats.acquisitions, 1);
        assert!(stats.losses.is_empty(), "{stats:?}");
    }
    assert_eq!(resource.holders.lock().unwrap().len(), 4);
    // The same judged from the lock's own events rather than from the code that used it.
    let held = holds.check_when_ended(SLACK).await;
    assert_eq!(held.len(), 4, "{held:#?}");
    assert!(held.iter().all(|h| h.end.is_some() && h.lost.is_none()));
}

on_brokers!(release_hands_the_lock_to_a_waiter: apache, tansu);
async fn release_hands_the_lock_to_a_waiter(broker: Broker) {
    support::init_tracing();
    let group = support::unique_group("release");
    let bound = broker.rebalance_bound(HEARTBEAT);
    let first = opts(broker, &group)
        .label("first")
        .acquire(Some(bound))
        .await
        .expect("first acquires");
    let t1 = first.token();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let waiter = tokio::spawn({
        let o = opts(broker, &group).label("second").events(tx);
        async move { o.acquire(Some(bound * 3)).await }
    });
    // The waiter is told who holds the lock before the holder lets go.
    let holder = loop {
        match tokio::time::timeout(bound, rx.recv())
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
    // On Apache Kafka the LeaveGroup starts the rebalance at once and the waiter, first in line,
    // hears of it within a quarter heartbeat: `bound` is the whole handover.
    let second = tokio::time::timeout(bound, waiter)
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
    eprintln!("{broker:?}: handover took {:?}", released_at.elapsed());
    second.release().await.unwrap();
}

on_brokers!(newly_joining_waiters_never_take_the_lock_from_the_holder: apache, tansu);
async fn newly_joining_waiters_never_take_the_lock_from_the_holder(broker: Broker) {
    support::init_tracing();
    let group = support::unique_group("sticky");
    let bound = broker.rebalance_bound(HEARTBEAT);
    let holder = opts(broker, &group)
        .label("holder")
        .acquire(Some(bound))
        .await
        .unwrap();
    let token = holder.token();

    // A newcomer that sorts before the holder in FIFO order: its metadata says it first joined
    // in generation 0 (as a member that joined an earlier incarnation of a deleted group would).
    // Only stickiness keeps the lock with the holder; without it this newcomer takes it.
    let early = raw::EarlyJoiner::join(broker, &group, bound * 3).await;
    assert_eq!(
        early
            .assignment
            .holder
            .as_ref()
            .map(|h| h.member_id.as_str()),
        Some(token.member_id.as_str()),
        "a newcomer that sorts first in FIFO order was given the lock: {:?}",
        early.assignment
    );
    assert!(early.assignment.position >= 1, "{:?}", early.assignment);
    assert!(holder.is_held(), "the holder lost its lock to the newcomer");
    early.leave(bound).await;

    let mut waiters = Vec::new();
    for i in 0..3 {
        let (tx, rx) = mpsc::unbounded_channel();
        // Member ids start with the client id: these sort before the holder's, which is what
        // the range assignor would give the lock to.
        let o = opts(broker, &group)
            .label(format!("waiter-{i}"))
            .client_id("a-smaller-client-id")
            .events(tx);
        waiters.push((
            tokio::spawn(async move { o.acquire(None).await }),
            rx,
            None::<(i32, i32, String)>,
        ));
    }
    // Every waiter completes a generation naming the original holder; the positions that count
    // are those of the generation with all three of them, which the holder's token names.
    let deadline = tokio::time::Instant::now() + bound * 6;
    let queue: Vec<(i32, String)> = loop {
        // The newest generation anyone has seen: the holder's token moves to each one it keeps
        // the lock through, and the waiters' events name it.
        let newest = waiters
            .iter()
            .filter_map(|w| w.2.as_ref().map(|l| l.0))
            .fold(holder.token().generation, i32::max);
        match waiters
            .iter_mut()
            .find(|w| w.2.as_ref().is_none_or(|l| l.0 < newest))
        {
            Some((_, rx, latest)) => match tokio::time::timeout_at(deadline, rx.recv())
                .await
                .expect("every waiter learns its place behind the holder")
            {
                Some(LockEvent::Waiting {
                    holder: Some(h),
                    position,
                    member_id,
                    ..
                }) => {
                    assert_eq!(
                        h.member_id, token.member_id,
                        "a joining waiter took the lock"
                    );
                    *latest = Some((h.generation, position, member_id));
                }
                Some(LockEvent::Acquired { .. }) => panic!("a joining waiter took the lock"),
                Some(_) => {}
                None => panic!("waiter ended early"),
            },
            None => {
                // All three report the same generation: their places in it.
                let mut queue: Vec<(i32, String)> = waiters
                    .iter()
                    .map(|w| {
                        let (_, position, member) = w.2.clone().expect("seen");
                        (position, member)
                    })
                    .collect();
                queue.sort();
                let positions: Vec<i32> = queue.iter().map(|q| q.0).collect();
                assert_eq!(positions, [1, 2, 3], "not a queue of three: {queue:?}");
                break queue;
            }
        }
    };
    assert!(holder.is_held());
    assert!(
        holder.token().generation >= token.generation,
        "the token only moves forward"
    );
    holder.release().await.unwrap();
    // They get it one at a time, in the order of the queue, each after the previous one
    // released.
    let mut set = tokio::task::JoinSet::new();
    for (task, _, _) in waiters {
        set.spawn(task);
    }
    let mut acquired = Vec::new();
    while let Some(joined) = tokio::time::timeout(bound * 3, set.join_next())
        .await
        .expect("waiters finish")
    {
        let guard = joined
            .unwrap()
            .unwrap()
            .expect("each waiter acquires in turn");
        acquired.push((guard.token().generation, guard.member_id()));
        guard.release().await.unwrap();
    }
    assert_eq!(acquired.len(), 3);
    assert!(
        acquired.windows(2).all(|w| w[0].0 < w[1].0),
        "tokens in acquisition order: {acquired:?}"
    );
    assert!(acquired.iter().all(|(g, _)| *g > token.generation));
    let order: Vec<&str> = acquired.iter().map(|a| a.1.as_str()).collect();
    let expected: Vec<&str> = queue.iter().map(|q| q.1.as_str()).collect();
    assert_eq!(
        order, expected,
        "the waiters took the lock out of queue order"
    );
}

on_brokers!(try_acquire_is_prompt_both_ways: apache);
async fn try_acquire_is_prompt_both_ways(broker: Broker) {
    support::init_tracing();
    let group = support::unique_group("try");
    // The shared broker starts on first use: up before the clock starts.
    broker.bootstrap();
    // Each await has a bound well past what it may take, so a hang fails here rather than at
    // the suite's limit; the timing assertions are separate.
    let hang = SLACK * 4;
    let started = Instant::now();
    let got = tokio::time::timeout(hang, opts(broker, &group).try_acquire())
        .await
        .expect("try_acquire of a free lock returns")
        .unwrap()
        .expect("a free lock is taken");
    // A lone member's join completes at once (initial delay 0): a handful of round trips.
    assert!(started.elapsed() < SLACK, "{:?}", started.elapsed());
    let (tx, rx) = mpsc::unbounded_channel();
    let waiting = first_waiting(rx);
    let other = tokio::time::timeout(hang, opts(broker, &group).events(tx).try_acquire())
        .await
        .expect("try_acquire of a held lock returns")
        .unwrap();
    let returned = Instant::now();
    assert!(other.is_none(), "a held lock is not taken");
    // The try is over once the first generation completed without us; only the LeaveGroup is
    // left, which is one request.
    let waiting_at = tokio::time::timeout(hang, waiting)
        .await
        .expect("the event stream ends")
        .unwrap()
        .expect("the generation was reported");
    assert!(
        returned.duration_since(waiting_at) < LEAVE_BOUND,
        "try_acquire returned {:?} after its generation completed",
        returned.duration_since(waiting_at)
    );
    assert!(got.is_held());
    tokio::time::timeout(hang, got.release())
        .await
        .expect("release returns")
        .unwrap();
}

/// How long leaving may take after the outcome is known: one LeaveGroup on loopback, with room
/// for a loaded machine.
const LEAVE_BOUND: Duration = SLACK;

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

on_brokers!(an_acquire_that_times_out_leaves_the_group: apache);
async fn an_acquire_that_times_out_leaves_the_group(broker: Broker) {
    support::init_tracing();
    let group = support::unique_group("timeout");
    let bound = broker.rebalance_bound(HEARTBEAT);
    let holder = opts(broker, &group).acquire(Some(bound)).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    // Long enough to join and queue behind the holder, which a later check of the group shows
    // gone again.
    let err = opts(broker, &group)
        .events(tx)
        .acquire(Some(HEARTBEAT * 4))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotAcquired { .. }), "{err}");
    // The waiter's own session reports that it left the group.
    let mut left = false;
    while let Ok(Some(e)) = tokio::time::timeout(LEAVE_BOUND, rx.recv()).await {
        if matches!(e, LockEvent::Left) {
            left = true;
            break;
        }
    }
    assert!(left, "the waiter never reported leaving");
    // And the broker agrees: only the holder remains a member.
    let members = broker.members(&group).await;
    assert_eq!(
        members,
        vec![holder.member_id()],
        "the waiter must have left"
    );
    holder.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_settings_are_rejected_before_the_broker_sees_them() {
    // Nothing listens on the discard port: an error other than Config would mean a connection
    // was attempted first.
    let nowhere = |group: &str| LockOptions::new("127.0.0.1:9", group);
    let err = nowhere("x")
        .heartbeat_interval(Duration::from_secs(30))
        .acquire(None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    let err = nowhere("").acquire(None).await.unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    let err = LockOptions::new("not-an-address", "x")
        .acquire(None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
}

on_brokers!(consumer_mode_refuses_a_topic_with_several_partitions: apache);
async fn consumer_mode_refuses_a_topic_with_several_partitions(broker: Broker) {
    let topic = support::unique_group("multi");
    broker.create_topic(&topic, 3);
    let err = opts(broker, &topic)
        .consumer_topic(&topic)
        .acquire(Some(SLACK))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(m) if m.contains("3 partitions")),
        "{err}"
    );
    let err = opts(broker, &topic)
        .consumer_topic("no-such-topic-here")
        .acquire(Some(SLACK))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(m) if m.contains("does not exist")),
        "{err}"
    );
}

on_brokers!(consumer_mode_takes_partition_zero: apache, tansu);
async fn consumer_mode_takes_partition_zero(broker: Broker) {
    support::init_tracing();
    let topic = support::unique_group("one");
    broker.create_topic(&topic, 1);
    let guard = opts(broker, &topic)
        .consumer_topic(&topic)
        .acquire(Some(broker.rebalance_bound(HEARTBEAT)))
        .await
        .expect("acquire");
    // Apache Kafka's first completed generation is 1 (a new group starts at 0 and every
    // completed join increments it); tansu's is 0.
    let first = match broker {
        Broker::Apache => 1,
        Broker::Tansu => 0,
    };
    assert_eq!(guard.token().generation, first);
    guard.release().await.unwrap();
}

on_brokers!(a_holder_keeps_the_lock_across_many_lease_lengths: apache, tansu);
async fn a_holder_keeps_the_lock_across_many_lease_lengths(broker: Broker) {
    support::init_tracing();
    let group = support::unique_group("long-hold");
    let options = opts(broker, &group);
    let lease = options.lease_length();
    let guard = options
        .acquire(Some(broker.rebalance_bound(HEARTBEAT)))
        .await
        .unwrap();
    // Renewals must reach the guard: holding for three lease lengths only works if every
    // heartbeat pushes the lease end forward. On Apache Kafka the broker's own session timer
    // runs too: a member whose heartbeats stopped counting would be expired after 6 s and fenced.
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
    assert_eq!(broker.members(&group).await, vec![guard.member_id()]);
    guard.release().await.unwrap();
}

on_brokers!(a_cancelled_acquire_leaves_no_member_behind: apache, tansu);
/// Jepsen's "ambiguous acquire" and Curator's orphaned waiters: an acquire whose future is
/// dropped mid-wait must not leave a member behind that could later be handed the lock.
async fn a_cancelled_acquire_leaves_no_member_behind(broker: Broker) {
    support::init_tracing();
    let group = support::unique_group("cancelled");
    let bound = broker.rebalance_bound(HEARTBEAT);
    let holder = opts(broker, &group).acquire(Some(bound)).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let waiter = opts(broker, &group).events(tx);
    let pending = tokio::spawn(async move { waiter.acquire(None).await });
    // Cancel once the waiter is queued behind the holder.
    loop {
        match tokio::time::timeout(bound, rx.recv())
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
        match tokio::time::timeout(bound, rx.recv())
            .await
            .expect("the abandoned waiter leaves")
        {
            Some(LockEvent::Left) => break,
            Some(LockEvent::Acquired { .. }) => panic!("an abandoned waiter acquired the lock"),
            Some(_) => {}
            None => panic!("the waiter's session ended without leaving"),
        }
    }
    assert_eq!(broker.members(&group).await, vec![holder.member_id()]);
    assert!(holder.is_held());
    holder.release().await.unwrap();
}

on_brokers!(try_acquire_in_consumer_mode_answers_at_the_first_generation: apache);
/// A single try in consumer-compatible mode ends at the first completed generation that gives
/// partition 0 to someone else. Consumer assignments name no holder and no queue position, so
/// only the generation tells the try that it is over.
async fn try_acquire_in_consumer_mode_answers_at_the_first_generation(broker: Broker) {
    support::init_tracing();
    let topic = support::unique_group("try-consumer");
    broker.create_topic(&topic, 1);
    let bound = broker.rebalance_bound(HEARTBEAT);
    // Member ids start with the client id, so the holder sorts first and keeps partition 0
    // whichever assignor the group picks (range by member id, or sticky).
    let holder = opts(broker, &topic)
        .consumer_topic(&topic)
        .client_id("a-holder")
        .acquire(Some(bound))
        .await
        .expect("acquire");
    let (tx, rx) = mpsc::unbounded_channel();
    let waiting = first_waiting(rx);
    let attempt = opts(broker, &topic)
        .consumer_topic(&topic)
        .client_id("z-try")
        .events(tx);
    let got = tokio::time::timeout(bound, attempt.try_acquire())
        .await
        .expect("a single try must end once a generation has completed")
        .expect("try_acquire");
    let returned = Instant::now();
    assert!(got.is_none(), "partition 0 stayed with the holder");
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

/// How long the tests below let a leave take: short, so that a call that waited longer shows.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(1);

on_brokers!(an_acquire_that_gives_up_returns_within_its_wait_and_the_leave_timeout: apache, tansu);
/// `acquire(Some(wait))` returns within `wait + leave timeout` (plus scheduling slack), whatever
/// the broker is doing with the waiter's JoinGroup at that moment (tansu parks every one for
/// about half the session timeout, so there the wait ends in the middle of one).
async fn an_acquire_that_gives_up_returns_within_its_wait_and_the_leave_timeout(broker: Broker) {
    support::init_tracing();
    let group = support::unique_group("bounded-wait");
    let holder = opts(broker, &group)
        .acquire(Some(broker.rebalance_bound(HEARTBEAT)))
        .await
        .unwrap();
    for wait in [Duration::from_millis(500), Duration::from_secs(2)] {
        let started = Instant::now();
        let err = opts(broker, &group)
            .leave_timeout(LEAVE_TIMEOUT)
            .acquire(Some(wait))
            .await
            .unwrap_err();
        let took = started.elapsed();
        assert!(matches!(err, Error::NotAcquired { .. }), "{err}");
        assert!(
            took < wait + LEAVE_TIMEOUT + SLACK,
            "acquire(Some({wait:?})) returned after {took:?}"
        );
    }
    assert_eq!(holder.release().await.unwrap(), Release::Confirmed);
}

// Apache only: on tansu a waiter that leaves in the middle of the rebalance its join started
// leaves that rebalance unfinished (seen: the holder's JoinGroup, or its SyncGroup as leader,
// stays unanswered until its lease runs out), so the holder loses the lock in about half the
// runs on a quiet machine. Apache does not leave it hanging: a LeaveGroup removes the member and
// completes the join waiting on it, or, once the join is done, starts a new rebalance that answers
// the pending SyncGroup with REBALANCE_IN_PROGRESS (GroupMetadataManager
// `removeMemberAndUpdateClassicGroup`).
on_brokers!(a_waiter_that_gives_up_answers_in_bounded_time_and_leaves_no_member: apache);
/// The documented bounds of giving up, on a held lock: `try_acquire` (the CLI's `--wait 0`)
/// answers once the first generation completes and then leaves, `acquire(Some(wait))` within
/// `wait` and the leave timeout; either way the broker lists no member of the waiter afterwards,
/// so it left with a LeaveGroup rather than by a session timeout later.
async fn a_waiter_that_gives_up_answers_in_bounded_time_and_leaves_no_member(broker: Broker) {
    support::init_tracing();
    let group = support::unique_group("gives-up");
    let holder = opts(broker, &group)
        .acquire(Some(broker.rebalance_bound(HEARTBEAT)))
        .await
        .unwrap();
    // Long enough that a loaded machine confirms the leave in time: an unconfirmed leave would
    // leave the member listed until its session times out, which the check below would catch.
    let leave = Duration::from_secs(3);
    let waiter = || opts(broker, &group).leave_timeout(leave);

    let started = Instant::now();
    let once = waiter().try_acquire().await.unwrap();
    let took = started.elapsed();
    assert!(once.is_none(), "a held lock is not taken");
    let bound = broker.rebalance_bound(HEARTBEAT) + leave + SLACK;
    assert!(
        took < bound,
        "try_acquire answered after {took:?} (bound {bound:?})"
    );
    assert_only_member(broker, &group, &holder.member_id()).await;

    for wait in [
        Duration::ZERO,
        Duration::from_millis(500),
        Duration::from_secs(2),
    ] {
        let started = Instant::now();
        let err = waiter().acquire(Some(wait)).await.unwrap_err();
        let took = started.elapsed();
        assert!(matches!(err, Error::NotAcquired { .. }), "{err}");
        let bound = wait + leave + SLACK;
        assert!(
            took < bound,
            "acquire(Some({wait:?})) returned after {took:?} (bound {bound:?})"
        );
        assert_only_member(broker, &group, &holder.member_id()).await;
    }
    assert!(holder.is_held(), "the waiters took nothing from the holder");
    assert_eq!(holder.release().await.unwrap(), Release::Confirmed);
}

/// The group's members are `holder` alone. Asked a few times over one second: the LeaveGroup
/// was answered before the waiter returned, but the coordinator may still be completing the
/// rebalance it started. Far shorter than the 6 s session, after which a member that never
/// left would be gone too.
async fn assert_only_member(broker: Broker, group: &str, holder: &str) {
    let mut members = Vec::new();
    for _ in 0..5 {
        members = broker.members(group).await;
        if members == [holder] {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{group}: members {members:?}, expected only the holder {holder}");
}

/// The wait bounds reaching the cluster too: a bootstrap broker that accepts connections and
/// never answers (a listener nobody accepts on) holds the caller no longer than its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_from_an_unanswering_cluster_returns_within_its_wait() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let bootstrap = silent.local_addr().unwrap().to_string();
    let wait = Duration::from_secs(1);
    let started = Instant::now();
    let err = LockOptions::new(&bootstrap, support::unique_group("silent"))
        .connect_timeout(Duration::from_secs(30))
        .acquire(Some(wait))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotAcquired { .. }), "{err}");
    assert!(
        started.elapsed() < wait + SLACK,
        "returned after {:?}",
        started.elapsed()
    );
}

on_brokers!(release_says_the_coordinator_confirmed_the_leave: apache, tansu);
async fn release_says_the_coordinator_confirmed_the_leave(broker: Broker) {
    support::init_tracing();
    let group = support::unique_group("confirmed");
    let guard = opts(broker, &group)
        .leave_timeout(Duration::from_secs(10))
        .acquire(Some(broker.rebalance_bound(HEARTBEAT)))
        .await
        .unwrap();
    assert_eq!(guard.release().await.unwrap(), Release::Confirmed);
    assert!(
        broker.members(&group).await.is_empty(),
        "the broker still lists a member after a confirmed leave"
    );
}

/// A coordinator that stops answering: the release returns after the leave timeout, says the
/// leave is unconfirmed, and the hold has ended anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_the_coordinator_never_answers_is_unconfirmed_and_bounded() {
    use crate::proxy::Proxy;
    use crate::support::kafka::{KafkaCluster, KafkaOptions};
    support::init_tracing();
    let proxy = Arc::new(Proxy::start());
    let forward = proxy.clone();
    let _kafka = KafkaCluster::start(
        KafkaOptions::single_node()
            .property(
                "advertised.listeners",
                format!("PLAINTEXT://127.0.0.1:{}", proxy.port()),
            )
            .on_ports(move |ports| forward.set_target(([127, 0, 0, 1], ports[0]).into())),
    );
    let guard = LockOptions::new(proxy.bootstrap(), support::unique_group("unconfirmed"))
        .session_timeout(Duration::from_secs(6))
        .heartbeat_interval(HEARTBEAT)
        .leave_timeout(LEAVE_TIMEOUT)
        .acquire(Some(Duration::from_secs(30)))
        .await
        .unwrap();
    let watch = guard.watch();
    proxy.blackhole();
    let started = Instant::now();
    assert_eq!(guard.release().await.unwrap(), Release::Unconfirmed);
    assert!(
        started.elapsed() < LEAVE_TIMEOUT + SLACK,
        "release took {:?}",
        started.elapsed()
    );
    assert!(
        !watch.is_held(),
        "the hold ends before the LeaveGroup goes out"
    );
}

on_brokers!(a_short_acquire_names_the_holder: apache);
/// A bounded acquire that ends before its own join's rebalance completed still names the
/// holder (from a look before joining), as the CLI does. Breaks (`holder: None`) without it.
async fn a_short_acquire_names_the_holder(broker: Broker) {
    support::init_tracing();
    let group = support::unique_group("short-names");
    let bound = broker.rebalance_bound(HEARTBEAT);
    // Heartbeats seconds apart: the holder is slow to rejoin, so the waiter's 1 s ends while
    // its join's rebalance is still in progress.
    let holder = LockOptions::new(broker.bootstrap(), &group)
        .session_timeout(Duration::from_secs(10))
        .heartbeat_interval(Duration::from_secs(3))
        .label("the named holder")
        .acquire(Some(bound))
        .await
        .unwrap();
    let err = opts(broker, &group)
        .acquire(Some(Duration::from_secs(1)))
        .await
        .unwrap_err();
    match &err {
        Error::NotAcquired {
            holder: Some(h), ..
        } => assert!(h.contains("the named holder"), "{err}"),
        other => panic!("expected NotAcquired naming the holder, got {other:?}"),
    }
    holder.release().await.unwrap();
}

/// A native member driven by hand, for what kafka-lock itself never sends.
mod raw {
    use std::time::Duration;

    use kafka_lock::internals::assign::{
        MemberMetadata, NativeAssignment, NATIVE_PROTOCOL, PROTOCOL_TYPE,
    };
    use kafka_lock::internals::driver::Connection;
    use kafka_lock::internals::wire::Response;
    use kafka_protocol::messages::join_group_request::{
        JoinGroupRequest, JoinGroupRequestProtocol,
    };
    use kafka_protocol::messages::leave_group_request::{LeaveGroupRequest, MemberIdentity};
    use kafka_protocol::messages::sync_group_request::SyncGroupRequest;
    use kafka_protocol::messages::{ApiKey, GroupId};
    use kafka_protocol::protocol::StrBytes;

    use crate::support::brokers::Broker;
    use crate::support::kafka::probe::coordinator_connection;

    const MEMBER_ID_REQUIRED: i16 = 79;

    fn sb(s: &str) -> StrBytes {
        StrBytes::from_string(s.to_owned())
    }

    /// A member whose metadata claims it first joined in generation 0: in FIFO order it comes
    /// before any member of the group as it is now.
    pub struct EarlyJoiner {
        conn: Connection,
        group: String,
        member: String,
        pub assignment: NativeAssignment,
    }

    impl EarlyJoiner {
        /// Joins (twice, when the broker asks for a member id first) and syncs as a follower;
        /// every request is bounded by `bound`.
        pub async fn join(broker: Broker, group: &str, bound: Duration) -> EarlyJoiner {
            let conn = coordinator_connection(&broker.bootstrap(), group)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let metadata = MemberMetadata {
                holds: false,
                first_joined_generation: 0,
                holder_generation: -1,
                label: Some("early".into()),
                permits: 1,
                slot: 0,
                ledger: None,
            }
            .encode();
            let mut member = String::new();
            let joined = loop {
                let mut p = JoinGroupRequestProtocol::default();
                p.name = sb(NATIVE_PROTOCOL);
                p.metadata = metadata.clone();
                let mut req = JoinGroupRequest::default();
                req.group_id = GroupId(sb(group));
                req.session_timeout_ms = 6000;
                req.rebalance_timeout_ms = 6000;
                req.member_id = sb(&member);
                req.protocol_type = sb(PROTOCOL_TYPE);
                req.protocols = vec![p];
                let resp = match conn.request_with_timeout(req, bound).await {
                    Ok(Response::JoinGroup(r)) => r,
                    other => panic!("JoinGroup: {other:?}"),
                };
                match resp.error_code {
                    0 => break resp,
                    MEMBER_ID_REQUIRED if member.is_empty() => member = resp.member_id.to_string(),
                    code => panic!("JoinGroup answered {code}: {resp:?}"),
                }
            };
            member = joined.member_id.to_string();
            assert_ne!(
                joined.leader.as_str(),
                member,
                "the hand-driven member was made leader; it cannot assign"
            );
            let version = conn.versions().get(ApiKey::SyncGroup).expect("SyncGroup");
            let mut req = SyncGroupRequest::default();
            req.group_id = GroupId(sb(group));
            req.generation_id = joined.generation_id;
            req.member_id = sb(&member);
            if version >= 5 {
                req.protocol_type = Some(sb(PROTOCOL_TYPE));
                req.protocol_name = Some(sb(NATIVE_PROTOCOL));
            }
            let synced = match conn.request_at(req, version, bound).await {
                Ok(Response::SyncGroup(r)) => r,
                other => panic!("SyncGroup: {other:?}"),
            };
            assert_eq!(synced.error_code, 0, "{synced:?}");
            let assignment =
                NativeAssignment::decode(&synced.assignment).expect("a native assignment");
            EarlyJoiner {
                conn,
                group: group.to_owned(),
                member,
                assignment,
            }
        }

        /// Leaves the group, bounded by `bound`, and closes the connection.
        pub async fn leave(self, bound: Duration) {
            let version = self
                .conn
                .versions()
                .get(ApiKey::LeaveGroup)
                .expect("LeaveGroup");
            let mut req = LeaveGroupRequest::default();
            req.group_id = GroupId(sb(&self.group));
            if version >= 3 {
                let mut m = MemberIdentity::default();
                m.member_id = sb(&self.member);
                req.members = vec![m];
            } else {
                req.member_id = sb(&self.member);
            }
            match self.conn.request_at(req, version, bound).await {
                Ok(Response::LeaveGroup(r)) => assert_eq!(r.error_code, 0, "{r:?}"),
                other => panic!("LeaveGroup: {other:?}"),
            }
            self.conn.close();
        }
    }
}

//! The semaphore (`LockOptions::permits`) on Apache Kafka: at most N holders, each in a permit
//! slot of its own that it keeps through rebalances; waiters in FIFO order; a release hands its
//! slot to the first waiter with a greater token; every member must agree on N.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_lock::{Error, LockEvent, LockGuard, LockOptions};
use tokio::sync::mpsc;

use crate::support;
use crate::support::brokers::{Broker, SLACK};
use crate::support::holds::{max_concurrent, Holds};

const HEARTBEAT: Duration = Duration::from_millis(500);
const PERMITS: u16 = 3;

fn opts(group: &str, permits: u16) -> LockOptions {
    LockOptions::new(Broker::Apache.bootstrap(), group)
        .session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(6))
        .heartbeat_interval(HEARTBEAT)
        .lease_margin(Duration::from_secs(1))
        .permits(permits)
}

/// A resource with one instance per permit slot, judged independently of the lock's events: it
/// counts the users at once, refuses a second user of a slot, and accepts a slot's token only
/// if it is greater than every earlier one of that slot.
struct Slots {
    busy: AtomicUsize,
    most: AtomicUsize,
    slots: Mutex<Vec<(bool, i32)>>,
}

impl Slots {
    fn new(permits: u16) -> Slots {
        Slots {
            busy: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            slots: Mutex::new(vec![(false, -1); usize::from(permits)]),
        }
    }

    fn enter(&self, g: &LockGuard) {
        let (slot, token) = (usize::from(g.permit()), g.token().generation);
        {
            let mut slots = self.slots.lock().unwrap();
            let (used, last) = &mut slots[slot];
            assert!(!*used, "permit {slot} used twice at once");
            assert!(token > *last, "permit {slot}: token {token} after {last}");
            *used = true;
            *last = token;
        }
        let now = self.busy.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        assert!(now <= usize::from(PERMITS), "{now} holders at once");
    }

    fn leave(&self, g: &LockGuard) {
        self.busy.fetch_sub(1, Ordering::SeqCst);
        self.slots.lock().unwrap()[usize::from(g.permit())].0 = false;
    }
}

/// The next `Waiting` event of `rx`, within `bound`.
async fn next_waiting(
    rx: &mut mpsc::UnboundedReceiver<LockEvent>,
    bound: Duration,
    pred: impl Fn(i32, usize) -> bool,
) -> (i32, Vec<u16>) {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let ev = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .expect("a waiting event in time")
            .expect("events flow");
        if let LockEvent::Waiting {
            position, holders, ..
        } = ev
        {
            if pred(position, holders.len()) {
                return (position, holders.iter().map(|h| h.slot).collect());
            }
        }
    }
}

/// Three permits, six contenders: the first three hold at once in slots 0, 1, 2 and keep them
/// while three waiters join one by one (three rebalances); the waiters queue in the order they
/// came; each release hands its slot to the first waiter, under a greater token. Never more
/// than three holders, judged by the holders' own events and by the resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_permits_six_contenders_sticky_and_fifo() {
    support::init_tracing();
    let group = support::unique_group("semaphore");
    let bound = Broker::Apache.rebalance_bound(HEARTBEAT);
    let holds = Holds::new();
    let slots = Arc::new(Slots::new(PERMITS));

    // Three holders, all at once.
    let mut holders = Vec::new();
    for i in 0..3 {
        let (o, _rx) = holds.record(
            &format!("h{i}"),
            opts(&group, PERMITS).label(format!("h{i}")),
        );
        let g = o.acquire(Some(bound)).await.expect("a free permit");
        slots.enter(&g);
        holders.push((g, o));
    }
    let mut used: Vec<u16> = holders.iter().map(|(g, _)| g.permit()).collect();
    used.sort_unstable();
    assert_eq!(used, [0, 1, 2]);
    let before: Vec<(u16, i32)> = holders
        .iter()
        .map(|(g, _)| (g.permit(), g.token().generation))
        .collect();

    // Three waiters, one at a time, so that their places in the queue are known.
    let mut waiters = Vec::new();
    for i in 0..3usize {
        let (o, mut rx) = holds.record(
            &format!("w{i}"),
            opts(&group, PERMITS).label(format!("w{i}")),
        );
        let task = {
            let o = o.clone();
            tokio::spawn(async move { o.acquire(Some(Duration::from_secs(120))).await })
        };
        let (position, named) =
            next_waiting(&mut rx, bound + SLACK, |p, n| p == i as i32 + 1 && n == 3).await;
        assert_eq!(position, i as i32 + 1);
        assert_eq!(named, [0, 1, 2], "every waiter is told all three holders");
        waiters.push((task, rx, o));
    }
    // The holders kept their permits (and slots) through the three rebalances.
    for (g, o) in &holders {
        assert!(g.is_held(), "{:?}", o.stats());
        assert!(o.stats().losses.is_empty());
        assert!(g.token().generation > before.iter().find(|b| b.0 == g.permit()).unwrap().1);
    }
    assert!(waiters.iter().all(|(t, _, _)| !t.is_finished()));

    // Releases: each hands its slot to the first waiter in line.
    let mut taken = Vec::new();
    for (k, (g, _)) in holders.drain(..).enumerate() {
        let (slot, old) = (g.permit(), g.token().generation);
        slots.leave(&g);
        g.release().await.expect("release");
        let (task, _rx, o) = waiters.remove(0);
        let got = tokio::time::timeout(bound + SLACK, task)
            .await
            .unwrap_or_else(|_| panic!("waiter {k} takes the released permit"))
            .unwrap()
            .expect("acquire");
        assert_eq!(got.permit(), slot, "the freed slot goes to the next waiter");
        assert!(got.token().generation > old);
        slots.enter(&got);
        // Nobody behind it got a permit in the same handover.
        assert!(waiters.iter().all(|(t, _, _)| !t.is_finished()));
        taken.push((got, o));
    }
    for (g, _) in taken {
        slots.leave(&g);
        g.release().await.expect("release");
    }

    let held = holds.check_semaphore_when_ended(PERMITS, SLACK).await;
    assert_eq!(held.len(), 6, "{held:#?}");
    assert!(held.iter().all(|h| h.lost.is_none()), "{held:#?}");
    assert_eq!(max_concurrent(&held), 3, "{held:#?}");
    assert_eq!(slots.most.load(Ordering::SeqCst), 3);
}

/// Six contenders that all start at once and each hold for a while: whatever order the broker
/// admits them in, never more than three hold, each once, and every one gets a permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_contenders_at_once_never_more_than_three() {
    support::init_tracing();
    let group = support::unique_group("semaphore-rush");
    let holds = Holds::new();
    let slots = Arc::new(Slots::new(PERMITS));
    let work = Duration::from_millis(1500);
    let wait = (work + Broker::Apache.rebalance_bound(HEARTBEAT)) * 6;
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (o, _rx) = holds.record(
            &format!("c{i}"),
            opts(&group, PERMITS).label(format!("c{i}")),
        );
        let slots = slots.clone();
        tasks.push(tokio::spawn(async move {
            let g = o.acquire(Some(wait)).await.expect("acquire");
            slots.enter(&g);
            tokio::time::sleep(work).await;
            assert!(g.is_held(), "lost while working: {:?}", o.stats());
            slots.leave(&g);
            g.release().await.expect("release");
            o.stats()
        }));
    }
    for t in tasks {
        let stats = tokio::time::timeout(wait + SLACK, t)
            .await
            .expect("every contender finishes")
            .unwrap();
        assert_eq!(stats.acquisitions, 1);
        assert!(stats.losses.is_empty(), "{stats:?}");
    }
    let held = holds.check_semaphore_when_ended(PERMITS, SLACK).await;
    assert_eq!(held.len(), 6);
    assert!(max_concurrent(&held) <= 3);
}

/// A member with another number of permits than the group's gets a typed error naming both,
/// and leaves; the group keeps its number and its holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_other_permits_is_refused_with_both_numbers() {
    support::init_tracing();
    let bound = Broker::Apache.rebalance_bound(HEARTBEAT);
    for (group_n, other_n) in [(2u16, 3u16), (2, 1), (1, 2)] {
        let group = support::unique_group("semaphore-mismatch");
        let holder = opts(&group, group_n)
            .acquire(Some(bound))
            .await
            .expect("the first member holds");
        let started = Instant::now();
        match opts(&group, other_n).acquire(Some(bound * 2)).await {
            Err(Error::PermitsMismatch {
                lock,
                ours,
                group: n,
            }) => {
                assert_eq!((lock.as_str(), ours, n), (group.as_str(), other_n, group_n));
                let text = Error::PermitsMismatch {
                    lock,
                    ours,
                    group: n,
                }
                .to_string();
                assert!(text.contains(&format!("has {group_n} permit")), "{text}");
                assert!(
                    text.contains(&format!("configured with {other_n}")),
                    "{text}"
                );
            }
            other => panic!("{group_n} vs {other_n}: {other:?}"),
        }
        assert!(
            started.elapsed() < bound * 2,
            "refused at once, not by timeout"
        );
        assert!(holder.is_held(), "the group keeps its holder");
        // The refused member left: once the group settles only the holder is in it.
        let deadline = Instant::now() + bound + SLACK;
        loop {
            let members = Broker::Apache.members(&group).await;
            if members == [holder.member_id()] {
                break;
            }
            assert!(Instant::now() < deadline, "{members:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        holder.release().await.expect("release");
    }
}

/// Refused before any broker is asked: a consumer-compatible lock is one partition, one owner.
#[test]
fn permits_are_refused_in_consumer_mode() {
    let base = LockOptions::new("127.0.0.1:9", "l");
    base.clone()
        .ledger_topic("ledger")
        .permits(2)
        .validate()
        .unwrap();
    for (o, want) in [
        (
            base.clone().consumer_topic("t").permits(2),
            "consumer-compatible",
        ),
        (base.clone().permits(0), "out of range"),
        (base.clone().permits(1025), "out of range"),
    ] {
        match o.validate() {
            Err(Error::Config(m)) => assert!(m.contains(want), "{m}"),
            other => panic!("{other:?}"),
        }
    }
    base.clone()
        .consumer_topic("t")
        .permits(1)
        .validate()
        .unwrap();
    base.permits(1024).validate().unwrap();
}

/// What a semaphore costs the coordinator, for BENCHMARKS.md: six members with three permits
/// and the library's default timings (heartbeat 1 s), each behind a counting proxy. Prints the
/// requests per second while three hold and three wait, and the group requests of one release
/// and its hand-over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement for BENCHMARKS.md: cargo test --all-features --test it -- semaphore::cost --ignored --nocapture"]
async fn cost() {
    use crate::fault::kproxy::ProxySet;
    use kafka_protocol::messages::ApiKey;

    support::init_tracing();
    let group = support::unique_group("semaphore-cost");
    let node = &support::kafka::kafka().nodes()[0];
    let brokers = [(node.id(), node.addr().parse().expect("node address"))];
    let members = 6;
    let mut proxies = Vec::new();
    let mut guards = Vec::new();
    let mut waiters = Vec::new();
    for i in 0..members {
        let p = ProxySet::start(&tokio::runtime::Handle::current(), &brokers);
        let o = LockOptions::new(p.bootstrap(), &group)
            .permits(PERMITS)
            .label(format!("m{i}"));
        proxies.push(p);
        if i < 3 {
            guards.push(
                o.acquire(Some(Duration::from_secs(30)))
                    .await
                    .expect("a free permit"),
            );
        } else {
            waiters.push(tokio::spawn(async move {
                o.acquire(Some(Duration::from_secs(300))).await
            }));
        }
    }
    let total = |keys: &[i16]| -> u64 {
        proxies
            .iter()
            .map(|p| {
                let r = p.stats().requests.lock().unwrap();
                r.iter()
                    .filter(|(k, _)| keys.is_empty() || keys.contains(k))
                    .map(|(_, n)| n)
                    .sum::<u64>()
            })
            .sum()
    };
    // Let the three joins settle, then count.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let window = Duration::from_secs(30);
    let before = total(&[]);
    let beats_before = total(&[ApiKey::Heartbeat as i16]);
    tokio::time::sleep(window).await;
    let steady = (total(&[]) - before) as f64 / window.as_secs_f64();
    let beats = (total(&[ApiKey::Heartbeat as i16]) - beats_before) as f64 / window.as_secs_f64();
    assert!(guards.iter().all(LockGuard::is_held));
    assert!(waiters.iter().all(|w| !w.is_finished()));

    let group_keys = [
        ApiKey::JoinGroup as i16,
        ApiKey::SyncGroup as i16,
        ApiKey::LeaveGroup as i16,
    ];
    let before = total(&group_keys);
    let started = Instant::now();
    guards
        .pop()
        .expect("a holder")
        .release()
        .await
        .expect("release");
    let next = tokio::time::timeout(Duration::from_secs(30), waiters.remove(0))
        .await
        .expect("the first waiter takes the permit")
        .unwrap()
        .expect("acquire");
    let handover = started.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let per_release = total(&group_keys) - before;
    println!(
        "semaphore cost, {members} members, {PERMITS} permits, heartbeat 1 s: {steady:.2} requests/s \
         at the coordinator while 3 hold and 3 wait ({beats:.2} of them Heartbeats); one release: \
         {per_release} JoinGroup/SyncGroup/LeaveGroup requests, hand-over in {:.0} ms",
        handover.as_secs_f64() * 1000.0
    );
    next.release().await.expect("release");
    for g in guards {
        g.release().await.expect("release");
    }
    for w in waiters {
        w.abort();
    }
}

/// Two permits with a ledger, five contenders in turn: each slot's tokens are ledger offsets that
/// strictly increase within the slot, judged by a resource that fences writes per slot (a stale
/// holder's write after the slot's next holder wrote is refused); the ledger's history names
/// each hold's slot as the holder was told it, and folds the two slots apart (no hold of one
/// slot reads as ended by the other's). Breaks if records did not carry the slot, or if the
/// history judged silent ends across slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_permits_with_a_ledger_fence_each_slot_by_ledger_offsets() {
    support::init_tracing();
    let bootstrap = Broker::Apache.bootstrap();
    let ledger = support::unique_group("semaphore-ledger");
    crate::support::kafka::probe::create_topic(&bootstrap, &ledger, 1);
    let group = support::unique_group("semaphore-ledger-lock");
    let bound = Broker::Apache.rebalance_bound(HEARTBEAT);
    let holds = Holds::new();
    let o = |who: &str| {
        holds.record(
            who,
            opts(&group, 2).ledger_topic(&ledger).label(who.to_owned()),
        )
    };
    // The resource: per slot, the highest token written; a write with a lower one is refused.
    let mut highest: [Option<i64>; 2] = [None, None];
    let mut write = |slot: u16, token: i64| -> bool {
        let h = &mut highest[usize::from(slot)];
        if h.is_some_and(|h| token < h) {
            return false;
        }
        *h = Some(token);
        true
    };

    let (a, _ra) = o("a");
    let (b, _rb) = o("b");
    let ga = a.acquire(Some(bound)).await.expect("a holds");
    let gb = b.acquire(Some(bound)).await.expect("b holds");
    assert_ne!(ga.permit(), gb.permit(), "two holders, two slots");
    let mut told = vec![
        (ga.token().value(), ga.permit()),
        (gb.token().value(), gb.permit()),
    ];
    assert!(ga.token().ledger_offset.is_some() && gb.token().ledger_offset.is_some());
    assert!(write(ga.permit(), ga.token().value()));
    assert!(write(gb.permit(), gb.token().value()));

    // Hand the slots on three times, each time releasing one of the two holders.
    let wait = Duration::from_secs(60);
    let mut current = [Some(ga), Some(gb)];
    for (k, who) in ["c", "d", "e"].into_iter().enumerate() {
        let i = k % 2;
        let (next, _rx) = o(who);
        let waiting = tokio::spawn(async move { next.acquire(Some(wait)).await });
        // The slot is freed only by the release below; first the newcomer must be queued.
        let deadline = Instant::now() + bound + SLACK;
        while Broker::Apache.members(&group).await.len() < 3 {
            assert!(Instant::now() < deadline, "the newcomer joins");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let held = current[i].take().expect("a holder");
        let (slot, token) = (held.permit(), held.token().value());
        held.release().await.expect("release");
        let got = tokio::time::timeout(wait + SLACK, waiting)
            .await
            .expect("the newcomer acquires in time")
            .unwrap()
            .expect("the newcomer acquires");
        assert_eq!(got.permit(), slot, "the freed slot goes to the newcomer");
        let new = got.token().value();
        assert!(new > token, "slot {slot}: token {new} after {token}");
        assert!(write(slot, new));
        // The old holder's token is now refused by the slot's resource.
        assert!(
            !write(slot, token),
            "a stale write in slot {slot} is fenced"
        );
        told.push((new, slot));
        current[i] = Some(got);
    }
    for g in current.into_iter().flatten() {
        g.release().await.expect("release");
    }
    holds.check_semaphore_when_ended(2, SLACK).await;

    let history = LockOptions::new(&bootstrap, &group)
        .ledger_topic(&ledger)
        .history()
        .await
        .expect("history");
    let mut recorded: Vec<(i64, u16)> = history.holds.iter().map(|h| (h.token, h.slot)).collect();
    recorded.sort_unstable();
    told.sort_unstable();
    assert_eq!(recorded, told, "{history:#?}");
    assert!(
        history.holds.iter().all(|h| h.end.name() == "released"),
        "every hold reads as released, none as ended by the other slot: {history:#?}"
    );
    for slot in 0..2 {
        let tokens: Vec<i64> = history
            .holds
            .iter()
            .filter(|h| h.slot == slot)
            .map(|h| h.token)
            .collect();
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    }
}

//! The contender processes of the fault suite. They are this test binary run again with one
//! ignored test selected and `FAULT_ROLE` set, so they need no build of their own and share the
//! checker's client code:
//!
//! - `lib`: a library contender. It waits for the lock, writes its token to the store at once
//!   (the claim that fences every older holder off), then every 200 ms while
//!   [`kafka_lock::LockGuard::is_held`], holds for a random 0.3 to 3 s, reports and releases, and
//!   starts over. A loss is reported with the lease end the library gives with it. With
//!   `FAULT_TOPIC` it takes the lock in consumer-compatible mode; with `FAULT_LEDGER` its token
//!   is the offset of its ACQUIRED record in that ledger topic ([`Flavour`]).
//! - `broken`: the same, but it ignores the loss: it keeps writing every 20 ms and keeps
//!   believing it holds until it releases after 20 s. The suite must catch it.
//! - `many`: library contenders on several locks (`FAULT_LOCK`, in its flavour, and the
//!   comma-separated `FAULT_EXTRA_LOCKS`, with generation tokens) through one
//!   [`kafka_lock::Client`] in one process, each lock contended for as by `lib`: a fault aimed
//!   at this process, or at a broker, hits the connections all its locks share.
//! - `reads`: a `lib` contender that takes its lock through a [`kafka_lock::Client`] which also
//!   reads the lock all the time, with a request timeout of [`READ_TIMEOUT`]: `describe`,
//!   `history` and an observer polling DescribeGroups, on the connections the holder's
//!   Heartbeats take. The `hold-heartbeat` nemesis aims at it.
//! - `slow`: a `lib` contender that asks for the lock's events and never reads them, and never
//!   watches its hold: it learns of a loss from [`kafka_lock::LockGuard::lost`] alone and writes
//!   while [`kafka_lock::LockGuard::is_held`]. The library must neither wait on that stream
//!   (the lease's renewals would stop) nor let the loss go astray in it.
//! - `stall`: a `lib` contender on a current_thread runtime that, when the suite drops a
//!   number of milliseconds into `FAULT_STALL_FILE` while it holds, blocks its one runtime
//!   thread that long (`std::thread::sleep` in its task: no timer, no socket, no session task
//!   runs meanwhile), then asks `is_held()` at once and reports the answer (a `stalled` event
//!   with the lease end it read before the block). It writes only if the guard says it holds,
//!   as every contender; if not, it reports the loss. The `runtime-stall` nemesis aims at it.
//! - `writer`: the job the CLI contenders run under `kafka-lock run`: it writes
//!   `$KAFKA_LOCK_TOKEN` to the store at once and every 200 ms for `FAULT_HOLD_MS`, then exits.
//!   It never looks at the lock: stopping it in time is the CLI supervisor's job.
//!
//! With `FAULT_PERMITS` above 1 the lock is a semaphore: contenders take it with that many
//! permits and report and write under their permit slot's key (see [`super::checker`]).
//!
//! With `FAULT_CHECKPOINTS=1` (checkpoint continuity), a `lib`-like contender of a lock with a
//! ledger and one permit reads the last checkpoint right after each grant, and stores a
//! checkpoint after each write and once more just before it releases; the `writer` reports the
//! `KAFKA_LOCK_CHECKPOINT` it was started with and leaves one for kafka-lock to store. Each is
//! reported to the checker (`ckread`, `cksent`, `ckacked`).

use std::time::{Duration, Instant};

use kafka_lock::{LockEvent, LockOptions};

use super::checker::{ckpt_number, Kind, Reporter};
use super::nemesis::Rng;
use super::{HEARTBEAT, SESSION};
use crate::support::mono_ns;

/// The request timeout of the `reads` role's reads: well under the lease, so a read queued
/// behind a held Heartbeat gives up while that Heartbeat can still renew the lease.
pub const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// The test that is the role entry point, for the command line of a role process.
pub const ROLE_TEST: &str = "fault::roles::role";

/// The arguments that make this test binary run [`role`] alone.
pub fn role_args() -> [&'static str; 6] {
    [
        ROLE_TEST,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
        "--quiet",
    ]
}

#[test]
#[ignore = "a child process of the fault suite (FAULT_ROLE set), not a test of its own"]
fn role() {
    let Ok(role) = std::env::var("FAULT_ROLE") else {
        return;
    };
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let mut reporter =
        Reporter::connect(&env("FAULT_CHECKER"), &env("FAULT_LOCK"), &env("FAULT_ID"))
            .unwrap_or_else(|e| panic!("cannot reach the checker: {e}"));
    match role.as_str() {
        "lib" | "broken" => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let (bootstrap, lock, flavour) = (
                env("FAULT_BOOTSTRAP"),
                env("FAULT_LOCK"),
                Flavour::from_env(),
            );
            rt.block_on(contender(
                &mut reporter,
                role == "broken",
                &|| options(&bootstrap, &lock, &flavour, permits()),
                env("FAULT_SEED").parse().expect("FAULT_SEED"),
                permits(),
                None,
            ));
        }
        "stall" => {
            // One thread: a block in a task stops everything the library runs for this hold.
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let (bootstrap, lock, flavour) = (
                env("FAULT_BOOTSTRAP"),
                env("FAULT_LOCK"),
                Flavour::from_env(),
            );
            let stall = std::path::PathBuf::from(env("FAULT_STALL_FILE"));
            rt.block_on(contender(
                &mut reporter,
                false,
                &|| options(&bootstrap, &lock, &flavour, permits()),
                env("FAULT_SEED").parse().expect("FAULT_SEED"),
                permits(),
                Some(&stall),
            ));
        }
        "many" => {
            let bootstrap = env("FAULT_BOOTSTRAP");
            let seed: u64 = env("FAULT_SEED").parse().expect("FAULT_SEED");
            let mut locks = vec![(env("FAULT_LOCK"), Flavour::from_env(), permits())];
            locks.extend(
                env("FAULT_EXTRA_LOCKS")
                    .split(',')
                    .filter(|l| !l.is_empty())
                    .map(|l| (l.to_owned(), Flavour::Plain, 1)),
            );
            // Two threads, as a service would have: the reports to the checker block briefly.
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            drop(reporter);
            let lanes: usize = std::env::var("FAULT_PARKING_LANES")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            rt.block_on(async move {
                let mut client = kafka_lock::Client::new(&bootstrap);
                if lanes > 0 {
                    client = client.parking_lanes(lanes);
                }
                let mut tasks = tokio::task::JoinSet::new();
                for (i, (lock, flavour, permits)) in locks.into_iter().enumerate() {
                    let mut rep = Reporter::connect(&env("FAULT_CHECKER"), &lock, &env("FAULT_ID"))
                        .unwrap_or_else(|e| panic!("cannot reach the checker: {e}"));
                    let client = client.clone();
                    tasks.spawn(async move {
                        let make = || tune(client.lock(&lock), &flavour, permits);
                        contender(
                            &mut rep,
                            false,
                            &make,
                            seed.wrapping_add(i as u64),
                            permits,
                            None,
                        )
                        .await;
                    });
                }
                // The contenders never end: a panic in one ends the process.
                if let Some(Err(e)) = tasks.join_next().await {
                    std::panic::resume_unwind(e.into_panic());
                }
            });
        }
        "reads" | "slow" => {
            let (bootstrap, lock, flavour) = (
                env("FAULT_BOOTSTRAP"),
                env("FAULT_LOCK"),
                Flavour::from_env(),
            );
            let seed: u64 = env("FAULT_SEED").parse().expect("FAULT_SEED");
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                if role == "slow" {
                    let make = || options(&bootstrap, &lock, &flavour, permits());
                    return slow_contender(&mut reporter, &make, seed).await;
                }
                let client = kafka_lock::Client::new(&bootstrap);
                let reads =
                    tune(client.lock(&lock), &flavour, permits()).request_timeout(READ_TIMEOUT);
                tokio::spawn(read_all_the_time(reads));
                let make = || tune(client.lock(&lock), &flavour, permits());
                contender(&mut reporter, false, &make, seed, permits(), None).await;
            });
        }
        "writer" => {
            let token: i64 = env("KAFKA_LOCK_TOKEN").parse().expect("KAFKA_LOCK_TOKEN");
            let hold = Duration::from_millis(env("FAULT_HOLD_MS").parse().expect("FAULT_HOLD_MS"));
            let until = Instant::now() + hold;
            if permits() > 1 {
                let slot = env("KAFKA_LOCK_PERMIT").parse().expect("KAFKA_LOCK_PERMIT");
                reporter.set_slot(Some(slot));
            }
            if checkpoints() {
                // Read by kafka-lock before the job started, from the hold's grant.
                let read = match std::env::var("KAFKA_LOCK_CHECKPOINT") {
                    Ok(v) => v.parse().unwrap_or(-2),
                    Err(_) => -1,
                };
                reporter.event(Kind::CkRead, Some(read), Some(token));
                // kafka-lock stores it after the job exits 0, before it releases.
                let c = ckpt_number(token, 1);
                let file = env("KAFKA_LOCK_CHECKPOINT_FILE");
                std::fs::write(&file, c.to_string())
                    .unwrap_or_else(|e| panic!("cannot write {file}: {e}"));
                reporter.event(Kind::CkSent, Some(c), None);
            }
            reporter.write(token);
            while Instant::now() < until {
                std::thread::sleep(Duration::from_millis(200));
                reporter.write(token);
            }
        }
        other => panic!("unknown FAULT_ROLE {other}"),
    }
}

/// `FAULT_CHECKPOINTS`: the contenders of a lock with a ledger and one permit store
/// checkpoints while they hold and read the last one at their grant (checkpoint continuity).
fn checkpoints() -> bool {
    std::env::var("FAULT_CHECKPOINTS").is_ok_and(|v| v == "1")
}

/// Reads the lock's last checkpoint right after the grant and reports it (`ckread`).
async fn read_checkpoint(rep: &mut Reporter, guard: &kafka_lock::LockGuard, token: i64) {
    match tokio::time::timeout(CKPT_BOUND, guard.last_checkpoint()).await {
        Ok(Ok(found)) => {
            let read = found.map_or(-1, |c| c.value.parse().unwrap_or(-2));
            rep.event(Kind::CkRead, Some(read), Some(token));
        }
        Ok(Err(e)) => eprintln!("checkpoint read failed: {e}"),
        Err(_) => eprintln!("checkpoint read: no answer within {CKPT_BOUND:?}"),
    }
}

/// Stores the hold's next checkpoint and reports it sent, then stored if the library says so.
async fn store_checkpoint(
    rep: &mut Reporter,
    guard: &kafka_lock::LockGuard,
    token: i64,
    seq: &mut i64,
) {
    *seq += 1;
    let c = ckpt_number(token, *seq);
    let sent = mono_ns();
    rep.event_at(Kind::CkSent, sent, Some(c), None);
    match tokio::time::timeout(CKPT_BOUND, guard.checkpoint(c.to_string())).await {
        Ok(Ok(())) => rep.event(Kind::CkAcked, Some(c), Some(sent)),
        Ok(Err(e)) => eprintln!("checkpoint {c} not stored: {e}"),
        // The session still takes its answer; the outcome stays unknown here.
        Err(_) => eprintln!("checkpoint {c}: no answer within {CKPT_BOUND:?}"),
    }
}

/// How long a contender waits on a checkpoint's read or store before it goes on holding
/// (a store may wait up to `offsets.commit.timeout.ms` plus the request timeout).
const CKPT_BOUND: Duration = Duration::from_secs(3);

/// `FAULT_PERMITS`, 1 when unset.
fn permits() -> u16 {
    std::env::var("FAULT_PERMITS")
        .ok()
        .map_or(1, |p| p.parse().expect("FAULT_PERMITS"))
}

/// `Instant` is CLOCK_MONOTONIC on Linux, but opaque: carried over through the current reading.
pub fn to_mono(at: Instant) -> i64 {
    let (now, mono) = (Instant::now(), mono_ns());
    if at >= now {
        mono + (at - now).as_nanos() as i64
    } else {
        mono - (now - at).as_nanos() as i64
    }
}

/// How the contenders of one lock take it and where their tokens come from. Every member of a
/// lock must use the same flavour: the tokens of one lock are compared with each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Flavour {
    /// The native protocol, tokens from this ledger topic (offsets of ACQUIRED records).
    Ledger(String),
    /// Consumer-compatible mode on this one-partition topic, tokens from the generation.
    Consumer(String),
    /// The native protocol, tokens from the generation (the self-check's lock).
    Plain,
}

impl Flavour {
    /// The variables that carry the flavour to a contender process.
    pub fn env(&self) -> Option<(&'static str, &str)> {
        match self {
            Flavour::Ledger(t) => Some(("FAULT_LEDGER", t)),
            Flavour::Consumer(t) => Some(("FAULT_TOPIC", t)),
            Flavour::Plain => None,
        }
    }

    fn from_env() -> Flavour {
        if let Ok(t) = std::env::var("FAULT_LEDGER") {
            Flavour::Ledger(t)
        } else if let Ok(t) = std::env::var("FAULT_TOPIC") {
            Flavour::Consumer(t)
        } else {
            Flavour::Plain
        }
    }

    /// `kafka-lock run` flags for this flavour.
    pub fn cli_args(&self) -> Vec<&str> {
        match self {
            Flavour::Ledger(t) => vec!["--ledger-topic", t],
            Flavour::Consumer(t) => vec!["--topic", t],
            Flavour::Plain => Vec::new(),
        }
    }
}

/// The settings every library contender of the suite uses.
pub fn options(bootstrap: &str, lock: &str, flavour: &Flavour, permits: u16) -> LockOptions {
    tune(LockOptions::new(bootstrap, lock), flavour, permits)
}

/// [`options`] on options made elsewhere (by a shared client).
fn tune(o: LockOptions, flavour: &Flavour, permits: u16) -> LockOptions {
    let o = o
        .session_timeout(SESSION)
        .rebalance_timeout(SESSION)
        .heartbeat_interval(HEARTBEAT)
        .permits(permits);
    match flavour {
        Flavour::Ledger(t) => o.ledger_topic(t),
        Flavour::Consumer(t) => o.consumer_topic(t),
        Flavour::Plain => o,
    }
}

/// `describe` and `history` one after the other, and an observer polling DescribeGroups, through
/// the client `reads` came from, for ever. Their failures are expected under faults; each is
/// logged.
async fn read_all_the_time(reads: LockOptions) {
    let mut observer = reads
        .observer()
        .via_describe()
        .interval(Duration::from_millis(100));
    tokio::spawn(async move {
        loop {
            // Bounded: the first observation returns its error, later ones wait for a change.
            if let Ok(Err(e)) = tokio::time::timeout(Duration::from_secs(30), observer.next()).await
            {
                eprintln!("observer: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    loop {
        let bound = Duration::from_secs(30);
        if let Ok(Err(e)) = tokio::time::timeout(bound, reads.describe()).await {
            eprintln!("describe: {e}");
        }
        if reads.ledger().is_some() {
            if let Ok(Err(e)) = tokio::time::timeout(bound, reads.history()).await {
                eprintln!("history: {e}");
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `slow` role: takes the lock with an events stream it never reads, holds 0.3 to 3 s
/// writing every 200 ms while the guard says it holds, and learns of a loss from the guard.
async fn slow_contender(
    rep: &mut Reporter,
    make: &(dyn Fn() -> LockOptions + Send + Sync),
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    // Never read: every event of every acquisition piles up here.
    let (tx, _unread) = tokio::sync::mpsc::unbounded_channel();
    loop {
        rep.set_slot(None);
        rep.event(Kind::Waiting, None, None);
        let guard = match make().events(tx.clone()).acquire(None).await {
            Ok(g) => g,
            Err(e) => {
                eprintln!("acquire failed: {e}");
                rep.event(Kind::GaveUp, None, None);
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let token = guard.token().value();
        if permits() > 1 {
            rep.set_slot(Some(guard.permit()));
        }
        let mut lease = to_mono(guard.lease_end());
        rep.event(Kind::Acquired, Some(token), Some(lease));
        if guard.is_held() {
            rep.write(token);
        }
        let until = tokio::time::Instant::now() + rng.millis(300, 3000);
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        let lost = loop {
            tokio::select! {
                _ = guard.lost() => break Some(mono_ns()),
                _ = tick.tick() => {
                    if guard.is_held() {
                        // The guard's lease end, read as it writes: a lease end it reports is
                        // one it saw while holding, never a later one.
                        let end = to_mono(guard.lease_end());
                        if end > lease {
                            lease = end;
                            rep.event(Kind::Renewed, None, Some(lease));
                        }
                        rep.write(token);
                    }
                }
                _ = tokio::time::sleep_until(until) => {
                    break (!guard.is_held()).then(mono_ns);
                }
            }
        };
        // With neither the stream nor a watch, the last lease end it read while holding is the
        // one it knows (a renewal since its last write may have moved the real one later: the
        // hold is judged shorter, never longer, than it was).
        match lost {
            Some(at) => rep.event_at(Kind::Lost, at, None, Some(lease)),
            None => {
                rep.event(
                    Kind::Released,
                    None,
                    Some(to_mono(guard.lease_end()).max(lease)),
                );
                let _ = guard.release().await;
            }
        }
        tokio::time::sleep(rng.millis(0, 800)).await;
    }
}

/// The block the suite asked for in `path` (milliseconds), taken once: the file is removed.
/// The suite renames a whole file into place, so a partial number is never read.
fn stall_asked(path: Option<&std::path::Path>) -> Option<Duration> {
    let path = path?;
    let ms: u64 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
    std::fs::remove_file(path).ok()?;
    Some(Duration::from_millis(ms))
}

async fn contender(
    rep: &mut Reporter,
    broken: bool,
    make: &(dyn Fn() -> LockOptions + Send + Sync),
    seed: u64,
    permits: u16,
    stall: Option<&std::path::Path>,
) {
    let mut rng = Rng::new(seed);
    // A checkpoint is one per lock: none for a semaphore, nor without a ledger.
    let ckpts = checkpoints() && !broken && permits == 1 && make().ledger().is_some();
    loop {
        let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
        let opts = make().events(tx);
        rep.set_slot(None);
        rep.event(Kind::Waiting, None, None);
        let guard = match opts.acquire(None).await {
            Ok(g) => g,
            Err(e) => {
                eprintln!("acquire failed: {e}");
                rep.event(Kind::GaveUp, None, None);
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let mut token = guard.token().value();
        let mut lease = to_mono(guard.lease_end());
        if permits > 1 {
            rep.set_slot(Some(guard.permit()));
        }
        // The broken contender believes it holds until it says otherwise: no lease end.
        rep.event(Kind::Acquired, Some(token), (!broken).then_some(lease));
        let mut seq = 0;
        if ckpts && guard.is_held() {
            read_checkpoint(rep, &guard, token).await;
        }
        if broken || guard.is_held() {
            rep.write(token);
        }
        let hold_for = if broken {
            Duration::from_secs(20)
        } else {
            rng.millis(300, 3000)
        };
        let until = tokio::time::Instant::now() + hold_for;
        let mut tick = tokio::time::interval(Duration::from_millis(if broken { 20 } else { 200 }));
        let mut hold = guard.watch();
        let mut watching = true;
        let lost = loop {
            tokio::select! {
                // The writes stop here, so the hold ends here (or at the lease end, if earlier).
                _ = guard.lost(), if !broken => break Some(mono_ns()),
                more = hold.changed(), if watching => {
                    watching = more;
                    if let Some(end) = hold.lease_end() {
                        let end = to_mono(end);
                        if end > lease && !broken {
                            lease = end;
                            rep.event(Kind::Renewed, None, Some(lease));
                        }
                    }
                    let now = guard.token().value();
                    if now != token {
                        token = now;
                        rep.event(Kind::Token, Some(token), None);
                    }
                }
                _ = tick.tick() => {
                    if let Some(block) = stall_asked(stall) {
                        let before = to_mono(guard.lease_end());
                        // Blocking on purpose: the runtime's only thread, so neither the
                        // session's renewals nor the guard's own timer can run.
                        std::thread::sleep(block);
                        // Read before the guard is asked: a lease end before this instant
                        // means the answer had to be no.
                        let at = mono_ns();
                        let held = guard.is_held();
                        rep.event_at(Kind::Stalled, at, Some(i64::from(held)), Some(before));
                        if !held {
                            break Some(at);
                        }
                        rep.write(token);
                    } else if broken || guard.is_held() {
                        rep.write(token);
                        // Whatever the store said: a fenced-off holder's checkpoint must be
                        // refused by the broker.
                        if ckpts {
                            store_checkpoint(rep, &guard, token, &mut seq).await;
                        }
                    }
                }
                // After a pause both this and the loss can be ready at once, and select! picks
                // either: a hold whose lease ran out meanwhile was lost, not released.
                _ = tokio::time::sleep_until(until) => {
                    if broken || guard.is_held() {
                        // The last one just before the release: the next holder must read it.
                        if ckpts {
                            store_checkpoint(rep, &guard, token, &mut seq).await;
                            if !guard.is_held() {
                                break Some(mono_ns());
                            }
                        }
                        break None;
                    }
                    break Some(mono_ns());
                }
            }
        };
        if let Some(lost_at) = lost {
            // The library gives the lease end with the loss; the watch may have missed the last
            // renewal before the hold ended.
            let said = tokio::time::timeout(Duration::from_secs(2), async {
                while let Some(e) = events.recv().await {
                    if let LockEvent::Lost { lease_end, .. } = e {
                        return Some(to_mono(lease_end));
                    }
                }
                None
            })
            .await
            .ok()
            .flatten();
            rep.event_at(Kind::Lost, lost_at, None, Some(said.unwrap_or(lease)));
            drop(guard);
        } else {
            // Reported before the LeaveGroup: the hold ends here, where the writes stop, and
            // never after the lease end.
            let lease_end = (!broken).then(|| to_mono(guard.lease_end()));
            rep.event(Kind::Released, None, lease_end);
            let _ = guard.release().await;
        }
        tokio::time::sleep(rng.millis(0, 800)).await;
    }
}

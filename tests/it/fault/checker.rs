//! The checker: a fenced store every contender writes to while it holds the lock, the log of the
//! contenders' own events, and the analysis of both.
//!
//! **The store** keeps, per lock, the highest token it has accepted, and accepts a write only if
//! the writer's token is at least that. It records every write: writer, token, the writer's
//! CLOCK_MONOTONIC reading when it sent the write, the store's own reading when it decided, and
//! the decision. **The events** are what each contender says happened to it (waiting, acquired,
//! renewed with the new lease end, token changed, lost with the lease end, released, gave up),
//! stamped on CLOCK_MONOTONIC by the contender; the suite adds `killed` when it SIGKILLs one.
//! CLOCK_MONOTONIC is one clock for every process on the host (`Instant` on Linux, Java's
//! `System.nanoTime`), so every timestamp here compares directly.
//!
//! Processes reach the store over a line protocol on a loopback TCP port:
//! `E <lock> <id> <kind> <mono_ns> <token|-> <lease_end_ns|->` (no answer) and
//! `W <lock> <id> <token> <sent_ns>` (answered `A`, or `R <highest>`); contenders inside the test
//! process call [`Checker::event`] and [`Checker::write`] directly.
//!
//! **The analysis** ([`analyse`]) turns each contender's events into hold intervals: from its
//! `acquired` to the earlier of its loss or release report and the lease end that report
//! carries, or, for a holder that never reports again (killed, or still holding when the run
//! ends), the last lease end it reported. A contender that says nothing about a lease (the
//! CLI's events carry none until a loss) is held to its kill or the run's end. Then:
//! - **overlaps**: two holds of different contenders on one lock that intersect. A Java seed
//!   client has no lease, so an overlap counts against kafka-lock only when the hold that began
//!   first is kafka-lock's (its lease must end before anyone else can be given the lock);
//!   the others are reported as not judged;
//! - **stale writes accepted**: an accepted write whose token is lower than that of a hold by
//!   another contender that had already begun when the store decided: the store let an old
//!   holder through after a newer one was named;
//! - **writes rejected**: fenced off by the store (expected from holders that were cut off);
//! - **late writes**: sent while the writer was not holding by its own account (a figure, not a
//!   failure: the fence exists for exactly these);
//! - **token inversions**: a kafka-lock hold whose token is not greater than that of a hold of
//!   the same lock (or permit slot) that had ended before it began: tokens must increase from
//!   one holder to the next, whatever the faults;
//! - **acquisitions**, and the **longest time the lock was free while someone waited**.
//!
//! **Checkpoint continuity** ([`checkpoint_continuity`], when the contenders store and read
//! checkpoints): a new holder's read at its grant is never older than a checkpoint of an
//! earlier hold reported stored before that grant, and no checkpoint is reported stored after
//! the store fenced its holder's token off.
//!
//! **Semaphore mode** (a lock with N permits, `KAFKA_LOCK_FAULT_PERMITS`): a holder reports its
//! acquisition and writes under the key `<lock>#<slot>`, so the store fences each permit slot
//! on its own and the overlap and stale-write checks above apply per slot; on top, the holds of
//! all slots of the lock must never number more than N at once (**too many holders**).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use crate::support::mono_ns;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Waiting,
    Acquired,
    Renewed,
    Token,
    Lost,
    Released,
    GaveUp,
    Killed,
    /// A `stall` contender's runtime thread was blocked while it held: at this instant it
    /// asked `is_held()`, and the token field carries the answer (1 held, 0 not), the lease
    /// end field the lease end it read before the block. Not part of a hold's history.
    Stalled,
    /// Checkpoint continuity (`--checkpoints`): what a holder read as the lock's last
    /// checkpoint right after its grant. The token field carries the checkpoint read as
    /// [`ckpt_number`] (-1: none), the lease end field the reader's own token.
    CkRead,
    /// A holder is about to store checkpoint [`ckpt_number`] (in the token field); for the
    /// CLI, the job wrote it to its checkpoint file, which kafka-lock stores after it exits.
    CkSent,
    /// The checkpoint in the token field was reported stored (the library's `Ok`, or the
    /// CLI's `checkpoint` event, which names no value: it is the one the job last wrote);
    /// the lease end field carries the instant it was sent, when known.
    CkAcked,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Waiting => "waiting",
            Kind::Acquired => "acquired",
            Kind::Renewed => "renewed",
            Kind::Token => "token",
            Kind::Lost => "lost",
            Kind::Released => "released",
            Kind::GaveUp => "gaveup",
            Kind::Killed => "killed",
            Kind::Stalled => "stalled",
            Kind::CkRead => "ckread",
            Kind::CkSent => "cksent",
            Kind::CkAcked => "ckacked",
        }
    }

    /// Whether the event begins or ends a hold or a wait (the others happen within one).
    pub fn ends_or_begins(self) -> bool {
        !matches!(
            self,
            Kind::Renewed
                | Kind::Token
                | Kind::Stalled
                | Kind::CkRead
                | Kind::CkSent
                | Kind::CkAcked
        )
    }

    fn parse(s: &str) -> Option<Kind> {
        [
            Kind::Waiting,
            Kind::Acquired,
            Kind::Renewed,
            Kind::Token,
            Kind::Lost,
            Kind::Released,
            Kind::GaveUp,
            Kind::Killed,
            Kind::Stalled,
            Kind::CkRead,
            Kind::CkSent,
            Kind::CkAcked,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub lock: String,
    pub id: String,
    pub kind: Kind,
    pub mono: i64,
    pub token: Option<i64>,
    pub lease_end: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct WriteRec {
    pub lock: String,
    pub id: String,
    pub token: i64,
    pub sent: i64,
    pub decided: i64,
    pub accepted: bool,
}

#[derive(Debug, Default)]
pub struct Log {
    pub events: Vec<Event>,
    pub writes: Vec<WriteRec>,
    highest: HashMap<String, i64>,
}

impl Log {
    /// The fenced write: accepted only if `token` is at least the highest accepted so far.
    fn write(&mut self, lock: &str, id: &str, token: i64, sent: i64) -> Result<(), i64> {
        let highest = self.highest.get(lock).copied();
        let accepted = highest.is_none_or(|h| token >= h);
        if accepted {
            self.highest.insert(lock.to_owned(), token);
        }
        self.writes.push(WriteRec {
            lock: lock.to_owned(),
            id: id.to_owned(),
            token,
            sent,
            decided: mono_ns(),
            accepted,
        });
        if accepted {
            Ok(())
        } else {
            Err(highest.unwrap_or(token))
        }
    }
}

/// The lock of a store key: `<lock>#<slot>` in semaphore mode, else the lock itself.
pub fn base(key: &str) -> &str {
    key.split_once('#').map_or(key, |(lock, _)| lock)
}

/// The store key of a holder of `lock` in permit slot `slot` (None: a mutex).
pub fn key(lock: &str, slot: Option<u16>) -> String {
    match slot {
        Some(s) => format!("{lock}#{s}"),
        None => lock.to_owned(),
    }
}

/// Ids of contenders whose holds are not judged for overlaps (they have no lease).
pub fn judged(id: &str) -> bool {
    !id.starts_with("java")
}

/// The store and event log, with a loopback port for other processes.
pub struct Checker {
    log: Arc<Mutex<Log>>,
    addr: SocketAddr,
}

impl Checker {
    /// Starts serving on a free loopback port (a thread per connection: a handful of contender
    /// processes, each with one connection).
    pub fn start() -> Checker {
        let listener = TcpListener::bind("127.0.0.1:0")
            .unwrap_or_else(|e| panic!("checker cannot bind a loopback port: {e}"));
        let addr = listener.local_addr().expect("bound");
        let log: Arc<Mutex<Log>> = Arc::default();
        let shared = log.clone();
        // Detached: it only ever blocks in accept, and goes with the test process.
        std::thread::Builder::new()
            .name("fault-checker".into())
            .spawn(move || {
                for stream in listener.incoming().map_while(Result::ok) {
                    let log = shared.clone();
                    let _ = std::thread::Builder::new()
                        .name("fault-checker-conn".into())
                        .spawn(move || serve(stream, &log));
                }
            })
            .expect("checker thread");
        Checker { log, addr }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn event(&self, e: Event) {
        self.lock().events.push(e);
    }

    pub fn write(&self, lock: &str, id: &str, token: i64, sent: i64) -> Result<(), i64> {
        self.lock().write(lock, id, token, sent)
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Acquisitions on `lock` after `since`, by contenders `pick` accepts.
    pub fn acquired_since(&self, lock: &str, since: i64, pick: impl Fn(&str) -> bool) -> usize {
        self.lock()
            .events
            .iter()
            .filter(|e| {
                base(&e.lock) == lock && e.kind == Kind::Acquired && e.mono > since && pick(&e.id)
            })
            .count()
    }

    /// The contenders that hold `lock` by their own latest report, latest acquisition first.
    pub fn holders(&self, lock: &str) -> Vec<String> {
        let log = self.lock();
        let mut last: HashMap<&str, &Event> = HashMap::new();
        for e in log.events.iter().filter(|e| base(&e.lock) == lock) {
            if !e.kind.ends_or_begins() {
                continue;
            }
            match last.get(e.id.as_str()) {
                Some(prev) if prev.mono > e.mono => {}
                _ => {
                    last.insert(&e.id, e);
                }
            }
        }
        let mut held: Vec<&Event> = last
            .into_values()
            .filter(|e| e.kind == Kind::Acquired)
            .collect();
        held.sort_by_key(|e| std::cmp::Reverse(e.mono));
        held.into_iter().map(|e| e.id.clone()).collect()
    }
}

fn serve(stream: TcpStream, log: &Mutex<Log>) {
    let _ = stream.set_nodelay(true);
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    for line in BufReader::new(stream).lines().map_while(Result::ok) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |s: &str| s.parse::<i64>().ok();
        match f.as_slice() {
            ["E", lock, id, kind, mono, token, lease] => {
                let (Some(kind), Some(mono)) = (Kind::parse(kind), num(mono)) else {
                    continue;
                };
                log.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .events
                    .push(Event {
                        lock: (*lock).to_owned(),
                        id: (*id).to_owned(),
                        kind,
                        mono,
                        token: num(token),
                        lease_end: num(lease),
                    });
            }
            ["W", lock, id, token, sent] => {
                let (Some(token), Some(sent)) = (num(token), num(sent)) else {
                    continue;
                };
                let answer = match log
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .write(lock, id, token, sent)
                {
                    Ok(()) => "A\n".to_owned(),
                    Err(h) => format!("R {h}\n"),
                };
                if out.write_all(answer.as_bytes()).is_err() {
                    return;
                }
            }
            _ => {}
        }
    }
}

/// A client of the checker's port, for contender processes.
pub struct Reporter {
    out: TcpStream,
    answers: BufReader<TcpStream>,
    lock: String,
    id: String,
    /// The permit slot held, in semaphore mode: events and writes go under its key.
    slot: Option<u16>,
}

impl Reporter {
    pub fn connect(addr: &str, lock: &str, id: &str) -> std::io::Result<Reporter> {
        let out = TcpStream::connect(addr)?;
        out.set_nodelay(true)?;
        let answers = BufReader::new(out.try_clone()?);
        Ok(Reporter {
            out,
            answers,
            lock: lock.to_owned(),
            id: id.to_owned(),
            slot: None,
        })
    }

    /// Semaphore mode: from now on, events and writes are about permit slot `slot`.
    pub fn set_slot(&mut self, slot: Option<u16>) {
        self.slot = slot;
    }

    pub fn event(&mut self, kind: Kind, token: Option<i64>, lease_end: Option<i64>) {
        self.event_at(kind, mono_ns(), token, lease_end);
    }

    /// An event that happened at `mono`, reported now.
    pub fn event_at(&mut self, kind: Kind, mono: i64, token: Option<i64>, lease_end: Option<i64>) {
        let opt = |v: Option<i64>| v.map_or("-".to_owned(), |v| v.to_string());
        let line = format!(
            "E {} {} {} {} {} {}\n",
            key(&self.lock, self.slot),
            self.id,
            kind.name(),
            mono,
            opt(token),
            opt(lease_end)
        );
        // The checker is the test process; if it is gone, so is the point of going on.
        if self.out.write_all(line.as_bytes()).is_err() {
            std::process::exit(70);
        }
    }

    /// A fenced write; true if the store accepted it.
    pub fn write(&mut self, token: i64) -> bool {
        let line = format!(
            "W {} {} {token} {}\n",
            key(&self.lock, self.slot),
            self.id,
            mono_ns()
        );
        let mut answer = String::new();
        if self.out.write_all(line.as_bytes()).is_err()
            || self.answers.read_line(&mut answer).unwrap_or(0) == 0
        {
            std::process::exit(70);
        }
        answer.starts_with('A')
    }
}

/// One hold, as the analysis reconstructs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Hold {
    pub lock: String,
    pub id: String,
    pub token: i64,
    pub start: i64,
    pub end: i64,
    pub how: &'static str,
}

/// Two holds that intersect; `first` began first.
#[derive(Debug, Clone, PartialEq)]
pub struct Overlap {
    pub first: Hold,
    pub second: Hold,
    pub judged: bool,
}

impl Overlap {
    pub fn start(&self) -> i64 {
        self.second.start
    }

    pub fn length_ns(&self) -> i64 {
        self.first.end.min(self.second.end) - self.second.start
    }
}

#[derive(Debug, Default)]
pub struct Analysis {
    pub holds: Vec<Hold>,
    pub overlaps: Vec<Overlap>,
    pub stale_accepted: Vec<(WriteRec, Hold)>,
    pub rejected: Vec<WriteRec>,
    pub late: Vec<WriteRec>,
    pub accepted: usize,
    /// Maximal spans in which the lock had no holder and someone waited, per lock.
    pub free_waiting: Vec<(String, i64, i64)>,
    /// Semaphore mode: the most holds at once, per lock with permits.
    pub most_at_once: Vec<(String, u16, usize)>,
    /// Semaphore mode: instants at which more holds than permits were open: (lock, at, count).
    pub too_many: Vec<(String, i64, usize)>,
    /// Holds (the second) whose token is not above that of a hold of the same key (the first)
    /// that had ended before they began.
    pub inversions: Vec<(Hold, Hold)>,
    /// `lost` or `released` reports of kafka-lock contenders that held nothing then (a second
    /// end of one hold, or an end with no acquisition): the contender's account of its holds
    /// is wrong, and a user reading those events would believe so too.
    pub unmatched_ends: Vec<Event>,
    /// Checkpoint continuity ([`checkpoint_continuity`]).
    pub checkpoints: Continuity,
}

impl Analysis {
    pub fn judged_overlaps(&self) -> impl Iterator<Item = &Overlap> {
        self.overlaps.iter().filter(|o| o.judged)
    }

    /// Whether the run broke a safety property.
    pub fn unsafe_(&self) -> bool {
        self.judged_overlaps().next().is_some()
            || !self.stale_accepted.is_empty()
            || !self.too_many.is_empty()
            || !self.inversions.is_empty()
            || !self.checkpoints.violations.is_empty()
    }

    /// The first few end reports with no open hold, for a failure message.
    pub fn unmatched(&self, max: usize) -> String {
        let mut s = String::new();
        for e in self.unmatched_ends.iter().take(max) {
            let _ = writeln!(
                s,
                "END WITH NO OPEN HOLD on {}: {} reported {} at {} (lease end {:?})",
                e.lock,
                e.id,
                e.kind.name(),
                e.mono,
                e.lease_end
            );
        }
        s
    }

    /// The first few violations, for a failure message.
    pub fn violations(&self, max: usize) -> String {
        let mut s = String::new();
        for o in self.judged_overlaps().take(max) {
            let _ = writeln!(
                s,
                "OVERLAP {:.3} s on {}: {} token {} [{}, {}] ({}) and {} token {} [{}, {}] ({})",
                o.length_ns() as f64 / 1e9,
                o.first.lock,
                o.first.id,
                o.first.token,
                o.first.start,
                o.first.end,
                o.first.how,
                o.second.id,
                o.second.token,
                o.second.start,
                o.second.end,
                o.second.how
            );
        }
        for (a, b) in self.inversions.iter().take(max) {
            let _ = writeln!(
                s,
                "TOKEN INVERSION on {}: {} began holding token {} at {}, after {} held token {} \
                 until {}",
                b.lock, b.id, b.token, b.start, a.id, a.token, a.end
            );
        }
        for v in self.checkpoints.violations.iter().take(max) {
            let _ = writeln!(s, "{v}");
        }
        for (lock, at, n) in self.too_many.iter().take(max) {
            let _ = writeln!(s, "TOO MANY HOLDERS on {lock}: {n} at once at {at}");
        }
        for (w, h) in self.stale_accepted.iter().take(max) {
            let _ = writeln!(
                s,
                "STALE WRITE ACCEPTED on {}: {} token {} sent {} decided {}, after {} began holding \
                 token {} at {}",
                w.lock, w.id, w.token, w.sent, w.decided, h.id, h.token, h.start
            );
        }
        s
    }
}

/// Reconstructs the holds and checks them and the writes; `end` closes what is still open.
pub fn analyse(events: &[Event], writes: &[WriteRec], end: i64) -> Analysis {
    analyse_permits(events, writes, end, &HashMap::new())
}

/// [`analyse`] with the permits of the locks that are semaphores (the others are mutexes).
pub fn analyse_permits(
    events: &[Event],
    writes: &[WriteRec],
    end: i64,
    permits: &HashMap<String, u16>,
) -> Analysis {
    let mut by_id: HashMap<(&str, &str), Vec<&Event>> = HashMap::new();
    for e in events {
        by_id.entry((base(&e.lock), &e.id)).or_default().push(e);
    }
    let mut holds = Vec::new();
    let mut waits: Vec<(String, i64, i64)> = Vec::new();
    let mut unmatched_ends = Vec::new();
    for ((lock, id), mut evs) in by_id {
        // One contender's events are sent in order, but the suite's own `killed` may arrive
        // after the last words of the process it killed.
        evs.sort_by_key(|e| e.mono);
        let mut open: Option<(i64, i64, i64, Option<i64>)> = None; // start, first token, last token, lease end
        let mut waiting: Option<i64> = None;
        // The store key of the open hold: its acquisition's.
        let mut held_key = lock.to_owned();
        let close =
            |holds: &mut Vec<Hold>, o: (i64, i64, i64, Option<i64>), at: i64, how, key: &str| {
                holds.push(Hold {
                    lock: key.to_owned(),
                    id: id.to_owned(),
                    token: o.1,
                    start: o.0,
                    end: at.max(o.0),
                    how,
                });
            };
        for e in evs {
            match e.kind {
                Kind::Waiting => {
                    waiting.get_or_insert(e.mono);
                }
                Kind::Acquired => {
                    if let Some(w) = waiting.take() {
                        waits.push((lock.to_owned(), w, e.mono));
                    }
                    if let Some(o) = open.take() {
                        // A second acquisition without a word in between: the first hold ended
                        // by the time the second began, at the latest.
                        let at = o.3.map_or(e.mono, |l| l.min(e.mono));
                        close(&mut holds, o, at, "superseded", &held_key);
                    }
                    let t = e.token.unwrap_or(-1);
                    open = Some((e.mono, t, t, e.lease_end));
                    held_key = e.lock.clone();
                }
                Kind::Renewed => {
                    if let (Some(o), Some(l)) = (open.as_mut(), e.lease_end) {
                        o.3 = Some(o.3.map_or(l, |p| p.max(l)));
                    }
                }
                Kind::Token => {
                    if let (Some(o), Some(t)) = (open.as_mut(), e.token) {
                        o.2 = t;
                    }
                }
                Kind::Lost | Kind::Released => {
                    let how = if e.kind == Kind::Lost {
                        "lost"
                    } else {
                        "released"
                    };
                    match open.take() {
                        Some(o) => {
                            let at = e.lease_end.map_or(e.mono, |l| l.min(e.mono));
                            close(&mut holds, o, at, how, &held_key);
                        }
                        // The Java seed client's events come from its rebalance listener, which
                        // revokes what it may never have been assigned.
                        None if judged(id) => unmatched_ends.push(e.clone()),
                        None => {}
                    }
                }
                Kind::GaveUp => {
                    if let Some(w) = waiting.take() {
                        waits.push((lock.to_owned(), w, e.mono));
                    }
                }
                // Judged by the runtime-stall nemesis itself; the hold ends with the loss the
                // contender reports next.
                Kind::Stalled => {}
                // Judged on their own ([`checkpoint_continuity`]).
                Kind::CkRead | Kind::CkSent | Kind::CkAcked => {}
                Kind::Killed => {
                    if let Some(o) = open.take() {
                        let at = o.3.map_or(e.mono, |l| l.min(e.mono));
                        close(&mut holds, o, at, "killed", &held_key);
                    }
                    if let Some(w) = waiting.take() {
                        waits.push((lock.to_owned(), w, e.mono));
                    }
                }
            }
        }
        if let Some(o) = open.take() {
            let at = o.3.map_or(end, |l| l.min(end));
            close(&mut holds, o, at, "open at the end", &held_key);
        }
        if let Some(w) = waiting.take() {
            waits.push((lock.to_owned(), w, end));
        }
    }
    holds.sort_by(|a, b| (a.start, &a.id).cmp(&(b.start, &b.id)));

    let mut overlaps = Vec::new();
    for (i, a) in holds.iter().enumerate() {
        for b in &holds[i + 1..] {
            if b.start >= a.end {
                // Sorted by start: every later hold begins after `a` ended too.
                break;
            }
            if b.lock != a.lock || b.id == a.id || b.start >= a.end.min(b.end) {
                continue;
            }
            overlaps.push(Overlap {
                first: a.clone(),
                second: b.clone(),
                judged: judged(&a.id),
            });
        }
    }

    let inversions = token_inversions(&holds);
    unmatched_ends.sort_by_key(|e| e.mono);
    let mut analysis = Analysis {
        holds,
        overlaps,
        inversions,
        unmatched_ends,
        checkpoints: checkpoint_continuity(events, writes),
        ..Analysis::default()
    };
    for w in writes {
        if !w.accepted {
            analysis.rejected.push(w.clone());
        } else {
            analysis.accepted += 1;
            if let Some(h) = analysis.holds.iter().find(|h| {
                h.lock == w.lock && h.id != w.id && h.token > w.token && h.start <= w.decided
            }) {
                analysis.stale_accepted.push((w.clone(), h.clone()));
            }
        }
        let own = analysis
            .holds
            .iter()
            .any(|h| h.lock == w.lock && h.id == w.id && h.start <= w.sent && w.sent <= h.end);
        if !own {
            analysis.late.push(w.clone());
        }
    }
    analysis.free_waiting = free_while_waiting(&analysis.holds, &waits);
    let mut limits: Vec<(&String, &u16)> = permits.iter().collect();
    limits.sort();
    for (lock, &n) in limits {
        let mut points: Vec<(i64, i32)> = Vec::new();
        for h in analysis
            .holds
            .iter()
            .filter(|h| base(&h.lock) == lock && judged(&h.id) && h.end > h.start)
        {
            points.push((h.start, 1));
            points.push((h.end, -1));
        }
        // Ends before starts at the same instant: a hand-over is not an overlap.
        points.sort();
        let (mut now, mut most) = (0usize, 0usize);
        for (t, d) in points {
            now = now.saturating_add_signed(d as isize);
            most = most.max(now);
            if now > usize::from(n) {
                analysis.too_many.push((lock.clone(), t, now));
            }
        }
        analysis.most_at_once.push((lock.clone(), n, most));
    }
    analysis
}

/// The checkpoint a holder with token `token` stores as its `seq`-th: one number, so that
/// checkpoints compare in the order they were meant to be stored (a later hold's above an
/// earlier hold's, and within a hold in order). The value stored is its decimal text.
pub fn ckpt_number(token: i64, seq: i64) -> i64 {
    token * CKPT_PER_HOLD + seq.min(CKPT_PER_HOLD - 1)
}

/// More than a hold of at most a few seconds stores, one every 200 ms.
const CKPT_PER_HOLD: i64 = 1000;

/// What [`checkpoint_continuity`] found.
#[derive(Debug, Default)]
pub struct Continuity {
    /// Checkpoints read at a grant, and how many of them had an earlier checkpoint to find.
    pub reads: usize,
    pub reads_bound: usize,
    /// Checkpoints reported stored.
    pub acked: usize,
    /// Reads older than a checkpoint reported stored before the grant, reads of checkpoints
    /// nobody stored before, and checkpoints reported stored after the store had fenced their
    /// holder's token off.
    pub violations: Vec<String>,
}

/// Checkpoint continuity, per lock: every checkpoint a holder read right after its grant
/// (`ckread`) is at least the newest checkpoint of an earlier hold (a lower token) reported
/// stored (`ckacked`) before that grant, and one some earlier hold sent; and no checkpoint is
/// reported stored whose holder's write with that token the store had fenced off before it was
/// sent (the broker's generation check must refuse it: a higher token was already written, so
/// a newer hold had begun and the group's generation had moved).
///
/// Why a checkpoint reported stored before the grant must be read: it was accepted by the
/// coordinator under its hold's generation, so before the generation moved to the reader's
/// (Apache validates an OffsetCommit's generation and appends it to the group's offsets
/// partition in one write, and runs one partition's writes in order), and the reader's read
/// starts after its SyncGroup answer, which leaves only once the new generation's write is
/// committed (docs/design.md, "Checkpoint").
pub fn checkpoint_continuity(events: &[Event], writes: &[WriteRec]) -> Continuity {
    let mut out = Continuity::default();
    let mut by_id: HashMap<(&str, &str), Vec<&Event>> = HashMap::new();
    for e in events {
        by_id.entry((base(&e.lock), &e.id)).or_default().push(e);
    }
    // (lock, id, number, acked at, sent at); (lock, id, number read, grant, reader's token).
    let mut acks: Vec<(&str, &str, i64, i64, Option<i64>)> = Vec::new();
    let mut reads: Vec<(&str, &str, i64, i64, i64)> = Vec::new();
    let mut sent: std::collections::HashSet<(&str, i64)> = Default::default();
    for ((lock, id), mut evs) in by_id {
        evs.sort_by_key(|e| e.mono);
        let (mut last_sent, mut granted) = (None, None);
        for e in evs {
            match e.kind {
                Kind::Acquired => granted = Some(e.mono),
                Kind::CkSent => {
                    last_sent = e.token;
                    if let Some(c) = e.token {
                        sent.insert((lock, c));
                    }
                }
                Kind::CkAcked => {
                    // The CLI's acknowledgement names no value: the job's last one.
                    if let Some(c) = e.token.or(last_sent) {
                        acks.push((lock, id, c, e.mono, e.lease_end));
                    }
                }
                Kind::CkRead => {
                    if let (Some(c), Some(t), Some(g)) = (e.token, e.lease_end, granted) {
                        reads.push((lock, id, c, g, t));
                    }
                }
                _ => {}
            }
        }
    }
    acks.sort_by_key(|a| a.3);
    out.acked = acks.len();
    for &(lock, id, c, at, t) in &reads {
        out.reads += 1;
        let newest = acks
            .iter()
            .filter(|a| a.0 == lock && a.3 < at && a.2 / CKPT_PER_HOLD < t)
            .max_by_key(|a| a.2);
        if let Some(&(_, by, need, acked, _)) = newest {
            out.reads_bound += 1;
            if c < need {
                out.violations.push(format!(
                    "STALE CHECKPOINT READ on {lock}: {id} (token {t}) granted at {at} read {}, \
                     but {by} had checkpoint {need} reported stored at {acked}",
                    if c < 0 {
                        "none".to_owned()
                    } else {
                        c.to_string()
                    }
                ));
            }
        }
        if c >= 0 && (c / CKPT_PER_HOLD >= t || !sent.contains(&(lock, c))) {
            out.violations.push(format!(
                "CHECKPOINT READ THAT NO EARLIER HOLD STORED on {lock}: {id} (token {t}) granted \
                 at {at} read {c}"
            ));
        }
    }
    for &(lock, id, c, acked, sent_at) in &acks {
        let token = c / CKPT_PER_HOLD;
        let before = sent_at.unwrap_or(acked);
        if let Some(w) = writes.iter().find(|w| {
            base(&w.lock) == lock
                && w.id == id
                && w.token == token
                && !w.accepted
                && w.decided < before
        }) {
            out.violations.push(format!(
                "FENCED CHECKPOINT STORED on {lock}: {id} had checkpoint {c} reported stored at \
                 {acked} (sent {before}), after the store fenced off its token {token} at {}",
                w.decided
            ));
        }
    }
    out
}

/// Per store key (a lock, or a semaphore's permit slot): every kafka-lock hold whose token is
/// not greater than the token of a hold that ended before it began. Holds that report no token
/// are not compared.
fn token_inversions(holds: &[Hold]) -> Vec<(Hold, Hold)> {
    let mut out = Vec::new();
    for b in holds.iter().filter(|b| judged(&b.id) && b.token >= 0) {
        if let Some(a) = holds
            .iter()
            .filter(|a| a.lock == b.lock && a.token >= 0 && a.end <= b.start && a != &b)
            .find(|a| a.token >= b.token)
        {
            out.push((a.clone(), b.clone()));
        }
    }
    out
}

/// Maximal spans, per lock, in which no hold was open and at least one wait was.
fn free_while_waiting(holds: &[Hold], waits: &[(String, i64, i64)]) -> Vec<(String, i64, i64)> {
    let mut locks: Vec<&str> = waits.iter().map(|w| w.0.as_str()).collect();
    locks.sort_unstable();
    locks.dedup();
    let mut out = Vec::new();
    for lock in locks {
        // (time, holders delta, waiters delta); ends sort before starts at the same instant.
        let mut points: Vec<(i64, i32, i32)> = Vec::new();
        for h in holds
            .iter()
            .filter(|h| base(&h.lock) == lock && h.end > h.start)
        {
            points.push((h.start, 1, 0));
            points.push((h.end, -1, 0));
        }
        for w in waits.iter().filter(|w| w.0 == lock && w.2 > w.1) {
            points.push((w.1, 0, 1));
            points.push((w.2, 0, -1));
        }
        points.sort_by_key(|p| (p.0, p.1 + p.2));
        let (mut holders, mut waiters) = (0, 0);
        let mut since: Option<i64> = None;
        for (t, dh, dw) in points {
            holders += dh;
            waiters += dw;
            let free = holders == 0 && waiters > 0;
            match (free, since) {
                (true, None) => since = Some(t),
                (false, Some(s)) => {
                    if t > s {
                        out.push((lock.to_owned(), s, t));
                    }
                    since = None;
                }
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(id: &str, kind: Kind, mono: i64, token: Option<i64>, lease: Option<i64>) -> Event {
        Event {
            lock: "L".into(),
            id: id.into(),
            kind,
            mono,
            token,
            lease_end: lease,
        }
    }

    fn wr(id: &str, token: i64, at: i64, accepted: bool) -> WriteRec {
        WriteRec {
            lock: "L".into(),
            id: id.into(),
            token,
            sent: at,
            decided: at,
            accepted,
        }
    }

    /// A hand-over done right: A loses at its lease end, B acquires later with a higher token;
    /// A's writes before the loss are accepted, its late one is fenced off.
    #[test]
    fn a_clean_handover_passes() {
        let events = [
            ev("a", Kind::Waiting, 0, None, None),
            ev("a", Kind::Acquired, 10, Some(1), Some(60)),
            ev("b", Kind::Waiting, 20, None, None),
            ev("a", Kind::Renewed, 40, None, Some(90)),
            ev("a", Kind::Lost, 120, None, Some(90)),
            ev("b", Kind::Acquired, 100, Some(2), Some(150)),
            ev("b", Kind::Released, 130, None, None),
        ];
        let writes = [
            wr("a", 1, 15, true),
            wr("b", 2, 101, true),
            wr("a", 1, 115, false),
        ];
        let a = analyse(&events, &writes, 200);
        assert!(!a.unsafe_(), "{}", a.violations(5));
        assert_eq!(a.holds.len(), 2);
        assert_eq!((a.holds[0].start, a.holds[0].end), (10, 90));
        assert_eq!(a.rejected.len(), 1);
        assert_eq!(a.late.len(), 1);
        // Free while A waited for the first hold, and from A's lease end (90) to B's
        // acquisition (100) while B waited; after B's release nobody waited.
        assert_eq!(
            a.free_waiting,
            vec![("L".to_owned(), 0, 10), ("L".to_owned(), 90, 100)]
        );
    }

    /// A hold reported lost twice (a command that could not run under a hold lost meanwhile),
    /// or released after its loss, or ended with no acquisition at all: each end with no open
    /// hold is flagged; a clean hold, and the Java client's revocations, are not.
    #[test]
    fn an_end_report_with_no_open_hold_is_flagged() {
        let events = [
            ev("a", Kind::Acquired, 10, Some(1), Some(60)),
            ev("a", Kind::Lost, 50, None, Some(45)),
            ev("a", Kind::Lost, 52, None, Some(45)),
            ev("b", Kind::Acquired, 70, Some(2), Some(120)),
            ev("b", Kind::Lost, 90, None, Some(90)),
            ev("b", Kind::Released, 91, None, Some(90)),
            ev("c", Kind::Released, 95, None, None),
            ev("d", Kind::Acquired, 100, Some(3), Some(150)),
            ev("d", Kind::Released, 110, None, Some(110)),
            ev("java1", Kind::Released, 120, None, None),
        ];
        let a = analyse(&events, &[], 200);
        let flagged: Vec<(&str, Kind, i64)> = a
            .unmatched_ends
            .iter()
            .map(|e| (e.id.as_str(), e.kind, e.mono))
            .collect();
        assert_eq!(
            flagged,
            vec![
                ("a", Kind::Lost, 52),
                ("b", Kind::Released, 91),
                ("c", Kind::Released, 95)
            ],
            "{}",
            a.unmatched(10)
        );
        assert!(!a.unsafe_(), "not a safety violation: {}", a.violations(5));
        assert_eq!(a.holds.len(), 3, "one hold each for a, b and d");
    }

    /// A contender that ignores its loss and keeps writing is caught twice: its hold overlaps
    /// the next holder's, and a write that lands before the next holder's first write is a
    /// stale write the store let through.
    #[test]
    fn a_holder_that_ignores_its_loss_is_caught() {
        let events = [
            ev("a", Kind::Acquired, 10, Some(1), None),
            ev("b", Kind::Acquired, 100, Some(2), Some(150)),
            ev("a", Kind::Released, 300, None, None),
            ev("b", Kind::Lost, 400, None, Some(150)),
        ];
        let writes = [
            wr("a", 1, 15, true),
            wr("a", 1, 105, true),
            wr("b", 2, 110, true),
            wr("a", 1, 120, false),
        ];
        let a = analyse(&events, &writes, 500);
        assert!(a.unsafe_());
        assert_eq!(a.judged_overlaps().count(), 1);
        assert_eq!(a.stale_accepted.len(), 1);
        assert_eq!(a.stale_accepted[0].0.sent, 105);
        assert_eq!(a.rejected.len(), 1);
    }

    /// A killed holder's hold ends at its last known lease end, not at the kill: it may have
    /// been killed long after it was cut off.
    #[test]
    fn a_killed_holder_holds_until_its_last_lease_end() {
        let events = [
            ev("a", Kind::Acquired, 10, Some(1), Some(50)),
            ev("a", Kind::Renewed, 30, None, Some(70)),
            ev("a", Kind::Killed, 200, None, None),
            ev("b", Kind::Acquired, 80, Some(2), None),
        ];
        let a = analyse(&events, &[], 300);
        assert!(!a.unsafe_(), "{}", a.violations(5));
        let early = [ev("b", Kind::Acquired, 60, Some(2), None)];
        let a = analyse(&[&events[..3], &early[..]].concat(), &[], 300);
        assert_eq!(a.judged_overlaps().count(), 1);
    }

    /// A release reported late (the contender was paused past its lease) ends the hold at the
    /// lease end the report carries, not at the report: the first long run flagged 20 overlaps
    /// that were such late reports, not late holds.
    #[test]
    fn a_late_release_report_ends_at_its_lease_end() {
        let events = [
            ev("a", Kind::Acquired, 10, Some(1), Some(50)),
            ev("b", Kind::Acquired, 60, Some(2), Some(110)),
            ev("a", Kind::Released, 90, None, Some(50)),
        ];
        let a = analyse(&events, &[], 200);
        assert!(!a.unsafe_(), "{}", a.violations(5));
        assert_eq!(a.holds[0].end, 50);
    }

    /// The Java seed client has no lease: when it holds first and kafka-lock acquires while it
    /// still believes it holds, that is the seed client's failing, not kafka-lock's. The other
    /// way round counts.
    #[test]
    fn only_overlaps_that_kafka_lock_began_first_are_judged() {
        let java_first = [
            ev("java1", Kind::Acquired, 10, Some(1), None),
            ev("lib1", Kind::Acquired, 50, Some(2), Some(90)),
            ev("java1", Kind::Lost, 70, None, None),
        ];
        let a = analyse(&java_first, &[], 100);
        assert_eq!(a.overlaps.len(), 1);
        assert!(!a.unsafe_());
        let lock_first = [
            ev("lib1", Kind::Acquired, 10, Some(1), Some(90)),
            ev("java1", Kind::Acquired, 50, Some(2), None),
        ];
        assert!(analyse(&lock_first, &[], 100).unsafe_());
    }

    /// Tokens must go up from one hold to the next of the same key: a later hold with a lower
    /// (or equal) token is an inversion, even without an overlap; another slot's lower token is
    /// not.
    #[test]
    fn a_later_hold_with_a_lower_token_is_an_inversion() {
        let at = |id: &str, slot: u16, kind, mono, token| Event {
            lock: key("L", Some(slot)),
            ..ev(id, kind, mono, token, None)
        };
        let fine = [
            at("a", 0, Kind::Acquired, 10, Some(50)),
            at("b", 1, Kind::Acquired, 20, Some(51)),
            at("a", 0, Kind::Released, 30, None),
            at("c", 0, Kind::Acquired, 40, Some(52)),
            at("b", 1, Kind::Released, 45, None),
            at("d", 1, Kind::Acquired, 60, Some(53)),
        ];
        let a = analyse(&fine, &[], 100);
        assert!(a.inversions.is_empty(), "{}", a.violations(5));
        let inverted = [
            at("a", 0, Kind::Acquired, 10, Some(50)),
            at("a", 0, Kind::Released, 30, None),
            at("c", 0, Kind::Acquired, 40, Some(49)),
        ];
        let a = analyse(&inverted, &[], 100);
        assert!(a.unsafe_());
        assert_eq!(a.inversions.len(), 1);
        assert!(
            a.violations(5).contains("TOKEN INVERSION"),
            "{}",
            a.violations(5)
        );
    }

    /// Semaphore mode: two permits; holds of different slots may overlap, two of one slot may
    /// not, a third hold at once is too many, and a slot's store fences per slot.
    #[test]
    fn semaphore_mode_judges_per_slot_and_counts_holders() {
        let at = |id: &str, slot: u16, kind, mono, token| Event {
            lock: key("L", Some(slot)),
            ..ev(id, kind, mono, token, None)
        };
        let permits = HashMap::from([("L".to_owned(), 2u16)]);
        let fine = [
            ev("a", Kind::Waiting, 0, None, None),
            at("a", 0, Kind::Acquired, 10, Some(1)),
            at("b", 1, Kind::Acquired, 20, Some(1)),
            at("a", 0, Kind::Released, 50, None),
            at("c", 0, Kind::Acquired, 60, Some(2)),
            at("b", 1, Kind::Released, 70, None),
            ev("c", Kind::Killed, 90, None, None),
        ];
        let mut w = wr("b", 1, 30, true);
        w.lock = key("L", Some(1));
        let a = analyse_permits(&fine, &[w], 100, &permits);
        assert!(!a.unsafe_(), "{}", a.violations(5));
        assert_eq!(a.most_at_once, vec![("L".to_owned(), 2, 2)]);
        // The keys keep the slots apart even where the permits are not given.
        assert_eq!(analyse(&fine, &[], 100).judged_overlaps().count(), 0);

        let three = [
            at("a", 0, Kind::Acquired, 10, Some(1)),
            at("b", 1, Kind::Acquired, 20, Some(1)),
            at("c", 0, Kind::Acquired, 30, Some(2)),
        ];
        let a = analyse_permits(&three, &[], 100, &permits);
        assert!(a.unsafe_());
        assert_eq!(a.too_many.len(), 1);
        assert_eq!(a.judged_overlaps().count(), 1, "a and c share slot 0");
    }

    /// Checkpoint continuity: b reads a's last checkpoint, reported stored before b's grant;
    /// c reads one older than that and is flagged, d reads a checkpoint nobody had stored, and
    /// a checkpoint reported stored after its holder's token was fenced off is flagged. A
    /// checkpoint reported stored after the grant (a late answer) does not bind the reader.
    #[test]
    fn checkpoint_reads_older_than_a_stored_one_are_flagged() {
        let (a1, a2, b1) = (ckpt_number(5, 1), ckpt_number(5, 2), ckpt_number(7, 1));
        let mut events = vec![
            ev("a", Kind::Acquired, 10, Some(5), Some(60)),
            ev("a", Kind::CkRead, 11, Some(-1), Some(5)),
            ev("a", Kind::CkSent, 20, Some(a1), None),
            ev("a", Kind::CkAcked, 22, Some(a1), Some(20)),
            ev("a", Kind::CkSent, 30, Some(a2), None),
            ev("a", Kind::CkAcked, 32, Some(a2), Some(30)),
            ev("a", Kind::Released, 33, None, Some(33)),
            ev("b", Kind::Acquired, 40, Some(7), Some(90)),
            ev("b", Kind::CkRead, 41, Some(a2), Some(7)),
            // The CLI's acknowledgement: the value the job wrote last.
            ev("b", Kind::CkSent, 50, Some(b1), None),
            ev("b", Kind::Released, 55, None, Some(55)),
            ev("b", Kind::CkAcked, 53, None, None),
        ];
        let a = analyse(&events, &[], 100);
        assert!(!a.unsafe_(), "{}", a.violations(5));
        assert_eq!((a.checkpoints.reads, a.checkpoints.acked), (2, 3));
        assert_eq!(a.checkpoints.reads_bound, 1);

        events.extend([
            ev("c", Kind::Acquired, 60, Some(9), Some(120)),
            ev("c", Kind::CkRead, 61, Some(a2), Some(9)),
            ev("d", Kind::Acquired, 70, Some(11), Some(130)),
            ev("d", Kind::CkRead, 71, Some(ckpt_number(8, 1)), Some(11)),
        ]);
        let fenced = [wr("b", 7, 45, false)];
        let a = analyse(&events, &fenced, 200);
        let v = a.violations(10);
        assert!(a.unsafe_());
        assert_eq!(a.checkpoints.violations.len(), 3, "{v}");
        assert!(v.contains("STALE CHECKPOINT READ on L: c (token 9)"), "{v}");
        assert!(v.contains("NO EARLIER HOLD STORED on L: d"), "{v}");
        assert!(v.contains("FENCED CHECKPOINT STORED on L: b"), "{v}");
    }

    #[test]
    fn the_store_fences_lower_tokens_only() {
        let mut log = Log::default();
        assert!(log.write("L", "a", 3, 0).is_ok());
        assert!(log.write("L", "a", 3, 0).is_ok());
        assert_eq!(log.write("L", "b", 2, 0), Err(3));
        assert!(log.write("M", "b", 2, 0).is_ok());
        assert!(log.write("L", "b", 4, 0).is_ok());
        assert_eq!(log.writes.iter().filter(|w| !w.accepted).count(), 1);
    }
}

//! Scripted tests of the ledger machine (a manual clock, hand-built broker answers), of the
//! record format and of the history fold.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    BrokerId, FetchResponse, ListOffsetsResponse, MetadataResponse, OffsetCommitResponse,
    ProduceResponse,
};

use super::record::{RecordError, MAX_LABEL};
use super::*;
use crate::error::Error;

const LOCK: &str = "nightly";
/// The largest delay of the machines' retries.
const RETRY_MAX: Duration = Duration::from_secs(1);
const TOPIC: &str = "ledger";
const LEASE: Duration = Duration::from_secs(9);
const REQUEST: Duration = Duration::from_secs(5);

fn config() -> LedgerConfig {
    LedgerConfig {
        lock: LOCK.into(),
        topic: TOPIC.into(),
        label: Some("job a".into()),
        host: Some("host-a".into()),
        pid: Some(4242),
        lease_length: LEASE,
        request_timeout: REQUEST,
        append_deadline: REQUEST * 2,
        push: true,
        poll_wait: DEFAULT_POLL_WAIT,
        poll_max_bytes: DEFAULT_POLL_MAX_BYTES,
        checkpoint_max_bytes: DEFAULT_CHECKPOINT_MAX_BYTES,
        retry_backoff: Duration::from_millis(100),
        read_at_grant: false,
    }
}

fn broker(id: i32) -> Broker {
    Broker {
        node_id: id,
        host: "127.0.0.1".into(),
        port: 9090 + id,
    }
}

fn token(generation: i32) -> FencingToken {
    FencingToken {
        ledger_offset: None,
        generation,
        member_id: "m-1".into(),
    }
}

/// A machine, a manual clock, a membership it pretends to be, and everything the machine said,
/// its failures in the crate's words (as the session publishes them).
struct Rig {
    l: Ledger<Error>,
    now: Instant,
    unix_ms: i64,
    view: MemberView,
    sent: Vec<Transmit>,
    events: Vec<Event<Arc<Error>>>,
    commands: Vec<Command>,
    checkpoints: Vec<(u64, Result<(), Error>)>,
    /// Checkpoint reads asked for, by attempt.
    reads: Vec<u64>,
    /// What the holds that began were handed of their reads.
    granted: Vec<GrantRead<Error>>,
}

impl Rig {
    fn new() -> Rig {
        Rig::with(config())
    }

    fn with(cfg: LedgerConfig) -> Rig {
        let backoff = Backoff::with_rng(cfg.retry_backoff, RETRY_MAX, 2.0, 0.0, || 0.0);
        let partition = Partition {
            leader: broker(1),
            topic_id: Uuid::nil(),
        };
        Rig {
            l: Ledger::new(cfg, Some(partition), backoff),
            now: Instant::now(),
            unix_ms: 1_800_000_000_000,
            view: MemberView {
                holding: false,
                lease_end: None,
                coordinator: Some(broker(2)),
                generation: 3,
                member_id: "m-1".into(),
                awaiting_sync: false,
            },
            sent: Vec::new(),
            events: Vec::new(),
            commands: Vec::new(),
            checkpoints: Vec::new(),
            reads: Vec::new(),
            granted: Vec::new(),
        }
    }

    fn t(&self) -> Now {
        Now {
            mono: self.now,
            unix_ms: self.unix_ms,
        }
    }

    /// Takes everything the machine hands out. One that never stops handing something out
    /// fails the test here at once, instead of growing these lists until the kernel kills the
    /// test process for its memory.
    fn drain(&mut self) {
        fn all<T>(mut next: impl FnMut() -> Option<T>, into: &mut Vec<T>, what: &str) {
            for _ in 0..10_000 {
                match next() {
                    Some(x) => into.push(x),
                    None => return,
                }
            }
            panic!("the machine hands out {what} without end");
        }
        all(|| self.l.poll_transmit(), &mut self.sent, "requests");
        all(
            || {
                self.l
                    .poll_event()
                    .map(|e| e.map_failure(|f| Arc::new(Error::from(f))))
            },
            &mut self.events,
            "events",
        );
        all(|| self.l.poll_command(), &mut self.commands, "commands");
        all(
            || {
                self.l
                    .poll_checkpoint()
                    .map(|(ticket, result)| (ticket, result.map_err(Error::from)))
            },
            &mut self.checkpoints,
            "checkpoint outcomes",
        );
        all(|| self.l.poll_read(), &mut self.reads, "checkpoint reads");
        all(|| self.l.poll_granted(), &mut self.granted, "granted reads");
    }

    /// The checkpoint read of try `attempt` is done.
    fn read_done(&mut self, attempt: u64, read: GrantRead<Error>) {
        let (view, now) = (self.view.clone(), self.t());
        self.l.on_read(attempt, read, &view, now);
        self.drain();
    }

    fn member(&mut self, e: Event) {
        let (view, now) = (self.view.clone(), self.t());
        self.l.on_membership(e, &view, now);
        self.drain();
    }

    fn answer(&mut self, id: u64, r: Result<(Response, i16), Error>) {
        let (view, now) = (self.view.clone(), self.t());
        self.l.handle_response(id, r, &view, now);
        self.drain();
    }

    fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        let mut wakes = 0;
        while let Some(t) = self.l.poll_timeout() {
            if t > end {
                break;
            }
            wakes += 1;
            assert!(
                wakes < 1000,
                "the machine asks to be woken in a loop at {t:?}"
            );
            self.now = self.now.max(t);
            let (view, now) = (self.view.clone(), self.t());
            self.l.handle_timeout(&view, now);
            self.drain();
        }
        self.now = end;
        self.unix_ms += d.as_millis() as i64;
    }

    fn last(&self) -> &Transmit {
        self.sent.last().expect("something was sent")
    }

    /// The membership's hold begins; the lease runs from now.
    fn membership_acquires(&mut self, generation: i32) {
        self.view.holding = true;
        self.view.generation = generation;
        self.view.lease_end = Some(self.now + LEASE);
        let lease_end = self.now + LEASE;
        self.member(Event::Acquired {
            token: token(generation),
            lease_end,
            permit: 0,
        });
    }

    /// The membership has left the group.
    fn membership_leaves(&mut self) {
        self.view = MemberView::default();
        self.member(Event::Left { confirmed: true });
    }

    fn holding_at(&mut self, offset: i64) {
        self.membership_acquires(3);
        let id = self.last().id;
        self.answer(id, produced_at(offset));
        assert!(
            matches!(self.events.last(), Some(Event::Acquired { .. })),
            "{:?}",
            self.events
        );
        // Nothing in flight or queued, but the membership goes on: the session must too.
        assert!(!self.l.is_done());
    }
}

fn produce_answer(code: i16, offset: i64) -> Result<(Response, i16), Error> {
    let resp = ProduceResponse::default().with_responses(vec![TopicProduceResponse::default()
        .with_name(StrBytes::from_static_str(TOPIC).into())
        .with_partition_responses(vec![PartitionProduceResponse::default()
            .with_index(0)
            .with_error_code(code)
            .with_base_offset(offset)])]);
    Ok((Response::Produce(resp), 12))
}

fn produced_at(offset: i64) -> Result<(Response, i16), Error> {
    produce_answer(0, offset)
}

/// The ledger record a Produce transmit carries.
impl Rig {
    /// The last transmit is the ACQUIRED record of the try in `generation`; answered with
    /// `offset`, it begins the hold with that offset as its token.
    fn hold_begins_with_acquired(&mut self, generation: i32, offset: i64) {
        let next = self.last().clone();
        let rec = appended(&next);
        assert!(
            matches!(rec.kind, RecordKind::Acquired { .. }) && rec.generation == generation,
            "{rec:?}"
        );
        self.answer(next.id, produced_at(offset));
        assert!(
            matches!(self.events.last(), Some(Event::Acquired { token, .. }) if token.ledger_offset == Some(offset)),
            "{:?}",
            self.events
        );
    }
}

fn appended(t: &Transmit) -> LedgerRecord {
    let Op::Produce { batch, .. } = &t.op else {
        panic!("not a Produce: {t:?}")
    };
    let mut it = RecordBatches::new(batch.clone());
    let b = it.next().expect("one batch").expect("readable");
    assert_eq!(b.records.len(), 1);
    assert_eq!(b.records[0].key.as_deref(), Some(LOCK.as_bytes()));
    LedgerRecord::decode(b.records[0].value.as_deref().expect("a value")).expect("decodes")
}

fn record(kind: RecordKind, hold: i64) -> LedgerRecord {
    LedgerRecord {
        unix_ms: 1_800_000_000_000,
        hold,
        generation: 3,
        member_id: "m-2".into(),
        label: None,
        host: None,
        pid: None,
        slot: 0,
        kind,
    }
}

fn batch_of(records: &[(&str, LedgerRecord)]) -> Bytes {
    let recs: Vec<NewRecord> = records
        .iter()
        .map(|(key, r)| NewRecord {
            timestamp: r.unix_ms,
            key: Some(Bytes::copy_from_slice(key.as_bytes())),
            value: Some(r.encode()),
            headers: Vec::new(),
        })
        .collect();
    let mut out = BytesMut::new();
    encode_batch(&recs, &mut out).unwrap();
    out.freeze()
}

/// A Fetch answer whose batch starts at `base`.
fn fetch_answer(base: i64, records: &[(&str, LedgerRecord)]) -> Result<(Response, i16), Error> {
    let mut bytes = BytesMut::from(&batch_of(records)[..]);
    bytes[..8].copy_from_slice(&base.to_be_bytes());
    // The base offset is outside the CRC, so the batch stays valid.
    let hw = base + records.len() as i64;
    let resp = FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
        .with_topic(StrBytes::from_static_str(TOPIC).into())
        .with_partitions(vec![PartitionData::default()
            .with_partition_index(0)
            .with_high_watermark(hw)
            .with_records(Some(bytes.freeze()))])]);
    Ok((Response::Fetch(resp), 12))
}

fn commit_answer(code: i16) -> Result<(Response, i16), Error> {
    let resp =
        OffsetCommitResponse::default().with_topics(vec![OffsetCommitResponseTopic::default()
            .with_name(StrBytes::from_static_str(TOPIC).into())
            .with_partitions(vec![OffsetCommitResponsePartition::default()
                .with_partition_index(0)
                .with_error_code(code)])]);
    Ok((Response::OffsetCommit(resp), 9))
}

// ---- the hold -----------------------------------------------------------------------------------

#[test]
fn a_hold_begins_only_once_the_acquired_record_is_acknowledged() {
    let mut r = Rig::new();
    r.membership_acquires(3);
    assert!(
        r.events.is_empty(),
        "nothing is published before the ack: {:?}",
        r.events
    );
    let t = r.last().clone();
    assert_eq!(
        t.target,
        Target::Leader {
            broker: broker(1),
            lane: LeaderLane::Append
        }
    );
    let rec = appended(&t);
    assert_eq!(rec.kind, RecordKind::Acquired { lease_ms: 9000 });
    assert_eq!(
        (rec.hold, rec.generation, rec.member_id.as_str()),
        (-1, 3, "m-1")
    );
    assert_eq!(
        (rec.label.as_deref(), rec.host.as_deref(), rec.pid),
        (Some("job a"), Some("host-a"), Some(4242))
    );
    assert_eq!(rec.unix_ms, r.unix_ms);

    r.advance(Duration::from_millis(30));
    r.answer(t.id, produced_at(42));
    let [Event::Acquired {
        token, lease_end, ..
    }] = &r.events[..]
    else {
        panic!("{:?}", r.events)
    };
    assert_eq!(token.ledger_offset, Some(42));
    assert_eq!(token.generation, 3);
    assert_eq!(token.value(), 42);
    assert_eq!(Some(*lease_end), r.view.lease_end);
    assert_eq!(r.l.token().map(|t| t.value()), Some(42));
}

#[test]
fn an_ack_after_the_lease_end_is_a_loss_and_its_record_is_marked() {
    let mut r = Rig::new();
    r.membership_acquires(3);
    let t = r.last().clone();
    // The membership's lease ran out while the Produce was in the air (a paused process, a slow
    // broker): the answer names an offset, but no hold.
    r.advance(LEASE);
    r.view.holding = false;
    r.answer(t.id, produced_at(42));
    assert!(
        !r.events.iter().any(|e| matches!(e, Event::Acquired { .. })),
        "{:?}",
        r.events
    );
    assert!(matches!(
        r.events.last(),
        Some(Event::Lost {
            reason: LossReason::Ledger,
            ..
        })
    ));
    assert_eq!(r.commands, [Command::Leave]);
    // The membership releases what it still thinks it holds, and leaves: no second event.
    let before = r.events.len();
    r.member(Event::Released);
    assert_eq!(r.events.len(), before, "{:?}", r.events);
    r.membership_leaves();
    assert_eq!(r.events.len(), before, "Left waits for the LOST record");
    let t = r.last().clone();
    let rec = appended(&t);
    assert_eq!(rec.hold, 42);
    let RecordKind::Lost { reason, .. } = &rec.kind else {
        panic!("{rec:?}")
    };
    assert_eq!(reason, "ledger");
    r.answer(t.id, produced_at(43));
    assert!(matches!(r.events.last(), Some(Event::Left { .. })));
    assert!(r.l.is_done());
}

#[test]
fn an_ack_just_before_the_lease_end_is_a_hold() {
    let mut r = Rig::new();
    r.membership_acquires(3);
    let t = r.last().clone();
    r.advance(LEASE - Duration::from_millis(1));
    r.answer(t.id, produced_at(7));
    assert!(matches!(r.events.last(), Some(Event::Acquired { .. })));
}

// ---- the checkpoint read at the grant ------------------------------------------------------------

fn reading() -> Rig {
    Rig::with(LedgerConfig {
        read_at_grant: true,
        ..config()
    })
}

fn found(value: &str) -> GrantRead<Error> {
    Ok(Some(Checkpoint {
        value: value.into(),
        token: 5,
        source: CheckpointSource::Group,
    }))
}

fn acquired(r: &Rig) -> usize {
    r.events
        .iter()
        .filter(|e| matches!(e, Event::Acquired { .. }))
        .count()
}

/// The read is asked for with the ACQUIRED append, before its answer; the hold begins only
/// once both are in, whichever comes first, and carries what the read found. Breaks if the read
/// were asked for only once the append is acknowledged, or if either answer alone began the
/// hold.
#[test]
fn with_a_checkpoint_read_the_hold_waits_for_it_and_the_acquired_answer_in_either_order() {
    for read_first in [false, true] {
        let mut r = reading();
        r.membership_acquires(3);
        let append = r.last().clone();
        assert!(matches!(
            appended(&append).kind,
            RecordKind::Acquired { .. }
        ));
        assert_eq!(r.reads, [1], "the read goes out beside the append");
        r.advance(Duration::from_millis(2));
        if read_first {
            r.read_done(1, found("c5"));
            assert_eq!(acquired(&r), 0, "the read alone began the hold");
            r.advance(Duration::from_millis(2));
            r.answer(append.id, produced_at(42));
        } else {
            r.answer(append.id, produced_at(42));
            assert_eq!(acquired(&r), 0, "the ACQUIRED answer alone began the hold");
            assert!(r.granted.is_empty());
            r.advance(Duration::from_millis(2));
            r.read_done(1, found("c5"));
        }
        assert_eq!(acquired(&r), 1, "{:?}", r.events);
        assert!(
            matches!(r.events.last(), Some(Event::Acquired { token, .. }) if token.ledger_offset == Some(42)),
            "{:?}",
            r.events
        );
        assert_eq!(r.granted.len(), 1);
        assert_eq!(
            r.granted[0]
                .as_ref()
                .ok()
                .cloned()
                .flatten()
                .map(|c| c.value),
            Some("c5".to_owned())
        );
        assert_eq!(r.reads, [1], "one read per try");
    }
}

/// A read that failed still lets the hold begin (its error goes to the guard, whose reader
/// refuses to go on as before); the machine never reads the value.
#[test]
fn a_failed_checkpoint_read_is_handed_on_with_the_hold() {
    let mut r = reading();
    r.membership_acquires(3);
    let append = r.last().clone();
    r.read_done(1, Err(Error::Closed));
    r.answer(append.id, produced_at(42));
    assert_eq!(acquired(&r), 1);
    assert!(matches!(r.granted.as_slice(), [Err(Error::Closed)]));
}

/// The lease ends while the read is still out, after the ACQUIRED answer: no hold begins, the
/// users hear of a loss, and a read that comes in for the try afterwards is dropped. Breaks if
/// the hold began at the ACQUIRED answer, or if the late read began it (or checked no lease).
#[test]
fn a_lease_end_while_the_checkpoint_read_is_out_ends_the_try() {
    let mut r = reading();
    r.membership_acquires(3);
    let append = r.last().clone();
    r.answer(append.id, produced_at(42));
    // The ACQUIRED deadline no longer counts once acknowledged: only the lease does.
    r.advance(REQUEST * 3);
    assert_eq!(acquired(&r), 0);
    assert!(r.commands.is_empty(), "{:?}", r.commands);
    r.view.holding = false;
    let lease_end = r.now;
    r.member(Event::Lost {
        reason: LossReason::LeaseExpired,
        lease_end,
    });
    r.read_done(1, found("c5"));
    assert_eq!(acquired(&r), 0, "{:?}", r.events);
    assert!(r.granted.is_empty());
    r.membership_leaves();
    let rec = appended(r.last());
    assert_eq!(rec.hold, 42);
    assert!(matches!(rec.kind, RecordKind::Lost { .. }));
}

/// A read answered after the lease ran out, with the membership not yet told (its timer not
/// yet fired): the hold does not begin. Breaks if the lease were checked only at the ACQUIRED
/// answer.
#[test]
fn a_checkpoint_read_done_after_the_lease_end_begins_no_hold() {
    let mut r = reading();
    r.membership_acquires(3);
    let append = r.last().clone();
    r.answer(append.id, produced_at(42));
    r.now += LEASE;
    r.read_done(1, found("c5"));
    assert_eq!(acquired(&r), 0, "{:?}", r.events);
    assert!(matches!(
        r.events.last(),
        Some(Event::Lost {
            reason: LossReason::Ledger,
            ..
        })
    ));
    assert_eq!(r.commands, [Command::Leave]);
}

/// A read of an earlier try (eager revocation, then a new assignment) does not stand in for the
/// new try's. Breaks if reads were not matched to their try.
#[test]
fn a_checkpoint_read_of_an_earlier_try_does_not_begin_the_next() {
    let mut r = reading();
    r.membership_acquires(3);
    let first = r.last().clone();
    let lease_end = r.now;
    r.member(Event::Lost {
        reason: LossReason::Revoked,
        lease_end,
    });
    r.membership_acquires(4);
    assert_eq!(r.reads, [1, 2]);
    // One append at a time: the second try's ACQUIRED goes once the first is answered.
    r.answer(first.id, produced_at(42));
    let append = r
        .sent
        .iter()
        .rev()
        .find(|t| {
            matches!(&t.op, Op::Produce { .. })
                && matches!(appended(t).kind, RecordKind::Acquired { .. })
                && appended(t).generation == 4
        })
        .expect("the second try's ACQUIRED")
        .clone();
    r.answer(append.id, produced_at(50));
    r.read_done(1, found("old"));
    assert_eq!(acquired(&r), 0, "{:?}", r.events);
    r.read_done(2, found("new"));
    assert_eq!(acquired(&r), 1, "{:?}", r.events);
    assert_eq!(
        r.granted[0]
            .as_ref()
            .ok()
            .cloned()
            .flatten()
            .map(|c| c.value),
        Some("new".to_owned())
    );
}

/// A read that came in first decides nothing about the hold: an ACQUIRED append the ledger
/// refuses still fails the acquisition (nothing handed out), a retriable refusal is retried and
/// the hold begins with that read once the retry is acknowledged, and the append's own deadline
/// still ends a try whose ACQUIRED never is. Breaks if a read that is in began the hold without
/// the ACQUIRED offset, or if it lifted the append's deadline.
#[test]
fn a_checkpoint_read_in_first_leaves_the_acquired_append_to_decide() {
    let mut r = reading();
    r.membership_acquires(3);
    let append = r.last().clone();
    r.read_done(1, found("c5"));
    r.answer(append.id, produce_answer(29, -1)); // TOPIC_AUTHORIZATION_FAILED
    assert!(
        matches!(r.events.last(), Some(Event::Failed(_))),
        "{:?}",
        r.events
    );
    assert_eq!(acquired(&r), 0);
    assert!(r.granted.is_empty());

    let mut r = reading();
    r.membership_acquires(3);
    let append = r.last().clone();
    r.read_done(1, found("c5"));
    r.answer(append.id, produce_answer(19, -1)); // NOT_ENOUGH_REPLICAS: retried
    assert_eq!(acquired(&r), 0);
    r.advance(RETRY_MAX);
    let retry = r.last().clone();
    assert!(matches!(appended(&retry).kind, RecordKind::Acquired { .. }));
    assert_ne!(retry.id, append.id);
    r.answer(retry.id, produced_at(43));
    assert_eq!(acquired(&r), 1, "{:?}", r.events);
    assert!(matches!(r.granted.as_slice(), [Ok(Some(c))] if c.value == "c5"));

    let mut r = reading();
    r.membership_acquires(3);
    r.read_done(1, found("c5"));
    r.advance(REQUEST * 2 + Duration::from_millis(1));
    assert!(
        matches!(
            r.events.last(),
            Some(Event::Lost {
                reason: LossReason::Ledger,
                ..
            })
        ),
        "{:?}",
        r.events
    );
    assert_eq!(acquired(&r), 0);
    assert!(r.granted.is_empty());
}

#[test]
fn retriable_append_failures_are_retried_until_the_deadline_then_the_hold_is_given_up() {
    let mut r = Rig::new();
    r.membership_acquires(3);
    // NOT_ENOUGH_REPLICAS: the leader is fine, the ISR is short.
    for _ in 0..3 {
        let id = r.last().id;
        r.answer(id, produce_answer(19, -1));
        let n = r.sent.len();
        r.advance(Duration::from_secs(1));
        assert_eq!(r.sent.len(), n + 1, "retried after the backoff");
        // The membership keeps renewing meanwhile.
        r.view.lease_end = Some(r.now + LEASE);
    }
    assert!(r.events.is_empty());
    r.advance(REQUEST * 2);
    assert!(
        matches!(
            r.events.last(),
            Some(Event::Lost {
                reason: LossReason::Ledger,
                ..
            })
        ),
        "{:?}",
        r.events
    );
    assert!(r.commands.contains(&Command::Leave));
}

#[test]
fn a_new_leader_is_looked_up_after_not_leader_or_follower() {
    let mut r = Rig::new();
    r.membership_acquires(3);
    let id = r.last().id;
    r.answer(id, produce_answer(6, -1));
    assert!(
        !r.sent.iter().any(|t| matches!(t.op, Op::Metadata { .. })),
        "looked up again before a backoff: {:?}",
        r.sent
    );
    r.advance(Duration::from_millis(100));
    let meta = r.last().clone();
    assert_eq!(meta.target, Target::Any);
    assert!(matches!(meta.op, Op::Metadata { .. }));
    let resp = MetadataResponse::default()
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(BrokerId(3))
            .with_host(StrBytes::from_static_str("127.0.0.1"))
            .with_port(9093)])
        .with_topics(vec![MetadataResponseTopic::default()
            .with_name(Some(StrBytes::from_static_str(TOPIC).into()))
            .with_partitions(vec![MetadataResponsePartition::default()
                .with_partition_index(0)
                .with_leader_id(BrokerId(3))])]);
    r.answer(meta.id, Ok((Response::Metadata(resp), 12)));
    let again = r.last().clone();
    assert_eq!(
        again.target,
        Target::Leader {
            broker: broker(3),
            lane: LeaderLane::Append
        }
    );
    r.answer(again.id, produced_at(5));
    assert!(matches!(r.events.last(), Some(Event::Acquired { .. })));
}

/// A lookup that finds no leader (an election) or gets no answer is asked again after a
/// backoff, not at once: each answer would otherwise be followed by the next in a loop.
#[test]
fn a_lookup_without_a_leader_or_an_answer_is_retried_after_a_backoff() {
    type Answer = fn() -> Result<(Response, i16), Error>;
    let no_leader: Answer = || {
        let resp = MetadataResponse::default().with_topics(vec![MetadataResponseTopic::default()
            .with_name(Some(StrBytes::from_static_str(TOPIC).into()))
            .with_error_code(5)]);
        Ok((Response::Metadata(resp), 12))
    };
    let unanswered: Answer = || Err(driver_failure("timeout"));
    for (case, answer) in [("no leader", no_leader), ("unanswered", unanswered)] {
        let mut r = Rig::new();
        r.membership_acquires(3);
        let id = r.last().id;
        r.answer(id, produce_answer(6, -1));
        r.advance(Duration::from_millis(100));
        let meta = r.last().clone();
        assert!(matches!(meta.op, Op::Metadata { .. }), "{case}: {meta:?}");
        r.answer(meta.id, answer());
        let lookups = |r: &Rig| {
            r.sent
                .iter()
                .filter(|t| matches!(t.op, Op::Metadata { .. }))
                .count()
        };
        assert_eq!(lookups(&r), 1, "{case}: looked up again at once");
        r.advance(RETRY_MAX);
        assert_eq!(lookups(&r), 2, "{case}: {:?}", r.sent);
    }
}

#[test]
fn a_ledger_topic_with_two_partitions_is_refused() {
    let resp = MetadataResponse::default().with_topics(vec![MetadataResponseTopic::default()
        .with_name(Some(StrBytes::from_static_str(TOPIC).into()))
        .with_partitions(vec![
            MetadataResponsePartition::default().with_partition_index(0),
            MetadataResponsePartition::default().with_partition_index(1),
        ])]);
    let err = ledger_partition(&resp, TOPIC)
        .map_err(Error::from)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Ledger(LedgerError::NotOnePartition { partitions: 2, .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("exactly one"), "{err}");
    let missing = MetadataResponse::default();
    assert!(matches!(
        ledger_partition(&missing, TOPIC).map_err(Error::from),
        Err(Error::Ledger(LedgerError::TopicMissing { .. }))
    ));
}

#[test]
fn a_refused_acquired_record_fails_the_acquisition() {
    let mut r = Rig::new();
    r.membership_acquires(3);
    let id = r.last().id;
    // TOPIC_AUTHORIZATION_FAILED: no retry helps.
    r.answer(id, produce_answer(29, -1));
    assert!(
        matches!(r.events.last(), Some(Event::Failed(e)) if matches!(**e, Error::Broker { code: KafkaCode(29), .. })),
        "{:?}",
        r.events
    );
    assert_eq!(r.commands, [Command::Leave]);
}

#[test]
fn released_is_appended_after_the_leave_and_left_waits_for_it() {
    let mut r = Rig::new();
    r.holding_at(42);
    r.advance(Duration::from_millis(1500));
    let sent = r.sent.len();
    r.member(Event::Released);
    assert!(matches!(r.events.last(), Some(Event::Released)));
    assert_eq!(
        r.sent.len(),
        sent,
        "nothing is written before the LeaveGroup is answered"
    );
    r.advance(Duration::from_millis(3));
    r.membership_leaves();
    assert!(
        !matches!(r.events.last(), Some(Event::Left { .. })),
        "{:?}",
        r.events
    );
    let t = r.last().clone();
    let rec = appended(&t);
    assert_eq!(rec.hold, 42);
    assert_eq!(rec.kind, RecordKind::Released { held_ms: 1500 });
    assert!(!r.l.is_done());
    r.answer(t.id, produced_at(50));
    assert!(matches!(r.events.last(), Some(Event::Left { .. })));
    assert!(r.l.is_done());
}

#[test]
fn a_failed_end_record_is_logged_not_fatal() {
    let mut r = Rig::new();
    r.holding_at(42);
    r.member(Event::Released);
    r.membership_leaves();
    let id = r.last().id;
    // MESSAGE_TOO_LARGE: not retriable.
    r.answer(id, produce_answer(10, -1));
    assert!(matches!(r.events.last(), Some(Event::Left { .. })));
    assert!(r.l.is_done());
    // A broker that never answers: the record is given up after the request timeout.
    let mut r = Rig::new();
    r.holding_at(42);
    r.member(Event::Released);
    r.membership_leaves();
    let id = r.last().id;
    r.answer(
        id,
        Err(Error::Timeout {
            op: "Produce".into(),
            after: REQUEST,
        }),
    );
    // The record waits for the leader to be looked up again: the session may not end yet.
    assert!(!r.l.is_done());
    assert!(
        !matches!(r.events.last(), Some(Event::Left { .. })),
        "{:?}",
        r.events
    );
    r.advance(REQUEST);
    assert!(
        matches!(r.events.last(), Some(Event::Left { .. })),
        "{:?}",
        r.events
    );
    assert!(r.l.is_done());
}

#[test]
fn a_loss_while_held_is_published_at_once_and_recorded_after_the_leave() {
    let mut r = Rig::new();
    r.holding_at(42);
    r.advance(Duration::from_secs(4));
    let lease_end = r.now - Duration::from_secs(1);
    r.view.holding = false;
    r.member(Event::Lost {
        reason: LossReason::LeaseExpired,
        lease_end,
    });
    assert!(matches!(
        r.events.last(),
        Some(Event::Lost {
            reason: LossReason::LeaseExpired,
            ..
        })
    ));
    r.membership_leaves();
    let rec = appended(r.last());
    let RecordKind::Lost {
        held_ms, reason, ..
    } = &rec.kind
    else {
        panic!("{rec:?}")
    };
    // Held until the lease end, not until the loss was noticed.
    assert_eq!((*held_ms, reason.as_str()), (3000, "lease_expired"));
}

#[test]
fn a_loss_while_appending_is_published_and_the_late_offset_still_recorded() {
    let mut r = Rig::new();
    r.membership_acquires(3);
    let t = r.last().clone();
    r.view.holding = false;
    let lease_end = r.now;
    r.member(Event::Lost {
        reason: LossReason::Fenced(KafkaCode(25)),
        lease_end,
    });
    assert!(matches!(r.events.last(), Some(Event::Lost { .. })));
    r.membership_leaves();
    // The ACQUIRED answer decides whether there is an offset to name.
    r.answer(t.id, produced_at(9));
    assert!(!r.events.iter().any(|e| matches!(e, Event::Acquired { .. })));
    let rec = appended(r.last());
    assert_eq!(rec.hold, 9);
}

/// An ACQUIRED record acknowledged after its try was lost is named by that try's end record,
/// which waits for the membership to leave like every end record (a waiter that reads it and
/// rejoins must find the rebalance begun) and says how the try ended.
#[test]
fn an_acquired_acknowledged_after_a_loss_is_named_after_the_leave_with_the_losss_reason() {
    let mut r = Rig::new();
    r.membership_acquires(3);
    let t = r.last().clone();
    r.view.holding = false;
    let lease_end = r.now;
    r.member(Event::Lost {
        reason: LossReason::Fenced(KafkaCode(25)),
        lease_end,
    });
    r.answer(t.id, produced_at(9));
    assert_eq!(r.sent.len(), 1, "{:?}", &r.sent[1..]);
    assert_eq!(r.l.poll_timeout(), None);
    r.membership_leaves();
    let rec = appended(r.last());
    assert_eq!(rec.hold, 9);
    let RecordKind::Lost { reason, .. } = &rec.kind else {
        panic!("{rec:?}")
    };
    assert_eq!(reason, LossReason::Fenced(KafkaCode(25)).as_str());
    assert!(!r.events.iter().any(|e| matches!(e, Event::Acquired { .. })));
}

/// A try abandoned while its ACQUIRED record waits out a retry's backoff drops the record, and
/// with it the retry: nothing is left to wake the machine for.
#[test]
fn an_abandoned_acquired_retry_asks_for_no_wake_up() {
    let mut r = Rig::new();
    r.membership_acquires(3);
    let t = r.last().clone();
    // NOT_ENOUGH_REPLICAS: retriable, the leader stays; the retry waits out a backoff.
    r.answer(t.id, produce_answer(19, -1));
    assert!(r.l.poll_timeout().is_some_and(|at| at > r.now));
    r.member(Event::Released);
    assert_eq!(r.l.poll_timeout(), None);
    let sent = r.sent.len();
    r.advance(REQUEST * 4);
    assert_eq!(r.sent.len(), sent, "{:?}", &r.sent[sent..]);
}

#[test]
fn an_abandoned_acquire_never_publishes_a_hold() {
    let mut r = Rig::new();
    r.membership_acquires(3);
    let t = r.last().clone();
    // The caller gave up (acquire's wait ended): the membership releases and leaves.
    r.member(Event::Released);
    r.membership_leaves();
    r.answer(t.id, produced_at(11));
    assert!(
        r.events
            .iter()
            .all(|e| !matches!(e, Event::Acquired { .. } | Event::Released)),
        "{:?}",
        r.events
    );
    let rec = appended(r.last());
    assert_eq!(rec.hold, 11);
    assert!(matches!(rec.kind, RecordKind::Lost { .. }));
}

#[test]
fn a_token_change_keeps_the_ledger_offset() {
    let mut r = Rig::new();
    r.holding_at(42);
    r.member(Event::TokenChanged { token: token(4) });
    let Some(Event::TokenChanged { token }) = r.events.last() else {
        panic!("{:?}", r.events)
    };
    assert_eq!((token.ledger_offset, token.generation), (Some(42), 4));
    assert!(
        *token
            > r.l
                .token()
                .cloned()
                .map(|mut t| {
                    t.generation = 3;
                    t
                })
                .unwrap()
    );
}

/// A rebalance while the ACQUIRED record is on its way moves the hold to the new generation:
/// the users' token and the end record carry it (a waiter that reads the end record rejoins at
/// once only when it names the waiter's own generation).
#[test]
fn a_token_change_while_appending_is_the_holds_generation() {
    let mut r = Rig::new();
    r.membership_acquires(3);
    let t = r.last().clone();
    r.member(Event::TokenChanged { token: token(4) });
    assert!(
        !r.events
            .iter()
            .any(|e| matches!(e, Event::TokenChanged { .. })),
        "published before the hold began: {:?}",
        r.events
    );
    r.answer(t.id, produced_at(42));
    let Some(Event::Acquired { token, .. }) = r.events.last() else {
        panic!("{:?}", r.events)
    };
    assert_eq!((token.ledger_offset, token.generation), (Some(42), 4));
    r.member(Event::Released);
    r.membership_leaves();
    let rec = appended(r.last());
    assert_eq!((rec.hold, rec.generation), (42, 4), "{rec:?}");
}

// ---- the waiters' long poll ---------------------------------------------------------------------

#[test]
fn a_waiter_long_polls_from_the_end_and_tells_the_membership_of_this_locks_release() {
    let mut r = Rig::new();
    r.member(Event::Waiting {
        holder: None,
        holders: Vec::new(),
        position: 1,
        generation: 3,
    });
    let t = r.last().clone();
    assert_eq!(
        t.target,
        Target::Leader {
            broker: broker(1),
            lane: LeaderLane::Append
        }
    );
    assert!(matches!(
        t.op,
        Op::ListOffsets {
            spec: OffsetSpec::Latest,
            ..
        }
    ));
    let end = ListOffsetsResponse::default().with_topics(vec![ListOffsetsTopicResponse::default()
        .with_name(StrBytes::from_static_str(TOPIC).into())
        .with_partitions(vec![ListOffsetsPartitionResponse::default()
            .with_partition_index(0)
            .with_offset(10)])]);
    r.answer(t.id, Ok((Response::ListOffsets(end), 9)));
    // A release recorded before the poll's starting point would be missed: one heartbeat now.
    assert_eq!(r.commands, [Command::HeartbeatNow]);
    r.commands.clear();
    let t = r.last().clone();
    let Op::Fetch {
        offset, options, ..
    } = &t.op
    else {
        panic!("{t:?}")
    };
    assert_eq!(*offset, 10);
    assert_eq!(options.max_wait, DEFAULT_POLL_WAIT);
    assert_eq!(options.max_bytes, DEFAULT_POLL_MAX_BYTES);
    assert_eq!(
        t.target,
        Target::Leader {
            broker: broker(1),
            lane: LeaderLane::Poll
        },
        "nothing may queue behind a parked Fetch"
    );
    assert!(
        t.timeout > DEFAULT_POLL_WAIT,
        "the parked Fetch outlives its wait"
    );

    // Another lock's release and this lock's acquisition are no news.
    r.answer(
        t.id,
        fetch_answer(
            10,
            &[
                ("other-lock", record(RecordKind::Released { held_ms: 1 }, 3)),
                (LOCK, record(RecordKind::Acquired { lease_ms: 1 }, -1)),
            ],
        ),
    );
    assert!(r.commands.is_empty(), "{:?}", r.commands);
    let t = r.last().clone();
    assert!(matches!(t.op, Op::Fetch { offset: 12, .. }), "{t:?}");

    r.answer(
        t.id,
        fetch_answer(
            12,
            &[(LOCK, record(RecordKind::Released { held_ms: 1 }, 11))],
        ),
    );
    // The membership hears which generation's hold ended: its own means rejoin at once.
    assert_eq!(
        r.commands,
        [Command::HoldEnded {
            generation: 3,
            member_id: "m-2".into()
        }]
    );
    assert!(matches!(r.last().op, Op::Fetch { offset: 13, .. }));

    // Holding ends the poll; a late answer changes nothing.
    let t = r.last().clone();
    r.membership_acquires(4);
    let n = r.commands.len();
    r.answer(
        t.id,
        fetch_answer(
            13,
            &[(LOCK, record(RecordKind::Released { held_ms: 1 }, 11))],
        ),
    );
    assert_eq!(r.commands.len(), n);
}

/// A waiter's Fetch has room for hundreds of ledger records, as the module docs promise: each
/// record is a batch of its own (appended one at a time), and a busy ledger shared by many locks
/// is read in few round trips.
#[test]
fn a_waiters_fetch_has_room_for_hundreds_of_records() {
    let mut r = Rig::new();
    waiting_at(&mut r, 10);
    let Op::Fetch { options, .. } = &r.last().op else {
        panic!("{:?}", r.last())
    };
    let released = LedgerRecord {
        member_id: "kafka-lock-0b6f5c1e-8a8e-4a63-9d5e-2f4c1b7a9e01".into(),
        label: Some("job a".into()),
        host: Some("host-a".into()),
        pid: Some(4242),
        ..record(RecordKind::Released { held_ms: 1 }, 11)
    };
    let hundreds = 200 * batch_of(&[(LOCK, released)]).len();
    assert!(
        usize::try_from(options.max_bytes).is_ok_and(|max| max >= hundreds),
        "{} bytes, not room for 200 records ({hundreds} bytes)",
        options.max_bytes
    );
}

#[test]
fn without_push_a_waiter_does_not_poll() {
    let mut r = Rig::with(LedgerConfig {
        push: false,
        ..config()
    });
    r.member(Event::Waiting {
        holder: None,
        holders: Vec::new(),
        position: 1,
        generation: 3,
    });
    assert!(r.sent.is_empty(), "{:?}", r.sent);
}

#[test]
fn a_poll_past_the_end_starts_again_from_the_end() {
    let mut r = Rig::new();
    r.member(Event::Waiting {
        holder: None,
        holders: Vec::new(),
        position: 1,
        generation: 3,
    });
    let t = r.last().clone();
    let end = ListOffsetsResponse::default().with_topics(vec![ListOffsetsTopicResponse::default()
        .with_name(StrBytes::from_static_str(TOPIC).into())
        .with_partitions(vec![ListOffsetsPartitionResponse::default()
            .with_partition_index(0)
            .with_offset(10)])]);
    r.answer(t.id, Ok((Response::ListOffsets(end), 9)));
    let t = r.last().clone();
    let resp = FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
        .with_topic(StrBytes::from_static_str(TOPIC).into())
        .with_partitions(vec![PartitionData::default()
            .with_partition_index(0)
            .with_error_code(1)])]);
    r.answer(t.id, Ok((Response::Fetch(resp), 12)));
    r.advance(Duration::from_secs(1));
    assert!(
        matches!(r.last().op, Op::ListOffsets { .. }),
        "{:?}",
        r.last()
    );
}

/// Waits as a waiter: ListOffsets answered with `end`, so the next transmit is the Fetch.
fn waiting_at(r: &mut Rig, end: i64) {
    r.member(Event::Waiting {
        holder: None,
        holders: Vec::new(),
        position: 1,
        generation: 3,
    });
    let t = r.last().clone();
    let resp =
        ListOffsetsResponse::default().with_topics(vec![ListOffsetsTopicResponse::default()
            .with_name(StrBytes::from_static_str(TOPIC).into())
            .with_partitions(vec![ListOffsetsPartitionResponse::default()
                .with_partition_index(0)
                .with_offset(end)])]);
    r.answer(t.id, Ok((Response::ListOffsets(resp), 9)));
}

fn fetch_of(records: Bytes, hw: i64) -> Result<(Response, i16), Error> {
    let resp = FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
        .with_topic(StrBytes::from_static_str(TOPIC).into())
        .with_partitions(vec![PartitionData::default()
            .with_partition_index(0)
            .with_high_watermark(hw)
            .with_records(Some(records))])]);
    Ok((Response::Fetch(resp), 12))
}

fn at_base(batch: Bytes, base: i64) -> BytesMut {
    let mut b = BytesMut::from(&batch[..]);
    b[..8].copy_from_slice(&base.to_be_bytes());
    b
}

#[test]
fn an_unreadable_batch_is_skipped_alone_not_to_the_high_watermark() {
    let mut r = Rig::new();
    waiting_at(&mut r, 5);
    let fetch = r.last().clone();
    let mut bad = at_base(
        batch_of(&[("other", record(RecordKind::Released { held_ms: 1 }, 1))]),
        5,
    );
    let last = bad.len() - 1;
    bad[last] ^= 1; // CRC mismatch
    let mut data = bad;
    data.extend_from_slice(&at_base(
        batch_of(&[("other", record(RecordKind::Released { held_ms: 1 }, 2))]),
        6,
    ));
    // Offsets 7..100 exist but did not fit in this answer.
    r.answer(fetch.id, fetch_of(data.freeze(), 100));
    r.advance(Duration::from_millis(1));
    let next = r.last().clone();
    assert!(
        matches!(next.op, Op::Fetch { offset: 7, .. }),
        "the poll went on from {:?}",
        next.op
    );
}

/// A record batch as large as Apache Kafka accepts by default (`max.message.bytes`,
/// `LogConfig.DEFAULT_MAX_MESSAGE_BYTES`: 1 MiB and a 12-byte log overhead) comes whole in a
/// Fetch answer when it is the first (KIP-74), whatever the Fetch's limit: at every Fetch version
/// kafka-lock speaks, that answer is above the default frame limit and is read whole on a ledger
/// connection, whose limit still refuses far larger frames.
#[test]
fn a_fetch_of_a_batch_of_the_brokers_default_size_fits_a_ledger_connections_frame() {
    use crate::wire::frame::{decode_frame, DEFAULT_MAX_FRAME_SIZE};
    use kafka_protocol::messages::ResponseHeader;
    use kafka_protocol::protocol::Encodable;

    let batch = Bytes::from(vec![7u8; 1024 * 1024 + 12]);
    let (min, max) = crate::wire::versions::supported_range(ApiKey::Fetch).expect("Fetch");
    for v in min..=max {
        let topic = if v < 13 {
            FetchableTopicResponse::default().with_topic(StrBytes::from_static_str(TOPIC).into())
        } else {
            FetchableTopicResponse::default().with_topic_id(Uuid::from_u128(7))
        };
        let resp = FetchResponse::default().with_responses(vec![topic.with_partitions(vec![
            PartitionData::default()
                .with_partition_index(0)
                .with_high_watermark(1)
                .with_records(Some(batch.clone())),
        ])]);
        let mut payload = BytesMut::new();
        ResponseHeader::default()
            .with_correlation_id(1)
            .encode(&mut payload, ApiKey::Fetch.response_header_version(v))
            .expect("a header");
        resp.encode(&mut payload, v).expect("an answer");
        assert!(payload.len() > DEFAULT_MAX_FRAME_SIZE, "v{v}");
        let mut framed = BytesMut::new();
        framed.extend_from_slice(&(payload.len() as i32).to_be_bytes());
        framed.extend_from_slice(&payload);
        let frame = decode_frame(&mut framed, LEDGER_MAX_FRAME_SIZE)
            .unwrap_or_else(|e| panic!("v{v}: {e}"))
            .expect("a whole frame");
        let Response::Fetch(read) =
            crate::wire::codec::decode_response_frame_bytes(frame, ApiKey::Fetch, v, 1)
                .unwrap_or_else(|e| panic!("v{v}: {e}"))
        else {
            panic!("v{v}: not a Fetch answer")
        };
        let records = read.responses[0].partitions[0].records.as_ref();
        assert_eq!(records.map(Bytes::len), Some(batch.len()), "v{v}");
    }
    // Still a bound on what a peer can make the reader buffer: twice the default is refused.
    let twice = i32::try_from(2 * DEFAULT_MAX_FRAME_SIZE).expect("fits");
    assert!(crate::wire::frame::frame_length(twice.to_be_bytes(), LEDGER_MAX_FRAME_SIZE).is_err());
}

#[test]
fn a_first_batch_that_cannot_arrive_whole_is_skipped_by_its_header() {
    let mut r = Rig::new();
    waiting_at(&mut r, 5);
    let fetch = r.last().clone();
    let big = at_base(
        batch_of(&[
            ("other", record(RecordKind::Released { held_ms: 1 }, 1)),
            ("other", record(RecordKind::Released { held_ms: 1 }, 2)),
            ("other", record(RecordKind::Released { held_ms: 1 }, 3)),
        ]),
        5,
    );
    // Only the start of it came (a size limit): nothing more is in any Fetch from 5.
    r.answer(fetch.id, fetch_of(big.freeze().slice(..61), 100));
    r.advance(Duration::from_millis(1));
    let next = r.last().clone();
    assert!(
        matches!(next.op, Op::Fetch { offset: 8, .. }),
        "the poll went on from {:?}",
        next.op
    );
}

// ---- checkpoints --------------------------------------------------------------------------------

#[test]
fn a_checkpoint_is_a_fenced_commit_then_a_ledger_record() {
    let mut r = Rig::new();
    r.holding_at(42);
    r.view.generation = 5;
    let (view, now) = (r.view.clone(), r.t());
    r.l.checkpoint(1, "up to 2026-11-29".into(), &view, now);
    r.drain();
    let t = r.last().clone();
    assert_eq!(t.target, Target::Coordinator(broker(2)));
    let Op::Commit {
        group,
        generation,
        member_id,
        offset,
        metadata,
        ..
    } = &t.op
    else {
        panic!("{t:?}")
    };
    assert_eq!(
        (
            group.as_str(),
            *generation,
            member_id.as_str(),
            *offset,
            metadata.as_str()
        ),
        (LOCK, 5, "m-1", 42, "up to 2026-11-29")
    );
    r.answer(t.id, commit_answer(0));
    // Committed, but not reported stored until the ledger has its copy.
    assert!(r.checkpoints.is_empty(), "{:?}", r.checkpoints);
    let copy = r.last().clone();
    let rec = appended(&copy);
    assert_eq!(
        (rec.hold, rec.kind),
        (
            42,
            RecordKind::Checkpoint {
                value: "up to 2026-11-29".into()
            }
        )
    );
    r.answer(copy.id, produced_at(57));
    assert!(
        matches!(r.checkpoints[..], [(1, Ok(()))]),
        "{:?}",
        r.checkpoints
    );
}

/// Requests the broker holds to a bound of its own (an acks=all Produce to its timeout, an
/// OffsetCommit to `offsets.commit.timeout.ms`) time out locally only after that bound, so the
/// broker's REQUEST_TIMED_OUT arrives rather than the connection being given up under them; the
/// commit goes to a connection of its own. Breaks if either local timeout were the request
/// timeout.
#[test]
fn requests_the_broker_holds_outlast_its_bound() {
    let mut r = Rig::new();
    r.membership_acquires(3);
    let acquired = r.last().clone();
    let Op::Produce { timeout, .. } = &acquired.op else {
        panic!("{acquired:?}")
    };
    assert!(acquired.timeout > *timeout, "{acquired:?}");
    r.answer(acquired.id, produced_at(42));
    let (view, now) = (r.view.clone(), r.t());
    r.l.checkpoint(1, "v".into(), &view, now);
    r.drain();
    let commit = r.last().clone();
    assert!(matches!(commit.op, Op::Commit { .. }));
    assert_eq!(commit.target, Target::Coordinator(broker(2)));
    assert!(commit.timeout > BROKER_COMMIT_TIMEOUT, "{commit:?}");
    // Held to the broker's bound and answered REQUEST_TIMED_OUT: retried, and stored.
    r.advance(BROKER_COMMIT_TIMEOUT);
    r.answer(commit.id, commit_answer(7));
    r.advance(Duration::from_secs(1));
    let retry = r.last().clone();
    assert!(matches!(retry.op, Op::Commit { .. }), "{retry:?}");
    r.answer(retry.id, commit_answer(0));
    let copy = r.last().id;
    r.answer(copy, produced_at(43));
    assert!(
        matches!(r.checkpoints[..], [(1, Ok(()))]),
        "{:?}",
        r.checkpoints
    );
}

/// A checkpoint reported stored is in the ledger too: when the group's copy is deleted or
/// expires, the ledger's is no older than any checkpoint reported stored. Breaks if the
/// checkpoint were reported stored once committed, with the copy best effort.
#[test]
fn a_checkpoint_whose_ledger_copy_fails_is_not_reported_stored() {
    // Refused by the ledger (MESSAGE_TOO_LARGE), or never acknowledged in time.
    for refused in [true, false] {
        let mut r = Rig::new();
        r.holding_at(42);
        let (view, now) = (r.view.clone(), r.t());
        r.l.checkpoint(1, "v".into(), &view, now);
        r.drain();
        let commit = r.last().clone();
        r.answer(commit.id, commit_answer(0));
        let copy = r.last().clone();
        assert!(matches!(
            appended(&copy).kind,
            RecordKind::Checkpoint { .. }
        ));
        if refused {
            r.answer(copy.id, produce_answer(10, -1));
        } else {
            r.answer(
                copy.id,
                Err(Error::Timeout {
                    op: "Produce".into(),
                    after: REQUEST,
                }),
            );
            r.advance(REQUEST * 3);
        }
        assert!(
            matches!(
                r.checkpoints[..],
                [(
                    1,
                    Err(Error::Ledger(LedgerError::CheckpointNotCopied { .. }))
                )]
            ),
            "refused {refused}: {:?}",
            r.checkpoints
        );
    }
}

/// The tail read of the last checkpoint stops only once no newer hold's checkpoint can lie below
/// what it read: a late copy of hold 10 above hold 20's copy does not settle it. Breaks if the
/// read stopped at the first window with any checkpoint of the lock.
#[test]
fn a_late_copy_of_an_older_hold_does_not_settle_the_tail_read() {
    let rec = |kind: RecordKind, hold: i64| record(kind, hold).encode();
    let acq = RecordKind::Acquired { lease_ms: 9000 };
    let cp = |v: &str| RecordKind::Checkpoint { value: v.into() };
    let all = [
        (10, rec(acq.clone(), -1)),
        (20, rec(acq, -1)),
        (25, rec(cp("new"), 20)),
        (5000, rec(cp("old, late"), 10)),
    ];
    let tail_from = |from: i64| {
        let values = all.iter().filter(|(o, _)| *o >= from);
        fold(values.map(|(o, v)| (*o, Some(&v[..]))), from, 5001)
    };
    // Only the late copy: hold 10's checkpoint, and offsets above 10 unread.
    let top = tail_from(2953);
    assert_eq!(top.last_checkpoint().map(|c| c.0), Some("old, late"));
    assert!(!tail_settles_checkpoint(&top));
    // Down to hold 20's copy: the newest hold's checkpoint, but offsets 11..=20 unread, where
    // hold 20's ACQUIRED lies, and no other newer one could.
    let below = tail_from(22);
    assert_eq!(
        below.last_checkpoint().map(|c| (c.0, c.1)),
        Some(("new", 20))
    );
    assert!(!tail_settles_checkpoint(&below));
    let settled = tail_from(21);
    assert!(tail_settles_checkpoint(&settled));
    assert_eq!(settled.last_checkpoint().map(|c| c.0), Some("new"));
    // Nothing found settles nothing.
    assert!(!tail_settles_checkpoint(&tail_from(5001)));
}

/// An OffsetCommit answer that says nothing of the ledger partition is the broker's answer to
/// another request: a protocol error, not a broker code the checkpoint could be retried on.
#[test]
fn a_commit_answer_without_the_ledger_partition_is_a_protocol_error() {
    let mut r = Rig::new();
    r.holding_at(42);
    let (view, now) = (r.view.clone(), r.t());
    r.l.checkpoint(1, "up to 2026-11-29".into(), &view, now);
    r.drain();
    let commit = r.last().clone();
    assert!(matches!(commit.op, Op::Commit { .. }), "{commit:?}");
    let resp =
        OffsetCommitResponse::default().with_topics(vec![OffsetCommitResponseTopic::default()
            .with_name(StrBytes::from_static_str(TOPIC).into())
            .with_partitions(vec![
                OffsetCommitResponsePartition::default().with_partition_index(1)
            ])]);
    r.answer(commit.id, Ok((Response::OffsetCommit(resp), 9)));
    assert!(
        matches!(&r.checkpoints[..], [(1, Err(Error::Protocol(_)))]),
        "{:?}",
        r.checkpoints
    );
}

#[test]
fn a_fenced_checkpoint_is_an_error_and_the_membership_heartbeats() {
    for code in [25, 82] {
        let mut r = Rig::new();
        r.holding_at(42);
        let (view, now) = (r.view.clone(), r.t());
        r.l.checkpoint(1, "v".into(), &view, now);
        r.drain();
        let t = r.last().clone();
        let sent = r.sent.len();
        r.answer(t.id, commit_answer(code));
        let [(1, Err(Error::Broker { code: c, .. }))] = &r.checkpoints[..] else {
            panic!("{:?}", r.checkpoints)
        };
        assert_eq!(c.0, code);
        assert_eq!(r.commands, [Command::HeartbeatNow]);
        assert_eq!(
            r.sent.len(),
            sent,
            "no ledger record for a rejected checkpoint"
        );
    }
}

/// While the membership looks the coordinator up again, a checkpoint waits a backoff before it
/// tries again: a retry already due would wake the driver in a loop until the coordinator is
/// known.
#[test]
fn a_checkpoint_without_a_coordinator_is_retried_after_a_backoff() {
    let mut r = Rig::new();
    r.holding_at(42);
    r.view.coordinator = None;
    let sent = r.sent.len();
    let (view, now) = (r.view.clone(), r.t());
    r.l.checkpoint(1, "v".into(), &view, now);
    r.drain();
    assert_eq!(r.sent.len(), sent, "{:?}", &r.sent[sent..]);
    let at = r.l.poll_timeout().expect("the retry is scheduled");
    assert!(at > r.now, "the retry is due at once");
    r.view.coordinator = Some(broker(2));
    r.advance(Duration::from_millis(100));
    assert!(matches!(r.last().op, Op::Commit { .. }), "{:?}", r.last());
}

#[test]
fn a_checkpoint_during_a_rebalance_is_retried_with_the_new_generation() {
    let mut r = Rig::new();
    r.holding_at(42);
    let (view, now) = (r.view.clone(), r.t());
    r.l.checkpoint(1, "v".into(), &view, now);
    r.drain();
    let t = r.last().clone();
    r.answer(t.id, commit_answer(27));
    assert!(r.checkpoints.is_empty());
    r.view.generation = 4;
    r.advance(Duration::from_millis(100));
    let t = r.last().clone();
    assert!(matches!(t.op, Op::Commit { generation: 4, .. }), "{t:?}");
    r.answer(t.id, commit_answer(0));
    let copy = r.last().id;
    r.answer(copy, produced_at(43));
    assert!(matches!(r.checkpoints[..], [(1, Ok(()))]));
}

/// The fault suite's finding: a holder kept the lock through a rebalance, and its checkpoint,
/// sent at the old generation, met ILLEGAL_GENERATION from a group already at the next one. The
/// same hold goes on, so the checkpoint is stored at the generation the SyncGroup answer named
/// us in, not reported fenced.
#[test]
fn a_checkpoint_refused_for_an_old_generation_is_stored_when_the_same_hold_continues() {
    let mut r = Rig::new();
    r.holding_at(42);
    let (view, now) = (r.view.clone(), r.t());
    r.l.checkpoint(1, "v".into(), &view, now);
    r.drain();
    let t = r.last().clone();
    assert!(matches!(t.op, Op::Commit { generation: 3, .. }), "{t:?}");
    r.commands.clear();
    r.answer(t.id, commit_answer(22));
    assert!(r.checkpoints.is_empty(), "{:?}", r.checkpoints);
    assert_eq!(r.commands, [Command::HeartbeatNow]);
    // The JoinGroup answer of generation 4: who holds it is not known yet.
    r.view.generation = 4;
    r.view.awaiting_sync = true;
    let sent = r.sent.len();
    r.advance(RETRY_MAX * 2);
    assert_eq!(r.sent.len(), sent, "{:?}", &r.sent[sent..]);
    // The SyncGroup answer names us again.
    r.view.awaiting_sync = false;
    r.advance(RETRY_MAX * 2);
    let t = r.last().clone();
    assert!(matches!(t.op, Op::Commit { generation: 4, .. }), "{t:?}");
    r.answer(t.id, commit_answer(0));
    let copy = r.last().id;
    r.answer(copy, produced_at(43));
    assert!(
        matches!(r.checkpoints[..], [(1, Ok(()))]),
        "{:?}",
        r.checkpoints
    );
}

/// The same refusal when the hold ends instead (the SyncGroup answer named someone else):
/// the checkpoint was not stored and the lock is not held.
#[test]
fn a_checkpoint_refused_for_an_old_generation_is_not_held_when_the_hold_ends() {
    let mut r = Rig::new();
    r.holding_at(42);
    let (view, now) = (r.view.clone(), r.t());
    r.l.checkpoint(1, "v".into(), &view, now);
    r.drain();
    let t = r.last().clone();
    r.answer(t.id, commit_answer(22));
    assert!(r.checkpoints.is_empty(), "{:?}", r.checkpoints);
    r.view = MemberView::default();
    let lease_end = r.now;
    r.member(Event::Lost {
        reason: LossReason::Reassigned,
        lease_end,
    });
    r.advance(RETRY_MAX * 2);
    let [(1, Err(e))] = &r.checkpoints[..] else {
        panic!("{:?}", r.checkpoints)
    };
    assert!(e.to_string().contains("not held"), "{e}");
    let commits = r
        .sent
        .iter()
        .filter(|t| matches!(t.op, Op::Commit { .. }))
        .count();
    assert_eq!(commits, 1);
}

/// Between the JoinGroup answer of a new generation and the SyncGroup answer that says who
/// holds it, no commit goes out: once the group is Stable, Apache takes a commit from any member
/// of the current generation, and this one may no longer be the holder.
#[test]
fn no_commit_is_sent_between_a_new_generations_join_and_sync_answers() {
    let mut r = Rig::new();
    r.holding_at(42);
    r.view.generation = 4;
    r.view.awaiting_sync = true;
    let sent = r.sent.len();
    let (view, now) = (r.view.clone(), r.t());
    r.l.checkpoint(1, "v".into(), &view, now);
    r.drain();
    r.advance(RETRY_MAX * 2);
    assert_eq!(r.sent.len(), sent, "{:?}", &r.sent[sent..]);
    r.view.awaiting_sync = false;
    r.advance(RETRY_MAX * 2);
    let t = r.last().clone();
    assert!(matches!(t.op, Op::Commit { generation: 4, .. }), "{t:?}");
}

#[test]
fn a_checkpoint_with_a_nul_is_refused_locally() {
    let mut r = Rig::new();
    r.holding_at(42);
    let (view, now) = (r.view.clone(), r.t());
    let sent = r.sent.len();
    r.l.checkpoint(1, "ab\0cd".into(), &view, now);
    r.drain();
    assert!(
        matches!(
            r.checkpoints[..],
            [(
                1,
                Err(Error::Ledger(LedgerError::CheckpointHasNul { at: 2 }))
            )]
        ),
        "{:?}",
        r.checkpoints
    );
    assert_eq!(r.sent.len(), sent, "nothing is sent");
}

#[test]
fn checkpoints_are_refused_locally_when_too_large_or_not_held() {
    let mut r = Rig::new();
    r.holding_at(42);
    let (view, now) = (r.view.clone(), r.t());
    let sent = r.sent.len();
    r.l.checkpoint(1, "x".repeat(4097), &view, now);
    r.l.checkpoint(2, "x".repeat(4096), &view, now);
    r.drain();
    assert!(
        matches!(
            r.checkpoints[..],
            [(
                1,
                Err(Error::Ledger(LedgerError::CheckpointTooLarge {
                    len: 4097,
                    max: 4096
                }))
            )]
        ),
        "{:?}",
        r.checkpoints
    );
    assert_eq!(
        r.sent.len(),
        sent + 1,
        "only the one within the limit is sent"
    );

    let mut r = Rig::new();
    let (view, now) = (r.view.clone(), r.t());
    r.l.checkpoint(1, "v".into(), &view, now);
    r.drain();
    assert!(matches!(
        r.checkpoints[..],
        [(1, Err(Error::Ledger(LedgerError::NotHeld { .. })))]
    ));
}

#[test]
fn a_pending_checkpoint_fails_when_the_hold_ends() {
    let mut r = Rig::new();
    r.holding_at(42);
    let (view, now) = (r.view.clone(), r.t());
    r.l.checkpoint(1, "v".into(), &view, now);
    r.drain();
    let t = r.last().clone();
    r.answer(t.id, commit_answer(27));
    r.view.holding = false;
    let lease_end = r.now;
    r.member(Event::Lost {
        reason: LossReason::LeaseExpired,
        lease_end,
    });
    assert!(matches!(
        r.checkpoints[..],
        [(1, Err(Error::Ledger(LedgerError::NotHeld { .. })))]
    ));
}

// ---- answers matched to the request that was sent ------------------------------------------------

#[test]
fn a_reacquire_while_the_previous_end_record_is_in_flight_gets_its_own_acquired() {
    let mut r = Rig::new();
    r.holding_at(10);
    r.view.holding = false;
    let lease_end = r.now;
    r.member(Event::Lost {
        reason: LossReason::Revoked,
        lease_end,
    });
    let lost = r.last().clone();
    assert!(matches!(appended(&lost).kind, RecordKind::Lost { .. }));
    // Eager mode: the lock comes back while the LOST record is still on its way.
    r.membership_acquires(5);
    r.answer(lost.id, produced_at(11));
    assert!(
        !r.events.iter().any(|e| matches!(e,
            Event::Acquired { token, .. } if token.ledger_offset == Some(11))),
        "{:?}",
        r.events
    );
    r.hold_begins_with_acquired(5, 12);
    // The LOST record went out once.
    let losts = r
        .sent
        .iter()
        .filter(|t| matches!(t.op, Op::Produce { .. }))
        .filter(|t| matches!(appended(t).kind, RecordKind::Lost { .. }))
        .count();
    assert_eq!(losts, 1);
}

#[test]
fn an_old_tries_acquired_answer_is_not_the_new_holds_token() {
    let mut r = Rig::new();
    r.membership_acquires(3);
    let old = r.last().clone();
    r.view.holding = false;
    let lease_end = r.now;
    r.member(Event::Lost {
        reason: LossReason::Revoked,
        lease_end,
    });
    r.membership_acquires(5);
    r.answer(old.id, produced_at(10));
    assert!(
        !r.events.iter().any(|e| matches!(e, Event::Acquired { .. })),
        "{:?}",
        r.events
    );
    // The new try's own ACQUIRED goes next, and the old one is never sent again.
    r.hold_begins_with_acquired(5, 11);
    // Offset 10 names no hold: a LOST record says so.
    let marker = r.last().clone();
    let rec = appended(&marker);
    assert!(
        matches!(rec.kind, RecordKind::Lost { .. }) && rec.hold == 10 && rec.generation == 3,
        "{rec:?}"
    );
    let acquireds = r
        .sent
        .iter()
        .filter(|t| matches!(t.op, Op::Produce { .. }))
        .filter(|t| matches!(appended(t).kind, RecordKind::Acquired { .. }))
        .count();
    assert_eq!(acquireds, 2);
}

/// An earlier try's ACQUIRED answer that arrives once a later try has ended too is still the
/// earlier try's: a LOST record in that try's generation says its offset names no hold, at once,
/// and the later try, whose record never went out, has no offset to name.
#[test]
fn an_old_tries_acquired_answer_after_the_next_try_ended_is_marked_as_the_old_tries() {
    let mut r = Rig::new();
    r.membership_acquires(3);
    let old = r.last().clone();
    r.view.holding = false;
    let lease_end = r.now;
    r.member(Event::Lost {
        reason: LossReason::Revoked,
        lease_end,
    });
    r.membership_acquires(5);
    // The caller gives up before the new try's record could go out.
    r.member(Event::Released);
    let sent = r.sent.len();
    r.answer(old.id, produced_at(10));
    assert_eq!(r.sent.len(), sent + 1, "{:?}", &r.sent[sent..]);
    let rec = appended(r.last());
    assert!(
        matches!(rec.kind, RecordKind::Lost { .. }) && rec.hold == 10 && rec.generation == 3,
        "{rec:?}"
    );
}

#[test]
fn an_old_commit_answer_does_not_complete_a_new_checkpoint() {
    let mut r = Rig::new();
    r.holding_at(10);
    let (v, n) = (r.view.clone(), r.t());
    r.l.checkpoint(1, "c1".into(), &v, n);
    r.drain();
    let c1 = r.last().clone();
    assert!(matches!(c1.op, Op::Commit { .. }));
    r.view.holding = false;
    let le = r.now;
    r.member(Event::Lost {
        reason: LossReason::Revoked,
        lease_end: le,
    });
    let lost = r.last().clone();
    r.answer(lost.id, produced_at(11));
    r.membership_acquires(5);
    let acq = r.last().clone();
    r.answer(acq.id, produced_at(12));
    let (v, n) = (r.view.clone(), r.t());
    r.l.checkpoint(2, "c2".into(), &v, n);
    r.drain();
    r.answer(c1.id, commit_answer(0));
    // The broker took c1 while hold 10 was current: it is stored once its copy, naming hold 10,
    // is in the ledger.
    let copy = r
        .sent
        .iter()
        .rev()
        .find(|t| {
            matches!(t.op, Op::Produce { .. })
                && matches!(appended(t).kind, RecordKind::Checkpoint { .. })
        })
        .expect("c1's copy is sent")
        .id;
    r.answer(copy, produced_at(13));
    assert!(
        !r.checkpoints.iter().any(|(t, res)| *t == 2 && res.is_ok()),
        "{:?}",
        r.checkpoints
    );
    assert!(
        r.checkpoints.iter().any(|(t, res)| *t == 1 && res.is_ok()),
        "{:?}",
        r.checkpoints
    );
    let copies: Vec<LedgerRecord> = r
        .sent
        .iter()
        .filter(|t| matches!(t.op, Op::Produce { .. }))
        .map(appended)
        .filter(|rec| matches!(rec.kind, RecordKind::Checkpoint { .. }))
        .collect();
    assert!(
        copies.iter().all(|c| c.hold == 10
            && matches!(&c.kind, RecordKind::Checkpoint { value } if value == "c1")),
        "{copies:?}"
    );
    // c2 is sent on its own.
    assert!(r.sent.iter().any(
        |t| matches!(&t.op, Op::Commit { metadata, offset, generation, .. }
            if metadata == "c2" && *offset == 12 && *generation == 5)
    ));
}

#[test]
fn an_acquired_attempt_is_not_retried_after_the_hold_was_given_up() {
    let mut r = Rig::new();
    r.membership_acquires(3);
    let first = r.last().clone();
    // The append deadline passes with the attempt still in flight.
    r.advance(REQUEST * 2 + Duration::from_millis(1));
    assert!(matches!(
        r.events.last(),
        Some(Event::Lost {
            reason: LossReason::Ledger,
            ..
        })
    ));
    r.answer(first.id, produce_answer(19, -1)); // NOT_ENOUGH_REPLICAS: retriable
    r.membership_leaves();
    let n = r.sent.len();
    r.advance(Duration::from_secs(60));
    assert!(
        r.sent[n..]
            .iter()
            .all(|t| !matches!(t.op, Op::Produce { .. })),
        "ACQUIRED re-sent after Left: {:?}",
        &r.sent[n..]
    );
    assert!(r.l.is_done());
    assert!(
        matches!(r.events.last(), Some(Event::Left { .. })),
        "{:?}",
        r.events
    );
}

#[test]
fn no_acquired_record_goes_out_once_the_lease_has_ended() {
    let mut r = Rig::new();
    r.membership_acquires(3);
    let id = r.last().id;
    r.answer(id, produce_answer(19, -1)); // NOT_ENOUGH_REPLICAS: retried after a backoff
                                          // The lease ends before the retry is due; the membership has not said so to the ledger yet
                                          // (the driver wakes the membership first, then the ledger, with the membership's view).
    r.view.holding = false;
    let n = r.sent.len();
    r.advance(Duration::from_secs(1));
    assert!(
        r.sent[n..]
            .iter()
            .all(|t| !matches!(t.op, Op::Produce { .. })),
        "{:?}",
        &r.sent[n..]
    );
    let lease_end = r.now;
    r.member(Event::Lost {
        reason: LossReason::LeaseExpired,
        lease_end,
    });
    r.membership_leaves();
    r.advance(Duration::from_secs(30));
    assert!(r.sent[n..]
        .iter()
        .all(|t| !matches!(t.op, Op::Produce { .. })));
    assert!(r.l.is_done());
}

fn metadata_with_id(id: Uuid) -> Result<(Response, i16), Error> {
    let resp = MetadataResponse::default()
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(BrokerId(1))
            .with_host(StrBytes::from_static_str("127.0.0.1"))
            .with_port(9091)])
        .with_topics(vec![MetadataResponseTopic::default()
            .with_name(Some(StrBytes::from_static_str(TOPIC).into()))
            .with_topic_id(id)
            .with_partitions(vec![MetadataResponsePartition::default()
                .with_partition_index(0)
                .with_leader_id(BrokerId(1))])]);
    Ok((Response::Metadata(resp), 12))
}

#[test]
fn a_ledger_topic_created_again_is_refused_mid_session() {
    let mut r = Rig::new();
    let backoff = Backoff::with_rng(
        Duration::from_millis(100),
        Duration::from_secs(1),
        2.0,
        0.0,
        || 0.0,
    );
    let first = Uuid::from_u128(0x1111);
    r.l = Ledger::new(
        config(),
        Some(Partition {
            leader: broker(1),
            topic_id: first,
        }),
        backoff,
    );
    r.membership_acquires(3);
    let id = r.last().id;
    r.answer(id, produce_answer(6, -1)); // NOT_LEADER_OR_FOLLOWER: look the leader up again
    r.advance(Duration::from_millis(100));
    let meta = r.last().clone();
    assert!(matches!(meta.op, Op::Metadata { .. }));
    // The topic was deleted and created again: same name, new id, offsets from 0.
    r.answer(meta.id, metadata_with_id(Uuid::from_u128(0x2222)));
    assert!(
        matches!(
            r.events.last(),
            Some(Event::Failed(e)) if matches!(**e, Error::Ledger(LedgerError::TopicReplaced { .. }))
        ),
        "{:?}",
        r.events
    );
    assert!(!r.events.iter().any(|e| matches!(e, Event::Acquired { .. })));
    assert!(r.commands.contains(&Command::Leave));
    // The same id again is fine.
    let mut r2 = Rig::new();
    let backoff = Backoff::with_rng(
        Duration::from_millis(100),
        Duration::from_secs(1),
        2.0,
        0.0,
        || 0.0,
    );
    r2.l = Ledger::new(
        config(),
        Some(Partition {
            leader: broker(1),
            topic_id: first,
        }),
        backoff,
    );
    r2.membership_acquires(3);
    let id = r2.last().id;
    r2.answer(id, produce_answer(6, -1));
    r2.advance(Duration::from_millis(100));
    let meta = r2.last().clone();
    r2.answer(meta.id, metadata_with_id(first));
    let again = r2.last().clone();
    r2.answer(again.id, produced_at(7));
    assert!(matches!(r2.events.last(), Some(Event::Acquired { .. })));
}

/// The topic's id is learnt from the first Metadata answer that carries one (v10 on): a later
/// answer with another id is a topic deleted and created again, refused; an answer without an
/// id (an older broker's) neither sets it nor changes it.
#[test]
fn the_ledger_topics_id_is_learnt_from_the_first_answer_that_has_one() {
    let (a, b, none) = (
        Uuid::from_u128(0x1111),
        Uuid::from_u128(0x2222),
        Uuid::nil(),
    );
    for (first, then, refused) in [
        (a, b, true),
        (a, a, false),
        (a, none, false),
        (none, b, false),
    ] {
        let case = format!("{first:?} then {then:?}");
        let mut r = Rig::new();
        let backoff = Backoff::with_rng(REQUEST / 50, RETRY_MAX, 2.0, 0.0, || 0.0);
        r.l = Ledger::new(config(), None, backoff);
        r.membership_acquires(3);
        let meta = r.last().clone();
        assert!(matches!(meta.op, Op::Metadata { .. }), "{case}: {meta:?}");
        r.answer(meta.id, metadata_with_id(first));
        let append = r.last().clone();
        r.answer(append.id, produce_answer(6, -1)); // NOT_LEADER_OR_FOLLOWER: look it up again
        r.advance(REQUEST / 50);
        let meta = r.last().clone();
        assert!(matches!(meta.op, Op::Metadata { .. }), "{case}: {meta:?}");
        r.answer(meta.id, metadata_with_id(then));
        let replaced = r.events.iter().any(|e| {
            matches!(e, Event::Failed(e) if matches!(**e, Error::Ledger(LedgerError::TopicReplaced { .. })))
        });
        assert_eq!(replaced, refused, "{case}: {:?}", r.events);
        if !refused {
            r.hold_begins_with_acquired(3, 7);
        }
    }
}

#[test]
fn an_eager_revocation_before_the_hold_began_is_no_loss_to_the_users() {
    let mut r = Rig::new();
    r.membership_acquires(3);
    let first = r.last().clone();
    r.view.holding = false;
    let lease_end = r.now;
    r.member(Event::Lost {
        reason: LossReason::Revoked,
        lease_end,
    });
    assert!(
        !r.events.iter().any(|e| matches!(e, Event::Lost { .. })),
        "{:?}",
        r.events
    );
    // The try's record, acknowledged late, is marked as naming no hold.
    r.answer(first.id, produced_at(4));
    let marker = r.last().clone();
    let rec = appended(&marker);
    assert!(
        matches!(rec.kind, RecordKind::Lost { .. }) && rec.hold == 4,
        "{rec:?}"
    );
    // The lock comes back (its ACQUIRED waits for the marker's answer): the users' first hold.
    r.membership_acquires(4);
    r.answer(marker.id, produced_at(5));
    let acq = r.last().clone();
    assert!(matches!(appended(&acq).kind, RecordKind::Acquired { .. }));
    r.answer(acq.id, produced_at(6));
    assert!(
        matches!(r.events[..], [Event::Acquired { ref token, .. }] if token.ledger_offset == Some(6)),
        "{:?}",
        r.events
    );
}

#[test]
fn a_checkpoint_unanswered_when_the_hold_ends_is_of_unknown_outcome() {
    let mut r = Rig::new();
    r.holding_at(42);
    let (view, now) = (r.view.clone(), r.t());
    r.l.checkpoint(1, "v".into(), &view, now);
    r.drain();
    let sent = r.last().clone();
    assert!(matches!(sent.op, Op::Commit { .. }));
    r.view.holding = false;
    let lease_end = r.now;
    r.member(Event::Lost {
        reason: LossReason::LeaseExpired,
        lease_end,
    });
    // The hold ended, but the broker may already have taken the commit: nothing is said yet.
    assert!(r.checkpoints.is_empty(), "{:?}", r.checkpoints);
    r.membership_leaves();
    assert!(!r.l.is_done());
    r.answer(
        sent.id,
        Err(Error::Timeout {
            op: "OffsetCommit".into(),
            after: REQUEST,
        }),
    );
    assert!(
        matches!(
            r.checkpoints[..],
            [(1, Err(Error::Ledger(LedgerError::CheckpointUnknown { .. })))]
        ),
        "{:?}",
        r.checkpoints
    );
}

// ---- the token's order ----------------------------------------------------------------------------

#[test]
fn ledger_offsets_order_tokens_before_generations() {
    let t = |offset: Option<i64>, generation: i32, member: &str| FencingToken {
        ledger_offset: offset,
        generation,
        member_id: member.into(),
    };
    // After a group deletion the generation starts again at 1; the offset does not.
    assert!(t(Some(10), 1, "b") > t(Some(9), 7, "a"));
    // Within one hold, a rebalance raises the generation and keeps the offset.
    assert!(t(Some(9), 8, "a") > t(Some(9), 7, "a"));
    // Without a ledger the generation decides.
    assert!(t(None, 8, "a") > t(None, 7, "b"));
    assert!(t(None, 100, "a") < t(Some(0), 1, "a"));
    assert_eq!(t(Some(10), 1, "b").to_string(), "10");
    assert_eq!(t(None, 7, "b").to_string(), "7");
}

// ---- the record format --------------------------------------------------------------------------

#[test]
fn records_round_trip_every_kind() {
    for (kind, hold) in [
        (RecordKind::Acquired { lease_ms: 9000 }, -1),
        (RecordKind::Released { held_ms: 12 }, 4),
        (
            RecordKind::Lost {
                held_ms: 3,
                reason: "fenced".into(),
                detail: "UNKNOWN_MEMBER_ID".into(),
            },
            4,
        ),
        (
            RecordKind::Checkpoint {
                value: "2026-11-29 ✓".into(),
            },
            4,
        ),
    ] {
        let rec = LedgerRecord {
            unix_ms: 1_800_000_000_123,
            hold,
            generation: 7,
            member_id: "kafka-lock-0f0e".into(),
            label: Some("job".into()),
            host: None,
            pid: Some(1),
            slot: 0,
            kind,
        };
        let bytes = rec.encode();
        assert_eq!(bytes[0], 1, "a slot-0 record keeps version 1");
        assert_eq!(LedgerRecord::decode(&bytes), Ok(rec));
    }
}

#[test]
fn bad_records_are_typed_errors() {
    let good = record(RecordKind::Released { held_ms: 1 }, 4).encode();
    let with = |at: usize, b: u8| {
        let mut v = good.to_vec();
        v[at] = b;
        v
    };
    assert!(matches!(
        LedgerRecord::decode(&[]),
        Err(RecordError::Truncated { .. })
    ));
    assert_eq!(
        LedgerRecord::decode(&with(0, 3)),
        Err(RecordError::UnsupportedVersion(3))
    );
    assert_eq!(
        LedgerRecord::decode(&with(0, 0)),
        Err(RecordError::UnsupportedVersion(0))
    );
    assert_eq!(
        LedgerRecord::decode(&with(1, 9)),
        Err(RecordError::UnknownKind(9))
    );
    let mut long = good.to_vec();
    long.push(0);
    assert_eq!(
        LedgerRecord::decode(&long),
        Err(RecordError::TrailingBytes { len: 1 })
    );
    for cut in 0..good.len() {
        assert!(
            LedgerRecord::decode(&good[..cut]).is_err(),
            "a record cut at {cut} decoded"
        );
    }
    // An end record must name its hold; an ACQUIRED record must not.
    let no_hold = record(RecordKind::Released { held_ms: 1 }, -1).encode();
    assert!(matches!(
        LedgerRecord::decode(&no_hold),
        Err(RecordError::OutOfRange { .. })
    ));
    let acquired_with_hold = record(RecordKind::Acquired { lease_ms: 1 }, 3).encode();
    assert!(matches!(
        LedgerRecord::decode(&acquired_with_hold),
        Err(RecordError::OutOfRange { .. })
    ));
    // A label longer than its bound is refused before its bytes are looked at.
    let mut v = good[..22].to_vec();
    v.extend_from_slice(&[0, 1, b'm']); // member id "m"
    v.extend_from_slice(&[0x7f, 0xfe]); // label of 32766 bytes
    assert!(matches!(
        LedgerRecord::decode(&v),
        Err(RecordError::TooLong {
            what: "the label",
            ..
        })
    ));
    let mut v = good[..22].to_vec();
    v.extend_from_slice(&[0, 1, 0xff]);
    assert!(matches!(
        LedgerRecord::decode(&v),
        Err(RecordError::InvalidUtf8 { .. })
    ));
}

#[test]
fn over_long_text_is_cut_when_encoding() {
    let mut rec = record(RecordKind::Acquired { lease_ms: 1 }, -1);
    rec.label = Some("é".repeat(300));
    let back = LedgerRecord::decode(&rec.encode()).unwrap();
    assert!(back.label.as_ref().unwrap().len() <= MAX_LABEL);
}

// ---- history --------------------------------------------------------------------------------------

fn rec(member: &str, generation: i32, unix_ms: i64, kind: RecordKind, hold: i64) -> Bytes {
    LedgerRecord {
        unix_ms,
        hold,
        generation,
        member_id: member.into(),
        label: None,
        host: Some("h".into()),
        pid: Some(1),
        slot: 0,
        kind,
    }
    .encode()
}

#[test]
fn history_tells_how_each_hold_ended() {
    let acq = RecordKind::Acquired { lease_ms: 9000 };
    let values: Vec<(i64, Bytes)> = vec![
        (3, rec("a", 1, 1_000, acq.clone(), -1)),
        (
            4,
            rec(
                "a",
                1,
                1_500,
                RecordKind::Checkpoint { value: "c1".into() },
                3,
            ),
        ),
        (
            5,
            rec("a", 1, 2_000, RecordKind::Released { held_ms: 1000 }, 3),
        ),
        // b was SIGKILLed: no end record, and c took over later.
        (7, rec("b", 2, 3_000, acq.clone(), -1)),
        // c's first append was retried; the second one is the hold.
        (9, rec("c", 1, 20_000, acq.clone(), -1)),
        (10, rec("c", 1, 20_050, acq.clone(), -1)),
        (
            11,
            rec(
                "c",
                1,
                25_000,
                RecordKind::Lost {
                    held_ms: 4950,
                    reason: "lease_expired".into(),
                    detail: "paused".into(),
                },
                10,
            ),
        ),
        // A second end record for one hold changes nothing.
        (
            12,
            rec("c", 1, 26_000, RecordKind::Released { held_ms: 1 }, 10),
        ),
        (13, Bytes::from_static(b"\x09garbage")),
        (14, rec("d", 2, 30_000, acq, -1)),
    ];
    let h = fold(values.iter().map(|(o, v)| (*o, Some(&v[..]))), 3, 15);
    let ends: Vec<(i64, &str)> = h.holds.iter().map(|x| (x.token, x.end.name())).collect();
    assert_eq!(
        ends,
        [
            (3, "released"),
            (7, "silent"),
            (9, "retried"),
            (10, "lost"),
            (14, "open")
        ]
    );
    assert_eq!(h.holds[0].checkpoint, Some(("c1".into(), 1_500)));
    assert_eq!(
        h.holds[1].end,
        HoldEnd::Silent {
            next_token: 9,
            before_unix_ms: Some(20_000)
        }
    );
    assert_eq!(h.unreadable.len(), 1);
    assert_eq!(h.unreadable[0].offset, 13);
    assert_eq!(h.last_checkpoint(), Some(("c1", 3, 1_500)));
    assert_eq!(h.last_hold().map(|x| x.token), Some(14));
    let since: Vec<i64> = h.since(21_000).iter().map(|x| x.token).collect();
    assert_eq!(since, [10, 14]);
}

#[test]
fn history_keeps_holds_whose_acquired_record_is_gone() {
    let values = [(
        20,
        rec("a", 4, 5_000, RecordKind::Released { held_ms: 10 }, 12),
    )];
    let h = fold(values.iter().map(|(o, v)| (*o, Some(&v[..]))), 20, 21);
    assert_eq!(h.holds.len(), 1);
    assert_eq!(h.holds[0].token, 12);
    assert_eq!(h.holds[0].acquired_unix_ms, None);
    assert!(matches!(h.holds[0].end, HoldEnd::Released { .. }));
}

#[test]
fn fuzz_entry_survives_edge_inputs() {
    let good = rec("a", 1, 1, RecordKind::Released { held_ms: 1 }, 3);
    for input in [&b""[..], &[0u8; 64][..], &[1u8; 64][..], &good[..]] {
        fuzz_ledger_bytes(input);
    }
}

proptest::proptest! {
    #[test]
    fn decoding_never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
        fuzz_ledger_bytes(&data);
    }
}

/// The example in docs/protocol.md ("The ledger").
#[test]
fn the_documented_example_decodes() {
    let bytes = [
        0x01, 0x02, 0x00, 0x00, 0x01, 0xa3, 0x18, 0x5c, 0x50, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x03, 0x00, 0x03, 0x6d, 0x2d, 0x31, 0xff, 0xff, 0x00,
        0x01, 0x68, 0x00, 0x00, 0x00, 0x2a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, 0xdc,
    ];
    let want = LedgerRecord {
        unix_ms: 1_800_000_000_000,
        hold: 7,
        generation: 3,
        member_id: "m-1".into(),
        label: None,
        host: Some("h".into()),
        pid: Some(42),
        slot: 0,
        kind: RecordKind::Released { held_ms: 1500 },
    };
    assert_eq!(LedgerRecord::decode(&bytes), Ok(want.clone()));
    assert_eq!(&want.encode()[..], &bytes[..]);
}

// ---- permit slots ---------------------------------------------------------------------------

fn rec_in(member: &str, slot: u16, unix_ms: i64, kind: RecordKind, hold: i64) -> Bytes {
    let mut r = LedgerRecord::decode(&rec(member, 1, unix_ms, kind, hold)).unwrap();
    r.slot = slot;
    r.encode()
}

#[test]
fn a_record_of_a_slot_above_0_is_version_2_with_the_slot_last() {
    let mut r = record(RecordKind::Released { held_ms: 1500 }, 7);
    let v1 = r.encode();
    assert_eq!(v1[0], 1);
    r.slot = 3;
    let v2 = r.encode();
    assert_eq!(v2[0], 2);
    assert_eq!(
        &v2[1..v2.len() - 2],
        &v1[1..],
        "the version 1 fields, unchanged"
    );
    assert_eq!(&v2[v2.len() - 2..], &[0, 3]);
    assert_eq!(LedgerRecord::decode(&v2), Ok(r.clone()));
    // Version 1 is slot 0, and has no room for one.
    assert_eq!(LedgerRecord::decode(&v1).map(|r| r.slot), Ok(0));
    let mut long = v1.to_vec();
    long.extend_from_slice(&[0, 3]);
    assert_eq!(
        LedgerRecord::decode(&long),
        Err(RecordError::TrailingBytes { len: 2 })
    );
    // A slot no lock can have, a missing slot, a version after 2.
    let mut bad = v2.to_vec();
    let n = bad.len();
    bad[n - 2..].copy_from_slice(&crate::assign::MAX_PERMITS.to_be_bytes());
    assert!(matches!(
        LedgerRecord::decode(&bad),
        Err(RecordError::OutOfRange {
            what: "the permit slot",
            ..
        })
    ));
    assert!(matches!(
        LedgerRecord::decode(&v2[..v2.len() - 1]),
        Err(RecordError::Truncated { .. })
    ));
    let mut v3 = v2.to_vec();
    v3[0] = 3;
    assert_eq!(
        LedgerRecord::decode(&v3),
        Err(RecordError::UnsupportedVersion(3))
    );
}

#[test]
fn history_folds_each_slot_apart() {
    let acq = || RecordKind::Acquired { lease_ms: 9000 };
    let released = || RecordKind::Released { held_ms: 10 };
    let values: Vec<(i64, Bytes)> = vec![
        // Two permits held at once: neither ended silently because the other began.
        (1, rec_in("a", 0, 1_000, acq(), -1)),
        (2, rec_in("b", 1, 1_100, acq(), -1)),
        (3, rec_in("a", 0, 2_000, released(), 1)),
        // c takes slot 0; b (slot 1) was killed and d took its slot later.
        (4, rec_in("c", 0, 2_100, acq(), -1)),
        (5, rec_in("d", 1, 3_000, acq(), -1)),
        (6, rec_in("d", 1, 3_500, released(), 5)),
    ];
    let h = fold(values.iter().map(|(o, v)| (*o, Some(&v[..]))), 1, 7);
    let ends: Vec<(i64, u16, &str)> = h
        .holds
        .iter()
        .map(|x| (x.token, x.slot, x.end.name()))
        .collect();
    assert_eq!(
        ends,
        [
            (1, 0, "released"),
            (2, 1, "silent"),
            (4, 0, "open"),
            (5, 1, "released")
        ]
    );
    assert_eq!(
        h.holds[1].end,
        HoldEnd::Silent {
            next_token: 5,
            before_unix_ms: Some(3_000)
        }
    );
}

#[test]
fn every_record_of_a_hold_names_its_slot() {
    let mut r = Rig::new();
    r.view.holding = true;
    r.view.lease_end = Some(r.now + LEASE);
    let lease_end = r.now + LEASE;
    r.member(Event::Acquired {
        token: token(3),
        lease_end,
        permit: 2,
    });
    let t = r.last().clone();
    assert_eq!(appended(&t).slot, 2);
    r.answer(t.id, produced_at(42));
    assert!(matches!(
        r.events.last(),
        Some(Event::Acquired { permit: 2, .. })
    ));
    r.member(Event::Released);
    r.membership_leaves();
    let end = appended(r.last());
    assert_eq!((end.kind.name(), end.hold, end.slot), ("released", 42, 2));
}

// ---- the lease clock and the fenced commit, each on its own -------------------------------------

/// The membership's timer fires a little after the lease end (tokio timers are up to a
/// millisecond late, a loaded machine later still): the ledger may see the ACQUIRED record's
/// acknowledgement while the membership still reports holding past its lease. The lease clock
/// alone must then refuse the hold.
#[test]
fn an_ack_after_the_lease_end_is_refused_while_the_membership_still_says_holding() {
    for late in [
        Duration::ZERO,
        Duration::from_millis(1),
        Duration::from_secs(2),
    ] {
        let mut r = Rig::new();
        r.membership_acquires(3);
        let t = r.last().clone();
        r.advance(LEASE + late);
        assert!(
            r.view.holding,
            "the membership has not noticed the lease end"
        );
        r.answer(t.id, produced_at(42));
        assert!(
            !r.events.iter().any(|e| matches!(e, Event::Acquired { .. })),
            "an ACQUIRED acknowledged {late:?} after the lease end began a hold: {:?}",
            r.events
        );
        assert!(
            matches!(
                r.events.last(),
                Some(Event::Lost {
                    reason: LossReason::Ledger,
                    ..
                })
            ),
            "{:?}",
            r.events
        );
        assert_eq!(r.commands, [Command::Leave]);
        assert!(r.l.token().is_none(), "{:?}", r.l.token());
    }
}

/// An ACQUIRED record goes out only while the lease runs: at the instant it ends the lease is
/// over (the membership's own check is `now >= lease_end`), even if the membership has not
/// said so yet.
#[test]
fn no_acquired_is_sent_at_the_instant_the_lease_ends() {
    let mut r = Rig::new();
    r.view.holding = true;
    r.view.lease_end = Some(r.now);
    let lease_end = r.now;
    r.member(Event::Acquired {
        token: token(3),
        lease_end,
        permit: 0,
    });
    assert!(
        !r.sent.iter().any(|t| matches!(t.op, Op::Produce { .. })),
        "{:?}",
        r.sent
    );
}

/// A waiter whose ledger topic is deleted stops its long poll and falls back to heartbeats; the
/// Metadata retry scheduled with that refusal is then for no one (no append or poll wants the
/// leader), so it must not be announced: `drive` would not act on it, and a wake-up due for
/// ever would spin the driver.
#[test]
fn a_waiter_whose_ledger_topic_is_gone_asks_for_no_wake_up() {
    let mut r = Rig::new();
    waiting_at(&mut r, 10);
    let fetch = r.last().clone();
    assert!(matches!(fetch.op, Op::Fetch { .. }), "{fetch:?}");
    // NOT_LEADER_OR_FOLLOWER: the leader is looked up again after a backoff.
    let resp = FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
        .with_topic(StrBytes::from_static_str(TOPIC).into())
        .with_partitions(vec![PartitionData::default()
            .with_partition_index(0)
            .with_error_code(6)])]);
    r.answer(fetch.id, Ok((Response::Fetch(resp), 12)));
    r.advance(Duration::from_millis(100));
    let meta = r.last().clone();
    assert!(matches!(meta.op, Op::Metadata { .. }), "{meta:?}");
    // The topic is gone.
    r.answer(
        meta.id,
        Ok((Response::Metadata(MetadataResponse::default()), 12)),
    );
    assert_eq!(r.l.poll_timeout(), None);
    let sent = r.sent.len();
    r.advance(DEFAULT_POLL_WAIT * 2);
    assert_eq!(r.sent.len(), sent, "{:?}", &r.sent[sent..]);
}

/// A ledger topic that cannot serve (gone, or deleted and created again under the same name) is
/// looked up again no sooner than a poll's wait later, even when the next rebalance restarts the
/// waiter's poll at once: waiters fall back to their heartbeats meanwhile.
#[test]
fn a_ledger_topic_that_cannot_serve_is_looked_up_again_after_a_polls_wait() {
    let first = Uuid::from_u128(0x1111);
    type Answer = fn() -> Result<(Response, i16), Error>;
    let gone: Answer = || Ok((Response::Metadata(MetadataResponse::default()), 12));
    let replaced: Answer = || metadata_with_id(Uuid::from_u128(0x2222));
    for (case, answer) in [("gone", gone), ("replaced", replaced)] {
        let mut r = Rig::new();
        let backoff = Backoff::with_rng(REQUEST / 50, RETRY_MAX, 2.0, 0.0, || 0.0);
        r.l = Ledger::new(
            config(),
            Some(Partition {
                leader: broker(1),
                topic_id: first,
            }),
            backoff,
        );
        waiting_at(&mut r, 10);
        let fetch = r.last().clone();
        // NOT_LEADER_OR_FOLLOWER: the leader is looked up again after a backoff.
        let resp = FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
            .with_topic(StrBytes::from_static_str(TOPIC).into())
            .with_partitions(vec![PartitionData::default()
                .with_partition_index(0)
                .with_error_code(6)])]);
        r.answer(fetch.id, Ok((Response::Fetch(resp), 12)));
        r.advance(REQUEST / 50);
        let meta = r.last().clone();
        assert!(matches!(meta.op, Op::Metadata { .. }), "{case}: {meta:?}");
        r.answer(meta.id, answer());
        let sent = r.sent.len();
        // The next rebalance: the waiter's poll starts again and wants the leader.
        r.member(Event::Waiting {
            holder: None,
            holders: Vec::new(),
            position: 1,
            generation: 4,
        });
        r.advance(DEFAULT_POLL_WAIT - Duration::from_millis(1));
        assert_eq!(r.sent.len(), sent, "{case}: {:?}", &r.sent[sent..]);
        r.advance(Duration::from_millis(1));
        assert!(
            matches!(r.last().op, Op::Metadata { .. }),
            "{case}: {:?}",
            r.last()
        );
    }
}

/// The OffsetCommit on the wire is what fences a checkpoint: the broker compares its generation
/// and member id with the group's (GroupMetadataManager.validateOffsetCommit in Apache Kafka
/// 4.1.2). A commit that left either out, or sent -1 / "", would be accepted from anyone
/// (Apache Kafka takes generation -1 with an empty member id as a commit from outside the
/// group), so the request is checked as encoded at every version kafka-lock may choose.
#[test]
fn a_checkpoint_commit_is_encoded_with_the_holds_generation_and_member_id() {
    use kafka_protocol::messages::OffsetCommitRequest;

    let mut r = Rig::new();
    r.holding_at(42);
    r.view.generation = 7;
    r.view.member_id = "m-7".into();
    let (view, now) = (r.view.clone(), r.t());
    r.l.checkpoint(1, "up to 2026-11-29".into(), &view, now);
    r.drain();
    let op = r.last().op.clone();
    assert!(matches!(op, Op::Commit { .. }), "{op:?}");

    let make = |versions: &NegotiatedVersions| build(&op, versions);
    sent_at_every_version(
        ApiKey::OffsetCommit,
        make,
        |sent: OffsetCommitRequest, v| {
            assert_eq!(sent.group_id.as_str(), LOCK, "v{v}");
            assert_eq!(sent.generation_id_or_member_epoch, 7, "v{v}");
            assert_eq!(sent.member_id.as_str(), "m-7", "v{v}");
            let [topic] = &sent.topics[..] else {
                panic!("v{v}: {sent:?}")
            };
            assert_eq!(topic.name.as_str(), TOPIC, "v{v}");
            let [p] = &topic.partitions[..] else {
                panic!("v{v}: {sent:?}")
            };
            assert_eq!(
                (
                    p.partition_index,
                    p.committed_offset,
                    p.committed_metadata.as_deref()
                ),
                (0, 42, Some("up to 2026-11-29")),
                "v{v}"
            );
        },
    );
}

/// The request `make` builds for a broker offering each version of `api` kafka-lock implements
/// (and every other API in full), encoded as a request frame and decoded back as the broker
/// would read it; `check` sees each request with the version it was sent at.
fn sent_at_every_version<R: kafka_protocol::protocol::Decodable>(
    api: ApiKey,
    make: impl Fn(&NegotiatedVersions) -> Result<(Request, i16), Failure>,
    mut check: impl FnMut(R, i16),
) {
    use crate::wire::frame::{decode_frame, DEFAULT_MAX_FRAME_SIZE};
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    use kafka_protocol::messages::ApiVersionsResponse;
    use kafka_protocol::protocol::decode_request_header_from_buffer;

    let (ours_min, ours_max) =
        crate::wire::versions::supported_range(api).expect("kafka-lock implements the API");
    for broker_max in ours_min..=ours_max {
        let offered = ApiVersionsResponse::default().with_api_keys(
            crate::wire::versions::SUPPORTED
                .iter()
                .map(|&(a, min, max)| {
                    let max = if a == api { broker_max } else { max };
                    ApiVersion::default()
                        .with_api_key(a as i16)
                        .with_min_version(min)
                        .with_max_version(max)
                })
                .collect(),
        );
        let versions = crate::wire::versions::negotiate(&offered).expect("negotiates");
        let (req, v) = make(&versions).expect("builds");
        assert!(v <= broker_max, "v{v} sent to a broker with v{broker_max}");
        let mut out = BytesMut::new();
        crate::wire::codec::encode_request(&req, v, 1, Some("kafka-lock"), &mut out)
            .unwrap_or_else(|e| panic!("v{v} encodes: {e}"));
        let mut frame = decode_frame(&mut out, DEFAULT_MAX_FRAME_SIZE)
            .expect("a frame")
            .expect("a whole frame");
        let header = decode_request_header_from_buffer(&mut frame).expect("a header");
        assert_eq!(header.request_api_key, api as i16);
        assert_eq!(header.request_api_version, v);
        check(R::decode(&mut frame, v).expect("decodes"), v);
    }
}

/// Reading a checkpoint back asks the lock's group for partition 0 of the ledger, in the
/// request's layout of each version: the group and its topics at the top before v8, a list of
/// groups from v8 on (KIP-709).
#[test]
fn a_checkpoint_read_asks_the_locks_group_for_the_ledger_partition() {
    use kafka_protocol::messages::OffsetFetchRequest;

    let make = |versions: &NegotiatedVersions| offset_fetch_request(LOCK, TOPIC, versions);
    let mut seen = Vec::new();
    sent_at_every_version(ApiKey::OffsetFetch, make, |sent: OffsetFetchRequest, v| {
        let (group, topics) = if v < 8 {
            assert!(sent.groups.is_empty(), "v{v}: {sent:?}");
            let topics = sent.topics.iter().flatten();
            let topics: Vec<_> = topics
                .map(|t| (t.name.as_str().to_owned(), t.partition_indexes.clone()))
                .collect();
            (sent.group_id.as_str().to_owned(), topics)
        } else {
            let [g] = &sent.groups[..] else {
                panic!("v{v}: {sent:?}")
            };
            let topics = g.topics.iter().flatten();
            let topics: Vec<_> = topics
                .map(|t| (t.name.as_str().to_owned(), t.partition_indexes.clone()))
                .collect();
            (g.group_id.as_str().to_owned(), topics)
        };
        assert_eq!(group, LOCK, "v{v}");
        assert_eq!(topics, [(TOPIC.to_owned(), vec![0])], "v{v}");
        seen.push(v);
    });
    assert!(seen.contains(&7) && seen.contains(&8), "{seen:?}");
}

/// The ledger topic's compression is asked for by name, of that topic only.
#[test]
fn the_compression_check_asks_for_the_ledger_topics_compression_type() {
    let req = compression_request(TOPIC);
    let [r] = &req.resources[..] else {
        panic!("{req:?}")
    };
    assert_eq!((r.resource_type, r.resource_name.as_str()), (2, TOPIC));
    let keys: Vec<&str> = r
        .configuration_keys
        .iter()
        .flatten()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(keys, [COMPRESSION_TYPE]);
}

/// Produce and Fetch name topics by id from v13 on (KIP-516): with the ledger topic's id known
/// they go up to the highest version both sides offer, and without it (Metadata before v10)
/// they name the topic at the highest version before that, whatever the broker offers.
#[test]
fn appends_and_polls_name_the_topic_as_far_as_its_id_is_known() {
    use kafka_protocol::messages::{FetchRequest, ProduceRequest};

    let id = Uuid::from_u128(0x1111);
    let top = |api| {
        crate::wire::versions::supported_range(api)
            .expect("implemented")
            .1
    };
    for topic_id in [Uuid::nil(), id] {
        let tp = TopicPartition::new(TOPIC, 0).with_topic_id(topic_id);
        let highest = |api| {
            if topic_id.is_nil() {
                TOPIC_ID_VERSION - 1
            } else {
                top(api)
            }
        };
        let names = |name: &str, by_id: Uuid, v: i16| {
            if v >= TOPIC_ID_VERSION {
                assert_eq!(by_id, id, "v{v}");
            } else {
                assert_eq!(name, TOPIC, "v{v}");
            }
        };
        let produce = Op::Produce {
            tp: tp.clone(),
            batch: batch_of(&[(LOCK, record(RecordKind::Released { held_ms: 1 }, 3))]),
            timeout: REQUEST,
        };
        let mut sent_at = Vec::new();
        let make = |versions: &NegotiatedVersions| build(&produce, versions);
        sent_at_every_version(ApiKey::Produce, make, |sent: ProduceRequest, v| {
            let [t] = &sent.topic_data[..] else {
                panic!("v{v}: {sent:?}")
            };
            names(t.name.as_str(), t.topic_id, v);
            sent_at.push(v);
        });
        assert_eq!(
            sent_at.iter().max(),
            Some(&highest(ApiKey::Produce)),
            "{tp:?}"
        );
        let fetch = Op::Fetch {
            tp: tp.clone(),
            offset: 10,
            options: FetchOptions {
                max_wait: DEFAULT_POLL_WAIT,
                min_bytes: 1,
                max_bytes: DEFAULT_POLL_MAX_BYTES,
                isolation: Isolation::ReadCommitted,
            },
        };
        let mut sent_at = Vec::new();
        let make = |versions: &NegotiatedVersions| build(&fetch, versions);
        sent_at_every_version(ApiKey::Fetch, make, |sent: FetchRequest, v| {
            let [t] = &sent.topics[..] else {
                panic!("v{v}: {sent:?}")
            };
            names(t.topic.as_str(), t.topic_id, v);
            sent_at.push(v);
        });
        assert_eq!(
            sent_at.iter().max(),
            Some(&highest(ApiKey::Fetch)),
            "{tp:?}"
        );
    }
}

/// A ledger is never created by accident: a typo in its name must not start a new token sequence
/// at 0 on a broker with `auto.create.topics.enable` (its default), which Metadata from v4 on
/// asks for unless told not to (before v4 a Metadata request never creates a topic).
#[test]
fn the_ledgers_metadata_lookup_never_creates_the_topic() {
    use kafka_protocol::messages::MetadataRequest;

    let op = Op::Metadata {
        topic: TOPIC.into(),
    };
    let mut seen = Vec::new();
    let make = |versions: &NegotiatedVersions| build(&op, versions);
    sent_at_every_version(ApiKey::Metadata, make, |sent: MetadataRequest, v| {
        let names: Vec<_> = sent
            .topics
            .iter()
            .flatten()
            .map(|t| t.name.as_ref().map(|n| n.as_str().to_owned()))
            .collect();
        assert_eq!(names, [Some(TOPIC.to_owned())], "v{v}");
        if v >= 4 {
            assert!(!sent.allow_auto_topic_creation, "v{v} may create the topic");
        }
        seen.push(v);
    });
    assert!(seen.contains(&3) && seen.contains(&4), "{seen:?}");
}

/// The checkpoint read asks for stable offsets wherever the version has the flag (v7 on):
/// Apache then serves it as a write without records, reading every offset written to the
/// group's partition and answering once they are committed, where a plain read is at
/// `lastCommittedOffset`, which a coordinator that has just taken over sets to its own lagging
/// high watermark (CoordinatorLoaderImpl `load`) and which can miss the previous holder's last
/// acknowledged checkpoint.
#[test]
fn the_checkpoint_read_asks_for_stable_offsets_from_v7() {
    use kafka_protocol::messages::OffsetFetchRequest;

    let make = |versions: &NegotiatedVersions| offset_fetch_request(LOCK, TOPIC, versions);
    let mut seen = Vec::new();
    sent_at_every_version(ApiKey::OffsetFetch, make, |sent: OffsetFetchRequest, v| {
        assert_eq!(sent.require_stable, v >= 7, "v{v}");
        seen.push(v);
    });
    assert!(seen.contains(&6) && seen.contains(&7), "{seen:?}");
}

/// Broker ids start at 0: a ledger partition led by broker 0 has a leader.
#[test]
fn a_ledger_partition_led_by_broker_zero_has_a_leader() {
    let resp = MetadataResponse::default()
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(BrokerId(0))
            .with_host(StrBytes::from_static_str("127.0.0.1"))
            .with_port(9090)])
        .with_topics(vec![MetadataResponseTopic::default()
            .with_name(Some(StrBytes::from_static_str(TOPIC).into()))
            .with_partitions(vec![MetadataResponsePartition::default()
                .with_partition_index(0)
                .with_leader_id(BrokerId(0))])]);
    let p = ledger_partition(&resp, TOPIC)
        .map_err(Error::from)
        .expect("a valid answer")
        .expect("a leader");
    assert_eq!(p.leader.node_id, 0);
}

/// A DescribeConfigs answer for the ledger topic with `compression.type` set to `value`, as the
/// broker's bytes at `version`, read back through the decoding guard.
fn compression_answer(value: &str, error_code: i16, version: i16) -> Result<Compression, Error> {
    use kafka_protocol::messages::describe_configs_response::{
        DescribeConfigsResourceResult, DescribeConfigsResult,
    };
    use kafka_protocol::protocol::Encodable;
    let resp =
        DescribeConfigsResponse::default().with_results(vec![DescribeConfigsResult::default()
            .with_error_code(error_code)
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_static_str(TOPIC))
            .with_configs(vec![DescribeConfigsResourceResult::default()
                .with_name(StrBytes::from_static_str(COMPRESSION_TYPE))
                .with_value(Some(StrBytes::from_string(value.to_owned())))])]);
    let mut body = BytesMut::new();
    resp.encode(&mut body, version).expect("encodes");
    let decoded = crate::wire::codec::decode_response(ApiKey::DescribeConfigs, version, &body)
        .expect("a valid answer decodes");
    let crate::wire::Response::DescribeConfigs(r) = decoded else {
        panic!("decoded as another API");
    };
    ledger_compression(&r, TOPIC).map_err(Error::from)
}

#[test]
fn a_recompressing_ledger_topic_is_refused_with_the_fix() {
    for version in [1, 4] {
        for kept in ["producer", "uncompressed"] {
            assert_eq!(
                compression_answer(kept, 0, version).expect("kept"),
                Compression::Kept
            );
        }
        let err = compression_answer("gzip", 0, version).expect_err("gzip is refused");
        assert!(
            matches!(&err, Error::Ledger(LedgerError::Compressed { codec, .. }) if codec == "gzip"),
            "{err:?}"
        );
        assert!(err.to_string().contains(&compression_fix(TOPIC)), "{err}");
        // TOPIC_AUTHORIZATION_FAILED: the setting is unknown, not refused.
        assert_eq!(
            compression_answer("gzip", 29, version).expect("not refused"),
            Compression::NotAuthorized
        );
    }
    // An answer about another topic is not an answer about the ledger.
    let other = DescribeConfigsResponse::default().with_results(vec![
        kafka_protocol::messages::describe_configs_response::DescribeConfigsResult::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_static_str("other")),
    ]);
    assert!(matches!(
        ledger_compression(&other, TOPIC).map_err(Error::from),
        Err(Error::Protocol(_))
    ));
}

#[test]
fn a_garbage_describe_configs_answer_is_a_typed_error() {
    // One result claimed, then the body ends.
    let body = [0, 0, 0, 0, 0, 0, 0, 1];
    assert!(matches!(
        crate::wire::codec::decode_response(ApiKey::DescribeConfigs, 1, &body),
        Err(crate::wire::codec::DecodeError::Malformed { .. })
    ));
}

/// The README gives the same ledger-topic creation command as the error and `history --help`.
#[test]
fn the_readme_gives_the_ledger_topic_command_of_the_library() {
    let readme: String = include_str!("../../README.md")
        .replace('`', "")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let create = create_topic_command("kafka-lock-ledger");
    assert!(readme.contains(&create), "README lacks: {create}");
    assert!(
        readme.contains(SINGLE_BROKER_SETTINGS),
        "README lacks: {SINGLE_BROKER_SETTINGS}"
    );
}

mod offset_fetched_answers {
    //! Reading a checkpoint back (`last_checkpoint`, `committed_checkpoint`): what an OffsetFetch
    //! answer says is committed for the ledger partition, in both of the answer's layouts (one
    //! group's topics at the top before v8, a list of groups from v8 on).

    use kafka_protocol::messages::offset_fetch_response::{
        OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
        OffsetFetchResponseTopic, OffsetFetchResponseTopics,
    };
    use kafka_protocol::messages::{GroupId, OffsetFetchResponse, TopicName};

    use super::*;

    /// One partition's entry: (topic, partition, committed offset, metadata, error code).
    type Entry<'a> = (&'a str, i32, i64, Option<&'a str>, i16);

    /// The answer before v8: the group's error code and its topics at the top.
    fn flat(error_code: i16, entries: &[Entry<'_>]) -> Response {
        let mut r = OffsetFetchResponse::default();
        r.error_code = error_code;
        for &(topic, partition, offset, metadata, code) in entries {
            let mut p = OffsetFetchResponsePartition::default();
            p.partition_index = partition;
            p.committed_offset = offset;
            p.metadata = metadata.map(|m| StrBytes::from_string(m.to_owned()));
            p.error_code = code;
            let mut t = OffsetFetchResponseTopic::default();
            t.name = TopicName(StrBytes::from_string(topic.to_owned()));
            t.partitions = vec![p];
            r.topics.push(t);
        }
        Response::OffsetFetch(r)
    }

    /// The answer from v8 on: one group, its error code and topics inside it. The top-level
    /// error code is set to a failure to show that this layout does not read it.
    fn grouped(error_code: i16, entries: &[Entry<'_>]) -> Response {
        let mut g = OffsetFetchResponseGroup::default();
        g.group_id = GroupId(StrBytes::from_static_str(LOCK));
        g.error_code = error_code;
        for &(topic, partition, offset, metadata, code) in entries {
            let mut p = OffsetFetchResponsePartitions::default();
            p.partition_index = partition;
            p.committed_offset = offset;
            p.metadata = metadata.map(|m| StrBytes::from_string(m.to_owned()));
            p.error_code = code;
            let mut t = OffsetFetchResponseTopics::default();
            t.name = TopicName(StrBytes::from_string(topic.to_owned()));
            t.partitions = vec![p];
            g.topics.push(t);
        }
        let mut r = OffsetFetchResponse::default();
        r.error_code = 16;
        r.groups = vec![g];
        Response::OffsetFetch(r)
    }

    fn code_of(result: Result<Option<(i64, String)>, Error>) -> i16 {
        match result {
            Err(Error::Broker { code, .. }) => code.0,
            other => panic!("expected a broker error, got {other:?}"),
        }
    }

    #[test]
    fn a_committed_checkpoint_is_read_with_its_offset_and_metadata() {
        for layout in [flat, grouped] {
            let resp = layout(0, &[(TOPIC, 0, 42, Some("state after hold 41"), 0)]);
            assert_eq!(
                offset_fetched(&resp, TOPIC).map_err(Error::from).unwrap(),
                Some((42, "state after hold 41".to_owned()))
            );
            // Null metadata is an empty checkpoint, not a missing one.
            let resp = layout(0, &[(TOPIC, 0, 7, None, 0)]);
            assert_eq!(
                offset_fetched(&resp, TOPIC).map_err(Error::from).unwrap(),
                Some((7, String::new()))
            );
            // The committed offset is the hold's token, and the first hold of a new ledger has
            // token 0: a commit, not "none".
            let resp = layout(0, &[(TOPIC, 0, 0, Some(""), 0)]);
            assert_eq!(
                offset_fetched(&resp, TOPIC).map_err(Error::from).unwrap(),
                Some((0, String::new()))
            );
        }
    }

    #[test]
    fn no_commit_for_the_ledger_partition_is_none() {
        for layout in [flat, grouped] {
            // Kafka answers offset -1 for a group with no commit for the partition.
            let resp = layout(0, &[(TOPIC, 0, -1, Some(""), 0)]);
            assert_eq!(
                offset_fetched(&resp, TOPIC).map_err(Error::from).unwrap(),
                None
            );
            // Another topic's, or another partition's, commit is not the ledger's.
            let resp = layout(0, &[("other", 0, 42, Some("x"), 0)]);
            assert_eq!(
                offset_fetched(&resp, TOPIC).map_err(Error::from).unwrap(),
                None
            );
            let resp = layout(0, &[(TOPIC, 1, 42, Some("x"), 0)]);
            assert_eq!(
                offset_fetched(&resp, TOPIC).map_err(Error::from).unwrap(),
                None
            );
            let resp = layout(0, &[]);
            assert_eq!(
                offset_fetched(&resp, TOPIC).map_err(Error::from).unwrap(),
                None
            );
        }
    }

    #[test]
    fn the_ledger_partitions_entry_is_found_among_others() {
        for layout in [flat, grouped] {
            let resp = layout(
                0,
                &[
                    ("other", 0, 5, Some("not ours"), 0),
                    (TOPIC, 1, 6, Some("not ours"), 0),
                    (TOPIC, 0, 42, Some("ours"), 0),
                ],
            );
            assert_eq!(
                offset_fetched(&resp, TOPIC).map_err(Error::from).unwrap(),
                Some((42, "ours".to_owned()))
            );
        }
    }

    #[test]
    fn error_codes_are_typed_broker_errors_at_every_level() {
        // COORDINATOR_LOAD_IN_PROGRESS (14) and NOT_COORDINATOR (16) for the group, which the
        // driver retries; UNKNOWN_TOPIC_OR_PARTITION (3) and UNSTABLE_OFFSET_COMMIT (88) for
        // the partition. An error is never read as "nothing committed".
        for layout in [flat, grouped] {
            let resp = layout(14, &[(TOPIC, 0, 42, Some("x"), 0)]);
            assert_eq!(
                code_of(offset_fetched(&resp, TOPIC).map_err(Error::from)),
                14
            );
            let resp = layout(16, &[]);
            assert_eq!(
                code_of(offset_fetched(&resp, TOPIC).map_err(Error::from)),
                16
            );
            let resp = layout(0, &[(TOPIC, 0, 42, Some("x"), 3)]);
            assert_eq!(
                code_of(offset_fetched(&resp, TOPIC).map_err(Error::from)),
                3
            );
            let resp = layout(0, &[(TOPIC, 0, -1, None, 88)]);
            assert_eq!(
                code_of(offset_fetched(&resp, TOPIC).map_err(Error::from)),
                88
            );
        }
    }

    #[test]
    fn an_answer_of_another_kind_is_a_protocol_error() {
        let resp = Response::OffsetCommit(OffsetCommitResponse::default());
        assert!(matches!(
            offset_fetched(&resp, TOPIC).map_err(Error::from),
            Err(Error::Protocol(_))
        ));
    }
}

/// An earlier try's LOST record (an ACQUIRED acknowledged after its try ended) names an older
/// generation and may be appended after the RELEASED of the waiter's own generation, in the same
/// Fetch: the membership still hears of the newest hold's end, so the waiter rejoins at once
/// rather than wait for a Heartbeat's REBALANCE_IN_PROGRESS.
#[test]
fn a_polled_batch_reports_the_newest_generation_whose_hold_ended() {
    let mut r = Rig::new();
    r.member(Event::Waiting {
        holder: None,
        holders: Vec::new(),
        position: 1,
        generation: 3,
    });
    let t = r.last().clone();
    let end = ListOffsetsResponse::default().with_topics(vec![ListOffsetsTopicResponse::default()
        .with_name(StrBytes::from_static_str(TOPIC).into())
        .with_partitions(vec![ListOffsetsPartitionResponse::default()
            .with_partition_index(0)
            .with_offset(10)])]);
    r.answer(t.id, Ok((Response::ListOffsets(end), 9)));
    r.commands.clear();
    let t = r.last().clone();
    assert!(matches!(t.op, Op::Fetch { offset: 10, .. }), "{t:?}");
    let older = LedgerRecord {
        generation: 2,
        member_id: "m-3".into(),
        ..record(
            RecordKind::Lost {
                held_ms: 0,
                reason: "ledger".into(),
                detail: "the try ended before the ACQUIRED record was acknowledged".into(),
            },
            9,
        )
    };
    r.answer(
        t.id,
        fetch_answer(
            10,
            &[
                (LOCK, record(RecordKind::Released { held_ms: 1 }, 8)),
                (LOCK, older),
            ],
        ),
    );
    assert_eq!(
        r.commands,
        [Command::HoldEnded {
            generation: 3,
            member_id: "m-2".into()
        }]
    );
}

/// Kafka answers a Fetch with whole batches, so a batch that begins before the poll's offset
/// brings records already read (or from before the poll began): those are skipped, and every
/// record from the offset on is read, not only the first.
#[test]
fn a_polled_batch_is_read_from_the_polls_offset_on() {
    let mut r = Rig::new();
    waiting_at(&mut r, 10);
    r.commands.clear();
    let t = r.last().clone();
    assert!(matches!(t.op, Op::Fetch { offset: 10, .. }), "{t:?}");
    let ended = |generation: i32| LedgerRecord {
        generation,
        ..record(RecordKind::Released { held_ms: 1 }, 7)
    };
    r.answer(
        t.id,
        fetch_answer(
            8,
            &[
                (LOCK, ended(5)),
                (LOCK, record(RecordKind::Acquired { lease_ms: 1 }, -1)),
                ("other-lock", ended(6)),
                (LOCK, ended(3)),
            ],
        ),
    );
    assert_eq!(
        r.commands,
        [Command::HoldEnded {
            generation: 3,
            member_id: "m-2".into()
        }]
    );
    assert!(
        matches!(r.last().op, Op::Fetch { offset: 12, .. }),
        "{:?}",
        r.last()
    );
}

// ---- the driver's failures --------------------------------------------------------------------
//
// The machine is told of a request that got no answer as the driver's failure and decides only
// through `wire::Unanswered` and `ledger::Unanswered`. These tables give it each kind of `Error`
// the session hands it and pin where each decision goes, so that a slip in what `Error` answers
// (a poisoned connection read as a bad frame or as final, a broker code the connection found
// ignored) or in what the machine asks shows as a changed row.

/// The driver's failure of kind `kind`, as the session reports it.
fn driver_failure(kind: &str) -> Error {
    let timeout = || Error::Timeout {
        op: "the request".into(),
        after: REQUEST,
    };
    match kind {
        "timeout" => timeout(),
        "io" => Error::Io {
            op: "read",
            source: std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset"),
        },
        "poisoned by a timeout" => Error::Poisoned(Arc::new(timeout())),
        "poisoned by a frame" => Error::Poisoned(Arc::new(Error::Frame(
            crate::wire::frame::FrameError::TooLarge {
                size: 1 << 30,
                limit: 1 << 20,
            },
        ))),
        "closed" => Error::Closed,
        // `build` found no version of an API the ledger needs on this connection.
        "refused by build" => Error::Ledger(LedgerError::Unsupported { api: Api::Produce }),
        "unsupported" => Error::UnsupportedApi { api: Api::Metadata },
        // A code the connection read (its handshake), not the request's answer.
        broker => {
            let code = broker
                .strip_prefix("broker ")
                .and_then(|c| c.parse().ok())
                .unwrap_or_else(|| panic!("no failure of kind {broker:?}"));
            Error::broker(ApiKey::ApiVersions, KafkaCode(code), None)
        }
    }
}

/// Where the long poll goes after a failure: a frame too large to read restarts it from the
/// ledger's end (every Fetch from there would fail alike); a failure a retry elsewhere may fix
/// looks the leader up again; anything else asks the same leader from the same offset; the
/// broker's codes decide as if the answer had carried them.
#[test]
fn a_failed_long_poll_goes_on_as_its_failure_says() {
    for (kind, next) in [
        ("poisoned by a frame", "from the end"),
        ("broker 1", "from the end"),
        ("timeout", "leader looked up"),
        ("io", "leader looked up"),
        ("poisoned by a timeout", "leader looked up"),
        ("broker 6", "leader looked up"),
        ("closed", "same offset"),
        ("refused by build", "same offset"),
        ("broker 35", "same offset"),
    ] {
        let mut r = Rig::new();
        waiting_at(&mut r, 5);
        let fetch = r.last().clone();
        assert!(
            matches!(fetch.op, Op::Fetch { offset: 5, .. }),
            "{:?}",
            fetch.op
        );
        let before = r.sent.len();
        r.answer(fetch.id, Err(driver_failure(kind)));
        // Whatever comes next waits out a backoff: a failure met at once again would loop.
        assert_eq!(r.sent.len(), before, "{kind}: {:?}", &r.sent[before..]);
        r.advance(RETRY_MAX * 2);
        let ops: Vec<&Op> = r.sent[before..].iter().map(|t| &t.op).collect();
        let polls = ops
            .iter()
            .filter(|op| matches!(op, Op::Fetch { .. } | Op::ListOffsets { .. }))
            .count();
        let went = match ops.first() {
            Some(Op::ListOffsets { .. }) => "from the end",
            Some(Op::Metadata { .. }) if polls == 0 => "leader looked up",
            Some(Op::Fetch { offset: 5, .. }) => "same offset",
            _ => "elsewhere",
        };
        assert_eq!(went, next, "{kind}: {ops:?}");
    }
}

/// A checkpoint's OffsetCommit that got no answer: retried while the hold lasts when a retry may
/// store it, reported as the failure itself when not. Once the hold ended, a failure that left
/// the commit's fate open is `CheckpointUnknown`, a broker's refusal is `NotHeld`: a mapping slip
/// here tells the caller a checkpoint was not stored when it may have been.
#[test]
fn a_failed_checkpoint_commit_is_retried_or_reported_as_its_failure_says() {
    for (kind, retried, once_ended) in [
        ("timeout", true, "unknown"),
        ("io", true, "unknown"),
        ("poisoned by a timeout", true, "unknown"),
        ("poisoned by a frame", true, "unknown"),
        ("broker 15", true, "not held"),
        ("closed", false, "itself"),
        ("refused by build", false, "itself"),
        ("broker 35", false, "itself"),
        ("broker 25", false, "itself"),
    ] {
        let mut r = Rig::new();
        r.holding_at(42);
        let (view, now) = (r.view.clone(), r.t());
        r.l.checkpoint(1, "v".into(), &view, now);
        r.drain();
        let commit = r.last().clone();
        assert!(matches!(commit.op, Op::Commit { .. }), "{:?}", commit.op);
        r.commands.clear();
        r.answer(commit.id, Err(driver_failure(kind)));
        r.advance(RETRY_MAX * 2);
        let commits = r
            .sent
            .iter()
            .filter(|t| matches!(t.op, Op::Commit { .. }))
            .count();
        assert_eq!(commits == 2, retried, "{kind}: {:?}", r.checkpoints);
        if retried {
            assert!(r.checkpoints.is_empty(), "{kind}: {:?}", r.checkpoints);
        } else {
            let [(1, Err(e))] = &r.checkpoints[..] else {
                panic!("{kind}: {:?}", r.checkpoints);
            };
            assert_eq!(e.to_string(), driver_failure(kind).to_string());
        }
        // UNKNOWN_MEMBER_ID, whoever read it: the coordinator is asked at once.
        assert_eq!(
            r.commands.contains(&Command::HeartbeatNow),
            kind == "broker 25",
            "{kind}: {:?}",
            r.commands
        );

        let mut r = Rig::new();
        r.holding_at(42);
        let (view, now) = (r.view.clone(), r.t());
        r.l.checkpoint(1, "v".into(), &view, now);
        r.drain();
        let commit = r.last().clone();
        r.view.holding = false;
        let lease_end = r.now;
        r.member(Event::Lost {
            reason: LossReason::LeaseExpired,
            lease_end,
        });
        r.membership_leaves();
        r.answer(commit.id, Err(driver_failure(kind)));
        let heard = match &r.checkpoints[..] {
            [(1, Err(Error::Ledger(LedgerError::CheckpointUnknown { .. })))] => "unknown",
            [(1, Err(Error::Ledger(LedgerError::NotHeld { .. })))] => "not held",
            [(1, Err(e))] if e.to_string() == driver_failure(kind).to_string() => "itself",
            other => panic!("{kind}: {other:?}"),
        };
        assert_eq!(heard, once_ended, "{kind}");
    }
}

/// An ACQUIRED append that got no answer: a failure a retry elsewhere may fix looks the leader up
/// again and sends it there; any other ends the try (the hold is given up and the member
/// leaves) with the driver's own words.
#[test]
fn a_failed_acquired_append_is_retried_or_ends_the_try_as_its_failure_says() {
    for (kind, outcome) in [
        ("timeout", "leader looked up"),
        ("io", "leader looked up"),
        ("poisoned by a timeout", "leader looked up"),
        ("poisoned by a frame", "leader looked up"),
        ("broker 6", "leader looked up"),
        ("closed", "given up"),
        ("refused by build", "given up"),
        ("broker 35", "given up"),
    ] {
        let mut r = Rig::new();
        r.membership_acquires(3);
        let append = r.last().clone();
        assert!(matches!(
            appended(&append).kind,
            RecordKind::Acquired { .. }
        ));
        let before = r.sent.len();
        r.answer(append.id, Err(driver_failure(kind)));
        r.advance(RETRY_MAX * 2);
        let words = driver_failure(kind).to_string();
        let failed = r
            .events
            .iter()
            .any(|e| matches!(e, Event::Failed(e) if e.to_string() == words));
        let went = if failed && r.commands.contains(&Command::Leave) {
            "given up"
        } else if !failed && matches!(r.sent.get(before).map(|t| &t.op), Some(Op::Metadata { .. }))
        {
            "leader looked up"
        } else {
            "elsewhere"
        };
        assert_eq!(
            went,
            outcome,
            "{kind}: {:?} {:?}",
            r.events,
            r.sent[before..].len()
        );
    }
}

/// A ledger lookup the driver could not build (the connection offers no Metadata version the
/// ledger implements) says the topic cannot serve: the try ends. Any other failure of the
/// lookup is asked again.
#[test]
fn a_ledger_lookup_refused_by_build_ends_the_try() {
    for (kind, gives_up) in [
        ("refused by build", true),
        ("unsupported", false),
        ("closed", false),
        ("timeout", false),
        ("broker 35", false),
    ] {
        let mut r = Rig::new();
        r.membership_acquires(3);
        let append = r.last().clone();
        r.answer(append.id, Err(driver_failure("timeout")));
        r.advance(RETRY_MAX * 2);
        let meta = r.last().clone();
        assert!(matches!(meta.op, Op::Metadata { .. }), "{:?}", meta.op);
        r.answer(meta.id, Err(driver_failure(kind)));
        let failed = r.events.iter().any(|e| matches!(e, Event::Failed(_)));
        assert_eq!(failed, gives_up, "{kind}: {:?}", r.events);
        assert_eq!(r.commands.contains(&Command::Leave), gives_up, "{kind}");
    }
}

/// A holder refused for an old generation whose membership never settles the new one (its
/// SyncGroup answer never comes): the retries stop at the checkpoint window with the refusal,
/// and none goes out at the JoinGroup answer's generation meanwhile.
#[test]
fn a_checkpoint_refused_for_an_old_generation_ends_with_the_window_if_no_sync_answer_comes() {
    let mut r = Rig::new();
    r.holding_at(42);
    let (view, now) = (r.view.clone(), r.t());
    r.l.checkpoint(1, "v".into(), &view, now);
    r.drain();
    let t = r.last().clone();
    r.answer(t.id, commit_answer(22));
    r.view.generation = 4;
    r.view.awaiting_sync = true;
    let sent = r.sent.len();
    for _ in 0..60 {
        if !r.checkpoints.is_empty() {
            break;
        }
        r.advance(Duration::from_secs(10));
    }
    assert!(
        !r.sent[sent..]
            .iter()
            .any(|t| matches!(t.op, Op::Commit { .. })),
        "{:?}",
        &r.sent[sent..]
    );
    let [(1, Err(e))] = &r.checkpoints[..] else {
        panic!("{:?}", r.checkpoints)
    };
    assert!(
        e.to_string().contains("22") || e.to_string().to_lowercase().contains("generation"),
        "{e}"
    );
}

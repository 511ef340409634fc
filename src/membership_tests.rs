//! Scripted tests of the membership machine: a manual clock, hand-built broker answers, Apache
//! Kafka's semantics (group-protocol.md) as the reference.

use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::find_coordinator_response::{Coordinator, FindCoordinatorResponse};
use kafka_protocol::messages::heartbeat_response::HeartbeatResponse;
use kafka_protocol::messages::join_group_response::{JoinGroupResponse, JoinGroupResponseMember};
use kafka_protocol::messages::leave_group_response::LeaveGroupResponse;
use kafka_protocol::messages::sync_group_response::SyncGroupResponse;
use kafka_protocol::messages::BrokerId;
use kafka_protocol::protocol::StrBytes;

use super::*;
use crate::assign::{Holder, MemberMetadata, NativeAssignment};
use crate::error::Error;
use crate::wire::Request;

const SESSION: Duration = Duration::from_secs(10);
const HB: Duration = Duration::from_secs(1);
const MARGIN: Duration = Duration::from_secs(1);
const RETRY: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(1);

fn config(mode: Mode) -> MembershipConfig {
    MembershipConfig {
        group_id: "nightly-job".into(),
        mode,
        label: Some("host-a".into()),
        session_timeout: SESSION,
        rebalance_timeout: SESSION,
        heartbeat_interval: HB,
        request_timeout: Duration::from_secs(5),
        lease_margin: MARGIN,
        permits: 1,
        ledger: None,
    }
}

/// A machine, a manual clock and everything the machine said so far.
struct H {
    m: Membership,
    now: Instant,
    sent: Vec<Transmit>,
    events: Vec<Event>,
}

impl H {
    fn new(mode: Mode) -> H {
        H::with(config(mode))
    }

    fn with(cfg: MembershipConfig) -> H {
        H::build(cfg, GroupVersions::LATEST)
    }

    fn build(cfg: MembershipConfig, versions: GroupVersions) -> H {
        let backoff = Backoff::with_rng(RETRY, RETRY_MAX, 2.0, 0.0, || 0.0);
        let mut h = H {
            m: Membership::new(cfg, versions, backoff),
            now: Instant::now(),
            sent: Vec::new(),
            events: Vec::new(),
        };
        h.m.handle_timeout(h.now);
        h.drain();
        h
    }

    fn drain(&mut self) {
        while let Some(t) = self.m.poll_transmit() {
            self.sent.push(t);
        }
        while let Some(e) = self.m.poll_event() {
            self.events.push(e);
        }
    }

    /// Moves the clock forward, firing the machine's timer whenever it is due on the way.
    fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        while let Some(t) = self.m.poll_timeout() {
            if t > end {
                break;
            }
            self.now = self.now.max(t);
            self.m.handle_timeout(self.now);
            self.drain();
        }
        self.now = end;
        self.m.handle_timeout(self.now);
        self.drain();
    }

    fn reply(&mut self, id: u64, r: Result<Response, Error>) {
        self.m.handle_response(id, r, self.now);
        self.drain();
    }

    /// The oldest unanswered transmit of the given API, removed from the log.
    fn take(&mut self, api: ApiKey) -> Transmit {
        let i = self
            .sent
            .iter()
            .position(|t| t.request.api_key() == api)
            .unwrap_or_else(|| panic!("expected a {api:?} request; sent: {:?}", self.apis()));
        self.sent.remove(i)
    }

    fn apis(&self) -> Vec<ApiKey> {
        self.sent.iter().map(|t| t.request.api_key()).collect()
    }

    fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// FindCoordinator answered, then the new coordinator's ApiVersions probe answered with
    /// everything kafka-lock builds.
    fn find_ok(&mut self) {
        let t = self.take(ApiKey::FindCoordinator);
        assert_eq!(t.target, Target::Any);
        self.reply(t.id, Ok(find_ok()));
        let probe = self.take(ApiKey::ApiVersions);
        assert_eq!(
            probe.target,
            Target::Coordinator {
                broker: coordinator(),
                lane: Lane::Control
            }
        );
        self.reply(probe.id, Ok(api_versions(crate::wire::versions::SUPPORTED)));
    }

    /// The Heartbeat that must follow an assignment naming us, answered NONE.
    fn confirm(&mut self) {
        let beat = self.take(ApiKey::Heartbeat);
        self.reply(beat.id, Ok(hb(0)));
    }

    /// Goes from a fresh machine to a joined follower (or leader) holding or waiting.
    fn join_as(
        &mut self,
        member: &str,
        generation: i32,
        leader: bool,
        members: &[(&str, MemberMetadata)],
    ) -> Transmit {
        let t = self.take(ApiKey::JoinGroup);
        self.reply(
            t.id,
            Ok(join_ok(
                member,
                generation,
                if leader { member } else { "someone-else" },
                members,
            )),
        );
        self.take(ApiKey::SyncGroup)
    }

    /// A fresh native machine that holds the lock at `generation` as member "m1".
    fn holding(generation: i32) -> H {
        let mut h = H::new(Mode::Native);
        h.find_ok();
        let sync = h.join_as("m1", generation, false, &[]);
        h.reply(
            sync.id,
            Ok(sync_ok(native_assignment(Some("m1"), generation, 0))),
        );
        h.confirm();
        assert!(
            matches!(h.take_events().last(), Some(Event::Acquired { .. })),
            "should hold"
        );
        h
    }
}

fn s(x: &str) -> StrBytes {
    StrBytes::from_string(x.to_owned())
}

fn coordinator() -> Broker {
    Broker {
        node_id: 1,
        host: "127.0.0.1".into(),
        port: 9092,
    }
}

/// An ApiVersions answer listing `ranges`.
fn api_versions(ranges: &[(ApiKey, i16, i16)]) -> Response {
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    let mut r = kafka_protocol::messages::ApiVersionsResponse::default();
    r.api_keys = ranges
        .iter()
        .map(|&(api, min, max)| {
            let mut v = ApiVersion::default();
            v.api_key = api as i16;
            v.min_version = min;
            v.max_version = max;
            v
        })
        .collect();
    Response::ApiVersions(r)
}

fn find_ok() -> Response {
    let mut c = Coordinator::default();
    c.key = s("nightly-job");
    c.node_id = BrokerId(1);
    c.host = s("127.0.0.1");
    c.port = 9092;
    let mut r = FindCoordinatorResponse::default();
    r.coordinators = vec![c];
    Response::FindCoordinator(r)
}

fn find_err(code: i16) -> Response {
    let mut c = Coordinator::default();
    c.error_code = code;
    let mut r = FindCoordinatorResponse::default();
    r.coordinators = vec![c];
    Response::FindCoordinator(r)
}

fn join_ok(
    member: &str,
    generation: i32,
    leader: &str,
    members: &[(&str, MemberMetadata)],
) -> Response {
    let mut r = JoinGroupResponse::default();
    r.generation_id = generation;
    r.member_id = s(member);
    r.leader = s(leader);
    r.protocol_name = Some(s(crate::assign::NATIVE_PROTOCOL));
    r.members = members
        .iter()
        .map(|(id, meta)| {
            let mut m = JoinGroupResponseMember::default();
            m.member_id = s(id);
            m.metadata = meta.encode();
            m
        })
        .collect();
    Response::JoinGroup(r)
}

fn join_err(code: i16, member: &str) -> Response {
    let mut r = JoinGroupResponse::default();
    r.error_code = code;
    r.member_id = s(member);
    r.generation_id = -1;
    Response::JoinGroup(r)
}

fn sync_ok(assignment: Bytes) -> Response {
    let mut r = SyncGroupResponse::default();
    r.assignment = assignment;
    Response::SyncGroup(r)
}

fn sync_err(code: i16) -> Response {
    let mut r = SyncGroupResponse::default();
    r.error_code = code;
    Response::SyncGroup(r)
}

fn hb(code: i16) -> Response {
    let mut r = HeartbeatResponse::default();
    r.error_code = code;
    Response::Heartbeat(r)
}

fn leave_ok() -> Response {
    Response::LeaveGroup(LeaveGroupResponse::default())
}

fn native_assignment(holder: Option<&str>, generation: i32, position: i32) -> Bytes {
    NativeAssignment {
        holder: holder.map(|h| Holder {
            member_id: h.into(),
            label: None,
            generation,
            slot: 0,
        }),
        position,
        // Room for a holder and waiters at positions 1 and 2 (a position must be below the
        // count to decode).
        members: 3,
        permits: 1,
        other_holders: Vec::new(),
        ledger: None,
    }
    .encode()
}

fn meta(holds: bool, first: i32) -> MemberMetadata {
    MemberMetadata {
        holds,
        first_joined_generation: first,
        holder_generation: if holds { first } else { -1 },
        label: None,
        permits: 1,
        slot: 0,
        ledger: None,
    }
}

fn join_request(t: &Transmit) -> &kafka_protocol::messages::JoinGroupRequest {
    match &t.request {
        Request::JoinGroup(r) => r,
        other => panic!("not a JoinGroup: {other:?}"),
    }
}

fn sync_request(t: &Transmit) -> &kafka_protocol::messages::SyncGroupRequest {
    match &t.request {
        Request::SyncGroup(r) => r,
        other => panic!("not a SyncGroup: {other:?}"),
    }
}

fn lost(events: &[Event]) -> Option<LossReason> {
    events.iter().find_map(|e| match e {
        Event::Lost { reason, .. } => Some(reason.clone()),
        _ => None,
    })
}

/// The broker error code the membership failed with; panics if it failed with another kind of
/// error, so a test expecting a code cannot pass on a transport or protocol failure.
fn failed(events: &[Event]) -> Option<KafkaCode> {
    failure(events).map(|err| match &*err {
        Error::Broker { code, .. } => *code,
        other => panic!("expected a broker error, the membership failed with {other:?}"),
    })
}

fn failure(events: &[Event]) -> Option<std::sync::Arc<Error>> {
    events.iter().find_map(|e| match e {
        Event::Failed(err) => Some(std::sync::Arc::new(Error::from(err.clone()))),
        _ => None,
    })
}

#[test]
fn member_id_required_then_success() {
    let mut h = H::new(Mode::Native);
    assert_eq!((h.m.member_id(), h.m.generation()), ("", -1));
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    assert_eq!(join_request(&j).member_id.as_str(), "");
    assert!(matches!(
        &j.target,
        Target::Coordinator {
            lane: Lane::Join,
            ..
        }
    ));
    h.reply(j.id, Ok(join_err(79, "m1-uuid")));
    // KIP-394: rejoin at once (no backoff) with the id the broker parked.
    let j2 = h.take(ApiKey::JoinGroup);
    assert_eq!(join_request(&j2).member_id.as_str(), "m1-uuid");
    h.reply(
        j2.id,
        Ok(join_ok(
            "m1-uuid",
            1,
            "m1-uuid",
            &[("m1-uuid", meta(false, -1))],
        )),
    );
    let sync = h.take(ApiKey::SyncGroup);
    // The leader assigns, and a lone member gets the lock.
    assert_eq!(sync_request(&sync).assignments.len(), 1);
    let assignment = sync_request(&sync).assignments[0].assignment.clone();
    h.reply(sync.id, Ok(sync_ok(assignment)));
    let ev = h.take_events();
    let token = ev.iter().find_map(|e| match e {
        Event::Acquired { token, .. } => Some(token.clone()),
        _ => None,
    });
    assert_eq!(
        token,
        Some(FencingToken {
            ledger_offset: None,
            generation: 1,
            member_id: "m1-uuid".into()
        })
    );
    assert_eq!((h.m.member_id(), h.m.generation()), ("m1-uuid", 1));
}

#[test]
fn expired_pending_id_resets_and_joins_cleanly() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    h.reply(j.id, Ok(join_err(79, "pending-1")));
    let j2 = h.take(ApiKey::JoinGroup);
    assert_eq!(join_request(&j2).member_id.as_str(), "pending-1");
    // The second join arrived after the pending member expired (Apache: UNKNOWN_MEMBER_ID).
    h.reply(j2.id, Ok(join_err(25, "")));
    let j3 = h.take(ApiKey::JoinGroup);
    assert_eq!(
        join_request(&j3).member_id.as_str(),
        "",
        "the stale id must be forgotten"
    );
    h.reply(j3.id, Ok(join_err(79, "pending-2")));
    let j4 = h.take(ApiKey::JoinGroup);
    assert_eq!(join_request(&j4).member_id.as_str(), "pending-2");
    h.reply(j4.id, Ok(join_ok("pending-2", 3, "other", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    assert!(
        sync_request(&sync).assignments.is_empty(),
        "followers send no assignment"
    );
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("other"), 3, 1))));
    let ev = h.take_events();
    assert!(ev.iter().any(|e| matches!(e, Event::Waiting { position: 1, holder: Some(HolderInfo { member_id, .. }), .. } if member_id == "other")));
    assert!(h.sent.is_empty(), "no join loop: {:?}", h.apis());
}

#[test]
fn rebalance_while_holding_native_keeps_the_lock_with_a_new_token() {
    let mut h = H::holding(5);
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    assert!(matches!(
        &beat.target,
        Target::Coordinator {
            lane: Lane::Control,
            ..
        }
    ));
    h.reply(beat.id, Ok(hb(27)));
    assert!(h
        .take_events()
        .iter()
        .any(|e| matches!(e, Event::RebalanceWhileHeld)));
    assert!(
        h.m.token().is_some(),
        "native mode holds through a rebalance"
    );
    let j = h.take(ApiKey::JoinGroup);
    // Our metadata claims the lock so the leader's sticky assignor keeps it with us.
    let m = MemberMetadata::decode(&join_request(&j).protocols[0].metadata).unwrap();
    assert!(m.holds);
    assert_eq!(m.holder_generation, 5);
    h.reply(j.id, Ok(join_ok("m1", 6, "m2", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m1"), 6, 0))));
    let ev = h.take_events();
    assert!(lost(&ev).is_none());
    assert!(ev
        .iter()
        .any(|e| matches!(e, Event::TokenChanged { token } if token.generation == 6)));
    assert_eq!(h.m.token().unwrap().generation, 6);
}

/// The ledger sends no checkpoint commit while `token().generation != generation()` (the
/// session's `awaiting_sync`): once the group is Stable, Apache's
/// ClassicGroup.validateOffsetCommit takes a commit from any member of the current generation,
/// holder or not. So the token must not take the new generation from the JoinGroup answer, only
/// from a SyncGroup answer that names us; one that names someone else ends the hold.
#[test]
fn a_holders_token_keeps_its_generation_until_the_sync_answer() {
    for (holder, keeps) in [("m1", true), ("m2", false)] {
        let mut h = H::holding(5);
        h.advance(HB);
        let beat = h.take(ApiKey::Heartbeat);
        h.reply(beat.id, Ok(hb(27)));
        let j = h.take(ApiKey::JoinGroup);
        h.reply(j.id, Ok(join_ok("m1", 6, "m2", &[])));
        assert_eq!(h.m.generation(), 6);
        assert_eq!(h.m.token().map(|t| t.generation), Some(5), "{holder}");
        let sync = h.take(ApiKey::SyncGroup);
        h.reply(sync.id, Ok(sync_ok(native_assignment(Some(holder), 6, 0))));
        let token = h.m.token().map(|t| t.generation);
        assert_eq!(token, keeps.then_some(6), "{holder}");
    }
}

#[test]
fn rebalance_while_holding_consumer_mode_surrenders_first() {
    let mut h = H::new(Mode::Consumer {
        topic: "lock-topic".into(),
    });
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    assert_eq!(join_request(&j).protocol_type.as_str(), "consumer");
    let names: Vec<_> = join_request(&j)
        .protocols
        .iter()
        .map(|p| p.name.to_string())
        .collect();
    assert_eq!(names, ["cooperative-sticky", "range", "roundrobin"]);
    let mut r = JoinGroupResponse::default();
    r.generation_id = 2;
    r.member_id = s("m1");
    r.leader = s("other");
    r.protocol_name = Some(s("range"));
    h.reply(j.id, Ok(Response::JoinGroup(r)));
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(
        sync.id,
        Ok(sync_ok(crate::assign::consumer_assignment(
            "lock-topic",
            &[0],
        ))),
    );
    h.confirm();
    assert!(h
        .take_events()
        .iter()
        .any(|e| matches!(e, Event::Acquired { .. })));
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(27)));
    let ev = h.take_events();
    assert_eq!(lost(&ev), Some(LossReason::Revoked));
    assert!(h.m.token().is_none(), "surrendered before rejoining");
    // The member stays (eager consumers rejoin) and only holds again if reassigned; having
    // surrendered, it claims nothing and offers every protocol.
    let j = h.take(ApiKey::JoinGroup);
    assert_eq!(join_request(&j).protocols.len(), 3);
    let claim = crate::assign::decode_consumer_subscription_of(
        &join_request(&j).protocols[0].metadata,
        "lock-topic",
    )
    .unwrap();
    assert!(!claim.owns_lock);
    let mut r = JoinGroupResponse::default();
    r.generation_id = 3;
    r.member_id = s("m1");
    r.leader = s("other");
    r.protocol_name = Some(s("range"));
    h.reply(j.id, Ok(Response::JoinGroup(r)));
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(
        sync.id,
        Ok(sync_ok(crate::assign::consumer_assignment(
            "lock-topic",
            &[0],
        ))),
    );
    h.confirm();
    let ev = h.take_events();
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::Acquired { token, .. } if token.generation == 3)),
        "{ev:?}"
    );
}

#[test]
fn lease_expires_while_coordinator_unreachable_and_late_success_does_not_revive() {
    let mut h = H::holding(3);
    let acquired_lease = h.m.lease_end().unwrap();
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    // The coordinator goes silent: the heartbeat is never answered. Up to a millisecond before
    // the lease end nothing is lost; at the lease end the loss is reported, timed at that end.
    let until_end = acquired_lease - h.now;
    h.advance(until_end - Duration::from_millis(1));
    assert!(
        lost(&h.take_events()).is_none(),
        "lost before the lease ended"
    );
    assert!(h.m.token().is_some());
    h.advance(Duration::from_millis(1));
    let ev = h.take_events();
    assert_eq!(lost(&ev), Some(LossReason::LeaseExpired));
    let lease_end = ev.iter().find_map(|e| match e {
        Event::Lost { lease_end, .. } => Some(*lease_end),
        _ => None,
    });
    assert_eq!(lease_end, Some(acquired_lease));
    // A NONE for the old heartbeat arrives late: nothing comes back.
    h.reply(beat.id, Ok(hb(0)));
    let ev = h.take_events();
    assert!(!ev
        .iter()
        .any(|e| matches!(e, Event::Acquired { .. } | Event::TokenChanged { .. })));
    assert!(h.m.token().is_none());
}

#[test]
fn lease_is_timed_from_send_not_receipt() {
    let mut h = H::holding(3);
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    let sent = h.now;
    h.advance(Duration::from_secs(4));
    h.reply(beat.id, Ok(hb(0)));
    assert_eq!(h.m.lease_end(), Some(sent + SESSION - MARGIN));
}

#[test]
fn answer_arriving_exactly_at_lease_end_does_not_renew() {
    let mut h = H::holding(3);
    h.advance(HB);
    let first = h.take(ApiKey::Heartbeat);
    h.reply(first.id, Ok(hb(0)));
    let lease_end = h.m.lease_end().unwrap();
    h.advance(HB);
    let late = h.take(ApiKey::Heartbeat);
    // Apache answers a blind NONE while loading; here it comes only once the lease is over.
    h.m.handle_response(late.id, Ok::<_, Error>(hb(0)), lease_end);
    h.drain();
    assert_eq!(lost(&h.take_events()), Some(LossReason::LeaseExpired));
}

#[test]
fn not_coordinator_mid_hold_rediscovers_without_loss() {
    let mut h = H::holding(4);
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(16)));
    h.advance(Duration::from_millis(100));
    let find = h.take(ApiKey::FindCoordinator);
    h.reply(find.id, Ok(find_ok()));
    let beat = h.take(ApiKey::Heartbeat);
    assert!(h.m.token().is_some());
    h.reply(beat.id, Ok(hb(0)));
    assert!(lost(&h.take_events()).is_none());
    assert_eq!(h.m.token().unwrap().generation, 4);
}

#[test]
fn coordinator_not_available_and_load_in_progress_retry() {
    let mut h = H::new(Mode::Native);
    let find = h.take(ApiKey::FindCoordinator);
    h.reply(find.id, Ok(find_err(15)));
    assert!(h.sent.is_empty(), "backoff before retrying");
    h.advance(Duration::from_millis(100));
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    h.reply(j.id, Ok(join_err(14, "")));
    // A FindCoordinator answer is not an answer from the coordinator: the backoff keeps
    // growing (100 ms, then 200 ms) until the coordinator itself answers.
    h.advance(Duration::from_millis(199));
    assert!(h.sent.is_empty());
    h.advance(Duration::from_millis(1));
    let j = h.take(ApiKey::JoinGroup);
    h.reply(j.id, Ok(join_err(15, "")));
    h.advance(Duration::from_millis(399));
    assert!(h.sent.is_empty());
    h.advance(Duration::from_millis(1));
    h.take(ApiKey::FindCoordinator);
}

#[test]
fn fatal_codes_end_the_membership_with_the_code() {
    // The listed ones, then codes that reach the catch-all for what no retry can fix:
    // INVALID_REQUEST (42) and a code this version does not know.
    for code in [23, 26, 30, 81, 82, 42, 999] {
        let mut h = H::new(Mode::Native);
        h.find_ok();
        let j = h.take(ApiKey::JoinGroup);
        h.reply(j.id, Ok(join_err(code, "")));
        assert_eq!(
            failed(&h.take_events()),
            Some(KafkaCode(code)),
            "code {code}"
        );
        assert!(h.m.is_done());
        h.advance(SESSION);
        assert!(
            h.sent.is_empty(),
            "code {code}: nothing after a fatal error: {:?}",
            h.apis()
        );
    }
}

/// Not authorized to use the group: FindCoordinator's GROUP_AUTHORIZATION_FAILED is as fatal as
/// JoinGroup's, not a lookup to retry for ever.
#[test]
fn a_lookup_refused_for_group_authorization_is_fatal() {
    let mut h = H::new(Mode::Native);
    let find = h.take(ApiKey::FindCoordinator);
    h.reply(find.id, Ok(find_err(30)));
    assert_eq!(failed(&h.take_events()), Some(KafkaCode(30)));
    assert!(h.m.is_done());
    h.advance(SESSION);
    assert!(h.sent.is_empty(), "{:?}", h.apis());
}

#[test]
fn fenced_instance_id_on_heartbeat_is_fatal_and_ends_the_hold() {
    // kafka-lock never joins as a static member, so a broker has no reason to send this; if one
    // does, the membership is not ours any more.
    let mut h = H::holding(2);
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(82)));
    let ev = h.take_events();
    assert_eq!(lost(&ev), Some(LossReason::Fenced(KafkaCode(82))));
    assert_eq!(failed(&ev), Some(KafkaCode(82)));
    assert!(h.m.is_done());
}

#[test]
fn illegal_generation_or_unknown_member_while_holding_is_a_loss() {
    for code in [22, 25] {
        let mut h = H::holding(7);
        h.advance(HB);
        let beat = h.take(ApiKey::Heartbeat);
        h.reply(beat.id, Ok(hb(code)));
        assert_eq!(
            lost(&h.take_events()),
            Some(LossReason::Fenced(KafkaCode(code)))
        );
        assert!(h.m.token().is_none());
    }
}

#[test]
fn waiter_rejoins_on_illegal_generation_keeping_its_id() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let sync = h.join_as("w1", 3, false, &[]);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("other"), 3, 1))));
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(22)));
    let j = h.take(ApiKey::JoinGroup);
    assert_eq!(join_request(&j).member_id.as_str(), "w1");
}

#[test]
fn waiter_forgotten_by_the_broker_forgets_its_id_and_generation() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let sync = h.join_as("w1", 3, false, &[]);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("other"), 3, 1))));
    assert_eq!((h.m.member_id(), h.m.generation()), ("w1", 3));
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(25)));
    // UNKNOWN_MEMBER_ID: the session is gone, so neither its id nor its generation names this
    // member any more (the ledger fences checkpoints with both); it joins again as a new member.
    assert_eq!((h.m.member_id(), h.m.generation()), ("", -1));
    let j = h.take(ApiKey::JoinGroup);
    assert_eq!(join_request(&j).member_id.as_str(), "");
}

#[test]
fn sync_errors_rejoin() {
    for code in [27, 22] {
        let mut h = H::new(Mode::Native);
        h.find_ok();
        let sync = h.join_as("w1", 3, false, &[]);
        h.reply(sync.id, Ok(sync_err(code)));
        let j = h.take(ApiKey::JoinGroup);
        assert_eq!(join_request(&j).member_id.as_str(), "w1", "code {code}");
    }
}

#[test]
fn leader_leaving_mid_rebalance_syncs_first_and_gives_the_lock_away() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    // The user gives up while the JoinGroup is parked at the broker.
    h.m.handle_command(Command::Leave, h.now);
    h.drain();
    assert!(
        h.sent.is_empty(),
        "must wait for the JoinGroup answer: {:?}",
        h.apis()
    );
    h.reply(
        j.id,
        Ok(join_ok(
            "m1",
            4,
            "m1",
            &[("m1", meta(false, 1)), ("m2", meta(false, 2))],
        )),
    );
    let sync = h.take(ApiKey::SyncGroup);
    let req = sync_request(&sync);
    assert_eq!(
        req.assignments.len(),
        2,
        "a leader assigns everyone even when leaving"
    );
    for a in &req.assignments {
        let na = NativeAssignment::decode(&a.assignment).unwrap();
        assert_eq!(
            na.holder.as_ref().map(|h| h.member_id.as_str()),
            Some("m2"),
            "the leaving leader must not pick itself"
        );
    }
    assert!(
        !h.apis().contains(&ApiKey::LeaveGroup),
        "no LeaveGroup before the SyncGroup answer"
    );
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m2"), 4, 1))));
    let leave = h.take(ApiKey::LeaveGroup);
    assert!(matches!(
        &leave.target,
        Target::Coordinator {
            lane: Lane::Control,
            ..
        }
    ));
    h.reply(leave.id, Ok(leave_ok()));
    let ev = h.take_events();
    assert!(!ev.iter().any(|e| matches!(e, Event::Acquired { .. })));
    assert!(ev
        .iter()
        .any(|e| matches!(e, Event::Left { confirmed: true })));
}

#[test]
fn a_leaving_leader_reports_bad_peer_metadata_but_not_its_own_blanked_entry() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    h.m.handle_command(Command::Leave, h.now);
    h.drain();
    let mut garbage = JoinGroupResponseMember::default();
    garbage.member_id = s("m3");
    garbage.metadata = Bytes::from_static(&[0xff, 0x00, 0x13]);
    let mut resp = match join_ok(
        "m1",
        4,
        "m1",
        &[("m1", meta(false, 1)), ("m2", meta(false, 2))],
    ) {
        Response::JoinGroup(r) => r,
        other => panic!("{other:?}"),
    };
    resp.members.push(garbage);
    h.reply(j.id, Ok(Response::JoinGroup(resp)));
    let reported: Vec<String> = h
        .take_events()
        .into_iter()
        .filter_map(|e| match e {
            Event::PeerData { what, .. } => Some(what),
            _ => None,
        })
        .collect();
    // The leader blanks its own metadata so that it cannot pick itself; that is not a peer's
    // fault. The member that really sent garbage is reported.
    assert_eq!(reported, vec!["metadata of member m3".to_string()]);
}

/// A release waits for a parked JoinGroup's answer, but not for ever: the leave's deadline is
/// announced by `poll_timeout`, and once it passes the machine is done without a confirmed leave.
#[test]
fn a_leave_waiting_for_an_unanswered_join_gives_up_at_its_deadline() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let _parked = h.take(ApiKey::JoinGroup);
    h.m.handle_command(Command::Leave, h.now);
    h.drain();
    let cfg = config(Mode::Native);
    let deadline = h.now + cfg.join_timeout() + cfg.request_timeout;
    assert_eq!(h.m.poll_timeout(), Some(deadline));
    h.now = deadline;
    h.m.handle_timeout(deadline);
    h.drain();
    assert!(h.m.is_done());
    assert!(h
        .take_events()
        .iter()
        .any(|e| matches!(e, Event::Left { confirmed: false })));
}

/// What a waiter that never held tells the leader's assignor: not holding, no holder
/// generation (-1, as docs/protocol.md has it), and its first join's generation once it has one.
#[test]
fn a_waiters_join_metadata_claims_no_hold() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    let req = join_request(&j);
    let md = MemberMetadata::decode(&req.protocols[0].metadata).unwrap();
    assert!(!md.holds);
    assert_eq!(md.holder_generation, -1);
    assert_eq!(md.first_joined_generation, -1);
}

/// The JoinGroup carries both timeouts: the session timeout and the bound of the join phase
/// (JoinGroup has the rebalance timeout from v1 on, KIP-62; at v0 the session timeout is used).
#[test]
fn the_join_carries_the_session_and_rebalance_timeouts() {
    let mut cfg = config(Mode::Native);
    cfg.rebalance_timeout = Duration::from_secs(4);
    let mut h = H::build(cfg, GroupVersions::LATEST);
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    let req = join_request(&j);
    assert_eq!(req.session_timeout_ms, SESSION.as_millis() as i32);
    assert_eq!(req.rebalance_timeout_ms, 4000);
}

/// From v5 the SyncGroup names the protocol type and the protocol the JoinGroup answer chose
/// (KIP-559), so that a coordinator can refuse a SyncGroup of another protocol.
#[test]
fn the_sync_names_the_protocol_type_and_the_chosen_protocol() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    h.reply(j.id, Ok(join_ok("m1", 1, "m1", &[("m1", meta(false, -1))])));
    let sync = h.take(ApiKey::SyncGroup);
    assert!(sync.version >= 5, "SyncGroup v{}", sync.version);
    let req = sync_request(&sync);
    assert_eq!(
        req.protocol_type.as_ref().map(|p| p.as_str()),
        Some(crate::assign::PROTOCOL_TYPE)
    );
    assert_eq!(
        req.protocol_name.as_ref().map(|p| p.as_str()),
        Some(crate::assign::NATIVE_PROTOCOL)
    );
}

/// The SyncGroup's protocol name is a copy: the connection decodes an answer's strings as slices
/// of the buffer it read the answer into, and a slice kept in the SyncGroup would keep that whole
/// buffer (8 KB or more) until the SyncGroup is answered.
#[test]
fn the_syncs_protocol_name_is_copied_out_of_the_join_answer() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    let name = crate::assign::NATIVE_PROTOCOL.as_bytes();
    let mut read = vec![0u8; 8192];
    read[100..100 + name.len()].copy_from_slice(name);
    let read = Bytes::from(read);
    let Response::JoinGroup(mut answer) = join_ok("m1", 1, "m1", &[("m1", meta(false, -1))]) else {
        unreachable!()
    };
    answer.protocol_name = Some(StrBytes::from_utf8(read.slice(100..100 + name.len())).unwrap());
    h.reply(j.id, Ok(Response::JoinGroup(answer)));
    let sync = h.take(ApiKey::SyncGroup);
    let req = sync_request(&sync);
    let kept = req
        .protocol_name
        .as_ref()
        .expect("SyncGroup v5+ names the protocol");
    assert_eq!(kept.as_str(), crate::assign::NATIVE_PROTOCOL);
    assert!(
        !read.as_ptr_range().contains(&kept.as_str().as_ptr()),
        "the SyncGroup keeps a slice of the JoinGroup answer's read buffer"
    );
}

/// A leave that waited for a JoinGroup goes ahead when that JoinGroup fails with an error the
/// machine would otherwise retry after a backoff.
#[test]
fn a_leave_waiting_for_a_join_goes_ahead_when_the_join_fails() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    h.reply(j.id, Ok(join_err(79, "m9")));
    let j = h.take(ApiKey::JoinGroup);
    h.m.handle_command(Command::Leave, h.now);
    h.drain();
    // COORDINATOR_LOAD_IN_PROGRESS.
    h.reply(j.id, Ok(join_err(14, "m9")));
    h.take(ApiKey::LeaveGroup);
}

/// A leave that waited for a SyncGroup goes ahead when that SyncGroup fails with an error the
/// machine would otherwise answer with a new JoinGroup.
#[test]
fn a_leave_waiting_for_a_sync_goes_ahead_when_the_sync_fails() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let sync = h.join_as("m1", 3, false, &[]);
    h.m.handle_command(Command::Leave, h.now);
    h.drain();
    assert!(
        h.sent.is_empty(),
        "must wait for the SyncGroup answer: {:?}",
        h.apis()
    );
    // REBALANCE_IN_PROGRESS.
    h.reply(sync.id, Ok(sync_err(27)));
    h.take(ApiKey::LeaveGroup);
    assert!(!h.apis().contains(&ApiKey::JoinGroup), "{:?}", h.apis());
}

#[test]
fn follower_leaving_mid_join_leaves_after_the_answer() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    h.reply(j.id, Ok(join_err(79, "m9")));
    let j = h.take(ApiKey::JoinGroup);
    h.m.handle_command(Command::Leave, h.now);
    h.drain();
    assert!(
        h.sent.is_empty(),
        "must wait for the JoinGroup answer: {:?}",
        h.apis()
    );
    h.reply(j.id, Ok(join_ok("m9", 4, "m1", &[])));
    let leave = h.take(ApiKey::LeaveGroup);
    match &leave.request {
        Request::LeaveGroup(r) => {
            assert_eq!(r.members[0].member_id.as_str(), "m9");
            // From v5 the broker logs why a member left (KIP-800).
            assert_eq!(
                r.members[0].reason.as_ref().map(|r| r.as_str()),
                Some("kafka-lock: released")
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(!h.apis().contains(&ApiKey::SyncGroup));
}

#[test]
fn join_parked_for_three_seconds_does_not_time_out() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    assert!(
        j.timeout > Duration::from_secs(3) + SESSION,
        "JoinGroup timeout {:?}",
        j.timeout
    );
    // Apache's group.initial.rebalance.delay.ms holds the first JoinGroup for 3 s.
    h.advance(Duration::from_secs(3));
    assert!(
        h.sent.is_empty(),
        "nothing re-sent while parked: {:?}",
        h.apis()
    );
    h.reply(j.id, Ok(join_ok("m1", 1, "m1", &[("m1", meta(false, -1))])));
    h.take(ApiKey::SyncGroup);
}

#[test]
fn release_while_holding_reports_released_before_leaving() {
    let mut h = H::holding(2);
    h.m.handle_command(Command::Leave, h.now);
    h.drain();
    let ev = h.take_events();
    assert!(matches!(ev.first(), Some(Event::Released)));
    assert!(h.m.token().is_none());
    let leave = h.take(ApiKey::LeaveGroup);
    h.reply(leave.id, Ok(leave_ok()));
    assert!(h.m.is_done());
}

#[test]
fn one_heartbeat_in_flight_and_none_during_join() {
    let mut h = H::holding(2);
    h.advance(HB * 5);
    assert_eq!(
        h.apis(),
        vec![ApiKey::Heartbeat],
        "one heartbeat in flight at a time"
    );
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(27)));
    h.take(ApiKey::JoinGroup);
    h.advance(HB * 3);
    assert!(
        h.sent.is_empty(),
        "no heartbeats while the JoinGroup is parked: {:?}",
        h.apis()
    );
}

#[test]
fn reassignment_to_someone_else_is_a_loss() {
    let mut h = H::holding(2);
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(27)));
    let j = h.take(ApiKey::JoinGroup);
    h.reply(j.id, Ok(join_ok("m1", 3, "m2", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m2"), 3, 1))));
    assert_eq!(lost(&h.take_events()), Some(LossReason::Reassigned));
}

#[test]
fn garbage_assignment_is_a_typed_peer_error_not_a_panic() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let sync = h.join_as("w1", 3, false, &[]);
    h.reply(
        sync.id,
        Ok(sync_ok(Bytes::from_static(&[0xff, 0x00, 0x13]))),
    );
    let ev = h.take_events();
    assert!(ev.iter().any(|e| matches!(e, Event::PeerData { .. })));
    assert!(!ev.iter().any(|e| matches!(e, Event::Acquired { .. })));
    // Nothing can be read from it: no holder, and an unknown place in the queue.
    assert!(
        ev.iter().any(|e| matches!(
            e,
            Event::Waiting {
                holder: None,
                holders,
                position: -1,
                generation: 3
            } if holders.is_empty()
        )),
        "{ev:?}"
    );
}

#[test]
fn leader_with_garbage_peer_metadata_still_assigns() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    let mut r = match join_ok("m1", 1, "m1", &[("m1", meta(false, -1))]) {
        Response::JoinGroup(r) => r,
        _ => unreachable!(),
    };
    let mut bad = JoinGroupResponseMember::default();
    bad.member_id = s("a-garbage");
    bad.metadata = Bytes::from_static(b"\xff\xff\xff\xff\xff");
    r.members.push(bad);
    h.reply(j.id, Ok(Response::JoinGroup(r)));
    let sync = h.take(ApiKey::SyncGroup);
    assert_eq!(sync_request(&sync).assignments.len(), 2);
    assert!(h
        .take_events()
        .iter()
        .any(|e| matches!(e, Event::PeerData { .. })));
}

#[test]
fn transport_failure_on_join_rediscovers() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    h.reply(j.id, Err(Error::Closed));
    h.advance(Duration::from_millis(100));
    h.take(ApiKey::FindCoordinator);
}

#[test]
fn unexpected_response_kind_is_a_protocol_error() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    h.reply(j.id, Ok(hb(0)));
    let err = failure(&h.take_events()).expect("the membership fails");
    assert!(
        matches!(&*err, Error::Protocol(m) if m.contains("JoinGroup") && m.contains("Heartbeat")),
        "{err:?}"
    );
    assert!(h.m.is_done());
}

/// A broker offering the group APIs at v0..=max.
fn group_apis_up_to(max: i16) -> Vec<(ApiKey, i16, i16)> {
    [
        ApiKey::FindCoordinator,
        ApiKey::JoinGroup,
        ApiKey::SyncGroup,
        ApiKey::Heartbeat,
        ApiKey::LeaveGroup,
    ]
    .into_iter()
    .map(|api| (api, 0, max))
    .collect()
}

#[test]
fn requests_fit_old_versions() {
    let v0 = GroupVersions {
        find_coordinator: 0,
        join_group: 0,
        sync_group: 0,
        heartbeat: 0,
        leave_group: 0,
    };
    let mut h = H::build(config(Mode::Native), v0);
    let find = h.take(ApiKey::FindCoordinator);
    assert_eq!(find.version, 0);
    h.reply(find.id, Ok(find_ok()));
    let probe = h.take(ApiKey::ApiVersions);
    h.reply(probe.id, Ok(api_versions(&group_apis_up_to(0))));
    let j = h.take(ApiKey::JoinGroup);
    assert_eq!(j.version, 0);
    let mut buf = bytes::BytesMut::new();
    crate::wire::codec::encode_request(&j.request, j.version, 1, Some("t"), &mut buf)
        .expect("v0 JoinGroup encodes");
}

#[test]
fn the_waiter_first_in_line_heartbeats_four_times_as_often() {
    for (position, period) in [(1, HB / 4), (2, HB)] {
        let mut h = H::new(Mode::Native);
        h.find_ok();
        let sync = h.join_as("w1", 3, false, &[]);
        h.reply(
            sync.id,
            Ok(sync_ok(native_assignment(Some("other"), 3, position))),
        );
        assert!(
            !h.take_events()
                .iter()
                .any(|e| matches!(e, Event::PeerData { .. })),
            "position {position}: the assignment must decode"
        );
        h.advance(period - Duration::from_millis(1));
        assert!(
            h.sent.is_empty(),
            "position {position}: too early: {:?}",
            h.apis()
        );
        h.advance(Duration::from_millis(1));
        let beat = h.take(ApiKey::Heartbeat);
        h.reply(beat.id, Ok(hb(0)));
        h.advance(period);
        h.take(ApiKey::Heartbeat);
    }
}

#[test]
fn the_holder_heartbeats_at_the_configured_interval() {
    let mut h = H::holding(2);
    h.advance(HB - Duration::from_millis(1));
    assert!(h.sent.is_empty(), "{:?}", h.apis());
    h.advance(Duration::from_millis(1));
    h.take(ApiKey::Heartbeat);
}

// ---- what renews the lease -----------------------------------------------------------------

fn lease_length() -> Duration {
    SESSION.min(SESSION) - MARGIN
}

/// Apache Kafka answers a follower that rejoins a STABLE group with unchanged metadata at once,
/// and a SyncGroup in STABLE at once, without re-arming the member's session timer
/// (GroupMetadataManager: classicGroupJoinExistingMember, classicGroupSyncToStableGroup). The
/// broker's timer was last re-armed when the parked JoinGroup completed, whose answer we never
/// saw; only a Heartbeat answered NONE proves a re-arm after it was sent.
#[test]
fn join_and_sync_answered_at_once_renew_nothing() {
    let mut h = H::holding(5);
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    let last_renewal = h.now;
    h.reply(beat.id, Ok(hb(0)));
    assert_eq!(h.m.lease_end(), Some(last_renewal + lease_length()));
    // t = 1: a rebalance starts; the parked JoinGroup completes at the broker, but its answer
    // is lost to a connection reset.
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(27)));
    let j = h.take(ApiKey::JoinGroup);
    h.advance(Duration::from_millis(500));
    h.reply(j.id, Err(Error::Closed));
    // Rediscovery takes a few seconds; the group is STABLE again meanwhile.
    h.advance(Duration::from_secs(3));
    let find = h.take(ApiKey::FindCoordinator);
    h.reply(find.id, Ok(find_ok()));
    let j = h.take(ApiKey::JoinGroup);
    h.reply(j.id, Ok(join_ok("m1", 6, "m2", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m1"), 6, 0))));
    assert_eq!(h.m.token().map(|t| t.generation), Some(6));
    assert_eq!(
        h.m.lease_end(),
        Some(last_renewal + lease_length()),
        "answers given at once must not move the lease"
    );
    // The member is cut off now: its lease ends where the last Heartbeat put it.
    let beat = h.take(ApiKey::Heartbeat);
    h.advance(SESSION);
    let ev = h.take_events();
    assert_eq!(lost(&ev), Some(LossReason::LeaseExpired));
    let lease_end = ev.iter().find_map(|e| match e {
        Event::Lost { lease_end, .. } => Some(*lease_end),
        _ => None,
    });
    assert_eq!(lease_end, Some(last_renewal + lease_length()));
    h.reply(beat.id, Ok(hb(0)));
    assert!(h.m.token().is_none(), "a late NONE revives nothing");
}

/// The Heartbeat right after the assignment is a holder's: ILLEGAL_GENERATION or
/// UNKNOWN_MEMBER_ID ends the hold that began with the assignment (an instant removal), and
/// REBALANCE_IN_PROGRESS keeps it into the next generation (native mode).
#[test]
fn a_heartbeat_right_after_the_assignment_is_a_holders() {
    for code in [22, 25] {
        let mut h = H::new(Mode::Native);
        h.find_ok();
        let sync = h.join_as("m1", 4, false, &[]);
        h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m1"), 4, 0))));
        let beat = h.take(ApiKey::Heartbeat);
        h.reply(beat.id, Ok(hb(code)));
        let ev = h.take_events();
        assert!(acquired_at(&ev, 4), "code {code}: {ev:?}");
        assert_eq!(lost(&ev), Some(LossReason::Fenced(KafkaCode(code))));
        assert!(h.m.token().is_none());
    }
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let sync = h.join_as("m1", 4, false, &[]);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m1"), 4, 0))));
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(27)));
    let j = h.take(ApiKey::JoinGroup);
    let md = MemberMetadata::decode(&join_request(&j).protocols[0].metadata).expect("metadata");
    assert!(md.holds, "{md:?}");
    h.reply(j.id, Ok(join_ok("m1", 5, "m2", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m1"), 5, 0))));
    assert_eq!(h.m.token().map(|t| t.generation), Some(5));
}

/// After a rebalance the holder heartbeats at once: its lease was not moved by the rebalance,
/// so the renewal should not wait a whole interval.
#[test]
fn a_holder_heartbeats_at_once_after_a_rebalance() {
    let mut h = H::holding(5);
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(27)));
    let j = h.take(ApiKey::JoinGroup);
    h.reply(j.id, Ok(join_ok("m1", 6, "m2", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m1"), 6, 0))));
    let beat = h.take(ApiKey::Heartbeat);
    let sent = h.now;
    h.reply(beat.id, Ok(hb(0)));
    assert_eq!(h.m.lease_end(), Some(sent + lease_length()));
}

// ---- a completed generation is visible to a single try -------------------------------------

/// `try_acquire` gives up at the first completed generation that does not make us the holder;
/// it can only see one if the machine says so, in every mode and for every assignment.
#[test]
fn every_completed_generation_that_is_not_ours_is_reported() {
    let consumer = Mode::Consumer {
        topic: "lock-topic".into(),
    };
    let cases: Vec<(Mode, Bytes)> = vec![
        // Consumer mode: someone else has partition 0; our assignment is empty.
        (consumer.clone(), Bytes::new()),
        // Consumer mode: an assignment of another topic.
        (
            consumer,
            crate::assign::consumer_assignment("other-topic", &[0]),
        ),
        // Native mode: an empty or undecodable assignment.
        (Mode::Native, Bytes::new()),
        (Mode::Native, Bytes::from_static(b"\xff\xff garbage")),
    ];
    for (mode, assignment) in cases {
        let mut h = H::new(mode.clone());
        h.find_ok();
        let j = h.take(ApiKey::JoinGroup);
        let mut r = JoinGroupResponse::default();
        r.generation_id = 7;
        r.member_id = s("m1");
        r.leader = s("other");
        r.protocol_name = Some(s(match mode {
            Mode::Native => crate::assign::NATIVE_PROTOCOL,
            Mode::Consumer { .. } => "range",
        }));
        h.reply(j.id, Ok(Response::JoinGroup(r)));
        let sync = h.take(ApiKey::SyncGroup);
        h.reply(sync.id, Ok(sync_ok(assignment.clone())));
        let ev = h.take_events();
        assert!(
            ev.iter()
                .any(|e| matches!(e, Event::Waiting { generation: 7, .. })),
            "{mode:?} {assignment:?}: {ev:?}"
        );
    }
}

// ---- versions follow the coordinator -------------------------------------------------------

fn found_at(node: i32, port: i32) -> Response {
    let Response::FindCoordinator(mut r) = find_ok() else {
        unreachable!()
    };
    r.coordinators[0].node_id = BrokerId(node);
    r.coordinators[0].port = port;
    Response::FindCoordinator(r)
}

/// The bootstrap broker may speak newer versions than the coordinator (a rolling upgrade): the
/// group's requests are built for the coordinator's versions, asked of it whenever it changes.
#[test]
fn requests_use_the_coordinators_versions_not_the_bootstrap_brokers() {
    let mut h = H::new(Mode::Native);
    let find = h.take(ApiKey::FindCoordinator);
    assert_eq!(find.version, GroupVersions::LATEST.find_coordinator);
    h.reply(find.id, Ok(found_at(2, 9093)));
    let probe = h.take(ApiKey::ApiVersions);
    assert!(
        matches!(&probe.target, Target::Coordinator { broker, lane: Lane::Control } if broker.node_id == 2)
    );
    let mut older = group_apis_up_to(3);
    older.push((ApiKey::ApiVersions, 0, 3));
    h.reply(probe.id, Ok(api_versions(&older)));
    let j = h.take(ApiKey::JoinGroup);
    assert_eq!(j.version, 3);
    h.reply(j.id, Ok(join_ok("m1", 1, "m1", &[("m1", meta(false, -1))])));
    let sync = h.take(ApiKey::SyncGroup);
    assert_eq!(sync.version, 3);
    let assignment = sync_request(&sync).assignments[0].assignment.clone();
    h.reply(sync.id, Ok(sync_ok(assignment)));
    let beat = h.take(ApiKey::Heartbeat);
    assert_eq!(beat.version, 3);
    h.reply(beat.id, Ok(hb(0)));
    assert!(h.m.token().is_some());
    // The coordinator moves to an upgraded broker: its versions are asked again and used.
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(16)));
    h.advance(Duration::from_millis(100));
    let find = h.take(ApiKey::FindCoordinator);
    h.reply(find.id, Ok(found_at(3, 9094)));
    let probe = h.take(ApiKey::ApiVersions);
    assert!(matches!(&probe.target, Target::Coordinator { broker, .. } if broker.node_id == 3));
    h.reply(probe.id, Ok(api_versions(crate::wire::versions::SUPPORTED)));
    let beat = h.take(ApiKey::Heartbeat);
    assert_eq!(beat.version, GroupVersions::LATEST.heartbeat);
    // Found again at the same broker: no second question.
    h.reply(beat.id, Ok(hb(15)));
    h.advance(Duration::from_secs(1));
    let find = h.take(ApiKey::FindCoordinator);
    h.reply(find.id, Ok(found_at(3, 9094)));
    assert_eq!(h.apis(), [ApiKey::Heartbeat]);
}

/// A coordinator without the group APIs is a typed failure, not an endless rediscovery.
#[test]
fn a_coordinator_without_group_apis_fails_with_a_version_error() {
    let mut h = H::new(Mode::Native);
    let find = h.take(ApiKey::FindCoordinator);
    h.reply(find.id, Ok(find_ok()));
    let probe = h.take(ApiKey::ApiVersions);
    h.reply(
        probe.id,
        Ok(api_versions(&[
            (ApiKey::ApiVersions, 0, 3),
            (ApiKey::Metadata, 0, 12),
        ])),
    );
    let ev = h.take_events();
    let err = ev.iter().find_map(|e| match e {
        Event::Failed(err) => Some(Error::from(err.clone())),
        _ => None,
    });
    assert!(matches!(err, Some(Error::Version(_))), "{err:?}");
    assert!(h.m.is_done());
}

// ---- backoff ---------------------------------------------------------------------------------

/// The driver sleeps until `poll_timeout`: a lookup scheduled after a failure must be announced
/// there, or nothing would wake the machine to send it. (`H::advance` also fires the timer at the
/// end of every step, so the other tests would not notice.)
#[test]
fn a_scheduled_lookup_is_announced_by_poll_timeout() {
    let mut h = H::new(Mode::Native);
    let find = h.take(ApiKey::FindCoordinator);
    h.reply(find.id, Err(Error::Closed));
    assert!(h.sent.is_empty(), "{:?}", h.apis());
    let at = h.m.poll_timeout().expect("the retry is scheduled");
    assert_eq!(at, h.now + Duration::from_millis(100));
    h.now = at;
    h.m.handle_timeout(at);
    h.drain();
    h.take(ApiKey::FindCoordinator);
}

/// The same for a JoinGroup retried after a backoff: without the announcement a waiter would sit
/// outside the group until some other timer woke it.
#[test]
fn a_scheduled_join_is_announced_by_poll_timeout() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let join = h.take(ApiKey::JoinGroup);
    // COORDINATOR_LOAD_IN_PROGRESS: the same coordinator, after a backoff.
    h.reply(join.id, Ok(join_err(14, "")));
    assert!(h.sent.is_empty(), "{:?}", h.apis());
    let at = h.m.poll_timeout().expect("the retry is scheduled");
    assert!(at > h.now, "the retry waits for its backoff");
    h.now = at;
    h.m.handle_timeout(at);
    h.drain();
    h.take(ApiKey::JoinGroup);
}

/// A coordinator that is named but cannot be reached is looked up with a growing delay, not
/// every 100 ms forever: only an answer from the coordinator itself resets the backoff.
#[test]
fn an_unreachable_coordinator_is_retried_with_a_growing_delay() {
    let mut h = H::new(Mode::Native);
    let mut gaps = Vec::new();
    let mut last = h.now;
    for _ in 0..6 {
        let find = h.take(ApiKey::FindCoordinator);
        gaps.push(h.now - last);
        last = h.now;
        h.reply(find.id, Ok(find_ok()));
        let probe = h.take(ApiKey::ApiVersions);
        h.reply(probe.id, Err(Error::Closed));
        while h.sent.is_empty() {
            h.advance(Duration::from_millis(10));
        }
    }
    let ms: Vec<u128> = gaps.iter().map(|d| d.as_millis()).collect();
    assert_eq!(ms, [0, 100, 200, 400, 800, 1000]);
}

// ---- consumer-compatible mode under cooperative-sticky -----------------------------------------

const LOCK_TOPIC: &str = "lock-topic";

fn consumer_mode() -> Mode {
    Mode::Consumer {
        topic: LOCK_TOPIC.into(),
    }
}

/// A JoinGroup answer in consumer mode, `protocol` selected; the leader gets `members`.
fn consumer_join(
    member: &str,
    generation: i32,
    leader: &str,
    protocol: &str,
    members: &[(&str, Bytes)],
) -> Response {
    let mut r = JoinGroupResponse::default();
    r.generation_id = generation;
    r.member_id = s(member);
    r.leader = s(leader);
    r.protocol_type = Some(s("consumer"));
    r.protocol_name = Some(s(protocol));
    r.members = members
        .iter()
        .map(|(id, meta)| {
            let mut m = JoinGroupResponseMember::default();
            m.member_id = s(id);
            m.metadata = meta.clone();
            m
        })
        .collect();
    Response::JoinGroup(r)
}

fn partition_zero() -> Bytes {
    crate::assign::consumer_assignment(LOCK_TOPIC, &[0])
}

fn nothing() -> Bytes {
    crate::assign::consumer_assignment(LOCK_TOPIC, &[])
}

/// The protocols a JoinGroup offers, and what its cooperative-sticky subscription claims.
fn offered(t: &Transmit) -> (Vec<String>, crate::assign::ConsumerSubscription) {
    let req = join_request(t);
    let names = req.protocols.iter().map(|p| p.name.to_string()).collect();
    let coop = req
        .protocols
        .iter()
        .find(|p| p.name.as_str() == "cooperative-sticky")
        .expect("cooperative-sticky is always offered");
    let sub = crate::assign::decode_consumer_subscription_of(&coop.metadata, LOCK_TOPIC).unwrap();
    (names, sub)
}

/// A consumer-mode machine holding partition 0 as "m1" in `generation`, `protocol` selected.
fn consumer_holding(generation: i32, protocol: &str) -> H {
    let mut h = H::new(consumer_mode());
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    let (names, sub) = offered(&j);
    assert_eq!(names, ["cooperative-sticky", "range", "roundrobin"]);
    assert_eq!((sub.owns_lock, sub.generation), (false, -1));
    h.reply(
        j.id,
        Ok(consumer_join("m1", generation, "other", protocol, &[])),
    );
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(sync.id, Ok(sync_ok(partition_zero())));
    h.confirm();
    assert!(h
        .take_events()
        .iter()
        .any(|e| matches!(e, Event::Acquired { token, .. } if token.generation == generation)));
    h
}

#[test]
fn a_cooperative_holder_keeps_partition_zero_through_a_rebalance() {
    let mut h = consumer_holding(4, "cooperative-sticky");
    let lease_before = h.m.lease_end().unwrap();
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(27)));
    let ev = h.take_events();
    assert!(lost(&ev).is_none(), "{ev:?}");
    assert!(ev.iter().any(|e| matches!(e, Event::RebalanceWhileHeld)));
    assert!(h.m.token().is_some());
    // It rejoins claiming partition 0, and offers nothing but cooperative-sticky, so the next
    // generation cannot be an eager one that hands the partition to someone else.
    let j = h.take(ApiKey::JoinGroup);
    let (names, sub) = offered(&j);
    assert_eq!(names, ["cooperative-sticky"]);
    assert_eq!(sub.topics, [LOCK_TOPIC]);
    assert_eq!((sub.owns_lock, sub.generation), (true, 4));
    // REBALANCE_IN_PROGRESS renewed nothing.
    assert_eq!(h.m.lease_end(), Some(lease_before));
    h.reply(
        j.id,
        Ok(consumer_join("m1", 5, "other", "cooperative-sticky", &[])),
    );
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(sync.id, Ok(sync_ok(partition_zero())));
    let ev = h.take_events();
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::TokenChanged { token } if token.generation == 5)),
        "{ev:?}"
    );
    // The heartbeat that follows at once renews the kept hold.
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(0)));
    assert!(h.m.lease_end().unwrap() > lease_before);
    assert_eq!(h.m.token().unwrap().generation, 5);
}

#[test]
fn an_eager_generation_still_surrenders_at_the_rebalance() {
    let mut h = consumer_holding(2, "range");
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(27)));
    assert_eq!(lost(&h.take_events()), Some(LossReason::Revoked));
    let (names, sub) = offered(&h.take(ApiKey::JoinGroup));
    assert_eq!(names.len(), 3);
    assert!(!sub.owns_lock);
}

#[test]
fn a_cooperative_holder_refused_by_an_eager_group_surrenders_and_rejoins_with_every_protocol() {
    let mut h = consumer_holding(4, "cooperative-sticky");
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(27)));
    let j = h.take(ApiKey::JoinGroup);
    assert_eq!(offered(&j).0, ["cooperative-sticky"]);
    // A member offering only range joined the rebalance first.
    h.reply(j.id, Ok(join_err(23, "m1")));
    let ev = h.take_events();
    assert_eq!(lost(&ev), Some(LossReason::Revoked));
    assert!(failure(&ev).is_none(), "not fatal: {ev:?}");
    let j = h.take(ApiKey::JoinGroup);
    let (names, sub) = offered(&j);
    assert_eq!(names, ["cooperative-sticky", "range", "roundrobin"]);
    assert!(!sub.owns_lock);
    assert_eq!(
        join_request(&j).member_id.as_str(),
        "m1",
        "still the same member"
    );
    // A second refusal is not a cooperative holder's any more: fatal, as before.
    h.reply(j.id, Ok(join_err(23, "m1")));
    assert_eq!(failed(&h.take_events()), Some(KafkaCode(23)));
}

#[test]
fn a_consumer_mode_waiter_has_no_known_place_in_the_queue() {
    // Kafka's consumer assignment names partitions, not a queue, and a leader may leave a member
    // out of the assignment altogether (empty bytes): either way the position is unknown.
    for assignment in [nothing(), Bytes::new()] {
        let mut h = H::new(consumer_mode());
        h.find_ok();
        let j = h.take(ApiKey::JoinGroup);
        h.reply(j.id, Ok(consumer_join("m2", 3, "java-1", "range", &[])));
        let sync = h.take(ApiKey::SyncGroup);
        h.reply(sync.id, Ok(sync_ok(assignment.clone())));
        let ev = h.take_events();
        assert!(
            ev.iter().any(|e| matches!(
                e,
                Event::Waiting {
                    holder: None,
                    holders,
                    position: -1,
                    generation: 3
                } if holders.is_empty()
            )),
            "{assignment:?}: {ev:?}"
        );
    }
}

#[test]
fn a_cooperative_assignment_without_partition_zero_is_a_loss() {
    let mut h = consumer_holding(4, "cooperative-sticky");
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(27)));
    let j = h.take(ApiKey::JoinGroup);
    h.reply(
        j.id,
        Ok(consumer_join("m1", 5, "other", "cooperative-sticky", &[])),
    );
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(sync.id, Ok(sync_ok(nothing())));
    assert_eq!(lost(&h.take_events()), Some(LossReason::Reassigned));
    assert!(h.m.token().is_none());
    assert!(h.apis().contains(&ApiKey::LeaveGroup), "{:?}", h.apis());
}

#[test]
fn a_cooperative_leader_keeps_partition_zero_with_its_owner() {
    use crate::assign::cooperative_subscription;
    let mut h = H::new(consumer_mode());
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    // "a-new" sorts first (range would pick it); "z-java" owns the partition since generation 6.
    let members = [
        ("a-new", cooperative_subscription(LOCK_TOPIC, false, -1)),
        ("m1", cooperative_subscription(LOCK_TOPIC, false, -1)),
        ("z-java", cooperative_subscription(LOCK_TOPIC, true, 6)),
    ];
    h.reply(
        j.id,
        Ok(consumer_join("m1", 7, "m1", "cooperative-sticky", &members)),
    );
    let sync = h.take(ApiKey::SyncGroup);
    let holders: Vec<&str> = sync_request(&sync)
        .assignments
        .iter()
        .filter(|a| {
            crate::assign::decode_consumer_assignment(&a.assignment)
                .unwrap()
                .iter()
                .any(|(t, p)| t == LOCK_TOPIC && p.contains(&0))
        })
        .map(|a| a.member_id.as_str())
        .collect();
    assert_eq!(holders, ["z-java"]);
}

/// The starting versions came from the broker that turns out to be the coordinator: nothing to
/// ask it, the JoinGroup goes out at once.
#[test]
fn a_coordinator_at_the_bootstrap_address_is_not_asked_again() {
    let mut h = H::new(Mode::Native);
    h.m.versions_from("127.0.0.1", 9092);
    let find = h.take(ApiKey::FindCoordinator);
    h.reply(find.id, Ok(find_ok()));
    assert_eq!(h.apis(), [ApiKey::JoinGroup]);
    // Another address is asked.
    let mut h = H::new(Mode::Native);
    h.m.versions_from("127.0.0.1", 9093);
    let find = h.take(ApiKey::FindCoordinator);
    h.reply(find.id, Ok(find_ok()));
    assert_eq!(h.apis(), [ApiKey::ApiVersions]);
}

/// Versions the owner sets (another connection negotiated lower ones) are those the next
/// requests are built at: a request above what the broker offers would be refused.
#[test]
fn versions_set_by_the_owner_are_used_for_the_next_requests() {
    let lower = GroupVersions {
        join_group: 5,
        ..GroupVersions::LATEST
    };
    let mut h = H::new(Mode::Native);
    h.m.versions_from("127.0.0.1", 9092);
    h.m.set_versions(lower);
    let find = h.take(ApiKey::FindCoordinator);
    h.reply(find.id, Ok(find_ok()));
    assert_eq!(h.take(ApiKey::JoinGroup).version, 5);
}

/// Whether a leave was confirmed is what `release()` reports: only an answer from the
/// coordinator saying the member is gone confirms it.
#[test]
fn a_leave_is_confirmed_only_by_the_coordinators_answer() {
    let left = |h: &H| {
        h.events.iter().find_map(|e| match e {
            Event::Left { confirmed } => Some(*confirmed),
            _ => None,
        })
    };
    let cases: Vec<(Result<Response, Error>, bool)> = vec![
        (Ok(leave_ok()), true),
        (Ok(leave_member_err(25)), true),
        (Ok(leave_member_err(15)), false),
        (Err(Error::Closed), false),
    ];
    for (answer, confirmed) in cases {
        let mut h = H::holding(3);
        h.m.handle_command(Command::Leave, h.now);
        h.drain();
        let leave = h.take(ApiKey::LeaveGroup);
        h.reply(leave.id, answer);
        assert_eq!(left(&h), Some(confirmed));
    }
    // A machine that never got a member id has nothing to leave.
    let mut h = H::new(Mode::Native);
    h.m.handle_command(Command::Leave, h.now);
    h.drain();
    assert_eq!(left(&h), Some(true));
    // An unreachable coordinator: the machine gives up at its own deadline, unconfirmed.
    let mut h = H::holding(3);
    h.m.handle_command(Command::Leave, h.now);
    h.drain();
    let _unanswered = h.take(ApiKey::LeaveGroup);
    h.advance(Duration::from_secs(60));
    assert_eq!(left(&h), Some(false));
}

fn leave_member_err(code: i16) -> Response {
    use kafka_protocol::messages::leave_group_response::MemberResponse;
    let Response::LeaveGroup(mut r) = leave_ok() else {
        unreachable!()
    };
    let mut m = MemberResponse::default();
    m.member_id = s("m1");
    m.error_code = code;
    r.members = vec![m];
    Response::LeaveGroup(r)
}

/// The ledger's news of a release reaches a waiter as `HeartbeatNow`: a heartbeat at once, or,
/// with one in flight (sent before the news), another as soon as it is answered; the answer, not
/// the news, decides.
#[test]
fn heartbeat_now_heartbeats_at_once_or_right_after_the_one_in_flight() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let sync = h.join_as("w1", 3, false, &[]);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("other"), 3, 2))));
    h.advance(Duration::from_millis(10));
    assert!(h.sent.is_empty(), "{:?}", h.apis());
    let now = h.now;
    h.m.handle_command(Command::HeartbeatNow, now);
    h.drain();
    let beat = h.take(ApiKey::Heartbeat);

    // News while that one is in the air: it may predate the release.
    h.m.handle_command(Command::HeartbeatNow, now);
    h.drain();
    assert!(h.sent.is_empty(), "one heartbeat in flight at a time");
    h.reply(beat.id, Ok(hb(0)));
    let again = h.take(ApiKey::Heartbeat);
    // This one finds the rebalance: the waiter rejoins at once.
    h.reply(again.id, Ok(hb(27)));
    h.take(ApiKey::JoinGroup);
    // The nudge is spent: the next heartbeat keeps the interval.
    let mut h2 = H::new(Mode::Native);
    h2.find_ok();
    let sync = h2.join_as("w1", 3, false, &[]);
    h2.reply(sync.id, Ok(sync_ok(native_assignment(Some("other"), 3, 2))));
    let now = h2.now;
    h2.m.handle_command(Command::HeartbeatNow, now);
    h2.drain();
    let beat = h2.take(ApiKey::Heartbeat);
    h2.reply(beat.id, Ok(hb(0)));
    h2.advance(HB - Duration::from_millis(1));
    assert!(h2.sent.is_empty(), "{:?}", h2.apis());
}

/// The ledger's news that a hold of the waiter's own generation ended makes the waiter's first
/// request a JoinGroup (the holder's leave began a rebalance the waiter has not seen; a Heartbeat
/// would only answer REBALANCE_IN_PROGRESS): one round trip less per handover. News of another
/// generation's hold, or any news while holding, is only a heartbeat, as `HeartbeatNow`.
#[test]
fn hold_ended_in_the_waiters_generation_rejoins_at_once_otherwise_it_heartbeats() {
    let waiting = || {
        let mut h = H::new(Mode::Native);
        h.find_ok();
        let sync = h.join_as("w1", 3, false, &[]);
        h.reply(sync.id, Ok(sync_ok(native_assignment(Some("other"), 3, 1))));
        h.advance(Duration::from_millis(10));
        assert!(h.sent.is_empty(), "{:?}", h.apis());
        h
    };

    let mut h = waiting();
    let now = h.now;
    h.m.handle_command(
        Command::HoldEnded {
            generation: 3,
            member_id: "other".into(),
        },
        now,
    );
    h.drain();
    assert_eq!(
        h.apis(),
        [ApiKey::JoinGroup],
        "the JoinGroup goes out first"
    );

    // With a heartbeat in flight (sent before the news) the JoinGroup still goes at once; that
    // heartbeat's answer, when it comes, changes nothing.
    let mut h = waiting();
    let now = h.now;
    h.m.handle_command(Command::HeartbeatNow, now);
    h.drain();
    let beat = h.take(ApiKey::Heartbeat);
    h.m.handle_command(
        Command::HoldEnded {
            generation: 3,
            member_id: "other".into(),
        },
        now,
    );
    h.drain();
    let join = h.take(ApiKey::JoinGroup);
    h.reply(beat.id, Ok(hb(27)));
    assert!(h.sent.is_empty(), "{:?}", h.apis());
    h.reply(join.id, Ok(join_ok("w1", 4, "someone-else", &[])));
    h.take(ApiKey::SyncGroup);

    // An older generation's hold: the group may have moved on, the coordinator decides.
    let mut h = waiting();
    let now = h.now;
    h.m.handle_command(
        Command::HoldEnded {
            generation: 2,
            member_id: "other".into(),
        },
        now,
    );
    h.drain();
    assert_eq!(h.apis(), [ApiKey::Heartbeat]);

    // A holder is never made to rejoin by a record.
    let mut h = H::holding(3);
    h.advance(Duration::from_millis(10));
    h.sent.clear();
    let now = h.now;
    h.m.handle_command(
        Command::HoldEnded {
            generation: 3,
            member_id: "other".into(),
        },
        now,
    );
    h.drain();
    assert_eq!(h.apis(), [ApiKey::Heartbeat]);
}

/// A RELEASED or LOST record of the waiter's generation that names no holder of its assignment
/// (anyone who may write the ledger topic can append one) is only a heartbeat: otherwise every
/// such record would make each waiter rejoin, and a leader among them start a rebalance. In
/// consumer-compatible mode a waiter's assignment names no holder, so it always heartbeats.
#[test]
fn hold_ended_naming_no_holder_of_the_waiters_assignment_is_only_a_heartbeat() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let sync = h.join_as("w1", 3, false, &[]);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("other"), 3, 1))));
    h.advance(Duration::from_millis(10));
    h.sent.clear();
    let now = h.now;
    h.m.handle_command(
        Command::HoldEnded {
            generation: 3,
            member_id: "intruder".into(),
        },
        now,
    );
    h.drain();
    assert_eq!(h.apis(), [ApiKey::Heartbeat]);

    let mut h = H::new(Mode::Consumer { topic: "t".into() });
    h.find_ok();
    let sync = h.join_as("w1", 3, false, &[]);
    h.reply(sync.id, Ok(sync_ok(nothing())));
    h.advance(Duration::from_millis(10));
    h.sent.clear();
    let now = h.now;
    h.m.handle_command(
        Command::HoldEnded {
            generation: 3,
            member_id: "other".into(),
        },
        now,
    );
    h.drain();
    assert_eq!(h.apis(), [ApiKey::Heartbeat]);
}

// ---- permits ------------------------------------------------------------------------------

fn semaphore_config(permits: u16) -> MembershipConfig {
    MembershipConfig {
        permits,
        ..config(Mode::Native)
    }
}

/// An assignment of `permits` naming `holders` as (member, slot) at `generation`.
fn permits_assignment(
    permits: u16,
    holders: &[(&str, u16)],
    generation: i32,
    position: i32,
) -> Bytes {
    let mut all: Vec<Holder> = holders
        .iter()
        .map(|(id, slot)| Holder {
            member_id: (*id).into(),
            label: None,
            generation,
            slot: *slot,
        })
        .collect();
    all.sort_by_key(|h| h.slot);
    let mut it = all.into_iter();
    NativeAssignment {
        holder: it.next(),
        position,
        members: 4,
        permits,
        other_holders: it.collect(),
        ledger: None,
    }
    .encode()
}

#[test]
fn a_permit_in_another_slot_than_the_first_is_held_with_that_slot() {
    let mut h = H::with(semaphore_config(3));
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    let offered = MemberMetadata::decode(&join_request(&j).protocols[0].metadata).unwrap();
    assert_eq!(
        (offered.permits, offered.slot, offered.holds),
        (3, 0, false)
    );
    h.reply(j.id, Ok(join_ok("m1", 4, "m0", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(
        sync.id,
        Ok(sync_ok(permits_assignment(
            3,
            &[("m0", 0), ("m1", 2)],
            4,
            0,
        ))),
    );
    h.confirm();
    let acquired = h.take_events().into_iter().find_map(|e| match e {
        Event::Acquired { permit, token, .. } => Some((permit, token.generation)),
        _ => None,
    });
    assert_eq!(acquired, Some((2, 4)));
    // Its next JoinGroup claims slot 2.
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(27)));
    let j = h.take(ApiKey::JoinGroup);
    let claim = MemberMetadata::decode(&join_request(&j).protocols[0].metadata).unwrap();
    assert_eq!(
        (
            claim.permits,
            claim.slot,
            claim.holds,
            claim.holder_generation
        ),
        (3, 2, true, 4)
    );
    // Named in another slot: a hold never moves, so that is a loss.
    h.reply(j.id, Ok(join_ok("m1", 5, "m0", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(
        sync.id,
        Ok(sync_ok(permits_assignment(
            3,
            &[("m0", 0), ("m1", 1)],
            5,
            0,
        ))),
    );
    assert_eq!(lost(&h.take_events()), Some(LossReason::Reassigned));
}

#[test]
fn another_number_of_permits_fails_with_both_numbers_and_leaves() {
    // A waiter with 3 permits, told by a leader from before permits (a minor-0 assignment).
    let mut h = H::with(semaphore_config(3));
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    h.reply(j.id, Ok(join_ok("m1", 4, "m0", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m0"), 4, 1))));
    let events = h.take_events();
    match failure(&events).as_deref() {
        Some(Error::PermitsMismatch { lock, ours, group }) => {
            assert_eq!((lock.as_str(), *ours, *group), ("nightly-job", 3, 1));
        }
        other => panic!("{other:?}"),
    }
    assert!(!events.iter().any(|e| matches!(e, Event::Waiting { .. })));
    let leave = h.take(ApiKey::LeaveGroup);
    h.reply(leave.id, Ok(leave_ok()));
    assert!(h.m.is_done());

    // A mutex holder in a group that the leader now runs with 2 permits loses at once.
    let mut h = H::holding(2);
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(27)));
    let j = h.take(ApiKey::JoinGroup);
    h.reply(j.id, Ok(join_ok("m1", 3, "m2", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(
        sync.id,
        Ok(sync_ok(permits_assignment(2, &[("m2", 0)], 3, -1))),
    );
    let events = h.take_events();
    assert_eq!(lost(&events), Some(LossReason::Fatal));
    assert!(matches!(
        failure(&events).as_deref(),
        Some(Error::PermitsMismatch {
            ours: 1,
            group: 2,
            ..
        })
    ));
    h.take(ApiKey::LeaveGroup);
}

// ---- ledger setting -------------------------------------------------------------------------

fn ledger_config(ledger: Option<&str>) -> MembershipConfig {
    MembershipConfig {
        ledger: ledger.map(str::to_owned),
        ..config(Mode::Native)
    }
}

fn ledger_assignment(holder: Option<&str>, generation: i32, ledger: Option<&str>) -> Bytes {
    let mut a = NativeAssignment::decode(&native_assignment(holder, generation, 1)).unwrap();
    a.ledger = ledger.map(str::to_owned);
    a.encode()
}

#[test]
fn a_member_advertises_its_ledger_and_keeps_the_old_bytes_without_one() {
    let mut h = H::with(ledger_config(Some("lg")));
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    let offered = MemberMetadata::decode(&join_request(&j).protocols[0].metadata).unwrap();
    assert_eq!(offered.ledger.as_deref(), Some("lg"));

    let mut h = H::with(config(Mode::Native));
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    let bytes = &join_request(&j).protocols[0].metadata;
    assert_eq!(bytes[3], 0, "minor 0, as before ledgers");
}

#[test]
fn another_ledger_setting_fails_with_both_settings_and_leaves() {
    // A member with a ledger told by the leader that the group has none (also what a leader
    // from before ledgers says).
    let mut h = H::with(ledger_config(Some("lg")));
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    h.reply(j.id, Ok(join_ok("m1", 4, "m0", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m0"), 4, 1))));
    let events = h.take_events();
    match failure(&events).as_deref() {
        Some(e @ Error::LedgerMismatch { lock, ours, group }) => {
            assert_eq!(
                (lock.as_str(), ours.as_deref(), group.as_deref()),
                ("nightly-job", Some("lg"), None)
            );
            let text = e.to_string();
            assert!(
                text.contains("\"lg\"") && text.contains("no ledger topic"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(!events.iter().any(|e| matches!(e, Event::Waiting { .. })));
    let leave = h.take(ApiKey::LeaveGroup);
    h.reply(leave.id, Ok(leave_ok()));
    assert!(h.m.is_done());

    // Two ledger topics: the member is even named holder, but never holds.
    let mut h = H::with(ledger_config(Some("two")));
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    h.reply(j.id, Ok(join_ok("m1", 4, "m0", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(
        sync.id,
        Ok(sync_ok(ledger_assignment(Some("m1"), 4, Some("one")))),
    );
    let events = h.take_events();
    assert!(matches!(
        failure(&events).as_deref(),
        Some(Error::LedgerMismatch { .. })
    ));
    assert!(!events.iter().any(|e| matches!(e, Event::Acquired { .. })));
    h.take(ApiKey::LeaveGroup);
    assert!(
        !h.apis().contains(&ApiKey::Heartbeat),
        "no heartbeat confirms a hold"
    );
}

#[test]
fn a_holder_told_of_another_ledger_setting_loses_at_once() {
    let mut h = H::holding(2);
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(27)));
    let j = h.take(ApiKey::JoinGroup);
    h.reply(j.id, Ok(join_ok("m1", 3, "m2", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(sync.id, Ok(sync_ok(ledger_assignment(None, 3, Some("lg")))));
    let events = h.take_events();
    assert_eq!(lost(&events), Some(LossReason::Fatal));
    assert!(matches!(
        failure(&events).as_deref(),
        Some(Error::LedgerMismatch { ours: None, group: Some(g), .. }) if g == "lg"
    ));
    h.take(ApiKey::LeaveGroup);
}

// ---- an assignment has a deadline -----------------------------------------------------------
//
// The broker's session timer for us was last re-armed when the join phase of the generation
// completed, which is after our JoinGroup was sent, and nothing later is proof. A SyncGroup answer
// naming us (never given blindly) begins the hold only before that JoinGroup's send instant + the
// lease length, and the first lease ends there. A coordinator that is still loading the group
// answers a Heartbeat NONE blindly, also for a member it is about to forget, so only a NONE
// handled before the lease end may renew it.

fn acquired_at(events: &[Event], generation: i32) -> bool {
    events
        .iter()
        .any(|e| matches!(e, Event::Acquired { token, .. } if token.generation == generation))
}

/// Answers every request the machine sends with `answer(now, transmit)` (None: leave it
/// unanswered) and moves the clock in steps of `step` until `until`, collecting the events.
fn serve(
    h: &mut H,
    until: Instant,
    step: Duration,
    mut answer: impl FnMut(Instant, &Transmit) -> Option<Result<Response, Error>>,
) -> Vec<Event> {
    let mut events = Vec::new();
    while h.now < until && !h.m.is_done() {
        for t in std::mem::take(&mut h.sent) {
            if let Some(r) = answer(h.now, &t) {
                h.reply(t.id, r);
            }
        }
        events.extend(h.take_events());
        h.advance(step);
        events.extend(h.take_events());
    }
    events
}

/// The first lease of a hold, from the assignment: acquired at generation 4 with this lease end.
fn acquired_lease(events: &[Event], generation: i32) -> Option<Instant> {
    events.iter().find_map(|e| match e {
        Event::Acquired {
            token, lease_end, ..
        } if token.generation == generation => Some(*lease_end),
        _ => None,
    })
}

/// The path of a hold begun late: the member is assigned the lock at generation 4; every
/// Heartbeat fails for three session timeouts while FindCoordinator keeps naming node 1 (which
/// dropped the member long ago and gave the lock to someone else); then the group moves to node 2,
/// which is still loading and answers the Heartbeat NONE blindly (GroupCoordinatorService
/// `heartbeat`) and a JoinGroup with COORDINATOR_LOAD_IN_PROGRESS, then UNKNOWN_MEMBER_ID once
/// loaded, since the member is not in the group it loaded. The hold begins at the assignment and
/// ends at its first lease end, the JoinGroup's send + the lease length, long before the broker
/// could drop the member; the blind NONE comes after that and revives nothing.
#[test]
fn a_hold_cut_off_for_three_sessions_ends_at_its_first_lease_and_a_blind_none_revives_nothing() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let t0 = h.now;
    let sync = h.join_as("m1", 4, false, &[]);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m1"), 4, 0))));
    let moved = t0 + 3 * SESSION;
    let loaded = moved + Duration::from_secs(2);
    let mut events = h.take_events();
    events.extend(serve(
        &mut h,
        loaded + SESSION,
        Duration::from_millis(100),
        |now, t| {
            let before = now < moved;
            Some(match t.request.api_key() {
                ApiKey::FindCoordinator if before => Ok(found_at(1, 9092)),
                ApiKey::FindCoordinator => Ok(found_at(2, 9093)),
                ApiKey::ApiVersions => Ok(api_versions(crate::wire::versions::SUPPORTED)),
                ApiKey::Heartbeat if before => Err(Error::Closed),
                // Blind: node 2 is loading, or has loaded a group without us and this is the
                // first answer it gives; either way NONE is what Apache sends while loading.
                ApiKey::Heartbeat if now < loaded => Ok(hb(0)),
                ApiKey::Heartbeat => Ok(hb(25)),
                ApiKey::JoinGroup if before => Err(Error::Closed),
                ApiKey::JoinGroup if now < loaded => Ok(join_err(14, "")),
                ApiKey::JoinGroup if join_request(t).member_id.is_empty() => return None,
                ApiKey::JoinGroup => Ok(join_err(25, "")),
                ApiKey::LeaveGroup if before => Err(Error::Closed),
                ApiKey::LeaveGroup => Ok(leave_ok()),
                other => panic!("unexpected {other:?}"),
            })
        },
    ));
    assert_eq!(
        acquired_lease(&events, 4),
        Some(t0 + lease_length()),
        "{events:?}"
    );
    let ended = events.iter().find_map(|e| match e {
        Event::Lost { reason, lease_end } => Some((reason.clone(), *lease_end)),
        _ => None,
    });
    assert_eq!(
        ended,
        Some((LossReason::LeaseExpired, t0 + lease_length())),
        "{events:?}"
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, Event::Acquired { .. }))
            .count(),
        1,
        "{events:?}"
    );
    assert!(h.m.token().is_none());
}

/// The live-lock of a 120-episode fault-suite run (seed 20261202, episodes 47 and 49): a member
/// first in line keeps being assigned the lock, its join phases are slow and its confirming
/// Heartbeat's NONE (the coordinator defers a Heartbeat until earlier writes are committed) comes
/// after the deadline, so it left and rejoined every lease length for 330 s while the lock stayed
/// free. The SyncGroup answer, which came in time, now begins the hold, with the lease the join
/// phase proves; the slow NONE renews it. Each cycle here: the JoinGroup is answered 3.5 s after
/// it was sent, the SyncGroup 0.1 s later, the Heartbeat 6 s after it was sent (lease 9 s).
#[test]
fn a_slow_confirming_heartbeat_does_not_keep_an_assigned_member_from_holding() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let t0 = h.now;
    let mut joined: Option<Instant> = None;
    let mut sync_at: Option<(Instant, u64, String)> = None;
    let mut beats: Vec<(Instant, u64)> = Vec::new();
    let mut events = Vec::new();
    let mut pending_joins: Vec<(Instant, u64, String)> = Vec::new();
    let mut generation = 3;
    while h.now < t0 + 4 * SESSION && h.m.token().is_none() && !h.m.is_done() {
        for t in std::mem::take(&mut h.sent) {
            match t.request.api_key() {
                ApiKey::JoinGroup => {
                    let id = join_request(&t).member_id.to_string();
                    if id.is_empty() {
                        h.reply(t.id, Ok(join_err(79, &format!("m1-{generation}"))));
                    } else {
                        pending_joins.push((h.now + Duration::from_millis(3_500), t.id, id));
                    }
                }
                ApiKey::SyncGroup => {
                    let me = sync_request(&t).member_id.to_string();
                    sync_at = Some((h.now + Duration::from_millis(100), t.id, me));
                }
                ApiKey::Heartbeat => beats.push((h.now + Duration::from_secs(6), t.id)),
                ApiKey::LeaveGroup => h.reply(t.id, Ok(leave_ok())),
                other => panic!("unexpected {other:?}"),
            }
        }
        if let Some(i) = pending_joins.iter().position(|(at, ..)| *at <= h.now) {
            let (_, id, member) = pending_joins.remove(i);
            generation += 1;
            joined = Some(h.now);
            h.reply(id, Ok(join_ok(&member, generation, "m2", &[])));
        }
        if let Some((_, id, me)) = sync_at.take_if(|(at, ..)| *at <= h.now) {
            h.reply(id, Ok(sync_ok(native_assignment(Some(&me), generation, 0))));
        }
        while let Some(i) = beats.iter().position(|(at, _)| *at <= h.now) {
            let (_, id) = beats.remove(i);
            h.reply(id, Ok(hb(0)));
        }
        events.extend(h.take_events());
        h.advance(Duration::from_millis(50));
        events.extend(h.take_events());
    }
    assert!(joined.is_some());
    let acquired = events
        .iter()
        .find_map(|e| match e {
            Event::Acquired { token, .. } => Some(token.generation),
            _ => None,
        })
        .unwrap_or_else(|| panic!("never held in four session timeouts: {events:?}"));
    assert_eq!(acquired, 4, "held at the first assignment: {events:?}");
}

/// An assignment whose SyncGroup answer is handled at the JoinGroup's send instant + the lease
/// length begins nothing (the broker may have dropped the member by then); one handled 1 ms
/// before begins a hold whose lease ends at that instant, and a Heartbeat NONE handled after it
/// renews nothing.
#[test]
fn an_assignment_handled_at_its_deadline_begins_no_hold() {
    for (early, expect_hold) in [(Duration::ZERO, false), (Duration::from_millis(1), true)] {
        let mut h = H::new(Mode::Native);
        h.find_ok();
        let joined_sent = h.now;
        let j = h.take(ApiKey::JoinGroup);
        h.advance(Duration::from_secs(1));
        h.reply(j.id, Ok(join_ok("m1", 4, "m2", &[])));
        let sync = h.take(ApiKey::SyncGroup);
        let deadline = joined_sent + lease_length();
        h.now = deadline - early;
        h.m.handle_response(
            sync.id,
            Ok::<_, Error>(sync_ok(native_assignment(Some("m1"), 4, 0))),
            h.now,
        );
        h.drain();
        let events = h.take_events();
        if expect_hold {
            assert_eq!(acquired_lease(&events, 4), Some(deadline), "{events:?}");
            let beat = h.take(ApiKey::Heartbeat);
            h.m.handle_response(beat.id, Ok::<_, Error>(hb(0)), deadline);
            h.drain();
            assert_eq!(lost(&h.take_events()), Some(LossReason::LeaseExpired));
        } else {
            assert_eq!(acquired_lease(&events, 4), None, "{events:?}");
        }
        assert!(h.m.token().is_none());
    }
}

/// The hold begins at the SyncGroup answer, without waiting for a Heartbeat: its first lease
/// ends at the JoinGroup's send instant + the lease length (the join phase that formed the
/// generation re-armed the session timer after that JoinGroup arrived). The Heartbeat that goes
/// out at once renews it, timed from its own send.
#[test]
fn a_hold_begins_at_the_assignment_with_the_lease_the_join_proves() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let joined_sent = h.now;
    let j = h.take(ApiKey::JoinGroup);
    h.advance(Duration::from_millis(700));
    h.reply(j.id, Ok(join_ok("m1", 4, "m2", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    h.advance(Duration::from_millis(300));
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m1"), 4, 0))));
    let events = h.take_events();
    assert_eq!(
        acquired_lease(&events, 4),
        Some(joined_sent + lease_length()),
        "{events:?}"
    );
    assert_eq!(h.m.token().map(|t| t.generation), Some(4));
    // The renewing heartbeat goes out at once, not after an interval.
    let beat = h.take(ApiKey::Heartbeat);
    let sent = h.now;
    h.advance(Duration::from_millis(20));
    h.reply(beat.id, Ok(hb(0)));
    assert_eq!(h.m.lease_end(), Some(sent + lease_length()));
}

/// A JoinGroup answered with the generation the member already knows completed no join phase
/// (Apache answers a follower of a STABLE group at once, GMM classicGroupJoinExistingMember), so
/// it re-armed nothing: the deadline stays where the JoinGroup that first brought that generation
/// put it. Here the first SyncGroup goes unanswered (connection closed), the coordinator takes
/// 9.5 seconds to find again (past the deadline), and the rejoin is answered with the same
/// generation and the same assignment: no hold at generation 4.
#[test]
fn a_rejoin_answered_with_the_same_generation_does_not_move_the_deadline() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let joined_sent = h.now;
    let sync = h.join_as("m1", 4, false, &[]);
    h.advance(Duration::from_millis(500));
    h.reply(sync.id, Err(Error::Closed));
    let events = serve(
        &mut h,
        joined_sent + 2 * SESSION,
        Duration::from_millis(100),
        |now, t| {
            let found = now >= joined_sent + Duration::from_millis(9_500);
            Some(match t.request.api_key() {
                ApiKey::FindCoordinator if found => Ok(find_ok()),
                ApiKey::FindCoordinator => Ok(find_err(15)),
                ApiKey::JoinGroup if join_request(t).member_id.is_empty() => return None,
                ApiKey::JoinGroup => Ok(join_ok("m1", 4, "m2", &[])),
                ApiKey::SyncGroup => Ok(sync_ok(native_assignment(Some("m1"), 4, 0))),
                ApiKey::Heartbeat => Ok(hb(0)),
                ApiKey::ApiVersions => Ok(api_versions(crate::wire::versions::SUPPORTED)),
                ApiKey::LeaveGroup => Ok(leave_ok()),
                other => panic!("unexpected {other:?}"),
            })
        },
    );
    assert!(
        acquired_lease(&events, 4).is_none(),
        "held at generation 4 after its deadline: {events:?}"
    );
    assert!(h.m.token().is_none());
}

/// A renewal is applied only before the lease end. Here the Heartbeat is built 1 ms before the
/// lease end (its connection is then opened inside the request, which takes a while) and its NONE
/// is handled 1 ms after the lease end, before the machine's own timer fired (a starved task).
#[test]
fn a_renewal_built_before_the_lease_end_and_answered_after_renews_nothing() {
    let mut h = H::holding(3);
    let lease_end = h.m.lease_end().unwrap();
    // Keep the holder's heartbeats unanswered until 1 ms before the lease end.
    let first = {
        h.advance(HB);
        h.take(ApiKey::Heartbeat)
    };
    h.m.handle_response(first.id, Err(Error::Closed), h.now);
    h.drain();
    h.now = lease_end - Duration::from_millis(1);
    h.m.handle_timeout(h.now);
    h.drain();
    let find = h.take(ApiKey::FindCoordinator);
    h.m.handle_response(find.id, Ok::<_, Error>(find_ok()), h.now);
    h.drain();
    let beat = h.take(ApiKey::Heartbeat);
    assert!(
        h.m.token().is_some(),
        "still held when the heartbeat is built"
    );
    h.m.handle_response(
        beat.id,
        Ok::<_, Error>(hb(0)),
        lease_end + Duration::from_millis(1),
    );
    h.drain();
    let events = h.take_events();
    assert_eq!(lost(&events), Some(LossReason::LeaseExpired));
    assert!(h.m.token().is_none());
    assert!(!events
        .iter()
        .any(|e| matches!(e, Event::Acquired { .. } | Event::TokenChanged { .. })));
}

/// A hold whose first Heartbeat fails (transport, NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE)
/// is a hold like any other: the member finds the coordinator again and heartbeats; only a NONE
/// handled before the first lease end renews it, and until then the join phase's re-arm keeps the
/// member in any group a coordinator loads, so even a blind NONE is harmless.
#[test]
fn a_failed_first_heartbeat_keeps_the_first_lease_and_renews_only_in_it() {
    for code in [None, Some(16), Some(15)] {
        let failure = || code.map_or(Err(Error::Closed), |c| Ok(hb(c)));
        let mut h = H::new(Mode::Native);
        h.find_ok();
        let joined_sent = h.now;
        let sync = h.join_as("m1", 4, false, &[]);
        h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m1"), 4, 0))));
        assert_eq!(h.m.lease_end(), Some(joined_sent + lease_length()));
        let beat = h.take(ApiKey::Heartbeat);
        h.reply(beat.id, failure());
        h.advance(Duration::from_millis(100));
        let find = h.take(ApiKey::FindCoordinator);
        h.reply(find.id, Ok(find_ok()));
        assert_eq!(h.apis(), [ApiKey::Heartbeat], "{code:?}");
        let beat = h.take(ApiKey::Heartbeat);
        let sent = h.now;
        h.reply(beat.id, Ok(hb(0)));
        assert_eq!(h.m.lease_end(), Some(sent + lease_length()), "{code:?}");
        assert_eq!(h.m.token().map(|t| t.generation), Some(4), "{code:?}");
    }
}

/// A hold whose Heartbeats are never answered ends at its first lease end, the JoinGroup's send
/// instant + the lease length, on the machine's own timer; the member then leaves.
#[test]
fn an_unrenewed_first_lease_runs_out_at_the_deadline() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let joined_sent = h.now;
    let sync = h.join_as("m1", 4, false, &[]);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m1"), 4, 0))));
    let beat = h.take(ApiKey::Heartbeat);
    assert_eq!(h.m.poll_timeout(), Some(joined_sent + lease_length()));
    h.advance(lease_length() - Duration::from_millis(1));
    assert!(h.m.token().is_some());
    h.advance(Duration::from_millis(1));
    let events = h.take_events();
    assert_eq!(lost(&events), Some(LossReason::LeaseExpired), "{events:?}");
    // The old Heartbeat's NONE, arriving now, revives nothing.
    h.reply(beat.id, Ok(hb(0)));
    assert!(h.m.token().is_none());
}

/// An assignment handled after its deadline (the join phase outlasted a lease) begins nothing.
/// The member leaves under its old id at once, so that no join phase waits for it to expire, and
/// joins as a new member with no place in the queue (`first_joined_generation` -1), so that a
/// member whose joins keep outlasting a lease does not keep the lock from everyone behind it.
#[test]
fn an_assignment_after_its_deadline_starts_over_at_the_back_of_the_queue() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    h.advance(lease_length() + Duration::from_millis(100));
    h.reply(j.id, Ok(join_ok("m1", 4, "m2", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m1"), 4, 0))));
    assert_eq!(acquired_lease(&h.take_events(), 4), None);
    assert!(h.m.token().is_none());
    assert_eq!(h.m.generation(), -1);
    let leave = h.take(ApiKey::LeaveGroup);
    match &leave.request {
        Request::LeaveGroup(r) => assert_eq!(r.members[0].member_id.as_str(), "m1"),
        other => panic!("{other:?}"),
    }
    h.advance(Duration::from_secs(1));
    let j = h.take(ApiKey::JoinGroup);
    assert_eq!(join_request(&j).member_id.as_str(), "");
    let md = MemberMetadata::decode(&join_request(&j).protocols[0].metadata).expect("metadata");
    assert_eq!(md.first_joined_generation, -1, "{md:?}");
    h.reply(leave.id, Ok(leave_ok()));
    assert!(!h.m.is_done(), "the parting leave ends nothing");
}

/// Apache removes an existing member at once when its rejoin finds the group at group.max.size
/// (GMM classicGroupJoin: acceptJoiningMember refuses it in PREPARING_REBALANCE once that many
/// members are awaiting a join, and the member is removed before GROUP_MAX_SIZE_REACHED is
/// answered). The broker may hand the lock on in this very join phase, so a holder that rejoins
/// for a rebalance and is answered that has lost the lock, at once.
#[test]
fn a_holder_refused_for_group_max_size_loses_the_lock_at_once() {
    let mut h = H::holding(3);
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(0)));
    let lease_end = h.m.lease_end().unwrap();
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(27)));
    assert!(
        h.m.token().is_some(),
        "a native holder keeps the lock into the rebalance"
    );
    let j = h.take(ApiKey::JoinGroup);
    h.advance(Duration::from_millis(300));
    let refused_at = h.now;
    assert!(refused_at < lease_end);
    h.reply(j.id, Ok(join_err(81, "")));
    let events = h.take_events();
    let lost_at = events.iter().find_map(|e| match e {
        Event::Lost { reason, lease_end } => Some((reason.clone(), *lease_end)),
        _ => None,
    });
    assert_eq!(
        lost_at,
        Some((LossReason::Fenced(KafkaCode(81)), refused_at)),
        "{events:?}"
    );
    assert_eq!(failed(&events), Some(KafkaCode(81)));
    assert!(h.m.token().is_none());
    assert!(h.m.is_done());
}

// ---- adversarial review findings ----
//
// Interleavings tried against the assignment's deadline. These pin down the paths whose safety
// rests on one line (`join_sent.get_or_insert`, the generation comparison in `on_join`), so that
// a change there fails a test.

/// The first JoinGroup of a generation (sent at `t0`) reaches the broker and is counted in the
/// join phase, but its answer is lost (connection closed 5 s later); the resend goes out on a new
/// connection and is answered at once from the completed phase (GMM `classicGroupJoin` in
/// COMPLETING_REBALANCE with unchanged metadata answers without re-arming the timer). The
/// broker's re-arm may be as early as just after `t0`, so the deadline is timed from `t0`, not
/// from the resend: a SyncGroup answer handled at `t0 + 9.5 s` (lease 9 s) begins nothing. The
/// same holds when the first JoinGroup is answered MEMBER_ID_REQUIRED late.
#[test]
fn review_a_resent_join_does_not_move_the_anchor_past_the_first_send() {
    for first_answer in [Err(Error::Closed), Ok(join_err(79, "m1"))] {
        let mut h = H::new(Mode::Native);
        h.find_ok();
        let t0 = h.now;
        let j1 = h.take(ApiKey::JoinGroup);
        h.advance(Duration::from_secs(5));
        let transport = first_answer.is_err();
        h.reply(j1.id, first_answer);
        if transport {
            h.advance(Duration::from_millis(500));
            let find = h.take(ApiKey::FindCoordinator);
            h.reply(find.id, Ok(find_ok()));
        }
        let j2 = h.take(ApiKey::JoinGroup);
        assert!(h.now >= t0 + Duration::from_secs(5));
        h.reply(j2.id, Ok(join_ok("m1", 4, "m2", &[])));
        let sync = h.take(ApiKey::SyncGroup);
        h.now = t0 + Duration::from_millis(9_500);
        h.m.handle_response(
            sync.id,
            Ok::<_, Error>(sync_ok(native_assignment(Some("m1"), 4, 0))),
            h.now,
        );
        h.drain();
        let events = h.take_events();
        assert!(
            acquired_lease(&events, 4).is_none() && h.m.token().is_none(),
            "held on an assignment handled after the first JoinGroup's send + lease: {events:?}"
        );
    }
}

/// The member starts over as a new member after an assignment that came too late; its first
/// JoinGroup under the new id is answered with a generation whose number the old id had already
/// seen (the broker's generation did not move because the old id's removal completed no phase
/// yet). A generation equal to the one remembered must not be mistaken for "nothing completed"
/// after the member id changed: the new id was counted in a completed phase, so the anchor is
/// the new JoinGroup's send.
#[test]
fn review_a_new_member_id_takes_a_fresh_anchor_even_at_a_known_generation_number() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    h.advance(SESSION);
    h.reply(j.id, Ok(join_ok("m1", 4, "m2", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m1"), 4, 0))));
    assert!(h.m.token().is_none());
    let _parting = h.take(ApiKey::LeaveGroup);
    // The rejoin goes out after the first retry delay (100 ms, no jitter here).
    h.advance(Duration::from_millis(100));
    let j = h.take(ApiKey::JoinGroup);
    assert_eq!(join_request(&j).member_id.as_str(), "");
    let sent = h.now;
    h.reply(j.id, Ok(join_ok("m1-new", 4, "m1-new", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    h.advance(Duration::from_secs(1));
    h.reply(
        sync.id,
        Ok(sync_ok(native_assignment(Some("m1-new"), 4, 0))),
    );
    assert_eq!(
        acquired_lease(&h.take_events(), 4),
        Some(sent + lease_length()),
        "the new member id's assignment began no hold, or not with its own anchor"
    );
}

// ---- the lease is min(session, rebalance) − margin, whichever of the two is shorter ----------
//
// The broker drops a member whose session timer runs out, and also one that does not rejoin a
// rebalance within the rebalance timeout: the lease may not outlast either.

/// A native machine with these two timeouts that holds the lock at generation 3; returns it and
/// the instant the Heartbeat that began the hold was sent.
fn holding_with(session: Duration, rebalance: Duration) -> (H, Instant) {
    let mut h = H::with(MembershipConfig {
        session_timeout: session,
        rebalance_timeout: rebalance,
        ..config(Mode::Native)
    });
    h.find_ok();
    let sync = h.join_as("m1", 3, false, &[]);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m1"), 3, 0))));
    let sent = h.now;
    h.confirm();
    (h, sent)
}

/// The hold is lost exactly `lease` after `sent`, with no renewal in between.
fn lost_exactly_at(h: &mut H, sent: Instant, lease: Duration) {
    let acquired = h.take_events();
    assert!(
        acquired.iter().any(|e| matches!(e,
            Event::Acquired { lease_end, .. } if *lease_end == sent + lease)),
        "the hold must begin with a lease of {lease:?}: {acquired:?}"
    );
    assert_eq!(h.m.lease_end(), Some(sent + lease));
    // Every heartbeat goes unanswered: nothing renews the lease.
    h.advance(lease - Duration::from_millis(1));
    assert!(
        lost(&h.take_events()).is_none(),
        "lost before the {lease:?} lease ended"
    );
    h.advance(Duration::from_millis(1));
    assert_eq!(
        lost(&h.take_events()),
        Some(LossReason::LeaseExpired),
        "still holding at the end of the {lease:?} lease"
    );
}

/// The configured lease and the held lease both end `lease` after the renewing heartbeat.
fn the_lease_is(session: Duration, rebalance: Duration, lease: Duration) {
    let cfg = MembershipConfig {
        session_timeout: session,
        rebalance_timeout: rebalance,
        ..config(Mode::Native)
    };
    assert_eq!(cfg.lease_length(), lease);
    let (mut h, sent) = holding_with(session, rebalance);
    lost_exactly_at(&mut h, sent, lease);
}

#[test]
fn a_rebalance_timeout_shorter_than_the_session_shortens_the_lease() {
    let (session, rebalance) = (Duration::from_secs(10), Duration::from_secs(3));
    the_lease_is(session, rebalance, rebalance - MARGIN);
}

#[test]
fn a_rebalance_timeout_longer_than_the_session_does_not_lengthen_the_lease() {
    let (session, rebalance) = (Duration::from_secs(10), Duration::from_secs(30));
    the_lease_is(session, rebalance, session - MARGIN);
}

#[test]
fn a_renewal_buys_the_shorter_of_the_two_timeouts() {
    for (session, rebalance) in [
        (Duration::from_secs(10), Duration::from_secs(4)),
        (Duration::from_secs(4), Duration::from_secs(10)),
    ] {
        let (mut h, _) = holding_with(session, rebalance);
        h.advance(HB);
        let beat = h.take(ApiKey::Heartbeat);
        let sent = h.now;
        h.advance(Duration::from_millis(500));
        h.reply(beat.id, Ok(hb(0)));
        assert_eq!(
            h.m.lease_end(),
            Some(sent + Duration::from_secs(4) - MARGIN),
            "session {session:?}, rebalance {rebalance:?}"
        );
    }
}

// ---- what the driver reads between steps (mutation testing found these unpinned) ------------

#[test]
fn the_coordinator_found_is_the_one_reported() {
    let mut h = H::new(Mode::Native);
    assert_eq!(h.m.coordinator(), None);
    h.find_ok();
    assert_eq!(h.m.coordinator(), Some(&coordinator()));
}

/// The driver sleeps until `poll_timeout`; the harness's `advance` also fires the timer at the
/// end of every step, which would hide a heartbeat that `poll_timeout` leaves out.
#[test]
fn the_next_heartbeat_is_announced_by_poll_timeout() {
    let mut h = H::holding(2);
    let due = h.now + HB;
    assert_eq!(h.m.poll_timeout(), Some(due));
    h.now = due;
    h.m.handle_timeout(due);
    h.drain();
    h.take(ApiKey::Heartbeat);
}

/// Answers are matched to requests by id: no two requests share one.
#[test]
fn every_request_has_an_id_of_its_own() {
    let mut h = H::new(Mode::Native);
    let mut ids = Vec::new();
    let find = h.take(ApiKey::FindCoordinator);
    ids.push(find.id);
    h.reply(find.id, Ok(find_ok()));
    let probe = h.take(ApiKey::ApiVersions);
    ids.push(probe.id);
    h.reply(probe.id, Ok(api_versions(crate::wire::versions::SUPPORTED)));
    let sync = h.join_as("m1", 3, false, &[]);
    ids.push(sync.id);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m1"), 3, 0))));
    let beat = h.take(ApiKey::Heartbeat);
    ids.push(beat.id);
    let mut distinct = ids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), ids.len(), "ids {ids:?}");
}

/// A release while the coordinator lookup waits out its backoff looks the coordinator up at
/// once, so the LeaveGroup is not held back by the retry delay.
#[test]
fn a_leave_during_a_lookup_backoff_looks_the_coordinator_up_at_once() {
    let mut h = H::holding(3);
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Err(Error::Closed));
    assert!(
        !h.apis().contains(&ApiKey::FindCoordinator),
        "the lookup waits for its backoff: {:?}",
        h.apis()
    );
    h.m.handle_command(Command::Leave, h.now);
    h.drain();
    h.take(ApiKey::FindCoordinator);
}

/// COORDINATOR_LOAD_IN_PROGRESS on a holder's heartbeat: the same coordinator is loading the
/// group, so the holder heartbeats again after a backoff, without rejoining.
#[test]
fn a_holders_heartbeat_met_by_load_in_progress_is_retried_not_a_rejoin() {
    let mut h = H::holding(3);
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(14)));
    assert!(h.sent.is_empty(), "not before a backoff: {:?}", h.apis());
    h.advance(Duration::from_millis(100));
    assert_eq!(h.apis(), [ApiKey::Heartbeat], "retried as a heartbeat");
    assert!(lost(&h.take_events()).is_none());
    assert!(h.m.token().is_some());
}

/// A member's place in the queue is the generation of its first completed join, carried in the
/// metadata of every later JoinGroup.
#[test]
fn a_rejoining_waiter_keeps_the_generation_of_its_first_join() {
    // Generation 0 included: -1 alone means "not joined yet".
    for first in [3, 0] {
        let mut h = H::new(Mode::Native);
        h.find_ok();
        let sync = h.join_as("m2", first, false, &[]);
        h.reply(
            sync.id,
            Ok(sync_ok(native_assignment(Some("m1"), first, 1))),
        );
        h.advance(HB);
        let beat = h.take(ApiKey::Heartbeat);
        h.reply(beat.id, Ok(hb(27)));
        let sync = h.join_as("m2", first + 1, false, &[]);
        h.reply(
            sync.id,
            Ok(sync_ok(native_assignment(Some("m1"), first + 1, 1))),
        );
        h.advance(HB);
        let beat = h.take(ApiKey::Heartbeat);
        h.reply(beat.id, Ok(hb(27)));
        let j = h.take(ApiKey::JoinGroup);
        let md = MemberMetadata::decode(&join_request(&j).protocols[0].metadata).expect("metadata");
        assert_eq!(md.first_joined_generation, first, "{md:?}");
    }
}

/// A retriable code the machine has no special case for is retried after a backoff; it does not
/// end the hold.
#[test]
fn a_retriable_heartbeat_error_keeps_the_hold() {
    let mut h = H::holding(3);
    h.advance(HB);
    let beat = h.take(ApiKey::Heartbeat);
    h.reply(beat.id, Ok(hb(7))); // REQUEST_TIMED_OUT
    let events = h.take_events();
    assert!(
        failed(&events).is_none() && lost(&events).is_none(),
        "{events:?}"
    );
    assert!(h.sent.is_empty(), "not before a backoff: {:?}", h.apis());
    h.advance(Duration::from_millis(100));
    assert_eq!(h.apis(), [ApiKey::Heartbeat]);
}

/// A JoinGroup that was never answered can still reach the broker later, after a later
/// JoinGroup of the same member was answered (a network cut: the kernel retransmits the
/// abandoned request on its old connection when the cut heals, while the resend went out on a
/// new connection), and be counted in a join phase that completes before the member sends its
/// next JoinGroup. That completion is the member's last re-arm (a JoinGroup answered at once in
/// COMPLETING_REBALANCE or STABLE and a SyncGroup answered at once in STABLE re-arm nothing), so
/// the next assignment's deadline must not be timed from a send after it.
///
/// Here: m1's JoinGroup X (t0) is lost; the resend is answered at generation 1 (w holds). At
/// t0 + 5 s w starts a rebalance, X reaches the broker and completes it at once: generation 2,
/// m1 re-armed at t0 + 5 s, session until t0 + 15 s. m1's heartbeats fail until t0 + 9 s (a slow
/// coordinator), then ILLEGAL_GENERATION; its rejoin is answered at once with generation 2, and
/// the SyncGroup (STABLE, the leader synced long ago) names m1. A hold begun there with a first
/// lease to the rejoin's send + 9 s would run to about t0 + 18 s, three seconds after the broker
/// could drop m1 and give the lock to w. The machine times the deadline from X instead (t0 +
/// 9 s), which has passed: no hold; it leaves and joins again as a new member, and holds then.
#[test]
fn a_join_lost_before_an_earlier_generation_still_anchors_a_later_assignment() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let t = h.take(ApiKey::JoinGroup);
    h.reply(t.id, Ok(join_err(79, "m1")));
    let x = h.take(ApiKey::JoinGroup);
    assert_eq!(join_request(&x).member_id.as_str(), "m1");
    let t0 = h.now;
    h.advance(Duration::from_millis(500));
    h.reply(x.id, Err(Error::Closed));
    let lease = SESSION - MARGIN;
    let mut places = Vec::new();
    let events = serve(
        &mut h,
        t0 + 3 * SESSION,
        Duration::from_millis(100),
        |now, t| {
            let broker_slow =
                now >= t0 + Duration::from_secs(5) && now < t0 + Duration::from_secs(9);
            Some(match &t.request {
                Request::FindCoordinator(_) if broker_slow => Ok(find_err(15)),
                Request::FindCoordinator(_) => Ok(find_ok()),
                Request::ApiVersions(_) => Ok(api_versions(crate::wire::versions::SUPPORTED)),
                Request::JoinGroup(r) if r.member_id.is_empty() => Ok(join_err(79, "m2")),
                Request::JoinGroup(r) if r.member_id.as_str() == "m2" => {
                    let md = MemberMetadata::decode(&r.protocols[0].metadata).unwrap();
                    places.push(md.first_joined_generation);
                    Ok(join_ok("m2", 3, "w", &[]))
                }
                Request::JoinGroup(_) if now < t0 + Duration::from_secs(5) => {
                    Ok(join_ok("m1", 1, "w", &[]))
                }
                Request::JoinGroup(_) => Ok(join_ok("m1", 2, "w", &[])),
                Request::SyncGroup(r) => {
                    Ok(sync_ok(match (r.member_id.as_str(), r.generation_id) {
                        ("m1", 1) => native_assignment(Some("w"), 1, 1),
                        (m, g) => native_assignment(Some(m), g, 0),
                    }))
                }
                Request::Heartbeat(_) if broker_slow => Err(Error::Closed),
                Request::Heartbeat(r)
                    if r.generation_id == 1 && now >= t0 + Duration::from_secs(5) =>
                {
                    Ok(hb(22))
                }
                Request::Heartbeat(_) => Ok(hb(0)),
                Request::LeaveGroup(_) => Ok(leave_ok()),
                other => panic!("unexpected {:?}", other.api_key()),
            })
        },
    );
    if let Some(end) = acquired_lease(&events, 2) {
        panic!(
            "held at generation 2 with a first lease {:?} past the lost JoinGroup's send + the \
             lease, though that JoinGroup may have been the member's last re-arm: {events:?}",
            end.saturating_duration_since(t0 + lease)
        );
    }
    assert!(
        acquired_lease(&events, 3).is_some(),
        "never held as a new member: {events:?}"
    );
    assert_eq!(
        places.first(),
        Some(&1),
        "the new member should keep the place in the queue a lost JoinGroup did not forfeit"
    );
}

/// The bound a lost JoinGroup sets is its send + the lease, and no earlier: an assignment handled
/// inside it begins a hold whose first lease ends exactly there (before the later join's own
/// bound), without a new member id.
#[test]
fn an_assignment_inside_a_lost_joins_bound_holds_until_that_bound() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let t = h.take(ApiKey::JoinGroup);
    h.reply(t.id, Ok(join_err(79, "m1")));
    let x = h.take(ApiKey::JoinGroup);
    let t0 = h.now;
    h.advance(Duration::from_millis(500));
    h.reply(x.id, Err(Error::Closed));
    let lease = SESSION - MARGIN;
    let events = serve(
        &mut h,
        t0 + 2 * SESSION,
        Duration::from_millis(100),
        |now, t| {
            Some(match &t.request {
                Request::FindCoordinator(_) => Ok(find_ok()),
                Request::ApiVersions(_) => Ok(api_versions(crate::wire::versions::SUPPORTED)),
                Request::JoinGroup(r) if r.member_id.as_str() != "m1" => {
                    panic!("joined under a new member id: {:?}", r.member_id)
                }
                Request::JoinGroup(_) if now < t0 + Duration::from_millis(1500) => {
                    Ok(join_ok("m1", 1, "w", &[]))
                }
                Request::JoinGroup(_) => Ok(join_ok("m1", 2, "w", &[])),
                Request::SyncGroup(r) => Ok(sync_ok(match r.generation_id {
                    1 => native_assignment(Some("w"), 1, 1),
                    g => native_assignment(Some("m1"), g, 0),
                })),
                Request::Heartbeat(r) if r.generation_id == 1 => Ok(hb(27)),
                Request::Heartbeat(_) => Ok(hb(0)),
                Request::LeaveGroup(_) => Ok(leave_ok()),
                other => panic!("unexpected {:?}", other.api_key()),
            })
        },
    );
    assert_eq!(
        acquired_lease(&events, 2),
        Some(t0 + lease),
        "the hold at generation 2 should begin with its first lease ending at the lost \
         JoinGroup's send + the lease: {events:?}"
    );
}

/// A first JoinGroup the driver kept back (waiting for a free connection behind other locks'
/// joins) cannot have reached the broker before it left: the assignment's deadline and the first
/// lease are timed from then, through the MEMBER_ID_REQUIRED round, and a wait longer than the
/// lease does not make the assignment late.
#[test]
fn a_join_kept_back_by_the_driver_times_its_deadline_from_when_it_left() {
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let j = h.take(ApiKey::JoinGroup);
    h.advance(lease_length() * 3);
    let left = h.now;
    h.m.handle_sent(j.id, left);
    h.reply(j.id, Ok(join_err(79, "m1")));
    let j = h.take(ApiKey::JoinGroup);
    // Only the first JoinGroup of the round moves the anchor, and never earlier.
    h.m.handle_sent(j.id, left + lease_length());
    h.m.handle_sent(j.id, left - lease_length());
    h.advance(Duration::from_secs(3));
    h.reply(j.id, Ok(join_ok("m1", 1, "m2", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m1"), 1, 0))));
    assert_eq!(
        acquired_lease(&h.take_events(), 1),
        Some(left + lease_length()),
        "the deadline is timed from when the first JoinGroup left"
    );
}

/// A RELEASED record of the waiter's own generation whose holder is in fact still in the group
/// (a record written by another writer of the ledger, or one whose leave never reached the
/// coordinator) makes the waiter rejoin, and nothing more: as a follower with unchanged metadata
/// Apache answers its JoinGroup with the generation in force and the SyncGroup with the
/// assignment in force; as the leader it starts a rebalance whose plan keeps the holder. Either
/// way the waiter does not acquire, sends no second JoinGroup without news, and the holder named
/// by the coordinator stays the holder.
#[test]
fn a_stray_release_of_the_waiters_generation_never_gives_it_the_lock() {
    // Follower: the JoinGroup is answered with the current generation.
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let sync = h.join_as("w1", 3, false, &[]);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m2"), 3, 1))));
    h.take_events();
    let now = h.now;
    h.m.handle_command(
        Command::HoldEnded {
            generation: 3,
            member_id: "m2".into(),
        },
        now,
    );
    h.drain();
    let join = h.take(ApiKey::JoinGroup);
    assert_eq!(join_request(&join).member_id.as_str(), "w1");
    h.reply(join.id, Ok(join_ok("w1", 3, "m2", &[])));
    let sync = h.take(ApiKey::SyncGroup);
    assert!(sync_request(&sync).assignments.is_empty());
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m2"), 3, 1))));
    let ev = h.take_events();
    assert!(
        !ev.iter().any(|e| matches!(e, Event::Acquired { .. })),
        "{ev:?}"
    );
    assert!(h.m.lease_end().is_none());
    assert!(h.sent.is_empty(), "no join loop: {:?}", h.apis());
    // The same record read again (a poll that starts over) costs one JoinGroup more, no loop.
    let now = h.now;
    h.m.handle_command(
        Command::HoldEnded {
            generation: 3,
            member_id: "m2".into(),
        },
        now,
    );
    h.drain();
    assert_eq!(h.apis(), [ApiKey::JoinGroup]);

    // Leader: its JoinGroup starts a rebalance; the holder rejoins and keeps the lock.
    let mut h = H::new(Mode::Native);
    h.find_ok();
    let sync = h.join_as("w1", 3, false, &[]);
    h.reply(sync.id, Ok(sync_ok(native_assignment(Some("m2"), 3, 1))));
    h.take_events();
    let now = h.now;
    h.m.handle_command(
        Command::HoldEnded {
            generation: 3,
            member_id: "m2".into(),
        },
        now,
    );
    h.drain();
    let join = h.take(ApiKey::JoinGroup);
    h.reply(
        join.id,
        Ok(join_ok(
            "w1",
            4,
            "w1",
            &[("m2", meta(true, 1)), ("w1", meta(false, 2))],
        )),
    );
    let sync = h.take(ApiKey::SyncGroup);
    let req = sync_request(&sync);
    assert_eq!(req.assignments.len(), 2);
    for a in &req.assignments {
        let na = NativeAssignment::decode(&a.assignment).unwrap();
        assert_eq!(
            na.holder.as_ref().map(|h| h.member_id.as_str()),
            Some("m2"),
            "the holder keeps the lock"
        );
    }
    let mine = req
        .assignments
        .iter()
        .find(|a| a.member_id.as_str() == "w1")
        .unwrap()
        .assignment
        .clone();
    h.reply(sync.id, Ok(sync_ok(mine)));
    let ev = h.take_events();
    assert!(
        !ev.iter().any(|e| matches!(e, Event::Acquired { .. })),
        "{ev:?}"
    );
    assert!(h.m.lease_end().is_none());
}

/// The lookup's failure as the driver reports it: GROUP_AUTHORIZATION_FAILED ends the membership
/// whichever layer read the code (the answer, or the driver's own `Error::Broker`); anything
/// else, a poisoned connection that carries that code included (a batched lookup's other
/// waiters get the failure that way), is looked up again.
#[test]
fn a_failed_lookup_is_fatal_only_on_group_authorization() {
    let code = |c: i16| Error::broker(ApiKey::FindCoordinator, KafkaCode(c), None);
    let cases = [
        (code(30), true),
        (Error::Poisoned(std::sync::Arc::new(code(30))), false),
        (code(15), false),
        (code(29), false),
        (
            Error::Timeout {
                op: "FindCoordinator".into(),
                after: SESSION,
            },
            false,
        ),
        (Error::Closed, false),
    ];
    for (e, fatal) in cases {
        let words = e.to_string();
        let mut h = H::new(Mode::Native);
        let find = h.take(ApiKey::FindCoordinator);
        h.reply(find.id, Err(e));
        let ev = h.take_events();
        if fatal {
            assert_eq!(failed(&ev), Some(KafkaCode(30)), "{words}");
            assert!(h.m.is_done(), "{words}");
        } else {
            assert!(failure(&ev).is_none(), "{words}: {ev:?}");
            h.advance(RETRY_MAX);
            h.take(ApiKey::FindCoordinator);
        }
    }
}

//! Apache Kafka's group coordinator, shown on the real broker where the lock depends on it:
//! KIP-394's MEMBER_ID_REQUIRED, the initial rebalance delay, the session timeout bounds, static
//! membership (and why kafka-lock refuses it), DescribeGroups with assignments (what
//! `kafka-lock status` reads), and the generation after a group is deleted. docs/design.md cites
//! the broker code behind each; the scripted tests in `src/membership_tests.rs` assume what these
//! show.
//!
//! Raw requests go through kafka-lock's own wire layer and `driver::Connection`, with requests
//! built by hand where the library would never send them (a static member, a pre-KIP-394
//! version).

use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_lock::internals::assign::{
    MemberMetadata, NativeAssignment, NATIVE_PROTOCOL, PROTOCOL_TYPE,
};
use kafka_lock::internals::driver::Connection;
use kafka_lock::internals::wire::Response;
use kafka_lock::{Error, KafkaCode, LockEvent, LockOptions};
use kafka_protocol::messages::heartbeat_request::HeartbeatRequest;
use kafka_protocol::messages::join_group_request::{JoinGroupRequest, JoinGroupRequestProtocol};
use kafka_protocol::messages::join_group_response::JoinGroupResponse;
use kafka_protocol::messages::sync_group_request::{SyncGroupRequest, SyncGroupRequestAssignment};
use kafka_protocol::messages::sync_group_response::SyncGroupResponse;
use kafka_protocol::messages::GroupId;
use kafka_protocol::protocol::StrBytes;
use tokio::sync::mpsc;

use crate::support::brokers::SLACK;
use crate::support::kafka::admin::delete_group;
use crate::support::kafka::probe::{coordinator_connection, describe_group};
use crate::support::kafka::{kafka, kafka_default_delay, KafkaCluster};
use crate::support::{init_tracing, unique_group};

const HEARTBEAT: Duration = Duration::from_millis(500);

fn opts(broker: &KafkaCluster, group: &str) -> LockOptions {
    LockOptions::new(broker.bootstrap(), group)
        .session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(6))
        .heartbeat_interval(HEARTBEAT)
        .lease_margin(Duration::from_secs(1))
}

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

/// The protocol type of the raw groups below: not kafka-lock's, so no lock can join them.
const RAW_TYPE: &str = "kafka-lock-raw-test";

/// A JoinGroup for a raw group with one protocol `p`; `instance` makes the member static.
fn join_request(group: &str, member: &str, instance: Option<&str>) -> JoinGroupRequest {
    let mut p = JoinGroupRequestProtocol::default();
    p.name = sb("p");
    p.metadata = Bytes::from_static(b"metadata");
    let mut req = JoinGroupRequest::default();
    req.group_id = GroupId(sb(group));
    req.session_timeout_ms = 6000;
    req.rebalance_timeout_ms = 6000;
    req.member_id = sb(member);
    req.group_instance_id = instance.map(sb);
    req.protocol_type = sb(RAW_TYPE);
    req.protocols = vec![p];
    req
}

async fn join(conn: &Connection, version: i16, req: JoinGroupRequest) -> JoinGroupResponse {
    match conn.request_at(req, version, Duration::from_secs(30)).await {
        Ok(Response::JoinGroup(r)) => r,
        other => panic!("JoinGroup v{version}: {other:?}"),
    }
}

async fn sync(
    conn: &Connection,
    group: &str,
    generation: i32,
    member: &str,
    instance: Option<&str>,
    assignments: &[(&str, &'static [u8])],
) -> SyncGroupResponse {
    let mut req = SyncGroupRequest::default();
    req.group_id = GroupId(sb(group));
    req.generation_id = generation;
    req.member_id = sb(member);
    req.group_instance_id = instance.map(sb);
    req.protocol_type = Some(sb(RAW_TYPE));
    req.protocol_name = Some(sb("p"));
    req.assignments = assignments
        .iter()
        .map(|(m, a)| {
            let mut x = SyncGroupRequestAssignment::default();
            x.member_id = sb(m);
            x.assignment = Bytes::from_static(a);
            x
        })
        .collect();
    match conn.request_at(req, 5, Duration::from_secs(30)).await {
        Ok(Response::SyncGroup(r)) => r,
        other => panic!("SyncGroup: {other:?}"),
    }
}

async fn heartbeat(
    conn: &Connection,
    group: &str,
    generation: i32,
    member: &str,
    instance: Option<&str>,
) -> KafkaCode {
    let mut req = HeartbeatRequest::default();
    req.group_id = GroupId(sb(group));
    req.generation_id = generation;
    req.member_id = sb(member);
    req.group_instance_id = instance.map(sb);
    match conn.request_at(req, 4, Duration::from_secs(10)).await {
        Ok(Response::Heartbeat(r)) => KafkaCode(r.error_code),
        other => panic!("Heartbeat: {other:?}"),
    }
}

async fn connect(group: &str) -> Connection {
    coordinator_connection(&kafka().bootstrap(), group)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// KIP-394: from JoinGroup v4 on, a member that joins without a member id is told one with
/// MEMBER_ID_REQUIRED (and parked as pending) and must join again with it; v3 and older join in
/// one round trip. kafka-lock's membership machine takes the id and rejoins at once
/// (`membership_tests::member_id_required_then_success`); every acquisition on Apache Kafka goes
/// through this.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamic_member_must_join_twice_from_version_4() {
    let group = unique_group("kip394");
    let conn = connect(&group).await;
    let first = join(&conn, 9, join_request(&group, "", None)).await;
    assert_eq!(
        KafkaCode(first.error_code),
        KafkaCode::MEMBER_ID_REQUIRED,
        "{first:?}"
    );
    assert_eq!(first.generation_id, -1);
    // Apache forms member ids as `<client id>-<UUID>`.
    assert!(
        first.member_id.starts_with("kafka-lock-tests-probe-"),
        "{first:?}"
    );
    let second = join(&conn, 9, join_request(&group, &first.member_id, None)).await;
    assert_eq!(second.error_code, 0, "{second:?}");
    assert_eq!(second.member_id, first.member_id);
    assert_eq!(second.generation_id, 1, "a new group's first generation");
    assert_eq!(second.leader, second.member_id);
    let s = sync(&conn, &group, 1, &second.member_id, None, &[]).await;
    assert_eq!(s.error_code, 0, "{s:?}");

    // The same without KIP-394: one round trip, and the join of a second member starts a
    // rebalance the first member hears of from its heartbeat.
    let old = unique_group("kip394-v3");
    let conn3 = connect(&old).await;
    let once = join(&conn3, 3, join_request(&old, "", None)).await;
    assert_eq!(once.error_code, 0, "{once:?}");
    assert!(once.member_id.starts_with("kafka-lock-tests-probe-"));
    assert_eq!(once.generation_id, 1);
    conn.close();
    conn3.close();
}

/// `group.initial.rebalance.delay.ms` holds the first join of an *empty* group: with Kafka's
/// default (3 s) an uncontended acquire takes at least that long, every time the lock's group is
/// empty, while a handover to a waiter (the group is not empty) does not wait. With 0 (the test
/// broker, and docker-compose.yml) a lone member's join completes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_initial_rebalance_delay_holds_every_acquire_of_a_free_lock() {
    init_tracing();
    let delay = Duration::from_millis(3000);
    let timed = |broker: &'static KafkaCluster, group: String| async move {
        let started = Instant::now();
        let guard = opts(broker, &group)
            .acquire(Some(delay * 3 + SLACK))
            .await
            .expect("acquire");
        (started.elapsed(), guard)
    };
    let group = unique_group("delay");
    let ((fast, g1), (slow, g2)) = tokio::join!(
        timed(kafka(), unique_group("no-delay")),
        timed(kafka_default_delay(), group.clone())
    );
    eprintln!("uncontended acquire: {fast:?} with delay 0, {slow:?} with the default 3000 ms");
    // The broker's timer starts when our JoinGroup arrives, after `started`, on the same clock.
    assert!(slow >= delay, "{slow:?}");
    // Everything but the delay is the same few round trips on both brokers.
    assert!(fast + delay * 2 / 3 < slow, "{fast:?} vs {slow:?}");
    g1.release().await.unwrap();

    // A waiter joins a group that has a member: no delay for it, nor for the handover.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let waiter = tokio::spawn({
        let o = opts(kafka_default_delay(), &group).events(tx);
        async move { o.acquire(Some(delay * 3 + SLACK)).await }
    });
    while !matches!(
        tokio::time::timeout(delay + SLACK, rx.recv()).await,
        Ok(Some(LockEvent::Waiting { .. }))
    ) {}
    let released = Instant::now();
    g2.release().await.unwrap();
    let next = waiter.await.unwrap().expect("the waiter takes over");
    let handover = released.elapsed();
    eprintln!("handover on the default-delay broker: {handover:?}");
    assert!(handover < delay, "{handover:?}");
    next.release().await.unwrap();

    // The group is empty again: the next acquire waits out the delay once more.
    let (again, g3) = timed(kafka_default_delay(), group).await;
    eprintln!("acquire of the same lock, its group empty again: {again:?}");
    assert!(again >= delay, "{again:?}");
    g3.release().await.unwrap();
}

/// A session timeout outside `[group.min.session.timeout.ms, group.max.session.timeout.ms]`
/// (6 s and 30 min by default) is refused with INVALID_SESSION_TIMEOUT on the first JoinGroup:
/// the acquire fails at once with a broker error that names the setting to change, and does not
/// retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_timeout_outside_the_brokers_bounds_is_refused_naming_the_setting() {
    init_tracing();
    // Started (or found) before the clock below starts: the bound is the refusal's, not the
    // broker's start-up.
    let broker = kafka();
    for (session, setting) in [
        (Duration::from_secs(5), "group.min.session.timeout.ms"),
        (Duration::from_secs(31 * 60), "group.max.session.timeout.ms"),
    ] {
        let started = Instant::now();
        let err = opts(broker, &unique_group("session"))
            .session_timeout(session)
            .rebalance_timeout(Duration::from_secs(5))
            .acquire(Some(Duration::from_secs(60)))
            .await
            .unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Broker { api: kafka_lock::Api::JoinGroup, code, .. }
                    if *code == KafkaCode::INVALID_SESSION_TIMEOUT
            ),
            "session {session:?}: {err:?}"
        );
        let text = err.to_string();
        assert!(text.contains(setting), "{text}");
        assert!(started.elapsed() < SLACK, "{:?}", started.elapsed());
    }
}

/// Static membership (KIP-345), the hazard behind kafka-lock's refusal of it: a second process
/// joining with the holder's `group.instance.id` replaces the holder at once, in the *same*
/// generation, under a new member id, and is handed the holder's assignment without a rebalance,
/// while the first process is fenced only when it next talks to the coordinator. A generation
/// token cannot tell the two apart. kafka-lock never sends an instance id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_replacement_takes_the_holders_assignment_in_the_same_generation() {
    let group = unique_group("static");
    let instance = Some("job-1");
    let (a, b) = (connect(&group).await, connect(&group).await);

    // A static member joins without MEMBER_ID_REQUIRED.
    let first = join(&a, 9, join_request(&group, "", instance)).await;
    assert_eq!(first.error_code, 0, "{first:?}");
    assert_eq!(first.generation_id, 1);
    let old = first.member_id.to_string();
    let s = sync(&a, &group, 1, &old, instance, &[(&old, b"the lock")]).await;
    assert_eq!((s.error_code, &s.assignment[..]), (0, &b"the lock"[..]));
    assert_eq!(
        heartbeat(&a, &group, 1, &old, instance).await,
        KafkaCode::NONE
    );

    // Its replacement: a new member id, the same generation, no rebalance, the old assignment.
    let second = join(&b, 9, join_request(&group, "", instance)).await;
    assert_eq!(second.error_code, 0, "{second:?}");
    let new = second.member_id.to_string();
    assert_ne!(new, old);
    assert_eq!(second.generation_id, 1, "no new generation: {second:?}");
    assert_eq!(
        second.leader.as_str(),
        new,
        "the replacement leads in the old one's place"
    );
    assert!(
        second.skip_assignment,
        "a replaced leader must not reassign"
    );
    let s = sync(&b, &group, 1, &new, instance, &[]).await;
    assert_eq!((s.error_code, &s.assignment[..]), (0, &b"the lock"[..]));
    assert_eq!(
        heartbeat(&b, &group, 1, &new, instance).await,
        KafkaCode::NONE
    );

    // The old process learns only when it next asks: fenced by instance id, or unknown without.
    assert_eq!(
        heartbeat(&a, &group, 1, &old, instance).await,
        KafkaCode::FENCED_INSTANCE_ID
    );
    assert_eq!(
        heartbeat(&a, &group, 1, &old, None).await,
        KafkaCode::UNKNOWN_MEMBER_ID
    );
    let s = sync(&a, &group, 1, &old, instance, &[]).await;
    assert_eq!(KafkaCode(s.error_code), KafkaCode::FENCED_INSTANCE_ID);
    let g = describe_group(&kafka().bootstrap(), &group).await.unwrap();
    assert_eq!(g.group_state.as_str(), "Stable");
    assert_eq!(g.members.len(), 1);
    assert_eq!(g.members[0].member_id.as_str(), new);
    assert_eq!(g.members[0].group_instance_id.as_deref(), Some("job-1"));

    // kafka-lock's own members are dynamic.
    let lock = unique_group("static-lock");
    let guard = opts(kafka(), &lock).acquire(Some(SLACK)).await.unwrap();
    let g = describe_group(&kafka().bootstrap(), &lock).await.unwrap();
    assert_eq!(g.members.len(), 1);
    assert_eq!(g.members[0].group_instance_id, None);
    guard.release().await.unwrap();
    a.close();
    b.close();
}

/// DescribeGroups answers a STABLE group with every member's metadata and assignment, so the
/// holder, its label, its token and the queue can be read without joining: what
/// `kafka-lock status` does, decoded here with the same library calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_groups_shows_holder_label_token_and_queue() {
    init_tracing();
    let group = unique_group("describe");
    let holder = opts(kafka(), &group)
        .label("holder on host-a")
        .acquire(Some(SLACK))
        .await
        .unwrap();
    // Waiters queue in the order they first completed a join.
    let mut waiters = Vec::new();
    for label in ["first waiter", "second waiter"] {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let o = opts(kafka(), &group).label(label).events(tx);
        let task = tokio::spawn(async move { o.acquire(None).await });
        let member = loop {
            match tokio::time::timeout(HEARTBEAT + SLACK, rx.recv()).await {
                Ok(Some(LockEvent::Waiting { member_id, .. })) => break member_id,
                Ok(Some(_)) => {}
                other => panic!("{label}: {other:?}"),
            }
        };
        waiters.push((task, member, label));
    }

    // The description and the holder's token agree once the holder has heard of the last
    // generation; poll until they do.
    let deadline = Instant::now() + HEARTBEAT + SLACK;
    let (g, token) = loop {
        let g = describe_group(&kafka().bootstrap(), &group).await.unwrap();
        let token = holder.token().generation;
        let named = g.members.iter().find_map(|m| {
            NativeAssignment::decode(&m.member_assignment)
                .ok()?
                .holder
                .map(|h| h.generation)
        });
        if g.group_state.as_str() == "Stable" && g.members.len() == 3 && named == Some(token) {
            break (g, token);
        }
        assert!(Instant::now() < deadline, "{g:#?} vs token {token}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(g.protocol_type.as_str(), PROTOCOL_TYPE);
    assert_eq!(g.protocol_data.as_str(), NATIVE_PROTOCOL);
    let mut queue = Vec::new();
    for m in &g.members {
        assert_eq!(m.client_id.as_str(), "kafka-lock");
        assert!(m.client_host.contains("127.0.0.1"), "{m:?}");
        let meta = MemberMetadata::decode(&m.member_metadata).expect("member metadata");
        let a = NativeAssignment::decode(&m.member_assignment).expect("assignment");
        let h = a.holder.expect("every assignment names the holder");
        assert_eq!(h.member_id, holder.member_id());
        assert_eq!(h.label.as_deref(), Some("holder on host-a"));
        assert_eq!(h.generation, token);
        assert_eq!(a.members, 3);
        queue.push((a.position, m.member_id.to_string(), meta.label, meta.holds));
    }
    queue.sort();
    let want: Vec<_> = std::iter::once((
        0,
        holder.member_id(),
        Some("holder on host-a".to_owned()),
        true,
    ))
    .chain(
        waiters
            .iter()
            .enumerate()
            .map(|(i, (_, id, label))| (i as i32 + 1, id.clone(), Some(label.to_string()), false)),
    )
    .collect();
    assert_eq!(queue, want);

    holder.release().await.unwrap();
    for (task, _, _) in waiters {
        let g = tokio::time::timeout(HEARTBEAT * 2 + SLACK, task)
            .await
            .expect("each waiter in turn")
            .unwrap()
            .unwrap();
        g.release().await.unwrap();
    }
}

/// A group's generation lives as long as the group: an empty group keeps counting (the last
/// member's leave itself completes an empty generation), and one
/// deleted (DeleteGroups; the broker also deletes an empty group with no offsets by itself,
/// within `offsets.retention.check.interval.ms` of it emptying) starts again at 0, so the next
/// holder's token is 1 again, equal to an earlier holder's. A group with members cannot be
/// deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_group_starts_again_and_tokens_go_back_to_1() {
    init_tracing();
    let group = unique_group("deleted");
    let bootstrap = kafka().bootstrap();
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let g = opts(kafka(), &group).acquire(Some(SLACK)).await.unwrap();
        tokens.push(g.token().generation);
        if tokens.len() == 1 {
            let err = delete_group(&bootstrap, &group).unwrap_err();
            assert!(err.contains("GroupNotEmptyException"), "{err}");
        }
        g.release().await.unwrap();
    }
    // Empty between the two holds, the group kept counting. The first holder's LeaveGroup, the
    // last member's, completed a join phase with no members: generation 2, and the group EMPTY.
    assert_eq!(tokens, [1, 3]);
    delete_group(&bootstrap, &group).expect("an empty group can be deleted");
    let g = opts(kafka(), &group).acquire(Some(SLACK)).await.unwrap();
    assert_eq!(g.token().generation, 1, "a deleted group starts again");
    g.release().await.unwrap();
}

/// A native JoinGroup for a raw member of a kafka-lock group: it waits, holding nothing.
fn native_join_request(group: &str, member: &str) -> JoinGroupRequest {
    let mut req = join_request(group, member, None);
    req.protocol_type = sb(PROTOCOL_TYPE);
    req.protocols[0].name = sb(NATIVE_PROTOCOL);
    req.protocols[0].metadata = MemberMetadata {
        holds: false,
        first_joined_generation: -1,
        holder_generation: -1,
        label: Some("raw".into()),
        permits: 1,
        slot: 0,
        ledger: None,
    }
    .encode();
    req
}

/// `group.max.size` is an instant removal: a member that rejoins a rebalance in which that many
/// members already wait for the join is removed there and then and answered
/// GROUP_MAX_SIZE_REACHED (GMM `classicGroupJoin` → `acceptJoiningMember`, then `group.remove`),
/// and the join phase may complete without it at once. The holder, rejoining for the rebalance,
/// gets that answer and loses the lock at once. On a broker of its own with `group.max.size=2`:
/// the holder, then two raw members that join while it holds (the second of them into the
/// rebalance the first started), so that two members await the join when the holder rejoins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_refused_at_group_max_size_loses_the_lock_at_once() {
    use crate::support::kafka::KafkaOptions;
    use kafka_lock::LossReason;
    init_tracing();
    let broker = KafkaCluster::start(KafkaOptions::single_node().property("group.max.size", 2));
    let group = unique_group("max-size");
    // A long heartbeat interval: the two raw joins must both reach the broker before the
    // holder hears of the rebalance.
    let guard = opts(&broker, &group)
        .heartbeat_interval(Duration::from_secs(2))
        .acquire(Some(SLACK))
        .await
        .unwrap();
    let holder = guard.token().member_id.clone();
    let connect = |group: String| {
        let bootstrap = broker.bootstrap();
        async move {
            coordinator_connection(&bootstrap, &group)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        }
    };
    let (b, c) = (connect(group.clone()).await, connect(group.clone()).await);
    // KIP-394 first: both get a member id while the group is STABLE with one member.
    let mut ids = Vec::new();
    for conn in [&b, &c] {
        let r = join(conn, 9, native_join_request(&group, "")).await;
        assert_eq!(
            KafkaCode(r.error_code),
            KafkaCode::MEMBER_ID_REQUIRED,
            "{r:?}"
        );
        ids.push(r.member_id.to_string());
    }
    // Both join for real at once: the first starts a rebalance, the second joins it.
    let (tx, mut rx) = mpsc::unbounded_channel();
    for (conn, id) in [b, c].into_iter().zip(ids.clone()) {
        let (tx, group) = (tx.clone(), group.clone());
        tokio::spawn(async move {
            let r = join(&conn, 9, native_join_request(&group, &id)).await;
            let _ = tx.send(r);
            conn.close();
        });
    }
    let started = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(20), guard.lost())
        .await
        .expect("the holder heard of its removal");
    assert_eq!(
        reason,
        LossReason::Fenced(KafkaCode::GROUP_MAX_SIZE_REACHED)
    );
    assert!(!guard.is_held());
    // The join phase completed with the two others, without the holder.
    for _ in 0..2 {
        let r = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("the raw join was answered")
            .expect("a raw join task ended without an answer");
        assert_eq!(r.error_code, 0, "{r:?}");
        assert_eq!(r.generation_id, 2, "{r:?}");
        if r.leader == r.member_id {
            let mut members: Vec<String> =
                r.members.iter().map(|m| m.member_id.to_string()).collect();
            members.sort();
            let mut want = ids.clone();
            want.sort();
            assert_eq!(members, want, "the holder is not in generation 2");
        }
    }
    let g = describe_group(&broker.bootstrap(), &group).await.unwrap();
    assert!(
        g.members.iter().all(|m| m.member_id.as_str() != holder),
        "the holder is still a member: {g:?}"
    );
    tracing::info!(after = ?started.elapsed(), "the holder lost the lock to group.max.size");
    drop(guard);
}

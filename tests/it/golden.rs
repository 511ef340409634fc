//! Golden tests: response bodies captured from tansu, by hand-built requests and from
//! librdkafka's own conversation with it (testdata/README.md says how), decoded through
//! `kafka_lock::internals::wire::decode_response` and checked field by field.
//!
//! The captures can be redone at any time (`scripts/capture_frames.py`), so these tests assert
//! what stays the same between captures: error codes, names, shapes, relations between fields.
//! Ports, member-id suffixes (UUIDs) and file sequence numbers change.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use kafka_lock::internals::wire::{decode_response, Response};
use kafka_protocol::messages::ApiKey;

/// One captured response body.
struct Frame {
    file: String,
    api: ApiKey,
    version: i16,
    /// What the file name says after `<api>_v<version>_`: the case of a hand-built request, or a
    /// sequence number for librdkafka's requests.
    case: String,
    body: Vec<u8>,
}

impl Frame {
    fn decode(&self) -> Response {
        decode_response(self.api, self.version, &self.body)
            .unwrap_or_else(|e| panic!("{}: {e}", self.file))
    }
}

const API_NAMES: &[(&str, ApiKey)] = &[
    ("api_versions", ApiKey::ApiVersions),
    ("metadata", ApiKey::Metadata),
    ("find_coordinator", ApiKey::FindCoordinator),
    ("join_group", ApiKey::JoinGroup),
    ("sync_group", ApiKey::SyncGroup),
    ("heartbeat", ApiKey::Heartbeat),
    ("leave_group", ApiKey::LeaveGroup),
    ("describe_groups", ApiKey::DescribeGroups),
    ("offset_commit", ApiKey::OffsetCommit),
    ("offset_fetch", ApiKey::OffsetFetch),
];

fn frames(source: &str) -> Vec<Frame> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/frames")
        .join(source);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut out = Vec::new();
    for entry in entries {
        let path = entry.expect("directory entry").path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(stem) = file.strip_suffix(".bin") else {
            continue;
        };
        let (api, version, case) = API_NAMES
            .iter()
            .find_map(|(name, api)| {
                let rest = stem.strip_prefix(name)?.strip_prefix("_v")?;
                let (version, case) = rest.split_once('_')?;
                Some((*api, version.parse().ok()?, case.to_owned()))
            })
            .unwrap_or_else(|| panic!("{file}: not named <api>_v<version>_<case>.bin"));
        let body = std::fs::read(&path).unwrap();
        out.push(Frame {
            file,
            api,
            version,
            case,
            body,
        });
    }
    out.sort_by(|a, b| a.file.cmp(&b.file));
    out
}

fn pick<'a>(frames: &'a [Frame], api: ApiKey, case: &str) -> Vec<&'a Frame> {
    let picked: Vec<&Frame> = frames
        .iter()
        .filter(|f| f.api == api && f.case == case)
        .collect();
    assert!(!picked.is_empty(), "no {api:?} frame for case {case}");
    picked
}

fn of_api(frames: &[Frame], api: ApiKey) -> Vec<&Frame> {
    let picked: Vec<&Frame> = frames.iter().filter(|f| f.api == api).collect();
    assert!(!picked.is_empty(), "no {api:?} frame");
    picked
}

macro_rules! expect {
    ($frame:expr, $variant:ident) => {
        match $frame.decode() {
            Response::$variant(r) => r,
            other => panic!(
                "{}: decoded as {:?}, expected {}",
                $frame.file,
                other.api_key(),
                stringify!($variant)
            ),
        }
    };
}

// Error codes from the Kafka protocol.
const NONE: i16 = 0;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const ILLEGAL_GENERATION: i16 = 22;
const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
const UNKNOWN_MEMBER_ID: i16 = 25;
const REBALANCE_IN_PROGRESS: i16 = 27;
const MEMBER_ID_REQUIRED: i16 = 79;

const TANSU_TOPIC: &str = "capture-topic";
const RDKAFKA_TOPIC: &str = "capture-rdkafka-topic";
const RDKAFKA_GROUP: &str = "capture-rdkafka-group";

/// ConsumerProtocolSubscription v0 for one topic, as the hand-built JoinGroups sent it.
fn subscription(topic: &str) -> Vec<u8> {
    let mut b = 0i16.to_be_bytes().to_vec();
    b.extend_from_slice(&1i32.to_be_bytes());
    b.extend_from_slice(&(topic.len() as i16).to_be_bytes());
    b.extend_from_slice(topic.as_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b
}

/// ConsumerProtocolAssignment v0 for one topic, as the hand-built SyncGroups sent it.
fn assignment(topic: &str, partitions: &[i32]) -> Vec<u8> {
    let mut b = 0i16.to_be_bytes().to_vec();
    b.extend_from_slice(&1i32.to_be_bytes());
    b.extend_from_slice(&(topic.len() as i16).to_be_bytes());
    b.extend_from_slice(topic.as_bytes());
    b.extend_from_slice(&(partitions.len() as i32).to_be_bytes());
    for p in partitions {
        b.extend_from_slice(&p.to_be_bytes());
    }
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b
}

/// kafka-protocol's own encoder for a decoded response (the `broker` feature, dev-only).
fn reencode(r: &Response, version: i16) -> Vec<u8> {
    fn enc<T: kafka_protocol::protocol::Encodable>(m: &T, version: i16) -> Vec<u8> {
        let mut out = bytes::BytesMut::new();
        m.encode(&mut out, version).expect("encodes");
        out.to_vec()
    }
    match r {
        Response::ApiVersions(m) => enc(m, version),
        Response::Metadata(m) => enc(m, version),
        Response::FindCoordinator(m) => enc(m, version),
        Response::JoinGroup(m) => enc(m, version),
        Response::SyncGroup(m) => enc(m, version),
        Response::Heartbeat(m) => enc(m, version),
        Response::LeaveGroup(m) => enc(m, version),
        Response::DescribeGroups(m) => enc(m, version),
        Response::OffsetCommit(m) => enc(m, version),
        Response::OffsetFetch(m) => enc(m, version),
        other => panic!("no encoder for {:?}", other.api_key()),
    }
}

/// Every captured frame decodes at its API and version into values that encode back to the
/// very bytes the broker sent: the decoder read every field, in the broker's layout, and kept
/// nothing it did not understand out of sight.
#[test]
fn every_captured_frame_round_trips_through_the_decoder() {
    for source in ["tansu", "librdkafka"] {
        let frames = frames(source);
        assert!(frames.len() >= 40, "{source}: only {} frames", frames.len());
        for f in &frames {
            let again = reencode(&f.decode(), f.version);
            if f.api == ApiKey::ApiVersions && f.version >= 3 {
                // tansu writes the top-level tagged fields (features) even at their defaults,
                // which an encoder omits; everything before that last section must match.
                let n = again.len() - 1;
                assert_eq!(again[n], 0, "{}: no tagged fields re-encoded", f.file);
                assert_eq!(&again[..n], &f.body[..n], "{}", f.file);
            } else {
                assert_eq!(again, f.body, "{}", f.file);
            }
        }
    }
}

#[test]
fn tansu_captures_cover_every_version_both_sides_support() {
    // tansu's advertised ranges (ApiVersions) intersected with what kafka-lock decodes.
    let wanted: &[(ApiKey, std::ops::RangeInclusive<i16>)] = &[
        (ApiKey::ApiVersions, 0..=4),
        (ApiKey::Metadata, 0..=12),
        (ApiKey::FindCoordinator, 0..=6),
        (ApiKey::JoinGroup, 0..=9),
        (ApiKey::SyncGroup, 0..=5),
        (ApiKey::Heartbeat, 0..=4),
        (ApiKey::LeaveGroup, 0..=5),
        (ApiKey::DescribeGroups, 0..=5),
        (ApiKey::OffsetCommit, 2..=9),
        (ApiKey::OffsetFetch, 1..=9),
    ];
    let mut have: BTreeMap<i16, BTreeSet<i16>> = BTreeMap::new();
    for f in frames("tansu") {
        have.entry(f.api as i16).or_default().insert(f.version);
    }
    for (api, versions) in wanted {
        for v in versions.clone() {
            assert!(
                have.get(&(*api as i16)).is_some_and(|s| s.contains(&v)),
                "no tansu capture of {api:?} v{v}"
            );
        }
    }
}

#[test]
fn tansu_api_versions() {
    let frames = frames("tansu");
    for f in pick(&frames, ApiKey::ApiVersions, "basic") {
        let r = expect!(f, ApiVersions);
        assert_eq!(r.error_code, NONE, "{}", f.file);
        let range = |api: ApiKey| {
            r.api_keys
                .iter()
                .find(|k| k.api_key == api as i16)
                .map(|k| (k.min_version, k.max_version))
        };
        // The ranges test-brokers.md records for the pinned build.
        assert_eq!(range(ApiKey::ApiVersions), Some((0, 4)), "{}", f.file);
        assert_eq!(range(ApiKey::JoinGroup), Some((0, 9)), "{}", f.file);
        assert_eq!(range(ApiKey::SyncGroup), Some((0, 5)), "{}", f.file);
        assert_eq!(range(ApiKey::Heartbeat), Some((0, 4)), "{}", f.file);
        assert_eq!(range(ApiKey::LeaveGroup), Some((0, 5)), "{}", f.file);
        assert_eq!(range(ApiKey::FindCoordinator), Some((0, 6)), "{}", f.file);
    }
}

#[test]
fn tansu_metadata() {
    let frames = frames("tansu");
    for f in pick(&frames, ApiKey::Metadata, "one_topic") {
        let r = expect!(f, Metadata);
        assert_eq!(r.brokers.len(), 1, "{}", f.file);
        let broker = &r.brokers[0];
        assert_eq!(broker.host.as_str(), "127.0.0.1", "{}", f.file);
        assert!(broker.port > 0, "{}", f.file);
        assert_eq!(r.topics.len(), 1, "{}", f.file);
        let topic = &r.topics[0];
        assert_eq!(topic.error_code, NONE, "{}", f.file);
        assert_eq!(
            topic.name.as_ref().map(|n| n.as_str()),
            Some(TANSU_TOPIC),
            "{}",
            f.file
        );
        assert_eq!(topic.partitions.len(), 1, "{}", f.file);
        assert_eq!(topic.partitions[0].partition_index, 0, "{}", f.file);
        assert_eq!(topic.partitions[0].leader_id, broker.node_id, "{}", f.file);
    }
    for f in pick(&frames, ApiKey::Metadata, "unknown_topic") {
        let r = expect!(f, Metadata);
        assert_eq!(r.topics.len(), 1, "{}", f.file);
        assert_eq!(
            r.topics[0].error_code, UNKNOWN_TOPIC_OR_PARTITION,
            "{}",
            f.file
        );
    }
}

#[test]
fn tansu_find_coordinator() {
    let frames = frames("tansu");
    for f in pick(&frames, ApiKey::FindCoordinator, "group") {
        let r = expect!(f, FindCoordinator);
        if f.version < 4 {
            assert_eq!(r.error_code, NONE, "{}", f.file);
            assert_eq!(r.host.as_str(), "127.0.0.1", "{}", f.file);
            assert!(r.port > 0, "{}", f.file);
            assert!(*r.node_id >= 0, "{}", f.file);
            assert!(r.coordinators.is_empty(), "{}", f.file);
        } else {
            let keys: Vec<&str> = r.coordinators.iter().map(|c| c.key.as_str()).collect();
            assert_eq!(keys, ["capture-group-0", "capture-group-1"], "{}", f.file);
            for c in &r.coordinators {
                assert_eq!(c.error_code, NONE, "{}", f.file);
                assert_eq!(c.host.as_str(), "127.0.0.1", "{}", f.file);
                assert!(c.port > 0, "{}", f.file);
            }
        }
    }
}

#[test]
fn tansu_join_group_member_id_required_then_leader() {
    let frames = frames("tansu");
    let required = pick(&frames, ApiKey::JoinGroup, "member_id_required");
    assert_eq!(required.len(), 10, "one per JoinGroup version 0..=9");
    for f in required {
        let r = expect!(f, JoinGroup);
        assert_eq!(r.error_code, MEMBER_ID_REQUIRED, "{}", f.file);
        assert_eq!(r.generation_id, -1, "{}", f.file);
        // tansu names members "<client id>-<uuid>".
        assert!(
            r.member_id
                .as_str()
                .starts_with("capture.member_id_required-"),
            "{}: {}",
            f.file,
            r.member_id.as_str()
        );
        assert!(r.members.is_empty(), "{}", f.file);
    }
    let joined = pick(&frames, ApiKey::JoinGroup, "leader");
    assert_eq!(joined.len(), 10, "one per JoinGroup version 0..=9");
    for f in joined {
        let r = expect!(f, JoinGroup);
        assert_eq!(r.error_code, NONE, "{}", f.file);
        assert!(r.generation_id >= 0, "{}", f.file);
        assert!(!r.member_id.is_empty(), "{}", f.file);
        assert_eq!(r.leader, r.member_id, "{}: a lone member leads", f.file);
        assert_eq!(
            r.protocol_name.as_ref().map(|p| p.as_str()),
            Some("range"),
            "{}",
            f.file
        );
        if f.version >= 7 {
            assert_eq!(
                r.protocol_type.as_ref().map(|p| p.as_str()),
                Some("consumer"),
                "{}",
                f.file
            );
        }
        assert_eq!(r.members.len(), 1, "{}", f.file);
        assert_eq!(r.members[0].member_id, r.member_id, "{}", f.file);
        assert_eq!(
            &r.members[0].metadata[..],
            &subscription(TANSU_TOPIC)[..],
            "{}: the leader sees the metadata it sent",
            f.file
        );
    }
}

#[test]
fn tansu_join_group_leader_and_follower() {
    let frames = frames("tansu");
    let a = expect!(
        pick(&frames, ApiKey::JoinGroup, "pair_a_joined")[0],
        JoinGroup
    );
    let b = expect!(
        pick(&frames, ApiKey::JoinGroup, "pair_b_joined")[0],
        JoinGroup
    );
    assert_eq!((a.error_code, b.error_code), (NONE, NONE));
    assert_eq!(a.generation_id, b.generation_id);
    assert_eq!(a.leader, b.leader);
    assert_ne!(a.member_id, b.member_id);
    let (leader, follower) = if a.leader == a.member_id {
        (a, b)
    } else {
        (b, a)
    };
    assert_eq!(leader.leader, leader.member_id);
    let mut members: Vec<_> = leader.members.iter().map(|m| m.member_id.clone()).collect();
    members.sort();
    let mut expected = vec![leader.member_id.clone(), follower.member_id.clone()];
    expected.sort();
    assert_eq!(members, expected, "the leader sees both members");
    assert!(follower.members.is_empty(), "followers get no member list");

    let inconsistent = pick(&frames, ApiKey::JoinGroup, "inconsistent_group_protocol");
    let r = expect!(inconsistent[0], JoinGroup);
    assert_eq!(r.error_code, INCONSISTENT_GROUP_PROTOCOL);
}

#[test]
fn tansu_sync_group() {
    let frames = frames("tansu");
    for f in pick(&frames, ApiKey::SyncGroup, "leader")
        .into_iter()
        .chain(pick(&frames, ApiKey::SyncGroup, "pair_leader"))
    {
        let r = expect!(f, SyncGroup);
        assert_eq!(r.error_code, NONE, "{}", f.file);
        assert_eq!(
            &r.assignment[..],
            &assignment(TANSU_TOPIC, &[0])[..],
            "{}",
            f.file
        );
        if f.version >= 5 {
            assert_eq!(
                r.protocol_type.as_ref().map(|p| p.as_str()),
                Some("consumer"),
                "{}",
                f.file
            );
            assert_eq!(
                r.protocol_name.as_ref().map(|p| p.as_str()),
                Some("range"),
                "{}",
                f.file
            );
        }
    }
    let f = pick(&frames, ApiKey::SyncGroup, "follower")[0];
    let r = expect!(f, SyncGroup);
    assert_eq!(r.error_code, NONE);
    assert_eq!(&r.assignment[..], &assignment(TANSU_TOPIC, &[])[..]);
}

#[test]
fn tansu_heartbeat_error_codes() {
    let frames = frames("tansu");
    for (case, code) in [
        ("none", NONE),
        ("illegal_generation", ILLEGAL_GENERATION),
        ("unknown_member", UNKNOWN_MEMBER_ID),
        ("unknown_group", UNKNOWN_MEMBER_ID),
        ("after_leave", UNKNOWN_MEMBER_ID),
        ("rebalance_in_progress", REBALANCE_IN_PROGRESS),
    ] {
        for f in pick(&frames, ApiKey::Heartbeat, case) {
            assert_eq!(expect!(f, Heartbeat).error_code, code, "{}", f.file);
        }
    }
}

#[test]
fn tansu_leave_group() {
    let frames = frames("tansu");
    for f in pick(&frames, ApiKey::LeaveGroup, "leader") {
        let r = expect!(f, LeaveGroup);
        assert_eq!(r.error_code, NONE, "{}", f.file);
        if f.version >= 3 {
            let codes: Vec<(bool, i16)> = r
                .members
                .iter()
                .map(|m| (m.member_id.as_str() == "capture-ghost", m.error_code))
                .collect();
            assert_eq!(
                codes,
                [(false, NONE), (true, UNKNOWN_MEMBER_ID)],
                "{}",
                f.file
            );
        } else {
            assert!(r.members.is_empty(), "{}", f.file);
        }
    }
    let r = expect!(pick(&frames, ApiKey::LeaveGroup, "pair")[0], LeaveGroup);
    assert_eq!(r.error_code, NONE);
    // Leader, follower, and a third member tansu already listed when it told it
    // MEMBER_ID_REQUIRED (Kafka would keep that one pending and answer UNKNOWN_MEMBER_ID).
    assert_eq!(r.members.len(), 3);
    assert!(r.members.iter().all(|m| m.error_code == NONE));
}

#[test]
fn tansu_describe_groups() {
    let frames = frames("tansu");
    for f in pick(&frames, ApiKey::DescribeGroups, "stable_and_missing") {
        let r = expect!(f, DescribeGroups);
        assert_eq!(r.groups.len(), 2, "{}", f.file);
        let (stable, missing) = (&r.groups[0], &r.groups[1]);
        assert!(stable.group_id.starts_with("capture-group-"), "{}", f.file);
        assert_eq!(stable.error_code, NONE, "{}", f.file);
        assert_eq!(stable.group_state.as_str(), "Stable", "{}", f.file);
        assert_eq!(stable.protocol_type.as_str(), "consumer", "{}", f.file);
        assert_eq!(stable.members.len(), 1, "{}", f.file);
        assert!(!stable.members[0].member_id.is_empty(), "{}", f.file);
        // tansu answers a group it never saw with NONE and "Empty" (Kafka says "Dead").
        assert_eq!(
            missing.group_id.as_str(),
            "capture-no-such-group",
            "{}",
            f.file
        );
        assert_eq!(missing.error_code, NONE, "{}", f.file);
        assert_eq!(missing.group_state.as_str(), "Empty", "{}", f.file);
        assert!(missing.members.is_empty(), "{}", f.file);
    }
    let r = expect!(
        pick(&frames, ApiKey::DescribeGroups, "pair_stable")[0],
        DescribeGroups
    );
    assert_eq!(r.groups[0].group_state.as_str(), "Stable");
    assert_eq!(r.groups[0].members.len(), 2);
}

#[test]
fn tansu_offset_commit_and_fetch() {
    let frames = frames("tansu");
    for f in pick(&frames, ApiKey::OffsetCommit, "stable") {
        let r = expect!(f, OffsetCommit);
        assert_eq!(r.topics.len(), 1, "{}", f.file);
        assert_eq!(r.topics[0].name.as_str(), TANSU_TOPIC, "{}", f.file);
        let codes: Vec<(i32, i16)> = r.topics[0]
            .partitions
            .iter()
            .map(|p| (p.partition_index, p.error_code))
            .collect();
        assert_eq!(codes, [(0, NONE)], "{}", f.file);
    }
    for f in pick(&frames, ApiKey::OffsetFetch, "committed") {
        let r = expect!(f, OffsetFetch);
        // The hand-built scenario commits offset 42 before each fetch, except at v1 where there
        // is no OffsetCommit version it also speaks (v2 is the oldest kafka-lock decodes).
        let expected = if f.version == 1 { -1 } else { 42 };
        let offsets: Vec<(i32, i64, i16)> = if f.version >= 8 {
            assert_eq!(r.groups.len(), 1, "{}", f.file);
            assert_eq!(r.groups[0].error_code, NONE, "{}", f.file);
            r.groups[0]
                .topics
                .iter()
                .flat_map(|t| t.partitions.iter())
                .map(|p| (p.partition_index, p.committed_offset, p.error_code))
                .collect()
        } else {
            r.topics
                .iter()
                .flat_map(|t| t.partitions.iter())
                .map(|p| (p.partition_index, p.committed_offset, p.error_code))
                .collect()
        };
        assert_eq!(offsets, [(0, expected, NONE)], "{}", f.file);
    }
}

#[test]
fn librdkafka_group_conversation() {
    let frames = frames("librdkafka");

    for f in of_api(&frames, ApiKey::ApiVersions) {
        let r = expect!(f, ApiVersions);
        assert_eq!(r.error_code, NONE, "{}", f.file);
        assert!(
            r.api_keys
                .iter()
                .any(|k| k.api_key == ApiKey::JoinGroup as i16),
            "{}",
            f.file
        );
    }
    for f in of_api(&frames, ApiKey::FindCoordinator) {
        let r = expect!(f, FindCoordinator);
        assert_eq!(r.error_code, NONE, "{}", f.file);
        assert_eq!(r.host.as_str(), "127.0.0.1", "{}", f.file);
    }

    // Two consumers, c1 then c2: each is first told MEMBER_ID_REQUIRED, then joins; the
    // second join makes a leader answer listing both members and a follower answer with none.
    let (mut required, mut leaders_of_two, mut followers) = (0, 0, 0);
    for f in of_api(&frames, ApiKey::JoinGroup) {
        let r = expect!(f, JoinGroup);
        let member = r.member_id.as_str();
        assert!(
            member.starts_with("c1-") || member.starts_with("c2-"),
            "{}: member id {member} is not <client.id>-<uuid>",
            f.file
        );
        match r.error_code {
            MEMBER_ID_REQUIRED => {
                assert_eq!(r.generation_id, -1, "{}", f.file);
                required += 1;
            }
            NONE => {
                assert!(r.generation_id >= 0, "{}", f.file);
                assert_eq!(
                    r.protocol_name.as_ref().map(|p| p.as_str()),
                    Some("range"),
                    "{}",
                    f.file
                );
                if r.leader == r.member_id {
                    assert!(!r.members.is_empty(), "{}", f.file);
                    for m in &r.members {
                        // librdkafka's subscription metadata names the topic it subscribed to.
                        let meta = &m.metadata[..];
                        assert!(
                            meta.windows(RDKAFKA_TOPIC.len())
                                .any(|w| w == RDKAFKA_TOPIC.as_bytes()),
                            "{}",
                            f.file
                        );
                    }
                    if r.members.len() == 2 {
                        leaders_of_two += 1;
                    }
                } else {
                    assert!(!r.leader.is_empty(), "{}", f.file);
                    assert!(r.members.is_empty(), "{}", f.file);
                    followers += 1;
                }
            }
            other => panic!("{}: unexpected JoinGroup error {other}", f.file),
        }
    }
    assert_eq!(required, 2, "one MEMBER_ID_REQUIRED per consumer");
    assert!(leaders_of_two >= 1, "no leader answer with both members");
    assert!(followers >= 1, "no follower answer");

    let mut holders = 0;
    for f in of_api(&frames, ApiKey::SyncGroup) {
        let r = expect!(f, SyncGroup);
        assert_eq!(r.error_code, NONE, "{}", f.file);
        let a = &r.assignment[..];
        if a.windows(RDKAFKA_TOPIC.len())
            .any(|w| w == RDKAFKA_TOPIC.as_bytes())
        {
            holders += 1;
        }
    }
    assert!(holders >= 1, "no SyncGroup assigned the topic");

    let mut ok_heartbeats = 0;
    for f in of_api(&frames, ApiKey::Heartbeat) {
        let code = expect!(f, Heartbeat).error_code;
        assert!(
            code == NONE || code == REBALANCE_IN_PROGRESS,
            "{}: heartbeat error {code}",
            f.file
        );
        ok_heartbeats += usize::from(code == NONE);
    }
    assert!(
        ok_heartbeats >= 2,
        "only {ok_heartbeats} successful heartbeats"
    );

    let leaves = of_api(&frames, ApiKey::LeaveGroup);
    assert_eq!(leaves.len(), 2, "both consumers leave on close()");
    for f in leaves {
        assert_eq!(expect!(f, LeaveGroup).error_code, NONE, "{}", f.file);
    }

    for f in of_api(&frames, ApiKey::DescribeGroups) {
        let r = expect!(f, DescribeGroups);
        assert_eq!(r.groups.len(), 1, "{}", f.file);
        let g = &r.groups[0];
        assert_eq!(g.group_id.as_str(), RDKAFKA_GROUP, "{}", f.file);
        assert_eq!(g.error_code, NONE, "{}", f.file);
        assert_eq!(g.group_state.as_str(), "Stable", "{}", f.file);
        assert_eq!(g.protocol_type.as_str(), "consumer", "{}", f.file);
        assert_eq!(g.members.len(), 2, "{}", f.file);
    }

    for f in of_api(&frames, ApiKey::OffsetFetch) {
        let r = expect!(f, OffsetFetch);
        let offsets: Vec<i64> = if f.version >= 8 {
            assert_eq!(r.groups.len(), 1, "{}", f.file);
            assert_eq!(r.groups[0].group_id.as_str(), RDKAFKA_GROUP, "{}", f.file);
            r.groups[0]
                .topics
                .iter()
                .flat_map(|t| t.partitions.iter())
                .map(|p| p.committed_offset)
                .collect()
        } else {
            r.topics
                .iter()
                .flat_map(|t| t.partitions.iter())
                .map(|p| p.committed_offset)
                .collect()
        };
        // Nothing was ever committed (enable.auto.commit = false).
        assert_eq!(offsets, [-1], "{}", f.file);
    }

    for f in of_api(&frames, ApiKey::Metadata) {
        let r = expect!(f, Metadata);
        assert_eq!(r.brokers.len(), 1, "{}", f.file);
        assert_eq!(r.brokers[0].host.as_str(), "127.0.0.1", "{}", f.file);
    }
}

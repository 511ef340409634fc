//! The broker connection against the real broker (tansu): ApiVersions negotiation, Metadata and
//! FindCoordinator round trips, pipelining, and bootstrap past a dead address.

use std::time::Duration;

use kafka_lock::backoff::Backoff;
use kafka_lock::driver::{connect_any, BootstrapConfig, ConnConfig, Connection};
use kafka_lock::wire::{Request, Response};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::support;

async fn connect() -> Connection {
    support::init_tracing();
    let broker = support::broker();
    Connection::connect(&broker.bootstrap(), &ConnConfig::default())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot connect to tansu at {} (log: {}): {e}",
                broker.bootstrap(),
                broker.log_path().display()
            )
        })
}

/// A FindCoordinator request for a group, shaped for the negotiated version (v4 batched the keys,
/// KIP-699).
fn find_coordinator(conn: &Connection, group: &str) -> FindCoordinatorRequest {
    let version = conn
        .versions()
        .get(ApiKey::FindCoordinator)
        .expect("FindCoordinator negotiated");
    let key = StrBytes::from_string(group.to_owned());
    let req = FindCoordinatorRequest::default().with_key_type(0); // 0 = group
    if version >= 4 {
        req.with_coordinator_keys(vec![key])
    } else {
        req.with_key(key)
    }
}

/// The (error code, host, port) of the coordinator in a FindCoordinator response of any version.
fn coordinator(resp: Response) -> (i16, String, i32) {
    let Response::FindCoordinator(r) = resp else {
        panic!("expected a FindCoordinator response, got {resp:?}");
    };
    match r.coordinators.first() {
        Some(c) => (c.error_code, c.host.to_string(), c.port),
        None => (r.error_code, r.host.to_string(), r.port),
    }
}

#[tokio::test]
async fn api_versions_are_negotiated_with_tansu() {
    let conn = connect().await;
    let v = conn.versions();
    // tansu 510f3e2 advertises ApiVersions 0-4 (test-brokers.md), so the v3 handshake is
    // answered directly, without the KIP-511 fallback.
    let api_versions = v.get(ApiKey::ApiVersions).expect("ApiVersions");
    assert!(api_versions >= 3, "ApiVersions v{api_versions}");
    for api in [
        ApiKey::Metadata,
        ApiKey::FindCoordinator,
        ApiKey::JoinGroup,
        ApiKey::SyncGroup,
        ApiKey::Heartbeat,
        ApiKey::LeaveGroup,
        ApiKey::DescribeGroups,
        ApiKey::OffsetCommit,
        ApiKey::OffsetFetch,
    ] {
        assert!(v.get(api).is_some(), "{api:?} not negotiated: {v:?}");
    }

    // A second ApiVersions on the open connection reports tansu's ranges.
    let resp = conn
        .request(
            ApiVersionsRequest::default()
                .with_client_software_name(StrBytes::from_static_str("kafka-lock-test"))
                .with_client_software_version(StrBytes::from_static_str("0")),
        )
        .await
        .expect("ApiVersions");
    let Response::ApiVersions(resp) = resp else {
        panic!("expected ApiVersions, got {resp:?}");
    };
    assert_eq!(resp.error_code, 0);
    let join = resp
        .api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::JoinGroup as i16)
        .expect("tansu lists JoinGroup");
    assert_eq!((join.min_version, join.max_version), (0, 9));
    let negotiated_join = v.get(ApiKey::JoinGroup).expect("JoinGroup");
    assert!(negotiated_join <= 9);
}

#[tokio::test]
async fn metadata_round_trip_names_the_broker_and_a_topic() {
    let conn = connect().await;
    let broker = support::broker();
    let topic = support::unique_group("wire-meta");
    support::create_topic(&broker.bootstrap(), &topic, 1);

    let req = MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(topic.clone()))))]));
    let resp = conn.request(req).await.expect("Metadata");
    let Response::Metadata(resp) = resp else {
        panic!("expected Metadata, got {resp:?}");
    };
    assert_eq!(resp.brokers.len(), 1, "{:?}", resp.brokers);
    assert_eq!(resp.brokers[0].host.as_str(), "127.0.0.1");
    assert_eq!(resp.brokers[0].port, i32::from(broker.port()));
    assert_eq!(resp.topics.len(), 1, "{:?}", resp.topics);
    let t = &resp.topics[0];
    assert_eq!(t.error_code, 0);
    assert_eq!(t.name.as_ref().map(|n| n.as_str()), Some(topic.as_str()));
    assert_eq!(t.partitions.len(), 1);
}

#[tokio::test]
async fn find_coordinator_round_trip() {
    let conn = connect().await;
    let group = support::unique_group("wire-fc");
    let resp = conn
        .request(find_coordinator(&conn, &group))
        .await
        .expect("FindCoordinator");
    let (code, host, port) = coordinator(resp);
    assert_eq!(code, 0);
    // tansu is a single node and always names itself.
    assert_eq!(host, "127.0.0.1");
    assert_eq!(port, i32::from(support::broker().port()));
}

#[tokio::test]
async fn pipelined_requests_from_many_tasks() {
    let conn = connect().await;
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let conn = conn.clone();
            tokio::spawn(async move {
                let req: Request = if i % 2 == 0 {
                    find_coordinator(&conn, &format!("wire-pipe-{i}")).into()
                } else {
                    MetadataRequest::default().with_topics(Some(vec![])).into()
                };
                let want = req.api_key();
                let resp = conn.request(req).await.expect("request");
                assert_eq!(resp.api_key(), want);
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    assert!(!conn.is_closed());
}

#[tokio::test]
async fn bootstrap_connects_past_a_dead_address() {
    support::init_tracing();
    let live = support::broker().bootstrap();
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").to_string()
    };
    // A draw of 0 starts the rotation at the first entry, so the dead address is really tried.
    let mut backoff = Backoff::with_rng(
        Duration::from_millis(10),
        Duration::from_millis(100),
        2.0,
        0.5,
        || 0.0,
    );
    let conn = connect_any(
        &[dead, live.clone()],
        &ConnConfig::default(),
        &mut backoff,
        &BootstrapConfig::default().with_deadline(Duration::from_secs(30)),
    )
    .await
    .expect("bootstrap past the dead address");
    assert_eq!(conn.peer(), live);
    let (code, _, _) = coordinator(
        conn.request(find_coordinator(&conn, "wire-bootstrap"))
            .await
            .expect("FindCoordinator"),
    );
    assert_eq!(code, 0);
}

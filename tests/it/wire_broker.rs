//! The broker connection against the real broker (tansu): ApiVersions negotiation, Metadata and
//! FindCoordinator round trips, pipelining, and bootstrap past a dead address.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kafka_lock::internals::backoff::Backoff;
use kafka_lock::internals::driver::{connect_any, BootstrapConfig, ConnConfig, Connection};
use kafka_lock::internals::wire::Response;
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
    let version = conn
        .versions()
        .get(ApiKey::FindCoordinator)
        .expect("FindCoordinator negotiated");
    // Only v4+ echoes the key, which is what tells two FindCoordinator answers apart.
    assert!(version >= 4, "FindCoordinator v{version}");
    let run = support::unique_group("wire-pipe");
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let conn = conn.clone();
            // Every request names something of its own, and every answer echoes it: an answer
            // handed to another caller of the same API shows as a wrong name.
            let name = format!("{run}-{i}");
            tokio::spawn(async move {
                // In pairs, so answers of one API are both adjacent and interleaved in the FIFO.
                if i % 4 < 2 {
                    let resp = conn
                        .request(find_coordinator(&conn, &name))
                        .await
                        .expect("FindCoordinator");
                    let Response::FindCoordinator(r) = resp else {
                        panic!("expected FindCoordinator, got {resp:?}");
                    };
                    let keys: Vec<&str> = r.coordinators.iter().map(|c| c.key.as_str()).collect();
                    assert_eq!(keys, [name.as_str()]);
                } else {
                    let req = MetadataRequest::default()
                        .with_allow_auto_topic_creation(false)
                        .with_topics(Some(vec![MetadataRequestTopic::default()
                            .with_name(Some(TopicName(StrBytes::from_string(name.clone()))))]));
                    let resp = conn.request(req).await.expect("Metadata");
                    let Response::Metadata(r) = resp else {
                        panic!("expected Metadata, got {resp:?}");
                    };
                    let topics: Vec<Option<&str>> = r
                        .topics
                        .iter()
                        .map(|t| t.name.as_ref().map(|n| n.as_str()))
                        .collect();
                    assert_eq!(topics, [Some(name.as_str())]);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    assert!(!conn.is_closed());
}

/// Loopback listeners that close every connection they accept (a dead broker, as the handshake
/// sees it), logging their index, so a test sees which were tried and in what order.
async fn dead_brokers(n: usize) -> (Vec<String>, Arc<Mutex<Vec<usize>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut addrs = Vec::new();
    for index in 0..n {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        addrs.push(listener.local_addr().expect("addr").to_string());
        let log = Arc::clone(&log);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                log.lock().expect("log").push(index);
                drop(stream);
            }
        });
    }
    (addrs, log)
}

#[tokio::test]
async fn bootstrap_connects_past_a_dead_address() {
    support::init_tracing();
    let live = support::broker().bootstrap();
    let (dead, tried) = dead_brokers(2).await;
    let backoff = |draw: f64| {
        Backoff::with_rng(
            Duration::from_millis(10),
            Duration::from_millis(100),
            2.0,
            0.5,
            move || draw,
        )
    };
    // (list, draw, dead brokers tried before the live one): a draw d over three entries starts
    // the rotation at floor(3 d).
    let cases = [
        (
            vec![dead[0].clone(), dead[1].clone(), live.clone()],
            0.0,
            vec![0, 1],
        ),
        (
            vec![dead[0].clone(), live.clone(), dead[1].clone()],
            0.5,
            vec![],
        ),
        (
            vec![live.clone(), dead[0].clone(), dead[1].clone()],
            0.5,
            vec![0, 1],
        ),
        (
            vec![dead[1].clone(), live.clone(), dead[0].clone()],
            0.9,
            vec![0, 1],
        ),
    ];
    for (list, draw, want) in cases {
        let conn = connect_any(
            &list,
            &ConnConfig::default(),
            &mut backoff(draw),
            &BootstrapConfig::default().with_deadline(Duration::from_secs(30)),
        )
        .await
        .expect("bootstrap past the dead addresses");
        assert_eq!(conn.peer(), live);
        let got = std::mem::take(&mut *tried.lock().expect("log"));
        assert_eq!(got, want, "list {list:?}, draw {draw}");
        let (code, _, _) = coordinator(
            conn.request(find_coordinator(&conn, "wire-bootstrap"))
                .await
                .expect("FindCoordinator"),
        );
        assert_eq!(code, 0);
    }
}

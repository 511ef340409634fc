//! Asking a broker who coordinates a group, through the crate's own connection and wire layer,
//! from synchronous support code.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use kafka_lock::internals::driver::{ConnConfig, Connection};
use kafka_lock::internals::wire::coordinator::{
    find_coordinator_request, found_coordinator, FoundCoordinator,
};
use kafka_lock::internals::wire::Response;
use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, DescribeGroupsRequest, GroupId, HeartbeatRequest, MetadataRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;

/// Runs `fut` on the support code's own runtime and waits for it. The support is called from
/// plain tests and from inside tokio tests alike, and a runtime cannot be entered from within
/// another; a runtime of its own on its own thread works for both.
pub fn block_on<F>(fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kafka-support")
            .enable_all()
            .build()
            .expect("build the support runtime")
    });
    let (tx, rx) = std::sync::mpsc::channel();
    runtime.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().expect("the support task panicked")
}

/// FindCoordinator for `group`, sent to the broker at `addr` (`host:port`). Any failure, from a
/// refused connection to a broker error code, is an `Err` describing it.
pub fn find_coordinator(addr: &str, group: &str) -> Result<FoundCoordinator, String> {
    let (addr, group) = (addr.to_owned(), group.to_owned());
    block_on(async move {
        let conn = connect(&addr).await?;
        let version = conn
            .versions()
            .get(ApiKey::FindCoordinator)
            .ok_or_else(|| format!("{addr} does not support FindCoordinator"))?;
        let resp = conn
            .request(find_coordinator_request(&group, version))
            .await
            .map_err(|e| format!("FindCoordinator({group}) at {addr}: {e}"))?;
        let Response::FindCoordinator(resp) = resp else {
            return Err(format!("{addr} answered FindCoordinator with {resp:?}"));
        };
        found_coordinator(&resp).map_err(|e| format!("FindCoordinator({group}) at {addr}: {e}"))
    })
}

/// The coordinator of `group` as the broker at `addr` names it, connected.
pub async fn coordinator_connection(addr: &str, group: &str) -> Result<Connection, String> {
    let conn = connect(addr).await?;
    let version = conn
        .versions()
        .get(ApiKey::FindCoordinator)
        .ok_or_else(|| format!("{addr} does not support FindCoordinator"))?;
    let resp = conn
        .request(find_coordinator_request(group, version))
        .await
        .map_err(|e| format!("FindCoordinator({group}) at {addr}: {e}"))?;
    let Response::FindCoordinator(resp) = resp else {
        return Err(format!("{addr} answered FindCoordinator with {resp:?}"));
    };
    let found =
        found_coordinator(&resp).map_err(|e| format!("FindCoordinator({group}) at {addr}: {e}"))?;
    let there = format!("{}:{}", found.host, found.port);
    if there == conn.peer() {
        return Ok(conn);
    }
    conn.close();
    connect(&there).await
}

/// DescribeGroups for `group`, asked of its coordinator (found through `addr`): state, protocol
/// and every member with its metadata and assignment bytes, as `kafka-lock status` reads them.
pub async fn describe_group(addr: &str, group: &str) -> Result<DescribedGroup, String> {
    let conn = coordinator_connection(addr, group).await?;
    let req = DescribeGroupsRequest::default()
        .with_groups(vec![GroupId(StrBytes::from_string(group.to_owned()))]);
    let resp = conn
        .request(req)
        .await
        .map_err(|e| format!("DescribeGroups({group}) at {}: {e}", conn.peer()))?;
    conn.close();
    let Response::DescribeGroups(resp) = resp else {
        return Err(format!("DescribeGroups answered with {resp:?}"));
    };
    let group = resp
        .groups
        .into_iter()
        .next()
        .ok_or("DescribeGroups described no group")?;
    if group.error_code != 0 {
        return Err(format!("DescribeGroups error {}", group.error_code));
    }
    Ok(group)
}

/// Creates `name` with `partitions` partitions, replicated as the brokers'
/// `default.replication.factor` says, and waits until every broker of `bootstrap`
/// (`host:port[,host:port...]`) lists every partition with a leader (a lock's Metadata check,
/// sent to any of them, must find it).
///
/// CreateTopics is written by hand with kafka-protocol's codec over a plain socket: the crate's
/// wire layer has no CreateTopics, and the Java Admin helper costs a JVM start (seconds of both
/// cores) per call.
///
/// # Panics
/// When the broker refuses (the topic exists, say) or the partitions get no leader in time.
pub fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    create_topic_with(bootstrap, name, partitions, &[]);
}

/// [`create_topic`] with topic configs (`max.message.bytes`, ...).
///
/// # Panics
/// As [`create_topic`], and when the broker refuses a config.
pub fn create_topic_with(bootstrap: &str, name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let addrs: Vec<&str> = bootstrap.split(',').collect();
    // Any broker forwards CreateTopics to the controller.
    if let Err(e) = send_create_topics(addrs[0], name, partitions, configs) {
        panic!(
            "creating topic {name} ({partitions} partitions) at {}: {e}",
            addrs[0]
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for addr in addrs {
        loop {
            let led = leaders(addr, name);
            if matches!(&led, Ok(n) if *n == partitions as usize) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "topic {name} at {addr}: partitions with a leader after 60 s: {led:?}"
            );
            // Polling: a broker learns of a new topic from the controller's metadata log, which
            // a client cannot wait on.
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// How many partitions of `topic` have a leader, as the broker at `addr` sees it.
fn leaders(addr: &str, topic: &str) -> Result<usize, String> {
    let (addr, topic) = (addr.to_owned(), topic.to_owned());
    block_on(async move {
        let conn = connect(&addr).await?;
        let req = MetadataRequest::default()
            .with_topics(Some(vec![MetadataRequestTopic::default()
                .with_name(Some(TopicName(StrBytes::from_string(topic.clone()))))]));
        let resp = conn
            .request(req)
            .await
            .map_err(|e| format!("Metadata at {addr}: {e}"))?;
        conn.close();
        let Response::Metadata(resp) = resp else {
            return Err(format!("{addr} answered Metadata with {resp:?}"));
        };
        let t = resp.topics.first().ok_or("no topic in the answer")?;
        if t.error_code != 0 {
            return Err(format!("error {}", t.error_code));
        }
        Ok(t.partitions.iter().filter(|p| p.leader_id.0 >= 0).count())
    })
}

fn send_create_topics(
    addr: &str,
    name: &str,
    partitions: i32,
    configs: &[(&str, &str)],
) -> Result<(), String> {
    use bytes::{Buf, BytesMut};
    use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
    use kafka_protocol::messages::{
        CreateTopicsRequest, CreateTopicsResponse, RequestHeader, ResponseHeader,
    };
    use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion};
    use std::io::{Read, Write};

    // Version 4: the first that takes replication factor -1 (the broker's default), and the last
    // before flexible encoding, so the framing stays simple. Apache Kafka 4.x accepts 2 to 7.
    const VERSION: i16 = 4;
    fn text(e: impl std::fmt::Display) -> String {
        e.to_string()
    }
    let io = text;
    let encode = text;
    let header = RequestHeader::default()
        .with_request_api_key(ApiKey::CreateTopics as i16)
        .with_request_api_version(VERSION)
        .with_correlation_id(0x6b6c_0002)
        .with_client_id(Some(StrBytes::from_static_str("kafka-lock-tests")));
    let topic = CreatableTopic::default()
        .with_name(TopicName(StrBytes::from_string(name.to_owned())))
        .with_num_partitions(partitions)
        .with_replication_factor(-1)
        .with_configs(
            configs
                .iter()
                .map(|(k, v)| {
                    CreatableTopicConfig::default()
                        .with_name(StrBytes::from_string((*k).to_owned()))
                        .with_value(Some(StrBytes::from_string((*v).to_owned())))
                })
                .collect(),
        );
    let req = CreateTopicsRequest::default()
        .with_topics(vec![topic])
        .with_timeout_ms(30_000);
    let mut body = BytesMut::new();
    header
        .encode(&mut body, CreateTopicsRequest::header_version(VERSION))
        .map_err(encode)?;
    req.encode(&mut body, VERSION).map_err(encode)?;

    let mut stream = std::net::TcpStream::connect(addr).map_err(io)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(io)?;
    stream
        .write_all(&(body.len() as i32).to_be_bytes())
        .map_err(io)?;
    stream.write_all(&body).map_err(io)?;
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).map_err(io)?;
    let len = i32::from_be_bytes(len);
    if !(4..=1 << 20).contains(&len) {
        return Err(format!("implausible response length {len}"));
    }
    let mut buf = vec![0u8; len as usize];
    stream.read_exact(&mut buf).map_err(io)?;
    let mut buf = bytes::Bytes::from(buf);
    ResponseHeader::decode(&mut buf, CreateTopicsResponse::header_version(VERSION))
        .map_err(encode)?;
    let resp = CreateTopicsResponse::decode(&mut buf, VERSION).map_err(encode)?;
    if buf.has_remaining() {
        return Err(format!("{} bytes after the response", buf.remaining()));
    }
    match resp.topics.first() {
        Some(t) if t.error_code == 0 => Ok(()),
        Some(t) => Err(format!(
            "error {} ({:?})",
            t.error_code,
            t.error_message.as_ref().map(|m| m.as_str())
        )),
        None => Err("CreateTopics answered for no topic".into()),
    }
}

/// Whether `group`'s coordinator, found through `addr`, has loaded the group's
/// `__consumer_offsets` partition: it answers a Heartbeat from a member nobody knows with
/// UNKNOWN_MEMBER_ID. FindCoordinator names a node as soon as the metadata makes it the
/// partition's leader; until its coordinator has loaded the partition, group requests get
/// NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS, and heartbeats NONE, blindly.
pub fn coordinator_loaded(addr: &str, group: &str) -> Result<(), String> {
    let (addr, group) = (addr.to_owned(), group.to_owned());
    block_on(async move {
        let conn = coordinator_connection(&addr, &group).await?;
        let req = HeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.clone())))
            .with_generation_id(1)
            .with_member_id(StrBytes::from_static_str("kafka-lock-tests-nobody"));
        let resp = conn.request(req).await;
        conn.close();
        match resp {
            Ok(Response::Heartbeat(r)) if r.error_code == 25 => Ok(()),
            Ok(Response::Heartbeat(r)) => Err(format!(
                "{group}'s coordinator answered a stranger's Heartbeat with {} (not loaded yet)",
                r.error_code
            )),
            other => Err(format!("Heartbeat({group}): {other:?}")),
        }
    })
}

/// Connects with short bounds: callers poll, and a paused or dying broker must not hold them up.
async fn connect(addr: &str) -> Result<Connection, String> {
    let cfg = ConnConfig::default()
        .with_client_id(Some("kafka-lock-tests-probe".into()))
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(5));
    Connection::connect(addr, &cfg)
        .await
        .map_err(|e| format!("connect to {addr}: {e}"))
}

/// The partitions, of every topic the broker at `addr` knows, that have no leader or fewer
/// in-sync replicas than replicas, as `topic-partition leader=L replicas=[..] isr=[..]`; empty
/// when every partition is fully replicated.
pub fn under_replicated(addr: &str) -> Result<Vec<String>, String> {
    let addr = addr.to_owned();
    block_on(async move {
        let conn = connect(&addr).await?;
        // No topic list: all topics, the internal ones included.
        let resp = conn
            .request(MetadataRequest::default().with_topics(None))
            .await
            .map_err(|e| format!("Metadata at {addr}: {e}"))?;
        let Response::Metadata(resp) = resp else {
            return Err(format!("{addr} answered Metadata with {resp:?}"));
        };
        let mut problems = Vec::new();
        for topic in &resp.topics {
            let name = topic.name.as_ref().map_or("?", |n| n.as_str());
            if topic.error_code != 0 {
                problems.push(format!("{name}: error {}", topic.error_code));
            }
            for p in &topic.partitions {
                if p.leader_id.0 < 0 || p.isr_nodes.len() < p.replica_nodes.len() {
                    let ids = |v: &[kafka_protocol::messages::BrokerId]| {
                        v.iter().map(|b| b.0).collect::<Vec<_>>()
                    };
                    problems.push(format!(
                        "{name}-{} leader={} replicas={:?} isr={:?}",
                        p.partition_index,
                        p.leader_id.0,
                        ids(&p.replica_nodes),
                        ids(&p.isr_nodes)
                    ));
                }
            }
        }
        Ok(problems)
    })
}

/// Java's `String.hashCode`, over UTF-16 code units with wrapping arithmetic.
pub fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16().fold(0i32, |h, unit| {
        h.wrapping_mul(31).wrapping_add(i32::from(unit))
    })
}

/// The `__consumer_offsets` partition that holds `group`, so the broker leading it is the
/// group's coordinator: `Utils.abs(group.hashCode()) % partitions` (GroupCoordinatorService), where
/// `Utils.abs(Integer.MIN_VALUE)` is 0.
pub fn offsets_partition(group: &str, partitions: i32) -> i32 {
    let hash = java_string_hash(group);
    let abs = if hash == i32::MIN { 0 } else { hash.abs() };
    abs % partitions
}

/// A group name (`<prefix>-<n>`) that lands on `__consumer_offsets` partition `partition`.
pub fn group_on_partition(prefix: &str, partition: i32, partitions: i32) -> String {
    (0u32..)
        .map(|n| format!("{prefix}-{n}"))
        .find(|g| offsets_partition(g, partitions) == partition)
        .expect("some suffix lands on every partition")
}

#[test]
fn java_hash_matches_java() {
    // Values from Java's "...".hashCode().
    assert_eq!(java_string_hash(""), 0);
    assert_eq!(java_string_hash("a"), 97);
    assert_eq!(java_string_hash("hello"), 99_162_322);
    assert_eq!(java_string_hash("kafka-lock"), 1_892_022_130);
    // Non-ASCII, and a character outside the BMP (a surrogate pair in UTF-16).
    assert_eq!(java_string_hash("grüße-😀"), 347_391_577);
    assert_eq!(java_string_hash("polygenelubricants"), i32::MIN);
    assert_eq!(offsets_partition("polygenelubricants", 50), 0);
    for p in 0..3 {
        assert_eq!(offsets_partition(&group_on_partition("g", p, 3), 3), p);
    }
}

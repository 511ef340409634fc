//! Asking a broker who coordinates a group, through the crate's own connection and wire layer,
//! from synchronous support code.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use kafka_lock::driver::{ConnConfig, Connection};
use kafka_lock::wire::coordinator::{
    find_coordinator_request, found_coordinator, FoundCoordinator,
};
use kafka_lock::wire::Response;
use kafka_protocol::messages::{ApiKey, MetadataRequest};

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

//! Topic and group administration through Kafka's own Java Admin client
//! (`tests/java/KafkaAdmin.java`), independent of the library under test. Each call is one JVM
//! (about two seconds, most of it compiling the source file).

use std::time::Duration;

use super::{jvm, new_log_path};
use crate::support::lifeline::run_to_end;

/// Bound on one admin call: the helper bounds each of its own requests at 30 s.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(90);

/// A classic group as DescribeGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    /// `Stable`, `PreparingRebalance`, `CompletingRebalance`, `Empty`, `Dead`.
    pub state: String,
    /// `consumer` for Java consumers and kafka-lock's consumer-compatible mode.
    pub protocol_type: String,
    /// The assignor (consumer groups) or protocol name the coordinator chose.
    pub protocol: String,
    /// The coordinator's node id.
    pub coordinator: i32,
    pub members: Vec<GroupMember>,
}

/// One member of a [`GroupDescription`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub host: String,
    /// `(topic, partition)` assigned to it; only consumer groups' assignments are decoded.
    pub partitions: Vec<(String, i32)>,
}

/// Runs the helper and returns its result lines (`group`/`member`), or the error it printed.
fn run(bootstrap: &str, args: &[&str]) -> Result<Vec<String>, String> {
    let mut cmd = jvm().source_command("KafkaAdmin.java");
    cmd.arg(bootstrap).args(args);
    let log = new_log_path("kafka-admin");
    let (status, output) = run_to_end(&cmd, &log, ADMIN_TIMEOUT)
        .unwrap_or_else(|e| panic!("KafkaAdmin {args:?}: {e}"));
    // stdout and stderr share the log: the helper's own lines start with a known word, log4j's
    // with '['.
    let lines: Vec<String> = output.lines().map(str::to_owned).collect();
    if let Some(error) = lines.iter().find_map(|l| l.strip_prefix("error\t")) {
        return Err(error.replacen('\t', ": ", 1));
    }
    assert!(
        status.success() && lines.iter().any(|l| l == "ok"),
        "KafkaAdmin {args:?} against {bootstrap} failed with {status}; its output ({}):\n{output}",
        log.display()
    );
    let _ = std::fs::remove_file(&log);
    Ok(lines
        .into_iter()
        .filter(|l| l.starts_with("group\t") || l.starts_with("member\t"))
        .collect())
}

/// Creates `name` with `partitions` partitions (replicated to every node of the cluster).
///
/// # Panics
/// When the topic cannot be created, including when it already exists.
pub fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    if let Err(e) = run(bootstrap, &["create-topic", name, &partitions.to_string()]) {
        panic!("creating topic {name} ({partitions} partitions) at {bootstrap}: {e}");
    }
}

/// Makes node `ids[i % n]` (the cluster's node ids in order) the first replica and the leader
/// of partition `i` of `topic`: a reassignment that only reorders each partition's replicas, then
/// a preferred election (Admin.alterPartitionReassignments, Admin.electLeaders). Every replica
/// must be in sync; see [`super::KafkaCluster::spread_offsets_leaders`].
///
/// # Panics
/// When the move or the election fails.
pub fn spread_leaders(bootstrap: &str, topic: &str) {
    if let Err(e) = run(bootstrap, &["spread-leaders", topic]) {
        panic!("spreading the leaders of {topic} at {bootstrap}: {e}");
    }
}

/// Deletes `group` (Admin.deleteConsumerGroups). The broker refuses while the group has members:
/// `Err` then carries the Java exception, e.g. `...GroupNotEmptyException: ...`.
pub fn delete_group(bootstrap: &str, group: &str) -> Result<(), String> {
    run(bootstrap, &["delete-group", group]).map(|_| ())
}

/// Deletes `group`'s committed offset of partition 0 of `topic` (Admin.deleteConsumerGroupOffsets,
/// i.e. OffsetDelete). The broker refuses while a member of the group subscribes to `topic`.
pub fn delete_offsets(bootstrap: &str, group: &str, topic: &str) -> Result<(), String> {
    run(bootstrap, &["delete-offsets", group, topic]).map(|_| ())
}

/// Describes `group` (Admin.describeClassicGroups, i.e. DescribeGroups). `Err` carries the Java
/// exception, e.g. `...GroupIdNotFoundException: ...` for a group that does not exist.
pub fn describe_group(bootstrap: &str, group: &str) -> Result<GroupDescription, String> {
    let lines = run(bootstrap, &["describe-group", group])?;
    let fields = |line: &str| -> Vec<(String, String)> {
        line.split('\t')
            .skip(1)
            .filter_map(|f| f.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    };
    let get = |fields: &[(String, String)], key: &str| -> String {
        fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("KafkaAdmin describe-group printed no {key}: {fields:?}"))
    };
    let head = lines
        .iter()
        .find(|l| l.starts_with("group\t"))
        .map(|l| fields(l))
        .ok_or_else(|| format!("KafkaAdmin describe-group printed no group line: {lines:?}"))?;
    let members = lines
        .iter()
        .filter(|l| l.starts_with("member\t"))
        .map(|l| {
            let f = fields(l);
            let instance = get(&f, "instance_id");
            GroupMember {
                member_id: get(&f, "member_id"),
                instance_id: (!instance.is_empty()).then_some(instance),
                client_id: get(&f, "client_id"),
                host: get(&f, "host"),
                partitions: get(&f, "partitions")
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(|p| {
                        let (topic, partition) = p.rsplit_once(':').expect("topic:partition");
                        (
                            topic.to_owned(),
                            partition.parse().expect("partition number"),
                        )
                    })
                    .collect(),
            }
        })
        .collect();
    Ok(GroupDescription {
        state: get(&head, "state"),
        protocol_type: get(&head, "protocol_type"),
        protocol: get(&head, "protocol"),
        coordinator: get(&head, "coordinator").parse().expect("coordinator id"),
        members,
    })
}

//! Static checks of `docker-compose.yml` and `docker/Dockerfile`.
//!
//! No Docker engine runs where these tests run, so the compose setup is never started here. These
//! tests parse the files and check the settings the documentation promises: what each one does to
//! acquisition and failover is explained in the compose file's comments.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::Duration;

use yaml_rust2::{Yaml, YamlLoader};

use crate::support::repo_root;

/// The path of the musl build that `scripts/build-static.sh` writes and the image copies.
const STATIC_BINARY: &str = "target/x86_64-unknown-linux-musl/release/kafka-lock";

fn read(relative: &str) -> String {
    let path = repo_root().join(relative);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn compose() -> Yaml {
    let text = read("docker-compose.yml");
    let mut docs = YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("docker-compose.yml is not valid YAML: {e}"));
    assert_eq!(
        docs.len(),
        1,
        "docker-compose.yml must hold exactly one YAML document"
    );
    docs.remove(0)
}

fn service<'a>(doc: &'a Yaml, name: &str) -> &'a Yaml {
    let s = &doc["services"][name];
    assert!(
        s.as_hash().is_some(),
        "docker-compose.yml has no service {name:?}"
    );
    s
}

/// A scalar as compose sees it: environment values may be written as numbers or strings.
fn scalar(y: &Yaml) -> Option<String> {
    match y {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A service's environment, from either compose syntax (a mapping, or a list of `KEY=VALUE`).
fn environment(svc: &Yaml) -> BTreeMap<String, String> {
    let env = &svc["environment"];
    let mut out = BTreeMap::new();
    if let Some(h) = env.as_hash() {
        for (k, v) in h {
            let k = scalar(k).expect("environment keys are strings");
            out.insert(k, scalar(v).unwrap_or_default());
        }
    } else if let Some(list) = env.as_vec() {
        for item in list {
            let item = item.as_str().expect("environment list items are strings");
            let (k, v) = item.split_once('=').unwrap_or((item, ""));
            out.insert(k.to_owned(), v.to_owned());
        }
    }
    out
}

fn strings(y: &Yaml) -> Vec<String> {
    y.as_vec()
        .map(|v| v.iter().filter_map(scalar).collect())
        .unwrap_or_default()
}

/// Durations as kafka-lock's command line writes them, in the forms the compose file uses.
fn duration(s: &str) -> Duration {
    let s = s.trim();
    if let Some(ms) = s.strip_suffix("ms") {
        return Duration::from_millis(ms.parse().expect("a whole number of milliseconds"));
    }
    if let Some(secs) = s.strip_suffix('s') {
        return Duration::from_secs(secs.parse().expect("a whole number of seconds"));
    }
    if let Some(mins) = s.strip_suffix('m') {
        return Duration::from_secs(60 * mins.parse::<u64>().expect("a whole number of minutes"));
    }
    panic!("unexpected duration {s:?}")
}

/// The value after `--flag` in a command line, looking only before the `--` that starts the job.
fn option<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let own = args.iter().position(|a| a == "--").unwrap_or(args.len());
    args[..own]
        .iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

#[test]
fn compose_defines_the_broker_and_the_example_job() {
    let doc = compose();
    let services = doc["services"]
        .as_hash()
        .expect("docker-compose.yml has a `services` mapping");
    let names: Vec<String> = services.keys().filter_map(scalar).collect();
    assert!(
        names.iter().any(|n| n == "kafka"),
        "no `kafka` service: {names:?}"
    );
    assert!(
        names.iter().any(|n| n == "job"),
        "no `job` service: {names:?}"
    );
}

#[test]
fn broker_is_a_pinned_single_node_kraft_apache_kafka_4() {
    let doc = compose();
    let kafka = service(&doc, "kafka");
    let image = kafka["image"]
        .as_str()
        .expect("the kafka service names an image");
    let version = image
        .strip_prefix("apache/kafka:")
        .unwrap_or_else(|| panic!("the broker must be Apache Kafka's own image, not {image:?}"));
    let parts: Vec<&str> = version.split('.').collect();
    assert!(
        parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok()) && parts[0] == "4",
        "the image must be pinned to a 4.x.y release, not {image:?}"
    );
    // The compose file shows users what the tests prove: the same broker release.
    assert_eq!(
        version,
        tested_kafka_version(),
        "docker-compose.yml runs Apache Kafka {version}, the tests run the version pinned in scripts/kafka/pom.xml"
    );

    let env = environment(kafka);
    let roles = env
        .get("KAFKA_PROCESS_ROLES")
        .expect("KAFKA_PROCESS_ROLES is set (KRaft)");
    assert!(
        roles.contains("broker") && roles.contains("controller"),
        "one node must be broker and controller, not {roles:?}"
    );
    assert!(
        env.contains_key("KAFKA_CONTROLLER_QUORUM_VOTERS"),
        "KRaft needs KAFKA_CONTROLLER_QUORUM_VOTERS"
    );
    assert_eq!(
        env.get("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR")
            .map(String::as_str),
        Some("1"),
        "on one node the group coordinator's topic needs replication factor 1, or no group can form"
    );
}

/// The Apache Kafka release the integration tests run (`scripts/kafka/pom.xml`).
fn tested_kafka_version() -> String {
    let pom = read("scripts/kafka/pom.xml");
    let at = pom
        .find("<artifactId>kafka_2.13</artifactId>")
        .expect("the pom fetches kafka_2.13");
    let rest = &pom[at..];
    let start = rest.find("<version>").expect("a version follows") + "<version>".len();
    let end = rest[start..].find("</version>").expect("the version ends");
    rest[start..start + end].trim().to_owned()
}

#[test]
fn broker_settings_suit_lock_groups() {
    let doc = compose();
    let env = environment(service(&doc, "kafka"));
    assert_eq!(
        env.get("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS")
            .map(String::as_str),
        Some("0"),
        "with the default 3000 every uncontended acquire waits 3 s"
    );
    let min_session: u64 = env
        .get("KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS")
        .expect("KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS is set explicitly (the floor on failover time)")
        .parse()
        .expect("KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS is a number of milliseconds");

    // The example job's session timeout must be one the broker accepts, or it exits with 78.
    let args = strings(&service(&doc, "job")["command"]);
    let session = option(&args, "--session-timeout").map_or(Duration::from_secs(10), duration);
    assert!(
        session >= Duration::from_millis(min_session),
        "the job's --session-timeout {session:?} is below the broker's minimum {min_session} ms"
    );
    if let Some(grace) = option(&args, "--kill-grace") {
        assert!(
            duration(grace) < session,
            "--kill-grace must be shorter than the session timeout"
        );
    }
}

#[test]
fn published_ports_bind_loopback_only() {
    let doc = compose();
    let services = doc["services"].as_hash().expect("a `services` mapping");
    let mut published = 0;
    for (name, svc) in services {
        let name = scalar(name).unwrap_or_default();
        for port in svc["ports"].as_vec().into_iter().flatten() {
            published += 1;
            match port {
                // Short syntax: only HOST_IP:HOST_PORT:CONTAINER_PORT names the host address.
                Yaml::String(s) => assert!(
                    s.starts_with("127.0.0.1:") && s.split(':').count() == 3,
                    "service {name}: port {s:?} must be published on 127.0.0.1 only"
                ),
                Yaml::Hash(_) => assert_eq!(
                    port["host_ip"].as_str(),
                    Some("127.0.0.1"),
                    "service {name}: every published port needs host_ip 127.0.0.1"
                ),
                other => panic!("service {name}: port {other:?} must be published on 127.0.0.1"),
            }
        }
    }
    assert!(
        published > 0,
        "the broker must be reachable from this machine"
    );
    let ports = strings(&service(&doc, "kafka")["ports"]);
    assert!(
        ports.iter().any(|p| p == "127.0.0.1:9092:9092"),
        "the broker is published as 127.0.0.1:9092, as the documentation says: {ports:?}"
    );
    let advertised = environment(service(&doc, "kafka"))
        .get("KAFKA_ADVERTISED_LISTENERS")
        .cloned()
        .unwrap_or_default();
    assert!(
        advertised.contains("://127.0.0.1:9092"),
        "clients on this machine connect to what the broker advertises, which must be 127.0.0.1:9092: {advertised:?}"
    );
}

#[test]
fn broker_healthcheck_asks_for_api_versions() {
    let doc = compose();
    let test = strings(&service(&doc, "kafka")["healthcheck"]["test"]);
    assert!(
        test.iter()
            .any(|a| a.ends_with("kafka-broker-api-versions.sh")),
        "the healthcheck must run kafka-broker-api-versions.sh: {test:?}"
    );
    let job = service(&doc, "job");
    assert_eq!(
        job["depends_on"]["kafka"]["condition"].as_str(),
        Some("service_healthy"),
        "the job must wait until the broker is healthy"
    );
}

#[test]
fn example_job_runs_under_kafka_lock_run() {
    let doc = compose();
    let job = service(&doc, "job");
    let args = strings(&job["command"]);
    assert!(
        args.len() >= 2 && args[0].rsplit('/').next() == Some("kafka-lock") && args[1] == "run",
        "the job's command must be `kafka-lock run ...`: {args:?}"
    );
    assert!(
        option(&args, "--lock").is_some_and(|l| !l.is_empty()),
        "the job names its lock with --lock: {args:?}"
    );
    let dash = args
        .iter()
        .position(|a| a == "--")
        .unwrap_or_else(|| panic!("the job's own command follows `--`: {args:?}"));
    assert!(
        dash + 1 < args.len(),
        "a command must follow `--`: {args:?}"
    );

    // The bootstrap must be a listener the broker advertises to the compose network.
    let env = environment(job);
    let bootstrap = option(&args, "--bootstrap")
        .map(str::to_owned)
        .or_else(|| env.get("KAFKA_LOCK_BOOTSTRAP").cloned())
        .expect("the job sets --bootstrap or KAFKA_LOCK_BOOTSTRAP");
    let advertised = environment(service(&doc, "kafka"))
        .get("KAFKA_ADVERTISED_LISTENERS")
        .cloned()
        .unwrap_or_default();
    assert!(
        advertised.contains(&format!("://{bootstrap}")),
        "the job's bootstrap {bootstrap:?} is not among the broker's advertised listeners {advertised:?}"
    );

    assert_eq!(
        job["build"]["dockerfile"].as_str(),
        Some("docker/Dockerfile"),
        "the job image is built from docker/Dockerfile"
    );
    // The script the job runs must be one the image contains.
    let dockerfile = read("docker/Dockerfile");
    let copied: Vec<String> = instructions(&dockerfile)
        .into_iter()
        .filter(|(op, _)| op == "COPY")
        .filter_map(|(_, args)| args.split_whitespace().last().map(str::to_owned))
        .collect();
    for arg in &args[dash + 1..] {
        if arg.starts_with("/job/") {
            assert!(
                copied.contains(arg),
                "the job runs {arg}, which docker/Dockerfile does not COPY into the image"
            );
        }
    }
}

/// The instructions of a Dockerfile, upper-cased, with continuation lines joined and comments
/// (including parser directives) dropped.
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(trimmed);
        let (op, args) = current
            .split_once(char::is_whitespace)
            .unwrap_or((&current, ""));
        out.push((op.to_ascii_uppercase(), args.trim().to_owned()));
        current.clear();
    }
    out
}

#[test]
fn dockerfile_final_stage_is_from_scratch() {
    let text = read("docker/Dockerfile");
    let steps = instructions(&text);
    let froms: Vec<&String> = steps
        .iter()
        .filter(|(op, _)| op == "FROM")
        .map(|(_, a)| a)
        .collect();
    let last = froms.last().expect("docker/Dockerfile has a FROM");
    let image = last.split_whitespace().next().unwrap_or_default();
    assert_eq!(
        image, "scratch",
        "the final stage must be FROM scratch, not {last:?}"
    );

    // Every other base image is pinned, so the image is the same tomorrow.
    let mut stages = Vec::new();
    for from in &froms[..froms.len() - 1] {
        let words: Vec<&str> = from.split_whitespace().collect();
        let image = words
            .iter()
            .find(|w| !w.starts_with("--"))
            .copied()
            .unwrap_or("");
        if image != "scratch" && !stages.contains(&image.to_owned()) {
            let tag = image.rsplit('/').next().unwrap_or(image);
            assert!(
                image.contains("@sha256:")
                    || tag.split_once(':').is_some_and(|(_, t)| t != "latest"),
                "base image {image:?} must be pinned to a version"
            );
        }
        if let Some(i) = words.iter().position(|w| w.eq_ignore_ascii_case("AS")) {
            if let Some(name) = words.get(i + 1) {
                stages.push((*name).to_owned());
            }
        }
    }

    // The final stage holds the static binary, and what it copies from the build context gets
    // through docker/Dockerfile.dockerignore.
    let final_start = steps
        .iter()
        .rposition(|(op, _)| op == "FROM")
        .expect("a FROM");
    let copies: Vec<&String> = steps[final_start..]
        .iter()
        .filter(|(op, _)| op == "COPY")
        .map(|(_, a)| a)
        .collect();
    assert!(
        copies
            .iter()
            .any(|a| a.split_whitespace().next() == Some(STATIC_BINARY)),
        "the final stage must COPY {STATIC_BINARY} (the output of scripts/build-static.sh)"
    );
    let ignore = read("docker/Dockerfile.dockerignore");
    for copy in copies.iter().filter(|a| !a.starts_with("--from")) {
        let words: Vec<&str> = copy.split_whitespace().collect();
        for source in &words[..words.len().saturating_sub(1)] {
            assert!(
                ignore.lines().any(|l| l.trim() == format!("!{source}")),
                "docker/Dockerfile.dockerignore must let {source} into the build context"
            );
            if *source != STATIC_BINARY {
                assert!(
                    Path::new(&repo_root()).join(source).exists(),
                    "docker/Dockerfile copies {source}, which does not exist"
                );
            }
        }
    }
}

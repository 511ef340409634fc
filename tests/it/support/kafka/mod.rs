//! Apache Kafka in the tests: the pinned broker (`scripts/kafka/pom.xml`, fetched into
//! `.tools/kafka/libs` by `scripts/install-test-deps.sh`) run as plain JVMs on loopback in KRaft
//! mode, plus the Java programs under `tests/java` that run from the same jars.
//!
//! - [`kafka()`]: one single-node broker shared by every test of the binary, with
//!   `group.initial.rebalance.delay.ms=0` so an uncontended lock is taken at once.
//! - [`kafka_default_delay()`]: a second shared one with the default 3000 ms delay, what users
//!   get. The delay is a static broker setting (not dynamically reconfigurable, not a per-group
//!   config), and tests run concurrently, so the two values need two brokers.
//! - [`KafkaCluster::start`]: a cluster of a test's own (three nodes with
//!   [`KafkaOptions::three_nodes`]) whose nodes it can kill, pause, stop and restart.
//! - [`admin`]: create topics, describe and delete groups with Kafka's own Admin client.
//! - [`secure::secure_kafka`]: a shared node with SASL_SSL, SSL (mTLS), SASL_PLAINTEXT and
//!   re-authenticating listeners, its throwaway PKI and users.
//! - [`peer::SeedPeer`]: the seed design's lock, a Java KafkaConsumer, as a process.
//!
//! Every JVM runs under [`super::lifeline`], so none outlives the test process, and every
//! broker's files live in a scratch directory that goes with it. docs/testing.md has the settings
//! and the measured start-up times and memory.
//!
//! The tests never skip: without Java 17+ or the jars they panic and say how to install them.

pub mod admin;
mod cluster;
mod node;
pub mod oauth;
pub mod peer;
pub mod probe;
mod scratch;
pub mod secure;
mod selftest;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

pub use cluster::{KafkaCluster, KafkaOptions};

use super::repo_root;

/// Environment variable naming the `java` to use instead of the one on PATH.
pub const JAVA_ENV: &str = "KAFKA_LOCK_JAVA";
/// Environment variable naming the folder of Kafka jars instead of `.tools/kafka/libs`.
pub const LIBS_ENV: &str = "KAFKA_LOCK_KAFKA_LIBS";

/// Kafka 4.x brokers need Java 17 (its build's minNonClientJavaVersion).
const JAVA_MIN_MAJOR: u32 = 17;

const INSTALL_HINT: &str = "run `scripts/install-test-deps.sh` from the repository root \
     (it checks for Java 17+ and fetches the pinned Apache Kafka jars into .tools/kafka/libs)";

/// Options every JVM gets:
/// - C1 only: most of a test JVM's life is start-up, where C2 compiles burn CPU the two cores
///   need, for code that runs too briefly to profit.
/// - Serial GC: the smallest footprint and no GC threads; pauses are irrelevant at these heaps.
/// - No perf data: a SIGKILLed JVM cannot remove its /tmp/hsperfdata_<user>/<pid> file, and the
///   tests kill JVMs all the time.
const JVM_FLAGS: [&str; 3] = [
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-XX:-UsePerfData",
];

/// The broker shared by every test in this binary (single node, initial rebalance delay 0),
/// started on first use.
///
/// # Panics
/// When Java or the jars are missing, or the broker does not become ready.
pub fn kafka() -> &'static KafkaCluster {
    static SHARED: OnceLock<KafkaCluster> = OnceLock::new();
    SHARED.get_or_init(|| KafkaCluster::start(KafkaOptions::single_node()))
}

/// A second shared single-node broker with the default `group.initial.rebalance.delay.ms`
/// (3000): an empty group's first join waits that long, as it does for users.
pub fn kafka_default_delay() -> &'static KafkaCluster {
    static SHARED: OnceLock<KafkaCluster> = OnceLock::new();
    SHARED.get_or_init(|| {
        KafkaCluster::start(
            KafkaOptions::single_node().initial_rebalance_delay(Duration::from_millis(3000)),
        )
    })
}

/// A `java` of version 17 or newer and the folder of Kafka jars.
pub struct Jvm {
    java: PathBuf,
    libs: PathBuf,
}

/// The JVM the tests use, checked once.
///
/// # Panics
/// When `java` is missing or older than 17, or the jars are missing, with instructions.
pub fn jvm() -> &'static Jvm {
    static FOUND: OnceLock<Result<Jvm, String>> = OnceLock::new();
    match FOUND.get_or_init(find_jvm) {
        Ok(jvm) => jvm,
        Err(message) => panic!("{message}"),
    }
}

fn find_jvm() -> Result<Jvm, String> {
    let java = PathBuf::from(std::env::var_os(JAVA_ENV).unwrap_or_else(|| "java".into()));
    let out = Command::new(&java).arg("-version").output().map_err(|e| {
        format!(
            "cannot run `{} -version` ({e}): {INSTALL_HINT}",
            java.display()
        )
    })?;
    // `java -version` writes to stderr, e.g. `openjdk version "17.0.15" 2025-04-15`.
    let text = String::from_utf8_lossy(&out.stderr);
    let major = java_major_version(&text).ok_or_else(|| {
        format!(
            "cannot tell the Java version of {} from {text:?}: {INSTALL_HINT}",
            java.display()
        )
    })?;
    if major < JAVA_MIN_MAJOR {
        return Err(format!(
            "{} is Java {major}; Apache Kafka 4.x needs {JAVA_MIN_MAJOR}+ (set {JAVA_ENV}): {INSTALL_HINT}",
            java.display()
        ));
    }
    let libs = std::env::var_os(LIBS_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".tools/kafka/libs"));
    check_libs(&libs)?;
    Ok(Jvm { java, libs })
}

/// The major version in `java -version` output: `"17.0.15"` is 17, `"1.8.0_402"` is 8.
fn java_major_version(output: &str) -> Option<u32> {
    let quoted = output.split('"').nth(1)?;
    let mut parts = quoted.split(['.', '-', '+', '_']);
    match parts.next()?.parse().ok()? {
        1 => parts.next()?.parse().ok(),
        major => Some(major),
    }
}

fn check_libs(libs: &Path) -> Result<(), String> {
    let names: Vec<String> = std::fs::read_dir(libs)
        .map_err(|e| format!("no Kafka jars at {} ({e}): {INSTALL_HINT}", libs.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    // The broker, the Java client and the log binding without which the broker logs nothing.
    for prefix in ["kafka_2.13-", "kafka-clients-", "log4j-slf4j-impl-"] {
        if !names
            .iter()
            .any(|n| n.starts_with(prefix) && n.ends_with(".jar"))
        {
            return Err(format!(
                "{} has no {prefix}*.jar: {INSTALL_HINT}",
                libs.display()
            ));
        }
    }
    Ok(())
}

impl Jvm {
    /// `java` with the common flags, the logging config and the Kafka jars on the class path,
    /// ready for a main class or a source file and its arguments. `heap` is `(-Xms, -Xmx)`.
    pub fn command(&self, heap: (&str, &str)) -> Command {
        let mut cmd = Command::new(&self.java);
        cmd.arg(format!("-Xms{}", heap.0))
            .arg(format!("-Xmx{}", heap.1))
            .args(JVM_FLAGS)
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                repo_root().join("tests/java/log4j2.properties").display()
            ))
            // The java launcher expands `DIR/*` to every jar in DIR itself; no shell involved.
            .arg("-cp")
            .arg(self.libs.join("*"))
            // A developer's shell must not change the JVMs the tests measure and kill.
            .env_remove("JAVA_TOOL_OPTIONS")
            .env_remove("JDK_JAVA_OPTIONS")
            .env_remove("_JAVA_OPTIONS")
            .env_remove("CLASSPATH");
        cmd
    }

    /// A single-file program under `tests/java`, run by the JDK's source launcher.
    pub fn source_command(&self, file: &str) -> Command {
        let mut cmd = self.command(("16m", "256m"));
        cmd.arg(repo_root().join("tests/java").join(file));
        cmd
    }
}

/// A process's resident set size in KiB (`VmRSS`), while it runs.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// A fresh log file under `target/tmp/<kind>-logs/`, kept after the test for a reader.
pub(crate) fn new_log_path(kind: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{kind}-logs"));
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir.join(format!("{}.log", super::unique_group(kind)))
}

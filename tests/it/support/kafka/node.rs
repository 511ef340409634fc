//! One Apache Kafka node: a JVM that is both broker and KRaft controller.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::cluster::KafkaOptions;
use super::jvm;
use crate::support::lifeline::{self, Output, Supervised};
use crate::support::log_tail;

/// Heap of a broker JVM. The floor avoids heap growth pauses during start-up; the ceiling bounds
/// what three nodes plus the test processes may take on a small machine.
const BROKER_HEAP: (&str, &str) = ("128m", "512m");
/// Bound on `kafka.tools.StorageTool format` (a JVM that writes two small files).
const FORMAT_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on reaping a killed JVM.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// One node of a [`super::KafkaCluster`]: `node.id`, its two loopback ports, its directory
/// (`server.properties`, `data/`, `kafka.log`) and, while it runs, its JVM.
pub struct KafkaNode {
    id: i32,
    port: u16,
    controller_port: u16,
    /// Extra listeners: (name, security protocol, port).
    listeners: Vec<(String, String, u16)>,
    /// Extra JVM arguments (`-Dkey=value`).
    jvm_args: Vec<String>,
    dir: PathBuf,
    process: Option<Supervised>,
    /// SIGSTOPped and not yet continued: alive, but answers nothing.
    paused: bool,
    /// When the current JVM was spawned, and how long it took to answer FindCoordinator.
    started_at: Option<Instant>,
    ready_after: Option<Duration>,
}

impl KafkaNode {
    pub(super) fn new(id: i32, port: u16, controller_port: u16, dir: PathBuf) -> KafkaNode {
        KafkaNode {
            id,
            port,
            controller_port,
            listeners: Vec::new(),
            jvm_args: Vec::new(),
            dir,
            process: None,
            paused: false,
            started_at: None,
            ready_after: None,
        }
    }

    pub(super) fn with_jvm_args(mut self, args: Vec<String>) -> KafkaNode {
        self.jvm_args = args;
        self
    }

    pub(super) fn with_listeners(mut self, listeners: Vec<(String, String, u16)>) -> KafkaNode {
        self.listeners = listeners;
        self
    }

    /// `127.0.0.1:PORT` of the extra listener `name` (see [`KafkaOptions::listener`]).
    ///
    /// # Panics
    /// When the node has no such listener.
    pub fn listener_addr(&self, name: &str) -> String {
        let (_, _, port) = self
            .listeners
            .iter()
            .find(|(n, _, _)| n == name)
            .unwrap_or_else(|| panic!("node {} has no listener {name}", self.id));
        format!("127.0.0.1:{port}")
    }

    /// `node.id`, as FindCoordinator and Metadata name it.
    pub fn id(&self) -> i32 {
        self.id
    }

    /// The client listener's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The KRaft controller listener's port.
    pub fn controller_port(&self) -> u16 {
        self.controller_port
    }

    /// `127.0.0.1:PORT` of the client listener.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The JVM's pid while it runs (paused included).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.pid())
    }

    /// Running and not paused: it can answer requests.
    pub fn is_live(&self) -> bool {
        self.process.is_some() && !self.paused
    }

    /// The broker's log (stdout and stderr: log4j at WARN, JVM errors), kept across restarts.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("kafka.log")
    }

    /// How long the current JVM took from spawn to answering FindCoordinator with no error.
    pub fn startup_time(&self) -> Option<Duration> {
        self.ready_after
    }

    /// The JVM's resident set size in KiB (`VmRSS`), while it runs.
    pub fn rss_kib(&self) -> Option<u64> {
        super::rss_kib(self.pid()?)
    }

    /// The last lines of the broker's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        format!(
            "--- node {} (port {}), last lines of {} ---\n{}\n--- end of log ---",
            self.id,
            self.port,
            self.log_path().display(),
            log_tail(&self.log_path(), lines)
        )
    }

    fn config_path(&self) -> PathBuf {
        self.dir.join("server.properties")
    }

    /// Writes `server.properties`: every node is broker and controller, `voters` is the whole
    /// quorum (`id@127.0.0.1:port,...`), `nodes` the cluster's size.
    pub(super) fn write_config(&self, voters: &str, nodes: usize, options: &KafkaOptions) {
        std::fs::create_dir_all(self.dir.join("data"))
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", self.dir.display()));
        let mut props = String::new();
        let mut set = |key: &str, value: &dyn std::fmt::Display| {
            let _ = writeln!(props, "{key}={value}");
        };
        set("process.roles", &"broker,controller");
        set("node.id", &self.id);
        set("controller.quorum.voters", &voters);
        let extra = |f: &dyn Fn(&(String, String, u16)) -> String| -> String {
            self.listeners
                .iter()
                .map(|l| format!(",{}", f(l)))
                .collect()
        };
        set(
            "listeners",
            &format!(
                "PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}{}",
                self.port,
                self.controller_port,
                extra(&|(name, _, port)| format!("{name}://127.0.0.1:{port}"))
            ),
        );
        set(
            "advertised.listeners",
            &format!(
                "{}{}",
                self.addr_url(),
                extra(&|(name, _, port)| format!("{name}://127.0.0.1:{port}"))
            ),
        );
        set("controller.listener.names", &"CONTROLLER");
        set("inter.broker.listener.name", &"PLAINTEXT");
        set(
            "listener.security.protocol.map",
            &format!(
                "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT{}",
                extra(&|(name, protocol, _)| format!("{name}:{protocol}"))
            ),
        );
        set("log.dirs", &self.dir.join("data").display());
        for (key, value) in options.properties(nodes) {
            set(&key, &value);
        }
        std::fs::write(self.config_path(), props)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", self.config_path().display()));
    }

    fn addr_url(&self) -> String {
        format!("PLAINTEXT://127.0.0.1:{}", self.port)
    }

    /// Formats the data directory for `cluster_id`: KRaft refuses to start on an unformatted
    /// one. With a static `controller.quorum.voters` no `--standalone` flag is needed.
    pub(super) fn format(&self, cluster_id: &str, scram: &[String]) -> Result<(), String> {
        let mut cmd = jvm().command(("32m", "256m"));
        cmd.args([
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            cluster_id,
        ])
        .arg("--config")
        .arg(self.config_path())
        .arg("--ignore-formatted");
        for spec in scram {
            cmd.arg("--add-scram").arg(spec);
        }
        let log = self.dir.join("format.log");
        match lifeline::run_to_end(&cmd, &log, FORMAT_TIMEOUT)? {
            (status, _) if status.success() => Ok(()),
            (status, output) => Err(format!(
                "formatting node {} failed ({status}):\n{output}",
                self.id
            )),
        }
    }

    /// Starts the JVM; [`super::KafkaCluster`] waits until it is ready.
    pub(super) fn launch(&mut self) -> Result<(), String> {
        assert!(
            self.process.is_none(),
            "node {} is already running",
            self.id
        );
        let mut cmd = jvm().command(BROKER_HEAP);
        cmd.args(&self.jvm_args)
            .arg("kafka.Kafka")
            .arg(self.config_path());
        let log = self.log_path();
        let started_at = Instant::now();
        let (process, _) = Supervised::spawn(&cmd, Output::Log(&log), None)?;
        self.process = Some(process);
        self.paused = false;
        self.started_at = Some(started_at);
        self.ready_after = None;
        Ok(())
    }

    /// Records that the JVM answered FindCoordinator.
    pub(super) fn mark_ready(&mut self) {
        self.ready_after = self.started_at.map(|t| t.elapsed());
    }

    /// The JVM's exit status if it has died by itself (it is then forgotten).
    pub(super) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.process.as_mut()?.exited()?;
        self.process = None;
        self.paused = false;
        Some(status)
    }

    /// Sends `signal` to the JVM.
    ///
    /// # Panics
    /// When the node does not run.
    pub(super) fn signal(&mut self, signal: i32) {
        let id = self.id;
        self.process
            .as_mut()
            .unwrap_or_else(|| panic!("node {id} does not run"))
            .signal(signal);
        match signal {
            libc::SIGSTOP => self.paused = true,
            libc::SIGCONT => self.paused = false,
            _ => {}
        }
    }

    /// SIGKILLs the JVM and reaps it. Idempotent.
    pub(super) fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop(STOP_TIMEOUT);
        }
        self.paused = false;
    }

    /// Waits up to `bound` for the JVM to exit by itself (after SIGTERM).
    pub(super) fn wait_exit(&mut self, bound: Duration) -> Option<std::process::ExitStatus> {
        let status = self.process.as_mut()?.wait_exit(bound)?;
        self.process = None;
        self.paused = false;
        Some(status)
    }

    /// Whether the log of the current run says the ports were taken (a race with another
    /// process between choosing a free port and binding it).
    pub(super) fn lost_port_race(&self) -> bool {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        log.contains("Address already in use")
    }
}

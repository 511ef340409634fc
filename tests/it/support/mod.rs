//! Shared support for the integration tests: a real broker (tansu) on a loopback port, unique
//! names, tracing, and the Python interpreter that drives librdkafka.
//!
//! The tests never skip: when tansu or the Python venv is missing they panic and say how to
//! install it (`scripts/install-test-deps.sh`), because CI must prove the work on a real broker.
//!
//! # One broker per test binary
//! [`broker()`] starts tansu once and shares it between every test of the binary; tests keep out
//! of each other's way by using [`unique_group`] and unique topic names. The shared broker is
//! never dropped, so it runs under [`lifeline::Supervised`], which kills it however this process
//! ends. `selftest::shared_broker_dies_with_sigkilled_test_process` proves it.
//!
//! Tests that must stop or restart a broker use [`TestBroker::start_private`], which is stopped
//! on drop.
//!
//! Apache Kafka itself (single node and three-node cluster), its admin tools and the seed
//! design's Java lock peer live in [`kafka`].

#![allow(dead_code)] // each test module uses a different subset of these helpers

pub mod brokers;
pub mod holds;
pub mod kafka;
pub mod lifeline;
mod selftest;

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Environment variable naming the tansu binary to use instead of `.tools/bin/tansu`.
pub const TANSU_ENV: &str = "KAFKA_LOCK_TANSU";
/// Environment variable naming the Python interpreter to use instead of `.tools/venv/bin/python`.
pub const PYTHON_ENV: &str = "KAFKA_LOCK_PYTHON";
/// Environment variable holding the `RUST_LOG`-style filter for tansu's own log (default `warn`).
pub const TANSU_LOG_ENV: &str = "KAFKA_LOCK_TANSU_LOG";

/// How long a broker may take to accept connections and answer ApiVersions. tansu is usually
/// ready in a few milliseconds; the bound only matters on a badly overloaded machine.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long stopping a broker may take before it is reported as stuck.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts with a fresh port when another process takes the chosen port first.
const START_ATTEMPTS: usize = 3;

const INSTALL_HINT: &str = "run `scripts/install-test-deps.sh` from the repository root \
     (it installs the pinned tansu build into .tools/bin/tansu and a Python venv into .tools/venv)";

/// The repository root (where Cargo.toml is).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The tansu binary: `$KAFKA_LOCK_TANSU`, else `<repo>/.tools/bin/tansu`, else `tansu` on PATH.
///
/// # Panics
/// When none of them exists, with instructions to install it.
/// tests/it/slow_spawn.c (a preloaded shim that holds back or fails kafka-lock's start of its
/// supervisor) built into `dir`, once. Without a C compiler the caller fails and says how to get
/// one: the tests never skip.
pub fn slow_spawn_shim(dir: &Path) -> PathBuf {
    let shim = dir.join("slow_spawn.so");
    if shim.exists() {
        return shim;
    }
    let source = repo_root().join("tests/it/slow_spawn.c");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&shim)
        .arg(&source)
        .arg("-ldl")
        .status();
    match built {
        Ok(s) if s.success() => shim,
        Ok(s) => panic!("cc could not build {} ({s})", source.display()),
        Err(e) => panic!(
            "no C compiler (`cc`: {e}) to build the test shim that slows kafka-lock's start of \
             its supervisor; install one (Debian: apt-get install gcc)"
        ),
    }
}

pub fn tansu_path() -> PathBuf {
    find_tansu(
        std::env::var_os(TANSU_ENV),
        &repo_root().join(".tools/bin/tansu"),
        std::env::var_os("PATH"),
    )
    .unwrap_or_else(|message| panic!("{message}"))
}

/// The lookup behind [`tansu_path`], with its inputs passed in so it can be tested without
/// touching the process environment.
fn find_tansu(
    from_env: Option<std::ffi::OsString>,
    local: &Path,
    path: Option<std::ffi::OsString>,
) -> Result<PathBuf, String> {
    if let Some(p) = from_env {
        let p = PathBuf::from(p);
        if is_executable(&p) {
            return Ok(p);
        }
        return Err(format!(
            "{TANSU_ENV}={} is not an executable file; unset it or point it at a tansu binary, or {INSTALL_HINT}",
            p.display()
        ));
    }
    if is_executable(local) {
        return Ok(local.to_path_buf());
    }
    for dir in path.iter().flat_map(std::env::split_paths) {
        let candidate = dir.join("tansu");
        if is_executable(&candidate) {
            return Ok(candidate);
        }
    }
    Err(format!(
        "the test broker tansu was not found ({TANSU_ENV} unset, no {}, no tansu on PATH): {INSTALL_HINT}",
        local.display()
    ))
}

/// The Python interpreter of the test venv (with confluent-kafka): `$KAFKA_LOCK_PYTHON`, else
/// `<repo>/.tools/venv/bin/python`.
///
/// # Panics
/// When it does not exist, with instructions to install it.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os(PYTHON_ENV) {
        let p = PathBuf::from(p);
        assert!(
            is_executable(&p),
            "{PYTHON_ENV}={} is not an executable file; unset it, or {INSTALL_HINT}",
            p.display()
        );
        return p;
    }
    let venv = repo_root().join(".tools/venv/bin/python");
    assert!(
        is_executable(&venv),
        "the test Python venv was not found at {}: {INSTALL_HINT}",
        venv.display()
    );
    venv
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The broker shared by every test in this binary, started on first use.
///
/// # Panics
/// When tansu is missing or does not become ready.
pub fn broker() -> &'static TestBroker {
    static SHARED: OnceLock<TestBroker> = OnceLock::new();
    SHARED.get_or_init(TestBroker::start_private)
}

/// A tansu broker with in-memory storage on a loopback port.
///
/// Owned brokers (from [`TestBroker::start_private`]) are killed when dropped; the shared one
/// from [`broker()`] lives until the test process exits.
pub struct TestBroker {
    port: u16,
    /// The port tansu names in Metadata and FindCoordinator answers, if not `port` (a proxy in
    /// front of it, see [`TestBroker::start_private_advertising`]).
    advertised_port: Option<u16>,
    log_path: PathBuf,
    running: Option<lifeline::Supervised>,
}

impl TestBroker {
    /// Starts a broker of its own on a free loopback port, for tests that stop or restart it.
    /// It is killed when the value is dropped (and when the test process exits, however it
    /// exits).
    ///
    /// # Panics
    /// When tansu is missing or does not become ready within 30 s; the message carries the end
    /// of tansu's log.
    pub fn start_private() -> TestBroker {
        Self::start_private_with(None)
    }

    /// Like [`TestBroker::start_private`], but tansu advertises `127.0.0.1:advertised_port`
    /// instead of its own port, so clients reach the coordinator through whatever listens there
    /// (a test proxy that can cut them off).
    pub fn start_private_advertising(advertised_port: u16) -> TestBroker {
        Self::start_private_with(Some(advertised_port))
    }

    fn start_private_with(advertised_port: Option<u16>) -> TestBroker {
        let tansu = tansu_path();
        let mut last_failure = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port();
            let log_path = new_log_path(port);
            let mut broker = TestBroker {
                port,
                advertised_port,
                log_path,
                running: None,
            };
            match broker.launch(&tansu) {
                Ok(()) => return broker,
                // Another process may have taken the port between our probe and tansu's bind:
                // try a fresh one. Anything else is reported after the last attempt.
                Err(failure) => last_failure = failure,
            }
        }
        panic!("{last_failure}");
    }

    /// `127.0.0.1:PORT`, for a client's bootstrap list.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The loopback socket address the broker listens on.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The port the broker listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Where tansu's stdout and stderr go.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The tansu process id while it runs.
    pub fn tansu_pid(&self) -> Option<u32> {
        self.running.as_ref().map(|r| r.pid())
    }

    /// Kills the broker and waits until the process is gone. With memory storage every topic,
    /// group and offset is lost. Idempotent.
    ///
    /// # Panics
    /// When the process does not exit within 10 s.
    pub fn stop(&mut self) {
        if let Some(mut tansu) = self.running.take() {
            tansu.stop(STOP_TIMEOUT);
        }
    }

    /// Stops the broker and starts a fresh one on the same port: a cluster that lost every
    /// topic, group and offset, reachable at the same bootstrap address.
    ///
    /// # Panics
    /// When the new broker does not become ready.
    pub fn restart(&mut self) {
        self.stop();
        let tansu = tansu_path();
        if let Err(failure) = self.launch(&tansu) {
            panic!("{failure}");
        }
    }

    /// Starts tansu on `self.port` and waits until it answers ApiVersions.
    fn launch(&mut self, tansu: &Path) -> Result<(), String> {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let advertised = format!(
            "tcp://127.0.0.1:{}",
            self.advertised_port.unwrap_or(self.port)
        );
        let filter = std::env::var(TANSU_LOG_ENV).unwrap_or_else(|_| "warn".to_owned());
        let mut cmd = Command::new(tansu);
        cmd.args(["broker", "--listener-url", &url])
            .args(["--advertised-listener-url", &advertised])
            .args(["--storage-engine", "memory://tansu/"])
            // tansu reads its settings from these too; a developer's shell must not redirect
            // the test broker elsewhere.
            .env_remove("CLUSTER_ID")
            .env_remove("LISTENER_URL")
            .env_remove("ADVERTISED_LISTENER_URL")
            .env_remove("STORAGE_ENGINE")
            .env_remove("SCHEMA_REGISTRY")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env("RUST_LOG", filter);
        // A restarted broker appends to the same log.
        let (mut tansu, _) =
            lifeline::Supervised::spawn(&cmd, lifeline::Output::Log(&self.log_path), None)
                .map_err(|e| self.failure(&e))?;

        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = tansu.exited() {
                return Err(
                    self.failure(&format!("tansu exited with {status} before it was ready"))
                );
            }
            let Err(last_probe) = probe_api_versions(self.addr()) else {
                self.running = Some(tansu);
                return Ok(());
            };
            if Instant::now() >= deadline {
                tansu.stop(STOP_TIMEOUT);
                return Err(self.failure(&format!(
                    "tansu did not answer ApiVersions on {} within {READY_TIMEOUT:?} (last attempt: {last_probe})",
                    self.bootstrap()
                )));
            }
            // Polling for readiness: tansu offers no other signal that it is listening.
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn failure(&self, what: &str) -> String {
        format!(
            "{what}\n--- last lines of {} ---\n{}\n--- end of log ---\nIf tansu is missing or broken, {INSTALL_HINT}.",
            self.log_path.display(),
            log_tail(&self.log_path, 40)
        )
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        // Supervised's own drop kills and reaps tansu without panicking, which matters while a
        // test unwinds; a clean drop stops it through `stop` to report a stuck process.
        if !std::thread::panicking() {
            self.stop();
        }
    }
}

/// Binds port 0 on loopback to let the kernel pick a free port. The port is released before
/// tansu binds it, so another process can win the race; `start_private` retries then.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("cannot bind a loopback port: {e}"))
}

fn new_log_path(port: u16) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tansu-logs");
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir.join(format!("{}.log", unique_group(&format!("tansu-{port}"))))
}

/// The last `lines` lines of a log file, for failure messages.
pub fn log_tail(log: &Path, lines: usize) -> String {
    match fs::read(log) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read the log: {e})"),
    }
}

/// Whether a process with this pid still runs (a zombie counts as gone).
pub fn pid_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name, which may itself contain spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Sends a hand-built ApiVersions v0 request and checks the answer, independently of the
/// library under test, so a broken codec cannot make the broker look down (or up).
fn probe_api_versions(addr: SocketAddr) -> Result<(), String> {
    const CORRELATION_ID: i32 = 0x6b6c_0001;
    let io = |e: std::io::Error| e.to_string();
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).map_err(io)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(io)?;
    stream
        .set_write_timeout(Some(Duration::from_secs(5)))
        .map_err(io)?;
    let client_id = b"kafka-lock-tests";
    let mut req = Vec::new();
    req.extend_from_slice(&18i16.to_be_bytes()); // ApiVersions
    req.extend_from_slice(&0i16.to_be_bytes());
    req.extend_from_slice(&CORRELATION_ID.to_be_bytes());
    req.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    req.extend_from_slice(client_id);
    let mut frame = (req.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&req);
    stream.write_all(&frame).map_err(io)?;

    let mut len = [0u8; 4];
    stream.read_exact(&mut len).map_err(io)?;
    let len = i32::from_be_bytes(len);
    if !(6..=1 << 20).contains(&len) {
        return Err(format!("implausible response length {len}"));
    }
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body).map_err(io)?;
    let correlation = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
    let error_code = i16::from_be_bytes([body[4], body[5]]);
    if correlation != CORRELATION_ID {
        return Err(format!(
            "correlation id {correlation}, expected {CORRELATION_ID}"
        ));
    }
    if error_code != 0 {
        return Err(format!("ApiVersions error code {error_code}"));
    }
    Ok(())
}

/// Now on CLOCK_MONOTONIC, in nanoseconds: the clock the lock's events, the Python peer and the
/// Java peer (`System.nanoTime` on Linux) all stamp with, so their timestamps compare directly.
pub fn mono_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_MONOTONIC always exists on Linux.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0);
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// A name no other test (in this or any concurrent test process) uses:
/// `<prefix>-<pid>-<counter>-<nanos>`. Use it for group ids and topic names on the shared broker.
pub fn unique_group(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{n}-{nanos}", std::process::id())
}

/// Creates a topic through tansu's own CLI (`tansu topic create`), independently of the library
/// under test.
///
/// # Panics
/// When the topic cannot be created (including when it already exists); the message carries
/// tansu's output.
pub fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    let out = Command::new(tansu_path())
        .args(["topic", "create", name])
        .args(["--broker", &format!("tcp://{bootstrap}")])
        .args(["--partitions", &partitions.to_string()])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run tansu topic create: {e}"));
    assert!(
        out.status.success(),
        "`tansu topic create {name} --partitions {partitions}` against {bootstrap} failed with {}:\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Installs a tracing subscriber that writes through the test harness (so output shows only for
/// failing tests, or with `--nocapture`), filtered by `RUST_LOG` (default: `warn`). Safe to call
/// from every test.
pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    // A second call finds the subscriber already set; that is the intended no-op.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// A child process that is killed (SIGKILL) and reaped when dropped, so a failing test leaves
/// nothing running. Dereferences to the [`Child`].
pub struct ChildGuard(Option<Child>);

impl ChildGuard {
    /// Takes ownership of a spawned child.
    pub fn new(child: Child) -> Self {
        ChildGuard(Some(child))
    }

    /// Hands the child back without killing it.
    pub fn into_inner(mut self) -> Child {
        self.0.take().expect("child present until dropped")
    }
}

impl std::ops::Deref for ChildGuard {
    type Target = Child;
    fn deref(&self) -> &Child {
        self.0.as_ref().expect("child present until dropped")
    }
}

impl std::ops::DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Child {
        self.0.as_mut().expect("child present until dropped")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

//! Tests of the test support itself: the broker starts, stops, restarts, and cannot outlive the
//! test process.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// Set in the child process of `shared_broker_dies_with_sigkilled_test_process`.
const HOLD_ENV: &str = "KAFKA_LOCK_SELFTEST_HOLD";

/// Waits up to `bound` for `cond`, polling: process exit has no portable notification for a
/// process that is not our child.
pub(super) fn wait_until(bound: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(super) fn refuses_connections(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(1)).is_err()
}

#[test]
fn shared_broker_answers_and_is_shared() {
    let a = broker();
    let b = broker();
    assert!(std::ptr::eq(a, b), "broker() must return one shared broker");
    assert_eq!(a.bootstrap(), format!("127.0.0.1:{}", a.port()));
    probe_api_versions(a.addr()).expect("shared broker answers ApiVersions");
    let pid = a.tansu_pid().expect("shared broker runs");
    assert!(pid_alive(pid));
}

#[test]
fn create_topic_creates_it_once() {
    let bootstrap = broker().bootstrap();
    let topic = unique_group("selftest-topic");
    create_topic(&bootstrap, &topic, 1);
    let out = Command::new(tansu_path())
        .args(["topic", "list", "--broker", &format!("tcp://{bootstrap}")])
        .output()
        .expect("tansu topic list runs");
    assert!(out.status.success());
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        listing.contains(&format!("\"name\":\"{topic}\"")),
        "{topic} missing from {listing}"
    );
    let again = std::panic::catch_unwind(|| create_topic(&bootstrap, &topic, 1));
    assert!(again.is_err(), "creating an existing topic must fail");
}

#[test]
fn private_broker_is_killed_on_drop() {
    let broker = TestBroker::start_private();
    let (port, pid) = (broker.port(), broker.tansu_pid().expect("running"));
    assert_ne!(port, super::broker().port());
    probe_api_versions(broker.addr()).expect("private broker answers");
    drop(broker);
    // stop() reaps the wrapper, which has already reaped tansu: both are gone at this point.
    assert!(!pid_alive(pid), "tansu pid {pid} survived drop");
    assert!(
        refuses_connections(port),
        "port {port} still accepts connections"
    );
}

#[test]
fn private_broker_restarts_on_the_same_port_empty() {
    let mut broker = TestBroker::start_private();
    let port = broker.port();
    let old_pid = broker.tansu_pid().expect("running");
    let topic = unique_group("selftest-restart");
    create_topic(&broker.bootstrap(), &topic, 1);
    broker.restart();
    assert_eq!(broker.port(), port);
    let new_pid = broker.tansu_pid().expect("running again");
    assert_ne!(new_pid, old_pid);
    assert!(!pid_alive(old_pid));
    probe_api_versions(broker.addr()).expect("restarted broker answers");
    // memory:// storage starts empty, so the same topic can be created again.
    create_topic(&broker.bootstrap(), &topic, 1);
    broker.stop();
    broker.stop();
    assert!(!pid_alive(new_pid));
}

#[test]
fn shared_broker_dies_with_sigkilled_test_process() {
    let (mut child, fields) = spawn_holder("support::selftest::hold_shared_broker", HOLD_ENV);
    let (port, pid): (u16, u32) = match fields[..] {
        [ref port, ref pid, ..] => (port.parse().unwrap(), pid.parse().unwrap()),
        _ => panic!("bad HOLDING line {fields:?}"),
    };
    assert!(pid_alive(pid));
    probe_api_versions(([127, 0, 0, 1], port).into()).expect("the child's broker answers");

    child.kill().expect("SIGKILL the child test process");
    child.wait().expect("reap the child test process");

    assert!(
        wait_until(Duration::from_secs(10), || !pid_alive(pid)),
        "tansu pid {pid} outlived its SIGKILLed test process"
    );
    assert!(
        wait_until(Duration::from_secs(10), || refuses_connections(port)),
        "port {port} still accepts connections"
    );
}

/// Runs the ignored test `test` of this binary in a child process with `env=1`, and returns the
/// child and the whitespace-separated fields it printed after `HOLDING ` once it holds what it
/// was asked to start. The child blocks until killed.
pub(super) fn spawn_holder(test: &str, env: &str) -> (ChildGuard, Vec<String>) {
    let exe = std::env::current_exe().expect("test binary path");
    let child = Command::new(exe)
        .args([
            test,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(env, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("re-run this test binary");
    let mut child = ChildGuard::new(child);
    let stdout = child.stdout.take().expect("piped");
    // Read on a thread so a child that never reports fails this test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut transcript = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest prints the test name on the same line, so the marker is not at the start.
            if let Some((_, rest)) = line.split_once("HOLDING ") {
                let _ = tx.send(Ok(rest.split_whitespace().map(str::to_owned).collect()));
                return;
            }
            transcript.push_str(&line);
            transcript.push('\n');
        }
        let _ = tx.send(Err(transcript));
    });
    // Generous: the child may have to start a JVM broker on a busy machine.
    match rx.recv_timeout(Duration::from_secs(240)) {
        Ok(Ok(fields)) => (child, fields),
        Ok(Err(transcript)) => panic!(
            "the child test process ended its output without reporting (exit: {:?}); its \
             stdout:\n{transcript}",
            child.wait()
        ),
        Err(e) => panic!("no report from the child test process within 240 s ({e})"),
    }
}

/// The child half of `shared_broker_dies_with_sigkilled_test_process`: ignored because it only
/// means something when that test runs it (with `KAFKA_LOCK_SELFTEST_HOLD=1`) and kills it.
#[test]
#[ignore = "run by shared_broker_dies_with_sigkilled_test_process in a child process"]
fn hold_shared_broker() {
    if std::env::var_os(HOLD_ENV).is_none() {
        return;
    }
    let b = broker();
    println!("HOLDING {} {}", b.port(), b.tansu_pid().expect("running"));
    // Block until the parent kills us (or, if the parent dies first, until stdin closes).
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
}

#[test]
fn missing_tansu_names_the_install_script() {
    let nowhere = Path::new("/nonexistent/kafka-lock/tansu");
    let err = find_tansu(None, nowhere, Some("/nonexistent/bin".into())).unwrap_err();
    assert!(err.contains("scripts/install-test-deps.sh"), "{err}");
    let err = find_tansu(Some(nowhere.into()), nowhere, None).unwrap_err();
    assert!(
        err.contains(TANSU_ENV) && err.contains("scripts/install-test-deps.sh"),
        "{err}"
    );
}

#[test]
fn unique_group_is_unique_and_prefixed() {
    let names: std::collections::HashSet<String> =
        (0..1000).map(|_| unique_group("lock")).collect();
    assert_eq!(names.len(), 1000);
    assert!(names
        .iter()
        .all(|n| n.starts_with(&format!("lock-{}-", std::process::id()))));
}

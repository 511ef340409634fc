//! A holder *process* killed with SIGKILL: no LeaveGroup, no goodbye. Another contender gets the
//! lock once the broker has expired the dead member, roughly a session timeout later, and never
//! before the dead holder's session could have run out at the broker (so never before its lease
//! could have run out either: the lease is shorter than the session).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kafka_lock::LockOptions;

use crate::support::{self, ChildGuard};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_holder_is_replaced_after_the_session_timeout() {
    support::init_tracing();
    let group = support::unique_group("sigkill");
    let session = Duration::from_secs(6);
    let heartbeat = Duration::from_millis(500);
    let dir = TempDir::new();
    let pidfile = dir.0.join("child.pid");
    // setpriv ties kafka-lock to this test's thread (PR_SET_PDEATHSIG): it dies with the test
    // process however that ends, and its supervisor then stops the command.
    let mut holder = ChildGuard::new(
        Command::new("setpriv")
            .args([
                "--pdeathsig",
                "KILL",
                "--",
                env!("CARGO_BIN_EXE_kafka-lock"),
            ])
            .args([
                "run",
                "--bootstrap",
                &support::kafka::kafka().bootstrap(),
                "--lock",
                &group,
            ])
            .args([
                "--session-timeout",
                "6s",
                "--rebalance-timeout",
                "6s",
                "--heartbeat-interval",
                "500ms",
            ])
            .args(["--events", "json", "--label", "doomed"])
            .arg("--")
            .args([
                "sh",
                "-c",
                &format!("echo $$ > {}; exec sleep 600", pidfile.display()),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kafka-lock run"),
    );
    // Wait until the holder process says it holds the lock.
    let stderr = holder.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let token_line = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(40))
            .expect("the holder process acquires");
        if line.contains("\"event\":\"acquired\"") || line.contains("\"event\": \"acquired\"") {
            break line;
        }
    };
    // The child runs in its own process group; it must not outlive the test either.
    let child_pid = wait_for_pidfile(&pidfile);
    let _child = KillGroup(child_pid);

    let waiter = tokio::spawn({
        let o = LockOptions::new(support::kafka::kafka().bootstrap(), &group)
            .session_timeout(session)
            .rebalance_timeout(session)
            .heartbeat_interval(Duration::from_millis(500));
        async move { o.acquire(Some(Duration::from_secs(90))).await }
    });
    // Let the waiter join and queue behind the holder before the crash.
    wait_for_members(&group, 2).await;

    holder.kill().expect("SIGKILL the holder");
    let killed = Instant::now();
    let _ = holder.wait();
    let guard = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("failover in time")
        .unwrap()
        .expect("acquired");
    let took = killed.elapsed();
    eprintln!("failover after SIGKILL took {took:?} (holder said: {token_line})");
    // The dead holder's last heartbeat was sent at most one interval before the kill, and the
    // broker re-armed its session timer when it arrived: it cannot expire the member, and so
    // hand the lock on, before `session - interval` after the kill.
    assert!(
        took >= session - heartbeat,
        "the lock moved {took:?} after the kill, before the dead holder's session could expire"
    );
    let old_token: i32 = json_field(&token_line, "token")
        .parse()
        .expect("token in the acquired event");
    assert!(guard.token().generation > old_token);
    guard.release().await.unwrap();
}

fn json_field<'a>(line: &'a str, key: &str) -> &'a str {
    let at = line
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("no {key} in {line}"));
    let rest = line[at + key.len() + 3..].trim_start();
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().trim_matches('"')
}

/// A directory removed when dropped, even when the test fails.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let dir = std::env::temp_dir().join(support::unique_group("kafka-lock-test"));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn wait_for_pidfile(path: &std::path::Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "the child never wrote its pid");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills a process group when dropped.
struct KillGroup(i32);

impl Drop for KillGroup {
    fn drop(&mut self) {
        // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(-self.0, libc::SIGKILL);
        }
    }
}

async fn wait_for_members(group: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(40);
    let bootstrap = support::kafka::kafka().bootstrap();
    loop {
        // Kafka's own Admin client, not the code under test, says who is in the group.
        let members = tokio::task::block_in_place(|| {
            support::kafka::admin::describe_group(&bootstrap, group)
                .map(|g| g.members.len())
                .unwrap_or(0)
        });
        if members >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "group {group} never reached {n} members"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

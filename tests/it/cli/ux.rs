//! What a user meets first: one meaning of "token" in every view, tries that do not disturb
//! the holder, interactive commands, quiet busy locks and setting errors that name the setting.

use super::*;
use crate::support::kafka::probe::{create_topic, create_topic_with};

/// `kafka-lock ARGS` run to its end (bounded), its status, stdout and stderr.
fn one_shot(args: &[&str]) -> (i32, String, String) {
    let (code, err, out) = run_to_end(args, STEP);
    (code, out, err.join("\n"))
}

/// With a ledger the fencing token (the ledger offset, which the command gets) and the
/// generation are different numbers. Every view calls the former "token" and the latter
/// "generation"; a view that read no ledger says it does not know the token. Breaks if any
/// of them printed the generation as the token again.
#[test]
fn token_means_the_fencing_token_in_every_view() {
    let broker = broker();
    let b = broker.bootstrap();
    let lock = lock_name("one-token");
    let ledger = lock_name("one-token-ledger");
    create_topic(&b, &ledger, 1);
    // A first hold moves the ledger on, so offset and generation differ however the group is.
    let mut first = run_cmd(&b, &lock, &["--ledger-topic", &ledger], &["true"]).spawn();
    assert_eq!(first.finish(STEP), 0, "{}", first.transcript());

    let mut extra = vec!["--label", "token holder", "--ledger-topic", &ledger];
    extra.extend(CONTENDED);
    let mut holder = run_cmd(&b, &lock, &extra, &sh("cat >/dev/null")).spawn();
    let acquired = holder.event("acquired", STEP);
    holder.event("child_started", STEP);
    let t = token(&acquired);
    let g = acquired["generation"].as_i64().expect("generation");
    assert_ne!(t, g, "the test needs two different numbers: {acquired}");

    let (code, out, err) = one_shot(&[
        "status",
        "--bootstrap",
        &b,
        "--lock",
        &lock,
        "--ledger-topic",
        &ledger,
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let s: Value = serde_json::from_str(out.trim()).expect(&out);
    assert_eq!(s["holder"]["token"], t, "{s}");
    assert_eq!(s["holder"]["generation"], g, "{s}");
    let (_, out, _) = one_shot(&[
        "status",
        "--bootstrap",
        &b,
        "--lock",
        &lock,
        "--ledger-topic",
        &ledger,
    ]);
    assert!(out.contains(&format!("generation {g}, token {t}")), "{out}");

    // Without the ledger, status cannot know the token: null, and said so in words.
    let (_, out, _) = one_shot(&["status", "--bootstrap", &b, "--lock", &lock, "--json"]);
    let s: Value = serde_json::from_str(out.trim()).expect(&out);
    assert_eq!(s["holder"]["token"], Value::Null, "{s}");
    assert_eq!(s["holder"]["generation"], g, "{s}");
    let (_, out, _) = one_shot(&["status", "--bootstrap", &b, "--lock", &lock]);
    assert!(
        out.contains(&format!("generation {g}, token unknown")),
        "{out}"
    );
    assert!(!out.contains(&format!("token {g}")), "{out}");

    // A waiter reads no ledger: its events and its words give the generation as such.
    let mut args = vec!["--wait", "1s", "--ledger-topic", &ledger];
    args.extend(CONTENDED);
    let mut waiter = run_cmd(&b, &lock, &args, &["true"]).spawn();
    assert_eq!(waiter.finish(STEP), 75, "{}", waiter.transcript());
    let waiting = waiter.named("waiting");
    let w = waiting.last().expect("a waiting event");
    // Its join moved the holder's generation on; the holder's token stays.
    let wg = w["holder"]["generation"]
        .as_i64()
        .expect("the holder's generation");
    assert!(wg >= g, "{w}");
    assert_eq!(w["holder"]["token"], Value::Null, "{w}");
    let line = waiter.failure_line();
    assert!(line.contains(&format!("generation {wg}")), "{line}");
    assert!(!line.contains(", token "), "{line}");

    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());
}

/// Probes of a held lock (`--wait 0`) answer busy from one DescribeGroups, without joining: the
/// holder sees no rebalance, however many probes come. Breaks (the holder gets a rebalance or
/// two per probe) if a probe joined the group before looking.
#[test]
fn a_try_on_a_held_lock_does_not_rebalance_the_holder() {
    const PROBES: usize = 3;
    let broker = broker();
    let b = broker.bootstrap();
    let lock = lock_name("probe");
    let (mut holder, acquired) = start_holder(&b, &lock, "probed holder");
    for _ in 0..PROBES {
        let mut args = vec!["--wait", "0"];
        args.extend(CONTENDED);
        let mut probe = run_cmd(&b, &lock, &args, &["true"]).spawn();
        assert_eq!(probe.finish(STEP), 75, "{}", probe.transcript());
        let line = probe.failure_line();
        assert!(line.contains("probed holder"), "names the holder: {line}");
        let waiting = probe.named("waiting");
        assert_eq!(
            waiting[0]["holder"]["member_id"],
            acquired["member_id"],
            "{}",
            probe.transcript()
        );
    }
    let s = status_json(&b, &lock);
    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());
    let rebalances = holder.named("token_changed").len();
    eprintln!(
        "holder: {rebalances} token_changed over {PROBES} probes; generation {} at the grant, \
         {} and {} after the probes",
        acquired["generation"], s["generation"], s["state"]
    );
    assert_eq!(rebalances, 0, "{}", holder.transcript());
    assert_eq!(s["state"], "Stable", "{s}");
    assert_eq!(s["generation"], acquired["generation"], "{s}");
}

/// SIGTERM to kafka-lock reaches the command; one that ignores it is killed --kill-grace
/// later, and the lock is released. Breaks (kafka-lock waits forever) without the escalation.
#[test]
fn sigterm_to_kafka_lock_kills_a_command_that_ignores_it_after_the_grace() {
    let broker = broker();
    // SIG_IGN survives exec, so the `sleep` children ignore SIGTERM too.
    let script = r#"exec 2>/dev/null; trap '' TERM; echo ready; while :; do sleep 1; done"#;
    let mut args = vec!["--kill-grace", "1s"];
    args.extend(QUICK);
    let mut run = run_cmd(
        &broker.bootstrap(),
        &lock_name("ignore-term"),
        &args,
        &sh(script),
    )
    .spawn();
    run.stdout_line("ready", STEP);
    let sent = mono_now();
    run.signal("TERM");
    let exited = run.event("child_exited", STEP);
    assert_eq!(exited["signal"], 9, "{exited}");
    assert!(
        mono(&exited, "mono_ns") >= sent + 1_000_000_000,
        "killed before the grace: {exited}"
    );
    assert_eq!(run.finish(STEP), 128 + 9, "{}", run.transcript());
    assert_eq!(run.named("released").len(), 1, "{}", run.transcript());
}

/// `-E 0` makes a busy lock a quiet success: status 0 and not a word on stderr (the events
/// still tell). Breaks if the "not acquired" line were printed.
#[test]
fn conflict_exit_code_zero_is_quiet() {
    let broker = broker();
    let b = broker.bootstrap();
    let lock = lock_name("quiet");
    let (mut holder, _) = start_holder(&b, &lock, "quiet holder");
    let dir = scratch_dir("cli-quiet");
    let marker = dir.join("ran");
    let touch = format!("touch {}", marker.display());
    let mut args = vec!["--wait", "0", "-E", "0"];
    args.extend(CONTENDED);
    let mut probe = run_cmd(&b, &lock, &args, &sh(&touch)).spawn();
    assert_eq!(probe.finish(STEP), 0, "{}", probe.transcript());
    assert!(probe.texts().is_empty(), "{}", probe.transcript());
    assert_eq!(
        probe.named("failed")[0]["status"],
        0,
        "{}",
        probe.transcript()
    );
    assert!(!marker.exists(), "the command ran on a held lock");
    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());
}

/// Runs `kafka-lock ARGS` on a new pseudo-terminal (Python's pty module: kafka-lock is the
/// session leader, in the terminal's foreground group, as under an interactive shell), types
/// `input` into it and returns everything the terminal showed and kafka-lock's status. The
/// Python side kills kafka-lock (whose supervisor then stops the command) if it has not ended
/// within `within`, and reports that as status -1.
fn on_a_terminal(args: &[&str], input: &str, within: Duration) -> (i32, String) {
    const DRIVER: &str = r#"
import os, pty, select, signal, sys, time
argv, data, within = sys.argv[2:], sys.argv[1].encode(), float(os.environ["PTY_WITHIN"])
pid, fd = pty.fork()
if pid == 0:
    os.execvp(argv[0], argv)
os.write(fd, data)
out, deadline, status = b"", time.monotonic() + within, None
while status is None:
    left = deadline - time.monotonic()
    if left <= 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        status = -1
        break
    r, _, _ = select.select([fd], [], [], min(left, 0.5))
    if r:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            chunk = b""
        out += chunk
    done, st = os.waitpid(pid, os.WNOHANG)
    if done:
        status = os.waitstatus_to_exitcode(st)
        try:
            while select.select([fd], [], [], 0.2)[0]:
                out += os.read(fd, 4096)
        except OSError:
            pass
sys.stdout.write(out.decode("utf-8", "replace"))
sys.stdout.write("\n[status %d]\n" % status)
"#;
    let mut cmd = Command::new("python3");
    cmd.args(["-c", DRIVER, input, BIN])
        .args(args)
        .env("PTY_WITHIN", within.as_secs_f64().to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    hermetic(&mut cmd);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 (needed for its pty module): {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let status = text
        .rsplit_once("[status ")
        .and_then(|(_, s)| s.trim().trim_end_matches(']').parse().ok())
        .unwrap_or_else(|| panic!("the pty driver said no status: {text}"));
    (status, text)
}

/// An interactive command reads the terminal kafka-lock was started on: its process group is
/// made the foreground group while it runs, and kafka-lock gets the terminal back afterwards.
/// Breaks (the command stops on SIGTTIN and kafka-lock waits for it forever) without the
/// hand-over.
#[test]
fn an_interactive_command_reads_the_terminal() {
    let broker = broker();
    let b = broker.bootstrap();
    let lock = lock_name("tty");
    let (status, text) = on_a_terminal(
        &[
            "run",
            "--bootstrap",
            &b,
            "--lock",
            &lock,
            "--session-timeout",
            "6s",
            "--",
            "sh",
            "-c",
            "read x; echo got $x",
        ],
        "hello\n",
        STEP,
    );
    assert_eq!(status, 0, "{text}");
    assert!(text.contains("got hello"), "{text}");
}

/// A ledger topic that does not exist, or has more than one partition, is a setting (78) with
/// advice about the topic, not an unavailable cluster (69). Breaks if the ledger's errors fell
/// back to 69.
#[test]
fn a_missing_or_partitioned_ledger_topic_exits_78_with_advice_about_the_topic() {
    let broker = broker();
    let b = broker.bootstrap();
    let lock = lock_name("ledger-setting");
    let missing = lock_name("no-such-ledger");
    let (code, _, err) = one_shot(&[
        "run",
        "--bootstrap",
        &b,
        "--lock",
        &lock,
        "--ledger-topic",
        &missing,
        "--",
        "true",
    ]);
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("does not exist"), "{err}");
    assert!(err.contains("kafka-topics.sh --create"), "{err}");
    assert!(
        err.contains("--replication-factor 1"),
        "single-broker variant: {err}"
    );
    assert!(!err.contains("--bootstrap"), "{err}");

    let three = lock_name("three-partition-ledger");
    create_topic(&b, &three, 3);
    let (code, _, err) = one_shot(&[
        "run",
        "--bootstrap",
        &b,
        "--lock",
        &lock,
        "--ledger-topic",
        &three,
        "--",
        "true",
    ]);
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("has 3 partitions"), "{err}");

    // A topic the broker recompresses (an administrator's compression.type=gzip).
    let gzip = lock_name("gzip-ledger");
    create_topic_with(&b, &gzip, 1, &[("compression.type", "gzip")]);
    let (code, _, err) = one_shot(&[
        "run",
        "--bootstrap",
        &b,
        "--lock",
        &lock,
        "--ledger-topic",
        &gzip,
        "--",
        "true",
    ]);
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("compression.type=gzip"), "{err}");
    assert!(
        err.contains(&format!(
            "kafka-configs.sh --alter --entity-type topics --entity-name {gzip} \
             --add-config compression.type=producer"
        )),
        "the fix: {err}"
    );
    assert!(!err.contains("--bootstrap"), "{err}");
}

/// Runs `kafka-lock ARGS` as a job of a small job-control shell on a new pseudo-terminal with
/// `stty tostop` set: the shell (the session leader) puts kafka-lock in a process group of its
/// own, gives it the terminal and waits for it as an interactive shell does (WUNTRACED), so a
/// SIGTTOU or SIGTTIN really stops kafka-lock (in the bare `on_a_terminal` kafka-lock's group is
/// orphaned, and the kernel fails the write with EIO instead). Returns the job's exit status, or
/// 200 + the signal that stopped it (the shell then kills it), or -1 if it ran past `within`.
fn as_a_job_with_tostop(args: &[&str], within: Duration) -> (i32, String) {
    const DRIVER: &str = r#"
import os, pty, select, signal, sys, termios, time
argv, within = sys.argv[1:], float(os.environ["PTY_WITHIN"])
pid, fd = pty.fork()
if pid == 0:
    attrs = termios.tcgetattr(0)
    attrs[3] |= termios.TOSTOP
    termios.tcsetattr(0, termios.TCSANOW, attrs)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    job = os.fork()
    if job == 0:
        os.setpgid(0, 0)
        os.tcsetpgrp(0, os.getpid())
        signal.signal(signal.SIGTTOU, signal.SIG_DFL)
        os.execvp(argv[0], argv)
    try:
        os.setpgid(job, job)
    except OSError:
        pass
    signal.signal(signal.SIGALRM, lambda *_: (os.killpg(job, signal.SIGKILL), os._exit(199)))
    signal.alarm(int(within))
    _, st = os.waitpid(job, os.WUNTRACED)
    if os.WIFSTOPPED(st):
        os.killpg(job, signal.SIGKILL)
        os.waitpid(job, 0)
        os._exit(200 + os.WSTOPSIG(st))
    os._exit(os.waitstatus_to_exitcode(st) & 255)
out, deadline, status = b"", time.monotonic() + within + 5, None
while status is None:
    left = deadline - time.monotonic()
    if left <= 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        status = -1
        break
    r, _, _ = select.select([fd], [], [], min(left, 0.5))
    if r:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            chunk = b""
        out += chunk
    done, st = os.waitpid(pid, os.WNOHANG)
    if done:
        status = os.waitstatus_to_exitcode(st)
        if status == 199:
            status = -1
sys.stdout.write(out.decode("utf-8", "replace"))
sys.stdout.write("\n[status %d]\n" % status)
"#;
    let mut cmd = Command::new("python3");
    cmd.args(["-c", DRIVER, BIN])
        .args(args)
        .env("PTY_WITHIN", within.as_secs_f64().to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    hermetic(&mut cmd);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 (needed for its pty module): {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let status = text
        .rsplit_once("[status ")
        .and_then(|(_, s)| s.trim().trim_end_matches(']').parse().ok())
        .unwrap_or_else(|| panic!("the pty driver said no status: {text}"));
    (status, text)
}

/// adversarial review: with `stty tostop`, a kafka-lock that has handed the terminal to its
/// command and then writes a line (here the `child_started` event, right after the hand-over)
/// must not be stopped by SIGTTOU: a stopped kafka-lock renews nothing, so the lock is lost
/// under a command that was doing fine, and the job sits stopped in the shell. Breaks (the job
/// stops with SIGTTOU, status 222) if kafka-lock takes the default action of SIGTTOU while in
/// the background of its own terminal.
#[test]
fn adversarial_review_tostop_does_not_stop_kafka_lock_behind_its_command() {
    let broker = broker();
    let b = broker.bootstrap();
    let lock = lock_name("tostop");
    let (status, text) = as_a_job_with_tostop(
        &[
            "run",
            "--bootstrap",
            &b,
            "--lock",
            &lock,
            "--session-timeout",
            "6s",
            "--events",
            "json",
            "--",
            "sh",
            "-c",
            "sleep 1; echo done",
        ],
        STEP,
    );
    assert_eq!(status, 0, "{text}");
    assert!(text.contains("done"), "{text}");
    assert!(text.contains("\"released\""), "{text}");
}

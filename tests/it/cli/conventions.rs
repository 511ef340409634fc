//! The CLI's conventions, through the built binary against the shared Apache Kafka broker (tansu
//! where a broker without member assignments is the point): every flag from its KAFKA_LOCK_*
//! variable, a nested run of a held lock refused, events in a file, a descriptor or a FIFO of
//! their own, the documented event schema (docs/events.md, which [`check_event`] applies to
//! every event of every CLI test), the final event naming whose exit status it is, `-E` and
//! `--lost-exit-code`, `status` exit codes, the Prometheus endpoint, completions and man pages.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

use kafka_lock::internals::wire::Response;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::{GroupId, LeaveGroupRequest};
use kafka_protocol::protocol::StrBytes;
use serde_json::{Map, Value};

use super::{
    broker, dead_port, hermetic, lock_name, run_cmd, run_to_end, run_to_end_env, scratch_dir, sh,
    start_holder, Run, Spec, BIN, CONTENDED, QUICK, STEP,
};
use crate::support;

/// The schema block of docs/events.md.
fn schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let path = support::repo_root().join("docs/events.md");
        let doc = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let block = doc
            .split("<!-- schema:begin -->")
            .nth(1)
            .and_then(|rest| rest.split("<!-- schema:end -->").next())
            .expect("docs/events.md has a schema block between its markers");
        let json = block
            .trim()
            .trim_start_matches("```json")
            .trim_end_matches("```");
        serde_json::from_str(json)
            .unwrap_or_else(|e| panic!("the schema block of docs/events.md is not JSON: {e}"))
    })
}

fn fields(v: &Value) -> &Map<String, Value> {
    v.as_object()
        .unwrap_or_else(|| panic!("docs/events.md: expected an object of fields, got {v}"))
}

fn has_type(v: &Value, types: &str) -> bool {
    types.split('|').any(|t| match t {
        "integer" => v.is_i64() || v.is_u64(),
        "string" => v.is_string(),
        "null" => v.is_null(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        other => panic!("docs/events.md: unknown type {other:?}"),
    })
}

/// Checks one event against docs/events.md: a documented event, every documented field with its
/// type, no field the document does not list, and only the values it lists where it lists them.
pub(crate) fn check_event(v: &Value) {
    let schema = schema();
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("an event is a JSON object: {v}"));
    let name = v["event"]
        .as_str()
        .unwrap_or_else(|| panic!("an event without a name: {v}"));
    let own = schema["events"]
        .get(name)
        .unwrap_or_else(|| panic!("event {name:?} is not in docs/events.md: {v}"));
    let mut listed = HashSet::new();
    for (group, required) in [
        (&schema["common"]["required"], true),
        (own, true),
        (&schema["common"]["optional"], false),
    ] {
        for (field, types) in fields(group) {
            listed.insert(field.as_str());
            let types = types.as_str().expect("a type is a string");
            match obj.get(field) {
                Some(x) => assert!(
                    has_type(x, types),
                    "{name}.{field} is not {types} as docs/events.md says: {v}"
                ),
                None => assert!(
                    !required,
                    "{name} lacks {field}, which docs/events.md lists: {v}"
                ),
            }
        }
    }
    for k in obj.keys() {
        assert!(
            listed.contains(k.as_str()),
            "{name} has {k:?}, which docs/events.md does not list: {v}"
        );
    }
    for (path, inner) in fields(&schema["objects"]) {
        let (event, field) = path.split_once('.').expect("objects are named event.field");
        if event != name {
            continue;
        }
        // An object, or an array of them.
        let items: Vec<&Value> = match &obj[field] {
            Value::Array(a) => a.iter().collect(),
            other => vec![other],
        };
        for o in items.into_iter().filter_map(Value::as_object) {
            let want: HashSet<&str> = fields(inner).keys().map(String::as_str).collect();
            let got: HashSet<&str> = o.keys().map(String::as_str).collect();
            assert_eq!(got, want, "{name}.{field} against docs/events.md: {v}");
            for (f, types) in fields(inner) {
                assert!(
                    has_type(&o[f], types.as_str().unwrap()),
                    "{name}.{field}.{f}: {v}"
                );
            }
        }
    }
    for (path, allowed) in fields(&schema["values"]) {
        let (event, field) = match path.split_once('.') {
            Some((e, f)) => (Some(e), f),
            None => (None, path.as_str()),
        };
        if event.is_some_and(|e| e != name) {
            continue;
        }
        let allowed = allowed.as_array().expect("values are a list");
        assert!(
            allowed.contains(&obj[field]),
            "{name}.{field} is {}, not one of {allowed:?} (docs/events.md): {v}",
            obj[field]
        );
    }
}

/// The events written to `path`, each checked against the schema.
fn events_in(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?} in {text}"));
            check_event(&v);
            v
        })
        .collect()
}

fn names(events: &[&Value]) -> Vec<String> {
    events
        .iter()
        .map(|v| v["event"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// The last event, which must be `exit`: (status, source).
fn exit_of(events: &[&Value]) -> (i64, String) {
    let last = events.last().expect("events");
    assert_eq!(
        last["event"], "exit",
        "the last event is not exit: {events:?}"
    );
    (
        last["status"].as_i64().expect("status"),
        last["source"].as_str().expect("source").to_owned(),
    )
}

/// The one `failed` event: (status, kind).
fn failed_of(events: &[&Value]) -> (i64, String) {
    let failed: Vec<&&Value> = events.iter().filter(|v| v["event"] == "failed").collect();
    assert_eq!(failed.len(), 1, "{events:?}");
    (
        failed[0]["status"].as_i64().expect("status"),
        failed[0]["kind"].as_str().expect("kind").to_owned(),
    )
}

/// The events among `run_to_end`'s stderr lines.
fn events_of(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(Value::is_object)
        .collect()
}

#[test]
fn every_setting_can_come_from_its_environment_variable() {
    let b = broker().bootstrap();
    let lock = lock_name("from-env");
    // Nothing on the command line but the command.
    let mut holder = Spec::new(&["run", "--", "sh", "-c", "cat >/dev/null"])
        .env("KAFKA_LOCK_BOOTSTRAP", &b)
        .env("KAFKA_LOCK_LOCK", &lock)
        .env("KAFKA_LOCK_LABEL", "set by the environment")
        .env("KAFKA_LOCK_EVENTS", "json")
        .env("KAFKA_LOCK_SESSION_TIMEOUT", "6s")
        .env("KAFKA_LOCK_HEARTBEAT_INTERVAL", "500ms")
        .spawn();
    holder.event("child_started", STEP);

    let base = [
        ("KAFKA_LOCK_BOOTSTRAP", b.as_str()),
        ("KAFKA_LOCK_LOCK", lock.as_str()),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut env = base.to_vec();
        env.extend_from_slice(extra);
        env
    };
    // A flag that takes no value: any of clap's true words, 1 included.
    let (code, stderr, out) = run_to_end_env(&["status"], &with(&[("KAFKA_LOCK_JSON", "1")]), STEP);
    assert_eq!(code, 0, "{stderr:?}");
    let s: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(s["lock"], lock.as_str(), "{s}");
    assert_eq!(s["holder"]["label"], "set by the environment", "{s}");

    // The command line wins over the variable.
    let (code, stderr, out) = run_to_end_env(
        &["status", "--lock", &lock],
        &[
            ("KAFKA_LOCK_BOOTSTRAP", &b),
            ("KAFKA_LOCK_LOCK", "not-this-lock"),
            ("KAFKA_LOCK_JSON", "true"),
        ],
        STEP,
    );
    assert_eq!(code, 0, "{stderr:?}");
    assert!(out.contains(&format!("\"lock\":\"{lock}\"")), "{out}");

    // An empty variable counts as unset: text, not JSON.
    let (code, stderr, out) = run_to_end_env(&["status"], &with(&[("KAFKA_LOCK_JSON", "")]), STEP);
    assert_eq!(code, 0, "{stderr:?}");
    assert!(out.starts_with(&format!("lock {lock:?}")), "{out}");
    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());

    // A variable is read, not ignored: a session timeout below the broker's 6 s minimum.
    let (code, stderr, _) = run_to_end_env(
        &["run", "--", "true"],
        &with(&[("KAFKA_LOCK_SESSION_TIMEOUT", "3s")]),
        STEP,
    );
    assert_eq!(code, 78, "{stderr:?}");
    assert!(stderr[0].contains("INVALID_SESSION_TIMEOUT"), "{stderr:?}");

    // A bad value names the variable it came from.
    let (code, stderr, _) = run_to_end_env(
        &["run", "--", "true"],
        &with(&[("KAFKA_LOCK_KILL_GRACE", "1h")]),
        STEP,
    );
    assert_eq!(code, 78, "{stderr:?}");
    assert!(stderr[0].contains("KAFKA_LOCK_KILL_GRACE"), "{stderr:?}");
    let (code, stderr, _) = run_to_end_env(
        &["run", "--", "true"],
        &with(&[("KAFKA_LOCK_WAIT", "soon")]),
        STEP,
    );
    assert_eq!(code, 64, "{stderr:?}");
    assert!(stderr[0].contains("KAFKA_LOCK_WAIT"), "{stderr:?}");

    // What kafka-lock sets for its command is no setting: KAFKA_LOCK_NAME names no lock.
    let (code, stderr, _) = run_to_end_env(
        &["run", "--", "true"],
        &[("KAFKA_LOCK_BOOTSTRAP", &b), ("KAFKA_LOCK_NAME", &lock)],
        STEP,
    );
    assert_eq!(code, 64, "{stderr:?}");
    assert!(stderr[0].contains("--lock"), "{stderr:?}");
}

/// Old code: the inner run joined the group its own command's holder held, and waited for
/// itself until --wait ran out (75; without --wait, forever).
#[test]
fn a_nested_run_of_the_lock_its_command_holds_is_refused() {
    let b = broker().bootstrap();
    let lock = lock_name("nested");
    let other = lock_name("nested-other");
    let script = format!(
        r#""$0" run --bootstrap {b} --lock {lock} --wait 5s -- true; echo "same $?"
"$0" run --bootstrap {b} --lock {other} -- echo inner-ran; echo "other $?""#
    );
    let mut run = run_cmd(&b, &lock, QUICK, &["sh", "-c", &script, BIN]).spawn();
    run.stdout_line("same 64", STEP);
    run.stdout_line("inner-ran", STEP);
    run.stdout_line("other 0", STEP);
    assert_eq!(run.finish(STEP), 0, "{}", run.transcript());
    assert!(
        run.texts().iter().any(|t| t.contains("wait for itself")),
        "{}",
        run.transcript()
    );
    assert_eq!(exit_of(&run.events()), (0, "command".into()));
}

#[test]
fn events_go_to_their_own_file_or_descriptor_never_into_the_commands_output() {
    let b = broker().bootstrap();
    let lock = lock_name("events-apart");
    let dir = scratch_dir("cli-events-apart");

    // A file: appended to, and stderr keeps only what the command wrote there.
    let file = dir.join("events.jsonl");
    let file_arg = file.to_str().expect("utf-8 path");
    for (i, script) in ["echo command-stdout; echo command-stderr >&2", "exit 75"]
        .into_iter()
        .enumerate()
    {
        let mut args = vec![
            "run",
            "--bootstrap",
            &b,
            "--lock",
            &lock,
            "--events-file",
            file_arg,
        ];
        args.extend(QUICK);
        args.extend(["--", "sh", "-c", script]);
        let mut run = Spec::new(&args).spawn();
        let code = run.finish(STEP);
        assert_eq!(code, if i == 0 { 0 } else { 75 }, "{}", run.transcript());
        assert!(
            run.events().is_empty(),
            "events on stderr: {}",
            run.transcript()
        );
        let want_stderr: &[&str] = if i == 0 { &["command-stderr"] } else { &[] };
        assert_eq!(run.texts(), want_stderr, "{}", run.transcript());
    }
    let events = events_in(&file);
    let all: Vec<&Value> = events.iter().collect();
    let one = [
        "acquired",
        "child_started",
        "child_exited",
        "released",
        "exit",
    ];
    let both: Vec<&str> = one.iter().chain(one.iter()).copied().collect();
    assert_eq!(
        names(&all),
        both,
        "the second run's events follow the first's"
    );
    // The command's own 75 is the command's, not a lock that was not acquired.
    assert_eq!(exit_of(&all[..5]), (0, "command".into()));
    assert_eq!(exit_of(&all), (75, "command".into()));

    // A descriptor: the command does not inherit it.
    let fd_file = dir.join("fd.jsonl");
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--pdeathsig",
        "KILL",
        "--",
        "sh",
        "-c",
        r#"exec "$0" "$@" 3>>"$EVENTS_OUT""#,
        BIN,
        "run",
        "--bootstrap",
        &b,
        "--lock",
        &lock,
        "--events-fd",
        "3",
    ])
    .args(QUICK)
    .args([
        "--",
        "sh",
        "-c",
        r#"if [ -e /proc/$$/fd/3 ]; then echo fd3-inherited; else echo fd3-closed; fi"#,
    ])
    .env("EVENTS_OUT", &fd_file)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    hermetic(&mut cmd);
    let mut run = Run::watch(cmd.spawn().expect("start kafka-lock"), None);
    run.stdout_line("fd3-closed", STEP);
    assert_eq!(run.finish(STEP), 0, "{}", run.transcript());
    assert!(run.seen.is_empty(), "{}", run.transcript());
    let events = events_in(&fd_file);
    assert_eq!(
        exit_of(&events.iter().collect::<Vec<_>>()),
        (0, "command".into())
    );

    // A FIFO nobody reads yet: kafka-lock takes the lock and runs the command meanwhile.
    let fifo = dir.join("events.fifo");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success());
    let mut args = vec![
        "run",
        "--bootstrap",
        &b,
        "--lock",
        &lock,
        "--events-file",
        fifo.to_str().expect("utf-8 path"),
    ];
    args.extend(QUICK);
    args.extend(["--", "sh", "-c", "echo ready; read _; exit 0"]);
    let mut run = Spec::new(&args).spawn();
    run.stdout_line("ready", STEP);
    // Opened for reading and writing, which never waits for a writer, so the test cannot hang
    // here; the reader stops after `exit`.
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .expect("open the FIFO");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            let Ok(line) = line else { break };
            let last = line.contains(r#""event":"exit""#);
            if tx.send(line).is_err() || last {
                break;
            }
        }
    });
    let mut got = Vec::new();
    let deadline = Instant::now() + STEP;
    let mut stdin_closed = false;
    while got
        .last()
        .map(|v: &Value| v["event"] != "exit")
        .unwrap_or(true)
    {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|e| panic!("events from the FIFO ({e:?}): {got:?}"));
        let v: Value = serde_json::from_str(&line).expect("a JSON line");
        check_event(&v);
        // The events queued before the reader came arrive first.
        if v["event"] == "child_started" && !stdin_closed {
            run.close_stdin();
            stdin_closed = true;
        }
        got.push(v);
    }
    assert_eq!(run.finish(STEP), 0, "{}", run.transcript());
    let got: Vec<&Value> = got.iter().collect();
    assert_eq!(
        names(&got),
        [
            "acquired",
            "child_started",
            "child_exited",
            "released",
            "exit"
        ]
    );
}

/// The last event tells the command's exit statuses from kafka-lock's own, and `-E` replaces
/// kafka-lock's 75. Every event the schema lists but `lost` shows up here (`lost`: the metrics
/// test), each checked against it as it is read.
#[test]
fn the_last_event_says_whose_status_it_is_and_e_replaces_75() {
    let b = broker().bootstrap();
    let lock = lock_name("whose");
    let mut seen: HashSet<String> = HashSet::new();

    // A key that means nothing for a lock: a `warning` event.
    let mut extra = vec![
        "--label",
        "holder",
        "--metrics-listen",
        "127.0.0.1:0",
        "-X",
        "acks=all",
    ];
    extra.extend(CONTENDED);
    let mut holder = run_cmd(&b, &lock, &extra, &["sh", "-c", "cat >/dev/null"]).spawn();
    holder.event("child_started", STEP);

    for (flags, code) in [
        (vec![], 75),
        (vec!["-E", "0"], 0),
        (vec!["--conflict-exit-code", "200"], 200),
    ] {
        let mut args = vec!["--wait", "0"];
        args.extend(CONTENDED);
        args.extend(&flags);
        let mut once = run_cmd(&b, &lock, &args, &["true"]).spawn();
        assert_eq!(once.finish(STEP), code, "{flags:?}: {}", once.transcript());
        let events = once.events();
        assert_eq!(
            failed_of(&events),
            (i64::from(code), "not_acquired".into()),
            "{flags:?}"
        );
        assert_eq!(
            exit_of(&events),
            (i64::from(code), "kafka-lock".into()),
            "{flags:?}"
        );
        assert!(once.named("child_started").is_empty());
        seen.extend(names(&events));
    }

    // A `--wait 0` try finds the stable holder with a look and never joins; a waiter with a
    // bounded wait does join, a rebalance the holder keeps the lock through under a new
    // generation, which the library counts before it reports the change.
    let mut args = vec!["--wait", "2s"];
    args.extend(CONTENDED);
    let mut waiter = run_cmd(&b, &lock, &args, &["true"]).spawn();
    assert_eq!(waiter.finish(STEP), 75, "{}", waiter.transcript());
    seen.extend(names(&waiter.events()));
    holder.event("token_changed", STEP);
    let addr = holder.named("metrics_listening")[0]["address"]
        .as_str()
        .expect("address")
        .to_owned();
    let body = scrape(&addr);
    let l = [("lock", lock.as_str())];
    let rebalances = kafka_lock::metrics::REBALANCES_WHILE_HELD;
    assert!(sample(&body, rebalances, &l) >= Some(1.0), "{body}");
    assert_eq!(
        sample(&body, kafka_lock::metrics::HELD, &l),
        Some(1.0),
        "{body}"
    );
    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());
    let events = holder.events();
    assert_eq!(exit_of(&events), (0, "command".into()));
    assert!(holder.named("failed").is_empty(), "{}", holder.transcript());
    seen.extend(names(&events));

    let documented: HashSet<String> = fields(&schema()["events"]).keys().cloned().collect();
    let missing: Vec<&String> = documented
        .difference(&seen)
        // A loss has tests of its own; a checkpoint needs a ledger topic (tests/it/ledger.rs
        // checks its event against the schema); term_ended is elect's (cli/election.rs).
        .filter(|e| *e != "lost" && *e != "checkpoint" && *e != "term_ended")
        .collect();
    assert!(missing.is_empty(), "never seen: {missing:?}");
}

#[test]
fn status_exit_codes_tell_held_free_unknown_and_unreachable() {
    let b = broker().bootstrap();
    let lock = lock_name("status-codes");
    let status = |bootstrap: &str, lock: &str| {
        let (code, stderr, out) =
            run_to_end(&["status", "--bootstrap", bootstrap, "--lock", lock], STEP);
        (code, format!("{stderr:?} {out}"))
    };
    // A group that was never used: free, in words about a lock rather than Kafka's "Dead".
    let (code, out) = status(&b, &lock);
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("no such lock (no group by that name): free") && !out.contains("Dead"),
        "{out}"
    );

    let (mut holder, _) = start_holder(&b, &lock, "held");
    let (code, out) = status(&b, &lock);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("holder: held"), "{out}");
    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());
    // Released: the group is empty, the lock free again.
    let (code, out) = status(&b, &lock);
    assert_eq!(code, 3, "{out}");

    // tansu's DescribeGroups carries no assignments: nobody can tell.
    let tansu = support::broker().bootstrap();
    let on_tansu = lock_name("status-codes-tansu");
    let (mut holder, _) = start_holder(&tansu, &on_tansu, "held on tansu");
    let (code, out) = status(&tansu, &on_tansu);
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("holder: unknown"), "{out}");
    holder.close_stdin();
    assert_eq!(holder.finish(STEP), 0, "{}", holder.transcript());

    let (code, out) = status(&format!("127.0.0.1:{}", dead_port()), &lock);
    assert_eq!(code, 69, "{out}");
    let (code, stderr, _) = run_to_end(
        &[
            "status",
            "--bootstrap",
            &b,
            "--lock",
            &lock,
            "--request-timeout",
            "0s",
        ],
        STEP,
    );
    assert_eq!(code, 78, "{stderr:?}");
    let (code, stderr, _) = run_to_end(&["status", "--bootstrap", &b], STEP);
    assert_eq!(code, 64, "{stderr:?}");
}

/// One scrape of `http://addr/metrics`: the body.
fn scrape(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    s.set_read_timeout(Some(STEP)).expect("set a read timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: kafka-lock\r\n\r\n")
        .expect("send the request");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read the answer");
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not HTTP: {answer}"));
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    body.to_owned()
}

/// The value of the series `name{labels}` (exactly these labels) in a Prometheus text body.
fn sample(body: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: HashSet<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    body.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
        if n != name {
            return None;
        }
        let inner = rest.strip_suffix('}')?;
        let got: HashSet<(String, String)> = inner
            .split(',')
            .filter(|kv| !kv.is_empty())
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
            .collect();
        (got == want).then(|| value.parse().ok())?
    })
}

/// Scrapes until `ready` holds, at most `within`: the library's event task records a change on
/// the same runtime as, but not necessarily before, the event kafka-lock reports.
fn scrape_until(addr: &str, what: &str, within: Duration, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + within;
    loop {
        let body = scrape(addr);
        if ready(&body) {
            return body;
        }
        assert!(Instant::now() < deadline, "never {what}:\n{body}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An administrator's LeaveGroup naming the member: the broker removes it at once, and the
/// holder learns it at its next heartbeat (UNKNOWN_MEMBER_ID).
fn remove_member(bootstrap: &str, group: &str, member_id: &str) {
    let (b, g, m) = (bootstrap.to_owned(), group.to_owned(), member_id.to_owned());
    let done = support::kafka::probe::block_on(async move {
        let conn = support::kafka::probe::coordinator_connection(&b, &g).await?;
        let req = LeaveGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(g.clone())))
            .with_members(vec![
                MemberIdentity::default().with_member_id(StrBytes::from_string(m.clone()))
            ]);
        let answer = conn.request(req).await.map_err(|e| e.to_string());
        conn.close();
        match answer? {
            Response::LeaveGroup(r)
                if r.error_code == 0 && r.members.iter().all(|x| x.error_code == 0) =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    });
    done.unwrap_or_else(|e| panic!("LeaveGroup for {member_id} in {group}: {e}"));
}

#[test]
fn metrics_show_the_hold_and_a_loss_by_reason_and_lost_exit_code_replaces_74() {
    use kafka_lock::metrics::{ACQUIRE_SECONDS, HELD, HOLD_SECONDS, LOSSES, REBALANCES_WHILE_HELD};
    let b = broker().bootstrap();
    let lock = lock_name("metrics");
    // The command waits in its SIGTERM handler for the test, and kafka-lock for the command up to
    // the 15 s grace: time enough to scrape after the loss.
    let script = "trap 'echo got-TERM; read _; exit 0' TERM; echo ready; while :; do sleep 1; done";
    let extra = [
        "--metrics-listen",
        "127.0.0.1:0",
        "--session-timeout",
        "30s",
        "--lease-margin",
        "15s",
        "--kill-grace",
        "15s",
        "--lost-exit-code",
        "99",
    ];
    let mut run = run_cmd(&b, &lock, &extra, &sh(script)).spawn();
    let listening = run.event("metrics_listening", STEP);
    let addr = listening["address"].as_str().expect("address").to_owned();
    let acquired = run.event("acquired", STEP);
    run.stdout_line("ready", STEP);
    let l = [("lock", lock.as_str())];
    let body = scrape_until(&addr, "held", STEP, |body| {
        sample(body, HELD, &l) == Some(1.0)
    });
    let count = format!("{ACQUIRE_SECONDS}_count");
    assert_eq!(sample(&body, &count, &l), Some(1.0), "{body}");
    assert_eq!(
        sample(&body, REBALANCES_WHILE_HELD, &l),
        Some(0.0),
        "{body}"
    );
    for reason in kafka_lock::metrics::LOSS_REASONS {
        let labels = [("lock", lock.as_str()), ("reason", reason)];
        assert_eq!(
            sample(&body, LOSSES, &labels),
            Some(0.0),
            "{reason}: {body}"
        );
    }

    remove_member(
        &b,
        &lock,
        acquired["member_id"].as_str().expect("member id"),
    );
    let lost = run.event("lost", STEP);
    assert_eq!(lost["reason"], "fenced", "{lost}");
    run.stdout_line("got-TERM", STEP);
    let fenced = [("lock", lock.as_str()), ("reason", "fenced")];
    // Within the grace, while kafka-lock still serves.
    let body = scrape_until(&addr, "a fenced loss", Duration::from_secs(10), |body| {
        sample(body, LOSSES, &fenced) == Some(1.0)
    });
    assert_eq!(sample(&body, HELD, &l), Some(0.0), "{body}");
    let holds = format!("{HOLD_SECONDS}_count");
    assert_eq!(sample(&body, &holds, &l), Some(1.0), "{body}");
    let expired = [("lock", lock.as_str()), ("reason", "lease_expired")];
    assert_eq!(sample(&body, LOSSES, &expired), Some(0.0), "{body}");

    run.write_stdin("done\n");
    assert_eq!(run.finish(STEP), 99, "{}", run.transcript());
    let events = run.events();
    assert_eq!(failed_of(&events), (99, "lost".into()));
    assert_eq!(exit_of(&events), (99, "kafka-lock".into()));

    // An address that cannot be bound is a setting error, before the lock is asked for.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let busy = taken.local_addr().expect("address").to_string();
    let (code, stderr, _) = run_to_end(
        &[
            "run",
            "--bootstrap",
            &b,
            "--lock",
            &lock,
            "--events",
            "json",
            "--metrics-listen",
            &busy,
            "--",
            "true",
        ],
        STEP,
    );
    assert_eq!(code, 78, "{stderr:?}");
    let events = events_of(&stderr);
    let events: Vec<&Value> = events.iter().collect();
    assert_eq!(failed_of(&events), (78, "config".into()));
    assert!(
        !names(&events).contains(&"waiting".to_owned()),
        "{stderr:?}"
    );
    let line = stderr.last().expect("a failure line");
    assert!(
        line.contains("--metrics-listen") && line.contains(&busy),
        "{line}"
    );
}

#[test]
fn completions_and_man_pages_come_from_the_command_line_definition() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (code, stderr, out) = run_to_end(&["completions", shell], STEP);
        assert_eq!(code, 0, "{shell}: {stderr:?}");
        for word in [
            "run",
            "status",
            "bootstrap",
            "events-file",
            "conflict-exit-code",
            "metrics-listen",
        ] {
            assert!(out.contains(word), "{shell} completions lack {word}");
        }
    }
    let (code, stderr, _) = run_to_end(&["completions", "tcsh"], STEP);
    assert_eq!(code, 64, "{stderr:?}");

    let (code, stderr, page) = run_to_end(&["manpage"], STEP);
    assert_eq!(code, 0, "{stderr:?}");
    assert!(
        page.starts_with(".ie ") && page.contains("\n.TH kafka-lock 1 "),
        "{page}"
    );
    assert!(page.contains(r"kafka\-lock\-run(1)") && page.contains(r"kafka\-lock\-status(1)"));
    let (code, stderr, page) = run_to_end(&["manpage", "run"], STEP);
    assert_eq!(code, 0, "{stderr:?}");
    assert!(page.contains("\n.TH kafka-lock-run 1 "), "{page}");
    for flag in [
        r"\-\-events\-file",
        r"\-\-conflict\-exit\-code",
        "KAFKA_LOCK_SESSION_TIMEOUT",
    ] {
        assert!(page.contains(flag), "kafka-lock-run(1) lacks {flag}");
    }
    let (code, stderr, page) = run_to_end(&["manpage", "status"], STEP);
    assert_eq!(code, 0, "{stderr:?}");
    assert!(page.contains("\n.TH kafka-lock-status 1 ") && page.contains("KAFKA_LOCK_JSON"));
    assert!(
        page.contains("the lock is free"),
        "status(1) lacks the exit statuses"
    );

    // Hidden from the help, which lists what people run.
    let (code, _, help) = run_to_end(&["--help"], STEP);
    assert_eq!(code, 0);
    assert!(
        !help.contains("completions") && !help.contains("manpage"),
        "{help}"
    );
}

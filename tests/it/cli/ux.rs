//! What a user meets first: one meaning of "token" in every view, tries that do not disturb
//! the holder, interactive commands, quiet busy locks and setting errors that name the setting.

use super::*;
use crate::support::kafka::probe::create_topic;

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

//! What a person meets before any broker answers: each subcommand's help, the forms of values
//! people type from other tools, hints for common slips, completions in real shells, man pages,
//! and the documentation's command lines, all through the built binary.

use super::*;

/// `kafka-lock ARGS --help` on stdout, checked to exit 0.
fn help_of(args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.push("--help");
    let (code, stderr, out) = run_to_end(&all, STEP);
    assert_eq!(code, 0, "{all:?}: {stderr:?}");
    out
}

/// The long and short flags a help text lists (in its option lines only).
fn flags_in(help: &str) -> HashSet<String> {
    let mut found = HashSet::new();
    for line in help.lines() {
        let line = line.trim_start();
        if !line.starts_with('-') {
            continue;
        }
        for word in line.split([' ', ',', '=', '<']) {
            if word.starts_with('-') && word.len() > 1 && word != "--" {
                found.insert(word.to_owned());
            }
        }
    }
    found
}

#[test]
fn each_subcommands_help_lists_only_what_it_takes() {
    let run = flags_in(&help_of(&["run"]));
    let elect = flags_in(&help_of(&["elect"]));
    for f in ["--wait", "-E", "--conflict-exit-code", "--permits"] {
        assert!(run.contains(f), "run --help lacks {f}: {run:?}");
        assert!(
            !elect.contains(f),
            "elect --help lists {f}, which elect does not take"
        );
    }
    for f in [
        "--max-terms",
        "--min-term",
        "--lease-margin",
        "--ledger-topic",
    ] {
        assert!(elect.contains(f), "elect --help lacks {f}: {elect:?}");
    }
    let elect_text = help_of(&["elect"]);
    assert!(!elect_text.contains("--wait"), "{elect_text}");

    // What elect does not take is a usage error that says why.
    let dead = format!("127.0.0.1:{}", dead_port());
    for (flag, value, why) in [
        ("--wait", "1s", "--wait does not apply"),
        ("-E", "0", "no 'not acquired' status"),
        ("--permits", "2", "one leader at a time"),
    ] {
        let args = [
            "elect",
            "--bootstrap",
            &dead,
            "--lock",
            "l",
            flag,
            value,
            "--",
            "true",
        ];
        let (code, stderr, _) = run_to_end(&args, STEP);
        assert_eq!(code, 64, "{args:?}: {stderr:?}");
        assert!(
            stderr.iter().any(|l| l.contains(why)),
            "{args:?}: {stderr:?}"
        );
    }
}

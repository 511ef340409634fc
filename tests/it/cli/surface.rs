//! What a person meets before any broker answers: each subcommand's help, the forms of values
//! people type from other tools, hints for common slips, completions in real shells, man pages,
//! and the documentation's command lines, all through the built binary.

use super::*;
use std::path::Path;

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

/// The forms people type from flock, timeout and Prometheus exporters are taken; a cluster that
/// cannot be reached (69), not a usage error (64), shows the command line was.
#[test]
fn familiar_forms_of_wait_and_metrics_listen_are_taken() {
    let dead = format!("127.0.0.1:{}", dead_port());
    let base = [
        "run",
        "--bootstrap",
        &dead,
        "--lock",
        "l",
        "--connect-timeout",
        "200ms",
    ];
    for extra in [
        &["--wait", "5"][..],
        &["--wait", "0.5"],
        &["-w", "3"],
        &["-n"],
        &["--nonblock"],
        &["--metrics-listen", "localhost:0", "--events", "json"],
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "true"]);
        let (code, stderr, _) = run_to_end(&args, STEP);
        assert_eq!(code, 69, "{args:?} should pass the parser: {stderr:?}");
        if extra.contains(&"localhost:0") {
            let listening = stderr
                .iter()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|v| v["event"] == "metrics_listening")
                .unwrap_or_else(|| panic!("no metrics_listening: {stderr:?}"));
            let addr: std::net::SocketAddr =
                listening["address"].as_str().unwrap().parse().unwrap();
            assert!(addr.ip().is_loopback(), "{listening}");
        }
    }
    let mut args = base.to_vec();
    args.extend_from_slice(&["--wait", "5", "-n", "--", "true"]);
    let (code, stderr, _) = run_to_end(&args, STEP);
    assert_eq!(code, 64, "{stderr:?}");
    let mut args = base.to_vec();
    args.extend_from_slice(&["--metrics-listen", ":x", "--", "true"]);
    let (code, stderr, _) = run_to_end(&args, STEP);
    assert_eq!(code, 64, "{stderr:?}");
    assert!(
        stderr.iter().any(|l| l.contains("not a port")),
        "{stderr:?}"
    );
}

/// `kafka-lock run --lock x true` is the slip flock users make: the hint says where it goes.
#[test]
fn a_command_without_the_double_dash_gets_a_hint() {
    let dead = format!("127.0.0.1:{}", dead_port());
    for args in [
        vec!["run", "--bootstrap", &dead, "--lock", "x", "true"],
        vec!["elect", "--bootstrap", &dead, "--lock", "x", "true"],
        vec!["run", "--bootstrap", &dead, "--lock", "x"],
    ] {
        let (code, stderr, _) = run_to_end(&args, STEP);
        assert_eq!(code, 64, "{args:?}: {stderr:?}");
        assert!(
            stderr.iter().any(|l| l.contains("after `--`")),
            "{args:?} should say the command goes after `--`: {stderr:?}"
        );
    }
}

/// The Apache fixture's KRaft controller listener given as the bootstrap: the answer says it is
/// a controller's port, not that the broker is too old.
#[test]
fn a_controller_listener_given_as_bootstrap_is_named() {
    let controller = format!("127.0.0.1:{}", broker().nodes()[0].controller_port());
    for sub in ["status", "run"] {
        let mut args = vec![sub, "--bootstrap", &controller, "--lock", "l"];
        if sub == "run" {
            args.extend_from_slice(&["--wait", "0", "--", "true"]);
        }
        let (code, stderr, _) = run_to_end(&args, STEP);
        assert_eq!(code, 69, "{args:?}: {stderr:?}");
        let said = stderr.join("\n");
        assert!(
            said.contains("KRaft controller's listener") && !said.contains("Kafka 0.9 or newer"),
            "{args:?}: {said}"
        );
    }
}

/// `shell` (found on PATH, or the test fails saying how to install it) run with `args`, its
/// stdout, within `within`.
fn in_shell(shell: &str, args: &[&str], within: Duration) -> String {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(shell).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "this test runs {shell}, which is not installed: apt-get install {shell} (zsh and fish: \
         scripts/install-test-deps.sh installs them)"
    );
    let dir = scratch_dir(&format!("completion-{shell}"));
    let out_path = dir.join("stdout");
    let out = std::fs::File::create(&out_path).unwrap();
    let child = Command::new("setpriv")
        .args(["--pdeathsig", "KILL", "--", shell])
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {shell}: {e}"));
    let status = wait_bounded(child, within);
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    assert!(status.success(), "{shell} {args:?}: {status:?}: {text}");
    text
}

/// The completion script for `shell`, written where that shell looks for it: a file in `dir`.
fn completion_script(shell: &str, file: &str) -> PathBuf {
    let (code, stderr, script) = run_to_end(&["completions", shell], STEP);
    assert_eq!(code, 0, "{shell}: {stderr:?}");
    let dir = scratch_dir(&format!("completions-{shell}"));
    let path = dir.join(file);
    std::fs::write(&path, script).unwrap();
    path
}

/// What bash offers for `line` (the word being completed is the last), as the completion
/// function leaves COMPREPLY.
fn bash_completes(script: &Path, line: &str) -> Vec<String> {
    let driver = r#"source "$1" || exit 2
read -r -a COMP_WORDS <<< "$2"
[[ "$2" == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
COMP_LINE="$2"
COMP_POINT=${#COMP_LINE}
prev=""
(( COMP_CWORD > 0 )) && prev=${COMP_WORDS[COMP_CWORD-1]}
fn=$(complete -p kafka-lock | sed -n 's/.*-F \([^ ]*\).*/\1/p')
"$fn" kafka-lock "${COMP_WORDS[COMP_CWORD]}" "$prev"
printf '%s\n' "${COMPREPLY[@]}"
"#;
    let out = in_shell(
        "bash",
        &[
            "--norc",
            "--noprofile",
            "-c",
            driver,
            "driver",
            &script.to_string_lossy(),
            line,
        ],
        STEP,
    );
    out.lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn bash_completes_subcommands_and_their_flags() {
    let script = completion_script("bash", "kafka-lock");
    let cases: &[(&str, &[&str], &[&str])] = &[
        ("kafka-lock st", &["status"], &[]),
        (
            "kafka-lock run --le",
            &["--lease-margin", "--ledger-topic"],
            &[],
        ),
        ("kafka-lock status --js", &["--json"], &[]),
        (
            "kafka-lock elect --",
            &["--max-terms", "--lock"],
            &["--wait", "--permits"],
        ),
        ("kafka-lock run --events ", &["json"], &[]),
    ];
    for (line, want, not) in cases {
        let got = bash_completes(&script, line);
        for w in *want {
            assert!(
                got.iter().any(|g| g == w),
                "{line:?} should offer {w}: {got:?}"
            );
        }
        for n in *not {
            assert!(!got.iter().any(|g| g == n), "{line:?} offers {n}: {got:?}");
        }
    }
}

#[test]
fn fish_completes_subcommands_and_their_flags() {
    let script = completion_script("fish", "kafka-lock.fish");
    for (line, want) in [
        ("kafka-lock st", "status"),
        ("kafka-lock run --le", "--ledger-topic"),
        ("kafka-lock status --js", "--json"),
    ] {
        let cmd = format!(
            "source {}; complete -C {}",
            script.display(),
            shell_quote(line)
        );
        let out = in_shell("fish", &["--no-config", "-c", &cmd], STEP);
        assert!(
            out.lines().any(|l| l.split('\t').next() == Some(want)),
            "{line:?} should offer {want}: {out}"
        );
    }
}

/// zsh completes only in an interactive shell with compsys loaded: one runs in a
/// pseudo-terminal (zsh's zpty module), the line is typed with a TAB, and the listing is read
/// until the word expected shows up (the bound of the whole run ends it otherwise).
#[test]
fn zsh_completes_subcommands_and_their_flags() {
    let script = completion_script("zsh", "_kafka-lock");
    let dir = script.parent().unwrap().to_string_lossy().into_owned();
    let driver = r#"zmodload zsh/zpty || exit 2
zpty z 'zsh -f -i'
zpty -w z "PS1='> '; fpath=($1 \$fpath); autoload -Uz compinit; compinit -u -D; zstyle ':completion:*' list-prompt ''; LISTMAX=1000"
zpty -w z "$2"$'\t'
zpty -r z out "*$3*" || exit 3
print -r -- "$out"
zpty -d z
"#;
    // Lines with several candidates, so that zsh lists them rather than completing in place.
    for (line, want) in [
        ("kafka-lock ", "status"),
        ("kafka-lock run --le", "--ledger-topic"),
        ("kafka-lock status --", "--json"),
    ] {
        let out = in_shell(
            "zsh",
            &["-f", "-c", driver, "driver", &dir, line, want],
            STEP,
        );
        // The typed line comes back first, then the completion: the word must come after it.
        let typed = out
            .find(line)
            .unwrap_or_else(|| panic!("{line:?} not echoed: {out}"));
        assert!(out[typed + line.len()..].contains(want), "{line:?}: {out}");
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Every `kafka-lock` command line in the README and docs/cli.md, from code blocks and inline
/// code: continuation lines joined, the shell's own syntax (comments, redirections, pipes,
/// variable assignments before the command) taken off, `...` placeholders dropped.
fn documented_command_lines() -> Vec<(String, Vec<String>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for doc in ["README.md", "docs/cli.md"] {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        let mut candidates = Vec::new();
        let mut in_block = false;
        let mut pending = String::new();
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                in_block = !in_block;
                continue;
            }
            if in_block {
                let line = line.trim();
                if let Some(head) = line.strip_suffix('\\') {
                    pending.push_str(head);
                    pending.push(' ');
                    continue;
                }
                pending.push_str(line);
                candidates.push(std::mem::take(&mut pending));
            } else {
                // Inline code: `kafka-lock ...`.
                for (i, piece) in line.split('`').enumerate() {
                    if i % 2 == 1 {
                        candidates.push(piece.to_owned());
                    }
                }
            }
        }
        for c in candidates {
            if let Some(words) = command_words(&c) {
                found.push((format!("{doc}: {c}"), words));
            }
        }
    }
    found
}

/// The flags that take no value.
const BOOLEAN_FLAGS: [&str; 5] = ["--json", "--poll", "--nonblock", "--help", "--version"];

/// The arguments of a `kafka-lock` command line, or None if `text` is not one.
fn command_words(text: &str) -> Option<Vec<String>> {
    // Comments, and what the shell does with the output.
    let text = text.split(" #").next()?;
    let text = text.split([';', '|', '>']).next()?;
    let mut words = Vec::new();
    let (mut word, mut quote, mut any) = (String::new(), None, false);
    for c in text.chars() {
        match (quote, c) {
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if any || !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                    any = false;
                }
            }
            (_, c) => word.push(c),
        }
    }
    if any || !word.is_empty() {
        words.push(word);
    }
    // Assignments before the command, then the program itself.
    let start = words
        .iter()
        .position(|w| !w.contains('=') || w.starts_with('-'))?;
    let words = &words[start..];
    if words.first().map(String::as_str) != Some("kafka-lock") || words.len() < 2 {
        return None;
    }
    // `...` after a flag stands for its value; elsewhere, for more of the same.
    let mut args: Vec<String> = Vec::new();
    for w in &words[1..] {
        // Synopsis notation: [--json] is the flag, run|status the first choice.
        let w = w.trim_start_matches('[').trim_end_matches(']');
        let w = &w.split('|').next().unwrap_or(w).to_owned();
        if !w.contains("...") {
            args.push(w.clone());
        } else if args
            .last()
            .is_some_and(|prev| prev.starts_with("--") && !BOOLEAN_FLAGS.contains(&prev.as_str()))
        {
            args.push("x".to_owned());
        }
    }
    // A subcommand's name or a flag must follow: "kafka-lock is ..." in prose is not a command.
    let first = args.first()?;
    let subcommands = [
        "run",
        "status",
        "history",
        "elect",
        "observe",
        "completions",
        "manpage",
    ];
    (subcommands.contains(&first.as_str()) || first.starts_with('-')).then_some(args)
}

#[test]
fn every_documented_command_line_parses() {
    let lines = documented_command_lines();
    assert!(lines.len() >= 20, "too few command lines found: {lines:?}");
    for (where_, args) in &lines {
        // --help before the command (after `--` it would be the command's): the parser checks
        // every flag and value it meets, then prints the help instead of running anything.
        let mut with_help = args.clone();
        let at = with_help
            .iter()
            .position(|a| a == "--")
            .unwrap_or(with_help.len());
        // completions and manpage print rather than run: as written, bounded.
        if !matches!(args[0].as_str(), "completions" | "manpage") {
            with_help.insert(at, "--help".to_owned());
        }
        let (code, stderr, _) = run_to_end(&with_help, STEP);
        assert_eq!(code, 0, "{where_}\nparsed as {with_help:?}: {stderr:?}");
    }
}

/// Every field of every event the CLI writes is in docs/events.md: the event names and the field
/// names of the fixed tables, as the schema the conventions tests check each event against.
#[test]
fn every_event_field_is_documented() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/events.md")).unwrap();
    let source: String = ["report.rs", "observe.rs", "run.rs", "elect.rs"]
        .iter()
        .map(|f| std::fs::read_to_string(root.join("src/bin/kafka-lock").join(f)).unwrap())
        .collect();
    // The JSON builder (json.rs) names fields as .str("name", ..), .opt_int("name", ..), and
    // the reporter events as .event("name").
    let mut names = HashSet::new();
    for piece in source.split('.').skip(1) {
        let Some((method, rest)) = piece.split_once("(\"") else {
            continue;
        };
        let builder = [
            "str", "opt_str", "int", "opt_int", "bool", "null", "raw", "event",
        ];
        if !builder.contains(&method) {
            continue;
        }
        if let Some((name, _)) = rest.split_once('"') {
            if !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                names.insert(name.to_owned());
            }
        }
    }
    assert!(
        names.len() > 20,
        "too few field names found in the source: {names:?}"
    );
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !doc.contains(&format!("`{n}`")) && !doc.contains(&format!("\"{n}\"")))
        .collect();
    assert!(missing.is_empty(), "not in docs/events.md: {missing:?}");
}

/// Each man page has EXIT STATUS and EXAMPLES, a synopsis with each option's value, and points
/// to no page that cannot be generated.
#[test]
fn man_pages_have_exit_status_examples_and_values_in_the_synopsis() {
    for page in [
        None,
        Some("run"),
        Some("status"),
        Some("history"),
        Some("elect"),
        Some("observe"),
    ] {
        let mut args = vec!["manpage"];
        args.extend(page);
        let (code, stderr, text) = run_to_end(&args, STEP);
        assert_eq!(code, 0, "{args:?}: {stderr:?}");
        for heading in [
            "\n.SH NAME",
            "\n.SH SYNOPSIS",
            "\n.SH \"EXIT STATUS\"",
            "\n.SH EXAMPLES",
        ] {
            assert!(text.contains(heading), "{args:?} lacks {heading}: {text}");
        }
        assert_eq!(
            text.matches(".ds Aq").count(),
            2,
            "{args:?}: one preamble: {text}"
        );
        assert!(!text.contains(r"kafka\-lock\-help"), "{args:?}: {text}");
        let synopsis = text
            .split("\n.SH SYNOPSIS\n")
            .nth(1)
            .and_then(|rest| rest.split("\n.SH").next())
            .unwrap_or_default();
        if page.is_some() {
            assert!(
                synopsis.contains(r"\fB\-\-lock\fR \fINAME\fR")
                    && synopsis.contains(r"\fB\-\-bootstrap\fR \fIHOST:PORT"),
                "{args:?} synopsis without values: {synopsis}"
            );
        }
        if page == Some("run") {
            assert!(
                synopsis.contains(r"[\fB\-w\fR|\fB\-\-wait\fR \fIDURATION\fR]")
                    && synopsis.contains(r"\fB\-\-\fR \fICOMMAND\fR..."),
                "{synopsis}"
            );
        }
    }
    // Rendered by man itself: the sections come out as headings.
    let (_, _, text) = run_to_end(&["manpage", "run"], STEP);
    let file = scratch_dir("manpage").join("kafka-lock-run.1");
    std::fs::write(&file, text).unwrap();
    let shown = in_shell("man", &["-l", &file.to_string_lossy()], STEP);
    assert!(
        shown.contains("EXIT STATUS") && shown.contains("EXAMPLES"),
        "{shown}"
    );
}

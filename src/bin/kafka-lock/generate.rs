//! Shell completions and man pages, generated from the same clap definition that parses the
//! command line (hidden subcommands `completions` and `manpage`), so they cannot drift from it.

use std::io::Write;

use clap::{Command, ValueEnum};

use crate::exit::{self, Failure};

/// The man pages: kafka-lock(1) and one per subcommand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Page {
    Run,
    Status,
    History,
    Elect,
    Observe,
}

/// The completion script for `shell`, for the command `kafka-lock`.
pub fn completions(shell: clap_complete::Shell, mut cmd: Command) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "kafka-lock", &mut out);
    if shell == clap_complete::Shell::Bash {
        out = bash_case_labels(&out);
    }
    out
}

/// clap_complete's bash script for a hyphenated name sets `cmd="kafka__lock__subcmd__run"` when
/// it sees a subcommand, but labels that case `kafka__subcmd__lock__subcmd__run)`: it escapes
/// the hyphen in the labels as if it separated subcommands. Nothing after the subcommand would
/// complete; the labels are renamed to what the dispatch sets.
fn bash_case_labels(script: &[u8]) -> Vec<u8> {
    String::from_utf8_lossy(script)
        .replace("kafka__subcmd__lock", "kafka__lock")
        .into_bytes()
}

/// kafka-lock(1), or a subcommand's page (kafka-lock-run(1), kafka-lock-status(1), ...), in roff:
/// clap_mangen's sections, with a synopsis that shows each option's value, and EXIT STATUS and
/// EXAMPLES sections of our own.
pub fn manpage(page: Option<Page>, cmd: Command) -> Result<Vec<u8>, Failure> {
    // `kafka-lock help` has no page of its own; the main page must not point to one. Building
    // gives subcommands their display names ("kafka-lock-run") and usage lines.
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let cmd = match page {
        None => cmd,
        Some(p) => cmd
            .find_subcommand(p.name())
            .cloned()
            .ok_or_else(|| Failure::new(exit::USAGE, format!("no subcommand {}", p.name())))?,
    };
    let man = clap_mangen::Man::new(cmd.clone());
    let failed =
        |e: std::io::Error| Failure::new(exit::OSERR, format!("cannot render the man page: {e}"));
    // Each section clap_mangen renders on its own starts with the page's preamble (the
    // apostrophe string); the page needs it once, at the top.
    let mut out = Vec::new();
    man.render_title(&mut out).map_err(failed)?;
    let section_of = |render: &dyn Fn(&mut Vec<u8>) -> std::io::Result<()>| {
        let mut buf = Vec::new();
        render(&mut buf).map_err(failed)?;
        Ok::<Vec<u8>, Failure>(match buf.strip_prefix(PREAMBLE.as_bytes()) {
            Some(body) => body.to_vec(),
            None => buf,
        })
    };
    let mut sections = vec![
        section_of(&|w| man.render_name_section(w))?,
        synopsis(&cmd).into_bytes(),
        section_of(&|w| man.render_description_section(w))?,
        section_of(&|w| man.render_options_section(w))?,
    ];
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        sections.push(section_of(&|w| man.render_subcommands_section(w))?);
    }
    if cmd.get_after_help().is_some() {
        sections.push(section_of(&|w| man.render_extra_section(w))?);
    }
    sections.push(section("EXIT STATUS", exit_status(page)).into_bytes());
    sections.push(examples(page).into_bytes());
    sections.push(section_of(&|w| man.render_version_section(w))?);
    out.extend(sections.concat());
    Ok(out)
}

/// What the roff crate writes before every page: `'` as an apostrophe in groff and elsewhere.
const PREAMBLE: &str = ".ie \\n(.g .ds Aq \\(aq\n.el .ds Aq '\n";

impl Page {
    fn name(self) -> &'static str {
        match self {
            Page::Run => "run",
            Page::Status => "status",
            Page::History => "history",
            Page::Elect => "elect",
            Page::Observe => "observe",
        }
    }
}

/// Text for roff: backslashes and hyphens escaped, no line that starts with a control character.
fn roff(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    escaped
        .lines()
        .map(|l| {
            if l.starts_with(['.', '\'']) {
                format!("\\&{l}")
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn section(title: &str, body: &str) -> String {
    let paragraphs: Vec<String> = body.split("\n\n").map(roff).collect();
    format!(".SH \"{title}\"\n{}\n", paragraphs.join("\n.PP\n"))
}

/// The synopsis with each option's value: `[--wait DURATION]`, `--lock NAME`, `-- COMMAND...`.
fn synopsis(cmd: &Command) -> String {
    let name = cmd
        .get_display_name()
        .unwrap_or(cmd.get_name())
        .replace('-', " ");
    let mut parts = vec![format!("\\fB{}\\fR", roff(&name))];
    let mut positional = Vec::new();
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        let value = arg
            .get_value_names()
            .map(|v| v.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(" "))
            .filter(|_| arg.get_action().takes_values());
        let value = value
            .map(|v| format!(" \\fI{}\\fR", roff(&v)))
            .unwrap_or_default();
        let flag = match (arg.get_short(), arg.get_long()) {
            (Some(s), Some(l)) => format!("\\fB\\-{s}\\fR|\\fB\\-\\-{}\\fR", roff(l)),
            (None, Some(l)) => format!("\\fB\\-\\-{}\\fR", roff(l)),
            (Some(s), None) => format!("\\fB\\-{s}\\fR"),
            (None, None) => {
                let names = arg
                    .get_value_names()
                    .map(|v| v.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(" "))
                    .unwrap_or_else(|| arg.get_id().as_str().to_owned());
                let dashes = if arg.is_last_set() {
                    "\\fB\\-\\-\\fR "
                } else {
                    ""
                };
                positional.push(format!("{dashes}\\fI{}\\fR...", roff(&names)));
                continue;
            }
        };
        let repeat = if matches!(arg.get_action(), clap::ArgAction::Append) {
            "..."
        } else {
            ""
        };
        if arg.is_required_set() {
            parts.push(format!("{flag}{value}"));
        } else {
            parts.push(format!("[{flag}{value}]{repeat}"));
        }
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        parts.push("\\fISUBCOMMAND\\fR [\\fIOPTIONS\\fR]".to_owned());
    }
    parts.extend(positional);
    format!(".SH SYNOPSIS\n{}\n", parts.join(" "))
}

fn exit_status(page: Option<Page>) -> &'static str {
    match page {
        None => {
            "kafka-lock run and elect: the command's status (128+N when signal N ended it); 75 \
not acquired within --wait (or -E N); 74 the lock was lost while the command ran (or \
--lost-exit-code N); 69 the cluster (or the OAuth token endpoint) cannot be reached or answered something invalid; 77 the \
cluster refused the credentials or an operation, or the secured connection could not be made; 78 \
a setting is invalid or the broker rejected it; 71 the system refused something kafka-lock needs, \
or its supervisor died; 64 usage error; 126 and 127 the command cannot be run.

kafka-lock status: 0 held, 3 free, 4 unknown, and 69, 77, 78, 64 as above. Each subcommand's page \
has the details."
        }
        Some(Page::Run) => {
            "The command's status (128+N if signal N ended it). 75 not acquired \
within --wait (or the status -E gives); 74 the lock was lost while the command ran, or its \
checkpoint not stored (or --lost-exit-code); 69 the cluster (or the OAuth token endpoint) cannot be reached or answered \
something invalid; 77 the cluster refused the credentials or an operation, or the secured \
connection could not be made; 78 a setting is invalid or the broker rejected it; 71 the system \
refused something kafka-lock needs, or the supervisor died; 64 usage error, or a nested run of \
the lock the calling command holds; 126 the command cannot be executed, 127 it does not exist; \
128+N signal N arrived while waiting for the lock."
        }
        Some(Page::Status) => {
            "0 the lock is held; 3 the lock is free (also a lock nobody ever \
used); 4 unknown (the broker does not report assignments, or the group is between generations); \
69 the cluster (or the OAuth token endpoint) cannot be reached or answered something invalid; 77 the cluster refused the \
credentials or the lookup; 78 a setting is invalid or the broker rejected it; 64 usage error."
        }
        Some(Page::History) => {
            "0 the history was printed (also when it has no holds); 69 the \
cluster (or the OAuth token endpoint) cannot be reached or answered something invalid; 77 the cluster refused the credentials \
or the read; 78 a setting is invalid, the ledger topic is missing or unusable, or the broker \
rejected a setting; 64 usage error (no --ledger-topic)."
        }
        Some(Page::Elect) => {
            "0 when stopped by SIGINT or SIGTERM; with --max-terms N, the last \
command's status; 69 if the cluster cannot be reached before the first term (later it keeps \
campaigning); 78, 71, 64, 126 and 127 as for kafka-lock run."
        }
        Some(Page::Observe) => {
            "0 when stopped by SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 or \
SIGUSR2, or when stdout is closed; 69 if the cluster cannot be reached at the start (later it \
keeps trying); 78 a setting is invalid or the broker rejected it; 64 usage error."
        }
    }
}

fn examples(page: Option<Page>) -> String {
    let list: &[(&str, &str)] = match page {
        None | Some(Page::Run) => &[
            (
                "Run a nightly job on one host at a time, waiting up to 10 minutes for the lock:",
                "kafka-lock run --bootstrap broker1:9092 --lock nightly --wait 10m -- /usr/local/bin/nightly",
            ),
            (
                "From cron: skip this run, with status 0, if another copy holds the lock (as flock -n -E 0):",
                "kafka-lock run --bootstrap broker1:9092 --lock nightly -n -E 0 -- /usr/local/bin/nightly",
            ),
            (
                "With a ledger, so that the fencing token never goes backwards and history is kept:",
                "kafka-lock run --bootstrap broker1:9092 --lock report --ledger-topic kafka-lock-ledger -- ./report.sh",
            ),
        ],
        Some(Page::Status) => &[
            (
                "Who holds the lock; the status says held (0), free (3) or unknown (4):",
                "kafka-lock status --bootstrap broker1:9092 --lock nightly",
            ),
            (
                "The same as one JSON object, with the ledger's last hold:",
                "kafka-lock status --bootstrap broker1:9092 --lock nightly --ledger-topic kafka-lock-ledger --json",
            ),
        ],
        Some(Page::History) => &[(
            "Every hold of the last week:",
            "kafka-lock history --bootstrap broker1:9092 --lock nightly --ledger-topic kafka-lock-ledger --since 7d",
        )],
        Some(Page::Elect) => &[(
            "Run a service on the one elected leader, campaigning again when it ends:",
            "kafka-lock elect --bootstrap broker1:9092 --lock scheduler -- ./scheduler",
        )],
        Some(Page::Observe) => &[(
            "Print the leader and each change, one JSON object per line:",
            "kafka-lock observe --bootstrap broker1:9092 --lock scheduler --json",
        )],
    };
    let mut out = String::from(".SH EXAMPLES\n");
    for (what, line) in list {
        out.push_str(&format!(
            ".PP\n{}\n.PP\n.RS 4\n.nf\n{}\n.fi\n.RE\n",
            roff(what),
            roff(line)
        ));
    }
    out
}

/// Writes generated text to stdout; unlike an answer of `status`, a file that could not be
/// written completely is an error (a packager's redirect to a full disk must not pass).
pub fn print(text: &[u8]) -> Result<u8, Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(text)
        .and_then(|()| out.flush())
        .map_err(|e| Failure::new(exit::OSERR, format!("cannot write to stdout: {e}")))?;
    Ok(0)
}

//! `kafka-lock`: run a command while holding a lock on a Kafka cluster, or show who holds one.
//!
//! ```text
//! kafka-lock run --bootstrap HOST:PORT[,...] --lock NAME [options] -- COMMAND [ARGS...]
//! kafka-lock status --bootstrap HOST:PORT[,...] --lock NAME [--ledger-topic T] [--json]
//! kafka-lock history --bootstrap HOST:PORT[,...] --lock NAME --ledger-topic T [--since S] [--json]
//! kafka-lock completions bash|zsh|fish|elvish|powershell     (hidden)
//! kafka-lock manpage [run|status|history]                     (hidden)
//! ```
//!
//! Every flag can also come from the environment: `--session-timeout` from
//! `KAFKA_LOCK_SESSION_TIMEOUT` and so on (`environ.rs`; docs/cli.md).
//!
//! `run` holds the lock on a current-thread tokio runtime (one lock and a few timers need no
//! thread pool) and leaves the command to a supervisor process, the same binary re-executed in a
//! hidden mode (`supervise.rs`), which owns the lease deadline and stops the command on its own.
//! Everything written to stderr goes through a bounded queue to a writer thread (`output.rs`),
//! so output never blocks the lock session.
//!
//! Exit statuses: the command's own (128+N when signal N ended it); 75 not acquired within
//! `--wait`; 74 lost while the command ran; 69 cluster unreachable or answering nonsense; 78
//! invalid setting or one the broker rejects; 71 the system refused something kafka-lock needs,
//! or its supervisor process died; 64 usage; 126/127 the command cannot be run. `-E` and
//! `--lost-exit-code` replace 75 and 74. `status`: 0 held, 3 free, 4 unknown, 69, 78, 64.

#![deny(unsafe_code)]

mod environ;
mod exit;
mod generate;
mod history;
mod json;
mod output;
mod proto;
mod report;
mod run;
mod serve;
mod sink;
mod status;
mod supervise;
mod sys;
mod tree;

// The supervisor is made of Linux: child subreapers, pidfds, /proc, SOCK_SEQPACKET pairs.
#[cfg(not(target_os = "linux"))]
compile_error!("the kafka-lock CLI is built for Linux only; use the library elsewhere");

use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

use crate::environ::FromEnv;
use crate::exit::Failure;

const AFTER_RUN_HELP: &str = "\
The command starts only once the lock is held, with KAFKA_LOCK_NAME, KAFKA_LOCK_TOKEN (the fencing
token, in decimal), KAFKA_LOCK_GENERATION and KAFKA_LOCK_MEMBER_ID in its environment. With
--ledger-topic the token is the offset of this hold's ACQUIRED record in the ledger: it never goes
backwards, whatever happens to the group. Without one it is the group generation, which starts
again at 1 when the group is deleted (by an administrator, or by the broker 0-10 minutes after it
was left empty with no committed offsets). A rebalance while holding (another member joining)
moves the generation on, reported as token_changed by --events json; the ledger token stays.

Checkpoint (needs --ledger-topic): KAFKA_LOCK_CHECKPOINT holds the lock's last checkpoint, if it
has one, and KAFKA_LOCK_CHECKPOINT_FILE names a file (in a directory of kafka-lock's own) that the
command may write. If the command exits 0 and the file exists, kafka-lock stores its content
(UTF-8, at most --checkpoint-max-bytes) as the new checkpoint before it releases the lock: an
OffsetCommit carrying the hold's generation and member id, which the broker rejects if this holder
is no longer the current one. A rejected or failed commit is status 74; content that is too long
or not UTF-8 is status 78. Either way the lock's checkpoint stays the previous one, unless the
hold ended before the broker answered: then it may or may not be stored, and the message says so.
When the group has no checkpoint (deleted, or its offsets expired), the ledger's copy is looked
for among the ledger's last 32768 records only; `kafka-lock history` reads them all.

What stops the command. kafka-lock starts a supervisor process (itself, re-executed, in a process
group of its own), which starts the command in a process group of its own. The supervisor owns the
lease end, which kafka-lock moves forward at each renewal: at the lease end it sends SIGTERM to
every process the command started, and SIGKILL after --kill-grace, unless the lease was renewed by
then. Nothing that blocks or pauses kafka-lock itself (a stderr nobody reads, SIGSTOP) delays that.
The lease ends --lease-margin (at least --kill-grace) before the broker could give the lock to
anyone else, so the command is dead by then. The same stop (SIGTERM, then SIGKILL after the grace)
happens at once when the lock is lost, when kafka-lock dies (even by SIGKILL), and, for whatever
the command leaves running, when the command itself ends. 'Every process the command started' is
its process group and every descendant that left it (setsid, double fork): kafka-lock and the
supervisor are both child subreapers, so orphans are re-parented to them, not to init. The lock is
released only once all of them are gone. If the supervisor dies, kafka-lock stops everything the
same way, then releases the lock and exits 71.

What can escape: processes started through another service (systemd-run, at, ssh, docker exec),
which are not the command's descendants; processes running as another user (sudo, setuid
programs), which kafka-lock may not signal (it waits for them, but after a loss they run on
without the lock); everything the command started, if kafka-lock and the supervisor are both
SIGKILLed at once (the broker then gives the lock to another member after the session timeout;
the fencing token still tells them apart); and the timing, if the supervisor itself is stopped or
starved of CPU for longer than --lease-margin minus --kill-grace. kafka-lock is built for Linux
only. Being in its own process group, the command cannot read from the terminal.

Signals: SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1 and SIGUSR2 sent to kafka-lock are passed on to
the command's process group while it runs, and the lock is released once everything it started is
gone; while waiting for the lock they make kafka-lock leave the group and exit 128+N; during the
final release they cut it short (the broker then frees the lock after the session timeout).
SIGPIPE is ignored (a stderr whose reader is gone shows as EPIPE, which kafka-lock survives).
Other terminating signals end kafka-lock at once; the supervisor then stops the command as it does
when kafka-lock is killed.

Output: --events json lines, logs and the terminal status line go to stderr through a bounded
buffer; if stderr is not read fast enough, lines are dropped rather than delaying the lock, events
then carry a 'dropped' count, and the last line reports it. --events-file PATH or --events-fd N
send the events (JSON lines, as --events json) there instead, through a buffer of their own, so
they never mix with the command's output; a FIFO nobody reads yet does not hold kafka-lock up.
Every event carries its schema version (v, 1); kafka-lock's own failures are events too (failed),
and the last event (exit) says whose exit status kafka-lock exits with: the command's or its own.
The schema: docs/events.md.

Exit status: the command's (128+N if signal N ended it); 75 not acquired within --wait (or the
status -E gives); 74 lock lost while the command ran, or its checkpoint not stored (or
--lost-exit-code); 69 the cluster cannot be reached or answered something invalid; 78 a setting is
invalid or the broker rejected it (including an events target or metrics address that cannot be
used); 71 the system refused something kafka-lock needs or the supervisor died; 64 usage error, or
a nested kafka-lock run of the lock the calling command already holds (it would wait for itself
forever); 126/127 the command cannot be run; 128+N if signal N arrived while waiting for the lock.

Environment: every flag can also be set by a variable, --flag-name by KAFKA_LOCK_FLAG_NAME (for
example KAFKA_LOCK_LOCK, KAFKA_LOCK_SESSION_TIMEOUT); a flag on the command line wins, and an
empty variable counts as unset. The command inherits them like any other variable. The variables
kafka-lock sets for the command (KAFKA_LOCK_NAME, KAFKA_LOCK_TOKEN, KAFKA_LOCK_GENERATION,
KAFKA_LOCK_MEMBER_ID, KAFKA_LOCK_CHECKPOINT, KAFKA_LOCK_CHECKPOINT_FILE) are never read as
settings.

Metrics: --metrics-listen 127.0.0.1:9464 serves the lock's metrics (acquisition latency, held,
hold lengths, rebalances while held, losses by reason) in Prometheus text format at /metrics, from
before the lock is requested until kafka-lock exits; port 0 picks a free port, which the
metrics_listening event names. The names: docs/metrics.md.

Durations: 500ms, 10s, 2m, 1h30m; timeouts at most 24 days (Kafka's limit), --wait at most 365
days. Set KAFKA_LOCK_LOG=debug for a log of the protocol on stderr.";

const AFTER_STATUS_HELP: &str = "\
status reads the group with DescribeGroups and never joins it, so looking does not disturb the
lock.

Exit status, for scripts (3 and 4 are the LSB init scripts' 'not running' and 'unknown'):
  0   the lock is held (the holder is shown)
  3   the lock is free: nobody holds it (also a group that does not exist, or one whose members
      were not given the lock yet)
  4   unknown: the broker does not report member assignments (tansu, for one), the group is
      between generations, or another application uses the group id
  69  the cluster cannot be reached or answered something invalid
  78  a setting is invalid or the broker rejected it
  64  usage error

Every flag can also be set by a variable, --flag-name by KAFKA_LOCK_FLAG_NAME (--json by
KAFKA_LOCK_JSON=1).";

#[derive(Debug, Parser)]
#[command(
    name = "kafka-lock",
    version,
    about = "A distributed lock with fencing tokens on a Kafka cluster's consumer-group protocol",
    propagate_version = true,
    subcommand_required = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Built once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run a command while holding the lock; stop it if the lock is lost.
    #[command(after_help = AFTER_RUN_HELP)]
    Run(RunArgs),
    /// Show the lock's holder and waiters (and, with a ledger, its last holder and checkpoint);
    /// the exit status says held (0), free (3) or unknown (4).
    #[command(after_help = AFTER_STATUS_HELP)]
    Status(StatusArgs),
    /// Show who held the lock, when, for how long, and how each hold ended (needs a ledger).
    #[command(after_help = history::AFTER_HELP)]
    History(HistoryArgs),
    /// Print a shell completion script on stdout.
    #[command(hide = true)]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print a man page (roff) on stdout: kafka-lock(1), or kafka-lock-run(1) or
    /// kafka-lock-status(1).
    #[command(hide = true)]
    Manpage {
        /// The subcommand whose page to print; the main page without it.
        page: Option<generate::Page>,
    },
}

#[derive(Debug, Args)]
struct Target {
    /// Kafka brokers to start from.
    #[arg(
        long,
        env = "KAFKA_LOCK_BOOTSTRAP",
        value_name = "HOST:PORT[,HOST:PORT...]"
    )]
    bootstrap: String,
    /// The lock's name; it is the Kafka consumer group id.
    #[arg(long, value_name = "NAME")]
    lock: String,
    /// Timeout of each request to a broker [default: 5s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    request_timeout: Option<Duration>,
    /// Timeout of each connection attempt (TCP plus version handshake) [default: 10s]. An
    /// unreachable cluster is reported after three rounds over the bootstrap list.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    connect_timeout: Option<Duration>,
    /// Client id in request headers and member ids.
    #[arg(long, value_name = "ID", default_value = "kafka-lock", hide = true)]
    client_id: String,
    /// The lock's ledger: a topic with exactly one partition (shared by any number of locks)
    /// whose record offsets are the fencing tokens, and where the lock's history and a copy of
    /// its checkpoint are kept. kafka-lock never creates it; see `kafka-lock history --help`.
    #[arg(long, env = "KAFKA_LOCK_LEDGER_TOPIC", value_name = "TOPIC")]
    ledger_topic: Option<String>,
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    target: Target,
    /// Consumer-compatible mode: share the lock with Kafka consumers of group NAME on this
    /// topic, which must have exactly one partition (holding partition 0 is holding the lock).
    /// kafka-lock offers cooperative-sticky first, so a holder keeps partition 0 through
    /// rebalances with members that speak it too (Java's default assignors do); if the group
    /// settles on range or roundrobin (eager), any rebalance ends the hold, which stops the
    /// command (status 74).
    #[arg(long, value_name = "TOPIC")]
    topic: Option<String>,
    /// Give up (status 75) if the lock is not held within this time; 0 makes one try.
    /// [default: wait forever]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    wait: Option<Duration>,
    /// How long the broker keeps a silent member, so how long a crashed holder blocks the lock.
    /// [default: 10s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    session_timeout: Option<Duration>,
    /// Time between heartbeats. [default: 1s, or a third of the lease if that is shorter]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    heartbeat_interval: Option<Duration>,
    /// How long the broker waits for members to rejoin a rebalance. [default: the session timeout]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    rebalance_timeout: Option<Duration>,
    /// The lease ends this long before the broker could expire us: after the last renewal, the
    /// lock counts as held for the smaller of the session and rebalance timeouts minus this.
    /// Must be at least --kill-grace, so the command is dead before the broker could give the
    /// lock away. [default: the larger of the kill grace and min(1s, a quarter of the smaller of
    /// the session and rebalance timeouts)]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    lease_margin: Option<Duration>,
    /// Time between SIGTERM and SIGKILL when the command is stopped (lease end, loss, exit of
    /// kafka-lock); at most --lease-margin. [default: 2s, or a fifth of the smaller of the
    /// session and rebalance timeouts if that is shorter]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    kill_grace: Option<Duration>,
    /// Who we are, shown to waiters and by `status`. [default: "<hostname> pid <pid>"]
    #[arg(long, value_name = "TEXT")]
    label: Option<String>,
    /// The longest checkpoint the command may write, in bytes: the brokers'
    /// offset.metadata.max.bytes, which is 4096 unless they are configured otherwise.
    #[arg(long, value_name = "BYTES", default_value_t = kafka_lock::lock::DEFAULT_CHECKPOINT_MAX_BYTES)]
    checkpoint_max_bytes: usize,
    /// Print one JSON object per line on stderr for waiting, acquired, token_changed,
    /// child_started, lost, child_exited, checkpoint, released, failed and exit (docs/events.md).
    #[arg(long, value_name = "FORMAT")]
    events: Option<EventsFormat>,
    /// Write the events (as --events json) to this file instead of stderr: appended, created if
    /// missing. A FIFO is fine: kafka-lock does not wait for its reader.
    #[arg(long, value_name = "PATH", conflicts_with = "events_fd")]
    events_file: Option<PathBuf>,
    /// Write the events (as --events json) to this open file descriptor instead of stderr, e.g.
    /// 3 with `3>>events.jsonl`; the command does not inherit it (unless it is 0, 1 or 2).
    #[arg(long, value_name = "FD", value_parser = clap::value_parser!(i32).range(0..))]
    events_fd: Option<i32>,
    /// Exit with N instead of 75 when the lock is not acquired (as flock -E), to tell that
    /// apart from the command's own statuses; 0 makes a busy lock a quiet success.
    #[arg(short = 'E', long, value_name = "N")]
    conflict_exit_code: Option<u8>,
    /// Exit with N (1 to 255) instead of 74 when the lock is lost while the command runs.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..))]
    lost_exit_code: Option<u8>,
    /// Serve the lock's metrics in Prometheus text format at http://ADDRESS/metrics while
    /// kafka-lock runs (e.g. 127.0.0.1:9464; port 0 picks a free one).
    #[arg(long, value_name = "ADDRESS")]
    metrics_listen: Option<SocketAddr>,
    /// The command to run while holding the lock, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum EventsFormat {
    Json,
}

#[derive(Debug, Args)]
struct StatusArgs {
    #[command(flatten)]
    target: Target,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct HistoryArgs {
    #[command(flatten)]
    target: Target,
    /// Only holds that were running at this time or later: a duration before now (24h, 7d) or
    /// a time (2026-11-30T02:00:00Z, 2026-11-30 02:00:00 in UTC).
    #[arg(long, value_name = "DURATION|TIME")]
    since: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// A duration too large to represent becomes `Duration::MAX`, which every range check refuses
/// with exit status 78 (a setting out of range) rather than 64 (a malformed command line).
fn parse_duration(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s.trim()) {
        Ok(d) => Ok(d),
        Err(humantime::DurationError::NumberOverflow) => Ok(Duration::MAX),
        Err(e) => Err(format!("{e} (write durations like 500ms, 10s, 2m)")),
    }
}

/// How long kafka-lock waits at exit for stderr to take its last lines.
const FLUSH_BOUND: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    // Not `args()`: that panics on an argument that is not UTF-8.
    let argv: Vec<OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == supervise::MODE) {
        return supervise::main(argv);
    }
    let status = cli(argv);
    if output::events_apart() {
        let dropped = output::events_dropped();
        if dropped > 0 {
            exit::print_line(&format!(
                "{dropped} events were dropped because their file or descriptor was not read fast enough"
            ));
        }
    }
    let dropped = output::dropped();
    if dropped > 0 {
        exit::print_line(&format!(
            "{dropped} lines of kafka-lock's output were dropped because stderr was not read fast enough"
        ));
    }
    output::flush(FLUSH_BOUND);
    ExitCode::from(status)
}

fn cli(argv: Vec<OsString>) -> u8 {
    let (cli, from_env) = match environ::parse::<Cli>(&argv) {
        Ok(parsed) => parsed,
        Err(e) => return usage(e, &argv),
    };
    // Before anything else runs: a descriptor is taken while no other thread exists.
    let done = match &cli.command {
        Command::Run(a) => events_target(a).map(|t| {
            if let Some(t) = t {
                output::set_events(t);
            }
            None
        }),
        Command::Completions { shell } => Ok(Some(generate::print(&generate::completions(
            *shell,
            docs_command(),
        )))),
        Command::Manpage { page } => Ok(Some(
            generate::manpage(*page, docs_command()).and_then(|text| generate::print(&text)),
        )),
        Command::Status(_) | Command::History(_) => Ok(None),
    };
    match done {
        Ok(None) => {}
        Ok(Some(Ok(status))) => return status,
        Ok(Some(Err(f))) | Err(f) => {
            let f = environ::annotate(f, &from_env);
            f.print();
            return f.status;
        }
    }
    init_log();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let f = Failure::new(exit::OSERR, format!("cannot start the async runtime: {e}"));
            f.print();
            return f.status;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(a) => run::run(run_config(a, from_env)).await,
            Command::Status(a) => status(a).await.map_err(|f| environ::annotate(f, &from_env)),
            Command::History(a) => history(a)
                .await
                .map_err(|f| environ::annotate(f, &from_env)),
            Command::Completions { .. } | Command::Manpage { .. } => Ok(0),
        }
    });
    // Background tasks (a session still leaving after a bounded or interrupted release) end with
    // the runtime; a blocking task (a name lookup) must not hold the exit.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(status) => status,
        Err(f) => {
            f.print();
            f.status
        }
    }
}

async fn status(a: StatusArgs) -> Result<u8, Failure> {
    let request = a
        .target
        .request_timeout
        .unwrap_or(kafka_lock::lock::DEFAULT_REQUEST_TIMEOUT);
    let connect = a
        .target
        .connect_timeout
        .unwrap_or(kafka_lock::driver::DEFAULT_CONNECT_TIMEOUT);
    run::in_range("--request-timeout", request, run::TIMEOUT_BOUND, false)?;
    run::in_range("--connect-timeout", connect, run::TIMEOUT_BOUND, false)?;
    status::status(status::StatusConfig {
        bootstrap: a.target.bootstrap,
        lock: a.target.lock,
        json: a.json,
        request_timeout: request,
        connect_timeout: connect,
        client_id: a.target.client_id,
        ledger_topic: a.target.ledger_topic,
    })
    .await
}

async fn history(a: HistoryArgs) -> Result<u8, Failure> {
    let request = a
        .target
        .request_timeout
        .unwrap_or(kafka_lock::lock::DEFAULT_REQUEST_TIMEOUT);
    let connect = a
        .target
        .connect_timeout
        .unwrap_or(kafka_lock::driver::DEFAULT_CONNECT_TIMEOUT);
    run::in_range("--request-timeout", request, run::TIMEOUT_BOUND, false)?;
    run::in_range("--connect-timeout", connect, run::TIMEOUT_BOUND, false)?;
    let Some(ledger_topic) = a.target.ledger_topic else {
        return Err(Failure::new(
            exit::USAGE,
            "history is read from the lock's ledger: give --ledger-topic (or $KAFKA_LOCK_LEDGER_TOPIC); see `kafka-lock history --help`",
        ));
    };
    let since = match &a.since {
        Some(s) => Some(history::parse_since(s, std::time::SystemTime::now())?),
        None => None,
    };
    history::history(history::HistoryConfig {
        bootstrap: a.target.bootstrap,
        lock: a.target.lock,
        ledger_topic,
        since,
        json: a.json,
        request_timeout: request,
        connect_timeout: connect,
        client_id: a.target.client_id,
    })
    .await
}

/// The events' own target, if --events-file or --events-fd asks for one.
fn events_target(a: &RunArgs) -> Result<Option<output::Target>, Failure> {
    match (&a.events_file, a.events_fd) {
        (Some(path), _) => sink::open_file(path).map(Some),
        (None, Some(fd)) => sink::take_fd(fd).map(Some),
        (None, None) => Ok(None),
    }
}

/// The command line's definition for completions and man pages: with every flag's variable,
/// but not the values they have here.
fn docs_command() -> clap::Command {
    environ::with_env(Cli::command(), true)
}

fn run_config(a: RunArgs, from_env: FromEnv) -> run::RunConfig {
    run::RunConfig {
        bootstrap: a.target.bootstrap,
        lock: a.target.lock,
        topic: a.topic,
        wait: a.wait,
        session_timeout: a.session_timeout,
        heartbeat_interval: a.heartbeat_interval,
        rebalance_timeout: a.rebalance_timeout,
        request_timeout: a.target.request_timeout,
        connect_timeout: a.target.connect_timeout,
        lease_margin: a.lease_margin,
        kill_grace: a.kill_grace,
        label: a.label,
        client_id: a.target.client_id,
        ledger_topic: a.target.ledger_topic,
        checkpoint_max_bytes: a.checkpoint_max_bytes,
        // --events-file and --events-fd imply it: JSON lines are the one format.
        events_json: a.events == Some(EventsFormat::Json)
            || a.events_file.is_some()
            || a.events_fd.is_some(),
        conflict_exit_code: a.conflict_exit_code,
        lost_exit_code: a.lost_exit_code,
        metrics_listen: a.metrics_listen,
        from_env,
        command: a.command,
    }
}

/// Help and version go to stdout with status 0; every other parse error is one line on stderr
/// and status 64, like the rest of kafka-lock's own failures.
fn usage(e: clap::Error, argv: &[OsString]) -> u8 {
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        // A closed stdout loses the text, not the status.
        let _ = e.print();
        return 0;
    }
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let f = Failure::new(
            exit::USAGE,
            "no subcommand given: use `kafka-lock run ... -- COMMAND` or `kafka-lock status ...`; see `kafka-lock --help`",
        );
        f.print();
        return f.status;
    }
    let rendered = e.render().to_string();
    let mut parts = Vec::new();
    for line in rendered.lines() {
        let line = line.trim();
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if let Some(tip) = line.strip_prefix("tip: ") {
            parts.push(format!("; {tip}"));
        } else if !line.is_empty() {
            parts.push(format!(" {}", line.strip_prefix("error: ").unwrap_or(line)));
        }
    }
    let mut what = parts.concat().trim().to_owned();
    if what.is_empty() {
        what = "invalid command line".to_owned();
    }
    let mut what = what.trim_end_matches(':').to_owned();
    if let Some(note) = environ::usage_note(&e, argv) {
        what.push_str(&format!(" ({note})"));
    }
    let help = match argv.get(1).map(|a| a.as_bytes()) {
        Some(b"run") => "kafka-lock run --help",
        Some(b"status") => "kafka-lock status --help",
        Some(b"history") => "kafka-lock history --help",
        _ => "kafka-lock --help",
    };
    let f = Failure::new(exit::USAGE, format!("{what}; see `{help}`"));
    f.print();
    f.status
}

/// Logs only when asked: kafka-lock's stderr is shared with the command and, with
/// `--events json`, read by programs.
fn init_log() {
    let Ok(filter) = std::env::var("KAFKA_LOCK_LOG") else {
        return;
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(output::LogWriter)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn durations_too_large_to_represent_become_the_largest_one() {
        assert_eq!(
            parse_duration("300000000000y"),
            Ok(Duration::from_secs(300_000_000_000 * 31_557_600))
        );
        assert_eq!(
            parse_duration("99999999999999999999999y"),
            Ok(Duration::MAX)
        );
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("").is_err());
    }

    /// Every flag of every subcommand has its variable, named after it, and none is one of the
    /// variables kafka-lock sets for the command.
    #[test]
    fn every_flag_has_its_kafka_lock_variable() {
        fn walk(cmd: &clap::Command, path: &str, found: &mut Vec<(String, String)>) {
            for arg in cmd.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                if matches!(long, "help" | "version") {
                    continue;
                }
                let env = arg
                    .get_env()
                    .unwrap_or_else(|| panic!("{path} --{long} has no variable"));
                found.push((
                    format!("{path} --{long}"),
                    env.to_string_lossy().into_owned(),
                ));
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), found);
            }
        }
        let mut found = Vec::new();
        walk(&docs_command(), "kafka-lock", &mut found);
        for (flag, var) in &found {
            let long = flag.rsplit_once("--").map(|(_, l)| l).unwrap_or_default();
            assert_eq!(var, &environ::var_for(long), "{flag}");
            assert!(
                !environ::OUTPUTS.contains(&var.as_str()),
                "{flag} reads {var}"
            );
        }
        let vars: Vec<&str> = found.iter().map(|(_, v)| v.as_str()).collect();
        for v in [
            "KAFKA_LOCK_BOOTSTRAP",
            "KAFKA_LOCK_LOCK",
            "KAFKA_LOCK_SESSION_TIMEOUT",
            "KAFKA_LOCK_EVENTS_FILE",
            "KAFKA_LOCK_CONFLICT_EXIT_CODE",
            "KAFKA_LOCK_METRICS_LISTEN",
            "KAFKA_LOCK_JSON",
            "KAFKA_LOCK_CLIENT_ID",
        ] {
            assert!(vars.contains(&v), "{v} missing from {vars:?}");
        }
    }

    #[test]
    fn usage_errors_with_arguments_that_are_not_utf8_do_not_panic() {
        use std::os::unix::ffi::OsStringExt;
        let argv = vec![
            OsString::from("kafka-lock"),
            OsString::from_vec(b"r\xffn".to_vec()),
            OsString::from_vec(b"--\xfe".to_vec()),
        ];
        let e = Cli::try_parse_from(&argv).expect_err("not a command line");
        assert_eq!(usage(e, &argv), exit::USAGE);
    }

    proptest! {
        #[test]
        fn parse_duration_never_panics(s in "\\PC{0,40}") {
            let _ = parse_duration(&s);
        }

        #[test]
        fn parse_duration_of_numbers_and_units_never_panics(n in "[0-9]{1,30}", unit in "(ns|us|ms|s|m|h|d|w|M|y)") {
            let _ = parse_duration(&format!("{n}{unit}"));
        }
    }
}

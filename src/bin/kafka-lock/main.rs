//! `kafka-lock`: run a command while holding a lock on a Kafka cluster, or show who holds one.
//!
//! ```text
//! kafka-lock run --bootstrap HOST:PORT[,...] --lock NAME [options] -- COMMAND [ARGS...]
//! kafka-lock status --bootstrap HOST:PORT[,...] --lock NAME [--json]
//! ```
//!
//! It runs on a current-thread tokio runtime: one lock, one child and a few timers need no thread
//! pool, a single thread keeps the footprint small, and it is what lets the child be tied to the
//! process with PR_SET_PDEATHSIG (see `sys::die_with_parent`).
//!
//! Exit statuses: the command's own (128+N when signal N ended it); 75 not acquired within
//! `--wait`; 74 lost while the command ran; 69 cluster unreachable or answering nonsense; 78
//! invalid setting or one the broker rejects; 64 usage; 126/127 the command cannot be run.

#![deny(unsafe_code)]

mod exit;
mod json;
mod report;
mod run;
mod status;
mod sys;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::exit::Failure;

const AFTER_RUN_HELP: &str = "\
The command starts only once the lock is held, in its own process group, with KAFKA_LOCK_NAME,
KAFKA_LOCK_TOKEN (the fencing token: the group generation, in decimal) and KAFKA_LOCK_MEMBER_ID in
its environment. The token is the one at the start: a rebalance while holding (another member
joining) moves it to a higher generation, reported as token_changed by --events json; a resource
that accepts any token at least as high as the highest it has seen keeps accepting the first one.
If the lock is lost while the command runs, its process group gets SIGTERM, then SIGKILL after
--kill-grace; no second command is started. SIGINT and SIGTERM sent to kafka-lock are passed on to
the command; the lock is released once it has ended. If kafka-lock itself is killed, the command is
killed with it (Linux). Being in its own process group, the command cannot read from the terminal.

Exit status: the command's (128+N if signal N ended it); 75 not acquired within --wait; 74 lock
lost while the command ran; 69 the cluster cannot be reached or answered something invalid; 78 a
setting is invalid or the broker rejected it; 64 usage error; 126/127 the command cannot be run;
128+N if signal N arrived while waiting for the lock.

Durations: 500ms, 10s, 2m, 1h30m. Set KAFKA_LOCK_LOG=debug for a log of the protocol on stderr.";

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

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a command while holding the lock; stop it if the lock is lost.
    #[command(after_help = AFTER_RUN_HELP)]
    Run(RunArgs),
    /// Show the lock's holder and waiters.
    Status(StatusArgs),
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
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    target: Target,
    /// Consumer-compatible mode: share the lock with Kafka consumers of group NAME on this
    /// topic, which must have exactly one partition (holding partition 0 is holding the lock).
    /// Eager, like those consumers: any rebalance (another member joining) ends the hold, which
    /// stops the command (status 74).
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
    /// [default: the larger of the kill grace and min(1s, a quarter of the session timeout), so
    /// the command is dead before the broker could give the lock away]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    lease_margin: Option<Duration>,
    /// After a loss, time between SIGTERM and SIGKILL to the command; must be shorter than the
    /// session timeout. [default: 2s, or a fifth of the session timeout if that is shorter]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    kill_grace: Option<Duration>,
    /// Who we are, shown to waiters and by `status`. [default: "<hostname> pid <pid>"]
    #[arg(long, value_name = "TEXT")]
    label: Option<String>,
    /// Print one JSON object per line on stderr for waiting, acquired, token_changed,
    /// child_started, lost, child_exited and released.
    #[arg(long, value_name = "FORMAT")]
    events: Option<EventsFormat>,
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

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e} (write durations like 500ms, 10s, 2m)"))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage(e),
    };
    init_log();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let f = Failure::new(exit::OSERR, format!("cannot start the async runtime: {e}"));
            f.print();
            return ExitCode::from(f.status);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(a) => run::run(run_config(a)).await,
            Command::Status(a) => {
                status::status(status::StatusConfig {
                    bootstrap: a.target.bootstrap,
                    lock: a.target.lock,
                    json: a.json,
                    request_timeout: a
                        .target
                        .request_timeout
                        .unwrap_or(kafka_lock::lock::DEFAULT_REQUEST_TIMEOUT),
                    connect_timeout: a
                        .target
                        .connect_timeout
                        .unwrap_or(kafka_lock::driver::DEFAULT_CONNECT_TIMEOUT),
                    client_id: a.target.client_id,
                })
                .await
            }
        }
    });
    // Background tasks (a session still leaving after a bounded wait) end with the runtime.
    drop(runtime);
    match result {
        Ok(status) => ExitCode::from(status),
        Err(f) => {
            f.print();
            ExitCode::from(f.status)
        }
    }
}

fn run_config(a: RunArgs) -> run::RunConfig {
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
        events_json: a.events == Some(EventsFormat::Json),
        command: a.command,
    }
}

/// Help and version go to stdout with status 0; every other parse error is one line on stderr
/// and status 64, like the rest of kafka-lock's own failures.
fn usage(e: clap::Error) -> ExitCode {
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let f = Failure::new(
            exit::USAGE,
            "no subcommand given: use `kafka-lock run ... -- COMMAND` or `kafka-lock status ...`; see `kafka-lock --help`",
        );
        f.print();
        return ExitCode::from(f.status);
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
    let what = what.trim_end_matches(':').to_owned();
    let help = match std::env::args().nth(1).as_deref() {
        Some(sub @ ("run" | "status")) => format!("kafka-lock {sub} --help"),
        _ => "kafka-lock --help".to_owned(),
    };
    let f = Failure::new(exit::USAGE, format!("{what}; see `{help}`"));
    f.print();
    ExitCode::from(f.status)
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
        .with_writer(std::io::stderr)
        .try_init();
}

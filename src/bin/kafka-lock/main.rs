//! `kafka-lock`: run a command while holding a lock on a Kafka cluster, or show who holds one.
//!
//! ```text
//! kafka-lock run --bootstrap HOST:PORT[,...] --lock NAME [options] -- COMMAND [ARGS...]
//! kafka-lock status --bootstrap HOST:PORT[,...] --lock NAME [--ledger-topic T] [--json]
//! kafka-lock history --bootstrap HOST:PORT[,...] --lock NAME --ledger-topic T [--since S] [--json]
//! kafka-lock elect --bootstrap HOST:PORT[,...] --lock NAME [run's options] -- COMMAND [ARGS...]
//! kafka-lock observe --bootstrap HOST:PORT[,...] --lock NAME [--ledger-topic T] [--json]
//! kafka-lock completions bash|zsh|fish|elvish|powershell     (hidden)
//! kafka-lock manpage [run|status|elect|observe]               (hidden)
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
//! `--lost-exit-code` replace 75 and 74. 77 the cluster refused the credentials or an operation,
//! or the secured connection could not be made. `status`: 0 held, 3 free, 4 unknown, 69, 77, 78,
//! 64.

#![deny(unsafe_code)]

mod elect;
mod environ;
mod exit;
mod generate;
mod history;
mod hold;
mod json;
mod link;
mod observe;
mod output;
mod proto;
mod report;
mod run;
mod serve;
mod settings;
mod sink;
mod status;
mod supervise;
mod sys;
mod trace;
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

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

use crate::environ::FromEnv;
use crate::exit::Failure;

const AFTER_RUN_HELP: &str = "\
The command starts only once the lock is held, with KAFKA_LOCK_NAME, KAFKA_LOCK_TOKEN (the fencing
token, in decimal), KAFKA_LOCK_GENERATION, KAFKA_LOCK_MEMBER_ID and KAFKA_LOCK_PERMIT (the permit
slot, 0 unless --permits is above 1) in its environment. With
--ledger-topic the token is the offset of this hold's ACQUIRED record in the ledger: it never goes
backwards, whatever happens to the group. Without one it is the group generation, which starts
again at 1 when the group is deleted (by an administrator, or by the broker 0-10 minutes after it
was left empty with no committed offsets). A rebalance while holding (another member joining)
moves the generation on, reported as token_changed by --events json; with a ledger the token stays.

Checkpoint (needs --ledger-topic): KAFKA_LOCK_CHECKPOINT holds the lock's last checkpoint, if it
has one (one that holds a NUL or is over 64 KiB is in the file named by
KAFKA_LOCK_LAST_CHECKPOINT_FILE instead, and a warning says so), and KAFKA_LOCK_CHECKPOINT_FILE
names a regular file (in a directory of kafka-lock's own; a FIFO, device or link is refused) that the
command may write. If the command exits 0 and the file exists, kafka-lock stores its content
(UTF-8 without NUL, at most --checkpoint-max-bytes) as the new checkpoint before it releases the lock: an
OffsetCommit carrying the hold's generation and member id, which the broker rejects if this holder
is no longer the current one, then copied into the ledger; it counts as stored only once both are
acknowledged. A rejected or failed commit is status 74; content that is too long or not UTF-8 is
status 78. Either way the lock's checkpoint stays the previous one, unless the hold ended before
the broker answered, or the broker took the commit but the ledger refused the copy (status 74):
then it may or may not be read back, and the message says so.
When the group has no checkpoint (deleted, or its offsets expired), the ledger's copy is looked
for among the ledger's last 32768 records only; `kafka-lock history` reads them all.

What stops the command. kafka-lock starts a supervisor process (itself, re-executed, in a process
group of its own) while it waits for the lock, and the supervisor starts the command, in a process
group of its own, only once the lock is held and kafka-lock has told it the lease end. The
supervisor owns the lease end, which kafka-lock moves forward at each renewal: at the lease end it
sends SIGTERM to every process the command started, and SIGKILL after --kill-grace, unless the
lease was renewed by then. Nothing that blocks or pauses kafka-lock itself (a stderr nobody reads,
SIGSTOP) delays that. The lease ends --lease-margin (at least --kill-grace) before the broker could
give the lock to anyone else, so the command is dead by then. The same stop (SIGTERM, then SIGKILL
after the grace) happens at once when the lock is lost, when kafka-lock dies (even by SIGKILL),
and, for whatever the command leaves running, when the command itself ends. 'Every process the
command started' is its process group and every descendant that left it (setsid, double fork):
kafka-lock and the supervisor are both child subreapers, so orphans are re-parented to them, not to
init. The lock is released only once all of them are gone. If the supervisor dies, kafka-lock stops
everything the same way, then releases the lock and exits 71.

What can escape: processes started through another service (systemd-run, at, ssh, docker exec),
which are not the command's descendants; processes running as another user (sudo, setuid
programs), which kafka-lock may not signal (it waits for them, but after a loss they run on
without the lock); everything the command started, if kafka-lock and the supervisor are both
SIGKILLed at once (the broker then gives the lock to another member after the session timeout;
the fencing token still tells them apart); and the timing, if the supervisor itself is stopped or
starved of CPU for longer than --lease-margin minus --kill-grace. kafka-lock is built for Linux
only.

The terminal: when kafka-lock runs in the foreground of a terminal (stdin), the command's process
group is made the terminal's foreground group while it runs, as a shell does for a job: it can
read the terminal, and Ctrl-C reaches it directly (kafka-lock then releases the lock once it is
gone). kafka-lock takes the terminal back when the command ends.

Signals: SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1 and SIGUSR2 sent to kafka-lock are passed on to
the command's process group while it runs, and the lock is released once everything it started is
gone; a command still running --kill-grace after a SIGTERM gets SIGKILL; while waiting for the lock they make kafka-lock leave the group and exit 128+N; during the
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
--lost-exit-code); 69 the cluster (or the OAuth token endpoint) cannot be reached or answered something invalid; 77 the cluster
refused the credentials or an operation (an ACL), or the secured connection could not be made (a
TLS listener reached without TLS or the other way round, an unknown CA, a certificate for another
host); 78 a setting is invalid or the broker rejected it (including an events target or metrics
address that cannot be used); 71 the system refused something kafka-lock needs or the supervisor died; 64 usage error, or
a nested kafka-lock run of the lock the calling command already holds (it would wait for itself
forever); 126/127 the command cannot be run; 128+N if signal N arrived while waiting for the lock.

Environment: every flag can also be set by a variable, --flag-name by KAFKA_LOCK_FLAG_NAME (for
example KAFKA_LOCK_LOCK, KAFKA_LOCK_SESSION_TIMEOUT); a flag on the command line wins, and an
empty variable counts as unset. The command inherits them like any other variable, except the
KAFKA_LOCK_X_<KEY> of a secret (sasl.password, sasl.jaas.config, ssl.key.pem, ...): those reach
neither the supervisor nor the command, and both kafka-lock processes are non-dumpable, so the
command cannot read them from /proc either (docs/cli.md, What the command can see). The variables
kafka-lock sets for the command (KAFKA_LOCK_NAME, KAFKA_LOCK_TOKEN, KAFKA_LOCK_GENERATION,
KAFKA_LOCK_MEMBER_ID, KAFKA_LOCK_PERMIT, KAFKA_LOCK_CHECKPOINT, KAFKA_LOCK_CHECKPOINT_FILE,
KAFKA_LOCK_LAST_CHECKPOINT_FILE) are never read as settings.

Kafka client settings: --config-file FILE reads a client.properties (Java properties: the file
Kafka's own tools take), -X key=value sets one key, and KAFKA_LOCK_X_<KEY> sets one from the
environment (KAFKA_LOCK_X_SASL_PASSWORD for sasl.password: keep secrets off the command line).
bootstrap.servers, security.protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), sasl.mechanism
(PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), sasl.username, sasl.password, sasl.jaas.config,
ssl.ca.location, ssl.certificate.location, ssl.key.location, ssl.endpoint.identification.algorithm
and the group timeouts are applied; producer and consumer keys that mean nothing for a lock are
ignored with a warning; unknown keys are an error. The command line beats the environment, which
beats the file; within each, a dedicated flag (--bootstrap, --session-timeout) beats the same
setting as a key. Every key, and the ACLs a lock needs: docs/cli.md and the README.

Metrics: --metrics-listen 127.0.0.1:9464 serves the lock's metrics (acquisition latency, held,
hold lengths, rebalances while held, losses by reason) in Prometheus text format at /metrics, from
before the lock is requested until kafka-lock exits; port 0 picks a free port, which the
metrics_listening event names. The names: docs/metrics.md.

Durations: 500ms, 10s, 2m, 1h30m; timeouts at most 24 days (Kafka's limit), --wait at most 365
days. Set KAFKA_LOCK_LOG=debug for a log of the protocol on stderr.";

const AFTER_ELECT_HELP: &str = "\
Each term is what `kafka-lock run` does (see `kafka-lock run --help`): the command starts once this
process leads, with the same environment, lease, supervisor, fencing token and stop. When the
command ends (whatever its status), is stopped at the lease end, or leadership is lost, kafka-lock
releases the lock and campaigns again: another candidate usually takes over, since the one that
left rejoins at the back of the queue. A term shorter than --min-term delays the next campaign by
--min-term, doubling with each further short term up to 60s (a command that fails at once does
not churn the group); --max-terms N stops after N terms with the last command's status.

Signals: SIGINT or SIGTERM stop the election: while campaigning, kafka-lock leaves the group and
exits 0; during a term, the signal goes to the command, the lock is released once everything it
started is gone, and kafka-lock exits 0. Other signals are handled as `run` handles them. --events
json adds term_ended after each term (docs/events.md).

Exit status: 0 when stopped by SIGINT or SIGTERM; with --max-terms, the last command's status; 69
if the cluster cannot be reached before the first term (later it keeps campaigning); 78, 71, 64,
126, 127 as for run.";

const AFTER_OBSERVE_HELP: &str = "\
observe never joins the group, so it never causes a rebalance. Without --ledger-topic (or with
--poll) it sends one DescribeGroups to the group coordinator per --interval and reports a change
at most one interval after the group settled on a new leader. With --ledger-topic it follows the
ledger instead: one Fetch parked at the partition's leader for up to 5s at a time, nothing at the
coordinator, and a new leader is reported as soon as its ACQUIRED record is written, before it
uses the lock; a leader that dies without a successor stays reported there until the next one.

The first line is the leadership as it is (which may be unknown while the group rebalances);
each later line is a change of leader, or to none. --json prints one object per line (the
`leader` object of docs/events.md). observe exits 0 on SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1
or SIGUSR2 or when stdout is closed; 69 if the cluster cannot be reached at the start (later it
keeps trying), 78 for a setting the broker rejects, 64 usage.";

const AFTER_STATUS_HELP: &str = "\
status reads the group with DescribeGroups and never joins it, so looking does not disturb the
lock.

Exit status, for scripts (3 and 4 are the LSB init scripts' 'not running' and 'unknown'):
  0   the lock is held (the holder is shown)
  3   the lock is free: nobody holds it (also a group that does not exist, or one whose members
      were not given the lock yet)
  4   unknown: the broker does not report member assignments (tansu, for one), the group is
      between generations, or another application uses the group id
  69  the cluster (or the OAuth token endpoint) cannot be reached or answered something invalid
  77  the cluster refused the credentials or the lookup (grant Describe on the group), or the
      secured connection could not be made
  78  a setting is invalid or the broker rejected it
  64  usage error

Every flag can also be set by a variable, --flag-name by KAFKA_LOCK_FLAG_NAME (--json by
KAFKA_LOCK_JSON=1). Kafka client settings (TLS, SASL) come from --config-file, -X key=value and
KAFKA_LOCK_X_<KEY> variables, as for run (see kafka-lock run --help).";

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
    #[command(after_help = history::after_help())]
    History(HistoryArgs),
    /// Leader election: run the command while this process leads (holds the lock), then
    /// campaign again when it ends, is stopped or leadership is lost, until SIGINT or SIGTERM.
    #[command(after_help = AFTER_ELECT_HELP)]
    Elect(ElectArgs),
    /// Print the lock's leader and then one line per change, without joining the group, until
    /// a signal.
    #[command(after_help = AFTER_OBSERVE_HELP)]
    Observe(ObserveArgs),
    /// Print a shell completion script on stdout.
    #[command(hide = true)]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print a man page (roff) on stdout: kafka-lock(1), or kafka-lock-run(1),
    /// kafka-lock-status(1), kafka-lock-elect(1) or kafka-lock-observe(1).
    #[command(hide = true)]
    Manpage {
        /// The subcommand whose page to print; the main page without it.
        page: Option<generate::Page>,
    },
}

#[derive(Debug, Args)]
struct Target {
    /// Kafka brokers to start from (or bootstrap.servers from --config-file or -X).
    #[arg(
        long,
        env = "KAFKA_LOCK_BOOTSTRAP",
        value_name = "HOST:PORT[,HOST:PORT...]"
    )]
    bootstrap: Option<String>,
    /// Kafka client settings from a Java properties file (the client.properties Kafka's own
    /// tools take): bootstrap.servers, security.protocol, sasl.*, ssl.*, timeouts. Keys that mean
    /// nothing for a lock are ignored with a warning; unknown keys are an error.
    #[arg(long, value_name = "FILE")]
    config_file: Option<PathBuf>,
    /// One Kafka client setting, as in --config-file (repeatable; the last of a key wins; over
    /// the file and KAFKA_LOCK_X_<KEY> variables, under dedicated flags such as --bootstrap).
    /// Give secrets through the environment instead: KAFKA_LOCK_X_SASL_PASSWORD=...
    #[arg(short = 'X', value_name = "KEY=VALUE", action = clap::ArgAction::Append)]
    x: Vec<String>,
    /// The lock's name; it is the Kafka consumer group id.
    #[arg(long, value_name = "NAME")]
    lock: String,
    /// Timeout of each request to a broker [default: 5s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    request_timeout: Option<Duration>,
    /// Timeout of each connection attempt (TCP, the version handshake, and TLS
    /// and SASL when configured) [default: 10s]. An
    /// unreachable cluster is reported after three rounds over the bootstrap list.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    connect_timeout: Option<Duration>,
    /// Client id in request headers and member ids [default: kafka-lock].
    #[arg(long, value_name = "ID", hide = true)]
    client_id: Option<String>,
    /// The lock's ledger: a topic with exactly one partition (shared by any number of locks)
    /// whose record offsets are the fencing tokens, and where the lock's history and a copy of
    /// its checkpoint are kept. kafka-lock never creates it; see `kafka-lock history --help`.
    #[arg(long, env = "KAFKA_LOCK_LEDGER_TOPIC", value_name = "TOPIC")]
    ledger_topic: Option<String>,
}

/// What `run` and `elect` share: the lock, how it is held, and the command.
#[derive(Debug, Args)]
struct HoldArgs {
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
    /// kafka-lock, a SIGTERM to kafka-lock that the command outlives); at most --lease-margin. [default: 2s, or a fifth of the smaller of the
    /// session and rebalance timeouts if that is shorter]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    kill_grace: Option<Duration>,
    /// Who we are, shown to waiters and by `status`. [default: "<hostname> pid <pid>"]
    #[arg(long, value_name = "TEXT")]
    label: Option<String>,
    /// The longest checkpoint the command may write, in bytes: the brokers'
    /// offset.metadata.max.bytes, which is 4096 unless they are configured otherwise.
    #[arg(long, value_name = "BYTES", default_value_t = kafka_lock::DEFAULT_CHECKPOINT_MAX_BYTES)]
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
    /// Exit with N (1 to 255) instead of 74 when the lock is lost while the command runs.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..))]
    lost_exit_code: Option<u8>,
    /// Serve the lock's metrics in Prometheus text format at http://ADDRESS/metrics while
    /// kafka-lock runs: 127.0.0.1:9464, localhost:9464, [::1]:9464, or :9464 for every
    /// interface; port 0 picks a free one.
    #[arg(long, value_name = "ADDRESS", value_parser = parse_listen)]
    metrics_listen: Option<SocketAddr>,
    /// The command to run while holding the lock, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    hold: HoldArgs,
    /// Give up (status 75) if the lock is not held within this time; 0 makes one try, which
    /// answers busy without joining when a stable group holds the lock. A bare number is seconds
    /// (5, 0.5), as for flock -w and timeout. Giving up takes at most 2 s more, to leave the
    /// group. [default: wait forever]
    #[arg(short = 'w', long, value_name = "DURATION", value_parser = parse_wait)]
    wait: Option<Duration>,
    /// One try: the same as --wait 0 (as flock -n).
    #[arg(short = 'n', long, conflicts_with = "wait")]
    nonblock: bool,
    /// How many may hold the lock at once: a semaphore of N permits (1 to 1024). Each holder's
    /// command gets its permit slot, 0 to N-1, as KAFKA_LOCK_PERMIT. Every member of a lock must
    /// use the same N; one that disagrees with the group fails with status 78. Native mode only
    /// (not with --topic). With --ledger-topic each slot's tokens are ledger offsets that
    /// increase within the slot, and there is no checkpoint. [default: 1]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    permits: Option<u16>,
    /// Exit with N instead of 75 when the lock is not acquired (as flock -E), to tell that
    /// apart from the command's own statuses; 0 makes a busy lock a quiet success.
    #[arg(short = 'E', long, value_name = "N")]
    conflict_exit_code: Option<u8>,
}

#[derive(Debug, Args)]
struct ElectArgs {
    #[command(flatten)]
    hold: HoldArgs,
    /// Stop after N terms as leader and exit with the last command's status. [default: no limit]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_terms: Option<u64>,
    /// A term shorter than this delays the next campaign by this long, doubling with each
    /// further short term up to 60s; 0 turns the delay off. [default: 1s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    min_term: Option<Duration>,
}

#[derive(Debug, Args)]
struct ObserveArgs {
    #[command(flatten)]
    target: Target,
    /// Print one JSON object per line instead of text (docs/events.md, `leader`).
    #[arg(long)]
    json: bool,
    /// Time between DescribeGroups polls of the coordinator: one request per interval; at
    /// least 100ms. [default: 1s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    interval: Option<Duration>,
    /// Poll the coordinator even with --ledger-topic (which otherwise is followed instead).
    #[arg(long)]
    poll: bool,
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

/// `--wait`: a duration, or a bare number of seconds as flock -w and timeout take it.
fn parse_wait(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return match t.parse::<f64>() {
            Ok(secs) => Ok(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)),
            Err(_) => Err(format!(
                "{t:?} is not a number of seconds (write 5, 0.5, or a duration like 500ms, 2m)"
            )),
        };
    }
    parse_duration(s)
}

/// `--metrics-listen`: an address, a host name with a port (the first address it resolves to),
/// or `:PORT` for every interface, as Prometheus exporters take it.
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let t = s.trim();
    if let Some(port) = t.strip_prefix(':') {
        let port: u16 = port
            .parse()
            .map_err(|_| format!("{port:?} is not a port (0 to 65535)"))?;
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    if let Ok(addr) = t.parse() {
        return Ok(addr);
    }
    let Some((host, port)) = t.rsplit_once(':') else {
        return Err(
            "no port: write HOST:PORT, e.g. 127.0.0.1:9464, localhost:9464 or :9464".into(),
        );
    };
    if port.parse::<u16>().is_err() {
        return Err(format!("{port:?} is not a port (0 to 65535)"));
    }
    if host.is_empty() || host.contains(':') {
        return Err("write HOST:PORT, e.g. 127.0.0.1:9464, [::1]:9464 or :9464".into());
    }
    use std::net::ToSocketAddrs;
    match t.to_socket_addrs() {
        Ok(mut addrs) => addrs.next().ok_or_else(|| format!("{host} has no address")),
        Err(e) => Err(format!("cannot resolve {host}: {e}")),
    }
}

/// How long kafka-lock waits at exit for stderr to take its last lines.
const FLUSH_BOUND: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    // First of all, in kafka-lock and in its supervisor alike: no core dump and no /proc/<pid>/
    // environ for the command (same user) to read the password from. It cannot fail on Linux
    // (EINVAL only for a value other than 0, 1).
    let _ = sys::forbid_dumping();
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
        Command::Run(a) => events_target(&a.hold).map(|t| {
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
        Command::Elect(a) => events_target(&a.hold).map(|t| {
            if let Some(t) = t {
                output::set_events(t);
            }
            None
        }),
        Command::Status(_) | Command::History(_) | Command::Observe(_) => Ok(None),
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
            Command::Run(a) => {
                let lock = a.hold.target.lock.clone();
                let events_json = events_json(&a.hold);
                let once = RunOnly {
                    wait: if a.nonblock {
                        Some(Duration::ZERO)
                    } else {
                        a.wait
                    },
                    permits: a.permits.unwrap_or(1),
                    conflict_exit_code: a.conflict_exit_code,
                };
                match run_config(a.hold, once, from_env.clone()) {
                    Ok(c) => run::run(c).await,
                    Err(f) => run::failed_before_start(&lock, events_json, &from_env, f),
                }
            }
            Command::Status(a) => status(a, &from_env)
                .await
                .map_err(|f| environ::annotate(f, &from_env)),
            Command::History(a) => history(a, &from_env)
                .await
                .map_err(|f| environ::annotate(f, &from_env)),
            Command::Elect(a) => {
                let max_terms = a.max_terms;
                let min_term = a.min_term.unwrap_or(elect::DEFAULT_MIN_TERM);
                let lock = a.hold.target.lock.clone();
                let events_json = events_json(&a.hold);
                match run_config(a.hold, RunOnly::default(), from_env.clone()) {
                    Ok(run) => {
                        elect::elect(elect::ElectConfig {
                            run,
                            max_terms,
                            min_term,
                        })
                        .await
                    }
                    Err(f) => run::failed_before_start(&lock, events_json, &from_env, f),
                }
            }
            Command::Observe(a) => observe(a, &from_env)
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

/// The connection settings of `status` and `history`, merged from every source, with the
/// warnings printed.
fn connection(t: &Target, from_env: &FromEnv) -> Result<settings::Resolved, Failure> {
    let r = settings::resolve(&target_flags(t), from_env)?;
    settings::print_warnings(&r.warnings);
    Ok(r)
}

/// The request and connect timeouts of a one-shot command (status, observe, history), checked.
fn timeouts(c: &settings::Resolved) -> Result<(Duration, Duration), Failure> {
    let request = c
        .request_timeout
        .unwrap_or(kafka_lock::DEFAULT_REQUEST_TIMEOUT);
    let connect = c
        .connect_timeout
        .unwrap_or(kafka_lock::DEFAULT_CONNECT_TIMEOUT);
    run::in_range("--request-timeout", request, run::TIMEOUT_BOUND, false)?;
    run::in_range("--connect-timeout", connect, run::TIMEOUT_BOUND, false)?;
    Ok((request, connect))
}

fn target_flags(t: &Target) -> settings::Flags<'_> {
    settings::Flags {
        bootstrap: t.bootstrap.as_deref(),
        client_id: t.client_id.as_deref(),
        request_timeout: t.request_timeout,
        connect_timeout: t.connect_timeout,
        config_file: t.config_file.as_deref(),
        x: &t.x,
        ..settings::Flags::default()
    }
}

async fn status(a: StatusArgs, from_env: &FromEnv) -> Result<u8, Failure> {
    let c = connection(&a.target, from_env)?;
    let (request, connect) = timeouts(&c)?;
    status::status(status::StatusConfig {
        bootstrap: c.bootstrap,
        lock: a.target.lock,
        json: a.json,
        request_timeout: request,
        connect_timeout: connect,
        client_id: c.client_id,
        ledger_topic: a.target.ledger_topic,
        security: c.security,
        retry_backoff: c.retry_backoff,
    })
    .await
}

async fn observe(a: ObserveArgs, from_env: &FromEnv) -> Result<u8, Failure> {
    let c = connection(&a.target, from_env)?;
    let (request, connect) = timeouts(&c)?;
    let interval = a.interval.unwrap_or(kafka_lock::DEFAULT_OBSERVE_INTERVAL);
    run::in_range("--interval", interval, run::TIMEOUT_BOUND, false)?;
    if interval < kafka_lock::MIN_OBSERVE_INTERVAL {
        return Err(Failure::new(
            exit::CONFIG,
            format!(
                "--interval {} is too short: at least 100ms, so that observers cannot flood the coordinator",
                humantime::format_duration(interval)
            ),
        ));
    }
    observe::observe(observe::ObserveConfig {
        bootstrap: c.bootstrap,
        lock: a.target.lock,
        json: a.json,
        request_timeout: request,
        connect_timeout: connect,
        client_id: c.client_id,
        ledger_topic: a.target.ledger_topic,
        security: c.security,
        interval,
        via_describe: a.poll,
    })
    .await
}

async fn history(a: HistoryArgs, from_env: &FromEnv) -> Result<u8, Failure> {
    let c = connection(&a.target, from_env)?;
    let (request, connect) = timeouts(&c)?;
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
        bootstrap: c.bootstrap,
        lock: a.target.lock,
        ledger_topic,
        since,
        json: a.json,
        request_timeout: request,
        connect_timeout: connect,
        client_id: c.client_id,
        security: c.security,
        retry_backoff: c.retry_backoff,
    })
    .await
}

/// The events' own target, if --events-file or --events-fd asks for one.
fn events_target(a: &HoldArgs) -> Result<Option<output::Target>, Failure> {
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

/// --events-file and --events-fd imply --events json: JSON lines are the one format.
fn events_json(a: &HoldArgs) -> bool {
    a.events == Some(EventsFormat::Json) || a.events_file.is_some() || a.events_fd.is_some()
}

/// The settings only `run` takes; `elect` campaigns until stopped, with one leader.
#[derive(Debug)]
struct RunOnly {
    wait: Option<Duration>,
    permits: u16,
    conflict_exit_code: Option<u8>,
}

impl Default for RunOnly {
    fn default() -> RunOnly {
        RunOnly {
            wait: None,
            permits: 1,
            conflict_exit_code: None,
        }
    }
}

fn run_config(a: HoldArgs, once: RunOnly, from_env: FromEnv) -> Result<run::RunConfig, Failure> {
    let c = settings::resolve(
        &settings::Flags {
            session_timeout: a.session_timeout,
            heartbeat_interval: a.heartbeat_interval,
            rebalance_timeout: a.rebalance_timeout,
            ..target_flags(&a.target)
        },
        &from_env,
    )?;
    let events_json = events_json(&a);
    Ok(run::RunConfig {
        bootstrap: c.bootstrap,
        lock: a.target.lock,
        topic: a.topic,
        wait: once.wait,
        session_timeout: c.session_timeout,
        heartbeat_interval: c.heartbeat_interval,
        rebalance_timeout: c.rebalance_timeout,
        request_timeout: c.request_timeout,
        connect_timeout: c.connect_timeout,
        lease_margin: a.lease_margin,
        kill_grace: a.kill_grace,
        label: a.label,
        permits: once.permits,
        client_id: c.client_id,
        ledger_topic: a.target.ledger_topic,
        checkpoint_max_bytes: a.checkpoint_max_bytes,
        security: c.security,
        retry_backoff: c.retry_backoff,
        warnings: c.warnings,
        events_json,
        conflict_exit_code: once.conflict_exit_code,
        lost_exit_code: a.lost_exit_code,
        metrics_listen: a.metrics_listen,
        from_env,
        command: a.command,
    })
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
    if let Some(why) = not_for_elect(&e, argv) {
        what.push_str(&format!(" ({why})"));
    }
    if let Some(hint) = command_hint(&e, argv) {
        what.push_str(&format!("; {hint}"));
    }
    let help = match argv.get(1).map(|a| a.as_bytes()) {
        Some(b"run") => "kafka-lock run --help",
        Some(b"status") => "kafka-lock status --help",
        Some(b"history") => "kafka-lock history --help",
        Some(b"elect") => "kafka-lock elect --help",
        Some(b"observe") => "kafka-lock observe --help",
        _ => "kafka-lock --help",
    };
    let f = Failure::new(exit::USAGE, format!("{what}; see `{help}`"));
    f.print();
    f.status
}

/// For `run` and `elect` without `--` before the command: where it goes. A word clap did not
/// expect that is no flag is the command's first word.
fn command_hint(e: &clap::Error, argv: &[OsString]) -> Option<String> {
    let sub = argv.get(1)?.to_str()?;
    if !matches!(sub, "run" | "elect") || argv.iter().any(|a| a == "--") {
        return None;
    }
    match (e.kind(), e.get(ContextKind::InvalidArg)) {
        (ErrorKind::UnknownArgument, Some(ContextValue::String(word))) if !word.starts_with('-') => {
            Some(format!(
                "the command goes after `--`: kafka-lock {sub} [OPTIONS] -- {word} ..."
            ))
        }
        (ErrorKind::MissingRequiredArgument, _) if e.to_string().contains("<COMMAND>") => Some(
            format!("give the command to run after `--`: kafka-lock {sub} [OPTIONS] -- COMMAND [ARGS...]"),
        ),
        _ => None,
    }
}

/// Why `elect` has no such flag, for the flags only `run` takes.
fn not_for_elect(e: &clap::Error, argv: &[OsString]) -> Option<&'static str> {
    if argv.get(1).map(|a| a.as_bytes()) != Some(b"elect") {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let flag = arg.split([' ', '=']).next()?;
    match flag {
        "--wait" | "-w" | "-n" | "--nonblock" => Some(
            "elect campaigns until it is stopped: --wait does not apply; bound the number of terms with --max-terms",
        ),
        "-E" | "--conflict-exit-code" => Some(
            "elect never gives up on the lock, so there is no 'not acquired' status to replace",
        ),
        "--permits" => Some(
            "elect has one leader at a time: --permits does not apply; kafka-lock run --permits N runs a command on up to N members at once",
        ),
        _ => None,
    }
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
    fn wait_takes_bare_seconds_and_metrics_listen_the_exporters_forms() {
        assert_eq!(parse_wait("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_wait("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_wait("0"), Ok(Duration::ZERO));
        assert_eq!(parse_wait("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_wait("1.2.3").is_err());
        assert!(parse_wait("").is_err());
        // Only --wait: a bare 10000 for a timeout may well mean milliseconds, as in Kafka's keys.
        assert!(parse_duration("5").is_err());

        assert_eq!(
            parse_listen(":9464"),
            Ok(SocketAddr::from(([0, 0, 0, 0], 9464)))
        );
        assert_eq!(
            parse_listen("127.0.0.1:9464"),
            Ok(SocketAddr::from(([127, 0, 0, 1], 9464)))
        );
        assert_eq!(
            parse_listen("[::1]:0"),
            "[::1]:0".parse::<SocketAddr>().map_err(|e| e.to_string())
        );
        assert!(
            parse_listen("localhost:9464").is_ok_and(|a| a.ip().is_loopback() && a.port() == 9464)
        );
        for bad in [
            ":",
            ":x",
            "9464",
            "localhost",
            "localhost:99999",
            "::1:9464",
        ] {
            assert!(parse_listen(bad).is_err(), "{bad}");
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

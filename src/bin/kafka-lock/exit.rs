//! Exit statuses of kafka-lock's own (sysexits.h numbers) and the one line each prints.

use kafka_lock::{Error, KafkaCode};

/// EX_USAGE: the command line is wrong.
pub const USAGE: u8 = 64;
/// EX_UNAVAILABLE: the cluster cannot be reached, or answered something invalid.
pub const UNAVAILABLE: u8 = 69;
/// EX_OSERR: the operating system refused something kafka-lock needs (signals, waiting,
/// starting its supervisor), or the supervisor process died.
pub const OSERR: u8 = 71;
/// EX_IOERR: the lock was lost while the command ran.
pub const LOST: u8 = 74;
/// EX_TEMPFAIL: the lock was not acquired within --wait; trying again later may work.
pub const NOT_ACQUIRED: u8 = 75;
/// EX_CONFIG: a setting is invalid, or the broker rejected it.
pub const CONFIG: u8 = 78;
/// `status`: the lock is free (nobody holds it, including a group that does not exist). 3 and 4
/// are the LSB init scripts' "not running" and "unknown", which status-checking scripts know.
pub const STATUS_FREE: u8 = 3;
/// `status`: whether anybody holds the lock cannot be told (the broker does not report member
/// assignments, the group is between generations, or another application uses the group id).
pub const STATUS_UNKNOWN: u8 = 4;
/// The shell's status for a command that cannot be executed.
pub const CANNOT_EXECUTE: u8 = 126;
/// The shell's status for a command that does not exist.
pub const NOT_FOUND: u8 = 127;

/// Why kafka-lock itself ends with a non-zero status: the status, and one line for stderr saying
/// what happened and what to do about it.
#[derive(Debug)]
pub struct Failure {
    pub status: u8,
    pub line: String,
}

impl Failure {
    pub fn new(status: u8, line: impl Into<String>) -> Self {
        Failure {
            status,
            line: line.into(),
        }
    }

    /// Queues the line for stderr, always as exactly one line, whatever the error texts
    /// contain. Never blocks and never fails: a closed or stalled stderr loses the line, not
    /// the exit status.
    pub fn print(&self) {
        print_line(&self.line);
    }
}

/// Queues one line of kafka-lock's own for stderr ("kafka-lock: ..."), flattened to one line.
pub fn print_line(line: &str) {
    let one_line: String = line
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    crate::output::write(format!("kafka-lock: {one_line}\n").as_bytes());
}

/// The `kind` of a `failed` event: what kafka-lock's own status `status` means, stable even when
/// --conflict-exit-code or --lost-exit-code replace the number.
pub fn kind(status: u8) -> &'static str {
    match status {
        USAGE => "usage",
        UNAVAILABLE => "unavailable",
        OSERR => "system",
        LOST => "lost",
        NOT_ACQUIRED => "not_acquired",
        CONFIG => "config",
        CANNOT_EXECUTE => "cannot_execute",
        NOT_FOUND => "not_found",
        129..=192 => "interrupted",
        _ => "other",
    }
}

/// Broker codes that mean "your settings are not acceptable here", not "the cluster is broken".
const SETTING_CODES: [KafkaCode; 8] = [
    KafkaCode::INCONSISTENT_GROUP_PROTOCOL,
    KafkaCode::INVALID_GROUP_ID,
    KafkaCode::INVALID_SESSION_TIMEOUT,
    KafkaCode(29), // TOPIC_AUTHORIZATION_FAILED (consumer-compatible mode reads the topic)
    KafkaCode::GROUP_AUTHORIZATION_FAILED,
    KafkaCode(31), // CLUSTER_AUTHORIZATION_FAILED
    KafkaCode::GROUP_MAX_SIZE_REACHED,
    KafkaCode::FENCED_INSTANCE_ID,
];

/// The status for an error that ended kafka-lock before the command ran (or from `status`).
pub fn status_of(err: &Error) -> u8 {
    match err {
        Error::NotAcquired { .. } => NOT_ACQUIRED,
        Error::Config(_) | Error::PermitsMismatch { .. } => CONFIG,
        Error::Broker { code, .. } if SETTING_CODES.contains(code) => CONFIG,
        Error::Lost { .. } => LOST,
        Error::Poisoned(inner) => status_of(inner),
        // Unreachable brokers, timeouts, closed connections, and answers that cannot be decoded or
        // make no sense all mean the same to the person running the command: the cluster is not
        // usable from here right now.
        _ => UNAVAILABLE,
    }
}

/// The failure for `err`, with advice that fits its status. `bootstrap` is shown so a typo in the
/// address is visible in the message.
pub fn failure(err: &Error, lock: &str, bootstrap: &str) -> Failure {
    let status = status_of(err);
    let line = match status {
        NOT_ACQUIRED => format!("{err}; try again later, or wait longer with --wait"),
        CONFIG => match err {
            Error::Broker { .. } => format!(
                "the broker rejected the settings for lock {lock:?}: {err}; change the setting it names \
                 (see kafka-lock run --help) or the broker's configuration"
            ),
            Error::PermitsMismatch { .. } => format!(
                "{err}; give --permits (or $KAFKA_LOCK_PERMITS) the number the other members use"
            ),
            _ => format!("{err}; fix the setting (see kafka-lock run --help)"),
        },
        LOST => format!("{err}; run the command again to take the lock anew"),
        _ => {
            let text = err.to_string();
            // Connection errors from the library already say what to check.
            let advice = if text.contains("check ") {
                ""
            } else {
                "; check --bootstrap (or $KAFKA_LOCK_BOOTSTRAP), that the brokers are up and reachable \
                 from here, and that they are Kafka brokers"
            };
            format!("cannot use the Kafka cluster at {bootstrap} for lock {lock:?}: {text}{advice}")
        }
    };
    Failure::new(status, line)
}

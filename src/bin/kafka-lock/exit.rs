//! Exit statuses of kafka-lock's own (sysexits.h numbers) and the one line each prints.

use kafka_lock::{AuthFailure, Error, KafkaCode, LedgerError, SecurityError};

/// EX_USAGE: the command line is wrong.
pub const USAGE: u8 = 64;
/// EX_UNAVAILABLE: the cluster cannot be reached, or answered something invalid.
pub const UNAVAILABLE: u8 = 69;
/// EX_NOPERM: the cluster refused who kafka-lock is (authentication: a wrong password, a
/// mechanism the listener does not enable) or what it asked (authorization: an ACL), or the
/// secured connection could not be made with the broker it reached (a TLS listener reached
/// without TLS or the other way round, a certificate from an unknown CA or for another host).
pub const NOPERM: u8 = 77;
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
        NOPERM => "denied",
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
/// (Authorization codes are [`NOPERM`]: [`Error::auth_failure`].)
const SETTING_CODES: [KafkaCode; 5] = [
    KafkaCode::INCONSISTENT_GROUP_PROTOCOL,
    KafkaCode::INVALID_GROUP_ID,
    KafkaCode::INVALID_SESSION_TIMEOUT,
    KafkaCode::GROUP_MAX_SIZE_REACHED,
    KafkaCode::FENCED_INSTANCE_ID,
];

/// The security failure inside `err`, looking through poisoned connections and bootstrap
/// attempts: what the person has to change.
pub fn security_error(err: &Error) -> Option<&SecurityError> {
    match err {
        Error::Security(e) => Some(e),
        Error::Poisoned(e) => security_error(e),
        Error::Bootstrap(b) => b.attempts.iter().find_map(|a| security_error(&a.error)),
        _ => None,
    }
}

/// The status for an error that ended kafka-lock before the command ran (or from `status`).
pub fn status_of(err: &Error) -> u8 {
    if err.auth_failure().is_some() {
        return NOPERM;
    }
    match security_error(err) {
        // Local TLS settings that cannot be used: an unreadable CA file, a key that does not
        // parse.
        Some(SecurityError::TlsConfig(_)) => return CONFIG,
        // The build's TLS provider cannot run on this CPU: a deployment to change (another
        // build, or another machine), not a refusal by the cluster.
        Some(SecurityError::UnsupportedCpu { .. }) => return CONFIG,
        // The OAuth token endpoint is down or answers nonsense: a service kafka-lock needs
        // cannot be reached, as when the cluster cannot.
        Some(SecurityError::TokenEndpoint { .. }) => return UNAVAILABLE,
        Some(_) => return NOPERM,
        None => {}
    }
    match err {
        Error::NotAcquired { .. } => NOT_ACQUIRED,
        Error::Config(_) | Error::PermitsMismatch { .. } | Error::LedgerMismatch { .. } => CONFIG,
        // The cluster answered; the topic named by --ledger-topic is what is wrong.
        Error::Ledger(
            LedgerError::TopicMissing { .. }
            | LedgerError::NotOnePartition { .. }
            | LedgerError::Compressed { .. },
        ) => CONFIG,
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
        NOPERM => match (security_error(err), err.auth_failure()) {
            (Some(e), _) => format!("cannot use the Kafka cluster at {bootstrap} for lock {lock:?}: {e}"),
            (None, Some(AuthFailure::Authorization)) => {
                let text = err.to_string();
                // The broker code's own sentence may already say what to grant.
                let advice = if text.contains("grant") {
                    String::new()
                } else {
                    format!(
                        "; grant the principal Read and Describe on the group {lock:?} (and \
                         Describe on --topic, Read, Write and Describe on --ledger-topic, if given)"
                    )
                };
                format!("not authorized for lock {lock:?} at {bootstrap}: {text}{advice}")
            }
            (None, _) => format!(
                "the cluster at {bootstrap} refused the credentials for lock {lock:?}: {err}; check \
                 sasl.mechanism, sasl.username and sasl.password"
            ),
        },
        CONFIG if matches!(security_error(err), Some(SecurityError::UnsupportedCpu { .. })) => {
            format!("cannot use TLS on this machine for lock {lock:?}: {err}")
        }
        CONFIG if security_error(err).is_some() => format!(
            "cannot set up TLS for the Kafka cluster at {bootstrap}: {err}; fix ssl.ca.location, \
             ssl.certificate.location or ssl.key.location"
        ),
        NOT_ACQUIRED => format!("{err}; try again later, or wait longer with --wait"),
        CONFIG => match err {
            Error::Broker { .. } => format!(
                "the broker rejected the settings for lock {lock:?}: {err}; change the setting it names \
                 (see kafka-lock run --help) or the broker's configuration"
            ),
            Error::PermitsMismatch { .. } => format!(
                "{err}; give --permits (or $KAFKA_LOCK_PERMITS) the number the other members use"
            ),
            Error::LedgerMismatch { .. } => format!(
                "{err}; give --ledger-topic (or $KAFKA_LOCK_LEDGER_TOPIC) the setting the other \
                 members use, or change every member's (docs/protocol.md, \"Ledger setting\")"
            ),
            // Its own text says how to create the topic.
            Error::Ledger(_) => format!("{err}; or fix --ledger-topic (lock {lock:?})"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// As an error reaches the CLI from a connection that failed earlier.
    fn poisoned(e: Error) -> Error {
        Error::Poisoned(Arc::new(e))
    }

    #[test]
    fn refusals_are_77_and_unusable_tls_files_78() {
        let wrong_password = Error::Security(SecurityError::AuthenticationFailed {
            broker: "127.0.0.1:9093".into(),
            mechanism: "SCRAM-SHA-512".into(),
            user: "u".into(),
            message: "Authentication failed".into(),
        });
        let unknown_ca = Error::Security(SecurityError::UnknownCa {
            broker: "127.0.0.1:9093".into(),
            detail: "UnknownIssuer".into(),
        });
        let bad_file = Error::Security(SecurityError::TlsConfig("no certificate in ca.pem".into()));
        let group = Error::Broker {
            api: kafka_lock::Api::FindCoordinator,
            code: KafkaCode::GROUP_AUTHORIZATION_FAILED,
            message: None,
        };
        assert_eq!(status_of(&wrong_password), NOPERM);
        assert_eq!(status_of(&unknown_ca), NOPERM);
        assert_eq!(status_of(&poisoned(unknown_ca)), NOPERM);
        assert_eq!(status_of(&poisoned(wrong_password)), NOPERM);
        assert_eq!(status_of(&bad_file), CONFIG);
        assert_eq!(status_of(&poisoned(bad_file)), CONFIG);
        assert_eq!(status_of(&group), NOPERM);
        assert_eq!(kind(NOPERM), "denied");
        let f = failure(&group, "nightly", "127.0.0.1:9093");
        assert!(
            f.line.contains("not authorized for lock \"nightly\""),
            "{}",
            f.line
        );
        assert!(f.line.contains("READ (and DESCRIBE)"), "{}", f.line);
        assert_eq!(f.line.matches("grant").count(), 1, "{}", f.line);
        let f = failure(
            &poisoned(Error::Security(SecurityError::TlsListener {
                broker: "127.0.0.1:9093".into(),
            })),
            "nightly",
            "127.0.0.1:9093",
        );
        // The security error itself, not what wraps it.
        assert!(f.line.contains("looks like a TLS listener"), "{}", f.line);
        assert!(
            !f.line.contains("unusable after an earlier failure"),
            "{}",
            f.line
        );
    }

    /// A CPU that cannot run the TLS provider is a setting to change (78), said in one line
    /// naming what the CPU lacks, with no advice about certificate files.
    #[test]
    fn a_cpu_without_the_providers_features_is_78() {
        let err = Error::Security(SecurityError::UnsupportedCpu {
            provider: kafka_lock::TlsProvider::Graviola,
            arch: "x86_64".into(),
            missing: vec!["avx2".into(), "adx".into()],
        });
        assert_eq!(status_of(&err), CONFIG);
        let f = failure(&err, "nightly", "127.0.0.1:9093");
        assert_eq!(f.status, CONFIG);
        assert!(f.line.contains("lacks avx2, adx"), "{}", f.line);
        assert!(f.line.contains("graviola"), "{}", f.line);
        assert!(!f.line.contains("ssl.ca.location"), "{}", f.line);
        assert!(!f.line.contains('\n'), "{}", f.line);
    }
}

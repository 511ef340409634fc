//! Errors: one flat [`Error`] for the whole crate. It wraps each layer's own error type (the wire's
//! [`DecodeError`], [`EncodeError`], [`FrameError`] and [`VersionError`], the ledger's
//! [`LedgerError`](crate::ledger::LedgerError), ...) through `From`; the codes brokers put in
//! responses are the wire's [`KafkaCode`]. The sans-I/O machines below it fail in types of their
//! own (`membership::Failure`, `ledger::Failure`), each turned here into the `Error` of the same
//! words, and ask the driver's failures, which are `Error`s, what `wire::Unanswered` offers.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::ApiKey;

pub use crate::api::Api;
use crate::ledger::Failure as LedgerFailure;
use crate::membership::{self, Failure as MembershipFailure};
pub use crate::wire::code::KafkaCode;
use crate::wire::codec::{DecodeError, EncodeError};
use crate::wire::coordinator::CoordinatorError;
use crate::wire::frame::FrameError;
use crate::wire::versions::VersionError;

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A response could not be decoded.
    #[error(transparent)]
    Decode(#[from] DecodeError),

    /// A request could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),

    /// The byte stream did not hold an acceptable frame.
    #[error(transparent)]
    Frame(#[from] FrameError),

    /// The broker and kafka-lock have no API version in common.
    #[error(transparent)]
    Version(#[from] VersionError),

    /// A socket operation failed.
    #[error("{op} failed: {source}")]
    Io {
        /// What was being done, e.g. "connect" or "read".
        op: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// An operation did not finish in time.
    #[error("{op} timed out after {after:?}")]
    Timeout {
        /// What was being waited for, e.g. "JoinGroup to 127.0.0.1:9092".
        op: String,
        /// How long it was given.
        after: Duration,
    },

    /// The broker answered with an error code.
    #[error("{api} failed: {code}{}", .message.as_deref().map(|m| format!(" (broker says: {m})")).unwrap_or_default())]
    Broker {
        /// The API whose response carried the code.
        api: Api,
        /// The code.
        code: KafkaCode,
        /// The broker's own error message, when the response has one and it is not empty.
        message: Option<String>,
    },

    /// The connection failed earlier; every request that was or is sent on it fails with this.
    #[error("connection is unusable after an earlier failure: {0}")]
    Poisoned(Arc<Error>),

    /// The client or connection has been shut down.
    #[error("the connection or client is closed")]
    Closed,

    /// A setting is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// The broker answered something well-formed but impossible to act on (a response of the
    /// wrong kind, a coordinator with no usable address, a topic that cannot serve as a lock).
    #[error("unexpected answer from the cluster: {0}")]
    Protocol(String),

    /// No bootstrap broker could be reached.
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),

    /// The broker offers no version of an API this request needs.
    #[error("the broker offers no version of {api} that kafka-lock implements; upgrade the broker or check that this is a Kafka-compatible endpoint")]
    UnsupportedApi {
        /// The API.
        api: Api,
    },

    /// The lock was not acquired within the time the caller allowed.
    #[error("lock {lock:?} was not acquired within {waited:?}{}", .holder.as_deref().map(|h| format!("; it is held by {h}")).unwrap_or_default())]
    NotAcquired {
        /// The lock's name.
        lock: String,
        /// How long the caller waited.
        waited: std::time::Duration,
        /// Who held it when the wait ended, if known.
        holder: Option<String>,
    },

    /// The lock was lost (or the membership ended) before the operation could complete.
    #[error("lock {lock:?} was lost: {reason}")]
    Lost {
        /// The lock's name.
        lock: String,
        /// Why.
        reason: String,
    },

    /// The ledger topic cannot serve, or a checkpoint cannot be stored.
    #[error(transparent)]
    Ledger(#[from] crate::ledger::error::LedgerError),

    /// TLS or SASL could not be set up, or the broker refused the principal
    /// ([`Error::auth_failure`] tells authentication from authorization).
    #[error(transparent)]
    Security(#[from] crate::security::SecurityError),
    /// The lock's group runs with another number of permits than this member was given. The
    /// group keeps its number (see `docs/protocol.md`); this member left it.
    #[error("{}", membership::permits_mismatch(lock, *ours, *group))]
    PermitsMismatch {
        /// The lock's name.
        lock: String,
        /// This member's number of permits.
        ours: u16,
        /// The number the group's leader assigned with (1 for a leader that predates permits).
        group: u16,
    },
    /// The lock's group takes its tokens from another ledger topic (or from none, or from one
    /// where this member has none) than this member was given: their tokens would be unrelated
    /// numbers. This member left the group (see `docs/protocol.md`, "Ledger setting").
    #[error("{}", membership::ledger_mismatch(lock, ours.as_deref(), group.as_deref()))]
    LedgerMismatch {
        /// The lock's name.
        lock: String,
        /// This member's ledger topic.
        ours: Option<String>,
        /// The group's ledger topic as its leader decided it (`None` also for a leader that
        /// predates ledgers).
        group: Option<String>,
    },
}

// Here rather than in the driver, which returns it: each attempt holds an `Error`, and an
// `Error` can be this.
/// One bootstrap address and the last error it gave.
#[derive(Debug)]
#[non_exhaustive]
pub struct BootstrapAttempt {
    /// The address as given in the bootstrap list.
    pub addr: String,
    /// The last failure connecting to it.
    pub error: Error,
}

/// No bootstrap address could be connected to.
#[derive(Debug)]
#[non_exhaustive]
pub struct BootstrapError {
    /// Every address that was tried, in list order, with its last error.
    pub attempts: Vec<BootstrapAttempt>,
    /// Full or partial rounds made.
    pub rounds: u32,
    /// Time spent.
    pub elapsed: Duration,
}

impl fmt::Display for BootstrapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "could not connect to any bootstrap broker ({} round(s) in {:.1?}); check the \
             addresses and that the brokers are up:",
            self.rounds, self.elapsed
        )?;
        for a in &self.attempts {
            write!(f, " [{}: {}]", a.addr, a.error)?;
        }
        Ok(())
    }
}

impl std::error::Error for BootstrapError {}

// Kept out of `#[from]` so that the words stay those of a broker error and of a protocol error,
// whichever layer found them.
impl From<CoordinatorError> for Error {
    fn from(e: CoordinatorError) -> Self {
        match e {
            CoordinatorError::Broker { code, message } => Error::Broker {
                api: Api::FindCoordinator,
                code,
                message,
            },
            unusable @ CoordinatorError::Unusable { .. } => Error::Protocol(unusable.to_string()),
        }
    }
}

impl From<MembershipFailure> for Error {
    fn from(e: MembershipFailure) -> Self {
        match e {
            MembershipFailure::Broker { api, code } => Error::Broker {
                api,
                code,
                message: None,
            },
            MembershipFailure::MissingApi(api) => Error::Config(membership::missing_api(&api)),
            MembershipFailure::Version(e) => Error::Version(e),
            MembershipFailure::WrongAnswer { want, got } => {
                Error::Protocol(membership::wrong_answer(want, got))
            }
            MembershipFailure::PermitsMismatch { lock, ours, group } => {
                Error::PermitsMismatch { lock, ours, group }
            }
            MembershipFailure::LedgerMismatch { lock, ours, group } => {
                Error::LedgerMismatch { lock, ours, group }
            }
        }
    }
}

/// What the machines ask of the driver's failures.
#[doc(hidden)]
impl crate::wire::Unanswered for Error {
    fn is_retriable(&self) -> bool {
        Error::is_retriable(self)
    }

    fn broker_code(&self) -> Option<KafkaCode> {
        match self {
            Error::Broker { code, .. } => Some(*code),
            _ => None,
        }
    }

    fn bad_frame(&self) -> Option<&dyn fmt::Display> {
        match self {
            Error::Poisoned(cause) if matches!(**cause, Error::Frame(_)) => Some(&**cause),
            _ => None,
        }
    }
}

#[doc(hidden)]
impl crate::ledger::Unanswered for Error {
    fn refused(&self) -> bool {
        matches!(self, Error::Ledger(_))
    }
}

/// `e` as the error of the same words; `unanswered` gives back the driver's own failure.
fn from_ledger<F>(e: LedgerFailure<F>, unanswered: impl FnOnce(F) -> Error) -> Error {
    match e {
        LedgerFailure::Unanswered(e) => unanswered(e),
        LedgerFailure::Broker { api, code, message } => Error::Broker { api, code, message },
        LedgerFailure::Protocol(m) => Error::Protocol(m),
        LedgerFailure::Ledger(e) => Error::Ledger(e),
        LedgerFailure::UnsupportedApi { api } => Error::UnsupportedApi { api },
        LedgerFailure::Timeout { op, after } => Error::Timeout { op, after },
        LedgerFailure::Member(e) => e.into(),
    }
}

impl From<LedgerFailure> for Error {
    fn from(e: LedgerFailure) -> Self {
        from_ledger(e, |never| match never {})
    }
}

impl From<LedgerFailure<Error>> for Error {
    fn from(e: LedgerFailure<Error>) -> Self {
        from_ledger(e, |e| e)
    }
}

impl Error {
    /// Whether trying again (after a backoff, on a new connection or a rediscovered coordinator)
    /// may succeed.
    ///
    /// Broker codes follow [`KafkaCode::is_retriable`]. I/O failures, timeouts and poisoned
    /// connections are retriable because a fresh connection may work. Decoding, encoding, framing,
    /// version and configuration errors are not: sending the same thing again gives the same result.
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Io { .. } | Error::Timeout { .. } | Error::Poisoned(_) | Error::Bootstrap(_) => {
                true
            }
            Error::Broker { code, .. } => code.is_retriable(),
            Error::Decode(_)
            | Error::Encode(_)
            | Error::Frame(_)
            | Error::Version(_)
            | Error::Closed
            | Error::Config(_)
            | Error::Protocol(_)
            | Error::UnsupportedApi { .. }
            | Error::NotAcquired { .. }
            | Error::Lost { .. }
            | Error::Ledger(_)
            | Error::Security(_)
            | Error::PermitsMismatch { .. }
            | Error::LedgerMismatch { .. } => false,
        }
    }

    /// Whether the broker refused who we are ([`AuthFailure::Authentication`]: wrong password,
    /// mechanism not enabled) or what we asked ([`AuthFailure::Authorization`]: an ACL), looking
    /// through poisoned connections and bootstrap attempts. `None` for every other error.
    ///
    /// [`AuthFailure::Authentication`]: crate::security::AuthFailure::Authentication
    /// [`AuthFailure::Authorization`]: crate::security::AuthFailure::Authorization
    pub fn auth_failure(&self) -> Option<crate::security::AuthFailure> {
        use crate::security::AuthFailure;
        match self {
            Error::Security(e) => e.auth_failure(),
            Error::Poisoned(e) => e.auth_failure(),
            Error::Bootstrap(b) => b.attempts.iter().find_map(|a| a.error.auth_failure()),
            Error::Broker { code, .. } => match code.0 {
                // SASL_AUTHENTICATION_FAILED, UNSUPPORTED_SASL_MECHANISM,
                // ILLEGAL_SASL_STATE
                58 | 33 | 34 => Some(AuthFailure::Authentication),
                // TOPIC_, GROUP_, CLUSTER_, TRANSACTIONAL_ID_, DELEGATION_TOKEN_AUTHORIZATION_FAILED
                29 | 30 | 31 | 53 | 65 => Some(AuthFailure::Authorization),
                _ => None,
            },
            _ => None,
        }
    }

    /// Builds [`Error::Broker`], dropping an empty message (brokers often send `""` or null).
    #[doc(hidden)] // Unstable: takes the codec's key type.
    pub fn broker(api: ApiKey, code: KafkaCode, message: Option<&str>) -> Self {
        Error::Broker {
            api: Api::of(api),
            code,
            message: message.filter(|m| !m.is_empty()).map(str::to_owned),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_retriability_and_messages() {
        let e = Error::broker(ApiKey::Heartbeat, KafkaCode::NOT_COORDINATOR, Some(""));
        assert!(e.is_retriable());
        let shown = e.to_string();
        assert!(
            shown.starts_with("Heartbeat failed: NOT_COORDINATOR (16): "),
            "{shown}"
        );
        assert!(!shown.contains("broker says"));
        let e = Error::broker(
            ApiKey::JoinGroup,
            KafkaCode::FENCED_INSTANCE_ID,
            Some("fenced"),
        );
        assert!(!e.is_retriable());
        assert!(e.to_string().ends_with("(broker says: fenced)"));
        let io = Error::Io {
            op: "connect",
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert!(io.is_retriable());
        assert!(Error::Poisoned(Arc::new(io)).is_retriable());
        assert!(!Error::Closed.is_retriable());
        assert!(!Error::Config("x".into()).is_retriable());
    }

    /// The machines' failures say what the `Error` they become says, and the ledger decides
    /// on them as on that `Error`.
    #[test]
    fn machine_failures_read_as_their_errors() {
        use crate::ledger::LedgerError;
        use crate::wire::Unanswered;
        let member = [
            MembershipFailure::Broker {
                api: Api::JoinGroup,
                code: KafkaCode::GROUP_AUTHORIZATION_FAILED,
            },
            MembershipFailure::MissingApi(ApiKey::SyncGroup),
            MembershipFailure::Version(VersionError::Unsupported {
                api: Api::JoinGroup,
                ours: (0, 9),
                broker: Some((10, 12)),
            }),
            MembershipFailure::WrongAnswer {
                want: ApiKey::Heartbeat,
                got: ApiKey::JoinGroup,
            },
            MembershipFailure::PermitsMismatch {
                lock: "l".into(),
                ours: 1,
                group: 3,
            },
            MembershipFailure::LedgerMismatch {
                lock: "l".into(),
                ours: None,
                group: Some("lg".into()),
            },
        ];
        for f in member.clone() {
            assert_eq!(Error::from(f.clone()).to_string(), f.to_string());
        }
        assert_eq!(
            Error::from(member[1].clone()).to_string(),
            "invalid configuration: the broker does not offer SyncGroup, which kafka-lock needs \
             for group membership"
        );
        assert_eq!(
            Error::from(member[3].clone()).to_string(),
            "unexpected answer from the cluster: expected Heartbeat, got JoinGroup"
        );
        assert_eq!(
            Error::from(member[4].clone()).to_string(),
            "lock \"l\" has 3 permit(s) but this member was configured with 1; every member of \
             a lock must use the same number of permits"
        );
        assert_eq!(
            Error::from(member[5].clone()).to_string(),
            "lock \"l\" runs with ledger topic \"lg\" but this member was configured with no \
             ledger topic; every member of a lock must use the same ledger topic, or none"
        );

        let timeout = || Error::Timeout {
            op: "OffsetCommit".into(),
            after: Duration::from_secs(5),
        };
        let ledger: Vec<LedgerFailure<Error>> = vec![
            LedgerFailure::Unanswered(timeout()),
            LedgerFailure::Unanswered(Error::Poisoned(Arc::new(Error::Frame(FrameError::Empty)))),
            LedgerFailure::Unanswered(Error::broker(
                ApiKey::ApiVersions,
                KafkaCode::NOT_COORDINATOR,
                None,
            )),
            LedgerFailure::Unanswered(Error::Ledger(LedgerError::Unsupported {
                api: Api::Produce,
            })),
            LedgerFailure::Broker {
                api: Api::Produce,
                code: KafkaCode(6),
                message: Some("moved".into()),
            },
            LedgerFailure::broker(Api::OffsetCommit, KafkaCode::UNKNOWN_MEMBER_ID, None),
            LedgerFailure::Protocol("no entry".into()),
            LedgerFailure::Ledger(LedgerError::TopicReplaced { topic: "t".into() }),
            LedgerFailure::UnsupportedApi {
                api: Api::OffsetFetch,
            },
            LedgerFailure::Timeout {
                op: "storing the checkpoint (OffsetCommit)".into(),
                after: Duration::from_secs(15),
            },
            LedgerFailure::Member(member[0].clone()),
            LedgerFailure::Member(member[4].clone()),
        ];
        for f in ledger {
            let (words, retriable, code, serve) = (
                f.to_string(),
                f.is_retriable(),
                f.broker_code(),
                f.cannot_serve(),
            );
            let e = Error::from(f);
            assert_eq!(e.to_string(), words);
            assert_eq!(e.is_retriable(), retriable, "{e}");
            assert_eq!(Unanswered::broker_code(&e), code, "{e}");
            assert_eq!(matches!(e, Error::Ledger(_)), serve, "{e}");
        }
    }

    #[test]
    fn coordinator_errors_read_as_before() {
        let e = Error::from(CoordinatorError::Broker {
            code: KafkaCode::COORDINATOR_NOT_AVAILABLE,
            message: Some("loading".into()),
        });
        assert!(e.is_retriable());
        assert_eq!(
            e.to_string(),
            Error::broker(
                ApiKey::FindCoordinator,
                KafkaCode::COORDINATOR_NOT_AVAILABLE,
                Some("loading")
            )
            .to_string()
        );
        let e = Error::from(CoordinatorError::Unusable {
            host: String::new(),
            port: 70000,
        });
        assert!(!e.is_retriable());
        assert_eq!(
            e.to_string(),
            "unexpected answer from the cluster: FindCoordinator named an unusable coordinator \"\":70000"
        );
    }
}

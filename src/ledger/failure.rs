//! What goes wrong for the ledger machine and its requests, in the ledger's own terms: the
//! answers it read and its own refusals, the membership's failure it passes on, and the driver's
//! failure (a request that got no answer) untouched. The crate's `Error` wraps [`Failure`], each
//! variant as the `Error` variant of the same name and words, `Unanswered(e)` as `e` itself.

use std::convert::Infallible;
use std::fmt;
use std::time::Duration;

use super::error::LedgerError;
use crate::api::Api;
use crate::membership::Failure as MembershipFailure;
use crate::wire::code::KafkaCode;

/// What the ledger machine asks of the driver's failures, beyond what every machine asks.
pub trait Unanswered: crate::wire::Unanswered {
    /// Whether the failure is the ledger's own refusal come back: [`build`](super::build), which
    /// the driver runs once it knows the connection's versions, found no version of an API the
    /// ledger needs.
    fn refused(&self) -> bool;
}

/// Why a ledger request failed, or what the ledger machine reports. `F` is the driver's failure;
/// the ledger's functions that send nothing have none ([`Infallible`]).
#[derive(Debug)]
pub enum Failure<F = Infallible> {
    /// A request got no answer: the driver's failure, untouched.
    Unanswered(F),
    /// The broker answered with an error code.
    Broker {
        /// The API whose answer carried the code.
        api: Api,
        /// The code.
        code: KafkaCode,
        /// The broker's own message, when it sent one that is not empty.
        message: Option<String>,
    },
    /// An answer well-formed but impossible to act on.
    Protocol(String),
    /// The ledger topic cannot serve, or a checkpoint cannot be stored.
    Ledger(LedgerError),
    /// The broker offers no version of an API a read needs.
    UnsupportedApi {
        /// The API.
        api: Api,
    },
    /// A checkpoint was not stored in the time it was given.
    Timeout {
        /// What was being waited for.
        op: String,
        /// How long it was given.
        after: Duration,
    },
    /// The membership's failure, published once the ledger has written what it had to.
    Member(MembershipFailure),
}

impl<F> From<LedgerError> for Failure<F> {
    fn from(e: LedgerError) -> Self {
        Failure::Ledger(e)
    }
}

impl<F> Failure<F> {
    /// [`Failure::Broker`], dropping an empty message (brokers often send `""` or null).
    pub fn broker(api: Api, code: KafkaCode, message: Option<String>) -> Self {
        Failure::Broker {
            api,
            code,
            message: message.filter(|m| !m.is_empty()),
        }
    }
}

impl Failure {
    /// The same failure, for a caller whose failures may also be `F`.
    pub fn widen<F>(self) -> Failure<F> {
        match self {
            Failure::Unanswered(never) => match never {},
            Failure::Broker { api, code, message } => Failure::Broker { api, code, message },
            Failure::Protocol(m) => Failure::Protocol(m),
            Failure::Ledger(e) => Failure::Ledger(e),
            Failure::UnsupportedApi { api } => Failure::UnsupportedApi { api },
            Failure::Timeout { op, after } => Failure::Timeout { op, after },
            Failure::Member(e) => Failure::Member(e),
        }
    }
}

// The decisions below are the crate `Error`'s (`Error::is_retriable`, a match on
// `Error::Broker`), asked of the failure the `Error` wraps.
impl<F: Unanswered> Failure<F> {
    /// Whether trying again may succeed: broker codes by [`KafkaCode::is_retriable`], the
    /// driver's failures by their own word, a timeout always, everything else never.
    pub fn is_retriable(&self) -> bool {
        match self {
            Failure::Unanswered(e) => e.is_retriable(),
            Failure::Broker { code, .. }
            | Failure::Member(MembershipFailure::Broker { code, .. }) => code.is_retriable(),
            Failure::Timeout { .. } => true,
            Failure::Protocol(_)
            | Failure::Ledger(_)
            | Failure::UnsupportedApi { .. }
            | Failure::Member(_) => false,
        }
    }

    /// The broker's error code, whether the ledger read it in an answer or the driver's failure
    /// carries it.
    pub fn broker_code(&self) -> Option<KafkaCode> {
        match self {
            Failure::Unanswered(e) => e.broker_code(),
            Failure::Broker { code, .. }
            | Failure::Member(MembershipFailure::Broker { code, .. }) => Some(*code),
            _ => None,
        }
    }

    /// Whether the ledger topic cannot serve, by what an answer said of it or because the
    /// broker lacks an API the ledger needs.
    pub fn cannot_serve(&self) -> bool {
        match self {
            Failure::Unanswered(e) => e.refused(),
            Failure::Ledger(_) => true,
            _ => false,
        }
    }
}

impl<F: fmt::Display> fmt::Display for Failure<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Unanswered(e) => fmt::Display::fmt(e, f),
            Failure::Broker { api, code, message } => {
                write!(f, "{api} failed: {code}")?;
                match message {
                    Some(m) => write!(f, " (broker says: {m})"),
                    None => Ok(()),
                }
            }
            Failure::Protocol(m) => write!(f, "unexpected answer from the cluster: {m}"),
            Failure::Ledger(e) => fmt::Display::fmt(e, f),
            Failure::UnsupportedApi { api } => write!(
                f,
                "the broker offers no version of {api} that kafka-lock implements; upgrade the \
                 broker or check that this is a Kafka-compatible endpoint"
            ),
            Failure::Timeout { op, after } => write!(f, "{op} timed out after {after:?}"),
            Failure::Member(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl<F: fmt::Debug + fmt::Display> std::error::Error for Failure<F> {}

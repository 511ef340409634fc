//! Sans-I/O wire layer: bytes in, typed Kafka messages out, and back. No tokio here.
//!
//! - [`code`]: the error codes brokers answer with, their names, retriability and meaning.
//! - [`frame`]: the 4-byte length prefix, validated before anything is buffered.
//! - [`codec`]: request headers and bodies out, response headers and bodies in.
//! - [`guard`]: the pre-scan that bounds the time and memory of every decode (design notes there).
//! - [`versions`]: what we implement and the per-API version negotiation.
//! - [`records`]: record batches (format v2): our encoder, and bounded decoding of fetched ones.
//! - [`log`]: Produce and Fetch on one partition: the requests, and what their answers say.

pub mod code;
pub mod codec;
pub mod coordinator;
pub mod frame;
pub mod guard;
pub mod log;
pub mod records;
pub mod sasl;
pub mod versions;

pub use codec::{decode_response, decode_response_frame, Request, Response};
pub use frame::DEFAULT_MAX_FRAME_SIZE;
pub use versions::NegotiatedVersions;

/// What the sans-I/O machines may ask of a request that got no answer they can read: the
/// driver's failure (a refused connection, a timeout, a closed or poisoned connection, a broker
/// that refused the connection's handshake), whose type belongs to the layers above them. A
/// machine decides with these answers and hands the failure back untouched inside its own
/// errors, so the caller sees the driver's words.
pub trait Unanswered: std::fmt::Display {
    /// Whether trying again (on a new connection, at a leader or coordinator looked up again)
    /// may succeed.
    fn is_retriable(&self) -> bool;
    /// The broker's error code, when the failure is a broker's refusal.
    fn broker_code(&self) -> Option<code::KafkaCode>;
    /// What the connection said of a frame it would not read (an answer larger than any frame
    /// accepted), when that is why it failed: the same request would fail the same way again.
    fn bad_frame(&self) -> Option<&dyn std::fmt::Display>;
}

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

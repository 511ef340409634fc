//! Sans-I/O wire layer: bytes in, typed Kafka messages out, and back. No tokio here.
//!
//! (The bounded-decoding design is documented in [`guard`].)

pub mod codec;
pub mod frame;
pub mod guard;
pub mod versions;

pub use codec::{decode_response, Request, Response};
pub use frame::{FrameError, DEFAULT_MAX_FRAME_SIZE};

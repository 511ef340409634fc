//! The tokio side: broker connections. This is the only part of the crate that owns sockets,
//! spawns tasks and reads the clock; everything it puts on or takes off the wire goes through the
//! sans-I/O [`crate::wire`] module.
//!
//! - [`Connection`]: one broker connection with pipelined requests, per-request timeouts and
//!   poisoning on desync (see its docs for the exact failure semantics).
//! - [`connect_any`]: bootstrap over a list of `host:port` addresses with rotation and jittered
//!   exponential backoff.
//! - `dial`: name resolution off the runtime and Happy Eyeballs over the resolved addresses.
//!
//! # Transport boundary
//! [`Connection::from_stream`] accepts any `AsyncRead + AsyncWrite + Send + Unpin` byte stream, so
//! TLS can later be layered by wrapping the `TcpStream` before handing it over, and SASL by running
//! its exchange on the stream before (or, for KIP-152 framed SASL, right after) the ApiVersions
//! handshake. Neither is implemented yet.

mod bootstrap;
mod conn;
#[cfg(feature = "tls-graviola")]
mod cpu;
pub(crate) mod describe;
mod dial;
mod secure;
#[cfg(test)]
mod tests;

pub use bootstrap::{connect_any, BootstrapAttempt, BootstrapConfig, BootstrapError};
pub use conn::{ConnConfig, Connection, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT};
#[cfg(feature = "tls-graviola")]
pub(crate) use cpu::check as graviola_cpu_check;
#[cfg(all(feature = "oauth", any(feature = "tls", feature = "tls-graviola")))]
pub(crate) use secure::crypto_provider;
pub(crate) mod ledger;
pub(crate) mod session;

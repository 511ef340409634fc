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
//! - `pool`: a client's connections, shared by its locks: per broker one quick connection and a
//!   capped pool of parking lanes (one parkable request each); see docs/design.md, "Many locks
//!   over one client".
//! - `inbox`: a lock's command queue and the end of its membership, each one small allocation
//!   where a tokio channel would take several hundred bytes from every held lock.
//! - `secure`: the TLS handshake (features `tls`, `tls-graviola`) and the SASL exchange, run by
//!   [`Connection::connect`] before any other request; KIP-368 re-authentication by replacing
//!   the connection's link.
//!
//! # Transport boundary
//! [`Connection::from_stream`] accepts any `AsyncRead + AsyncWrite + Send + Unpin` byte stream
//! already set up (TLS included); it runs the ApiVersions handshake and SASL over it.

mod bootstrap;
mod conn;
pub(crate) mod describe;
mod dial;
pub(crate) mod inbox;
pub(crate) mod lookup;
pub(crate) mod pool;
mod secure;
#[cfg(test)]
mod tests;

pub use bootstrap::{connect_any, BootstrapAttempt, BootstrapConfig, BootstrapError};
pub use conn::{ConnConfig, Connection, DEFAULT_CONNECT_TIMEOUT};
pub(crate) mod ledger;
pub(crate) mod session;

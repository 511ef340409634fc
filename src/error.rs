//! Errors.

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A Kafka error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KafkaCode(pub i16);

/// Everything that can go wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Placeholder.
    #[error("decode: {0}")]
    Decode(#[from] crate::wire::codec::DecodeError),
}

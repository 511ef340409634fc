//! Length-prefixed framing.

/// Default largest frame accepted from a broker.
pub const DEFAULT_MAX_FRAME_SIZE: usize = 1024 * 1024;

/// A frame that cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The length prefix is larger than the configured limit.
    #[error("frame of {size} bytes exceeds the {limit}-byte limit")]
    TooLarge { size: usize, limit: usize },
}

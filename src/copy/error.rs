//! [`CopyError`]: what the safe copy helpers and the copy pool refuse.

use super::simd::SimdLevel;

/// Errors of the copy module.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CopyError {
    /// The two slices given to a safe helper differ in length.
    #[error("length mismatch: destination has {dst} bytes, source has {src}")]
    LengthMismatch {
        /// Destination length in bytes.
        dst: usize,
        /// Source length in bytes.
        src: usize,
    },
    /// A kernel was requested for an instruction set this CPU lacks.
    #[error("{0} copy kernel requested but the CPU does not support it")]
    Unsupported(SimdLevel),
    /// A [`CopyPool`](super::CopyPool) was asked for zero threads.
    #[error("a copy pool needs at least one thread")]
    ZeroThreads,
    /// A [`CopyPool`](super::CopyPool) was asked for more than [`MAX_THREADS`](super::MAX_THREADS) threads.
    #[error("a copy pool of {requested} threads exceeds the maximum of {max}")]
    TooManyThreads {
        /// The thread count asked for.
        requested: usize,
        /// [`MAX_THREADS`](super::MAX_THREADS).
        max: usize,
    },
    /// The operating system refused to start a pool worker thread.
    #[error("spawning a copy worker thread failed: {0}")]
    Spawn(#[source] std::io::Error),
}

pub(super) fn check_lengths(dst: usize, src: usize) -> Result<(), CopyError> {
    if dst == src {
        Ok(())
    } else {
        Err(CopyError::LengthMismatch { dst, src })
    }
}

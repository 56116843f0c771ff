//! Which instruction set the copy kernels use ([`SimdLevel`]), detected once per process.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

/// The instruction set the copy kernels use, from the least to the most capable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// Aligned 8-byte accesses; the only level on targets other than x86_64.
    Scalar,
    /// SSE4.1: 16-byte streaming loads (`movntdqa`) and 16-byte non-temporal stores.
    Sse41,
    /// AVX2: 32-byte streaming loads and non-temporal stores.
    Avx2,
    /// AVX-512F: 64-byte streaming loads and non-temporal stores (one cache line each).
    Avx512,
}

impl SimdLevel {
    /// Every level, from the least to the most capable.
    pub const ALL: [SimdLevel; 4] = [
        SimdLevel::Scalar,
        SimdLevel::Sse41,
        SimdLevel::Avx2,
        SimdLevel::Avx512,
    ];

    /// Whether the running CPU supports this level (queries the CPU; not cached).
    pub fn is_supported(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Sse41 => std::arch::is_x86_feature_detected!("sse4.1"),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Short human-readable name, e.g. `"AVX-512"`.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Sse41 => "SSE4.1",
            SimdLevel::Avx2 => "AVX2",
            SimdLevel::Avx512 => "AVX-512",
        }
    }

    fn detect() -> SimdLevel {
        SimdLevel::ALL
            .into_iter()
            .rev()
            .find(|l| l.is_supported())
            .unwrap_or(SimdLevel::Scalar)
    }

    pub(super) fn to_bits(self) -> u8 {
        self as u8 + 1
    }

    pub(super) fn from_bits(bits: u8) -> Option<SimdLevel> {
        SimdLevel::ALL
            .get(usize::from(bits).checked_sub(1)?)
            .copied()
    }
}

impl fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The detected level, as `SimdLevel::to_bits`; 0 until the first call of [`simd_level`].
pub(super) static DETECTED: AtomicU8 = AtomicU8::new(0);

/// The most capable [`SimdLevel`] the running CPU supports, which [`copy_to_mapping`](super::copy_to_mapping) and
/// [`copy_from_mapping`](super::copy_from_mapping) use.
///
/// Detected on the first call and cached, so the hot path costs one relaxed atomic load.
///
/// ```
/// let level = vkgdr::copy::simd_level();
/// assert!(level.is_supported());
/// println!("copy kernels: {level}");
/// ```
pub fn simd_level() -> SimdLevel {
    if let Some(level) = SimdLevel::from_bits(DETECTED.load(Ordering::Relaxed)) {
        return level;
    }
    // Racing first callers detect the same value; storing it twice is harmless.
    let level = SimdLevel::detect();
    DETECTED.store(level.to_bits(), Ordering::Relaxed);
    level
}

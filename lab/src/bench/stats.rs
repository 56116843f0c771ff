//! The statistics of a measurement's samples: median, 10th and 90th percentile.

/// Median, 10th and 90th percentile of a set of samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    /// 50th percentile.
    pub median: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Number of samples.
    pub n: usize,
}

impl Stats {
    /// Statistics of `samples`; `None` if it is empty or holds a NaN.
    pub fn of(samples: &[f64]) -> Option<Stats> {
        if samples.is_empty() || samples.iter().any(|v| v.is_nan()) {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        Some(Stats {
            median: percentile(&sorted, 0.5),
            p10: percentile(&sorted, 0.1),
            p90: percentile(&sorted, 0.9),
            n: sorted.len(),
        })
    }
}

/// The `q`-quantile (0 ≤ q ≤ 1) of ascending `sorted` samples, interpolating linearly between
/// the two nearest ranks (NumPy's default). `sorted` must not be empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    debug_assert!(!sorted.is_empty());
    let rank = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

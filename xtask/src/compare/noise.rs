//! When a figure has moved ([`judge`]): beyond its noise, in the unit's direction; how much a figure scatters by itself ([`spread`]) and how few samples
//! it has ([`few_samples_percent`]), which widen its noise ([`noise_percent`]).
//!
//! The noise of a figure, in percent: the larger of the floor (`--tolerance`) and its spread in
//! either run, plus an allowance for few samples, `100 × (1/√n − 1/√50)` for the smaller sample
//! count `n` of the two runs below 50 (1 sample: +86, 2: +57, 5: +31, 10: +17.5, 16: +11, 30: +4).
//! A median of a handful of samples, each of them a driver call that lent machines of one model
//! time far apart (BENCHMARKS.md, 'Machines differ more than the code moved'), says little about a
//! quarter; it still says something about a factor of 2 or 3, and a figure with thousands of
//! samples (a cached 50 ns path) keeps the bare floor.

use serde::{Deserialize, Serialize};

use vkgdr_lab::bench::report::model::Figure;

/// A verdict on one figure, named in the JSON document in snake case (`within_noise`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Worse beyond its noise.
    Worse,
    /// Better beyond its noise.
    Better,
    /// Within its noise.
    WithinNoise,
    /// A figure of the driver or the hardware alone (origin `machine`) that moved beyond its
    /// noise, either way: the machine moved, not this library; never a regression.
    MachineMoved,
    /// A figure of this library that moved beyond its noise together with the machine work it is
    /// made of (driver calls or raw BAR copies, measured in the same run), not against it: the
    /// machine's driver or BAR moved; never a regression.
    MovedWithDriver,
    /// Only in the baseline.
    OnlyInBaseline,
    /// Only in this run.
    OnlyInCurrent,
    /// Units differ, or a median is not positive.
    NotComparable,
}

/// How much a figure scatters in one run: half its p10–p90 range relative to its median (0 with
/// fewer than two samples or no percentiles).
pub fn spread(f: &Figure) -> f64 {
    if f.samples < 2 || f.median <= 0.0 {
        return 0.0;
    }
    let s = (f.p90 - f.p10) / (2.0 * f.median);
    if s.is_finite() {
        s.max(0.0)
    } else {
        0.0
    }
}

/// The sample count from which a figure gets no allowance for few samples.
pub const ENOUGH_SAMPLES: usize = 50;

/// The allowance for few samples at one sample, in percent (it falls as 1/√n and reaches 0 at
/// [`ENOUGH_SAMPLES`]).
pub const FEW_SAMPLES_PERCENT: f64 = 100.0;

/// How much wider, in percent, the noise of a figure with `samples` samples is:
/// `FEW_SAMPLES_PERCENT × (1/√n − 1/√ENOUGH_SAMPLES)` below [`ENOUGH_SAMPLES`], else 0 (0 also
/// where the count is unknown, 0: documents that did not record it; a measured figure has at
/// least one sample).
pub fn few_samples_percent(samples: usize) -> f64 {
    match samples {
        n @ 1.. if n < ENOUGH_SAMPLES => {
            let root = |n: usize| (n as f64).sqrt();
            FEW_SAMPLES_PERCENT * (1.0 / root(n) - 1.0 / root(ENOUGH_SAMPLES))
        }
        _ => 0.0,
    }
}

/// The noise of a figure, in percent: the floor (in percent, as given) or the largest spread of
/// `figures` (the figure in either run), whichever is larger, plus the allowance for the fewest
/// samples among them ([`few_samples_percent`]); to a thousandth of a percent, so that the
/// comparison document reads back as written.
pub fn noise_percent(floor_percent: f64, figures: &[&Figure]) -> f64 {
    let widest = figures
        .iter()
        .fold(floor_percent, |noise, f| noise.max(spread(f) * 100.0));
    let fewest = figures
        .iter()
        .map(|f| f.samples)
        .filter(|&n| n > 0)
        .min()
        .unwrap_or(0);
    ((widest + few_samples_percent(fewest)) * 1000.0).round() / 1000.0
}

/// The verdict on a figure that went from `before` to `now` (medians), with noise `tolerance`
/// (a fraction): the factor by which it got worse is now/before for times and before/now for
/// rates.
pub fn judge(before: f64, now: f64, higher_is_better: bool, tolerance: f64) -> Verdict {
    if !(before > 0.0 && now > 0.0 && before.is_finite() && now.is_finite()) {
        return Verdict::NotComparable;
    }
    let worse_by = if higher_is_better {
        before / now
    } else {
        now / before
    };
    if worse_by > 1.0 + tolerance {
        Verdict::Worse
    } else if worse_by < 1.0 / (1.0 + tolerance) {
        Verdict::Better
    } else {
        Verdict::WithinNoise
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_follow_the_unit_direction_and_the_noise() {
        // Times: lower is better.
        assert_eq!(judge(100.0, 180.0, false, 0.1), Verdict::Worse);
        assert_eq!(judge(100.0, 109.0, false, 0.1), Verdict::WithinNoise);
        assert_eq!(judge(100.0, 111.0, false, 0.1), Verdict::Worse);
        assert_eq!(judge(100.0, 80.0, false, 0.1), Verdict::Better);
        assert_eq!(judge(100.0, 92.0, false, 0.1), Verdict::WithinNoise);
        // Rates: higher is better; the same factors, the other way.
        assert_eq!(judge(10.0, 5.0, true, 0.1), Verdict::Worse);
        assert_eq!(judge(10.0, 20.0, true, 0.1), Verdict::Better);
        assert_eq!(judge(10.0, 9.5, true, 0.1), Verdict::WithinNoise);
        // Nothing to divide by.
        assert_eq!(judge(0.0, 5.0, true, 0.1), Verdict::NotComparable);
        assert_eq!(judge(5.0, f64::NAN, true, 0.1), Verdict::NotComparable);
    }

    #[test]
    fn few_samples_widen_the_noise_and_many_do_not() {
        let close = |a: f64, b: f64| (a - b).abs() < 0.05;
        assert!(
            close(few_samples_percent(1), 85.9),
            "{}",
            few_samples_percent(1)
        );
        assert!(close(few_samples_percent(5), 30.6));
        assert!(close(few_samples_percent(10), 17.5));
        assert_eq!(few_samples_percent(ENOUGH_SAMPLES), 0.0);
        assert_eq!(few_samples_percent(100_000), 0.0);
        assert_eq!(few_samples_percent(0), 0.0, "older documents: as before");
        // It falls with every sample.
        for n in 1..ENOUGH_SAMPLES {
            assert!(few_samples_percent(n) > few_samples_percent(n + 1));
        }
    }

    #[test]
    fn verdicts_have_their_json_names() {
        for (v, name) in [
            (Verdict::Worse, "worse"),
            (Verdict::Better, "better"),
            (Verdict::WithinNoise, "within_noise"),
            (Verdict::MachineMoved, "machine_moved"),
            (Verdict::MovedWithDriver, "moved_with_driver"),
            (Verdict::OnlyInBaseline, "only_in_baseline"),
            (Verdict::OnlyInCurrent, "only_in_current"),
            (Verdict::NotComparable, "not_comparable"),
        ] {
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(json, format!("\"{name}\""));
            assert_eq!(serde_json::from_str::<Verdict>(&json).unwrap(), v);
        }
    }
}

//! When a figure has moved ([`judge`]): beyond its noise, in the unit's direction
//! ([`higher_is_better`]); how much a figure scatters by itself ([`spread`]), which widens its
//! noise ([`noise_percent`]).

use serde::{Deserialize, Serialize};

use super::results::FigureIn;
use crate::bench::report::model::Unit;

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
    /// Only in the baseline.
    OnlyInBaseline,
    /// Only in this run.
    OnlyInCurrent,
    /// Units differ, or a median is not positive.
    NotComparable,
}

/// How much a figure scatters in one run: half its p10–p90 range relative to its median (0 with
/// fewer than two samples or no percentiles).
pub fn spread(f: &FigureIn) -> f64 {
    match (f.p10, f.p90, f.samples) {
        (Some(p10), Some(p90), Some(n)) if n >= 2 && f.median > 0.0 => {
            let s = (p90 - p10) / (2.0 * f.median);
            if s.is_finite() {
                s.max(0.0)
            } else {
                0.0
            }
        }
        _ => 0.0,
    }
}

/// The noise of a figure, in percent: the floor (in percent, as given) or the largest spread of
/// `figures` (the figure in either run), whichever is larger.
pub fn noise_percent(floor_percent: f64, figures: &[&FigureIn]) -> f64 {
    figures
        .iter()
        .fold(floor_percent, |noise, f| noise.max(spread(f) * 100.0))
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

/// Whether a figure in `unit` (of a report saying `higher_is_better`) is better higher.
pub(super) fn higher_is_better(unit: &str, report_says: Option<bool>) -> bool {
    match Unit::parse(unit) {
        Some(u) => u == Unit::GigabytesPerSecond,
        None => report_says.unwrap_or(false),
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
    fn verdicts_have_their_json_names() {
        for (v, name) in [
            (Verdict::Worse, "worse"),
            (Verdict::Better, "better"),
            (Verdict::WithinNoise, "within_noise"),
            (Verdict::MachineMoved, "machine_moved"),
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

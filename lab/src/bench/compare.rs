//! `vkgdr bench compare OLD NEW` (and `vkgdr bench NAME --compare OLD` after a run): every figure
//! of a run beside the same figure of an earlier one, matched by report, method and size, with the
//! ratio of the medians and a mark where it moved beyond `--tolerance` in the unit's direction
//! (times and memory: lower is better; GB/s: higher).
//!
//! The plain rule for a user's two runs. The project's regression check against its committed
//! baselines, which also weighs each figure's spread and the machine rows a library figure is
//! made of, is `cargo xtask compare-bench` (xtask/, not installed with the tool).

use std::path::PathBuf;

use clap::builder::{NonEmptyStringValueParser, TypedValueParser};

use super::error::{BenchError, BenchResult};
use super::outputs::load_results;
use super::report::format::{align, fmt_size};
use crate::json::bench::BenchRun;

/// The smallest change, in percent, that `--tolerance` counts as a move by default.
pub const DEFAULT_TOLERANCE_PERCENT: u32 = 10;

/// The exit code when a figure got worse beyond the tolerance.
pub const EXIT_WORSE: u8 = 3;

/// `vkgdr bench compare`'s command line.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct CompareArgs {
    /// The earlier results: a results.json, or the --out directory that holds one
    #[arg(value_name = "OLD", value_parser = NonEmptyStringValueParser::new().map(PathBuf::from))]
    pub baseline: PathBuf,

    /// The newer results: a results.json, or the --out directory that holds one
    #[arg(value_name = "NEW", value_parser = NonEmptyStringValueParser::new().map(PathBuf::from))]
    pub current: PathBuf,

    /// The smallest change, in percent, that counts as a move
    #[arg(long, value_name = "PCT", default_value_t = DEFAULT_TOLERANCE_PERCENT,
          value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub tolerance: u32,
}

/// `vkgdr bench compare OLD NEW`: the table, and the exit code (0, or [`EXIT_WORSE`]).
pub fn main(args: &CompareArgs) -> BenchResult<u8> {
    // A file that cannot be read is the command line's fault: exit 2.
    let load = |path| load_results(path).map_err(|e| BenchError::Usage(e.to_string()));
    let (old, new) = (load(&args.baseline)?, load(&args.current)?);
    Ok(print(&old.benchmarks, &new.benchmarks, args.tolerance))
}

/// Prints the comparison of `new` with `old`; [`EXIT_WORSE`] when a figure got worse beyond
/// `tolerance` percent, else 0.
pub fn print(old: &[BenchRun], new: &[BenchRun], tolerance: u32) -> u8 {
    let (text, worse) = compare(old, new, tolerance);
    crate::ui::out(&text);
    if worse > 0 {
        EXIT_WORSE
    } else {
        0
    }
}

/// The comparison as a table, and how many figures got worse beyond `tolerance` percent.
/// Figures of one side only, and reference figures, are left out.
pub fn compare(old: &[BenchRun], new: &[BenchRun], tolerance: u32) -> (String, usize) {
    let floor = 1.0 + f64::from(tolerance) / 100.0;
    let reports = |runs: &'_ [BenchRun]| runs.iter().flat_map(|b| b.reports.clone()).collect();
    let (old, new): (Vec<_>, Vec<_>) = (reports(old), reports(new));
    let mut rows = vec![[
        "report",
        "method",
        "size",
        "before",
        "now",
        "now/before",
        "",
    ]
    .map(String::from)
    .to_vec()];
    let (mut worse, mut moved) = (0, 0);
    for r in &new {
        let Some(was) = old.iter().find(|o| o.name == r.name && o.unit == r.unit) else {
            continue;
        };
        for f in r.figures.iter().filter(|f| !f.is_reference()) {
            let Some(w) = was.get(&f.method, f.size).filter(|w| !w.is_reference()) else {
                continue;
            };
            let ratio = f.median / w.median;
            // How many times worse (above 1) or better (below 1), in the unit's direction.
            let factor = if r.unit.higher_is_better() {
                1.0 / ratio
            } else {
                ratio
            };
            let mark = if factor > floor {
                worse += 1;
                "worse"
            } else if factor < 1.0 / floor {
                moved += 1;
                "better"
            } else {
                ""
            };
            let size = if f.size == 0 {
                String::new()
            } else {
                fmt_size(f.size)
            };
            rows.push(vec![
                r.name.clone(),
                f.method.clone(),
                size,
                r.unit.format(w.median),
                r.unit.format(f.median),
                format!("{ratio:.3}"),
                mark.to_string(),
            ]);
        }
    }
    let mut text = align(&rows, &[0, 1]).join("\n");
    text.push_str(&format!(
        "\n{} figures compared: {worse} worse and {moved} better beyond {tolerance} %\n",
        rows.len() - 1
    ));
    (text, worse)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::model::{Figure, Report, Unit};
    use crate::bench::stats::Stats;

    fn run(unit: Unit, figures: &[(&str, f64)]) -> Vec<BenchRun> {
        let mut r = Report::new("copy", unit);
        for &(method, median) in figures {
            let s = Stats {
                median,
                p10: median,
                p90: median,
                n: 10,
            };
            r.figures.push(Figure::measured(method, 64, &s));
        }
        r.figures.push(Figure::reference("docs", 64, 1.0));
        vec![BenchRun {
            name: "copy".into(),
            seconds: 1.0,
            error: None,
            reports: vec![r],
        }]
    }

    #[test]
    fn moves_beyond_the_tolerance_are_marked_in_the_units_direction() {
        let old = run(
            Unit::Nanoseconds,
            &[("a", 100.0), ("b", 100.0), ("c", 100.0)],
        );
        let new = run(
            Unit::Nanoseconds,
            &[("a", 125.0), ("b", 105.0), ("c", 50.0)],
        );
        let (text, worse) = compare(&old, &new, 10);
        assert_eq!(worse, 1, "{text}");
        // After report, method, size, before and now (3 words of 2): the ratio and the mark.
        let end = |m: &str| {
            let line = text
                .lines()
                .find(|l| l.contains(&format!(" {m} ")))
                .unwrap();
            let words: Vec<&str> = line.split_whitespace().collect();
            words[8..].join(" ")
        };
        assert_eq!(end("a"), "1.250 worse", "{text}");
        assert_eq!(end("b"), "1.050", "{text}");
        assert_eq!(end("c"), "0.500 better", "{text}");
        assert!(
            !text.contains("docs"),
            "reference figures are left out: {text}"
        );
        assert!(text.ends_with("3 figures compared: 1 worse and 1 better beyond 10 %\n"));

        // GB/s: higher is better, so the same ratios read the other way.
        let old = run(Unit::GigabytesPerSecond, &[("a", 100.0), ("x", 1.0)]);
        let new = run(Unit::GigabytesPerSecond, &[("a", 50.0)]);
        let (text, worse) = compare(&old, &new, 10);
        assert_eq!(worse, 1, "{text}");
        assert!(text.contains("1 figures compared"), "{text}");
        assert_eq!(print(&old, &new, 100), 0);
    }
}

//! Results and their outputs: console tables, CSV, `summary.md`, PNG
//! charts (log-log, one line per method).
//!
//! - [`model`]: what a benchmark measured, [`Report`]s of rows in a unit;
//! - [`spec`]: what the registry says about a report: its title, table layout and anchor;
//! - [`format`](mod@format): numbers, durations and sizes as tables, charts and comparisons show
//!   them;
//! - [`table`]: a report as a text table or markdown, and `summary.md`;
//! - [`csv`]: a report as CSV;
//! - [`chart`]: a report as a log-log PNG chart.
//!
//! [`write_outputs`] writes a report's CSV and chart side by side.

pub mod chart;
pub mod csv;
pub mod format;
pub mod model;
pub mod spec;
pub mod table;

use std::path::{Path, PathBuf};

use crate::bench::error::{BenchError, BenchResult};
use chart::plot_png;
use csv::to_csv;
use model::Report;

/// Writes `DIR/<name>.csv` and `DIR/<name>.png`; returns their paths (no PNG when nothing is
/// plottable).
pub fn write_outputs(report: &Report, dir: &Path) -> BenchResult<(PathBuf, Option<PathBuf>)> {
    let csv = dir.join(format!("{}.csv", report.name));
    std::fs::write(&csv, to_csv(report)).map_err(|e| BenchError::io(&csv, e))?;
    let png = dir.join(format!("{}.png", report.name));
    let drawn = plot_png(report, &png)?;
    Ok((csv, drawn.then_some(png)))
}

#[cfg(test)]
mod tests {
    use super::model::tests::sample;
    use super::model::{Figure, Unit};
    use super::*;

    #[test]
    fn a_report_read_back_from_json_draws_the_same_chart() {
        let dir = tempfile::tempdir().unwrap();
        let r = sample();
        let (csv, png) = write_outputs(&r, dir.path()).unwrap();
        assert!(csv.is_file());
        let png = png.expect("plottable");
        let first = std::fs::read(&png).unwrap();
        assert_eq!(&first[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::remove_file(&png).unwrap();

        // Redraw from the report as results.json holds it.
        let back: Report = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        // Everything but the table layout, which the registry gives again.
        assert_eq!(
            back,
            Report {
                layout: back.layout,
                ..r.clone()
            }
        );
        assert!(plot_png(&back, &png).unwrap());
        assert_eq!(
            first,
            std::fs::read(&png).unwrap(),
            "same data, same picture"
        );

        // Nothing plottable: no file.
        let mut empty = Report::new("apiperf", Unit::Nanoseconds);
        empty.figures.push(Figure::reference("Gpu::open", 0, 1e6));
        let none = dir.path().join("none.png");
        assert!(!plot_png(&empty, &none).unwrap());
        assert!(!none.exists());
    }

    /// The width and height of a PNG file's image (its IHDR chunk).
    fn png_size(bytes: &[u8]) -> (u32, u32) {
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let word = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
        (word(16), word(20))
    }

    #[test]
    fn figures_of_one_size_are_drawn_as_bars_a_row_each() {
        use chart::BAR_ROW;
        let dir = tempfile::tempdir().unwrap();
        let stats = |median: f64| crate::bench::stats::Stats {
            median,
            p10: median * 0.9,
            p90: median * 1.2,
            n: 7,
        };
        let mut r = Report::new("tail-p99", Unit::Nanoseconds);
        let (three, six) = (dir.path().join("3.png"), dir.path().join("6.png"));
        for (k, name) in ["idle", "beside 7 lanes", "beside 7 staged lanes"]
            .iter()
            .enumerate()
        {
            r.figures.push(Figure::measured(
                *name,
                64,
                &stats(2000.0 + 500.0 * k as f64),
            ));
        }
        assert!(plot_png(&r, &three).unwrap());
        for k in 3..6 {
            r.figures
                .push(Figure::measured(format!("row {k}"), 64, &stats(3000.0)));
        }
        assert!(plot_png(&r, &six).unwrap());
        let (w3, h3) = png_size(&std::fs::read(&three).unwrap());
        let (w6, h6) = png_size(&std::fs::read(&six).unwrap());
        // A bar chart: a row of its own per figure, as wide whatever the count.
        assert_eq!(w3, w6);
        assert_eq!(h6 - h3, 3 * BAR_ROW);

        // Values six decades apart (a call that waits beside quick ones), one with a p10 of 0:
        // the bars' log axis.
        let mut wide = Report::new("waits-idle", Unit::Nanoseconds);
        wide.figures
            .push(Figure::measured("quick", 2 << 20, &stats(1200.0)));
        wide.figures
            .push(Figure::measured("waits", 2 << 20, &stats(2e9)));
        wide.figures[0].p10 = 0.0;
        let log = dir.path().join("log.png");
        assert!(plot_png(&wide, &log).unwrap());
        assert_eq!(png_size(&std::fs::read(&log).unwrap()).1, h3 - BAR_ROW);

        // Two sizes: the log-log chart, of its fixed size.
        r.figures
            .push(Figure::measured("row 6", 4096, &stats(4000.0)));
        let lines = dir.path().join("lines.png");
        assert!(plot_png(&r, &lines).unwrap());
        assert_eq!(png_size(&std::fs::read(&lines).unwrap()), (1100, 700));
    }
}

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
}

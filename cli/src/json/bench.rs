//! `vkgdr bench --json` ([`BenchDocument`], also `DIR/results.json`): each benchmark run with its
//! reports, every figure with its unit and the anchor it is compared with, measured in the same
//! run ([`ReportJson::new`]).

use serde::{Deserialize, Serialize};

use super::document::About;
use super::machine::{DeviceJson, MachineJson};
use crate::bench::registry::report_spec;
use crate::bench::report::model::{Report, Row};
use crate::bench::report::spec::{method_matches, Anchor};

/// `vkgdr bench --json` (also written to `DIR/results.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchDocument {
    /// `format: "vkgdr-bench"`.
    #[serde(flatten)]
    pub about: About,
    /// `full`, or `quick` (`--quick`: fewer sizes and repetitions).
    pub mode: String,
    /// Where the CSVs, charts and summary went.
    pub out_dir: String,
    /// The device measured (`--device`): its CUDA ordinal, UUID and name; `null` if no
    /// benchmark opened one (documents of earlier versions lack it: they measured device 0).
    #[serde(default)]
    pub device: Option<DeviceJson>,
    /// The machine, looked at after the first benchmark (so `apiperf` still meets a cold
    /// process); `null` if no benchmark ran.
    pub machine: Option<MachineJson>,
    /// Each benchmark run, in order.
    pub benchmarks: Vec<BenchRunJson>,
    /// What stopped the run outside any benchmark (an output file that could not be written).
    pub error: Option<String>,
    /// Whether every benchmark ran to the end and every output was written.
    pub ok: bool,
}

/// One benchmark of a `vkgdr bench` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRunJson {
    /// Its name (`copybw`, ...).
    pub name: String,
    /// How long it took.
    pub seconds: f64,
    /// What stopped it (`null`: it ran to the end).
    pub error: Option<String>,
    /// Its reports.
    pub reports: Vec<ReportJson>,
}

/// One report: a table of figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportJson {
    /// File stem of its CSV and PNG (`copybw-write`, ...).
    pub name: String,
    /// Its title.
    pub title: String,
    /// The unit of its figures: `ns` (per operation) or `GB/s` (10⁹ bytes per second).
    pub unit: String,
    /// Whether a higher figure is better (bandwidth) or a lower one (time).
    pub higher_is_better: bool,
    /// Remarks: what each method does, what was skipped and why.
    pub notes: Vec<String>,
    /// The figures, in measurement order.
    pub figures: Vec<FigureJson>,
}

/// One figure: a method at a size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FigureJson {
    /// What was measured.
    pub method: String,
    /// Bytes per operation (0 where a size does not apply).
    pub size_bytes: u64,
    /// `ns` or `GB/s`, as the report's.
    pub unit: String,
    /// Median over the samples.
    pub median: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Number of samples (0 for a reference value).
    pub samples: usize,
    /// `measured` here; `machine`, measured here of the driver or the hardware alone (no code of
    /// this library: its moves are the machine's); or `reference` (quoted from elsewhere, e.g.
    /// the C library's docs).
    pub origin: String,
    /// What it is compared with, measured in the same run (`null`: nothing).
    pub anchor: Option<AnchorJson>,
}

/// The figure a figure is compared with, measured in the same run at the same size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnchorJson {
    /// The report it is in.
    pub report: String,
    /// Its method.
    pub method: String,
    /// Its median, in the same unit.
    pub median: f64,
    /// This figure's median divided by the anchor's (`null` when the anchor's is 0).
    pub ratio: Option<f64>,
}

impl ReportJson {
    /// A report's figures, each with its anchor found among `run` (every report of the run).
    pub fn new(report: &Report, run: &[&Report]) -> ReportJson {
        let spec = report_spec(&report.name);
        let unit = report.unit.csv_name().to_string();
        let figures = report
            .rows
            .iter()
            .map(|row| FigureJson {
                method: row.method.clone(),
                size_bytes: row.size,
                unit: unit.clone(),
                median: row.median,
                p10: row.p10,
                p90: row.p90,
                samples: row.samples,
                origin: if row.reference {
                    "reference"
                } else if spec.is_some_and(|s| s.is_machine(&row.method)) {
                    "machine"
                } else {
                    "measured"
                }
                .to_string(),
                anchor: spec.and_then(|s| anchor(s.anchor, report, row, run)),
            })
            .collect();
        ReportJson {
            name: report.name.clone(),
            title: report.title(),
            unit,
            higher_is_better: report.unit.higher_is_better(),
            notes: report.notes.clone(),
            figures,
        }
    }
}

/// The anchor of `row` of `report`: the measured row that [`Anchor::of`] names, at the same
/// size, in the same run.
fn anchor(spec: Anchor, report: &Report, row: &Row, run: &[&Report]) -> Option<AnchorJson> {
    if row.reference {
        return None;
    }
    let (in_report, pattern) = spec.of(&report.name, &row.method)?;
    let other = run.iter().find(|r| r.name == in_report)?;
    let a = other.rows.iter().find(|a| {
        !a.reference
            && a.size == row.size
            && method_matches(pattern, &a.method)
            && !std::ptr::eq(*a, row)
    })?;
    let ratio = row.median / a.median;
    Some(AnchorJson {
        report: other.name.clone(),
        method: a.method.clone(),
        median: a.median,
        ratio: ratio.is_finite().then_some(ratio),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::bench::report::model::Unit;

    /// A report read back from its JSON form: what a comparison with an earlier run reads.
    pub(crate) fn to_report(j: &ReportJson) -> Option<Report> {
        let mut r = Report::new(&j.name, Unit::parse(&j.unit)?);
        r.notes = j.notes.clone();
        r.rows = j
            .figures
            .iter()
            .map(|f| Row {
                method: f.method.clone(),
                size: f.size_bytes,
                median: f.median,
                p10: f.p10,
                p90: f.p90,
                samples: f.samples,
                reference: f.origin == "reference",
            })
            .collect();
        Some(r)
    }
}

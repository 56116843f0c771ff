//! What a benchmark measured: a [`Report`] (of one benchmark, or one half of one) of
//! [`Figure`]s, each a method at a size with its median and percentiles, in one [`Unit`]. The
//! same types are the tables, the CSVs, the charts and `results.json` (serde), and what
//! `vkgdr bench plot` reads back.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::format::{fmt_bytes, fmt_ns, sig3};
use super::spec::Layout;
use crate::bench::stats::Stats;

/// What a report's values measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unit {
    /// Time per operation, nanoseconds (lower is better).
    #[serde(rename = "ns")]
    Nanoseconds,
    /// Bandwidth, 10⁹ bytes per second (higher is better).
    #[serde(rename = "GB/s")]
    GigabytesPerSecond,
    /// Memory held, bytes (lower is better).
    #[serde(rename = "bytes")]
    Bytes,
}

impl Unit {
    /// The name used in CSV files.
    pub fn csv_name(self) -> &'static str {
        match self {
            Unit::Nanoseconds => "ns",
            Unit::GigabytesPerSecond => "GB/s",
            Unit::Bytes => "bytes",
        }
    }

    /// Whether a larger value is better (rates), or a smaller one (times, memory).
    pub fn higher_is_better(self) -> bool {
        self == Unit::GigabytesPerSecond
    }

    /// The unit of a CSV or JSON unit name (`ns`, `GB/s`).
    pub fn parse(s: &str) -> Option<Unit> {
        match s {
            "ns" => Some(Unit::Nanoseconds),
            "GB/s" => Some(Unit::GigabytesPerSecond),
            "bytes" => Some(Unit::Bytes),
            _ => None,
        }
    }

    /// One value for a table cell.
    pub fn format(self, v: f64) -> String {
        match self {
            Unit::Nanoseconds => fmt_ns(v),
            Unit::GigabytesPerSecond => sig3(v),
            Unit::Bytes => fmt_bytes(v),
        }
    }
}

/// Where a figure comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Measured here, of this library's code.
    #[default]
    Measured,
    /// Measured here, of the driver or the hardware alone (no code of this library: its moves are
    /// the machine's); the registry names these rows ([`ReportSpec::machine`]).
    Machine,
    /// Quoted from elsewhere (e.g. the C library's documentation), not measured here.
    Reference,
}

impl Origin {
    /// Its name in CSV files and results.json.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Measured => "measured",
            Origin::Machine => "machine",
            Origin::Reference => "reference",
        }
    }
}

/// The figure a figure is compared with, measured in the same run at the same size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Anchored {
    /// The report it is in.
    pub report: String,
    /// Its method.
    pub method: String,
    /// Its median, in the same unit.
    pub median: f64,
    /// This figure's median divided by the anchor's (`null` when the anchor's is 0).
    pub ratio: Option<f64>,
}

/// One figure: a method at a size, from the measurement to every output (table, CSV, chart,
/// results.json, and the comparison of two runs, which reads results.json back). What a
/// document may lack reads as its default (no percentiles: NaN; no sample count: 0, unknown; no
/// origin: measured), so results written by earlier versions and by hand still read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// What was measured, e.g. `BAR write 4 thr`.
    pub method: String,
    /// Bytes per operation; 0 where size does not apply (e.g. `Gpu::open`).
    #[serde(rename = "size_bytes")]
    pub size: u64,
    /// Median over the samples (`null` in a document reads as NaN: JSON has no NaN, and
    /// serde_json writes a non-finite number as `null`).
    #[serde(deserialize_with = "null_is_nan")]
    pub median: f64,
    /// 10th percentile.
    #[serde(default = "nan", deserialize_with = "null_is_nan")]
    pub p10: f64,
    /// 90th percentile.
    #[serde(default = "nan", deserialize_with = "null_is_nan")]
    pub p90: f64,
    /// Number of samples (0 for reference values, and where a document does not say).
    #[serde(default)]
    pub samples: usize,
    /// Where it comes from.
    #[serde(default)]
    pub origin: Origin,
    /// What it is compared with, measured in the same run (`null`: nothing); set by
    /// [`resolve`](crate::bench::registry::resolve) when its benchmark ends.
    #[serde(default)]
    pub anchor: Option<Anchored>,
}

/// A missing number.
fn nan() -> f64 {
    f64::NAN
}

/// A number, or `null` read as NaN.
fn null_is_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

impl Figure {
    /// A measured figure from sample statistics.
    pub fn measured(method: impl Into<String>, size: u64, s: &Stats) -> Figure {
        Figure {
            method: method.into(),
            size,
            median: s.median,
            p10: s.p10,
            p90: s.p90,
            samples: s.n,
            origin: Origin::Measured,
            anchor: None,
        }
    }

    /// A reference value quoted from elsewhere.
    pub fn reference(method: impl Into<String>, size: u64, value: f64) -> Figure {
        Figure {
            method: method.into(),
            size,
            median: value,
            p10: value,
            p90: value,
            samples: 0,
            origin: Origin::Reference,
            anchor: None,
        }
    }

    /// Whether it is quoted rather than measured.
    pub fn is_reference(&self) -> bool {
        self.origin == Origin::Reference
    }
}

/// The results of one benchmark (or one half of one, e.g. `copybw-read`): a table of figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Short name: file stem of the CSV and PNG (`copylat`, `copybw-write`, …).
    pub name: String,
    /// Human title of tables and charts: the registry's.
    #[serde(default)]
    pub title: String,
    /// What the figures are.
    pub unit: Unit,
    /// Whether a higher figure is better (bandwidth) or a lower one (time, memory): the unit's
    /// ([`Unit::higher_is_better`]), written for readers of the document.
    #[serde(default)]
    pub higher_is_better: bool,
    /// Remarks: what each method does, what was skipped and why (not stored in the CSV).
    #[serde(default)]
    pub notes: Vec<String>,
    /// The figures, in measurement order (methods keep their first-appearance order).
    pub figures: Vec<Figure>,
    /// How its table is laid out: the registry's (not in the document: the registry gives it
    /// again to a report read back).
    #[serde(skip)]
    pub layout: Layout,
}

impl Report {
    /// An empty report titled by its name; the registry's title and layout come with
    /// [`describe`](crate::bench::registry::describe).
    pub fn new(name: &str, unit: Unit) -> Report {
        Report {
            name: name.to_string(),
            title: name.to_string(),
            unit,
            higher_is_better: unit.higher_is_better(),
            notes: Vec::new(),
            figures: Vec::new(),
            layout: Layout::Long,
        }
    }

    /// Method names in first-appearance order.
    pub fn methods(&self) -> Vec<&str> {
        let mut v: Vec<&str> = Vec::new();
        for r in &self.figures {
            if !v.contains(&r.method.as_str()) {
                v.push(&r.method);
            }
        }
        v
    }

    /// Distinct sizes, ascending.
    pub fn sizes(&self) -> Vec<u64> {
        let set: BTreeSet<u64> = self.figures.iter().map(|r| r.size).collect();
        set.into_iter().collect()
    }

    /// The figure of `method` at `size`.
    pub fn get(&self, method: &str, size: u64) -> Option<&Figure> {
        self.figures
            .iter()
            .find(|r| r.method == method && r.size == size)
    }

    /// Table layout: the registry's once [`describe`](crate::bench::registry::describe)d, else
    /// [`Layout::Long`].
    pub fn layout(&self) -> Layout {
        self.layout
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn units_read_back_and_say_which_way_is_better() {
        for u in [Unit::Nanoseconds, Unit::GigabytesPerSecond, Unit::Bytes] {
            assert_eq!(Unit::parse(u.csv_name()), Some(u));
        }
        assert_eq!(Unit::parse("records/s"), None);
        assert!(Unit::GigabytesPerSecond.higher_is_better());
        assert!(!Unit::Nanoseconds.higher_is_better());
        assert!(!Unit::Bytes.higher_is_better());
        assert_eq!(Unit::Bytes.format(50e6), "47.7 MiB");
    }

    /// A `copylat` report: two methods at three sizes (one with a comma and quotes in its
    /// name) and a reference value at one size.
    pub(crate) fn sample() -> Report {
        let mut r = Report::new("copylat", Unit::Nanoseconds);
        // As the registry describes it.
        r.title = "Write latency, host to GPU memory".into();
        r.layout = Layout::Wide;
        for (i, size) in [8u64, 64, 4096].into_iter().enumerate() {
            let base = 100.0 * (i + 1) as f64;
            let stats = |median, p10, p90, n| Stats {
                median,
                p10,
                p90,
                n,
            };
            r.figures.push(Figure::measured(
                "BAR write",
                size,
                &stats(base, base * 0.9, base * 1.3, 1000),
            ));
            r.figures.push(Figure::measured(
                "cuMemcpyHtoD, \"sync\"",
                size,
                &stats(7000.0 + 0.1 / 3.0 + size as f64, 6900.0, 8000.0, 200),
            ));
        }
        r.figures
            .push(Figure::reference("C library (docs)", 64, 200_000.0));
        r
    }
}

//! What a benchmark measured: a [`Report`] (of one benchmark, or one half of one) of [`Row`]s,
//! each a method at a size with its median and percentiles, in one [`Unit`].

use std::collections::BTreeSet;

use super::format::{fmt_bytes, fmt_ns, sig3};
use crate::bench::measure::Stats;

/// What a report's values measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Time per operation, nanoseconds (lower is better).
    Nanoseconds,
    /// Bandwidth, 10⁹ bytes per second (higher is better).
    GigabytesPerSecond,
    /// Memory held, bytes (lower is better).
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

/// One measured (or quoted) value: a method at a size.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// What was measured, e.g. `BAR write 4 thr`.
    pub method: String,
    /// Bytes per operation; 0 where size does not apply (e.g. `Gpu::open`).
    pub size: u64,
    /// Median over the samples.
    pub median: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Number of samples (0 for reference values).
    pub samples: usize,
    /// A value quoted from elsewhere (e.g. the C library's documentation), not measured here.
    pub reference: bool,
}

impl Row {
    /// A measured row from sample statistics.
    pub fn measured(method: impl Into<String>, size: u64, s: &Stats) -> Row {
        Row {
            method: method.into(),
            size,
            median: s.median,
            p10: s.p10,
            p90: s.p90,
            samples: s.n,
            reference: false,
        }
    }

    /// A reference value quoted from elsewhere.
    pub fn reference(method: impl Into<String>, size: u64, value: f64) -> Row {
        Row {
            method: method.into(),
            size,
            median: value,
            p10: value,
            p90: value,
            samples: 0,
            reference: true,
        }
    }
}

/// The results of one benchmark (or one half of one, e.g. `copybw-read`).
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Short name: file stem of the CSV and PNG (`copylat`, `copybw-write`, …).
    pub name: String,
    /// What the values are.
    pub unit: Unit,
    /// The rows, in measurement order (methods keep their first-appearance order).
    pub rows: Vec<Row>,
    /// Remarks printed under the table and in the summary (not stored in the CSV).
    pub notes: Vec<String>,
}

impl Report {
    /// An empty report.
    pub fn new(name: &str, unit: Unit) -> Report {
        Report {
            name: name.to_string(),
            unit,
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Method names in first-appearance order.
    pub fn methods(&self) -> Vec<&str> {
        let mut v: Vec<&str> = Vec::new();
        for r in &self.rows {
            if !v.contains(&r.method.as_str()) {
                v.push(&r.method);
            }
        }
        v
    }

    /// Distinct sizes, ascending.
    pub fn sizes(&self) -> Vec<u64> {
        let set: BTreeSet<u64> = self.rows.iter().map(|r| r.size).collect();
        set.into_iter().collect()
    }

    /// The row of `method` at `size`.
    pub fn get(&self, method: &str, size: u64) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.method == method && r.size == size)
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
        for (i, size) in [8u64, 64, 4096].into_iter().enumerate() {
            let base = 100.0 * (i + 1) as f64;
            r.rows.push(Row {
                method: "BAR write".into(),
                size,
                median: base,
                p10: base * 0.9,
                p90: base * 1.3,
                samples: 1000,
                reference: false,
            });
            r.rows.push(Row {
                method: "cuMemcpyHtoD, \"sync\"".into(),
                size,
                median: 7000.0 + 0.1 / 3.0 + size as f64,
                p10: 6900.0,
                p90: 8000.0,
                samples: 200,
                reference: false,
            });
        }
        r.rows
            .push(Row::reference("C library (docs)", 64, 200_000.0));
        r
    }
}

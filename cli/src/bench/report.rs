//! Results and their outputs: console tables, CSV (written and read back), `summary.md`, PNG
//! charts (log-log, one line per method).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::FontStyle;

use super::{report_spec, BenchError, BenchResult, Stats};

/// The embedded chart font (the GPU machine has no system fonts). DejaVu Sans, see
/// `assets/DejaVuSans.LICENSE`.
static FONT: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/DejaVuSans.ttf"
));

/// The font family name charts use (registered with plotters on first use).
const FAMILY: &str = "sans-serif";

/// What a report's values measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Time per operation, nanoseconds (lower is better).
    Nanoseconds,
    /// Bandwidth, 10⁹ bytes per second (higher is better).
    GigabytesPerSecond,
}

impl Unit {
    /// The name used in CSV files.
    pub fn csv_name(self) -> &'static str {
        match self {
            Unit::Nanoseconds => "ns",
            Unit::GigabytesPerSecond => "GB/s",
        }
    }

    /// The unit of a CSV or JSON unit name (`ns`, `GB/s`).
    pub fn parse(s: &str) -> Option<Unit> {
        match s {
            "ns" => Some(Unit::Nanoseconds),
            "GB/s" => Some(Unit::GigabytesPerSecond),
            _ => None,
        }
    }

    /// One value for a table cell.
    pub fn format(self, v: f64) -> String {
        match self {
            Unit::Nanoseconds => fmt_ns(v),
            Unit::GigabytesPerSecond => sig3(v),
        }
    }

    fn axis_label(self) -> &'static str {
        match self {
            Unit::Nanoseconds => "time (median)",
            Unit::GigabytesPerSecond => "bandwidth, GB/s (median)",
        }
    }
}

/// How a report is laid out as a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One row per size, one column per method (medians; latencies with p10–p90).
    Wide,
    /// One row per method and size with median, p10, p90 and sample count.
    Long,
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

/// What the registry ([`BENCHMARKS`](super::BENCHMARKS)) says about one report a benchmark
/// writes: its file stem, its title, its table layout and what its figures are compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportSpec {
    /// File stem of the CSV and PNG, and [`Report::name`].
    pub name: &'static str,
    /// Human title of tables and charts.
    pub title: &'static str,
    /// How the table is laid out.
    pub layout: Layout,
    /// The row each figure is compared with in the JSON results.
    pub anchor: Anchor,
}

/// The anchor of a figure: the row it is compared with, measured in the same run at the same
/// size (the driver's own copy, the raw limit, the path it replaces), so a ratio holds even when
/// machines differ from run to run. A method pattern is a method name, or `*` and the end of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    /// The figures stand alone.
    None,
    /// Every other method is compared with this one.
    Method(&'static str),
    /// Each `(method, anchor)` pair: rows of the first are compared with the second; methods not
    /// listed stand alone.
    Pairs(&'static [(&'static str, &'static str)]),
    /// Each method is compared with the same method in this other report of the same run.
    SameMethodIn(&'static str),
}

/// Whether `method` matches `pattern` (a name, or `*` and the end of one).
pub fn method_matches(pattern: &str, method: &str) -> bool {
    match pattern.strip_prefix('*') {
        Some(end) => method.ends_with(end),
        None => method == pattern,
    }
}

impl Anchor {
    /// The report and the method pattern that a row of `method` in report `report` is compared
    /// with, if any.
    pub fn of<'a>(&self, report: &'a str, method: &'a str) -> Option<(&'a str, &'a str)> {
        match *self {
            Anchor::None => None,
            Anchor::Method(m) => (!method_matches(m, method)).then_some((report, m)),
            Anchor::Pairs(pairs) => pairs
                .iter()
                .find(|(m, _)| method_matches(m, method))
                .map(|&(_, a)| (report, a)),
            Anchor::SameMethodIn(other) => (other != report).then_some((other, method)),
        }
    }
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

    /// Human title: the registry's, or the name itself for a report no benchmark registers (a
    /// foreign CSV given to `vkgdr bench plot`).
    pub fn title(&self) -> String {
        report_spec(&self.name).map_or_else(|| self.name.clone(), |k| k.title.to_string())
    }

    /// Table layout: the registry's, or [`Layout::Long`] for a foreign report.
    pub fn layout(&self) -> Layout {
        report_spec(&self.name).map_or(Layout::Long, |k| k.layout)
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

    fn cells(&self) -> (Vec<String>, Vec<Vec<String>>) {
        match self.layout() {
            Layout::Wide => {
                let methods = self.methods();
                let mut header = vec!["size".to_string()];
                header.extend(methods.iter().map(|m| m.to_string()));
                let body = self
                    .sizes()
                    .into_iter()
                    .map(|size| {
                        let mut line = vec![fmt_size(size)];
                        line.extend(methods.iter().map(|m| match self.get(m, size) {
                            Some(r) => self.wide_cell(r),
                            None => "–".to_string(),
                        }));
                        line
                    })
                    .collect();
                (header, body)
            }
            Layout::Long => {
                let u = self.unit.csv_name();
                let header = vec![
                    "method".to_string(),
                    "size".to_string(),
                    format!("median {u}"),
                    "p10".to_string(),
                    "p90".to_string(),
                    "samples".to_string(),
                ];
                let body = self
                    .rows
                    .iter()
                    .map(|r| {
                        let f = |v| self.unit.format(v);
                        if r.reference {
                            vec![
                                r.method.clone(),
                                fmt_size(r.size),
                                f(r.median),
                                "".into(),
                                "".into(),
                                "reference".into(),
                            ]
                        } else {
                            vec![
                                r.method.clone(),
                                fmt_size(r.size),
                                f(r.median),
                                f(r.p10),
                                f(r.p90),
                                r.samples.to_string(),
                            ]
                        }
                    })
                    .collect();
                (header, body)
            }
        }
    }

    fn wide_cell(&self, r: &Row) -> String {
        match self.unit {
            Unit::GigabytesPerSecond => sig3(r.median),
            Unit::Nanoseconds if r.reference => fmt_ns(r.median),
            Unit::Nanoseconds => fmt_ns_range(r.median, r.p10, r.p90),
        }
    }

    fn legend(&self) -> String {
        match (self.unit, self.layout()) {
            (Unit::GigabytesPerSecond, _) => "GB/s (10⁹ bytes/s), median over samples".into(),
            (Unit::Nanoseconds, Layout::Wide) => "median (p10–p90) per operation".into(),
            (Unit::Nanoseconds, Layout::Long) => "time per call".into(),
        }
    }

    /// The table as aligned plain text, title first.
    pub fn text_table(&self) -> String {
        let (header, body) = self.cells();
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for line in &body {
            for (w, c) in widths.iter_mut().zip(line) {
                *w = (*w).max(c.chars().count());
            }
        }
        let pad = |s: &str, w: usize, left: bool| {
            let fill = " ".repeat(w - s.chars().count());
            if left {
                format!("{s}{fill}")
            } else {
                format!("{fill}{s}")
            }
        };
        let fmt_line = |cells: &[String]| {
            let parts: Vec<String> = cells
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (c, w))| pad(c, *w, i == 0))
                .collect();
            parts.join("  ").trim_end().to_string()
        };
        let mut out = format!("{} [{}]\n", self.title(), self.legend());
        out += &fmt_line(&header);
        out.push('\n');
        let total = widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
        out += &"-".repeat(total);
        out.push('\n');
        for line in &body {
            out += &fmt_line(line);
            out.push('\n');
        }
        out
    }

    /// The table in markdown, with a heading and the notes as a list.
    pub fn markdown(&self) -> String {
        let (header, body) = self.cells();
        let esc = |s: &str| s.replace('|', "\\|");
        let mut out = format!("## {} (`{}`)\n\n{}.\n\n", self.title(), self.name, {
            let l = self.legend();
            let mut c = l.chars();
            c.next()
                .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
                .unwrap_or_default()
        });
        let _ = writeln!(
            out,
            "| {} |",
            header
                .iter()
                .map(|h| esc(h))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        let align: Vec<&str> = (0..header.len())
            .map(|i| if i == 0 { ":---" } else { "---:" })
            .collect();
        let _ = writeln!(out, "|{}|", align.join("|"));
        for line in &body {
            let _ = writeln!(
                out,
                "| {} |",
                line.iter().map(|c| esc(c)).collect::<Vec<_>>().join(" | ")
            );
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for n in &self.notes {
                let _ = writeln!(out, "- {n}");
            }
        }
        out.push('\n');
        out
    }
}

/// CSV header line (no trailing newline).
pub const CSV_HEADER: &str = "benchmark,method,size_bytes,unit,median,p10,p90,samples,origin";

/// Quotes a CSV field if it needs it (comma, quote, CR or LF).
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The report as CSV: [`CSV_HEADER`] then one line per row. Floats are written in Rust's
/// shortest round-trip form, so reading the file back gives the same values.
pub fn to_csv(report: &Report) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for r in &report.rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{}",
            csv_field(&report.name),
            csv_field(&r.method),
            r.size,
            report.unit.csv_name(),
            r.median,
            r.p10,
            r.p90,
            r.samples,
            if r.reference { "reference" } else { "measured" }
        );
    }
    out
}

/// Splits CSV text into records of fields (RFC 4180: quoted fields may hold commas, doubled
/// quotes and line breaks; CRLF or LF line ends; blank lines skipped).
pub fn parse_csv(text: &str) -> Result<Vec<Vec<String>>, String> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    let mut line = 1;
    // Whether the current field was quoted (then it exists even if empty).
    let mut field_started = false;
    while let Some(c) = chars.next() {
        if quoted {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => {
                    quoted = false;
                    if !matches!(chars.peek(), None | Some(',' | '\n' | '\r')) {
                        return Err(format!("line {line}: text after a closing quote"));
                    }
                }
                '\n' => {
                    line += 1;
                    field.push(c);
                }
                _ => field.push(c),
            }
            continue;
        }
        match c {
            '"' if field.is_empty() && !field_started => {
                quoted = true;
                field_started = true;
            }
            '"' => return Err(format!("line {line}: quote inside an unquoted field")),
            ',' => {
                record.push(std::mem::take(&mut field));
                field_started = false;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' | '\r' => {
                if !record.is_empty() || !field.is_empty() || field_started {
                    record.push(std::mem::take(&mut field));
                    records.push(std::mem::take(&mut record));
                }
                field_started = false;
                line += 1;
            }
            _ => field.push(c),
        }
    }
    if quoted {
        return Err(format!("line {line}: unterminated quoted field"));
    }
    if !record.is_empty() || !field.is_empty() || field_started {
        record.push(field);
        records.push(record);
    }
    Ok(records)
}

/// Parses CSV text written by [`to_csv`] back into a report (without notes).
pub fn from_csv(text: &str) -> Result<Report, String> {
    let records = parse_csv(text)?;
    let (header, body) = records.split_first().ok_or("empty file")?;
    if header.join(",") != CSV_HEADER {
        return Err(format!("unexpected header, want {CSV_HEADER:?}"));
    }
    let mut report: Option<Report> = None;
    for (i, rec) in body.iter().enumerate() {
        let at = |msg: String| format!("data row {}: {msg}", i + 1);
        let [bench, method, size, unit, median, p10, p90, samples, origin] = rec.as_slice() else {
            return Err(at(format!("{} fields, want 9", rec.len())));
        };
        let unit = Unit::parse(unit).ok_or_else(|| at(format!("unknown unit {unit:?}")))?;
        let num = |s: &str, what: &str| {
            s.parse::<f64>()
                .map_err(|_| at(format!("{what} {s:?} is not a number")))
        };
        let row = Row {
            method: method.clone(),
            size: size
                .parse()
                .map_err(|_| at(format!("size {size:?} is not an integer")))?,
            median: num(median, "median")?,
            p10: num(p10, "p10")?,
            p90: num(p90, "p90")?,
            samples: samples
                .parse()
                .map_err(|_| at(format!("samples {samples:?} is not an integer")))?,
            reference: match origin.as_str() {
                "measured" => false,
                "reference" => true,
                o => {
                    return Err(at(format!(
                        "origin {o:?} is neither measured nor reference"
                    )))
                }
            },
        };
        let r = report.get_or_insert_with(|| Report::new(bench, unit));
        if r.name != *bench || r.unit != unit {
            return Err(at(
                "rows of different benchmarks or units in one file".into()
            ));
        }
        r.rows.push(row);
    }
    report.ok_or_else(|| "no data rows".to_string())
}

/// Reads a CSV file into a report.
pub fn read_csv(path: &Path) -> BenchResult<Report> {
    let text = std::fs::read_to_string(path).map_err(|e| BenchError::io(path, e))?;
    from_csv(&text).map_err(|msg| BenchError::Csv {
        path: path.to_path_buf(),
        msg,
    })
}

/// Writes `DIR/<name>.csv` and `DIR/<name>.png`; returns their paths (no PNG when nothing is
/// plottable).
pub fn write_outputs(report: &Report, dir: &Path) -> BenchResult<(PathBuf, Option<PathBuf>)> {
    let csv = dir.join(format!("{}.csv", report.name));
    std::fs::write(&csv, to_csv(report)).map_err(|e| BenchError::io(&csv, e))?;
    let png = dir.join(format!("{}.png", report.name));
    let drawn = plot_png(report, &png)?;
    Ok((csv, drawn.then_some(png)))
}

/// `summary.md`: a header with the machine, every report's markdown table, and failures.
pub fn summary_markdown(machine: &[String], reports: &[Report], failures: &[String]) -> String {
    let mut out = String::from("# vkgdr benchmarks\n\n");
    for m in machine {
        let _ = writeln!(out, "- {m}");
    }
    out += "\nProduced by `vkgdr bench all`; CSVs and PNG charts lie next to this file.\n\n";
    for r in reports {
        out += &r.markdown();
    }
    if !failures.is_empty() {
        out += "## Failures\n\n";
        for f in failures {
            let _ = writeln!(out, "- {f}");
        }
    }
    out
}

/// Three significant digits without an exponent (`0.123`, `1.23`, `12.3`, `123`).
pub fn sig3(x: f64) -> String {
    let a = x.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// A duration in nanoseconds with a fitting unit (`85 ns`, `1.23 µs`, `12.3 ms`, `1.50 s`).
pub fn fmt_ns(ns: f64) -> String {
    let a = ns.abs();
    if a < 1e3 {
        format!("{} ns", sig3(ns))
    } else if a < 1e6 {
        format!("{} µs", sig3(ns / 1e3))
    } else if a < 1e9 {
        format!("{} ms", sig3(ns / 1e6))
    } else {
        format!("{} s", sig3(ns / 1e9))
    }
}

/// `median (p10–p90)` with the percentiles in the median's unit: `1.23 µs (1.10–1.50)`.
pub fn fmt_ns_range(median: f64, p10: f64, p90: f64) -> String {
    let m = fmt_ns(median);
    let (_, unit) = m.rsplit_once(' ').expect("value and unit");
    let scale = match unit {
        "ns" => 1.0,
        "µs" => 1e3,
        "ms" => 1e6,
        _ => 1e9,
    };
    format!("{m} ({}–{})", sig3(p10 / scale), sig3(p90 / scale))
}

/// Drops trailing zeros after a decimal point (`10.0 µs` → `10 µs`, `1.50` → `1.5`), for axis
/// labels.
pub fn trim_zeros(label: &str) -> String {
    let (num, rest) = label.split_once(' ').unwrap_or((label, ""));
    let num = if num.contains('.') {
        num.trim_end_matches('0').trim_end_matches('.')
    } else {
        num
    };
    if rest.is_empty() {
        num.to_string()
    } else {
        format!("{num} {rest}")
    }
}

/// Tick marks of a log size axis over `[lo, hi]`: `(labelled, grid)` powers of two. Labelled
/// ticks are thinned to every 2nd, 4th, … exponent (even exponents, so labels read 4 KiB,
/// 16 KiB, …) until at most `max` remain; the grid has every power of two.
pub fn size_ticks(lo: f64, hi: f64, max: usize) -> (Vec<f64>, Vec<f64>) {
    let e0 = lo.max(1.0).log2().ceil() as i32;
    let e1 = hi.max(1.0).log2().floor() as i32;
    let grid: Vec<i32> = (e0..=e1).collect();
    let mut step = 1;
    while grid.len().div_ceil(step) > max.max(1) {
        step *= 2;
    }
    let bold = grid
        .iter()
        .filter(|e| e.rem_euclid(step as i32) == 0)
        .map(|&e| 2f64.powi(e))
        .collect();
    (bold, grid.iter().map(|&e| 2f64.powi(e)).collect())
}

/// Tick marks of a log value axis over `[lo, hi]`: `(labelled, grid)`. Labelled ticks are
/// 1-2-5 × 10ᵏ, or only 10ᵏ when that would be more than `max`; the grid has 1…9 × 10ᵏ.
pub fn value_ticks(lo: f64, hi: f64, max: usize) -> (Vec<f64>, Vec<f64>) {
    let (lo, hi) = (lo.max(f64::MIN_POSITIVE), hi.max(f64::MIN_POSITIVE));
    let d0 = lo.log10().floor() as i32;
    let d1 = hi.log10().ceil() as i32;
    let in_range = |v: &f64| *v >= lo * (1.0 - 1e-9) && *v <= hi * (1.0 + 1e-9);
    let series = |mults: &[f64]| -> Vec<f64> {
        (d0..=d1)
            .flat_map(|d| mults.iter().map(move |m| m * 10f64.powi(d)))
            .filter(in_range)
            .collect()
    };
    let mut bold = series(&[1.0, 2.0, 5.0]);
    if bold.len() > max {
        bold = series(&[1.0]);
    }
    let grid = series(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    (bold, grid)
}

/// A byte count: exact binary units where they fit (`8 B`, `4 KiB`, `1 GiB`), three
/// significant digits otherwise; `-` for 0 (size does not apply).
pub fn fmt_size(bytes: u64) -> String {
    if bytes == 0 {
        return "-".into();
    }
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift {
            return if bytes & ((1 << shift) - 1) == 0 {
                format!("{} {unit}", bytes >> shift)
            } else {
                format!("{} {unit}", sig3(bytes as f64 / (1u64 << shift) as f64))
            };
        }
    }
    format!("{bytes} B")
}

fn font_ready() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok())
}

/// Line colours (Tableau 10), cycled.
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Draws `report` as a log-log PNG chart at `path`: x = size, y = median, one line per method
/// (reference values as crosses). Rows with size 0 or a non-positive value are left out;
/// returns `false` (and writes nothing) when no row remains.
pub fn plot_png(report: &Report, path: &Path) -> BenchResult<bool> {
    let pts: Vec<&Row> = report
        .rows
        .iter()
        .filter(|r| r.size > 0 && r.median > 0.0 && r.median.is_finite())
        .collect();
    if pts.is_empty() {
        return Ok(false);
    }
    if !font_ready() {
        return Err(BenchError::Plot {
            path: path.to_path_buf(),
            msg: "the embedded font could not be loaded".into(),
        });
    }
    draw(report, &pts, path)
        .map(|()| true)
        .map_err(|msg| BenchError::Plot {
            path: path.to_path_buf(),
            msg,
        })
}

fn draw(report: &Report, pts: &[&Row], path: &Path) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let fold = |f: fn(f64, f64) -> f64, init: f64, g: fn(&Row) -> f64| {
        pts.iter().map(|r| g(r)).fold(init, f)
    };
    let (x0, x1) = (
        fold(f64::min, f64::INFINITY, |r| r.size as f64),
        fold(f64::max, 0.0, |r| r.size as f64),
    );
    let (y0, y1) = (
        fold(f64::min, f64::INFINITY, |r| r.median),
        fold(f64::max, 0.0, |r| r.median),
    );

    let (x0, x1) = (x0 / 1.5, x1 * 1.5);
    let (y0, y1) = (y0 / 1.6, y1 * 1.6);
    let (x_bold, x_grid) = size_ticks(x0, x1, 12);
    let (y_bold, y_grid) = value_ticks(y0, y1, 14);
    let root = BitMapBackend::new(path, (1100, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(report.title(), (FAMILY, 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(90)
        .build_cartesian_2d(
            (x0..x1)
                .log_scale()
                .with_key_points(x_bold)
                .with_light_points(x_grid),
            (y0..y1)
                .log_scale()
                .with_key_points(y_bold)
                .with_light_points(y_grid),
        )
        .map_err(|x| e(&x))?;
    let unit = report.unit;
    chart
        .configure_mesh()
        .x_desc("size (bytes per operation)")
        .y_desc(unit.axis_label())
        .x_label_formatter(&|v| fmt_size(v.round() as u64))
        .y_label_formatter(&|v| trim_zeros(&unit.format(*v)))
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 17))
        .draw()
        .map_err(|x| e(&x))?;

    let mut drawn = 0;
    for method in report.methods() {
        let mut series: Vec<&Row> = pts.iter().copied().filter(|r| r.method == method).collect();
        if series.is_empty() {
            continue;
        }
        let color = COLORS[drawn % COLORS.len()];
        drawn += 1;
        series.sort_by_key(|r| r.size);
        let xy: Vec<(f64, f64)> = series.iter().map(|r| (r.size as f64, r.median)).collect();
        let style = color.stroke_width(2);
        if series.iter().all(|r| r.reference) {
            chart
                .draw_series(xy.iter().map(|p| Cross::new(*p, 8, style)))
                .map_err(|x| e(&x))?
                .label(method)
                .legend(move |(x, y)| Cross::new((x + 10, y), 5, style));
        } else {
            chart
                .draw_series(LineSeries::new(xy.clone(), style))
                .map_err(|x| e(&x))?
                .label(method)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            chart
                .draw_series(xy.iter().map(|p| Circle::new(*p, 3, color.filled())))
                .map_err(|x| e(&x))?;
        }
    }
    chart
        .configure_series_labels()
        // Bandwidth curves rise to a plateau (lower right is free); latency curves rise to the
        // right (upper left is free).
        .position(match unit {
            Unit::GigabytesPerSecond => SeriesLabelPosition::LowerRight,
            Unit::Nanoseconds => SeriesLabelPosition::UpperLeft,
        })
        .label_font((FAMILY, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::TempDir;
    use super::*;

    fn sample() -> Report {
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

    #[test]
    fn formats_sizes_and_durations() {
        assert_eq!(fmt_size(0), "-");
        assert_eq!(fmt_size(8), "8 B");
        assert_eq!(fmt_size(1023), "1023 B");
        assert_eq!(fmt_size(4096), "4 KiB");
        assert_eq!(fmt_size(1536), "1.50 KiB");
        assert_eq!(fmt_size(64 << 20), "64 MiB");
        assert_eq!(fmt_size(1 << 30), "1 GiB");
        assert_eq!(fmt_ns(85.4), "85.4 ns");
        assert_eq!(fmt_ns(1234.0), "1.23 µs");
        assert_eq!(fmt_ns(200_000.0), "200 µs");
        assert_eq!(fmt_ns(12.3e6), "12.3 ms");
        assert_eq!(fmt_ns(1.5e9), "1.50 s");
        assert_eq!(sig3(0.1234), "0.123");
        assert_eq!(sig3(0.0), "0");
    }

    #[test]
    fn latency_ranges_share_the_median_unit_and_axis_labels_trim_zeros() {
        assert_eq!(fmt_ns_range(60.9, 54.8, 79.2), "60.9 ns (54.8–79.2)");
        assert_eq!(fmt_ns_range(901.0, 811.0, 1170.0), "901 ns (811–1170)");
        assert_eq!(fmt_ns_range(1234.0, 1100.0, 1500.0), "1.23 µs (1.10–1.50)");
        assert_eq!(fmt_ns_range(2e9, 1e9, 3e9), "2.00 s (1.00–3.00)");
        assert_eq!(trim_zeros("10.0 µs"), "10 µs");
        assert_eq!(trim_zeros("1.50"), "1.5");
        assert_eq!(trim_zeros("100 ns"), "100 ns");
        assert_eq!(trim_zeros("0.500"), "0.5");
    }

    #[test]
    fn size_ticks_are_powers_of_two_thinned_to_the_label_budget() {
        let (bold, grid) = size_ticks(3000.0, 1.6e9, 12);
        assert_eq!(grid.first(), Some(&4096.0));
        assert_eq!(grid.last(), Some(&((1u64 << 30) as f64)));
        assert_eq!(grid.len(), 19);
        // 19 powers of two, at most 12 labels: every 2nd, on even exponents.
        assert_eq!(bold.len(), 10);
        assert_eq!(bold[0], 4096.0);
        assert_eq!(bold[1], 16384.0);
        let (bold, grid) = size_ticks(5.0, 70.0, 12);
        assert_eq!(grid, vec![8.0, 16.0, 32.0, 64.0]);
        assert_eq!(bold, grid);
    }

    #[test]
    fn value_ticks_use_1_2_5_or_decades() {
        let (bold, grid) = value_ticks(0.3, 40.0, 14);
        assert_eq!(bold, vec![0.5, 1.0, 2.0, 5.0, 10.0, 20.0]);
        assert!(grid.iter().all(|g| (0.3 * 0.999..=40.0).contains(g)));
        assert_eq!(grid.len(), 7 + 9 + 4); // 0.3…0.9, 1…9, 10…40
                                           // Seven decades: 1-2-5 would be 21 labels, so only powers of ten.
        let (bold, _) = value_ticks(30.0, 3e8, 14);
        assert_eq!(bold, vec![100.0, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8]);
    }

    #[test]
    fn csv_fields_are_quoted_only_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("two\nlines"), "\"two\nlines\"");
    }

    #[test]
    fn csv_parser_handles_quotes_crlf_and_empty_fields() {
        let recs = parse_csv("a,\"b,c\",\"d\"\"e\"\r\n,,\n\n\"x\ny\",\"\"\n").unwrap();
        assert_eq!(
            recs,
            vec![vec!["a", "b,c", "d\"e"], vec!["", "", ""], vec!["x\ny", ""],]
        );
        // No trailing newline.
        assert_eq!(parse_csv("1,2").unwrap(), vec![vec!["1", "2"]]);
        assert!(parse_csv("\"open").is_err());
        assert!(parse_csv("a\"b").is_err());
        assert!(parse_csv("\"a\"b").is_err());
    }

    #[test]
    fn csv_round_trips_exactly() {
        let r = sample();
        let text = to_csv(&r);
        assert!(text.starts_with(CSV_HEADER));
        assert_eq!(text.lines().count(), 1 + r.rows.len());
        let back = from_csv(&text).unwrap();
        assert_eq!(back, Report { notes: vec![], ..r });
    }

    #[test]
    fn csv_reader_rejects_malformed_files() {
        let good = to_csv(&sample());
        assert!(from_csv("").is_err());
        assert!(from_csv(CSV_HEADER).is_err(), "no data rows");
        assert!(from_csv(&good.replacen("median", "mean", 1)).is_err());
        assert!(from_csv(&good.replace(",ns,", ",ms,")).is_err());
        assert!(from_csv(&good.replacen(",1000,", ",lots,", 1)).is_err());
        assert!(from_csv(&good.replacen("measured", "guessed", 1)).is_err());
        let mut mixed = good.clone();
        mixed += "copybw-read,x,8,ns,1,1,1,1,measured\n";
        assert!(from_csv(&mixed).is_err());
        assert!(from_csv(&format!("{CSV_HEADER}\ncopylat,x,8\n")).is_err());
    }

    #[test]
    fn wide_table_has_one_line_per_size_and_one_column_per_method() {
        let r = sample();
        let t = r.text_table();
        let lines: Vec<&str> = t.lines().collect();
        // Title, header, rule, one line per size (8, 64, 4096).
        assert_eq!(lines.len(), 3 + 3);
        assert!(lines[1].starts_with("size"));
        assert!(lines[1].contains("C library (docs)"));
        assert!(lines[3].starts_with("8 B"));
        assert!(lines[3].contains("100 ns (90.0–130)"));
        // The reference exists only at 64 B.
        assert!(lines[3].trim_end().ends_with('–'));
        assert!(lines[4].contains("200 µs"));
        assert!(lines[5].starts_with("4 KiB"));
    }

    #[test]
    fn long_table_and_markdown_list_every_row() {
        let mut r = sample();
        r.name = "apiperf".into();
        r.notes.push("a note".into());
        let t = r.text_table();
        assert_eq!(t.lines().count(), 3 + r.rows.len());
        assert!(t.contains("reference"));
        let md = r.markdown();
        assert!(md.starts_with("## API call cost (`apiperf`)"));
        let table_lines = md.lines().filter(|l| l.starts_with('|')).count();
        assert_eq!(table_lines, 2 + r.rows.len());
        assert!(md.contains("\n- a note\n"));
        // A pipe in a method name is escaped.
        r.rows[0].method = "a|b".into();
        assert!(r.markdown().contains("a\\|b"));

        let s = summary_markdown(&["GPU: test".into()], &[r], &["pplat: boom".into()]);
        assert!(s.starts_with("# vkgdr benchmarks\n\n- GPU: test\n"));
        assert!(s.contains("## Failures\n\n- pplat: boom\n"));
    }

    #[test]
    fn csv_to_png_round_trip() {
        let dir = TempDir::new("plot");
        let r = sample();
        let (csv, png) = write_outputs(&r, &dir.0).unwrap();
        let png = png.expect("plottable");
        let first = std::fs::read(&png).unwrap();
        assert_eq!(&first[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::remove_file(&png).unwrap();

        // Redraw from the CSV alone.
        let back = read_csv(&csv).unwrap();
        assert!(plot_png(&back, &png).unwrap());
        let second = std::fs::read(&png).unwrap();
        assert_eq!(&second[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(first, second, "same data, same picture");

        // Nothing plottable: no file.
        let mut empty = Report::new("apiperf", Unit::Nanoseconds);
        empty.rows.push(Row::reference("Gpu::open", 0, 1e6));
        let none = dir.0.join("none.png");
        assert!(!plot_png(&empty, &none).unwrap());
        assert!(!none.exists());
    }
}

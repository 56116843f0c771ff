//! A comparison as text ([`Comparison::text`]): a header naming both runs, a table per report
//! with each figure's ratio, its ratio against the machine work it is made of (driver calls or raw
//! BAR copies, where the registry names some) and its noise, and a summary naming every figure
//! that got worse.

use super::comparison::Comparison;
use super::document::GpuMatch;
use super::noise::{Verdict, ENOUGH_SAMPLES};
use super::results::{GpuJson, SideJson};
use vkgdr_lab::bench::report::format::{align, fmt_size, sig3};
use vkgdr_lab::bench::report::model::Unit;

impl Comparison {
    /// The comparison as text: a header, a table per report, a summary.
    pub fn text(&self) -> String {
        let d = &self.doc;
        let mut out = String::new();
        let side = |s: &SideJson| {
            let mut parts = vec![s
                .gpu
                .as_ref()
                .map_or_else(|| "GPU unknown".to_string(), GpuJson::describe)];
            if let Some(v) = &s.driver_version {
                parts.push(format!("driver {v}"));
            }
            if let Some(v) = &s.vkgdr_version {
                parts.push(format!("vkgdr {v}"));
            }
            if let Some(m) = &s.mode {
                parts.push(format!("{m} run"));
            }
            if !s.failed_benchmarks.is_empty() {
                parts.push(format!("failed: {}", s.failed_benchmarks.join(", ")));
            }
            parts.join(", ")
        };
        match &d.baseline {
            None => {
                out += &format!("Comparison of {}: no baseline\n", d.current.file);
                for n in &d.notes {
                    out += &format!("  {n}\n");
                }
                return out;
            }
            Some(b) => {
                out += &format!(
                    "Comparison with {} (noise: the larger of {} % and a figure's own spread, \
                     wider with fewer than {ENOUGH_SAMPLES} samples; figures that are mostly \
                     driver calls, BAR copies or the CPU's own work also against that machine \
                     work)\n",
                    b.file,
                    percent(d.tolerance_percent)
                );
                out += &format!("  before: {}\n", side(b));
                out += &format!("  now:    {} ({})\n", side(&d.current), d.current.file);
                out += &format!(
                    "  {}\n",
                    match d.gpu_match {
                        GpuMatch::SameGpu => "the same GPU: moves beyond noise count",
                        GpuMatch::SameModel =>
                            "the same GPU model, another card: moves beyond noise count",
                        GpuMatch::DifferentGpu | GpuMatch::UnknownGpu | GpuMatch::NoBaseline =>
                            "information only: nothing counts as a regression",
                    }
                );
                for n in &d.notes {
                    out += &format!("  note: {n}\n");
                }
            }
        }
        let worse_mark = if d.judged { "WORSE" } else { "worse" };
        let mut report = "";
        let mut rows: Vec<[String; 8]> = Vec::new();
        let flush = |out: &mut String, rows: &mut Vec<[String; 8]>| {
            if rows.len() > 1 {
                // The method and the mark flush left, the figures flush right.
                for line in align(rows, &[0, 7]) {
                    out.push_str(format!("  {line}").trim_end());
                    out.push('\n');
                }
            }
            rows.clear();
        };
        for f in &d.figures {
            if f.report != report {
                flush(&mut out, &mut rows);
                report = &f.report;
                out += &format!(
                    "\n{report} ({}, {} is better)\n",
                    f.unit,
                    if f.higher_is_better {
                        "higher"
                    } else {
                        "lower"
                    }
                );
                rows.push(
                    [
                        "method",
                        "size",
                        "before",
                        "now",
                        "now/before",
                        "vs machine",
                        "noise",
                        "",
                    ]
                    .map(String::from),
                );
            }
            let value = |v: Option<f64>| v.map_or_else(|| "–".to_string(), |v| fmt(&f.unit, v));
            let mark = match f.verdict {
                Verdict::Worse => worse_mark,
                Verdict::Better => "better",
                Verdict::WithinNoise => "",
                Verdict::MachineMoved => "machine",
                Verdict::MovedWithDriver => "with machine",
                Verdict::OnlyInBaseline => "only before",
                Verdict::OnlyInCurrent => "new",
                Verdict::NotComparable => "not comparable",
            };
            rows.push([
                f.method.clone(),
                fmt_size(f.size_bytes),
                value(f.baseline),
                value(f.current),
                f.ratio
                    .map_or_else(|| "–".to_string(), |r| format!("{}×", sig3(r))),
                f.driver_work
                    .as_ref()
                    .map_or_else(String::new, |w| format!("{}×", sig3(w.anchored_ratio))),
                format!("±{} %", percent(f.tolerance_percent)),
                mark.to_string(),
            ]);
        }
        flush(&mut out, &mut rows);
        let s = &d.summary;
        out += &format!(
            "\n{} figure(s) compared: {} worse beyond noise, {} better, {} within noise, {} of the \
             driver or hardware alone moved (the machine's, not counted), {} of the library moved \
             with the machine work they are made of (not counted)",
            s.compared,
            s.worse,
            s.better,
            s.within_noise,
            s.machine_moved,
            s.moved_with_driver
        );
        if s.only_in_baseline + s.only_in_current > 0 {
            out += &format!(
                "; {} only in the baseline, {} only in this run",
                s.only_in_baseline, s.only_in_current
            );
        }
        if s.not_comparable > 0 {
            out += &format!("; {} not comparable", s.not_comparable);
        }
        out += "\n";
        if d.regressed {
            out += &format!(
                "REGRESSION: {} figure(s) got worse beyond their noise on the same GPU model:\n",
                s.worse
            );
            for f in d.figures.iter().filter(|f| f.verdict == Verdict::Worse) {
                let (b, c) = (f.baseline.unwrap_or(0.0), f.current.unwrap_or(0.0));
                out += &format!(
                    "  {} / {} @ {}: {} → {} ({}× the {}; noise ±{} %)\n",
                    f.report,
                    f.method,
                    fmt_size(f.size_bytes),
                    fmt(&f.unit, b),
                    fmt(&f.unit, c),
                    sig3(c / b),
                    if f.higher_is_better { "rate" } else { "time" },
                    percent(f.tolerance_percent)
                );
                if let Some(w) = &f.driver_work {
                    // Worse against the machine work too: the library's share got slower.
                    out += &format!(
                        "    against its machine work ({}): {}× for the machine, {}× for the \
                         figure against it (noise ±{} %)\n",
                        w.methods.join(" + "),
                        sig3(w.ratio),
                        sig3(w.anchored_ratio),
                        percent(w.tolerance_percent)
                    );
                }
                if let (Some(m), Some(rb), Some(rc)) = (
                    &f.anchor_method,
                    f.anchor_ratio_baseline,
                    f.anchor_ratio_current,
                ) {
                    // The same ratio against the anchor means the machine moved, not the code.
                    out += &format!(
                        "    against {m:?} in the same run: {}× before, {}× now\n",
                        sig3(rb),
                        sig3(rc)
                    );
                }
            }
        } else if d.judged {
            out += "No figure got worse beyond its noise.\n";
        } else {
            out += "Information only: the GPUs differ or are unknown, nothing is judged.\n";
        }
        out
    }
}

impl GpuJson {
    fn describe(&self) -> String {
        match &self.uuid {
            Some(u) => format!("{} (uuid {u})", self.name),
            None => self.name.clone(),
        }
    }
}

/// A percentage: whole where it is whole (`10`), else to a tenth (`12.5`).
fn percent(p: f64) -> String {
    if (p - p.round()).abs() < 0.05 {
        format!("{p:.0}")
    } else {
        format!("{p:.1}")
    }
}

/// A value in its unit, for a table cell.
fn fmt(unit: &str, v: f64) -> String {
    match Unit::parse(unit) {
        Some(Unit::Nanoseconds) => Unit::Nanoseconds.format(v),
        Some(Unit::GigabytesPerSecond) => format!("{} GB/s", sig3(v)),
        Some(Unit::Bytes) => Unit::Bytes.format(v),
        None => format!("{} {unit}", sig3(v)),
    }
}

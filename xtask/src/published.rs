//! The published results (`docs/bench/results.json`, the last full run, with a CSV and a chart
//! per report beside it) checked against the benchmarks' registry: every published report is a
//! registered one with its title and files, and every row the registry names (anchors, machine
//! rows) is a row the benchmarks write. A file that is missing fails the check; a benchmark that
//! `all` leaves out (run by name only) is the only one not looked for.

use crate::testutil::repo_path;
use vkgdr_lab::bench::registry::{report_spec, BENCHMARKS};
use vkgdr_lab::bench::report::model::Report;
use vkgdr_lab::bench::report::spec::{Anchor, ReportSpec, Rows};
use vkgdr_lab::bench::{copybw, copylat};
use vkgdr_lab::json::bench::BenchDocument;

/// The reports of the last full run, `docs/bench/results.json` (a missing or unreadable file
/// fails the test that reads it).
pub fn published() -> Vec<Report> {
    let path = repo_path("docs/bench/results.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc: BenchDocument =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    doc.benchmarks.into_iter().flat_map(|b| b.reports).collect()
}

/// The published report of `spec`: every report of a benchmark `all` runs is among them;
/// `None` only for a benchmark run by name only (`xproc`), which a full run leaves out.
fn published_report<'a>(published: &'a [Report], spec: &ReportSpec) -> Option<&'a Report> {
    let found = published.iter().find(|r| r.name == spec.name);
    let bench = BENCHMARKS
        .iter()
        .find(|b| b.reports.iter().any(|r| r.name == spec.name))
        .unwrap();
    assert!(
        found.is_some() || !bench.in_all,
        "{} is missing from docs/bench/results.json",
        spec.name
    );
    found
}

#[test]
fn the_published_results_are_all_registered_reports() {
    // docs/bench/results.json holds the last full run: each report must be one of ours, with
    // its registered title, and its chart and CSV beside it.
    let published = published();
    for report in &published {
        let spec = report_spec(&report.name)
            .unwrap_or_else(|| panic!("{} is no registered report", report.name));
        assert_eq!(report.title, spec.title);
        for ext in ["csv", "png"] {
            let file = repo_path(&format!("docs/bench/{}.{ext}", report.name));
            assert!(file.is_file(), "{}", file.display());
        }
    }
    assert!(published.len() >= 10, "only {} reports", published.len());
}

/// The methods that report `name`'s code measures, where its benchmark lists them all, and the
/// rows it writes that are newer than the published run ([`NEWER_THAN_PUBLISHED`]): rows that a
/// GPU run of this tree writes though the published results may predate them.
pub fn measured_by_code(name: &str) -> Vec<String> {
    match name {
        "copybw-write" | "copybw-read" => copybw::methods(name),
        "copylat" => copylat::METHODS.map(String::from).to_vec(),
        _ => Vec::new(),
    }
}

/// Rows a report's code writes that the published run (docs/bench/results.json) predates, by
/// report: known to the registry's tests until the next full run is published. None now: the
/// published run writes every row of the tree's code.
pub const NEWER_THAN_PUBLISHED: [(&str, &[&str]); 0] = [];

/// [`NEWER_THAN_PUBLISHED`]'s rows of report `name`.
pub fn newer_than_published(name: &str) -> &'static [&'static str] {
    NEWER_THAN_PUBLISHED
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(&[], |(_, rows)| rows)
}

#[test]
fn anchors_and_machine_rows_name_rows_the_benchmarks_write() {
    // Every anchor and machine entry matches a row of the published results (where the
    // report is among them), so no figure loses its anchor or its origin to a row the
    // benchmark no longer writes (the names are the constants the benchmarks write with, so
    // a rename in one place is a compile error; this catches a constant left unused).
    let published = published();
    let mut checked = 0;
    for spec in BENCHMARKS.iter().flat_map(|b| b.reports) {
        let Some(report) = published_report(&published, spec) else {
            continue;
        };
        let code = measured_by_code(spec.name);
        let mut methods = report.methods();
        methods.extend(code.iter().map(String::as_str));
        methods.extend(newer_than_published(spec.name));
        let mut entries: Vec<Rows> = spec.machine.to_vec();
        match spec.anchor {
            Anchor::None | Anchor::SameMethodIn(_) => {}
            Anchor::Method(m) => entries.push(Rows::Is(m)),
            Anchor::Pairs(p) => entries.extend(p.iter().flat_map(|&(a, b)| [a, b])),
        }
        for rows in entries {
            let names: &[&str] = match rows {
                Rows::AnyOf(names) => names,
                _ => &[],
            };
            // Each name of a list is written, not only one of them.
            for name in names {
                assert!(methods.contains(name), "{}: no row {name:?}", spec.name);
            }
            assert!(
                methods.iter().any(|m| rows.matches(m)),
                "{}: no row matches {rows} (rows: {methods:?})",
                spec.name
            );
            checked += 1;
        }
    }
    assert!(checked >= 30, "only {checked} entries checked");
}

//! What a run leaves behind: each report printed as a table and written as a CSV and a PNG chart
//! ([`emit`]), `summary.md` under the machine's facts ([`write_summary`], [`machine_lines`]) and
//! `results.json`, the document `--json` prints ([`document`], [`write_results`]); and `vkgdr bench
//! plot DIR`, which redraws the charts from `results.json` ([`replot`]).

use std::path::{Path, PathBuf};

use vkgdr::Gpu;

use super::error::{BenchError, BenchResult};
use super::options::Options;
use super::registry::describe;
use super::report;
use super::report::chart::plot_png;
use super::report::model::Report;
use super::report::table::summary_markdown;
use crate::json::bench::{BenchDocument, BenchRun};
use crate::json::document::{to_text, About};
use crate::json::machine::{cpu_model, DeviceJson, MachineJson};
use crate::ui::{self, say, status};

/// The JSON document of a run: `ran` in order, the machine it ran on and the device measured,
/// what stopped the run outside a benchmark.
pub fn document(
    opts: &Options,
    machine: Option<MachineJson>,
    device: Option<DeviceJson>,
    ran: &[BenchRun],
    error: Option<String>,
) -> BenchDocument {
    BenchDocument {
        about: About::new("vkgdr-bench"),
        mode: if opts.quick { "quick" } else { "full" }.to_string(),
        out_dir: opts.out.display().to_string(),
        device,
        machine,
        benchmarks: ran.to_vec(),
        ok: error.is_none() && ran.iter().all(|r| r.error.is_none()),
        error,
    }
}

/// The file every run leaves beside its CSVs: the JSON document of `--json`.
pub const RESULTS_JSON: &str = "results.json";

/// Writes `doc` as `DIR/results.json` ([`RESULTS_JSON`]); returns the file's path.
pub fn write_results(out: &Path, doc: &BenchDocument) -> BenchResult<PathBuf> {
    let path = out.join(RESULTS_JSON);
    std::fs::write(&path, to_text(doc)).map_err(|e| BenchError::io(&path, e))?;
    Ok(path)
}

/// Prints a report's table and notes and writes its CSV and PNG.
pub fn emit(r: &Report, out: &Path) -> BenchResult<()> {
    ui::out(&r.text_table());
    for n in &r.notes {
        say!("  note: {n}");
    }
    let (csv, png) = report::write_outputs(r, out)?;
    status!("  wrote {}", csv.display());
    if let Some(png) = png {
        status!("  wrote {}", png.display());
    }
    say!();
    Ok(())
}

/// Writes `DIR/summary.md` ([`summary_markdown`]).
pub fn write_summary(
    out: &Path,
    machine: &[String],
    reports: &[Report],
    failures: &[String],
) -> BenchResult<()> {
    let text = summary_markdown(machine, reports, failures);
    let path = out.join("summary.md");
    std::fs::write(&path, text).map_err(|e| BenchError::io(&path, e))
}

/// Facts about the machine for the summary header; best effort (a missing GPU is a line too).
pub fn machine_lines(opts: &Options) -> Vec<String> {
    let mut lines = Vec::new();
    match super::measure::device_ordinal().and_then(|n| Ok(Gpu::open(n)?)) {
        Ok(gpu) => {
            let driver = gpu
                .driver()
                .version()
                .map(|v| format!("CUDA driver API {}.{}", v / 1000, (v % 1000) / 10))
                .unwrap_or_else(|e| format!("driver version unknown ({e})"));
            lines.push(format!(
                "GPU: {} ({driver}; BAR memory {})",
                super::measure::opened_device()
                    .map_or_else(|| gpu.name().to_string(), |d| d.to_string()),
                if gpu.is_non_coherent() {
                    "non-coherent"
                } else {
                    "coherent"
                }
            ));
        }
        Err(e) => lines.push(format!("GPU: not available ({e})")),
    }
    if let Some(cpu) = cpu_model() {
        lines.push(format!(
            "CPU: {cpu}, {} hardware threads",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        ));
    }
    lines.push(format!(
        "copy routines: {}; vkgdr {}; mode: {}",
        vkgdr::copy::simd_level(),
        env!("CARGO_PKG_VERSION"),
        if opts.quick { "--quick" } else { "full" }
    ));
    lines
}

/// The `vkgdr-bench` document of `path`: a results.json, or the `--out` directory that holds
/// one (none there: a usage error).
pub fn load_results(path: &Path) -> BenchResult<BenchDocument> {
    let (file, dir) = match path.is_dir() {
        true => (path.join(RESULTS_JSON), Some(path)),
        false => (path.to_path_buf(), None),
    };
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && dir.is_some() => {
            return Err(BenchError::Usage(format!(
                "no {RESULTS_JSON} in {}",
                path.display()
            )))
        }
        Err(e) => return Err(BenchError::io(&file, e)),
    };
    serde_json::from_str(&text).map_err(|e| BenchError::Results {
        path: file,
        msg: e.to_string(),
    })
}

/// `vkgdr bench plot DIR`: reads `DIR/results.json`, prints every report's table and redraws
/// its PNG beside it.
pub fn replot(dir: &Path) -> BenchResult<()> {
    let mut doc = load_results(dir)?;
    let reports: Vec<&mut Report> = doc
        .benchmarks
        .iter_mut()
        .flat_map(|b| &mut b.reports)
        .collect();
    let _task = ui::task("plot");
    ui::phase("charts", reports.len() as u64);
    for report in reports {
        describe(report);
        ui::step(report.name.clone());
        ui::out(&report.text_table());
        let png = dir.join(format!("{}.png", report.name));
        match plot_png(report, &png)? {
            true => status!("  wrote {}\n", png.display()),
            false => status!("  {}: nothing to plot\n", report.name),
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::bench::measure::Stats;
    use crate::bench::registry::resolve;
    use crate::bench::report::model::{Figure, Unit};
    use crate::json::document::to_text;
    use crate::json::machine::tests::bare_machine;

    /// A made-up `copylat` run: two methods at two sizes, the driver's copy the anchor.
    pub(crate) fn made_up_run() -> Vec<BenchRun> {
        let mut lat = Report::new("copylat", Unit::Nanoseconds);
        for (size, bar, memcpy) in [(8, 150.0, 6000.0), (4096, 450.0, 9000.0)] {
            let s = |m: f64| Stats {
                median: m,
                p10: m * 0.9,
                p90: m * 1.2,
                n: 100,
            };
            lat.figures
                .push(Figure::measured("BAR write", size, &s(bar)));
            lat.figures
                .push(Figure::measured("cuMemcpyHtoD", size, &s(memcpy)));
        }
        // A size the anchor lacks: no anchor there.
        lat.figures.push(Figure::measured(
            "BAR write",
            1 << 20,
            &Stats::of(&[1e5]).unwrap(),
        ));
        lat.notes.push("made up".into());
        let mut api = Report::new("apiperf", Unit::Nanoseconds);
        api.figures.push(Figure::measured(
            "RawMemory alloc",
            64 << 10,
            &Stats::of(&[200_000.0]).unwrap(),
        ));
        api.figures.push(Figure::measured(
            "cuMemAlloc",
            64 << 10,
            &Stats::of(&[50_000.0]).unwrap(),
        ));
        api.figures.push(Figure::reference(
            "C vkgdr alloc (docs)",
            64 << 10,
            200_000.0,
        ));
        let (mut api, mut lat) = (vec![api], vec![lat]);
        resolve(&mut api);
        resolve(&mut lat);
        vec![
            BenchRun {
                name: "apiperf".into(),
                seconds: 1.5,
                error: None,
                reports: api,
            },
            BenchRun {
                name: "copylat".into(),
                seconds: 2.5,
                error: None,
                reports: lat,
            },
            BenchRun {
                name: "pplat".into(),
                seconds: 0.1,
                error: Some("kernel did not respond: made up".into()),
                reports: Vec::new(),
            },
        ]
    }

    #[test]
    fn the_document_has_every_figure_with_its_unit_and_anchor() {
        let opts = Options {
            out: PathBuf::from("out"),
            quick: true,
        };
        let ran = made_up_run();
        let device = DeviceJson {
            ordinal: 1,
            uuid: "5fd4a7f7-1a2b-3c4d-5e6f-708192a3b4c5".into(),
            name: "NVIDIA H200".into(),
        };
        let doc = document(&opts, Some(bare_machine()), Some(device), &ran, None);
        let text = to_text(&doc);
        let mut back: BenchDocument = serde_json::from_str(&text).unwrap();
        // Layouts are the registry's, not the document's: read back, each is given again.
        for r in back.benchmarks.iter_mut().flat_map(|b| &mut b.reports) {
            describe(r);
        }
        assert_eq!(back, doc);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["format"], "vkgdr-bench");
        assert_eq!(v["mode"], "quick");
        // The device measured, by ordinal, UUID and name.
        assert_eq!(v["device"]["ordinal"], 1);
        assert_eq!(v["device"]["uuid"], "5fd4a7f7-1a2b-3c4d-5e6f-708192a3b4c5");
        assert_eq!(v["device"]["name"], "NVIDIA H200");
        assert_eq!(v["ok"], false, "pplat failed");
        assert_eq!(
            v["benchmarks"][2]["error"],
            "kernel did not respond: made up"
        );
        assert_eq!(v["machine"]["cuda"]["status"], "driver_missing");
        let lat = &v["benchmarks"][1]["reports"][0];
        assert_eq!(lat["unit"], "ns");
        assert_eq!(lat["higher_is_better"], false);
        assert_eq!(lat["title"], "Write latency, host to GPU memory");
        let f = &lat["figures"][0];
        assert_eq!(
            (&f["method"], &f["size_bytes"], &f["origin"]),
            (&"BAR write".into(), &8.into(), &"measured".into())
        );
        assert_eq!(f["anchor"]["method"], "cuMemcpyHtoD");
        assert_eq!(f["anchor"]["report"], "copylat");
        assert_eq!(f["anchor"]["median"], 6000.0);
        assert_eq!(f["anchor"]["ratio"], 0.025);
        // The anchor itself, and a size the anchor was not measured at, stand alone.
        assert!(lat["figures"][1]["anchor"].is_null());
        // The driver's copy times the machine, not this library.
        assert_eq!(lat["figures"][1]["origin"], "machine");

        assert!(lat["figures"][4]["anchor"].is_null());
        let api = &v["benchmarks"][0]["reports"][0]["figures"];
        assert_eq!(api[0]["anchor"]["method"], "cuMemAlloc");
        assert_eq!(api[0]["anchor"]["ratio"], 4.0);
        assert_eq!(api[2]["origin"], "reference");
        assert_eq!(
            api[1]["origin"], "machine",
            "cuMemAlloc times the driver alone"
        );
        assert_eq!(api[0]["origin"], "measured");
        assert!(
            api[2]["anchor"].is_null(),
            "reference values are not anchored"
        );
    }
}

//! Running benchmarks (`vkgdr bench NAME` and `all`, [`run`]): the selected ones in registry
//! order, each under a progress line, its outputs written as it ends
//! ([`outputs`](super::outputs)); `results.json` (and, for `all`, `summary.md`) is rewritten after
//! each, so a run cut short still leaves what it measured. A failure is reported and the run goes
//! on, unless a kernel does not answer or there is no driver; a benchmark that failed in part
//! ([`BenchError::Partial`]) leaves the reports of the rest and counts as failed. With
//! `--compare`, the run is then set beside a baseline.

use std::time::Instant;

use super::compare;
use super::error::{BenchError, BenchResult};
use super::options::Options;
use super::outputs::{document, emit, machine_lines, write_results, write_summary, RESULTS_JSON};
use super::registry::{resolve, Benchmark, Which};
use super::report::model::Report;
use crate::json::bench::BenchRun;
use crate::json::document::to_text;
use crate::json::machine::{DeviceJson, MachineJson};
use crate::ui::{self, alert, say, status};

/// What a run has done so far: enough for the JSON document whatever stops it.
#[derive(Default)]
struct RunLog {
    ran: Vec<BenchRun>,
    /// `benchmark: error` for each failure.
    failures: Vec<String>,
    machine: Option<MachineJson>,
    /// The device the benchmarks opened.
    device: Option<DeviceJson>,
}

/// Runs `which`, then compares with `baseline` (the runs of an earlier document, and the
/// tolerance in percent) when given: the exit code when every benchmark ran (0, or
/// [`EXIT_WORSE`](compare::EXIT_WORSE)).
pub fn run(
    which: Which,
    opts: &Options,
    baseline: Option<&(Vec<BenchRun>, u32)>,
) -> BenchResult<u8> {
    let mut log = RunLog::default();
    let outcome = run_into(which, opts, &mut log);
    let error = outcome.as_ref().err().map(|e| e.to_string());
    let doc = document(
        opts,
        log.machine.clone(),
        log.device.clone(),
        &log.ran,
        error,
    );
    // The document comes out even when an output file could not be written.
    if ui::settings().json {
        ui::document(&to_text(&doc));
    }
    outcome?;
    // Only a run whose results were written is compared.
    let code = baseline.map_or(0, |(old, tolerance)| {
        say!();
        compare::print(old, &log.ran, *tolerance)
    });
    if log.failures.is_empty() {
        Ok(code)
    } else {
        let names: Vec<&str> = log
            .failures
            .iter()
            .map(|f| f.split_once(':').map_or(f.as_str(), |(n, _)| n))
            .collect();
        Err(BenchError::Failed(format!(
            "failed: {} (errors above)",
            names.join(", ")
        )))
    }
}

fn run_into(which: Which, opts: &Options, log: &mut RunLog) -> BenchResult<()> {
    std::fs::create_dir_all(&opts.out).map_err(|e| BenchError::io(&opts.out, e))?;
    let selected = which.selected();
    // Gathered once, after the first benchmark (so `apiperf` still sees a cold process).
    let mut machine: Option<Vec<String>> = None;
    let results = opts.out.join(RESULTS_JSON);
    for (
        i,
        &&Benchmark {
            name, run: bench, ..
        },
    ) in selected.iter().enumerate()
    {
        status!("== {name}{} ==", if opts.quick { " (quick)" } else { "" });
        let label = if selected.len() > 1 {
            format!("[{}/{}] {name}", i + 1, selected.len())
        } else {
            name.to_string()
        };
        let task = ui::task(label);
        let started = Instant::now();
        let outcome = bench(opts);
        drop(task);
        let (mut stop, mut stuck) = (false, false);
        let mut this = BenchRun {
            name: name.to_string(),
            seconds: 0.0,
            error: None,
            reports: Vec::new(),
        };
        // A benchmark that measured part of what it measures leaves that part, then fails.
        let (outcome, partial) = match outcome {
            Err(BenchError::Partial { reports, error }) => (Ok(reports), Some(error)),
            other => (other, None),
        };
        match outcome {
            Ok(mut rs) => {
                resolve(&mut rs);
                let mut errors = Vec::new();
                if let Some(e) = partial {
                    alert!("{name} failed in part: {e}");
                    errors.push(e.clone());
                    log.failures.push(format!("{name}: {e}"));
                }
                for r in &rs {
                    if let Err(e) = emit(r, &opts.out) {
                        alert!("{name}: {e}");
                        errors.push(e.to_string());
                        log.failures.push(format!("{name}: {e}"));
                    }
                }
                this.reports = rs;
                this.error = (!errors.is_empty()).then(|| errors.join("; "));
            }
            Err(e) => {
                alert!("{name} failed: {e}");
                log.failures.push(format!("{name}: {e}"));
                this.error = Some(e.to_string());
                stuck = matches!(e, BenchError::KernelStuck(_));
                stop = match &e {
                    // A kernel may still be running on the device: stop here.
                    BenchError::KernelStuck(_) => true,
                    // No driver on this machine, or no such device (`--device`): every other
                    // benchmark would fail the same way.
                    BenchError::Vkgdr(
                        vkgdr::Error::LibraryNotFound { .. } | vkgdr::Error::NoMatchingDevice(_),
                    ) => true,
                    _ => false,
                };
            }
        }
        this.seconds = started.elapsed().as_secs_f64();
        if log.device.is_none() {
            log.device = super::measure::opened_device().map(|d| DeviceJson::of(&d));
        }
        status!("({name} took {:.1} s)\n", this.seconds);
        log.ran.push(this);
        if log.machine.is_none() && !stuck {
            // Not beside a kernel that may still run: the probe makes driver calls.
            log.machine = Some(MachineJson::probe());
        }
        if which == Which::All {
            // Rewritten after every benchmark so a run cut short still leaves a summary.
            let machine = machine.get_or_insert_with(|| machine_lines(opts));
            let reports: Vec<Report> = log.ran.iter().flat_map(|r| r.reports.clone()).collect();
            write_summary(&opts.out, machine, &reports, &log.failures)?;
        }
        // Likewise the JSON results.
        write_results(
            &opts.out,
            &document(
                opts,
                log.machine.clone(),
                log.device.clone(),
                &log.ran,
                None,
            ),
        )?;
        if stop {
            break;
        }
    }
    if which == Which::All {
        status!("wrote {}", opts.out.join("summary.md").display());
    }
    status!("wrote {}", results.display());
    Ok(())
}

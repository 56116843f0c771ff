//! `waits`: which driver and library calls wait for a running kernel.
//!
//! A persistent kernel (`spin_until_stopped` in kernels/mapping.cu) spins on a stop word in BAR
//! memory. Each call is made from a worker thread and timed there; if it has not returned after
//! the patience window, the CPU stops the kernel with a plain store through the BAR (no driver
//! call, which could queue behind the stuck one), and the call is recorded as one that waits:
//! its time is then at least the patience window. The same calls run in three conditions: no
//! kernel, the kernel on a non-blocking stream of its own, and the kernel on the legacy default
//! stream (which every blocking stream synchronises with).
//!
//! The results are the table in docs/RELIABILITY.md: what may run while a kernel runs.
//!
//! The parts: [`spinner`] (the kernel), [`probe`] (how a call is made and timed), [`driver_calls`]
//! and [`library_calls`] (the calls), [`primitives`](mod@primitives) (facts measured once).

pub mod driver_calls;
pub mod library_calls;
pub mod primitives;
pub mod probe;
pub mod spinner;

use std::time::Duration;

use vkgdr::OpenOptions;

use crate::bench::error::{BenchError, BenchResult};
use crate::bench::measure::{open_gpu, Stats};
use crate::bench::options::Options;
use crate::bench::report::model::{Figure, Report, Unit};
use crate::ui;
use driver_calls::driver_scenarios;
use library_calls::library_scenarios;
use primitives::primitives;
use probe::{Condition, Probe, SIZE};
use spinner::Spinner;

/// Runs the benchmark: one report per condition, calls in the order they were made, with the
/// calls that waited for the kernel named in the notes.
pub fn run(opts: &Options) -> BenchResult<Vec<Report>> {
    let gpu = open_gpu(OpenOptions::new())?;
    let (reps, patience) = if opts.quick {
        (2, Duration::from_millis(800))
    } else {
        (5, Duration::from_millis(2000))
    };
    let mut spinner = Spinner::new(&gpu)?;
    // A device buffer for the synchronous copies, made and freed while no kernel runs.
    let _c = gpu.bind()?;
    let scratch = gpu.driver().cu_mem_alloc(SIZE as usize)?;
    drop(_c);
    let mut reports = Vec::new();
    let mut failures = Vec::new();
    let mut ticket = 0u32;
    for condition in [
        Condition::Idle,
        Condition::OwnStream,
        Condition::LegacyStream,
    ] {
        ui::phase(condition.report_name(), 0);
        let mut probe = Probe {
            spinner: &mut spinner,
            condition,
            patience,
            samples: Vec::new(),
            scenario_waited: false,
            observations: Vec::new(),
            ticket,
        };
        for scenario in [0, 1] {
            probe.scenario_waited = false;
            for _ in 0..reps {
                match scenario {
                    0 => driver_scenarios(&mut probe, &gpu, scratch)?,
                    _ => library_scenarios(&mut probe, &gpu)?,
                }
                if condition != Condition::Idle && probe.spinner.running && !probe.spinner.alive() {
                    failures.push(format!(
                        "{}: the kernel's heartbeat stopped during the calls",
                        condition.report_name()
                    ));
                }
                if probe.scenario_waited {
                    break;
                }
            }
        }
        probe.observe(format!(
            "releases waiting when the calls were done: {}",
            gpu.pending_releases()
        ));
        probe.spinner.stop()?;
        ticket = probe.ticket;
        let probe_samples = std::mem::take(&mut probe.samples);
        let mut report = Report::new(condition.report_name(), Unit::Nanoseconds);
        let mut waited = Vec::new();
        for s in &probe_samples {
            let stats = Stats::of(&s.ns).expect("at least one sample");
            report.figures.push(Figure::measured(&s.call, SIZE, &stats));
            if s.waited {
                waited.push(s.call.clone());
            }
        }
        report.notes.push(if waited.is_empty() {
            "no call waited for the kernel".to_string()
        } else {
            format!(
                "waited for the kernel (returned only once it was stopped, after {} ms): {}",
                patience.as_millis(),
                waited.join(", ")
            )
        });
        report.notes.append(&mut probe.observations);
        reports.push(report);
    }
    let _c = gpu.bind()?;
    // SAFETY: allocated above; no kernel runs any more.
    unsafe { gpu.driver().cu_mem_free(scratch) }?;
    drop(_c);
    ui::phase("copy-engine figures", 0);
    let mut facts = primitives(&gpu)?;
    reports[0].notes.append(&mut facts);
    if !failures.is_empty() {
        return Err(BenchError::Check(failures.join("; ")));
    }
    Ok(reports)
}

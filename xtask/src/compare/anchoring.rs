//! A library figure judged against the machine work it is made of ([`anchored_move`]).
//!
//! Some calls of this library are mostly the machine's work. Driver work: a raw allocation of
//! whole chunks is a Vulkan allocation, an fd export, a CUDA import and a mapping; a chunk's drop
//! is their reverse. BAR work: a write or read through the mapping is the CPU's stores or loads
//! crossing PCIe, with little of the library around them. Lent machines of one GPU model differ
//! widely on driver calls and on BAR stores (BENCHMARKS.md, 'Machines differ more than the code
//! moved'), so on another machine these figures move by as much without a line of this library
//! changing. Where the registry names the machine rows a figure is made of
//! ([`MachineWork`](super::machine_work::MachineWork), per report, by row: driver
//! calls, or the same copy as a plain loop of stores or loads) and both runs have every one of
//! them at the figure's size, the comparison also judges the figure's *anchored* move: its ratio
//! now/before divided by the ratio of the sum of those rows. A machine whose driver or BAR is 40 %
//! slower moves both by 1.4 and leaves the anchored move at 1; a slower library moves the figure
//! alone.
//!
//! The anchored move's noise is the wider of the figure's and the machine work's (each: the floor
//! or its spread in either run, plus the allowance for few samples; the machine work's spread and
//! samples are those of its rows added up). A figure with an anchored move is worse only when
//! both its raw move and its anchored move are worse beyond their noise (better likewise); a raw
//! move beyond noise that the anchored move does not confirm is `moved_with_driver` (it moved
//! with the machine), never a regression.

use super::document::DriverWorkJson;
use super::machine_work::machine_work_of;
use super::noise::{judge, noise_percent, Verdict};
use super::results::Results;
use vkgdr_lab::bench::report::model::{Figure, Origin};

/// The machine work of one figure in one run: the machine rows the registry names, at the
/// figure's size, added up.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Work {
    /// Their methods, in the registry's order.
    pub methods: Vec<String>,
    /// Their sum: medians, p10s and p90s added up, the fewest samples among them.
    pub sum: Figure,
}

/// The machine work that the figure `method` at `size` bytes of report `report` is made of in
/// `run`: `None` where the registry names none, or `run` lacks one of its rows at that size, or a
/// row's median is not positive.
pub(super) fn machine_work(run: &Results, report: &str, method: &str, size: u64) -> Option<Work> {
    let work = machine_work_of(report, method)?;
    if work.made_of.is_empty() {
        return None;
    }
    let r = run
        .benchmarks
        .iter()
        .flat_map(|b| &b.reports)
        .find(|r| r.name == report)?;
    let mut rows = Vec::with_capacity(work.made_of.len());
    for &row in work.made_of {
        let f = r.figures.iter().find(|f| {
            !f.is_reference() && f.size == size && f.method == row && f.method != method
        })?;
        if !(f.median > 0.0 && f.median.is_finite()) {
            return None;
        }
        rows.push(f);
    }
    // Times add up; rates do not, but a rate's machine work is one row (a plain copy of the same
    // bytes), whose sum is itself.
    // A part a row lacks (NaN) leaves the sum without it, and so without a spread.
    let add = |part: fn(&Figure) -> f64| rows.iter().map(|f| part(f)).sum();
    Some(Work {
        methods: rows.iter().map(|f| f.method.clone()).collect(),
        sum: Figure {
            method: format!("machine work of {method}"),
            size,
            median: add(|f| f.median),
            p10: add(|f| f.p10),
            p90: add(|f| f.p90),
            samples: rows
                .iter()
                .map(|f| f.samples)
                .filter(|&n| n > 0)
                .min()
                .unwrap_or(0),
            origin: Origin::Machine,
            anchor: None,
        },
    })
}

/// The anchored move of a figure that went from `before` to `now` (in report `report`, with
/// noise `noise_percent_raw`), where both runs have its machine work: the machine work's move,
/// the figure's move over it, that move's noise and its verdict alone.
#[allow(clippy::too_many_arguments)]
pub(super) fn anchored_move(
    (old, new): (&Results, &Results),
    report: &str,
    before: &Figure,
    now: &Figure,
    higher_is_better: bool,
    floor_percent: f64,
    noise_percent_raw: f64,
) -> Option<DriverWorkJson> {
    let was = machine_work(old, report, &now.method, now.size)?;
    let is = machine_work(new, report, &now.method, now.size)?;
    let work_ratio = is.sum.median / was.sum.median;
    let anchored_ratio = (now.median / before.median) / work_ratio;
    if !anchored_ratio.is_finite() || anchored_ratio <= 0.0 {
        return None;
    }
    let tolerance_percent =
        noise_percent_raw.max(noise_percent(floor_percent, &[&was.sum, &is.sum]));
    Some(DriverWorkJson {
        methods: is.methods,
        baseline: was.sum.median,
        current: is.sum.median,
        ratio: work_ratio,
        anchored_ratio,
        tolerance_percent,
        verdict: judge(
            1.0,
            anchored_ratio,
            higher_is_better,
            tolerance_percent / 100.0,
        ),
    })
}

/// The verdict on a figure whose raw move got `raw` and, where it has machine work, whose
/// anchored move got `anchored`: worse (better) only when both say so; a raw move beyond noise
/// that the anchored move does not confirm moved with the machine.
pub(super) fn combined(raw: Verdict, anchored: Option<Verdict>) -> Verdict {
    match (raw, anchored) {
        (Verdict::Worse | Verdict::Better, Some(a)) if a != raw => Verdict::MovedWithDriver,
        (v, _) => v,
    }
}

//! The project's regression check (`cargo xtask compare-bench BASELINE NEW`): every figure of a
//! `vkgdr bench` run beside the same figure of an earlier run on the same GPU model, usually the
//! baseline committed for it in `benches/baselines` (scripts/gpu-check runs it after `vkgdr bench
//! all`).
//!
//! Figures are matched by report, method and size. Each pair gets the ratio of the medians (now /
//! before) and a verdict in the unit's direction (time: lower is better; GB/s: higher is better). A
//! figure has *moved* when the ratio is beyond its noise: the larger of a floor (`--tolerance`,
//! [`DEFAULT_TOLERANCE_PERCENT`](command_line::DEFAULT_TOLERANCE_PERCENT) by default) and the
//! figure's own spread in either run (half its p10–p90 range relative to its median), plus an
//! allowance for few samples ([`noise`]), so a figure whose samples scatter widely, or a median of
//! a handful of samples, needs a larger move to count. Worse means `factor > 1 + noise`, better
//! `factor < 1 / (1 + noise)`, where the factor is now/before for times and before/now for rates.
//! Reference figures (quoted, not measured) are left out. Figures of the driver or the hardware
//! alone (origin `machine`: `cuMemAlloc`, a DMA copy, a raw driver call; the registry names them,
//! which also covers documents recorded before the mark) that moved are `machine_moved`, never a
//! regression: lent machines of one model differ by a quarter and more on driver calls, which
//! says nothing of this library. Figures of this library that are mostly the machine's work
//! (driver calls; stores and loads through the BAR) are also judged against the machine rows they
//! are made of in the same run ([`anchoring`]: the driver calls, or the same copy as a plain
//! loop): worse only when that anchored move is worse too, else `moved_with_driver`.
//!
//! Only documents of the same GPU model (the name of the device measured, `device`, or in
//! documents without it CUDA device 0's; the UUID says whether it is the same card) are judged:
//! with different or unknown GPUs the figures are shown as information and nothing counts as a
//! regression. A baseline may be a directory (`benches/baselines`): the
//! `vkgdr-bench` document in it recorded on the new run's GPU model is chosen.
//!
//! Exit codes: 0 nothing got worse beyond its noise (or nothing could be judged), 2 the command
//! line or a file is wrong, [`EXIT_WORSE`](comparison::EXIT_WORSE) a figure got worse beyond its
//! noise.
//!
//! The parts:
//! - [`results`]: a `vkgdr-bench` document as a comparison reads it;
//! - [`baseline`]: the baseline, one file or the one of the new run's GPU in a directory;
//! - [`pairing`]: the figures of both runs paired;
//! - [`noise`]: when a figure has moved;
//! - [`machine_work`]: which machine rows each library row is made of, and [`anchoring`]: a
//!   library figure judged against them;
//! - [`comparison`]: the whole judgement, and [`text`], the same as text;
//! - [`document`]: the comparison's JSON document;
//! - [`command_line`] and [`error`]: the command's options, and what keeps it from starting.

pub mod anchoring;
pub mod baseline;
pub mod command_line;
pub mod comparison;
pub mod document;
pub mod error;
pub mod machine_work;
pub mod noise;
pub mod pairing;
pub mod results;
pub mod text;

use std::process::ExitCode;

use baseline::Baseline;
use command_line::{CompareArgs, EXIT_USAGE};
use comparison::Comparison;
use results::Results;
use vkgdr_lab::bench::outputs::RESULTS_JSON;
use vkgdr_lab::json::document::to_text;

/// `cargo xtask compare-bench BASELINE NEW`: the table on stdout (on stderr under `--json`, which
/// prints the comparison's document on stdout).
pub fn main(args: &CompareArgs) -> ExitCode {
    let loaded = Baseline::open(&args.baseline).and_then(|b| {
        let file = if args.current.is_dir() {
            args.current.join(RESULTS_JSON)
        } else {
            args.current.clone()
        };
        Ok((b, Results::load(&args.current)?, file))
    });
    let (baseline, current, file) = match loaded {
        Ok(l) => l,
        Err(e) => {
            eprintln!("xtask compare-bench: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let c = Comparison::new(&baseline, &current, &file, args.tolerance);
    if args.json {
        eprint!("{}", c.text());
        print!("{}", to_text(&c.doc));
    } else {
        print!("{}", c.text());
    }
    ExitCode::from(c.exit_code())
}

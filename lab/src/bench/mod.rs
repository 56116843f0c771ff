//! `vkgdr bench`: measurements on a real GPU, modelled on gdrcopy's `copybw`, `copylat`,
//! `apiperf` and ping-pong tools.
//!
//! Each benchmark returns [`Report`](report::model::Report)s (one row per method and size);
//! [`main`] prints them as tables, writes one CSV and one PNG chart per report into the output
//! directory, `results.json` (the document `--json` prints: every figure with its unit and its
//! anchor, see [`crate::json`]) and, for `all`, a `summary.md` with markdown tables. While a
//! benchmark runs, a progress line shows its phase and the method and size it is measuring
//! ([`crate::ui`]). With `--compare OLD` every figure is then set beside the same figure of an
//! earlier run, and `vkgdr bench compare` does the same for two files ([`mod@compare`]; the
//! project's regression check against benches/baselines is `cargo xtask compare-bench`). How
//! samples are timed: [`measure`].
//!
//! The parts:
//! - [`registry`]: the benchmarks, each with the function that runs it and the reports it
//!   writes, and which of them a command selects;
//! - [`command_line`]: `vkgdr bench`'s options and subcommands;
//! - [`run`]: the selected benchmarks run one after the other, then compared with a baseline;
//! - [`outputs`]: the tables, CSVs, charts, `summary.md` and `results.json` a run leaves behind,
//!   and `vkgdr bench plot`;
//! - [`measure`], [`options`], [`error`]: what every benchmark measures with, runs with and can
//!   fail with; [`host_pinned`]: the `cuMemHostAlloc` memory the DMA rows copy from and to;
//!   [`raw_bar`]: the plain BAR stores and loads the copy rows are judged against;
//! - [`report`]: results and their forms (tables, CSV, charts);
//! - [`compare`]: two runs side by side, by `--tolerance`;
//! - the benchmarks: [`apiperf`], [`arena`], [`copybw`], [`copylat`], [`fastpath`], [`pplat`],
//!   [`ring`], [`tail`], [`d2h`], [`waits`]; and, run by name only, [`xproc`] (it starts other
//!   processes).

pub mod apiperf;
pub mod arena;
pub mod command_line;
pub mod compare;
pub mod copybw;
pub mod copylat;
pub mod d2h;
pub mod error;
pub mod fastpath;
pub mod host_pinned;
pub mod measure;
pub mod options;
pub mod outputs;
pub mod pplat;
pub mod raw_bar;
pub mod raw_steps;
pub mod registry;
pub mod report;
pub mod ring;
pub mod run;
pub mod stats;
pub mod tail;
pub mod waits;
pub mod xproc;

use std::process::ExitCode;

use crate::ui::alert;
use command_line::{BenchArgs, BenchCommand};
use error::BenchError;
use options::Options;

/// The exit code of a wrong command line or an unreadable file (as clap's usage errors).
pub const EXIT_USAGE: u8 = 2;

/// Entry point of `vkgdr bench`: exit code 0 on success, 1 if a benchmark failed, 2 for a
/// `--compare` baseline that cannot be read or a `plot` directory without results.json (other usage
/// errors are clap's), 3 if a figure got worse than the baseline's beyond `--tolerance`.
pub fn main(args: &BenchArgs) -> ExitCode {
    let result = match &args.command {
        BenchCommand::Plot(dir) => outputs::replot(dir).map(|()| 0),
        BenchCommand::Compare(a) => compare::main(a),
        BenchCommand::Run(which, a) => {
            // Read before the run: a bad file is said at once, and the baseline may be the
            // results.json this run replaces.
            let baseline = match a.compare.as_deref().map(outputs::load_results) {
                None => None,
                Some(Ok(b)) => Some((b.benchmarks, a.tolerance)),
                Some(Err(e)) => {
                    alert!("vkgdr bench: --compare {e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let opts = Options {
                out: a.out.clone(),
                quick: a.quick,
            };
            measure::choose_device(a.device);
            run::run(*which, &opts, baseline.as_ref())
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            alert!("vkgdr bench: {e}");
            match e {
                BenchError::Usage(_) => ExitCode::from(EXIT_USAGE),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// The child process of `fastpath`'s first-write row (not a user command): `vkgdr bench
/// --first-write-child [ORDINAL]` (the parent's device; 0 when not given), recognised before the
/// command line is parsed.
pub fn first_write_child(ordinal: Option<&std::ffi::OsStr>) -> ExitCode {
    let ordinal = match ordinal.map(|o| o.to_str().and_then(|o| o.parse::<i32>().ok())) {
        None => 0,
        Some(Some(n)) => n,
        Some(None) => {
            eprintln!(
                "vkgdr bench {}: not an ordinal: {ordinal:?}",
                fastpath::CHILD_ARG
            );
            return ExitCode::FAILURE;
        }
    };
    match fastpath::child_main(ordinal) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vkgdr bench {}: {e}", fastpath::CHILD_ARG);
            ExitCode::FAILURE
        }
    }
}

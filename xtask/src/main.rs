//! `cargo xtask TASK`: what only the project's own work needs, kept out of the `vkgdr` tool users
//! install (a workspace member outside `default-members`, never published).
//!
//! - `compare-bench BASELINE NEW [--tolerance PCT] [--json]`: a `vkgdr bench` run judged against
//!   the baseline committed for its GPU model in `benches/baselines` (or any earlier
//!   `results.json`), with the noise and machine-row rules of [`compare`]; exit 3 when a figure
//!   of this library got worse beyond its noise. scripts/gpu-check runs it after `vkgdr bench
//!   all` on the GPU machine.

mod compare;
#[cfg(test)]
mod published;
#[cfg(test)]
mod testutil;

use std::process::ExitCode;

use clap::Parser;

/// The project's own tasks.
#[derive(Debug, Parser)]
#[command(name = "xtask", max_term_width = 100)]
enum Task {
    /// Judge a `vkgdr bench` run against a baseline: every figure, its ratio, moves beyond noise
    #[command(
        long_about = compare::command_line::LONG_ABOUT,
        after_help = compare::command_line::EXIT_CODES
    )]
    CompareBench(compare::command_line::CompareArgs),
}

fn main() -> ExitCode {
    match Task::parse() {
        Task::CompareBench(args) => compare::main(&args),
    }
}

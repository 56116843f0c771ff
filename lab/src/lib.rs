//! The lab: the measurements behind `vkgdr bench` and the stress runs behind `vkgdr soak`, with
//! their reports; the `vkgdr` tool in cli/ parses the command line and calls them.
//!
//! - [`mod@bench`]: `vkgdr bench BENCHMARK [--device N|UUID] [--out DIR] [--quick] [--json]`
//!   measures copies, latencies and API costs on one GPU (CUDA device 0 by default) and writes
//!   tables, CSVs, PNG charts and `results.json`; `vkgdr bench plot DIR` redraws the charts from
//!   `DIR/results.json`.
//! - [`mod@soak`]: `vkgdr soak [--device N|UUID | --devices all|LIST] [--seconds N] [--threads N]
//!   [--exhaust-every S] [--json]` runs pool churn, rings, arena grow/shrink and BAR exhaustion
//!   together on each device named (10 minutes by default) and checks that nothing of ours stayed
//!   behind.
//! - [`mod@child`]: `vkgdr bench-child ROLE ...` (hidden), the tool as a child process of
//!   `vkgdr bench xproc` and `vkgdr soak --xproc`, and the owner's side of such a child.
//! - [`mod@json`]: the documents `--json` prints, one per command, `vkgdr info`'s included (every
//!   document holds the machine it ran on).
//! - [`mod@device`]: the GPUs `--device` and `--devices` name.
//! - [`mod@ui`]: progress, drawn on a terminal only and never under `--quiet`, and where text goes.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod bench;
pub mod child;
pub mod device;
pub mod json;
pub mod soak;
pub mod ui;

/// The `vkgdr` command line as far as the lab's commands go, for the tests of their options: the
/// tool's own `Cli` (cli/, with `info` and `completions`) holds these commands as they are here.
#[cfg(test)]
mod test_cli {
    /// `vkgdr` with the lab's commands.
    #[derive(Debug, clap::Parser)]
    #[command(name = "vkgdr")]
    pub struct Cli {
        #[command(subcommand)]
        pub command: Option<Command>,
    }

    /// The lab's commands, named as the tool names them.
    #[derive(Debug, clap::Subcommand)]
    pub enum Command {
        Bench(crate::bench::command_line::BenchArgs),
        Soak(crate::soak::command_line::SoakArgs),
        #[command(hide = true, name = "bench-child", display_name = "vkgdr")]
        BenchChild(crate::child::ChildArgs),
    }
}

//! `xtask compare-bench`'s command line ([`CompareArgs`]), its help and its exit codes.

use std::path::PathBuf;

use clap::builder::{NonEmptyStringValueParser, TypedValueParser};

/// The noise floor: the smallest change, in percent, that counts as a move.
pub const DEFAULT_TOLERANCE_PERCENT: u32 = 10;

/// The exit code of a wrong command line or an unreadable file (as clap's usage errors).
pub const EXIT_USAGE: u8 = 2;

/// Exit codes of `xtask compare-bench`, for `--help`.
pub const EXIT_CODES: &str = "\
Exit status:
  0  no figure got worse beyond its noise (or the GPUs differ: shown as information only)
  2  the command line is wrong, or a file is not results of `vkgdr bench`
  3  a figure got worse beyond its noise on the same GPU model";

/// `xtask compare-bench`'s long help.
pub const LONG_ABOUT: &str = "\
Compare results.json with an earlier one: every figure, its ratio, moves beyond noise

Figures are matched by report, method and size; each gets the ratio now/before and a mark where it \
moved beyond its noise: the larger of --tolerance and its own spread in either run (half its \
p10-p90 range, relative to its median), wider with fewer than 50 samples. Times are better lower, \
GB/s higher. Library figures that are mostly driver calls, BAR copies or the CPU's own work are also \
judged against the machine rows they are made of in the same run (the driver calls, the same copy as \
a plain loop, or the C library's malloc+free beside the pool's pairs): worse only if worse against \
those too. Only runs on the same GPU model (the device measured) are \
judged; other pairs are shown as information.";

/// `xtask compare-bench`'s command line.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct CompareArgs {
    /// The earlier results: a results.json (or `vkgdr bench --json` output), or a directory of
    /// them such as benches/baselines (the one recorded on NEW's GPU model is chosen)
    #[arg(value_name = "BASELINE", value_parser = NonEmptyStringValueParser::new().map(PathBuf::from))]
    pub baseline: PathBuf,

    /// The results to judge: a results.json, or the --out directory that holds one
    #[arg(value_name = "NEW", value_parser = NonEmptyStringValueParser::new().map(PathBuf::from))]
    pub current: PathBuf,

    /// The noise floor: the smallest change, in percent, that counts as a move (a figure's own
    /// spread or few samples can widen it)
    #[arg(long, value_name = "PCT", default_value_t = DEFAULT_TOLERANCE_PERCENT,
          value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub tolerance: u32,

    /// Print the comparison as one JSON document on stdout (the table goes to stderr)
    #[arg(long)]
    pub json: bool,
}

//! The settings every benchmark runs with ([`Options`]).

use std::path::PathBuf;

/// Settings shared by all benchmarks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Output directory for CSVs, PNGs and the summary.
    pub out: PathBuf,
    /// Smaller sizes and fewer repetitions (a full `all` in a few minutes).
    pub quick: bool,
}

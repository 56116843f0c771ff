//! What keeps a comparison from starting ([`CompareError`]): a file that cannot be read, or is
//! not results of `vkgdr bench`; each error names the file.

use std::path::PathBuf;

use vkgdr_lab::bench::outputs::RESULTS_JSON;
use vkgdr_lab::json::document::FORMAT_VERSION;

/// Everything that keeps a comparison from starting: each names the file.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// The file or directory could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not JSON.
    #[error("{}: not JSON ({source})", path.display())]
    NotJson {
        /// The file.
        path: PathBuf,
        /// Where the parser stopped.
        source: serde_json::Error,
    },
    /// The file is JSON, but no `vkgdr-bench` document.
    #[error(
        "{}: {what}, not results of `vkgdr bench` (its DIR/results.json or --json output)",
        path.display()
    )]
    NotResults {
        /// The file.
        path: PathBuf,
        /// What it is instead.
        what: String,
    },
    /// A later program wrote it, in a layout this one does not know.
    #[error(
        "{}: format_version {found} is newer than this vkgdr reads ({FORMAT_VERSION}): compare with a newer vkgdr",
        path.display()
    )]
    Newer {
        /// The file.
        path: PathBuf,
        /// Its `format_version`.
        found: u64,
    },
    /// A `vkgdr-bench` document with a field missing or of the wrong type.
    #[error("{}: malformed `vkgdr bench` results: {source}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong, with its line and column.
        source: serde_json::Error,
    },
    /// A directory given as the new results without a `results.json` in it.
    #[error("{}: no {RESULTS_JSON} in this directory", path.display())]
    NoResults {
        /// The directory.
        path: PathBuf,
    },
}

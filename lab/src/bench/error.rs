//! What can stop a benchmark, or a command of `vkgdr bench` ([`BenchError`]).

use std::path::{Path, PathBuf};

/// Everything that can stop a benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A library or driver call failed.
    #[error(transparent)]
    Vkgdr(#[from] vkgdr::Error),
    /// Reading or writing an output file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A `results.json` given to `vkgdr bench plot` is no `vkgdr bench` document.
    #[error("{}: not results of `vkgdr bench`: {msg}", path.display())]
    Results {
        /// The file.
        path: PathBuf,
        /// What the JSON parser said.
        msg: String,
    },
    /// Drawing a chart failed.
    #[error("plotting {path}: {msg}")]
    Plot {
        /// The PNG being drawn.
        path: PathBuf,
        /// The plotting library's message.
        msg: String,
    },
    /// The ping-pong kernel stopped answering (the GPU memory it uses has been leaked on purpose
    /// so that nothing is freed under a running kernel).
    #[error("kernel did not respond: {0}")]
    KernelStuck(String),
    /// Data did not arrive where a benchmark checked it.
    #[error("data check failed: {0}")]
    Check(String),
    /// The command line is wrong.
    #[error("{0}")]
    Usage(String),
    /// A child process of a benchmark failed, hung or said something unexpected (named in the
    /// message).
    #[error(transparent)]
    Child(#[from] ChildError),
    /// Part of a benchmark failed: what it measured still counts (its reports are written),
    /// and the run fails.
    #[error("{error}")]
    Partial {
        /// What was measured.
        reports: Vec<crate::bench::report::model::Report>,
        /// What failed, each part named.
        error: String,
    },
    /// Some of the benchmarks run by one command failed (each reported as it happened).
    #[error("{0}")]
    Failed(String),
}

impl BenchError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        BenchError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Result of benchmark code.
pub type BenchResult<T> = Result<T, BenchError>;

/// A child process that failed, hung or said something unexpected, named with its pid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ChildError(pub String);

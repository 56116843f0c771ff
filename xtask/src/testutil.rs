//! What the unit tests share.

use std::path::PathBuf;

/// `rel`, a path inside the repository (`benches/baselines/...`); a path that is not there fails
/// the test: the files a test reads are never skipped.
pub fn repo_path(rel: &str) -> PathBuf {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel);
    assert!(path.exists(), "{} not found", path.display());
    path
}

//! What the tests under `bench` share.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh, empty directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "vkgdr-bench-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `rel`, a path inside the repository (`docs/bench`, `benches/baselines/...`), found where the
/// test runs: in the current directory or the nearest directory above it that has it (a test
/// binary may run from a copy of the repository somewhere else than the tree it was built in,
/// as on the GPU machine), else in the tree the binary was built from. A path found nowhere
/// fails the test, naming where it was looked for: the files a test reads are never skipped.
pub fn repo_path(rel: &str) -> PathBuf {
    let here = std::env::current_dir().ok();
    let above = here.iter().flat_map(|d| d.ancestors()).map(|d| d.join(rel));
    let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel);
    let mut looked = Vec::new();
    for candidate in above.chain(std::iter::once(built)) {
        if candidate.exists() {
            return candidate;
        }
        looked.push(candidate.display().to_string());
    }
    panic!(
        "{rel} not found: run the tests from the repository (or a copy of it); looked in:\n  {}",
        looked.join("\n  ")
    );
}

#[test]
fn repository_files_are_found_from_the_current_directory_or_above() {
    // Cargo runs unit tests in `cli/`: the repository's files are one level up.
    let found = repo_path("benches/baselines");
    assert!(found.join("README.md").is_file(), "{}", found.display());
    let caught = std::panic::catch_unwind(|| repo_path("no/such/file-of-the-repository"));
    let message = caught.unwrap_err();
    let message = message
        .downcast_ref::<String>()
        .map(String::as_str)
        .unwrap_or_default();
    assert!(
        message.starts_with("no/such/file-of-the-repository not found"),
        "{message}"
    );
}

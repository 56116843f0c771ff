//! What the end-to-end tests of `xtask` share: the binary run ([`run`], [`Run`]) and fresh
//! directories ([`temp_dir`], [`TempDirExt`]). All but [`run`] is the `vkgdr` command's tests'
//! [`harness`], included by its path.

#[path = "../../../cli/tests/common/harness.rs"]
pub mod harness;

pub use harness::{temp_dir, Run, TempDirExt};

/// Runs `xtask ARGS` with `env` set, help at a fixed width and no stdin.
pub fn run(args: &[&str], env: &[(&str, &str)]) -> Run {
    harness::run_binary(env!("CARGO_BIN_EXE_xtask"), args, &["COLUMNS"], env)
}

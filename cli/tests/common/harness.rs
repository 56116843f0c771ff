//! The half of the end-to-end test helpers that names no binary, shared by the `vkgdr` tests and
//! the `xtask` tests (xtask/tests/common includes this file by its path): a binary run in an
//! environment of its own ([`run_binary`], [`Run`]) and fresh directories ([`temp_dir`],
//! [`TempDirExt`]).

use std::process::{Command, Stdio};

use serde_json::Value;
use tempfile::TempDir;

/// What a run of a binary did.
pub struct Run {
    /// Its exit code (-1: killed by a signal).
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Everything, for an assertion's message.
    pub fn all(&self) -> String {
        format!(
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }

    /// Stdout as one JSON document (the whole of it, nothing before or after).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{}", self.all()))
    }
}

/// Runs `BIN ARGS` with `env` set, none of `removed` inherited and no stdin.
pub fn run_binary(bin: &str, args: &[&str], removed: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(bin);
    cmd.args(args).stdin(Stdio::null());
    for v in removed {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("run {bin}: {e}"));
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A fresh directory under the system temp dir, removed on drop; `tag` (the test's) is in its
/// name.
pub fn temp_dir(tag: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("vkgdr-test-{tag}-"))
        .tempdir()
        .unwrap()
}

/// What the tests do in a [`temp_dir`]: write files and name it on a command line.
pub trait TempDirExt {
    /// Writes `text` into the file `name` here (making its directories); returns its path.
    fn file(&self, name: &str, text: &str) -> String;

    /// Writes `doc` as pretty JSON into the file `name` here; returns its path.
    fn doc(&self, name: &str, doc: &Value) -> String {
        self.file(name, &serde_json::to_string_pretty(doc).unwrap())
    }

    /// This directory's path as an argument.
    fn arg(&self) -> &str;
}

impl TempDirExt for TempDir {
    fn file(&self, name: &str, text: &str) -> String {
        let p = self.path().join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    }

    fn arg(&self) -> &str {
        self.path().to_str().unwrap()
    }
}

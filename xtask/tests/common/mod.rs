//! What the end-to-end tests of `xtask` share: the binary run ([`run`], [`Run`]) and fresh
//! directories ([`TempDir`]).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

/// What a run of `xtask` did.
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

/// Runs `xtask ARGS` with `env` set, help at a fixed width and no stdin.
pub fn run(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.args(args).stdin(Stdio::null()).env_remove("COLUMNS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run xtask");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "vkgdr-xtask-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    /// Writes `text` into the file `name` here; returns its path.
    pub fn file(&self, name: &str, text: &str) -> String {
        let p = self.0.join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    }

    /// Writes `doc` as pretty JSON into the file `name` here; returns its path.
    pub fn doc(&self, name: &str, doc: &Value) -> String {
        self.file(name, &serde_json::to_string_pretty(doc).unwrap())
    }

    pub fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

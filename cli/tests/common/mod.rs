//! What the end-to-end tests of the `vkgdr` command share: the binary run in an environment of
//! its own ([`run`], [`Run`]), fresh directories ([`TempDir`]), the missing CUDA driver that makes
//! every GPU path fail the same way on any machine ([`NO_CUDA`]) and lavapipe's ICD manifest
//! ([`lavapipe_manifest`]).

// Each test crate uses its own part of this module.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

/// Overrides a test must not inherit from the caller's environment: which CUDA, Vulkan and NVML
/// libraries the probes load, which Vulkan drivers the loader finds, what a container grants the
/// driver (what `vkgdr info` diagnoses) and how wide help is wrapped. A test that wants one sets
/// it.
pub const INHERITED: [&str; 8] = [
    "VKGDR_CUDA_LIBRARY",
    "VKGDR_VULKAN_LIBRARY",
    "VKGDR_NVML_LIBRARY",
    "VK_DRIVER_FILES",
    "VK_ICD_FILENAMES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_VISIBLE_DEVICES",
    "COLUMNS",
];

/// No CUDA driver, whatever the machine has: the GPU paths fail at once, the same everywhere.
pub const NO_CUDA: (&str, &str) = ("VKGDR_CUDA_LIBRARY", "/nonexistent/libcuda.so.1");

/// What a run of `vkgdr` did.
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

/// Runs `vkgdr ARGS` with `env` set, nothing of [`INHERITED`] inherited and no stdin.
pub fn run(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vkgdr"));
    cmd.args(args).stdin(Stdio::null());
    for v in INHERITED {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run vkgdr");
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
            "vkgdr-cli-test-{tag}-{}-{}",
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

/// Lavapipe's ICD manifest: the one Vulkan driver CI has.
pub fn lavapipe_manifest() -> String {
    std::fs::read_dir("/usr/share/vulkan/icd.d")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("lvp_icd"))
        .unwrap_or_else(|| {
            panic!(
                "this test needs Mesa's lavapipe: `apt-get install libvulkan1 \
                 mesa-vulkan-drivers` (scripts/test does it for you)"
            )
        })
        .display()
        .to_string()
}

//! What the end-to-end tests of the `vkgdr` command share: the binary run in an environment of
//! its own ([`run`], [`Run`]), fresh directories ([`temp_dir`], [`TempDirExt`]), the missing CUDA
//! driver that makes every GPU path fail the same way on any machine ([`NO_CUDA`]) and lavapipe's
//! ICD manifest ([`lavapipe_manifest`]). [`Run`] and the directories come from [`harness`], which
//! the `xtask` tests share.

// Each test crate uses its own part of this module.
#![allow(dead_code, unused_imports)]

pub mod harness;

pub use harness::{temp_dir, Run, TempDirExt};

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

/// Runs `vkgdr ARGS` with `env` set, nothing of [`INHERITED`] inherited and no stdin.
pub fn run(args: &[&str], env: &[(&str, &str)]) -> Run {
    harness::run_binary(env!("CARGO_BIN_EXE_vkgdr"), args, &INHERITED, env)
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

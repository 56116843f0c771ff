//! Shared helpers for the GPU tests (compiled into each GPU test binary).
#![allow(dead_code)]

use std::ffi::c_void;

use vkgdr::cuda_objects::{LaunchConfig, Module};
use vkgdr::{Gpu, OpenOptions};

/// PTX of kernels/mapping.cu (generated on the GPU machine with `scripts/gpu-check ptx`).
pub const MAPPING_PTX: &str = include_str!("../../kernels/mapping.ptx");

/// Why GPU tests are ignored on CI: run them with `--include-ignored` on the GPU machine.
pub const NEEDS_GPU: &str =
    "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)";

/// The word pattern the kernels check (same formula as `pattern` in mapping.cu).
pub fn pattern(i: u64, seed: u32) -> u32 {
    (i.wrapping_mul(2654435761) as u32) ^ seed
}

/// Opens GPU 0 in coherent (default) or forced non-coherent mode.
pub fn open(force_non_coherent: bool) -> Gpu {
    Gpu::open_with(0, OpenOptions::new().force_non_coherent(force_non_coherent))
        .expect("open GPU 0")
}

/// Number of open fds of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Launches `name` from `module` with a 1-D grid and waits for it.
pub fn launch(
    gpu: &Gpu,
    module: &Module,
    name: &str,
    blocks: u32,
    threads: u32,
    params: &mut [*mut c_void],
) {
    let f = module.function(name).expect("kernel");
    // SAFETY: each test passes pointers to values whose types match the kernel's parameters, and
    // keeps the memory alive until the synchronize below.
    unsafe {
        f.launch(LaunchConfig::linear(blocks, threads), None, params)
            .expect("launch")
    };
    gpu.synchronize().expect("kernel completed");
}

/// A parameter pointer for `launch`.
pub fn arg<T>(v: &mut T) -> *mut c_void {
    (v as *mut T).cast()
}

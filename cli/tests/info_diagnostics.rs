//! `vkgdr info` end to end, once per problem CI can make happen for real: the binary runs in an
//! environment that hides the Vulkan loader, the Vulkan driver or the CUDA driver through the
//! documented overrides, and must name the problem and its fix and, with `--check`, exit 1 (a
//! plain `vkgdr info` prints the same report and succeeds). (Every diagnosis, also
//! those CI cannot produce, is tested as a pure function in `vkgdr::diagnose`.)
//!
//! Needs lavapipe (`apt-get install libvulkan1 mesa-vulkan-drivers`; scripts/test installs it).
//! Not part of the GPU bundle: these cases are about machines without a GPU.

mod common;

use common::{lavapipe_manifest, NO_CUDA};

/// Runs `vkgdr info --check` with `env` set (and nothing inherited that would change the
/// outcome); returns its exit code and output.
fn info(env: &[(&str, &str)]) -> (i32, String) {
    run(&["info", "--check"], env)
}

/// Runs `vkgdr ARGS`; returns its exit code and its stdout and stderr together.
fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let r = common::run(args, env);
    (r.code, r.stdout + &r.stderr)
}

#[test]
fn lavapipe_only_is_vulkan_without_an_nvidia_device() {
    let manifest = lavapipe_manifest();
    let (code, out) = info(&[("VK_DRIVER_FILES", manifest.as_str())]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("llvmpipe"),
        "the device list shows lavapipe:\n{out}"
    );
    assert!(
        out.contains("error: Vulkan shows no NVIDIA device: only llvmpipe"),
        "{out}"
    );
    // With VK_DRIVER_FILES set, the manifests searched are exactly those it names.
    assert!(out.contains("nvidia_icd.json) is missing"), "{out}");
    assert!(out.contains(manifest.as_str()), "{out}");
}

#[test]
fn no_vulkan_loader() {
    let (code, out) = info(&[("VKGDR_VULKAN_LIBRARY", "/nonexistent/libvulkan.so.1")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "error: no Vulkan loader: library libvulkan.so.1 not found: \
             VKGDR_VULKAN_LIBRARY=/nonexistent/libvulkan.so.1"
        ),
        "{out}"
    );
    assert!(out.contains("apt-get install libvulkan1"), "{out}");
    // Not blamed on a missing NVIDIA device as well: the loader is the fix.
    assert!(!out.contains("Vulkan shows no NVIDIA device"), "{out}");
}

#[test]
fn no_vulkan_driver_in_a_container_without_the_graphics_capability() {
    let (code, out) = info(&[
        ("VK_DRIVER_FILES", "/nonexistent/nvidia_icd.json"),
        ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("VK_ERROR_INCOMPATIBLE_DRIVER"), "{out}");
    assert!(
        out.contains("error: Vulkan shows no NVIDIA device: no Vulkan driver at all"),
        "{out}"
    );
    assert!(
        out.contains("(NVIDIA_DRIVER_CAPABILITIES=compute,utility)"),
        "{out}"
    );
    assert!(
        out.contains("NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics"),
        "{out}"
    );
}

#[test]
fn no_cuda_driver() {
    let (code, out) = info(&[NO_CUDA]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "error: no CUDA driver: library libcuda.so.1 not found: \
             VKGDR_CUDA_LIBRARY=/nonexistent/libcuda.so.1"
        ),
        "{out}"
    );
    assert!(out.contains("install the NVIDIA driver"), "{out}");
    // No CUDA means no NVML note either: one problem, one fix.
    assert!(!out.contains("note: no BAR1 figures"), "{out}");
}

#[test]
fn plain_info_reports_the_problem_and_succeeds() {
    let env = [NO_CUDA];
    let (code, out) = run(&["info"], &env);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("error: no CUDA driver"), "{out}");
    let (code, out) = run(&["info", "--bogus"], &env);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("unexpected argument '--bogus'"), "{out}");
    assert!(out.contains("Usage: vkgdr info [OPTIONS]"), "{out}");
    // No command is `vkgdr info`.
    let (code, out) = run(&[], &env);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("error: no CUDA driver"), "{out}");
}

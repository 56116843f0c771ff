//! Shared helpers for the integration tests: a Vulkan context that explains what to install when
//! it cannot be had, and the GPU tests' kernels and launch helpers.
#![allow(dead_code)]

use std::ffi::c_void;
use std::sync::Arc;

use vkgdr::cuda_objects::{LaunchConfig, Module};
use vkgdr::vulkan::{DeviceSelector, MemoryOptions, VulkanContext};
use vkgdr::{Gpu, OpenOptions};

/// A Vulkan context on the first device with exportable host-visible memory (lavapipe on CI, the
/// NVIDIA driver on the GPU machine). Without one the test fails with a message that names the
/// packages to install instead of an `unwrap` backtrace.
pub fn vulkan_context(options: MemoryOptions) -> Arc<VulkanContext> {
    match VulkanContext::new(DeviceSelector::FirstSuitable, options) {
        Ok(ctx) => ctx,
        Err(e) => panic!(
            "this test needs a Vulkan device with VK_KHR_external_memory_fd, and there is none: {e}\n\
             install the Vulkan loader and Mesa's lavapipe (`apt-get install libvulkan1 \
             mesa-vulkan-drivers`; scripts/test does it for you) or run on an NVIDIA machine"
        ),
    }
}

/// [`vulkan_context`] with default options, or with every flush forced.
pub fn vulkan(force_non_coherent: bool) -> Arc<VulkanContext> {
    vulkan_context(MemoryOptions {
        force_non_coherent,
        ..Default::default()
    })
}

/// Once per process: a context that allocates, maps and exports once, then goes. Whatever the
/// driver opens on first use for the whole process (files it keeps) is then open before a test
/// counts fds, while what belongs to a device closes with it.
pub fn warm_up_vulkan() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let ctx = vulkan(false);
        let mem = ctx.allocate(64 << 10).expect("warm-up allocation");
        drop(mem.export_fd().expect("warm-up export"));
    });
}

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

/// Launches `check_tagged_blocks` (kernels/mapping.ptx) over `count` blocks described by device
/// arrays of addresses (`ptrs`, u64), sizes (`lens`, u32) and tags (`tags`, u32): it adds the
/// number of blocks whose bytes differ from their tag to the u64 at `bad`.
#[allow(clippy::too_many_arguments)]
pub fn launch_check_tagged_blocks(
    gpu: &Gpu,
    module: &Module,
    grid: u32,
    mut ptrs: u64,
    mut lens: u64,
    mut tags: u64,
    mut count: u64,
    mut bad: u64,
) {
    launch(
        gpu,
        module,
        "check_tagged_blocks",
        grid,
        256,
        &mut [
            arg(&mut ptrs),
            arg(&mut lens),
            arg(&mut tags),
            arg(&mut count),
            arg(&mut bad),
        ],
    );
}

/// A parameter pointer for `launch`.
pub fn arg<T>(v: &mut T) -> *mut c_void {
    (v as *mut T).cast()
}

/// How a forked child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildEnd {
    /// It exited with this status.
    Exited(i32),
    /// A signal killed it (`libc::SIGSEGV`: it faulted).
    Signaled(i32),
}

/// Forks; the child stores `byte` at `ptr` (a volatile store, nothing else: the child of a
/// threaded process should make async-signal-safe calls only) and exits 0 if it survives.
/// Returns how the child ended. What a child could reach of the parent is what gdrcopy's sanity
/// suite checks in forked children too.
pub fn child_stores(ptr: *mut u8, byte: u8) -> ChildEnd {
    in_child(|| {
        // SAFETY: the parent's pointer: mapped in the child only if fork copied the mapping (then
        // the store lands in memory both share); otherwise the child faults, which is the point
        // of the test.
        unsafe { ptr.write_volatile(byte) }
    })
}

/// Forks; the child runs `f` and exits 0 if it survives (it never returns into the parent's
/// code, and never unwinds: a panic aborts it). Returns how the child ended. Keep `f` to what a
/// child of a threaded process can do: no locks other threads may hold.
pub fn in_child(f: impl FnOnce()) -> ChildEnd {
    // SAFETY: the child runs `f` (the caller keeps it fork-safe) and calls `_exit`; it returns
    // into no Rust code of the parent.
    match unsafe { libc::fork() } {
        -1 => panic!("fork failed: {}", std::io::Error::last_os_error()),
        0 => {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
                // SAFETY: `_exit` ends the child at once.
                unsafe { libc::_exit(101) }
            }
            // SAFETY: as above.
            unsafe { libc::_exit(0) }
        }
        pid => {
            let mut status = 0;
            // SAFETY: waiting for our own child, with a valid out-pointer.
            let r = unsafe { libc::waitpid(pid, &mut status, 0) };
            assert_eq!(r, pid, "waitpid: {}", std::io::Error::last_os_error());
            if libc::WIFSIGNALED(status) {
                ChildEnd::Signaled(libc::WTERMSIG(status))
            } else {
                ChildEnd::Exited(libc::WEXITSTATUS(status))
            }
        }
    }
}

/// Fills `mapping` with 0x5a, then has a forked child store 0xee at its first and last byte: the
/// child must die with SIGSEGV (its copy of the address space lacks the mapping). The caller then
/// checks, its own way, that the bytes are still 0x5a.
pub fn children_fault_storing_into(what: &str, mapping: &mut impl vkgdr::Mapping) {
    let len = mapping.len();
    mapping.fill(0, len, 0x5a).unwrap();
    for offset in [0, len - 1] {
        // `offset < len`: inside the mapping.
        let p = mapping.host_ptr().wrapping_add(offset as usize);
        assert_eq!(
            child_stores(p, 0xee),
            ChildEnd::Signaled(libc::SIGSEGV),
            "{what}: a forked child stored at offset {offset} without faulting"
        );
    }
}

/// What the fds of a freshly spawned program (`/bin/sh`) refer to, one entry per fd: what an
/// `exec`'d child inherits from this process, plus its standard streams.
pub fn fds_of_spawned_child() -> Vec<String> {
    let out = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg("for f in /proc/$$/fd/*; do readlink \"$f\"; done; true")
        .output()
        .expect("spawn /bin/sh");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

//! Shared helpers for the integration tests: a Vulkan context that explains what to install when
//! it cannot be had, and the GPU tests' kernels and launch helpers.
#![allow(dead_code)]

pub mod share;

use std::ffi::c_void;
use std::sync::Arc;

use vkgdr::cuda_objects::{LaunchConfig, Module};
use vkgdr::vulkan::{DeviceSelector, MemoryOptions, VulkanContext};
use vkgdr::{Gpu, OpenOptions};

/// Whether `scripts/gpu-check` runs this test under compute-sanitizer (`SANITIZE=1` sets
/// `VKGDR_UNDER_SANITIZER`): kernels then run one at a time (one launched beside a persistent
/// kernel never starts) and far slower.
pub fn under_sanitizer() -> bool {
    std::env::var_os("VKGDR_UNDER_SANITIZER").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Byte 0 of the block tagged `tag`: the top byte of `tag * 2654435761` (`tag_base` in
/// `kernels/mapping.cu`), which every bit of the tag moves.
pub fn tag_base(tag: u32) -> u8 {
    (tag.wrapping_mul(2654435761) >> 24) as u8
}

/// The byte pattern of tagged memory: byte `j` of the block tagged `tag` is `tag_base(tag) + j`
/// (mod 256), what the `check_tagged_blocks` kernel in `kernels/mapping.cu` expects. Two tags
/// write either the same bytes or different bytes at every index (their bases differ); flipping
/// any one bit of a tag changes its base.
pub fn tag_bytes(tag: u32, len: usize) -> Vec<u8> {
    let base = tag_base(tag);
    (0..len).map(|j| base.wrapping_add(j as u8)).collect()
}

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

/// Waits (up to 30 s) until every release of `gpu`'s memory has happened: frees never wait for
/// the GPU, so a test that counts fds or free memory right after dropping memory settles first.
pub fn settle(gpu: &Gpu) {
    assert!(
        gpu.wait_for_releases(std::time::Duration::from_secs(30)),
        "{} releases still waiting after 30 s",
        gpu.pending_releases()
    );
}

/// Number of open fds of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// This process's open file descriptors and what each points to (a device node, a memfd,
/// `anon_inode:...`): printed when a count differs, to tell the driver's own growth from a leak.
pub fn open_fd_targets() -> std::collections::BTreeMap<u32, String> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let fd = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            Some((fd, target.display().to_string()))
        })
        .collect()
}

/// The entries of `after` that are new or changed since `before`, one per line.
pub fn fd_changes(
    before: &std::collections::BTreeMap<u32, String>,
    after: &std::collections::BTreeMap<u32, String>,
) -> String {
    let mut out = String::new();
    for (fd, target) in after {
        if before.get(fd) != Some(target) {
            out.push_str(&format!("  new fd {fd} -> {target}\n"));
        }
    }
    for (fd, target) in before {
        if !after.contains_key(fd) {
            out.push_str(&format!("  closed fd {fd} (was {target})\n"));
        }
    }
    out
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

/// `spin_until_stopped` (kernels/mapping.cu) running on a non-blocking stream of its own, or on
/// the legacy default stream: the persistent kernel beside which the coexistence tests call the
/// library. Its stop word and heartbeat live in a raw allocation; `stop` ends it with a plain
/// store through the BAR.
pub struct PersistentKernel {
    gpu: Gpu,
    pub module: Module,
    words: vkgdr::RawMemory,
    pub stream: vkgdr::cuda_objects::Stream,
    on_legacy: bool,
    running: bool,
}

impl PersistentKernel {
    /// Loads the module and launches the kernel; returns once its heartbeat shows it running.
    ///
    /// Loading a module waits for running kernels, and so does the first launch of each kernel
    /// under CUDA's lazy loading (the default since CUDA 12): every kernel of `warm` (name and
    /// number of 8-byte parameters, launched once with zeros, which must be harmless) is
    /// launched here first, before the persistent kernel starts.
    pub fn start(gpu: &Gpu, on_legacy_stream: bool, warm: &[(&str, usize)]) -> PersistentKernel {
        let module = Module::load_ptx(gpu, MAPPING_PTX).expect("load kernels/mapping.ptx");
        let stream = vkgdr::cuda_objects::Stream::new(gpu).expect("stream");
        for &(name, params) in warm {
            let f = module.function(name).expect("kernel");
            let mut zeros = vec![0u64; params];
            let mut args: Vec<*mut c_void> = zeros.iter_mut().map(arg).collect();
            // SAFETY: `params` 8-byte parameters, all zero, which the caller promises the kernel
            // takes as a no-op; the values outlive the synchronize below.
            unsafe { f.launch(LaunchConfig::linear(1, 1), Some(&stream), &mut args) }
                .expect("warm-up launch");
            stream.synchronize().expect("warm-up launch completed");
        }
        let mut k = PersistentKernel {
            gpu: gpu.clone(),
            module,
            words: gpu.alloc(4096).expect("stop and heartbeat words"),
            stream,
            on_legacy: on_legacy_stream,
            running: false,
        };
        k.launch();
        k
    }

    fn word<T>(&self, offset: usize) -> *mut T {
        // SAFETY: offsets 0 and 64 lie inside the 4 KiB allocation.
        unsafe { self.words.host_ptr().add(offset).cast() }
    }

    /// (Re)launches the kernel and waits up to 10 s for its heartbeat.
    pub fn launch(&mut self) {
        // SAFETY: aligned words of the live allocation; the kernel is not running.
        unsafe {
            self.word::<u32>(0).write_volatile(0);
            self.word::<u64>(64).write_volatile(0);
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.words.flush(0, 128).unwrap();
        let f = self.module.function("spin_until_stopped").expect("kernel");
        let (mut stop, mut beats) = (self.words.device_ptr(), self.words.device_ptr() + 64);
        let mut params = [arg(&mut stop), arg(&mut beats)];
        let stream = (!self.on_legacy).then_some(&self.stream);
        // SAFETY: two device pointers into `words`, which outlives the kernel (`Drop` stops it
        // and waits before the words go).
        unsafe { f.launch(LaunchConfig::linear(1, 1), stream, &mut params) }.expect("launch");
        self.running = true;
        let t = std::time::Instant::now();
        while self.beats() == 0 {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(10),
                "the persistent kernel never started"
            );
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// The heartbeat: grows while the kernel runs, odd once it has exited.
    pub fn beats(&self) -> u64 {
        // SAFETY: an aligned word of the live allocation, written by the kernel.
        unsafe { self.word::<u64>(64).read_volatile() }
    }

    /// Whether the heartbeat advances within 2 s (the kernel really runs).
    pub fn is_alive(&self) -> bool {
        let a = self.beats();
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_secs(2) {
            if self.beats() != a && self.beats() & 1 == 0 {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
        false
    }

    /// Asks the kernel to stop (a plain store, no driver call) and waits up to 10 s for it to
    /// exit.
    pub fn stop(&mut self) {
        if !self.running {
            return;
        }
        // SAFETY: the aligned stop word of the live allocation.
        unsafe { self.word::<u32>(0).write_volatile(1) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let t = std::time::Instant::now();
        while self.beats() & 1 == 0 {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(10),
                "the persistent kernel did not exit"
            );
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        if self.on_legacy {
            self.gpu.synchronize().unwrap();
        } else {
            self.stream.synchronize().unwrap();
        }
        self.running = false;
    }
}

impl Drop for PersistentKernel {
    fn drop(&mut self) {
        if self.running && !std::thread::panicking() {
            self.stop();
        } else if self.running {
            // SAFETY: the aligned stop word; a failing test still lets the kernel end.
            unsafe { self.word::<u32>(0).write_volatile(1) };
        }
    }
}

/// What each thread of a multi-threaded GPU test is doing, for the watchdog.
pub struct ThreadStates {
    states: Vec<std::sync::Mutex<(String, u64)>>,
}

impl ThreadStates {
    pub fn new(threads: usize) -> std::sync::Arc<ThreadStates> {
        std::sync::Arc::new(ThreadStates {
            states: (0..threads)
                .map(|_| std::sync::Mutex::new(("starting".into(), 0)))
                .collect(),
        })
    }

    /// Thread `i` is now doing `what` (its operation count grows by one).
    pub fn set(&self, i: usize, what: &str) {
        let mut s = self.states[i].lock().unwrap_or_else(|e| e.into_inner());
        s.0.clear();
        s.0.push_str(what);
        s.1 += 1;
    }

    fn dump(&self) -> String {
        self.states
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let s = s.lock().unwrap_or_else(|e| e.into_inner());
                format!("  thread {i}: {} (after {} steps)\n", s.0, s.1)
            })
            .collect()
    }
}

/// Ends the process with every thread's state printed if `done` is not set within `limit`: a
/// test that would hang fails instead (a thread stuck in a driver call cannot be unwound).
pub fn watchdog(
    what: &'static str,
    limit: std::time::Duration,
    states: std::sync::Arc<ThreadStates>,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let t = std::time::Instant::now();
        while !done.load(std::sync::atomic::Ordering::Acquire) {
            if t.elapsed() > limit {
                eprintln!(
                    "WATCHDOG: {what} still running after {} s; thread states:\n{}",
                    limit.as_secs(),
                    states.dump()
                );
                std::process::exit(3);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    })
}

/// Waits until `stream`'s work completed, polling an event (never `cuStreamSynchronize`, which
/// a hung kernel would hold for ever); `false` after `limit`.
pub fn wait_for(
    gpu: &Gpu,
    stream: &vkgdr::cuda_objects::Stream,
    limit: std::time::Duration,
) -> bool {
    let event = vkgdr::cuda_objects::Event::new(gpu).unwrap();
    event.record(stream).unwrap();
    let t = std::time::Instant::now();
    while !event.is_complete().unwrap() {
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    true
}

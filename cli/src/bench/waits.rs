//! `waits`: which driver and library calls wait for a running kernel.
//!
//! A persistent kernel (`spin_until_stopped` in kernels/mapping.cu) spins on a stop word in BAR
//! memory. Each call is made from a worker thread and timed there; if it has not returned after
//! the patience window, the CPU stops the kernel with a plain store through the BAR (no driver
//! call, which could queue behind the stuck one), and the call is recorded as one that waits:
//! its time is then at least the patience window. The same calls run in three conditions: no
//! kernel, the kernel on a non-blocking stream of its own, and the kernel on the legacy default
//! stream (which every blocking stream synchronises with).
//!
//! The results are the table in docs/RELIABILITY.md: what may run while a kernel runs.

use std::ffi::c_void;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use vkgdr::cuda::{
    Driver, ExternalMemoryBufferDesc, ExternalMemoryHandleDesc, MemAccessDesc, MemLocation,
    CU_EVENT_DISABLE_TIMING, CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD, CU_MEMHOSTALLOC_DEVICEMAP,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
    CU_STREAM_NON_BLOCKING,
};
use vkgdr::cuda_objects::{LaunchConfig, Module, PinnedBuffer, Stream};
use vkgdr::ring::DeviceRing;
use vkgdr::{Arena, Gpu, Mapping, OpenOptions, Pool, PoolConfig, RawMemory};

use super::{open_gpu, BenchError, BenchResult, Options, Report, Row, Stats, Unit};
use crate::ui;

const PTX: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../kernels/mapping.ptx"
));

/// Bytes of each allocation the calls make (a multiple of the VMM granularity).
const SIZE: u64 = 2 << 20;
/// Offsets of the kernel's stop word (u32) and heartbeat (u64) in its BAR allocation.
const STOP: usize = 0;
const BEATS: usize = 64;
/// Offset of the completion word the legacy stream writes (u32).
const WORD: usize = 128;

/// Where the persistent kernel runs while the calls are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Condition {
    /// No kernel runs.
    Idle,
    /// The kernel runs on a non-blocking stream of its own.
    OwnStream,
    /// The kernel runs on the legacy default stream.
    LegacyStream,
}

impl Condition {
    fn report_name(self) -> &'static str {
        match self {
            Condition::Idle => "waits-idle",
            Condition::OwnStream => "waits-own-stream",
            Condition::LegacyStream => "waits-legacy-stream",
        }
    }
}

/// The persistent kernel and the BAR words that steer it.
struct Spinner {
    gpu: Gpu,
    module: Module,
    flags: RawMemory,
    stream: Stream,
    running: bool,
    on_legacy: bool,
}

impl Spinner {
    fn new(gpu: &Gpu) -> BenchResult<Spinner> {
        Ok(Spinner {
            gpu: gpu.clone(),
            module: Module::load_ptx(gpu, PTX)?,
            flags: gpu.alloc(4096)?,
            stream: Stream::new(gpu)?,
            running: false,
            on_legacy: false,
        })
    }

    fn stop_word(&self) -> &AtomicU32 {
        // SAFETY: an aligned u32 inside the 4 KiB allocation, alive as long as `self`; the host
        // touches it only through this atomic, the kernel with volatile loads.
        unsafe { AtomicU32::from_ptr(self.flags.host_ptr().add(STOP).cast()) }
    }

    fn beats(&self) -> u64 {
        // SAFETY: an aligned u64 inside the allocation; the kernel writes it with volatile
        // stores, the host only reads it.
        unsafe { std::ptr::read_volatile(self.flags.host_ptr().add(BEATS).cast::<u64>()) }
    }

    /// Launches the kernel and waits until its heartbeat shows it running.
    fn launch(&mut self, on_legacy: bool) -> BenchResult<()> {
        self.stop_word().store(0, Ordering::Relaxed);
        // SAFETY: as in `beats`; the kernel is not running, so the host may write the word.
        unsafe { std::ptr::write_volatile(self.flags.host_ptr().add(BEATS).cast::<u64>(), 0) };
        fence(Ordering::SeqCst);
        self.flags.flush(0, 128)?;
        let f = self.module.function("spin_until_stopped")?;
        let (mut stop, mut beats) = (
            self.flags.device_ptr() + STOP as u64,
            self.flags.device_ptr() + BEATS as u64,
        );
        let mut params = [
            &mut stop as *mut u64 as *mut c_void,
            &mut beats as *mut u64 as *mut c_void,
        ];
        let stream = (!on_legacy).then_some(&self.stream);
        // SAFETY: two pointer parameters, as the kernel declares; both point into `flags`, which
        // outlives every launch (the kernel is stopped and waited for before `flags` drops).
        unsafe { f.launch(LaunchConfig::linear(1, 1), stream, &mut params) }?;
        self.running = true;
        self.on_legacy = on_legacy;
        let t = Instant::now();
        while self.beats() == 0 {
            if t.elapsed() > Duration::from_secs(10) {
                return Err(BenchError::KernelStuck(
                    "spin_until_stopped showed no heartbeat within 10 s".into(),
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    /// Asks the kernel to stop with a plain store: safe to call while another thread is stuck
    /// in the driver.
    fn signal_stop(&self) {
        self.stop_word().store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Stops the kernel and waits until it has exited (its last heartbeat is odd).
    fn stop(&mut self) -> BenchResult<()> {
        if !self.running {
            return Ok(());
        }
        self.signal_stop();
        let t = Instant::now();
        while self.beats() & 1 == 0 {
            if t.elapsed() > Duration::from_secs(10) {
                return Err(BenchError::KernelStuck(
                    "spin_until_stopped did not exit within 10 s of its stop word".into(),
                ));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        if self.on_legacy {
            self.gpu.synchronize()?;
        } else {
            self.stream.synchronize()?;
        }
        self.running = false;
        Ok(())
    }

    /// Whether the heartbeat still advances (the kernel really runs beside the calls).
    fn alive(&self) -> bool {
        let a = self.beats();
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(200) {
            if self.beats() != a {
                return true;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        false
    }
}

/// One timed call's samples under one condition.
struct Sample {
    call: String,
    ns: Vec<f64>,
    waited: bool,
}

/// Makes the calls of one condition, timing each on a worker thread.
struct Probe<'a> {
    spinner: &'a mut Spinner,
    condition: Condition,
    patience: Duration,
    samples: Vec<Sample>,
    /// Set when a call of the current scenario waited: its other repetitions are skipped.
    scenario_waited: bool,
    /// What the calls showed besides their time (distinct lines).
    observations: Vec<String>,
    /// The last value written to the completion word.
    ticket: u32,
}

impl Probe<'_> {
    /// The device and host address of the completion word in the spinner's allocation.
    fn word(&self) -> (u64, Handle) {
        (
            self.spinner.flags.device_ptr() + WORD as u64,
            // SAFETY: inside the 4 KiB allocation.
            Handle::of(unsafe { self.spinner.flags.host_ptr().add(WORD) }.cast()),
        )
    }

    fn next_ticket(&mut self) -> u32 {
        self.ticket += 1;
        self.ticket
    }

    fn observe(&mut self, line: String) {
        if !self.observations.contains(&line) {
            self.observations.push(line);
        }
    }

    /// Makes `f` on a worker thread, with the kernel running when the condition says so.
    fn call<T: Send>(
        &mut self,
        name: &str,
        f: impl FnOnce() -> vkgdr::Result<T> + Send,
    ) -> BenchResult<T> {
        ui::step(name.to_string());
        match self.condition {
            Condition::Idle => {}
            c if !self.spinner.running => self.spinner.launch(c == Condition::LegacyStream)?,
            _ => {}
        }
        let (tx, rx) = mpsc::channel();
        let spinner = &*self.spinner;
        let patience = self.patience;
        let (result, elapsed, waited, bystander) = std::thread::scope(|s| {
            let worker = s.spawn(move || {
                let t = Instant::now();
                let r = f();
                let elapsed = t.elapsed();
                let _ = tx.send(());
                (r, elapsed)
            });
            let waited = rx.recv_timeout(patience).is_err();
            let mut bystander = None;
            if waited {
                // Does the stuck call hold up other threads? One allocation the non-waiting path
                // makes (Vulkan memory, fd, VMM import), from a third thread.
                let (btx, brx) = mpsc::channel();
                let gpu = &spinner.gpu;
                s.spawn(move || {
                    let t = Instant::now();
                    let r = bystander_allocation(gpu);
                    let _ = btx.send((r.is_ok(), t.elapsed()));
                });
                bystander = Some(brx.recv_timeout(patience));
                spinner.signal_stop();
            }
            let (r, elapsed) = worker.join().expect("a probed call panicked");
            (r, elapsed, waited, bystander)
        });
        match bystander {
            Some(Ok((ok, t))) => self.observe(format!(
                "while {name} waited, another thread allocated (Vulkan + VMM import) in {} µs{}",
                t.as_micros(),
                if ok { "" } else { " (and failed)" }
            )),
            Some(Err(_)) => self.observe(format!(
                "while {name} waited, another thread's allocation (Vulkan + VMM import) was held up too"
            )),
            None => {}
        }
        if waited {
            // The stop word is set: let the kernel finish, so the next call relaunches it.
            self.spinner.stop()?;
            self.scenario_waited = true;
        }
        let ns = elapsed.as_nanos() as f64;
        match self.samples.iter_mut().find(|s| s.call == name) {
            Some(s) => {
                s.ns.push(ns);
                s.waited |= waited;
            }
            None => self.samples.push(Sample {
                call: name.to_string(),
                ns: vec![ns],
                waited,
            }),
        }
        result.map_err(BenchError::from)
    }
}

/// What the non-waiting allocation path does, made while another call is stuck: Vulkan memory,
/// its fd, a VMM import of it, released again.
fn bystander_allocation(gpu: &Gpu) -> vkgdr::Result<()> {
    let d = gpu.driver();
    let mem = gpu.vulkan().allocate(SIZE)?;
    let fd = mem.export_fd()?;
    let _c = gpu.bind()?;
    // SAFETY: a live opaque fd passed as the handle value; the call does not keep it.
    let handle = unsafe {
        d.cu_mem_import_from_shareable_handle(
            fd.as_raw_fd() as isize as *mut c_void,
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    }?;
    // SAFETY: ours, never mapped.
    unsafe { d.cu_mem_release(handle) }
}

/// A raw handle carried to a worker thread (driver handles are process-wide values).
#[derive(Clone, Copy)]
struct Handle(u64);

impl Handle {
    fn ptr(self) -> *mut c_void {
        self.0 as usize as *mut c_void
    }
    fn of(p: *mut c_void) -> Handle {
        Handle(p as usize as u64)
    }
}

/// The CUDA ordinal of the GPU's device.
fn ordinal_of(gpu: &Gpu) -> vkgdr::Result<i32> {
    let d = gpu.driver();
    for i in 0..d.device_count()? {
        if d.device(i)? == gpu.cu_device() {
            return Ok(i);
        }
    }
    Ok(0)
}

fn driver_scenarios(p: &mut Probe<'_>, gpu: &Gpu, scratch: u64) -> BenchResult<()> {
    let d: &Driver = gpu.driver();
    let vk = gpu.vulkan();
    let ordinal = ordinal_of(gpu)?;

    // cuMemAlloc / cuMemFree.
    let ptr = p.call("cuMemAlloc_v2", || {
        let _c = gpu.bind()?;
        d.cu_mem_alloc(SIZE as usize)
    })?;
    p.call("cuMemFree_v2 (cuMemAlloc memory)", || {
        let _c = gpu.bind()?;
        // SAFETY: allocated just above, unused.
        unsafe { d.cu_mem_free(ptr) }
    })?;

    // External memory: the mapping layer's import path.
    let mem = p.call("vkAllocateMemory + vkMapMemory", || vk.allocate(SIZE))?;
    let fd: OwnedFd = p.call("vkGetMemoryFdKHR", || mem.export_fd())?;
    let raw_fd = fd.as_raw_fd();
    let ext = p.call("cuImportExternalMemory", || {
        let _c = gpu.bind()?;
        let desc = ExternalMemoryHandleDesc {
            handle_type: CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
            handle: [raw_fd as u32 as u64, 0],
            size: mem.size(),
            flags: 0,
            reserved: [0; 16],
        };
        // SAFETY: a live opaque fd of `mem`, described exactly.
        unsafe { d.cu_import_external_memory(&desc) }.map(Handle::of)
    })?;
    // The import owns the fd now.
    let _ = fd.into_raw_fd();
    let mapped = p.call("cuExternalMemoryGetMappedBuffer", || {
        let _c = gpu.bind()?;
        let desc = ExternalMemoryBufferDesc {
            offset: 0,
            size: mem.size(),
            flags: 0,
            reserved: [0; 16],
        };
        // SAFETY: the live import; the buffer covers the memory object.
        unsafe { d.cu_external_memory_get_mapped_buffer(ext.ptr(), &desc) }
    })?;
    p.call("cuMemFree_v2 (imported buffer)", || {
        let _c = gpu.bind()?;
        // SAFETY: the mapped buffer of the import, unused.
        unsafe { d.cu_mem_free(mapped) }
    })?;
    p.call("cuDestroyExternalMemory", || {
        let _c = gpu.bind()?;
        // SAFETY: the import, with no mapped buffer left.
        unsafe { d.cu_destroy_external_memory(ext.ptr()) }
    })?;

    // The same Vulkan memory through VMM: the non-waiting candidate.
    let fd = p.call("vkGetMemoryFdKHR (again)", || mem.export_fd())?;
    let raw_fd = fd.as_raw_fd();
    let handle = p.call("cuMemImportFromShareableHandle", || {
        let _c = gpu.bind()?;
        // SAFETY: a live opaque fd passed as the handle value; the call does not keep it.
        unsafe {
            d.cu_mem_import_from_shareable_handle(
                raw_fd as isize as *mut c_void,
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        }
    })?;
    drop(fd);
    let va = p.call("cuMemAddressReserve", || {
        let _c = gpu.bind()?;
        d.cu_mem_address_reserve(SIZE as usize, SIZE as usize, 0, 0)
    })?;
    p.call("cuMemMap", || {
        let _c = gpu.bind()?;
        // SAFETY: a fresh reservation of exactly the handle's size.
        unsafe { d.cu_mem_map(va, SIZE as usize, 0, handle, 0) }
    })?;
    p.call("cuMemSetAccess", || {
        let _c = gpu.bind()?;
        let access = MemAccessDesc {
            location: MemLocation::device(ordinal),
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range was just mapped; one descriptor alive for the call.
        unsafe { d.cu_mem_set_access(va, SIZE as usize, &access, 1) }
    })?;
    p.call("cuMemUnmap", || {
        let _c = gpu.bind()?;
        // SAFETY: mapped above with this size, unused.
        unsafe { d.cu_mem_unmap(va, SIZE as usize) }
    })?;
    p.call("cuMemRelease", || {
        let _c = gpu.bind()?;
        // SAFETY: the handle is ours and unmapped.
        unsafe { d.cu_mem_release(handle) }
    })?;
    p.call("cuMemAddressFree", || {
        let _c = gpu.bind()?;
        // SAFETY: the reservation is ours and unmapped.
        unsafe { d.cu_mem_address_free(va, SIZE as usize) }
    })?;
    p.call("vkUnmapMemory + vkFreeMemory", || {
        drop(mem);
        Ok(())
    })?;

    // Pinned host memory, two ways.
    let host = p.call("cuMemHostAlloc", || {
        let _c = gpu.bind()?;
        d.cu_mem_alloc_host(SIZE as usize, CU_MEMHOSTALLOC_DEVICEMAP)
            .map(Handle::of)
    })?;
    p.call("cuMemFreeHost", || {
        let _c = gpu.bind()?;
        // SAFETY: allocated above, unused by any kernel.
        unsafe { d.cu_mem_free_host(host.ptr()) }
    })?;
    let layout = std::alloc::Layout::from_size_align(SIZE as usize, 4096).expect("valid layout");
    // SAFETY: a non-zero size.
    let buf = Handle::of(unsafe { std::alloc::alloc(layout) }.cast());
    p.call("cuMemHostRegister_v2", || {
        let _c = gpu.bind()?;
        // SAFETY: `buf` is a live allocation of SIZE bytes, unregistered before it is freed.
        unsafe { d.cu_mem_host_register(buf.ptr(), SIZE as usize, CU_MEMHOSTALLOC_DEVICEMAP) }
    })?;
    p.call("cuMemHostUnregister", || {
        let _c = gpu.bind()?;
        // SAFETY: registered above.
        unsafe { d.cu_mem_host_unregister(buf.ptr()) }
    })?;
    // SAFETY: allocated above with this layout, unregistered.
    unsafe { std::alloc::dealloc(buf.ptr().cast(), layout) };

    // Pinned host memory through Vulkan and VMM: freed by unmapping, like the BAR chunks.
    let host_mem = p.call("vkAllocateMemory (host memory)", || vk.allocate_host(SIZE))?;
    let fd = p.call("vkGetMemoryFdKHR (host memory)", || host_mem.export_fd())?;
    let raw_fd = fd.as_raw_fd();
    let handle = p.call("cuMemImportFromShareableHandle (host memory)", || {
        let _c = gpu.bind()?;
        // SAFETY: a live opaque fd passed as the handle value; the call does not keep it.
        unsafe {
            d.cu_mem_import_from_shareable_handle(
                raw_fd as isize as *mut c_void,
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        }
    })?;
    drop(fd);
    let va = {
        let _c = gpu.bind()?;
        d.cu_mem_address_reserve(SIZE as usize, SIZE as usize, 0, 0)?
    };
    p.call("cuMemMap (host memory)", || {
        let _c = gpu.bind()?;
        // SAFETY: a fresh reservation of exactly the handle's size.
        unsafe { d.cu_mem_map(va, SIZE as usize, 0, handle, 0) }
    })?;
    p.call("cuMemSetAccess (host memory)", || {
        let _c = gpu.bind()?;
        let access = MemAccessDesc {
            location: MemLocation::device(ordinal),
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range was just mapped; one descriptor alive for the call.
        unsafe { d.cu_mem_set_access(va, SIZE as usize, &access, 1) }
    })?;
    if p.condition == Condition::Idle {
        // The GPU writes through the device mapping; the CPU reads through Vulkan's.
        let _c = gpu.bind()?;
        // SAFETY: the whole range is mapped with read-write access.
        unsafe { d.cu_memset_d32(va, 0x5a5a_5a5a, (SIZE / 4) as usize) }?;
        d.cu_ctx_synchronize()?;
        let p0 = host_mem.as_ptr();
        // SAFETY: first and last word of the mapped allocation; the GPU is done with them.
        let (first, last) = unsafe {
            (
                std::ptr::read_volatile(p0.cast::<u32>()),
                std::ptr::read_volatile(p0.add(SIZE as usize - 4).cast::<u32>()),
            )
        };
        p.observe(format!(
            "GPU writes into host memory mapped through VMM reach the CPU: {}",
            first == 0x5a5a_5a5a && last == 0x5a5a_5a5a
        ));
    }
    p.call("cuMemUnmap (host memory)", || {
        let _c = gpu.bind()?;
        // SAFETY: mapped above with this size.
        unsafe { d.cu_mem_unmap(va, SIZE as usize) }
    })?;
    p.call("cuMemRelease (host memory)", || {
        let _c = gpu.bind()?;
        // SAFETY: ours and unmapped.
        unsafe { d.cu_mem_release(handle) }
    })?;
    {
        let _c = gpu.bind()?;
        // SAFETY: ours and unmapped.
        unsafe { d.cu_mem_address_free(va, SIZE as usize) }?;
    }
    p.call("vkFreeMemory (host memory)", || {
        drop(host_mem);
        Ok(())
    })?;

    // A completion word written by the legacy stream once the work queued before it is done:
    // what a release ordered after that work can poll without a driver call.
    let (word_dev, word_host) = p.word();
    let ticket = p.next_ticket();
    p.call("cuStreamWriteValue32_v2 (legacy stream)", || {
        let _c = gpu.bind()?;
        // SAFETY: an aligned word inside the probe's live BAR allocation.
        unsafe { d.cu_stream_write_value32(std::ptr::null_mut(), word_dev, ticket, 0) }
    })?;
    p.call("legacy-stream completion word arrives", || {
        let t = Instant::now();
        // SAFETY: an aligned u32 in the live BAR allocation, read with volatile loads.
        while unsafe { std::ptr::read_volatile(word_host.ptr().cast::<u32>()) } != ticket {
            if t.elapsed() > Duration::from_secs(20) {
                return Err(vkgdr::Error::Unsupported(
                    "the completion word never arrived".into(),
                ));
            }
            std::hint::spin_loop();
        }
        Ok(())
    })?;

    // Modules, streams, events.
    let text = std::ffi::CString::new(PTX).expect("no NUL in the PTX");
    let module = p.call("cuModuleLoadData", || {
        let _c = gpu.bind()?;
        // SAFETY: NUL-terminated PTX alive for the call.
        unsafe { d.cu_module_load_data(text.as_ptr().cast()) }.map(Handle::of)
    })?;
    p.call("cuModuleUnload", || {
        let _c = gpu.bind()?;
        // SAFETY: loaded above, no function of it in use.
        unsafe { d.cu_module_unload(module.ptr()) }
    })?;
    let stream = p.call("cuStreamCreate", || {
        let _c = gpu.bind()?;
        d.cu_stream_create(CU_STREAM_NON_BLOCKING).map(Handle::of)
    })?;
    p.call("cuStreamDestroy_v2", || {
        let _c = gpu.bind()?;
        // SAFETY: created above, idle.
        unsafe { d.cu_stream_destroy(stream.ptr()) }
    })?;
    let event = p.call("cuEventCreate", || {
        let _c = gpu.bind()?;
        d.cu_event_create(CU_EVENT_DISABLE_TIMING).map(Handle::of)
    })?;
    p.call("cuEventRecord (legacy stream)", || {
        let _c = gpu.bind()?;
        // SAFETY: a live event of this context; the null stream is the legacy stream.
        unsafe { d.cu_event_record(event.ptr(), std::ptr::null_mut()) }
    })?;
    // Whether work queued on the legacy stream before this point is done: what a release ordered
    // after the legacy stream learns.
    std::thread::sleep(Duration::from_millis(2));
    let done = p.call("cuEventQuery", || {
        let _c = gpu.bind()?;
        // SAFETY: a live, recorded event.
        unsafe { d.cu_event_query(event.ptr()) }
    })?;
    p.observe(format!("an event on the legacy stream completes: {done}"));
    p.call("cuEventDestroy_v2", || {
        let _c = gpu.bind()?;
        // SAFETY: ours; the driver releases it once the recorded work completes.
        unsafe { d.cu_event_destroy(event.ptr()) }
    })?;

    // Synchronous copies on the legacy stream, and context-wide calls.
    let mut host_bytes = vec![0u8; 64 << 10];
    p.call("cuMemcpyHtoD_v2 (64 KiB pageable)", || {
        let _c = gpu.bind()?;
        // SAFETY: `scratch` is a live device buffer of SIZE bytes; the source is 64 KiB.
        unsafe { d.cu_memcpy_htod(scratch, host_bytes.as_ptr().cast(), host_bytes.len()) }
    })?;
    p.call("cuMemcpyDtoH_v2 (64 KiB pageable)", || {
        let _c = gpu.bind()?;
        // SAFETY: as above, the other way.
        unsafe { d.cu_memcpy_dtoh(host_bytes.as_mut_ptr().cast(), scratch, host_bytes.len()) }
    })?;
    p.call("cuMemGetInfo_v2", || {
        let _c = gpu.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: two valid out-pointers.
        unsafe { d.cu_mem_get_info(&mut free, &mut total) }
    })?;
    p.call("cuCtxSynchronize", || {
        let _c = gpu.bind()?;
        d.cu_ctx_synchronize()
    })?;
    Ok(())
}

fn library_scenarios(p: &mut Probe<'_>, gpu: &Gpu) -> BenchResult<()> {
    let small = p.call("Gpu::alloc 64 KiB (carved)", || gpu.alloc(64 << 10))?;
    p.call("RawMemory drop 64 KiB (carved)", || {
        drop(small);
        Ok(())
    })?;
    let stream = p.spinner.stream.raw() as usize;
    let after = p.call("Gpu::alloc", || gpu.alloc(SIZE))?;
    p.call("RawMemory::release_after (the kernel's stream)", || {
        // SAFETY: the spinner's live stream, of this GPU.
        unsafe { after.release_after_stream(stream as vkgdr::cuda::CuStream) }
    })?;
    let mem = p.call("Gpu::alloc", || gpu.alloc(SIZE))?;
    let mut buf = vec![0u8; 1 << 20];
    p.call("RawMemory::read 1 MiB (copy engine)", || {
        mem.read(0, &mut buf)
    })?;
    p.call("RawMemory drop", || {
        drop(mem);
        Ok(())
    })?;

    let pool = p.call("Pool::new", || {
        Pool::new(gpu.clone(), PoolConfig::default())
    })?;
    let small = p.call("Pool::alloc 256 B (first chunk)", || pool.alloc(256, 64))?;
    let big = p.call("Pool::alloc 16 MiB (own chunk)", || {
        pool.alloc(16 << 20, 256)
    })?;
    p.call("Block drop (own chunk)", || {
        drop(big);
        Ok(())
    })?;
    p.call("Block drop (256 B)", || {
        drop(small);
        Ok(())
    })?;
    p.call("Pool::trim", || {
        pool.trim();
        Ok(())
    })?;
    p.call("Pool drop", || {
        drop(pool);
        Ok(())
    })?;

    let mut arena = p.call("Arena::new (64 MiB reserved)", || {
        Arena::new(gpu, 64 << 20, SIZE)
    })?;
    p.call("Arena::grow", || arena.grow())?;
    p.call("Arena::shrink", || arena.shrink(1))?;
    p.call("Arena drop", || {
        drop(arena);
        Ok(())
    })?;

    let ring = p.call("DeviceRing::new 1 MiB", || DeviceRing::new(gpu, 1 << 20))?;
    p.call("DeviceRing drop", || {
        drop(ring);
        Ok(())
    })?;
    let pinned = p.call("PinnedBuffer::new 2 MiB", || {
        PinnedBuffer::new(gpu, SIZE as usize)
    })?;
    p.call("PinnedBuffer drop", || {
        drop(pinned);
        Ok(())
    })?;
    let module = p.call("Module::load_ptx", || Module::load_ptx(gpu, PTX))?;
    p.call("Module drop", || {
        drop(module);
        Ok(())
    })?;
    let stream = p.call("Stream::new", || Stream::new(gpu))?;
    p.call("Stream drop", || {
        drop(stream);
        Ok(())
    })?;
    let other = p.call("Gpu::open (another handle)", || Gpu::open(0))?;
    p.call("Gpu drop (another handle)", || {
        drop(other);
        Ok(())
    })?;
    let scratch = vec![7u8; 64 << 10];
    let target = gpu.alloc(SIZE)?;
    p.call("Gpu::memcpy_htod 64 KiB", || {
        // SAFETY: the target is a live allocation of SIZE bytes.
        unsafe { gpu.memcpy_htod(target.device_ptr(), &scratch) }
    })?;
    Ok(())
}

/// Maps `mem` (a whole Vulkan allocation, a multiple of the granularity) into the device's
/// address space through VMM, with no context current on the calling thread when `bind` is false.
fn vmm_map(gpu: &Gpu, mem: &vkgdr::vulkan::VulkanMemory, bind: bool) -> vkgdr::Result<(u64, u64)> {
    let d = gpu.driver();
    let _c = if bind { Some(gpu.bind()?) } else { None };
    let fd = mem.export_fd()?;
    // SAFETY: a live opaque fd passed as the handle value; the call does not keep it.
    let handle = unsafe {
        d.cu_mem_import_from_shareable_handle(
            fd.as_raw_fd() as isize as *mut c_void,
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    }?;
    let size = mem.size() as usize;
    let va = d.cu_mem_address_reserve(size, SIZE as usize, 0, 0)?;
    // SAFETY: a fresh reservation of exactly the handle's size.
    unsafe { d.cu_mem_map(va, size, 0, handle, 0) }?;
    let access = MemAccessDesc {
        location: MemLocation::device(ordinal_of(gpu)?),
        flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: just mapped; one descriptor alive for the call.
    unsafe { d.cu_mem_set_access(va, size, &access, 1) }?;
    Ok((va, handle))
}

fn vmm_unmap(gpu: &Gpu, va: u64, handle: u64, size: u64, bind: bool) -> vkgdr::Result<()> {
    let d = gpu.driver();
    let _c = if bind { Some(gpu.bind()?) } else { None };
    // SAFETY: mapped by `vmm_map` with this size and handle, no longer used.
    unsafe {
        d.cu_mem_unmap(va, size as usize)?;
        d.cu_mem_release(handle)?;
        d.cu_mem_address_free(va, size as usize)
    }
}

/// Facts the mapping layer's design rests on, measured once with no kernel running.
fn primitives(gpu: &Gpu) -> BenchResult<Vec<String>> {
    let mut notes = Vec::new();
    // VMM calls from a thread with no current context (what releasing memory of a context that
    // may be gone by then needs).
    let no_context = std::thread::scope(|s| {
        s.spawn(|| -> vkgdr::Result<()> {
            let mem = gpu.vulkan().allocate(SIZE)?;
            let (va, handle) = vmm_map(gpu, &mem, false)?;
            vmm_unmap(gpu, va, handle, SIZE, false)
        })
        .join()
        .expect("no panic")
    });
    notes.push(format!(
        "VMM import, map, access, unmap, release with no current context: {}",
        match &no_context {
            Ok(()) => "work".to_string(),
            Err(e) => format!("fail ({e})"),
        }
    ));
    // Copy-engine bandwidth into and out of host memory mapped through VMM, beside pinned memory
    // from cuMemHostAlloc.
    let len: u64 = 64 << 20;
    let bar = gpu.alloc(len)?;
    let host = gpu.vulkan().allocate_host(len)?;
    let (va, handle) = vmm_map(gpu, &host, true)?;
    let stream = Stream::new(gpu)?;
    let d = gpu.driver();
    let pinned = {
        let _c = gpu.bind()?;
        Handle::of(d.cu_mem_alloc_host(len as usize, 0)?)
    };
    let time = |f: &dyn Fn() -> vkgdr::Result<()>| -> vkgdr::Result<f64> {
        f()?;
        stream.synchronize()?;
        let t = Instant::now();
        for _ in 0..5 {
            f()?;
        }
        stream.synchronize()?;
        Ok(5.0 * len as f64 / t.elapsed().as_nanos() as f64)
    };
    let s = stream.raw();
    let (bar_ptr, n) = (bar.device_ptr(), len as usize);
    let _c = gpu.bind()?;
    // Each copy: both ranges are live allocations of `len` bytes, alive until `time` has
    // synchronised the stream; the stream is ours and its context current.
    // SAFETY: as said.
    let dtod_host = time(&|| unsafe { d.cu_memcpy_dtod_async(va, bar_ptr, n, s) })?;
    // SAFETY: as above.
    let dtoh_pinned = time(&|| unsafe { d.cu_memcpy_dtoh_async(pinned.ptr(), bar_ptr, n, s) })?;
    // SAFETY: as above.
    let htod_host = time(&|| unsafe { d.cu_memcpy_dtod_async(bar_ptr, va, n, s) })?;
    // SAFETY: as above.
    let htod_pinned = time(&|| unsafe { d.cu_memcpy_htod_async(bar_ptr, pinned.ptr(), n, s) })?;
    notes.push(format!(
        "64 MiB device -> host: into VMM-mapped host memory {dtod_host:.1} GB/s, into cuMemHostAlloc memory {dtoh_pinned:.1} GB/s"
    ));
    notes.push(format!(
        "64 MiB host -> device: from VMM-mapped host memory {htod_host:.1} GB/s, from cuMemHostAlloc memory {htod_pinned:.1} GB/s"
    ));
    // SAFETY: ours, no copy in flight.
    unsafe { d.cu_mem_free_host(pinned.ptr()) }?;
    drop(_c);
    vmm_unmap(gpu, va, handle, len, true)?;
    Ok(notes)
}

/// Runs the benchmark: one report per condition, calls in the order they were made, with the
/// calls that waited for the kernel named in the notes.
pub fn run(opts: &Options) -> BenchResult<Vec<Report>> {
    let gpu = open_gpu(OpenOptions::new())?;
    let (reps, patience) = if opts.quick {
        (2, Duration::from_millis(800))
    } else {
        (5, Duration::from_millis(2000))
    };
    let mut spinner = Spinner::new(&gpu)?;
    // A device buffer for the synchronous copies, made and freed while no kernel runs.
    let _c = gpu.bind()?;
    let scratch = gpu.driver().cu_mem_alloc(SIZE as usize)?;
    drop(_c);
    let mut reports = Vec::new();
    let mut failures = Vec::new();
    let mut ticket = 0u32;
    for condition in [
        Condition::Idle,
        Condition::OwnStream,
        Condition::LegacyStream,
    ] {
        ui::phase(condition.report_name(), 0);
        let mut probe = Probe {
            spinner: &mut spinner,
            condition,
            patience,
            samples: Vec::new(),
            scenario_waited: false,
            observations: Vec::new(),
            ticket,
        };
        for scenario in [0, 1] {
            probe.scenario_waited = false;
            for _ in 0..reps {
                match scenario {
                    0 => driver_scenarios(&mut probe, &gpu, scratch)?,
                    _ => library_scenarios(&mut probe, &gpu)?,
                }
                if condition != Condition::Idle && probe.spinner.running && !probe.spinner.alive() {
                    failures.push(format!(
                        "{}: the kernel's heartbeat stopped during the calls",
                        condition.report_name()
                    ));
                }
                if probe.scenario_waited {
                    break;
                }
            }
        }
        probe.observe(format!(
            "releases waiting when the calls were done: {}",
            gpu.pending_releases()
        ));
        probe.spinner.stop()?;
        ticket = probe.ticket;
        let probe_samples = std::mem::take(&mut probe.samples);
        let mut report = Report::new(condition.report_name(), Unit::Nanoseconds);
        let mut waited = Vec::new();
        for s in &probe_samples {
            let stats = Stats::of(&s.ns).expect("at least one sample");
            report.rows.push(Row::measured(&s.call, SIZE, &stats));
            if s.waited {
                waited.push(s.call.clone());
            }
        }
        report.notes.push(if waited.is_empty() {
            "no call waited for the kernel".to_string()
        } else {
            format!(
                "waited for the kernel (returned only once it was stopped, after {} ms): {}",
                patience.as_millis(),
                waited.join(", ")
            )
        });
        report.notes.append(&mut probe.observations);
        reports.push(report);
    }
    let _c = gpu.bind()?;
    // SAFETY: allocated above; no kernel runs any more.
    unsafe { gpu.driver().cu_mem_free(scratch) }?;
    drop(_c);
    ui::phase("copy-engine figures", 0);
    let mut facts = primitives(&gpu)?;
    reports[0].notes.append(&mut facts);
    if !failures.is_empty() {
        return Err(BenchError::Check(failures.join("; ")));
    }
    Ok(reports)
}

//! Small RAII wrappers over CUDA objects that tests, examples, benchmarks and the ring need:
//! modules loaded from PTX, kernel launches, streams, events, pinned host buffers, plain device
//! buffers. Each holds its [`Gpu`] so it cannot outlive the context.

use std::ffi::{c_void, CString};
use std::ptr::{self, NonNull};

use crate::core::handle::{assert_send_sync, SendSyncPtr};
use crate::core::range::check_range;
use crate::driver::cuda::{
    out_of_memory, CuDevicePtr, CuStream, CU_EVENT_DISABLE_TIMING, CU_MEMHOSTALLOC_DEVICEMAP,
    CU_STREAM_NON_BLOCKING,
};
use crate::error::{Error, InvalidArgument, Result};
use crate::mapping::gpu::Gpu;
use crate::mapping::release::{Fence, ReleaseKey};
use crate::mapping::vmm::{MappedMemory, VmmMapping};

/// A CUDA module loaded from PTX text with `cuModuleLoadData`.
pub struct Module {
    gpu: Gpu,
    /// The `CUmodule`: a context-wide handle usable from any thread with the context pushed;
    /// immutable after loading.
    raw: SendSyncPtr<c_void>,
}
// `Send + Sync` by its fields, as the compiler checks here.
const _: () = assert_send_sync::<Module>();

impl Module {
    /// JIT-compiles `ptx` for the device.
    pub fn load_ptx(gpu: &Gpu, ptx: &str) -> Result<Module> {
        let text = CString::new(ptx).map_err(|_| InvalidArgument::NulByte { what: "PTX text" })?;
        let _ctx = gpu.bind()?;
        // SAFETY: a NUL-terminated PTX image that outlives the call; context current.
        let raw = unsafe { gpu.driver().cu_module_load_data(text.as_ptr().cast()) }?;
        Ok(Module {
            gpu: gpu.clone(),
            raw: SendSyncPtr::new(raw),
        })
    }

    /// Looks up an `extern "C"` kernel.
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        let cname = CString::new(name).map_err(|_| InvalidArgument::NulByte {
            what: "kernel name",
        })?;
        // SAFETY: live module; NUL-terminated name that outlives the call.
        let raw = unsafe {
            self.gpu
                .driver()
                .cu_module_get_function(self.raw.get(), cname.as_ptr())
        }?;
        Ok(Function {
            module: self,
            raw: SendSyncPtr::new(raw),
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ctx = self.gpu.bind();
        // SAFETY: the module is ours; functions borrow it, so none is alive.
        let _ = unsafe { self.gpu.driver().cu_module_unload(self.raw.get()) };
    }
}

/// A kernel in a [`Module`].
pub struct Function<'m> {
    module: &'m Module,
    /// The `CUfunction`: an immutable, context-wide handle; launching from several threads is
    /// allowed by the driver (each launch pushes the context itself).
    raw: SendSyncPtr<c_void>,
}
// `Send + Sync` by its fields, as the compiler checks here.
const _: () = assert_send_sync::<Function<'static>>();

/// Grid and block dimensions of a launch.
#[derive(Debug, Clone, Copy)]
pub struct LaunchConfig {
    /// Blocks (x, y, z).
    pub grid: (u32, u32, u32),
    /// Threads per block (x, y, z).
    pub block: (u32, u32, u32),
    /// Dynamic shared memory bytes.
    pub shared_bytes: u32,
}

impl LaunchConfig {
    /// A 1-D launch.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        LaunchConfig {
            grid: (blocks, 1, 1),
            block: (threads, 1, 1),
            shared_bytes: 0,
        }
    }
}

impl Function<'_> {
    /// Launches the kernel on `stream` (`None`: the legacy default stream). A stream of another
    /// context is refused with [`Error::InvalidArgument`].
    ///
    /// # Safety
    /// - `params` must hold one pointer per kernel parameter, in order, each pointing to a value of
    ///   exactly the parameter's type and size, alive for the duration of this call.
    /// - Every device pointer passed must be valid for the accesses the kernel makes, for as long
    ///   as the kernel runs (keep the memory alive until the stream is synchronised).
    pub unsafe fn launch(
        &self,
        config: LaunchConfig,
        stream: Option<&Stream>,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let gpu = &self.module.gpu;
        if let Some(stream) = stream {
            same_context(gpu, stream, "a kernel")?;
        }
        let _ctx = gpu.bind()?;
        let s = stream.map_or(ptr::null_mut(), Stream::raw);
        // SAFETY: live function and stream; the caller guarantees the parameter array.
        unsafe {
            gpu.driver().cu_launch_kernel(
                self.raw.get(),
                config.grid.0,
                config.grid.1,
                config.grid.2,
                config.block.0,
                config.block.1,
                config.block.2,
                config.shared_bytes,
                s,
                params.as_mut_ptr(),
                ptr::null_mut(),
            )
        }
    }
}

/// Refuses a stream of another context than `gpu`'s for `what` (the driver's behaviour for such
/// handles is not specified).
fn same_context(gpu: &Gpu, stream: &Stream, what: &'static str) -> Result<()> {
    if gpu.cu_context()? == stream.gpu.cu_context()? {
        Ok(())
    } else {
        Err(InvalidArgument::ForeignStream { what }.into())
    }
}

/// A CUDA stream (non-blocking with respect to the legacy default stream).
pub struct Stream {
    gpu: Gpu,
    /// The `CUstream`: usable from any thread; stream operations are internally synchronised by
    /// the driver.
    raw: SendSyncPtr<c_void>,
}
// `Send + Sync` by its fields, as the compiler checks here.
const _: () = assert_send_sync::<Stream>();

impl Stream {
    /// Creates a non-blocking stream.
    pub fn new(gpu: &Gpu) -> Result<Stream> {
        let _ctx = gpu.bind()?;
        let raw = crate::driver::failpoint::inject("cuStreamCreate", || {
            crate::driver::cuda::injected_failure(gpu.driver(), "cuStreamCreate")
        })
        .and_then(|()| gpu.driver().cu_stream_create(CU_STREAM_NON_BLOCKING))?;
        Ok(Stream {
            gpu: gpu.clone(),
            raw: SendSyncPtr::new(raw),
        })
    }

    /// The raw `CUstream`.
    pub fn raw(&self) -> CuStream {
        self.raw.get()
    }

    /// Waits for all work on the stream.
    pub fn synchronize(&self) -> Result<()> {
        let _ctx = self.gpu.bind()?;
        // SAFETY: live stream.
        unsafe { self.gpu.driver().cu_stream_synchronize(self.raw()) }
    }

    /// Makes the work queued on the stream after now wait until `event`'s last record point
    /// has passed (on the GPU: the caller does not wait). The event may be recorded again or
    /// dropped at once.
    pub(crate) fn wait_for(&self, event: &Event) -> Result<()> {
        same_context(&event.gpu, self, "an event wait")?;
        let _ctx = self.gpu.bind()?;
        // SAFETY: live stream and event of the same context (checked above).
        unsafe {
            self.gpu
                .driver()
                .cu_stream_wait_event(self.raw(), event.raw.get(), 0)
        }
    }

    /// A release fence for the work queued on the stream so far.
    pub(crate) fn fence(&self) -> Result<Box<dyn Fence>> {
        // SAFETY: our live stream; an event fence keeps our `Gpu`, and with it the context.
        unsafe {
            self.gpu
                .stream_fence(self.raw(), Some(Box::new(self.gpu.clone())))
        }
    }

    /// The GPU the stream belongs to.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ctx = self.gpu.bind();
        // SAFETY: the stream is ours; the driver lets pending work finish before destroying it.
        let _ = unsafe { self.gpu.driver().cu_stream_destroy(self.raw()) };
    }
}

/// A CUDA event without timing (cheap), used to learn when the GPU is past a point in a stream.
pub struct Event {
    gpu: Gpu,
    /// The `CUevent`: usable from any thread; query, synchronize and record are thread-safe
    /// driver calls (record needs `&self` only in the driver's model too).
    raw: SendSyncPtr<c_void>,
}
// `Send + Sync` by its fields, as the compiler checks here.
const _: () = assert_send_sync::<Event>();

impl Event {
    /// Creates an event (`CU_EVENT_DISABLE_TIMING`).
    pub fn new(gpu: &Gpu) -> Result<Event> {
        let _ctx = gpu.bind()?;
        let raw = gpu.driver().cu_event_create(CU_EVENT_DISABLE_TIMING)?;
        Ok(Event {
            gpu: gpu.clone(),
            raw: SendSyncPtr::new(raw),
        })
    }

    /// Records the event on `stream`, which must belong to the event's context
    /// ([`Error::InvalidArgument`] otherwise).
    pub fn record(&self, stream: &Stream) -> Result<()> {
        same_context(&self.gpu, stream, "an event")?;
        let _ctx = self.gpu.bind()?;
        // SAFETY: live event and stream of the same context (checked above).
        unsafe {
            self.gpu
                .driver()
                .cu_event_record(self.raw.get(), stream.raw())
        }
    }

    /// [`record`](Self::record) on a raw `CUstream` (from CUDA C, cudarc, CuPy, PyTorch).
    ///
    /// # Safety
    /// - `stream` must be a live stream of the event's context, or null (the legacy stream).
    pub unsafe fn record_raw(&self, stream: CuStream) -> Result<()> {
        let _ctx = self.gpu.bind()?;
        // SAFETY: live event; the stream is the caller's contract.
        unsafe { self.gpu.driver().cu_event_record(self.raw.get(), stream) }
    }

    /// Whether all work before the record point has completed.
    pub fn is_complete(&self) -> Result<bool> {
        let _ctx = self.gpu.bind()?;
        // SAFETY: live event.
        unsafe { self.gpu.driver().cu_event_query(self.raw.get()) }
    }

    /// Blocks until the event completes.
    pub fn synchronize(&self) -> Result<()> {
        let _ctx = self.gpu.bind()?;
        // SAFETY: live event.
        unsafe { self.gpu.driver().cu_event_synchronize(self.raw.get()) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ctx = self.gpu.bind();
        // SAFETY: the event is ours.
        let _ = unsafe { self.gpu.driver().cu_event_destroy(self.raw.get()) };
    }
}

/// Page-locked host memory mapped into the device's address space: the GPU can write progress
/// words here that the CPU reads cheaply (from its caches), and kernels and copies reach it at
/// about the speed of `cuMemHostAlloc` memory (figures: BENCHMARKS.md, 'Reads through the copy
/// engine').
///
/// It is allocated through Vulkan (a `HOST_VISIBLE | HOST_COHERENT` system-memory type) and mapped
/// with CUDA VMM, so dropping it never waits for a running kernel (`cuMemFreeHost` does, until
/// the kernel ends): it is freed once the GPU work queued before the drop has completed, like
/// [`RawMemory`](crate::RawMemory). The device address is a VMM address, so copies to and from it
/// are device-to-device copies of [`device_ptr`](Self::device_ptr); the host pointer is unknown
/// to CUDA's own copy functions. Where the device lacks VMM or such a memory type, it comes from
/// `cuMemHostAlloc` (then dropping it waits for running kernels).
///
/// Use it for bytes the GPU writes and the CPU reads (completion words, copies out of the GPU).
/// As a *source* the CPU rewrites it is unreliable: on an H100 (driver 580) a copy from it after
/// the CPU had rewritten it returned the bytes of the first copy again (the GPU keeps what it
/// read from such a mapping). The rings' copy-engine path stages in `cuMemHostAlloc` memory for
/// that reason.
pub struct PinnedBuffer {
    gpu: Gpu,
    /// The memory; `None` only while dropping.
    backing: Option<PinnedBacking>,
    /// Host memory inside `backing`, never null, which the GPU may write at any time: safe access
    /// is volatile or atomic; slices come only from the `unsafe` views.
    ptr: SendSyncPtr<u8>,
    len: usize,
    device_ptr: CuDevicePtr,
}
// `Send + Sync` by its fields, as the compiler checks here.
const _: () = assert_send_sync::<PinnedBuffer>();

/// Where a pinned buffer's bytes come from.
enum PinnedBacking {
    /// Vulkan host memory mapped through VMM (held until the release drops it).
    Mapped { _memory: MappedMemory },
    /// `cuMemHostAlloc` memory of the `Gpu`'s context, freed with `cuMemFreeHost`.
    Driver { gpu: Gpu, ptr: SendSyncPtr<u8> },
}

impl Drop for PinnedBacking {
    fn drop(&mut self) {
        if let PinnedBacking::Driver { gpu, ptr } = self {
            let _ctx = gpu.bind();
            // SAFETY: ours; its owner drops it only when no kernel may use it any more.
            let _ = unsafe { gpu.driver().cu_mem_free_host(ptr.get().cast()) };
        }
    }
}

impl PinnedBuffer {
    /// Allocates `len` bytes of zeroed pinned memory mapped for the device.
    pub fn new(gpu: &Gpu, len: usize) -> Result<PinnedBuffer> {
        if len == 0 {
            return Err(InvalidArgument::EmptyBuffer {
                what: "pinned buffer",
            }
            .into());
        }
        let (backing, ptr, device_ptr) = match gpu.vmm() {
            Some(vmm) if gpu.vulkan().host_memory_type().is_some() => {
                let m =
                    gpu.retry_after_releases(|| MappedMemory::host(vmm, gpu.vulkan(), len as u64))?;
                let (p, d) = (m.host_ptr(), m.device_ptr());
                (PinnedBacking::Mapped { _memory: m }, p, d)
            }
            _ => {
                let _ctx = gpu.bind()?;
                let driver = gpu.driver();
                let p = crate::driver::failpoint::inject("cuMemHostAlloc", || {
                    crate::driver::cuda::injected_failure(driver, "cuMemHostAlloc")
                })
                .and_then(|()| driver.cu_mem_alloc_host(len, CU_MEMHOSTALLOC_DEVICEMAP))
                .map_err(out_of_memory(len as u64))?;
                let p = NonNull::new(p.cast::<u8>())
                    .ok_or_else(|| Error::internal("cuMemHostAlloc returned a null pointer"))?;
                let backing = PinnedBacking::Driver {
                    gpu: gpu.clone(),
                    ptr: p.into(),
                };
                // SAFETY: `p` is a mapped pinned allocation of this context.
                let d = unsafe { driver.cu_mem_host_get_device_pointer(p.as_ptr().cast(), 0) }?;
                (backing, p.as_ptr(), d)
            }
        };
        // SAFETY: a fresh allocation of at least `len` bytes that no GPU work refers to yet.
        unsafe { ptr::write_bytes(ptr, 0, len) };
        Ok(PinnedBuffer {
            gpu: gpu.clone(),
            backing: Some(backing),
            ptr: SendSyncPtr::new(ptr),
            len,
            device_ptr,
        })
    }

    /// The host pointer.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.get()
    }

    /// The device-side address of the same bytes.
    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (zero-length buffers are rejected).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `dst.len()` bytes from `offset` into `dst` with volatile loads (bounds-checked).
    ///
    /// The GPU may write these bytes at any time, so they are never handed out as a `&[u8]` by
    /// safe code (the compiler could then assume they do not change); each byte is loaded once,
    /// as it is at that moment.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(offset as u64, dst.len() as u64, self.len as u64)?;
        let src = self.ptr.get();
        for (i, d) in dst.iter_mut().enumerate() {
            // SAFETY: `offset + i` lies inside the live `len`-byte allocation (checked above).
            *d = unsafe { src.add(offset + i).read_volatile() };
        }
        Ok(())
    }

    /// Loads the 8-byte word at `offset` (a multiple of 8) atomically, with `Acquire` ordering:
    /// how the CPU polls a word a kernel stores to (a progress counter, a flag).
    pub fn load_u64(&self, offset: usize) -> Result<u64> {
        check_range(offset as u64, 8, self.len as u64)?;
        // SAFETY: in bounds (checked above).
        let p = unsafe { self.ptr.get().add(offset) };
        if !(p as usize).is_multiple_of(8) {
            return Err(InvalidArgument::MisalignedWord { offset }.into());
        }
        // SAFETY: an aligned, in-bounds u64 of the live allocation; the host reaches these bytes
        // only through volatile accesses, atomics or the `unsafe` slice views, whose callers rule
        // out concurrent non-atomic access.
        Ok(unsafe { std::sync::atomic::AtomicU64::from_ptr(p.cast()) }
            .load(std::sync::atomic::Ordering::Acquire))
    }

    /// Copies `src` to `offset` with volatile stores (bounds-checked).
    pub fn write(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        check_range(offset as u64, src.len() as u64, self.len as u64)?;
        let dst = self.ptr.get();
        for (i, &b) in src.iter().enumerate() {
            // SAFETY: `offset + i` lies inside the live allocation (checked above); `&mut self`
            // excludes other host writers.
            unsafe { dst.add(offset + i).write_volatile(b) };
        }
        Ok(())
    }

    /// Sets every byte to `byte` with volatile stores.
    pub fn fill(&mut self, byte: u8) {
        let dst = self.ptr.get();
        for i in 0..self.len {
            // SAFETY: `i < len`, inside the live allocation; `&mut self` excludes other host
            // writers.
            unsafe { dst.add(i).write_volatile(byte) };
        }
    }

    /// The bytes as a slice, for fast bulk access.
    ///
    /// # Safety
    /// - No GPU work (kernel, copy) may write the buffer while the slice lives: finish it first
    ///   (synchronise its stream or context), and launch none that writes it until the slice is
    ///   gone. Otherwise the bytes change under a shared reference, which is undefined behaviour.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: owned allocation of `len` bytes, initialised at creation; the caller rules out
        // device writes while the borrow lives.
        unsafe { std::slice::from_raw_parts(self.ptr.get(), self.len) }
    }

    /// The bytes as a mutable slice, for fast bulk access.
    ///
    /// # Safety
    /// - No GPU work may read or write the buffer while the slice lives (as for
    ///   [`as_slice`](Self::as_slice)).
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, with an exclusive borrow of `self` for the host side.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.get(), self.len) }
    }
}

impl Drop for PinnedBuffer {
    /// Never waits: the memory is freed once the GPU work queued before now has completed.
    fn drop(&mut self) {
        match self.backing.take() {
            // `cuMemFreeHost` waits for running kernels anyway: free it here.
            Some(b @ PinnedBacking::Driver { .. }) => drop(b),
            Some(b) => self.gpu.release_after_queued_work(b, None, ReleaseKey::ANY),
            None => {}
        }
    }
}

/// Plain device memory (results of kernels, comparisons): a `cuMemCreate` allocation mapped with
/// VMM, so dropping it never waits for a running kernel (`cuMemFree` does); it is freed once the
/// GPU work queued before the drop has completed. Where the device lacks VMM, `cuMemAlloc`.
pub struct DeviceBuffer {
    gpu: Gpu,
    /// The memory; `None` only while dropping.
    backing: Option<DeviceBacking>,
    ptr: CuDevicePtr,
    len: usize,
}
// `Send + Sync` by its fields, as the compiler checks here.
const _: () = assert_send_sync::<DeviceBuffer>();

/// Where a device buffer's bytes come from.
enum DeviceBacking {
    /// `cuMemCreate`, mapped through VMM.
    Mapped(VmmMapping),
    /// `cuMemAlloc` memory of the `Gpu`'s context.
    Driver { gpu: Gpu, ptr: CuDevicePtr },
}

impl Drop for DeviceBacking {
    fn drop(&mut self) {
        if let DeviceBacking::Driver { gpu, ptr } = self {
            let _ctx = gpu.bind();
            // SAFETY: ours; its owner drops it only when no kernel may use it any more.
            let _ = unsafe { gpu.driver().cu_mem_free(*ptr) };
        }
    }
}

impl DeviceBuffer {
    /// Allocates `len` bytes of device memory (contents undefined).
    pub fn new(gpu: &Gpu, len: usize) -> Result<DeviceBuffer> {
        if len == 0 {
            return Err(InvalidArgument::EmptyBuffer {
                what: "device buffer",
            }
            .into());
        }
        let backing = match gpu.vmm() {
            Some(vmm) => {
                let size = vmm.round_up(len as u64)?;
                DeviceBacking::Mapped(
                    gpu.retry_after_releases(|| vmm.map(vmm.create(size)?, size))?,
                )
            }
            None => {
                let _ctx = gpu.bind()?;
                let ptr = gpu
                    .driver()
                    .cu_mem_alloc(len)
                    .map_err(out_of_memory(len as u64))?;
                DeviceBacking::Driver {
                    gpu: gpu.clone(),
                    ptr,
                }
            }
        };
        let ptr = match &backing {
            DeviceBacking::Mapped(m) => m.device_ptr(),
            DeviceBacking::Driver { ptr, .. } => *ptr,
        };
        Ok(DeviceBuffer {
            gpu: gpu.clone(),
            backing: Some(backing),
            ptr,
            len,
        })
    }

    /// The device pointer.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for DeviceBuffer {
    /// Never waits: the memory is freed once the GPU work queued before now has completed.
    fn drop(&mut self) {
        match self.backing.take() {
            // `cuMemFree` waits for running kernels anyway: free it here.
            Some(b @ DeviceBacking::Driver { .. }) => drop(b),
            Some(b) => self.gpu.release_after_queued_work(b, None, ReleaseKey::ANY),
            None => {}
        }
    }
}

/// An event fences releases: it has passed once the work recorded before it completed (a
/// dead context, whose kernels are gone, counts as passed).
impl Fence for Event {
    fn passed(&self) -> bool {
        self.is_complete().unwrap_or(true)
    }
}

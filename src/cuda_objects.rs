//! Small RAII wrappers over CUDA objects that tests, examples, benchmarks and the ring need:
//! modules loaded from PTX, kernel launches, streams, events, pinned host buffers, plain device
//! buffers. Each holds its [`Gpu`] so it cannot outlive the context.

use std::ffi::{c_void, CString};
use std::ptr::{self, NonNull};

use crate::cuda::{
    CuDevicePtr, CuEvent, CuFunction, CuModule, CuStream, CUDA_ERROR_NOT_READY,
    CU_MEMHOSTALLOC_DEVICEMAP,
};
use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// A CUDA module loaded from PTX text with `cuModuleLoadData`.
pub struct Module {
    gpu: Gpu,
    raw: CuModule,
}

// SAFETY: a CUmodule is a context-wide handle usable from any thread with the context pushed.
unsafe impl Send for Module {}
// SAFETY: as above; the module is immutable after loading.
unsafe impl Sync for Module {}

impl Module {
    /// JIT-compiles `ptx` for the device.
    pub fn load_ptx(gpu: &Gpu, ptx: &str) -> Result<Module> {
        let text = CString::new(ptx).map_err(|_| Error::invalid("PTX text contains a NUL byte"))?;
        let _ctx = gpu.bind()?;
        let mut raw: CuModule = ptr::null_mut();
        // SAFETY: NUL-terminated PTX image; valid out-pointer; context current.
        gpu.driver().check("cuModuleLoadData", unsafe {
            (gpu.driver().cu_module_load_data)(&mut raw, text.as_ptr().cast())
        })?;
        Ok(Module {
            gpu: gpu.clone(),
            raw,
        })
    }

    /// Looks up an `extern "C"` kernel.
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        let cname =
            CString::new(name).map_err(|_| Error::invalid("kernel name contains a NUL byte"))?;
        let mut raw: CuFunction = ptr::null_mut();
        // SAFETY: live module; NUL-terminated name; valid out-pointer.
        self.gpu.driver().check("cuModuleGetFunction", unsafe {
            (self.gpu.driver().cu_module_get_function)(&mut raw, self.raw, cname.as_ptr())
        })?;
        Ok(Function { module: self, raw })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ctx = self.gpu.bind();
        // SAFETY: the module is ours; functions borrow it, so none is alive.
        unsafe { (self.gpu.driver().cu_module_unload)(self.raw) };
    }
}

/// A kernel in a [`Module`].
pub struct Function<'m> {
    module: &'m Module,
    raw: CuFunction,
}

// SAFETY: a CUfunction is an immutable, context-wide handle; launching from several threads is
// allowed by the driver (each launch pushes the context itself).
unsafe impl Send for Function<'_> {}
// SAFETY: as above.
unsafe impl Sync for Function<'_> {}

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
    /// Launches the kernel on `stream` (`None`: the legacy default stream).
    ///
    /// # Safety
    /// - `params` must hold one pointer per kernel parameter, in order, each pointing to a value of
    ///   exactly the parameter's type and size, alive for the duration of this call.
    /// - Every device pointer passed must be valid for the accesses the kernel makes, for as long as
    ///   the kernel runs (keep the memory alive until the stream is synchronised).
    pub unsafe fn launch(
        &self,
        config: LaunchConfig,
        stream: Option<&Stream>,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let gpu = &self.module.gpu;
        let _ctx = gpu.bind()?;
        let s = stream.map_or(ptr::null_mut(), |s| s.raw);
        // SAFETY: live function and stream; the caller guarantees the parameter array.
        let r = unsafe {
            (gpu.driver().cu_launch_kernel)(
                self.raw,
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
        };
        gpu.driver().check("cuLaunchKernel", r)
    }
}

/// A CUDA stream (non-blocking with respect to the legacy default stream).
pub struct Stream {
    gpu: Gpu,
    raw: CuStream,
}

// SAFETY: CUstream handles are usable from any thread.
unsafe impl Send for Stream {}
// SAFETY: stream operations are internally synchronised by the driver.
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a non-blocking stream.
    pub fn new(gpu: &Gpu) -> Result<Stream> {
        let _ctx = gpu.bind()?;
        let mut raw: CuStream = ptr::null_mut();
        // SAFETY: valid out-pointer; context current.
        gpu.driver().check("cuStreamCreate", unsafe {
            (gpu.driver().cu_stream_create)(&mut raw, crate::cuda::CU_STREAM_NON_BLOCKING)
        })?;
        Ok(Stream {
            gpu: gpu.clone(),
            raw,
        })
    }

    /// The raw `CUstream`.
    pub fn raw(&self) -> CuStream {
        self.raw
    }

    /// Waits for all work on the stream.
    pub fn synchronize(&self) -> Result<()> {
        let _ctx = self.gpu.bind()?;
        // SAFETY: live stream.
        self.gpu.driver().check("cuStreamSynchronize", unsafe {
            (self.gpu.driver().cu_stream_synchronize)(self.raw)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ctx = self.gpu.bind();
        // SAFETY: the stream is ours; the driver lets pending work finish before destroying it.
        unsafe { (self.gpu.driver().cu_stream_destroy)(self.raw) };
    }
}

/// A CUDA event without timing (cheap), used to learn when the GPU is past a point in a stream.
pub struct Event {
    gpu: Gpu,
    raw: CuEvent,
}

// SAFETY: CUevent handles are usable from any thread.
unsafe impl Send for Event {}
// SAFETY: query/synchronize are thread-safe driver calls; record needs &self only in the driver's
// model too.
unsafe impl Sync for Event {}

impl Event {
    /// Creates an event (`CU_EVENT_DISABLE_TIMING`).
    pub fn new(gpu: &Gpu) -> Result<Event> {
        let _ctx = gpu.bind()?;
        let mut raw: CuEvent = ptr::null_mut();
        // SAFETY: valid out-pointer; context current.
        gpu.driver().check("cuEventCreate", unsafe {
            (gpu.driver().cu_event_create)(&mut raw, crate::cuda::CU_EVENT_DISABLE_TIMING)
        })?;
        Ok(Event {
            gpu: gpu.clone(),
            raw,
        })
    }

    /// Records the event on `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        let _ctx = self.gpu.bind()?;
        // SAFETY: live event and stream of the same context.
        self.gpu.driver().check("cuEventRecord", unsafe {
            (self.gpu.driver().cu_event_record)(self.raw, stream.raw)
        })
    }

    /// Whether all work before the record point has completed.
    pub fn is_complete(&self) -> Result<bool> {
        let _ctx = self.gpu.bind()?;
        // SAFETY: live event.
        let r = unsafe { (self.gpu.driver().cu_event_query)(self.raw) };
        if r == CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        self.gpu.driver().check("cuEventQuery", r).map(|_| true)
    }

    /// Blocks until the event completes.
    pub fn synchronize(&self) -> Result<()> {
        let _ctx = self.gpu.bind()?;
        // SAFETY: live event.
        self.gpu.driver().check("cuEventSynchronize", unsafe {
            (self.gpu.driver().cu_event_synchronize)(self.raw)
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ctx = self.gpu.bind();
        // SAFETY: the event is ours.
        unsafe { (self.gpu.driver().cu_event_destroy)(self.raw) };
    }
}

/// Page-locked host memory, mapped into the device's address space (`cuMemHostAlloc` with
/// `DEVICEMAP`): the GPU can write progress words here that the CPU reads cheaply, and it is the
/// fast source/target of `cuMemcpy`.
pub struct PinnedBuffer {
    gpu: Gpu,
    ptr: NonNull<u8>,
    len: usize,
    device_ptr: CuDevicePtr,
}

// SAFETY: plain host memory owned by this value.
unsafe impl Send for PinnedBuffer {}
// SAFETY: shared access only hands out `&[u8]` or raw pointers.
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// Allocates `len` bytes of zeroed pinned, device-mapped memory.
    pub fn new(gpu: &Gpu, len: usize) -> Result<PinnedBuffer> {
        if len == 0 {
            return Err(Error::invalid("pinned buffer of zero bytes"));
        }
        let _ctx = gpu.bind()?;
        let mut p: *mut c_void = ptr::null_mut();
        // SAFETY: valid out-pointer; context current.
        let r = unsafe { (gpu.driver().cu_mem_alloc_host)(&mut p, len, CU_MEMHOSTALLOC_DEVICEMAP) };
        gpu.driver().check_alloc("cuMemHostAlloc", r, len as u64)?;
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| Error::internal("cuMemHostAlloc returned a null pointer"))?;
        let mut device_ptr = 0;
        // SAFETY: `p` is a mapped pinned allocation of this context.
        let r = unsafe { (gpu.driver().cu_mem_host_get_device_pointer)(&mut device_ptr, p, 0) };
        if let Err(e) = gpu.driver().check("cuMemHostGetDevicePointer_v2", r) {
            // SAFETY: ours, unused.
            unsafe { (gpu.driver().cu_mem_free_host)(p) };
            return Err(e);
        }
        // SAFETY: fresh allocation of `len` bytes.
        unsafe { ptr::write_bytes(ptr.as_ptr(), 0, len) };
        Ok(PinnedBuffer {
            gpu: gpu.clone(),
            ptr,
            len,
            device_ptr,
        })
    }

    /// The host pointer.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
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

    /// The bytes as a slice. The GPU may be writing them; use volatile reads for polled words.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: owned allocation of `len` bytes, initialised at creation.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes as a mutable slice.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, exclusive borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let _ctx = self.gpu.bind();
        // SAFETY: ours; no kernel may use it after the owner drops it (launch's contract).
        unsafe { (self.gpu.driver().cu_mem_free_host)(self.ptr.as_ptr().cast()) };
    }
}

/// Plain device memory from `cuMemAlloc` (for comparisons and results).
pub struct DeviceBuffer {
    gpu: Gpu,
    ptr: CuDevicePtr,
    len: usize,
}

impl DeviceBuffer {
    /// Allocates `len` bytes with `cuMemAlloc`.
    pub fn new(gpu: &Gpu, len: usize) -> Result<DeviceBuffer> {
        if len == 0 {
            return Err(Error::invalid("device buffer of zero bytes"));
        }
        let _ctx = gpu.bind()?;
        let mut ptr = 0;
        // SAFETY: valid out-pointer; context current.
        let r = unsafe { (gpu.driver().cu_mem_alloc)(&mut ptr, len) };
        gpu.driver().check_alloc("cuMemAlloc_v2", r, len as u64)?;
        Ok(DeviceBuffer {
            gpu: gpu.clone(),
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
    fn drop(&mut self) {
        let _ctx = self.gpu.bind();
        // SAFETY: ours.
        unsafe { (self.gpu.driver().cu_mem_free)(self.ptr) };
    }
}

impl Gpu {
    /// `cuMemcpyDtoH`: copies `dst.len()` bytes from device address `src` (synchronous).
    ///
    /// # Safety
    /// - `[src, src + dst.len())` must be valid device memory of this GPU's context.
    pub unsafe fn memcpy_dtoh(&self, dst: &mut [u8], src: u64) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: the caller guarantees the device range; `dst` is a valid host buffer.
        self.driver().check("cuMemcpyDtoH_v2", unsafe {
            (self.driver().cu_memcpy_dtoh)(dst.as_mut_ptr().cast(), src, dst.len())
        })
    }

    /// `cuMemcpyHtoD`, then a context synchronize: when this returns the bytes are in device
    /// memory (from pageable memory `cuMemcpyHtoD` alone may return while the DMA is in flight).
    ///
    /// # Safety
    /// - `[dst, dst + src.len())` must be valid device memory of this GPU's context.
    pub unsafe fn memcpy_htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: as above.
        self.driver().check("cuMemcpyHtoD_v2", unsafe {
            (self.driver().cu_memcpy_htod)(dst, src.as_ptr().cast(), src.len())
        })?;
        // SAFETY: context current.
        self.driver().check("cuCtxSynchronize", unsafe {
            (self.driver().cu_ctx_synchronize)()
        })
    }

    /// `cuMemsetD32`: sets `count` 32-bit words at `dst` to `value` (synchronous w.r.t. the host
    /// for device memory once followed by a synchronize; this call synchronises the context).
    ///
    /// # Safety
    /// - `[dst, dst + 4 * count)` must be valid device memory of this GPU's context, 4-aligned.
    pub unsafe fn memset_d32(&self, dst: u64, value: u32, count: usize) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: the caller guarantees the range.
        self.driver().check("cuMemsetD32_v2", unsafe {
            (self.driver().cu_memset_d32)(dst, value, count)
        })?;
        // SAFETY: context current.
        self.driver().check("cuCtxSynchronize", unsafe {
            (self.driver().cu_ctx_synchronize)()
        })
    }

    /// Waits for all work in the context.
    pub fn synchronize(&self) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: context current.
        self.driver().check("cuCtxSynchronize", unsafe {
            (self.driver().cu_ctx_synchronize)()
        })
    }
}

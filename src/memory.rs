//! [`RawMemory`]: one BAR-mapped allocation — Vulkan export, CUDA import, host mapping.

use std::ffi::c_void;
use std::os::fd::{AsRawFd, IntoRawFd};
use std::sync::Arc;

use crate::chunk::ChunkMemory;
use crate::cuda::{
    out_of_memory, ContextGuard, CuContext, CuDevicePtr, ExternalMemoryBufferDesc,
    ExternalMemoryHandleDesc, CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::handle::SendSyncPtr;
use crate::mapping::Mapping;
use crate::range::check_range;
pub use crate::staging::{STAGED_READ_THRESHOLD, STAGING_BUFFERS, STAGING_BUFFER_BYTES};
use crate::vulkan::VulkanMemory;

/// One raw allocation (what the C library calls `vkgdr_memory_alloc`): GPU memory with a host
/// pointer and a CUDA device pointer to the same bytes.
///
/// It holds its [`Gpu`], so it cannot outlive the device. Dropped in the order that works: CUDA
/// mapping freed, CUDA import destroyed, Vulkan memory unmapped and freed.
///
/// The safe [`Mapping`] methods flush after each write and invalidate before each read when the
/// memory is non-coherent. Users of [`RawMemory::host_ptr`] must call [`RawMemory::flush`] and
/// [`RawMemory::invalidate`] themselves.
///
/// `Send + Sync` by its fields: mutation through safe code needs `&mut self`, and `&self` methods
/// only read immutable handle values or issue thread-safe driver calls.
pub struct RawMemory {
    gpu: Gpu,
    /// The CUDA import (`CUexternalMemory`): a process-wide handle, usable from any thread.
    external: SendSyncPtr<c_void>,
    device_ptr: CuDevicePtr,
    /// The size asked for (what `len` reports); the Vulkan allocation may be larger.
    requested: u64,
    /// The context the memory was imported into when it is not the `Gpu`'s own
    /// ([`Gpu::alloc_in_current_context`]); pushed again, from whatever thread drops the memory,
    /// to free it (a `CUcontext` may be made current on any thread).
    foreign_context: Option<SendSyncPtr<c_void>>,
    /// The label [`Gpu::allocations`] lists it under.
    label: Option<Arc<str>>,
    // Dropped after `Drop::drop` has torn down the CUDA side.
    vulkan: VulkanMemory,
}

impl std::fmt::Debug for RawMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawMemory")
            .field("size", &self.size())
            .field("host_ptr", &self.host_ptr())
            .field("device_ptr", &format_args!("{:#x}", self.device_ptr))
            .field("label", &self.label)
            .finish()
    }
}

impl RawMemory {
    /// Allocates and imports into `gpu`'s own context.
    pub(crate) fn new(gpu: &Gpu, size: u64) -> Result<RawMemory> {
        let _ctx = gpu.bind()?;
        Self::import(gpu, size, None)
    }

    /// Allocates and imports into the calling thread's current context, which must belong to
    /// `gpu`'s device.
    ///
    /// # Safety
    /// - The current context must stay alive until the returned memory is dropped.
    pub(crate) unsafe fn new_in_current_context(gpu: &Gpu, size: u64) -> Result<RawMemory> {
        let (context, device) = crate::gpu::current_context(gpu.driver())?;
        if device != gpu.cu_device() {
            return Err(Error::invalid(format!(
                "the current CUDA context belongs to device {device}, this handle to device {}",
                gpu.cu_device()
            )));
        }
        Self::import(gpu, size, Some(context))
    }

    /// The allocation, export and import, with the import's context already current.
    fn import(gpu: &Gpu, size: u64, foreign_context: Option<CuContext>) -> Result<RawMemory> {
        let vulkan = gpu.vulkan().allocate(size)?;
        let alloc_size = vulkan.size();
        let fd = vulkan.export_fd()?;
        let driver = gpu.driver();

        let desc = ExternalMemoryHandleDesc {
            handle_type: CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
            handle: [fd.as_raw_fd() as u32 as u64, 0],
            size: alloc_size,
            flags: 0,
            reserved: [0; 16],
        };
        // On failure the fd is still ours: `fd` closes it, `vulkan` frees the memory.
        let external = crate::failpoint::inject("cuImportExternalMemory", || {
            injected(driver, "cuImportExternalMemory")
        })
        // SAFETY: `desc` describes a live opaque fd of `alloc_size` bytes and outlives the call;
        // the context is current.
        .and_then(|()| unsafe { driver.cu_import_external_memory(&desc) })
        .map_err(out_of_memory(size))?;
        // A successful import owns the fd: give up our ownership without closing it.
        let _ = fd.into_raw_fd();

        let buf = ExternalMemoryBufferDesc {
            offset: 0,
            size: alloc_size,
            flags: 0,
            reserved: [0; 16],
        };
        let mapped = crate::failpoint::inject("cuExternalMemoryGetMappedBuffer", || {
            injected(driver, "cuExternalMemoryGetMappedBuffer")
        })
        // SAFETY: `external` is the live import; the buffer covers exactly the memory object.
        .and_then(|()| unsafe { driver.cu_external_memory_get_mapped_buffer(external, &buf) });
        let device_ptr = match mapped {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: the import is ours and has no mapped buffer.
                let _ = unsafe { driver.cu_destroy_external_memory(external) };
                return Err(out_of_memory(size)(e));
            }
        };
        gpu.register_allocation(device_ptr, size);
        Ok(RawMemory {
            gpu: gpu.clone(),
            external: SendSyncPtr::new(external),
            device_ptr,
            requested: size,
            foreign_context: foreign_context.map(SendSyncPtr::new),
            label: None,
            vulkan,
        })
    }

    /// Labels the allocation: [`Gpu::allocations`] lists it under `label`, and `Debug` shows it.
    pub fn set_label(&mut self, label: &str) {
        let label: Arc<str> = label.into();
        self.gpu
            .label_allocation(self.device_ptr, Some(label.clone()));
        self.label = Some(label);
    }

    /// The allocation's label, if it has one.
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// Size in bytes, as asked for (a 4097-byte request reports 4097).
    pub fn size(&self) -> u64 {
        self.requested
    }

    /// Size of the underlying Vulkan allocation (the request rounded up to 4 KiB): flushes and
    /// invalidates may cover it up to here.
    pub fn allocation_size(&self) -> u64 {
        self.vulkan.size()
    }

    /// The host pointer to the mapping. Writes through it must be followed by
    /// [`RawMemory::flush`] on non-coherent memory.
    pub fn host_ptr(&self) -> *mut u8 {
        self.vulkan.as_ptr()
    }

    /// The CUDA device pointer (`CUdeviceptr`) to the same bytes.
    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
    }

    /// Whether the memory is treated as coherent (no flush/invalidate needed).
    pub fn is_coherent(&self) -> bool {
        !self.vulkan.context().is_non_coherent()
    }

    /// The alignment flushes and invalidates work in: `nonCoherentAtomSize` on non-coherent
    /// memory, 1 on coherent memory (where they are no-ops).
    pub fn non_coherent_atom_size(&self) -> u64 {
        let vulkan = self.vulkan.context();
        if vulkan.is_non_coherent() {
            vulkan.atom_size()
        } else {
            1
        }
    }

    /// The GPU this memory belongs to.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The Vulkan half (for flushing ranges in batches).
    pub fn vulkan(&self) -> &VulkanMemory {
        &self.vulkan
    }

    /// Flushes CPU writes in `[offset, offset+len)` (rounded to `nonCoherentAtomSize`); a no-op on
    /// coherent memory.
    pub fn flush(&self, offset: u64, len: u64) -> Result<()> {
        self.vulkan.flush(offset, len)
    }

    /// Invalidates `[offset, offset+len)` before CPU reads of device writes; a no-op on coherent
    /// memory.
    pub fn invalidate(&self, offset: u64, len: u64) -> Result<()> {
        self.vulkan.invalidate(offset, len)
    }
}

/// The error an injected failure of a CUDA allocation step gives: the driver's out-of-memory.
pub(crate) fn injected(driver: &crate::cuda::Driver, call: &'static str) -> Error {
    crate::failpoint::cuda_error(driver, call, crate::cuda::CUDA_ERROR_OUT_OF_MEMORY)
}

/// Reads of at least this many bytes go through `cuMemcpyDtoH` instead of CPU loads from the BAR.
///
/// Measured on the H100 (`vkgdr bench copybw`): streaming loads read 0.7–0.9 GB/s on one thread,
/// `cuMemcpyDtoH` into pageable memory 0.46 GB/s at 4 KiB but 1.6 GB/s at 16 KiB and 7–10 GB/s
/// from 1 MiB (into pinned memory 55 GB/s: [`RawMemory::read_dma`] with a pinned destination).
pub const DMA_READ_THRESHOLD: usize = 16 << 10;

impl RawMemory {
    /// Reads with the GPU's copy engine (`cuMemcpyDtoH`) instead of CPU loads: the fast path for
    /// large reads (55 GB/s into pinned memory such as a
    /// [`PinnedBuffer`](crate::cuda_objects::PinnedBuffer), 7–10 GB/s into pageable memory, against
    /// under 1 GB/s for CPU loads from the BAR). Bounds-checked.
    pub fn read_dma(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len() as u64, self.size())?;
        // SAFETY: the device range lies inside this allocation (checked above), alive for the call.
        unsafe { self.gpu.memcpy_dtoh(dst, self.device_ptr + offset) }
    }
}

impl RawMemory {
    /// The read path into ordinary memory by size: CPU loads, one `cuMemcpyDtoH`, or the staged
    /// pipeline (memory imported into a foreign context keeps the plain DMA path).
    fn read_by_size(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        if dst.len() < DMA_READ_THRESHOLD {
            return crate::mapping::read_with_cpu(self, offset, dst);
        }
        if dst.len() < STAGED_READ_THRESHOLD || self.foreign_context.is_some() {
            return self.read_dma(offset, dst);
        }
        check_range(offset, dst.len() as u64, self.size())?;
        // SAFETY: the device range lies inside this allocation (checked above), which lives in
        // the `Gpu`'s own context and stays alive for the call.
        unsafe { self.gpu.read_staged(dst, self.device_ptr + offset) }
    }
}

// SAFETY: the host pointer maps the whole Vulkan allocation, at least `size()` bytes, alive as
// long as `self`; `&self` methods never write it (reads, DMA into the caller's buffer, flushes).
unsafe impl Mapping for RawMemory {
    /// Bounds-checked read: CPU streaming loads below [`DMA_READ_THRESHOLD`], one
    /// `cuMemcpyDtoH` up to [`STAGED_READ_THRESHOLD`], and from there the copy engine filling
    /// pinned staging buffers while CPU threads copy them out (55 GB/s engine, 7–13 GB/s for a
    /// plain `cuMemcpyDtoH` into pageable memory on the H100). Into pinned memory, call
    /// [`RawMemory::read_dma`] instead.
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.read_by_size(offset, dst)
    }
    fn host_ptr(&self) -> *mut u8 {
        self.vulkan.as_ptr()
    }
    fn len(&self) -> u64 {
        self.size()
    }
    fn after_write(&mut self, offset: u64, len: u64) -> Result<()> {
        self.flush(offset, len)
    }
    fn before_read(&self, offset: u64, len: u64) -> Result<()> {
        self.invalidate(offset, len)
    }
}

/// CUDA-imported chunks: what a pool over a [`Gpu`] carves, with device pointers and reads of at
/// least [`DMA_READ_THRESHOLD`] bytes through the copy engine (staged from
/// [`STAGED_READ_THRESHOLD`]).
// SAFETY: as for `Mapping` above: `size()` mapped bytes, exclusively this allocation's (one
// VkDeviceMemory each), unmapped only when dropped; the values never change.
unsafe impl ChunkMemory for RawMemory {
    fn host_ptr(&self) -> *mut u8 {
        RawMemory::host_ptr(self)
    }
    fn device_ptr(&self) -> Option<u64> {
        Some(RawMemory::device_ptr(self))
    }
    fn size(&self) -> u64 {
        RawMemory::size(self)
    }
    fn flush_ranges(&self, ranges: &[(u64, u64)]) -> Result<()> {
        self.vulkan().flush_ranges(ranges.iter().copied())
    }
    fn invalidate_ranges(&self, ranges: &[(u64, u64)]) -> Result<()> {
        self.vulkan().invalidate_ranges(ranges.iter().copied())
    }
    fn read_dma(&self, offset: u64, dst: &mut [u8]) -> Option<Result<()>> {
        (dst.len() >= DMA_READ_THRESHOLD).then(|| self.read_by_size(offset, dst))
    }
}

impl Drop for RawMemory {
    fn drop(&mut self) {
        let driver = self.gpu.driver();
        // Teardown must run even if the push fails (it cannot for a live context); ignore results:
        // there is no way to report them from drop and the handles are ours.
        let _ctx = match self.foreign_context {
            // SAFETY: `new_in_current_context`'s caller promised the context outlives the memory.
            Some(c) => unsafe { ContextGuard::push(driver, c.get()) },
            None => self.gpu.bind(),
        };
        self.gpu.unregister_allocation(self.device_ptr);
        // SAFETY: the mapped buffer and the import are ours and used by nothing else now; order:
        // free the mapping, destroy the import, then the Vulkan memory drops (unmap, free).
        unsafe {
            let _ = driver.cu_mem_free(self.device_ptr);
            let _ = driver.cu_destroy_external_memory(self.external.get());
        }
    }
}

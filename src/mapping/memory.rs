//! [`RawMemory`]: one BAR-mapped allocation with a host pointer and a device pointer to the same
//! bytes.
//!
//! How it is backed (the caller sees none of it): a Vulkan allocation mapped into the device's
//! address space through CUDA VMM ([`crate::vmm`]) — its own for requests above 1 MiB, a
//! 4 KiB-aligned piece of a shared granule below; on a device or driver without VMM, an import
//! with `cuImportExternalMemory` (whose free waits for running kernels). Freeing never waits: the
//! memory goes back once the GPU work queued before the free has completed (a release queue
//! polled by the `vkgdr-release` thread).

use std::ffi::c_void;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::Arc;

use crate::core::handle::{assert_send_sync, SendSyncPtr};
use crate::core::range::{check_range, round_alloc_size};
use crate::driver::cuda::injected_failure as injected;
use crate::driver::cuda::{
    out_of_memory, ContextGuard, CuContext, CuDevicePtr, CuStream, ExternalMemoryBufferDesc,
    ExternalMemoryHandleDesc, CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
};
use crate::driver::vulkan::VulkanMemory;
use crate::error::{Error, InvalidArgument, Result};
use crate::mapping::carve::{Piece, CARVE_MAX};
use crate::mapping::chunk::{ChunkMemory, ChunkSource};
use crate::mapping::cuda_objects::Stream;
use crate::mapping::gpu::Gpu;
pub use crate::mapping::pinned::read_staging::{
    STAGED_READ_THRESHOLD, STAGING_BUFFERS, STAGING_BUFFER_BYTES,
};
use crate::mapping::release::ReleaseKey;
use crate::mapping::spare::{Kept, Reuse};
use crate::mapping::vmm::MappedMemory;
use crate::mapping::Mapping;

/// One raw allocation (what the C library calls `vkgdr_memory_alloc`): GPU memory with a host
/// pointer and a CUDA device pointer to the same bytes.
///
/// It holds its [`Gpu`], so it cannot outlive the device.
///
/// **Freeing never waits for a running kernel.** Dropping it returns at once; the memory goes
/// back to the driver (or, for small allocations, to a shared chunk) once the GPU work queued
/// before the drop in its context has completed: the legacy default stream's and every blocking
/// stream's, which is what CUDA C, CuPy, PyTorch and PyCUDA kernels run on unless told otherwise.
/// Work on streams created non-blocking (a persistent kernel's own stream) is not waited for: a
/// kernel there that may still use the memory calls for [`release_after`](Self::release_after)
/// with its stream. [`release_now`](Self::release_now) skips the wait for callers who know nothing
/// uses the memory. Until it is back, the memory counts as in use
/// ([`Gpu::pending_releases`]).
///
/// The safe [`Mapping`] methods flush after each write and invalidate before each read when the
/// memory is non-coherent. Users of [`RawMemory::host_ptr`] must call [`RawMemory::flush`] and
/// [`RawMemory::invalidate`] themselves.
///
/// `Send + Sync` by its fields: mutation through safe code needs `&mut self`, and `&self` methods
/// only read immutable values or issue thread-safe driver calls.
pub struct RawMemory {
    gpu: Gpu,
    /// The memory; `None` only while dropping or releasing.
    backing: Option<Backing>,
    /// Host address of byte 0: inside `backing`'s mapping, alive as long as it is.
    host_ptr: SendSyncPtr<u8>,
    device_ptr: CuDevicePtr,
    /// The size asked for (what `size` reports).
    requested: u64,
    /// The request rounded up to 4 KiB: flushes and invalidates may cover bytes up to here.
    alloc_size: u64,
    /// The context whose queued work a release waits for, when it is not the `Gpu`'s own
    /// ([`Gpu::alloc_in_current_context`]). A process-wide handle, used only on drop, with the
    /// caller's promise that the context is alive until then.
    context: Option<SendSyncPtr<c_void>>,
    /// The label [`Gpu::allocations`] lists it under.
    label: Option<Arc<str>>,
}
// `Send + Sync` by its fields, as the compiler checks here.
const _: () = assert_send_sync::<RawMemory>();

/// Where a raw allocation's bytes live.
enum Backing {
    /// A device mapping of its own that a later allocation of the same size may take over once
    /// this one is released (`Gpu::alloc` requests above `CARVE_MAX`, up to the `Gpu`'s
    /// `SpareLimits::each`).
    Kept(Kept),
    /// A device mapping of its own, given back to the driver when released (larger requests,
    /// and those never carved nor kept: [`Gpu::alloc_shareable`], a pool's chunks).
    Mapped(MappedMemory),
    /// A piece of a shared granule (requests up to `CARVE_MAX`).
    Carved(Piece),
    /// An external-memory import, where the device or driver lacks VMM.
    Imported(Imported),
}

impl Backing {
    /// The Vulkan allocation holding the bytes, and the offset of byte 0 in it.
    fn memory(&self) -> (&VulkanMemory, u64) {
        match self {
            Backing::Kept(k) => (k.mapping().memory(), 0),
            Backing::Mapped(m) => (m.memory(), 0),
            Backing::Carved(p) => p.memory(),
            Backing::Imported(i) => (&i.vulkan, 0),
        }
    }
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

/// Raw allocations are what a [`Gpu`] hands out.
impl Gpu {
    /// Allocates `size` bytes (rounded up to 4 KiB) of BAR-mapped memory: a Vulkan export, a CUDA
    /// import, a host mapping. Costs hundreds of µs; use a [`Pool`](crate::Pool) for many small
    /// buffers. Up to 1 MiB is carved out of a shared granule (microseconds), and a larger one
    /// takes the mapping a free of the same size left, where one is kept (up to
    /// [`Gpu::spare_limits`]' `each`, 32–256 MiB by the device; see [`Gpu::trim`]).
    /// The contents are unspecified, except that the first 16 bytes are zero: writing them warms
    /// the write path, so the first write of the caller is as fast as later ones.
    pub fn alloc(&self, size: u64) -> Result<RawMemory> {
        RawMemory::new(self, size)
    }

    /// Allocates `size` bytes that can be shared with another process
    /// ([`RawMemory::export_fd`], the [`share`](crate::share) layer): an allocation of its own,
    /// never carved out of a granule other allocations share, so its fd reaches these bytes and
    /// no others. Rounded up to the VMM granularity (2 MiB on the H100) where the device has VMM.
    pub fn alloc_shareable(&self, size: u64) -> Result<RawMemory> {
        RawMemory::new_unshared(self, size)
    }

    /// Allocates like [`Gpu::alloc`], but imports the memory into the calling thread's *current*
    /// CUDA context instead of this handle's (vkgdr 0.1's `vkgdr_memory_alloc`): kernels of that
    /// context can use the device pointer. The memory remembers the context and makes it current
    /// again to free itself, from any thread.
    ///
    /// With no context current: [`Error::Cuda`] with `CUDA_ERROR_INVALID_CONTEXT`; a context of
    /// another device: [`Error::InvalidArgument`].
    ///
    /// # Safety
    /// - The current context must stay alive (not destroyed with `cuCtxDestroy`, nor a primary
    ///   context released to zero) until the returned memory is dropped.
    pub unsafe fn alloc_in_current_context(&self, size: u64) -> Result<RawMemory> {
        // SAFETY: forwarded to our caller.
        unsafe { RawMemory::new_in_current_context(self, size) }
    }
}

impl RawMemory {
    /// Allocates `size` bytes; releases wait for the `Gpu`'s own context.
    pub(crate) fn new(gpu: &Gpu, size: u64) -> Result<RawMemory> {
        Self::allocate(gpu, size, None, true)
    }

    /// Allocates `size` bytes with a device mapping of their own, never carved: aligned to the
    /// VMM granularity (2 MiB on the H100) on both sides, as a pool's chunks must be.
    pub(crate) fn new_unshared(gpu: &Gpu, size: u64) -> Result<RawMemory> {
        Self::allocate(gpu, size, None, false)
    }

    /// Allocates for the calling thread's current context, which must belong to `gpu`'s device:
    /// its kernels use the memory, and the release waits for its queued work.
    ///
    /// # Safety
    /// - The current context must stay alive until the returned memory is dropped.
    pub(crate) unsafe fn new_in_current_context(gpu: &Gpu, size: u64) -> Result<RawMemory> {
        let (context, device) = crate::mapping::gpu::current_context(gpu.driver())?;
        if device != gpu.cu_device() {
            return Err(InvalidArgument::ContextOfAnotherDevice {
                context_device: device,
                handle_device: gpu.cu_device(),
            }
            .into());
        }
        Self::allocate(gpu, size, Some(context), true)
    }

    fn allocate(
        gpu: &Gpu,
        size: u64,
        context: Option<CuContext>,
        carve: bool,
    ) -> Result<RawMemory> {
        let alloc_size = round_alloc_size(size)?;
        let backing = gpu.retry_after_releases(|| Self::back(gpu, alloc_size, context, carve))?;
        let (host_ptr, device_ptr) = match &backing {
            Backing::Kept(k) => (k.mapping().host_ptr(), k.mapping().device_ptr()),
            Backing::Mapped(m) => (m.host_ptr(), m.device_ptr()),
            Backing::Carved(p) => (p.host_ptr(), p.device_ptr()),
            Backing::Imported(i) => (i.vulkan.as_ptr(), i.device_ptr),
        };
        gpu.register_allocation(device_ptr, size);
        let mut memory = RawMemory {
            gpu: gpu.clone(),
            backing: Some(backing),
            host_ptr: SendSyncPtr::new(host_ptr),
            device_ptr,
            requested: size,
            alloc_size,
            context: context.map(SendSyncPtr::new),
            label: None,
        };
        memory.warm_write_path();
        Ok(memory)
    }

    /// Runs the write path once over the allocation's first bytes, writing zeros (a fresh
    /// allocation's contents are unspecified), so that the first write of the caller costs what
    /// later ones do: the allocation's driver calls leave the write path's code, its TLB entries
    /// and the mapping's page cold; without this the caller's first write, and a store into a
    /// new chunk, cost several times a later one (figures: BENCHMARKS.md, 'First write').
    fn warm_write_path(&mut self) {
        const WARM: [u8; 16] = [0; 16];
        let n = WARM.len().min(self.requested as usize);
        // Best effort: a write that fails here fails again, with its error, when the caller
        // writes; nothing is left half done (the bytes are the allocation's own).
        let _ = Mapping::write(self, 0, &WARM[..n]);
    }

    fn back(
        gpu: &Gpu,
        alloc_size: u64,
        context: Option<CuContext>,
        carve: bool,
    ) -> Result<Backing> {
        match gpu.vmm() {
            Some(_) if carve && alloc_size <= CARVE_MAX => {
                Ok(Backing::Carved(gpu.carver()?.alloc(alloc_size)?))
            }
            Some(vmm) => {
                let spares = gpu.spares();
                let reuse = if carve {
                    spares.take(alloc_size)
                } else {
                    Reuse::PastLimits
                };
                let map = || MappedMemory::bar(vmm, gpu.vulkan(), alloc_size);
                Ok(match reuse {
                    Reuse::Taken(m) => Backing::Kept(Kept::new(m, alloc_size, spares.clone())),
                    Reuse::Keepable => Backing::Kept(Kept::new(map()?, alloc_size, spares.clone())),
                    Reuse::PastLimits => Backing::Mapped(map()?),
                })
            }
            None => Imported::new(gpu, alloc_size, context).map(Backing::Imported),
        }
    }

    /// A new opaque fd of the Vulkan allocation behind these bytes, with the allocation's size:
    /// what another process imports to map the same memory (the [`share`](crate::share) layer
    /// sends it). Only for allocations of their own ([`Gpu::alloc_shareable`], a pool's chunks):
    /// a small allocation carved out of a shared granule is refused with
    /// [`Error::Unsupported`], since its fd would reach its neighbours' bytes too.
    pub fn export_fd(&self) -> Result<(OwnedFd, u64)> {
        let memory = match self.backing.as_ref() {
            Some(Backing::Kept(k)) => {
                k.never_reuse();
                k.mapping().memory()
            }
            Some(Backing::Mapped(m)) => m.memory(),
            Some(Backing::Imported(i)) => &i.vulkan,
            Some(Backing::Carved(_)) => {
                return Err(Error::Unsupported(
                    "this allocation is carved out of a granule other allocations share; \
                     allocate memory to share with Gpu::alloc_shareable"
                        .into(),
                ))
            }
            None => return Err(Error::internal("raw memory without backing")),
        };
        Ok((memory.export_fd()?, memory.size()))
    }

    /// The Vulkan memory type index of the allocation behind these bytes.
    pub fn memory_type_index(&self) -> u32 {
        self.gpu.vulkan().memory_type().index
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

    /// The request rounded up to 4 KiB: flushes and invalidates may cover it up to here.
    pub fn allocation_size(&self) -> u64 {
        self.alloc_size
    }

    /// The host pointer to the mapping. Writes through it must be followed by
    /// [`RawMemory::flush`] on non-coherent memory.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host_ptr.get()
    }

    /// The CUDA device pointer (`CUdeviceptr`) to the same bytes: usable by kernels of every
    /// context of the device.
    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
    }

    /// Lets kernels on `peer`, another GPU of this process, read and write this memory through the
    /// same [`device_ptr`](Self::device_ptr): the bytes stay in this device's memory and the peer
    /// reaches them over its peer-to-peer link (NVLink or PCIe).
    ///
    /// Device pointers come from CUDA VMM mappings, which `cuCtxEnablePeerAccess` does not cover:
    /// access is granted per mapping, with `cuMemSetAccess`. So the grant covers the whole
    /// mapping this memory lies in: an allocation above 1 MiB has one of its own; a smaller one
    /// shares a 2 MiB granule with other small allocations of this `Gpu`, which `peer` can then
    /// reach too (and allocations carved from that granule later). A grant lasts as long as the
    /// mapping; granting again is harmless, and `peer` being this device is a no-op.
    ///
    /// Fails with [`Error::Unsupported`] when `peer` has no peer-to-peer path to this device
    /// ([`Gpu::can_access_peer`] is false: the message says so) or when the memory is imported
    /// with `cuImportExternalMemory` instead of VMM (enable peer access between the contexts with
    /// `cuCtxEnablePeerAccess` there); a refusal of the driver is its [`Error::Cuda`] from
    /// `cuMemSetAccess`.
    ///
    /// Freeing the memory waits for the work queued on this device only, never for `peer`'s: a
    /// kernel on `peer` that may still use the memory must have completed before it is dropped.
    ///
    /// ```no_run
    /// use vkgdr::{Gpu, Mapping};
    /// # fn main() -> vkgdr::Result<()> {
    /// let (gpu0, gpu1) = (Gpu::open(0)?, Gpu::open(1)?);
    /// let mut mem = gpu0.alloc(4 << 20)?; // in GPU 0's memory
    /// mem.write(0, b"for GPU 1")?;
    /// mem.grant_peer_access(&gpu1)?;
    /// // a kernel on GPU 1 may now read and write mem.device_ptr()
    /// # Ok(()) }
    /// ```
    pub fn grant_peer_access(&self, peer: &Gpu) -> Result<()> {
        let Some(ordinal) = self.gpu.peer_ordinal(peer)? else {
            return Ok(());
        };
        match self.backing()? {
            Backing::Kept(k) => {
                k.never_reuse();
                k.mapping().grant_access(ordinal)
            }
            Backing::Mapped(m) => m.grant_access(ordinal),
            Backing::Carved(p) => p.grant_access(ordinal),
            Backing::Imported(_) => Err(Error::Unsupported(
                "peer access is granted per CUDA VMM mapping, and this memory is imported with \
                 cuImportExternalMemory (no VMM here): enable peer access between the two \
                 contexts with cuCtxEnablePeerAccess instead"
                    .into(),
            )),
        }
    }

    /// Whether the memory is treated as coherent (no flush/invalidate needed).
    pub fn is_coherent(&self) -> bool {
        !self.gpu.is_non_coherent()
    }

    /// The alignment flushes and invalidates work in: `nonCoherentAtomSize` on non-coherent
    /// memory, 1 on coherent memory (where they are no-ops).
    pub fn non_coherent_atom_size(&self) -> u64 {
        let vulkan = self.gpu.vulkan();
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

    fn backing(&self) -> Result<&Backing> {
        self.backing
            .as_ref()
            .ok_or_else(|| Error::internal("raw memory used after its release"))
    }

    /// Flushes CPU writes in `[offset, offset+len)` (rounded to `nonCoherentAtomSize`, within the
    /// 4 KiB-rounded allocation); a no-op on coherent memory.
    pub fn flush(&self, offset: u64, len: u64) -> Result<()> {
        self.flush_ranges(&[(offset, len)])
    }

    /// Invalidates `[offset, offset+len)` before CPU reads of device writes; a no-op on coherent
    /// memory.
    pub fn invalidate(&self, offset: u64, len: u64) -> Result<()> {
        self.invalidate_ranges(&[(offset, len)])
    }

    /// Flushes several ranges with one driver call; a range outside the allocation flushes
    /// nothing and is [`Error::InvalidArgument`].
    fn flush_ranges(&self, ranges: &[(u64, u64)]) -> Result<()> {
        let (memory, base) = self.checked(ranges)?;
        memory.flush_ranges(ranges.iter().map(|&(o, l)| (base + o, l)))
    }

    fn invalidate_ranges(&self, ranges: &[(u64, u64)]) -> Result<()> {
        let (memory, base) = self.checked(ranges)?;
        memory.invalidate_ranges(ranges.iter().map(|&(o, l)| (base + o, l)))
    }

    /// Bounds-checks `ranges` against the allocation and gives the memory they lie in.
    fn checked(&self, ranges: &[(u64, u64)]) -> Result<(&VulkanMemory, u64)> {
        for &(offset, len) in ranges {
            check_range(offset, len, self.alloc_size)?;
        }
        Ok(self.backing()?.memory())
    }

    /// Frees the memory now, without waiting for GPU work queued before: for callers who know
    /// that no kernel or copy in flight uses it. Never waits either.
    pub fn release_now(mut self) {
        self.gpu.unregister_allocation(self.device_ptr);
        drop(self.backing.take());
    }

    /// Frees the memory once the work queued on `stream` so far has completed (and never
    /// waits): for memory a kernel on a non-blocking stream may still use. On an error the
    /// memory is released as a plain drop would, and the error returned.
    pub fn release_after(self, stream: &Stream) -> Result<()> {
        // SAFETY: a live stream of ours; its `Gpu` keeps its context alive.
        unsafe { self.release_after_stream(stream.raw()) }
    }

    /// [`release_after`](Self::release_after) for a raw `CUstream` (from CUDA C, cudarc, CuPy,
    /// PyTorch). The null stream is [`Error::InvalidArgument`] (a plain drop already waits for
    /// the legacy stream).
    ///
    /// # Safety
    /// - `stream` must be a live stream of this memory's device; on drivers without stream
    ///   memory operations its context must outlive the release.
    pub unsafe fn release_after_stream(mut self, stream: CuStream) -> Result<()> {
        self.gpu.unregister_allocation(self.device_ptr);
        match self.backing.take() {
            Some(b @ Backing::Imported(_)) => {
                drop(b);
                Ok(())
            }
            // SAFETY: the caller's contract.
            Some(b) => unsafe {
                self.gpu
                    .release_after_stream(b, stream, self.context.map(SendSyncPtr::get))
            },
            None => Ok(()),
        }
    }
}

/// Reads of at least this many bytes go through the copy engine instead of CPU loads from the
/// BAR.
///
/// `vkgdr bench copybw` places it: below it, streaming loads on one thread beat `cuMemcpyDtoH`
/// into pageable memory; from it on, the copy engine wins, by more with every size (figures:
/// BENCHMARKS.md, 'Reads through the copy engine').
pub const DMA_READ_THRESHOLD: usize = 16 << 10;

impl Gpu {
    /// The read policy of every mapping with a device address (raw memory, pool chunks, arena
    /// chunks), in one place: a read of `dst.len()` bytes at device address `src` below
    /// [`DMA_READ_THRESHOLD`] is `None`, for the caller to read with CPU loads after an
    /// invalidate; up to [`STAGED_READ_THRESHOLD`] it is one copy-engine copy, and from there the
    /// copy engine fills pinned staging buffers while CPU threads copy them out.
    ///
    /// # Safety
    /// - `[src, src + dst.len())` is valid device memory of this GPU, reachable from its context
    ///   and alive for the call.
    pub(crate) unsafe fn read_by_size(&self, dst: &mut [u8], src: u64) -> Option<Result<()>> {
        if dst.len() < DMA_READ_THRESHOLD {
            return None;
        }
        Some(if dst.len() < STAGED_READ_THRESHOLD {
            // SAFETY: the caller's contract.
            unsafe { self.memcpy_dtoh(dst, src) }
        } else {
            // SAFETY: the caller's contract.
            unsafe { self.read_staged(dst, src) }
        })
    }
}

impl RawMemory {
    /// Reads with the GPU's copy engine instead of CPU loads: the fast path for large reads
    /// (several times CPU loads from the BAR, under 1 GB/s per thread; figures: BENCHMARKS.md,
    /// 'Reads through the copy engine'), on a stream of the library's own, so a kernel on the
    /// legacy stream does not hold it up. Bounds-checked.
    pub fn read_dma(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len() as u64, self.size())?;
        // SAFETY: the device range lies inside this allocation (checked above), alive for the call.
        unsafe { self.gpu.memcpy_dtoh(dst, self.device_ptr + offset) }
    }

    /// [`Mapping::write`] through a shared reference: the same bounds check and copy (inline
    /// when short, split over the global copy pool when long, fenced), then the same flush of the
    /// written range (a no-op on coherent memory). For callers that keep writers of the same
    /// bytes apart themselves, as the C library's callers promise to.
    ///
    /// # Safety
    /// - No other thread reads or writes `[offset, offset + src.len())` of the allocation during
    ///   the call, through [`host_ptr`](Self::host_ptr) or otherwise, and `src` does not overlap
    ///   it.
    pub unsafe fn write_shared(&self, offset: u64, src: &[u8]) -> Result<()> {
        // SAFETY: the host mapping holds `size()` bytes while `self` lives; the range is the
        // caller's alone for the call.
        unsafe { crate::mapping::store(self.host_ptr(), self.size(), offset, src) }?;
        self.flush(offset, src.len() as u64)
    }
}

// SAFETY: the host pointer maps at least `size()` bytes, exclusively this allocation's (its own
// Vulkan allocation or a carved piece no other allocation overlaps), alive as long as `self`;
// `&self` methods never write it (reads, DMA into the caller's buffer, flushes).
unsafe impl Mapping for RawMemory {
    /// Bounds-checked read: CPU streaming loads below [`DMA_READ_THRESHOLD`], one
    /// copy-engine copy up to [`STAGED_READ_THRESHOLD`], and from there the copy engine filling
    /// pinned staging buffers while CPU threads copy them out.
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len() as u64, self.size())?;
        // SAFETY: the device range lies inside this allocation (checked above), which every
        // context of the device can reach, and stays alive for the call.
        match unsafe { self.gpu.read_by_size(dst, self.device_ptr + offset) } {
            Some(read) => read,
            None => crate::mapping::read_with_cpu(self, offset, dst),
        }
    }
    fn host_ptr(&self) -> *mut u8 {
        self.host_ptr.get()
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

/// Raw allocations as a pool's chunks: what a pool over a [`Gpu`] carves, with device pointers
/// and reads of at least [`DMA_READ_THRESHOLD`] bytes through the copy engine.
// SAFETY: as for `Mapping` above: `size()` mapped bytes, exclusively this allocation's, unmapped
// only after it is dropped; the values never change.
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
        RawMemory::flush_ranges(self, ranges)
    }
    fn invalidate_ranges(&self, ranges: &[(u64, u64)]) -> Result<()> {
        RawMemory::invalidate_ranges(self, ranges)
    }
    fn read_dma(&self, offset: u64, dst: &mut [u8]) -> Option<Result<()>> {
        // SAFETY: the caller bounds-checked the range inside this chunk, alive for the call.
        unsafe { self.gpu.read_by_size(dst, self.device_ptr + offset) }
    }
    fn export_fd(&self) -> Option<Result<(OwnedFd, u64)>> {
        Some(RawMemory::export_fd(self))
    }

    fn grant_peer_access(&self, peer: &Gpu) -> Result<()> {
        RawMemory::grant_peer_access(self, peer)
    }
}

/// BAR-mapped chunks with device pointers, each a raw allocation with a device mapping of its
/// own (never carved: a pool needs chunk addresses aligned to its largest alignment, and VMM
/// maps at the granularity, 2 MiB on the H100): the default source of a [`Pool`](crate::Pool).
// SAFETY: every chunk is a fresh allocation of at least `size` bytes that overlaps no other; the
// atom is the device's nonCoherentAtomSize, a power of two by the Vulkan spec.
unsafe impl ChunkSource for Gpu {
    fn allocate_chunk(&self, size: u64) -> Result<Box<dyn ChunkMemory>> {
        let mut chunk = RawMemory::new_unshared(self, size)?;
        chunk.set_label("vkgdr pool chunk");
        Ok(Box::new(chunk))
    }
    fn atom_size(&self) -> u64 {
        self.vulkan().atom_size()
    }
    fn is_non_coherent(&self) -> bool {
        Gpu::is_non_coherent(self)
    }
}

impl Drop for RawMemory {
    fn drop(&mut self) {
        self.gpu.unregister_allocation(self.device_ptr);
        match self.backing.take() {
            // Its free is `cuMemFree`, which waits anyway: no point in queueing it.
            Some(b @ Backing::Imported(_)) => drop(b),
            Some(b) => self.gpu.release_after_queued_work(
                b,
                self.context.map(SendSyncPtr::get),
                ReleaseKey::ANY,
            ),
            None => {}
        }
    }
}

/// Vulkan memory imported with `cuImportExternalMemory`: the path where the device or driver
/// lacks VMM. Freeing it (`cuMemFree`) waits for every running kernel of the device.
struct Imported {
    gpu: Gpu,
    /// The CUDA import (`CUexternalMemory`): a process-wide handle, usable from any thread.
    external: SendSyncPtr<c_void>,
    device_ptr: CuDevicePtr,
    /// The context the import was made in, when not the `Gpu`'s own (pushed again to free).
    context: Option<SendSyncPtr<c_void>>,
    // Dropped after `Drop::drop` has torn down the CUDA side.
    vulkan: VulkanMemory,
}

impl Imported {
    fn new(gpu: &Gpu, size: u64, context: Option<CuContext>) -> Result<Imported> {
        // The import lands in the current context: the caller's, or the `Gpu`'s own.
        let _ctx = match context {
            Some(_) => None,
            None => Some(gpu.bind()?),
        };
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
        let external = crate::driver::failpoint::inject("cuImportExternalMemory", || {
            injected(driver, "cuImportExternalMemory")
        })
        // SAFETY: `desc` describes a live opaque fd of `alloc_size` bytes and outlives the call;
        // a context is current.
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
        let mapped = crate::driver::failpoint::inject("cuExternalMemoryGetMappedBuffer", || {
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
        Ok(Imported {
            gpu: gpu.clone(),
            external: SendSyncPtr::new(external),
            device_ptr,
            context: context.map(SendSyncPtr::new),
            vulkan,
        })
    }
}

impl Drop for Imported {
    fn drop(&mut self) {
        let driver = self.gpu.driver();
        // Teardown must run even if the push fails (it cannot for a live context); ignore
        // results: there is no way to report them from drop and the handles are ours.
        let _ctx = match self.context {
            // SAFETY: `new_in_current_context`'s caller promised the context outlives the memory.
            Some(c) => unsafe { ContextGuard::push(driver, c.get()) },
            None => self.gpu.bind(),
        };
        // SAFETY: the mapped buffer and the import are ours and used by nothing else now; order:
        // free the mapping, destroy the import, then the Vulkan memory drops (unmap, free).
        unsafe {
            let _ = driver.cu_mem_free(self.device_ptr);
            let _ = driver.cu_destroy_external_memory(self.external.get());
        }
    }
}

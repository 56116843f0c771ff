//! [`Arena`]: a growable, virtually contiguous device range over BAR-mapped chunks (CUDA VMM),
//! plus VMM feature detection and granularity.

use std::ffi::{c_int, c_void};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use crate::chunk::{ChunkMemory, ChunkSource};
use crate::cuda::{
    self, out_of_memory, CuMemHandle, Driver, MemAccessDesc, MemAllocationProp, MemLocation,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ALLOC_GRANULARITY_MINIMUM,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
};
use crate::error::{Error, MemorySide, Result};
use crate::gpu::Gpu;
use crate::handle::SendSyncPtr;
use crate::memory::{injected, DMA_READ_THRESHOLD};
use crate::pool::{Pool, PoolConfig};
use crate::range::check_range;
use crate::vulkan::VulkanMemory;

/// The VMM mapping granularity for POSIX-fd device memory on device `ordinal` (2 MiB on the H100):
/// chunks mapped into an arena must be multiples of it.
pub fn granularity(driver: &Driver, ordinal: c_int) -> Result<u64> {
    let prop = MemAllocationProp::pinned_posix_fd(ordinal);
    // SAFETY: `prop` is a fully initialised CUmemAllocationProp (32 bytes, checked at compile
    // time) that outlives the call.
    let g = unsafe {
        driver.cu_mem_get_allocation_granularity(&prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)
    }?;
    Ok(g as u64)
}

/// Offset arithmetic of an arena: equal-sized chunks laid back to back in one address range.
/// Pure, so it is property-tested without a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaLayout {
    chunk_size: u64,
}

impl ArenaLayout {
    /// A layout of `chunk_size`-byte chunks (non-zero).
    pub fn new(chunk_size: u64) -> Result<Self> {
        if chunk_size == 0 {
            return Err(Error::invalid("arena chunk size is zero"));
        }
        Ok(ArenaLayout { chunk_size })
    }

    /// The chunk size.
    pub fn chunk_size(&self) -> u64 {
        self.chunk_size
    }

    /// Which chunk holds byte `offset`, and where in it.
    pub fn locate(&self, offset: u64) -> (usize, u64) {
        (
            (offset / self.chunk_size) as usize,
            offset % self.chunk_size,
        )
    }

    /// Splits `[offset, offset + len)` into per-chunk pieces `(chunk, offset_in_chunk, piece_len)`.
    /// The caller bounds-checks the range first.
    pub fn split(&self, offset: u64, len: u64) -> impl Iterator<Item = (usize, u64, u64)> + '_ {
        let end = offset.saturating_add(len);
        let mut pos = offset;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let (chunk, within) = self.locate(pos);
            let piece = (self.chunk_size - within).min(end - pos);
            pos += piece;
            Some((chunk, within, piece))
        })
    }
}

struct ArenaChunk {
    handle: CuMemHandle,
    memory: VulkanMemory,
}

/// A growable, virtually contiguous device range built from BAR-mapped chunks with CUDA's virtual
/// memory management (VMM).
///
/// The arena reserves a large device address range once (cheap) and maps chunks into it back to
/// back as it grows, so the device address of any byte never changes and a kernel can read across
/// chunk boundaries. Each chunk keeps its own host mapping; [`Arena::write`] and [`Arena::read`]
/// translate arena offsets to the right chunk. Chunk sizes must be multiples of the VMM
/// granularity (2 MiB on the H100).
///
/// Teardown, on shrink and on drop, runs in the order that works: `cuMemUnmap`, `cuMemRelease`,
/// then the Vulkan memory; `cuMemAddressFree` last.
///
/// `Send + Sync` by its fields: CUDA handles and device addresses are process-wide values, the
/// chunks' mappings are written only through `&mut self`, and `&self` methods only read through
/// them or return addresses.
pub struct Arena {
    gpu: Gpu,
    base: u64,
    reserved: u64,
    layout: ArenaLayout,
    chunks: Vec<ArenaChunk>,
    ordinal: c_int,
    /// Whether chunk 0 is mapped a second time right after the last chunk.
    mirrored: bool,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("base", &format_args!("{:#x}", self.base))
            .field("reserved", &self.reserved)
            .field("chunk_size", &self.layout.chunk_size)
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

impl Arena {
    /// Reserves `reserve` bytes of device address space for chunks of `chunk_size` bytes on
    /// `gpu`'s device. Both must be multiples of the VMM granularity. Nothing is mapped yet.
    ///
    /// Returns [`Error::Unsupported`] where the device or driver lacks VMM or POSIX-fd handles,
    /// so callers can fall back to separate chunks.
    pub fn new(gpu: &Gpu, reserve: u64, chunk_size: u64) -> Result<Arena> {
        let driver = gpu.driver();
        let dev = gpu.cu_device();
        if driver.device_attribute(
            dev,
            cuda::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        )? == 0
        {
            return Err(Error::Unsupported(
                "the device does not support CUDA VMM".into(),
            ));
        }
        if driver.device_attribute(
            dev,
            cuda::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
        )? == 0
        {
            return Err(Error::Unsupported(
                "the device does not import POSIX fd handles".into(),
            ));
        }
        let ordinal = ordinal_of(gpu)?;
        let g = granularity(driver, ordinal)?;
        if chunk_size == 0 || !chunk_size.is_multiple_of(g) {
            return Err(Error::invalid(format!(
                "arena chunk size {chunk_size} is not a multiple of the VMM granularity {g}"
            )));
        }
        if reserve == 0 || !reserve.is_multiple_of(chunk_size) {
            return Err(Error::invalid(format!(
                "arena reservation {reserve} is not a multiple of the chunk size {chunk_size}"
            )));
        }
        let _ctx = gpu.bind()?;
        // Size and alignment are granularity multiples; no fixed address.
        let base = crate::failpoint::inject("cuMemAddressReserve", || {
            injected(driver, "cuMemAddressReserve")
        })
        .and_then(|()| driver.cu_mem_address_reserve(reserve as usize, g as usize, 0, 0))
        .map_err(out_of_memory(reserve))?;
        Ok(Arena {
            gpu: gpu.clone(),
            base,
            reserved: reserve,
            layout: ArenaLayout { chunk_size },
            chunks: Vec::new(),
            ordinal,
            mirrored: false,
        })
    }

    /// Maps chunk 0 a second time right after the last chunk, so a span that runs off the end of
    /// the mapped range continues, for the GPU, at its beginning: `device_ptr() + len()` aliases
    /// `device_ptr()`. This is what lets a ring's records wrap without padding. Needs one chunk of
    /// spare reservation; growing and shrinking are refused while mirrored
    /// ([`Arena::unmap_mirror`] first).
    pub fn map_mirror(&mut self) -> Result<()> {
        if self.mirrored {
            return Ok(());
        }
        let size = self.layout.chunk_size;
        let first = self
            .chunks
            .first()
            .ok_or_else(|| Error::invalid("mirroring an empty arena"))?;
        if self.len() + size > self.reserved {
            return Err(Error::invalid(
                "no reservation left after the last chunk for the mirror",
            ));
        }
        let handle = first.handle;
        let _ctx = self.gpu.bind()?;
        // Mapping one allocation handle at several addresses is allowed by CUDA VMM.
        self.map_with_access(self.base + self.len(), handle)?;
        self.mirrored = true;
        Ok(())
    }

    /// Removes the mirror mapping made by [`Arena::map_mirror`].
    pub fn unmap_mirror(&mut self) -> Result<()> {
        if !self.mirrored {
            return Ok(());
        }
        let _ctx = self.gpu.bind()?;
        let at = self.base + self.len();
        // SAFETY: the mirror is mapped at `at` with one chunk's size.
        unsafe {
            self.gpu
                .driver()
                .cu_mem_unmap(at, self.layout.chunk_size as usize)
        }?;
        self.mirrored = false;
        Ok(())
    }

    /// Whether chunk 0 is mirrored after the last chunk.
    pub fn is_mirrored(&self) -> bool {
        self.mirrored
    }

    /// Device address of byte 0; never changes.
    pub fn device_ptr(&self) -> u64 {
        self.base
    }

    /// Bytes mapped so far (chunks × chunk size).
    pub fn len(&self) -> u64 {
        self.chunks.len() as u64 * self.layout.chunk_size
    }

    /// Whether no chunk is mapped.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Bytes of address space reserved.
    pub fn capacity(&self) -> u64 {
        self.reserved
    }

    /// Number of chunks mapped.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// The offset arithmetic.
    pub fn layout(&self) -> ArenaLayout {
        self.layout
    }

    /// Host pointer of the byte at `offset` (each chunk has its own host mapping, so only
    /// `chunk_size - offset % chunk_size` bytes from it are contiguous on the host).
    pub fn host_ptr(&self, offset: u64) -> Option<*mut u8> {
        if offset >= self.len() {
            return None;
        }
        let (c, within) = self.layout.locate(offset);
        // SAFETY: `within` < chunk size, inside the chunk's mapping.
        Some(unsafe { self.chunks[c].memory.as_ptr().add(within as usize) })
    }

    /// Maps one more chunk at the end. Existing device addresses do not move. Fails with
    /// [`Error::OutOfDeviceMemory`]: `side: Limit` past the reservation, a driver side when the
    /// BAR is full; with [`Error::InvalidArgument`] while mirrored. The arena is unchanged on any
    /// error.
    pub fn grow(&mut self) -> Result<u64> {
        if self.mirrored {
            return Err(Error::invalid(
                "growing a mirrored arena (unmap the mirror first)",
            ));
        }
        let size = self.layout.chunk_size;
        if self.len() + size > self.reserved {
            return Err(Error::OutOfDeviceMemory {
                side: MemorySide::Limit,
                call: "Arena::grow",
                size,
                result: format!("the arena's {}-byte reservation is full", self.reserved),
            });
        }
        let driver = self.gpu.driver();
        let memory = self.gpu.vulkan().allocate(size)?;
        let fd = memory.export_fd()?;
        let _ctx = self.gpu.bind()?;
        // SAFETY: the fd is a live opaque fd of the allocation, passed as the handle value (as
        // cuda.h prescribes for POSIX fds); this call does not take ownership (the OwnedFd closes
        // it when dropped below).
        let handle = crate::failpoint::inject("cuMemImportFromShareableHandle", || {
            injected(driver, "cuMemImportFromShareableHandle")
        })
        .and_then(|()| unsafe {
            driver.cu_mem_import_from_shareable_handle(
                fd.as_raw_fd() as isize as *mut c_void,
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        });
        drop(fd);
        let handle = handle.map_err(out_of_memory(size))?;
        if let Err(e) = self.map_with_access(self.base + self.len(), handle) {
            // SAFETY: the handle is ours and not mapped anywhere.
            let _ = unsafe { driver.cu_mem_release(handle) };
            return Err(e);
        }
        self.chunks.push(ArenaChunk { handle, memory });
        Ok(self.len())
    }

    /// Maps `handle` (one chunk's allocation) at `at` and grants this device read/write access,
    /// undoing the mapping if access cannot be set. The caller binds the context, and `at` must
    /// be a chunk-sized, unmapped slot inside the reservation.
    fn map_with_access(&self, at: u64, handle: CuMemHandle) -> Result<()> {
        let driver = self.gpu.driver();
        let size = self.layout.chunk_size;
        debug_assert!(at >= self.base && at + size <= self.base + self.reserved);
        crate::failpoint::inject("cuMemMap", || injected(driver, "cuMemMap"))
            // SAFETY: `at..at+size` lies in our reservation and is unmapped (caller's contract);
            // the handle's allocation is exactly one chunk.
            .and_then(|()| unsafe { driver.cu_mem_map(at, size as usize, 0, handle, 0) })
            .map_err(out_of_memory(size))?;
        let access = MemAccessDesc {
            location: MemLocation::device(self.ordinal),
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let access_set =
            crate::failpoint::inject("cuMemSetAccess", || injected(driver, "cuMemSetAccess"))
                // SAFETY: the range was just mapped; one valid access descriptor, alive for the
                // call.
                .and_then(|()| unsafe { driver.cu_mem_set_access(at, size as usize, &access, 1) });
        if let Err(e) = access_set {
            // SAFETY: undo the mapping made above; nothing has used it.
            let _ = unsafe { driver.cu_mem_unmap(at, size as usize) };
            return Err(e);
        }
        Ok(())
    }

    /// Unmaps and frees the last `n` chunks (at most all of them). Returns the new length.
    ///
    /// Taking `&mut self` guarantees no host borrow into those chunks survives; kernels still
    /// reading them must have finished (synchronise first), as with any freed device memory.
    pub fn shrink(&mut self, n: usize) -> Result<u64> {
        if self.mirrored {
            return Err(Error::invalid(
                "shrinking a mirrored arena (unmap the mirror first)",
            ));
        }
        let n = n.min(self.chunks.len());
        for _ in 0..n {
            let c = self.chunks.pop().expect("counted above");
            let at = self.base + self.len();
            self.release_chunk(at, c)?;
        }
        Ok(self.len())
    }

    fn release_chunk(&self, at: u64, c: ArenaChunk) -> Result<()> {
        let driver = self.gpu.driver();
        let _ctx = self.gpu.bind()?;
        // SAFETY: the chunk is mapped at `at` with its full size; unmap before release.
        let unmapped = unsafe { driver.cu_mem_unmap(at, self.layout.chunk_size as usize) };
        // SAFETY: the handle is ours and no longer mapped.
        let released = unsafe { driver.cu_mem_release(c.handle) };
        drop(c.memory); // Vulkan memory last
        unmapped.and(released)
    }

    /// Flushes CPU writes in `[offset, offset + len)` (per chunk, rounded to the atom); a no-op on
    /// coherent memory.
    pub fn flush(&self, offset: u64, len: u64) -> Result<()> {
        check_range(offset, len, self.len())?;
        for (c, within, piece) in self.layout.split(offset, len) {
            self.chunks[c].memory.flush(within, piece)?;
        }
        Ok(())
    }

    /// Copies `src` to arena offset `offset`, across chunk boundaries (bounds-checked).
    pub fn write(&mut self, offset: u64, src: &[u8]) -> Result<()> {
        check_range(offset, src.len() as u64, self.len())?;
        let mut done = 0usize;
        for (c, within, piece) in self.layout.split(offset, src.len() as u64) {
            let mem = &self.chunks[c].memory;
            // SAFETY: the piece lies inside chunk `c` (split never crosses a chunk end) and
            // `&mut self` excludes other safe writers.
            unsafe {
                crate::copy::copy_to_mapping(
                    mem.as_ptr().add(within as usize),
                    &src[done..done + piece as usize],
                )
            };
            mem.flush(within, piece)?;
            done += piece as usize;
        }
        Ok(())
    }

    /// Copies from arena offset `offset` into `dst`, across chunk boundaries (bounds-checked).
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len() as u64, self.len())?;
        let mut done = 0usize;
        for (c, within, piece) in self.layout.split(offset, dst.len() as u64) {
            let mem = &self.chunks[c].memory;
            mem.invalidate(within, piece)?;
            // SAFETY: the piece lies inside chunk `c`; `dst` is a distinct host buffer.
            unsafe {
                crate::copy::copy_from_mapping(
                    &mut dst[done..done + piece as usize],
                    mem.as_ptr().add(within as usize),
                )
            };
            done += piece as usize;
        }
        Ok(())
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let _ = self.unmap_mirror();
        let _ = self.shrink(usize::MAX);
        let _ctx = self.gpu.bind();
        // SAFETY: every chunk is unmapped; the range is ours and freed once.
        let _ = unsafe {
            self.gpu
                .driver()
                .cu_mem_address_free(self.base, self.reserved as usize)
        };
    }
}

fn ordinal_of(gpu: &Gpu) -> Result<c_int> {
    let driver = gpu.driver();
    for i in 0..driver.device_count()? {
        if driver.device(i)? == gpu.cu_device() {
            return Ok(i);
        }
    }
    Err(Error::NoMatchingDevice(
        "the GPU's CUDA device has no ordinal".into(),
    ))
}

/// A [`ChunkSource`] that hands out the chunks of one [`Arena`], so a
/// [`Pool`] built on it keeps every block inside one contiguous device range and
/// growing never moves a block.
///
/// Every chunk is the arena's chunk size (set the pool's `chunk_size` and `max_chunk_size` to it,
/// and its `dedicated_threshold` at most to it: [`Pool::on_arena`] does).
/// A released chunk in the middle stays mapped and is reused first; trailing released chunks are
/// unmapped and freed at once, so the arena shrinks from the end.
pub struct ArenaSource {
    state: Arc<crate::sync::lock::Mutex<ArenaSlots>>,
    atom: u64,
    non_coherent: bool,
}

struct ArenaSlots {
    arena: Arena,
    /// Mapped chunks no pool chunk uses now (never the last one: that is unmapped instead).
    free: std::collections::BTreeSet<usize>,
}

impl ArenaSlots {
    fn release(&mut self, slot: usize) {
        self.free.insert(slot);
        while let Some(last) = self.arena.chunk_count().checked_sub(1) {
            if !self.free.remove(&last) {
                break;
            }
            // Unmapping cannot fail for a chunk we mapped; if it did, the chunk stays mapped and
            // is simply not reused (it is freed with the arena).
            let _ = self.arena.shrink(1);
        }
    }
}

impl ArenaSource {
    /// Wraps `arena` (usually empty) as a chunk source.
    pub fn new(arena: Arena) -> ArenaSource {
        let atom = arena.gpu.vulkan().atom_size();
        let non_coherent = arena.gpu.is_non_coherent();
        ArenaSource {
            state: Arc::new(crate::sync::lock::Mutex::new(ArenaSlots {
                arena,
                free: Default::default(),
            })),
            atom,
            non_coherent,
        }
    }

    /// Device address of the arena's first byte (all blocks lie in `[base, base + capacity)`).
    pub fn device_ptr(&self) -> u64 {
        self.state.lock().arena.device_ptr()
    }

    /// Bytes of address space reserved.
    pub fn capacity(&self) -> u64 {
        self.state.lock().arena.capacity()
    }

    /// Chunks currently mapped (in use or kept for reuse).
    pub fn mapped_chunks(&self) -> usize {
        self.state.lock().arena.chunk_count()
    }
}

/// One chunk of an [`ArenaSource`] lent to a pool; `Send + Sync` by its fields (the shared state
/// is behind a mutex, `&self` methods only read fields or lock it).
struct ArenaChunkRef {
    state: Arc<crate::sync::lock::Mutex<ArenaSlots>>,
    slot: usize,
    /// The slot's host mapping, which stays mapped while this reference exists (the slot is
    /// released only in our Drop).
    host: SendSyncPtr<u8>,
    device: u64,
    size: u64,
}

// SAFETY: `host` maps the whole slot (`size` bytes), which stays mapped until our Drop releases
// it; a slot is lent to one `ArenaChunkRef` at a time (taken out of `free` when lent, put back
// only in Drop); the values never change.
unsafe impl ChunkMemory for ArenaChunkRef {
    fn host_ptr(&self) -> *mut u8 {
        self.host.get()
    }
    fn device_ptr(&self) -> Option<u64> {
        Some(self.device)
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn flush_ranges(&self, ranges: &[(u64, u64)]) -> Result<()> {
        let s = self.state.lock();
        s.arena.chunks[self.slot]
            .memory
            .flush_ranges(ranges.iter().copied())
    }
    fn invalidate_ranges(&self, ranges: &[(u64, u64)]) -> Result<()> {
        let s = self.state.lock();
        s.arena.chunks[self.slot]
            .memory
            .invalidate_ranges(ranges.iter().copied())
    }
    fn read_dma(&self, offset: u64, dst: &mut [u8]) -> Option<Result<()>> {
        if dst.len() < DMA_READ_THRESHOLD {
            return None;
        }
        let gpu = self.state.lock().arena.gpu.clone();
        // SAFETY: the range lies inside this mapped chunk (the caller bounds-checked it).
        Some(unsafe { gpu.memcpy_dtoh(dst, self.device + offset) })
    }
}

impl Drop for ArenaChunkRef {
    fn drop(&mut self) {
        self.state.lock().release(self.slot);
    }
}

// SAFETY: every chunk is one whole arena slot of the arena's chunk size, at least `size` (checked
// below), lent to one chunk at a time; the atom is the device's nonCoherentAtomSize.
unsafe impl ChunkSource for ArenaSource {
    fn allocate_chunk(&self, size: u64) -> Result<Box<dyn ChunkMemory>> {
        let mut s = self.state.lock();
        let chunk = s.arena.layout.chunk_size;
        if size > chunk {
            return Err(Error::invalid(format!(
                "{size}-byte chunk requested from an arena of {chunk}-byte chunks"
            )));
        }
        let slot = match s.free.pop_first() {
            Some(slot) => slot,
            None => {
                // A full reservation is already the pool's "out of memory" (side: Limit).
                s.arena.grow()?;
                s.arena.chunk_count() - 1
            }
        };
        let offset = slot as u64 * chunk;
        let host = SendSyncPtr::new(s.arena.chunks[slot].memory.as_ptr());
        Ok(Box::new(ArenaChunkRef {
            state: self.state.clone(),
            slot,
            host,
            device: s.arena.base + offset,
            size: chunk,
        }))
    }
    fn atom_size(&self) -> u64 {
        self.atom
    }
    fn is_non_coherent(&self) -> bool {
        self.non_coherent
    }
    fn device_range(&self) -> Option<(u64, u64)> {
        Some((self.device_ptr(), self.capacity()))
    }
}

impl Pool {
    /// A pool whose blocks all lie in one contiguous, growable device range (a CUDA VMM
    /// [`Arena`] reserving `reserve` bytes, mapped in `chunk_size` chunks, a multiple of the VMM
    /// granularity). Growing never moves a block; empty chunks at the end are unmapped.
    ///
    /// Where the device or driver lacks VMM, falls back to a pool of separate chunks with the same
    /// `config`; [`Pool::is_contiguous`] tells which one you got.
    pub fn on_arena(gpu: &Gpu, reserve: u64, chunk_size: u64, config: PoolConfig) -> Result<Pool> {
        match Arena::new(gpu, reserve, chunk_size) {
            Ok(arena) => {
                let cfg = PoolConfig {
                    chunk_size,
                    max_chunk_size: chunk_size,
                    dedicated_threshold: config.dedicated_threshold.min(chunk_size),
                    ..config
                };
                Pool::new(ArenaSource::new(arena), cfg)
            }
            Err(Error::Unsupported(_)) => Pool::new(gpu.clone(), config),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_crosses_chunks() {
        let l = ArenaLayout::new(100).unwrap();
        let v: Vec<_> = l.split(95, 210).collect();
        assert_eq!(v, vec![(0, 95, 5), (1, 0, 100), (2, 0, 100), (3, 0, 5)]);
        assert_eq!(l.split(0, 0).count(), 0);
        assert_eq!(l.locate(250), (2, 50));
        assert!(ArenaLayout::new(0).is_err());
    }
}

//! [`Arena`]: a growable, virtually contiguous device range over BAR-mapped chunks (CUDA VMM),
//! plus VMM feature detection and granularity.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::core::handle::{assert_send_sync, SendSyncPtr};
use crate::core::range::check_range;
use crate::core::sync::lock::Mutex;
use crate::driver::vulkan::VulkanMemory;
use crate::error::{Error, InvalidArgument, MemorySide, Result};
use crate::mapping::chunk::{ChunkMemory, ChunkSource};
use crate::mapping::gpu::Gpu;
use crate::mapping::release::{ReleaseKey, ReleaseQueue, DUE_SOON};
pub use crate::mapping::vmm::granularity;
use crate::mapping::vmm::{AddressRange, VmmDevice, VmmHandle};

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
            return Err(InvalidArgument::ArenaChunkSizeZero.into());
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
    // Drop order: the handle (released once unmapped), then the Vulkan memory it imports.
    handle: VmmHandle,
    memory: VulkanMemory,
}

/// Slots whose chunk is on its way out (unmapped once the GPU work queued before it is done):
/// not mapped again before then.
type Releasing = Arc<Mutex<BTreeSet<usize>>>;

/// A chunk taken out of an arena, in the release queue until the GPU work queued before it is
/// done; dropping it unmaps it, releases its handle and frees its memory, never waiting. It
/// keeps the arena's address range, which is freed when the last of them and the arena are gone.
struct ReleasedChunk {
    vmm: VmmDevice,
    va: u64,
    size: u64,
    slot: usize,
    releasing: Releasing,
    chunk: Option<ArenaChunk>,
    _range: Arc<AddressRange>,
}

impl Drop for ReleasedChunk {
    fn drop(&mut self) {
        // SAFETY: the chunk is mapped at `va` with its full size, and the GPU work that could
        // use it is done (the release queue's fence).
        let _ = unsafe { self.vmm.driver().cu_mem_unmap(self.va, self.size as usize) };
        drop(self.chunk.take());
        self.releasing.lock().remove(&self.slot);
    }
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
/// Nothing waits for running kernels: growing maps at once; shrinking and dropping unmap a chunk
/// once the GPU work queued before them is done (as raw memory is released), and a slot being
/// released is not mapped again before that.
///
/// `Send + Sync` by its fields: CUDA handles and device addresses are process-wide values, the
/// chunks' mappings are written only through `&mut self`, and `&self` methods only read through
/// them or return addresses.
pub struct Arena {
    gpu: Gpu,
    vmm: VmmDevice,
    range: Arc<AddressRange>,
    layout: ArenaLayout,
    chunks: Vec<ArenaChunk>,
    /// Whether chunk 0 is mapped a second time right after the last chunk.
    mirrored: bool,
    releasing: Releasing,
}
// `Send + Sync` by its fields, as the compiler checks here.
const _: () = assert_send_sync::<Arena>();

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("base", &format_args!("{:#x}", self.range.va()))
            .field("reserved", &self.range.size())
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
        let vmm = match gpu.vmm_status() {
            Ok(_) => gpu
                .vmm()
                .cloned()
                .ok_or_else(|| Error::internal("VMM state"))?,
            Err(why) => return Err(Error::Unsupported(format!("no CUDA VMM: {why}"))),
        };
        let g = vmm.granularity();
        if chunk_size == 0 || !chunk_size.is_multiple_of(g) {
            return Err(InvalidArgument::ArenaChunkSize {
                chunk_size,
                granularity: g,
            }
            .into());
        }
        if reserve == 0 || !reserve.is_multiple_of(chunk_size) {
            return Err(InvalidArgument::ArenaReservation {
                reserve,
                chunk_size,
            }
            .into());
        }
        let range = Arc::new(vmm.reserve(reserve)?);
        Ok(Arena {
            gpu: gpu.clone(),
            vmm,
            range,
            layout: ArenaLayout { chunk_size },
            chunks: Vec::new(),
            mirrored: false,
            releasing: Arc::default(),
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
            .ok_or(InvalidArgument::MirrorOfEmptyArena)?;
        if self.len() + size > self.range.size() {
            return Err(InvalidArgument::NoRoomForMirror.into());
        }
        if !self.slot_is_free(self.chunks.len()) {
            return Err(Error::OutOfDeviceMemory {
                side: MemorySide::Limit,
                call: "Arena::map_mirror",
                size,
                result: "the slot after the last chunk is still being released".into(),
            });
        }
        let at = self.range.va() + self.len();
        // SAFETY: the slot right after the last chunk lies in the reservation (checked above)
        // and is unmapped (growing is refused while mirrored); chunk 0's handle stays alive
        // while the mirror exists (it is unmapped before any chunk goes).
        unsafe { self.vmm.map_at(at, size, &first.handle) }?;
        self.mirrored = true;
        Ok(())
    }

    /// Removes the mirror mapping made by [`Arena::map_mirror`], at once: no kernel may be
    /// reading across the wrap any more.
    pub fn unmap_mirror(&mut self) -> Result<()> {
        if !self.mirrored {
            return Ok(());
        }
        let at = self.range.va() + self.len();
        // SAFETY: the mirror is mapped at `at` with one chunk's size.
        unsafe {
            self.vmm
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
        self.range.va()
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
        self.range.size()
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
    /// [`Error::OutOfDeviceMemory`]: `side: Limit` past the reservation or while the slot's
    /// previous chunk is still being released (GPU work queued before the shrink is not done), a
    /// driver side when the BAR is full; with [`Error::InvalidArgument`] while mirrored. The
    /// arena is unchanged on any error.
    pub fn grow(&mut self) -> Result<u64> {
        if self.mirrored {
            return Err(InvalidArgument::ArenaIsMirrored {
                operation: "growing",
            }
            .into());
        }
        let size = self.layout.chunk_size;
        let limit = |result: String| Error::OutOfDeviceMemory {
            side: MemorySide::Limit,
            call: "Arena::grow",
            size,
            result,
        };
        if self.len() + size > self.range.size() {
            return Err(limit(format!(
                "the arena's {}-byte reservation is full",
                self.range.size()
            )));
        }
        let slot = self.chunks.len();
        if !self.slot_is_free(slot) {
            return Err(limit(format!(
                "slot {slot} is still being released (GPU work queued before it is not done)"
            )));
        }
        let memory = self
            .gpu
            .retry_after_releases(|| self.gpu.vulkan().allocate(size))?;
        let handle = self.vmm.import(&memory)?;
        // SAFETY: the slot lies in the reservation (checked above) and is unmapped (the last
        // chunk ends before it, and no release of it is pending); the handle is exactly one
        // chunk and is kept with the chunk while mapped.
        unsafe { self.vmm.map_at(self.range.va() + self.len(), size, &handle) }?;
        self.chunks.push(ArenaChunk { handle, memory });
        Ok(self.len())
    }

    /// Whether no release of `slot`'s earlier chunk is pending, releasing the arena's own chunks
    /// whose GPU work is done first, ahead of other releases in the queue (for up to
    /// [`DUE_SOON`]; a running kernel's work is not waited for).
    fn slot_is_free(&self, slot: usize) -> bool {
        ReleaseQueue::global().poll_until(DUE_SOON, ReleaseKey::of(&self.releasing), || {
            !self.releasing.lock().contains(&slot)
        })
    }

    /// Takes the last `n` chunks (at most all of them) out of the arena. Returns the new length.
    ///
    /// Taking `&mut self` guarantees no host borrow into those chunks survives. Never waits: each
    /// chunk is unmapped and freed once the GPU work queued before now is done; kernels on
    /// non-blocking streams must have stopped using it.
    pub fn shrink(&mut self, n: usize) -> Result<u64> {
        if self.mirrored {
            return Err(InvalidArgument::ArenaIsMirrored {
                operation: "shrinking",
            }
            .into());
        }
        let n = n.min(self.chunks.len());
        for _ in 0..n {
            let chunk = self.chunks.pop().expect("counted above");
            let slot = self.chunks.len();
            self.releasing.lock().insert(slot);
            let released = ReleasedChunk {
                vmm: self.vmm.clone(),
                va: self.range.va() + self.len(),
                size: self.layout.chunk_size,
                slot,
                releasing: self.releasing.clone(),
                chunk: Some(chunk),
                _range: self.range.clone(),
            };
            self.gpu
                .release_after_queued_work(released, None, ReleaseKey::of(&self.releasing));
        }
        Ok(self.len())
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
    /// Never waits: the chunks go through the release queue, and the address range is freed
    /// after the last of them.
    fn drop(&mut self) {
        let _ = self.unmap_mirror();
        let _ = self.shrink(usize::MAX);
    }
}

/// A [`ChunkSource`] that hands out the chunks of one [`Arena`], so a
/// [`Pool`](crate::Pool) built on it keeps every block inside one contiguous device range and
/// growing never moves a block.
///
/// Every chunk is the arena's chunk size (set the pool's `chunk_size` and `max_chunk_size` to it,
/// and its `dedicated_threshold` at most to it: [`Pool::on_arena`](crate::Pool::on_arena) does).
/// A released chunk in the middle stays mapped and is reused first; trailing released chunks are
/// unmapped and freed at once, so the arena shrinks from the end.
pub struct ArenaSource {
    state: Arc<crate::core::sync::lock::Mutex<ArenaSlots>>,
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
            // Never fails for an arena that is not mirrored (a pool's never is).
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
            state: Arc::new(crate::core::sync::lock::Mutex::new(ArenaSlots {
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
    state: Arc<crate::core::sync::lock::Mutex<ArenaSlots>>,
    slot: usize,
    /// The slot's host mapping, which stays mapped while this reference exists (the slot is
    /// released only in our Drop).
    host: SendSyncPtr<u8>,
    device: u64,
    size: u64,
    /// The arena's device, whose copy engine serves large reads (held here so that a read
    /// takes no lock).
    gpu: Gpu,
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
        // SAFETY: the range lies inside this mapped chunk (the caller bounds-checked it), a VMM
        // mapping of the device, mapped while this reference lives.
        unsafe { self.gpu.read_by_size(dst, self.device + offset) }
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
            return Err(InvalidArgument::ArenaChunkRequest {
                size,
                chunk_size: chunk,
            }
            .into());
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
            device: s.arena.device_ptr() + offset,
            size: chunk,
            gpu: s.arena.gpu.clone(),
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

//! Raw allocations smaller than a VMM granule share granules.
//!
//! VMM maps whole handles of a granule (2 MiB on the H100) or more, so a 4 KiB raw allocation
//! mapped on its own would hold 512 times its size of the BAR. Instead, requests of up to
//! [`CARVE_MAX`] bytes are carved, 4 KiB aligned, out of granule-sized chunks by the pure
//! allocator core ([`crate::alloc`]); each piece keeps its chunk alive. A piece goes back to its
//! chunk only after its release fence has passed (the piece is the value the release drops), so
//! a piece is never handed out again while GPU work queued before its free may still use it.
//! One empty chunk is kept for the next small allocation; the rest go back at once.

use std::sync::Arc;

use crate::core::alloc::{AllocError, Allocation, Heap, HeapConfig};
use crate::core::sync::lock::Mutex;
use crate::driver::vulkan::VulkanContext;
use crate::error::{Error, Result};
use crate::mapping::vmm::{MappedMemory, VmmDevice};

/// Raw allocations of at most this many bytes share granules; larger ones map their own.
pub const CARVE_MAX: u64 = 1 << 20;

/// Alignment and size granule of the pieces (the page size, as Vulkan rounds allocations).
const PAGE: u64 = 4096;

/// Granule-sized chunks of BAR memory and the heap that carves them.
pub(crate) struct Carver {
    device: VmmDevice,
    vulkan: Arc<VulkanContext>,
    state: Mutex<State>,
}

struct State {
    heap: Heap,
    /// The chunk of each `ChunkId` (indexed by its number; `None` for removed ids).
    chunks: Vec<Option<Arc<MappedMemory>>>,
}

impl Carver {
    pub(crate) fn new(device: VmmDevice, vulkan: Arc<VulkanContext>) -> Result<Arc<Carver>> {
        let heap = Heap::new(HeapConfig {
            max_slab_size: 0,
            min_align: PAGE,
            max_align: PAGE,
            ..HeapConfig::default()
        })
        .map_err(|e| Error::internal(format!("carver heap: {e}")))?;
        Ok(Arc::new(Carver {
            device,
            vulkan,
            state: Mutex::new(State {
                heap,
                chunks: Vec::new(),
            }),
        }))
    }

    /// Carves `size` bytes (a multiple of 4 KiB, at most [`CARVE_MAX`]), adding a chunk when none
    /// has room. The chunk is made outside the lock (it costs ~0.6 ms), so other threads' small
    /// allocations go on meanwhile.
    pub(crate) fn alloc(self: &Arc<Self>, size: u64) -> Result<Piece> {
        debug_assert!(size.is_multiple_of(PAGE) && size <= CARVE_MAX);
        loop {
            {
                let mut state = self.state.lock();
                match state.heap.alloc(size, PAGE) {
                    Ok(a) => {
                        let chunk = state.chunks[a.chunk().0 as usize]
                            .clone()
                            .ok_or_else(|| Error::internal("carved from a removed chunk"))?;
                        return Ok(Piece {
                            carver: self.clone(),
                            chunk,
                            allocation: Some(a),
                        });
                    }
                    Err(AllocError::OutOfSpace { .. }) => {}
                    Err(e) => return Err(Error::internal(format!("carver: {e}"))),
                }
            }
            let chunk = Arc::new(MappedMemory::bar(
                &self.device,
                &self.vulkan,
                self.device.granularity(),
            )?);
            let mut state = self.state.lock();
            let id = state
                .heap
                .add_chunk(chunk.size())
                .map_err(|e| Error::internal(format!("carver: {e}")))?;
            let i = id.0 as usize;
            if state.chunks.len() <= i {
                state.chunks.resize(i + 1, None);
            }
            state.chunks[i] = Some(chunk);
        }
    }

    /// Returns a piece's space; an emptied chunk goes back to the driver unless it is the only
    /// empty one.
    fn free(&self, allocation: Allocation) {
        let released = {
            let mut state = self.state.lock();
            let id = allocation.chunk();
            if state.heap.free(allocation).is_err() {
                return;
            }
            let empty = state.heap.empty_chunks().count();
            if empty > 1 && state.heap.chunk_allocations(id) == Some(0) {
                remove(&mut state, id)
            } else {
                None
            }
        };
        // The chunk unmaps outside the lock.
        drop(released);
    }

    /// The chunks held now (empty ones included) and their bytes.
    pub(crate) fn held(&self) -> (u64, u64) {
        let state = self.state.lock();
        state
            .chunks
            .iter()
            .flatten()
            .fold((0, 0), |(n, bytes), c| (n + 1, bytes + c.size()))
    }

    /// Gives every empty chunk back to the driver; returns how many.
    pub(crate) fn trim(&self) -> usize {
        let released: Vec<_> = {
            let mut state = self.state.lock();
            let empty: Vec<_> = state.heap.empty_chunks().collect();
            empty
                .into_iter()
                .filter_map(|id| remove(&mut state, id))
                .collect()
        };
        released.len()
    }
}

/// Unregisters an empty chunk and hands it back to drop outside the lock.
fn remove(state: &mut State, id: crate::core::alloc::ChunkId) -> Option<Arc<MappedMemory>> {
    state.heap.remove_chunk(id).ok()?;
    state.chunks.get_mut(id.0 as usize)?.take()
}

/// One carved piece: `size()` bytes of a shared chunk, 4 KiB aligned on both sides. Dropping it
/// gives the space back at once (its owner drops it only after its release fence).
pub(crate) struct Piece {
    carver: Arc<Carver>,
    chunk: Arc<MappedMemory>,
    /// `None` only after `Drop` took it.
    allocation: Option<Allocation>,
}

impl Piece {
    fn offset(&self) -> u64 {
        self.allocation.as_ref().map_or(0, Allocation::offset)
    }

    pub(crate) fn host_ptr(&self) -> *mut u8 {
        // SAFETY: the piece lies inside the chunk's mapping (the heap carves within chunk sizes).
        unsafe { self.chunk.host_ptr().add(self.offset() as usize) }
    }

    pub(crate) fn device_ptr(&self) -> u64 {
        self.chunk.device_ptr() + self.offset()
    }

    /// Gives device `ordinal` access to the whole granule the piece lies in (access is set per
    /// mapping): to its neighbours too, now and later.
    pub(crate) fn grant_access(&self, ordinal: std::ffi::c_int) -> Result<()> {
        self.chunk.grant_access(ordinal)
    }

    /// The chunk's Vulkan memory and where in it the piece starts (for flushes).
    pub(crate) fn memory(&self) -> (&crate::driver::vulkan::VulkanMemory, u64) {
        (self.chunk.memory(), self.offset())
    }
}

impl Drop for Piece {
    fn drop(&mut self) {
        if let Some(a) = self.allocation.take() {
            self.carver.free(a);
        }
    }
}

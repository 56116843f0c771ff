//! [`Block`]: one allocation of a pool, with safe, bounds-checked access through [`Mapping`].

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[cfg(feature = "gpu-alloc")]
use super::gpu_alloc::MemoryBlock;
use super::shards::{Chunk, ShardCell};
use super::{magazine, PoolInner};
use crate::alloc::Allocation;
#[cfg(doc)]
use crate::chunk::ChunkMemory;
use crate::error::Result;
use crate::mapping::Mapping;
use crate::range::check_range;

/// What a block holds to keep its memory alive, and how it gives it back.
pub(super) enum BlockKind {
    Shared {
        /// The cell this block counts in (`Shard::outstanding`).
        shard: NonNull<ShardCell>,
        /// Points into `shard`'s chunk table; valid while `allocation` is live (see
        /// `ShardSet::alloc`).
        chunk: *const Chunk,
        allocation: Option<Allocation>,
    },
    Dedicated {
        pool: Arc<PoolInner>,
        chunk: Arc<Chunk>,
    },
    #[cfg(feature = "gpu-alloc")]
    GpuAlloc {
        pool: Arc<PoolInner>,
        block: Option<MemoryBlock<Arc<Chunk>>>,
    },
}

/// A block of pool memory: host pointer, device pointer, size. Freed when dropped.
///
/// A block keeps the memory behind it alive (its shard and chunk, or its dedicated chunk), so it can
/// never dangle, even if the [`Pool`](super::Pool) handle is dropped first. Safe writes ([`Mapping::write`] and
/// friends) record dirty ranges on non-coherent memory; [`Block::flush`] pushes them. Safe reads
/// invalidate first.
pub struct Block {
    kind: BlockKind,
    host_ptr: *mut u8,
    device_ptr: Option<u64>,
    offset: u64,
    len: u64,
    non_coherent: bool,
}

// SAFETY: a block exclusively owns its byte range of the chunk; the chunk, shard and pool are
// Sync (the raw chunk pointer refers to a chunk kept alive as described in `BlockKind`).
unsafe impl Send for Block {}
// SAFETY: `&self` methods only read the range (after an invalidate) or return addresses.
unsafe impl Sync for Block {}

impl fmt::Debug for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Block")
            .field("len", &self.len)
            .field("host_ptr", &self.host_ptr)
            .field("device_ptr", &self.device_ptr.map(|p| format!("{p:#x}")))
            .field("dedicated", &self.is_dedicated())
            .finish()
    }
}

impl Block {
    #[inline]
    pub(super) fn new(
        chunk: &Chunk,
        offset: u64,
        len: u64,
        non_coherent: bool,
        kind: BlockKind,
    ) -> Block {
        Block {
            // SAFETY: the allocator guarantees offset + len <= chunk size, so the pointer stays
            // inside the chunk's mapping.
            host_ptr: unsafe { chunk.host_base.get().add(offset as usize) },
            device_ptr: chunk.device_base.map(|p| p + offset),
            offset,
            len,
            non_coherent,
            kind,
        }
    }

    /// A block of `len` requested bytes over a shard allocation and the reference it counts on
    /// its cell (from [`ShardSet::alloc`](super::shards::ShardSet::alloc)).
    #[inline]
    pub(super) fn shared(
        cell: NonNull<ShardCell>,
        chunk: *const Chunk,
        allocation: Allocation,
        len: u64,
        non_coherent: bool,
    ) -> Block {
        // SAFETY: the chunk stays in its shard's table while it holds a live allocation (chunks
        // are removed only when empty), and the counted reference on `cell` keeps the shard, and
        // so the table, alive.
        let chunk_ref = unsafe { &*chunk };
        if len != allocation.requested_size() {
            // SAFETY: the counted reference keeps the cell alive; `pool` is never changed.
            let pool = unsafe { &cell.as_ref().pool };
            pool.adjust_size_delta(len, &allocation, 1);
        }
        Block::new(
            chunk_ref,
            allocation.offset(),
            len,
            non_coherent,
            BlockKind::Shared {
                shard: cell,
                chunk,
                allocation: Some(allocation),
            },
        )
    }

    /// A block over a thread-cache entry, `len` requested bytes.
    #[inline]
    pub(super) fn cached(c: magazine::Cached, len: u64, non_coherent: bool) -> Block {
        Block::shared(c.cell, c.chunk, c.allocation, len, non_coherent)
    }

    fn chunk(&self) -> &Chunk {
        match &self.kind {
            // SAFETY: see `BlockKind::Shared`: the chunk outlives the live allocation we hold.
            BlockKind::Shared { chunk, .. } => unsafe { &**chunk },
            BlockKind::Dedicated { chunk, .. } => chunk,
            #[cfg(feature = "gpu-alloc")]
            BlockKind::GpuAlloc { block, .. } => block.as_ref().expect("live until drop").memory(),
        }
    }

    /// The requested size in bytes.
    pub fn size(&self) -> u64 {
        self.len
    }

    /// Host address of the block.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host_ptr
    }

    /// Device address of the block (`None` for pools over Vulkan-only or host chunks).
    pub fn device_ptr(&self) -> Option<u64> {
        self.device_ptr
    }

    /// Offset of the block inside its chunk.
    pub fn offset_in_chunk(&self) -> u64 {
        self.offset
    }

    /// Whether this block has a chunk of its own (large requests).
    pub fn is_dedicated(&self) -> bool {
        matches!(self.kind, BlockKind::Dedicated { .. })
    }

    /// Pushes the chunk's recorded dirty ranges (this block's and its neighbours') to the device in
    /// one call. A no-op on coherent memory.
    pub fn flush(&self) -> Result<()> {
        if !self.non_coherent {
            return Ok(());
        }
        self.chunk().flush(&mut Vec::new())
    }

    /// Whether writes to this block are waiting for a flush.
    pub fn has_pending_writes(&self) -> bool {
        self.non_coherent && self.chunk().dirty.lock().intersects(self.offset, self.len)
    }
}

impl Mapping for Block {
    /// Bounds-checked read; the chunk decides whether its DMA engine serves it
    /// ([`ChunkMemory::read_dma`]: CUDA chunks use `cuMemcpyDtoH` for large reads), otherwise CPU
    /// loads after an invalidate.
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len() as u64, self.len)?;
        let chunk = self.chunk();
        // Pending CPU writes must reach the device before a copy engine reads them (the CPU path
        // would push them before its invalidate anyway).
        if self.non_coherent
            && chunk
                .dirty
                .lock()
                .intersects(self.offset + offset, dst.len() as u64)
        {
            chunk.flush(&mut Vec::new())?;
        }
        if let Some(r) = chunk.memory.read_dma(self.offset + offset, dst) {
            return r;
        }
        crate::mapping::read_with_cpu(self, offset, dst)
    }
    fn host_ptr(&self) -> *mut u8 {
        self.host_ptr
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn after_write(&mut self, offset: u64, len: u64) -> Result<()> {
        if self.non_coherent && len > 0 {
            check_range(offset, len, self.len)?;
            self.chunk().dirty.lock().mark(self.offset + offset, len)?;
        }
        Ok(())
    }
    /// Makes device writes in `[offset, offset + len)` of the block visible to the CPU.
    /// The range is checked against the block first (an error, not a stray invalidate of a
    /// neighbour's atoms), as in [`after_write`](Mapping::after_write).
    fn before_read(&self, offset: u64, len: u64) -> Result<()> {
        check_range(offset, len, self.len)?;
        if self.non_coherent && len > 0 {
            let chunk = self.chunk();
            // Invalidating would discard this block's own unflushed writes: push them first.
            if chunk.dirty.lock().intersects(self.offset, self.len) {
                chunk.flush(&mut Vec::new())?;
            }
            chunk
                .memory
                .invalidate_ranges(&[(self.offset + offset, len)])?;
        }
        Ok(())
    }
}

impl Drop for Block {
    #[inline]
    fn drop(&mut self) {
        if let BlockKind::Shared {
            shard,
            chunk,
            allocation,
        } = &mut self.kind
        {
            if let Some(a) = allocation.take() {
                // SAFETY: our reference keeps the cell alive; `pool` is never changed.
                let pool = unsafe { &shard.as_ref().pool };
                if self.len != a.requested_size() {
                    pool.adjust_size_delta(self.len, &a, -1);
                }
                let entry = magazine::Cached {
                    cell: *shard,
                    chunk: *chunk,
                    allocation: a,
                };
                let entry = if pool.cache_enabled && !pool.dropped.load(Ordering::Relaxed) {
                    magazine::offer(pool.id, entry)
                } else {
                    Some(entry)
                };
                if let Some(e) = entry {
                    // SAFETY: the block's reference on its cell is used here for the last time
                    // (a cached entry takes it over instead).
                    unsafe { ShardCell::free(e.cell, e.allocation) };
                }
            }
        } else {
            self.drop_unshared();
        }
    }
}

impl Block {
    #[cold]
    fn drop_unshared(&mut self) {
        match &mut self.kind {
            BlockKind::Shared { .. } => {}
            #[cfg(feature = "gpu-alloc")]
            BlockKind::GpuAlloc { pool, block } => {
                if let (Some(b), Some(ga)) = (block.take(), &pool.gpu_alloc) {
                    ga.free(&pool.chunk_device(), b);
                }
            }
            BlockKind::Dedicated { pool, chunk } => {
                pool.dedicated.fetch_sub(1, Ordering::Relaxed);
                pool.reserved
                    .fetch_sub(chunk.memory.size(), Ordering::AcqRel);
                // The chunk memory itself is freed when `chunk` (its only Arc) drops.
            }
        }
    }
}

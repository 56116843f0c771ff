//! [`Block`]: one allocation of a pool, with safe, bounds-checked access through [`Mapping`].

use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::chunk::Chunk;
use super::inner::PoolInner;
use super::lent::{Lender, LentBlock, RefusedReason};
use super::magazine;
use super::shards::{BlockKind, BlockRecord, ShardCell, NOT_CACHED};
use crate::core::range::check_range;
use crate::core::ring::d2h::ReleaseToken;
use crate::error::Result;
#[cfg(doc)]
use crate::mapping::chunk::ChunkMemory;
use crate::mapping::release::ReleaseKey;
use crate::mapping::Mapping;

/// A block of pool memory: host pointer, device pointer, size. Freed when dropped.
///
/// A block keeps the memory behind it alive (its shard and chunk, or its dedicated chunk), so it can
/// never dangle, even if the [`Pool`](super::Pool) handle is dropped first. Safe writes ([`Mapping::write`] and
/// friends) record dirty ranges on non-coherent memory; [`Block::flush`] pushes them. Safe reads
/// invalidate first.
///
/// A block is one pointer wide: returning it, moving it and keeping it in a `Vec` move eight bytes.
pub struct Block {
    /// Taken out by `drop` only, so never seen taken.
    record: ManuallyDrop<Box<BlockRecord>>,
}

// The hot paths rely on it: a wider block is copied by the caller's code in pieces that need not
// match the stores that built it, and such a copy waits for those stores to reach the cache.
const _: () = assert!(std::mem::size_of::<Block>() == std::mem::size_of::<usize>());

// SAFETY: a block exclusively owns its byte range of the chunk; the chunk, shard and pool are
// Sync (the record's raw pointers refer to memory kept alive as described in `BlockKind`).
unsafe impl Send for Block {}
// SAFETY: `&self` methods only read the range (after an invalidate) or return addresses.
unsafe impl Sync for Block {}

impl fmt::Debug for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Block")
            .field("len", &self.record.len)
            .field("host_ptr", &self.record.host_ptr)
            .field("device_ptr", &self.device_ptr().map(|p| format!("{p:#x}")))
            .field("dedicated", &self.is_dedicated())
            .field("label", &self.label())
            .finish()
    }
}

impl Block {
    /// A block over `[offset, offset + len)` of `chunk`, kept alive by `kind` (dedicated and
    /// gpu-alloc blocks; shared ones come recorded from their shard or a thread cache).
    pub(super) fn new(
        chunk: &Chunk,
        offset: u64,
        len: u64,
        non_coherent: bool,
        kind: BlockKind,
    ) -> Block {
        Block {
            record: ManuallyDrop::new(Box::new(BlockRecord {
                // SAFETY: the allocator guarantees offset + len <= chunk size, so the pointer
                // stays inside the chunk's mapping.
                host_ptr: unsafe { chunk.host_base.get().add(offset as usize) },
                len,
                non_coherent,
                labeled: false,
                kind: ManuallyDrop::new(kind),
                cache_next: None,
            })),
        }
    }

    /// A block of `len` requested bytes over a shared record: one from
    /// [`ShardSet::alloc`](super::shards::ShardSet::alloc), or one a thread cache kept (which
    /// may have served a neighbour size of its bucket).
    #[inline(always)]
    pub(super) fn shared(mut record: Box<BlockRecord>, len: u64) -> Block {
        if let Some(hold) = record.hold() {
            if len != hold.allocation.requested_size() {
                // SAFETY: the counted reference keeps the cell alive; `pool` is never changed.
                let pool = unsafe { &hold.cell.as_ref().pool };
                pool.adjust_size_delta(len, &hold.allocation, 1);
            }
        }
        if record.len != len {
            // Stored only when it changes: a record reused for its own size (the steady state
            // of a thread cache) is not written at all, so it never costs a cache line's
            // ownership, even one shared with another thread's record.
            record.len = len;
        }
        Block {
            record: ManuallyDrop::new(record),
        }
    }

    /// The block of a record its shard has just made for it
    /// ([`ShardSet::alloc`](super::shards::ShardSet::alloc)): the record holds the block's
    /// length already, and its allocation the size the block accounts for (the length rounded
    /// to whole atoms on non-coherent memory), so [`shared`](Self::shared) would find nothing
    /// to change.
    #[inline(always)]
    pub(super) fn fresh(record: Box<BlockRecord>) -> Block {
        Block {
            record: ManuallyDrop::new(record),
        }
    }

    /// The chunk the block lies in.
    fn chunk(&self) -> &Chunk {
        self.record.chunk()
    }

    /// Offset of the block inside its chunk.
    fn offset(&self) -> u64 {
        self.record.offset()
    }

    /// The requested size in bytes.
    pub fn size(&self) -> u64 {
        self.record.len
    }

    /// Host address of the block.
    pub fn host_ptr(&self) -> *mut u8 {
        self.record.host_ptr
    }

    /// Device address of the block (`None` for pools over Vulkan-only or host chunks).
    pub fn device_ptr(&self) -> Option<u64> {
        let offset = self.offset();
        self.chunk().device_base.map(|base| base + offset)
    }

    /// Offset of the block inside its chunk.
    pub fn offset_in_chunk(&self) -> u64 {
        self.offset()
    }

    /// The number of the chunk the block lies in: unique among every chunk this process has
    /// had, so two blocks with the same number share a chunk (the sharing layer sends a chunk's
    /// fd once per peer).
    pub fn chunk_serial(&self) -> u64 {
        self.chunk().serial
    }

    /// Size of the chunk the block lies in.
    pub fn chunk_size(&self) -> u64 {
        self.chunk().memory.size()
    }

    /// A new opaque fd of the chunk the block lies in, and the size of the allocation behind it,
    /// for another process to import ([`ChunkMemory::export_fd`]; the [`share`](crate::share)
    /// layer sends it). The fd reaches the whole chunk, this block's neighbours included.
    /// [`Error::Unsupported`](crate::Error::Unsupported) for chunks that cannot be exported.
    pub fn export_chunk_fd(&self) -> Result<(std::os::fd::OwnedFd, u64)> {
        self.chunk().memory.export_fd().unwrap_or_else(|| {
            Err(crate::error::Error::Unsupported(
                "this pool's chunks cannot be exported (host memory or an arena)".into(),
            ))
        })
    }

    /// Lets kernels on `peer`, another GPU of this process, read and write this block through
    /// [`device_ptr`](Self::device_ptr). Access is granted per mapping, so it covers the whole
    /// chunk the block lies in (its neighbours too), for as long as the chunk lives; a block in a
    /// chunk the pool makes later needs a grant of its own (granting again is harmless). See
    /// [`RawMemory::grant_peer_access`](crate::RawMemory::grant_peer_access) for the errors, and
    /// for what freeing waits for (this device's work, not `peer`'s). Chunks that cannot be
    /// shared (a Vulkan-only pool's, an arena's) are [`Error::Unsupported`](crate::Error).
    pub fn grant_peer_access(&self, peer: &crate::mapping::gpu::Gpu) -> Result<()> {
        self.chunk().memory.grant_peer_access(peer)
    }

    /// Whether this block has a chunk of its own (large requests).
    pub fn is_dedicated(&self) -> bool {
        matches!(*self.record.kind, BlockKind::Dedicated { .. })
    }

    /// The pool state this block belongs to.
    fn pool(&self) -> &PoolInner {
        self.record.pool()
    }

    /// The block's key in the pool's label registry.
    fn label_key(&self) -> (super::registry::ChunkKey, u64) {
        self.record.label_key()
    }

    /// Labels the block for [`Pool::report`](super::Pool::report) (and the leak warning of the
    /// `log` feature), replacing any earlier label. The label lives in the pool, not in the
    /// block: unlabeled blocks pay nothing for the feature.
    pub fn set_label(&mut self, label: &str) {
        let entry = super::registry::LabelEntry {
            label: label.into(),
            size: self.record.len,
        };
        let key = self.label_key();
        self.pool().registry.labels.lock().insert(key, entry);
        self.record.labeled = true;
    }

    /// The block's label, if it has one.
    pub fn label(&self) -> Option<Arc<str>> {
        if !self.record.labeled {
            return None;
        }
        let key = self.label_key();
        let labels = self.pool().registry.labels.lock();
        labels.get(&key).map(|e| e.label.clone())
    }

    /// Pushes the chunk's recorded dirty ranges (this block's and its neighbours') to the device in
    /// one call. A no-op on coherent memory.
    pub fn flush(&self) -> Result<()> {
        if !self.record.non_coherent {
            return Ok(());
        }
        self.chunk().flush(&mut Vec::new())
    }

    /// Records that `[offset, offset + len)` of the block was written through
    /// [`host_ptr`](Block::host_ptr) rather than the safe [`Mapping`] writes (which record it
    /// themselves), so the next [`Block::flush`] or [`Pool::flush`](super::Pool::flush) pushes
    /// it. For raw-pointer writers such as the C library; on coherent memory only the bounds
    /// check.
    pub fn mark_written(&self, offset: u64, len: u64) -> Result<()> {
        check_range(offset, len, self.record.len)?;
        if self.record.non_coherent && len > 0 {
            self.chunk()
                .dirty
                .lock()
                .mark(self.offset() + offset, len)?;
        }
        Ok(())
    }

    /// Records `[offset, offset + len)` like [`mark_written`](Self::mark_written), then pushes
    /// every recorded range of the block's chunk to the device in one call, like
    /// [`flush`](Self::flush): what makes writes through [`host_ptr`](Block::host_ptr) visible to
    /// kernels launched afterwards. On coherent memory only the bounds check.
    pub fn flush_range(&self, offset: u64, len: u64) -> Result<()> {
        self.mark_written(offset, len)?;
        self.flush()
    }

    /// [`Mapping::write`] through a shared reference: the same bounds check and copy (inline
    /// when short, split over the global copy pool when long, fenced), and the range recorded
    /// for [`Block::flush`] or [`Pool::flush`](super::Pool::flush) on non-coherent memory. For
    /// callers that keep writers of the same bytes apart themselves, as the C library's callers
    /// promise to.
    ///
    /// # Safety
    /// - No other thread reads or writes `[offset, offset + src.len())` of the block during the
    ///   call, through [`host_ptr`](Block::host_ptr) or otherwise, and `src` does not overlap it.
    pub unsafe fn write_shared(&self, offset: u64, src: &[u8]) -> Result<()> {
        // SAFETY: the block's `len` bytes stay mapped while it lives; the range is the caller's
        // alone for the call.
        unsafe { crate::mapping::store(self.record.host_ptr, self.record.len, offset, src) }?;
        // Recorded after the copy: a concurrent pool flush must not clear it before the bytes
        // are there.
        self.mark_written(offset, src.len() as u64)
    }

    /// Whether writes to this block are waiting for a flush.
    pub fn has_pending_writes(&self) -> bool {
        self.record.non_coherent
            && self
                .chunk()
                .dirty
                .lock()
                .intersects(self.offset(), self.record.len)
    }
}

impl BlockRecord {
    fn chunk(&self) -> &Chunk {
        match &*self.kind {
            // SAFETY: see `Hold`: the chunk outlives the live allocation we hold.
            BlockKind::Shared(h) => unsafe { &*h.chunk },
            BlockKind::Dedicated { chunk, .. } => chunk,
            #[cfg(feature = "gpu-alloc")]
            BlockKind::GpuAlloc { block, .. } => block.memory(),
        }
    }

    /// Offset of the block inside its chunk (kept where the block's memory is described, not
    /// copied into the record).
    fn offset(&self) -> u64 {
        match &*self.kind {
            BlockKind::Shared(h) => h.allocation.offset(),
            BlockKind::Dedicated { .. } => 0,
            #[cfg(feature = "gpu-alloc")]
            BlockKind::GpuAlloc { block, .. } => block.offset(),
        }
    }

    fn pool(&self) -> &PoolInner {
        match &*self.kind {
            // SAFETY: the record's counted reference keeps its cell, and so `pool`, alive.
            BlockKind::Shared(h) => unsafe { &h.cell.as_ref().pool },
            BlockKind::Dedicated { pool, .. } => pool,
            #[cfg(feature = "gpu-alloc")]
            BlockKind::GpuAlloc { pool, .. } => pool,
        }
    }

    /// The block's key in the pool's label registry: its chunk and offset.
    fn label_key(&self) -> (super::registry::ChunkKey, u64) {
        (self.chunk() as *const Chunk as usize, self.offset())
    }

    /// Removes the block's label from the registry (before the block is freed, so that another
    /// block at the same place cannot be given this one's label).
    #[cold]
    fn forget_label(&mut self) {
        let key = self.label_key();
        self.pool().registry.labels.lock().remove(&key);
        self.labeled = false;
    }
}

// SAFETY: `host_ptr` is the block's own `len`-byte range of its chunk, which the block keeps
// alive (see `BlockKind`) and which the allocator hands to no other block while this one lives;
// `&self` methods only read it (after an invalidate) or run cache maintenance.
unsafe impl Mapping for Block {
    /// Bounds-checked read; the chunk decides whether its DMA engine serves it
    /// ([`ChunkMemory::read_dma`]: CUDA chunks use `cuMemcpyDtoH` for large reads), otherwise CPU
    /// loads after an invalidate.
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len() as u64, self.record.len)?;
        let chunk = self.chunk();
        // Pending CPU writes must reach the device before a copy engine reads them (the CPU path
        // would push them before its invalidate anyway).
        if self.record.non_coherent
            && chunk
                .dirty
                .lock()
                .intersects(self.offset() + offset, dst.len() as u64)
        {
            chunk.flush(&mut Vec::new())?;
        }
        if let Some(r) = chunk.memory.read_dma(self.offset() + offset, dst) {
            return r;
        }
        crate::mapping::read_with_cpu(self, offset, dst)
    }
    fn host_ptr(&self) -> *mut u8 {
        self.record.host_ptr
    }
    fn len(&self) -> u64 {
        self.record.len
    }
    fn after_write(&mut self, offset: u64, len: u64) -> Result<()> {
        // The safe writes checked the range already: on coherent memory there is nothing to do.
        if self.record.non_coherent && len > 0 {
            self.mark_written(offset, len)?;
        }
        Ok(())
    }
    /// Makes device writes in `[offset, offset + len)` of the block visible to the CPU.
    /// The range is checked against the block first (an error, not a stray invalidate of a
    /// neighbour's atoms), as in [`after_write`](Mapping::after_write).
    fn before_read(&self, offset: u64, len: u64) -> Result<()> {
        check_range(offset, len, self.record.len)?;
        if self.record.non_coherent && len > 0 {
            let chunk = self.chunk();
            // Invalidating would discard this block's own unflushed writes: push them first.
            if chunk
                .dirty
                .lock()
                .intersects(self.offset(), self.record.len)
            {
                chunk.flush(&mut Vec::new())?;
            }
            chunk
                .memory
                .invalidate_ranges(&[(self.offset() + offset, len)])?;
        }
        Ok(())
    }
}

impl Drop for Block {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: `drop` runs once and the record is never used after it (nor dropped:
        // `ManuallyDrop`), so it is taken here, once.
        let record = unsafe { ManuallyDrop::take(&mut self.record) };
        // The common case inline (an unlabeled shared block whose size its shard recorded goes
        // to this thread's cache, record and all), everything else out of line, so the fast path
        // stays small.
        if let (false, Some(hold)) = (record.labeled, record.hold()) {
            let a = &hold.allocation;
            let (requested, size) = (a.requested_size(), a.size());
            if record.len == requested {
                let pool = hold.cache_pool;
                if pool == NOT_CACHED {
                    // SAFETY: a shared record from its shard, given up here, once.
                    return unsafe { ShardCell::free(record) };
                }
                // Offered without a look at the pool's `cache_open`: after the pool's last
                // handle is gone no magazine serves its id (its drop took every thread's slot
                // back, and only a live handle makes a magazine serve a pool), so the offer is
                // refused and `drop_slow` frees the block to its shard.
                let Some(refused) = magazine::offer::<true>(pool, requested, size, record) else {
                    return;
                };
                return drop_slow(refused);
            }
        }
        drop_slow(record);
    }
}

/// Everything `Block::drop` does not do inline: labels, size accounting, dedicated and gpu-alloc
/// blocks, and frees that the thread cache refuses.
#[inline(never)]
fn drop_slow(mut record: Box<BlockRecord>) {
    if record.labeled {
        record.forget_label();
    }
    if let Some(hold) = record.hold() {
        // SAFETY: the record's reference keeps the cell alive while the record lives; `pool` is
        // never changed. Not used once the record is gone.
        let pool = unsafe { hold.cell.as_ref() }.pool.as_ref();
        let a = &hold.allocation;
        let (requested, size, cache_pool) = (a.requested_size(), a.size(), hold.cache_pool);
        if record.len != requested {
            pool.adjust_size_delta(record.len, a, -1);
            record.len = requested;
        }
        if cache_pool != NOT_CACHED && pool.cache_open.load(Ordering::Relaxed) {
            match magazine::offer::<false>(cache_pool, requested, size, record) {
                None => return,
                Some(refused) => record = refused,
            }
        }
    }
    if record.hold().is_some() {
        // SAFETY: a shared record from its shard, given up here, once.
        unsafe { ShardCell::free(record) };
    } else {
        drop_unshared(record.into_kind());
    }
}

#[cold]
fn drop_unshared(kind: BlockKind) {
    match kind {
        // Given back to its shard by `drop_slow` (never passed here).
        BlockKind::Shared(_) => {}
        #[cfg(feature = "gpu-alloc")]
        BlockKind::GpuAlloc { pool, block } => {
            if let Some(ga) = &pool.gpu_alloc {
                ga.free(&pool.chunk_device(), block);
            }
        }
        BlockKind::Dedicated { pool, chunk } => {
            pool.dedicated.fetch_sub(1, Ordering::Relaxed);
            pool.registry
                .dedicated
                .lock()
                .remove(&(Arc::as_ptr(&chunk) as super::registry::ChunkKey));
            pool.reserved
                .fetch_sub(chunk.memory.size(), Ordering::AcqRel);
            // The chunk memory itself is freed when `chunk` (its only Arc) drops.
        }
    }
}

/// Frees blocks whose device releases arrived (or that the host took back), emptying
/// `blocks`: to their shards, never into the calling thread's cache (the drain thread's cache
/// would keep them from every other thread). A run of blocks of one shard is freed under one
/// hold of its lock ([`ShardCell::free_run`]): a drain gives back hundreds at once, and the
/// drain thread is not the thread a shard's lock leans to.
pub(super) fn free_lent(blocks: &mut Vec<LentBlock>) {
    let mut records = blocks
        .drain(..)
        .filter_map(|block| match block.downcast::<BlockRecord>() {
            Ok(record) => Some(record),
            Err(_) => {
                debug_assert!(false, "only block records are lent");
                None
            }
        })
        .peekable();
    while let Some(mut record) = records.next() {
        if record.labeled {
            record.forget_label();
        }
        let Some(hold) = record.hold() else {
            drop_unshared(record.into_kind());
            continue;
        };
        let (cell, allocation) = (hold.cell, &hold.allocation);
        if record.len != allocation.requested_size() {
            let pool = record.pool();
            pool.adjust_size_delta(record.len, allocation, -1);
            record.len = allocation.requested_size();
        }
        // Those after it join its run while they need nothing but the shard's lock (a label
        // to forget takes the registry's lock, which is never taken under a shard's).
        let plain_of_cell = |r: &BlockRecord| {
            !r.labeled
                && r.hold()
                    .is_some_and(|h| h.cell == cell && r.len == h.allocation.requested_size())
        };
        // SAFETY: shared records from their shards, each given up here, once (the table gave
        // each out once); the run takes only records of `record`'s cell.
        unsafe { ShardCell::free_run(record, || records.next_if(|r| plain_of_cell(r))) };
    }
}

/// [`Block::release_on_device`] gave the block back: it was not lent, and is the caller's as
/// before (dropping it frees it at once, as any block).
#[derive(Debug, thiserror::Error)]
#[error("block not released on the device: {reason}")]
pub struct ReleaseRefused {
    /// The block, unchanged.
    pub block: Block,
    /// Why.
    pub reason: RefusedReason,
}

/// Device-side release: a block a kernel uses goes back to its pool when the kernel says so,
/// through the pool's release feed, with no stream boundary (a persistent kernel has none).
impl Block {
    /// Lends the block to a kernel: consumes the handle and returns the token the kernel passes
    /// to `vkgdr_release_token` (`include/vkgdr/ring_d2h.cuh`) when it is done with the block.
    /// The block is freed only when that token has come back through the pool's release feed
    /// ([`Pool::set_release_feed`](super::Pool::set_release_feed)) and a drain took it, so it is
    /// never handed out again while the kernel may still use it; a token that never comes
    /// keeps the block (and its chunk) until [`Pool::reclaim_device_releases`](super::Pool).
    ///
    /// The token is a [`ReleaseToken`] (`Copy`, 64 bits: the pool's tag, an entry, a
    /// generation; [`ReleaseToken::to_bits`] for the kernel), single-use: a repeat, a stale or
    /// a forged token frees nothing and is counted in
    /// [`PoolStats::device_releases`](super::PoolStats::device_releases).
    ///
    /// Refused, with the block back: a pool without a release feed, a pool whose last handle is
    /// gone, or a full token table ([`RefusedReason`]).
    pub fn release_on_device(self) -> std::result::Result<ReleaseToken, ReleaseRefused> {
        let record = self.into_record();
        // The pool state outlives the call: the record's reference keeps it alive until the
        // table hands the record out again, which takes the table's lock that `lend` holds
        // until it returns.
        let pool: *const PoolInner = record.pool();
        // SAFETY: see just above.
        match unsafe { &*pool }.lent.lend(record) {
            Ok(token) => Ok(token),
            Err((block, reason)) => Err(ReleaseRefused {
                block: Block::from_lent(block),
                reason,
            }),
        }
    }

    /// The record, the handle given up (nothing freed).
    fn into_record(self) -> Box<BlockRecord> {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped (ManuallyDrop) nor used again after the record is
        // taken out of it, once.
        unsafe { ManuallyDrop::take(&mut this.record) }
    }

    /// The block of a record the token table gave back unlent.
    fn from_lent(block: LentBlock) -> Block {
        let Ok(record) = block.downcast::<BlockRecord>() else {
            unreachable!("the table gives back what it was given")
        };
        Block {
            record: ManuallyDrop::new(record),
        }
    }
}

/// Lends `blocks` of `pool` in order under one lock of its table, pushing each token onto
/// `tokens`, until one is refused; that block and those after it stay in `blocks`, in order
/// ([`Pool::release_many_on_device`](super::Pool::release_many_on_device)).
pub(super) fn lend_many(
    pool: &PoolInner,
    blocks: &mut Vec<Block>,
    tokens: &mut Vec<ReleaseToken>,
) -> std::result::Result<(), RefusedReason> {
    if blocks.is_empty() {
        return Ok(());
    }
    let mut lender = pool.lent.lender()?;
    tokens.reserve(blocks.len());
    let mut rest = blocks.drain(..);
    let refused = lend_each(pool, &mut lender, &mut rest, tokens);
    // The pool state outlives the lock (the caller's `&Pool`), so the refused blocks may be
    // put back after it.
    drop(lender);
    let Some((first, why)) = refused else {
        return Ok(());
    };
    // Cold: the blocks not lent go back to the caller, in order (one allocation).
    let after: Vec<Block> = rest.collect();
    blocks.push(first);
    blocks.extend(after);
    Err(why)
}

#[inline]
fn lend_each(
    pool: &PoolInner,
    lender: &mut Lender<'_>,
    blocks: &mut impl Iterator<Item = Block>,
    tokens: &mut Vec<ReleaseToken>,
) -> Option<(Block, RefusedReason)> {
    for block in blocks {
        if !std::ptr::eq(block.pool(), pool) {
            return Some((block, RefusedReason::OtherPool));
        }
        match lender.lend(block.into_record()) {
            Ok(token) => tokens.push(token),
            Err((record, why)) => return Some((Block::from_lent(record), why)),
        }
    }
    None
}

/// Stream-ordered release: a block a kernel may still use goes back to its pool only after that
/// kernel's stream has passed this point. A plain drop gives the block back at once, and the
/// pool hands it out again without asking the GPU: the CPU allocator cannot know what kernels
/// still read.
impl Block {
    /// Gives the block back to its pool once the work queued on `stream` so far has completed,
    /// never waiting. On an error (no fence could be had on `stream`) the block waits for the
    /// work queued on the legacy default stream of the pool's context instead, never handed out
    /// at once while a kernel may still use it, and the error is returned.
    pub fn release_after(self, stream: &crate::mapping::cuda_objects::Stream) -> Result<()> {
        let gpu = stream.gpu();
        match stream.fence() {
            Ok(fence) => {
                gpu.release_after(self, fence);
                Ok(())
            }
            Err(e) => {
                gpu.release_after_queued_work(self, None, ReleaseKey::ANY);
                Err(e)
            }
        }
    }

    /// [`release_after`](Self::release_after) for a raw `CUstream` of `gpu`'s device (from CUDA
    /// C, cudarc, CuPy, PyTorch); the releases wait in `gpu`'s count
    /// ([`Gpu::pending_releases`](crate::Gpu::pending_releases)).
    ///
    /// # Safety
    /// - `stream` must be a live stream of `gpu`'s device; on drivers without stream memory
    ///   operations its context must outlive the release.
    pub unsafe fn release_after_stream(
        self,
        gpu: &crate::mapping::gpu::Gpu,
        stream: crate::driver::cuda::CuStream,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { gpu.release_after_stream(self, stream, None) }
    }
}

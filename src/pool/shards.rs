//! The pool's shards: independent heaps with their chunks, each behind its own lock, and the
//! hand-counted lifetimes that let a block outlive the [`Pool`](super::Pool) handle.
//!
//! A [`ShardCell`] is freed by whoever drops its last reference: the pool's (held by
//! [`ShardSet`]) or a block's (counted in `Shard::outstanding`, handed back by
//! [`ShardCell::free`]). Both are counted under the shard's lock, which alloc and free take
//! anyway; this is where most of the pool's `unsafe` lives.

use std::cell::Cell;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::core::sync::lock::Mutex;

use super::spin::SpinMutex;
use super::PoolInner;
use crate::core::alloc::{AllocError, Allocation, ChunkId, Heap};
use crate::core::dirty::DirtyRanges;
use crate::core::handle::SendSyncPtr;
use crate::error::{Error, Result};
use crate::mapping::chunk::ChunkMemory;

/// One chunk with its dirty-range tracker. Blocks hold an `Arc`, so the memory outlives them.
pub(super) struct Chunk {
    pub(super) memory: Box<dyn ChunkMemory>,
    /// `memory.host_ptr()` and `memory.device_ptr()`, read once: every block creation needs them.
    /// The host base keeps its provenance; it is only used to compute block addresses inside the
    /// chunk, which the chunk outlives, and is never written through here.
    pub(super) host_base: SendSyncPtr<u8>,
    pub(super) device_base: Option<u64>,
    pub(super) dirty: Mutex<DirtyRanges>,
}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chunk")
            .field("size", &self.memory.size())
            .field("host_ptr", &self.memory.host_ptr())
            .finish()
    }
}

impl Chunk {
    /// Wraps a freshly allocated chunk with an empty dirty-range tracker of `atom` granularity.
    pub(super) fn new(memory: Box<dyn ChunkMemory>, atom: u64) -> Result<Arc<Chunk>> {
        let dirty = DirtyRanges::new(memory.size(), atom)?;
        Ok(Arc::new(Chunk {
            host_base: SendSyncPtr::new(memory.host_ptr()),
            device_base: memory.device_ptr(),
            memory,
            dirty: Mutex::new(dirty),
        }))
    }

    /// Pushes every recorded dirty range to the device in one call and forgets them.
    pub(super) fn flush(&self, scratch: &mut Vec<(u64, u64)>) -> Result<()> {
        let mut dirty = self.dirty.lock();
        if dirty.is_empty() {
            return Ok(());
        }
        scratch.clear();
        scratch.extend(dirty.ranges());
        self.memory.flush_ranges(scratch)?;
        dirty.clear();
        Ok(())
    }
}

/// One independent heap with its chunks; lives in a [`ShardCell`].
pub(super) struct Shard {
    pub(super) heap: Heap,
    /// Indexed by `ChunkId`.
    pub(super) chunks: Vec<Option<Arc<Chunk>>>,
    pub(super) next_chunk_size: u64,
    /// Live blocks of this shard; with `pool_dropped`, decides who frees the cell (see `ShardSet`).
    outstanding: u64,
    /// Set when the last `Pool` handle is gone.
    pool_dropped: bool,
}

impl Shard {
    /// Removes empty chunks beyond `keep` from the shard and takes their bytes off `reserved`;
    /// the caller drops them after unlocking.
    pub(super) fn take_empty_chunks(
        &mut self,
        keep: usize,
        reserved: &AtomicU64,
    ) -> Vec<Arc<Chunk>> {
        let empty: Vec<ChunkId> = self.heap.empty_chunks().collect();
        let mut out = Vec::new();
        for id in empty.into_iter().skip(keep) {
            if let Ok(size) = self.heap.remove_chunk(id) {
                if let Some(c) = self.chunks[id.0 as usize].take() {
                    reserved.fetch_sub(size, Ordering::AcqRel);
                    out.push(c);
                }
            }
        }
        out
    }
}

/// A shard and the pool state it needs to free blocks.
///
/// Its lifetime is reference-counted by hand under its own mutex (`outstanding` blocks plus the
/// pool's one reference) instead of with an `Arc`: alloc and free take the lock anyway, and two
/// fewer atomic read-modify-writes per alloc+free pair is a third of the pool's overhead.
#[repr(align(128))] // its own cache lines: shards of different threads must not share one
pub(super) struct ShardCell {
    pub(super) state: SpinMutex<Shard>,
    pub(super) pool: Arc<PoolInner>,
}

/// A live shard allocation with the counted reference on its cell that keeps the cell (and so
/// the chunk table) alive: what a shared [`Block`](super::Block) holds, and what a thread cache
/// keeps of a freed one (moved as is between the two, nothing rebuilt). Handed back through
/// [`ShardCell::free`].
pub(super) struct Hold {
    pub(super) cell: NonNull<ShardCell>,
    /// Points into `cell`'s chunk table; valid while `allocation` is live (chunks are removed
    /// only when empty).
    pub(super) chunk: *const Chunk,
    pub(super) allocation: Allocation,
}

// SAFETY: a hold owns one outstanding allocation and its counted reference on the cell; the cell
// and chunk it points to are shared, lock-protected (or immutable) state that any thread may free
// into (`ShardCell::free`) or read.
unsafe impl Send for Hold {}

/// The pool's references to its shards. When the last `Pool` clone drops, each shard is marked;
/// a shard with no live block is freed at once, otherwise by its last block.
pub(super) struct ShardSet {
    cells: Box<[NonNull<ShardCell>]>,
}

// SAFETY: the cells are only accessed through their mutex; the pointers stay valid while the set
// lives (the set holds the pool's reference on each cell).
unsafe impl Send for ShardSet {}
// SAFETY: as above.
unsafe impl Sync for ShardSet {}

impl ShardSet {
    /// One cell per heap, each holding the pool's reference (released in our Drop).
    pub(super) fn new(heaps: Vec<Heap>, pool: &Arc<PoolInner>, first_chunk: u64) -> ShardSet {
        let cells = heaps
            .into_iter()
            .map(|heap| {
                NonNull::from(Box::leak(Box::new(ShardCell {
                    state: SpinMutex::new(Shard {
                        heap,
                        chunks: Vec::new(),
                        next_chunk_size: first_chunk,
                        outstanding: 0,
                        pool_dropped: false,
                    }),
                    pool: pool.clone(),
                })))
            })
            .collect();
        ShardSet { cells }
    }

    fn get(&self, i: usize) -> &ShardCell {
        // SAFETY: a cell is freed only after `pool_dropped` is set, which happens in our Drop.
        unsafe { self.cells[i].as_ref() }
    }
    pub(super) fn len(&self) -> usize {
        self.cells.len()
    }
    pub(super) fn iter(&self) -> impl Iterator<Item = &ShardCell> {
        (0..self.len()).map(|i| self.get(i))
    }

    /// Allocates `size` bytes aligned to `align` from shard `i`, calling `grow` (with the shard
    /// locked) to add a chunk of at least the given size when its heap is full. The allocation
    /// counts as one reference on the cell, which the block (or a thread cache after it) hands
    /// back through [`ShardCell::free`].
    pub(super) fn alloc(
        &self,
        i: usize,
        size: u64,
        align: u64,
        grow: impl FnOnce(&mut Shard, u64) -> Result<()>,
    ) -> Result<Hold> {
        let mut shard = self.get(i).state.lock();
        let allocation = match shard.heap.alloc(size, align) {
            Ok(a) => a,
            Err(AllocError::OutOfSpace {
                chunk_size_needed, ..
            }) => {
                grow(&mut shard, chunk_size_needed)?;
                shard.heap.alloc(size, align)?
            }
            Err(e) => return Err(e.into()),
        };
        let Some(chunk) = shard
            .chunks
            .get(allocation.chunk().0 as usize)
            .and_then(|c| c.as_ref())
        else {
            let _ = shard.heap.free(allocation);
            return Err(Error::internal(
                "the allocator returned a block in an unknown chunk",
            ));
        };
        // The chunk stays in the shard's table while it holds a live allocation (chunks are
        // removed only when empty), and the counted reference keeps the cell alive.
        let chunk: *const Chunk = Arc::as_ptr(chunk);
        shard.outstanding += 1;
        Ok(Hold {
            cell: self.cells[i],
            chunk,
            allocation,
        })
    }
}

impl Drop for ShardSet {
    fn drop(&mut self) {
        // Blocks dropped from now on go straight back to their shards, and every thread's cached
        // ones go back now.
        // SAFETY: the cells are alive: we still hold the pool's reference on each.
        if let Some(pool) = self.cells.first().map(|c| unsafe { &c.as_ref().pool }) {
            pool.cache_open.store(false, Ordering::Release);
            pool.reclaim_cached();
            // With the `log` feature: blocks still alive now (cached ones went back just above)
            // are worth a warning.
            #[cfg(feature = "log")]
            super::report::report_leaks(pool, self);
        }
        for &cell in self.cells.iter() {
            // SAFETY: the cell is alive: we still hold the pool's reference on it.
            let free = unsafe {
                let mut shard = cell.as_ref().state.lock();
                shard.pool_dropped = true;
                shard.outstanding == 0
            };
            if free {
                // SAFETY: no block and no pool refers to the cell any more (checked under its
                // lock just above; nobody can take a new reference since the pool is gone).
                drop(unsafe { Box::from_raw(cell.as_ptr()) });
            }
        }
    }
}

impl ShardCell {
    /// Frees a hold's allocation and drops its reference on the cell. Out of line: the lock and
    /// the heap's free are far larger than a call, and callers' fast paths stay small.
    ///
    /// # Safety
    /// - `hold` must come from [`ShardSet::alloc`] (moved, never duplicated, since): its cell is
    ///   then alive and its reference is used here for the last time.
    pub(super) unsafe fn free(hold: Hold) {
        let hold = std::mem::ManuallyDrop::new(hold);
        // SAFETY: forwarded to our caller; `hold` is forgotten, so it is consumed once.
        unsafe { ShardCell::free_in_place(&hold) }
    }

    /// [`free`](Self::free) of a hold where it lies (in a dropping block), so it is not copied
    /// first.
    ///
    /// # Safety
    /// - As for [`free`](Self::free), and the hold is never used again after the call (not
    ///   even dropped: its bits are left behind, consumed).
    #[inline(never)]
    pub(super) unsafe fn free_in_place(hold: &Hold) {
        let cell = hold.cell;
        // SAFETY: the caller gives up the hold, so its allocation is read out once.
        let allocation = unsafe { std::ptr::read(&hold.allocation) };
        // SAFETY: the block's reference keeps the cell alive until the end of the locked section.
        let this = unsafe { cell.as_ref() };
        let chunk_id = allocation.chunk();
        let (released, destroy) = {
            let mut shard = this.state.lock();
            shard.outstanding -= 1;
            let destroy = shard.pool_dropped && shard.outstanding == 0;
            // The allocation came from this shard's heap and cannot be freed twice (it is moved
            // out of the block), so this only fails on an allocator bug.
            let freed = shard.heap.free(allocation);
            debug_assert!(freed.is_ok(), "pool free failed: {freed:?}");
            // Only a chunk left empty has anything to release (built only then: no vector to
            // drop on every free).
            let released = (shard.heap.chunk_allocations(chunk_id) == Some(0)).then(|| {
                shard.take_empty_chunks(this.pool.config.keep_empty_chunks, &this.pool.reserved)
            });
            (released, destroy)
        };
        drop(released);
        if destroy {
            // SAFETY: the pool is gone and this was the last block (checked under the lock), so
            // nothing else can reach the cell; the guard was dropped above.
            drop(unsafe { Box::from_raw(cell.as_ptr()) });
        }
    }
}

thread_local! {
    static THREAD_SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    /// `(n, thread_shard(n))` for the last `n` asked (0: none yet).
    static THREAD_SHARD_OF: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

/// The shard this thread allocates from among `n` (assigned round-robin on first use).
#[inline]
pub(super) fn thread_shard(n: usize) -> usize {
    // The last answer, for the last `n` asked (a thread mostly uses pools of one shard count):
    // a division saved per allocation.
    let (last_n, last) = THREAD_SHARD_OF.with(Cell::get);
    if last_n == n {
        return last;
    }
    thread_shard_slow(n)
}

#[cold]
#[inline(never)]
fn thread_shard_slow(n: usize) -> usize {
    let v = THREAD_SHARD.with(|s| {
        let mut v = s.get();
        if v == usize::MAX {
            v = NEXT_SHARD.fetch_add(1, Ordering::Relaxed);
            s.set(v);
        }
        v
    });
    let shard = v % n;
    THREAD_SHARD_OF.with(|c| c.set((n, shard)));
    shard
}

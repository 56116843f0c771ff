//! The pool's shards: independent heaps with their chunks, each behind its own lock, and the
//! hand-counted lifetimes that let a block outlive the [`Pool`](super::Pool) handle.
//!
//! A [`ShardCell`] is freed by whoever drops its last reference: the pool's (held by
//! [`ShardSet`]) or a block's (counted in `Shard::outstanding`, handed back by
//! [`ShardCell::free`]). Both are counted under the shard's lock, which alloc and free take
//! anyway; this is where most of the pool's `unsafe` lives.
//!
//! A block is one pointer to its [`BlockRecord`], which a thread cache keeps as is when the block
//! is freed and hands to the next block: the hot paths move eight bytes, never the record. Every
//! move of a wider value through memory is a chance for the CPU to fail forwarding a store to
//! the load that reads it back (a load spanning two stores waits for both to reach the cache;
//! figures: BENCHMARKS.md, 'The pool pair'), and what a free stores is what the next allocation
//! loads first. A shard keeps a few freed records' memory for its next allocations.

use std::cell::Cell;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use super::chunk::Chunk;
use super::config::cacheable;
#[cfg(feature = "gpu-alloc")]
use super::gpu_alloc::MemoryBlock;
use super::inner::PoolInner;
use crate::core::alloc::{AllocError, Allocation, ChunkId, Heap};
use crate::core::sync::{BiasedGuard, BiasedLock, CachePadded};
use crate::error::{Error, Result};

/// Records [`ShardCell::free_run`] frees under one hold of the shard's lock at most: an
/// allocation on that shard waits for no more than these.
const RUN: usize = 32;

/// A record's memory without a record in it.
type SpareRecord = Box<MaybeUninit<BlockRecord>>;

/// Rooms a shard keeps in a plain list (reserved whole at the start), the ones the usual free and
/// allocation pair moves; beyond them rooms are linked through their own memory.
const RECENT_ROOMS: usize = 64;

/// The memory of a shard's freed records, kept for its next allocations' records. Keeping one
/// never allocates (a free runs under the shard's lock): the first [`RECENT_ROOMS`] go into a
/// list reserved at the start, any more into a list linked through the rooms themselves. So a
/// burst of frees (a drain of thousands of device releases) keeps every one, sparing the C
/// library's allocator a free now and a `malloc` at the next allocation. It holds at most as
/// many rooms as the shard had live blocks at once; [`Pool::trim`](super::Pool::trim) gives
/// them back.
pub(super) struct SpareRooms {
    recent: Vec<SpareRecord>,
    /// The first room of the linked ones.
    head: Option<SpareRecord>,
}

// A linked room holds the link to the next one where its record was.
const _: () = assert!(
    std::mem::size_of::<BlockRecord>() >= std::mem::size_of::<Option<SpareRecord>>()
        && std::mem::align_of::<BlockRecord>() >= std::mem::align_of::<Option<SpareRecord>>()
);

impl Default for SpareRooms {
    fn default() -> Self {
        SpareRooms {
            recent: Vec::with_capacity(RECENT_ROOMS),
            head: None,
        }
    }
}

impl SpareRooms {
    /// Keeps `room`.
    #[inline]
    fn push(&mut self, room: SpareRecord) {
        if self.recent.len() < self.recent.capacity() {
            self.recent.push(room);
        } else {
            self.link(room);
        }
    }

    /// Keeps `room` among the linked ones.
    #[cold]
    #[inline(never)]
    fn link(&mut self, mut room: SpareRecord) {
        let link = room.as_mut_ptr().cast::<Option<SpareRecord>>();
        // SAFETY: a room is a record's memory with no record in it: large and aligned enough for
        // the link (checked at compile time above); it holds the link until `unlink` reads it.
        unsafe { link.write(self.head.take()) };
        self.head = Some(room);
    }

    /// A kept room, if any.
    #[inline]
    fn pop(&mut self) -> Option<SpareRecord> {
        match self.recent.pop() {
            Some(room) => Some(room),
            None => self.unlink(),
        }
    }

    /// The first linked room, if any.
    #[cold]
    #[inline(never)]
    fn unlink(&mut self) -> Option<SpareRecord> {
        let mut room = self.head.take()?;
        // SAFETY: every linked room holds the link `link` wrote, read out once here (the room is
        // handed out as memory with no record in it).
        self.head = unsafe { room.as_mut_ptr().cast::<Option<SpareRecord>>().read() };
        Some(room)
    }

    /// Rooms kept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        let mut linked = 0;
        let mut at = self.head.as_ref();
        while let Some(room) = at {
            linked += 1;
            // SAFETY: every linked room holds the link `link` wrote.
            at = unsafe { &*room.as_ptr().cast::<Option<SpareRecord>>() }.as_ref();
        }
        self.recent.len() + linked
    }
}

impl Drop for SpareRooms {
    fn drop(&mut self) {
        // One room at a time: a recursive drop of the links could overflow the stack.
        while self.unlink().is_some() {}
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
    /// Memory of freed records, for the next allocations' records.
    pub(super) spare_records: SpareRooms,
}

impl Shard {
    /// Gives `allocation` back to the heap, under the lock. True when the free must end on
    /// the rare path ([`ShardCell::free_rare`]: the pool is gone, or the chunk it leaves empty
    /// is beyond the `keep_empty` empty ones the shard keeps); otherwise the block's reference
    /// on the cell is handed back here.
    #[inline(always)] // the body of every free to a shard
    fn give_back(&mut self, allocation: Allocation, keep_empty: usize) -> bool {
        // The allocation came from this shard's heap and cannot be freed twice (it is moved
        // out of the block), so this only fails on an allocator bug.
        let freed = self.heap.free_emptying(allocation);
        debug_assert!(freed.is_ok(), "pool free failed: {freed:?}");
        // A chunk left empty is handed back only beyond the `keep_empty_chunks` empty ones the
        // shard keeps (counted here, without allocating: a shard has few chunks), so the usual
        // case, one block coming and going in a kept chunk, stays on this path.
        if self.pool_dropped
            || (freed == Ok(true) && self.heap.empty_chunks().nth(keep_empty).is_some())
        {
            return true;
        }
        self.outstanding -= 1;
        false
    }

    /// Keeps a freed record's memory for the next allocation's record (never allocating).
    #[inline]
    fn keep_room(&mut self, room: SpareRecord) {
        self.spare_records.push(room);
    }

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
    pub(super) state: BiasedLock<Shard>,
    pub(super) pool: Arc<PoolInner>,
    /// What this shard's allocations carry as [`Hold::cache_pool`].
    cache_pool: u64,
    /// [`PoolConfig::keep_empty_chunks`](super::PoolConfig::keep_empty_chunks), beside the lock
    /// that a free takes, so that a free which empties a kept chunk reads no pool state.
    keep_empty_chunks: usize,
}

/// [`Hold::cache_pool`] of a pool whose thread caches are off: no magazine slot serves it (a
/// slot serves a pool id, never 0 and never this; an empty slot says 0).
pub(super) const NOT_CACHED: u64 = u64::MAX;

/// A live shard allocation with the counted reference on its cell that keeps the cell (and so
/// the chunk table) alive: what a shared block's record holds, and goes on holding in a thread
/// cache (the record moves between the two, nothing rebuilt). Handed back through
/// [`ShardCell::free`].
pub(super) struct Hold {
    pub(super) cell: NonNull<ShardCell>,
    /// Points into `cell`'s chunk table; valid while `allocation` is live (chunks are removed
    /// only when empty).
    pub(super) chunk: *const Chunk,
    pub(super) allocation: Allocation,
    /// The pool's thread-cache id ([`PoolInner::id`]) when its thread caches are on and the
    /// allocation is one they keep (its requested size in `1..=MAX_CACHED_SIZE`), else
    /// [`NOT_CACHED`]: what a free offers the block to its thread's cache under, read from the
    /// record itself, so that a cached free touches neither the cell nor the pool state and a
    /// block no cache keeps goes straight back to its shard.
    pub(super) cache_pool: u64,
}

// SAFETY: a hold owns one outstanding allocation and its counted reference on the cell; the cell
// and chunk it points to are shared, lock-protected (or immutable) state that any thread may free
// into (`ShardCell::free`) or read.
unsafe impl Send for Hold {}

/// What keeps a block's memory alive, and how it is given back.
pub(super) enum BlockKind {
    /// A shard allocation: goes to a thread cache (or back to its shard) with its record when the
    /// block drops, and a cached one serves the next block as is.
    Shared(Hold),
    /// A chunk of its own (requests at or above the dedicated threshold).
    Dedicated {
        pool: Arc<PoolInner>,
        chunk: Arc<Chunk>,
    },
    /// An allocation of gpu-alloc's allocators.
    #[cfg(feature = "gpu-alloc")]
    GpuAlloc {
        pool: Arc<PoolInner>,
        block: MemoryBlock<Arc<Chunk>>,
    },
}

/// Everything a [`Block`](super::Block) is, behind the one pointer the block holds: what keeps
/// its memory alive and the figures every access reads. A freed shared block's record moves
/// (as a pointer) into a thread cache and out into the next block of its bucket.
pub(super) struct BlockRecord {
    /// Taken out only when the record is given up ([`BlockRecord::into_kind`],
    /// [`ShardCell::free`]).
    pub(super) kind: ManuallyDrop<BlockKind>,
    /// The block's first byte in the chunk's host mapping: every access through
    /// [`Mapping`](crate::mapping::Mapping) uses it.
    pub(super) host_ptr: *mut u8,
    /// Requested size.
    pub(super) len: u64,
    pub(super) non_coherent: bool,
    /// Whether the pool's registry holds a label for this block (removed when it drops).
    pub(super) labeled: bool,
    /// The next record of the thread-cache bucket holding this one (the buckets are stacks
    /// linked through their records: a take and an offer move two pointers); owned by that
    /// bucket, as the records it links. `None` whenever the record is not cached.
    pub(super) cache_next: Option<NonNull<BlockRecord>>,
}

// SAFETY: a record exclusively owns its block's byte range of the chunk (`host_ptr` points into
// it) and what `kind` holds, which any thread may free (see `Hold`); moving it between threads
// moves that ownership. `cache_next` is set only while the record lies in a thread-cache bucket,
// which owns it and the record it links (and is itself used by one thread at a time).
unsafe impl Send for BlockRecord {}

impl BlockRecord {
    /// The shard allocation of a shared block's record (every record a thread cache holds).
    #[inline(always)]
    pub(super) fn hold(&self) -> Option<&Hold> {
        match &*self.kind {
            BlockKind::Shared(h) => Some(h),
            _ => None,
        }
    }

    /// The memory of a record whose contents are gone, as room for another record.
    ///
    /// # Safety
    /// - What `kind` held has been moved out (or needs no drop) and is not used through `self`
    ///   again.
    unsafe fn into_room(self: Box<Self>) -> SpareRecord {
        // SAFETY: `MaybeUninit<T>` has `T`'s layout; the contents are the caller's to forget.
        unsafe { Box::from_raw(Box::into_raw(self).cast::<MaybeUninit<BlockRecord>>()) }
    }

    /// Gives the record up: what it holds (its memory is freed).
    pub(super) fn into_kind(self: Box<Self>) -> BlockKind {
        let raw = Box::into_raw(self);
        // SAFETY: `raw` is a live record we own. Its kind is read out once; its other fields are
        // plain values (no drop). The memory then holds no record and is freed as room of the
        // same layout (`MaybeUninit<T>` has `T`'s), so nothing is dropped or freed twice.
        unsafe {
            let kind = ManuallyDrop::into_inner(std::ptr::read(&(*raw).kind));
            drop(Box::from_raw(raw).into_room());
            kind
        }
    }
}

/// The pool's references to its shards. A shard is made when a thread first allocates from it,
/// so a pool costs what its threads use: a default pool has a shard per vCPU, and a shard's heap
/// made up front in [`Pool::new`](super::Pool::new) costs a page fault or two (BENCHMARKS.md,
/// "Shards made on first use"). When the last `Pool` clone drops, each shard made is marked; a
/// shard with no live block is freed at once, otherwise by its last block.
pub(super) struct ShardSet {
    cells: CellTable,
    /// An empty heap of the pool's configuration, never allocated from: each shard's heap is made
    /// like it (sharing its slab lookup table), and a shard not made yet reads as it.
    template: Heap,
    /// What every cell holds and carries; its configuration says how many shards there are and
    /// each one's first chunk.
    pool: Arc<PoolInner>,
}

/// The shards' cell pointers, sixteen to a 128-byte group of lines of their own: every
/// allocation that misses the thread cache reads one, so no other heap object may share their
/// lines (a write into one would make each thread wait for the line, as beside [`PoolInner`]).
/// Null until the shard is made; set once, never changed after.
struct CellTable {
    /// Cells `16 g .. 16 g + 16` in group `g`; the last group's slots past `len` stay null and
    /// are never read.
    groups: Box<[CachePadded<[AtomicPtr<ShardCell>; CELLS_PER_GROUP]>]>,
    len: usize,
}

/// Cell pointers per [`CellTable`] group: 128 bytes.
const CELLS_PER_GROUP: usize = 16;
const _: () = assert!(size_of::<CachePadded<[AtomicPtr<ShardCell>; CELLS_PER_GROUP]>>() == 128);

impl CellTable {
    fn new(len: usize) -> CellTable {
        let groups = (0..len.div_ceil(CELLS_PER_GROUP))
            .map(|_| {
                CachePadded(std::array::from_fn(
                    |_| AtomicPtr::new(std::ptr::null_mut()),
                ))
            })
            .collect();
        CellTable { groups, len }
    }

    /// Slot `i`. Panics past `len`, as a slice would.
    #[inline]
    fn slot(&self, i: usize) -> &AtomicPtr<ShardCell> {
        assert!(i < self.len, "shard {i} of {}", self.len);
        &self.groups[i / CELLS_PER_GROUP].0[i % CELLS_PER_GROUP]
    }

    /// Cell `i`, if made.
    #[inline]
    fn get(&self, i: usize) -> Option<NonNull<ShardCell>> {
        // Acquire: a cell seen is seen whole (its maker published it with release).
        NonNull::new(self.slot(i).load(Ordering::Acquire))
    }

    /// Makes `cell` cell `i` unless another thread made one first: that one, as the error.
    fn set_once(&self, i: usize, cell: NonNull<ShardCell>) -> Result<(), NonNull<ShardCell>> {
        let slot = self.slot(i);
        loop {
            match slot.compare_exchange(
                std::ptr::null_mut(),
                cell.as_ptr(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(other) => {
                    // A strong compare-and-swap fails only on a value other than null, and a
                    // slot is never reset; were it null after all, trying again is right.
                    if let Some(made) = NonNull::new(other) {
                        return Err(made);
                    }
                }
            }
        }
    }

    /// The cells made, with their indices.
    fn iter(&self) -> impl Iterator<Item = (usize, NonNull<ShardCell>)> + '_ {
        (0..self.len).filter_map(|i| self.get(i).map(|c| (i, c)))
    }
}

// SAFETY: the cells are only accessed through their mutex, and published whole (`set_once`);
// the pointers stay valid while the set lives (the set holds the pool's reference on each cell
// made). The template heap is only read (`Heap` has no interior mutability), by any thread.
unsafe impl Send for ShardSet {}
// SAFETY: as above.
unsafe impl Sync for ShardSet {}
// What the note above says of the template: a `Heap` may be shared between threads as is.
const _: fn() = || {
    fn shareable<T: Sync>() {}
    shareable::<Heap>();
};

impl ShardSet {
    /// The pool's shards, none made yet: each is made like `template` (an empty heap of the
    /// pool's configuration) when a thread first allocates from it.
    pub(super) fn new(template: Heap, pool: &Arc<PoolInner>) -> ShardSet {
        ShardSet {
            cells: CellTable::new(pool.config.shards),
            template,
            pool: pool.clone(),
        }
    }

    /// Cell `i`, made now if it was not yet.
    #[inline]
    fn cell(&self, i: usize) -> NonNull<ShardCell> {
        match self.cells.get(i) {
            Some(cell) => cell,
            None => self.make(i),
        }
    }

    /// Makes cell `i`, holding the pool's reference (released in our Drop); when another thread
    /// made it first, that one.
    #[cold]
    #[inline(never)]
    fn make(&self, i: usize) -> NonNull<ShardCell> {
        let pool = &self.pool;
        let cell = NonNull::from(Box::leak(Box::new(ShardCell {
            state: BiasedLock::new(Shard {
                heap: self.template.empty_like(),
                chunks: Vec::new(),
                next_chunk_size: pool.config.chunk_size,
                outstanding: 0,
                pool_dropped: false,
                spare_records: SpareRooms::default(),
            }),
            pool: pool.clone(),
            cache_pool: if pool.cache_enabled {
                pool.id
            } else {
                NOT_CACHED
            },
            keep_empty_chunks: pool.config.keep_empty_chunks,
        })));
        match self.cells.set_once(i, cell) {
            Ok(()) => cell,
            Err(made) => {
                // SAFETY: `cell` was never published (the slot held another), so nothing else
                // refers to it; it holds no block.
                drop(unsafe { Box::from_raw(cell.as_ptr()) });
                made
            }
        }
    }

    /// Shards, made or not.
    pub(super) fn len(&self) -> usize {
        self.cells.len
    }

    /// The shards made, with their indices.
    pub(super) fn iter(&self) -> impl Iterator<Item = (usize, &ShardCell)> {
        // SAFETY: a cell is freed only after `pool_dropped` is set, which happens in our Drop.
        self.cells.iter().map(|(i, c)| (i, unsafe { c.as_ref() }))
    }

    /// What a shard not made yet holds: an empty heap of the pool's configuration.
    pub(super) fn template(&self) -> &Heap {
        &self.template
    }

    /// The pool state every cell holds.
    pub(super) fn pool(&self) -> &PoolInner {
        &self.pool
    }

    /// Allocates `size` bytes aligned to `align` from shard `i`, calling `grow` (with the shard
    /// locked) to add a chunk of at least the given size when its heap is full, and records it for
    /// a block of `len` requested bytes. The allocation counts as one reference on the cell, which
    /// the block (or a thread cache after it) hands back through [`ShardCell::free`].
    #[inline]
    pub(super) fn alloc(
        &self,
        i: usize,
        size: u64,
        align: u64,
        len: (u64, bool),
        grow: impl FnOnce(&mut Shard, u64) -> Result<()>,
    ) -> Result<Box<BlockRecord>> {
        Self::alloc_in(self.cell(i), size, align, len, grow)
    }

    /// [`alloc`](Self::alloc) from the shard of `cell`, one of ours.
    #[inline(always)]
    fn alloc_in(
        cell: NonNull<ShardCell>,
        size: u64,
        align: u64,
        len: (u64, bool),
        grow: impl FnOnce(&mut Shard, u64) -> Result<()>,
    ) -> Result<Box<BlockRecord>> {
        // SAFETY: a cell of the set is freed only after `pool_dropped` is set, in its Drop.
        let this = unsafe { cell.as_ref() };
        let mut shard = this.state.lock();
        // The usual allocation, a free object of a page at hand, is recorded here; any other
        // case takes the out-of-line path, which records its own. Were the two paths' results
        // to meet here, the allocation would pass through memory on both.
        match shard.heap.alloc_from_partial_page(size, align) {
            Ok(allocation) => Self::record((cell, this), shard, allocation, len),
            Err(class) => Self::alloc_in_slow((cell, this), shard, (size, align, class), len, grow),
        }
    }

    /// [`alloc_in`](Self::alloc_in) when no page at hand holds a free object of the request's
    /// class (`class`, from that attempt): a new slab page or a plain block, after `grow` when
    /// the heap is full.
    #[inline(never)]
    fn alloc_in_slow<'a>(
        cell: (NonNull<ShardCell>, &'a ShardCell),
        mut shard: BiasedGuard<'a, Shard>,
        (size, align, class): (u64, u64, Option<u32>),
        len: (u64, bool),
        grow: impl FnOnce(&mut Shard, u64) -> Result<()>,
    ) -> Result<Box<BlockRecord>> {
        let allocation = match shard.heap.alloc_past_partial_pages(size, align, class) {
            Ok(a) => a,
            Err(AllocError::OutOfSpace {
                chunk_size_needed, ..
            }) => {
                grow(&mut shard, chunk_size_needed)?;
                shard.heap.alloc_valid(size, align)?
            }
            Err(e) => return Err(e.into()),
        };
        Self::record(cell, shard, allocation, len)
    }

    /// The record of `allocation`, just made in the locked `shard` of `cell` (its pointer,
    /// which the record keeps, and the cell), for a block of `len` requested bytes (and whether
    /// the memory is non-coherent); unlocks the shard.
    #[inline(always)]
    fn record<'a>(
        (cell, this): (NonNull<ShardCell>, &'a ShardCell),
        mut shard: BiasedGuard<'a, Shard>,
        allocation: Allocation,
        (len, non_coherent): (u64, bool),
    ) -> Result<Box<BlockRecord>> {
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
        // SAFETY: the allocator keeps `offset + size` within the chunk, so the pointer stays
        // inside the chunk's mapping.
        let host_ptr = unsafe { chunk.host_base.get().add(allocation.offset() as usize) };
        // The chunk stays in the shard's table while it holds a live allocation (chunks are
        // removed only when empty), and the counted reference keeps the cell alive.
        let chunk: *const Chunk = Arc::as_ptr(chunk);
        // Only blocks a thread cache may keep carry the pool's cache id.
        let cache_pool = if cacheable(allocation.requested_size()) {
            this.cache_pool
        } else {
            NOT_CACHED
        };
        shard.outstanding += 1;
        let room = shard.spare_records.pop();
        drop(shard);
        let record = BlockRecord {
            kind: ManuallyDrop::new(BlockKind::Shared(Hold {
                cell,
                chunk,
                allocation,
                cache_pool,
            })),
            host_ptr,
            len,
            non_coherent,
            labeled: false,
            cache_next: None,
        };
        Ok(match room {
            Some(room) => Box::write(room, record),
            None => Box::new(record),
        })
    }

    /// [`alloc`](Self::alloc) from what shard `i` holds free now, without growing it (or making
    /// it): `None` when no free range of its chunks fits (or on any other error).
    pub(super) fn alloc_from_free(
        &self,
        i: usize,
        size: u64,
        align: u64,
        len: (u64, bool),
    ) -> Option<Box<BlockRecord>> {
        // The error only says "not grown"; it is dropped here.
        Self::alloc_in(self.cells.get(i)?, size, align, len, |_, _| {
            Err(Error::internal("a shard asked not to grow"))
        })
        .ok()
    }
}

impl Drop for ShardSet {
    fn drop(&mut self) {
        // The pool was closed just before (the thread caches' blocks are back: `Shards` in
        // `pool/mod.rs`).
        for (_, cell) in self.cells.iter() {
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
    /// Frees a shared block's allocation and drops its reference on the cell, keeping the
    /// record's memory for the shard's next allocation if the shard has few. Reads what it needs
    /// where the record lies (no copy of it). Out of line: the lock and the heap's free are far
    /// larger than a call, and callers' fast paths stay small.
    ///
    /// # Safety
    /// - `record` must hold a [`BlockKind::Shared`] allocation from [`ShardSet::alloc`] (moved,
    ///   never duplicated, since): its cell is then alive and its reference is used here for the
    ///   last time.
    #[inline(never)]
    pub(super) unsafe fn free(record: Box<BlockRecord>) {
        let Some(hold) = record.hold() else {
            debug_assert!(false, "ShardCell::free of an unshared block");
            return;
        };
        let cell = hold.cell;
        // SAFETY: the hold's reference keeps the cell alive until it is handed back.
        let this = unsafe { cell.as_ref() };
        let mut shard = this.state.lock();
        // The allocation is read where the record lies once the lock is held, not before: its
        // fields would wait through the lock in registers, or on the stack.
        // SAFETY: the record gives its allocation up here, once: its memory becomes room below,
        // never read as a record again.
        let allocation = unsafe { std::ptr::read(&hold.allocation) };
        // SAFETY: what the record held is consumed (the allocation above; the cell reference is
        // handed back below; the chunk pointer needs nothing).
        let room = unsafe { BlockRecord::into_room(record) };
        if shard.give_back(allocation, this.keep_empty_chunks) {
            drop(shard);
            // SAFETY: our reference is still counted, so the cell is alive; handed back there.
            return unsafe { Self::free_rare(cell, room) };
        }
        shard.keep_room(room);
    }

    /// Frees `first` and the records `more` hands out after it, all of `first`'s shard, as
    /// [`free`](Self::free) would one by one, taking the shard's lock once per [`RUN`] records
    /// (a drain of device releases frees hundreds at once). `more` is called under the lock:
    /// it may only take records out of a list, and must give `None` for a record of another
    /// shard.
    ///
    /// # Safety
    /// - Every record given must hold a [`BlockKind::Shared`] allocation of `first`'s cell, as
    ///   [`free`](Self::free) requires of its one record.
    pub(super) unsafe fn free_run(
        first: Box<BlockRecord>,
        mut more: impl FnMut() -> Option<Box<BlockRecord>>,
    ) {
        let Some(hold) = first.hold() else {
            debug_assert!(false, "ShardCell::free_run of an unshared block");
            return;
        };
        let cell = hold.cell;
        // SAFETY: the record not yet freed (`next`) holds a counted reference on the cell
        // whenever the loop below touches it.
        let this = unsafe { cell.as_ref() };
        let mut next = Some(first);
        while next.is_some() {
            let mut rare = None;
            let mut shard = this.state.lock();
            for _ in 0..RUN {
                let Some(record) = next.take() else { break };
                let Some(hold) = record.hold() else {
                    debug_assert!(false, "ShardCell::free_run of an unshared block");
                    next = more();
                    continue;
                };
                debug_assert!(hold.cell == cell, "ShardCell::free_run across shards");
                // SAFETY: as in `free`: the caller gives every record up here, once.
                let allocation = unsafe { std::ptr::read(&hold.allocation) };
                // SAFETY: as in `free`.
                let room = unsafe { BlockRecord::into_room(record) };
                if shard.give_back(allocation, this.keep_empty_chunks) {
                    rare = Some(room);
                    break;
                }
                shard.keep_room(room);
                next = more();
            }
            drop(shard);
            if let Some(room) = rare {
                // SAFETY: the rare record's reference is still counted (the cell is alive) and
                // handed back there; the records after it hold their own.
                unsafe { Self::free_rare(cell, room) };
                next = more();
            }
        }
    }

    /// The end of a free that left its chunk empty beyond the empty chunks the shard keeps, or
    /// came after the pool's drop: hands the chunks now empty (beyond the ones kept) back, and
    /// the reference on the cell, freeing the cell with the last one after the pool's drop. Apart
    /// from [`free`](Self::free), which it would only slow down.
    ///
    /// # Safety
    /// - `cell` is alive, and the caller's counted reference on it (used for the last time here)
    ///   keeps it so.
    #[cold]
    #[inline(never)]
    unsafe fn free_rare(cell: NonNull<ShardCell>, room: SpareRecord) {
        // SAFETY: the caller's reference keeps the cell alive until the end of the locked section.
        let this = unsafe { cell.as_ref() };
        let (released, destroy) = {
            let mut shard = this.state.lock();
            shard.outstanding -= 1;
            let destroy = shard.pool_dropped && shard.outstanding == 0;
            let released = shard.take_empty_chunks(this.keep_empty_chunks, &this.pool.reserved);
            (released, destroy)
        };
        drop((released, room));
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

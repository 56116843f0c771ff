//! Per-thread caches of freed small blocks ("magazines"), enabled by
//! [`PoolConfig::thread_cache`](super::PoolConfig::thread_cache).
//!
//! A block of at most [`MAX_CACHED_SIZE`] bytes dropped on a thread whose magazine serves the
//! block's pool is kept there instead of going back to its shard; the next allocation of a size in
//! the same 16-byte bucket on that thread takes it back. Both steps touch only thread-local data:
//! no lock, no atomic read-modify-write, no allocator work. A cached allocation stays counted as
//! outstanding in its shard, so its shard cell and chunk stay alive exactly as for a live block.
//!
//! A magazine serves one pool at a time (the one its thread last allocated from). Its entries go
//! back to their shards when the thread allocates from another pool, when it calls
//! [`release_thread_cache`], when it drops the last handle of the pool or trims it, and when the
//! thread exits. Until then they keep their bytes reserved: that is the price of the fast path,
//! which is why it is opt-in.
//!
//! ```
//! use vkgdr::chunk::HostMemorySource;
//! use vkgdr::pool::magazine;
//! use vkgdr::{Pool, PoolConfig};
//!
//! let pool = Pool::new(HostMemorySource, PoolConfig { thread_cache: 32, ..Default::default() })?;
//! let block = pool.alloc(256, 64)?;
//! let addr = block.host_ptr();
//! drop(block); // kept by this thread
//! assert_eq!(magazine::thread_cached_blocks(), 1);
//! let again = pool.alloc(250, 64)?; // same 16-byte bucket (241..=256): reused, no lock taken
//! assert_eq!(again.host_ptr(), addr);
//! drop(again);
//! magazine::release_thread_cache(); // back to the shard, so `trim` can free the chunk
//! assert_eq!(pool.stats().bytes_in_use, 0);
//! # Ok::<(), vkgdr::Error>(())
//! ```

use std::cell::Cell;
use std::ptr::{self, NonNull};

use super::shards::{Chunk, ShardCell};
use crate::alloc::Allocation;

/// Largest request served from a magazine (the slab range of the default allocator).
pub const MAX_CACHED_SIZE: u64 = 4096;
/// Largest [`PoolConfig::thread_cache`](super::PoolConfig::thread_cache) (blocks per bucket and
/// thread; each bucket's storage is reserved whole on first use).
pub const MAX_DEPTH: usize = 1024;
/// Bucket width: requests are grouped by `(size - 1) / BUCKET_BYTES`.
const BUCKET_BYTES: u64 = 16;
const BUCKETS: usize = (MAX_CACHED_SIZE / BUCKET_BYTES) as usize;

/// A freed block's allocation, still counted as outstanding in `cell`.
pub(super) struct Cached {
    pub(super) cell: NonNull<ShardCell>,
    /// The chunk the allocation lies in; valid while the allocation is live (see `BlockKind`).
    pub(super) chunk: *const Chunk,
    pub(super) allocation: Allocation,
}

struct Magazine {
    /// `PoolInner::id` of the pool the entries belong to (0: none yet).
    pool: u64,
    /// Entries per bucket at most (the pool's `thread_cache`).
    depth: usize,
    buckets: Vec<Vec<Cached>>,
}

impl Magazine {
    fn take_all(&mut self) -> Vec<Cached> {
        self.buckets.iter_mut().flat_map(|b| b.drain(..)).collect()
    }
}

thread_local! {
    /// This thread's magazine: null before its first use and after the thread's teardown. A
    /// const cell without a destructor, so reading it is a single load (no lazy-initialisation or
    /// destructor-state check on the hot path).
    static CURRENT: Cell<*mut Magazine> = const { Cell::new(ptr::null_mut()) };
    /// Owns the magazine and hands its entries back when the thread exits.
    static OWNER: Owner = const { Owner(Cell::new(ptr::null_mut())) };
}

struct Owner(Cell<*mut Magazine>);

impl Drop for Owner {
    fn drop(&mut self) {
        let m = self.0.replace(ptr::null_mut());
        if m.is_null() {
            return;
        }
        // Later uses on this thread (other thread-locals' destructors dropping blocks) find no
        // magazine and free straight to the shards.
        let _ = CURRENT.try_with(|c| c.set(ptr::null_mut()));
        // SAFETY: `m` came from `Box::into_raw` in `create` and is freed only here, once (the
        // owner cell was swapped to null above); no reference to it is live: `with_magazine`
        // closures never run destructors of thread-locals.
        let mut m = unsafe { Box::from_raw(m) };
        release(m.take_all());
    }
}

/// Allocates this thread's magazine; `None` once the thread is being torn down.
#[cold]
fn create() -> Option<*mut Magazine> {
    OWNER
        .try_with(|owner| {
            debug_assert!(owner.0.get().is_null());
            let m = Box::into_raw(Box::new(Magazine {
                pool: 0,
                depth: 0,
                buckets: Vec::new(),
            }));
            owner.0.set(m);
            CURRENT.with(|c| c.set(m));
            m
        })
        .ok()
}

/// Runs `f` on this thread's magazine, creating it if `create_if_missing`. `None`: no magazine
/// (not created, or the thread is exiting).
///
/// `f` must not free blocks, drop chunks or call into a pool: nothing may reach the magazine
/// while `f` holds it (entries to free are returned and released by the caller afterwards).
#[inline]
fn with_magazine<R>(create_if_missing: bool, f: impl FnOnce(&mut Magazine) -> R) -> Option<R> {
    let mut p = CURRENT.with(Cell::get);
    if p.is_null() {
        if !create_if_missing {
            return None;
        }
        p = create()?;
    }
    // SAFETY: `p` is this thread's live magazine (freed only by `Owner::drop`, which clears
    // `CURRENT` first), never shared with other threads, and by the rule above no other
    // reference to it exists while `f` runs.
    Some(f(unsafe { &mut *p }))
}

fn bucket(size: u64) -> usize {
    ((size - 1) / BUCKET_BYTES) as usize
}

/// Frees entries to their shards (never inside `with_magazine`: freeing may drop chunks).
fn release(entries: Vec<Cached>) {
    for c in entries {
        // SAFETY: each entry holds one outstanding reference on its live cell, used here for the
        // last time (the entry is consumed).
        unsafe { ShardCell::free(c.cell, c.allocation) };
    }
}

/// Takes a cached allocation of pool `pool` that fits `size` bytes at `align`, switching this
/// thread's magazine to `pool` (and releasing the previous pool's entries) if needed. `None`: no
/// fit, or no magazine (thread exiting).
#[inline]
pub(super) fn take(pool: u64, depth: usize, size: u64, align: u64) -> Option<Cached> {
    debug_assert!(size > 0 && size <= MAX_CACHED_SIZE && align.is_power_of_two());
    let (hit, evicted) = with_magazine(true, |m| {
        if m.pool != pool {
            let old = m.take_all();
            m.pool = pool;
            m.depth = depth;
            if m.buckets.is_empty() {
                m.buckets.resize_with(BUCKETS, Vec::new);
            }
            return (None, old);
        }
        let b = &mut m.buckets[bucket(size)];
        // Usually the last entry fits; one of the same bucket may be too small or misaligned only
        // for odd size/alignment mixes, which then take the slow path. `align` is a power of two
        // (checked by `Pool::alloc`): a mask, not a division.
        match b.last() {
            Some(c) if c.allocation.size() >= size && c.allocation.offset() & (align - 1) == 0 => {
                (b.pop(), Vec::new())
            }
            _ => (None, Vec::new()),
        }
    })?;
    if !evicted.is_empty() {
        release(evicted);
    }
    hit
}

/// Offers a freed allocation of pool `pool` to this thread's magazine. Gives it back when the
/// magazine serves another pool, its bucket is full, or there is no magazine.
#[inline]
pub(super) fn offer(pool: u64, entry: Cached) -> Option<Cached> {
    let size = entry.allocation.requested_size();
    if size == 0 || size > MAX_CACHED_SIZE {
        return Some(entry);
    }
    let mut entry = Some(entry);
    with_magazine(false, |m| {
        if m.pool != pool {
            return;
        }
        let depth = m.depth;
        let b = &mut m.buckets[bucket(size)];
        if b.len() < depth {
            if b.capacity() == 0 {
                b.reserve_exact(depth);
            }
            b.push(entry.take().expect("offered once"));
        }
    });
    entry
}

/// Returns this thread's cached blocks of pool `pool` to their shards (all pools: `None`).
pub(super) fn release_pool(pool: Option<u64>) {
    let entries = with_magazine(false, |m| {
        (pool.is_none() || pool == Some(m.pool)).then(|| m.take_all())
    })
    .flatten()
    .unwrap_or_default();
    release(entries);
}

/// Returns the calling thread's cached blocks (of any pool) to their shards, so their chunks can
/// be trimmed. Threads release them anyway when they exit or allocate from another pool; call this
/// from long-lived threads that stop using a pool with
/// [`PoolConfig::thread_cache`](super::PoolConfig::thread_cache) set.
pub fn release_thread_cache() {
    release_pool(None);
}

/// Blocks in the calling thread's magazine (all pools), for tests and diagnostics.
pub fn thread_cached_blocks() -> usize {
    with_magazine(false, |m| m.buckets.iter().map(Vec::len).sum()).unwrap_or(0)
}

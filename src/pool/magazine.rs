//! Per-thread caches of freed small blocks ("magazines"), on by default
//! ([`PoolConfig::thread_cache`](super::PoolConfig::thread_cache)).
//!
//! A block of at most [`MAX_CACHED_SIZE`] bytes dropped on a thread whose magazine serves the
//! block's pool is kept there instead of going back to its shard; the next allocation of a size in
//! the same 16-byte bucket on that thread takes it back. Both steps touch only this thread's data:
//! no lock, no atomic read-modify-write, no allocator work, and what moves is the block's record
//! pointer (the record itself stays where it is). A cached allocation stays counted as
//! outstanding in its shard, so its shard cell and chunk stay alive exactly as for a live block.
//!
//! **Bounded.** A magazine serves up to [`POOLS_PER_THREAD`] pools at once (the ones its thread
//! allocated from most recently), and holds per pool at most `thread_cache` blocks per bucket
//! and `thread_cache_bytes` bytes in all.
//!
//! **Reclaimable from any thread.** [`Pool::trim`](super::Pool::trim) and dropping a pool's last
//! handle take that pool's blocks out of *every* thread's magazine, including threads that are
//! idle and never allocate again, without stopping them: each magazine is an `OwnerCell`
//! (crate-private, `sync::owner_cell`), whose owner works with plain loads and stores and whose
//! visitors get exclusive access through a handshake (`membarrier` on Linux). Blocks also go back
//! when their thread evicts the pool for another, calls [`release_thread_cache`], or exits.
//! Which barrier pair this process's handshake uses is [`handshake`]; [`Pool::report`] shows it.
//!
//! **Counted without a visit.** Each magazine publishes, per pool it serves, how many blocks and
//! requested bytes it holds (relaxed atomics the owner stores beside its plain data), so
//! [`Pool::stats`] reads every thread's figures without the visitors' heavy barrier: a snapshot
//! interrupts no thread.
//!
//! [`Pool::report`]: super::Pool::report
//! [`Pool::stats`]: super::Pool::stats
//!
//! ```
//! use vkgdr::chunk::HostMemorySource;
//! use vkgdr::pool::magazine;
//! use vkgdr::{Pool, PoolConfig};
//!
//! let pool = Pool::new(HostMemorySource, PoolConfig::default())?; // thread cache on
//! let block = pool.alloc(256, 64)?;
//! let addr = block.host_ptr();
//! drop(block); // kept by this thread
//! assert_eq!(magazine::thread_cached_blocks(), 1);
//! let again = pool.alloc(250, 64)?; // same 16-byte bucket (241..=256): reused, no lock taken
//! assert_eq!(again.host_ptr(), addr);
//! drop(again);
//! // Another thread may trim: this thread's cached block goes back too.
//! assert_eq!(pool.stats().blocks_cached, 1);
//! std::thread::scope(|s| {
//!     s.spawn(|| pool.trim());
//! });
//! assert_eq!((pool.stats().blocks_cached, pool.stats().bytes_allocated), (0, 0));
//! # Ok::<(), vkgdr::Error>(())
//! ```

use std::cell::Cell;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::core::sync::lock::Mutex;

use super::config::cacheable;
use super::inner::{PoolInner, PoolKey};
use super::shards::{BlockRecord, ShardCell};
use crate::core::sync::OwnerCell;

// The thread-cache settings' limits and defaults, beside the settings they bound.
pub use super::config::{DEFAULT_BYTES, DEFAULT_DEPTH, MAX_CACHED_SIZE, MAX_DEPTH};
/// Pools one thread's magazine serves at once; allocating from one more evicts (returns the
/// blocks of) the pool it used least recently.
pub const POOLS_PER_THREAD: usize = 4;
/// Bucket width: requests are grouped by `(size - 1) / BUCKET_BYTES`.
const BUCKET_BYTES: u64 = 16;
const BUCKETS: usize = (MAX_CACHED_SIZE / BUCKET_BYTES) as usize;

pub use crate::core::sync::{handshake, Handshake};

/// One slot's figures as other threads read them ([`Pool::stats`](super::Pool::stats)): stored
/// (relaxed) by whoever holds the slot after each change, read without the handshake. A reader
/// racing with a change may see the figures before or after it, never torn numbers: blocks and
/// requested bytes share one word, so the owner publishes both with one load and one store.
/// On cache lines of its own: the owner stores to it on every cached allocation and free, and
/// another thread's figures next to it would make both threads' stores contend.
#[derive(Default)]
#[repr(align(128))]
struct Published {
    pool: AtomicU64,
    /// `blocks << 32 | requested bytes`: a slot holds at most `MAX_DEPTH * BUCKETS` blocks of at
    /// most `MAX_CACHED_SIZE` bytes, 2^30 bytes in all, so neither half overflows into the other.
    counts: AtomicU64,
}

const _: () = assert!((MAX_DEPTH as u64) * (BUCKETS as u64) * MAX_CACHED_SIZE < 1 << 32);

/// One block in `Published::counts`.
const ONE_BLOCK: u64 = 1 << 32;

impl Published {
    /// Blocks and requested bytes.
    fn counts(&self) -> (u64, u64) {
        let c = self.counts.load(Ordering::Relaxed);
        (c >> 32, c & (ONE_BLOCK - 1))
    }
}

/// A cached block: its record, as the block held it (a shared one).
type Entry = Box<BlockRecord>;

/// One bucket's cached records: a stack linked through the records themselves
/// ([`BlockRecord::cache_next`]), so a take reads the top record (which the new block needs
/// anyway) and an offer writes one link, with no storage of the bucket's own to reserve, index
/// or grow. The bucket owns every record on its stack (each one a leaked `Entry`); the links
/// are raw pointers so that moving one costs no drop glue. A bucket is emptied
/// ([`PoolSlot::drain_into`]) before its magazine goes: records left in one would never go back
/// to their shards.
#[derive(Default)]
struct Bucket {
    top: Option<NonNull<BlockRecord>>,
    len: usize,
}

// SAFETY: a bucket owns its records as the `Entry` boxes they were (`BlockRecord` is `Send`);
// it is moved and used by one thread at a time (its magazine's owner or a visitor holding it).
unsafe impl Send for Bucket {}

impl Bucket {
    /// The top record, borrowed.
    #[inline(always)]
    fn top(&self) -> Option<&BlockRecord> {
        // SAFETY: `top` is a record this bucket owns (pushed as a box, not yet popped), alive
        // while the bucket is borrowed.
        self.top.map(|t| unsafe { &*t.as_ptr() })
    }

    /// Takes the top record.
    #[inline(always)]
    fn pop(&mut self) -> Option<Entry> {
        let top = self.top?;
        // SAFETY: `top` came from `Box::leak` in `push` and is owned by this bucket; taking
        // it off the stack right below hands that ownership back to exactly one box.
        let mut entry = unsafe { Box::from_raw(top.as_ptr()) };
        self.top = entry.cache_next.take();
        self.len -= 1;
        Some(entry)
    }

    /// Puts `entry` (a record not in any bucket: `cache_next` is `None`) on top.
    #[inline(always)]
    fn push(&mut self, mut entry: Entry) {
        debug_assert!(entry.cache_next.is_none());
        entry.cache_next = self.top;
        self.top = Some(NonNull::from(Box::leak(entry)));
        self.len += 1;
    }
}

/// A slot's buckets, indexed by `bucket(size)`: a fixed array, so indexing needs no bounds check.
type Buckets = [Bucket; BUCKETS];

/// One pool's part of a magazine.
struct PoolSlot {
    /// The pool served (0: none).
    pool: u64,
    depth: usize,
    max_bytes: u64,
    /// Rounded sizes of the entries held. (Their number and requested sizes are kept only in
    /// `published`: one copy to update per take and push.)
    bytes: u64,
    /// Allocated when the slot first serves a pool (so `Some` whenever `pool != 0`).
    buckets: Option<Box<Buckets>>,
    /// `pool` and the counts for readers on other threads.
    published: Arc<Published>,
}

impl PoolSlot {
    fn new() -> PoolSlot {
        PoolSlot {
            pool: 0,
            depth: 0,
            max_bytes: 0,
            bytes: 0,
            buckets: None,
            published: Arc::default(),
        }
    }

    /// Stores the figures other threads read after a change of the slot's pool: the pool, and
    /// no entries.
    fn publish_empty(&self) {
        let p = &*self.published;
        p.pool.store(self.pool, Ordering::Relaxed);
        p.counts.store(0, Ordering::Relaxed);
    }

    /// Counts one more entry (`add`) or one less, of `requested` bytes, where other threads read
    /// the counts. Only the slot's holder (its owner, or a visitor with exclusive access) stores
    /// them, so a plain load and store, no read-modify-write.
    #[inline(always)]
    fn count(&self, add: bool, requested: u64) {
        let p = &*self.published;
        let c = p.counts.load(Ordering::Relaxed);
        let one = ONE_BLOCK | requested;
        p.counts
            .store(if add { c + one } else { c - one }, Ordering::Relaxed);
    }

    /// Entries held.
    fn blocks(&self) -> u64 {
        self.published.counts().0
    }

    /// Takes the top entry of `bucket` if it holds `size` bytes at `align`.
    #[inline(always)]
    fn pop_fitting(&mut self, bucket: usize, size: u64, align: u64) -> Option<Entry> {
        // Usually the top entry fits; one of the same bucket may be too small or misaligned only
        // for odd size/alignment mixes, which then take the slow path. `align` is a power of two
        // (checked by `Pool::alloc`): a mask, not a division.
        let bucket = &mut self.buckets.as_mut()?[bucket];
        let a = &bucket.top()?.hold()?.allocation;
        if a.size() < size || a.offset() & (align - 1) != 0 {
            return None;
        }
        let (rounded, requested) = (a.size(), a.requested_size());
        let entry = bucket.pop()?;
        self.bytes -= rounded;
        self.count(false, requested);
        Some(entry)
    }

    /// Empties the slot into `out` and forgets its pool.
    fn drain_into(&mut self, out: &mut Vec<Entry>) {
        for b in self.buckets.iter_mut().flat_map(|b| b.iter_mut()) {
            while let Some(entry) = b.pop() {
                out.push(entry);
            }
        }
        self.pool = 0;
        self.bytes = 0;
        self.publish_empty();
    }
}

/// What a magazine holds: its pools' slots, most recently used first (slot 0 serves the pool
/// this thread allocated from last, so the hot paths look there only; the last slot is the one
/// evicted).
struct Slots {
    slots: [PoolSlot; POOLS_PER_THREAD],
}

impl Slots {
    /// The slot serving `pool`, without changing the order (for frees).
    #[inline(always)]
    fn find(&mut self, pool: u64) -> Option<&mut PoolSlot> {
        if self.slots[0].pool == pool {
            return Some(&mut self.slots[0]);
        }
        self.find_other(pool)
    }

    #[cold]
    #[inline(never)]
    fn find_other(&mut self, pool: u64) -> Option<&mut PoolSlot> {
        self.slots[1..].iter_mut().find(|s| s.pool == pool)
    }

    /// The slot serving `pool`, moved to the front as the most recently used (for allocations).
    #[inline(always)]
    fn find_and_use(&mut self, pool: u64) -> Option<&mut PoolSlot> {
        if self.slots[0].pool == pool {
            return Some(&mut self.slots[0]);
        }
        self.promote(pool)
    }

    #[cold]
    #[inline(never)]
    fn promote(&mut self, pool: u64) -> Option<&mut PoolSlot> {
        let i = self.slots.iter().position(|s| s.pool == pool)?;
        self.slots[..=i].rotate_right(1);
        Some(&mut self.slots[0])
    }

    fn take_all(&mut self) -> Vec<Entry> {
        let mut out = Vec::new();
        for s in &mut self.slots {
            s.drain_into(&mut out);
        }
        out
    }
}

/// One thread's magazine: shared with visitors (trim, pool drop) through its `OwnerCell`, and
/// with readers of its figures through each slot's `Published`. Aligned to whole cache lines (as
/// `CachePadded`) so that no other thread's data shares a line with the owner's hot flags and
/// counters.
#[repr(align(128))]
struct Magazine {
    cell: OwnerCell<Slots>,
    published: [Arc<Published>; POOLS_PER_THREAD],
}

/// Every live magazine, for visitors. Locked to register (a thread's first cached block), to
/// deregister (thread exit) and for a visit.
static REGISTRY: Mutex<Vec<Arc<Magazine>>> = Mutex::new(Vec::new());

thread_local! {
    /// This thread's magazine: null before its first use and after the thread's teardown. A
    /// const cell without a destructor, so reading it is a single load (no lazy-initialisation or
    /// destructor-state check on the hot path).
    static CURRENT: Cell<*const Magazine> = const { Cell::new(ptr::null()) };
    /// Owns the magazine and hands its entries back when the thread exits.
    static OWNER: Owner = const { Owner(Cell::new(None)) };
}

struct Owner(Cell<Option<Arc<Magazine>>>);

impl Drop for Owner {
    fn drop(&mut self) {
        let Some(m) = self.0.take() else { return };
        // Later uses on this thread (other thread-locals' destructors dropping blocks) find no
        // magazine and free straight to the shards.
        let _ = CURRENT.try_with(|c| c.set(ptr::null()));
        // SAFETY: this thread owns the magazine; the closure does not block or visit.
        let entries = unsafe { m.cell.with_owner(Slots::take_all) };
        REGISTRY.lock().retain(|r| !Arc::ptr_eq(r, &m));
        release(entries);
    }
}

/// Allocates and registers this thread's magazine; `None` once the thread is being torn down.
#[cold]
fn create() -> Option<*const Magazine> {
    OWNER
        .try_with(|owner| {
            let slots: [PoolSlot; POOLS_PER_THREAD] = std::array::from_fn(|_| PoolSlot::new());
            let published = std::array::from_fn(|i| slots[i].published.clone());
            let m = Arc::new(Magazine {
                cell: OwnerCell::new(Slots { slots }),
                published,
            });
            REGISTRY.lock().push(m.clone());
            let p = Arc::as_ptr(&m);
            owner.0.set(Some(m));
            CURRENT.with(|c| c.set(p));
            p
        })
        .ok()
}

/// This thread's magazine, created if `create_if_missing`; null without one (not created, or
/// the thread is exiting).
#[inline]
fn current(create_if_missing: bool) -> *const Magazine {
    let p = CURRENT.with(Cell::get);
    if p.is_null() && create_if_missing {
        return create().unwrap_or(ptr::null());
    }
    p
}

/// Runs `f` on this thread's magazine as its owner, creating it if `create_if_missing`.
/// `R::default()` (`None`, `false`, `0`, nothing) without a magazine: not created, or the thread
/// is exiting.
///
/// `f` must not free blocks, drop chunks or call into a pool: entries to free are returned and
/// released by the caller afterwards (a visitor may be waiting for `f` to end).
#[inline]
fn with_magazine<R: Default>(create_if_missing: bool, f: impl FnOnce(&mut Slots) -> R) -> R {
    let p = current(create_if_missing);
    if p.is_null() {
        return R::default();
    }
    // SAFETY: `p` is this thread's live magazine (the `Arc` in `OWNER` keeps it; `Owner::drop`
    // clears `CURRENT` first), and this thread is its only owner; by the rule above `f` neither
    // blocks nor visits nor re-enters.
    unsafe { (*p).cell.with_owner(f) }
}

/// The bucket of a size in `1..=MAX_CACHED_SIZE`. (The mask changes nothing for those; it lets
/// the compiler drop the bounds check.)
#[inline(always)]
fn bucket(size: u64) -> usize {
    ((size - 1) / BUCKET_BYTES) as usize & (BUCKETS - 1)
}

/// Frees entries to their shards (never inside `with_magazine`: freeing may drop chunks).
fn release(entries: Vec<Entry>) -> usize {
    let n = entries.len();
    for record in entries {
        // SAFETY: each entry is a shared block's record (only those are offered), moved here
        // from the block, never copied: its cell is alive and its reference is used here for
        // the last time (the entry is consumed).
        unsafe { ShardCell::free(record) };
    }
    n
}

/// Takes a cached allocation of `pool` (its `PoolKey::id`) that fits `size` bytes at `align`
/// from this thread's magazine. `None`: no fit, no magazine, or the magazine does not serve
/// `pool` (the slow path's [`serve`] makes it). One path in and one out, so the entry moves from
/// the bucket to the block in registers.
///
/// `FAST` only looks at the most recently used slot and never waits: a path with no call in it,
/// which keeps the caller's frame small; while a visitor (a trim, a pool's drop) holds the
/// magazine it says `None`. Otherwise a slot found further back becomes the most recently used,
/// and a visitor is waited for (it holds the magazine for a few moves), so whether a block is
/// cached never depends on another thread's timing.
#[inline(always)]
pub(super) fn take<const FAST: bool>(pool: u64, size: u64, align: u64) -> Option<Entry> {
    debug_assert!(size > 0 && size <= MAX_CACHED_SIZE && align.is_power_of_two());
    let p = current(false);
    if p.is_null() {
        return None;
    }
    if FAST {
        // SAFETY: `p` is this thread's live magazine (see `with_magazine`), and this thread is
        // its only owner; the access below only moves values and ends before we return.
        let mut m = unsafe { (*p).cell.try_enter() }?;
        take_in(&mut m.slots[0], pool, size, align)
    } else {
        // SAFETY: as above; the closure only moves values.
        unsafe {
            (*p).cell
                .with_owner(|m| take_in(m.find_and_use(pool)?, pool, size, align))
        }
    }
}

/// [`take`] from `slot`, if it serves `pool`.
#[inline(always)]
fn take_in(slot: &mut PoolSlot, pool: u64, size: u64, align: u64) -> Option<Entry> {
    if slot.pool != pool {
        return None;
    }
    slot.pop_fitting(bucket(size), size, align)
}

/// Makes this thread's magazine (created if needed) serve `pool`, evicting its least recently
/// used pool if all slots are taken, and frees what that evicted; sets `serving` when it starts
/// to, so the pool knows a visit may find something. For the allocation slow path of requests
/// the cache could serve: freed blocks are kept only by magazines that serve their pool.
#[cold]
#[inline(never)]
pub(super) fn serve(pool: PoolKey, serving: &AtomicBool) {
    let evicted: Option<Vec<Entry>> = with_magazine(true, |m| {
        if m.find_and_use(pool.id).is_some() {
            return None;
        }
        Some(serve_in(m, pool))
    });
    if let Some(evicted) = evicted {
        serving.store(true, Ordering::Relaxed);
        release(evicted);
    }
}

/// Makes `m` serve `pool` in a free slot or in its least recently used one, moved to the front;
/// returns the evicted entries (freed by the caller, outside the magazine).
#[cold]
fn serve_in(m: &mut Slots, pool: PoolKey) -> Vec<Entry> {
    let i = m
        .slots
        .iter()
        .position(|s| s.pool == 0)
        .unwrap_or(POOLS_PER_THREAD - 1);
    m.slots[..=i].rotate_right(1);
    let slot = &mut m.slots[0];
    let mut evicted = Vec::new();
    slot.drain_into(&mut evicted);
    if slot.buckets.is_none() {
        slot.buckets = Some(Box::new(std::array::from_fn(|_| Bucket::default())));
    }
    slot.pool = pool.id;
    slot.depth = pool.depth;
    slot.max_bytes = pool.max_bytes;
    slot.publish_empty();
    evicted
}

/// Offers a freed block's record of pool `pool` (`requested` and rounded `size` bytes) to this
/// thread's magazine, which keeps it if it serves the pool and the bucket and the byte budget
/// have room. Returns the record when refused: the caller still owns it.
///
/// `FAST` only looks at the most recently used slot and never waits (a visitor holding the
/// magazine: refused): a path with no call in it, which keeps the caller's frame small. Its
/// caller has checked that `requested` is in `1..=MAX_CACHED_SIZE` (a record's
/// [`Hold::cache_pool`](super::shards::Hold::cache_pool) says so). A caller refused by it asks
/// again without `FAST` before freeing to the shard; that one waits for a visitor, as [`take`]
/// does.
#[inline(always)]
pub(super) fn offer<const FAST: bool>(
    pool: u64,
    requested: u64,
    size: u64,
    entry: Entry,
) -> Option<Entry> {
    debug_assert!(!FAST || cacheable(requested));
    if !FAST && !cacheable(requested) {
        return Some(entry);
    }
    let p = current(false);
    if p.is_null() {
        return Some(entry);
    }
    if FAST {
        // SAFETY: `p` is this thread's live magazine (see `with_magazine`), and this thread is
        // its only owner; the access below only moves values and ends before we return.
        let Some(mut m) = (unsafe { (*p).cell.try_enter() }) else {
            return Some(entry);
        };
        offer_in(&mut m.slots[0], pool, requested, size, entry)
    } else {
        // SAFETY: as above; the closure only moves values.
        unsafe {
            (*p).cell.with_owner(|m| match m.find(pool) {
                Some(slot) => offer_in(slot, pool, requested, size, entry),
                None => Some(entry),
            })
        }
    }
}

/// [`offer`] to `slot`, if it serves `pool`.
#[inline(always)]
fn offer_in(
    slot: &mut PoolSlot,
    pool: u64,
    requested: u64,
    size: u64,
    entry: Entry,
) -> Option<Entry> {
    if slot.pool != pool {
        return Some(entry);
    }
    let Some(buckets) = slot.buckets.as_mut() else {
        return Some(entry);
    };
    let bucket = &mut buckets[bucket(requested)];
    if slot.bytes + size > slot.max_bytes || bucket.len >= slot.depth {
        return Some(entry);
    }
    bucket.push(entry);
    slot.bytes += size;
    slot.count(true, requested);
    None
}

/// Takes `pool`'s blocks back from every thread's cache.
pub(super) fn reclaim_cached(pool: &PoolInner) {
    // Relaxed is enough: a thread that started serving the pool did so in an allocation
    // that happens before this call (trim: the caller's own, or none it could wait for;
    // drop: every handle's release is ordered before the last one's drop).
    if pool.cache_enabled && pool.cache_used.load(Ordering::Relaxed) {
        reclaim_pool(pool.id);
    }
}

/// Takes `pool`'s cached blocks out of every thread's magazine (idle threads' too) and frees
/// them to their shards; the magazines stop serving the pool. Returns the number of blocks.
pub(super) fn reclaim_pool(pool: u64) -> usize {
    let mut entries = Vec::new();
    {
        let registry = REGISTRY.lock();
        let cells: Vec<&OwnerCell<Slots>> = registry.iter().map(|m| &m.cell).collect();
        OwnerCell::visit_all(&cells, |m| {
            if let Some(slot) = m.find(pool) {
                slot.drain_into(&mut entries);
            }
        });
    }
    release(entries)
}

/// `pool`'s blocks in every thread's magazine and their requested bytes: a snapshot of the
/// published figures, without visiting (no barrier reaches the threads).
pub(super) fn cached(pool: u64) -> (u64, u64) {
    let registry = REGISTRY.lock();
    let (mut blocks, mut bytes) = (0, 0);
    for p in registry.iter().flat_map(|m| &m.published) {
        if p.pool.load(Ordering::Relaxed) == pool {
            let (b, r) = p.counts();
            blocks += b;
            bytes += r;
        }
    }
    (blocks, bytes)
}

/// Returns the calling thread's cached blocks (of every pool) to their shards. Other threads'
/// caches and idle threads are reached by [`Pool::trim`](super::Pool::trim) and by dropping the
/// pool; this is for a thread that wants its own blocks back now.
pub fn release_thread_cache() {
    let entries = with_magazine(false, Slots::take_all);
    release(entries);
}

/// Blocks in the calling thread's magazine (all pools), for tests and diagnostics.
pub fn thread_cached_blocks() -> usize {
    with_magazine(false, |m| m.slots.iter().map(|s| s.blocks() as usize).sum())
}

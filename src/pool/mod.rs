//! [`Pool`]: many small aligned GPU buffers carved out of a few big chunks, in nanoseconds.
//!
//! One raw allocation costs a Vulkan allocation plus a CUDA import (~200 µs on the H100, ~110 µs to
//! free) and BAR space is scarce. The pool allocates chunks rarely and hands out [`Block`]s from
//! them through the pure allocator core ([`crate::alloc`]: slab classes for tiny sizes, TLSF for the
//! rest); requests at or above [`PoolConfig::dedicated_threshold`] get a chunk of their own.
//!
//! Threads do not serialise on one lock: the pool has several shards, each with its own heap and
//! chunks behind its own mutex, and a thread allocates from "its" shard (assigned round-robin on
//! first use). A block remembers its shard, so any thread may drop it.
//!
//! With [`PoolConfig::thread_cache`] set, each thread also keeps a small cache of its freed blocks
//! of up to 4 KiB ([`magazine`]) and reuses them without any lock or atomic operation: the
//! fastest path, at the price of cached blocks staying reserved until the thread releases them.
//!
//! On non-coherent memory, writes through a block's safe API record dirty ranges in the chunk's
//! [`crate::dirty::DirtyRanges`]; [`Block::flush`] or [`Pool::flush`] push them with
//! one `vkFlushMappedMemoryRanges` per chunk. On coherent memory none of this costs anything.

use std::cell::Cell;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::alloc::{AllocError, Allocation, ChunkId, Heap, HeapConfig, HeapStats};
use crate::chunk::{ChunkMemory, ChunkSource};
use crate::dirty::DirtyRanges;
use crate::error::{Error, MemorySide, Result};
use crate::mapping::Mapping;
use crate::vulkan::check_range;

#[cfg(feature = "gpu-alloc")]
mod gpu_alloc;
pub mod magazine;
mod spin;
#[cfg(feature = "gpu-alloc")]
pub use gpu_alloc::GpuAllocStrategy;
#[cfg(feature = "gpu-alloc")]
use gpu_alloc::{ChunkDevice, GpuAllocBackend};
use spin::SpinMutex;

/// Which allocator carves the pool's chunks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Backend {
    /// Our allocator core: sharded heaps, slab classes plus TLSF. The default: O(1), low waste,
    /// no global lock.
    #[default]
    Native,
    /// gpu-alloc's allocator (one global mutex) over the same chunks: a baseline for benchmarks
    /// and differential tests. Needs the `gpu-alloc` cargo feature.
    #[cfg(feature = "gpu-alloc")]
    GpuAlloc(GpuAllocStrategy),
}

/// How a [`Pool`] sizes, grows and trims its chunks.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Size of a shard's first chunk. Default 16 MiB.
    pub chunk_size: u64,
    /// Each new chunk of a shard doubles the previous one, up to this size. Default 256 MiB.
    pub max_chunk_size: u64,
    /// Requests of at least this many bytes get a dedicated chunk. Default 8 MiB.
    pub dedicated_threshold: u64,
    /// Total bytes of chunks (shared and dedicated) the pool may hold; beyond it allocations fail
    /// with [`Error::OutOfDeviceMemory`] (`side: Limit`). Default: no limit.
    pub max_bytes: u64,
    /// Number of shards (independent heaps). Default: available parallelism, at most 8.
    pub shards: usize,
    /// Empty chunks each shard keeps for reuse instead of returning them to the driver at once
    /// (returning and re-allocating costs ~300 µs). Default 1.
    pub keep_empty_chunks: usize,
    /// Allocator core parameters (slab page size, slab classes, granule, max alignment).
    pub heap: HeapConfig,
    /// Which allocator serves shared requests.
    pub backend: Backend,
    /// Freed blocks of up to 4 KiB each thread keeps per 16-byte size bucket for reuse by its
    /// next allocations from this pool, with no lock and no atomic operation on either side
    /// ([`magazine`]). Default 0 (off); at most [`magazine::MAX_DEPTH`].
    ///
    /// Cached blocks stay reserved (they count as in use in [`Pool::stats`] and keep their chunk
    /// from being trimmed) until their thread allocates from another pool, calls
    /// [`magazine::release_thread_cache`], trims or drops the last handle of this pool, or exits.
    /// Native backend only.
    pub thread_cache: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            chunk_size: 16 << 20,
            max_chunk_size: 256 << 20,
            dedicated_threshold: 8 << 20,
            max_bytes: u64::MAX,
            shards: std::thread::available_parallelism()
                .map_or(4, |n| n.get())
                .min(8),
            keep_empty_chunks: 1,
            heap: HeapConfig::default(),
            backend: Backend::Native,
            thread_cache: 0,
        }
    }
}

/// One chunk with its dirty-range tracker. Blocks hold an `Arc`, so the memory outlives them.
struct Chunk {
    memory: Box<dyn ChunkMemory>,
    /// `memory.host_ptr()` and `memory.device_ptr()`, read once: every block creation needs them.
    host_base: HostBase,
    device_base: Option<u64>,
    dirty: Mutex<DirtyRanges>,
}

/// The chunk's host base pointer, kept with its provenance.
struct HostBase(*mut u8);

// SAFETY: the pointer is only used to compute block addresses inside the chunk, which the chunk
// (and so this value) outlives; it carries no thread affinity.
unsafe impl Send for HostBase {}
// SAFETY: as above; it is never written through here.
unsafe impl Sync for HostBase {}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chunk")
            .field("size", &self.memory.size())
            .field("host_ptr", &self.memory.host_ptr())
            .finish()
    }
}

impl Chunk {
    fn flush(&self, scratch: &mut Vec<(u64, u64)>) -> Result<()> {
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

struct Shard {
    heap: Heap,
    /// Indexed by `ChunkId`.
    chunks: Vec<Option<Arc<Chunk>>>,
    next_chunk_size: u64,
    /// Live blocks of this shard; with `pool_dropped`, decides who frees the cell (see `ShardSet`).
    outstanding: u64,
    /// Set when the last `Pool` handle is gone.
    pool_dropped: bool,
}

/// A shard and the pool state it needs to free blocks.
///
/// Its lifetime is reference-counted by hand under its own mutex (`outstanding` blocks plus the
/// pool's one reference) instead of with an `Arc`: alloc and free take the lock anyway, and two
/// fewer atomic read-modify-writes per alloc+free pair is a third of the pool's overhead.
#[repr(align(128))] // its own cache lines: shards of different threads must not share one
struct ShardCell {
    state: SpinMutex<Shard>,
    pool: Arc<PoolInner>,
}

/// The pool's references to its shards. When the last `Pool` clone drops, each shard is marked;
/// a shard with no live block is freed at once, otherwise by its last block.
struct ShardSet {
    cells: Box<[NonNull<ShardCell>]>,
}

// SAFETY: the cells are only accessed through their mutex; the pointers stay valid while the set
// lives (the set holds the pool's reference on each cell).
unsafe impl Send for ShardSet {}
// SAFETY: as above.
unsafe impl Sync for ShardSet {}

impl ShardSet {
    fn get(&self, i: usize) -> &ShardCell {
        // SAFETY: a cell is freed only after `pool_dropped` is set, which happens in our Drop.
        unsafe { self.cells[i].as_ref() }
    }
    fn len(&self) -> usize {
        self.cells.len()
    }
    fn iter(&self) -> impl Iterator<Item = &ShardCell> {
        (0..self.len()).map(|i| self.get(i))
    }
}

impl Drop for ShardSet {
    fn drop(&mut self) {
        // Blocks dropped from now on go straight back to their shards, and this thread's cached
        // ones go back now (other threads' return when they release their caches).
        // SAFETY: the cells are alive: we still hold the pool's reference on each.
        if let Some(pool) = self.cells.first().map(|c| unsafe { &c.as_ref().pool }) {
            pool.dropped.store(true, Ordering::Release);
            magazine::release_pool(Some(pool.id));
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

/// Pool identities for the thread caches (never reused, unlike addresses).
static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

/// Pool state shared by every shard and block.
struct PoolInner {
    /// Unique id: which pool a thread cache serves.
    id: u64,
    /// Set when the last `Pool` handle is gone: blocks then bypass the thread caches.
    dropped: AtomicBool,
    /// `thread_cache > 0` on the native backend.
    cache_enabled: bool,
    source: Box<dyn ChunkSource>,
    config: PoolConfig,
    /// Bytes of all chunks currently held (shared and dedicated), for the byte limit.
    reserved: AtomicU64,
    /// Chunks handed to dedicated blocks, for statistics.
    dedicated: AtomicU64,
    non_coherent: bool,
    atom: u64,
    #[cfg(feature = "gpu-alloc")]
    gpu_alloc: Option<GpuAllocBackend>,
}

/// A pool of small aligned blocks over BAR-mapped chunks. Cheap to clone, `Send + Sync`.
///
/// ```no_run
/// use vkgdr::{Gpu, Mapping, Pool, PoolConfig};
/// # fn main() -> vkgdr::Result<()> {
/// let pool = Pool::new(Gpu::open(0)?, PoolConfig::default())?;
/// let mut block = pool.alloc(256, 64)?;          // nanoseconds, 64-byte aligned
/// block.write(0, &[1u8; 256])?;                   // bounds-checked; dirty range recorded
/// block.flush()?;                                 // no-op on coherent memory
/// let device_address = block.device_ptr().unwrap();
/// # let _ = device_address; Ok(()) }
/// ```
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
    shards: Arc<ShardSet>,
    /// `(base, len)` of the device range when built on an arena.
    contiguous: Option<(u64, u64)>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("shards", &self.shards.len())
            .field("reserved", &self.inner.reserved.load(Ordering::Relaxed))
            .field("non_coherent", &self.inner.non_coherent)
            .finish()
    }
}

/// A usage snapshot of a pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolStats {
    /// Bytes of all chunks held, including dedicated ones.
    pub bytes_reserved: u64,
    /// Bytes requested by live blocks in shared chunks.
    pub bytes_in_use: u64,
    /// Bytes handed out (rounded sizes) in shared chunks.
    pub bytes_allocated: u64,
    /// Shared chunks held.
    pub chunks: u64,
    /// Dedicated chunks held (one per large block).
    pub dedicated_chunks: u64,
    /// Largest free block in any shard.
    pub largest_free_block: u64,
    /// Per-shard allocator statistics.
    pub shards: Vec<HeapStats>,
}

thread_local! {
    static THREAD_SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

fn thread_shard(n: usize) -> usize {
    THREAD_SHARD.with(|s| {
        let mut v = s.get();
        if v == usize::MAX {
            v = NEXT_SHARD.fetch_add(1, Ordering::Relaxed);
            s.set(v);
        }
        v % n
    })
}

fn alloc_err(e: AllocError) -> Error {
    match e {
        AllocError::ZeroSize => Error::invalid("allocation size is zero"),
        AllocError::BadAlignment { align } => {
            Error::invalid(format!("alignment {align} is not a power of two"))
        }
        AllocError::AlignmentTooLarge { align, max } => Error::invalid(format!(
            "alignment {align} exceeds the pool's maximum {max}"
        )),
        AllocError::Overflow { size } => {
            Error::invalid(format!("allocation of {size} bytes is too large"))
        }
        e => Error::Alloc(e),
    }
}

impl Pool {
    /// Creates a pool over `source` (a [`Gpu`](crate::Gpu), an `Arc<VulkanContext>`, or a
    /// [`HostMemorySource`](crate::chunk::HostMemorySource)). No chunk is allocated until needed.
    pub fn new(source: impl ChunkSource + 'static, config: PoolConfig) -> Result<Pool> {
        let heap_cfg = config.heap.clone();
        if config.shards == 0 {
            return Err(Error::invalid("a pool needs at least one shard"));
        }
        if config.chunk_size == 0 || !config.chunk_size.is_multiple_of(heap_cfg.max_align) {
            return Err(Error::invalid(format!(
                "chunk size {} must be a non-zero multiple of the maximum alignment {}",
                config.chunk_size, heap_cfg.max_align
            )));
        }
        if config.max_chunk_size < config.chunk_size {
            return Err(Error::invalid("max_chunk_size is smaller than chunk_size"));
        }
        if config.dedicated_threshold == 0 {
            return Err(Error::invalid("dedicated_threshold is zero"));
        }
        if config.thread_cache > magazine::MAX_DEPTH {
            return Err(Error::invalid(format!(
                "thread_cache {} exceeds {} blocks per size bucket",
                config.thread_cache,
                magazine::MAX_DEPTH
            )));
        }
        let heaps = (0..config.shards)
            .map(|_| Heap::new(heap_cfg.clone()).map_err(alloc_err))
            .collect::<Result<Vec<_>>>()?;
        #[cfg(feature = "gpu-alloc")]
        let gpu_alloc = match config.backend {
            Backend::Native => None,
            Backend::GpuAlloc(strategy) => Some(GpuAllocBackend::new(
                strategy,
                config.chunk_size,
                config.max_chunk_size,
                config.dedicated_threshold,
                source.atom_size(),
                !source.is_non_coherent(),
            )),
        };
        let first_chunk = config.chunk_size;
        let inner = Arc::new(PoolInner {
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            dropped: AtomicBool::new(false),
            cache_enabled: config.thread_cache > 0 && config.backend == Backend::Native,
            #[cfg(feature = "gpu-alloc")]
            gpu_alloc,
            non_coherent: source.is_non_coherent(),
            atom: source.atom_size(),
            source: Box::new(source),
            config,
            reserved: AtomicU64::new(0),
            dedicated: AtomicU64::new(0),
        });
        let shards = heaps
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
                    pool: inner.clone(),
                })))
            })
            .collect();
        Ok(Pool {
            inner,
            shards: Arc::new(ShardSet { cells: shards }),
            contiguous: None,
        })
    }

    /// A pool whose blocks all lie in one contiguous, growable device range (a CUDA VMM
    /// [`Arena`](crate::Arena) reserving `reserve` bytes, mapped in `chunk_size` chunks, a multiple
    /// of the VMM granularity). Growing never moves a block; empty chunks at the end are unmapped.
    ///
    /// Where the device or driver lacks VMM, falls back to a pool of separate chunks with the same
    /// `config`; [`Pool::is_contiguous`] tells which one you got.
    pub fn on_arena(
        gpu: &crate::Gpu,
        reserve: u64,
        chunk_size: u64,
        config: PoolConfig,
    ) -> Result<Pool> {
        match crate::Arena::new(gpu, reserve, chunk_size) {
            Ok(arena) => {
                let source = crate::arena::ArenaSource::new(arena);
                let base = source.device_ptr();
                let cfg = PoolConfig {
                    chunk_size,
                    max_chunk_size: chunk_size,
                    dedicated_threshold: config.dedicated_threshold.min(chunk_size),
                    ..config
                };
                let mut pool = Pool::new(source, cfg)?;
                pool.contiguous = Some((base, reserve));
                Ok(pool)
            }
            Err(Error::Unsupported(_)) => Pool::new(gpu.clone(), config),
            Err(e) => Err(e),
        }
    }

    /// For pools made by [`Pool::on_arena`] on a VMM-capable device: the device range
    /// `(base, len)` every block lies in.
    pub fn is_contiguous(&self) -> Option<(u64, u64)> {
        self.contiguous
    }

    /// The pool's configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.inner.config
    }

    /// Whether blocks need flushes (non-coherent or forced-non-coherent memory).
    pub fn is_non_coherent(&self) -> bool {
        self.inner.non_coherent
    }

    /// Allocates `size` bytes aligned to `align` (a power of two up to
    /// [`HeapConfig::max_align`], 64 KiB by default). The alignment holds for the device address
    /// and, up to the host mapping's own alignment (page size at least), for the host address.
    #[inline]
    pub fn alloc(&self, size: u64, align: u64) -> Result<Block> {
        // The thread-cache hit on coherent memory, small enough to inline into callers; every
        // other case (and every error) takes `alloc_slow`.
        let inner = &*self.inner;
        if inner.cache_enabled
            && !inner.non_coherent
            && size > 0
            && size <= magazine::MAX_CACHED_SIZE
            && size < inner.config.dedicated_threshold
            && align.is_power_of_two()
            && align <= inner.config.heap.max_align
        {
            if let Some(c) = magazine::take(inner.id, inner.config.thread_cache, size, align) {
                return Ok(Block::cached(c, size, false));
            }
        }
        self.alloc_slow(size, align)
    }

    #[inline(never)]
    fn alloc_slow(&self, size: u64, align: u64) -> Result<Block> {
        if size == 0 {
            return Err(Error::invalid("allocation size is zero"));
        }
        if !align.is_power_of_two() {
            return Err(Error::invalid(format!(
                "alignment {align} is not a power of two"
            )));
        }
        if align > self.inner.config.heap.max_align {
            return Err(alloc_err(AllocError::AlignmentTooLarge {
                align,
                max: self.inner.config.heap.max_align,
            }));
        }
        if size >= self.inner.config.dedicated_threshold {
            return self.alloc_dedicated(size);
        }
        // On non-coherent memory every block owns whole atoms, so flushing or invalidating one
        // block's rounded range never touches a neighbour's bytes.
        let (alloc_size, align) = if self.inner.non_coherent {
            let atom = self.inner.atom;
            (size.div_ceil(atom) * atom, align.max(atom))
        } else {
            (size, align)
        };
        #[cfg(feature = "gpu-alloc")]
        if let Some(ga) = &self.inner.gpu_alloc {
            let block = ga.alloc(&self.inner.chunk_device(), alloc_size, align)?;
            let (offset, chunk) = (block.offset(), block.memory().clone());
            return Ok(Block::new(
                &chunk,
                offset,
                size,
                self.inner.non_coherent,
                BlockKind::GpuAlloc {
                    pool: self.inner.clone(),
                    block: Some(block),
                },
            ));
        }
        // Coherent requests already tried the thread cache in `alloc`; non-coherent ones do here,
        // with their atom-rounded size and alignment.
        if self.inner.cache_enabled
            && self.inner.non_coherent
            && alloc_size <= magazine::MAX_CACHED_SIZE
        {
            let depth = self.inner.config.thread_cache;
            if let Some(c) = magazine::take(self.inner.id, depth, alloc_size, align) {
                return Ok(Block::cached(c, size, self.inner.non_coherent));
            }
        }
        let shard_index = thread_shard(self.shards.len());
        let cell = self.shards.get(shard_index);
        let mut shard = cell.state.lock();
        let allocation = match shard.heap.alloc(alloc_size, align) {
            Ok(a) => a,
            Err(AllocError::OutOfSpace {
                chunk_size_needed, ..
            }) => {
                self.grow(&mut shard, shard_index, chunk_size_needed)?;
                shard.heap.alloc(alloc_size, align).map_err(alloc_err)?
            }
            Err(e) => return Err(alloc_err(e)),
        };
        let Some(chunk) = shard
            .chunks
            .get(allocation.chunk().0 as usize)
            .and_then(|c| c.as_ref())
        else {
            let _ = shard.heap.free(allocation);
            return Err(Error::invalid(
                "allocator returned a block in an unknown chunk (bug)",
            ));
        };
        let chunk: *const Chunk = Arc::as_ptr(chunk);
        // SAFETY: the chunk stays in the shard's table while it holds a live allocation (chunks are
        // removed only when empty), and the block keeps the shard alive through its Arc.
        let block = Block::new(
            unsafe { &*chunk },
            allocation.offset(),
            size,
            self.inner.non_coherent,
            BlockKind::Shared {
                shard: self.shards.cells[shard_index],
                chunk,
                allocation: Some(allocation),
            },
        );
        shard.outstanding += 1;
        drop(shard);
        Ok(block)
    }

    fn reserve_bytes(&self, size: u64) -> Result<()> {
        let limit = self.inner.config.max_bytes;
        self.inner
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                r.checked_add(size).filter(|&n| n <= limit)
            })
            .map(|_| ())
            .map_err(|r| Error::OutOfDeviceMemory {
                side: MemorySide::Limit,
                call: "Pool::alloc",
                size,
                result: format!("pool limit {limit} bytes, {r} reserved"),
            })
    }

    fn allocate_chunk(
        &self,
        size: u64,
        trim_others_except: Option<usize>,
    ) -> Result<Box<dyn ChunkMemory>> {
        self.reserve_bytes(size)?;
        let result = match self.inner.source.allocate_chunk(size) {
            Err(e) if e.is_out_of_memory() => {
                // The BAR is full: hand back empty chunks kept by other shards, then retry once.
                // try_lock: we may hold our own shard's lock, so never wait for another shard.
                let released = self.release_empty_chunks(trim_others_except, true);
                if released > 0 {
                    self.inner.source.allocate_chunk(size)
                } else {
                    Err(e)
                }
            }
            r => r,
        };
        if result.is_err() {
            self.inner.reserved.fetch_sub(size, Ordering::AcqRel);
        }
        result
    }

    fn new_chunk(memory: Box<dyn ChunkMemory>, atom: u64) -> Result<Arc<Chunk>> {
        let dirty = DirtyRanges::new(memory.size(), atom)
            .map_err(|e| Error::invalid(format!("dirty-range tracker: {e}")))?;
        Ok(Arc::new(Chunk {
            host_base: HostBase(memory.host_ptr()),
            device_base: memory.device_ptr(),
            memory,
            dirty: Mutex::new(dirty),
        }))
    }

    fn grow(&self, shard: &mut Shard, shard_index: usize, needed: u64) -> Result<()> {
        let max_align = self.inner.config.heap.max_align;
        let size = shard
            .next_chunk_size
            .max(needed.div_ceil(max_align) * max_align);
        let memory = self.allocate_chunk(size, Some(shard_index))?;
        let base_ok = memory.device_ptr().is_none_or(|p| p % max_align == 0);
        if !base_ok {
            let got = memory.device_ptr().unwrap_or(0);
            self.inner.reserved.fetch_sub(size, Ordering::AcqRel);
            return Err(Error::Unsupported(format!(
                "chunk device address {got:#x} is not aligned to {max_align}; lower heap.max_align"
            )));
        }
        let chunk = Self::new_chunk(memory, self.inner.atom).inspect_err(|_| {
            self.inner.reserved.fetch_sub(size, Ordering::AcqRel);
        })?;
        let id = match shard.heap.add_chunk(size) {
            Ok(id) => id,
            Err(e) => {
                self.inner.reserved.fetch_sub(size, Ordering::AcqRel);
                return Err(alloc_err(e));
            }
        };
        let i = id.0 as usize;
        if shard.chunks.len() <= i {
            shard.chunks.resize(i + 1, None);
        }
        shard.chunks[i] = Some(chunk);
        shard.next_chunk_size =
            (shard.next_chunk_size.saturating_mul(2)).min(self.inner.config.max_chunk_size);
        Ok(())
    }

    fn alloc_dedicated(&self, size: u64) -> Result<Block> {
        let memory = self.allocate_chunk(size, None)?;
        let reserved = memory.size();
        // The source may round up; account for what it really holds.
        if reserved != size {
            self.inner
                .reserved
                .fetch_add(reserved - size, Ordering::AcqRel);
        }
        let chunk = Self::new_chunk(memory, self.inner.atom).inspect_err(|_| {
            self.inner.reserved.fetch_sub(reserved, Ordering::AcqRel);
        })?;
        self.inner.dedicated.fetch_add(1, Ordering::Relaxed);
        Ok(Block::new(
            &chunk.clone(),
            0,
            size,
            self.inner.non_coherent,
            BlockKind::Dedicated {
                pool: self.inner.clone(),
                chunk,
            },
        ))
    }

    /// Returns empty chunks to the driver: all of them (`keep` false) or those beyond
    /// [`PoolConfig::keep_empty_chunks`] per shard. Returns the number of chunks released.
    fn release_empty_chunks(&self, skip_shard: Option<usize>, try_only: bool) -> usize {
        let mut released = Vec::new();
        for (i, cell) in self.shards.iter().enumerate() {
            if Some(i) == skip_shard {
                continue;
            }
            let guard = if try_only {
                cell.state.try_lock()
            } else {
                Some(cell.state.lock())
            };
            if let Some(mut shard) = guard {
                shard.heap.trim();
                released.extend(self.inner.take_empty_chunks(&mut shard, 0));
            }
        }
        let n = released.len();
        drop(released); // frees the memory outside every lock
        n
    }

    /// Returns every empty chunk (and cached empty slab page) to the driver now. Returns the
    /// number of chunks released. Blocks in use are never moved.
    pub fn trim(&self) -> usize {
        // This thread's cached blocks would keep their chunks; other threads' caches cannot be
        // reached (see `PoolConfig::thread_cache`).
        magazine::release_pool(Some(self.inner.id));
        #[cfg(feature = "gpu-alloc")]
        if let Some(ga) = &self.inner.gpu_alloc {
            ga.cleanup(&self.inner.chunk_device());
        }
        self.release_empty_chunks(None, false)
    }

    /// Flushes every recorded dirty range: one `vkFlushMappedMemoryRanges` per chunk with writes.
    /// Dedicated blocks are flushed through [`Block::flush`] (they are not shared).
    pub fn flush(&self) -> Result<()> {
        if !self.inner.non_coherent {
            return Ok(());
        }
        let mut scratch = Vec::new();
        for cell in self.shards.iter() {
            let chunks: Vec<Arc<Chunk>> =
                cell.state.lock().chunks.iter().flatten().cloned().collect();
            for c in chunks {
                c.flush(&mut scratch)?;
            }
        }
        Ok(())
    }

    /// A usage snapshot (takes every shard's lock briefly).
    pub fn stats(&self) -> PoolStats {
        let mut s = PoolStats {
            bytes_reserved: self.inner.reserved.load(Ordering::Acquire),
            dedicated_chunks: self.inner.dedicated.load(Ordering::Relaxed),
            ..Default::default()
        };
        for cell in self.shards.iter() {
            let h = cell.state.lock().heap.stats();
            s.bytes_in_use += h.bytes_in_use;
            s.bytes_allocated += h.bytes_allocated;
            s.chunks += h.chunk_count as u64;
            s.largest_free_block = s.largest_free_block.max(h.largest_free_block);
            s.shards.push(h);
        }
        s
    }
}

#[cfg(feature = "gpu-alloc")]
impl Drop for PoolInner {
    fn drop(&mut self) {
        // Every gpu-alloc block holds the pool state alive, so none is live now: hand gpu-alloc's
        // cached chunks back (it warns if dropped with any).
        if let Some(ga) = &self.gpu_alloc {
            ga.cleanup(&self.chunk_device());
        }
    }
}

impl PoolInner {
    #[cfg(feature = "gpu-alloc")]
    fn chunk_device(&self) -> ChunkDevice<'_> {
        ChunkDevice {
            source: &*self.source,
            atom: self.atom,
            reserved: &self.reserved,
            limit: self.config.max_bytes,
        }
    }

    /// Removes empty chunks beyond `keep` from a shard; the caller drops them after unlocking.
    fn take_empty_chunks(&self, shard: &mut Shard, keep: usize) -> Vec<Arc<Chunk>> {
        let empty: Vec<ChunkId> = shard.heap.empty_chunks().collect();
        let mut out = Vec::new();
        for id in empty.into_iter().skip(keep) {
            if let Ok(size) = shard.heap.remove_chunk(id) {
                if let Some(c) = shard.chunks[id.0 as usize].take() {
                    self.reserved.fetch_sub(size, Ordering::AcqRel);
                    out.push(c);
                }
            }
        }
        out
    }
}

impl ShardCell {
    /// Frees a block's allocation and drops the block's reference on the cell.
    ///
    /// # Safety
    /// - `cell` must be the live cell the allocation came from, and the caller's block reference
    ///   on it must not be used again after this call.
    unsafe fn free(cell: NonNull<ShardCell>, allocation: Allocation) {
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
            let released = if shard.heap.chunk_allocations(chunk_id) == Some(0) {
                this.pool
                    .take_empty_chunks(&mut shard, this.pool.config.keep_empty_chunks)
            } else {
                Vec::new()
            };
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

enum BlockKind {
    Shared {
        /// The cell this block counts in (`Shard::outstanding`).
        shard: NonNull<ShardCell>,
        /// Points into `shard`'s chunk table; valid while `allocation` is live (see `Pool::alloc`).
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
        block: Option<gpu_alloc::MemoryBlock<Arc<Chunk>>>,
    },
}

/// A block of pool memory: host pointer, device pointer, size. Freed when dropped.
///
/// A block keeps the memory behind it alive (its shard and chunk, or its dedicated chunk), so it can
/// never dangle, even if the [`Pool`] handle is dropped first. Safe writes ([`Mapping::write`] and
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
    fn new(chunk: &Chunk, offset: u64, len: u64, non_coherent: bool, kind: BlockKind) -> Block {
        Block {
            // SAFETY: the allocator guarantees offset + len <= chunk size, so the pointer stays
            // inside the chunk's mapping.
            host_ptr: unsafe { chunk.host_base.0.add(offset as usize) },
            device_ptr: chunk.device_base.map(|p| p + offset),
            offset,
            len,
            non_coherent,
            kind,
        }
    }

    /// A block over a thread-cache entry, `len` requested bytes.
    #[inline]
    fn cached(c: magazine::Cached, len: u64, non_coherent: bool) -> Block {
        // SAFETY: the chunk outlives the live allocation the entry holds (as for any block).
        let chunk = unsafe { &*c.chunk };
        Block::new(
            chunk,
            c.allocation.offset(),
            len,
            non_coherent,
            BlockKind::Shared {
                shard: c.cell,
                chunk: c.chunk,
                allocation: Some(c.allocation),
            },
        )
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

    /// Records that `[offset, offset + len)` of the block was written through
    /// [`host_ptr`](Block::host_ptr) rather than the safe [`Mapping`] writes (which record it
    /// themselves), so the next [`Block::flush`] or [`Pool::flush`] pushes it. For raw-pointer
    /// writers such as the C library; only the bounds check on coherent memory.
    pub fn mark_written(&self, offset: u64, len: u64) -> Result<()> {
        check_range(offset, len, self.len)?;
        if self.non_coherent && len > 0 {
            self.chunk()
                .dirty
                .lock()
                .mark(self.offset + offset, len)
                .map_err(|e| Error::invalid(format!("dirty range: {e}")))?;
        }
        Ok(())
    }

    /// Whether writes to this block are waiting for a flush.
    pub fn has_pending_writes(&self) -> bool {
        self.non_coherent && self.chunk().dirty.lock().intersects(self.offset, self.len)
    }
}

impl Mapping for Block {
    /// Bounds-checked read; on CUDA chunks, reads of at least
    /// [`DMA_READ_THRESHOLD`](crate::memory::DMA_READ_THRESHOLD) bytes use `cuMemcpyDtoH`.
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len() as u64, self.len)?;
        if dst.len() >= crate::memory::DMA_READ_THRESHOLD {
            let chunk = self.chunk();
            // Pending CPU writes must reach the device before the copy engine reads them.
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
        self.mark_written(offset, len)
    }
    fn before_read(&self, offset: u64, len: u64) -> Result<()> {
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
                let entry = magazine::Cached {
                    cell: *shard,
                    chunk: *chunk,
                    allocation: a,
                };
                // SAFETY: our reference keeps the cell alive; `pool` is never changed.
                let pool = unsafe { &shard.as_ref().pool };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::HostMemorySource;

    fn small_pool(shards: usize) -> Pool {
        let cfg = PoolConfig {
            chunk_size: 128 << 10,
            max_chunk_size: 256 << 10,
            dedicated_threshold: 64 << 10,
            shards,
            ..Default::default()
        };
        Pool::new(HostMemorySource, cfg).unwrap()
    }

    #[test]
    fn blocks_are_disjoint_aligned_and_written() {
        let pool = small_pool(1);
        let mut blocks: Vec<Block> = (1..40u64)
            .map(|i| pool.alloc(i * 7, 1 << (i % 7)).unwrap())
            .collect();
        for (i, b) in blocks.iter_mut().enumerate() {
            assert_eq!(b.host_ptr() as usize % (1 << ((i + 1) % 7)), 0);
            b.fill(0, b.size(), i as u8).unwrap();
        }
        for (i, b) in blocks.iter().enumerate() {
            assert!(b
                .read_vec(0, b.size() as usize)
                .unwrap()
                .iter()
                .all(|&x| x == i as u8));
        }
        let big = pool.alloc(100 << 10, 64).unwrap();
        assert!(big.is_dedicated());
        assert_eq!(pool.stats().dedicated_chunks, 1);
    }

    #[test]
    fn last_block_frees_the_shard_after_the_pool() {
        let pool = small_pool(2);
        let a = pool.alloc(48, 16).unwrap();
        let b = pool.clone().alloc(4096, 4096).unwrap();
        let d = pool.alloc(80 << 10, 16).unwrap();
        drop(pool);
        let t = std::thread::spawn(move || drop(a));
        t.join().unwrap();
        drop(d);
        drop(b);
    }

    #[test]
    fn pool_dropped_with_no_blocks_frees_everything() {
        let pool = small_pool(3);
        drop(pool.alloc(16, 16).unwrap());
        assert_eq!(pool.trim(), 1);
        drop(pool);
    }

    fn cached_pool(depth: usize) -> Pool {
        let cfg = PoolConfig {
            chunk_size: 128 << 10,
            max_chunk_size: 128 << 10,
            dedicated_threshold: 64 << 10,
            shards: 2,
            thread_cache: depth,
            ..Default::default()
        };
        Pool::new(HostMemorySource, cfg).unwrap()
    }

    #[test]
    fn thread_cache_reuses_freed_blocks() {
        let pool = cached_pool(4);
        let a = pool.alloc(256, 16).unwrap();
        let p = a.host_ptr();
        drop(a);
        assert_eq!(magazine::thread_cached_blocks(), 1);
        assert_eq!(
            pool.stats().bytes_in_use,
            256,
            "a cached block stays reserved"
        );
        // Same 16-byte bucket: the cached block comes back.
        let b = pool.alloc(250, 16).unwrap();
        assert_eq!((b.host_ptr(), b.size()), (p, 250));
        assert_eq!(magazine::thread_cached_blocks(), 0);
        drop(b);
        // Another bucket: a fresh block.
        let c = pool.alloc(100, 16).unwrap();
        assert_ne!(c.host_ptr(), p);
        // A stricter alignment than the cached block has: the slow path, correctly aligned.
        let d = pool.alloc(250, 4096).unwrap();
        assert_eq!(d.host_ptr() as usize % 4096, 0);
        drop(d);
        magazine::release_thread_cache();
        assert_eq!(magazine::thread_cached_blocks(), 0);
        assert_eq!(pool.stats().bytes_in_use, 100);
        drop(c);
        assert_eq!(
            pool.trim(),
            1,
            "trim releases the cache, then the empty chunk"
        );
        assert_eq!(pool.stats().bytes_in_use, 0);
    }

    #[test]
    fn thread_cache_is_bounded_per_bucket() {
        let pool = cached_pool(3);
        let blocks: Vec<Block> = (0..10).map(|_| pool.alloc(64, 16).unwrap()).collect();
        drop(blocks);
        assert_eq!(magazine::thread_cached_blocks(), 3);
        assert_eq!(pool.stats().bytes_in_use, 3 * 64);
        // Blocks too large for the cache go straight back.
        drop(pool.alloc(8192, 16).unwrap());
        assert_eq!(magazine::thread_cached_blocks(), 3);
        drop(pool);
        assert_eq!(
            magazine::thread_cached_blocks(),
            0,
            "dropping the pool empties it"
        );
    }

    #[test]
    fn thread_cache_serves_one_pool_at_a_time() {
        let (a, b) = (cached_pool(4), cached_pool(4));
        drop(a.alloc(32, 16).unwrap());
        assert_eq!(a.stats().bytes_in_use, 32);
        // Allocating from another pool hands the first pool's blocks back.
        let x = b.alloc(32, 16).unwrap();
        assert_eq!(a.stats().bytes_in_use, 0);
        // Allocating from `a` switches the cache back to it; `x` (of `b`) is then freed to its
        // shard instead of being cached.
        drop(a.alloc(48, 16).unwrap());
        drop(x);
        assert_eq!(magazine::thread_cached_blocks(), 1);
        assert_eq!((a.stats().bytes_in_use, b.stats().bytes_in_use), (48, 0));
        magazine::release_thread_cache();
        assert_eq!(a.stats().bytes_in_use + b.stats().bytes_in_use, 0);
    }

    #[test]
    fn thread_cache_is_released_when_its_thread_exits() {
        let pool = cached_pool(8);
        let p = pool.clone();
        std::thread::spawn(move || {
            let blocks: Vec<Block> = (0..20).map(|i| p.alloc(16 + i * 16, 16).unwrap()).collect();
            drop(blocks);
            assert_eq!(magazine::thread_cached_blocks(), 20);
        })
        .join()
        .unwrap();
        assert_eq!(pool.stats().bytes_in_use, 0);
        // A block made on one thread and cached on another still frees correctly.
        let block = pool.alloc(64, 64).unwrap();
        let p = pool.clone();
        std::thread::spawn(move || {
            drop(p.alloc(64, 16).unwrap()); // this thread's cache now serves the pool
            drop(block);
            assert_eq!(magazine::thread_cached_blocks(), 2);
            let again = p.alloc(64, 64).unwrap();
            assert_eq!(again.host_ptr() as usize % 64, 0);
        })
        .join()
        .unwrap();
        assert_eq!(pool.stats().bytes_in_use, 0);
        assert!(pool.trim() >= 1);
    }

    #[test]
    fn oversized_thread_cache_is_refused() {
        let cfg = PoolConfig {
            thread_cache: magazine::MAX_DEPTH + 1,
            ..Default::default()
        };
        assert!(matches!(
            Pool::new(HostMemorySource, cfg),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    #[cfg(feature = "gpu-alloc")]
    fn thread_cache_is_ignored_by_gpu_alloc_backends() {
        let cfg = PoolConfig {
            chunk_size: 128 << 10,
            max_chunk_size: 128 << 10,
            dedicated_threshold: 64 << 10,
            thread_cache: 8,
            backend: Backend::GpuAlloc(GpuAllocStrategy::FreeList),
            ..Default::default()
        };
        let pool = Pool::new(HostMemorySource, cfg).unwrap();
        let a = pool.alloc(64, 16).unwrap();
        drop(a);
        assert_eq!(magazine::thread_cached_blocks(), 0);
        let b = pool.alloc(64, 16).unwrap();
        assert_eq!(b.size(), 64);
    }

    #[test]
    fn blocks_outliving_their_pool_skip_the_cache() {
        let pool = cached_pool(4);
        let a = pool.alloc(64, 16).unwrap();
        drop(pool);
        drop(a); // the pool is gone: freed to its shard, which it then frees
        assert_eq!(magazine::thread_cached_blocks(), 0);
    }
}

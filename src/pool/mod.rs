//! [`Pool`]: many small aligned GPU buffers carved out of a few big chunks, in nanoseconds.
//!
//! One raw allocation costs a Vulkan allocation plus a CUDA import (~200 µs on the H100, ~110 µs to
//! free) and BAR space is scarce. The pool allocates chunks rarely and hands out [`Block`]s from
//! them through the pure allocator core ([`crate::alloc`]: slab classes for tiny sizes, TLSF for
//! the rest); requests at or above [`PoolConfig::dedicated_threshold`] get a chunk of their own.
//!
//! Threads do not serialise on one lock: the pool has several shards, each with its own heap and
//! chunks behind its own mutex, and a thread allocates from "its" shard (assigned round-robin on
//! first use). A block remembers its shard, so any thread may drop it.
//!
//! Each thread also keeps a small, bounded cache of its freed blocks of up to 4 KiB
//! ([`magazine`], [`PoolConfig::thread_cache`]) and reuses them without any lock or atomic
//! read-modify-write: the fast path, on by default. [`Pool::trim`] and dropping the pool take
//! cached blocks back from every thread, so the cache holds no memory hostage.
//!
//! On non-coherent memory, writes through a block's safe API record dirty ranges in the chunk's
//! [`crate::dirty::DirtyRanges`]; [`Block::flush`] or [`Pool::flush`] push them with
//! one `vkFlushMappedMemoryRanges` per chunk. On coherent memory none of this costs anything.

use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use crate::core::alloc::{AllocError, Heap};
use crate::core::sync::CachePadded;
use crate::error::{Error, InvalidArgument, MemorySide, Result};
use crate::mapping::arena::{Arena, ArenaSource};
use crate::mapping::chunk::{ChunkMemory, ChunkSource};
use crate::mapping::gpu::Gpu;

mod block;
mod chunk;
mod config;
mod drain;
#[cfg(feature = "gpu-alloc")]
mod gpu_alloc;
mod inner;
mod lent;
pub mod magazine;
mod registry;
mod report;
mod shards;
#[cfg(test)]
mod tests;

pub use block::{Block, ReleaseRefused};
use chunk::Chunk;
pub use config::{Backend, PoolConfig, DEFAULT_MAX_SHARDS, MAX_SHARDS};
#[cfg(feature = "gpu-alloc")]
use gpu_alloc::GpuAllocBackend;
#[cfg(feature = "gpu-alloc")]
pub use gpu_alloc::GpuAllocStrategy;
use inner::{PoolInner, PoolKey};
pub use lent::{DeviceReleaseStats, RefusedReason, ReleaseFeed};
pub use report::{
    BlockReport, ChunkPlace, ChunkReport, LabelReport, PoolReport, PoolStats, ThreadCacheReport,
};
use shards::{thread_shard, BlockKind, BlockRecord, Shard, ShardSet, SpareRooms};

/// Pool identities for the thread caches (never reused, unlike addresses).
static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

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
    shards: Arc<Shards>,
}

/// The pool's shards as its handles share them. The last handle's drop closes the pool before
/// the set itself drops (and frees each shard without live blocks): blocks freed from then on go
/// straight back to their shards, every thread's cached ones go back now, and with the `log`
/// feature blocks still alive are worth a warning. On cache lines of its own, as [`PoolInner`]
/// is: every allocation that misses the thread cache reads it.
#[repr(align(128))]
struct Shards(ShardSet);

impl Deref for Shards {
    type Target = ShardSet;
    fn deref(&self) -> &ShardSet {
        &self.0
    }
}

impl Drop for Shards {
    fn drop(&mut self) {
        // Blocks dropped from now on go straight back to their shards, and every thread's cached
        // ones go back now.
        let pool = self.0.pool();
        pool.cache_open.store(false, Ordering::Release);
        magazine::reclaim_cached(pool);
        // No block is lent from now on; blocks lent already come back when their tokens do (the
        // drain thread goes on until then).
        drain::close(pool);
        // With the `log` feature: blocks still alive now (cached ones went back just above) are
        // worth a warning.
        #[cfg(feature = "log")]
        report::report_leaks(pool, &self.0);
    }
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

impl Pool {
    /// Creates a pool over `source` (a [`Gpu`], an `Arc<VulkanContext>`, or a
    /// [`HostMemorySource`](crate::chunk::HostMemorySource)). No chunk is allocated until needed.
    pub fn new(source: impl ChunkSource + 'static, config: PoolConfig) -> Result<Pool> {
        let atom = source.atom_size();
        if !atom.is_power_of_two() {
            return Err(InvalidArgument::SourceAtom { atom }.into());
        }
        config.validate(source.is_non_coherent().then_some(atom))?;
        // One heap built from the configuration: the shards' heaps, made on first use, share its
        // slab lookup table.
        let template = Heap::new(config.heap.clone())?;
        #[cfg(feature = "gpu-alloc")]
        let gpu_alloc = match config.backend {
            Backend::Native => None,
            Backend::GpuAlloc(strategy) => Some(GpuAllocBackend::new(
                strategy,
                config.chunk_size,
                config.max_chunk_size,
                config.dedicated_threshold,
                atom,
                !source.is_non_coherent(),
            )),
        };
        let cache_enabled = config.thread_cache > 0 && config.backend == Backend::Native;
        let id = NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed);
        let inner = Arc::new(PoolInner {
            id,
            cache_open: AtomicBool::new(cache_enabled),
            cache_enabled,
            inline_cache_max: if cache_enabled && !source.is_non_coherent() {
                magazine::MAX_CACHED_SIZE.min(config.dedicated_threshold.saturating_sub(1))
            } else {
                0
            },
            cache_key: PoolKey {
                id,
                depth: config.thread_cache,
                max_bytes: config.thread_cache_bytes,
            },
            cache_used: AtomicBool::new(false),
            size_delta: CachePadded(AtomicI64::new(0)),
            #[cfg(feature = "gpu-alloc")]
            gpu_alloc,
            non_coherent: source.is_non_coherent(),
            atom,
            source: Box::new(source),
            config,
            reserved: CachePadded(AtomicU64::new(0)),
            dedicated: CachePadded(AtomicU64::new(0)),
            registry: CachePadded(registry::Registry::default()),
            lent: CachePadded(lent::Lent::new(crate::core::ring::d2h::MAX_ENTRIES)),
        });
        let shards = Arc::new(Shards(ShardSet::new(template, &inner)));
        Ok(Pool { inner, shards })
    }

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

    /// For pools over a source that keeps every chunk in one device range (an
    /// [`ArenaSource`], as [`Pool::on_arena`] builds on a VMM-capable
    /// device): that range, `(base, len)`, which every block lies in.
    pub fn is_contiguous(&self) -> Option<(u64, u64)> {
        self.inner.source.device_range()
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
    /// [`HeapConfig::max_align`](crate::alloc::HeapConfig::max_align), 64 KiB by default). The
    /// alignment holds for the device address and, up to the host mapping's own alignment (page
    /// size at least), for the host address.
    #[inline]
    pub fn alloc(&self, size: u64, align: u64) -> Result<Block> {
        // The thread-cache hit on coherent memory, small enough to inline into callers; every
        // other case (and every error) takes `alloc_slow`.
        let inner = &*self.inner;
        // `size` in 1..=inline_cache_max, in one comparison (0 wraps to the largest value).
        if size.wrapping_sub(1) < inner.inline_cache_max
            && align.is_power_of_two()
            && align <= inner.config.heap.max_align
        {
            if let Some(record) = magazine::take::<true>(inner.id, size, align) {
                return Ok(Block::shared(record, size));
            }
        }
        self.alloc_slow(size, align)
    }

    #[inline(never)]
    fn alloc_slow(&self, size: u64, align: u64) -> Result<Block> {
        // Checked here once for every path (dedicated, cached, gpu-alloc, shared).
        self.inner.config.heap.check_request(size, align)?;
        // Blocks released on the device come back here first, so that they are allocatable as
        // soon as an allocation needs them (one load while none is lent).
        if self.inner.lent.outstanding() > 0 {
            drain::drain(&self.inner, false);
        }
        if size >= self.inner.config.dedicated_threshold {
            return self.alloc_dedicated(size, align);
        }
        // On non-coherent memory every block owns whole atoms, so flushing or invalidating one
        // block's rounded range never touches a neighbour's bytes.
        let (alloc_size, align) = if self.inner.non_coherent {
            let atom = self.inner.atom;
            let rounded = size
                .checked_next_multiple_of(atom)
                .ok_or(AllocError::Overflow { size })?;
            (rounded, align.max(atom))
        } else {
            (size, align)
        };
        #[cfg(feature = "gpu-alloc")]
        if self.inner.gpu_alloc.is_some() {
            return self.alloc_gpu_alloc(size, alloc_size, align);
        }
        if self.inner.cache_enabled && alloc_size <= magazine::MAX_CACHED_SIZE {
            if let Some(record) = self.take_cached(alloc_size, align) {
                return Ok(Block::shared(record, size));
            }
        }
        let shard_index = thread_shard(self.shards.len());
        let record = match self.shards.alloc(
            shard_index,
            alloc_size,
            align,
            (size, self.inner.non_coherent),
            |shard, needed| self.grow(shard, shard_index, needed),
        ) {
            Err(e) if e.is_out_of_memory() => self
                .alloc_from_other_shards(shard_index, size, alloc_size, align)
                .ok_or(e)?,
            r => r?,
        };
        // Made for `size`: nothing for `Block::shared` to adjust.
        Ok(Block::fresh(record))
    }

    /// When this thread's shard cannot grow (the BAR is full, or `max_bytes` is reached): the
    /// free space of the other shards, each in turn, none of them grown. So that a pool refuses
    /// a block only when none of its chunks can hold it, however many shards its chunks are
    /// spread over.
    #[cold]
    #[inline(never)]
    fn alloc_from_other_shards(
        &self,
        own: usize,
        size: u64,
        alloc_size: u64,
        align: u64,
    ) -> Option<Box<BlockRecord>> {
        let n = self.shards.len();
        (1..n).find_map(|k| {
            self.shards.alloc_from_free(
                (own + k) % n,
                alloc_size,
                align,
                (size, self.inner.non_coherent),
            )
        })
    }

    /// The thread cache's part of [`alloc_slow`](Self::alloc_slow), out of line so that the
    /// shard path's frame stays small. Coherent requests tried the cache's most recently used
    /// pool in `alloc`; here every request the cache could serve tries all its pools
    /// (non-coherent ones with their atom-rounded size and alignment). Either way such a request
    /// makes this thread's cache serve the pool (if it does not yet), so that the block is kept
    /// when it is freed here.
    #[inline(never)]
    fn take_cached(&self, alloc_size: u64, align: u64) -> Option<Box<BlockRecord>> {
        if let Some(record) = magazine::take::<false>(self.inner.id, alloc_size, align) {
            return Some(record);
        }
        magazine::serve(self.inner.cache_key, &self.inner.cache_used);
        None
    }

    /// A block of gpu-alloc's allocators ([`Backend::GpuAlloc`]).
    #[cfg(feature = "gpu-alloc")]
    #[inline(never)]
    fn alloc_gpu_alloc(&self, size: u64, alloc_size: u64, align: u64) -> Result<Block> {
        let Some(ga) = &self.inner.gpu_alloc else {
            return Err(Error::internal("the gpu-alloc backend is not set up"));
        };
        let block = ga.alloc(&self.inner.chunk_device(), alloc_size, align)?;
        let (offset, chunk) = (block.offset(), block.memory().clone());
        Ok(Block::new(
            &chunk,
            offset,
            size,
            self.inner.non_coherent,
            BlockKind::GpuAlloc {
                pool: self.inner.clone(),
                block,
            },
        ))
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
        // The source promises at least `size` bytes (an `unsafe` promise); blocks are carved up
        // to `size`, so a short chunk would put them past its end: refuse it.
        let result = result.and_then(|m| {
            if m.size() >= size {
                Ok(m)
            } else {
                Err(Error::internal(format!(
                    "the chunk source returned {} bytes for a {size}-byte chunk",
                    m.size()
                )))
            }
        });
        if result.is_err() {
            self.inner.reserved.fetch_sub(size, Ordering::AcqRel);
        }
        result
    }

    // Out of line: it runs once per chunk, and inlined it would bloat every allocation's frame.
    #[cold]
    #[inline(never)]
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
        let chunk = Chunk::new(memory, self.inner.atom).inspect_err(|_| {
            self.inner.reserved.fetch_sub(size, Ordering::AcqRel);
        })?;
        let id = match shard.heap.add_chunk(size) {
            Ok(id) => id,
            Err(e) => {
                self.inner.reserved.fetch_sub(size, Ordering::AcqRel);
                return Err(e.into());
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

    #[inline(never)]
    fn alloc_dedicated(&self, size: u64, align: u64) -> Result<Block> {
        let memory = self.allocate_chunk(size, None)?;
        // A dedicated block starts at its chunk's base: the base must honour `align`, as pool
        // growth demands of shared chunks (the device address; host mappings are page-aligned).
        if let Some(p) = memory.device_ptr().filter(|p| p % align != 0) {
            self.inner.reserved.fetch_sub(size, Ordering::AcqRel);
            return Err(Error::Unsupported(format!(
                "dedicated chunk device address {p:#x} is not aligned to {align}"
            )));
        }
        let reserved = memory.size();
        // The source may round up; account for what it really holds.
        if reserved != size {
            self.inner
                .reserved
                .fetch_add(reserved - size, Ordering::AcqRel);
        }
        let chunk = Chunk::new(memory, self.inner.atom).inspect_err(|_| {
            self.inner.reserved.fetch_sub(reserved, Ordering::AcqRel);
        })?;
        self.inner.dedicated.fetch_add(1, Ordering::Relaxed);
        self.inner
            .registry
            .dedicated
            .lock()
            .insert(Arc::as_ptr(&chunk) as registry::ChunkKey, (reserved, size));
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

    /// Returns every empty chunk of every shard but `skip_shard` to the driver (ignoring
    /// [`PoolConfig::keep_empty_chunks`]), waiting for each shard's lock or, with `try_only`,
    /// passing over shards whose lock is taken. Returns the number of chunks released.
    fn release_empty_chunks(&self, skip_shard: Option<usize>, try_only: bool) -> usize {
        let mut released = Vec::new();
        for (i, cell) in self.shards.iter() {
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
                released.extend(shard.take_empty_chunks(0, &self.inner.reserved));
            }
        }
        let n = released.len();
        drop(released); // frees the memory outside every lock
        n
    }

    /// Returns every empty chunk (and cached empty slab page) to the driver now, after taking
    /// this pool's blocks back from every thread's cache (idle threads' too), and frees the
    /// memory of freed blocks' records that the shards keep for their next allocations.
    /// Returns the number of chunks released. Blocks in use are never moved.
    pub fn trim(&self) -> usize {
        // Blocks whose device release arrived are given back first; blocks still lent keep
        // their chunks (never freed while a kernel may use them).
        if self.inner.lent.lent_now() > 0 {
            drain::drain_settled(&self.inner);
        }
        // Cached blocks keep their chunks: take them back from every thread's cache first.
        magazine::reclaim_cached(&self.inner);
        #[cfg(feature = "gpu-alloc")]
        if let Some(ga) = &self.inner.gpu_alloc {
            ga.cleanup(&self.inner.chunk_device());
        }
        // The memory of freed records each shard kept, swapped for an empty set made before the
        // lock and freed after it.
        for (_, cell) in self.shards.iter() {
            let mut rooms = SpareRooms::default();
            std::mem::swap(&mut rooms, &mut cell.state.lock().spare_records);
            drop(rooms);
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
        for (_, cell) in self.shards.iter() {
            let chunks: Vec<Arc<Chunk>> =
                cell.state.lock().chunks.iter().flatten().cloned().collect();
            for c in chunks {
                c.flush(&mut scratch)?;
            }
        }
        Ok(())
    }

    /// [`alloc`](Self::alloc), then [`Block::set_label`]: a block that
    /// [`report`](Self::report) (and, with the `log` feature, the leak warning) lists under
    /// `label`.
    pub fn alloc_labeled(&self, size: u64, align: u64, label: &str) -> Result<Block> {
        let mut block = self.alloc(size, align)?;
        block.set_label(label);
        Ok(block)
    }

    /// What the pool holds, by chunk and by label, as a value; its `Display` is a table for
    /// humans (gpu-allocator's model). Takes every shard's lock briefly.
    ///
    /// ```
    /// use vkgdr::chunk::HostMemorySource;
    /// use vkgdr::{Pool, PoolConfig};
    ///
    /// let pool = Pool::new(HostMemorySource, PoolConfig::default())?;
    /// let gains = pool.alloc_labeled(256, 64, "gains")?;
    /// let _scratch = pool.alloc(4096, 64)?;
    /// let report = pool.report();
    /// assert_eq!((report.labels[0].blocks, report.labels[0].bytes), (1, 256));
    /// assert_eq!(report.unlabeled_blocks, 1);
    /// println!("{report}");
    /// # drop(gains); Ok::<(), vkgdr::Error>(())
    /// ```
    pub fn report(&self) -> PoolReport {
        PoolReport::gather(&self.inner, &self.shards, self.stats(), self.thread_cache())
    }

    /// How this pool's per-thread caches are set up: `None` when they are off.
    pub fn thread_cache(&self) -> Option<ThreadCacheReport> {
        let inner = &self.inner;
        inner.cache_enabled.then(|| ThreadCacheReport {
            depth: inner.cache_key.depth,
            max_bytes: inner.cache_key.max_bytes,
            handshake: magazine::handshake(),
        })
    }

    /// A usage snapshot (takes every shard's lock briefly, and reads the thread caches' published
    /// figures without interrupting their threads).
    pub fn stats(&self) -> PoolStats {
        let cached = if self.inner.cache_enabled && self.inner.cache_used.load(Ordering::Relaxed) {
            magazine::cached(self.inner.id)
        } else {
            (0, 0)
        };
        let mut s = PoolStats {
            bytes_reserved: self.inner.reserved.load(Ordering::Acquire),
            dedicated_chunks: self.inner.dedicated.load(Ordering::Relaxed),
            ..Default::default()
        };
        // A shard not made yet reads as the empty heap it will start as.
        s.shards = vec![self.shards.template().stats(); self.shards.len()];
        for (i, cell) in self.shards.iter() {
            let h = cell.state.lock().heap.stats();
            s.bytes_in_use += h.bytes_in_use;
            s.bytes_allocated += h.bytes_allocated;
            s.chunks += h.chunk_count as u64;
            s.largest_free_block = s.largest_free_block.max(h.largest_free_block);
            s.shards[i] = h;
        }
        // Blocks cached (or taken back) between the snapshots make this approximate under
        // concurrent use, never negative.
        let delta = self.inner.size_delta.load(Ordering::Relaxed);
        s.bytes_in_use = s.bytes_in_use.saturating_add_signed(delta);
        s.bytes_cached = cached.1.min(s.bytes_in_use);
        s.bytes_in_use -= s.bytes_cached;
        s.blocks_cached = cached.0;
        s.device_releases = self.inner.lent.stats();
        s
    }
}

/// Device-side releases: blocks lent to kernels with [`Block::release_on_device`], given back
/// when their kernels send their tokens through the pool's release feed.
impl Pool {
    /// Sets the device → host lanes the pool's device releases arrive on (a
    /// [`LaneConsumer`](crate::ring::core::d2h::LaneConsumer) or a `Vec` of them, over lanes a
    /// kernel's `vkgdr_release_token` publishes into), once, and starts the pool's drain thread
    /// (`vkgdr-pool-drain`; where the system refuses a thread, blocks come back on allocations
    /// and [`drain_device_releases`](Self::drain_device_releases) only). `Err(feed)`: the pool
    /// has a feed already.
    ///
    /// The feed lives as long as blocks are lent: after the last pool handle is gone it is
    /// dropped only once every lent block came back (a kernel may still write its lanes).
    pub fn set_release_feed<F: ReleaseFeed>(&self, feed: F) -> std::result::Result<(), F> {
        self.inner.lent.set_feed(feed)?;
        drain::spawn(&self.inner);
        Ok(())
    }

    /// [`Block::release_on_device`] for many blocks at once, the token table's lock taken once:
    /// lends the blocks of `blocks` in order, pushing each one's token onto `tokens` (the
    /// token of `blocks[i]` at `tokens[len + i]`, `len` being `tokens`' length before), and
    /// leaves `blocks` empty. Both vectors keep their capacity, so a caller that reuses them
    /// allocates nothing per batch.
    ///
    /// Refused part-way ([`RefusedReason`]: no release feed, the pool's last handle gone, a full
    /// token table, or a block of another pool): the blocks before the refused one are lent
    /// (their tokens pushed), the refused block and every block after it stay in `blocks`, in
    /// their order, not lent and the caller's as before. An empty batch is `Ok`.
    ///
    /// ```
    /// # use vkgdr::{chunk::HostMemorySource, pool::RefusedReason, Pool, PoolConfig};
    /// let pool = Pool::new(HostMemorySource, PoolConfig::default())?;
    /// let mut blocks = vec![pool.alloc(64, 64)?, pool.alloc(64, 64)?];
    /// let mut tokens = Vec::new();
    /// // No release feed here: nothing is lent, the blocks stay the caller's.
    /// let refused = pool.release_many_on_device(&mut blocks, &mut tokens);
    /// assert_eq!(refused, Err(RefusedReason::NoFeed));
    /// assert_eq!((blocks.len(), tokens.len()), (2, 0));
    /// # Ok::<(), vkgdr::Error>(())
    /// ```
    pub fn release_many_on_device(
        &self,
        blocks: &mut Vec<Block>,
        tokens: &mut Vec<crate::core::ring::d2h::ReleaseToken>,
    ) -> std::result::Result<(), RefusedReason> {
        block::lend_many(&self.inner, blocks, tokens)
    }

    /// Takes every device release that has arrived and frees the blocks given back (the slow
    /// path of [`alloc`](Self::alloc) and the drain thread do it too); returns the blocks this
    /// call freed. On return every block whose token arrived before the call is back in the
    /// pool, those another thread's drain took included (it waits for their frees).
    pub fn drain_device_releases(&self) -> usize {
        drain::drain_settled(&self.inner)
    }

    /// Blocks lent to kernels now: released on the device and not back in the pool yet (their
    /// tokens not arrived, or a drain freeing them at this moment). Once it reads 0, every
    /// block lent before is allocatable again.
    pub fn lent_blocks(&self) -> u64 {
        self.inner.lent.lent_now()
    }

    /// Frees every lent block without waiting for its token (their tokens are stale from now
    /// on: counted, never freeing anything); returns how many. For a host that knows its kernels
    /// are done: after the kernel ended and its stream or context was synchronised, or when a
    /// kernel will never release (it failed, or its release lane broke).
    ///
    /// # Safety
    /// - No kernel may still read or write any block lent by
    ///   [`Block::release_on_device`] whose token has not arrived: the blocks are handed out
    ///   again at once.
    pub unsafe fn reclaim_device_releases(&self) -> usize {
        drain::drain_settled(&self.inner);
        let mut out = Vec::new();
        let in_hand = self.inner.lent.revoke_all(&mut out);
        block::free_lent(&mut out);
        in_hand.len()
    }
}

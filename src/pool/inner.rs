//! The pool's shared state, [`PoolInner`]: what every shard, block and thread cache of one
//! pool refers to (its chunk source, configuration, byte accounting, registry and thread-cache
//! key), and the key a pool is cached under ([`PoolKey`]).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use super::config::PoolConfig;
#[cfg(feature = "gpu-alloc")]
use super::gpu_alloc::{ChunkDevice, GpuAllocBackend};
use super::lent::Lent;
use super::registry::Registry;
use crate::core::sync::CachePadded;
use crate::mapping::chunk::ChunkSource;

/// How a pool asks to be cached: its identity and bounds.
#[derive(Debug, Clone, Copy)]
pub(super) struct PoolKey {
    /// [`PoolInner::id`] (never 0).
    pub(super) id: u64,
    /// Entries per bucket at most.
    pub(super) depth: usize,
    /// Cached bytes (rounded allocation sizes) at most.
    pub(super) max_bytes: u64,
}

/// Pool state shared by every shard and block.
///
/// Every allocation and free reads it from every thread, so it lies on cache lines of its own
/// (aligned, and so sized, to 128 bytes: no other heap object shares a line with it), and the
/// parts that allocations write (the counters, the registry's lock, the lent blocks' state) lie
/// on lines of their own within it. Without that, a write into whatever the allocator placed
/// beside it made each thread wait for the line: without the thread cache, two threads on shards
/// of their own ran several times slower per pair than one (BENCHMARKS.md, "The pool's shared
/// state on lines of its own").
#[repr(align(128))]
pub(super) struct PoolInner {
    /// Unique id: which pool a thread cache serves.
    pub(super) id: u64,
    /// Whether freed blocks may go into thread caches: the cache is on and the last `Pool`
    /// handle is not gone yet (cleared then: later frees go straight back to their shards). One
    /// load on every free.
    pub(super) cache_open: AtomicBool,
    /// `thread_cache > 0` on the native backend.
    pub(super) cache_enabled: bool,
    /// Largest request `Pool::alloc` tries its thread cache for inline: 0 when the cache is off
    /// or the memory is non-coherent (atom-rounded requests take the slow path), else the
    /// smaller of the cache's limit and the largest request that is not dedicated.
    pub(super) inline_cache_max: u64,
    /// The pool's identity and bounds for the thread caches.
    pub(super) cache_key: PoolKey,
    /// Set when some thread's cache started serving this pool: only then do `trim` and the
    /// pool's drop visit the other threads' caches.
    pub(super) cache_used: AtomicBool,
    /// Sum over live shared blocks of (size the block accounts for − size its shard recorded):
    /// non-zero only for cached blocks reused for a neighbour size in their 16-byte bucket, so
    /// that `bytes_in_use` stays exact. Touched only when the two sizes differ.
    pub(super) size_delta: CachePadded<AtomicI64>,
    pub(super) source: Box<dyn ChunkSource>,
    pub(super) config: PoolConfig,
    /// Bytes of all chunks currently held (shared and dedicated), for the byte limit.
    pub(super) reserved: CachePadded<AtomicU64>,
    /// Chunks handed to dedicated blocks, for statistics.
    pub(super) dedicated: CachePadded<AtomicU64>,
    pub(super) non_coherent: bool,
    pub(super) atom: u64,
    /// Labels and dedicated chunks, for reports (its lock taken by labelled blocks).
    pub(super) registry: CachePadded<Registry>,
    /// Blocks lent to kernels and the feed their device releases arrive on (its count read by
    /// every allocation that misses the thread cache, written as blocks are lent and drained).
    pub(super) lent: CachePadded<Lent>,
    #[cfg(feature = "gpu-alloc")]
    pub(super) gpu_alloc: Option<GpuAllocBackend>,
}

impl PoolInner {
    /// Records (`sign` 1) or forgets (`sign` -1) a live block of `len` bytes whose shard
    /// allocation recorded another requested size. A block accounts for its size rounded to
    /// whole atoms on non-coherent memory (what its shard allocation is made for), its size
    /// otherwise.
    #[cold]
    pub(super) fn adjust_size_delta(
        &self,
        len: u64,
        allocation: &crate::core::alloc::Allocation,
        sign: i64,
    ) {
        let accounted = if self.non_coherent {
            // `len` passed `check_request`, so it is far below u64::MAX: no overflow.
            len.next_multiple_of(self.atom)
        } else {
            len
        };
        let delta = accounted.wrapping_sub(allocation.requested_size()) as i64;
        if delta != 0 {
            self.size_delta.fetch_add(sign * delta, Ordering::Relaxed);
        }
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

#[cfg(feature = "gpu-alloc")]
impl PoolInner {
    pub(super) fn chunk_device(&self) -> ChunkDevice<'_> {
        ChunkDevice {
            source: &*self.source,
            atom: self.atom,
            reserved: &self.reserved,
            limit: self.config.max_bytes,
            limit_hit: std::cell::Cell::new(false),
        }
    }
}

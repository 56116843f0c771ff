//! [`PoolConfig`] and [`Backend`]: how a pool sizes, grows and trims its chunks, and which
//! allocator carves them.

#[cfg(feature = "gpu-alloc")]
use super::gpu_alloc::GpuAllocStrategy;
use super::magazine;
use crate::alloc::HeapConfig;
use crate::error::{Error, Result};

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

/// How a [`Pool`](super::Pool) sizes, grows and trims its chunks.
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
    /// Cached blocks stay reserved (they count as in use in [`Pool::stats`](super::Pool::stats) and keep their chunk
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

impl PoolConfig {
    /// Refuses settings no pool can work with, before anything is allocated.
    pub(super) fn validate(&self) -> Result<()> {
        if self.shards == 0 {
            return Err(Error::invalid("a pool needs at least one shard"));
        }
        if self.chunk_size == 0 || !self.chunk_size.is_multiple_of(self.heap.max_align) {
            return Err(Error::invalid(format!(
                "chunk size {} must be a non-zero multiple of the maximum alignment {}",
                self.chunk_size, self.heap.max_align
            )));
        }
        if self.max_chunk_size < self.chunk_size {
            return Err(Error::invalid("max_chunk_size is smaller than chunk_size"));
        }
        if self.dedicated_threshold == 0 {
            return Err(Error::invalid("dedicated_threshold is zero"));
        }
        if self.thread_cache > magazine::MAX_DEPTH {
            return Err(Error::invalid(format!(
                "thread_cache {} exceeds {} blocks per size bucket",
                self.thread_cache,
                magazine::MAX_DEPTH
            )));
        }
        Ok(())
    }
}

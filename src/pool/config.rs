//! [`PoolConfig`] and [`Backend`]: how a pool sizes, grows and trims its chunks, and which
//! allocator carves them.

use std::sync::OnceLock;

#[cfg(feature = "gpu-alloc")]
use super::gpu_alloc::GpuAllocStrategy;
use crate::core::alloc::{HeapConfig, MAX_CHUNK_SIZE};
use crate::error::{InvalidArgument, Result};
use crate::mapping::gpu::Gpu;

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

/// Largest [`PoolConfig::thread_cache`] (blocks per bucket and thread): what one thread may keep
/// stays countable in the figures it publishes for [`Pool::stats`](super::Pool::stats).
pub const MAX_DEPTH: usize = 1024;
/// Default [`PoolConfig::thread_cache`]: blocks per bucket.
pub const DEFAULT_DEPTH: usize = 32;
/// Default [`PoolConfig::thread_cache_bytes`]: bytes one thread keeps cached for one pool.
pub const DEFAULT_BYTES: u64 = 256 << 10;
/// Largest request a thread cache serves (the slab range of the default allocator).
pub const MAX_CACHED_SIZE: u64 = 4096;

/// Whether a thread cache keeps blocks of `requested` bytes: `1..=MAX_CACHED_SIZE`, in one
/// comparison (0 wraps to the largest value).
#[inline(always)]
pub(super) fn cacheable(requested: u64) -> bool {
    requested.wrapping_sub(1) < MAX_CACHED_SIZE
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
    /// with [`Error::OutOfDeviceMemory`](crate::Error::OutOfDeviceMemory) (`side: Limit`). A
    /// thread whose shard cannot grow (this limit, or a full BAR) takes its block from another
    /// shard's free space first. Default: no limit.
    pub max_bytes: u64,
    /// Number of shards (independent heaps); each thread allocates from one of them (assigned
    /// in turn on its first allocation). Default: available parallelism, at most
    /// [`DEFAULT_MAX_SHARDS`], so that threads that all allocate do not share a shard. A shard is
    /// made when a thread first allocates from it (a pool costs what its threads use, however
    /// many shards it has), and each shard a thread allocates from grows chunks of its own
    /// (`chunk_size` at first): set fewer shards to bound what many allocating threads reserve. Without the thread cache, threads that
    /// share a shard share its lock and its cache lines: several times slower per pair
    /// (BENCHMARKS.md, "The pool: a vCPU's neighbours, threads over a window, shards").
    pub shards: usize,
    /// Empty chunks each shard keeps for reuse instead of returning them to the driver at once
    /// (returning and re-allocating costs ~300 µs). Default 1.
    pub keep_empty_chunks: usize,
    /// Allocator core parameters (slab page size, slab classes, granule, max alignment).
    pub heap: HeapConfig,
    /// Which allocator serves shared requests.
    pub backend: Backend,
    /// Freed blocks of up to 4 KiB each thread keeps per 16-byte size bucket for reuse by its
    /// next allocations from this pool, with no lock and no atomic read-modify-write on either
    /// side ([`magazine`](super::magazine)): the pool's fast path. Default
    /// [`magazine::DEFAULT_DEPTH`](DEFAULT_DEPTH) (32); at most
    /// [`MAX_DEPTH`](MAX_DEPTH); 0 turns the thread caches off.
    ///
    /// Cached blocks count as in use in [`Pool::stats`](super::Pool::stats) and keep their chunk
    /// until they are reused or given back: [`Pool::trim`](super::Pool::trim) and dropping the
    /// pool's last handle take them back from every thread (idle ones included); a thread also
    /// gives them back when it exits, calls
    /// [`magazine::release_thread_cache`](super::magazine::release_thread_cache), or has
    /// allocated from [`magazine::POOLS_PER_THREAD`](super::magazine::POOLS_PER_THREAD) other
    /// pools since. Native backend only.
    pub thread_cache: usize,
    /// Bytes (rounded block sizes) each thread keeps cached for this pool at most. Default
    /// [`magazine::DEFAULT_BYTES`](DEFAULT_BYTES) (256 KiB).
    pub thread_cache_bytes: u64,
}

/// Most shards a default [`PoolConfig`] has ([`PoolConfig::shards`]: the available parallelism up
/// to this).
pub const DEFAULT_MAX_SHARDS: usize = 64;

/// Available parallelism, at most [`DEFAULT_MAX_SHARDS`]: asked once per process, since the
/// standard library reads the cgroup's CPU quota files on every call and a default configuration
/// is made per pool.
fn default_shards() -> usize {
    static SHARDS: OnceLock<usize> = OnceLock::new();
    *SHARDS.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(4, |n| n.get())
            .min(DEFAULT_MAX_SHARDS)
    })
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            chunk_size: 16 << 20,
            max_chunk_size: 256 << 20,
            dedicated_threshold: 8 << 20,
            max_bytes: u64::MAX,
            shards: default_shards(),
            keep_empty_chunks: 1,
            heap: HeapConfig::default(),
            backend: Backend::Native,
            thread_cache: DEFAULT_DEPTH,
            thread_cache_bytes: DEFAULT_BYTES,
        }
    }
}

/// The settings of a [`PoolConfig`] that the C library (`struct vkgdr_pool_config`) and the
/// Python package (`vkgdr.Pool(owner, **options)`) expose, in one list the faces are built from:
/// it calls the macro `$m` with one `name: type => path,` per setting, `path` being the field of
/// `PoolConfig` the setting is, in the order of the C struct's fields. The C library makes its
/// conversions from it (a setting its struct lacks fails its build), the Python package its
/// keyword parser (a setting reaches it by itself). A field added to `PoolConfig` fails the
/// library's build until it is listed here or named as one the faces leave at its default
/// (beside this macro, in `src/pool/config.rs`).
///
/// ```
/// macro_rules! names {
///     ($($name:ident: $type:ty => $($field:ident).+,)*) => { [$(stringify!($name)),*] };
/// }
/// assert_eq!(vkgdr::pool_options!(names)[..2], ["chunk_size", "max_chunk_size"]);
/// ```
#[macro_export]
macro_rules! pool_options {
    ($m:ident) => {
        $m! {
            chunk_size: u64 => chunk_size,
            max_chunk_size: u64 => max_chunk_size,
            dedicated_threshold: u64 => dedicated_threshold,
            max_bytes: u64 => max_bytes,
            shards: usize => shards,
            keep_empty_chunks: usize => keep_empty_chunks,
            thread_cache: usize => thread_cache,
            thread_cache_bytes: u64 => thread_cache_bytes,
            max_align: u64 => heap.max_align,
        }
    };
}

/// One field per setting of [`pool_options!`].
macro_rules! exposed_settings {
    ($($name:ident: $type:ty => $($field:ident).+,)*) => {
        #[allow(dead_code)]
        struct ExposedSettings {
            $($name: $type,)*
        }
    };
}
pool_options!(exposed_settings);

/// Places every field of [`PoolConfig`]: a setting of [`pool_options!`] is bound and goes into
/// `ExposedSettings` (which has exactly those), any other field is `_`, left at its default by
/// the faces. A new field does not compile here until it is placed.
#[allow(dead_code)]
#[deny(unused_variables)]
fn every_field_is_placed(config: PoolConfig) -> ExposedSettings {
    let PoolConfig {
        chunk_size,
        max_chunk_size,
        dedicated_threshold,
        max_bytes,
        shards,
        keep_empty_chunks,
        heap:
            HeapConfig {
                max_align,
                // The allocator core's tuning, for benchmarks and tests.
                slab_page_size: _,
                max_slab_size: _,
                min_align: _,
                slab_classes_per_octave: _,
            },
        // Rust only: the gpu-alloc baseline is a cargo feature of the library.
        backend: _,
        thread_cache,
        thread_cache_bytes,
    } = config;
    ExposedSettings {
        chunk_size,
        max_chunk_size,
        dedicated_threshold,
        max_bytes,
        shards,
        keep_empty_chunks,
        thread_cache,
        thread_cache_bytes,
        max_align,
    }
}

/// Most shards a pool may have ([`PoolConfig::shards`]): each costs a heap's metadata, and no
/// machine gains from more shards than threads.
pub const MAX_SHARDS: usize = 1024;

impl PoolConfig {
    /// Refuses settings no pool can work with, before anything is allocated. `atom` is the
    /// source's `nonCoherentAtomSize` when its memory is non-coherent.
    pub(super) fn validate(&self, non_coherent_atom: Option<u64>) -> Result<()> {
        if self.shards == 0 {
            return Err(InvalidArgument::NoShards.into());
        }
        if self.shards > MAX_SHARDS {
            return Err(InvalidArgument::TooManyShards {
                shards: self.shards,
                max: MAX_SHARDS,
            }
            .into());
        }
        self.heap.validate()?;
        for (name, size) in [
            ("chunk_size", self.chunk_size),
            ("max_chunk_size", self.max_chunk_size),
        ] {
            if size == 0 || !size.is_multiple_of(self.heap.max_align) || size > MAX_CHUNK_SIZE {
                return Err(InvalidArgument::ChunkSize {
                    field: name,
                    size,
                    max_align: self.heap.max_align,
                    max: MAX_CHUNK_SIZE,
                }
                .into());
            }
        }
        if self.max_chunk_size < self.chunk_size {
            return Err(InvalidArgument::MaxChunkBelowChunk {
                chunk_size: self.chunk_size,
                max_chunk_size: self.max_chunk_size,
            }
            .into());
        }
        if let Some(atom) = non_coherent_atom {
            // Every block on non-coherent memory owns whole atoms, so its alignment is at least
            // the atom: a heap that cannot align that far could serve no request at all.
            if !atom.is_power_of_two() || atom > self.heap.max_align {
                return Err(InvalidArgument::AtomAboveAlign {
                    atom,
                    max_align: self.heap.max_align,
                }
                .into());
            }
        }
        if self.dedicated_threshold == 0 {
            return Err(InvalidArgument::ZeroDedicatedThreshold.into());
        }
        if self.thread_cache > MAX_DEPTH {
            return Err(InvalidArgument::ThreadCacheDepth {
                depth: self.thread_cache,
                max: MAX_DEPTH,
            }
            .into());
        }
        Ok(())
    }
}

impl PoolConfig {
    /// Limits the pool to `fraction` (in `(0, 1]`) of what `gpu` can probably still map now
    /// ([`Gpu::bar_info`](crate::Gpu::bar_info)): sets [`PoolConfig::max_bytes`] to that many
    /// bytes. Beyond it the pool's allocations fail with
    /// [`Error::OutOfDeviceMemory`](crate::Error::OutOfDeviceMemory) (`side: Limit`) instead of the
    /// driver's refusal. The estimate is taken once, here.
    ///
    /// ```no_run
    /// # fn main() -> vkgdr::Result<()> {
    /// let gpu = vkgdr::Gpu::open(0)?;
    /// let config = vkgdr::PoolConfig::default().with_bar_budget(&gpu, 0.25)?;
    /// let pool = vkgdr::Pool::new(gpu.clone(), config)?;
    /// # Ok(()) }
    /// ```
    pub fn with_bar_budget(self, gpu: &Gpu, fraction: f64) -> Result<PoolConfig> {
        let max_bytes = gpu.bar_info()?.budget(fraction)?;
        Ok(PoolConfig { max_bytes, ..self })
    }
}

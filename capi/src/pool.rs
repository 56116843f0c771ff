//! Pools of small aligned blocks (`vkgdr_pool_*`, `vkgdr_block_*`) over [`vkgdr::Pool`].
//!
//! A block handle is a [`vkgdr::Block`] in a handle table: allocating and freeing one from C
//! costs the Rust pool's allocation and free plus a thread-local handle-slot pop and push (no
//! global lock; see [`crate::handles`]). A pool handle keeps its device's [`Gpu`] beside the
//! pool, for `vkgdr_block_free_after` (a block itself does not know it, and holding a reference
//! per block would put a shared counter on the allocation path).

use std::ffi::{c_int, c_void};
use std::sync::LazyLock;

use vkgdr::cuda::CuStream;
use vkgdr::pool::magazine::Handshake;
use vkgdr::{Block, Gpu, Mapping, Pool, PoolConfig};

use crate::device::{device, vkgdr_t, Device};
use crate::error::{guard, CResult, Failure};
use crate::handles::{HandleTable, Tag};
use crate::versioned::{self, Versioned};
use crate::{
    is_legacy_stream, lookup, register, release, write_optional, CUdeviceptr, CUstream, Handle,
    CU_STREAM_LEGACY, VKGDR_ERROR, VKGDR_SUCCESS,
};

/// Opaque handle to a pool.
pub struct vkgdr_pool {
    _private: [u8; 0],
}

/// Opaque handle to a pool, from `vkgdr_pool_create`; freed with `vkgdr_pool_destroy`.
pub type vkgdr_pool_t = *mut vkgdr_pool;

/// Opaque handle to a pool block.
pub struct vkgdr_block {
    _private: [u8; 0],
}

/// Opaque handle to a block of a pool, from `vkgdr_pool_alloc`; freed with `vkgdr_block_free`.
pub type vkgdr_block_t = *mut vkgdr_block;

// Every field but `struct_size` and `flags` is a setting of the library's `PoolConfig` listed in
// `vkgdr::pool_options!`, from which the conversions below are made: a setting added there fails
// this crate's build until it is appended here (at the end, for the callers built before it).
/// How a pool sizes, grows and trims its chunks. Fill it with `vkgdr_pool_config_init`, then
/// change what you need. Later versions may add fields at the end: `struct_size` tells the
/// library which ones the caller knows.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vkgdr_pool_config {
    /// `sizeof(vkgdr_pool_config)` as the caller was compiled (set by `vkgdr_pool_config_init`).
    pub struct_size: usize,
    /// Size of a shard's first chunk in bytes (default 16 MiB); a multiple of `max_align`.
    pub chunk_size: u64,
    /// Each new chunk of a shard doubles the previous one, up to this size (default 256 MiB).
    pub max_chunk_size: u64,
    /// Requests of at least this many bytes get a chunk of their own (default 8 MiB).
    pub dedicated_threshold: u64,
    /// Total bytes of chunks the pool may hold; beyond it allocations fail (default: no limit,
    /// `UINT64_MAX`).
    pub max_bytes: u64,
    /// Independent heaps; threads are spread over them, and each is made when a thread first
    /// allocates from it (default: CPU count, at most 64).
    pub shards: u32,
    /// Empty chunks each shard keeps for reuse instead of freeing them at once (default 1).
    pub keep_empty_chunks: u32,
    /// Freed blocks of up to 4 KiB each thread keeps per size class for reuse without any lock
    /// (default 32; 0 turns the cache off), at most `thread_cache_bytes` per thread and pool.
    /// Cached blocks stay reserved until they are reused, `vkgdr_pool_trim` (from any thread) or
    /// `vkgdr_pool_destroy` takes them back from every thread (idle ones included), or their
    /// thread exits.
    pub thread_cache: u32,
    /// Must be 0.
    pub flags: u32,
    /// Bytes (rounded block sizes) each thread keeps cached for this pool at most (default
    /// 256 KiB). A caller whose `struct_size` ends before this field gets the default.
    pub thread_cache_bytes: u64,
    /// Largest alignment `vkgdr_pool_alloc` accepts, and the alignment of every chunk's base
    /// address: a power of two (default 64 KiB). A caller whose `struct_size` ends before this
    /// field gets the default.
    pub max_align: u64,
}

// SAFETY: integers only; `struct_size` first.
unsafe impl Versioned for vkgdr_pool_config {
    const NAME: &'static str = "vkgdr_pool_config";
}

/// How a field of `vkgdr_pool_config` holds a `PoolConfig` setting: the same `u64`, or a `u32`
/// for a count the library keeps as a `usize`.
trait CSetting<R> {
    fn from_setting(value: R) -> Self;
    fn to_setting(self) -> R;
}

impl CSetting<u64> for u64 {
    fn from_setting(value: u64) -> u64 {
        value
    }
    fn to_setting(self) -> u64 {
        self
    }
}

impl CSetting<usize> for u32 {
    fn from_setting(value: usize) -> u32 {
        u32::try_from(value).unwrap_or(u32::MAX)
    }
    fn to_setting(self) -> usize {
        self as usize
    }
}

/// The conversions between `vkgdr_pool_config` and `PoolConfig`, one line per setting of
/// `vkgdr::pool_options!`. The struct literal names every C field: a C field without a setting,
/// or a setting without a C field, does not compile.
macro_rules! pool_config_conversions {
    ($($name:ident: $type:ty => $($field:ident).+,)*) => {
        impl vkgdr_pool_config {
            fn defaults() -> Self {
                let d = PoolConfig::default();
                vkgdr_pool_config {
                    struct_size: std::mem::size_of::<Self>(),
                    flags: 0,
                    $($name: <_ as CSetting<$type>>::from_setting(d.$($field).+),)*
                }
            }

            fn to_config(self) -> CResult<PoolConfig> {
                if self.flags != 0 {
                    return Err(Failure::Api(format!(
                        "vkgdr_pool_config.flags must be 0 (got {:#x})",
                        self.flags
                    )));
                }
                let mut config = PoolConfig::default();
                $(config.$($field).+ = <_ as CSetting<$type>>::to_setting(self.$name);)*
                Ok(config)
            }
        }
    };
}
vkgdr::pool_options!(pool_config_conversions);

/// A usage snapshot of a pool (`vkgdr_pool_get_stats`). Set `struct_size` to
/// `sizeof(vkgdr_pool_stats)` before the call.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct vkgdr_pool_stats {
    /// `sizeof(vkgdr_pool_stats)` as the caller was compiled.
    pub struct_size: usize,
    /// Bytes of all chunks held, dedicated ones included.
    pub bytes_reserved: u64,
    /// Bytes requested by live blocks in shared chunks (blocks kept in thread caches excluded:
    /// see `bytes_cached`).
    pub bytes_in_use: u64,
    /// Bytes handed out (rounded sizes) in shared chunks.
    pub bytes_allocated: u64,
    /// Shared chunks held.
    pub chunks: u64,
    /// Dedicated chunks held (one per large block).
    pub dedicated_chunks: u64,
    /// Largest free block in any shard.
    pub largest_free_block: u64,
    /// Bytes requested by freed blocks that thread caches keep for reuse (see
    /// `vkgdr_pool_config.thread_cache`): still allocated in their chunks (counted in
    /// `bytes_allocated`), given back by `vkgdr_pool_trim`. A caller whose `struct_size` ends
    /// before this field does not get it.
    pub bytes_cached: u64,
    /// Blocks that thread caches keep for reuse (the blocks behind `bytes_cached`). A caller
    /// whose `struct_size` ends before this field does not get it.
    pub blocks_cached: u64,
    /// How other threads reach the pool's thread caches (a `vkgdr_thread_cache_handshake`):
    /// what each cached allocation and free costs its thread. A caller whose `struct_size` ends
    /// before this field does not get it.
    pub thread_cache_handshake: u32,
    /// 1 once a lane of the pool's release feed broke (a kernel broke the ring's protocol): the
    /// tokens it would carry never arrive, and their blocks stay lent. The fields from here on
    /// count device-side releases (`vkgdr_block_release_on_device`); a caller whose
    /// `struct_size` ends before a field does not get it.
    pub release_lane_broken: u32,
    /// Blocks lent to kernels now, not back in the pool yet (their tokens not arrived, or a drain
    /// freeing them at this moment).
    pub lent_blocks: u64,
    /// Tokens issued (blocks released on the device).
    pub tokens_issued: u64,
    /// Tokens that came back and freed their blocks.
    pub tokens_redeemed: u64,
    /// Blocks taken back by `vkgdr_pool_reclaim_device_releases` before their tokens came.
    pub tokens_revoked: u64,
    /// Tokens refused, freeing nothing: forged, stale (of a block taken back, or an earlier
    /// issue) or repeated.
    pub tokens_refused: u64,
    /// Records on the release lanes that are not release records, or whose length is not a
    /// multiple of 8 (ignored).
    pub release_records_ignored: u64,
}

/// `vkgdr_pool_stats.thread_cache_handshake`: how other threads (a trim, the pool's destruction)
/// get at a thread's cache of freed blocks, chosen once per process.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub enum vkgdr_thread_cache_handshake {
    /// The pool has no thread cache (`vkgdr_pool_config.thread_cache` 0).
    VKGDR_THREAD_CACHE_OFF = 0,
    /// Linux's `membarrier` on the other thread's side: no barrier on a thread's own cached
    /// allocations and frees.
    VKGDR_THREAD_CACHE_MEMBARRIER = 1,
    /// `membarrier` cannot be used here: a full memory barrier on each cached allocation and
    /// free.
    VKGDR_THREAD_CACHE_FENCE = 2,
}

// SAFETY: integers only; `struct_size` first.
unsafe impl Versioned for vkgdr_pool_stats {
    const NAME: &'static str = "vkgdr_pool_stats";
}

/// What a `vkgdr_pool_t` holds.
struct PoolEntry {
    pool: Pool,
    /// The CUDA side of the pool's device (`None` on a `vkgdr_open_vulkan` handle): what
    /// stream-ordered block frees fence with, and count in.
    gpu: Option<Gpu>,
}

/// Live `vkgdr_pool_t` handles.
static POOLS: LazyLock<HandleTable<PoolEntry>> = LazyLock::new(|| HandleTable::new(Tag::Pool));
/// Live `vkgdr_block_t` handles.
pub(crate) static BLOCKS: LazyLock<HandleTable<Block>> =
    LazyLock::new(|| HandleTable::new(Tag::Block));

/// # Safety
/// - No thread destroys `pool` while the reference is in use.
pub(crate) unsafe fn pool<'a>(pool: vkgdr_pool_t) -> CResult<&'a Pool> {
    // SAFETY: forwarded to our caller.
    unsafe { lookup(&POOLS, pool) }.map(|e| &e.pool)
}

/// # Safety
/// - No thread frees `block` while the reference is in use.
unsafe fn block<'a>(block: vkgdr_block_t) -> CResult<&'a Block> {
    // SAFETY: forwarded to our caller.
    unsafe { lookup(&BLOCKS, block) }
}

/// Fills `*config` with the default configuration and sets `config->struct_size` to
/// `struct_size`, which must be `sizeof(vkgdr_pool_config)` as the caller sees it (only that many
/// bytes are written).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` if `config` is NULL or `struct_size` too small.
///
/// Thread safety: any thread.
///
/// # Safety
/// - `config` is NULL or writable for `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_pool_config_init(
    config: *mut vkgdr_pool_config,
    struct_size: usize,
) -> c_int {
    guard("vkgdr_pool_config_init", VKGDR_ERROR, || {
        if config.is_null() {
            return Err(Failure::Api("the vkgdr_pool_config pointer is NULL".into()));
        }
        if struct_size < std::mem::size_of::<usize>() {
            return Err(Failure::Api(format!(
                "struct_size {struct_size} is too small"
            )));
        }
        // SAFETY: writable for `struct_size` bytes (caller), of which the first holds the size.
        unsafe { config.cast::<usize>().write_unaligned(struct_size) };
        // SAFETY: as above; `write` copies at most `struct_size` bytes.
        unsafe { versioned::write(config, &vkgdr_pool_config::defaults()) }?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Creates a pool of small aligned blocks over BAR-mapped chunks of `g`'s device. No chunk is
/// allocated until the first block needs one. On a `vkgdr_open` handle the chunks are imported
/// into the handle's context (the one current at `vkgdr_open` with
/// `VKGDR_OPEN_CURRENT_CONTEXT_BIT`, else the device's primary context); on a
/// `vkgdr_open_vulkan` handle they have no device address.
///
/// - `config`: NULL for the defaults, or a configuration from `vkgdr_pool_config_init`.
///
/// Returns a handle, or `NULL` on error (an invalid handle or configuration).
///
/// Thread safety: any thread. The pool may be used from many threads at once.
/// Free it with `vkgdr_pool_destroy`.
///
/// # Safety
/// - `config` is NULL or readable for `config->struct_size` bytes.
/// - No thread closes `g` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_pool_create(
    g: vkgdr_t,
    config: *const vkgdr_pool_config,
) -> vkgdr_pool_t {
    guard("vkgdr_pool_create", std::ptr::null_mut(), || {
        let c = if config.is_null() {
            vkgdr_pool_config::defaults()
        } else {
            // SAFETY: readable for its struct_size (caller).
            unsafe { versioned::read(config, vkgdr_pool_config::defaults()) }?
        };
        let config = c.to_config()?;
        // SAFETY: the caller does not close `g` during the call.
        let entry = match unsafe { device(g) }? {
            Device::Cuda(gpu) => PoolEntry {
                pool: Pool::new(gpu.clone(), config)?,
                gpu: Some(gpu.clone()),
            },
            Device::Vulkan(vulkan) => PoolEntry {
                pool: Pool::new(vulkan.clone(), config)?,
                gpu: None,
            },
        };
        register(&POOLS, entry)
    })
}

/// Destroys a pool handle. `NULL` is ignored. Blocks still allocated stay valid (they keep their
/// memory alive) until `vkgdr_block_free`; the memory is returned to the driver when the last
/// one is freed.
///
/// Errors (reported through `vkgdr_last_error()` only): a handle already destroyed or not a
/// `vkgdr_pool_t`.
///
/// Thread safety: any thread, but not while another thread is using the same pool handle.
///
/// # Safety
/// - No other thread uses `pool` during or after the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_pool_destroy(pool: vkgdr_pool_t) {
    guard("vkgdr_pool_destroy", (), || release(&POOLS, pool))
}

/// Allocates `size` bytes aligned to `alignment` (a power of two up to the pool's `max_align`,
/// 64 KiB by default) for both the host and the device address. Nanoseconds when a chunk has
/// room; otherwise a new chunk is allocated (hundreds of microseconds). The bytes are not
/// cleared.
///
/// Returns a block handle, or `NULL` on error (a zero size, a bad alignment, the pool's
/// `max_bytes`, or the driver's out-of-memory `vkAllocateMemory failed
/// (VK_ERROR_OUT_OF_DEVICE_MEMORY)`).
///
/// Thread safety: any thread, concurrently (threads are spread over the pool's shards).
/// Free the block with `vkgdr_block_free`, from any thread.
///
/// # Safety
/// - No thread destroys `pool` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_pool_alloc(
    pool: vkgdr_pool_t,
    size: usize,
    alignment: usize,
) -> vkgdr_block_t {
    guard("vkgdr_pool_alloc", std::ptr::null_mut(), || {
        // SAFETY: the caller does not destroy `pool` during the call.
        let p = unsafe { self::pool(pool) }?;
        let b = p.alloc(size as u64, alignment as u64)?;
        register(&BLOCKS, b)
    })
}

/// Whether blocks of the pool are coherent (flushes and invalidates are then no-ops). `false`
/// also on error.
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `pool` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_pool_is_coherent(pool: vkgdr_pool_t) -> bool {
    guard("vkgdr_pool_is_coherent", false, || {
        // SAFETY: the caller does not destroy `pool` during the call.
        let p = unsafe { self::pool(pool) }?;
        Ok(!p.is_non_coherent())
    })
}

/// Flushes every range recorded with `vkgdr_block_mark_written` or `vkgdr_block_write` in the
/// pool's shared chunks: one driver call per chunk with writes. A no-op on coherent memory.
/// (Blocks with a chunk of their own are flushed with `vkgdr_block_flush`.)
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, the driver's failure).
///
/// Thread safety: any thread, concurrently with allocations and writes.
///
/// # Safety
/// - No thread destroys `pool` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_pool_flush(pool: vkgdr_pool_t) -> c_int {
    guard("vkgdr_pool_flush", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `pool` during the call.
        unsafe { self::pool(pool) }?.flush()?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Returns every empty chunk to the driver now (blocks in use never move), first releasing the
/// calling thread's cached blocks of this pool. Other threads' caches are not reached.
///
/// - `released`: NULL, or where to store the number of chunks released.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
///
/// Thread safety: any thread, concurrently with allocations.
///
/// # Safety
/// - `released` is NULL or writable.
/// - No thread destroys `pool` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_pool_trim(pool: vkgdr_pool_t, released: *mut usize) -> c_int {
    guard("vkgdr_pool_trim", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `pool` during the call.
        let n = unsafe { self::pool(pool) }?.trim();
        // SAFETY: `released` is NULL or writable (caller).
        unsafe { write_optional(released, n) };
        Ok(VKGDR_SUCCESS)
    })
}

/// Fills `*stats` (whose `struct_size` the caller sets) with a usage snapshot; takes each shard's
/// lock briefly.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, `stats` NULL or its
/// `struct_size` unset).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `stats` is NULL or writable for `stats->struct_size` bytes.
/// - No thread destroys `pool` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_pool_get_stats(
    pool: vkgdr_pool_t,
    stats: *mut vkgdr_pool_stats,
) -> c_int {
    guard("vkgdr_pool_get_stats", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `pool` during the call.
        let pool = unsafe { self::pool(pool) }?;
        let s = pool.stats();
        let r = &s.device_releases;
        let out = vkgdr_pool_stats {
            struct_size: std::mem::size_of::<vkgdr_pool_stats>(),
            bytes_reserved: s.bytes_reserved,
            bytes_in_use: s.bytes_in_use,
            bytes_allocated: s.bytes_allocated,
            chunks: s.chunks,
            dedicated_chunks: s.dedicated_chunks,
            largest_free_block: s.largest_free_block,
            bytes_cached: s.bytes_cached,
            blocks_cached: s.blocks_cached,
            thread_cache_handshake: match pool.thread_cache().map(|t| t.handshake) {
                None => vkgdr_thread_cache_handshake::VKGDR_THREAD_CACHE_OFF,
                Some(Handshake::Membarrier) => {
                    vkgdr_thread_cache_handshake::VKGDR_THREAD_CACHE_MEMBARRIER
                }
                Some(Handshake::Fence) => vkgdr_thread_cache_handshake::VKGDR_THREAD_CACHE_FENCE,
            } as u32,
            release_lane_broken: u32::from(r.lane_error.is_some()),
            lent_blocks: r.outstanding,
            tokens_issued: r.tokens.issued,
            tokens_redeemed: r.tokens.redeemed,
            tokens_revoked: r.tokens.revoked,
            tokens_refused: r.tokens.forged + r.tokens.stale + r.tokens.repeated,
            release_records_ignored: r.foreign_records + r.malformed_records,
        };
        // SAFETY: writable for its struct_size (caller).
        unsafe { versioned::write(stats, &out) }?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Frees a block (any thread may free any block). `NULL` is ignored.
///
/// The block goes back to its pool at once, for the next `vkgdr_pool_alloc` to hand out again:
/// the pool cannot know which kernels still read it. Free a block that a kernel queued or
/// running may still use with `vkgdr_block_free_after`.
///
/// Errors (reported through `vkgdr_last_error()` only): a block already freed or not a
/// `vkgdr_block_t`.
///
/// Thread safety: any thread, but not while another thread is using the same block.
///
/// # Safety
/// - No other thread uses `block` during or after the call, and no kernel uses its memory any
///   more.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_block_free(block: vkgdr_block_t) {
    guard("vkgdr_block_free", (), || release(&BLOCKS, block))
}

/// Frees a block once the GPU work queued on `stream` so far has completed, without waiting for
/// it: for a block a kernel launched on `stream` (a persistent one included) may still use.
/// Returns at once; the block goes back to its pool only when the stream gets there, and counts
/// as in use until then (`vkgdr_wait_for_releases` on the pool's `vkgdr_t`,
/// `vkgdr_pool_get_stats`).
///
/// - `block`: `NULL` is ignored (`VKGDR_SUCCESS`).
/// - `pool`: the pool the block came from, not yet destroyed (its device's CUDA side fences the
///   release).
/// - `stream`: a live stream of the pool's device (a `CUstream`, or the runtime's
///   `cudaStream_t`); `NULL` and `CU_STREAM_LEGACY` mean the pool context's legacy default
///   stream (and so every blocking stream, such as the runtime's default stream).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR`:
/// - nothing happened, the block is still the caller's: a block already freed or not a
///   `vkgdr_block_t`, an invalid `pool`, a pool of a `vkgdr_open_vulkan` handle (no GPU work
///   can use its blocks: free them with `vkgdr_block_free`);
/// - the block is freed after the pool context's legacy default stream instead: no fence could
///   be had on `stream` (a stream the driver refuses, e.g. `cuStreamGetCtx failed
///   (CUDA_ERROR_INVALID_HANDLE)`, or out of resources).
///
/// Thread safety: any thread, but not while another thread is using the same block.
///
/// # Safety
/// - No other thread uses `block` during or after the call; no thread destroys `pool` during
///   the call.
/// - `stream` is NULL, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD` or a stream not yet
///   destroyed; where the driver lacks stream memory operations (then an event fences the
///   release), its context stays alive until the release has happened.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_block_free_after(
    block: vkgdr_block_t,
    pool: vkgdr_pool_t,
    stream: CUstream,
) -> c_int {
    guard("vkgdr_block_free_after", VKGDR_ERROR, || {
        if block.is_null() {
            return Ok(VKGDR_SUCCESS);
        }
        // Everything that leaves the block with the caller is checked before it is taken.
        // SAFETY: no other thread uses `block` during the call.
        unsafe { self::block(block) }?;
        // SAFETY: the caller does not destroy `pool` during the call.
        let entry = unsafe { lookup(&POOLS, pool) }?;
        let gpu = entry.gpu.as_ref().ok_or_else(|| {
            Failure::Api(
                "the pool has no CUDA device (its vkgdr_t was opened with vkgdr_open_vulkan), \
                 so no GPU work uses its blocks: free them with vkgdr_block_free"
                    .into(),
            )
        })?;
        // The legacy and per-thread default streams are those of the current context: the
        // pool's.
        let _bound = gpu.bind()?;
        let b = BLOCKS
            .remove(block.token())
            .map_err(|why| Failure::handle(Tag::Block, why))?;
        let stream: CuStream = if is_legacy_stream(stream) {
            std::ptr::without_provenance_mut::<std::ffi::c_void>(CU_STREAM_LEGACY)
        } else {
            stream.cast()
        };
        // A stream the driver refuses makes the block wait for the legacy stream's work instead
        // (the library's fallback), never handed out again at once.
        // SAFETY: the legacy default stream of the context bound above, or a live stream of the
        // device (the caller's contract).
        unsafe { b.release_after_stream(gpu, stream) }?;
        Ok(VKGDR_SUCCESS)
    })
}

/// The block's host address, or `NULL` on error (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread frees `block` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_block_get_host_ptr(block: vkgdr_block_t) -> *mut c_void {
    guard("vkgdr_block_get_host_ptr", std::ptr::null_mut(), || {
        // SAFETY: the caller does not free `block` during the call.
        Ok(unsafe { self::block(block) }?.host_ptr().cast())
    })
}

/// The block's CUDA device address, or 0: on error (an invalid handle; `vkgdr_last_error()` is
/// set) and for pools of a `vkgdr_open_vulkan` handle (no error).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread frees `block` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_block_get_device_ptr(block: vkgdr_block_t) -> CUdeviceptr {
    guard("vkgdr_block_get_device_ptr", 0, || {
        // SAFETY: the caller does not free `block` during the call.
        Ok(unsafe { self::block(block) }?.device_ptr().unwrap_or(0))
    })
}

/// The block's size as asked for, or 0 on error (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread frees `block` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_block_get_size(block: vkgdr_block_t) -> usize {
    guard("vkgdr_block_get_size", 0, || {
        // SAFETY: the caller does not free `block` during the call.
        Ok(unsafe { self::block(block) }?.size() as usize)
    })
}

/// Records that `[offset, offset + size)` of the block was written through its host pointer, so
/// that the next `vkgdr_block_flush` or `vkgdr_pool_flush` pushes it: batch many blocks' writes
/// into one flush. Only checks the range on coherent memory.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the block).
///
/// Thread safety: any thread, also concurrently on the same block.
///
/// # Safety
/// - No thread frees `block` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_block_mark_written(
    block: vkgdr_block_t,
    offset: usize,
    size: usize,
) -> c_int {
    guard("vkgdr_block_mark_written", VKGDR_ERROR, || {
        // SAFETY: the caller does not free `block` during the call.
        let b = unsafe { self::block(block) }?;
        b.mark_written(offset as u64, size as u64)?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Makes host writes to `[offset, offset + size)` of the block visible to kernels launched
/// afterwards: records the range like `vkgdr_block_mark_written`, then flushes every recorded
/// range of the block's chunk in one driver call. Widened to whole atoms (blocks of non-coherent
/// pools own whole atoms, so no neighbour is disturbed). A no-op on coherent memory, apart from
/// the range check.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the block, the
/// driver's failure).
///
/// Thread safety: any thread, also concurrently on the same block.
///
/// # Safety
/// - No thread frees `block` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_block_flush(
    block: vkgdr_block_t,
    offset: usize,
    size: usize,
) -> c_int {
    guard("vkgdr_block_flush", VKGDR_ERROR, || {
        // SAFETY: the caller does not free `block` during the call.
        let b = unsafe { self::block(block) }?;
        b.flush_range(offset as u64, size as u64)?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Makes device writes to `[offset, offset + size)` of the block (by kernels that have completed)
/// visible to the host. The block's own unflushed writes are flushed first, so none is lost.
/// A no-op on coherent memory, apart from the range check.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the block, the
/// driver's failure).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread frees `block` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_block_invalidate(
    block: vkgdr_block_t,
    offset: usize,
    size: usize,
) -> c_int {
    guard("vkgdr_block_invalidate", VKGDR_ERROR, || {
        // SAFETY: the caller does not free `block` during the call.
        let b = unsafe { self::block(block) }?;
        b.before_read(offset as u64, size as u64)?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Copies `size` bytes from `src` into the block at `offset` (the fast write-combining copy) and
/// records the range like `vkgdr_block_mark_written`: on non-coherent memory kernels see it after
/// `vkgdr_block_flush` or `vkgdr_pool_flush`.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the block, `src`
/// NULL with `size` > 0).
///
/// Thread safety: any thread; concurrent writes to disjoint ranges are fine.
///
/// # Safety
/// - `src` is readable for `size` bytes and does not overlap the block.
/// - No other thread accesses the destination range during the call, or frees `block`.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_block_write(
    block: vkgdr_block_t,
    offset: usize,
    src: *const c_void,
    size: usize,
) -> c_int {
    guard("vkgdr_block_write", VKGDR_ERROR, || {
        // SAFETY: the caller does not free `block` during the call.
        let b = unsafe { self::block(block) }?;
        // SAFETY: readable for `size` bytes (caller).
        let src = unsafe { crate::copy::host_slice(src, size) }?;
        // SAFETY: no other thread accesses the range during the call, and `src` does not
        // overlap the block (caller).
        unsafe { b.write_shared(offset as u64, src) }?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Copies `size` bytes of the block at `offset` into `dst`, invalidating first (and flushing the
/// block's pending writes). Large reads of blocks with a device address use the GPU's copy engine.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the block, `dst`
/// NULL with `size` > 0, a driver failure).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `dst` is writable for `size` bytes and does not overlap the block.
/// - No thread frees `block` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_block_read(
    block: vkgdr_block_t,
    offset: usize,
    dst: *mut c_void,
    size: usize,
) -> c_int {
    guard("vkgdr_block_read", VKGDR_ERROR, || {
        // SAFETY: the caller does not free `block` during the call.
        let b = unsafe { self::block(block) }?;
        // SAFETY: writable for `size` bytes, exclusively (caller).
        let dst = unsafe { crate::copy::host_slice_mut(dst, size) }?;
        b.read(offset as u64, dst)?;
        Ok(VKGDR_SUCCESS)
    })
}

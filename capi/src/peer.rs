//! The side that attaches (`vkgdr_peer_*`, `vkgdr_attached_*`, `vkgdr_shared_block_*`), a thin
//! layer over [`vkgdr::share::Peer`]: connect to an owner's socket
//! (`vkgdr_share_server_create` in another process), attach raw memory, pools and ring lanes by
//! name, and write them with CPU stores through a Vulkan device this process opens by the GPU's
//! UUID. Nothing here loads CUDA: a peer runs on a machine's Vulkan driver alone.
//!
//! Every attachment keeps its connection (so `vkgdr_peer_destroy` may come first); a shared
//! block keeps its pool's attachment, which is why `vkgdr_attached_pool_detach` refuses while
//! blocks are held.

use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use vkgdr::ring::core::RingError;
use vkgdr::share::{
    AttachedLane, AttachedMemory, AttachedPool, Peer, ShareError, SharedBlock, DEFAULT_TIMEOUT,
};
use vkgdr::Mapping;

use crate::error::{c_string_copy, guard, CResult, Failure};
use crate::handles::{HandleTable, Tag};
use crate::ring::{payload_len, timeout, VKGDR_RING_FULL};
use crate::share::{clear_out, region_name, socket_path, VKGDR_SHARE_NONE};
use crate::{lookup, register, release, write_optional, VKGDR_ERROR, VKGDR_SUCCESS};

/// Opaque handle to a connection to an owner.
pub struct vkgdr_peer {
    _private: [u8; 0],
}

/// Opaque handle to a connection to an owner's share server, from `vkgdr_peer_connect`; freed
/// with `vkgdr_peer_destroy`.
pub type vkgdr_peer_t = *mut vkgdr_peer;

/// Opaque handle to attached raw memory.
pub struct vkgdr_attached_memory {
    _private: [u8; 0],
}

/// Opaque handle to raw memory an owner shares, from `vkgdr_peer_attach_memory`; freed with
/// `vkgdr_attached_memory_detach`.
pub type vkgdr_attached_memory_t = *mut vkgdr_attached_memory;

/// Opaque handle to an attached pool.
pub struct vkgdr_attached_pool {
    _private: [u8; 0],
}

/// Opaque handle to a pool an owner shares, from `vkgdr_peer_attach_pool`; freed with
/// `vkgdr_attached_pool_detach`.
pub type vkgdr_attached_pool_t = *mut vkgdr_attached_pool;

/// Opaque handle to a block lent by an owner.
pub struct vkgdr_shared_block {
    _private: [u8; 0],
}

/// Opaque handle to a block of an owner's pool lent to this process, from
/// `vkgdr_attached_pool_request` or `vkgdr_attached_pool_next_block`; given back with
/// `vkgdr_shared_block_release`.
pub type vkgdr_shared_block_t = *mut vkgdr_shared_block;

/// Opaque handle to an attached ring lane.
pub struct vkgdr_attached_lane {
    _private: [u8; 0],
}

/// Opaque handle to a lane of an owner's ring that this process produces into, from
/// `vkgdr_peer_attach_lane`; freed with `vkgdr_attached_lane_detach`.
pub type vkgdr_attached_lane_t = *mut vkgdr_attached_lane;

/// An attached pool and the count of its blocks that live handles hold.
struct PoolEntry {
    pool: AttachedPool,
    held: Arc<AtomicUsize>,
}

/// A lent block, counted in its pool's entry while the handle lives.
struct BlockEntry {
    block: SharedBlock,
    held: Arc<AtomicUsize>,
}

impl Drop for BlockEntry {
    fn drop(&mut self) {
        self.held.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Live `vkgdr_peer_t` handles.
static PEERS: LazyLock<HandleTable<Peer>> = LazyLock::new(|| HandleTable::new(Tag::Peer));
/// Live `vkgdr_attached_memory_t` handles.
static MEMORIES: LazyLock<HandleTable<AttachedMemory>> =
    LazyLock::new(|| HandleTable::new(Tag::AttachedMemory));
/// Live `vkgdr_attached_pool_t` handles.
static POOLS: LazyLock<HandleTable<PoolEntry>> =
    LazyLock::new(|| HandleTable::new(Tag::AttachedPool));
/// Live `vkgdr_shared_block_t` handles.
static BLOCKS: LazyLock<HandleTable<BlockEntry>> =
    LazyLock::new(|| HandleTable::new(Tag::SharedBlock));
/// Live `vkgdr_attached_lane_t` handles.
static LANES: LazyLock<HandleTable<AttachedLane>> =
    LazyLock::new(|| HandleTable::new(Tag::AttachedLane));

/// # Safety
/// - No thread destroys `p` while the reference is in use.
unsafe fn peer<'a>(p: vkgdr_peer_t) -> CResult<&'a Peer> {
    // SAFETY: forwarded to our caller.
    unsafe { lookup(&PEERS, p) }
}

/// # Safety
/// - No thread detaches `m` while the reference is in use.
unsafe fn memory<'a>(m: vkgdr_attached_memory_t) -> CResult<&'a AttachedMemory> {
    // SAFETY: forwarded to our caller.
    unsafe { lookup(&MEMORIES, m) }
}

/// # Safety
/// - No thread detaches `p` while the reference is in use.
unsafe fn pool<'a>(p: vkgdr_attached_pool_t) -> CResult<&'a PoolEntry> {
    // SAFETY: forwarded to our caller.
    unsafe { lookup(&POOLS, p) }
}

/// # Safety
/// - No thread releases `b` while the reference is in use.
unsafe fn block<'a>(b: vkgdr_shared_block_t) -> CResult<&'a SharedBlock> {
    // SAFETY: forwarded to our caller.
    unsafe { lookup(&BLOCKS, b) }.map(|e| &e.block)
}

/// # Safety
/// - No thread detaches `l` while the reference is in use.
unsafe fn lane<'a>(l: vkgdr_attached_lane_t) -> CResult<&'a AttachedLane> {
    // SAFETY: forwarded to our caller.
    unsafe { lookup(&LANES, l) }
}

/// `[offset, offset + size)` of a `len`-byte object, `SIZE_MAX` reaching to its end.
fn sync_range(offset: usize, size: usize, len: u64) -> CResult<(u64, u64)> {
    let size = (size != usize::MAX).then_some(size as u64);
    Ok(vkgdr::range::range_to_end(offset as u64, size, len).map_err(vkgdr::Error::from)?)
}

/// Stores `value`'s new handle at `out` (which `clear_out` checked).
///
/// # Safety
/// - `out` is writable.
unsafe fn hand_out<T, H>(table: &HandleTable<T>, value: T, out: *mut H) -> CResult<c_int>
where
    H: crate::Handle,
{
    let h: H = register(table, value)?;
    // SAFETY: writable (caller).
    unsafe { out.write(h) };
    Ok(VKGDR_SUCCESS)
}

/// Connects to the owner listening at `path` (its `vkgdr_share_server_create`). Nothing is
/// mapped yet: the Vulkan device is opened when the first region arrives, by the UUID of the
/// GPU the owner names (no CUDA in this process: it runs without libcuda, with any driver that
/// has Vulkan's external-memory fds).
///
/// - `timeout_ns`: how long each call that waits for the owner's answer waits (attach,
///   request); 0 for the default, 10 s.
/// - `out`: where to store the handle (NULL unless `VKGDR_SUCCESS`).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (a NULL pointer; no server at `path`, e.g.
/// `connect failed (ENOENT)`, or one that refuses this process's uid, the path named).
///
/// Thread safety: any thread; the connection may be used from many threads. Free it with
/// `vkgdr_peer_destroy`; what was attached through it keeps it alive until detached.
///
/// # Safety
/// - `path` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_peer_connect(
    path: *const c_char,
    timeout_ns: u64,
    out: *mut vkgdr_peer_t,
) -> c_int {
    guard("vkgdr_peer_connect", VKGDR_ERROR, || {
        // SAFETY: writable (caller).
        unsafe { clear_out(out, "peer") }?;
        // SAFETY: a NUL-terminated string (caller).
        let path = unsafe { socket_path(path) }?;
        let wait = match timeout_ns {
            0 => DEFAULT_TIMEOUT,
            ns => Duration::from_nanos(ns),
        };
        let peer = Peer::connect_with(path, None, wait).map_err(|e| {
            Failure::Api(format!(
                "cannot connect to {}: {}",
                path.display(),
                vkgdr::compat::message(&e)
            ))
        })?;
        // SAFETY: writable (caller).
        unsafe { hand_out(&PEERS, peer, out) }
    })
}

/// Closes this handle of the connection. `NULL` is ignored. Regions attached through it stay
/// attached (and the connection open) until they are detached; then the owner sees the peer
/// go.
///
/// Errors (reported through `vkgdr_last_error()` only): a handle already destroyed or not a
/// `vkgdr_peer_t`.
///
/// Thread safety: any thread, but not while another thread is using the same handle.
///
/// # Safety
/// - No other thread uses `peer` during or after the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_peer_destroy(peer: vkgdr_peer_t) {
    guard("vkgdr_peer_destroy", (), || release(&PEERS, peer))
}

/// Reads everything the owner sent meanwhile, without waiting: revocations (after which
/// `vkgdr_attached_memory_is_revoked` and the others say so, and writes are refused) and
/// blocks sent unasked. Every call that waits for the owner does this too.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle; an owner that sent something
/// the protocol does not allow; an owner that hung up, from the first call that finds nothing
/// it sent before the hang-up: `the other side of the share connection hung up`).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `peer` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_peer_poll(peer: vkgdr_peer_t) -> c_int {
    guard("vkgdr_peer_poll", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `peer` during the call.
        unsafe { self::peer(peer) }?.poll()?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Attaches the raw memory the owner shares as `name` (`vkgdr_share_memory`) and maps all of
/// it.
///
/// - `out`: where to store the handle (NULL unless `VKGDR_SUCCESS`).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a NULL pointer; the owner's
/// refusal, e.g. `the owner refused: no such region: nothing is shared as "params"`; a region
/// that is no raw memory; a region of a GPU or driver this process's Vulkan cannot import; an
/// owner that hung up or did not answer in time).
///
/// Thread safety: any thread. Detach it with `vkgdr_attached_memory_detach`.
///
/// # Safety
/// - `name` is a NUL-terminated string; `out` is writable.
/// - No thread destroys `peer` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_peer_attach_memory(
    peer: vkgdr_peer_t,
    name: *const c_char,
    out: *mut vkgdr_attached_memory_t,
) -> c_int {
    guard("vkgdr_peer_attach_memory", VKGDR_ERROR, || {
        // SAFETY: writable (caller).
        unsafe { clear_out(out, "memory") }?;
        // SAFETY: the caller does not destroy `peer` during the call.
        let p = unsafe { self::peer(peer) }?;
        // SAFETY: a NUL-terminated string (caller).
        let name = unsafe { region_name(name) }?;
        let m = p.attach_memory(name)?;
        // SAFETY: writable (caller).
        unsafe { hand_out(&MEMORIES, m, out) }
    })
}

/// The host address of the attached memory (all `vkgdr_attached_memory_get_size` bytes are
/// mapped), or `NULL` on error (an invalid handle). Stores through it are not checked for
/// revocation: `vkgdr_attached_memory_write` is; on non-coherent memory
/// `vkgdr_attached_memory_flush` makes them visible to the GPU.
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread detaches `mem` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_memory_get_host_ptr(
    mem: vkgdr_attached_memory_t,
) -> *mut c_void {
    guard("vkgdr_attached_memory_get_host_ptr", null_mut(), || {
        // SAFETY: the caller does not detach `mem` during the call.
        Ok(unsafe { memory(mem) }?.host_ptr().cast())
    })
}

/// The size of the attached memory, as the owner shared it, or 0 on error (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread detaches `mem` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_memory_get_size(mem: vkgdr_attached_memory_t) -> usize {
    guard("vkgdr_attached_memory_get_size", 0, || {
        // SAFETY: the caller does not detach `mem` during the call.
        Ok(unsafe { memory(mem) }?.len() as usize)
    })
}

/// Whether the attached memory is coherent for this process (flushes and invalidates are then
/// no-ops): as the owner's is. `false` also on error.
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread detaches `mem` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_memory_is_coherent(mem: vkgdr_attached_memory_t) -> bool {
    guard("vkgdr_attached_memory_is_coherent", false, || {
        // SAFETY: the caller does not detach `mem` during the call.
        Ok(!unsafe { memory(mem) }?.memory().is_non_coherent())
    })
}

/// Makes stores through the host pointer to `[offset, offset + size)` visible to the GPU
/// (`SIZE_MAX`: to the end), widened to whole atoms. A no-op on coherent memory, apart from the
/// range check.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the memory,
/// `vkFlushMappedMemoryRanges failed (...)`).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread detaches `mem` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_memory_flush(
    mem: vkgdr_attached_memory_t,
    offset: usize,
    size: usize,
) -> c_int {
    guard("vkgdr_attached_memory_flush", VKGDR_ERROR, || {
        // SAFETY: the caller does not detach `mem` during the call.
        let m = unsafe { memory(mem) }?;
        let (offset, size) = sync_range(offset, size, m.len())?;
        m.memory().flush(offset, size)?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Makes the GPU's writes to `[offset, offset + size)` visible to loads through the host
/// pointer (`SIZE_MAX`: to the end), widened to whole atoms. A no-op on coherent memory, apart
/// from the range check.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the memory,
/// `vkInvalidateMappedMemoryRanges failed (...)`).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread detaches `mem` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_memory_invalidate(
    mem: vkgdr_attached_memory_t,
    offset: usize,
    size: usize,
) -> c_int {
    guard("vkgdr_attached_memory_invalidate", VKGDR_ERROR, || {
        // SAFETY: the caller does not detach `mem` during the call.
        let m = unsafe { memory(mem) }?;
        let (offset, size) = sync_range(offset, size, m.len())?;
        m.memory().invalidate(offset, size)?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Copies `size` bytes from `src` to `offset` of the attached memory (the fast write-combining
/// copy), then flushes them: the owner's GPU sees them once this returns.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle; memory the owner revoked,
/// `revoked by the owner`, nothing written; a range outside the memory; `src` NULL with
/// `size` > 0; a flush failure).
///
/// Thread safety: any thread; concurrent writes to disjoint ranges are fine.
///
/// # Safety
/// - `src` is readable for `size` bytes and does not overlap the destination range.
/// - No other thread of this process accesses the destination range during the call, or
///   detaches `mem`.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_memory_write(
    mem: vkgdr_attached_memory_t,
    offset: usize,
    src: *const c_void,
    size: usize,
) -> c_int {
    guard("vkgdr_attached_memory_write", VKGDR_ERROR, || {
        // SAFETY: the caller does not detach `mem` during the call.
        let m = unsafe { memory(mem) }?;
        // SAFETY: readable for `size` bytes (caller).
        let src = unsafe { crate::copy::host_slice(src, size) }?;
        // SAFETY: the range is the caller's alone for the call and does not overlap `src`.
        unsafe { m.write_shared(offset as u64, src) }?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Copies `size` bytes of the attached memory at `offset` into `dst`, invalidating first
/// (CPU loads: slow through a PCIe BAR, well under 1 GB/s).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the memory,
/// `dst` NULL with `size` > 0, an invalidate failure).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `dst` is writable for `size` bytes and does not overlap the memory.
/// - No thread detaches `mem` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_memory_read(
    mem: vkgdr_attached_memory_t,
    offset: usize,
    dst: *mut c_void,
    size: usize,
) -> c_int {
    guard("vkgdr_attached_memory_read", VKGDR_ERROR, || {
        // SAFETY: the caller does not detach `mem` during the call.
        let m = unsafe { memory(mem) }?;
        // SAFETY: writable for `size` bytes, exclusively (caller).
        let dst = unsafe { crate::copy::host_slice_mut(dst, size) }?;
        m.read(offset as u64, dst)?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Whether the owner revoked the memory (as far as this process has read: `vkgdr_peer_poll`).
/// `false` also on error.
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread detaches `mem` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_memory_is_revoked(mem: vkgdr_attached_memory_t) -> bool {
    guard("vkgdr_attached_memory_is_revoked", false, || {
        // SAFETY: the caller does not detach `mem` during the call.
        Ok(unsafe { memory(mem) }?.is_revoked())
    })
}

/// Unmaps the memory and tells the owner. `NULL` is ignored.
///
/// Errors (reported through `vkgdr_last_error()` only): a handle already detached or not a
/// `vkgdr_attached_memory_t`.
///
/// Thread safety: any thread, but not while another thread is using the same handle.
///
/// # Safety
/// - No other thread uses `mem` during or after the call, and nothing uses its host pointer
///   any more.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_memory_detach(mem: vkgdr_attached_memory_t) {
    guard("vkgdr_attached_memory_detach", (), || {
        release(&MEMORIES, mem)
    })
}

/// Attaches the pool the owner shares as `name` (`vkgdr_share_pool`): its blocks then come
/// with `vkgdr_attached_pool_request` or from the owner (`vkgdr_attached_pool_next_block`).
///
/// - `out`: where to store the handle (NULL unless `VKGDR_SUCCESS`).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (as `vkgdr_peer_attach_memory`; a region that is
/// no pool).
///
/// Thread safety: any thread. Detach it with `vkgdr_attached_pool_detach`.
///
/// # Safety
/// - `name` is a NUL-terminated string; `out` is writable.
/// - No thread destroys `peer` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_peer_attach_pool(
    peer: vkgdr_peer_t,
    name: *const c_char,
    out: *mut vkgdr_attached_pool_t,
) -> c_int {
    guard("vkgdr_peer_attach_pool", VKGDR_ERROR, || {
        // SAFETY: writable (caller).
        unsafe { clear_out(out, "pool") }?;
        // SAFETY: the caller does not destroy `peer` during the call.
        let p = unsafe { self::peer(peer) }?;
        // SAFETY: a NUL-terminated string (caller).
        let name = unsafe { region_name(name) }?;
        let pool = p.attach_pool(name)?;
        let entry = PoolEntry {
            pool,
            held: Arc::default(),
        };
        // SAFETY: writable (caller).
        unsafe { hand_out(&POOLS, entry, out) }
    })
}

/// The most bytes of blocks asked for (`vkgdr_attached_pool_request`) this process may hold
/// at once, or 0 on error (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread detaches `pool` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_pool_get_quota(pool: vkgdr_attached_pool_t) -> u64 {
    guard("vkgdr_attached_pool_get_quota", 0, || {
        // SAFETY: the caller does not detach `pool` during the call.
        Ok(unsafe { self::pool(pool) }?.pool.quota())
    })
}

/// The block handle for `b`, counted in `entry`.
///
/// # Safety
/// - `out` is writable.
unsafe fn hand_out_block(
    entry: &PoolEntry,
    b: SharedBlock,
    out: *mut vkgdr_shared_block_t,
) -> CResult<c_int> {
    entry.held.fetch_add(1, Ordering::AcqRel);
    let e = BlockEntry {
        block: b,
        held: Arc::clone(&entry.held),
    };
    // SAFETY: writable (caller).
    unsafe { hand_out(&BLOCKS, e, out) }
}

/// Asks the owner for a block of `size` bytes aligned to `align` (a power of two) and waits for
/// it (up to the connection's timeout).
///
/// - `out`: where to store the block handle (NULL unless `VKGDR_SUCCESS`).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, `out` NULL; a revoked pool; the
/// owner's refusal: `over quota`, `out of memory`, `bad request` for a size or alignment its
/// pool does not take; an owner that hung up or did not answer in time).
///
/// Thread safety: any thread. Give the block back with `vkgdr_shared_block_release`.
///
/// # Safety
/// - `out` is writable.
/// - No thread detaches `pool` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_pool_request(
    pool: vkgdr_attached_pool_t,
    size: usize,
    align: usize,
    out: *mut vkgdr_shared_block_t,
) -> c_int {
    guard("vkgdr_attached_pool_request", VKGDR_ERROR, || {
        // SAFETY: writable (caller).
        unsafe { clear_out(out, "block") }?;
        // SAFETY: the caller does not detach `pool` during the call.
        let entry = unsafe { self::pool(pool) }?;
        let b = entry.pool.request(size as u64, align as u64)?;
        // SAFETY: writable (caller).
        unsafe { hand_out_block(entry, b, out) }
    })
}

/// The next block the owner sent this process unasked (`vkgdr_share_send_block`), in the order
/// sent.
///
/// - `timeout_ns`: how long to wait for one: 0 only looks, negative waits until one comes.
/// - `out`: where to store the block handle (NULL unless `VKGDR_SUCCESS`).
///
/// Returns `VKGDR_SUCCESS`; `VKGDR_SHARE_NONE` if none came in time; or `VKGDR_ERROR` (an
/// invalid handle, `out` NULL, a revoked pool, an owner that hung up).
///
/// Thread safety: any thread. Give the block back with `vkgdr_shared_block_release`.
///
/// # Safety
/// - `out` is writable.
/// - No thread detaches `pool` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_pool_next_block(
    pool: vkgdr_attached_pool_t,
    timeout_ns: i64,
    out: *mut vkgdr_shared_block_t,
) -> c_int {
    guard("vkgdr_attached_pool_next_block", VKGDR_ERROR, || {
        // SAFETY: writable (caller).
        unsafe { clear_out(out, "block") }?;
        // SAFETY: the caller does not detach `pool` during the call.
        let entry = unsafe { self::pool(pool) }?;
        let forever = timeout(timeout_ns).is_none();
        let wait = timeout(timeout_ns).unwrap_or(Duration::from_secs(1));
        loop {
            match entry.pool.next_block(wait) {
                // SAFETY: writable (caller).
                Ok(b) => return unsafe { hand_out_block(entry, b, out) },
                Err(vkgdr::Error::Share(ShareError::Timeout { .. })) if !forever => {
                    return Ok(VKGDR_SHARE_NONE)
                }
                Err(vkgdr::Error::Share(ShareError::Timeout { .. })) => {}
                Err(e) => return Err(e.into()),
            }
        }
    })
}

/// Detaches the pool. `NULL` is ignored. Refused (nothing happens) while blocks of the pool are
/// still held by live handles: give them back first (`vkgdr_shared_block_release`), since the
/// owner frees what a detached pool held and this process still maps those blocks' chunks.
///
/// Errors (reported through `vkgdr_last_error()` only): a handle already detached or not a
/// `vkgdr_attached_pool_t`; blocks still held.
///
/// Thread safety: any thread, but not while another thread is using the same handle.
///
/// # Safety
/// - No other thread uses `pool` during or after the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_pool_detach(pool: vkgdr_attached_pool_t) {
    guard("vkgdr_attached_pool_detach", (), || {
        if pool.is_null() {
            return Ok(());
        }
        // SAFETY: no other thread uses `pool` during the call.
        let held = unsafe { self::pool(pool) }?.held.load(Ordering::Acquire);
        if held > 0 {
            return Err(Failure::Api(format!(
                "{held} blocks of this pool are still held: release them first \
                 (vkgdr_shared_block_release)"
            )));
        }
        release(&POOLS, pool)
    })
}

/// The block's host address (its `vkgdr_shared_block_get_size` bytes are this process's to
/// write), or `NULL` on error (an invalid handle). Stores through it are not checked for
/// revocation: `vkgdr_shared_block_write` is; on non-coherent memory `vkgdr_shared_block_flush`
/// makes them visible to the GPU.
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread releases `block` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_shared_block_get_host_ptr(
    block: vkgdr_shared_block_t,
) -> *mut c_void {
    guard("vkgdr_shared_block_get_host_ptr", null_mut(), || {
        // SAFETY: the caller does not release `block` during the call.
        Ok(unsafe { self::block(block) }?.host_ptr().cast())
    })
}

/// The block's size as asked for (or as the owner allocated it), or 0 on error.
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread releases `block` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_shared_block_get_size(block: vkgdr_shared_block_t) -> usize {
    guard("vkgdr_shared_block_get_size", 0, || {
        // SAFETY: the caller does not release `block` during the call.
        Ok(unsafe { self::block(block) }?.len() as usize)
    })
}

/// The owner's token for the block (what its `VKGDR_SHARE_EVENT_RELEASED` and
/// `vkgdr_share_take_returned` name), or 0 on error.
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread releases `block` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_shared_block_get_token(block: vkgdr_shared_block_t) -> u64 {
    guard("vkgdr_shared_block_get_token", 0, || {
        // SAFETY: the caller does not release `block` during the call.
        Ok(unsafe { self::block(block) }?.token())
    })
}

/// Whether the owner took the block (or its pool) back, as far as this process has read
/// (`vkgdr_peer_poll`). `false` also on error.
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread releases `block` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_shared_block_is_revoked(block: vkgdr_shared_block_t) -> bool {
    guard("vkgdr_shared_block_is_revoked", false, || {
        // SAFETY: the caller does not release `block` during the call.
        Ok(unsafe { self::block(block) }?.is_revoked())
    })
}

/// Copies `size` bytes from `src` into the block at `offset`, then flushes them.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle; a revoked block or pool,
/// nothing written; a range outside the block; `src` NULL with `size` > 0; a flush failure).
///
/// Thread safety: any thread; concurrent writes to disjoint ranges are fine.
///
/// # Safety
/// - `src` is readable for `size` bytes and does not overlap the block.
/// - No other thread of this process accesses the destination range during the call, or
///   releases `block`.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_shared_block_write(
    block: vkgdr_shared_block_t,
    offset: usize,
    src: *const c_void,
    size: usize,
) -> c_int {
    guard("vkgdr_shared_block_write", VKGDR_ERROR, || {
        // SAFETY: the caller does not release `block` during the call.
        let b = unsafe { self::block(block) }?;
        // SAFETY: readable for `size` bytes (caller).
        let src = unsafe { crate::copy::host_slice(src, size) }?;
        // SAFETY: the range is the caller's alone for the call and does not overlap `src`.
        unsafe { b.write_shared(offset as u64, src) }?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Copies `size` bytes of the block at `offset` into `dst`, invalidating first.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the block,
/// `dst` NULL with `size` > 0, an invalidate failure).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `dst` is writable for `size` bytes and does not overlap the block.
/// - No thread releases `block` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_shared_block_read(
    block: vkgdr_shared_block_t,
    offset: usize,
    dst: *mut c_void,
    size: usize,
) -> c_int {
    guard("vkgdr_shared_block_read", VKGDR_ERROR, || {
        // SAFETY: the caller does not release `block` during the call.
        let b = unsafe { self::block(block) }?;
        // SAFETY: writable for `size` bytes, exclusively (caller).
        let dst = unsafe { crate::copy::host_slice_mut(dst, size) }?;
        b.read(offset as u64, dst)?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Makes stores through the block's host pointer to `[offset, offset + size)` visible to the
/// GPU (`SIZE_MAX`: to the block's end). A no-op on coherent memory, apart from the range check.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the block,
/// `vkFlushMappedMemoryRanges failed (...)`).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread releases `block` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_shared_block_flush(
    block: vkgdr_shared_block_t,
    offset: usize,
    size: usize,
) -> c_int {
    guard("vkgdr_shared_block_flush", VKGDR_ERROR, || {
        // SAFETY: the caller does not release `block` during the call.
        let b = unsafe { self::block(block) }?;
        let (offset, size) = sync_range(offset, size, b.len())?;
        b.flush(offset, size)?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Makes the GPU's writes to `[offset, offset + size)` of the block visible to loads through
/// its host pointer (`SIZE_MAX`: to the block's end). A no-op on coherent memory, apart from the
/// range check.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the block,
/// `vkInvalidateMappedMemoryRanges failed (...)`).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread releases `block` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_shared_block_invalidate(
    block: vkgdr_shared_block_t,
    offset: usize,
    size: usize,
) -> c_int {
    guard("vkgdr_shared_block_invalidate", VKGDR_ERROR, || {
        // SAFETY: the caller does not release `block` during the call.
        let b = unsafe { self::block(block) }?;
        let (offset, size) = sync_range(offset, size, b.len())?;
        b.before_read(offset, size)?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Gives the block back to the owner (who frees it to its pool then, or takes it with what
/// was written: `vkgdr_share_take_returned`). `NULL` is ignored.
///
/// Errors (reported through `vkgdr_last_error()` only): a handle already released or not a
/// `vkgdr_shared_block_t`.
///
/// Thread safety: any thread, but not while another thread is using the same block.
///
/// # Safety
/// - No other thread uses `block` during or after the call, and nothing uses its host pointer
///   any more.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_shared_block_release(block: vkgdr_shared_block_t) {
    guard("vkgdr_shared_block_release", (), || release(&BLOCKS, block))
}

/// Attaches a lane of the ring the owner shares as `name` (`vkgdr_share_ring`): this process
/// becomes its producer (`vkgdr_attached_lane_push`), starting where the lane's last producer
/// stopped (`vkgdr_attached_lane_get_start`). Attaching the same name again borrows another
/// lane.
///
/// - `out`: where to store the handle (NULL unless `VKGDR_SUCCESS`).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (as `vkgdr_peer_attach_memory`; a region that is no
/// ring; `the owner refused: busy: ...` when every lane is taken).
///
/// Thread safety: any thread. Detach it with `vkgdr_attached_lane_detach`.
///
/// # Safety
/// - `name` is a NUL-terminated string; `out` is writable.
/// - No thread destroys `peer` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_peer_attach_lane(
    peer: vkgdr_peer_t,
    name: *const c_char,
    out: *mut vkgdr_attached_lane_t,
) -> c_int {
    guard("vkgdr_peer_attach_lane", VKGDR_ERROR, || {
        // SAFETY: writable (caller).
        unsafe { clear_out(out, "lane") }?;
        // SAFETY: the caller does not destroy `peer` during the call.
        let p = unsafe { self::peer(peer) }?;
        // SAFETY: a NUL-terminated string (caller).
        let name = unsafe { region_name(name) }?;
        let l = p.attach_lane(name)?;
        // SAFETY: writable (caller).
        unsafe { hand_out(&LANES, l, out) }
    })
}

/// A lane call's failure in C's words: a stopped lane says why the owner stopped it.
fn lane_failure(lane: &AttachedLane, e: vkgdr::Error) -> Failure {
    match (&e, lane.stop_reason()) {
        (vkgdr::Error::Ring(RingError::Stopped), Some(why)) => {
            Failure::Api(format!("the owner stopped serving the lane: {why}"))
        }
        _ => e.into(),
    }
}

/// Appends one record with the `size`-byte payload at `payload` to the lane and publishes it:
/// the bytes go straight into the owner's GPU memory, the tail to the owner, who checks it and
/// passes it on to the ring's consumer.
///
/// - `timeout_ns`: how long to wait for the consumer to free space: negative waits forever, 0
///   tries once.
/// - `seq`: NULL, or where to store the record's sequence number (numbered on from
///   `vkgdr_attached_lane_get_start`'s, one per record of the lane).
///
/// Returns `VKGDR_SUCCESS`; `VKGDR_RING_FULL` if no room appeared in time (nothing written);
/// or `VKGDR_ERROR` (an invalid handle, `payload` NULL, a zero size or one larger than the lane
/// takes; a lane the owner stopped serving, with why: revoked, a tail it refused, its consumer
/// gone).
///
/// Thread safety: any thread, concurrently (records reach the consumer in the order their
/// space was reserved).
///
/// # Safety
/// - `payload` is readable for `size` bytes; `seq` is NULL or writable.
/// - No thread detaches `lane` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_lane_push(
    lane: vkgdr_attached_lane_t,
    payload: *const c_void,
    size: usize,
    timeout_ns: i64,
    seq: *mut u64,
) -> c_int {
    guard("vkgdr_attached_lane_push", VKGDR_ERROR, || {
        // SAFETY: the caller does not detach `lane` during the call.
        let l = unsafe { self::lane(lane) }?;
        if payload.is_null() {
            return Err(Failure::Api("the payload pointer is NULL".into()));
        }
        // SAFETY: readable for `size` bytes (caller).
        let bytes = unsafe { crate::copy::host_slice(payload, size) }?;
        match l.push(bytes, timeout(timeout_ns)) {
            Ok(n) => {
                // SAFETY: `seq` is NULL or writable (caller).
                unsafe { write_optional(seq, n) };
                Ok(VKGDR_SUCCESS)
            }
            Err(vkgdr::Error::Ring(RingError::Full | RingError::Timeout)) => Ok(VKGDR_RING_FULL),
            Err(e) => Err(lane_failure(l, e)),
        }
    })
}

/// Appends `count` records (`payloads[i]`, `sizes[i]` bytes each) and publishes them all with
/// one fence and one tail (a batch larger than the free space is published in pieces while
/// waiting for more). They are numbered on from the lane's last record: with one thread
/// pushing, from `vkgdr_attached_lane_get_start`'s sequence number plus the records pushed
/// before.
///
/// - `timeout_ns`: as for `vkgdr_attached_lane_push`, for each wait.
/// - `written`: NULL, or where to store how many records were written (and published), also on
///   `VKGDR_RING_FULL` and `VKGDR_ERROR`.
///
/// Returns `VKGDR_SUCCESS`; `VKGDR_RING_FULL` if no room appeared in time for a record (the ones
/// before it are published); or `VKGDR_ERROR` (as `vkgdr_attached_lane_push`; `payloads` or
/// `sizes` NULL with `count` > 0, a NULL payload or a bad size, checked before anything is
/// written; another thread's batch on the lane in flight).
///
/// Thread safety: any thread; one batch at a time per lane (`vkgdr_attached_lane_push` of other
/// threads waits for it).
///
/// # Safety
/// - `payloads` and `sizes` are readable for `count` entries; each `payloads[i]` is readable
///   for `sizes[i]` bytes; `written` is NULL or writable.
/// - No thread detaches `lane` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_lane_push_batch(
    lane: vkgdr_attached_lane_t,
    payloads: *const *const c_void,
    sizes: *const usize,
    count: usize,
    timeout_ns: i64,
    written: *mut usize,
) -> c_int {
    guard("vkgdr_attached_lane_push_batch", VKGDR_ERROR, || {
        // SAFETY: `written` is NULL or writable (caller).
        unsafe { write_optional(written, 0) };
        // SAFETY: the caller does not detach `lane` during the call.
        let l = unsafe { self::lane(lane) }?;
        if count == 0 {
            return Ok(VKGDR_SUCCESS);
        }
        if payloads.is_null() || sizes.is_null() {
            return Err(Failure::Api("the payloads or sizes pointer is NULL".into()));
        }
        // SAFETY: readable for `count` entries each (caller).
        let (ptrs, lens) = unsafe {
            (
                std::slice::from_raw_parts(payloads, count),
                std::slice::from_raw_parts(sizes, count),
            )
        };
        // Checked before anything is written, so that a bad entry never leaves half a batch.
        for (i, (&ptr, &len)) in ptrs.iter().zip(lens).enumerate() {
            if ptr.is_null() {
                return Err(Failure::Api(format!("payloads[{i}] is NULL")));
            }
            if len == 0 {
                return Err(vkgdr::Error::from(RingError::ZeroLength).into());
            }
            payload_len(len)?;
        }
        // SAFETY: each non-NULL (checked) and readable for its size (caller).
        let records = ptrs
            .iter()
            .zip(lens)
            .map(|(&ptr, &len)| unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) });
        let mut p = l.producer().map_err(|e| lane_failure(l, e))?;
        // Every record takes one sequence number: their difference counts what went in, also
        // when the batch stops early.
        let first = p.next_seq();
        let result = p.push_batch(records, timeout(timeout_ns));
        let n = p.next_seq() - first;
        // Dropping the producer publishes what is left and lets shared pushes in again.
        drop(p);
        // SAFETY: `written` is NULL or writable (caller); the count is at most `count`, a usize.
        unsafe { write_optional(written, n as usize) };
        match result {
            Ok(_) => Ok(VKGDR_SUCCESS),
            Err(RingError::Full | RingError::Timeout) => Ok(VKGDR_RING_FULL),
            Err(e) => Err(lane_failure(l, e.into())),
        }
    })
}

/// Whether the owner stopped serving the lane: revoked, refused a tail this process published,
/// or its consumer is gone. Records pushed from then on reach no consumer
/// (`vkgdr_attached_lane_get_stop_reason` says why). `false` also on error.
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread detaches `lane` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_lane_is_stopped(lane: vkgdr_attached_lane_t) -> bool {
    guard("vkgdr_attached_lane_is_stopped", false, || {
        // SAFETY: the caller does not detach `lane` during the call.
        Ok(unsafe { self::lane(lane) }?.is_stopped())
    })
}

/// Why the owner stopped serving the lane: a copy the caller releases with `free()`, or `NULL`
/// while it serves it (and on error: an invalid handle, reported through `vkgdr_last_error()`).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread detaches `lane` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_lane_get_stop_reason(
    lane: vkgdr_attached_lane_t,
) -> *mut c_char {
    guard("vkgdr_attached_lane_get_stop_reason", null_mut(), || {
        // SAFETY: the caller does not detach `lane` during the call.
        let why = unsafe { self::lane(lane) }?.stop_reason();
        Ok(why.map_or(null_mut(), |w| c_string_copy(&w.to_string())))
    })
}

/// Writes a lane position to the caller's out-pointers (each may be NULL).
///
/// # Safety
/// - `tail` and `seq` are NULL or writable.
unsafe fn write_position(at: vkgdr::share::lane::LanePosition, tail: *mut u64, seq: *mut u64) {
    // SAFETY: `tail` is NULL or writable (caller).
    unsafe { write_optional(tail, at.tail) };
    // SAFETY: `seq` is NULL or writable (caller).
    unsafe { write_optional(seq, at.seq) };
}

/// What the owner has accepted from this lane and passed on to its consumer so far: the end of
/// the last accepted record (`tail`, bytes since the lane began) and the sequence number after
/// it (`seq`). Once `seq` reaches the number after the last record pushed, every record is on
/// its way to the consumer.
///
/// - `tail`, `seq`: NULL, or where to store each.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `tail` and `seq` are NULL or writable.
/// - No thread detaches `lane` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_lane_get_accepted(
    lane: vkgdr_attached_lane_t,
    tail: *mut u64,
    seq: *mut u64,
) -> c_int {
    guard("vkgdr_attached_lane_get_accepted", VKGDR_ERROR, || {
        // SAFETY: the caller does not detach `lane` during the call.
        let at = unsafe { self::lane(lane) }?.accepted();
        // SAFETY: NULL or writable (caller).
        unsafe { write_position(at, tail, seq) };
        Ok(VKGDR_SUCCESS)
    })
}

/// Where this producer started: the lane's position (`tail`) and the sequence number of its
/// first record (`seq`), where the lane's previous producer stopped (0 and 0 for a new ring).
///
/// - `tail`, `seq`: NULL, or where to store each.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `tail` and `seq` are NULL or writable.
/// - No thread detaches `lane` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_lane_get_start(
    lane: vkgdr_attached_lane_t,
    tail: *mut u64,
    seq: *mut u64,
) -> c_int {
    guard("vkgdr_attached_lane_get_start", VKGDR_ERROR, || {
        // SAFETY: the caller does not detach `lane` during the call.
        let at = unsafe { self::lane(lane) }?.start();
        // SAFETY: NULL or writable (caller).
        unsafe { write_position(at, tail, seq) };
        Ok(VKGDR_SUCCESS)
    })
}

/// The lane's number in the owner's ring (what the owner's consumer and
/// `vkgdr_ring_get_lane_results` know it by), or `UINT32_MAX` on error (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread detaches `lane` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_lane_get_lane(lane: vkgdr_attached_lane_t) -> u32 {
    guard("vkgdr_attached_lane_get_lane", u32::MAX, || {
        // SAFETY: the caller does not detach `lane` during the call.
        Ok(unsafe { self::lane(lane) }?.lane())
    })
}

/// The lane's capacity in bytes (the owner's ring's, per lane), or 0 on error.
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread detaches `lane` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_lane_get_capacity(lane: vkgdr_attached_lane_t) -> u64 {
    guard("vkgdr_attached_lane_get_capacity", 0, || {
        // SAFETY: the caller does not detach `lane` during the call.
        Ok(unsafe { self::lane(lane) }?.capacity())
    })
}

/// Detaches the lane: the owner takes a last look at what it published (passing on what it
/// accepts) and takes the lane back there, for its next producer. `NULL` is ignored.
///
/// Errors (reported through `vkgdr_last_error()` only): a handle already detached or not a
/// `vkgdr_attached_lane_t`.
///
/// Thread safety: any thread, but not while another thread is using the same handle.
///
/// # Safety
/// - No other thread uses `lane` during or after the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_attached_lane_detach(lane: vkgdr_attached_lane_t) {
    guard("vkgdr_attached_lane_detach", (), || release(&LANES, lane))
}

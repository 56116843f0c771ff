//! Rings that stream records from C threads to a running kernel (`vkgdr_ring_*`), a thin layer
//! over [`vkgdr::ring::DeviceRing`]: create, push, the device view a consumer kernel needs,
//! stop, and the words the consumer reports back.

use std::ffi::{c_int, c_void};
use std::sync::LazyLock;
use std::time::Duration;

use vkgdr::ring::core::RingError;
use vkgdr::ring::layout::{WrapMode, RESULT_WORDS};
use vkgdr::ring::DeviceRing;

use crate::device::{device, vkgdr_t};
use crate::error::{guard, CResult, Failure};
use crate::handles::{HandleTable, Tag};
use crate::versioned::{self, Versioned};
use crate::{lookup, register, release, CUdeviceptr, VKGDR_ERROR, VKGDR_SUCCESS};

/// Opaque handle to a ring.
pub struct vkgdr_ring {
    _private: [u8; 0],
}

/// Opaque handle to a ring, from `vkgdr_ring_create`; freed with `vkgdr_ring_destroy`.
pub type vkgdr_ring_t = *mut vkgdr_ring;

/// Flags of `vkgdr_ring_create`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub enum vkgdr_ring_flags {
    /// Map the data region twice back to back (CUDA VMM), so records run over the end with no
    /// padding and a consumer reads each one contiguously (the `_mirrored` consumers of
    /// `kernels/ring.cu`). `capacity` must then be a multiple of the VMM granularity (2 MiB).
    VKGDR_RING_MIRRORED_BIT = 1,
}

/// `vkgdr_ring_push` found no room before its timeout: nothing was written, try again later.
pub const VKGDR_RING_FULL: c_int = 1;

/// What a consumer kernel needs (`vkgdr_ring_get_device_view`); the wire format is described in
/// `kernels/ring.cu`. Set `struct_size` to `sizeof(vkgdr_ring_device_view)` before the call.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct vkgdr_ring_device_view {
    /// `sizeof(vkgdr_ring_device_view)` as the caller was compiled.
    pub struct_size: usize,
    /// Device address of the data region (16-byte aligned).
    pub data: CUdeviceptr,
    /// Capacity of the data region in bytes (a power of two).
    pub capacity: u64,
    /// Device address of `tail` (u64 in GPU memory, written by the CPU: end of the published
    /// records).
    pub tail: CUdeviceptr,
    /// Device address of `stop` (u32 in GPU memory, set by `vkgdr_ring_stop`).
    pub stop: CUdeviceptr,
    /// Device address of `head` (u64 in pinned host memory, written by the consumer: end of the
    /// consumed records; producers reuse the space below it).
    pub head: CUdeviceptr,
    /// Device address of 8 u64 result words in pinned host memory for the consumer to report
    /// into (`vkgdr_ring_get_results` reads them).
    pub result: CUdeviceptr,
    /// 1 for a ring made with `VKGDR_RING_MIRRORED_BIT`, else 0.
    pub mirrored: u32,
}

// SAFETY: integers only; `struct_size` first.
unsafe impl Versioned for vkgdr_ring_device_view {
    const NAME: &'static str = "vkgdr_ring_device_view";
}

/// Live `vkgdr_ring_t` handles.
static RINGS: LazyLock<HandleTable<DeviceRing>> = LazyLock::new(|| HandleTable::new(Tag::Ring));

/// # Safety
/// - No thread destroys `ring` while the reference is in use.
unsafe fn ring<'a>(ring: vkgdr_ring_t) -> CResult<&'a DeviceRing> {
    // SAFETY: forwarded to our caller.
    unsafe { lookup(&RINGS, ring) }
}

/// Creates a ring of `capacity` bytes (a power of two, at least 4096) in BAR-mapped memory of
/// `g`'s device, in the handle's context (see `vkgdr_pool_create`).
///
/// - `flags`: 0 or `VKGDR_RING_MIRRORED_BIT`.
///
/// Returns a handle, or `NULL` on error (a bad capacity or flag, a `vkgdr_open_vulkan` handle, a
/// driver failure).
///
/// Thread safety: any thread. Pushes may come from many threads at once.
/// Free it with `vkgdr_ring_destroy` once the consumer is done.
///
/// # Safety
/// - No thread closes `g` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_create(g: vkgdr_t, capacity: u64, flags: u32) -> vkgdr_ring_t {
    guard("vkgdr_ring_create", std::ptr::null_mut(), || {
        // SAFETY: the caller does not close `g` during the call.
        let gpu = unsafe { device(g) }?.gpu()?;
        let r = match flags {
            0 => DeviceRing::new(gpu, capacity)?,
            1 => DeviceRing::new_mirrored(gpu, capacity)?,
            _ => {
                return Err(Failure::Api(format!(
                    "unknown ring flag bits {:#x}",
                    flags & !1
                )))
            }
        };
        register(&RINGS, r)
    })
}

/// Destroys a ring. `NULL` is ignored. The consumer kernel must have finished with it.
///
/// Errors (reported through `vkgdr_last_error()` only): a handle already destroyed or not a
/// `vkgdr_ring_t`.
///
/// Thread safety: any thread, but not while another thread is using the same ring.
///
/// # Safety
/// - No other thread uses `ring` during or after the call; no kernel reads it any more.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_destroy(ring: vkgdr_ring_t) {
    guard("vkgdr_ring_destroy", (), || release(&RINGS, ring))
}

/// Appends one record with the `size`-byte payload at `payload` and publishes it to the consumer
/// (records of all threads reach the consumer in the order their space was reserved).
///
/// - `timeout_ns`: how long to wait for the consumer to free space: negative waits forever, 0
///   tries once.
/// - `seq`: NULL, or where to store the record's sequence number (0, 1, 2, ... per ring).
///
/// Returns `VKGDR_SUCCESS`; `VKGDR_RING_FULL` if no room appeared in time (nothing written); or
/// `VKGDR_ERROR` (an invalid handle, `payload` NULL, a zero size or one larger than the ring
/// takes, a consumer head that makes no sense).
///
/// Thread safety: any thread, concurrently.
///
/// # Safety
/// - `payload` is readable for `size` bytes; `seq` is NULL or writable.
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_push(
    ring: vkgdr_ring_t,
    payload: *const c_void,
    size: usize,
    timeout_ns: i64,
    seq: *mut u64,
) -> c_int {
    guard("vkgdr_ring_push", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let r = unsafe { self::ring(ring) }?;
        if payload.is_null() {
            return Err(Failure::Api("the payload pointer is NULL".into()));
        }
        // SAFETY: readable for `size` bytes (caller).
        let bytes = unsafe { crate::copy::host_slice(payload, size) }?;
        let timeout = u64::try_from(timeout_ns).ok().map(Duration::from_nanos);
        // Take what the consumer has freed before the first try (a zero timeout tries only once).
        r.core().reclaim_to(r.head()).map_err(vkgdr::Error::from)?;
        match r.push(bytes, timeout) {
            Ok(n) => {
                if !seq.is_null() {
                    // SAFETY: writable (caller).
                    unsafe { seq.write(n) };
                }
                Ok(VKGDR_SUCCESS)
            }
            Err(vkgdr::Error::Ring(RingError::Full | RingError::Timeout)) => Ok(VKGDR_RING_FULL),
            Err(e) => Err(e.into()),
        }
    })
}

/// Fills `*view` (whose `struct_size` the caller sets) with the addresses a consumer kernel
/// needs.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, `view` NULL or its `struct_size`
/// unset).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `view` is NULL or writable for `view->struct_size` bytes.
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_get_device_view(
    ring: vkgdr_ring_t,
    view: *mut vkgdr_ring_device_view,
) -> c_int {
    guard("vkgdr_ring_get_device_view", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let v = unsafe { self::ring(ring) }?.device_view();
        let out = vkgdr_ring_device_view {
            struct_size: std::mem::size_of::<vkgdr_ring_device_view>(),
            data: v.data,
            capacity: v.capacity,
            tail: v.tail,
            stop: v.stop,
            head: v.head,
            result: v.result,
            mirrored: u32::from(v.wrap == WrapMode::Mirrored),
        };
        // SAFETY: writable for its struct_size (caller).
        unsafe { versioned::write(view, &out) }?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Asks a persistent consumer to exit once it has consumed everything published (sets `stop`
/// after the last tail). Push nothing afterwards.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_stop(ring: vkgdr_ring_t) -> c_int {
    guard("vkgdr_ring_stop", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        unsafe { self::ring(ring) }?.stop();
        Ok(VKGDR_SUCCESS)
    })
}

/// The consumer's published head (how far it has consumed, in bytes since the start), read
/// from pinned host memory. `UINT64_MAX` on error (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_get_head(ring: vkgdr_ring_t) -> u64 {
    guard("vkgdr_ring_get_head", u64::MAX, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        Ok(unsafe { self::ring(ring) }?.head())
    })
}

/// Copies the first `count` (at most 8) result words the consumer reported (the view's
/// `result`) into `words`. For the `ring_consume_*` kernels of `kernels/ring.cu`: records,
/// checksum sum, errors, next sequence number, position.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, `words` NULL, `count` > 8).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `words` is writable for `count` values.
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_get_results(
    ring: vkgdr_ring_t,
    words: *mut u64,
    count: usize,
) -> c_int {
    guard("vkgdr_ring_get_results", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let results = unsafe { self::ring(ring) }?.results();
        if count > RESULT_WORDS {
            return Err(Failure::Api(format!(
                "count {count} exceeds the {RESULT_WORDS} result words"
            )));
        }
        if count > 0 && words.is_null() {
            return Err(Failure::Api("the words pointer is NULL".into()));
        }
        // SAFETY: writable for `count` u64s (caller); `count` <= results.len().
        unsafe { std::ptr::copy_nonoverlapping(results.as_ptr(), words, count) };
        Ok(VKGDR_SUCCESS)
    })
}

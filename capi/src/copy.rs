//! Copies into and out of a CPU mapping of GPU memory, in the spirit of gdrcopy's
//! `gdr_copy_to_mapping` / `gdr_copy_from_mapping`, over [`vkgdr::copy`].

use std::ffi::{c_int, c_void};

use crate::error::{guard, CResult, Failure};
use crate::{VKGDR_ERROR, VKGDR_SUCCESS};

/// `size` bytes at `p` as a slice; NULL is allowed only when `size` is 0.
///
/// # Safety
/// - `p` is NULL or readable for `size` bytes, not written by anyone during the borrow.
pub(crate) unsafe fn host_slice<'a>(p: *const c_void, size: usize) -> CResult<&'a [u8]> {
    if size == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Failure::Api("the source pointer is NULL".into()));
    }
    // SAFETY: non-null and readable for `size` bytes (caller).
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), size) })
}

/// `size` writable bytes at `p`; NULL is allowed only when `size` is 0.
///
/// # Safety
/// - `p` is NULL or writable for `size` bytes, accessed by no one else during the borrow.
pub(crate) unsafe fn host_slice_mut<'a>(p: *mut c_void, size: usize) -> CResult<&'a mut [u8]> {
    if size == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(Failure::Api("the destination pointer is NULL".into()));
    }
    // SAFETY: non-null and writable for `size` bytes, exclusively (caller).
    Ok(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), size) })
}

/// Copies `size` bytes from host memory `src` to `mapping_dst`, a pointer into a CPU mapping of
/// GPU memory (from `vkgdr_memory_get_host_ptr` or `vkgdr_block_get_host_ptr`, any offset), on
/// the calling thread: naturally aligned stores up to the vector width, then non-temporal vector
/// stores (AVX-512, AVX2 or SSE4.1, whichever the CPU has), then an `sfence`, so that a flag
/// written afterwards cannot overtake the data. Like gdrcopy's `gdr_copy_to_mapping`; no byte
/// outside the range is touched. No flush: on non-coherent memory call `vkgdr_memory_flush` or
/// `vkgdr_block_flush` afterwards.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` if a pointer is NULL while `size` > 0.
///
/// Thread safety: any thread; concurrent copies to disjoint ranges are fine.
///
/// # Safety
/// - `mapping_dst` is writable and `src` readable for `size` bytes; the ranges do not overlap.
/// - No other thread accesses the destination range during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_copy_to_mapping(
    mapping_dst: *mut c_void,
    src: *const c_void,
    size: usize,
) -> c_int {
    guard("vkgdr_copy_to_mapping", VKGDR_ERROR, || {
        // SAFETY: readable for `size` bytes (caller).
        let src = unsafe { host_slice(src, size) }?;
        if size > 0 && mapping_dst.is_null() {
            return Err(Failure::Api("the mapping pointer is NULL".into()));
        }
        // SAFETY: writable, disjoint from `src` and unshared for the call (caller).
        unsafe { vkgdr::copy::copy_to_mapping(mapping_dst.cast(), src) };
        Ok(VKGDR_SUCCESS)
    })
}

/// Copies `size` bytes from `mapping_src`, a pointer into a CPU mapping of GPU memory, to host
/// memory `dst`, on the calling thread: a full fence first (so the loads cannot pass an earlier
/// poll of a ready flag), then streaming loads (`movntdqa`) for the aligned bulk. Like gdrcopy's
/// `gdr_copy_from_mapping`; CPU reads through the BAR are slow (well under 1 GB/s per thread).
/// No invalidate: on non-coherent memory call `vkgdr_memory_invalidate` or
/// `vkgdr_block_invalidate` first.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` if a pointer is NULL while `size` > 0.
///
/// Thread safety: any thread.
///
/// # Safety
/// - `dst` is writable and `mapping_src` readable for `size` bytes; the ranges do not overlap.
/// - No other thread writes the source range through the CPU during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_copy_from_mapping(
    dst: *mut c_void,
    mapping_src: *const c_void,
    size: usize,
) -> c_int {
    guard("vkgdr_copy_from_mapping", VKGDR_ERROR, || {
        // SAFETY: writable for `size` bytes, exclusively (caller).
        let dst = unsafe { host_slice_mut(dst, size) }?;
        if size > 0 && mapping_src.is_null() {
            return Err(Failure::Api("the mapping pointer is NULL".into()));
        }
        // SAFETY: readable, disjoint from `dst` (caller).
        unsafe { vkgdr::copy::copy_from_mapping(dst, mapping_src.cast()) };
        Ok(VKGDR_SUCCESS)
    })
}

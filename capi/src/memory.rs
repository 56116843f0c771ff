//! vkgdr 0.1's raw allocations (`vkgdr_memory_*`), plus bounds-checked `vkgdr_memory_write` /
//! `vkgdr_memory_read`.

use std::ffi::{c_int, c_void};
use std::sync::LazyLock;

use vkgdr::compat;
use vkgdr::RawMemory;

use crate::device::{device, vkgdr_t};
use crate::error::{guard, CResult, Failure};
use crate::handles::{HandleTable, Tag};
use crate::{lookup, register, release, CUdeviceptr, VKGDR_ERROR, VKGDR_SUCCESS};

/// Opaque handle to a memory allocation.
pub struct vkgdr_memory {
    _private: [u8; 0],
}

/// Opaque handle to a memory allocation, from `vkgdr_memory_alloc`; freed with
/// `vkgdr_memory_free`.
pub type vkgdr_memory_t = *mut vkgdr_memory;

/// Live `vkgdr_memory_t` handles.
static MEMORIES: LazyLock<HandleTable<RawMemory>> = LazyLock::new(|| HandleTable::new(Tag::Memory));

/// # Safety
/// - No thread frees `mem` while the reference is in use.
unsafe fn memory<'a>(mem: vkgdr_memory_t) -> CResult<&'a RawMemory> {
    // SAFETY: forwarded to our caller.
    unsafe { lookup(&MEMORIES, mem) }
}

/// `[offset, offset + size)` must lie inside an allocation of `len` bytes.
pub(crate) fn check_range(offset: usize, size: usize, len: u64) -> CResult<()> {
    match offset.checked_add(size) {
        Some(end) if end as u64 <= len => Ok(()),
        _ => Err(Failure::Api(format!(
            "range {offset}+{size} is outside the {len}-byte allocation"
        ))),
    }
}

/// Allocates `size` bytes of GPU memory with a host mapping, imported into the calling thread's
/// **current** CUDA context (which must belong to the handle's device); kernels of that context
/// use `vkgdr_memory_get_device_ptr`. Costs a Vulkan allocation and a CUDA import (hundreds of
/// microseconds): for many small buffers use a pool (`vkgdr_pool_create`).
///
/// - `flags`: for future expansion; must be 0.
///
/// Returns a handle, or `NULL` on error (`vkgdr_last_error()`: e.g.
/// `vkAllocateMemory failed (VK_ERROR_OUT_OF_DEVICE_MEMORY)` when the BAR-mappable memory is
/// exhausted, `cuCtxGetDevice failed (CUDA_ERROR_INVALID_CONTEXT)` with no current context).
///
/// Thread safety: any thread, concurrently with other calls on the same `g`.
/// Free the memory with `vkgdr_memory_free`.
///
/// # Safety
/// - The current context stays alive until the memory is freed.
/// - No thread closes `g` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_memory_alloc(g: vkgdr_t, size: usize, flags: u32) -> vkgdr_memory_t {
    guard("vkgdr_memory_alloc", std::ptr::null_mut(), || {
        // SAFETY: the caller does not close `g` during the call.
        let gpu = unsafe { device(g) }?.gpu()?;
        // SAFETY: the context-lifetime obligation is forwarded to our caller.
        let mem = unsafe { compat::alloc(gpu, size as u64, flags) }?;
        register(&MEMORIES, mem)
    })
}

/// Frees memory from `vkgdr_memory_alloc`. `NULL` is ignored. Unlike vkgdr 0.1 any thread may
/// call it with any (or no) context current: the memory makes its own context current to free
/// itself.
///
/// Errors (reported through `vkgdr_last_error()` only): a handle already freed or not a
/// `vkgdr_memory_t`.
///
/// Thread safety: any thread, but not while another thread is using the same handle.
///
/// # Safety
/// - No other thread uses `mem` during or after the call, and no kernel uses the memory any more.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_memory_free(mem: vkgdr_memory_t) {
    guard("vkgdr_memory_free", (), || release(&MEMORIES, mem))
}

/// The host pointer to the allocation, or `NULL` on error (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread frees `mem` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_memory_get_host_ptr(mem: vkgdr_memory_t) -> *mut c_void {
    guard("vkgdr_memory_get_host_ptr", std::ptr::null_mut(), || {
        // SAFETY: the caller does not free `mem` during the call.
        let m = unsafe { memory(mem) }?;
        Ok(m.host_ptr().cast())
    })
}

/// The CUDA device pointer to the allocation (valid in the context that was current at
/// `vkgdr_memory_alloc`), or 0 on error (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread frees `mem` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_memory_get_device_ptr(mem: vkgdr_memory_t) -> CUdeviceptr {
    guard("vkgdr_memory_get_device_ptr", 0, || {
        // SAFETY: the caller does not free `mem` during the call.
        let m = unsafe { memory(mem) }?;
        Ok(m.device_ptr())
    })
}

/// The size of the allocation as asked for (a 4097-byte request reports 4097), or 0 on error.
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread frees `mem` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_memory_get_size(mem: vkgdr_memory_t) -> usize {
    guard("vkgdr_memory_get_size", 0, || {
        // SAFETY: the caller does not free `mem` during the call.
        let m = unsafe { memory(mem) }?;
        Ok(m.size() as usize)
    })
}

/// Whether the allocation is coherent from the host's point of view (flushes and invalidates are
/// then no-ops). `false` also on error.
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread frees `mem` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_memory_is_coherent(mem: vkgdr_memory_t) -> bool {
    guard("vkgdr_memory_is_coherent", false, || {
        // SAFETY: the caller does not free `mem` during the call.
        let m = unsafe { memory(mem) }?;
        Ok(m.is_coherent())
    })
}

/// The alignment of flush and invalidate ranges: `nonCoherentAtomSize`, or 1 when the memory is
/// coherent. 0 on error.
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread frees `mem` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_memory_non_coherent_atom_size(mem: vkgdr_memory_t) -> usize {
    guard("vkgdr_memory_non_coherent_atom_size", 0, || {
        // SAFETY: the caller does not free `mem` during the call.
        let m = unsafe { memory(mem) }?;
        Ok(m.non_coherent_atom_size() as usize)
    })
}

/// Flushes host writes in `[offset, offset + size)` so the device sees them (kernels launched
/// after this call). The range is widened to whole atoms inside the allocation, so unaligned
/// ranges are fine (vkgdr 0.1 left them undefined). A no-op on coherent memory.
///
/// Errors (reported through `vkgdr_last_error()`, which is cleared on success): an invalid
/// handle, a range outside the allocation, or the driver's failure
/// (`vkFlushMappedMemoryRanges failed (...)`).
///
/// Thread safety: any thread, also concurrently on the same handle.
///
/// # Safety
/// - No thread frees `mem` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_memory_flush(mem: vkgdr_memory_t, offset: usize, size: usize) {
    guard("vkgdr_memory_flush", (), || {
        // SAFETY: the caller does not free `mem` during the call.
        let m = unsafe { memory(mem) }?;
        check_range(offset, size, m.allocation_size())?;
        Ok(m.flush(offset as u64, size as u64)?)
    })
}

/// Invalidates the host's view of `[offset, offset + size)` so that device writes (of kernels
/// that have completed) are visible to the host. Widened to whole atoms like
/// `vkgdr_memory_flush`; a no-op on coherent memory.
///
/// Errors: as `vkgdr_memory_flush` (`vkInvalidateMappedMemoryRanges failed (...)`).
///
/// Thread safety: any thread, also concurrently on the same handle.
///
/// # Safety
/// - No thread frees `mem` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_memory_invalidate(mem: vkgdr_memory_t, offset: usize, size: usize) {
    guard("vkgdr_memory_invalidate", (), || {
        // SAFETY: the caller does not free `mem` during the call.
        let m = unsafe { memory(mem) }?;
        check_range(offset, size, m.allocation_size())?;
        Ok(m.invalidate(offset as u64, size as u64)?)
    })
}

/// Copies `size` bytes from `src` to `offset` of the allocation with the fast write-combining
/// copy (spread over worker threads when large), then flushes them: the device sees them once
/// this returns.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the allocation's
/// requested size, `src` NULL with `size` > 0, or a flush failure).
///
/// Thread safety: any thread; concurrent writes to disjoint ranges are fine.
///
/// # Safety
/// - `src` is readable for `size` bytes and does not overlap the destination range.
/// - No other thread accesses the destination range during the call, or frees `mem`.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_memory_write(
    mem: vkgdr_memory_t,
    offset: usize,
    src: *const c_void,
    size: usize,
) -> c_int {
    guard("vkgdr_memory_write", VKGDR_ERROR, || {
        // SAFETY: the caller does not free `mem` during the call.
        let m = unsafe { memory(mem) }?;
        check_range(offset, size, m.size())?;
        // SAFETY: `src` is readable for `size` bytes (caller).
        let src = unsafe { crate::copy::host_slice(src, size) }?;
        // SAFETY: the range lies inside the mapping (checked), is not shared during the call and
        // does not overlap `src` (caller).
        unsafe {
            vkgdr::copy::CopyPool::global().write(m.host_ptr().add(offset), src);
        }
        m.flush(offset as u64, size as u64)?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Invalidates `[offset, offset + size)`, then copies it into `dst` with streaming loads (the
/// fast way to read through the BAR from the CPU; reads are still far slower than writes).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the allocation's
/// requested size, `dst` NULL with `size` > 0, or an invalidate failure).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `dst` is writable for `size` bytes and does not overlap the source range.
/// - No thread frees `mem` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_memory_read(
    mem: vkgdr_memory_t,
    offset: usize,
    dst: *mut c_void,
    size: usize,
) -> c_int {
    guard("vkgdr_memory_read", VKGDR_ERROR, || {
        // SAFETY: the caller does not free `mem` during the call.
        let m = unsafe { memory(mem) }?;
        check_range(offset, size, m.size())?;
        // SAFETY: `dst` is writable for `size` bytes and distinct from the mapping (caller).
        let dst = unsafe { crate::copy::host_slice_mut(dst, size) }?;
        m.invalidate(offset as u64, size as u64)?;
        // SAFETY: the range lies inside the mapping (checked) and does not overlap `dst`.
        unsafe { vkgdr::copy::copy_from_mapping(dst, m.host_ptr().add(offset)) };
        Ok(VKGDR_SUCCESS)
    })
}

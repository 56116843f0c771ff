//! vkgdr 0.1's raw allocations (`vkgdr_memory_*`), plus bounds-checked `vkgdr_memory_write` /
//! `vkgdr_memory_read`, the frees that name a stream (`vkgdr_memory_free_after`) or none
//! (`vkgdr_memory_free_now`), and allocations of their own for sharing with other processes
//! (`vkgdr_memory_alloc_shareable`, on a `vkgdr_open_vulkan` handle too).

use std::ffi::{c_int, c_void};
use std::sync::LazyLock;

use vkgdr::compat;
use vkgdr::vulkan::VulkanMemory;
use vkgdr::{Mapping, RawMemory};

use crate::device::{device, vkgdr_t, Device};
use crate::error::{clear_last_error, guard, CResult, Failure};
use crate::handles::{BadHandle, HandleTable, Tag};
use crate::{
    is_legacy_stream, lookup, register, release, CUdeviceptr, CUstream, Handle, VKGDR_ERROR,
    VKGDR_SUCCESS,
};

/// Opaque handle to a memory allocation.
pub struct vkgdr_memory {
    _private: [u8; 0],
}

/// Opaque handle to a memory allocation, from `vkgdr_memory_alloc`; freed with
/// `vkgdr_memory_free`.
pub type vkgdr_memory_t = *mut vkgdr_memory;

/// What a `vkgdr_memory_t` holds.
pub(crate) enum Memory {
    /// GPU memory with a host and a device pointer (a `vkgdr_open` handle's).
    Cuda(RawMemory),
    /// Vulkan memory alone (`vkgdr_memory_alloc_shareable` on a `vkgdr_open_vulkan` handle):
    /// a host pointer, device pointer 0, nothing on any stream.
    Vulkan {
        /// The allocation (the request rounded up to 4 KiB).
        memory: VulkanMemory,
        /// The size asked for.
        size: u64,
    },
}

impl Memory {
    fn host_ptr(&self) -> *mut u8 {
        match self {
            Memory::Cuda(m) => m.host_ptr(),
            Memory::Vulkan { memory, .. } => memory.as_ptr(),
        }
    }

    fn device_ptr(&self) -> CUdeviceptr {
        match self {
            Memory::Cuda(m) => m.device_ptr(),
            Memory::Vulkan { .. } => 0,
        }
    }

    /// The size asked for.
    fn size(&self) -> u64 {
        match self {
            Memory::Cuda(m) => m.size(),
            Memory::Vulkan { size, .. } => *size,
        }
    }

    /// The bytes flushes and invalidates may cover (the request rounded up to 4 KiB).
    fn allocation_size(&self) -> u64 {
        match self {
            Memory::Cuda(m) => m.allocation_size(),
            Memory::Vulkan { memory, .. } => memory.size(),
        }
    }

    fn is_coherent(&self) -> bool {
        match self {
            Memory::Cuda(m) => m.is_coherent(),
            Memory::Vulkan { memory, .. } => !memory.is_non_coherent(),
        }
    }

    fn non_coherent_atom_size(&self) -> u64 {
        match self {
            Memory::Cuda(m) => m.non_coherent_atom_size(),
            Memory::Vulkan { memory, .. } if memory.is_non_coherent() => {
                memory.context().atom_size()
            }
            Memory::Vulkan { .. } => 1,
        }
    }

    fn flush(&self, offset: u64, len: u64) -> vkgdr::Result<()> {
        match self {
            Memory::Cuda(m) => m.flush(offset, len),
            Memory::Vulkan { memory, .. } => memory.flush(offset, len),
        }
    }

    fn invalidate(&self, offset: u64, len: u64) -> vkgdr::Result<()> {
        match self {
            Memory::Cuda(m) => m.invalidate(offset, len),
            Memory::Vulkan { memory, .. } => memory.invalidate(offset, len),
        }
    }

    /// Bounds-checked write, flushed.
    ///
    /// # Safety
    /// - No other thread accesses `[offset, offset + src.len())` during the call, and `src`
    ///   does not overlap it.
    unsafe fn write_shared(&self, offset: u64, src: &[u8]) -> vkgdr::Result<()> {
        match self {
            // SAFETY: forwarded to our caller.
            Memory::Cuda(m) => unsafe { m.write_shared(offset, src) },
            Memory::Vulkan { memory, size } => {
                vkgdr::range::range_to_end(offset, Some(src.len() as u64), *size)?;
                // SAFETY: inside the mapping (checked above: `size` <= the allocation), the
                // range is the caller's alone for the call and does not overlap `src`.
                unsafe { vkgdr::copy::copy_to_mapping(memory.as_ptr().add(offset as usize), src) };
                memory.flush(offset, src.len() as u64)
            }
        }
    }

    /// Bounds-checked read.
    fn read(&self, offset: u64, dst: &mut [u8]) -> vkgdr::Result<()> {
        match self {
            Memory::Cuda(m) => m.read(offset, dst),
            Memory::Vulkan { memory, size } => {
                vkgdr::range::range_to_end(offset, Some(dst.len() as u64), *size)?;
                memory.read(offset, dst)
            }
        }
    }
}

/// Live `vkgdr_memory_t` handles.
pub(crate) static MEMORIES: LazyLock<HandleTable<Memory>> =
    LazyLock::new(|| HandleTable::new(Tag::Memory));

/// # Safety
/// - No thread frees `mem` while the reference is in use.
pub(crate) unsafe fn memory<'a>(mem: vkgdr_memory_t) -> CResult<&'a Memory> {
    // SAFETY: forwarded to our caller.
    unsafe { lookup(&MEMORIES, mem) }
}

/// The range `vkgdr_memory_flush` or `vkgdr_memory_invalidate` of `size` bytes at `offset`
/// covers in a mapping of `len` bytes. `SIZE_MAX` is "to the end": vkgdr 0.1 hands `size` to
/// Vulkan unchanged, where `SIZE_MAX` is `VK_WHOLE_SIZE`, the rest of the mapping.
fn sync_range(offset: usize, size: usize, len: u64) -> vkgdr::Result<(u64, u64)> {
    let size = (size != usize::MAX).then_some(size as u64);
    Ok(vkgdr::range::range_to_end(offset as u64, size, len)?)
}

/// Allocates `size` bytes of GPU memory with a host mapping, imported into the calling thread's
/// **current** CUDA context (which must belong to the handle's device); kernels of that context
/// use `vkgdr_memory_get_device_ptr`. Costs a Vulkan allocation and a CUDA import (hundreds of
/// microseconds): for many small buffers use a pool (`vkgdr_pool_create`).
///
/// The contents are unspecified, except that the first 16 bytes are zero: they are written when
/// the memory is made, which warms the write path so that the first write is as fast as later ones.
///
/// - `flags`: for future expansion; pass 0 (other values are ignored, as vkgdr 0.1 ignores them).
///
/// Clears the calling thread's last error first (as vkgdr 0.1 does), so after this call
/// `vkgdr_last_error()` is `NULL` exactly when it succeeded.
///
/// Returns a handle, or `NULL` on error (`vkgdr_last_error()`: e.g.
/// `vkAllocateMemory failed (VK_ERROR_OUT_OF_DEVICE_MEMORY)` when the BAR-mappable memory is
/// exhausted; with no current context, how to make one current (or to use a pool), ending
/// `cuCtxGetDevice failed (CUDA_ERROR_INVALID_CONTEXT)`).
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
        clear_last_error();
        // SAFETY: the caller does not close `g` during the call.
        let gpu = unsafe { device(g) }?.gpu()?;
        // SAFETY: the context-lifetime obligation is forwarded to our caller.
        let mem = unsafe { compat::alloc(gpu, size as u64, flags, compat::Face::C) }?;
        register(&MEMORIES, Memory::Cuda(mem))
    })
}

/// Allocates `size` bytes of memory of its own, for sharing with other processes
/// (`vkgdr_share_memory`): never carved out of a larger allocation that other memory shares,
/// so the fd a peer receives reaches these bytes and no others. `vkgdr_memory_alloc`'s small
/// allocations are carved, and cannot be shared.
///
/// - `g`: a `vkgdr_open` handle: GPU memory like `vkgdr_memory_alloc`'s, but imported into the
///   handle's context (the one current at `vkgdr_open` with `VKGDR_OPEN_CURRENT_CONTEXT_BIT`,
///   else the device's primary context) and rounded up to the VMM granularity (2 MiB on the
///   H100). Or a `vkgdr_open_vulkan` handle: Vulkan memory with a host pointer alone
///   (`vkgdr_memory_get_device_ptr` is 0), for an owner without CUDA; every memory call takes
///   it, and the frees release it at once.
/// - `flags`: must be 0.
///
/// The contents are unspecified. `vkgdr_memory_get_size` reports `size`.
///
/// Returns a handle, or `NULL` on error (a zero size, unknown flags, an invalid handle, the
/// driver's out-of-memory `vkAllocateMemory failed (VK_ERROR_OUT_OF_DEVICE_MEMORY)`).
///
/// Thread safety: any thread. Free the memory with `vkgdr_memory_free`.
///
/// # Safety
/// - No thread closes `g` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_memory_alloc_shareable(
    g: vkgdr_t,
    size: usize,
    flags: u32,
) -> vkgdr_memory_t {
    guard("vkgdr_memory_alloc_shareable", std::ptr::null_mut(), || {
        if flags != 0 {
            return Err(Failure::Api(format!("flags must be 0 (got {flags:#x})")));
        }
        if size == 0 {
            return Err(vkgdr::Error::from(vkgdr::range::RangeError::ZeroSize).into());
        }
        // SAFETY: the caller does not close `g` during the call.
        let mem = match unsafe { device(g) }? {
            Device::Cuda(gpu) => Memory::Cuda(gpu.alloc_shareable(size as u64)?),
            Device::Vulkan(vulkan) => Memory::Vulkan {
                memory: vulkan.allocate(size as u64)?,
                size: size as u64,
            },
        };
        register(&MEMORIES, mem)
    })
}

/// Frees memory from `vkgdr_memory_alloc` or `vkgdr_memory_alloc_shareable`. `NULL` is ignored.
/// Unlike vkgdr 0.1 any thread may call it with any (or no) context current: the memory makes its
/// own context current to free itself.
///
/// Never waits for a running kernel: it returns at once, and the memory goes back to the driver
/// once the GPU work queued before this call on the legacy default stream of the memory's
/// context has completed (and so the work of every blocking stream, such as the runtime's
/// default stream). Until then it counts as in use (`vkgdr_wait_for_releases`). So freeing memory
/// right after launching a kernel on it on such a stream is safe. Kernels on streams created
/// non-blocking are not waited for: free what they may still use with `vkgdr_memory_free_after`.
///
/// Errors (reported through `vkgdr_last_error()` only): a handle already freed or not a
/// `vkgdr_memory_t`.
///
/// Thread safety: any thread, but not while another thread is using the same handle.
///
/// # Safety
/// - No other thread uses `mem` during or after the call, and no kernel on a non-blocking
///   stream uses the memory any more.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_memory_free(mem: vkgdr_memory_t) {
    guard("vkgdr_memory_free", (), || release(&MEMORIES, mem))
}

/// Frees memory from `vkgdr_memory_alloc` (or `vkgdr_memory_alloc_shareable`) once the GPU work
/// queued on `stream` so far has completed, without waiting for it: for memory a kernel on a stream
/// created non-blocking (`CU_STREAM_NON_BLOCKING`, such as a persistent kernel's) may still use,
/// which `vkgdr_memory_free` does not wait for. Returns at once; the memory counts as in use
/// (`vkgdr_wait_for_releases`) until the stream gets there.
///
/// - `mem`: `NULL` is ignored (`VKGDR_SUCCESS`).
/// - `stream`: a live stream of the memory's device (a `CUstream`, or the runtime's
///   `cudaStream_t`). `NULL` and `CU_STREAM_LEGACY` mean the legacy default stream: this is then
///   `vkgdr_memory_free`. `CU_STREAM_PER_THREAD` needs the memory's context current. Ignored for
///   memory of a `vkgdr_open_vulkan` handle, which no GPU work uses: it is released at once.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR`: for a handle already freed or not a
/// `vkgdr_memory_t` (nothing happens), or for a stream the driver refuses (e.g.
/// `cuStreamGetCtx failed (CUDA_ERROR_INVALID_HANDLE)`), in which case the memory is freed as
/// `vkgdr_memory_free` frees it. Except for an invalid handle, `mem` is gone after the call.
///
/// Thread safety: any thread, but not while another thread is using the same handle.
///
/// # Safety
/// - No other thread uses `mem` during or after the call.
/// - `stream` is NULL, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD` or a stream not yet
///   destroyed; where the driver lacks stream memory operations (then an event fences the
///   release), its context stays alive until the release has happened.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_memory_free_after(mem: vkgdr_memory_t, stream: CUstream) -> c_int {
    guard("vkgdr_memory_free_after", VKGDR_ERROR, || {
        let m = match MEMORIES.remove(mem.token()) {
            Ok(m) => m,
            Err(BadHandle::Null) => return Ok(VKGDR_SUCCESS),
            Err(why) => return Err(Failure::handle(Tag::Memory, why)),
        };
        match m {
            // No GPU work uses Vulkan memory alone: it goes at once.
            Memory::Vulkan { .. } => drop(m),
            // What a plain free fences on.
            Memory::Cuda(m) if is_legacy_stream(stream) => drop(m),
            // SAFETY: a live stream (the caller's contract); on an error the memory is
            // released as a plain drop would release it.
            Memory::Cuda(m) => unsafe { m.release_after_stream(stream.cast()) }?,
        }
        Ok(VKGDR_SUCCESS)
    })
}

/// Frees memory from `vkgdr_memory_alloc` now, without waiting for any GPU work queued before:
/// for memory that no kernel or copy in flight uses, which the driver then has back at once
/// (`vkgdr_memory_free` waits, in the background, for the legacy default stream first). `NULL`
/// is ignored. Never waits either.
///
/// Errors (reported through `vkgdr_last_error()` only): a handle already freed or not a
/// `vkgdr_memory_t`.
///
/// Thread safety: any thread, but not while another thread is using the same handle.
///
/// # Safety
/// - No other thread uses `mem` during or after the call, and no GPU work in flight uses the
///   memory.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_memory_free_now(mem: vkgdr_memory_t) {
    guard("vkgdr_memory_free_now", (), || {
        match MEMORIES.remove(mem.token()) {
            Ok(Memory::Cuda(m)) => m.release_now(),
            Ok(vulkan @ Memory::Vulkan { .. }) => drop(vulkan),
            Err(BadHandle::Null) => {}
            Err(why) => return Err(Failure::handle(Tag::Memory, why)),
        }
        Ok(())
    })
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
/// `vkgdr_memory_alloc`), or 0: on error (an invalid handle; `vkgdr_last_error()` is set) and
/// for `vkgdr_memory_alloc_shareable` memory of a `vkgdr_open_vulkan` handle (no error).
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
/// after this call). `size` `SIZE_MAX` flushes from `offset` to the end of the allocation (as
/// `VK_WHOLE_SIZE` does in vkgdr 0.1). The range is widened to whole atoms inside the allocation,
/// so unaligned ranges are fine (vkgdr 0.1 left them undefined). A no-op on coherent memory.
///
/// Errors (reported through `vkgdr_last_error()` only; success leaves it as it was): an invalid
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
        let (offset, size) = sync_range(offset, size, m.allocation_size())?;
        Ok(m.flush(offset, size)?)
    })
}

/// Invalidates the host's view of `[offset, offset + size)` so that device writes (of kernels
/// that have completed) are visible to the host. `size` `SIZE_MAX` means to the end of the
/// allocation, and the range is widened to whole atoms, as for `vkgdr_memory_flush`; a no-op on
/// coherent memory.
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
        let (offset, size) = sync_range(offset, size, m.allocation_size())?;
        Ok(m.invalidate(offset, size)?)
    })
}

/// Copies `size` bytes from `src` to `offset` of the allocation with the fast write-combining
/// copy (on the calling thread; from 1 MiB spread over worker threads), then flushes them: the
/// device sees them once this returns.
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
        // SAFETY: `src` is readable for `size` bytes (caller).
        let src = unsafe { crate::copy::host_slice(src, size) }?;
        // SAFETY: no other thread accesses the range during the call, and it does not overlap
        // `src` (caller).
        unsafe { m.write_shared(offset as u64, src) }?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Copies `size` bytes of the allocation at `offset` into `dst`, as the library reads any
/// mapping: reads below 16 KiB invalidate, then copy with streaming loads (CPU reads through
/// the BAR are far slower than writes); larger ones use the GPU's copy engine (on a stream of the
/// library's own, in the handle's context: the device's primary context unless the handle was
/// opened with `VKGDR_OPEN_CURRENT_CONTEXT_BIT`), from 1 MiB through pinned staging buffers.
/// Memory of a `vkgdr_open_vulkan` handle is read with CPU loads, whatever the size.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the allocation's
/// requested size, `dst` NULL with `size` > 0, or a driver failure).
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
        // SAFETY: `dst` is writable for `size` bytes and distinct from the mapping (caller).
        let dst = unsafe { crate::copy::host_slice_mut(dst, size) }?;
        m.read(offset as u64, dst)?;
        Ok(VKGDR_SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_max_syncs_to_the_end_as_vk_whole_size_does() {
        assert_eq!(sync_range(100, usize::MAX, 8192).unwrap(), (100, 8092));
        assert!(sync_range(8193, usize::MAX, 8192).is_err());
        // Only SIZE_MAX means "to the end": any other size is a length.
        assert!(sync_range(1, usize::MAX - 1, 8192).is_err());
        assert_eq!(sync_range(10, 20, 8192).unwrap(), (10, 20));
    }
}

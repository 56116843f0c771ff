//! Page-locked host memory from `cuMemHostAlloc`: what a CUDA user copies from and to with
//! `cuMemcpyHtoD`/`cuMemcpyDtoH` (and their `Async` forms), so the benchmarks' DMA rows measure
//! what a user would otherwise do.
//!
//! The library's own [`PinnedBuffer`](vkgdr::cuda_objects::PinnedBuffer) is not that: it is
//! Vulkan host memory mapped through CUDA VMM (so that dropping it never waits for a running
//! kernel), and CUDA does not know its host pointer as pinned. `cuMemcpyHtoD` from that pointer
//! is a pageable copy, staged through the driver's own buffers, at a fraction of the rate of a
//! copy from `cuMemHostAlloc` memory (figures: BENCHMARKS.md, 'Reads through the copy engine').

use std::ptr::NonNull;

use vkgdr::Gpu;

use super::error::{BenchError, BenchResult};

/// `len` bytes of `cuMemHostAlloc` memory of `gpu`'s context, zeroed.
///
/// Dropping it calls `cuMemFreeHost`, which waits for every running kernel of the context: drop
/// it only once the benchmark's kernels have stopped.
pub struct HostPinned {
    gpu: Gpu,
    ptr: NonNull<u8>,
    len: usize,
}

impl HostPinned {
    /// Allocates and zeroes `len` (> 0) bytes.
    pub fn new(gpu: &Gpu, len: usize) -> BenchResult<HostPinned> {
        assert!(len > 0, "an empty pinned buffer");
        let p = {
            let _ctx = gpu.bind()?;
            gpu.driver().cu_mem_alloc_host(len, 0)?
        };
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| BenchError::Check("cuMemHostAlloc returned a null pointer".into()))?;
        let mut buffer = HostPinned {
            gpu: gpu.clone(),
            ptr,
            len,
        };
        buffer.as_mut_slice().fill(0);
        Ok(buffer)
    }

    /// The first byte, for the driver's copy functions. Copies into it must have finished
    /// before the buffer is borrowed again (the benchmarks synchronise each copy).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes allocated and initialised in `new`, owned by `self`; the only other
        // writer is a copy started through `as_ptr`, which the benchmarks finish before they
        // borrow the buffer again.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostPinned {
    fn drop(&mut self) {
        let Ok(_ctx) = self.gpu.bind() else { return };
        // SAFETY: our allocation of this context; no copy into or out of it is in flight (each
        // was synchronised).
        let _ = unsafe { self.gpu.driver().cu_mem_free_host(self.ptr.as_ptr().cast()) };
    }
}

//! [`CopySource`]: pinned host memory from `cuMemHostAlloc` that the GPU *reads* by DMA after
//! the CPU has rewritten it, kept per [`Gpu`] and reused instead of freed.
//!
//! Why not [`PinnedBuffer`](crate::cuda_objects::PinnedBuffer)'s Vulkan host memory mapped through
//! VMM (which frees without waiting): measured on an H100 (driver 580), copies *from* such memory
//! see the bytes of their first copy again after the CPU rewrote them — nearly all of a rewritten
//! 4 MiB buffer came out stale in a later `cuMemcpyDtoDAsync`, with or without `clflush` on the CPU
//! side (figures: docs/RELIABILITY.md): the GPU keeps what it read. Copies into it, which the
//! staged reads use, are not affected. `cuMemHostAlloc` memory is read fresh on every copy, but
//! `cuMemFreeHost` waits for every running kernel; so these buffers are never freed while the
//! handle lives: a dropped buffer goes back to its [`Gpu`](crate::Gpu)'s cache for the next one of
//! its size, and the cache is freed with the last handle of the `Gpu`.
#![allow(unsafe_code)] // raw pinned host memory and its driver calls

use std::sync::Arc;

use crate::core::handle::{assert_send_sync, SendSyncPtr};
use crate::driver::cuda::{ContextGuard, CuContext, Driver};
use crate::error::{Error, Result};

/// Buffers a [`Gpu`](crate::Gpu) keeps for reuse: `(length, host pointer)`.
#[derive(Default)]
pub(crate) struct CopySourceCache(crate::core::sync::lock::Mutex<Vec<(usize, SendSyncPtr<u8>)>>);

impl CopySourceCache {
    /// A buffer of exactly `len` bytes from the cache, if one is there.
    fn take(&self, len: usize) -> Option<SendSyncPtr<u8>> {
        let mut cached = self.0.lock();
        let at = cached.iter().position(|&(n, _)| n == len)?;
        Some(cached.swap_remove(at).1)
    }

    fn put(&self, len: usize, ptr: SendSyncPtr<u8>) {
        self.0.lock().push((len, ptr));
    }

    /// The buffers kept now and their bytes (buffers in use are their users').
    pub(crate) fn held(&self) -> (u64, u64) {
        let cached = self.0.lock();
        (
            cached.len() as u64,
            cached.iter().map(|&(n, _)| n as u64).sum(),
        )
    }

    /// Frees every cached buffer (the owning handle is going away; `context` is still alive).
    pub(crate) fn free_all(&self, driver: &Driver, context: Option<CuContext>) {
        let cached = std::mem::take(&mut *self.0.lock());
        // Nothing to free, nothing to push: a borrowed context may be gone by now (its owner
        // destroyed it before dropping the last handle), and pushing it would be undefined.
        if cached.is_empty() {
            return;
        }
        let Some(context) = context else {
            return;
        };
        // SAFETY: the owner's context, alive until its release after this call.
        let Ok(_ctx) = (unsafe { ContextGuard::push(driver, context) }) else {
            return;
        };
        for (_, ptr) in cached {
            // SAFETY: allocated by `cuMemHostAlloc` in this context and no longer used by
            // anyone: a buffer enters the cache only once the copies reading it have run.
            let _ = unsafe { driver.cu_mem_free_host(ptr.get().cast()) };
        }
    }
}

/// `len` bytes of pinned host memory that copies read with `cuMemcpyHtoDAsync`; on drop it
/// returns to its cache (drop it only once the copies that read it have run, and while the
/// cache's [`Gpu`](crate::Gpu) lives: the cache is freed with it).
pub(crate) struct CopySource {
    cache: Arc<CopySourceCache>,
    ptr: SendSyncPtr<u8>,
    len: usize,
}
// `Send + Sync` by its fields, as the compiler checks here.
const _: () = assert_send_sync::<CopySource>();

impl CopySource {
    /// A buffer of `len` bytes: a cached one of that length, or a new `cuMemHostAlloc` in
    /// `context` (the cache owner's, current on this thread after the call as before it).
    ///
    /// # Safety
    /// - `context` is the live context of the handle that owns `cache`.
    pub(crate) unsafe fn new(
        driver: &Driver,
        context: CuContext,
        cache: &Arc<CopySourceCache>,
        len: usize,
    ) -> Result<CopySource> {
        let cache = Arc::clone(cache);
        if let Some(ptr) = cache.take(len) {
            return Ok(CopySource { cache, ptr, len });
        }
        // SAFETY: a live context (the caller's contract).
        let _ctx = unsafe { ContextGuard::push(driver, context) }?;
        let p = crate::driver::failpoint::inject("cuMemHostAlloc", || {
            crate::driver::cuda::injected_failure(driver, "cuMemHostAlloc")
        })
        .and_then(|()| driver.cu_mem_alloc_host(len, 0))?;
        if p.is_null() {
            return Err(Error::internal("cuMemHostAlloc returned a null pointer"));
        }
        Ok(CopySource {
            cache,
            ptr: SendSyncPtr::new(p.cast::<u8>()),
            len,
        })
    }

    /// The host address (pinned: copies read it by DMA).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.get()
    }
}

impl Drop for CopySource {
    fn drop(&mut self) {
        self.cache.put(self.len, self.ptr);
    }
}

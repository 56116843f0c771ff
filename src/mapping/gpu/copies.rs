//! [`Gpu`]'s copies through the copy engine: its own non-blocking copy stream, synchronous
//! `memcpy` and `memset`, staged reads into pageable memory, and the pinned buffers copies read
//! from.

use crate::core::handle::SendSyncPtr;
use crate::driver::cuda::{CuStream, CU_STREAM_NON_BLOCKING};
use crate::error::Result;
use crate::mapping::pinned::copy_sources::CopySource;

use super::Gpu;

impl Gpu {
    /// The library's own non-blocking stream for synchronous copies, made on first use; the
    /// context must be current.
    fn copy_stream(&self) -> Result<CuStream> {
        if let Some(s) = self.inner.copy_stream.get() {
            return Ok(s.get());
        }
        let _one_at_a_time = self.inner.context_init.lock();
        if let Some(s) = self.inner.copy_stream.get() {
            return Ok(s.get());
        }
        let s = self.driver().cu_stream_create(CU_STREAM_NON_BLOCKING)?;
        let _ = self.inner.copy_stream.set(SendSyncPtr::new(s));
        Ok(s)
    }

    /// Copies `dst.len()` bytes from device address `src` with the copy engine and returns when
    /// they have arrived. The copy runs on a stream of the library's own, so it waits for no
    /// other work (a kernel on the legacy stream included).
    ///
    /// # Safety
    /// - `[src, src + dst.len())` must be valid device memory reachable from this GPU's context.
    pub unsafe fn memcpy_dtoh(&self, dst: &mut [u8], src: u64) -> Result<()> {
        let _ctx = self.bind()?;
        let stream = self.copy_stream()?;
        // SAFETY: the caller guarantees the device range; `dst` is a valid host buffer, alive
        // until the stream is synchronised below; our stream, context current.
        unsafe {
            self.driver()
                .cu_memcpy_dtoh_async(dst.as_mut_ptr().cast(), src, dst.len(), stream)?;
            self.driver().cu_stream_synchronize(stream)
        }
    }

    /// Reads `dst.len()` bytes at device address `src` into `dst` (pageable memory) through pinned
    /// staging buffers: the copy engine fills some while CPU threads copy others out
    /// ([`crate::mapping::pinned::read_staging::pipeline`]). The fast path of
    /// [`Mapping::read`](crate::Mapping::read) for large reads.
    ///
    /// # Safety
    /// - `[src, src + dst.len())` must be valid device memory of this GPU's context.
    pub(crate) unsafe fn read_staged(&self, dst: &mut [u8], src: u64) -> Result<()> {
        let context = self.context()?;
        // SAFETY: the caller guarantees the device range; the context lives as long as
        // `self.inner`, which owns the cache (and clears it before releasing the context).
        unsafe {
            self.inner.read_staging.read(
                &self.inner.driver,
                context,
                self.vmm().map(|v| (v, self.vulkan())),
                src,
                dst,
            )
        }
    }

    /// Copies `src` to device address `dst` with the copy engine; when this returns the bytes
    /// are in device memory. Like [`Gpu::memcpy_dtoh`], it runs on a stream of the library's
    /// own and waits for nothing else.
    ///
    /// # Safety
    /// - `[dst, dst + src.len())` must be valid device memory reachable from this GPU's context.
    pub unsafe fn memcpy_htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        let _ctx = self.bind()?;
        let stream = self.copy_stream()?;
        // SAFETY: the caller guarantees the device range; `src` is a valid host buffer, alive
        // until the stream is synchronised below; our stream, context current.
        unsafe {
            self.driver()
                .cu_memcpy_htod_async(dst, src.as_ptr().cast(), src.len(), stream)?;
            self.driver().cu_stream_synchronize(stream)
        }
    }

    /// Sets `count` 32-bit words at `dst` to `value` (`cuMemsetD32Async` on the library's own
    /// stream); the words are set when this returns, and nothing else is waited for.
    ///
    /// # Safety
    /// - `[dst, dst + 4 * count)` must be valid device memory reachable from this GPU's context,
    ///   4-aligned.
    pub unsafe fn memset_d32(&self, dst: u64, value: u32, count: usize) -> Result<()> {
        let _ctx = self.bind()?;
        let stream = self.copy_stream()?;
        // SAFETY: the caller guarantees the range; our stream, context current.
        unsafe {
            self.driver()
                .cu_memset_d32_async(dst, value, count, stream)?;
            self.driver().cu_stream_synchronize(stream)
        }
    }

    /// `len` bytes of pinned host memory for copies to read from, reused from this handle's
    /// cache where one of that length was dropped ([`CopySource`]).
    pub(crate) fn copy_source(&self, len: usize) -> Result<CopySource> {
        let context = self.context()?;
        // SAFETY: our live context, and the cache is ours.
        unsafe { CopySource::new(self.driver(), context, &self.inner.copy_sources, len) }
    }
}

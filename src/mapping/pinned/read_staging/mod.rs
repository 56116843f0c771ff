//! The CUDA side of staged reads ([`pipeline`]): sets of pinned staging
//! buffers with a stream and one event per buffer, cached per [`Gpu`](crate::Gpu) and created on
//! the first large read.
//!
//! The buffers are pinned host memory allocated through Vulkan and mapped with VMM, filled by
//! device-to-device copies into their device address (about as fast as copies into `cuMemHostAlloc`
//! memory; figures: BENCHMARKS.md, 'Reads through the copy engine'), so that freeing a set never
//! waits for running kernels as `cuMemFreeHost` does. Where the device lacks VMM, `cuMemHostAlloc`
//! it is.

pub(crate) mod pipeline;

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::core::sync::lock::Mutex;

use crate::core::handle::SendSyncPtr;
use crate::driver::cuda::{
    ContextGuard, CuContext, Driver, CU_EVENT_DISABLE_TIMING, CU_STREAM_NON_BLOCKING,
};
use crate::driver::vulkan::VulkanContext;
use crate::error::{Error, Result};
use crate::mapping::pinned::read_staging::pipeline::{read_staged, StagingEngine};
use crate::mapping::vmm::{MappedMemory, VmmDevice};

/// Reads of at least this many bytes into pageable memory take the staged pipeline; shorter DMA
/// reads use one `cuMemcpyDtoH` (whose own staging is as good there, and needs no pinned memory
/// of ours).
pub const STAGED_READ_THRESHOLD: usize = 1 << 20;

/// Staging buffers per set: the copy engine works on up to this many chunks ahead of the CPU.
pub const STAGING_BUFFERS: usize = 4;

/// Bytes per staging buffer (the largest chunk): a set pins `STAGING_BUFFERS` times this.
pub const STAGING_BUFFER_BYTES: usize = 8 << 20;

/// Idle sets a GPU keeps for later reads; sets beyond it (from concurrent readers) are freed.
const IDLE_SETS: usize = 2;

/// A set's `STAGING_BUFFERS * STAGING_BUFFER_BYTES` bytes of pinned host memory.
enum StagingMemory {
    /// Vulkan host memory mapped with VMM: filled by device-to-device copies.
    Mapped(MappedMemory),
    /// `cuMemHostAlloc` memory (no VMM here): filled by device-to-host copies.
    Driver(SendSyncPtr<u8>),
}

impl StagingMemory {
    fn host(&self) -> *mut u8 {
        match self {
            StagingMemory::Mapped(m) => m.host_ptr(),
            StagingMemory::Driver(p) => p.get(),
        }
    }
}

/// Where a set's pinned memory comes from: VMM and Vulkan's host memory type, if the device
/// has both.
pub(crate) type HostMemorySource<'a> = Option<(&'a VmmDevice, &'a Arc<VulkanContext>)>;

/// One reader's pinned buffers, stream and events, all of one context.
struct StagingSet {
    driver: Arc<Driver>,
    /// The context everything below belongs to (pushed for every driver call).
    context: SendSyncPtr<c_void>,
    /// The buffers; `None` only once dropped.
    memory: Option<StagingMemory>,
    stream: SendSyncPtr<c_void>,
    events: Vec<SendSyncPtr<c_void>>,
    in_flight: [bool; STAGING_BUFFERS],
}

impl StagingSet {
    /// Creates a set in `context`, which must be current on this thread.
    fn new(
        driver: &Arc<Driver>,
        context: CuContext,
        source: HostMemorySource<'_>,
    ) -> Result<StagingSet> {
        let bytes = STAGING_BUFFERS * STAGING_BUFFER_BYTES;
        let memory = match source {
            Some((vmm, vulkan)) if vulkan.host_memory_type().is_some() => {
                StagingMemory::Mapped(MappedMemory::host(vmm, vulkan, bytes as u64)?)
            }
            _ => {
                let host = driver
                    .cu_mem_alloc_host(bytes, 0)
                    .map_err(crate::driver::cuda::out_of_memory(bytes as u64))?;
                let host = NonNull::new(host.cast::<u8>())
                    .ok_or_else(|| Error::internal("cuMemHostAlloc returned a null pointer"))?;
                StagingMemory::Driver(host.into())
            }
        };
        // From here on `Drop` frees whatever was made (it tolerates null handles).
        let mut set = StagingSet {
            driver: driver.clone(),
            context: SendSyncPtr::new(context),
            memory: Some(memory),
            stream: SendSyncPtr::new(std::ptr::null_mut()),
            events: Vec::with_capacity(STAGING_BUFFERS),
            in_flight: [false; STAGING_BUFFERS],
        };
        set.stream = SendSyncPtr::new(driver.cu_stream_create(CU_STREAM_NON_BLOCKING)?);
        for _ in 0..STAGING_BUFFERS {
            let event = driver.cu_event_create(CU_EVENT_DISABLE_TIMING)?;
            set.events.push(SendSyncPtr::new(event));
        }
        Ok(set)
    }

    fn memory(&self) -> Result<&StagingMemory> {
        self.memory
            .as_ref()
            .ok_or_else(|| Error::internal("staging set used after its memory went"))
    }

    fn check_buffer(&self, buf: usize, len: usize) -> Result<()> {
        if buf >= STAGING_BUFFERS || len > STAGING_BUFFER_BYTES {
            return Err(Error::internal(format!(
                "staging buffer {buf} of {STAGING_BUFFERS}, {len} bytes of {STAGING_BUFFER_BYTES}"
            )));
        }
        Ok(())
    }
}

/// Every method runs with the set's context current (the caller of [`StagingCache::read`]
/// binds it).
impl StagingEngine for StagingSet {
    fn buffers(&self) -> usize {
        STAGING_BUFFERS
    }

    fn buffer_len(&self) -> usize {
        STAGING_BUFFER_BYTES
    }

    fn start(&mut self, buf: usize, src: u64, len: usize) -> Result<()> {
        self.check_buffer(buf, len)?;
        if self.in_flight[buf] {
            return Err(Error::internal(format!("staging buffer {buf} is busy")));
        }
        let at = buf * STAGING_BUFFER_BYTES;
        // SAFETY: the destination lies inside our pinned allocation (checked above); no Rust
        // reference to this buffer's bytes exists while the copy is in flight (`staged` refuses
        // until `wait`); the caller guarantees `[src, src + len)` is live device memory of this
        // context; the stream is ours and the context current.
        unsafe {
            match self.memory()? {
                StagingMemory::Mapped(m) => self.driver.cu_memcpy_dtod_async(
                    m.device_ptr() + at as u64,
                    src,
                    len,
                    self.stream.get(),
                ),
                StagingMemory::Driver(p) => self.driver.cu_memcpy_dtoh_async(
                    p.get().add(at).cast(),
                    src,
                    len,
                    self.stream.get(),
                ),
            }
        }?;
        self.in_flight[buf] = true;
        // SAFETY: event and stream are ours, of the current context.
        unsafe {
            self.driver
                .cu_event_record(self.events[buf].get(), self.stream.get())
        }
    }

    fn wait(&mut self, buf: usize) -> Result<()> {
        self.check_buffer(buf, 0)?;
        if !self.in_flight[buf] {
            return Ok(());
        }
        // SAFETY: a live event of ours, recorded after the copy into `buf`.
        unsafe { self.driver.cu_event_synchronize(self.events[buf].get()) }?;
        self.in_flight[buf] = false;
        Ok(())
    }

    fn staged(&self, buf: usize, len: usize) -> Result<&[u8]> {
        self.check_buffer(buf, len)?;
        if self.in_flight[buf] {
            return Err(Error::internal(format!(
                "staging buffer {buf} read before its copy landed"
            )));
        }
        let host = self.memory()?.host();
        // SAFETY: inside our pinned allocation (checked above), initialised (a completed copy
        // or earlier contents: mapped driver memory, never uninitialised Rust memory), and no
        // copy into it is in flight, so nothing writes these bytes while the slice lives
        // (`&self`).
        Ok(unsafe { std::slice::from_raw_parts(host.add(buf * STAGING_BUFFER_BYTES), len) })
    }

    fn drain(&mut self) -> Result<()> {
        if self.in_flight.iter().any(|&f| f) {
            // SAFETY: our live stream, context current.
            unsafe { self.driver.cu_stream_synchronize(self.stream.get()) }?;
            self.in_flight = [false; STAGING_BUFFERS];
        }
        Ok(())
    }
}

impl Drop for StagingSet {
    fn drop(&mut self) {
        // SAFETY: the set's context outlives it (the `Gpu` that owns the cache frees its sets
        // before releasing its context, and a borrowed context outlives the `Gpu`).
        let _ctx = unsafe { ContextGuard::push(&self.driver, self.context.get()) };
        // Teardown of our own handles; nothing to report from a destructor. The stream is
        // synchronised first so no copy writes the pinned memory after it is freed.
        // SAFETY: every handle is ours and used by nothing else now.
        unsafe {
            if !self.stream.get().is_null() {
                let _ = self.driver.cu_stream_synchronize(self.stream.get());
            }
            for e in &self.events {
                let _ = self.driver.cu_event_destroy(e.get());
            }
            if !self.stream.get().is_null() {
                let _ = self.driver.cu_stream_destroy(self.stream.get());
            }
            // No copy of ours writes the memory any more (the stream is synchronised), and no
            // other GPU work knows it: free it now.
            if let Some(StagingMemory::Driver(p)) = self.memory.take() {
                let _ = self.driver.cu_mem_free_host(p.get().cast());
            }
        }
    }
}

/// A GPU's idle staging sets.
#[derive(Default)]
pub(crate) struct StagingCache {
    idle: Mutex<Vec<StagingSet>>,
}

impl StagingCache {
    /// Reads `dst.len()` bytes at device address `src` through a staging set of `context`
    /// (taken from the cache, or created), copying out with the global copy pool's threads.
    ///
    /// # Safety
    /// - `[src, src + dst.len())` must be live device memory accessible in `context`, which must
    ///   be the context of every set in this cache and stay alive while the cache holds sets.
    pub(crate) unsafe fn read(
        &self,
        driver: &Arc<Driver>,
        context: CuContext,
        source: HostMemorySource<'_>,
        src: u64,
        dst: &mut [u8],
    ) -> Result<()> {
        // SAFETY: the caller guarantees the context is alive.
        let _ctx = unsafe { ContextGuard::push(driver, context) }?;
        let popped = self.idle.lock().pop();
        let mut set = match popped {
            Some(set) => set,
            None => StagingSet::new(driver, context, source)?,
        };
        let result = read_staged(&mut set, src, dst, crate::copy::copy_host_default);
        let mut idle = self.idle.lock();
        if idle.len() < IDLE_SETS {
            idle.push(set);
        } else {
            drop(idle);
            drop(set); // outside the lock: frees pinned memory (never waits with VMM)
        }
        result
    }

    /// The idle sets kept now and their bytes of pinned memory (each also holds a stream and
    /// [`STAGING_BUFFERS`] events).
    pub(crate) fn held(&self) -> (u64, u64) {
        let n = self.idle.lock().len() as u64;
        (n, n * (STAGING_BUFFERS * STAGING_BUFFER_BYTES) as u64)
    }

    /// Frees every idle set (before the context they belong to goes).
    pub(crate) fn clear(&self) {
        let sets = std::mem::take(&mut *self.idle.lock());
        drop(sets);
    }
}

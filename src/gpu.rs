//! [`Gpu`]: the handle everything else hangs from — one CUDA device with its matching Vulkan device.

use std::ptr;
use std::sync::Arc;

use crate::cuda::{ContextGuard, CuContext, CuDevice, Driver};
use crate::error::{Error, Result};
use crate::memory::RawMemory;
use crate::vulkan::{format_uuid, DeviceSelector, MemoryOptions, VulkanContext};

/// How to open a [`Gpu`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenOptions {
    memory: MemoryOptions,
}

impl OpenOptions {
    /// Default options: prefer coherent memory, use the non-coherent path only where needed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fail with [`Error::NoSuitableMemoryType`] unless coherent BAR memory exists.
    pub fn require_coherent(mut self, yes: bool) -> Self {
        self.memory.require_coherent = yes;
        self
    }

    /// Issue every flush and invalidate even on coherent memory (exercises the non-coherent path).
    pub fn force_non_coherent(mut self, yes: bool) -> Self {
        self.memory.force_non_coherent = yes;
        self
    }

    /// The memory options these open options carry.
    pub fn memory_options(&self) -> MemoryOptions {
        self.memory
    }
}

struct GpuInner {
    driver: Arc<Driver>,
    vulkan: Arc<VulkanContext>,
    context: CuContext,
    device: CuDevice,
    /// True when we hold a reference on the device's primary context (released on drop).
    retained_primary: bool,
    name: String,
    uuid: [u8; 16],
}

// SAFETY: a CUcontext is a process-wide handle usable from any thread (we push it around each
// use); the other fields are Send + Sync themselves.
unsafe impl Send for GpuInner {}
// SAFETY: as above; no method mutates shared state without the driver's own synchronisation.
unsafe impl Sync for GpuInner {}

impl Drop for GpuInner {
    fn drop(&mut self) {
        if self.retained_primary {
            // SAFETY: we retained the primary context exactly once in `open`; every allocation
            // holds a `Gpu`, so none is alive any more.
            unsafe { (self.driver.cu_device_primary_ctx_release)(self.device) };
        }
    }
}

/// A CUDA device opened for BAR mappings: the CUDA context plus the Vulkan device with the same
/// UUID. Cheap to clone (an `Arc`), `Send + Sync`: share one between all threads.
///
/// ```no_run
/// use vkgdr::Mapping;
/// # fn main() -> vkgdr::Result<()> {
/// let gpu = vkgdr::Gpu::open(0)?;
/// let mut mem = gpu.alloc(1 << 20)?;
/// mem.write(0, b"hello, GPU")?;
/// println!("device pointer {:#x}", mem.device_ptr());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Gpu {
    inner: Arc<GpuInner>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("name", &self.inner.name)
            .field("uuid", &format_uuid(&self.inner.uuid))
            .field("vulkan", &self.inner.vulkan)
            .finish()
    }
}

impl Gpu {
    /// Opens CUDA device `ordinal` (retaining its primary context) with default options.
    pub fn open(ordinal: i32) -> Result<Gpu> {
        Self::open_with(ordinal, OpenOptions::default())
    }

    /// Opens CUDA device `ordinal` with `options`.
    pub fn open_with(ordinal: i32, options: OpenOptions) -> Result<Gpu> {
        if ordinal < 0 {
            return Err(Error::invalid(format!(
                "device ordinal {ordinal} is negative"
            )));
        }
        let driver = Driver::get()?;
        let count = driver.device_count()?;
        if ordinal >= count {
            return Err(Error::NoMatchingDevice(format!(
                "CUDA device {ordinal} requested, {count} present"
            )));
        }
        let device = driver.device(ordinal)?;
        let mut context: CuContext = ptr::null_mut();
        // SAFETY: `device` is valid; out-pointer valid. Balanced by the release in Drop.
        driver.check("cuDevicePrimaryCtxRetain", unsafe {
            (driver.cu_device_primary_ctx_retain)(&mut context, device)
        })?;
        Self::finish(driver, context, device, true, options)
    }

    /// Opens the device of the calling thread's current CUDA context, which must be that device's
    /// primary context (what the CUDA runtime API uses). The primary context is retained, so the
    /// handle stays valid even if the caller later releases it.
    ///
    /// For a context created with `cuCtxCreate`, use [`Gpu::open_current_context_unchecked`].
    pub fn open_current_context(options: OpenOptions) -> Result<Gpu> {
        let driver = Driver::get()?;
        let (current, device) = current_context(&driver)?;
        let mut primary: CuContext = ptr::null_mut();
        // SAFETY: valid device and out-pointer; balanced by Drop or the release below.
        driver.check("cuDevicePrimaryCtxRetain", unsafe {
            (driver.cu_device_primary_ctx_retain)(&mut primary, device)
        })?;
        if primary != current {
            // SAFETY: balances the retain just above.
            unsafe { (driver.cu_device_primary_ctx_release)(device) };
            return Err(Error::invalid(
                "the current CUDA context is not the device's primary context; \
                 use Gpu::open_current_context_unchecked",
            ));
        }
        Self::finish(driver, current, device, true, options)
    }

    /// Opens the device of the calling thread's current CUDA context, whatever context that is.
    ///
    /// # Safety
    /// - The current context must stay alive (not destroyed with `cuCtxDestroy`) for as long as this
    ///   `Gpu`, any clone of it, or any memory allocated through it exists.
    pub unsafe fn open_current_context_unchecked(options: OpenOptions) -> Result<Gpu> {
        let driver = Driver::get()?;
        let (current, device) = current_context(&driver)?;
        Self::finish(driver, current, device, false, options)
    }

    fn finish(
        driver: Arc<Driver>,
        context: CuContext,
        device: CuDevice,
        retained_primary: bool,
        options: OpenOptions,
    ) -> Result<Gpu> {
        // Build the inner first so an error below still releases the primary context.
        let make = |vulkan| GpuInner {
            driver: driver.clone(),
            vulkan,
            context,
            device,
            retained_primary,
            name: String::new(),
            uuid: [0; 16],
        };
        let release_on_error = |e: Error| {
            if retained_primary {
                // SAFETY: balances the retain done by the caller; nothing uses the context.
                unsafe { (driver.cu_device_primary_ctx_release)(device) };
            }
            e
        };
        let uuid = driver.device_uuid(device).map_err(release_on_error)?;
        let name = driver.device_name(device).map_err(release_on_error)?;
        let vulkan =
            VulkanContext::new(DeviceSelector::Uuid(uuid), options.memory).map_err(|e| {
                release_on_error(match e {
                    Error::NoMatchingDevice(msg) => Error::NoMatchingDevice(format!(
                        "CUDA device {name} [{}]: {msg}",
                        format_uuid(&uuid)
                    )),
                    e => e,
                })
            })?;
        let mut inner = make(vulkan);
        inner.name = name;
        inner.uuid = uuid;
        Ok(Gpu {
            inner: Arc::new(inner),
        })
    }

    /// Allocates `size` bytes (rounded up to 4 KiB) of BAR-mapped memory: a Vulkan export, a CUDA
    /// import, a host mapping. Costs hundreds of µs; use a [`Pool`](crate::Pool) for many small
    /// buffers.
    pub fn alloc(&self, size: u64) -> Result<RawMemory> {
        RawMemory::new(self, size)
    }

    /// Makes this GPU's context current on the calling thread until the guard drops.
    pub fn bind(&self) -> Result<ContextGuard<'_>> {
        // SAFETY: the context lives as long as `self.inner` (retained primary, or the caller's
        // promise for unchecked opens), which outlives the guard's borrow.
        unsafe { ContextGuard::push(&self.inner.driver, self.inner.context) }
    }

    /// The CUDA driver table.
    pub fn driver(&self) -> &Arc<Driver> {
        &self.inner.driver
    }

    /// The Vulkan side.
    pub fn vulkan(&self) -> &Arc<VulkanContext> {
        &self.inner.vulkan
    }

    /// The device's name (from CUDA).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The device UUID shared by CUDA and Vulkan.
    pub fn uuid(&self) -> [u8; 16] {
        self.inner.uuid
    }

    /// The raw `CUdevice`.
    pub fn cu_device(&self) -> CuDevice {
        self.inner.device
    }

    /// The raw `CUcontext`.
    pub fn cu_context(&self) -> CuContext {
        self.inner.context
    }

    /// Whether flushes/invalidates are really issued (non-coherent memory or forced).
    pub fn is_non_coherent(&self) -> bool {
        self.inner.vulkan.is_non_coherent()
    }

    /// `cuMemGetInfo`: (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(u64, u64)> {
        let _g = self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: a context is current (guard); valid out-pointers.
        self.driver().check("cuMemGetInfo_v2", unsafe {
            (self.driver().cu_mem_get_info)(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    /// Whether two handles share the same underlying open device.
    pub fn same_as(&self, other: &Gpu) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

fn current_context(driver: &Driver) -> Result<(CuContext, CuDevice)> {
    let mut ctx: CuContext = ptr::null_mut();
    // SAFETY: valid out-pointer.
    driver.check("cuCtxGetCurrent", unsafe {
        (driver.cu_ctx_get_current)(&mut ctx)
    })?;
    if ctx.is_null() {
        return Err(Error::invalid("no CUDA context is current on this thread"));
    }
    let mut device = 0;
    // SAFETY: a context is current; valid out-pointer.
    driver.check("cuCtxGetDevice", unsafe {
        (driver.cu_ctx_get_device)(&mut device)
    })?;
    Ok((ctx, device))
}

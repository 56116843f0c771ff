//! [`Gpu`]: the handle everything else hangs from — one CUDA device with its matching Vulkan
//! device. Its copies through the copy engine are in `copies.rs`.

mod copies;

use crate::mapping::pinned::copy_sources::CopySourceCache;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use crate::core::sync::lock::Mutex;

use crate::core::handle::{assert_send_sync, SendSyncPtr};
use crate::driver::cuda::{ContextGuard, CuContext, CuDevice, CuStream, Driver};
use crate::driver::uuid::{format_uuid, parse_uuid};
use crate::driver::vulkan::{DeviceSelector, MemoryOptions, VulkanContext};
use crate::error::{Error, InvalidArgument, Result};
use crate::mapping::carve::Carver;
use crate::mapping::release::{
    EventFence, EventFenceCount, Fence, FenceWords, ReleaseAccount, ReleaseKey, ReleaseQueue,
    ReleaseTimes,
};
use crate::mapping::retained::{names, Retained, RetainedItem, RetainedKind};
use crate::mapping::spare::{SpareLimits, Spares};
use crate::mapping::vmm::{MappedMemory, VmmDevice};

/// How long a handle that ran out of memory making its completion words waits before it tries
/// again (its releases record events meanwhile).
const FENCE_WORDS_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// How to open a [`Gpu`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenOptions {
    memory: MemoryOptions,
    external_memory_import: bool,
    spare_limits: Option<SpareLimits>,
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

    /// Map memory into CUDA with `cuImportExternalMemory`, as vkgdr 0.1 does, instead of CUDA
    /// VMM: what the library falls back to where the device or driver lacks VMM. Its frees
    /// (`cuMemFree`) wait for every running kernel of the device; for comparisons and tests of
    /// that path.
    pub fn external_memory_import(mut self, yes: bool) -> Self {
        self.external_memory_import = yes;
        self
    }

    /// How much of the mappings freed raw allocations leave the handle keeps for the next
    /// allocation of their size ([`SpareLimits`]); by default [`SpareLimits::for_heap`] of the
    /// device's BAR heap. [`SpareLimits::NONE`] gives every such free back to the driver at once.
    pub fn spare_limits(mut self, limits: SpareLimits) -> Self {
        self.spare_limits = Some(limits);
        self
    }

    /// The memory options these open options carry.
    pub fn memory_options(&self) -> MemoryOptions {
        self.memory
    }
}

/// `Send + Sync` by its fields; no method mutates shared state without the driver's own
/// synchronisation.
struct GpuInner {
    driver: Arc<Driver>,
    vulkan: Arc<VulkanContext>,
    /// The context this handle works in. Set at open, or — for [`Gpu::open_cu_device`] — the
    /// device's primary context, retained the first time the handle needs one. A `CUcontext` is
    /// a process-wide handle usable from any thread (we push it around each use).
    context: OnceLock<SendSyncPtr<c_void>>,
    /// Serialises the lazy retain so the primary context is retained at most once.
    context_init: Mutex<()>,
    device: CuDevice,
    /// True when we hold a reference on the device's primary context (released on drop).
    retained_primary: AtomicBool,
    name: String,
    uuid: [u8; 16],
    /// Pinned staging buffers of large reads into pageable memory, made on the first one.
    read_staging: crate::mapping::pinned::read_staging::StagingCache,
    /// Whoever owns a borrowed `context` (a cudarc `CudaContext`), kept alive as long as this
    /// handle, so the context outlives every allocation made through it.
    _context_owner: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// Live raw allocations by device address: size and label (for [`Gpu::allocations`]).
    allocations: Mutex<BTreeMap<u64, AllocationReport>>,
    /// CUDA VMM on this device: how memory is mapped, so that freeing it never waits (`Err`:
    /// why not, and memory is imported with `cuImportExternalMemory` instead).
    vmm: std::result::Result<VmmDevice, String>,
    /// Completion words for release fences, made with the first release (`None` inside: not
    /// available here, and releases record events instead).
    fence_words: OnceLock<Option<Arc<FenceWords>>>,
    /// When to try making the completion words again after running out of memory (`None`:
    /// no failure yet); serialises the attempts.
    fence_words_retry: Mutex<Option<std::time::Instant>>,
    /// The event fences this handle's releases made, where no completion word could be had.
    event_fences: EventFenceCount,
    /// The releases of this handle's memory: those still waiting for GPU work, and their times.
    releases: ReleaseAccount,
    /// The shared granules small raw allocations are carved from, made with the first one.
    carver: Mutex<Option<Arc<Carver>>>,
    /// Mappings freed raw allocations left for the next allocation of their size.
    spares: Arc<Spares<MappedMemory>>,
    /// A non-blocking stream of the library's own for synchronous copies: the legacy stream
    /// would queue them behind a user's kernel there.
    copy_stream: OnceLock<SendSyncPtr<c_void>>,
    /// `cuMemHostAlloc` buffers that copies read from, kept for reuse (freeing one would wait
    /// for running kernels).
    copy_sources: Arc<CopySourceCache>,
}

/// One live raw allocation of a [`Gpu`] ([`Gpu::allocations`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocationReport {
    /// Its device address.
    pub device_ptr: u64,
    /// Its size as asked for.
    pub size: u64,
    /// Its label ([`RawMemory::set_label`](crate::RawMemory::set_label)); the library labels the
    /// allocations it makes for pool chunks and rings.
    pub label: Option<Arc<str>>,
}

impl Drop for GpuInner {
    fn drop(&mut self) {
        // The staging buffers and the copy stream belong to the context: free them while it is
        // alive.
        self.read_staging.clear();
        self.copy_sources
            .free_all(&self.driver, self.context.get().map(|c| c.get()));
        if let (Some(stream), Some(context)) = (self.copy_stream.get(), self.context.get()) {
            // SAFETY: the context is alive until the release below; the stream is ours, idle
            // after the last synchronous copy, and destroying one never waits.
            if let Ok(_ctx) = unsafe { ContextGuard::push(&self.driver, context.get()) } {
                // SAFETY: as above.
                let _ = unsafe { self.driver.cu_stream_destroy(stream.get()) };
            }
        }
        if self.retained_primary.load(Ordering::Acquire) {
            // SAFETY: we retained the primary context exactly once in `open`; every allocation
            // holds a `Gpu`, so none is alive any more.
            let _ = unsafe { self.driver.cu_device_primary_ctx_release(self.device) };
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
// `Send + Sync` by its fields, as the compiler checks here.
const _: () = assert_send_sync::<Gpu>();

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
    ///
    /// An ordinal the driver does not know (negative, or not below the device count) is the
    /// driver's own answer: [`Error::Cuda`] from `cuDeviceGet` with `CUDA_ERROR_INVALID_DEVICE`.
    pub fn open_with(ordinal: i32, options: OpenOptions) -> Result<Gpu> {
        let driver = Driver::get()?;
        let device = driver.device(ordinal)?;
        let gpu = Self::finish(driver, None, device, options, None)?;
        gpu.context()?;
        Ok(gpu)
    }

    /// Opens the CUDA device with this UUID (as `nvidia-smi -L` prints it, `GPU-…`, or as
    /// [`format_uuid`] writes it) with default options: the same device whatever its ordinal,
    /// which `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER` can change.
    ///
    /// A text that is no UUID is [`Error::InvalidArgument`]; a UUID no CUDA device has is
    /// [`Error::NoMatchingDevice`] listing the UUIDs present.
    pub fn open_uuid(uuid: &str) -> Result<Gpu> {
        Self::open_uuid_with(uuid, OpenOptions::default())
    }

    /// Opens the CUDA device with this UUID with `options` (see [`Gpu::open_uuid`]).
    pub fn open_uuid_with(uuid: &str, options: OpenOptions) -> Result<Gpu> {
        let want = parse_uuid(uuid)?;
        let driver = Driver::get()?;
        let mut present = Vec::new();
        for ordinal in 0..driver.device_count()? {
            let device = driver.device(ordinal)?;
            let have = driver.device_uuid(device)?;
            if have == want {
                let gpu = Self::finish(driver, None, device, options, None)?;
                gpu.context()?;
                return Ok(gpu);
            }
            present.push(format!("[{ordinal}] GPU-{}", format_uuid(&have)));
        }
        Err(Error::NoMatchingDevice(format!(
            "no CUDA device with UUID GPU-{}; present: {}",
            format_uuid(&want),
            if present.is_empty() {
                "none".to_string()
            } else {
                present.join(", ")
            }
        )))
    }

    /// Opens the device behind a `CUdevice` handle without creating or retaining any CUDA context
    /// yet: the device's primary context is retained the first time this handle needs a context
    /// of its own (a pool chunk, a ring, a copy, [`Gpu::bind`]). Allocations made with
    /// [`Gpu::alloc_in_current_context`] never need it, which is what vkgdr 0.1's `vkgdr_open`
    /// does: a program that works in a context of its own (PyCUDA's `make_default_context`) gets
    /// no second context on the GPU.
    ///
    /// An invalid handle is [`Error::Cuda`] with `CUDA_ERROR_INVALID_DEVICE`.
    pub fn open_cu_device(device: CuDevice, options: OpenOptions) -> Result<Gpu> {
        Self::finish(Driver::get()?, None, device, options, None)
    }

    /// Opens the device of the calling thread's current CUDA context, which must be that device's
    /// primary context (what the CUDA runtime API uses). The primary context is retained, so the
    /// handle stays valid even if the caller later releases it.
    ///
    /// For a context created with `cuCtxCreate`, use [`Gpu::open_current_context_unchecked`].
    ///
    /// With no context current this is the driver's answer, [`Error::Cuda`] from `cuCtxGetDevice`
    /// with `CUDA_ERROR_INVALID_CONTEXT`.
    pub fn open_current_context(options: OpenOptions) -> Result<Gpu> {
        let driver = Driver::get()?;
        let (current, device) = current_context(&driver)?;
        let gpu = Self::finish(driver, None, device, options, None)?;
        if gpu.context()? != current {
            return Err(InvalidArgument::CurrentContextNotPrimary.into());
        }
        Ok(gpu)
    }

    /// Opens the device of the calling thread's current CUDA context, whatever context that is.
    ///
    /// # Safety
    /// - The current context must stay alive (not destroyed with `cuCtxDestroy`) for as long as
    ///   this `Gpu`, any clone of it, or any memory allocated through it exists.
    pub unsafe fn open_current_context_unchecked(options: OpenOptions) -> Result<Gpu> {
        let driver = Driver::get()?;
        let (current, device) = current_context(&driver)?;
        Self::finish(driver, Some(current), device, options, None)
    }

    /// Opens `device` in `context`, a context that `owner` keeps alive: the handle holds `owner`
    /// until its last clone and allocation are gone (cudarc interop: `owner` is the
    /// `Arc<CudaContext>`). Shares the context; creates and retains none.
    ///
    /// # Safety
    /// - `context` must be a live CUDA context of `device` for as long as `owner` is alive.
    #[cfg_attr(not(feature = "cudarc"), allow(dead_code))]
    pub(crate) unsafe fn open_owned_context(
        context: CuContext,
        device: CuDevice,
        options: OpenOptions,
        owner: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<Gpu> {
        Self::finish(Driver::get()?, Some(context), device, options, Some(owner))
    }

    /// Matches the Vulkan device by UUID and builds the handle. `context` is a borrowed context
    /// (never released), or `None` for the device's primary context, retained on first use.
    fn finish(
        driver: Arc<Driver>,
        context: Option<CuContext>,
        device: CuDevice,
        options: OpenOptions,
        context_owner: Option<Arc<dyn std::any::Any + Send + Sync>>,
    ) -> Result<Gpu> {
        let uuid = driver.device_uuid(device)?;
        let name = driver.device_name(device)?;
        let vulkan = VulkanContext::new(DeviceSelector::Uuid(uuid), options.memory).map_err(
            |e| match e {
                Error::NoMatchingDevice(msg) => Error::NoMatchingDevice(format!(
                    "CUDA device {name} [{}]: {msg}",
                    format_uuid(&uuid)
                )),
                e => e,
            },
        )?;
        let spare_limits = options.spare_limits.unwrap_or_else(|| {
            SpareLimits::for_heap(vulkan.device_info().heap_size(vulkan.memory_type()))
        });
        let cell = OnceLock::new();
        if let Some(c) = context {
            let _ = cell.set(SendSyncPtr::new(c));
        }
        let vmm = if options.external_memory_import {
            Err("external memory import was asked for".to_string())
        } else {
            VmmDevice::new(&driver, device).map_err(|e| e.to_string())
        };
        Ok(Gpu {
            inner: Arc::new(GpuInner {
                driver,
                vulkan,
                context: cell,
                context_init: Mutex::new(()),
                device,
                retained_primary: AtomicBool::new(false),
                name,
                uuid,
                read_staging: Default::default(),
                copy_sources: Default::default(),
                _context_owner: context_owner,
                allocations: Mutex::new(BTreeMap::new()),
                vmm,
                fence_words: OnceLock::new(),
                fence_words_retry: Mutex::new(None),
                event_fences: EventFenceCount::default(),
                releases: ReleaseAccount::default(),
                carver: Mutex::new(None),
                spares: Arc::new(Spares::new(spare_limits)),
                copy_stream: OnceLock::new(),
            }),
        })
    }

    /// The context this handle works in, retaining the device's primary context on first use
    /// for handles from [`Gpu::open_cu_device`].
    fn context(&self) -> Result<CuContext> {
        if let Some(c) = self.inner.context.get() {
            return Ok(c.get());
        }
        let _one_at_a_time = self.inner.context_init.lock();
        if let Some(c) = self.inner.context.get() {
            return Ok(c.get());
        }
        // Balanced by the release in `GpuInner::drop`, which `retained_primary` arms.
        let primary = self
            .inner
            .driver
            .cu_device_primary_ctx_retain(self.inner.device)?;
        self.inner.retained_primary.store(true, Ordering::Release);
        let _ = self.inner.context.set(SendSyncPtr::new(primary));
        Ok(primary)
    }

    /// Makes this GPU's context current on the calling thread until the guard drops.
    pub fn bind(&self) -> Result<ContextGuard<'_>> {
        let context = self.context()?;
        // SAFETY: the context lives as long as `self.inner` (retained primary, or the caller's
        // promise for unchecked opens), which outlives the guard's borrow.
        unsafe { ContextGuard::push(&self.inner.driver, context) }
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

    /// The raw `CUcontext` this handle works in (for a handle from [`Gpu::open_cu_device`], the
    /// device's primary context, retained by this call if it was not yet).
    pub fn cu_context(&self) -> Result<CuContext> {
        self.context()
    }

    /// Whether flushes/invalidates are really issued (non-coherent memory or forced).
    pub fn is_non_coherent(&self) -> bool {
        self.inner.vulkan.is_non_coherent()
    }

    /// `cuMemGetInfo`: (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(u64, u64)> {
        let _g = self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: a context is current (guard); two valid out-pointers.
        unsafe { self.driver().cu_mem_get_info(&mut free, &mut total) }?;
        Ok((free as u64, total as u64))
    }

    /// Waits for all work in the context: a persistent kernel's too, so this is the one call
    /// that does wait for running kernels (by request).
    pub fn synchronize(&self) -> Result<()> {
        let _ctx = self.bind()?;
        self.driver().cu_ctx_synchronize()
    }

    /// Every live raw allocation made through this handle (and its clones), by device address:
    /// [`Gpu::alloc`]s, pool chunks over it, rings' memory. A snapshot; takes a lock.
    pub fn allocations(&self) -> Vec<AllocationReport> {
        self.inner.allocations.lock().values().cloned().collect()
    }

    pub(crate) fn register_allocation(&self, device_ptr: u64, size: u64) {
        let entry = AllocationReport {
            device_ptr,
            size,
            label: None,
        };
        self.inner.allocations.lock().insert(device_ptr, entry);
    }

    pub(crate) fn label_allocation(&self, device_ptr: u64, label: Option<Arc<str>>) {
        if let Some(entry) = self.inner.allocations.lock().get_mut(&device_ptr) {
            entry.label = label;
        }
    }

    pub(crate) fn unregister_allocation(&self, device_ptr: u64) {
        self.inner.allocations.lock().remove(&device_ptr);
    }

    /// Whether two handles share the same underlying open device.
    pub fn same_as(&self, other: &Gpu) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The device's CUDA ordinal (what VMM access descriptors and `cuDeviceGet` name it by).
    pub fn ordinal(&self) -> Result<i32> {
        match self.vmm() {
            Some(v) => Ok(v.ordinal()),
            None => crate::mapping::vmm::ordinal_of(self.driver(), self.inner.device),
        }
    }

    /// Whether kernels on this device can reach `peer`'s memory at all: `cuDeviceCanAccessPeer`,
    /// a peer-to-peer path between the two (NVLink, or PCIe where the platform allows it); `true`
    /// for the same device. What it takes for kernels here to use memory of `peer` through
    /// vkgdr: [`RawMemory::grant_peer_access`](crate::RawMemory::grant_peer_access).
    pub fn can_access_peer(&self, peer: &Gpu) -> Result<bool> {
        if self.inner.device == peer.inner.device {
            return Ok(true);
        }
        self.driver()
            .can_access_peer(self.inner.device, peer.inner.device)
    }

    /// For a grant of this device's memory to `peer`: `None` for the same device (it has access
    /// already), else `peer`'s ordinal, or [`Error::Unsupported`] saying that `peer` cannot reach
    /// this device's memory.
    pub(crate) fn peer_ordinal(&self, peer: &Gpu) -> Result<Option<i32>> {
        if self.inner.device == peer.inner.device {
            return Ok(None);
        }
        let (mine, theirs) = (self.ordinal()?, peer.ordinal()?);
        if !peer.can_access_peer(self)? {
            return Err(Error::Unsupported(format!(
                "{} (CUDA device {theirs}) cannot access the memory of {} (CUDA device {mine}): \
                 cuDeviceCanAccessPeer({theirs}, {mine}) = 0, no peer-to-peer path between them",
                peer.name(),
                self.name()
            )));
        }
        Ok(Some(theirs))
    }

    /// Whether memory is mapped into CUDA through VMM (every free then returns at once), or,
    /// where the device or driver lacks it (or [`OpenOptions::external_memory_import`] asked
    /// for it), imported with `cuImportExternalMemory`, whose frees wait for running kernels.
    /// `Err` says why VMM is not used.
    pub fn vmm_status(&self) -> std::result::Result<u64, &str> {
        match &self.inner.vmm {
            Ok(v) => Ok(v.granularity()),
            Err(why) => Err(why),
        }
    }

    /// The device's VMM facts, where memory is mapped through VMM.
    pub(crate) fn vmm(&self) -> Option<&VmmDevice> {
        self.inner.vmm.as_ref().ok()
    }

    /// The shared granules small raw allocations are carved from.
    pub(crate) fn carver(&self) -> Result<Arc<Carver>> {
        let vmm = self
            .vmm()
            .ok_or_else(|| Error::internal("carving needs VMM"))?;
        let mut carver = self.inner.carver.lock();
        match &*carver {
            Some(c) => Ok(c.clone()),
            None => {
                let c = Carver::new(vmm.clone(), self.vulkan().clone())?;
                *carver = Some(c.clone());
                Ok(c)
            }
        }
    }

    /// Mappings freed raw allocations left for the next allocation of their size.
    pub(crate) fn spares(&self) -> &Arc<Spares<MappedMemory>> {
        &self.inner.spares
    }

    /// How much of the mappings freed raw allocations leave this handle keeps for the next
    /// allocation of their size: the largest and the bytes in all ([`SpareLimits`], set by
    /// [`OpenOptions::spare_limits`] and [`Gpu::set_spare_limits`]).
    ///
    /// ```no_run
    /// # fn main() -> vkgdr::Result<()> {
    /// let gpu = vkgdr::Gpu::open(0)?;
    /// let vkgdr::SpareLimits { each, total } = gpu.spare_limits();
    /// println!("frees of up to {} MiB are kept, {} MiB in all", each >> 20, total >> 20);
    /// # Ok(()) }
    /// ```
    pub fn spare_limits(&self) -> SpareLimits {
        self.inner.spares.limits()
    }

    /// Keeps the mappings freed raw allocations leave within `limits` from now on, for this
    /// handle and its clones: those kept beyond them (larger than `limits.each`, then the oldest
    /// until the total is within `limits.total`) go back to the driver now, and returns how many.
    /// [`SpareLimits::NONE`] keeps none; a larger limit keeps larger frames. An allocation made
    /// while the limit was lower maps memory that goes back to the driver when freed.
    ///
    /// ```no_run
    /// # fn main() -> vkgdr::Result<()> {
    /// let gpu = vkgdr::Gpu::open(0)?;
    /// // Frames of 512 MiB allocated and freed in a loop: keep two.
    /// gpu.set_spare_limits(vkgdr::SpareLimits { each: 512 << 20, total: 1 << 30 });
    /// # Ok(()) }
    /// ```
    pub fn set_spare_limits(&self, limits: SpareLimits) -> usize {
        let out = self.inner.spares.set_limits(limits);
        out.len()
    }

    /// Gives back to the driver what this handle keeps for later allocations: the empty shared
    /// granule small raw allocations are carved from, and the mappings freed raw allocations left
    /// for the next allocation of their size (within [`Gpu::spare_limits`]). Returns how many
    /// granules and mappings it released.
    ///
    /// ```no_run
    /// # fn main() -> vkgdr::Result<()> {
    /// let gpu = vkgdr::Gpu::open(0)?;
    /// drop(gpu.alloc(2 << 20)?); // its mapping is kept for the next 2 MiB allocation
    /// assert!(gpu.wait_for_releases(std::time::Duration::from_secs(1)));
    /// assert_eq!(gpu.trim(), 1); // ... and goes back to the driver now
    /// # Ok(()) }
    /// ```
    pub fn trim(&self) -> usize {
        let carver = self.inner.carver.lock().clone();
        let spares = self.inner.spares.drain();
        carver.map_or(0, |c| c.trim()) + spares.len()
    }

    /// What this handle (and its clones) holds now, item by item ([`Retained`]): its live raw
    /// allocations, the caches it keeps for later allocations and copies (carved granules,
    /// staged-read sets, host staging buffers), the objects it made on first use (completion
    /// words, its copy stream), the releases still waiting and the event fences alive. A
    /// snapshot; takes a few locks. What the driver keeps for the process is not in it: compare
    /// two reports with the device's figures to tell the two apart.
    pub fn retained(&self) -> Retained {
        let item = |name, kind, (count, bytes): (u64, u64)| RetainedItem {
            name,
            kind,
            count,
            bytes,
        };
        let raw = {
            let allocations = self.inner.allocations.lock();
            (
                allocations.len() as u64,
                allocations.values().map(|a| a.size).sum(),
            )
        };
        let carved = self
            .inner
            .carver
            .lock()
            .clone()
            .map_or((0, 0), |c| c.held());
        let spares = self.inner.spares.held();
        let words = match self.inner.fence_words.get() {
            Some(Some(w)) => (1, w.size()),
            _ => (0, 0),
        };
        let copy_stream = (u64::from(self.inner.copy_stream.get().is_some()), 0);
        Retained {
            items: vec![
                item(names::RAW_ALLOCATIONS, RetainedKind::Bar, raw),
                item(names::CARVED_GRANULES, RetainedKind::Bar, carved),
                item(names::SPARE_MAPPINGS, RetainedKind::Bar, spares),
                item(names::COMPLETION_WORDS, RetainedKind::Host, words),
                item(names::COPY_STREAM, RetainedKind::DriverObjects, copy_stream),
                item(
                    names::STAGED_READ_SETS,
                    RetainedKind::Host,
                    self.inner.read_staging.held(),
                ),
                item(
                    names::HOST_STAGING_BUFFERS,
                    RetainedKind::Host,
                    self.inner.copy_sources.held(),
                ),
                item(
                    names::RELEASES_WAITING,
                    RetainedKind::Releases,
                    (self.pending_releases() as u64, 0),
                ),
                item(
                    names::EVENT_FENCES,
                    RetainedKind::DriverObjects,
                    (self.inner.event_fences.alive() as u64, 0),
                ),
            ],
            event_fences_made: self.inner.event_fences.made(),
            event_fences_peak: self.inner.event_fences.peak() as u64,
        }
    }

    /// Releases of memory allocated through this handle (and its clones) that still wait for GPU
    /// work queued before them. That memory still counts as in use.
    pub fn pending_releases(&self) -> usize {
        self.inner.releases.get()
    }

    /// How the releases of this handle's memory went: those waiting now, and the slowest so
    /// far ([`ReleaseTimes`]: what keeps a release waiting, or a drop that waits).
    pub fn release_times(&self) -> ReleaseTimes {
        ReleaseQueue::global().times(&self.inner.releases)
    }

    /// Waits until every release of this handle's memory has happened, up to `timeout`; returns
    /// whether none is left. Releases wait for the GPU work queued before them (not for kernels
    /// on non-blocking streams), so this returns soon unless a kernel on the legacy or a
    /// blocking stream keeps running. For tests and orderly shutdown; nothing else needs it.
    pub fn wait_for_releases(&self, timeout: std::time::Duration) -> bool {
        let start = std::time::Instant::now();
        loop {
            ReleaseQueue::global().poll();
            if self.pending_releases() == 0 {
                return true;
            }
            if start.elapsed() >= timeout {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }

    /// Runs an allocation; if it fails with out-of-device-memory while releases wait in the queue
    /// or spare mappings are kept, releases those whose GPU work is done (for up to
    /// [`DUE_SOON`](crate::mapping::release::DUE_SOON), never for a running kernel), gives the
    /// spare mappings back (those the releases just made too) and tries once more.
    pub(crate) fn retry_after_releases<T>(
        &self,
        mut allocate: impl FnMut() -> Result<T>,
    ) -> Result<T> {
        let queue = ReleaseQueue::global();
        match allocate() {
            Err(Error::OutOfDeviceMemory { .. })
                if !queue.is_empty() || !self.inner.spares.is_empty() =>
            {
                if !queue.is_empty() {
                    // Retry as soon as something was released, or once the time is up.
                    let before = self.pending_releases();
                    queue.poll_until(crate::mapping::release::DUE_SOON, ReleaseKey::ANY, || {
                        self.pending_releases() < before || queue.is_empty()
                    });
                }
                drop(self.inner.spares.drain());
                allocate()
            }
            r => r,
        }
    }

    /// The completion words of release fences, made on first use (`None`: not available, and
    /// releases record events instead). Running out of memory making them is passing: they are
    /// tried again a little later ([`FENCE_WORDS_RETRY`]) rather than given up for good, which
    /// would leave every later release of the handle to an event of its own.
    fn fence_words(&self) -> Option<&Arc<FenceWords>> {
        if let Some(words) = self.inner.fence_words.get() {
            return words.as_ref();
        }
        let mut retry = self.inner.fence_words_retry.lock();
        if let Some(words) = self.inner.fence_words.get() {
            return words.as_ref();
        }
        if retry.is_some_and(|at| std::time::Instant::now() < at) {
            return None;
        }
        let made = match self.vmm() {
            Some(v) => FenceWords::new(v, self.vulkan()).map(Some),
            None => Ok(None),
        };
        match made {
            Ok(words) => drop(self.inner.fence_words.set(words)),
            Err(e) if e.is_out_of_memory() => {
                *retry = Some(std::time::Instant::now() + FENCE_WORDS_RETRY);
                return None;
            }
            Err(_) => drop(self.inner.fence_words.set(None)),
        }
        self.inner.fence_words.get().and_then(Option::as_ref)
    }

    /// A fence for the work queued so far in `context` (the handle's own when `None`).
    fn queued_work_fence(&self, context: Option<CuContext>) -> Result<Box<dyn Fence>> {
        let own = context.is_none();
        let context = match context {
            Some(c) => c,
            None => self.context()?,
        };
        // SAFETY: the handle's own context lives as long as `self.inner`; a caller's context
        // was promised alive until its memory is dropped, which is now.
        let _ctx = unsafe { ContextGuard::push(self.driver(), context) }?;
        // An event fence of the handle's own context keeps the handle (and so the context).
        let owner = own.then(|| Box::new(self.clone()) as Box<dyn std::any::Any + Send + Sync>);
        if let Some(words) = self.fence_words() {
            if let Ok(ticket) = words.ticket(self.driver(), context, std::ptr::null_mut()) {
                return Ok(Box::new(ticket));
            }
        }
        // No stream memory operations here: an event on the legacy stream says the same.
        Ok(Box::new(EventFence::record(
            self.driver(),
            context,
            std::ptr::null_mut(),
            owner,
            &self.inner.event_fences,
        )?))
    }

    /// Drops `value` (memory, or what owns memory) once the GPU work queued before now in
    /// `context` (the handle's own when `None`) has completed, never waiting: at once when
    /// nothing is queued, else on the release queue's thread.
    pub(crate) fn release_after_queued_work<V: Send + 'static>(
        &self,
        value: V,
        context: Option<CuContext>,
        key: ReleaseKey,
    ) {
        match self.queued_work_fence(context) {
            Ok(fence) => ReleaseQueue::global().release(fence, value, &self.inner.releases, key),
            // No fence can be issued in a context that is gone, and no kernel of it runs any
            // more: nothing to wait for.
            Err(_) => drop(value),
        }
    }

    /// A fence for the work queued so far on `stream`, a live stream of this handle's device:
    /// a completion word (which needs nothing of the stream or its context afterwards), or,
    /// where stream memory operations are missing, an event that keeps `owner` (what keeps the
    /// stream's context alive, if anything).
    ///
    /// # Safety
    /// - `stream` must be a live `CUstream`; where the fence is an event, its context must stay
    ///   alive until the fence is dropped.
    pub(crate) unsafe fn stream_fence(
        &self,
        stream: CuStream,
        owner: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> Result<Box<dyn Fence>> {
        if stream.is_null() {
            return Err(InvalidArgument::NullStream.into());
        }
        // SAFETY: the caller guarantees a live stream.
        let context = unsafe { self.driver().stream_context(stream) }?;
        // SAFETY: the stream's context is alive while the stream is.
        let _ctx = unsafe { ContextGuard::push(self.driver(), context) }?;
        if let Some(words) = self.fence_words() {
            if let Ok(ticket) = words.ticket(self.driver(), context, stream) {
                return Ok(Box::new(ticket));
            }
        }
        Ok(Box::new(EventFence::record(
            self.driver(),
            context,
            stream,
            owner,
            &self.inner.event_fences,
        )?))
    }

    /// Drops `value` once the work queued on `stream` so far has completed, never waiting. If
    /// no fence can be had there, falls back to [`Gpu::release_after_queued_work`] in
    /// `context` and returns the error.
    ///
    /// # Safety
    /// - As for [`Gpu::stream_fence`].
    pub(crate) unsafe fn release_after_stream<V: Send + 'static>(
        &self,
        value: V,
        stream: CuStream,
        context: Option<CuContext>,
    ) -> Result<()> {
        // SAFETY: forwarded.
        match unsafe { self.stream_fence(stream, None) } {
            Ok(fence) => {
                ReleaseQueue::global().release(fence, value, &self.inner.releases, ReleaseKey::ANY);
                Ok(())
            }
            Err(e) => {
                self.release_after_queued_work(value, context, ReleaseKey::ANY);
                Err(e)
            }
        }
    }

    /// Drops `value` once `fence` has passed, never waiting.
    pub(crate) fn release_after<V: Send + 'static>(&self, value: V, fence: Box<dyn Fence>) {
        ReleaseQueue::global().release(fence, value, &self.inner.releases, ReleaseKey::ANY);
    }
}

/// The calling thread's current context and its device. With none current, the driver's own
/// answer: `cuCtxGetDevice` fails with `CUDA_ERROR_INVALID_CONTEXT`.
pub(crate) fn current_context(driver: &Driver) -> Result<(CuContext, CuDevice)> {
    let device = driver.cu_ctx_get_device()?;
    Ok((driver.cu_ctx_get_current()?, device))
}

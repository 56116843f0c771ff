//! [`VulkanContext`]: an opened device with its chosen memory type, and [`VulkanMemory`], one
//! exportable, host-mapped allocation of it.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use ash::vk;

use crate::core::handle::{assert_send_sync, SendSyncPtr};
use crate::core::range::{atom_range, check_range, round_alloc_size};
use crate::error::{Error, MemorySide, Result};

use super::instance::{
    describe, result_name, shared_instance, vk_err, DeviceSelector, MemoryOptions, MemoryTypeInfo,
    PhysicalDeviceInfo,
};

/// An open Vulkan device with the memory type chosen for BAR mappings.
///
/// Shared through `Arc`; every [`VulkanMemory`] holds one, so the device outlives its memory.
/// Dropping the context destroys its device; the `VkInstance` it was opened on is the process's
/// one, which stays (with the loader and the driver loaded) until the process exits: NVIDIA's
/// driver fails after being unloaded and reloaded about 30 times in one process.
pub struct VulkanContext {
    device: ash::Device,
    external_fd: ash::khr::external_memory_fd::Device,
    info: PhysicalDeviceInfo,
    memory_type: MemoryTypeInfo,
    /// The type of pinned host memory ([`VulkanContext::allocate_host`]).
    host_type: Option<MemoryTypeInfo>,
    non_coherent: bool,
    atom: u64,
}

impl std::fmt::Debug for VulkanContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanContext")
            .field("device", &self.info.name)
            .field("uuid", &self.info.uuid_string())
            .field("memory_type", &self.memory_type.index)
            .field("non_coherent", &self.non_coherent)
            .finish()
    }
}

impl VulkanContext {
    /// Opens the selected physical device with `VK_KHR_external_memory_fd` and picks the memory type.
    pub fn new(selector: DeviceSelector, options: MemoryOptions) -> Result<Arc<Self>> {
        // Every mapping comes from a context: the write path's first-use work (instruction-set
        // detection, its code's page faults) runs here rather than in the process's first write.
        crate::copy::warm_up();
        let instance = shared_instance()?;
        Ok(Arc::new(Self::open_device(instance, selector, options)?))
    }

    fn open_device(
        instance: &'static ash::Instance,
        selector: DeviceSelector,
        options: MemoryOptions,
    ) -> Result<Self> {
        // SAFETY: `instance` is live.
        let pds = unsafe { instance.enumerate_physical_devices() }
            .map_err(vk_err("vkEnumeratePhysicalDevices"))?;
        let infos: Vec<(vk::PhysicalDevice, PhysicalDeviceInfo)> = pds
            .iter()
            .enumerate()
            .map(|(i, &pd)| describe(instance, i, pd).map(|d| (pd, d)))
            .collect::<Result<_>>()?;
        let found = match selector {
            DeviceSelector::Uuid(u) => infos.iter().find(|(_, d)| d.uuid == u),
            DeviceSelector::Index(i) => infos.get(i),
            DeviceSelector::FirstSuitable => infos
                .iter()
                .find(|(_, d)| d.has_external_memory_fd && d.choose_memory_type(options).is_ok()),
        };
        let (pd, info) = found.cloned().ok_or_else(|| {
            let have: Vec<String> = infos
                .iter()
                .map(|(_, d)| format!("{} [{}]", d.name, d.uuid_string()))
                .collect();
            Error::NoMatchingDevice(format!(
                "no Vulkan device for {selector:?}; present: {}",
                if have.is_empty() {
                    "none".to_string()
                } else {
                    have.join(", ")
                }
            ))
        })?;
        if !info.has_external_memory_fd {
            return Err(Error::ExtensionMissing("VK_KHR_external_memory_fd"));
        }
        let memory_type = info.choose_memory_type(options)?.clone();

        let priorities = [1.0f32];
        let queue = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(0)
            .queue_priorities(&priorities)];
        let exts = [ash::khr::external_memory_fd::NAME.as_ptr()];
        let create = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queue)
            .enabled_extension_names(&exts);
        // SAFETY: `pd` belongs to `instance`; the create info and its arrays outlive the call; every
        // device has queue family 0.
        let device = unsafe { instance.create_device(pd, &create, None) }
            .map_err(vk_err("vkCreateDevice"))?;
        let external_fd = ash::khr::external_memory_fd::Device::new(instance, &device);
        let non_coherent = options.force_non_coherent || !memory_type.is_coherent();
        let host_type = info.choose_host_memory_type().cloned();
        Ok(VulkanContext {
            device,
            external_fd,
            atom: info.non_coherent_atom_size,
            info,
            memory_type,
            host_type,
            non_coherent,
        })
    }

    /// The physical device this context opened.
    pub fn device_info(&self) -> &PhysicalDeviceInfo {
        &self.info
    }

    /// The memory type used for allocations.
    pub fn memory_type(&self) -> &MemoryTypeInfo {
        &self.memory_type
    }

    /// Whether flushes and invalidates are issued (non-coherent memory, or forced).
    pub fn is_non_coherent(&self) -> bool {
        self.non_coherent
    }

    /// `nonCoherentAtomSize`: flush and invalidate ranges are rounded to it.
    pub fn atom_size(&self) -> u64 {
        self.atom
    }

    /// Allocates `size` bytes (rounded up to 4 KiB) of exportable `DEVICE_LOCAL | HOST_VISIBLE`
    /// memory and maps it. The mapping is kept out of forked children (`MADV_DONTFORK`): a child
    /// that stores through an inherited pointer faults instead of changing this process's GPU
    /// memory.
    ///
    /// `VK_ERROR_OUT_OF_DEVICE_MEMORY` becomes [`Error::OutOfDeviceMemory`]: the BAR-mappable
    /// capacity is about half of free VRAM and is not shown by the Vulkan budget.
    pub fn allocate(self: &Arc<Self>, size: u64) -> Result<VulkanMemory> {
        self.allocate_type(self.memory_type.index, self.non_coherent, size)
    }

    /// The memory type of pinned host memory, if the device has one.
    pub fn host_memory_type(&self) -> Option<&MemoryTypeInfo> {
        self.host_type.as_ref()
    }

    /// Allocates `size` bytes (rounded up to 4 KiB) of exportable, coherent, host-visible *system*
    /// memory and maps it: what CUDA calls pinned host memory once it is mapped into the device's
    /// address space, but allocated and freed through Vulkan, so that freeing it never waits for
    /// running kernels (`cuMemFreeHost` and `cuMemHostUnregister` do). Fails with
    /// [`Error::NoSuitableMemoryType`] where the device has no such type.
    pub fn allocate_host(self: &Arc<Self>, size: u64) -> Result<VulkanMemory> {
        let index = self
            .host_type
            .as_ref()
            .ok_or_else(|| {
                Error::NoSuitableMemoryType(format!(
                    "{} has no HOST_VISIBLE|HOST_COHERENT memory type",
                    self.info.name
                ))
            })?
            .index;
        self.allocate_type(index, false, size)
    }

    /// Allocates and maps exportable memory of type `index`; `non_coherent` tells whether its
    /// flushes and invalidates are issued.
    fn allocate_type(
        self: &Arc<Self>,
        index: u32,
        non_coherent: bool,
        size: u64,
    ) -> Result<VulkanMemory> {
        let alloc_size = round_alloc_size(size)?;
        if alloc_size > self.info.max_allocation_size && self.info.max_allocation_size != 0 {
            return Err(Error::OutOfDeviceMemory {
                side: MemorySide::Vulkan,
                call: "vkAllocateMemory",
                size,
                // What the driver answers to such a request (the spec allows it to refuse).
                result: format!(
                    "VK_ERROR_OUT_OF_DEVICE_MEMORY (above maxMemoryAllocationSize {})",
                    self.info.max_allocation_size
                ),
            });
        }
        let mut export = vk::ExportMemoryAllocateInfo::default()
            .handle_types(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
        let info = vk::MemoryAllocateInfo::default()
            .allocation_size(alloc_size)
            .memory_type_index(index)
            .push_next(&mut export);
        let oom = |r: vk::Result| match r {
            vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => {
                Error::OutOfDeviceMemory {
                    side: MemorySide::Vulkan,
                    call: "vkAllocateMemory",
                    size,
                    result: result_name(r),
                }
            }
            r => Error::Vulkan {
                call: "vkAllocateMemory",
                result: result_name(r),
            },
        };
        crate::driver::failpoint::inject("vkAllocateMemory", || {
            oom(vk::Result::ERROR_OUT_OF_DEVICE_MEMORY)
        })?;
        // SAFETY: the device is live; the info chain outlives the call. No dedicated allocation
        // and no buffer: a buffer's memoryTypeBits exclude the BAR type on NVIDIA.
        let memory = unsafe { self.device.allocate_memory(&info, None) }.map_err(oom)?;
        let ptr = match self.map_whole(memory, alloc_size) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: `memory` was just allocated, is unmapped (`map_whole` undoes its own
                // mapping on failure) and unused.
                unsafe { self.device.free_memory(memory, None) };
                return Err(e);
            }
        };
        // The copy kernels' CPU feature detection runs `cpuid`, which traps to the hypervisor in
        // a VM (microseconds): do it now, so the first write into this mapping costs what later
        // ones do.
        let _ = crate::copy::simd_level();
        Ok(VulkanMemory {
            ctx: self.clone(),
            memory,
            size: alloc_size,
            ptr: ptr.into(),
            non_coherent,
            exportable: true,
        })
    }

    /// Imports memory that another process (or this one) exported as an opaque fd, `size` bytes
    /// of memory type `type_index`, and maps it whole, as [`allocate`](Self::allocate) maps its
    /// own (kept out of forked children). On success the driver owns the fd; on failure it is
    /// closed.
    ///
    /// The Vulkan specification allows the import only where the exporting device has the same
    /// device and driver UUIDs as this one, and with the exact size and memory type the memory
    /// was allocated with; callers check both against what the exporter declared (the driver is
    /// not required to detect a mismatch). A type that is not this device's BAR type nor its
    /// pinned host type is refused with [`Error::NoSuitableMemoryType`]; an fd the driver does not
    /// take is `VK_ERROR_INVALID_EXTERNAL_HANDLE`. Imported memory cannot be exported again.
    pub fn import_fd(
        self: &Arc<Self>,
        fd: OwnedFd,
        size: u64,
        type_index: u32,
    ) -> Result<VulkanMemory> {
        let non_coherent = if type_index == self.memory_type.index {
            self.non_coherent
        } else if self
            .host_type
            .as_ref()
            .is_some_and(|t| t.index == type_index)
        {
            false
        } else {
            return Err(Error::NoSuitableMemoryType(format!(
                "memory type {type_index} is neither the BAR type ({}) nor the host type of {}",
                self.memory_type.index, self.info.name
            )));
        };
        let alloc_size = round_alloc_size(size)?;
        if alloc_size != size {
            return Err(crate::error::InvalidArgument::ImportSize { size }.into());
        }
        let mut import = vk::ImportMemoryFdInfoKHR::default()
            .handle_type(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD)
            .fd(fd.as_raw_fd());
        let info = vk::MemoryAllocateInfo::default()
            .allocation_size(size)
            .memory_type_index(type_index)
            .push_next(&mut import);
        crate::driver::failpoint::inject("vkAllocateMemory", || {
            vk_err("vkAllocateMemory")(vk::Result::ERROR_INVALID_EXTERNAL_HANDLE)
        })?;
        // SAFETY: the device is live; the info chain and the fd it names outlive the call. On
        // success the driver owns the fd (released below), on failure it is still ours.
        let memory = match unsafe { self.device.allocate_memory(&info, None) } {
            Ok(m) => {
                let _ = fd.into_raw_fd();
                m
            }
            Err(r) => {
                return Err(match r {
                    vk::Result::ERROR_OUT_OF_DEVICE_MEMORY
                    | vk::Result::ERROR_OUT_OF_HOST_MEMORY => Error::OutOfDeviceMemory {
                        side: MemorySide::Vulkan,
                        call: "vkAllocateMemory",
                        size,
                        result: result_name(r),
                    },
                    r => vk_err("vkAllocateMemory")(r),
                })
            }
        };
        let ptr = match self.map_whole(memory, size) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: imported just above, unmapped (`map_whole` undoes its own mapping on
                // failure) and unused.
                unsafe { self.device.free_memory(memory, None) };
                return Err(e);
            }
        };
        let _ = crate::copy::simd_level();
        Ok(VulkanMemory {
            ctx: self.clone(),
            memory,
            size,
            ptr: ptr.into(),
            non_coherent,
            exportable: false,
        })
    }

    /// Maps all `size` bytes of `memory` (host-visible, not mapped yet) and keeps the mapping out
    /// of forked children; on failure nothing stays mapped.
    fn map_whole(&self, memory: vk::DeviceMemory, size: u64) -> Result<NonNull<u8>> {
        crate::driver::failpoint::inject("vkMapMemory", || {
            vk_err("vkMapMemory")(vk::Result::ERROR_MEMORY_MAP_FAILED)
        })?;
        // SAFETY: `memory` is host-visible, not yet mapped, and the range is the whole allocation.
        let mapped = unsafe {
            self.device
                .map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
        }
        .map_err(vk_err("vkMapMemory"))
        .and_then(|p| {
            NonNull::new(p.cast::<u8>())
                .ok_or_else(|| Error::internal("vkMapMemory returned a null pointer"))
        });
        mapped.and_then(|p| {
            crate::driver::isolation::exclude_from_fork(p.as_ptr(), size as usize)
                .map(|()| {
                    // The mapping's first touch is where the driver sets it up (a fault into its
                    // mmap handler): take it here, not in the first write of the memory.
                    // SAFETY: `p` is the start of a live mapping of at least one byte; a
                    // volatile load of a `u8` is valid for any contents.
                    let _ = unsafe { std::ptr::read_volatile(p.as_ptr()) };
                    p
                })
                .inspect_err(|_| {
                    // SAFETY: mapped just above, used by nothing yet.
                    unsafe { self.device.unmap_memory(memory) }
                })
        })
    }

    /// The atom-rounded `VkMappedMemoryRange`s of `ranges` in a `size`-byte allocation; any range
    /// outside it fails the whole batch before the driver is called.
    fn ranges<'a>(
        &self,
        memory: vk::DeviceMemory,
        size: u64,
        ranges: impl Iterator<Item = (u64, u64)>,
        out: &'a mut Vec<vk::MappedMemoryRange<'static>>,
    ) -> Result<&'a [vk::MappedMemoryRange<'static>]> {
        out.clear();
        for (offset, len) in ranges {
            if let Some((o, l)) = atom_range(offset, len, self.atom, size)? {
                out.push(
                    vk::MappedMemoryRange::default()
                        .memory(memory)
                        .offset(o)
                        .size(l),
                );
            }
        }
        Ok(out)
    }
}

impl Drop for VulkanContext {
    fn drop(&mut self) {
        // SAFETY: every VulkanMemory holds an Arc to this context, so none is alive now; the device
        // was created by us and is destroyed exactly once. The instance is shared and stays.
        unsafe { self.device.destroy_device(None) };
    }
}

/// One exportable, mapped Vulkan allocation (no CUDA involved).
///
/// Unmapped and freed on drop. Holds its [`VulkanContext`], so it cannot outlive the device.
///
/// `Send + Sync` by its fields: the memory handle has no thread affinity (Vulkan memory objects may
/// be used from any thread, with the external synchronisation that the immutable handle and
/// `&mut self` on the writing methods provide), and `&self` methods only read the handle values or
/// call vkFlush/vkInvalidateMappedMemoryRanges, which need no external synchronisation.
pub struct VulkanMemory {
    ctx: Arc<VulkanContext>,
    memory: vk::DeviceMemory,
    size: u64,
    /// The host mapping: plain memory shared with the device, never null.
    ptr: SendSyncPtr<u8>,
    /// Whether flushes and invalidates are issued (the context's BAR memory when it is
    /// non-coherent or forced to be treated so; never for coherent host memory).
    non_coherent: bool,
    /// Allocated here with export enabled (an import cannot be exported again).
    exportable: bool,
}
// `Send + Sync` by its fields, as the compiler checks here.
const _: () = assert_send_sync::<VulkanMemory>();

impl std::fmt::Debug for VulkanMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanMemory")
            .field("size", &self.size)
            .field("ptr", &self.ptr)
            .finish()
    }
}

impl VulkanMemory {
    /// Size in bytes (the request rounded up to 4 KiB).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The host mapping's base address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.get()
    }

    /// The context this memory belongs to.
    pub fn context(&self) -> &Arc<VulkanContext> {
        &self.ctx
    }

    /// The raw `VkDeviceMemory`.
    pub fn raw(&self) -> vk::DeviceMemory {
        self.memory
    }

    /// Whether flushes and invalidates are issued for this memory.
    pub fn is_non_coherent(&self) -> bool {
        self.non_coherent
    }

    /// Whether this memory was imported from an fd ([`VulkanContext::import_fd`]) rather than
    /// allocated here.
    pub fn is_imported(&self) -> bool {
        !self.exportable
    }

    /// Exports a new opaque POSIX fd referring to this memory (`vkGetMemoryFdKHR`), close-on-exec
    /// so that programs this process `exec`s do not inherit it.
    pub fn export_fd(&self) -> Result<OwnedFd> {
        if !self.exportable {
            return Err(Error::Unsupported(
                "memory imported from an fd cannot be exported again".into(),
            ));
        }
        let info = vk::MemoryGetFdInfoKHR::default()
            .memory(self.memory)
            .handle_type(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
        crate::driver::failpoint::inject("vkGetMemoryFdKHR", || {
            vk_err("vkGetMemoryFdKHR")(vk::Result::ERROR_TOO_MANY_OBJECTS)
        })?;
        // SAFETY: the memory was allocated with OPAQUE_FD export enabled and is live.
        let fd = unsafe { self.ctx.external_fd.get_memory_fd(&info) }
            .map_err(vk_err("vkGetMemoryFdKHR"))?;
        // SAFETY: on success the driver hands us a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        crate::driver::isolation::set_cloexec(fd.as_fd())?;
        Ok(fd)
    }

    /// Flushes CPU writes in `[offset, offset+len)` to the device (rounded to the atom). A no-op on
    /// coherent memory unless non-coherent mode is forced.
    pub fn flush(&self, offset: u64, len: u64) -> Result<()> {
        check_range(offset, len, self.size)?;
        self.flush_ranges(std::iter::once((offset, len)))
    }

    /// Makes device writes in `[offset, offset+len)` visible to the CPU (rounded to the atom).
    pub fn invalidate(&self, offset: u64, len: u64) -> Result<()> {
        check_range(offset, len, self.size)?;
        self.invalidate_ranges(std::iter::once((offset, len)))
    }

    /// Flushes several `(offset, len)` ranges with one `vkFlushMappedMemoryRanges` call (each
    /// rounded to the atom). A range outside the allocation is [`Error::InvalidArgument`] and
    /// nothing is flushed; on coherent memory the ranges are checked and no call is made.
    pub fn flush_ranges(&self, ranges: impl Iterator<Item = (u64, u64)>) -> Result<()> {
        self.sync_ranges(ranges, CacheOp::Flush)
    }

    /// Invalidates several `(offset, len)` ranges with one `vkInvalidateMappedMemoryRanges` call,
    /// checked like [`flush_ranges`](Self::flush_ranges).
    pub fn invalidate_ranges(&self, ranges: impl Iterator<Item = (u64, u64)>) -> Result<()> {
        self.sync_ranges(ranges, CacheOp::Invalidate)
    }

    fn sync_ranges(&self, ranges: impl Iterator<Item = (u64, u64)>, op: CacheOp) -> Result<()> {
        if !self.non_coherent {
            // No driver call, but the same answer to a bad range as on non-coherent memory.
            for (offset, len) in ranges {
                check_range(offset, len, self.size)?;
            }
            return Ok(());
        }
        let mut buf = Vec::new();
        let r = self.ctx.ranges(self.memory, self.size, ranges, &mut buf)?;
        if r.is_empty() {
            return Ok(());
        }
        match op {
            CacheOp::Flush => {
                crate::driver::failpoint::inject("vkFlushMappedMemoryRanges", || {
                    vk_err("vkFlushMappedMemoryRanges")(vk::Result::ERROR_OUT_OF_HOST_MEMORY)
                })?;
                // SAFETY: every range lies in this mapped allocation, with atom-aligned offsets
                // and sizes that are atom multiples or reach the end of the allocation.
                unsafe { self.ctx.device.flush_mapped_memory_ranges(r) }
                    .map_err(vk_err("vkFlushMappedMemoryRanges"))
            }
            CacheOp::Invalidate => {
                crate::driver::failpoint::inject("vkInvalidateMappedMemoryRanges", || {
                    vk_err("vkInvalidateMappedMemoryRanges")(vk::Result::ERROR_OUT_OF_HOST_MEMORY)
                })?;
                // SAFETY: as for the flush.
                unsafe { self.ctx.device.invalidate_mapped_memory_ranges(r) }
                    .map_err(vk_err("vkInvalidateMappedMemoryRanges"))
            }
        }
    }
}

/// Which cache maintenance `sync_ranges` performs.
#[derive(Clone, Copy)]
enum CacheOp {
    Flush,
    Invalidate,
}

impl Drop for VulkanMemory {
    fn drop(&mut self) {
        crate::driver::isolation::restore_fork(self.ptr.get(), self.size as usize);
        // SAFETY: the memory is ours, mapped once in `allocate`; any CUDA import of it was destroyed
        // before this drop (RawMemory drops its CUDA half first). Unmap, then free.
        unsafe {
            self.ctx.device.unmap_memory(self.memory);
            self.ctx.device.free_memory(self.memory, None);
        }
    }
}

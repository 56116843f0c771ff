//! The Vulkan half: instance, physical device, exportable host-visible device-local memory.
//!
//! This layer knows nothing of CUDA, so it runs (and is tested) on any Vulkan driver with
//! `VK_KHR_external_memory_fd` and a `DEVICE_LOCAL | HOST_VISIBLE` memory type — Mesa's lavapipe
//! on CI, the NVIDIA driver on the GPU machine. The loader is found at run time (`ash::Entry::load`,
//! or the file `VKGDR_VULKAN_LIBRARY` names); a machine without it gets
//! [`Error::LibraryNotFound`].

use std::ffi::CStr;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use ash::vk;

use crate::core::handle::{assert_send_sync, SendSyncPtr};
use crate::core::range::{atom_range, check_range, round_alloc_size};
/// Device UUIDs, as Vulkan matches them to CUDA devices.
pub use crate::driver::uuid::{format_uuid, parse_uuid};
use crate::error::{Error, MemorySide, Result};

const LOADER: &str = "libvulkan.so.1";

/// NVIDIA's PCI vendor ID, as Vulkan reports it in `vendorID`.
pub const NVIDIA_VENDOR_ID: u32 = 0x10de;

/// The Vulkan result's name as the specification spells it, e.g. `VK_ERROR_OUT_OF_DEVICE_MEMORY`.
pub fn result_name(r: vk::Result) -> String {
    format!("VK_{r:?}")
}

fn vk_err(call: &'static str) -> impl FnOnce(vk::Result) -> Error {
    move |r| Error::Vulkan {
        call,
        result: result_name(r),
    }
}

/// Options that shape which memory type is used and how coherence is handled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryOptions {
    /// Fail with [`Error::NoSuitableMemoryType`] unless the chosen type is `HOST_COHERENT`.
    pub require_coherent: bool,
    /// Treat the memory as non-coherent even if it is coherent, so every flush and invalidate is
    /// really issued (tests the non-coherent code path on coherent hardware).
    pub force_non_coherent: bool,
}

/// Which physical device to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSelector {
    /// The device whose `deviceUUID` equals this (CUDA's `cuDeviceGetUuid`).
    Uuid([u8; 16]),
    /// The n-th physical device in enumeration order.
    Index(usize),
    /// The first device that has everything the crate needs.
    FirstSuitable,
}

/// One Vulkan memory type, as reported by the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryTypeInfo {
    /// Index in `VkPhysicalDeviceMemoryProperties::memoryTypes`.
    pub index: u32,
    /// The heap it allocates from.
    pub heap: u32,
    /// Its property flags.
    pub flags: vk::MemoryPropertyFlags,
}

impl MemoryTypeInfo {
    /// `DEVICE_LOCAL | HOST_VISIBLE`: the kind of memory this crate maps.
    pub fn is_bar_mappable(&self) -> bool {
        self.flags
            .contains(vk::MemoryPropertyFlags::DEVICE_LOCAL | vk::MemoryPropertyFlags::HOST_VISIBLE)
    }
    /// `HOST_COHERENT` is set.
    pub fn is_coherent(&self) -> bool {
        self.flags.contains(vk::MemoryPropertyFlags::HOST_COHERENT)
    }
}

/// One Vulkan memory heap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryHeapInfo {
    /// Heap size in bytes.
    pub size: u64,
    /// Heap flags.
    pub flags: vk::MemoryHeapFlags,
}

/// What the crate knows about one Vulkan physical device (the content of `vkgdr info`).
#[derive(Debug, Clone)]
pub struct PhysicalDeviceInfo {
    /// Enumeration index.
    pub index: usize,
    /// `deviceName`.
    pub name: String,
    /// `vendorID` (PCI vendor: [`NVIDIA_VENDOR_ID`] for NVIDIA, 0x10005 for Mesa's software
    /// drivers).
    pub vendor_id: u32,
    /// `deviceUUID` (matches CUDA's `cuDeviceGetUuid` on NVIDIA).
    pub uuid: [u8; 16],
    /// Driver name and info, when the device reports them (Vulkan 1.2).
    pub driver: String,
    /// The device's Vulkan API version, as `major.minor.patch`.
    pub api_version: String,
    /// Device type (discrete GPU, CPU, ...).
    pub device_type: vk::PhysicalDeviceType,
    /// All memory types.
    pub memory_types: Vec<MemoryTypeInfo>,
    /// All memory heaps.
    pub memory_heaps: Vec<MemoryHeapInfo>,
    /// `nonCoherentAtomSize`.
    pub non_coherent_atom_size: u64,
    /// `maxMemoryAllocationSize` (Vulkan 1.1).
    pub max_allocation_size: u64,
    /// Whether `VK_KHR_external_memory_fd` is offered.
    pub has_external_memory_fd: bool,
}

impl PhysicalDeviceInfo {
    /// The memory type the crate would use with `options`, or why there is none.
    pub fn choose_memory_type(&self, options: MemoryOptions) -> Result<&MemoryTypeInfo> {
        let candidates = self.memory_types.iter().filter(|t| t.is_bar_mappable());
        let best = candidates
            .filter(|t| !options.require_coherent || t.is_coherent())
            // Prefer coherent, then the bigger heap (the real VRAM heap over a small BAR heap).
            .max_by_key(|t| {
                (
                    t.is_coherent(),
                    self.memory_heaps[t.heap as usize].size,
                    u32::MAX - t.index,
                )
            });
        best.ok_or_else(|| {
            Error::NoSuitableMemoryType(format!(
                "{} has no DEVICE_LOCAL|HOST_VISIBLE{} memory type",
                self.name,
                if options.require_coherent {
                    "|HOST_COHERENT"
                } else {
                    ""
                }
            ))
        })
    }

    /// The memory type pinned host buffers use: `HOST_VISIBLE | HOST_COHERENT` system memory,
    /// preferring a type outside device-local heaps and `HOST_CACHED` (CPU reads of what the
    /// GPU wrote run at memory speed). `None` where the device has no coherent host-visible type.
    pub fn choose_host_memory_type(&self) -> Option<&MemoryTypeInfo> {
        let host = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        self.memory_types
            .iter()
            .filter(|t| t.flags.contains(host))
            .max_by_key(|t| {
                (
                    !t.flags.contains(vk::MemoryPropertyFlags::DEVICE_LOCAL),
                    t.flags.contains(vk::MemoryPropertyFlags::HOST_CACHED),
                    u32::MAX - t.index,
                )
            })
    }

    /// Whether the device is an NVIDIA GPU (`vendorID` 0x10de).
    pub fn is_nvidia(&self) -> bool {
        self.vendor_id == NVIDIA_VENDOR_ID
    }

    /// The UUID formatted like `nvidia-smi -L` does (`GPU-xxxxxxxx-xxxx-...`, without the prefix).
    pub fn uuid_string(&self) -> String {
        format_uuid(&self.uuid)
    }
}

fn load_entry() -> Result<ash::Entry> {
    // `VKGDR_VULKAN_LIBRARY` may name another file (crate::dynlib).
    let name = crate::driver::dynlib::library_name(LOADER, crate::driver::dynlib::VULKAN_ENV);
    let entry = if name == LOADER {
        // SAFETY: loading the Vulkan loader runs its initialisers, which are designed for this;
        // the entry keeps the library alive as long as it lives.
        unsafe { ash::Entry::load() }
    } else {
        // SAFETY: as above, for the loader the user named.
        unsafe { ash::Entry::load_from(&name) }
    };
    entry.map_err(|e| {
        crate::driver::dynlib::not_found(LOADER, crate::driver::dynlib::VULKAN_ENV, &name, e)
    })
}

/// The Vulkan loader and one instance on it, kept for the rest of the process once made.
///
/// Destroying a process's last instance makes the loader unload the driver (the ICD), and
/// NVIDIA's ICD does not survive that repeatedly: on the H100 machine (driver 580.159.04), after
/// about 30 contexts opened and dropped one after another in one process, `vkCreateInstance`
/// fails with `VK_ERROR_INCOMPATIBLE_DRIVER` ("Could not get 'vkCreateInstance' via
/// 'vk_icdGetInstanceProcAddr' for ICD libGLX_nvidia.so.0"). So every context opens its device
/// on the shared instance of its loader, and only devices come and go.
struct SharedInstance {
    /// Keeps the loader library loaded while `instance` is in use (forever).
    _entry: ash::Entry,
    instance: ash::Instance,
}

/// The shared instance of the loader `VKGDR_VULKAN_LIBRARY` names now (see [`SharedInstance`]).
/// Failures are not kept: a later call tries again (another loader, a driver installed since).
fn shared_instance() -> Result<&'static ash::Instance> {
    static INSTANCES: crate::core::sync::lock::Mutex<Vec<(String, &'static SharedInstance)>> =
        crate::core::sync::lock::Mutex::new(Vec::new());
    let name = crate::driver::dynlib::library_name(LOADER, crate::driver::dynlib::VULKAN_ENV);
    let mut instances = INSTANCES.lock();
    if let Some((_, shared)) = instances.iter().find(|(n, _)| *n == name) {
        return Ok(&shared.instance);
    }
    let entry = load_entry()?;
    let instance = create_instance(&entry)?;
    // Leaked on purpose: never destroyed, see SharedInstance.
    let shared: &'static SharedInstance = Box::leak(Box::new(SharedInstance {
        _entry: entry,
        instance,
    }));
    instances.push((name, shared));
    Ok(&shared.instance)
}

fn create_instance(entry: &ash::Entry) -> Result<ash::Instance> {
    let app = vk::ApplicationInfo::default()
        .application_name(c"vkgdr")
        .engine_name(c"vkgdr")
        .api_version(vk::API_VERSION_1_3);
    let info = vk::InstanceCreateInfo::default().application_info(&app);
    // SAFETY: `info` and what it points to live across the call; no extensions or layers requested.
    unsafe { entry.create_instance(&info, None) }.map_err(vk_err("vkCreateInstance"))
}

fn describe(
    instance: &ash::Instance,
    index: usize,
    pd: vk::PhysicalDevice,
) -> Result<PhysicalDeviceInfo> {
    // SAFETY: `pd` was enumerated from `instance`, which is live.
    let props = unsafe { instance.get_physical_device_properties(pd) };
    let api = props.api_version;
    let mut id = vk::PhysicalDeviceIDProperties::default();
    let mut maint3 = vk::PhysicalDeviceMaintenance3Properties::default();
    let mut driver = vk::PhysicalDeviceDriverProperties::default();
    let has_driver_props = vk::api_version_major(api) > 1 || vk::api_version_minor(api) >= 2;
    {
        let mut props2 = vk::PhysicalDeviceProperties2::default()
            .push_next(&mut id)
            .push_next(&mut maint3);
        if has_driver_props {
            props2 = props2.push_next(&mut driver);
        }
        // SAFETY: the chain holds structs valid for a Vulkan 1.1 instance (1.2's driver properties
        // only when the device reports 1.2+); all outlive the call.
        unsafe { instance.get_physical_device_properties2(pd, &mut props2) };
    }
    // SAFETY: as above.
    let mem = unsafe { instance.get_physical_device_memory_properties(pd) };
    // SAFETY: as above.
    let exts = unsafe { instance.enumerate_device_extension_properties(pd) }
        .map_err(vk_err("vkEnumerateDeviceExtensionProperties"))?;
    let has_fd = exts.iter().any(|e| {
        e.extension_name_as_c_str()
            .map(|n| n == ash::khr::external_memory_fd::NAME)
            .unwrap_or(false)
    });
    let cstr = |s: Result<&CStr, _>| {
        s.map(|c: &CStr| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let driver_text = if has_driver_props {
        format!(
            "{} ({})",
            cstr(driver.driver_name_as_c_str()),
            cstr(driver.driver_info_as_c_str())
        )
    } else {
        String::from("(not reported before Vulkan 1.2)")
    };
    Ok(PhysicalDeviceInfo {
        index,
        name: cstr(props.device_name_as_c_str()),
        vendor_id: props.vendor_id,
        uuid: id.device_uuid,
        driver: driver_text,
        api_version: format!(
            "{}.{}.{}",
            vk::api_version_major(api),
            vk::api_version_minor(api),
            vk::api_version_patch(api)
        ),
        device_type: props.device_type,
        memory_types: mem
            .memory_types_as_slice()
            .iter()
            .enumerate()
            .map(|(i, t)| MemoryTypeInfo {
                index: i as u32,
                heap: t.heap_index,
                flags: t.property_flags,
            })
            .collect(),
        memory_heaps: mem
            .memory_heaps_as_slice()
            .iter()
            .map(|h| MemoryHeapInfo {
                size: h.size,
                flags: h.flags,
            })
            .collect(),
        non_coherent_atom_size: props.limits.non_coherent_atom_size.max(1),
        max_allocation_size: maint3.max_memory_allocation_size,
        has_external_memory_fd: has_fd,
    })
}

/// Lists every Vulkan physical device with its memory types (no device is opened).
pub fn enumerate_devices() -> Result<Vec<PhysicalDeviceInfo>> {
    let instance = shared_instance()?;
    // SAFETY: the shared instance is live for the rest of the process.
    let pds = unsafe { instance.enumerate_physical_devices() }
        .map_err(vk_err("vkEnumeratePhysicalDevices"))?;
    pds.into_iter()
        .enumerate()
        .map(|(i, pd)| describe(instance, i, pd))
        .collect()
}

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
                .map(|()| p)
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

    /// Exports a new opaque POSIX fd referring to this memory (`vkGetMemoryFdKHR`), close-on-exec
    /// so that programs this process `exec`s do not inherit it.
    pub fn export_fd(&self) -> Result<OwnedFd> {
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

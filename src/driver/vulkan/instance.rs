//! The loader, the process's one instance, and what each physical device offers
//! ([`PhysicalDeviceInfo`], [`enumerate_devices`]), without opening any.

use std::ffi::CStr;

use ash::vk;

use crate::driver::uuid::format_uuid;
use crate::error::{Error, Result};

const LOADER: &str = "libvulkan.so.1";

/// NVIDIA's PCI vendor ID, as Vulkan reports it in `vendorID`.
pub const NVIDIA_VENDOR_ID: u32 = 0x10de;

/// The Vulkan result's name as the specification spells it, e.g. `VK_ERROR_OUT_OF_DEVICE_MEMORY`.
pub fn result_name(r: vk::Result) -> String {
    format!("VK_{r:?}")
}

pub(super) fn vk_err(call: &'static str) -> impl FnOnce(vk::Result) -> Error {
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
    /// `driverUUID`: memory exported as an opaque fd can be imported only by a device with the
    /// same device and driver UUIDs (the Vulkan specification's rule for external memory).
    pub driver_uuid: [u8; 16],
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

    /// The size of the heap `memory_type` allocates from (0 for a type of another device).
    pub fn heap_size(&self, memory_type: &MemoryTypeInfo) -> u64 {
        self.memory_heaps
            .get(memory_type.heap as usize)
            .map_or(0, |h| h.size)
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

/// The shared instance of the loader `VKGDR_VULKAN_LIBRARY` names now (see [`SharedInstance`]),
/// made by this process. A child forked after its parent made one (a peer started by `fork()`,
/// Python's `multiprocessing` with its `fork` start method) is refused with
/// [`Error::Unsupported`] instead: with NVIDIA's driver (580) a forked child's `vkCreateDevice` failed
/// with `VK_ERROR_DEVICE_LOST`, and so did every one of its parent's afterwards (the driver's
/// state is shared through the inherited fds). Children that start with `exec` (`subprocess`,
/// `multiprocessing`'s `spawn` and `forkserver`) open the driver afresh.
/// Failures are not kept: a later call tries again (another loader, a driver installed since).
pub(super) fn shared_instance() -> Result<&'static ash::Instance> {
    type Made = (String, u32, &'static SharedInstance);
    static INSTANCES: crate::core::sync::lock::Mutex<Vec<Made>> =
        crate::core::sync::lock::Mutex::new(Vec::new());
    let name = crate::driver::dynlib::library_name(LOADER, crate::driver::dynlib::VULKAN_ENV);
    let pid = std::process::id();
    let mut instances = INSTANCES.lock();
    if let Some((_, _, shared)) = instances.iter().find(|(n, p, _)| *n == name && *p == pid) {
        return Ok(&shared.instance);
    }
    if let Some((_, parent, _)) = instances.iter().find(|(_, p, _)| *p != pid) {
        return Err(Error::Unsupported(format!(
            "this process was forked from process {parent} after it opened the Vulkan driver, \
             and a forked child's driver calls break its parent's devices: start the child \
             with exec instead (subprocess, or multiprocessing's spawn or forkserver start \
             method)"
        )));
    }
    let entry = load_entry()?;
    let instance = create_instance(&entry)?;
    // Leaked on purpose: never destroyed, see SharedInstance.
    let shared: &'static SharedInstance = Box::leak(Box::new(SharedInstance {
        _entry: entry,
        instance,
    }));
    instances.push((name, pid, shared));
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

pub(super) fn describe(
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
        driver_uuid: id.driver_uuid,
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

//! Know before it fails: what this machine offers vkgdr, and — when something is missing — what it
//! is and how to fix it. `vkgdr info` prints both.
//!
//! Two halves, so the logic is tested on any machine:
//! - [`Machine::probe`] gathers a description: the Vulkan devices (or why there are none), the
//!   CUDA devices with their VMM support and BAR figures, NVML, the Vulkan ICD manifests on disk
//!   and the container's NVIDIA driver capabilities. It never fails: every missing piece is part
//!   of the description.
//! - [`diagnose`] is a pure function from that description to [`Finding`]s, each naming the
//!   problem and its fix. Tests feed it machines that CI cannot be (a CUDA device without its
//!   Vulkan twin, a 256 MiB BAR, no VMM).
//!
//! The problems it names, with the one CI can make happen for real in brackets:
//! no Vulkan loader [`VKGDR_VULKAN_LIBRARY` naming a missing file]; a loader but no NVIDIA Vulkan
//! device, because the ICD manifest is missing or a container lacks the `graphics` capability
//! [lavapipe alone; `VK_DRIVER_FILES` naming a missing manifest]; no CUDA driver [CI has none;
//! `VKGDR_CUDA_LIBRARY`]; CUDA devices without a Vulkan device of the same UUID; no
//! `DEVICE_LOCAL | HOST_VISIBLE` memory type, or a small one (resizable BAR off); no
//! `VK_KHR_external_memory_fd`; no CUDA VMM; no NVML.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::driver::cuda::{self, Driver};
use crate::driver::nvml::{Nvml, NvmlDevice, PciAddress};
use crate::driver::uuid::format_uuid;
use crate::driver::vulkan::{self, MemoryOptions, PhysicalDeviceInfo};
use crate::error::{Error, Result};
use crate::mapping::bar::{cuda_pci_address, device_bar_info, BarInfo};

/// A BAR-mappable heap below this is "small": GeForce cards without resizable BAR expose 256 MiB.
pub const SMALL_BAR: u64 = 1 << 30;

/// What the Vulkan loader gave.
#[derive(Debug, Clone)]
pub enum VulkanProbe {
    /// The loader library could not be opened (what the dynamic loader said).
    LoaderMissing(String),
    /// The loader is there but no driver (ICD) could be loaded: `vkCreateInstance` returned
    /// `VK_ERROR_INCOMPATIBLE_DRIVER`.
    NoDriver(String),
    /// Another Vulkan failure.
    Failed(String),
    /// The physical devices (possibly none).
    Devices(Vec<PhysicalDeviceInfo>),
}

/// One CUDA device as vkgdr sees it.
#[derive(Debug, Clone)]
pub struct CudaDeviceInfo {
    /// The CUDA ordinal.
    pub ordinal: i32,
    /// `cuDeviceGetName`.
    pub name: String,
    /// `cuDeviceGetUuid` (the Vulkan `deviceUUID` of the same GPU).
    pub uuid: [u8; 16],
    /// The PCI address, when CUDA reports it.
    pub pci: Option<PciAddress>,
    /// Total device memory in bytes.
    pub total_mem: u64,
    /// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
    pub vmm: bool,
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`.
    pub posix_fd: bool,
    /// The VMM allocation granularity in bytes, or why it is unknown.
    pub granularity: Result<u64, String>,
    /// The BAR figures, or why they could not be read.
    pub bar: Result<BarInfo, String>,
}

/// What the CUDA driver gave.
#[derive(Debug, Clone)]
pub enum CudaProbe {
    /// `libcuda.so.1` could not be opened.
    DriverMissing(String),
    /// The driver loaded but failed (`cuInit`, a device query).
    Failed(String),
    /// The driver's CUDA version (13000 for 13.0) and its devices (possibly none).
    Devices {
        /// `cuDriverGetVersion`.
        version: i32,
        /// Every device.
        devices: Vec<CudaDeviceInfo>,
    },
}

/// What NVML gave.
#[derive(Debug, Clone)]
pub enum NvmlProbe {
    /// NVML could not be loaded or initialised.
    Unavailable(String),
    /// The driver version and every device NVML sees.
    Devices {
        /// `nvmlSystemGetDriverVersion`.
        driver_version: String,
        /// The devices with their BAR1 and memory figures.
        devices: Vec<NvmlDevice>,
    },
}

/// Facts about the environment that explain a missing Vulkan driver.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    /// Where Vulkan ICD manifests were looked for (directories or, with `VK_DRIVER_FILES` /
    /// `VK_ICD_FILENAMES`, the files named).
    pub icd_searched: Vec<PathBuf>,
    /// The manifests found there.
    pub icd_manifests: Vec<PathBuf>,
    /// `NVIDIA_DRIVER_CAPABILITIES`, when set (the NVIDIA container toolkit reads it).
    pub driver_capabilities: Option<String>,
    /// Whether this looks like a container (`/.dockerenv`, `/run/.containerenv`, or the NVIDIA
    /// container variables set).
    pub in_container: bool,
}

impl Environment {
    /// Reads the environment of this process.
    pub fn probe() -> Environment {
        let var = |n: &str| std::env::var(n).ok().filter(|v| !v.is_empty());
        let explicit = var("VK_DRIVER_FILES").or_else(|| var("VK_ICD_FILENAMES"));
        let icd_searched: Vec<PathBuf> = match &explicit {
            Some(list) => list.split(':').map(PathBuf::from).collect(),
            None => icd_directories(var("XDG_CONFIG_DIRS"), var("XDG_DATA_DIRS"), var("HOME")),
        };
        let mut icd_manifests = Vec::new();
        for p in &icd_searched {
            if explicit.is_some() {
                if p.is_file() {
                    icd_manifests.push(p.clone());
                }
            } else if let Ok(dir) = std::fs::read_dir(p) {
                let mut found: Vec<PathBuf> = dir
                    .flatten()
                    .map(|e| e.path())
                    .filter(|f| f.extension().is_some_and(|x| x == "json"))
                    .collect();
                found.sort();
                icd_manifests.extend(found);
            }
        }
        let driver_capabilities = var("NVIDIA_DRIVER_CAPABILITIES");
        let in_container = Path::new("/.dockerenv").exists()
            || Path::new("/run/.containerenv").exists()
            || driver_capabilities.is_some()
            || var("NVIDIA_VISIBLE_DEVICES").is_some();
        Environment {
            icd_searched,
            icd_manifests,
            driver_capabilities,
            in_container,
        }
    }

    /// The NVIDIA ICD manifests among those found (`nvidia_icd.json` and variants).
    pub fn nvidia_manifests(&self) -> impl Iterator<Item = &PathBuf> {
        self.icd_manifests.iter().filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().to_ascii_lowercase().contains("nvidia"))
        })
    }

    /// Whether the NVIDIA container toolkit's driver capabilities leave out `graphics` (the one
    /// that mounts the Vulkan ICD). Unset, in a container whose CUDA driver the toolkit mounted
    /// (`cuda_present`), means the toolkit's default, `compute,utility`.
    pub fn lacks_graphics_capability(&self, cuda_present: bool) -> bool {
        match &self.driver_capabilities {
            Some(caps) => !caps
                .split(',')
                .any(|c| matches!(c.trim(), "graphics" | "all")),
            None => self.in_container && cuda_present,
        }
    }
}

/// The directories the Vulkan loader searches for ICD manifests on Linux.
fn icd_directories(
    config_dirs: Option<String>,
    data_dirs: Option<String>,
    home: Option<String>,
) -> Vec<PathBuf> {
    let config = config_dirs.unwrap_or_else(|| "/etc/xdg".into());
    let data = data_dirs.unwrap_or_else(|| "/usr/local/share:/usr/share".into());
    let mut dirs: Vec<PathBuf> = config
        .split(':')
        .chain(["/etc"])
        .chain(data.split(':'))
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join("vulkan/icd.d"))
        .collect();
    if let Some(h) = home {
        dirs.push(Path::new(&h).join(".local/share/vulkan/icd.d"));
    }
    dirs.dedup();
    dirs
}

/// Everything vkgdr needs to know about this machine.
#[derive(Debug, Clone)]
pub struct Machine {
    /// The Vulkan side.
    pub vulkan: VulkanProbe,
    /// The CUDA side.
    pub cuda: CudaProbe,
    /// NVML.
    pub nvml: NvmlProbe,
    /// ICD manifests and container capabilities.
    pub environment: Environment,
}

impl Machine {
    /// Looks at this machine: lists the Vulkan devices, the CUDA devices (with BAR figures, which
    /// retains each device's primary context briefly when NVML is not there), NVML and the
    /// environment. Never fails; what is missing is recorded.
    pub fn probe() -> Machine {
        Machine {
            vulkan: probe_vulkan(),
            cuda: probe_cuda(),
            nvml: probe_nvml(),
            environment: Environment::probe(),
        }
    }

    /// The Vulkan devices (none when Vulkan is not usable).
    pub fn vulkan_devices(&self) -> &[PhysicalDeviceInfo] {
        match &self.vulkan {
            VulkanProbe::Devices(d) => d,
            _ => &[],
        }
    }

    /// The CUDA devices (none when CUDA is not usable).
    pub fn cuda_devices(&self) -> &[CudaDeviceInfo] {
        match &self.cuda {
            CudaProbe::Devices { devices, .. } => devices,
            _ => &[],
        }
    }

    /// The Vulkan device with the same UUID as a CUDA device.
    pub fn vulkan_twin(&self, cuda: &CudaDeviceInfo) -> Option<&PhysicalDeviceInfo> {
        self.vulkan_devices().iter().find(|d| d.uuid == cuda.uuid)
    }
}

fn probe_vulkan() -> VulkanProbe {
    match vulkan::enumerate_devices() {
        Ok(d) => VulkanProbe::Devices(d),
        Err(e @ Error::LibraryNotFound { .. }) => VulkanProbe::LoaderMissing(e.to_string()),
        Err(e @ Error::Vulkan { .. })
            if e.result_name() == Some("VK_ERROR_INCOMPATIBLE_DRIVER") =>
        {
            VulkanProbe::NoDriver(e.to_string())
        }
        Err(e) => VulkanProbe::Failed(e.to_string()),
    }
}

fn probe_cuda() -> CudaProbe {
    let driver = match Driver::get() {
        Ok(d) => d,
        Err(e @ (Error::LibraryNotFound { .. } | Error::MissingSymbol { .. })) => {
            return CudaProbe::DriverMissing(e.to_string())
        }
        Err(e) => return CudaProbe::Failed(e.to_string()),
    };
    let gather = || -> Result<CudaProbe> {
        let version = driver.version()?;
        let devices = (0..driver.device_count()?)
            .map(|i| cuda_device(&driver, i))
            .collect::<Result<_>>()?;
        Ok(CudaProbe::Devices { version, devices })
    };
    gather().unwrap_or_else(|e| CudaProbe::Failed(e.to_string()))
}

fn cuda_device(driver: &Driver, ordinal: i32) -> Result<CudaDeviceInfo> {
    let dev = driver.device(ordinal)?;
    let flag = |attribute| driver.device_attribute(dev, attribute).map(|v| v != 0);
    Ok(CudaDeviceInfo {
        ordinal,
        name: driver.device_name(dev)?,
        uuid: driver.device_uuid(dev)?,
        pci: cuda_pci_address(driver, dev).ok(),
        total_mem: driver.device_total_mem(dev)?,
        vmm: flag(cuda::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)?,
        posix_fd: flag(cuda::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)?,
        granularity: crate::mapping::arena::granularity(driver, ordinal).map_err(|e| e.to_string()),
        bar: device_bar_info(driver, dev).map_err(|e| e.to_string()),
    })
}

fn probe_nvml() -> NvmlProbe {
    let gather = || -> Result<NvmlProbe> {
        let nvml = Nvml::get()?;
        Ok(NvmlProbe::Devices {
            driver_version: nvml.driver_version()?,
            devices: nvml.devices()?,
        })
    };
    gather().unwrap_or_else(|e| NvmlProbe::Unavailable(e.to_string()))
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// vkgdr cannot open a device (or any device) until it is fixed.
    Error,
    /// vkgdr works, with a limit worth knowing (small BAR, no VMM).
    Warning,
    /// Information missing, nothing broken (no BAR1 figures).
    Note,
}

/// Which problem a [`Finding`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// The Vulkan loader (`libvulkan.so.1`) is not installed.
    NoVulkanLoader,
    /// Vulkan is there but shows no NVIDIA device (no ICD, or the container lacks `graphics`).
    NoNvidiaVulkanDevice,
    /// Vulkan failed in another way.
    VulkanFailed,
    /// The CUDA driver (`libcuda.so.1`) is not installed.
    NoCudaDriver,
    /// The CUDA driver loaded but failed.
    CudaFailed,
    /// The CUDA driver reports no device.
    NoCudaDevice,
    /// A CUDA device has no Vulkan device with the same UUID.
    NoVulkanTwin {
        /// The CUDA ordinal.
        ordinal: i32,
    },
    /// The device's Vulkan driver lacks `VK_KHR_external_memory_fd`.
    NoExternalMemoryFd {
        /// The CUDA ordinal.
        ordinal: i32,
    },
    /// No `DEVICE_LOCAL | HOST_VISIBLE` memory type.
    NoBarMemoryType {
        /// The CUDA ordinal.
        ordinal: i32,
    },
    /// BAR-mappable memory is small (resizable BAR off).
    SmallBar {
        /// The CUDA ordinal.
        ordinal: i32,
    },
    /// CUDA VMM or POSIX fd handles are unsupported: no arenas, no mirrored rings.
    VmmUnsupported {
        /// The CUDA ordinal.
        ordinal: i32,
    },
    /// NVML is not there: no BAR1 figures.
    NoNvml,
}

/// One diagnosed problem: what is wrong and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Which problem.
    pub problem: Problem,
    /// How bad.
    pub severity: Severity,
    /// What is wrong, with the facts that show it.
    pub what: String,
    /// What to do.
    pub fix: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let label = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "note",
        };
        write!(f, "{label}: {}\n  fix: {}", self.what, self.fix)
    }
}

fn finding(problem: Problem, severity: Severity, what: String, fix: String) -> Finding {
    Finding {
        problem,
        severity,
        what,
        fix,
    }
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// The problems `machine` has, most severe first. Empty: vkgdr can open every CUDA device.
pub fn diagnose(machine: &Machine) -> Vec<Finding> {
    let mut out = Vec::new();
    vulkan_findings(machine, &mut out);
    cuda_findings(machine, &mut out);
    for dev in machine.cuda_devices() {
        device_findings(machine, dev, &mut out);
    }
    if matches!(machine.cuda, CudaProbe::Devices { .. }) {
        if let NvmlProbe::Unavailable(why) = &machine.nvml {
            out.push(finding(
                Problem::NoNvml,
                Severity::Note,
                format!("no BAR1 figures: {why}"),
                "NVML (libnvidia-ml.so.1) comes with the NVIDIA driver; in a container the \
                 `utility` driver capability provides it (NVIDIA_DRIVER_CAPABILITIES=\
                 compute,utility,graphics). Without it the capacity estimate counts earlier \
                 mappings once instead of twice"
                    .into(),
            ));
        }
    }
    out.sort_by_key(|f| f.severity);
    out
}

fn vulkan_findings(machine: &Machine, out: &mut Vec<Finding>) {
    let env = &machine.environment;
    match &machine.vulkan {
        VulkanProbe::LoaderMissing(why) => out.push(finding(
            Problem::NoVulkanLoader,
            Severity::Error,
            format!("no Vulkan loader: {why}"),
            format!(
                "install the Vulkan loader: `apt-get install libvulkan1` (Debian, Ubuntu), \
                 `dnf install vulkan-loader` (Fedora, RHEL); in a container, install it in the \
                 image (the NVIDIA container toolkit mounts the driver, not the loader); or set \
                 {} to the loader's path",
                crate::driver::dynlib::VULKAN_ENV
            ),
        )),
        VulkanProbe::Failed(why) => out.push(finding(
            Problem::VulkanFailed,
            Severity::Error,
            format!("Vulkan failed: {why}"),
            "run `vulkaninfo --summary` (package vulkan-tools) and, for the loader's own account, \
             set VK_LOADER_DEBUG=error,warn"
                .into(),
        )),
        VulkanProbe::NoDriver(_) | VulkanProbe::Devices(_) => {
            let devices = machine.vulkan_devices();
            if devices.iter().any(|d| d.is_nvidia()) {
                return;
            }
            let present = if devices.is_empty() {
                match &machine.vulkan {
                    VulkanProbe::NoDriver(why) => format!("no Vulkan driver at all ({why})"),
                    _ => "no Vulkan device at all".to_string(),
                }
            } else {
                let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
                format!("only {}", names.join(", "))
            };
            let cuda_present = !matches!(machine.cuda, CudaProbe::DriverMissing(_));
            let fix = if env.lacks_graphics_capability(cuda_present) {
                let caps = match &env.driver_capabilities {
                    Some(c) => format!("NVIDIA_DRIVER_CAPABILITIES={c}"),
                    None => "NVIDIA_DRIVER_CAPABILITIES is unset, so the toolkit's default \
                             compute,utility applies"
                        .to_string(),
                };
                format!(
                    "this container does not expose the NVIDIA driver's graphics capability \
                     ({caps}), which is what installs the Vulkan ICD (nvidia_icd.json and \
                     libGLX_nvidia.so.0): start it with \
                     NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics (or all), e.g. \
                     `docker run --gpus all -e NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics ...`"
                )
            } else if let Some(m) = env.nvidia_manifests().next() {
                format!(
                    "the NVIDIA ICD manifest {} is there but the loader found no NVIDIA device: \
                     the library it names (libGLX_nvidia.so.0) may be missing or from another \
                     driver version than the kernel module; VK_LOADER_DEBUG=error,warn shows why",
                    m.display()
                )
            } else {
                let searched: Vec<String> = env
                    .icd_searched
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect();
                format!(
                    "the NVIDIA Vulkan ICD manifest (nvidia_icd.json) is missing (looked in {}): \
                     install the driver's Vulkan part (Debian: nvidia-vulkan-icd; Ubuntu: \
                     libnvidia-gl-<version>; the .run installer unless --no-opengl-files), or \
                     name the manifest in VK_DRIVER_FILES. On a machine without an NVIDIA GPU \
                     vkgdr cannot map GPU memory",
                    if searched.is_empty() {
                        "nowhere".to_string()
                    } else {
                        searched.join(", ")
                    }
                )
            };
            out.push(finding(
                Problem::NoNvidiaVulkanDevice,
                Severity::Error,
                format!("Vulkan shows no NVIDIA device: {present}"),
                fix,
            ));
        }
    }
}

fn cuda_findings(machine: &Machine, out: &mut Vec<Finding>) {
    let container_hint = if machine.environment.in_container {
        "; in a container, run it with the NVIDIA runtime (`docker run --gpus all`) and \
         NVIDIA_DRIVER_CAPABILITIES including compute"
    } else {
        ""
    };
    match &machine.cuda {
        CudaProbe::DriverMissing(why) => out.push(finding(
            Problem::NoCudaDriver,
            Severity::Error,
            format!("no CUDA driver: {why}"),
            format!(
                "install the NVIDIA driver (libcuda.so.1 comes with it){container_hint}; or set \
                 {} to its path. Without it only the Vulkan half of vkgdr works",
                crate::driver::dynlib::CUDA_ENV
            ),
        )),
        CudaProbe::Failed(why) => out.push(finding(
            Problem::CudaFailed,
            Severity::Error,
            format!("the CUDA driver failed: {why}"),
            format!(
                "check `nvidia-smi`: the kernel module must be loaded and match libcuda's \
                 version{container_hint}"
            ),
        )),
        CudaProbe::Devices { devices, .. } if devices.is_empty() => out.push(finding(
            Problem::NoCudaDevice,
            Severity::Error,
            "the CUDA driver reports no device".into(),
            format!(
                "check `nvidia-smi` and CUDA_VISIBLE_DEVICES (an empty or wrong value hides \
                 every device){container_hint}"
            ),
        )),
        CudaProbe::Devices { .. } => {}
    }
}

fn device_findings(machine: &Machine, dev: &CudaDeviceInfo, out: &mut Vec<Finding>) {
    let ordinal = dev.ordinal;
    let who = format!(
        "CUDA device {ordinal} ({}, {})",
        dev.name,
        format_uuid(&dev.uuid)
    );
    let nvidia: Vec<&PhysicalDeviceInfo> = machine
        .vulkan_devices()
        .iter()
        .filter(|d| d.is_nvidia())
        .collect();
    match machine.vulkan_twin(dev) {
        // Without any NVIDIA Vulkan device the Vulkan finding already names the fix.
        None if nvidia.is_empty() => {}
        None => {
            let have: Vec<String> = nvidia
                .iter()
                .map(|d| format!("{} [{}]", d.name, d.uuid_string()))
                .collect();
            out.push(finding(
                Problem::NoVulkanTwin { ordinal },
                Severity::Error,
                format!(
                    "{who} has no Vulkan device with the same UUID (NVIDIA Vulkan devices: {})",
                    have.join(", ")
                ),
                "the Vulkan ICD and libcuda must come from the same driver installation (compare \
                 `vulkaninfo --summary` with `nvidia-smi`); MIG instances are invisible to Vulkan \
                 (use a whole GPU); a Vulkan device-select layer or VK_DRIVER_FILES may hide the \
                 device"
                    .into(),
            ));
        }
        Some(v) => {
            if !v.has_external_memory_fd {
                out.push(finding(
                    Problem::NoExternalMemoryFd { ordinal },
                    Severity::Error,
                    format!("{who}: its Vulkan driver lacks VK_KHR_external_memory_fd"),
                    "update the NVIDIA driver (every driver since 2018 has it)".into(),
                ));
            }
            match v.choose_memory_type(MemoryOptions::default()) {
                Err(_) => out.push(finding(
                    Problem::NoBarMemoryType { ordinal },
                    Severity::Error,
                    format!(
                        "{who}: no DEVICE_LOCAL|HOST_VISIBLE memory type: the BAR is not mappable"
                    ),
                    "enable Resizable BAR and Above 4G Decoding in the firmware setup (GeForce \
                     and RTX cards), pass the whole BAR through to a VM, use a recent driver"
                        .into(),
                )),
                Ok(t) => {
                    let heap = v.memory_heaps[t.heap as usize].size;
                    let bar1 = dev.bar.as_ref().ok().and_then(|b| b.bar1.as_ref().ok());
                    let small = heap < SMALL_BAR || bar1.is_some_and(|b| b.total < SMALL_BAR);
                    if small {
                        let aperture = bar1
                            .map(|b| format!(", BAR1 aperture {}", gib(b.total)))
                            .unwrap_or_default();
                        out.push(finding(
                            Problem::SmallBar { ordinal },
                            Severity::Warning,
                            format!(
                                "{who}: BAR-mappable memory is small (memory type {} in a {} \
                                 heap{aperture}): resizable BAR is off",
                                t.index,
                                gib(heap)
                            ),
                            "enable Resizable BAR and Above 4G Decoding in the firmware setup; \
                             until then keep pools small (PoolConfig::with_bar_budget) and treat \
                             OUT_OF_DEVICE_MEMORY as normal"
                                .into(),
                        ));
                    }
                }
            }
        }
    }
    if !dev.vmm || !dev.posix_fd {
        let missing = match (dev.vmm, dev.posix_fd) {
            (false, false) => "CUDA VMM and POSIX fd handles",
            (false, true) => "CUDA VMM",
            _ => "POSIX fd handles for VMM",
        };
        out.push(finding(
            Problem::VmmUnsupported { ordinal },
            Severity::Warning,
            format!("{who}: {missing} unsupported"),
            "arenas, Pool::on_arena's contiguous range and mirrored rings need them \
             (Pool::on_arena falls back to separate chunks; DeviceRing::new and plain pools \
             work); they need a Linux driver of R450 or later on bare metal or full \
             pass-through (some vGPU setups turn VMM off)"
                .into(),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::nvml::Bar1Memory;
    use crate::driver::vulkan::{MemoryHeapInfo, MemoryTypeInfo};
    use ash::vk;

    const UUID: [u8; 16] = [7; 16];

    fn vulkan_device(name: &str, vendor_id: u32, uuid: [u8; 16]) -> PhysicalDeviceInfo {
        PhysicalDeviceInfo {
            index: 0,
            name: name.into(),
            vendor_id,
            uuid,
            driver: "test".into(),
            api_version: "1.3.0".into(),
            device_type: vk::PhysicalDeviceType::DISCRETE_GPU,
            memory_types: vec![
                MemoryTypeInfo {
                    index: 0,
                    heap: 0,
                    flags: vk::MemoryPropertyFlags::DEVICE_LOCAL,
                },
                MemoryTypeInfo {
                    index: 1,
                    heap: 0,
                    flags: vk::MemoryPropertyFlags::DEVICE_LOCAL
                        | vk::MemoryPropertyFlags::HOST_VISIBLE
                        | vk::MemoryPropertyFlags::HOST_COHERENT,
                },
            ],
            memory_heaps: vec![MemoryHeapInfo {
                size: 80 << 30,
                flags: vk::MemoryHeapFlags::DEVICE_LOCAL,
            }],
            non_coherent_atom_size: 64,
            max_allocation_size: 1 << 40,
            has_external_memory_fd: true,
        }
    }

    fn h100() -> PhysicalDeviceInfo {
        vulkan_device("NVIDIA H100", vulkan::NVIDIA_VENDOR_ID, UUID)
    }

    fn lavapipe() -> PhysicalDeviceInfo {
        let mut d = vulkan_device("llvmpipe", 0x10005, [0x6d; 16]);
        d.device_type = vk::PhysicalDeviceType::CPU;
        d
    }

    fn bar(total: u64) -> BarInfo {
        let b = Bar1Memory {
            total,
            free: total,
            used: 0,
        };
        BarInfo {
            pci: None,
            bar1: Ok(b),
            vram_total: 80 << 30,
            vram_used: 1 << 30,
            vram_source: crate::mapping::bar::VramSource::Nvml,
            estimate: crate::mapping::bar::estimate_mappable(80 << 30, 1 << 30, Some(&b)),
        }
    }

    fn cuda_device(ordinal: i32, uuid: [u8; 16]) -> CudaDeviceInfo {
        CudaDeviceInfo {
            ordinal,
            name: "NVIDIA H100".into(),
            uuid,
            pci: None,
            total_mem: 80 << 30,
            vmm: true,
            posix_fd: true,
            granularity: Ok(2 << 20),
            bar: Ok(bar(128 << 30)),
        }
    }

    fn nvml_present() -> NvmlProbe {
        NvmlProbe::Devices {
            driver_version: "580.159.04".into(),
            devices: Vec::new(),
        }
    }

    /// The GPU machine: one H100 seen by CUDA, Vulkan and NVML.
    fn healthy() -> Machine {
        Machine {
            vulkan: VulkanProbe::Devices(vec![h100()]),
            cuda: CudaProbe::Devices {
                version: 13000,
                devices: vec![cuda_device(0, UUID)],
            },
            nvml: nvml_present(),
            environment: Environment {
                icd_searched: vec!["/usr/share/vulkan/icd.d".into()],
                icd_manifests: vec!["/usr/share/vulkan/icd.d/nvidia_icd.json".into()],
                ..Default::default()
            },
        }
    }

    fn problems(m: &Machine) -> Vec<Problem> {
        diagnose(m).into_iter().map(|f| f.problem).collect()
    }

    fn only(m: &Machine) -> Finding {
        let f = diagnose(m);
        assert_eq!(f.len(), 1, "expected one finding, got {f:#?}");
        f.into_iter().next().unwrap()
    }

    #[test]
    fn a_healthy_machine_has_no_findings() {
        assert_eq!(diagnose(&healthy()), Vec::new());
    }

    #[test]
    fn no_vulkan_loader() {
        let mut m = healthy();
        m.vulkan = VulkanProbe::LoaderMissing("library libvulkan.so.1 not found".into());
        let f = only(&m);
        assert_eq!(f.problem, Problem::NoVulkanLoader);
        assert_eq!(f.severity, Severity::Error);
        assert!(f.fix.contains("apt-get install libvulkan1"), "{}", f.fix);
        assert!(f.fix.contains("VKGDR_VULKAN_LIBRARY"), "{}", f.fix);
    }

    #[test]
    fn lavapipe_only_with_the_nvidia_manifest_missing() {
        let mut m = healthy();
        m.vulkan = VulkanProbe::Devices(vec![lavapipe()]);
        m.environment.icd_manifests = vec!["/usr/share/vulkan/icd.d/lvp_icd.x86_64.json".into()];
        let f = only(&m);
        assert_eq!(f.problem, Problem::NoNvidiaVulkanDevice);
        assert!(f.what.contains("only llvmpipe"), "{}", f.what);
        assert!(f.fix.contains("nvidia_icd.json) is missing"), "{}", f.fix);
        assert!(f.fix.contains("/usr/share/vulkan/icd.d"), "{}", f.fix);
    }

    #[test]
    fn a_container_without_the_graphics_capability() {
        for caps in [Some("compute,utility"), None] {
            let mut m = healthy();
            m.vulkan = VulkanProbe::NoDriver(
                "vkCreateInstance failed: VK_ERROR_INCOMPATIBLE_DRIVER".into(),
            );
            m.environment.icd_manifests.clear();
            m.environment.in_container = true;
            m.environment.driver_capabilities = caps.map(String::from);
            let f = only(&m);
            assert_eq!(f.problem, Problem::NoNvidiaVulkanDevice);
            assert!(f.what.contains("no Vulkan driver at all"), "{}", f.what);
            assert!(
                f.fix
                    .contains("NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics"),
                "{}",
                f.fix
            );
        }
        // `all` or an explicit `graphics` is not the problem: the manifest is.
        let mut env = Environment {
            in_container: true,
            driver_capabilities: Some("all".into()),
            ..Default::default()
        };
        assert!(!env.lacks_graphics_capability(true));
        env.driver_capabilities = Some("compute, graphics".into());
        assert!(!env.lacks_graphics_capability(true));
        // Unset: only a container the toolkit gave a CUDA driver is missing the capability.
        env.driver_capabilities = None;
        assert!(env.lacks_graphics_capability(true));
        assert!(!env.lacks_graphics_capability(false));
        env.in_container = false;
        assert!(!env.lacks_graphics_capability(true));
    }

    #[test]
    fn a_container_without_any_nvidia_driver_is_not_blamed_on_capabilities() {
        // A container (like CI's) with lavapipe, no CUDA and no NVIDIA toolkit variables.
        let mut m = healthy();
        m.vulkan = VulkanProbe::Devices(vec![lavapipe()]);
        m.cuda = CudaProbe::DriverMissing("library libcuda.so.1 not found".into());
        m.environment.icd_manifests.clear();
        m.environment.in_container = true;
        let f = &diagnose(&m)[0];
        assert_eq!(f.problem, Problem::NoNvidiaVulkanDevice);
        assert!(f.fix.contains("nvidia_icd.json) is missing"), "{}", f.fix);
        assert!(!f.fix.contains("graphics capability"), "{}", f.fix);
    }

    #[test]
    fn the_nvidia_manifest_present_but_no_device() {
        let mut m = healthy();
        m.vulkan = VulkanProbe::Devices(vec![lavapipe()]);
        let f = only(&m);
        assert_eq!(f.problem, Problem::NoNvidiaVulkanDevice);
        assert!(f.fix.contains("nvidia_icd.json is there"), "{}", f.fix);
        assert!(f.fix.contains("VK_LOADER_DEBUG"), "{}", f.fix);
    }

    #[test]
    fn no_cuda_driver() {
        let mut m = healthy();
        m.cuda = CudaProbe::DriverMissing("library libcuda.so.1 not found".into());
        m.nvml = NvmlProbe::Unavailable("library libnvidia-ml.so.1 not found".into());
        // NVML's absence is not worth a note when CUDA is missing anyway.
        let f = only(&m);
        assert_eq!(f.problem, Problem::NoCudaDriver);
        assert!(f.fix.contains("install the NVIDIA driver"), "{}", f.fix);
        assert!(!f.fix.contains("docker"), "{}", f.fix);
        m.environment.in_container = true;
        assert!(only(&m).fix.contains("--gpus all"));
    }

    #[test]
    fn cuda_failures_and_no_devices() {
        let mut m = healthy();
        m.cuda = CudaProbe::Failed("cuInit failed: CUDA_ERROR_NO_DEVICE (100)".into());
        assert_eq!(problems(&m), [Problem::CudaFailed]);
        m.cuda = CudaProbe::Devices {
            version: 13000,
            devices: Vec::new(),
        };
        let f = only(&m);
        assert_eq!(f.problem, Problem::NoCudaDevice);
        assert!(f.fix.contains("CUDA_VISIBLE_DEVICES"), "{}", f.fix);
    }

    #[test]
    fn a_cuda_device_without_its_vulkan_twin() {
        let mut m = healthy();
        m.cuda = CudaProbe::Devices {
            version: 13000,
            devices: vec![cuda_device(0, UUID), cuda_device(1, [9; 16])],
        };
        let f = only(&m);
        assert_eq!(f.problem, Problem::NoVulkanTwin { ordinal: 1 });
        assert!(f.what.contains("CUDA device 1"), "{}", f.what);
        assert!(f.what.contains(&format_uuid(&UUID)), "{}", f.what);
        assert!(f.fix.contains("MIG"), "{}", f.fix);
    }

    #[test]
    fn no_host_visible_device_local_memory() {
        let mut m = healthy();
        let mut v = h100();
        v.memory_types.retain(|t| !t.is_bar_mappable());
        m.vulkan = VulkanProbe::Devices(vec![v]);
        let f = only(&m);
        assert_eq!(f.problem, Problem::NoBarMemoryType { ordinal: 0 });
        assert!(f.fix.contains("Resizable BAR"), "{}", f.fix);
    }

    #[test]
    fn a_small_bar_is_a_warning() {
        // The mappable type in a 256 MiB heap of its own (GeForce without resizable BAR).
        let mut m = healthy();
        let mut v = h100();
        v.memory_heaps.push(MemoryHeapInfo {
            size: 256 << 20,
            flags: vk::MemoryHeapFlags::DEVICE_LOCAL,
        });
        v.memory_types[1].heap = 1;
        m.vulkan = VulkanProbe::Devices(vec![v]);
        let f = only(&m);
        assert_eq!(f.problem, Problem::SmallBar { ordinal: 0 });
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.what.contains("0.25 GiB heap"), "{}", f.what);
        // A big heap but a 256 MiB BAR1 aperture (NVML) is small too.
        let mut m = healthy();
        if let CudaProbe::Devices { devices, .. } = &mut m.cuda {
            devices[0].bar = Ok(bar(256 << 20));
        }
        let f = only(&m);
        assert_eq!(f.problem, Problem::SmallBar { ordinal: 0 });
        assert!(f.what.contains("BAR1 aperture 0.25 GiB"), "{}", f.what);
    }

    #[test]
    fn no_external_memory_fd() {
        let mut m = healthy();
        let mut v = h100();
        v.has_external_memory_fd = false;
        m.vulkan = VulkanProbe::Devices(vec![v]);
        assert_eq!(problems(&m), [Problem::NoExternalMemoryFd { ordinal: 0 }]);
    }

    #[test]
    fn vmm_unsupported() {
        for (vmm, fd, text) in [
            (false, true, "CUDA VMM unsupported"),
            (true, false, "POSIX fd handles for VMM unsupported"),
            (false, false, "CUDA VMM and POSIX fd handles unsupported"),
        ] {
            let mut m = healthy();
            if let CudaProbe::Devices { devices, .. } = &mut m.cuda {
                devices[0].vmm = vmm;
                devices[0].posix_fd = fd;
            }
            let f = only(&m);
            assert_eq!(f.problem, Problem::VmmUnsupported { ordinal: 0 });
            assert_eq!(f.severity, Severity::Warning);
            assert!(f.what.contains(text), "{}", f.what);
        }
    }

    #[test]
    fn no_nvml_is_a_note() {
        let mut m = healthy();
        m.nvml = NvmlProbe::Unavailable("library libnvidia-ml.so.1 not found".into());
        let f = only(&m);
        assert_eq!(f.problem, Problem::NoNvml);
        assert_eq!(f.severity, Severity::Note);
    }

    #[test]
    fn findings_come_most_severe_first() {
        // The CI machine: lavapipe, no CUDA, no NVML.
        let m = Machine {
            vulkan: VulkanProbe::Devices(vec![lavapipe()]),
            cuda: CudaProbe::DriverMissing("library libcuda.so.1 not found".into()),
            nvml: NvmlProbe::Unavailable("library libnvidia-ml.so.1 not found".into()),
            environment: Environment::default(),
        };
        assert_eq!(
            problems(&m),
            [Problem::NoNvidiaVulkanDevice, Problem::NoCudaDriver]
        );
        // A small BAR, no VMM and no NVML at once: warnings before the note.
        let mut m = healthy();
        m.nvml = NvmlProbe::Unavailable("absent".into());
        if let CudaProbe::Devices { devices, .. } = &mut m.cuda {
            devices[0].vmm = false;
            devices[0].bar = Ok(bar(256 << 20));
        }
        let severities: Vec<Severity> = diagnose(&m).iter().map(|f| f.severity).collect();
        assert_eq!(
            severities,
            [Severity::Warning, Severity::Warning, Severity::Note]
        );
    }

    #[test]
    fn icd_search_follows_the_loader() {
        let dirs = icd_directories(None, None, Some("/home/u".into()));
        let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        assert_eq!(
            dirs,
            [
                "/etc/xdg/vulkan/icd.d",
                "/etc/vulkan/icd.d",
                "/usr/local/share/vulkan/icd.d",
                "/usr/share/vulkan/icd.d",
                "/home/u/.local/share/vulkan/icd.d"
            ]
        );
        let env = Environment {
            icd_manifests: vec![
                "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json".into(),
                "/etc/vulkan/icd.d/nvidia_icd.json".into(),
            ],
            ..Default::default()
        };
        let nvidia: Vec<&PathBuf> = env.nvidia_manifests().collect();
        assert_eq!(
            nvidia,
            [&PathBuf::from("/etc/vulkan/icd.d/nvidia_icd.json")]
        );
    }

    #[test]
    fn findings_print_what_and_fix() {
        let mut m = healthy();
        m.vulkan = VulkanProbe::LoaderMissing("gone".into());
        let text = only(&m).to_string();
        assert!(
            text.starts_with("error: no Vulkan loader: gone\n  fix: "),
            "{text}"
        );
    }
}

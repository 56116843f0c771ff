//! The first half of `vkgdr info`: [`Machine::probe`] describes what this machine offers —
//! the Vulkan devices, the CUDA devices with their VMM support and BAR figures, NVML, the ICD
//! manifests on disk and the container's driver capabilities — and never fails: every missing
//! piece is part of the description.

use std::path::{Path, PathBuf};

use crate::driver::cuda::{self, Driver};
use crate::driver::nvml::{Nvml, NvmlDevice, PciAddress};
use crate::driver::vulkan::{self, PhysicalDeviceInfo};
use crate::error::{Error, Result};
use crate::mapping::bar::{cuda_pci_address, device_bar_info, BarInfo};

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
pub(super) fn icd_directories(
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

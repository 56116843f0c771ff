//! The machine a command ran on ([`MachineJson`]): the CPU, the Vulkan and CUDA devices with their
//! BAR figures, NVML, the environment and the diagnosis `vkgdr info` prints; by itself it is
//! `vkgdr info --json` ([`InfoDocument`]).

use serde::{Deserialize, Serialize};
use vkgdr::bar::VramSource;
use vkgdr::diagnose::{
    diagnose, CudaProbe, Finding, Machine, NvmlProbe, Problem, Severity, VulkanProbe,
};
use vkgdr::vulkan::{self, MemoryOptions, PhysicalDeviceInfo};

use super::document::About;

/// `vkgdr info --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InfoDocument {
    /// `format: "vkgdr-info"`.
    #[serde(flatten)]
    pub about: About,
    /// What was found.
    pub machine: MachineJson,
    /// The devices `--check` judges and its verdict (`null`: `--device`/`--devices` named a
    /// device that is not here, see `error`).
    #[serde(default)]
    pub checked: Option<CheckedJson>,
    /// Why the devices asked for could not be checked.
    #[serde(default)]
    pub error: Option<String>,
}

/// What `vkgdr info --check` judges: the devices `--device`/`--devices` name (every CUDA
/// device present by default) and the machine-wide findings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckedJson {
    /// Their CUDA ordinals.
    pub devices: Vec<i32>,
    /// Whether vkgdr can open each of them (no `error` finding of the machine or of one of
    /// them): what `--check` exits 0 for.
    pub usable: bool,
}

/// One CUDA device a command worked on: its ordinal, UUID and name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceJson {
    /// CUDA ordinal (in the process that ran: `CUDA_VISIBLE_DEVICES` may renumber).
    pub ordinal: i32,
    /// `cuDeviceGetUuid`, as the machine section writes UUIDs.
    pub uuid: String,
    /// `cuDeviceGetName`.
    pub name: String,
}

impl DeviceJson {
    /// A device present here.
    pub fn of(p: &crate::device::Present) -> DeviceJson {
        DeviceJson {
            ordinal: p.ordinal,
            uuid: vulkan::format_uuid(&p.uuid),
            name: p.name.clone(),
        }
    }
}

/// The machine: what `vkgdr info` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineJson {
    /// The CPU and the copy routines chosen for it.
    pub cpu: CpuJson,
    /// The Vulkan side.
    pub vulkan: VulkanJson,
    /// The CUDA side, with each device's BAR figures.
    pub cuda: CudaJson,
    /// NVML (BAR1 figures).
    pub nvml: NvmlJson,
    /// Vulkan ICD manifests and container facts that explain a missing driver.
    pub environment: EnvironmentJson,
    /// The problems found, most severe first, each with its fix.
    pub diagnosis: Vec<FindingJson>,
    /// Whether vkgdr can open every CUDA device here (no finding of severity `error`): what
    /// `vkgdr info --check` exits 0 for.
    pub usable: bool,
}

/// The CPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuJson {
    /// `/proc/cpuinfo`'s model name, when there is one.
    pub model: Option<String>,
    /// Hardware threads available to this process.
    pub hardware_threads: usize,
    /// The copy routines in use (`vkgdr::copy::simd_level`).
    pub copy_routines: String,
    /// How pools' per-thread caches are reached from other threads
    /// (`vkgdr::pool::magazine::handshake`): `membarrier` (no barrier on a thread's own cached
    /// allocations and frees) or `fence` (a full barrier on each); absent from documents of
    /// earlier versions.
    #[serde(default)]
    pub thread_cache_handshake: Option<String>,
}

/// The Vulkan side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VulkanJson {
    /// `ok`, `loader_missing`, `no_driver` or `failed`.
    pub status: String,
    /// Why Vulkan is not usable (`null` when `status` is `ok`).
    pub error: Option<String>,
    /// The physical devices.
    pub devices: Vec<VulkanDeviceJson>,
}

/// One Vulkan physical device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VulkanDeviceJson {
    /// Enumeration index.
    pub index: usize,
    /// `deviceName`.
    pub name: String,
    /// PCI vendor ID (0x10de for NVIDIA).
    pub vendor_id: u32,
    /// Discrete GPU, CPU, ...
    pub device_type: String,
    /// The device's Vulkan version.
    pub api_version: String,
    /// `deviceUUID` (the CUDA UUID of the same GPU).
    pub uuid: String,
    /// Driver name and version.
    pub driver: String,
    /// `nonCoherentAtomSize`.
    pub non_coherent_atom_size_bytes: u64,
    /// `maxMemoryAllocationSize`.
    pub max_allocation_size_bytes: u64,
    /// Whether `VK_KHR_external_memory_fd` is offered.
    pub external_memory_fd: bool,
    /// The memory heaps.
    pub memory_heaps: Vec<HeapJson>,
    /// The memory types.
    pub memory_types: Vec<MemoryTypeJson>,
    /// The memory type vkgdr maps (`null` when the device is unusable, see `unusable`).
    pub bar_memory_type: Option<u32>,
    /// Whether that type is host-coherent (no flushes needed).
    pub bar_memory_coherent: Option<bool>,
    /// Why vkgdr cannot use this device (`null`: it can).
    pub unusable: Option<String>,
}

/// One memory heap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeapJson {
    /// Heap size.
    pub size_bytes: u64,
    /// Its flags, as Vulkan names them.
    pub flags: String,
}

/// One memory type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryTypeJson {
    /// Index in the device's memory types.
    pub index: u32,
    /// The heap it allocates from.
    pub heap: u32,
    /// Property flags (`DEVICE_LOCAL`, `HOST_VISIBLE`, ...).
    pub flags: Vec<String>,
}

/// The CUDA side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CudaJson {
    /// `ok`, `driver_missing` or `failed`.
    pub status: String,
    /// Why CUDA is not usable (`null` when `status` is `ok`).
    pub error: Option<String>,
    /// The CUDA version of the driver, `major.minor` (`cuDriverGetVersion`).
    pub driver_cuda_version: Option<String>,
    /// The devices.
    pub devices: Vec<CudaDeviceJson>,
}

/// One CUDA device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CudaDeviceJson {
    /// CUDA ordinal.
    pub ordinal: i32,
    /// `cuDeviceGetName`.
    pub name: String,
    /// `cuDeviceGetUuid`.
    pub uuid: String,
    /// PCI address, `dddd:bb:dd.0`.
    pub pci: Option<String>,
    /// Device memory.
    pub total_memory_bytes: u64,
    /// The index of the Vulkan device with the same UUID (`null`: none, vkgdr cannot open it).
    pub vulkan_device: Option<usize>,
    /// CUDA virtual memory management (arenas, mirrored rings).
    pub vmm: bool,
    /// POSIX fd handles for VMM.
    pub posix_fd_handles: bool,
    /// VMM allocation granularity.
    pub granularity_bytes: Option<u64>,
    /// Why the granularity is unknown.
    pub granularity_error: Option<String>,
    /// BAR figures.
    pub bar: Option<BarJson>,
    /// Why the BAR figures could not be read.
    pub bar_error: Option<String>,
}

/// BAR figures of one device (`vkgdr::bar::BarInfo`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BarJson {
    /// NVML's BAR1 aperture size.
    pub bar1_total_bytes: Option<u64>,
    /// NVML's BAR1 bytes not mapped.
    pub bar1_free_bytes: Option<u64>,
    /// NVML's BAR1 bytes mapped, by every process (each mapped byte counts twice).
    pub bar1_used_bytes: Option<u64>,
    /// Why there are no BAR1 figures.
    pub bar1_error: Option<String>,
    /// Device memory.
    pub vram_total_bytes: u64,
    /// Device memory in use by every process and the driver.
    pub vram_used_bytes: u64,
    /// Where the VRAM figures come from: `cuda` (`cuMemGetInfo`) or `nvml`.
    pub vram_source: String,
    /// What this process can probably still map.
    pub mappable_estimate_bytes: u64,
    /// The rule and figures behind the estimate.
    pub estimate_basis: String,
}

/// NVML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NvmlJson {
    /// `ok` or `unavailable`.
    pub status: String,
    /// Why NVML is unavailable.
    pub error: Option<String>,
    /// The driver version (`nvmlSystemGetDriverVersion`).
    pub driver_version: Option<String>,
    /// How many devices NVML sees.
    pub devices: usize,
}

/// Facts about the environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvironmentJson {
    /// The Vulkan ICD manifests found.
    pub icd_manifests: Vec<String>,
    /// `NVIDIA_DRIVER_CAPABILITIES`, when set.
    pub driver_capabilities: Option<String>,
    /// Whether this looks like a container.
    pub in_container: bool,
}

/// One diagnosed problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FindingJson {
    /// `error` (vkgdr cannot open a device), `warning` (a limit) or `note` (information missing).
    pub severity: String,
    /// Which problem, in snake case (`no_vulkan_loader`, `small_bar`, ...).
    pub problem: String,
    /// The CUDA device it concerns, when it concerns one.
    pub ordinal: Option<i32>,
    /// What is wrong, with the facts that show it.
    pub what: String,
    /// What to do.
    pub fix: String,
}

/// The names of the flags set in `f`, or `["none"]`.
pub fn memory_flag_names(f: ash::vk::MemoryPropertyFlags) -> Vec<&'static str> {
    use ash::vk::MemoryPropertyFlags as F;
    let names = [
        (F::DEVICE_LOCAL, "DEVICE_LOCAL"),
        (F::HOST_VISIBLE, "HOST_VISIBLE"),
        (F::HOST_COHERENT, "HOST_COHERENT"),
        (F::HOST_CACHED, "HOST_CACHED"),
        (F::LAZILY_ALLOCATED, "LAZILY_ALLOCATED"),
        (F::PROTECTED, "PROTECTED"),
    ];
    let v: Vec<&str> = names
        .iter()
        .filter(|(b, _)| f.contains(*b))
        .map(|(_, n)| *n)
        .collect();
    if v.is_empty() {
        vec!["none"]
    } else {
        v
    }
}

/// The CPU's model name from `/proc/cpuinfo`.
pub fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

fn vulkan_device(d: &PhysicalDeviceInfo) -> VulkanDeviceJson {
    let chosen = d.choose_memory_type(MemoryOptions::default());
    let unusable = match &chosen {
        Ok(_) if d.has_external_memory_fd => None,
        Ok(_) => Some("VK_KHR_external_memory_fd missing".to_string()),
        Err(e) => Some(e.to_string()),
    };
    VulkanDeviceJson {
        index: d.index,
        name: d.name.clone(),
        vendor_id: d.vendor_id,
        device_type: format!("{:?}", d.device_type),
        api_version: d.api_version.clone(),
        uuid: d.uuid_string(),
        driver: d.driver.clone(),
        non_coherent_atom_size_bytes: d.non_coherent_atom_size,
        max_allocation_size_bytes: d.max_allocation_size,
        external_memory_fd: d.has_external_memory_fd,
        memory_heaps: d
            .memory_heaps
            .iter()
            .map(|h| HeapJson {
                size_bytes: h.size,
                flags: format!("{:?}", h.flags),
            })
            .collect(),
        memory_types: d
            .memory_types
            .iter()
            .map(|t| MemoryTypeJson {
                index: t.index,
                heap: t.heap,
                flags: memory_flag_names(t.flags)
                    .into_iter()
                    .map(String::from)
                    .collect(),
            })
            .collect(),
        bar_memory_type: chosen.as_ref().ok().map(|t| t.index),
        bar_memory_coherent: chosen.as_ref().ok().map(|t| t.is_coherent()),
        unusable,
    }
}

/// The CUDA device a finding concerns (`None`: the machine as a whole).
pub fn finding_ordinal(f: &Finding) -> Option<i32> {
    problem_name(f).1
}

/// A finding's problem in snake case, and the device it concerns.
fn problem_name(f: &Finding) -> (&'static str, Option<i32>) {
    match f.problem {
        Problem::NoVulkanLoader => ("no_vulkan_loader", None),
        Problem::NoNvidiaVulkanDevice => ("no_nvidia_vulkan_device", None),
        Problem::VulkanFailed => ("vulkan_failed", None),
        Problem::NoCudaDriver => ("no_cuda_driver", None),
        Problem::CudaFailed => ("cuda_failed", None),
        Problem::NoCudaDevice => ("no_cuda_device", None),
        Problem::NoVulkanTwin { ordinal } => ("no_vulkan_twin", Some(ordinal)),
        Problem::NoExternalMemoryFd { ordinal } => ("no_external_memory_fd", Some(ordinal)),
        Problem::NoBarMemoryType { ordinal } => ("no_bar_memory_type", Some(ordinal)),
        Problem::SmallBar { ordinal } => ("small_bar", Some(ordinal)),
        Problem::VmmUnsupported { ordinal } => ("vmm_unsupported", Some(ordinal)),
        Problem::NoNvml => ("no_nvml", None),
        // A problem this program does not know by name yet: its debug form still says which.
        _ => ("other", None),
    }
}

fn finding(f: &Finding) -> FindingJson {
    let (problem, ordinal) = problem_name(f);
    FindingJson {
        severity: match f.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "note",
        }
        .to_string(),
        problem: problem.to_string(),
        ordinal,
        what: f.what.clone(),
        fix: f.fix.clone(),
    }
}

impl MachineJson {
    /// Looks at this machine ([`Machine::probe`]) and diagnoses it.
    pub fn probe() -> MachineJson {
        MachineJson::from_machine(&Machine::probe())
    }

    /// The document form of a probed machine, with its diagnosis.
    pub fn from_machine(machine: &Machine) -> MachineJson {
        let (vstatus, verror) = match &machine.vulkan {
            VulkanProbe::Devices(_) => ("ok", None),
            VulkanProbe::LoaderMissing(e) => ("loader_missing", Some(e.clone())),
            VulkanProbe::NoDriver(e) => ("no_driver", Some(e.clone())),
            VulkanProbe::Failed(e) => ("failed", Some(e.clone())),
        };
        let cuda = match &machine.cuda {
            CudaProbe::DriverMissing(e) => CudaJson {
                status: "driver_missing".into(),
                error: Some(e.clone()),
                driver_cuda_version: None,
                devices: Vec::new(),
            },
            CudaProbe::Failed(e) => CudaJson {
                status: "failed".into(),
                error: Some(e.clone()),
                driver_cuda_version: None,
                devices: Vec::new(),
            },
            CudaProbe::Devices { version, devices } => CudaJson {
                status: "ok".into(),
                error: None,
                driver_cuda_version: Some(format!("{}.{}", version / 1000, (version % 1000) / 10)),
                devices: devices
                    .iter()
                    .map(|d| CudaDeviceJson {
                        ordinal: d.ordinal,
                        name: d.name.clone(),
                        uuid: vulkan::format_uuid(&d.uuid),
                        pci: d.pci.map(|p| p.to_string()),
                        total_memory_bytes: d.total_mem,
                        vulkan_device: machine.vulkan_twin(d).map(|v| v.index),
                        vmm: d.vmm,
                        posix_fd_handles: d.posix_fd,
                        granularity_bytes: d.granularity.as_ref().ok().copied(),
                        granularity_error: d.granularity.as_ref().err().cloned(),
                        bar: d.bar.as_ref().ok().map(|b| BarJson {
                            bar1_total_bytes: b.bar1.as_ref().ok().map(|x| x.total),
                            bar1_free_bytes: b.bar1.as_ref().ok().map(|x| x.free),
                            bar1_used_bytes: b.bar1.as_ref().ok().map(|x| x.used),
                            bar1_error: b.bar1.as_ref().err().cloned(),
                            vram_total_bytes: b.vram_total,
                            vram_used_bytes: b.vram_used,
                            vram_source: match b.vram_source {
                                VramSource::Cuda => "cuda",
                                VramSource::Nvml => "nvml",
                            }
                            .to_string(),
                            mappable_estimate_bytes: b.estimate.bytes,
                            estimate_basis: b.estimate.basis.clone(),
                        }),
                        bar_error: d.bar.as_ref().err().cloned(),
                    })
                    .collect(),
            },
        };
        let nvml = match &machine.nvml {
            NvmlProbe::Devices {
                driver_version,
                devices,
            } => NvmlJson {
                status: "ok".into(),
                error: None,
                driver_version: Some(driver_version.clone()),
                devices: devices.len(),
            },
            NvmlProbe::Unavailable(e) => NvmlJson {
                status: "unavailable".into(),
                error: Some(e.clone()),
                driver_version: None,
                devices: 0,
            },
        };
        let findings = diagnose(machine);
        MachineJson {
            cpu: CpuJson {
                model: cpu_model(),
                hardware_threads: std::thread::available_parallelism().map_or(0, |n| n.get()),
                copy_routines: vkgdr::copy::simd_level().to_string(),
                thread_cache_handshake: Some(vkgdr::pool::magazine::handshake().name().into()),
            },
            vulkan: VulkanJson {
                status: vstatus.into(),
                error: verror,
                devices: machine.vulkan_devices().iter().map(vulkan_device).collect(),
            },
            cuda,
            nvml,
            environment: EnvironmentJson {
                icd_manifests: machine
                    .environment
                    .icd_manifests
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect(),
                driver_capabilities: machine.environment.driver_capabilities.clone(),
                in_container: machine.environment.in_container,
            },
            usable: !findings.iter().any(|f| f.severity == Severity::Error),
            diagnosis: findings.iter().map(finding).collect(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use vkgdr::diagnose::Environment;

    use super::*;
    use crate::json::document::{to_text, FORMAT_VERSION};

    /// A machine with no Vulkan loader and no CUDA driver, as CI can have it.
    pub(crate) fn bare_machine() -> MachineJson {
        MachineJson::from_machine(&Machine {
            vulkan: VulkanProbe::LoaderMissing("library libvulkan.so.1 not found".into()),
            cuda: CudaProbe::DriverMissing("library libcuda.so.1 not found".into()),
            nvml: NvmlProbe::Unavailable("library libnvidia-ml.so.1 not found".into()),
            environment: Environment::default(),
        })
    }

    #[test]
    fn a_machine_without_drivers_is_a_document_with_its_errors() {
        let m = bare_machine();
        assert!(!m.usable);
        assert_eq!(m.vulkan.status, "loader_missing");
        assert_eq!(m.cuda.status, "driver_missing");
        assert!(m.cuda.driver_cuda_version.is_none());
        assert!(m.diagnosis.iter().any(|f| f.severity == "error"
            && f.problem == "no_vulkan_loader"
            && f.fix.contains("libvulkan1")));
        let doc = InfoDocument {
            about: About::new("vkgdr-info"),
            machine: m,
            checked: Some(CheckedJson {
                devices: Vec::new(),
                usable: false,
            }),
            error: None,
        };
        let text = to_text(&doc);
        let back: InfoDocument = serde_json::from_str(&text).unwrap();
        assert_eq!(back, doc);
        // The opening fields sit at the top level.
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["format"], "vkgdr-info");
        assert_eq!(v["format_version"], FORMAT_VERSION);
    }

    #[test]
    fn flag_names() {
        use ash::vk::MemoryPropertyFlags as F;
        assert_eq!(
            memory_flag_names(F::DEVICE_LOCAL | F::HOST_VISIBLE),
            ["DEVICE_LOCAL", "HOST_VISIBLE"]
        );
        assert_eq!(memory_flag_names(F::empty()), ["none"]);
    }
}

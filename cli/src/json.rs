//! The JSON documents `--json` prints: one per command, each a single object on stdout.
//!
//! Every document opens with `format` (`vkgdr-info`, `vkgdr-bench`, `vkgdr-soak`),
//! `format_version` ([`FORMAT_VERSION`]) and `vkgdr_version`, and holds the `machine` it ran on:
//! the CPU, the Vulkan and CUDA devices with their BAR figures, NVML and the diagnosis `vkgdr info`
//! prints. Sizes are bytes and their fields end in `_bytes`; a benchmark figure carries its unit
//! (`ns` per operation or `GB/s`, 10⁹ bytes per second) and the anchor it is compared with, measured
//! in the same run. Where something could not be found out, the field says why (`error`) instead
//! of the document failing: `vkgdr info --json` on a machine without a GPU is a valid document.
//!
//! The types deserialize as well as serialize, so a later run can read an earlier one back.

use serde::{Deserialize, Serialize};

use vkgdr::bar::VramSource;

use crate::bench::report::method_matches;
use crate::bench::{report_spec, Anchor, Report, Row, Unit};
use vkgdr::diagnose::{
    diagnose, CudaProbe, Finding, Machine, NvmlProbe, Problem, Severity, VulkanProbe,
};
use vkgdr::vulkan::{self, MemoryOptions, PhysicalDeviceInfo};

/// The layout version of every document; raised when a field changes meaning or goes away (new
/// fields may appear without it).
pub const FORMAT_VERSION: u32 = 1;

/// What every document opens with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct About {
    /// Which document: `vkgdr-info`, `vkgdr-bench` or `vkgdr-soak`.
    pub format: String,
    /// [`FORMAT_VERSION`] of the program that wrote it.
    pub format_version: u32,
    /// The version of the `vkgdr` command that wrote it.
    pub vkgdr_version: String,
}

impl About {
    /// The opening of a document of kind `format`, written by this program.
    pub fn new(format: &str) -> About {
        About {
            format: format.to_string(),
            format_version: FORMAT_VERSION,
            vkgdr_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// Serializes a document as pretty-printed JSON with a final newline.
pub fn to_text<T: Serialize>(doc: &T) -> String {
    // The documents hold strings, integers, finite floats and options: nothing that can fail.
    let mut text = serde_json::to_string_pretty(doc).expect("documents always serialize");
    text.push('\n');
    text
}

/// `vkgdr info --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InfoDocument {
    /// `format: "vkgdr-info"`.
    #[serde(flatten)]
    pub about: About,
    /// What was found.
    pub machine: MachineJson,
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

fn finding(f: &Finding) -> FindingJson {
    let (problem, ordinal) = match f.problem {
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
    };
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

/// `vkgdr bench --json` (also written to `DIR/results.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchDocument {
    /// `format: "vkgdr-bench"`.
    #[serde(flatten)]
    pub about: About,
    /// `full`, or `quick` (`--quick`: fewer sizes and repetitions).
    pub mode: String,
    /// Where the CSVs, charts and summary went.
    pub out_dir: String,
    /// The machine, looked at after the first benchmark (so `apiperf` still meets a cold
    /// process); `null` if no benchmark ran.
    pub machine: Option<MachineJson>,
    /// Each benchmark run, in order.
    pub benchmarks: Vec<BenchRunJson>,
    /// What stopped the run outside any benchmark (an output file that could not be written).
    pub error: Option<String>,
    /// Whether every benchmark ran to the end and every output was written.
    pub ok: bool,
}

/// One benchmark of a `vkgdr bench` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRunJson {
    /// Its name (`copybw`, ...).
    pub name: String,
    /// How long it took.
    pub seconds: f64,
    /// What stopped it (`null`: it ran to the end).
    pub error: Option<String>,
    /// Its reports.
    pub reports: Vec<ReportJson>,
}

/// One report: a table of figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportJson {
    /// File stem of its CSV and PNG (`copybw-write`, ...).
    pub name: String,
    /// Its title.
    pub title: String,
    /// The unit of its figures: `ns` (per operation) or `GB/s` (10⁹ bytes per second).
    pub unit: String,
    /// Whether a higher figure is better (bandwidth) or a lower one (time).
    pub higher_is_better: bool,
    /// Remarks: what each method does, what was skipped and why.
    pub notes: Vec<String>,
    /// The figures, in measurement order.
    pub figures: Vec<FigureJson>,
}

/// One figure: a method at a size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FigureJson {
    /// What was measured.
    pub method: String,
    /// Bytes per operation (0 where a size does not apply).
    pub size_bytes: u64,
    /// `ns` or `GB/s`, as the report's.
    pub unit: String,
    /// Median over the samples.
    pub median: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Number of samples (0 for a reference value).
    pub samples: usize,
    /// `measured` here, or `reference` (quoted from elsewhere, e.g. the C library's docs).
    pub origin: String,
    /// What it is compared with, measured in the same run (`null`: nothing).
    pub anchor: Option<AnchorJson>,
}

/// The figure a figure is compared with, measured in the same run at the same size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnchorJson {
    /// The report it is in.
    pub report: String,
    /// Its method.
    pub method: String,
    /// Its median, in the same unit.
    pub median: f64,
    /// This figure's median divided by the anchor's (`null` when the anchor's is 0).
    pub ratio: Option<f64>,
}

impl ReportJson {
    /// A report's figures, each with its anchor found among `run` (every report of the run).
    pub fn new(report: &Report, run: &[&Report]) -> ReportJson {
        let spec = report_spec(&report.name);
        let unit = report.unit.csv_name().to_string();
        let figures = report
            .rows
            .iter()
            .map(|row| FigureJson {
                method: row.method.clone(),
                size_bytes: row.size,
                unit: unit.clone(),
                median: row.median,
                p10: row.p10,
                p90: row.p90,
                samples: row.samples,
                origin: if row.reference {
                    "reference"
                } else {
                    "measured"
                }
                .to_string(),
                anchor: spec.and_then(|s| anchor(s.anchor, report, row, run)),
            })
            .collect();
        ReportJson {
            name: report.name.clone(),
            title: report.title(),
            unit,
            higher_is_better: report.unit == Unit::GigabytesPerSecond,
            notes: report.notes.clone(),
            figures,
        }
    }
}

/// The anchor of `row` of `report`: the measured row that [`Anchor::of`] names, at the same
/// size, in the same run.
fn anchor(spec: Anchor, report: &Report, row: &Row, run: &[&Report]) -> Option<AnchorJson> {
    if row.reference {
        return None;
    }
    let (in_report, pattern) = spec.of(&report.name, &row.method)?;
    let other = run.iter().find(|r| r.name == in_report)?;
    let a = other.rows.iter().find(|a| {
        !a.reference
            && a.size == row.size
            && method_matches(pattern, &a.method)
            && !std::ptr::eq(*a, row)
    })?;
    let ratio = row.median / a.median;
    Some(AnchorJson {
        report: other.name.clone(),
        method: a.method.clone(),
        median: a.median,
        ratio: ratio.is_finite().then_some(ratio),
    })
}

/// `vkgdr soak --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SoakDocument {
    /// `format: "vkgdr-soak"`.
    #[serde(flatten)]
    pub about: About,
    /// What was asked for.
    pub options: SoakOptionsJson,
    /// Whether the soak passed: every figure came back, no check found wrong data, no worker
    /// failed (what exit code 0 says).
    pub passed: bool,
    /// What kept the soak from running or finishing (no GPU, a driver call that failed).
    pub error: Option<String>,
    /// The GPU's name.
    pub gpu: Option<String>,
    /// How long the measured part ran (after the warm-up).
    pub seconds: f64,
    /// The figures after the warm-up.
    pub before: Option<SoakFiguresJson>,
    /// The figures at the end.
    pub after: Option<SoakFiguresJson>,
    /// Each figure that must come back: before, after, change.
    pub checks: Vec<SoakCheckJson>,
    /// What the workers did.
    pub counters: SoakCountersJson,
    /// The errors the workers met (wrong data, unexpected failures), the first 100.
    pub errors: Vec<String>,
    /// The machine, looked at after the soak.
    pub machine: MachineJson,
}

/// `vkgdr soak`'s options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SoakOptionsJson {
    /// `--seconds`.
    pub seconds: u64,
    /// `--threads`.
    pub threads: usize,
    /// `--exhaust-every`, in seconds.
    pub exhaust_every_seconds: u64,
}

/// The figures the soak takes before and after.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoakFiguresJson {
    /// This process's open file descriptors.
    pub open_fds: u64,
    /// NVML's BAR1 used (`null`: no NVML).
    pub bar1_used_bytes: Option<u64>,
    /// Free device memory (`cuMemGetInfo`).
    pub vram_free_bytes: u64,
}

/// One figure that must come back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoakCheckJson {
    /// `open_fds`, `bar1_used` or `vram_free`.
    pub figure: String,
    /// `fds` or `bytes`.
    pub unit: String,
    /// Before (`null`: not known).
    pub before: Option<u64>,
    /// After.
    pub after: Option<u64>,
    /// After minus before (0 when either is unknown).
    pub change: i64,
    /// Whether it came back (`change` is 0).
    pub came_back: bool,
}

/// What the soak's workers did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoakCountersJson {
    /// Pool allocations and frees.
    pub pool_ops: u64,
    /// Pool allocations refused for lack of memory.
    pub pool_out_of_memory: u64,
    /// Ring records produced (each checked by the kernel).
    pub ring_records: u64,
    /// Ring pushes that timed out waiting for space.
    pub ring_full_waits: u64,
    /// Arena grow/shrink cycles.
    pub arena_cycles: u64,
    /// Arena growths refused for lack of memory.
    pub arena_out_of_memory: u64,
    /// Raw allocations made, checked and freed.
    pub raw_allocations: u64,
    /// Raw allocations refused for lack of memory.
    pub raw_out_of_memory: u64,
    /// BAR exhaustions.
    pub bar_exhaustions: u64,
    /// The most bytes raw allocations held when the BAR refused the next one.
    pub most_held_at_exhaustion_bytes: u64,
    /// Errors (wrong data, unexpected failures) in the measured part.
    pub errors: u64,
    /// Errors during the warm-up.
    pub warm_up_errors: u64,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use vkgdr::diagnose::Environment;

    /// A report read back from its JSON form: what a comparison with an earlier run reads.
    pub(crate) fn to_report(j: &ReportJson) -> Option<Report> {
        let mut r = Report::new(&j.name, Unit::parse(&j.unit)?);
        r.notes = j.notes.clone();
        r.rows = j
            .figures
            .iter()
            .map(|f| Row {
                method: f.method.clone(),
                size: f.size_bytes,
                median: f.median,
                p10: f.p10,
                p90: f.p90,
                samples: f.samples,
                reference: f.origin == "reference",
            })
            .collect();
        Some(r)
    }

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

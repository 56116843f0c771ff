//! The second half of `vkgdr info`: [`diagnose`], a pure function from a [`Machine`] to the
//! [`Finding`]s it has, each naming the problem and its fix.

use std::fmt;

use super::probe::{CudaDeviceInfo, CudaProbe, Machine, NvmlProbe, VulkanProbe};
use crate::driver::uuid::format_uuid;
use crate::driver::vulkan::{MemoryOptions, PhysicalDeviceInfo};

/// A BAR-mappable heap below this is "small": GeForce cards without resizable BAR expose 256 MiB.
pub const SMALL_BAR: u64 = 1 << 30;

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

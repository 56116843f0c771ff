//! `diagnose` fed machines CI cannot be, and the ICD search of the probe.

use std::path::PathBuf;

use ash::vk;

use super::probe::icd_directories;
use super::*;
use crate::driver::nvml::Bar1Memory;
use crate::driver::uuid::format_uuid;
use crate::driver::vulkan::{self, MemoryHeapInfo, MemoryTypeInfo, PhysicalDeviceInfo};
use crate::mapping::bar::BarInfo;

const UUID: [u8; 16] = [7; 16];

fn vulkan_device(name: &str, vendor_id: u32, uuid: [u8; 16]) -> PhysicalDeviceInfo {
    PhysicalDeviceInfo {
        index: 0,
        name: name.into(),
        vendor_id,
        uuid,
        driver_uuid: [7; 16],
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
        m.vulkan =
            VulkanProbe::NoDriver("vkCreateInstance failed: VK_ERROR_INCOMPATIBLE_DRIVER".into());
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

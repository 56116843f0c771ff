//! `vkgdr`: the command-line tool.
//!
//! - `vkgdr info [--check]` shows what the library sees on this machine (Vulkan and CUDA devices,
//!   BAR figures, NVML) and diagnoses what keeps it from working, naming the fix. With `--check` it
//!   exits 1 when a problem keeps vkgdr from opening a device (for scripts); without, a report that
//!   could be printed is a success.
//! - `vkgdr bench <copybw|copylat|fastpath|apiperf|pplat|ring|arena|all> [--out DIR] [--quick]` measures copies,
//!   latencies and API costs on the GPU and writes tables, CSVs and PNG charts (see [`mod@bench`]).
//! - `vkgdr bench plot DIR` redraws the charts from the CSVs in `DIR`.
//! - `vkgdr soak [--seconds N] [--threads N] [--exhaust-every S]` runs pool churn, rings, arena
//!   grow/shrink and BAR exhaustion together (10 minutes by default) and checks that fds, BAR1
//!   used and free VRAM come back (see [`mod@soak`]).
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod bench;
mod soak;

use std::process::ExitCode;

use vkgdr::diagnose::{diagnose, CudaProbe, Machine, NvmlProbe, Severity, VulkanProbe};
use vkgdr::vulkan::{self, MemoryOptions, PhysicalDeviceInfo};

fn usage() -> ExitCode {
    eprintln!("usage: vkgdr info [--check]");
    eprintln!("       {}", bench::USAGE);
    eprintln!("       {}", soak::USAGE);
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None => info(false),
        Some("info") => match args.get(1).map(String::as_str) {
            None => info(false),
            Some("--check") => info(true),
            Some(_) => usage(),
        },
        Some("bench") => bench::main(&args[1..]),
        Some("soak") => soak::main(&args[1..]),
        _ => usage(),
    }
}

fn flags(f: ash::vk::MemoryPropertyFlags) -> String {
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
        "none".into()
    } else {
        v.join("|")
    }
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

fn print_vulkan(devs: &[PhysicalDeviceInfo]) {
    for d in devs {
        println!(
            "  [{}] {} ({:?}), Vulkan {}",
            d.index, d.name, d.device_type, d.api_version
        );
        println!("      uuid {}", d.uuid_string());
        println!("      driver {}", d.driver);
        println!(
            "      nonCoherentAtomSize {}, maxMemoryAllocationSize {}, VK_KHR_external_memory_fd: {}",
            d.non_coherent_atom_size,
            gib(d.max_allocation_size),
            if d.has_external_memory_fd { "yes" } else { "NO" }
        );
        for (i, h) in d.memory_heaps.iter().enumerate() {
            println!("      heap {i}: {} {:?}", gib(h.size), h.flags);
        }
        for t in &d.memory_types {
            println!("      type {}: heap {} {}", t.index, t.heap, flags(t.flags));
        }
        match d.choose_memory_type(MemoryOptions::default()) {
            Ok(t) if d.has_external_memory_fd => println!(
                "      -> vkgdr uses memory type {} ({})",
                t.index,
                if t.is_coherent() {
                    "coherent"
                } else {
                    "non-coherent: flushes issued"
                }
            ),
            Ok(_) => println!("      -> unusable: VK_KHR_external_memory_fd missing"),
            Err(e) => println!("      -> unusable: {e}"),
        }
    }
}

/// `vkgdr info`: what the library sees, then the diagnosis. With `check`, exits 1 when a problem
/// keeps vkgdr from opening a device (an error finding).
fn info(check: bool) -> ExitCode {
    println!("vkgdr {}", env!("CARGO_PKG_VERSION"));
    println!("CPU copy routines: {}", vkgdr::copy::simd_level());
    let machine = Machine::probe();
    println!("Vulkan:");
    match &machine.vulkan {
        VulkanProbe::Devices(d) if d.is_empty() => println!("  no Vulkan physical devices"),
        VulkanProbe::Devices(d) => print_vulkan(d),
        VulkanProbe::LoaderMissing(why) | VulkanProbe::NoDriver(why) | VulkanProbe::Failed(why) => {
            println!("  not available: {why}")
        }
    }
    println!("CUDA:");
    print_cuda(&machine);
    println!("NVML:");
    match &machine.nvml {
        NvmlProbe::Devices {
            driver_version,
            devices,
        } => println!("  driver {driver_version}, {} device(s)", devices.len()),
        NvmlProbe::Unavailable(why) => println!("  not available: {why}"),
    }
    println!("Diagnosis:");
    let findings = diagnose(&machine);
    for f in &findings {
        println!("  {}", f.to_string().replace('\n', "\n  "));
    }
    let errors = findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .count();
    if errors == 0 {
        println!(
            "  ok: vkgdr can open every CUDA device here ({})",
            machine.cuda_devices().len()
        );
        ExitCode::SUCCESS
    } else if check {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn print_cuda(machine: &Machine) {
    let devices = match &machine.cuda {
        CudaProbe::DriverMissing(why) | CudaProbe::Failed(why) => {
            println!("  not available: {why}");
            return;
        }
        CudaProbe::Devices { version, devices } => {
            println!(
                "  driver CUDA version {}.{}, {} device(s)",
                version / 1000,
                (version % 1000) / 10,
                devices.len()
            );
            devices
        }
    };
    for d in devices {
        let pci = d.pci.map(|p| format!(", PCI {p}")).unwrap_or_default();
        println!(
            "  [{}] {}, {} total, uuid {}{pci}",
            d.ordinal,
            d.name,
            gib(d.total_mem),
            vulkan::format_uuid(&d.uuid)
        );
        match machine.vulkan_twin(d) {
            Some(v) => println!("      matches Vulkan device [{}] {}", v.index, v.name),
            None => println!("      no Vulkan device with this UUID: vkgdr cannot open it"),
        }
        let yes = |b: bool| if b { "yes" } else { "no" };
        println!(
            "      VMM: {}, POSIX fd handles: {}, granularity: {}",
            yes(d.vmm),
            yes(d.posix_fd),
            match &d.granularity {
                Ok(g) => format!("{} KiB", g >> 10),
                Err(e) => format!("unknown ({e})"),
            }
        );
        match &d.bar {
            Ok(bar) => {
                for line in bar.to_string().lines() {
                    println!("      {line}");
                }
            }
            Err(e) => println!("      BAR figures unavailable: {e}"),
        }
    }
}

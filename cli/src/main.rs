//! `vkgdr`: the command-line tool.
//!
//! - `vkgdr info` shows what the library sees on this machine.
//! - `vkgdr bench <copybw|copylat|apiperf|pplat|ring|arena|all> [--out DIR] [--quick]` measures copies,
//!   latencies and API costs on the GPU and writes tables, CSVs and PNG charts (see [`mod@bench`]).
//! - `vkgdr bench plot DIR` redraws the charts from the CSVs in `DIR`.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod bench;

use std::process::ExitCode;

use vkgdr::cuda::{self, Driver};
use vkgdr::vulkan::{self, MemoryOptions, PhysicalDeviceInfo};

fn usage() -> ExitCode {
    eprintln!("usage: vkgdr info");
    eprintln!("       {}", bench::USAGE);
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("info") | None => info(),
        Some("bench") => bench::main(&args[1..]),
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

fn info() -> ExitCode {
    println!("vkgdr {}", env!("CARGO_PKG_VERSION"));
    println!("CPU copy routines: {}", vkgdr::copy::simd_level());
    println!("Vulkan:");
    let devs = match vulkan::enumerate_devices() {
        Ok(d) => {
            if d.is_empty() {
                println!("  no Vulkan physical devices");
            }
            print_vulkan(&d);
            d
        }
        Err(e) => {
            println!("  not available: {e}");
            Vec::new()
        }
    };
    println!("CUDA:");
    let driver = match Driver::get() {
        Ok(d) => d,
        Err(e) => {
            println!("  not available: {e}");
            println!("  (no CUDA driver on this machine: only the Vulkan half can be used)");
            return ExitCode::SUCCESS;
        }
    };
    if let Err(e) = print_cuda(&driver, &devs) {
        println!("  error: {e}");
    }
    ExitCode::SUCCESS
}

fn print_cuda(driver: &Driver, devs: &[PhysicalDeviceInfo]) -> vkgdr::Result<()> {
    let v = driver.version()?;
    let n = driver.device_count()?;
    println!(
        "  driver CUDA version {}.{}, {n} device(s)",
        v / 1000,
        (v % 1000) / 10
    );
    for i in 0..n {
        let dev = driver.device(i)?;
        let uuid = driver.device_uuid(dev)?;
        let name = driver.device_name(dev)?;
        let mem = driver.device_total_mem(dev)?;
        println!(
            "  [{i}] {name}, {} total, uuid {}",
            gib(mem),
            vulkan::format_uuid(&uuid)
        );
        match devs.iter().find(|d| d.uuid == uuid) {
            Some(d) => println!("      matches Vulkan device [{}] {}", d.index, d.name),
            None => println!("      no Vulkan device with this UUID: vkgdr cannot open it"),
        }
        let vmm = driver.device_attribute(
            dev,
            cuda::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        )?;
        let fd = driver.device_attribute(
            dev,
            cuda::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
        )?;
        let gran = vkgdr::arena::granularity(driver, i).map(|g| format!("{} KiB", g >> 10));
        println!(
            "      VMM: {}, POSIX fd handles: {}, granularity: {}",
            if vmm != 0 { "yes" } else { "no" },
            if fd != 0 { "yes" } else { "no" },
            gran.unwrap_or_else(|e| format!("unknown ({e})"))
        );
    }
    Ok(())
}

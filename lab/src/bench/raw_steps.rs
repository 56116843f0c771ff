//! `apiperf`'s "step:" rows: one raw allocation taken apart into its driver calls, each timed on
//! its own, beside the library's whole allocation of the same size (a pool chunk), so that what
//! the library adds to the driver's work is a difference in one run.
//!
//! The steps are the library's own building blocks (`VulkanContext::allocate`,
//! `VulkanMemory::export_fd`, `VmmDevice`), in the order a chunk is made: the Vulkan allocation
//! and its host mapping, the opaque fd, its import as a CUDA allocation handle, a device address
//! reservation, the mapping with access, and the reverse.

use std::time::Instant;

use vkgdr::chunk::ChunkSource;
use vkgdr::vmm::VmmDevice;
use vkgdr::Gpu;

use super::error::BenchResult;
use super::measure::Stats;
use super::report::format::fmt_size;
use super::report::model::{Figure, Report};
use crate::ui;

/// Sizes taken apart: whole VMM granules (2 MiB on the H100), as pool chunks are.
pub const STEP_SIZES: [u64; 3] = [2 << 20, 64 << 20, 1 << 30];

/// The allocation's steps, in order.
pub const ALLOC_STEPS: [&str; 5] = [
    "step: vkAllocateMemory + vkMapMemory",
    "step: vkGetMemoryFdKHR (fd export, closed)",
    "step: fd export + cuMemImportFromShareableHandle",
    "step: cuMemAddressReserve",
    "step: cuMemMap + cuMemSetAccess",
];

/// The free's steps, in order.
pub const FREE_STEPS: [&str; 4] = [
    "step: cuMemUnmap",
    "step: cuMemRelease",
    "step: cuMemAddressFree",
    "step: vkUnmapMemory + vkFreeMemory",
];

/// The library's whole allocation of a pool chunk, beside its steps.
pub const CHUNK_ALLOC: &str = "pool chunk alloc (library, whole)";

/// The library's free of a pool chunk.
pub const CHUNK_FREE: &str = "pool chunk free (library: queued, released off the caller's thread)";

/// One sample of every step: nanoseconds, allocation steps then free steps.
type Sample = ([f64; ALLOC_STEPS.len()], [f64; FREE_STEPS.len()]);

/// Makes and unmakes one chunk of `size` bytes step by step.
fn sample(gpu: &Gpu, vmm: &VmmDevice, size: u64) -> BenchResult<Sample> {
    let ns = |t: Instant| t.elapsed().as_nanos() as f64;
    let mut alloc = [0.0; ALLOC_STEPS.len()];
    let mut free = [0.0; FREE_STEPS.len()];
    let t = Instant::now();
    let memory = gpu.vulkan().allocate(size)?;
    alloc[0] = ns(t);
    let t = Instant::now();
    drop(memory.export_fd()?);
    alloc[1] = ns(t);
    let t = Instant::now();
    let handle = vmm.import(&memory)?;
    alloc[2] = ns(t);
    let t = Instant::now();
    let range = vmm.reserve(size)?;
    alloc[3] = ns(t);
    let t = Instant::now();
    // SAFETY: a fresh, unmapped reservation of exactly `size` bytes; `handle` is the whole
    // `size`-byte allocation and is released only after the unmap below.
    unsafe { vmm.map_at(range.va(), size, &handle) }?;
    alloc[4] = ns(t);
    let t = Instant::now();
    // SAFETY: mapped just above with this size; nothing has used the mapping.
    unsafe { gpu.driver().cu_mem_unmap(range.va(), size as usize) }?;
    free[0] = ns(t);
    let t = Instant::now();
    drop(handle);
    free[1] = ns(t);
    let t = Instant::now();
    drop(range);
    free[2] = ns(t);
    let t = Instant::now();
    drop(memory);
    free[3] = ns(t);
    Ok((alloc, free))
}

/// Appends the step rows, the whole chunk's rows and a note with the library's share for each
/// size in [`STEP_SIZES`] that the BAR can hold; `samples` of each.
pub fn push_rows(report: &mut Report, gpu: &Gpu, samples: usize) -> BenchResult<()> {
    let vmm = VmmDevice::new(gpu.driver(), gpu.cu_device())?;
    ui::phase("raw allocation, step by step", STEP_SIZES.len() as u64);
    for &size in &STEP_SIZES {
        ui::step(format!("driver steps and pool chunk · {}", fmt_size(size)));
        if vmm.round_up(size)? != size {
            report.notes.push(format!(
                "steps of {}: not a whole number of VMM granules here ({} KiB), skipped",
                fmt_size(size),
                vmm.granularity() >> 10
            ));
            continue;
        }
        let mut steps: Vec<Sample> = Vec::with_capacity(samples);
        let (mut chunk_alloc, mut chunk_free) = (Vec::new(), Vec::new());
        let outcome = (0..=samples).try_for_each(|i| {
            let s = sample(gpu, &vmm, size)?;
            let t = Instant::now();
            let chunk = gpu.allocate_chunk(size)?;
            let a = t.elapsed().as_nanos() as f64;
            let t = Instant::now();
            drop(chunk);
            let f = t.elapsed().as_nanos() as f64;
            // The first round warms up (lazy driver state, the release thread).
            if i > 0 {
                steps.push(s);
                chunk_alloc.push(a);
                chunk_free.push(f);
            }
            Ok(())
        });
        match outcome {
            Ok(()) => {}
            // The BAR may be smaller than the largest size: a normal outcome, not a failure.
            Err(super::error::BenchError::Vkgdr(e @ vkgdr::Error::OutOfDeviceMemory { .. })) => {
                report
                    .notes
                    .push(format!("steps of {} skipped: {e}", fmt_size(size)));
                continue;
            }
            Err(e) => return Err(e),
        }
        // One row per figure; its median, for the library's share below.
        let mut row = |name: &str, v: &[f64]| {
            let s = Stats::of(v)?;
            report.figures.push(Figure::measured(name, size, &s));
            Some(s.median)
        };
        let mut driver_alloc = 0.0;
        for (k, name) in ALLOC_STEPS.iter().enumerate() {
            let v: Vec<f64> = steps.iter().map(|s| s.0[k]).collect();
            driver_alloc += row(name, &v).unwrap_or(0.0);
        }
        for (k, name) in FREE_STEPS.iter().enumerate() {
            let v: Vec<f64> = steps.iter().map(|s| s.1[k]).collect();
            row(name, &v);
        }
        let whole = row(CHUNK_ALLOC, &chunk_alloc).unwrap_or(0.0);
        row(CHUNK_FREE, &chunk_free);
        report.notes.push(format!(
            "chunk of {}: the driver steps' medians add up to {:.1} µs, the library's whole \
             allocation takes {:.1} µs: its own work is {:.1} µs ({:.1} % of the driver's)",
            fmt_size(size),
            driver_alloc / 1e3,
            whole / 1e3,
            (whole - driver_alloc) / 1e3,
            100.0 * (whole - driver_alloc) / driver_alloc.max(1.0)
        ));
    }
    // Frees of the chunks above go through the release thread: let them finish before the
    // next phase measures anything.
    if !gpu.wait_for_releases(std::time::Duration::from_secs(10)) {
        report.notes.push(format!(
            "{} chunk releases still pending 10 s after the step rows: later rows may pay for them",
            gpu.pending_releases()
        ));
    }
    Ok(())
}

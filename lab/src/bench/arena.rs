//! `arena`: the cost of growing a VMM arena by one chunk against allocating a separate chunk (same
//! run), and a kernel reading 1 GiB through one contiguous arena against 1 GiB of separate chunks.

use std::ffi::c_void;
use std::time::Instant;

use vkgdr::cuda_objects::{DeviceBuffer, LaunchConfig, Module};
use vkgdr::{Arena, OpenOptions};

use super::error::BenchResult;
use super::measure::{open_gpu, Stats};
use super::options::Options;
use super::report::format::fmt_size;
use super::report::model::{Figure, Report, Unit};
use crate::ui;

const PTX: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../kernels/mapping.ptx"
));

/// The rows (the registry names them by these).
pub mod rows {
    /// `Arena::grow` by one chunk.
    pub const GROW: &str = "arena grow by one chunk";
    /// `Arena::shrink` by one chunk.
    pub const SHRINK: &str = "arena shrink by one chunk";
    /// A separate chunk of the same size (`Gpu::alloc`).
    pub const SEPARATE_ALLOC: &str = "separate chunk alloc";
    /// Its drop.
    pub const SEPARATE_FREE: &str = "separate chunk free";
    /// One kernel reading the whole arena.
    pub const ONE_KERNEL: &str = "one kernel over the arena";
    /// One kernel per separate chunk: the row's name is their count, then this.
    pub const KERNELS_OVER_CHUNKS: &str = " kernels over separate chunks";
}

/// Runs the arena benchmark.
pub fn run(opts: &Options) -> BenchResult<Vec<Report>> {
    let gpu = open_gpu(OpenOptions::new())?;
    let module = Module::load_ptx(&gpu, PTX)?;
    let sum = module.function("sum_words")?;
    let reps = if opts.quick { 4 } else { 16 };

    let mut cost = Report::new("arena-grow", Unit::Nanoseconds);
    ui::phase("grow", 2);
    for chunk in [2u64 << 20, 64 << 20] {
        ui::step(format!("{reps} chunks of {}", fmt_size(chunk)));
        let mut arena = Arena::new(&gpu, chunk * reps as u64, chunk)?;
        let mut grow = Vec::new();
        for _ in 0..reps {
            let t = Instant::now();
            arena.grow()?;
            grow.push(t.elapsed().as_nanos() as f64);
        }
        let mut shrink = Vec::new();
        for _ in 0..reps {
            let t = Instant::now();
            arena.shrink(1)?;
            shrink.push(t.elapsed().as_nanos() as f64);
        }
        let (mut alloc, mut free) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let t = Instant::now();
            let m = gpu.alloc(chunk)?;
            alloc.push(t.elapsed().as_nanos() as f64);
            let t = Instant::now();
            drop(m);
            free.push(t.elapsed().as_nanos() as f64);
        }
        for (name, v) in [
            (rows::GROW, &grow),
            (rows::SHRINK, &shrink),
            (rows::SEPARATE_ALLOC, &alloc),
            (rows::SEPARATE_FREE, &free),
        ] {
            cost.figures.push(Figure::measured(
                name,
                chunk,
                &Stats::of(v).expect("samples"),
            ));
        }
    }
    cost.notes.push("arena grow: Vulkan allocation + fd export + cuMemImportFromShareableHandle + cuMemMap + cuMemSetAccess; separate chunk: Vulkan allocation + export + cuImportExternalMemory + cuExternalMemoryGetMappedBuffer".into());

    let mut read = Report::new("arena-read", Unit::GigabytesPerSecond);
    let chunk = 64u64 << 20;
    let chunks = if opts.quick { 4 } else { 16 };
    ui::phase("kernel reads", reps.min(8) as u64);
    let total = chunk * chunks;
    let mut arena = Arena::new(&gpu, total, chunk)?;
    for _ in 0..chunks {
        arena.grow()?;
    }
    let separate: Vec<_> = (0..chunks)
        .map(|_| gpu.alloc(chunk))
        .collect::<vkgdr::Result<_>>()?;
    let out = DeviceBuffer::new(&gpu, 8)?;
    let launch = |ptr: u64, bytes: u64| -> BenchResult<()> {
        let (mut p, mut n, mut o) = (ptr, bytes / 4, out.device_ptr());
        let mut params = [&mut p as *mut u64, &mut n, &mut o].map(|x| x.cast::<c_void>());
        // SAFETY: sum_words(const u32*, u64, u64*): three 8-byte parameters; the memory outlives
        // the synchronisation that follows every timed batch.
        unsafe { sum.launch(LaunchConfig::linear(1024, 256), None, &mut params)? };
        Ok(())
    };
    let (mut one, mut many) = (Vec::new(), Vec::new());
    for i in 0..reps.min(8) {
        ui::step(format!("repetition {}", i + 1));
        let t = Instant::now();
        launch(arena.device_ptr(), total)?;
        gpu.synchronize()?;
        one.push(total as f64 / t.elapsed().as_secs_f64() / 1e9);
        let t = Instant::now();
        for m in &separate {
            launch(m.device_ptr(), chunk)?;
        }
        gpu.synchronize()?;
        many.push(total as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    read.figures.push(Figure::measured(
        rows::ONE_KERNEL,
        total,
        &Stats::of(&one).expect("samples"),
    ));
    read.figures.push(Figure::measured(
        format!("{chunks}{}", rows::KERNELS_OVER_CHUNKS),
        total,
        &Stats::of(&many).expect("samples"),
    ));
    read.notes.push("sum_words (1024 blocks x 256 threads) reads every 4-byte word; time includes launch and synchronisation".into());
    Ok(vec![cost, read])
}

//! `apiperf`: the cost of every API call (gdrcopy's `apiperf`): opening a GPU, raw allocation
//! and free per size, the driver steps of one allocation beside the library's whole one
//! ([`raw_steps`](super::raw_steps)), pool allocation+free per size class, flush and invalidate
//! on forced non-coherent memory, and `cuMemAlloc`/`cuMemFree` for comparison, next to the C
//! library's documented costs.

use std::time::{Duration, Instant};

use vkgdr::cuda_objects::DeviceBuffer;
use vkgdr::{Gpu, OpenOptions, Pool, PoolConfig};

use crate::ui;

use super::error::{BenchError, BenchResult};
use super::measure::{
    device_ordinal, gpu_opened_before, ladder, measure, measure_pair, measure_side_by_side,
    open_gpu, Budget, Stats, Timed,
};
use super::options::Options;
use super::report::format::fmt_size;
use super::report::model::{Figure, Report, Unit};

/// The C `vkgdr` library's documented cost of a 64 KiB allocation, ns.
pub const C_ALLOC_64K_NS: f64 = 200_000.0;
/// The C `vkgdr` library's documented cost of freeing a 64 KiB allocation, ns.
pub const C_FREE_64K_NS: f64 = 108_000.0;

/// The rows the registry names ([`registry`](super::registry)).
pub mod rows {
    /// A raw allocation (`Gpu::alloc`, whole chunks from 2 MiB).
    pub const RAW_ALLOC: &str = "RawMemory alloc";
    /// Its drop.
    pub const RAW_FREE: &str = "RawMemory free";
    /// `cuMemAlloc`, the driver's own allocation.
    pub const CU_MEM_ALLOC: &str = "cuMemAlloc";
    /// `cuMemFree`.
    pub const CU_MEM_FREE: &str = "cuMemFree";
    /// A pool allocation and its drop, per size class.
    pub const POOL_PAIR: &str = "Pool alloc+free";
    /// `malloc` and `free` of the same size, measured beside each pool size (a machine row:
    /// this CPU's speed at the same work, which the comparison judges the pool's row against).
    pub const MALLOC_PAIR: &str = "malloc+free (the C library)";
}

/// Raw allocation sizes.
pub const RAW_SIZES: [u64; 5] = [4 << 10, 64 << 10, 2 << 20, 64 << 20, 1 << 30];

/// Pool size classes: 16 B … 4 KiB doubling, then 64 KiB and 1 MiB.
pub fn pool_sizes() -> Vec<u64> {
    let mut v = ladder(16, 4096, 2);
    v.extend([64 << 10, 1 << 20]);
    v
}

/// Alignment of the pool allocations.
const POOL_ALIGN: u64 = 16;

/// One `malloc(size)`/`free` pair of the C library.
fn malloc_pair(size: u64) {
    let size = std::hint::black_box(size as usize);
    // SAFETY: a plain malloc/free pair; the pointer is freed once and never dereferenced.
    unsafe { libc::free(std::hint::black_box(libc::malloc(size))) };
}

fn push(report: &mut Report, method: &str, size: u64, samples: &[f64]) {
    let s = Stats::of(samples).expect("at least one sample");
    report.figures.push(Figure::measured(method, size, &s));
}

/// Runs the benchmark: one `apiperf` report.
pub fn run(opts: &Options) -> BenchResult<Vec<Report>> {
    let q = opts.quick;
    let ms = Duration::from_millis;
    let slow = if q {
        Budget::new(ms(60), 3, 200)
    } else {
        Budget::new(ms(400), 5, 2000)
    };
    let fast = if q {
        Budget::new(ms(20), 100, 10_000)
    } else {
        Budget::new(ms(150), 1_000, 100_000)
    };
    let mut report = Report::new("apiperf", Unit::Nanoseconds);

    ui::phase("open", 2);
    ui::step("Gpu::open, first in the process");
    // Gpu::open: the first in the process also loads libcuda, runs cuInit and creates the
    // Vulkan instance and device.
    let cold = !gpu_opened_before();
    let t = Instant::now();
    let gpu = open_gpu(OpenOptions::new())?;
    let first = t.elapsed().as_nanos() as f64;
    let first_name = if cold {
        "Gpu::open (first in process)"
    } else {
        "Gpu::open (driver already loaded)"
    };
    push(&mut report, first_name, 0, &[first]);
    ui::step("Gpu::open, another handle");
    let ordinal = device_ordinal()?;
    let again = measure(
        &Budget {
            warmup: Duration::ZERO,
            ..Budget::new(if q { ms(200) } else { ms(1000) }, 3, 20)
        },
        || {
            drop(Gpu::open(ordinal)?);
            Ok(())
        },
    )?;
    push(&mut report, "Gpu::open (another handle)", 0, &again);

    ui::phase("raw allocations", RAW_SIZES.len() as u64);
    for &size in &RAW_SIZES {
        ui::step(format!("RawMemory alloc/free · {}", fmt_size(size)));
        match measure_pair(&slow, || Ok(gpu.alloc(size)?), drop) {
            Ok((alloc, free)) => {
                push(&mut report, rows::RAW_ALLOC, size, &alloc);
                push(&mut report, rows::RAW_FREE, size, &free);
            }
            // The BAR may be smaller than the largest size: a normal outcome, not a failure.
            Err(BenchError::Vkgdr(e @ vkgdr::Error::OutOfDeviceMemory { .. })) => report
                .notes
                .push(format!("RawMemory of {} skipped: {e}", fmt_size(size))),
            Err(e) => return Err(e),
        }
    }
    report.figures.push(Figure::reference(
        "C vkgdr alloc (docs)",
        64 << 10,
        C_ALLOC_64K_NS,
    ));
    report.figures.push(Figure::reference(
        "C vkgdr free (docs)",
        64 << 10,
        C_FREE_64K_NS,
    ));

    super::raw_steps::push_rows(&mut report, &gpu, if q { 3 } else { 10 })?;

    ui::phase("cuMemAlloc", RAW_SIZES.len() as u64);
    for &size in &RAW_SIZES {
        ui::step(format!("cuMemAlloc/cuMemFree · {}", fmt_size(size)));
        let (alloc, free) =
            measure_pair(&slow, || Ok(DeviceBuffer::new(&gpu, size as usize)?), drop)?;
        push(&mut report, rows::CU_MEM_ALLOC, size, &alloc);
        push(&mut report, rows::CU_MEM_FREE, size, &free);
    }

    let pool = Pool::new(gpu.clone(), PoolConfig::default())?;
    ui::phase("pool", pool_sizes().len() as u64);
    for size in pool_sizes() {
        ui::step(format!("Pool alloc+free · {}", fmt_size(size)));
        // The same loop through the C library's allocator side by side (their samples in
        // turn): how fast this CPU is at that moment, in this process (the nanosecond rows move
        // by up to 1.7x between processes of one machine; BENCHMARKS.md, 'Comparing with
        // earlier runs').
        let [pairs, mallocs]: [Vec<f64>; 2] = measure_side_by_side(
            &fast,
            &mut [
                Timed::new(|| {
                    drop(pool.alloc(size, POOL_ALIGN)?);
                    Ok(())
                }),
                Timed::new(|| {
                    malloc_pair(size);
                    Ok(())
                }),
            ],
        )?
        .try_into()
        .expect("two operations, two sample lists");
        push(&mut report, rows::POOL_PAIR, size, &pairs);
        push(&mut report, rows::MALLOC_PAIR, size, &mallocs);
    }
    drop(pool);

    // Coherent memory: flush is a no-op, shown for scale.
    ui::phase("flush/invalidate", 6);
    let mem = gpu.alloc(2 << 20)?;
    let coherent = !mem.gpu().is_non_coherent();
    for len in [64u64, 1 << 20] {
        ui::step(format!("flush · {}", fmt_size(len)));
        let s = measure(&fast, || Ok(mem.flush(0, len)?))?;
        let name = if coherent {
            "flush (coherent: no-op)"
        } else {
            "flush (non-coherent memory)"
        };
        push(&mut report, name, len, &s);
    }
    drop(mem);

    let nc = open_gpu(OpenOptions::new().force_non_coherent(true))?;
    let mem = nc.alloc(2 << 20)?;
    for len in [64u64, 1 << 20] {
        ui::step(format!("flush, forced non-coherent · {}", fmt_size(len)));
        let s = measure(&fast, || Ok(mem.flush(0, len)?))?;
        push(&mut report, "flush (forced non-coherent)", len, &s);
    }
    for len in [64u64, 1 << 20] {
        ui::step(format!(
            "invalidate, forced non-coherent · {}",
            fmt_size(len)
        ));
        let s = measure(&fast, || Ok(mem.invalidate(0, len)?))?;
        push(&mut report, "invalidate (forced non-coherent)", len, &s);
    }

    report.notes.push(format!(
        "Pool alloc+free: one pool.alloc(size, {POOL_ALIGN}) and its drop per pair, default \
         PoolConfig, chunk already allocated; timed in batches of ≥ 1 µs; beside each size, \
         malloc(size) and free in the same loop (this CPU's speed, the machine's figure)"
    ));
    report.notes.push(
        "cuMemAlloc/cuMemFree: DeviceBuffer::new and its drop (each pushes and pops the \
         context); RawMemory: Vulkan allocation + export + CUDA import + map, and the reverse"
            .into(),
    );
    report.notes.push(
        "reference rows: the C vkgdr library's documented costs at 64 KiB, not measured here"
            .into(),
    );
    Ok(vec![report])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_size_classes() {
        let v = pool_sizes();
        assert_eq!(v.first(), Some(&16));
        assert_eq!(v.len(), 9 + 2);
        assert_eq!(&v[7..], &[2048, 4096, 64 << 10, 1 << 20]);
        assert!(v.windows(2).all(|w| w[0] < w[1]));
    }
}

//! Pool benchmarks: alloc+free pairs per size class (1, 8 and 16 threads; `malloc`+`free` beside
//! them as this CPU's scale), our allocator against gpu-alloc's buddy and free-list allocators
//! over the same chunks, a random trace replayed through each and through raw allocations.
//! `vkgdr` is our pool with the default `PoolConfig` (per-thread caches of freed small blocks on);
//! `vkgdr-no-cache` sets `thread_cache = 0`. The thread rows report the time per pair of the whole
//! machine (wall time / threads) and, as throughput, pairs per second of the whole machine.
//!
//! The chunk source is the best this machine has: CUDA-imported chunks on a GPU machine, Vulkan
//! chunks where only Vulkan exists (lavapipe), host memory otherwise. Raw allocations are measured
//! only with a driver. Quick run: `cargo bench --bench pool -- --warm-up-time 1 --measurement-time 2`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::{Rng, SeedableRng};
use vkgdr::chunk::{ChunkSource, HostMemorySource};
use vkgdr::vulkan::{DeviceSelector, MemoryOptions, VulkanContext};
use vkgdr::{Backend, GpuAllocStrategy, Pool, PoolConfig};

#[derive(Clone)]
enum Source {
    Gpu(vkgdr::Gpu),
    Vulkan(Arc<VulkanContext>),
    Host,
}

impl Source {
    fn detect() -> Source {
        if let Ok(gpu) = vkgdr::Gpu::open(0) {
            return Source::Gpu(gpu);
        }
        if let Ok(v) = VulkanContext::new(DeviceSelector::FirstSuitable, MemoryOptions::default()) {
            return Source::Vulkan(v);
        }
        Source::Host
    }
    fn name(&self) -> &'static str {
        match self {
            Source::Gpu(_) => "cuda",
            Source::Vulkan(_) => "vulkan",
            Source::Host => "host",
        }
    }
    fn pool(&self, (backend, thread_cache): (Backend, usize)) -> Pool {
        let cfg = PoolConfig {
            backend,
            thread_cache,
            ..Default::default()
        };
        match self {
            Source::Gpu(g) => Pool::new(g.clone(), cfg),
            Source::Vulkan(v) => Pool::new(v.clone(), cfg),
            Source::Host => Pool::new(HostMemorySource, cfg),
        }
        .expect("pool")
    }
    fn raw(&self) -> Option<&dyn ChunkSource> {
        match self {
            Source::Gpu(g) => Some(g),
            Source::Vulkan(v) => Some(v),
            Source::Host => None,
        }
    }
}

/// Allocators compared: (name, (backend, PoolConfig::thread_cache)).
const BACKENDS: [(&str, (Backend, usize)); 4] = [
    (
        "vkgdr",
        (Backend::Native, vkgdr::pool::magazine::DEFAULT_DEPTH),
    ),
    ("vkgdr-no-cache", (Backend::Native, 0)),
    (
        "gpu-alloc-buddy",
        (Backend::GpuAlloc(GpuAllocStrategy::Buddy), 0),
    ),
    (
        "gpu-alloc-freelist",
        (Backend::GpuAlloc(GpuAllocStrategy::FreeList), 0),
    ),
];

fn pairs(c: &mut Criterion) {
    let source = Source::detect();
    let mut g = c.benchmark_group(format!("alloc_free_pair/{}", source.name()));
    g.throughput(Throughput::Elements(1));
    for (name, backend) in BACKENDS {
        let pool = source.pool(backend);
        for size in [16u64, 64, 256, 1024, 4096, 65536, 1 << 20] {
            // Keep one block alive so the chunk stays and we measure the steady state.
            let _keep = pool.alloc(size, 16).unwrap();
            g.bench_with_input(
                BenchmarkId::new(format!("{name}/1thread"), size),
                &size,
                |b, &size| b.iter(|| drop(black_box(pool.alloc(size, 16).unwrap()))),
            );
        }
    }
    // This CPU's scale, in the same run: the C library's allocator, same sizes and loop.
    for size in [16u64, 64, 256, 1024, 4096] {
        g.bench_with_input(
            BenchmarkId::new("malloc/1thread", size),
            &size,
            |b, &size| b.iter(|| malloc_pair(size)),
        );
    }
    g.finish();
}

/// One `malloc(size)` and its `free`.
#[inline(always)]
fn malloc_pair(size: u64) {
    // SAFETY: a plain malloc/free pair; the pointer is freed once and never dereferenced.
    unsafe { libc::free(black_box(libc::malloc(black_box(size) as usize))) };
}

/// `threads` threads each doing `iters` pairs of `pair` after a common start; the wall time
/// divided by `threads`, i.e. per pair of the whole machine.
fn on_threads(threads: usize, iters: u64, pair: impl Fn() + Sync) -> Duration {
    let start = std::sync::Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                // A first pair before the start: each thread's shard and cache are set up.
                pair();
                start.wait();
                for _ in 0..iters {
                    pair();
                }
            });
        }
        start.wait();
        let t0 = Instant::now();
        // The scope joins every thread before it returns: the time includes the slowest.
        t0
    })
    .elapsed()
        / threads as u32
}

/// 8 and 16 threads each doing alloc+free pairs on one pool; reported time is wall time / threads,
/// i.e. per pair of the whole machine, and the throughput is pairs per second of the whole
/// machine, so "1thread time / Nthreads time" is the speed-up. `malloc` is the C library's
/// allocator in the same loop.
fn pairs_threads(c: &mut Criterion) {
    let source = Source::detect();
    for threads in [8usize, 16] {
        let mut g = c.benchmark_group(format!(
            "alloc_free_pair_{threads}threads/{}",
            source.name()
        ));
        g.throughput(Throughput::Elements(1));
        for (name, backend) in BACKENDS {
            if threads == 16 && name.starts_with("gpu-alloc") {
                continue; // one global lock: microseconds per pair at 8 threads already
            }
            let pool = source.pool(backend);
            for size in [64u64, 256, 4096] {
                g.bench_with_input(BenchmarkId::new(name, size), &size, |b, &size| {
                    b.iter_custom(|iters| {
                        on_threads(threads, iters, || {
                            drop(black_box(pool.alloc(size, 16).unwrap()))
                        })
                    })
                });
            }
        }
        for size in [64u64, 256, 4096] {
            g.bench_with_input(BenchmarkId::new("malloc", size), &size, |b, &size| {
                b.iter_custom(|iters| on_threads(threads, iters, || malloc_pair(size)))
            });
        }
        g.finish();
    }
}

/// A reproducible trace: 70 % small (16 B..4 KiB), 25 % medium (4..256 KiB), 5 % large (256 KiB..4 MiB).
fn trace(n: usize) -> Vec<(bool, u64, usize)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut live = 0usize;
    (0..n)
        .map(|_| {
            if live == 0 || (live < 2000 && rng.gen_bool(0.55)) {
                live += 1;
                let size = match rng.gen_range(0..100) {
                    0..=69 => rng.gen_range(16..=4096),
                    70..=94 => rng.gen_range(4097..=256 << 10),
                    _ => rng.gen_range((256 << 10) + 1..=4 << 20),
                };
                (true, size, 0)
            } else {
                let victim = rng.gen_range(0..live);
                live -= 1;
                (false, 0, victim)
            }
        })
        .collect()
}

fn replay<T>(ops: &[(bool, u64, usize)], mut alloc: impl FnMut(u64) -> T) -> Duration {
    let mut live: Vec<T> = Vec::new();
    let t0 = Instant::now();
    for &(is_alloc, size, victim) in ops {
        if is_alloc {
            live.push(alloc(size));
        } else {
            drop(live.swap_remove(victim));
        }
    }
    drop(live);
    t0.elapsed()
}

fn trace_replay(c: &mut Criterion) {
    let source = Source::detect();
    let ops = trace(20_000);
    let mut g = c.benchmark_group(format!("trace_replay/{}", source.name()));
    g.throughput(Throughput::Elements(ops.len() as u64));
    g.sample_size(10);
    for (name, backend) in BACKENDS {
        let pool = source.pool(backend);
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| replay(&ops, |s| pool.alloc(s, 64).unwrap()))
                    .sum()
            })
        });
    }
    if let Some(raw) = source.raw() {
        // Raw allocations cost hundreds of µs each: replay a 1,000-op prefix and scale per op.
        let short = trace(1_000);
        g.throughput(Throughput::Elements(short.len() as u64));
        g.bench_function("raw-allocations(1k-op prefix)", |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| replay(&short, |s| raw.allocate_chunk(s).unwrap()))
                    .sum()
            })
        });
    }
    g.finish();
}

fn raw_pair(c: &mut Criterion) {
    let source = Source::detect();
    let Some(raw) = source.raw() else {
        println!("raw_alloc_free: no Vulkan or CUDA driver here, skipped");
        return;
    };
    let mut g = c.benchmark_group(format!("raw_alloc_free/{}", source.name()));
    g.sample_size(20);
    for size in [64u64 << 10, 2 << 20] {
        g.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| drop(black_box(raw.allocate_chunk(size).unwrap())))
        });
    }
    g.finish();
}

criterion_group!(benches, pairs, pairs_threads, trace_replay, raw_pair);
criterion_main!(benches);

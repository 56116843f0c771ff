//! Copy kernels and the copy pool on plain host memory.
//!
//! The "mapping" here is ordinary write-back memory, so the figures only compare the kernels
//! with each other and with `ptr::copy_nonoverlapping`; they say nothing about BAR throughput
//! (write-combined writes, uncached reads), which must be measured on a GPU host.

use std::hint::black_box;
use std::ptr;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};
use vkgdr::copy::{copy_from_mapping_with, copy_to_mapping_with, simd_level, CopyPool, SimdLevel};

const SIZES: [(usize, &str); 5] = [
    (64, "64B"),
    (4 << 10, "4KiB"),
    (64 << 10, "64KiB"),
    (4 << 20, "4MiB"),
    (64 << 20, "64MiB"),
];

/// A page-aligned buffer, like a mapping, of `len` bytes filled with a pattern.
struct PageBuf {
    buf: Vec<u8>,
    base: usize,
    len: usize,
}

impl PageBuf {
    fn new(len: usize) -> Self {
        let mut buf: Vec<u8> = (0..len + 4096).map(|i| (i % 253) as u8).collect();
        let base = buf.as_mut_ptr().align_offset(4096);
        PageBuf { buf, base, len }
    }

    fn slice(&self) -> &[u8] {
        &self.buf[self.base..self.base + self.len]
    }

    fn slice_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.base..self.base + self.len]
    }
}

fn levels() -> Vec<SimdLevel> {
    SimdLevel::ALL
        .into_iter()
        .filter(|l| {
            let ok = l.is_supported();
            if !ok {
                println!("skipping {l}: not supported by this CPU");
            }
            ok
        })
        .collect()
}

fn configure<'a>(c: &'a mut Criterion, name: &str, size: usize) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Bytes(size as u64));
    group.warm_up_time(Duration::from_millis(300));
    group.measurement_time(Duration::from_secs(1));
    if size >= 4 << 20 {
        group.sample_size(10);
    }
    group
}

fn kernels(c: &mut Criterion) {
    println!("detected level: {}", simd_level());
    let levels = levels();
    for (size, label) in SIZES {
        let src = PageBuf::new(size);
        let mut mapping = PageBuf::new(size);
        let mut host = PageBuf::new(size);

        let mut group = configure(c, &format!("to_mapping/{label}"), size);
        group.bench_function("copy_nonoverlapping", |b| {
            b.iter(|| {
                // SAFETY: distinct buffers of `size` bytes.
                unsafe {
                    ptr::copy_nonoverlapping(
                        black_box(src.slice().as_ptr()),
                        black_box(mapping.slice_mut().as_mut_ptr()),
                        size,
                    )
                }
            })
        });
        for &level in &levels {
            group.bench_function(BenchmarkId::new("copy_to_mapping", level), |b| {
                b.iter(|| {
                    // SAFETY: distinct buffers of `size` bytes; the level is supported.
                    unsafe {
                        copy_to_mapping_with(
                            level,
                            black_box(mapping.slice_mut().as_mut_ptr()),
                            black_box(src.slice()),
                        )
                        .unwrap()
                    }
                })
            });
        }
        group.finish();

        let mut group = configure(c, &format!("from_mapping/{label}"), size);
        group.bench_function("copy_nonoverlapping", |b| {
            b.iter(|| {
                // SAFETY: distinct buffers of `size` bytes.
                unsafe {
                    ptr::copy_nonoverlapping(
                        black_box(mapping.slice().as_ptr()),
                        black_box(host.slice_mut().as_mut_ptr()),
                        size,
                    )
                }
            })
        });
        for &level in &levels {
            group.bench_function(BenchmarkId::new("copy_from_mapping", level), |b| {
                b.iter(|| {
                    // SAFETY: distinct buffers of `size` bytes; the level is supported.
                    unsafe {
                        copy_from_mapping_with(
                            level,
                            black_box(host.slice_mut()),
                            black_box(mapping.slice().as_ptr()),
                        )
                        .unwrap()
                    }
                })
            });
        }
        group.finish();
    }
}

fn pool(c: &mut Criterion) {
    let size = 64 << 20;
    let src = PageBuf::new(size);
    let mut mapping = PageBuf::new(size);
    let mut host = PageBuf::new(size);
    println!(
        "CopyPool: {} hardware threads available",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for threads in [1, 2, 4, 8] {
        let pool = CopyPool::new(threads);
        let mut group = configure(c, "pool/64MiB", size);
        group.bench_function(BenchmarkId::new("write", threads), |b| {
            b.iter(|| {
                pool.write_slice(mapping.slice_mut(), black_box(src.slice()))
                    .unwrap()
            })
        });
        group.bench_function(BenchmarkId::new("read", threads), |b| {
            b.iter(|| {
                pool.read_slice(host.slice_mut(), black_box(mapping.slice()))
                    .unwrap()
            })
        });
        group.finish();
    }
}

criterion_group!(benches, kernels, pool);
criterion_main!(benches);

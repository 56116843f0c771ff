//! CPU benchmarks of the allocator core (no GPU involved).
//!
//! - `alloc_free_pair/<size>`: one `alloc` + `free` of `size` bytes (align 16) on a warm heap that
//!   already holds a random background of live blocks.
//! - `alloc_free_batch64/<size>`: 64 allocations then 64 frees (LIFO), per pair.
//! - `trace_replay`: a seeded random trace of mixed sizes (16 B – 1 MiB, log-uniform), reported as
//!   operations per second.
//!
//! Run: `cargo bench --bench alloc_core`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use vkgdr::alloc::{AllocError, Allocation, Heap, HeapConfig};

const CHUNK: u64 = 64 << 20;
const SIZES: [u64; 7] = [16, 64, 256, 1024, 4096, 65536, 1 << 20];

/// Log-uniform size in 16 B ..= 1 MiB.
fn random_size(rng: &mut StdRng) -> u64 {
    let log = rng.gen_range(4.0..=20.0f64);
    (2f64.powf(log) as u64).max(1)
}

/// A heap of four 64 MiB chunks holding a random background of live blocks.
fn warm_heap(seed: u64) -> (Heap, Vec<Allocation>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut heap = Heap::new(HeapConfig::default()).unwrap();
    for _ in 0..4 {
        heap.add_chunk(CHUNK).unwrap();
    }
    let mut live = Vec::new();
    for _ in 0..4000 {
        let size = random_size(&mut rng).min(64 << 10);
        live.push(heap.alloc(size, 16).unwrap());
    }
    // Free every other one so the free lists are not trivial.
    let mut kept = Vec::new();
    for (i, a) in live.into_iter().enumerate() {
        if i % 2 == 0 {
            heap.free(a).unwrap();
        } else {
            kept.push(a);
        }
    }
    (heap, kept)
}

fn alloc_free_pair(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_free_pair");
    for size in SIZES {
        let (mut heap, background) = warm_heap(1);
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| {
                let a = heap.alloc(black_box(size), 16).unwrap();
                heap.free(black_box(a)).unwrap();
            })
        });
        drop(background);
    }
    group.finish();
}

fn alloc_free_batch(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_free_batch64");
    group.throughput(Throughput::Elements(64));
    for size in SIZES {
        let (mut heap, background) = warm_heap(2);
        let mut held = Vec::with_capacity(64);
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| {
                for _ in 0..64 {
                    held.push(heap.alloc(black_box(size), 16).unwrap());
                }
                while let Some(a) = held.pop() {
                    heap.free(a).unwrap();
                }
            })
        });
        drop(background);
    }
    group.finish();
}

#[derive(Clone, Copy)]
enum Op {
    Alloc { slot: usize, size: u64, align: u64 },
    Free { slot: usize },
}

/// A trace whose live set hovers around 1000 blocks (~90 MiB on average).
fn make_trace(len: usize, seed: u64) -> (Vec<Op>, usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ops = Vec::with_capacity(len);
    let mut live: Vec<usize> = Vec::new();
    let mut free_slots: Vec<usize> = Vec::new();
    let mut slots = 0;
    while ops.len() < len {
        let alloc = live.is_empty() || (live.len() < 2000 && rng.gen_bool(0.5));
        if alloc {
            let slot = free_slots.pop().unwrap_or_else(|| {
                slots += 1;
                slots - 1
            });
            let align = 1u64 << rng.gen_range(0..=12u32);
            ops.push(Op::Alloc {
                slot,
                size: random_size(&mut rng),
                align,
            });
            live.push(slot);
        } else {
            let slot = live.swap_remove(rng.gen_range(0..live.len()));
            ops.push(Op::Free { slot });
            free_slots.push(slot);
        }
    }
    (ops, slots)
}

fn replay(heap: &mut Heap, ops: &[Op], held: &mut [Option<Allocation>]) {
    for op in ops {
        match *op {
            Op::Alloc { slot, size, align } => {
                let a = match heap.alloc(size, align) {
                    Ok(a) => a,
                    Err(AllocError::OutOfSpace {
                        chunk_size_needed, ..
                    }) => {
                        heap.add_chunk(chunk_size_needed.max(CHUNK)).unwrap();
                        heap.alloc(size, align).unwrap()
                    }
                    Err(e) => panic!("{e}"),
                };
                held[slot] = Some(a);
            }
            Op::Free { slot } => {
                if let Some(a) = held[slot].take() {
                    heap.free(a).unwrap();
                }
            }
        }
    }
}

fn trace_replay(c: &mut Criterion) {
    let (ops, slots) = make_trace(200_000, 7);
    let mut group = c.benchmark_group("trace_replay");
    group.throughput(Throughput::Elements(ops.len() as u64));
    group.sample_size(20);
    group.bench_function("mixed_16B_1MiB", |b| {
        b.iter_batched(
            || {
                let mut heap = Heap::new(HeapConfig::default()).unwrap();
                for _ in 0..4 {
                    heap.add_chunk(CHUNK).unwrap();
                }
                let held: Vec<Option<Allocation>> = (0..slots).map(|_| None).collect();
                (heap, held)
            },
            |(mut heap, mut held)| {
                replay(&mut heap, &ops, &mut held);
                (heap, held)
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, alloc_free_pair, alloc_free_batch, trace_replay);
criterion_main!(benches);

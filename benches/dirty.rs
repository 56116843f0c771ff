//! Cost of `DirtyRanges::mark` for scattered and sequential (ring-buffer) write patterns.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::{rngs::StdRng, Rng, SeedableRng};
use vkgdr::dirty::{DirtyRanges, DEFAULT_MAX_RANGES};

const MARKS: usize = 1000;

/// 1000 random small writes (1..=256 bytes) into a 64 MiB chunk, then one take per batch.
fn random_marks(c: &mut Criterion) {
    let size = 64 << 20;
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let writes: Vec<(u64, u64)> = (0..MARKS)
        .map(|_| {
            let len = rng.gen_range(1..=256);
            (rng.gen_range(0..size - len), len)
        })
        .collect();
    let mut group = c.benchmark_group("random_1000_marks_then_take");
    group.throughput(Throughput::Elements(MARKS as u64));
    for (name, cap) in [("cap64", DEFAULT_MAX_RANGES), ("uncapped", usize::MAX)] {
        let mut d = DirtyRanges::with_max_ranges(size, 256, cap).unwrap();
        let mut out = Vec::with_capacity(MARKS);
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                for &(o, l) in &writes {
                    d.mark(black_box(o), black_box(l)).unwrap();
                }
                out.clear();
                d.take_into(&mut out);
                black_box(out.len())
            })
        });
    }
    group.finish();
}

/// Ring-buffer pattern: 48-byte records appended back to back in a 4 MiB chunk, with a take
/// after every 64 records and wrap-around at the end.
fn sequential_appends(c: &mut Criterion) {
    let size = 4 << 20;
    let record = 48;
    let mut group = c.benchmark_group("sequential_appends");
    group.throughput(Throughput::Elements(MARKS as u64));
    group.bench_function("48B_records_take_every_64", |b| {
        let mut d = DirtyRanges::new(size, 64).unwrap();
        let mut out = Vec::with_capacity(4);
        let mut head = 0u64;
        b.iter(|| {
            for i in 0..MARKS {
                if head + record > size {
                    head = 0;
                }
                d.mark(black_box(head), record).unwrap();
                head += record;
                if i % 64 == 63 {
                    out.clear();
                    d.take_into(&mut out);
                }
            }
            black_box(out.len())
        })
    });
    group.finish();
}

criterion_group!(benches, random_marks, sequential_appends);
criterion_main!(benches);

//! Cost of the ring core alone (reserve + commit through a sink that stores nothing), with an
//! infinitely fast consumer: one producer, and four producers contending.
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use vkgdr::ring::core::{RingCore, RingSink};

struct NullSink;

impl RingSink for NullSink {
    fn write(&self, offset: u64, bytes: &[u8]) {
        black_box((offset, bytes));
    }
    fn publish(&self, tail: u64) {
        black_box(tail);
    }
}

const PAYLOAD: [u8; 64] = [7; 64];

fn push_n(ring: &RingCore<NullSink>, n: u64) {
    let consumer = || ring.committed();
    for _ in 0..n {
        ring.push(&PAYLOAD, None, &consumer).unwrap();
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring_core");
    g.throughput(Throughput::Elements(1));
    let ring = RingCore::new(1 << 20, NullSink).unwrap();
    g.bench_function("push_64B_1_thread", |b| b.iter(|| push_n(&ring, 1)));
    for threads in [2u64, 4] {
        let name = format!("push_64B_{threads}_threads");
        g.bench_function(&name, |b| {
            b.iter_custom(|iters| {
                let per = iters.div_ceil(threads);
                let start = Instant::now();
                std::thread::scope(|s| {
                    for _ in 0..threads {
                        s.spawn(|| push_n(&ring, per));
                    }
                });
                start
                    .elapsed()
                    .div_f64((per * threads) as f64 / iters as f64)
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);

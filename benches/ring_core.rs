//! CPU cost of the ring core alone (a sink that stores nothing, an infinitely fast consumer):
//! 64-byte records through shared reservations (one, two and four threads on one ring) and
//! through exclusive producers (one ring per thread, as lanes), one publication per record
//! (`push`) or per batch of 64 (`push_batch`).
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use vkgdr::ring::core::{RingCore, RingSink};

struct NullSink(u64);

impl RingSink for NullSink {
    fn capacity(&self) -> u64 {
        self.0
    }
    unsafe fn write(&self, offset: u64, bytes: &[u8]) {
        black_box((offset, bytes));
    }
    unsafe fn publish(&self, tail: u64) {
        black_box(tail);
    }
}

const CAP: u64 = 1 << 20;
/// 48 payload bytes: 64-byte records with the header.
const PAYLOAD: [u8; 48] = [7; 48];
const BATCH: usize = 64;

fn push_n(ring: &RingCore<NullSink>, n: u64) {
    let consumer = || Ok(ring.committed());
    for _ in 0..n {
        ring.push(&PAYLOAD, None, &consumer).unwrap();
    }
}

/// `n` records through an exclusive producer: one publication per record, or per `BATCH`.
fn produce_n(ring: &RingCore<NullSink>, n: u64, batched: bool) {
    let mut p = ring.claim(|| Ok(ring.committed())).unwrap();
    if batched {
        let batch = [&PAYLOAD[..]; BATCH];
        for _ in 0..n.div_ceil(BATCH as u64) {
            p.push_batch(batch, None).unwrap();
        }
    } else {
        for _ in 0..n {
            p.push(&PAYLOAD, None).unwrap();
        }
    }
}

/// Times `threads` threads doing `work(thread, per_thread)`, scaled to `iters` records.
fn threaded(iters: u64, threads: u64, work: impl Fn(usize, u64) + Sync) -> Duration {
    let per = iters.div_ceil(threads);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let work = &work;
            s.spawn(move || work(t as usize, per));
        }
    });
    start
        .elapsed()
        .div_f64((per * threads) as f64 / iters as f64)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring_core");
    g.throughput(Throughput::Elements(1));
    let ring = RingCore::new(CAP, NullSink(CAP)).unwrap();
    g.bench_function("push_64B_1_thread", |b| b.iter(|| push_n(&ring, 1)));
    for threads in [2u64, 4] {
        g.bench_function(format!("push_64B_{threads}_threads"), |b| {
            b.iter_custom(|iters| threaded(iters, threads, |_, n| push_n(&ring, n)))
        });
    }
    let lanes: Vec<_> = (0..4)
        .map(|_| RingCore::new(CAP, NullSink(CAP)).unwrap())
        .collect();
    for (batched, what) in [(false, "push"), (true, "push_batch")] {
        for threads in [1u64, 4] {
            g.bench_function(format!("producer_{what}_64B_{threads}_lanes"), |b| {
                b.iter_custom(|iters| {
                    threaded(iters, threads, |t, n| produce_n(&lanes[t], n, batched))
                })
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);

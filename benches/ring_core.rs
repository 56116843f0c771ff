//! CPU cost of the ring's producer path, no GPU needed:
//!
//! - `ring_core`: the core alone (a sink that stores nothing, an infinitely fast consumer):
//!   64-byte records through shared reservations (one, two and four threads on one ring) and
//!   through exclusive producers (one ring per thread, as lanes), one publication per record
//!   (`push`) or per batch of 64 (`push_batch`).
//! - `ring_host_sink`: one thread pushing into a ring over host memory through a sink that does
//!   what the BAR sink does (the crate's unfenced copy kernel per write, `sfence` in
//!   `writes_done`, `sfence`, tail store, `sfence` per publication), with a timeout as the C and
//!   Python faces pass one: 64-byte, 256-byte and 1 KiB records through `RingCore::push`,
//!   `Producer::push` and `Producer::push_batch` (64 records per publication). A publication's
//!   `sfence` (and on the shared path the commit's atomic read-modify-write, which follows the
//!   non-temporal stores) waits for the record's stores to drain, which dominates the rows that
//!   publish every record; the `push_batch` rows show the producer's own cost per record.
use std::alloc::Layout;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use vkgdr::copy::WriteKernel;
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

/// Host memory written the way `vkgdr::ring::BarSink` writes BAR memory on a host-coherent
/// mapping: the copy kernel picked once for the sink, fences where the BAR sink fences.
struct HostMemorySink {
    data: *mut u8,
    capacity: u64,
    kernel: WriteKernel,
    tail: AtomicU64,
}

// SAFETY: `data` is an allocation owned by the sink; the ring core hands out disjoint spans of
// it (the `RingSink::write` contract), and nothing else touches it.
unsafe impl Send for HostMemorySink {}
// SAFETY: as above.
unsafe impl Sync for HostMemorySink {}

impl HostMemorySink {
    fn layout(capacity: u64) -> Layout {
        Layout::from_size_align(capacity as usize, 4096).unwrap()
    }

    fn new(capacity: u64) -> Self {
        // SAFETY: a non-zero size.
        let data = unsafe { std::alloc::alloc_zeroed(Self::layout(capacity)) };
        assert!(!data.is_null());
        HostMemorySink {
            data,
            capacity,
            kernel: WriteKernel::detected(),
            tail: AtomicU64::new(0),
        }
    }
}

impl Drop for HostMemorySink {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.data, Self::layout(self.capacity)) };
    }
}

fn sfence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(Ordering::SeqCst);
}

impl RingSink for HostMemorySink {
    fn capacity(&self) -> u64 {
        self.capacity
    }
    unsafe fn write(&self, offset: u64, bytes: &[u8]) {
        // SAFETY: the caller's in-range, exclusive span of the allocation.
        unsafe {
            self.kernel
                .write_unfenced(self.data.add(offset as usize), bytes)
        };
    }
    fn writes_done(&self) {
        sfence();
    }
    unsafe fn publish(&self, tail: u64) {
        sfence();
        self.tail.store(tail, Ordering::Release);
        sfence();
    }
}

const CAP: u64 = 1 << 20;
/// 48 payload bytes: 64-byte records with the header.
const PAYLOAD: [u8; 48] = [7; 48];
const BATCH: usize = 64;
/// The timeout the host-sink rows pass (never reached: the consumer is infinitely fast).
const TIMEOUT: Option<Duration> = Some(Duration::from_secs(1));

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

/// One thread's records into host memory, per record size and producer path.
fn bench_host_sink(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring_host_sink");
    g.throughput(Throughput::Elements(1));
    let ring = RingCore::new(CAP, HostMemorySink::new(CAP)).unwrap();
    let consumer = || Ok(ring.committed());
    for record in [64usize, 256, 1024] {
        let payload = vec![7u8; record - 16];
        g.bench_function(format!("push_{record}B"), |b| {
            b.iter(|| ring.push(black_box(&payload), TIMEOUT, &consumer).unwrap())
        });
        let mut p = ring.claim(|| Ok(ring.committed())).unwrap();
        g.bench_function(format!("producer_push_{record}B"), |b| {
            b.iter(|| p.push(black_box(&payload), TIMEOUT).unwrap())
        });
        let batch = vec![&payload[..]; BATCH];
        g.bench_function(format!("producer_push_batch_{record}B"), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters.div_ceil(BATCH as u64) {
                    p.push_batch(black_box(batch.iter().copied()), TIMEOUT)
                        .unwrap();
                }
                start
                    .elapsed()
                    .div_f64((iters.div_ceil(BATCH as u64) * BATCH as u64) as f64 / iters as f64)
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench, bench_host_sink
}
criterion_main!(benches);

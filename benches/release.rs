//! Device-side releases on the CPU: per block, `Block::release_on_device` (the lend), the drain
//! that takes its token back and frees the block, and the allocation that reuses it. No GPU: the
//! pool's release feed is a stand-in that hands back the tokens the benchmark pushes, one token
//! per record (what a kernel thread's `vkgdr_release_token` sends). The pool is over host memory
//! with `thread_cache = 0`, as `tests/gpu_release.rs` measures on a GPU.
//!
//! The stand-in delivers only to the benchmark's thread, so the pool's drain thread (which wakes
//! while blocks are lent) takes the table's lock but never the work being timed.
//! Quick run: `cargo bench --bench release -- --warm-up-time 1 --measurement-time 2`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use vkgdr::chunk::HostMemorySource;
use vkgdr::pool::ReleaseFeed;
use vkgdr::ring::core::d2h::{D2hError, ReleaseToken, KIND_RELEASE};
use vkgdr::{Block, Pool, PoolConfig};

/// Blocks per round: lent, then given back, then allocated again.
const ROUND: usize = 1024;
/// The blocks' size.
const SIZE: u64 = 64;

/// The tokens the benchmark pushed, delivered one per record to the measuring thread.
struct Returned {
    queue: Arc<Mutex<VecDeque<u64>>>,
    reader: ThreadId,
}

impl ReleaseFeed for Returned {
    fn drain(&mut self, max: usize, record: &mut dyn FnMut(u32, &[u8])) -> Result<usize, D2hError> {
        if std::thread::current().id() != self.reader {
            return Ok(0);
        }
        let mut q = self.queue.lock().unwrap();
        let n = max.min(q.len());
        for token in q.drain(..n) {
            record(KIND_RELEASE, &token.to_le_bytes());
        }
        Ok(n)
    }
}

struct Bench {
    pool: Pool,
    queue: Arc<Mutex<VecDeque<u64>>>,
    blocks: Vec<Block>,
    tokens: Vec<u64>,
    /// The batch's tokens, kept for their capacity.
    lent: Vec<ReleaseToken>,
}

impl Bench {
    fn new() -> Bench {
        let pool = Pool::new(
            HostMemorySource,
            PoolConfig {
                thread_cache: 0,
                ..Default::default()
            },
        )
        .expect("pool");
        let queue = Arc::new(Mutex::new(VecDeque::new()));
        pool.set_release_feed(Returned {
            queue: queue.clone(),
            reader: std::thread::current().id(),
        })
        .map_err(|_| "a feed already")
        .unwrap();
        let mut b = Bench {
            pool,
            queue,
            blocks: Vec::with_capacity(ROUND),
            tokens: Vec::with_capacity(ROUND),
            lent: Vec::with_capacity(ROUND),
        };
        // One round untimed: the table's entries and the chunk exist from then on.
        for _ in 0..2 {
            b.alloc(ROUND);
            b.lend_each();
            b.give_back();
        }
        b
    }

    fn alloc(&mut self, n: usize) {
        for _ in 0..n {
            self.blocks.push(self.pool.alloc(SIZE, 64).unwrap());
        }
    }

    fn lend_batch(&mut self) {
        let mut tokens = Vec::new();
        std::mem::swap(&mut tokens, &mut self.lent);
        self.pool
            .release_many_on_device(&mut self.blocks, &mut tokens)
            .unwrap();
        self.tokens.extend(tokens.drain(..).map(|t| t.to_bits()));
        self.lent = tokens;
    }

    fn lend_each(&mut self) {
        for b in self.blocks.drain(..) {
            self.tokens
                .push(black_box(b.release_on_device().unwrap()).to_bits());
        }
    }

    /// The tokens come back and a drain frees their blocks.
    fn give_back(&mut self) {
        self.queue.lock().unwrap().extend(self.tokens.drain(..));
        let freed = self.pool.drain_device_releases();
        assert!(freed > 0 && self.pool.lent_blocks() == 0, "{freed} freed");
    }

    /// Every token back, drained until nothing is lent.
    fn give_back_all(&mut self) {
        self.queue.lock().unwrap().extend(self.tokens.drain(..));
        while self.pool.lent_blocks() > 0 {
            assert!(
                self.pool.drain_device_releases() > 0,
                "a drain freed nothing"
            );
        }
    }

    /// Rounds of `ROUND` blocks covering `iters` blocks, `timed` measured in each.
    fn rounds(&mut self, iters: u64, timed: Stage, batch: bool) -> Duration {
        let mut total = Duration::ZERO;
        let mut left = iters as usize;
        while left > 0 {
            let n = left.min(ROUND);
            left -= n;
            let t = Instant::now();
            self.alloc(n);
            let after_alloc = Instant::now();
            if batch {
                self.lend_batch();
            } else {
                self.lend_each();
            }
            let after_lend = Instant::now();
            self.give_back();
            let after_drain = Instant::now();
            total += match timed {
                Stage::Alloc => after_alloc - t,
                Stage::Lend => after_lend - after_alloc,
                Stage::Drain => after_drain - after_lend,
                Stage::All => after_drain - t,
            };
        }
        total
    }
}

#[derive(Clone, Copy)]
enum Stage {
    Alloc,
    Lend,
    Drain,
    All,
}

/// What `tests/gpu_release.rs` times on a GPU: 65,536 blocks of a fresh pool lent in one go,
/// their tokens collected (the table grows its entries as it goes).
fn fresh_pool(c: &mut Criterion) {
    const BLOCKS: usize = 65_536;
    let mut g = c.benchmark_group("device_release/host/fresh_pool_65536");
    g.throughput(Throughput::Elements(BLOCKS as u64));
    g.sample_size(20);
    for batch in [false, true] {
        g.bench_function(if batch { "lend_batch" } else { "lend" }, |bn| {
            bn.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let mut b = Bench::new();
                    b.alloc(BLOCKS);
                    let all = std::mem::take(&mut b.blocks);
                    let t = Instant::now();
                    let tokens: Vec<u64> = if batch {
                        let mut all = all;
                        let mut lent = Vec::new();
                        b.pool.release_many_on_device(&mut all, &mut lent).unwrap();
                        lent.into_iter().map(|t| t.to_bits()).collect()
                    } else {
                        all.into_iter()
                            .map(|b| b.release_on_device().unwrap().to_bits())
                            .collect()
                    };
                    total += t.elapsed();
                    b.tokens = tokens;
                    b.give_back_all();
                }
                total
            })
        });
    }
    g.finish();
}

fn per_block(c: &mut Criterion) {
    let mut b = Bench::new();
    let mut g = c.benchmark_group("device_release/host");
    g.throughput(Throughput::Elements(1));
    for (name, stage, batch) in [
        ("lend", Stage::Lend, false),
        ("lend_batch_1024", Stage::Lend, true),
        ("drain", Stage::Drain, false),
        ("alloc_reuse", Stage::Alloc, false),
        ("cycle", Stage::All, false),
        ("cycle_batch_1024", Stage::All, true),
    ] {
        g.bench_function(name, |bn| {
            bn.iter_custom(|iters| b.rounds(iters, stage, batch))
        });
    }
    g.finish();
}

criterion_group!(benches, per_block, fresh_pool);
criterion_main!(benches);

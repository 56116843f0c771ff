//! The pool's thread caches against a model, over random workloads on three long-lived threads:
//! allocations, frees, blocks handed from one thread to another (and so cached by a thread that
//! did not allocate them), trims and cache releases issued from any thread. After every step the
//! pool's statistics must equal the model's, live blocks must keep their bytes (no block is ever
//! handed out twice), a trim must leave no block cached on any thread (idle ones included), and at
//! the end every chunk goes back.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

use proptest::prelude::*;
use vkgdr::chunk::HostMemorySource;
use vkgdr::pool::magazine;
use vkgdr::{Block, Mapping, Pool, PoolConfig};

const THREADS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        thread: usize,
        size: u64,
        align_log: u32,
    },
    Free {
        thread: usize,
        pick: usize,
    },
    Hand {
        from: usize,
        to: usize,
        pick: usize,
    },
    Trim {
        thread: usize,
    },
    Release {
        thread: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let t = 0..THREADS;
    prop_oneof![
        5 => (t.clone(), 1u64..=5000, 0u32..=8)
            .prop_map(|(thread, size, align_log)| Op::Alloc { thread, size, align_log }),
        4 => (t.clone(), any::<usize>()).prop_map(|(thread, pick)| Op::Free { thread, pick }),
        1 => (t.clone(), t.clone(), any::<usize>())
            .prop_map(|(from, to, pick)| Op::Hand { from, to, pick }),
        1 => t.clone().prop_map(|thread| Op::Trim { thread }),
        1 => t.prop_map(|thread| Op::Release { thread }),
    ]
}

/// A block with the byte it was filled with.
type Tagged = (Block, u8);
type Job = Box<dyn FnOnce(&mut Vec<Tagged>) -> Reply + Send>;

enum Reply {
    Done,
    Cached(usize),
    Handed(Option<Tagged>),
}

/// A thread that owns some blocks and runs jobs on them, one at a time.
struct Worker {
    jobs: Sender<Job>,
    replies: Receiver<Reply>,
    handle: Option<JoinHandle<()>>,
}

impl Worker {
    fn start() -> Worker {
        let (jobs, job_rx) = channel::<Job>();
        let (reply_tx, replies) = channel();
        let handle = std::thread::spawn(move || {
            let mut blocks = Vec::new();
            for job in job_rx {
                let reply = job(&mut blocks);
                reply_tx.send(reply).unwrap();
            }
        });
        Worker {
            jobs,
            replies,
            handle: Some(handle),
        }
    }

    fn run(&self, job: impl FnOnce(&mut Vec<Tagged>) -> Reply + Send + 'static) -> Reply {
        self.jobs.send(Box::new(job)).unwrap();
        self.replies.recv().unwrap()
    }

    fn cached(&self) -> usize {
        match self.run(|_| Reply::Cached(magazine::thread_cached_blocks())) {
            Reply::Cached(n) => n,
            _ => unreachable!(),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let (tx, _) = channel();
        drop(std::mem::replace(&mut self.jobs, tx));
        if let Some(h) = self.handle.take() {
            // A panicking worker already failed its job's reply; do not panic twice.
            let _ = h.join();
        }
    }
}

fn check_block(b: &Block, tag: u8) {
    let bytes = b.read_vec(0, b.size() as usize).unwrap();
    assert!(
        bytes.iter().all(|&x| x == tag),
        "a live block was overwritten"
    );
}

fn run(ops: Vec<Op>) {
    let pool = Pool::new(
        HostMemorySource,
        PoolConfig {
            chunk_size: 256 << 10,
            max_chunk_size: 256 << 10,
            dedicated_threshold: 128 << 10,
            shards: 2,
            thread_cache: 4,
            thread_cache_bytes: 16 << 10,
            ..Default::default()
        },
    )
    .unwrap();
    let workers: Vec<Worker> = (0..THREADS).map(|_| Worker::start()).collect();
    // The model: requested bytes of every live block, per thread.
    let mut live: Vec<Vec<u64>> = vec![Vec::new(); THREADS];
    for (step, op) in ops.into_iter().enumerate() {
        let tag = step as u8;
        match op {
            Op::Alloc {
                thread,
                size,
                align_log,
            } => {
                let p = pool.clone();
                workers[thread].run(move |blocks| {
                    let mut b = p.alloc(size, 1 << align_log).unwrap();
                    assert_eq!(b.host_ptr() as u64 % (1 << align_log), 0);
                    b.fill(0, size, tag).unwrap();
                    blocks.push((b, tag));
                    Reply::Done
                });
                live[thread].push(size);
            }
            Op::Free { thread, pick } if !live[thread].is_empty() => {
                let i = pick % live[thread].len();
                workers[thread].run(move |blocks| {
                    let (b, tag) = blocks.swap_remove(i);
                    check_block(&b, tag);
                    Reply::Done
                });
                live[thread].swap_remove(i);
            }
            Op::Hand { from, to, pick } if !live[from].is_empty() => {
                let i = pick % live[from].len();
                let Reply::Handed(block) =
                    workers[from].run(move |blocks| Reply::Handed(Some(blocks.swap_remove(i))))
                else {
                    unreachable!()
                };
                workers[to].run(move |blocks| {
                    blocks.extend(block);
                    Reply::Done
                });
                let size = live[from].swap_remove(i);
                live[to].push(size);
            }
            Op::Trim { thread } => {
                let p = pool.clone();
                workers[thread].run(move |_| {
                    p.trim();
                    Reply::Done
                });
                assert_eq!(pool.stats().bytes_cached, 0, "trim left blocks cached");
                for w in &workers {
                    assert_eq!(w.cached(), 0, "trim missed a thread's cache");
                }
            }
            Op::Release { thread } => {
                workers[thread].run(|_| {
                    magazine::release_thread_cache();
                    Reply::Done
                });
                assert_eq!(workers[thread].cached(), 0);
            }
            Op::Free { .. } | Op::Hand { .. } => {}
        }
        let stats = pool.stats();
        let in_use: u64 = live.iter().flatten().sum();
        assert_eq!(stats.bytes_in_use, in_use, "after step {step}: {stats:?}");
        assert!(stats.bytes_cached <= THREADS as u64 * (16 << 10));
        assert!(stats.bytes_in_use + stats.bytes_cached <= stats.bytes_allocated);
    }
    // Every block freed on its worker (cached there, maybe), then one trim from here.
    for w in &workers {
        w.run(|blocks| {
            for (b, tag) in blocks.drain(..) {
                check_block(&b, tag);
            }
            Reply::Done
        });
    }
    pool.trim();
    let s = pool.stats();
    assert_eq!(
        (s.bytes_cached, s.bytes_allocated, s.chunks),
        (0, 0, 0),
        "{s:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn thread_caches_match_the_model(ops in prop::collection::vec(op(), 1..120)) {
        run(ops);
    }
}

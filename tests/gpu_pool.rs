//! The pool on the GPU: a PTX kernel reads 100,000 tiny host-written blocks by device pointer and
//! checks every tag, in coherent and forced non-coherent mode, with recycled blocks from the
//! per-thread cache (on by default) and without it, on the gpu-alloc backend, and after eight
//! threads churned blocks through their caches (which a trim then empties while they idle).

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use vkgdr::cuda_objects::Module;
use vkgdr::pool::magazine;
#[cfg(feature = "gpu-alloc")]
use vkgdr::GpuAllocStrategy;
use vkgdr::{Backend, Mapping, Pool, PoolConfig};

/// `check_tagged_blocks` over blocks given by device pointer, length and tag (arrays in pool
/// blocks themselves).
struct KernelCheck<'a> {
    gpu: &'a vkgdr::Gpu,
    module: &'a Module,
    count: usize,
    arrays: [vkgdr::Block; 3],
    bad: std::cell::RefCell<vkgdr::Block>,
}

impl<'a> KernelCheck<'a> {
    fn new(
        gpu: &'a vkgdr::Gpu,
        module: &'a Module,
        pool: &Pool,
        ptrs: &[u64],
        lens: &[u32],
        tags: &[u32],
    ) -> Self {
        let count = ptrs.len();
        let mut p_ptrs = pool.alloc(8 * count as u64, 8).unwrap();
        let mut p_lens = pool.alloc(4 * count as u64, 4).unwrap();
        let mut p_tags = pool.alloc(4 * count as u64, 4).unwrap();
        p_ptrs.write_pod(0, ptrs).unwrap();
        p_lens.write_pod(0, lens).unwrap();
        p_tags.write_pod(0, tags).unwrap();
        for b in [&p_ptrs, &p_lens, &p_tags] {
            b.flush().unwrap();
        }
        KernelCheck {
            gpu,
            module,
            count,
            arrays: [p_ptrs, p_lens, p_tags],
            bad: std::cell::RefCell::new(pool.alloc(8, 8).unwrap()),
        }
    }

    /// Runs the kernel: the number of blocks whose bytes differ from their tag.
    fn bad_blocks(&self) -> u64 {
        let mut p_bad = self.bad.borrow_mut();
        p_bad.write_pod(0, &[0u64]).unwrap();
        p_bad.flush().unwrap();
        let [a, b, c] = &self.arrays;
        launch_check_tagged_blocks(
            self.gpu,
            self.module,
            256,
            a.device_ptr().unwrap(),
            b.device_ptr().unwrap(),
            c.device_ptr().unwrap(),
            self.count as u64,
            p_bad.device_ptr().unwrap(),
        );
        let mut bad = [0u64];
        p_bad.read_pod(0, &mut bad).unwrap();
        bad[0]
    }
}

fn kernel_checks_blocks(
    force_non_coherent: bool,
    backend: Backend,
    count: usize,
    thread_cache: usize,
) {
    let gpu = open(force_non_coherent);
    let module = Module::load_ptx(&gpu, MAPPING_PTX).unwrap();
    let pool = Pool::new(
        gpu.clone(),
        PoolConfig {
            backend,
            thread_cache,
            ..Default::default()
        },
    )
    .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut cached_before = 0;
    if thread_cache > 0 {
        // Fill this thread's cache with freed blocks that held other bytes, so the blocks below
        // start with recycled ones (the kernel must still see only the new tags).
        let old: Vec<vkgdr::Block> = (0..20_000)
            .map(|_| {
                let size = rng.gen_range(1..=256u64);
                let mut b = pool.alloc(size, 1).unwrap();
                b.fill(0, size, 0xA5).unwrap();
                b
            })
            .collect();
        drop(old);
        cached_before = magazine::thread_cached_blocks();
        assert!(cached_before > 0);
    }
    let mut blocks = Vec::with_capacity(count);
    let (mut ptrs, mut lens, mut tags) = (Vec::new(), Vec::new(), Vec::new());
    for k in 0..count {
        let size = rng.gen_range(1..=256u64);
        let align = 1u64 << rng.gen_range(0..=6);
        let mut b = pool.alloc(size, align).unwrap();
        let dptr = b.device_ptr().expect("CUDA chunks have device pointers");
        assert_eq!(
            dptr % align,
            0,
            "device pointer {dptr:#x} not aligned to {align}"
        );
        let tag = k as u32 ^ 0x9e37;
        b.write(0, &tag_bytes(tag, size as usize)).unwrap();
        ptrs.push(dptr);
        lens.push(size as u32);
        tags.push(tag);
        blocks.push(b);
    }
    pool.flush().unwrap();
    let check = KernelCheck::new(&gpu, &module, &pool, &ptrs, &lens, &tags);
    assert_eq!(
        check.bad_blocks(),
        0,
        "the kernel found blocks with wrong tags"
    );
    if thread_cache > 0 {
        let reused = cached_before - magazine::thread_cached_blocks();
        println!("{reused} of {count} blocks came from the thread cache");
        assert!(reused > 0, "no block was served from the thread cache");
    }
    // Corrupt one block: the kernel must notice (the check can fail).
    let victim = count / 2;
    blocks[victim]
        .write(0, &[!tag_bytes(tags[victim], 1)[0]])
        .unwrap();
    blocks[victim].flush().unwrap();
    assert_eq!(check.bad_blocks(), 1);
    let stats = pool.stats();
    println!(
        "{count} blocks ({backend:?}, non-coherent {force_non_coherent}): reserved {} KiB, in use {} KiB",
        stats.bytes_reserved >> 10,
        stats.bytes_in_use >> 10
    );
}

const DEFAULT_CACHE: usize = magazine::DEFAULT_DEPTH;

/// The default configuration: the thread cache is on, so blocks are recycled from it.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn kernel_checks_100k_tiny_blocks_coherent() {
    kernel_checks_blocks(false, Backend::Native, 100_000, DEFAULT_CACHE);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn kernel_checks_100k_tiny_blocks_without_thread_cache() {
    kernel_checks_blocks(false, Backend::Native, 100_000, 0);
    kernel_checks_blocks(true, Backend::Native, 20_000, 0);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn kernel_checks_100k_tiny_blocks_forced_non_coherent() {
    kernel_checks_blocks(true, Backend::Native, 100_000, DEFAULT_CACHE);
}

/// Eight threads churn tagged blocks through their (default) caches, then each keeps 2,000 live
/// blocks that one kernel checks; the threads free them into their caches and go idle, and a
/// trim from the main thread takes every cached block back and returns every chunk to the
/// driver while those threads still sleep.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn eight_threads_churn_then_an_idle_threads_cache_is_trimmed() {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::{mpsc, Barrier};
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, MAPPING_PTX).unwrap();
    let pool = Pool::new(gpu.clone(), PoolConfig::default()).unwrap();
    let (threads, live_per_thread) = (8, 2_000);
    // Every thread passes every barrier even when its work failed, and every check waits until
    // after the last one: a failure reports itself instead of leaving the others waiting.
    let checked = Barrier::new(threads + 1);
    let idle = Barrier::new(threads + 1);
    let wake = Barrier::new(threads + 1);
    // Each thread's live blocks (device address, size, tag) and how many read back wrong on the CPU.
    type Sent = Option<(Vec<(u64, u32, u32)>, usize)>;
    let (tx, rx) = mpsc::channel::<Sent>();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (pool, tx) = (&pool, tx.clone());
            let (checked, idle, wake) = (&checked, &idle, &wake);
            s.spawn(move || {
                let churn = catch_unwind(AssertUnwindSafe(|| {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                    let mut live: Vec<(vkgdr::Block, u32)> = Vec::new();
                    for op in 0..50_000u32 {
                        if live.len() < live_per_thread && (live.is_empty() || rng.gen_bool(0.6)) {
                            let size = rng.gen_range(1..=512u64);
                            let mut b = pool.alloc(size, 1 << rng.gen_range(0..=6)).unwrap();
                            let tag = (t as u32) << 24 | op;
                            b.write(0, &tag_bytes(tag, size as usize)).unwrap();
                            live.push((b, tag));
                        } else {
                            let i = rng.gen_range(0..live.len());
                            drop(live.swap_remove(i));
                        }
                    }
                    live
                }));
                let live = churn.ok();
                let sent = live.as_ref().map(|live| {
                    let wrong = live
                        .iter()
                        .filter(|(b, tag)| {
                            b.read_vec(0, b.size() as usize).unwrap()
                                != tag_bytes(*tag, b.size() as usize)
                        })
                        .count();
                    let blocks = live
                        .iter()
                        .map(|(b, tag)| (b.device_ptr().unwrap(), b.size() as u32, *tag))
                        .collect();
                    (blocks, wrong)
                });
                tx.send(sent).unwrap();
                drop(tx);
                checked.wait();
                let failed = live.is_none();
                drop(live); // into this thread's cache (up to its bounds)
                let cached = magazine::thread_cached_blocks();
                idle.wait();
                wake.wait(); // idle while the main thread trims
                assert!(!failed, "thread {t}'s churn failed (its panic is above)");
                assert!(cached > 0, "thread {t} cached nothing");
            });
        }
        drop(tx);
        let sent: Vec<_> = rx.iter().collect();
        let all: Vec<(u64, u32, u32)> = sent.iter().flatten().flat_map(|s| &s.0).copied().collect();
        let wrong_on_cpu: usize = sent.iter().flatten().map(|s| s.1).sum();
        let mut spans: Vec<(u64, u64)> = all.iter().map(|a| (a.0, a.0 + a.1 as u64)).collect();
        spans.sort_unstable();
        let overlapping = spans.windows(2).filter(|w| w[1].0 < w[0].1).count();
        let reported = sent.iter().flatten().count();
        let bad = (reported == threads).then(|| {
            let ptrs: Vec<u64> = all.iter().map(|a| a.0).collect();
            let lens: Vec<u32> = all.iter().map(|a| a.1).collect();
            let tags: Vec<u32> = all.iter().map(|a| a.2).collect();
            KernelCheck::new(&gpu, &module, &pool, &ptrs, &lens, &tags).bad_blocks()
        });
        checked.wait();
        idle.wait();
        let before = pool.stats();
        let released = pool.trim();
        let after = pool.stats();
        wake.wait();
        println!(
            "8 threads: {} live blocks, {overlapping} overlapping, {wrong_on_cpu} wrong on the \
             CPU, {bad:?} wrong for the kernel",
            all.len()
        );
        assert_eq!(reported, threads, "threads that reported their blocks");
        // Each thread ends with at most `live_per_thread` blocks (its last operations free some).
        assert!(
            all.len() > threads * live_per_thread * 9 / 10,
            "{} live blocks",
            all.len()
        );
        assert_eq!(overlapping, 0, "two live blocks overlap");
        assert_eq!(wrong_on_cpu, 0, "a live block lost its tag (CPU read-back)");
        assert_eq!(bad, Some(0), "a live block lost its tag (kernel)");
        println!(
            "8 threads: {} KiB cached in idle threads, trim released {released} chunks",
            before.bytes_cached >> 10
        );
        assert_eq!(before.bytes_in_use, 0, "{before:?}");
        assert!(before.bytes_cached > 0, "{before:?}");
        assert_eq!(
            (after.bytes_cached, after.chunks, after.bytes_reserved),
            (0, 0, 0)
        );
    });
}

#[cfg(feature = "gpu-alloc")]
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn kernel_checks_blocks_on_gpu_alloc_backends() {
    kernel_checks_blocks(false, Backend::GpuAlloc(GpuAllocStrategy::Buddy), 20_000, 0);
    kernel_checks_blocks(
        true,
        Backend::GpuAlloc(GpuAllocStrategy::FreeList),
        20_000,
        0,
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn pool_survives_bar_exhaustion() {
    let gpu = open(false);
    let pool = Pool::new(
        gpu.clone(),
        PoolConfig {
            dedicated_threshold: 256 << 20,
            ..Default::default()
        },
    )
    .unwrap();
    let mut held = Vec::new();
    let err = loop {
        match pool.alloc(1 << 30, 4096) {
            Ok(b) => held.push(b),
            Err(e) => break e,
        }
        assert!(held.len() < 1024);
    };
    assert!(err.is_out_of_memory(), "{err}");
    // While the BAR is full, small requests that need a new chunk fail cleanly too...
    let small = pool.alloc(64, 64);
    if let Err(e) = &small {
        assert!(e.is_out_of_memory(), "{e}");
    }
    drop(small);
    held.pop();
    // ...and succeed once memory is back.
    let mut b = pool.alloc(64, 64).unwrap();
    b.write(0, &[1; 64]).unwrap();
    drop(held);
    drop(b);
    assert_eq!(pool.stats().dedicated_chunks, 0);
}

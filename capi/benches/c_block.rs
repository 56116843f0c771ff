//! What the C API adds to the pool's hot path: an alloc+free pair of a 64-byte block through
//! `vkgdr_pool_alloc` / `vkgdr_block_free` (handle-table slot, panic guard, last-error clear)
//! against `Pool::alloc` and dropping the `Block` in Rust, on pools of the same configuration
//! over the same Vulkan device (lavapipe here; the NVIDIA device on the GPU machine), with and
//! without the pool's thread cache, on 1 and 4 threads.
//!
//! Quick run: `cargo bench -p vkgdr-capi --bench c_block -- --warm-up-time 1 --measurement-time 2`.

use std::time::{Duration, Instant};

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use vkgdr::vulkan::{DeviceSelector, MemoryOptions, VulkanContext};
use vkgdr::{Pool, PoolConfig};
use vkgdr_capi::device::{vkgdr_close, vkgdr_open_vulkan};
use vkgdr_capi::pool::{
    vkgdr_block_free, vkgdr_pool_alloc, vkgdr_pool_config, vkgdr_pool_config_init,
    vkgdr_pool_create, vkgdr_pool_destroy, vkgdr_pool_t,
};

/// Runs `pair` `iters` times on each of `threads` threads; the time of the slowest thread.
fn on_threads(threads: usize, iters: u64, pair: impl Fn() + Sync) -> Duration {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let t = Instant::now();
                    for _ in 0..iters {
                        pair();
                    }
                    t.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap()
    })
}

/// Pool handles are plain tokens: shareable between the bench's threads.
#[derive(Clone, Copy)]
struct CPool(vkgdr_pool_t);
// SAFETY: a pool handle may be used from any thread (the C API's contract).
unsafe impl Send for CPool {}
// SAFETY: as above.
unsafe impl Sync for CPool {}

fn bench(c: &mut Criterion) {
    let Ok(vulkan) = VulkanContext::new(DeviceSelector::FirstSuitable, MemoryOptions::default())
    else {
        eprintln!("c_block: no Vulkan device with exportable memory here; skipped");
        return;
    };
    // SAFETY: plain C calls with valid arguments.
    let g = unsafe { vkgdr_open_vulkan(-1, 0) };
    assert!(!g.is_null());
    let mut group = c.benchmark_group("c_block_alloc_free_64B");
    for thread_cache in [0u32, 32] {
        let rust = Pool::new(
            vulkan.clone(),
            PoolConfig {
                thread_cache: thread_cache as usize,
                ..Default::default()
            },
        )
        .unwrap();
        let mut cfg = std::mem::MaybeUninit::<vkgdr_pool_config>::uninit();
        // SAFETY: writable for its size; initialised by the call.
        let mut cfg = unsafe {
            vkgdr_pool_config_init(cfg.as_mut_ptr(), size_of::<vkgdr_pool_config>());
            cfg.assume_init()
        };
        cfg.thread_cache = thread_cache;
        // SAFETY: valid handle and config.
        let cpool = CPool(unsafe { vkgdr_pool_create(g, &cfg) });
        assert!(!cpool.0.is_null());
        for threads in [1usize, 4] {
            let id = |api| BenchmarkId::new(format!("{api}/cache{thread_cache}"), threads);
            group.bench_function(id("rust"), |b| {
                b.iter_custom(|iters| {
                    on_threads(threads, iters, || {
                        drop(black_box(rust.alloc(64, 16).unwrap()))
                    })
                })
            });
            group.bench_function(id("c"), |b| {
                b.iter_custom(|iters| {
                    on_threads(threads, iters, || {
                        let p = cpool;
                        // SAFETY: a live pool; the block is freed once, by this thread.
                        unsafe { vkgdr_block_free(black_box(vkgdr_pool_alloc(p.0, 64, 16))) }
                    })
                })
            });
        }
        // SAFETY: no block is live; nobody uses the pool any more.
        unsafe { vkgdr_pool_destroy(cpool.0) };
    }
    group.finish();
    // SAFETY: nothing uses the handle any more.
    unsafe { vkgdr_close(g) };
}

criterion_group!(benches, bench);
criterion_main!(benches);

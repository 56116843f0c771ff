//! The pool over real exported Vulkan memory (lavapipe on CI): concurrent random churn with tagged
//! blocks, limits, dedicated blocks, non-coherent dirty tracking, bad inputs.

use rand::{Rng, SeedableRng};
#[cfg(feature = "gpu-alloc")]
use vkgdr::{Backend, GpuAllocStrategy};
use vkgdr::{Error, Mapping, MemorySide, Pool, PoolConfig};

mod common;
use common::{tag_bytes, vulkan};

/// `threads` threads churn tagged blocks; with `trimmer`, another thread trims and reads the
/// statistics all along (taking cached blocks out of the churning threads' caches).
fn churn(force_non_coherent: bool, threads: usize, ops: usize, thread_cache: usize, trimmer: bool) {
    let pool = Pool::new(
        vulkan(force_non_coherent),
        PoolConfig {
            chunk_size: 4 << 20,
            max_chunk_size: 16 << 20,
            thread_cache,
            ..Default::default()
        },
    )
    .unwrap();
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        if trimmer {
            let (pool, done) = (&pool, &done);
            s.spawn(move || {
                while done.load(std::sync::atomic::Ordering::Relaxed) < threads {
                    pool.trim();
                    let st = pool.stats();
                    assert!(st.bytes_in_use + st.bytes_cached <= st.bytes_allocated);
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            });
        }
        let mut workers = Vec::new();
        for t in 0..threads {
            let (pool, done) = (&pool, &done);
            workers.push(s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                let mut live: Vec<(vkgdr::Block, u32, u64)> = Vec::new();
                for op in 0..ops {
                    if live.is_empty() || (live.len() < 512 && rng.gen_bool(0.55)) {
                        let size = match rng.gen_range(0..10) {
                            0..=5 => rng.gen_range(1..=256),
                            6..=8 => rng.gen_range(257..=4096),
                            _ => rng.gen_range(4097..=64 << 10),
                        };
                        let align = 1u64 << rng.gen_range(0..=12);
                        let mut b = pool.alloc(size, align).unwrap();
                        assert_eq!(
                            b.host_ptr() as u64 % align.min(4096),
                            0,
                            "misaligned host ptr"
                        );
                        let tag = (t * ops + op) as u32;
                        b.write(0, &tag_bytes(tag, size as usize)).unwrap();
                        live.push((b, tag, size));
                    } else {
                        let i = rng.gen_range(0..live.len());
                        let (b, tag, size) = live.swap_remove(i);
                        let got = b.read_vec(0, size as usize).unwrap();
                        assert!(
                            got == tag_bytes(tag, size as usize),
                            "block {tag} was overwritten"
                        );
                    }
                }
                for (b, tag, size) in live {
                    assert!(b.read_vec(0, size as usize).unwrap() == tag_bytes(tag, size as usize));
                }
                // The blocks this thread cached stay there: the trim below takes them back,
                // whether the thread has exited by then or not.
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }));
        }
        // Joined one by one: the end of a scope does not wait for the threads' thread-local
        // destructors, and a cache's destructor hands its blocks back while the stats below
        // would read them as neither cached nor free.
        for w in workers {
            w.join().unwrap();
        }
    });
    let before = pool.stats();
    assert_eq!(before.bytes_in_use, 0, "{before:?}");
    assert_eq!(before.dedicated_chunks, 0);
    if thread_cache == 0 {
        assert_eq!(before.bytes_cached, 0);
    }
    pool.trim();
    let after = pool.stats();
    assert_eq!(
        (after.bytes_cached, after.bytes_allocated, after.chunks),
        (0, 0, 0),
        "{after:?}"
    );
}

const DEFAULT_CACHE: usize = vkgdr::pool::magazine::DEFAULT_DEPTH;

#[test]
fn eight_threads_random_churn_no_overlap_no_lost_write() {
    churn(false, 8, 100_000, DEFAULT_CACHE, true);
}

#[test]
fn eight_threads_churn_without_thread_caches() {
    churn(false, 8, 100_000, 0, false);
}

#[test]
fn churn_in_forced_non_coherent_mode() {
    churn(true, 4, 20_000, DEFAULT_CACHE, true);
}

#[test]
fn churn_forced_non_coherent_without_thread_caches() {
    churn(true, 4, 20_000, 0, false);
}

#[test]
fn byte_limit_gives_out_of_memory_and_pool_stays_usable() {
    let pool = Pool::new(
        vulkan(false),
        PoolConfig {
            chunk_size: 1 << 20,
            max_chunk_size: 1 << 20,
            max_bytes: 2 << 20,
            shards: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let mut held = Vec::new();
    let err = loop {
        match pool.alloc(64 << 10, 256) {
            Ok(b) => held.push(b),
            Err(e) => break e,
        }
        assert!(held.len() <= 32, "limit not enforced");
    };
    assert!(
        matches!(
            err,
            Error::OutOfDeviceMemory {
                side: MemorySide::Limit,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(held.len(), 32);
    assert!(pool.stats().bytes_reserved <= 2 << 20);
    // A dedicated request past the limit fails the same way.
    let big = pool.alloc(16 << 20, 1).unwrap_err();
    assert!(big.is_out_of_memory());
    held.truncate(10);
    let again = pool.alloc(64 << 10, 256).unwrap();
    drop(again);
    drop(held);
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[test]
fn dedicated_blocks_for_large_requests() {
    let pool = Pool::new(
        vulkan(false),
        PoolConfig {
            dedicated_threshold: 1 << 20,
            ..Default::default()
        },
    )
    .unwrap();
    let mut b = pool.alloc(3 << 20, 4096).unwrap();
    assert!(b.is_dedicated());
    assert_eq!(pool.stats().dedicated_chunks, 1);
    assert!(pool.stats().bytes_reserved >= 3 << 20);
    b.fill(0, 3 << 20, 0x5a).unwrap();
    assert!(b
        .read_vec((3 << 20) - 16, 16)
        .unwrap()
        .iter()
        .all(|&x| x == 0x5a));
    drop(b);
    assert_eq!(pool.stats().dedicated_chunks, 0);
    assert_eq!(pool.stats().bytes_reserved, 0);
}

fn one_shard_non_coherent() -> Pool {
    let config = PoolConfig {
        shards: 1,
        ..Default::default()
    };
    Pool::new(vulkan(true), config).unwrap()
}

#[test]
fn non_coherent_writes_are_tracked_and_flushed() {
    let pool = one_shard_non_coherent();
    assert!(pool.is_non_coherent());
    let mut a = pool.alloc(100, 16).unwrap();
    let mut b = pool.alloc(10, 16).unwrap();
    // Blocks own whole atoms on non-coherent memory.
    assert_eq!(a.offset_in_chunk() % 64, 0);
    assert_eq!(b.offset_in_chunk() % 64, 0);
    assert!(!a.has_pending_writes());
    a.write(3, b"abc").unwrap();
    assert!(a.has_pending_writes());
    assert!(!b.has_pending_writes());
    b.write(0, b"x").unwrap();
    pool.flush().unwrap();
    assert!(!a.has_pending_writes() && !b.has_pending_writes());
    a.write(0, b"zz").unwrap();
    // Reading flushes the block's own pending writes before invalidating, so nothing is lost.
    assert_eq!(a.read_vec(0, 2).unwrap(), b"zz");
    assert_eq!(a.read_vec(3, 3).unwrap(), b"abc");
    assert!(!a.has_pending_writes());
    a.write(50, b"q").unwrap();
    a.flush().unwrap();
    assert!(!a.has_pending_writes());
}

#[test]
fn raw_pointer_writes_are_recorded_with_mark_written() {
    let pool = one_shard_non_coherent();
    let a = pool.alloc(100, 16).unwrap();
    // SAFETY: in bounds of the block, which nothing else accesses.
    unsafe {
        a.host_ptr()
            .add(10)
            .copy_from_nonoverlapping(b"raw".as_ptr(), 3)
    };
    assert!(
        !a.has_pending_writes(),
        "raw stores are invisible to the pool"
    );
    a.mark_written(10, 3).unwrap();
    assert!(a.has_pending_writes());
    pool.flush().unwrap();
    assert!(!a.has_pending_writes());
    assert_eq!(a.read_vec(10, 3).unwrap(), b"raw");
    assert!(matches!(
        a.mark_written(98, 3),
        Err(Error::InvalidArgument(_))
    ));
    assert!(!a.has_pending_writes());

    // Coherent memory: nothing to record, but the range is still checked.
    let coherent = Pool::new(vulkan(false), PoolConfig::default()).unwrap();
    let b = coherent.alloc(8, 8).unwrap();
    b.mark_written(0, 8).unwrap();
    assert!(!b.has_pending_writes());
    assert!(b.mark_written(1, 8).is_err());
}

#[test]
fn bad_inputs_are_rejected() {
    let pool = Pool::new(vulkan(false), PoolConfig::default()).unwrap();
    assert!(matches!(pool.alloc(0, 8), Err(Error::InvalidArgument(_))));
    assert!(matches!(pool.alloc(8, 3), Err(Error::InvalidArgument(_))));
    assert!(matches!(pool.alloc(8, 0), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        pool.alloc(8, 1 << 20),
        Err(Error::InvalidArgument(_))
    ));
    assert!(pool.alloc(u64::MAX, 8).is_err());
    let mut b = pool.alloc(16, 16).unwrap();
    assert!(matches!(
        b.write(10, &[0; 7]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        b.write_pod(4, &[0u64]),
        Err(Error::InvalidArgument(_))
    ));
    b.write_pod(8, &[7u64]).unwrap();
    let mut v = [0u64];
    b.read_pod(8, &mut v).unwrap();
    assert_eq!(v[0], 7);
    for (cfg, what) in [
        (
            PoolConfig {
                shards: 0,
                ..Default::default()
            },
            "shards",
        ),
        (
            PoolConfig {
                chunk_size: 1000,
                ..Default::default()
            },
            "chunk",
        ),
        (
            PoolConfig {
                max_chunk_size: 1 << 10,
                ..Default::default()
            },
            "max chunk",
        ),
        (
            PoolConfig {
                dedicated_threshold: 0,
                ..Default::default()
            },
            "dedicated",
        ),
    ] {
        assert!(
            matches!(
                Pool::new(vulkan(false), cfg),
                Err(Error::InvalidArgument(_))
            ),
            "{what}"
        );
    }
}

#[test]
fn blocks_outlive_the_pool_handle() {
    let pool = Pool::new(
        vulkan(false),
        PoolConfig {
            shards: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let mut blocks: Vec<_> = (0..100).map(|i| pool.alloc(64 + i, 16).unwrap()).collect();
    let big = pool.alloc(32 << 20, 4096).unwrap();
    let clone = pool.clone();
    drop(pool);
    let late = clone.alloc(128, 128).unwrap();
    drop(clone);
    // The memory is still there and still ours.
    for (i, b) in blocks.iter_mut().enumerate() {
        b.write(0, &tag_bytes(i as u32, b.size() as usize)).unwrap();
    }
    std::thread::scope(|s| {
        let tail = blocks.split_off(50);
        s.spawn(move || {
            for (i, b) in tail.into_iter().enumerate() {
                assert_eq!(
                    b.read_vec(0, b.size() as usize).unwrap(),
                    tag_bytes(50 + i as u32, b.size() as usize)
                );
            }
        });
    });
    for (i, b) in blocks.iter().enumerate() {
        assert_eq!(
            b.read_vec(0, b.size() as usize).unwrap(),
            tag_bytes(i as u32, b.size() as usize)
        );
    }
    drop(big);
    drop(blocks);
    drop(late); // the last block frees its shard and the pool state
}

#[cfg(feature = "gpu-alloc")]
#[test]
fn gpu_alloc_backends_carve_the_same_chunks() {
    for strategy in [GpuAllocStrategy::Buddy, GpuAllocStrategy::FreeList] {
        let pool = Pool::new(
            vulkan(false),
            PoolConfig {
                backend: Backend::GpuAlloc(strategy),
                max_bytes: 64 << 20,
                ..Default::default()
            },
        )
        .unwrap();
        let mut blocks: Vec<_> = (1..200u64)
            .map(|i| pool.alloc(i * 13, 16).unwrap())
            .collect();
        for (i, b) in blocks.iter_mut().enumerate() {
            b.write(0, &tag_bytes(i as u32, b.size() as usize)).unwrap();
        }
        for (i, b) in blocks.iter().enumerate() {
            assert_eq!(
                b.read_vec(0, b.size() as usize).unwrap(),
                tag_bytes(i as u32, b.size() as usize),
                "{strategy:?}"
            );
        }
        assert!(pool.stats().bytes_reserved > 0);
        drop(blocks);
        pool.trim();
        assert_eq!(
            pool.stats().bytes_reserved,
            0,
            "{strategy:?} kept chunks after trim"
        );
    }
}

//! The pool's unit tests over host memory (Miri runs them: `pool::tests`).

// The lanes' atomics are loom's under the loom feature: usable only inside a model.
#[cfg(not(feature = "loom"))]
mod release;

use super::*;
use std::sync::atomic::AtomicUsize;

use crate::mapping::chunk::{ChunkMemory, HostMemorySource};
use crate::mapping::Mapping;

fn small_pool(shards: usize) -> Pool {
    let cfg = PoolConfig {
        chunk_size: 128 << 10,
        max_chunk_size: 256 << 10,
        dedicated_threshold: 64 << 10,
        shards,
        ..Default::default()
    };
    Pool::new(HostMemorySource, cfg).unwrap()
}

/// A host-memory pool of one shard, without the thread cache: every pair goes to the shard.
fn one_shard_uncached_pool() -> Pool {
    let cfg = PoolConfig {
        shards: 1,
        thread_cache: 0,
        ..Default::default()
    };
    Pool::new(HostMemorySource, cfg).unwrap()
}

/// A host-memory pool of `shards` shards without the thread cache, whose `max_bytes` allows one
/// 128 KiB chunk.
fn one_chunk_pool(shards: usize) -> Pool {
    let cfg = PoolConfig {
        chunk_size: 128 << 10,
        max_chunk_size: 128 << 10,
        dedicated_threshold: 64 << 10,
        max_bytes: 128 << 10,
        shards,
        thread_cache: 0,
        ..Default::default()
    };
    Pool::new(HostMemorySource, cfg).unwrap()
}

/// Allocates 32 KiB blocks of [`one_chunk_pool`] into `blocks` until the pool refuses one: that
/// error.
fn fill_to_the_limit(pool: &Pool, blocks: &mut Vec<Block>) -> Error {
    loop {
        match pool.alloc(32 << 10, 16) {
            Ok(b) => blocks.push(b),
            Err(e) => return e,
        }
        assert!(blocks.len() < 8, "the limit of one chunk did not hold");
    }
}

#[test]
fn blocks_are_disjoint_aligned_and_written() {
    let pool = small_pool(1);
    let mut blocks: Vec<Block> = (1..40u64)
        .map(|i| pool.alloc(i * 7, 1 << (i % 7)).unwrap())
        .collect();
    for (i, b) in blocks.iter_mut().enumerate() {
        assert_eq!(b.host_ptr() as usize % (1 << ((i + 1) % 7)), 0);
        b.fill(0, b.size(), i as u8).unwrap();
    }
    for (i, b) in blocks.iter().enumerate() {
        assert!(b
            .read_vec(0, b.size() as usize)
            .unwrap()
            .iter()
            .all(|&x| x == i as u8));
    }
    let big = pool.alloc(100 << 10, 64).unwrap();
    assert!(big.is_dedicated());
    assert_eq!(pool.stats().dedicated_chunks, 1);
}

#[test]
fn last_block_frees_the_shard_after_the_pool() {
    let pool = small_pool(2);
    let a = pool.alloc(48, 16).unwrap();
    let b = pool.clone().alloc(4096, 4096).unwrap();
    let d = pool.alloc(80 << 10, 16).unwrap();
    drop(pool);
    let t = std::thread::spawn(move || drop(a));
    t.join().unwrap();
    drop(d);
    drop(b);
}

#[test]
fn pool_dropped_with_no_blocks_frees_everything() {
    let pool = small_pool(3);
    drop(pool.alloc(16, 16).unwrap());
    assert_eq!(pool.trim(), 1);
    drop(pool);
}

/// One shard of 128 KiB chunks, dedicated blocks from 64 KiB.
fn one_shard_config() -> PoolConfig {
    PoolConfig {
        chunk_size: 128 << 10,
        max_chunk_size: 128 << 10,
        dedicated_threshold: 64 << 10,
        shards: 1,
        ..Default::default()
    }
}

/// Runs `f` on a new thread whose shard among `n` (`shards::thread_shard`) is one `wanted`
/// accepts; returns that shard and what `f` returned. Threads take their shards in turn across
/// the process, and tests running beside this one take turns too, so a few threads may be
/// started before one lands on a wanted shard.
fn on_a_thread_of_shard<R: Send>(
    n: usize,
    wanted: impl Fn(usize) -> bool + Sync,
    f: impl Fn() -> R + Sync,
) -> (usize, R) {
    (0..64)
        .find_map(|_| {
            std::thread::scope(|s| {
                s.spawn(|| {
                    let shard = shards::thread_shard(n);
                    wanted(shard).then(|| (shard, f()))
                })
                .join()
                .unwrap()
            })
        })
        .expect("none of 64 threads landed on a wanted shard")
}

fn cached_pool(depth: usize) -> Pool {
    let cfg = PoolConfig {
        chunk_size: 128 << 10,
        max_chunk_size: 128 << 10,
        dedicated_threshold: 64 << 10,
        shards: 2,
        thread_cache: depth,
        ..Default::default()
    };
    Pool::new(HostMemorySource, cfg).unwrap()
}

#[test]
fn the_thread_cache_is_on_by_default_and_can_be_turned_off() {
    let config = PoolConfig::default();
    assert_eq!(config.thread_cache, magazine::DEFAULT_DEPTH);
    assert_eq!(config.thread_cache_bytes, magazine::DEFAULT_BYTES);
    let pool = Pool::new(HostMemorySource, config).unwrap();
    let a = pool.alloc(100, 16).unwrap();
    let p = a.host_ptr();
    drop(a);
    assert_eq!(pool.alloc(100, 16).unwrap().host_ptr(), p, "reused");
    magazine::release_thread_cache();

    let off = cached_pool(0);
    drop(off.alloc(100, 16).unwrap());
    assert_eq!(
        magazine::thread_cached_blocks(),
        0,
        "opt-out: nothing cached"
    );
    assert_eq!(off.stats().bytes_allocated, 0);
}

#[test]
fn thread_cache_reuses_freed_blocks() {
    let pool = cached_pool(4);
    let a = pool.alloc(256, 16).unwrap();
    let p = a.host_ptr();
    drop(a);
    assert_eq!(magazine::thread_cached_blocks(), 1);
    let s = pool.stats();
    assert_eq!(
        (s.bytes_in_use, s.bytes_cached),
        (0, 256),
        "cached, not in use"
    );
    assert_eq!(s.bytes_allocated, 256, "a cached block stays allocated");
    // Same 16-byte bucket: the cached block comes back.
    let b = pool.alloc(250, 16).unwrap();
    assert_eq!((b.host_ptr(), b.size()), (p, 250));
    assert_eq!(magazine::thread_cached_blocks(), 0);
    drop(b);
    // Another bucket: a fresh block.
    let c = pool.alloc(100, 16).unwrap();
    assert_ne!(c.host_ptr(), p);
    // A stricter alignment than the cached block has: the slow path, correctly aligned.
    let d = pool.alloc(250, 4096).unwrap();
    assert_eq!(d.host_ptr() as usize % 4096, 0);
    drop(d);
    magazine::release_thread_cache();
    assert_eq!(magazine::thread_cached_blocks(), 0);
    assert_eq!(pool.stats().bytes_in_use, 100);
    assert_eq!(
        pool.stats().bytes_allocated,
        112,
        "100 rounded to the 16-byte granule"
    );
    drop(c);
    assert_eq!(
        pool.trim(),
        1,
        "trim takes the cached block back, then frees the empty chunk"
    );
    assert_eq!(
        pool.stats(),
        PoolStats {
            shards: pool.stats().shards,
            ..PoolStats::default()
        }
    );
}

/// A bucket is a stack of the records it keeps: blocks freed one after another come back last
/// in, first out, each once, and a trim takes every one of them back.
#[test]
fn a_thread_cache_bucket_hands_back_each_block_last_in_first_out() {
    let pool = cached_pool(8);
    let blocks: Vec<Block> = (0..6).map(|_| pool.alloc(256, 16).unwrap()).collect();
    let addrs: Vec<_> = blocks.iter().map(Block::host_ptr).collect();
    drop(blocks);
    assert_eq!(magazine::thread_cached_blocks(), 6);
    let again: Vec<Block> = (0..6).map(|_| pool.alloc(256, 16).unwrap()).collect();
    let mut reversed = addrs.clone();
    reversed.reverse();
    assert_eq!(
        again.iter().map(Block::host_ptr).collect::<Vec<_>>(),
        reversed
    );
    assert_eq!(magazine::thread_cached_blocks(), 0);
    // Freed again, interleaved with another bucket's blocks: each bucket keeps its own.
    let other: Vec<Block> = (0..3).map(|_| pool.alloc(64, 16).unwrap()).collect();
    let mut other = other.into_iter();
    for b in again {
        drop(b);
        drop(other.next());
    }
    assert_eq!(magazine::thread_cached_blocks(), 9);
    let s = pool.stats();
    assert_eq!((s.blocks_cached, s.bytes_cached), (9, 6 * 256 + 3 * 64));
    // The last one freed (`again`'s last: the first allocated) is on top.
    assert_eq!(pool.alloc(256, 16).unwrap().host_ptr(), addrs[0]);
    pool.trim();
    assert_eq!(magazine::thread_cached_blocks(), 0);
    assert_eq!(
        pool.stats(),
        PoolStats {
            shards: pool.stats().shards,
            ..PoolStats::default()
        },
        "every cached block went back and the chunk with them"
    );
}

#[test]
fn thread_cache_is_bounded_per_bucket_and_in_bytes() {
    let pool = cached_pool(3);
    let blocks: Vec<Block> = (0..10).map(|_| pool.alloc(64, 16).unwrap()).collect();
    drop(blocks);
    assert_eq!(magazine::thread_cached_blocks(), 3);
    let s = pool.stats();
    assert_eq!((s.blocks_cached, s.bytes_cached), (3, 3 * 64));
    // Blocks too large for the cache go straight back.
    drop(pool.alloc(8192, 16).unwrap());
    assert_eq!(magazine::thread_cached_blocks(), 3);
    drop(pool);
    assert_eq!(
        magazine::thread_cached_blocks(),
        0,
        "dropping the pool empties it"
    );

    // The byte budget: 4 KiB blocks, 10 KiB allowed: two fit, whatever the depth.
    let pool = Pool::new(
        HostMemorySource,
        PoolConfig {
            thread_cache: 16,
            thread_cache_bytes: 10 << 10,
            ..Default::default()
        },
    )
    .unwrap();
    let blocks: Vec<Block> = (0..6).map(|_| pool.alloc(4096, 16).unwrap()).collect();
    drop(blocks);
    assert_eq!(magazine::thread_cached_blocks(), 2);
    assert_eq!(pool.stats().bytes_cached, 8192);
    drop(pool);
    assert_eq!(magazine::thread_cached_blocks(), 0);
}

#[test]
fn thread_cache_serves_the_most_recent_pools() {
    let pools: Vec<Pool> = (0..=magazine::POOLS_PER_THREAD)
        .map(|_| cached_pool(4))
        .collect();
    // One cached block in each of the first POOLS_PER_THREAD pools.
    for p in &pools[..magazine::POOLS_PER_THREAD] {
        drop(p.alloc(32, 16).unwrap());
    }
    assert_eq!(magazine::thread_cached_blocks(), magazine::POOLS_PER_THREAD);
    // Using pool 0 again makes pool 1 the least recently used...
    drop(pools[0].alloc(48, 16).unwrap());
    // ...so one more pool evicts pool 1's block, and keeps the rest.
    let x = pools[magazine::POOLS_PER_THREAD].alloc(32, 16).unwrap();
    assert_eq!(pools[1].stats().bytes_cached, 0);
    assert_eq!(pools[0].stats().bytes_cached, 32 + 48);
    assert_eq!(pools[2].stats().bytes_cached, 32);
    // A block of a pool this thread no longer serves is freed, not cached.
    let y = pools[1].alloc(16, 16).unwrap(); // serves pool 1 again, evicting pool 2
    assert_eq!(pools[2].stats().bytes_cached, 0);
    drop(x);
    drop(y);
    assert_eq!(pools[1].stats().bytes_cached, 16);
    magazine::release_thread_cache();
    assert!(pools
        .iter()
        .all(|p| p.stats().bytes_in_use + p.stats().bytes_cached == 0));
}

#[test]
fn thread_cache_is_released_when_its_thread_exits() {
    let pool = cached_pool(8);
    let p = pool.clone();
    std::thread::spawn(move || {
        let blocks: Vec<Block> = (0..20).map(|i| p.alloc(16 + i * 16, 16).unwrap()).collect();
        drop(blocks);
        assert_eq!(magazine::thread_cached_blocks(), 20);
    })
    .join()
    .unwrap();
    assert_eq!(pool.stats().bytes_in_use, 0);
    assert_eq!(pool.stats().bytes_cached, 0);
    // A block made on one thread and cached on another still frees correctly.
    let block = pool.alloc(64, 64).unwrap();
    let p = pool.clone();
    std::thread::spawn(move || {
        drop(p.alloc(64, 16).unwrap()); // this thread's cache now serves the pool
        drop(block);
        assert_eq!(magazine::thread_cached_blocks(), 2);
        let again = p.alloc(64, 64).unwrap();
        assert_eq!(again.host_ptr() as usize % 64, 0);
    })
    .join()
    .unwrap();
    assert_eq!(pool.stats().bytes_in_use, 0);
    assert!(pool.trim() >= 1);
}

/// A thread that cached blocks and then waits (idle, not exiting) until `go` is sent.
fn idle_thread_with_cached_blocks(
    pool: Pool,
    blocks: usize,
) -> (
    std::sync::mpsc::Sender<()>,
    std::thread::JoinHandle<Pool>,
    std::sync::mpsc::Receiver<()>,
) {
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (ready, is_ready) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let live: Vec<Block> = (0..blocks)
            .map(|i| pool.alloc(32 + 16 * i as u64, 16).unwrap())
            .collect();
        drop(live);
        assert_eq!(magazine::thread_cached_blocks(), blocks);
        ready.send(()).unwrap();
        wait.recv().unwrap();
        pool
    });
    (go, t, is_ready)
}

#[test]
fn trim_takes_back_an_idle_threads_cached_blocks() {
    let pool = cached_pool(8);
    let (go, t, ready) = idle_thread_with_cached_blocks(pool.clone(), 5);
    ready.recv().unwrap();
    assert_eq!(
        pool.stats().bytes_cached,
        (0..5u64).map(|i| 32 + 16 * i).sum::<u64>()
    );
    // From this thread, while the other one sleeps: its blocks come back, the chunk goes.
    assert_eq!(pool.trim(), 1);
    let s = pool.stats();
    assert_eq!((s.bytes_cached, s.bytes_allocated, s.chunks), (0, 0, 0));
    go.send(()).unwrap();
    let pool = t.join().unwrap();
    // The idle thread's cache no longer serves the pool; the pool works as before.
    drop(pool.alloc(64, 16).unwrap());
    assert_eq!(pool.stats().bytes_cached, 64);
}

#[test]
fn stats_read_other_threads_caches_without_interrupting_them() {
    use crate::core::sync::VISITS_BY_THIS_THREAD;
    let visits = || VISITS_BY_THIS_THREAD.with(std::cell::Cell::get);
    let pool = cached_pool(8);
    let (go, t, ready) = idle_thread_with_cached_blocks(pool.clone(), 5);
    ready.recv().unwrap();
    let before = visits();
    // Exact while the other thread is idle: its published figures are its cache's.
    let s = pool.stats();
    assert_eq!(
        (s.blocks_cached, s.bytes_cached),
        (5, (0..5).map(|i| 32 + 16 * i).sum())
    );
    assert_eq!(pool.report().stats.blocks_cached, 5);
    assert_eq!(
        visits(),
        before,
        "a snapshot makes no handshake with the caches' threads"
    );
    pool.trim();
    assert_eq!(visits(), before + 1, "a trim does: it takes the blocks");
    assert_eq!(
        pool.stats().blocks_cached,
        0,
        "what the visit took is published"
    );
    go.send(()).unwrap();
    let pool = t.join().unwrap();
    // The figures follow the owner's own takes and frees.
    let a = pool.alloc(48, 16).unwrap();
    let b = pool.alloc(48, 16).unwrap();
    drop((a, b));
    assert_eq!(pool.stats().blocks_cached, 2);
    drop(pool.alloc(40, 16).unwrap());
    // A hit takes a 48-byte block and the free puts it back (2 blocks, 96 bytes); while another
    // test's pool drop visits this thread's cache, both skip it and the free caches the new
    // 40-byte block afterwards (3 blocks, 136 bytes). Either way the figures are the cache's.
    let s = pool.stats();
    assert!(
        [(2, 96), (3, 136)].contains(&(s.blocks_cached, s.bytes_cached)),
        "{s:?}"
    );
    magazine::release_thread_cache();
    assert_eq!(pool.stats().blocks_cached, 0);
}

#[test]
fn reports_show_the_thread_cache_and_its_handshake() {
    let pool = cached_pool(8);
    let t = pool.thread_cache().expect("on");
    assert_eq!(
        t,
        ThreadCacheReport {
            depth: 8,
            max_bytes: magazine::DEFAULT_BYTES,
            handshake: magazine::handshake(),
        }
    );
    let report = pool.report();
    assert_eq!(report.thread_cache, Some(t));
    let text = report.to_string();
    assert!(
        text.contains("thread caches: 8 blocks per bucket"),
        "{text}"
    );
    assert!(
        text.contains(&format!("handshake: {}", t.handshake)),
        "{text}"
    );
    let off = cached_pool(0);
    assert_eq!(
        (off.thread_cache(), off.report().thread_cache),
        (None, None)
    );
    assert!(off.report().to_string().contains("thread caches: off"));
}

/// The handshake taken is the one the kernel offers: `membarrier`'s private expedited command
/// where the kernel lists it (as on every machine this project runs on), fences otherwise.
#[cfg(all(target_os = "linux", not(miri)))]
#[test]
fn the_handshake_is_membarrier_where_the_kernel_offers_it() {
    const QUERY: libc::c_int = 0;
    const PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    // SAFETY: membarrier's query takes no pointers; it returns a bit mask or an error.
    let offered = unsafe { libc::syscall(libc::SYS_membarrier, QUERY, 0 as libc::c_uint, 0) };
    let expected = if offered >= 0 && offered & PRIVATE_EXPEDITED != 0 {
        magazine::Handshake::Membarrier
    } else {
        magazine::Handshake::Fence
    };
    assert_eq!(
        magazine::handshake(),
        expected,
        "membarrier query: {offered:#x}"
    );
}

/// Host chunks that count how many are alive.
struct CountingSource(Arc<AtomicUsize>);

struct CountedChunk {
    host: Box<dyn ChunkMemory>,
    live: Arc<AtomicUsize>,
}

// SAFETY: every method forwards to the wrapped host chunk, which keeps its promises; the flushes
// do nothing (host memory is coherent).
unsafe impl ChunkMemory for CountedChunk {
    fn host_ptr(&self) -> *mut u8 {
        self.host.host_ptr()
    }
    fn device_ptr(&self) -> Option<u64> {
        None
    }
    fn size(&self) -> u64 {
        self.host.size()
    }
    fn flush_ranges(&self, _: &[(u64, u64)]) -> Result<()> {
        Ok(())
    }
    fn invalidate_ranges(&self, _: &[(u64, u64)]) -> Result<()> {
        Ok(())
    }
}

impl Drop for CountedChunk {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

// SAFETY: its chunks are HostMemorySource's (the size asked for, disjoint); the atom is 64.
unsafe impl ChunkSource for CountingSource {
    fn allocate_chunk(&self, size: u64) -> Result<Box<dyn ChunkMemory>> {
        let host = HostMemorySource.allocate_chunk(size)?;
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(CountedChunk {
            host,
            live: self.0.clone(),
        }))
    }
    fn atom_size(&self) -> u64 {
        64
    }
    fn is_non_coherent(&self) -> bool {
        false
    }
}

#[test]
fn dropping_the_pool_takes_back_an_idle_threads_cached_blocks() {
    let live = Arc::new(AtomicUsize::new(0));
    let cfg = PoolConfig {
        chunk_size: 128 << 10,
        max_chunk_size: 128 << 10,
        shards: 1,
        ..Default::default()
    };
    let pool = Pool::new(CountingSource(live.clone()), cfg).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Pool>();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let pool = rx.recv().unwrap();
        drop(pool.alloc(256, 16).unwrap());
        drop(pool); // this thread's last handle; its cache keeps the block
        assert_eq!(magazine::thread_cached_blocks(), 1);
        wait.recv().unwrap(); // idle until the pool is gone
        assert_eq!(
            magazine::thread_cached_blocks(),
            0,
            "taken back by the drop"
        );
    });
    tx.send(pool.clone()).unwrap();
    while live.load(Ordering::SeqCst) == 0 {
        std::thread::yield_now();
    }
    // Wait for the other thread's handle to go, then drop the last one here.
    while Arc::strong_count(&pool.shards) > 1 {
        std::thread::yield_now();
    }
    drop(pool);
    assert_eq!(live.load(Ordering::SeqCst), 0, "the chunk was freed");
    go.send(()).unwrap();
    t.join().unwrap();
}

/// Threads churn tagged blocks through their caches while another thread trims and reads the
/// statistics: no block is handed out twice (tags survive), and at the end every byte is back.
#[test]
fn churn_with_concurrent_trims_loses_and_duplicates_nothing() {
    let (threads, ops) = if cfg!(miri) { (2, 60) } else { (4, 20_000) };
    let pool = cached_pool(8);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let pool = &pool;
                s.spawn(move || {
                    let mut live: Vec<(Block, u8)> = Vec::new();
                    for op in 0..ops {
                        let tag = (t * 61 + op) as u8;
                        if live.len() < 16 && (op % 3 != 2 || live.is_empty()) {
                            let size = 16 + (op as u64 * 40) % 2000;
                            let mut b = pool.alloc(size, 16).unwrap();
                            b.fill(0, size, tag).unwrap();
                            live.push((b, tag));
                        } else {
                            let (b, tag) = live.swap_remove(op % live.len());
                            let bytes = b.read_vec(0, b.size() as usize).unwrap();
                            assert!(bytes.iter().all(|&x| x == tag), "block shared");
                        }
                    }
                    for (b, tag) in live {
                        assert!(b.read_vec(0, 1).unwrap()[0] == tag);
                    }
                })
            })
            .collect();
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                pool.trim();
                let st = pool.stats();
                assert!(st.bytes_in_use + st.bytes_cached <= st.bytes_allocated);
                std::thread::yield_now();
            }
        });
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    pool.trim();
    let s = pool.stats();
    assert_eq!(
        (s.bytes_in_use, s.bytes_cached, s.bytes_allocated),
        (0, 0, 0)
    );
}

#[test]
fn oversized_thread_cache_is_refused() {
    let cfg = PoolConfig {
        thread_cache: magazine::MAX_DEPTH + 1,
        ..Default::default()
    };
    let e = Pool::new(HostMemorySource, cfg).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument(InvalidArgument::ThreadCacheDepth { depth, max })
                if depth == magazine::MAX_DEPTH + 1 && max == magazine::MAX_DEPTH
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "invalid argument: thread_cache {} exceeds {} blocks per size bucket",
            magazine::MAX_DEPTH + 1,
            magazine::MAX_DEPTH
        )
    );
}

#[test]
#[cfg(feature = "gpu-alloc")]
fn thread_cache_is_ignored_by_gpu_alloc_backends() {
    let cfg = PoolConfig {
        chunk_size: 128 << 10,
        max_chunk_size: 128 << 10,
        dedicated_threshold: 64 << 10,
        thread_cache: 8,
        backend: Backend::GpuAlloc(GpuAllocStrategy::FreeList),
        ..Default::default()
    };
    let pool = Pool::new(HostMemorySource, cfg).unwrap();
    let a = pool.alloc(64, 16).unwrap();
    drop(a);
    assert_eq!(magazine::thread_cached_blocks(), 0);
    let b = pool.alloc(64, 16).unwrap();
    assert_eq!(b.size(), 64);
}

#[test]
fn blocks_outliving_their_pool_skip_the_cache() {
    let pool = cached_pool(4);
    let a = pool.alloc(64, 16).unwrap();
    drop(pool);
    drop(a); // the pool is gone: freed to its shard, which it then frees
    assert_eq!(magazine::thread_cached_blocks(), 0);
}

/// A free that empties a chunk keeps it while the shard holds no more than `keep_empty_chunks`
/// empty chunks and hands the ones beyond back at once (no cache: every free reaches the shard).
#[test]
fn frees_keep_empty_chunks_up_to_the_setting() {
    for keep in [0usize, 1, 2] {
        let pool = Pool::new(
            HostMemorySource,
            PoolConfig {
                keep_empty_chunks: keep,
                thread_cache: 0,
                ..one_shard_config()
            },
        )
        .unwrap();
        // Five blocks of 48 KiB, two to a 128 KiB chunk: three chunks.
        let mut blocks: Vec<Block> = (0..5).map(|_| pool.alloc(48 << 10, 16).unwrap()).collect();
        assert_eq!(pool.stats().chunks, 3, "keep {keep}");
        // Pairs in a chunk that never empties change nothing.
        for _ in 0..3 {
            drop(pool.alloc(16, 16).unwrap());
        }
        assert_eq!(pool.stats().chunks, 3, "keep {keep}");
        // Empty the chunks one by one: each emptied one stays while at most `keep` are empty.
        for emptied in 1..=3u64 {
            let serial = blocks[0].chunk_serial();
            blocks.retain(|b| b.chunk_serial() != serial);
            let in_use = 3 - emptied;
            let expected = in_use + emptied.min(keep as u64);
            let stats = pool.stats();
            assert_eq!(stats.chunks, expected, "keep {keep}, {emptied} emptied");
            assert_eq!(stats.bytes_reserved, expected * (128 << 10), "keep {keep}");
        }
        // A pair that empties a kept chunk again keeps it.
        if keep > 0 {
            drop(pool.alloc(16, 16).unwrap());
            assert_eq!(pool.stats().chunks, keep as u64, "keep {keep}");
        }
    }
}

/// What the pool asked of a [`DmaSource`]'s chunks.
#[derive(Default)]
struct DmaLog {
    flushes: AtomicUsize,
    dma_reads: AtomicUsize,
}

/// Host chunks that pretend to be non-coherent, to lie in one device range and to have a copy
/// engine for reads of at least 1 KiB: the seam's optional parts, without a driver.
struct DmaSource(Arc<DmaLog>);

struct DmaChunk {
    host: Box<dyn ChunkMemory>,
    log: Arc<DmaLog>,
}

// SAFETY: forwards the host chunk's values, which keep its contract; `read_dma` writes only `dst`.
unsafe impl ChunkMemory for DmaChunk {
    fn host_ptr(&self) -> *mut u8 {
        self.host.host_ptr()
    }
    fn device_ptr(&self) -> Option<u64> {
        None
    }
    fn size(&self) -> u64 {
        self.host.size()
    }
    fn flush_ranges(&self, _: &[(u64, u64)]) -> Result<()> {
        self.log.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn invalidate_ranges(&self, _: &[(u64, u64)]) -> Result<()> {
        Ok(())
    }
    fn read_dma(&self, offset: u64, dst: &mut [u8]) -> Option<Result<()>> {
        if dst.len() < 1024 {
            return None;
        }
        self.log.dma_reads.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the pool passes an in-bounds range of this live chunk.
        let src = unsafe {
            std::slice::from_raw_parts(self.host.host_ptr().add(offset as usize), dst.len())
        };
        dst.copy_from_slice(src);
        Some(Ok(()))
    }
}

// SAFETY: host chunks of the requested size; a constant power-of-two atom.
unsafe impl ChunkSource for DmaSource {
    fn allocate_chunk(&self, size: u64) -> Result<Box<dyn ChunkMemory>> {
        Ok(Box::new(DmaChunk {
            host: HostMemorySource.allocate_chunk(size)?,
            log: self.0.clone(),
        }))
    }
    fn atom_size(&self) -> u64 {
        64
    }
    fn is_non_coherent(&self) -> bool {
        true
    }
    fn device_range(&self) -> Option<(u64, u64)> {
        Some((0x7000_0000, 1 << 30))
    }
}

#[test]
fn the_chunk_decides_dma_reads_after_pending_writes_are_flushed() {
    let log = Arc::new(DmaLog::default());
    let cfg = one_shard_config();
    let pool = Pool::new(DmaSource(log.clone()), cfg).unwrap();
    assert_eq!(pool.is_contiguous(), Some((0x7000_0000, 1 << 30)));
    assert_eq!(small_pool(1).is_contiguous(), None);

    let mut block = pool.alloc(4096, 64).unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    block.write(0, &data).unwrap();
    assert!(block.has_pending_writes());
    // A large read goes to the chunk's engine, after the pending writes were pushed.
    assert_eq!(block.read_vec(0, 4096).unwrap(), data);
    assert_eq!(log.dma_reads.load(Ordering::Relaxed), 1);
    assert_eq!(log.flushes.load(Ordering::Relaxed), 1);
    assert!(!block.has_pending_writes());
    // A small read is the chunk's to refuse: CPU loads, no second flush (nothing pending).
    assert_eq!(block.read_vec(100, 200).unwrap(), &data[100..300]);
    assert_eq!(log.dma_reads.load(Ordering::Relaxed), 1);
    assert_eq!(log.flushes.load(Ordering::Relaxed), 1);
}

#[test]
fn requests_are_validated_once_for_every_path() {
    let pool = cached_pool(4);
    // Shared, cached and dedicated sizes all meet the same check, with the core's messages.
    for size in [16, 64 << 10, u64::MAX] {
        for align in [0, 3, 1 << 20] {
            assert!(
                matches!(pool.alloc(size, align), Err(Error::InvalidArgument(_))),
                "{size} {align}"
            );
        }
    }
    // The messages callers (and the Python package's tests) know; too large for any chunk is
    // refused before the source is asked.
    for (size, align, text) in [
        (0, 16, "allocation size is zero"),
        (16, 3, "alignment 3 is not a power of two"),
        (
            16,
            1 << 20,
            "alignment 1048576 exceeds the pool's maximum 65536",
        ),
        (
            u64::MAX,
            16,
            "allocation of 18446744073709551615 bytes is too large",
        ),
    ] {
        let e = pool.alloc(size, align).unwrap_err();
        assert_eq!(e.to_string(), format!("invalid argument: {text}"));
    }
    assert_eq!(pool.stats().bytes_reserved, 0);
}

/// A source whose chunks are half the size asked for (and say so): the pool must not carve
/// blocks past their end. Its atom is configurable, to check the pool's own validation.
struct ShortSource {
    atom: u64,
}

// SAFETY: deliberately breaks the "at least `size` bytes" promise (its chunks report their real,
// shorter size, so nothing reads or writes past them unless the pool trusts the request size),
// and the atom promise when asked to: the pool must refuse both.
unsafe impl ChunkSource for ShortSource {
    fn allocate_chunk(&self, size: u64) -> Result<Box<dyn ChunkMemory>> {
        HostMemorySource.allocate_chunk(size / 2)
    }
    fn atom_size(&self) -> u64 {
        self.atom
    }
    fn is_non_coherent(&self) -> bool {
        false
    }
}

#[test]
fn short_chunks_and_bad_atoms_are_refused() {
    let cfg = one_shard_config();
    let pool = Pool::new(ShortSource { atom: 64 }, cfg.clone()).unwrap();
    // Shared growth and a dedicated block both meet a 64 KiB chunk where 128 KiB (or the
    // dedicated size) was asked for.
    for size in [64, 100 << 10] {
        match pool.alloc(size, 16) {
            Err(Error::Internal(msg)) => assert!(msg.contains("chunk source returned"), "{msg}"),
            other => panic!("{size}: {other:?}"),
        }
    }
    assert_eq!(pool.stats().bytes_reserved, 0, "nothing kept");
    for atom in [0, 48] {
        let e = Pool::new(ShortSource { atom }, cfg.clone()).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
}

#[test]
fn reports_list_labeled_blocks_by_label_and_chunk() {
    let pool = small_pool(2);
    let mut gains = Vec::new();
    for _ in 0..3 {
        gains.push(pool.alloc_labeled(256, 64, "gains").unwrap());
    }
    let delays = pool.alloc_labeled(1000, 16, "delays").unwrap();
    let scratch = pool.alloc(48, 16).unwrap();
    let mut big = pool.alloc(100 << 10, 64).unwrap();
    big.set_label("weights");
    assert_eq!(big.label().as_deref(), Some("weights"));
    assert_eq!(scratch.label(), None);

    let r = pool.report();
    let labels: Vec<(&str, u64, u64)> = r
        .labels
        .iter()
        .map(|l| (&*l.label, l.blocks, l.bytes))
        .collect();
    assert_eq!(
        labels,
        [
            ("weights", 1, 100 << 10),
            ("delays", 1, 1000),
            ("gains", 3, 768)
        ]
    );
    assert_eq!((r.unlabeled_blocks, r.unlabeled_bytes), (1, 48));
    assert_eq!(r.blocks.len(), 5);
    let dedicated: Vec<_> = r
        .chunks
        .iter()
        .filter(|c| c.place == ChunkPlace::Dedicated)
        .collect();
    assert_eq!(dedicated.len(), 1);
    assert_eq!(dedicated[0].labeled_bytes, 100 << 10);
    let weights = r.blocks.iter().find(|b| &*b.label == "weights").unwrap();
    assert_eq!((weights.place, weights.offset), (ChunkPlace::Dedicated, 0));
    // Every shared labeled block is counted in its chunk, which holds it.
    let shared_labeled: u64 = r
        .chunks
        .iter()
        .filter(|c| c.place != ChunkPlace::Dedicated)
        .map(|c| c.labeled_bytes)
        .sum();
    assert_eq!(shared_labeled, 768 + 1000);
    for b in r.blocks.iter().filter(|b| b.place != ChunkPlace::Dedicated) {
        let c = r.chunks.iter().find(|c| c.place == b.place).unwrap();
        assert!(b.offset + b.size <= c.size && c.allocations >= 1);
    }
    assert!((0.0..=1.0).contains(&r.fragmentation));
    let text = r.to_string();
    for needle in [
        "\"gains\"",
        "3 blocks",
        "(unlabeled)",
        "dedicated",
        "labeled blocks:",
    ] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }

    // Labels leave with their blocks; a new block in the same place has none.
    // (Which of the three places comes back depends on the thread cache, on by default.)
    let places: Vec<_> = gains.iter().map(|b| b.host_ptr()).collect();
    drop(gains);
    drop(big);
    let again = pool.alloc(256, 64).unwrap();
    assert!(
        places.contains(&again.host_ptr()),
        "a freed place is reused"
    );
    assert_eq!(again.label(), None);
    let r = pool.report();
    assert_eq!(r.labels.len(), 1);
    assert_eq!(&*r.labels[0].label, "delays");
    assert_eq!((r.unlabeled_blocks, r.unlabeled_bytes), (2, 48 + 256));
    assert!(r.chunks.iter().all(|c| c.place != ChunkPlace::Dedicated));
    drop((delays, scratch, again));
    assert!(pool.report().blocks.is_empty());
}

#[test]
fn labels_do_not_survive_the_thread_cache() {
    let pool = cached_pool(4);
    let a = pool.alloc_labeled(64, 16, "tiny").unwrap();
    let p = a.host_ptr();
    drop(a);
    let b = pool.alloc(64, 16).unwrap();
    assert_eq!(b.host_ptr(), p, "served from the thread cache");
    assert_eq!(b.label(), None);
    assert!(pool.report().labels.is_empty());
    drop(b);
    magazine::release_thread_cache();
}

// Bad input gets a named error, never a panic, an abort or a driver call.

/// `before_read` checks its range like `after_write`, on coherent and non-coherent memory.
#[test]
fn before_read_is_range_checked() {
    let log = Arc::new(DmaLog::default());
    let cfg = PoolConfig {
        chunk_size: 128 << 10,
        max_chunk_size: 128 << 10,
        shards: 1,
        ..Default::default()
    };
    let non_coherent = Pool::new(DmaSource(log), cfg).unwrap();
    for pool in [small_pool(1), non_coherent] {
        let _neighbour = pool.alloc(64, 64).unwrap();
        let b = pool.alloc(64, 64).unwrap();
        b.before_read(0, 64).unwrap();
        b.before_read(64, 0).unwrap();
        // Past the block but inside the chunk, and past u64: both refused.
        for (offset, len) in [(0, 65), (60, 8), (64, 1), (u64::MAX, 2), (1, u64::MAX)] {
            assert!(
                matches!(b.before_read(offset, len), Err(Error::InvalidArgument(_))),
                "{offset}+{len}"
            );
        }
    }
}

/// On non-coherent memory a block holds whole atoms but is the size asked for: its bounds, and
/// the pool's bytes in use, are the request's.
#[test]
fn non_coherent_block_has_the_requested_size() {
    for thread_cache in [0, PoolConfig::default().thread_cache] {
        let cfg = PoolConfig {
            chunk_size: 128 << 10,
            max_chunk_size: 128 << 10,
            shards: 1,
            thread_cache,
            ..Default::default()
        };
        let pool = Pool::new(DmaSource(Arc::default()), cfg).unwrap();
        let b = pool.alloc(100, 16).unwrap();
        assert_eq!(b.size(), 100);
        assert!(b.before_read(0, 101).is_err());
        assert_eq!(pool.stats().bytes_in_use, 128);
        drop(b);
        assert_eq!(pool.stats().bytes_in_use, 0);
    }
}

/// `read_vec` checks the range before it allocates anything.
#[test]
fn read_vec_checks_before_allocating() {
    let pool = small_pool(1);
    let b = pool.alloc(100, 16).unwrap();
    for len in [1 << 45, usize::MAX, 101] {
        let e = b.read_vec(0, len).unwrap_err();
        assert!(
            e.to_string().contains("outside the 100-byte allocation"),
            "{e}"
        );
    }
    assert!(b.read_vec(100, 1).is_err());
    assert_eq!(b.read_vec(100, 0).unwrap(), Vec::<u8>::new());
}

/// The atom round-up of a huge request is an overflow error, not a panic.
#[test]
fn atom_round_up_cannot_overflow() {
    let cfg = PoolConfig {
        chunk_size: 128 << 10,
        max_chunk_size: 128 << 10,
        dedicated_threshold: u64::MAX,
        shards: 1,
        ..Default::default()
    };
    let pool = Pool::new(DmaSource(Arc::default()), cfg).unwrap();
    assert!(pool.is_non_coherent());
    for size in [
        u64::MAX - 1,
        u64::MAX,
        crate::core::alloc::MAX_CHUNK_SIZE + 1,
    ] {
        let e = pool.alloc(size, 1).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument(InvalidArgument::Alloc(_)))
                && e.to_string().contains("too large"),
            "{e}"
        );
    }
    assert_eq!(pool.stats().bytes_reserved, 0);
}

/// Settings no pool can work with are refused by `Pool::new`, before any work.
#[test]
fn absurd_configurations_are_refused_at_construction() {
    let cases = [
        (
            PoolConfig {
                shards: 1_000_000,
                ..Default::default()
            },
            "shards exceed the maximum",
        ),
        (
            PoolConfig {
                max_chunk_size: 98_305,
                chunk_size: 65_536,
                ..Default::default()
            },
            "max_chunk_size 98305 must be a non-zero multiple",
        ),
        (
            PoolConfig {
                chunk_size: 1 << 63,
                max_chunk_size: 1 << 63,
                ..Default::default()
            },
            "chunk_size 9223372036854775808 must be",
        ),
    ];
    for (cfg, text) in cases {
        let t = std::time::Instant::now();
        let e = Pool::new(HostMemorySource, cfg).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.to_string().contains(text)),
            "{e}"
        );
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
    }
    // Non-coherent memory with an atom the heap cannot align to: every request would fail.
    let mut cfg = PoolConfig::default();
    cfg.heap.max_align = 16;
    cfg.heap.slab_page_size = 16;
    cfg.heap.max_slab_size = 0;
    cfg.chunk_size = 1 << 20;
    cfg.max_chunk_size = 1 << 20;
    Pool::new(HostMemorySource, cfg.clone()).expect("fine on coherent memory");
    let e = Pool::new(DmaSource(Arc::default()), cfg).unwrap_err();
    assert!(e.to_string().contains("nonCoherentAtomSize 64"), "{e}");
}

/// gpu-alloc's backend reports a pool limit as `side: Limit`, like the native backend.
#[test]
#[cfg(feature = "gpu-alloc")]
fn gpu_alloc_reports_the_pool_limit() {
    for strategy in [GpuAllocStrategy::Buddy, GpuAllocStrategy::FreeList] {
        let cfg = PoolConfig {
            max_bytes: 0,
            backend: Backend::GpuAlloc(strategy),
            ..Default::default()
        };
        let pool = Pool::new(HostMemorySource, cfg).unwrap();
        let e = pool.alloc(64, 16).unwrap_err();
        assert!(
            matches!(
                e,
                Error::OutOfDeviceMemory {
                    side: MemorySide::Limit,
                    ..
                }
            ),
            "{strategy:?}: {e}"
        );
    }
}

/// Host chunks whose "device address" is the host address plus `skew`.
struct SkewedSource(u64);

// SAFETY: its chunks are HostMemorySource's (the size asked for, disjoint); the atom is 64.
unsafe impl ChunkSource for SkewedSource {
    fn allocate_chunk(&self, size: u64) -> Result<Box<dyn ChunkMemory>> {
        Ok(Box::new(SkewedChunk(
            HostMemorySource.allocate_chunk(size)?,
            self.0,
        )))
    }
    fn atom_size(&self) -> u64 {
        64
    }
    fn is_non_coherent(&self) -> bool {
        false
    }
}

struct SkewedChunk(Box<dyn ChunkMemory>, u64);

// SAFETY: the host side forwards to the wrapped host chunk; the skewed device address is only
// compared, never dereferenced.
unsafe impl ChunkMemory for SkewedChunk {
    fn host_ptr(&self) -> *mut u8 {
        self.0.host_ptr()
    }
    fn device_ptr(&self) -> Option<u64> {
        Some(self.0.host_ptr() as u64 + self.1)
    }
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn flush_ranges(&self, _: &[(u64, u64)]) -> Result<()> {
        Ok(())
    }
    fn invalidate_ranges(&self, _: &[(u64, u64)]) -> Result<()> {
        Ok(())
    }
}

/// A dedicated block honours `align`, checked on the device address.
#[test]
fn dedicated_blocks_honour_the_alignment() {
    let cfg = PoolConfig {
        chunk_size: 128 << 10,
        max_chunk_size: 128 << 10,
        dedicated_threshold: 64 << 10,
        ..Default::default()
    };
    let aligned = Pool::new(SkewedSource(0), cfg.clone()).unwrap();
    let b = aligned.alloc(100 << 10, 64 << 10).unwrap();
    assert!(b.is_dedicated() && b.device_ptr().unwrap().is_multiple_of(64 << 10));

    let skewed = Pool::new(SkewedSource(4096), cfg).unwrap();
    let ok = skewed.alloc(100 << 10, 4096).unwrap();
    assert_eq!(ok.device_ptr().unwrap() % 4096, 0);
    let e = skewed.alloc(100 << 10, 8192).unwrap_err();
    assert!(
        matches!(&e, Error::Unsupported(m) if m.contains("not aligned to 8192")),
        "{e}"
    );
    let s = skewed.stats();
    assert_eq!(
        (s.dedicated_chunks, s.bytes_reserved),
        (1, 100 << 10),
        "nothing leaked"
    );
}

/// A shard lock biased to the thread that allocates from it (after `BIAS_AFTER` locks in a row)
/// is revoked by frees from another thread (which may then earn the bias itself), stats and
/// trims: blocks stay whole and the counts exact throughout.
#[test]
fn shard_bias_moves_between_threads_without_losing_blocks() {
    let pool = one_shard_uncached_pool();
    let rounds = if cfg!(miri) { 2 } else { 20 };
    let per_round = if cfg!(miri) { 80 } else { 300 };
    // The one shard, made by the first allocation.
    let shard = || pool.shards.iter().next().expect("the shard is made").1;
    for round in 0..rounds {
        // This thread's locks in a row bias the shard to it (alloc and free alike)...
        let blocks: Vec<Block> = (0..per_round)
            .map(|i| {
                let mut b = pool.alloc(64, 16).unwrap();
                b.fill(0, 64, (i % 251) as u8).unwrap();
                b
            })
            .collect();
        if round == 0 {
            assert!(
                shard().state.is_biased_to_me(),
                "{per_round} locks in a row bias the shard"
            );
        }
        assert_eq!(pool.stats().bytes_in_use, per_round as u64 * 64);
        // ...another thread's frees revoke it; every block is whole when it goes.
        std::thread::scope(|s| {
            s.spawn(|| {
                for (i, b) in blocks.into_iter().enumerate() {
                    assert!(b
                        .read_vec(0, 64)
                        .unwrap()
                        .iter()
                        .all(|&x| x == (i % 251) as u8));
                }
            });
        });
        assert!(
            !shard().state.is_biased_to_me(),
            "the other thread's frees revoked the bias"
        );
        assert_eq!(pool.stats().bytes_in_use, 0);
        pool.trim();
    }
    let s = pool.stats();
    assert_eq!((s.bytes_in_use, s.bytes_allocated), (0, 0));
}

/// Rooms kept by each shard of `pool`.
fn spare_rooms(pool: &Pool) -> Vec<usize> {
    pool.shards
        .iter()
        .map(|(_, cell)| cell.state.lock().spare_records.len())
        .collect()
}

/// A shard keeps the memory of every record of a burst of frees (no allocator call under its
/// lock, none at the next allocations), hands it out again, and gives it back on `trim`. Miri
/// checks the rooms' links.
#[test]
fn a_shard_keeps_its_freed_records_memory_until_trim() {
    let pool = one_shard_uncached_pool();
    let n = if cfg!(miri) { 40 } else { 3000 };
    let blocks: Vec<Block> = (0..n).map(|_| pool.alloc(64, 64).unwrap()).collect();
    assert_eq!(spare_rooms(&pool), [0]);
    drop(blocks);
    assert_eq!(spare_rooms(&pool), [n]);
    let mut again: Vec<Block> = (0..n / 2).map(|_| pool.alloc(64, 64).unwrap()).collect();
    assert_eq!(spare_rooms(&pool), [n - n / 2]);
    for (i, b) in again.iter_mut().enumerate() {
        b.fill(0, 64, i as u8).unwrap();
        assert_eq!(b.len(), 64);
    }
    drop(again);
    assert_eq!(spare_rooms(&pool), [n]);
    pool.trim();
    assert_eq!(spare_rooms(&pool), [0]);
    // The pool works as before, and its drop frees what is kept then.
    let kept: Vec<Block> = (0..3).map(|_| pool.alloc(64, 64).unwrap()).collect();
    drop(kept);
    assert_eq!(spare_rooms(&pool), [3]);
}

/// A thread whose shard may not grow (another shard's chunk took all that `max_bytes` allows)
/// gets its block from the other shard's free space; the pool is out of memory only when no
/// chunk of any shard can hold the block.
#[test]
fn a_shard_that_cannot_grow_allocates_from_another_shards_chunk() {
    let pool = one_chunk_pool(2);
    // This thread's shard takes the one chunk the limit allows.
    let own = shards::thread_shard(2);
    let _first = pool.alloc(256, 16).unwrap();
    // A thread on the other shard.
    let (_, block) = on_a_thread_of_shard(2, |shard| shard != own, || pool.alloc(256, 16));
    let block = block.expect("a block from the first shard's chunk");
    let stats = pool.stats();
    assert_eq!(stats.chunks, 1);
    assert_eq!(stats.shards[own].allocation_count, 2);
    assert_eq!(stats.shards[1 - own].allocation_count, 0);
    drop(block);
    // Until no chunk can hold a block: then the limit, as before.
    let mut blocks = Vec::new();
    let err = fill_to_the_limit(&pool, &mut blocks);
    assert!(err.is_out_of_memory(), "{err}");
    assert!(blocks.len() >= 2, "{} blocks of 32 KiB", blocks.len());
}

/// The 128-byte blocks (adjacent-line prefetch pairs 64-byte lines) that `field` touches in
/// the value at `base`.
fn blocks_of<T>(base: usize, field: &T) -> std::ops::RangeInclusive<usize> {
    let offset = field as *const T as usize - base;
    offset / 128..=(offset + std::mem::size_of_val(field) - 1) / 128
}

#[test]
fn the_shared_state_that_every_pair_reads_lies_on_lines_of_its_own() {
    let pool = small_pool(2);
    // Aligned (and so sized) to 128 bytes: whatever the allocator places beside the pool's state
    // shares no line with it.
    let inner: &PoolInner = &pool.inner;
    let base = inner as *const PoolInner as usize;
    assert_eq!(base % 128, 0, "the pool's state starts a 128-byte block");
    assert_eq!(std::mem::size_of::<PoolInner>() % 128, 0);
    assert_eq!(&*pool.shards as *const Shards as usize % 128, 0);
    assert_eq!(std::mem::size_of::<Shards>() % 128, 0);
    // What allocations and frees write (the counters, the registry's lock, the lent blocks'
    // state) shares no 128-byte block with a field that every allocation or free reads.
    let read_hot = [
        blocks_of(base, &inner.id),
        blocks_of(base, &inner.cache_open),
        blocks_of(base, &inner.cache_enabled),
        blocks_of(base, &inner.inline_cache_max),
        blocks_of(base, &inner.cache_key),
        blocks_of(base, &inner.config),
        blocks_of(base, &inner.non_coherent),
        blocks_of(base, &inner.atom),
    ];
    let written = [
        ("size_delta", blocks_of(base, &inner.size_delta)),
        ("reserved", blocks_of(base, &inner.reserved)),
        ("dedicated", blocks_of(base, &inner.dedicated)),
        ("registry", blocks_of(base, &inner.registry)),
        ("lent", blocks_of(base, &inner.lent)),
    ];
    for (name, mine) in written {
        for theirs in &read_hot {
            assert!(
                mine.end() < theirs.start() || theirs.end() < mine.start(),
                "{name} (128-byte blocks {mine:?}) shares a block with a field read on every pair \
                 ({theirs:?})"
            );
        }
    }
}

/// The shards a thread of the pool allocates from, in index order.
fn made_shards(pool: &Pool) -> Vec<usize> {
    pool.shards.iter().map(|(i, _)| i).collect()
}

/// `Pool::new` makes no shard: each is made when a thread first allocates from it, and a shard
/// not made reads as an empty one. A thread whose shard cannot grow looks at the free space of
/// the shards made, and makes none.
#[test]
fn shards_are_made_when_first_allocated_from() {
    let n = 4;
    let pool = one_chunk_pool(n);
    assert_eq!(made_shards(&pool), Vec::<usize>::new());
    let stats = pool.stats();
    assert_eq!(stats.shards.len(), n);
    assert!(stats
        .shards
        .iter()
        .all(|h| h.allocation_count == 0 && h.chunk_count == 0 && h.bytes_reserved == 0));
    let own = shards::thread_shard(n);
    let mut blocks = vec![pool.alloc(256, 16).unwrap()];
    assert_eq!(made_shards(&pool), [own]);
    assert_eq!(pool.stats().shards[own].allocation_count, 1);
    // Until the limit: the one chunk is this shard's, and no other shard is made to look for room.
    let err = fill_to_the_limit(&pool, &mut blocks);
    assert!(err.is_out_of_memory(), "{err}");
    assert_eq!(made_shards(&pool), [own]);
    // A thread of another shard makes that one; the chunk it cannot grow is found in ours.
    drop(blocks.pop());
    let (other, block) = on_a_thread_of_shard(n, |s| s != own, || pool.alloc(256, 16));
    let block = block.expect("a block from the first shard's chunk");
    let mut made = vec![own, other];
    made.sort_unstable();
    assert_eq!(made_shards(&pool), made);
    let stats = pool.stats();
    assert_eq!(stats.shards[own].allocation_count, blocks.len() as u64 + 1);
    assert_eq!(stats.shards[other].allocation_count, 0);
    assert_eq!(stats.chunks, 1);
    // Blocks outlive the pool's handle; each shard made is freed with its last block.
    drop(pool);
    let mut block = block;
    block.fill(0, 256, 7).unwrap();
    assert!(block.read_vec(0, 256).unwrap().iter().all(|&x| x == 7));
    drop((block, blocks));
}

/// Threads that first allocate from one shard at once all end up in the one cell made: every
/// allocation is counted by it, and every block comes back to it.
#[test]
fn threads_making_one_shard_at_once_share_the_cell_made() {
    let (rounds, threads, each) = if cfg!(miri) { (2, 3, 4) } else { (200, 4, 16) };
    for round in 0..rounds {
        let pool = one_shard_uncached_pool();
        let start = std::sync::Barrier::new(threads);
        let blocks: Vec<Vec<Block>> = std::thread::scope(|s| {
            let spawned: Vec<_> = (0..threads)
                .map(|t| {
                    let (pool, start) = (&pool, &start);
                    s.spawn(move || {
                        start.wait();
                        (0..each)
                            .map(|k| {
                                let mut b = pool.alloc(64, 16).unwrap();
                                b.fill(0, 64, (t * each + k) as u8).unwrap();
                                b
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            spawned.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(made_shards(&pool), [0], "round {round}");
        let stats = pool.stats();
        assert_eq!(
            stats.shards[0].allocation_count,
            (threads * each) as u64,
            "round {round}: an allocation went to a cell the pool does not hold"
        );
        for (t, bs) in blocks.iter().enumerate() {
            for (k, b) in bs.iter().enumerate() {
                let v = (t * each + k) as u8;
                assert!(b.read_vec(0, 64).unwrap().iter().all(|&x| x == v));
            }
        }
        drop(blocks);
        assert_eq!(pool.stats().shards[0].allocation_count, 0);
    }
}

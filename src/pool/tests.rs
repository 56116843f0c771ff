//! The pool's unit tests over host memory (Miri runs them: `pool::tests`).

use super::*;
use std::sync::atomic::AtomicUsize;

use crate::chunk::{ChunkMemory, HostMemorySource};
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
fn thread_cache_reuses_freed_blocks() {
    let pool = cached_pool(4);
    let a = pool.alloc(256, 16).unwrap();
    let p = a.host_ptr();
    drop(a);
    assert_eq!(magazine::thread_cached_blocks(), 1);
    assert_eq!(
        pool.stats().bytes_in_use,
        256,
        "a cached block stays reserved"
    );
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
    drop(c);
    assert_eq!(
        pool.trim(),
        1,
        "trim releases the cache, then the empty chunk"
    );
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[test]
fn thread_cache_is_bounded_per_bucket() {
    let pool = cached_pool(3);
    let blocks: Vec<Block> = (0..10).map(|_| pool.alloc(64, 16).unwrap()).collect();
    drop(blocks);
    assert_eq!(magazine::thread_cached_blocks(), 3);
    assert_eq!(pool.stats().bytes_in_use, 3 * 64);
    // Blocks too large for the cache go straight back.
    drop(pool.alloc(8192, 16).unwrap());
    assert_eq!(magazine::thread_cached_blocks(), 3);
    drop(pool);
    assert_eq!(
        magazine::thread_cached_blocks(),
        0,
        "dropping the pool empties it"
    );
}

#[test]
fn thread_cache_serves_one_pool_at_a_time() {
    let (a, b) = (cached_pool(4), cached_pool(4));
    drop(a.alloc(32, 16).unwrap());
    assert_eq!(a.stats().bytes_in_use, 32);
    // Allocating from another pool hands the first pool's blocks back.
    let x = b.alloc(32, 16).unwrap();
    assert_eq!(a.stats().bytes_in_use, 0);
    // Allocating from `a` switches the cache back to it; `x` (of `b`) is then freed to its
    // shard instead of being cached.
    drop(a.alloc(48, 16).unwrap());
    drop(x);
    assert_eq!(magazine::thread_cached_blocks(), 1);
    assert_eq!((a.stats().bytes_in_use, b.stats().bytes_in_use), (48, 0));
    magazine::release_thread_cache();
    assert_eq!(a.stats().bytes_in_use + b.stats().bytes_in_use, 0);
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

#[test]
fn oversized_thread_cache_is_refused() {
    let cfg = PoolConfig {
        thread_cache: magazine::MAX_DEPTH + 1,
        ..Default::default()
    };
    assert!(matches!(
        Pool::new(HostMemorySource, cfg),
        Err(Error::InvalidArgument(_))
    ));
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
    let (offset, place) = (gains[0].offset_in_chunk(), gains[0].host_ptr());
    drop(gains);
    drop(big);
    let again = pool.alloc(256, 64).unwrap();
    assert_eq!(again.host_ptr(), place, "the freed place is reused");
    assert_eq!((again.offset_in_chunk(), again.label()), (offset, None));
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

//! Fast paths on the GPU, checked by DMA: large writes split over the global copy pool
//! (2 MiB parts) at odd offsets, staged reads into pageable memory at every interesting length
//! and offset (one chunk, several, the pipeline's wrap, concurrent readers sharing the staging
//! cache), pool blocks read through the staged path, and `WriteBatch` writes that arrive — in
//! coherent and forced non-coherent mode.

mod common;

use common::*;
use vkgdr::memory::STAGED_READ_THRESHOLD;
use vkgdr::{Mapping, Pool, PoolConfig, WriteBatch};

fn bytes(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| (pattern(i as u64, seed) >> 7) as u8)
        .collect()
}

fn large_writes_and_staged_reads(force_non_coherent: bool) {
    let gpu = open(force_non_coherent);
    let size = 96 << 20;
    let mut mem = gpu.alloc(size as u64).unwrap();
    // A large write at an odd offset (split over the global pool), read back by plain DMA.
    let data = bytes(size - 4099, 1);
    mem.write(4099, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    mem.read_dma(4099, &mut back).unwrap();
    assert!(back == data, "a split write did not arrive");

    // A known pattern put there by the copy engine, then staged reads of every shape.
    let pattern = bytes(size, 2);
    // SAFETY: `mem` holds `size` bytes of this GPU's context.
    unsafe { gpu.memcpy_htod(mem.device_ptr(), &pattern) }.unwrap();
    let t = STAGED_READ_THRESHOLD;
    for (offset, len) in [
        (0, t),
        (1, t + 1),
        (4095, 3 * t + 4097),
        (12_345, (37 << 20) + 13),
        (0, size),
        (size - (33 << 20) - 7, (33 << 20) + 7),
    ] {
        let mut dst = vec![0xeeu8; len + 2];
        mem.read(offset as u64, &mut dst[1..=len]).unwrap();
        assert!(
            dst[1..=len] == pattern[offset..offset + len],
            "staged read of {len} bytes at {offset} differs"
        );
        assert_eq!(
            (dst[0], dst[len + 1]),
            (0xee, 0xee),
            "wrote outside the target"
        );
        assert!(mem.read_vec(offset as u64, len).unwrap() == pattern[offset..offset + len]);
    }
    // Out of range: an error, nothing read.
    assert!(mem
        .read(size as u64 - t as u64 + 1, &mut vec![0; t])
        .is_err());

    // Six readers at once: more than the cache keeps idle, each with its own staging set.
    std::thread::scope(|s| {
        for r in 0..6usize {
            let (mem, pattern) = (&mem, &pattern);
            s.spawn(move || {
                for k in 0..4usize {
                    let (offset, len) = ((r * 7 + k) << 20, (5 << 20) + r * 4096 + k);
                    let mut dst = vec![0u8; len];
                    mem.read(offset as u64, &mut dst).unwrap();
                    assert!(dst == pattern[offset..offset + len], "reader {r} read {k}");
                }
            });
        }
    });
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn large_writes_and_staged_reads_coherent() {
    large_writes_and_staged_reads(false);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn large_writes_and_staged_reads_forced_non_coherent() {
    large_writes_and_staged_reads(true);
}

fn pool_blocks_read_staged_and_write_batched(force_non_coherent: bool) {
    let gpu = open(force_non_coherent);
    let pool = Pool::new(gpu.clone(), PoolConfig::default()).unwrap();
    // A dedicated block larger than the staged threshold: its reads take the staged path, after
    // its pending (non-coherent) writes were flushed.
    let mut big = pool.alloc(20 << 20, 4096).unwrap();
    assert!(big.is_dedicated());
    let data = bytes(20 << 20, 3);
    big.write(0, &data).unwrap();
    assert!(big.read_vec(0, data.len()).unwrap() == data);
    // A shared block read at the threshold.
    let mut shared = pool.alloc(STAGED_READ_THRESHOLD as u64 + 64, 64).unwrap();
    assert!(!shared.is_dedicated());
    let data = bytes(shared.size() as usize, 4);
    shared.write(0, &data).unwrap();
    assert!(shared.read_vec(0, data.len()).unwrap() == data);

    // Sixty-four small blocks written through one batch, checked by DMA after `finish`.
    let mut blocks: Vec<_> = (0..64).map(|_| pool.alloc(64, 64).unwrap()).collect();
    let mut batch = WriteBatch::new();
    for (i, b) in blocks.iter_mut().enumerate() {
        batch.write(b, 0, &[i as u8 + 1; 64]).unwrap();
    }
    batch.finish();
    pool.flush().unwrap();
    for (i, b) in blocks.iter().enumerate() {
        let mut back = [0u8; 64];
        // SAFETY: the block's 64 bytes are live device memory of this GPU's context.
        unsafe { gpu.memcpy_dtoh(&mut back, b.device_ptr().unwrap()) }.unwrap();
        assert_eq!(back, [i as u8 + 1; 64], "batched write {i} did not arrive");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn pool_blocks_read_staged_and_write_batched_coherent() {
    pool_blocks_read_staged_and_write_batched(false);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn pool_blocks_read_staged_and_write_batched_forced_non_coherent() {
    pool_blocks_read_staged_and_write_batched(true);
}

/// Staged reads leave nothing behind: the staging sets go with the `Gpu`, and a new handle
/// reads again (its own sets).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn staging_sets_go_with_their_gpu() {
    for round in 0..3u32 {
        let gpu = open(false);
        let mem = gpu.alloc(8 << 20).unwrap();
        let pattern = bytes(8 << 20, round);
        // SAFETY: `mem` holds 8 MiB of this GPU's context.
        unsafe { gpu.memcpy_htod(mem.device_ptr(), &pattern) }.unwrap();
        assert!(mem.read_vec(0, 8 << 20).unwrap() == pattern);
        drop(mem);
        drop(gpu);
    }
}

/// A new allocation's first bytes are written once when it is made (zeros: the warm-up of the
/// write path), so the caller's first write is as fast as later ones; checked by DMA after an
/// allocation of the same size was filled and freed (the carver usually gives its place back, and
/// the message says whether it did).
fn fresh_allocations_start_zeroed(force_non_coherent: bool) {
    let gpu = open(force_non_coherent);
    for size in [1u64, 5, 16, 17, 4096, 1 << 20, 4 << 20] {
        let old = gpu.alloc(size).unwrap();
        let at = old.device_ptr();
        // SAFETY: `old` holds `size` bytes of this GPU's context.
        unsafe { gpu.memcpy_htod(at, &vec![0xA5u8; size as usize]) }.unwrap();
        drop(old);
        let mem = gpu.alloc(size).unwrap();
        let n = size.min(16) as usize;
        let mut back = vec![0xFFu8; size as usize];
        mem.read_dma(0, &mut back).unwrap();
        assert_eq!(
            &back[..n],
            &vec![0u8; n][..],
            "size {size}: first {n} bytes (same place as the freed allocation: {})",
            mem.device_ptr() == at
        );
        // The write path is warm: a write and a read after it behave as any other.
        let mut mem = mem;
        mem.write(0, &[7u8; 1]).unwrap();
        mem.read_dma(0, &mut back[..1]).unwrap();
        assert_eq!(back[0], 7);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn fresh_allocations_start_zeroed_coherent() {
    fresh_allocations_start_zeroed(false);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn fresh_allocations_start_zeroed_forced_non_coherent() {
    fresh_allocations_start_zeroed(true);
}

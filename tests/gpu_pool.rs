//! The pool on the GPU: a PTX kernel reads 100,000 tiny host-written blocks by device pointer and
//! checks every tag, in coherent and forced non-coherent mode, with recycled blocks from the
//! per-thread cache, and on the gpu-alloc backend.

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use vkgdr::cuda_objects::Module;
use vkgdr::pool::magazine;
#[cfg(feature = "gpu-alloc")]
use vkgdr::GpuAllocStrategy;
use vkgdr::{Backend, Mapping, Pool, PoolConfig};

fn tag_bytes(tag: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (tag.wrapping_mul(131).wrapping_add(j as u32) & 0xff) as u8)
        .collect()
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
    let mut p_ptrs = pool.alloc(8 * count as u64, 8).unwrap();
    let mut p_lens = pool.alloc(4 * count as u64, 4).unwrap();
    let mut p_tags = pool.alloc(4 * count as u64, 4).unwrap();
    let mut p_bad = pool.alloc(8, 8).unwrap();
    p_ptrs.write_pod(0, &ptrs).unwrap();
    p_lens.write_pod(0, &lens).unwrap();
    p_tags.write_pod(0, &tags).unwrap();
    p_bad.write_pod(0, &[0u64]).unwrap();
    for b in [&p_ptrs, &p_lens, &p_tags, &p_bad] {
        b.flush().unwrap();
    }
    let run = |p_bad: &vkgdr::Block| -> u64 {
        let (mut a, mut b, mut c, mut n, mut d) = (
            p_ptrs.device_ptr().unwrap(),
            p_lens.device_ptr().unwrap(),
            p_tags.device_ptr().unwrap(),
            count as u64,
            p_bad.device_ptr().unwrap(),
        );
        launch(
            &gpu,
            &module,
            "check_tagged_blocks",
            256,
            256,
            &mut [
                arg(&mut a),
                arg(&mut b),
                arg(&mut c),
                arg(&mut n),
                arg(&mut d),
            ],
        );
        let mut bad = [0u64];
        p_bad.read_pod(0, &mut bad).unwrap();
        bad[0]
    };
    assert_eq!(run(&p_bad), 0, "the kernel found blocks with wrong tags");
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
    p_bad.write_pod(0, &[0u64]).unwrap();
    p_bad.flush().unwrap();
    assert_eq!(run(&p_bad), 1);
    let stats = pool.stats();
    println!(
        "{count} blocks ({backend:?}, non-coherent {force_non_coherent}): reserved {} KiB, in use {} KiB",
        stats.bytes_reserved >> 10,
        stats.bytes_in_use >> 10
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn kernel_checks_100k_tiny_blocks_coherent() {
    kernel_checks_blocks(false, Backend::Native, 100_000, 0);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn kernel_checks_100k_tiny_blocks_with_thread_cache() {
    kernel_checks_blocks(false, Backend::Native, 100_000, 32);
    kernel_checks_blocks(true, Backend::Native, 20_000, 32);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn kernel_checks_100k_tiny_blocks_forced_non_coherent() {
    kernel_checks_blocks(true, Backend::Native, 100_000, 0);
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

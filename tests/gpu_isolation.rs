//! Fork isolation on the GPU: a forked child cannot reach this process's GPU memory through any
//! inherited host pointer — raw allocations, pool chunks (shared and dedicated), arena chunks,
//! pools on an arena, rings (data and control) — and an `exec`'d program inherits no fd of them.
//!
//! Without `MADV_DONTFORK` (as measured on the H100) the child's store changes the parent's GPU
//! memory and the child exits normally. Every mapping is `MADV_DONTFORK`, so the child dies with
//! SIGSEGV; the parent checks by DMA (`cuMemcpyDtoH`, not its own mapping) that its memory still
//! holds what it wrote. Own binary: it forks and counts fds.

mod common;

use std::time::Duration;

use common::*;
use vkgdr::ring::layout::WrapMode;
use vkgdr::ring::DeviceRing;
use vkgdr::{Arena, Gpu, Mapping, Pool, PoolConfig};

/// `len` bytes at device address `at`, read by the copy engine.
fn dma(gpu: &Gpu, at: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: each caller passes a range inside a live allocation of `gpu`.
    unsafe { gpu.memcpy_dtoh(&mut out, at) }.expect("cuMemcpyDtoH");
    out
}

/// Fills `mapping` with 0x5a, lets a forked child store 0xee at its first and last byte, and
/// checks the child faulted and the device memory (read by DMA at `device`) is unchanged.
fn assert_isolated(gpu: &Gpu, what: &str, mapping: &mut impl Mapping, device: u64) {
    children_fault_storing_into(what, mapping);
    let len = mapping.len();
    let seen = dma(gpu, device, len as usize);
    let changed = seen.iter().filter(|&&b| b != 0x5a).count();
    assert_eq!(
        changed, 0,
        "{what}: {changed} bytes of the parent's GPU memory changed"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn forked_children_cannot_reach_raw_allocations() {
    for force in [false, true] {
        let gpu = open(force);
        for size in [4096, 1 << 20] {
            let mut mem = gpu.alloc(size).unwrap();
            let device = mem.device_ptr();
            assert_isolated(&gpu, "raw allocation", &mut mem, device);
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn forked_children_cannot_reach_pool_chunks() {
    let gpu = open(false);
    let cfg = PoolConfig {
        chunk_size: 2 << 20,
        dedicated_threshold: 1 << 20,
        ..Default::default()
    };
    let pool = Pool::new(gpu.clone(), cfg).unwrap();
    let mut shared = pool.alloc(4096, 256).unwrap();
    let mut dedicated = pool.alloc(2 << 20, 256).unwrap();
    assert!(dedicated.is_dedicated());
    for (what, block) in [
        ("pool block", &mut shared),
        ("dedicated block", &mut dedicated),
    ] {
        let device = block.device_ptr().unwrap();
        assert_isolated(&gpu, what, block, device);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn forked_children_cannot_reach_arena_chunks() {
    let gpu = open(false);
    let chunk = vkgdr::arena::granularity(gpu.driver(), 0)
        .unwrap()
        .max(2 << 20);
    let mut arena = match Arena::new(&gpu, 4 * chunk, chunk) {
        Ok(a) => a,
        Err(vkgdr::Error::Unsupported(why)) => {
            eprintln!("SKIP arena: {why}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    arena.grow().unwrap();
    arena.grow().unwrap();
    arena.write(0, &vec![0x5a; (2 * chunk) as usize]).unwrap();
    for offset in [0, chunk, 2 * chunk - 1] {
        let p = arena.host_ptr(offset).unwrap();
        assert_eq!(
            child_stores(p, 0xee),
            ChildEnd::Signaled(libc::SIGSEGV),
            "arena: a forked child stored at offset {offset} without faulting"
        );
    }
    let seen = dma(&gpu, arena.device_ptr(), (2 * chunk) as usize);
    assert!(seen.iter().all(|&b| b == 0x5a), "arena memory changed");

    // A pool on an arena: its blocks are arena chunks.
    let pool = Pool::on_arena(&gpu, 4 * chunk, chunk, PoolConfig::default()).unwrap();
    let mut block = pool.alloc(4096, 256).unwrap();
    let device = block.device_ptr().unwrap();
    assert_isolated(&gpu, "block of a pool on an arena", &mut block, device);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn forked_children_cannot_reach_rings() {
    let gpu = open(false);
    for wrap in [WrapMode::Padded, WrapMode::Mirrored] {
        let capacity = match wrap {
            WrapMode::Padded => 64 << 10,
            WrapMode::Mirrored => 2 << 20,
        };
        let ring = match DeviceRing::with_lanes(&gpu, capacity, 1, wrap) {
            Ok(r) => r,
            Err(vkgdr::Error::Unsupported(why)) => {
                eprintln!("SKIP mirrored ring: {why}");
                continue;
            }
            Err(e) => panic!("{e}"),
        };
        let view = ring.device_view();
        let data_before = dma(&gpu, view.data, 4096);
        let control_before = dma(&gpu, view.tail, 256);
        // The child uses the inherited ring as a producer would: its record and tail stores
        // (into the data region and the control words) and the stop word.
        let end = in_child(|| {
            let _ = ring.push(&[0xee; 64], Some(Duration::from_millis(1)));
            ring.stop();
        });
        assert_eq!(
            end,
            ChildEnd::Signaled(libc::SIGSEGV),
            "{wrap:?} ring: a forked child produced without faulting"
        );
        assert_eq!(
            dma(&gpu, view.data, 4096),
            data_before,
            "{wrap:?}: data changed"
        );
        assert_eq!(
            dma(&gpu, view.tail, 256),
            control_before,
            "{wrap:?}: control words changed"
        );
        // The parent's ring is untouched and works.
        ring.push(&[0x11; 64], Some(Duration::from_secs(1)))
            .unwrap();
        assert_eq!(ring.core().published(), ring.core().committed());
        assert_ne!(
            dma(&gpu, view.tail, 8),
            control_before[..8],
            "the parent's tail moved"
        );
    }
}

/// Programs this process spawns inherit no fd of its GPU memory: the exported fds are
/// close-on-exec before CUDA takes them (or they are closed). Counted in a spawned shell, before
/// and after allocating every kind of memory (the GPU machine runs one test at a time).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn spawned_programs_inherit_no_fd_of_gpu_memory() {
    let gpu = open(false);
    let everything = || {
        let raw: Vec<_> = (0..8).map(|_| gpu.alloc(1 << 20).unwrap()).collect();
        let pool = Pool::new(gpu.clone(), PoolConfig::default()).unwrap();
        let blocks = [
            pool.alloc(64, 64).unwrap(),
            pool.alloc(16 << 20, 64).unwrap(),
        ];
        let arena_pool = Pool::on_arena(&gpu, 64 << 20, 2 << 20, PoolConfig::default()).unwrap();
        let arena_block = arena_pool.alloc(64, 64).unwrap();
        let ring = DeviceRing::new(&gpu, 64 << 10).unwrap();
        (raw, blocks, arena_block, ring, pool, arena_pool)
    };
    // Once first: the driver's own files, opened on first use, are not ours to count.
    drop(everything());
    let before = fds_of_spawned_child();
    let held = everything();
    let after = fds_of_spawned_child();
    println!(
        "spawned program's fds: {} before, {} with GPU memory allocated",
        before.len(),
        after.len()
    );
    // Counted, not compared: the child's own pipes differ from one spawn to the next.
    assert_eq!(
        after.len(),
        before.len(),
        "a spawned program inherited fds: {before:?} before, {after:?} after"
    );
    drop(held);
}

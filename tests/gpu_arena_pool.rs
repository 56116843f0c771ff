//! A pool on a VMM arena: every block inside one contiguous device range, blocks never move while
//! the pool grows and shrinks, a kernel reads them all by device pointer.

mod common;

use common::*;
use vkgdr::cuda_objects::Module;
use vkgdr::{Mapping, Pool, PoolConfig};

const CHUNK: u64 = 32 << 20;

fn bad_blocks(
    gpu: &vkgdr::Gpu,
    module: &Module,
    pool: &Pool,
    blocks: &[(vkgdr::Block, u32)],
) -> u64 {
    let ptrs: Vec<u64> = blocks
        .iter()
        .map(|(b, _)| b.device_ptr().unwrap())
        .collect();
    let lens: Vec<u32> = blocks.iter().map(|(b, _)| b.size() as u32).collect();
    let tags: Vec<u32> = blocks.iter().map(|(_, t)| *t).collect();
    let n = blocks.len() as u64;
    let mut p = gpu.alloc(8 * n).unwrap();
    let mut l = gpu.alloc(4 * n).unwrap();
    let mut t = gpu.alloc(4 * n).unwrap();
    let mut bad = gpu.alloc(8).unwrap();
    p.write_pod(0, &ptrs).unwrap();
    l.write_pod(0, &lens).unwrap();
    t.write_pod(0, &tags).unwrap();
    bad.write_pod(0, &[0u64]).unwrap();
    pool.flush().unwrap();
    let (mut a, mut b, mut c, mut nn, mut d) = (
        p.device_ptr(),
        l.device_ptr(),
        t.device_ptr(),
        n,
        bad.device_ptr(),
    );
    launch(
        gpu,
        module,
        "check_tagged_blocks",
        64,
        128,
        &mut [
            arg(&mut a),
            arg(&mut b),
            arg(&mut c),
            arg(&mut nn),
            arg(&mut d),
        ],
    );
    let mut v = [0u64];
    bad.read_pod(0, &mut v).unwrap();
    v[0]
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn pool_blocks_stay_inside_one_growing_range() {
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, MAPPING_PTX).unwrap();
    let cfg = PoolConfig {
        shards: 1,
        keep_empty_chunks: 0,
        ..Default::default()
    };
    let pool = Pool::on_arena(&gpu, 16 * CHUNK, CHUNK, cfg).unwrap();
    let (base, len) = pool.is_contiguous().expect("the H100 supports VMM");
    let inside = |b: &vkgdr::Block| {
        let p = b.device_ptr().unwrap();
        p >= base && p + b.size() <= base + len
    };
    let mut blocks = Vec::new();
    for k in 0..200u32 {
        let size = if k % 50 == 49 { 12 << 20 } else { 1 << 20 }; // some dedicated (>= 8 MiB)
        let mut b = pool.alloc(size, 4096).unwrap();
        assert!(inside(&b), "block outside the arena");
        b.write(0, &tag_bytes(k, size as usize)).unwrap();
        blocks.push((b, k));
    }
    let reserved_full = pool.stats().bytes_reserved;
    assert!(
        reserved_full >= 8 * CHUNK,
        "the pool grew over several chunks: {reserved_full}"
    );
    let addresses: Vec<u64> = blocks
        .iter()
        .map(|(b, _)| b.device_ptr().unwrap())
        .collect();
    assert_eq!(bad_blocks(&gpu, &module, &pool, &blocks), 0);

    // Free the newest half: trailing chunks are unmapped; the survivors do not move.
    blocks.truncate(100);
    assert!(
        pool.stats().bytes_reserved < reserved_full,
        "nothing was returned"
    );
    for ((b, _), a) in blocks.iter().zip(&addresses) {
        assert_eq!(b.device_ptr().unwrap(), *a);
    }
    assert_eq!(bad_blocks(&gpu, &module, &pool, &blocks), 0);

    // Growing past the reservation is out-of-memory, and the pool stays usable.
    let mut more = Vec::new();
    let err = loop {
        match pool.alloc(16 << 20, 4096) {
            Ok(b) => more.push(b),
            Err(e) => break e,
        }
        assert!(more.len() < 64);
    };
    assert!(err.is_out_of_memory(), "{err}");
    assert!(more.iter().all(inside));
    drop(more);
    let mut again = pool.alloc(16 << 20, 4096).unwrap();
    again.write(0, b"still usable").unwrap();
    assert!(inside(&again));
}

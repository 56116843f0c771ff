//! The default write path never starts a thread for a small copy: the first small write of a
//! process costs what a later one does. Large writes and reads do use the global copy
//! pool. One test in its own binary, so no other test starts the pool first.

use vkgdr::chunk::HostMemorySource;
use vkgdr::copy::{CopyPool, DEFAULT_PARALLEL_THRESHOLD};
use vkgdr::{Mapping, Pool, PoolConfig, WriteBatch};

mod common;

fn threads_of_this_process() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("Linux /proc")
        .count()
}

#[test]
fn small_copies_run_inline_and_large_ones_start_the_global_pool() {
    // Lavapipe starts its own threads when the device is created: count after that.
    let mut memory = common::vulkan(false).allocate(1 << 20).unwrap();
    let before = threads_of_this_process();
    let pool = Pool::new(HostMemorySource, PoolConfig::default()).unwrap();
    let mut block = pool.alloc(64, 64).unwrap();
    block.write(0, &[7; 64]).unwrap();
    let mut batch = WriteBatch::new();
    batch.write(&mut block, 8, &[9; 8]).unwrap();
    batch.finish();
    let mut medium = pool
        .alloc((DEFAULT_PARALLEL_THRESHOLD - 1) as u64, 64)
        .unwrap();
    medium.fill(0, medium.size(), 3).unwrap();
    medium
        .write(0, &vec![5; DEFAULT_PARALLEL_THRESHOLD - 1])
        .unwrap();
    assert_eq!(block.read_vec(0, 16).unwrap(), [[7; 8], [9; 8]].concat());
    assert!(medium.read_vec(0, 4096).unwrap().iter().all(|&b| b == 5));

    // The same through the Vulkan half (lavapipe on CI): a raw exported mapping.
    memory.write(100, b"no threads").unwrap();
    assert_eq!(memory.read_vec(100, 10).unwrap(), b"no threads");

    assert!(
        CopyPool::global_if_started().is_none(),
        "a small write started the global copy pool"
    );
    assert_eq!(
        threads_of_this_process(),
        before,
        "a small write started a thread"
    );

    // A write at the threshold splits over the global pool, which now exists.
    let mut large = pool.alloc(DEFAULT_PARALLEL_THRESHOLD as u64, 64).unwrap();
    let data: Vec<u8> = (0..DEFAULT_PARALLEL_THRESHOLD)
        .map(|i| (i % 251) as u8)
        .collect();
    large.write(0, &data).unwrap();
    let global = CopyPool::global_if_started().expect("a large write starts the global pool");
    assert_eq!(
        threads_of_this_process(),
        before + global.threads() - 1,
        "the global pool's workers"
    );
    assert_eq!(large.read_vec(0, data.len()).unwrap(), data);
}

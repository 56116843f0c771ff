//! Two GPUs (the two-H200 machine), in one process:
//!
//! - `two_gpus_pools_kernels_isolation_and_bar_figures`: each device opened by ordinal and by
//!   UUID, a pool per device, 2,000 tagged blocks per device checked by a kernel on its own device,
//!   isolation (rewriting one device's blocks never shows on the other), and the BAR figures of
//!   both. Every check is shown able to fail inside the test: one device's blocks checked against
//!   the other's tag table are all reported, and blocks deliberately overwritten with the other
//!   device's round ("aliasing") are reported, exactly those, until restored.
//! - `two_gpus_everything_at_once_in_one_process`: per device a pool, a ring with its persistent
//!   checking consumer, an arena and raw allocations, churned from threads that each use both
//!   devices (their `Gpu` handles moved into the threads and back); the BAR of each device
//!   exhausted in turn while the other device's ring streams and allocates; frees timed (none may
//!   wait for a running kernel); at the end every record verified by its kernel, every kept block
//!   and both arenas checked by the kernel of their own device (with negative controls), one
//!   device's blocks freed while the other's consumer still runs, and the pools empty. Not under
//!   compute-sanitizer, which runs one kernel at a time (`scripts/gpu-check` skips it there).
//! - `two_gpus_peer_access_through_vmm_mappings`: whether a kernel on one GPU can use vkgdr memory
//!   of the other. `cuCtxEnablePeerAccess` does not cover VMM mappings; `grant_peer_access` sets
//!   the peer's access per mapping (`cuMemSetAccess`). `cuMemGetAccess` before (no access) and
//!   after, the kernel of the peer reading every word and writing them back over the link, and
//!   negative controls; without a peer-to-peer path, the test says so loudly and checks that the
//!   grant is refused with a clear error.
//!
//! The tags of `check_tagged_blocks` must make rounds distinguishable: `tag_bytes` (and the
//! kernel) derive a block's bytes from the top byte of `tag * 2654435761`, which every bit of the
//! tag moves, so the rounds `r << 28` differ in every byte of every block. The test checks this
//! premise on the CPU, and `rounds_of_the_two_gpu_tests_differ_in_every_byte` checks it (and that
//! the premise check can fail) on any machine.
//!
//! On a machine with one GPU the `two_gpus_*` tests cannot run: `cargo test` reports them ignored
//! with the reason, and `scripts/gpu-check run` skips them by name (`--skip two_gpus`) and says so.

mod common;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use rand::{Rng, SeedableRng};
use vkgdr::cuda::{
    Driver, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED,
    CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED, CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK,
    CU_MEM_ACCESS_FLAGS_PROT_NONE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
};
use vkgdr::cuda_objects::{Event, LaunchConfig, Module, Stream};
use vkgdr::ring::layout::{self, seal_test_payload};
use vkgdr::ring::DeviceRing;
use vkgdr::vulkan::format_uuid;
use vkgdr::{
    Arena, Block, Error, Gpu, Mapping, MemorySide, OpenOptions, Pool, PoolConfig, RawMemory,
};

const RING_PTX: &str = include_str!("../kernels/ring.ptx");

/// The two devices, opened by ordinal; fails (with what to do) on a machine with fewer.
fn two_gpus() -> [Gpu; 2] {
    let driver = Driver::get().expect("the CUDA driver");
    let n = driver.device_count().expect("device count");
    assert!(
        n >= 2,
        "this test needs two GPUs and this machine has {n}: run it on the two-GPU machine, or skip \
         it with --skip two_gpus (scripts/gpu-check does)"
    );
    [0, 1].map(|i| Gpu::open(i).expect("open by ordinal"))
}

// ---------------------------------------------------------------------------------------------
// Pools, kernels, isolation and BAR figures.

const BLOCKS: usize = 2000;

/// The rounds: block k of a round holds tag `round + k`. Multiples of 2^28, so block k's first
/// bytes in two rounds differ by 16 times the difference of their numbers (`tag_base` is the top
/// byte of `tag * 2654435761`, an odd number): the rounds differ in every byte of every block.
const ROUND_A0: u32 = 0x1000_0000; // device 0, first
const ROUND_B1: u32 = 0x2000_0000; // device 1, first
const ROUND_C0: u32 = 0x3000_0000; // device 0, rewritten
const ROUND_D1: u32 = 0x4000_0000; // device 1, rewritten
const ROUNDS: [u32; 4] = [ROUND_A0, ROUND_B1, ROUND_C0, ROUND_D1];

/// The blocks the aliasing controls overwrite with the other device's round.
const ALIASED: [usize; 3] = [3, 1000, BLOCKS - 1];

fn block_size(k: usize) -> u64 {
    1 + (k as u64 * 37) % 200
}

/// The premise of the isolation checks, on the CPU: for every block, the bytes any two of
/// `rounds` write differ at every index, so a block written in one round can never pass the
/// kernel's check for another. `Err` names the first byte two rounds share.
fn rounds_differ_everywhere(rounds: &[u32]) -> Result<(), String> {
    for (i, &a) in rounds.iter().enumerate() {
        for &b in &rounds[i + 1..] {
            for k in 0..BLOCKS {
                let len = block_size(k) as usize;
                let (x, y) = (
                    tag_bytes(a.wrapping_add(k as u32), len),
                    tag_bytes(b.wrapping_add(k as u32), len),
                );
                if let Some(j) = (0..len).find(|&j| x[j] == y[j]) {
                    return Err(format!(
                        "rounds {a:#x} and {b:#x} write the same byte {:#04x} at index {j} of \
                         block {k}: a block of one round could pass for the other",
                        x[j]
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The premise check on any machine, and that it can fail; every bit of a tag matters.
#[test]
fn rounds_of_the_two_gpu_tests_differ_in_every_byte() {
    rounds_differ_everywhere(&ROUNDS).unwrap();
    // The rounds of the old byte function (tag * 131 + j, low byte only) wrote the same bytes;
    // with it gone, the check still finds rounds that collide: tags apart by the inverse of
    // 2654435761 (mod 2^32) have products apart by 1, so the top bytes nearly always agree.
    let mut inverse = 2654435761u32;
    for _ in 0..5 {
        inverse = inverse.wrapping_mul(2u32.wrapping_sub(2654435761u32.wrapping_mul(inverse)));
    }
    assert_eq!(2654435761u32.wrapping_mul(inverse), 1);
    let colliding = rounds_differ_everywhere(&[ROUND_A0, ROUND_A0.wrapping_add(inverse)]);
    assert!(colliding.is_err(), "the premise check cannot fail");
    // Flipping any one bit of a tag changes its first byte, and so every byte of its block.
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    for tag in ROUNDS
        .into_iter()
        .chain((0..10_000).map(|_| rng.gen::<u32>()))
    {
        for bit in 0..32 {
            assert_ne!(
                tag_base(tag),
                tag_base(tag ^ (1 << bit)),
                "{tag:#x} bit {bit}"
            );
        }
    }
}

/// One device's side: its pool, its module, its tagged blocks and the kernel's argument blocks.
struct Side {
    gpu: Gpu,
    module: Module,
    pool: Pool,
    blocks: Vec<Block>,
    /// The tag each block holds now (what the CPU wrote into it last).
    written: Vec<u32>,
    ptrs: Block,
    lens: Block,
    tags: Block,
    bad: Block,
}

impl Side {
    fn new(gpu: Gpu) -> Side {
        let module = Module::load_ptx(&gpu, MAPPING_PTX).expect("load PTX");
        let config = PoolConfig::default()
            .with_bar_budget(&gpu, 0.5)
            .expect("a budget of half the estimate");
        assert!(config.max_bytes > 64 << 20, "budget {}", config.max_bytes);
        let pool = Pool::new(gpu.clone(), config).expect("pool");
        let n = BLOCKS as u64;
        let mut ptrs = pool.alloc(8 * n, 8).unwrap();
        let mut lens = pool.alloc(4 * n, 4).unwrap();
        let tags = pool.alloc(4 * n, 4).unwrap();
        let bad = pool.alloc(8, 8).unwrap();
        let blocks: Vec<Block> = (0..BLOCKS)
            .map(|k| pool.alloc(block_size(k), 8).unwrap())
            .collect();
        let addresses: Vec<u64> = blocks
            .iter()
            .map(|b| b.device_ptr().expect("CUDA chunks have device pointers"))
            .collect();
        let sizes: Vec<u32> = blocks.iter().map(|b| b.size() as u32).collect();
        ptrs.write_pod(0, &addresses).unwrap();
        lens.write_pod(0, &sizes).unwrap();
        Side {
            gpu,
            module,
            pool,
            blocks,
            written: vec![0; BLOCKS],
            ptrs,
            lens,
            tags,
            bad,
        }
    }

    /// Writes tag `tag`'s bytes into block `k` (no flush: `write_round` and `bad_blocks_against`
    /// flush the pool).
    fn write_block(&mut self, k: usize, tag: u32) {
        let len = self.blocks[k].size() as usize;
        self.blocks[k].write(0, &tag_bytes(tag, len)).unwrap();
        self.written[k] = tag;
    }

    /// Writes tag `round + k` into every block k.
    fn write_round(&mut self, round: u32) {
        for k in 0..BLOCKS {
            self.write_block(k, round + k as u32);
        }
        self.pool.flush().unwrap();
    }

    /// Runs `check_tagged_blocks` on this device with tag `round + k` expected of block k: the
    /// number of blocks whose bytes differ.
    fn bad_blocks(&mut self, round: u32) -> u64 {
        let tags: Vec<u32> = (0..BLOCKS as u32).map(|k| round + k).collect();
        self.bad_blocks_against(&tags)
    }

    /// Runs `check_tagged_blocks` on this device with `tags[k]` expected of block k.
    fn bad_blocks_against(&mut self, tags: &[u32]) -> u64 {
        assert_eq!(tags.len(), BLOCKS);
        self.tags.write_pod(0, tags).unwrap();
        self.bad.write_pod(0, &[0u64]).unwrap();
        self.pool.flush().unwrap();
        launch_check_tagged_blocks(
            &self.gpu,
            &self.module,
            64,
            self.ptrs.device_ptr().unwrap(),
            self.lens.device_ptr().unwrap(),
            self.tags.device_ptr().unwrap(),
            BLOCKS as u64,
            self.bad.device_ptr().unwrap(),
        );
        let mut bad = [0u64];
        self.bad.read_pod(0, &mut bad).unwrap();
        bad[0]
    }

    /// Blocks whose bytes, read back by the CPU through the BAR, are not what was written last.
    fn cpu_mismatches(&self) -> usize {
        self.blocks
            .iter()
            .zip(&self.written)
            .filter(|(b, &tag)| {
                b.read_vec(0, b.size() as usize).unwrap() != tag_bytes(tag, b.size() as usize)
            })
            .count()
    }

    /// Device address ranges of the tagged blocks.
    fn ranges(&self) -> Vec<(u64, u64)> {
        self.blocks
            .iter()
            .map(|b| (b.device_ptr().unwrap(), b.size()))
            .collect()
    }
}

fn print_bar(label: &str, gpu: &Gpu) -> vkgdr::BarInfo {
    let bar = gpu.bar_info().expect("BAR figures");
    match &bar.bar1 {
        Ok(b) => println!(
            "{label} {}: BAR1 used {} MiB of {} MiB; estimate {} MiB mappable ({})",
            gpu.name(),
            b.used >> 20,
            b.total >> 20,
            bar.estimate.bytes >> 20,
            bar.estimate.basis
        ),
        Err(why) => println!(
            "{label} {}: no BAR1 figures ({why}); estimate {} MiB mappable",
            gpu.name(),
            bar.estimate.bytes >> 20
        ),
    }
    assert!(bar.vram_total > 0);
    assert!(bar.estimate.bytes > 0, "nothing mappable? {bar:?}");
    if let Ok(b) = &bar.bar1 {
        assert!(b.total > 0 && b.used <= b.total, "{b:?}");
    }
    bar
}

#[test]
#[ignore = "needs two NVIDIA GPUs: run with --include-ignored on a two-GPU machine (scripts/gpu-check skips it on one GPU)"]
fn two_gpus_pools_kernels_isolation_and_bar_figures() {
    // Open by ordinal and by UUID (both spellings): the same devices.
    let gpus = two_gpus();
    assert_ne!(gpus[0].uuid(), gpus[1].uuid(), "two devices, two UUIDs");
    for gpu in &gpus {
        let uuid = format_uuid(&gpu.uuid());
        for text in [uuid.clone(), format!("GPU-{uuid}")] {
            let by_uuid = Gpu::open_uuid(&text).expect("open by UUID");
            assert_eq!(by_uuid.cu_device(), gpu.cu_device(), "{text}");
            assert_eq!(by_uuid.uuid(), gpu.uuid());
            assert_eq!(by_uuid.vulkan().device_info().uuid, gpu.uuid());
        }
        println!(
            "CUDA device {} = GPU-{uuid} ({}) -> Vulkan [{}] {}",
            gpu.cu_device(),
            gpu.name(),
            gpu.vulkan().device_info().index,
            gpu.vulkan().device_info().name
        );
    }
    let missing = Gpu::open_uuid("GPU-00000000-0000-0000-0000-000000000000").unwrap_err();
    assert!(
        matches!(missing, vkgdr::Error::NoMatchingDevice(_)),
        "{missing}"
    );

    let before: Vec<vkgdr::BarInfo> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| print_bar(&format!("device {i} before"), g))
        .collect();

    // The premise: the rounds written below differ in every byte of every block.
    rounds_differ_everywhere(&ROUNDS).unwrap();

    let mut sides: Vec<Side> = gpus.into_iter().map(Side::new).collect();
    // The two devices' blocks are different memory: no device address range is shared.
    let mut ranges: Vec<(u64, u64, usize)> = sides
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.ranges().into_iter().map(move |(p, n)| (p, n, i)))
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(
            w[0].0 + w[0].1 <= w[1].0,
            "device {}'s block at {:#x} overlaps device {}'s at {:#x}",
            w[0].2,
            w[0].0,
            w[1].2,
            w[1].0
        );
    }

    sides[0].write_round(ROUND_A0);
    sides[1].write_round(ROUND_B1);
    assert_eq!(sides[0].bad_blocks(ROUND_A0), 0, "device 0's kernel");
    assert_eq!(sides[1].bad_blocks(ROUND_B1), 0, "device 1's kernel");

    // Negative controls: each device's blocks checked against the other device's tag table are
    // all reported, so the zeros above and below mean something.
    assert_eq!(
        sides[1].bad_blocks(ROUND_A0),
        BLOCKS as u64,
        "device 1's blocks against device 0's tags"
    );
    assert_eq!(
        sides[0].bad_blocks(ROUND_B1),
        BLOCKS as u64,
        "device 0's blocks against device 1's tags"
    );

    // Aliasing control: device 0's round written into a few blocks of device 1 is found there,
    // in exactly those blocks (the count, and the table that expects them clean elsewhere).
    for k in ALIASED {
        sides[1].write_block(k, ROUND_A0 + k as u32);
    }
    assert_eq!(
        sides[1].bad_blocks(ROUND_B1),
        ALIASED.len() as u64,
        "device 0's bytes in device 1's blocks {ALIASED:?}"
    );
    let mut expect: Vec<u32> = (0..BLOCKS as u32).map(|k| ROUND_B1 + k).collect();
    for k in ALIASED {
        expect[k] = ROUND_A0 + k as u32;
    }
    assert_eq!(
        sides[1].bad_blocks_against(&expect),
        0,
        "the aliased blocks are exactly {ALIASED:?}"
    );
    for k in ALIASED {
        sides[1].write_block(k, ROUND_B1 + k as u32);
    }
    assert_eq!(sides[1].bad_blocks(ROUND_B1), 0, "device 1 restored");

    // Isolation: rewriting every block of device 0 leaves device 1's bytes as they were.
    sides[0].write_round(ROUND_C0);
    assert_eq!(sides[0].bad_blocks(ROUND_C0), 0);
    assert_eq!(
        sides[0].bad_blocks(ROUND_A0),
        BLOCKS as u64,
        "device 0's kernel still sees the first round: the rewrite did not reach it"
    );
    assert_eq!(
        sides[1].bad_blocks(ROUND_B1),
        0,
        "a write to device 0 showed up on device 1"
    );
    sides[1].write_round(ROUND_D1);
    assert_eq!(sides[1].bad_blocks(ROUND_D1), 0);
    assert_eq!(
        sides[0].bad_blocks(ROUND_C0),
        0,
        "a write to device 1 showed up on device 0"
    );

    // The same check is able to fail in this direction: device 1's round aliased into device 0.
    for k in ALIASED {
        sides[0].write_block(k, ROUND_D1 + k as u32);
    }
    assert_eq!(
        sides[0].bad_blocks(ROUND_C0),
        ALIASED.len() as u64,
        "device 1's bytes in device 0's blocks {ALIASED:?}"
    );
    for k in ALIASED {
        sides[0].write_block(k, ROUND_C0 + k as u32);
    }
    assert_eq!(sides[0].bad_blocks(ROUND_C0), 0, "device 0 restored");
    for (i, side) in sides.iter().enumerate() {
        assert_eq!(side.cpu_mismatches(), 0, "device {i}: the CPU reads back");
    }
    println!(
        "two devices: {BLOCKS} blocks each, 4 rounds, isolation and aliasing checked by both kernels"
    );

    for (i, side) in sides.iter().enumerate() {
        let after = print_bar(&format!("device {i} with its pool"), &side.gpu);
        let reserved = side.pool.stats().bytes_reserved;
        println!(
            "device {i}: pool holds {} MiB; estimate {} -> {} MiB",
            reserved >> 20,
            before[i].estimate.bytes >> 20,
            after.estimate.bytes >> 20
        );
        assert!(reserved > 0);
    }
}

// ---------------------------------------------------------------------------------------------
// One process, both GPUs, everything at once.

/// Records each ring carries at least.
const MIN_RECORDS: u64 = 200_000;
const PRODUCERS_PER_GPU: usize = 2;
const CHURNERS: usize = 4;
/// How long the churn goes on at least (both exhaustions happen meanwhile).
const CHURN_MIN: Duration = Duration::from_secs(10);
/// No free may take this long: the library promises that frees never wait for a running kernel
/// (a wait would last until the consumers stop, tens of seconds later).
const FREE_LIMIT: Duration = Duration::from_secs(1);
/// The whole test, before the watchdog ends the process.
const WATCHDOG_LIMIT: Duration = Duration::from_secs(420);
/// Allocation size that fills a BAR.
const EXHAUSTION_STEP: u64 = 1 << 30;
/// Live pool blocks per churn thread and device; the survivors are checked at the end.
const LIVE: usize = 64;
/// Arena chunks at most.
const ARENA_CHUNKS: usize = 4;

/// An arena and what was done to it; its mapped words always hold `pattern(i, seed)`.
struct ArenaState {
    arena: Arena,
    grows: u64,
    shrinks: u64,
    /// Grows refused by the arena's own limits (a slot still being released).
    refused: u64,
}

/// One device's part of the everything-at-once test.
struct Device {
    index: usize,
    gpu: Gpu,
    mapping: Module,
    /// Kept loaded while the consumer runs (unloading would wait for it).
    ring_module: Module,
    pool: Pool,
    ring: DeviceRing,
    ring_stream: Stream,
    /// Completes when the ring's consumer exits (recorded right after its launch).
    consumer_done: Event,
    /// Taken out at the end to be checked and freed.
    arena: Mutex<Option<ArenaState>>,
    seed: u32,
    /// Odd while the BAR of this device is being filled or is held full: out-of-device-memory on
    /// this device is expected then, and only then.
    window: AtomicU64,
    /// Records produced into this device's ring while the other device's BAR was full.
    streamed_while_other_full: AtomicU64,
    /// Out-of-device-memory results on this device (all inside its window).
    out_of_memory: AtomicU64,
    frees: AtomicU64,
    max_free_ns: AtomicU64,
}

impl Device {
    /// Everything but the consumer: modules loaded and every kernel launched once (loading, and
    /// the first launch under lazy loading, wait for running kernels, so nothing of the kind may
    /// happen once a consumer runs, on either device).
    fn new(index: usize, gpu: Gpu) -> Device {
        let mapping = Module::load_ptx(&gpu, MAPPING_PTX).expect("kernels/mapping.ptx");
        let ring_module = Module::load_ptx(&gpu, RING_PTX).expect("kernels/ring.ptx");
        for (name, params) in [("check_tagged_blocks", 5), ("count_mismatches", 5)] {
            // Zero counts: the kernels touch no memory.
            let mut zeros = vec![0u64; params];
            let mut args: Vec<_> = zeros.iter_mut().map(arg).collect();
            launch(&gpu, &mapping, name, 1, 32, &mut args);
        }
        // The consumer kernel once, on a ring stopped before it starts: it exits at once.
        {
            let warm = DeviceRing::new(&gpu, 1 << 16).expect("warm-up ring");
            warm.stop();
            let stream = Stream::new(&gpu).unwrap();
            launch_consumer(&ring_module, &warm, &stream);
            stream.synchronize().expect("the warm-up consumer exits");
            assert_eq!(warm.results()[layout::RESULT_RECORDS], 0);
        }
        let ring = DeviceRing::new(&gpu, 1 << 20).expect("ring");
        let ring_stream = Stream::new(&gpu).unwrap();
        let consumer_done = Event::new(&gpu).unwrap();
        let granularity = gpu.vmm_status().expect("VMM on the test machine's GPUs");
        let arena =
            Arena::new(&gpu, 2 * ARENA_CHUNKS as u64 * granularity, granularity).expect("arena");
        Device {
            index,
            pool: Pool::new(gpu.clone(), PoolConfig::default()).expect("pool"),
            gpu,
            mapping,
            ring_module,
            ring,
            ring_stream,
            consumer_done,
            arena: Mutex::new(Some(ArenaState {
                arena,
                grows: 0,
                shrinks: 0,
                refused: 0,
            })),
            seed: 0xA5A5_0000 | index as u32,
            window: AtomicU64::new(0),
            streamed_while_other_full: AtomicU64::new(0),
            out_of_memory: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            max_free_ns: AtomicU64::new(0),
        }
    }

    /// Launches the ring's checking consumer on its stream and registers it.
    fn start_consumer(&self) {
        launch_consumer(&self.ring_module, &self.ring, &self.ring_stream);
        self.ring.watch_consumer(&self.ring_stream).unwrap();
        self.consumer_done.record(&self.ring_stream).unwrap();
    }

    fn consumer_running(&self) -> bool {
        !self.consumer_done.is_complete().expect("consumer event")
    }

    /// Drops `value` (memory, or what owns memory) and records how long the free took; one that
    /// waited fails the test.
    fn timed_free<T>(&self, what: &str, value: T) {
        let t = Instant::now();
        drop(value);
        let took = t.elapsed();
        self.frees.fetch_add(1, Ordering::Relaxed);
        self.max_free_ns
            .fetch_max(took.as_nanos() as u64, Ordering::Relaxed);
        assert!(
            took < FREE_LIMIT,
            "device {}: freeing {what} took {took:?}: a free waited (for a running kernel?)",
            self.index
        );
    }

    /// The arena, while the churn runs.
    fn arena(&self) -> std::sync::MutexGuard<'_, Option<ArenaState>> {
        self.arena.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether an out-of-memory result of an operation that saw window values `before` and
    /// `after` is expected (the BAR of this device was being filled or was full meanwhile).
    fn in_window(before: u64, after: u64) -> bool {
        before & 1 == 1 || after & 1 == 1 || before != after
    }
}

impl Drop for Device {
    /// A test that fails midway still stops the consumer before its ring and module go
    /// (unloading the module would wait for it for ever).
    fn drop(&mut self) {
        self.ring.stop();
        let t = Instant::now();
        while matches!(self.consumer_done.is_complete(), Ok(false))
            && t.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Launches `ring_consume_persistent` (one block of `CHECK_THREADS`) on `ring` on `stream`.
fn launch_consumer(module: &Module, ring: &DeviceRing, stream: &Stream) {
    let kernel = module.function("ring_consume_persistent").unwrap();
    let v = ring.device_view();
    let (mut d, mut c, mut t, mut st, mut h, mut r) =
        (v.data, v.capacity, v.tail, v.stop, v.head, v.result);
    let mut params = [
        arg(&mut d),
        arg(&mut c),
        arg(&mut t),
        arg(&mut st),
        arg(&mut h),
        arg(&mut r),
    ];
    // SAFETY: ring_consume_persistent(const u8*, u64, u64*, u32*, u64*, u64*): six 8-byte
    // parameters; every address belongs to `ring`, whose consumer is watched (its memory is kept
    // until the kernel exits) or waited for before the ring goes.
    unsafe {
        kernel
            .launch(
                LaunchConfig::linear(1, layout::CHECK_THREADS),
                Some(stream),
                &mut params,
            )
            .expect("launch the consumer")
    };
}

/// `check_tagged_blocks`'s arguments for up to `cap` blocks in one raw allocation of their
/// device: addresses (u64) at 0, sizes (u32) at 8·cap, tags (u32) at 12·cap, the count of bad
/// blocks (u64) at 16·cap. Made before the BAR fills, so checks need no allocation then.
struct CheckArgs {
    mem: RawMemory,
    cap: usize,
}

impl CheckArgs {
    fn new(gpu: &Gpu, cap: usize) -> CheckArgs {
        let cap = cap.max(1);
        CheckArgs {
            mem: gpu.alloc(16 * cap as u64 + 8).expect("kernel arguments"),
            cap,
        }
    }

    /// Runs `check_tagged_blocks` over `blocks` (device address, size, tag) on `stream` (the
    /// legacy stream and a context synchronize when `None`): the number of blocks whose bytes
    /// differ from their tag's.
    fn run(
        &mut self,
        module: &Module,
        blocks: &[(u64, u32, u32)],
        stream: Option<&Stream>,
    ) -> vkgdr::Result<u64> {
        assert!(blocks.len() <= self.cap);
        let cap = self.cap as u64;
        let ptrs: Vec<u64> = blocks.iter().map(|b| b.0).collect();
        let lens: Vec<u32> = blocks.iter().map(|b| b.1).collect();
        let tags: Vec<u32> = blocks.iter().map(|b| b.2).collect();
        self.mem.write_pod(0, &ptrs)?;
        self.mem.write_pod(8 * cap, &lens)?;
        self.mem.write_pod(12 * cap, &tags)?;
        self.mem.write_pod(16 * cap, &[0u64])?;
        let base = self.mem.device_ptr();
        let (mut p, mut l, mut t, mut n, mut bad) = (
            base,
            base + 8 * cap,
            base + 12 * cap,
            blocks.len() as u64,
            base + 16 * cap,
        );
        let f = module.function("check_tagged_blocks")?;
        let mut params = [
            arg(&mut p),
            arg(&mut l),
            arg(&mut t),
            arg(&mut n),
            arg(&mut bad),
        ];
        // SAFETY: check_tagged_blocks(const u64*, const u32*, const u32*, u64, u64*): five 8-byte
        // parameters; the arrays lie in `self.mem` and the blocks in memory the caller keeps
        // alive, both until the synchronize below.
        unsafe { f.launch(LaunchConfig::linear(64, 256), stream, &mut params) }?;
        match stream {
            Some(s) => s.synchronize()?,
            None => self.mem.gpu().synchronize()?,
        }
        let mut out = [0u64];
        self.mem.read_pod(16 * cap, &mut out)?;
        Ok(out[0])
    }
}

/// `count_mismatches` over `words` words at `ptr` against `pattern(i, seed)`, on `gpu` (legacy
/// stream, context synchronized): the number of words that differ.
fn mismatched_words(
    gpu: &Gpu,
    module: &Module,
    ptr: u64,
    words: u64,
    seed: u32,
    errors: &mut RawMemory,
) -> u64 {
    errors.write_pod(0, &[0u64]).unwrap();
    let (mut p, mut n, mut first, mut s, mut e) = (ptr, words, 0u64, seed, errors.device_ptr());
    launch(
        gpu,
        module,
        "count_mismatches",
        512,
        256,
        &mut [
            arg(&mut p),
            arg(&mut n),
            arg(&mut first),
            arg(&mut s),
            arg(&mut e),
        ],
    );
    let mut out = [0u64];
    errors.read_pod(0, &mut out).unwrap();
    out[0]
}

/// Stop flags of the everything-at-once test; any thread that panics sets them all.
#[derive(Default)]
struct Flags {
    stop_churn: AtomicBool,
    stop_producing: AtomicBool,
    failed: AtomicBool,
}

impl Flags {
    fn fail(&self) {
        self.failed.store(true, Ordering::Release);
        self.stop_churn.store(true, Ordering::Release);
        self.stop_producing.store(true, Ordering::Release);
    }

    fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }
}

/// The result of a scoped thread; a panic in it sets every stop flag and goes on in the caller.
fn join<T>(h: std::thread::ScopedJoinHandle<'_, T>, flags: &Flags) -> T {
    h.join().unwrap_or_else(|p| {
        flags.fail();
        std::panic::resume_unwind(p)
    })
}

/// Sets `done` when dropped (a failing test too), so its watchdog stands down.
struct Done(Arc<AtomicBool>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Sets every stop flag when its thread unwinds, so the others end instead of running on.
struct FailOnPanic<'a>(&'a Flags);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail();
        }
    }
}

/// What one producer thread wrote into its ring.
#[derive(Default, Clone, Copy)]
struct Produced {
    records: u64,
    /// Wrapping sum of the payload checksums (the kernel's RESULT_CHECKSUM_SUM).
    sum: u64,
}

/// A producer of `dev`'s ring (shared lane 0, reserve/commit): sealed test records of 16 B to
/// 1 KiB until told to stop and its share of `MIN_RECORDS` is written.
fn produce(
    dev: &Device,
    other: &Device,
    t: usize,
    flags: &Flags,
    states: &ThreadStates,
    slot: usize,
) -> Produced {
    let _fail = FailOnPanic(flags);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed + (dev.index * 16 + t) as u64);
    let mut buf = vec![0u8; 1024];
    let mut out = Produced::default();
    let share = MIN_RECORDS / PRODUCERS_PER_GPU as u64;
    states.set(slot, &format!("producing into device {}'s ring", dev.index));
    loop {
        if flags.failed() || (flags.stop_producing.load(Ordering::Acquire) && out.records >= share)
        {
            break;
        }
        let len = match rng.gen_range(0..100) {
            0..=79 => rng.gen_range(16..=128),
            _ => rng.gen_range(129..=1024),
        };
        let mut r = dev
            .ring
            .reserve(len, Some(Duration::from_secs(30)))
            .unwrap_or_else(|e| panic!("device {}: reserve: {e}", dev.index));
        let body = &mut buf[..len as usize];
        rng.fill(&mut body[layout::TEST_PREFIX_LEN..]);
        let sum = seal_test_payload(body, r.seq()).expect("len >= 16");
        r.write(0, body).expect("write the record");
        r.commit();
        out.records += 1;
        out.sum = out.sum.wrapping_add(sum);
        if other.window.load(Ordering::Acquire) & 1 == 1 {
            dev.streamed_while_other_full
                .fetch_add(1, Ordering::Relaxed);
        }
        if out.records.is_multiple_of(4096) {
            states.set(
                slot,
                &format!(
                    "producing into device {}'s ring: {} records",
                    dev.index, out.records
                ),
            );
        }
    }
    out
}

/// What one churn thread hands back: its surviving blocks per device (with their tags), the
/// `Gpu` handles moved into it, and counts.
struct Churned {
    kept: [Vec<(Block, u32)>; 2],
    gpus: [Gpu; 2],
    ops: u64,
    kernel_checks: u64,
}

/// Churns both devices in turn until told to stop: pool blocks written, read back and freed,
/// raw allocations (carved and mapped on their own), arena grows and shrinks, and its live blocks
/// checked by the kernel of their device on a stream of its own while both consumers run. Out-of-device-memory is allowed only inside that device's window.
fn churn(
    devs: &[Device; 2],
    gpus: [Gpu; 2],
    t: usize,
    flags: &Flags,
    states: &ThreadStates,
    slot: usize,
) -> Churned {
    let _fail = FailOnPanic(flags);
    for (d, gpu) in gpus.iter().enumerate() {
        assert!(
            gpu.same_as(&devs[d].gpu),
            "the handle moved in is device {d}'s"
        );
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xC4A1 + t as u64);
    let mut live: [VecDeque<(Block, u32)>; 2] = Default::default();
    let mut args = [
        CheckArgs::new(&gpus[0], LIVE + 1),
        CheckArgs::new(&gpus[1], LIVE + 1),
    ];
    let streams = [
        Stream::new(&gpus[0]).unwrap(),
        Stream::new(&gpus[1]).unwrap(),
    ];
    let mut next_tag = (t as u32 + 1) << 24;
    let (mut ops, mut kernel_checks) = (0u64, 0u64);
    while !flags.stop_churn.load(Ordering::Acquire) {
        let d = (ops % 2) as usize;
        let (dev, gpu) = (&devs[d], &gpus[d]);
        let window = dev.window.load(Ordering::Acquire);
        let pick = rng.gen_range(0..64);
        let result: vkgdr::Result<()> = match pick {
            // A pool block: written, read back, kept; the oldest freed.
            0..=47 => (|| -> vkgdr::Result<()> {
                states.set(slot, &format!("pool block on device {d}"));
                let len = rng.gen_range(16..=4096u64);
                let mut b = dev.pool.alloc(len, 16)?;
                next_tag += 1;
                let bytes = tag_bytes(next_tag, len as usize);
                b.write(0, &bytes)?;
                let n = bytes.len().min(64);
                let mut back = vec![0u8; n];
                b.read(0, &mut back)?;
                assert_eq!(back, bytes[..n], "device {d}: a block read back");
                live[d].push_back((b, next_tag));
                if live[d].len() > LIVE {
                    let (old, _) = live[d].pop_front().unwrap();
                    dev.timed_free("a pool block", old);
                }
                Ok(())
            })(),
            // A raw allocation: carved from a shared granule, or a mapping of its own.
            48..=59 => (|| -> vkgdr::Result<()> {
                states.set(slot, &format!("raw allocation on device {d}"));
                let size = if rng.gen_ratio(1, 4) {
                    (2 << 20) + 4096
                } else {
                    rng.gen_range(1..=64u64) * 4096
                };
                let mut m = gpu.alloc(size)?;
                let seed = rng.gen::<u32>();
                let words: Vec<u32> = (0..1024).map(|i| pattern(i, seed)).collect();
                m.write_pod(0, &words)?;
                let mut back = vec![0u32; 1024];
                m.read_pod(0, &mut back)?;
                assert_eq!(back, words, "device {d}: raw memory read back");
                dev.timed_free("raw memory", m);
                Ok(())
            })(),
            // The arena: grow (the new chunk filled with its words) or shrink by one chunk.
            60..=62 => (|| -> vkgdr::Result<()> {
                states.set(slot, &format!("arena on device {d}"));
                let mut guard = dev.arena();
                let a = guard
                    .as_mut()
                    .expect("the arena lives while the churn runs");
                let chunks = a.arena.chunk_count();
                if chunks < ARENA_CHUNKS && (chunks <= 1 || rng.gen_bool(0.5)) {
                    let old = a.arena.len();
                    match a.arena.grow() {
                        Ok(new) => {
                            let words: Vec<u32> =
                                (old / 4..new / 4).map(|i| pattern(i, dev.seed)).collect();
                            a.arena.write(old, bytemuck::cast_slice(&words))?;
                            a.grows += 1;
                        }
                        Err(Error::OutOfDeviceMemory {
                            side: MemorySide::Limit,
                            ..
                        }) => a.refused += 1,
                        Err(e) => return Err(e),
                    }
                } else if chunks > 1 {
                    let t0 = Instant::now();
                    a.arena.shrink(1)?;
                    let took = t0.elapsed();
                    assert!(
                        took < FREE_LIMIT,
                        "device {d}: an arena shrink took {took:?}"
                    );
                    a.shrinks += 1;
                }
                Ok(())
            })(),
            // This thread's live blocks checked by their device's kernel beside both consumers,
            // and the check's negative control: every tag off by one, every block reported.
            _ => (|| -> vkgdr::Result<()> {
                if live[d].is_empty() {
                    return Ok(());
                }
                states.set(slot, &format!("kernel check on device {d}"));
                dev.pool.flush()?;
                let list: Vec<(u64, u32, u32)> = live[d]
                    .iter()
                    .map(|(b, tag)| (b.device_ptr().unwrap(), b.size() as u32, *tag))
                    .collect();
                let bad = args[d].run(&dev.mapping, &list, Some(&streams[d]))?;
                assert_eq!(bad, 0, "device {d}: live blocks wrong for their kernel");
                let wrong: Vec<_> = list.iter().map(|&(p, n, tag)| (p, n, tag + 1)).collect();
                let bad = args[d].run(&dev.mapping, &wrong, Some(&streams[d]))?;
                assert_eq!(bad, list.len() as u64, "device {d}: the check cannot fail");
                kernel_checks += 1;
                Ok(())
            })(),
        };
        if let Err(e) = result {
            let after = dev.window.load(Ordering::Acquire);
            assert!(
                e.is_out_of_memory() && Device::in_window(window, after),
                "device {d}: {e} (no exhaustion of this device under way: window {window} -> \
                 {after}; the other device's: {})",
                devs[1 - d].window.load(Ordering::Acquire)
            );
            dev.out_of_memory.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(1));
        }
        ops += 1;
    }
    states.set(slot, "churn done");
    let [l0, l1] = live;
    Churned {
        kept: [l0.into(), l1.into()],
        gpus,
        ops,
        kernel_checks,
    }
}

/// Fills the BAR of each device in turn with 1 GiB raw allocations until out-of-device-memory,
/// holds it full until the other device's ring has streamed meanwhile and the other device has
/// allocated, then gives everything back (each free timed) and waits for the capacity to return.
/// Returns the GiB held on each device.
fn exhaust(
    devs: &[Device; 2],
    gpus: [Gpu; 2],
    flags: &Flags,
    states: &ThreadStates,
    slot: usize,
) -> [usize; 2] {
    let _fail = FailOnPanic(flags);
    // Let the churn free things first (the release machinery is made with the first release).
    std::thread::sleep(Duration::from_secs(2));
    let mut held_gib = [0; 2];
    for d in 0..2 {
        let (dev, other) = (&devs[d], &devs[1 - d]);
        if flags.failed() {
            break;
        }
        states.set(slot, &format!("filling device {d}'s BAR"));
        dev.window.fetch_add(1, Ordering::AcqRel); // open
        let t = Instant::now();
        let mut held = Vec::new();
        let err = loop {
            if flags.failed() {
                return held_gib;
            }
            match gpus[d].alloc(EXHAUSTION_STEP) {
                Ok(m) => held.push(m),
                Err(e) => break e,
            }
            assert!(held.len() < 1024, "device {d}: the BAR never filled");
        };
        assert!(
            err.is_out_of_memory(),
            "device {d}: expected out-of-device-memory, got {err}"
        );
        assert!(!held.is_empty(), "device {d}: not even 1 GiB: {err}");
        held_gib[d] = held.len();
        println!(
            "device {d}: BAR full after {} x 1 GiB in {:?} ({err})",
            held.len(),
            t.elapsed()
        );
        // While it is full, the other device streams and allocates as if nothing happened.
        states.set(slot, &format!("holding device {d}'s BAR full"));
        let start = other.streamed_while_other_full.load(Ordering::Relaxed);
        let t = Instant::now();
        while other.streamed_while_other_full.load(Ordering::Relaxed) < start + 1000
            && t.elapsed() < Duration::from_secs(30)
            && !flags.failed()
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            other.streamed_while_other_full.load(Ordering::Relaxed) >= start + 1000,
            "device {}'s ring did not stream while device {d}'s BAR was full",
            other.index
        );
        let probe = gpus[1 - d]
            .alloc(64 << 20)
            .expect("the other device allocates while this one's BAR is full");
        other.timed_free("a 64 MiB probe", probe);
        let block = other
            .pool
            .alloc(9 << 20, 4096)
            .expect("a dedicated pool chunk on the other device while this one's BAR is full");
        other.timed_free("a dedicated block", block);
        // Everything back, each free at once while both consumers run.
        states.set(slot, &format!("freeing device {d}'s BAR"));
        for m in held.drain(..) {
            dev.timed_free("1 GiB of a full BAR", m);
        }
        // The capacity returns once the releases have passed their fences (queued work only).
        let t = Instant::now();
        loop {
            match gpus[d].alloc(EXHAUSTION_STEP) {
                Ok(m) => {
                    dev.timed_free("1 GiB after the exhaustion", m);
                    break;
                }
                Err(e) if e.is_out_of_memory() && t.elapsed() < Duration::from_secs(30) => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("device {d}: 1 GiB 30 s after the exhaustion: {e}"),
            }
        }
        // The last releases (that 1 GiB's among them) pass their fences within milliseconds;
        // the window closes after them, so a churn allocation after it must succeed.
        std::thread::sleep(Duration::from_secs(1));
        dev.window.fetch_add(1, Ordering::AcqRel); // closed
    }
    states.set(slot, "exhaustion done");
    held_gib
}

/// The end of one device: its consumer stopped and its totals checked against the producers';
/// its kept blocks and its arena checked by its own kernel (with negative controls); then the
/// blocks and the arena freed (each free timed) while `running`, the other device's consumer,
/// still runs; the pool empty after a trim.
fn finish_device(
    dev: &Device,
    running: Option<&Device>,
    kept: Vec<(Block, u32)>,
    produced: Produced,
) {
    let d = dev.index;
    if dev.consumer_running() {
        dev.ring
            .stop_and_wait(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("device {d}: the consumer did not exit: {e}"));
    }
    assert!(!dev.consumer_running());
    let res = dev.ring.results();
    println!(
        "device {d}: ring carried {} records ({} while the other BAR was full), checksum sum \
         {:#x}, {} errors",
        res[layout::RESULT_RECORDS],
        dev.streamed_while_other_full.load(Ordering::Relaxed),
        res[layout::RESULT_CHECKSUM_SUM],
        res[layout::RESULT_ERRORS]
    );
    assert_eq!(
        res[layout::RESULT_ERRORS],
        0,
        "device {d}: kernel found bad records: {res:?}"
    );
    assert_eq!(
        res[layout::RESULT_RECORDS],
        produced.records,
        "device {d}: records"
    );
    assert_eq!(
        res[layout::RESULT_NEXT_SEQ],
        produced.records,
        "device {d}: next seq"
    );
    assert_eq!(
        res[layout::RESULT_CHECKSUM_SUM],
        produced.sum,
        "device {d}: checksums"
    );
    assert_eq!(
        dev.ring.head(),
        dev.ring.core().committed(),
        "device {d}: head"
    );
    assert!(produced.records >= MIN_RECORDS);

    // The kept blocks, by this device's kernel.
    dev.pool.flush().unwrap();
    let mut list: Vec<(u64, u32, u32)> = kept
        .iter()
        .map(|(b, tag)| (b.device_ptr().unwrap(), b.size() as u32, *tag))
        .collect();
    assert!(!list.is_empty(), "device {d}: no block survived the churn");
    let mut args = CheckArgs::new(&dev.gpu, list.len());
    assert_eq!(
        args.run(&dev.mapping, &list, None).unwrap(),
        0,
        "device {d}: kept blocks wrong for their kernel"
    );
    // Negative control: one tag off by one, that block (and only it) reported.
    let victim = list.len() / 2;
    list[victim].2 += 1;
    assert_eq!(
        args.run(&dev.mapping, &list, None).unwrap(),
        1,
        "device {d}: one wrong tag"
    );
    list[victim].2 -= 1;

    // The arena, by this device's kernel: every mapped word, and a wrong seed finds them all.
    let mut errors = dev.gpu.alloc(4096).unwrap();
    let state = dev.arena().take().expect("the arena");
    let words = state.arena.len() / 4;
    let ptr = state.arena.device_ptr();
    println!(
        "device {d}: arena {} grows, {} shrinks, {} refused; {} MiB mapped at the end",
        state.grows,
        state.shrinks,
        state.refused,
        state.arena.len() >> 20
    );
    if words > 0 {
        let wrong = mismatched_words(&dev.gpu, &dev.mapping, ptr, words, dev.seed, &mut errors);
        assert_eq!(wrong, 0, "device {d}: arena words wrong for the kernel");
        let all = mismatched_words(
            &dev.gpu,
            &dev.mapping,
            ptr,
            words,
            dev.seed ^ 1,
            &mut errors,
        );
        assert_eq!(all, words, "device {d}: the arena check cannot fail");
    }

    // Frees of this device's memory while the other device's consumer runs.
    if let Some(other) = running {
        assert!(
            other.consumer_running(),
            "device {}'s consumer",
            other.index
        );
    }
    let n = kept.len();
    for (b, _) in kept {
        dev.timed_free("a kept block", b);
    }
    dev.timed_free("the arena", state.arena);
    drop(args);
    dev.timed_free("an argument buffer", errors);
    if let Some(other) = running {
        assert!(
            other.consumer_running(),
            "device {}'s consumer ended while device {d}'s memory was freed",
            other.index
        );
        println!(
            "device {d}: {n} kept blocks and the arena freed while device {}'s consumer ran",
            other.index
        );
    }

    // The pool is empty again.
    dev.pool.trim();
    let stats = dev.pool.stats();
    let allocations: u64 = stats.shards.iter().map(|s| s.allocation_count).sum();
    assert_eq!(
        (
            stats.bytes_in_use,
            stats.blocks_cached,
            allocations,
            stats.dedicated_chunks,
            stats.chunks
        ),
        (0, 0, 0, 0, 0),
        "device {d}: the pool after the churn: {stats:?}"
    );
}

#[test]
#[ignore = "needs two NVIDIA GPUs: run with --include-ignored on a two-GPU machine (scripts/gpu-check skips it on one GPU)"]
fn two_gpus_everything_at_once_in_one_process() {
    assert!(
        !under_sanitizer(),
        "this test runs a persistent kernel on each device and more kernels beside them, which \
         compute-sanitizer, running one kernel at a time, cannot: scripts/gpu-check skips it \
         under SANITIZE=1"
    );
    let [g0, g1] = two_gpus();
    let devs = [Device::new(0, g0), Device::new(1, g1)];
    for dev in &devs {
        dev.start_consumer();
    }
    // Producers, churners, the exhaustion thread, the main thread.
    let threads = 2 * PRODUCERS_PER_GPU + CHURNERS + 2;
    let main_slot = threads - 1;
    let states = ThreadStates::new(threads);
    let done = Arc::new(AtomicBool::new(false));
    let dog = watchdog(
        "two_gpus_everything_at_once_in_one_process",
        WATCHDOG_LIMIT,
        states.clone(),
        done.clone(),
    );
    let done = Done(done);
    let flags = Flags::default();
    let t0 = Instant::now();
    let (devs_ref, flags_ref, states_ref) = (&devs, &flags, &*states);
    let (produced, churned, held_gib) = std::thread::scope(|s| {
        let _fail = FailOnPanic(flags_ref);
        let producers: Vec<_> = (0..2 * PRODUCERS_PER_GPU)
            .map(|i| {
                let d = i % 2;
                s.spawn(move || {
                    produce(
                        &devs_ref[d],
                        &devs_ref[1 - d],
                        i / 2,
                        flags_ref,
                        states_ref,
                        i,
                    )
                })
            })
            .collect();
        let churners: Vec<_> = (0..CHURNERS)
            .map(|t| {
                // Each thread gets handles of both devices of its own, moved in (and back out).
                let gpus = [devs_ref[0].gpu.clone(), devs_ref[1].gpu.clone()];
                let slot = 2 * PRODUCERS_PER_GPU + t;
                s.spawn(move || churn(devs_ref, gpus, t, flags_ref, states_ref, slot))
            })
            .collect();
        let exhauster = {
            let gpus = [devs_ref[0].gpu.clone(), devs_ref[1].gpu.clone()];
            let slot = 2 * PRODUCERS_PER_GPU + CHURNERS;
            s.spawn(move || exhaust(devs_ref, gpus, flags_ref, states_ref, slot))
        };
        states_ref.set(main_slot, "waiting for the exhaustion thread");
        let held_gib: [usize; 2] = join(exhauster, flags_ref);
        while t0.elapsed() < CHURN_MIN && !flags_ref.failed() {
            std::thread::sleep(Duration::from_millis(20));
        }
        flags_ref.stop_churn.store(true, Ordering::Release);
        states_ref.set(main_slot, "waiting for the churn threads");
        let churned: Vec<Churned> = churners.into_iter().map(|h| join(h, flags_ref)).collect();
        flags_ref.stop_producing.store(true, Ordering::Release);
        states_ref.set(main_slot, "waiting for the producers");
        let mut produced = [Produced::default(); 2];
        for (i, h) in producers.into_iter().enumerate() {
            let p: Produced = join(h, flags_ref);
            produced[i % 2].records += p.records;
            produced[i % 2].sum = produced[i % 2].sum.wrapping_add(p.sum);
        }
        (produced, churned, held_gib)
    });
    let elapsed = t0.elapsed();
    states.set(main_slot, "checking the results");

    let mut kept: [Vec<(Block, u32)>; 2] = Default::default();
    let (mut ops, mut checks) = (0, 0);
    for c in churned {
        for (d, gpu) in c.gpus.iter().enumerate() {
            assert!(
                gpu.same_as(&devs[d].gpu),
                "the handle moved back is device {d}'s"
            );
        }
        ops += c.ops;
        checks += c.kernel_checks;
        let [k0, k1] = c.kept;
        kept[0].extend(k0);
        kept[1].extend(k1);
    }
    println!(
        "both GPUs at once: {ops} churn operations ({checks} kernel checks beside the consumers) \
         in {elapsed:?}; BARs full at {} and {} GiB",
        held_gib[0], held_gib[1]
    );
    for dev in &devs {
        println!(
            "device {}: {} frees, the longest {:?}; {} out-of-memory results, all while its BAR \
             was full",
            dev.index,
            dev.frees.load(Ordering::Relaxed),
            Duration::from_nanos(dev.max_free_ns.load(Ordering::Relaxed)),
            dev.out_of_memory.load(Ordering::Relaxed)
        );
        assert_eq!(
            dev.window.load(Ordering::Relaxed),
            2,
            "device {}'s BAR filled once",
            dev.index
        );
        assert!(
            dev.streamed_while_other_full.load(Ordering::Relaxed) > 0,
            "device {}'s ring streamed while the other BAR was full",
            dev.index
        );
    }
    assert!(checks > 0, "no kernel check ran beside the consumers");

    // Device 0 ends while device 1's consumer still runs.
    let [k0, k1] = kept;
    finish_device(&devs[0], Some(&devs[1]), k0, produced[0]);
    finish_device(&devs[1], None, k1, produced[1]);
    for dev in &devs {
        settle(&dev.gpu);
    }
    drop(done);
    dog.join().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Peer access.

/// A mapping of its own (above the 1 MiB carving limit), not a multiple of the granularity.
const PEER_BYTES: u64 = (4 << 20) + 4096;

/// Memory of `owner` used by a kernel on `reader`: access before and after the grant
/// (`cuMemGetAccess`), every word read by the reader's kernel and written back by it over the
/// link, a pool block and a carved allocation granted the same way, with negative controls.
fn peer_reads_and_writes(owner: &Gpu, reader: &Gpu) {
    let driver = owner.driver();
    let (mine, theirs) = (owner.ordinal().unwrap(), reader.ordinal().unwrap());
    let what = format!("device {mine}'s memory used by device {theirs}");
    let seed = 0x5EED_0000 | mine as u32;
    let words = PEER_BYTES / 4;
    let mut mem = owner.alloc(PEER_BYTES).unwrap();
    let values: Vec<u32> = (0..words).map(|i| pattern(i, seed)).collect();
    mem.write_pod(0, &values).unwrap();
    let never_granted = owner.alloc(2 << 20).unwrap();

    let access = |ptr: u64, ordinal: i32| {
        driver
            .mem_access(ptr, ordinal)
            .unwrap_or_else(|e| panic!("{what}: cuMemGetAccess at {ptr:#x} for {ordinal}: {e}"))
    };
    let rw = CU_MEM_ACCESS_FLAGS_PROT_READWRITE as u64;
    let none = CU_MEM_ACCESS_FLAGS_PROT_NONE as u64;
    assert_eq!(
        access(mem.device_ptr(), mine),
        rw,
        "{what}: the owner's own access"
    );
    assert_eq!(
        access(mem.device_ptr(), theirs),
        none,
        "{what}: before any grant"
    );
    mem.grant_peer_access(reader).expect("grant");
    for at in [0, PEER_BYTES - 1] {
        assert_eq!(
            access(mem.device_ptr() + at, theirs),
            rw,
            "{what}: after the grant, +{at}"
        );
    }
    assert_eq!(
        access(mem.device_ptr(), mine),
        rw,
        "{what}: the owner keeps its access"
    );
    // Negative control: a grant covers its own mapping, not the owner's other memory.
    assert_eq!(
        access(never_granted.device_ptr(), theirs),
        none,
        "{what}: memory never granted"
    );
    mem.grant_peer_access(reader)
        .expect("granting again is harmless");
    mem.grant_peer_access(owner)
        .expect("the owner itself: a no-op");

    // The reader's kernel reads every word through the owner's device address.
    let module = Module::load_ptx(reader, MAPPING_PTX).unwrap();
    let mut errors = reader.alloc(4096).unwrap();
    let wrong = mismatched_words(reader, &module, mem.device_ptr(), words, seed, &mut errors);
    assert_eq!(wrong, 0, "{what}: words wrong for the reader's kernel");
    // Negative control: another seed, every word reported (the kernel really reads them).
    let all = mismatched_words(
        reader,
        &module,
        mem.device_ptr(),
        words,
        seed ^ 1,
        &mut errors,
    );
    assert_eq!(all, words, "{what}: the reader's check cannot fail");

    // And writes them: check_and_transform in place, then the owner's CPU mapping sees it.
    errors.write_pod(0, &[0u64]).unwrap();
    let (mut src, mut dst, mut n, mut s, mut e) = (
        mem.device_ptr(),
        mem.device_ptr(),
        words,
        seed,
        errors.device_ptr(),
    );
    launch(
        reader,
        &module,
        "check_and_transform",
        512,
        256,
        &mut [
            arg(&mut src),
            arg(&mut dst),
            arg(&mut n),
            arg(&mut s),
            arg(&mut e),
        ],
    );
    let mut out = [0u64];
    errors.read_pod(0, &mut out).unwrap();
    assert_eq!(out[0], 0, "{what}: the transform's own check");
    let mut back = vec![0u32; words as usize];
    mem.read_pod(0, &mut back).unwrap();
    let unchanged = back
        .iter()
        .enumerate()
        .filter(|&(i, &v)| v != pattern(i as u64, seed).wrapping_mul(3).wrapping_add(1))
        .count();
    assert_eq!(
        unchanged, 0,
        "{what}: words the reader's writes did not reach"
    );

    // A pool block: granted through its chunk.
    let pool = Pool::new(owner.clone(), PoolConfig::default()).unwrap();
    let mut block = pool.alloc(1000, 64).unwrap();
    let tag = 0x0BAD_F00D ^ mine as u32;
    block.write(0, &tag_bytes(tag, 1000)).unwrap();
    pool.flush().unwrap();
    let bp = block.device_ptr().unwrap();
    assert_eq!(
        access(bp, theirs),
        none,
        "{what}: a pool block before its grant"
    );
    block.grant_peer_access(reader).expect("grant a block");
    assert_eq!(
        access(bp, theirs),
        rw,
        "{what}: a pool block after its grant"
    );
    let mut table = reader.alloc(4096).unwrap();
    let check_block = |table: &mut RawMemory, tag: u32| {
        table.write_pod(0, &[bp]).unwrap();
        table.write_pod(8, &[1000u32, tag]).unwrap();
        table.write_pod(16, &[0u64]).unwrap();
        let t = table.device_ptr();
        launch_check_tagged_blocks(reader, &module, 1, t, t + 8, t + 12, 1, t + 16);
        let mut bad = [0u64];
        table.read_pod(16, &mut bad).unwrap();
        bad[0]
    };
    assert_eq!(check_block(&mut table, tag), 0, "{what}: a pool block");
    assert_eq!(
        check_block(&mut table, tag + 1),
        1,
        "{what}: the block check cannot fail"
    );

    // A carved allocation: the grant covers its whole granule.
    let mut small = owner.alloc(64 << 10).unwrap();
    let small_words = (64 << 10) / 4;
    let small_values: Vec<u32> = (0..small_words).map(|i| pattern(i, !seed)).collect();
    small.write_pod(0, &small_values).unwrap();
    small
        .grant_peer_access(reader)
        .expect("grant a carved allocation");
    assert_eq!(access(small.device_ptr(), theirs), rw);
    let wrong = mismatched_words(
        reader,
        &module,
        small.device_ptr(),
        small_words,
        !seed,
        &mut errors,
    );
    assert_eq!(wrong, 0, "{what}: a carved allocation");
    println!(
        "PEER ACCESS: {what}: {} bytes read and rewritten by device {theirs}'s kernel, a pool \
         block and a carved allocation checked; cuMemGetAccess {none} before, {rw} after",
        PEER_BYTES
    );
    // Every launch above synchronized the reader: nothing of it uses the memory any more.
    drop((mem, never_granted, small, block, pool));
    settle(owner);
}

#[test]
#[ignore = "needs two NVIDIA GPUs: run with --include-ignored on a two-GPU machine (scripts/gpu-check skips it on one GPU)"]
fn two_gpus_peer_access_through_vmm_mappings() {
    let gpus = two_gpus();
    let driver = gpus[0].driver().clone();
    let (d0, d1) = (gpus[0].cu_device(), gpus[1].cu_device());
    for (a, b) in [(d0, d1), (d1, d0)] {
        let attribute = |which| {
            driver
                .p2p_attribute(which, a, b)
                .map_or_else(|e| format!("? ({e})"), |v| v.to_string())
        };
        println!(
            "PEER ACCESS: device {a} -> device {b}: cuDeviceCanAccessPeer {}, access supported \
             {}, native atomics {}, performance rank {}",
            driver.can_access_peer(a, b).expect("cuDeviceCanAccessPeer"),
            attribute(CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED),
            attribute(CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED),
            attribute(CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)
        );
    }
    // The link between them as the driver's tool shows it (NV# for NVLink), where it is present.
    if let Ok(out) = std::process::Command::new("nvidia-smi")
        .args(["topo", "-m"])
        .output()
    {
        for line in String::from_utf8_lossy(&out.stdout).lines().take(6) {
            println!("PEER ACCESS: topo: {line}");
        }
    }

    for (owner, reader) in [(&gpus[0], &gpus[1]), (&gpus[1], &gpus[0])] {
        let (mine, theirs) = (owner.ordinal().unwrap(), reader.ordinal().unwrap());
        if reader.can_access_peer(owner).unwrap() {
            peer_reads_and_writes(owner, reader);
            // Where memory is imported with cuImportExternalMemory instead of VMM, the grant is
            // refused with the way out (cuCtxEnablePeerAccess), not done halfway.
            let imported =
                Gpu::open_with(mine, OpenOptions::new().external_memory_import(true)).unwrap();
            let mem = imported.alloc(64 << 10).unwrap();
            let err = mem.grant_peer_access(reader).unwrap_err();
            assert!(
                matches!(&err, Error::Unsupported(m) if m.contains("cuCtxEnablePeerAccess")),
                "{err}"
            );
        } else {
            println!(
                "PEER ACCESS: NOT SUPPORTED: device {theirs} ({}) cannot access the memory of \
                 device {mine} ({}): cuDeviceCanAccessPeer = 0, so vkgdr memory of one GPU \
                 cannot be used by kernels of the other here",
                reader.name(),
                owner.name()
            );
            let mem = owner.alloc(PEER_BYTES).unwrap();
            let err = mem.grant_peer_access(reader).unwrap_err();
            assert!(
                matches!(&err, Error::Unsupported(m) if m.contains("cuDeviceCanAccessPeer")),
                "the refused grant says why: {err}"
            );
            println!("PEER ACCESS: the grant is refused: {err}");
        }
    }
}

//! Failure injection on the GPU (`--features failpoints`): every step of a raw allocation (Vulkan
//! allocation, map, madvise, export, fcntl, VMM import, reservation, map, access; the
//! external-memory import and mapped buffer where that path is used), of an arena (reserve,
//! import, map, access; grow and mirror), of pool growth and of ring creation is made to fail in
//! turn. Each failure is reported with its call's name and leaves nothing behind — open fds and
//! free VRAM (`cuMemGetInfo`) are where they were, an arena keeps its chunks and contents, a
//! pool's accounting matches the chunks held — and everything works afterwards. Pools also run
//! random workloads under random failure points. Own binary: it counts fds.

mod common;
#[path = "models/failing.rs"]
mod failing;

use std::time::Duration;

use common::*;
use failing::{op, run, FailingSource, Failures};
use proptest::prelude::*;
use vkgdr::arena::ArenaSource;
use vkgdr::failpoint;
use vkgdr::ring::layout::WrapMode;
use vkgdr::ring::{DeviceRing, LaunchRing};
use vkgdr::{Arena, Gpu, Mapping, Pool, PoolConfig};

/// The steps of a raw allocation, in order.
const RAW: &[&str] = failpoint::RAW_ALLOCATION;

/// The steps of an arena chunk (after the Vulkan allocation and its export).
const ARENA: [&str; 3] = [
    "cuMemImportFromShareableHandle",
    "cuMemMap",
    "cuMemSetAccess",
];

/// Open fds and free VRAM, once every release of `gpu`'s memory has happened and the mappings
/// it kept for later allocations went back (an allocation that takes one makes no driver call).
fn held(gpu: &Gpu) -> (usize, u64) {
    settle(gpu);
    gpu.trim();
    (open_fds(), gpu.mem_info().unwrap().0)
}

/// Checks that `result` failed at `point` and that the failure left nothing behind.
fn failed_cleanly<T>(gpu: &Gpu, point: &str, result: vkgdr::Result<T>, before: (usize, u64)) {
    match result {
        Ok(_) => panic!("{point}: succeeded although it was armed to fail"),
        Err(e) => assert_eq!(e.driver_call(), Some(point), "{e}"),
    }
    assert_eq!(failpoint::fired(), 1, "{point}");
    assert_eq!(
        held(gpu),
        before,
        "{point} failing left fds or device memory behind"
    );
}

fn chunk_size(gpu: &Gpu) -> u64 {
    vkgdr::arena::granularity(gpu.driver(), 0)
        .unwrap()
        .max(2 << 20)
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn raw_allocation_steps_failing_leave_nothing() {
    raw_steps(&open(false), RAW);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn external_memory_import_steps_failing_leave_nothing() {
    let gpu = Gpu::open_with(0, vkgdr::OpenOptions::new().external_memory_import(true)).unwrap();
    assert!(gpu.vmm_status().is_err());
    raw_steps(&gpu, failpoint::EXTERNAL_MEMORY_IMPORT);
}

/// Fails each of `points` in turn in a 4 MiB raw allocation (one that maps its own memory).
fn raw_steps(gpu: &Gpu, points: &[&str]) {
    let gpu = gpu.clone();
    drop(gpu.alloc(4 << 20).unwrap());
    let before = held(&gpu);
    for &point in points {
        failpoint::reset();
        failpoint::fail_at(point, 1);
        failed_cleanly(&gpu, point, gpu.alloc(4 << 20), before);
        let mut mem = gpu.alloc(4 << 20).unwrap();
        mem.write(0, b"still works").unwrap();
        assert_eq!(mem.read_vec(0, 11).unwrap(), b"still works");
        drop(mem);
        // Its mapping is kept for the next 4 MiB allocation, which would then call nothing.
        held(&gpu);
    }
    failpoint::reset();
    assert_eq!(held(&gpu), before);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn arena_steps_failing_leave_the_arena_as_it_was() {
    let gpu = open(false);
    let chunk = chunk_size(&gpu);
    drop(Arena::new(&gpu, 4 * chunk, chunk).map(|mut a| a.grow().map(|_| a)));
    let before = held(&gpu);
    failpoint::reset();
    failpoint::fail_at("cuMemAddressReserve", 1);
    failed_cleanly(
        &gpu,
        "cuMemAddressReserve",
        Arena::new(&gpu, 8 * chunk, chunk),
        before,
    );

    let mut arena = Arena::new(&gpu, 8 * chunk, chunk).unwrap();
    arena.grow().unwrap();
    let data: Vec<u8> = (0..chunk).map(|i| (i * 7 % 251) as u8).collect();
    arena.write(0, &data).unwrap();
    let with_one = held(&gpu);
    for point in RAW[..5].iter().chain(&ARENA) {
        failpoint::reset();
        failpoint::fail_at(point, 1);
        failed_cleanly(&gpu, point, arena.grow(), with_one);
        assert_eq!((arena.chunk_count(), arena.len()), (1, chunk), "{point}");
        assert_eq!(arena.read_vec_all(), data, "{point}: contents changed");
    }
    for point in &ARENA[1..] {
        failpoint::reset();
        failpoint::fail_at(point, 1);
        failed_cleanly(&gpu, point, arena.map_mirror(), with_one);
        assert!(!arena.is_mirrored(), "{point}");
    }
    failpoint::reset();
    // Still grows, mirrors and shrinks.
    arena.grow().unwrap();
    arena.write(chunk, &data).unwrap();
    arena.map_mirror().unwrap();
    arena.unmap_mirror().unwrap();
    arena.shrink(1).unwrap();
    assert_eq!(arena.read_vec_all(), data);
    drop(arena);
    assert_eq!(held(&gpu), before);
}

/// Reads a whole arena (test helper).
trait ReadAll {
    fn read_vec_all(&self) -> Vec<u8>;
}

impl ReadAll for Arena {
    fn read_vec_all(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len() as usize];
        self.read(0, &mut out).unwrap();
        out
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn ring_creation_failing_at_every_step_leaves_nothing() {
    let gpu = open(false);
    let cases = [
        (WrapMode::Padded, 64 << 10),
        (WrapMode::Mirrored, chunk_size(&gpu)),
    ];
    for (wrap, capacity) in cases {
        drop(DeviceRing::with_lanes(&gpu, capacity, 2, wrap).unwrap());
    }
    drop(LaunchRing::new(&gpu, 64 << 10).unwrap());
    let before = held(&gpu);
    let mut failures = 0;
    for (wrap, capacity) in cases {
        for &point in failpoint::POINTS {
            // Every pass of the point during one creation, failed in turn, until the creation
            // passes it fewer times than asked (then it succeeds).
            for nth in 1.. {
                failpoint::reset();
                failpoint::fail_at(point, nth);
                match DeviceRing::with_lanes(&gpu, capacity, 2, wrap) {
                    Err(e) => {
                        assert_eq!(e.driver_call(), Some(point), "{wrap:?} {point} #{nth}: {e}");
                        assert_eq!(failpoint::fired(), 1);
                        assert_eq!(
                            held(&gpu),
                            before,
                            "{wrap:?}: {point} #{nth} left something"
                        );
                        failures += 1;
                    }
                    Ok(ring) => {
                        assert_eq!(failpoint::fired(), 0, "{wrap:?} {point} #{nth}");
                        ring.push(&[1; 32], Some(Duration::from_secs(1))).unwrap();
                        drop(ring);
                        break;
                    }
                }
            }
        }
    }
    failpoint::reset();
    failpoint::fail_at("cuStreamCreate", 1);
    failed_cleanly(
        &gpu,
        "cuStreamCreate",
        LaunchRing::new(&gpu, 64 << 10),
        before,
    );
    failpoint::reset();
    println!("ring creation: {failures} injected failures, none left anything behind");
    assert!(failures >= 20, "only {failures} steps failed");
    assert_eq!(held(&gpu), before);
}

/// One forced non-coherent handle for every case (opening costs ~0.7 s), warmed up: whatever
/// the driver sets up on first use (DMA reads, VMM mappings) is not counted as a leak.
fn shared_gpu() -> &'static Gpu {
    static GPU: std::sync::OnceLock<Gpu> = std::sync::OnceLock::new();
    GPU.get_or_init(|| {
        let gpu = open(true);
        let pool = Pool::new(gpu.clone(), failing::config()).unwrap();
        let mut block = pool.alloc(20 << 10, 64).unwrap();
        block.fill(0, 20 << 10, 1).unwrap();
        block.flush().unwrap();
        block.read_vec(0, 20 << 10).unwrap();
        let chunk = chunk_size(&gpu);
        let mut arena = Arena::new(&gpu, 2 * chunk, chunk).unwrap();
        arena.grow().unwrap();
        gpu
    })
}

/// Random driver failures among a pool's steps.
fn armed_points() -> impl Strategy<Value = Vec<(&'static str, u64)>> {
    let mut points = RAW.to_vec();
    points.extend([
        "vkFlushMappedMemoryRanges",
        "vkInvalidateMappedMemoryRanges",
    ]);
    prop::collection::vec((prop::sample::select(points), 1u64..=8), 1..4)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    #[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
    fn pools_survive_random_driver_failures(
        points in armed_points(),
        ops in prop::collection::vec(op(), 1..60),
        on_arena in any::<bool>(),
    ) {
        let gpu = shared_gpu();
        let before = held(gpu);
        failpoint::reset();
        let chunk = chunk_size(gpu);
        let (pool, ledger) = if on_arena {
            let arena = Arena::new(gpu, 16 * chunk, chunk).unwrap();
            let (source, ledger) =
                FailingSource::new(ArenaSource::new(arena), Failures::default(), false);
            let cfg = PoolConfig {
                chunk_size: chunk,
                max_chunk_size: chunk,
                dedicated_threshold: chunk,
                shards: 1,
                ..Default::default()
            };
            (Pool::new(source, cfg).unwrap(), ledger)
        } else {
            let (source, ledger) = FailingSource::new(gpu.clone(), Failures::default(), false);
            (Pool::new(source, failing::config()).unwrap(), ledger)
        };
        for (point, nth) in &points {
            failpoint::fail_at(point, *nth);
        }
        run(&pool, &ledger, &ops, &failpoint::fired);
        drop(pool);
        failpoint::reset();
        prop_assert_eq!(held(gpu), before, "fds or device memory left behind");
    }
}

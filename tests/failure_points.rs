//! Failure injection at the driver level, on lavapipe (CI): the library's failure points
//! (`--features failpoints`) make vkAllocateMemory, vkMapMemory, madvise, vkGetMemoryFdKHR,
//! fcntl, vkFlushMappedMemoryRanges and vkInvalidateMappedMemoryRanges fail. Each failure is
//! reported with the call's name and leaves nothing behind: lavapipe backs every exportable
//! allocation with a memfd, so the process's fds and its memfd mappings (/proc/self/maps) count
//! the Vulkan allocations and mappings alive (on the GPU machine this binary runs on NVIDIA's
//! driver, where only fds are counted). tests/gpu_failure_points.rs does the same for the CUDA
//! import, the arena and rings on the GPU.

mod common;
#[path = "models/failing.rs"]
mod failing;

use std::sync::Mutex;

use failing::{config, op, run, still_usable, FailingSource, Failures};
use proptest::prelude::*;
use vkgdr::failpoint;
use vkgdr::{Error, Pool};

/// Tests of this binary take turns: they count the process's fds and mappings.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Open fds and lavapipe memory mappings of this process.
fn held() -> (usize, usize) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    (
        common::open_fds(),
        maps.lines().filter(|l| l.contains("memfd:")).count(),
    )
}

/// The calls on the path of a Vulkan-only allocation.
const ALLOCATION: [&str; 3] = ["vkAllocateMemory", "vkMapMemory", "madvise"];

#[test]
fn each_allocation_step_failing_leaves_nothing() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let ctx = common::vulkan(false);
    drop(ctx.allocate(4096).unwrap());
    let before = held();
    for point in ALLOCATION {
        failpoint::reset();
        failpoint::fail_at(point, 1);
        let e = ctx.allocate(1 << 20).unwrap_err();
        assert_eq!(e.driver_call(), Some(point), "{e}");
        assert_eq!(failpoint::fired(), 1);
        assert_eq!(
            held(),
            before,
            "{point} failing left an allocation or a mapping"
        );
        // The next allocation works.
        let mut mem = ctx.allocate(1 << 20).unwrap();
        vkgdr::Mapping::write(&mut mem, 100, b"works").unwrap();
        assert_eq!(vkgdr::Mapping::read_vec(&mem, 100, 5).unwrap(), b"works");
        drop(mem);
    }
    for point in ["vkGetMemoryFdKHR", "fcntl"] {
        let mem = ctx.allocate(1 << 20).unwrap();
        let with_memory = held();
        failpoint::reset();
        failpoint::fail_at(point, 1);
        let e = mem.export_fd().unwrap_err();
        assert_eq!(e.driver_call(), Some(point), "{e}");
        assert_eq!(held(), with_memory, "{point} failing left an fd open");
        drop(mem.export_fd().unwrap());
    }
    failpoint::reset();
    assert_eq!(held(), before);
}

#[test]
fn pool_growth_dedicated_blocks_and_flushes_failing_leave_nothing() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    common::warm_up_vulkan();
    let before = held();
    for point in ALLOCATION {
        for size in [64, 48 << 10] {
            failpoint::reset();
            let (source, ledger) =
                FailingSource::new(common::vulkan(true), Failures::default(), false);
            let pool = Pool::new(source, config()).unwrap();
            failpoint::fail_at(point, 1);
            let e = pool.alloc(size, 64).unwrap_err();
            assert_eq!(e.driver_call(), Some(point), "{size}: {e}");
            let stats = pool.stats();
            assert_eq!((stats.bytes_reserved, stats.chunks), (0, 0), "{point}");
            assert_eq!(
                ledger
                    .live_chunks
                    .load(std::sync::atomic::Ordering::Relaxed),
                0
            );
            still_usable(&pool);
        }
    }
    for point in [
        "vkFlushMappedMemoryRanges",
        "vkInvalidateMappedMemoryRanges",
    ] {
        failpoint::reset();
        let pool = Pool::new(common::vulkan(true), config()).unwrap();
        let mut block = pool.alloc(256, 64).unwrap();
        vkgdr::Mapping::fill(&mut block, 0, 256, 9).unwrap();
        failpoint::fail_at(point, 1);
        let e = if point.starts_with("vkFlush") {
            block.flush().unwrap_err()
        } else {
            block.flush().unwrap();
            vkgdr::Mapping::read_vec(&block, 0, 256).unwrap_err()
        };
        assert!(
            matches!(e, Error::Vulkan { call, .. } if call == point),
            "{e}"
        );
        failpoint::reset();
        block.flush().unwrap();
        assert_eq!(
            vkgdr::Mapping::read_vec(&block, 0, 256).unwrap(),
            vec![9; 256]
        );
    }
    failpoint::reset();
    assert_eq!(held(), before, "Vulkan allocations or mappings left behind");
}

/// Random driver failures (a few points, each at a random pass) under random workloads.
fn armed_points() -> impl Strategy<Value = Vec<(&'static str, u64)>> {
    let point = prop::sample::select(vec![
        "vkAllocateMemory",
        "vkMapMemory",
        "madvise",
        "vkFlushMappedMemoryRanges",
        "vkInvalidateMappedMemoryRanges",
    ]);
    prop::collection::vec((point, 1u64..=12), 1..4)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn vulkan_pools_survive_random_driver_failures(
        points in armed_points(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        common::warm_up_vulkan();
        let before = held();
        failpoint::reset();
        let (source, ledger) = FailingSource::new(common::vulkan(true), Failures::default(), false);
        let pool = Pool::new(source, config()).unwrap();
        for (point, nth) in &points {
            failpoint::fail_at(point, *nth);
        }
        run(&pool, &ledger, &ops, &failpoint::fired);
        drop(pool);
        failpoint::reset();
        prop_assert_eq!(held(), before, "Vulkan allocations or mappings left behind");
    }
}

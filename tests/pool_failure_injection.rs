//! Failure injection: chunk allocations, flushes and invalidates that fail at random points under
//! random workloads leave nothing behind — the pool's accounting matches the chunks really held
//! after every step, every chunk is given back in the end — and the pool keeps working. On host
//! memory (coherent and pretending to be non-coherent) and on lavapipe's exported Vulkan memory,
//! where each allocation is a memfd, so the fd count proves no Vulkan allocation was left
//! behind. The driver-level paths (map, export, import) are in tests/failure_points.rs.

mod common;
#[path = "models/failing.rs"]
mod failing;

use std::sync::Mutex;

use failing::{config, failures, op, run, FailingSource, Failures, Op};
use proptest::prelude::*;
use vkgdr::chunk::HostMemorySource;
use vkgdr::{Error, Mapping, Pool};

/// Tests of this binary take turns: the lavapipe ones count the process's fds.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn host_pool(failures: Failures, non_coherent: bool) -> (Pool, std::sync::Arc<failing::Ledger>) {
    let (source, ledger) = FailingSource::new(HostMemorySource, failures, non_coherent);
    (Pool::new(source, config()).unwrap(), ledger)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn host_pools_survive_random_failures(
        failures in failures(),
        ops in prop::collection::vec(op(), 1..80),
        non_coherent in any::<bool>(),
    ) {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let (pool, ledger) = host_pool(failures, non_coherent);
        run(&pool, &ledger, &ops, &|| ledger.injected());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn vulkan_pools_survive_random_failures(
        failures in failures(),
        ops in prop::collection::vec(op(), 1..60),
        force_non_coherent in any::<bool>(),
    ) {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        common::warm_up_vulkan();
        let fds = common::open_fds();
        let ctx = common::vulkan(force_non_coherent);
        let (source, ledger) = FailingSource::new(ctx, failures, false);
        let pool = Pool::new(source, config()).unwrap();
        run(&pool, &ledger, &ops, &|| ledger.injected());
        drop(pool);
        prop_assert_eq!(common::open_fds(), fds, "Vulkan allocations left behind");
    }
}

/// Every kind of call failing at each of its first calls, under one fixed workload that grows
/// shared chunks, takes dedicated blocks, writes, flushes, reads and trims: each failure is
/// reported and nothing is left behind.
#[test]
fn each_call_failing_at_each_point() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut ops = Vec::new();
    for i in 0..12usize {
        ops.push(Op::Alloc {
            size: [24, 3000, 20_000, 40 << 10][i % 4],
            align_log2: 6,
        });
        ops.push(Op::Write(i));
        ops.push(Op::Read(i * 7));
        if i % 3 == 2 {
            ops.extend([Op::Flush(i), Op::Free(i), Op::PoolFlush, Op::Trim]);
        }
    }
    let mut injected = 0;
    for kind in 0..3 {
        for nth in 1..=12 {
            let mut f = Failures::default();
            [&mut f.allocs, &mut f.flushes, &mut f.invalidates][kind].insert(nth);
            let (pool, ledger) = host_pool(f, true);
            injected += run(&pool, &ledger, &ops, &|| ledger.injected());
        }
    }
    assert!(
        injected >= 30,
        "only {injected} of the planned failures were reached"
    );
}

/// A failed flush keeps the block's writes pending (nothing is lost or silently dropped): the
/// next flush pushes them.
#[test]
fn a_failed_flush_keeps_the_writes_pending() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut f = Failures::default();
    f.flushes.insert(1);
    let (pool, _ledger) = host_pool(f, true);
    let mut block = pool.alloc(256, 64).unwrap();
    block.fill(0, 256, 7).unwrap();
    assert!(matches!(
        block.flush(),
        Err(Error::Vulkan {
            call: "vkFlushMappedMemoryRanges",
            ..
        })
    ));
    assert!(block.has_pending_writes());
    block.flush().unwrap();
    assert!(!block.has_pending_writes());
}

//! The machine work that rows of this library are made of ([`MachineWork`], per report:
//! [`machine_work_of`]): driver calls (an allocation of whole chunks, a drop that gives them back,
//! a module load), the CPU's stores and loads through the BAR, or, for the pool's pairs, the
//! CPU's own speed at the same pair (the C library's `malloc` and `free`), each with the machine
//! rows that time that work in the same run. The comparison judges such a row's move against theirs as well
//! as on its own ([`anchoring`](super::anchoring)), so a machine whose driver or BAR is slower
//! does not make the library look worse. Every row is named by the constant its benchmark writes
//! it with, so a renamed row does not compile here.
//!
//! Left without machine work on purpose: `copybw-read` (the raw reads scatter from run to run on
//! one machine far more than the library's reads, so against them a slower read would pass as the
//! machine's) and `arena-grow` (measured at another point of the run than `apiperf`'s steps, its
//! rows need not move with them); figures: BENCHMARKS.md, 'Against the machine work'.

use vkgdr_lab::bench::raw_steps::{ALLOC_STEPS, CHUNK_ALLOC, CHUNK_FREE, FREE_STEPS};
use vkgdr_lab::bench::waits::driver_calls::rows as drv;
use vkgdr_lab::bench::waits::library_calls::rows as lib;
use vkgdr_lab::bench::{apiperf, copybw, copylat, fastpath};

/// The machine work a library row is made of: machine rows (origin `machine`) of the same report,
/// measured beside it in the same run at the row's size, whose medians add up to what the
/// library's call leaves to the machine (the driver calls it makes, or the same bytes stored or
/// loaded through the BAR by a plain loop).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MachineWork {
    /// The library's row.
    pub row: &'static str,
    /// The machine rows of the same report, one per driver call (or group of calls timed
    /// together, or raw copy); every one must be found at the row's size, else the row stands
    /// alone.
    pub made_of: &'static [&'static str],
}

/// The machine work of the row `method` of report `report`, if it has any.
pub fn machine_work_of(report: &str, method: &str) -> Option<&'static MachineWork> {
    let (_, work) = BY_REPORT.iter().find(|(name, _)| *name == report)?;
    work.iter().find(|w| w.row == method)
}

/// The reports with rows of machine work, by name (each a registered report: tested).
const BY_REPORT: [(&str, &[MachineWork]); 8] = [
    ("apiperf", APIPERF_MACHINE_WORK),
    ("fastpath-pool", FASTPATH_POOL_MACHINE_WORK),
    ("copybw-write", COPYBW_WRITE_MACHINE_WORK),
    ("copylat", COPYLAT_MACHINE_WORK),
    ("fastpath-small", FASTPATH_SMALL_MACHINE_WORK),
    ("waits-idle", WAITS_MACHINE_WORK),
    ("waits-own-stream", WAITS_MACHINE_WORK),
    ("waits-legacy-stream", WAITS_LEGACY_MACHINE_WORK),
];

/// `apiperf`: a raw allocation of whole chunks (2 MiB and up; smaller ones are carved and have no
/// step rows at their size, so they stand alone) and a pool chunk are the `step:` rows' driver
/// calls, and so are their frees.
const APIPERF_MACHINE_WORK: &[MachineWork] = &[
    MachineWork {
        row: apiperf::rows::RAW_ALLOC,
        made_of: &ALLOC_STEPS,
    },
    MachineWork {
        row: apiperf::rows::RAW_FREE,
        made_of: &FREE_STEPS,
    },
    MachineWork {
        row: CHUNK_ALLOC,
        made_of: &ALLOC_STEPS,
    },
    MachineWork {
        row: CHUNK_FREE,
        made_of: &FREE_STEPS,
    },
    // Not a driver call: the C library's allocator doing the same pair at the same size in
    // the same process, timed side by side with the pool's (their samples in turn). The pool's
    // pair is a few dozen nanoseconds of this CPU's work, and how fast a CPU of these machines
    // runs it moves by up to 1.7x from one process to the next (BENCHMARKS.md, 'Comparing with
    // earlier runs').
    MachineWork {
        row: apiperf::rows::POOL_PAIR,
        made_of: &[apiperf::rows::MALLOC_PAIR],
    },
];

/// `fastpath-pool`: each pool pair against `malloc`+`free` on as many threads, as in `apiperf`.
const FASTPATH_POOL_MACHINE_WORK: &[MachineWork] = &[
    MachineWork {
        row: fastpath::rows::POOL_1_DEFAULT,
        made_of: &[fastpath::rows::MALLOC_PAIR],
    },
    MachineWork {
        row: fastpath::rows::POOL_1_NO_CACHE,
        made_of: &[fastpath::rows::MALLOC_PAIR],
    },
    MachineWork {
        row: fastpath::rows::POOL_8_DEFAULT,
        made_of: &[fastpath::rows::MALLOC_PAIR_8],
    },
    MachineWork {
        row: fastpath::rows::POOL_8_NO_CACHE,
        made_of: &[fastpath::rows::MALLOC_PAIR_8],
    },
    MachineWork {
        row: fastpath::rows::POOL_16_DEFAULT,
        made_of: &[fastpath::rows::MALLOC_PAIR_16],
    },
    MachineWork {
        row: fastpath::rows::POOL_16_NO_CACHE,
        made_of: &[fastpath::rows::MALLOC_PAIR_16],
    },
];

/// The `waits` reports' driver calls that make one chunk of device memory (a Vulkan allocation
/// exported, imported, reserved, mapped).
const WAITS_CHUNK_ALLOC: &[&str] = &[
    drv::VK_ALLOCATE,
    drv::VK_EXPORT_FD,
    drv::CU_IMPORT,
    drv::CU_RESERVE,
    drv::CU_MAP,
    drv::CU_SET_ACCESS,
];

/// The `waits` reports' driver calls that give such a chunk back.
const WAITS_CHUNK_FREE: &[&str] = &[
    drv::CU_UNMAP,
    drv::CU_RELEASE,
    drv::CU_ADDRESS_FREE,
    drv::VK_FREE,
];

/// The library calls of `waits` that make something (memory, a module, a stream) and are mostly
/// the driver calls beside them.
const WAITS_ALLOC_WORK: [MachineWork; 9] = [
    MachineWork {
        row: lib::GPU_ALLOC,
        made_of: WAITS_CHUNK_ALLOC,
    },
    MachineWork {
        row: lib::POOL_FIRST_CHUNK,
        made_of: WAITS_CHUNK_ALLOC,
    },
    MachineWork {
        row: lib::POOL_OWN_CHUNK,
        made_of: WAITS_CHUNK_ALLOC,
    },
    MachineWork {
        row: lib::ARENA_GROW,
        made_of: &[
            drv::VK_ALLOCATE,
            drv::VK_EXPORT_FD,
            drv::CU_IMPORT,
            drv::CU_MAP,
            drv::CU_SET_ACCESS,
        ],
    },
    MachineWork {
        row: lib::RING_NEW,
        made_of: WAITS_CHUNK_ALLOC,
    },
    MachineWork {
        row: lib::PINNED_NEW,
        made_of: &[
            drv::VK_ALLOCATE_HOST,
            drv::VK_EXPORT_FD_HOST,
            drv::CU_IMPORT_HOST,
            drv::CU_MAP_HOST,
            drv::CU_SET_ACCESS_HOST,
        ],
    },
    MachineWork {
        row: lib::MODULE_LOAD,
        made_of: &[drv::CU_MODULE_LOAD],
    },
    MachineWork {
        row: lib::STREAM_NEW,
        made_of: &[drv::CU_STREAM_CREATE],
    },
    MachineWork {
        row: lib::MEMCPY_HTOD,
        made_of: &[drv::CU_MEMCPY_HTOD],
    },
];

/// The drops and releases of `waits` that give chunks back to the driver there and then (with no
/// kernel running, or one on its own stream; on the legacy stream the library defers them).
const WAITS_FREE_WORK: [MachineWork; 8] = [
    MachineWork {
        row: lib::RAW_DROP,
        made_of: WAITS_CHUNK_FREE,
    },
    MachineWork {
        row: lib::BLOCK_DROP_OWN,
        made_of: WAITS_CHUNK_FREE,
    },
    MachineWork {
        row: lib::POOL_TRIM,
        made_of: WAITS_CHUNK_FREE,
    },
    MachineWork {
        row: lib::ARENA_SHRINK,
        made_of: &[drv::CU_UNMAP, drv::CU_RELEASE, drv::VK_FREE],
    },
    MachineWork {
        row: lib::RING_DROP,
        made_of: WAITS_CHUNK_FREE,
    },
    MachineWork {
        row: lib::PINNED_DROP,
        made_of: &[drv::CU_UNMAP_HOST, drv::CU_RELEASE_HOST, drv::VK_FREE_HOST],
    },
    MachineWork {
        row: lib::MODULE_DROP,
        made_of: &[drv::CU_MODULE_UNLOAD],
    },
    MachineWork {
        row: lib::STREAM_DROP,
        made_of: &[drv::CU_STREAM_DESTROY],
    },
];

/// `waits-idle` and `waits-own-stream`: allocations and frees.
const WAITS_MACHINE_WORK: &[MachineWork] = &{
    const A: usize = WAITS_ALLOC_WORK.len();
    let mut all = [WAITS_ALLOC_WORK[0]; A + WAITS_FREE_WORK.len()];
    let mut i = 0;
    while i < all.len() {
        all[i] = if i < A {
            WAITS_ALLOC_WORK[i]
        } else {
            WAITS_FREE_WORK[i - A]
        };
        i += 1;
    }
    all
};

/// `waits-legacy-stream`: allocations only (the frees are deferred there).
const WAITS_LEGACY_MACHINE_WORK: &[MachineWork] = &WAITS_ALLOC_WORK;

/// `copybw-write`: each pool's BAR write is the same bytes stored by as many threads; the raw
/// rows time those stores in a plain loop beside it (lent machines differ widely on them:
/// BENCHMARKS.md, 'Machines differ more than the code moved').
/// Below about 1 MiB the raw rows of 2 and more threads also time the threads' wake-up (the pool's
/// caller takes parts itself meanwhile); the spread there is wide, and so is the noise.
const COPYBW_WRITE_MACHINE_WORK: &[MachineWork] = &[
    MachineWork {
        row: copybw::rows::BAR[0],
        made_of: &[copybw::rows::RAW[0]],
    },
    MachineWork {
        row: copybw::rows::BAR[1],
        made_of: &[copybw::rows::RAW[1]],
    },
    MachineWork {
        row: copybw::rows::BAR[2],
        made_of: &[copybw::rows::RAW[2]],
    },
    MachineWork {
        row: copybw::rows::BAR[3],
        made_of: &[copybw::rows::RAW[3]],
    },
];

/// `copylat`: a write through the BAR, with and without the read that confirms it, beside the
/// same as plain stores and a plain read.
const COPYLAT_MACHINE_WORK: &[MachineWork] = &[
    MachineWork {
        row: copylat::rows::BAR_WRITE,
        made_of: &[copylat::rows::RAW_WRITE],
    },
    MachineWork {
        row: copylat::rows::BAR_WRITE_READBACK,
        made_of: &[copylat::rows::RAW_WRITE_READBACK],
    },
];

/// `fastpath-small`: a 64-byte `Block::write` or `RawMemory::write` is a 64-byte store and
/// `sfence` with the library's checks around it; the raw store row times the store and fence
/// alone, beside them (it is the copy kernel's, which `copylat`'s raw rows judge in turn).
const FASTPATH_SMALL_MACHINE_WORK: &[MachineWork] = &[
    MachineWork {
        row: fastpath::rows::BLOCK_WRITE,
        made_of: &[fastpath::rows::RAW_STORE],
    },
    MachineWork {
        row: fastpath::rows::RAW_MEMORY_WRITE,
        made_of: &[fastpath::rows::RAW_STORE],
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::published::{measured_by_code, newer_than_published, published};
    use vkgdr_lab::bench::registry::report_spec;
    use vkgdr_lab::bench::report::model::Unit;

    #[test]
    fn machine_work_names_machine_rows_the_benchmarks_measure() {
        // Every report named here is registered and in the last full run; every library row
        // with machine work (driver calls, raw BAR copies) is a method of it, and every row it
        // is made of is a machine row of it or of the benchmark's code (a raw row newer than the
        // published run); the library's rows are not machine rows.
        let published = published();
        let mut checked = 0;
        for (name, work) in BY_REPORT {
            let spec = report_spec(name).unwrap_or_else(|| panic!("{name}: no such report"));
            let report = published
                .iter()
                .find(|r| r.name == name)
                .unwrap_or_else(|| panic!("{name} is missing from docs/bench/results.json"));
            let published = report.methods();
            let code = measured_by_code(name);
            // The code's list is the code's: it names every published method.
            if !code.is_empty() {
                for m in &published {
                    assert!(code.iter().any(|c| c == m), "{name}: {m:?}");
                }
            }
            let methods: Vec<&str> = published
                .iter()
                .copied()
                .chain(code.iter().map(String::as_str))
                .chain(newer_than_published(name).iter().copied())
                .collect();
            for w in work {
                assert!(published.contains(&w.row), "{name}: no row {:?}", w.row);
                assert!(
                    !spec.is_machine(w.row),
                    "{name}: {:?} is a machine row",
                    w.row
                );
                for p in w.made_of {
                    assert!(
                        methods.iter().any(|m| m == p && spec.is_machine(m)),
                        "{name}: no machine row {p:?}"
                    );
                }
                // Rates do not add up: a rate's machine work is one row.
                if report.unit == Unit::GigabytesPerSecond {
                    assert_eq!(w.made_of.len(), 1, "{name}: {:?}", w.row);
                }
                assert_eq!(machine_work_of(name, w.row), Some(w));
                checked += 1;
            }
        }
        assert!(checked >= 35, "only {checked} machine-work entries checked");
        assert_eq!(machine_work_of("copybw-read", copybw::rows::BAR[0]), None);
    }
}

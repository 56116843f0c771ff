//! The benchmarks of `vkgdr bench` ([`BENCHMARKS`]): each one's name, its line of help, the
//! function that runs it and the reports it writes; what the registry says about a report (its
//! title, [`Report::title`], and its table layout, [`Report::layout`]); and which benchmarks a
//! command selects ([`Which`]).

use super::error::BenchResult;
use super::options::Options;
use super::raw_steps::{ALLOC_STEPS, FREE_STEPS};
use super::report::model::Report;
use super::report::spec::{Anchor, DriverWork, Layout, ReportSpec};
use super::{apiperf, arena, copybw, copylat, fastpath, pplat, ring, waits};

/// What a benchmark runs: its reports, or the error that stopped it.
pub type BenchFn = fn(&Options) -> BenchResult<Vec<Report>>;

/// One benchmark of `vkgdr bench`: its command-line name, a line of help, the function that runs
/// it and every report it writes (their titles and table layouts live here, beside the
/// benchmark, so no report falls back to the foreign-CSV path).
#[derive(Debug, Clone, Copy)]
pub struct Benchmark {
    /// The name on the command line (`vkgdr bench NAME`).
    pub name: &'static str,
    /// One line for `vkgdr bench --help`.
    pub help: &'static str,
    /// Runs it.
    pub run: BenchFn,
    /// The reports it writes, by file stem.
    pub reports: &'static [ReportSpec],
}

/// The `waits` reports' rows that call the driver directly (the others are the library's calls).
const DRIVER_CALLS: &[&str] = &["cu*", "vk*", "legacy-stream completion word arrives"];

/// `apiperf`: a raw allocation of whole chunks (2 MiB and up; smaller ones are carved and have no
/// step rows at their size, so they stand alone) and a pool chunk are the `step:` rows' driver
/// calls, and so are their frees.
const APIPERF_DRIVER_WORK: &[DriverWork] = &[
    DriverWork {
        rows: "RawMemory alloc",
        made_of: &ALLOC_STEPS,
    },
    DriverWork {
        rows: "RawMemory free",
        made_of: &FREE_STEPS,
    },
    DriverWork {
        rows: "pool chunk alloc*",
        made_of: &ALLOC_STEPS,
    },
    DriverWork {
        rows: "pool chunk free*",
        made_of: &FREE_STEPS,
    },
];

/// The `waits` reports' driver calls that make one chunk of device memory (a Vulkan allocation
/// exported, imported, reserved, mapped).
const WAITS_CHUNK_ALLOC: &[&str] = &[
    "vkAllocateMemory + vkMapMemory",
    "vkGetMemoryFdKHR",
    "cuMemImportFromShareableHandle",
    "cuMemAddressReserve",
    "cuMemMap",
    "cuMemSetAccess",
];

/// The `waits` reports' driver calls that give such a chunk back.
const WAITS_CHUNK_FREE: &[&str] = &[
    "cuMemUnmap",
    "cuMemRelease",
    "cuMemAddressFree",
    "vkUnmapMemory + vkFreeMemory",
];

/// The library calls of `waits` that make something (memory, a module, a stream) and are mostly
/// the driver calls beside them.
const WAITS_ALLOC_WORK: [DriverWork; 9] = [
    DriverWork {
        rows: "Gpu::alloc",
        made_of: WAITS_CHUNK_ALLOC,
    },
    DriverWork {
        rows: "Pool::alloc 256 B (first chunk)",
        made_of: WAITS_CHUNK_ALLOC,
    },
    DriverWork {
        rows: "Pool::alloc 16 MiB (own chunk)",
        made_of: WAITS_CHUNK_ALLOC,
    },
    DriverWork {
        rows: "Arena::grow",
        made_of: &[
            "vkAllocateMemory + vkMapMemory",
            "vkGetMemoryFdKHR",
            "cuMemImportFromShareableHandle",
            "cuMemMap",
            "cuMemSetAccess",
        ],
    },
    DriverWork {
        rows: "DeviceRing::new*",
        made_of: WAITS_CHUNK_ALLOC,
    },
    DriverWork {
        rows: "PinnedBuffer::new*",
        made_of: &[
            "vkAllocateMemory (host memory)",
            "vkGetMemoryFdKHR (host memory)",
            "cuMemImportFromShareableHandle (host memory)",
            "cuMemMap (host memory)",
            "cuMemSetAccess (host memory)",
        ],
    },
    DriverWork {
        rows: "Module::load_ptx",
        made_of: &["cuModuleLoadData"],
    },
    DriverWork {
        rows: "Stream::new",
        made_of: &["cuStreamCreate"],
    },
    DriverWork {
        rows: "Gpu::memcpy_htod 64 KiB",
        made_of: &["cuMemcpyHtoD_v2 (64 KiB pageable)"],
    },
];

/// The drops and releases of `waits` that give chunks back to the driver there and then (with no
/// kernel running, or one on its own stream; on the legacy stream the library defers them).
const WAITS_FREE_WORK: [DriverWork; 8] = [
    DriverWork {
        rows: "RawMemory drop",
        made_of: WAITS_CHUNK_FREE,
    },
    DriverWork {
        rows: "Block drop (own chunk)",
        made_of: WAITS_CHUNK_FREE,
    },
    DriverWork {
        rows: "Pool::trim",
        made_of: WAITS_CHUNK_FREE,
    },
    DriverWork {
        rows: "Arena::shrink",
        made_of: &["cuMemUnmap", "cuMemRelease", "vkUnmapMemory + vkFreeMemory"],
    },
    DriverWork {
        rows: "DeviceRing drop",
        made_of: WAITS_CHUNK_FREE,
    },
    DriverWork {
        rows: "PinnedBuffer drop",
        made_of: &[
            "cuMemUnmap (host memory)",
            "cuMemRelease (host memory)",
            "vkFreeMemory (host memory)",
        ],
    },
    DriverWork {
        rows: "Module drop",
        made_of: &["cuModuleUnload"],
    },
    DriverWork {
        rows: "Stream drop",
        made_of: &["cuStreamDestroy_v2"],
    },
];

/// `waits-idle` and `waits-own-stream`: allocations and frees.
const WAITS_DRIVER_WORK: &[DriverWork] = &{
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
const WAITS_LEGACY_DRIVER_WORK: &[DriverWork] = &WAITS_ALLOC_WORK;

/// The benchmarks, in the order `all` runs them: `apiperf` first so that its "first
/// `Gpu::open`" really is the first in the process.
pub const BENCHMARKS: [Benchmark; 8] = [
    Benchmark {
        name: "apiperf",
        help: "cost of open, alloc/free, pool alloc/free, flush/invalidate",
        run: apiperf::run,
        reports: &[ReportSpec {
            name: "apiperf",
            title: "API call cost",
            layout: Layout::Long,
            anchor: Anchor::Pairs(&[
                ("RawMemory alloc", "cuMemAlloc"),
                ("RawMemory free", "cuMemFree"),
            ]),
            machine: &["cuMemAlloc", "cuMemFree", "step: *"],
            driver_work: APIPERF_DRIVER_WORK,
        }],
    },
    Benchmark {
        name: "copybw",
        help: "bandwidth vs size: BAR writes/reads (1-8 threads) vs cuMemcpy",
        run: copybw::run,
        reports: &[
            ReportSpec {
                name: "copybw-write",
                title: "Write bandwidth, host to GPU memory",
                layout: Layout::Wide,
                anchor: Anchor::Method("HtoD pinned"),
                machine: &["HtoD pinned", "HtoD pageable"],
                driver_work: &[],
            },
            ReportSpec {
                name: "copybw-read",
                title: "Read bandwidth, GPU memory to host",
                layout: Layout::Wide,
                anchor: Anchor::Method("DtoH pinned"),
                machine: &["DtoH pinned", "DtoH pageable"],
                driver_work: &[],
            },
        ],
    },
    Benchmark {
        name: "copylat",
        help: "write latency vs size: BAR write, confirmed write, cuMemcpy",
        run: copylat::run,
        reports: &[ReportSpec {
            name: "copylat",
            title: "Write latency, host to GPU memory",
            layout: Layout::Wide,
            anchor: Anchor::Method("cuMemcpyHtoD"),
            machine: &["cuMemcpyHtoD", "HtoDAsync+sync"],
            driver_work: &[],
        }],
    },
    Benchmark {
        name: "fastpath",
        help: "the default API's writes, reads and pool cache beside this machine's limits",
        run: fastpath::run,
        reports: &[
            ReportSpec {
                name: "fastpath-write",
                title: "Large writes: RawMemory::write (default API) versus explicit pools and DMA",
                layout: Layout::Long,
                anchor: Anchor::Method("cuMemcpyHtoD pinned (DMA limit)"),
                machine: &["cuMemcpyHtoD pinned (DMA limit)"],
                driver_work: &[],
            },
            ReportSpec {
                name: "fastpath-read",
                title: "Large reads into pageable memory: Mapping::read versus cuMemcpyDtoH",
                layout: Layout::Long,
                anchor: Anchor::Method("cuMemcpyDtoH pinned (DMA limit)"),
                machine: &[
                    "cuMemcpyDtoH pinned (DMA limit)",
                    "cuMemcpyDtoH pageable",
                    "cuMemHostRegister + DtoH + unregister",
                ],
                driver_work: &[],
            },
            ReportSpec {
                name: "fastpath-small",
                title: "Small writes: first write, Block::write, WriteBatch versus the raw store",
                layout: Layout::Long,
                anchor: Anchor::Pairs(&[
                    (
                        "first write in a process (fresh child)",
                        "second write, same process",
                    ),
                    (
                        "Block::write (default API)",
                        "raw store + sfence, same block (limit)",
                    ),
                    (
                        "RawMemory::write (default API)",
                        "raw store + sfence, same block (limit)",
                    ),
                    ("16 blocks: one WriteBatch", "16 blocks: Block::write each"),
                ]),
                machine: &["raw store + sfence, same block (limit)"],
                driver_work: &[],
            },
            ReportSpec {
                name: "fastpath-pool",
                title: "Pool alloc+free with the default thread cache and without",
                layout: Layout::Long,
                anchor: Anchor::Pairs(&[
                    (
                        "alloc+free, 1 thread, default PoolConfig",
                        "alloc+free, 1 thread, thread_cache = 0 (opt-out)",
                    ),
                    (
                        "alloc+free, 8 threads, per pair, default PoolConfig",
                        "alloc+free, 8 threads, per pair, thread_cache = 0 (opt-out)",
                    ),
                ]),
                machine: &[],
                driver_work: &[],
            },
        ],
    },
    Benchmark {
        name: "pplat",
        help: "round trips between the CPU and a running kernel",
        run: pplat::run,
        reports: &[ReportSpec {
            name: "pplat",
            title: "Round trip: CPU writes, running kernel answers in pinned memory",
            layout: Layout::Wide,
            anchor: Anchor::Method("HtoDAsync+sync"),
            machine: &["HtoDAsync+sync"],
            driver_work: &[],
        }],
    },
    Benchmark {
        name: "ring",
        help: "records from 1/4/8 producer threads into a resident kernel vs cuMemcpyHtoDAsync",
        run: ring::run,
        reports: &[
            ReportSpec {
                name: "ring-throughput",
                title: "Ring throughput: producer threads into a resident kernel",
                layout: Layout::Wide,
                anchor: Anchor::Method("cuMemcpyHtoDAsync, 256 per copy"),
                machine: &["cuMemcpyHtoDAsync*"],
                driver_work: &[],
            },
            ReportSpec {
                name: "ring-latency",
                title: "Ring round trip: one record to a resident kernel and back",
                layout: Layout::Long,
                anchor: Anchor::Method("cuMemcpyHtoDAsync + sync"),
                machine: &["cuMemcpyHtoDAsync + sync"],
                driver_work: &[],
            },
            ReportSpec {
                name: "ring-wrap",
                title: "Ring throughput: padded versus mirrored wrap",
                layout: Layout::Wide,
                anchor: Anchor::Pairs(&[(
                    "mirrored ring (records run over the end)",
                    "padded ring (wrap PAD at the end)",
                )]),
                machine: &[],
                driver_work: &[],
            },
        ],
    },
    Benchmark {
        name: "arena",
        help: "growing a VMM arena vs separate chunks; a kernel reading 1 GiB of each",
        run: arena::run,
        reports: &[
            ReportSpec {
                name: "arena-grow",
                title: "Arena growth by one chunk versus a separate chunk",
                layout: Layout::Wide,
                anchor: Anchor::Pairs(&[
                    ("arena grow by one chunk", "separate chunk alloc"),
                    ("arena shrink by one chunk", "separate chunk free"),
                ]),
                machine: &[],
                // Not anchored on `apiperf`'s steps: measured at another point of the run, these
                // rows stayed put on a machine where the steps moved by 1.37×.
                driver_work: &[],
            },
            ReportSpec {
                name: "arena-read",
                title: "Kernel reads: one contiguous arena versus separate chunks",
                layout: Layout::Long,
                anchor: Anchor::Pairs(&[(
                    "one kernel over the arena",
                    "* kernels over separate chunks",
                )]),
                machine: &[],
                driver_work: &[],
            },
        ],
    },
    Benchmark {
        name: "waits",
        help: "which driver and library calls wait for a running kernel",
        run: waits::run,
        reports: &[
            ReportSpec {
                name: "waits-idle",
                title: "Calls with no kernel running",
                layout: Layout::Long,
                anchor: Anchor::None,
                machine: DRIVER_CALLS,
                driver_work: WAITS_DRIVER_WORK,
            },
            ReportSpec {
                name: "waits-own-stream",
                title: "Calls while a persistent kernel runs on a non-blocking stream",
                layout: Layout::Long,
                anchor: Anchor::SameMethodIn("waits-idle"),
                machine: DRIVER_CALLS,
                driver_work: WAITS_DRIVER_WORK,
            },
            ReportSpec {
                name: "waits-legacy-stream",
                title: "Calls while a persistent kernel runs on the legacy default stream",
                layout: Layout::Long,
                anchor: Anchor::SameMethodIn("waits-idle"),
                machine: DRIVER_CALLS,
                driver_work: WAITS_LEGACY_DRIVER_WORK,
            },
        ],
    },
];

/// The registered benchmark called `name`.
pub fn benchmark(name: &str) -> Option<&'static Benchmark> {
    BENCHMARKS.iter().find(|b| b.name == name)
}

/// The registered report whose file stem is `name` (`None` for foreign CSVs).
pub fn report_spec(name: &str) -> Option<&'static ReportSpec> {
    BENCHMARKS
        .iter()
        .flat_map(|b| b.reports)
        .find(|r| r.name == name)
}

// Beside the registry rather than the report model: every benchmark builds reports, and only
// the registry, which names the benchmarks, knows their titles.
impl Report {
    /// Human title: the registry's, or the name itself for a report no benchmark registers (a
    /// foreign CSV given to `vkgdr bench plot`).
    pub fn title(&self) -> String {
        report_spec(&self.name).map_or_else(|| self.name.clone(), |k| k.title.to_string())
    }

    /// Table layout: the registry's, or [`Layout::Long`] for a foreign report.
    pub fn layout(&self) -> Layout {
        report_spec(&self.name).map_or(Layout::Long, |k| k.layout)
    }
}

/// Which benchmark(s) to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The registered benchmark of this name (see [`BENCHMARKS`]).
    One(&'static str),
    /// Every registered benchmark in registry order, then `summary.md`.
    All,
}

impl Which {
    /// The benchmark called `s`, or `all`.
    pub fn parse(s: &str) -> Option<Which> {
        if s == "all" {
            return Some(Which::All);
        }
        benchmark(s).map(|b| Which::One(b.name))
    }

    /// The benchmarks to run, in registry order.
    pub fn selected(self) -> Vec<&'static Benchmark> {
        BENCHMARKS
            .iter()
            .filter(|b| match self {
                Which::All => true,
                Which::One(name) => b.name == name,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::bench::report::csv::read_csv;
    use crate::bench::report::spec::method_matches;

    #[test]
    fn every_benchmark_and_report_is_registered_once() {
        let mut names: Vec<&str> = BENCHMARKS.iter().map(|b| b.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), BENCHMARKS.len(), "duplicate benchmark name");
        let mut reports: Vec<&str> = BENCHMARKS
            .iter()
            .flat_map(|b| b.reports.iter().map(|r| r.name))
            .collect();
        let n = reports.len();
        reports.sort_unstable();
        reports.dedup();
        assert_eq!(reports.len(), n, "two benchmarks claim one report");
        for b in &BENCHMARKS {
            assert!(!b.reports.is_empty(), "{} writes no report", b.name);
            assert_eq!(Which::parse(b.name), Some(Which::One(b.name)));
            let one: Vec<&str> = Which::One(b.name)
                .selected()
                .iter()
                .map(|s| s.name)
                .collect();
            assert_eq!(one, [b.name]);
        }
    }

    #[test]
    fn all_runs_the_registry_in_order_with_apiperf_first() {
        let all: Vec<&str> = Which::All.selected().iter().map(|b| b.name).collect();
        let registry: Vec<&str> = BENCHMARKS.iter().map(|b| b.name).collect();
        assert_eq!(all, registry);
        assert_eq!(all[0], "apiperf", "apiperf must see a cold process");
    }

    #[test]
    fn the_published_results_are_all_registered_reports() {
        // docs/bench holds the CSVs of the last full run: each must be one of our reports, shown
        // with its registered title and layout, not as a foreign CSV.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bench");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|x| x != "csv") {
                continue;
            }
            let report = read_csv(&path).unwrap();
            assert_eq!(
                path.file_stem().unwrap().to_str(),
                Some(report.name.as_str())
            );
            let spec = report_spec(&report.name)
                .unwrap_or_else(|| panic!("{} is no registered report", path.display()));
            assert_eq!(report.title(), spec.title);
            assert_eq!(report.layout(), spec.layout);
            seen += 1;
        }
        assert!(seen >= 10, "only {seen} CSVs in {}", dir.display());
    }

    #[test]
    fn driver_work_names_machine_rows_the_benchmarks_measure() {
        // Every library row with driver work, and every row it is made of, is a method of the
        // published results; the rows it is made of are machine rows, the library's are not.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bench");
        let mut checked = 0;
        for spec in BENCHMARKS.iter().flat_map(|b| b.reports) {
            let Ok(report) = read_csv(&dir.join(format!("{}.csv", spec.name))) else {
                continue;
            };
            let methods = report.methods();
            for w in spec.driver_work {
                let rows: Vec<&str> = methods
                    .iter()
                    .copied()
                    .filter(|m| method_matches(w.rows, m))
                    .collect();
                assert!(
                    !rows.is_empty(),
                    "{}: no method matches {:?}",
                    spec.name,
                    w.rows
                );
                assert!(rows.iter().all(|m| !spec.is_machine(m)), "{}", spec.name);
                for p in w.made_of {
                    assert!(
                        methods
                            .iter()
                            .any(|m| method_matches(p, m) && spec.is_machine(m)),
                        "{}: no machine row matches {p:?}",
                        spec.name
                    );
                }
                checked += 1;
            }
        }
        assert!(checked >= 25, "only {checked} driver-work entries checked");
    }

    #[test]
    fn anchors_name_methods_the_benchmarks_measure() {
        // Every anchor pattern matches a method of the published results (where the report is
        // among them), so no figure loses its anchor to a typo.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bench");
        let mut checked = 0;
        for spec in BENCHMARKS.iter().flat_map(|b| b.reports) {
            let path = dir.join(format!("{}.csv", spec.name));
            let Ok(report) = read_csv(&path) else {
                continue;
            };
            let methods = report.methods();
            let patterns: Vec<&str> = match spec.anchor {
                Anchor::None | Anchor::SameMethodIn(_) => continue,
                Anchor::Method(m) => vec![m],
                Anchor::Pairs(p) => p.iter().flat_map(|&(a, b)| [a, b]).collect(),
            };
            for p in patterns {
                assert!(
                    methods.iter().any(|m| method_matches(p, m)),
                    "{}: no method matches {p:?} (methods: {methods:?})",
                    spec.name
                );
            }
            checked += 1;
        }
        assert!(checked >= 10, "only {checked} reports checked");
    }
}

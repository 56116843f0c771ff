//! The benchmarks of `vkgdr bench` ([`BENCHMARKS`]): each one's name, its line of help, the
//! function that runs it and the reports it writes; what the registry says about a report (its
//! title, [`Report::title`], and its table layout, [`Report::layout`]); and which benchmarks a
//! command selects ([`Which`]).
//!
//! The registry names rows only by the constants their benchmark writes them with (each
//! benchmark's `rows`), so renaming a row is a compile error here, not a silent miss.

use super::error::BenchResult;
use super::options::Options;
use super::raw_steps::{ALLOC_STEPS, FREE_STEPS};
use super::report::model::{Anchored, Origin, Report};
use super::report::spec::{Anchor, Layout, ReportSpec, Rows};
use super::tail::rows as tail;
use super::waits::driver_calls::rows as drv;
use super::{apiperf, arena, copybw, copylat, d2h, fastpath, pplat, ring, waits, xproc};

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
    /// Whether `all` runs it (a benchmark that starts other processes is run by name only).
    pub in_all: bool,
}

/// The `waits` reports' rows that call the driver directly (the others are the library's calls):
/// the CUDA and Vulkan APIs' calls, by their prefixes, and the wait for the legacy stream's word.
const DRIVER_CALLS: &[Rows] = &[
    Rows::StartingWith("cu"),
    Rows::StartingWith("vk"),
    Rows::Is(drv::COMPLETION_WORD),
];

/// The `tail` reports' anchors: each loaded row with its own kernel's idle row.
const TAIL_ANCHOR: Anchor = Anchor::Pairs(&[
    (Rows::StartingWith(tail::ACK), Rows::Is(tail::ACK_IDLE)),
    (
        Rows::StartingWith(tail::LOADING_ACK),
        Rows::Is(tail::LOADING_ACK_IDLE),
    ),
    (
        Rows::StartingWith(tail::CHECKING),
        Rows::Is(tail::CHECKING_IDLE),
    ),
]);

/// The benchmarks, in the order `all` runs them (those it runs: [`Benchmark::in_all`]): `apiperf`
/// first so that its "first `Gpu::open`" really is the first in the process.
pub const BENCHMARKS: [Benchmark; 11] = [
    Benchmark {
        name: "apiperf",
        help: "cost of open, alloc/free, pool alloc/free, flush/invalidate",
        run: apiperf::run,
        reports: &[ReportSpec {
            name: "apiperf",
            title: "API call cost",
            layout: Layout::Long,
            anchor: Anchor::Pairs(&[
                (
                    Rows::Is(apiperf::rows::RAW_ALLOC),
                    Rows::Is(apiperf::rows::CU_MEM_ALLOC),
                ),
                (
                    Rows::Is(apiperf::rows::RAW_FREE),
                    Rows::Is(apiperf::rows::CU_MEM_FREE),
                ),
            ]),
            machine: &[
                Rows::Is(apiperf::rows::CU_MEM_ALLOC),
                Rows::Is(apiperf::rows::CU_MEM_FREE),
                Rows::Is(apiperf::rows::MALLOC_PAIR),
                Rows::AnyOf(&ALLOC_STEPS),
                Rows::AnyOf(&FREE_STEPS),
            ],
        }],
        in_all: true,
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
                anchor: Anchor::Method(copybw::rows::HTOD_PINNED),
                machine: &[
                    Rows::Is(copybw::rows::HTOD_PINNED),
                    Rows::Is(copybw::rows::HTOD_PAGEABLE),
                    Rows::AnyOf(&copybw::rows::RAW),
                ],
            },
            ReportSpec {
                name: "copybw-read",
                title: "Read bandwidth, GPU memory to host",
                layout: Layout::Wide,
                anchor: Anchor::Method(copybw::rows::DTOH_PINNED),
                // `DtoH+memcpy` is a driver copy and a `memcpy` between host buffers: no code
                // of this library.
                machine: &[
                    Rows::Is(copybw::rows::DTOH_PINNED),
                    Rows::Is(copybw::rows::DTOH_PAGEABLE),
                    Rows::Is(copybw::rows::DMA_READ),
                    Rows::Is(copybw::rows::RAW[0]),
                    Rows::Is(copybw::rows::RAW[3]),
                ],
            },
        ],
        in_all: true,
    },
    Benchmark {
        name: "copylat",
        help: "write latency vs size: BAR write, confirmed write, cuMemcpy",
        run: copylat::run,
        reports: &[ReportSpec {
            name: "copylat",
            title: "Write latency, host to GPU memory",
            layout: Layout::Wide,
            anchor: Anchor::Method(copylat::rows::CU_MEMCPY_HTOD),
            machine: &[
                Rows::Is(copylat::rows::CU_MEMCPY_HTOD),
                Rows::Is(copylat::rows::HTOD_ASYNC_SYNC),
                Rows::Is(copylat::rows::RAW_WRITE),
                Rows::Is(copylat::rows::RAW_WRITE_READBACK),
            ],
        }],
        in_all: true,
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
                anchor: Anchor::Method(fastpath::rows::HTOD_PINNED),
                machine: &[Rows::Is(fastpath::rows::HTOD_PINNED)],
            },
            ReportSpec {
                name: "fastpath-read",
                title: "Large reads into pageable memory: Mapping::read versus cuMemcpyDtoH",
                layout: Layout::Long,
                anchor: Anchor::Method(fastpath::rows::DTOH_PINNED),
                machine: &[Rows::AnyOf(&[
                    fastpath::rows::DTOH_PINNED,
                    fastpath::rows::DTOH_PAGEABLE,
                    fastpath::rows::DTOH_REGISTERED,
                ])],
            },
            ReportSpec {
                name: "fastpath-small",
                title: "Small writes: first write, Block::write, WriteBatch versus the raw store",
                layout: Layout::Long,
                anchor: Anchor::Pairs(&[
                    (
                        Rows::Is(fastpath::rows::FIRST_WRITE),
                        Rows::Is(fastpath::rows::SECOND_WRITE),
                    ),
                    (
                        Rows::Is(fastpath::rows::BLOCK_WRITE),
                        Rows::Is(fastpath::rows::RAW_STORE),
                    ),
                    (
                        Rows::Is(fastpath::rows::RAW_MEMORY_WRITE),
                        Rows::Is(fastpath::rows::RAW_STORE),
                    ),
                    (
                        Rows::Is(fastpath::rows::BLOCKS_BATCH),
                        Rows::Is(fastpath::rows::BLOCKS_EACH),
                    ),
                ]),
                machine: &[Rows::Is(fastpath::rows::RAW_STORE)],
            },
            ReportSpec {
                name: "fastpath-pool",
                title: "Pool alloc+free with the default thread cache and without",
                layout: Layout::Long,
                anchor: Anchor::Pairs(&[
                    (
                        Rows::Is(fastpath::rows::POOL_1_DEFAULT),
                        Rows::Is(fastpath::rows::POOL_1_NO_CACHE),
                    ),
                    (
                        Rows::Is(fastpath::rows::POOL_8_DEFAULT),
                        Rows::Is(fastpath::rows::POOL_8_NO_CACHE),
                    ),
                    (
                        Rows::Is(fastpath::rows::POOL_16_DEFAULT),
                        Rows::Is(fastpath::rows::POOL_16_NO_CACHE),
                    ),
                ]),
                machine: &[
                    Rows::Is(fastpath::rows::MALLOC_PAIR),
                    Rows::Is(fastpath::rows::MALLOC_PAIR_8),
                    Rows::Is(fastpath::rows::MALLOC_PAIR_16),
                ],
            },
        ],
        in_all: true,
    },
    Benchmark {
        name: "pplat",
        help: "round trips between the CPU and a running kernel",
        run: pplat::run,
        reports: &[ReportSpec {
            name: "pplat",
            title: "Round trip: CPU writes, running kernel answers in pinned memory",
            layout: Layout::Wide,
            anchor: Anchor::Method(pplat::HTOD_ASYNC_SYNC),
            machine: &[Rows::Is(pplat::HTOD_ASYNC_SYNC)],
        }],
        in_all: true,
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
                anchor: Anchor::Method(ring::rows::COPY_256),
                machine: &[
                    Rows::AnyOf(&ring::rows::DRIVER_COPIES),
                    Rows::AnyOf(&ring::rows::LINK),
                ],
            },
            ReportSpec {
                name: "ring-latency",
                title: "Ring round trip: one record to a resident kernel and back",
                layout: Layout::Long,
                anchor: Anchor::Method(ring::rows::COPY_SYNC),
                machine: &[
                    Rows::Is(ring::rows::COPY_SYNC),
                    Rows::Is(ring::rows::MEMCPY_COPY_SYNC),
                ],
            },
            ReportSpec {
                name: "ring-wrap",
                title: "Ring throughput: padded versus mirrored wrap",
                layout: Layout::Wide,
                anchor: Anchor::Pairs(&[(
                    Rows::Is(ring::rows::MIRRORED),
                    Rows::Is(ring::rows::PADDED),
                )]),
                machine: &[],
            },
        ],
        in_all: true,
    },
    Benchmark {
        name: "tail",
        help: "a lone record's round trip (median, p99, p99.9), the other lanes idle or streaming",
        run: super::tail::run,
        reports: &[
            ReportSpec {
                name: super::tail::REPORTS[0],
                title: "A lone record's round trip beside streaming lanes: median",
                layout: Layout::Long,
                anchor: TAIL_ANCHOR,
                machine: &[],
            },
            ReportSpec {
                name: super::tail::REPORTS[1],
                title: "A lone record's round trip beside streaming lanes: 99th percentile",
                layout: Layout::Long,
                anchor: TAIL_ANCHOR,
                machine: &[],
            },
            ReportSpec {
                name: super::tail::REPORTS[2],
                title: "A lone record's round trip beside streaming lanes: 99.9th percentile",
                layout: Layout::Long,
                anchor: TAIL_ANCHOR,
                machine: &[],
            },
            ReportSpec {
                name: super::tail::REPORTS[3],
                title: "What the other lanes streamed during the lone record's round trips",
                layout: Layout::Long,
                anchor: Anchor::None,
                machine: &[],
            },
        ],
        in_all: true,
    },
    Benchmark {
        name: "d2h",
        help:
            "records from a kernel to CPU threads through device-to-host rings vs cuMemcpyDtoHAsync",
        run: d2h::run,
        reports: &[
            ReportSpec {
                name: "d2h-throughput",
                title: "Device-to-host ring throughput: a kernel's records to CPU consumer threads",
                layout: Layout::Wide,
                anchor: Anchor::Method(d2h::rows::DTOH_256),
                machine: &[Rows::Is(d2h::rows::DTOH_256)],
            },
            ReportSpec {
                name: "d2h-latency",
                title: "Device-to-host latency: a lone record versus a kernel's write and a wait",
                layout: Layout::Long,
                anchor: Anchor::Pairs(&[
                    (
                        Rows::Is(d2h::rows::LAUNCH_LONE),
                        Rows::Is(d2h::rows::WRITE_EVENT),
                    ),
                    (Rows::Is(d2h::rows::PING), Rows::Is(d2h::rows::PONG_WORD)),
                    (
                        Rows::Is(d2h::rows::PING_TAGGED),
                        Rows::Is(d2h::rows::PONG_WORD),
                    ),
                ]),
                machine: &[
                    Rows::Is(d2h::rows::PONG_WORD),
                    Rows::Is(d2h::rows::WRITE_SYNC),
                    Rows::Is(d2h::rows::WRITE_EVENT),
                ],
            },
        ],
        in_all: true,
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
                    (
                        Rows::Is(arena::rows::GROW),
                        Rows::Is(arena::rows::SEPARATE_ALLOC),
                    ),
                    (
                        Rows::Is(arena::rows::SHRINK),
                        Rows::Is(arena::rows::SEPARATE_FREE),
                    ),
                ]),
                machine: &[],
            },
            ReportSpec {
                name: "arena-read",
                title: "Kernel reads: one contiguous arena versus separate chunks",
                layout: Layout::Long,
                anchor: Anchor::Pairs(&[(
                    Rows::Is(arena::rows::ONE_KERNEL),
                    Rows::EndingWith(arena::rows::KERNELS_OVER_CHUNKS),
                )]),
                machine: &[],
            },
        ],
        in_all: true,
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
            },
            ReportSpec {
                name: "waits-own-stream",
                title: "Calls while a persistent kernel runs on a non-blocking stream",
                layout: Layout::Long,
                anchor: Anchor::SameMethodIn("waits-idle"),
                machine: DRIVER_CALLS,
            },
            ReportSpec {
                name: "waits-legacy-stream",
                title: "Calls while a persistent kernel runs on the legacy default stream",
                layout: Layout::Long,
                anchor: Anchor::SameMethodIn("waits-idle"),
                machine: DRIVER_CALLS,
            },
        ],
        in_all: true,
    },
    Benchmark {
        name: "xproc",
        help: "other processes writing GPU memory: ring lanes, attach, vs CUDA IPC and a shm queue",
        run: xproc::run,
        reports: &[
            ReportSpec {
                name: "xproc-throughput",
                title: "Ring throughput: producer processes versus threads",
                layout: Layout::Wide,
                anchor: Anchor::Pairs(&[
                    (Rows::Is(xproc::T_PROCESSES), Rows::Is(xproc::T_THREADS)),
                    (Rows::Is(xproc::T_SHM), Rows::Is(xproc::T_PROCESSES)),
                ]),
                machine: &[Rows::Is(xproc::T_SHM)],
            },
            ReportSpec {
                name: "xproc-latency",
                title: "Round trips and small writes from another process",
                layout: Layout::Long,
                anchor: Anchor::Pairs(&[
                    (Rows::Is(xproc::L_PROCESS), Rows::Is(xproc::L_THREAD)),
                    (Rows::Is(xproc::L_SHM), Rows::Is(xproc::L_PROCESS)),
                    (Rows::Is(xproc::U_ATTACHED), Rows::Is(xproc::U_IPC)),
                ]),
                machine: &[Rows::Is(xproc::L_SHM), Rows::Is(xproc::U_IPC)],
            },
            ReportSpec {
                name: "xproc-attach",
                title: "Attaching from another process: Vulkan versus CUDA IPC",
                layout: Layout::Long,
                anchor: Anchor::Pairs(&[
                    (Rows::Is(xproc::A_DEVICE), Rows::Is(xproc::A_CONTEXT)),
                    (Rows::Is(xproc::A_ATTACH), Rows::Is(xproc::A_OPEN)),
                    (Rows::Is(xproc::A_FIRST), Rows::Is(xproc::A_FIRST_IPC)),
                ]),
                machine: &[
                    Rows::Is(xproc::A_CONTEXT),
                    Rows::Is(xproc::A_OPEN),
                    Rows::Is(xproc::A_FIRST_IPC),
                ],
            },
            ReportSpec {
                name: "xproc-memory",
                title: "GPU memory of an attached process: Vulkan versus CUDA IPC",
                layout: Layout::Long,
                anchor: Anchor::Pairs(&[(Rows::Is(xproc::M_ATTACHED), Rows::Is(xproc::M_IPC))]),
                machine: &[Rows::Is(xproc::M_IPC)],
            },
        ],
        in_all: false,
    },
];

/// How many benchmarks `all` runs.
pub fn all_count() -> usize {
    BENCHMARKS.iter().filter(|b| b.in_all).count()
}

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

/// Gives `report` the registry's title and table layout (a report no benchmark registers keeps
/// its name as title and the long layout).
pub fn describe(report: &mut Report) {
    if let Some(spec) = report_spec(&report.name) {
        report.title = spec.title.to_string();
        report.layout = spec.layout;
    }
}

/// Titles and lays out `reports` (every report of one benchmark) as the registry says
/// ([`describe`]), marks their figures that time the machine alone
/// ([`ReportSpec::machine`]) and gives each measured figure its anchor ([`ReportSpec::anchor`]):
/// the measured figure of the same run at the same size that the anchor rule names.
pub fn resolve(reports: &mut [Report]) {
    reports.iter_mut().for_each(describe);
    for i in 0..reports.len() {
        let Some(spec) = report_spec(&reports[i].name) else {
            continue;
        };
        for j in 0..reports[i].figures.len() {
            let f = &reports[i].figures[j];
            if f.is_reference() {
                continue;
            }
            let origin = if spec.is_machine(&f.method) {
                Origin::Machine
            } else {
                Origin::Measured
            };
            let anchor = anchor_of(spec.anchor, &reports[i], j, reports);
            let f = &mut reports[i].figures[j];
            f.origin = origin;
            f.anchor = anchor;
        }
    }
}

/// The anchor of figure `j` of `report`: the measured figure that [`Anchor::of`] names, at the
/// same size, among `run`.
fn anchor_of(rule: Anchor, report: &Report, j: usize, run: &[Report]) -> Option<Anchored> {
    let f = &report.figures[j];
    let (in_report, pattern) = rule.of(&report.name, &f.method)?;
    let other = run.iter().find(|r| r.name == in_report)?;
    let a = other.figures.iter().enumerate().find(|&(k, a)| {
        !a.is_reference()
            && a.size == f.size
            && pattern.matches(&a.method)
            && !(other.name == report.name && k == j)
    })?;
    let ratio = f.median / a.1.median;
    Some(Anchored {
        report: other.name.clone(),
        method: a.1.method.clone(),
        median: a.1.median,
        ratio: ratio.is_finite().then_some(ratio),
    })
}

/// Which benchmark(s) to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The registered benchmark of this name (see [`BENCHMARKS`]).
    One(&'static str),
    /// Every registered benchmark `all` runs ([`Benchmark::in_all`]), in registry order, then
    /// `summary.md`.
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
                Which::All => b.in_all,
                Which::One(name) => b.name == name,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn each_tail_row_is_anchored_to_its_own_kernels_idle_row() {
        use crate::bench::tail::{row_name, Kernel, Load};
        let spec = report_spec(crate::bench::tail::REPORTS[1]).unwrap();
        for kernel in Kernel::ALL {
            let idle = row_name(kernel, Load::Idle);
            for load in Load::ALL {
                let row = row_name(kernel, load);
                let (report, anchor) = spec.anchor.of(spec.name, &row).unwrap();
                assert_eq!(report, spec.name);
                // The idle row matches itself, and the figure is never its own anchor.
                assert!(anchor.matches(&idle), "{row}: {anchor}");
                let others = Kernel::ALL.into_iter().filter(|&k| k != kernel);
                for other in others.map(|k| row_name(k, Load::Idle)) {
                    assert!(!anchor.matches(&other), "{row}: {anchor}");
                }
            }
        }
    }

    #[test]
    fn all_runs_the_registry_in_order_with_apiperf_first() {
        let all: Vec<&str> = Which::All.selected().iter().map(|b| b.name).collect();
        let registry: Vec<&str> = BENCHMARKS
            .iter()
            .filter(|b| b.in_all)
            .map(|b| b.name)
            .collect();
        assert_eq!(all, registry);
        assert_eq!(all[0], "apiperf", "apiperf must see a cold process");
        // The benchmark of other processes runs by name only.
        assert!(!all.contains(&"xproc"));
        assert_eq!(all.len(), all_count());
    }
}

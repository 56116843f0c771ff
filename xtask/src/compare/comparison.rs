//! A comparison ([`Comparison`]): the baseline chosen for the new run, whether the two ran on
//! the same GPU model (only then are moves judged), notes for the reader, every figure paired and
//! judged, and the summary with the exit code it calls for.

use std::path::Path;

use super::baseline::{Baseline, Choice};
use super::document::{ComparisonDocument, GpuMatch, SummaryJson, FORMAT};
use super::noise::Verdict;
use super::pairing::pair_up;
use super::results::Results;
use vkgdr_lab::json::document::About;

/// The exit code when a figure got worse beyond its noise on the same GPU model.
pub const EXIT_WORSE: u8 = 3;

/// A comparison with its text form.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// The document (`--json`, `comparison.json`).
    pub doc: ComparisonDocument,
}

impl Comparison {
    /// Compares `current` (read from `current_file`) with the baseline chosen for it;
    /// `floor_percent` is the noise floor in percent.
    pub fn new(
        baseline: &Baseline,
        current: &Results,
        current_file: &Path,
        floor_percent: u32,
    ) -> Comparison {
        let gpu = current.gpu();
        let mut notes = Vec::new();
        // Kept as given for the document: only a spread is scaled to percent.
        let floor_percent = f64::from(floor_percent);
        let (loaded, also) = match baseline.choose(gpu.as_ref()) {
            Choice::Chosen { loaded, also } => (loaded, also),
            Choice::None(why) => {
                notes.push(why);
                return Comparison {
                    doc: ComparisonDocument {
                        about: About::new(FORMAT),
                        baseline: None,
                        current: current.side(current_file),
                        gpu_match: GpuMatch::NoBaseline,
                        judged: GpuMatch::NoBaseline.judged(),
                        tolerance_percent: floor_percent,
                        notes,
                        figures: Vec::new(),
                        summary: SummaryJson::default(),
                        regressed: false,
                    },
                };
            }
        };
        if !also.is_empty() {
            let names: Vec<String> = also.iter().map(|p| p.display().to_string()).collect();
            notes.push(format!(
                "{} other baseline(s) match this GPU as well: {}",
                names.len(),
                names.join(", ")
            ));
        }
        let old = &loaded.results;
        let gpu_match = match (old.gpu(), &gpu) {
            (Some(a), Some(b)) if a.uuid.is_some() && a.uuid == b.uuid => GpuMatch::SameGpu,
            (Some(a), Some(b)) if a.name == b.name => GpuMatch::SameModel,
            (Some(a), Some(b)) => {
                notes.push(format!(
                    "different GPUs ({} before, {} now): figures shown as information only, \
                     nothing counts as a regression",
                    a.name, b.name
                ));
                GpuMatch::DifferentGpu
            }
            (a, b) => {
                let which = match (a.is_none(), b.is_none()) {
                    (true, true) => "either run",
                    (true, false) => "the baseline",
                    _ => "this run",
                };
                notes.push(format!(
                    "the GPU of {which} is unknown (no device measured, no CUDA device 0 in its \
                     machine section): figures shown as information only, nothing counts as a \
                     regression"
                ));
                GpuMatch::UnknownGpu
            }
        };
        let judged = gpu_match.judged();
        if old.mode.is_some() && current.mode.is_some() && old.mode != current.mode {
            notes.push(format!(
                "the runs' modes differ ({} before, {} now): quick runs measure fewer sizes with \
                 fewer samples",
                old.mode.as_deref().unwrap_or("?"),
                current.mode.as_deref().unwrap_or("?")
            ));
        }
        let figures = pair_up(old, current, floor_percent);
        let mut summary = SummaryJson::default();
        for f in &figures {
            match f.verdict {
                Verdict::Worse => summary.worse += 1,
                Verdict::Better => summary.better += 1,
                Verdict::WithinNoise => summary.within_noise += 1,
                Verdict::MachineMoved => summary.machine_moved += 1,
                Verdict::MovedWithDriver => summary.moved_with_driver += 1,
                Verdict::OnlyInBaseline => summary.only_in_baseline += 1,
                Verdict::OnlyInCurrent => summary.only_in_current += 1,
                Verdict::NotComparable => summary.not_comparable += 1,
            }
        }
        summary.compared = summary.worse
            + summary.better
            + summary.within_noise
            + summary.machine_moved
            + summary.moved_with_driver;
        Comparison {
            doc: ComparisonDocument {
                about: About::new(FORMAT),
                baseline: Some(old.side(&loaded.path)),
                current: current.side(current_file),
                gpu_match,
                judged,
                tolerance_percent: floor_percent,
                notes,
                figures,
                summary,
                regressed: judged && summary.worse > 0,
            },
        }
    }

    /// The exit code it calls for: [`EXIT_WORSE`] when a figure got worse beyond its noise on
    /// the same GPU model, else 0.
    pub fn exit_code(&self) -> u8 {
        if self.doc.regressed {
            EXIT_WORSE
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::compare::anchoring::machine_work;
    use crate::compare::baseline::Loaded;
    use crate::compare::noise::spread;
    use crate::compare::results::{CudaDeviceIn, CudaIn, DeviceIn, GpuJson, MachineIn};
    use crate::testutil::repo_path;
    use vkgdr_lab::bench::options::Options;
    use vkgdr_lab::bench::outputs::document;
    use vkgdr_lab::bench::report::model::{Figure, Origin, Report, Unit};
    use vkgdr_lab::bench::stats::Stats;
    use vkgdr_lab::json::bench::BenchRun;
    use vkgdr_lab::json::document::{to_text, FORMAT_VERSION};

    fn fig(method: &str, size: u64, median: f64, spread: f64) -> Figure {
        Figure {
            method: method.into(),
            size,
            median,
            p10: median * (1.0 - spread),
            p90: median * (1.0 + spread),
            samples: 100,
            origin: Origin::Measured,
            anchor: None,
        }
    }

    fn results(gpu: Option<(&str, &str)>, unit: Unit, figures: Vec<Figure>) -> Results {
        Results {
            format_version: FORMAT_VERSION,
            vkgdr_version: Some("0.1.0".into()),
            mode: Some("full".into()),
            device: None,
            machine: Some(MachineIn {
                cpu: None,
                cuda: Some(CudaIn {
                    driver_cuda_version: Some("13.0".into()),
                    devices: gpu
                        .into_iter()
                        .map(|(name, uuid)| CudaDeviceIn {
                            ordinal: 0,
                            name: name.into(),
                            uuid: Some(uuid.into()),
                        })
                        .collect(),
                }),
                nvml: None,
            }),
            benchmarks: vec![BenchRun {
                name: "b".into(),
                seconds: 1.0,
                error: None,
                reports: vec![report("r", unit, figures)],
            }],
        }
    }

    /// `new` judged against `old` with the default 10 % floor.
    fn judge(old: Results, new: &Results) -> Comparison {
        let baseline = Baseline::File(Loaded {
            path: "old".into(),
            results: old,
        });
        Comparison::new(&baseline, new, Path::new("new"), 10)
    }

    /// The figures `c` marks worse.
    fn worse_figures(
        c: &Comparison,
    ) -> impl Iterator<Item = &crate::compare::document::FigureComparisonJson> {
        c.doc.figures.iter().filter(|f| f.verdict == Verdict::Worse)
    }

    #[test]
    fn a_figure_s_own_spread_widens_its_noise() {
        assert!((spread(&fig("a", 8, 100.0, 0.3)) - 0.3).abs() < 1e-12);
        let mut one = fig("a", 8, 100.0, 0.3);
        one.samples = 1;
        assert_eq!(spread(&one), 0.0, "one sample has no spread");
        one.samples = 5;
        one.p10 = f64::NAN;
        assert_eq!(spread(&one), 0.0, "no percentiles, no spread");

        // 1.25× slower: a regression with tight samples, noise with wide ones.
        let gpu = Some(("G", "u"));
        for (spread, verdict, noise) in [
            (0.02, Verdict::Worse, 10.0),
            (0.3, Verdict::WithinNoise, 30.0),
        ] {
            let old = results(gpu, Unit::Nanoseconds, vec![fig("m", 8, 100.0, spread)]);
            let new = results(gpu, Unit::Nanoseconds, vec![fig("m", 8, 125.0, 0.01)]);
            let c = judge(old, &new);
            assert_eq!(c.doc.figures[0].verdict, verdict);
            assert!((c.doc.figures[0].tolerance_percent - noise).abs() < 1e-9);
            assert_eq!(c.doc.figures[0].ratio, Some(1.25));
        }
    }

    #[test]
    fn a_driver_figure_that_moved_is_the_machine_s_not_a_regression() {
        let gpu = Some(("G", "u"));
        // The baseline predates the origin `machine`: this run's mark is enough.
        let old = results(
            gpu,
            Unit::Nanoseconds,
            vec![
                fig("cuMemAlloc", 8, 100.0, 0.0),
                fig("RawMemory alloc", 8, 100.0, 0.0),
            ],
        );
        let mut slower_driver = fig("cuMemAlloc", 8, 160.0, 0.0);
        slower_driver.origin = Origin::Machine;
        let new = results(
            gpu,
            Unit::Nanoseconds,
            vec![slower_driver, fig("RawMemory alloc", 8, 105.0, 0.0)],
        );
        let c = judge(old, &new);
        let verdicts: Vec<Verdict> = c.doc.figures.iter().map(|f| f.verdict).collect();
        assert_eq!(verdicts, [Verdict::MachineMoved, Verdict::WithinNoise]);
        assert_eq!((c.doc.summary.machine_moved, c.doc.summary.worse), (1, 0));
        assert_eq!(c.doc.summary.compared, 2);
        assert!(!c.doc.regressed);
        assert_eq!(c.exit_code(), 0);
        assert!(c.text().contains("machine"), "{}", c.text());

        // The library's own figure moving the same way still is a regression.
        let old = results(
            gpu,
            Unit::Nanoseconds,
            vec![fig("RawMemory alloc", 8, 100.0, 0.0)],
        );
        let new = results(
            gpu,
            Unit::Nanoseconds,
            vec![fig("RawMemory alloc", 8, 160.0, 0.0)],
        );
        assert_eq!(judge(old, &new).exit_code(), EXIT_WORSE);
    }

    /// A report called `name` (a registered one, so the registry's machine rows and driver work
    /// apply) holding `figures`.
    fn report(name: &str, unit: Unit, figures: Vec<Figure>) -> Report {
        Report {
            figures,
            ..Report::new(name, unit)
        }
    }

    /// A figure with `samples` samples.
    fn sampled(method: &str, size: u64, median: f64, samples: usize) -> Figure {
        Figure {
            samples,
            ..fig(method, size, median, 0.05)
        }
    }

    /// `run` with every figure's median and percentiles multiplied by what `factor` says for it.
    fn scaled(run: &Results, factor: impl Fn(&Report, &Figure) -> f64) -> Results {
        let mut out = run.clone();
        for r in out.benchmarks.iter_mut().flat_map(|b| b.reports.iter_mut()) {
            let unscaled = r.clone();
            for (f, was) in r.figures.iter_mut().zip(&unscaled.figures) {
                let k = factor(&unscaled, was);
                f.median *= k;
                f.p10 *= k;
                f.p90 *= k;
            }
        }
        out
    }

    /// An `apiperf` and a `waits-idle` report as a run on one machine writes them: the driver's
    /// steps of a 2 MiB chunk (10 samples each) beside the library's whole chunk, the driver
    /// calls of `waits` (5 samples) beside `Gpu::alloc` and `RawMemory drop`, and the cached pool
    /// pair (100 000 samples).
    fn driver_heavy_run() -> Results {
        let mb2 = 2 << 20;
        let machine = |method: &str, median: f64, samples: usize| Figure {
            origin: Origin::Machine,
            ..sampled(method, mb2, median, samples)
        };
        let mut apiperf: Vec<Figure> = vkgdr_lab::bench::raw_steps::ALLOC_STEPS
            .iter()
            .zip([91_000.0, 30_000.0, 50_000.0, 1_000.0, 35_000.0])
            .chain(
                vkgdr_lab::bench::raw_steps::FREE_STEPS
                    .iter()
                    .zip([23_000.0, 7_000.0, 600.0, 70_000.0]),
            )
            .map(|(m, ns)| machine(m, ns, 10))
            .collect();
        apiperf.extend([
            sampled("pool chunk alloc (library, whole)", mb2, 178_000.0, 10),
            sampled(
                "pool chunk free (library: queued, released off the caller's thread)",
                mb2,
                112_000.0,
                10,
            ),
            machine("cuMemAlloc", 44_000.0, 2000),
            sampled("Pool alloc+free", 256, 58.7, 100_000),
        ]);
        let mut waits: Vec<Figure> = [
            ("vkAllocateMemory + vkMapMemory", 231_000.0),
            ("vkGetMemoryFdKHR", 65_000.0),
            ("cuMemImportFromShareableHandle", 41_000.0),
            ("cuMemAddressReserve", 5_900.0),
            ("cuMemMap", 7_500.0),
            ("cuMemSetAccess", 103_000.0),
            ("cuMemUnmap", 48_000.0),
            ("cuMemRelease", 19_000.0),
            ("cuMemAddressFree", 4_400.0),
            ("vkUnmapMemory + vkFreeMemory", 219_000.0),
        ]
        .into_iter()
        .map(|(m, ns)| machine(m, ns, 5))
        .collect();
        waits.extend([
            sampled("Gpu::alloc", mb2, 489_000.0, 10),
            sampled("RawMemory drop", mb2, 314_000.0, 5),
        ]);
        let mut run = results(Some(("G", "u")), Unit::Nanoseconds, Vec::new());
        run.benchmarks[0].reports = vec![
            report("apiperf", Unit::Nanoseconds, apiperf),
            report("waits-idle", Unit::Nanoseconds, waits),
        ];
        run
    }

    /// Whether `f` of report `r` in `run` times the driver alone (the registry names it a
    /// machine row), and whether it is a library row made of driver work measured beside it.
    fn driver_heavy(run: &Results, r: &Report, f: &Figure) -> (bool, bool) {
        let spec = vkgdr_lab::bench::registry::report_spec(&r.name).unwrap();
        (
            spec.is_machine(&f.method),
            machine_work(run, &r.name, &f.method, f.size).is_some(),
        )
    }

    /// `run` on a machine whose driver is 40 % slower: its driver rows and the library's rows
    /// that are mostly driver work take 1.4 times as long; the rest does not move.
    fn slower_driver(run: &Results) -> Results {
        scaled(run, |r, f| match driver_heavy(run, r, f) {
            (false, false) => 1.0,
            _ => 1.4,
        })
    }

    #[test]
    fn a_machine_whose_driver_is_40_percent_slower_is_no_regression() {
        let old = driver_heavy_run();
        let new = slower_driver(&old);
        let c = judge(old, &new);
        let d = &c.doc;
        assert_eq!(d.summary.worse, 0, "{}", c.text());
        assert!(!d.regressed);
        assert_eq!(c.exit_code(), 0);
        for f in &d.figures {
            let library = !vkgdr_lab::bench::registry::report_spec(&f.report)
                .unwrap()
                .is_machine(&f.method);
            match f.driver_work.as_ref() {
                // Moved by 1.4 with its driver work: the anchored move is none at all.
                Some(w) => {
                    assert!((f.ratio.unwrap() - 1.4).abs() < 1e-9);
                    assert!((w.ratio - 1.4).abs() < 1e-9, "{}: {}", f.method, w.ratio);
                    assert!((w.anchored_ratio - 1.0).abs() < 1e-9);
                    assert_eq!(w.verdict, Verdict::WithinNoise);
                    assert!(library);
                }
                None if library => assert_eq!(f.verdict, Verdict::WithinNoise, "{}", f.method),
                None => {}
            }
        }
        // The 10-sample rows moved by 1.4 beyond their noise (27.5 %), with their driver work;
        // the 5-sample row's noise (40.6 %) holds 1.4 by itself.
        let verdict = |m: &str| d.figures.iter().find(|f| f.method == m).unwrap().verdict;
        assert_eq!(
            verdict("pool chunk alloc (library, whole)"),
            Verdict::MovedWithDriver
        );
        assert_eq!(verdict("Gpu::alloc"), Verdict::MovedWithDriver);
        assert_eq!(verdict("RawMemory drop"), Verdict::WithinNoise);
        assert_eq!(verdict("cuMemAlloc"), Verdict::MachineMoved);
        assert_eq!(d.summary.moved_with_driver, 3);
        let text = c.text();
        assert!(text.contains("vs machine"), "{text}");
        assert!(text.contains("with machine"), "{text}");
        // The document says it, and reads back (to the last digit serde_json parses).
        let back: ComparisonDocument = serde_json::from_str(&to_text(d)).unwrap();
        assert_eq!(back.summary, d.summary);
        for (b, f) in back.figures.iter().zip(&d.figures) {
            assert_eq!(
                (b.verdict, b.tolerance_percent),
                (f.verdict, f.tolerance_percent)
            );
            assert_eq!(
                b.driver_work.as_ref().map(|w| (&w.methods, w.verdict)),
                f.driver_work.as_ref().map(|w| (&w.methods, w.verdict))
            );
        }

        // The library's own share 1.8 times slower on that machine is still a regression.
        let worse = scaled(&new, |_, f| {
            if f.method.starts_with("pool chunk alloc") {
                1.8
            } else {
                1.0
            }
        });
        let c = judge(driver_heavy_run(), &worse);
        let f = c
            .doc
            .figures
            .iter()
            .find(|f| f.method.starts_with("pool chunk alloc"))
            .unwrap();
        assert_eq!(f.verdict, Verdict::Worse);
        let w = f.driver_work.as_ref().unwrap();
        assert!((w.anchored_ratio - 1.8).abs() < 1e-9);
        assert_eq!(w.methods.len(), 5);
        assert_eq!(c.doc.summary.worse, 1);
        assert_eq!(c.exit_code(), EXIT_WORSE);
        assert!(
            c.text()
                .contains("1.40× for the machine, 1.80× for the figure against it"),
            "{}",
            c.text()
        );
    }

    #[test]
    fn a_slower_pool_pair_is_a_regression_on_a_slower_machine_too() {
        let slower = slower_driver(&driver_heavy_run());
        let new = scaled(&slower, |_, f| {
            if f.method == "Pool alloc+free" {
                1.8
            } else {
                1.0
            }
        });
        let c = judge(driver_heavy_run(), &new);
        let worse: Vec<&str> = worse_figures(&c).map(|f| f.method.as_str()).collect();
        assert_eq!(worse, ["Pool alloc+free"]);
        assert!(c.doc.regressed);
        let text = c.text();
        assert!(
            text.contains("apiperf / Pool alloc+free @ 256 B: 58.7 ns → 106 ns (1.80× the time"),
            "{text}"
        );
    }

    /// An `apiperf` and a `fastpath-pool` report as a run writes them: the pool's pairs beside
    /// the C library's `malloc`+`free` at the same size (thousands of samples each).
    fn pool_run() -> Results {
        use vkgdr_lab::bench::{apiperf::rows as api, fastpath::rows as fp};
        let f = |method: &str, size: u64, median: f64| sampled(method, size, median, 10_000);
        let machine = |method: &str, size: u64, median: f64| Figure {
            origin: Origin::Machine,
            ..f(method, size, median)
        };
        let mut apiperf = Vec::new();
        for (size, pool, malloc) in [(16, 14.0, 9.0), (256, 14.5, 9.5), (1 << 20, 90.0, 2500.0)] {
            apiperf.extend([
                f(api::POOL_PAIR, size, pool),
                machine(api::MALLOC_PAIR, size, malloc),
            ]);
        }
        let pool = vec![
            f(fp::POOL_1_DEFAULT, 256, 15.0),
            f(fp::POOL_1_NO_CACHE, 256, 40.0),
            f(fp::POOL_8_DEFAULT, 256, 2.4),
            f(fp::POOL_16_NO_CACHE, 256, 55.0),
            machine(fp::MALLOC_PAIR, 256, 11.0),
            machine(fp::MALLOC_PAIR_8, 256, 2.6),
            machine(fp::MALLOC_PAIR_16, 256, 2.3),
        ];
        let mut run = results(Some(("G", "u")), Unit::Nanoseconds, Vec::new());
        run.benchmarks[0].reports = vec![
            report("apiperf", Unit::Nanoseconds, apiperf),
            report("fastpath-pool", Unit::Nanoseconds, pool),
        ];
        run
    }

    #[test]
    fn a_cpu_slower_at_malloc_too_is_no_pool_regression_and_a_slower_pool_is() {
        // A process whose CPU runs every pair 1.6 times as slow, `malloc`'s too (what two
        // processes of one lent machine showed): no regression, each pool row moved with it.
        let old = pool_run();
        let new = scaled(&old, |_, _| 1.6);
        let c = judge(old.clone(), &new);
        assert_eq!(c.doc.summary.worse, 0, "{}", c.text());
        let pool_rows = c.doc.figures.iter().filter(|f| f.driver_work.is_some());
        let mut n = 0;
        for f in pool_rows {
            assert_eq!(f.verdict, Verdict::MovedWithDriver, "{}", f.method);
            let w = f.driver_work.as_ref().unwrap();
            assert!((w.anchored_ratio - 1.0).abs() < 1e-9, "{}", f.method);
            n += 1;
        }
        // 3 apiperf sizes and the 4 fastpath-pool rows.
        assert_eq!(n, 7, "{}", c.text());

        // The pool's own pairs 1.6 times as slow, `malloc` as before: every one is worse.
        let slower_pool = scaled(&old, |r, f| {
            let spec = vkgdr_lab::bench::registry::report_spec(&r.name).unwrap();
            if spec.is_machine(&f.method) {
                1.0
            } else {
                1.6
            }
        });
        let c = judge(old, &slower_pool);
        assert_eq!(c.doc.summary.worse, 7, "{}", c.text());
        assert!(c.doc.regressed);
    }

    /// A `copybw-write`, a `copylat` and a `fastpath-small` report as a run on one machine writes
    /// them: each library BAR row beside its raw row (a plain loop of the same stores) at the
    /// same sizes, thousands of samples each.
    fn bar_run() -> Results {
        let f = |method: &str, size: u64, median: f64| sampled(method, size, median, 2000);
        let mut write = Vec::new();
        for (size, one, two) in [(4 << 20, 13.0, 27.5), (64 << 20, 9.9, 26.0)] {
            write.extend([
                f("BAR 1 thr", size, one),
                f("raw 1 thr", size, one * 1.05),
                f("BAR 2 thr", size, two),
                f("raw 2 thr", size, two * 1.05),
                f("HtoD pinned", size, 54.0),
            ]);
        }
        let mut lat = Vec::new();
        for (size, ns) in [(8, 123.0), (64, 124.0), (4096, 360.0)] {
            lat.extend([
                f("BAR write", size, ns),
                f("raw write", size, ns * 0.95),
                f("BAR write+readback", size, ns + 1100.0),
                f("raw write+readback", size, ns + 1090.0),
                f("cuMemcpyHtoD", size, 7200.0),
            ]);
        }
        let small = vec![
            f("Block::write (default API)", 64, 140.0),
            f("raw store + sfence, same block (limit)", 64, 135.0),
            f("RawMemory::write (default API)", 64, 145.0),
        ];
        let mut run = results(Some(("G", "u")), Unit::Nanoseconds, Vec::new());
        run.benchmarks[0].reports = vec![
            report("copybw-write", Unit::GigabytesPerSecond, write),
            report("copylat", Unit::Nanoseconds, lat),
            report("fastpath-small", Unit::Nanoseconds, small),
        ];
        run
    }

    /// Whether `f` is a library row of `bar_run` whose machine work (its raw row) is measured.
    fn bar_library_row(r: &Report, f: &Figure) -> bool {
        crate::compare::machine_work::machine_work_of(&r.name, &f.method).is_some()
    }

    /// A factor `k` on the time of `f` of report `r`: the rate divided by it where `r` is in GB/s.
    fn slower(r: &Report, k: f64) -> f64 {
        if r.unit == Unit::GigabytesPerSecond {
            1.0 / k
        } else {
            k
        }
    }

    #[test]
    fn a_machine_whose_bar_is_slower_is_no_regression_and_slower_copy_code_is() {
        let old = bar_run();
        // Every BAR store and load, the library's and the raw loops', 1.6 times as slow; the
        // driver's copies as before.
        let machine = |run: &Results| {
            scaled(run, |r, f| {
                let raw = vkgdr_lab::bench::registry::report_spec(&r.name)
                    .unwrap()
                    .is_machine(&f.method)
                    && (f.method.starts_with("raw") || r.name == "fastpath-small");
                if raw || bar_library_row(r, f) {
                    slower(r, 1.6)
                } else {
                    1.0
                }
            })
        };
        let new = machine(&old);
        let c = judge(old.clone(), &new);
        let s = c.doc.summary;
        assert_eq!(s.worse, 0, "{}", c.text());
        assert!(!c.doc.regressed);
        for f in &c.doc.figures {
            let is_library = c
                .doc
                .figures
                .iter()
                .any(|g| g.method == f.method && g.driver_work.is_some());
            if is_library {
                assert_eq!(f.verdict, Verdict::MovedWithDriver, "{}", f.method);
                let w = f.driver_work.as_ref().unwrap();
                assert!((w.anchored_ratio - 1.0).abs() < 1e-9, "{}", f.method);
                assert_eq!(w.methods.len(), 1);
            } else if f.method.starts_with("raw") {
                assert_eq!(f.verdict, Verdict::MachineMoved, "{}", f.method);
            }
        }
        // 4 copybw-write, 6 copylat and 2 fastpath-small library rows.
        assert_eq!(s.moved_with_driver, 12, "{}", c.text());
        let text = c.text();
        assert!(text.contains("with machine"), "{text}");
        assert!(text.contains("vs machine"), "{text}");

        // The library's copies 1.5 times as slow with the raw rows unchanged: every one is a
        // regression, its raw move and its move against the raw row both beyond noise.
        let code = scaled(&old, |r, f| {
            if bar_library_row(r, f) {
                slower(r, 1.5)
            } else {
                1.0
            }
        });
        let c = judge(old.clone(), &code);
        let worse: Vec<(&str, &str)> = worse_figures(&c)
            .map(|f| (f.report.as_str(), f.method.as_str()))
            .collect();
        assert_eq!(worse.len(), 12, "{}", c.text());
        for f in worse_figures(&c) {
            let w = f.driver_work.as_ref().unwrap();
            assert!((w.ratio - 1.0).abs() < 1e-9, "{}", f.method);
            assert_eq!(w.verdict, Verdict::Worse);
        }
        assert!(worse.contains(&("fastpath-small", "Block::write (default API)")));
        assert!(worse.contains(&("copylat", "BAR write")));
        assert!(worse.contains(&("copybw-write", "BAR 2 thr")));
        assert_eq!(c.exit_code(), EXIT_WORSE);
        let text = c.text();
        assert!(
            text.contains(
                "against its machine work (raw write): 1.00× for the machine, 1.50× for the \
                 figure against it"
            ),
            "{text}"
        );

        // The same slower code on the slower machine: still caught, by its move against the raw
        // rows, and only the library's rows.
        let c = judge(old.clone(), &machine(&code));
        assert_eq!(c.doc.summary.worse, 12, "{}", c.text());
        assert!(worse_figures(&c).all(|f| {
            // 1.5 times the time, or two thirds of the rate.
            let k = f.driver_work.as_ref().unwrap().anchored_ratio;
            (k - 1.5).abs() < 1e-9 || (k - 1.0 / 1.5).abs() < 1e-9
        }));

        // A baseline recorded before the raw rows: nothing to anchor on, the rows stand alone
        // and a slower BAR counts (as it did before the raw rows existed).
        let mut without_raw = old.clone();
        for r in without_raw
            .benchmarks
            .iter_mut()
            .flat_map(|b| b.reports.iter_mut())
        {
            r.figures.retain(|f| !f.method.starts_with("raw"));
        }
        let c = judge(without_raw, &new);
        assert!(c.doc.figures.iter().all(|f| f.driver_work.is_none()));
        assert_eq!(c.doc.summary.worse, 12, "{}", c.text());
    }

    #[test]
    fn a_few_sample_figure_needs_more_than_a_quarter_to_count() {
        let gpu = Some(("G", "u"));
        for (samples, factor, verdict) in [
            // 1, 5 and 10 samples: a quarter is machine variance, 3× is not.
            (1, 1.25, Verdict::WithinNoise),
            (1, 3.0, Verdict::Worse),
            (5, 1.25, Verdict::WithinNoise),
            (5, 3.0, Verdict::Worse),
            (10, 1.25, Verdict::WithinNoise),
            (10, 3.0, Verdict::Worse),
            (5, 1.0 / 3.0, Verdict::Better),
            // Thousands of samples: the floor alone.
            (2000, 1.25, Verdict::Worse),
        ] {
            let old = results(
                gpu,
                Unit::Nanoseconds,
                vec![sampled("m", 8, 400_000.0, samples)],
            );
            let new = results(
                gpu,
                Unit::Nanoseconds,
                vec![sampled("m", 8, 400_000.0 * factor, samples)],
            );
            let c = judge(old, &new);
            let f = &c.doc.figures[0];
            assert_eq!(f.verdict, verdict, "{samples} samples, {factor}×");
            assert!(f.driver_work.is_none());
        }
        // The fewer samples of the two runs count.
        let old = results(gpu, Unit::Nanoseconds, vec![sampled("m", 8, 100.0, 5)]);
        let new = results(
            gpu,
            Unit::Nanoseconds,
            vec![sampled("m", 8, 125.0, 100_000)],
        );
        let c = judge(old, &new);
        assert_eq!(c.doc.figures[0].verdict, Verdict::WithinNoise);
        assert!(c.doc.figures[0].tolerance_percent > 40.0);
    }

    #[test]
    fn the_device_measured_names_the_gpu_before_device_0() {
        // Earlier documents name no device: they measured CUDA device 0.
        let old = results(Some(("NVIDIA H100", "u0")), Unit::Nanoseconds, vec![]);
        assert_eq!(old.gpu().unwrap().name, "NVIDIA H100");
        // `--device 1` on a machine whose device 0 is another model: device 1 is the one.
        let new = Results {
            device: Some(DeviceIn {
                name: "NVIDIA H200".into(),
                uuid: Some("u1".into()),
            }),
            ..old.clone()
        };
        assert_eq!(
            new.gpu(),
            Some(GpuJson {
                name: "NVIDIA H200".into(),
                uuid: Some("u1".into())
            })
        );
    }

    #[test]
    fn the_committed_baseline_as_a_slower_machine_would_run_it() {
        // The recorded baseline still reads, and compared with itself nothing moved.
        let path = repo_path("benches/baselines/nvidia-h100-80gb-hbm3.json");
        let base = Results::load(&path).unwrap();
        let c = judge(base.clone(), &base);
        assert_eq!(c.doc.summary.within_noise, c.doc.summary.compared);
        // Its driver and hardware rows (named by the registry: the baseline predates the mark)
        // and the library rows made of driver work 40 % slower (rates 40 % lower): nothing counts.
        let slower = scaled(&base, |r, f| match driver_heavy(&base, r, f) {
            (true, _) if r.unit == Unit::GigabytesPerSecond => 1.0 / 1.4,
            (false, false) => 1.0,
            _ => 1.4,
        });
        let c = judge(base.clone(), &slower);
        let s = c.doc.summary;
        assert_eq!(s.worse, 0, "{}", c.text());
        assert!(s.machine_moved > 100, "{s:?}");
        assert!(s.moved_with_driver > 0, "{s:?}");
        // The cached pool pairs 1.8 times slower besides: those, and only those, count.
        let regressed = scaled(&slower, |r, f| {
            let pool_pair = (r.name == "apiperf" && f.method == "Pool alloc+free")
                || (r.name == "fastpath-pool" && f.method.contains("default PoolConfig"));
            if pool_pair {
                1.8
            } else {
                1.0
            }
        });
        let c = judge(base, &regressed);
        let worse: Vec<(&str, &str)> = worse_figures(&c)
            .map(|f| (f.report.as_str(), f.method.as_str()))
            .collect();
        assert_eq!(worse.len(), 13, "{worse:?}");
        assert!(worse
            .iter()
            .all(|(r, m)| *m == "Pool alloc+free" || *r == "fastpath-pool"));
        assert_eq!(c.exit_code(), EXIT_WORSE);
    }

    #[test]
    fn figures_pair_by_report_method_and_size_in_the_new_order() {
        let gpu = Some(("G", "u"));
        let old = results(
            gpu,
            Unit::GigabytesPerSecond,
            vec![
                fig("a", 8, 10.0, 0.0),
                fig("gone", 8, 1.0, 0.0),
                fig("a", 16, 20.0, 0.0),
            ],
        );
        let mut new = results(
            gpu,
            Unit::GigabytesPerSecond,
            vec![
                fig("a", 16, 10.0, 0.0),
                fig("a", 8, 10.5, 0.0),
                fig("new", 8, 3.0, 0.0),
            ],
        );
        // A reference figure is quoted, not measured: never compared.
        let mut reference = fig("quoted", 8, 1.0, 0.0);
        reference.origin = Origin::Reference;
        new.benchmarks[0].reports[0].figures.push(reference);
        let c = judge(old, &new);
        let got: Vec<(&str, u64, Verdict)> = c
            .doc
            .figures
            .iter()
            .map(|f| (f.method.as_str(), f.size_bytes, f.verdict))
            .collect();
        assert_eq!(
            got,
            [
                ("a", 16, Verdict::Worse),
                ("a", 8, Verdict::WithinNoise),
                ("new", 8, Verdict::OnlyInCurrent),
                ("gone", 8, Verdict::OnlyInBaseline),
            ]
        );
        assert!(c.doc.figures.iter().all(|f| f.higher_is_better));
        assert_eq!(
            c.doc.summary,
            SummaryJson {
                compared: 2,
                worse: 1,
                better: 0,
                within_noise: 1,
                machine_moved: 0,
                moved_with_driver: 0,
                only_in_baseline: 1,
                only_in_current: 1,
                not_comparable: 0,
            }
        );
        assert_eq!(c.doc.gpu_match, GpuMatch::SameGpu);
        assert!(c.doc.regressed);
        assert_eq!(c.exit_code(), EXIT_WORSE);
        let text = c.text();
        assert!(text.contains("REGRESSION: 1 figure(s)"), "{text}");
        assert!(
            text.contains("r / a @ 16 B: 20.0 GB/s → 10.0 GB/s (0.500× the rate; noise ±10 %)"),
            "{text}"
        );
    }

    #[test]
    fn a_null_median_is_not_comparable_and_the_rest_still_is() {
        let mut doc = serde_json::json!({
            "format": "vkgdr-bench", "format_version": 1,
            "benchmarks": [{ "name": "b", "reports": [{ "name": "r", "unit": "ns", "figures": [
                { "method": "a", "size_bytes": 8, "median": null },
                { "method": "b", "size_bytes": 8, "median": 5.0 }
            ] }] }]
        });
        let text = doc.to_string();
        let old = Results::parse(Path::new("old"), &text).unwrap();
        assert!(old.benchmarks[0].reports[0].figures[0].median.is_nan());
        doc["benchmarks"][0]["reports"][0]["figures"][0]["median"] = 4.0.into();
        let new = Results::parse(Path::new("new"), &doc.to_string()).unwrap();
        let c = judge(old, &new);
        let v: Vec<Verdict> = c.doc.figures.iter().map(|f| f.verdict).collect();
        assert_eq!(v, [Verdict::NotComparable, Verdict::WithinNoise]);
        assert_eq!(c.doc.figures[0].ratio, None);
        // A missing median is still an error, with its place.
        doc["benchmarks"][0]["reports"][0]["figures"][0]
            .as_object_mut()
            .unwrap()
            .remove("median");
        let e = Results::parse(Path::new("x.json"), &doc.to_string()).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("x.json: malformed `vkgdr bench` results: missing field `median`"),
            "{e}"
        );
    }

    #[test]
    fn a_run_compares_with_its_own_document() {
        // The document `vkgdr bench` writes reads back as a comparison's side: each measured
        // figure paired with itself, reference values left out.
        let mut lat = Report::new("copylat", Unit::Nanoseconds);
        for (size, bar) in [(8, 150.0), (4096, 450.0)] {
            lat.figures.push(Figure::measured(
                "BAR write",
                size,
                &Stats::of(&[bar]).unwrap(),
            ));
        }
        lat.figures
            .push(Figure::reference("C vkgdr (docs)", 8, 1e3));
        let runs = [
            ("copylat", None, vec![lat]),
            ("pplat", Some("stuck".into()), vec![]),
        ]
        .map(|(name, error, reports)| BenchRun {
            name: name.into(),
            seconds: 1.0,
            error,
            reports,
        });
        let opts = Options {
            out: PathBuf::from("out"),
            quick: false,
        };
        let doc = document(&opts, None, None, &runs, None);
        let read = Results::parse(Path::new("results.json"), &to_text(&doc)).unwrap();
        assert_eq!(read.mode.as_deref(), Some("full"));
        let c = judge(read.clone(), &read);
        let d = &c.doc;
        assert_eq!(d.summary.compared, 2);
        assert_eq!(d.summary.within_noise, 2);
        assert!(d.figures.iter().all(|f| f.ratio == Some(1.0)));
        // No machine section names a GPU: shown, not judged.
        assert_eq!(d.gpu_match, GpuMatch::UnknownGpu);
        assert!(!d.regressed);
        assert_eq!(d.current.failed_benchmarks, ["pplat"]);
        // The comparison document reads back too.
        let back: ComparisonDocument = serde_json::from_str(&to_text(&c.doc)).unwrap();
        assert_eq!(&back, d);
    }
}

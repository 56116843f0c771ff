//! A comparison ([`Comparison`]): the baseline chosen for the new run, whether the two ran on
//! the same GPU model (only then are moves judged), notes for the reader, every figure paired and
//! judged, and the summary with the exit code it calls for.

use std::path::Path;

use super::baseline::{Baseline, Choice};
use super::document::{ComparisonDocument, GpuMatch, SummaryJson, FORMAT};
use super::noise::Verdict;
use super::pairing::pair_up;
use super::results::Results;
use crate::json::document::About;

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
                    "the GPU of {which} is unknown (no CUDA device 0 in its machine section): \
                     figures shown as information only, nothing counts as a regression"
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
                Verdict::OnlyInBaseline => summary.only_in_baseline += 1,
                Verdict::OnlyInCurrent => summary.only_in_current += 1,
                Verdict::NotComparable => summary.not_comparable += 1,
            }
        }
        summary.compared =
            summary.worse + summary.better + summary.within_noise + summary.machine_moved;
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
    use crate::bench::compare::baseline::Loaded;
    use crate::bench::compare::noise::spread;
    use crate::bench::compare::results::{
        BenchmarkIn, CudaDeviceIn, CudaIn, FigureIn, MachineIn, ReportIn,
    };
    use crate::bench::options::Options;
    use crate::bench::outputs::tests::made_up_run;
    use crate::bench::outputs::{document, write_results};
    use crate::bench::testutil::TempDir;
    use crate::json::document::{to_text, FORMAT_VERSION};
    use crate::json::machine::tests::bare_machine;

    fn fig(method: &str, size: u64, median: f64, spread: f64) -> FigureIn {
        FigureIn {
            method: method.into(),
            size_bytes: size,
            unit: None,
            median,
            p10: Some(median * (1.0 - spread)),
            p90: Some(median * (1.0 + spread)),
            samples: Some(100),
            origin: Some("measured".into()),
            anchor: None,
        }
    }

    fn results(gpu: Option<(&str, &str)>, unit: &str, figures: Vec<FigureIn>) -> Results {
        Results {
            format_version: FORMAT_VERSION,
            vkgdr_version: Some("0.1.0".into()),
            mode: Some("full".into()),
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
            benchmarks: vec![BenchmarkIn {
                name: "b".into(),
                error: None,
                reports: vec![ReportIn {
                    name: "r".into(),
                    title: None,
                    unit: unit.into(),
                    higher_is_better: None,
                    figures,
                }],
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

    #[test]
    fn a_figure_s_own_spread_widens_its_noise() {
        assert!((spread(&fig("a", 8, 100.0, 0.3)) - 0.3).abs() < 1e-12);
        let mut one = fig("a", 8, 100.0, 0.3);
        one.samples = Some(1);
        assert_eq!(spread(&one), 0.0, "one sample has no spread");
        one.samples = Some(5);
        one.p10 = None;
        assert_eq!(spread(&one), 0.0, "no percentiles, no spread");

        // 1.25× slower: a regression with tight samples, noise with wide ones.
        let gpu = Some(("G", "u"));
        for (spread, verdict, noise) in [
            (0.02, Verdict::Worse, 10.0),
            (0.3, Verdict::WithinNoise, 30.0),
        ] {
            let old = results(gpu, "ns", vec![fig("m", 8, 100.0, spread)]);
            let new = results(gpu, "ns", vec![fig("m", 8, 125.0, 0.01)]);
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
            "ns",
            vec![
                fig("cuMemAlloc", 8, 100.0, 0.0),
                fig("RawMemory alloc", 8, 100.0, 0.0),
            ],
        );
        let mut slower_driver = fig("cuMemAlloc", 8, 160.0, 0.0);
        slower_driver.origin = Some("machine".into());
        let new = results(
            gpu,
            "ns",
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
        let old = results(gpu, "ns", vec![fig("RawMemory alloc", 8, 100.0, 0.0)]);
        let new = results(gpu, "ns", vec![fig("RawMemory alloc", 8, 160.0, 0.0)]);
        assert_eq!(judge(old, &new).exit_code(), EXIT_WORSE);
    }

    #[test]
    fn figures_pair_by_report_method_and_size_in_the_new_order() {
        let gpu = Some(("G", "u"));
        let old = results(
            gpu,
            "GB/s",
            vec![
                fig("a", 8, 10.0, 0.0),
                fig("gone", 8, 1.0, 0.0),
                fig("a", 16, 20.0, 0.0),
            ],
        );
        let mut new = results(
            gpu,
            "GB/s",
            vec![
                fig("a", 16, 10.0, 0.0),
                fig("a", 8, 10.5, 0.0),
                fig("new", 8, 3.0, 0.0),
            ],
        );
        // A reference figure is quoted, not measured: never compared.
        let mut reference = fig("quoted", 8, 1.0, 0.0);
        reference.origin = Some("reference".into());
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
        // The document a run writes reads back as a comparison's baseline: each measured figure
        // paired with itself, reference values left out.
        let opts = Options {
            out: PathBuf::from("out"),
            quick: false,
        };
        let doc = document(&opts, Some(bare_machine()), &made_up_run(), None);
        // What the run writes into its directory is what `--compare` judges (from the document
        // it holds) and what `vkgdr bench compare BASELINE DIR` reads back.
        let dir = TempDir::new("own-document");
        let path = write_results(&dir.0, &doc).unwrap();
        let read = Results::load(&dir.0).unwrap();
        assert_eq!(read, Results::of(&doc, &path).unwrap());
        assert_eq!(read.mode.as_deref(), Some("full"));
        assert_eq!(read.benchmarks.len(), 3);
        let c = judge(read.clone(), &read);
        let d = &c.doc;
        // 5 measured copylat figures and 2 apiperf ones; the quoted C figure is not compared.
        assert_eq!(d.summary.compared, 7);
        assert_eq!(d.summary.within_noise, 7);
        assert!(d.figures.iter().all(|f| f.ratio == Some(1.0)));
        assert!(!d.figures.iter().any(|f| f.method.contains("docs")));
        // The machine without drivers names no GPU: shown, not judged.
        assert_eq!(d.gpu_match, GpuMatch::UnknownGpu);
        assert!(!d.regressed);
        assert_eq!(d.current.failed_benchmarks, ["pplat"]);
        // The comparison document reads back too.
        let back: ComparisonDocument = serde_json::from_str(&to_text(&c.doc)).unwrap();
        assert_eq!(&back, d);
    }
}

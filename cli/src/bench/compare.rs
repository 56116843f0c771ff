//! Regression memory: every figure of a run beside the same figure of an earlier run on the same
//! GPU model (`vkgdr bench compare BASELINE NEW`, or `vkgdr bench BENCHMARK --compare BASELINE`
//! after a run).
//!
//! Figures are matched by report, method and size. Each pair gets the ratio of the medians (now /
//! before) and a verdict in the unit's direction (time: lower is better; GB/s: higher is better).
//! A figure has *moved* when the ratio is beyond its noise: the larger of a floor
//! (`--tolerance`, [`DEFAULT_TOLERANCE_PERCENT`] by default) and the figure's own spread in
//! either run (half its p10–p90 range relative to its median), so a figure whose samples scatter
//! widely needs a larger move to count. Worse means `factor > 1 + noise`, better
//! `factor < 1 / (1 + noise)`, where the factor is now/before for times and before/now for rates.
//! Reference figures (quoted, not measured) are left out.
//!
//! Only documents of the same GPU model (CUDA device 0's name; the UUID says whether it is the
//! same card) are judged: with different or unknown GPUs the figures are shown as information and
//! nothing counts as a regression. A baseline may be a directory (`benches/baselines`): the
//! `vkgdr-bench` document in it recorded on the new run's GPU model is chosen.
//!
//! Exit codes: 0 nothing got worse beyond its noise (or nothing could be judged), 2 the command
//! line or a file is wrong, [`EXIT_WORSE`] a figure got worse beyond its noise.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::builder::{NonEmptyStringValueParser, TypedValueParser};
use serde::{Deserialize, Serialize};

use super::report::{fmt_size, sig3};
use super::{Unit, RESULTS_JSON};
use crate::json::{self, About, BenchDocument, FORMAT_VERSION};
use crate::{alert, ui};

/// `format` of the comparison document.
pub const FORMAT: &str = "vkgdr-bench-comparison";

/// The noise floor: the smallest change, in percent, that counts as a move.
pub const DEFAULT_TOLERANCE_PERCENT: u32 = 10;

/// The exit code when a figure got worse beyond its noise on the same GPU model.
pub const EXIT_WORSE: u8 = 3;

/// The exit code of a wrong command line or an unreadable file (as clap's usage errors).
pub const EXIT_USAGE: u8 = 2;

/// The file a run with `--compare` writes beside `results.json`.
pub const COMPARISON_JSON: &str = "comparison.json";

/// Exit codes of `vkgdr bench compare`, for `--help`.
pub const EXIT_CODES: &str = "\
Exit status:
  0  no figure got worse beyond its noise (or the GPUs differ: shown as information only)
  2  the command line is wrong, or a file is not results of `vkgdr bench`
  3  a figure got worse beyond its noise on the same GPU model";

/// What `vkgdr bench compare` describes in `--help`.
pub const ABOUT: &str =
    "Compare results.json with an earlier one: every figure, its ratio, moves beyond noise";

/// `vkgdr bench compare`'s long help.
pub const LONG_ABOUT: &str = "\
Compare results.json with an earlier one: every figure, its ratio, moves beyond noise

Figures are matched by report, method and size; each gets the ratio now/before and a mark where it \
moved beyond its noise: the larger of --tolerance and its own spread in either run (half its \
p10-p90 range, relative to its median). Times are better lower, GB/s higher. Only runs on the same \
GPU model (CUDA device 0's name) are judged; other pairs are shown as information.";

/// Everything that keeps a comparison from starting: each names the file.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// The file or directory could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not JSON.
    #[error("{}: not JSON ({source})", path.display())]
    NotJson {
        /// The file.
        path: PathBuf,
        /// Where the parser stopped.
        source: serde_json::Error,
    },
    /// The file is JSON, but no `vkgdr-bench` document.
    #[error(
        "{}: {what}, not results of `vkgdr bench` (its DIR/results.json or --json output)",
        path.display()
    )]
    NotResults {
        /// The file.
        path: PathBuf,
        /// What it is instead.
        what: String,
    },
    /// A later program wrote it, in a layout this one does not know.
    #[error(
        "{}: format_version {found} is newer than this vkgdr reads ({FORMAT_VERSION}): compare with a newer vkgdr",
        path.display()
    )]
    Newer {
        /// The file.
        path: PathBuf,
        /// Its `format_version`.
        found: u64,
    },
    /// A `vkgdr-bench` document with a field missing or of the wrong type.
    #[error("{}: malformed `vkgdr bench` results: {source}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong, with its line and column.
        source: serde_json::Error,
    },
    /// A directory given as the new results without a `results.json` in it.
    #[error("{}: no {RESULTS_JSON} in this directory", path.display())]
    NoResults {
        /// The directory.
        path: PathBuf,
    },
}

// --- The documents, as this module reads them -------------------------------------------------------
//
// Only the fields a comparison needs, each optional where it can be: baselines recorded by older
// programs must stay readable when the machine section grows.

/// A `vkgdr-bench` document, as a comparison reads it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Results {
    /// The layout version.
    pub format_version: u32,
    /// The program that wrote it.
    #[serde(default)]
    pub vkgdr_version: Option<String>,
    /// `full` or `quick`.
    #[serde(default)]
    pub mode: Option<String>,
    /// The machine it ran on.
    #[serde(default)]
    pub machine: Option<MachineIn>,
    /// The benchmarks, with their reports.
    pub benchmarks: Vec<BenchmarkIn>,
}

/// The parts of the machine section a comparison shows.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct MachineIn {
    /// The CPU.
    #[serde(default)]
    pub cpu: Option<CpuIn>,
    /// The CUDA devices.
    #[serde(default)]
    pub cuda: Option<CudaIn>,
    /// NVML (driver version).
    #[serde(default)]
    pub nvml: Option<NvmlIn>,
}

/// The CPU.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CpuIn {
    /// Its model name.
    #[serde(default)]
    pub model: Option<String>,
}

/// The CUDA side.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CudaIn {
    /// `major.minor` of the driver's CUDA version.
    #[serde(default)]
    pub driver_cuda_version: Option<String>,
    /// The devices.
    #[serde(default)]
    pub devices: Vec<CudaDeviceIn>,
}

/// One CUDA device.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CudaDeviceIn {
    /// CUDA ordinal (the benchmarks run on 0).
    pub ordinal: i32,
    /// Its name.
    pub name: String,
    /// Its UUID.
    #[serde(default)]
    pub uuid: Option<String>,
}

/// NVML.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct NvmlIn {
    /// The driver version.
    #[serde(default)]
    pub driver_version: Option<String>,
}

/// One benchmark of a run.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BenchmarkIn {
    /// Its name.
    pub name: String,
    /// What stopped it.
    #[serde(default)]
    pub error: Option<String>,
    /// Its reports.
    #[serde(default)]
    pub reports: Vec<ReportIn>,
}

/// One report.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ReportIn {
    /// Its file stem.
    pub name: String,
    /// Its title.
    #[serde(default)]
    pub title: Option<String>,
    /// The unit of its figures.
    pub unit: String,
    /// Whether a higher figure is better (used only for a unit this program does not know).
    #[serde(default)]
    pub higher_is_better: Option<bool>,
    /// The figures.
    pub figures: Vec<FigureIn>,
}

/// One figure.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct FigureIn {
    /// What was measured.
    pub method: String,
    /// Bytes per operation (0: no size).
    pub size_bytes: u64,
    /// Its unit (the report's when absent).
    #[serde(default)]
    pub unit: Option<String>,
    /// Median over the samples (NaN where the document has `null`: JSON has no NaN, and
    /// serde_json writes a non-finite number as `null`).
    #[serde(deserialize_with = "null_is_nan")]
    pub median: f64,
    /// 10th percentile.
    #[serde(default)]
    pub p10: Option<f64>,
    /// 90th percentile.
    #[serde(default)]
    pub p90: Option<f64>,
    /// Number of samples.
    #[serde(default)]
    pub samples: Option<u64>,
    /// `measured` or `reference`.
    #[serde(default)]
    pub origin: Option<String>,
    /// What it was compared with in its own run.
    #[serde(default)]
    pub anchor: Option<AnchorIn>,
}

/// A figure's anchor: the figure of the same run it is compared with.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AnchorIn {
    /// The anchor's method.
    pub method: String,
    /// The figure's median divided by the anchor's.
    #[serde(default)]
    pub ratio: Option<f64>,
}

impl Results {
    /// Reads a document from `text`; `path` names it in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Results, CompareError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|source| CompareError::NotJson {
                path: path.to_path_buf(),
                source,
            })?;
        check_format(path, &value)?;
        // Parsed again from the text, so an error says where it is.
        serde_json::from_str(text).map_err(|source| CompareError::Malformed {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Reads the document in `path` (a file, or a directory holding `results.json`).
    pub fn load(path: &Path) -> Result<Results, CompareError> {
        let file = if path.is_dir() {
            let f = path.join(RESULTS_JSON);
            if !f.is_file() {
                return Err(CompareError::NoResults {
                    path: path.to_path_buf(),
                });
            }
            f
        } else {
            path.to_path_buf()
        };
        let text = read(&file)?;
        Results::parse(&file, &text)
    }

    /// The document of a run of this program, as it reads back from its JSON form (`path`, where
    /// it was written, names it in errors).
    pub fn of(doc: &BenchDocument, path: &Path) -> Result<Results, CompareError> {
        Results::parse(path, &json::to_text(doc))
    }

    /// The GPU the benchmarks ran on: CUDA device 0.
    pub fn gpu(&self) -> Option<GpuJson> {
        let d = self
            .machine
            .as_ref()?
            .cuda
            .as_ref()?
            .devices
            .iter()
            .find(|d| d.ordinal == 0)?;
        Some(GpuJson {
            name: d.name.clone(),
            uuid: d.uuid.clone(),
        })
    }

    fn side(&self, file: &Path) -> SideJson {
        let m = self.machine.as_ref();
        SideJson {
            file: file.display().to_string(),
            gpu: self.gpu(),
            driver_version: m
                .and_then(|m| m.nvml.as_ref())
                .and_then(|n| n.driver_version.clone()),
            cuda_version: m
                .and_then(|m| m.cuda.as_ref())
                .and_then(|c| c.driver_cuda_version.clone()),
            cpu: m.and_then(|m| m.cpu.as_ref()).and_then(|c| c.model.clone()),
            vkgdr_version: self.vkgdr_version.clone(),
            mode: self.mode.clone(),
            failed_benchmarks: self
                .benchmarks
                .iter()
                .filter(|b| b.error.is_some())
                .map(|b| b.name.clone())
                .collect(),
        }
    }

    /// Every measured figure with its report, in document order.
    fn figures(&self) -> Vec<(&ReportIn, &FigureIn)> {
        self.benchmarks
            .iter()
            .flat_map(|b| &b.reports)
            .flat_map(|r| r.figures.iter().map(move |f| (r, f)))
            .filter(|(_, f)| f.origin.as_deref() != Some("reference"))
            .collect()
    }
}

/// A number, or `null` read as NaN (such a figure is not comparable, and the rest of the
/// document still is).
fn null_is_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn read(path: &Path) -> Result<String, CompareError> {
    std::fs::read_to_string(path).map_err(|source| CompareError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Whether `value` is a `vkgdr-bench` document this program can read.
fn check_format(path: &Path, value: &serde_json::Value) -> Result<(), CompareError> {
    let not = |what: String| CompareError::NotResults {
        path: path.to_path_buf(),
        what,
    };
    match value.get("format") {
        Some(serde_json::Value::String(f)) if f == "vkgdr-bench" => {}
        Some(serde_json::Value::String(f)) => return Err(not(format!("a {f} document"))),
        _ if value.is_object() => return Err(not("a JSON object without a \"format\"".into())),
        _ => return Err(not("not a JSON object".into())),
    }
    match value.get("format_version").and_then(|v| v.as_u64()) {
        Some(v) if v > u64::from(FORMAT_VERSION) => Err(CompareError::Newer {
            path: path.to_path_buf(),
            found: v,
        }),
        _ => Ok(()),
    }
}

/// A GPU, as documents name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuJson {
    /// Its name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Its UUID.
    pub uuid: Option<String>,
}

impl GpuJson {
    /// The file stem of its baseline in `benches/baselines`: the name in lower case, each run of
    /// other characters than letters and digits a `-` (`nvidia-h100-80gb-hbm3`).
    pub fn baseline_stem(&self) -> String {
        let mut s = String::new();
        for c in self.name.chars() {
            if c.is_ascii_alphanumeric() {
                s.push(c.to_ascii_lowercase());
            } else if !s.is_empty() && !s.ends_with('-') {
                s.push('-');
            }
        }
        s.trim_end_matches('-').to_string()
    }

    fn describe(&self) -> String {
        match &self.uuid {
            Some(u) => format!("{} (uuid {u})", self.name),
            None => self.name.clone(),
        }
    }
}

// --- Baselines --------------------------------------------------------------------------------------

/// A loaded document and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// Its file.
    pub path: PathBuf,
    /// Its contents.
    pub results: Results,
}

/// What `BASELINE` named: one document, or a directory of them to choose from by GPU.
#[derive(Debug, Clone, PartialEq)]
pub enum Baseline {
    /// One file: compared whatever GPU it ran on.
    File(Loaded),
    /// A directory (`benches/baselines`): the `vkgdr-bench` documents in it (its `*.json` files
    /// of other formats, such as a `comparison.json`, are passed over).
    Dir {
        /// The directory.
        path: PathBuf,
        /// Its documents, by file name.
        candidates: Vec<Loaded>,
    },
}

/// The baseline chosen for a run, or why there is none.
enum Choice<'a> {
    Chosen {
        loaded: &'a Loaded,
        /// Other files of the directory that match as well.
        also: Vec<&'a Path>,
    },
    None(String),
}

impl Baseline {
    /// Reads `path`: a file, or every `*.json` of a directory. Read before a run starts, so it may
    /// name the `results.json` that the run replaces.
    pub fn open(path: &Path) -> Result<Baseline, CompareError> {
        if !path.is_dir() {
            let text = read(path)?;
            return Ok(Baseline::File(Loaded {
                path: path.to_path_buf(),
                results: Results::parse(path, &text)?,
            }));
        }
        let io = |source| CompareError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(io)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        let mut candidates = Vec::new();
        for f in files {
            let text = read(&f)?;
            let value: serde_json::Value =
                serde_json::from_str(&text).map_err(|source| CompareError::NotJson {
                    path: f.clone(),
                    source,
                })?;
            if value.get("format").and_then(|v| v.as_str()) != Some("vkgdr-bench") {
                continue;
            }
            candidates.push(Loaded {
                results: Results::parse(&f, &text)?,
                path: f,
            });
        }
        Ok(Baseline::Dir {
            path: path.to_path_buf(),
            candidates,
        })
    }

    /// The document to compare a run on `gpu` with.
    fn choose(&self, gpu: Option<&GpuJson>) -> Choice<'_> {
        let (dir, candidates) = match self {
            Baseline::File(l) => {
                return Choice::Chosen {
                    loaded: l,
                    also: Vec::new(),
                }
            }
            Baseline::Dir { path, candidates } => (path, candidates),
        };
        let Some(gpu) = gpu else {
            return Choice::None(format!(
                "the new results name no GPU (no CUDA device 0 in their machine section): no \
                 baseline in {} chosen",
                dir.display()
            ));
        };
        let stem = gpu.baseline_stem();
        // Same card first, then the same model; a file named for the model before others.
        let mut ranked: Vec<(u8, bool, &Loaded)> = candidates
            .iter()
            .filter_map(|l| {
                let g = l.results.gpu()?;
                let rank = if g.uuid.is_some() && g.uuid == gpu.uuid {
                    0
                } else if g.name == gpu.name {
                    1
                } else {
                    return None;
                };
                let named = l.path.file_stem().and_then(|s| s.to_str()) == Some(stem.as_str());
                Some((rank, !named, l))
            })
            .collect();
        ranked.sort_by_key(|&(rank, unnamed, l)| (rank, unnamed, l.path.clone()));
        match ranked.split_first() {
            Some((&(_, _, loaded), rest)) => Choice::Chosen {
                loaded,
                also: rest.iter().map(|(_, _, l)| l.path.as_path()).collect(),
            },
            None => Choice::None(format!(
                "no baseline recorded on {} in {}: nothing compared (record one as {}, see \
                 benches/baselines/README.md)",
                gpu.name,
                dir.display(),
                dir.join(format!("{stem}.json")).display()
            )),
        }
    }
}

// --- The comparison ---------------------------------------------------------------------------------

/// `vkgdr bench compare --json` (and the `comparison` of `vkgdr bench --compare --json`, and
/// `DIR/comparison.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComparisonDocument {
    /// `format: "vkgdr-bench-comparison"`.
    #[serde(flatten)]
    pub about: About,
    /// The earlier run (`null`: no baseline matched, see `note`).
    pub baseline: Option<SideJson>,
    /// The run judged.
    pub current: SideJson,
    /// `same_gpu` (same UUID), `same_model` (same name, another card), `different_gpu`,
    /// `unknown_gpu` (a document names none) or `no_baseline`.
    pub gpu_match: String,
    /// Whether moves are judged: only on the same GPU model. `false`: the figures are
    /// information, nothing is a regression.
    pub judged: bool,
    /// The noise floor, in percent (`--tolerance`).
    pub tolerance_percent: f64,
    /// What the reader should know: why nothing was judged, which other baselines matched.
    pub notes: Vec<String>,
    /// Every figure of either run, the new run's order first.
    pub figures: Vec<FigureComparisonJson>,
    /// How many figures got each verdict.
    pub summary: SummaryJson,
    /// Whether a figure got worse beyond its noise on the same GPU model (exit code 3).
    pub regressed: bool,
}

/// One side of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SideJson {
    /// The file it was read from.
    pub file: String,
    /// CUDA device 0 (`null`: the document names none).
    pub gpu: Option<GpuJson>,
    /// The NVIDIA driver's version.
    pub driver_version: Option<String>,
    /// The driver's CUDA version.
    pub cuda_version: Option<String>,
    /// The CPU's model.
    pub cpu: Option<String>,
    /// The program that wrote it.
    pub vkgdr_version: Option<String>,
    /// `full` or `quick`.
    pub mode: Option<String>,
    /// Benchmarks that did not run to the end.
    pub failed_benchmarks: Vec<String>,
}

/// One figure of either run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FigureComparisonJson {
    /// Its report (`copylat`, ...).
    pub report: String,
    /// What was measured.
    pub method: String,
    /// Bytes per operation (0: no size).
    pub size_bytes: u64,
    /// `ns` or `GB/s`.
    pub unit: String,
    /// Whether a higher figure is better (rates) or a lower one (times).
    pub higher_is_better: bool,
    /// The baseline's median (`null`: not in the baseline).
    pub baseline: Option<f64>,
    /// This run's median (`null`: not in this run).
    pub current: Option<f64>,
    /// `current / baseline` (`null` where either is missing or not positive).
    pub ratio: Option<f64>,
    /// This figure's noise in percent: the floor or its own spread, whichever is larger.
    pub tolerance_percent: f64,
    /// `worse`, `better`, `within_noise`, `only_in_baseline`, `only_in_current` or
    /// `not_comparable` (units differ, or a median is not positive).
    pub verdict: String,
    /// The method of the figure's anchor in this run (the baseline's where this run lacks the
    /// figure): whether the anchor moved as well tells a slower machine from slower code.
    pub anchor_method: Option<String>,
    /// The figure over its anchor in the baseline.
    pub anchor_ratio_baseline: Option<f64>,
    /// The figure over its anchor in this run.
    pub anchor_ratio_current: Option<f64>,
}

/// How many figures got each verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SummaryJson {
    /// Figures in both runs with a verdict (worse + better + within noise).
    pub compared: usize,
    /// Worse beyond their noise.
    pub worse: usize,
    /// Better beyond their noise.
    pub better: usize,
    /// Within their noise.
    pub within_noise: usize,
    /// In the baseline only (a benchmark that failed or was not run, a method renamed).
    pub only_in_baseline: usize,
    /// In this run only.
    pub only_in_current: usize,
    /// In both, but not comparable.
    pub not_comparable: usize,
}

/// A verdict on one figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Worse beyond its noise.
    Worse,
    /// Better beyond its noise.
    Better,
    /// Within its noise.
    WithinNoise,
    /// Only in the baseline.
    OnlyInBaseline,
    /// Only in this run.
    OnlyInCurrent,
    /// Units differ, or a median is not positive.
    NotComparable,
}

impl Verdict {
    /// Its name in the JSON document.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Worse => "worse",
            Verdict::Better => "better",
            Verdict::WithinNoise => "within_noise",
            Verdict::OnlyInBaseline => "only_in_baseline",
            Verdict::OnlyInCurrent => "only_in_current",
            Verdict::NotComparable => "not_comparable",
        }
    }
}

/// How much a figure scatters in one run: half its p10–p90 range relative to its median (0 with
/// fewer than two samples or no percentiles).
pub fn spread(f: &FigureIn) -> f64 {
    match (f.p10, f.p90, f.samples) {
        (Some(p10), Some(p90), Some(n)) if n >= 2 && f.median > 0.0 => {
            let s = (p90 - p10) / (2.0 * f.median);
            if s.is_finite() {
                s.max(0.0)
            } else {
                0.0
            }
        }
        _ => 0.0,
    }
}

/// The verdict on a figure that went from `before` to `now` (medians), with noise `tolerance`
/// (a fraction): the factor by which it got worse is now/before for times and before/now for
/// rates.
pub fn judge(before: f64, now: f64, higher_is_better: bool, tolerance: f64) -> Verdict {
    if !(before > 0.0 && now > 0.0 && before.is_finite() && now.is_finite()) {
        return Verdict::NotComparable;
    }
    let worse_by = if higher_is_better {
        before / now
    } else {
        now / before
    };
    if worse_by > 1.0 + tolerance {
        Verdict::Worse
    } else if worse_by < 1.0 / (1.0 + tolerance) {
        Verdict::Better
    } else {
        Verdict::WithinNoise
    }
}

/// Whether a figure in `unit` (of a report saying `higher_is_better`) is better higher.
fn higher_is_better(unit: &str, report_says: Option<bool>) -> bool {
    match Unit::parse(unit) {
        Some(u) => u == Unit::GigabytesPerSecond,
        None => report_says.unwrap_or(false),
    }
}

fn unit_of(r: &ReportIn, f: &FigureIn) -> String {
    f.unit.clone().unwrap_or_else(|| r.unit.clone())
}

/// A comparison with its text form.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// The document (`--json`, `comparison.json`).
    pub doc: ComparisonDocument,
}

impl Comparison {
    /// Compares `current` (read from `current_file`) with the baseline chosen for it; `floor`
    /// is the noise floor in percent.
    pub fn new(
        baseline: &Baseline,
        current: &Results,
        current_file: &Path,
        floor_percent: u32,
    ) -> Comparison {
        let gpu = current.gpu();
        let mut notes = Vec::new();
        let floor = f64::from(floor_percent) / 100.0;
        let (loaded, also) = match baseline.choose(gpu.as_ref()) {
            Choice::Chosen { loaded, also } => (loaded, also),
            Choice::None(why) => {
                notes.push(why);
                return Comparison {
                    doc: ComparisonDocument {
                        about: About::new(FORMAT),
                        baseline: None,
                        current: current.side(current_file),
                        gpu_match: "no_baseline".into(),
                        judged: false,
                        tolerance_percent: floor * 100.0,
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
        let (gpu_match, judged) = match (old.gpu(), &gpu) {
            (Some(a), Some(b)) if a.uuid.is_some() && a.uuid == b.uuid => ("same_gpu", true),
            (Some(a), Some(b)) if a.name == b.name => ("same_model", true),
            (Some(a), Some(b)) => {
                notes.push(format!(
                    "different GPUs ({} before, {} now): figures shown as information only, \
                     nothing counts as a regression",
                    a.name, b.name
                ));
                ("different_gpu", false)
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
                ("unknown_gpu", false)
            }
        };
        if old.mode.is_some() && current.mode.is_some() && old.mode != current.mode {
            notes.push(format!(
                "the runs' modes differ ({} before, {} now): quick runs measure fewer sizes with \
                 fewer samples",
                old.mode.as_deref().unwrap_or("?"),
                current.mode.as_deref().unwrap_or("?")
            ));
        }
        let figures = pair_up(old, current, floor);
        let mut summary = SummaryJson::default();
        for f in &figures {
            match f.verdict.as_str() {
                "worse" => summary.worse += 1,
                "better" => summary.better += 1,
                "within_noise" => summary.within_noise += 1,
                "only_in_baseline" => summary.only_in_baseline += 1,
                "only_in_current" => summary.only_in_current += 1,
                _ => summary.not_comparable += 1,
            }
        }
        summary.compared = summary.worse + summary.better + summary.within_noise;
        Comparison {
            doc: ComparisonDocument {
                about: About::new(FORMAT),
                baseline: Some(old.side(&loaded.path)),
                current: current.side(current_file),
                gpu_match: gpu_match.into(),
                judged,
                tolerance_percent: floor * 100.0,
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

    /// The comparison as text: a header, a table per report, a summary.
    pub fn text(&self) -> String {
        let d = &self.doc;
        let mut out = String::new();
        let side = |s: &SideJson| {
            let mut parts = vec![s
                .gpu
                .as_ref()
                .map_or_else(|| "GPU unknown".to_string(), GpuJson::describe)];
            if let Some(v) = &s.driver_version {
                parts.push(format!("driver {v}"));
            }
            if let Some(v) = &s.vkgdr_version {
                parts.push(format!("vkgdr {v}"));
            }
            if let Some(m) = &s.mode {
                parts.push(format!("{m} run"));
            }
            if !s.failed_benchmarks.is_empty() {
                parts.push(format!("failed: {}", s.failed_benchmarks.join(", ")));
            }
            parts.join(", ")
        };
        match &d.baseline {
            None => {
                out += &format!("Comparison of {}: no baseline\n", d.current.file);
                for n in &d.notes {
                    out += &format!("  {n}\n");
                }
                return out;
            }
            Some(b) => {
                out += &format!(
                    "Comparison with {} (noise: the larger of {} % and a figure's own spread)\n",
                    b.file,
                    percent(d.tolerance_percent)
                );
                out += &format!("  before: {}\n", side(b));
                out += &format!("  now:    {} ({})\n", side(&d.current), d.current.file);
                out += &format!(
                    "  {}\n",
                    match d.gpu_match.as_str() {
                        "same_gpu" => "the same GPU: moves beyond noise count",
                        "same_model" =>
                            "the same GPU model, another card: moves beyond noise count",
                        _ => "information only: nothing counts as a regression",
                    }
                );
                for n in &d.notes {
                    out += &format!("  note: {n}\n");
                }
            }
        }
        let worse_mark = if d.judged { "WORSE" } else { "worse" };
        let mut report = "";
        let mut rows: Vec<[String; 7]> = Vec::new();
        let flush = |out: &mut String, rows: &mut Vec<[String; 7]>| {
            if rows.len() > 1 {
                out.push_str(&align(rows));
            }
            rows.clear();
        };
        for f in &d.figures {
            if f.report != report {
                flush(&mut out, &mut rows);
                report = &f.report;
                out += &format!(
                    "\n{report} ({}, {} is better)\n",
                    f.unit,
                    if f.higher_is_better {
                        "higher"
                    } else {
                        "lower"
                    }
                );
                rows.push(
                    ["method", "size", "before", "now", "now/before", "noise", ""]
                        .map(String::from),
                );
            }
            let value = |v: Option<f64>| v.map_or_else(|| "–".to_string(), |v| fmt(&f.unit, v));
            let mark = match f.verdict.as_str() {
                "worse" => worse_mark,
                "better" => "better",
                "within_noise" => "",
                "only_in_baseline" => "only before",
                "only_in_current" => "new",
                _ => "not comparable",
            };
            rows.push([
                f.method.clone(),
                fmt_size(f.size_bytes),
                value(f.baseline),
                value(f.current),
                f.ratio
                    .map_or_else(|| "–".to_string(), |r| format!("{}×", sig3(r))),
                format!("±{} %", percent(f.tolerance_percent)),
                mark.to_string(),
            ]);
        }
        flush(&mut out, &mut rows);
        let s = &d.summary;
        out += &format!(
            "\n{} figure(s) compared: {} worse beyond noise, {} better, {} within noise",
            s.compared, s.worse, s.better, s.within_noise
        );
        if s.only_in_baseline + s.only_in_current > 0 {
            out += &format!(
                "; {} only in the baseline, {} only in this run",
                s.only_in_baseline, s.only_in_current
            );
        }
        if s.not_comparable > 0 {
            out += &format!("; {} not comparable", s.not_comparable);
        }
        out += "\n";
        if d.regressed {
            out += &format!(
                "REGRESSION: {} figure(s) got worse beyond their noise on the same GPU model:\n",
                s.worse
            );
            for f in d.figures.iter().filter(|f| f.verdict == "worse") {
                let (b, c) = (f.baseline.unwrap_or(0.0), f.current.unwrap_or(0.0));
                out += &format!(
                    "  {} / {} @ {}: {} → {} ({}× the {}; noise ±{} %)\n",
                    f.report,
                    f.method,
                    fmt_size(f.size_bytes),
                    fmt(&f.unit, b),
                    fmt(&f.unit, c),
                    sig3(c / b),
                    if f.higher_is_better { "rate" } else { "time" },
                    percent(f.tolerance_percent)
                );
                if let (Some(m), Some(rb), Some(rc)) = (
                    &f.anchor_method,
                    f.anchor_ratio_baseline,
                    f.anchor_ratio_current,
                ) {
                    // The same ratio against the anchor means the machine moved, not the code.
                    out += &format!(
                        "    against {m:?} in the same run: {}× before, {}× now\n",
                        sig3(rb),
                        sig3(rc)
                    );
                }
            }
        } else if d.judged {
            out += "No figure got worse beyond its noise.\n";
        } else {
            out += "Information only: the GPUs differ or are unknown, nothing is judged.\n";
        }
        out
    }
}

/// A percentage: whole where it is whole (`10`), else to a tenth (`12.5`).
fn percent(p: f64) -> String {
    if (p - p.round()).abs() < 0.05 {
        format!("{p:.0}")
    } else {
        format!("{p:.1}")
    }
}

/// A value in its unit, for a table cell.
fn fmt(unit: &str, v: f64) -> String {
    match Unit::parse(unit) {
        Some(Unit::Nanoseconds) => Unit::Nanoseconds.format(v),
        Some(Unit::GigabytesPerSecond) => format!("{} GB/s", sig3(v)),
        None => format!("{} {unit}", sig3(v)),
    }
}

/// Rows as aligned text: the first column left, the others right, the last (the mark) left.
fn align(rows: &[[String; 7]]) -> String {
    let mut widths = [0usize; 7];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::from("  ");
        for (i, (c, w)) in r.iter().zip(widths).enumerate() {
            let fill = " ".repeat(w - c.chars().count());
            if i == 0 || i == 6 {
                line += &format!("{c}{fill}  ");
            } else {
                line += &format!("{fill}{c}  ");
            }
        }
        out += line.trim_end();
        out.push('\n');
    }
    out
}

type Key<'a> = (&'a str, &'a str, u64);

/// Pairs the figures of both runs by report, method and size: the new run's order, each report
/// followed by the baseline's figures of that report that this run lacks, then the baseline's
/// reports this run lacks.
fn pair_up(old: &Results, new: &Results, floor: f64) -> Vec<FigureComparisonJson> {
    let before = old.figures();
    let mut used = vec![false; before.len()];
    let mut index: HashMap<Key<'_>, Vec<usize>> = HashMap::new();
    for (i, (r, f)) in before.iter().enumerate() {
        index
            .entry((r.name.as_str(), f.method.as_str(), f.size_bytes))
            .or_default()
            .push(i);
    }
    let mut out = Vec::new();
    let leftovers = |report: Option<&str>, used: &mut [bool], out: &mut Vec<_>| {
        for (i, (r, f)) in before.iter().enumerate() {
            if !used[i] && report.is_none_or(|name| r.name == name) {
                used[i] = true;
                out.push(one_side(r, f, floor, Verdict::OnlyInBaseline));
            }
        }
    };
    let after = new.figures();
    for (k, &(r, f)) in after.iter().enumerate() {
        let key = (r.name.as_str(), f.method.as_str(), f.size_bytes);
        let matched = index
            .get_mut(&key)
            .and_then(|v| (!v.is_empty()).then(|| v.remove(0)));
        match matched {
            Some(i) => {
                used[i] = true;
                out.push(both(before[i], (r, f), floor));
            }
            None => out.push(one_side(r, f, floor, Verdict::OnlyInCurrent)),
        }
        let last_of_report = after.get(k + 1).is_none_or(|(next, _)| next.name != r.name);
        if last_of_report {
            leftovers(Some(&r.name), &mut used, &mut out);
        }
    }
    leftovers(None, &mut used, &mut out);
    out
}

fn one_side(r: &ReportIn, f: &FigureIn, floor: f64, v: Verdict) -> FigureComparisonJson {
    let unit = unit_of(r, f);
    let (baseline, current) = match v {
        Verdict::OnlyInBaseline => (Some(f.median), None),
        _ => (None, Some(f.median)),
    };
    let anchor_ratio = f.anchor.as_ref().and_then(|a| a.ratio);
    FigureComparisonJson {
        report: r.name.clone(),
        method: f.method.clone(),
        size_bytes: f.size_bytes,
        higher_is_better: higher_is_better(&unit, r.higher_is_better),
        unit,
        baseline,
        current,
        ratio: None,
        tolerance_percent: floor.max(spread(f)) * 100.0,
        verdict: v.name().into(),
        anchor_method: f.anchor.as_ref().map(|a| a.method.clone()),
        anchor_ratio_baseline: anchor_ratio.filter(|_| v == Verdict::OnlyInBaseline),
        anchor_ratio_current: anchor_ratio.filter(|_| v == Verdict::OnlyInCurrent),
    }
}

fn both(
    (ro, fo): (&ReportIn, &FigureIn),
    (rn, fn_): (&ReportIn, &FigureIn),
    floor: f64,
) -> FigureComparisonJson {
    let (uo, un) = (unit_of(ro, fo), unit_of(rn, fn_));
    let hib = higher_is_better(&un, rn.higher_is_better);
    let tolerance = floor.max(spread(fo)).max(spread(fn_));
    let verdict = if uo == un {
        judge(fo.median, fn_.median, hib, tolerance)
    } else {
        Verdict::NotComparable
    };
    let ratio = fn_.median / fo.median;
    FigureComparisonJson {
        report: rn.name.clone(),
        method: fn_.method.clone(),
        size_bytes: fn_.size_bytes,
        unit: un,
        higher_is_better: hib,
        baseline: Some(fo.median),
        current: Some(fn_.median),
        ratio: (verdict != Verdict::NotComparable && ratio.is_finite()).then_some(ratio),
        tolerance_percent: tolerance * 100.0,
        verdict: verdict.name().into(),
        anchor_method: fn_
            .anchor
            .as_ref()
            .or(fo.anchor.as_ref())
            .map(|a| a.method.clone()),
        anchor_ratio_baseline: fo.anchor.as_ref().and_then(|a| a.ratio),
        anchor_ratio_current: fn_.anchor.as_ref().and_then(|a| a.ratio),
    }
}

// --- The command ------------------------------------------------------------------------------------

/// `vkgdr bench compare`'s command line.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct CompareArgs {
    /// The earlier results: a results.json (or `vkgdr bench --json` output), or a directory of
    /// them such as benches/baselines (the one recorded on NEW's GPU model is chosen)
    #[arg(value_name = "BASELINE", value_parser = NonEmptyStringValueParser::new().map(PathBuf::from))]
    pub baseline: PathBuf,

    /// The results to judge: a results.json, or the --out directory that holds one
    #[arg(value_name = "NEW", value_parser = NonEmptyStringValueParser::new().map(PathBuf::from))]
    pub current: PathBuf,

    /// The noise floor: the smallest change, in percent, that counts as a move (a figure's own
    /// spread can widen it)
    #[arg(long, value_name = "PCT", default_value_t = DEFAULT_TOLERANCE_PERCENT,
          value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub tolerance: u32,

    /// Print the comparison as one JSON document on stdout (the table goes to stderr)
    #[arg(long)]
    pub json: bool,
}

/// `vkgdr bench compare BASELINE NEW`.
pub fn main(args: &CompareArgs) -> ExitCode {
    let loaded = Baseline::open(&args.baseline).and_then(|b| {
        let file = if args.current.is_dir() {
            args.current.join(RESULTS_JSON)
        } else {
            args.current.clone()
        };
        Ok((b, Results::load(&args.current)?, file))
    });
    let (baseline, current, file) = match loaded {
        Ok(l) => l,
        Err(e) => {
            alert!("vkgdr bench compare: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let c = Comparison::new(&baseline, &current, &file, args.tolerance);
    ui::out(&c.text());
    if args.json {
        ui::document(&json::to_text(&c.doc));
    }
    ExitCode::from(c.exit_code())
}

/// A bench document with the comparison of its run: what `vkgdr bench --compare --json` prints.
#[derive(Debug, Serialize)]
pub struct WithComparison<'a> {
    /// The run.
    #[serde(flatten)]
    pub results: &'a BenchDocument,
    /// Its comparison with the baseline.
    pub comparison: &'a ComparisonDocument,
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn verdicts_follow_the_unit_direction_and_the_noise() {
        // Times: lower is better.
        assert_eq!(judge(100.0, 180.0, false, 0.1), Verdict::Worse);
        assert_eq!(judge(100.0, 109.0, false, 0.1), Verdict::WithinNoise);
        assert_eq!(judge(100.0, 111.0, false, 0.1), Verdict::Worse);
        assert_eq!(judge(100.0, 80.0, false, 0.1), Verdict::Better);
        assert_eq!(judge(100.0, 92.0, false, 0.1), Verdict::WithinNoise);
        // Rates: higher is better; the same factors, the other way.
        assert_eq!(judge(10.0, 5.0, true, 0.1), Verdict::Worse);
        assert_eq!(judge(10.0, 20.0, true, 0.1), Verdict::Better);
        assert_eq!(judge(10.0, 9.5, true, 0.1), Verdict::WithinNoise);
        // Nothing to divide by.
        assert_eq!(judge(0.0, 5.0, true, 0.1), Verdict::NotComparable);
        assert_eq!(judge(5.0, f64::NAN, true, 0.1), Verdict::NotComparable);
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
        for (spread, verdict, noise) in [(0.02, "worse", 10.0), (0.3, "within_noise", 30.0)] {
            let old = results(gpu, "ns", vec![fig("m", 8, 100.0, spread)]);
            let new = results(gpu, "ns", vec![fig("m", 8, 125.0, 0.01)]);
            let c = Comparison::new(
                &Baseline::File(Loaded {
                    path: "old".into(),
                    results: old,
                }),
                &new,
                Path::new("new"),
                10,
            );
            assert_eq!(c.doc.figures[0].verdict, verdict);
            assert!((c.doc.figures[0].tolerance_percent - noise).abs() < 1e-9);
            assert_eq!(c.doc.figures[0].ratio, Some(1.25));
        }
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
        let c = Comparison::new(
            &Baseline::File(Loaded {
                path: "old".into(),
                results: old,
            }),
            &new,
            Path::new("new"),
            10,
        );
        let got: Vec<(&str, u64, &str)> = c
            .doc
            .figures
            .iter()
            .map(|f| (f.method.as_str(), f.size_bytes, f.verdict.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("a", 16, "worse"),
                ("a", 8, "within_noise"),
                ("new", 8, "only_in_current"),
                ("gone", 8, "only_in_baseline"),
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
                only_in_baseline: 1,
                only_in_current: 1,
                not_comparable: 0,
            }
        );
        assert_eq!(c.doc.gpu_match, "same_gpu");
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
        let c = Comparison::new(
            &Baseline::File(Loaded {
                path: "old".into(),
                results: old,
            }),
            &new,
            Path::new("new"),
            10,
        );
        let v: Vec<&str> = c.doc.figures.iter().map(|f| f.verdict.as_str()).collect();
        assert_eq!(v, ["not_comparable", "within_noise"]);
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
    fn baseline_stems() {
        let g = |name: &str| GpuJson {
            name: name.into(),
            uuid: None,
        };
        assert_eq!(
            g("NVIDIA H100 80GB HBM3").baseline_stem(),
            "nvidia-h100-80gb-hbm3"
        );
        assert_eq!(
            g("  NVIDIA A100-SXM4-40GB ").baseline_stem(),
            "nvidia-a100-sxm4-40gb"
        );
    }
}

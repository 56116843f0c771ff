//! The comparison as a document ([`ComparisonDocument`]): what `xtask compare-bench --json`
//! prints.

use serde::{Deserialize, Serialize};

use super::noise::Verdict;
use super::results::SideJson;
use vkgdr_lab::json::document::About;

/// `format` of the comparison document.
pub const FORMAT: &str = "vkgdr-bench-comparison";

/// `xtask compare-bench --json` (scripts/gpu-check writes it to `OUT/bench/comparison.json`).
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
    pub gpu_match: GpuMatch,
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

/// How the GPUs of the two runs match, named in the JSON document in snake case (`same_gpu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuMatch {
    /// The same card (same UUID): moves are judged.
    SameGpu,
    /// The same model (same name), another card: moves are judged.
    SameModel,
    /// Different models: information only.
    DifferentGpu,
    /// A document names no GPU: information only.
    UnknownGpu,
    /// No baseline matched.
    NoBaseline,
}

impl GpuMatch {
    /// Whether moves are judged: only on the same GPU model.
    pub fn judged(self) -> bool {
        match self {
            GpuMatch::SameGpu | GpuMatch::SameModel => true,
            GpuMatch::DifferentGpu | GpuMatch::UnknownGpu | GpuMatch::NoBaseline => false,
        }
    }
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
    /// This figure's noise in percent: the floor or its own spread in either run, whichever is
    /// larger, plus an allowance where it has few samples
    /// ([`noise_percent`](super::noise::noise_percent)).
    pub tolerance_percent: f64,
    /// `worse`, `better`, `within_noise`, `machine_moved` (a driver or hardware figure that moved
    /// beyond its noise: never a regression), `moved_with_driver` (a library figure that moved
    /// beyond its noise with the machine work it is made of, driver calls or raw BAR copies, not
    /// against it: never a regression),
    /// `only_in_baseline`, `only_in_current` or `not_comparable` (units differ, or a median is not
    /// positive).
    pub verdict: Verdict,
    /// The machine work this figure is made of (driver calls, or the same copy as a plain loop of
    /// BAR stores or loads; the key's name is older than the BAR rows), measured in both runs, and
    /// its move against it (`null`: the registry names none for it, or a run lacks it). With it,
    /// the figure is worse (better) only when both `ratio` and `driver_work.anchored_ratio` are
    /// beyond their noise.
    #[serde(default)]
    pub driver_work: Option<DriverWorkJson>,
    /// The method of the figure's anchor in this run (the baseline's where this run lacks the
    /// figure): whether the anchor moved as well tells a slower machine from slower code.
    pub anchor_method: Option<String>,
    /// The figure over its anchor in the baseline.
    pub anchor_ratio_baseline: Option<f64>,
    /// The figure over its anchor in this run.
    pub anchor_ratio_current: Option<f64>,
}

/// The machine work a library figure is made of (the machine rows the registry names, at the
/// figure's size, added up), in both runs, and the figure's move against it: its *anchored* move.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriverWorkJson {
    /// The rows' methods (in the figure's report, at its size).
    pub methods: Vec<String>,
    /// Their medians added up, in the baseline.
    pub baseline: f64,
    /// Their medians added up, in this run.
    pub current: f64,
    /// `current / baseline`: how much the machine work moved.
    pub ratio: f64,
    /// The figure's `ratio` divided by the machine work's: its move with the machine's driver or
    /// BAR taken out.
    pub anchored_ratio: f64,
    /// The anchored move's noise in percent: the figure's or the machine work's (its rows' spread
    /// and samples), whichever is larger.
    pub tolerance_percent: f64,
    /// The anchored move alone: `worse`, `better` or `within_noise`.
    pub verdict: Verdict,
}

/// How many figures got each verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SummaryJson {
    /// Figures in both runs with a verdict (worse + better + within noise + machine moved + moved
    /// with driver).
    pub compared: usize,
    /// Worse beyond their noise.
    pub worse: usize,
    /// Better beyond their noise.
    pub better: usize,
    /// Within their noise.
    pub within_noise: usize,
    /// Figures of the driver or the hardware alone that moved beyond their noise.
    #[serde(default)]
    pub machine_moved: usize,
    /// Library figures that moved beyond their noise with the machine work they are made of.
    #[serde(default)]
    pub moved_with_driver: usize,
    /// In the baseline only (a benchmark that failed or was not run, a method renamed).
    pub only_in_baseline: usize,
    /// In this run only.
    pub only_in_current: usize,
    /// In both, but not comparable.
    pub not_comparable: usize,
}

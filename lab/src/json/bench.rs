//! `vkgdr bench --json` ([`BenchDocument`], also `DIR/results.json`): each benchmark run with its
//! reports ([`Report`]: every figure with the anchor it is compared with, measured in the same
//! run), as the benchmarks made them.

use serde::{Deserialize, Serialize};

use super::document::About;
use super::machine::{DeviceJson, MachineJson};
use crate::bench::report::model::Report;

/// `vkgdr bench --json` (also written to `DIR/results.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchDocument {
    /// `format: "vkgdr-bench"`.
    #[serde(flatten)]
    pub about: About,
    /// `full`, or `quick` (`--quick`: fewer sizes and repetitions).
    pub mode: String,
    /// Where the CSVs, charts and summary went.
    pub out_dir: String,
    /// The device measured (`--device`): its CUDA ordinal, UUID and name; `null` if no
    /// benchmark opened one (documents of earlier versions lack it: they measured device 0).
    #[serde(default)]
    pub device: Option<DeviceJson>,
    /// The machine, looked at after the first benchmark (so `apiperf` still meets a cold
    /// process); `null` if no benchmark ran.
    pub machine: Option<MachineJson>,
    /// Each benchmark run, in order.
    pub benchmarks: Vec<BenchRun>,
    /// What stopped the run outside any benchmark (an output file that could not be written).
    pub error: Option<String>,
    /// Whether every benchmark ran to the end and every output was written.
    pub ok: bool,
}

/// One benchmark of a `vkgdr bench` run: its reports, or what stopped it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRun {
    /// Its name (`copybw`, ...).
    pub name: String,
    /// How long it took (0 where a document does not say).
    #[serde(default)]
    pub seconds: f64,
    /// What stopped it (`null`: it ran to the end).
    pub error: Option<String>,
    /// Its reports (none when it failed at once; those it finished when it failed in part).
    pub reports: Vec<Report>,
}

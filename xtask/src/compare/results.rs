//! A `vkgdr-bench` document as a comparison reads it ([`Results`]): the benchmarks' own
//! [`BenchRun`]s of [`Report`]s and [`Figure`]s, and of the
//! rest only what a comparison shows, each optional where it can be, so that baselines recorded by
//! older programs stay readable when the machine section grows; a file that is no such document
//! is named with what it is instead.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::CompareError;
use vkgdr_lab::bench::outputs::RESULTS_JSON;
use vkgdr_lab::bench::report::model::{Figure, Report};
use vkgdr_lab::json::bench::BenchRun;
use vkgdr_lab::json::document::FORMAT_VERSION;

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
    /// The device measured (absent from documents of earlier versions: device 0).
    #[serde(default)]
    pub device: Option<DeviceIn>,
    /// The machine it ran on.
    #[serde(default)]
    pub machine: Option<MachineIn>,
    /// The benchmarks, with their reports.
    pub benchmarks: Vec<BenchRun>,
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
    /// CUDA ordinal (documents without a `device` measured 0).
    pub ordinal: i32,
    /// Its name.
    pub name: String,
    /// Its UUID.
    #[serde(default)]
    pub uuid: Option<String>,
}

/// The device a run measured.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DeviceIn {
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

    /// The GPU the benchmarks ran on: the document's `device`, or (documents of earlier
    /// versions, which measured it) CUDA device 0 of its machine section.
    pub fn gpu(&self) -> Option<GpuJson> {
        if let Some(d) = &self.device {
            return Some(GpuJson {
                name: d.name.clone(),
                uuid: d.uuid.clone(),
            });
        }
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

    /// This document as one side of a comparison (`file`: where it was read from).
    pub(super) fn side(&self, file: &Path) -> SideJson {
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
    pub(super) fn figures(&self) -> Vec<(&Report, &Figure)> {
        self.benchmarks
            .iter()
            .flat_map(|b| &b.reports)
            .flat_map(|r| r.figures.iter().map(move |f| (r, f)))
            .filter(|(_, f)| !f.is_reference())
            .collect()
    }
}

/// The text of the file `path`.
pub(super) fn read(path: &Path) -> Result<String, CompareError> {
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

/// One side of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SideJson {
    /// The file it was read from.
    pub file: String,
    /// The GPU measured (`null`: the document names none).
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

/// A GPU, as documents name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuJson {
    /// Its name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Its UUID.
    pub uuid: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::repo_path;
    use vkgdr_lab::bench::report::model::Origin;

    #[test]
    fn every_committed_baseline_reads_as_the_benchmarks_figures() {
        let dir = repo_path("benches/baselines");
        let mut read = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let results = Results::load(&path).unwrap_or_else(|e| panic!("{e}"));
            let figures = results.figures();
            assert!(figures.len() > 100, "{}: {}", path.display(), figures.len());
            assert!(figures.iter().all(|(r, f)| {
                !r.name.is_empty() && f.median.is_finite() && f.origin != Origin::Reference
            }));
            assert!(results.gpu().is_some(), "{}", path.display());
            read += 1;
        }
        assert!(read >= 1, "no baseline in {}", dir.display());
    }
}

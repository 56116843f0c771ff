//! What `BASELINE` names ([`Baseline`]): one results file, compared whatever GPU it ran on, or a
//! directory of them (`benches/baselines`) from which the one recorded on the new run's GPU is
//! chosen: the same card first, then the same model, a file named for the model
//! ([`GpuJson::baseline_stem`]) before others.

use std::path::{Path, PathBuf};

use super::error::CompareError;
use super::results::GpuJson;
use super::results::{read, Results};

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
pub(super) enum Choice<'a> {
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
    pub(super) fn choose(&self, gpu: Option<&GpuJson>) -> Choice<'_> {
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
                "the new results name no GPU (no device measured, no CUDA device 0 in their \
                 machine section): no baseline in {} chosen",
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
}

#[cfg(test)]
mod tests {
    use super::*;

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

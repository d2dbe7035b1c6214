//! Layout of the fitted models under `calibration/` (small JSON, embedded in the binary by
//! build.rs; a directory on disk can stand in for them):
//!
//! - `roofline.json`: the baseline's constant efficiency per op class;
//! - `target/<gpu>.json`: models fitted on that GPU's own measurements;
//! - `cross-gen/all.json`: fitted on every measured GPU (for GPUs with no measurements);
//! - `cross-gen/no_<gpu>.json`: fitted with that GPU left out, so its cross-gen prediction never
//!   uses its own measurements;
//! - `manifest.json`: what data produced them.

use super::model::ModelSet;
use crate::perf::roofline::RooflineParams;
use anyhow::{Context, Result};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::path::{Path, PathBuf};

include!(concat!(env!("OUT_DIR"), "/embedded_calibration.rs"));

/// The baseline's fitted constants and what they were fitted on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RooflineFile {
    pub params: RooflineParams,
    pub fitted_on: Vec<String>,
    pub rows: usize,
}

/// Where calibration files are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    /// The copy built into the binary.
    Embedded,
    Dir(PathBuf),
}

pub fn target_path(gpu: &str) -> String {
    format!("target/{gpu}.json")
}

pub fn cross_gen_path(held_out: Option<&str>) -> String {
    match held_out {
        Some(g) => format!("cross-gen/no_{g}.json"),
        None => "cross-gen/all.json".to_string(),
    }
}

pub const ROOFLINE_PATH: &str = "roofline.json";
pub const MANIFEST_PATH: &str = "manifest.json";

impl Store {
    /// Text of `rel` (a path relative to `calibration/`), None when absent.
    pub fn text(&self, rel: &str) -> Result<Option<String>> {
        match self {
            Store::Embedded => Ok(EMBEDDED_CALIBRATION.iter().find(|(p, _)| *p == rel).map(|(_, t)| t.to_string())),
            Store::Dir(d) => {
                let p = d.join(rel);
                if !p.is_file() {
                    return Ok(None);
                }
                std::fs::read_to_string(&p).map(Some).with_context(|| format!("reading {}", p.display()))
            }
        }
    }

    pub fn read<T: DeserializeOwned>(&self, rel: &str) -> Result<Option<T>> {
        let Some(text) = self.text(rel)? else { return Ok(None) };
        let v = serde_json::from_str(&text).with_context(|| format!("parsing calibration file {} ({})", rel, self.describe()))?;
        Ok(Some(v))
    }

    pub fn model_set(&self, rel: &str) -> Result<Option<ModelSet>> {
        self.read(rel)
    }

    pub fn describe(&self) -> String {
        match self {
            Store::Embedded => "built into the binary".to_string(),
            Store::Dir(d) => d.display().to_string(),
        }
    }
}

/// Writes `value` as compact JSON at `dir/rel`, creating folders.
pub fn write_json<T: Serialize>(dir: &Path, rel: &str, value: &T) -> Result<()> {
    let p = dir.join(rel);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let text = serde_json::to_string(value)?;
    std::fs::write(&p, text + "\n").with_context(|| format!("writing {}", p.display()))
}

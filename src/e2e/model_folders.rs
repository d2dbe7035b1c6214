//! The model folders of a trace folder (`ROOT/<model>/model.json` and `config.json`, written by
//! `microbench/e2e/unpack.py`), read for the reports that set a model's logged memory against the
//! memory plan (`kv_capacity`, `peak_memory`).

use crate::model::ModelConfig;
use anyhow::{Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

pub struct ModelFolder {
    pub path: PathBuf,
    /// The folder's name: the model label (`-L<layers>` where cut).
    pub label: String,
    /// `trace folder/model`, e.g. `h200_sxm_vllm19/qwen3-8b`.
    pub run: String,
    pub model_json: Value,
    pub model_json_path: PathBuf,
}

impl ModelFolder {
    /// The config actually run (`config.json`).
    pub fn config(&self) -> Result<ModelConfig> {
        let path = self.path.join("config.json");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        ModelConfig::from_hf_json(&text, &self.label, &path.display().to_string())
    }
}

/// Every sub-folder of `dir` with a `model.json`, in name order, its `model.json` parsed.
pub fn model_folders(dir: &Path) -> Result<Vec<ModelFolder>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?.flatten().map(|e| e.path()).collect();
    paths.sort();
    let trace = dir.file_name().unwrap_or_default().to_string_lossy().to_string();
    paths
        .into_iter()
        .filter(|p| p.join("model.json").is_file())
        .map(|path| {
            let model_json_path = path.join("model.json");
            let text = std::fs::read_to_string(&model_json_path).with_context(|| format!("reading {}", model_json_path.display()))?;
            let model_json = serde_json::from_str(&text).with_context(|| format!("parsing {}", model_json_path.display()))?;
            let label = path.file_name().unwrap_or_default().to_string_lossy().to_string();
            Ok(ModelFolder { run: format!("{trace}/{label}"), label, model_json, model_json_path, path })
        })
        .collect()
}

/// A trace folder's GPU id, read from its `env-*.json` files on first use only (folders holding
/// no model a report needs are never asked).
pub struct FolderGpu<'a> {
    dir: &'a Path,
    id: Option<String>,
}

impl<'a> FolderGpu<'a> {
    pub fn new(dir: &'a Path) -> FolderGpu<'a> {
        FolderGpu { dir, id: None }
    }

    pub fn id(&mut self) -> Result<String> {
        if self.id.is_none() {
            self.id = Some(super::traces::folder_gpu(self.dir)?);
        }
        Ok(self.id.clone().expect("set above"))
    }
}

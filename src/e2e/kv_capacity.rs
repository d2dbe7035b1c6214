//! KV-cache capacity: the blocks vLLM allocated in the recorded runs (its memory profiling,
//! logged as `num_gpu_blocks` in each model's `model.json`) against `kernels::memory::plan` for
//! the same model, GPU and engine settings. Nothing here is fitted on these counts.

use crate::deployment::Deployment;
use crate::hardware::load_gpu;
use crate::kernels::memory;
use super::model_folders::{model_folders, FolderGpu};
use crate::sim::kv::KvLayout;
use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;
use std::path::Path;

#[derive(Debug, Clone, Serialize)]
pub struct KvCapacityRow {
    /// `folder/model`, e.g. `h200_sxm_vllm19/qwen3-8b`.
    pub run: String,
    pub gpu: String,
    pub gpu_memory_utilization: f64,
    pub measured_blocks: u64,
    pub predicted_blocks: u64,
    pub ape_pct: f64,
}

/// One row per vLLM model folder under `dirs` whose `model.json` logs `num_gpu_blocks`; folders
/// repeating the same model, GPU, settings and count (reruns on other machines) count once.
pub fn validate(dirs: &[impl AsRef<Path>]) -> Result<Vec<KvCapacityRow>> {
    let mut rows: Vec<KvCapacityRow> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for dir in dirs {
        let dir = dir.as_ref();
        let mut gpu = FolderGpu::new(dir);
        for folder in model_folders(dir)? {
            let (v, path) = (&folder.model_json, &folder.model_json_path);
            if v.get("engine").and_then(Value::as_str) != Some("vllm") {
                continue;
            }
            let Some(field) = v.get("num_gpu_blocks") else { continue };
            let measured = field.as_u64().filter(|&n| n > 0).with_context(|| format!("{}: field 'num_gpu_blocks' must be a positive integer, got {field}", path.display()))?;
            let kwargs = v.get("engine_kwargs").with_context(|| format!("{}: field 'engine_kwargs' missing", path.display()))?;
            let num = |field: &str| -> Result<u64> {
                kwargs.get(field).and_then(Value::as_u64).with_context(|| format!("{}: field 'engine_kwargs.{field}' must be a positive integer", path.display()))
            };
            let util = kwargs.get("gpu_memory_utilization").and_then(Value::as_f64).unwrap_or(0.9);
            let (block_size, max_batched, tp) = (num("block_size")?, num("max_num_batched_tokens")?, num("tensor_parallel_size").unwrap_or(1));
            let gpu_id = gpu.id()?;
            if !seen.insert((folder.label.clone(), gpu_id.clone(), measured, block_size, max_batched, tp, util.to_bits())) {
                continue;
            }
            let model = folder.config()?;
            let gpu_spec = load_gpu(&gpu_id)?;
            let dep = Deployment { tp, ..Deployment::default() };
            let plan = memory::plan(&model, &gpu_spec, &dep, util, max_batched, memory::EngineBuffers::Paged)
                .with_context(|| format!("{}: memory plan", path.display()))?;
            let predicted = KvLayout::of(&model, block_size as u32).pool_pages(plan.kv_capacity_tokens, block_size as u32) as u64;
            rows.push(KvCapacityRow {
                run: folder.run.clone(),
                gpu: gpu_id,
                gpu_memory_utilization: util,
                measured_blocks: measured,
                predicted_blocks: predicted,
                ape_pct: 100.0 * (predicted as f64 - measured as f64).abs() / measured as f64,
            });
        }
    }
    Ok(rows)
}

pub fn render(rows: &[KvCapacityRow]) -> String {
    let apes: Vec<f64> = rows.iter().map(|r| r.ape_pct).collect();
    let e = super::stats::ErrorStats::of(&apes);
    let mut s = format!(
        "KV-cache capacity: blocks vLLM allocated (its logged num_gpu_blocks) vs the memory plan, {} models: APE % median {:.2}, p90 {:.2}, max {:.2}\n",
        rows.len(),
        e.median_ape,
        e.p90_ape,
        e.max_ape
    );
    s += &format!("  {:<40} {:<9} {:>5} {:>10} {:>10} {:>7}\n", "run", "gpu", "util", "measured", "predicted", "APE %");
    for r in rows {
        s += &format!("  {:<40} {:<9} {:>5.2} {:>10} {:>10} {:>7.2}\n", r.run, r.gpu, r.gpu_memory_utilization, r.measured_blocks, r.predicted_blocks, r.ape_pct);
    }
    s
}

//! transformers' peak GPU memory: the allocator's peak in the recorded runs (`model.json`
//! `max_memory_gib`, torch's `max_memory_allocated` over a model's runs, the engine's warm-up
//! step at the largest shape included) against `kernels::memory` for the same model, GPU, pinned
//! pages and engine settings, with transformers' own memory check (the polynomial of its
//! `PagedAttentionMemoryHandler`) as the baseline. Models whose process also ran static
//! `generate` batches are left out: those batches, not the engine, may set their peak.

use crate::deployment::Deployment;
use crate::kernels::memory::{self, EngineBuffers, RUNTIME_RESERVE_BYTES};
use super::model_folders::{model_folders, FolderGpu};
use crate::model::ModelConfig;
use crate::schema::Dtype;
use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;
use std::path::Path;

const GIB: f64 = (1u64 << 30) as f64;

/// Trace folders whose peaks the plan's transformers terms were read from (the KV copy and
/// the bf16 logits: the depth pairs of `h200_sxm_eager_layers11`, the per-run records of
/// `h100_sxm_memory47`): their rows are calibration rows, like those of models with attention
/// sinks (whose score-tensor counts were fitted on their peaks).
const TERMS_READ_FROM: [&str; 2] = ["h200_sxm_eager_layers11", "h100_sxm_memory47"];

#[derive(Debug, Clone, Serialize)]
pub struct PeakMemoryRow {
    /// `folder/model`, e.g. `h200_sxm_eager_layers11/llama-3.1-8b`.
    pub run: String,
    pub gpu: String,
    pub cuda_graphs: bool,
    /// `calibration` for models with attention sinks and for the folders of `TERMS_READ_FROM`,
    /// `held-out` for the rest.
    pub split: &'static str,
    pub measured_gib: f64,
    pub predicted_gib: f64,
    pub ape_pct: f64,
    /// Weights plus transformers' memory-check polynomial for the same pages and budget.
    pub transformers_check_gib: f64,
    pub transformers_check_ape_pct: f64,
}

/// The rows, and the folders left out because a run failed (an out-of-memory step cuts the
/// peak short of what the plan would need).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PeakMemoryReport {
    pub rows: Vec<PeakMemoryRow>,
    pub failed: Vec<String>,
}

/// One row per transformers model folder under `dirs` with a recorded peak and no failed run;
/// a deployment whose allocator peaked at the same byte in another folder counts once.
pub fn validate(dirs: &[impl AsRef<Path>]) -> Result<PeakMemoryReport> {
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for dir in dirs {
        let dir = dir.as_ref();
        let mut gpu = FolderGpu::new(dir);
        for folder in model_folders(dir)?.into_iter().filter(|f| f.path.join("runs.jsonl").is_file()) {
            let (v, path) = (&folder.model_json, &folder.model_json_path);
            let engine = v.get("engine").and_then(Value::as_str).unwrap_or("hf");
            if engine != "hf" || v.get("static_s").is_some() || folder.path.join("static.jsonl").is_file() || v.get("status").and_then(Value::as_str) != Some("ok") {
                continue;
            }
            let peak_gib = match v.get("max_memory_gib") {
                None | Some(Value::Null) => continue,
                Some(x) => x.as_f64().filter(|g| *g > 0.0 && g.is_finite()).with_context(|| format!("{}: field 'max_memory_gib' must be a positive number of GiB, got {x}", path.display()))?,
            };
            let runs = runs_with_cache(&folder.path.join("runs.jsonl"))?;
            let Some(run) = runs.first() else { continue };
            if runs.iter().any(|r| r.get("status").and_then(Value::as_str) == Some("failed")) {
                failed.push(folder.run.clone());
                continue;
            }
            let origin = folder.path.join("runs.jsonl").display().to_string();
            let cache = &run["cache"];
            let field = |v: &Value, name: &str| -> Result<u64> {
                v.get(name).and_then(Value::as_u64).filter(|&n| n > 0).with_context(|| format!("{origin}: field '{name}' must be a positive integer"))
            };
            let (pages, block, max_tokens) = (field(cache, "num_blocks")?, field(cache, "block_size")?, field(cache, "max_batch_tokens")?);
            let tp = run.pointer("/engine_requested/tp").and_then(Value::as_u64).unwrap_or(1).max(1);
            // The peak spans every run of the process: a graph run's buffers count if any ran.
            let graph_run = runs.iter().find(|r| super::traces::uses_cuda_graphs(r.pointer("/engine_resolved/use_cuda_graph")));
            let graphs = graph_run.is_some();
            let kv_pad = graph_run.and_then(|r| r.pointer("/engine_resolved/kv_padding_interval_size")).and_then(Value::as_u64);
            let gpu_id = gpu.id()?;
            // The allocator is deterministic: a plan rerun on another GPU peaks at the same byte
            // (the H100 eager calls against the H200's), so such a repeat counts once.
            if !seen.insert((folder.label.clone(), pages, block, max_tokens, tp, graphs, peak_gib.to_bits())) {
                continue;
            }
            let model = folder.config()?;
            let dep = Deployment { tp, ..Deployment::default() };
            dep.check_split(&model)?;
            let buffers = EngineBuffers::PackedSdpa { kv_pad_tokens: kv_pad };
            let kv_tokens = plan_kv_tokens(&model, pages * block);
            let weights = memory::weight_bytes_per_gpu(&model, &dep);
            let predicted = weights + kv_tokens * memory::kv_pool_bytes_per_token_per_gpu(&model, &dep, max_tokens, buffers)
                + memory::step_peak_bytes_per_gpu(&model, &dep, max_tokens, buffers)
                - RUNTIME_RESERVE_BYTES;
            let check = weights + transformers_check_bytes(&model, &dep, pages * block, max_tokens);
            let measured = peak_gib * GIB;
            rows.push(PeakMemoryRow {
                run: folder.run.clone(),
                gpu: gpu_id,
                cuda_graphs: graphs,
                split: if model.attention_sinks || TERMS_READ_FROM.iter().any(|f| dir.ends_with(f)) { "calibration" } else { "held-out" },
                measured_gib: peak_gib,
                predicted_gib: predicted / GIB,
                ape_pct: super::stats::ape(predicted, measured),
                transformers_check_gib: check / GIB,
                transformers_check_ape_pct: super::stats::ape(check, measured),
            });
        }
    }
    Ok(PeakMemoryReport { rows, failed })
}

/// The run records that log the cache transformers built (every run of a model's process
/// shares the plan's engine settings).
fn runs_with_cache(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut runs = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).with_context(|| format!("{}: line {} is not JSON", path.display(), i + 1))?;
        if v.get("cache").is_some_and(Value::is_object) {
            runs.push(v);
        }
    }
    Ok(runs)
}

/// The memory plan's KV tokens (each spanning every layer) in `cache_tokens` page slots of
/// transformers' pool, whose pages hold one KV group's layers each.
fn plan_kv_tokens(model: &ModelConfig, cache_tokens: u64) -> f64 {
    let [full, sliding, _] = model.kv_cache_groups_by_kind();
    cache_tokens as f64 / (full + sliding).max(1) as f64
}

/// transformers 5.17's memory check for its paged cache (`PagedAttentionMemoryHandler`): K and V
/// of `cache_tokens` page slots (each slot one group's layers), a dense bf16 mask of
/// max_batch_tokens x (cache tokens + max_batch_tokens) per mask type, and (2 x vocab + hidden)
/// bf16 values of activations per batch token. It reproduces the 37,968,936,960-byte refusal of
/// `calibration/traces/h100_sxm_eager46/` within its ~30 MB of index tensors.
pub fn transformers_check_bytes(model: &ModelConfig, dep: &Deployment, cache_tokens: u64, max_tokens: u64) -> f64 {
    let kv_tokens = plan_kv_tokens(model, cache_tokens);
    let mask_types = if model.kv_cache_groups_by_kind()[1] > 0 { 2.0 } else { 1.0 };
    let (n, m, bf16) = (cache_tokens as f64, max_tokens as f64, Dtype::Bf16.bytes());
    kv_tokens * memory::kv_bytes_per_token_per_gpu(model, dep)
        + mask_types * m * (n + m) * bf16
        + m * (2 * model.vocab + model.hidden) as f64 * bf16
}

pub fn render(report: &PeakMemoryReport) -> String {
    let rows = &report.rows;
    let stats = |pick: &dyn Fn(&PeakMemoryRow) -> bool, check: bool| {
        let apes: Vec<f64> = rows.iter().filter(|r| pick(r)).map(|r| if check { r.transformers_check_ape_pct } else { r.ape_pct }).collect();
        super::stats::ErrorStats::of(&apes).cell()
    };
    let mut s = format!(
        "transformers peak GPU memory: allocator peak over a model's runs (max_memory_allocated, warm-up step included) vs the memory plan and vs transformers' own memory check, {} deployments; APE % median/p90/max\n",
        rows.len()
    );
    s += &format!("  {:<38} {:>5} {:>18} {:>18}\n", "rows", "n", "memory plan", "transformers check");
    let groups: [(&str, &dyn Fn(&PeakMemoryRow) -> bool); 4] = [
        ("held-out, eager", &|r| r.split == "held-out" && !r.cuda_graphs),
        ("held-out, CUDA graphs", &|r| r.split == "held-out" && r.cuda_graphs),
        ("calibration (terms read here, sinks)", &|r| r.split == "calibration"),
        ("all", &|_| true),
    ];
    for (name, pick) in groups {
        let n = rows.iter().filter(|r| pick(r)).count();
        s += &format!("  {:<38} {:>5} {:>18} {:>18}\n", name, n, stats(pick, false), stats(pick, true));
    }
    s += &format!("  {:<46} {:<9} {:>6} {:>9} {:>9} {:>7} {:>9} {:>7}\n", "run", "gpu", "graphs", "measured", "plan", "APE %", "check", "APE %");
    for r in rows.iter() {
        s += &format!(
            "  {:<46} {:<9} {:>6} {:>9.2} {:>9.2} {:>7.1} {:>9.2} {:>7.1}\n",
            r.run, r.gpu, if r.cuda_graphs { "yes" } else { "no" }, r.measured_gib, r.predicted_gib, r.ape_pct, r.transformers_check_gib, r.transformers_check_ape_pct
        );
    }
    if !report.failed.is_empty() {
        s += &format!("  left out, a run failed (the peak stops at the failing allocation): {}\n", report.failed.join(", "));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transformers_check_reproduces_its_refusal() {
        // transformers 5.17 refused Gemma-3-27B cut to 12 layers on an H100 with 2,304 pages of
        // 256 tokens and 8,192 batch tokens: "Memory footprint 37968936960"
        // (calibration/traces/h100_sxm_eager46/failed-gemma-3-27b-it-L12.jsonl). Its polynomial
        // leaves out only its index tensors (~30 MB).
        let m = ModelConfig::load("calibration/traces/h200_sxm_eager_layers11/gemma-3-27b-it-L12/config.json").unwrap();
        let footprint = transformers_check_bytes(&m, &Deployment::default(), 2304 * 256, 8192);
        let measured = 37_968_936_960.0;
        assert!(footprint < measured && footprint > measured - 40e6, "{footprint}");
    }

    #[test]
    fn the_plan_follows_measured_peaks_that_transformers_check_misses() {
        // Held-out eager deployments (four models at full depth, H200 and H100 alike): the plan's
        // peak within 3 % of each, transformers' own polynomial (no gathered KV copy, fp32
        // logits) 10-28 % off.
        let report = validate(&["calibration/traces/h200_sxm_eager_blind12"]).unwrap();
        assert_eq!(report.rows.len(), 4, "{:?}", report.rows);
        for r in &report.rows {
            assert_eq!((r.split, r.cuda_graphs), ("held-out", false));
            assert!(r.ape_pct < 3.0, "{r:?}");
            assert!(r.transformers_check_ape_pct > 8.0, "{r:?}");
        }
        // A folder whose runs failed is left out, not compared.
        let report = validate(&["calibration/traces/h100_sxm_blind36"]).unwrap();
        assert!(report.failed.iter().any(|f| f.ends_with("gpt-oss-20b")), "{:?}", report.failed);
        assert!(report.rows.iter().all(|r| !r.run.ends_with("gpt-oss-20b")));
    }

    #[test]
    fn a_peak_that_cannot_be_right_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("h200_sxm_bad");
        let model = root.join("llama-3.2-1b");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(root.join("env-x.json"), r#"{"gpu": "NVIDIA H200"}"#).unwrap();
        std::fs::copy("models/llama-3.2-1b.json", model.join("config.json")).unwrap();
        std::fs::write(
            model.join("runs.jsonl"),
            r#"{"status": "ok", "cache": {"num_blocks": 384, "block_size": 256, "max_batch_tokens": 8192}, "engine_requested": {"tp": 1}}"#,
        )
        .unwrap();
        std::fs::write(model.join("model.json"), r#"{"status": "ok", "max_memory_gib": -3.0}"#).unwrap();
        let e = format!("{:#}", validate(&[&root]).unwrap_err());
        assert!(e.contains("model.json") && e.contains("max_memory_gib"), "{e}");
        // A plausible peak gives one held-out eager row.
        std::fs::write(model.join("model.json"), r#"{"status": "ok", "max_memory_gib": 12.0}"#).unwrap();
        let report = validate(&[&root]).unwrap();
        assert_eq!(report.rows.len(), 1);
        assert_eq!((report.rows[0].split, report.rows[0].cuda_graphs), ("held-out", false));
    }
}

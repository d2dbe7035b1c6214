//! transformers' peak GPU memory: the allocator's peak in the recorded runs against
//! `kernels::memory` for the same model, GPU, pinned pages and engine settings, with
//! transformers' own memory check (the polynomial of its `PagedAttentionMemoryHandler`) as the
//! baseline. Two kinds of record:
//! - per run (harness of session 48 on, `memory.collected_before_run`): the run's own peak
//!   (torch's `max_memory_allocated`, reset at its start, the engine's warm-up step included),
//!   against the plan for that run's pages and budget;
//! - per model (`model.json` `max_memory_gib`, older harnesses): the peak over the model's runs.
//!   Those harnesses left the previous run's batch processor in a reference cycle, so each
//!   peak also held the previous run's cache (KV pages and masks; every run of such a model had
//!   the same engine settings): it is added to both predictions and said in the row.
//!
//! The step terms take the largest step the run logged: eager runs peak at their workload's
//! largest prefill, CUDA-graph runs at the warm-up's budget-filling step. Models whose process
//! also ran static `generate` batches are left out: those batches, not the engine, may set
//! their peak.

use crate::deployment::Deployment;
use crate::kernels::memory::{self, EngineBuffers, TRANSFORMERS_TERMS_READ_FROM};
use super::model_folders::{model_folders, FolderGpu};
use crate::model::ModelConfig;
use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;
use std::path::Path;

const GIB: f64 = (1u64 << 30) as f64;

#[derive(Debug, Clone, Serialize)]
pub struct PeakMemoryRow {
    /// `folder/model` for a model's peak, `folder/model/workload...` for one run's.
    pub run: String,
    pub gpu: String,
    pub cuda_graphs: bool,
    /// `calibration` for models with attention sinks and for the runs the plan's terms were
    /// read from (`memory::TRANSFORMERS_TERMS_READ_FROM`), `held-out` for the rest.
    pub split: &'static str,
    /// The peak also held the previous run's cache (harnesses before session 48).
    pub previous_cache_held: bool,
    pub measured_gib: f64,
    pub predicted_gib: f64,
    pub ape_pct: f64,
    /// Weights plus transformers' memory-check polynomial for the same pages and budget.
    pub transformers_check_gib: f64,
    pub transformers_check_ape_pct: f64,
}

/// The rows, and the folders left out because a run failed (an out-of-memory step cuts the
/// peak short of what the plan would need) or because their model peak spans runs of different
/// engine settings.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PeakMemoryReport {
    pub rows: Vec<PeakMemoryRow>,
    pub failed: Vec<String>,
    pub mixed_engines: Vec<String>,
    /// CUDA-graph runs whose warm-up failed (transformers logs it and goes on): no budget-filling
    /// step, or a peak cut at the failing allocation; with the logged reason.
    pub warmup_failed: Vec<(String, String)>,
    /// Runs that left the pool to transformers' memory handler: the pages it chose against
    /// `memory::transformers_self_sized_pages` on the GPU's spec sheet.
    pub self_sized: Vec<SelfSizedRow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SelfSizedRow {
    pub run: String,
    pub gpu: String,
    pub max_batch_tokens: u64,
    pub measured_pages: u64,
    pub predicted_pages: u64,
    pub ape_pct: f64,
}

/// One row per run with a per-run record, else one per transformers model folder under `dirs`
/// with a recorded peak and no failed run; a deployment whose allocator peaked at the same
/// byte in another folder counts once.
pub fn validate(dirs: &[impl AsRef<Path>]) -> Result<PeakMemoryReport> {
    let mut report = PeakMemoryReport::default();
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
            let runs_path = folder.path.join("runs.jsonl");
            let runs = runs_with_cache(&runs_path)?;
            if runs.is_empty() {
                continue;
            }
            if runs.iter().any(|r| r.get("status").and_then(Value::as_str) == Some("failed")) {
                report.failed.push(folder.run.clone());
                continue;
            }
            let origin = runs_path.display().to_string();
            let model = folder.config()?;
            let sinks = model.attention_sinks;
            let split = |run: &str| if sinks || TRANSFORMERS_TERMS_READ_FROM.iter().any(|f| run.starts_with(f)) { "calibration" } else { "held-out" };
            let per_run = runs.iter().any(|r| r.pointer("/memory/collected_before_run").and_then(Value::as_bool) == Some(true));
            if per_run {
                for run in runs.iter().filter(|r| r.pointer("/memory/collected_before_run").and_then(Value::as_bool) == Some(true)) {
                    let peak = run.pointer("/memory/peak_allocated_bytes").and_then(Value::as_f64).filter(|b| *b > 0.0 && b.is_finite())
                        .with_context(|| format!("{origin}: field 'memory.peak_allocated_bytes' must be a positive number of bytes"))?;
                    let shape = RunShape::of(run, &origin)?;
                    let name = format!("{}/{}", folder.run, run.get("run_id").and_then(Value::as_str).unwrap_or("?").split_once('/').map_or("?", |(_, w)| w));
                    let gpu_id = gpu.id()?;
                    let warmup_failed = run.get("warmup_failed").and_then(Value::as_str).filter(|_| shape.graphs);
                    if let Some(why) = warmup_failed {
                        report.warmup_failed.push((name.clone(), why.chars().take(90).collect()));
                    } else {
                        let (predicted, check) = predict(&model, &shape, shape.graphs, shape.step_tokens, false)?;
                        report.rows.push(row(name.clone(), gpu_id.clone(), shape.graphs, split(&name), false, peak, predicted, check));
                    }
                    if run.pointer("/engine_requested/num_blocks").is_some_and(Value::is_null) {
                        let spec = crate::hardware::load_gpu(&gpu_id)?;
                        let max_memory_percent = run.pointer("/engine_resolved/max_memory_percent").and_then(Value::as_f64).unwrap_or(0.9);
                        let dep = Deployment { tp: shape.tp, ..Deployment::default() };
                        let predicted = memory::transformers_self_sized_pages(&model, &spec, &dep, shape.block, shape.max_tokens, max_memory_percent)?;
                        report.self_sized.push(SelfSizedRow {
                            run: name,
                            gpu: gpu_id,
                            max_batch_tokens: shape.max_tokens,
                            measured_pages: shape.pages,
                            predicted_pages: predicted,
                            ape_pct: super::stats::ape(predicted as f64, shape.pages as f64),
                        });
                    }
                }
                continue;
            }
            let peak_gib = match v.get("max_memory_gib") {
                None | Some(Value::Null) => continue,
                Some(x) => x.as_f64().filter(|g| *g > 0.0 && g.is_finite()).with_context(|| format!("{}: field 'max_memory_gib' must be a positive number of GiB, got {x}", path.display()))?,
            };
            let shapes = runs.iter().map(|r| RunShape::of(r, &origin)).collect::<Result<Vec<_>>>()?;
            let first = &shapes[0];
            if shapes.iter().any(|s| (s.pages, s.block, s.max_tokens, s.tp) != (first.pages, first.block, first.max_tokens, first.tp)) {
                report.mixed_engines.push(folder.run.clone());
                continue;
            }
            // The peak spans every run of the process: a graph run's buffers count if any ran.
            let graph_shape = shapes.iter().find(|s| s.graphs);
            let graphs = graph_shape.is_some();
            let shape = graph_shape.unwrap_or(first);
            let step_tokens = shapes.iter().map(|s| s.step_tokens).max().unwrap_or(first.max_tokens);
            // The allocator is deterministic: a plan rerun on another GPU peaks at the same byte
            // (the H100 eager calls against the H200's), so such a repeat counts once.
            if !seen.insert((folder.label.clone(), shape.pages, shape.block, shape.max_tokens, shape.tp, graphs, peak_gib.to_bits())) {
                continue;
            }
            let gpu_id = gpu.id()?;
            let (predicted, check) = predict(&model, shape, graphs, step_tokens, true)?;
            report.rows.push(row(folder.run.clone(), gpu_id, graphs, split(&folder.run), true, peak_gib * GIB, predicted, check));
        }
    }
    Ok(report)
}

/// One run's cache and step: pages, page size, token budget, tensor parallelism, CUDA graphs
/// (and their key padding), and the most query tokens one of its steps held (the warm-up's
/// budget with graphs).
struct RunShape {
    pages: u64,
    block: u64,
    max_tokens: u64,
    tp: u64,
    graphs: bool,
    kv_pad: Option<u64>,
    step_tokens: u64,
}

impl RunShape {
    fn of(run: &Value, origin: &str) -> Result<RunShape> {
        let cache = &run["cache"];
        let field = |name: &str| -> Result<u64> {
            cache.get(name).and_then(Value::as_u64).filter(|&n| n > 0).with_context(|| format!("{origin}: field 'cache.{name}' must be a positive integer"))
        };
        let (pages, block, max_tokens) = (field("num_blocks")?, field("block_size")?, field("max_batch_tokens")?);
        let graphs = super::traces::uses_cuda_graphs(run.pointer("/engine_resolved/use_cuda_graph"));
        let kv_pad = if graphs { run.pointer("/engine_resolved/kv_padding_interval_size").and_then(Value::as_u64) } else { None };
        let logged = largest_step_tokens(run).unwrap_or(max_tokens).min(max_tokens);
        Ok(RunShape {
            pages,
            block,
            max_tokens,
            tp: run.pointer("/engine_requested/tp").and_then(Value::as_u64).unwrap_or(1).max(1),
            graphs,
            kv_pad,
            step_tokens: if graphs { max_tokens } else { logged },
        })
    }
}

/// The most query tokens of any logged step (`steps`, column `num_q_tokens`).
fn largest_step_tokens(run: &Value) -> Option<u64> {
    let columns = run.get("steps_columns")?.as_array()?;
    let at = columns.iter().position(|c| c.as_str() == Some("num_q_tokens"))?;
    run.get("steps")?.as_array()?.iter().filter_map(|s| s.get(at).and_then(Value::as_u64)).max()
}

/// The plan's peak and transformers' check for `shape` (bytes): weights, the pool (KV pages and
/// what grows with them, at the shape's budget), and the step terms at `step_tokens`;
/// `previous_cache` adds the earlier run's KV pages and static masks to both.
fn predict(model: &ModelConfig, shape: &RunShape, graphs: bool, step_tokens: u64, previous_cache: bool) -> Result<(f64, f64)> {
    let dep = Deployment { tp: shape.tp, ..Deployment::default() };
    dep.check_split(model)?;
    let buffers = EngineBuffers::PackedSdpa { kv_pad_tokens: if graphs { shape.kv_pad.or(Some(shape.max_tokens)) } else { None } };
    let cache_tokens = shape.pages * shape.block;
    let kv_tokens = memory::transformers_kv_tokens(model, cache_tokens);
    let weights = memory::weight_bytes_per_gpu(model, &dep);
    let held = if previous_cache {
        let eager = EngineBuffers::PackedSdpa { kv_pad_tokens: None };
        kv_tokens * memory::kv_pool_bytes_per_token_per_gpu(model, &dep, shape.max_tokens, eager)
    } else {
        0.0
    };
    let predicted = held + memory::allocated_peak_bytes_per_gpu(model, &dep, kv_tokens, shape.max_tokens, step_tokens, buffers);
    let check = weights + held + memory::transformers_handler_bytes(model, &dep, cache_tokens, shape.max_tokens);
    Ok((predicted, check))
}

#[allow(clippy::too_many_arguments)]
fn row(run: String, gpu: String, cuda_graphs: bool, split: &'static str, previous_cache_held: bool, measured: f64, predicted: f64, check: f64) -> PeakMemoryRow {
    PeakMemoryRow {
        run,
        gpu,
        cuda_graphs,
        split,
        previous_cache_held,
        measured_gib: measured / GIB,
        predicted_gib: predicted / GIB,
        ape_pct: super::stats::ape(predicted, measured),
        transformers_check_gib: check / GIB,
        transformers_check_ape_pct: super::stats::ape(check, measured),
    }
}

/// The run records that log the cache transformers built.
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

pub fn render(report: &PeakMemoryReport) -> String {
    let rows = &report.rows;
    let stats = |pick: &dyn Fn(&PeakMemoryRow) -> bool, check: bool| {
        let apes: Vec<f64> = rows.iter().filter(|r| pick(r)).map(|r| if check { r.transformers_check_ape_pct } else { r.ape_pct }).collect();
        super::stats::ErrorStats::of(&apes).cell()
    };
    let mut s = format!(
        "transformers peak GPU memory: allocator peak (max_memory_allocated, warm-up step included) of each run (session 48's harness) or over a model's runs (older harnesses, whose peaks also held the previous run's cache: added to both predictions) vs the memory plan and vs transformers' own memory check, {} rows; APE % median/p90/max\n",
        rows.len()
    );
    s += &format!("  {:<48} {:>5} {:>18} {:>18}\n", "rows", "n", "memory plan", "transformers check");
    let groups: [(&str, &dyn Fn(&PeakMemoryRow) -> bool); 6] = [
        ("held-out, eager, per run", &|r| r.split == "held-out" && !r.cuda_graphs && !r.previous_cache_held),
        ("held-out, CUDA graphs, per run", &|r| r.split == "held-out" && r.cuda_graphs && !r.previous_cache_held),
        ("held-out, eager, model peak + previous cache", &|r| r.split == "held-out" && !r.cuda_graphs && r.previous_cache_held),
        ("held-out, CUDA graphs, model peak + prev. cache", &|r| r.split == "held-out" && r.cuda_graphs && r.previous_cache_held),
        ("calibration (terms read here, sinks)", &|r| r.split == "calibration"),
        ("all", &|_| true),
    ];
    for (name, pick) in groups {
        let n = rows.iter().filter(|r| pick(r)).count();
        s += &format!("  {:<48} {:>5} {:>18} {:>18}\n", name, n, stats(pick, false), stats(pick, true));
    }
    s += &format!("  {:<72} {:<9} {:>6} {:>5} {:>9} {:>9} {:>7} {:>9} {:>7}\n", "run", "gpu", "graphs", "prev", "measured", "plan", "APE %", "check", "APE %");
    for r in rows.iter() {
        s += &format!(
            "  {:<72} {:<9} {:>6} {:>5} {:>9.2} {:>9.2} {:>7.1} {:>9.2} {:>7.1}\n",
            r.run, r.gpu, if r.cuda_graphs { "yes" } else { "no" }, if r.previous_cache_held { "yes" } else { "no" },
            r.measured_gib, r.predicted_gib, r.ape_pct, r.transformers_check_gib, r.transformers_check_ape_pct
        );
    }
    if !report.failed.is_empty() {
        s += &format!("  left out, a run failed (the peak stops at the failing allocation): {}\n", report.failed.join(", "));
    }
    for (run, why) in &report.warmup_failed {
        s += &format!("  left out, its CUDA-graph warm-up failed ({why}...): {run}\n");
    }
    if !report.self_sized.is_empty() {
        let apes: Vec<f64> = report.self_sized.iter().map(|r| r.ape_pct).collect();
        s += &format!(
            "transformers sizing its own cache (num_blocks left to its memory handler): pages it chose vs its polynomial solved on the spec sheet (`memory::transformers_self_sized_pages`), {} runs, APE % median/p90/max {}\n",
            apes.len(),
            super::stats::ErrorStats::of(&apes).cell()
        );
        for r in &report.self_sized {
            s += &format!("  {:<72} {:<9} budget {:>5}: {:>6} pages, predicted {:>6} ({:.1} %)\n", r.run, r.gpu, r.max_batch_tokens, r.measured_pages, r.predicted_pages, r.ape_pct);
        }
    }
    if !report.mixed_engines.is_empty() {
        s += &format!("  left out, a model peak over runs of different engine settings without per-run records: {}\n", report.mixed_engines.join(", "));
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
        let footprint = memory::transformers_handler_bytes(&m, &Deployment::default(), 2304 * 256, 8192);
        let measured = 37_968_936_960.0;
        assert!(footprint < measured && footprint > measured - 40e6, "{footprint}");
    }

    #[test]
    fn the_plan_follows_measured_peaks_that_transformers_check_misses() {
        // Held-out eager deployments (four models at full depth; that harness's peaks also held
        // the previous run's cache): the plan within 3 % of each, transformers' own polynomial
        // (full-vocabulary logits for every token, no held cache of its own) 5-14 % off.
        let report = validate(&["calibration/traces/h200_sxm_eager_blind12"]).unwrap();
        assert_eq!(report.rows.len(), 4, "{:?}", report.rows);
        for r in &report.rows {
            assert_eq!((r.split, r.cuda_graphs, r.previous_cache_held), ("held-out", false, true));
            assert!(r.ape_pct < 3.0, "{r:?}");
            assert!(r.transformers_check_ape_pct > 5.0, "{r:?}");
        }
        // A folder whose runs failed is left out, not compared.
        let report = validate(&["calibration/traces/h100_sxm_blind36"]).unwrap();
        assert!(report.failed.iter().any(|f| f.ends_with("gpt-oss-20b")), "{:?}", report.failed);
        assert!(report.rows.iter().all(|r| !r.run.ends_with("gpt-oss-20b")));
    }

    #[test]
    fn per_run_records_give_a_row_per_run_with_its_own_engine() {
        // Session 48's harness: each run's peak with the previous run's cache collected, on a
        // grid of budgets and pools; qwen2.5-7b was not used to read any term.
        let report = validate(&["calibration/traces/h100_sxm_memory48"]).unwrap();
        let qwen: Vec<_> = report.rows.iter().filter(|r| r.run.contains("/qwen2.5-7b/")).collect();
        assert_eq!(qwen.len(), 8, "{:?}", report.rows);
        for r in &qwen {
            assert!(!r.previous_cache_held && r.split == "held-out", "{r:?}");
            assert!(r.ape_pct < 5.0, "{r:?}");
        }
        // Peaks grow with the pool at a fixed budget: 12,288 -> 98,304 tokens at 8,192.
        let at = |pool: &str| qwen.iter().find(|r| r.cuda_graphs && r.run.ends_with(&format!("kv_capacity_tokens{pool}/max_batch_tokens8192"))).unwrap().measured_gib;
        assert!(at("98304") > at("49152") + 4.0 && at("49152") > at("12288") + 2.0);
        assert!(report.rows.iter().any(|r| r.run.contains("/llama-3.2-3b/") && r.split == "calibration"));
    }

    #[test]
    fn self_sized_pools_are_compared_and_failed_warm_ups_left_out() {
        let report = validate(&["calibration/traces/h100_sxm_selfsize48"]).unwrap();
        // Eight runs left the pool to transformers; full-attention models within 2 %.
        assert_eq!(report.self_sized.len(), 8, "{:?}", report.self_sized);
        for r in report.self_sized.iter().filter(|r| r.run.contains("llama") || r.run.contains("qwen")) {
            assert!(r.ape_pct < 2.0, "{r:?}");
        }
        // The graph runs' warm-ups ran out of memory on those pools: not compared as peaks.
        assert_eq!(report.warmup_failed.len(), 2, "{:?}", report.warmup_failed);
        assert!(report.warmup_failed.iter().all(|(run, why)| run.contains("/cudagraph/") && why.contains("out of memory")));
        assert!(report.rows.iter().all(|r| !r.cuda_graphs));
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

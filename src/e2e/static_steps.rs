//! Step time apart from scheduling: transformers' static `generate` batches
//! (`microbench/e2e/harness.py::static_runs`, each trace folder's `static.jsonl`). A prefill line
//! times one B x L forward (`logits_to_keep=1`), a decode line the median step of a B-sequence
//! `generate` from an L-token prompt, both with CUDA events around eager PyTorch, so a step lasts
//! as long as its kernels or its Python launches, whichever is longer. Predicted with the
//! `hf-generate` engine profile and its own host model (`fit_host`): the dispatch cost per aten
//! op and a per-step cost, fitted on the calibration families' host-bound lines, and the
//! tensor-parallel hook term, fitted on the decode lines at tp > 1 (split `tp-hook-fit`).

use super::stats::{ape, ErrorStats};
use super::traces::CALIBRATION_FAMILIES;
use crate::deployment::Deployment;
use crate::hardware::{load_gpu, GpuSpec};
use crate::model::ModelConfig;
use crate::perf::efficiency::KernelModel;
use crate::perf::host::{HostOverhead, Provenance};
use crate::perf::predictor::Predictor;
use crate::perf::{SeqWork, StepTimeModel, Tier};
use crate::sim::engine::EngineParams;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const ENGINE: &str = "hf-generate";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StaticKind {
    Prefill,
    Decode,
}

impl StaticKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StaticKind::Prefill => "prefill",
            StaticKind::Decode => "decode",
        }
    }
}

/// One measured static batch.
#[derive(Debug, Clone)]
pub struct StaticStep {
    /// Trace sub-folder, e.g. `qwen3-8b-L18`, and the shipped model it was cut from.
    pub label: String,
    pub family: String,
    pub origin: String,
    pub kind: StaticKind,
    pub batch: u32,
    pub seq_len: u32,
    /// Decode lines: tokens generated (the median step sits half-way through them).
    pub new_tokens: u32,
    pub measured_ms: f64,
    pub tp: u64,
}

impl StaticStep {
    /// The step as the simulator's batch: B prompts from scratch, or B sequences decoding one
    /// token on top of the prompt and half the generated tokens.
    pub fn batch_work(&self) -> Vec<SeqWork> {
        let work = match self.kind {
            StaticKind::Prefill => SeqWork { new_tokens: self.seq_len, cached_tokens: 0 },
            StaticKind::Decode => SeqWork { new_tokens: 1, cached_tokens: self.seq_len + self.new_tokens / 2 },
        };
        vec![work; self.batch as usize]
    }

    pub fn split(&self) -> &'static str {
        if self.tp > 1 && self.kind == StaticKind::Decode {
            // These fit `HostOverhead::tp_launch_per_layer_us` (`fit_tp_hooks`).
            "tp-hook-fit"
        } else if self.tp > 1 {
            "held-out-tp"
        } else if CALIBRATION_FAMILIES.contains(&self.family.as_str()) {
            "calibration"
        } else {
            "held-out"
        }
    }
}

/// A model folder whose static lines this profile cannot price as they ran.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub label: String,
    pub lines: usize,
    pub reason: String,
}

pub struct StaticSet {
    pub models: BTreeMap<String, ModelConfig>,
    pub steps: Vec<StaticStep>,
    pub skipped: Vec<Skipped>,
}

fn field<'a>(v: &'a Value, key: &str, origin: &str) -> Result<&'a Value> {
    v.get(key).with_context(|| format!("{origin}: missing field '{key}'"))
}

fn positive_u32(v: &Value, key: &str, origin: &str) -> Result<u32> {
    match field(v, key, origin)?.as_u64() {
        Some(n) if n > 0 && n <= u32::MAX as u64 => Ok(n as u32),
        _ => bail!("{origin}: field '{key}' must be a positive integer, got {}", v[key]),
    }
}

fn positive_ms(v: &Value, key: &str, origin: &str) -> Result<f64> {
    match field(v, key, origin)?.as_f64() {
        Some(x) if x > 0.0 && x.is_finite() => Ok(x),
        _ => bail!("{origin}: field '{key}' must be a positive number of milliseconds, got {}", v[key]),
    }
}

/// Parses one `static.jsonl` line; None for lines that did not run (`status` other than ok).
pub fn parse_line(v: &Value, label: &str, family: &str, tp: u64, origin: &str) -> Result<Option<StaticStep>> {
    if v.get("status").and_then(Value::as_str) != Some("ok") {
        return Ok(None);
    }
    let kind = match field(v, "kind", origin)?.as_str() {
        Some("prefill") => StaticKind::Prefill,
        Some("decode") => StaticKind::Decode,
        _ => bail!("{origin}: field 'kind' must be 'prefill' or 'decode', got {}", v["kind"]),
    };
    let (new_tokens, measured_ms) = match kind {
        StaticKind::Prefill => (0, positive_ms(v, "prefill_ms", origin)?),
        StaticKind::Decode => (positive_u32(v, "new_tokens", origin)?, positive_ms(v, "decode_step_ms_median", origin)?),
    };
    Ok(Some(StaticStep {
        label: label.to_string(),
        family: family.to_string(),
        origin: origin.to_string(),
        kind,
        batch: positive_u32(v, "batch", origin)?,
        seq_len: positive_u32(v, "seq_len", origin)?,
        new_tokens,
        measured_ms,
        tp,
    }))
}

/// Why this profile cannot price a model's static runs, if it cannot.
fn unsupported(config: &ModelConfig, attn_implementation: Option<&str>) -> Option<String> {
    if config.attention_sinks || attn_implementation == Some("eager") {
        return Some("eager attention with sinks, run per sequence: no measured kernel for that path".into());
    }
    if config.mla.is_some() {
        return Some("transformers' MLA decompresses K/V and runs SDPA at head dim 192; the MLA kernels measured are other libraries'".into());
    }
    None
}

/// Static lines of every model folder (with `static.jsonl` and `config.json`) under `dirs`.
pub fn load(dirs: &[impl AsRef<Path>]) -> Result<StaticSet> {
    let mut set = StaticSet { models: BTreeMap::new(), steps: Vec::new(), skipped: Vec::new() };
    for dir in dirs {
        let dir = dir.as_ref();
        let mut folders: Vec<PathBuf> = std::fs::read_dir(dir).with_context(|| format!("reading trace folder {}", dir.display()))?.flatten().map(|e| e.path()).collect();
        folders.sort();
        for folder in folders.into_iter().filter(|f| f.join("static.jsonl").is_file()) {
            load_folder(&folder, &mut set)?;
        }
    }
    Ok(set)
}

fn load_folder(folder: &Path, set: &mut StaticSet) -> Result<()> {
    let label = folder.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    let cfg_path = folder.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).with_context(|| format!("reading {}", cfg_path.display()))?;
    let config = ModelConfig::from_hf_json(&text, &label, &cfg_path.display().to_string())?;
    let family = super::traces::family_of(&label);
    let meta_path = folder.join("model.json");
    let meta: Value = match std::fs::read_to_string(&meta_path) {
        Ok(t) => serde_json::from_str(&t).with_context(|| format!("parsing {}", meta_path.display()))?,
        Err(_) => Value::Null,
    };
    let tp = meta.get("tp").and_then(Value::as_u64).unwrap_or(1);
    let path = folder.join("static.jsonl");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut lines = Vec::new();
    let mut attn = None;
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let origin = format!("{}: line {}", path.display(), i + 1);
        let v: Value = serde_json::from_str(line).with_context(|| origin.clone())?;
        if let Some(a) = v.get("attn_implementation").and_then(Value::as_str) {
            attn = Some(a.to_string());
        }
        if let Some(s) = parse_line(&v, &label, &family, tp, &origin)? {
            lines.push(s);
        }
    }
    if let Some(reason) = unsupported(&config, attn.as_deref()) {
        set.skipped.push(Skipped { label: format!("{}/{label}", folder.parent().and_then(Path::file_name).map(|n| n.to_string_lossy()).unwrap_or_default()), lines: lines.len(), reason });
        return Ok(());
    }
    set.models.entry(label).or_insert(config);
    set.steps.extend(lines);
    Ok(())
}

/// The `hf-generate` host model: `generate`'s eager step lasts max(GPU, dispatch x aten ops) +
/// per step (its loop: logits processing, stopping checks, cache bookkeeping), fitted by
/// non-negative least squares on the calibration families' tp = 1 lines whose predicted GPU
/// time is under half the measured step; then, at tp > 1, the tensor-parallel hooks per layer:
/// the median over the `tp-hook-fit` decode lines of what they leave above that model, per
/// layer. (The continuous-batching fit's cost per op, 13 us, is not this one: its attention
/// dispatches paged-cache ops the kernel graph does not list.) Shipped as
/// `calibration/host/hf-generate.json`; `validate e2e --fit-host` rewrites it. None where the
/// set holds no lines.
pub fn fit_host(set: &StaticSet, tier: Tier) -> Result<Option<HostOverhead>> {
    if set.steps.is_empty() {
        return Ok(None);
    }
    let engine = EngineParams::load(ENGINE)?;
    let gpu = load_gpu(super::traces::CALIBRATION_GPU)?;
    let mut rows = Vec::new();
    for s in set.steps.iter().filter(|s| s.split() == "calibration") {
        let p = predictor(s, &set.models[&s.label], &gpu, &engine, tier)?;
        let work = s.batch_work();
        if p.step_time(&work).total_us < 0.5 * s.measured_ms * 1e3 {
            rows.push(([p.step_host_ops(&work) as f64, 1.0], s.measured_ms * 1e3));
        }
    }
    // Two terms and one line to spare.
    if rows.len() < 3 {
        bail!("only {} host-bound static lines of the calibration families; need at least 3", rows.len());
    }
    let [dispatch, per_step] = super::regression::nonneg_least_squares(&rows);
    let host = HostOverhead {
        launch_per_host_op_us: dispatch,
        per_step_us: per_step,
        source: Provenance::of(format!("fitted by `validate e2e` on {} host-bound static lines of {} (tier {})", rows.len(), CALIBRATION_FAMILIES.join(", "), tier.as_str())),
        ..HostOverhead::zero()
    };
    let mut per_layer_us = Vec::new();
    for s in set.steps.iter().filter(|s| s.split() == "tp-hook-fit") {
        let config = &set.models[&s.label];
        let (predicted_ms, ..) = predict_ms(s, config, &gpu, &engine, &host, tier)?;
        per_layer_us.push((s.measured_ms - predicted_ms) * 1e3 / config.num_layers as f64);
    }
    if per_layer_us.is_empty() {
        return Ok(Some(host));
    }
    let hooks_us = crate::quantile::median(&per_layer_us).max(0.0);
    Ok(Some(HostOverhead {
        tp_launch_per_layer_us: hooks_us,
        source: Provenance::of(format!("{}; tensor-parallel hooks {hooks_us:.0} us/layer: median over {} static decode lines at tp > 1", host.source.step_terms, per_layer_us.len())),
        ..host
    }))
}

#[derive(Debug, Clone, Serialize)]
pub struct StaticRow {
    pub model: String,
    pub origin: String,
    pub split: &'static str,
    pub kind: StaticKind,
    pub batch: u32,
    pub seq_len: u32,
    pub tp: u64,
    pub tier: &'static str,
    pub measured_ms: f64,
    pub predicted_ms: f64,
    /// The predicted step's GPU time alone (its launches may be longer).
    pub predicted_gpu_ms: f64,
    /// Whether the predicted step lasts as long as its kernels (else its launches).
    pub gpu_bound: bool,
    pub ape: f64,
}

pub struct StaticReport {
    pub rows: Vec<StaticRow>,
    pub skipped: Vec<Skipped>,
    pub host: String,
}

/// The line's kernels, with no host time.
fn predictor(s: &StaticStep, config: &ModelConfig, gpu: &GpuSpec, engine: &EngineParams, tier: Tier) -> Result<Predictor> {
    let dep = Deployment { tp: s.tp, ..Deployment::default() };
    let kv_tokens = s.batch as u64 * (s.seq_len + s.new_tokens) as u64;
    Predictor::for_engine(config, gpu, &dep, KernelModel::load(gpu, tier)?, engine, HostOverhead::zero(), kv_tokens)
}

/// A line's predicted wall time and GPU time (ms), and whether the kernels outlast the
/// launches: one prediction of the kernels alone, the wall time by the host model's own rule
/// (`HostOverhead::step_us`).
fn predict_ms(s: &StaticStep, config: &ModelConfig, gpu: &GpuSpec, engine: &EngineParams, host: &HostOverhead, tier: Tier) -> Result<(f64, f64, bool)> {
    let p = predictor(s, config, gpu, engine, tier)?;
    let work = s.batch_work();
    let gpu_us = p.step_time(&work).total_us;
    let load = p.step_load(&work, p.step_host_ops(&work));
    let wall_us = host.step_us(gpu_us, &load);
    Ok((wall_us / 1e3, gpu_us / 1e3, wall_us > host.step_us(0.0, &load)))
}

/// Every line priced under each tier with `host` (`fit_host`'s, fitted with the first tier).
pub fn validate(set: &StaticSet, tiers: &[Tier], host: &HostOverhead) -> Result<StaticReport> {
    let engine = EngineParams::load(ENGINE)?;
    let gpu = load_gpu(super::traces::CALIBRATION_GPU)?;
    let mut rows = Vec::new();
    for &tier in tiers {
        for s in &set.steps {
            let (predicted_ms, predicted_gpu_ms, gpu_bound) = predict_ms(s, &set.models[&s.label], &gpu, &engine, host, tier)?;
            rows.push(StaticRow {
                model: s.label.clone(),
                origin: s.origin.clone(),
                split: s.split(),
                kind: s.kind,
                batch: s.batch,
                seq_len: s.seq_len,
                tp: s.tp,
                tier: tier.as_str(),
                measured_ms: s.measured_ms,
                predicted_ms,
                predicted_gpu_ms,
                gpu_bound,
                ape: ape(predicted_ms, s.measured_ms),
            });
        }
    }
    Ok(StaticReport { rows, skipped: set.skipped.clone(), host: host.source.to_string() })
}

impl StaticReport {
    /// Error per (tier, split, kind, GPU-bound).
    pub fn summary(&self) -> BTreeMap<(&'static str, &'static str, StaticKind, bool), ErrorStats> {
        let mut groups: BTreeMap<(&'static str, &'static str, StaticKind, bool), Vec<f64>> = BTreeMap::new();
        for r in &self.rows {
            groups.entry((r.tier, r.split, r.kind, r.gpu_bound)).or_default().push(r.ape);
        }
        groups.into_iter().map(|(k, v)| (k, ErrorStats::of(&v))).collect()
    }

    /// Per-line table for `tier`, then the summary of every tier.
    pub fn render(&self, tier: &str) -> String {
        let mut s = format!(
            "Static generate batches (transformers `generate`, eager, engine profile `{ENGINE}`; host: {}): APE % per line; the calibration lines fit the dispatch and per-step terms, the tp-hook-fit lines the hook term\n",
            self.host
        );
        s += &format!("  [{tier}] {:<12} {:<7} {:>5} {:>5} {:>3} {:<24} {:>8} {:>8} {:>8} {:<5} {:>7}\n", "split", "kind", "batch", "len", "tp", "model", "meas ms", "pred ms", "gpu ms", "bound", "APE");
        for r in self.rows.iter().filter(|r| r.tier == tier) {
            s += &format!(
                "  [{tier}] {:<12} {:<7} {:>5} {:>5} {:>3} {:<24} {:>8.1} {:>8.1} {:>8.1} {:<5} {:>6.1}%\n",
                r.split, r.kind.as_str(), r.batch, r.seq_len, r.tp, r.model, r.measured_ms, r.predicted_ms, r.predicted_gpu_ms, if r.gpu_bound { "gpu" } else { "host" }, r.ape
            );
        }
        s += "  summary by predicted bound (median / p90 / max APE %, lines):\n";
        for ((tier, split, kind, gpu_bound), e) in self.summary() {
            s += &format!("    {tier:<10} {split:<12} {:<8} {:<5} {} ({})\n", kind.as_str(), if gpu_bound { "gpu" } else { "host" }, e.cell(), e.count);
        }
        for k in &self.skipped {
            s += &format!("  not priced: {} ({} lines): {}\n", k.label, k.lines, k.reason);
        }
        s
    }
}

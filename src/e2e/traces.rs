//! The H200 end-to-end traces (`calibration/traces/h200_sxm*/`: transformers continuous batching,
//! and vLLM's own serving engine): loading with consistency checks, fitting the `hf` engine's host
//! overhead on a calibration subset of model families, and replaying every run in the simulator
//! with the profile of the engine that ran it.

use super::stats::{ape, ErrorStats};
use crate::quantile::quantile;
use crate::deployment::Deployment;
use crate::hardware::load_gpu;
use crate::model::ModelConfig;
use crate::perf::efficiency::KernelModel;
use crate::perf::graphs::GraphPadding;
use crate::perf::host::{CaptureLoad, HostOverhead, HostSpeed, Provenance};
use crate::perf::predictor::Predictor;
use crate::perf::{SeqWork, StepTimeModel, Tier};
use crate::plan::evaluate::served_fraction;
use crate::sim::engine::EngineParams;
use crate::sim::record::{RequestRecord, SimObserver};
use crate::sim::router::RouterKind;
use crate::sim::summary::Summary;
use crate::sim::SimConfig;
use crate::workload::{RequestSource, RequestSpec};
use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// Model families whose runs fit the host-overhead model; every other family is held out and
/// never used for fitting anything.
/// Chosen before any fitting: one dense, two MoE families; their 2-layer smoke cuts make the
/// per-layer and per-step host terms separately identifiable.
pub const CALIBRATION_FAMILIES: [&str; 3] = ["llama-3.1-8b", "qwen3-30b-a3b", "gpt-oss-20b"];

/// Models whose vLLM runs fit the `vllm` engine's prefill-step launch terms
/// (`fit_host_vllm`); every other model's vLLM runs are held out. Chosen after the runs were
/// seen (they are the two with the engine-side stage timings of call c), not blind.
pub const VLLM_CALIBRATION_MODELS: [&str; 2] = ["llama-3.1-8b", "qwen3-0.6b"];

/// Label prefix of the host probes (`microbench/e2e/host_probe.py`): tiny synthetic models that
/// measure the engine's host cost; they fit the CUDA-graph host model and are reported apart.
pub const HOST_PROBE_PREFIX: &str = "host-probe";

/// The GPU every fitted term was fitted on. Runs on any other GPU fit nothing: they test the
/// whole prediction (kernels, step model, host model) on a GPU and host it never saw.
pub const CALIBRATION_GPU: &str = "h200_sxm";

#[derive(Debug, Clone)]
pub struct TraceRequest {
    pub arrival_s: f64,
    pub first_token_s: f64,
    pub token_s: Vec<f64>,
    pub finish_s: f64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    pub prefix_group: Option<u64>,
    pub prefix_tokens: u32,
    /// Times the engine evicted the request's KV and recomputed it (transformers' soft reset);
    /// None in traces recorded before the harness counted them.
    pub soft_resets: Option<u32>,
    /// vLLM traces with the engine core's own timestamps (`engine_stages`): seconds from the
    /// client's send to the engine queue, and from the engine's first token to the client's.
    pub engine_path_s: Option<[f64; 2]>,
    /// When the engine core first scheduled the request (the client's clock), where recorded.
    pub engine_scheduled_s: Option<f64>,
}

#[derive(Debug, Clone, Copy)]
pub struct TraceStep {
    pub start_s: f64,
    pub num_requests: u32,
    pub num_decode: u32,
    pub q_tokens: u64,
    pub kv_read: u64,
    pub end_s: f64,
    /// GPU time of the step measured with CUDA events (ms), where the folder holds a
    /// `steps.jsonl` profile of the run (the host probes).
    pub gpu_ms: Option<f64>,
}

/// The serving engine a trace was recorded with (`engine_requested.engine`; absent: transformers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceEngine {
    /// transformers' continuous batching (`microbench/e2e/harness.py`): fits the `hf` host model.
    Hf,
    /// vLLM's AsyncLLM (`microbench/e2e/vllm_serve.py`): replayed with the shipped `vllm` profile
    /// and host model, fitted on nothing here.
    Vllm,
}

#[derive(Debug, Clone)]
pub struct TraceRun {
    pub engine: TraceEngine,
    /// vLLM runs: the scheduler's sequence cap and whether async scheduling was on.
    pub max_num_seqs: Option<u32>,
    pub async_scheduling: Option<bool>,
    /// `call/run_id`: run ids repeat across device calls.
    pub key: String,
    pub status: String,
    pub block_size: u32,
    pub blocks_per_group: u32,
    pub max_batch_tokens: u32,
    pub prefix_sharing: bool,
    /// Tensor-parallel degree the run used.
    pub tp: u64,
    /// CUDA graphs over padded shapes (None: eager).
    pub graphs: Option<GraphPadding>,
    /// Token slots of the whole KV pool, every group's pages together (where KV padding stops).
    pub kv_cap_tokens: u64,
    /// KV cache layer groups the engine reported (`engine_requested.layer_groups`), where recorded.
    pub layer_groups: Option<u64>,
    /// Closed-loop runs (`clients` in the run record): that many clients, each sending the next
    /// request as its last one ends. The replay then runs the same closed loop, so arrivals
    /// are the simulator's own, not the recorded ones.
    pub clients: Option<u32>,
    /// Closed-loop runs: median time from an answer's end to the next request's arrival
    /// (`client_turnaround_s`), which the replay's clients then take too.
    pub turnaround_s: Option<f64>,
    pub steps: Vec<TraceStep>,
    /// Finished requests only.
    pub requests: Vec<TraceRequest>,
    /// All requests sent, finished or not (for replay).
    pub sent: Vec<RequestSpec>,
}

#[derive(Debug, Clone)]
pub struct TraceModel {
    /// Folder name, e.g. `qwen3-8b-L18`.
    pub label: String,
    /// The shipped model it was cut from, e.g. `qwen3-8b`.
    pub family: String,
    /// Spec-sheet id of the GPU the folder's runs were measured on (`folder_gpu`).
    pub gpu: String,
    /// Median host-probe reading of the folder's calls (`folder_host_probe_ns`), where recorded.
    pub host_probe_ns: Option<f64>,
    pub config: ModelConfig,
    pub runs: Vec<TraceRun>,
}

impl TraceModel {
    /// Whether the runs were measured on the GPU (and machines) every term is fitted on.
    pub fn on_calibration_gpu(&self) -> bool {
        self.gpu == CALIBRATION_GPU
    }

    pub fn is_calibration(&self) -> bool {
        self.on_calibration_gpu() && CALIBRATION_FAMILIES.contains(&self.family.as_str())
    }

    pub fn is_host_probe(&self) -> bool {
        self.label.starts_with(HOST_PROBE_PREFIX)
    }

    /// Whether this model's CUDA-graph runs fit the host model.
    pub fn fits_host(&self) -> bool {
        self.is_calibration() || (self.on_calibration_gpu() && self.is_host_probe())
    }
}

fn f64_field(v: &Value, key: &str, origin: &str) -> Result<f64> {
    v.get(key).and_then(Value::as_f64).ok_or_else(|| anyhow!("{origin}: field '{key}' missing or not a number"))
}

fn u64_field(v: &Value, key: &str, origin: &str) -> Result<u64> {
    v.get(key).and_then(Value::as_u64).ok_or_else(|| anyhow!("{origin}: field '{key}' missing or not a whole number"))
}

fn read_jsonl(path: &Path) -> Result<Vec<(usize, Value)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line).map_err(|e| anyhow!("{}: line {}: malformed JSON ({e})", path.display(), i + 1))?;
        out.push((i + 1, v));
    }
    Ok(out)
}

/// Parses one finished request and checks its timeline (arrival <= tokens, non-decreasing).
fn parse_request(v: &Value, origin: &str) -> Result<TraceRequest> {
    let arrival_s = f64_field(v, "arrival_s", origin)?;
    let first_token_s = f64_field(v, "first_token_s", origin)?;
    let finish_s = f64_field(v, "finish_s", origin)?;
    let token_s: Vec<f64> = v
        .get("token_s")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("{origin}: field 'token_s' missing"))?
        .iter()
        .map(|x| x.as_f64().ok_or_else(|| anyhow!("{origin}: field 'token_s' holds a non-number")))
        .collect::<Result<_>>()?;
    if token_s.is_empty() {
        bail!("{origin}: finished request has no token times");
    }
    if token_s[0] < arrival_s {
        bail!("{origin}: a token at {:.6} s precedes the request's arrival at {arrival_s:.6} s", token_s[0]);
    }
    if token_s.windows(2).any(|w| w[1] < w[0]) || finish_s < first_token_s {
        bail!("{origin}: token timestamps decrease");
    }
    let (engine_path_s, engine_scheduled_s) = match v.get("engine_stages") {
        None | Some(Value::Null) => (None, None),
        Some(stages) => {
            let at = |field: &str| {
                stages.get(field).and_then(Value::as_f64).ok_or_else(|| anyhow!("{origin}: field 'engine_stages.{field}' missing or not a number of seconds"))
            };
            let (queued_s, scheduled_s, engine_first_s) = (at("queued_s")?, at("scheduled_s")?, at("first_token_engine_s")?);
            if queued_s < arrival_s || scheduled_s < queued_s || engine_first_s < scheduled_s || engine_first_s > first_token_s {
                bail!(
                    "{origin}: engine_stages out of order: arrival {arrival_s:.6} s <= queued_s {queued_s:.6} s <= scheduled_s {scheduled_s:.6} s <= first_token_engine_s {engine_first_s:.6} s <= first_token_s {first_token_s:.6} s must hold"
                );
            }
            (Some([queued_s - arrival_s, first_token_s - engine_first_s]), Some(scheduled_s))
        }
    };
    let output_tokens = u64_field(v, "output_tokens", origin)? as u32;
    if output_tokens as usize != token_s.len() {
        bail!("{origin}: output_tokens = {output_tokens} but {} token times", token_s.len());
    }
    Ok(TraceRequest {
        arrival_s,
        first_token_s,
        token_s,
        finish_s,
        prompt_tokens: u64_field(v, "prompt_tokens", origin)? as u32,
        output_tokens,
        prefix_group: v.get("prefix_group").and_then(Value::as_u64),
        prefix_tokens: v.get("prefix_tokens").and_then(Value::as_u64).unwrap_or(0) as u32,
        soft_resets: match v.get("soft_resets") {
            None | Some(Value::Null) => None,
            Some(x) => Some(x.as_u64().filter(|&n| n <= u32::MAX as u64).ok_or_else(|| anyhow!("{origin}: field 'soft_resets' must be a count of evictions, got {x}"))? as u32),
        },
        engine_path_s,
        engine_scheduled_s,
    })
}

/// transformers records `use_cuda_graph` as one flag or a (varlen, decode) pair.
pub(crate) fn uses_cuda_graphs(v: Option<&Value>) -> bool {
    match v {
        Some(Value::Bool(b)) => *b,
        Some(Value::Array(a)) => a.iter().any(|x| x.as_bool() == Some(true)),
        _ => false,
    }
}

fn parse_run(v: &Value, origin: &str) -> Result<TraceRun> {
    let cache = v.get("cache").ok_or_else(|| anyhow!("{origin}: field 'cache' missing"))?;
    let engine = v.get("engine_requested").ok_or_else(|| anyhow!("{origin}: field 'engine_requested' missing"))?;
    let mut steps = Vec::new();
    let rows: &[Value] = v.get("steps").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    // A partial run stopped in the step that failed (out of memory, say): that last step has
    // no end time and never ran to completion.
    let partial = v.get("status").and_then(Value::as_str) == Some("partial");
    let rows = match rows.split_last() {
        Some((last, done)) if partial && last.get(5).is_some_and(Value::is_null) => done,
        _ => rows,
    };
    for (j, s) in rows.iter().enumerate() {
        let a = s.as_array().filter(|a| a.len() == 6).ok_or_else(|| anyhow!("{origin}: steps[{j}] is not a 6-column row"))?;
        let n = |k: usize| a[k].as_f64().ok_or_else(|| anyhow!("{origin}: steps[{j}][{k}] is not a number"));
        let step = TraceStep {
            start_s: n(0)?,
            num_requests: n(1)? as u32,
            num_decode: n(2)? as u32,
            q_tokens: n(3)? as u64,
            kv_read: n(4)? as u64,
            end_s: n(5)?,
            gpu_ms: None,
        };
        if step.end_s < step.start_s {
            bail!("{origin}: steps[{j}] ends before it starts");
        }
        steps.push(step);
    }
    let graphs = match v.get("engine_resolved") {
        Some(r) if uses_cuda_graphs(r.get("use_cuda_graph")) => Some(GraphPadding {
            q_tokens: u64_field(r, "q_padding_interval_size", origin)? as u32,
            kv_tokens: u64_field(r, "kv_padding_interval_size", origin)? as u32,
            // Not in the run record: the engine profile's (`engine_for`).
            seqlen_k_pow2_min: None,
        }),
        _ => None,
    };
    let block_size = u64_field(cache, "block_size", origin)?;
    let trace_engine = match engine.get("engine").and_then(Value::as_str) {
        None | Some("hf") => TraceEngine::Hf,
        Some("vllm") => TraceEngine::Vllm,
        Some(other) => bail!("{origin}: field 'engine_requested.engine' is '{other}'; allowed: hf, vllm"),
    };
    let max_num_seqs = match engine.get("max_num_seqs") {
        None | Some(Value::Null) => None,
        Some(x) => Some(x.as_u64().filter(|&n| n >= 1 && n <= u32::MAX as u64).ok_or_else(|| anyhow!("{origin}: field 'engine_requested.max_num_seqs' must be a positive count, got {x}"))? as u32),
    };
    // transformers caps a padded KV read at `num_pages`, the pages of every group together: a
    // sliding-window hybrid's full-attention group may hold more than one group's share.
    let kv_cap_tokens = u64_field(cache, "num_blocks", origin)? * block_size;
    Ok(TraceRun {
        engine: trace_engine,
        max_num_seqs,
        async_scheduling: engine.get("async_scheduling").and_then(Value::as_bool),
        key: format!("{}/{}", v.get("call").and_then(Value::as_str).unwrap_or("?"), v.get("run_id").and_then(Value::as_str).unwrap_or("?")),
        status: v.get("status").and_then(Value::as_str).unwrap_or("?").to_string(),
        block_size: u64_field(cache, "block_size", origin)? as u32,
        // The harness sizes the cache as `num_blocks` over all layer groups (each group holds
        // its own blocks); the simulator's pool is one group's, the full-attention one's.
        // A run that left the pool to transformers' memory handler requested none: the cache's.
        blocks_per_group: (match engine.get("num_blocks") {
            Some(Value::Null) => u64_field(cache, "num_blocks", origin)?,
            _ => u64_field(engine, "num_blocks", origin)?,
        } / engine.get("layer_groups").and_then(Value::as_u64).unwrap_or(1).max(1)) as u32,
        max_batch_tokens: u64_field(cache, "max_batch_tokens", origin)? as u32,
        prefix_sharing: cache.get("use_prefix_sharing").and_then(Value::as_bool).unwrap_or(false),
        tp: engine.get("tp").and_then(Value::as_u64).unwrap_or(1).max(1),
        graphs,
        kv_cap_tokens,
        layer_groups: engine.get("layer_groups").and_then(Value::as_u64),
        clients: match v.get("clients").and_then(Value::as_u64) {
            Some(c) if c >= 1 && c <= u32::MAX as u64 => Some(c as u32),
            Some(c) => bail!("{origin}: field 'clients' must be a positive number of closed-loop clients, got {c}"),
            None => None,
        },
        turnaround_s: None,
        steps,
        requests: Vec::new(),
        sent: Vec::new(),
    })
}

/// Median, over the requests a closed loop's clients sent after their first, of the time from
/// the latest answer to end before the request arrived to its arrival. None for too few.
pub fn client_turnaround_s(requests: &[TraceRequest], clients: u32) -> Option<f64> {
    let mut by_arrival: Vec<&TraceRequest> = requests.iter().collect();
    by_arrival.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    let mut finishes: Vec<f64> = requests.iter().map(|r| r.finish_s).collect();
    finishes.sort_by(f64::total_cmp);
    let gaps: Vec<f64> = by_arrival
        .iter()
        .skip(clients as usize)
        .filter_map(|r| {
            let i = finishes.partition_point(|&f| f <= r.arrival_s);
            (i > 0).then(|| r.arrival_s - finishes[i - 1])
        })
        .collect();
    (gaps.len() >= 3).then(|| quantile(&gaps, 0.5))
}

/// The runs of one runs.jsonl that carry timings (ok or partial), without their requests.
pub fn load_runs(runs_path: &Path) -> Result<Vec<TraceRun>> {
    let mut runs = Vec::new();
    for (line, v) in read_jsonl(runs_path)? {
        let status = v.get("status").and_then(Value::as_str).unwrap_or("");
        if status != "ok" && status != "partial" {
            continue; // failed and skipped runs carry no timings
        }
        runs.push(parse_run(&v, &format!("{}: line {line}", runs_path.display()))?);
    }
    Ok(runs)
}

/// The shipped model a trace folder's model was cut from: `qwen3-8b-L18` -> `qwen3-8b`.
pub fn family_of(label: &str) -> String {
    match label.rfind("-L") {
        Some(i) if label[i + 2..].chars().all(|c| c.is_ascii_digit()) => label[..i].to_string(),
        _ => label.to_string(),
    }
}

/// Loads every model folder under `dir` (each with config.json, runs.jsonl, requests.jsonl).
pub fn load_dir(dir: &Path) -> Result<Vec<TraceModel>> {
    let mut models = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir).with_context(|| format!("reading trace folder {}", dir.display()))?.flatten().map(|e| e.path()).collect();
    entries.sort();
    for folder in entries.into_iter().filter(|p| p.join("runs.jsonl").is_file()) {
        let label = folder.file_name().unwrap().to_string_lossy().to_string();
        let cfg_path = folder.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).with_context(|| format!("reading {}", cfg_path.display()))?;
        let config = ModelConfig::from_hf_json(&text, &label, &cfg_path.display().to_string())?;
        let family = family_of(&label);
        let mut runs = load_runs(&folder.join("runs.jsonl"))?;
        let req_path = folder.join("requests.jsonl");
        // A folder whose runs were all skipped has no request file.
        let request_lines = if req_path.is_file() { read_jsonl(&req_path)? } else { Vec::new() };
        for (line, v) in request_lines {
            let origin = format!("{}: line {line}", req_path.display());
            let key = format!("{}/{}", v.get("call").and_then(Value::as_str).unwrap_or("?"), v.get("run_id").and_then(Value::as_str).unwrap_or("?"));
            let Some(run) = runs.iter_mut().find(|r| r.key == key) else { continue };
            let spec = RequestSpec {
                id: run.sent.len() as u64,
                // transformers' harness adds the requests planned at t = 0 before it starts the
                // engine loop, so the first step sees them all: they arrive at 0. vLLM's serving
                // client sends a burst one `generate` call after another (0.15-0.35 ms apart,
                // `microbench/data/h200_sxm/vllm_engine/README.md`, run 7), and the engine core
                // starts a step with whatever reached it: they arrive when sent. Requests that
                // never started (partial runs) only carry their planned arrival.
                arrival_s: match v.get("target_arrival_s").and_then(Value::as_f64) {
                    Some(t) if t <= 0.0 && run.engine != TraceEngine::Vllm => 0.0,
                    _ => f64_field(&v, "arrival_s", &origin).or_else(|_| f64_field(&v, "target_arrival_s", &origin))?,
                },
                prompt_tokens: u64_field(&v, "prompt_tokens", &origin)? as u32,
                output_tokens: u64_field(&v, "requested_output_tokens", &origin)? as u32,
                prefix_group: v.get("prefix_group").and_then(Value::as_u64),
                prefix_tokens: v.get("prefix_tokens").and_then(Value::as_u64).unwrap_or(0) as u32,
            };
            run.sent.push(spec);
            if v.get("status").and_then(Value::as_str) == Some("finished") {
                run.requests.push(parse_request(&v, &origin)?);
            }
        }
        for r in &mut runs {
            r.sent.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
            for (i, s) in r.sent.iter_mut().enumerate() {
                s.id = i as u64;
            }
        }
        runs.retain(|r| !r.requests.is_empty());
        for r in &mut runs {
            r.turnaround_s = r.clients.and_then(|c| client_turnaround_s(&r.requests, c));
        }
        models.push(TraceModel { label, family, gpu: String::new(), host_probe_ns: None, config, runs });
    }
    let gpu = folder_gpu(dir)?;
    let probe = folder_host_probe_ns(dir)?;
    for m in &mut models {
        m.gpu = gpu.clone();
        m.host_probe_ns = probe;
    }
    let profile = dir.join("steps.jsonl");
    if profile.is_file() {
        attach_step_gpu_times(&profile, &mut models)?;
    }
    if models.is_empty() {
        bail!("no trace folders (with runs.jsonl) under {}", dir.display());
    }
    Ok(models)
}

/// The GPU a trace folder was measured on, from its calls' `env-*.json` records (field `gpu`,
/// else `nvidia_smi_before.name`), as a spec-sheet id. Every call of one folder must name the
/// same GPU: a folder is replayed on one spec sheet.
pub fn folder_gpu(dir: &Path) -> Result<String> {
    let mut found: Option<(String, String)> = None;
    for path in &env_files(dir)? {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?)
            .map_err(|e| anyhow!("{}: malformed JSON ({e})", path.display()))?;
        let Some(name) = v.get("gpu").and_then(Value::as_str).or_else(|| v.pointer("/nvidia_smi_before/name").and_then(Value::as_str)) else {
            continue;
        };
        let id = gpu_id_of_device_name(name).ok_or_else(|| {
            anyhow!("{}: field 'gpu' = '{name}' is not a GPU with a spec sheet here; known device names: {}", path.display(), DEVICE_NAMES.map(|(n, _)| n).join(", "))
        })?;
        match &found {
            Some((other, at)) if other != id => bail!("{}: GPU {id} but {at} names {other}: one trace folder holds one GPU's runs", path.display()),
            Some(_) => {}
            None => found = Some((id.to_string(), path.display().to_string())),
        }
    }
    found.map(|(id, _)| id).ok_or_else(|| anyhow!("{}: no env-*.json names the GPU (field 'gpu' or 'nvidia_smi_before.name')", dir.display()))
}

/// Median `python_loop_ns` over the host-probe readings of a folder's `env-*.json` records
/// (`microbench/e2e/host_speed_probe.py`, run by the harness before each call); None where no
/// call recorded one.
pub fn folder_host_probe_ns(dir: &Path) -> Result<Option<f64>> {
    let mut ns = Vec::new();
    for path in env_files(dir)? {
        ns.extend(crate::perf::host_probe::readings_in(&path)?);
    }
    Ok((!ns.is_empty()).then(|| crate::quantile::median(&ns)))
}

/// A trace folder's per-call `env-*.json` records, sorted.
fn env_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut envs: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading trace folder {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("env") && n.ends_with(".json")))
        .collect();
    envs.sort();
    Ok(envs)
}

/// CUDA device names (as nvidia-smi and torch report them) and their spec-sheet ids.
const DEVICE_NAMES: [(&str, &str); 3] = [("NVIDIA H200", "h200_sxm"), ("NVIDIA H100 80GB HBM3", "h100_sxm"), ("NVIDIA A100-SXM4-80GB", "a100_sxm")];

fn gpu_id_of_device_name(name: &str) -> Option<&'static str> {
    DEVICE_NAMES.iter().find(|(n, _)| *n == name.trim()).map(|(_, id)| *id)
}

/// One run's CUDA-event GPU time per `compute_batch` call (`steps.jsonl` of a profile: one line
/// per run, `steps` as `[t_call_s, host_call_ms, gpu_ms, q_padded]`).
pub struct StepProfile {
    pub model: String,
    pub run_id: String,
    /// The device call (absent in the first profile folder's lines).
    pub call: Option<String>,
    pub gpu_ms: Vec<f64>,
}

impl StepProfile {
    /// The GPU times of a run's `scheduled` logged steps, in order: `compute_batch` also ran for
    /// the engine's warm-up captures before the first scheduled step, so they are the last ones.
    pub fn scheduled(&self, scheduled: usize) -> Option<&[f64]> {
        self.gpu_ms.len().checked_sub(scheduled).map(|offset| &self.gpu_ms[offset..])
    }
}

pub fn read_step_profiles(path: &Path) -> Result<Vec<StepProfile>> {
    read_jsonl(path)?
        .into_iter()
        .map(|(line, v)| {
            let origin = format!("{}: line {line}", path.display());
            let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
            let gpu_ms = v
                .get("steps")
                .and_then(Value::as_array)
                .ok_or_else(|| anyhow!("{origin}: field 'steps' missing"))?
                .iter()
                .map(|s| s.get(2).and_then(Value::as_f64).ok_or_else(|| anyhow!("{origin}: a step without gpu_ms")))
                .collect::<Result<_>>()?;
            Ok(StepProfile { model: text("model").unwrap_or_default(), run_id: text("run_id").unwrap_or_default(), call: text("call"), gpu_ms })
        })
        .collect()
}

/// Attaches the CUDA-event GPU time of every step to the runs a folder's `steps.jsonl` profiled.
fn attach_step_gpu_times(path: &Path, models: &mut [TraceModel]) -> Result<()> {
    for prof in read_step_profiles(path)? {
        let key = format!("{}/{}", prof.call.as_deref().unwrap_or("?"), prof.run_id);
        let Some(run) = models.iter_mut().flat_map(|m| m.runs.iter_mut()).find(|r| r.key == key) else { continue };
        let gpu_ms = prof
            .scheduled(run.steps.len())
            .ok_or_else(|| anyhow!("{}: run {key}: {} profiled steps for its {} logged steps", path.display(), prof.gpu_ms.len(), run.steps.len()))?;
        for (s, &g) in run.steps.iter_mut().zip(gpu_ms) {
            s.gpu_ms = Some(g);
        }
    }
    Ok(())
}

/// The metrics compared per run.
pub const METRICS: [&str; 7] = ["ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "itl_p50", "itl_p90", "throughput"];

/// Measured metrics of a run (ms, throughput in output tokens/s from the run's start), and
/// whether the engine kept up with the run's arrivals (`plan::evaluate::served_fraction`).
pub fn measured_metrics(run: &TraceRun) -> BTreeMap<&'static str, f64> {
    let ttft: Vec<f64> = run.requests.iter().map(|r| (r.first_token_s - r.arrival_s) * 1e3).collect();
    let tpot: Vec<f64> = run
        .requests
        .iter()
        .filter(|r| r.output_tokens > 1)
        .map(|r| (r.finish_s - r.first_token_s) * 1e3 / (r.output_tokens - 1) as f64)
        .collect();
    let itl: Vec<f64> = run.requests.iter().flat_map(|r| r.token_s.windows(2).map(|w| (w[1] - w[0]) * 1e3)).collect();
    let end = run.requests.iter().map(|r| r.finish_s).fold(0.0, f64::max);
    let tokens: u64 = run.requests.iter().map(|r| r.output_tokens as u64).sum();
    BTreeMap::from([
        ("ttft_p50", quantile(&ttft, 0.5)),
        ("ttft_p90", quantile(&ttft, 0.9)),
        ("tpot_p50", quantile(&tpot, 0.5)),
        ("tpot_p90", quantile(&tpot, 0.9)),
        ("itl_p50", quantile(&itl, 0.5)),
        ("itl_p90", quantile(&itl, 0.9)),
        ("throughput", tokens as f64 / end),
        ("served_fraction", served_fraction(&run.requests.iter().map(|r| (r.arrival_s, r.finish_s)).collect::<Vec<_>>())),
    ])
}

/// The engine profile a run used, with the run's own settings: `vllm` for vLLM's runs; for
/// transformers', `hf` eager or `hf-cudagraph` with the run's padding (and the profile's graph
/// key, which the run record does not hold).
fn engine_for(run: &TraceRun) -> Result<EngineParams> {
    if run.engine == TraceEngine::Vllm {
        let mut engine = EngineParams::load("vllm")?;
        engine.block_size = run.block_size;
        engine.max_num_batched_tokens = run.max_batch_tokens;
        engine.prefix_caching = run.prefix_sharing;
        engine.max_num_seqs = run.max_num_seqs.unwrap_or(engine.max_num_seqs);
        engine.async_scheduling = run.async_scheduling.unwrap_or(engine.async_scheduling);
        return Ok(engine);
    }
    let mut engine = EngineParams::load(if run.graphs.is_some() { "hf-cudagraph" } else { "hf" })?;
    let key = engine.cuda_graphs.and_then(|g| g.seqlen_k_pow2_min);
    engine.cuda_graphs = run.graphs.map(|g| GraphPadding { seqlen_k_pow2_min: key, ..g });
    engine.block_size = run.block_size;
    engine.max_num_batched_tokens = run.max_batch_tokens;
    engine.prefix_caching = run.prefix_sharing;
    Ok(engine)
}

pub fn predictor_for(model: &TraceModel, run: &TraceRun, tier: Tier, host: HostOverhead) -> Result<Predictor> {
    let gpu = load_gpu(&model.gpu)?;
    let dep = Deployment { tp: run.tp, ..Deployment::default() };
    Predictor::for_engine(&model.config, &gpu, &dep, KernelModel::load(&gpu, tier)?, &engine_for(run)?, host, run.kv_cap_tokens)
}

/// A logged step as the simulator's batch: the step's requests sharing its query tokens and
/// its KV read evenly (packed attention and the token kernels depend on the totals only).
pub fn logged_step_batch(s: &TraceStep) -> Vec<SeqWork> {
    let n = s.num_requests.max(1) as u64;
    (0..n)
        .map(|i| SeqWork {
            new_tokens: (s.q_tokens / n + u64::from(i < s.q_tokens % n)).max(1) as u32,
            cached_tokens: (s.kv_read / n + u64::from(i < s.kv_read % n)) as u32,
        })
        .collect()
}

/// The calibration families' finished eager runs on one GPU: what the eager host model is fitted on.
fn eager_calibration_runs(models: &[TraceModel]) -> impl Iterator<Item = (&TraceModel, &TraceRun)> {
    models
        .iter()
        .filter(|m| m.is_calibration())
        .flat_map(|m| m.runs.iter().filter(|r| r.status == "ok" && r.engine == TraceEngine::Hf && r.tp == 1 && r.graphs.is_none()).map(move |r| (m, r)))
}

/// Fits the eager `hf` host model on the calibration families' decode-only steps where the host
/// dominates (predicted GPU time under half the measured step): measured = dispatch x host ops
/// (the aten ops the step's Python dispatches, `Predictor::step_host_ops`) + per_step +
/// per_seq x sequences (+ the probes' bookkeeping terms, fixed), by least squares with
/// non-negative coefficients. (Fitting a per-group term on these steps themselves gave 0 and
/// raised held-out eager TPOT error from 15.3 to 19.2 %: the eager steps' launches dominate.)
pub fn fit_host(models: &[TraceModel], tier: Tier, bookkeeping: Option<&HostOverhead>) -> Result<HostOverhead> {
    // The engine's block bookkeeping and KV index lists (`prepare_batch_tensors`) are the same
    // Python in both modes: where the probes measured them (`bookkeeping`, the CUDA-graph fit),
    // they are taken as given and the launch and step terms fitted on what is left.
    let keep = bookkeeping.map(|b| HostOverhead {
        per_seq_cache_group_us: b.per_seq_cache_group_us,
        per_full_read_token_us: b.per_full_read_token_us,
        per_sliding_read_token_us: b.per_sliding_read_token_us,
        ..HostOverhead::zero()
    });
    let keep = keep.unwrap_or_else(HostOverhead::zero);
    let mut rows: Vec<([f64; 4], f64)> = Vec::new();
    for (m, run) in eager_calibration_runs(models) {
        let p = predictor_for(m, run, tier, HostOverhead::zero())?;
        // Every step in run order, so that each attention shape counts as new once.
        for s in run.steps.iter().filter(|s| s.num_requests > 0) {
            let batch = logged_step_batch(s);
            let new_plan = p.register_sdpa_plan(&batch);
            if s.num_decode != s.num_requests {
                continue;
            }
            let measured_us = (s.end_s - s.start_s) * 1e6;
            let gpu_us = p.step_time(&batch).total_us;
            if gpu_us < 0.5 * measured_us {
                let rest_us = measured_us - keep.step_us(0.0, &p.step_load(&batch, 0));
                rows.push(([p.step_host_ops(&batch) as f64, 1.0, s.num_requests as f64, f64::from(u8::from(new_plan))], rest_us));
            }
        }
    }
    if rows.len() < 10 {
        bail!("only {} host-bound decode steps in the calibration traces; need at least 10", rows.len());
    }
    let coef = nonneg_least_squares(&rows);
    let host = HostOverhead { launch_per_host_op_us: coef[0], per_step_us: coef[1], per_seq_us: coef[2], sdpa_plan_us: coef[3], ..keep };
    let (wake_us, first_steps) = first_step_excess_us(models, tier, &host)?;
    Ok(HostOverhead {
        idle_wake_us: wake_us,
        source: Provenance::of(format!(
            "fitted by `validate e2e` on {} host-bound decode steps of {} (tier {}){}; a run's first step {:.1} ms longer: median over {} runs",
            rows.len(),
            CALIBRATION_FAMILIES.join(", "),
            tier.as_str(),
            if bookkeeping.is_some() { ", with the probes' bookkeeping terms" } else { "" },
            wake_us / 1e3,
            first_steps
        )),
        ..host
    })
}

/// What the eager engine's first step of a run (a fresh `generate_batch` manager taking its first
/// prompts) takes beyond the step model with `host`: the median over the calibration families'
/// tp = 1 eager runs of measured minus predicted, floored at 0, and the number of runs. It is
/// ~16 ms in nearly every run, against decode steps the model prices well, while the eager
/// traces' later prompt steps always join running decodes and show no such excess. The simulator
/// charges it as `idle_wake_us` (every step an idle engine starts): no eager trace has an idle
/// engine mid-run to tell a fresh manager from a woken one.
fn first_step_excess_us(models: &[TraceModel], tier: Tier, host: &HostOverhead) -> Result<(f64, usize)> {
    let mut excess_us = Vec::new();
    for (m, run) in eager_calibration_runs(models) {
        let Some(first) = run.steps.iter().find(|s| s.num_requests > 0) else { continue };
        let p = predictor_for(m, run, tier, host.clone())?;
        let predicted_us = p.step_time(&logged_step_batch(first)).total_us;
        excess_us.push((first.end_s - first.start_s) * 1e6 - predicted_us);
    }
    Ok(((!excess_us.is_empty()).then(|| crate::quantile::median(&excess_us).max(0.0)).unwrap_or(0.0), excess_us.len()))
}

/// How long an idle engine core took from a run's first request to the step serving it
/// (`HostOverhead::idle_wake_us`), from the runs' engine timestamps: in a run whose first
/// requests came as a burst, the first step took those sent up to some time after the first and
/// not the next one; the wake-up lies between the two send times (their midpoint is the run's
/// estimate; where the whole burst made the step, the last send is a lower bound and stands).
/// Median over runs; None when no run shows a burst split or joined.
pub fn measured_idle_wake_us(runs: &[&TraceRun]) -> Option<f64> {
    let estimates: Vec<f64> = runs.iter().filter_map(|r| idle_wake_of_run(&r.requests)).collect();
    (!estimates.is_empty()).then(|| quantile(&estimates, 0.5) * 1e6)
}

/// One run's wake-up estimate in seconds (`measured_idle_wake_us`).
fn idle_wake_of_run(requests: &[TraceRequest]) -> Option<f64> {
    let first = requests.iter().min_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s))?;
    let step_s = first.engine_scheduled_s?;
    // Requests of the first step share its scheduling time (to the engine's clock resolution).
    let in_first = |q: &TraceRequest| q.engine_scheduled_s.is_some_and(|t| (t - step_s).abs() < 20e-6);
    let joined = requests.iter().filter(|q| in_first(q)).map(|q| q.arrival_s).fold(f64::NEG_INFINITY, f64::max);
    // Sent before that step began, yet left for a later one.
    let missed = requests.iter().filter(|q| !in_first(q) && q.arrival_s < step_s).map(|q| q.arrival_s).fold(f64::INFINITY, f64::min);
    match (joined > first.arrival_s, missed.is_finite()) {
        (_, true) => Some(((joined + missed) / 2.0 - first.arrival_s).max(0.0)),
        (true, false) => Some(joined - first.arrival_s),
        (false, false) => None,
    }
}

/// The client <-> engine path of a request (`HostOverhead::request_path_us`) as the runs'
/// engine timestamps show it: the median, over runs, of the time the run's first request took
/// from its send to the engine queue (the engine idle, so no step in the way), less the idle
/// engine's wake-up (`idle_wake_us`, which the simulator charges itself), plus the median over
/// requests of the time from the engine's first token to the client's. None when no run
/// carries engine timestamps.
pub fn measured_request_path_us(runs: &[&TraceRun], idle_wake_us: f64) -> Option<f64> {
    let firsts: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.requests.iter().min_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s)))
        .filter_map(|q| q.engine_path_s.map(|p| p[0]))
        .collect();
    let outs: Vec<f64> = runs.iter().flat_map(|r| &r.requests).filter_map(|q| q.engine_path_s.map(|p| p[1])).collect();
    (!firsts.is_empty()).then(|| ((quantile(&firsts, 0.5) + quantile(&outs, 0.5)) * 1e6 - idle_wake_us).max(0.0))
}

/// Every finished request's measured TTFT (ms).
fn measured_ttft_ms(run: &TraceRun) -> Vec<f64> {
    run.requests.iter().map(|r| (r.first_token_s - r.arrival_s) * 1e3).collect()
}

/// Mean over the deciles 10-90 % of |ln(predicted / measured)| of a run's TTFT distribution.
/// One quantile of a run whose prompts straddle the piecewise-graph limit jumps between the
/// graph mode and the graph-less one as a term moves; nine of them see both modes.
pub fn ttft_decile_error(predicted: &[f64], measured: &[f64]) -> f64 {
    let deciles = (1..=9).map(|i| i as f64 / 10.0);
    deciles.clone().map(|q| (quantile(predicted, q) / quantile(measured, q)).ln().abs()).sum::<f64>() / deciles.count() as f64
}

/// Fits the `vllm` engine's prefill-step launch terms (`piecewise_launch_per_layer_us`,
/// `eager_launch_per_layer_us`) on the vLLM runs of `VLLM_CALIBRATION_MODELS`, every other term
/// as in `base`: a grid search over both (coarse, then finer around the best) for the lowest mean
/// over runs of the TTFT deciles' mean |ln(predicted / measured)| (`ttft_decile_error`) plus
/// TPOT p50's (a mean, not a median: the terms move only the runs with prompt steps, which a
/// median over all runs can ignore). Decode-only steps replay full graphs and do not depend on them; what they price is how long a step with prompt
/// tokens keeps the host busy. The request path is set first, from the runs' engine timestamps
/// (`measured_request_path_us`) where they have them.
pub fn fit_host_vllm(models: &[TraceModel], tier: Tier, base: &HostOverhead) -> Result<HostOverhead> {
    let runs: Vec<(&TraceModel, &TraceRun)> = models
        .iter()
        .filter(|m| m.on_calibration_gpu() && VLLM_CALIBRATION_MODELS.contains(&m.label.as_str()))
        .flat_map(|m| m.runs.iter().filter(|r| r.status == "ok" && r.engine == TraceEngine::Vllm).map(move |r| (m, r)))
        .collect();
    if runs.len() < 4 {
        bail!("only {} vLLM calibration runs ({}); need at least 4", runs.len(), VLLM_CALIBRATION_MODELS.join(", "));
    }
    let measured: Vec<(f64, Vec<f64>)> = runs.iter().map(|(_, r)| (measured_metrics(r)["tpot_p50"], measured_ttft_ms(r))).collect();
    // The request path is measured, not fitted: the engine's own timestamps say what it is.
    let run_refs: Vec<&TraceRun> = runs.iter().map(|(_, r)| *r).collect();
    let wake_us = measured_idle_wake_us(&run_refs).unwrap_or(0.0);
    let path_us = measured_request_path_us(&run_refs, wake_us);
    let base = &HostOverhead { request_path_us: path_us.unwrap_or(base.request_path_us), idle_wake_us: wake_us, ..base.clone() };
    let loss = |piecewise: f64, eager: f64| -> Result<f64> {
        use rayon::prelude::*;
        let h = HostOverhead { piecewise_launch_per_layer_us: piecewise, eager_launch_per_layer_us: eager, ..base.clone() };
        let errs: Vec<f64> = runs
            .par_iter()
            .zip(&measured)
            .map(|((m, r), (tpot_p50, ttft))| {
                let p = replay(m, r, tier, &h)?;
                Ok(ttft_decile_error(&p.ttft_ms, ttft) + (p.metrics["tpot_p50"] / tpot_p50).ln().abs())
            })
            .collect::<Result<_>>()?;
        Ok(errs.iter().sum::<f64>() / errs.len() as f64)
    };
    // Every pair on a coarse grid, then every pair on a finer one around the best: the answer
    // does not depend on where a search started (a coordinate search did, by 0.01 in loss).
    let best_of = |pairs: Vec<(f64, f64)>| -> Result<(f64, f64, f64)> {
        let mut best = (0.0, 0.0, f64::INFINITY);
        for (p, e) in pairs {
            let l = loss(p, e)?;
            if l < best.2 {
                best = (p, e, l);
            }
        }
        Ok(best)
    };
    let start = loss(0.0, 0.0)?;
    let coarse = (0..=12).flat_map(|i| (0..=15).map(move |j| (50.0 * i as f64, 100.0 * j as f64)));
    let (p0, e0, _) = best_of(coarse.collect())?;
    let fine = (-2..=2).flat_map(|i| (-2..=2).map(move |j| (p0 + 25.0 * i as f64, e0 + 50.0 * j as f64)));
    let (piecewise, eager, best) = best_of(fine.filter(|&(p, e)| p >= 0.0 && e >= 0.0).collect())?;
    Ok(HostOverhead {
        piecewise_launch_per_layer_us: piecewise,
        eager_launch_per_layer_us: eager,
        source: Provenance {
            launch_terms: format!(
                "prefill-step launch terms fitted by `validate e2e` on {} vLLM runs of {} on the H200 (tier {}; mean |ln error| of TTFT deciles + TPOT p50 {:.3} -> {:.3}){}",
                runs.len(),
                VLLM_CALIBRATION_MODELS.join(", "),
                tier.as_str(),
                start,
                best,
                match path_us {
                    Some(v) => format!(", request path {v:.0} us and idle wake-up {wake_us:.0} us measured from their engine timestamps"),
                    None => String::new(),
                }
            ),
            ..base.source.clone()
        },
        ..base.clone()
    })
}

/// Fits the CUDA-graph `hf` host model on the host-calibration runs' CUDA-graph steps (the
/// calibration families and the host probes), stepping through each run's logged steps in order:
/// a step whose padded shape was already captured costs `GPU + per_layer x layers + per_step +
/// per_seq_cache_group x sequences x groups + per token of KV read per full / sliding group`
/// (fitted by least absolute deviations on those steps' residual over the predicted GPU time),
/// a step that captures a new graph adds `HostOverhead::capture_extra_us`
/// (its per-layer launch time and fixed part fitted on what is left of those steps).
pub fn fit_host_cudagraph(models: &[TraceModel], tier: Tier) -> Result<HostOverhead> {
    let mut replays: Vec<([f64; 4], f64)> = Vec::new();
    let mut captures: Vec<([f64; 4], CaptureLoad, f64, f64)> = Vec::new(); // (replay features, capture load, gpu, residual)
    let mut fitted_on: Vec<&str> = Vec::new();
    for m in models.iter().filter(|m| m.fits_host()) {
        for run in m.runs.iter().filter(|r| r.status == "ok" && r.engine == TraceEngine::Hf && r.tp == 1 && r.graphs.is_some()) {
            let p = predictor_for(m, run, tier, HostOverhead::zero())?;
            if !fitted_on.contains(&m.label.as_str()) {
                fitted_on.push(&m.label);
            }
            for s in run.steps.iter().filter(|s| s.num_requests > 0) {
                let batch = logged_step_batch(s);
                let (cost, capture) = p.step_time_and_capture(&batch);
                let captured = capture.is_some();
                let l = p.step_load(&batch, 0);
                // No per-layer term: the probes, which alone fit these, all have 12 layers, and
                // the real models' one-request host time does not grow with layers (CUDA-event
                // profiles: 1.2-1.5 ms at 16 to 32 layers).
                let x = [1.0, l.seq_groups as f64, l.full_read_tokens as f64, l.sliding_read_tokens as f64];
                // A zero host model charges nothing for a capture: cost is the GPU time. A
                // replayed step whose GPU time was measured (the probes, whose tiny kernels the
                // kernel model times worst) leaves the host time itself.
                let gpu_us = match s.gpu_ms {
                    Some(ms) if !captured => ms * 1e3,
                    _ => cost.total_us,
                };
                let residual = (s.end_s - s.start_s) * 1e6 - gpu_us;
                if let Some(load) = capture {
                    captures.push((x, load, cost.total_us, residual));
                } else if s.gpu_ms.is_some() {
                    // Replayed steps fit the host terms only where their GPU time was measured:
                    // the host time itself, whatever the tier's kernel model predicts.
                    replays.push((x, residual));
                }
            }
        }
    }
    if replays.len() < 10 || captures.len() < 3 {
        bail!("only {} replayed and {} capturing steps in the calibration CUDA-graph traces; need 10 and 3", replays.len(), captures.len());
    }
    let c = nonneg_least_absolute_deviations(&replays);
    // Capturing steps: residual = max(0, b K - gpu) + b K + fixed + a A (K: the step's kernel
    // launches, A: its million activation elements). Grid over the per-kernel launch time b
    // (0 to 200 us by 0.5 us); fixed and a by non-negative least absolute deviations.
    let mut best = (f64::INFINITY, 0.0, [0.0; 2]);
    for i in 0..=400 {
        let b = i as f64 * 0.5;
        let rows: Vec<([f64; 2], f64)> = captures
            .iter()
            .map(|(x, l, gpu, r)| {
                let k = l.kernels as f64;
                ([1.0, l.activations as f64 / 1e6], r - dot(x, &c) - (b * k - gpu).max(0.0) - b * k)
            })
            .collect();
        let fa = nonneg_least_absolute_deviations(&rows);
        let sad: f64 = rows.iter().map(|(x, y)| (y - dot(x, &fa)).abs()).sum();
        if sad < best.0 {
            best = (sad, b, fa);
        }
    }
    Ok(HostOverhead {
        per_step_us: c[0],
        per_seq_cache_group_us: c[1],
        per_full_read_token_us: c[2],
        per_sliding_read_token_us: c[3],
        graph_capture_us: best.2[0],
        graph_capture_per_kernel_us: best.1,
        graph_capture_per_m_activations_us: best.2[1],
        source: Provenance::of(format!(
            "fitted by `validate e2e` on {} replayed and {} capturing steps of the CUDA-graph runs of {} (tier {})",
            replays.len(),
            captures.len(),
            fitted_on.join(", "),
            tier.as_str()
        )),
        ..HostOverhead::zero()
    })
}

/// Ordinary least squares, refitting without any coefficient that comes out negative (an
/// overhead cannot be negative).
pub(crate) fn nonneg_least_squares<const N: usize>(rows: &[([f64; N], f64)]) -> [f64; N] {
    nonneg_weighted_least_squares(rows, &vec![1.0; rows.len()])
}

/// Least absolute deviations with non-negative coefficients, by iteratively reweighted least
/// squares. Host residuals over predicted GPU time are heavy-tailed: a run whose kernels the
/// model mispredicts (gpt-oss's eager sink attention) shifts every step of it by the same
/// error, which a squared loss spreads over every other family's host time.
fn nonneg_least_absolute_deviations<const N: usize>(rows: &[([f64; N], f64)]) -> [f64; N] {
    // Residuals below this (1 us) count as exact, which keeps the weights finite.
    const EXACT_US: f64 = 1.0;
    let mut coef = nonneg_least_squares(rows);
    for _ in 0..100 {
        let weights: Vec<f64> = rows.iter().map(|(x, y)| 1.0 / (y - dot(x, &coef)).abs().max(EXACT_US)).collect();
        let next = nonneg_weighted_least_squares(rows, &weights);
        let moved = next.iter().zip(&coef).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        coef = next;
        if moved < 1e-3 {
            break;
        }
    }
    coef
}

fn dot<const N: usize>(x: &[f64; N], c: &[f64; N]) -> f64 {
    x.iter().zip(c).map(|(a, b)| a * b).sum()
}

fn nonneg_weighted_least_squares<const N: usize>(rows: &[([f64; N], f64)], weights: &[f64]) -> [f64; N] {
    let mut active = [true; N];
    loop {
        let idx: Vec<usize> = (0..N).filter(|&i| active[i]).collect();
        let k = idx.len();
        let mut a = vec![vec![0.0; k + 1]; k];
        for ((x, y), w) in rows.iter().zip(weights) {
            for (r, &i) in idx.iter().enumerate() {
                for (c, &j) in idx.iter().enumerate() {
                    a[r][c] += w * x[i] * x[j];
                }
                a[r][k] += w * x[i] * y;
            }
        }
        let sol = solve(a);
        let mut coef = [0.0; N];
        for (r, &i) in idx.iter().enumerate() {
            coef[i] = sol[r];
        }
        match idx.iter().find(|&&i| coef[i] < 0.0) {
            Some(&i) => active[i] = false,
            None => return coef,
        }
        if !active.iter().any(|&a| a) {
            return [0.0; N];
        }
    }
}

/// Gaussian elimination with partial pivoting on an augmented matrix.
fn solve(mut a: Vec<Vec<f64>>) -> Vec<f64> {
    let n = a.len();
    for c in 0..n {
        let p = (c..n).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs())).unwrap();
        a.swap(c, p);
        if a[c][c].abs() < 1e-12 {
            continue;
        }
        for r in 0..n {
            if r != c {
                let f = a[r][c] / a[c][c];
                for k in c..=n {
                    a[r][k] -= f * a[c][k];
                }
            }
        }
    }
    (0..n).map(|i| if a[i][i].abs() < 1e-12 { 0.0 } else { a[i][n] / a[i][i] }).collect()
}

/// Collects the simulated requests of a replay.
#[derive(Default)]
struct Finished(Vec<RequestRecord>);

impl SimObserver for Finished {
    fn on_request(&mut self, r: &RequestRecord) -> Result<()> {
        self.0.push(r.clone());
        Ok(())
    }
}

struct VecSource(std::vec::IntoIter<RequestSpec>);

impl RequestSource for VecSource {
    fn next_request(&mut self) -> Result<Option<RequestSpec>> {
        Ok(self.0.next())
    }
}

/// Evictions the engine made in a run (soft resets summed over its requests), where recorded.
pub fn measured_evictions(run: &TraceRun) -> Option<u64> {
    run.requests.iter().map(|r| r.soft_resets.map(u64::from)).sum()
}

/// A run as the simulator replayed it.
pub struct Replayed {
    pub metrics: BTreeMap<&'static str, f64>,
    /// Every finished request's TTFT (ms), in no particular order.
    pub ttft_ms: Vec<f64>,
    /// The step-time model, described.
    pub describe: String,
    /// Requests preempted (evicted and recomputed) in the simulation.
    pub preemptions: u64,
}

/// Replays one run with its engine's profile and returns the predicted metrics.
pub fn replay(model: &TraceModel, run: &TraceRun, tier: Tier, host: &HostOverhead) -> Result<Replayed> {
    let p = predictor_for(model, run, tier, host.clone())?;
    let engine = engine_for(run)?;
    let kv_layout = crate::sim::kv::KvLayout::of(&model.config, engine.block_size);
    let cfg = SimConfig {
        engine,
        // The harness's cache: `blocks_per_group` blocks for each of the model's KV groups, in
        // one pool.
        num_gpu_blocks: run.blocks_per_group * kv_layout.groups(),
        kv_layout,
        max_model_len: model.config.max_context.min(u32::MAX as u64) as u32,
        dp: 1,
        pp: 1,
        router: RouterKind::RoundRobin,
        slo_ttft_ms: None,
        slo_tpot_ms: None,
    };
    // Requests in the order they were sent (a closed loop sends them in file order).
    let mut source = VecSource(run.sent.clone().into_iter());
    let mut finished = Finished::default();
    let closed = run.clients.map(|clients| crate::sim::ClosedLoop { clients, turnaround_us: run.turnaround_s.unwrap_or(0.0) * 1e6 });
    let outcome = crate::sim::run(&cfg, &p, &mut source, closed, &mut finished)?;
    let s = Summary::new(&outcome, &cfg, p.describe());
    // TTFT, TPOT and throughput from the simulated requests with the same quantile and
    // definitions as the measured side (`measured_metrics`); ITL from the simulator's histogram.
    let done: Vec<&RequestRecord> = finished.0.iter().filter(|r| r.rejected.is_none()).collect();
    let ttft: Vec<f64> = done.iter().map(|r| r.ttft_ms).collect();
    let tpot: Vec<f64> = done.iter().filter_map(|r| r.tpot_ms).collect();
    let end_s = done.iter().map(|r| r.finish_s).fold(0.0, f64::max);
    let tokens: u64 = done.iter().map(|r| r.output_tokens as u64).sum();
    let metrics = BTreeMap::from([
        ("ttft_p50", quantile(&ttft, 0.5)),
        ("ttft_p90", quantile(&ttft, 0.9)),
        ("tpot_p50", quantile(&tpot, 0.5)),
        ("tpot_p90", quantile(&tpot, 0.9)),
        ("itl_p50", s.itl_ms.p50),
        ("itl_p90", s.itl_ms.p90),
        ("throughput", tokens as f64 / end_s),
        ("served_fraction", served_fraction(&done.iter().map(|r| (r.arrival_s, r.finish_s)).collect::<Vec<_>>())),
    ]);
    Ok(Replayed { metrics, ttft_ms: ttft, describe: p.describe(), preemptions: outcome.rec.preemptions })
}

/// Calibration runs fit the host model; held-out families never fit anything; TP runs test the
/// communication and TP step model on top. vLLM's runs: those of `VLLM_CALIBRATION_MODELS` fit
/// the `vllm` engine's prefill-step launch terms, the others fit nothing.
pub const SPLITS: [&str; 10] = [
    "calibration",
    "held-out",
    "held-out-tp",
    "host-probe-cudagraph",
    "calibration-cudagraph",
    "held-out-cudagraph",
    "held-out-tp-cudagraph",
    "vllm-calibration",
    "vllm-held-out",
    "held-out-gpu",
];

fn split_of(m: &TraceModel, run: &TraceRun) -> &'static str {
    if !m.on_calibration_gpu() {
        "held-out-gpu"
    } else if run.engine == TraceEngine::Vllm {
        if VLLM_CALIBRATION_MODELS.contains(&m.label.as_str()) { "vllm-calibration" } else { "vllm-held-out" }
    } else if run.graphs.is_some() && run.tp > 1 {
        "held-out-tp-cudagraph"
    } else if run.graphs.is_some() && m.is_host_probe() {
        "host-probe-cudagraph"
    } else if run.graphs.is_some() {
        if m.is_calibration() { "calibration-cudagraph" } else { "held-out-cudagraph" }
    } else if run.tp > 1 {
        "held-out-tp"
    } else if m.is_calibration() {
        "calibration"
    } else {
        "held-out"
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub model: String,
    pub run: String,
    /// Spec-sheet id of the GPU it ran on and its host's probe reading (`TraceModel`).
    pub gpu: String,
    pub host_probe_ns: Option<f64>,
    pub split: &'static str,
    pub tier: &'static str,
    pub measured: BTreeMap<&'static str, f64>,
    pub predicted: BTreeMap<&'static str, f64>,
    pub ape: BTreeMap<&'static str, f64>,
    /// (measured, simulated) evictions, for runs whose trace records them.
    pub evictions: Option<(u64, u64)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TracesReport {
    /// Keyed `tier` (eager) and `tier/cudagraph`.
    pub host_fits: BTreeMap<String, HostOverhead>,
    pub kernel_models: BTreeMap<&'static str, String>,
    pub runs: Vec<RunResult>,
    /// tier -> split -> metric -> error statistics over runs.
    pub summary: BTreeMap<&'static str, BTreeMap<&'static str, BTreeMap<&'static str, ErrorStats>>>,
    /// Runs left out of the error table, with why.
    pub excluded: Vec<(String, String)>,
    /// Capacity from the load sweeps among the runs, measured vs replayed, per tier.
    pub load_sweeps: Vec<super::load_sweep::Sweep>,
}

/// Replays every complete run of the trace folders under each tier and aggregates the errors.
/// Only single-GPU runs of the calibration families fit the host model; tensor-parallel runs
/// form their own held-out split.
pub fn validate(dirs: &[&Path], tiers: &[Tier]) -> Result<TracesReport> {
    let mut models = Vec::new();
    for dir in dirs {
        models.extend(load_dir(dir)?);
    }
    let statics = super::static_steps::load(dirs)?;
    let tp_hooks_us = super::static_steps::fit_host(&statics, tiers.first().copied().unwrap_or(Tier::Target))?.map_or(0.0, |h| h.tp_launch_per_layer_us);
    validate_models(&models, tiers, &HostSpeed::Scale(1.0), tp_hooks_us)
}

/// The eager host model with transformers' tensor-parallel hook term (`static_steps::fit_host`).
pub fn with_tp_hooks(mut host: HostOverhead, tp_hooks_us: f64) -> HostOverhead {
    host.tp_launch_per_layer_us = tp_hooks_us;
    if tp_hooks_us > 0.0 {
        host.source.step_terms += &format!("; tensor-parallel hooks {tp_hooks_us:.0} us/layer: median over the static generate decode steps at tp > 1");
    }
    host
}

/// `validate` on traces already loaded.
/// `vllm_host_speed`: the speed of the host the vLLM runs were measured on, against the one the
/// shipped `vllm` host model was fitted on (`HostOverhead::at_speed`). `tp_hooks_us`: the eager
/// host model's tensor-parallel hook term (`static_steps::fit_host`, fitted on other lines).
pub fn validate_models(models: &[TraceModel], tiers: &[Tier], vllm_host_speed: &HostSpeed, tp_hooks_us: f64) -> Result<TracesReport> {
    let mut report =
        TracesReport { host_fits: BTreeMap::new(), kernel_models: BTreeMap::new(), runs: vec![], summary: BTreeMap::new(), excluded: vec![], load_sweeps: vec![] };
    for m in models {
        for r in m.runs.iter().filter(|r| r.status != "ok") {
            report.excluded.push((format!("{}/{}", m.label, r.key), format!("status {}: not every request finished", r.status)));
        }
    }
    let hf_runs = || models.iter().flat_map(|m| m.runs.iter()).filter(|r| r.engine == TraceEngine::Hf);
    let any_graphs = hf_runs().any(|r| r.graphs.is_some());
    let any_eager = hf_runs().any(|r| r.graphs.is_none());
    // vLLM's runs use the shipped `vllm` host model (fitted on the public H100 rows) at every tier.
    let host_vllm = Some(HostOverhead::for_engine("vllm")?.at_speed(vllm_host_speed)?);
    for &tier in tiers {
        let host_cg = if any_graphs { Some(fit_host_cudagraph(models, tier)?) } else { None };
        let host = if any_eager { Some(with_tp_hooks(fit_host(models, tier, host_cg.as_ref())?, tp_hooks_us)) } else { None };
        for m in models {
            for run in m.runs.iter().filter(|r| r.status == "ok") {
                let h = match (run.engine, run.graphs.is_some()) {
                    (TraceEngine::Vllm, _) => &host_vllm,
                    (TraceEngine::Hf, true) => &host_cg,
                    (TraceEngine::Hf, false) => &host,
                };
                let h = h.as_ref().expect("a host model for every mode with runs");
                let Replayed { metrics: predicted, describe, preemptions, .. } = replay(m, run, tier, h)?;
                report.kernel_models.insert(tier.as_str(), describe);
                let measured = measured_metrics(run);
                let apes = METRICS.iter().map(|&k| (k, ape(predicted[k], measured[k]))).collect();
                let evictions = measured_evictions(run).map(|n| (n, preemptions));
                report.runs.push(RunResult {
                    model: m.label.clone(),
                    run: run.key.clone(),
                    gpu: m.gpu.clone(),
                    host_probe_ns: m.host_probe_ns,
                    split: split_of(m, run),
                    tier: tier.as_str(),
                    measured,
                    predicted,
                    ape: apes,
                    evictions,
                });
            }
        }
        if let Some(h) = host {
            report.host_fits.insert(tier.as_str().to_string(), h);
        }
        if let Some(h) = host_cg {
            report.host_fits.insert(format!("{}/cudagraph", tier.as_str()), h);
        }
        if models.iter().any(|m| m.runs.iter().any(|r| r.engine == TraceEngine::Vllm)) {
            report.host_fits.insert(format!("{}/vllm", tier.as_str()), host_vllm.clone().expect("loaded above"));
        }
        for split in SPLITS {
            let rows: Vec<&RunResult> = report.runs.iter().filter(|r| r.tier == tier.as_str() && r.split == split).collect();
            let per_metric = METRICS.iter().map(|&k| (k, ErrorStats::of(&rows.iter().map(|r| r.ape[k]).collect::<Vec<_>>()))).collect();
            report.summary.entry(tier.as_str()).or_default().insert(split, per_metric);
        }
    }
    report.load_sweeps = super::load_sweep::find(&models, &report.runs);
    Ok(report)
}

impl TracesReport {
    pub fn render(&self) -> String {
        let mut s = String::from(
            "Traces (transformers continuous batching: engine profile `hf`; splits `vllm-*`: vLLM 0.24 serving, profile `vllm`; everything fitted on H200 runs, split `held-out-gpu`: runs on other GPUs and hosts): APE % over runs\n",
        );
        for (tier, host) in &self.host_fits {
            s += &format!("  host model [{tier}]: {} ({})\n", host.summary(), host.source);
        }
        for (tier, describe) in &self.kernel_models {
            s += &format!("  kernel model [{tier}]: {describe}\n");
        }
        s += &format!("\n  {:<10} {:<12} {:<11} {:>5} {:>9} {:>9} {:>9}\n", "tier", "split", "metric", "runs", "median", "p90", "max");
        for (tier, splits) in &self.summary {
            for (split, metrics) in splits {
                for (metric, e) in metrics.iter().filter(|(_, e)| e.count > 0) {
                    s += &format!("  {:<10} {:<12} {:<11} {:>5} {:>9.1} {:>9.1} {:>9.1}\n", tier, split, metric, e.count, e.median_ape, e.p90_ape, e.max_ape);
                }
            }
        }
        s += "\n  worst held-out runs (by TPOT p50 APE):\n";
        let mut held: Vec<&RunResult> = self.runs.iter().filter(|r| !r.split.starts_with("calibration") && r.split != "vllm-calibration").collect();
        held.sort_by(|a, b| b.ape["tpot_p50"].total_cmp(&a.ape["tpot_p50"]));
        for r in held.iter().take(5) {
            s += &format!(
                "    [{}] {} {}: TPOT p50 measured {:.1} ms predicted {:.1} ms; TTFT p50 {:.0} vs {:.0} ms\n",
                r.tier, r.model, r.run, r.measured["tpot_p50"], r.predicted["tpot_p50"], r.measured["ttft_p50"], r.predicted["ttft_p50"]
            );
        }
        let pressured: Vec<&RunResult> = self.runs.iter().filter(|r| r.evictions.is_some_and(|(m, p)| m + p > 0)).collect();
        if !pressured.is_empty() {
            s += "\n  runs that ran out of KV blocks: evictions (recomputed requests) measured vs simulated:\n";
            for r in pressured {
                let (m, p) = r.evictions.expect("filtered");
                s += &format!("    [{}] {} {}: {m} vs {p}\n", r.tier, r.model, r.run);
            }
        }
        s += &self.render_other_hosts();
        s += &super::load_sweep::render(&self.load_sweeps);
        for (run, why) in &self.excluded {
            s += &format!("  excluded {run}: {why}\n");
        }
        s
    }

    /// Runs on GPUs and machines nothing was fitted on, by device call: how far the predicted
    /// TTFT and TPOT sit from the measured ones next to the call's host-probe reading (the
    /// host terms carry the machines they were fitted on).
    fn render_other_hosts(&self) -> String {
        let tier = if self.runs.iter().any(|r| r.tier == "target") { "target" } else { self.runs.first().map_or("", |r| r.tier) };
        let mut calls: BTreeMap<(&str, &str), Vec<&RunResult>> = BTreeMap::new();
        for r in self.runs.iter().filter(|r| r.tier == tier && r.split == "held-out-gpu") {
            calls.entry((r.run.split('/').next().unwrap_or(""), r.gpu.as_str())).or_default().push(r);
        }
        if calls.is_empty() {
            return String::new();
        }
        let mut s = format!("\n  runs on other GPUs and hosts, by device call [{tier}]: predicted / measured, median over runs\n");
        s += &format!("    {:<22} {:<10} {:>13} {:>5} {:>9} {:>9}\n", "call", "gpu", "host probe ns", "runs", "TTFT p50", "TPOT p50");
        for ((call, gpu), rows) in calls {
            let ratio = |k: &str| crate::quantile::median(&rows.iter().map(|r| r.predicted[k] / r.measured[k]).collect::<Vec<_>>());
            let probe = rows[0].host_probe_ns.map_or("-".to_string(), |ns| format!("{ns:.0}"));
            s += &format!("    {:<22} {:<10} {:>13} {:>5} {:>8.2}x {:>8.2}x\n", call, gpu, probe, rows.len(), ratio("ttft_p50"), ratio("tpot_p50"));
        }
        s
    }

    pub fn write_csv(&self, path: &Path) -> Result<()> {
        let mut w = csv::Writer::from_path(path).with_context(|| format!("creating {}", path.display()))?;
        w.write_record(["model", "run", "split", "tier", "metric", "measured", "predicted", "ape_pct"])?;
        for r in &self.runs {
            for k in METRICS {
                w.write_record([r.model.as_str(), &r.run, r.split, r.tier, k, &format!("{:.4}", r.measured[k]), &format!("{:.4}", r.predicted[k]), &format!("{:.2}", r.ape[k])])?;
            }
        }
        w.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_record(engine: &str) -> Value {
        serde_json::json!({
            "run_id": "m/w", "status": "ok",
            "engine_requested": {"engine": engine, "block_size": 16, "num_blocks": 1000, "layer_groups": 1,
                                 "max_batch_tokens": 4096, "max_num_seqs": 64, "async_scheduling": false},
            "cache": {"num_blocks": 1000, "block_size": 16, "max_batch_tokens": 4096, "use_prefix_sharing": true},
            "steps": []
        })
    }

    #[test]
    fn a_vllm_run_replays_with_the_vllm_profile_and_its_own_settings() {
        let run = parse_run(&run_record("vllm"), "runs.jsonl: line 1").unwrap();
        assert_eq!(run.engine, TraceEngine::Vllm);
        let e = engine_for(&run).unwrap();
        assert_eq!(e.name, "vllm");
        assert_eq!((e.block_size, e.max_num_batched_tokens, e.max_num_seqs), (16, 4096, 64));
        assert!(e.prefix_caching && !e.async_scheduling);
        // A record without an engine is transformers'.
        let mut hf = run_record("vllm");
        hf["engine_requested"].as_object_mut().unwrap().remove("engine");
        assert_eq!(parse_run(&hf, "x").unwrap().engine, TraceEngine::Hf);
    }

    #[test]
    fn an_unknown_trace_engine_is_an_error_naming_the_field_and_the_allowed_values() {
        let err = parse_run(&run_record("sglang"), "runs.jsonl: line 7").unwrap_err().to_string();
        assert!(err.contains("runs.jsonl: line 7") && err.contains("engine_requested.engine") && err.contains("hf, vllm"), "{err}");
    }

    #[test]
    fn a_folder_is_replayed_on_the_gpu_its_env_records_name() {
        let d = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| std::fs::write(d.path().join(name), text).unwrap();
        let err = folder_gpu(d.path()).unwrap_err().to_string();
        assert!(err.contains("no env-*.json names the GPU"), "{err}");
        write("env-a.json", r#"{"gpu": "NVIDIA H100 80GB HBM3"}"#);
        write("env-b.json", r#"{"nvidia_smi_before": {"name": "NVIDIA H100 80GB HBM3"}}"#);
        assert_eq!(folder_gpu(d.path()).unwrap(), "h100_sxm");
        write("env-c.json", r#"{"gpu": "NVIDIA H200"}"#);
        let err = folder_gpu(d.path()).unwrap_err().to_string();
        assert!(err.contains("env-c.json") && err.contains("one trace folder holds one GPU's runs"), "{err}");
        write("env-c.json", r#"{"gpu": "NVIDIA GeForce RTX 4090"}"#);
        let err = folder_gpu(d.path()).unwrap_err().to_string();
        assert!(err.contains("env-c.json") && err.contains("RTX 4090") && err.contains("NVIDIA H200"), "{err}");
    }

    #[test]
    fn least_squares_recovers_known_coefficients() {
        // y = 300 x0 + 40000 + 0 x2 (a negative true coefficient would be dropped).
        let rows: Vec<([f64; 3], f64)> = (0..20).map(|i| {
            let x = [2.0 + i as f64, 1.0, (i % 5) as f64];
            (x, 300.0 * x[0] + 40_000.0)
        }).collect();
        let c = nonneg_least_squares(&rows);
        assert!((c[0] - 300.0).abs() < 1e-6 && (c[1] - 40_000.0).abs() < 1e-3 && c[2].abs() < 1e-6, "{c:?}");
        let rows2: Vec<([f64; 3], f64)> = rows.iter().map(|(x, y)| (*x, y - 50.0 * x[2])).collect();
        assert_eq!(nonneg_least_squares(&rows2)[2], 0.0);
    }

    #[test]
    fn least_absolute_deviations_ignore_a_mispredicted_run() {
        // Host = 100 us/layer + 3000 us/step + 50 us/seq on 100 steps of 8- and 32-layer models;
        // 10 steps of one run carry a 25 ms kernel misprediction. Squared loss moves the fit by
        // milliseconds; absolute loss recovers the host terms.
        let rows: Vec<([f64; 3], f64)> = (0..100)
            .map(|i| {
                let x = [if i % 2 == 0 { 8.0 } else { 32.0 }, 1.0, (1 + i % 32) as f64];
                (x, 100.0 * x[0] + 3000.0 + 50.0 * x[2] + if i % 10 == 0 { 25_000.0 } else { 0.0 })
            })
            .collect();
        let lsq = nonneg_least_squares(&rows);
        assert!((lsq[1] - 3000.0).abs() > 1000.0, "{lsq:?}");
        let lad = nonneg_least_absolute_deviations(&rows);
        assert!((lad[0] - 100.0).abs() < 1.0 && (lad[1] - 3000.0).abs() < 30.0 && (lad[2] - 50.0).abs() < 1.0, "{lad:?}");
    }
}

//! The end-to-end traces (`calibration/traces/*/`: transformers continuous batching, and vLLM's
//! own serving engine): loading with consistency checks, which runs calibrate what, and the
//! measured metrics of a run. Fitting the host models is `host_fit`, replaying a run `replay`,
//! the error report `traces_report`.

use crate::quantile::quantile;
use crate::model::ModelConfig;
use crate::perf::graphs::GraphPadding;
use crate::plan::evaluate::served_fraction;
use crate::workload::RequestSpec;
use anyhow::{anyhow, bail, Context, Result};
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
            replay_gap_per_kernel_ns: None,
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
        let e = super::super::replay::engine_for(&run).unwrap();
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
}

//! Reading the public silicon CSV (aiconfigurator `systems/silicon_sample.csv` layout) and
//! turning each aggregated-serving row into a simulator point, or a reason why not.

use crate::model::builtin_model_names;
use crate::schema::Dtype;
use crate::sim::engine::builtin_engines;
use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use std::collections::HashMap;
use std::path::Path;

/// One measured run as the file gives it. Numeric layout fields are `None` where the file
/// leaves them empty (disaggregated rows, dense models' MoE columns).
#[derive(Debug, Clone, Serialize)]
pub struct SiliconRow {
    /// 1-based line in the file (the header is line 1).
    pub line: usize,
    pub id: String,
    pub backend: String,
    pub backend_version: String,
    pub model_path: String,
    pub system: String,
    /// `agg` when the file has no `mode` column (the curated copy keeps agg rows only).
    pub mode: String,
    pub isl: Option<u32>,
    pub osl: Option<u32>,
    /// Empty = bf16.
    pub gemm_quant_mode: String,
    /// Client concurrency of the closed-loop benchmark.
    pub batch_size: Option<u32>,
    /// The benchmark's own concurrency where the row records it (`silicon_concurrency` column,
    /// else the `silicon_concurrency=` entry of upstream's `silicon_data_source`). It equals
    /// `batch_size` except on rows whose `batch_size` counts one attention-DP rank's or one
    /// replica's share (`plan` does not simulate those).
    pub silicon_concurrency: Option<u32>,
    pub tp_size: Option<u32>,
    pub pp_size: Option<u32>,
    pub attention_dp_size: Option<u32>,
    pub moe_tp_size: Option<u32>,
    pub moe_ep_size: Option<u32>,
    pub ttft_ms: f64,
    pub tpot_ms: f64,
    /// The benchmark client that measured the row (`client` column, else read from upstream's
    /// `silicon_data_source`).
    pub client: Client,
}

/// The benchmark client behind a row: what its requests' lengths were and how many it sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Client {
    /// InferenceMAX / InferenceX `utils/bench_serving/benchmark_serving.py` as its README runs
    /// it: `--random-range-ratio 0.8` (each prompt and answer length uniform in [0.8 L, L]),
    /// `--num-prompts 10 x concurrency`, `--max-concurrency`, `--request-rate inf`,
    /// `--ignore-eos`. The rows of upstream's InferenceX database export.
    InferenceMax,
    /// Provenance names no documented client (aiconfigurator's own collector, Dynamo runs):
    /// simulated with the fixed `isl`/`osl` the row gives and 3 requests per client.
    Undocumented,
    /// An undocumented row replayed under `UndocumentedClient::AiconfiguratorBench` (never read
    /// from a file).
    #[serde(rename = "aiconfigurator-bench")]
    AiconfiguratorBench,
}

/// What the replay assumes for rows whose provenance names no client (`validate e2e
/// --undocumented-client`). Nothing in the rows says which; the choice is reported with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum UndocumentedClient {
    /// Fixed lengths, 3 requests per client (at least 16): the shipped replay.
    #[default]
    Cohort,
    /// aiconfigurator's generator benchmark (`benchmark/bench_run.sh.j2`, `deployment_config.yaml`,
    /// `rule_plugin/benchmark/*.rule` in ai-dynamo/aiconfigurator): aiperf with fixed lengths and
    /// 50 requests per client, TensorRT-LLM and vLLM engines built with `max_batch_size = c` and
    /// `max_num_tokens = c + isl + 1500`. Its 2 x c warm-up requests are not left out here, and
    /// SGLang's `max_prefill_tokens` and mixed chunks are not modelled (its rows get only the
    /// request count). A hypothesis (docs/validation_e2e.md, session 25), not the shipped replay.
    AiconfiguratorBench,
}

/// `UndocumentedClient::AiconfiguratorBench`'s requests per client and token-budget margin.
pub const AICONFIGURATOR_BENCH_REQUESTS_PER_CLIENT: u32 = 50;
pub const AICONFIGURATOR_BENCH_TOKEN_MARGIN: u32 = 1500;

impl Client {
    pub fn as_str(self) -> &'static str {
        match self {
            Client::InferenceMax => "inferencemax",
            Client::Undocumented => "undocumented",
            Client::AiconfiguratorBench => "aiconfigurator-bench",
        }
    }

    fn parse(v: &str, origin: &str) -> Result<Client> {
        match v {
            "inferencemax" => Ok(Client::InferenceMax),
            "undocumented" => Ok(Client::Undocumented),
            _ => bail!("{origin}: field 'client' must be one of inferencemax, undocumented; got '{v}'"),
        }
    }

    /// Upstream's `silicon_data_source`: the InferenceX export names its dump
    /// (`source_file=2026-04-06.csv`); aiconfigurator's collector its result path under
    /// `data/<system>/<backend>/`.
    pub fn from_source(source: &str) -> Client {
        let file = source.split(';').map(str::trim).find_map(|kv| kv.strip_prefix("source_file="));
        match file {
            Some(f) if !f.contains('/') && f.ends_with(".csv") => Client::InferenceMax,
            _ => Client::Undocumented,
        }
    }
}

const REQUIRED: [&str; 4] = ["backend", "model_path", "silicon_ttft_ms", "silicon_tpot_ms"];

fn field<'a>(rec: &'a csv::StringRecord, cols: &HashMap<String, usize>, name: &str) -> &'a str {
    cols.get(name).and_then(|&i| rec.get(i)).unwrap_or("").trim()
}

fn parse_count(v: &str, origin: &str, name: &str) -> Result<Option<u32>> {
    if v.is_empty() {
        return Ok(None);
    }
    // Some exports write integers as floats ("4.0").
    let x: f64 = v.parse().map_err(|_| anyhow!("{origin}: field '{name}' must be a non-negative integer, got '{v}'"))?;
    if !(x >= 0.0 && x.fract() == 0.0 && x <= u32::MAX as f64) {
        bail!("{origin}: field '{name}' must be a non-negative integer, got '{v}'");
    }
    Ok(Some(x as u32))
}

fn parse_ms(v: &str, origin: &str, name: &str) -> Result<f64> {
    let x: f64 = v.parse().map_err(|_| anyhow!("{origin}: field '{name}' must be a positive number of milliseconds, got '{v}'"))?;
    if !(x > 0.0 && x.is_finite()) {
        bail!("{origin}: field '{name}' must be a positive number of milliseconds, got '{v}'");
    }
    Ok(x)
}

/// Reads every row; `limit` keeps the first N data rows.
pub fn load(path: &Path, limit: Option<usize>) -> Result<Vec<SiliconRow>> {
    let file = path.display().to_string();
    let mut rdr = csv::ReaderBuilder::new()
        .flexible(false)
        .from_path(path)
        .with_context(|| format!("opening silicon measurements {file}"))?;
    let headers = rdr.headers().with_context(|| format!("{file}: reading the header"))?.clone();
    let cols: HashMap<String, usize> = headers.iter().enumerate().map(|(i, h)| (h.trim().to_string(), i)).collect();
    for name in REQUIRED {
        if !cols.contains_key(name) {
            bail!("{file}: missing column '{name}' (needed: {}; header is: {})", REQUIRED.join(", "), headers.iter().collect::<Vec<_>>().join(","));
        }
    }
    let mut rows = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        if limit.is_some_and(|n| rows.len() >= n) {
            break;
        }
        let line = i + 2;
        let rec = rec.with_context(|| format!("{file}: line {line}"))?;
        let origin = format!("{file} line {line}");
        let f = |name: &str| field(&rec, &cols, name);
        let client = match (f("client"), f("silicon_data_source")) {
            ("", source) => Client::from_source(source),
            (c, _) => Client::parse(c, &origin)?,
        };
        let silicon_concurrency = match f("silicon_concurrency") {
            "" => f("silicon_data_source")
                .split(';')
                .find_map(|kv| kv.trim().strip_prefix("silicon_concurrency="))
                .map(|v| parse_count(v, &origin, "silicon_data_source silicon_concurrency"))
                .transpose()?
                .flatten(),
            v => parse_count(v, &origin, "silicon_concurrency")?,
        };
        let mode = match f("mode") {
            "" => "agg".to_string(),
            m => m.to_ascii_lowercase(),
        };
        rows.push(SiliconRow {
            line,
            id: f("id").to_string(),
            backend: f("backend").to_ascii_lowercase(),
            backend_version: f("backend_version").to_string(),
            model_path: f("model_path").to_string(),
            system: f("system").to_string(),
            mode,
            isl: parse_count(f("isl"), &origin, "isl")?,
            osl: parse_count(f("osl"), &origin, "osl")?,
            gemm_quant_mode: f("gemm_quant_mode").to_ascii_lowercase(),
            batch_size: parse_count(f("batch_size"), &origin, "batch_size")?,
            silicon_concurrency,
            tp_size: parse_count(f("tp_size"), &origin, "tp_size")?,
            pp_size: parse_count(f("pp_size"), &origin, "pp_size")?,
            attention_dp_size: parse_count(f("attention_dp_size"), &origin, "attention_dp_size")?,
            moe_tp_size: parse_count(f("moe_tp_size"), &origin, "moe_tp_size")?,
            moe_ep_size: parse_count(f("moe_ep_size"), &origin, "moe_ep_size")?,
            ttft_ms: parse_ms(f("silicon_ttft_ms"), &origin, "silicon_ttft_ms")?,
            tpot_ms: parse_ms(f("silicon_tpot_ms"), &origin, "silicon_tpot_ms")?,
            client,
        });
    }
    if rows.is_empty() {
        bail!("{file}: no data rows");
    }
    Ok(rows)
}

/// One simulator run: a closed loop of `concurrency` clients sending the row's client's requests.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct SimPoint {
    pub model: String,
    pub gpu: String,
    pub engine: String,
    pub tp: u32,
    pub pp: u32,
    pub ep: u32,
    pub dtype: Dtype,
    pub isl: u32,
    pub osl: u32,
    pub concurrency: u32,
    pub num_requests: u32,
    pub client: Client,
}

/// Requests per run. InferenceMAX sends 10 per client. For an undocumented client every
/// client sends at least three, so the first wave (all prompts at t=0) is a third of the run
/// at most, like the several-requests-per-client benchmarks the means come from; at least 16
/// requests for small concurrencies.
pub fn num_requests_for(client: Client, concurrency: u32) -> u32 {
    match client {
        Client::InferenceMax => 10 * concurrency,
        Client::Undocumented => (3 * concurrency).max(16),
        Client::AiconfiguratorBench => AICONFIGURATOR_BENCH_REQUESTS_PER_CLIENT * concurrency,
    }
}

/// InferenceMAX's `--random-range-ratio`: lengths uniform in [0.8 L, L].
pub const INFERENCEMAX_RANGE_RATIO: f64 = 0.8;

/// Time from an answer's end to the client's next request reaching the engine, assumed (not
/// measured) for InferenceMAX's client on the serving node over localhost HTTP. What matters
/// is that it is above zero and below a step: the engine has started its next step when the
/// request arrives. The H200 harness measured 0.3-0.5 ms for its in-process clients; the public
/// TTFT errors move by under a point between 0.3 and 2 ms.
pub const INFERENCEMAX_CLIENT_TURNAROUND_MS: f64 = 1.0;

/// `vllm serve` settings of InferenceX's H100 recipes (SemiAnalysisAI/InferenceX `benchmarks/`)
/// that the simulator models, as `simulate` flags. `70b_fp8_h100_slurm.sh`: `kv-cache-dtype:
/// fp8`, `no-enable-prefix-caching`, `max-num-batched-tokens: 8192`; `gptoss_fp4_h100.sh`: the
/// same without the fp8 KV cache. Both also set `async-scheduling` (the host's step work
/// overlapped with the GPU's: `--async-scheduling true`) and `--max-num-seqs $CONC` (no limit in
/// a closed loop of CONC clients); the gpt-oss one `VLLM_MXFP4_USE_MARLIN=1`: vLLM's Marlin MXFP4 experts instead of
/// the Triton `matmul_ogs` ones its profile names (measured at gpt-oss's shapes on the H200 by
/// `microbench/vllm_marlin_moe.py`, L40S by aiconfigurator; predicted for the H100 from those).
/// `single_node/minimaxm2.5_fp8_h100.sh` sets none of these (prefix caching on and 8192 batched
/// tokens are vLLM's defaults, as in the profile) but runs vLLM 0.18, where async scheduling is
/// on by default (vLLM PR #27614, the last item of its async-scheduling plan, early 2026); its
/// `cudagraph_mode: PIECEWISE` (attention outside the graphs) is not modelled.
pub fn inferencemax_server_flags(model: &str, gpu: &str, engine: &str) -> &'static [&'static str] {
    match (model, gpu, engine) {
        ("minimax-m2.5", "h100_sxm", "vllm") => &["--async-scheduling", "true"],
        ("llama-3.1-70b", "h100_sxm", "vllm") => {
            &["--kv-dtype", "fp8", "--prefix-caching", "false", "--max-num-batched-tokens", "8192", "--async-scheduling", "true"]
        }
        ("gpt-oss-120b", "h100_sxm", "vllm") => {
            &["--prefix-caching", "false", "--max-num-batched-tokens", "8192", "--async-scheduling", "true", "--kernel-backend", "moe=vllm/w4a16_mxfp4/vllm_gptossmxfp4moe_marlin,vllm/w4a16_mxfp4/vllm_compressedtensorsw4a4mxfp4moe_marlin"]
        }
        _ => &[],
    }
}

impl SimPoint {
    /// `kernelsight simulate` flags that reproduce this point (tier flag included).
    pub fn simulate_flags(&self, tier: crate::perf::Tier) -> Vec<String> {
        let mut v: Vec<String> = vec![
            "--model".into(),
            self.model.clone(),
            "--gpu".into(),
            self.gpu.clone(),
            "--tp".into(),
            self.tp.to_string(),
        ];
        if self.pp > 1 {
            v.extend(["--pp".into(), self.pp.to_string()]);
        }
        if self.ep > 1 {
            v.extend(["--ep".into(), self.ep.to_string()]);
        }
        if self.client == Client::InferenceMax {
            v.extend(["--workload".into(), "uniform-upto".into(), "--range-ratio".into(), INFERENCEMAX_RANGE_RATIO.to_string()]);
            v.extend(["--client-turnaround-ms".into(), INFERENCEMAX_CLIENT_TURNAROUND_MS.to_string()]);
            v.extend(inferencemax_server_flags(&self.model, &self.gpu, &self.engine).iter().map(|f| f.to_string()));
        }
        if self.client == Client::AiconfiguratorBench && (self.engine == "vllm" || self.engine == "trtllm") {
            let budget = self.concurrency + self.isl + AICONFIGURATOR_BENCH_TOKEN_MARGIN;
            v.extend(["--max-num-batched-tokens".into(), budget.to_string(), "--max-num-seqs".into(), self.concurrency.to_string()]);
        }
        v.extend([
            "--dtype".into(),
            self.dtype.as_str().into(),
            "--engine".into(),
            self.engine.clone(),
            "--isl".into(),
            self.isl.to_string(),
            "--osl".into(),
            self.osl.to_string(),
            "--concurrency".into(),
            self.concurrency.to_string(),
            "--num-requests".into(),
            self.num_requests.to_string(),
            "--tier".into(),
            tier.as_str().into(),
        ]);
        v
    }

    pub fn command_line(&self, tier: crate::perf::Tier) -> String {
        format!("kernelsight simulate {} --json", self.simulate_flags(tier).join(" "))
    }
}

/// Our model name for a Hugging Face id: last path segment, lower case, without the
/// `-Instruct` / `-FP8` suffixes of checkpoint variants (same architecture).
pub fn model_name(model_path: &str) -> Option<String> {
    let mut name = model_path.rsplit('/').next()?.trim().to_ascii_lowercase();
    loop {
        let before = name.len();
        for suffix in ["-instruct", "-fp8"] {
            if let Some(s) = name.strip_suffix(suffix) {
                name = s.to_string();
            }
        }
        if name.len() == before {
            break;
        }
    }
    builtin_model_names().into_iter().find(|m| *m == name)
}

/// GEMM precision of `gemm_quant_mode`. fp8_block (128x128 block scales) moves the same bytes
/// and runs on the same tensor cores as per-tensor fp8. nvfp4/mxfp4 on Hopper (no FP4 tensor
/// cores) run as 4-bit weights with 16-bit math, which is what `Dtype::Fp4` gives on a GPU
/// whose spec has no FP4 peak.
pub fn gemm_dtype(mode: &str) -> Option<Dtype> {
    match mode {
        "" | "bf16" | "bfloat16" | "float16" | "fp16" => Some(Dtype::Bf16),
        "fp8" | "fp8_block" | "fp8_static" => Some(Dtype::Fp8),
        "nvfp4" | "mxfp4" | "w4a16_mxfp4" => Some(Dtype::Fp4),
        _ => None,
    }
}

/// The simulator point of `row`, or why it cannot be simulated.
pub fn plan(row: &SiliconRow) -> std::result::Result<SimPoint, String> {
    plan_assuming(row, UndocumentedClient::Cohort)
}

/// As `plan`, with `undocumented` deciding how a row without a documented client is replayed.
pub fn plan_assuming(row: &SiliconRow, undocumented: UndocumentedClient) -> std::result::Result<SimPoint, String> {
    if row.mode != "agg" {
        return Err(format!("mode '{}': disaggregated prefill/decode serving is not modelled", row.mode));
    }
    let Some(model) = model_name(&row.model_path) else {
        return Err(format!("model '{}' has no config under models/", row.model_path));
    };
    let engines = builtin_engines();
    if !engines.contains(&row.backend) {
        return Err(format!("backend '{}' has no engine profile (known: {})", row.backend, engines.join(", ")));
    }
    let dtype = gemm_dtype(&row.gemm_quant_mode).ok_or_else(|| format!("gemm_quant_mode '{}' is not modelled", row.gemm_quant_mode))?;
    if row.attention_dp_size.unwrap_or(1) > 1 {
        return Err(format!("attention data parallelism ({}) is not modelled", row.attention_dp_size.unwrap_or(1)));
    }
    let need = |v: Option<u32>, name: &str| v.filter(|&x| x > 0).ok_or_else(|| format!("field '{name}' is empty or 0"));
    let (isl, osl) = (need(row.isl, "isl")?, need(row.osl, "osl")?);
    let concurrency = need(row.batch_size, "batch_size")?;
    if row.silicon_concurrency.is_some_and(|sc| sc != concurrency) {
        // Upstream's gpt-oss-120b TensorRT-LLM rows: batch_size 48, the run 192 clients (its id
        // says c192) at TP 4 with no attention DP in the layout columns. One reason for all such
        // rows, so the report groups them; the numbers are in the row.
        return Err("batch_size is a share of the benchmark's clients (silicon_concurrency), per attention-DP rank or per replica, which the layout columns do not say".into());
    }
    let tp = need(row.tp_size, "tp_size")?;
    let pp = row.pp_size.filter(|&x| x > 0).unwrap_or(1);
    let is_moe = crate::model::ModelConfig::load(&model).map_err(|e| e.to_string())?.moe.is_some();
    // Experts are split over `ep` GPUs of the TP group, each expert's width over tp / ep.
    let ep = match (row.moe_tp_size.filter(|&x| x > 0), row.moe_ep_size.filter(|&x| x > 0)) {
        _ if !is_moe => 1,
        (Some(mtp), Some(ep)) if mtp * ep != tp => {
            return Err(format!("MoE layout moe_tp {mtp} x moe_ep {ep} != tp {tp} is not modelled"));
        }
        (_, Some(ep)) => ep,
        (Some(mtp), None) if tp % mtp == 0 => tp / mtp,
        (Some(mtp), None) => return Err(format!("moe_tp {mtp} does not divide tp {tp}")),
        (None, None) => 1,
    };
    let client = match (row.client, undocumented) {
        (Client::Undocumented, UndocumentedClient::AiconfiguratorBench) => Client::AiconfiguratorBench,
        (c, _) => c,
    };
    Ok(SimPoint {
        model,
        gpu: if row.system.is_empty() { "h100_sxm".into() } else { row.system.clone() },
        engine: row.backend.clone(),
        tp,
        pp,
        ep,
        dtype,
        isl,
        osl,
        concurrency,
        num_requests: num_requests_for(client, concurrency),
        client,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hugging_face_ids_map_to_shipped_models() {
        assert_eq!(model_name("meta-llama/Llama-3.1-8B-Instruct").as_deref(), Some("llama-3.1-8b"));
        assert_eq!(model_name("Qwen/Qwen3-235B-A22B-FP8").as_deref(), Some("qwen3-235b-a22b"));
        assert_eq!(model_name("openai/gpt-oss-120b").as_deref(), Some("gpt-oss-120b"));
        assert_eq!(model_name("MiniMaxAI/MiniMax-M2.5").as_deref(), Some("minimax-m2.5"));
        assert_eq!(model_name("deepseek-ai/DeepSeek-R1"), None);
    }

    #[test]
    fn quant_modes() {
        assert_eq!(gemm_dtype(""), Some(Dtype::Bf16));
        assert_eq!(gemm_dtype("fp8_block"), Some(Dtype::Fp8));
        assert_eq!(gemm_dtype("nvfp4"), Some(Dtype::Fp4));
        assert_eq!(gemm_dtype("int4_wo"), None);
    }
}

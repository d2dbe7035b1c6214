//! `kernelsight plan`: the cheapest deployment serving a load within latency targets, over
//! GPU types, parallelism, precision, engine limits and disaggregated prefill/decode.
use super::workload::WorkloadArgs;
use crate::hardware::{load_gpu, GpuSpec};
use crate::model::ModelConfig;
use crate::perf::Tier;
use crate::plan::capacity::{max_sustainable_rate, CapacityOptions};
use crate::plan::search::{run_plan, FrontierMetric, PlanInput};
use crate::plan::sim_eval::SimEvaluator;
use crate::plan::slo::Slo;
use crate::plan::space::{powers_of_two_up_to, SearchSpace};
use crate::plan::{plot, report};
use crate::schema::Dtype;
use crate::sim::engine::EngineParams;
use crate::sim::router::RouterKind;
use crate::workload::{Arrival, WorkloadSpec};
use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Latency targets, shared by `plan` and `capacity`.
#[derive(Debug, Clone, Args)]
pub struct SloArgs {
    /// Time-to-first-token target, milliseconds.
    #[arg(long, allow_hyphen_values = true)]
    pub slo_ttft_ms: Option<f64>,
    /// Time-per-output-token target, milliseconds ((E2E - TTFT) / (output tokens - 1)).
    #[arg(long, allow_hyphen_values = true)]
    pub slo_tpot_ms: Option<f64>,
    /// End-to-end latency target, milliseconds.
    #[arg(long, allow_hyphen_values = true)]
    pub slo_e2e_ms: Option<f64>,
    /// Percentile the targets apply to.
    #[arg(long, default_value_t = 99.0, allow_hyphen_values = true)]
    pub percentile: f64,
}

impl SloArgs {
    pub fn to_slo(&self) -> Result<Slo> {
        let slo = Slo { ttft_ms: self.slo_ttft_ms, tpot_ms: self.slo_tpot_ms, e2e_ms: self.slo_e2e_ms, percentile: self.percentile };
        slo.validate()?;
        Ok(slo)
    }
}

/// Engine, timing tier and outputs, shared by `plan` and `capacity`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Engine profile and defaults (calibration/engines/): vllm, sglang, trtllm, hf, hf-cudagraph, hf-generate, static; or a .toml path.
    #[arg(long, default_value = "vllm")]
    pub engine: String,
    /// How requests are spread over data-parallel replicas.
    #[arg(long, value_enum, default_value = "round-robin")]
    pub router: RouterKind,
    /// How served tokens spread over MoE experts: uniform (default), balanced, or
    /// power_law_<alpha> (skewed loads as aiconfigurator's collectors draw them; under expert
    /// parallelism the busiest GPU's shard sets the step).
    #[arg(long, default_value = "uniform", value_parser = super::common::parse_moe_routing)]
    pub moe_routing: crate::kernels::cost::Routing,
    #[command(flatten)]
    pub host_speed: crate::cli::common::HostSpeedArgs,
    /// Print JSON for scripts instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Write plots (PNG and SVG) and the JSON result to this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Model short name (see `models list`) or path to a Hugging Face config.json.
    #[arg(long, default_value = "llama-3.1-8b")]
    pub model: String,
    /// GPU types to consider (ids from `hw list` or .toml paths), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "h100_sxm,h200_sxm,b200_sxm")]
    pub gpus: Vec<String>,
    /// Weight/activation dtypes to consider, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "bf16,fp8")]
    pub dtype: Vec<Dtype>,
    /// KV-cache dtypes to consider.
    #[arg(long, value_delimiter = ',', default_value = "bf16")]
    pub kv_dtype: Vec<Dtype>,
    /// Tensor-parallel degrees (default: powers of two up to each GPU's NVLink domain).
    #[arg(long, value_delimiter = ',')]
    pub tp: Vec<u64>,
    /// Pipeline-parallel stages.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub pp: Vec<u64>,
    /// Engine limit on running sequences, values to try.
    #[arg(long, value_delimiter = ',', default_value = "64,256")]
    pub max_num_seqs: Vec<u32>,
    /// Engine limit on tokens per step, values to try (default: the engine's).
    #[arg(long, value_delimiter = ',')]
    pub max_num_batched_tokens: Vec<u32>,
    /// Most GPUs one deployment may use (all replicas and pools).
    #[arg(long, default_value_t = 16)]
    pub max_gpus: u64,
    /// Also consider disaggregated prefill/decode pools (every split of the replicas).
    #[arg(long)]
    pub disagg: bool,
    /// Price per GPU-hour overriding the spec sheets: GPU=USD (comma-separated), or one
    /// number for every GPU.
    #[arg(long, value_delimiter = ',')]
    pub price: Vec<String>,
    /// Latency plotted against throughput per GPU on the frontier.
    #[arg(long, value_enum, default_value = "tpot")]
    pub frontier_metric: FrontierMetric,
    /// Kernel-time model: target (fitted on the GPU; falls back to cross-gen for GPUs without
    /// measurements), cross-gen (never uses the GPU's data) or roofline.
    #[arg(long, value_enum, default_value = "target")]
    pub tier: Tier,
    /// Run every simulation to the end. By default a run stops once its TTFT or E2E
    /// percentile can no longer meet the target; such candidates stay off the frontier.
    #[arg(long)]
    pub exhaustive: bool,
    /// Closest candidates to show when none meets the SLOs.
    #[arg(long, default_value_t = 5)]
    pub closest: usize,
    #[command(flatten)]
    pub slo: SloArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub run: RunArgs,
}

/// `--price` entries over the spec sheets' prices.
pub fn prices(gpus: &[GpuSpec], flags: &[String]) -> Result<BTreeMap<String, f64>> {
    let mut out: BTreeMap<String, f64> = gpus.iter().filter_map(|g| g.price_usd_per_hour.map(|p| (g.id.clone(), p))).collect();
    let positive = |s: &str| -> Result<f64> {
        match s.trim().parse::<f64>() {
            Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
            _ => bail!("--price: '{s}' is not a positive number of USD per GPU-hour"),
        }
    };
    for f in flags {
        match f.split_once('=') {
            Some((id, v)) => {
                let id = id.trim().to_ascii_lowercase();
                if !gpus.iter().any(|g| g.id == id) {
                    bail!("--price names GPU '{id}', which is not among the GPUs searched ({})", gpus.iter().map(|g| g.id.as_str()).collect::<Vec<_>>().join(", "));
                }
                out.insert(id, positive(v)?);
            }
            None => {
                let v = positive(f)?;
                for g in gpus {
                    out.insert(g.id.clone(), v);
                }
            }
        }
    }
    Ok(out)
}

/// The open-loop workload at a finite positive rate.
pub fn open_loop(w: &WorkloadArgs) -> Result<WorkloadSpec> {
    if w.rate.is_none() && w.concurrency.is_none() {
        bail!("give the offered load with --rate REQUESTS_PER_S");
    }
    let spec = w.to_spec(1.0)?;
    match spec.arrival {
        Arrival::Rate { rate_per_s, .. } if rate_per_s.is_finite() => Ok(spec),
        Arrival::Rate { .. } => bail!("--rate must be a finite number of requests per second for planning, not 'inf'"),
        Arrival::Closed { .. } => bail!("planning needs open-loop arrivals (--rate), not a closed loop (--concurrency)"),
    }
}

/// Longest prompt + output of the workload (every replica's KV cache must hold one).
pub fn longest_request(w: &WorkloadSpec) -> Result<u64> {
    let mut src = w.build()?;
    let mut longest = 0u64;
    while let Some(r) = src.next_request()? {
        longest = longest.max(r.prompt_tokens as u64 + r.output_tokens as u64);
    }
    Ok(longest)
}

pub fn progress_bar(what: &str) -> ProgressBar {
    let pb = ProgressBar::new(0);
    if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({eta} left)") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(what.to_string());
    pb
}

pub fn write_json(dir: &std::path::Path, name: &str, v: &serde_json::Value) -> Result<String> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating output directory {}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(v)?).with_context(|| format!("writing {}", path.display()))?;
    Ok(path.display().to_string())
}

pub fn run(a: PlanArgs) -> Result<()> {
    let model = ModelConfig::load(&a.model)?;
    let slo = a.slo.to_slo()?;
    let workload = open_loop(&a.workload)?;
    let Arrival::Rate { rate_per_s, .. } = workload.arrival else { unreachable!("open_loop checked") };
    let gpus: Vec<GpuSpec> = a.gpus.iter().map(|g| load_gpu(g.trim())).collect::<Result<_>>()?;
    let engine = EngineParams::load(&a.run.engine)?;
    let tp = if a.tp.is_empty() { powers_of_two_up_to(gpus.iter().map(|g| g.interconnect.gpus_per_node as u64).max().unwrap_or(8)) } else { a.tp.clone() };
    let mbt = if a.max_num_batched_tokens.is_empty() { vec![engine.max_num_batched_tokens] } else { a.max_num_batched_tokens.clone() };
    let space = SearchSpace {
        gpus: gpus.clone(),
        dtypes: a.dtype.clone(),
        kv_dtypes: a.kv_dtype.clone(),
        tp,
        pp: a.pp.clone(),
        max_num_seqs: a.max_num_seqs.clone(),
        max_num_batched_tokens: mbt,
        max_gpus: a.max_gpus,
        disaggregated: a.disagg,
        gpu_memory_utilization: engine.gpu_memory_utilization,
        buffers: engine.buffers(),
        min_kv_tokens: longest_request(&workload)?,
    };
    let enumerated = space.enumerate(&model)?;
    let eval = SimEvaluator::new(model.clone(), &gpus, engine, a.tier, a.run.router)?.with_served_routing(a.run.moe_routing).with_host_speed(&a.run.host_speed.speed()?)?;
    let started = std::time::Instant::now();
    let pb = if a.run.json { ProgressBar::hidden() } else { progress_bar("simulating") };
    let input = PlanInput {
        enumerated,
        workload: &workload,
        slo: slo.clone(),
        prices: prices(&gpus, &a.price)?,
        frontier_metric: a.frontier_metric,
        closest: a.closest,
        stop_early: !a.exhaustive,
    };
    let result = run_plan(input, &eval, &pb)?;
    // Latency vs load of the chosen deployment (or the closest one): how much headroom it has.
    let focus = result.best.or(result.closest.first().copied()).map(|i| &result.evaluated[i]);
    let capacity = match focus {
        Some(e) => {
            let opts = CapacityOptions { start_rate_per_s: rate_per_s, ..CapacityOptions::default() };
            let spinner = if a.run.json { ProgressBar::hidden() } else { ProgressBar::new_spinner() };
            spinner.set_message(format!("searching the highest rate {} sustains", e.label));
            spinner.enable_steady_tick(std::time::Duration::from_millis(200));
            let c = max_sustainable_rate(&eval, &e.candidate, &workload, &slo, &opts)?;
            spinner.finish_and_clear();
            Some(c)
        }
        None => None,
    };
    let elapsed_s = started.elapsed().as_secs_f64();
    let header = vec![
        format!("Plan for {} at {rate_per_s} req/s, {}", model.name, describe(&workload)),
        format!("Targets: {}", slo.describe()),
        format!("Search took {elapsed_s:.1} s on {} threads", rayon::current_num_threads()),
    ];
    let mut plots = Vec::new();
    if let Some(dir) = &a.run.out {
        plots.extend(plot::frontier_plot(dir, &result)?.into_iter().map(|p| p.display().to_string()));
        if let (Some(c), Some(e)) = (&capacity, focus) {
            let mut marks = vec![(rate_per_s, format!("requested {rate_per_s} req/s"))];
            if let Some(m) = c.max_rate_per_s {
                marks.push((m, format!("capacity {m:.2} req/s")));
            }
            let title = format!("{}: latency vs load ({})", model.name, e.label);
            plots.extend(plot::load_plot(dir, "latency_vs_load", &title, &c.curve, &slo, marks)?.into_iter().map(|p| p.display().to_string()));
        }
    }
    let question = serde_json::json!({
        "model": model.name, "rate_per_s": rate_per_s, "workload": describe(&workload),
        "gpus": a.gpus, "dtypes": a.dtype, "max_gpus": a.max_gpus, "disaggregated": a.disagg,
        "tier": a.tier, "engine": a.run.engine, "search_seconds": elapsed_s,
    });
    let doc = report::plan_json(question, &result, capacity.as_ref(), &plots);
    if let Some(dir) = &a.run.out {
        plots.push(write_json(dir, "plan.json", &doc)?);
    }
    if a.run.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", report::render_plan(&header, &result, capacity.as_ref()));
        if !plots.is_empty() {
            println!("\nwrote {}", plots.join(", "));
        }
    }
    Ok(())
}

/// One line describing the workload.
pub fn describe(w: &WorkloadSpec) -> String {
    super::simulate::describe_workload(w)
}

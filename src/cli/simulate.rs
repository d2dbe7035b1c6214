//! `kernelsight simulate`: serve a workload on a deployment and report latency and throughput.
use super::common::{parse_moe_routing, DeployArgs, NamedBackends};
use super::workload::WorkloadArgs;
use crate::deployment::Deployment;
use crate::hardware::GpuSpec;
use crate::kernels::memory;
use crate::model::ModelConfig;
use crate::perf::predictor::Predictor;
use crate::perf::Tier;
use crate::report::{self, Outputs};
use crate::sim::engine::EngineParams;
use crate::sim::router::RouterKind;
use crate::sim::summary::Summary;
use crate::sim::{self, Outcome, SimConfig};
use crate::workload::{Arrival, Lengths, Sharing, WorkloadSpec};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::IsTerminal;
use std::path::PathBuf;

/// Arrival rate of the default scenario: keeps one H200 serving Llama-3.1-8B busy (batches of
/// ~65 sequences under the calibrated target tier) without an ever-growing queue; at 50 req/s
/// the queue grows for the whole run.
pub const DEFAULT_RATE_PER_S: f64 = 25.0;

#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  kernelsight simulate\n  kernelsight simulate --rate 40 --num-requests 5000 --slo-ttft-ms 500 --slo-tpot-ms 50 --out run1\n  kernelsight simulate --model llama-3.1-8b --tp 2 --dp 2 --router least-loaded --engine sglang\n  kernelsight simulate --trace requests.csv --json")]
pub struct SimulateArgs {
    #[command(flatten)]
    pub deploy: DeployArgs,
    /// Data-parallel replicas, each a full tp x pp engine.
    #[arg(long, default_value_t = 1, allow_hyphen_values = true)]
    pub dp: i64,
    /// Engine profile (calibration/engines/*.toml): vllm, sglang, trtllm, hf (transformers continuous batching, eager), hf-cudagraph, hf-generate (transformers `generate`, static batches), static; or a path to an engine .toml.
    #[arg(long, default_value = "vllm")]
    pub engine: String,
    /// Token budget of one step (engine default otherwise).
    #[arg(long, allow_hyphen_values = true)]
    pub max_num_batched_tokens: Option<i64>,
    /// Most sequences running at once.
    #[arg(long, allow_hyphen_values = true)]
    pub max_num_seqs: Option<i64>,
    /// KV block size in tokens.
    #[arg(long, allow_hyphen_values = true)]
    pub block_size: Option<i64>,
    /// Chunked prefill on/off.
    #[arg(long)]
    pub chunked_prefill: Option<bool>,
    /// Prefix caching on/off.
    #[arg(long)]
    pub prefix_caching: Option<bool>,
    /// vLLM's async scheduling on/off: host work of the next step overlaps the GPU's current one (not on an idle engine), and an arrival joins the step after next.
    #[arg(long)]
    pub async_scheduling: Option<bool>,
    /// Share of GPU memory the engine may use (weights + activations + KV cache).
    #[arg(long, allow_hyphen_values = true)]
    pub gpu_memory_utilization: Option<f64>,
    /// Kernel library of one op family, `OP=PREFIX[,PREFIX...]` (repeatable): replaces the
    /// engine's `[kernel_backends]` entry for OP, e.g. vLLM's Marlin MXFP4 experts under
    /// VLLM_MXFP4_USE_MARLIN=1: `moe=vllm/w4a16_mxfp4/vllm_gptossmxfp4moe_marlin`.
    #[arg(long = "kernel-backend", value_name = "OP=PREFIX")]
    pub kernel_backends: Vec<String>,
    #[command(flatten)]
    pub host_speed: crate::cli::common::HostSpeedArgs,
    /// How served tokens spread over a MoE layer's experts: uniform (default), balanced, or
    /// power_law_<alpha> (skewed expert loads as aiconfigurator's collectors draw them; with
    /// expert parallelism the busiest GPU's shard sets the step).
    #[arg(long, default_value = "uniform", value_parser = parse_moe_routing)]
    pub moe_routing: crate::kernels::cost::Routing,
    /// Pin the KV block count per replica (e.g. the count an engine logged) instead of deriving it.
    /// For a model mixing full and sliding-window layers, the pages over all KV groups (vLLM's
    /// and transformers' hybrid pool: a block per group).
    #[arg(long, allow_hyphen_values = true)]
    pub num_gpu_blocks: Option<i64>,
    /// Longest prompt + output served (default: the model's context length).
    #[arg(long, allow_hyphen_values = true)]
    pub max_model_len: Option<i64>,
    /// How requests are spread over data-parallel replicas.
    #[arg(long, value_enum, default_value = "round-robin")]
    pub router: RouterKind,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// TTFT objective for goodput, milliseconds.
    #[arg(long, allow_hyphen_values = true)]
    pub slo_ttft_ms: Option<f64>,
    /// TPOT objective for goodput, milliseconds.
    #[arg(long, allow_hyphen_values = true)]
    pub slo_tpot_ms: Option<f64>,
    /// Print the summary as JSON instead of the report.
    #[arg(long)]
    pub json: bool,
    /// Write requests.csv, summary.json, plots (PNG + SVG) and trace.json here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Steps kept in trace.json (it grows ~0.5 KB per step).
    #[arg(long, default_value_t = 20_000)]
    pub trace_max_steps: u64,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

fn positive(flag: &str, v: i64) -> Result<u32> {
    if v < 1 || v > u32::MAX as i64 {
        bail!("--{flag} must be a positive integer, got {v}");
    }
    Ok(v as u32)
}

/// Everything a run needs, resolved from the flags.
pub struct Scenario {
    pub model: ModelConfig,
    pub gpu: GpuSpec,
    pub dep: Deployment,
    pub cfg: SimConfig,
    pub workload: WorkloadSpec,
    pub predictor: Predictor,
    /// The tier asked for (`--tier`); `predictor.tier()` is the one in use after any fallback.
    pub tier: Tier,
    /// Lines describing the setup, for the report.
    pub setup: Vec<String>,
    /// Per-GPU memory: weights, activations (attention buffers included), KV budget.
    pub memory: memory::MemoryPlan,
}

impl SimulateArgs {
    pub fn scenario(&self) -> Result<Scenario> {
        let mut engine = EngineParams::load(&self.engine)?;
        let (model, gpu, mut dep) = self.deploy.load(&engine)?;
        dep.dp = positive("dp", self.dp)? as u64;
        if let Some(v) = self.max_num_batched_tokens {
            engine.max_num_batched_tokens = positive("max-num-batched-tokens", v)?;
        }
        if let Some(v) = self.max_num_seqs {
            engine.max_num_seqs = positive("max-num-seqs", v)?;
        }
        if let Some(v) = self.block_size {
            engine.block_size = positive("block-size", v)?;
        }
        if let Some(v) = self.chunked_prefill {
            engine.chunked_prefill = v;
        }
        if let Some(v) = self.prefix_caching {
            engine.prefix_caching = v;
        }
        if let Some(v) = self.async_scheduling {
            engine.async_scheduling = v;
        }
        if let Some(v) = self.gpu_memory_utilization {
            if !(v > 0.0 && v <= 1.0) {
                bail!("--gpu-memory-utilization must be in (0, 1], got {v}");
            }
            engine.gpu_memory_utilization = v;
        }
        let named = NamedBackends::parse(&self.kernel_backends)?;
        named.apply(&mut engine);
        engine.validate().with_context(|| format!("engine '{}'", engine.name))?;
        let plan = memory::plan(&model, &gpu, &dep, engine.gpu_memory_utilization, engine.max_num_batched_tokens as u64, engine.buffers())?;
        let kv_layout = crate::sim::kv::KvLayout::of(&model, engine.block_size);
        let derived_blocks = kv_layout.pool_pages(plan.kv_capacity_tokens, engine.block_size);
        let num_gpu_blocks = match self.num_gpu_blocks {
            // More blocks than the memory left after weights and activations would OOM the engine.
            Some(v) if v as u64 > derived_blocks as u64 => {
                let v = positive("num-gpu-blocks", v)?;
                let gib = |b: f64| b / (1u64 << 30) as f64;
                // A block holds block_size tokens of one KV group's layers.
                let per_block = plan.pool_bytes_per_kv_token_per_gpu() * engine.block_size as f64
                    / kv_layout.groups() as f64;
                bail!(
                    "--num-gpu-blocks {v}: {} on {} holds at most {derived_blocks} blocks of {} tokens ({:.1} GiB KV budget per GPU = {:.1} GiB usable - {:.1} GiB weights - {:.1} GiB activations); {v} blocks need about {:.1} GiB",
                    model.name, gpu.id, engine.block_size, gib(plan.kv_budget_bytes_per_gpu), gib(plan.capacity_bytes_per_gpu),
                    gib(plan.weight_bytes_per_gpu), gib(plan.activation_bytes_per_gpu), gib(v as f64 * per_block)
                );
            }
            Some(v) => positive("num-gpu-blocks", v)?,
            // transformers sizes its own cache with its memory polynomial, whether or not the
            // peak then fits (`over_device` says when it would not).
            None => engine.unpinned_pool_pages(&model, &gpu, &dep, &plan)?,
        };
        let self_sized = engine.sizes_own_pool() && self.num_gpu_blocks.is_none();
        let over_device = self_sized
            .then(|| {
                let kv_tokens = memory::transformers_kv_tokens(&model, num_gpu_blocks as u64 * engine.block_size as u64);
                let budget = engine.max_num_batched_tokens as u64;
                memory::allocated_peak_bytes_per_gpu(&model, &dep, kv_tokens, budget, budget, engine.buffers()) + memory::CUDA_CONTEXT_BYTES
            })
            .filter(|&peak| peak > gpu.hbm_bytes());
        let max_model_len = match self.max_model_len {
            Some(v) => positive("max-model-len", v)?,
            None => model.max_context.min(u32::MAX as u64) as u32,
        };
        let tier = self.deploy.tier.unwrap_or(Tier::Target);
        let km = named.kernel_model(&gpu, &dep, tier)?.with_served_routing(self.moe_routing);
        let note = if km.warnings().is_empty() { None } else { Some(km.warnings().join("; ")) };
        let host = crate::perf::host::HostOverhead::for_engine(&engine.name)?.at_speed(&self.host_speed.speed()?)?;
        let host_line = format!(
            "host overhead ({}): {}{}",
            host.source,
            host.summary(),
            engine.cuda_graphs.map(|_| " (captured on first use of a padded shape)").unwrap_or("")
        );
        // A padded KV read is capped at every page of the pool (transformers' `num_pages`).
        let kv_cap_tokens = num_gpu_blocks as u64 * engine.block_size as u64;
        let predictor = Predictor::for_engine(&model, &gpu, &dep, km, &engine, host, kv_cap_tokens)?;
        let workload = self.workload.to_spec(DEFAULT_RATE_PER_S)?;
        let cfg = SimConfig {
            engine,
            num_gpu_blocks,
            kv_layout,
            max_model_len,
            dp: dep.dp as u32,
            pp: dep.pp as u32,
            router: self.router,
            slo_ttft_ms: self.slo_ttft_ms,
            slo_tpot_ms: self.slo_tpot_ms,
        };
        cfg.validate()?;
        let gib = |b: f64| b / (1u64 << 30) as f64;
        let e = &cfg.engine;
        let kv_tokens = num_gpu_blocks as u64 / kv_layout.groups() as u64 * e.block_size as u64;
        let mut setup = vec![
            format!(
                "{} on {} x {} (tp {}, pp {}, ep {}, dp {}; weights {}, KV {})",
                model.name, dep.total_gpus(), gpu.id, dep.tp, dep.pp, dep.ep, dep.dp, dep.weight_dtype, dep.kv_dtype
            ),
            format!(
                "engine {}: {} batched tokens, {} seqs, block {}, chunked prefill {}, prefix caching {}",
                e.name,
                e.max_num_batched_tokens,
                e.max_num_seqs,
                e.block_size,
                if e.chunked_prefill { "on" } else { "off" },
                if e.prefix_caching { "on" } else { "off" }
            ),
            format!(
                "KV cache {} = {} tokens per replica ({}; per GPU: weights {:.1} GiB, activations {:.1} GiB, KV {:.1} GiB{} of {:.1} GiB usable at {:.2})",
                if kv_layout.sliding_groups == 0 {
                    format!("{} blocks", report::terminal::group(num_gpu_blocks as u64))
                } else {
                    format!(
                        "{} pages over {} full and {} sliding-window KV groups (a sliding group holds at most {} blocks per request)",
                        report::terminal::group(num_gpu_blocks as u64),
                        kv_layout.full_groups,
                        kv_layout.sliding_groups,
                        kv_layout.sliding_cap_blocks
                    )
                },
                report::terminal::group(kv_tokens),
                if self.num_gpu_blocks.is_some() {
                    "pinned by --num-gpu-blocks".to_string()
                } else if self_sized {
                    format!("sized as transformers sizes it: its memory polynomial within {:.2} of the memory free after weights", e.gpu_memory_utilization)
                } else {
                    "derived from memory".to_string()
                },
                gib(plan.weight_bytes_per_gpu),
                gib(plan.activation_bytes_per_gpu),
                gib(kv_tokens as f64 * plan.kv_bytes_per_token_per_gpu),
                if plan.mask_bytes_per_kv_token_per_gpu > 0.0 {
                    format!(", attention masks over the cache {:.1} GiB", gib(kv_tokens as f64 * plan.mask_bytes_per_kv_token_per_gpu))
                } else {
                    String::new()
                },
                gib(plan.capacity_bytes_per_gpu),
                e.gpu_memory_utilization
            ),
            format!(
                "timing tier {} (asked: {}): {}",
                predictor.tier().as_str(),
                tier.as_str(),
                crate::perf::StepTimeModel::describe(&predictor)
            ),
            host_line,
            format!("workload {}", describe_workload(&workload)),
        ];
        if let Some(n) = note {
            setup.push(format!("note: {n}"));
        }
        if let Some(c) = cfg.engine.buffers().caveat(&model) {
            setup.push(format!("note: memory: {c}"));
        }
        if let Some(peak) = over_device {
            setup.push(format!(
                "note: memory: the self-sized pool's warm-up step needs {:.1} GiB of the {:.1} GiB the GPU holds: transformers logs 'Failed to warm up', skips it and captures shapes as they come (measured with CUDA graphs: calibration/traces/h100_sxm_selfsize48)",
                gib(peak), gib(gpu.hbm_bytes())
            ));
        }
        Ok(Scenario { model, gpu, dep, cfg, workload, predictor, tier, setup, memory: plan })
    }
}

pub fn describe_workload(w: &WorkloadSpec) -> String {
    let n = match (w.num_requests, &w.trace) {
        (Some(n), _) => format!("{n} requests"),
        (None, Some(_)) => "all requests".into(),
        (None, None) => format!("{} requests", crate::workload::DEFAULT_NUM_REQUESTS),
    };
    let src = match &w.trace {
        Some(p) => format!("replayed from {}", p.display()),
        None => match &w.lengths {
            Lengths::ShareGpt => "ShareGPT-like lengths (lognormal, means 161 in / 338 out)".into(),
            Lengths::Fixed { isl, osl } => format!("fixed {isl} in / {osl} out"),
            Lengths::Uniform { isl, osl, range_ratio } => format!("uniform {isl} in / {osl} out +-{:.0}%", range_ratio * 100.0),
            Lengths::UniformUpTo { isl, osl, low_ratio } => format!("uniform {:.0}-{isl} in / {:.0}-{osl} out", (*isl as f64 * low_ratio).floor(), (*osl as f64 * low_ratio).floor()),
        },
    };
    let arr = match w.arrival {
        // An open-loop replay sends each request at its recorded arrival time.
        Arrival::Rate { .. } if w.trace.is_some() => "at the file's arrival times".to_string(),
        Arrival::Rate { rate_per_s, .. } if rate_per_s.is_infinite() => "all at t=0".to_string(),
        Arrival::Rate { rate_per_s, burstiness: 1.0 } => format!("Poisson {rate_per_s} req/s"),
        Arrival::Rate { rate_per_s, burstiness } => format!("Gamma {rate_per_s} req/s, burstiness {burstiness}"),
        Arrival::Closed { concurrency, turnaround_s } if turnaround_s > 0.0 => format!("closed loop, {concurrency} clients, {:.2} ms turnaround", turnaround_s * 1e3),
        Arrival::Closed { concurrency, .. } => format!("closed loop, {concurrency} clients"),
    };
    let share = match w.sharing {
        Sharing::None => String::new(),
        Sharing::Groups { groups, prefix_tokens } => format!(", {groups} shared prefixes of {prefix_tokens} tokens"),
        Sharing::Sessions { turns, think_time_s } => format!(", {turns}-turn sessions {think_time_s} s apart"),
    };
    format!("{n}, {src}, {arr}{share}, seed {}", w.seed)
}

/// A finished run.
pub struct Report {
    pub scenario: Scenario,
    pub outcome: Outcome,
    pub summary: Summary,
}

impl Report {
    /// The `--json` / summary.json object: the summary plus the setup lines.
    pub fn json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(&self.summary).expect("summary serializes");
        v["model"] = self.scenario.model.name.clone().into();
        v["gpu"] = self.scenario.gpu.id.clone().into();
        v["tier"] = self.scenario.predictor.tier().as_str().into();
        v["tier_requested"] = self.scenario.tier.as_str().into();
        v["moe_routing"] = self.scenario.predictor.served_routing().served_name().into();
        v["setup"] = self.scenario.setup.clone().into();
        v["memory"] = serde_json::to_value(&self.scenario.memory).expect("memory plan serializes");
        v["sustained_gemm"] = match self.scenario.predictor.sustained_gemm() {
            Some(cap) => serde_json::json!({ "bf16_tflops": cap.sustained_tflops(), "bf16_tflops_most_idle": cap.tflops_at(0.0), "source": cap.from }),
            None => serde_json::Value::Null,
        };
        v
    }
}

/// Runs the scenario, streaming per-request rows and the trace into `out` when given.
pub fn execute(args: &SimulateArgs) -> Result<Report> {
    let scenario = args.scenario()?;
    let mut outputs = Outputs::default();
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        outputs.csv = Some(report::csv_out::RequestCsv::create(&dir.join("requests.csv"))?);
        outputs.trace = Some(report::trace::ChromeTrace::create(&dir.join("trace.json"), args.trace_max_steps)?);
    }
    if !args.quiet && !args.json && std::io::stderr().is_terminal() {
        let total = scenario.workload.num_requests.or(scenario.workload.trace.is_none().then_some(crate::workload::DEFAULT_NUM_REQUESTS));
        let bar = match total {
            Some(n) => indicatif::ProgressBar::new(n),
            None => indicatif::ProgressBar::new_spinner(),
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} simulating [{bar:30}] {pos}/{len} requests ({per_sec})")
                .expect("static template")
                .progress_chars("=> "),
        );
        outputs.progress = Some(bar);
    }
    let mut source = scenario.workload.build()?;
    let outcome = sim::run(&scenario.cfg, &scenario.predictor, source.as_mut(), scenario.workload.closed_loop(), &mut outputs)?;
    if let Some(p) = outputs.progress.take() {
        p.finish_and_clear();
    }
    let timing = format!("{} ({})", scenario.predictor.tier().as_str(), crate::perf::StepTimeModel::describe(&scenario.predictor));
    let summary = Summary::new(&outcome, &scenario.cfg, timing);
    if let Some(why) = summary.all_rejected() {
        bail!("{why}");
    }
    let report = Report { scenario, outcome, summary };
    if let Some(dir) = &args.out {
        if let Some(c) = outputs.csv.take() {
            c.finish()?;
        }
        if let Some(t) = outputs.trace.take() {
            t.finish()?;
        }
        // The file also carries the time series behind the timeline plot (at most 512 buckets).
        let mut summary = report.json();
        summary["timeline"] = serde_json::to_value(&report.outcome.rec.series)?;
        let json = serde_json::to_string_pretty(&summary)?;
        std::fs::write(dir.join("summary.json"), json + "\n").with_context(|| format!("writing {}/summary.json", dir.display()))?;
        report::plots::write_all(dir, &report.outcome, &report.summary)?;
    }
    Ok(report)
}

pub fn run(args: SimulateArgs) -> Result<()> {
    let report = execute(&args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.json())?);
    } else {
        print!("{}", report::terminal::render(&report.scenario.setup, &report.summary));
        if let Some(dir) = &args.out {
            println!("\nwrote {0}/requests.csv, {0}/summary.json, {0}/trace.json and plots (*.png, *.svg)", dir.display());
        }
    }
    Ok(())
}

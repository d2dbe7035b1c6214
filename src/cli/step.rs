//! `kernelsight step`: the per-kernel table of one forward step.
use super::common::{parse_moe_routing, DeployArgs, NamedBackends};
use crate::batch_spec::parse_batch_spec;
use crate::kernels::memory;
use crate::perf::predictor::Predictor;
use crate::perf::{StepTimeModel, Tier};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;

#[derive(Debug, Args)]
#[command(after_help = "Example:\n  kernelsight step --model llama-3.1-8b --gpu h200_sxm --batch prefill:2x512,decode:64@2048")]
pub struct StepArgs {
    #[command(flatten)]
    pub deploy: DeployArgs,
    /// Batch: prefill:COUNTxTOKENS[@CACHED] and decode:COUNT@CACHED items, comma-separated.
    #[arg(long, default_value = "prefill:1x512,decode:32@1024")]
    pub batch: String,
    /// Engine whose host overhead (calibration/host/<engine>.json) the step pays.
    #[arg(long, default_value = "vllm")]
    pub engine: String,
    /// Kernel library of one op family, `OP=PREFIX[,PREFIX...]` (repeatable), as in `simulate`.
    #[arg(long = "kernel-backend", value_name = "OP=PREFIX")]
    pub kernel_backends: Vec<String>,
    /// How served tokens spread over a MoE layer's experts: uniform (default), balanced, or
    /// power_law_<alpha> (skewed expert loads as aiconfigurator's collectors draw them; with
    /// expert parallelism the busiest GPU's shard sets the step).
    #[arg(long, default_value = "uniform", value_parser = parse_moe_routing)]
    pub moe_routing: crate::kernels::cost::Routing,
    #[command(flatten)]
    pub host_speed: crate::cli::common::HostSpeedArgs,
    /// Print JSON (kernels array plus totals) instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: StepArgs) -> Result<()> {
    let mut engine = crate::sim::engine::EngineParams::load(&args.engine)?;
    let (model, gpu, dep) = args.deploy.load(&engine)?;
    let seqs = parse_batch_spec(&args.batch)?;
    let tokens: u64 = seqs.iter().map(|s| s.new_tokens as u64).sum();
    let named = NamedBackends::parse(&args.kernel_backends)?;
    named.apply(&mut engine);
    engine.validate().with_context(|| format!("engine '{}'", engine.name))?;
    // The engine sizes its step buffers (vLLM's profiling run, transformers' masks over the
    // cache) at its token budget, so the KV this batch may hold is the one `simulate` derives;
    // a batch above that budget is priced as if the engine had been sized for it.
    let step_budget_tokens = (engine.max_num_batched_tokens as u64).max(tokens);
    let plan = memory::plan(&model, &gpu, &dep, engine.gpu_memory_utilization, step_budget_tokens, engine.buffers())?;
    let kv_tokens: u64 = seqs.iter().map(|s| (s.new_tokens + s.cached_tokens) as u64).sum();
    if kv_tokens > plan.kv_capacity_tokens {
        bail!(
            "batch holds {kv_tokens} KV tokens but {} on {} (tp={}) fits {} ({:.1} GiB KV budget per GPU at {:.0} bytes/token)",
            model.name, gpu.id, dep.tp, plan.kv_capacity_tokens,
            plan.kv_budget_bytes_per_gpu / (1u64 << 30) as f64, plan.pool_bytes_per_kv_token_per_gpu()
        );
    }
    let km = named.kernel_model(&gpu, &dep, args.deploy.tier.unwrap_or(Tier::Target))?.with_served_routing(args.moe_routing);
    let host = crate::perf::host::HostOverhead::for_engine(&engine.name)?.at_speed(&args.host_speed.speed()?)?;
    let pred = Predictor::for_engine(&model, &gpu, &dep, km, &engine, host, plan.kv_capacity_tokens)?;
    let table = pred.kernel_table(&seqs);
    let capped_tflops = pred.step_gemm_tflops(&seqs);
    // A CUDA-graph engine captures a padded shape on first use: report the replayed step and
    // say what the first one adds.
    let (first, capture) = pred.step_time_and_capture(&seqs);
    let captured = capture.is_some();
    let cost = if captured { pred.step_time(&seqs) } else { first.clone() };
    let capture_note = captured.then(|| format!("first run of this padded shape also captures its CUDA graph: +{:.1} us (not in the step below)", first.total_us - cost.total_us));
    let total_flops: f64 = table.iter().map(|t| t.sol.flops * t.instance.count as f64).sum();
    let total_bytes: f64 = table.iter().map(|t| t.sol.bytes * t.instance.count as f64).sum();
    let sol_us: f64 = table.iter().map(|t| t.sol.sol_us * t.instance.count as f64).sum();
    let kernel_us: f64 = table.iter().map(|t| t.predicted_us * t.instance.count as f64).sum();
    if args.json {
        let kernels: Vec<_> = table
            .iter()
            .map(|t| {
                json!({
                    "name": t.instance.name, "op": t.instance.kernel.op, "shape": t.instance.kernel.shape_string(),
                    "dtype": t.instance.kernel.dtype, "count": t.instance.count, "flops": t.sol.flops, "bytes": t.sol.bytes,
                    "sol_us": t.sol.sol_us, "bound": t.sol.bound, "predicted_us": t.predicted_us,
                })
            })
            .collect();
        let out = json!({
            "model": model.name, "gpu": gpu.id, "tp": dep.tp, "pp": dep.pp, "ep": dep.ep, "tier": pred.tier().as_str(),
            "predictor": pred.describe(), "kernels": kernels, "total_flops": total_flops, "total_bytes": total_bytes,
            "sol_us": sol_us, "kernel_us": kernel_us, "graph_idle_us": cost.graph_idle_us, "host_us": cost.host_us, "predicted_us": cost.total_us,
            "first_use_capture_us": if captured { first.total_us - cost.total_us } else { 0.0 },
            "power_capped_gemm_tflops": capped_tflops,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{} on {} (tp={} pp={} ep={}, {} weights, {} KV), batch {} ({} seqs, {} new tokens)",
        model.name, gpu.id, dep.tp, dep.pp, dep.ep, dep.weight_dtype, dep.kv_dtype, args.batch, seqs.len(), tokens
    );
    println!("predictor: {}", pred.describe());
    if let Some(note) = &capture_note {
        println!("{note}");
    }
    println!();
    println!("{:<36} {:<18} {:>5} {:>11} {:>11} {:>9} {:>8} {:>11}  shape", "kernel", "op", "count", "GFLOP", "MB", "SOL us", "bound", "pred us");
    for t in &table {
        println!(
            "{:<36} {:<18} {:>5} {:>11.3} {:>11.3} {:>9.2} {:>8} {:>11.2}  {}",
            t.instance.name, t.instance.kernel.op.as_str(), t.instance.count, t.sol.flops / 1e9, t.sol.bytes / 1e6,
            t.sol.sol_us, t.sol.bound.as_str(), t.predicted_us, t.instance.kernel.shape_string()
        );
    }
    println!(
        "\ntotal: {:.2} TFLOP, {:.3} GB, SOL {:.1} us, kernels {:.1} us,{} host {:.1} us, step {:.1} us",
        total_flops / 1e12,
        total_bytes / 1e9,
        sol_us,
        kernel_us,
        if cost.graph_idle_us > 0.0 { format!(" idle between replayed kernels {:.1} us,", cost.graph_idle_us) } else { String::new() },
        cost.host_us,
        cost.total_us
    );
    let shares: Vec<String> = cost.classes().iter().filter(|c| c.1 > 0.0).map(|(n, us)| format!("{n} {:.0}%", 100.0 * us / cost.total_us)).collect();
    println!("time share: {}", shares.join(", "));
    if let Some(tflops) = capped_tflops {
        println!("power limit: bf16 GEMMs held to {tflops:.0} TFLOPS in this step (by how it fills its wall time; `hw show {}`)", gpu.id);
    }
    Ok(())
}

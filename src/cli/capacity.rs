//! `kernelsight capacity`: the highest arrival rate one deployment sustains within latency
//! targets, and its latency-versus-load curve.
use super::common::DeployArgs;
use super::plan::{describe, longest_request, open_loop, write_json, RunArgs, SloArgs};
use super::workload::WorkloadArgs;
use crate::kernels::memory;
use crate::plan::candidate::{Candidate, EngineLimits, PoolSplit};
use crate::plan::capacity::{max_sustainable_rate, CapacityOptions};
use crate::plan::sim_eval::SimEvaluator;
use crate::perf::Tier;
use crate::plan::{plot, report};
use crate::sim::engine::EngineParams;
use crate::workload::Arrival;
use anyhow::{bail, Result};
use clap::Args;
use indicatif::ProgressBar;

#[derive(Debug, Args)]
pub struct CapacityArgs {
    #[command(flatten)]
    pub deploy: DeployArgs,
    /// Data-parallel replicas (colocated).
    #[arg(long, default_value_t = 1, conflicts_with_all = ["prefill_replicas", "decode_replicas"])]
    pub replicas: u64,
    /// Disaggregated serving: replicas in the prefill pool (needs --decode-replicas).
    #[arg(long, requires = "decode_replicas")]
    pub prefill_replicas: Option<u64>,
    /// Disaggregated serving: replicas in the decode pool (needs --prefill-replicas).
    #[arg(long, requires = "prefill_replicas")]
    pub decode_replicas: Option<u64>,
    /// Engine limit on running sequences (default: the engine's).
    #[arg(long)]
    pub max_num_seqs: Option<u32>,
    /// Engine limit on tokens per step (default: the engine's).
    #[arg(long)]
    pub max_num_batched_tokens: Option<u32>,
    #[command(flatten)]
    pub slo: SloArgs,
    /// Workload; --rate is where the search starts (default 1 req/s).
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub run: RunArgs,
}

pub fn run(a: CapacityArgs) -> Result<()> {
    let engine = EngineParams::load(&a.run.engine)?;
    let (model, gpu, mut dep) = a.deploy.load(&engine)?;
    let slo = a.slo.to_slo()?;
    let mut wargs = a.workload.clone();
    wargs.rate.get_or_insert_with(|| "1".into());
    let workload = open_loop(&wargs)?;
    let Arrival::Rate { rate_per_s: start, .. } = workload.arrival else { unreachable!("open_loop checked") };
    let limits = EngineLimits {
        max_num_seqs: a.max_num_seqs.unwrap_or(engine.max_num_seqs),
        max_num_batched_tokens: a.max_num_batched_tokens.unwrap_or(engine.max_num_batched_tokens),
    };
    if limits.max_num_seqs == 0 || limits.max_num_batched_tokens == 0 {
        bail!("--max-num-seqs and --max-num-batched-tokens must be at least 1");
    }
    if limits.max_num_batched_tokens < limits.max_num_seqs {
        bail!(
            "--max-num-batched-tokens {} is below --max-num-seqs {}: a step could not hold one decode token per running sequence",
            limits.max_num_batched_tokens, limits.max_num_seqs
        );
    }
    let disagg = match (a.prefill_replicas, a.decode_replicas) {
        (Some(p), Some(d)) if p >= 1 && d >= 1 => Some(PoolSplit { prefill_replicas: p, decode_replicas: d }),
        (Some(_), Some(_)) => bail!("--prefill-replicas and --decode-replicas must each be at least 1"),
        _ => None,
    };
    dep.dp = match disagg {
        Some(s) => s.prefill_replicas + s.decode_replicas,
        None if a.replicas == 0 => bail!("--replicas must be at least 1"),
        None => a.replicas,
    };
    // Fail early, with the memory figures, when the layout cannot hold the model.
    let plan = memory::plan(&model, &gpu, &dep, engine.gpu_memory_utilization, limits.max_num_batched_tokens as u64, engine.buffers())?;
    let longest = longest_request(&workload)?;
    if plan.kv_capacity_tokens < longest {
        bail!("the KV cache holds {} tokens per replica, below the workload's longest request ({longest} tokens)", plan.kv_capacity_tokens);
    }
    let tier = a.deploy.tier.unwrap_or(Tier::Target);
    let cand = Candidate { gpu: gpu.id.clone(), dep, limits, disagg };
    let eval = SimEvaluator::new(model.clone(), std::slice::from_ref(&gpu), engine, tier, a.run.router)?
        .with_served_routing(a.run.moe_routing)
        .with_host_speed(&a.run.host_speed.speed()?)?;
    let started = std::time::Instant::now();
    let spinner = if a.run.json { ProgressBar::hidden() } else { ProgressBar::new_spinner() };
    spinner.set_message("searching the highest sustainable rate");
    spinner.enable_steady_tick(std::time::Duration::from_millis(200));
    let result = max_sustainable_rate(&eval, &cand, &workload, &slo, &CapacityOptions { start_rate_per_s: start, ..CapacityOptions::default() })?;
    spinner.finish_and_clear();
    let elapsed_s = started.elapsed().as_secs_f64();
    let header = vec![
        format!("Capacity of {} on {}", model.name, cand.label()),
        format!("Workload: {} (the rate is searched)", describe(&workload)),
        format!("Targets: {}; {} load levels simulated in {elapsed_s:.1} s", slo.describe(), result.curve.len()),
    ];
    let mut files = Vec::new();
    if let Some(dir) = &a.run.out {
        let marks = result.max_rate_per_s.map(|m| vec![(m, format!("capacity {m:.2} req/s"))]).unwrap_or_default();
        let title = format!("{}: latency vs load ({})", model.name, cand.label());
        files.extend(plot::load_plot(dir, "latency_vs_load", &title, &result.curve, &slo, marks)?.into_iter().map(|p| p.display().to_string()));
    }
    let question = serde_json::json!({
        "model": model.name, "deployment": cand, "label": cand.label(), "workload": describe(&workload),
        "tier": tier, "engine": a.run.engine, "search_seconds": elapsed_s,
    });
    let doc = report::capacity_json(question, &slo, &result, &files);
    if let Some(dir) = &a.run.out {
        files.push(write_json(dir, "capacity.json", &doc)?);
    }
    if a.run.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", report::render_capacity(&header, &slo, &result));
        if !files.is_empty() {
            println!("\nwrote {}", files.join(", "));
        }
    }
    Ok(())
}

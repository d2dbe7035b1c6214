//! Runs one silicon point through the same path as `kernelsight simulate`.

use super::rows::SimPoint;
use crate::cli::simulate::SimulateArgs;
use crate::perf::host::HostOverhead;
use crate::perf::predictor::kernel_model_for;
use crate::perf::Tier;
use crate::sim::{self, record::NoObserver};
use anyhow::{bail, Context, Result};
use clap::Parser;
use serde::Serialize;

/// What the simulator predicts for one point (means over all requests of the run, as the
/// benchmark's means are over all of its requests).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Prediction {
    pub ttft_ms: f64,
    pub tpot_ms: f64,
    /// Mean time from arrival to first scheduling.
    pub queue_ms: f64,
    pub preemptions: u64,
    /// Tokens the KV cache holds per replica, every layer group counted full (a sliding-window
    /// hybrid's requests past the window fit more).
    pub kv_capacity_tokens: u64,
    pub mean_batch_seqs: f64,
}

#[derive(Parser)]
struct SimulateCmd {
    #[command(flatten)]
    args: SimulateArgs,
}

/// The `simulate` arguments of `point`, parsed by the CLI's own parser so that the point and
/// the printed command line cannot drift apart.
pub fn simulate_args(point: &SimPoint, tier: Tier) -> Result<SimulateArgs> {
    let argv = std::iter::once("simulate".to_string()).chain(point.simulate_flags(tier)).chain(["--quiet".to_string()]);
    let cmd = SimulateCmd::try_parse_from(argv).with_context(|| format!("building `{}`", point.command_line(tier)))?;
    Ok(cmd.args)
}

/// Simulates `point` with `tier`'s kernel model. `host` replaces the engine's shipped host
/// overhead (used while fitting it).
pub fn simulate(point: &SimPoint, tier: Tier, host: Option<&HostOverhead>) -> Result<Prediction> {
    let args = simulate_args(point, tier)?;
    let mut sc = args.scenario()?;
    if let Some(h) = host {
        sc.predictor.host = h.clone();
    }
    let mut source = sc.workload.build()?;
    let out = sim::run(&sc.cfg, &sc.predictor, source.as_mut(), sc.workload.closed_loop(), &mut NoObserver)?;
    let r = &out.rec;
    if !r.rejected.is_empty() {
        bail!("{} of {} requests rejected ({})", r.rejected.values().sum::<u64>(), out.num_requests, sim::reject::describe(&r.rejected, &sc.cfg, "; "));
    }
    if r.completed == 0 || r.tpot_us.count() == 0 {
        bail!("no request completed with more than one output token");
    }
    Ok(Prediction {
        ttft_ms: r.ttft_us.mean() * 1e-3,
        tpot_ms: r.tpot_us.mean() * 1e-3,
        queue_ms: r.queue_us.mean() * 1e-3,
        preemptions: r.preemptions,
        kv_capacity_tokens: (sc.cfg.num_gpu_blocks / sc.cfg.kv_layout.groups()) as u64 * sc.cfg.engine.block_size as u64,
        mean_batch_seqs: if r.steps > 0 { r.step_seqs as f64 / r.steps as f64 } else { 0.0 },
    })
}

/// Whether `tier` has its own kernel model on `gpu` (calibrated tiers fall back to the
/// roofline until fitted; a fallback is not reported as that tier). The note says why not.
pub fn tier_available(gpu: &str, tier: Tier) -> Result<(bool, Option<String>)> {
    let spec = crate::hardware::load_gpu(gpu)?;
    let (km, note) = kernel_model_for(&spec, tier)?;
    Ok((km.tier() == tier, note))
}

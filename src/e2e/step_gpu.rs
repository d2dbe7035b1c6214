//! Step time apart from scheduling: the GPU time of each replayed CUDA-graph step of the
//! transformers engine, measured with CUDA events around every `compute_batch` call
//! (`calibration/traces/h200_sxm_cudagraph_profile/`, `microbench/e2e/profile_steps.py`), against
//! the predictor's GPU time for the same padded step.

use super::stats::{ape, ErrorStats};
use super::traces::{self, TraceModel};
use crate::perf::host::HostOverhead;
use crate::perf::Tier;
use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone, Serialize)]
pub struct StepGpuRow {
    pub model: String,
    pub run: String,
    pub tier: &'static str,
    pub held_out: bool,
    pub steps: usize,
    pub measured_gpu_ms_p50: f64,
    pub predicted_gpu_ms_p50: f64,
    pub ape: ErrorStats,
}

/// Compares every replayed (not capturing) step of the profiled runs. `models` supplies the
/// configs (the profile folder holds none) and the run records with the step log.
pub fn validate(profile_dir: &Path, models: &[TraceModel], tiers: &[Tier]) -> Result<Vec<StepGpuRow>> {
    let path = profile_dir.join("steps.jsonl");
    let runs_path = profile_dir.join("runs.jsonl");
    let run_logs = traces::load_runs(&runs_path)?;
    let mut out = Vec::new();
    for prof in traces::read_step_profiles(&path)? {
        let (label, run_id) = (prof.model.as_str(), prof.run_id.as_str());
        // The profiled run (torch.profiler on) was not recorded with its step log.
        let Some(run) = run_logs.iter().find(|r| r.key.ends_with(&format!("/{run_id}")) && r.graphs.is_some()) else { continue };
        let Some(model) = models.iter().find(|m| m.label == label) else { continue };
        let Some(gpu_ms) = prof.scheduled(run.steps.len()) else { continue };
        for &tier in tiers {
            let p = super::replay::predictor_for(model, run, tier, HostOverhead::zero())?;
            let mut pairs = Vec::new();
            for (s, &measured) in run.steps.iter().zip(gpu_ms) {
                let (cost, capture) = p.step_time_and_capture(&super::replay::logged_step_batch(s));
                if capture.is_none() && s.num_requests > 0 {
                    pairs.push((measured, cost.total_us / 1e3));
                }
            }
            if pairs.is_empty() {
                continue;
            }
            let apes: Vec<f64> = pairs.iter().map(|&(m, p)| ape(p, m)).collect();
            out.push(StepGpuRow {
                model: label.to_string(),
                run: run_id.to_string(),
                tier: tier.as_str(),
                held_out: !model.is_calibration(),
                steps: pairs.len(),
                measured_gpu_ms_p50: crate::quantile::median(&pairs.iter().map(|p| p.0).collect::<Vec<_>>()),
                predicted_gpu_ms_p50: crate::quantile::median(&pairs.iter().map(|p| p.1).collect::<Vec<_>>()),
                ape: ErrorStats::of(&apes),
            });
        }
    }
    Ok(out)
}

pub fn render(rows: &[StepGpuRow]) -> String {
    let mut s = String::from(
        "GPU time of replayed CUDA-graph steps (CUDA events per step, h200_sxm_cudagraph_profile) vs predicted, per run: APE % over steps\n",
    );
    s += &format!("  {:<10} {:<22} {:<26} {:>5} {:>9} {:>9} {:>7} {:>7} {:>7}\n", "tier", "model", "run", "steps", "meas ms", "pred ms", "median", "p90", "max");
    let mut by_tier: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for r in rows {
        let name = format!("{}{}", r.model, if r.held_out { "" } else { " (cal)" });
        let run = r.run.split('/').skip(1).collect::<Vec<_>>().join("/");
        s += &format!(
            "  {:<10} {:<22} {:<26} {:>5} {:>9.2} {:>9.2} {:>7.1} {:>7.1} {:>7.1}\n",
            r.tier, name, run, r.steps, r.measured_gpu_ms_p50, r.predicted_gpu_ms_p50, r.ape.median_ape, r.ape.p90_ape, r.ape.max_ape
        );
        if r.held_out {
            by_tier.entry(r.tier).or_default().push(r.ape.median_ape);
        }
    }
    for (tier, meds) in by_tier {
        let e = ErrorStats::of(&meds);
        s += &format!("  [{tier}] held-out runs: median of per-run median APE {:.1}%, worst {:.1}% ({} runs)\n", e.median_ape, e.max_ape, e.count);
    }
    s
}

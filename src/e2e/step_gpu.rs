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
    /// Median over steps of (measured - predicted GPU time) / the step's kernel launches, plus
    /// the replay gap the engine profile already charges: the gap per kernel this run implies.
    pub implied_replay_gap_per_kernel_us: f64,
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
            let (mut pairs, mut gaps) = (Vec::new(), Vec::new());
            for (s, &measured) in run.steps.iter().zip(gpu_ms) {
                let batch = super::replay::logged_step_batch(s);
                let (cost, capture) = p.step_time_and_capture(&batch);
                if capture.is_none() && s.num_requests > 0 {
                    pairs.push((measured, cost.total_us / 1e3));
                    // The idle the profile already charges counts toward the gap the run implies.
                    gaps.push((measured * 1e3 - cost.total_us + cost.graph_idle_us) / p.step_launches(&batch).max(1) as f64);
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
                implied_replay_gap_per_kernel_us: crate::quantile::median(&gaps),
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
    s += &format!("  {:<10} {:<22} {:<26} {:>5} {:>9} {:>9} {:>7} {:>7} {:>7} {:>8}\n", "tier", "model", "run", "steps", "meas ms", "pred ms", "median", "p90", "max", "gap us");
    let mut by_tier: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for r in rows {
        let name = format!("{}{}", r.model, if r.held_out { "" } else { " (cal)" });
        let run = r.run.split('/').skip(1).collect::<Vec<_>>().join("/");
        s += &format!(
            "  {:<10} {:<22} {:<26} {:>5} {:>9.2} {:>9.2} {:>7.1} {:>7.1} {:>7.1} {:>8.2}\n",
            r.tier, name, run, r.steps, r.measured_gpu_ms_p50, r.predicted_gpu_ms_p50, r.ape.median_ape, r.ape.p90_ape, r.ape.max_ape, r.implied_replay_gap_per_kernel_us
        );
        if r.held_out {
            by_tier.entry(r.tier).or_default().push(r.ape.median_ape);
        }
    }
    for (tier, meds) in by_tier {
        let e = ErrorStats::of(&meds);
        s += &format!("  [{tier}] held-out runs: median of per-run median APE {:.1}%, worst {:.1}% ({} runs)\n", e.median_ape, e.max_ape, e.count);
        // What `[cuda_graphs] replay_gap_per_kernel_ns` of the engine profile is set from.
        let cal: Vec<f64> = rows.iter().filter(|r| r.tier == tier && !r.held_out).map(|r| r.implied_replay_gap_per_kernel_us).collect();
        if !cal.is_empty() {
            s += &format!("  [{tier}] calibration runs imply a replay gap of {:.3} us per kernel (median over {} runs of each run's median)\n", crate::quantile::median(&cal), cal.len());
        }
    }
    s
}

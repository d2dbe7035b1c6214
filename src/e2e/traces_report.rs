//! The traces half of `validate e2e`: replays every complete run under each tier with the host
//! models fitted on the calibration runs, splits the runs into calibration and held-out sets and
//! aggregates the errors per split and metric.

use super::host_fit::{call_of, fit_host, fit_host_cudagraph, with_tp_hooks, ProbeScaling, ProbedCaptures, ProbedEager};
use super::replay::{measured_evictions, replay, Replayed};
use super::stats::{ape, ErrorStats};
use super::traces::{load_dir, measured_metrics, TraceEngine, TraceModel, TraceRun, METRICS, VLLM_CALIBRATION_MODELS};
use crate::perf::Tier;
use crate::perf::host::{HostOverhead, HostSpeed};
use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

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
    /// What the probe-scaled capture terms were multiplied by (probed CUDA-graph runs only).
    pub capture_scale: Option<f64>,
    /// What every host term was multiplied by (probed eager runs only, fitted on other calls).
    pub host_scale: Option<f64>,
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
    /// Runs measured in more than one device call, against each other.
    pub repeatability: Vec<super::repeatability::RepeatRow>,
    /// The eager runs' step speeds by device call, in the first tier replayed.
    pub eager_step_states: Vec<super::step_states::CallStates>,
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

/// `validate` on traces already loaded.
/// `vllm_host_speed`: the speed of the host the vLLM runs were measured on, against the one the
/// shipped `vllm` host model was fitted on (`HostOverhead::at_speed`). `tp_hooks_us`: the eager
/// host model's tensor-parallel hook term (`static_steps::fit_host`, fitted on other lines).
pub fn validate_models(models: &[TraceModel], tiers: &[Tier], vllm_host_speed: &HostSpeed, tp_hooks_us: f64) -> Result<TracesReport> {
    let mut report =
        TracesReport { host_fits: BTreeMap::new(), kernel_models: BTreeMap::new(), runs: vec![], summary: BTreeMap::new(), excluded: vec![], load_sweeps: vec![], repeatability: vec![], eager_step_states: vec![] };
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
        let probed = host_cg.as_ref().map(|h| ProbedCaptures::collect(models, tier, h)).transpose()?;
        let mut capture_scales = CaptureScales::default();
        let mut probed_eager = ProbedEager::default();
        let mut eager_probed_runs: Vec<(usize, &TraceModel, &TraceRun)> = Vec::new();
        for m in models {
            for run in m.runs.iter().filter(|r| r.status == "ok") {
                let h = match (run.engine, run.graphs.is_some()) {
                    (TraceEngine::Vllm, _) => &host_vllm,
                    (TraceEngine::Hf, true) => &host_cg,
                    (TraceEngine::Hf, false) => &host,
                };
                let h = h.as_ref().expect("a host model for every mode with runs");
                let capture_scale = match (m.host_probe_ns, run.engine, run.graphs.is_some()) {
                    (Some(probe_ns), TraceEngine::Hf, true) => capture_scales.factor(probed.as_ref().expect("collected with the CUDA-graph host"), run, probe_ns),
                    _ => None,
                };
                let scaled;
                let h = match capture_scale {
                    Some(f) => {
                        scaled = h.with_capture_scaled(f);
                        &scaled
                    }
                    None => h,
                };
                let Replayed { metrics: predicted, describe, preemptions, .. } = replay(m, run, tier, h)?;
                report.kernel_models.insert(tier.as_str(), describe);
                let measured = measured_metrics(run);
                let apes = METRICS.iter().map(|&k| (k, ape(predicted[k], measured[k]))).collect();
                let evictions = measured_evictions(run).map(|n| (n, preemptions));
                if let (Some(probe_ns), TraceEngine::Hf, None) = (m.host_probe_ns, run.engine, &run.graphs) {
                    probed_eager.add(call_of(run), probe_ns, measured["tpot_p50"], predicted["tpot_p50"]);
                    eager_probed_runs.push((report.runs.len(), m, run));
                }
                report.runs.push(RunResult {
                    model: m.label.clone(),
                    run: run.key.clone(),
                    gpu: m.gpu.clone(),
                    host_probe_ns: m.host_probe_ns,
                    capture_scale,
                    host_scale: None,
                    split: split_of(m, run),
                    tier: tier.as_str(),
                    measured,
                    predicted,
                    ape: apes,
                    evictions,
                });
            }
        }
        // Probed eager runs again, each with every host term scaled by the fit on the other
        // probed calls (leave one call out), as the capture terms above.
        if let Some(h) = host.as_ref() {
            let mut fits: BTreeMap<&str, Option<ProbeScaling>> = BTreeMap::new();
            for (idx, m, run) in eager_probed_runs {
                let call = call_of(run);
                let Some(sc) = *fits.entry(call).or_insert_with(|| probed_eager.fit(Some(call))) else { continue };
                let factor = sc.factor(m.host_probe_ns.expect("collected with a probe"));
                let predicted = replay(m, run, tier, &h.scaled(factor)?)?.metrics;
                let r = &mut report.runs[idx];
                r.ape = METRICS.iter().map(|&k| (k, ape(predicted[k], r.measured[k]))).collect();
                r.predicted = predicted;
                r.host_scale = Some(factor);
            }
        }
        if let Some(mut h) = host {
            if let Some(sc) = probed_eager.fit(None) {
                h.probe_python_loop_ns = Some(sc.reference_ns);
                h.probe_exponent = Some(sc.exponent);
                h.source.probe_reference = sc.describe("every term", "eager runs' TPOT", tier.as_str());
            }
            report.host_fits.insert(tier.as_str().to_string(), h);
        }
        if let Some(mut h) = host_cg {
            if let Some(sc) = probed.as_ref().and_then(|p| p.fit(None)) {
                h.probe_python_loop_ns = Some(sc.reference_ns);
                h.capture_probe_exponent = Some(sc.exponent);
                h.source.probe_reference = sc.describe("capture terms", "capturing steps", tier.as_str());
            }
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
    let first_tier = tiers.first().map_or("", |t| t.as_str());
    report.repeatability = super::repeatability::pairs(&report.runs, first_tier);
    report.eager_step_states = super::step_states::by_call(models, &report.runs, first_tier);
    Ok(report)
}

/// A probed call's CUDA-graph runs capture at its probe's speed, by the scaling fitted on the
/// other probed calls' capturing steps (leave one call out), one fit per call.
#[derive(Default)]
struct CaptureScales(BTreeMap<String, Option<f64>>);

impl CaptureScales {
    /// The factor on `run`'s capture terms; None where too few other calls were probed.
    fn factor(&mut self, probed: &ProbedCaptures, run: &TraceRun, probe_ns: f64) -> Option<f64> {
        let call = call_of(run);
        *self.0.entry(call.to_string()).or_insert_with(|| probed.fit(Some(call)).map(|sc| sc.factor(probe_ns)))
    }
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
        s += &super::repeatability::render(&self.repeatability);
        s += &super::step_states::render(&self.eager_step_states, self.runs.first().map_or("", |r| r.tier));
        s += &self.render_other_hosts();
        s += &super::load_sweep::render(&self.load_sweeps);
        for (run, why) in &self.excluded {
            s += &format!("  excluded {run}: {why}\n");
        }
        s
    }

    /// Runs on GPUs and machines nothing was fitted on, by device call: how far the predicted
    /// TTFT and TPOT sit from the measured ones next to the call's host-probe reading and the
    /// factor its CUDA-graph captures were scaled by (fitted without the call).
    fn render_other_hosts(&self) -> String {
        let tier = if self.runs.iter().any(|r| r.tier == "target") { "target" } else { self.runs.first().map_or("", |r| r.tier) };
        let mut calls: BTreeMap<(&str, &str), Vec<&RunResult>> = BTreeMap::new();
        for r in self.runs.iter().filter(|r| r.tier == tier && r.split == "held-out-gpu") {
            calls.entry((r.run.split('/').next().unwrap_or(""), r.gpu.as_str())).or_default().push(r);
        }
        if calls.is_empty() {
            return String::new();
        }
        let mut s = format!(
            "\n  runs on other GPUs and hosts, by device call [{tier}]: predicted / measured, median over runs; scale x: what the probe scaled (CUDA graphs: the capture terms; eager: every host term), fitted without the call\n"
        );
        s += &format!("    {:<22} {:<10} {:>13} {:>9} {:>5} {:>9} {:>9}\n", "call", "gpu", "host probe ns", "scale x", "runs", "TTFT p50", "TPOT p50");
        for ((call, gpu), rows) in calls {
            let ratio = |k: &str| crate::quantile::median(&rows.iter().map(|r| r.predicted[k] / r.measured[k]).collect::<Vec<_>>());
            let probe = rows[0].host_probe_ns.map_or("-".to_string(), |ns| format!("{ns:.0}"));
            let scale = rows.iter().find_map(|r| r.capture_scale.or(r.host_scale)).map_or("-".to_string(), |f| format!("{f:.2}"));
            s += &format!("    {:<22} {:<10} {:>13} {:>9} {:>5} {:>8.2}x {:>8.2}x\n", call, gpu, probe, scale, rows.len(), ratio("ttft_p50"), ratio("tpot_p50"));
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


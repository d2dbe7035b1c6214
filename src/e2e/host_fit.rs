//! Fits the serving engines' host-overhead models on the calibration subset of the traces:
//! transformers eager (`fit_host`) and with CUDA graphs (`fit_host_cudagraph`), vLLM's
//! prefill-step launch terms (`fit_host_vllm`), and the request-path and wake-up times the
//! engines' own timestamps measure.

use super::regression::{dot, nonneg_least_absolute_deviations, nonneg_least_squares};
use super::replay::{logged_step_batch, predictor_for, replay};
use super::traces::{TraceEngine, TraceModel, TraceRequest, TraceRun, CALIBRATION_FAMILIES, VLLM_CALIBRATION_MODELS, measured_metrics};
use crate::perf::host::{CaptureLoad, HostOverhead, Provenance};
use crate::perf::{StepTimeModel, Tier};
use std::collections::BTreeMap;
use crate::quantile::quantile;
use anyhow::{bail, Result};

/// The calibration families' finished eager runs on one GPU: what the eager host model is fitted on.
fn eager_calibration_runs(models: &[TraceModel]) -> impl Iterator<Item = (&TraceModel, &TraceRun)> {
    models
        .iter()
        .filter(|m| m.is_calibration())
        .flat_map(|m| m.runs.iter().filter(|r| r.status == "ok" && r.engine == TraceEngine::Hf && r.tp == 1 && r.graphs.is_none()).map(move |r| (m, r)))
}

/// Fits the eager `hf` host model on the calibration families' decode-only steps where the host
/// dominates (predicted GPU time under half the measured step): measured = dispatch x host ops
/// (the aten ops the step's Python dispatches, `Predictor::step_host_ops`) + per_step +
/// per_seq x sequences (+ the probes' bookkeeping terms, fixed), by least squares with
/// non-negative coefficients. (Fitting a per-group term on these steps themselves gave 0 and
/// raised held-out eager TPOT error from 15.3 to 19.2 %: the eager steps' launches dominate.)
pub fn fit_host(models: &[TraceModel], tier: Tier, bookkeeping: Option<&HostOverhead>) -> Result<HostOverhead> {
    // The engine's block bookkeeping and KV index lists (`prepare_batch_tensors`) are the same
    // Python in both modes: where the probes measured them (`bookkeeping`, the CUDA-graph fit),
    // they are taken as given and the launch and step terms fitted on what is left.
    let keep = bookkeeping.map(|b| HostOverhead {
        per_seq_cache_group_us: b.per_seq_cache_group_us,
        per_full_read_token_us: b.per_full_read_token_us,
        per_sliding_read_token_us: b.per_sliding_read_token_us,
        ..HostOverhead::zero()
    });
    let keep = keep.unwrap_or_else(HostOverhead::zero);
    let mut rows: Vec<([f64; 4], f64)> = Vec::new();
    for (m, run) in eager_calibration_runs(models) {
        let p = predictor_for(m, run, tier, HostOverhead::zero())?;
        // Every step in run order, so that each attention shape counts as new once.
        for s in run.steps.iter().filter(|s| s.num_requests > 0) {
            let batch = logged_step_batch(s);
            let new_plan = p.register_sdpa_plan(&batch);
            if s.num_decode != s.num_requests {
                continue;
            }
            let measured_us = (s.end_s - s.start_s) * 1e6;
            let gpu_us = p.step_time(&batch).total_us;
            if gpu_us < 0.5 * measured_us {
                let rest_us = measured_us - keep.step_us(0.0, &p.step_load(&batch, 0));
                rows.push(([p.step_host_ops(&batch) as f64, 1.0, s.num_requests as f64, f64::from(u8::from(new_plan))], rest_us));
            }
        }
    }
    if rows.len() < 10 {
        bail!("only {} host-bound decode steps in the calibration traces; need at least 10", rows.len());
    }
    let coef = nonneg_least_squares(&rows);
    let host = HostOverhead { launch_per_host_op_us: coef[0], per_step_us: coef[1], per_seq_us: coef[2], sdpa_plan_us: coef[3], ..keep };
    let (wake_us, first_steps) = first_step_excess_us(models, tier, &host)?;
    Ok(HostOverhead {
        idle_wake_us: wake_us,
        source: Provenance::of(format!(
            "fitted by `validate e2e` on {} host-bound decode steps of {} (tier {}){}; a run's first step {:.1} ms longer: median over {} runs",
            rows.len(),
            CALIBRATION_FAMILIES.join(", "),
            tier.as_str(),
            if bookkeeping.is_some() { ", with the probes' bookkeeping terms" } else { "" },
            wake_us / 1e3,
            first_steps
        )),
        ..host
    })
}

/// What the eager engine's first step of a run (a fresh `generate_batch` manager taking its first
/// prompts) takes beyond the step model with `host`: the median over the calibration families'
/// tp = 1 eager runs of measured minus predicted, floored at 0, and the number of runs. It is
/// ~16 ms in nearly every run, against decode steps the model prices well, while the eager
/// traces' later prompt steps always join running decodes and show no such excess. The simulator
/// charges it as `idle_wake_us` (every step an idle engine starts): no eager trace has an idle
/// engine mid-run to tell a fresh manager from a woken one.
fn first_step_excess_us(models: &[TraceModel], tier: Tier, host: &HostOverhead) -> Result<(f64, usize)> {
    let mut excess_us = Vec::new();
    for (m, run) in eager_calibration_runs(models) {
        let Some(first) = run.steps.iter().find(|s| s.num_requests > 0) else { continue };
        let p = predictor_for(m, run, tier, host.clone())?;
        let predicted_us = p.step_time(&logged_step_batch(first)).total_us;
        excess_us.push((first.end_s - first.start_s) * 1e6 - predicted_us);
    }
    Ok(((!excess_us.is_empty()).then(|| crate::quantile::median(&excess_us).max(0.0)).unwrap_or(0.0), excess_us.len()))
}

/// How long an idle engine core took from a run's first request to the step serving it
/// (`HostOverhead::idle_wake_us`), from the runs' engine timestamps: in a run whose first
/// requests came as a burst, the first step took those sent up to some time after the first and
/// not the next one; the wake-up lies between the two send times (their midpoint is the run's
/// estimate; where the whole burst made the step, the last send is a lower bound and stands).
/// Median over runs; None when no run shows a burst split or joined.
pub fn measured_idle_wake_us(runs: &[&TraceRun]) -> Option<f64> {
    let estimates: Vec<f64> = runs.iter().filter_map(|r| idle_wake_of_run(&r.requests)).collect();
    (!estimates.is_empty()).then(|| quantile(&estimates, 0.5) * 1e6)
}

/// One run's wake-up estimate in seconds (`measured_idle_wake_us`).
fn idle_wake_of_run(requests: &[TraceRequest]) -> Option<f64> {
    let first = requests.iter().min_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s))?;
    let step_s = first.engine_scheduled_s?;
    // Requests of the first step share its scheduling time (to the engine's clock resolution).
    let in_first = |q: &TraceRequest| q.engine_scheduled_s.is_some_and(|t| (t - step_s).abs() < 20e-6);
    let joined = requests.iter().filter(|q| in_first(q)).map(|q| q.arrival_s).fold(f64::NEG_INFINITY, f64::max);
    // Sent before that step began, yet left for a later one.
    let missed = requests.iter().filter(|q| !in_first(q) && q.arrival_s < step_s).map(|q| q.arrival_s).fold(f64::INFINITY, f64::min);
    match (joined > first.arrival_s, missed.is_finite()) {
        (_, true) => Some(((joined + missed) / 2.0 - first.arrival_s).max(0.0)),
        (true, false) => Some(joined - first.arrival_s),
        (false, false) => None,
    }
}

/// The client <-> engine path of a request (`HostOverhead::request_path_us`) as the runs'
/// engine timestamps show it: the median, over runs, of the time the run's first request took
/// from its send to the engine queue (the engine idle, so no step in the way), less the idle
/// engine's wake-up (`idle_wake_us`, which the simulator charges itself), plus the median over
/// requests of the time from the engine's first token to the client's. None when no run
/// carries engine timestamps.
pub fn measured_request_path_us(runs: &[&TraceRun], idle_wake_us: f64) -> Option<f64> {
    let firsts: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.requests.iter().min_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s)))
        .filter_map(|q| q.engine_path_s.map(|p| p[0]))
        .collect();
    let outs: Vec<f64> = runs.iter().flat_map(|r| &r.requests).filter_map(|q| q.engine_path_s.map(|p| p[1])).collect();
    (!firsts.is_empty()).then(|| ((quantile(&firsts, 0.5) + quantile(&outs, 0.5)) * 1e6 - idle_wake_us).max(0.0))
}

/// Every finished request's measured TTFT (ms).
fn measured_ttft_ms(run: &TraceRun) -> Vec<f64> {
    run.requests.iter().map(|r| (r.first_token_s - r.arrival_s) * 1e3).collect()
}

/// Mean over the deciles 10-90 % of |ln(predicted / measured)| of a run's TTFT distribution.
/// One quantile of a run whose prompts straddle the piecewise-graph limit jumps between the
/// graph mode and the graph-less one as a term moves; nine of them see both modes.
pub fn ttft_decile_error(predicted: &[f64], measured: &[f64]) -> f64 {
    let deciles = (1..=9).map(|i| i as f64 / 10.0);
    deciles.clone().map(|q| (quantile(predicted, q) / quantile(measured, q)).ln().abs()).sum::<f64>() / deciles.count() as f64
}

/// Fits the `vllm` engine's prefill-step launch terms (`piecewise_launch_per_layer_us`,
/// `eager_launch_per_layer_us`) on the vLLM runs of `VLLM_CALIBRATION_MODELS`, every other term
/// as in `base`: a grid search over both (coarse, then finer around the best) for the lowest mean
/// over runs of the TTFT deciles' mean |ln(predicted / measured)| (`ttft_decile_error`) plus
/// TPOT p50's (a mean, not a median: the terms move only the runs with prompt steps, which a
/// median over all runs can ignore). Decode-only steps replay full graphs and do not depend on them; what they price is how long a step with prompt
/// tokens keeps the host busy. The request path is set first, from the runs' engine timestamps
/// (`measured_request_path_us`) where they have them.
pub fn fit_host_vllm(models: &[TraceModel], tier: Tier, base: &HostOverhead) -> Result<HostOverhead> {
    let runs: Vec<(&TraceModel, &TraceRun)> = models
        .iter()
        .filter(|m| m.on_calibration_gpu() && VLLM_CALIBRATION_MODELS.contains(&m.label.as_str()))
        .flat_map(|m| m.runs.iter().filter(|r| r.status == "ok" && r.engine == TraceEngine::Vllm).map(move |r| (m, r)))
        .collect();
    if runs.len() < 4 {
        bail!("only {} vLLM calibration runs ({}); need at least 4", runs.len(), VLLM_CALIBRATION_MODELS.join(", "));
    }
    let measured: Vec<(f64, Vec<f64>)> = runs.iter().map(|(_, r)| (measured_metrics(r)["tpot_p50"], measured_ttft_ms(r))).collect();
    // The request path is measured, not fitted: the engine's own timestamps say what it is.
    let run_refs: Vec<&TraceRun> = runs.iter().map(|(_, r)| *r).collect();
    let wake_us = measured_idle_wake_us(&run_refs).unwrap_or(0.0);
    let path_us = measured_request_path_us(&run_refs, wake_us);
    let base = &HostOverhead { request_path_us: path_us.unwrap_or(base.request_path_us), idle_wake_us: wake_us, ..base.clone() };
    let loss = |piecewise: f64, eager: f64| -> Result<f64> {
        use rayon::prelude::*;
        let h = HostOverhead { piecewise_launch_per_layer_us: piecewise, eager_launch_per_layer_us: eager, ..base.clone() };
        let errs: Vec<f64> = runs
            .par_iter()
            .zip(&measured)
            .map(|((m, r), (tpot_p50, ttft))| {
                let p = replay(m, r, tier, &h)?;
                Ok(ttft_decile_error(&p.ttft_ms, ttft) + (p.metrics["tpot_p50"] / tpot_p50).ln().abs())
            })
            .collect::<Result<_>>()?;
        Ok(errs.iter().sum::<f64>() / errs.len() as f64)
    };
    // Every pair on a coarse grid, then every pair on a finer one around the best: the answer
    // does not depend on where a search started (a coordinate search did, by 0.01 in loss).
    let best_of = |pairs: Vec<(f64, f64)>| -> Result<(f64, f64, f64)> {
        let mut best = (0.0, 0.0, f64::INFINITY);
        for (p, e) in pairs {
            let l = loss(p, e)?;
            if l < best.2 {
                best = (p, e, l);
            }
        }
        Ok(best)
    };
    let start = loss(0.0, 0.0)?;
    let coarse = (0..=12).flat_map(|i| (0..=15).map(move |j| (50.0 * i as f64, 100.0 * j as f64)));
    let (p0, e0, _) = best_of(coarse.collect())?;
    let fine = (-2..=2).flat_map(|i| (-2..=2).map(move |j| (p0 + 25.0 * i as f64, e0 + 50.0 * j as f64)));
    let (piecewise, eager, best) = best_of(fine.filter(|&(p, e)| p >= 0.0 && e >= 0.0).collect())?;
    Ok(HostOverhead {
        piecewise_launch_per_layer_us: piecewise,
        eager_launch_per_layer_us: eager,
        source: Provenance {
            launch_terms: format!(
                "prefill-step launch terms fitted by `validate e2e` on {} vLLM runs of {} on the H200 (tier {}; mean |ln error| of TTFT deciles + TPOT p50 {:.3} -> {:.3}){}",
                runs.len(),
                VLLM_CALIBRATION_MODELS.join(", "),
                tier.as_str(),
                start,
                best,
                match path_us {
                    Some(v) => format!(", request path {v:.0} us and idle wake-up {wake_us:.0} us measured from their engine timestamps"),
                    None => String::new(),
                }
            ),
            ..base.source.clone()
        },
        ..base.clone()
    })
}

/// Fits the CUDA-graph `hf` host model on the host-calibration runs' CUDA-graph steps (the
/// calibration families and the host probes), stepping through each run's logged steps in order:
/// a step whose padded shape was already captured costs `GPU + per_layer x layers + per_step +
/// per_seq_cache_group x sequences x groups + per token of KV read per full / sliding group`
/// (fitted by least absolute deviations on those steps' residual over the predicted GPU time),
/// a step that captures a new graph adds `HostOverhead::capture_extra_us`
/// (its per-layer launch time and fixed part fitted on what is left of those steps).
pub fn fit_host_cudagraph(models: &[TraceModel], tier: Tier) -> Result<HostOverhead> {
    let mut replays: Vec<([f64; 4], f64)> = Vec::new();
    let mut captures: Vec<([f64; 4], CaptureLoad, f64, f64)> = Vec::new(); // (replay features, capture load, gpu, residual)
    let mut fitted_on: Vec<&str> = Vec::new();
    for m in models.iter().filter(|m| m.fits_host()) {
        for run in m.runs.iter().filter(|r| r.status == "ok" && r.engine == TraceEngine::Hf && r.tp == 1 && r.graphs.is_some()) {
            let p = predictor_for(m, run, tier, HostOverhead::zero())?;
            if !fitted_on.contains(&m.label.as_str()) {
                fitted_on.push(&m.label);
            }
            for s in run.steps.iter().filter(|s| s.num_requests > 0) {
                let batch = logged_step_batch(s);
                let (cost, capture) = p.step_time_and_capture(&batch);
                let captured = capture.is_some();
                let l = p.step_load(&batch, 0);
                // No per-layer term: the probes, which alone fit these, all have 12 layers, and
                // the real models' one-request host time does not grow with layers (CUDA-event
                // profiles: 1.2-1.5 ms at 16 to 32 layers).
                let x = [1.0, l.seq_groups as f64, l.full_read_tokens as f64, l.sliding_read_tokens as f64];
                // A zero host model charges nothing for a capture: cost is the GPU time. A
                // replayed step whose GPU time was measured (the probes, whose tiny kernels the
                // kernel model times worst) leaves the host time itself.
                let gpu_us = match s.gpu_ms {
                    Some(ms) if !captured => ms * 1e3,
                    _ => cost.total_us,
                };
                let residual = (s.end_s - s.start_s) * 1e6 - gpu_us;
                if let Some(load) = capture {
                    captures.push((x, load, cost.total_us, residual));
                } else if s.gpu_ms.is_some() {
                    // Replayed steps fit the host terms only where their GPU time was measured:
                    // the host time itself, whatever the tier's kernel model predicts.
                    replays.push((x, residual));
                }
            }
        }
    }
    if replays.len() < 10 || captures.len() < 3 {
        bail!("only {} replayed and {} capturing steps in the calibration CUDA-graph traces; need 10 and 3", replays.len(), captures.len());
    }
    let c = nonneg_least_absolute_deviations(&replays);
    // Capturing steps: residual = max(0, b K - gpu) + b K + fixed + a A (K: the step's kernel
    // launches, A: its million activation elements). Grid over the per-kernel launch time b
    // (0 to 200 us by 0.5 us); fixed and a by non-negative least absolute deviations.
    let mut best = (f64::INFINITY, 0.0, [0.0; 2]);
    for i in 0..=400 {
        let b = i as f64 * 0.5;
        let rows: Vec<([f64; 2], f64)> = captures
            .iter()
            .map(|(x, l, gpu, r)| {
                let k = l.kernels as f64;
                ([1.0, l.activations as f64 / 1e6], r - dot(x, &c) - (b * k - gpu).max(0.0) - b * k)
            })
            .collect();
        let fa = nonneg_least_absolute_deviations(&rows);
        let sad: f64 = rows.iter().map(|(x, y)| (y - dot(x, &fa)).abs()).sum();
        if sad < best.0 {
            best = (sad, b, fa);
        }
    }
    Ok(HostOverhead {
        per_step_us: c[0],
        per_seq_cache_group_us: c[1],
        per_full_read_token_us: c[2],
        per_sliding_read_token_us: c[3],
        graph_capture_us: best.2[0],
        graph_capture_per_kernel_us: best.1,
        graph_capture_per_m_activations_us: best.2[1],
        source: Provenance::of(format!(
            "fitted by `validate e2e` on {} replayed and {} capturing steps of the CUDA-graph runs of {} (tier {})",
            replays.len(),
            captures.len(),
            fitted_on.join(", "),
            tier.as_str()
        )),
        ..HostOverhead::zero()
    })
}

/// The eager host model with transformers' tensor-parallel hook term (`static_steps::fit_host`).
pub fn with_tp_hooks(mut host: HostOverhead, tp_hooks_us: f64) -> HostOverhead {
    host.tp_launch_per_layer_us = tp_hooks_us;
    if tp_hooks_us > 0.0 {
        host.source.step_terms += &format!("; tensor-parallel hooks {tp_hooks_us:.0} us/layer: median over the static generate decode steps at tp > 1");
    }
    host
}


/// The device call a run belongs to: its key's first segment (the harness's start time).
pub fn call_of(run: &TraceRun) -> &str {
    run.key.split('/').next().unwrap_or_default()
}

/// How host terms scale with the host-speed probe, fitted across probed device calls: (probe /
/// reference) ^ exponent. The CUDA-graph capture terms (host and driver work: the same captures
/// took 0.5-1.1x the H200-fitted time on lent H100 machines, faster on hosts whose probe reads
/// faster) and the eager engine's every host term (its steps are the host's; 0.8-1.2x on the
/// H100 machines, in the order of their probes) each get one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbeScaling {
    /// Probe reading (`python_loop_ns`) of a host that runs as the fitted terms say.
    pub reference_ns: f64,
    pub exponent: f64,
    pub calls: usize,
    /// What the fit ran on within those calls: capturing steps, or eager runs.
    pub samples: usize,
}

impl ProbeScaling {
    pub fn factor(&self, probe_ns: f64) -> f64 {
        (probe_ns / self.reference_ns).powf(self.exponent)
    }

    /// The fitted law for the host file's provenance: `terms` scaled, fitted on `samples`.
    pub fn describe(&self, terms: &str, samples: &str, tier: &str) -> String {
        format!(
            "{terms} x (probe / {:.0} ns) ^ {:.2}: fitted by `validate e2e` on {} {samples} of {} probed device calls (tier {tier}); each probed call is replayed with the scaling fitted on the others",
            self.reference_ns, self.exponent, self.samples, self.calls
        )
    }

    /// The law with the least mean over calls (each call once) of `call_error(call, factor)`, on
    /// a grid over the exponent (0 to 1.5 by 0.02) and the reference (40 to 250 ns by 1 ns);
    /// None with fewer than three calls. `calls`: each call's probe reading, its data and how
    /// many samples it holds.
    fn fit<T>(calls: &[(f64, &T, usize)], call_error: impl Fn(&T, f64) -> f64) -> Option<ProbeScaling> {
        if calls.len() < 3 {
            return None;
        }
        let samples = calls.iter().map(|(_, _, n)| n).sum();
        let mut best: Option<(f64, ProbeScaling)> = None;
        for e in 0..=75 {
            let exponent = e as f64 * 0.02;
            for r in 40..=250 {
                let reference_ns = r as f64;
                let err = calls.iter().map(|(probe_ns, data, _)| call_error(data, (probe_ns / reference_ns).powf(exponent))).sum::<f64>() / calls.len() as f64;
                if best.as_ref().is_none_or(|(b, _)| err < *b) {
                    best = Some((err, ProbeScaling { reference_ns, exponent, calls: calls.len(), samples }));
                }
                if exponent == 0.0 {
                    break; // the reference does not matter without an exponent
                }
            }
        }
        best.map(|(_, s)| s)
    }
}

/// The capturing steps of the probed CUDA-graph runs (every run whose folder records a probe
/// reading), per device call, as `host` predicts them: what `fit` fits on. Collected once, so
/// that one fit per left-out call does not replay the runs again.
pub struct ProbedCaptures<'a> {
    host: HostOverhead,
    /// Per call: its probe reading and its capturing steps.
    calls: BTreeMap<&'a str, (f64, Vec<CaptureStep>)>,
}

struct CaptureStep {
    measured_us: f64,
    /// The predicted step but its capture extra.
    rest_us: f64,
    gpu_us: f64,
    load: CaptureLoad,
}

impl<'a> ProbedCaptures<'a> {
    pub fn collect(models: &'a [TraceModel], tier: Tier, host: &HostOverhead) -> Result<ProbedCaptures<'a>> {
        let mut calls: BTreeMap<&str, (f64, Vec<CaptureStep>)> = BTreeMap::new();
        for m in models {
            let Some(probe_ns) = m.host_probe_ns else { continue };
            for run in m.runs.iter().filter(|r| r.status == "ok" && r.engine == TraceEngine::Hf && r.tp == 1 && r.graphs.is_some()) {
                let p = predictor_for(m, run, tier, host.clone())?;
                for s in run.steps.iter().filter(|s| s.num_requests > 0) {
                    let (cost, capture) = p.step_time_and_capture(&logged_step_batch(s));
                    if let Some(load) = capture {
                        // Under CUDA graphs every host term of a step is in `host_us`.
                        let gpu_us = cost.total_us - cost.host_us;
                        let rest_us = cost.total_us - host.capture_extra_us(gpu_us, &load);
                        let step = CaptureStep { measured_us: (s.end_s - s.start_s) * 1e6, rest_us, gpu_us, load };
                        calls.entry(call_of(run)).or_insert((probe_ns, vec![])).1.push(step);
                    }
                }
            }
        }
        Ok(ProbedCaptures { host: host.clone(), calls })
    }

    /// Fits the capture terms' `ProbeScaling` on every call but `leave_out`: each call's error is
    /// the median |ln(measured / predicted)| of its capturing steps, the predicted step with its
    /// capture terms scaled.
    pub fn fit(&self, leave_out: Option<&str>) -> Option<ProbeScaling> {
        let calls: Vec<(f64, &Vec<CaptureStep>, usize)> =
            self.calls.iter().filter(|(c, _)| Some(**c) != leave_out).map(|(_, (probe_ns, steps))| (*probe_ns, steps, steps.len())).collect();
        ProbeScaling::fit(&calls, |steps, factor| {
            let errs: Vec<f64> = steps.iter().map(|s| (s.measured_us / (s.rest_us + self.host.capture_extra_scaled_us(s.gpu_us, &s.load, factor))).ln().abs()).collect();
            crate::quantile::median(&errs)
        })
    }
}

/// The probed eager runs per device call: the call's probe reading and each run's measured and
/// predicted (unscaled host) TPOT p50. An eager step is nearly all host work, so the TPOT ratio
/// stands for the host terms' factor.
#[derive(Default)]
pub struct ProbedEager(BTreeMap<String, (f64, Vec<(f64, f64)>)>);

impl ProbedEager {
    pub fn add(&mut self, call: &str, probe_ns: f64, measured_tpot_ms: f64, predicted_tpot_ms: f64) {
        self.0.entry(call.to_string()).or_insert((probe_ns, Vec::new())).1.push((measured_tpot_ms, predicted_tpot_ms));
    }

    /// Fits every eager host term's `ProbeScaling` on every call but `leave_out`: each call's
    /// error is the median |ln(predicted x factor / measured)| TPOT of its runs.
    pub fn fit(&self, leave_out: Option<&str>) -> Option<ProbeScaling> {
        let calls: Vec<(f64, &Vec<(f64, f64)>, usize)> =
            self.0.iter().filter(|(c, _)| Some(c.as_str()) != leave_out).map(|(_, (probe_ns, runs))| (*probe_ns, runs, runs.len())).collect();
        ProbeScaling::fit(&calls, |runs, factor| crate::quantile::median(&runs.iter().map(|(m, p)| (p * factor / m).ln().abs()).collect::<Vec<_>>()))
    }
}

#[cfg(test)]
mod eager_probe_tests {
    use super::*;

    #[test]
    fn the_eager_probe_fit_recovers_a_power_law_and_needs_three_other_calls() {
        // Four calls whose measured TPOT is the prediction x (80 / probe) ^ 0.6: slower hosts
        // (higher readings) run slower. The fit, on any three, finds that law again.
        let mut p = ProbedEager::default();
        for (call, probe_ns) in [("a", 55.0), ("b", 70.0), ("c", 95.0), ("d", 120.0)] {
            for predicted in [50.0, 80.0, 100.0] {
                let measured: f64 = predicted * (probe_ns / 80.0_f64).powf(0.6);
                p.add(call, probe_ns, measured, predicted);
            }
        }
        let sc = p.fit(Some("d")).expect("three calls");
        assert_eq!((sc.calls, sc.samples), (3, 9));
        assert!((sc.reference_ns - 80.0).abs() <= 1.0 && (sc.exponent - 0.6).abs() < 0.03, "{sc:?}");
        // The left-out call's runs come out within 2 % with the others' fit.
        assert!((sc.factor(120.0) / (120.0_f64 / 80.0).powf(0.6) - 1.0).abs() < 0.02, "{sc:?}");
        // Two calls cannot pin a reference and an exponent.
        let mut two = ProbedEager::default();
        two.add("a", 55.0, 40.0, 50.0);
        two.add("b", 70.0, 45.0, 50.0);
        assert!(two.fit(None).is_none());
    }
}

//! Fits an engine's host overhead (per step, per scheduled sequence) to the measured TPOT of
//! its calibration runs.
//!
//! Host overhead adds `per_step_us + per_seq_us x seqs` to every step, so each run's mean TPOT
//! is close to linear in the two parameters. Gauss-Newton on that: simulate each run at the
//! current parameters and with each parameter nudged (finite differences give the
//! sensitivities), solve the non-negative least squares of relative TPOT error, repeat, keep
//! the best point seen (see `gauss_newton_host`). The fit sees only TPOT: TTFT also carries
//! queueing and prefill kernel errors that host overhead must not absorb. `per_token_us` stays 0 (collinear with per_seq in decode steps);
//! `launch_per_layer_us` stays 0 (all three engines replay CUDA graphs in decode). The
//! engine's other terms (vLLM's prefill-step launch terms, fitted on the H200 vLLM traces) are
//! kept as given.

use super::rows::SimPoint;
use super::run::simulate;
use crate::e2e::stats::{ape, ErrorStats};
use crate::perf::host::{HostOverhead, Provenance};
use crate::perf::Tier;
use anyhow::{bail, Result};
use rayon::prelude::*;
use serde::Serialize;

/// Finite-difference nudges: large enough to move TPOT well above float noise, small enough
/// to stay in the linear range.
const NUDGE_STEP_US: f64 = 200.0;
const NUDGE_SEQ_US: f64 = 2.0;
const ITERATIONS: usize = 3;

#[derive(Debug, Clone, Serialize)]
pub struct HostFit {
    pub engine: String,
    pub tier: Tier,
    /// Calibration runs (rows) used.
    pub runs: usize,
    pub host: HostOverhead,
    /// TPOT APE on the calibration runs with no host overhead and with the fitted one.
    pub tpot_before: ErrorStats,
    pub tpot_after: ErrorStats,
}

fn host(base: &HostOverhead, per_step_us: f64, per_seq_us: f64) -> HostOverhead {
    HostOverhead { per_step_us, per_seq_us, source: Provenance::default(), ..base.clone() }
}

fn tpots(points: &[(SimPoint, f64)], tier: Tier, h: &HostOverhead) -> Result<Vec<f64>> {
    points.par_iter().map(|(p, _)| simulate(p, tier, Some(h)).map(|r| r.tpot_ms)).collect()
}

/// Sum of squared relative errors, the objective the Gauss-Newton steps minimise.
fn sq_rel_error(pred: &[f64], measured: &[f64]) -> f64 {
    pred.iter().zip(measured).map(|(p, m)| ((p - m) / m).powi(2)).sum()
}

/// min over x >= 0 of sum_i (a_i . x - y_i)^2 for two unknowns: the unconstrained optimum if
/// feasible, else the best of the one-variable optima on the boundary.
pub fn nnls2(a: &[[f64; 2]], y: &[f64]) -> [f64; 2] {
    let (mut s00, mut s01, mut s11, mut b0, mut b1) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for (ai, &yi) in a.iter().zip(y) {
        s00 += ai[0] * ai[0];
        s01 += ai[0] * ai[1];
        s11 += ai[1] * ai[1];
        b0 += ai[0] * yi;
        b1 += ai[1] * yi;
    }
    let cost = |x: [f64; 2]| a.iter().zip(y).map(|(ai, yi)| (ai[0] * x[0] + ai[1] * x[1] - yi).powi(2)).sum::<f64>();
    let mut candidates = vec![[0.0, 0.0]];
    if s00 > 0.0 {
        candidates.push([(b0 / s00).max(0.0), 0.0]);
    }
    if s11 > 0.0 {
        candidates.push([0.0, (b1 / s11).max(0.0)]);
    }
    let det = s00 * s11 - s01 * s01;
    if det.abs() > 1e-12 * (s00 * s11).max(f64::MIN_POSITIVE) {
        let x = [(b0 * s11 - b1 * s01) / det, (s00 * b1 - s01 * b0) / det];
        if x[0] >= 0.0 && x[1] >= 0.0 {
            candidates.push(x);
        }
    }
    candidates.into_iter().min_by(|p, q| cost(*p).total_cmp(&cost(*q))).expect("at least the origin")
}

/// Gauss-Newton on the two host terms from zero: `eval(per_step_us, per_seq_us)` gives each
/// run's TPOT, `measured` the runs' TPOT; at most `iterations` steps. Returns the best terms
/// seen, the TPOTs there and the TPOTs with no host work.
/// The step time is piecewise linear in the terms (max of GPU and host when the engine overlaps
/// them), so a linearised step can land far off (host work hidden behind the GPU has almost no
/// gradient); the next step may come back, and the best point is kept either way.
pub fn gauss_newton_host(measured: &[f64], iterations: usize, eval: &dyn Fn(f64, f64) -> Result<Vec<f64>>) -> Result<([f64; 2], Vec<f64>, Vec<f64>)> {
    let mut x = [0.0f64; 2];
    let mut base = eval(x[0], x[1])?;
    let at_start = base.clone();
    let mut best = (x, base.clone(), sq_rel_error(&base, measured));
    for _ in 0..iterations {
        let d_step = eval(x[0] + NUDGE_STEP_US, x[1])?;
        let d_seq = eval(x[0], x[1] + NUDGE_SEQ_US)?;
        // Relative residuals: each run counts by its percentage error, not its milliseconds.
        let mut a = Vec::with_capacity(measured.len());
        let mut y = Vec::with_capacity(measured.len());
        for (i, &m) in measured.iter().enumerate() {
            let g = [(d_step[i] - base[i]) / NUDGE_STEP_US / m, (d_seq[i] - base[i]) / NUDGE_SEQ_US / m];
            // Linear model around x: tpot(x') = base + g . (x' - x) (in units of m).
            a.push(g);
            y.push((m - base[i]) / m + g[0] * x[0] + g[1] * x[1]);
        }
        let next = nnls2(&a, &y);
        let moved = (next[0] - x[0]).abs() > 0.5 || (next[1] - x[1]).abs() > 0.005;
        x = next;
        base = eval(x[0], x[1])?;
        let cost = sq_rel_error(&base, measured);
        if cost < best.2 {
            best = (x, base.clone(), cost);
        }
        if !moved {
            break;
        }
    }
    Ok((best.0, best.1, at_start))
}

/// Fits `engine`'s host overhead on `points` (calibration runs with measured mean TPOT, ms):
/// `per_step_us` and `per_seq_us`, every other term as in `fixed`.
pub fn fit_engine(engine: &str, points: &[(SimPoint, f64)], tier: Tier, fixed: &HostOverhead) -> Result<HostFit> {
    if points.len() < 2 {
        bail!("{engine}: {} calibration runs; at least 2 are needed to fit two parameters", points.len());
    }
    let measured: Vec<f64> = points.iter().map(|(_, m)| *m).collect();
    let apes = |pred: &[f64]| ErrorStats::of(&pred.iter().zip(&measured).map(|(p, m)| ape(*p, *m)).collect::<Vec<_>>());
    let host = |step: f64, seq: f64| host(fixed, step, seq);
    let (x, fitted, unfitted) = gauss_newton_host(&measured, ITERATIONS, &|step, seq| tpots(points, tier, &host(step, seq)))?;
    let (tpot_before, tpot_after) = (apes(&unfitted), apes(&fitted));
    let mut h = host(x[0], x[1]);
    h.source = Provenance {
        step_terms: format!(
            "fitted by kernelsight e2e::silicon::fit on {} calibration runs of calibration/public/silicon_h100_sxm_agg.csv against the {} tier (TPOT median APE {:.1}% -> {:.1}%)",
            points.len(),
            tier.as_str(),
            tpot_before.median_ape,
            tpot_after.median_ape
        ),
        // The launch terms and request path are kept from `fixed`, with where they came from.
        launch_terms: fixed.source.launch_terms.clone(),
        // So is the probe reference (the machines the H200 traces ran on).
        probe_reference: fixed.source.probe_reference.clone(),
        adjusted: String::new(),
    };
    Ok(HostFit { engine: engine.to_string(), tier, runs: points.len(), host: h, tpot_before, tpot_after })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TPOT of runs whose GPU step is `gpu_ms` with `seqs` sequences, the host's work (per
    /// step + per sequence) added to it or overlapped with it; overlapped, 1 % of the steps
    /// start from an idle engine and pay the host work in full.
    fn synthetic(runs: &[(f64, f64)], overlapped: bool, step_us: f64, seq_us: f64) -> Vec<f64> {
        runs.iter()
            .map(|&(gpu_ms, seqs)| {
                let host_ms = (step_us + seq_us * seqs) * 1e-3;
                if overlapped { 0.99 * gpu_ms.max(host_ms) + 0.01 * (gpu_ms + host_ms) } else { gpu_ms + host_ms }
            })
            .collect()
    }

    #[test]
    fn gauss_newton_recovers_additive_host_terms_from_zero() {
        let runs = [(5.0, 8.0), (9.0, 64.0), (3.0, 16.0), (12.0, 128.0), (6.0, 32.0)];
        let measured = synthetic(&runs, false, 700.0, 16.0);
        let (x, fitted, _) = gauss_newton_host(&measured, ITERATIONS, &|a, b| Ok(synthetic(&runs, false, a, b))).unwrap();
        assert!((x[0] - 700.0).abs() < 1.0 && (x[1] - 16.0).abs() < 0.05, "{x:?}");
        assert!(fitted.iter().zip(&measured).all(|(p, m)| (p - m).abs() < 1e-3 * m));
    }

    #[test]
    fn gauss_newton_keeps_its_best_point_when_host_work_is_overlapped() {
        // Every run measured 1.2x its GPU time, which overlapped host work cannot give. With the
        // host hidden, only the idle steps give the terms a (tiny) gradient, and the linearised
        // step asks for host work far above every GPU step: the undamped fit ran off to 1e14
        // us/seq on the public TensorRT-LLM rows this way.
        let runs = [(5.0, 8.0), (9.0, 64.0), (3.0, 16.0), (12.0, 128.0), (1.0, 8.0)];
        let measured: Vec<f64> = runs.iter().map(|r| 1.2 * r.0).collect();
        let eval = |a: f64, b: f64| Ok(synthetic(&runs, true, a, b));
        let before = sq_rel_error(&eval(0.0, 0.0).unwrap(), &measured);
        // Its first step lands where every run is host-bound (error ~7000x the start's): stopped
        // there, the fit keeps the start; the second step comes back below it.
        let (x, fitted, _) = gauss_newton_host(&measured, 1, &eval).unwrap();
        assert_eq!(x, [0.0, 0.0]);
        assert_eq!(sq_rel_error(&fitted, &measured), before);
        let (x, fitted, _) = gauss_newton_host(&measured, ITERATIONS, &eval).unwrap();
        assert!(x.iter().all(|v| v.is_finite() && *v >= 0.0), "{x:?}");
        assert!(sq_rel_error(&fitted, &measured) < 0.7 * before, "{x:?}");
    }

    #[test]
    fn nnls_recovers_exact_and_clamps_negative() {
        // y = 2 a0 + 3 a1 exactly.
        let a = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]];
        let y: Vec<f64> = a.iter().map(|r| 2.0 * r[0] + 3.0 * r[1]).collect();
        let x = nnls2(&a, &y);
        assert!((x[0] - 2.0).abs() < 1e-9 && (x[1] - 3.0).abs() < 1e-9, "{x:?}");
        // y = -1 a0 + 3 a1: the best non-negative answer sets x0 = 0 and refits x1 alone.
        let y: Vec<f64> = a.iter().map(|r| -r[0] + 3.0 * r[1]).collect();
        let x = nnls2(&a, &y);
        assert_eq!(x[0], 0.0);
        // x1 alone: sum(a1 y) / sum(a1^2) = (3 + 2 + 1) / 3 = 2.
        assert!((x[1] - 2.0).abs() < 1e-9, "{x:?}");
    }
}

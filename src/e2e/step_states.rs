//! The eager engine's decode steps run at two speeds: a fast one, and about 1.4-1.5x that in
//! stretches of a second or so, while its thread stays on one vCPU (session 51: a vCPU slowed in
//! place by load on its core). A run's TPOT is its mean step, so the share of slow steps moves it
//! by up to ~20 % between runs and calls. Shown per device call, next to the replay's TPOT error,
//! it tells a call whose host ran slow apart from a model that prices it wrong.

use super::traces::{TraceEngine, TraceModel, TraceStep};
use super::traces_report::RunResult;
use crate::quantile::{median, quantile};
use serde::Serialize;
use std::collections::BTreeMap;

/// A pure-decode step above this multiple of its run's fast step counts as slow.
pub const SLOW_OVER_FAST: f64 = 1.25;

/// Fewest pure-decode steps for a run's fast step to mean anything.
const MIN_STEPS: usize = 10;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepStates {
    /// 10th percentile of the run's pure-decode step times (ms).
    pub fast_ms: f64,
    /// Share of those steps above `SLOW_OVER_FAST` x `fast_ms`.
    pub slow_share: f64,
    /// Their mean over `fast_ms`: what the slow steps add to the run's TPOT.
    pub mean_over_fast: f64,
}

/// The step states of a run's pure-decode steps (every scheduled sequence decoding one token);
/// None with fewer than `MIN_STEPS` of them.
pub fn of_steps(steps: &[TraceStep]) -> Option<StepStates> {
    let ms: Vec<f64> = steps.iter().filter(|s| s.num_decode > 0 && s.q_tokens == u64::from(s.num_decode)).map(|s| 1e3 * (s.end_s - s.start_s)).collect();
    if ms.len() < MIN_STEPS {
        return None;
    }
    let fast_ms = quantile(&ms, 0.1);
    let slow = ms.iter().filter(|&&t| t > SLOW_OVER_FAST * fast_ms).count();
    let mean = ms.iter().sum::<f64>() / ms.len() as f64;
    Some(StepStates { fast_ms, slow_share: slow as f64 / ms.len() as f64, mean_over_fast: mean / fast_ms })
}

#[derive(Debug, Clone, Serialize)]
pub struct CallStates {
    pub call: String,
    pub gpu: String,
    pub runs: usize,
    /// Medians over the call's eager runs.
    pub slow_share: f64,
    pub mean_over_fast: f64,
    /// Median predicted / measured TPOT p50 of the same runs in the tier shown.
    pub tpot_ratio: f64,
}

/// The eager runs of each device call: their step states and the replay's TPOT ratio in `tier`.
pub fn by_call(models: &[TraceModel], results: &[RunResult], tier: &str) -> Vec<CallStates> {
    let ratio: BTreeMap<(&str, &str), f64> =
        results.iter().filter(|r| r.tier == tier).map(|r| ((r.model.as_str(), r.run.as_str()), r.predicted["tpot_p50"] / r.measured["tpot_p50"])).collect();
    let mut calls: BTreeMap<(String, String), Vec<(StepStates, f64)>> = BTreeMap::new();
    for m in models {
        for run in m.runs.iter().filter(|r| r.status == "ok" && r.engine == TraceEngine::Hf && r.graphs.is_none()) {
            let (Some(states), Some(&r)) = (of_steps(&run.steps), ratio.get(&(m.label.as_str(), run.key.as_str()))) else { continue };
            let call = super::host_fit::call_of(run).to_string();
            calls.entry((call, m.gpu.clone())).or_default().push((states, r));
        }
    }
    calls
        .into_iter()
        .map(|((call, gpu), v)| CallStates {
            call,
            gpu,
            runs: v.len(),
            slow_share: median(&v.iter().map(|(s, _)| s.slow_share).collect::<Vec<_>>()),
            mean_over_fast: median(&v.iter().map(|(s, _)| s.mean_over_fast).collect::<Vec<_>>()),
            tpot_ratio: median(&v.iter().map(|(_, r)| *r).collect::<Vec<_>>()),
        })
        .collect()
}

pub fn render(calls: &[CallStates], tier: &str) -> String {
    if calls.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "\n  eager runs' two step speeds, by device call [{tier}]: a pure-decode step above {SLOW_OVER_FAST}x its run's fast step (10th percentile) is slow; medians over runs\n"
    );
    s += &format!("    {:<22} {:<10} {:>5} {:>11} {:>10} {:>15}\n", "call", "gpu", "runs", "slow share", "mean/fast", "TPOT pred/meas");
    for c in calls {
        s += &format!("    {:<22} {:<10} {:>5} {:>11.2} {:>10.3} {:>14.2}x\n", c.call, c.gpu, c.runs, c.slow_share, c.mean_over_fast, c.tpot_ratio);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(start_s: f64, ms: f64, decode: u32, q_tokens: u64) -> TraceStep {
        TraceStep { start_s, num_requests: decode.max(1), num_decode: decode, q_tokens, kv_read: 0, end_s: start_s + ms / 1e3, gpu_ms: None }
    }

    #[test]
    fn a_run_of_fast_and_slow_stretches_gives_its_slow_share_and_what_it_adds() {
        // A prompt step (not decode), then 16 decode steps at 40 ms and 4 at 60 ms.
        let mut steps = vec![step(0.0, 500.0, 0, 128)];
        steps.extend((0..20).map(|i| step(1.0 + i as f64, if (8..12).contains(&i) { 60.0 } else { 40.0 }, 8, 8)));
        let s = of_steps(&steps).expect("20 decode steps");
        assert!((s.fast_ms - 40.0).abs() < 1e-9, "{s:?}");
        assert!((s.slow_share - 0.2).abs() < 1e-12, "{s:?}");
        assert!((s.mean_over_fast - 1.1).abs() < 1e-9, "{s:?}");
        // Too few decode steps: no states.
        assert!(of_steps(&steps[..5]).is_none());
    }
}

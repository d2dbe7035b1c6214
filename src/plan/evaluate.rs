//! What the planner needs from a simulation of one candidate, behind a trait so that the
//! search, the SLO checks and the reports do not depend on how the numbers are produced.

use super::candidate::Candidate;
use super::slo::LatencyAtPercentile;
use crate::workload::WorkloadSpec;
use anyhow::Result;
use serde::Serialize;

/// Latency distribution of one metric over the finished requests, milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Quantiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    /// At the percentile the SLOs are checked against.
    pub at_slo: f64,
}

/// One candidate serving one workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub ttft_ms: Quantiles,
    pub tpot_ms: Quantiles,
    pub e2e_ms: Quantiles,
    pub requests: u64,
    /// Output tokens per second over the run (first arrival to last completion).
    pub output_tokens_per_s: f64,
    /// Most sequences one replica ran in one step. A max-num-seqs limit at or above it never
    /// bound, so a run with such a limit is the same run (the search reuses it).
    pub peak_running_seqs: u32,
    /// Which kernel-time model (tier) produced the step times.
    pub predicted_by: String,
    /// The run stopped once a TTFT or E2E target could no longer be met: latencies and
    /// throughput cover the requests finished by then (the latencies are lower bounds).
    pub stopped_early: bool,
    /// Requests finished in the second half of the arrival window per request arriving in it
    /// (`served_fraction`): about 1 when the engine keeps up with the offered load.
    pub served_fraction: f64,
}

/// Below this served fraction a run is overloaded: its queue grows for as long as requests
/// arrive, so a longer run at the same rate would miss any latency target (a finite run can
/// still end before its percentiles show it).
pub const MIN_SERVED_FRACTION: f64 = 0.9;

impl Outcome {
    pub fn at_slo(&self) -> LatencyAtPercentile {
        LatencyAtPercentile { ttft_ms: self.ttft_ms.at_slo, tpot_ms: self.tpot_ms.at_slo, e2e_ms: self.e2e_ms.at_slo }
    }

    /// The engine fell behind the offered load (see `MIN_SERVED_FRACTION`).
    pub fn overloaded(&self) -> bool {
        self.served_fraction < MIN_SERVED_FRACTION
    }

    /// Why the run cannot count as sustaining its load, if it cannot.
    pub fn overload_note(&self) -> Option<String> {
        self.overloaded().then(|| {
            format!(
                "falls behind: served {:.0}% of the requests arriving in the run's second half (needs {:.0}%; a run shorter than its latency cannot tell)",
                self.served_fraction * 100.0,
                MIN_SERVED_FRACTION * 100.0
            )
        })
    }
}

/// Over the second half of the arrival window (first to last arrival), requests finished per
/// request arrived, from each finished request's (arrival_s, finish_s). In steady state as many
/// leave as arrive (each finishes about one latency after it arrived); an overloaded engine
/// serves only its own rate, so the fraction falls to service rate / offered rate. A run whose
/// latency exceeds half its arrival window also scores low: it is too short to show a
/// sustained rate. 1 when no request arrives in that half (all at once, or one request).
pub fn served_fraction(arrival_finish_s: &[(f64, f64)]) -> f64 {
    let first = arrival_finish_s.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
    let last = arrival_finish_s.iter().map(|r| r.0).fold(f64::NEG_INFINITY, f64::max);
    let mid = 0.5 * (first + last);
    let in_window = |t: f64| t > mid && t <= last;
    let arrived = arrival_finish_s.iter().filter(|r| in_window(r.0)).count();
    if arrived == 0 {
        return 1.0;
    }
    let finished = arrival_finish_s.iter().filter(|r| in_window(r.1)).count();
    finished as f64 / arrived as f64
}

/// When a run may stop early: its TTFT or E2E percentile can no longer meet the target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StopRule {
    pub ttft_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
    /// Requests that may exceed a target before the percentile must exceed it too.
    pub allowed_misses: u64,
}

impl StopRule {
    /// For a run of `n` requests: the nearest-rank percentile p is the value at rank
    /// ceil(p n / 100), so it exceeds a target once more than n - rank requests do. None when
    /// `slo` has no TTFT or E2E target (TPOT is undefined for one-token answers).
    pub fn new(slo: &super::slo::Slo, n: u64) -> Option<StopRule> {
        if slo.ttft_ms.is_none() && slo.e2e_ms.is_none() {
            return None;
        }
        let rank = ((slo.percentile / 100.0 * n as f64).ceil() as u64).clamp(1, n.max(1));
        Some(StopRule { ttft_ms: slo.ttft_ms, e2e_ms: slo.e2e_ms, allowed_misses: n.saturating_sub(rank) })
    }
}

/// Simulates a candidate on a workload. Implementations are deterministic for a given
/// workload seed and safe to call from several threads at once.
pub trait Evaluator: Sync {
    /// `percentile` is the one the SLOs use (reported as `Quantiles::at_slo`).
    fn evaluate(&self, cand: &Candidate, workload: &WorkloadSpec, percentile: f64) -> Result<Outcome>;

    /// Like `evaluate`, but may stop once `stop` decides that a target is missed
    /// (`Outcome::stopped_early`). The default runs to the end.
    fn evaluate_or_stop(&self, cand: &Candidate, workload: &WorkloadSpec, percentile: f64, _stop: Option<StopRule>) -> Result<Outcome> {
        self.evaluate(cand, workload, percentile)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::slo::Slo;

    #[test]
    fn served_fraction_is_one_when_the_engine_keeps_up_and_the_service_share_when_it_falls_behind() {
        // Arrivals every 0.1 s for 100 s. Keeping up: each leaves 0.5 s later.
        let steady: Vec<(f64, f64)> = (0..1000).map(|i| (i as f64 * 0.1, i as f64 * 0.1 + 0.5)).collect();
        let f = served_fraction(&steady);
        assert!((f - 1.0).abs() < 0.02, "{f}");
        // Falling behind: one served every 0.2 s, in arrival order (half the offered rate).
        let behind: Vec<(f64, f64)> = (0..1000).map(|i| (i as f64 * 0.1, (i + 1) as f64 * 0.2)).collect();
        let f = served_fraction(&behind);
        assert!((f - 0.5).abs() < 0.02, "{f}");
        // Too short to tell: 10 arrivals in 0.9 s, each taking 3 s.
        let short: Vec<(f64, f64)> = (0..10).map(|i| (i as f64 * 0.1, i as f64 * 0.1 + 3.0)).collect();
        assert_eq!(served_fraction(&short), 0.0);
        // All at once: nothing arrives in the second half.
        assert_eq!(served_fraction(&[(0.0, 1.0), (0.0, 2.0)]), 1.0);
    }

    #[test]
    fn stop_rule_allows_the_requests_above_the_percentile_rank() {
        // p99 of 1000 requests is the 990th smallest: 10 may exceed the target.
        let slo = Slo { ttft_ms: Some(500.0), tpot_ms: None, e2e_ms: None, percentile: 99.0 };
        assert_eq!(StopRule::new(&slo, 1000).unwrap().allowed_misses, 10);
        // p50 of 5: rank 3, 2 may exceed. p100: none.
        assert_eq!(StopRule::new(&Slo { percentile: 50.0, ..slo.clone() }, 5).unwrap().allowed_misses, 2);
        assert_eq!(StopRule::new(&Slo { percentile: 100.0, ..slo.clone() }, 7).unwrap().allowed_misses, 0);
        assert!(StopRule::new(&Slo { ttft_ms: None, tpot_ms: Some(20.0), ..slo }, 1000).is_none());
    }
}

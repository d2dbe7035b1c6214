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

/// Whether the engine keeps up, from each finished request's (arrival_s, finish_s): the share
/// of the offered rate it serves, 1 / (1 + g) with g the growth of latency per second of
/// arrivals over the second half of the arrival window (first to last arrival), fitted by least
/// squares and taken at its lower bound (two standard errors). A steady engine's latency does not
/// grow with arrival time, so it scores 1; an engine serving requests in order at its own rate
/// below the offered one adds (offered / service - 1) s of wait per second of arrivals, so it
/// scores service rate / offered rate. The bound keeps a short run's latency noise (lognormal
/// answer lengths, Poisson lumps) from reading as a growing queue: counting requests finished
/// per request arrived in that half, as before, put 13-18 % of steady 100-request runs below
/// 0.9 (the Poisson arrivals of one latency at each edge of the window). A run whose median
/// latency exceeds half its arrival window cannot show a sustained rate: the fraction is at
/// most half window / latency. 1 when no request arrives in the second half (all at once).
pub fn served_fraction(arrival_finish_s: &[(f64, f64)]) -> f64 {
    let first = arrival_finish_s.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
    let last = arrival_finish_s.iter().map(|r| r.0).fold(f64::NEG_INFINITY, f64::max);
    let mid = 0.5 * (first + last);
    let first_half_latency_s: Vec<f64> = arrival_finish_s.iter().filter(|r| r.0 <= mid).map(|r| r.1 - r.0).collect();
    let latency_s = crate::quantile::median(&first_half_latency_s);
    let long_enough = if latency_s > 0.0 { ((last - mid) / latency_s).min(1.0) } else { 1.0 };
    let second_half: Vec<(f64, f64)> = arrival_finish_s.iter().filter(|r| r.0 > mid).map(|&(a, f)| (a, f - a)).collect();
    let n = second_half.len() as f64;
    if second_half.len() < 3 {
        return if second_half.is_empty() { 1.0 } else { long_enough };
    }
    let (x_mean, y_mean) = (second_half.iter().map(|r| r.0).sum::<f64>() / n, second_half.iter().map(|r| r.1).sum::<f64>() / n);
    let sxx: f64 = second_half.iter().map(|r| (r.0 - x_mean).powi(2)).sum();
    if sxx <= 0.0 {
        return long_enough;
    }
    let growth = second_half.iter().map(|r| (r.0 - x_mean) * (r.1 - y_mean)).sum::<f64>() / sxx;
    let residual_sq: f64 = second_half.iter().map(|r| (r.1 - y_mean - growth * (r.0 - x_mean)).powi(2)).sum();
    let growth_se = (residual_sq / (n - 2.0) / sxx).sqrt();
    let growth_low = (growth - 2.0 * growth_se).max(0.0);
    (1.0 / (1.0 + growth_low)).min(long_enough)
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
        // Too short to tell: 10 arrivals in 0.9 s, each taking 3 s (half window / latency).
        let short: Vec<(f64, f64)> = (0..10).map(|i| (i as f64 * 0.1, i as f64 * 0.1 + 3.0)).collect();
        assert!((served_fraction(&short) - 0.45 / 3.0).abs() < 1e-9);
        // All at once: nothing arrives in the second half.
        assert_eq!(served_fraction(&[(0.0, 1.0), (0.0, 2.0)]), 1.0);
        // The growth bound: latency rising 0.5 s per second of arrivals over 1,000 requests
        // (service at 2/3 of the offered rate) scores just under 1 / 1.5.
        let growing: Vec<(f64, f64)> = (0..1000).map(|i| (i as f64 * 0.1, i as f64 * 0.1 * 1.5 + 1.0)).collect();
        assert!((served_fraction(&growing) - 1.0 / 1.5).abs() < 1e-6, "{}", served_fraction(&growing));
    }

    /// `n` Poisson arrivals at 1/s, each finishing a lognormal latency (median `latency_s`,
    /// sigma 0.8: answer lengths of chat traffic) later.
    fn poisson_keeping_up(seed: u64, n: usize, latency_s: f64) -> Vec<(f64, f64)> {
        use rand::SeedableRng;
        use rand_distr::{Distribution, Exp, LogNormal};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let (gap, latency) = (Exp::new(1.0).unwrap(), LogNormal::new(latency_s.ln(), 0.8).unwrap());
        let mut t = 0.0;
        (0..n)
            .map(|_| {
                t += gap.sample(&mut rng);
                (t, t + latency.sample(&mut rng))
            })
            .collect()
    }

    #[test]
    fn served_fraction_of_a_short_steady_run_stays_near_one_whatever_its_arrivals_lumps() {
        // 100 requests at 1/s, each taking about 8 s: a steady engine. Counting finishes per
        // arrival in the second half put about one in five such runs below 0.9 (`overloaded`).
        let fractions: Vec<f64> = (0..40).map(|seed| served_fraction(&poisson_keeping_up(seed, 100, 8.0))).collect();
        for (seed, f) in fractions.iter().enumerate() {
            assert!((0.9..=1.1).contains(f), "seed {seed}: {f}");
        }
        // Falling behind with the same arrivals: the engine serves them in order, each taking
        // a quarter of its steady latency (2 s at the median, 2.75 s on average: 0.36 of the
        // offered rate).
        for seed in 0..10 {
            let offered = poisson_keeping_up(seed, 100, 8.0);
            let mut free_s: f64 = 0.0;
            let behind: Vec<(f64, f64)> = offered
                .iter()
                .map(|&(a, f)| {
                    free_s = free_s.max(a) + 0.25 * (f - a);
                    (a, free_s)
                })
                .collect();
            let f = served_fraction(&behind);
            assert!(f < 0.6, "seed {seed}: {f}");
        }
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

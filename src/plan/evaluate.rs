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
}

impl Outcome {
    pub fn at_slo(&self) -> LatencyAtPercentile {
        LatencyAtPercentile { ttft_ms: self.ttft_ms.at_slo, tpot_ms: self.tpot_ms.at_slo, e2e_ms: self.e2e_ms.at_slo }
    }
}

/// Simulates a candidate on a workload. Implementations are deterministic for a given
/// workload seed and safe to call from several threads at once.
pub trait Evaluator: Sync {
    /// `percentile` is the one the SLOs use (reported as `Quantiles::at_slo`).
    fn evaluate(&self, cand: &Candidate, workload: &WorkloadSpec, percentile: f64) -> Result<Outcome>;
}

//! Highest arrival rate a deployment sustains within the SLOs, found by bracketing and then
//! narrowing the rate with the simulator, plus the latency-versus-load curve.

use super::candidate::Candidate;
use super::evaluate::{Evaluator, Outcome};
use super::slo::{Miss, Slo};
use crate::workload::{Arrival, WorkloadSpec};
use anyhow::{bail, Result};
use rayon::prelude::*;
use serde::Serialize;

/// One simulated load level.
#[derive(Debug, Clone, Serialize)]
pub struct LoadPoint {
    pub rate_per_s: f64,
    pub outcome: Outcome,
    pub misses: Vec<Miss>,
}

impl LoadPoint {
    /// Every target met, and the engine kept up with the load (a finite run can end before
    /// a growing queue shows in its percentiles).
    pub fn passes(&self) -> bool {
        self.misses.is_empty() && !self.outcome.overloaded()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CapacityResult {
    /// Highest rate found to meet every SLO (None: not even `min_rate_per_s`).
    pub max_rate_per_s: Option<f64>,
    /// The lowest rate found to miss an SLO (None: the search hit `max_rate_per_s` bound).
    pub first_failing_rate_per_s: Option<f64>,
    /// Every load level simulated, by rising rate.
    pub curve: Vec<LoadPoint>,
}

impl CapacityResult {
    /// The point at the highest passing rate.
    pub fn at_max(&self) -> Option<&LoadPoint> {
        let r = self.max_rate_per_s?;
        self.curve.iter().find(|p| p.rate_per_s == r)
    }
    /// The point at the lowest failing rate: which SLO gives out first.
    pub fn first_failing(&self) -> Option<&LoadPoint> {
        let r = self.first_failing_rate_per_s?;
        self.curve.iter().find(|p| p.rate_per_s == r)
    }
}

#[derive(Debug, Clone)]
pub struct CapacityOptions {
    /// First rate tried; the search doubles or halves from it.
    pub start_rate_per_s: f64,
    pub min_rate_per_s: f64,
    pub max_rate_per_s: f64,
    /// Stop when failing / passing rate <= 1 + this.
    pub rel_tolerance: f64,
    /// Extra evenly spaced load levels for the curve (0.1x .. 1.5x the found capacity).
    pub curve_points: usize,
}

impl Default for CapacityOptions {
    fn default() -> Self {
        CapacityOptions { start_rate_per_s: 1.0, min_rate_per_s: 1e-3, max_rate_per_s: 1e5, rel_tolerance: 0.03, curve_points: 8 }
    }
}

/// `workload` with its open-loop arrival rate replaced by `rate_per_s`.
pub fn at_rate(workload: &WorkloadSpec, rate_per_s: f64) -> Result<WorkloadSpec> {
    let Arrival::Rate { burstiness, .. } = workload.arrival else {
        bail!("capacity planning needs open-loop arrivals (--rate), not a closed loop (--concurrency)");
    };
    Ok(WorkloadSpec { arrival: Arrival::Rate { rate_per_s, burstiness }, ..workload.clone() })
}

struct Search<'a> {
    eval: &'a dyn Evaluator,
    cand: &'a Candidate,
    workload: &'a WorkloadSpec,
    slo: &'a Slo,
    points: Vec<LoadPoint>,
}

impl Search<'_> {
    /// Simulates several rates at once (one per core) and records them.
    fn try_rates(&mut self, rates: &[f64]) -> Result<()> {
        let pct = self.slo.percentile;
        let outs: Vec<Result<LoadPoint>> = rates
            .par_iter()
            .map(|&r| {
                let outcome = self.eval.evaluate(self.cand, &at_rate(self.workload, r)?, pct)?;
                let misses = self.slo.misses(&outcome.at_slo());
                Ok(LoadPoint { rate_per_s: r, outcome, misses })
            })
            .collect();
        for o in outs {
            self.points.push(o?);
        }
        Ok(())
    }

    /// Highest passing rate below the lowest failing one (latency is not perfectly monotone
    /// in rate with a finite sample, so a pass above a failure does not count).
    fn bracket(&self) -> (Option<f64>, Option<f64>) {
        let fail = self.points.iter().filter(|p| !p.passes()).map(|p| p.rate_per_s).min_by(f64::total_cmp);
        let pass = self
            .points
            .iter()
            .filter(|p| p.passes() && fail.is_none_or(|f| p.rate_per_s < f))
            .map(|p| p.rate_per_s)
            .max_by(f64::total_cmp);
        (pass, fail)
    }
}

/// Searches the highest rate at which `cand` meets `slo` on `workload` (whose lengths, seed
/// and burstiness are kept; only the rate changes).
pub fn max_sustainable_rate(eval: &dyn Evaluator, cand: &Candidate, workload: &WorkloadSpec, slo: &Slo, opts: &CapacityOptions) -> Result<CapacityResult> {
    slo.validate()?;
    if !(opts.min_rate_per_s > 0.0 && opts.min_rate_per_s <= opts.start_rate_per_s && opts.start_rate_per_s <= opts.max_rate_per_s) {
        bail!(
            "rate search bounds must satisfy 0 < min ({}) <= start ({}) <= max ({})",
            opts.min_rate_per_s, opts.start_rate_per_s, opts.max_rate_per_s
        );
    }
    at_rate(workload, 1.0)?;
    let mut s = Search { eval, cand, workload, slo, points: Vec::new() };
    let ways = rayon::current_num_threads().max(2);
    // Bracket: geometric steps of 2^ways from the start rate, `ways` rates per round.
    s.try_rates(&[opts.start_rate_per_s])?;
    loop {
        let (pass, fail) = s.bracket();
        match (pass, fail) {
            (Some(_), Some(_)) => break,
            (Some(p), None) => {
                if p >= opts.max_rate_per_s {
                    break;
                }
                let rates: Vec<f64> = (1..=ways).map(|i| (p * 2f64.powi(i as i32)).min(opts.max_rate_per_s)).collect();
                s.try_rates(&dedup(rates))?;
            }
            (None, Some(f)) => {
                if f <= opts.min_rate_per_s {
                    break;
                }
                let rates: Vec<f64> = (1..=ways).map(|i| (f / 2f64.powi(i as i32)).max(opts.min_rate_per_s)).collect();
                s.try_rates(&dedup(rates))?;
            }
            (None, None) => unreachable!("at least one rate was simulated"),
        }
    }
    // Narrow: `ways` rates evenly spaced in log between the bracket's ends per round.
    while let (Some(p), Some(f)) = s.bracket() {
        if f / p <= 1.0 + opts.rel_tolerance {
            break;
        }
        let rates: Vec<f64> = (1..=ways).map(|i| p * (f / p).powf(i as f64 / (ways + 1) as f64)).collect();
        s.try_rates(&rates)?;
    }
    let (pass, fail) = s.bracket();
    // Curve: load levels spread around the capacity (or the lowest rate tried).
    if opts.curve_points > 0 {
        let anchor = pass.or(fail).expect("a rate was simulated");
        let n = opts.curve_points;
        let rates: Vec<f64> = (0..n).map(|i| anchor * (0.1 + 1.4 * i as f64 / (n - 1).max(1) as f64)).filter(|r| *r >= opts.min_rate_per_s).collect();
        s.try_rates(&rates)?;
    }
    let mut curve = s.points;
    curve.sort_by(|a, b| a.rate_per_s.total_cmp(&b.rate_per_s));
    curve.dedup_by(|a, b| a.rate_per_s == b.rate_per_s);
    Ok(CapacityResult { max_rate_per_s: pass, first_failing_rate_per_s: fail, curve })
}

fn dedup(mut v: Vec<f64>) -> Vec<f64> {
    v.dedup();
    v
}

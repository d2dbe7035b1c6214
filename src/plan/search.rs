//! The planning search: simulate every enumerated candidate on all cores, check the SLOs,
//! rank by cost, and keep the Pareto frontier and (when nothing meets the SLOs) the closest.

use super::candidate::{Candidate, PoolSplit};
use crate::deployment::Deployment;
use super::evaluate::{Evaluator, Outcome, StopRule};
use super::frontier::pareto_frontier;
use super::slo::{Miss, Slo};
use super::space::{Enumerated, Pruned};
use crate::workload::{WorkloadSpec, DEFAULT_NUM_REQUESTS};
use anyhow::{bail, Result};
use indicatif::ProgressBar;
use rayon::prelude::*;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// Which latency the frontier plots against throughput per GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum FrontierMetric {
    Ttft,
    Tpot,
    E2e,
}

impl FrontierMetric {
    pub fn value(self, o: &Outcome) -> f64 {
        match self {
            FrontierMetric::Ttft => o.ttft_ms.at_slo,
            FrontierMetric::Tpot => o.tpot_ms.at_slo,
            FrontierMetric::E2e => o.e2e_ms.at_slo,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            FrontierMetric::Ttft => "TTFT",
            FrontierMetric::Tpot => "TPOT",
            FrontierMetric::E2e => "E2E",
        }
    }
}

/// One simulated candidate with its SLO verdict and cost.
#[derive(Debug, Clone, Serialize)]
pub struct Evaluated {
    pub label: String,
    pub candidate: Candidate,
    pub gpus: u64,
    pub cost_usd_per_hour: Option<f64>,
    pub output_tokens_per_s_per_gpu: f64,
    pub outcome: Outcome,
    /// Targets missed; empty when the candidate meets every SLO.
    pub misses: Vec<Miss>,
    /// Largest value/limit ratio over the targets (<= 1: all met).
    pub slo_ratio: f64,
}

impl Evaluated {
    /// A stopped run missed a target by construction, even when its partial percentiles
    /// happen to round below it.
    pub fn meets_slo(&self) -> bool {
        self.misses.is_empty() && !self.outcome.stopped_early && !self.outcome.overloaded()
    }
}

/// What the planner ranks candidates by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RankBy {
    CostUsdPerHour,
    /// Some GPU type has no price: GPU count instead.
    Gpus,
}

#[derive(Debug, Clone, Serialize)]
pub struct PlanResult {
    pub slo: Slo,
    pub ranked_by: RankBy,
    pub frontier_metric: FrontierMetric,
    pub evaluated: Vec<Evaluated>,
    /// Candidates whose simulation failed, with the error.
    pub failed: Vec<Pruned>,
    pub pruned: Vec<Pruned>,
    /// Index into `evaluated` of the cheapest candidate meeting every SLO.
    pub best: Option<usize>,
    /// Indices into `evaluated`, by rising latency.
    pub frontier: Vec<usize>,
    /// Simulations actually run; the rest reused a run whose max-num-seqs limit never bound.
    pub simulations_run: usize,
    /// When nothing meets the SLOs: the candidates nearest to meeting them (smallest
    /// worst value/limit ratio, then fewest targets missed), best first.
    pub closest: Vec<usize>,
    pub notes: Vec<String>,
}

pub struct PlanInput<'a> {
    pub enumerated: Enumerated,
    pub workload: &'a WorkloadSpec,
    pub slo: Slo,
    /// USD per GPU-hour by GPU id; GPUs without a price make the ranking fall back to GPUs.
    pub prices: BTreeMap<String, f64>,
    pub frontier_metric: FrontierMetric,
    /// How many closest candidates to report when nothing meets the SLOs.
    pub closest: usize,
    /// Stop a run once its TTFT or E2E percentile can no longer meet the target (needs the
    /// workload's request count, so not for replayed traces).
    pub stop_early: bool,
}

/// A candidate's position in the input, the candidate, its outcome, and whether the outcome
/// was reused from a run with a larger max-num-seqs.
type Run = (usize, Candidate, Result<Outcome>, bool);

/// Simulates every candidate (in parallel; the order of results does not depend on the
/// thread count) and ranks them. Candidates that differ only in max-num-seqs are run from the
/// largest limit down, and a smaller limit that the larger run never reached reuses that run
/// (the scheduler never hit it, so the run is identical).
pub fn run_plan(input: PlanInput, eval: &dyn Evaluator, progress: &ProgressBar) -> Result<PlanResult> {
    input.slo.validate()?;
    let Enumerated { candidates, pruned } = input.enumerated;
    if candidates.is_empty() {
        let mut msg = String::from("no deployment fits: every layout was pruned");
        for p in pruned.iter().take(8) {
            msg.push_str(&format!("\n  {}: {}", p.layout, p.reason));
        }
        if pruned.len() > 8 {
            msg.push_str(&format!("\n  ... and {} more", pruned.len() - 8));
        }
        msg.push_str("\nallow more GPUs (--max-gpus, --tp, --pp) or a smaller dtype (--dtype fp8)");
        bail!(msg);
    }
    progress.set_length(candidates.len() as u64);
    let pct = input.slo.percentile;
    let stop = match (input.stop_early, &input.workload.trace) {
        (true, None) => StopRule::new(&input.slo, input.workload.num_requests.unwrap_or(DEFAULT_NUM_REQUESTS)),
        _ => None,
    };
    let groups = seq_limit_groups(candidates);
    let evaluated_groups: Vec<Vec<Run>> = groups
        .into_par_iter()
        .map(|group| {
            let mut out = Vec::with_capacity(group.len());
            let mut last: Option<Outcome> = None;
            for (idx, c) in group {
                let (r, reused) = match &last {
                    Some(o) if o.peak_running_seqs <= c.limits.max_num_seqs => (Ok(o.clone()), true),
                    _ => (eval.evaluate_or_stop(&c, input.workload, pct, stop), false),
                };
                last = r.as_ref().ok().cloned();
                progress.inc(1);
                out.push((idx, c, r, reused));
            }
            out
        })
        .collect();
    let mut flat: Vec<Run> = evaluated_groups.into_iter().flatten().collect();
    flat.sort_by_key(|x| x.0);
    let simulations_run = flat.iter().filter(|x| !x.3).count();
    let results: Vec<(Candidate, Result<Outcome>)> = flat.into_iter().map(|(_, c, r, _)| (c, r)).collect();
    progress.finish_and_clear();

    let missing_price: Vec<String> = {
        let mut ids: Vec<String> = results.iter().map(|(c, _)| c.gpu.clone()).filter(|g| !input.prices.contains_key(g)).collect();
        ids.sort();
        ids.dedup();
        ids
    };
    let ranked_by = if missing_price.is_empty() { RankBy::CostUsdPerHour } else { RankBy::Gpus };
    let mut notes = Vec::new();
    if !missing_price.is_empty() {
        notes.push(format!(
            "no price for {}: ranking by GPU count (give --price GPU=USD_PER_HOUR to rank by cost)",
            missing_price.join(", ")
        ));
    }

    let mut evaluated = Vec::new();
    let mut failed = Vec::new();
    for (c, r) in results {
        match r {
            Ok(outcome) => {
                let lat = outcome.at_slo();
                let gpus = c.total_gpus();
                evaluated.push(Evaluated {
                    label: c.label(),
                    cost_usd_per_hour: input.prices.get(&c.gpu).map(|&p| c.cost_usd_per_hour(p)),
                    output_tokens_per_s_per_gpu: outcome.output_tokens_per_s / gpus as f64,
                    misses: input.slo.misses(&lat),
                    slo_ratio: input.slo.worst_ratio(&lat),
                    gpus,
                    candidate: c,
                    outcome,
                });
            }
            Err(e) => failed.push(Pruned { layout: c.label(), reason: format!("{e:#}") }),
        }
    }
    if evaluated.is_empty() {
        bail!("every simulation failed; first error: {}: {}", failed[0].layout, failed[0].reason);
    }

    let rank_key = |e: &Evaluated| match ranked_by {
        RankBy::CostUsdPerHour => e.cost_usd_per_hour.unwrap_or(f64::INFINITY),
        RankBy::Gpus => e.gpus as f64,
    };
    let best = (0..evaluated.len()).filter(|&i| evaluated[i].meets_slo()).min_by(|&a, &b| {
        let (ea, eb) = (&evaluated[a], &evaluated[b]);
        rank_key(ea).total_cmp(&rank_key(eb)).then(ea.gpus.cmp(&eb.gpus)).then(ea.slo_ratio.total_cmp(&eb.slo_ratio)).then(a.cmp(&b))
    });
    let mut closest = Vec::new();
    if best.is_none() {
        // A stopped run's latencies are lower bounds: finish the runs that would be shown
        // until the closest candidates all ran to the end.
        loop {
            let mut idx: Vec<usize> = (0..evaluated.len()).collect();
            idx.sort_by(|&a, &b| {
                let (ea, eb) = (&evaluated[a], &evaluated[b]);
                ea.slo_ratio
                    .total_cmp(&eb.slo_ratio)
                    .then(ea.misses.len().cmp(&eb.misses.len()))
                    .then(rank_key(ea).total_cmp(&rank_key(eb)))
                    .then(a.cmp(&b))
            });
            idx.truncate(input.closest);
            let unfinished: Vec<usize> = idx.iter().copied().filter(|&i| evaluated[i].outcome.stopped_early).collect();
            if unfinished.is_empty() {
                closest = idx;
                break;
            }
            let rerun: Vec<Result<Outcome>> = unfinished.par_iter().map(|&i| eval.evaluate(&evaluated[i].candidate, input.workload, pct)).collect();
            for (&i, r) in unfinished.iter().zip(rerun) {
                let e = &mut evaluated[i];
                e.outcome = r?;
                let lat = e.outcome.at_slo();
                e.misses = input.slo.misses(&lat);
                e.slo_ratio = input.slo.worst_ratio(&lat);
                e.output_tokens_per_s_per_gpu = e.outcome.output_tokens_per_s / e.gpus as f64;
            }
        }
    }
    // Stopped runs have no final latencies: they stay off the frontier.
    let points: Vec<(f64, f64)> = evaluated
        .iter()
        .map(|e| if e.outcome.stopped_early { (f64::NAN, f64::NAN) } else { (input.frontier_metric.value(&e.outcome), e.output_tokens_per_s_per_gpu) })
        .collect();
    let frontier = pareto_frontier(&points);
    Ok(PlanResult {
        slo: input.slo,
        ranked_by,
        frontier_metric: input.frontier_metric,
        evaluated,
        failed,
        pruned,
        best,
        frontier,
        closest,
        simulations_run,
        notes,
    })
}

/// Candidates that differ only in max-num-seqs, each group by falling limit (with the
/// candidate's position in the input): a run whose peak never reached a smaller limit is
/// also the run under that limit.
fn seq_limit_groups(candidates: Vec<Candidate>) -> Vec<Vec<(usize, Candidate)>> {
    let mut groups: Vec<Vec<(usize, Candidate)>> = Vec::new();
    let mut index: HashMap<(String, Deployment, u32, Option<PoolSplit>), usize> = HashMap::new();
    for (i, c) in candidates.into_iter().enumerate() {
        let key = (c.gpu.clone(), c.dep.clone(), c.limits.max_num_batched_tokens, c.disagg);
        let g = *index.entry(key).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push((i, c));
    }
    for g in &mut groups {
        g.sort_by(|a, b| b.1.limits.max_num_seqs.cmp(&a.1.limits.max_num_seqs).then(a.0.cmp(&b.0)));
    }
    groups
}

//! Planner search and rate search against a queueing toy whose answers are known in closed
//! form, so the expected choices follow from algebra, not from the program.

use indicatif::ProgressBar;
use kernelsight::hardware::load_gpu;
use kernelsight::model::ModelConfig;
use kernelsight::plan::candidate::Candidate;
use kernelsight::plan::capacity::{max_sustainable_rate, CapacityOptions};
use kernelsight::plan::evaluate::{Evaluator, Outcome, Quantiles};
use kernelsight::plan::search::{run_plan, FrontierMetric, PlanInput, RankBy};
use kernelsight::plan::slo::Slo;
use kernelsight::plan::space::SearchSpace;
use kernelsight::schema::Dtype;
use kernelsight::workload::{Arrival, Lengths, Sharing, WorkloadSpec};
use std::collections::BTreeMap;

/// M/M/1-like toy: every GPU serves 10 req/s; TTFT = 100 ms / (1 - load) below saturation,
/// unbounded above; TPOT = 20 ms on one GPU per replica, 12 ms with tensor parallelism.
struct Toy;

fn q(v: f64) -> Quantiles {
    Quantiles { p50: v, p90: v, p99: v, at_slo: v }
}

impl Evaluator for Toy {
    fn evaluate(&self, c: &Candidate, w: &WorkloadSpec, _pct: f64) -> anyhow::Result<Outcome> {
        let Arrival::Rate { rate_per_s, .. } = w.arrival else { unreachable!() };
        let load = rate_per_s / (10.0 * c.total_gpus() as f64);
        let ttft = if load < 1.0 { 100.0 / (1.0 - load) } else { f64::INFINITY };
        let tpot = if c.dep.tp == 1 { 20.0 } else { 12.0 };
        Ok(Outcome {
            ttft_ms: q(ttft),
            tpot_ms: q(tpot),
            e2e_ms: q(ttft + 100.0 * tpot),
            requests: 100,
            output_tokens_per_s: rate_per_s.min(10.0 * c.total_gpus() as f64) * 100.0,
            peak_running_seqs: 100,
            predicted_by: "toy".into(),
            stopped_early: false,
            served_fraction: (10.0 * c.total_gpus() as f64 / rate_per_s).min(1.0),
        })
    }
}

fn workload(rate: f64) -> WorkloadSpec {
    WorkloadSpec {
        num_requests: Some(100),
        arrival: Arrival::Rate { rate_per_s: rate, burstiness: 1.0 },
        lengths: Lengths::Fixed { isl: 100, osl: 100 },
        sharing: Sharing::None,
        seed: 0,
        trace: None,
    }
}

fn space() -> SearchSpace {
    SearchSpace {
        gpus: vec![load_gpu("h200_sxm").unwrap()],
        dtypes: vec![Dtype::Bf16],
        kv_dtypes: vec![Dtype::Bf16],
        tp: vec![1, 2, 4],
        pp: vec![1],
        max_num_seqs: vec![256],
        max_num_batched_tokens: vec![8192],
        max_gpus: 8,
        disaggregated: false,
        gpu_memory_utilization: 0.9,
        buffers: kernelsight::kernels::memory::EngineBuffers::Paged,
        min_kv_tokens: 200,
    }
}

fn plan(slo: Slo, prices: BTreeMap<String, f64>) -> kernelsight::plan::search::PlanResult {
    let m = ModelConfig::load("llama-3.1-8b").unwrap();
    let w = workload(30.0);
    let input = PlanInput {
        enumerated: space().enumerate(&m).unwrap(),
        workload: &w,
        slo,
        prices,
        frontier_metric: FrontierMetric::Ttft,
        closest: 3,
        stop_early: true,
    };
    run_plan(input, &Toy, &ProgressBar::hidden()).unwrap()
}

#[test]
fn cheapest_meeting_both_slos() {
    // 30 req/s, TTFT <= 400 ms -> 1/(1-load) <= 4 -> load <= 0.75 -> >= 4 GPUs; TPOT <= 15 ms
    // -> tp >= 2. Cheapest: 4 GPUs with tp 2 or 4 at 3.8 USD/h each = 15.2 USD/h.
    let slo = Slo { ttft_ms: Some(400.0), tpot_ms: Some(15.0), e2e_ms: None, percentile: 99.0 };
    let r = plan(slo, BTreeMap::from([("h200_sxm".to_string(), 3.8)]));
    assert_eq!(r.ranked_by, RankBy::CostUsdPerHour);
    let best = &r.evaluated[r.best.expect("a candidate meets the SLOs")];
    assert_eq!(best.gpus, 4);
    assert!(best.candidate.dep.tp >= 2);
    assert!((best.cost_usd_per_hour.unwrap() - 15.2).abs() < 1e-9);
    // 30 req/s x 100 tokens over 4 GPUs.
    assert!((best.output_tokens_per_s_per_gpu - 750.0).abs() < 1e-9);
    assert!(r.closest.is_empty());
}

#[test]
fn frontier_trades_latency_for_throughput_per_gpu() {
    let slo = Slo { ttft_ms: Some(400.0), tpot_ms: None, e2e_ms: None, percentile: 99.0 };
    let r = plan(slo, BTreeMap::new());
    assert_eq!(r.ranked_by, RankBy::Gpus);
    assert!(r.notes[0].contains("no price for h200_sxm"));
    // Along the frontier latency rises and throughput per GPU rises.
    let f: Vec<_> = r.frontier.iter().map(|&i| &r.evaluated[i]).collect();
    assert!(f.len() >= 3);
    for w in f.windows(2) {
        assert!(w[0].outcome.ttft_ms.at_slo < w[1].outcome.ttft_ms.at_slo);
        assert!(w[0].output_tokens_per_s_per_gpu < w[1].output_tokens_per_s_per_gpu);
    }
    // The highest-throughput frontier point is the fewest GPUs that keep up: 4 (load 0.75).
    assert_eq!(f.last().unwrap().gpus, 4);
}

#[test]
fn unmeetable_slo_reports_closest_and_their_misses() {
    // TTFT below the unloaded 100 ms: nobody meets it. Closest: the most GPUs (8: load
    // 0.375, TTFT 160 ms, ratio 1.6).
    let slo = Slo { ttft_ms: Some(100.0), tpot_ms: Some(15.0), e2e_ms: None, percentile: 99.0 };
    let r = plan(slo, BTreeMap::new());
    assert!(r.best.is_none());
    assert_eq!(r.closest.len(), 3);
    let c = &r.evaluated[r.closest[0]];
    assert_eq!(c.gpus, 8);
    assert!((c.slo_ratio - 1.6).abs() < 1e-9, "{}", c.slo_ratio);
    assert_eq!(c.misses.len(), 1);
    assert_eq!(c.misses[0].metric, "ttft");
}

#[test]
fn capacity_finds_the_saturation_rate() {
    // 2 GPUs serve 20 req/s; TTFT <= 400 ms -> load <= 0.75 -> 15 req/s.
    let m = ModelConfig::load("llama-3.1-8b").unwrap();
    let e = SearchSpace { tp: vec![2], max_gpus: 2, ..space() }.enumerate(&m).unwrap();
    let cand = &e.candidates[0];
    let slo = Slo { ttft_ms: Some(400.0), tpot_ms: None, e2e_ms: None, percentile: 99.0 };
    let opts = CapacityOptions::default();
    let r = max_sustainable_rate(&Toy, cand, &workload(1.0), &slo, &opts).unwrap();
    let max = r.max_rate_per_s.unwrap();
    let fail = r.first_failing_rate_per_s.unwrap();
    assert!(max <= 15.0 && max >= 15.0 / (1.0 + opts.rel_tolerance), "{max}");
    assert!(fail > 15.0 && fail / max <= 1.0 + opts.rel_tolerance);
    assert_eq!(r.first_failing().unwrap().misses[0].metric, "ttft");
    assert!(r.curve.windows(2).all(|w| w[0].rate_per_s < w[1].rate_per_s));
    assert!(r.curve.len() >= opts.curve_points);
}

#[test]
fn capacity_below_minimum_rate_is_none() {
    let m = ModelConfig::load("llama-3.1-8b").unwrap();
    let e = SearchSpace { tp: vec![1], max_gpus: 1, ..space() }.enumerate(&m).unwrap();
    // TPOT 20 ms at any load: a 10 ms target is never met.
    let slo = Slo { ttft_ms: None, tpot_ms: Some(10.0), e2e_ms: None, percentile: 99.0 };
    let r = max_sustainable_rate(&Toy, &e.candidates[0], &workload(1.0), &slo, &CapacityOptions::default()).unwrap();
    assert!(r.max_rate_per_s.is_none());
    assert!(r.first_failing_rate_per_s.unwrap() <= 1e-3 * 1.0001);
}

#[test]
fn plots_are_written_as_png_and_svg() {
    let slo = Slo { ttft_ms: Some(400.0), tpot_ms: Some(15.0), e2e_ms: None, percentile: 99.0 };
    let r = plan(slo.clone(), BTreeMap::new());
    let dir = tempfile::tempdir().unwrap();
    let files = kernelsight::plan::plot::frontier_plot(dir.path(), &r).unwrap();
    let png = std::fs::read(&files[0]).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let svg = std::fs::read_to_string(&files[1]).unwrap();
    assert!(svg.contains("Pareto frontier") && svg.contains("SLO 400 ms"), "legend missing");
    let m = ModelConfig::load("llama-3.1-8b").unwrap();
    let e = SearchSpace { tp: vec![2], max_gpus: 2, ..space() }.enumerate(&m).unwrap();
    let cap = max_sustainable_rate(&Toy, &e.candidates[0], &workload(1.0), &slo, &CapacityOptions::default()).unwrap();
    let marks = vec![(cap.max_rate_per_s.unwrap(), "capacity".to_string())];
    let files = kernelsight::plan::plot::load_plot(dir.path(), "load", "toy", &cap.curve, &slo, marks).unwrap();
    assert!(std::fs::read_to_string(&files[1]).unwrap().contains("TTFT"));
    std::fs::copy(&files[0], "/tmp/plan_load.png").ok();
    std::fs::copy(dir.path().join("frontier.png"), "/tmp/plan_frontier.png").ok();
}

/// Counts evaluations, to see which candidates reused another's run.
struct Counting(std::sync::atomic::AtomicUsize);
impl Evaluator for Counting {
    fn evaluate(&self, c: &Candidate, w: &WorkloadSpec, pct: f64) -> anyhow::Result<Outcome> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Toy.evaluate(c, w, pct)
    }
}

#[test]
fn a_seq_limit_that_never_bound_reuses_the_larger_run() {
    // The toy's runs peak at 100 sequences: limit 256 runs, 128 reuses it, 64 runs again.
    let m = ModelConfig::load("llama-3.1-8b").unwrap();
    let s = SearchSpace { max_num_seqs: vec![64, 128, 256], ..space() };
    let enumerated = s.enumerate(&m).unwrap();
    let order = enumerated.candidates.clone();
    let n = order.len();
    let w = workload(30.0);
    let slo = Slo { ttft_ms: Some(400.0), tpot_ms: None, e2e_ms: None, percentile: 99.0 };
    let input = PlanInput { enumerated, workload: &w, slo, prices: BTreeMap::new(), frontier_metric: FrontierMetric::Ttft, closest: 3, stop_early: true };
    let eval = Counting(Default::default());
    let r = run_plan(input, &eval, &ProgressBar::hidden()).unwrap();
    assert_eq!(r.evaluated.len(), n);
    assert_eq!(r.simulations_run, n / 3 * 2);
    assert_eq!(eval.0.load(std::sync::atomic::Ordering::SeqCst), n / 3 * 2);
    // Results keep the enumeration order and each candidate its own limits.
    assert!(r.evaluated.iter().zip(&order).all(|(e, c)| &e.candidate == c));
}

/// Stops every run that misses TTFT, reporting half its latency (a lower bound), as an
/// early-stopping evaluator would; full runs are the toy's.
struct Stopping;
impl Evaluator for Stopping {
    fn evaluate(&self, c: &Candidate, w: &WorkloadSpec, pct: f64) -> anyhow::Result<Outcome> {
        Toy.evaluate(c, w, pct)
    }
    fn evaluate_or_stop(&self, c: &Candidate, w: &WorkloadSpec, pct: f64, stop: Option<kernelsight::plan::evaluate::StopRule>) -> anyhow::Result<Outcome> {
        let mut o = Toy.evaluate(c, w, pct)?;
        let rule = stop.expect("the search passes a stop rule");
        if o.ttft_ms.at_slo > rule.ttft_ms.unwrap() {
            o.stopped_early = true;
            o.ttft_ms = q(o.ttft_ms.at_slo / 2.0);
        }
        Ok(o)
    }
}

#[test]
fn stopped_runs_are_finished_before_being_shown_as_closest_and_stay_off_the_frontier() {
    let m = ModelConfig::load("llama-3.1-8b").unwrap();
    let w = workload(30.0);
    // Unmeetable TTFT: every run stops; the closest must be re-run in full (8 GPUs: 160 ms,
    // ratio 1.6, not the stopped run's 0.8).
    let slo = Slo { ttft_ms: Some(100.0), tpot_ms: None, e2e_ms: None, percentile: 99.0 };
    let input = PlanInput { enumerated: space().enumerate(&m).unwrap(), workload: &w, slo, prices: BTreeMap::new(), frontier_metric: FrontierMetric::Ttft, closest: 3, stop_early: true };
    let r = run_plan(input, &Stopping, &ProgressBar::hidden()).unwrap();
    assert!(r.best.is_none());
    assert!(r.closest.iter().all(|&i| !r.evaluated[i].outcome.stopped_early));
    let c = &r.evaluated[r.closest[0]];
    assert_eq!(c.gpus, 8);
    assert!((c.slo_ratio - 1.6).abs() < 1e-9, "{}", c.slo_ratio);
    assert!(r.frontier.iter().all(|&i| !r.evaluated[i].outcome.stopped_early));
}

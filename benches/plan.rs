//! Planner speed. Runs once: a `plan` search over 558 candidate deployments (3 GPU types x
//! bf16/fp8 x tp 1-8 x 3 max-num-seqs x every replica count up to 16 GPUs) of Llama-3.1-8B,
//! 10,000 ShareGPT-like requests each at 40 req/s, on all cores, and prints its wall time.
//! Then criterion times one candidate's 10,000-request simulation.
//!
//! `cargo bench --bench plan` (add `-- --quick` for a shorter criterion pass). Under `cargo test`
//! it only checks that the search space still builds.

use criterion::Criterion;
use indicatif::ProgressBar;
use kernelsight::hardware::load_gpu;
use kernelsight::model::ModelConfig;
use kernelsight::perf::Tier;
use kernelsight::plan::evaluate::Evaluator;
use kernelsight::plan::search::{run_plan, FrontierMetric, PlanInput};
use kernelsight::plan::sim_eval::SimEvaluator;
use kernelsight::plan::slo::Slo;
use kernelsight::plan::space::SearchSpace;
use kernelsight::schema::Dtype;
use kernelsight::sim::engine::EngineParams;
use kernelsight::sim::router::RouterKind;
use kernelsight::workload::{Arrival, Lengths, Sharing, WorkloadSpec};
use std::time::Instant;

const REQUESTS: u64 = 10_000;

fn setup() -> (ModelConfig, SearchSpace, SimEvaluator, WorkloadSpec, Slo) {
    let model = ModelConfig::load("llama-3.1-8b").expect("embedded model");
    let gpus: Vec<_> = ["h100_sxm", "h200_sxm", "b200_sxm"].iter().map(|g| load_gpu(g).expect("embedded GPU")).collect();
    let engine = EngineParams::load("vllm").expect("embedded engine");
    let workload = WorkloadSpec {
        num_requests: Some(REQUESTS),
        arrival: Arrival::Rate { rate_per_s: 40.0, burstiness: 1.0 },
        lengths: Lengths::ShareGpt,
        sharing: Sharing::None,
        seed: 0,
        trace: None,
    };
    let space = SearchSpace {
        gpus: gpus.clone(),
        dtypes: vec![Dtype::Bf16, Dtype::Fp8],
        kv_dtypes: vec![Dtype::Bf16],
        tp: vec![1, 2, 4, 8],
        pp: vec![1],
        max_num_seqs: vec![64, 128, 256],
        max_num_batched_tokens: vec![engine.max_num_batched_tokens],
        max_gpus: 16,
        disaggregated: false,
        gpu_memory_utilization: engine.gpu_memory_utilization,
        buffers: engine.buffers(),
        min_kv_tokens: 8192,
    };
    let eval = SimEvaluator::new(model.clone(), &gpus, engine, Tier::Roofline, RouterKind::RoundRobin).expect("evaluator");
    let slo = Slo { ttft_ms: Some(500.0), tpot_ms: Some(30.0), e2e_ms: None, percentile: 99.0 };
    (model, space, eval, workload, slo)
}

fn full_search() {
    let (model, space, eval, workload, slo) = setup();
    let enumerated = space.enumerate(&model).expect("enumerate");
    let n = enumerated.candidates.len();
    assert!(n >= 500, "the benchmark must search at least 500 candidates, has {n}");
    let input = PlanInput { enumerated, workload: &workload, slo, prices: Default::default(), frontier_metric: FrontierMetric::Tpot, closest: 5, stop_early: true };
    let (t, cpu0) = (Instant::now(), cpu_seconds());
    let r = run_plan(input, &eval, &ProgressBar::hidden()).expect("plan");
    let s = t.elapsed().as_secs_f64();
    let cpu = cpu_seconds().zip(cpu0).map(|(b, a)| format!("{:.1} s", b - a)).unwrap_or_else(|| "n/a".into());
    println!(
        "plan search: {n} candidates x {REQUESTS} requests ({} simulations run, the rest reused; {} meet the SLOs): {s:.1} s wall, {cpu} CPU, {} threads",
        r.simulations_run,
        r.evaluated.iter().filter(|e| e.meets_slo()).count(),
        rayon::current_num_threads()
    );
}

/// User + system CPU time of this process (Linux /proc), to tell the search's own cost from
/// time lost to other processes on a shared machine.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0) // USER_HZ, fixed at 100 in the /proc ABI
}

fn one_candidate(c: &mut Criterion) {
    let (model, space, eval, workload, slo) = setup();
    let cands = space.enumerate(&model).expect("enumerate").candidates;
    // One H200, bf16, 256 sequences: the busiest single-replica candidate.
    let cand = cands
        .iter()
        .find(|c| c.gpu == "h200_sxm" && c.dep.tp == 1 && c.dep.dp == 1 && c.dep.weight_dtype == Dtype::Bf16 && c.limits.max_num_seqs == 256)
        .expect("candidate");
    c.bench_function("simulate one candidate, 10k requests", |b| b.iter(|| eval.evaluate(cand, &workload, slo.percentile).expect("sim")));
}

fn main() {
    // `cargo test` runs this binary without `--bench` (Cargo.toml: `test = true`) so the bench
    // cannot rot unseen: it then only builds the search space, no simulation.
    if !std::env::args().any(|a| a == "--bench") {
        let (model, space, ..) = setup();
        let n = space.enumerate(&model).expect("enumerate").candidates.len();
        assert!(n >= 500, "the benchmark must search at least 500 candidates, has {n}");
        return;
    }
    full_search();
    let mut c = Criterion::default().configure_from_args().sample_size(10);
    one_candidate(&mut c);
    c.final_summary();
}

//! The simulator-backed evaluator: reuse of runs whose sequence limit never bound, KV
//! transfer time, and disaggregated pools against hand-derived expectations.

use kernelsight::deployment::Deployment;
use kernelsight::hardware::load_gpu;
use kernelsight::model::ModelConfig;
use kernelsight::perf::predictor::Predictor;
use kernelsight::perf::{SeqWork, StepTimeModel, Tier};
use kernelsight::plan::candidate::{Candidate, EngineLimits, PoolSplit};
use kernelsight::plan::evaluate::Evaluator;
use kernelsight::plan::sim_eval::{kv_transfer_s, SimEvaluator};
use kernelsight::sim::engine::EngineParams;
use kernelsight::sim::router::RouterKind;
use kernelsight::workload::{Arrival, Lengths, Sharing, WorkloadSpec};

fn eval() -> SimEvaluator {
    let g = load_gpu("h200_sxm").unwrap();
    SimEvaluator::new(ModelConfig::load("llama-3.1-8b").unwrap(), &[g], EngineParams::load("vllm").unwrap(), Tier::Roofline, RouterKind::RoundRobin).unwrap()
}

fn cand(dp: u64, max_num_seqs: u32, disagg: Option<PoolSplit>) -> Candidate {
    Candidate {
        gpu: "h200_sxm".into(),
        dep: Deployment { dp, ..Deployment::default() },
        limits: EngineLimits { max_num_seqs, max_num_batched_tokens: 8192 },
        disagg,
    }
}

fn workload(rate: f64, n: u64, isl: u32, osl: u32) -> WorkloadSpec {
    WorkloadSpec {
        num_requests: Some(n),
        arrival: Arrival::Rate { rate_per_s: rate, burstiness: 1.0 },
        lengths: Lengths::Fixed { isl, osl },
        sharing: Sharing::None,
        seed: 3,
        trace: None,
    }
}

#[test]
fn a_limit_at_the_peak_gives_the_same_run() {
    let e = eval();
    let w = workload(20.0, 300, 200, 200);
    let big = e.evaluate(&cand(1, 1024, None), &w, 99.0).unwrap();
    assert!(big.peak_running_seqs > 1 && big.peak_running_seqs < 1024, "{}", big.peak_running_seqs);
    let at_peak = e.evaluate(&cand(1, big.peak_running_seqs, None), &w, 99.0).unwrap();
    assert_eq!(big, at_peak);
}

#[test]
fn prefix_caching_off_without_sharing_gives_the_same_run() {
    // The evaluator turns the prefix cache off for workloads that share nothing; the
    // simulator run directly with the engine's default (cache on) must give the same latencies.
    let w = workload(30.0, 400, 300, 150);
    assert!(!kernelsight::plan::sim_eval::shares_prefixes(&w));
    let off = eval().evaluate(&cand(1, 256, None), &w, 99.0).unwrap();
    let mut on_engine = EngineParams::load("vllm").unwrap();
    assert!(on_engine.prefix_caching);
    on_engine.max_num_seqs = 256;
    let g = load_gpu("h200_sxm").unwrap();
    let m = ModelConfig::load("llama-3.1-8b").unwrap();
    let e = eval();
    let plan = kernelsight::kernels::memory::plan(&m, &g, &Deployment::default(), on_engine.gpu_memory_utilization, 8192, on_engine.buffers()).unwrap();
    let blocks = (plan.kv_capacity_tokens / on_engine.block_size as u64) as u32;
    // The evaluator's construction: the engine's graphs and launch terms, the same host.
    let km = kernelsight::perf::efficiency::KernelModel::load(&g, Tier::Roofline).unwrap();
    let pred = Predictor::for_engine(&m, &g, &Deployment::default(), km, &on_engine, e.host.clone(), blocks as u64 * on_engine.block_size as u64).unwrap();
    let cfg = kernelsight::sim::SimConfig {
        num_gpu_blocks: blocks,
        engine: on_engine,
        kv_layout: Default::default(),
        max_model_len: m.max_context as u32,
        dp: 1,
        pp: 1,
        router: RouterKind::RoundRobin,
        slo_ttft_ms: None,
        slo_tpot_ms: None,
    };
    let out = kernelsight::sim::run(&cfg, &pred, w.build().unwrap().as_mut(), None, &mut kernelsight::sim::record::NoObserver).unwrap();
    assert_eq!(out.rec.completed, off.requests);
    assert_eq!(out.rec.ttft_us.quantile(0.99) * 1e-3, off.ttft_ms.p99);
    assert_eq!(out.rec.tpot_us.quantile(0.5) * 1e-3, off.tpot_ms.p50);
    assert_eq!(out.rec.e2e_us.quantile(0.9) * 1e-3, off.e2e_ms.p90);
}

#[test]
fn kv_transfer_uses_nvlink_inside_a_node_and_the_network_across() {
    let m = ModelConfig::load("llama-3.1-8b").unwrap();
    let g = load_gpu("h200_sxm").unwrap();
    // 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes = 131,072 bytes per token.
    let bytes = 1000.0 * 131072.0;
    let split = Some(PoolSplit { prefill_replicas: 1, decode_replicas: 1 });
    let inside = kv_transfer_s(&m, &cand(2, 256, split), &g, 1000);
    assert!((inside - bytes / (g.interconnect.scaleup_gbps_per_dir * 1e9)).abs() < 1e-12);
    let split = Some(PoolSplit { prefill_replicas: 4, decode_replicas: 6 });
    let across = kv_transfer_s(&m, &cand(10, 256, split), &g, 1000);
    assert!((across - bytes / (g.interconnect.scaleout_gbps_per_dir * 1e9)).abs() < 1e-12);
}

#[test]
fn disaggregated_ttft_adds_the_transfer_and_one_decode_step() {
    // Requests 10 s apart never overlap, so every request sees an idle system:
    // colocated TTFT = one 1000-token prefill step; disaggregated TTFT = the same prefill
    // step + KV transfer + the decode pool's first step (one token at 999 cached tokens); both
    // plus the request path.
    let e = eval();
    let w = workload(0.1, 20, 1000, 50);
    let colo = e.evaluate(&cand(2, 256, None), &w, 50.0).unwrap();
    let split = Some(PoolSplit { prefill_replicas: 1, decode_replicas: 1 });
    let dis = e.evaluate(&cand(2, 256, split), &w, 50.0).unwrap();
    let g = load_gpu("h200_sxm").unwrap();
    let pred = Predictor::new(&e.model, &g, &Deployment::default(), Tier::Roofline).unwrap().with_host_overhead(e.host.clone());
    let prefill_ms = pred.step_time(&[SeqWork { new_tokens: 1000, cached_tokens: 0 }]).total_us * 1e-3;
    let decode_ms = pred.step_time(&[SeqWork { new_tokens: 1, cached_tokens: 999 }]).total_us * 1e-3;
    let transfer_ms = kv_transfer_s(&e.model, &cand(2, 256, split), &g, 1000) * 1e3;
    // Either way the answer travels the client <-> engine path once, and each idle engine the
    // request reaches wakes up first (the decode pool's too, when the KV arrives).
    let path_ms = pred.request_path_us() * 1e-3;
    let wake_ms = pred.idle_wake_us() * 1e-3;
    assert!(path_ms > 0.0 && wake_ms > 0.0);
    assert!((colo.ttft_ms.p50 / (wake_ms + prefill_ms + path_ms) - 1.0).abs() < 0.01, "{} vs {wake_ms} + {prefill_ms} + {path_ms}", colo.ttft_ms.p50);
    let expected = wake_ms + prefill_ms + transfer_ms + wake_ms + decode_ms + path_ms;
    assert!((dis.ttft_ms.p50 / expected - 1.0).abs() < 0.01, "{} vs {expected}", dis.ttft_ms.p50);
    // Decoding alone in both cases: the same time per token.
    assert!((dis.tpot_ms.p50 / colo.tpot_ms.p50 - 1.0).abs() < 0.01, "{} vs {}", dis.tpot_ms.p50, colo.tpot_ms.p50);
    assert_eq!(dis.requests, 20);
}

#[test]
fn an_overloaded_run_stops_early_and_a_healthy_one_does_not() {
    use kernelsight::plan::evaluate::StopRule;
    use kernelsight::plan::slo::Slo;
    let e = eval();
    let slo = Slo { ttft_ms: Some(500.0), tpot_ms: None, e2e_ms: None, percentile: 99.0 };
    let rule = StopRule::new(&slo, 400);
    // 200 req/s of 2000-token prompts is far beyond one H200: the queue grows without bound.
    let hot = workload(200.0, 400, 2000, 200);
    let stopped = e.evaluate_or_stop(&cand(1, 256, None), &hot, 99.0, rule).unwrap();
    assert!(stopped.stopped_early && stopped.requests < 400, "{} requests", stopped.requests);
    let full = e.evaluate(&cand(1, 256, None), &hot, 99.0).unwrap();
    assert!(!full.stopped_early && full.requests == 400 && full.ttft_ms.p99 > 500.0);
    // At 1 req/s nothing is missed: the run is the full one.
    let calm = workload(1.0, 100, 200, 100);
    let a = e.evaluate_or_stop(&cand(1, 256, None), &calm, 99.0, StopRule::new(&slo, 100)).unwrap();
    assert_eq!(a, e.evaluate(&cand(1, 256, None), &calm, 99.0).unwrap());
}

#[test]
fn the_evaluator_runs_each_engine_as_simulate_does() {
    // `plan` and `capacity` must price a step as `simulate` does for every engine: its kernel
    // libraries, unfused ops, launches, CUDA-graph padding and captures, eager cuDNN plans
    // (they once kept only the library table: hf-cudagraph's TPOT came out 5x too fast).
    use clap::Parser;
    use kernelsight::cli::simulate::{execute, SimulateArgs};
    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        args: SimulateArgs,
    }
    let g = load_gpu("h200_sxm").unwrap();
    let m = ModelConfig::load("llama-3.2-3b").unwrap();
    let w = WorkloadSpec { lengths: Lengths::Uniform { isl: 400, osl: 40, range_ratio: 0.5 }, ..workload(4.0, 60, 0, 0) };
    let mut tpot_p50_ms = Vec::new();
    for engine in ["vllm", "sglang", "trtllm", "hf", "hf-cudagraph"] {
        let params = EngineParams::load(engine).unwrap();
        let limits = EngineLimits { max_num_seqs: params.max_num_seqs, max_num_batched_tokens: params.max_num_batched_tokens };
        let e = SimEvaluator::new(m.clone(), std::slice::from_ref(&g), params, Tier::Target, RouterKind::RoundRobin).unwrap();
        let c = Candidate { gpu: "h200_sxm".into(), dep: Deployment::default(), limits, disagg: None };
        let got = e.evaluate(&c, &w, 90.0).unwrap();
        let argv = ["simulate", "--quiet", "--model", "llama-3.2-3b", "--gpu", "h200_sxm", "--engine", engine, "--workload", "uniform",
            "--isl", "400", "--osl", "40", "--range-ratio", "0.5", "--rate", "4", "--num-requests", "60", "--seed", "3"];
        let sim = execute(&Cmd::try_parse_from(argv).unwrap().args).unwrap().summary;
        assert_eq!(got.requests, 60, "{engine}");
        for (what, a, b) in [("TTFT p90", got.ttft_ms.p90, sim.ttft_ms.p90), ("TPOT p50", got.tpot_ms.p50, sim.tpot_ms.p50), ("E2E p99", got.e2e_ms.p99, sim.e2e_ms.p99)] {
            assert!((a / b - 1.0).abs() < 1e-9, "{engine} {what}: evaluator {a} ms, simulate {b} ms");
        }
        tpot_p50_ms.push(got.tpot_ms.p50);
    }
    // The engines differ (transformers' padded attention is several times vLLM's step).
    assert!(tpot_p50_ms[4] > 3.0 * tpot_p50_ms[0], "{tpot_p50_ms:?}");
}

#[test]
fn a_run_shorter_than_its_latency_or_above_the_service_rate_is_overloaded() {
    // vLLM on one H200 serves roughly 30-100 requests/s of 512/128 tokens. 120 requests at
    // 1,000/s arrive in 0.12 s, far less than one request's latency: not a sustained rate,
    // whatever its percentiles say. At 5/s over 24 s the engine keeps up.
    let e = eval();
    let burst = e.evaluate(&cand(1, 1024, None), &workload(1000.0, 120, 512, 128), 90.0).unwrap();
    assert!(burst.overloaded(), "served {}", burst.served_fraction);
    assert!(burst.overload_note().unwrap().contains("falls behind"));
    let steady = e.evaluate(&cand(1, 1024, None), &workload(5.0, 120, 512, 128), 90.0).unwrap();
    assert!(!steady.overloaded(), "served {}", steady.served_fraction);
}

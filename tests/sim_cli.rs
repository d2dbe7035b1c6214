//! `kernelsight simulate` end to end: the real predictor and memory plan, JSON/CSV/plot/trace
//! outputs, determinism, and bad input.
use clap::Parser;
use kernelsight::cli::simulate::{execute, Report, SimulateArgs};
use kernelsight::perf::{SeqWork, StepTimeModel};
use std::path::Path;

#[derive(Parser)]
struct Cmd {
    #[command(flatten)]
    args: SimulateArgs,
}

#[derive(Parser)]
struct Wl {
    #[command(flatten)]
    w: kernelsight::cli::workload::WorkloadArgs,
}

fn args(extra: &[&str]) -> SimulateArgs {
    let mut v = vec!["simulate", "--quiet"];
    v.extend_from_slice(extra);
    Cmd::try_parse_from(v).unwrap().args
}

fn sim(extra: &[&str]) -> Report {
    execute(&args(extra)).unwrap()
}

fn sim_err(extra: &[&str]) -> String {
    match Cmd::try_parse_from([&["simulate", "--quiet"], extra].concat()) {
        Err(e) => e.to_string(),
        Ok(c) => match execute(&c.args) {
            Err(e) => format!("{e:#}"),
            Ok(_) => panic!("{extra:?} was accepted"),
        },
    }
}

#[test]
fn json_summary_has_the_promised_fields() {
    let r = sim(&["--num-requests", "200"]);
    let j = r.json();
    for k in ["num_requests", "completed", "duration_s", "throughput_tok_s"] {
        assert!(j[k].is_number(), "{k}");
    }
    for k in ["ttft_ms", "tpot_ms"] {
        for p in ["mean", "p50", "p90", "p99"] {
            assert!(j[k][p].as_f64().unwrap() > 0.0, "{k}.{p}");
        }
    }
    assert_eq!(j["num_requests"], 200);
    assert_eq!(j["completed"], 200);
    assert!(j["tpot_definition"].as_str().unwrap().contains("(E2E - TTFT) / (output tokens - 1)"));
    // The default tier is target: h200_sxm has its own measurements; experts see uniform routing.
    assert_eq!(j["tier"], "target");
    assert_eq!(j["moe_routing"], "uniform");
    // The summary says which tier was asked for and which ran.
    let j = sim(&["--num-requests", "20", "--tier", "cross-gen"]).json();
    assert_eq!(j["tier_requested"], "cross-gen");
    // The H200's GEMMs are capped at the power-limit rate: cross-gen takes the H100's (same die).
    assert_eq!(j["sustained_gemm"]["bf16_tflops"], 685.7);
    assert!(j["sustained_gemm"]["source"].as_str().unwrap().contains("h100_sxm"));
    // ... and the H100's relief with idle time (serving-sized steps, measured there only).
    let most_idle = j["sustained_gemm"]["bf16_tflops_most_idle"].as_f64().unwrap();
    assert!(most_idle > 1.05 * 685.7 && most_idle < 1.2 * 685.7, "{most_idle}");
    assert!(sim(&["--num-requests", "20", "--tier", "roofline"]).json()["sustained_gemm"].is_null());
    assert_eq!(j["tier"], j["timing_model"].as_str().unwrap().split(' ').next().unwrap());
    // Output tokens over the duration, by definition.
    let tput = j["output_tokens"].as_f64().unwrap() / j["duration_s"].as_f64().unwrap();
    assert!((j["throughput_tok_s"].as_f64().unwrap() - tput).abs() < 1e-6 * tput);
}

#[test]
fn light_load_ttft_is_the_prefill_step_time_plus_the_request_path() {
    // Requests 100 s apart on average: each finds the engine idle.
    let r = sim(&["--isl", "512", "--osl", "8", "--rate", "0.01", "--num-requests", "20"]);
    let prefill_ms = r.scenario.predictor.step_time(&[SeqWork { new_tokens: 512, cached_tokens: 0 }]).total_us / 1e3;
    // Plus the client <-> engine path of the engine's host model (vLLM's: 1.9 ms) and the idle
    // engine's wake-up (0.6 ms).
    let path_ms = r.scenario.predictor.request_path_us() / 1e3 + r.scenario.predictor.idle_wake_us() / 1e3;
    assert!(path_ms > 1.0, "{path_ms}");
    let t = r.summary.ttft_ms;
    for v in [t.mean, t.p50, t.p99, t.max] {
        assert!((v - prefill_ms - path_ms).abs() < 1e-9 * prefill_ms, "{v} vs {prefill_ms} + {path_ms}");
    }
    // Queued only while the idle engine wakes.
    assert!((r.summary.queue_ms.max - r.scenario.predictor.idle_wake_us() / 1e3).abs() < 1e-9, "{}", r.summary.queue_ms.max);
    // Under heavy load the same requests wait: TTFT grows well past one prefill.
    let busy = sim(&["--isl", "512", "--osl", "8", "--rate", "inf", "--num-requests", "500"]);
    assert!(busy.summary.ttft_ms.p90 > 5.0 * prefill_ms);
}

fn read(dir: &Path, f: &str) -> Vec<u8> {
    std::fs::read(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"))
}

#[test]
fn same_seed_gives_byte_identical_outputs_and_all_files_are_written() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, c) = (tmp.path().join("a"), tmp.path().join("b"), tmp.path().join("c"));
    let run = |d: &Path, seed: &str| sim(&["--num-requests", "300", "--seed", seed, "--trace-max-steps", "10", "--out", d.to_str().unwrap()]);
    run(&a, "3");
    run(&b, "3");
    run(&c, "4");
    for f in ["requests.csv", "summary.json", "trace.json"] {
        assert_eq!(read(&a, f), read(&b, f), "{f} differs between identical runs");
    }
    assert_ne!(read(&a, "requests.csv"), read(&c, "requests.csv"));
    for p in ["latency_cdf", "timeline", "kernel_breakdown"] {
        assert!(read(&a, &format!("{p}.png")).starts_with(b"\x89PNG"), "{p}.png");
        assert!(String::from_utf8(read(&a, &format!("{p}.svg"))).unwrap().contains("<svg"), "{p}.svg");
    }
    let csv = String::from_utf8(read(&a, "requests.csv")).unwrap();
    assert_eq!(csv.lines().count(), 301);
    let trace: serde_json::Value = serde_json::from_slice(&read(&a, "trace.json")).unwrap();
    let steps = trace["traceEvents"].as_array().unwrap().iter().filter(|e| e["name"] == "step").count();
    assert_eq!(steps, 10, "trace capped at --trace-max-steps");
}

#[test]
fn generated_workload_replayed_as_a_trace_gives_the_same_run() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("w.csv");
    let flags = ["--num-requests", "150", "--rate", "30", "--prefix-groups", "3", "--prefix-tokens", "256", "--seed", "9"];
    let spec = Wl::try_parse_from([&["x"][..], &flags[..]].concat()).unwrap().w.to_spec(1.0).unwrap();
    let mut f = std::fs::File::create(&path).unwrap();
    kernelsight::workload::trace::write_csv(spec.build().unwrap().as_mut(), &mut f).unwrap();
    let synthetic = sim(&flags);
    let replay = sim(&["--trace", path.to_str().unwrap()]);
    let strip = |r: &Report| {
        let mut j = r.json();
        j.as_object_mut().unwrap().remove("setup");
        j
    };
    assert_eq!(strip(&synthetic), strip(&replay));
    assert!(synthetic.summary.prefix_cache_hit_rate > 0.5, "shared 256-token prefixes hit");
}

#[test]
fn impossible_requests_are_counted_not_hung() {
    let r = sim(&["--num-requests", "300", "--max-model-len", "300"]);
    let rej = r.summary.rejected_by_reason.get("exceeds_context").copied().unwrap_or(0);
    assert!(rej > 0);
    assert_eq!(r.summary.completed + r.summary.rejected, 300);
    assert!(r.summary.rejected_limits["exceeds_context"].contains("max_model_len 300"), "{:?}", r.summary.rejected_limits);
    let text = kernelsight::report::terminal::render(&[], &r.summary);
    assert!(text.contains("rejected exceeds_context: prompt + output tokens above max_model_len 300"), "{text}");
    // When nothing can be served the run is an error naming the limit, not a report of zeros.
    let e = sim_err(&["--num-requests", "50", "--num-gpu-blocks", "20", "--isl", "200", "--osl", "200"]);
    assert!(e.contains("every request was rejected") && e.contains("50 exceeds_kv_cache") && e.contains("20 blocks of 16 tokens"), "{e}");
    let e = sim_err(&["--isl", "200000", "--osl", "10", "--concurrency", "1", "--num-requests", "2"]);
    assert!(e.contains("2 exceeds_context (prompt + output tokens above max_model_len 131072)"), "{e}");
}

#[test]
fn engines_and_parallel_layouts_complete_the_workload() {
    for extra in [
        &["--engine", "sglang"][..],
        &["--engine", "static"],
        &["--dp", "2", "--router", "least-loaded"],
        &["--tp", "2", "--pp", "2"],
        &["--turns", "3", "--think-time-s", "2"],
        &["--concurrency", "16"],
        &["--chunked-prefill", "false", "--prefix-caching", "false"],
    ] {
        let r = sim(&[&["--num-requests", "120"][..], extra].concat());
        assert_eq!(r.summary.completed, 120, "{extra:?}");
    }
}

#[test]
fn tight_kv_cache_preempts_and_reports_it() {
    let r = sim(&["--num-requests", "200", "--rate", "inf", "--num-gpu-blocks", "400", "--prefix-caching", "false"]);
    assert!(r.summary.preemptions > 0);
    assert_eq!(r.summary.completed, 200);
    assert!(r.summary.kv.peak_util <= 1.0 && r.summary.kv.peak_util > 0.9);
}

#[test]
fn bad_input_gets_clear_errors() {
    for (flags, want) in [
        (&["--rate", "0"][..], "--rate must be a positive"),
        (&["--rate", "-3"], "--rate must be a positive"),
        (&["--num-requests", "0"], "--num-requests must be a positive integer"),
        (&["--max-num-seqs", "-1"], "--max-num-seqs must be a positive integer"),
        (&["--block-size", "0"], "--block-size must be a positive integer"),
        (&["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be in (0, 1]"),
        (&["--concurrency", "4", "--turns", "2"], "multi-turn"),
        (&["--engine", "nope"], "unknown engine 'nope'"),
        (&["--slo-ttft-ms", "-5"], "--slo-ttft-ms must be a positive"),
        (&["--isl", "-2", "--osl", "5"], "--isl must be a positive integer"),
        (&["--kernel-backend", "moe"], "expected OP=PREFIX"),
        (&["--kernel-backend", "moe="], "at least one library prefix"),
        (&["--kernel-backend", "mooe=vllm/marlin"], "mooe"),
        (&["--kernel-backend", "gemm=no_such_library"], "allowed: "),
    ] {
        let e = sim_err(flags);
        assert!(e.contains(want), "{flags:?}: {e}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("t.csv");
    std::fs::write(&p, "arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,-10,5\n").unwrap();
    let e = sim_err(&["--trace", p.to_str().unwrap()]);
    assert!(e.contains("line 3"), "{e}");
}

#[test]
fn memory_the_engine_would_run_out_of_is_an_error_with_the_numbers() {
    // More KV blocks pinned than memory holds after weights and activations.
    let e = sim_err(&["--model", "llama-3.1-8b", "--gpu", "h100_sxm", "--num-gpu-blocks", "40000", "--num-requests", "5"]);
    assert!(e.contains("--num-gpu-blocks 40000") && e.contains("holds at most") && e.contains("GiB weights"), "{e}");
    // gpt-oss-20b under transformers with CUDA graphs: its eager sink attention materialises
    // heads x 8,192 x 16,384 scores several times (112 GiB peak measured on the H200, OOM on
    // an 80 GB H100: calibration/traces/h100_sxm_blind36).
    let gptoss = ["--model", "gpt-oss-20b", "--engine", "hf-cudagraph", "--num-gpu-blocks", "768", "--num-requests", "5", "--isl", "64", "--osl", "4"];
    let e = sim_err(&[&gptoss[..], &["--gpu", "h100_sxm"]].concat());
    assert!(e.contains("does not fit on h100_sxm") && e.contains("attention scores"), "{e}");
    let r = sim(&[&gptoss[..], &["--gpu", "h200_sxm"]].concat());
    assert_eq!(r.summary.completed, 5);
    // What the plan does not follow is said beside it: each captured shape's scores stay in
    // the graph pools (calibration/traces/h100_sxm_memory47b).
    assert!(r.scenario.setup.iter().any(|l| l.starts_with("note: memory:") && l.contains("private pools")), "{:?}", r.scenario.setup);
    // --json reports the plan: 2.9 score tensors of 64 heads x 8,192 x 16,384 plus two masks,
    // and the masks over the cache: two types of 8,192 bf16 rows, and the graph warm-up's
    // 1.46 more, per page slot of each of the two KV groups.
    let mem = &r.json()["memory"];
    assert_eq!(mem["step_attention_bytes_per_gpu"].as_f64(), Some((2.0 + 2.9 * 64.0) * 8192.0 * 16384.0 * 2.0));
    assert_eq!(mem["mask_bytes_per_kv_token_per_gpu"].as_f64(), Some((2.0 + 1.46) * 8192.0 * 2.0 * 2.0));
    assert!(mem["activation_bytes_per_gpu"].as_f64().unwrap() > mem["step_attention_bytes_per_gpu"].as_f64().unwrap());
    // The same model under vLLM (paged kernels, no materialised scores) fits the H100.
    let r = sim(&["--model", "gpt-oss-20b", "--gpu", "h100_sxm", "--num-requests", "5", "--isl", "64", "--osl", "4"]);
    assert_eq!(r.summary.completed, 5);
    assert!(!r.scenario.setup.iter().any(|l| l.starts_with("note: memory:")), "{:?}", r.scenario.setup);
}

/// Step time of one fresh `tokens`-token prefill in the scenario `args` sets up.
fn prefill_step(args: &[&str], tokens: u32) -> kernelsight::perf::StepCost {
    sim(args).scenario.predictor.step_time(&[SeqWork { new_tokens: tokens, cached_tokens: 0 }])
}

fn prefill_step_us(args: &[&str], tokens: u32) -> f64 {
    prefill_step(args, tokens).total_us
}

#[test]
fn kernel_backend_flag_picks_the_library_an_engine_runs() {
    // gpt-oss-120b on H200 TP8: vLLM's profile times the experts with the Triton matmul_ogs
    // kernel; VLLM_MXFP4_USE_MARLIN=1 (InferenceX's recipe) swaps in Marlin, which the H200
    // measures 2.3x slower than Triton at 8192 tokens (1,321 vs 572 us per layer).
    let base = ["--model", "gpt-oss-120b", "--gpu", "h200_sxm", "--tp", "8", "--dtype", "fp4", "--isl", "8192", "--osl", "2", "--rate", "0.01", "--num-requests", "2"];
    let triton = prefill_step_us(&base, 8192);
    let marlin = prefill_step_us(&[&base[..], &["--kernel-backend", "moe=vllm/w4a16_mxfp4/vllm_gptossmxfp4moe_marlin"]].concat(), 8192);
    assert!(marlin > 1.05 * triton, "Marlin {marlin} us vs Triton {triton} us");
}

#[test]
fn moe_routing_flag_prices_the_busiest_expert_shard_in_the_simulation() {
    // Qwen3-30B-A3B over 8 GPUs with expert parallelism: skewed routing puts more than an
    // eighth of a prefill's assignments on the busiest GPU, whose experts the step waits for.
    let base = ["--model", "qwen3-30b-a3b", "--gpu", "h200_sxm", "--tp", "8", "--ep", "8", "--isl", "4096", "--osl", "2", "--rate", "0.01", "--num-requests", "2"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> { [&base[..], extra].concat() };
    // The experts' GPU time: vLLM's host launches (48 layers without CUDA graphs at 4,096
    // tokens) can hide the difference in the step's wall time.
    let uniform = prefill_step(&base, 4096).moe_us;
    assert_eq!(uniform, prefill_step(&with(&["--moe-routing", "uniform"]), 4096).moe_us);
    let skewed = prefill_step(&with(&["--moe-routing", "power_law_1.01"]), 4096).moe_us;
    assert_eq!(sim(&with(&["--moe-routing", "power_law_1.01"])).json()["moe_routing"], "power_law_1.01");
    assert!(skewed > 1.02 * uniform, "power-law {skewed} us vs uniform {uniform} us");
    let err = sim_err(&["--moe-routing", "power_law_11"]);
    assert!(err.contains("power_law_11") && err.contains("alpha in [0, 10]"), "{err}");
}

#[test]
fn a_slower_host_slows_a_host_bound_model_and_barely_a_gpu_bound_one() {
    let tpot = |model: &str, scale: &str| {
        sim(&["--model", model, "--num-requests", "64", "--concurrency", "8", "--workload", "fixed", "--isl", "256", "--osl", "64", "--host-scale", scale]).json()["tpot_ms"]["p50"]
            .as_f64()
            .unwrap()
    };
    // Qwen3-0.6B's steps are mostly vLLM's host work (1.6 ms per decode step, prompt steps'
    // launches); Qwen3-32B's mostly GPU work on one H200.
    let (small, small_slow) = (tpot("qwen3-0.6b", "1"), tpot("qwen3-0.6b", "1.5"));
    let (big, big_slow) = (tpot("qwen3-32b", "1"), tpot("qwen3-32b", "1.5"));
    assert!(small_slow / small > 1.2, "qwen3-0.6b {small} -> {small_slow}");
    assert!(big_slow / big < 1.1 && big_slow > big, "qwen3-32b {big} -> {big_slow}");
    for bad in ["0", "-2", "nan"] {
        assert!(sim_err(&["--num-requests", "4", "--host-scale", bad]).contains("--host-scale"), "{bad}");
    }
}

#[test]
fn a_host_probe_scales_the_host_model_by_its_median_reading_over_the_reference() {
    let reference = kernelsight::perf::host::HostOverhead::for_engine("vllm").unwrap().probe_python_loop_ns.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Three readings of a host 1.5x slower than the reference machines (median 1.5 x reference).
    let readings: Vec<String> = [1.2, 1.5, 2.0].iter().map(|f| format!("{{\"python_loop_ns\": {}}}", f * reference)).collect();
    let probe = dir.path().join("probe.json");
    std::fs::write(&probe, format!("[{}]", readings.join(","))).unwrap();
    let probe = probe.to_str().unwrap();
    let base = ["--model", "qwen3-0.6b", "--num-requests", "32", "--concurrency", "8", "--workload", "fixed", "--isl", "256", "--osl", "32"];
    let with = |extra: &[&str]| sim(&[&base[..], extra].concat()).json()["tpot_ms"]["p50"].as_f64().unwrap();
    let probed = with(&["--host-probe", probe]);
    assert!((probed - with(&["--host-scale", "1.5"])).abs() < 1e-6, "{probed}");
    assert!(probed > with(&[]) * 1.2);
    // One speed or the other, and only for an engine whose host model records a reference.
    assert!(sim_err(&["--num-requests", "4", "--host-probe", probe, "--host-scale", "2"]).contains("cannot be used with"));
    let e = sim_err(&["--num-requests", "4", "--engine", "sglang", "--host-probe", probe]);
    assert!(e.contains("probe_python_loop_ns") && e.contains("--host-scale"), "{e}");
}

#[test]
fn a_host_probe_moves_only_the_graph_captures_of_the_transformers_engine() {
    let host = kernelsight::perf::host::HostOverhead::for_engine("hf-cudagraph").unwrap();
    let reference = host.probe_python_loop_ns.expect("the shipped file records its probe reference");
    assert!(host.capture_probe_exponent.is_some_and(|e| e > 0.0 && e < 1.0), "{:?}", host.capture_probe_exponent);
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("probe.json");
    // A host whose probe reads twice as fast as the reference.
    std::fs::write(&probe, format!("{{\"python_loop_ns\": {}}}", reference / 2.0)).unwrap();
    let base = ["--engine", "hf-cudagraph", "--model", "llama-3.2-3b", "--workload", "fixed", "--isl", "128", "--osl", "32", "--concurrency", "1", "--num-requests", "4"];
    let plain = sim(&base).json();
    let probed = sim(&[&base[..], &["--host-probe", probe.to_str().unwrap()]].concat()).json();
    let ms = |j: &serde_json::Value, metric: &str, q: &str| j[metric][q].as_f64().unwrap();
    // One client: the first request's prompt captures the graph of its shape, the later ones replay it.
    assert!(ms(&probed, "ttft_ms", "max") < ms(&plain, "ttft_ms", "max"));
    assert!(ms(&probed, "ttft_ms", "max") > ms(&plain, "ttft_ms", "p50"), "a capture still costs something");
    // Replayed steps keep their host terms (to rounding: a request's times are sums of steps).
    let same = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b;
    assert!(same(ms(&probed, "ttft_ms", "p50"), ms(&plain, "ttft_ms", "p50")));
    assert!(same(ms(&probed, "tpot_ms", "p50"), ms(&plain, "tpot_ms", "p50")));
}

#[test]
fn trtllm_serves_an_fp8_checkpoint_with_its_fp8_kv_cache() {
    use kernelsight::schema::Dtype;
    let base = ["--model", "qwen3-32b", "--gpu", "h100_sxm", "--dtype", "fp8", "--num-requests", "4", "--isl", "128", "--osl", "4"];
    let capacity = |extra: &[&str]| {
        let r = sim(&[&base[..], extra].concat());
        (r.scenario.dep.kv_dtype, r.scenario.memory.kv_capacity_tokens)
    };
    // TensorRT-LLM's KvCacheConfig.dtype = "auto" takes a ModelOpt FP8 checkpoint's FP8 KV
    // cache: half the bytes per token, twice the tokens in the same budget.
    let (trt_kv, trt_tokens) = capacity(&["--engine", "trtllm"]);
    let (vllm_kv, vllm_tokens) = capacity(&["--engine", "vllm"]);
    assert_eq!((trt_kv, vllm_kv), (Dtype::Fp8, Dtype::Bf16));
    let ratio = trt_tokens as f64 / vllm_tokens as f64;
    assert!((ratio - 2.0).abs() < 0.15, "trtllm {trt_tokens} vs vllm {vllm_tokens} tokens");
    // --kv-dtype wins over the engine's default; 16-bit weights keep a 16-bit cache.
    assert_eq!(capacity(&["--engine", "trtllm", "--kv-dtype", "bf16"]).0, Dtype::Bf16);
    let r = sim(&["--model", "llama-3.1-8b", "--gpu", "h100_sxm", "--engine", "trtllm", "--num-requests", "4", "--isl", "128", "--osl", "4"]);
    assert_eq!(r.scenario.dep.kv_dtype, Dtype::Bf16);
}

/// Every shipped engine profile is named in `simulate --help`, so a user can find it.
#[test]
fn simulate_help_names_every_shipped_engine() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kernelsight")).args(["simulate", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for name in kernelsight::sim::engine::builtin_engines() {
        assert!(help.contains(&name), "engine '{name}' missing from simulate --help");
    }
}

#[test]
fn transformers_engines_size_their_own_cache_and_say_when_the_warm_up_will_not_fit() {
    // Without --num-gpu-blocks, the hf engines take the pool transformers' memory handler would
    // (calibration/traces/h100_sxm_selfsize48: llama-3.2-3b took 1,953 pages on an H100).
    let base = ["--model", "llama-3.2-3b", "--gpu", "h100_sxm", "--num-requests", "5", "--isl", "64", "--osl", "4"];
    let eager = sim(&[&base[..], &["--engine", "hf"]].concat());
    let kv = eager.scenario.setup.iter().find(|l| l.starts_with("KV cache")).unwrap();
    assert!(kv.contains("sized as transformers sizes it"), "{kv}");
    // Within 2.5 % of the 1,953 pages measured (the spec sheet's 80 GiB is 0.8 above the device's).
    assert!(eager.scenario.cfg.num_gpu_blocks > 1953 && (eager.scenario.cfg.num_gpu_blocks as f64) < 1953.0 * 1.025, "{kv}");
    assert!(!eager.scenario.setup.iter().any(|l| l.contains("warm-up step needs")), "{:?}", eager.scenario.setup);
    // The same pool with CUDA graphs: the warm-up's mask copies do not fit, as measured.
    let graphs = sim(&[&base[..], &["--engine", "hf-cudagraph"]].concat());
    assert!(graphs.scenario.setup.iter().any(|l| l.starts_with("note: memory:") && l.contains("Failed to warm up")), "{:?}", graphs.scenario.setup);
    // Pinned pages stay pinned; vLLM keeps the plan's pool.
    let pinned = sim(&[&base[..], &["--engine", "hf", "--num-gpu-blocks", "192"]].concat());
    assert!(pinned.scenario.setup.iter().any(|l| l.contains("192 blocks") && l.contains("pinned")), "{:?}", pinned.scenario.setup);
    let vllm = sim(&base);
    assert!(vllm.scenario.setup.iter().any(|l| l.contains("derived from memory")), "{:?}", vllm.scenario.setup);
}

//! `plan` and `capacity` from the command line: answers, JSON, plots and bad input.

use std::process::Command;

fn ks(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kernelsight")).args(args).output().expect("run kernelsight");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A small search: one GPU type, tp 1-2, up to 2 GPUs, 150 requests.
const SMALL: &[&str] = &["plan", "--model", "llama-3.1-8b", "--gpus", "h200_sxm", "--dtype", "bf16", "--tp", "1,2", "--max-gpus", "2", "--max-num-seqs", "256", "--num-requests", "150", "--workload", "fixed", "--isl", "200", "--osl", "100"];

fn small(extra: &[&str]) -> (bool, String, String) {
    let mut a = SMALL.to_vec();
    a.extend_from_slice(extra);
    ks(&a)
}

#[test]
fn plan_json_names_the_cheapest_deployment_and_frontier() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let (ok, stdout, stderr) = small(&["--rate", "2", "--slo-ttft-ms", "2000", "--slo-tpot-ms", "100", "--json", "--out", out]);
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["met_slo"], true);
    // tp1 x1, tp1 x2, tp2 x1 evaluated; at 2 req/s one GPU is enough and cheapest.
    assert_eq!(v["candidates_evaluated"], 3);
    assert_eq!(v["chosen"]["gpus"], 1);
    assert!((v["chosen"]["cost_usd_per_hour"].as_f64().unwrap() - 3.8).abs() < 1e-9);
    assert!(v["chosen"]["outcome"]["predicted_by"].as_str().unwrap().contains("roofline"));
    assert!(!v["frontier"].as_array().unwrap().is_empty());
    for f in ["frontier.png", "frontier.svg", "latency_vs_load.png", "latency_vs_load.svg", "plan.json"] {
        assert!(dir.path().join(f).is_file(), "{f} missing");
    }
}

#[test]
fn unmeetable_slo_says_so_and_shows_what_each_misses() {
    // 0.01 ms TTFT is below any prefill step.
    let (ok, stdout, stderr) = small(&["--rate", "2", "--slo-ttft-ms", "0.01", "--price", "h200_sxm=2.5"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("No candidate meets p99 TTFT <= 0.01 ms"), "{stdout}");
    assert!(stdout.contains("Closest candidates"), "{stdout}");
    assert!(stdout.contains("TTFT") && stdout.contains("> 0.01 ms"), "{stdout}");
    // The --price override is what costs are computed with: 1 GPU = 2.50 USD/h.
    assert!(stdout.contains("2.50"), "{stdout}");
}

#[test]
fn bad_input_gets_clear_errors() {
    let cases: &[(&[&str], &str)] = &[
        (&["--rate", "0", "--slo-ttft-ms", "500"], "--rate must be a positive number"),
        (&["--rate", "inf", "--slo-ttft-ms", "500"], "finite"),
        (&["--slo-ttft-ms", "500"], "--rate"),
        (&["--rate", "1"], "at least one latency target"),
        (&["--rate", "1", "--slo-ttft-ms", "500", "--gpus", "h900"], "unknown GPU 'h900'"),
        (&["--rate", "1", "--slo-ttft-ms", "500", "--max-num-batched-tokens", "100"], "below --max-num-seqs 256"),
        (&["--rate", "1", "--slo-ttft-ms", "500", "--price", "b200_sxm=3"], "not among the GPUs searched"),
        (&["--rate", "1", "--slo-ttft-ms", "500", "--price", "h200_sxm=-1"], "not a positive number"),
        (&["--rate", "1", "--slo-ttft-ms", "500", "--concurrency", "4"], "cannot be used with"),
    ];
    for (extra, want) in cases {
        let (ok, _, stderr) = small(extra);
        assert!(!ok, "{extra:?} should fail");
        assert!(stderr.contains(want), "{extra:?}: expected '{want}' in: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn nothing_fits_names_the_memory_figures() {
    let (ok, _, stderr) = ks(&["plan", "--model", "llama-3.1-405b", "--gpus", "h200_sxm", "--dtype", "bf16", "--tp", "1", "--max-gpus", "1", "--rate", "1", "--slo-ttft-ms", "500"]);
    assert!(!ok);
    assert!(stderr.contains("no deployment fits") && stderr.contains("GiB"), "{stderr}");
}

#[test]
fn capacity_reports_the_highest_rate_and_the_curve() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let (ok, stdout, stderr) = ks(&[
        "capacity", "--model", "llama-3.1-8b", "--gpu", "h200_sxm", "--num-requests", "150", "--workload", "fixed", "--isl", "200", "--osl", "100",
        "--slo-ttft-ms", "300", "--json", "--out", out,
    ]);
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let max = v["capacity"]["max_rate_per_s"].as_f64().unwrap();
    let fail = v["capacity"]["first_failing_rate_per_s"].as_f64().unwrap();
    assert!(max > 0.0 && fail > max && fail / max < 1.05, "{max} {fail}");
    let curve = v["capacity"]["curve"].as_array().unwrap();
    assert!(curve.len() >= 8);
    assert!(dir.path().join("latency_vs_load.png").is_file());
    // Disaggregated pools: one prefill and one decode replica.
    let (ok, stdout, stderr) = ks(&[
        "capacity", "--gpu", "h200_sxm", "--prefill-replicas", "1", "--decode-replicas", "1", "--num-requests", "100", "--workload", "fixed",
        "--isl", "500", "--osl", "50", "--slo-ttft-ms", "300",
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("1P+1D") && stdout.contains("Highest rate within p99 TTFT <= 300 ms"), "{stdout}");
    // A layout that does not fit and a half-given pool split are errors.
    let (ok, _, stderr) = ks(&["capacity", "--model", "llama-3.1-70b", "--gpu", "h200_sxm", "--slo-ttft-ms", "300"]);
    assert!(!ok && stderr.contains("does not fit"), "{stderr}");
    let (ok, _, stderr) = ks(&["capacity", "--gpu", "h200_sxm", "--prefill-replicas", "1", "--slo-ttft-ms", "300"]);
    assert!(!ok && stderr.contains("--decode-replicas"), "{stderr}");
}

#[test]
fn skewed_moe_routing_lowers_expert_parallel_capacity() {
    // Qwen3-30B-A3B over 8 GPUs with expert parallelism: with power-law expert loads the
    // busiest GPU's experts set each step, so the sustainable rate cannot rise.
    let rate = |routing: &str| {
        let (ok, stdout, stderr) = ks(&[
            "capacity", "--model", "qwen3-30b-a3b", "--gpu", "h200_sxm", "--tp", "8", "--ep", "8", "--num-requests", "150", "--workload", "fixed",
            "--isl", "4096", "--osl", "64", "--slo-ttft-ms", "500", "--moe-routing", routing, "--json",
        ]);
        assert!(ok, "{stderr}");
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        v["capacity"]["max_rate_per_s"].as_f64().unwrap()
    };
    let (uniform, skewed) = (rate("uniform"), rate("power_law_1.2"));
    assert!(skewed < uniform, "power-law {skewed} req/s vs uniform {uniform} req/s");
}

#[test]
fn a_slower_host_lowers_a_host_bound_models_capacity() {
    // Qwen3-0.6B on one H200: its decode steps are mostly vLLM's host work, so a host 1.5x
    // slower (`--host-scale 1.5`) cannot sustain the same rate under a TPOT objective.
    let rate = |scale: &str| {
        let (ok, stdout, stderr) = ks(&[
            "capacity", "--model", "qwen3-0.6b", "--gpu", "h200_sxm", "--num-requests", "150", "--workload", "fixed", "--isl", "512", "--osl", "128",
            "--slo-tpot-ms", "5", "--host-scale", scale, "--json",
        ]);
        assert!(ok, "{stderr}");
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        v["capacity"]["max_rate_per_s"].as_f64().unwrap()
    };
    let (fitted, slower) = (rate("1"), rate("1.5"));
    assert!(slower < 0.8 * fitted, "host x1.5: {slower} req/s vs {fitted} req/s");
    let (ok, _, stderr) = ks(&["capacity", "--gpu", "h200_sxm", "--slo-ttft-ms", "300", "--host-scale", "0"]);
    assert!(!ok && stderr.contains("--host-scale"), "{stderr}");
}

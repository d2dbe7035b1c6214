//! End-to-end checks of the core commands through the binary.
use std::process::Command;

fn ks(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kernelsight")).args(args).output().expect("run kernelsight");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// `kernel --input IN --output OUT` on the H200: (ok, stderr, output header, output rows).
fn kernel_csv(input: &std::path::Path, output: &std::path::Path) -> (bool, String, csv::StringRecord, Vec<csv::StringRecord>) {
    let (ok, _, err) = ks(&["kernel", "--gpu", "h200_sxm", "--input", input.to_str().unwrap(), "--output", output.to_str().unwrap()]);
    if !ok {
        return (false, err, csv::StringRecord::new(), vec![]);
    }
    let mut rdr = csv::Reader::from_path(output).unwrap();
    let headers = rdr.headers().unwrap().clone();
    (true, err, headers, rdr.records().map(|r| r.unwrap()).collect())
}

fn json(args: &[&str]) -> serde_json::Value {
    let (ok, out, err) = ks(args);
    assert!(ok, "{args:?} failed: {err}");
    serde_json::from_str(&out).expect("valid JSON")
}

#[test]
fn llama_8b_decode_batch_1_reads_its_weights() {
    let v = json(&["step", "--model", "llama-3.1-8b", "--gpu", "h200_sxm", "--batch", "decode:1@1", "--json"]);
    // 8.03e9 parameters x 2 bytes = 16.06 GB of weights; a decode step reads every linear
    // layer and the lm_head but gathers only one row of the 1.05 GB embedding table.
    let embedding_table = 128256.0 * 4096.0 * 2.0;
    let total = v["total_bytes"].as_f64().unwrap();
    let expected = 16.06e9 - embedding_table;
    assert!((total / expected - 1.0).abs() < 0.01, "total_bytes {total} vs {expected}");
    // At batch 1 the step is memory-bound: SOL ~ bytes / 4.8 TB/s.
    let sol_us = v["sol_us"].as_f64().unwrap();
    assert!((sol_us / (total / 4.8e12 * 1e6) - 1.0).abs() < 0.02, "{sol_us}");
    assert!(v["predicted_us"].as_f64().unwrap() > sol_us);
    // Memory-bound GEMMs: the power limit does not bind.
    assert!(v["power_capped_gemm_tflops"].is_null());
}

#[test]
fn a_long_prefill_step_names_the_rate_the_power_limit_holds_its_gemms_to() {
    let v = json(&["step", "--model", "qwen3-14b", "--gpu", "h100_sxm", "--engine", "vllm", "--batch", "prefill:1x4096", "--json"]);
    let tflops = v["power_capped_gemm_tflops"].as_f64().expect("the cap binds on a 4096-token prefill");
    // Between the back-to-back rate and the most relaxed one (`hw show h100_sxm`).
    let hw = ks(&["hw", "show", "h100_sxm"]).1;
    assert!(hw.contains("685.7 TFLOPS back to back"), "{hw}");
    assert!(tflops >= 685.7 && tflops < 800.0, "{tflops}");
    // Every bf16 GEMM runs no faster than that rate.
    for k in v["kernels"].as_array().unwrap().iter().filter(|k| k["op"] == "gemm" && k["dtype"] == "bf16") {
        let floor_us = k["flops"].as_f64().unwrap() / (tflops * 1e6);
        assert!(k["predicted_us"].as_f64().unwrap() >= floor_us * (1.0 - 1e-9), "{k}");
    }
}

#[test]
fn gemm_8192_cubed_sol_on_h200() {
    let v = json(&["kernel", "--gpu", "h200_sxm", "--op", "gemm", "--m", "8192", "--n", "8192", "--k", "8192", "--json"]);
    let expected = 2.0 * 8192f64.powi(3) / 989.4e12 * 1e6;
    assert!((v["sol_us"].as_f64().unwrap() - expected).abs() / expected < 1e-6);
    assert_eq!(v["bound"], "compute");
}

#[test]
fn kernel_csv_round_trip_keeps_order_and_extra_columns() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.csv");
    let output = dir.path().join("out.csv");
    std::fs::write(
        &input,
        "op,dtype,m,n,k,num_tokens,hidden,bytes,num_gpus,latency_us,gpu,note\n\
         gemm,bf16,1,8192,8192,,,,,40,h200_sxm,a\n\
         rmsnorm,bf16,,,,1024,4096,,,,,b\n\
         all_reduce,bf16,,,,,,1048576,8,,,c\n",
    )
    .unwrap();
    let (ok, err, headers, rows) = kernel_csv(&input, &output);
    assert!(ok, "{err}");
    let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
    assert_eq!(rows.len(), 3);
    let notes: Vec<&str> = rows.iter().map(|r| &r[col("note")]).collect();
    assert_eq!(notes, ["a", "b", "c"]);
    assert_eq!(&rows[0][col("latency_us")], "40.0000");
    for r in &rows {
        let sol: f64 = r[col("sol_us")].parse().unwrap();
        let pred: f64 = r[col("predicted_us")].parse().unwrap();
        assert!(sol > 0.0 && pred >= sol);
    }
}

#[test]
fn kernel_csv_prices_a_moe_row_for_the_routing_it_names() {
    // gpt-oss's experts at 32 tokens x top-4 of 128: balanced routing reads all 128 experts,
    // uniform ~81, the collector's power law fewer still; a bad routing names the row.
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in.csv"), dir.path().join("out.csv"));
    let head = "op,dtype,num_tokens,hidden,inter,topk,num_experts,tp,ep,backend,routing\n";
    let row = "moe,bf16,32,2880,2880,4,128,1,1,grouped_mm";
    std::fs::write(&input, format!("{head}{row},balanced\n{row},uniform\n{row},power_law_1.2\n")).unwrap();
    let (ok, err, headers, rows) = kernel_csv(&input, &output);
    assert!(ok, "{err}");
    let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let get = |i: usize, c: &str| -> f64 { rows[i][col(c)].parse().unwrap() };
    assert!(get(0, "sol_us") > 1.5 * get(1, "sol_us") && get(1, "sol_us") > get(2, "sol_us"), "{rows:?}");
    assert!(get(0, "predicted_us") > 1.2 * get(1, "predicted_us") && get(1, "predicted_us") > get(2, "predicted_us"), "{rows:?}");
    std::fs::write(&input, format!("{head}{row},uniform\n{row},zipf\n")).unwrap();
    let (ok, err, _, _) = kernel_csv(&input, &output);
    assert!(!ok && err.contains("data row 2") && err.contains("'zipf'") && err.contains("balanced, uniform"), "{err}");
}

#[test]
fn bad_inputs_give_clear_errors() {
    let (ok, _, err) = ks(&["step", "--gpu", "h900", "--batch", "decode:1@1"]);
    assert!(!ok && err.contains("unknown GPU 'h900'") && err.contains("h200_sxm"), "{err}");
    let (ok, _, err) = ks(&["step", "--model", "llama-9", "--batch", "decode:1@1"]);
    assert!(!ok && err.contains("unknown model 'llama-9'") && err.contains("llama-3.1-8b"), "{err}");
    let (ok, _, err) = ks(&["step", "--batch", "decode:64"]);
    assert!(!ok && err.contains("prefill:2x512,decode:64@2048"), "{err}");
    let (ok, _, err) = ks(&["step", "--batch", "decode:4000@1000000"]);
    assert!(!ok && err.contains("KV tokens") && err.contains("fits"), "{err}");
}

#[test]
fn a_model_too_big_for_the_gpu_is_an_error_with_numbers() {
    // A 405B-class config from a user path: ~810 GB of bf16 weights cannot fit one H200.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.json");
    std::fs::write(
        &cfg,
        r#"{"model_type":"llama","hidden_size":16384,"intermediate_size":53248,"num_attention_heads":128,
            "num_key_value_heads":8,"num_hidden_layers":126,"vocab_size":128256}"#,
    )
    .unwrap();
    let (ok, _, err) = ks(&["step", "--model", cfg.to_str().unwrap(), "--batch", "decode:1@1"]);
    assert!(!ok, "should not fit");
    assert!(err.contains("does not fit") && err.contains("GiB") && err.contains("weights"), "{err}");
    // With 8-way TP in fp8 it fits (405e9 bytes / 8 ~ 51 GB per GPU).
    let (ok, _, err) = ks(&["step", "--model", cfg.to_str().unwrap(), "--tp", "8", "--dtype", "fp8", "--batch", "decode:1@1"]);
    assert!(ok, "{err}");
}

#[test]
fn the_engine_sets_host_overhead_and_attention() {
    // transformers continuous batching is host-bound: the H200 traces show 50-100 ms decode
    // steps for Llama-3.1-8B (calibration/traces/h200_sxm/README.md), where the GPU work of 8
    // decodes is a few milliseconds.
    let hf = json(&["step", "--engine", "hf", "--batch", "decode:8@100", "--json"]);
    let vllm = json(&["step", "--engine", "vllm", "--batch", "decode:8@100", "--json"]);
    let (hf_us, vllm_us) = (hf["predicted_us"].as_f64().unwrap(), vllm["predicted_us"].as_f64().unwrap());
    assert!(hf_us > 40_000.0 && hf_us < 120_000.0, "{hf_us}");
    assert!(vllm_us < 20_000.0, "{vllm_us}");
    let (ok, _, err) = ks(&["step", "--engine", "foo", "--batch", "decode:1@1"]);
    assert!(!ok && err.contains("unknown engine 'foo'") && err.contains("vllm"), "{err}");
}

#[test]
fn skewed_moe_routing_prices_the_busiest_expert_shard() {
    // Qwen3-30B-A3B (128 experts, top-8) over 8 GPUs with expert parallelism, one 4096-token
    // prefill: under power-law loads the busiest GPU's 16 experts get well over an eighth of
    // the 32768 assignments, so its experts take longer than under uniform routing, and the
    // SOL the report shows counts that shard's work.
    let moe = |routing: &str| -> (f64, f64) {
        let v = json(&["step", "--model", "qwen3-30b-a3b", "--gpu", "h200_sxm", "--tp", "8", "--ep", "8", "--batch", "prefill:1x4096", "--moe-routing", routing, "--json"]);
        let experts: Vec<&serde_json::Value> = v["kernels"].as_array().expect("kernels array").iter().filter(|k| k["op"] == "moe").collect();
        assert!(!experts.is_empty(), "no moe kernel: {v}");
        let total = |field: &str| experts.iter().map(|k| k[field].as_f64().unwrap() * k["count"].as_f64().unwrap_or(1.0)).sum::<f64>();
        (total("predicted_us"), total("flops"))
    };
    let (uniform_us, uniform_flops) = moe("uniform");
    let (skewed_us, skewed_flops) = moe("power_law_1.2");
    assert!(skewed_flops > 1.5 * uniform_flops, "busiest shard FLOPs {skewed_flops} vs even share {uniform_flops}");
    // aiconfigurator measured vLLM's Triton experts 1.14x slower under power_law_1.2 than
    // balanced at 1-4k tokens with ep > 1 (H200 rows); the model must at least see the direction.
    assert!(skewed_us > 1.05 * uniform_us, "power-law {skewed_us} us vs uniform {uniform_us} us");
    let (ok, _, err) = ks(&["step", "--model", "qwen3-30b-a3b", "--batch", "decode:1@1", "--moe-routing", "zipf"]);
    assert!(!ok && err.contains("'zipf'") && err.contains("uniform, balanced, power_law_<alpha>"), "{err}");
}

#[test]
fn one_kernel_prices_its_own_shard_and_a_serving_step_the_busiest() {
    // Qwen3-30B-A3B's experts on 8 GPUs, 4 tokens x top-8 of 128 experts: a GPU holds 16 and
    // gets 4 assignments on average, the busiest of the 8 about 7.
    let shape = ["--num-tokens", "4", "--hidden", "2048", "--inter", "768", "--topk", "8", "--num-experts", "128", "--ep", "8"];
    let one = json(&[&["kernel", "--gpu", "h200_sxm", "--op", "moe", "--json"][..], &shape[..]].concat());
    let step = json(&["step", "--model", "qwen3-30b-a3b", "--gpu", "h200_sxm", "--tp", "8", "--ep", "8", "--batch", "decode:4@100", "--json"]);
    let experts = step["kernels"].as_array().unwrap().iter().find(|k| k["name"].as_str().unwrap().ends_with(".experts")).unwrap();
    assert!(experts["shape"].as_str().unwrap().starts_with("num_tokens=4 hidden=2048 inter=768 topk=8 num_experts=128"));
    // The step's SOL and time count the busiest shard's experts, the single kernel its own.
    let (one_sol, step_sol) = (one["sol_us"].as_f64().unwrap(), experts["sol_us"].as_f64().unwrap());
    assert!(step_sol > 1.3 * one_sol, "step {step_sol} us vs one kernel {one_sol} us");
    let (one_t, step_t) = (one["predicted_us"].as_f64().unwrap(), experts["predicted_us"].as_f64().unwrap());
    assert!(step_t > one_t && one_t >= one_sol, "step {step_t} us vs one kernel {one_t} us");
}

#[test]
fn one_kernel_prices_the_routing_it_is_given() {
    // MiniMax-M2.5's experts on the H100 at EP4, 8,192 tokens: aiconfigurator measured vLLM's
    // block-FP8 FlashInfer CUTLASS experts at 1,206.8 us balanced and 1,630.8 us under
    // power_law_1.01.
    let shape = ["--gpu", "h100_sxm", "--op", "moe", "--dtype", "fp8", "--num-tokens", "8192", "--hidden", "3072", "--inter", "1536", "--topk", "8", "--num-experts", "256", "--tp", "1", "--ep", "4", "--backend", "vllm/fp8_block/vllm_fp8moe_flashinfer_cutlass", "--json"];
    let plain = json(&[&["kernel"][..], &shape[..]].concat());
    let skewed = json(&[&["kernel"][..], &shape[..], &["--moe-routing", "power_law_1.01"][..]].concat());
    assert_eq!(plain["moe_routing"], "uniform");
    assert_eq!(skewed["moe_routing"], "power_law_1.01");
    let (p, s) = (plain["predicted_us"].as_f64().unwrap(), skewed["predicted_us"].as_f64().unwrap());
    assert!(s > 1.15 * p, "power law {s} us vs uniform {p} us");
    assert!((s / 1630.8 - 1.0).abs() < 0.15, "power law {s} us vs 1,630.8 measured");
    let (ok, _, err) = ks(&[&["kernel"][..], &shape[..], &["--moe-routing", "zipf"][..]].concat());
    assert!(!ok && err.contains("'zipf'"), "{err}");
}

#[test]
fn one_mla_module_is_priced_for_the_norm_dispatch_it_names() {
    // DeepSeek-V3's MLA module on the B200 at batch 1, 128 heads, 4,097 KV tokens: aiconfigurator
    // measured 106.3 us with vLLM's fused norm and rotary kernels (its B200 tables' dispatch).
    // Cross-gen never saw those tables: the fused dispatch is the native module less the
    // native chain's extra launches and traffic.
    let shape = ["--gpu", "b200_sxm", "--tier", "cross-gen", "--op", "mla_decode", "--batch", "1", "--kv-len", "4097", "--num-heads", "128", "--num-kv-heads", "1", "--head-dim", "576", "--json"];
    let module = "vllm/module_gemm_bfloat16/FLASHINFER_MLA";
    let fused = "vllm/module_gemm_bfloat16/norm_vllm_c_eager_surrogate/FLASHINFER_MLA";
    let native = json(&[&["kernel"][..], &shape[..], &["--backend", module][..]].concat());
    let named = json(&[&["kernel"][..], &shape[..], &["--backend", fused][..]].concat());
    let (n, f) = (native["predicted_us"].as_f64().unwrap(), named["predicted_us"].as_f64().unwrap());
    assert!(n - f > 40.0 && n - f < 80.0, "native {n} us, fused {f} us");
    assert!((f / 106.3 - 1.0).abs() < 0.2, "fused {f} us vs 106.3 measured");
}

#[test]
fn kernel_names_the_library_it_priced() {
    // The H100 measured bf16 GEMMs with several libraries (public tables and our collector's
    // cuBLAS); a prediction must say which one it used, and `--backend` must pick it.
    let shape = ["kernel", "--gpu", "h100_sxm", "--op", "gemm", "--m", "8192", "--n", "7168", "--k", "5120", "--json"];
    let named = json(&[&shape[..], &["--backend", "cublas"][..]].concat());
    let library = named["library"].as_str().expect("library reported");
    assert!(library.starts_with("cublas"), "--backend cublas priced with {library}");
    let default = json(&shape);
    let default_library = default["library"].as_str().expect("library reported");
    // The default is the most measured library of the kernel's own precision: on the H100 the
    // FP8 Cutlass GEMM rows tie the bf16 ones for most measured, and must not price a bf16 GEMM.
    assert!(!default_library.is_empty() && !default_library.to_ascii_lowercase().contains("fp8"), "bf16 GEMM priced with {default_library}");
    let fp8 = json(&[&shape[..], &["--dtype", "fp8"][..]].concat());
    let fp8_library = fp8["library"].as_str().expect("library reported");
    assert!(fp8_library.to_ascii_lowercase().contains("fp8"), "fp8 GEMM priced with {fp8_library}");
    if default_library != library {
        assert_ne!(default["predicted_us"].as_f64(), named["predicted_us"].as_f64());
    }
    // Nor does a library timed under skewed routing price served (uniform) traffic by default.
    let moe = json(&["kernel", "--gpu", "h200_sxm", "--op", "moe", "--num-tokens", "64", "--hidden", "4096", "--inter", "1536", "--topk", "8", "--num-experts", "128", "--json"]);
    let moe_library = moe["library"].as_str().expect("library reported");
    assert!(!moe_library.contains("power_law"), "uniform MoE priced with {moe_library}");
    // An op the roofline constants price names no library.
    let roof = json(&["kernel", "--gpu", "h100_sxm", "--tier", "roofline", "--op", "gemm", "--m", "64", "--n", "64", "--k", "64", "--json"]);
    assert!(roof["library"].is_null(), "roofline tier reported {}", roof["library"]);
}

#[test]
fn step_holds_the_kv_that_simulate_derives_for_the_same_engine() {
    // transformers' masks over the cache grow with the engine's token budget (8,192), not with
    // the step's own tokens: `step` must refuse a batch `simulate` could not hold either.
    let sim = json(&["simulate", "--engine", "hf", "--model", "llama-3.1-8b", "--gpu", "h200_sxm", "--num-requests", "2", "--json"]);
    let cap = sim["memory"]["kv_capacity_tokens"].as_u64().expect("memory.kv_capacity_tokens");
    let batch = |kv_tokens: u64| format!("decode:10@{}", kv_tokens / 10 - 1);
    let step = |b: &str| ks(&["step", "--engine", "hf", "--model", "llama-3.1-8b", "--gpu", "h200_sxm", "--batch", b]);
    let (ok, _, err) = step(&batch(cap));
    assert!(ok, "{cap} tokens should fit: {err}");
    let (ok, _, err) = step(&batch(cap + cap / 50));
    assert!(!ok && err.contains(&format!("fits {cap}")), "{err}");
}

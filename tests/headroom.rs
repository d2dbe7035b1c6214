//! `sol` on FlashInfer-Trace fixtures: counts checked against hand computation from the
//! definitions' shapes, every fixture definition and workload evaluated, bad input rejected.

use kernelsight::kernels::cost::Routing;
use kernelsight::hardware::load_gpu;
use kernelsight::headroom::trace::{Definition, Workload};
use kernelsight::headroom::verdict::Verdict;
use kernelsight::headroom::{evaluate_definition, Answer};
use serde_json::json;
use std::path::{Path, PathBuf};

const HBM: f64 = 4.8e12;
const BF16_PEAK: f64 = 989.4e12;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/flashinfer").join(rel)
}

fn eval(def: &str, axes: serde_json::Value, measured: Option<f64>) -> Answer {
    let d = Definition::from_path(&fixture(&format!("definitions/{def}.json"))).unwrap();
    let w = Workload::from_value(&axes, "test").unwrap();
    evaluate_definition(&d, &w, &load_gpu("h200_sxm").unwrap(), measured, "test").unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn gemm_counts_and_sol() {
    let a = eval("gemm/gemm_n4096_k4096", json!({"M": 256}), None);
    let flops = 2.0 * 256.0 * 4096.0 * 4096.0;
    let bytes = (256.0 * 4096.0 + 4096.0 * 4096.0 + 256.0 * 4096.0) * 2.0;
    assert!(close(a.bounds.flops, flops) && close(a.bounds.bytes, bytes));
    // fp16 peak = bf16 peak on H200; compute (8.68 us) beats memory (7.86 us).
    assert!(close(a.bounds.sol_us, flops / BF16_PEAK * 1e6));
    assert!(a.bounds.practical_us >= a.bounds.sol_us);
    assert!(a.missing.is_empty() && a.nominal.is_none());
}

#[test]
fn rmsnorm_and_fused_add_rmsnorm_bytes() {
    let a = eval("rmsnorm/rmsnorm_h4096", json!({"batch_size": 1024}), None);
    let bytes = (2.0 * 1024.0 * 4096.0 + 4096.0) * 2.0;
    assert!(close(a.bounds.bytes, bytes) && a.bounds.flops == 0.0);
    assert!(close(a.bounds.sol_us, bytes / HBM * 1e6));
    let f = eval("rmsnorm/fused_add_rmsnorm_h2048", json!({"batch_size": 6}), None);
    assert!(close(f.bounds.bytes, (3.0 * 6.0 * 2048.0 + 2048.0) * 2.0));
    assert!(f.notes.iter().any(|n| n.contains("residual in place")));
}

#[test]
fn gqa_paged_decode_reads_each_cached_token_once() {
    let a = eval(
        "gqa_paged/gqa_paged_decode_h32_kv8_d128_ps1",
        json!({"batch_size": 1, "num_pages": 9316, "len_indptr": 2, "num_kv_indices": 73}),
        None,
    );
    // q and output, lse, kv_indptr, kv_indices (page_size 1 has no kv_last_page_len).
    let io = 32.0 * 128.0 * 2.0 * 2.0 + 32.0 * 4.0 + 2.0 * 4.0 + 73.0 * 4.0;
    let kv = 73.0 * 8.0 * 128.0 * 2.0 * 2.0;
    assert!(close(a.bounds.bytes, io + kv), "{} vs {}", a.bounds.bytes, io + kv);
    assert!(close(a.bounds.flops, 4.0 * 32.0 * 128.0 * 73.0));
    assert!(a.nominal.is_none());
}

#[test]
fn paged_decode_with_big_pages_bounds_the_last_page() {
    // 10 pages of 64 tokens over 3 requests: at least 7*64 + 3 tokens, nominal 7*64 + 3*32.5.
    let a = eval(
        "gqa_paged/gqa_paged_decode_h32_kv8_d128_ps64",
        json!({"batch_size": 3, "num_pages": 100, "len_indptr": 4, "num_kv_indices": 10}),
        None,
    );
    assert!(close(a.bounds.flops, 4.0 * 32.0 * 128.0 * (7.0 * 64.0 + 3.0)));
    assert!(close(a.nominal.unwrap().flops, 4.0 * 32.0 * 128.0 * (7.0 * 64.0 + 3.0 * 32.5)));
    assert!(a.missing.iter().any(|m| m.contains("kv_last_page_len")));
}

#[test]
fn ragged_prefill_single_request_is_exact() {
    let a = eval(
        "gqa_ragged/gqa_ragged_prefill_causal_h32_kv8_d128",
        json!({"len_indptr": 2, "total_q": 34, "total_kv": 34}),
        None,
    );
    let pairs = 34.0 * 35.0 / 2.0;
    assert!(close(a.bounds.flops, 4.0 * 32.0 * 128.0 * pairs));
    let bytes = 2.0 * 34.0 * 32.0 * 128.0 * 2.0 + 2.0 * 34.0 * 8.0 * 128.0 * 2.0 + 34.0 * 32.0 * 4.0 + 2.0 * 2.0 * 4.0;
    assert!(close(a.bounds.bytes, bytes));
    assert!(a.nominal.is_none() && a.missing.is_empty());
}

#[test]
fn mla_decode_counts_latent_cache() {
    let a = eval(
        "mla_paged/mla_paged_decode_h16_ckv512_kpe64_ps1",
        json!({"batch_size": 1, "num_pages": 989669, "len_indptr": 2, "num_kv_indices": 8}),
        None,
    );
    assert!(close(a.bounds.flops, 8.0 * (2.0 * 16.0 * 576.0 + 2.0 * 16.0 * 512.0)));
    let io = 16.0 * 512.0 * 2.0 * 2.0 + 16.0 * 64.0 * 2.0 + 16.0 * 4.0 + 2.0 * 4.0 + 8.0 * 4.0;
    assert!(close(a.bounds.bytes, io + 8.0 * 576.0 * 2.0));
}

#[test]
fn fp4_moe_counts_packed_weights_and_top_k_experts() {
    let a = eval("moe/trtllm_fp4_block_scale_moe_topk8_e128_h2048_i768", json!({"seq_len": 16}), None);
    let per_expert = (1536.0 * 2048.0 + 2048.0 * 768.0) * (0.5 + 1.0 / 32.0);
    let io = 16.0 * 128.0 * 2.0 + 2.0 * 16.0 * 2048.0 * 2.0;
    assert!(close(a.bounds.bytes, io + 8.0 * per_expert), "{}", a.bounds.bytes);
    assert!(close(a.bounds.flops, 16.0 * 8.0 * (2.0 * 2048.0 * 1536.0 + 2.0 * 768.0 * 2048.0)));
    assert!(a.notes.iter().any(|n| n.contains("declared float32") && n.contains("packed FP4")));
    // Uniform routing of 128 assignments over 128 experts touches 128(1-(127/128)^128) = 80.9.
    let expected = 128.0 * (1.0 - (127.0f64 / 128.0).powi(128));
    assert!(close(a.nominal.unwrap().bytes, io + expected * per_expert));
}

#[test]
fn expert_parallel_moe_bound_allows_all_remote_routing() {
    let a = eval("moe/moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048", json!({"seq_len": 4}), None);
    let io = 4.0 * 256.0 * 4.0 + 256.0 * 2.0 + 4.0 * 7168.0 + 56.0 * 4.0 * 4.0 + 4.0 * 7168.0 * 2.0;
    assert_eq!(a.bounds.flops, 0.0);
    assert!(close(a.bounds.bytes, io));
    // Nominal: 4 tokens x 8 x 32/256 = 4 local assignments.
    assert!(close(a.nominal.unwrap().flops, 4.0 * (2.0 * 7168.0 * 4096.0 + 2.0 * 2048.0 * 7168.0)));
    assert!(a.notes.iter().any(|n| n.contains("top_k = 8 taken from the definition name")));
    assert!(a.missing.iter().any(|m| m.starts_with("routing_logits")));
}

#[test]
fn recurrent_ops_move_their_state() {
    let g = eval("gdn/gdn_decode_qk4_v8_d128_k_last", json!({"batch_size": 4}), None);
    let state = 4.0 * 8.0 * 128.0 * 128.0 * 4.0;
    let small = 4.0 * (4.0 + 4.0 + 8.0) * 128.0 * 2.0 + 8.0 * 4.0 * 2.0 + 2.0 * 4.0 * 8.0 * 2.0 + 4.0 * 8.0 * 128.0 * 2.0;
    assert!(close(g.bounds.bytes, 2.0 * state + small), "{}", g.bounds.bytes);
    assert!(close(g.bounds.flops, 6.0 * 8.0 * 128.0 * 128.0 * 4.0));
    let m = eval("mamba_ssu/mamba_ssu_decode_h64_d64_s128_ng4", json!({"batch_size": 2, "state_cache_size": 10}), None);
    let slot = 64.0 * 64.0 * 128.0;
    let io = 2.0 * 2.0 * 64.0 * 64.0 * 2.0 + slot * 4.0 + 2.0 * 2.0 * 4.0 * 128.0 * 2.0 + 2.0 * 64.0 * 64.0 * 2.0 + 2.0 * 4.0 + 2.0 * 64.0 * 64.0 * 2.0;
    assert!(close(m.bounds.bytes, io + 2.0 * 2.0 * slot * 2.0), "{}", m.bounds.bytes);
}

#[test]
fn rope_and_sampling_bytes() {
    let r = eval(
        "rope/rope_with_cos_sin_cache_neox_style_d128_rd64",
        json!({"num_tokens": 16, "num_qo_heads": 8, "num_kv_heads": 1, "max_seq_len": 4096}),
        None,
    );
    assert!(close(r.bounds.bytes, 2.0 * 16.0 * 9.0 * 64.0 * 2.0 + 16.0 * 8.0 + 64.0 * 4.0));
    assert!(close(r.nominal.unwrap().bytes, 2.0 * 16.0 * 9.0 * 64.0 * 2.0 + 16.0 * 8.0 + 16.0 * 64.0 * 4.0));
    let s = eval("sampling/top_k_top_p_sampling_from_probs_v128256", json!({"batch_size": 4}), None);
    assert!(close(s.bounds.bytes, 4.0 * 128256.0 * 4.0 + 4.0 * 4.0 + 4.0 * 4.0 + 4.0 * 8.0));
}

#[test]
fn verdicts_from_measured_times() {
    let def = "rmsnorm/rmsnorm_h4096";
    let axes = json!({"batch_size": 16384});
    let sol = eval(def, axes.clone(), None).bounds.sol_us;
    assert_eq!(eval(def, axes.clone(), Some(sol * 0.5)).assessment.unwrap().verdict, Verdict::Suspicious);
    assert_eq!(eval(def, axes.clone(), Some(sol * 1.1)).assessment.unwrap().verdict, Verdict::NearSol);
    let a = eval(def, axes, Some(sol * 3.0)).assessment.unwrap();
    assert_eq!(a.verdict, Verdict::Headroom);
    assert!(a.suggested_trials > 0);
}

/// Smallest valid value for each var axis, satisfying the fixtures' constraints.
fn synthetic_axes(d: &Definition) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for a in d.var_axes() {
        let v = match a.as_str() {
            "len_indptr" | "len_cu_seqlens" => 3,
            "batch_size" | "num_seqs" => 2,
            "seq_len" if d.op_type == "gdn" => 4,
            "total_q" | "total_seq_len" | "num_tokens" => 64,
            "total_kv" | "num_kv_indices" => 256,
            _ => 512,
        };
        m.insert(a, v.into());
    }
    serde_json::Value::Object(m)
}

#[test]
fn every_fixture_definition_evaluates_with_sane_bounds() {
    let gpu = load_gpu("h200_sxm").unwrap();
    let mut op_types = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(fixture("definitions")).unwrap() {
        for f in std::fs::read_dir(entry.unwrap().path()).unwrap() {
            let path = f.unwrap().path();
            let d = Definition::from_path(&path).unwrap();
            let w = Workload::from_value(&synthetic_axes(&d), "synthetic").unwrap();
            let a = evaluate_definition(&d, &w, &gpu, None, "synthetic")
                .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            assert!(a.bounds.sol_us > 0.0 && a.bounds.practical_us >= a.bounds.sol_us, "{}", path.display());
            if let Some(n) = a.nominal {
                assert!(n.flops >= a.bounds.flops && n.bytes >= a.bounds.bytes, "{}", path.display());
            }
            op_types.insert(d.op_type);
        }
    }
    let want: std::collections::BTreeSet<String> =
        kernelsight::headroom::ops::SUPPORTED_OP_TYPES.iter().map(|s| s.to_string()).collect();
    assert_eq!(op_types, want, "fixtures cover every supported op type");
}

#[test]
fn every_fixture_workload_evaluates_and_inconsistent_rows_are_flagged() {
    let gpu = load_gpu("h200_sxm").unwrap();
    let (mut rows, mut flagged) = (0, 0);
    for entry in std::fs::read_dir(fixture("workloads")).unwrap() {
        let dir = entry.unwrap().path();
        for f in std::fs::read_dir(&dir).unwrap() {
            let path = f.unwrap().path();
            let stem = path.file_stem().unwrap().to_str().unwrap().to_string();
            let d = Definition::from_path(&dir.join(format!("../../definitions/{}/{stem}.json", dir.file_name().unwrap().to_str().unwrap()))).unwrap();
            for (i, w) in Workload::read_jsonl(&path).unwrap().iter().enumerate() {
                let a = evaluate_definition(&d, w, &gpu, None, &format!("{}:{}", path.display(), i + 1)).unwrap();
                assert!(a.bounds.practical_us >= a.bounds.sol_us);
                rows += 1;
                if a.notes.iter().any(|n| n.contains("axes inconsistent")) {
                    flagged += 1;
                    assert!(stem.starts_with("gqa_paged_prefill"), "{stem}");
                }
            }
        }
    }
    assert_eq!(rows, 663);
    // gqa_paged prefill rows with fewer KV tokens than query tokens (page_size 1).
    assert!(flagged > 40, "{flagged}");
}

#[test]
fn bad_workloads_name_the_field() {
    let d = Definition::from_path(&fixture("definitions/gemm/gemm_n4096_k4096.json")).unwrap();
    let gpu = load_gpu("h200_sxm").unwrap();
    let w = Workload::from_value(&json!({"M": 8, "N": 64}), "w").unwrap();
    let e = evaluate_definition(&d, &w, &gpu, None, "w.jsonl: line 2").unwrap_err().to_string();
    assert!(e.contains("w.jsonl: line 2") && e.contains("'N' = 64") && e.contains("N = 4096"), "{e}");
    let w = Workload::from_value(&json!({"K": 4096}), "w").unwrap();
    let e = evaluate_definition(&d, &w, &gpu, None, "w").unwrap_err().to_string();
    assert!(e.contains("lacks axis 'M'"), "{e}");
    let w = Workload::from_value(&json!({"M": 8}), "w").unwrap();
    let e = evaluate_definition(&d, &w, &gpu, Some(0.0), "w").unwrap_err().to_string();
    assert!(e.contains("measured_us"), "{e}");
    let paged = Definition::from_path(&fixture("definitions/gqa_paged/gqa_paged_decode_h32_kv8_d128_ps1.json")).unwrap();
    let w = Workload::from_value(&json!({"batch_size": 4, "num_pages": 9, "len_indptr": 3, "num_kv_indices": 8}), "w").unwrap();
    let e = evaluate_definition(&paged, &w, &gpu, None, "w").unwrap_err().to_string();
    assert!(e.contains("len_indptr == batch_size + 1"), "{e}");
}

#[test]
fn every_op_type_in_the_upstream_index_is_supported() {
    let index = std::fs::read_to_string(fixture("definitions-index.tsv")).unwrap();
    let supported = kernelsight::headroom::ops::SUPPORTED_OP_TYPES;
    let mut seen = std::collections::BTreeSet::new();
    for line in index.lines().skip(1) {
        let op_type = line.split('\t').next().unwrap();
        assert!(supported.contains(&op_type), "index op_type '{op_type}' is not supported");
        seen.insert(op_type);
    }
    assert_eq!(seen.len(), 12);
}

/// With a calibration whose fitted GEMM runs at 1.01x SOL (faster than the 0.95 default
/// compute ceiling), the practical bound drops to the calibrated time.
#[test]
fn calibrated_model_lowers_the_practical_bound() {
    use kernelsight::calibrate::{self, dataset::Measurement, model::FitParams, store::Store, Data};
    use kernelsight::headroom::{evaluate_kernel, Target};
    use kernelsight::perf::efficiency::KernelModel;
    use kernelsight::perf::sol::sol;
    use kernelsight::perf::Tier;
    use kernelsight::schema::{Dtype, Kernel};
    let gpu = load_gpu("h200_sxm").unwrap();
    let mut rows = Vec::new();
    for m in [1u64, 4, 16, 64, 256, 1024, 4096, 16384] {
        for n in [512u64, 1024, 2048, 4096, 8192] {
            for k in [1024u64, 4096, 8192] {
                let kern = Kernel::gemm(Dtype::Bf16, m, n, k);
                let latency_us = sol(&kern, &gpu).sol_us * 1.01;
                rows.push(Measurement { routing: Routing::Uniform, latency_us, kernel: kern, gpu: "h200_sxm".into(), backend: "lib".into(), source: "synthetic".into() });
            }
        }
    }
    let data = Data::from_rows(rows, kernelsight::hardware::builtin_specs().unwrap());
    let mut params = FitParams::default();
    params.gbdt.trees = 60;
    let cal = calibrate::calibrate(&data, None, &params).unwrap();
    let dir = tempfile::tempdir().unwrap();
    calibrate::write_calibration(&cal, &data, dir.path(), "test").unwrap();
    let model = KernelModel::load_from(&Store::Dir(dir.path().to_path_buf()), &gpu, Tier::Target).unwrap();
    let target = Target { gpu: gpu.clone(), model: Some(model) };
    let k = Kernel::gemm(Dtype::Bf16, 4096, 4096, 4096);
    let a = evaluate_kernel(&k, &target, None).unwrap();
    let s = sol(&k, &gpu).sol_us;
    assert!((a.bounds.practical_us / s - 1.01).abs() < 0.03, "practical {} vs SOL {s}", a.bounds.practical_us);
    assert!(a.notes.iter().any(|n| n.starts_with("calibrated target prediction")), "{:?}", a.notes);
    let plain = evaluate_kernel(&k, &Target { gpu, model: None }, None).unwrap();
    assert!((plain.bounds.practical_us - s / 0.950).abs() < 1e-6);
}

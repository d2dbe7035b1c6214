//! The collector's plan: valid in the shared schema, covering every op the collector runs,
//! with model shapes that match hand-computed widths.
use kernelsight::microbench::{default_plan, model_plan, tp_shapes, write_plan, ROUTINGS};
use kernelsight::model::ModelConfig;
use kernelsight::schema::{read_rows_from, Dtype, Op};
use std::collections::BTreeSet;

fn round_trip(rows: &[kernelsight::schema::KernelRow]) -> Vec<kernelsight::schema::KernelRow> {
    let mut buf = Vec::new();
    write_plan(&mut buf, rows).unwrap();
    // read_rows validates every row (required fields, head divisibility, top-k <= experts).
    read_rows_from(buf.as_slice(), "plan.csv").unwrap()
}

#[test]
fn default_plan_is_valid_and_covers_every_collector_op() {
    let rows = round_trip(&default_plan());
    let ops: BTreeSet<Op> = rows.iter().map(|r| r.kernel.op).collect();
    let expected = [
        Op::Gemm, Op::AttnPrefill, Op::AttnDecode, Op::Moe, Op::MoeRouter, Op::Rmsnorm,
        Op::FusedAddRmsnorm, Op::SiluMul, Op::Rope, Op::Add, Op::Embedding, Op::Sampling,
        Op::Copy, Op::AllReduce, Op::AllGather, Op::ReduceScatter, Op::AllToAll, Op::P2p,
    ];
    for op in expected {
        assert!(ops.contains(&op), "default plan lacks {op}");
    }
    // Both GEMM dtypes, both prefill backends, both decode backends, both routings.
    let has = |op: Op, backend: &str| rows.iter().any(|r| r.kernel.op == op && r.backend.as_deref() == Some(backend));
    assert!(rows.iter().any(|r| r.kernel.op == Op::Gemm && r.kernel.dtype == Dtype::Fp8));
    assert!(has(Op::AttnPrefill, "sdpa_flash") && has(Op::AttnPrefill, "sdpa_cudnn"));
    assert!(has(Op::AttnDecode, "triton_paged") && has(Op::AttnDecode, "sdpa_flash"));
    for r in ROUTINGS {
        assert!(rows.iter().any(|x| x.kernel.op == Op::Moe && x.extra == vec![("routing".into(), r.into())]));
    }
    // Prefill over a cached prefix is present.
    assert!(rows.iter().any(|r| r.kernel.op == Op::AttnPrefill && r.kernel.kv_len > 0));
    // The sanity anchors: an 8192^3 bf16 GEMM and a copy of at least 1 GiB.
    assert!(rows.iter().any(|r| r.kernel == kernelsight::schema::Kernel::gemm(Dtype::Bf16, 8192, 8192, 8192)));
    assert!(rows.iter().any(|r| r.kernel.op == Op::Copy && r.kernel.bytes >= 1 << 30));
    // GEMM grid spans m 1..16384 and n, k 128..32768.
    let gemm = rows.iter().filter(|r| r.kernel.op == Op::Gemm);
    let ms: BTreeSet<u64> = gemm.clone().map(|r| r.kernel.m).collect();
    assert_eq!((ms.first(), ms.last()), (Some(&1), Some(&16384)));
    let ns: BTreeSet<u64> = gemm.map(|r| r.kernel.n).collect();
    assert!(ns.contains(&128) && ns.contains(&32768));
    // Collective sizes 1 KiB .. 1 GiB on 2 GPUs.
    let coll: Vec<_> = rows.iter().filter(|r| r.kernel.op.is_collective()).collect();
    assert!(coll.iter().all(|r| r.kernel.num_gpus == 2));
    assert_eq!(coll.iter().map(|r| r.kernel.bytes).min(), Some(1024));
    assert_eq!(coll.iter().map(|r| r.kernel.bytes).max(), Some(1 << 30));
}

#[test]
fn llama_8b_shapes_match_hand_computed_widths() {
    let m = ModelConfig::load("llama-3.1-8b").unwrap();
    // 32 query heads + 2 x 8 KV heads, 128 dims each: (32 + 16) * 128 = 6144 outputs from 4096.
    let s = tp_shapes(&m, 1).unwrap();
    assert_eq!(s.qkv, (6144, 4096));
    assert_eq!(s.o, (4096, 4096));
    assert_eq!(s.gate_up, Some((2 * 14336, 4096)));
    assert_eq!(s.down, Some((4096, 14336)));
    // TP2 halves heads and MLP width: (16 + 8) * 128 = 3072; 14336 / 2 = 7168.
    let s2 = tp_shapes(&m, 2).unwrap();
    assert_eq!((s2.heads, s2.kv_heads), (16, 4));
    assert_eq!(s2.qkv, (3072, 4096));
    assert_eq!(s2.down, Some((4096, 7168)));

    let rows = round_trip(&model_plan(&m, 1).unwrap());
    let gemm_nk: BTreeSet<(u64, u64)> =
        rows.iter().filter(|r| r.kernel.op == Op::Gemm).map(|r| (r.kernel.n, r.kernel.k)).collect();
    for nk in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)] {
        assert!(gemm_nk.contains(&nk), "missing GEMM n={} k={}", nk.0, nk.1);
    }
    let attn = rows.iter().find(|r| r.kernel.op == Op::AttnDecode).unwrap();
    assert_eq!((attn.kernel.num_heads, attn.kernel.num_kv_heads, attn.kernel.head_dim), (32, 8, 128));
    let silu = rows.iter().find(|r| r.kernel.op == Op::SiluMul).unwrap();
    assert_eq!(silu.kernel.hidden, 14336);
    assert!(rows.iter().all(|r| r.kernel.op != Op::Moe), "a dense model has no MoE rows");
}

#[test]
fn moe_model_plans_its_experts() {
    // Qwen3-30B-A3B: 128 experts, top-8, expert width 768, hidden 2048.
    let m = ModelConfig::load("qwen3-30b-a3b").unwrap();
    let rows = round_trip(&model_plan(&m, 2).unwrap());
    let moe = rows.iter().find(|r| r.kernel.op == Op::Moe).unwrap();
    let k = &moe.kernel;
    assert_eq!((k.hidden, k.inter, k.num_experts, k.topk, k.tp), (2048, 768, 128, 8, 2));
    assert!(rows.iter().any(|r| r.kernel.op == Op::MoeRouter && r.kernel.num_experts == 128));
}

#[test]
fn impossible_tp_is_refused_with_the_numbers() {
    let m = ModelConfig::load("llama-3.1-8b").unwrap();
    let err = model_plan(&m, 5).unwrap_err().to_string();
    assert!(err.contains("--tp 5") && err.contains("32"), "{err}");
}

#[test]
fn committed_h200_measurements_read_back_in_the_shared_schema() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("microbench/data/h200_sxm");
    for (file, expect_collectives) in [("h200_sxm.csv", false), ("h200_sxm_x2_collectives.csv", true)] {
        let rows = kernelsight::schema::read_rows(&dir.join(file)).unwrap();
        assert!(!rows.is_empty(), "{file} is empty");
        for r in &rows {
            assert!(r.latency_us.unwrap() > 0.0, "{file}: row without latency");
            assert_eq!(r.gpu.as_deref(), Some("h200_sxm"));
            assert!(r.backend.is_some());
            assert_eq!(r.kernel.op.is_collective(), expect_collectives, "{file}: {}", r.kernel.op);
        }
    }
}

#[test]
fn committed_default_plan_matches_the_generator() {
    // The measured data's provenance records this file's SHA-256; keep it what the code emits.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("microbench/plans/h200_default.csv");
    let committed = std::fs::read_to_string(path).unwrap();
    let mut fresh = Vec::new();
    write_plan(&mut fresh, &default_plan()).unwrap();
    assert!(committed == String::from_utf8(fresh).unwrap(), "regenerate with `kernelsight microbench plan --out microbench/plans/h200_default.csv`");
}

#[test]
fn the_collectors_gpu_free_checks_pass() {
    // microbench/tools/test_collect_plan.py: plan validation, flop/byte counts and the sanity
    // ranges of microbench/collect.py, checked without a GPU or torch.
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("microbench/tools/test_collect_plan.py");
    let run = std::process::Command::new("python3").arg(&script).output().expect("python3 runs");
    assert!(run.status.success(), "{}\n{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(String::from_utf8_lossy(&run.stdout).contains("ok test_sanity_ranges_follow_the_gpus_spec_sheet"));
}

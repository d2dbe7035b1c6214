//! The curated public subset in microbench/public/: coverage and anchors published in the
//! upstream data README (computed there from the same tables, not by this program).

use kernelsight::ingest;
use kernelsight::schema::{Dtype, KernelRow, Op};
use std::sync::OnceLock;

fn rows() -> &'static [KernelRow] {
    static ROWS: OnceLock<Vec<KernelRow>> = OnceLock::new();
    ROWS.get_or_init(|| ingest::load_public().expect("microbench/public loads"))
}

#[test]
fn every_curated_gpu_has_every_op_class() {
    let summary = ingest::summary(rows());
    for gpu in ingest::curate::CURATED_GPUS {
        for op in ["gemm", "attn_prefill", "attn_decode", "moe", "all_reduce", "mla_prefill", "mla_decode"] {
            let n = summary.get(&(gpu.to_string(), op.to_string())).copied().unwrap_or(0);
            assert!(n > 0, "{gpu} has no {op} rows");
        }
    }
    let has = |gpu: &str, op: Op, dt: Dtype| {
        rows().iter().any(|r| r.gpu.as_deref() == Some(gpu) && r.kernel.op == op && r.kernel.dtype == dt)
    };
    for gpu in ["b200_sxm", "gb200", "rtx_pro_6000_server"] {
        assert!(has(gpu, Op::Gemm, Dtype::Fp4), "{gpu} fp4 gemm");
    }
    for gpu in ["a40", "a100_sxm", "h100_sxm"] {
        assert!(has(gpu, Op::Rmsnorm, Dtype::Fp16), "{gpu} vidur rmsnorm");
    }
}

fn latency(gpu: &str, backend: &str, pred: impl Fn(&KernelRow) -> bool) -> f64 {
    let hits: Vec<f64> = rows()
        .iter()
        .filter(|r| r.gpu.as_deref() == Some(gpu) && r.backend.as_deref() == Some(backend) && pred(r))
        .map(|r| r.latency_us.unwrap())
        .collect();
    assert_eq!(hits.len(), 1, "{gpu} {backend}: {hits:?}");
    hits[0]
}

#[test]
fn anchors_from_the_upstream_readme() {
    // bf16 GEMM 8192^3 on H200: 670 TFLOPS -> 2 * 8192^3 / 670e12 s = 1641 us.
    let us = latency("h200_sxm", "vllm-0.24.0", |r| {
        let k = &r.kernel;
        k.op == Op::Gemm && k.dtype == Dtype::Bf16 && (k.m, k.n, k.k) == (8192, 8192, 8192)
    });
    let tflops = 2.0 * 8192f64.powi(3) / (us * 1e-6) / 1e12;
    assert!((tflops / 670.0 - 1.0).abs() < 0.05, "{tflops} TFLOPS");
    // NCCL all-reduce of 64 MiB on 8 H100: bus bandwidth 362 GB/s = bytes * 2(n-1)/n / t.
    let bytes = 64.0 * 1024.0 * 1024.0;
    let t_us = rows()
        .iter()
        .filter(|r| {
            let k = &r.kernel;
            r.gpu.as_deref() == Some("h100_sxm")
                && r.backend.as_deref().is_some_and(|b| b.starts_with("nccl-"))
                && k.op == Op::AllReduce
                && k.dtype == Dtype::Fp16
                && k.num_gpus == 8
                && k.bytes as f64 == bytes
        })
        .map(|r| r.latency_us.unwrap())
        .fold(f64::NAN, f64::min);
    let busbw_gbps = bytes * 2.0 * 7.0 / 8.0 / (t_us * 1e-6) / 1e9;
    assert!((busbw_gbps / 362.0 - 1.0).abs() < 0.10, "{busbw_gbps} GB/s");
}

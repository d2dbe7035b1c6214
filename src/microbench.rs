//! Sweep plans for the GPU microbenchmark collector (`microbench/collect.py`).
//!
//! A plan is a CSV in the shared kernel-shape schema: one row per measurement, with the
//! requested kernel library in `backend` and, for MoE rows, the routing distribution in an
//! extra `routing` column. The collector reads exactly this output and refuses anything else.
//!
//! Two sources of rows:
//! - [`default_plan`]: the model-agnostic sweep (grids over GEMM sizes, attention batch x
//!   length, MoE configurations of public models, elementwise sizes, copies, collectives);
//! - [`model_plan`]: the exact shapes one model runs at a given tensor-parallel degree.

use crate::model::{AttnKind, ModelConfig};
use crate::schema::{write_rows, Dtype, Kernel, KernelRow, Op};
use anyhow::{bail, Result};

/// Routing distributions the collector knows for `moe` rows.
pub const ROUTINGS: [&str; 2] = ["balanced", "power_law_1.2"];

/// GEMM rows (tokens): powers of two from 1 to 16384.
const GEMM_M: [u64; 15] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384];
/// Generic GEMM widths for n and k (every pair is swept).
const GEMM_NK: [u64; 10] = [128, 512, 1024, 2048, 3072, 4096, 6144, 8192, 16384, 32768];
/// (n, k) of common LLM linear layers, hand-derived from public configs:
/// Llama-3.1-8B (hidden 4096, 32/8 heads of 128, inter 14336) at TP1 and TP2;
/// Llama-3.1-70B (hidden 8192, 64/8 heads, inter 28672) at TP1, TP4 and TP8;
/// Qwen3-32B (hidden 5120, 64/8 heads of 128, inter 25600) at TP1 and TP2.
const GEMM_LLM_NK: [(u64, u64); 24] = [
    (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), // 8B TP1
    (3072, 4096), (4096, 2048), (14336, 4096), (4096, 7168), // 8B TP2
    (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672), // 70B TP1
    (2560, 8192), (8192, 2048), (14336, 8192), (8192, 7168), // 70B TP4
    (1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584), // 70B TP8
    (10240, 5120), (5120, 8192), (51200, 5120), (5120, 25600), // Qwen3-32B TP1
];
/// Attention head layouts (num_heads, num_kv_heads, head_dim) per GPU: Llama-8B TP1,
/// Llama-70B / Qwen3-32B TP1, Llama-70B TP8, and a multi-head (no GQA) layout.
const ATTN_HEADS: [(u64, u64, u64); 4] = [(32, 8, 128), (64, 8, 128), (8, 1, 128), (32, 32, 128)];
const PREFILL_BATCH: [u64; 7] = [1, 2, 4, 8, 16, 32, 64];
const PREFILL_SEQ: [u64; 8] = [128, 256, 512, 1024, 2048, 4096, 8192, 16384];
/// Prefill tokens per launch are capped so one launch stays under ~50 ms.
const PREFILL_MAX_TOKENS: u64 = 65536;
const PREFIX_BATCH: [u64; 3] = [1, 4, 16];
const PREFIX_SEQ: [u64; 3] = [128, 512, 2048];
const PREFIX_CACHED: [u64; 3] = [1024, 4096, 16384];
const DECODE_BATCH: [u64; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];
const DECODE_KV: [u64; 9] = [128, 512, 1024, 2048, 4096, 8192, 16384, 32768, 131072];
/// The bf16 K+V cache one decode launch reads is capped at 16 GiB (4 ms at 4 TB/s), which
/// bounds memory and time: 2^22 tokens at 8 KV heads of 128.
const DECODE_MAX_KV_BYTES: u64 = 16 << 30;
/// MoE layers of public models (hidden, expert inter, experts, top-k, tp, ep):
/// Mixtral-8x7B, Qwen3-30B-A3B, Qwen3-235B-A22B (EP1 and EP8), DeepSeek-V3 (EP8), gpt-oss-120b.
const MOE_CONFIGS: [(u64, u64, u64, u64, u64, u64); 6] = [
    (4096, 14336, 8, 2, 1, 1),
    (2048, 768, 128, 8, 1, 1),
    (4096, 1536, 128, 8, 1, 1),
    (4096, 1536, 128, 8, 1, 8),
    (7168, 2048, 256, 8, 1, 8),
    (2880, 2880, 128, 4, 1, 1),
];
const MOE_TOKENS: [u64; 8] = [1, 8, 32, 128, 512, 2048, 8192, 16384];
const ELEM_TOKENS: [u64; 8] = [1, 8, 32, 128, 512, 2048, 8192, 32768];
const NORM_HIDDEN: [u64; 5] = [2048, 4096, 5120, 7168, 8192];
/// SiLU-and-mul output widths (the MLP intermediate size per GPU).
const SILU_WIDTH: [u64; 6] = [768, 1536, 3584, 7168, 14336, 28672];
const ROPE_HEADS: [(u64, u64, u64); 4] = [(32, 8, 128), (64, 8, 128), (8, 1, 128), (16, 4, 128)];
const EMBED_HIDDEN: [u64; 2] = [4096, 8192];
/// Vocabulary of the embedding table (Llama-3) for default embedding rows.
const EMBED_VOCAB: u64 = 128256;
const SAMPLING_TOKENS: [u64; 6] = [1, 8, 32, 128, 512, 2048];
/// Vocabulary sizes: Llama-2, Llama-3, Qwen.
const SAMPLING_VOCAB: [u64; 3] = [32000, 128256, 151936];
/// Top-k of the sampler.
const SAMPLING_TOPK: u64 = 50;
/// Router configurations (hidden, experts, top-k), from the MoE models above.
const ROUTER_CONFIGS: [(u64, u64, u64); 5] =
    [(4096, 8, 2), (2048, 128, 8), (4096, 128, 8), (7168, 256, 8), (2880, 128, 4)];
const COPY_BYTES: [u64; 8] = [1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30, 1 << 31, 1 << 32];
/// Copies this large are also timed eagerly (cudaMemcpyAsync outside a graph), where launch
/// overhead is negligible, to compare with the graph's memcpy node.
const COPY_EAGER_MIN_BYTES: u64 = 1 << 26;
/// Collective message sizes: 1 KiB to 1 GiB in steps of 4x.
const COLL_BYTES: [u64; 11] =
    [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30];
const COLL_OPS: [Op; 5] = [Op::AllReduce, Op::AllGather, Op::ReduceScatter, Op::AllToAll, Op::P2p];
const COLL_GPUS: u64 = 2;

/// One plan row: a kernel, the library to run it with, and the MoE routing ("" otherwise).
fn row(kernel: Kernel, backend: &str, routing: &str) -> KernelRow {
    let mut r = KernelRow::new(kernel);
    r.backend = Some(backend.to_string());
    r.extra = vec![("routing".to_string(), routing.to_string())];
    r
}

fn gemm_rows(out: &mut Vec<KernelRow>, ms: &[u64], nk: &[(u64, u64)], dtypes: &[Dtype]) {
    for &dtype in dtypes {
        let backend = if dtype == Dtype::Fp8 { "cublaslt_scaled_mm" } else { "cublas" };
        for &(n, k) in nk {
            for &m in ms {
                out.push(row(Kernel::gemm(dtype, m, n, k), backend, ""));
            }
        }
    }
}

fn attention(op: Op, batch: u64, seq_len: u64, kv_len: u64, heads: (u64, u64, u64)) -> Kernel {
    let mut k = Kernel::new(op, Dtype::Bf16);
    (k.batch, k.seq_len, k.kv_len) = (batch, seq_len, kv_len);
    (k.num_heads, k.num_kv_heads, k.head_dim) = heads;
    k
}

fn prefill_rows(out: &mut Vec<KernelRow>, heads: &[(u64, u64, u64)], backends: &[&str]) {
    for &h in heads {
        for &b in &PREFILL_BATCH {
            for &s in PREFILL_SEQ.iter().filter(|&&s| b * s <= PREFILL_MAX_TOKENS) {
                for be in backends {
                    out.push(row(attention(Op::AttnPrefill, b, s, 0, h), be, ""));
                }
            }
        }
    }
}

/// Prefill over a cached prefix (flash only: SDPA's cuDNN path has no bottom-right causal mask).
fn prefix_rows(out: &mut Vec<KernelRow>, heads: &[(u64, u64, u64)]) {
    for &h in heads {
        for &b in &PREFIX_BATCH {
            for &s in &PREFIX_SEQ {
                for &p in &PREFIX_CACHED {
                    out.push(row(attention(Op::AttnPrefill, b, s, p, h), "sdpa_flash", ""));
                }
            }
        }
    }
}

fn decode_rows(out: &mut Vec<KernelRow>, heads: &[(u64, u64, u64)]) {
    for &h in heads {
        for &b in &DECODE_BATCH {
            let kv_bytes = |kv: u64| b * kv * h.1 * h.2 * 2 * 2;
            for &kv in DECODE_KV.iter().filter(|&&kv| kv_bytes(kv) <= DECODE_MAX_KV_BYTES) {
                for be in ["triton_paged", "sdpa_flash"] {
                    out.push(row(attention(Op::AttnDecode, b, 0, kv, h), be, ""));
                }
            }
        }
    }
}

fn moe_kernel(tokens: u64, (hidden, inter, experts, topk, tp, ep): (u64, u64, u64, u64, u64, u64)) -> Kernel {
    let mut k = Kernel::new(Op::Moe, Dtype::Bf16);
    (k.num_tokens, k.hidden, k.inter, k.num_experts, k.topk, k.tp, k.ep) =
        (tokens, hidden, inter, experts, topk, tp, ep);
    k
}

fn router_kernel(tokens: u64, (hidden, experts, topk): (u64, u64, u64)) -> Kernel {
    let mut k = Kernel::new(Op::MoeRouter, Dtype::Bf16);
    (k.num_tokens, k.hidden, k.num_experts, k.topk) = (tokens, hidden, experts, topk);
    k
}

/// Elementwise kernel of `num_tokens` rows of width `hidden` (`silu_mul`: output width;
/// `sampling`: vocabulary).
fn elementwise(op: Op, tokens: u64, hidden: u64) -> Kernel {
    let mut k = Kernel::new(op, Dtype::Bf16);
    (k.num_tokens, k.hidden) = (tokens, hidden);
    k
}

fn rope_kernel(tokens: u64, (heads, kv_heads, head_dim): (u64, u64, u64)) -> Kernel {
    let mut k = Kernel::new(Op::Rope, Dtype::Bf16);
    (k.num_tokens, k.num_heads, k.num_kv_heads, k.head_dim) = (tokens, heads, kv_heads, head_dim);
    k
}

fn embedding_kernel(tokens: u64, hidden: u64, vocab: u64) -> Kernel {
    // `n` carries the vocabulary (table rows) for embedding lookups.
    Kernel { n: vocab, ..elementwise(Op::Embedding, tokens, hidden) }
}

fn sampling_kernel(tokens: u64, vocab: u64) -> Kernel {
    Kernel { topk: SAMPLING_TOPK, ..elementwise(Op::Sampling, tokens, vocab) }
}

/// The model-agnostic H200 sweep. Row order is the collector's run order: the sanity
/// anchors (copy, 8192^3 GEMM) come first so a run cut short still has them.
pub fn default_plan() -> Vec<KernelRow> {
    let mut out = Vec::new();
    for &b in &COPY_BYTES {
        let k = Kernel { bytes: b, ..Kernel::new(Op::Copy, Dtype::Bf16) };
        out.push(row(k.clone(), "torch_copy", ""));
        if b >= COPY_EAGER_MIN_BYTES {
            out.push(row(k, "torch_copy_eager", ""));
        }
    }
    out.push(row(Kernel::gemm(Dtype::Bf16, 8192, 8192, 8192), "cublas", ""));
    for &t in &ELEM_TOKENS {
        for &h in &NORM_HIDDEN {
            out.push(row(elementwise(Op::Rmsnorm, t, h), "triton", ""));
            out.push(row(elementwise(Op::FusedAddRmsnorm, t, h), "triton", ""));
            out.push(row(elementwise(Op::Add, t, h), "torch", ""));
        }
        for &w in &SILU_WIDTH {
            out.push(row(elementwise(Op::SiluMul, t, w), "triton", ""));
        }
        for &h in &ROPE_HEADS {
            out.push(row(rope_kernel(t, h), "triton", ""));
        }
        for &h in &EMBED_HIDDEN {
            out.push(row(embedding_kernel(t, h, EMBED_VOCAB), "torch", ""));
        }
        for &c in &ROUTER_CONFIGS {
            out.push(row(router_kernel(t, c), "torch", ""));
        }
    }
    for &t in &SAMPLING_TOKENS {
        for &v in &SAMPLING_VOCAB {
            out.push(row(sampling_kernel(t, v), "torch", ""));
        }
    }
    decode_rows(&mut out, &ATTN_HEADS);
    prefill_rows(&mut out, &ATTN_HEADS, &["sdpa_flash", "sdpa_cudnn"]);
    prefix_rows(&mut out, &ATTN_HEADS[..2]);
    for &c in &MOE_CONFIGS {
        for &t in &MOE_TOKENS {
            for r in ROUTINGS {
                out.push(row(moe_kernel(t, c), "grouped_mm", r));
            }
        }
    }
    let mut nk: Vec<(u64, u64)> = GEMM_NK.iter().flat_map(|&n| GEMM_NK.iter().map(move |&k| (n, k))).collect();
    nk.extend(GEMM_LLM_NK);
    gemm_rows(&mut out, &GEMM_M, &nk, &[Dtype::Bf16, Dtype::Fp8]);
    for op in COLL_OPS {
        for &b in &COLL_BYTES {
            let k = Kernel { bytes: b, num_gpus: COLL_GPUS, ..Kernel::new(op, Dtype::Bf16) };
            out.push(row(k, "nccl", ""));
        }
    }
    out
}

/// Per-GPU widths of one model's linear layers at tensor-parallel degree `tp`.
/// KV heads are replicated when there are fewer of them than GPUs (as vLLM does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpShapes {
    pub heads: u64,
    pub kv_heads: u64,
    /// (n, k) of the fused QKV projection.
    pub qkv: (u64, u64),
    /// (n, k) of the attention output projection.
    pub o: (u64, u64),
    /// (n, k) of the fused gate+up projection of the dense MLP (None: no dense layers).
    pub gate_up: Option<(u64, u64)>,
    /// (n, k) of the dense MLP's down projection.
    pub down: Option<(u64, u64)>,
}

pub fn tp_shapes(m: &ModelConfig, tp: u64) -> Result<TpShapes> {
    if tp == 0 || m.num_heads % tp != 0 {
        bail!("--tp {tp} must divide the {} attention heads of model '{}'", m.num_heads, m.name);
    }
    if m.mla.is_some() {
        bail!("model '{}' uses MLA attention, which this plan generator does not cover yet", m.name);
    }
    let heads = m.num_heads / tp;
    let kv_heads = (m.num_kv_heads / tp).max(1);
    let q_out = heads * m.head_dim * if m.attn_output_gate { 2 } else { 1 };
    let qkv = (q_out + 2 * kv_heads * m.head_dim, m.hidden);
    let o = (m.hidden, heads * m.head_dim);
    let has_dense = m.layers.iter().any(|l| !l.moe) && m.dense_inter > 0;
    let (gate_up, down) = if has_dense {
        if m.dense_inter % tp != 0 {
            bail!("--tp {tp} must divide intermediate_size {} of model '{}'", m.dense_inter, m.name);
        }
        (Some((2 * m.dense_inter / tp, m.hidden)), Some((m.hidden, m.dense_inter / tp)))
    } else {
        (None, None)
    };
    Ok(TpShapes { heads, kv_heads, qkv, o, gate_up, down })
}

/// The exact kernels one model runs per GPU at tensor-parallel degree `tp`, over the same
/// token grids as the default sweep. Sliding-window and linear-attention layers are planned
/// as full attention over the same lengths (the collector has no window kernel yet).
pub fn model_plan(m: &ModelConfig, tp: u64) -> Result<Vec<KernelRow>> {
    let s = tp_shapes(m, tp)?;
    let mut out = Vec::new();
    let mut nk = vec![s.qkv, s.o];
    nk.extend(s.gate_up);
    nk.extend(s.down);
    if let Some(moe) = &m.moe {
        if moe.shared_inter > 0 {
            nk.push((2 * moe.shared_inter / tp, m.hidden));
            nk.push((m.hidden, moe.shared_inter / tp));
        }
    }
    gemm_rows(&mut out, &GEMM_M, &nk, &[Dtype::Bf16, Dtype::Fp8]);
    // lm_head: vocabulary split across GPUs; kept in bf16 by fp8 deployments (and its width
    // per GPU need not be a multiple of 16, which fp8 GEMMs require).
    gemm_rows(&mut out, &GEMM_M, &[(m.vocab.div_ceil(tp), m.hidden)], &[Dtype::Bf16]);
    let heads = (s.heads, s.kv_heads, m.head_dim);
    let has_full_attn = m.layers.iter().any(|l| l.attn != AttnKind::Linear);
    if has_full_attn {
        decode_rows(&mut out, &[heads]);
        prefill_rows(&mut out, &[heads], &["sdpa_flash", "sdpa_cudnn"]);
        prefix_rows(&mut out, &[heads]);
    }
    if let Some(moe) = &m.moe {
        if moe.expert_inter % tp != 0 {
            bail!("--tp {tp} must divide the expert width {} of model '{}'", moe.expert_inter, m.name);
        }
        let cfg = (m.hidden, moe.expert_inter, moe.num_experts, moe.topk, tp, 1);
        for &t in &MOE_TOKENS {
            for r in ROUTINGS {
                out.push(row(moe_kernel(t, cfg), "grouped_mm", r));
            }
            out.push(row(router_kernel(t, (m.hidden, moe.num_experts, moe.topk)), "torch", ""));
        }
    }
    for &t in &ELEM_TOKENS {
        out.push(row(elementwise(Op::Rmsnorm, t, m.hidden), "triton", ""));
        out.push(row(elementwise(Op::FusedAddRmsnorm, t, m.hidden), "triton", ""));
        out.push(row(elementwise(Op::Add, t, m.hidden), "torch", ""));
        if let Some((_, inter)) = s.down {
            out.push(row(elementwise(Op::SiluMul, t, inter), "triton", ""));
        }
        if let Some(moe) = &m.moe {
            if moe.shared_inter > 0 {
                out.push(row(elementwise(Op::SiluMul, t, moe.shared_inter / tp), "triton", ""));
            }
        }
        if has_full_attn {
            out.push(row(rope_kernel(t, heads), "triton", ""));
        }
        out.push(row(embedding_kernel(t, m.hidden, m.vocab.div_ceil(tp)), "torch", ""));
    }
    for &t in &SAMPLING_TOKENS {
        out.push(row(sampling_kernel(t, m.vocab), "torch", ""));
    }
    Ok(out)
}

/// Writes plan rows as shared-schema CSV (the collector's input format).
pub fn write_plan<W: std::io::Write>(w: W, rows: &[KernelRow]) -> Result<()> {
    write_rows(w, rows, &[], |_| vec![])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_row_validates_and_has_a_backend() {
        let rows = default_plan();
        assert!(rows.len() > 1000);
        for r in &rows {
            r.kernel.validate().unwrap();
            assert!(r.backend.is_some());
        }
    }

    #[test]
    fn tp_must_divide_heads() {
        let m = ModelConfig::load("llama-3.1-8b").unwrap();
        let err = tp_shapes(&m, 3).unwrap_err().to_string();
        assert!(err.contains("--tp 3"), "{err}");
    }
}

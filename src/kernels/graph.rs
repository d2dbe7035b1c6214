//! Expands (model, deployment, batch) into the kernels one GPU runs for one forward step.
//!
//! Shapes are per GPU: tensor parallelism splits heads and MLP widths by `tp` (KV heads are
//! replicated when fewer than `tp`), experts are split over `ep` GPUs with each expert's width
//! split over `tp / ep`. Identical layers are emitted once with a repeat count. With pipeline
//! parallelism the list covers all stages, so its total is one micro-batch's latency through the
//! whole pipeline.

use crate::deployment::Deployment;
use crate::model::{AttnKind, ModelConfig, QkNorm};
use crate::perf::graphs::CudaGraphs;
use crate::perf::SeqWork;
use crate::schema::{Dtype, Kernel, Op};
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelInstance {
    /// Where in the model it runs, e.g. `layer[sliding,moe].qkv_proj`.
    pub name: String,
    pub kernel: Kernel,
    /// How many times it runs in the step (e.g. once per identical layer).
    pub count: u64,
    /// The kernel library that implements it where the graph knows (a backend prefix of the
    /// calibrated models, e.g. `torch_repeat_kv`); None: the engine's choice for the op.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub library: Option<&'static str>,
}

fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b.max(1))
}

/// Per-GPU head counts under tensor parallelism.
pub fn heads_per_gpu(model: &ModelConfig, tp: u64) -> (u64, u64) {
    (div_ceil(model.num_heads, tp), div_ceil(model.num_kv_heads, tp).max(1))
}

/// Kernels that depend only on the token count: everything except attention cores.
/// `num_tokens` = new tokens in the step, `num_seqs` = sequences producing logits.
pub fn token_kernels(model: &ModelConfig, dep: &Deployment, num_tokens: u64, num_seqs: u64) -> Vec<KernelInstance> {
    let mut out = Vec::new();
    let t = num_tokens;
    let tp = dep.tp;
    let w = dep.weight_dtype;
    let a = dep.act_dtype_for_elementwise();
    let h = model.hidden;
    let push = |out: &mut Vec<KernelInstance>, name: String, kernel: Kernel, count: u64| {
        if count > 0 {
            out.push(KernelInstance { name, kernel, count, library: None });
        }
    };
    let ew = |op: Op, hidden: u64| Kernel { num_tokens: t, hidden, ..Kernel::new(op, a) };
    push(&mut out, "embedding".into(), ew(Op::Embedding, h), 1);

    for ((attn, moe), count) in layer_groups(model) {
        let tag = format!("layer[{},{}]", attn_tag(attn), if moe { "moe" } else { "dense" });
        push(&mut out, format!("{tag}.input_norm"), ew(Op::FusedAddRmsnorm, h), count);
        match (attn, &model.mla, &model.linear) {
            (AttnKind::Linear, _, Some(l)) => {
                let key = l.num_k_heads * l.k_head_dim;
                let val = l.num_v_heads * l.v_head_dim;
                let n = div_ceil(2 * key + 2 * val + 2 * l.num_v_heads, tp);
                push(&mut out, format!("{tag}.in_proj"), Kernel::gemm(w, t, n, h), count);
                push(&mut out, format!("{tag}.out_proj"), Kernel::gemm(w, t, h, div_ceil(val, tp)), count);
                // gated RMSNorm on the value output
                push(&mut out, format!("{tag}.gated_norm"), ew(Op::Rmsnorm, div_ceil(val, tp)), count);
            }
            (_, Some(m), _) => {
                let heads = div_ceil(model.num_heads, tp);
                let qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
                match m.q_lora_rank {
                    Some(r) => {
                        push(&mut out, format!("{tag}.q_a_proj"), Kernel::gemm(w, t, r, h), count);
                        push(&mut out, format!("{tag}.q_b_proj"), Kernel::gemm(w, t, heads * qk, r), count);
                    }
                    None => push(&mut out, format!("{tag}.q_proj"), Kernel::gemm(w, t, heads * qk, h), count),
                }
                push(&mut out, format!("{tag}.kv_a_proj"), Kernel::gemm(w, t, m.kv_lora_rank + m.qk_rope_head_dim, h), count);
                // kv_b: decompress latent to per-head K_nope and V (absorbed into q/o for decode;
                // same weight bytes and similar FLOPs either way).
                push(&mut out, format!("{tag}.kv_b_proj"), Kernel::gemm(w, t, heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank), count);
                push(&mut out, format!("{tag}.rope"), Kernel { num_tokens: t, num_heads: heads, num_kv_heads: 1, head_dim: m.qk_rope_head_dim, ..Kernel::new(Op::Rope, a) }, count);
                push(&mut out, format!("{tag}.o_proj"), Kernel::gemm(w, t, h, heads * m.v_head_dim), count);
            }
            _ => {
                let (hq, hkv) = heads_per_gpu(model, tp);
                let gate = if model.attn_output_gate { 2 } else { 1 };
                let n = (gate * hq + 2 * hkv) * model.head_dim;
                push(&mut out, format!("{tag}.qkv_proj"), Kernel::gemm(w, t, n, h), count);
                match model.qk_norm {
                    QkNorm::None => {}
                    QkNorm::PerHead => {
                        let k = Kernel { num_tokens: t * (hq + hkv), hidden: model.head_dim, ..Kernel::new(Op::Rmsnorm, a) };
                        push(&mut out, format!("{tag}.qk_norm"), k, count);
                    }
                    QkNorm::WholeWidth => {
                        // A token's slice of q and k on this rank, normalized together; the two
                        // fp32 sums of squares per token are summed over the TP group first.
                        let k = Kernel { num_tokens: t, hidden: (hq + hkv) * model.head_dim, ..Kernel::new(Op::Rmsnorm, a) };
                        push(&mut out, format!("{tag}.qk_norm"), k, count);
                        if tp > 1 {
                            let ar = Kernel { bytes: t * 2 * 4, num_gpus: tp, ..Kernel::new(Op::AllReduce, Dtype::Fp32) };
                            push(&mut out, format!("{tag}.qk_norm_all_reduce"), ar, count);
                        }
                    }
                }
                push(&mut out, format!("{tag}.rope"), Kernel { num_tokens: t, num_heads: hq, num_kv_heads: hkv, head_dim: model.head_dim, ..Kernel::new(Op::Rope, a) }, count);
                push(&mut out, format!("{tag}.o_proj"), Kernel::gemm(w, t, h, hq * model.head_dim), count);
            }
        }
        if tp > 1 {
            let ar = Kernel { bytes: t * h * 2, num_gpus: tp, ..Kernel::new(Op::AllReduce, Dtype::Bf16) };
            push(&mut out, format!("{tag}.attn_all_reduce"), ar, count);
        }
        push(&mut out, format!("{tag}.post_attn_norm"), ew(Op::FusedAddRmsnorm, h), count);
        // Sandwich norms (Gemma: after attention and after the MLP as well).
        push(&mut out, format!("{tag}.extra_norms"), ew(Op::Rmsnorm, h), count * model.norms_per_layer.saturating_sub(2));
        if moe {
            let m = model.moe.as_ref().expect("moe layer without spec");
            let router_dtype = if m.router_fp32 { Dtype::Fp32 } else { a };
            let router = Kernel { num_tokens: t, hidden: h, num_experts: m.num_experts, topk: m.topk, ..Kernel::new(Op::MoeRouter, router_dtype) };
            push(&mut out, format!("{tag}.router"), router, count);
            let experts = Kernel {
                num_tokens: t,
                hidden: h,
                inter: m.expert_inter,
                topk: m.topk,
                num_experts: m.num_experts,
                tp: tp / dep.ep,
                ep: dep.ep,
                ..Kernel::new(Op::Moe, w)
            };
            push(&mut out, format!("{tag}.experts"), experts, count);
            if m.shared_inter > 0 {
                let si = div_ceil(m.shared_inter, tp);
                push(&mut out, format!("{tag}.shared_gate_up"), Kernel::gemm(w, t, 2 * si, h), count);
                push(&mut out, format!("{tag}.shared_act"), ew(Op::SiluMul, si), count);
                push(&mut out, format!("{tag}.shared_down"), Kernel::gemm(w, t, h, si), count);
            }
        } else {
            let i = div_ceil(model.dense_inter, tp);
            push(&mut out, format!("{tag}.gate_up_proj"), Kernel::gemm(w, t, 2 * i, h), count);
            push(&mut out, format!("{tag}.act"), ew(Op::SiluMul, i), count);
            push(&mut out, format!("{tag}.down_proj"), Kernel::gemm(w, t, h, i), count);
        }
        if tp > 1 {
            let ar = Kernel { bytes: t * h * 2, num_gpus: tp, ..Kernel::new(Op::AllReduce, Dtype::Bf16) };
            push(&mut out, format!("{tag}.mlp_all_reduce"), ar, count);
        }
    }
    if dep.pp > 1 {
        let p2p = Kernel { bytes: t * h * 2, num_gpus: 2, ..Kernel::new(Op::P2p, Dtype::Bf16) };
        push(&mut out, "pp_send_recv".into(), p2p, dep.pp - 1);
    }
    if num_seqs > 0 {
        push(&mut out, "final_norm".into(), Kernel { num_tokens: num_seqs, hidden: h, ..Kernel::new(Op::Rmsnorm, a) }, 1);
        // lm_head stays in bf16 in quantized checkpoints.
        let head_dtype = if w.is_quantized() { Dtype::Bf16 } else { w };
        push(&mut out, "lm_head".into(), Kernel::gemm(head_dtype, num_seqs, div_ceil(model.vocab, tp), h), 1);
        if tp > 1 {
            let ag = Kernel { bytes: num_seqs * model.vocab * 2, num_gpus: tp, ..Kernel::new(Op::AllGather, Dtype::Bf16) };
            push(&mut out, "logits_all_gather".into(), ag, 1);
        }
        push(&mut out, "sampling".into(), Kernel { num_tokens: num_seqs, hidden: model.vocab, ..Kernel::new(Op::Sampling, Dtype::Fp32) }, 1);
    }
    out
}

/// The graph with its fused kernels as the separate modules of transformers' Llama-family
/// layers: `qkv_proj` as q, k and v, `gate_up_proj` (and a shared expert's) as gate and up, the
/// `qk_norm` as q_norm and k_norm. Same FLOPs and bytes; more, narrower launches. transformers
/// runs every router in the weights' dtype (vLLM's fp32 MiniMax gate is vLLM's).
pub fn split_modules(kernels: Vec<KernelInstance>, model: &ModelConfig, dep: &Deployment) -> Vec<KernelInstance> {
    let (hq, hkv) = heads_per_gpu(model, dep.tp);
    let d = model.head_dim;
    let mut out = Vec::with_capacity(kernels.len() + kernels.len() / 2);
    for ki in kernels {
        let name = &ki.name[ki.name.rfind('.').map_or(0, |i| i + 1)..];
        let t = ki.kernel.num_tokens;
        let parts: Vec<(&str, Kernel)> = match name {
            "qkv_proj" => {
                let q = ki.kernel.n - 2 * hkv * d;
                debug_assert!(q % (hq * d) == 0, "qkv_proj width {} is not q + k + v", ki.kernel.n);
                [("q_proj", q), ("k_proj", hkv * d), ("v_proj", hkv * d)].map(|(p, n)| (p, Kernel { n, ..ki.kernel.clone() })).to_vec()
            }
            "gate_up_proj" | "shared_gate_up" => {
                let (gate, up) = if name == "shared_gate_up" { ("shared_gate", "shared_up") } else { ("gate_proj", "up_proj") };
                let half = Kernel { n: ki.kernel.n / 2, ..ki.kernel.clone() };
                vec![(gate, half.clone()), (up, half)]
            }
            "router" if ki.kernel.dtype == Dtype::Fp32 => {
                out.push(KernelInstance { kernel: Kernel { dtype: dep.act_dtype_for_elementwise(), ..ki.kernel }, ..ki });
                continue;
            }
            "qk_norm" if model.qk_norm == QkNorm::WholeWidth => {
                [("q_norm", hq), ("k_norm", hkv)].map(|(p, h)| (p, Kernel { hidden: h * d, ..ki.kernel.clone() })).to_vec()
            }
            "qk_norm" => {
                let per_head = t / (hq + hkv);
                [("q_norm", hq), ("k_norm", hkv)].map(|(p, h)| (p, Kernel { num_tokens: per_head * h, ..ki.kernel.clone() })).to_vec()
            }
            _ => {
                out.push(ki);
                continue;
            }
        };
        let tag = &ki.name[..ki.name.len() - name.len()];
        for (part, kernel) in parts {
            out.push(KernelInstance { name: format!("{tag}{part}"), kernel, count: ki.count, library: ki.library });
        }
    }
    out
}

/// Attention-core kernels (the part that depends on each sequence's context length).
pub fn attention_kernels(model: &ModelConfig, dep: &Deployment, seqs: &[SeqWork]) -> Vec<KernelInstance> {
    let mut out = Vec::new();
    let (hq, hkv) = heads_per_gpu(model, dep.tp);
    let a = dep.act_dtype_for_elementwise();
    let kv_dtype = dep.kv_dtype;
    // Group prefill chunks by (new, cached) so identical chunks share one kernel.
    let mut prefills: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    let mut decodes: Vec<u32> = Vec::new();
    for s in seqs {
        if s.new_tokens == 1 && s.cached_tokens > 0 {
            decodes.push(s.cached_tokens + 1);
        } else {
            *prefills.entry((s.new_tokens, s.cached_tokens)).or_default() += 1;
        }
    }
    let num_seqs = seqs.len() as u64;
    let total_tokens: u64 = seqs.iter().map(|s| s.new_tokens as u64).sum();
    for (attn, count) in attention_groups(model) {
        let tag = format!("layer[{}]", attn_tag(attn));
        let window = match attn {
            AttnKind::Sliding { window } => window,
            _ => 0,
        };
        if attn == AttnKind::Linear {
            let l = model.linear.as_ref().expect("linear layer without spec");
            let k = Kernel {
                num_tokens: total_tokens,
                batch: num_seqs,
                num_heads: div_ceil(l.num_v_heads, dep.tp),
                num_kv_heads: div_ceil(l.num_k_heads, dep.tp).max(1),
                head_dim: l.k_head_dim,
                ..Kernel::new(Op::LinearAttn, a)
            };
            out.push(KernelInstance { name: format!("{tag}.gated_delta_rule"), kernel: k, count, library: None });
            continue;
        }
        let (prefill_op, decode_op, heads, kv_heads, head_dim) = match &model.mla {
            Some(m) => (Op::MlaPrefill, Op::MlaDecode, hq, 1, m.kv_lora_rank + m.qk_rope_head_dim),
            None => (Op::AttnPrefill, Op::AttnDecode, hq, hkv, model.head_dim),
        };
        for (&(new, cached), &n) in &prefills {
            let k = Kernel {
                batch: n,
                seq_len: new as u64,
                kv_len: cached as u64,
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim,
                window,
                kv_dtype: Some(kv_dtype),
                ..Kernel::new(prefill_op, a)
            };
            out.push(KernelInstance { name: format!("{tag}.attn_prefill"), kernel: k, count, library: None });
        }
        if !decodes.is_empty() {
            // Decode cost is linear in each sequence's (window-capped) KV length: one kernel
            // with the mean length has the same FLOPs and bytes.
            let capped: u64 = decodes.iter().map(|&l| if window > 0 { (l as u64).min(window) } else { l as u64 }).sum();
            let mean = div_ceil(capped, decodes.len() as u64);
            let k = Kernel {
                batch: decodes.len() as u64,
                kv_len: mean,
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim,
                kv_dtype: Some(kv_dtype),
                ..Kernel::new(decode_op, a)
            };
            out.push(KernelInstance { name: format!("{tag}.attn_decode"), kernel: k, count, library: None });
        }
    }
    out
}

fn attn_tag(a: AttnKind) -> String {
    match a {
        AttnKind::Full => "full".into(),
        AttnKind::Sliding { window } => format!("sliding{window}"),
        AttnKind::Linear => "linear".into(),
    }
}

/// Layers grouped by (attention kind, moe), in first-appearance order, with counts.
/// Library that prices an engine's KV-cache write kernel (vLLM's `reshape_and_cache_flash`,
/// `concat_and_cache_mla`: each new token's K and V rows into the cache slots its slot mapping
/// names) and its per-step input preparation kernels (slot mappings, positions, block-table
/// gather, token combine: small indexed gathers and scatters): torch's `index_copy_` of rows into
/// random slots of a paged cache, measured on the H200 from 2 to 16,384 tokens (2.2-2.8 us up to
/// 256 tokens; vLLM's own write of 12 decode tokens: 2.3 us, its ~20 preparation kernels ~40 us).
pub const ENGINE_STEP_LIBRARY: &str = "torch_index_copy";

/// Every library the graph itself pins on an instance (the rest are the engine's choice per op),
/// so that an engine profile can name them (`EngineParams::host_ops`).
pub const INSTANCE_LIBRARIES: [&str; 6] =
    [ENGINE_STEP_LIBRARY, "torch_index_select", "torch_masked_scatter", "torch_repeat_kv", crate::calibrate::model::EAGER_SINKS_BACKEND, BATCHED_EXPERTS_LIBRARY];

/// The experts of a decode step as transformers' `generate` runs them (batched_mm: a gather of
/// each token's experts' weights, then one bmm), priced piece by piece by the predictor
/// (`EngineParams::decode_batched_experts`).
pub const BATCHED_EXPERTS_LIBRARY: &str = "hf_batched_mm";

/// Bytes one input-preparation kernel moves (`step_prep_kernels`): a few KB, so its time is
/// the library's launch floor on any GPU.
const STEP_PREP_BYTES: u64 = 4096;

/// Kernels an engine runs around the model in every step: the KV-cache write of each attention
/// layer as a kernel of its own (`kv_write`; engines that fuse it into RoPE or attention run
/// none) over the step's `num_tokens` new tokens, and `prep_kernels` input-preparation kernels.
pub fn engine_step_kernels(model: &ModelConfig, dep: &Deployment, num_tokens: u64, kv_write: bool, prep_kernels: u32) -> Vec<KernelInstance> {
    let mut out = Vec::new();
    if kv_write && num_tokens > 0 {
        for (attn, count) in attention_groups(model).into_iter().filter(|(a, _)| *a != AttnKind::Linear) {
            let bytes_per_token = super::memory::kv_bytes_per_token_layer_per_gpu(model, dep, attn);
            let kernel = Kernel { bytes: (num_tokens as f64 * bytes_per_token) as u64, ..Kernel::new(Op::Copy, dep.kv_dtype) };
            out.push(KernelInstance { name: format!("layer[{}].kv_cache_write", attn_tag(attn)), kernel, count, library: Some(ENGINE_STEP_LIBRARY) });
        }
    }
    if prep_kernels > 0 {
        let kernel = Kernel { bytes: STEP_PREP_BYTES, ..Kernel::new(Op::Copy, Dtype::Bf16) };
        out.push(KernelInstance { name: "step_input_prep".into(), kernel, count: prep_kernels as u64, library: Some(ENGINE_STEP_LIBRARY) });
    }
    out
}

fn layer_groups(model: &ModelConfig) -> Vec<((AttnKind, bool), u64)> {
    let mut groups: Vec<((AttnKind, bool), u64)> = Vec::new();
    for l in &model.layers {
        match groups.iter_mut().find(|(k, _)| *k == (l.attn, l.moe)) {
            Some((_, c)) => *c += 1,
            None => groups.push(((l.attn, l.moe), 1)),
        }
    }
    groups
}

fn attention_groups(model: &ModelConfig) -> Vec<(AttnKind, u64)> {
    let mut groups: Vec<(AttnKind, u64)> = Vec::new();
    for l in &model.layers {
        match groups.iter_mut().find(|(k, _)| *k == l.attn) {
            Some((_, c)) => *c += 1,
            None => groups.push((l.attn, 1)),
        }
    }
    groups
}

/// How an engine runs attention over a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionImpl {
    /// One varlen/paged kernel: each sequence attends its own KV (vLLM, SGLang, TRT-LLM).
    #[default]
    PerSequence,
    /// transformers continuous batching with `paged|sdpa`: each layer gathers the KV of every
    /// scheduled request into one packed sequence, repeats KV heads up to the query heads, and
    /// runs one SDPA of all query tokens against all gathered keys with a dense additive mask
    /// (block-diagonal causal), `is_causal=False`: cuDNN's masked flash kernel on Hopper,
    /// which does the whole (queries x keys) product. Work grows with (sum of queries) x (sum of keys).
    PackedSdpa,
}

/// Lengths of one packed-SDPA step: query tokens, and per attention group (kind, layers) the
/// keys each layer attends. transformers keeps one read index `[layer groups, keys]` for all
/// groups, so every group attends the longest group's keys (sliding layers cap each request's
/// read at the window, but pad up to the full layers' length). With `pad` (CUDA graphs) the
/// queries and the KV read are padded as the engine pads them.
pub fn packed_lengths(model: &ModelConfig, seqs: &[SeqWork], pad: Option<&CudaGraphs>) -> (u64, Vec<(AttnKind, u64, u64)>) {
    let q_raw: u64 = seqs.iter().map(|s| s.new_tokens as u64).sum();
    let q = pad.map_or(q_raw, |g| g.pad_q(q_raw));
    let groups = attention_groups(model);
    let read = groups
        .iter()
        .map(|&(attn, _)| {
            let window = match attn {
                AttnKind::Sliding { window } => window,
                _ => 0,
            };
            seqs.iter().map(|s| if window > 0 { (s.cached_tokens as u64).min(window) } else { s.cached_tokens as u64 }).sum::<u64>()
        })
        .max()
        .unwrap_or(0);
    let read = pad.map_or(read, |g| g.pad_kv(read));
    (q, groups.into_iter().map(|(attn, count)| (attn, count, read + q)).collect())
}

/// The longest key sequence of the step per attention type, as transformers counts it
/// (`get_seqlens_k`): full attention reads all cached keys plus the new ones, sliding attention
/// at most `window - 1` cached ones plus the new ones. Full first, then sliding; types the model
/// does not have are left out.
pub fn max_seqlen_k(model: &ModelConfig, seqs: &[SeqWork]) -> Vec<u64> {
    let longest = |cap: u64| seqs.iter().map(|s| s.new_tokens as u64 + (s.cached_tokens as u64).min(cap)).max().unwrap_or(0);
    let groups = attention_groups(model);
    let mut out = Vec::new();
    if groups.iter().any(|(k, _)| *k == AttnKind::Full) {
        out.push(longest(u64::MAX));
    }
    if let Some(window) = groups.iter().find_map(|(k, _)| match k {
        AttnKind::Sliding { window } => Some(*window),
        _ => None,
    }) {
        out.push(longest(window.saturating_sub(1)));
    }
    out
}

/// Attention of the `PackedSdpa` implementation, as the kernels it really runs: the gather of
/// the scheduled requests' KV from the paged cache, the repeat of KV heads up to the query
/// heads (a copy), and one masked cuDNN attention (batch 1, `seq_len` = queries, `kv_len` =
/// keys before them) whose time the calibrated model knows as backend `sdpa_cudnn_masked`;
/// models with attention sinks run the eager math path instead (backend `torch_eager_sinks`).
pub fn packed_sdpa_kernels(model: &ModelConfig, dep: &Deployment, seqs: &[SeqWork], pad: Option<&CudaGraphs>) -> Vec<KernelInstance> {
    let mut out = Vec::new();
    let (hq, hkv) = heads_per_gpu(model, dep.tp);
    let a = dep.act_dtype_for_elementwise();
    let (q, groups) = packed_lengths(model, seqs, pad);
    for (attn, count, keys) in groups {
        if attn == AttnKind::Linear {
            out.extend(attention_kernels(model, dep, seqs).into_iter().filter(|k| k.kernel.op == Op::LinearAttn).take(1));
            continue;
        }
        let (d, kv_heads) = match &model.mla {
            Some(m) => (m.qk_nope_head_dim + m.qk_rope_head_dim, hq),
            None => (model.head_dim, hkv),
        };
        let tag = format!("layer[{}]", attn_tag(attn));
        // K and V each: gathered from the cache, repeated to the query heads (a strided copy
        // even without GQA, `.contiguous()` of the transposed view), and on sliding layers
        // new tokens masked-scattered into the read KV. `bytes` is each op's output.
        let tensor = |heads: u64| Kernel { bytes: keys * heads * d * a.bytes() as u64, ..Kernel::new(Op::Copy, a) };
        let mut copy = |name: &str, kernel: Kernel, library: &'static str| {
            out.push(KernelInstance { name: format!("{tag}.{name}"), kernel, count: 2 * count, library: Some(library) });
        };
        copy("kv_gather", tensor(kv_heads), "torch_index_select");
        if matches!(attn, AttnKind::Sliding { .. }) {
            copy("kv_masked_scatter", tensor(kv_heads), "torch_masked_scatter");
        }
        if model.attention_sinks {
            // SDPA has no sinks: transformers runs `paged|eager`, the math path (repeat_kv,
            // QK^T, mask add, sink concat, softmax, an unaligned PV GEMM), timed as one op by
            // the calibrated model from `microbench/data/h200_sxm/h200_sxm_eager_sinks.csv`.
            let k = Kernel { batch: 1, seq_len: q, kv_len: keys - q, num_heads: hq, num_kv_heads: kv_heads, head_dim: d, ..Kernel::new(Op::AttnPrefill, a) };
            out.push(KernelInstance { name: format!("{tag}.eager_sinks_attention"), kernel: k, count, library: Some(crate::calibrate::model::EAGER_SINKS_BACKEND) });
            continue;
        }
        copy("kv_repeat", tensor(hq), "torch_repeat_kv");
        let k = Kernel { batch: 1, seq_len: q, kv_len: keys - q, num_heads: hq, num_kv_heads: hq, head_dim: d, ..Kernel::new(Op::AttnPrefill, a) };
        out.push(KernelInstance { name: format!("{tag}.packed_masked_sdpa"), kernel: k, count, library: None });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::graphs::GraphPadding;

    fn decode(n: usize, cached: u32) -> Vec<SeqWork> {
        vec![SeqWork { new_tokens: 1, cached_tokens: cached }; n]
    }

    #[test]
    fn separate_modules_keep_flops_and_weights_in_more_launches() {
        let m = ModelConfig::load("qwen3-8b").unwrap();
        let dep = Deployment::default();
        let fused = token_kernels(&m, &dep, 64, 8);
        let split = split_modules(fused.clone(), &m, &dep);
        let gemms = |ks: &[KernelInstance]| -> (u64, f64, f64) {
            let g: Vec<_> = ks.iter().filter(|k| k.kernel.op == Op::Gemm).collect();
            let n: u64 = g.iter().map(|k| k.count).sum();
            let flops: f64 = g.iter().map(|k| (k.kernel.m * k.kernel.n * k.kernel.k * k.count) as f64).sum();
            let weights: f64 = g.iter().map(|k| (k.kernel.n * k.kernel.k * k.count) as f64).sum();
            (n, flops, weights)
        };
        let (nf, ff, wf) = gemms(&fused);
        let (ns, fs, ws) = gemms(&split);
        // q, k, v, o, gate, up, down per layer instead of qkv, o, gate_up, down.
        assert_eq!(ns - nf, 3 * m.num_layers);
        assert_eq!((ff, wf), (fs, ws));
        let k_proj = split.iter().find(|k| k.name.ends_with(".k_proj")).unwrap();
        assert_eq!(k_proj.kernel.n, m.num_kv_heads * m.head_dim);
        // The per-head norms are two modules, over query heads and over key heads.
        let q = split.iter().find(|k| k.name.ends_with(".q_norm")).unwrap();
        let k = split.iter().find(|k| k.name.ends_with(".k_norm")).unwrap();
        assert_eq!((q.kernel.num_tokens, k.kernel.num_tokens), (64 * m.num_heads, 64 * m.num_kv_heads));
    }

    #[test]
    fn whole_width_qk_norm_all_reduces_its_sums_of_squares_under_tp() {
        let m = ModelConfig::load("minimax-m2.5").unwrap();
        let find = |ks: &[KernelInstance], suffix: &str| ks.iter().find(|k| k.name.ends_with(suffix)).cloned();
        let tp4 = Deployment { tp: 4, ep: 4, ..Deployment::default() };
        let ks = token_kernels(&m, &tp4, 64, 8);
        // 48 / 4 query heads and 8 / 4 key heads of 128 on each rank, normalized per token.
        let norm = find(&ks, ".qk_norm").unwrap();
        assert_eq!((norm.kernel.num_tokens, norm.kernel.hidden, norm.count), (64, (12 + 2) * 128, 62));
        // Two fp32 sums of squares per token cross the TP group once per layer.
        let ar = find(&ks, ".qk_norm_all_reduce").unwrap();
        assert_eq!((ar.kernel.bytes, ar.kernel.num_gpus, ar.kernel.dtype, ar.count), (64 * 2 * 4, 4, Dtype::Fp32, 62));
        // The gate is an fp32 GEMM.
        assert_eq!(find(&ks, ".router").unwrap().kernel.dtype, Dtype::Fp32);
        // One GPU holds the whole width: nothing to reduce.
        let tp1 = token_kernels(&m, &Deployment::default(), 64, 8);
        assert_eq!(find(&tp1, ".qk_norm").unwrap().kernel.hidden, (48 + 8) * 128);
        assert!(find(&tp1, ".qk_norm_all_reduce").is_none());
        // As transformers' modules: a query norm and a key norm over the same tokens, and the
        // gate in the weights' dtype.
        let split = split_modules(ks, &m, &tp4);
        let (q, k) = (find(&split, ".q_norm").unwrap(), find(&split, ".k_norm").unwrap());
        assert_eq!((q.kernel.num_tokens, q.kernel.hidden, k.kernel.hidden), (64, 12 * 128, 2 * 128));
        assert_eq!(find(&split, ".router").unwrap().kernel.dtype, Dtype::Bf16);
    }

    #[test]
    fn longest_key_sequence_per_attention_type() {
        let seqs = [SeqWork { new_tokens: 1, cached_tokens: 5000 }, SeqWork { new_tokens: 300, cached_tokens: 0 }];
        let llama = ModelConfig::load("llama-3.1-8b").unwrap();
        assert_eq!(max_seqlen_k(&llama, &seqs), vec![5001]);
        // gemma-3: full layers and 1024-token sliding windows; mistral: sliding layers only.
        let gemma = ModelConfig::load("gemma-3-27b-it").unwrap();
        assert_eq!(max_seqlen_k(&gemma, &seqs), vec![5001, 1024]);
        let mistral = ModelConfig::load("mistral-7b-v0.1").unwrap();
        assert_eq!(max_seqlen_k(&mistral, &seqs), vec![4096]);
    }

    #[test]
    fn packed_attention_sums_queries_and_keys_and_pads_them() {
        let m = ModelConfig::load("llama-3.1-8b").unwrap();
        // 8 decoding requests with 500 cached tokens each: 8 queries against 4000 + 8 keys.
        let (q, groups) = packed_lengths(&m, &decode(8, 500), None);
        assert_eq!(q, 8);
        assert_eq!(groups, vec![(AttnKind::Full, 32, 4008)]);
        // CUDA graphs pad queries to 64 and the KV read to 16384 (here below the cache size).
        let g = CudaGraphs::new(GraphPadding { q_tokens: 64, kv_tokens: 16384, seqlen_k_pow2_min: Some(1024), replay_gap_per_kernel_ns: None }, 8192, 98304);
        let (q, groups) = packed_lengths(&m, &decode(8, 500), Some(&g));
        assert_eq!((q, groups[0].2), (64, 16384 + 64));
        let ks = packed_sdpa_kernels(&m, &Deployment::default(), &decode(8, 500), Some(&g));
        let attn = ks.iter().find(|k| k.kernel.op == Op::AttnPrefill).unwrap();
        // KV heads are repeated up to the 32 query heads before one batch-1 SDPA.
        assert_eq!((attn.kernel.batch, attn.kernel.seq_len, attn.kernel.kv_len, attn.kernel.num_kv_heads), (1, 64, 16384, 32));
        let repeat = ks.iter().find(|k| k.name.ends_with("kv_repeat")).unwrap();
        // K and V, 32 layers; each copy writes keys x 32 heads x 128 dims in bf16.
        assert_eq!((repeat.count, repeat.kernel.bytes, repeat.library), (64, (16384 + 64) * 32 * 128 * 2, Some("torch_repeat_kv")));
    }

    #[test]
    fn sliding_layers_attend_the_longest_groups_keys_and_pay_the_scatter() {
        let m = ModelConfig::load("gemma-3-27b-it").unwrap();
        let window = m.layers.iter().find_map(|l| match l.attn {
            AttnKind::Sliding { window } => Some(window),
            _ => None,
        });
        let window = window.expect("gemma-3 has sliding layers");
        // Requests longer than the window: sliding layers read at most the window each, but the
        // one read index makes them attend as many keys as the full layers.
        let seqs = decode(4, (window * 3) as u32);
        let (_, groups) = packed_lengths(&m, &seqs, None);
        assert!(groups.len() == 2 && groups.iter().all(|g| g.2 == 4 * window * 3 + 4), "{groups:?}");
        let ks = packed_sdpa_kernels(&m, &Deployment::default(), &seqs, None);
        let scatter: Vec<_> = ks.iter().filter(|k| k.name.ends_with("kv_masked_scatter")).collect();
        assert_eq!(scatter.len(), 1, "only the sliding group scatters");
        assert!(scatter[0].name.contains("sliding"));
        assert!(ks.iter().filter_map(|k| k.library).all(|l| INSTANCE_LIBRARIES.contains(&l)), "a pinned library missing from INSTANCE_LIBRARIES");
    }

    #[test]
    fn attention_sinks_run_the_math_path() {
        // gpt-oss has attention sinks, which SDPA cannot take: transformers runs its eager math
        // path, measured as one op (library torch_eager_sinks) over the KV heads it repeats itself.
        let m = ModelConfig::load("gpt-oss-20b").unwrap();
        assert!(m.attention_sinks);
        let ks = packed_sdpa_kernels(&m, &Deployment::default(), &decode(4, 100), None);
        let (hq, hkv) = heads_per_gpu(&m, 1);
        let attn: Vec<_> = ks.iter().filter(|k| k.kernel.op == Op::AttnPrefill).collect();
        assert!(!attn.is_empty() && attn.iter().all(|k| k.library == Some("torch_eager_sinks")));
        // 4 queries against 4 + 400 keys, KV heads not yet repeated; no separate repeat copy.
        assert_eq!((attn[0].kernel.seq_len, attn[0].kernel.kv_len, attn[0].kernel.num_heads, attn[0].kernel.num_kv_heads), (4, 400, hq, hkv));
        assert!(ks.iter().all(|k| !k.name.ends_with("kv_repeat")));
        assert!(ks.iter().filter_map(|k| k.library).all(|l| INSTANCE_LIBRARIES.contains(&l)), "a pinned library missing from INSTANCE_LIBRARIES");
    }
}

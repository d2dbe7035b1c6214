//! Fused MoE (routing + gate/up GEMM + SwiGLU + down GEMM), bf16/FP8 block-scale/FP8
//! per-tensor/FP4 weights, with all experts local or an expert-parallel shard.

use super::{fp4_weight_bytes, narrowest, Counts, Ctx, WorkCost};
use crate::headroom::bound::OpClass;
use crate::kernels::cost::expected_active_experts;
use anyhow::{anyhow, Result};

/// `top_k` from the axes, else from the definition name (`..._topk8_...`).
fn top_k(c: &Ctx) -> Result<(f64, Option<String>)> {
    if let Some(k) = c.shape.opt("top_k") {
        return Ok((k as f64, None));
    }
    let name = &c.def.name;
    let digits: String = name
        .split("topk")
        .nth(1)
        .map(|rest| rest.chars().take_while(|ch| ch.is_ascii_digit()).collect())
        .unwrap_or_default();
    let k: u64 = digits.parse().map_err(|_| {
        anyhow!("definition '{name}' (moe) has no 'top_k' axis and its name carries no 'topk<N>'")
    })?;
    Ok((k as f64, Some(format!("top_k = {k} taken from the definition name (no 'top_k' axis)"))))
}

pub(super) fn moe(c: &Ctx) -> Result<WorkCost> {
    let t = c.axis("seq_len")?;
    let (h, inter) = (c.axis("hidden_size")?, c.axis("intermediate_size")?);
    let g1 = c.shape.opt("gemm1_out_size").map(|v| v as f64).unwrap_or(2.0 * inter);
    let local = c.shape.opt("num_local_experts").or(c.shape.opt("num_experts"));
    let global = c.shape.opt("num_experts").or(c.shape.opt("num_local_experts"));
    let (e_local, e_global) = match (local, global) {
        (Some(l), Some(g)) => (l as f64, g as f64),
        _ => return Err(anyhow!("definition '{}' (moe) lacks axis 'num_experts' or 'num_local_experts'", c.def.name)),
    };
    let (k, k_note) = top_k(c)?;
    let mut notes: Vec<String> = k_note.into_iter().collect();

    // Expert tensors: weights (and their block scales) with a leading expert axis.
    let mut per_expert = 0.0;
    let mut expert_tensors = Vec::new();
    for (name, tensor) in &c.def.inputs {
        let lead = tensor.shape.as_ref().and_then(|s| if s.len() >= 2 { s.first() } else { None });
        if let Some(axis) = lead.filter(|a| *a == "num_local_experts" || *a == "num_experts") {
            per_expert += c.bytes_of(name)? / c.axis(axis)?;
            expert_tensors.push(name.as_str());
            if let Some(b) = fp4_weight_bytes(c.def, name) {
                if b < super::dtype_bytes(&tensor.dtype).unwrap_or(0.0) {
                    notes.push(format!("{name} declared {} but counted as packed FP4 ({b} B/element) per the quantization tag", tensor.dtype));
                }
            }
        }
    }
    let io = c.io_bytes_except(&expert_tensors);

    // Local (token, expert) assignments and distinct local experts touched.
    let all_local = e_local >= e_global;
    let routed = |a: f64| expected_active_experts(e_local, a).min(e_local);
    let (a_lo, a_nom, touched_lo, touched_nom) = if all_local {
        let a = t * k;
        (a, a, if t >= 1.0 { k.min(e_local) } else { 0.0 }, routed(a))
    } else {
        let a_nom = t * k * e_local / e_global;
        notes.push(format!(
            "expert-parallel shard: {e_local} of {e_global} experts are local; the bound allows every token to be routed elsewhere, nominal assumes uniform routing"
        ));
        (0.0, a_nom, 0.0, routed(a_nom))
    };
    let flops = |a: f64| 2.0 * a * h * g1 + 2.0 * a * inter * h;
    let routing_input = if c.has("topk_ids") { "topk_ids" } else { "routing_logits" };
    let dtype = narrowest(c.dtype("hidden_states")?, c.dtype(expert_tensors.first().copied().unwrap_or("hidden_states"))?);
    if let Some(gpu) = c.def.tag_value("gpu") {
        notes.push(format!("definition is tagged gpu:{gpu}"));
    }
    Ok(WorkCost {
        class: OpClass::Moe,
        compute_dtype: dtype,
        lower: Counts { flops: flops(a_lo), bytes: io + touched_lo * per_expert },
        nominal: Counts { flops: flops(a_nom), bytes: io + touched_nom * per_expert },
        notes,
        missing: vec![c.missing(
            &[routing_input],
            "which experts each token uses; the bound takes the fewest distinct experts possible, nominal uniform routing",
        )],
    })
}

//! Hard SOL of a shared-schema kernel: `perf::sol::sol`, tightened into a true lower bound where
//! its traffic model assumes more than physics requires.
//!
//! - `moe`: `kernels::cost` counts the experts that *uniform* routing touches in expectation;
//!   skewed routing touches fewer (public H200 MoE rows with power-law routing run up to 18%
//!   below it). A token visits an expert at most once, so A local assignments over T tokens
//!   touch at least ceil(A / T) experts.
//! - `all_reduce`: `perf::sol` counts ring traffic, 2(n-1)/n of the message per GPU; in-switch
//!   reduction (NVLink SHARP, which NCCL uses on NVSwitch systems) needs only (n-1)/n, and
//!   public 8xH200 NCCL all-reduce rows run faster than the ring bound.
//!
//! (`mla_prefill` in MHA form and attention over an FP8 KV cache at the FP8 peak, found by this
//! validation, are now in `kernels::cost` and `perf::sol` themselves.)

use crate::hardware::GpuSpec;
use crate::kernels::cost::expected_active_experts;
use crate::perf::sol::{link_bytes_per_s, sol, Bound, Sol};
use crate::schema::{Kernel, Op};

pub fn hard_sol(k: &Kernel, gpu: &GpuSpec) -> Sol {
    adjusted(k, gpu, true)
}

/// The practical bound's counts: `perf::sol` as is (uniform MoE routing, ring all-reduce).
pub fn nominal_sol(k: &Kernel, gpu: &GpuSpec) -> Sol {
    adjusted(k, gpu, false)
}

fn adjusted(k: &Kernel, gpu: &GpuSpec, lower: bool) -> Sol {
    let s = sol(k, gpu);
    let mut bytes = s.bytes;
    match k.op {
        Op::Moe if lower => bytes -= moe_excess_expert_bytes(k),
        Op::AllReduce if lower => bytes /= 2.0,
        _ => {}
    }
    let (flops, compute_us) = (s.flops, s.compute_us);
    let rate = if k.op.is_collective() { link_bytes_per_s(gpu, k.num_gpus) } else { gpu.hbm_bytes_per_s() };
    let memory_us = bytes / rate * 1e6;
    let bound = match (k.op.is_collective(), compute_us >= memory_us) {
        (true, _) => Bound::Network,
        (false, true) => Bound::Compute,
        (false, false) => Bound::Memory,
    };
    Sol { flops, bytes, compute_us, memory_us, sol_us: compute_us.max(memory_us), bound }
}

/// What `hard_sol` changes for an op, for answers.
pub fn notes(op: Op) -> Option<&'static str> {
    match op {
        Op::Moe => Some("hard SOL reads the fewest experts any routing touches (ceil(topk/ep)); practical bound: uniform routing"),
        Op::AllReduce => Some("hard SOL allows in-switch reduction ((n-1)/n of the message per GPU); practical bound: ring traffic"),
        Op::MlaPrefill => Some("FLOPs in MHA form (qk 192 + v 128 per head, DeepSeek geometry), as prefill kernels run it"),
        _ => None,
    }
}

/// Weight bytes `kernels::cost` counts beyond the fewest experts any routing must touch.
fn moe_excess_expert_bytes(k: &Kernel) -> f64 {
    let (t, ep, tp) = (k.num_tokens as f64, k.ep.max(1) as f64, k.tp.max(1) as f64);
    let local = k.num_experts as f64 / ep;
    let assignments = t * k.topk as f64 / ep;
    // Same expectation as kernels::cost::bytes.
    let expected = expected_active_experts(local, assignments.min(t * local));
    let fewest = if t > 0.0 { (assignments / t).ceil().clamp(1.0, local.max(1.0)) } else { 0.0 };
    let per_expert = 3.0 * k.hidden as f64 * k.inter as f64 / tp * k.dtype.bytes();
    (expected - fewest).max(0.0) * per_expert
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::load_gpu;
    use crate::schema::Dtype;

    #[test]
    fn moe_lower_bound_reads_top_k_experts() {
        let g = load_gpu("h200_sxm").unwrap();
        let mut k = Kernel::new(Op::Moe, Dtype::Bf16);
        (k.num_tokens, k.hidden, k.inter, k.topk, k.num_experts) = (256, 4096, 1024, 8, 64);
        // Lower bound: 8 experts' weights + tokens in and out.
        let want = 8.0 * 3.0 * 4096.0 * 1024.0 * 2.0 + 2.0 * 256.0 * 4096.0 * 2.0;
        let s = hard_sol(&k, &g);
        assert!((s.bytes - want).abs() < 1e-3, "{} vs {want}", s.bytes);
        assert!(s.sol_us <= sol(&k, &g).sol_us);
        assert_eq!(s.flops, sol(&k, &g).flops);
    }

    #[test]
    fn all_reduce_lower_bound_allows_in_switch_reduction() {
        let g = load_gpu("h200_sxm").unwrap();
        let mut k = Kernel::new(Op::AllReduce, Dtype::Bf16);
        (k.bytes, k.num_gpus) = (64 << 20, 8);
        let want = 7.0 / 8.0 * (64u64 << 20) as f64 / 450e9 * 1e6;
        assert!((hard_sol(&k, &g).sol_us - want).abs() < 1e-6);
    }
}

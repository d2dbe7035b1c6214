//! The selection shipped in `microbench/public/`: enough public measurements to calibrate every
//! op class on seven GPUs without the upstream tables, small enough to commit.
//!
//! Per GPU one software stack for compute kernels, vLLM 0.24.0 (vLLM 0.14.0 on A100, the only
//! vLLM version measured there), so that efficiencies compare kernels of one generation:
//! - gemm: bf16, fp8 (per-tensor) and fp4 (Blackwell); fp8_block and TensorRT-LLM dropped;
//! - attn_prefill / attn_decode: every row of that stack (bf16 and fp8 KV, all windows);
//! - moe: bf16, fp8 (per-tensor) and block-FP8 (`/fp8_block`, 128 x 128 weight scales: the
//!   published FP8 MoE checkpoints), balanced and power-law routing; MXFP4 weight-only
//!   (`/w4a16_mxfp4`, gpt-oss's kernels) on the GPUs without fp4 tensor cores;
//! - collectives: every NCCL and custom all-reduce row (all stacks; they are small);
//! - mla_prefill / mla_decode: every row (kernel tables and `/module_*` tables).
//!
//! Vidur rows are kept whole (fp16 elementwise ops, A40, 2024 stack).

use super::aiconfigurator::FileContext;
use crate::schema::{Dtype, KernelRow, Op};

pub const CURATED_GPUS: [&str; 7] =
    ["a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "gb200", "l40s", "rtx_pro_6000_server"];

/// The compute stack kept for `gpu`.
pub fn primary_stack(gpu: &str) -> &'static str {
    if gpu == "a100_sxm" {
        "vllm-0.14.0"
    } else {
        "vllm-0.24.0"
    }
}

/// Whether a table file can contribute curated rows (saves decoding the rest).
pub fn wants_file(ctx: &FileContext) -> bool {
    CURATED_GPUS.contains(&ctx.gpu.as_str())
        && (ctx.table.contains("allreduce")
            || ctx.table.contains("nccl")
            || ctx.table.contains("mla")
            || format!("{}-{}", ctx.framework, ctx.version) == primary_stack(&ctx.gpu))
}

/// Whether an imported aiconfigurator row belongs to the curated subset.
pub fn keep(row: &KernelRow) -> bool {
    let gpu = row.gpu.as_deref().unwrap_or("");
    if !CURATED_GPUS.contains(&gpu) {
        return false;
    }
    let backend = row.backend.as_deref().unwrap_or("");
    let stack = primary_stack(gpu);
    let k = &row.kernel;
    match k.op {
        Op::Gemm => backend == stack && matches!(k.dtype, Dtype::Bf16 | Dtype::Fp8 | Dtype::Fp4),
        Op::AttnPrefill | Op::AttnDecode => backend == stack,
        Op::Moe => {
            let variant = |v: &str| backend.strip_prefix(stack).and_then(|s| s.strip_prefix(v)).is_some_and(|s| s.is_empty() || s.starts_with("/power_law_"));
            (variant("") && matches!(k.dtype, Dtype::Bf16 | Dtype::Fp8))
                || (variant("/fp8_block") && k.dtype == Dtype::Fp8)
                || (variant("/w4a16_mxfp4") && k.dtype == Dtype::Fp4)
        }
        Op::MlaPrefill | Op::MlaDecode => true,
        op => op.is_collective(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::measured;
    use crate::schema::Kernel;

    fn moe(dtype: Dtype, gpu: &str, backend: &str) -> KernelRow {
        let mut k = Kernel::new(Op::Moe, dtype);
        (k.num_tokens, k.hidden, k.inter, k.topk, k.num_experts, k.tp, k.ep) = (64, 2880, 2880, 4, 128, 1, 1);
        measured(k, 50.0, gpu, "aiconfigurator", backend.to_string(), "k")
    }

    #[test]
    fn moe_keeps_the_primary_stack_and_its_mxfp4_weight_only_rows() {
        assert!(keep(&moe(Dtype::Bf16, "h100_sxm", "vllm-0.24.0")));
        assert!(keep(&moe(Dtype::Fp8, "h100_sxm", "vllm-0.24.0/power_law_1.2")));
        assert!(keep(&moe(Dtype::Fp4, "h100_sxm", "vllm-0.24.0/w4a16_mxfp4")));
        assert!(keep(&moe(Dtype::Fp4, "h200_sxm", "vllm-0.24.0/w4a16_mxfp4/power_law_1.01")));
        assert!(keep(&moe(Dtype::Fp8, "h100_sxm", "vllm-0.24.0/fp8_block")));
        assert!(keep(&moe(Dtype::Fp8, "h100_sxm", "vllm-0.24.0/fp8_block/power_law_1.01")));
        // Other stacks, a bf16 row labelled block-FP8, fp4 that is not the weight-only variant,
        // and a bf16 row labelled weight-only stay out.
        assert!(!keep(&moe(Dtype::Fp8, "h100_sxm", "vllm-0.14.0/fp8_block")));
        assert!(!keep(&moe(Dtype::Bf16, "h100_sxm", "vllm-0.24.0/fp8_block")));
        assert!(!keep(&moe(Dtype::Bf16, "h100_sxm", "vllm-0.14.0")));
        assert!(!keep(&moe(Dtype::Fp4, "h100_sxm", "vllm-0.24.0")));
        assert!(!keep(&moe(Dtype::Bf16, "h100_sxm", "vllm-0.24.0/w4a16_mxfp4")));
    }
}

//! Speed-of-light bound of a kernel on a GPU: the larger of compute time at dense peak and
//! compulsory-traffic time at peak bandwidth (HBM, or the scale-up link for collectives).

use crate::hardware::{GpuSpec, LinkKind};
use crate::kernels::cost;
use crate::schema::{Kernel, Op};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Bound {
    Compute,
    Memory,
    /// Collectives: bounded by link bandwidth.
    Network,
}

impl Bound {
    pub fn as_str(self) -> &'static str {
        match self {
            Bound::Compute => "compute",
            Bound::Memory => "memory",
            Bound::Network => "network",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sol {
    pub flops: f64,
    pub bytes: f64,
    pub compute_us: f64,
    pub memory_us: f64,
    pub sol_us: f64,
    pub bound: Bound,
}

/// Link bandwidth (bytes/s, one direction) a collective over `num_gpus` GPUs of one node runs
/// on; `scaleout_us` times collectives that span nodes.
pub fn link_bytes_per_s(gpu: &GpuSpec, num_gpus: u64) -> f64 {
    if num_gpus > gpu.interconnect.gpus_per_node as u64 {
        return gpu.interconnect.scaleout_gbps_per_dir * 1e9;
    }
    match gpu.interconnect.scaleup_kind {
        LinkKind::Pcie => gpu.interconnect.pcie_gbps_per_dir * 1e9,
        _ => gpu.scaleup_bytes_per_s(),
    }
}

/// Network time bound (us) of collective `k` spread over nodes of `per_node` GPUs each, every
/// GPU with its own NIC of `nic_bytes_per_s` (one direction). Ring collectives (all-reduce,
/// all-gather, reduce-scatter) run one ring per GPU of a node, each crossing the network on its
/// own NIC: a node sends `collective_wire_bytes` in all, over `per_node` NICs. An all-to-all GPU
/// sends the share of its message for other nodes, `(n - per_node) / n` of it, on its own NIC.
/// A p2p send crosses one NIC.
pub fn scaleout_us(k: &Kernel, per_node: u64, nic_bytes_per_s: f64) -> f64 {
    let n = k.num_gpus.max(1);
    let per_node = per_node.clamp(1, n);
    let bytes = match k.op {
        Op::AllReduce | Op::AllGather | Op::ReduceScatter => collective_wire_bytes(k) / per_node as f64,
        Op::AllToAll => (n - per_node) as f64 / n as f64 * k.bytes as f64,
        _ => collective_wire_bytes(k),
    };
    bytes / nic_bytes_per_s * 1e6
}

/// Bytes each GPU must send for a collective (ring/direct lower bound), nccl-tests size convention.
pub fn collective_wire_bytes(k: &Kernel) -> f64 {
    let n = k.num_gpus.max(1) as f64;
    let s = k.bytes as f64;
    match k.op {
        Op::AllReduce => 2.0 * (n - 1.0) / n * s,
        Op::AllGather | Op::ReduceScatter | Op::AllToAll => (n - 1.0) / n * s,
        Op::P2p => s,
        _ => 0.0,
    }
}

pub fn sol(k: &Kernel, gpu: &GpuSpec) -> Sol {
    sol_routed(k, gpu, cost::Routing::Uniform)
}

/// As `sol`, a MoE kernel's weight reads counted for `routing` (a measured row's own routing).
pub fn sol_routed(k: &Kernel, gpu: &GpuSpec, routing: cost::Routing) -> Sol {
    let flops = cost::flops_routed(k, routing);
    // Attention over an fp8 KV cache can run its matmuls in fp8 (FlashAttention-3, TRT-LLM):
    // the bound takes the faster of the two peaks.
    let peak = match (k.op.class(), k.kv_dtype) {
        ("attention", Some(kv)) => gpu.peak_flops(k.dtype).max(gpu.peak_flops(kv)),
        _ => gpu.peak_flops(k.dtype),
    };
    let compute_us = flops / peak * 1e6;
    if k.op.is_collective() {
        let wire = collective_wire_bytes(k);
        let per_node = gpu.interconnect.gpus_per_node as u64;
        let net_us = if k.num_gpus > per_node {
            // Across nodes: the node's NICs, and the scale-up fabric inside each node.
            let inside = wire / link_bytes_per_s(gpu, per_node) * 1e6;
            scaleout_us(k, per_node, gpu.interconnect.scaleout_gbps_per_dir * 1e9).max(inside)
        } else {
            wire / link_bytes_per_s(gpu, k.num_gpus) * 1e6
        };
        return Sol { flops, bytes: wire, compute_us, memory_us: net_us, sol_us: net_us.max(compute_us), bound: Bound::Network };
    }
    let bytes = cost::bytes_routed(k, routing);
    let memory_us = bytes / gpu.hbm_bytes_per_s() * 1e6;
    let bound = if compute_us >= memory_us { Bound::Compute } else { Bound::Memory };
    Sol { flops, bytes, compute_us, memory_us, sol_us: compute_us.max(memory_us), bound }
}

/// Query rows of one attention CTA in the tiled kernels the models describe (FlashAttention-2/3,
/// cuDNN's fused SDPA): 128 queries of one (sequence, head) per CTA.
pub const ATTENTION_QUERY_TILE: u64 = 128;

/// Compute bound of a tiled attention prefill that runs one CTA per (sequence, head, query
/// tile) and does not split the keys: query tiles padded to `ATTENTION_QUERY_TILE`, CTAs in
/// whole waves over the SMs, each SM at its share of the peak. Where the CTAs are fewer than
/// the SMs the busiest SM's share, not the GPU's, sets the time: transformers' packed cuDNN
/// attention at 64-2,048 queries x 16,384 keys takes ~260-300 us at 2, 4 or 8 heads alike on
/// an H100 and an H200, where SOL falls with the heads. `compute_us` is the kernel's SOL
/// compute time.
pub fn tiled_attention_bound_us(k: &Kernel, gpu: &GpuSpec, compute_us: f64) -> f64 {
    if k.op != Op::AttnPrefill || k.seq_len == 0 {
        return compute_us;
    }
    let tiles = k.seq_len.div_ceil(ATTENTION_QUERY_TILE);
    let padded = (tiles * ATTENTION_QUERY_TILE) as f64 / k.seq_len as f64;
    let ctas = (k.batch.max(1) * k.num_heads.max(1) * tiles) as f64;
    let sms = gpu.compute.sm_count as f64;
    let waves = (ctas / sms).ceil();
    compute_us * padded * sms * waves / ctas
}

/// SOL of a whole MLA module (attention core `k` plus the projections of `module` with linear
/// weights in `weights`, see `cost::MlaModule`): the parts run one after another, so the bound
/// is the sum of each part's own bound; flops, bytes and the compute and memory times are sums
/// too, and `bound` names the larger total.
pub fn mla_module_sol(k: &Kernel, gpu: &GpuSpec, module: &cost::MlaModule, weights: crate::schema::Dtype) -> Sol {
    let mut s = sol(k, gpu);
    for (g, n) in module.projections(k, weights) {
        let p = sol(&g, gpu);
        let n = n as f64;
        s.flops += n * p.flops;
        s.bytes += n * p.bytes;
        s.compute_us += n * p.compute_us;
        s.memory_us += n * p.memory_us;
        s.sol_us += n * p.sol_us;
    }
    s.bound = if s.compute_us >= s.memory_us { Bound::Compute } else { Bound::Memory };
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::load_gpu;
    use crate::schema::Dtype;

    fn packed(heads: u64, queries: u64, keys: u64) -> Kernel {
        Kernel { batch: 1, seq_len: queries, kv_len: keys, num_heads: heads, num_kv_heads: heads, head_dim: 64, ..Kernel::new(Op::AttnPrefill, Dtype::Bf16) }
    }

    #[test]
    fn tiled_attention_bound_follows_the_busiest_sm() {
        let g = load_gpu("h200_sxm").unwrap();
        let bound = |k: &Kernel| tiled_attention_bound_us(k, &g, sol(k, &g).compute_us);
        // Fewer CTAs than SMs: each SM runs at most one, so the heads do not change the time.
        let (two, eight) = (bound(&packed(2, 64, 16384)), bound(&packed(8, 64, 16384)));
        assert!((two / eight - 1.0).abs() < 1e-3, "{two} vs {eight}");
        // 64 queries fill half a tile: the same time as a full 128-query tile.
        assert!((bound(&packed(8, 128, 16384)) / eight - 1.0).abs() < 0.01);
        // 16 heads x 16 tiles = 256 CTAs take two waves of 132 SMs, twice one wave's 128 CTAs.
        let (one_wave, two_waves) = (bound(&packed(8, 2048, 16384)), bound(&packed(16, 2048, 16384)));
        assert!((two_waves / one_wave - 2.0).abs() < 0.02, "{one_wave} vs {two_waves}");
        // Whole waves of full tiles: the bound is SOL's compute time.
        let full = packed(132, 128, 16384);
        assert!((bound(&full) / sol(&full, &g).compute_us - 1.0).abs() < 0.01);
        // Never below the compute time, and other ops are left alone.
        for k in [packed(1, 1, 10), packed(64, 8192, 8192)] {
            assert!(bound(&k) >= sol(&k, &g).compute_us * (1.0 - 1e-12));
        }
        let gemm = Kernel::gemm(Dtype::Bf16, 64, 64, 64);
        assert_eq!(tiled_attention_bound_us(&gemm, &g, 3.0), 3.0);
    }

    #[test]
    fn gemm_8192_cubed_on_h200_is_compute_bound_at_peak() {
        let g = load_gpu("h200_sxm").unwrap();
        let s = sol(&Kernel::gemm(Dtype::Bf16, 8192, 8192, 8192), &g);
        let expected_us = 2.0 * 8192f64.powi(3) / 989.4e12 * 1e6;
        assert!((s.sol_us - expected_us).abs() / expected_us < 1e-9);
        assert_eq!(s.bound, Bound::Compute);
    }

    #[test]
    fn gemv_is_memory_bound() {
        let g = load_gpu("h200_sxm").unwrap();
        let s = sol(&Kernel::gemm(Dtype::Bf16, 1, 8192, 8192), &g);
        assert_eq!(s.bound, Bound::Memory);
        let expected_us = (8192.0 * 8192.0 + 2.0 * 8192.0) * 2.0 / 4.8e12 * 1e6;
        assert!((s.sol_us - expected_us).abs() < 1e-6);
    }

    #[test]
    fn multi_node_all_reduce_shares_the_nodes_nics() {
        // 16 H100s on two HGX nodes, 64 MiB all-reduce: each node sends 2 * 15/16 * 64 MiB over
        // its 8 NICs of 50 GB/s = 400 GB/s (not one 50 GB/s NIC per GPU's whole ring traffic);
        // inside a node the same bytes cross 450 GB/s NVLink, which is not the bound.
        let g = load_gpu("h100_sxm").unwrap();
        let mut k = Kernel::new(Op::AllReduce, Dtype::Bf16);
        k.bytes = 64 << 20;
        k.num_gpus = 16;
        let expected_us = 2.0 * 15.0 / 16.0 * (64u64 << 20) as f64 / (8.0 * 50e9) * 1e6;
        let s = sol(&k, &g);
        assert!((s.sol_us - expected_us).abs() < 1e-6, "{} vs {expected_us}", s.sol_us);
        // An all-to-all over the same 16 GPUs: half of each GPU's 64 MiB leaves its node, on
        // its own 50 GB/s NIC.
        k.op = Op::AllToAll;
        let expected_us = 0.5 * (64u64 << 20) as f64 / 50e9 * 1e6;
        assert!((sol(&k, &g).sol_us - expected_us).abs() < 1e-6);
    }

    #[test]
    fn mla_module_sol_adds_the_projection_weights() {
        // DeepSeek-V3 MLA decode module, 1 sequence, 128 heads, bf16, on H200: the attention
        // core reads 1024 x 576 latent bytes; the projections read 187.1 M bf16 weights
        // (7168 x 2112 + 1536 x 24576 + 16384 x 7168 + 2 x 128 x 128 x 512), which dominate.
        let g = load_gpu("h200_sxm").unwrap();
        let mut k = Kernel::new(Op::MlaDecode, Dtype::Bf16);
        (k.batch, k.kv_len, k.num_heads, k.num_kv_heads, k.head_dim) = (1, 1024, 128, 1, 576);
        let core = sol(&k, &g);
        let m = mla_module_sol(&k, &g, &cost::MlaModule::DEEPSEEK_V3, Dtype::Bf16);
        let weights = 7168.0 * 2112.0 + 1536.0 * 24576.0 + 16384.0 * 7168.0 + 2.0 * 128.0 * 128.0 * 512.0;
        assert_eq!(weights, 187_105_280.0);
        let w_us = weights * 2.0 / 4.8e12 * 1e6;
        assert!(m.sol_us - core.sol_us > w_us && m.sol_us - core.sol_us < 1.01 * w_us, "{m:?} {w_us}");
        assert_eq!(m.bound, Bound::Memory);
        // fp8 linears: the absorbed W_UK / W_UV stay bf16, the rest is halved.
        let f = mla_module_sol(&k, &g, &cost::MlaModule::DEEPSEEK_V3, Dtype::Fp8);
        let w8_us = ((weights - 2.0 * 128.0 * 65536.0) + 2.0 * 2.0 * 128.0 * 65536.0) / 4.8e12 * 1e6;
        assert!(f.sol_us - core.sol_us > w8_us && f.sol_us - core.sol_us < 1.01 * w8_us, "{f:?} {w8_us}");
    }

    #[test]
    fn all_reduce_uses_ring_traffic() {
        let g = load_gpu("h200_sxm").unwrap();
        let mut k = Kernel::new(Op::AllReduce, Dtype::Bf16);
        k.bytes = 64 << 20;
        k.num_gpus = 8;
        let s = sol(&k, &g);
        let expected_us = 2.0 * 7.0 / 8.0 * (64u64 << 20) as f64 / 450e9 * 1e6;
        assert!((s.sol_us - expected_us).abs() < 1e-6);
    }
}

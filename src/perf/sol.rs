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

/// Link bandwidth (bytes/s, one direction) a collective over `num_gpus` GPUs runs on.
pub fn link_bytes_per_s(gpu: &GpuSpec, num_gpus: u64) -> f64 {
    if num_gpus > gpu.interconnect.gpus_per_node as u64 {
        return gpu.interconnect.scaleout_gbps_per_dir * 1e9;
    }
    match gpu.interconnect.scaleup_kind {
        LinkKind::Pcie => gpu.interconnect.pcie_gbps_per_dir * 1e9,
        _ => gpu.scaleup_bytes_per_s(),
    }
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
    let flops = cost::flops(k);
    // Attention over an fp8 KV cache can run its matmuls in fp8 (FlashAttention-3, TRT-LLM):
    // the bound takes the faster of the two peaks.
    let peak = match (k.op.class(), k.kv_dtype) {
        ("attention", Some(kv)) => gpu.peak_flops(k.dtype).max(gpu.peak_flops(kv)),
        _ => gpu.peak_flops(k.dtype),
    };
    let compute_us = flops / peak * 1e6;
    if k.op.is_collective() {
        let wire = collective_wire_bytes(k);
        let net_us = wire / link_bytes_per_s(gpu, k.num_gpus) * 1e6;
        return Sol { flops, bytes: wire, compute_us, memory_us: net_us, sol_us: net_us.max(compute_us), bound: Bound::Network };
    }
    let bytes = cost::bytes(k);
    let memory_us = bytes / gpu.hbm_bytes_per_s() * 1e6;
    let bound = if compute_us >= memory_us { Bound::Compute } else { Bound::Memory };
    Sol { flops, bytes, compute_us, memory_us, sol_us: compute_us.max(memory_us), bound }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::load_gpu;
    use crate::schema::Dtype;

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

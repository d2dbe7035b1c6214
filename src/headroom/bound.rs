//! Hard SOL and practical bound.
//!
//! Hard SOL: the larger of FLOPs at the dense tensor-core peak of the compute dtype and
//! compulsory bytes at peak HBM bandwidth (a true lower bound). Practical bound: the larger of
//! nominal compute and memory times each divided by the best efficiency observed for the op
//! class, and a launch/latency floor. Default ceilings come from the project's H200
//! measurements (`docs/headroom.md` lists the source of each figure).

use crate::hardware::GpuSpec;
use crate::perf::sol::{Bound, Sol};
use crate::schema::{Dtype, Op};
use serde::Serialize;

/// Op classes with their own efficiency ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpClass {
    Gemm,
    AttentionPrefill,
    AttentionDecode,
    Moe,
    Recurrent,
    Elementwise,
    Communication,
}

impl OpClass {
    pub fn as_str(self) -> &'static str {
        match self {
            OpClass::Gemm => "gemm",
            OpClass::AttentionPrefill => "attention_prefill",
            OpClass::AttentionDecode => "attention_decode",
            OpClass::Moe => "moe",
            OpClass::Recurrent => "recurrent",
            OpClass::Elementwise => "elementwise",
            OpClass::Communication => "communication",
        }
    }

    pub fn of_op(op: Op) -> OpClass {
        match op {
            Op::Gemm | Op::MoeRouter => OpClass::Gemm,
            Op::AttnPrefill | Op::MlaPrefill => OpClass::AttentionPrefill,
            Op::AttnDecode | Op::MlaDecode => OpClass::AttentionDecode,
            Op::LinearAttn => OpClass::Recurrent,
            Op::Moe => OpClass::Moe,
            o if o.is_collective() => OpClass::Communication,
            _ => OpClass::Elementwise,
        }
    }
}

/// Best fraction of peak compute and of peak bandwidth a kernel of a class reaches.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Ceiling {
    pub compute: f64,
    pub memory: f64,
    /// Where the figures come from.
    pub source: &'static str,
}

/// Smallest kernel time in the project's H200 data (a 4 KB device copy as a CUDA-graph memcpy
/// node: 1.101 us, h200_sxm_small_copies.csv; the smallest kernel launch, `torch.add` of one
/// 1,024-wide row under graph replay, 1.153 us; CUPTI durations of rows timed Vidur's way, down
/// to 1.04 us, leave out the launch gap and do not count); `tests/headroom_validation.rs` checks it.
pub const LATENCY_FLOOR_US: f64 = 1.10;

const H200: &str = "best observed on H200 (sol validate)";
const ANY: &str = "no data for the class: best of any class on H200";

/// Documented default ceilings: the best efficiency observed per class on H200 over the
/// project's measurements (`validate::best_efficiency`: public tables + collector sweep), against
/// the hard SOL, traffic only for shapes moving more than 4x L2. Compute ceilings of classes
/// without tensor-core work (elementwise), and both of classes with no data (recurrent), are
/// the best of any class. `tests/headroom_validation.rs` re-derives them from the data.
pub fn default_ceiling(class: OpClass) -> Ceiling {
    let (compute, memory, source) = match class {
        OpClass::Gemm => (0.950, 0.921, H200),
        OpClass::AttentionPrefill => (0.780, 0.839, H200),
        OpClass::AttentionDecode => (0.729, 0.961, H200),
        OpClass::Moe => (0.738, 0.794, H200),
        OpClass::Elementwise => (BEST_COMPUTE, 0.915, H200),
        OpClass::Communication => (BEST_COMPUTE, 0.801, H200),
        OpClass::Recurrent => (BEST_COMPUTE, BEST_MEMORY, ANY),
    };
    Ceiling { compute, memory, source }
}

/// Best compute (GEMM) and memory (decode attention) efficiency of any class on H200.
pub const BEST_COMPUTE: f64 = 0.950;
pub const BEST_MEMORY: f64 = 0.961;

/// The resource that sets a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Resource {
    Compute,
    Memory,
    Network,
    Latency,
}

impl Resource {
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Compute => "compute",
            Resource::Memory => "memory",
            Resource::Network => "network",
            Resource::Latency => "latency",
        }
    }
}

/// Both bounds of one kernel or workload on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bounds {
    pub class: OpClass,
    pub compute_dtype: Dtype,
    /// Lower-bound counts behind the hard SOL.
    pub flops: f64,
    pub bytes: f64,
    pub compute_us: f64,
    pub memory_us: f64,
    pub sol_us: f64,
    /// Resource of the hard SOL (compute, memory or network).
    pub bound: Resource,
    pub practical_us: f64,
    /// Resource of the practical bound (compute, memory, network or latency).
    pub dominant: Resource,
    pub ceiling: Ceiling,
}

/// Work of one problem: lower-bound and nominal (flops, bytes) in a compute dtype.
#[derive(Debug, Clone, Copy)]
pub struct Work {
    pub class: OpClass,
    pub dtype: Dtype,
    pub lower: (f64, f64),
    pub nominal: (f64, f64),
}

pub fn bounds(work: &Work, gpu: &GpuSpec, ceiling: Ceiling) -> Bounds {
    let peak = gpu.peak_flops(work.dtype);
    let bw = gpu.hbm_bytes_per_s();
    let compute_us = work.lower.0 / peak * 1e6;
    let memory_us = work.lower.1 / bw * 1e6;
    let bound = if compute_us >= memory_us { Resource::Compute } else { Resource::Memory };
    let (practical_us, dominant) = practical(
        work.nominal.0 / peak * 1e6,
        work.nominal.1 / bw * 1e6,
        Resource::Memory,
        ceiling,
    );
    Bounds {
        class: work.class,
        compute_dtype: work.dtype,
        flops: work.lower.0,
        bytes: work.lower.1,
        compute_us,
        memory_us,
        sol_us: compute_us.max(memory_us),
        bound,
        practical_us: practical_us.max(compute_us.max(memory_us)),
        dominant,
        ceiling,
    }
}

/// Bounds of a shared-schema kernel (exact shape): the hard SOL from `hard` (a lower bound),
/// the practical bound from `nominal` (`kernel::nominal_sol`).
pub fn kernel_bounds(op: Op, dtype: Dtype, hard: &Sol, nominal: &Sol, ceiling: Ceiling) -> Bounds {
    let traffic = if hard.bound == Bound::Network { Resource::Network } else { Resource::Memory };
    let (practical_us, dominant) = practical(nominal.compute_us, nominal.memory_us, traffic, ceiling);
    Bounds {
        class: OpClass::of_op(op),
        compute_dtype: dtype,
        flops: hard.flops,
        bytes: hard.bytes,
        compute_us: hard.compute_us,
        memory_us: hard.memory_us,
        sol_us: hard.sol_us,
        bound: match hard.bound {
            Bound::Compute => Resource::Compute,
            Bound::Memory => Resource::Memory,
            Bound::Network => Resource::Network,
        },
        practical_us: practical_us.max(hard.sol_us),
        dominant,
        ceiling,
    }
}

/// The hard SOL if a warm-cache timing loop serves up to `l2_bytes` of the traffic from L2:
/// only the rest must cross HBM. `None` for network-bound collectives.
pub fn warm_l2_sol_us(compute_us: f64, bytes: f64, memory_us: f64, bound: Resource, l2_bytes: f64) -> Option<f64> {
    if bound == Resource::Network {
        return None;
    }
    let hbm_us = if bytes > 0.0 { (bytes - l2_bytes).max(0.0) * memory_us / bytes } else { 0.0 };
    Some(compute_us.max(hbm_us))
}

fn practical(compute_us: f64, traffic_us: f64, traffic: Resource, c: Ceiling) -> (f64, Resource) {
    let candidates = [
        (compute_us / c.compute, Resource::Compute),
        (traffic_us / c.memory, traffic),
        (LATENCY_FLOOR_US, Resource::Latency),
    ];
    candidates.into_iter().fold((0.0, Resource::Latency), |best, x| if x.0 > best.0 { x } else { best })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::load_gpu;

    #[test]
    fn hard_sol_is_max_of_compute_and_memory_and_practical_applies_ceilings() {
        let g = load_gpu("h200_sxm").unwrap();
        // 1e12 FLOPs bf16 and 1e9 bytes: 1e12/989.4e12 s = 1010.7 us vs 1e9/4.8e12 s = 208.3 us.
        let w = Work { class: OpClass::Gemm, dtype: Dtype::Bf16, lower: (1e12, 1e9), nominal: (1e12, 1e9) };
        let b = bounds(&w, &g, default_ceiling(OpClass::Gemm));
        assert!((b.sol_us - 1e6 / 989.4).abs() < 1e-6);
        assert_eq!(b.bound, Resource::Compute);
        assert!((b.practical_us - 1e6 / 989.4 / 0.950).abs() < 1e-6);
        assert_eq!(b.dominant, Resource::Compute);
    }

    #[test]
    fn tiny_work_hits_the_latency_floor() {
        let g = load_gpu("h200_sxm").unwrap();
        let w = Work { class: OpClass::Elementwise, dtype: Dtype::Bf16, lower: (0.0, 4096.0), nominal: (0.0, 4096.0) };
        let b = bounds(&w, &g, default_ceiling(OpClass::Elementwise));
        assert!((b.sol_us - 4096.0 / 4.8e12 * 1e6).abs() < 1e-9);
        assert_eq!((b.practical_us, b.dominant), (LATENCY_FLOOR_US, Resource::Latency));
    }
}

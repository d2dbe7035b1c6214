//! The baseline kernel-time model: speed of light divided by one constant efficiency per op
//! class, plus a per-kernel launch floor. Collectives add a fixed latency term.

use super::sol::sol_routed;
use super::{KernelTimeModel, Tier};
use crate::hardware::GpuSpec;
use crate::kernels::cost::Routing;
use crate::schema::Kernel;

/// Default efficiencies (fraction of SOL reached) per op class. They are round figures typical
/// of tuned Hopper/Ampere kernels (cuBLAS GEMMs ~75% of peak at large shapes, flash attention
/// ~55%, fused MoE ~45%, bandwidth-bound elementwise kernels ~60% of HBM peak, NCCL ring
/// ~75% of link bandwidth); `calibrate` replaces them with fitted values.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RooflineParams {
    pub gemm: f64,
    pub attention: f64,
    pub moe: f64,
    pub elementwise: f64,
    pub communication: f64,
    /// Floor of any kernel's time: launch plus pipeline fill, microseconds.
    pub launch_floor_us: f64,
    /// Fixed latency of one collective (NCCL protocol, synchronisation), microseconds.
    pub collective_latency_us: f64,
}

impl Default for RooflineParams {
    fn default() -> Self {
        RooflineParams {
            gemm: 0.75,
            attention: 0.55,
            moe: 0.45,
            elementwise: 0.6,
            communication: 0.75,
            launch_floor_us: 3.0,
            collective_latency_us: 8.0,
        }
    }
}

pub struct RooflineModel {
    pub gpu: GpuSpec,
    pub params: RooflineParams,
}

impl RooflineModel {
    pub fn new(gpu: GpuSpec) -> Self {
        RooflineModel { gpu, params: RooflineParams::default() }
    }

    /// As `predict_us` for a MoE kernel whose tokens are routed as `routing` (a measured row's).
    pub fn predict_routed_us(&self, k: &Kernel, routing: Routing) -> f64 {
        let s = sol_routed(k, &self.gpu, routing);
        let p = &self.params;
        let eff = match k.op.class() {
            "gemm" => p.gemm,
            "attention" => p.attention,
            "moe" => p.moe,
            "communication" => p.communication,
            _ => p.elementwise,
        };
        let latency = if k.op.is_collective() { p.collective_latency_us } else { 0.0 };
        (s.sol_us / eff + latency).max(p.launch_floor_us).max(s.sol_us)
    }
}

impl KernelTimeModel for RooflineModel {
    fn predict_us(&self, k: &Kernel) -> f64 {
        self.predict_routed_us(k, Routing::SERVED_DEFAULT)
    }

    fn tier(&self) -> Tier {
        Tier::Roofline
    }

    fn describe(&self) -> String {
        format!("roofline (SOL / constant efficiency per op class) on {}", self.gpu.id)
    }
}

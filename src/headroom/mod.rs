//! Headroom service for kernel-optimizing agents: speed-of-light bounds of FlashInfer-Trace
//! definitions/workloads and shared-schema kernels, the practical bound, and what a measured
//! time means (headroom, verdict, trial budget). See `docs/headroom.md`.

pub mod bound;
pub mod budget;
pub mod kernel;
pub mod ops;
pub mod serve;
pub mod trace;
pub mod validate;
pub mod verdict;

use crate::hardware::{load_gpu, GpuSpec};
use crate::perf::efficiency::KernelModel;
use crate::perf::Tier;
use crate::schema::Kernel;
use anyhow::Result;
use bound::{default_ceiling, Bounds, Ceiling, OpClass, Work};
use ops::Counts;
use serde::Serialize;
use trace::{Definition, Workload};
use verdict::Assessment;

/// One answer: the bounds of a problem on a GPU and, given a measured time, its assessment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Answer {
    pub gpu: String,
    /// Definition name, or the shared-schema op.
    pub subject: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    #[serde(flatten)]
    pub bounds: Bounds,
    /// Counts behind the practical bound when they differ from the lower bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nominal: Option<Counts>,
    pub notes: Vec<String>,
    pub missing: Vec<String>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub assessment: Option<Assessment>,
}

/// The efficiency ceiling used for a class on a GPU.
pub fn ceiling_for(_gpu: &GpuSpec, class: OpClass) -> Ceiling {
    default_ceiling(class)
}

/// A GPU and, when `calibration/` has fitted models for it, its calibrated kernel-time model.
pub struct Target {
    pub gpu: GpuSpec,
    pub model: Option<KernelModel>,
}

impl Target {
    /// Loads a GPU spec (id or .toml path) and its target-tier (else cross-gen) calibration.
    pub fn load(id_or_path: &str) -> Result<Target> {
        let gpu = load_gpu(id_or_path)?;
        let model = KernelModel::load(&gpu, Tier::Target).ok().filter(|m| m.tier_used() != Tier::Roofline);
        Ok(Target { gpu, model })
    }

    /// The calibrated time of a kernel whose op has a fitted (target or cross-gen) model.
    fn calibrated_us(&self, k: &Kernel) -> Option<(f64, Tier)> {
        let m = self.model.as_ref()?;
        let tier = m.tier_for(k.op);
        (tier != Tier::Roofline).then(|| (m.predict_us(k), tier))
    }
}

/// Bounds of one definition + workload; `origin` names the workload in errors.
pub fn evaluate_definition(
    def: &Definition,
    w: &Workload,
    gpu: &GpuSpec,
    measured_us: Option<f64>,
    origin: &str,
) -> Result<Answer> {
    let shape = def.resolve(w, origin)?;
    let c = ops::cost(def, &shape, w)?;
    let work = Work {
        class: c.class,
        dtype: c.compute_dtype,
        lower: (c.lower.flops, c.lower.bytes),
        nominal: (c.nominal.flops, c.nominal.bytes),
    };
    let b = bound::bounds(&work, gpu, ceiling_for(gpu, c.class));
    let assessment = measured_us.map(|t| verdict::assess(&b, t, gpu.l2_bytes())).transpose()?;
    Ok(Answer {
        gpu: gpu.id.clone(),
        subject: def.name.clone(),
        workload: w.uuid.clone(),
        bounds: b,
        nominal: (c.nominal != c.lower).then_some(c.nominal),
        notes: c.notes,
        missing: c.missing,
        assessment,
    })
}

/// Bounds of one shared-schema kernel (exact shape) through `perf::sol` (see `kernel`). Where
/// calibration has a fitted model for the op, a calibrated time faster than the ceiling-based
/// practical bound lowers it (never below the hard SOL).
pub fn evaluate_kernel(k: &Kernel, target: &Target, measured_us: Option<f64>) -> Result<Answer> {
    k.validate()?;
    let gpu = &target.gpu;
    let hard = kernel::hard_sol(k, gpu);
    let nominal = kernel::nominal_sol(k, gpu);
    let class = OpClass::of_op(k.op);
    let dtype = gpu.effective_compute_dtype(k.dtype);
    let mut b = bound::kernel_bounds(k.op, dtype, &hard, &nominal, ceiling_for(gpu, class));
    let mut notes: Vec<String> = kernel::notes(k.op).into_iter().map(str::to_string).collect();
    if let Some((cal_us, tier)) = target.calibrated_us(k) {
        notes.push(format!("calibrated {} prediction: {cal_us:.3} us", tier.as_str()));
        if cal_us < b.practical_us {
            b.practical_us = cal_us.max(b.sol_us);
            b.ceiling.source = "calibrated kernel model (faster than the default ceiling)";
        }
    }
    let assessment = measured_us.map(|t| verdict::assess(&b, t, gpu.l2_bytes())).transpose()?;
    Ok(Answer {
        gpu: gpu.id.clone(),
        subject: format!("{} {} {}", k.op, k.dtype, k.shape_string()),
        workload: None,
        bounds: b,
        nominal: (nominal.bytes != hard.bytes).then_some(Counts { flops: nominal.flops, bytes: nominal.bytes }),
        notes,
        missing: vec![],
        assessment,
    })
}

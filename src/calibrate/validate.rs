//! Per-kernel validation on rows never used for fitting, all tiers on the same rows:
//! for each evaluated GPU, its held-out shapes (fold 0 of a shape-level hash split) are
//! predicted by a `target` model fitted on its other shapes, a `cross-gen` model fitted on the
//! other GPUs only, and the roofline baseline fitted on the other GPUs only.

use super::dataset::{shape_fold, Measurement};
use super::model::{fit_set, FitParams, Form};
use super::select::InnerCheck;
use super::{fit_roofline, Data, MIN_CROSS_GEN_ROWS, MIN_TARGET_ROWS};
use crate::perf::roofline::RooflineModel;
use crate::perf::sol::sol_routed;
use crate::perf::Tier;
use crate::schema::{Kernel, Op};
use anyhow::{bail, Result};
use rayon::prelude::*;
use std::collections::BTreeMap;

/// Number of shape folds; fold 0 is held out.
pub const FOLDS: u64 = 5;

/// One held-out measurement and one tier's prediction of it.
#[derive(Debug, Clone)]
pub struct ValRow {
    pub tier: Tier,
    pub gpu: String,
    pub kernel: Kernel,
    pub backend: String,
    pub source: String,
    pub measured_us: f64,
    pub predicted_us: f64,
    pub sol_us: f64,
}

impl ValRow {
    /// `tier`'s prediction of measurement `m` on `gpu`.
    fn of(tier: Tier, m: &Measurement, gpu: &crate::hardware::GpuSpec, predicted_us: f64) -> ValRow {
        // An MLA module row's SOL includes its projections.
        let sol_us = match super::features::mla_module_weights(m.kernel.op, &m.backend) {
            Some(_) => super::features::row_sol(&m.kernel, gpu, &m.backend).sol_us,
            None => sol_routed(&m.kernel, gpu, m.routing).sol_us,
        };
        ValRow {
            tier,
            gpu: m.gpu.clone(),
            kernel: m.kernel.clone(),
            backend: m.backend.clone(),
            source: m.source.clone(),
            measured_us: m.latency_us,
            predicted_us,
            sol_us,
        }
    }

    pub fn ape(&self) -> f64 {
        (self.predicted_us - self.measured_us).abs() / self.measured_us * 100.0
    }
}

/// The form a cross-gen model of one op family took for one held-out GPU, where the inner
/// leave-one-GPU-out check chose it (families trained on few GPUs).
#[derive(Debug, Clone)]
pub struct FormChoice {
    pub gpu: String,
    pub op: Op,
    pub form: Form,
    pub inner_check: InnerCheck,
}

/// Validation rows of every tier and the cross-gen forms behind them.
#[derive(Debug, Clone)]
pub struct Validation {
    pub rows: Vec<ValRow>,
    pub forms: Vec<FormChoice>,
    /// Held-out rows of a GPU predicted from a same-die sibling's target model (fitted on the
    /// sibling's rows alone; `perf::efficiency::sibling_time_us`), where the sibling measured
    /// the row's library: how a library the GPU never measured is priced when the user names
    /// it. (sibling id, row with the compulsory-bytes form, row with the paired-kernel form where
    /// both GPUs measured another library of the kernel); the rows' tier field is unused.
    pub sibling: Vec<(String, ValRow, Option<ValRow>)>,
}

pub fn is_held_out(m: &Measurement) -> bool {
    shape_fold(&m.kernel, FOLDS) == 0
}

/// Predictions of every tier for the held-out rows of each GPU in `eval_gpus`.
pub fn validate_kernels(data: &Data, eval_gpus: &[String], params: &FitParams) -> Result<Validation> {
    let measured = data.gpus();
    for g in eval_gpus {
        if !measured.contains(g) {
            bail!("no measurements for gpu '{g}'; measured GPUs: {}", measured.join(", "));
        }
    }
    let spec = |g: &str| data.spec(g);
    let mut out = Vec::new();
    let mut forms = Vec::new();
    let mut sibling_rows = Vec::new();
    for g in eval_gpus {
        let test: Vec<&Measurement> = data.rows.iter().filter(|m| &m.gpu == g && is_held_out(m)).collect();
        let train_own: Vec<&Measurement> = data.rows.iter().filter(|m| &m.gpu == g && !is_held_out(m)).collect();
        let others: Vec<&Measurement> = data.rows.iter().filter(|m| &m.gpu != g).collect();
        let target = fit_set("target", &train_own, None, &spec, params, MIN_TARGET_ROWS);
        let cross = fit_set("cross-gen", &others, Some(g), &spec, params, MIN_CROSS_GEN_ROWS);
        forms.extend(cross.ops.iter().filter_map(|(op, om)| {
            om.inner_check.map(|inner_check| FormChoice { gpu: g.clone(), op: *op, form: om.form, inner_check })
        }));
        let roof = RooflineModel { gpu: data.spec(g).clone(), params: fit_roofline(&others, &|x| data.spec(x).clone()).params };
        let gpu = data.spec(g);
        let rows: Vec<ValRow> = test
            .par_iter()
            .flat_map_iter(|m| {
                let row = |tier: Tier, predicted_us: f64| ValRow::of(tier, m, gpu, predicted_us);
                let mut v = vec![row(Tier::Roofline, roof.predict_routed_us(&m.kernel, m.routing))];
                for (tier, set) in [(Tier::Target, &target), (Tier::CrossGen, &cross)] {
                    if let Some(p) = set.ops.get(&m.kernel.op).map(|om| om.predict_routed_us(&m.kernel, gpu, Some(&m.backend), m.routing)) {
                        v.push(row(tier, p));
                    }
                }
                v
            })
            .collect();
        out.extend(rows);
        for s in measured.iter().filter(|s| *s != g && data.spec(s).same_compute_die(gpu)) {
            let own: Vec<&Measurement> = data.rows.iter().filter(|m| &m.gpu == s).collect();
            let sib = fit_set("target", &own, None, &spec, params, MIN_TARGET_ROWS);
            let sib_spec = data.spec(s);
            sibling_rows.extend(test.par_iter().filter_map(|m| {
                let om = sib.ops.get(&m.kernel.op)?;
                let knows = om.all_backends().any(|c| c == &m.backend);
                knows.then(|| {
                    let predicted_us = crate::perf::efficiency::sibling_time_us(om, &m.kernel, gpu, sib_spec, &m.backend, m.routing);
                    // The paired form, with this GPU's own model of the other library of the
                    // same kernel (never of this row's library).
                    let paired = target.ops.get(&m.kernel.op).and_then(|own| {
                        crate::perf::efficiency::paired_sibling_time_us(om, own, &m.kernel, gpu, sib_spec, &m.backend, m.routing)
                    });
                    (s.clone(), ValRow::of(Tier::Target, m, gpu, predicted_us), paired.map(|p| ValRow::of(Tier::Target, m, gpu, p)))
                })
            }).collect::<Vec<_>>());
        }
    }
    Ok(Validation { rows: out, forms, sibling: sibling_rows })
}

/// Error statistics of one group of validation rows.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ApeStats {
    pub count: usize,
    pub median_ape: f64,
    pub p90_ape: f64,
    pub max_ape: f64,
}

pub fn stats(apes: &mut [f64]) -> ApeStats {
    apes.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| if apes.is_empty() { f64::NAN } else { crate::quantile::nearest_rank(apes, p) };
    ApeStats { count: apes.len(), median_ape: q(0.5), p90_ape: q(0.9), max_ape: apes.last().copied().unwrap_or(f64::NAN) }
}

/// Tiers in report order.
pub const TIERS: [Tier; 3] = [Tier::Target, Tier::CrossGen, Tier::Roofline];

/// Stats keyed by (tier, op) pooled over GPUs, and by (tier, op, gpu); tier keys are
/// `Tier::as_str`.
pub type Pooled = BTreeMap<(&'static str, String), ApeStats>;
pub type PerGpu = BTreeMap<(&'static str, String, String), ApeStats>;

pub fn summarize(rows: &[ValRow]) -> (Pooled, PerGpu) {
    let mut pooled: BTreeMap<(&'static str, String), Vec<f64>> = BTreeMap::new();
    let mut per_gpu: BTreeMap<(&'static str, String, String), Vec<f64>> = BTreeMap::new();
    for r in rows {
        pooled.entry((r.tier.as_str(), r.kernel.op.to_string())).or_default().push(r.ape());
        per_gpu.entry((r.tier.as_str(), r.kernel.op.to_string(), r.gpu.clone())).or_default().push(r.ape());
    }
    (
        pooled.into_iter().map(|(k, mut v)| (k, stats(&mut v))).collect(),
        per_gpu.into_iter().map(|(k, mut v)| (k, stats(&mut v))).collect(),
    )
}

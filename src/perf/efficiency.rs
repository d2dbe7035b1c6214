//! The calibrated kernel-time model the simulator and `kernel` command use:
//! `KernelModel::load(gpu, tier)` picks the fitted models for a GPU and tier from
//! `calibration/` (embedded), falling back per op from target to cross-gen to roofline and
//! saying so; `predict_us` is never below the kernel's SOL.

use super::roofline::RooflineModel;
use super::sol::sol;
use super::{KernelTimeModel, Tier};
use crate::calibrate::model::ModelSet;
use crate::calibrate::store::{self, RooflineFile, Store};
use crate::hardware::GpuSpec;
use crate::schema::{Kernel, Op};
use anyhow::Result;
use std::collections::BTreeMap;

pub struct KernelModel {
    gpu: GpuSpec,
    requested: Tier,
    used: Tier,
    warnings: Vec<String>,
    /// Per op: the model set (tier) that serves it.
    ops: BTreeMap<Op, (Tier, std::sync::Arc<ModelSet>)>,
    roofline: RooflineModel,
    backend: Option<String>,
    /// Per op family, a kernel-library prefix that overrides `backend` (an engine's own kernels).
    op_backends: BTreeMap<Op, String>,
}

impl KernelModel {
    /// Loads the embedded calibration for `gpu` at `tier`.
    pub fn load(gpu: &GpuSpec, tier: Tier) -> Result<KernelModel> {
        Self::load_from(&Store::Embedded, gpu, tier)
    }

    /// Loads from `store` (embedded or a directory written by `calibrate`).
    pub fn load_from(store: &Store, gpu: &GpuSpec, tier: Tier) -> Result<KernelModel> {
        let mut warnings = Vec::new();
        let roof: Option<RooflineFile> = store.read(store::ROOFLINE_PATH)?;
        let params = match roof {
            Some(r) => r.params,
            None => {
                warnings.push(format!("no fitted roofline constants in calibration ({}); using defaults", store.describe()));
                Default::default()
            }
        };
        let roofline = RooflineModel { gpu: gpu.clone(), params };
        let mut model = KernelModel { gpu: gpu.clone(), requested: tier, used: tier, warnings, ops: BTreeMap::new(), roofline, backend: None, op_backends: BTreeMap::new() };
        if tier == Tier::Roofline {
            return Ok(model);
        }
        // Cross-gen for a measured GPU must not have seen it: its leave-out set holds every op
        // it measured; the all-GPU set (which never saw it for the other ops) fills the rest.
        let mut cross = store.model_set(&store::cross_gen_path(None))?;
        if let Some(loo) = store.model_set(&store::cross_gen_path(Some(&gpu.id)))? {
            let all = cross.get_or_insert_with(|| ModelSet { ops: Default::default(), ..loo.clone() });
            all.ops.retain(|op, _| !loo.held_out_ops.contains(op));
            all.ops.extend(loo.ops);
        }
        let target = if tier == Tier::Target { store.model_set(&store::target_path(&gpu.id))? } else { None };
        if tier == Tier::Target && target.is_none() {
            model.warnings.push(format!(
                "{}: no target-tier measurements in calibration; using cross-gen (predicted from the spec sheet and other GPUs)",
                gpu.id
            ));
            model.used = Tier::CrossGen;
        }
        if let Some(c) = cross {
            let c = std::sync::Arc::new(c);
            for op in c.ops.keys() {
                model.ops.insert(*op, (Tier::CrossGen, c.clone()));
            }
        }
        if let Some(t) = target {
            let t = std::sync::Arc::new(t);
            for op in t.ops.keys() {
                model.ops.insert(*op, (Tier::Target, t.clone()));
            }
            let fell_back: Vec<&str> =
                model.ops.iter().filter(|(_, (tr, _))| *tr == Tier::CrossGen).map(|(op, _)| op.as_str()).collect();
            if !fell_back.is_empty() {
                model.warnings.push(format!(
                    "{}: too few target measurements (< {} rows) for {}; those ops use cross-gen",
                    gpu.id,
                    crate::calibrate::MIN_TARGET_ROWS,
                    fell_back.join(", ")
                ));
            }
        }
        if model.ops.is_empty() {
            model.warnings.push(format!("no fitted models in calibration ({}); using the roofline tier", store.describe()));
            model.used = Tier::Roofline;
        }
        Ok(model)
    }

    /// Prefer this kernel-library category (`vllm`, `trtllm`, ...) where a model knows one that
    /// starts with it; otherwise each op's most measured backend is assumed.
    pub fn with_backend(mut self, backend: &str) -> Self {
        self.backend = Some(backend.to_string());
        self
    }

    /// Per op family, prefer the backend starting with the given prefix (e.g. transformers'
    /// packed attention `sdpa_cudnn_masked` for attn_prefill); other ops keep `with_backend`.
    pub fn with_op_backends(mut self, backends: &BTreeMap<Op, String>) -> Self {
        self.op_backends = backends.clone();
        self
    }

    /// The tier actually used (after fallbacks).
    pub fn tier_used(&self) -> Tier {
        self.used
    }

    pub fn tier_requested(&self) -> Tier {
        self.requested
    }

    /// Fallbacks taken while loading, for the user to see.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The tier that serves `op` (ops with no fitted model use the roofline constants).
    pub fn tier_for(&self, op: Op) -> Tier {
        self.ops.get(&op).map(|(t, _)| *t).unwrap_or(Tier::Roofline)
    }

    pub fn gpu(&self) -> &GpuSpec {
        &self.gpu
    }

    pub fn predict_us(&self, k: &Kernel) -> f64 {
        let pref = self.op_backends.get(&k.op).or(self.backend.as_ref());
        self.predict_us_with(k, pref.map(String::as_str))
    }

    /// As `predict_us`, preferring the backend that starts with `pref` (e.g. a measured row's
    /// own backend) over the configured ones.
    pub fn predict_us_with(&self, k: &Kernel, pref: Option<&str>) -> f64 {
        match self.ops.get(&k.op).and_then(|(_, set)| set.ops.get(&k.op)) {
            Some(m) => {
                let backend = pref.and_then(|pref| {
                    m.backends.iter().filter(|b| b.starts_with(pref)).find(|b| !b.contains("power_law")).map(String::as_str)
                });
                m.predict_us(k, &self.gpu, backend)
            }
            None => self.roofline.predict_us(k).max(sol(k, &self.gpu).sol_us),
        }
    }
}

impl KernelTimeModel for KernelModel {
    fn predict_us(&self, k: &Kernel) -> f64 {
        KernelModel::predict_us(self, k)
    }

    fn predict_us_in(&self, k: &Kernel, library: &str) -> f64 {
        self.predict_us_with(k, Some(library))
    }

    fn tier(&self) -> Tier {
        self.used
    }

    fn describe(&self) -> String {
        let mut by_tier: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (op, (t, _)) in &self.ops {
            by_tier.entry(t.as_str()).or_default().push(op.as_str());
        }
        let parts: Vec<String> = by_tier.iter().map(|(t, ops)| format!("{t}: {}", ops.join(","))).collect();
        format!(
            "calibrated {} on {} ({}; other ops roofline)",
            self.used.as_str(),
            self.gpu.id,
            if parts.is_empty() { "no fitted ops".to_string() } else { parts.join("; ") }
        )
    }
}

//! Step-time predictor: expands a batch into kernels (`kernels::graph`), times each with a
//! kernel-time model, and adds host overhead. Token-count-dependent kernels (GEMMs, norms,
//! collectives) are memoized by (tokens, sequences); attention is timed per step.

use super::host::HostOverhead;
use super::{KernelTimeModel, SeqWork, StepCost, StepTimeModel, Tier};
use crate::deployment::Deployment;
use crate::hardware::GpuSpec;
use crate::kernels::graph::{attention_kernels, packed_sdpa_kernels, token_kernels, AttentionImpl, KernelInstance};
use crate::model::ModelConfig;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The kernel-time model for `tier` on `gpu` (calibrated where `calibration/` has fitted
/// models, falling back to cross-gen and then roofline per op), and a note on any fallback.
pub fn kernel_model_for(gpu: &GpuSpec, tier: Tier) -> anyhow::Result<(Arc<dyn KernelTimeModel>, Option<String>)> {
    let km = super::efficiency::KernelModel::load(gpu, tier)?;
    let note = if km.warnings().is_empty() { None } else { Some(km.warnings().join("; ")) };
    Ok((Arc::new(km), note))
}

/// As `kernel_model_for`, timing each op with the kernel library `engine` runs.
pub fn kernel_model_for_engine(
    gpu: &GpuSpec,
    tier: Tier,
    engine: &crate::sim::engine::EngineParams,
) -> anyhow::Result<(Arc<dyn KernelTimeModel>, Option<String>)> {
    let km = super::efficiency::KernelModel::load(gpu, tier)?.with_op_backends(&engine.op_backends()?);
    let note = if km.warnings().is_empty() { None } else { Some(km.warnings().join("; ")) };
    Ok((Arc::new(km), note))
}

/// One row of a step's kernel table.
#[derive(Debug, Clone, Serialize)]
pub struct TimedKernel {
    pub instance: KernelInstance,
    pub sol: super::sol::Sol,
    /// Predicted time of one launch.
    pub predicted_us: f64,
}

pub struct Predictor {
    pub model: ModelConfig,
    pub gpu: GpuSpec,
    pub dep: Deployment,
    pub host: HostOverhead,
    pub attention_impl: AttentionImpl,
    kernel_model: Arc<dyn KernelTimeModel>,
    token_cache: Mutex<HashMap<(u64, u64), StepCost>>,
}

impl Predictor {
    /// Builds a predictor for `tier`. Until calibrated models exist every tier falls back to
    /// the roofline model; `describe()` says which model is in use.
    pub fn new(model: &ModelConfig, gpu: &GpuSpec, dep: &Deployment, tier: Tier) -> anyhow::Result<Predictor> {
        dep.validate()?;
        let (km, _note) = kernel_model_for(gpu, tier)?;
        Ok(Predictor::with_kernel_model(model, gpu, dep, km))
    }

    pub fn with_kernel_model(model: &ModelConfig, gpu: &GpuSpec, dep: &Deployment, km: Arc<dyn KernelTimeModel>) -> Predictor {
        Predictor {
            model: model.clone(),
            gpu: gpu.clone(),
            dep: dep.clone(),
            host: HostOverhead::default(),
            attention_impl: AttentionImpl::PerSequence,
            kernel_model: km,
            token_cache: Mutex::new(HashMap::new()),
        }
    }

    pub fn with_host_overhead(mut self, host: HostOverhead) -> Self {
        self.host = host;
        self
    }

    pub fn with_attention_impl(mut self, attention_impl: AttentionImpl) -> Self {
        self.attention_impl = attention_impl;
        self
    }

    fn attention(&self, seqs: &[SeqWork]) -> Vec<KernelInstance> {
        match self.attention_impl {
            AttentionImpl::PerSequence => attention_kernels(&self.model, &self.dep, seqs),
            AttentionImpl::PackedSdpa => packed_sdpa_kernels(&self.model, &self.dep, seqs),
        }
    }

    pub fn tier(&self) -> Tier {
        self.kernel_model.tier()
    }

    pub fn kernel_us(&self, k: &crate::schema::Kernel) -> f64 {
        self.kernel_model.predict_us(k)
    }

    /// Every kernel of one step with its SOL and predicted time.
    pub fn kernel_table(&self, seqs: &[SeqWork]) -> Vec<TimedKernel> {
        let tokens: u64 = seqs.iter().map(|s| s.new_tokens as u64).sum();
        let mut kernels = token_kernels(&self.model, &self.dep, tokens, seqs.len() as u64);
        kernels.extend(self.attention(seqs));
        kernels
            .into_iter()
            .map(|instance| {
                let sol = super::sol::sol(&instance.kernel, &self.gpu);
                let predicted_us = self.kernel_model.predict_us(&instance.kernel);
                TimedKernel { instance, sol, predicted_us }
            })
            .collect()
    }

    fn add_kernels(&self, cost: &mut StepCost, kernels: &[KernelInstance]) {
        for ki in kernels {
            let us = self.kernel_model.predict_us(&ki.kernel) * ki.count as f64;
            cost.add_class(ki.kernel.op.class(), us);
        }
    }

    fn token_cost(&self, tokens: u64, seqs: u64) -> StepCost {
        if let Some(c) = self.token_cache.lock().expect("cache poisoned").get(&(tokens, seqs)) {
            return c.clone();
        }
        let mut cost = StepCost::default();
        self.add_kernels(&mut cost, &token_kernels(&self.model, &self.dep, tokens, seqs));
        self.token_cache.lock().expect("cache poisoned").insert((tokens, seqs), cost.clone());
        cost
    }
}

impl StepTimeModel for Predictor {
    fn step_time(&self, seqs: &[SeqWork]) -> StepCost {
        let tokens: u64 = seqs.iter().map(|s| s.new_tokens as u64).sum();
        let mut cost = self.token_cost(tokens, seqs.len() as u64);
        self.add_kernels(&mut cost, &self.attention(seqs));
        let gpu_us = cost.total_us;
        let wall_us = self.host.step_us(gpu_us, self.model.num_layers, seqs.len(), tokens);
        cost.add_class("host", wall_us - gpu_us);
        cost
    }

    fn describe(&self) -> String {
        self.kernel_model.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::load_gpu;

    fn llama() -> (ModelConfig, GpuSpec) {
        (ModelConfig::load("llama-3.1-8b").unwrap(), load_gpu("h200_sxm").unwrap())
    }

    #[test]
    fn decode_step_reads_all_weights_once() {
        let (m, g) = llama();
        let p = Predictor::new(&m, &g, &Deployment::default(), Tier::Roofline).unwrap();
        let table = p.kernel_table(&[SeqWork { new_tokens: 1, cached_tokens: 100 }]);
        let gemm_bytes: f64 = table
            .iter()
            .filter(|t| t.instance.kernel.op == crate::schema::Op::Gemm)
            .map(|t| t.sol.bytes * t.instance.count as f64)
            .sum();
        // All linear weights except the embedding table: 8.03e9 - 128256*4096 params, 2 bytes each.
        let expected = (8.030e9 - 128256.0 * 4096.0) * 2.0;
        assert!((gemm_bytes / expected - 1.0).abs() < 0.01, "{gemm_bytes} vs {expected}");
    }

    #[test]
    fn step_time_is_order_independent_and_sums_classes() {
        let (m, g) = llama();
        let p = Predictor::new(&m, &g, &Deployment::default(), Tier::Roofline).unwrap();
        let a = [SeqWork { new_tokens: 512, cached_tokens: 0 }, SeqWork { new_tokens: 1, cached_tokens: 2000 }];
        let b = [a[1], a[0]];
        let (ca, cb) = (p.step_time(&a), p.step_time(&b));
        assert_eq!(ca, cb);
        let sum: f64 = ca.classes().iter().map(|c| c.1).sum();
        assert!((sum - ca.total_us).abs() < 1e-6);
        // More context makes decode slower.
        let longer = p.step_time(&[SeqWork { new_tokens: 1, cached_tokens: 100_000 }]);
        let shorter = p.step_time(&[SeqWork { new_tokens: 1, cached_tokens: 100 }]);
        assert!(longer.total_us > shorter.total_us);
    }

    #[test]
    fn tensor_parallel_adds_communication() {
        let (m, g) = llama();
        let dep = Deployment { tp: 2, ..Deployment::default() };
        let p = Predictor::new(&m, &g, &dep, Tier::Roofline).unwrap();
        let c = p.step_time(&[SeqWork { new_tokens: 256, cached_tokens: 0 }]);
        assert!(c.communication_us > 0.0);
        let p1 = Predictor::new(&m, &g, &Deployment::default(), Tier::Roofline).unwrap();
        assert!(p1.step_time(&[SeqWork { new_tokens: 256, cached_tokens: 0 }]).communication_us == 0.0);
    }
}

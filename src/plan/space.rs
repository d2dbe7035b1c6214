//! The search space: every combination of GPU type, tensor/pipeline/expert parallelism,
//! replicas, precision, engine limits and (optionally) prefill/decode pool split, with the
//! layouts that cannot run pruned and the reason kept.

use super::candidate::{Candidate, EngineLimits, PoolSplit};
use crate::deployment::Deployment;
use crate::hardware::GpuSpec;
use crate::kernels::memory;
use crate::model::ModelConfig;
use crate::schema::Dtype;
use anyhow::{bail, Result};
use serde::Serialize;

#[derive(Debug, Clone)]
pub struct SearchSpace {
    pub gpus: Vec<GpuSpec>,
    /// Weight and activation dtypes of the GEMMs.
    pub dtypes: Vec<Dtype>,
    pub kv_dtypes: Vec<Dtype>,
    /// Tensor-parallel degrees; those above a GPU's NVLink domain (gpus_per_node) are skipped.
    pub tp: Vec<u64>,
    pub pp: Vec<u64>,
    pub max_num_seqs: Vec<u32>,
    pub max_num_batched_tokens: Vec<u32>,
    /// Upper bound on GPUs of one deployment (all replicas, both pools).
    pub max_gpus: u64,
    /// Also consider disaggregated prefill/decode pools (every split of 2+ replicas).
    pub disaggregated: bool,
    pub gpu_memory_utilization: f64,
    /// The engine's attention buffers, part of every layout's activation peak.
    pub buffers: memory::EngineBuffers,
    /// KV tokens one replica must hold: the longest request of the workload (prompt + output).
    pub min_kv_tokens: u64,
}

/// A layout that was not simulated, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pruned {
    pub layout: String,
    pub reason: String,
}

#[derive(Debug, Clone, Default)]
pub struct Enumerated {
    pub candidates: Vec<Candidate>,
    pub pruned: Vec<Pruned>,
}

impl SearchSpace {
    pub fn validate(&self) -> Result<()> {
        let lists: [(&str, bool); 7] = [
            ("--gpus", self.gpus.is_empty()),
            ("--dtype", self.dtypes.is_empty()),
            ("--kv-dtype", self.kv_dtypes.is_empty()),
            ("--tp", self.tp.is_empty()),
            ("--pp", self.pp.is_empty()),
            ("--max-num-seqs", self.max_num_seqs.is_empty()),
            ("--max-num-batched-tokens", self.max_num_batched_tokens.is_empty()),
        ];
        for (flag, empty) in lists {
            if empty {
                bail!("{flag} needs at least one value");
            }
        }
        for (flag, v) in [("--tp", &self.tp), ("--pp", &self.pp)] {
            if v.contains(&0) {
                bail!("{flag} values must be >= 1, got {v:?}");
            }
        }
        if self.max_num_seqs.contains(&0) {
            bail!("--max-num-seqs values must be >= 1, got {:?}", self.max_num_seqs);
        }
        if self.max_num_batched_tokens.contains(&0) {
            bail!("--max-num-batched-tokens values must be >= 1, got {:?}", self.max_num_batched_tokens);
        }
        for &mbt in &self.max_num_batched_tokens {
            if let Some(&seqs) = self.max_num_seqs.iter().find(|&&s| mbt < s) {
                bail!(
                    "--max-num-batched-tokens {mbt} is below --max-num-seqs {seqs}: a step could not even hold one decode token per running sequence"
                );
            }
        }
        if self.max_gpus == 0 {
            bail!("--max-gpus must be >= 1");
        }
        if !(self.gpu_memory_utilization > 0.0 && self.gpu_memory_utilization <= 1.0) {
            bail!("--gpu-memory-utilization must be in (0, 1], got {}", self.gpu_memory_utilization);
        }
        Ok(())
    }

    /// Every candidate that fits in memory, in a fixed order (GPU, dtype, kv dtype, tp, pp,
    /// ep, limits, replicas, pool split), and the layouts pruned with their reasons.
    pub fn enumerate(&self, model: &ModelConfig) -> Result<Enumerated> {
        self.validate()?;
        let mut out = Enumerated::default();
        for gpu in &self.gpus {
            for &dtype in &self.dtypes {
                for &kv_dtype in &self.kv_dtypes {
                    for &tp in &self.tp {
                        for &pp in &self.pp {
                            for ep in ep_options(model, tp) {
                                let dep = Deployment { tp, pp, ep, dp: 1, weight_dtype: dtype, act_dtype: dtype, kv_dtype };
                                self.expand_replica(model, gpu, dep, &mut out);
                            }
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Adds the candidates built on one replica layout, or records why it cannot run.
    fn expand_replica(&self, model: &ModelConfig, gpu: &GpuSpec, dep: Deployment, out: &mut Enumerated) {
        let layout = format!("{} tp{} pp{} ep{} {} kv{}", gpu.id, dep.tp, dep.pp, dep.ep, dep.weight_dtype.as_str(), dep.kv_dtype.as_str());
        let mut prune = |reason: String| out.pruned.push(Pruned { layout: layout.clone(), reason });
        if dep.tp > gpu.interconnect.gpus_per_node as u64 {
            return prune(format!("tp {} spans more than one {}-GPU NVLink domain", dep.tp, gpu.interconnect.gpus_per_node));
        }
        if let Err(e) = dep.check_split(model) {
            return prune(e.to_string());
        }
        let per_replica = dep.gpus_per_replica();
        if per_replica > self.max_gpus {
            return prune(format!("one replica needs {per_replica} GPUs, above --max-gpus {}", self.max_gpus));
        }
        // The memory plan depends on the token budget, not on max_num_seqs: one verdict each.
        let mut budgets = Vec::new();
        for &mbt in &self.max_num_batched_tokens {
            let plan = match memory::plan(model, gpu, &dep, self.gpu_memory_utilization, mbt as u64, self.buffers) {
                Ok(p) => p,
                Err(e) => {
                    out.pruned.push(Pruned { layout: format!("{layout} mbt{mbt}"), reason: e.to_string() });
                    continue;
                }
            };
            if plan.kv_capacity_tokens < self.min_kv_tokens {
                out.pruned.push(Pruned {
                    layout: format!("{layout} mbt{mbt}"),
                    reason: format!(
                        "KV cache holds {} tokens per replica, below the workload's longest request ({} tokens)",
                        plan.kv_capacity_tokens, self.min_kv_tokens
                    ),
                });
                continue;
            }
            budgets.push(mbt);
        }
        for &max_num_seqs in &self.max_num_seqs {
            for &mbt in &budgets {
                let limits = EngineLimits { max_num_seqs, max_num_batched_tokens: mbt };
                let max_replicas = self.max_gpus / per_replica;
                for dp in 1..=max_replicas {
                    let dep = Deployment { dp, ..dep.clone() };
                    out.candidates.push(Candidate { gpu: gpu.id.clone(), dep: dep.clone(), limits, disagg: None });
                    if self.disaggregated {
                        for prefill_replicas in 1..dp {
                            let split = PoolSplit { prefill_replicas, decode_replicas: dp - prefill_replicas };
                            out.candidates.push(Candidate { gpu: gpu.id.clone(), dep: dep.clone(), limits, disagg: Some(split) });
                        }
                    }
                }
            }
        }
    }
}

/// Expert-parallel choices: dense models 1; MoE models either replicate experts over the TP
/// group with each expert's matrices split (ep 1) or give each GPU whole experts (ep = tp).
fn ep_options(model: &ModelConfig, tp: u64) -> Vec<u64> {
    match (&model.moe, tp) {
        (Some(_), t) if t > 1 => vec![1, t],
        _ => vec![1],
    }
}

/// Powers of two up to `max`, the usual TP degrees.
pub fn powers_of_two_up_to(max: u64) -> Vec<u64> {
    std::iter::successors(Some(1u64), |&x| Some(x * 2)).take_while(|&x| x <= max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::load_gpu;

    fn space(max_gpus: u64) -> SearchSpace {
        SearchSpace {
            gpus: vec![load_gpu("h200_sxm").unwrap()],
            dtypes: vec![Dtype::Bf16],
            kv_dtypes: vec![Dtype::Bf16],
            tp: vec![1, 2, 4, 8],
            pp: vec![1],
            max_num_seqs: vec![256],
            max_num_batched_tokens: vec![8192],
            max_gpus,
            disaggregated: false,
            gpu_memory_utilization: 0.9,
            buffers: memory::EngineBuffers::Paged,
            min_kv_tokens: 4096,
        }
    }

    #[test]
    fn llama_70b_bf16_needs_two_h200s() {
        // 70.6e9 params x 2 bytes = 141 GB > 141 GB x 0.9 on one GPU; fits on two.
        let m = ModelConfig::load("llama-3.1-70b").unwrap();
        let e = space(8).enumerate(&m).unwrap();
        assert!(e.candidates.iter().all(|c| c.dep.tp >= 2));
        let tp1 = e.pruned.iter().find(|p| p.layout.contains("tp1 ")).expect("tp1 pruned");
        assert!(tp1.reason.contains("does not fit") && tp1.reason.contains("GiB"), "{}", tp1.reason);
        // Replicas up to 8 GPUs: tp2 x1..4, tp4 x1..2, tp8 x1 = 7 candidates.
        assert_eq!(e.candidates.len(), 7);
        assert!(e.candidates.iter().all(|c| c.total_gpus() <= 8));
    }

    #[test]
    fn a_layout_memory_rules_out_is_pruned_once_per_token_budget() {
        // The memory plan does not depend on max_num_seqs: two limits, one verdict per budget.
        let m = ModelConfig::load("llama-3.1-70b").unwrap();
        let s = SearchSpace { tp: vec![1], max_num_seqs: vec![64, 256], max_num_batched_tokens: vec![2048, 8192], max_gpus: 1, ..space(1) };
        let e = s.enumerate(&m).unwrap();
        let layouts: Vec<&str> = e.pruned.iter().map(|p| p.layout.as_str()).collect();
        assert_eq!(layouts, ["h200_sxm tp1 pp1 ep1 bf16 kvbf16 mbt2048", "h200_sxm tp1 pp1 ep1 bf16 kvbf16 mbt8192"]);
        assert!(e.candidates.is_empty());
    }

    #[test]
    fn fp8_fits_where_bf16_does_not() {
        let m = ModelConfig::load("llama-3.1-70b").unwrap();
        let s = SearchSpace { dtypes: vec![Dtype::Fp8], tp: vec![1], max_gpus: 1, ..space(1) };
        let e = s.enumerate(&m).unwrap();
        assert_eq!(e.candidates.len(), 1, "{:?}", e.pruned);
    }

    #[test]
    fn disaggregated_splits_every_ratio() {
        let m = ModelConfig::load("llama-3.1-8b").unwrap();
        let s = SearchSpace { tp: vec![1], disaggregated: true, ..space(4) };
        let e = s.enumerate(&m).unwrap();
        // dp 1..4 colocated (4) + splits of 2 (1), 3 (2), 4 (3) replicas = 10.
        assert_eq!(e.candidates.len(), 10);
        let splits: Vec<_> = e.candidates.iter().filter_map(|c| c.disagg).filter(|s| s.prefill_replicas + s.decode_replicas == 4).collect();
        assert_eq!(splits.len(), 3);
    }

    #[test]
    fn moe_gets_expert_parallel_options_and_heads_must_divide() {
        let m = ModelConfig::load("qwen3-30b-a3b").unwrap();
        let e = SearchSpace { tp: vec![2], ..space(2) }.enumerate(&m).unwrap();
        let eps: Vec<u64> = e.candidates.iter().map(|c| c.dep.ep).collect();
        assert_eq!(eps, vec![1, 2]);
        let mut s = space(8);
        s.tp = vec![3];
        let e = s.enumerate(&ModelConfig::load("llama-3.1-8b").unwrap()).unwrap();
        assert!(e.candidates.is_empty());
        assert!(e.pruned[0].reason.contains("attention heads = 32 is not divisible by 3"), "{:?}", e.pruned);
    }

    #[test]
    fn impossible_limits_are_errors() {
        let m = ModelConfig::load("llama-3.1-8b").unwrap();
        let s = SearchSpace { max_num_batched_tokens: vec![128], ..space(1) };
        assert!(s.enumerate(&m).unwrap_err().to_string().contains("below --max-num-seqs 256"));
        let s = SearchSpace { max_num_seqs: vec![0], ..space(1) };
        assert!(s.enumerate(&m).unwrap_err().to_string().contains("--max-num-seqs"));
        let s = SearchSpace { gpus: vec![], ..space(1) };
        assert!(s.enumerate(&m).unwrap_err().to_string().contains("--gpus"));
    }

    #[test]
    fn powers() {
        assert_eq!(powers_of_two_up_to(8), vec![1, 2, 4, 8]);
        assert_eq!(powers_of_two_up_to(6), vec![1, 2, 4]);
    }
}

//! How a model is laid out on GPUs and in which precisions.

use crate::model::ModelConfig;
use crate::schema::Dtype;
use anyhow::{bail, Result};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Deployment {
    /// Tensor parallel degree (GPUs sharing each layer).
    pub tp: u64,
    /// Pipeline stages.
    pub pp: u64,
    /// Expert parallel degree for MoE layers (experts split over `ep` GPUs of the TP group).
    pub ep: u64,
    /// Data-parallel replicas (each a full tp x pp engine).
    pub dp: u64,
    pub weight_dtype: Dtype,
    pub act_dtype: Dtype,
    pub kv_dtype: Dtype,
}

impl Default for Deployment {
    fn default() -> Self {
        Deployment { tp: 1, pp: 1, ep: 1, dp: 1, weight_dtype: Dtype::Bf16, act_dtype: Dtype::Bf16, kv_dtype: Dtype::Bf16 }
    }
}

impl Deployment {
    /// GPUs one replica uses.
    pub fn gpus_per_replica(&self) -> u64 {
        self.tp * self.pp
    }

    pub fn total_gpus(&self) -> u64 {
        self.gpus_per_replica() * self.dp
    }

    pub fn validate(&self) -> Result<()> {
        for (name, v) in [("tp", self.tp), ("pp", self.pp), ("ep", self.ep), ("dp", self.dp)] {
            if v == 0 {
                bail!("deployment field '{name}' must be >= 1");
            }
        }
        if self.ep > self.tp * self.pp.max(1) && self.ep > self.tp {
            bail!("ep ({}) must not exceed the GPUs of one replica's layer group (tp = {})", self.ep, self.tp);
        }
        if self.tp % self.ep != 0 {
            bail!("tp ({}) must be a multiple of ep ({}): experts are split over ep GPUs of the tp group", self.tp, self.ep);
        }
        Ok(())
    }
}

impl Deployment {
    /// Whether tensor parallelism splits `model` evenly, as serving engines require (vLLM's
    /// `divide` asserts an exact split, and it refuses the model otherwise): query heads, KV heads
    /// (split, or replicated when there are fewer than tp), linear-attention heads and the MLP
    /// widths (experts' over tp / ep GPUs). An uneven split would be priced as a layout no
    /// engine runs.
    pub fn check_split(&self, model: &ModelConfig) -> Result<()> {
        let tp = self.tp;
        let uneven = |what: &str, n: u64, over: u64| {
            anyhow::anyhow!("tp {tp} does not split {}: {what} = {n} is not divisible by {over}; tp must divide it", model.name)
        };
        if !model.num_heads.is_multiple_of(tp) {
            return Err(uneven("attention heads", model.num_heads, tp));
        }
        let kv = model.num_kv_heads;
        if model.mla.is_none() && kv > 0 && !(kv.is_multiple_of(tp) || tp.is_multiple_of(kv)) {
            bail!("tp {tp} does not split {}: its {kv} KV heads are neither divisible by tp nor a divisor of it (replicated)", model.name);
        }
        if let Some(l) = &model.linear {
            for (what, n) in [("linear-attention key heads", l.num_k_heads), ("linear-attention value heads", l.num_v_heads)] {
                if !n.is_multiple_of(tp) {
                    return Err(uneven(what, n, tp));
                }
            }
        }
        if model.layers.iter().any(|l| !l.moe) && !model.dense_inter.is_multiple_of(tp) {
            return Err(uneven("intermediate_size", model.dense_inter, tp));
        }
        if let Some(m) = &model.moe {
            let moe_tp = (tp / self.ep.max(1)).max(1);
            if !m.expert_inter.is_multiple_of(moe_tp) {
                return Err(uneven("the experts' intermediate size (over tp / ep)", m.expert_inter, moe_tp));
            }
            if !m.shared_inter.is_multiple_of(tp) {
                return Err(uneven("the shared expert's intermediate size", m.shared_inter, tp));
            }
        }
        Ok(())
    }

    /// Elementwise kernels run on 16-bit activations even in quantized deployments.
    pub fn act_dtype_for_elementwise(&self) -> Dtype {
        if self.act_dtype.is_quantized() {
            Dtype::Bf16
        } else {
            self.act_dtype
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(tp: u64) -> Deployment {
        Deployment { tp, ..Deployment::default() }
    }

    #[test]
    fn tensor_parallelism_must_split_heads_and_widths_evenly() {
        let qwen = ModelConfig::load("qwen2.5-7b").unwrap();
        assert!(tp(4).check_split(&qwen).is_ok());
        let err = tp(8).check_split(&qwen).unwrap_err().to_string();
        assert!(err.contains("attention heads = 28") && err.contains("by 8"), "{err}");
        // 8 KV heads over 16 GPUs are replicated, as engines do; 3 over 2 cannot be.
        let llama = ModelConfig::load("llama-3.1-8b").unwrap();
        assert!(tp(16).check_split(&llama).is_ok());
        let odd_kv = ModelConfig { num_kv_heads: 3, ..llama.clone() };
        assert!(tp(2).check_split(&odd_kv).unwrap_err().to_string().contains("3 KV heads"));
        let odd_mlp = ModelConfig { dense_inter: 14_338, ..llama };
        assert!(tp(4).check_split(&odd_mlp).unwrap_err().to_string().contains("intermediate_size = 14338"));
    }

    #[test]
    fn experts_split_over_tp_over_ep() {
        let qwen = ModelConfig::load("qwen3-30b-a3b").unwrap();
        let m = qwen.moe.clone().unwrap();
        // 768-wide experts split over 8 GPUs; 764-wide ones do not under ep 1, but do under
        // ep = tp, where each GPU holds whole experts.
        assert!(tp(8).check_split(&qwen).is_ok());
        let odd = ModelConfig { moe: Some(crate::model::MoeSpec { expert_inter: 764, ..m }), ..qwen };
        assert!(tp(8).check_split(&odd).unwrap_err().to_string().contains("experts' intermediate size"));
        assert!(Deployment { ep: 8, ..tp(8) }.check_split(&odd).is_ok());
    }
}

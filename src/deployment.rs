//! How a model is laid out on GPUs and in which precisions.

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
    /// Elementwise kernels run on 16-bit activations even in quantized deployments.
    pub fn act_dtype_for_elementwise(&self) -> Dtype {
        if self.act_dtype.is_quantized() {
            Dtype::Bf16
        } else {
            self.act_dtype
        }
    }
}

//! Flags shared by commands that take a model on a deployment.
use crate::deployment::Deployment;
use crate::hardware::{load_gpu, GpuSpec};
use crate::model::ModelConfig;
use crate::perf::Tier;
use crate::schema::Dtype;
use anyhow::Result;
use clap::Args;

#[derive(Debug, Clone, Args)]
pub struct DeployArgs {
    /// Model short name (see `models list`) or path to a Hugging Face config.json.
    #[arg(long, default_value = "llama-3.1-8b")]
    pub model: String,
    /// GPU id (see `hw list`) or path to a spec .toml.
    #[arg(long, default_value = "h200_sxm")]
    pub gpu: String,
    /// Tensor-parallel degree.
    #[arg(long, default_value_t = 1)]
    pub tp: u64,
    /// Pipeline-parallel stages.
    #[arg(long, default_value_t = 1)]
    pub pp: u64,
    /// Expert-parallel degree for MoE layers (divides tp).
    #[arg(long, default_value_t = 1)]
    pub ep: u64,
    /// Weight and activation dtype of the GEMMs: bf16, fp16, fp8, int8, fp4.
    #[arg(long, default_value = "bf16")]
    pub dtype: Dtype,
    /// KV-cache dtype (default bf16).
    #[arg(long)]
    pub kv_dtype: Option<Dtype>,
    /// Kernel-time model: target (fitted on this GPU; the default, falling back to cross-gen per
    /// op where the GPU has too few measurements), cross-gen (never uses the GPU's data) or
    /// roofline (the baseline).
    #[arg(long, value_enum)]
    pub tier: Option<Tier>,
}

impl DeployArgs {
    pub fn load(&self) -> Result<(ModelConfig, GpuSpec, Deployment)> {
        let model = ModelConfig::load(&self.model)?;
        let gpu = load_gpu(&self.gpu)?;
        let dep = Deployment {
            tp: self.tp,
            pp: self.pp,
            ep: self.ep,
            dp: 1,
            weight_dtype: self.dtype,
            act_dtype: self.dtype,
            kv_dtype: self.kv_dtype.unwrap_or(Dtype::Bf16),
        };
        dep.validate()?;
        Ok((model, gpu, dep))
    }
}

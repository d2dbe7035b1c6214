//! Flags shared by commands that take a model on a deployment.
use crate::deployment::Deployment;
use crate::hardware::{load_gpu, GpuSpec};
use crate::model::ModelConfig;
use crate::perf::Tier;
use crate::schema::Dtype;
use crate::perf::efficiency::KernelModel;
use crate::schema::Op;
use crate::sim::engine::{Backends, EngineParams};
use anyhow::{bail, Context, Result};
use clap::Args;
use crate::perf::host::{HostProbe, HostSpeed};
use std::path::PathBuf;

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
    /// KV-cache dtype (default: the engine's `kv_cache_dtype`, bf16 unless the engine takes an
    /// FP8 checkpoint's FP8 KV cache).
    #[arg(long)]
    pub kv_dtype: Option<Dtype>,
    /// Kernel-time model: target (fitted on this GPU; the default, falling back to cross-gen per
    /// op where the GPU has too few measurements), cross-gen (never uses the GPU's data) or
    /// roofline (the baseline).
    #[arg(long, value_enum)]
    pub tier: Option<Tier>,
}

impl DeployArgs {
    /// The deployment `engine` serves (its KV-cache dtype where `--kv-dtype` is not given).
    pub fn load(&self, engine: &EngineParams) -> Result<(ModelConfig, GpuSpec, Deployment)> {
        let model = ModelConfig::load(&self.model)?;
        let gpu = load_gpu(&self.gpu)?;
        let dep = Deployment {
            tp: self.tp,
            pp: self.pp,
            ep: self.ep,
            dp: 1,
            weight_dtype: self.dtype,
            act_dtype: self.dtype,
            kv_dtype: self.kv_dtype.unwrap_or_else(|| engine.kv_cache_dtype.for_weights(self.dtype)),
        };
        dep.validate()?;
        Ok((model, gpu, dep))
    }
}

/// `--kernel-backend OP=PREFIX[,PREFIX...]` flags: libraries the user names for an op family.
/// `--moe-routing` value (`kernels::cost::Routing::parse_served`).
pub fn parse_moe_routing(s: &str) -> std::result::Result<crate::kernels::cost::Routing, String> {
    crate::kernels::cost::Routing::parse_served(s)
}

#[derive(Debug, Default)]
pub struct NamedBackends(Vec<(String, String, Vec<String>)>);

impl NamedBackends {
    pub fn parse(specs: &[String]) -> Result<Self> {
        let mut out = Vec::new();
        for spec in specs {
            let Some((op, list)) = spec.split_once('=') else {
                bail!("--kernel-backend '{spec}': expected OP=PREFIX[,PREFIX...], e.g. moe=vllm/w4a16_mxfp4/vllm_gptossmxfp4moe_marlin");
            };
            let prefixes: Vec<String> = list.split(',').map(str::trim).filter(|p| !p.is_empty()).map(String::from).collect();
            if op.trim().is_empty() || prefixes.is_empty() {
                bail!("--kernel-backend '{spec}': both the op and at least one library prefix are needed");
            }
            out.push((spec.clone(), op.trim().to_string(), prefixes));
        }
        Ok(Self(out))
    }

    /// Replace the engine's `[kernel_backends]` entries (the op names are checked by the
    /// engine's validation).
    pub fn apply(&self, engine: &mut EngineParams) {
        for (_, op, prefixes) in &self.0 {
            engine.named_backends.insert(op.clone());
            engine.kernel_backends.insert(op.clone(), Backends::Many(prefixes.clone()));
        }
    }

    /// The kernel model for `tier`, with same-die siblings loaded when a library is named; a
    /// named library the model never measured is an error listing the ones it did.
    pub fn kernel_model(&self, gpu: &GpuSpec, dep: &Deployment, tier: Tier) -> Result<KernelModel> {
        let mut km = KernelModel::load(gpu, tier)?;
        if self.0.is_empty() {
            return Ok(km);
        }
        km = km.with_siblings()?;
        for (spec, op, prefixes) in &self.0 {
            let op: Op = op.parse().with_context(|| format!("--kernel-backend '{spec}'"))?;
            if let Some(known) = km.unknown_library(op, prefixes, dep.weight_dtype) {
                bail!("--kernel-backend '{spec}': no {} library calibrated for {} ({}) starts with {}; allowed: {}", op.as_str(), gpu.id, km.tier_used().as_str(), prefixes.join(" or "), known.join(", "));
            }
        }
        Ok(km)
    }
}

/// `--host-scale` / `--host-probe`, shared by every command that runs the host model.
#[derive(clap::Args, Debug, Clone)]
pub struct HostSpeedArgs {
    /// Host CPU speed against the machine the engine's host model was fitted on: every host
    /// term times this (1.5 = a host 1.5x slower; lent H200 machines differ by up to ~1.5x in
    /// vLLM's host-bound decode).
    #[arg(long, default_value_t = 1.0, allow_hyphen_values = true)]
    pub host_scale: f64,
    /// Probe readings of the serving host (`python3 microbench/e2e/host_speed_probe.py --out
    /// FILE`, a few readings; or a harness env.json): the host terms are scaled by their median
    /// `python_loop_ns` over the reading recorded for the machine the host model was fitted on.
    #[arg(long, num_args = 1.., value_name = "FILE", conflicts_with = "host_scale")]
    pub host_probe: Vec<PathBuf>,
}

impl HostSpeedArgs {
    pub fn speed(&self) -> Result<HostSpeed> {
        if self.host_probe.is_empty() {
            Ok(HostSpeed::Scale(self.host_scale))
        } else {
            Ok(HostSpeed::Probe(HostProbe::load(&self.host_probe)?))
        }
    }
}

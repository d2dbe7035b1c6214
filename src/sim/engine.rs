//! Engine parameters: which scheduling policy and its limits, read from
//! `calibration/engines/NAME.toml` (embedded) or a TOML file path.

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

include!(concat!(env!("OUT_DIR"), "/embedded_calibration.rs"));

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// vLLM v1: running requests first, then waiting FCFS, prefill and decode mixed in one step.
    Continuous,
    /// SGLang: a step is all prefill (if any request can be admitted) or all decode.
    PrefillFirst,
    /// Fixed batches formed when the engine is idle.
    Static,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EngineParams {
    pub name: String,
    pub description: String,
    pub policy: Policy,
    pub max_num_batched_tokens: u32,
    pub max_num_seqs: u32,
    pub block_size: u32,
    pub chunked_prefill: bool,
    pub prefix_caching: bool,
    pub gpu_memory_utilization: f64,
    pub pad_finished: bool,
    /// How attention runs over a batch (step-time model detail of the engine).
    #[serde(default)]
    pub attention_impl: crate::kernels::graph::AttentionImpl,
    /// Kernel libraries the engine runs, per op (`all_reduce = ["vllm/custom_ar_graph"]`): the
    /// categories of the calibrated kernel model's measurements that time its kernels, in
    /// preference order (see `KernelModel::with_libraries`). Ops not listed use each model's
    /// most measured category.
    #[serde(default)]
    pub kernels: std::collections::BTreeMap<crate::schema::Op, Vec<String>>,
}

impl EngineParams {
    /// By embedded name (`vllm`, `sglang`, `static`) or path to a TOML file.
    pub fn load(name_or_path: &str) -> Result<EngineParams> {
        let (text, origin) = if name_or_path.ends_with(".toml") {
            (std::fs::read_to_string(name_or_path).with_context(|| format!("reading engine file {name_or_path}"))?, name_or_path.to_string())
        } else {
            let file = format!("engines/{name_or_path}.toml");
            let text = EMBEDDED_CALIBRATION
                .iter()
                .find(|(p, _)| *p == file)
                .map(|(_, t)| t.to_string())
                .ok_or_else(|| anyhow!("unknown engine '{name_or_path}'; known: {} (or a path to an engine .toml)", builtin_engines().join(", ")))?;
            (text, format!("calibration/{file}"))
        };
        let p: EngineParams = toml::from_str(&text).map_err(|e| anyhow!("{origin}: {e}"))?;
        p.validate().with_context(|| origin.clone())?;
        Ok(p)
    }

    pub fn validate(&self) -> Result<()> {
        for (name, v) in [("max_num_batched_tokens", self.max_num_batched_tokens), ("max_num_seqs", self.max_num_seqs), ("block_size", self.block_size)] {
            if v == 0 {
                bail!("'{name}' must be at least 1");
            }
        }
        if !(self.gpu_memory_utilization > 0.0 && self.gpu_memory_utilization <= 1.0) {
            bail!("'gpu_memory_utilization' must be in (0, 1], got {}", self.gpu_memory_utilization);
        }
        Ok(())
    }
}

pub fn builtin_engines() -> Vec<String> {
    EMBEDDED_CALIBRATION
        .iter()
        .filter_map(|(p, _)| p.strip_prefix("engines/").and_then(|n| n.strip_suffix(".toml")).map(str::to_string))
        .collect()
}

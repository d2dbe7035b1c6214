//! Why a request can never be served, and the configured limit it broke.

use super::replica::Replica;
use super::SimConfig;
use crate::workload::RequestSpec;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rejection {
    ExceedsContext,
    ExceedsKvCache,
    ExceedsBatchTokens,
}

impl Rejection {
    /// The first limit `spec` breaks on replica `rep`, if any.
    pub fn of(spec: &RequestSpec, cfg: &SimConfig, rep: &Replica) -> Option<Self> {
        let total = spec.prompt_tokens as u64 + spec.output_tokens as u64;
        if total > cfg.max_model_len as u64 {
            return Some(Self::ExceedsContext);
        }
        if rep.pages_for(spec.prompt_tokens, spec.output_tokens) > cfg.num_gpu_blocks as u64 {
            return Some(Self::ExceedsKvCache);
        }
        // Without chunked prefill a whole (re)computation must fit one step's token budget.
        if !cfg.engine.chunked_prefill && total > cfg.engine.max_num_batched_tokens as u64 {
            return Some(Self::ExceedsBatchTokens);
        }
        None
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ExceedsContext => "exceeds_context",
            Self::ExceedsKvCache => "exceeds_kv_cache",
            Self::ExceedsBatchTokens => "exceeds_batch_tokens",
        }
    }

    /// The limit behind this rejection, with this configuration's numbers.
    pub fn limit(self, cfg: &SimConfig) -> String {
        match self {
            Self::ExceedsContext => format!("prompt + output tokens above max_model_len {}", cfg.max_model_len),
            Self::ExceedsKvCache => format!(
                "more KV blocks than the cache holds ({} blocks of {} tokens per replica)",
                cfg.num_gpu_blocks, cfg.engine.block_size
            ),
            Self::ExceedsBatchTokens => format!(
                "prompt + output tokens above max_num_batched_tokens {} with chunked prefill off",
                cfg.engine.max_num_batched_tokens
            ),
        }
    }
}

/// "N reason (limit)" for every reason counted, `sep`-joined: what an error names.
pub fn describe(counts: &std::collections::BTreeMap<Rejection, u64>, cfg: &SimConfig, sep: &str) -> String {
    counts.iter().map(|(k, n)| format!("{n} {k} ({})", k.limit(cfg))).collect::<Vec<_>>().join(sep)
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

//! CUDA graphs with padded shapes, as transformers' continuous batching runs them: every
//! step's packed queries are padded up to a multiple of `q_tokens` and the KV it reads up to a
//! multiple of `kv_tokens` (capped at the cache size), one graph is replayed per padded shape,
//! and a shape seen for the first time is captured then (the capture's cost is host time, see
//! `HostOverhead::graph_capture_us`). transformers' graph key (`_get_graph_key` of its varlen
//! path) also holds each attention type's longest key sequence, padded to a power of two of at
//! least `seqlen_k_pow2_min`: a request growing past 1024, 2048, ... keys captures a new graph.

use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::sync::Mutex;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphPadding {
    /// Query tokens of a step are padded up to a multiple of this.
    pub q_tokens: u32,
    /// KV tokens read by a step (summed over its requests) are padded up to a multiple of this.
    pub kv_tokens: u32,
    /// Where the graph key holds the longest key sequence per attention type: its power-of-two
    /// padding starts here (transformers 5.17: 1024). Absent: not part of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seqlen_k_pow2_min: Option<u32>,
    /// GPU idle per launched kernel inside a replayed graph, beyond what the kernel tables hold
    /// (their rows are graph replays of one kernel, so they hold one gap each already). Absent:
    /// none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_gap_per_kernel_ns: Option<u32>,
}

impl GraphPadding {
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.q_tokens == 0 || self.kv_tokens == 0 {
            anyhow::bail!("cuda_graphs: 'q_tokens' and 'kv_tokens' must be at least 1 (got {} and {})", self.q_tokens, self.kv_tokens);
        }
        if let Some(m) = self.seqlen_k_pow2_min.filter(|m| !m.is_power_of_two()) {
            anyhow::bail!("cuda_graphs: 'seqlen_k_pow2_min' must be a power of two (got {m})");
        }
        Ok(())
    }
}

/// Rounds `x` up to a multiple of `interval`, never above `cap` (but never below `x`). Zero
/// pads to one whole interval, as transformers' `pad_to_interval` does: a step of fresh
/// prompts reads no cached KV yet its graph reads `kv_padding_interval_size` padded keys.
pub fn pad_to(x: u64, interval: u64, cap: u64) -> u64 {
    let step = interval.max(1);
    let padded = if x == 0 { step } else { x.div_ceil(step) * step };
    padded.min(cap).max(x)
}

/// Padding in force for one simulated engine, with the graphs captured so far.
#[derive(Debug)]
pub struct CudaGraphs {
    pub padding: GraphPadding,
    /// Largest step in query tokens (the engine's token budget): q padding stops there.
    pub max_q_tokens: u64,
    /// KV cache size in tokens (per layer group): KV padding stops there.
    pub kv_cap_tokens: u64,
    captured: Mutex<HashSet<Vec<u64>>>,
    /// The most padded query tokens any capture so far ran: the engine's graphs share one
    /// memory pool, which only a larger capture grows.
    pool_tokens: Mutex<u64>,
}

impl CudaGraphs {
    pub fn new(padding: GraphPadding, max_q_tokens: u64, kv_cap_tokens: u64) -> CudaGraphs {
        CudaGraphs { padding, max_q_tokens, kv_cap_tokens, captured: Mutex::new(HashSet::new()), pool_tokens: Mutex::new(0) }
    }

    pub fn pad_q(&self, q: u64) -> u64 {
        pad_to(q, self.padding.q_tokens as u64, self.max_q_tokens)
    }

    pub fn pad_kv(&self, kv: u64) -> u64 {
        pad_to(kv, self.padding.kv_tokens as u64, self.kv_cap_tokens)
    }

    /// The graph key's entry for a longest key sequence of `len` tokens (None: not keyed).
    pub fn pad_seqlen_k(&self, len: u64) -> Option<u64> {
        self.padding.seqlen_k_pow2_min.map(|min| len.max(min as u64).next_power_of_two().min(self.kv_cap_tokens.max(min as u64)))
    }

    /// Records the graph of padded shape `key`, run at `padded` query tokens. None when it was
    /// captured before; else the query tokens by which this capture grows the graphs' shared
    /// memory pool (0 when an earlier capture was at least as large).
    pub fn capture(&self, key: Vec<u64>, padded: u64) -> Option<u64> {
        if !self.captured.lock().expect("graph set poisoned").insert(key) {
            return None;
        }
        let mut pool = self.pool_tokens.lock().expect("graph pool poisoned");
        let growth = padded.saturating_sub(*pool);
        *pool = (*pool).max(padded);
        Some(growth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_up_to_the_interval_within_the_cap() {
        assert_eq!(pad_to(8, 64, 8192), 64);
        assert_eq!(pad_to(64, 64, 8192), 64);
        assert_eq!(pad_to(65, 64, 8192), 128);
        assert_eq!(pad_to(4100, 16384, 98304), 16384);
        // A step of fresh prompts reads no cached KV: transformers still pads it to one interval.
        assert_eq!(pad_to(0, 16384, 98304), 16384);
        assert_eq!(pad_to(0, 16384, 8192), 8192);
        // The cap bounds the padding, not the real size.
        assert_eq!(pad_to(97_000, 16384, 98304), 98304);
        assert_eq!(pad_to(99_000, 16384, 98304), 99_000);
    }

    #[test]
    fn a_shape_is_captured_once_and_only_a_larger_capture_grows_the_pool() {
        let g = CudaGraphs::new(GraphPadding { q_tokens: 64, kv_tokens: 16384, seqlen_k_pow2_min: None, replay_gap_per_kernel_ns: None }, 8192, 98304);
        assert_eq!(g.capture(vec![8192, 0], 8192), Some(8192));
        assert_eq!(g.capture(vec![8192, 0], 8192), None);
        // Another shape as large or smaller reuses the pool the first one allocated.
        assert_eq!(g.capture(vec![8192, 16384], 8192), Some(0));
        assert_eq!(g.capture(vec![64, 16384], 64), Some(0));
        let h = CudaGraphs::new(GraphPadding { q_tokens: 64, kv_tokens: 16384, seqlen_k_pow2_min: None, replay_gap_per_kernel_ns: None }, 8192, 98304);
        assert_eq!(h.capture(vec![1216, 0], 1216), Some(1216));
        assert_eq!(h.capture(vec![1344, 16384], 1344), Some(128));
    }

    #[test]
    fn longest_key_sequence_pads_to_a_power_of_two_from_the_minimum() {
        let keyed = CudaGraphs::new(GraphPadding { q_tokens: 64, kv_tokens: 16384, seqlen_k_pow2_min: Some(1024), replay_gap_per_kernel_ns: None }, 8192, 98304);
        assert_eq!(keyed.pad_seqlen_k(1), Some(1024));
        assert_eq!(keyed.pad_seqlen_k(1024), Some(1024));
        assert_eq!(keyed.pad_seqlen_k(1025), Some(2048));
        assert_eq!(keyed.pad_seqlen_k(70_000), Some(98304));
        let unkeyed = CudaGraphs::new(GraphPadding { q_tokens: 64, kv_tokens: 16384, seqlen_k_pow2_min: None, replay_gap_per_kernel_ns: None }, 8192, 98304);
        assert_eq!(unkeyed.pad_seqlen_k(5000), None);
        assert!(GraphPadding { q_tokens: 64, kv_tokens: 16384, seqlen_k_pow2_min: Some(1000), replay_gap_per_kernel_ns: None }.validate().is_err());
    }
}

//! The run's summary: what `--json` prints and the terminal report shows.

use super::metrics::Percentiles;
use super::{Outcome, SimConfig};
use serde::Serialize;
use std::collections::BTreeMap;

pub const TPOT_DEFINITION: &str = "TPOT = (E2E - TTFT) / (output tokens - 1), per request with more than one output token";

#[derive(Debug, Clone, Serialize)]
pub struct KvSummary {
    /// Per replica.
    pub num_gpu_blocks: u32,
    pub block_size: u32,
    pub capacity_tokens: u64,
    /// Time-averaged fraction of blocks in use over the run (cached free blocks count as free).
    pub mean_util: f64,
    pub peak_util: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub engine: String,
    pub timing_model: String,
    pub num_requests: u64,
    pub completed: u64,
    pub rejected: u64,
    pub rejected_by_reason: BTreeMap<String, u64>,
    /// The limit behind each rejection reason, with this run's numbers.
    pub rejected_limits: BTreeMap<String, String>,
    /// From time 0 to the last completion.
    pub duration_s: f64,
    pub request_throughput_rps: f64,
    /// Output tokens per second.
    pub throughput_tok_s: f64,
    /// Prompt + output tokens per second.
    pub total_throughput_tok_s: f64,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    pub ttft_ms: Percentiles,
    pub tpot_ms: Percentiles,
    pub itl_ms: Percentiles,
    pub e2e_ms: Percentiles,
    pub queue_ms: Percentiles,
    pub tpot_definition: &'static str,
    pub slo_ttft_ms: Option<f64>,
    pub slo_tpot_ms: Option<f64>,
    /// Completed requests per second meeting every SLO given (None without SLOs).
    pub goodput_rps: Option<f64>,
    pub preemptions: u64,
    /// Prompt tokens found in the prefix cache over prompt tokens looked up, at admission.
    pub prefix_cache_hit_rate: f64,
    pub kv: KvSummary,
    pub steps: u64,
    pub mean_batch_seqs: f64,
    pub mean_batch_tokens: f64,
    /// Share of summed step time per kernel class.
    pub kernel_time_share: BTreeMap<String, f64>,
    pub dp: u32,
    pub pp: u32,
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

impl Summary {
    /// Every request was rejected: the limits each broke, for an error in place of a report of
    /// zeros (None when some request was served or none arrived).
    pub fn all_rejected(&self) -> Option<String> {
        if self.num_requests == 0 || self.completed > 0 || self.rejected < self.num_requests {
            return None;
        }
        let why: Vec<String> = self.rejected_by_reason.iter().map(|(k, n)| format!("{n} {k} ({})", self.rejected_limits[k])).collect();
        Some(format!("every request was rejected, none can be served: {}", why.join("; ")))
    }

    pub fn new(o: &Outcome, cfg: &SimConfig, timing_model: String) -> Summary {
        let r = &o.rec;
        let duration_s = r.last_finish_us * 1e-6;
        let class_total: f64 = r.class_us.iter().sum();
        // The recorder sums each step's classes in `StepCost::classes` order.
        let classes = crate::perf::StepCost::default().classes().map(|(name, _)| name);
        let kernel_time_share = classes.iter().zip(r.class_us).map(|(c, us)| (c.to_string(), ratio(us, class_total))).collect();
        let any_slo = cfg.slo_ttft_ms.is_some() || cfg.slo_tpot_ms.is_some();
        Summary {
            engine: cfg.engine.name.clone(),
            timing_model,
            num_requests: o.num_requests,
            completed: r.completed,
            rejected: r.rejected.values().sum(),
            rejected_by_reason: r.rejected.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            rejected_limits: r.rejected.keys().map(|k| (k.to_string(), k.limit(cfg))).collect(),
            duration_s,
            request_throughput_rps: ratio(r.completed as f64, duration_s),
            throughput_tok_s: ratio(r.output_tokens as f64, duration_s),
            total_throughput_tok_s: ratio((r.output_tokens + r.prompt_tokens) as f64, duration_s),
            prompt_tokens: r.prompt_tokens,
            output_tokens: r.output_tokens,
            ttft_ms: r.ttft_us.percentiles().scaled(1e-3),
            tpot_ms: r.tpot_us.percentiles().scaled(1e-3),
            itl_ms: r.itl_us.percentiles().scaled(1e-3),
            e2e_ms: r.e2e_us.percentiles().scaled(1e-3),
            queue_ms: r.queue_us.percentiles().scaled(1e-3),
            tpot_definition: TPOT_DEFINITION,
            slo_ttft_ms: cfg.slo_ttft_ms,
            slo_tpot_ms: cfg.slo_tpot_ms,
            goodput_rps: any_slo.then(|| ratio(r.good as f64, duration_s)),
            preemptions: r.preemptions,
            prefix_cache_hit_rate: ratio(r.prefix_hit_tokens as f64, r.prefix_query_tokens as f64),
            kv: KvSummary {
                num_gpu_blocks: cfg.num_gpu_blocks,
                block_size: cfg.engine.block_size,
                capacity_tokens: cfg.num_gpu_blocks as u64 * cfg.engine.block_size as u64,
                mean_util: ratio(o.kv_frac_s, o.end_us * 1e-6),
                peak_util: r.kv_peak_frac,
            },
            steps: r.steps,
            mean_batch_seqs: ratio(r.step_seqs as f64, r.steps as f64),
            mean_batch_tokens: ratio(r.step_tokens as f64, r.steps as f64),
            kernel_time_share,
            dp: cfg.dp,
            pp: cfg.pp,
        }
    }
}

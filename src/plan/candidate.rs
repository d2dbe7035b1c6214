//! One deployment the planner considers: GPU type, parallelism, precision, engine limits and
//! (optionally) separate prefill and decode pools.

use crate::deployment::Deployment;
use serde::Serialize;

/// Scheduler limits of one engine (vLLM's `--max-num-seqs`, `--max-num-batched-tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct EngineLimits {
    pub max_num_seqs: u32,
    pub max_num_batched_tokens: u32,
}

/// Disaggregated serving: `prefill` replicas compute prompts and ship their KV cache to
/// `decode` replicas, which generate the rest. Both pools use the candidate's tp/pp layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct PoolSplit {
    pub prefill_replicas: u64,
    pub decode_replicas: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    /// GPU id (an index into the planner's GPU list by id).
    pub gpu: String,
    /// Layout and precision; `dp` is the total replica count (both pools when disaggregated).
    pub dep: Deployment,
    pub limits: EngineLimits,
    pub disagg: Option<PoolSplit>,
}

impl Candidate {
    pub fn total_gpus(&self) -> u64 {
        self.dep.total_gpus()
    }

    /// Cost per hour at `price_usd_per_gpu_hour`.
    pub fn cost_usd_per_hour(&self, price_usd_per_gpu_hour: f64) -> f64 {
        self.total_gpus() as f64 * price_usd_per_gpu_hour
    }

    /// A short label such as "h200_sxm tp4 pp1 ep1 x2 fp8 seqs256 mbt8192" or, disaggregated,
    /// "... 1P+3D".
    pub fn label(&self) -> String {
        let d = &self.dep;
        let kv = if d.kv_dtype != d.weight_dtype { format!(" kv{}", d.kv_dtype.as_str()) } else { String::new() };
        let ep = if d.ep > 1 { format!(" ep{}", d.ep) } else { String::new() };
        let pools = match self.disagg {
            Some(s) => format!(" {}P+{}D", s.prefill_replicas, s.decode_replicas),
            None => format!(" x{}", d.dp),
        };
        format!(
            "{} tp{} pp{}{}{} {}{} seqs{} mbt{}",
            self.gpu, d.tp, d.pp, ep, pools, d.weight_dtype.as_str(), kv, self.limits.max_num_seqs, self.limits.max_num_batched_tokens
        )
    }

    /// One replica's layout (dp = 1), as the per-replica step-time model sees it.
    pub fn replica(&self) -> Deployment {
        Deployment { dp: 1, ..self.dep.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Dtype;

    #[test]
    fn gpus_cost_and_label() {
        let c = Candidate {
            gpu: "h200_sxm".into(),
            dep: Deployment { tp: 4, pp: 2, dp: 3, weight_dtype: Dtype::Fp8, act_dtype: Dtype::Fp8, ..Deployment::default() },
            limits: EngineLimits { max_num_seqs: 256, max_num_batched_tokens: 8192 },
            disagg: None,
        };
        assert_eq!(c.total_gpus(), 24);
        assert_eq!(c.cost_usd_per_hour(2.5), 60.0);
        assert_eq!(c.label(), "h200_sxm tp4 pp2 x3 fp8 kvbf16 seqs256 mbt8192");
        let d = Candidate { disagg: Some(PoolSplit { prefill_replicas: 1, decode_replicas: 2 }), ..c };
        assert!(d.label().contains(" 1P+2D "), "{}", d.label());
        assert_eq!(d.replica().dp, 1);
    }
}

//! Latency targets and the check that says which target a candidate misses and by how much.

use anyhow::{bail, Result};
use serde::Serialize;

/// Latency targets at one percentile (e.g. p99 TTFT < 1000 ms and p99 TPOT < 50 ms).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
    /// Percentile the targets apply to, in (0, 100].
    pub percentile: f64,
}

impl Slo {
    pub fn validate(&self) -> Result<()> {
        if !(self.percentile > 0.0 && self.percentile <= 100.0) {
            bail!("--percentile must be in (0, 100], got {}", self.percentile);
        }
        let targets = [("--slo-ttft-ms", self.ttft_ms), ("--slo-tpot-ms", self.tpot_ms), ("--slo-e2e-ms", self.e2e_ms)];
        for (flag, v) in targets {
            if let Some(v) = v {
                if !(v > 0.0 && v.is_finite()) {
                    bail!("{flag} must be a positive number of milliseconds, got {v}");
                }
            }
        }
        if targets.iter().all(|(_, v)| v.is_none()) {
            bail!("give at least one latency target: --slo-ttft-ms, --slo-tpot-ms or --slo-e2e-ms");
        }
        Ok(())
    }

    /// The targets that `lat` misses; empty when all are met.
    pub fn misses(&self, lat: &LatencyAtPercentile) -> Vec<Miss> {
        let mut out = Vec::new();
        let pairs = [("ttft", self.ttft_ms, lat.ttft_ms), ("tpot", self.tpot_ms, lat.tpot_ms), ("e2e", self.e2e_ms, lat.e2e_ms)];
        for (metric, limit, value) in pairs {
            if let Some(limit_ms) = limit {
                // NaN (no request finished) counts as a miss.
                if value.is_nan() || value > limit_ms {
                    out.push(Miss { metric, value_ms: value, limit_ms });
                }
            }
        }
        out
    }

    /// How far `lat` is from meeting every target: the largest value/limit ratio (<= 1 means
    /// all targets met). Used to rank the closest candidates when nothing meets the SLOs.
    pub fn worst_ratio(&self, lat: &LatencyAtPercentile) -> f64 {
        let pairs = [(self.ttft_ms, lat.ttft_ms), (self.tpot_ms, lat.tpot_ms), (self.e2e_ms, lat.e2e_ms)];
        pairs
            .iter()
            .filter_map(|(limit, v)| limit.map(|l| if v.is_nan() { f64::INFINITY } else { v / l }))
            .fold(0.0, f64::max)
    }

    pub fn describe(&self) -> String {
        let p = fmt_percentile(self.percentile);
        let mut parts = Vec::new();
        for (name, v) in [("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms), ("E2E", self.e2e_ms)] {
            if let Some(v) = v {
                parts.push(format!("{p} {name} <= {v} ms"));
            }
        }
        parts.join(", ")
    }
}

/// The latencies an SLO is checked against, all at the SLO's percentile.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencyAtPercentile {
    pub ttft_ms: f64,
    pub tpot_ms: f64,
    pub e2e_ms: f64,
}

/// One missed target.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Miss {
    pub metric: &'static str,
    pub value_ms: f64,
    pub limit_ms: f64,
}

impl std::fmt::Display for Miss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.value_ms.is_finite() {
            write!(f, "{} {:.1} ms > {} ms ({:.2}x)", self.metric.to_uppercase(), self.value_ms, self.limit_ms, self.value_ms / self.limit_ms)
        } else {
            write!(f, "{} unbounded (no request finished) > {} ms", self.metric.to_uppercase(), self.limit_ms)
        }
    }
}

/// "p99", "p99.9".
pub fn fmt_percentile(p: f64) -> String {
    format!("p{}", p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slo() -> Slo {
        Slo { ttft_ms: Some(1000.0), tpot_ms: Some(50.0), e2e_ms: None, percentile: 99.0 }
    }

    #[test]
    fn misses_name_each_target_and_ratio_is_the_worst() {
        let lat = LatencyAtPercentile { ttft_ms: 1500.0, tpot_ms: 40.0, e2e_ms: 1e9 };
        let m = slo().misses(&lat);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].metric, "ttft");
        assert_eq!(m[0].to_string(), "TTFT 1500.0 ms > 1000 ms (1.50x)");
        assert_eq!(slo().worst_ratio(&lat), 1.5);
        let ok = LatencyAtPercentile { ttft_ms: 1000.0, tpot_ms: 50.0, e2e_ms: 1e9 };
        assert!(slo().misses(&ok).is_empty());
        assert_eq!(slo().worst_ratio(&ok), 1.0);
    }

    #[test]
    fn nan_latency_is_a_miss() {
        let lat = LatencyAtPercentile { ttft_ms: f64::NAN, tpot_ms: 1.0, e2e_ms: 1.0 };
        assert_eq!(slo().misses(&lat).len(), 1);
        assert_eq!(slo().worst_ratio(&lat), f64::INFINITY);
    }

    #[test]
    fn validation_rejects_bad_targets() {
        let none = Slo { ttft_ms: None, tpot_ms: None, e2e_ms: None, percentile: 99.0 };
        assert!(none.validate().unwrap_err().to_string().contains("at least one latency target"));
        let neg = Slo { ttft_ms: Some(-1.0), ..slo() };
        assert!(neg.validate().unwrap_err().to_string().contains("--slo-ttft-ms"));
        let pct = Slo { percentile: 0.0, ..slo() };
        assert!(pct.validate().unwrap_err().to_string().contains("--percentile"));
    }
}

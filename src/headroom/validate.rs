//! Checks the hard SOL (`kernel::hard_sol`) against real measurements: measured / SOL per (GPU, op), and every row
//! measured faster than its SOL. A violation whose compulsory traffic fits in L2 is explained
//! (warm-cache timing loops serve it from L2, not HBM); any other one beyond the noise margin
//! points at a wrong FLOP/byte formula or spec figure.

use super::verdict::NOISE_MARGIN;
use crate::hardware::{load_gpu, GpuSpec};
use super::kernel::hard_sol;
use crate::perf::sol::Bound;
use crate::schema::KernelRow;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Violation {
    pub gpu: String,
    pub source: String,
    pub kernel: String,
    pub measured_us: f64,
    pub sol_us: f64,
    pub ratio: f64,
    /// Memory-bound with compulsory bytes <= L2 size.
    pub l2_resident: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupStats {
    pub gpu: String,
    pub op: String,
    pub rows: usize,
    /// Quantiles of measured / SOL: min, p01, p50, p99, max.
    pub min: f64,
    pub p01: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    /// Rows with measured < SOL.
    pub below_sol: usize,
    /// Rows with measured < SOL x (1 - noise margin) and traffic that does not fit in L2.
    pub unexplained: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub rows: usize,
    /// Rows without a latency, or on a GPU with no spec: (reason, count).
    pub skipped: BTreeMap<String, usize>,
    pub groups: Vec<GroupStats>,
    /// Every row beyond the noise margin, worst first.
    pub violations: Vec<Violation>,
}

impl Report {
    pub fn unexplained(&self) -> usize {
        self.groups.iter().map(|g| g.unexplained).sum()
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

pub fn validate(rows: &[KernelRow]) -> Report {
    let mut gpus: HashMap<String, Option<GpuSpec>> = HashMap::new();
    let mut skipped = BTreeMap::new();
    let mut ratios: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    let mut unexplained: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut violations = Vec::new();
    for r in rows {
        let (Some(measured), Some(gpu_id)) = (r.latency_us, r.gpu.as_deref()) else {
            *skipped.entry("no latency_us or gpu".to_string()).or_insert(0) += 1;
            continue;
        };
        let spec = gpus.entry(gpu_id.to_string()).or_insert_with(|| load_gpu(gpu_id).ok());
        let Some(g) = spec.as_ref() else {
            *skipped.entry(format!("no spec for gpu '{gpu_id}'")).or_insert(0) += 1;
            continue;
        };
        let s = hard_sol(&r.kernel, g);
        if !(s.sol_us > 0.0) {
            *skipped.entry("zero SOL (empty shape)".to_string()).or_insert(0) += 1;
            continue;
        }
        let ratio = measured / s.sol_us;
        let key = (gpu_id.to_string(), r.kernel.op.to_string());
        ratios.entry(key.clone()).or_default().push(ratio);
        if ratio < 1.0 - NOISE_MARGIN {
            let l2_resident = s.bound == Bound::Memory && s.bytes <= g.l2_bytes();
            if !l2_resident {
                *unexplained.entry(key).or_insert(0) += 1;
            }
            violations.push(Violation {
                gpu: gpu_id.to_string(),
                source: r.source.clone().unwrap_or_default(),
                kernel: format!("{} {} {}", r.kernel.op, r.kernel.dtype, r.kernel.shape_string()),
                measured_us: measured,
                sol_us: s.sol_us,
                ratio,
                l2_resident,
            });
        }
    }
    violations.sort_by(|a, b| a.ratio.total_cmp(&b.ratio));
    let groups = ratios
        .into_iter()
        .map(|(key, mut v)| {
            v.sort_by(f64::total_cmp);
            GroupStats {
                rows: v.len(),
                min: v[0],
                p01: quantile(&v, 0.01),
                p50: quantile(&v, 0.5),
                p99: quantile(&v, 0.99),
                max: v[v.len() - 1],
                below_sol: v.iter().filter(|&&x| x < 1.0).count(),
                unexplained: unexplained.get(&key).copied().unwrap_or(0),
                gpu: key.0,
                op: key.1,
            }
        })
        .collect();
    Report { rows: rows.len(), skipped, groups, violations }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{Dtype, Kernel};

    fn row(k: Kernel, us: f64) -> KernelRow {
        let mut r = KernelRow::new(k);
        r.latency_us = Some(us);
        r.gpu = Some("h200_sxm".into());
        r
    }

    #[test]
    fn counts_violations_and_explains_l2_resident_ones() {
        // 8192^3 bf16 GEMM: SOL = 2*8192^3/989.4e12 s = 1111.3 us.
        let big = Kernel::gemm(Dtype::Bf16, 8192, 8192, 8192);
        // A 1x1024x1024 GEMV moves 2.1 MB (fits in L2): SOL 0.44 us, so 0.1 us is a violation.
        let small = Kernel::gemm(Dtype::Bf16, 1, 1024, 1024);
        let rows = vec![row(big.clone(), 1200.0), row(big, 900.0), row(small, 0.1), KernelRow::new(Kernel::gemm(Dtype::Bf16, 1, 1, 1))];
        let rep = validate(&rows);
        assert_eq!(rep.skipped.values().sum::<usize>(), 1);
        let g = &rep.groups[0];
        assert_eq!((g.rows, g.below_sol, g.unexplained), (3, 2, 1));
        assert_eq!(rep.violations.len(), 2);
        assert!(rep.violations[0].l2_resident && !rep.violations[1].l2_resident);
    }
}

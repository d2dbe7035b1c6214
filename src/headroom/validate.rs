//! Checks the hard SOL (`kernel::hard_sol`) against real measurements: measured / SOL per
//! (GPU, op), and every row
//! measured faster than its SOL. A violation is explained by a warm L2 when the time is possible
//! with L2-size bytes of the traffic served from cache (timing loops re-run on the same data); any other one beyond the noise margin
//! points at a wrong FLOP/byte formula or spec figure.

use super::verdict::NOISE_MARGIN;
use crate::hardware::{load_gpu, GpuSpec};
use crate::quantile::nearest_rank;
use super::bound::{warm_l2_sol_us, Resource};
use super::bound::OpClass;
use super::kernel::hard_sol;
use crate::perf::sol::Bound;
use crate::schema::{KernelRow, Op};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// Upstream rows known to be wrong, excluded from the unexplained count and reported
/// separately, with the evidence.
pub fn known_anomaly(r: &KernelRow) -> Option<&'static str> {
    let k = &r.kernel;
    let source = r.source.as_deref().unwrap_or("");
    let backend = r.backend.as_deref().unwrap_or("");
    if source == "vidur" && k.op == Op::P2p && backend.starts_with("vidur/a100_pairwise_nvlink") {
        return Some(
            "vidur a100_pairwise_nvlink/send_recv.csv is byte-identical to h100_pairwise_nvlink/send_recv.csv \
             (H100 data under an A100 label): up to 343 GB/s per direction, above A100 NVLink's 300",
        );
    }
    if source == "aiconfigurator" && k.op == Op::Moe && k.num_tokens == 1 && k.topk == 22 && k.num_experts == 512 {
        return Some(
            "one token routed to 22 of 512 experts runs 12-18% below the time to read 22 experts' weights on \
             all six GPUs and every routing distribution: the upstream routing generator likely gives the token \
             duplicate expert ids (a router never does)",
        );
    }
    None
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Violation {
    pub gpu: String,
    pub source: String,
    pub kernel: String,
    pub measured_us: f64,
    pub sol_us: f64,
    pub ratio: f64,
    /// Possible if a warm cache serves L2-size bytes of the traffic (measured >= the SOL of
    /// the remaining HBM traffic, within the noise margin).
    pub warm_l2: bool,
    /// Why the row is a known upstream anomaly, if it is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anomaly: Option<&'static str>,
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
    /// Rows with measured < SOL x (1 - noise margin) that a warm L2 does not explain.
    pub unexplained: usize,
    /// Of those, rows that are known upstream anomalies (`known_anomaly`).
    pub anomalies: usize,
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
    /// Violations neither a warm L2 nor a known upstream anomaly explains.
    pub fn unexplained(&self) -> usize {
        self.groups.iter().map(|g| g.unexplained - g.anomalies).sum()
    }

    pub fn anomalies(&self) -> usize {
        self.groups.iter().map(|g| g.anomalies).sum()
    }
}

/// The project's measurements: the public subset (`ingest::load_public`) and the collector's
/// shared-schema CSVs under `microbench/data/<gpu>/` (files whose header has an `op` column;
/// the `nvidia-smi` logs beside them do not).
pub fn project_measurements() -> anyhow::Result<Vec<KernelRow>> {
    let mut rows = crate::ingest::load_public()?;
    let data = crate::ingest::public_dir().join("../data");
    let mut files: Vec<_> = std::fs::read_dir(&data)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|g| std::fs::read_dir(g.path()).ok())
        .flat_map(|d| d.flatten().map(|f| f.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "csv") && has_op_column(p))
        .collect();
    files.sort();
    for f in files {
        rows.extend(crate::ingest::read_rows_file(&f)?);
    }
    Ok(rows)
}

fn has_op_column(path: &std::path::Path) -> bool {
    use std::io::BufRead;
    let Ok(f) = std::fs::File::open(path) else { return false };
    let mut header = String::new();
    std::io::BufReader::new(f).read_line(&mut header).is_ok() && header.trim_end().split(',').any(|c| c == "op")
}

/// Best efficiency observed per op class on one GPU: max over rows of the hard SOL's compute
/// time over the measured time, and of its traffic time over the measured time for rows whose
/// traffic exceeds 4x L2 (a warm cache serves at most a quarter of it). Known anomalies are
/// skipped, and so are rows timed Vidur's way (backend `vidur`): each operator runs right after
/// the kernel that wrote its input, with no L2 flush, so a torch add of 270 MB reads up to an L2
/// of it from cache and shows 0.94 of DRAM bandwidth, which no cold kernel reaches. Against the
/// hard SOL both stay at or below 1.
pub fn best_efficiency(rows: &[KernelRow], gpu: &GpuSpec) -> BTreeMap<OpClass, (f64, f64)> {
    let mut best: BTreeMap<OpClass, (f64, f64)> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.gpu.as_deref() == Some(gpu.id.as_str())) {
        let Some(measured) = r.latency_us else { continue };
        if known_anomaly(r).is_some() || timed_vidur_way(r) {
            continue;
        }
        let s = hard_sol(&r.kernel, gpu);
        let e = best.entry(OpClass::of_op(r.kernel.op)).or_insert((0.0, 0.0));
        e.0 = e.0.max(s.compute_us / measured);
        if r.kernel.op.is_collective() || s.bytes > 4.0 * gpu.l2_bytes() {
            e.1 = e.1.max(s.memory_us / measured);
        }
    }
    best
}

/// Rows timed Vidur's way: CUPTI kernel durations inside a producer-consumer chain without an L2
/// flush. Neither their traffic efficiency (warm inputs) nor their times (no launch gap, unlike a
/// graph replay's per-launch time) bound a cold kernel in a stream.
pub fn timed_vidur_way(r: &KernelRow) -> bool {
    r.backend.as_deref().is_some_and(|b| b == crate::ingest::vidur::SOURCE || b.starts_with("vidur/"))
}

pub fn validate(rows: &[KernelRow]) -> Report {
    let mut gpus: HashMap<String, Option<GpuSpec>> = HashMap::new();
    let mut skipped = BTreeMap::new();
    let mut ratios: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    let mut unexplained: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut anomalies: BTreeMap<(String, String), usize> = BTreeMap::new();
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
            let resource = if s.bound == Bound::Network { Resource::Network } else { Resource::Memory };
            let warm_l2 = warm_l2_sol_us(s.compute_us, s.bytes, s.memory_us, resource, g.l2_bytes())
                .is_some_and(|w| measured >= w * (1.0 - NOISE_MARGIN));
            let anomaly = if warm_l2 { None } else { known_anomaly(r) };
            if !warm_l2 {
                *unexplained.entry(key.clone()).or_insert(0) += 1;
            }
            if anomaly.is_some() {
                *anomalies.entry(key).or_insert(0) += 1;
            }
            violations.push(Violation {
                gpu: gpu_id.to_string(),
                source: r.source.clone().unwrap_or_default(),
                kernel: format!("{} {} {}", r.kernel.op, r.kernel.dtype, r.kernel.shape_string()),
                measured_us: measured,
                sol_us: s.sol_us,
                ratio,
                warm_l2,
                anomaly,
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
                p01: nearest_rank(&v, 0.01),
                p50: nearest_rank(&v, 0.5),
                p99: nearest_rank(&v, 0.99),
                max: v[v.len() - 1],
                below_sol: v.iter().filter(|&&x| x < 1.0).count(),
                unexplained: unexplained.get(&key).copied().unwrap_or(0),
                anomalies: anomalies.get(&key).copied().unwrap_or(0),
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
        assert!(rep.violations[0].warm_l2 && !rep.violations[1].warm_l2);
    }
}

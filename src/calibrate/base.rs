//! The physical base of a kernel-time model, before the learned correction: a launch floor
//! plus SOL over a constant efficiency (`Base`), or for streaming libraries a roofline of DRAM
//! bandwidth and SM issue rate fitted across GPUs (`TwoResourceBase`).

use crate::hardware::GpuSpec;
use crate::quantile::upper_median;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `base_us = latency_us + sol_us * inv_efficiency`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Base {
    pub latency_us: f64,
    pub inv_efficiency: f64,
}

impl Base {
    pub fn time_us(&self, sol_us: f64) -> f64 {
        self.latency_us + sol_us * self.inv_efficiency
    }

    /// Robust fit of `t ~ l + c * sol`: for each latency `l` on a grid of plausible launch and
    /// synchronisation floors (1 us to 256 us), `c` is the median of `(t - l) / sol` (at least 1:
    /// no kernel beats SOL on average), and the pair with the smallest median absolute log error
    /// wins. Medians keep a few pathological measurements from dragging the base.
    pub fn fit(points: &[(f64, f64)]) -> Base {
        Self::fit_with(points, None)
    }

    /// As `fit` with the efficiency term given (`Some(c)`): only the latency is fitted, on a
    /// finer grid (eight steps per octave from 1 us to 256 us): with one free parameter the
    /// latency can be resolved as finely as a launch chain's cost differs between two paths.
    pub fn fit_with(points: &[(f64, f64)], inv_efficiency: Option<f64>) -> Base {
        let fine: Vec<f64> = (0..=64).map(|i| 2f64.powf(i as f64 / 8.0)).collect();
        let floors: &[f64] = if inv_efficiency.is_some() { &fine } else { &FLOORS_US };
        let mut best = Base { latency_us: floors[0], inv_efficiency: 1.0 };
        let mut best_err = f64::INFINITY;
        for &l in floors {
            let mut ratios: Vec<f64> = points.iter().filter(|(s, t)| *t > l && *s > 0.0).map(|(s, t)| (t - l) / s).collect();
            let c = inv_efficiency.unwrap_or_else(|| upper_median(&mut ratios).unwrap_or(1.0).max(1.0));
            let mut errs: Vec<f64> = points.iter().map(|(s, t)| ((l + c * s) / t).ln().abs()).collect();
            let err = upper_median(&mut errs).unwrap_or(f64::INFINITY);
            if err < best_err {
                best_err = err;
                best = Base { latency_us: l, inv_efficiency: c };
            }
        }
        best
    }
}

/// Latency grid of the base fits: plausible launch and synchronisation floors.
const FLOORS_US: [f64; 14] = [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0, 128.0, 256.0];

/// Two-resource base of one streaming kernel library, fitted on several GPUs together:
/// `latency_us + max(inv_dram_efficiency * bytes / DRAM bandwidth, sm_cycles_per_byte * bytes /
/// (SM count x SM clock))`, a roofline of the two resources. Vidur's one-block-per-row
/// elementwise kernels take H100's time on the H200 (same SMs and clock, 1.43x the bandwidth)
/// and A100's over 1.72 (its SMs x clock), while A40's GDDR6 holds them to its bandwidth: which
/// resource binds depends on the GPU's DRAM bytes per SM cycle (A40 4.8, H100 12.8, A100 13.4,
/// H200 18.4), and GPUs far apart on that balance pin down both coefficients.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TwoResourceBase {
    pub latency_us: f64,
    pub inv_dram_efficiency: f64,
    pub sm_cycles_per_byte: f64,
}

/// Least spread (max / min over the training GPUs) of DRAM bytes per SM cycle for a
/// two-resource fit: closer GPUs (A100 and H100 differ by 5 %) make the two terms collinear
/// and their split noise.
pub const MIN_BALANCE_SPREAD: f64 = 1.5;

fn dram_bytes_per_sm_cycle(gpu: &GpuSpec) -> f64 {
    gpu.hbm_bytes_per_s() / sm_cycles_per_s(gpu)
}

fn sm_cycles_per_s(gpu: &GpuSpec) -> f64 {
    gpu.compute.sm_count as f64 * gpu.compute.boost_clock_mhz * 1e6
}

impl TwoResourceBase {
    pub fn time_us(&self, bytes: f64, gpu: &GpuSpec) -> f64 {
        self.latency_us + 1e6 * bytes * (self.inv_dram_efficiency / gpu.hbm_bytes_per_s()).max(self.sm_cycles_per_byte / sm_cycles_per_s(gpu))
    }

    /// Robust fit on `(bytes, gpu, measured us)` rows; None unless the GPUs spread at least
    /// `MIN_BALANCE_SPREAD` in DRAM bytes per SM cycle. As `Base::fit`, over a grid: latency on
    /// the floor grid, the ratio of the issue term to the DRAM term in quarter octaves over 16x
    /// either way of the rows' median balance (and each term alone), the scale the median of
    /// `(t - l) / max(...)`; the triple with the smallest mean over GPUs of each GPU's median
    /// absolute log error wins (every GPU counts once, however many rows it has).
    pub fn fit(points: &[(f64, &GpuSpec, f64)]) -> Option<TwoResourceBase> {
        let mut by_gpu: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, (_, g, _)) in points.iter().enumerate() {
            by_gpu.entry(g.id.as_str()).or_default().push(i);
        }
        let balances: Vec<f64> = by_gpu.values().map(|ix| dram_bytes_per_sm_cycle(points[ix[0]].1)).collect();
        let spread = balances.iter().cloned().fold(0.0, f64::max) / balances.iter().cloned().fold(f64::INFINITY, f64::min);
        if by_gpu.len() < 2 || !(spread >= MIN_BALANCE_SPREAD) {
            return None;
        }
        // Per row: DRAM time at spec bandwidth and issue time at one SM cycle per byte (us).
        let terms: Vec<(f64, f64)> = points.iter().map(|(b, g, _)| (1e6 * b / g.hbm_bytes_per_s(), 1e6 * b / sm_cycles_per_s(g))).collect();
        let mut scale: Vec<f64> = terms.iter().filter(|(_, i)| *i > 0.0).map(|(d, i)| d / i).collect();
        let k = upper_median(&mut scale)?;
        // (DRAM weight, issue weight) per unit scale: DRAM alone, 33 mixes, issue alone.
        let weights: Vec<(f64, f64)> = std::iter::once((1.0, 0.0))
            .chain((0..=32).map(|s| (1.0, k * 2f64.powf((s as f64 - 16.0) / 4.0))))
            .chain(std::iter::once((0.0, k)))
            .collect();
        let units: Vec<Vec<f64>> = weights.iter().map(|&(wd, wi)| terms.iter().map(|&(d, i)| (wd * d).max(wi * i)).collect()).collect();
        let (l, w, c) = fit_per_gpu_grid(points, &units)?;
        let (wd, wi) = weights[w];
        Some(TwoResourceBase { latency_us: l, inv_dram_efficiency: c * wd, sm_cycles_per_byte: c * wi })
    }
}

/// The grid both multi-GPU base fits search: for each launch floor and each candidate `units`
/// (every row's time per unit of scale), the scale is the median of `(t - l) / unit`, and the
/// pair with the least mean over GPUs of each GPU's median |log error| wins (every GPU counts
/// once, however many rows it has). Returns (floor, candidate index, scale).
fn fit_per_gpu_grid(points: &[(f64, &GpuSpec, f64)], candidates: &[Vec<f64>]) -> Option<(f64, usize, f64)> {
    let mut by_gpu: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, (_, g, _)) in points.iter().enumerate() {
        by_gpu.entry(g.id.as_str()).or_default().push(i);
    }
    let mut best: Option<(f64, (f64, usize, f64))> = None;
    for &l in &FLOORS_US {
        for (k, units) in candidates.iter().enumerate() {
            let mut ratios: Vec<f64> = points.iter().zip(units).filter(|((_, _, t), u)| *t > l && **u > 0.0).map(|((_, _, t), u)| (t - l) / u).collect();
            let Some(c) = upper_median(&mut ratios) else { continue };
            let per_gpu: Vec<f64> = by_gpu
                .values()
                .filter_map(|ix| {
                    let mut e: Vec<f64> = ix.iter().map(|&i| ((l + c * units[i]) / points[i].2).ln().abs()).collect();
                    upper_median(&mut e)
                })
                .collect();
            let err = per_gpu.iter().sum::<f64>() / per_gpu.len() as f64;
            if best.map_or(true, |(e, _)| err < e) {
                best = Some((err, (l, k, c)));
            }
        }
    }
    best.map(|(_, b)| b)
}

/// Share of spec DRAM bandwidth a streaming copy reaches on an HBM GPU: the collector's best
/// >= 1 GiB copy ran 3.03 of 3.35 TB/s on the H100 and 4.27 of 4.8 on the H200 (0.90, 0.89).
pub const HBM_STREAMING_SHARE: f64 = 0.9;

/// A library whose rows beyond twice the L2 run below this share of the streaming rate is held
/// by something other than DRAM (SM issue, latency) on the GPU that measured it: repeat_kv's
/// strided copy runs at 0.48 of the H100's spec and takes the same time on the H200, the gather
/// next to it at 0.87 and 1.31x faster there (`microbench/data/h100_sxm/README.md`).
pub const ISSUE_BOUND_SHARE: f64 = 0.7;

/// Fewest rows beyond twice the L2 to judge what holds a library.
const MIN_STREAMING_ROWS: usize = 3;

impl TwoResourceBase {
    /// For a library measured only on HBM GPUs of one DRAM-per-SM-cycle balance, where `fit`
    /// cannot split the two terms: Some only when its rows beyond twice the L2 run below
    /// `ISSUE_BOUND_SHARE` of the streaming rate; then the issue term is fitted on its rows (as
    /// `Base::fit`: latency on the floor grid, scale the median ratio, least mean per-GPU median
    /// |log error|) and the DRAM term pinned at the streaming rate, so a GPU with more bandwidth
    /// per SM cycle does not speed it up and one with less may hold it to its DRAM.
    pub fn fit_issue_bound(points: &[(f64, &GpuSpec, f64)]) -> Option<TwoResourceBase> {
        if points.iter().any(|(_, g, _)| g.memory.dram != crate::hardware::DramKind::Hbm) {
            return None;
        }
        let mut shares: Vec<f64> = points
            .iter()
            .filter(|(b, g, t)| *b >= 2.0 * g.memory.l2_mb * 1e6 && *t > 0.0)
            .map(|(b, g, t)| b / (t * 1e-6) / (HBM_STREAMING_SHARE * g.hbm_bytes_per_s()))
            .collect();
        if shares.len() < MIN_STREAMING_ROWS || upper_median(&mut shares)? >= ISSUE_BOUND_SHARE {
            return None;
        }
        let issue: Vec<f64> = points.iter().map(|(b, g, _)| 1e6 * b / sm_cycles_per_s(g)).collect();
        let (l, _, c) = fit_per_gpu_grid(points, std::slice::from_ref(&issue))?;
        Some(TwoResourceBase { latency_us: l, inv_dram_efficiency: 1.0 / HBM_STREAMING_SHARE, sm_cycles_per_byte: c })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_fit_recovers_latency_and_efficiency_despite_outliers() {
        // t = 4 us + sol / 0.8 exactly (4 us is on the floor grid), plus two wild outliers.
        let mut pts: Vec<(f64, f64)> = [0.1, 1.0, 3.0, 10.0, 30.0, 100.0, 1000.0].iter().map(|&s| (s, 4.0 + s / 0.8)).collect();
        pts.push((50.0, 50_000.0));
        pts.push((0.5, 9_000.0));
        let b = Base::fit(&pts);
        assert_eq!(b.latency_us, 4.0, "{b:?}");
        assert!((b.inv_efficiency - 1.25).abs() < 1e-9, "{b:?}");
    }

    #[test]
    fn base_fit_never_beats_sol() {
        // Data faster than SOL (impossible in HBM terms, e.g. L2 hits) still gives c >= 1.
        let pts = vec![(10.0, 5.0), (20.0, 10.0)];
        let b = Base::fit(&pts);
        assert!(b.inv_efficiency >= 1.0 && b.latency_us >= 0.0, "{b:?}");
    }
}

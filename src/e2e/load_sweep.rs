//! Capacity validated on measured load sweeps: one model replaying the same requests at several
//! arrival rates (workloads named `<family>_r<RATE>_n<N>`, the request list of a family scaled
//! in time). The highest rate within an SLO that the engine keeps up with (served fraction at
//! least `MIN_SERVED_FRACTION`, as `kernelsight capacity` requires) is found the same way from
//! the measured and from the replayed runs at the measured rates, and the two are compared: the
//! error of `kernelsight capacity`'s answer on a real engine, with the knee where queues start
//! to build.

use super::stats::ape;
use super::traces::TraceModel;
use super::traces_report::RunResult;
use crate::plan::evaluate::MIN_SERVED_FRACTION;
use serde::Serialize;
use std::collections::BTreeMap;

/// The SLO of the load sweeps, committed with plan `load_sweep14` before it was measured.
pub const SWEEP_SLO_TTFT_P90_MS: f64 = 400.0;
pub const SWEEP_SLO_TPOT_P90_MS: f64 = 40.0;

/// A family needs this many rates to place a knee.
const MIN_RATES: usize = 3;

#[derive(Debug, Clone, Serialize)]
pub struct SweepPoint {
    pub rate_per_s: f64,
    pub measured_ttft_p90_ms: f64,
    pub measured_tpot_p90_ms: f64,
    pub predicted_ttft_p90_ms: f64,
    pub predicted_tpot_p90_ms: f64,
    /// `plan::evaluate::served_fraction` of the measured and of the replayed run.
    pub measured_served_fraction: f64,
    pub predicted_served_fraction: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Sweep {
    pub model: String,
    /// The workload name without its rate.
    pub family: String,
    pub tier: &'static str,
    pub points: Vec<SweepPoint>,
    /// Highest rate within the SLO (`capacity_of`); None when no rate or every rate met it.
    pub measured_capacity_per_s: Option<f64>,
    pub predicted_capacity_per_s: Option<f64>,
}

impl Sweep {
    pub fn capacity_ape(&self) -> Option<f64> {
        Some(ape(self.predicted_capacity_per_s?, self.measured_capacity_per_s?))
    }
}

/// `name` = `<family>_r<RATE>_n<N>` -> (family with `_n<N>`, rate).
fn split_rate(name: &str) -> Option<(String, f64)> {
    let (head, n) = name.rsplit_once("_n")?;
    n.parse::<u64>().ok()?;
    let (family, rate) = head.rsplit_once("_r")?;
    let rate: f64 = rate.parse().ok()?;
    (rate > 0.0 && rate.is_finite()).then(|| (format!("{family}_n{n}"), rate))
}

/// The workload of a run key `call/model/workload[/cudagraph...]`.
fn workload_of(key: &str) -> Option<&str> {
    key.split('/').nth(2)
}

/// Worst latency / target ratio of the SLO (<= 1: met). A run that fell behind its arrivals
/// misses whatever its latencies (a longer run at that rate would miss them): where its
/// latencies meet the SLO there is no ratio to place the crossing by (NaN: the capacity is the
/// last rate that passed).
fn slo_ratio(ttft_p90_ms: f64, tpot_p90_ms: f64, served_fraction: f64) -> f64 {
    let latency = (ttft_p90_ms / SWEEP_SLO_TTFT_P90_MS).max(tpot_p90_ms / SWEEP_SLO_TPOT_P90_MS);
    if served_fraction < MIN_SERVED_FRACTION && latency <= 1.0 {
        f64::NAN
    } else {
        latency
    }
}

/// Highest rate within the SLO on a curve of (rate, SLO ratio) sorted by rate: the crossing
/// of ratio 1, linear in rate between the last rate meeting it and the first one missing it
/// (rates above a miss do not count, as in `plan::capacity`). None when the lowest rate
/// already misses or no rate misses (the capacity lies outside the sweep).
pub fn capacity_of(curve: &[(f64, f64)]) -> Option<f64> {
    let fail = curve.iter().position(|&(_, r)| r.is_nan() || r > 1.0)?;
    let (f_rate, f_ratio) = curve[fail];
    let (p_rate, p_ratio) = *curve[..fail].last()?;
    if f_ratio.is_nan() {
        return Some(p_rate); // no latency at the miss to interpolate to
    }
    Some(p_rate + (1.0 - p_ratio) / (f_ratio - p_ratio) * (f_rate - p_rate))
}

/// Sweeps among `runs` (replayed runs of `models`): families with at least three rates whose
/// runs all replay the same request lengths. Families whose lengths differ are not sweeps.
pub fn find(models: &[TraceModel], runs: &[RunResult]) -> Vec<Sweep> {
    // (model, device call, family) -> rate -> run key, and each run's request lengths. A sweep
    // is one call's: the engine's host speed moves between calls.
    let mut families: BTreeMap<(String, String, String), BTreeMap<u64, (f64, String)>> = BTreeMap::new();
    let mut lengths: BTreeMap<String, Vec<(u32, u32)>> = BTreeMap::new();
    for m in models {
        for run in m.runs.iter().filter(|r| r.status == "ok") {
            let Some((family, rate)) = workload_of(&run.key).and_then(split_rate) else { continue };
            let mut l: Vec<(u32, u32)> = run.sent.iter().map(|r| (r.prompt_tokens, r.output_tokens)).collect();
            l.sort_unstable();
            lengths.insert(run.key.clone(), l);
            let call = super::host_fit::call_of(run).to_string();
            families.entry((m.label.clone(), call, family)).or_default().insert(rate.to_bits(), (rate, run.key.clone()));
        }
    }
    let mut tiers: Vec<&'static str> = runs.iter().map(|r| r.tier).collect();
    tiers.sort_unstable();
    tiers.dedup();
    let mut out = Vec::new();
    for ((model, _call, family), by_rate) in families {
        let mut rates: Vec<(f64, String)> = by_rate.into_values().collect();
        if rates.len() < MIN_RATES || rates.iter().any(|(_, k)| lengths[k] != lengths[&rates[0].1]) {
            continue;
        }
        rates.sort_by(|a, b| a.0.total_cmp(&b.0));
        for &tier in &tiers {
            let points: Vec<SweepPoint> = rates
                .iter()
                .filter_map(|(rate, key)| {
                    let r = runs.iter().find(|r| r.tier == tier && &r.run == key)?;
                    Some(SweepPoint {
                        rate_per_s: *rate,
                        measured_ttft_p90_ms: r.measured["ttft_p90"],
                        measured_tpot_p90_ms: r.measured["tpot_p90"],
                        predicted_ttft_p90_ms: r.predicted["ttft_p90"],
                        predicted_tpot_p90_ms: r.predicted["tpot_p90"],
                        measured_served_fraction: r.measured["served_fraction"],
                        predicted_served_fraction: r.predicted["served_fraction"],
                    })
                })
                .collect();
            if points.len() < MIN_RATES {
                continue;
            }
            let curve = |f: &dyn Fn(&SweepPoint) -> (f64, f64, f64)| -> Vec<(f64, f64)> {
                points.iter().map(|p| (p.rate_per_s, { let (a, b, c) = f(p); slo_ratio(a, b, c) })).collect()
            };
            let measured = capacity_of(&curve(&|p| (p.measured_ttft_p90_ms, p.measured_tpot_p90_ms, p.measured_served_fraction)));
            let predicted = capacity_of(&curve(&|p| (p.predicted_ttft_p90_ms, p.predicted_tpot_p90_ms, p.predicted_served_fraction)));
            out.push(Sweep { model: model.clone(), family: family.clone(), tier, points, measured_capacity_per_s: measured, predicted_capacity_per_s: predicted });
        }
    }
    out
}

fn rate(v: Option<f64>) -> String {
    v.map(|r| format!("{r:.2}")).unwrap_or_else(|| "outside".into())
}

pub fn render(sweeps: &[Sweep]) -> String {
    if sweeps.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "\n  load sweeps: highest rate within p90 TTFT <= {SWEEP_SLO_TTFT_P90_MS} ms and p90 TPOT <= {SWEEP_SLO_TPOT_P90_MS} ms that the engine keeps up with (served >= {:.0}%), from the measured and the replayed runs at the measured rates\n",
        MIN_SERVED_FRACTION * 100.0
    );
    for w in sweeps {
        s += &format!(
            "    [{}] {} {}: capacity measured {} req/s, predicted {} req/s{}\n",
            w.tier,
            w.model,
            w.family,
            rate(w.measured_capacity_per_s),
            rate(w.predicted_capacity_per_s),
            w.capacity_ape().map(|e| format!(" (APE {e:.1}%)")).unwrap_or_default()
        );
        s += "      req/s   p90 TTFT meas / pred ms   p90 TPOT meas / pred ms   served meas / pred %\n";
        for p in &w.points {
            s += &format!(
                "      {:>5.2}   {:>8.1} / {:>8.1}        {:>8.1} / {:>8.1}        {:>5.0} / {:>5.0}\n",
                p.rate_per_s,
                p.measured_ttft_p90_ms,
                p.predicted_ttft_p90_ms,
                p.measured_tpot_p90_ms,
                p.predicted_tpot_p90_ms,
                p.measured_served_fraction * 100.0,
                p.predicted_served_fraction * 100.0
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_into_family_and_rate() {
        assert_eq!(split_rate("poisson_i512_o128_u25_r4.5_n100"), Some(("poisson_i512_o128_u25_n100".into(), 4.5)));
        assert_eq!(split_rate("poisson_i512_o128_u25_r8_n100"), Some(("poisson_i512_o128_u25_n100".into(), 8.0)));
        // Other workloads are not sweeps.
        assert_eq!(split_rate("sharegpt_r5"), None);
        assert_eq!(split_rate("grid_i512_o64_c32"), None);
        assert_eq!(split_rate("closed_i512_o64_n80_fixed"), None);
        assert_eq!(workload_of("2026-12-02T00:47:02Z/llama-3.2-3b/poisson_x_r2_n100/cudagraph"), Some("poisson_x_r2_n100"));
    }

    #[test]
    fn capacity_is_the_crossing_between_the_last_pass_and_the_first_miss() {
        // Ratio 0.8 at 3/s, 1.6 at 4/s: crossing a quarter of the way, 3.25/s.
        let c = capacity_of(&[(2.0, 0.7), (3.0, 0.8), (4.0, 1.6), (5.0, 0.9)]).unwrap();
        assert!((c - 3.25).abs() < 1e-12, "{c}");
        // A pass above the first miss does not count; no miss or a miss at the lowest rate:
        // the capacity is outside the sweep.
        assert_eq!(capacity_of(&[(2.0, 0.5), (3.0, 0.9)]), None);
        assert_eq!(capacity_of(&[(2.0, 1.5), (3.0, 0.9)]), None);
        assert_eq!(capacity_of(&[(2.0, 0.5), (3.0, f64::NAN)]), Some(2.0));
    }

    #[test]
    fn a_run_that_fell_behind_misses_whatever_its_latencies() {
        // Keeping up, the latency ratio decides; fallen behind with latencies within the SLO, a
        // miss with no ratio to interpolate to; fallen behind and over the SLO, the latency ratio.
        assert_eq!(slo_ratio(200.0, 20.0, 1.0), 0.5);
        assert!(slo_ratio(200.0, 20.0, 0.5).is_nan());
        assert_eq!(slo_ratio(800.0, 20.0, 0.5), 2.0);
        let curve = [(2.0, slo_ratio(100.0, 10.0, 1.0)), (3.0, slo_ratio(200.0, 20.0, 0.7)), (4.0, slo_ratio(900.0, 60.0, 0.4))];
        assert_eq!(capacity_of(&curve), Some(2.0));
    }
}

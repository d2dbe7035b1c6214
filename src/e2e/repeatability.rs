//! How far the ground truth itself moves: runs measured again in another device call (the same
//! model folder, run id, GPU and split), compared with each other. A model that predicted one
//! measurement of such a run exactly would be about this far from the other, so it is the floor
//! under the error table's medians.

use super::stats::ErrorStats;
use super::traces_report::RunResult;
use serde::Serialize;
use std::collections::BTreeMap;

const METRICS: [&str; 3] = ["tpot_p50", "ttft_p50", "throughput"];

#[derive(Debug, Clone, Serialize)]
pub struct RepeatRow {
    pub split: &'static str,
    pub gpu: String,
    /// Per metric, over pairs of measurements of one run: 100 x |a - b| / ((a + b) / 2).
    pub spread: BTreeMap<&'static str, ErrorStats>,
}

/// Every pair of calls that measured the same run, per split and GPU; the runs of one tier are
/// enough (the measurements do not depend on it).
pub fn pairs(runs: &[RunResult], tier: &str) -> Vec<RepeatRow> {
    let mut groups: BTreeMap<(&'static str, &str, &str, &str), Vec<&RunResult>> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.tier == tier) {
        let Some((_call, run_id)) = r.run.split_once('/') else { continue };
        groups.entry((r.split, r.gpu.as_str(), r.model.as_str(), run_id)).or_default().push(r);
    }
    let mut spreads: BTreeMap<(&'static str, &str), BTreeMap<&'static str, Vec<f64>>> = BTreeMap::new();
    for ((split, gpu, ..), rs) in &groups {
        for (i, a) in rs.iter().enumerate() {
            for b in &rs[i + 1..] {
                for k in METRICS {
                    let (x, y) = (a.measured[k], b.measured[k]);
                    spreads.entry((split, gpu)).or_default().entry(k).or_default().push(100.0 * (x - y).abs() / (0.5 * (x + y)));
                }
            }
        }
    }
    spreads
        .into_iter()
        .map(|((split, gpu), per_metric)| RepeatRow {
            split,
            gpu: gpu.to_string(),
            spread: per_metric.into_iter().map(|(k, v)| (k, ErrorStats::of(&v))).collect(),
        })
        .collect()
}

pub fn render(rows: &[RepeatRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\n  ground truth repeatability: the same run (model folder, run id, GPU) measured in two device calls; \
         100 x |a - b| / mean over pairs, median/p90/max\n",
    );
    s += &format!("    {:<22} {:<10} {:>6} {:>16} {:>16} {:>16}\n", "split", "gpu", "pairs", "TPOT p50", "TTFT p50", "throughput");
    for r in rows {
        s += &format!(
            "    {:<22} {:<10} {:>6} {:>16} {:>16} {:>16}\n",
            r.split,
            r.gpu,
            r.spread["tpot_p50"].count,
            r.spread["tpot_p50"].cell(),
            r.spread["ttft_p50"].cell(),
            r.spread["throughput"].cell()
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(call: &str, run_id: &str, split: &'static str, tpot: f64) -> RunResult {
        let measured: BTreeMap<&'static str, f64> = [("tpot_p50", tpot), ("ttft_p50", 100.0), ("throughput", 10.0)].into_iter().collect();
        RunResult {
            model: "m".into(),
            run: format!("{call}/{run_id}"),
            gpu: "h200_sxm".into(),
            host_probe_ns: None,
            capture_scale: None,
            host_scale: None,
            split,
            tier: "target",
            predicted: measured.clone(),
            ape: BTreeMap::new(),
            measured,
            evictions: None,
        }
    }

    #[test]
    fn pairs_only_runs_measured_in_two_calls_within_a_split() {
        let runs = vec![
            run("c1", "m/grid_c1", "held-out", 40.0),
            run("c2", "m/grid_c1", "held-out", 60.0),
            run("c1", "m/grid_c8", "held-out", 50.0),
            run("c1", "m/grid_c1/cudagraph", "held-out-cudagraph", 20.0),
            run("c2", "m/grid_c1/cudagraph", "held-out-cudagraph", 20.0),
            run("c3", "m/grid_c1", "held-out-tp", 90.0),
        ];
        let rows = pairs(&runs, "target");
        let tpot = |split: &str| rows.iter().find(|r| r.split == split).expect("row").spread["tpot_p50"];
        // 40 vs 60 ms: 20 / 50 = 40 %; the run measured once, and the same run id at another
        // tensor-parallel degree (another split), add no pair.
        assert_eq!((tpot("held-out").count, tpot("held-out").median_ape), (1, 40.0));
        assert_eq!((tpot("held-out-cudagraph").count, tpot("held-out-cudagraph").median_ape), (1, 0.0));
        assert!(rows.iter().all(|r| r.split != "held-out-tp"));
        assert!(pairs(&runs, "cross-gen").is_empty());
    }
}

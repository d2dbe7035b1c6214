//! The silicon validation report: error tables per tier, backend, split and model, the worst
//! runs, and the rows not simulated. JSON (serde), terminal text (`render`) and per-row CSV.

use super::rows::Client;
use super::split::{self, Split};
use crate::e2e::stats::{ape, ErrorStats};
use super::{RowResult, Skipped};
use crate::perf::Tier;
use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Errors of one group of runs. The `_no_queueing` statistics leave out runs whose measured
/// TTFT is dominated by waiting for other requests (see `RowResult::queueing`): there fewer
/// than `batch_size` requests ran at once, which changes TPOT too.
#[derive(Debug, Clone, Serialize)]
pub struct GroupStats {
    pub ttft: ErrorStats,
    pub tpot: ErrorStats,
    pub ttft_no_queueing: ErrorStats,
    pub tpot_no_queueing: ErrorStats,
}

#[derive(Debug, Clone, Serialize)]
pub struct BackendStats {
    #[serde(flatten)]
    pub all: GroupStats,
    /// Keyed by split: calibration, held_out_model, held_out_layout.
    pub splits: BTreeMap<String, GroupStats>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SiliconReport {
    pub file: String,
    pub rows_read: usize,
    pub rows_simulated: usize,
    pub rows_not_simulated: usize,
    pub comparison: &'static str,
    pub calibration_split: Vec<String>,
    /// tier -> backend (and `all_backends`) -> stats.
    pub tiers: BTreeMap<String, BTreeMap<String, BackendStats>>,
    /// tier -> `backend/model` -> stats.
    pub by_model: BTreeMap<String, BTreeMap<String, GroupStats>>,
    /// Tiers asked for that have no kernel model of their own yet, with the reason.
    pub unavailable_tiers: BTreeMap<String, String>,
    pub not_simulated: Vec<Skipped>,
    #[serde(skip)]
    pub rows: Vec<RowResult>,
    #[serde(skip)]
    tier_order: Vec<Tier>,
}

const COMPARISON: &str = "per run: measured mean TTFT / mean TPOT vs the simulator's means over all requests of the same closed loop (batch_size clients, first wave included) with the row's benchmark client: inferencemax = 10 requests per client, lengths uniform in [0.8 L, L] (InferenceMAX benchmark_serving.py); undocumented = fixed isl/osl, 3 requests per client (with --undocumented-client aiconfigurator-bench: 50 per client, TRT-LLM and vLLM engines at max_num_tokens c + isl + 1500 and max_batch_size c); APE = |pred - meas| / meas in percent";

impl GroupStats {
    /// The six table columns: n, TPOT and TTFT APE, then the same without queueing runs.
    fn cells(&self) -> String {
        format!(
            "{:>5}  {:<16} {:<16} {:>5}  {:<16} {:<16}",
            self.tpot.count,
            self.tpot.cell(),
            self.ttft.cell(),
            self.ttft_no_queueing.count,
            self.tpot_no_queueing.cell(),
            self.ttft_no_queueing.cell()
        )
    }
}

fn group<'a>(rows: impl Iterator<Item = &'a RowResult> + Clone, tier: &str) -> GroupStats {
    let apes = |f: &dyn Fn(&RowResult) -> Option<f64>| rows.clone().filter_map(f).collect::<Vec<f64>>();
    GroupStats {
        ttft: ErrorStats::of(&apes(&|r| Some(ape(r.predictions[tier].ttft_ms, r.row.ttft_ms)))),
        tpot: ErrorStats::of(&apes(&|r| Some(ape(r.predictions[tier].tpot_ms, r.row.tpot_ms)))),
        ttft_no_queueing: ErrorStats::of(&apes(&|r| r.queueing.is_none().then(|| ape(r.predictions[tier].ttft_ms, r.row.ttft_ms)))),
        tpot_no_queueing: ErrorStats::of(&apes(&|r| r.queueing.is_none().then(|| ape(r.predictions[tier].tpot_ms, r.row.tpot_ms)))),
    }
}

impl SiliconReport {
    pub fn new(
        path: &Path,
        rows_read: usize,
        tiers: Vec<Tier>,
        unavailable_tiers: BTreeMap<String, String>,
        rows: Vec<RowResult>,
        not_simulated: Vec<Skipped>,
    ) -> SiliconReport {
        let mut backends: Vec<String> = rows.iter().map(|r| r.point.engine.clone()).collect();
        backends.sort();
        backends.dedup();
        let mut by_tier = BTreeMap::new();
        let mut by_model = BTreeMap::new();
        for t in &tiers {
            let t = t.as_str();
            let mut m = BTreeMap::new();
            let backend_stats = |sel: &dyn Fn(&RowResult) -> bool| BackendStats {
                all: group(rows.iter().filter(|r| sel(r)), t),
                splits: Split::ALL
                    .iter()
                    .filter(|s| rows.iter().any(|r| sel(r) && r.split == **s))
                    .map(|s| (s.key().to_string(), group(rows.iter().filter(|r| sel(r) && r.split == *s), t)))
                    .collect(),
            };
            for b in &backends {
                m.insert(b.clone(), backend_stats(&|r: &RowResult| r.point.engine == *b));
            }
            m.insert("all_backends".into(), backend_stats(&|_| true));
            by_tier.insert(t.to_string(), m);
            // Per model and benchmark client: one model's rows can come from two campaigns.
            let mut models: Vec<(String, String, Client)> = rows.iter().map(|r| (r.point.engine.clone(), r.point.model.clone(), r.point.client)).collect();
            models.sort_by(|a, b| (&a.0, &a.1, a.2.as_str()).cmp(&(&b.0, &b.1, b.2.as_str())));
            models.dedup();
            let mm: BTreeMap<String, GroupStats> = models
                .iter()
                .map(|(b, md, c)| {
                    let rs = rows.iter().filter(|r| r.point.engine == *b && r.point.model == *md && r.point.client == *c);
                    (format!("{b}/{md} [{}]", c.as_str()), group(rs, t))
                })
                .collect();
            by_model.insert(t.to_string(), mm);
        }
        SiliconReport {
            file: path.display().to_string(),
            rows_read,
            rows_simulated: rows.len(),
            rows_not_simulated: not_simulated.len(),
            comparison: COMPARISON,
            calibration_split: split::describe(),
            tiers: by_tier,
            by_model,
            unavailable_tiers,
            not_simulated,
            rows,
            tier_order: tiers,
        }
    }

    /// Rows ordered by descending APE of `metric` ("ttft" or "tpot") under `tier`.
    pub fn worst(&self, tier: Tier, metric: &str, n: usize) -> Vec<&RowResult> {
        let t = tier.as_str();
        let key = |r: &RowResult| {
            let p = &r.predictions[t];
            if metric == "ttft" {
                ape(p.ttft_ms, r.row.ttft_ms)
            } else {
                ape(p.tpot_ms, r.row.tpot_ms)
            }
        };
        let mut v: Vec<&RowResult> = self.rows.iter().collect();
        v.sort_by(|a, b| key(b).total_cmp(&key(a)));
        v.truncate(n);
        v
    }

    /// The terminal report.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "Public serving measurements: {}", self.file);
        let _ = writeln!(s, "{} rows: {} simulated, {} not simulated (listed below)", self.rows_read, self.rows_simulated, self.rows_not_simulated);
        let _ = writeln!(s, "Compared: {COMPARISON}.");
        let _ = writeln!(s, "Host overhead fitted on calibration runs only:");
        for l in &self.calibration_split {
            let _ = writeln!(s, "  {l}");
        }
        let _ = writeln!(s, "Cells: median/p90/max APE %. 'w/o queueing' leaves out runs whose measured TTFT is dominated by waiting for other requests.\n");
        let _ = writeln!(
            s,
            "{:<9} {:<13} {:<16} {:>5}  {:<16} {:<16} {:>5}  {:<16} {:<16}",
            "tier", "backend", "runs", "n", "TPOT APE", "TTFT APE", "n", "TPOT w/o queue", "TTFT w/o queue"
        );
        for (tier, backends) in &self.tiers {
            for (b, st) in backends {
                let line = |s: &mut String, label: &str, g: &GroupStats| {
                    let _ = writeln!(s, "{:<9} {:<13} {:<16} {}", tier, b, label, g.cells());
                };
                line(&mut s, "all", &st.all);
                for sp in Split::ALL {
                    if let Some(g) = st.splits.get(sp.key()) {
                        line(&mut s, sp.as_str(), g);
                    }
                }
            }
        }
        for (tier, models) in &self.by_model {
            let _ = writeln!(s, "\nBy model ({tier}):");
            let _ = writeln!(s, "  {:<43} {:>5}  {:<16} {:<16} {:>5}  {:<16} {:<16}", "backend/model [client]", "n", "TPOT APE", "TTFT APE", "n", "TPOT w/o queue", "TTFT w/o queue");
            for (k, g) in models {
                let _ = writeln!(s, "  {:<43} {}", k, g.cells());
            }
        }
        for &t in &self.tier_order {
            for metric in ["tpot", "ttft"] {
                let _ = writeln!(s, "\nWorst runs by {} APE ({}):", metric.to_uppercase(), t.as_str());
                for r in self.worst(t, metric, 8) {
                    let p = &r.predictions[t.as_str()];
                    let (m, pr) = if metric == "ttft" { (r.row.ttft_ms, p.ttft_ms) } else { (r.row.tpot_ms, p.tpot_ms) };
                    let _ = writeln!(
                        s,
                        "  line {:>4} {:<7} {:<16} tp{} ep{} {:<4} {}/{} c{:<4} meas {:>9.1} pred {:>9.1} ms  APE {:>6.1}%  [{}]{}",
                        r.row.line,
                        r.point.engine,
                        r.point.model,
                        r.point.tp,
                        r.point.ep,
                        r.point.dtype.as_str(),
                        r.point.isl,
                        r.point.osl,
                        r.point.concurrency,
                        m,
                        pr,
                        ape(pr, m),
                        r.split.as_str(),
                        r.queueing.as_deref().map(|q| format!(" queueing: {q}")).unwrap_or_default()
                    );
                }
            }
        }
        if !self.unavailable_tiers.is_empty() {
            let _ = writeln!(s, "\nTiers not reported:");
            for (t, why) in &self.unavailable_tiers {
                let _ = writeln!(s, "  {t}: {why}");
            }
        }
        if !self.not_simulated.is_empty() {
            let mut reasons: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
            for k in &self.not_simulated {
                reasons.entry(k.reason.as_str()).or_default().push(k.line);
            }
            let _ = writeln!(s, "\nNot simulated ({} rows):", self.not_simulated.len());
            for (why, lines) in reasons {
                let shown: Vec<String> = lines.iter().take(12).map(|l| l.to_string()).collect();
                let more = if lines.len() > 12 { format!(" (+{} more)", lines.len() - 12) } else { String::new() };
                let _ = writeln!(s, "  {} rows: {why}; lines {}{more}", lines.len(), shown.join(", "));
            }
        }
        s
    }

    /// Writes `<dir>/silicon_rows.csv`: one line per row of the input, predictions per tier,
    /// the `kernelsight simulate` command of the point, or the reason it was not simulated.
    pub fn write_csv(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let file = dir.join("silicon_rows.csv");
        let mut w = csv::Writer::from_path(&file).with_context(|| format!("creating {}", file.display()))?;
        let mut header: Vec<String> = [
            "line", "id", "backend", "backend_version", "model", "client", "split", "tp", "ep", "dtype", "isl", "osl", "concurrency", "measured_ttft_ms", "measured_tpot_ms",
        ]
        .map(String::from)
        .to_vec();
        for t in &self.tier_order {
            for c in ["pred_ttft_ms", "pred_tpot_ms", "ttft_ape_pct", "tpot_ape_pct", "pred_queue_ms", "preemptions"] {
                header.push(format!("{}_{c}", t.as_str()));
            }
        }
        header.extend(["queueing", "command", "not_simulated_reason"].map(String::from));
        w.write_record(&header)?;
        let mut lines: Vec<(usize, Vec<String>)> = Vec::new();
        for r in &self.rows {
            let p = &r.point;
            let mut rec = vec![
                r.row.line.to_string(),
                r.row.id.clone(),
                r.row.backend.clone(),
                r.row.backend_version.clone(),
                p.model.clone(),
                p.client.as_str().to_string(),
                r.split.as_str().to_string(),
                p.tp.to_string(),
                p.ep.to_string(),
                p.dtype.as_str().to_string(),
                p.isl.to_string(),
                p.osl.to_string(),
                p.concurrency.to_string(),
                format!("{:.3}", r.row.ttft_ms),
                format!("{:.3}", r.row.tpot_ms),
            ];
            for t in &self.tier_order {
                let pr = &r.predictions[t.as_str()];
                rec.extend([
                    format!("{:.3}", pr.ttft_ms),
                    format!("{:.3}", pr.tpot_ms),
                    format!("{:.2}", ape(pr.ttft_ms, r.row.ttft_ms)),
                    format!("{:.2}", ape(pr.tpot_ms, r.row.tpot_ms)),
                    format!("{:.3}", pr.queue_ms),
                    pr.preemptions.to_string(),
                ]);
            }
            let tier = self.tier_order.first().copied().unwrap_or(Tier::Roofline);
            rec.extend([r.queueing.clone().unwrap_or_default(), p.command_line(tier), String::new()]);
            lines.push((r.row.line, rec));
        }
        for k in &self.not_simulated {
            let mut rec = vec![k.line.to_string(), k.id.clone(), k.backend.clone()];
            rec.resize(header.len() - 1, String::new());
            rec[4] = k.model_path.clone();
            rec.push(k.reason.clone());
            lines.push((k.line, rec));
        }
        lines.sort_by_key(|l| l.0);
        for (_, rec) in lines {
            w.write_record(&rec)?;
        }
        w.flush().with_context(|| format!("writing {}", file.display()))?;
        Ok(())
    }
}

impl std::fmt::Display for SiliconReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
    }
}

//! Validation against public end-to-end measurements of TensorRT-LLM, vLLM and SGLang on H100
//! (`calibration/public/silicon_h100_sxm_agg.csv`, from NVIDIA's aiconfigurator).
//!
//! Each aggregated-serving row is a closed-loop benchmark: `batch_size` clients each sending
//! `isl`-token prompts for `osl` tokens, on a `tp`/`moe_ep` layout in a GEMM precision. The
//! row's TTFT and TPOT are means over the benchmark's requests; the simulator runs the same
//! closed loop with the row's client (`rows::Client`: its length distribution and
//! `rows::num_requests_for` requests, the first wave included, as a benchmark's mean includes
//! it) and its means over all requests are compared. Rows that cannot be simulated are listed
//! with the reason, never dropped.

pub mod fit;
pub mod report;
pub mod rows;
pub mod run;
pub mod split;

pub use report::SiliconReport;

use crate::perf::host::HostOverhead;
use crate::perf::Tier;
use anyhow::{Context, Result};
use rayon::prelude::*;
use rows::{SiliconRow, SimPoint, UndocumentedClient};
use run::Prediction;
use serde::Serialize;
use split::Split;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// One simulated row: the measurement, the point it maps to and the prediction per tier.
#[derive(Debug, Clone, Serialize)]
pub struct RowResult {
    pub row: SiliconRow,
    pub point: SimPoint,
    pub split: Split,
    /// Why the measured TTFT is dominated by waiting for other requests, if it is.
    pub queueing: Option<String>,
    /// Keyed by tier name.
    pub predictions: BTreeMap<String, Prediction>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub line: usize,
    pub id: String,
    pub backend: String,
    pub model_path: String,
    pub reason: String,
}

/// Queue-dominated TTFT, by two independent signs: the measurement itself (mean TTFT longer
/// than a whole decode phase, which a request only waits when others must finish before it
/// starts) and the simulated KV capacity (all clients' sequences do not fit at once).
fn queueing(row: &SiliconRow, p: &SimPoint, kv_capacity_tokens: u64) -> Option<String> {
    let decode_ms = (p.osl.saturating_sub(1)) as f64 * row.tpot_ms;
    let need = p.concurrency as u64 * (p.isl + p.osl) as u64;
    let mut why = Vec::new();
    if row.ttft_ms > decode_ms {
        why.push(format!("measured TTFT {:.0} ms > decode phase {:.0} ms", row.ttft_ms, decode_ms));
    }
    if need > kv_capacity_tokens {
        why.push(format!("{} clients need {} KV tokens, cache holds {}", p.concurrency, need, kv_capacity_tokens));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// Simulates every row of `path` that can be simulated, under each of `tiers` that has its
/// own kernel model (the others are listed as unavailable), and summarizes the errors.
/// `limit` keeps the first N rows of the file.
pub fn validate_silicon(path: &Path, tiers: &[Tier], limit: Option<usize>, undocumented: UndocumentedClient) -> Result<SiliconReport> {
    let all_rows = rows::load(path, limit)?;
    let mut unavailable = BTreeMap::new();
    let mut usable = Vec::new();
    let gpus: Vec<String> = {
        let mut g: Vec<String> = all_rows.iter().filter_map(|r| rows::plan_assuming(r, undocumented).ok()).map(|p| p.gpu).collect();
        g.sort();
        g.dedup();
        g
    };
    for &t in tiers {
        if usable.contains(&t) {
            continue;
        }
        let mut ok = true;
        for g in &gpus {
            let (avail, note) = run::tier_available(g, t)?;
            if !avail {
                ok = false;
                unavailable.insert(t.as_str().to_string(), note.unwrap_or_else(|| format!("no {} model for {g}", t.as_str())));
            }
        }
        if ok {
            usable.push(t);
        }
    }
    let mut planned = Vec::new();
    let mut skipped = Vec::new();
    for r in all_rows.iter() {
        match rows::plan_assuming(r, undocumented) {
            Ok(p) => planned.push((r, p)),
            Err(reason) => skipped.push(Skipped { line: r.line, id: r.id.clone(), backend: r.backend.clone(), model_path: r.model_path.clone(), reason }),
        }
    }
    // Repeated measurements of one configuration share one simulation.
    let mut jobs: Vec<(SimPoint, Tier)> = Vec::new();
    let mut seen = HashSet::new();
    for (_, p) in &planned {
        for &t in &usable {
            if seen.insert((p.clone(), t)) {
                jobs.push((p.clone(), t));
            }
        }
    }
    // Each tier gets its own host model, fitted on the calibration runs only, so that no tier
    // is judged with overheads fitted against another tier's kernel times.
    let calibration = calibration_points(&all_rows, undocumented);
    let mut hosts: HashMap<(Tier, String), HostOverhead> = HashMap::new();
    let mut host_lines = Vec::new();
    for &t in &usable {
        for (engine, points) in &calibration {
            if points.len() < 2 {
                host_lines.push(format!("[{}] {engine}: {} calibration run(s), too few to fit; shipped host file used", t.as_str(), points.len()));
                continue;
            }
            let f = fit::fit_engine(engine, points, t, &HostOverhead::for_engine(engine)?)?;
            host_lines.push(format!(
                "[{}] {engine}: {:.0} us/step + {:.1} us/seq from {} calibration runs (TPOT median APE {:.1}% -> {:.1}%)",
                t.as_str(), f.host.per_step_us, f.host.per_seq_us, f.runs, f.tpot_before.median_ape, f.tpot_after.median_ape
            ));
            hosts.insert((t, engine.clone()), f.host);
        }
    }
    let results: Vec<Result<Prediction, String>> = jobs
        .par_iter()
        .map(|(p, t)| {
            let host = hosts.get(&(*t, p.engine.clone()));
            run::simulate(p, *t, host).map_err(|e| format!("simulation failed ({}): {e:#}", t.as_str()))
        })
        .collect();
    let by_job: HashMap<(SimPoint, Tier), Result<Prediction, String>> = jobs.into_iter().zip(results).collect();
    let mut done = Vec::new();
    'rows: for (r, p) in planned {
        let mut predictions = BTreeMap::new();
        for &t in &usable {
            match &by_job[&(p.clone(), t)] {
                Ok(pred) => {
                    predictions.insert(t.as_str().to_string(), *pred);
                }
                Err(reason) => {
                    skipped.push(Skipped { line: r.line, id: r.id.clone(), backend: r.backend.clone(), model_path: r.model_path.clone(), reason: reason.clone() });
                    continue 'rows;
                }
            }
        }
        let kv = predictions.values().next().map(|p| p.kv_capacity_tokens).unwrap_or(u64::MAX);
        done.push(RowResult { queueing: queueing(r, &p, kv), split: split::split(&p), row: r.clone(), point: p, predictions });
    }
    skipped.sort_by_key(|s| s.line);
    let mut report = SiliconReport::new(path, all_rows.len(), usable, unavailable, done, skipped);
    report.calibration_split.extend(host_lines);
    Ok(report)
}

/// Calibration runs per engine, with their measured TPOT.
fn calibration_points(all_rows: &[SiliconRow], undocumented: UndocumentedClient) -> BTreeMap<String, Vec<(SimPoint, f64)>> {
    let mut by_engine: BTreeMap<String, Vec<(SimPoint, f64)>> = BTreeMap::new();
    for r in all_rows {
        if let Ok(p) = rows::plan_assuming(r, undocumented) {
            if split::split(&p) == Split::Calibration {
                by_engine.entry(p.engine.clone()).or_default().push((p, r.tpot_ms));
            }
        }
    }
    by_engine
}

/// Fits the host overhead of every backend that has calibration runs in `path`, against
/// `tier`, and writes `<out_dir>/<engine>.json` (normally `calibration/host/`). `base` gives
/// each engine's terms that are not fitted here (kept as they are).
pub fn fit_silicon_host(path: &Path, tier: Tier, out_dir: &Path, base: &dyn Fn(&str) -> Result<HostOverhead>) -> Result<Vec<fit::HostFit>> {
    let all_rows = rows::load(path, None)?;
    let by_engine = calibration_points(&all_rows, UndocumentedClient::Cohort);
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let mut fits = Vec::new();
    for (engine, points) in by_engine {
        let f = fit::fit_engine(&engine, &points, tier, &base(&engine)?)?;
        let file = out_dir.join(format!("{engine}.json"));
        let json = serde_json::to_string_pretty(&f.host)? + "\n";
        std::fs::write(&file, json).with_context(|| format!("writing {}", file.display()))?;
        fits.push(f);
    }
    Ok(fits)
}

//! Terminal tables and JSON documents for plan and capacity results.

use super::capacity::{CapacityResult, LoadPoint};
use super::search::{Evaluated, PlanResult, RankBy};
use super::evaluate::Outcome;
use super::slo::{fmt_percentile, Miss, Slo};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write;

fn ms(v: f64) -> String {
    if !v.is_finite() {
        "inf".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn usd(v: Option<f64>) -> String {
    v.map(|c| format!("{c:.2}")).unwrap_or_else(|| "-".into())
}

/// Rows of candidates: label, GPUs, cost, throughput per GPU, latencies at the SLO
/// percentile, and what each misses.
fn table(out: &mut String, rows: &[&Evaluated], pct: &str) {
    let w = rows.iter().map(|e| e.label.len()).max().unwrap_or(10).max(10);
    let _ = writeln!(
        out,
        "  {:<w$}  {:>4}  {:>8}  {:>9}  {:>9}  {:>9}  {:>9}  SLO",
        "deployment", "GPUs", "USD/h", "tok/s/GPU", format!("{pct} TTFT"), format!("{pct} TPOT"), format!("{pct} E2E")
    );
    for e in rows {
        let o = &e.outcome;
        let verdict = verdict_long(&e.misses, &e.outcome);
        let _ = writeln!(
            out,
            "  {:<w$}  {:>4}  {:>8}  {:>9.0}  {:>9}  {:>9}  {:>9}  {}",
            e.label,
            e.gpus,
            usd(e.cost_usd_per_hour),
            e.output_tokens_per_s_per_gpu,
            ms(o.ttft_ms.at_slo),
            ms(o.tpot_ms.at_slo),
            ms(o.e2e_ms.at_slo),
            verdict
        );
    }
}

/// Counts of pruned layouts by reason kind, for a one-line summary.
fn pruned_summary(r: &PlanResult) -> BTreeMap<&'static str, usize> {
    let mut m = BTreeMap::new();
    for p in &r.pruned {
        let kind = if p.reason.contains("does not fit") || p.reason.contains("no room") {
            "do not fit in memory"
        } else if p.reason.contains("KV cache holds") {
            "KV cache below the longest request"
        } else if p.reason.contains("NVLink domain") {
            "tp beyond the NVLink domain"
        } else if p.reason.contains("attention heads") {
            "tp does not divide the heads"
        } else if p.reason.contains("--max-gpus") {
            "above --max-gpus"
        } else {
            "other"
        };
        *m.entry(kind).or_default() += 1;
    }
    m
}

/// The plan as text. `header` lines describe the question (model, load, workload).
pub fn render_plan(header: &[String], r: &PlanResult, capacity: Option<&CapacityResult>) -> String {
    let mut out = String::new();
    for h in header {
        let _ = writeln!(out, "{h}");
    }
    let pct = fmt_percentile(r.slo.percentile);
    let pruned: Vec<String> = pruned_summary(r).iter().map(|(k, v)| format!("{v} {k}")).collect();
    let _ = writeln!(
        out,
        "Searched {} candidates with {} simulations (the others reused a run whose max-num-seqs limit never bound){}{}",
        r.evaluated.len(),
        r.simulations_run,
        if pruned.is_empty() { String::new() } else { format!("; pruned layouts: {}", pruned.join(", ")) },
        if r.failed.is_empty() { String::new() } else { format!("; {} simulations failed", r.failed.len()) }
    );
    let stopped = r.evaluated.iter().filter(|e| e.outcome.stopped_early).count();
    if stopped > 0 {
        let _ = writeln!(out, "{stopped} runs stopped early once a TTFT/E2E target could no longer be met (--exhaustive runs them to the end)");
    }
    for n in &r.notes {
        let _ = writeln!(out, "note: {n}");
    }
    let _ = writeln!(out);
    match r.best {
        Some(i) => {
            let e = &r.evaluated[i];
            let o = &e.outcome;
            let by = match r.ranked_by {
                RankBy::CostUsdPerHour => "cost",
                RankBy::Gpus => "GPU count",
            };
            let _ = writeln!(out, "Cheapest deployment meeting {} (ranked by {by}):", r.slo.describe());
            let _ = writeln!(out, "  {}", e.label);
            let _ = writeln!(
                out,
                "  {} GPUs, {} USD/h, {:.0} output tokens/s per GPU ({:.0} in total)",
                e.gpus,
                usd(e.cost_usd_per_hour),
                e.output_tokens_per_s_per_gpu,
                o.output_tokens_per_s
            );
            for (name, q) in [("TTFT", o.ttft_ms), ("TPOT", o.tpot_ms), ("E2E", o.e2e_ms)] {
                let _ = writeln!(out, "  {name:<4} ms: p50 {}  p90 {}  p99 {}  ({pct} {})", ms(q.p50), ms(q.p90), ms(q.p99), ms(q.at_slo));
            }
            let _ = writeln!(out, "  predicted by: {}", o.predicted_by);
            if let Some(c) = capacity {
                match c.max_rate_per_s {
                    Some(max) => {
                        let _ = writeln!(out, "  sustains up to {max:.2} req/s within the SLOs{}", limiting(c));
                    }
                    None => {
                        let _ = writeln!(out, "  the capacity search found no rate meeting the SLOs");
                    }
                }
            }
        }
        None => {
            let _ = writeln!(out, "No candidate meets {}.", r.slo.describe());
            let _ = writeln!(out, "Closest candidates (smallest worst latency / target ratio) and what each misses:");
            let rows: Vec<&Evaluated> = r.closest.iter().map(|&i| &r.evaluated[i]).collect();
            table(&mut out, &rows, &pct);
            let _ = writeln!(out, "Try more GPUs (--max-gpus), other GPUs or dtypes, a lower rate, or looser targets.");
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "Pareto frontier ({pct} {} vs output tokens/s per GPU):", r.frontier_metric.name());
    let rows: Vec<&Evaluated> = r.frontier.iter().map(|&i| &r.evaluated[i]).collect();
    table(&mut out, &rows, &pct);
    out
}

/// Each missed target, and the overload if the engine fell behind; "met" when neither.
fn verdict_long(misses: &[Miss], o: &Outcome) -> String {
    let mut parts: Vec<String> = misses.iter().map(|m| m.to_string()).collect();
    parts.extend(o.overload_note());
    if parts.is_empty() {
        "met".into()
    } else {
        parts.join("; ")
    }
}

/// "TTFT+TPOT missed", "falls behind", "met".
fn verdict_short(misses: &[Miss], o: &Outcome) -> String {
    let mut parts: Vec<String> = Vec::new();
    if !misses.is_empty() {
        parts.push(misses.iter().map(|m| m.metric.to_uppercase()).collect::<Vec<_>>().join("+") + " missed");
    }
    if o.overloaded() {
        parts.push("falls behind".into());
    }
    if parts.is_empty() {
        "met".into()
    } else {
        parts.join(", ")
    }
}

/// ", TTFT gives out first at 12.3 req/s".
fn limiting(c: &CapacityResult) -> String {
    match c.first_failing() {
        Some(p) => format!("; at {:.2} req/s: {}", p.rate_per_s, verdict_long(&p.misses, &p.outcome)),
        None => String::new(),
    }
}

pub fn render_capacity(header: &[String], slo: &Slo, c: &CapacityResult) -> String {
    let mut out = String::new();
    for h in header {
        let _ = writeln!(out, "{h}");
    }
    let pct = fmt_percentile(slo.percentile);
    match (c.max_rate_per_s, c.at_max()) {
        (Some(max), Some(p)) => {
            let _ = writeln!(out, "Highest rate within {}: {max:.2} req/s{}", slo.describe(), limiting(c));
            let o = &p.outcome;
            let _ = writeln!(
                out,
                "  at that rate: {:.0} output tokens/s; {pct} TTFT {} ms, TPOT {} ms, E2E {} ms",
                o.output_tokens_per_s,
                ms(o.ttft_ms.at_slo),
                ms(o.tpot_ms.at_slo),
                ms(o.e2e_ms.at_slo)
            );
            let _ = writeln!(out, "  predicted by: {}", o.predicted_by);
            if c.first_failing_rate_per_s.is_none() {
                let _ = writeln!(
                    out,
                    "  no rate tried missed the targets (the search stops at {max:.0} req/s); without a TTFT or E2E target, queueing delay is not bounded"
                );
            }
        }
        _ => {
            let lowest = c.curve.first();
            let _ = writeln!(out, "No rate meets {}.", slo.describe());
            if let Some(p) = lowest {
                let _ = writeln!(out, "  even at {:.3} req/s: {}", p.rate_per_s, verdict_long(&p.misses, &p.outcome));
            }
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "Latency vs load:");
    let _ = writeln!(
        out,
        "  {:>9}  {:>10}  {:>6}  {:>9}  {:>9}  {:>9}  SLO",
        "req/s", "out tok/s", "served", format!("{pct} TTFT"), format!("{pct} TPOT"), format!("{pct} E2E")
    );
    for p in &c.curve {
        let o = &p.outcome;
        let verdict = verdict_short(&p.misses, o);
        let _ = writeln!(
            out,
            "  {:>9.3}  {:>10.0}  {:>5.0}%  {:>9}  {:>9}  {:>9}  {}",
            p.rate_per_s,
            o.output_tokens_per_s,
            o.served_fraction * 100.0,
            ms(o.ttft_ms.at_slo),
            ms(o.tpot_ms.at_slo),
            ms(o.e2e_ms.at_slo),
            verdict
        );
    }
    out
}

/// The plan for scripts. serde_json writes unbounded (infinite) latencies as null.
pub fn plan_json(question: Value, r: &PlanResult, capacity: Option<&CapacityResult>, plots: &[String]) -> Value {
    let pick = |idx: &[usize]| idx.iter().map(|&i| json!(r.evaluated[i])).collect::<Vec<_>>();
    json!({
        "question": question,
        "slo": r.slo,
        "ranked_by": r.ranked_by,
        "chosen": r.best.map(|i| json!(r.evaluated[i])),
        "met_slo": r.best.is_some(),
        "closest": pick(&r.closest),
        "frontier_metric": r.frontier_metric,
        "frontier": pick(&r.frontier),
        "chosen_capacity": capacity.map(capacity_json_body),
        "candidates_evaluated": r.evaluated.len(),
        "simulations_run": r.simulations_run,
        "runs_stopped_early": r.evaluated.iter().filter(|e| e.outcome.stopped_early).count(),
        "candidates_meeting_slo": r.evaluated.iter().filter(|e| e.meets_slo()).count(),
        "pruned": r.pruned,
        "failed": r.failed,
        "notes": r.notes,
        "plots": plots,
    })
}

fn capacity_json_body(c: &CapacityResult) -> Value {
    json!({
        "max_rate_per_s": c.max_rate_per_s,
        "first_failing_rate_per_s": c.first_failing_rate_per_s,
        "curve": c.curve.iter().map(|p: &LoadPoint| json!(p)).collect::<Vec<_>>(),
    })
}

pub fn capacity_json(question: Value, slo: &Slo, c: &CapacityResult, plots: &[String]) -> Value {
    json!({ "question": question, "slo": slo, "capacity": capacity_json_body(c), "plots": plots })
}

//! Validation output: terminal/markdown tables, the `--json` object, the per-row CSV, and the
//! worst shapes with a likely cause.

use super::features::LinkClass;
use super::model::Form;
use super::validate::{stats, summarize, ApeStats, FormChoice, PerGpu, Pooled, ValRow, Validation, TIERS};
use crate::schema::{write_rows, KernelRow};
use anyhow::Result;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// `{tier: {op: {median_ape, p90_ape, max_ape, count}}}`.
pub fn json(pooled: &Pooled) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for tier in TIERS {
        let mut ops = serde_json::Map::new();
        for ((t, op), s) in pooled {
            if *t == tier.as_str() {
                ops.insert(op.clone(), serde_json::to_value(s).unwrap_or_default());
            }
        }
        out.insert(tier.as_str().to_string(), serde_json::Value::Object(ops));
    }
    serde_json::Value::Object(out)
}

fn ops_in(pooled: &Pooled) -> Vec<String> {
    let mut ops: Vec<String> = pooled.keys().map(|(_, op)| op.clone()).collect();
    ops.sort();
    ops.dedup();
    ops
}

fn cell(s: Option<&ApeStats>) -> String {
    match s {
        Some(s) => format!("{:.1} / {:.1} / {:.0} ({})", s.median_ape, s.p90_ape, s.max_ape, s.count),
        None => "-".to_string(),
    }
}

/// Markdown table: one row per op, one column per tier: median / p90 / max APE % (count).
pub fn table(pooled: &Pooled) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| op | target: median / p90 / max APE % (n) | cross-gen | roofline |");
    let _ = writeln!(s, "|---|---|---|---|");
    for op in ops_in(pooled) {
        let get = |t: &str| pooled.get(&(tier_key(t), op.clone()));
        let _ = writeln!(s, "| {op} | {} | {} | {} |", cell(get("target")), cell(get("cross-gen")), cell(get("roofline")));
    }
    s
}

fn tier_key(t: &str) -> &'static str {
    TIERS.iter().find(|x| x.as_str() == t).map(|x| x.as_str()).unwrap_or("roofline")
}

/// Markdown table per (op, gpu): median APE % of each tier.
pub fn per_gpu_table(per_gpu: &PerGpu) -> String {
    let mut keys: Vec<(String, String)> = per_gpu.keys().map(|(_, op, g)| (op.clone(), g.clone())).collect();
    keys.sort();
    keys.dedup();
    let mut s = String::new();
    let _ = writeln!(s, "| op | gpu | n | target median | cross-gen median | roofline median |");
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for (op, g) in keys {
        let get = |t: &'static str| per_gpu.get(&(t, op.clone(), g.clone()));
        let med = |t| get(t).map(|s: &ApeStats| format!("{:.1}", s.median_ape)).unwrap_or_else(|| "-".into());
        let n = get("roofline").map(|s| s.count).unwrap_or(0);
        let _ = writeln!(s, "| {op} | {g} | {n} | {} | {} | {} |", med("target"), med("cross-gen"), med("roofline"));
    }
    s
}

/// APEs grouped by (op, a second key, tier), written as a markdown table with one column per
/// tier: medians, or median / p90 with `p90`; `n` is the roofline tier's row count.
fn tier_table(mut groups: BTreeMap<(String, String, &'static str), Vec<f64>>, key_label: &str, p90: bool) -> String {
    let mut keys: Vec<(String, String)> = groups.keys().map(|(op, key, _)| (op.clone(), key.clone())).collect();
    keys.dedup();
    let what = if p90 { "median / p90" } else { "median" };
    let mut s = String::new();
    let _ = writeln!(s, "| op | {key_label} | n | target {what} | cross-gen {what} | roofline {what} |");
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for (op, key) in keys {
        let mut get = |t: &'static str| groups.get_mut(&(op.clone(), key.clone(), t)).map(|v| stats(v));
        let (tg, cg, rf) = (get("target"), get("cross-gen"), get("roofline"));
        let cell = |x: &Option<ApeStats>| match x {
            Some(s) if p90 => format!("{:.1} / {:.1}", s.median_ape, s.p90_ape),
            Some(s) => format!("{:.1}", s.median_ape),
            None => "-".into(),
        };
        let n = rf.as_ref().map(|s| s.count).unwrap_or(0);
        let _ = writeln!(s, "| {op} | {key} | {n} | {} | {} | {} |", cell(&tg), cell(&cg), cell(&rf));
    }
    s
}

/// Markdown table per (op, source): median APE % of each tier, pooled over GPUs. Sources are
/// the `source` column (`aiconfigurator`, `vidur`, the project's own sweeps).
pub fn per_source_table(rows: &[ValRow]) -> String {
    let mut groups: BTreeMap<(String, String, &'static str), Vec<f64>> = BTreeMap::new();
    for r in rows {
        groups.entry((r.kernel.op.to_string(), r.source.clone(), r.tier.as_str())).or_default().push(r.ape());
    }
    tier_table(groups, "source", false)
}

/// Markdown table per collective op and where its GPUs sit: in one node (NVLink, NVLink
/// bridge or PCIe) or on different nodes (the scale-out network or a PCIe server's host
/// network, `LinkClass::of_row`). A multi-node row measures its cluster's network, which no GPU
/// spec sheet describes, so the cross-gen error is shown apart for the two. Median / p90 APE %.
pub fn per_link_table(rows: &[ValRow]) -> String {
    let mut specs: BTreeMap<String, Option<crate::hardware::GpuSpec>> = BTreeMap::new();
    let mut groups: BTreeMap<(String, String, &'static str), Vec<f64>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.kernel.op.is_collective()) {
        let spec = specs.entry(r.gpu.clone()).or_insert_with(|| crate::hardware::load_gpu(&r.gpu).ok());
        let Some(spec) = spec else { continue };
        let nodes = match LinkClass::of_row(spec, r.kernel.num_gpus, &r.backend) {
            LinkClass::ScaleOut | LinkClass::HostNet => "across nodes",
            LinkClass::ScaleUp | LinkClass::Bridge | LinkClass::Pcie => "in one node",
        };
        groups.entry((r.kernel.op.to_string(), nodes.to_string(), r.tier.as_str())).or_default().push(r.ape());
    }
    tier_table(groups, "GPUs", true)
}

/// A likely cause of a large error, from what the row itself shows (a heuristic, labelled so).
fn likely_cause(r: &ValRow) -> &'static str {
    if r.measured_us < r.sol_us {
        "measured faster than HBM SOL: data L2-resident (reused weights) or bytes overcounted"
    } else if r.measured_us < 8.0 {
        "latency-bound (< 8 us): launch and synchronisation dominate, SOL says little"
    } else if r.predicted_us > 3.0 * r.measured_us || r.measured_us > 3.0 * r.predicted_us {
        match r.tier {
            crate::perf::Tier::Roofline => "one constant efficiency cannot span this shape's regime",
            crate::perf::Tier::CrossGen => "efficiency on this GPU differs from every training GPU in this regime",
            crate::perf::Tier::Target => "isolated shape: few training neighbours for this backend",
        }
    } else {
        "shape or backend sparsely covered by training rows"
    }
}

/// The `n` worst rows per (tier, op), as a markdown list.
pub fn worst(rows: &[ValRow], n: usize) -> String {
    let mut groups: BTreeMap<(&str, String), Vec<&ValRow>> = BTreeMap::new();
    for r in rows {
        groups.entry((r.tier.as_str(), r.kernel.op.to_string())).or_default().push(r);
    }
    let mut s = String::new();
    for tier in TIERS {
        for ((t, op), mut v) in groups.clone() {
            if t != tier.as_str() {
                continue;
            }
            v.sort_by(|a, b| b.ape().total_cmp(&a.ape()));
            let _ = writeln!(s, "- **{t} / {op}**");
            for r in v.iter().take(n) {
                let _ = writeln!(
                    s,
                    "  - {:.0}% on {} `{} {}` ({}): measured {:.1} us, predicted {:.1} us, SOL {:.1} us. Likely: {}",
                    r.ape(),
                    r.gpu,
                    r.kernel.dtype,
                    r.kernel.shape_string(),
                    r.backend,
                    r.measured_us,
                    r.predicted_us,
                    r.sol_us,
                    likely_cause(r)
                );
            }
        }
    }
    s
}

/// Rows as a shared-schema CSV with `tier, predicted_us, sol_us, ape_pct` appended.
pub fn write_csv<W: std::io::Write>(w: W, rows: &[ValRow]) -> Result<()> {
    let krows: Vec<KernelRow> = rows
        .iter()
        .map(|r| KernelRow {
            kernel: r.kernel.clone(),
            latency_us: Some(r.measured_us),
            gpu: Some(r.gpu.clone()),
            source: Some(r.source.clone()),
            backend: Some(r.backend.clone()),
            extra: vec![],
        })
        .collect();
    write_rows(w, &krows, &["tier", "predicted_us", "sol_us", "ape_pct"], |i| {
        let r = &rows[i];
        vec![r.tier.as_str().to_string(), format!("{:.4}", r.predicted_us), format!("{:.4}", r.sol_us), format!("{:.3}", r.ape())]
    })
}

/// The whole markdown report (docs/calibration.md).
pub fn markdown(validation: &Validation, command: &str, data_notes: &str) -> String {
    let rows = &validation.rows;
    let (pooled, per_gpu) = summarize(rows);
    let mut s = String::new();
    let _ = writeln!(s, "# Kernel-time calibration: validation on held-out rows\n");
    let _ = writeln!(s, "Generated by:\n\n```\n{command}\n```\n");
    let _ = writeln!(s, "{data_notes}\n");
    let _ = writeln!(
        s,
        "Method. Each op family's time is `base * exp(g(features))`, never below SOL: `base = latency + SOL * c` \
         is a robust fit (median over a grid of launch floors; for collectives per link class of the measured \
         topology, NVSwitch / NVLink bridge / PCIe / scale-out, and timing method, with SOL on that link's \
         spec bandwidth) and `g` a histogram gradient-boosted tree ensemble on hardware-normalized features \
         (arithmetic intensity over the ridge point, tile waves over SMs, working set over L2, log sizes, GQA \
         ratio, experts per token per GPU, experts' row-tile padding under the row's routing, message size over link bandwidth, spec-sheet rates, backend \
         category), its tree count (target tier) picked on an inner validation set of one shape in ten where \
         that set has at least 200 rows (else, and in the cross-gen tier, 100 trees). Cross-gen families trained on at most 3 GPUs choose their form (learned, base alone, or \
         SOL over the op's median efficiency) by an inner leave-one-GPU-out over the training GPUs. Tiers on \
         the same rows: \
         `target` = fitted on the GPU's other shapes; `cross-gen` = fitted on the other GPUs only (the GPU's \
         spec sheet is all it knows of it); `roofline` = SOL over one median efficiency per op class, fitted on \
         the other GPUs, with the default launch floor. APE = |predicted - measured| / measured; percentiles \
         are nearest-rank.\n"
    );
    let _ = writeln!(s, "## All tiers on the same held-out rows (pooled over evaluated GPUs)\n");
    let _ = writeln!(s, "{}", table(&pooled));
    let _ = writeln!(s, "## Median APE % per GPU\n");
    let _ = writeln!(s, "{}", per_gpu_table(&per_gpu));
    let _ = writeln!(s, "## Median APE % per data source\n");
    let _ = writeln!(s, "{}", per_source_table(rows));
    let _ = writeln!(s, "## Collectives within one node and across nodes (median / p90 APE %)\n");
    let _ = writeln!(s, "{}", per_link_table(rows));
    let _ = writeln!(s, "## Cross-gen model form per held-out GPU\n");
    let _ = writeln!(s, "{}", forms_table(&validation.forms));
    let _ = writeln!(s, "## Same-die siblings: a library this GPU never measured\n");
    let _ = writeln!(s, "{}", sibling_table(validation));
    let _ = writeln!(s, "## Worst shapes\n");
    let _ = writeln!(s, "{}", worst(rows, 3));
    s
}

/// Held-out rows of each GPU predicted from its same-die sibling's target model, next to the
/// target and cross-gen tiers on the same rows (median / p90 APE %).
pub fn sibling_table(v: &Validation) -> String {
    if v.sibling.is_empty() {
        return "No evaluated GPU has a same-die sibling with measurements.\n".to_string();
    }
    let key = |r: &ValRow| (r.gpu.clone(), r.backend.clone(), format!("{:?}", r.kernel));
    let by_tier: BTreeMap<(&'static str, (String, String, String)), f64> = v.rows.iter().map(|r| ((r.tier.as_str(), key(r)), r.ape())).collect();
    // (gpu, sibling, op) -> APEs of (sibling, target, cross-gen) on the same rows.
    let mut groups: BTreeMap<(String, String, String), [Vec<f64>; 3]> = BTreeMap::new();
    for (sib, r, paired) in &v.sibling {
        let k = key(r);
        let (Some(t), Some(c)) = (by_tier.get(&("target", k.clone())), by_tier.get(&("cross-gen", k))) else { continue };
        let g = groups.entry((r.gpu.clone(), sib.clone(), r.kernel.op.to_string())).or_default();
        g[0].push(paired.as_ref().unwrap_or(r).ape()); // the shipped form
        g[1].push(*t);
        g[2].push(*c);
    }
    let mut s = String::from(
        "A library the GPU never measured, named by the user, is priced by a same-die sibling's target \
         model (same architecture, SMs, clock and peaks: `GpuSpec::same_compute_die`) on the sibling's spec \
         sheet plus the difference in the time the two memories need for the kernel's compulsory bytes \
         (`perf::efficiency::sibling_time_us`), or scaled by another library of the same kernel that both \
         GPUs measured (`paired_sibling_time_us`, second table). Here the sibling's model is fitted on the sibling's rows alone \
         and predicts this GPU's held-out rows of the libraries both measured; median / p90 APE %.\n\n\
         | gpu | sibling | op | rows | from sibling | target | cross-gen |\n|---|---|---|---|---|---|---|\n",
    );
    for ((gpu, sib, op), [a, t, c]) in groups.iter_mut() {
        let (sa, st, sc) = (stats(a), stats(t), stats(c));
        let _ = writeln!(
            s,
            "| {gpu} | {sib} | {op} | {} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} / {:.1} |",
            sa.count, sa.median_ape, sa.p90_ape, st.median_ape, st.p90_ape, sc.median_ape, sc.p90_ape
        );
    }
    // Rows whose kernel another library measured on both GPUs: the paired form next to the
    // compulsory-bytes form, per library.
    let mut paired: BTreeMap<(String, String, String), [Vec<f64>; 2]> = BTreeMap::new();
    for (sib, r, p) in &v.sibling {
        if let Some(p) = p {
            let g = paired.entry((r.gpu.clone(), sib.clone(), r.backend.clone())).or_default();
            g[0].push(p.ape());
            g[1].push(r.ape());
        }
    }
    if !paired.is_empty() {
        s.push_str(
            "\nWhere both GPUs measured another library of the same kernel (`perf::efficiency::kernel_family`), \
             the shipped form scales the sibling's time by that library's two models at the row's shape \
             (`paired_sibling_time_us`) instead of the compulsory bytes' memory-time difference; same rows, \
             median / p90 APE %:\n\n| gpu | sibling | library | rows | paired kernel | compulsory bytes |\n|---|---|---|---|---|---|\n",
        );
        for ((gpu, sib, lib), [p, a]) in paired.iter_mut() {
            let (sp, sa) = (stats(p), stats(a));
            let _ = writeln!(s, "| {gpu} | {sib} | {lib} | {} | {:.1} / {:.1} | {:.1} / {:.1} |", sp.count, sp.median_ape, sp.p90_ape, sa.median_ape, sa.p90_ape);
        }
    }
    s
}

/// The forms the inner leave-one-GPU-out check chose (families trained on few GPUs), with the
/// mean over its folds of each candidate's median |ln(predicted / measured)|.
pub fn forms_table(forms: &[FormChoice]) -> String {
    if forms.is_empty() {
        return "Every evaluated cross-gen family trained on enough GPUs to keep its trees.\n".to_string();
    }
    let mut s = String::from(
        "Families trained on at most three GPUs pick their form by an inner leave-one-GPU-out over \
         the training GPUs only; cells are that check's mean median |ln(predicted / measured)| per \
         candidate (- where the family does not offer it).\n\n\
         | op | held-out gpu | form | inner folds | learned | base | two-resource | roofline |\n|---|---|---|---|---|---|---|---|\n",
    );
    let mut sorted: Vec<&FormChoice> = forms.iter().collect();
    sorted.sort_by(|a, b| (a.op.as_str(), &a.gpu).cmp(&(b.op.as_str(), &b.gpu)));
    for f in sorted {
        let c = &f.inner_check;
        let offered = super::select::candidates(f.op);
        let cell = |form: Form, v: Option<f64>| match v {
            Some(v) if offered.contains(&form) => format!("{v:.3}"),
            _ => "-".to_string(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            f.op.as_str(),
            f.gpu,
            f.form.as_str(),
            c.gpus,
            cell(Form::Learned, Some(c.learned_log_err)),
            cell(Form::BaseOnly, Some(c.base_only_log_err)),
            cell(Form::TwoResource, c.two_resource_log_err),
            cell(Form::Roofline, Some(c.roofline_log_err)),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate::select::InnerCheck;
    use crate::schema::{Kernel, Op};

    #[test]
    fn collectives_are_split_by_whether_their_gpus_share_a_node() {
        let row = |tier: crate::perf::Tier, num_gpus: u64, backend: &str, predicted_us: f64| {
            let kernel = Kernel { num_gpus, bytes: 1 << 20, ..Kernel::new(Op::AllReduce, crate::schema::Dtype::Bf16) };
            ValRow { tier, gpu: "a100_sxm".into(), kernel, backend: backend.into(), source: "vidur".into(), measured_us: 100.0, predicted_us, sol_us: 10.0 }
        };
        use crate::perf::Tier::{CrossGen, Roofline};
        let rows = [
            // 8 GPUs of one HGX node, and Vidur's two-node profile at 2 GPUs (one per node).
            row(CrossGen, 8, "vidur/dgx", 110.0),
            row(Roofline, 8, "vidur/dgx", 50.0),
            row(CrossGen, 2, "vidur/dgx/internode", 25.0),
            row(Roofline, 2, "vidur/dgx/internode", 20.0),
            // 16 GPUs are more than one node holds, whatever the backend says.
            row(CrossGen, 16, "nccl", 40.0),
            row(Roofline, 16, "nccl", 20.0),
        ];
        let t = per_link_table(&rows);
        // Nearest-rank: the median of two APEs is the lower.
        assert!(t.contains("| all_reduce | in one node | 1 | - | 10.0 / 10.0 | 50.0 / 50.0 |"), "{t}");
        assert!(t.contains("| all_reduce | across nodes | 2 | - | 60.0 / 75.0 | 80.0 / 80.0 |"), "{t}");
    }

    #[test]
    fn forms_table_shows_only_the_candidates_a_family_offers() {
        let inner_check = InnerCheck { gpus: 2, learned_log_err: 0.5, base_only_log_err: 0.25, roofline_log_err: 0.75, two_resource_log_err: Some(0.125) };
        let forms = [
            FormChoice { gpu: "h200_sxm".into(), op: Op::Rmsnorm, form: Form::TwoResource, inner_check },
            FormChoice { gpu: "a100_sxm".into(), op: Op::P2p, form: Form::BaseOnly, inner_check: InnerCheck { two_resource_log_err: None, ..inner_check } },
        ];
        let t = forms_table(&forms);
        // Elementwise offers two-resource, base and roofline, not the trees; collectives trees and base.
        assert!(t.contains("| rmsnorm | h200_sxm | two-resource | 2 | - | 0.250 | 0.125 | 0.750 |"), "{t}");
        assert!(t.contains("| p2p | a100_sxm | base-only | 2 | 0.500 | 0.250 | - | - |"), "{t}");
        // Sorted by op name: p2p before rmsnorm.
        assert!(t.find("| p2p").unwrap() < t.find("| rmsnorm").unwrap());
        assert!(forms_table(&[]).contains("keep its trees"));
    }
}

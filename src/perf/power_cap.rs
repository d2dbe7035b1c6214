//! The GEMM rate a GPU holds at its power limit under a serving engine's back-to-back steps.
//! Kernel tables time each shape in a short burst, below the limit; a chain of large GEMMs
//! pins the GPU at its limit from the first step and runs slower (H100: 686 TFLOPS sustained
//! where the tables show up to ~860). `calibration/power/sustained_gemm.toml` holds the
//! measured rates; the simulator caps bf16/fp16 GEMMs at them. The limiter holds average power
//! over ~100 ms, longer than a serving step, so a step whose GEMMs fill less of its wall time
//! runs them faster (`PowerCap::tflops_at`): idle time relieves the limit fully, other kernels
//! (HBM-bound) partly.

use super::Tier;
use crate::hardware::{builtin_spec, builtin_specs, GpuSpec};
use crate::schema::{Dtype, Kernel, Op};
use anyhow::{anyhow, bail, Result};
use serde::Deserialize;

pub const SUSTAINED_GEMM_PATH: &str = "power/sustained_gemm.toml";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SustainedRate {
    pub id: String,
    pub bf16_tflops: f64,
    /// The measurement the rate comes from (path from the repository root).
    pub raw: String,
    pub note: String,
    /// How serving-sized steps with time outside the GEMMs run faster.
    #[serde(default)]
    pub relief: Option<Relief>,
}

/// Serving-sized GEMM steps (~30 ms) with idle or copies between them, relative to the same
/// steps back to back.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Relief {
    /// The measurement (path from the repository root) and its back-to-back phase.
    pub raw: String,
    pub back_to_back_phase: String,
    /// Rate relative to back to back, per share of the wall time in GEMMs, the rest idle.
    pub idle: Vec<ReliefPoint>,
    /// How much a unit of HBM-bound kernel time relieves the limit next to a unit of idle time
    /// (0: not at all, 1: as much), from the `copy` phases (GEMM share, phase).
    pub other_kernel_weight: f64,
    pub copy: Vec<CopyPhase>,
    /// The limiter averages power over about this window (first order): a step much longer
    /// than it gains less, as `coarse` phases (long GEMM stretches, idle between, timed against
    /// `coarse_back_to_back_phase`) showed against the idle points' `reference_cycle_ms` cycles.
    pub window_ms: f64,
    pub reference_cycle_ms: f64,
    pub coarse_back_to_back_phase: String,
    pub coarse: Vec<CopyPhase>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReliefPoint {
    /// Share of the wall time in GEMMs, in (0, 1).
    pub gemm_frac: f64,
    pub relative: f64,
    pub phase: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyPhase {
    pub gemm_frac: f64,
    pub phase: String,
}

impl Relief {
    /// How much of the relief a step of `cycle_ms` gets next to the idle points' cycles: the
    /// share of a first-order window's average a cycle sees, relative (at most 1).
    pub fn window_factor(&self, cycle_ms: f64) -> f64 {
        let w = |t: f64| if t <= 0.0 { 1.0 } else { self.window_ms / t * (1.0 - (-t / self.window_ms).exp()) };
        (w(cycle_ms) / w(self.reference_cycle_ms)).min(1.0)
    }

    /// Rate relative to back to back at an idle-equivalent GEMM share: linear between measured
    /// shares, and no faster than the least-loaded measurement below them.
    /// `idle` is sorted by share (`parse_rates`); back to back, (1, 1), closes the curve. Runs
    /// in every prefill step: no allocation.
    pub fn relative_at(&self, gemm_frac: f64) -> f64 {
        let pts = || self.idle.iter().map(|p| (p.gemm_frac, p.relative)).chain(std::iter::once((1.0, 1.0)));
        let (mut f0, mut r0) = pts().next().expect("parse_rates checks idle is not empty");
        let f = gemm_frac.clamp(f0, 1.0);
        for (f1, r1) in pts().skip(1) {
            if f1 >= f {
                return r0 + (r1 - r0) * (f - f0) / (f1 - f0);
            }
            (f0, r0) = (f1, r1);
        }
        r0
    }
}

/// The bf16 GEMM rate a GPU holds at its power limit, by how a step fills its wall time.
#[derive(Debug, Clone)]
pub struct PowerCap {
    sustained_tflops: f64,
    /// None: only the back-to-back rate is known.
    relief: Option<Relief>,
    /// Where the rate comes from.
    pub from: String,
}

impl PowerCap {
    /// Back to back (GEMMs all the time).
    pub fn sustained_tflops(&self) -> f64 {
        self.sustained_tflops
    }

    /// The rate when GEMMs run `gemm_frac` of the wall time and the GPU idles the rest, in
    /// steps as short as the measured ones.
    pub fn tflops_at(&self, gemm_frac: f64) -> f64 {
        self.sustained_tflops * self.relief.as_ref().map_or(1.0, |r| r.relative_at(gemm_frac))
    }

    /// The rate in a step of `wall_us` whose GEMMs keep the tensor cores busy `gemm_us` and
    /// whose other kernels run `other_us`.
    pub fn tflops_in(&self, gemm_us: f64, other_us: f64, wall_us: f64) -> f64 {
        let Some(relief) = &self.relief else { return self.sustained_tflops };
        if wall_us <= 0.0 {
            return self.sustained_tflops;
        }
        // Other kernels count partly as GEMM time (they draw power, less than tensor cores).
        let share = (gemm_us + (1.0 - relief.other_kernel_weight) * other_us) / wall_us;
        let relief_at_share = relief.relative_at(share.clamp(0.0, 1.0)) - 1.0;
        self.sustained_tflops * (1.0 + relief_at_share * relief.window_factor(wall_us * 1e-3))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SustainedFile {
    gpu: Vec<SustainedRate>,
}

/// Parses and checks the rates file; `origin` names it in errors.
pub fn parse_rates(text: &str, origin: &str) -> Result<Vec<SustainedRate>> {
    let mut f: SustainedFile = toml::from_str(text).map_err(|e| anyhow!("{origin}: {e}"))?;
    for rel in f.gpu.iter_mut().filter_map(|r| r.relief.as_mut()) {
        rel.idle.sort_by(|a, b| a.gemm_frac.total_cmp(&b.gemm_frac));
    }
    for (i, r) in f.gpu.iter().enumerate() {
        if !(r.bf16_tflops > 0.0 && r.bf16_tflops.is_finite()) {
            bail!("{origin}: gpu[{i}] field 'bf16_tflops' must be a positive number of TFLOP/s, got {}", r.bf16_tflops);
        }
        if builtin_spec(&r.id).is_none() {
            let known = builtin_specs()?;
            bail!("{origin}: gpu[{i}] field 'id' = '{}' is not a GPU in hw_specs/ (known: {})", r.id, known.iter().map(|s| s.id.as_str()).collect::<Vec<_>>().join(", "));
        }
        if let Some(rel) = &r.relief {
            let field = |f: &str| format!("{origin}: gpu[{i}].relief field '{f}'");
            if !(rel.window_ms > 0.0 && rel.reference_cycle_ms > 0.0) {
                bail!("{} and 'reference_cycle_ms' must be positive milliseconds, got {} and {}", field("window_ms"), rel.window_ms, rel.reference_cycle_ms);
            }
            if !(0.0..=1.0).contains(&rel.other_kernel_weight) {
                bail!("{} must be a weight in [0, 1], got {}", field("other_kernel_weight"), rel.other_kernel_weight);
            }
            if rel.idle.is_empty() {
                bail!("{} needs at least one point", field("idle"));
            }
            for p in &rel.idle {
                if !(p.gemm_frac > 0.0 && p.gemm_frac < 1.0) {
                    bail!("{} gemm_frac must be a share in (0, 1), got {}", field("idle"), p.gemm_frac);
                }
                if !(p.relative >= 1.0 && p.relative.is_finite()) {
                    bail!("{} relative must be >= 1 (idle lowers the power drawn), got {}", field("idle"), p.relative);
                }
            }
        }
    }
    Ok(f.gpu)
}

/// The shipped rates, parsed once per process (a predictor is built per run replayed).
pub fn shipped_rates() -> Result<Vec<SustainedRate>> {
    static RATES: std::sync::OnceLock<std::result::Result<Vec<SustainedRate>, String>> = std::sync::OnceLock::new();
    let parsed = RATES.get_or_init(|| {
        let text = crate::calibrate::store::Store::Embedded
            .text(SUSTAINED_GEMM_PATH)
            .and_then(|t| t.ok_or_else(|| anyhow!("calibration/{SUSTAINED_GEMM_PATH} is not embedded")))
            .map_err(|e| e.to_string())?;
        parse_rates(&text, &format!("calibration/{SUSTAINED_GEMM_PATH}")).map_err(|e| e.to_string())
    });
    parsed.clone().map_err(|e| anyhow!(e))
}

/// The power cap on bf16 GEMMs the `tier` may use on `gpu`, with where it comes from.
/// Target: the GPU's own measurement, else a same-die GPU's (same architecture, SMs, clocks,
/// peaks and power limit). Cross-gen: same-die GPUs' measurements only, never the GPU's own.
/// Roofline: none (the baseline stays plain). None where nothing applies.
pub fn power_cap(gpu: &GpuSpec, tier: Tier, rates: &[SustainedRate]) -> Result<Option<PowerCap>> {
    if tier == Tier::Roofline {
        return Ok(None);
    }
    let siblings: Vec<&SustainedRate> = rates
        .iter()
        .filter(|r| r.id != gpu.id && builtin_spec(&r.id).is_some_and(|s| s.same_compute_die(gpu)))
        .collect();
    let sibling_relief = siblings.iter().find_map(|r| r.relief.as_ref().map(|rel| (rel.clone(), r.id.as_str())));
    let own = rates.iter().find(|r| r.id == gpu.id).filter(|_| tier == Tier::Target);
    let (sustained_tflops, mut from) = match own {
        Some(r) => (r.bf16_tflops, format!("{} measured", r.id)),
        None if siblings.is_empty() => return Ok(None),
        None => {
            let mean = siblings.iter().map(|r| r.bf16_tflops).sum::<f64>() / siblings.len() as f64;
            let ids = siblings.iter().map(|r| r.id.as_str()).collect::<Vec<_>>().join(", ");
            (mean, format!("same die as {ids}, measured there"))
        }
    };
    // The relief is the die's power management: the GPU's own where measured, else a sibling's.
    let relief = match own.and_then(|r| r.relief.clone()) {
        Some(rel) => Some(rel),
        None => sibling_relief.map(|(rel, id)| {
            if own.is_some() {
                from.push_str(&format!("; relief with idle measured on the same die's {id}"));
            }
            rel
        }),
    };
    Ok(Some(PowerCap { sustained_tflops, relief, from }))
}

/// Whether the cap applies to `k`: dense bf16/fp16 GEMMs only (only those were measured under load).
pub fn is_capped(k: &Kernel) -> bool {
    k.op == Op::Gemm && matches!(k.dtype, Dtype::Bf16 | Dtype::Fp16)
}

/// `predicted_us` for `k` no faster than `tflops` allows, where the cap applies to `k`.
pub fn capped_us(k: &Kernel, predicted_us: f64, tflops: f64) -> f64 {
    if !is_capped(k) {
        return predicted_us;
    }
    predicted_us.max(crate::kernels::cost::flops(k) / (tflops * 1e6))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::load_gpu;

    /// Median step (ms) and TFLOPS of each phase of a `microbench/sustained_gemm.py` JSON file.
    fn phases(raw: &str) -> impl Fn(&str) -> (f64, f64) {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root.join(raw)).unwrap()).unwrap();
        let layers = v["layers"].as_f64().unwrap();
        let per_layer = v["tflop_per_step"].as_f64().unwrap() / layers;
        move |name: &str| {
            let phase = v["phases"].as_array().unwrap().iter().find(|p| p["phase"] == name).unwrap_or_else(|| panic!("no phase {name}"));
            let ms = crate::quantile::median(&phase["steps"].as_array().unwrap().iter().map(|s| s["ms"].as_f64().unwrap()).collect::<Vec<_>>());
            (ms, per_layer * phase["layers"].as_f64().unwrap_or(layers) / ms * 1e3)
        }
    }

    #[test]
    fn each_sustained_rate_reproduces_from_its_raw_measurement() {
        for r in shipped_rates().unwrap() {
            let phase = phases(&r.raw);
            let tflops = |name: &str| phase(name).1;
            assert!((tflops("sustained") - r.bf16_tflops).abs() < 0.05, "{}: file says {}, {} gives {:.2}", r.id, r.bf16_tflops, r.raw, tflops("sustained"));
            let Some(rel) = &r.relief else { continue };
            let phase = phases(&rel.raw);
            let tflops = |name: &str| phase(name).1;
            let base = tflops(&rel.back_to_back_phase);
            for p in &rel.idle {
                assert!((tflops(&p.phase) / base - p.relative).abs() < 5e-4, "{} {}: file says {}, raw gives {:.4}", r.id, p.phase, p.relative, tflops(&p.phase) / base);
            }
            // The copies' weight: the one (to 0.01) that best predicts the copy-filled phases.
            let error = |w: f64| -> f64 {
                let model = Relief { other_kernel_weight: w, ..rel.clone() };
                rel.copy.iter().map(|c| (model.relative_at(c.gemm_frac + (1.0 - w) * (1.0 - c.gemm_frac)) - tflops(&c.phase) / base).powi(2)).sum()
            };
            let best = (0..=100).map(|i| i as f64 / 100.0).min_by(|a, b| error(*a).total_cmp(&error(*b))).unwrap();
            assert!((best - rel.other_kernel_weight).abs() < 0.011, "{}: file says weight {}, copies give {best}", r.id, rel.other_kernel_weight);
            // The window: the one (to 5 ms) whose factor best predicts the coarse phases' share of
            // the relief (cycle = GEMM time / share).
            let coarse_base = tflops(&rel.coarse_back_to_back_phase);
            let observed: Vec<(f64, f64)> = rel
                .coarse
                .iter()
                .map(|c| (phase(&c.phase).0 / c.gemm_frac, (tflops(&c.phase) / coarse_base - 1.0) / (rel.relative_at(c.gemm_frac) - 1.0)))
                .collect();
            let error = |window_ms: f64| -> f64 {
                let model = Relief { window_ms, ..rel.clone() };
                observed.iter().map(|&(cycle, seen)| (model.window_factor(cycle) - seen).powi(2)).sum()
            };
            let best = (2..=400).map(|i| i as f64 * 5.0).min_by(|a, b| error(*a).total_cmp(&error(*b))).unwrap();
            assert!((best - rel.window_ms).abs() < 5.1, "{}: file says window {} ms, coarse phases give {best}", r.id, rel.window_ms);
        }
    }

    #[test]
    fn the_relief_predicts_a_repeat_at_other_shares_on_another_machine() {
        // Pre-registered (microbench/predictions/sustained_gemm_qwen3_14b.md) before the H100
        // repeat at GEMM shares 0.9 / 0.7 / 0.5 ran on a machine nothing was fitted on.
        let rates = shipped_rates().unwrap();
        let rel = rates.iter().find(|r| r.id == "h100_sxm").unwrap().relief.clone().unwrap();
        let phase = phases("microbench/data/h100_sxm/sustained_gemm_qwen3_14b_fine44/sustained_gemm.json");
        let base = phase("fine_sustained").1;
        for (name, gemm_frac) in [("fine90", 0.9), ("fine70", 0.7), ("fine50", 0.5)] {
            let idle = rel.relative_at(gemm_frac);
            let copy = rel.relative_at(gemm_frac + (1.0 - rel.other_kernel_weight) * (1.0 - gemm_frac));
            for (kind, predicted) in [("idle", idle), ("copy", copy)] {
                let measured = phase(&format!("{name}_{kind}")).1 / base;
                assert!((measured / predicted - 1.0).abs() < 0.03, "{name}_{kind}: measured {measured:.4}, relief {predicted:.4}");
            }
        }
    }

    #[test]
    fn cross_gen_never_uses_the_gpus_own_rate_and_roofline_none() {
        let rates = shipped_rates().unwrap();
        let h100 = load_gpu("h100_sxm").unwrap();
        let h200 = load_gpu("h200_sxm").unwrap();
        let own = |id: &str| rates.iter().find(|r| r.id == id).unwrap().bf16_tflops;
        assert_eq!(power_cap(&h200, Tier::Target, &rates).unwrap().unwrap().sustained_tflops(), own("h200_sxm"));
        // Same die, same 700 W: cross-gen carries the sibling's measurement over.
        assert_eq!(power_cap(&h200, Tier::CrossGen, &rates).unwrap().unwrap().sustained_tflops(), own("h100_sxm"));
        let h100_cross = power_cap(&h100, Tier::CrossGen, &rates).unwrap().unwrap();
        assert_eq!(h100_cross.sustained_tflops(), own("h200_sxm"));
        // Its relief too is the sibling's (the H200's, session 48), never its own.
        let h200_relief = rates.iter().find(|r| r.id == "h200_sxm").unwrap().relief.clone().unwrap();
        let h100_relief = rates.iter().find(|r| r.id == "h100_sxm").unwrap().relief.clone().unwrap();
        assert_ne!(h200_relief.relative_at(0.6), h100_relief.relative_at(0.6));
        assert!((h100_cross.tflops_at(0.6) / h100_cross.sustained_tflops() - h200_relief.relative_at(0.6)).abs() < 1e-12);
        assert!(power_cap(&h100, Tier::Roofline, &rates).unwrap().is_none());
        // Another die (or power limit): nothing measured applies.
        for id in ["a100_sxm", "b200_sxm", "h100_pcie", "l40s"] {
            assert!(power_cap(&load_gpu(id).unwrap(), Tier::Target, &rates).unwrap().is_none(), "{id}");
        }
    }

    #[test]
    fn the_cap_relaxes_with_idle_fully_with_other_kernels_partly_only_as_far_as_measured() {
        let rates = shipped_rates().unwrap();
        let own = rates.iter().find(|r| r.id == "h100_sxm").unwrap();
        let rel = own.relief.as_ref().expect("the H100 ran serving-sized steps with idle between");
        let cap = power_cap(&load_gpu("h100_sxm").unwrap(), Tier::Target, &rates).unwrap().unwrap();
        let least = rel.idle.iter().min_by(|a, b| a.gemm_frac.total_cmp(&b.gemm_frac)).unwrap();
        assert_eq!(cap.tflops_at(1.0), own.bf16_tflops);
        assert!((cap.tflops_at(least.gemm_frac) - least.relative * own.bf16_tflops).abs() < 1e-9);
        // Between the measured shares: in between; below them: no faster than the least-loaded one.
        let mid = cap.tflops_at((1.0 + least.gemm_frac) / 2.0);
        assert!(mid > own.bf16_tflops && mid < least.relative * own.bf16_tflops, "{mid}");
        assert_eq!(cap.tflops_at(0.05), cap.tflops_at(least.gemm_frac));
        // 30 ms of GEMMs in a 40 ms step (us): 10 ms idle relieve more than 10 ms of other kernels.
        let (idle, busy) = (cap.tflops_in(30_000.0, 0.0, 40_000.0), cap.tflops_in(30_000.0, 10_000.0, 40_000.0));
        assert!(idle > busy && busy > own.bf16_tflops, "{idle} {busy}");
        // The same share over a 400 ms step: the limiter's window sees mostly GEMMs, less relief.
        let long = cap.tflops_in(300_000.0, 0.0, 400_000.0);
        assert!(long < idle && long > own.bf16_tflops, "{long} {idle}");
        // The H200 measured its own relief (session 48): its target cap uses it, not the H100's.
        let h200_own = rates.iter().find(|r| r.id == "h200_sxm").unwrap();
        let h200 = power_cap(&load_gpu("h200_sxm").unwrap(), Tier::Target, &rates).unwrap().unwrap();
        assert!((h200.tflops_at(0.6) / h200.sustained_tflops() - h200_own.relief.as_ref().unwrap().relative_at(0.6)).abs() < 1e-12);
        assert!(h200.tflops_at(0.6) / h200.sustained_tflops() > cap.tflops_at(0.6) / cap.sustained_tflops());
        assert!(h200.from.contains("h200_sxm measured") && !h200.from.contains("h100_sxm"), "{}", h200.from);
        let bad = "[[gpu]]\nid = \"h100_sxm\"\nbf16_tflops = 600\nraw = \"x\"\nnote = \"y\"\n[gpu.relief]\nraw = \"x\"\nback_to_back_phase = \"b\"\nother_kernel_weight = 0.5\ncopy = []\nwindow_ms = 200\nreference_cycle_ms = 40\ncoarse_back_to_back_phase = \"s\"\ncoarse = []\nidle = [{ gemm_frac = 0.6, relative = 0.9, phase = \"p\" }]\n";
        let e = parse_rates(bad, "f.toml").unwrap_err().to_string();
        assert!(e.contains("gpu[0].relief field 'idle'") && e.contains("relative"), "{e}");
    }

    #[test]
    fn only_bf16_gemms_slower_than_the_rate_are_capped() {
        let big = Kernel { m: 8192, n: 34816, k: 5120, ..Kernel::new(Op::Gemm, Dtype::Bf16) };
        let flops = 2.0 * 8192.0 * 34816.0 * 5120.0;
        // Priced at 900 TFLOPS by a table: capped at 685.7.
        assert!((capped_us(&big, flops / 900e6, 685.7) - flops / 685.7e6).abs() < 1e-6);
        // Already slower than the cap: unchanged.
        assert_eq!(capped_us(&big, flops / 500e6, 685.7), flops / 500e6);
        let fp8 = Kernel { dtype: Dtype::Fp8, ..big.clone() };
        assert_eq!(capped_us(&fp8, 1.0, 685.7), 1.0);
        let attn = Kernel::new(Op::AttnPrefill, Dtype::Bf16);
        assert_eq!(capped_us(&attn, 1.0, 685.7), 1.0);
    }

    #[test]
    fn a_bad_rates_file_names_the_field() {
        let e = parse_rates("[[gpu]]\nid = \"h100_sxm\"\nbf16_tflops = -3\nraw = \"x\"\nnote = \"y\"\n", "f.toml").unwrap_err().to_string();
        assert!(e.contains("f.toml") && e.contains("bf16_tflops"), "{e}");
        let e = parse_rates("[[gpu]]\nid = \"h900\"\nbf16_tflops = 3\nraw = \"x\"\nnote = \"y\"\n", "f.toml").unwrap_err().to_string();
        assert!(e.contains("'id' = 'h900'") && e.contains("h100_sxm"), "{e}");
    }
}

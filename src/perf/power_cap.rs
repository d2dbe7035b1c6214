//! The GEMM rate a GPU holds at its power limit under a serving engine's back-to-back steps.
//! Kernel tables time each shape in a short burst, below the limit; a chain of large GEMMs
//! pins the GPU at its limit from the first step and runs slower (H100: 686 TFLOPS sustained
//! where the tables show up to ~860). `calibration/power/sustained_gemm.toml` holds the
//! measured rates; the simulator caps bf16/fp16 GEMMs at them. Where the GPU also ran the chain
//! with idle between steps, the cap relaxes with the share of a step's time the tensor cores
//! work (`PowerCap::tflops_at`): the limit bounds average power, and idle time lowers it.

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
    /// The rate with idle between steps, per share of time spent in the GEMMs.
    #[serde(default)]
    pub duty: Vec<DutyRate>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DutyRate {
    /// Share of the wall time the GPU ran the GEMM chain, in (0, 1).
    pub gemm_frac: f64,
    pub bf16_tflops: f64,
    /// The phase of `raw` it comes from.
    pub phase: String,
}

/// The bf16 GEMM rate a GPU holds at its power limit, by the share of the time its GEMMs run.
#[derive(Debug, Clone)]
pub struct PowerCap {
    /// Each source GPU's (GEMM share, TFLOPS) points, ascending in share, ending at (1, sustained).
    curves: Vec<Vec<(f64, f64)>>,
    /// Where the rate comes from.
    pub from: String,
}

impl PowerCap {
    fn new(rates: &[&SustainedRate], from: String) -> PowerCap {
        let curves = rates
            .iter()
            .map(|r| {
                let mut pts: Vec<(f64, f64)> = r.duty.iter().map(|d| (d.gemm_frac, d.bf16_tflops)).collect();
                pts.push((1.0, r.bf16_tflops));
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                pts
            })
            .collect();
        PowerCap { curves, from }
    }

    /// Back to back (GEMMs all the time).
    pub fn sustained_tflops(&self) -> f64 {
        self.tflops_at(1.0)
    }

    /// The rate when GEMMs run `gemm_frac` of the time: linear between measured shares, and no
    /// faster than the least-loaded measurement below them (nothing measured says how fast).
    pub fn tflops_at(&self, gemm_frac: f64) -> f64 {
        let at = |pts: &[(f64, f64)]| {
            let f = gemm_frac.clamp(pts[0].0, 1.0);
            let i = pts.iter().position(|p| p.0 >= f).unwrap_or(pts.len() - 1);
            if i == 0 {
                return pts[0].1;
            }
            let ((f0, r0), (f1, r1)) = (pts[i - 1], pts[i]);
            r0 + (r1 - r0) * (f - f0) / (f1 - f0)
        };
        self.curves.iter().map(|c| at(c)).sum::<f64>() / self.curves.len() as f64
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SustainedFile {
    gpu: Vec<SustainedRate>,
}

/// Parses and checks the rates file; `origin` names it in errors.
pub fn parse_rates(text: &str, origin: &str) -> Result<Vec<SustainedRate>> {
    let f: SustainedFile = toml::from_str(text).map_err(|e| anyhow!("{origin}: {e}"))?;
    for (i, r) in f.gpu.iter().enumerate() {
        if !(r.bf16_tflops > 0.0 && r.bf16_tflops.is_finite()) {
            bail!("{origin}: gpu[{i}] field 'bf16_tflops' must be a positive number of TFLOP/s, got {}", r.bf16_tflops);
        }
        if builtin_spec(&r.id).is_none() {
            let known = builtin_specs()?;
            bail!("{origin}: gpu[{i}] field 'id' = '{}' is not a GPU in hw_specs/ (known: {})", r.id, known.iter().map(|s| s.id.as_str()).collect::<Vec<_>>().join(", "));
        }
        for (j, d) in r.duty.iter().enumerate() {
            if !(d.gemm_frac > 0.0 && d.gemm_frac < 1.0) {
                bail!("{origin}: gpu[{i}].duty[{j}] field 'gemm_frac' must be a share in (0, 1), got {}", d.gemm_frac);
            }
            if !(d.bf16_tflops >= r.bf16_tflops && d.bf16_tflops.is_finite()) {
                bail!("{origin}: gpu[{i}].duty[{j}] field 'bf16_tflops' must be a number of TFLOP/s no lower than the sustained {} (idle lowers the power drawn), got {}", r.bf16_tflops, d.bf16_tflops);
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
    if tier == Tier::Target {
        if let Some(r) = rates.iter().find(|r| r.id == gpu.id) {
            return Ok(Some(PowerCap::new(&[r], format!("{} measured", r.id))));
        }
    }
    let siblings: Vec<&SustainedRate> = rates
        .iter()
        .filter(|r| r.id != gpu.id && builtin_spec(&r.id).is_some_and(|s| s.same_compute_die(gpu)))
        .collect();
    if siblings.is_empty() {
        return Ok(None);
    }
    let from = siblings.iter().map(|r| r.id.as_str()).collect::<Vec<_>>().join(", ");
    Ok(Some(PowerCap::new(&siblings, format!("same die as {from}, measured there"))))
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

    #[test]
    fn each_sustained_rate_reproduces_from_its_raw_measurement() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for r in shipped_rates().unwrap() {
            let text = std::fs::read_to_string(root.join(&r.raw)).unwrap();
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            let tflop = v["tflop_per_step"].as_f64().unwrap();
            let tflops = |name: &str| {
                let phase = v["phases"].as_array().unwrap().iter().find(|p| p["phase"] == name).unwrap();
                let ms: Vec<f64> = phase["steps"].as_array().unwrap().iter().map(|s| s["ms"].as_f64().unwrap()).collect();
                tflop / crate::quantile::median(&ms) * 1e3
            };
            assert!((tflops("sustained") - r.bf16_tflops).abs() < 0.05, "{}: file says {}, {} gives {:.2}", r.id, r.bf16_tflops, r.raw, tflops("sustained"));
            for d in &r.duty {
                assert!((tflops(&d.phase) - d.bf16_tflops).abs() < 0.05, "{} {}: file says {}, raw gives {:.2}", r.id, d.phase, d.bf16_tflops, tflops(&d.phase));
                // The phase name says its GEMM share (dutyNN: NN % busy).
                assert_eq!(d.phase, format!("duty{}", (d.gemm_frac * 100.0).round()), "{}", r.id);
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
        assert_eq!(power_cap(&h100, Tier::CrossGen, &rates).unwrap().unwrap().sustained_tflops(), own("h200_sxm"));
        assert!(power_cap(&h100, Tier::Roofline, &rates).unwrap().is_none());
        // Another die (or power limit): nothing measured applies.
        for id in ["a100_sxm", "b200_sxm", "h100_pcie", "l40s"] {
            assert!(power_cap(&load_gpu(id).unwrap(), Tier::Target, &rates).unwrap().is_none(), "{id}");
        }
    }

    #[test]
    fn the_cap_relaxes_with_idle_between_the_gemms_only_as_far_as_measured() {
        let rates = shipped_rates().unwrap();
        let h100 = load_gpu("h100_sxm").unwrap();
        let cap = power_cap(&h100, Tier::Target, &rates).unwrap().unwrap();
        let own = rates.iter().find(|r| r.id == "h100_sxm").unwrap();
        let least = own.duty.iter().min_by(|a, b| a.gemm_frac.total_cmp(&b.gemm_frac)).expect("the H100 ran a duty-cycle phase");
        assert_eq!(cap.tflops_at(1.0), own.bf16_tflops);
        assert!((cap.tflops_at(least.gemm_frac) - least.bf16_tflops).abs() < 1e-9);
        // Between the measured shares: in between; below them: no faster than the least-loaded one.
        let mid = cap.tflops_at((1.0 + least.gemm_frac) / 2.0);
        assert!(mid > own.bf16_tflops && mid < least.bf16_tflops, "{mid}");
        assert_eq!(cap.tflops_at(0.05), least.bf16_tflops);
        let e = parse_rates("[[gpu]]\nid = \"h100_sxm\"\nbf16_tflops = 600\nraw = \"x\"\nnote = \"y\"\n[[gpu.duty]]\ngemm_frac = 0.6\nbf16_tflops = 500\nphase = \"duty60\"\n", "f.toml").unwrap_err().to_string();
        assert!(e.contains("gpu[0].duty[0]") && e.contains("bf16_tflops"), "{e}");
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

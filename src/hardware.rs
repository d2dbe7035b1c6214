//! GPU spec sheets: loading, validation and peak-rate lookup. Specs ship embedded in the binary
//! (`hw_specs/*.toml`); a path on disk overrides them.

use crate::schema::Dtype;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Dense (no sparsity) peak rates in TFLOP/s (TOP/s for int8). `None` = not supported natively.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PeakRates {
    pub fp32_tflops: f64,
    pub tf32_tflops: Option<f64>,
    pub bf16_tflops: f64,
    pub fp16_tflops: f64,
    pub fp8_tflops: Option<f64>,
    pub int8_tops: Option<f64>,
    pub fp4_tflops: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Memory {
    pub hbm_gb: f64,
    pub hbm_bandwidth_tbps: f64,
    pub l2_mb: f64,
    /// DRAM technology: HBM stacks or GDDR chips (whose cards keep their DRAM in the `hbm_*`
    /// fields). Streaming kernels reach different fractions of the two kinds' spec bandwidth.
    #[serde(default)]
    pub dram: DramKind,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum DramKind {
    #[default]
    Hbm,
    Gddr,
}

impl DramKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DramKind::Hbm => "hbm",
            DramKind::Gddr => "gddr",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Compute {
    pub sm_count: u32,
    pub boost_clock_mhz: f64,
    pub smem_per_sm_kb: f64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    Nvlink,
    Xgmi,
    Pcie,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Interconnect {
    pub scaleup_kind: LinkKind,
    /// Scale-up bandwidth per GPU, one direction, GB/s (NVLink/xGMI; PCIe boxes repeat PCIe).
    pub scaleup_gbps_per_dir: f64,
    pub gpus_per_node: u32,
    /// Host PCIe bandwidth per GPU, one direction, GB/s.
    pub pcie_gbps_per_dir: f64,
    /// Scale-out network bandwidth per GPU, one direction, GB/s: one NIC per GPU, so a node's
    /// GPUs together drive `gpus_per_node` of them.
    pub scaleout_gbps_per_dir: f64,
    /// NVLink bridge joining a pair of this GPU's PCIe cards, one direction, GB/s, where the
    /// GPU has a PCIe variant with one (A100 and H100: 600 GB/s bidirectional). Measured
    /// "pairwise NVLink" nodes run on it, not on the SXM board's NVSwitch rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_bridge_gbps_per_dir: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    pub id: String,
    pub name: String,
    pub vendor: String,
    pub arch: String,
    pub tdp_w: f64,
    /// Optional on-demand price per GPU-hour (USD), for capacity planning.
    #[serde(default)]
    pub price_usd_per_hour: Option<f64>,
    pub peak: PeakRates,
    pub memory: Memory,
    pub compute: Compute,
    pub interconnect: Interconnect,
    /// Where each figure comes from: section or field name -> datasheet/measurement note.
    pub sources: BTreeMap<String, String>,
}

impl GpuSpec {
    /// The same compute die at the same clock and power limit: architecture, SM count, boost
    /// clock, dense peak rates and TDP equal (H100 SXM and H200: only their memory differs;
    /// A100 PCIe's 300 W against SXM's 400 W is not). A kernel library one runs, the other
    /// does, at the same compute speed.
    pub fn same_compute_die(&self, other: &GpuSpec) -> bool {
        self.arch == other.arch
            && self.tdp_w == other.tdp_w
            && self.compute.sm_count == other.compute.sm_count
            && self.compute.boost_clock_mhz == other.compute.boost_clock_mhz
            && self.peak.bf16_tflops == other.peak.bf16_tflops
            && self.peak.fp8_tflops == other.peak.fp8_tflops
            && self.vendor == other.vendor
    }

    /// HBM capacity in bytes. Datasheet "GB" capacities are binary (H200's 141 GB is
    /// 141 GiB = 151.4e9 bytes, as nvidia-smi and aiconfigurator's specs show).
    pub fn hbm_bytes(&self) -> f64 {
        self.memory.hbm_gb * (1u64 << 30) as f64
    }
    pub fn hbm_bytes_per_s(&self) -> f64 {
        self.memory.hbm_bandwidth_tbps * 1e12
    }
    /// L2 size in bytes (datasheet "MB" of cache are MiB).
    pub fn l2_bytes(&self) -> f64 {
        self.memory.l2_mb * (1u64 << 20) as f64
    }
    pub fn scaleup_bytes_per_s(&self) -> f64 {
        self.interconnect.scaleup_gbps_per_dir * 1e9
    }

    /// The dtype a matmul in `dtype` actually runs in on this GPU: formats without native
    /// tensor-core support run in a wider supported one (e.g. fp8 on A100 runs in bf16). 4-bit
    /// weights without fp4 tensor cores run weight-only, upcast to bf16 math (Marlin, AWQ/GPTQ,
    /// triton `matmul_ogs`; TensorRT-LLM's gpt-oss support matrix: Hopper = mxfp4 weights with
    /// bf16 activations), not in fp8.
    pub fn effective_compute_dtype(&self, dtype: Dtype) -> Dtype {
        match dtype {
            Dtype::Fp4 | Dtype::Int4 if self.peak.fp4_tflops.is_some() => Dtype::Fp4,
            Dtype::Fp4 | Dtype::Int4 => Dtype::Bf16,
            Dtype::Fp8 if self.peak.fp8_tflops.is_some() => Dtype::Fp8,
            Dtype::Fp8 => Dtype::Bf16,
            Dtype::Int8 if self.peak.int8_tops.is_some() => Dtype::Int8,
            Dtype::Int8 => Dtype::Bf16,
            Dtype::Tf32 if self.peak.tf32_tflops.is_none() => Dtype::Fp32,
            d => d,
        }
    }

    /// Dense peak FLOP/s for a matmul in `dtype` (after `effective_compute_dtype`).
    pub fn peak_flops(&self, dtype: Dtype) -> f64 {
        let p = &self.peak;
        let tflops = match self.effective_compute_dtype(dtype) {
            Dtype::Fp32 => p.fp32_tflops,
            Dtype::Tf32 => p.tf32_tflops.unwrap_or(p.fp32_tflops),
            Dtype::Bf16 => p.bf16_tflops,
            Dtype::Fp16 => p.fp16_tflops,
            Dtype::Fp8 => p.fp8_tflops.unwrap_or(p.bf16_tflops),
            Dtype::Int8 => p.int8_tops.unwrap_or(p.bf16_tflops),
            Dtype::Fp4 | Dtype::Int4 => p.fp4_tflops.unwrap_or(p.bf16_tflops),
        };
        tflops * 1e12
    }

    /// Dense peak in TFLOP/s (TOP/s for int8) of the format itself, without falling back to a
    /// wider one: `None` where the spec sheet lists no native support (int4 is never listed).
    pub fn native_peak_tflops(&self, dtype: Dtype) -> Option<f64> {
        let p = &self.peak;
        match dtype {
            Dtype::Fp32 => Some(p.fp32_tflops),
            Dtype::Tf32 => p.tf32_tflops,
            Dtype::Bf16 => Some(p.bf16_tflops),
            Dtype::Fp16 => Some(p.fp16_tflops),
            Dtype::Fp8 => p.fp8_tflops,
            Dtype::Int8 => p.int8_tops,
            Dtype::Fp4 => p.fp4_tflops,
            Dtype::Int4 => None,
        }
    }

    /// Ridge point (FLOP per byte) where compute and memory bounds meet.
    pub fn ridge_flops_per_byte(&self, dtype: Dtype) -> f64 {
        self.peak_flops(dtype) / self.hbm_bytes_per_s()
    }

    fn validate(&self, origin: &str) -> Result<()> {
        let positive = [
            ("peak.fp32_tflops", self.peak.fp32_tflops),
            ("peak.bf16_tflops", self.peak.bf16_tflops),
            ("peak.fp16_tflops", self.peak.fp16_tflops),
            ("memory.hbm_gb", self.memory.hbm_gb),
            ("memory.hbm_bandwidth_tbps", self.memory.hbm_bandwidth_tbps),
            ("memory.l2_mb", self.memory.l2_mb),
            ("compute.boost_clock_mhz", self.compute.boost_clock_mhz),
            ("compute.smem_per_sm_kb", self.compute.smem_per_sm_kb),
            ("interconnect.scaleup_gbps_per_dir", self.interconnect.scaleup_gbps_per_dir),
            ("interconnect.pcie_gbps_per_dir", self.interconnect.pcie_gbps_per_dir),
            ("interconnect.scaleout_gbps_per_dir", self.interconnect.scaleout_gbps_per_dir),
            ("tdp_w", self.tdp_w),
        ];
        for (field, v) in positive {
            if !(v > 0.0) || !v.is_finite() {
                bail!("{origin}: field '{field}' must be a positive number, got {v}");
            }
        }
        let optional = [
            ("peak.tf32_tflops", self.peak.tf32_tflops),
            ("peak.fp8_tflops", self.peak.fp8_tflops),
            ("peak.int8_tops", self.peak.int8_tops),
            ("peak.fp4_tflops", self.peak.fp4_tflops),
            ("price_usd_per_hour", self.price_usd_per_hour),
            ("interconnect.nvlink_bridge_gbps_per_dir", self.interconnect.nvlink_bridge_gbps_per_dir),
        ];
        for (field, v) in optional {
            if let Some(v) = v {
                if !(v > 0.0) || !v.is_finite() {
                    bail!("{origin}: field '{field}' must be positive when given, got {v}");
                }
            }
        }
        if self.compute.sm_count == 0 {
            bail!("{origin}: field 'compute.sm_count' must be > 0");
        }
        if self.interconnect.gpus_per_node == 0 {
            bail!("{origin}: field 'interconnect.gpus_per_node' must be > 0");
        }
        if self.sources.is_empty() {
            bail!("{origin}: table 'sources' must say where the figures come from");
        }
        Ok(())
    }
}

/// Parses and validates one spec TOML; `origin` names the file in errors.
pub fn parse_spec(text: &str, origin: &str) -> Result<GpuSpec> {
    let spec: GpuSpec = toml::from_str(text).map_err(|e| anyhow!("{origin}: {e}"))?;
    spec.validate(origin)?;
    Ok(spec)
}

include!(concat!(env!("OUT_DIR"), "/embedded_hw_specs.rs"));

/// All embedded GPU specs, sorted by id.
pub fn builtin_specs() -> Result<Vec<GpuSpec>> {
    let mut v = Vec::new();
    for (file, text) in EMBEDDED_HW_SPECS {
        let spec = parse_spec(text, &format!("hw_specs/{file}"))?;
        let stem = file.trim_end_matches(".toml");
        if spec.id != stem {
            bail!("hw_specs/{file}: field 'id' = '{}' must match the file name '{stem}'", spec.id);
        }
        v.push(spec);
    }
    v.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(v)
}

/// The embedded spec of GPU `id`, parsed once per process; None for an id with no embedded spec.
pub fn builtin_spec(id: &str) -> Option<&'static GpuSpec> {
    static SPECS: std::sync::OnceLock<Vec<GpuSpec>> = std::sync::OnceLock::new();
    // The embedded specs are checked by `builtin_specs` at every other entry point (and its tests).
    SPECS.get_or_init(|| builtin_specs().unwrap_or_default()).iter().find(|s| s.id == id)
}

/// Looks a GPU up by embedded id, or loads it from a `.toml` path.
pub fn load_gpu(id_or_path: &str) -> Result<GpuSpec> {
    if id_or_path.ends_with(".toml") || Path::new(id_or_path).is_file() {
        let text = std::fs::read_to_string(id_or_path)
            .with_context(|| format!("reading GPU spec {id_or_path}"))?;
        return parse_spec(&text, id_or_path);
    }
    let specs = builtin_specs()?;
    let wanted = id_or_path.to_ascii_lowercase();
    specs.iter().find(|s| s.id == wanted).cloned().ok_or_else(|| {
        anyhow!(
            "unknown GPU '{id_or_path}'; known: {} (or give a path to a .toml spec)",
            specs.iter().map(|s| s.id.as_str()).collect::<Vec<_>>().join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_gpu_lists_known_ones() {
        let err = load_gpu("h900").unwrap_err().to_string();
        assert!(err.contains("unknown GPU 'h900'") && err.contains("h200_sxm"), "{err}");
    }

    #[test]
    fn missing_and_negative_fields_are_named() {
        let good = EMBEDDED_HW_SPECS.iter().find(|(f, _)| *f == "h200_sxm.toml").unwrap().1;
        let bad = good.replace("hbm_bandwidth_tbps = ", "hbm_bandwidth_tbps = -");
        let err = parse_spec(&bad, "x.toml").unwrap_err().to_string();
        assert!(err.contains("x.toml") && err.contains("memory.hbm_bandwidth_tbps"), "{err}");
        let missing: String = good.lines().filter(|l| !l.starts_with("sm_count")).collect::<Vec<_>>().join("\n");
        let err = parse_spec(&missing, "y.toml").unwrap_err().to_string();
        assert!(err.contains("y.toml") && err.contains("sm_count"), "{err}");
    }

    #[test]
    fn fp8_falls_back_to_bf16_without_native_support() {
        let mut g = load_gpu("h200_sxm").unwrap();
        assert!(g.peak_flops(Dtype::Fp8) > 1.9 * g.peak_flops(Dtype::Bf16));
        g.peak.fp8_tflops = None;
        assert_eq!(g.peak_flops(Dtype::Fp8), g.peak_flops(Dtype::Bf16));
    }
}

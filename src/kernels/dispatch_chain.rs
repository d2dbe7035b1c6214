//! The small ops of a DeepSeek MLA module (two RMSNorms and the rotary embedding) as vLLM runs
//! them without its custom kernels: each norm as 8 torch kernels (`vllm/ir/ops/layernorm.py`:
//! to fp32, pow, mean, add eps, rsqrt, mul, to bf16, mul weight) instead of one, the GPT-J
//! rotary of q_pe and k_pe as 14 (cos/sin gather and repeat, per tensor a mul, neg, stack, mul
//! and add, the copy back into q) instead of one: 30 kernels against 3 (torch.profiler's count).
//!
//! aiconfigurator's older module tables time that native chain; its re-collected B200 tables
//! (`/norm_vllm_c_eager_surrogate`) time the fused kernels, so the same module differs by the
//! chain's extra time. `extra_us` prices that difference on any GPU: a launch floor per extra
//! kernel plus the extra DRAM traffic at a streaming efficiency, both fitted on the H200
//! (`microbench/mla_dispatch_chain.py`, committed rows embedded below).
use crate::hardware::GpuSpec;
use crate::kernels::cost::MlaModule;
use crate::schema::{Kernel, Op};
use std::sync::OnceLock;

/// Kernels the native chain runs beyond the fused one (30 - 3, counted by torch.profiler in
/// the measurement).
pub const EXTRA_KERNELS: f64 = 27.0;

/// Extra DRAM bytes per normalized element: the native norm reads and writes its row six times
/// more in fp32 / bf16 (to fp32 2+4, pow 4+4, mean 4, mul 4+4, to bf16 4+2, mul weight 2+2 = 36
/// bytes) where the fused kernel reads and writes it once (2+2).
const NORM_EXTRA_BYTES_PER_ELEMENT: f64 = 32.0;

/// Extra DRAM bytes per rotated bf16 element of q_pe or k_pe: x * cos (2+2), neg (1+1 over
/// half), stack (2+2), * sin (2+2), add (4+2), copy back (2+2) = 24, against 4 fused.
const ROPE_EXTRA_BYTES_PER_ELEMENT: f64 = 20.0;

const H200_MEASUREMENT: &str = include_str!("../../microbench/data/h200_sxm/h200_sxm_mla_dispatch_chain.csv");

/// `extra_us = EXTRA_KERNELS * launch_us + extra_bytes / (DRAM bandwidth * dram_efficiency)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChainFit {
    pub launch_us: f64,
    pub dram_efficiency: f64,
}

/// Tokens the module's norms and rotary run over, and its heads on this GPU.
fn tokens_and_heads(k: &Kernel) -> (f64, f64) {
    let tokens = if k.op == Op::MlaDecode { k.batch } else { k.batch * k.seq_len.max(1) };
    (tokens as f64, k.num_heads as f64)
}

/// Extra DRAM bytes of the native chain over the fused kernels for `tokens` and `heads`.
pub fn extra_bytes(module: &MlaModule, tokens: f64, heads: f64) -> f64 {
    let norm = tokens * (module.q_lora_rank + module.kv_lora_rank) as f64 * NORM_EXTRA_BYTES_PER_ELEMENT;
    let rope = tokens * (heads + 1.0) * module.qk_rope_head_dim as f64 * ROPE_EXTRA_BYTES_PER_ELEMENT;
    norm + rope
}

impl ChainFit {
    /// Least squares in relative error of `extra_us` over `(tokens, heads, native_us -
    /// fused_us)` points measured on `gpu`.
    pub fn fit(points: &[(f64, f64, f64)], gpu: &GpuSpec) -> Option<ChainFit> {
        // extra = a + b * x with x = bytes / bandwidth (us); weights 1 / extra.
        let (mut s11, mut s12, mut s22, mut r1, mut r2) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for &(tokens, heads, extra) in points.iter().filter(|p| p.2 > 0.0) {
            let x = extra_bytes(&MlaModule::DEEPSEEK_V3, tokens, heads) / gpu.hbm_bytes_per_s() * 1e6;
            let w = 1.0 / (extra * extra);
            s11 += w;
            s12 += w * x;
            s22 += w * x * x;
            r1 += w * extra;
            r2 += w * x * extra;
        }
        let det = s11 * s22 - s12 * s12;
        if det.abs() < 1e-30 {
            return None;
        }
        let a = (r1 * s22 - r2 * s12) / det;
        let b = (s11 * r2 - s12 * r1) / det;
        (a > 0.0 && b > 0.0).then(|| ChainFit { launch_us: a / EXTRA_KERNELS, dram_efficiency: 1.0 / b })
    }

    /// The fit on the committed H200 measurement.
    pub fn h200() -> ChainFit {
        static FIT: OnceLock<ChainFit> = OnceLock::new();
        *FIT.get_or_init(|| {
            let gpu = crate::hardware::load_gpu("h200_sxm").expect("h200_sxm spec is embedded");
            ChainFit::fit(&measured_extra(H200_MEASUREMENT).expect("the embedded H200 chain CSV parses"), &gpu)
                .expect("the embedded H200 chain measurement fits")
        })
    }

    /// Extra time of the native chain over the fused kernels for module kernel `k` on `gpu`.
    pub fn extra_us(&self, k: &Kernel, gpu: &GpuSpec) -> f64 {
        let (tokens, heads) = tokens_and_heads(k);
        EXTRA_KERNELS * self.launch_us
            + extra_bytes(&MlaModule::DEEPSEEK_V3, tokens, heads) / (gpu.hbm_bytes_per_s() * self.dram_efficiency) * 1e6
    }
}

/// `(tokens, heads, native_us - fused_us)` from the collector's CSV (`tokens,heads,path,
/// latency_us,...`).
pub fn measured_extra(csv_text: &str) -> Result<Vec<(f64, f64, f64)>, String> {
    #[derive(serde::Deserialize)]
    struct Row {
        tokens: f64,
        heads: f64,
        path: String,
        latency_us: f64,
    }
    let mut native = std::collections::BTreeMap::new();
    let mut fused = std::collections::BTreeMap::new();
    for (i, r) in csv::Reader::from_reader(csv_text.as_bytes()).deserialize::<Row>().enumerate() {
        let r = r.map_err(|e| format!("mla dispatch chain CSV row {}: {e}", i + 2))?;
        let key = (r.tokens as u64, r.heads as u64);
        match r.path.as_str() {
            "native" => native.insert(key, r.latency_us),
            "fused" => fused.insert(key, r.latency_us),
            other => return Err(format!("mla dispatch chain CSV row {}: path `{other}`, allowed native, fused", i + 2)),
        };
    }
    Ok(native.iter().filter_map(|(&(t, h), n)| fused.get(&(t, h)).map(|f| (t as f64, h as f64, n - f))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::load_gpu;
    use crate::schema::Dtype;

    #[test]
    fn the_h200_fit_reproduces_its_measurement() {
        let g = load_gpu("h200_sxm").unwrap();
        let fit = ChainFit::h200();
        // A launch floor per graph-replayed tiny kernel and a streaming efficiency a torch
        // elementwise chain plausibly reaches.
        assert!((1.0..4.0).contains(&fit.launch_us), "{fit:?}");
        assert!((0.2..0.9).contains(&fit.dram_efficiency), "{fit:?}");
        let pts = measured_extra(H200_MEASUREMENT).unwrap();
        assert_eq!(pts.len(), 128);
        let mut apes: Vec<f64> = pts
            .iter()
            .map(|&(t, h, extra)| {
                let mut k = Kernel::new(Op::MlaDecode, Dtype::Bf16);
                (k.batch, k.num_heads) = (t as u64, h as u64);
                (fit.extra_us(&k, &g) / extra - 1.0).abs()
            })
            .collect();
        apes.sort_by(f64::total_cmp);
        assert!(apes[apes.len() / 2] < 0.10, "median APE {}", apes[apes.len() / 2]);
        assert!(apes[apes.len() - 1] < 0.35, "max APE {}", apes[apes.len() - 1]);
    }

    #[test]
    fn the_extra_time_is_launch_bound_at_decode_and_scales_with_tokens_heads_and_bandwidth() {
        let h200 = load_gpu("h200_sxm").unwrap();
        let b200 = load_gpu("b200_sxm").unwrap();
        let fit = ChainFit::h200();
        let mut k = Kernel::new(Op::MlaPrefill, Dtype::Bf16);
        (k.batch, k.seq_len, k.num_heads) = (1, 1, 1);
        let one = fit.extra_us(&k, &h200);
        assert!((one / (EXTRA_KERNELS * fit.launch_us) - 1.0).abs() < 0.01);
        (k.batch, k.seq_len, k.num_heads) = (4, 8192, 128);
        let big = fit.extra_us(&k, &h200);
        assert!(big > 50.0 * one, "{big} vs {one}");
        // Same launches, more bandwidth: B200's large chain is shorter.
        assert!(fit.extra_us(&k, &b200) < 0.75 * big);
    }

    #[test]
    fn a_bad_chain_csv_names_its_row_and_the_allowed_paths() {
        let e = measured_extra("tokens,heads,path,latency_us\n1,1,native,50\n1,1,eager,5\n").unwrap_err();
        assert!(e.contains("row 3") && e.contains("allowed native, fused"), "{e}");
    }
}

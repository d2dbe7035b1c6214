//! FLOPs and compulsory bytes of one FlashInfer-Trace definition + workload, per op type.
//!
//! Every op returns two counts: `lower`, valid for *any* input consistent with the workload's
//! axes (and with the op's documented invariants), which gives the hard SOL; and `nominal`, the
//! count under a stated typical assumption where the trace file lacks data (per-request lengths,
//! routing, sparse indices), which feeds the practical bound. Where the file has all the data the
//! two are equal. FLOPs are tensor-core FLOPs (multiply-add = 2) of the op's contractions;
//! bytes count each tensor moved to or from HBM once.

mod attention;
mod basic;
mod moe;
mod recurrent;

use super::bound::OpClass;
use super::trace::{dtype_bytes, Definition, Shape, Tensor, Workload};
use crate::schema::Dtype;
use anyhow::{bail, Result};
use serde::Serialize;

/// Op types this module knows, as spelled in `op_type`.
pub const SUPPORTED_OP_TYPES: [&str; 12] = [
    "gemm",
    "gqa_paged",
    "gqa_ragged",
    "mla_paged",
    "mla_ragged",
    "dsa_paged",
    "gdn",
    "mamba_ssu",
    "moe",
    "rmsnorm",
    "rope",
    "sampling",
];

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Counts {
    pub flops: f64,
    pub bytes: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkCost {
    pub class: OpClass,
    /// Format the contractions run in (the narrowest of their operands).
    pub compute_dtype: Dtype,
    pub lower: Counts,
    pub nominal: Counts,
    /// Assumptions and dtype overrides applied.
    pub notes: Vec<String>,
    /// Data the trace file lacks that an exact bound would need.
    pub missing: Vec<String>,
}

impl WorkCost {
    fn exact(class: OpClass, compute_dtype: Dtype, c: Counts) -> WorkCost {
        WorkCost { class, compute_dtype, lower: c, nominal: c, notes: vec![], missing: vec![] }
    }
}

/// Costs one definition + workload. Unknown op types list the supported ones.
pub fn cost(def: &Definition, shape: &Shape, w: &Workload) -> Result<WorkCost> {
    let ctx = Ctx { def, shape, w };
    let mut c = match def.op_type.as_str() {
        "gemm" => basic::gemm(&ctx)?,
        "rmsnorm" => basic::rmsnorm(&ctx)?,
        "rope" => basic::rope(&ctx)?,
        "sampling" => basic::sampling(&ctx)?,
        "gqa_paged" | "gqa_ragged" | "mla_paged" | "mla_ragged" => attention::dense(&ctx)?,
        "dsa_paged" => attention::dsa(&ctx)?,
        "gdn" => recurrent::gdn(&ctx)?,
        "mamba_ssu" => recurrent::mamba_ssu(&ctx)?,
        "moe" => moe::moe(&ctx)?,
        other => bail!(
            "definition '{}': unknown op_type '{other}'; supported: {}",
            def.name,
            SUPPORTED_OP_TYPES.join(", ")
        ),
    };
    // A typical assumption never undercuts the valid lower bound.
    c.nominal.flops = c.nominal.flops.max(c.lower.flops);
    c.nominal.bytes = c.nominal.bytes.max(c.lower.bytes);
    Ok(c)
}

/// What an op formula reads: the definition, the resolved axes and the workload.
struct Ctx<'a> {
    def: &'a Definition,
    shape: &'a Shape,
    w: &'a Workload,
}

impl Ctx<'_> {
    fn axis(&self, name: &str) -> Result<f64> {
        self.shape.get_f(name).map_err(|_| {
            anyhow::anyhow!("definition '{}' ({}) lacks axis '{name}'", self.def.name, self.def.op_type)
        })
    }

    fn tensor(&self, name: &str) -> Result<&Tensor> {
        self.def.tensor(name).ok_or_else(|| {
            anyhow::anyhow!("definition '{}' ({}) lacks tensor '{name}'", self.def.name, self.def.op_type)
        })
    }

    fn has(&self, name: &str) -> bool {
        self.def.tensor(name).is_some()
    }

    /// Bytes per element as stored: packed FP4 weights that a definition declares with a wider
    /// dtype (its `quantization:float4_*` tag says so) count at their real packed size.
    fn elem_bytes(&self, name: &str, t: &Tensor) -> f64 {
        let declared = dtype_bytes(&t.dtype).unwrap_or(0.0);
        match fp4_weight_bytes(self.def, name) {
            Some(b) if b < declared => b,
            _ => declared,
        }
    }

    fn bytes_of(&self, name: &str) -> Result<f64> {
        let t = self.tensor(name)?;
        Ok(self.shape.elems(t) * self.elem_bytes(name, t))
    }

    /// Bytes of every input and output read or written in full, except `skip`.
    fn io_bytes_except(&self, skip: &[&str]) -> f64 {
        self.def
            .inputs
            .iter()
            .chain(self.def.outputs.iter())
            .filter(|(n, _)| !skip.contains(&n.as_str()))
            .map(|(n, t)| self.shape.elems(t) * self.elem_bytes(n, t))
            .sum()
    }

    /// Dtype of a tensor in the schema's terms (for the tensor-core peak).
    fn dtype(&self, name: &str) -> Result<Dtype> {
        let t = self.tensor(name)?;
        if fp4_weight_bytes(self.def, name).is_some() {
            return Ok(Dtype::Fp4);
        }
        trace_dtype(&t.dtype)
    }

    /// A `missing` entry: which inputs an exact bound needs and why.
    fn missing(&self, inputs: &[&str], why: &str) -> String {
        let in_blob = inputs.iter().any(|i| self.w.blob_inputs.iter().any(|b| b == i));
        let place = if in_blob {
            "kept in a safetensors blob the trace file does not include"
        } else {
            "values not in the trace file"
        };
        format!("{}: {why} ({place})", inputs.join(", "))
    }
}

/// Real bytes per element of a weight tensor that the definition declares wider than the
/// packed FP4 format its quantization tag names (MXFP4: 4 bits + one 8-bit scale per 32
/// elements; NVFP4: one 8-bit scale per 16).
fn fp4_weight_bytes(def: &Definition, name: &str) -> Option<f64> {
    let q = def.tag_value("quantization")?;
    if !q.starts_with("float4") || !name.ends_with("weights") {
        return None;
    }
    Some(if q.contains("mxfp4") {
        0.5 + 1.0 / 32.0
    } else if q.contains("nvfp4") {
        0.5 + 1.0 / 16.0
    } else {
        0.5
    })
}

/// Maps a FlashInfer-Trace dtype to the schema's dtype.
pub fn trace_dtype(d: &str) -> Result<Dtype> {
    Ok(match d {
        "float32" | "float64" => Dtype::Fp32,
        "float16" => Dtype::Fp16,
        "bfloat16" => Dtype::Bf16,
        s if s.starts_with("float8") => Dtype::Fp8,
        "int8" | "uint8" => Dtype::Int8,
        s if s.starts_with("float4") => Dtype::Fp4,
        other => bail!("dtype '{other}' has no tensor-core format"),
    })
}

/// The narrower of two formats (the faster tensor-core path, so the bound stays a lower bound).
fn narrowest(a: Dtype, b: Dtype) -> Dtype {
    if b.bytes() < a.bytes() {
        b
    } else {
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_op_type_lists_supported() {
        let d = Definition::from_value(
            &json!({"name":"c","op_type":"conv2d","axes":{},"inputs":{},"outputs":{}}),
            "c.json",
        )
        .unwrap();
        let w = Workload::from_value(&json!({}), "w").unwrap();
        let s = d.resolve(&w, "w").unwrap();
        let e = cost(&d, &s, &w).unwrap_err().to_string();
        assert!(e.contains("'conv2d'") && e.contains("gemm, gqa_paged") && e.contains("sampling"), "{e}");
    }
}

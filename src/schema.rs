//! The one kernel-shape schema shared by the collector, the importers, batch prediction and
//! validation (see `docs/ARCHITECTURE.md`). A row names an op, a dtype and the shape fields that
//! op uses; unused fields are empty in CSV and zero in memory.

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Numeric formats. `bytes()` is the storage size of one element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Fp32,
    Tf32,
    Bf16,
    Fp16,
    Fp8,
    Int8,
    Fp4,
    Int4,
}

impl Dtype {
    pub const ALL: [Dtype; 8] = [
        Dtype::Fp32,
        Dtype::Tf32,
        Dtype::Bf16,
        Dtype::Fp16,
        Dtype::Fp8,
        Dtype::Int8,
        Dtype::Fp4,
        Dtype::Int4,
    ];

    pub fn bytes(self) -> f64 {
        match self {
            Dtype::Fp32 | Dtype::Tf32 => 4.0,
            Dtype::Bf16 | Dtype::Fp16 => 2.0,
            Dtype::Fp8 | Dtype::Int8 => 1.0,
            Dtype::Fp4 | Dtype::Int4 => 0.5,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::Fp32 => "fp32",
            Dtype::Tf32 => "tf32",
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
            Dtype::Fp8 => "fp8",
            Dtype::Int8 => "int8",
            Dtype::Fp4 => "fp4",
            Dtype::Int4 => "int4",
        }
    }

    /// Quantized formats whose matmul output is written in bf16.
    pub fn is_quantized(self) -> bool {
        matches!(self, Dtype::Fp8 | Dtype::Int8 | Dtype::Fp4 | Dtype::Int4)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Dtype {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let lower = s.trim().to_ascii_lowercase();
        let d = match lower.as_str() {
            "fp32" | "float32" | "float" => Dtype::Fp32,
            "tf32" => Dtype::Tf32,
            "bf16" | "bfloat16" => Dtype::Bf16,
            "fp16" | "float16" | "half" => Dtype::Fp16,
            "fp8" | "float8_e4m3fn" | "e4m3" | "fp8_e4m3" => Dtype::Fp8,
            "int8" => Dtype::Int8,
            "fp4" | "nvfp4" | "mxfp4" => Dtype::Fp4,
            "int4" => Dtype::Int4,
            _ => bail!(
                "unknown dtype '{s}'; allowed: {}",
                Dtype::ALL.map(|d| d.as_str()).join(", ")
            ),
        };
        Ok(d)
    }
}

/// Kernel operation kinds. Collectives are ops like any other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Gemm,
    AttnPrefill,
    AttnDecode,
    MlaPrefill,
    MlaDecode,
    LinearAttn,
    Moe,
    MoeRouter,
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    P2p,
    Rmsnorm,
    FusedAddRmsnorm,
    SiluMul,
    Rope,
    Add,
    Embedding,
    Sampling,
    Copy,
}

impl Op {
    pub const ALL: [Op; 21] = [
        Op::Gemm,
        Op::AttnPrefill,
        Op::AttnDecode,
        Op::MlaPrefill,
        Op::MlaDecode,
        Op::LinearAttn,
        Op::Moe,
        Op::MoeRouter,
        Op::AllReduce,
        Op::AllGather,
        Op::ReduceScatter,
        Op::AllToAll,
        Op::P2p,
        Op::Rmsnorm,
        Op::FusedAddRmsnorm,
        Op::SiluMul,
        Op::Rope,
        Op::Add,
        Op::Embedding,
        Op::Sampling,
        Op::Copy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Op::Gemm => "gemm",
            Op::AttnPrefill => "attn_prefill",
            Op::AttnDecode => "attn_decode",
            Op::MlaPrefill => "mla_prefill",
            Op::MlaDecode => "mla_decode",
            Op::LinearAttn => "linear_attn",
            Op::Moe => "moe",
            Op::MoeRouter => "moe_router",
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllToAll => "all_to_all",
            Op::P2p => "p2p",
            Op::Rmsnorm => "rmsnorm",
            Op::FusedAddRmsnorm => "fused_add_rmsnorm",
            Op::SiluMul => "silu_mul",
            Op::Rope => "rope",
            Op::Add => "add",
            Op::Embedding => "embedding",
            Op::Sampling => "sampling",
            Op::Copy => "copy",
        }
    }

    pub fn is_collective(self) -> bool {
        matches!(
            self,
            Op::AllReduce | Op::AllGather | Op::ReduceScatter | Op::AllToAll | Op::P2p
        )
    }

    pub fn is_elementwise(self) -> bool {
        matches!(
            self,
            Op::Rmsnorm
                | Op::FusedAddRmsnorm
                | Op::SiluMul
                | Op::Rope
                | Op::Add
                | Op::Embedding
                | Op::Sampling
                | Op::Copy
                | Op::MoeRouter
        )
    }

    /// Coarse class used for step-time breakdowns.
    pub fn class(self) -> &'static str {
        match self {
            Op::Gemm => "gemm",
            Op::AttnPrefill | Op::AttnDecode | Op::MlaPrefill | Op::MlaDecode | Op::LinearAttn => {
                "attention"
            }
            Op::Moe | Op::MoeRouter => "moe",
            o if o.is_collective() => "communication",
            _ => "elementwise",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Op {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim().to_ascii_lowercase();
        let alias = match t.as_str() {
            "alltoall" => "all_to_all",
            "allreduce" => "all_reduce",
            "allgather" => "all_gather",
            "reducescatter" => "reduce_scatter",
            "send_recv" | "sendrecv" => "p2p",
            other => other,
        };
        Op::ALL.iter().copied().find(|o| o.as_str() == alias).ok_or_else(|| {
            anyhow!(
                "unknown op '{s}'; allowed: {}",
                Op::ALL.map(|o| o.as_str()).join(", ")
            )
        })
    }
}

/// One kernel: op, dtype and shape. Fields an op does not use stay 0.
/// Field meanings per op are in `docs/ARCHITECTURE.md` and `kernels::cost`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Kernel {
    pub op: Op,
    pub dtype: Dtype,
    /// GEMM rows (tokens).
    pub m: u64,
    /// GEMM output features.
    pub n: u64,
    /// GEMM input features.
    pub k: u64,
    pub batch: u64,
    /// New (query) tokens per sequence for prefill attention.
    pub seq_len: u64,
    /// KV tokens attended per sequence (decode), or cached prefix tokens (prefill).
    pub kv_len: u64,
    pub num_heads: u64,
    pub num_kv_heads: u64,
    pub head_dim: u64,
    pub num_tokens: u64,
    pub hidden: u64,
    pub inter: u64,
    pub topk: u64,
    pub num_experts: u64,
    pub tp: u64,
    pub ep: u64,
    pub num_gpus: u64,
    /// Message size for collectives (nccl-tests convention), bytes copied for `copy`.
    pub bytes: u64,
    /// Sliding-window size in tokens for attention (0 = full attention).
    pub window: u64,
    /// KV-cache dtype for attention kernels (None = same as `dtype`).
    pub kv_dtype: Option<Dtype>,
}

impl Kernel {
    pub fn new(op: Op, dtype: Dtype) -> Self {
        Kernel {
            op,
            dtype,
            m: 0,
            n: 0,
            k: 0,
            batch: 0,
            seq_len: 0,
            kv_len: 0,
            num_heads: 0,
            num_kv_heads: 0,
            head_dim: 0,
            num_tokens: 0,
            hidden: 0,
            inter: 0,
            topk: 0,
            num_experts: 0,
            tp: 0,
            ep: 0,
            num_gpus: 0,
            bytes: 0,
            window: 0,
            kv_dtype: None,
        }
    }

    pub fn gemm(dtype: Dtype, m: u64, n: u64, k: u64) -> Self {
        Kernel { m, n, k, ..Kernel::new(Op::Gemm, dtype) }
    }

    pub fn kv_dtype(&self) -> Dtype {
        self.kv_dtype.unwrap_or(self.dtype)
    }

    /// Short human-readable shape, e.g. `m=4096 n=4096 k=4096`.
    pub fn shape_string(&self) -> String {
        let mut parts = Vec::new();
        for (name, v) in self.numeric_fields() {
            if v != 0 {
                parts.push(format!("{name}={v}"));
            }
        }
        if let Some(kd) = self.kv_dtype {
            if kd != self.dtype {
                parts.push(format!("kv={kd}"));
            }
        }
        parts.join(" ")
    }

    pub fn numeric_fields(&self) -> [(&'static str, u64); 19] {
        [
            ("m", self.m),
            ("n", self.n),
            ("k", self.k),
            ("batch", self.batch),
            ("seq_len", self.seq_len),
            ("kv_len", self.kv_len),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("num_tokens", self.num_tokens),
            ("hidden", self.hidden),
            ("inter", self.inter),
            ("topk", self.topk),
            ("num_experts", self.num_experts),
            ("tp", self.tp),
            ("ep", self.ep),
            ("num_gpus", self.num_gpus),
            ("bytes", self.bytes),
            ("window", self.window),
        ]
    }

    fn field_mut(&mut self, name: &str) -> Option<&mut u64> {
        Some(match name {
            "m" => &mut self.m,
            "n" => &mut self.n,
            "k" => &mut self.k,
            "batch" => &mut self.batch,
            "seq_len" => &mut self.seq_len,
            "kv_len" => &mut self.kv_len,
            "num_heads" => &mut self.num_heads,
            "num_kv_heads" => &mut self.num_kv_heads,
            "head_dim" => &mut self.head_dim,
            "num_tokens" => &mut self.num_tokens,
            "hidden" => &mut self.hidden,
            "inter" => &mut self.inter,
            "topk" => &mut self.topk,
            "num_experts" => &mut self.num_experts,
            "tp" => &mut self.tp,
            "ep" => &mut self.ep,
            "num_gpus" => &mut self.num_gpus,
            "bytes" => &mut self.bytes,
            "window" => &mut self.window,
            _ => return None,
        })
    }

    /// The fields each op needs to be well defined (nonzero).
    pub fn required_fields(op: Op) -> &'static [&'static str] {
        match op {
            Op::Gemm => &["m", "n", "k"],
            Op::AttnPrefill | Op::MlaPrefill => {
                &["batch", "seq_len", "num_heads", "num_kv_heads", "head_dim"]
            }
            Op::AttnDecode | Op::MlaDecode => {
                &["batch", "kv_len", "num_heads", "num_kv_heads", "head_dim"]
            }
            Op::LinearAttn => &["num_tokens", "num_heads", "num_kv_heads", "head_dim"],
            Op::Moe => &["num_tokens", "hidden", "inter", "topk", "num_experts"],
            Op::MoeRouter => &["num_tokens", "hidden", "num_experts"],
            Op::AllReduce | Op::AllGather | Op::ReduceScatter | Op::AllToAll | Op::P2p => {
                &["bytes", "num_gpus"]
            }
            Op::Rope => &["num_tokens", "num_heads", "head_dim"],
            Op::Copy => &["bytes"],
            _ => &["num_tokens", "hidden"],
        }
    }

    /// Checks that the fields this op needs are present and consistent.
    pub fn validate(&self) -> Result<()> {
        for f in Kernel::required_fields(self.op) {
            let v = self.numeric_fields().iter().find(|(n, _)| n == f).map(|x| x.1).unwrap_or(0);
            if v == 0 {
                bail!(
                    "op '{}' needs field '{f}' > 0 (required fields: {})",
                    self.op,
                    Kernel::required_fields(self.op).join(", ")
                );
            }
        }
        if self.num_kv_heads > 0 && self.num_heads > 0 && self.num_heads % self.num_kv_heads != 0
        {
            bail!(
                "num_heads ({}) must be a multiple of num_kv_heads ({})",
                self.num_heads,
                self.num_kv_heads
            );
        }
        if self.op == Op::Moe && self.topk > self.num_experts {
            bail!("topk ({}) exceeds num_experts ({})", self.topk, self.num_experts);
        }
        Ok(())
    }
}

/// Column order of the shared CSV schema (shape part).
pub const SHAPE_COLUMNS: [&str; 22] = [
    "op",
    "dtype",
    "m",
    "n",
    "k",
    "batch",
    "seq_len",
    "kv_len",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "num_tokens",
    "hidden",
    "inter",
    "topk",
    "num_experts",
    "tp",
    "ep",
    "num_gpus",
    "bytes",
    "window",
    "kv_dtype",
];

/// A CSV row in the shared schema: the kernel, optional measurement and provenance, and any
/// other columns passed through untouched (in input order).
#[derive(Debug, Clone, PartialEq)]
pub struct KernelRow {
    pub kernel: Kernel,
    pub latency_us: Option<f64>,
    pub gpu: Option<String>,
    pub source: Option<String>,
    pub backend: Option<String>,
    /// Columns not in the schema, kept for pass-through: (name, value).
    pub extra: Vec<(String, String)>,
}

impl KernelRow {
    pub fn new(kernel: Kernel) -> Self {
        KernelRow { kernel, latency_us: None, gpu: None, source: None, backend: None, extra: vec![] }
    }

    /// The value of pass-through column `name`, if the file has it.
    pub fn extra_value(&self, name: &str) -> Option<&str> {
        self.extra.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

const PROVENANCE_COLUMNS: [&str; 4] = ["latency_us", "gpu", "source", "backend"];

/// Reads a shared-schema CSV. Errors name the file, the line and the field.
pub fn read_rows(path: &std::path::Path) -> Result<Vec<KernelRow>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    read_rows_from(file, &path.display().to_string())
}

pub fn read_rows_from<R: std::io::Read>(reader: R, origin: &str) -> Result<Vec<KernelRow>> {
    let mut rdr = csv::ReaderBuilder::new().flexible(false).trim(csv::Trim::All).from_reader(reader);
    let headers = rdr.headers().with_context(|| format!("{origin}: reading header"))?.clone();
    let idx = |name: &str| headers.iter().position(|h| h == name);
    let op_i = idx("op").ok_or_else(|| anyhow!("{origin}: missing required column 'op'"))?;
    let dtype_i = idx("dtype");
    let mut rows = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let line = i + 2;
        let rec = rec.with_context(|| format!("{origin}: line {line}: malformed CSV record"))?;
        let op: Op = rec[op_i].parse().with_context(|| format!("{origin}: line {line}: field 'op'"))?;
        let dtype = match dtype_i.map(|j| &rec[j]) {
            Some(s) if !s.is_empty() => {
                s.parse().with_context(|| format!("{origin}: line {line}: field 'dtype'"))?
            }
            _ => Dtype::Bf16,
        };
        let mut kernel = Kernel::new(op, dtype);
        let mut row_extra = Vec::new();
        let mut latency_us = None;
        let (mut gpu, mut source, mut backend) = (None, None, None);
        for (j, name) in headers.iter().enumerate() {
            let val = &rec[j];
            if j == op_i || Some(j) == dtype_i {
                continue;
            }
            if name == "kv_dtype" {
                if !val.is_empty() {
                    kernel.kv_dtype = Some(
                        val.parse().with_context(|| format!("{origin}: line {line}: field 'kv_dtype'"))?,
                    );
                }
                continue;
            }
            if let Some(slot) = kernel.field_mut(name) {
                if val.is_empty() {
                    continue;
                }
                let parsed: f64 = val.parse().map_err(|_| {
                    anyhow!("{origin}: line {line}: field '{name}' = '{val}' is not a number")
                })?;
                if parsed < 0.0 || parsed.fract() != 0.0 {
                    bail!("{origin}: line {line}: field '{name}' = '{val}' must be a non-negative integer");
                }
                *slot = parsed as u64;
                continue;
            }
            match name {
                "latency_us" if !val.is_empty() => {
                    let v: f64 = val.parse().map_err(|_| {
                        anyhow!("{origin}: line {line}: field 'latency_us' = '{val}' is not a number")
                    })?;
                    if !(v > 0.0) || !v.is_finite() {
                        bail!("{origin}: line {line}: field 'latency_us' = '{val}' must be a positive time in microseconds");
                    }
                    latency_us = Some(v);
                }
                "latency_us" => {}
                "gpu" => gpu = non_empty(val),
                "source" => source = non_empty(val),
                "backend" => backend = non_empty(val),
                _ => row_extra.push((name.to_string(), val.to_string())),
            }
        }
        kernel.validate().with_context(|| format!("{origin}: line {line}"))?;
        rows.push(KernelRow { kernel, latency_us, gpu, source, backend, extra: row_extra });
    }
    Ok(rows)
}

fn non_empty(s: &str) -> Option<String> {
    if s.is_empty() {
        None
    } else {
        Some(s.to_string())
    }
}

/// Writes rows in the shared schema, with `extra_columns` appended (e.g. `sol_us`,
/// `predicted_us`), whose values come from `extra_values(row_index)`.
pub fn write_rows<W: std::io::Write>(
    writer: W,
    rows: &[KernelRow],
    extra_columns: &[&str],
    mut extra_values: impl FnMut(usize) -> Vec<String>,
) -> Result<()> {
    let mut w = csv::Writer::from_writer(writer);
    let pass_through: Vec<String> = rows
        .first()
        .map(|r| r.extra.iter().map(|(n, _)| n.clone()).collect())
        .unwrap_or_default();
    let mut header: Vec<String> = SHAPE_COLUMNS.iter().map(|s| s.to_string()).collect();
    header.extend(PROVENANCE_COLUMNS.iter().map(|s| s.to_string()));
    header.extend(pass_through.iter().cloned());
    header.extend(extra_columns.iter().map(|s| s.to_string()));
    w.write_record(&header)?;
    for (i, r) in rows.iter().enumerate() {
        let k = &r.kernel;
        let mut rec: Vec<String> = vec![k.op.to_string(), k.dtype.to_string()];
        for (_, v) in k.numeric_fields() {
            rec.push(if v == 0 { String::new() } else { v.to_string() });
        }
        rec.push(k.kv_dtype.map(|d| d.to_string()).unwrap_or_default());
        rec.push(r.latency_us.map(|v| format!("{v:.4}")).unwrap_or_default());
        rec.push(r.gpu.clone().unwrap_or_default());
        rec.push(r.source.clone().unwrap_or_default());
        rec.push(r.backend.clone().unwrap_or_default());
        for name in &pass_through {
            rec.push(r.extra.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()).unwrap_or_default());
        }
        rec.extend(extra_values(i));
        w.write_record(&rec)?;
    }
    w.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_round_trip_keeps_fields_and_extras() {
        let csv = "op,dtype,m,n,k,latency_us,gpu,note\ngemm,bf16,128,4096,4096,12.5,h200_sxm,hello\n";
        let rows = read_rows_from(csv.as_bytes(), "t.csv").unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].kernel.m, 128);
        assert_eq!(rows[0].latency_us, Some(12.5));
        assert_eq!(rows[0].extra, vec![("note".to_string(), "hello".to_string())]);
        let mut out = Vec::new();
        write_rows(&mut out, &rows, &[], |_| vec![]).unwrap();
        let back = read_rows_from(out.as_slice(), "out").unwrap();
        assert_eq!(back, rows);
    }

    #[test]
    fn bad_rows_name_line_and_field() {
        let csv = "op,dtype,m,n,k\ngemm,bf16,1,2,3\ngemm,bf16,1,-2,3\n";
        let err = read_rows_from(csv.as_bytes(), "x.csv").unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("x.csv: line 3") && msg.contains("'n'"), "{msg}");
        let err = read_rows_from("op\nconv2d\n".as_bytes(), "y.csv").unwrap_err();
        assert!(format!("{err:#}").contains("allowed: gemm"));
        let err = read_rows_from("op,m,n\ngemm,1,2\n".as_bytes(), "z.csv").unwrap_err();
        assert!(format!("{err:#}").contains("'k'"));
    }
}

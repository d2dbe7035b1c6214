//! Importer for the aiconfigurator kernel tables
//! (`systems/data/<gpu>/<family>/<framework>/<version>/<table>.parquet`, latency in ms).
//!
//! Mapping to the shared schema (units: ms -> us; NCCL sizes are element counts):
//! - `gemm_perf` -> `gemm` (m tokens, n out, k in). `bfloat16`->bf16, `fp8`->fp8,
//!   `fp8_block`->fp8 with backend suffix `/fp8_block`, `fp8_static`->fp8 `/fp8_static`,
//!   `nvfp4`->fp4. Weight-only (`int4_wo`, `int8_wo`) and SmoothQuant (`sq`) are skipped:
//!   their weight and activation formats differ, which one dtype cannot express.
//! - `context_attention_perf` -> `attn_prefill`: batch, seq_len = isl, kv_len = step (cached
//!   prefix, 0 in these tables), heads, kv heads, head_dim, window (0 = none), kv_dtype.
//! - `generation_attention_perf` -> `attn_decode`: kv_len = step + 1, because `step` is the
//!   cached length and the kernel attends the cached tokens plus the new one.
//! - `moe_perf` -> `moe` (num_tokens before routing, hidden, inter, topk, num_experts,
//!   tp = moe_tp_size, ep = moe_ep_size). The routing distribution is folded into the backend:
//!   `balanced` adds nothing, others add `/power_law_1.01` etc., so that a consumer grouping by
//!   backend never mixes skewed and balanced routing. Weight-only MoE formats are skipped,
//!   except `w4a16_mxfp4` on GPUs without fp4 tensor cores (H100, H200, L40S): `fp4` with
//!   backend suffix `/w4a16_mxfp4`, since there `Dtype::Fp4` means 4-bit weights, bf16 math.
//! - `nccl_perf` / `oneccl_perf` -> `all_reduce`, `all_gather`, `reduce_scatter`, `all_to_all`
//!   with bytes = elements x dtype bytes (nccl-tests size convention) and num_gpus. Backend is
//!   `nccl-<version column>` (the folder name is wrong for some files), else the folder name.
//! - `custom_allreduce_perf` -> `all_reduce` bf16, backend suffix `/custom_ar` plus `_graph` /
//!   `_eager` where the table says which (CUDA graph or eager launch).
//! - `context_mla_perf` / `generation_mla_perf` -> `mla_prefill` / `mla_decode` in the latent
//!   convention of `kernels::cost`: num_heads = heads on this GPU (the tables already divide
//!   DeepSeek's 128 by tp_size), num_kv_heads = 1, head_dim = 576 (kv_lora_rank 512 + rope 64;
//!   values use the 512 latent part). Decode kv_len = step + 1 as for attention.
//! - `mla_context_module_perf` / `mla_generation_module_perf` (whole MLA module, projections
//!   included) -> the same ops with backend suffix `/module_gemm_<gemm_type>`; they are not
//!   attention-core times and must not be mixed with the kernel tables.
//! - A table that `collection_meta.yaml` (next to it) marks with a measurement-method deviation
//!   `norm_dispatch: <how>` carries `/norm_<how>` after its suffix: upstream re-collected B200's
//!   MLA module tables with RMSNorm pinned to eager `vllm_c` kernels, which it says removes the
//!   +34% of the native chain the other GPUs' module tables still time.

use super::table::Table;
use super::{aggregate_median, measured, Imported};
use crate::schema::{Dtype, Kernel, Op};
use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};

pub const SOURCE: &str = "aiconfigurator";

/// System ids aiconfigurator uses (its `systems/*.yaml`).
pub const KNOWN_GPUS: [&str; 14] = [
    "a100_sxm",
    "a100_pcie",
    "a30",
    "b200_sxm",
    "b300_sxm",
    "b60",
    "gb200",
    "gb300",
    "h100_sxm",
    "h100_pcie",
    "h200_sxm",
    "l4",
    "l40s",
    "rtx_pro_6000_server",
];

const TABLES: [&str; 11] = [
    "gemm_perf",
    "context_attention_perf",
    "generation_attention_perf",
    "moe_perf",
    "nccl_perf",
    "oneccl_perf",
    "custom_allreduce_perf",
    "context_mla_perf",
    "generation_mla_perf",
    "mla_context_module_perf",
    "mla_generation_module_perf",
];

/// Columns every table may carry and the importer does not need.
const COMMON: [&str; 7] = ["framework", "version", "device", "op_name", "kernel_source", "power", "power_limit"];

/// Where a table file sits: `<gpu>/<family>/<framework>/<version>/<table>.parquet`.
#[derive(Debug, Clone, PartialEq)]
pub struct FileContext {
    pub gpu: String,
    pub framework: String,
    pub version: String,
    pub table: String,
    /// Backend suffix for a measurement-method deviation recorded in `collection_meta.yaml`.
    pub method: String,
}

impl FileContext {
    pub fn from_path(path: &Path) -> Result<FileContext> {
        let parts: Vec<String> =
            path.iter().map(|c| c.to_string_lossy().into_owned()).collect();
        if parts.len() < 5 {
            bail!(
                "{}: expected a path ending in <gpu>/<family>/<framework>/<version>/<table>.parquet",
                path.display()
            );
        }
        let n = parts.len();
        let table = parts[n - 1].trim_end_matches(".parquet").to_string();
        let ctx = FileContext {
            gpu: parts[n - 5].clone(),
            framework: parts[n - 3].to_ascii_lowercase(),
            version: parts[n - 2].clone(),
            table,
            method: String::new(),
        };
        if !KNOWN_GPUS.contains(&ctx.gpu.as_str()) {
            bail!(
                "{}: unknown GPU id '{}' (from the folder name); allowed: {}",
                path.display(),
                ctx.gpu,
                KNOWN_GPUS.join(", ")
            );
        }
        if !TABLES.contains(&ctx.table.as_str()) {
            bail!("{}: unknown table '{}'; known: {}", path.display(), ctx.table, TABLES.join(", "));
        }
        Ok(ctx)
    }

    fn backend(&self, suffix: &str) -> String {
        format!("{}-{}{}{}", self.framework, self.version, suffix, self.method)
    }
}

/// Imports every `*.parquet` under `dir` (recursively, in sorted path order).
pub fn import_dir(dir: &Path) -> Result<Imported> {
    import_dir_where(dir, |_| true)
}

/// Like `import_dir`, reading only the files whose location `wanted` accepts.
pub fn import_dir_where(dir: &Path, wanted: impl Fn(&FileContext) -> bool) -> Result<Imported> {
    let mut files = Vec::new();
    collect_parquet(dir, &mut files)?;
    if files.is_empty() {
        bail!("{}: no .parquet files found", dir.display());
    }
    files.sort();
    let mut all = Imported::default();
    for f in &files {
        if wanted(&FileContext::from_path(f)?) {
            all.absorb(import_file(f)?);
        }
    }
    all.rows = aggregate_median(all.rows);
    Ok(all)
}

fn collect_parquet(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect_parquet(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "parquet") {
            out.push(path);
        }
    }
    Ok(())
}

/// Imports one table file (rows not yet aggregated across files).
pub fn import_file(path: &Path) -> Result<Imported> {
    let mut ctx = FileContext::from_path(path)?;
    let meta = path.with_file_name("collection_meta.yaml");
    if meta.is_file() {
        let text = std::fs::read_to_string(&meta).with_context(|| format!("reading {}", meta.display()))?;
        if let Some(how) = norm_dispatch(&text, &ctx.table) {
            ctx.method = format!("/norm_{how}");
        }
    }
    let table = Table::read_parquet(path)?;
    convert(&table, &ctx)
}

/// The `norm_dispatch` value listed under `tables: <table>:` in a `collection_meta.yaml`
/// (indentation-scoped lookup; the files are small and flat).
pub fn norm_dispatch(meta: &str, table: &str) -> Option<String> {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut lines = meta.lines().skip_while(|l| l.trim() != format!("{table}:"));
    let head = lines.next()?;
    lines
        .take_while(|l| l.trim().is_empty() || l.trim_start().starts_with('#') || indent(l) > indent(head))
        .find_map(|l| l.trim().strip_prefix("norm_dispatch:").map(|v| v.trim().to_string()))
}

/// Converts a table whose provenance is `ctx`; repeated keys are median-aggregated.
pub fn convert(t: &Table, ctx: &FileContext) -> Result<Imported> {
    let mut out = Imported::default();
    match ctx.table.as_str() {
        "gemm_perf" => gemm(t, ctx, &mut out)?,
        "context_attention_perf" | "generation_attention_perf" => attention(t, ctx, &mut out)?,
        "moe_perf" => moe(t, ctx, &mut out)?,
        "nccl_perf" | "oneccl_perf" => nccl(t, ctx, &mut out)?,
        "custom_allreduce_perf" => custom_allreduce(t, ctx, &mut out)?,
        _ => mla(t, ctx, &mut out)?,
    }
    out.rows = aggregate_median(out.rows);
    Ok(out)
}

fn with_common<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v: Vec<&str> = COMMON.to_vec();
    v.extend_from_slice(extra);
    v
}

/// How a GEMM/MoE weight-and-activation format maps to one dtype, if it does.
enum Format {
    Keep(Dtype, &'static str),
    Skip,
}

/// Whether `Dtype::Fp4` on `ctx.gpu` means MXFP4 weights with 16-bit activations: on a GPU
/// without fp4 tensor cores it does (bf16 math, `GpuSpec::effective_compute_dtype`); on one
/// with them fp4 means fp4 math, which weight-only rows are not, so they are skipped there.
fn fp4_is_weight_only(ctx: &FileContext) -> bool {
    crate::hardware::load_gpu(&ctx.gpu).is_ok_and(|g| g.peak.fp4_tflops.is_none())
}

fn quant_format(t: &Table, row: usize, col: usize, fp4_weight_only: bool) -> Result<Format> {
    Ok(match t.str_at(row, col).as_ref() {
        "w4a16_mxfp4" if fp4_weight_only => Format::Keep(Dtype::Fp4, "/w4a16_mxfp4"),
        "bfloat16" => Format::Keep(Dtype::Bf16, ""),
        "float16" => Format::Keep(Dtype::Fp16, ""),
        "fp8" => Format::Keep(Dtype::Fp8, ""),
        "fp8_block" => Format::Keep(Dtype::Fp8, "/fp8_block"),
        "fp8_static" => Format::Keep(Dtype::Fp8, "/fp8_static"),
        "nvfp4" => Format::Keep(Dtype::Fp4, ""),
        "int4_wo" | "int8_wo" | "sq" | "w4a16_mxfp4" | "w4a8_mxfp4_mxfp8" => Format::Skip,
        _ => {
            return Err(t.bad(
                row,
                col,
                "is not a known format (allowed: bfloat16, float16, fp8, fp8_block, fp8_static, nvfp4; \
                 skipped: int4_wo, int8_wo, sq, w4a16_mxfp4, w4a8_mxfp4_mxfp8)",
            ))
        }
    })
}

/// Batch and lengths of an attention row: prefill has `isl` new tokens on `step` cached ones;
/// decode attends `step` cached tokens plus the new one.
fn set_attention_lengths(k: &mut Kernel, t: &Table, i: usize, decode: bool, (b, isl, step): (usize, usize, usize)) -> Result<()> {
    k.batch = t.u64_at(i, b)?;
    if decode {
        k.kv_len = t.u64_at(i, step)? + 1;
    } else {
        k.seq_len = t.u64_at(i, isl)?;
        k.kv_len = t.u64_at(i, step)?;
    }
    Ok(())
}

fn dtype_at(t: &Table, row: usize, col: usize) -> Result<Dtype> {
    t.str_at(row, col)
        .parse::<Dtype>()
        .map_err(|e| anyhow!("{}", t.bad(row, col, &format!("is not a dtype ({e})"))))
}

fn kernel_name(t: &Table, row: usize) -> String {
    t.opt_col("kernel_source").map(|c| t.str_at(row, c).into_owned()).unwrap_or_default()
}

fn skip(out: &mut Imported, ctx: &FileContext, what: &str) {
    *out.skipped.entry(format!("{}: {what}", ctx.table)).or_insert(0) += 1;
}

fn push(out: &mut Imported, t: &Table, row: usize, ctx: &FileContext, k: Kernel, lat_us: f64, suffix: &str) -> Result<()> {
    k.validate().with_context(|| format!("{}: {}", t.origin, t.row_label(row)))?;
    out.rows.push(measured(k, lat_us, &ctx.gpu, SOURCE, ctx.backend(suffix), &kernel_name(t, row)));
    Ok(())
}

fn gemm(t: &Table, ctx: &FileContext, out: &mut Imported) -> Result<()> {
    t.check_columns("gemm_perf", &["gemm_dtype", "m", "n", "k", "latency"], &COMMON)?;
    let (dt, m, n, k, lat) = (t.col("gemm_dtype")?, t.col("m")?, t.col("n")?, t.col("k")?, t.col("latency")?);
    let fp4_weight_only = fp4_is_weight_only(ctx);
    for i in 0..t.rows.len() {
        let Format::Keep(dtype, suffix) = quant_format(t, i, dt, fp4_weight_only)? else {
            skip(out, ctx, &format!("gemm_dtype {}", t.str_at(i, dt)));
            continue;
        };
        let mut kern = Kernel::new(Op::Gemm, dtype);
        kern.m = t.u64_at(i, m)?;
        kern.n = t.u64_at(i, n)?;
        kern.k = t.u64_at(i, k)?;
        push(out, t, i, ctx, kern, t.latency_ms_as_us(i, lat)?, suffix)?;
    }
    Ok(())
}

/// Windows at least this long cover any measured sequence: treated as full attention.
const NO_WINDOW_FROM: u64 = 1 << 30;

fn attention(t: &Table, ctx: &FileContext, out: &mut Imported) -> Result<()> {
    let req = [
        "batch_size",
        "isl",
        "num_heads",
        "num_key_value_heads",
        "head_dim",
        "attn_dtype",
        "kv_cache_dtype",
        "step",
        "latency",
    ];
    t.check_columns(&ctx.table, &req, &with_common(&["window_size", "beam_width"]))?;
    let decode = ctx.table == "generation_attention_perf";
    let c = |n: &str| t.col(n);
    let (b, isl, h, kvh, d, adt, kvdt, step, lat) = (
        c("batch_size")?,
        c("isl")?,
        c("num_heads")?,
        c("num_key_value_heads")?,
        c("head_dim")?,
        c("attn_dtype")?,
        c("kv_cache_dtype")?,
        c("step")?,
        c("latency")?,
    );
    let (win, beam) = (t.opt_col("window_size"), t.opt_col("beam_width"));
    for i in 0..t.rows.len() {
        if let Some(bc) = beam {
            if t.u64_at(i, bc)? != 1 {
                return Err(t.bad(i, bc, "is not supported (only beam_width 1)"));
            }
        }
        let dtype = dtype_at(t, i, adt)?;
        let kv = dtype_at(t, i, kvdt)?;
        let mut k = Kernel::new(if decode { Op::AttnDecode } else { Op::AttnPrefill }, dtype);
        set_attention_lengths(&mut k, t, i, decode, (b, isl, step))?;
        k.num_heads = t.u64_at(i, h)?;
        k.num_kv_heads = t.u64_at(i, kvh)?;
        k.head_dim = t.u64_at(i, d)?;
        let w = match win {
            Some(wc) => t.u64_at(i, wc)?,
            None => 0,
        };
        k.window = if w >= NO_WINDOW_FROM { 0 } else { w };
        k.kv_dtype = (kv != dtype).then_some(kv);
        push(out, t, i, ctx, k, t.latency_ms_as_us(i, lat)?, "")?;
    }
    Ok(())
}

fn moe(t: &Table, ctx: &FileContext, out: &mut Imported) -> Result<()> {
    let req = [
        "moe_dtype",
        "num_tokens",
        "hidden_size",
        "inter_size",
        "topk",
        "num_experts",
        "moe_tp_size",
        "moe_ep_size",
        "distribution",
        "latency",
    ];
    t.check_columns("moe_perf", &req, &COMMON)?;
    let c = |n: &str| t.col(n);
    let (dt, nt, hid, inter, topk, ne, tp, ep, dist, lat) = (
        c("moe_dtype")?,
        c("num_tokens")?,
        c("hidden_size")?,
        c("inter_size")?,
        c("topk")?,
        c("num_experts")?,
        c("moe_tp_size")?,
        c("moe_ep_size")?,
        c("distribution")?,
        c("latency")?,
    );
    let fp4_weight_only = fp4_is_weight_only(ctx);
    for i in 0..t.rows.len() {
        let Format::Keep(dtype, fmt_suffix) = quant_format(t, i, dt, fp4_weight_only)? else {
            skip(out, ctx, &format!("moe_dtype {}", t.str_at(i, dt)));
            continue;
        };
        let d = t.str_at(i, dist);
        let dist_suffix = match d.as_ref() {
            "balanced" => String::new(),
            s if s.starts_with("power_law_") => format!("/{s}"),
            _ => return Err(t.bad(i, dist, "is not a known distribution (balanced, power_law_<alpha>)")),
        };
        let mut k = Kernel::new(Op::Moe, dtype);
        k.num_tokens = t.u64_at(i, nt)?;
        k.hidden = t.u64_at(i, hid)?;
        k.inter = t.u64_at(i, inter)?;
        k.topk = t.u64_at(i, topk)?;
        k.num_experts = t.u64_at(i, ne)?;
        k.tp = t.u64_at(i, tp)?;
        k.ep = t.u64_at(i, ep)?;
        push(out, t, i, ctx, k, t.latency_ms_as_us(i, lat)?, &format!("{fmt_suffix}{dist_suffix}"))?;
    }
    Ok(())
}

fn nccl(t: &Table, ctx: &FileContext, out: &mut Imported) -> Result<()> {
    let req = ["op_name", "nccl_dtype", "num_gpus", "message_size", "latency"];
    t.check_columns(&ctx.table, &req, &COMMON)?;
    let c = |n: &str| t.col(n);
    let (op, dt, ng, size, lat) =
        (c("op_name")?, c("nccl_dtype")?, c("num_gpus")?, c("message_size")?, c("latency")?);
    let ver = t.opt_col("version");
    for i in 0..t.rows.len() {
        let op_kind = match t.str_at(i, op).as_ref() {
            "all_reduce" => Op::AllReduce,
            "all_gather" => Op::AllGather,
            "reduce_scatter" => Op::ReduceScatter,
            "alltoall" | "all_to_all" => Op::AllToAll,
            _ => return Err(t.bad(i, op, "is not a known collective (all_reduce, all_gather, reduce_scatter, alltoall)")),
        };
        let dtype = dtype_at(t, i, dt)?;
        let mut k = Kernel::new(op_kind, dtype);
        k.num_gpus = t.u64_at(i, ng)?;
        k.bytes = element_bytes(t.u64_at(i, size)?, dtype);
        let version = ver.map(|v| t.str_at(i, v).into_owned()).filter(|v| !v.is_empty());
        let row_ctx = FileContext { version: version.unwrap_or_else(|| ctx.version.clone()), ..ctx.clone() };
        push(out, t, i, &row_ctx, k, t.latency_ms_as_us(i, lat)?, "")?;
    }
    Ok(())
}

/// Message bytes of `elements` values (rounded up for sub-byte formats).
fn element_bytes(elements: u64, dtype: Dtype) -> u64 {
    (elements as f64 * dtype.bytes()).ceil() as u64
}

fn custom_allreduce(t: &Table, ctx: &FileContext, out: &mut Imported) -> Result<()> {
    let req = ["allreduce_dtype", "num_gpus", "message_size", "latency"];
    t.check_columns("custom_allreduce_perf", &req, &with_common(&["backend", "implementation"]))?;
    let c = |n: &str| t.col(n);
    let (dt, ng, size, lat) = (c("allreduce_dtype")?, c("num_gpus")?, c("message_size")?, c("latency")?);
    let launch = t.opt_col("backend");
    for i in 0..t.rows.len() {
        let dtype = dtype_at(t, i, dt)?;
        let mut k = Kernel::new(Op::AllReduce, dtype);
        k.num_gpus = t.u64_at(i, ng)?;
        k.bytes = element_bytes(t.u64_at(i, size)?, dtype);
        let suffix = match launch.map(|c| t.str_at(i, c).into_owned()) {
            Some(mode) if !mode.is_empty() => {
                let mode = mode.trim_start_matches("vllm_");
                if mode != "graph" && mode != "eager" {
                    return Err(t.bad(i, launch.unwrap(), "is not a known launch mode (vllm_graph, vllm_eager)"));
                }
                format!("/custom_ar_{mode}")
            }
            _ => "/custom_ar".to_string(),
        };
        push(out, t, i, ctx, k, t.latency_ms_as_us(i, lat)?, &suffix)?;
    }
    Ok(())
}

/// DeepSeek MLA latent width (kv_lora_rank 512 + rope 64), see the module comment.
pub const MLA_HEAD_DIM: u64 = 576;

fn mla(t: &Table, ctx: &FileContext, out: &mut Imported) -> Result<()> {
    let module = ctx.table.starts_with("mla_");
    let decode = ctx.table.contains("generation");
    let req = ["mla_dtype", "kv_cache_dtype", "num_heads", "batch_size", "isl", "tp_size", "step", "latency"];
    let optional = if module { with_common(&["model", "architecture", "gemm_type"]) } else { COMMON.to_vec() };
    t.check_columns(&ctx.table, &req, &optional)?;
    let c = |n: &str| t.col(n);
    let (dt, kvdt, h, b, isl, step, lat) = (
        c("mla_dtype")?,
        c("kv_cache_dtype")?,
        c("num_heads")?,
        c("batch_size")?,
        c("isl")?,
        c("step")?,
        c("latency")?,
    );
    let gemm_type = if module { Some(c("gemm_type")?) } else { None };
    for i in 0..t.rows.len() {
        let dtype = dtype_at(t, i, dt)?;
        let kv = dtype_at(t, i, kvdt)?;
        let mut k = Kernel::new(if decode { Op::MlaDecode } else { Op::MlaPrefill }, dtype);
        set_attention_lengths(&mut k, t, i, decode, (b, isl, step))?;
        k.num_heads = t.u64_at(i, h)?;
        k.num_kv_heads = 1;
        k.head_dim = MLA_HEAD_DIM;
        k.kv_dtype = (kv != dtype).then_some(kv);
        let suffix = gemm_type.map(|g| format!("/module_gemm_{}", t.str_at(i, g))).unwrap_or_default();
        push(out, t, i, ctx, k, t.latency_ms_as_us(i, lat)?, &suffix)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::norm_dispatch;

    #[test]
    fn norm_dispatch_is_read_per_table() {
        let meta = "schema_version: 1\ntables:\n  mla_context_module_perf:\n    status: complete\n    # note\n    norm_dispatch: vllm_c_eager_surrogate\n  mla_generation_module_perf:\n    status: complete\n  gemm_perf:\n    norm_dispatch: other\n";
        assert_eq!(norm_dispatch(meta, "mla_context_module_perf").as_deref(), Some("vllm_c_eager_surrogate"));
        // The next table's key ends the scope: generation has none of its own.
        assert_eq!(norm_dispatch(meta, "mla_generation_module_perf"), None);
        assert_eq!(norm_dispatch(meta, "moe_perf"), None);
    }
}

//! Importer for Vidur operator profiles (`profiling/compute/<gpu>/<org>/<model>/mlp.csv`,
//! `profiling/network/<cluster>/{all_reduce,send_recv}.csv`; times in ms, fp16).
//!
//! `mlp.csv` times one decoder layer's non-attention operators on one tensor-parallel shard.
//! With head_dim = n_embd / n_head and TP = num_tensor_parallel_workers, m = num_tokens:
//! - `attn_pre_proj`  -> gemm n = (n_head + 2 n_kv_head) head_dim / TP, k = n_embd
//! - `attn_post_proj` -> gemm n = n_embd, k = n_head head_dim / TP
//! - `mlp_up_proj`    -> gemm n = (2 if use_gated_mlp else 1) n_expanded_embd / TP, k = n_embd
//! - `mlp_down_proj`  -> gemm n = n_embd, k = n_expanded_embd / TP
//! - `input_layernorm`, `post_attention_layernorm` -> rmsnorm (hidden = n_embd)
//! - `attn_rope` -> rope (num_heads = n_head / TP, num_kv_heads = n_kv_head / TP, head_dim)
//! - `mlp_act` -> silu_mul (hidden = n_expanded_embd / TP, the output width)
//! - `add` -> add, `emb` -> embedding (hidden = n_embd)
//!
//! The median column (`time_stats.<op>.median`) is used. Models without a gated MLP (phi-2
//! here) use LayerNorm, GELU and partial rotary embedding, which the schema's rmsnorm,
//! silu_mul and rope do not describe, so for them only the GEMMs, add and embedding are kept.
//!
//! Network files: `size` is bytes, `num_workers` GPUs; all_reduce -> `all_reduce`,
//! send_recv -> `p2p`, fp16. Backend `vidur/<cluster>`, with `/internode` appended when the
//! workers span several nodes (devices_per_node < num_workers).
//!
//! A file byte-identical to one read before it (upstream's `h100_pairwise_nvlink/send_recv.csv`
//! copies the A100 one) is skipped and reported.
//!
//! GPU ids: a100 -> a100_sxm, h100 -> h100_sxm, a40 -> a40 (no spec sheet yet); h200 ->
//! h200_sxm for this project's own re-measurement of Vidur's operators
//! (`microbench/vidur_ops.py`, which writes the same format).

use super::{aggregate_median, measured, Imported};
use super::table::Table;
use crate::schema::{Dtype, Kernel, Op};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

pub const SOURCE: &str = "vidur";

/// Vidur's operator names in `mlp.csv`, in file order.
pub const MLP_OPS: [&str; 10] = [
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
];

const SHAPE_COLUMNS: [&str; 8] = [
    "n_head",
    "n_kv_head",
    "n_embd",
    "n_expanded_embd",
    "vocab_size",
    "use_gated_mlp",
    "num_tokens",
    "num_tensor_parallel_workers",
];

const STATS: [&str; 5] = ["min", "max", "mean", "median", "std"];

/// Maps a Vidur GPU folder (or cluster-name prefix) to an aiconfigurator system id.
pub fn gpu_id(vidur_gpu: &str) -> Option<&'static str> {
    match vidur_gpu {
        "a100" => Some("a100_sxm"),
        "h100" => Some("h100_sxm"),
        "a40" => Some("a40"),
        "h200" => Some("h200_sxm"),
        _ => None,
    }
}

fn gpu_or_err(name: &str, path: &Path) -> Result<&'static str> {
    gpu_id(name).with_context(|| format!("{}: unknown Vidur GPU '{name}'; allowed: a100, h100, a40, h200", path.display()))
}

/// Imports every `mlp.csv`, `all_reduce.csv` and `send_recv.csv` under `dir` (other files,
/// such as `MANIFEST.csv` or `attention.csv`, are not Vidur operator tables this reads).
pub fn import_dir(dir: &Path) -> Result<Imported> {
    let mut files = Vec::new();
    collect(dir, &mut files)?;
    if files.is_empty() {
        bail!("{}: no mlp.csv, all_reduce.csv or send_recv.csv found", dir.display());
    }
    files.sort();
    let mut all = Imported::default();
    let mut seen: Vec<(Vec<u8>, &Path)> = Vec::new();
    for f in &files {
        // Upstream ships h100_pairwise_nvlink/send_recv.csv as a byte-for-byte copy of the A100
        // file: a copy is not a measurement of the second GPU (and would leak one GPU's
        // measurements into the other's cross-generation test), so only the first is read.
        let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        if let Some((_, first)) = seen.iter().find(|(b, _)| *b == bytes) {
            let rows = bytes.iter().filter(|&&c| c == b'\n').count().saturating_sub(1);
            *all.skipped.entry(format!("vidur: {} is a byte-identical copy of {}", f.display(), first.display())).or_insert(0) += rows;
            continue;
        }
        all.absorb(import_file(f)?);
        seen.push((bytes, f));
    }
    all.rows = aggregate_median(all.rows);
    Ok(all)
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if matches!(
            path.file_name().and_then(|n| n.to_str()),
            Some("mlp.csv" | "all_reduce.csv" | "send_recv.csv")
        ) {
            out.push(path);
        }
    }
    Ok(())
}

/// Imports one file; the GPU (or cluster) comes from its folder.
pub fn import_file(path: &Path) -> Result<Imported> {
    let parts: Vec<String> = path.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    let n = parts.len();
    let name = parts[n - 1].as_str();
    let table = Table::read_csv(path)?;
    let mut out = Imported::default();
    if name == "mlp.csv" {
        if n < 4 {
            bail!("{}: expected a path ending in <gpu>/<org>/<model>/mlp.csv", path.display());
        }
        mlp(&table, gpu_or_err(&parts[n - 4], path)?, &mut out)?;
    } else {
        if n < 2 {
            bail!("{}: expected a path ending in <cluster>/{name}", path.display());
        }
        let cluster = &parts[n - 2];
        let gpu = gpu_or_err(cluster.split('_').next().unwrap_or(""), path)?;
        let collective = name.trim_end_matches(".csv");
        network(&table, gpu, cluster, collective, &mut out)?;
    }
    out.rows = aggregate_median(out.rows);
    Ok(out)
}

fn per_shard(t: &Table, row: usize, total: u64, tp: u64, what: &str) -> Result<u64> {
    if tp == 0 || !total.is_multiple_of(tp) {
        bail!(
            "{}: {}: {what} = {total} is not divisible by num_tensor_parallel_workers = {tp}",
            t.origin,
            t.row_label(row)
        );
    }
    Ok(total / tp)
}

/// Converts an `mlp.csv` table measured on `gpu`.
pub fn mlp(t: &Table, gpu: &str, out: &mut Imported) -> Result<()> {
    // Operator columns are optional: a model without an operator (phi-2 has no
    // post_attention_layernorm) has no columns for it.
    let stat_cols: Vec<String> =
        MLP_OPS.iter().flat_map(|op| STATS.iter().map(move |s| format!("time_stats.{op}.{s}"))).collect();
    let optional: Vec<&str> = stat_cols.iter().map(String::as_str).collect();
    t.check_columns("vidur mlp", &SHAPE_COLUMNS, &optional)?;
    let c = |n: &str| t.col(n);
    let (nh, nkv, emb, ffn, gated_c, nt, tpc) = (
        c("n_head")?,
        c("n_kv_head")?,
        c("n_embd")?,
        c("n_expanded_embd")?,
        c("use_gated_mlp")?,
        c("num_tokens")?,
        c("num_tensor_parallel_workers")?,
    );
    let ops: Vec<(&str, usize)> = MLP_OPS
        .iter()
        .filter_map(|op| t.opt_col(&format!("time_stats.{op}.median")).map(|col| (*op, col)))
        .collect();
    if ops.is_empty() {
        bail!("{}: no time_stats.<op>.median column for any of {}", t.origin, MLP_OPS.join(", "));
    }
    for i in 0..t.rows.len() {
        let (n_head, n_kv, n_embd, ffn_w) = (t.u64_at(i, nh)?, t.u64_at(i, nkv)?, t.u64_at(i, emb)?, t.u64_at(i, ffn)?);
        let (tokens, tp) = (t.u64_at(i, nt)?, t.u64_at(i, tpc)?);
        let gated = match t.str_at(i, gated_c).to_ascii_lowercase().as_str() {
            "true" | "1" => true,
            "false" | "0" => false,
            _ => return Err(t.bad(i, gated_c, "is not a boolean (True/False)")),
        };
        if n_head == 0 || n_embd % n_head != 0 {
            bail!("{}: {}: n_embd = {n_embd} is not divisible by n_head = {n_head}", t.origin, t.row_label(i));
        }
        let hd = n_embd / n_head;
        for &(op_name, lc) in &ops {
            let mut k = Kernel::new(Op::Gemm, Dtype::Fp16);
            let mut name = op_name;
            match op_name {
                "attn_pre_proj" => {
                    (k.n, k.k) = (per_shard(t, i, (n_head + 2 * n_kv) * hd, tp, "qkv width")?, n_embd);
                }
                "attn_post_proj" => (k.n, k.k) = (n_embd, per_shard(t, i, n_head * hd, tp, "attention width")?),
                "mlp_up_proj" => {
                    let width = if gated { 2 * ffn_w } else { ffn_w };
                    (k.n, k.k) = (per_shard(t, i, width, tp, "up-projection width")?, n_embd);
                }
                "mlp_down_proj" => (k.n, k.k) = (n_embd, per_shard(t, i, ffn_w, tp, "n_expanded_embd")?),
                _ if !gated && matches!(op_name, "input_layernorm" | "post_attention_layernorm" | "mlp_act" | "attn_rope") => {
                    *out.skipped.entry(format!("vidur mlp: {op_name} of a non-gated (LayerNorm/GELU) model")).or_insert(0) += 1;
                    continue;
                }
                "input_layernorm" | "post_attention_layernorm" => {
                    k.op = Op::Rmsnorm;
                    k.hidden = n_embd;
                    name = "rmsnorm";
                }
                "attn_rope" => {
                    k.op = Op::Rope;
                    k.num_heads = per_shard(t, i, n_head, tp, "n_head")?;
                    k.num_kv_heads = per_shard(t, i, n_kv, tp, "n_kv_head")?;
                    k.head_dim = hd;
                }
                "mlp_act" => {
                    k.op = Op::SiluMul;
                    k.hidden = per_shard(t, i, ffn_w, tp, "n_expanded_embd")?;
                }
                "add" => {
                    k.op = Op::Add;
                    k.hidden = n_embd;
                }
                // "emb", the only operator left in MLP_OPS.
                _ => {
                    k.op = Op::Embedding;
                    k.hidden = n_embd;
                }
            }
            if k.op == Op::Gemm {
                k.m = tokens;
            } else {
                k.num_tokens = tokens;
            }
            k.validate().with_context(|| format!("{}: {}: {op_name}", t.origin, t.row_label(i)))?;
            out.rows.push(measured(k, t.latency_ms_as_us(i, lc)?, gpu, SOURCE, SOURCE.to_string(), name));
        }
    }
    Ok(())
}

/// Converts an `all_reduce.csv` / `send_recv.csv` table of `cluster` (GPU `gpu`).
pub fn network(t: &Table, gpu: &str, cluster: &str, collective: &str, out: &mut Imported) -> Result<()> {
    let op = match collective {
        "all_reduce" => Op::AllReduce,
        "send_recv" => Op::P2p,
        _ => bail!("{}: unknown collective file '{collective}' (all_reduce, send_recv)", t.origin),
    };
    let stat_cols: Vec<String> = STATS.iter().map(|s| format!("time_stats.{collective}.{s}")).collect();
    let mut required: Vec<&str> = stat_cols.iter().map(String::as_str).collect();
    required.extend_from_slice(&["rank", "num_workers", "size", "collective", "devices_per_node", "max_devices_per_node"]);
    // The first column is an unnamed pandas index.
    t.check_columns(&format!("vidur {collective}"), &required, &[""])?;
    let c = |n: &str| t.col(n);
    let (lat, nw, size, coll, dpn) = (
        c(&format!("time_stats.{collective}.median"))?,
        c("num_workers")?,
        c("size")?,
        c("collective")?,
        c("devices_per_node")?,
    );
    for i in 0..t.rows.len() {
        if t.str_at(i, coll) != collective {
            return Err(t.bad(i, coll, &format!("does not match the file name ({collective})")));
        }
        let mut k = Kernel::new(op, Dtype::Fp16);
        k.num_gpus = t.u64_at(i, nw)?;
        k.bytes = t.u64_at(i, size)?;
        let internode = t.u64_at(i, dpn)? < k.num_gpus;
        let backend = format!("{SOURCE}/{cluster}{}", if internode { "/internode" } else { "" });
        k.validate().with_context(|| format!("{}: {}", t.origin, t.row_label(i)))?;
        out.rows.push(measured(k, t.latency_ms_as_us(i, lat)?, gpu, SOURCE, backend, collective));
    }
    Ok(())
}

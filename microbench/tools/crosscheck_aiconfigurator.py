#!/usr/bin/env python3
"""Compares our H200 measurements with the public aiconfigurator H200 tables on the same shapes.

    pip install pyarrow pandas     # this analysis only; the Rust build does not need them
    python3 microbench/tools/crosscheck_aiconfigurator.py \
        --ours microbench/data/h200_sxm/h200_sxm.csv \
        --aic ../shared/data/aiconfigurator/systems/data/h200_sxm

Prints, per op and source table, the number of shared shapes and the median, p10 and p90 of
latency(ours) / latency(theirs) (their latency is in ms; repeated rows are aggregated by
their median), plus the same split by a size class that separates memory-bound from
compute-bound shapes. Writes the joined rows with --joined FILE.
"""
import argparse
import glob
import os
import sys

import pandas as pd


def ratio_stats(df):
    r = df["ratio"]
    return {"shapes": len(r), "median": r.median(), "p10": r.quantile(0.1), "p90": r.quantile(0.9)}


def load_table(aic, pattern):
    frames = []
    for path in sorted(glob.glob(os.path.join(aic, pattern))):
        d = pd.read_parquet(path)
        if "framework" in d:
            d["table"] = f"{d['framework'].iloc[0]} {d['version'].iloc[0]}"
        else:  # the oldest NCCL table has no framework/version columns: name it by folder
            d["table"] = "nccl " + os.path.basename(os.path.dirname(path))
        # Older tables lack these columns; their rows are full-attention bf16.
        for col, default in (("window_size", 0), ("attn_dtype", "bfloat16"), ("kv_cache_dtype", "bfloat16")):
            if col not in d:
                d[col] = default
        frames.append(d)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def gemm(ours, aic):
    t = load_table(aic, "gemm/*/*/gemm_perf.parquet")
    t = t[t["gemm_dtype"].isin(["bfloat16", "fp8"])].copy()
    t["dtype"] = t["gemm_dtype"].map({"bfloat16": "bf16", "fp8": "fp8"})
    t = t.groupby(["table", "kernel_source", "dtype", "m", "n", "k"], as_index=False)["latency"].median()
    o = ours[ours["op"] == "gemm"][["op", "dtype", "m", "n", "k", "latency_us", "backend"]]
    j = o.merge(t, on=["dtype", "m", "n", "k"])
    j["ratio"] = j["latency_us"] / (j["latency"] * 1000.0)
    j["class"] = j["m"].map(lambda m: "m<=64 (weight-read bound)" if m <= 64 else ("m>=2048" if m >= 2048 else "64<m<2048"))
    j["group"] = j["dtype"] + " " + j["backend"] + " vs " + j["kernel_source"]
    return j


def attention(ours, aic):
    frames = []
    ctx = load_table(aic, "attention/*/*/context_attention_perf.parquet")
    ctx = ctx[(ctx["window_size"] == 0) & (ctx["kv_cache_dtype"] == "bfloat16") & (ctx["attn_dtype"] == "bfloat16")]
    ctx = ctx.groupby(["table", "kernel_source", "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim"],
                      as_index=False)["latency"].median()
    o = ours[(ours["op"] == "attn_prefill") & (ours["kv_len"].fillna(0) == 0)]
    j = o.merge(ctx, left_on=["batch", "seq_len", "num_heads", "num_kv_heads", "head_dim"],
                right_on=["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim"])
    j["class"] = j["seq_len"].map(lambda s: "seq<=512" if s <= 512 else "seq>512")
    frames.append(j)
    gen = load_table(aic, "attention/*/*/generation_attention_perf.parquet")
    gen = gen[(gen["window_size"] == 0) & (gen["kv_cache_dtype"] == "bfloat16") & (gen["attn_dtype"] == "bfloat16")]
    gen = gen.assign(attended=gen["step"] + 1)  # step = cached tokens; the kernel attends step + 1
    gen = gen.groupby(["table", "kernel_source", "batch_size", "attended", "num_heads", "num_key_value_heads", "head_dim"],
                      as_index=False)["latency"].median()
    o = ours[ours["op"] == "attn_decode"]
    j = o.merge(gen, left_on=["batch", "kv_len", "num_heads", "num_kv_heads", "head_dim"],
                right_on=["batch_size", "attended", "num_heads", "num_key_value_heads", "head_dim"])
    j["class"] = j["kv_len"].map(lambda s: "kv<=1024" if s <= 1024 else "kv>1024")
    frames.append(j)
    j = pd.concat(frames, ignore_index=True)
    j["ratio"] = j["latency_us"] / (j["latency"] * 1000.0)
    j["group"] = j["op"] + " " + j["backend"] + " vs " + j["kernel_source"]
    return j


def nccl(ours, aic):
    """Collectives (nccl-tests tables: message_size in elements of `half`; bytes = 2 x elements)."""
    t = load_table(aic, "comm/nccl/*/nccl_perf.parquet")
    if t.empty or ours[ours["op"].isin(["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])].empty:
        return pd.DataFrame()
    t = t[t["nccl_dtype"] == "half"].assign(bytes=lambda d: d["message_size"] * 2,
                                            op=lambda d: d["op_name"].replace({"alltoall": "all_to_all"}))
    t = t.groupby(["table", "kernel_source", "op", "num_gpus", "bytes"], as_index=False)["latency"].median()
    j = ours.merge(t, on=["op", "num_gpus", "bytes"])
    j["ratio"] = j["latency_us"] / (j["latency"] * 1000.0)
    j["class"] = j["bytes"].map(lambda b: "<=1 MiB" if b <= 1 << 20 else ">1 MiB")
    j["group"] = j["op"] + " vs nccl-tests"
    return j


def report(title, j):
    print(f"\n### {title}\n")
    print("| ours vs theirs | their table | class | shapes | median ours/theirs | p10 | p90 |")
    print("|---|---|---|---:|---:|---:|---:|")
    for (grp, table), d in j.groupby(["group", "table"]):
        for cls, dd in [("all", d)] + sorted(d.groupby("class")):
            s = ratio_stats(dd)
            print(f"| {grp} | {table} | {cls} | {s['shapes']} | {s['median']:.3f} | {s['p10']:.3f} | {s['p90']:.3f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", required=True)
    ap.add_argument("--aic", required=True, help="aiconfigurator systems/data/h200_sxm folder")
    ap.add_argument("--coll", help="our collective CSV (2-GPU run), compared with their NCCL tables")
    ap.add_argument("--joined", help="write the joined rows to this CSV")
    a = ap.parse_args()
    ours = pd.read_csv(a.ours)
    if ours.empty:
        sys.exit(f"{a.ours}: no rows")
    g = gemm(ours, a.aic)
    at = attention(ours, a.aic)
    report("GEMM (ours: torch.mm / torch._scaled_mm on cuBLAS; theirs: framework linear layer)", g)
    report("Attention (prefill: no cached prefix; decode: kv_len = attended tokens = their step + 1)", at)
    parts = [g, at]
    if a.coll:
        c = nccl(pd.read_csv(a.coll), a.aic)
        if not c.empty:
            report("Collectives, 2 GPUs (ours: torch.distributed NCCL in a CUDA graph; theirs: nccl-tests)", c)
            parts.append(c)
    if a.joined:
        pd.concat(parts, ignore_index=True).to_csv(a.joined, index=False)


if __name__ == "__main__":
    main()

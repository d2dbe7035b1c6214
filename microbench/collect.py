#!/usr/bin/env python3
"""kernelsight microbenchmark collector.

Reads a sweep plan in the shared kernel-shape schema (written by `kernelsight microbench
plan`), validates all of it before touching the GPU, times every row on the local GPU and
writes one CSV row per measurement (same shape columns + latency_us, spread, achieved rates,
backend, gpu, source) plus a provenance JSON sidecar. See microbench/README.md for the
method and the flop/byte conventions.

    python3 microbench/collect.py --plan microbench/plans/h200_default.csv --out results.csv
    python3 microbench/collect.py --plan plan.csv --validate-only     # no GPU needed
    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node 2 microbench/collect.py --plan plan.csv \
        --out coll.csv                                                 # collective rows

Only torch, triton and the standard library are used (what the device image has).
"""
import argparse
import csv
import datetime
import hashlib
import json
import math
import os
import subprocess
import sys
import time

SHAPE_COLUMNS = [
    "op", "dtype", "m", "n", "k", "batch", "seq_len", "kv_len", "num_heads", "num_kv_heads",
    "head_dim", "num_tokens", "hidden", "inter", "topk", "num_experts", "tp", "ep", "num_gpus",
    "bytes", "window", "kv_dtype",
]
NUMERIC = SHAPE_COLUMNS[2:-1]
PLAN_COLUMNS = SHAPE_COLUMNS + ["latency_us", "gpu", "source", "backend", "routing"]
OUTPUT_COLUMNS = SHAPE_COLUMNS + [
    "latency_us", "p10_us", "p90_us", "reps", "launches_per_rep", "method",
    "achieved_tflops", "achieved_tbps", "busbw_gbps", "backend", "gpu", "source", "routing",
]
DTYPES = {"bf16", "fp8"}
ROUTINGS = ("balanced", "uniform", "power_law_1.2", "power_law_loads_1.01", "power_law_loads_1.2")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
ELEMENTWISE = ("rmsnorm", "fused_add_rmsnorm", "silu_mul", "rope", "add", "embedding", "sampling",
               "copy", "moe_router")
# transformers' experts as its CUDA-graph engine runs them: num_tokens real tokens padded to a
# multiple of 64 rows, the padding rows one repeated token (so routed to one set of top-k experts).
HF_EXPERTS_PAD64 = "hf_padded_grouped_mm"  # not prefixed "hf_grouped_mm": backends match by prefix
GRAPH_Q_PAD = 64
# op -> (required fields, allowed dtypes, allowed backends)
OPS = {
    "gemm": (("m", "n", "k"), {"bf16", "fp8"}, {"cublas", "cublaslt_scaled_mm"}),
    "attn_prefill": (("batch", "seq_len", "num_heads", "num_kv_heads", "head_dim"), {"bf16"},
                     {"sdpa_flash", "sdpa_cudnn", "sdpa_cudnn_masked", "torch_eager_sinks"}),
    "attn_decode": (("batch", "kv_len", "num_heads", "num_kv_heads", "head_dim"), {"bf16"},
                    {"triton_paged", "sdpa_flash"}),
    "moe": (("num_tokens", "hidden", "inter", "topk", "num_experts"), {"bf16"}, {"grouped_mm", "hf_grouped_mm", HF_EXPERTS_PAD64}),
    "moe_router": (("num_tokens", "hidden", "num_experts", "topk"), {"bf16"}, {"torch"}),
    "rmsnorm": (("num_tokens", "hidden"), {"bf16"}, {"triton", "hf_modules"}),
    "fused_add_rmsnorm": (("num_tokens", "hidden"), {"bf16"}, {"triton", "hf_modules"}),
    "silu_mul": (("num_tokens", "hidden"), {"bf16"}, {"triton", "hf_modules"}),
    "rope": (("num_tokens", "num_heads", "head_dim"), {"bf16"}, {"triton", "hf_modules"}),
    "add": (("num_tokens", "hidden"), {"bf16"}, {"torch"}),
    "embedding": (("num_tokens", "hidden"), {"bf16"}, {"torch"}),
    "sampling": (("num_tokens", "hidden"), {"bf16"}, {"torch"}),
    "copy": (("bytes",), {"bf16"}, {"torch_copy", "torch_copy_eager", "torch_index_select", "torch_repeat_kv",
                                    "torch_masked_scatter", "torch_index_copy"}),
}
for _c in COLLECTIVES:
    OPS[_c] = (("bytes", "num_gpus"), {"bf16"}, {"nccl"})
# transformers' paged|sdpa moves KV with three torch ops per layer; the collector times them on a
# cache of 8 KV heads x 128 dims (the bytes field is the op's output): index_select of the read
# tokens out of the cache, repeat_kv (expand + reshape: a strided copy to 4x the heads) and
# masked_scatter_ of new tokens into the read KV (sliding layers). Value: bf16 values per token out.
# `torch_index_copy` is a paged KV-cache write (what vLLM's reshape_and_cache_flash does): new
# tokens' rows copied into random distinct slots of the cache.
KV_HEADS, KV_HEAD_DIM, KV_REPEAT = 8, 128, 4
PAGED_KV_CACHE_TOKENS = 98304
PAGED_KV_COPIES = {"torch_index_select": KV_HEADS * KV_HEAD_DIM, "torch_repeat_kv": KV_HEADS * KV_REPEAT * KV_HEAD_DIM,
                   "torch_masked_scatter": KV_HEADS * KV_HEAD_DIM, "torch_index_copy": KV_HEADS * KV_HEAD_DIM}
HF_MODULES = "hf_modules"  # transformers' own modules (RMSNorm, rotary, act * mul), each several torch kernels
DEFAULT_VOCAB = 128256  # embedding rows when `n` is empty
DEFAULT_SAMPLING_TOPK = 50
GPU_MEMORY_BYTES = 141e9  # H200; rows needing more are refused before the run
PAGE_SIZE = 16  # tokens per KV page for the paged decode kernel
GPU_IDS = {"NVIDIA H200": "h200_sxm", "NVIDIA H100 80GB HBM3": "h100_sxm", "NVIDIA B200": "b200_sxm",
           "NVIDIA A100-SXM4-80GB": "a100_sxm", "NVIDIA L40S": "l40s"}


class PlanError(Exception):
    pass


# ----------------------------------------------------------------------------- plan reading

def read_plan(path):
    """Returns a list of (line, row dict with ints for numeric fields). Raises PlanError listing
    every problem found (file, line, field, allowed values)."""
    errors = []
    try:
        f = open(path, newline="")
    except OSError as e:
        raise PlanError(f"{path}: cannot open: {e}")
    with f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        if "op" not in header:
            raise PlanError(f"{path}: missing required column 'op' (header: {','.join(header)})")
        allowed = set(PLAN_COLUMNS) | set(OUTPUT_COLUMNS)
        unknown = [h for h in header if h not in allowed]
        if unknown:
            raise PlanError(f"{path}: unknown column(s) {', '.join(unknown)}; allowed: {', '.join(PLAN_COLUMNS)}")
        rows = []
        for i, raw in enumerate(reader):
            line = i + 2
            try:
                rows.append((line, parse_row(raw)))
            except PlanError as e:
                errors.append(f"{path}: line {line}: {e}")
    if errors:
        more = f"\n... and {len(errors) - 20} more" if len(errors) > 20 else ""
        raise PlanError("\n".join(errors[:20]) + more)
    if not rows:
        raise PlanError(f"{path}: the plan has no rows")
    return rows


def parse_row(raw):
    if None in raw:
        raise PlanError("more fields than the header has columns")
    op = (raw.get("op") or "").strip().lower()
    if op not in OPS:
        raise PlanError(f"field 'op' = '{op}' is unknown; allowed: {', '.join(OPS)}")
    required, dtypes, backends = OPS[op]
    r = {"op": op, "dtype": (raw.get("dtype") or "bf16").strip().lower()}
    if r["dtype"] not in dtypes:
        raise PlanError(f"field 'dtype' = '{r['dtype']}' is not supported for op '{op}'; allowed: {', '.join(sorted(dtypes))}")
    for name in NUMERIC:
        val = (raw.get(name) or "").strip()
        if val == "":
            r[name] = 0
            continue
        try:
            num = float(val)
        except ValueError:
            raise PlanError(f"field '{name}' = '{val}' is not a number")
        if num < 0 or num != int(num):
            raise PlanError(f"field '{name}' = '{val}' must be a non-negative integer")
        r[name] = int(num)
    for name in required:
        if r[name] == 0:
            raise PlanError(f"op '{op}' needs field '{name}' > 0 (required: {', '.join(required)})")
    kvd = (raw.get("kv_dtype") or "").strip().lower()
    if kvd and kvd != r["dtype"]:
        raise PlanError(f"field 'kv_dtype' = '{kvd}': this collector measures KV caches in the attention dtype only")
    r["backend"] = (raw.get("backend") or "").strip() or sorted(backends)[0]
    if r["backend"] not in backends:
        raise PlanError(f"field 'backend' = '{r['backend']}' is not available for op '{op}'; allowed: {', '.join(sorted(backends))}")
    r["routing"] = (raw.get("routing") or "").strip()
    check_shape(r)
    return r


def check_shape(r):
    """Op-specific consistency: what the kernels can run at all."""
    op = r["op"]
    if r["window"]:
        raise PlanError("field 'window' > 0: sliding-window attention is not measured by this collector")
    if op == "gemm":
        if r["dtype"] == "fp8" and (r["n"] % 16 or r["k"] % 16):
            raise PlanError(f"fp8 GEMM needs n and k divisible by 16 (torch._scaled_mm), got n={r['n']} k={r['k']}")
        want = "cublaslt_scaled_mm" if r["dtype"] == "fp8" else "cublas"
        if r["backend"] != want:
            raise PlanError(f"a {r['dtype']} GEMM runs on backend '{want}', not '{r['backend']}'")
    if op in ("attn_prefill", "attn_decode"):
        if r["num_heads"] % r["num_kv_heads"]:
            raise PlanError(f"num_heads ({r['num_heads']}) must be a multiple of num_kv_heads ({r['num_kv_heads']})")
        if r["head_dim"] % 8 or r["head_dim"] > 256:
            raise PlanError(f"head_dim = {r['head_dim']} must be a multiple of 8 and at most 256 (flash/cuDNN limits)")
    if op == "attn_prefill" and r["backend"] == "sdpa_cudnn_masked" and r["num_heads"] != r["num_kv_heads"]:
        raise PlanError("'sdpa_cudnn_masked' is the packed attention of transformers' paged|sdpa, which repeats KV heads "
                        "before SDPA: give num_kv_heads = num_heads")
    if op == "attn_prefill" and r["kv_len"] and r["backend"] == "sdpa_cudnn":
        raise PlanError("prefill over a cached prefix (kv_len > 0) runs on 'sdpa_flash' only (SDPA's cuDNN path has no bottom-right causal mask)")
    if op == "attn_decode" and r["seq_len"] > 1:
        raise PlanError(f"attn_decode has one query token per sequence; seq_len = {r['seq_len']}")
    if op == "moe":
        if r["topk"] > r["num_experts"]:
            raise PlanError(f"topk ({r['topk']}) exceeds num_experts ({r['num_experts']})")
        tp, ep = max(r["tp"], 1), max(r["ep"], 1)
        if r["num_experts"] % ep:
            raise PlanError(f"num_experts ({r['num_experts']}) must be divisible by ep ({ep})")
        if r["inter"] % tp or (r["inter"] // tp) % 8 or r["hidden"] % 8:
            raise PlanError(f"inter/tp ({r['inter']}/{tp}) and hidden ({r['hidden']}) must be whole multiples of 8 (grouped GEMM alignment)")
        if r["routing"] not in ROUTINGS:
            raise PlanError(f"field 'routing' = '{r['routing']}' is unknown; allowed: {', '.join(ROUTINGS)}")
        if r["backend"] in ("hf_grouped_mm", HF_EXPERTS_PAD64) and (tp > 1 or ep > 1):
            raise PlanError(f"'{r['backend']}' is transformers' experts module on one GPU: give tp = ep = 1")
    elif r["routing"]:
        raise PlanError(f"field 'routing' is for moe rows only (op '{op}')")
    if op == "moe_router" and r["topk"] > r["num_experts"]:
        raise PlanError(f"topk ({r['topk']}) exceeds num_experts ({r['num_experts']})")
    if op == "copy" and r["backend"] in PAGED_KV_COPIES and r["bytes"] % (2 * PAGED_KV_COPIES[r["backend"]]):
        raise PlanError(f"'{r['backend']}' copies whole tokens of {PAGED_KV_COPIES[r['backend']]} bf16 values: bytes must be "
                        f"a multiple of {2 * PAGED_KV_COPIES[r['backend']]}")
    if op == "copy" and r["bytes"] % 2:
        raise PlanError(f"copy of {r['bytes']} bytes must be whole bf16 elements (even)")
    if op == "rope" and r["head_dim"] % 2:
        raise PlanError(f"rope needs an even head_dim, got {r['head_dim']}")
    if op == "sampling" and (r["topk"] or DEFAULT_SAMPLING_TOPK) > r["hidden"]:
        raise PlanError(f"sampling top-k ({r['topk'] or DEFAULT_SAMPLING_TOPK}) exceeds the vocabulary (hidden = {r['hidden']})")
    if op in COLLECTIVES:
        if r["num_gpus"] < 2:
            raise PlanError(f"collective '{op}' needs num_gpus >= 2, got {r['num_gpus']}")
        unit = 2 * (r["num_gpus"] if op in ("all_gather", "reduce_scatter", "all_to_all") else 1)
        if r["bytes"] % unit:
            raise PlanError(f"'{op}' message of {r['bytes']} bytes must split into whole bf16 elements per GPU (multiple of {unit})")
    need = working_set_bytes(r)
    if need > 0.9 * GPU_MEMORY_BYTES:
        raise PlanError(f"shape needs about {need / 1e9:.0f} GB of device memory; the GPU has {GPU_MEMORY_BYTES / 1e9:.0f} GB")


def working_set_bytes(r):
    """Bytes one set of inputs and outputs occupies on the device (one buffer set)."""
    op, e = r["op"], (1 if r["dtype"] == "fp8" else 2)
    if op == "gemm":
        return (r["m"] * r["k"] + r["n"] * r["k"]) * e + r["m"] * r["n"] * 2
    if op == "attn_prefill":
        q = r["batch"] * r["seq_len"] * r["num_heads"] * r["head_dim"] * 2
        kv = 2 * r["batch"] * (r["kv_len"] + r["seq_len"]) * r["num_kv_heads"] * r["head_dim"] * 2
        mask = r["seq_len"] * (r["kv_len"] + r["seq_len"]) * 2 if r["backend"] in ("sdpa_cudnn_masked", "torch_eager_sinks") else 0
        # The eager math path materialises the scores (and the concatenated, softmaxed copies)
        # and the KV repeated to every query head.
        scores = 3 * r["num_heads"] * mask if r["backend"] == "torch_eager_sinks" else 0
        repeated = 2 * (r["kv_len"] + r["seq_len"]) * r["num_heads"] * r["head_dim"] * 2 if r["backend"] == "torch_eager_sinks" else 0
        return 2 * q + kv + mask + scores + repeated
    if op == "attn_decode":
        kv = 2 * r["batch"] * r["kv_len"] * r["num_kv_heads"] * r["head_dim"] * 2
        return kv + 2 * r["batch"] * r["num_heads"] * r["head_dim"] * 2
    if op == "moe":
        tp, ep = max(r["tp"], 1), max(r["ep"], 1)
        w = r["num_experts"] // ep * 3 * r["hidden"] * (r["inter"] // tp) * 2
        act = r["num_tokens"] * r["topk"] * (r["hidden"] * 2 + 3 * r["inter"] // tp) * 2
        return w + act
    if op == "copy":
        return 2 * r["bytes"] + (PAGED_KV_CACHE_TOKENS * KV_HEADS * KV_HEAD_DIM * 2 if r["backend"] in PAGED_KV_COPIES else 0)
    if op in COLLECTIVES:
        return 2 * r["bytes"]
    if op == "sampling":
        return 2 * r["num_tokens"] * r["hidden"] * 4
    if op == "embedding":
        return (r["n"] or DEFAULT_VOCAB) * r["hidden"] * 2 + 2 * r["num_tokens"] * r["hidden"] * 2
    if op == "rope":
        return r["num_tokens"] * (r["num_heads"] + r["num_kv_heads"]) * r["head_dim"] * 2
    if op == "moe_router":
        return (r["num_tokens"] + r["num_experts"]) * r["hidden"] * 2
    return 4 * r["num_tokens"] * r["hidden"] * 2  # norms, add, silu_mul


# ----------------------------------------------------------------------------- flops and bytes
# Same conventions as the Rust crate's kernels::cost (documented in microbench/README.md):
# FLOPs count a multiply-add as 2; bytes are compulsory HBM traffic, each tensor once.

def causal_pairs(s, prefix):
    return s * prefix + s * (s + 1) / 2


def expected_active_experts(e, assignments):
    return 0.0 if e <= 0 else e * (1 - (1 - 1 / e) ** assignments)


def flops(r):
    op = r["op"]
    if op == "gemm":
        return 2.0 * r["m"] * r["n"] * r["k"]
    if op == "attn_prefill":
        return 4.0 * r["batch"] * r["num_heads"] * r["head_dim"] * causal_pairs(r["seq_len"], r["kv_len"])
    if op == "attn_decode":
        return 4.0 * r["batch"] * r["num_heads"] * r["head_dim"] * r["kv_len"]
    if op == "moe":
        assignments = r["num_tokens"] * r["topk"] / max(r["ep"], 1)
        return 2.0 * assignments * r["hidden"] * 3.0 * r["inter"] / max(r["tp"], 1)
    if op == "moe_router":
        return 2.0 * r["num_tokens"] * r["hidden"] * r["num_experts"]
    if op in ("all_reduce", "reduce_scatter"):
        return r["bytes"] / 2.0
    t, h = r["num_tokens"], r["hidden"]
    return {"rmsnorm": 4.0 * t * h, "fused_add_rmsnorm": 4.0 * t * h, "silu_mul": 4.0 * t * h,
            "rope": 3.0 * t * (r["num_heads"] + r["num_kv_heads"]) * r["head_dim"],
            "add": 1.0 * t * h, "sampling": 5.0 * t * h}.get(op, 0.0)


def hbm_bytes(r):
    op, t, h = r["op"], r["num_tokens"], r["hidden"]
    if op == "gemm":
        e = 1 if r["dtype"] == "fp8" else 2
        return (r["m"] * r["k"] + r["k"] * r["n"]) * e + r["m"] * r["n"] * 2.0
    if op == "attn_prefill":
        q_o = 2.0 * r["batch"] * r["seq_len"] * r["num_heads"] * r["head_dim"] * 2
        return q_o + 2.0 * r["batch"] * (r["kv_len"] + r["seq_len"]) * r["num_kv_heads"] * r["head_dim"] * 2
    if op == "attn_decode":
        q_o = 2.0 * r["batch"] * r["num_heads"] * r["head_dim"] * 2
        return q_o + 2.0 * r["batch"] * r["kv_len"] * r["num_kv_heads"] * r["head_dim"] * 2
    if op == "moe":
        ep, tp = max(r["ep"], 1), max(r["tp"], 1)
        local = r["num_experts"] / ep
        assignments = t * r["topk"] / ep
        active = expected_active_experts(local, min(assignments, t * local))
        return active * 3.0 * h * r["inter"] / tp * 2 + 2.0 * t * h * 2
    if op == "moe_router":
        return t * h * 2.0 + h * r["num_experts"] * 2.0
    if op in COLLECTIVES:
        return float(r["bytes"])
    return {"rmsnorm": 2.0 * t * h * 2 + h * 2, "fused_add_rmsnorm": 4.0 * t * h * 2 + h * 2,
            "silu_mul": 3.0 * t * h * 2, "rope": 2.0 * t * (r["num_heads"] + r["num_kv_heads"]) * r["head_dim"] * 2,
            "add": 3.0 * t * h * 2, "embedding": 2.0 * t * h * 2, "sampling": t * h * 4.0,
            "copy": 2.0 * r["bytes"]}[op]


def bus_factor(op, n):
    """nccl-tests bus-bandwidth factor: busbw = algbw * factor."""
    return {"all_reduce": 2 * (n - 1) / n, "p2p": 1.0}.get(op, (n - 1) / n)


# ----------------------------------------------------------------------------- estimate

def estimate_seconds(rows, peak_tflops=700.0, hbm_tbps=4.0, overhead_s=0.015):
    """Rough wall time of a sweep: SOL at sustained rates, times the launches the timing
    method makes (warm-up, estimate, >= 20 replays of >= 300 us), plus per-row Python overhead."""
    per_op = {}
    for _, r in rows:
        if r["op"] in COLLECTIVES:
            t_us = 10 + r["bytes"] / 150e9 * 1e6
        else:
            peak = peak_tflops * (2 if r["dtype"] == "fp8" else 1)
            t_us = 3 + max(flops(r) / (peak * 1e6), hbm_bytes(r) / (hbm_tbps * 1e6))
        gpu_us = max(t_us, 300) * 24 + t_us * 8
        per_op[r["op"]] = per_op.get(r["op"], 0.0) + gpu_us / 1e6 + overhead_s
    return per_op


# ----------------------------------------------------------------------------- GPU side
try:  # Triton kernels are defined only where Triton exists (validation runs without it).
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - validation-only hosts
    triton = None

if triton is not None:
    @triton.jit
    def _rmsnorm_kernel(x_ptr, w_ptr, out_ptr, res_ptr, res_out_ptr, H, eps,
                        FUSED_ADD: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < H
        x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
        if FUSED_ADD:
            x += tl.load(res_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(res_out_ptr + row * H + cols, x.to(res_out_ptr.dtype.element_ty), mask=mask)
        var = tl.sum(x * x, axis=0) / H
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = x * tl.rsqrt(var + eps) * w
        tl.store(out_ptr + row * H + cols, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, H, total, BLOCK: tl.constexpr):
        idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = idx < total
        row = idx // H
        col = idx % H
        g = tl.load(x_ptr + row * 2 * H + col, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row * 2 * H + H + col, mask=mask, other=0.0).to(tl.float32)
        y = g / (1.0 + tl.exp(-g)) * u
        tl.store(out_ptr + idx, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _rope_rotate(ptr, t, nh, cos, sin, D: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr):
        d = tl.arange(0, HALF)
        h = tl.arange(0, BLOCK_H)
        for h0 in range(0, nh, BLOCK_H):
            hh = h0 + h
            m = (hh < nh)[:, None]
            base = ptr + t * nh * D + hh[:, None] * D + d[None, :]
            x1 = tl.load(base, mask=m, other=0.0).to(tl.float32)
            x2 = tl.load(base + HALF, mask=m, other=0.0).to(tl.float32)
            tl.store(base, (x1 * cos - x2 * sin).to(ptr.dtype.element_ty), mask=m)
            tl.store(base + HALF, (x2 * cos + x1 * sin).to(ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _rope_kernel(q_ptr, k_ptr, pos_ptr, cos_sin_ptr, NQ, NK, D: tl.constexpr,
                     HALF: tl.constexpr, BLOCK_H: tl.constexpr):
        # Neox-style rotation of q and k in place; cos_sin row = [cos(HALF) | sin(HALF)].
        t = tl.program_id(0).to(tl.int64)
        pos = tl.load(pos_ptr + t)
        d = tl.arange(0, HALF)
        cos = tl.load(cos_sin_ptr + pos * D + d)[None, :]
        sin = tl.load(cos_sin_ptr + pos * D + HALF + d)[None, :]
        _rope_rotate(q_ptr, t, NQ, cos, sin, D, HALF, BLOCK_H)
        _rope_rotate(k_ptr, t, NK, cos, sin, D, HALF, BLOCK_H)

    @triton.jit
    def _paged_decode_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, lse_ptr, sm_scale,
                             s_qb, s_qh, s_kb, s_kp, s_kh, s_btb, s_ob, s_oh, s_os, s_lb, s_lh,
                             tokens_per_split,
                             G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr,
                             PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
        # One program: one sequence, one KV head (its G query heads together), one KV split.
        b = tl.program_id(0).to(tl.int64)
        kvh = tl.program_id(1).to(tl.int64)
        split = tl.program_id(2)
        seq_len = tl.load(lens_ptr + b)
        g = tl.arange(0, G_PAD)
        gmask = g < G
        heads = kvh * G + g
        d = tl.arange(0, D)
        q = tl.load(q_ptr + b * s_qb + heads[:, None] * s_qh + d[None, :], mask=gmask[:, None], other=0.0)
        m_i = tl.full([G_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([G_PAD], tl.float32)
        acc = tl.zeros([G_PAD, D], tl.float32)
        start = split * tokens_per_split
        end = tl.minimum(start + tokens_per_split, seq_len)
        for t0 in range(start, end, BLOCK_N):
            tok = t0 + tl.arange(0, BLOCK_N)
            tmask = tok < end
            blk = tl.load(bt_ptr + b * s_btb + tok // PAGE, mask=tmask, other=0).to(tl.int64)
            off = blk * s_kb + (tok % PAGE) * s_kp + kvh * s_kh
            k = tl.load(k_ptr + off[:, None] + d[None, :], mask=tmask[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * sm_scale
            s = tl.where(tmask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_ptr + off[:, None] + d[None, :], mask=tmask[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        has = l_i > 0
        out = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(o_ptr + b * s_ob + heads[:, None] * s_oh + split * s_os + d[None, :], out, mask=gmask[:, None])
        tl.store(lse_ptr + b * s_lb + heads * s_lh + split, lse, mask=gmask)

    @triton.jit
    def _paged_decode_reduce(o_part_ptr, lse_ptr, out_ptr, num_splits, s_ob, s_oh, s_os, s_lb, s_lh,
                             s_outb, s_outh, D: tl.constexpr, SPLITS: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        sp = tl.arange(0, SPLITS)
        smask = sp < num_splits
        lse = tl.load(lse_ptr + b * s_lb + h * s_lh + sp, mask=smask, other=float("-inf"))
        mx = tl.max(lse, axis=0)
        w = tl.where(smask, tl.exp(lse - mx), 0.0)
        d = tl.arange(0, D)
        o = tl.load(o_part_ptr + b * s_ob + h * s_oh + sp[:, None] * s_os + d[None, :], mask=smask[:, None], other=0.0)
        out = tl.sum(o * w[:, None], axis=0) / tl.sum(w, axis=0)
        tl.store(out_ptr + b * s_outb + h * s_outh + d, out.to(out_ptr.dtype.element_ty))


def next_pow2(x):
    return 1 << max(0, (int(x) - 1).bit_length())


class Gpu:
    """The measuring side: builds inputs for one plan row and times it."""

    ROTATE_BYTES = 256 << 20  # rotate input sets until their total exceeds ~4x the 60 MB L2
    MAX_BUFFERS = 32
    TARGET_REPLAY_US = 300.0  # one timed replay holds enough launches to dwarf event overhead
    MAX_LAUNCHES = 256
    MIN_REPS, MAX_REPS = 20, 50
    SHAPE_BUDGET_US = 40000.0  # extra replays only while they fit in this much GPU time

    def __init__(self, torch, seed):
        self.torch = torch
        self.F = torch.nn.functional
        self.dev = torch.device("cuda", torch.cuda.current_device())
        self.seed = seed
        self.broken = {}  # backend -> reason (failed self-test)

    # -- helpers
    def randn(self, *shape, dtype=None, scale=1.0):
        t = self.torch.randn(*shape, device=self.dev, dtype=self.torch.float32)
        if scale != 1.0:
            t.mul_(scale)
        return t.to(dtype or self.torch.bfloat16)

    def n_buffers(self, set_bytes):
        return int(max(1, min(self.MAX_BUFFERS, math.ceil(self.ROTATE_BYTES / max(set_bytes, 1)))))

    def time(self, fns, graph=True):
        """Times callables (one per rotated input set). Returns dict with median/p10/p90 per
        launch in us, reps, launches per replay and the method."""
        torch = self.torch
        for f in fns:
            f()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(3):
            fns[0]()
        e.record()
        e.synchronize()
        est_us = max(s.elapsed_time(e) * 1000.0 / 3, 0.5)
        launches = max(math.ceil(self.TARGET_REPLAY_US / est_us), min(len(fns), math.ceil(5000.0 / est_us)))
        launches = int(max(1, min(self.MAX_LAUNCHES, launches)))
        replay = None
        method = "events"
        if graph:
            try:
                g = torch.cuda.CUDAGraph()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    fns[0]()  # warm the side stream (allocator, handles) before capture
                torch.cuda.current_stream().wait_stream(side)
                with torch.cuda.graph(g):
                    for j in range(launches):
                        fns[j % len(fns)]()
                replay = g.replay
                method = "cuda_graph"
            except Exception as exc:  # capture unsupported for this op: time eagerly instead
                torch.cuda.synchronize()  # raises if the failed capture broke the context
                log(f"    graph capture failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); timing eagerly")
                replay = None
        if replay is None:
            def replay():
                for j in range(launches):
                    fns[j % len(fns)]()
        for _ in range(2):
            replay()
        torch.cuda.synchronize()
        reps = int(max(self.MIN_REPS, min(self.MAX_REPS, self.SHAPE_BUDGET_US / (est_us * launches))))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            starts[i].record()
            replay()
            ends[i].record()
        torch.cuda.synchronize()
        per = sorted(starts[i].elapsed_time(ends[i]) * 1000.0 / launches for i in range(reps))
        return {"latency_us": quantile(per, 0.5), "p10_us": quantile(per, 0.1), "p90_us": quantile(per, 0.9),
                "reps": reps, "launches_per_rep": launches, "method": method}

    # -- builders: each returns (callables, backend label)
    def build(self, r):
        fn = getattr(self, "build_" + r["op"])
        return fn(r)

    def build_gemm(self, r):
        torch = self.torch
        m, n, k = r["m"], r["n"], r["k"]
        nb = self.n_buffers(working_set_bytes(r))
        if r["dtype"] == "bf16":
            sets = [(self.randn(m, k), self.randn(n, k), torch.empty(m, n, device=self.dev, dtype=torch.bfloat16))
                    for _ in range(nb)]
            return [lambda a=a, w=w, c=c: torch.mm(a, w.t(), out=c) for a, w, c in sets], "cublas"
        f8 = torch.float8_e4m3fn
        one = torch.ones((), device=self.dev, dtype=torch.float32)
        sets = [(self.randn(m, k, dtype=f8), self.randn(n, k, dtype=f8)) for _ in range(nb)]
        return [lambda a=a, w=w: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                for a, w in sets], "cublaslt_scaled_mm"

    def _sdpa(self, backend, q, k, v, causal, gqa):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        kind = SDPBackend.FLASH_ATTENTION if backend == "sdpa_flash" else SDPBackend.CUDNN_ATTENTION
        with sdpa_kernel([kind]):
            return self.F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    def build_attn_prefill(self, r):
        torch = self.torch
        b, s, p, h, hk, d = r["batch"], r["seq_len"], r["kv_len"], r["num_heads"], r["num_kv_heads"], r["head_dim"]
        nb = self.n_buffers(working_set_bytes(r))
        # [B, S, H, D] storage viewed as [B, H, S, D], the layout serving engines keep.
        sets = [(self.randn(b, s, h, d).transpose(1, 2), self.randn(b, p + s, hk, d).transpose(1, 2),
                 self.randn(b, p + s, hk, d).transpose(1, 2)) for _ in range(nb)]
        be = r["backend"]
        if be == "sdpa_cudnn_masked":
            return self.packed_masked_attention(b, s, p, h, d, nb), be
        if be == "torch_eager_sinks":
            return self.eager_sinks_attention(s, p, h, hk, d), be
        if p == 0:
            fns = [lambda q=q, k=k, v=v: self._sdpa(be, q, k, v, True, h != hk) for q, k, v in sets]
            try:
                fns[0]()
                return fns, be
            except RuntimeError as exc:
                if h == hk:
                    raise
                log(f"    {be} refused GQA ({str(exc).splitlines()[0][:100]}); K/V expanded to {h} heads beforehand")
                sets = [(q, k.repeat_interleave(h // hk, dim=1), v.repeat_interleave(h // hk, dim=1)) for q, k, v in sets]
                return [lambda q=q, k=k, v=v: self._sdpa(be, q, k, v, True, False) for q, k, v in sets], be + "(kv_expanded)"
        # Cached prefix: the flash op's causal mask is bottom-right aligned when S_q < S_kv,
        # so query i attends the prefix and new tokens up to itself.
        flash = torch.ops.aten._scaled_dot_product_flash_attention
        fns = [lambda q=q, k=k, v=v: flash(q, k, v, 0.0, True, False)[0] for q, k, v in sets]
        try:
            fns[0]()
            return fns, "sdpa_flash"
        except RuntimeError as exc:
            if h == hk:
                raise
            log(f"    flash op refused GQA ({str(exc).splitlines()[0][:100]}); K/V expanded to {h} heads beforehand")
            sets = [(q, k.repeat_interleave(h // hk, dim=1), v.repeat_interleave(h // hk, dim=1)) for q, k, v in sets]
            return [lambda q=q, k=k, v=v: flash(q, k, v, 0.0, True, False)[0] for q, k, v in sets], "sdpa_flash(kv_expanded)"

    def eager_sinks_attention(self, s, p, h, hk, d):
        """transformers' `paged|eager` attention of a model with attention sinks (gpt-oss), as
        continuous batching runs it: s packed queries against p + s gathered keys of hk heads,
        repeat_kv to h heads, QK^T x scale, additive bf16 mask, concatenated per-head sink
        logit, max-subtract, softmax in the logits' dtype, the sink column sliced off (an
        unaligned view), PV, transpose. One buffer set: the scores dominate memory."""
        torch, F = self.torch, self.F
        n, g = p + s, h // hk
        q = self.randn(1, h, s, d)
        k, v = self.randn(1, hk, n, d), self.randn(1, hk, n, d)
        mask = torch.zeros(1, 1, s, n, device="cuda", dtype=torch.bfloat16)
        mask[..., s:] = float("-inf")
        sinks = self.randn(h)
        scale = d ** -0.5

        def run():
            kr = k[:, :, None].expand(-1, -1, g, -1, -1).reshape(1, h, n, d)
            vr = v[:, :, None].expand(-1, -1, g, -1, -1).reshape(1, h, n, d)
            w = torch.matmul(q, kr.transpose(2, 3)) * scale + mask
            logits = torch.cat([w, sinks.reshape(1, -1, 1, 1).expand(1, -1, s, -1)], dim=-1)
            logits = logits - logits.max(dim=-1, keepdim=True).values
            probs = F.softmax(logits, dim=-1, dtype=logits.dtype)[..., :-1]
            return torch.matmul(probs, vr).transpose(1, 2).contiguous()
        return [run]

    def packed_masked_attention(self, b, s, p, h, d, nb):
        """transformers' `paged|sdpa` attention: all scheduled queries packed into one sequence of
        s tokens against p + s gathered keys (KV heads already repeated, contiguous), with a dense
        additive bf16 mask [1, 1, s, p + s] and is_causal=False. The mask holds a block-diagonal
        causal pattern of `b` packed requests; cuDNN reads it whole, so its values do not change
        the work."""
        torch = self.torch
        n = p + s
        qi = torch.arange(s, device="cuda")[:, None]
        kj = torch.arange(n, device="cuda")[None, :]
        per_q, per_k = max(s // b, 1), max(n // b, 1)
        allowed = (kj // per_k == torch.clamp(qi // per_q, max=b - 1)) & (kj % per_k <= (p // b) + qi % per_q)
        mask = torch.zeros(1, 1, s, n, device="cuda", dtype=torch.bfloat16)
        mask.masked_fill_(~allowed, torch.finfo(torch.bfloat16).min)
        sets = [(self.randn(1, h, s, d), self.randn(1, h, n, d), self.randn(1, h, n, d)) for _ in range(nb)]
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def run(q, k, v):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return self.F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
        return [lambda q=q, k=k, v=v: run(q, k, v) for q, k, v in sets]

    def build_attn_decode(self, r):
        b, kv, h, hk, d = r["batch"], r["kv_len"], r["num_heads"], r["num_kv_heads"], r["head_dim"]
        nb = self.n_buffers(working_set_bytes(r))
        if r["backend"] == "sdpa_flash":
            sets = [(self.randn(b, 1, h, d).transpose(1, 2), self.randn(b, kv, hk, d).transpose(1, 2),
                     self.randn(b, kv, hk, d).transpose(1, 2)) for _ in range(nb)]
            return [lambda q=q, k=k, v=v: self._sdpa("sdpa_flash", q, k, v, False, h != hk) for q, k, v in sets], "sdpa_flash(dense)"
        sets = [self.paged_inputs(b, kv, h, hk, d, seed_offset=i) for i in range(nb)]
        return [lambda s=s: self.paged_decode(*s) for s in sets], f"triton_paged(page={PAGE_SIZE})"

    def paged_inputs(self, b, kv, h, hk, d, seed_offset=0):
        """Paged KV cache [blocks, PAGE, Hkv, D] with a random block table (pages scattered)."""
        torch = self.torch
        pages = math.ceil(kv / PAGE_SIZE)
        nblocks = b * pages
        kc = self.randn(nblocks, PAGE_SIZE, hk, d)
        vc = self.randn(nblocks, PAGE_SIZE, hk, d)
        gen = torch.Generator(device="cpu").manual_seed(self.seed + seed_offset)
        table = torch.randperm(nblocks, generator=gen).view(b, pages).to(self.dev, torch.int32)
        lens = torch.full((b,), kv, device=self.dev, dtype=torch.int32)
        q = self.randn(b, h, d)
        n_sm = torch.cuda.get_device_properties(self.dev).multi_processor_count
        splits = max(1, min(math.ceil(2 * n_sm / (b * hk)), math.ceil(kv / 256), 64))
        per_split = math.ceil(math.ceil(kv / splits) / 64) * 64
        splits = math.ceil(kv / per_split)
        o_part = torch.empty(b, h, splits, d, device=self.dev, dtype=torch.float32)
        lse = torch.empty(b, h, splits, device=self.dev, dtype=torch.float32)
        out = torch.empty(b, h, d, device=self.dev, dtype=torch.bfloat16)
        return q, kc, vc, table, lens, o_part, lse, out, splits, per_split

    def paged_decode(self, q, kc, vc, table, lens, o_part, lse, out, splits, per_split):
        b, h, d = q.shape
        hk = kc.shape[2]
        g = h // hk
        _paged_decode_kernel[(b, hk, splits)](
            q, kc, vc, table, lens, o_part, lse, 1.0 / math.sqrt(d),
            q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2), table.stride(0),
            o_part.stride(0), o_part.stride(1), o_part.stride(2), lse.stride(0), lse.stride(1),
            per_split, G=g, G_PAD=max(16, next_pow2(g)), D=d, PAGE=PAGE_SIZE, BLOCK_N=64, num_warps=4)
        _paged_decode_reduce[(b, h)](
            o_part, lse, out, splits, o_part.stride(0), o_part.stride(1), o_part.stride(2),
            lse.stride(0), lse.stride(1), out.stride(0), out.stride(1), D=d, SPLITS=max(2, next_pow2(splits)))
        return out

    def routing(self, r, seed):
        """Top-k expert ids [T, K] (int64, global ids) and weights [T, K] (fp32) on the device."""
        torch = self.torch
        t, e, kk = r["num_tokens"], r["num_experts"], r["topk"]
        gen = torch.Generator(device="cpu").manual_seed(seed)
        if r["routing"] == "balanced":
            ids = (torch.arange(t)[:, None] * kk + torch.arange(kk)[None, :]) % e
        elif r["routing"] == "uniform":  # k distinct experts per token, every expert equally likely
            ids = torch.rand(t, e, generator=gen).argsort(dim=1)[:, :kk]
        elif r["routing"].startswith("power_law_loads_"):
            ids = self.power_law_loads_ids(t, e, kk, max(r["ep"], 1), float(r["routing"][len("power_law_loads_"):]), gen)
        else:  # power law over a random expert ranking, k distinct experts per token
            prob = (torch.arange(e, dtype=torch.float64) + 1) ** -1.2
            prob = prob[torch.randperm(e, generator=gen)]
            ids = torch.multinomial(prob.expand(t, e), kk, replacement=False, generator=gen)
        w = torch.softmax(torch.randn(t, kk, generator=gen), dim=-1)
        return ids.to(self.dev), w.to(self.dev)

    def power_law_loads_ids(self, t, e, kk, ep, alpha, gen):
        """aiconfigurator's power-law routing (its collector's `_generate_power_law_distribution`,
        reimplemented): per-expert counts drawn from a power law bounded to [1, 0.8 T] ([0.01, 2]
        when T*k <= E), scaled to T*k and rounded, the shortfall added one each to the largest
        (ties in random order), the busiest shard of E/ep experts swapped to experts [0, E/ep)
        (the ones this GPU holds). Each token takes its picks from that list and keeps k distinct
        experts; repeats are replaced by experts it had none of, at random."""
        torch = self.torch
        lo, hi = (1.0, 0.8 * t) if t * kk > e else (0.01, 2.0)
        u = torch.rand(e, generator=gen, dtype=torch.float64)
        a = 1.0 - alpha
        x = ((hi ** a - lo ** a) * u + lo ** a) ** (1.0 / a) if abs(a) > 1e-9 else lo * (hi / lo) ** u
        counts = torch.round(x / x.sum() * t * kk).to(torch.int64)
        order = torch.randperm(e, generator=gen)
        order = order[torch.argsort(counts[order], descending=True, stable=True)]
        delta = t * kk - int(counts.sum())
        for i in range(abs(delta)):
            if delta > 0:
                counts[order[i % e]] += 1
            else:
                pos = [j for j in order.flip(0).tolist() if counts[j] > 0]
                counts[pos[0]] -= 1
        per = e // ep
        shards = counts.view(ep, per).sum(dim=1)
        busiest = int(torch.argmax(shards))
        if busiest:
            c = counts.view(ep, per).clone()
            c[[0, busiest]] = c[[busiest, 0]]
            counts = c.view(-1)
        by_load = torch.argsort(counts, descending=True, stable=True)
        flat = torch.repeat_interleave(by_load, counts[by_load])
        picks = flat.view(kk, t).T.tolist()
        ids = []
        for row in picks:
            seen = list(dict.fromkeys(row))
            if len(seen) < kk:
                spare = [j for j in torch.randperm(e, generator=gen).tolist() if j not in set(seen)]
                seen += spare[: kk - len(seen)]
            ids.append(seen)
        return torch.tensor(ids, dtype=torch.int64)

    def build_moe(self, r):
        if r["backend"] == "hf_grouped_mm":
            return [self.hf_experts(r)], "hf_grouped_mm(transformers grouped_mm_experts_forward)"
        if r["backend"] == HF_EXPERTS_PAD64:
            return [self.hf_experts(r, pad_to=GRAPH_Q_PAD)], f"{HF_EXPERTS_PAD64}(grouped_mm_experts_forward, rows padded to {GRAPH_Q_PAD}x, one shared pad token)"
        t, hd = r["num_tokens"], r["hidden"]
        tp, ep = max(r["tp"], 1), max(r["ep"], 1)
        el, inter = r["num_experts"] // ep, r["inter"] // tp
        # Expert weights stored [E, N, K] (nn.Linear layout) and passed transposed.
        w13 = self.randn(el, 2 * inter, hd, scale=0.05)
        w2 = self.randn(el, hd, inter, scale=0.05)
        x = self.randn(t, hd)
        ids, wts = self.routing(r, self.seed)
        local = ids < el  # this GPU holds experts [0, el) of the global set
        n_local = int(local.sum().item())  # known from the fixed routing: no sync while timed
        if n_local == 0:
            raise RuntimeError("no token routed to this GPU's experts")
        return [lambda: self.moe_forward(x, w13, w2, ids, wts, el, inter, n_local)], "grouped_mm(torch._grouped_mm)"

    def hf_experts(self, r, w13=None, w2=None, x=None, pad_to=None):
        """transformers' own experts forward as continuous batching runs it (`grouped_mm`
        implementation: sort by expert, histc offsets, sentinel masks, two grouped GEMMs, gate,
        routing weights, inverse permutation, per-token sum), on a Qwen3-MoE experts module of
        the row's sizes; returns the closure (weights and inputs random unless given). pad_to:
        the rows are padded up to a multiple of it with one repeated token and its routing, as
        CUDA-graph padding rows are (they all carry one token id)."""
        torch = self.torch
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts
        cfg = Qwen3MoeConfig(hidden_size=r["hidden"], moe_intermediate_size=r["inter"], num_experts=r["num_experts"],
                             num_experts_per_tok=r["topk"], hidden_act="silu")
        cfg._experts_implementation = "grouped_mm"
        mod = Qwen3MoeExperts(cfg).to(device=self.dev, dtype=torch.bfloat16)
        e, inter, hd = r["num_experts"], r["inter"], r["hidden"]
        mod.gate_up_proj.data = self.randn(e, 2 * inter, hd, scale=0.05) if w13 is None else w13
        mod.down_proj.data = self.randn(e, hd, inter, scale=0.05) if w2 is None else w2
        x = self.randn(r["num_tokens"], hd) if x is None else x
        ids, wts = self.routing(r, self.seed)
        if pad_to:
            pad = -r["num_tokens"] % pad_to
            one = self.routing({**r, "num_tokens": 1}, self.seed + 1)
            x = torch.cat([x, self.randn(1, hd).expand(pad, hd)])
            ids, wts = torch.cat([ids, one[0].expand(pad, -1)]), torch.cat([wts, one[1].expand(pad, -1)])
        wts = wts.to(torch.bfloat16)
        return lambda: mod(x, ids, wts)

    def moe_forward(self, x, w13, w2, ids, wts, el, inter, n_local):
        torch = self.torch
        kk = ids.shape[1]
        flat = ids.reshape(-1)
        key = torch.where(flat < el, flat, el)  # other GPUs' experts sort last and are dropped
        order = torch.argsort(key, stable=True)[:n_local]
        counts = torch.zeros(el + 1, device=x.device, dtype=torch.int32).scatter_add_(
            0, key, torch.ones_like(key, dtype=torch.int32))
        offs = torch.cumsum(counts[:el], 0, dtype=torch.int32)
        tok = order // kk
        h13 = torch._grouped_mm(x[tok], w13.transpose(-2, -1), offs=offs)
        act = torch.empty(n_local, inter, device=x.device, dtype=x.dtype)
        silu_mul(h13, act)
        y = torch._grouped_mm(act, w2.transpose(-2, -1), offs=offs)
        y = y * wts.reshape(-1)[order, None].to(y.dtype)
        return torch.zeros_like(x).index_add_(0, tok, y)

    def build_moe_router(self, r):
        torch = self.torch
        t, hd, e, kk = r["num_tokens"], r["hidden"], r["num_experts"], r["topk"]
        nb = self.n_buffers(working_set_bytes(r))
        sets = [(self.randn(t, hd), self.randn(e, hd, scale=0.05)) for _ in range(nb)]

        def route(x, w):
            p = torch.softmax(self.F.linear(x, w).float(), dim=-1)
            tw, ti = torch.topk(p, kk, dim=-1)
            return tw / tw.sum(-1, keepdim=True), ti
        return [lambda x=x, w=w: route(x, w) for x, w in sets], "torch(linear+softmax+topk)"

    def build_rmsnorm(self, r, fused=False):
        if r["backend"] == HF_MODULES:
            return self.hf_modules_norm(r, fused)
        torch = self.torch
        t, hd = r["num_tokens"], r["hidden"]
        nb = self.n_buffers(working_set_bytes(r))
        w = self.randn(hd)
        sets = [(self.randn(t, hd), self.randn(t, hd), torch.empty(t, hd, device=self.dev, dtype=torch.bfloat16),
                 torch.empty(t, hd, device=self.dev, dtype=torch.bfloat16)) for _ in range(nb)]
        return [lambda s=s: rmsnorm(s[0], w, s[2], s[1] if fused else None, s[3]) for s in sets], "triton"

    def build_fused_add_rmsnorm(self, r):
        return self.build_rmsnorm(r, fused=True)

    def build_silu_mul(self, r):
        if r["backend"] == HF_MODULES:
            return self.hf_modules_act_mul(r)
        torch = self.torch
        t, hd = r["num_tokens"], r["hidden"]
        nb = self.n_buffers(working_set_bytes(r))
        sets = [(self.randn(t, 2 * hd), torch.empty(t, hd, device=self.dev, dtype=torch.bfloat16)) for _ in range(nb)]
        return [lambda x=x, o=o: silu_mul(x, o) for x, o in sets], "triton"

    def build_rope(self, r):
        if r["backend"] == HF_MODULES:
            return self.hf_modules_rope(r)
        torch = self.torch
        t, h, hk, d = r["num_tokens"], r["num_heads"], r["num_kv_heads"], r["head_dim"]
        nb = self.n_buffers(working_set_bytes(r))
        cache = rope_cache(torch, 8192, d, self.dev)
        sets = [(self.randn(t, h * d), self.randn(t, max(hk, 1) * d),
                 torch.randint(0, 8192, (t,), device=self.dev)) for _ in range(nb)]
        return [lambda q=q, k=k, pos=pos: rope(q, k, pos, cache, h, hk, d) for q, k, pos in sets], "triton(neox)"

    # transformers' own eager modules (modeling_llama, which Qwen3, Mistral and Mixtral copy), run
    # on the tensors and layouts the decoder layer hands them; each is several torch kernels.
    def hf_modules_norm(self, r, fused):
        """LlamaRMSNorm (fp32 cast, pow, mean, add eps, rsqrt, mul, cast, mul weight); fused: the
        decoder layer's residual add before it."""
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
        torch = self.torch
        t, hd = r["num_tokens"], r["hidden"]
        norm = LlamaRMSNorm(hd, eps=1e-6).to(self.dev, torch.bfloat16)
        with torch.no_grad():
            norm.weight.copy_(self.randn(hd))
        nb = self.n_buffers(working_set_bytes(r))
        sets = [(self.randn(1, t, hd), self.randn(1, t, hd)) for _ in range(nb)]
        if fused:
            return [lambda x=x, res=res, norm=norm: norm(res + x) for x, res in sets], "hf_modules(residual add+LlamaRMSNorm)"
        return [lambda x=x, norm=norm: norm(x) for x, _ in sets], "hf_modules(LlamaRMSNorm)"

    def hf_modules_act_mul(self, r):
        """LlamaMLP's act_fn(gate_proj(x)) * up_proj(x) on the two projections' outputs."""
        from transformers.activations import ACT2FN
        t, i = r["num_tokens"], r["hidden"]
        act = ACT2FN["silu"]
        nb = self.n_buffers(working_set_bytes(r))
        sets = [(self.randn(1, t, i), self.randn(1, t, i)) for _ in range(nb)]
        return [lambda g=g, u=u: act(g) * u for g, u in sets], "hf_modules(silu*mul)"

    def hf_modules_rope(self, r):
        """apply_rotary_pos_emb on q and k as LlamaAttention passes them: [1, heads, t, d] views
        (transposes) of the projections' [1, t, heads, d] outputs, cos/sin [1, t, d]."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        torch = self.torch
        t, h, hk, d = r["num_tokens"], r["num_heads"], max(r["num_kv_heads"], 1), r["head_dim"]
        nb = self.n_buffers(working_set_bytes(r))
        cache = rope_cache(torch, 8192, d, self.dev)
        sets = []
        for _ in range(nb):
            pos = torch.randint(0, 8192, (t,), device=self.dev)
            cos, sin = cache[pos, : d // 2], cache[pos, d // 2:]  # HF's cos/sin repeat the half
            sets.append((self.randn(1, t, h, d).transpose(1, 2), self.randn(1, t, hk, d).transpose(1, 2),
                         torch.cat([cos, cos], -1)[None].to(torch.bfloat16), torch.cat([sin, sin], -1)[None].to(torch.bfloat16)))
        return [lambda q=q, k=k, c=c, s=s: apply_rotary_pos_emb(q, k, c, s) for q, k, c, s in sets], "hf_modules(apply_rotary_pos_emb)"

    def build_add(self, r):
        torch = self.torch
        t, hd = r["num_tokens"], r["hidden"]
        nb = self.n_buffers(working_set_bytes(r))
        sets = [(self.randn(t, hd), self.randn(t, hd), torch.empty(t, hd, device=self.dev, dtype=torch.bfloat16))
                for _ in range(nb)]
        return [lambda a=a, b=b, c=c: torch.add(a, b, out=c) for a, b, c in sets], "torch"

    def build_embedding(self, r):
        torch = self.torch
        t, hd, vocab = r["num_tokens"], r["hidden"], r["n"] or DEFAULT_VOCAB
        table = self.randn(vocab, hd)
        nb = self.n_buffers(2 * t * hd * 2)
        sets = [(torch.randint(0, vocab, (t,), device=self.dev),
                 torch.empty(t, hd, device=self.dev, dtype=torch.bfloat16)) for _ in range(nb)]
        return [lambda i=i, o=o: torch.index_select(table, 0, i, out=o) for i, o in sets], f"torch(index_select,vocab={vocab})"

    def build_sampling(self, r):
        torch = self.torch
        t, vocab, kk = r["num_tokens"], r["hidden"], r["topk"] or DEFAULT_SAMPLING_TOPK
        nb = self.n_buffers(working_set_bytes(r))
        sets = [self.randn(t, vocab, dtype=torch.float32, scale=3.0) for _ in range(nb)]

        def sample(logits):
            p = torch.softmax(logits, dim=-1)
            pv, pi = torch.topk(p, kk, dim=-1)
            # Exponential race (Gumbel-max): draws from the renormalised top-k without a host sync.
            choice = (pv / torch.empty_like(pv).exponential_()).argmax(dim=-1, keepdim=True)
            return pi.gather(-1, choice)
        return [lambda x=x: sample(x) for x in sets], f"torch(softmax+topk{kk}+sample)"

    def build_paged_kv_copy(self, r):
        """The KV movements of transformers' paged|sdpa (see PAGED_KV_COPIES), with random data and
        random cache positions."""
        torch = self.torch
        be = r["backend"]
        n = r["bytes"] // (2 * PAGED_KV_COPIES[be])  # tokens
        nb = self.n_buffers(working_set_bytes(r))
        if be == "torch_index_select":
            cache = self.randn(PAGED_KV_CACHE_TOKENS, KV_HEADS, KV_HEAD_DIM)
            idx = [torch.randint(0, PAGED_KV_CACHE_TOKENS, (n,), device=self.dev) for _ in range(nb)]
            return [lambda i=i: torch.index_select(cache, 0, i) for i in idx], be
        if be == "torch_index_copy":
            cache = self.randn(PAGED_KV_CACHE_TOKENS, KV_HEADS, KV_HEAD_DIM)
            sets = [(torch.randperm(PAGED_KV_CACHE_TOKENS, device=self.dev)[:n], self.randn(n, KV_HEADS, KV_HEAD_DIM)) for _ in range(nb)]
            return [lambda s=s, v=v: cache.index_copy_(0, s, v) for s, v in sets], be
        if be == "torch_repeat_kv":
            # [tokens, kv_heads, dim] -> [1, kv_heads, tokens, dim] view -> repeat to 4x heads.
            srcs = [self.randn(n, KV_HEADS, KV_HEAD_DIM) for _ in range(nb)]

            def repeat(x):
                x = x.transpose(0, 1).unsqueeze(0)
                return x[:, :, None].expand(1, KV_HEADS, KV_REPEAT, n, KV_HEAD_DIM).reshape(1, KV_HEADS * KV_REPEAT, n, KV_HEAD_DIM)
            return [lambda x=x: repeat(x) for x in srcs], be
        # masked_scatter_: 1 in 64 read slots are new tokens (a decode step's share).
        mask = (torch.rand(n, device=self.dev) < 1 / 64).view(n, 1, 1)
        new = int(mask.sum().item())
        sets = [(self.randn(n, KV_HEADS, KV_HEAD_DIM), self.randn(max(new, 1), KV_HEADS, KV_HEAD_DIM)) for _ in range(nb)]
        return [lambda d=d, s=s: d.masked_scatter_(mask, s) for d, s in sets], be

    def build_copy(self, r):
        torch = self.torch
        if r["backend"] in PAGED_KV_COPIES:
            return self.build_paged_kv_copy(r)
        nb = self.n_buffers(working_set_bytes(r))
        n = r["bytes"] // 2
        sets = [(self.randn(n), torch.empty(n, device=self.dev, dtype=torch.bfloat16)) for _ in range(nb)]
        # A contiguous same-dtype copy_ is a cudaMemcpyAsync (a memcpy node inside a graph).
        label = "torch_copy(eager memcpy)" if r["backend"] == "torch_copy_eager" else "torch_copy(graph memcpy node)"
        return [lambda s=s, d=d: d.copy_(s) for s, d in sets], label


def quantile(sorted_vals, q):
    pos = q * (len(sorted_vals) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def rmsnorm(x, w, out, residual=None, residual_out=None, eps=1e-6):
    t, h = x.shape
    block = next_pow2(h)
    _rmsnorm_kernel[(t,)](x, w, out, residual if residual is not None else x,
                          residual_out if residual is not None else x, h, eps,
                          FUSED_ADD=residual is not None, BLOCK=block, num_warps=min(16, max(4, block // 512)))
    return out


def silu_mul(x, out):
    t, h = out.shape
    total = t * h
    block = 1024
    _silu_mul_kernel[(triton.cdiv(total, block),)](x, out, h, total, BLOCK=block, num_warps=4)
    return out


def rope_cache(torch, max_pos, d, dev, base=10000.0):
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32, device=dev) / d))
    ang = torch.arange(max_pos, dtype=torch.float32, device=dev)[:, None] * inv[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=-1).contiguous()


def rope(q, k, pos, cache, nq, nk, d):
    _rope_kernel[(q.shape[0],)](q, k, pos, cache, nq, nk, D=d, HALF=d // 2, BLOCK_H=8, num_warps=4)


# ----------------------------------------------------------------------------- self-test

def rel_err(torch, out, ref):
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def self_test(gpu):
    """Checks each hand-written or composed kernel against a float reference on fresh random
    inputs; a backend that fails is skipped in the sweep. Returns {backend: error}."""
    torch, F = gpu.torch, gpu.F
    results = {}

    def check(name, fn, tol):
        try:
            err = fn()
        except Exception as exc:
            gpu.broken[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            results[name] = gpu.broken[name]
            return
        results[name] = err
        if not err <= tol:
            gpu.broken[name] = f"relative error {err:.2e} > {tol:.0e}"

    def t_rmsnorm(fused):
        x, res, w = gpu.randn(37, 4096), gpu.randn(37, 4096), gpu.randn(4096)
        out = torch.full_like(x, float("nan"))
        res_out = torch.full_like(x, float("nan"))
        rmsnorm(x, w, out, res if fused else None, res_out)
        xs = (x.double() + res.double()) if fused else x.double()
        ref = xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
        return max(rel_err(torch, out, ref), rel_err(torch, res_out, xs) if fused else 0.0)

    def t_silu():
        x = gpu.randn(29, 2 * 3000)
        out = torch.full((29, 3000), float("nan"), device=gpu.dev, dtype=torch.bfloat16)
        silu_mul(x, out)
        g, u = x.double()[:, :3000], x.double()[:, 3000:]
        return rel_err(torch, out, F.silu(g) * u)

    def t_rope():
        t, h, hk, d = 19, 12, 4, 128
        q, k = gpu.randn(t, h * d), gpu.randn(t, hk * d)
        pos = torch.randint(0, 8192, (t,), device=gpu.dev)
        cache = rope_cache(torch, 8192, d, gpu.dev)
        ref = []
        for x, nh in ((q, h), (k, hk)):
            xx = x.double().view(t, nh, d)
            cos, sin = cache[pos, : d // 2].double()[:, None, :], cache[pos, d // 2:].double()[:, None, :]
            x1, x2 = xx[..., : d // 2], xx[..., d // 2:]
            ref.append(torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).view(t, nh * d))
        rope(q, k, pos, cache, h, hk, d)
        return max(rel_err(torch, q, ref[0]), rel_err(torch, k, ref[1]))

    def t_hf_norm(fused):
        fn = gpu.hf_modules_norm({"op": "rmsnorm", "dtype": "bf16", "backend": HF_MODULES, "num_tokens": 37, "hidden": 4096}, fused)[0][0]
        x, res, norm = fn.__defaults__ if fused else (fn.__defaults__[0], None, fn.__defaults__[1])
        xs = (x.double() + res.double()) if fused else x.double()
        ref = xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight.double()
        return rel_err(torch, fn(), ref)

    def t_hf_act():
        fn = gpu.hf_modules_act_mul({"op": "silu_mul", "dtype": "bf16", "backend": HF_MODULES, "num_tokens": 29, "hidden": 3000})[0][0]
        g, u = fn.__defaults__
        return rel_err(torch, fn(), F.silu(g.double()) * u.double())

    def t_hf_rope():
        t, h, hk, d = 19, 12, 4, 128
        fn = gpu.hf_modules_rope({"op": "rope", "dtype": "bf16", "backend": HF_MODULES, "num_tokens": t, "num_heads": h, "num_kv_heads": hk, "head_dim": d})[0][0]
        q, k, cos, sin = fn.__defaults__
        qo, ko = fn()
        errs = []
        for x, o in ((q, qo), (k, ko)):
            xx = x.double()
            x1, x2 = xx[..., : d // 2], xx[..., d // 2:]
            c, s = cos.double()[:, None, :, : d // 2], sin.double()[:, None, :, : d // 2]
            errs.append(rel_err(torch, o, torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)))
        return max(errs)

    def t_paged(b, kv, h, hk, d):
        s = gpu.paged_inputs(b, kv, h, hk, d)
        q, kc, vc, table, lens = s[:5]
        s[7].fill_(float("nan"))
        out = gpu.paged_decode(*s)
        kd = kc[table.long()].reshape(b, -1, hk, d)[:, :kv].double().transpose(1, 2)
        vd = vc[table.long()].reshape(b, -1, hk, d)[:, :kv].double().transpose(1, 2)
        kd, vd = kd.repeat_interleave(h // hk, 1), vd.repeat_interleave(h // hk, 1)
        att = torch.softmax(q.double()[:, :, None, :] @ kd.transpose(-1, -2) / math.sqrt(d), -1)
        return rel_err(torch, out, (att @ vd)[:, :, 0])

    def t_prefill(backend, prefix):
        row = {"op": "attn_prefill", "backend": backend, "batch": 2, "seq_len": 200, "kv_len": prefix,
               "num_heads": 8, "num_kv_heads": 2, "head_dim": 128, "dtype": "bf16"}
        fns, _ = gpu.build_attn_prefill(row)
        return _prefill_ref_err(gpu, fns[0], prefix)

    def t_moe():
        r = {"op": "moe", "dtype": "bf16", "num_tokens": 50, "hidden": 256, "inter": 384, "topk": 4,
             "num_experts": 16, "tp": 1, "ep": 2, "routing": "power_law_1.2"}
        el, inter = 8, 384
        w13, w2, x = gpu.randn(el, 2 * inter, 256, scale=0.05), gpu.randn(el, 256, inter, scale=0.05), gpu.randn(50, 256)
        ids, wts = gpu.routing(r, 7)
        n_local = int((ids < el).sum().item())
        out = gpu.moe_forward(x, w13, w2, ids, wts, el, inter, n_local)
        ref = torch.zeros(50, 256, dtype=torch.float64, device=gpu.dev)
        for t in range(50):
            for j in range(4):
                e = int(ids[t, j])
                if e < el:
                    hh = w13[e].double() @ x[t].double()
                    a = F.silu(hh[:inter]) * hh[inter:]
                    ref[t] += wts[t, j].double() * (w2[e].double() @ a)
        return rel_err(torch, out, ref)

    def t_hf_moe():
        # transformers' experts forward against the collector's own MoE on the same weights.
        r = {"op": "moe", "dtype": "bf16", "num_tokens": 50, "hidden": 256, "inter": 384, "topk": 4,
             "num_experts": 8, "tp": 1, "ep": 1, "routing": "power_law_1.2"}
        w13, w2, x = gpu.randn(8, 768, 256, scale=0.05), gpu.randn(8, 256, 384, scale=0.05), gpu.randn(50, 256)
        out = gpu.hf_experts(r, w13, w2, x)()
        ids, wts = gpu.routing(r, gpu.seed)
        ref = gpu.moe_forward(x, w13, w2, ids, wts, 8, 384, ids.numel())
        return rel_err(torch, out, ref.double())

    def t_hf_moe_pad():
        # The padded forward's real rows against the collector's own MoE on those rows alone.
        r = {"op": "moe", "dtype": "bf16", "num_tokens": 5, "hidden": 256, "inter": 384, "topk": 4,
             "num_experts": 8, "tp": 1, "ep": 1, "routing": "power_law_1.2"}
        w13, w2, x = gpu.randn(8, 768, 256, scale=0.05), gpu.randn(8, 256, 384, scale=0.05), gpu.randn(5, 256)
        out = gpu.hf_experts(r, w13, w2, x, pad_to=GRAPH_Q_PAD)()
        if out.shape[0] != GRAPH_Q_PAD:
            raise RuntimeError(f"padded forward returned {out.shape[0]} rows, want {GRAPH_Q_PAD}")
        ids, wts = gpu.routing(r, gpu.seed)
        ref = gpu.moe_forward(x, w13, w2, ids, wts, 8, 384, ids.numel())
        return rel_err(torch, out[:5], ref.double())

    def t_fp8():
        a, w = gpu.randn(64, 512, dtype=torch.float8_e4m3fn), gpu.randn(256, 512, dtype=torch.float8_e4m3fn)
        one = torch.ones((), device=gpu.dev)
        out = torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return rel_err(torch, out, a.double() @ w.double().t())

    check("triton:rmsnorm", lambda: t_rmsnorm(False), 1e-2)
    check("triton:fused_add_rmsnorm", lambda: t_rmsnorm(True), 1e-2)
    check("triton:silu_mul", t_silu, 1e-2)
    check("triton:rope", t_rope, 1e-2)
    check("hf_modules:rmsnorm", lambda: t_hf_norm(False), 1e-2)
    check("hf_modules:fused_add_rmsnorm", lambda: t_hf_norm(True), 1e-2)
    check("hf_modules:silu_mul", t_hf_act, 1e-2)
    check("hf_modules:rope", t_hf_rope, 1e-2)
    check("triton_paged", lambda: max(t_paged(3, 1000, 32, 8, 128), t_paged(2, 77, 8, 1, 128),
                                      t_paged(1, 5000, 64, 8, 64)), 2e-2)
    check("sdpa_flash:prefix", lambda: t_prefill("sdpa_flash", 100), 2e-2)
    check("sdpa_flash", lambda: t_prefill("sdpa_flash", 0), 2e-2)
    check("sdpa_cudnn", lambda: t_prefill("sdpa_cudnn", 0), 2e-2)
    check("grouped_mm", t_moe, 2e-2)
    check("hf_grouped_mm", t_hf_moe, 2e-2)
    check(HF_EXPERTS_PAD64, t_hf_moe_pad, 2e-2)
    check("cublaslt_scaled_mm", t_fp8, 1e-2)
    return results


def _prefill_ref_err(gpu, fn, prefix):
    """Error of a causal prefill closure against a float64 reference on its own inputs (read
    back from the closure's default arguments); query i sees the prefix and new keys <= i."""
    torch = gpu.torch
    q, k, v = fn.__defaults__
    out = fn()
    h, hk, s = q.shape[1], k.shape[1], q.shape[2]
    kd, vd = k.double().repeat_interleave(h // hk, 1), v.double().repeat_interleave(h // hk, 1)
    mask = torch.ones(s, prefix + s, dtype=torch.bool, device=q.device).tril(diagonal=prefix)
    sc = (q.double() @ kd.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return rel_err(torch, out, torch.softmax(sc.masked_fill(~mask, float("-inf")), -1) @ vd)


def selftest_key(r):
    """Which self-test entry a row depends on (None: no hand-written or composed kernel)."""
    op, be = r["op"], r["backend"]
    if op in ("rmsnorm", "fused_add_rmsnorm", "silu_mul", "rope"):
        return ("hf_modules:" if be == HF_MODULES else "triton:") + op
    if op == "attn_decode" and be == "triton_paged":
        return "triton_paged"
    if op == "attn_prefill":
        return "sdpa_flash:prefix" if r["kv_len"] else be
    if op == "moe":
        return be
    if op == "gemm" and r["dtype"] == "fp8":
        return "cublaslt_scaled_mm"
    return None


# ----------------------------------------------------------------------------- collectives

def time_collective(torch, dist, r, rank, world):
    n = world
    numel = r["bytes"] // 2
    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.randn(numel, device=dev, dtype=torch.float32).to(torch.bfloat16)
    op = r["op"]
    if op == "all_reduce":
        fn = lambda: dist.all_reduce(x)
    elif op == "all_gather":
        part = x[: numel // n].clone()
        fn = lambda: dist.all_gather_into_tensor(x, part)
    elif op == "reduce_scatter":
        part = torch.empty(numel // n, device=dev, dtype=torch.bfloat16)
        fn = lambda: dist.reduce_scatter_tensor(part, x)
    elif op == "all_to_all":
        out = torch.empty_like(x)
        fn = lambda: dist.all_to_all_single(out, x)
    else:  # p2p: every rank sends its message to the next and receives from the previous
        out = torch.empty_like(x)

        def fn():
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, (rank + 1) % n),
                                           dist.P2POp(dist.irecv, out, (rank - 1) % n)])
            for q in reqs:
                q.wait()
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(5):
        fn()
    e.record()
    e.synchronize()
    est_us = s.elapsed_time(e) * 1000 / 5
    # Both ranks must loop the same number of times: take rank 0's choice.
    launches = torch.tensor([max(1, min(64, math.ceil(1000.0 / max(est_us, 1.0))))], device=dev)
    dist.broadcast(launches, 0)
    launches = int(launches.item())

    def eager():
        for _ in range(launches):
            fn()
    # Graph replay removes the host cost of each torch.distributed call (tens of us), which
    # would otherwise be timed instead of the small-message latency. Both ranks agree on it.
    ok, g = 1, None
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            eager()
    except Exception as exc:
        ok, g = 0, None
        log(f"    graph capture of {op} failed ({type(exc).__name__}); timing eagerly")
    torch.cuda.synchronize()
    agree = torch.tensor([ok], device=dev)
    dist.all_reduce(agree, op=dist.ReduceOp.MIN)
    replay, method = (g.replay, "cuda_graph") if int(agree.item()) else (eager, "events")
    for _ in range(2):
        replay()
    torch.cuda.synchronize()
    reps = 25
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    dist.barrier()
    for i in range(reps):
        starts[i].record()
        replay()
        ends[i].record()
    torch.cuda.synchronize()
    per = sorted(starts[i].elapsed_time(ends[i]) * 1000 / launches for i in range(reps))
    # Report the slower rank's median (a collective ends when its last rank ends).
    med = torch.tensor([quantile(per, 0.5), quantile(per, 0.1), quantile(per, 0.9)], device=dev)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    m, p10, p90 = med.tolist()
    return {"latency_us": m, "p10_us": p10, "p90_us": p90, "reps": reps, "launches_per_rep": launches,
            "method": method}


def check_all_reduce(torch, dist, rank, world):
    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.full((1 << 20,), float(rank + 1), device=dev, dtype=torch.float32)
    dist.all_reduce(x)
    want = world * (world + 1) / 2
    return bool((x == want).all().item())


# ----------------------------------------------------------------------------- provenance

SMI_FIELDS = ["name", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
              "power.limit", "power.draw", "temperature.gpu", "pstate", "clocks_event_reasons.active"]


def smi_snapshot():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=" + ",".join(SMI_FIELDS), "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}
    if out.returncode != 0:
        return {"error": out.stderr.strip()[:300]}
    gpus = []
    for line in out.stdout.strip().splitlines():
        vals = [v.strip() for v in line.split(",")]
        gpus.append(dict(zip(SMI_FIELDS, vals)))
    return {"time_utc": now_utc(), "gpus": gpus}


def start_smi_monitor(path):
    """Samples clocks, power and temperature every second for the whole run (nvidia-smi -lms)."""
    try:
        f = open(path, "w")
        proc = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu",
                                 "--format=csv,noheader,nounits", "-lms", "1000"], stdout=f, stderr=subprocess.DEVNULL)
        return proc, f
    except OSError:
        return None, None


def summarize_smi(path):
    """Per-GPU SM clock and power over the run, from the monitor's samples."""
    per = {}
    try:
        with open(path) as f:
            for line in f:
                v = [x.strip() for x in line.split(",")]
                try:
                    per.setdefault(v[1], ([], []))
                    per[v[1]][0].append(float(v[2]))
                    per[v[1]][1].append(float(v[4]))
                except (ValueError, IndexError):
                    pass
    except OSError:
        return None
    out = {}
    for idx, (sm, power) in sorted(per.items()):
        sm.sort()
        power.sort()
        out["gpu" + idx] = {"samples": len(sm), "sm_mhz_min": sm[0], "sm_mhz_median": quantile(sm, 0.5),
                            "sm_mhz_max": sm[-1], "power_w_median": quantile(power, 0.5), "power_w_max": power[-1]}
    return out or None


def now_utc():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def versions(torch):
    v = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
         "cudnn": torch.backends.cudnn.version(), "triton": getattr(triton, "__version__", None)}
    try:
        v["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception:
        v["nccl"] = None
    return v


# ----------------------------------------------------------------------------- main

LOG_FILE = None
QUIET = False  # non-lead ranks of a collective run stay silent


def log(msg):
    if QUIET:
        return
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    if LOG_FILE:
        LOG_FILE.write(line + "\n")
        LOG_FILE.flush()


def fmt(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def output_row(r, res, gpu_id, source, backend, busbw=None):
    out = {c: "" for c in OUTPUT_COLUMNS}
    out["op"], out["dtype"] = r["op"], r["dtype"]
    for name in NUMERIC:
        out[name] = r[name] if r[name] else ""
    lat = res["latency_us"]
    for key in ("latency_us", "p10_us", "p90_us"):
        out[key] = f"{res[key]:.4f}"
    out["reps"], out["launches_per_rep"], out["method"] = res["reps"], res["launches_per_rep"], res["method"]
    fl, by = flops(r), hbm_bytes(r)
    out["achieved_tflops"] = f"{fl / lat / 1e6:.4f}" if fl else ""
    out["achieved_tbps"] = f"{by / lat / 1e6:.5f}" if by else ""
    out["busbw_gbps"] = f"{busbw:.3f}" if busbw is not None else ""
    out["backend"], out["gpu"], out["source"], out["routing"] = backend, gpu_id, source, r["routing"]
    return out


def spec_anchors(gpu_id):
    """(dense bf16 TFLOP/s, DRAM TB/s) from the GPU's spec sheet `hw_specs/<gpu_id>.toml`, or None."""
    import tomllib
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hw_specs", f"{gpu_id}.toml")
    try:
        with open(path, "rb") as f:
            spec = tomllib.load(f)
        return float(spec["peak"]["bf16_tflops"]), float(spec["memory"]["hbm_bandwidth_tbps"])
    except (OSError, KeyError, ValueError, tomllib.TOMLDecodeError):
        return None


def sanity(rows_out, gpu_id):
    """Flags from the two anchors, against the GPU's spec sheet: the 8192^3 bf16 GEMM at 60-100 % of
    dense bf16 peak (the H200's 594-989 TFLOP/s), the best copy of >= 1 GiB (read + write bytes over
    time) at 73-100 % of DRAM bandwidth (the H200's 3.5-4.8 TB/s). A GPU without a spec sheet gets none."""
    flags = {}
    anchors = spec_anchors(gpu_id)
    if anchors is None:
        return flags
    peak_tflops, bw_tbps = anchors
    g = [o for o in rows_out if o["op"] == "gemm" and o["dtype"] == "bf16" and o["m"] == o["n"] == o["k"] == 8192]
    if g:
        v = float(g[0]["achieved_tflops"])
        lo, hi = round(0.6 * peak_tflops), peak_tflops
        flags["gemm_8192_bf16_tflops"] = {"value": v, "range": [lo, hi], "ok": lo <= v <= hi}
    c = [o for o in rows_out if o["op"] == "copy" and int(o["bytes"]) >= 1 << 30]
    if c:
        best = max(c, key=lambda o: float(o["achieved_tbps"]))
        v = float(best["achieved_tbps"])
        lo, hi = round(0.73 * bw_tbps, 2), bw_tbps
        flags["copy_tbps"] = {"bytes": int(best["bytes"]), "backend": best["backend"], "value": v,
                              "range": [lo, hi], "ok": lo <= v <= hi,
                              "all_ge_1GiB": {f"{o['bytes']} {o['backend']}": float(o["achieved_tbps"]) for o in c}}
    return flags


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", required=True, help="plan CSV (kernelsight microbench plan)")
    ap.add_argument("--out", help="output CSV; sidecars <out>.provenance.json, <out>.log, <out>.smi.csv")
    ap.add_argument("--validate-only", action="store_true", help="check the plan and exit (no GPU)")
    ap.add_argument("--estimate", action="store_true", help="print a rough run time per op and exit (no GPU)")
    ap.add_argument("--ops", help="comma-separated ops to run (default: all the plan has)")
    ap.add_argument("--sample", type=int, default=0,
                    help="run only this many evenly spaced rows per (op, backend, dtype): a smoke test")
    ap.add_argument("--time-budget-s", type=float, default=0, help="stop starting new rows after this many seconds")
    ap.add_argument("--gpu", help="GPU id written in the gpu column (default: from the device name)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-selftest", action="store_true")
    args = ap.parse_args()

    try:
        rows = read_plan(args.plan)
        if args.ops:
            wanted = [o.strip() for o in args.ops.split(",") if o.strip()]
            bad = [o for o in wanted if o not in OPS]
            if bad:
                raise PlanError(f"--ops: unknown op(s) {', '.join(bad)}; allowed: {', '.join(OPS)}")
            rows = [x for x in rows if x[1]["op"] in wanted]
        if args.sample:
            groups = {}
            for x in rows:
                groups.setdefault((x[1]["op"], x[1]["backend"], x[1]["dtype"]), []).append(x)
            keep = set()
            for g in groups.values():
                n = min(args.sample, len(g))
                keep.update(g[round(i * (len(g) - 1) / max(n - 1, 1))][0] for i in range(n))
            rows = [x for x in rows if x[0] in keep]
    except PlanError as e:
        print(f"error: invalid plan\n{e}", file=sys.stderr)
        return 2
    if args.validate_only or args.estimate:
        print(f"{args.plan}: {len(rows)} rows valid")
        if args.estimate:
            per = estimate_seconds(rows)
            for op, s in sorted(per.items(), key=lambda x: -x[1]):
                print(f"  {op:20s} {s:8.1f} s")
            print(f"  {'total':20s} {sum(per.values()):8.1f} s")
        return 0
    if not args.out:
        print("error: --out is required to run the plan", file=sys.stderr)
        return 2
    return run(args, rows)


def run(args, rows):
    global LOG_FILE, QUIET
    # NVLink multicast stays off (KINDS.md: it can take a shared host's GPUs out of service).
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
    import torch
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dist = None
    if world > 1:
        import torch.distributed as dist
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    lead = rank == 0
    QUIET = not lead
    # A collective run measures the collective rows only; a single-GPU run everything else.
    n_plan = len(rows)
    rows = [x for x in rows if (x[1]["op"] in COLLECTIVES) == (world > 1)]
    left_out = n_plan - len(rows)
    base = args.out[:-4] if args.out.endswith(".csv") else args.out
    if lead:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        LOG_FILE = open(base + ".log", "w")
    t0 = time.time()
    name = torch.cuda.get_device_name()
    gpu_id = args.gpu or GPU_IDS.get(name, name.lower().replace(" ", "_"))
    source = "kernelsight-collect " + datetime.date.today().isoformat()
    torch.manual_seed(args.seed + rank)
    prov = {
        "status": "running", "gpu_id": gpu_id, "device_name": name, "world_size": world,
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "plan": args.plan, "plan_sha256": sha256(args.plan), "rows_in_plan": n_plan,
        "rows_for_other_world_size": left_out,
        "start_utc": now_utc(), "versions": versions(torch),
        "device": {"sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
                   "l2_bytes": getattr(torch.cuda.get_device_properties(0), "L2_cache_size", None),
                   "memory_bytes": torch.cuda.get_device_properties(0).total_memory},
        "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                               "NVSHMEM_DISABLE_NVLS", "CUDA_VISIBLE_DEVICES")},
        "smi_before": smi_snapshot() if lead else None,
        "method": {"timing": "CUDA-graph replay of N launches over rotated input sets, CUDA events per replay; "
                             "median of reps (20-50) of per-launch time; p10/p90 over the same reps",
                   "rotate_bytes": Gpu.ROTATE_BYTES, "max_buffers": Gpu.MAX_BUFFERS,
                   "target_replay_us": Gpu.TARGET_REPLAY_US, "seed": args.seed},
    }

    def write_prov():
        if lead:
            with open(base + ".provenance.json", "w") as f:
                json.dump(prov, f, indent=1)
    write_prov()
    smi_proc, smi_file = start_smi_monitor(base + ".smi.csv") if lead else (None, None)

    gpu = Gpu(torch, args.seed)
    if world == 1 and not args.no_selftest and any(x[1]["op"] not in COLLECTIVES for x in rows):
        res = self_test(gpu)
        prov["self_test"] = {k: (v if isinstance(v, str) else float(f"{v:.3e}")) for k, v in res.items()}
        for k, v in res.items():
            log(f"self-test {k:28s} {'FAILED ' + gpu.broken[k] if k in gpu.broken else f'ok (rel err {v:.1e})'}")
    if world > 1:
        ok = check_all_reduce(torch, dist, rank, world)
        prov["self_test"] = {"nccl_all_reduce_sum": ok}
        if lead:
            topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True)
            prov["topology"] = topo.stdout.strip().splitlines()
        log(f"self-test nccl all_reduce sum: {'ok' if ok else 'FAILED'}")

    out_rows, skipped = [], []
    fout = open(args.out, "w", newline="") if lead else None
    writer = csv.DictWriter(fout, fieldnames=OUTPUT_COLUMNS) if lead else None
    if lead:
        writer.writeheader()
        fout.flush()
    stopped = None
    for idx, (line, r) in enumerate(rows):
        is_coll = r["op"] in COLLECTIVES
        if is_coll and r["num_gpus"] != world:
            skipped.append({"line": line, "op": r["op"], "reason": f"needs {r['num_gpus']} GPUs, this run has {world}"})
            continue
        over = bool(args.time_budget_s) and time.time() - t0 > args.time_budget_s
        if dist is not None:  # every rank must stop at the same row
            flag = torch.tensor([int(over)], device="cuda")
            dist.broadcast(flag, 0)
            over = bool(flag.item())
        if over:
            stopped = f"time budget of {args.time_budget_s:.0f} s reached at plan line {line}"
            break
        key = selftest_key(r)
        if key in gpu.broken:
            skipped.append({"line": line, "op": r["op"], "reason": f"self-test failed for {key}: {gpu.broken[key]}"})
            continue
        desc = f"line {line} {r['op']} {r['dtype']} " + " ".join(f"{n}={r[n]}" for n in NUMERIC if r[n])
        try:
            if is_coll:
                res = time_collective(torch, dist, r, rank, world)
                backend = "nccl " + prov["versions"]["nccl"] if prov["versions"]["nccl"] else "nccl"
                algbw = r["bytes"] / (res["latency_us"] * 1e-6) / 1e9
                busbw = algbw * bus_factor(r["op"], world)
            else:
                torch.manual_seed(args.seed + line)
                fns, backend = gpu.build(r)
                res = gpu.time(fns, graph=not r["backend"].endswith("_eager"))
                busbw = None
                del fns
        except torch.cuda.OutOfMemoryError as exc:
            skipped.append({"line": line, "op": r["op"], "reason": "out of memory"})
            log(f"SKIP {desc}: out of memory ({str(exc).splitlines()[0][:100]})")
            torch.cuda.empty_cache()
            continue
        except Exception as exc:
            msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            skipped.append({"line": line, "op": r["op"], "reason": msg})
            log(f"SKIP {desc}: {msg}")
            if "CUDA error" in msg or "illegal" in msg.lower() or is_coll:
                stopped = f"fatal error at plan line {line}: {msg}"
                break
            torch.cuda.synchronize()
            continue
        if lead:
            o = output_row(r, res, gpu_id, source, backend, busbw)
            writer.writerow(o)
            fout.flush()
            out_rows.append(o)
            rate = (f"{o['achieved_tflops']} TFLOP/s " if o["achieved_tflops"] else "") + (f"{o['achieved_tbps']} TB/s" if o["achieved_tbps"] else "")
            if busbw is not None:
                rate += f" busbw {busbw:.1f} GB/s"
            log(f"{idx + 1}/{len(rows)} {desc} [{backend}] {res['latency_us']:.2f} us (p10 {res['p10_us']:.2f}, p90 {res['p90_us']:.2f}) {rate}")
        if torch.cuda.memory_reserved() > 40e9:
            torch.cuda.empty_cache()
        if idx % 50 == 0:
            prov["rows_measured"] = len(out_rows)
            write_prov()
    if lead:
        fout.close()
    if smi_proc is not None:
        smi_proc.terminate()
        smi_proc.wait()
        smi_file.close()
    prov.update({"status": "stopped: " + stopped if stopped else "complete", "end_utc": now_utc(),
                 "wall_s": round(time.time() - t0, 1), "rows_measured": len(out_rows),
                 "rows_skipped": len(skipped), "skipped": skipped[:500],
                 "smi_after": smi_snapshot() if lead else None,
                 "smi_during": summarize_smi(base + ".smi.csv") if lead else None,
                 "sanity": sanity(out_rows, gpu_id)})
    write_prov()
    if lead:
        for k, v in prov["sanity"].items():
            log(f"sanity {k}: {v['value']:.3f} (range {v['range']}) {'ok' if v['ok'] else 'FLAGGED'}")
        log(f"done: {len(out_rows)} rows measured, {len(skipped)} skipped, {prov['wall_s']} s; status {prov['status']}")
    if dist is not None:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

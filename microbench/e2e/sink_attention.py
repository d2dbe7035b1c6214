#!/usr/bin/env python3
"""GPU time of gpt-oss's eager attention with sinks, as transformers runs it in continuous batching
(SDPA takes no sinks, so `paged|eager` runs the math path: repeat_kv, QK^T, mask add, sink concat,
max-subtract, fp32-dtype softmax, slice, PV, transpose) at the packed, padded shapes of a CUDA-graph
step: batch 1, q queries (a multiple of 64) against q + kv keys (kv a multiple of 16,384).

Per shape: median of CUDA-event timings over 30 replays (random bf16 data, 5 warm-ups), and the
per-kernel split of one call from torch.profiler. Writes $OUT/sink_attention.csv and .json.
Usage: python3 microbench/e2e/sink_attention.py --out $OUT
"""
import argparse
import csv
import json
import os
import statistics

import torch
import torch.nn.functional as F

HEADS, KV_HEADS, HEAD_DIM = 64, 8, 64  # gpt-oss-20b
SHAPES = [(q, kv) for kv in (16384, 32768) for q in (64, 128, 512, 2048)]


def eager_sinks(query, key, value, mask, sinks, scaling):
    groups = HEADS // KV_HEADS
    k = key[:, :, None].expand(-1, -1, groups, -1, -1).reshape(1, HEADS, key.shape[-2], HEAD_DIM)
    v = value[:, :, None].expand(-1, -1, groups, -1, -1).reshape(1, HEADS, value.shape[-2], HEAD_DIM)
    w = torch.matmul(query, k.transpose(2, 3)) * scaling
    w = w + mask
    s = sinks.reshape(1, -1, 1, 1).expand(1, -1, query.shape[-2], -1)
    logits = torch.cat([w, s], dim=-1)
    logits = logits - logits.max(dim=-1, keepdim=True).values
    probs = F.softmax(logits, dim=-1, dtype=logits.dtype)[..., :-1]
    return torch.matmul(probs, v).transpose(1, 2).contiguous()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    rows, kernels = [], {}
    for q, kv in SHAPES:
        keys = q + kv
        query = torch.randn(1, HEADS, q, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
        key = torch.randn(1, KV_HEADS, keys, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
        value = torch.randn_like(key)
        mask = torch.zeros(1, 1, q, keys, dtype=torch.bfloat16, device="cuda")
        mask[..., q:] = float("-inf")  # padded keys masked out, as the engine's packed mask does
        sinks = torch.randn(HEADS, dtype=torch.bfloat16, device="cuda")
        for _ in range(5):
            eager_sinks(query, key, value, mask, sinks, 0.125)
        times = []
        for _ in range(30):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            eager_sinks(query, key, value, mask, sinks, 0.125)
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1) * 1e3)
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            eager_sinks(query, key, value, mask, sinks, 0.125)
            torch.cuda.synchronize()
        kernels[f"q{q}_kv{keys}"] = [(e.key, round(e.device_time_total, 2)) for e in prof.key_averages() if e.device_time_total > 0]
        print(q, keys, kernels[f"q{q}_kv{keys}"], flush=True)
        rows.append({"q_tokens": q, "keys": keys, "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
                     "median_us": round(statistics.median(times), 2), "min_us": round(min(times), 2)})
        print(rows[-1], flush=True)
        del query, key, value, mask
        torch.cuda.empty_cache()
    with open(os.path.join(a.out, "sink_attention.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(a.out, "sink_attention_kernels.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "kernels_us": kernels}, f, indent=1)


if __name__ == "__main__":
    main()

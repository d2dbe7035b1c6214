#!/usr/bin/env python3
"""The time between two decode steps' `execute_model` GPU spans in vLLM's serving engine core,
from its step log (`plugin/ks_vllm_hooks.py`): for each decode step between two decode steps,
step period (start to next start) minus the GPU span of its `execute_model` (CUDA events), per
engine-core process. Prints the median and a line gap = a + b x sequences (least squares on the
per-sequence-count medians, weighted by their step counts, counts with at least 10 steps).

What the gap holds: in vLLM 0.24's GPU model runner (`vllm/v1/worker/gpu/model_runner.py`) the
logits GEMM and the sampler run in `sample_tokens`, after `execute_model`, so the gap is their
GPU time plus whatever idle time the engine loop leaves between steps. Llama-3.1-8B 301 + 1.7 /
sequence and Qwen3-8B 347 + 1.9 us against the simulator's own lm_head + sampling 313-347 and
362-410 us (session 28, `microbench/data/h200_sxm/vllm_engine/run13_qwen3_8b_serving/README.md`).
Steps next to prompt steps are left out: with async scheduling a prompt step's GPU work runs on
into the next step's period. Only GPU-bound steps say anything: where the host is slower than
the GPU (a small model), the GPU span itself waits on the host.
Usage: python3 microbench/e2e/vllm_async_gap.py ENGINE_STEPS_CSV[.gz] [--json]
"""
import argparse
import csv
import gzip
import json
import statistics as st
from collections import defaultdict


def rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return list(csv.DictReader(f))


def weighted_line(points):
    """Least squares y = a + b x over (x, y, weight)."""
    sw = sum(w for _, _, w in points)
    mx = sum(x * w for x, _, w in points) / sw
    my = sum(y * w for _, y, w in points) / sw
    sxx = sum(w * (x - mx) ** 2 for x, _, w in points)
    sxy = sum(w * (x - mx) * (y - my) for x, y, w in points)
    b = sxy / sxx if sxx > 0 else 0.0
    return my - b * mx, b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("steps")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    by_pid = defaultdict(list)
    for r in rows(a.steps):
        by_pid[r["pid"]].append(r)
    out = []
    for pid, steps in by_pid.items():
        steps.sort(key=lambda r: float(r["t_start_mono_s"]))
        decode = [int(r["reqs"]) > 0 and r["tokens"] == r["reqs"] for r in steps]
        gaps = defaultdict(list)
        span = []
        for i in range(1, len(steps) - 1):
            r = steps[i]
            if not (decode[i - 1] and decode[i] and decode[i + 1]) or r["execute_gpu_span_us"] in ("", None):
                continue
            period_us = (float(steps[i + 1]["t_start_mono_s"]) - float(r["t_start_mono_s"])) * 1e6
            if period_us > 1e5:  # the engine went idle between the two
                continue
            gaps[int(r["reqs"])].append(period_us - float(r["execute_gpu_span_us"]))
            span.append(float(r["execute_gpu_span_us"]))
        pts = [(n, st.median(g), len(g)) for n, g in sorted(gaps.items()) if len(g) >= 10]
        if len(pts) < 2:
            continue
        per_step, per_seq = weighted_line(pts)
        all_gaps = [g for gs in gaps.values() for g in gs]
        out.append({"pid": pid, "steps": len(all_gaps), "gap_median_us": st.median(all_gaps), "gpu_span_median_us": st.median(span),
                    "seqs_min": pts[0][0], "seqs_max": pts[-1][0], "async_gap_per_step_us": per_step, "async_gap_per_seq_us": per_seq})
    if a.json:
        print(json.dumps(out, indent=1))
        return
    for o in out:
        print(f"engine core {o['pid']}: {o['steps']} decode steps between decode steps, gap median {o['gap_median_us']:.0f} us "
              f"(GPU span median {o['gpu_span_median_us']:.0f} us); gap = {o['async_gap_per_step_us']:.0f} us + "
              f"{o['async_gap_per_seq_us']:.2f} us x sequences over {o['seqs_min']}-{o['seqs_max']} sequences")


if __name__ == "__main__":
    main()

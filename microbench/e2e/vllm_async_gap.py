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
import json

import numpy as np

from step_log import decode_steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("steps")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    d = decode_steps(a.steps)
    d = d[d.between_decodes]
    out = []
    for pid, x in d.groupby("pid"):
        gap = x.period_us - x.execute_gpu_span_us
        g = gap.groupby(x.reqs).agg(["median", "size"])
        g = g[g["size"] >= 10]
        if len(g) < 2:
            continue
        # Least squares over the per-count medians, each weighted by its step count.
        per_seq, per_step = np.polyfit(g.index.to_numpy(float), g["median"].to_numpy(), 1, w=np.sqrt(g["size"].to_numpy(float)))
        out.append({"pid": str(pid), "steps": len(x), "gap_median_us": float(gap.median()), "gpu_span_median_us": float(x.execute_gpu_span_us.median()),
                    "seqs_min": int(g.index.min()), "seqs_max": int(g.index.max()), "async_gap_per_step_us": float(per_step), "async_gap_per_seq_us": float(per_seq)})
    if a.json:
        print(json.dumps(out, indent=1))
        return
    for o in out:
        print(f"engine core {o['pid']}: {o['steps']} decode steps between decode steps, gap median {o['gap_median_us']:.0f} us "
              f"(GPU span median {o['gpu_span_median_us']:.0f} us); gap = {o['async_gap_per_step_us']:.0f} us + "
              f"{o['async_gap_per_seq_us']:.2f} us x sequences over {o['seqs_min']}-{o['seqs_max']} sequences")


if __name__ == "__main__":
    main()

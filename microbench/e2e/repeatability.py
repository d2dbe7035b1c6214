#!/usr/bin/env python3
"""Run-to-run repeatability of the ground truth: median TPOT of the same CUDA-graph workloads
measured in two device calls (the committed traces and the profiling call, which reran some
runs). Prints each shared run's TPOT p50 in both calls and their difference.
Usage: python3 microbench/e2e/repeatability.py calibration/traces/h200_sxm_cudagraph \
         calibration/traces/h200_sxm_cudagraph_profile
"""
import glob
import json
import os
import statistics
import sys
from collections import defaultdict


def tpot_p50(paths):
    per_run = defaultdict(list)
    for path in paths:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r.get("status") == "finished" and r["output_tokens"] > 1:
                    per_run[r["run_id"]].append((r["finish_s"] - r["first_token_s"]) * 1e3 / (r["output_tokens"] - 1))
    return {k: statistics.median(v) for k, v in per_run.items()}


def main():
    a_root, b_root = sys.argv[1], sys.argv[2]
    a = tpot_p50(glob.glob(os.path.join(a_root, "*", "requests.jsonl")) + glob.glob(os.path.join(a_root, "requests.jsonl")))
    b = tpot_p50(glob.glob(os.path.join(b_root, "*", "requests.jsonl")) + glob.glob(os.path.join(b_root, "requests.jsonl")))
    diffs = []
    for run in sorted(set(a) & set(b)):
        d = 100 * (b[run] - a[run]) / a[run]
        diffs.append(abs(d))
        print(f"{run:55s} TPOT p50 {a[run]:7.2f} ms vs {b[run]:7.2f} ms  {d:+5.1f}%")
    if diffs:
        print(f"{len(diffs)} runs: median |difference| {statistics.median(diffs):.1f}%, max {max(diffs):.1f}%")


if __name__ == "__main__":
    main()

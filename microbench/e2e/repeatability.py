#!/usr/bin/env python3
"""Run-to-run repeatability of the ground truth: median TPOT and TTFT of the same CUDA-graph
workloads measured in two device calls (the committed traces and the profiling call, which reran
some runs). Prints each shared run's p50s in both calls and their differences.
Usage: python3 microbench/e2e/repeatability.py calibration/traces/h200_sxm_cudagraph \
         calibration/traces/h200_sxm_cudagraph_profile
"""
import glob
import json
import os
import statistics
import sys
from collections import defaultdict


def p50s(paths):
    """{run_id: (TPOT p50 ms, TTFT p50 ms)} over the finished requests."""
    tpot, ttft = defaultdict(list), defaultdict(list)
    for path in paths:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r.get("status") == "finished" and r["output_tokens"] > 1:
                    tpot[r["run_id"]].append((r["finish_s"] - r["first_token_s"]) * 1e3 / (r["output_tokens"] - 1))
                    ttft[r["run_id"]].append((r["first_token_s"] - r["arrival_s"]) * 1e3)
    return {k: (statistics.median(tpot[k]), statistics.median(ttft[k])) for k in tpot}


def main():
    a_root, b_root = sys.argv[1], sys.argv[2]
    a = p50s(glob.glob(os.path.join(a_root, "*", "requests.jsonl")) + glob.glob(os.path.join(a_root, "requests.jsonl")))
    b = p50s(glob.glob(os.path.join(b_root, "*", "requests.jsonl")) + glob.glob(os.path.join(b_root, "requests.jsonl")))
    diffs = ([], [])
    for run in sorted(set(a) & set(b)):
        d = [100 * (b[run][i] - a[run][i]) / a[run][i] for i in (0, 1)]
        for i in (0, 1):
            diffs[i].append(abs(d[i]))
        print(f"{run:55s} TPOT p50 {a[run][0]:7.2f} vs {b[run][0]:7.2f} ms {d[0]:+5.1f}%   "
              f"TTFT p50 {a[run][1]:8.2f} vs {b[run][1]:8.2f} ms {d[1]:+5.1f}%")
    for name, v in zip(("TPOT", "TTFT"), diffs):
        if v:
            print(f"{len(v)} runs, {name}: median |difference| {statistics.median(v):.1f}%, max {max(v):.1f}%")


if __name__ == "__main__":
    main()

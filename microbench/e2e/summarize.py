#!/usr/bin/env python3
"""Summary tables of end-to-end traces: per run TTFT, TPOT, ITL p50/p90 and throughput; per static
measurement prefill time and median decode step.

Reads every requests.jsonl / runs.jsonl / static.jsonl under ROOT (recursively), so it works on the
raw harness output and on calibration/traces/h200_sxm/. Definitions (times from the trace):
  TTFT  = first_token_s - arrival_s                          (per request)
  TPOT  = (last token time - first token time) / (output_tokens - 1)   (requests with >= 2 tokens)
  ITL   = every gap between consecutive tokens of a request, pooled over the run's requests
  throughput = sum of output tokens / (last finish - first arrival); req/s likewise
Percentiles interpolate linearly between order statistics (numpy's default).
Usage: python3 microbench/e2e/summarize.py ROOT [--md OUT.md]
"""
import argparse
import json
import os
from collections import defaultdict


def percentile(xs, q):
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def load(root, name):
    out = []
    for d, _, files in sorted(os.walk(root)):
        if name in files:
            with open(os.path.join(d, name)) as f:
                out.extend(json.loads(l) for l in f if l.strip())
    return out


def run_metrics(reqs):
    ok = [r for r in reqs if r.get("status") == "finished" and r.get("token_s")]
    if not ok:
        return None
    ttft = [(r["first_token_s"] - r["arrival_s"]) * 1e3 for r in ok]
    tpot = [(r["token_s"][-1] - r["token_s"][0]) / (len(r["token_s"]) - 1) * 1e3 for r in ok if len(r["token_s"]) > 1]
    itl = [(b - a) * 1e3 for r in ok for a, b in zip(r["token_s"], r["token_s"][1:])]
    span = max(r["finish_s"] for r in ok) - min(r["arrival_s"] for r in ok)
    toks = sum(r["output_tokens"] for r in ok)
    return {"n": len(ok), "ttft": ttft, "tpot": tpot, "itl": itl, "span_s": span,
            "tok_s": toks / span if span > 0 else None, "req_s": len(ok) / span if span > 0 else None}


def fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def tables(root):
    reqs = load(root, "requests.jsonl")
    runs = load(root, "runs.jsonl")
    static = load(root, "static.jsonl")
    by_run = defaultdict(list)  # a run_id is unique within one call only
    for r in reqs:
        by_run[(r.get("call"), r["run_id"])].append(r)
    lines = ["Continuous-batching runs (plan:run_id). Times in ms; tok/s and req/s over first arrival to last "
             "finish. A partial run's figures cover its finished requests only.", "",
             "| run | status | req | TTFT p50 | TTFT p90 | TPOT p50 | TPOT p90 | ITL p50 | ITL p90 | tok/s | req/s | span s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        if not run.get("recorded", True):
            continue
        m = run_metrics(by_run.get((run.get("call"), run["run_id"]), []))
        label = (run["plan"] + ":" if run.get("plan") else "") + run["run_id"]
        if m is None:
            lines.append(f"| {label} | {run.get('status')} | 0 | - | - | - | - | - | - | - | - | - |")
            continue
        p = lambda xs, q: fmt(percentile(xs, q))
        lines.append(f"| {label} | {run.get('status')} | {m['n']} | {p(m['ttft'], 50)} | {p(m['ttft'], 90)} | "
                     f"{p(m['tpot'], 50)} | {p(m['tpot'], 90)} | {p(m['itl'], 50)} | {p(m['itl'], 90)} | "
                     f"{fmt(m['tok_s'], 0)} | {fmt(m['req_s'], 2)} | {fmt(m['span_s'], 2)} |")
    lines += ["", "Static batches (model forward / generate, CUDA events), times in ms:", "",
              "| model | kind | B | L | prefill ms | decode step ms (median) | status |", "|---|---|---|---|---|---|---|"]
    for s in static:
        if s.get("kind") is None:
            continue
        lines.append(f"| {(s['plan'] + ':') if s.get('plan') else ''}{s['model']} | {s['kind']} | {s['batch']} | {s['seq_len']} | {fmt(s.get('prefill_ms'), 2)} | "
                     f"{fmt(s.get('decode_step_ms_median'), 2)} | {s.get('status')} {s.get('error') or ''} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--md", help="also write the tables to this file")
    a = ap.parse_args()
    t = tables(a.root)
    print(t)
    if a.md:
        with open(a.md, "w") as f:
            f.write(t)


if __name__ == "__main__":
    main()

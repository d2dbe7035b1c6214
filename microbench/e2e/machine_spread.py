#!/usr/bin/env python3
"""How much one serving plan's client-side metrics move between device machines.

Each source is LABEL=PATH[@CALL]: a requests file (.jsonl or .jsonl.gz, as `vllm_serve.py` and
`harness.py` write them) or a trace folder (its `requests.jsonl` and `*/requests.jsonl`); a trace folder holds several
calls, `@CALL` keeps one. Runs are matched by `run_id` across sources; per run and metric (the
definitions of `kernelsight validate e2e`: medians and p90s over requests, throughput = output
tokens / last finish) it prints every source's value and the largest over the smallest, then per
metric the median and largest of that ratio and of each source's |difference| from the first.
Usage:

  python3 microbench/e2e/machine_spread.py c=calibration/traces/h200_sxm_vllm19/qwen3-0.6b/requests.jsonl@2026-12-02T19:42:17Z \
      A=microbench/data/h200_sxm/vllm_engine/run9_machine_spread/A/requests.jsonl.gz [--csv out.csv]
"""
import argparse, collections, csv, glob, gzip, json, os, sys

import numpy as np

METRICS = ("ttft_p50", "ttft_p90", "tpot_p50", "itl_p50", "throughput")


def read_requests(path, call):
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "requests.jsonl")) + glob.glob(os.path.join(path, "*", "requests.jsonl")))
    else:
        files = [path]
    for file in files:
        opener = gzip.open if file.endswith(".gz") else open
        with opener(file, "rt") as f:
            for line in f:
                r = json.loads(line)
                if call is None or r.get("call") == call:
                    yield r


def run_metrics(reqs):
    ok = [r for r in reqs if r.get("status", "finished") == "finished" and r.get("first_token_s") is not None]
    if not ok:
        return None
    ttft = [(r["first_token_s"] - r["arrival_s"]) * 1e3 for r in ok]
    tpot = [(r["finish_s"] - r["first_token_s"]) * 1e3 / (r["output_tokens"] - 1) for r in ok if r["output_tokens"] > 1]
    itl = [(b - a) * 1e3 for r in ok for a, b in zip(r["token_s"], r["token_s"][1:])]
    end = max(r["finish_s"] for r in ok)
    return {
        "ttft_p50": float(np.percentile(ttft, 50)),
        "ttft_p90": float(np.percentile(ttft, 90)),
        "tpot_p50": float(np.percentile(tpot, 50)) if tpot else float("nan"),
        "itl_p50": float(np.percentile(itl, 50)) if itl else float("nan"),
        "throughput": sum(r["output_tokens"] for r in ok) / end,
    }


def load(spec):
    label, _, rest = spec.partition("=")
    if not rest:
        sys.exit(f"source '{spec}': expected LABEL=PATH[@CALL]")
    path, _, call = rest.partition("@")
    runs = collections.defaultdict(list)
    for r in read_requests(path, call or None):
        runs[r["run_id"]].append(r)
    if not runs:
        sys.exit(f"source '{spec}': no requests in {path}" + (f" for call {call}" if call else ""))
    return label, {rid: m for rid, reqs in runs.items() if (m := run_metrics(reqs))}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", nargs="+", help="LABEL=PATH[@CALL]")
    ap.add_argument("--runs", default="", help="only runs whose run_id starts with this (e.g. qwen3-0.6b/)")
    ap.add_argument("--csv", help="also write the table here")
    a = ap.parse_args()
    sources = [load(s) for s in a.sources]
    labels = [l for l, _ in sources]
    run_ids = sorted({rid for _, runs in sources for rid in runs if rid.startswith(a.runs)})
    if not run_ids:
        sys.exit(f"no run_id starts with '{a.runs}'")
    rows = []
    for rid in run_ids:
        for m in METRICS:
            vals = [runs.get(rid, {}).get(m, float("nan")) for _, runs in sources]
            have = [v for v in vals if v == v]
            spread = max(have) / min(have) if len(have) >= 2 and min(have) > 0 else float("nan")
            rows.append((rid, m, vals, spread))
    w = max(len(r) for r in run_ids)
    print(f"{'run':<{w}} {'metric':<10} " + " ".join(f"{l:>9}" for l in labels) + "  max/min")
    for rid, m, vals, spread in rows:
        print(f"{rid:<{w}} {m:<10} " + " ".join(f"{v:9.2f}" for v in vals) + f"  {spread:7.2f}")
    print("\nper metric, median / max over runs measured by at least two sources: max/min, then each source's |difference| from " + labels[0] + " in %:")
    for m in METRICS:
        s = [sp for _, mm, _, sp in rows if mm == m and sp == sp]
        if not s:
            continue
        line = f"  {m:<10} {np.median(s):.2f} / {max(s):.2f} ({len(s)} runs)"
        for i, label in enumerate(labels[1:], 1):
            d = [abs(v[i] / v[0] - 1) * 100 for _, mm, v, _ in rows if mm == m and v[0] == v[0] and v[i] == v[i] and v[0] > 0]
            if d:
                line += f"   {label}: {np.median(d):.1f} / {max(d):.1f} % ({len(d)})"
        print(line)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(["run_id", "metric", *labels, "max_over_min"])
            for rid, m, vals, spread in rows:
                wr.writerow([rid, m, *(f"{v:.4f}" for v in vals), f"{spread:.4f}"])


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Blind end-to-end comparison: measured runs (a traces folder, summarize.py's definitions) against
per-run predictions written before the measurement (load_sweep_predict.py's CSV), matched on
model and workload. Prints per tier and metric: count, median / p90 / max APE %, and, with
--runs, each run's predicted / measured ratio at the given tier. Partial runs are skipped.

    python3 microbench/tools/e2e_blind_compare.py TRACES PREDICTIONS.csv [--runs TIER] [--md OUT.md]
"""
import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from summarize import load, percentile, run_metrics  # noqa: E402

METRICS = [("TTFT p50", "ttft_p50_ms", lambda m: percentile(m["ttft"], 50)),
           ("TTFT p90", "ttft_p90_ms", lambda m: percentile(m["ttft"], 90)),
           ("TPOT p50", "tpot_p50_ms", lambda m: percentile(m["tpot"], 50)),
           ("TPOT p90", "tpot_p90_ms", lambda m: percentile(m["tpot"], 90)),
           ("ITL p50", "itl_p50_ms", lambda m: percentile(m["itl"], 50)),
           ("throughput", "throughput_tok_s", lambda m: m["tok_s"])]


def measured_runs(root):
    by_run = {}
    for r in load(root, "requests.jsonl"):
        by_run.setdefault((r.get("call"), r["run_id"]), []).append(r)
    out = {}
    for run in load(root, "runs.jsonl"):
        if run.get("status") != "ok" or not run.get("recorded", True):
            continue
        m = run_metrics(by_run.get((run.get("call"), run["run_id"]), []))
        if m:
            out[(run["model"], run["workload"])] = {name: f(m) for name, _, f in METRICS}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("traces")
    ap.add_argument("predictions")
    ap.add_argument("--runs", help="tier whose per-run ratios to list")
    ap.add_argument("--md", help="write the tables as markdown here too")
    a = ap.parse_args()
    meas = measured_runs(a.traces)
    ape = {}  # (tier, metric) -> [APE %]
    ratios = []
    for p in csv.DictReader(open(a.predictions)):
        m = meas.get((p["model"], p["workload"]))
        if m is None:
            continue
        row = {}
        for name, col, _ in METRICS:
            pred, obs = float(p[col]), m[name]
            ape.setdefault((p["tier"], name), []).append(abs(pred - obs) / obs * 100)
            row[name] = pred / obs
        if p["tier"] == a.runs:
            ratios.append((p["model"], p["workload"], row))
    lines = [f"{len(meas)} measured runs (status ok). APE % of the blind predictions, median / p90 / max:", "",
             "| tier | " + " | ".join(n for n, _, _ in METRICS) + " |", "|---|" + "---|" * len(METRICS)]
    for tier in dict.fromkeys(t for t, _ in ape):
        cells = []
        for name, _, _ in METRICS:
            v = ape[(tier, name)]
            cells.append(f"{percentile(v, 50):.1f} / {percentile(v, 90):.1f} / {max(v):.1f}")
        lines.append(f"| {tier} | " + " | ".join(cells) + " |")
    if ratios:
        lines += ["", f"Predicted / measured per run ({a.runs} tier):", "",
                  "| model | workload | " + " | ".join(n for n, _, _ in METRICS) + " |", "|---|---|" + "---|" * len(METRICS)]
        for model, wl, row in ratios:
            lines.append(f"| {model} | {wl} | " + " | ".join(f"{row[n]:.2f}" for n, _, _ in METRICS) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Blind predictions for a plan of end-to-end runs (plans.json `load_sweep14`, `vllm_load27a`,
`vllm32a`), written before the GPU runs.

For each model and workload of the plan, `kernelsight simulate` replays the workload file at each
tier (transformers' plans: the `hf-cudagraph` engine, its KV cache pinned to the plan's blocks;
vLLM's plans: the `vllm` engine with its KV cache from memory); then `kernelsight capacity`
searches the highest rate within the plan's SLO for the sweep's lengths (the plan's
`sweep` entry: isl, osl, range ratio, requests, seed; load_sweep14's 512/128 +-25 %, 100, 11 by
default; `--no-capacity` skips it). A run with `clients` is a closed loop of that many clients
over the workload's lengths (its first `limit` requests), as the harness replays it. vLLM runs
are simulated with the settings vllm_serve.py gives the engine (async scheduling, 8,192 batched
tokens, 1,024 sequences). Output: one CSV of per-run predictions and one JSON of the capacity
answers. With `--record-quantiles`, TTFT and TPOT percentiles come from the simulated requests
(`simulate --out`'s requests.csv) interpolated as summarize.py does the measured ones, instead of
the report's nearest-rank histogram quantiles: the two differ where a run's latencies split into
cohorts (a closed loop's p50 falls between two clusters). Usage (release build):
  python3 microbench/e2e/load_sweep_predict.py --plan load_sweep14 --slo-ttft-ms 400 --slo-tpot-ms 40 \
      --percentile 90 --out microbench/plans/load_sweep14
"""
import argparse
import csv
import json
import os
import subprocess
import tempfile

from summarize import percentile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BIN = os.path.join(REPO, "target", "release", "kernelsight")
TIERS = ["target", "cross-gen", "roofline"]


def ks(*args):
    out = subprocess.run([BIN, *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--slo-ttft-ms")
    ap.add_argument("--slo-tpot-ms")
    ap.add_argument("--percentile", default="90")
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-capacity", action="store_true", help="per-run predictions only")
    ap.add_argument("--record-quantiles", action="store_true", help="TTFT/TPOT percentiles from the simulated requests, linearly interpolated")
    a = ap.parse_args()
    if not a.no_capacity and not (a.slo_ttft_ms and a.slo_tpot_ms):
        ap.error("--slo-ttft-ms and --slo-tpot-ms are needed unless --no-capacity")
    with open(os.path.join(HERE, "plans.json")) as f:
        plan = json.load(f)[a.plan]
    if plan.get("engine") == "vllm":
        engine, kv_flags = "vllm", ["--async-scheduling", "true", "--max-num-batched-tokens", "8192", "--max-num-seqs", "1024"]
    else:
        eng = plan["engine"]
        engine, kv_flags = "hf-cudagraph", ["--num-gpu-blocks", str(eng["kv_capacity_tokens"] // eng["block_size"])]
    sweep = plan.get("sweep", {"isl": 512, "osl": 128, "range_ratio": 0.25, "requests": 100, "seed": 11})
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    rows, capacity = [], []
    for m in plan["models"]:
        for run in m["runs"]:
            wl = os.path.join(HERE, "workloads", run["workload"] + ".csv")
            loop = ["--concurrency", str(run["clients"])] if run.get("clients") else []
            limit = ["--num-requests", str(run["limit"])] if run.get("limit") else []
            for tier in TIERS:
                args = ["simulate", "--model", m["name"], "--gpu", "h200_sxm", "--engine", engine, "--trace", wl,
                        *loop, *limit, *kv_flags, "--tier", tier, "--json"]
                with tempfile.TemporaryDirectory() as tmp:
                    j = ks(*args, *(["--out", tmp] if a.record_quantiles else []))
                    ttft, tpot = j["ttft_ms"], j["tpot_ms"]
                    if a.record_quantiles:
                        with open(os.path.join(tmp, "requests.csv")) as f:
                            done = [r for r in csv.DictReader(f) if r["status"] == "ok"]
                        t = [float(r["ttft_ms"]) for r in done]
                        p = [float(r["tpot_ms"]) for r in done if r["tpot_ms"]]
                        ttft = {"p50": percentile(t, 50), "p90": percentile(t, 90)}
                        tpot = {"p50": percentile(p, 50), "p90": percentile(p, 90)}
                rows.append({"model": m["name"], "workload": run["workload"], "clients": run.get("clients", ""), "tier": tier,
                             "ttft_p50_ms": ttft["p50"], "ttft_p90_ms": ttft["p90"],
                             "tpot_p50_ms": tpot["p50"], "tpot_p90_ms": tpot["p90"],
                             "itl_p50_ms": j["itl_ms"]["p50"], "throughput_tok_s": j["throughput_tok_s"],
                             "duration_s": j["duration_s"]})
        if a.no_capacity:
            continue
        # The sweep's lengths and arrival pattern, its rate searched.
        sw = {**sweep, **m.get("sweep", {})}
        for tier in TIERS:
            j = ks("capacity", "--model", m["name"], "--gpu", "h200_sxm", "--engine", engine, "--workload", "uniform",
                   "--isl", str(sw["isl"]), "--osl", str(sw["osl"]), "--range-ratio", str(sw["range_ratio"]),
                   "--num-requests", str(sw["requests"]), "--seed", str(sw["seed"]),
                   "--slo-ttft-ms", a.slo_ttft_ms, "--slo-tpot-ms", a.slo_tpot_ms, "--percentile", a.percentile,
                   "--tier", tier, "--json")
            c = j["capacity"]
            capacity.append({"model": m["name"], "tier": tier, "max_rate_per_s": c["max_rate_per_s"],
                             "first_failing_rate_per_s": c["first_failing_rate_per_s"], "slo": j["slo"],
                             "curve": [{"rate_per_s": p["rate_per_s"], "ttft_p90_ms": p["outcome"]["ttft_ms"]["p90"],
                                        "tpot_p90_ms": p["outcome"]["tpot_ms"]["p90"],
                                        "served_fraction": p["outcome"]["served_fraction"]} for p in c["curve"]]})
    with open(a.out + "_predictions.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    if not a.no_capacity:
        with open(a.out + "_capacity.json", "w") as f:
            json.dump(capacity, f, indent=1)
            f.write("\n")
    for c in capacity:
        print(f"{c['model']:14s} {c['tier']:9s} capacity {c['max_rate_per_s']} req/s (first failing {c['first_failing_rate_per_s']})")


if __name__ == "__main__":
    main()

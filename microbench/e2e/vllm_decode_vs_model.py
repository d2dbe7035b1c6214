#!/usr/bin/env python3
"""Prices a vLLM serving run's decode steps with the simulator's step model and prints them
beside the engine core's step log (`plugin/ks_vllm_hooks.py`).

For each decode step between two decode steps (so no prompt step's GPU work runs into its
period), the sequences in flight and their mean context are rebuilt from the client's
per-token timestamps at the step's start; steps are grouped by sequence count and context
(500-token bins, groups of 15+ steps), and each group's median sequence count and context is
priced by `kernelsight step --batch decode:N@CTX --json`. Columns: measured period (start to
next start) and `execute_model` GPU span (which leaves out the logits GEMM and the sampler, run
in `sample_tokens`), the simulator's kernels less lm_head and sampling (`sim_body`, to set
against the span), those two (`sim_tail`) and the whole step (`sim_total`, against the period).
Usage: python3 microbench/e2e/vllm_decode_vs_model.py STEPS_DIR --model qwen3-8b [--kernelsight BIN]
(STEPS_DIR holds runs.jsonl, requests.jsonl and engine_steps.csv, each possibly gzipped).
"""
import argparse
import json
import os
import subprocess

import numpy as np
import pandas as pd

from step_log import decode_steps, open_text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("steps_dir")
    ap.add_argument("--model", required=True)
    ap.add_argument("--kernelsight", default="target/release/kernelsight")
    a = ap.parse_args()
    with open_text(os.path.join(a.steps_dir, "runs.jsonl")) as f:
        runs = [json.loads(l) for l in f if l.strip()]
    with open_text(os.path.join(a.steps_dir, "requests.jsonl")) as f:
        reqs = [json.loads(l) for l in f if l.strip()]
    d = decode_steps(os.path.join(a.steps_dir, "engine_steps.csv"))
    rows = []
    for r in runs:
        if "clock_origin" not in r:
            continue
        m0 = r["clock_origin"]["monotonic_s"]
        q = [x for x in reqs if x["run_id"] == r["run_id"] and x.get("token_s")]
        tokens = [(m0 + np.array(x["token_s"]), x["prompt_tokens"]) for x in q]
        t0, t1 = m0 + min(x["arrival_s"] for x in q), m0 + max(x["finish_s"] for x in q)
        for _, s in d[(d.t_start_mono_s >= t0) & (d.t_start_mono_s < t1) & d.between_decodes].iterrows():
            t = s.t_start_mono_s
            ctx = [p + np.searchsorted(ts, t) for ts, p in tokens if ts[0] <= t < ts[-1]]
            if ctx:
                rows.append(dict(reqs=s.reqs, ctx=np.mean(ctx), span=s.execute_gpu_span_us, period=s.period_us))
    x = pd.DataFrame(rows)
    x["nb"] = pd.cut(x.reqs, [0, 4, 8, 16, 32, 64, 96, 128, 192, 256, 512, 1024])
    x["cb"] = (x.ctx / 500).round() * 500
    g = x.groupby(["nb", "cb"], observed=True).agg(n=("span", "size"), reqs=("reqs", "median"), ctx=("ctx", "median"),
                                                   span=("span", "median"), period=("period", "median"))
    out = []
    for _, r in g[g.n >= 15].reset_index().iterrows():
        b, c = int(r.reqs), int(r.ctx)
        j = json.loads(subprocess.run([a.kernelsight, "step", "--model", a.model, "--engine", "vllm", "--batch", f"decode:{b}@{c}", "--json"],
                                      capture_output=True, text=True, check=True).stdout)
        us = {k["name"]: k["predicted_us"] * k.get("count", 1) for k in j["kernels"]}
        total = sum(us.values())
        tail = us.get("lm_head", 0.0) + us.get("sampling", 0.0)
        out.append(dict(seqs=b, ctx=c, steps=int(r.n), period_us=r.period, span_us=r.span, sim_body_us=total - tail,
                        sim_tail_us=tail, sim_total_us=total, body_over_span=(total - tail) / r.span, total_over_period=total / r.period))
    print(pd.DataFrame(out).round(3).to_string(index=False))


if __name__ == "__main__":
    main()

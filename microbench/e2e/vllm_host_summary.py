#!/usr/bin/env python3
"""Summarises `vllm_host_probe.py`'s steps.csv: host time of vLLM engine-core steps by what the
step holds (prompt tokens, new requests, decoders) and how it runs (one full CUDA graph for
decode-only steps, piecewise graphs up to 512 tokens, no graphs above).

Prints, per model (and layer cut), medians over repeats of the steps that carry the scenario's
prompt, and least-squares fits of the host terms across models. Usage:
  python3 microbench/e2e/vllm_host_summary.py microbench/data/h200_sxm/vllm_engine/run6_host/steps.csv --schedule-on-previous-step
"""
import sys

import numpy as np
import pandas as pd

PIECEWISE_MAX_TOKENS = 512


def regime(row):
    if row.new_reqs == 0 and row.tokens == row.reqs:
        return "decode"
    return "piecewise" if row.tokens <= PIECEWISE_MAX_TOKENS else "eager"


def load(path, schedule_on_previous_step=False):
    d = pd.read_csv(path)
    if schedule_on_previous_step:
        # Run 6's probe booked each step's scheduler call on the step before it (steps are in
        # run order per model): move it to the step it scheduled.
        d["schedule_us"] = d.groupby(["model", "layers"]).schedule_us.shift(1)
    d["regime"] = d.apply(regime, axis=1)
    d = d.fillna({c: 0.0 for c in d.columns if c.endswith("_us")})
    d["host_us"] = d.schedule_us + d.execute_model_us + d.sample_tokens_us
    # the model's forward on the host: the graph replays, or the direct call without graphs
    d["forward_cpu_us"] = d.run_fullgraph_us + d.run_pw_graph_us + d.rest_of_execute_us
    d["fwd_cpu_per_layer_us"] = d.forward_cpu_us / d.layers
    d["gpu_span_per_layer_us"] = d.execute_gpu_span_us / d.layers
    d["arch"] = d.model + "/L" + d.layers.astype(str)
    return d


def prompt_steps(d):
    """Steps that carry the scenario's prompt tokens (the joining prompt's, a burst's chunks)."""
    recorded = d.step_in_scenario >= 0
    return d[recorded & ((d.new_reqs > 0) | ((d.regime != "decode") & (d.scenario != "join")))]


def main(path, schedule_on_previous_step):
    d = load(path, schedule_on_previous_step)
    pd.set_option("display.width", 250)
    cols = ["host_us", "schedule_us", "update_requests_us", "prepare_inputs_us", "prepare_attn_us", "attn_metadata_us", "run_pw_graph_us",
            "rest_of_execute_us", "sample_tokens_us", "execute_gpu_span_us", "fwd_cpu_per_layer_us", "gpu_span_per_layer_us"]
    p = prompt_steps(d)
    print("# steps with the scenario's prompt: medians over repeats (us)")
    g = p.groupby(["arch", "scenario", "requests", "prompt_tokens", "decoders", "regime"])
    t = g[cols].median().round(0)
    t.insert(0, "tokens", g.tokens.median())
    t.insert(1, "n", g.size())
    print(t.to_string())
    print("\n# decode-only steps (one full graph): medians by batch (us)")
    dec = d[d.regime == "decode"]
    g = dec.groupby(["arch", pd.cut(dec.reqs, [0, 1, 4, 8, 16, 32, 64])], observed=True)
    print(g[["host_us", "update_requests_us", "prepare_inputs_us", "attn_metadata_us", "run_fullgraph_us", "sample_tokens_us", "execute_gpu_span_us"]].median().round(0).to_string())
    print("\n# forward CPU time per layer by regime (us): median / p10 / p90")
    for (arch, reg), x in p.groupby(["arch", "regime"]):
        v = x.fwd_cpu_per_layer_us
        print(f"{arch:28s} {reg:10s} n={len(v):4d} {v.median():7.1f} {v.quantile(.1):7.1f} {v.quantile(.9):7.1f}")
    print("\n# host time outside the forward (schedule, request updates, input/attention prep, sampling) by regime and")
    print("# new requests in the step: median us (steps); per model, least squares over all steps of")
    print("# nonforward ~ a + b*[prompt step] + c*new_reqs + d*reqs")
    d["nonforward_us"] = d.host_us - d.forward_cpu_us
    print(d.groupby(["regime", pd.cut(d.new_reqs, [-1, 0, 1, 2, 4, 8, 16, 32])], observed=True).nonforward_us.agg(["median", "size"]).round(0).to_string())
    for arch, x in d.groupby("arch"):
        A = np.c_[np.ones(len(x)), (x.regime != "decode").astype(float), x.new_reqs, x.reqs]
        coef, *_ = np.linalg.lstsq(A, x.nonforward_us.values, rcond=None)
        print(f"{arch:28s} a={coef[0]:6.0f} prompt={coef[1]:6.0f} new_req={coef[2]:5.1f} req={coef[3]:5.1f} (n={len(x)})")
    big = d[d.forward_cpu_us > 5 * d.groupby(["arch", "regime"]).forward_cpu_us.transform("median")]
    print(f"\n# steps whose forward took > 5x their model and regime's median (left in the medians above): {len(big)}")
    if len(big):
        print(big[["arch", "scenario", "requests", "prompt_tokens", "tokens", "regime", "forward_cpu_us", "execute_gpu_span_us"]].to_string())

if __name__ == "__main__":
    # --schedule-on-previous-step: for run 6 (`microbench/data/h200_sxm/vllm_engine/run6_host/`)
    main(sys.argv[1], "--schedule-on-previous-step" in sys.argv[2:])

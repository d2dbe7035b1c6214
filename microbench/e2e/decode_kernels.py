#!/usr/bin/env python3
"""Which GPU kernels one CUDA-graph decode step of transformers' continuous batching runs, and
for how long: the per-kernel check of the simulator's step kernel table (`kernelsight step
--engine hf-cudagraph`). For each model: a warm-up run captures the graphs, then one run of
the fixed grid workload is traced with torch.profiler (CUPTI reports the kernels that graph
replays launch); kernel time is summed per kernel name and divided by the run's steps.

Writes $OUT/decode_kernels.json: per model and workload, steps, and per kernel name its
launches and total microseconds. Usage: python3 microbench/e2e/decode_kernels.py --out $OUT
[--models qwen3-8b:18,llama-3.2-1b] [--workloads grid_i128_o64_c1,grid_i8192_o64_c4]
"""
import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import profile_steps  # noqa: E402

MODELS = "qwen3-30b-a3b:24,qwen3-8b:18"
WORKLOADS = "grid_i128_o64_c1"
ENGINE = {"block_size": 256, "max_batch_tokens": 8192, "kv_capacity_tokens": 98304}


def main():
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=MODELS, help="name[:layers],... (no layers: the full depth)")
    ap.add_argument("--workloads", default=WORKLOADS, help="harness workloads, each profiled per model")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    res = {"env": harness.env_record(), "nvidia_smi_before": harness.nvidia_smi(), "models": {}}
    log = []
    profile_steps.install_step_timer(log)
    for spec in a.models.split(","):
        name, _, layers = spec.partition(":")
        cfg, _, _ = harness.build_config(name, int(layers) if layers else None)
        model = harness.build_model(cfg)
        label = f"{name}-L{cfg.num_hidden_layers}"
        harness.cb_run(model, cfg, label, {"workload": "warm_mix", "cuda_graph": True}, ENGINE, a.out, 60, record=False)
        for workload in a.workloads.split(","):
            profile_run(model, cfg, label, {"workload": workload, "cuda_graph": True}, a.out, log, res)
        del model
        torch.cuda.empty_cache()
    res["nvidia_smi_after"] = harness.nvidia_smi()
    with open(os.path.join(a.out, "decode_kernels.json"), "w") as f:
        json.dump(res, f, indent=1)


def profile_run(model, cfg, label, run, out, log, res):
    """One run of `run` traced, after an untraced one that captures its graphs."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    harness.cb_run(model, cfg, label, run, ENGINE, out, 40, record=False)  # captures this run's shapes
    log.clear()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        rec = harness.cb_run(model, cfg, label, run, ENGINE, out, 40, record=False)
        torch.cuda.synchronize()
    # The engine's start-up warm-up captures graphs at the largest shapes, so kernels are
    # split into bursts (GPU idle > 0.5 ms between them: one step each) and only the last
    # decode bursts of the run are kept, kernel by kernel.
    ev = sorted((e.time_range.start, e.time_range.end, e.name[:160]) for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA)
    bursts, cur = [], []
    for e in ev:
        if cur and e[0] - max(x[1] for x in cur[-50:]) > 500:
            bursts.append(cur)
            cur = []
        cur.append(e)
    bursts.append(cur)
    last = []
    for b in bursts[-12:-2]:
        names = collections.defaultdict(lambda: [0, 0.0])
        for s0, s1, n in b:
            names[n][0] += 1
            names[n][1] += s1 - s0
        last.append({"span_us": round(b[-1][1] - b[0][0], 1), "kernels": len(b),
                     "by_name": sorted(([n, c, round(us, 2)] for n, (c, us) in names.items()), key=lambda x: -x[2])})
    steps = [[round(h, 4), round(e0.elapsed_time(e1), 4), q] for _, h, e0, e1, q in log]
    key = label if run["workload"] == WORKLOADS else f"{label}/{run['workload']}"
    res["models"][key] = {"status": rec["status"], "layers": cfg.num_hidden_layers, "run": run, "steps": steps,
                          "bursts": len(bursts), "last_bursts": last}
    harness.log(f"{key}: {len(steps)} steps, {len(ev)} kernel events, {len(bursts)} bursts")


if __name__ == "__main__":
    main()

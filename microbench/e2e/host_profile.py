#!/usr/bin/env python3
"""Where the engine thread of transformers' continuous batching spends its host time: a closed
loop at once versus Poisson arrivals (session 12 found per-request host time up to 2x the host
model in Poisson runs of the load sweep, not in closed-loop ones).

For one model (CUDA graphs, the load sweep's engine settings) replays each workload through
harness.cb_run with the engine's own thread under cProfile (every thread started while a run is
profiled gets its own profiler; the engine's generation loop is one such thread). cProfile slows
Python code, so absolute times are inflated; the comparison between runs is the point.

Writes under --out: <run>.thread<k>.prof (pstats), <run>.txt (top functions by total and cumulative
time), steps.jsonl (the harness's per-step log of each run: scheduled time, requests, decode
requests, query tokens, end of the update), env.json.
Usage: python3 microbench/e2e/host_profile.py --out $OUT [--model llama-3.2-3b]
"""
import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ENGINE = {"block_size": 256, "max_batch_tokens": 8192, "kv_capacity_tokens": 98304}  # plans.json load_sweep14
RUNS = ["grid_i512_o128_c32", "poisson_i512_o128_u25_r3_n100", "poisson_i512_o128_u25_r5_n100"]

PROFILED = []  # cProfile.Profile of each thread started while ACTIVE
ACTIVE = [False]
_orig_run = threading.Thread.run


def _profiled_run(self):
    if not ACTIVE[0]:
        return _orig_run(self)
    prof = cProfile.Profile()
    PROFILED.append((self.name, prof))
    prof.enable()
    try:
        return _orig_run(self)
    finally:
        prof.disable()


def summary(prof, n=45):
    out = io.StringIO()
    st = pstats.Stats(prof, stream=out)
    st.sort_stats("tottime").print_stats(n)
    st.sort_stats("cumulative").print_stats(n)
    return out.getvalue()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama-3.2-3b")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    env = harness.env_record()
    env.update(started_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), plan="host_profile", runs=RUNS, engine=ENGINE)
    env["nvidia_smi_before"] = harness.nvidia_smi()
    threading.Thread.run = _profiled_run
    cfg, _, _ = harness.build_config(a.model, None)
    model = harness.build_model(cfg)
    harness.cb_run(model, cfg, a.model, {"workload": "warm_mix", "cuda_graph": True}, ENGINE, a.out, 60, record=False)
    for wl in RUNS:
        PROFILED.clear()
        ACTIVE[0] = True
        t0 = time.perf_counter()
        rec = harness.cb_run(model, cfg, a.model, {"workload": wl, "cuda_graph": True}, ENGINE, a.out, 120, record=False)
        ACTIVE[0] = False
        wall = time.perf_counter() - t0
        harness.append_jsonl(os.path.join(a.out, "steps.jsonl"), {"workload": wl, "status": rec["status"], "duration_s": rec.get("duration_s"),
                                                                    "wall_s": round(wall, 3), "steps_columns": rec.get("steps_columns"), "steps": rec.get("steps")})
        with open(os.path.join(a.out, f"{wl}.txt"), "w") as f:
            for k, (name, prof) in enumerate(PROFILED):
                prof.dump_stats(os.path.join(a.out, f"{wl}.thread{k}.prof"))  # plain names travel back from the device
                f.write(f"===== thread {name} ({wl}, {rec['status']}, {len(rec.get('steps') or [])} steps, {wall:.1f} s)\n")
                f.write(summary(prof))
        harness.log(f"{wl}: {rec['status']} {len(rec.get('steps') or [])} steps, {wall:.1f} s, {len(PROFILED)} threads profiled")
    env["nvidia_smi_after"] = harness.nvidia_smi()
    with open(os.path.join(a.out, "env.json"), "w") as f:
        json.dump(env, f, indent=1)


if __name__ == "__main__":
    main()

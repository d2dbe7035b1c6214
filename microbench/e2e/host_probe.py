#!/usr/bin/env python3
"""Host cost of transformers' continuous-batching engine, measured apart from any real model.

Tiny random-weight models (probes/*.json: qwen2 architecture, 12 layers, hidden 512, a family
none of the simulator's validation models belongs to) whose GPU work is a few milliseconds, so
a CUDA-graph step's wall time is almost all host: scheduling, block bookkeeping per request and
KV cache layer group, input preparation. `layer_types` sets the number of cache groups (1, 2, 4,
6) at equal GPU work. Each probe replays the fixed isl x concurrency grid with CUDA graphs;
every `compute_batch` call is bracketed by CUDA events (profile_steps.py), so the host part of
each step is measured, not inferred. Then, with the remaining time, the same CUDA-event step
profile for model/run pairs that had none (PROFILES).

Writes under --out the harness files (models.jsonl, runs.jsonl, requests.jsonl; unpack.py turns
them into trace folders), steps.jsonl (per step [t_call_s, host_call_ms, gpu_ms, q_padded]),
hostprof-<probe>.txt (cProfile of one 32-request run: where the host time goes) and env.json.
Usage: python3 microbench/e2e/host_probe.py --out $OUT [--deadline-s 520] [--probes-only | --no-probes]
       [--profiles "MODEL:LAYERS:WORKLOAD,...;..."] [--probes host-probe-g1 --probe-layers 2,4,8]
"""
import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import profile_steps  # noqa: E402

PROBES = ["host-probe-g1", "host-probe-g2", "host-probe-g4", "host-probe-g6"]
GRID = [f"grid_i{i}_o64_c{c}" for i in (128, 512, 2048) for c in (1, 8, 32)]
# Models whose CUDA-graph steps had no CUDA-event profile yet: (name, layers, workloads).
PROFILES = [("qwen3-30b-a3b", 24, ["grid_i128_o64_c1", "grid_i512_o64_c8", "grid_i512_o64_c32"]),
            ("qwen3-8b", 18, ["grid_i128_o64_c1", "grid_i512_o64_c8"]),
            ("mistral-7b-v0.1", 16, ["grid_i128_o64_c1", "grid_i512_o64_c8"]),
            ("gpt-oss-20b", None, ["grid_i128_o64_c1"])]
ENGINE = {"block_size": 256, "max_batch_tokens": 8192, "kv_capacity_tokens": 98304}


def probe_config(name, layers=None):
    """The probe's config; `layers` resizes it, repeating its `layer_types` pattern (the capture
    sweep: what a CUDA-graph capture costs per layer, apart from its fixed part)."""
    from transformers import AutoConfig
    with open(os.path.join(HERE, "probes", name + ".json")) as f:
        d = json.load(f)
    if layers is not None:
        pattern = d["layer_types"]
        d["num_hidden_layers"] = layers
        d["layer_types"] = [pattern[i % len(pattern)] for i in range(layers)]
    return AutoConfig.for_model(d.pop("model_type"), **d)


def timed_run(model, cfg, label, workload, out, log, t_end, prof=None):
    import torch
    log.clear()
    t0 = time.perf_counter()
    name, _, first = workload.partition("/first")  # "sharegpt_r5/first30": its first 30 requests
    run = {"workload": name, "cuda_graph": True, **({"limit": int(first)} if first else {})}
    if prof is not None:
        prof.enable()
    # A run under cProfile has inflated host times: it is not recorded as a trace.
    rec = harness.cb_run(model, cfg, label, run, ENGINE, out, max(5.0, min(40.0, t_end - time.time())), record=prof is None)
    if prof is not None:
        prof.disable()
    torch.cuda.synchronize()
    steps = [[round(t - t0, 6), round(h, 4), round(e0.elapsed_time(e1), 4), q] for t, h, e0, e1, q in log]
    harness.append_jsonl(os.path.join(out, "steps.jsonl"), {"model": label, "run_id": rec["run_id"], "profiled": prof is not None,
                                                            "status": rec["status"], "steps": steps})
    gpu = sorted(s[2] for s in steps) or [0]
    gaps = sorted(steps[i + 1][0] - steps[i][0] for i in range(len(steps) - 1)) or [0]
    harness.log(f"{rec['run_id']}: {rec['status']} steps={len(steps)} gpu p50 {gpu[len(gpu) // 2]:.2f} ms, "
                f"step gap p50 {gaps[len(gaps) // 2] * 1e3:.2f} ms {rec.get('error') or ''}")


def one_model(label, base, build, workloads, out, log, t_end, profile_run=None):
    import torch
    mrec = {"model": label, "base_model": base}
    try:
        cfg = build()
        model = harness.build_model(cfg)
        mrec.update(layers_run=cfg.num_hidden_layers, config_run=model.config.to_dict(),
                    params=sum(p.numel() for p in model.parameters()), status="ok")
        harness.cb_run(model, cfg, label, {"workload": "warm_mix", "cuda_graph": True}, ENGINE, out, 60, record=False)
        for w in workloads:
            if time.time() > t_end - 8:
                mrec.setdefault("skipped", []).append(w)
                continue
            prof = cProfile.Profile() if w == profile_run else None
            timed_run(model, cfg, label, w, out, log, t_end, prof)
            if prof is not None:
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(45)
                pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
                with open(os.path.join(out, f"hostprof-{label}.txt"), "w") as f:
                    f.write(f"{label} {w} cuda_graph (cProfile of the whole run, engine thread included)\n{s.getvalue()}")
        del model
    except Exception as ex:  # one model failing must not cost the others
        mrec.update(status="failed", error=f"{type(ex).__name__}: {ex}")
        harness.log(f"{label}: FAILED {mrec['error']}")
    torch.cuda.empty_cache()
    harness.append_jsonl(os.path.join(out, "models.jsonl"), mrec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline-s", type=float, default=520)
    ap.add_argument("--probes-only", action="store_true", help="skip the real-model profiles (a repeat of the probes)")
    ap.add_argument("--no-probes", action="store_true", help="only the real-model profiles")
    ap.add_argument("--probe-workloads", help="comma-separated workloads for the probes instead of the grid "
                    "(NAME or NAME/firstN)")
    ap.add_argument("--profiles", help="semicolon-separated MODEL:LAYERS:WORKLOAD,... instead of PROFILES "
                    "(LAYERS empty: all)")
    ap.add_argument("--probe-layers", help="comma-separated layer counts: run each probe resized to each, "
                    "labelled PROBE-L<layers> (the capture sweep)")
    ap.add_argument("--probes", help=f"comma-separated subset of {', '.join(PROBES)}")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t_end = time.time() + a.deadline_s
    env = harness.env_record()
    env["started_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    env["plan"] = "host_probe"
    env["engine"] = ENGINE
    env["nvidia_smi_before"] = harness.nvidia_smi()
    log = []
    profile_steps.install_step_timer(log)
    grid = a.probe_workloads.split(",") if a.probe_workloads else GRID
    probes = a.probes.split(",") if a.probes else PROBES
    if any(p not in PROBES for p in probes):
        sys.exit(f"--probes {a.probes}: allowed {', '.join(PROBES)}")
    sizes = [int(x) for x in a.probe_layers.split(",")] if a.probe_layers else [None]
    for p in ([] if a.no_probes else probes):
        for n in sizes:
            label = p if n is None else f"{p}-L{n}"
            one_model(label, p, lambda p=p, n=n: probe_config(p, n), grid, a.out, log, t_end,
                      profile_run="grid_i512_o64_c32" if p == "host-probe-g6" and n is None else None)
    profiles = PROFILES
    if a.profiles:
        profiles = [(m, int(l) if l else None, w.split(",")) for m, l, w in (x.split(":") for x in a.profiles.split(";"))]
    for name, layers, wls in ([] if a.probes_only else profiles):
        if time.time() > t_end - 40:
            harness.append_jsonl(os.path.join(a.out, "models.jsonl"), {"model": name, "status": "skipped", "error": "deadline"})
            continue
        label = name if layers is None else f"{name}-L{layers}"
        one_model(label, name, lambda n=name, l=layers: harness.build_config(n, l)[0], wls, a.out, log, t_end)
    env["nvidia_smi_after"] = harness.nvidia_smi()
    with open(os.path.join(a.out, "env.json"), "w") as f:
        json.dump(env, f, indent=1)


if __name__ == "__main__":
    main()

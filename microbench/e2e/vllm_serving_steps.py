#!/usr/bin/env python3
"""Lines up `vllm_serve.py`'s requests with the serving engine core's own step log
(`plugin/ks_vllm_hooks.py`: steps CSV and its `_adds.csv`) on the monotonic clock both use, and
prints where each run's time to first token goes inside the engine core:

  queued -> scheduled     the busy loop took the request and the scheduler first placed it
  scheduled -> step start execute_model of the step that scheduled it began
  step start -> output    that step's host work, GPU work and the next step's launch, until
                          update_from_output handed its tokens out
  output -> first token   the engine core's first-token stamp after that

and, for the first steps of each run, the step timeline (host pieces, GPU span, gaps).
Usage: python3 microbench/e2e/vllm_serving_steps.py RUN_DIR [--timeline-steps N]
(RUN_DIR holds runs.jsonl, requests.jsonl, engine_steps.csv, each possibly gzipped).
"""
import argparse
import csv
import gzip
import json
import os
import statistics as st


def open_text(path):
    """`path`, or `path.gz` where only the compressed copy is kept (the committed runs)."""
    return open(path) if os.path.exists(path) else gzip.open(path + ".gz", "rt")


def load_jsonl(path):
    with open_text(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def med(xs):
    xs = [x for x in xs if x is not None]
    return f"{st.median(xs):.2f}" if xs else "-"


def step_for(steps, t):
    """The first step that began at or after t (steps sorted by start)."""
    for s in steps:
        if s["t"] >= t - 1e-4:
            return s
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--timeline-steps", type=int, default=6)
    a = ap.parse_args()
    runs = [r for r in load_jsonl(os.path.join(a.run_dir, "runs.jsonl")) if r.get("recorded") and "clock_origin" in r]
    reqs = load_jsonl(os.path.join(a.run_dir, "requests.jsonl"))
    with open_text(os.path.join(a.run_dir, "engine_steps.csv")) as f:
        all_steps = [{k: (float(v) if v not in ("", None) and k != "pid" else v) for k, v in row.items()} for row in csv.DictReader(f)]
    all_steps.sort(key=lambda s: s["t_start_mono_s"])
    print("per run, medians over requests (ms): queued->scheduled, scheduled->step start, step start->tokens out, "
          "tokens out->first-token stamp; the scheduling step's host execute_model, GPU span, tokens")
    for run in runs:
        m0 = run["clock_origin"]["monotonic_s"]
        steps = [dict(s, t=s["t_start_mono_s"] - m0) for s in all_steps if 0 <= s["t_start_mono_s"] - m0 <= run["duration_s"]]
        rq = [q for q in reqs if q["run_id"] == run["run_id"] and q.get("engine_stages")]
        cols = {k: [] for k in ("q2s", "s2start", "start2out", "out2first", "host", "gpu", "tokens")}
        for q in rq:
            e = q["engine_stages"]
            s = step_for(steps, e["scheduled_s"])
            if s is None:
                continue
            cols["q2s"].append((e["scheduled_s"] - e["queued_s"]) * 1e3)
            cols["s2start"].append((s["t"] - e["scheduled_s"]) * 1e3)
            out = s["t_output_mono_s"] - m0 if isinstance(s.get("t_output_mono_s"), float) else None
            cols["start2out"].append((out - s["t"]) * 1e3 if out is not None else None)
            cols["out2first"].append((e["first_token_engine_s"] - out) * 1e3 if out is not None else None)
            cols["host"].append(s["execute_model_us"] / 1e3)
            cols["gpu"].append(s["execute_gpu_span_us"] / 1e3 if isinstance(s.get("execute_gpu_span_us"), float) else None)
            cols["tokens"].append(s["tokens"])
        ttft = [(q["engine_stages"]["first_token_engine_s"] - q["engine_stages"]["queued_s"]) * 1e3 for q in rq]
        print(f"\n{run['run_id']}: {len(rq)} requests, {len(steps)} steps; engine TTFT (queued->first) median {med(ttft)}")
        print("  " + " ".join(f"{k}={med(v)}" for k, v in cols.items()))
        print(f"  first {a.timeline_steps} steps: t_ms tokens new reqs waiting | schedule exec(host) update prep_in prep_attn "
              "graph(full/pw) sample update_out | gpu_span out_at_ms")
        for s in steps[: a.timeline_steps]:
            g = lambda k: s.get(k + "_us") if isinstance(s.get(k + "_us"), float) else 0.0  # noqa: E731
            out = (s["t_output_mono_s"] - m0) * 1e3 if isinstance(s.get("t_output_mono_s"), float) else float("nan")
            print(f"  {s['t'] * 1e3:8.2f} {s['tokens']:6.0f} {s['new_reqs']:3.0f} {s['reqs']:4.0f} {s['waiting']!s:>4} | "
                  f"{g('schedule') / 1e3:6.2f} {g('execute_model') / 1e3:6.2f} {g('update_requests') / 1e3:5.2f} "
                  f"{g('prepare_inputs') / 1e3:5.2f} {g('prepare_attn') / 1e3:5.2f} {(g('run_fullgraph') + g('run_pw_graph')) / 1e3:6.2f} "
                  f"{g('sample_tokens') / 1e3:5.2f} {g('update_from_output') / 1e3:5.2f} | "
                  f"{(s['execute_gpu_span_us'] if isinstance(s.get('execute_gpu_span_us'), float) else float('nan')) / 1e3:7.2f} {out:8.2f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Split one harness output folder (flat JSONL files from the GPU call) into the committed trace tree:

  ROOT/env-<call>.json                 versions, GPU, driver, clocks of that call
  ROOT/<model_dir>/config.json         the HF config actually run (layer count included)
  ROOT/<model_dir>/model.json          build record: params, layers original/run, memory, status, error
  ROOT/<model_dir>/runs.jsonl          continuous-batching runs (engine settings, per-step log)
  ROOT/<model_dir>/requests.jsonl      one line per request
  ROOT/<model_dir>/static.jsonl        static-batch prefill / decode measurements
  ROOT/steps.jsonl                     per-step CUDA-event profiles, where the call made them

<model_dir> is the model label: its name, with "-L<layers>" appended when the layer count was cut. Every line
gets "call" (the call's UTC start time) and "plan" fields: a run_id is unique within one call only.
Usage: python3 microbench/e2e/unpack.py RAW_DIR ROOT [--only PREFIX] [--skip PREFIX]
"""
import argparse
import json
import os


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("root")
    ap.add_argument("--only", help="only the models whose label starts with this prefix (e.g. host-probe)")
    ap.add_argument("--skip", help="leave out the models whose label starts with this prefix")
    a = ap.parse_args()
    keep = lambda label: (a.only is None or label.startswith(a.only)) and (a.skip is None or not label.startswith(a.skip))
    with open(os.path.join(a.raw, "env.json")) as f:
        env = json.load(f)
    call = env["started_utc"]
    plan = env.get("plan")
    os.makedirs(a.root, exist_ok=True)
    with open(os.path.join(a.root, f"env-{call.replace(':', '')}.json"), "w") as f:
        json.dump(env, f, indent=1)
        f.write("\n")

    for m in read_jsonl(os.path.join(a.raw, "models.jsonl")):
        d = m["model"]  # the harness labels a cut model "<name>-L<layers>"
        if not keep(d):
            continue
        os.makedirs(os.path.join(a.root, d), exist_ok=True)
        cfg = m.pop("config_run", None)
        if cfg is not None:
            with open(os.path.join(a.root, d, "config.json"), "w") as f:
                json.dump(cfg, f, indent=1, sort_keys=True)
                f.write("\n")
        m["call"] = call
        m["plan"] = plan
        with open(os.path.join(a.root, d, "model.json"), "w") as f:
            json.dump(m, f, indent=1)
            f.write("\n")

    for kind in ("runs", "requests", "static"):
        for rec in read_jsonl(os.path.join(a.raw, f"{kind}.jsonl")):
            if kind == "runs" and not rec.get("recorded", True):
                continue
            d = rec["model"]
            if not keep(d):
                continue
            os.makedirs(os.path.join(a.root, d), exist_ok=True)
            rec["call"] = call
            rec["plan"] = plan
            with open(os.path.join(a.root, d, f"{kind}.jsonl"), "a") as f:
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")

    # Per-step CUDA-event profiles (host_probe.py, profile_steps.py) stay one file at the root;
    # "call" tells the simulator which call's run each line profiled (run ids repeat across calls).
    for rec in read_jsonl(os.path.join(a.raw, "steps.jsonl")):
        if not keep(rec.get("model", "")):
            continue
        rec["call"] = call
        with open(os.path.join(a.root, "steps.jsonl"), "a") as f:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()

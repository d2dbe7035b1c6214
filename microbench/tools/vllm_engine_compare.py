#!/usr/bin/env python3
"""Measured vLLM engine timings (`microbench/vllm_step_probe.py`) against kernelsight's
predictions, per tier, as a markdown table.

    python3 microbench/tools/vllm_engine_compare.py microbench/data/h200_sxm/vllm_engine/run2_llama70_L20
    python3 microbench/tools/vllm_engine_compare.py RUN --dtype fp4 \
        --kernel-backend moe=vllm/w4a16_mxfp4/vllm_gptossmxfp4moe_marlin,vllm/w4a16_mxfp4/vllm_compressedtensorsw4a4mxfp4moe_marlin

TTFT rows: the median wall time of a 1-token generate of one prompt on an idle engine against
`kernelsight simulate` of one such request (concurrency 1, osl 1, the run's engine flags).
Decode rows: the median ms per decode step (difference of two generate lengths) against the
`kernelsight step` of that decode batch, as async scheduling runs it: max(kernels, host).
Kernel rows: the profiled GPU kernel time of one prefill call against the step's predicted
kernels (no host time on either side).
Standard library only; needs a built `target/release/kernelsight`.
"""
import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

TIERS = ("target", "cross-gen", "roofline")


def ks(args):
    out = subprocess.run(["target/release/kernelsight", *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"kernelsight {' '.join(args)}: {out.stderr.strip()[:500]}")
    return out.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run", help="a folder with timings.csv and provenance.json")
    ap.add_argument("--gpu", default="h200_sxm")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--kernel-backend", default=None)
    a = ap.parse_args()
    prov = json.load(open(os.path.join(a.run, "provenance.json")))
    eng = prov["engine_kwargs"]
    cfg = json.load(open(prov["model_config"]))
    cfg["num_hidden_layers"] = prov["layers"]
    if "layer_types" in cfg:
        cfg["layer_types"] = cfg["layer_types"][: prov["layers"]]
    model = os.path.join(tempfile.mkdtemp(), "config.json")
    json.dump(cfg, open(model, "w"))
    common = ["--model", model, "--gpu", a.gpu, "--tp", "1", "--dtype", a.dtype, "--engine", "vllm"]
    if a.kernel_backend:
        common += ["--kernel-backend", a.kernel_backend]
    flags = ["--prefix-caching", str(eng["enable_prefix_caching"]).lower(),
             "--max-num-batched-tokens", str(eng["max_num_batched_tokens"]),
             "--async-scheduling", str(eng["async_scheduling"]).lower()]

    rows = list(csv.DictReader(open(os.path.join(a.run, "timings.csv"))))
    ttft, decode = {}, {}
    for r in rows:
        if r["kind"] == "ttft":
            ttft.setdefault(int(r["prompt_tokens"]), []).append(float(r["wall_ms"]))
        elif r["kind"] == "decode":
            decode.setdefault((int(r["batch"]), int(r["prompt_tokens"])), []).append(float(r["ms_per_step"]))

    print(f"{prov['model_config']} ({prov['layers']} layers), vLLM {prov['vllm']}, {prov['gpu']}")
    print()
    print("| what | measured ms | " + " | ".join(f"{t} ms (pred/meas)" for t in TIERS) + " |")
    print("|---|---|" + "---|" * len(TIERS))
    apes = {t: [] for t in TIERS}
    for n, walls in sorted(ttft.items()):
        meas = statistics.median(walls)
        cells = []
        for t in TIERS:
            out = json.loads(ks(["simulate", *common, *flags, "--isl", str(n), "--osl", "1", "--concurrency", "1",
                                 "--num-requests", "3", "--tier", t, "--json"]))
            pred = out["ttft_ms"]["p50"]
            apes[t].append(abs(pred - meas) / meas * 100)
            cells.append(f"{pred:.1f} ({pred / meas:.2f})")
        print(f"| TTFT, one {n}-token prompt | {meas:.1f} | " + " | ".join(cells) + " |")
    for (b, ctx), steps in sorted(decode.items()):
        meas = statistics.median(steps)
        cells = []
        for t in TIERS:
            total = ks(["step", *common, "--batch", f"decode:{b}@{ctx}", "--tier", t])
            m = re.search(r"kernels ([\d.]+) us, host ([\d.]+) us", total)
            kernels_ms, host_ms = float(m.group(1)) / 1e3, float(m.group(2)) / 1e3
            pred = max(kernels_ms, host_ms) if eng["async_scheduling"] else kernels_ms + host_ms
            apes[t].append(abs(pred - meas) / meas * 100)
            cells.append(f"{pred:.2f} ({pred / meas:.2f})")
        print(f"| decode step, batch {b} at {ctx} tokens | {meas:.2f} | " + " | ".join(cells) + " |")
    for n, kernels_ms in sorted(profiled_prefill_kernels_ms(a.run).items()):
        cells = []
        for t in TIERS:
            total = ks(["step", *common, "--batch", f"prefill:1x{n}", "--tier", t])
            pred = float(re.search(r"kernels ([\d.]+) us", total).group(1)) / 1e3
            cells.append(f"{pred:.1f} ({pred / kernels_ms:.2f})")
        print(f"| GPU kernels of the {n}-token prefill (profiled; not in the APE) | {kernels_ms:.1f} | " + " | ".join(cells) + " |")
    print()
    print("median APE % (TTFT and decode rows): " + ", ".join(f"{t} {statistics.median(v):.1f} (max {max(v):.1f})" for t, v in apes.items()))


# Profiler rows that are not kernels: CPU-side ops and the host-visible op names that repeat a
# kernel's time under the custom op that launched it.
NOT_KERNELS = ("aten::", "cuda", "cuLaunch", "_C::", "_C_cache_ops::", "_moe_C::", "_vllm_fa3_C::")


def profiled_prefill_kernels_ms(run):
    """Summed device time of the kernels of each profiled single-prompt prefill call."""
    path = os.path.join(run, "profiles.csv")
    if not os.path.exists(path):
        return {}
    out = {}
    for r in csv.DictReader(open(path)):
        kind, _, n = r["step"].partition(":")
        if kind == "prefill" and not r["kernel"].startswith(NOT_KERNELS):
            out[int(n)] = out.get(int(n), 0.0) + float(r["device_us"]) / 1e3
    return out


if __name__ == "__main__":
    main()

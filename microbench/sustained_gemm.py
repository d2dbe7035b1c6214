#!/usr/bin/env python3
"""Does a GPU keep its microbenchmarked GEMM speed under a serving engine's sustained load?

The kernel tables time each shape in short bursts (warm-up, then a median of a few dozen runs).
A serving engine at high load runs prefill steps back to back for minutes; if the GPU holds its
power limit by lowering its clock, those steps run slower than the tables say. This replays one
Qwen3-8B prefill step's GEMMs (8,192 tokens, 36 layers: qkv 6144x4096, o 4096x4096, gate_up
24576x4096, down 4096x12288, bf16, random inputs) as "steps", timed with CUDA events, in phases:
  burst:       10 steps after 5 s idle (what a kernel table sees),
  sustained:   steps back to back for --seconds,
  duty60:      steps with 40 % idle between them for --seconds (a knee-load serving engine;
               --idle-fracs adds phases at other idle fractions, dutyNN = NN % busy),
  fineNN_idle / fineNN_copy: serving-sized steps (--fine-layers layers, ~20-40 ms, shorter than the
               power controller's ~100 ms reaction) with (100-NN) % of the time idle or filled with
               HBM-bound copies (what attention and decode kernels do between a step's GEMMs), per
               --fine-fracs; only the GEMMs are timed,
while nvidia-smi samples SM clock, power and temperature every 50 ms. Nothing is changed on the
GPU. Usage: python3 microbench/sustained_gemm.py --out DIR [--seconds 25] [--shapes N:K,... --layers L] [--idle-fracs 0.4,0.1]
  [--fine-fracs 0.2,0.4 --fine-layers 4 --fine-seconds 8] [--dtype fp8]
(--dtype fp8: e4m3 inputs and weights through torch._scaled_mm, per-tensor scales, bf16 out: a
cuBLASLt FP8 GEMM as FP8-checkpoint serving runs its linear layers)
(default shapes: Qwen3-8B's; Qwen3-14B's are 7168:5120,5120:5120,34816:5120,5120:17408 x 40 layers)
"""
import argparse
import json
import os
import subprocess
import time

import torch

SHAPES = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)]  # (n, k) per layer
LAYERS = 36
TOKENS = 8192


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=25.0)
    ap.add_argument("--shapes", help="per-layer GEMMs as N:K pairs, comma-separated (default: Qwen3-8B's)")
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--idle-fracs", default="0.4",
                    help="comma-separated idle fractions, one duty-cycle phase each (0.4: 'duty60', 40 %% idle between steps)")
    ap.add_argument("--fine-fracs", default="",
                    help="comma-separated non-GEMM fractions for the fine-grained phases (idle and copy-filled, one each)")
    ap.add_argument("--fine-layers", type=int, default=4, help="layers per fine-grained step")
    ap.add_argument("--fine-seconds", type=float, default=8.0)
    ap.add_argument("--dtype", choices=["bf16", "fp8"], default="bf16")
    a = ap.parse_args()
    shapes = [tuple(int(v) for v in p.split(":")) for p in a.shapes.split(",")] if a.shapes else SHAPES
    layers = a.layers
    os.makedirs(a.out, exist_ok=True)
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    x = {k: torch.randn(TOKENS, k, device=dev, dtype=torch.bfloat16, generator=g) for _, k in shapes}
    # Distinct weights per layer (Qwen3-8B: 36 x 4 matrices, 13.9 GB): a step streams them as a model does.
    w = [[torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=g) * 0.02 for n, k in shapes] for _ in range(layers)]
    flops = 2 * TOKENS * sum(n * k for n, k in shapes) * layers
    if a.dtype == "fp8":
        x = {k: v.to(torch.float8_e4m3fn) for k, v in x.items()}
        w = [[wt.to(torch.float8_e4m3fn) for wt in layer] for layer in w]
        one = torch.ones((), device=dev, dtype=torch.float32)

        def gemm(xk, wt):
            torch._scaled_mm(xk, wt.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        def gemm(xk, wt):
            torch.matmul(xk, wt.t())

    def step(layers_run=None):
        for layer in w[:layers_run]:
            for (n, k), wt in zip(shapes, layer):
                gemm(x[k], wt)

    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active",
                            "--format=csv,noheader", "-lms", "50"], stdout=open(os.path.join(a.out, "smi.csv"), "w"))
    phases = []

    # HBM-bound filler: device-to-device copies of 256 MiB (a decode step's attention and
    # elementwise kernels stream memory, drawing less power than tensor cores at full clock).
    src = torch.randn(64 << 20, device=dev, dtype=torch.float32, generator=g)
    dst = torch.empty_like(src)

    def copy_ms():
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(3):
            dst.copy_(src)
        s.record()
        for _ in range(20):
            dst.copy_(src)
        e.record()
        e.synchronize()
        return s.elapsed_time(e) / 20

    def timed(name, until=None, count=None, idle_frac=0.0, layers_run=None, fill=None):
        rec = []
        t_end = time.time() + until if until else None
        while (count is None or len(rec) < count) and (t_end is None or time.time() < t_end):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            wall = time.time()
            s.record()
            step(layers_run)
            e.record()
            gap_ms = (rec[-1]["ms"] if rec else 0.0) * idle_frac / (1 - idle_frac)
            if fill is not None:
                for _ in range(round(gap_ms / fill)):
                    dst.copy_(src)
            e.synchronize()
            torch.cuda.synchronize()
            ms = s.elapsed_time(e)
            rec.append({"t_s": round(wall - t0, 4), "ms": round(ms, 4)})
            if idle_frac > 0 and fill is None:
                time.sleep(ms / 1e3 * idle_frac / (1 - idle_frac))
        phase = {"phase": name, "steps": rec}
        if layers_run is not None:
            phase.update({"layers": layers_run, "gemm_frac": round(1 - idle_frac, 3), "gap": "copy" if fill else "idle"})
            if fill:
                phase["copy_ms_each"] = round(fill, 4)
        phases.append(phase)

    t0 = time.time()
    step()
    torch.cuda.synchronize()
    time.sleep(5)
    timed("burst", count=10)
    timed("sustained", until=a.seconds)
    time.sleep(5)
    timed("burst_after_rest", count=10)
    for f in (float(x) for x in a.idle_fracs.split(",") if x):
        if not 0.0 < f < 1.0:
            raise SystemExit(f"--idle-fracs: {f} is not a fraction in (0, 1)")
        timed(f"duty{round(100 * (1 - f))}", until=a.seconds, idle_frac=f)
    fine = [float(x) for x in a.fine_fracs.split(",") if x]
    if fine:
        one_copy_ms = copy_ms()
        time.sleep(3)
        timed("fine_sustained", until=a.fine_seconds, layers_run=a.fine_layers)
    for f in fine:
        if not 0.0 < f < 1.0:
            raise SystemExit(f"--fine-fracs: {f} is not a fraction in (0, 1)")
        busy = round(100 * (1 - f))
        timed(f"fine{busy}_idle", until=a.fine_seconds, idle_frac=f, layers_run=a.fine_layers)
        timed(f"fine{busy}_copy", until=a.fine_seconds, idle_frac=f, layers_run=a.fine_layers, fill=one_copy_ms)
    smi.terminate()
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda, "dtype": a.dtype,
           "tokens": TOKENS, "layers": layers, "shapes_nk": shapes, "tflop_per_step": flops / 1e12, "phases": phases}
    with open(os.path.join(a.out, "sustained_gemm.json"), "w") as f:
        json.dump(out, f, indent=1)
    for p in phases:
        flops = 2 * TOKENS * sum(n * k for n, k in shapes) * p.get("layers", layers)
        ms = sorted(r["ms"] for r in p["steps"])
        first = [r["ms"] for r in p["steps"][:5]]
        last = [r["ms"] for r in p["steps"][-5:]]
        print(f"{p['phase']:17s} steps {len(ms):4d}  median {ms[len(ms) // 2]:8.2f} ms ({flops / ms[len(ms) // 2] / 1e9:6.0f} TFLOPS)"
              f"  first5 {sum(first) / len(first):8.2f}  last5 {sum(last) / len(last):8.2f}")


if __name__ == "__main__":
    main()

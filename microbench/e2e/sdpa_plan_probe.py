#!/usr/bin/env python3
"""How long cuDNN takes, on the host, to build an execution plan for a packed attention shape it
has not run: the term that dominates an eager transformers decode step (`paged|sdpa` packs every
scheduled query into one sequence, so each decode step's key count is new; the eager host model
charges `HostOverhead::sdpa_plan_us`, ~42 ms, per new shape). Eager TPOT of models with the same
layer structure differs by 10-30 % within one device call (llama-3.2-3b 64 ms, qwen2.5-7b 85 ms,
`calibration/traces/h200_sxm_eager_blind12/`), and by ~15 % between calls; this probe tells
whether the plan time follows the head layout, the key count or the machine.

For each head layout (heads x head_dim, K/V already repeated to the query heads as transformers
does) and query count: the call is made the way `paged|sdpa` makes it (bf16 [1, H, S, D] query,
[1, H, N, D] keys and values, a dense additive bf16 mask [1, 1, S, N], is_causal=False, cuDNN
only). Times the first call at `--shapes` new key counts (host wall time up to a synchronize: the
plan build plus one kernel) and a second call of the same shape (the cached plan), and reports
per layout the median build time (first minus repeat), in ms.

Writes $OUT/sdpa_plan_probe.json, with the engine-style Python loop reading (`python_loop_ns`, 10,000
iterations) taken before each shape. Usage: python3 microbench/e2e/sdpa_plan_probe.py --out FILE [--reverse]
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host_speed_probe  # noqa: E402

# (label, query heads, head_dim): the eager runs' layouts after repeat_kv.
LAYOUTS = [("llama-3.2-3b", 24, 128), ("qwen2.5-7b", 28, 128), ("llama-3.1-8b", 32, 128),
           ("mistral-nemo-12b", 32, 128), ("qwen3-14b", 40, 128), ("llama-3.2-1b", 32, 64)]


def main():
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", type=int, default=12, help="new key counts per layout and query count")
    ap.add_argument("--queries", default="1,8", help="packed query counts (decode steps of 1 and 8 sequences)")
    ap.add_argument("--reverse", action="store_true", help="probe the layouts last to first (an order effect test)")
    a = ap.parse_args()
    dev = "cuda"
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
           "method": "host wall time of the first call of a new (queries, keys) shape up to torch.cuda.synchronize, "
                     "minus the same of an immediate repeat; median over shapes", "layouts": []}
    gen = torch.Generator(device=dev).manual_seed(0)
    order = list(enumerate(LAYOUTS))
    for layout, (label, h, d) in (order[::-1] if a.reverse else order):
        for s in [int(x) for x in a.queries.split(",")]:
            builds, repeats, loops = [], [], []
            for i in range(a.shapes):
                # Key counts no other layout or query count uses, growing as a decode batch's do
                # (by layout index: two layouts of one head count once shared key counts, and the
                # second read the first's cached plans, 0.02 ms, in session 51's call).
                n = 1000 + 997 * i + 13 * s + 101 * layout
                q = torch.randn(1, h, s, d, device=dev, dtype=torch.bfloat16, generator=gen)
                k = torch.randn(1, h, n, d, device=dev, dtype=torch.bfloat16, generator=gen)
                v = torch.randn(1, h, n, d, device=dev, dtype=torch.bfloat16, generator=gen)
                mask = torch.zeros(1, 1, s, n, device=dev, dtype=torch.bfloat16)
                torch.cuda.synchronize()
                # The build is host work: the vCPU's Python speed just before it, to tell a
                # layout's cost from the host changing state mid-probe.
                loops.append(host_speed_probe.python_loop_ns(10_000))
                times = []
                for _ in range(2):
                    t0 = time.perf_counter()
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
                    torch.cuda.synchronize()
                    times.append((time.perf_counter() - t0) * 1e3)
                builds.append(times[0] - times[1])
                repeats.append(times[1])
            res["layouts"].append({"model": label, "heads": h, "head_dim": d, "queries": s,
                                   "plan_build_ms_median": round(statistics.median(builds), 3),
                                   "plan_build_ms": [round(x, 3) for x in builds],
                                   "repeat_call_ms_median": round(statistics.median(repeats), 3),
                                   "python_loop_ns": [round(x, 2) for x in loops]})
            print(f"{label:18s} H={h:3d} D={d:3d} q={s}: plan build {statistics.median(builds):7.2f} ms "
                  f"(repeat call {statistics.median(repeats):.3f} ms)", flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

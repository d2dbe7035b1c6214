#!/usr/bin/env python3
"""Why does a burst of simultaneous requests take ~30 ms more than its kernels in vLLM's first
step (session 19, `calibration/traces/h200_sxm_vllm19/README.md`)? Times bursts of N requests on
an AsyncLLM engine across the factors that could explain it, with the engine core's own
timestamps (queued, scheduled, first token), and the GPU's SM clock just before each burst:

  idle before the burst (GPU clocks may fall back), requests per burst, prompt length,
  per-request sampling seeds (per-request generators), greedy vs sampled.

Writes bursts.csv (one row per burst, medians over its requests) and provenance.json under --out.
Usage (device, after microbench/tools/vllm_runtime.sh install1/install2):
  PYTHONPATH=/tmp/site python3 microbench/e2e/vllm_burst_probe.py --model qwen3-0.6b --out $OUT/burst
"""
import argparse
import asyncio
import csv
import itertools
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_serve  # noqa: E402  (installs the package stubs vLLM's imports need)


def sm_clock_mhz():
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetClockInfo(pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_CLOCK_SM)
    except Exception:
        return None


async def burst(engine, n, prompt_tokens, seeded, temperature, vocab, tag):
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    rng = random.Random(hash(tag) & 0xFFFF)
    mono0 = time.monotonic()
    t0 = time.perf_counter()
    out = []

    async def one(i):
        sp = SamplingParams(max_tokens=4, temperature=temperature, ignore_eos=True, detokenize=False,
                            output_kind=RequestOutputKind.DELTA, seed=i if seeded else None)
        ids = [rng.randrange(10, vocab) for _ in range(prompt_tokens)]
        first, m = None, None
        async for o in engine.generate({"prompt_token_ids": ids}, sp, request_id=f"{tag}#{i}"):
            if first is None:
                first = time.perf_counter() - t0
            m = o.metrics
        out.append((first, m.queued_ts - mono0, m.scheduled_ts - mono0, m.first_token_ts - mono0))

    await asyncio.gather(*(one(i) for i in range(n)))
    med = lambda k: statistics.median(r[k] for r in out) * 1e3
    return {"ttft_ms": med(0), "queued_ms": med(1), "queue_to_scheduled_ms": statistics.median(r[2] - r[1] for r in out) * 1e3,
            "scheduled_to_first_token_ms": statistics.median(r[3] - r[2] for r in out) * 1e3,
            "last_queued_ms": max(r[1] for r in out) * 1e3}


async def main_async(a):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM
    import torch
    import vllm
    cfg, _ = vllm_serve.model_config(a.model, None)
    kwargs = vllm_serve.serving_engine_kwargs(cfg)
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs), usage_context=UsageContext.OPENAI_API_SERVER)
    prov = {"model": a.model, "vllm": vllm.__version__, "torch": torch.__version__, "engine_kwargs": {k: v for k, v in kwargs.items() if k != "model"},
            "nvidia_smi_before": vllm_serve.nvidia_smi(), "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    vocab = cfg["vocab_size"]
    for k in range(3):  # warm-up: every prompt length and batch size once
        for n, p in itertools.product((1, 8, 32), (16, 128, 512)):
            await burst(engine, n, p, True, 1.0, vocab, f"warm{k}-{n}-{p}")
    grid = list(itertools.product((0.0, 1.0), (1, 2, 4, 8, 16, 32), (16, 128, 512), (False, True), (0.0, 1.0)))
    random.Random(0).shuffle(grid)  # factors not confounded with time
    with open(os.path.join(a.out, "bursts.csv"), "w", newline="") as f:
        w = None
        for rep in range(a.repeats):
            for idle_s, n, p, seeded, temp in grid:
                await engine.reset_prefix_cache()
                await asyncio.sleep(idle_s if idle_s else 0.02)
                clock = sm_clock_mhz()
                r = await burst(engine, n, p, seeded, temp, vocab, f"r{rep}-{idle_s}-{n}-{p}-{seeded}-{temp}")
                row = {"repeat": rep, "idle_before_s": idle_s, "requests": n, "prompt_tokens": p, "seeded": int(seeded),
                       "temperature": temp, "sm_clock_mhz_before": clock, **{k: round(v, 3) for k, v in r.items()}}
                if w is None:
                    w = csv.DictWriter(f, fieldnames=list(row))
                    w.writeheader()
                w.writerow(row)
            f.flush()
            print(f"repeat {rep} done", flush=True)
    prov["nvidia_smi_after"] = vllm_serve.nvidia_smi()
    with open(os.path.join(a.out, "provenance.json"), "w") as f:
        json.dump(prov, f, indent=1)
    engine.shutdown()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    asyncio.run(main_async(a))


if __name__ == "__main__":
    main()

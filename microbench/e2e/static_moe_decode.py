#!/usr/bin/env python3
"""Why transformers' static `generate` decode of Mixtral-8x7B (8 layers, grouped_mm experts) took
63.6 ms per step at 16 x 512 and 10.0 at 1 x 512 (calibration/traces/h200_sxm_cudagraph, session 43
in docs/validation_e2e.md), while the kernel tables price ~12 ms. For Mixtral-8x7B-L8 and, as a
controls, Qwen3-30B-A3B-L24 and a dense model, Llama-3.1-8B-L8 (one call's host for all three,
so that a layer's host time per aten op compares MoE and dense apart from the host-speed spread
between calls): the median decode step of a B-sequence generate from 512-token prompts
at B = 1, 2, 4, 8, 16, 32 (CUDA events per token, as harness.static_runs), and at B = 16 one decode
step under torch.profiler: GPU kernel time by name, and the CUDA runtime calls that wait on the
GPU (stream / device synchronize, device-to-host copies), with their count and host time; and a
4-token generate at B = 16 under the profiler, its ops by self CPU and GPU time (the H100, session
44, measured Mixtral's generate step growing 5.1 ms per sequence while one forward took 19.5 ms).

Writes $OUT/static_moe_decode.json. Usage: python3 microbench/e2e/static_moe_decode.py --out $OUT
"""
import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MODELS = [("mixtral-8x7b-v0.1", 8), ("qwen3-30b-a3b", 24), ("llama-3.1-8b", 8)]
BATCHES = [1, 2, 4, 8, 16, 32]
PROMPT = 512
NEW = 12


def decode_steps(model, torch, vocab, b, streamer_cls):
    from transformers import GenerationConfig
    ids = torch.randint(10, vocab, (b, PROMPT), device="cuda")
    gc = GenerationConfig(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
        st = streamer_cls()
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc, streamer=st)
    torch.cuda.synchronize()
    ev = st.events
    steps = [ev[i].elapsed_time(ev[i + 1]) for i in range(1, len(ev) - 1)]
    return sorted(steps)[len(steps) // 2], [round(s, 3) for s in steps]


def profile_step(model, torch, vocab, b):
    """One decode step (a forward of b tokens on a b x 512 cache) under the profiler."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import DynamicCache
    ids = torch.randint(10, vocab, (b, PROMPT), device="cuda")
    with torch.no_grad():
        cache = DynamicCache()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        nxt = out.logits[:, -1:].argmax(-1)
        model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)  # warm the decode path
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
            torch.cuda.synchronize()
            wall_ms = (time.perf_counter() - t0) * 1e3
    gpu = collections.Counter()
    launches = 0
    waits = collections.Counter()
    wait_us = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            gpu[e.name[:80]] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            launches += 1
        elif any(k in e.name for k in ("Synchronize", "cudaMemcpy", "MemcpyDtoH", "aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::tolist")):
            waits[e.name] += 1
            wait_us[e.name] += e.cpu_time_total
    return {"batch": b, "wall_ms": round(wall_ms, 3), "kernels": launches, "gpu_ms": round(sum(gpu.values()) / 1e3, 3),
            "top_kernels_us": {k: round(v, 1) for k, v in gpu.most_common(12)},
            "host_waits": {k: {"count": waits[k], "cpu_us": round(wait_us[k], 1)} for k in waits}}


def profile_generate(model, torch, vocab, b):
    """A 4-token generate from b x 512 prompts under the profiler: where its host and GPU time go,
    by op (self CPU time, and CUDA time), to find what a generate step does beyond the forward."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import GenerationConfig
    ids = torch.randint(10, vocab, (b, PROMPT), device="cuda")
    gc = GenerationConfig(max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
            torch.cuda.synchronize()
            wall_ms = (time.perf_counter() - t0) * 1e3
    ka = prof.key_averages()
    dev = lambda e: getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))
    by_cpu = sorted(ka, key=lambda e: -e.self_cpu_time_total)[:25]
    by_gpu = sorted(ka, key=lambda e: -dev(e))[:15]
    return {"batch": b, "new_tokens": 4, "wall_ms": round(wall_ms, 3),
            "top_self_cpu_us": [[e.key[:90], e.count, round(e.self_cpu_time_total, 1)] for e in by_cpu],
            "top_self_gpu_us": [[e.key[:90], e.count, round(dev(e), 1)] for e in by_gpu]}


def main():
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    res = {"env": harness.env_record(), "prompt_tokens": PROMPT, "new_tokens": NEW, "models": {}}
    for name, layers in MODELS:
        cfg, _, _ = harness.build_config(name, layers)
        model = harness.build_model(cfg)
        rec = {"layers": cfg.num_hidden_layers, "experts_implementation": getattr(model.config, "_experts_implementation", None), "decode": []}
        for b in BATCHES:
            try:
                med, steps = decode_steps(model, torch, cfg.vocab_size, b, harness.EventStreamer)
                rec["decode"].append({"batch": b, "step_ms_median": round(med, 3), "step_ms": steps})
            except Exception as ex:  # one failure must not lose the rest
                rec["decode"].append({"batch": b, "error": f"{type(ex).__name__}: {ex}"})
            print(name, b, rec["decode"][-1].get("step_ms_median"), flush=True)
        try:
            rec["profile"] = profile_step(model, torch, cfg.vocab_size, 16)
        except Exception as ex:
            rec["profile"] = {"error": f"{type(ex).__name__}: {ex}"}
        try:
            rec["generate_profile"] = profile_generate(model, torch, cfg.vocab_size, 16)
        except Exception as ex:
            rec["generate_profile"] = {"error": f"{type(ex).__name__}: {ex}"}
        res["models"][f"{name}-L{layers}"] = rec
        del model
        torch.cuda.empty_cache()
        with open(os.path.join(a.out, "static_moe_decode.json"), "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

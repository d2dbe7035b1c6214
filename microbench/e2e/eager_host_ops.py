#!/usr/bin/env python3
"""Host (CPU) cost of an eager transformers forward, by module: how many aten ops each module class
dispatches itself (ops of nested modules are counted under those), and the CPU time one forward
takes to dispatch. A decode-shaped batch (8 tokens, no cache) through random-weight bf16 models cut
to 2 and 4 layers: the difference of the two is one layer's cost, the rest the embedding, final
norm and head. The GPU work of 8 tokens through a few layers is far shorter than its dispatch, so
the wall time of the call (no synchronisation inside) is the host's.

Writes $OUT/eager_host_ops.json. Usage: python3 microbench/e2e/eager_host_ops.py --out $OUT
"""
import argparse
import collections
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MODELS = ["llama-3.1-8b", "qwen3-8b", "mistral-7b-v0.1", "gemma-3-27b-it", "qwen3-0.6b", "qwen3-30b-a3b",
          "mixtral-8x7b-v0.1", "gpt-oss-20b", "qwen2.5-7b", "llama-3.2-3b", "mistral-nemo-12b", "qwen3-14b"]
LAYERS = [2, 4]
TOKENS = 8
REPS = 30


def op_counts(model, ids):
    """Aten ops dispatched by each module class itself during one forward."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    stack = ["<top>"]
    counts = collections.Counter()
    calls = collections.Counter()

    def pre(mod, args):
        stack.append(type(mod).__name__)
        calls[type(mod).__name__] += 1

    def post(mod, args, out):
        stack.pop()

    handles = []
    for m in model.modules():
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            counts[stack[-1]] += 1
            return func(*args, **(kwargs or {}))

    try:
        with torch.no_grad(), Count():
            model(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return dict(counts), dict(calls)


def host_ms(model, ids):
    """Median CPU time of one forward's dispatch (the GPU synchronised before each call)."""
    import torch
    times = []
    with torch.no_grad():
        for _ in range(5):
            model(input_ids=ids, use_cache=False)
        for _ in range(REPS):
            torch.cuda.synchronize()
            t = time.perf_counter()
            model(input_ids=ids, use_cache=False)
            times.append((time.perf_counter() - t) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times), min(times)


def main():
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    res = {"env": harness.env_record(), "nvidia_smi_before": harness.nvidia_smi(), "tokens": TOKENS, "reps": REPS, "models": {}}
    for name in MODELS:
        for layers in LAYERS:
            label = f"{name}-L{layers}"
            try:
                cfg, _, _ = harness.build_config(name, layers)
                model = harness.build_model(cfg)
                ids = torch.randint(0, cfg.vocab_size, (1, TOKENS), device="cuda")
                med, lo = host_ms(model, ids)
                counts, calls = op_counts(model, ids)
                res["models"][label] = {"layers": layers, "host_ms_median": round(med, 4), "host_ms_min": round(lo, 4),
                                        "attn_implementation": model.config._attn_implementation,
                                        "experts_implementation": getattr(model.config, "_experts_implementation", None),
                                        "aten_ops": sum(counts.values()), "ops_by_module": counts, "calls_by_module": calls}
                harness.log(f"{label}: host {med:.2f} ms (min {lo:.2f}), {sum(counts.values())} aten ops")
                del model
                torch.cuda.empty_cache()
            except Exception as ex:  # one model failing must not cost the others
                res["models"][label] = {"error": f"{type(ex).__name__}: {ex}"}
                harness.log(f"{label}: failed: {ex}")
    with open(os.path.join(a.out, "eager_host_ops.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""How many GPU kernels one eager forward of a model launches, as transformers runs it (random bf16
weights, a packed batch of T tokens, no cache): the launch count a CUDA-graph capture's warm-up
and recording passes pay per kernel. torch.profiler counts the CUDA kernel events of one forward
after a warm-up; MoE models are run with the experts implementation transformers picks.

Writes $OUT/launches.json: per model and token count, kernels launched, kernels per layer, and
the top kernel names. Usage: python3 microbench/e2e/count_launches.py --out $OUT
"""
import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MODELS = [("llama-3.1-8b", 8), ("qwen3-30b-a3b", 8), ("mixtral-8x7b-v0.1", 8), ("qwen3-235b-a22b", 6), ("qwen3-8b", 8)]
TOKENS = [64, 512, 4096]


def main():
    import torch
    from torch.profiler import ProfilerActivity, profile
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    res = {"env": harness.env_record(), "models": {}}
    for name, layers in MODELS:
        cfg, _, _ = harness.build_config(name, layers)
        model = harness.build_model(cfg)
        rec = {"layers": cfg.num_hidden_layers, "experts_implementation": getattr(model.config, "_experts_implementation", None)}
        for t in TOKENS:
            ids = torch.randint(0, cfg.vocab_size, (1, t), device="cuda")
            with torch.no_grad():
                model(input_ids=ids, use_cache=False)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    model(input_ids=ids, use_cache=False)
                    torch.cuda.synchronize()
            names = collections.Counter(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
            n = sum(names.values())
            rec[str(t)] = {"kernels": n, "per_layer": round(n / cfg.num_hidden_layers, 1),
                           "top": [(k[:80], v) for k, v in names.most_common(12)]}
            harness.log(f"{name}-L{cfg.num_hidden_layers} tokens={t}: {n} kernels ({n / cfg.num_hidden_layers:.1f}/layer)")
        res["models"][f"{name}-L{cfg.num_hidden_layers}"] = rec
        del model
        torch.cuda.empty_cache()
    with open(os.path.join(a.out, "launches.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""How a random-weight model's routers spread tokens over experts: the routing the H200 traces had.

Builds each model as the harness does (random bf16 weights, layer count cut), runs one forward
of B random-token sequences of 64 tokens, and records for each MoE layer which experts the B
last-position tokens picked (the tokens a decode step of batch B routes). Per (model, B) it
writes the distinct experts per layer next to what uniform routing would hit in expectation,
E * (1 - (1 - k/E)^B), and the share of all picks that the busiest expert got.

The routers are found by their output: transformers' top-k routers return (logits, weights,
indices) with integer indices of shape [tokens, k].
Usage: python3 microbench/e2e/router_stats.py --out $OUT/router_stats.jsonl NAME:LAYERS ...
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402  (build_config, build_model: the traces' own model construction)

BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
SEQ = 64


def main():
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("models", nargs="+", help="NAME:LAYERS (models/NAME.json cut to LAYERS)")
    args = ap.parse_args()
    for spec in args.models:
        name, layers = spec.split(":")
        cfg, _, _ = harness.build_config(name, int(layers))
        model = harness.build_model(cfg)
        picks = []

        def hook(_module, _inputs, output):
            if isinstance(output, tuple) and len(output) == 3:
                idx = output[2]
                if torch.is_tensor(idx) and idx.dtype in (torch.int64, torch.int32) and idx.dim() == 2:
                    picks.append(idx.detach())

        handles = [m.register_forward_hook(hook) for m in model.modules() if "router" in type(m).__name__.lower()]
        experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None) or getattr(cfg, "n_routed_experts")
        g = torch.Generator(device="cuda").manual_seed(3)
        for b in BATCHES:
            picks.clear()
            ids = torch.randint(10, cfg.vocab_size, (b, SEQ), device="cuda", generator=g)
            with torch.no_grad():
                model(input_ids=ids)
            rows = []
            for layer, idx in enumerate(picks):
                k = idx.shape[1]
                last = idx.view(b, SEQ, k)[:, -1, :].reshape(-1)
                counts = torch.bincount(last, minlength=experts)
                rows.append({"layer": layer, "distinct": int((counts > 0).sum()), "max_share": float(counts.max()) / last.numel()})
            k = picks[0].shape[1] if picks else None
            uniform = experts * (1 - (1 - k / experts) ** b) if k else None
            rec = {"model": name, "layers": int(layers), "experts": experts, "topk": k, "batch": b,
                   "uniform_distinct": uniform, "per_layer": rows, "routers_hooked": len(handles),
                   "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
            with open(args.out, "a") as f:
                f.write(json.dumps(rec) + "\n")
            mean = sum(r["distinct"] for r in rows) / max(len(rows), 1)
            print(f"{name}-L{layers} B={b}: distinct experts per layer {mean:.1f} (uniform {uniform:.1f})", flush=True)
        for h in handles:
            h.remove()
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

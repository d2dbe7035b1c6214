#!/usr/bin/env python3
"""Times a real vLLM engine on the device: zero-load TTFT per prompt length, decode steps per
batch, and a kernel profile of chosen steps, for a model built from `models/*.json` with
random (dummy) weights. It answers whether vLLM's own forward costs what the simulator's step
graph says, kernel by kernel (the public H100 vLLM rows can only be compared end to end).

vLLM does not exist on the device image and the device reaches no package index, so the
command that runs this first unpacks a vLLM 0.24.0 runtime carried in ignored folders (see
`microbench/tools/vllm_runtime.sh`): its Python tree, its compiled libraries pruned to sm_90,
and the pure-Python and small binary dependencies the device image lacks. Packages only the
API server or telemetry use are stubbed (`vllm_stubs.py`).

Outputs under --out: `timings.csv` (wall ms of 1-token generates per prompt length; ms per
decode step per batch), `profiles.csv` (per-kernel CUDA time of one traced call per named step),
`provenance.json`.
"""
import argparse
import csv
import json
import os
import sys
import tempfile
import time

import vllm_stubs  # noqa: E402  (same folder)


def reinit_for_timing(model):
    """vLLM's dummy loader fills every parameter from U(-1e-3, 1e-3): a router bias then
    outweighs the router's token-dependent logits and every token picks the same experts, which
    times a different kernel regime than served traffic. Zero the biases, unit norm weights, a
    N(0, 1) router: routing then depends on the token, as with a randomly initialised model."""
    counts = {"bias": 0, "norm": 0, "router": 0}
    for name, p in model.named_parameters():
        if name.endswith(".bias") or name.endswith("e_score_correction_bias"):
            p.data.zero_()
            counts["bias"] += 1
        elif "norm" in name and p.dim() == 1:
            p.data.fill_(1.0)
            counts["norm"] += 1
        elif p.dim() == 2 and (name.endswith("router.weight") or name.endswith(".gate.weight")):
            p.data.normal_(0.0, 1.0)
            counts["router"] += 1
    return counts


class RoutingStats:
    """Distinct experts a router's top-k picks per call (eager mode only: hooks do not run
    inside compiled graphs or CUDA-graph replays)."""

    def __init__(self, topk):
        self.topk, self.rows = topk, []

    def install(self, model):
        n = 0
        for name, m in model.named_modules():
            if name.endswith(".router") or name.endswith("mlp.gate"):
                m.register_forward_hook(self.hook(name))
                n += 1
        return n

    def hook(self, name):
        def f(_m, _inp, out):
            logits = out[0] if isinstance(out, tuple) else out
            ids = logits.float().topk(self.topk, dim=-1).indices
            self.rows.append((name, ids.shape[0], int(ids.unique().numel())))
        return f


def model_dir(config_path, layers):
    cfg = json.load(open(config_path))
    if layers:
        cfg["num_hidden_layers"] = layers
        if "layer_types" in cfg:
            cfg["layer_types"] = cfg["layer_types"][:layers]
    d = tempfile.mkdtemp(prefix="vllm_model_")
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=1)
    return d, cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/gpt-oss-120b.json")
    ap.add_argument("--layers", type=int, default=0, help="cut the layer count (0: as the config)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--moe-backend", default="marlin")
    ap.add_argument("--attention-backend", default=None)
    ap.add_argument("--async-scheduling", type=int, default=1)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--prompts", default="128,512,1024,2048,4096,8192")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--decode", default="1,4,16,64")
    ap.add_argument("--decode-context", type=int, default=1024)
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--profile", default="prefill:1024,prefill:8192,decode:16")
    ap.add_argument("--enforce-eager", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--routing-stats", type=int, default=0, help="record distinct experts per router call (needs --enforce-eager 1)")
    ap.add_argument("--reinit", type=int, default=1, help="token-dependent routing (see reinit_for_timing)")
    ap.add_argument("--prefix-caching", type=int, default=0,
                    help="1: prefix caching on, so a `cached_decode:B` profile (B prompts run once unprofiled, then "
                         "profiled for --decode-steps more tokens) times decode steps with only the prompts' last partial "
                         "block recomputed")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    vllm_stubs.install()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # FlashInfer is not carried

    import torch
    import triton
    from vllm.entrypoints.llm import LLM
    from vllm.sampling_params import SamplingParams
    import vllm

    mdir, cfg = model_dir(a.model, a.layers)
    kwargs = dict(model=mdir, load_format="dummy", skip_tokenizer_init=True, tensor_parallel_size=1,
                  max_model_len=max(int(p) for p in a.prompts.split(",")) + a.decode_steps + 64,
                  max_num_batched_tokens=a.max_num_batched_tokens, enable_prefix_caching=bool(a.prefix_caching),
                  async_scheduling=bool(a.async_scheduling), moe_backend=a.moe_backend,
                  gpu_memory_utilization=0.88, seed=0, enforce_eager=bool(a.enforce_eager))
    if a.attention_backend:
        kwargs["attention_backend"] = a.attention_backend
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    startup_s = time.perf_counter() - t0
    reinit = llm.apply_model(reinit_for_timing) if a.reinit else None
    print("reinit:", reinit, flush=True)
    stats = None
    if a.routing_stats:
        stats = RoutingStats(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token"))
        print("routers hooked:", llm.apply_model(stats.install), flush=True)
    prov = {"command": " ".join(sys.argv), "vllm": vllm.__version__, "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
            "model_config": a.model, "layers": cfg["num_hidden_layers"], "engine_kwargs": {k: v for k, v in kwargs.items() if k != "model"},
            "startup_s": round(startup_s, 1), "reinit": reinit, "temperature": a.temperature, "stubbed_packages": sorted(vllm_stubs.STUBBED)}
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from collect import smi_snapshot
        prov["nvidia_smi"] = smi_snapshot()
    except Exception as e:  # provenance must not lose the run
        prov["nvidia_smi"] = {"error": str(e)}
    # Written before measuring, so every mode of the run keeps it.
    json.dump(prov, open(os.path.join(a.out, "provenance.json"), "w"), indent=1)
    print(json.dumps(prov)[:2000], flush=True)

    vocab = cfg["vocab_size"]
    g = torch.Generator().manual_seed(0)

    def prompts(n, length):
        return [{"prompt_token_ids": torch.randint(1000, vocab - 1000, (length,), generator=g).tolist()} for _ in range(n)]

    def run(ps, max_tokens):
        # Sampled, not greedy: with dummy weights greedy decoding emits one token for every
        # sequence, so a decode batch routes as one token would.
        sp = SamplingParams(max_tokens=max_tokens, temperature=a.temperature, ignore_eos=True, detokenize=False)
        torch.cuda.synchronize()
        t = time.perf_counter()
        llm.generate(ps, sp, use_tqdm=False)
        return (time.perf_counter() - t) * 1e3

    run(prompts(2, 256), 4)  # warm-up: first-call paths
    if stats is not None:
        for b in (int(x) for x in a.decode.split(",")):
            stats.rows.append(("batch", b, 0))
            run(prompts(b, a.decode_context), 5)
        with open(os.path.join(a.out, "routing.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["router", "tokens", "distinct_experts"])
            w.writerows(stats.rows)
        print("routing stats written", flush=True)
        return

    # One file of timings (kind ttft: wall of a 1-token generate; kind decode: ms per decode step
    # from two generate lengths) and one of kernel profiles: the device returns few files.
    with open(os.path.join(a.out, "timings.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kind", "prompt_tokens", "batch", "repeat", "wall_ms", "ms_per_step"])
        for p in (int(x) for x in a.prompts.split(",")):
            run(prompts(1, p), 1)
            for r in range(a.repeats):
                w.writerow(["ttft", p, 1, r, f"{run(prompts(1, p), 1):.3f}", ""])
            f.flush()
        print("ttft done", flush=True)
        for b in (int(x) for x in a.decode.split(",")):
            ps = prompts(b, a.decode_context)
            run(ps, 2)
            for r in range(3):
                one, many = run(ps, 1), run(ps, a.decode_steps + 1)
                w.writerow(["decode", a.decode_context, b, r, f"{many:.3f}", f"{(many - one) / a.decode_steps:.4f}"])
            f.flush()
        print("decode done", flush=True)

    from torch.profiler import ProfilerActivity, profile
    with open(os.path.join(a.out, "profiles.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "kernel", "calls", "device_us", "wall_ms_of_call"])
        for item in a.profile.split(","):
            kind, n = item.split(":")
            n = int(n)
            # Warm-up call before the profiled one (cached_decode: it fills the prefix cache).
            if kind == "prefill":
                ps, mt, warm = prompts(1, n), 1, 1
            elif kind == "cached_decode":
                ps, mt, warm = prompts(n, a.decode_context), 1 + a.decode_steps, 1
            else:
                ps, mt, warm = prompts(n, a.decode_context), 9, 9
            run(ps, warm)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                wall = run(ps, mt)
            rows = []
            for e in prof.key_averages():
                dev_us = getattr(e, "self_device_time_total", None)
                if dev_us is None:
                    dev_us = getattr(e, "self_cuda_time_total", 0)
                if dev_us and dev_us > 0:
                    rows.append((e.key, e.count, dev_us))
            rows.sort(key=lambda r: -r[2])
            for k, c, us in rows:
                w.writerow([item, k[:200], c, f"{us:.1f}", f"{wall:.3f}"])
            print(f"profile {item}: wall {wall:.1f} ms", flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Time the part of a DeepSeek MLA module that depends on how vLLM dispatches its small ops:
the two RMSNorms (q_a_layernorm over q_lora_rank 1536, kv_a_layernorm over kv_lora_rank 512)
and the YaRN rotary embedding of q_pe [T, H, 64] and k_pe [T, 1, 64], run either

  native: vLLM 0.24.0's PyTorch fallbacks, op for op (`vllm/ir/ops/layernorm.py::rms_norm`,
          `DeepseekScalingRotaryEmbedding.forward_static` with GPT-J rotation, written back into
          q as `MultiHeadLatentAttentionWrapper.forward` does), which is what aiconfigurator's
          older module collector timed (custom ops off, RMSNorm IR op on its native chain); or
  fused:  one kernel per norm and one for the rotary (vLLM's `vllm_c` rms_norm and
          rotary_embedding CUDA kernels; here Triton kernels with the same reads and writes),
          which is what its re-collected B200 tables time (custom ops on, RMSNorm pinned to
          `vllm_c`).

The difference is what the two kinds of module table differ by at equal shapes; the simulator
uses it to price a module row of one dispatch from a model fitted on the other.

Shapes: T tokens (decode batch, or prefill batch x seq_len) x H heads, the projections' output
laid out as in the module (qkv_lora [T, 2112] split into views; q [T, H, 192] with q_pe its last
64 columns). Timing: the chain captured R times in one CUDA graph (R sized so a replay lasts
about 1 ms or more), median over replays of CUDA-event time / R. Kernel counts from one eager
run under torch.profiler. Output: `<out>/mla_dispatch_chain.csv` and `provenance.json`.
"""
import argparse
import csv
import json
import os
import statistics
import time

import torch
import triton
import triton.language as tl

from collect import smi_snapshot  # microbench/collect.py: nvidia-smi clocks, power, throttle reasons

Q_LORA, KV_LORA, ROPE, NOPE = 1536, 512, 64, 128
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
HEADS = [1, 2, 4, 8, 16, 32, 64, 128]
EPS = 1e-6


def rms_norm_native(x, weight, eps):
    # vLLM 0.24.0 vllm/ir/ops/layernorm.py::rms_norm, variance_size None.
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    x = x.to(weight.dtype) * weight
    return x.to(orig_dtype)


def rotate_gptj(x):
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)


def rope_native(positions, query, key, cos_sin_cache):
    # DeepseekScalingRotaryEmbedding.forward_static, rotary_dim == head_size == 64, GPT-J style.
    cos_sin = cos_sin_cache[positions]
    cos, sin = cos_sin.chunk(2, dim=-1)
    cos = cos.repeat_interleave(2, dim=-1).unsqueeze(-2)
    sin = sin.repeat_interleave(2, dim=-1).unsqueeze(-2)
    query = query * cos + rotate_gptj(query) * sin
    key = key * cos + rotate_gptj(key) * sin
    return query, key


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, x_stride, y_stride, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=0) / n
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(var + eps) * w
    tl.store(y_ptr + row * y_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_gptj_kernel(pos_ptr, q_ptr, k_ptr, cache_ptr, q_tok_stride, q_head_stride, k_tok_stride, heads, n_pairs,
                      HALF: tl.constexpr, BLOCK: tl.constexpr):
    # One lane per rotated pair over tokens x (heads + 1): head index `heads` is k_pe.
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n_pairs
    d = i % HALF
    h = (i // HALF) % (heads + 1)
    t = i // (HALF * (heads + 1))
    pos = tl.load(pos_ptr + t, mask=mask, other=0)
    cos = tl.load(cache_ptr + pos * 2 * HALF + d, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * 2 * HALF + HALF + d, mask=mask, other=0.0).to(tl.float32)
    is_key = h == heads
    off = tl.where(is_key, t * k_tok_stride, t * q_tok_stride + h * q_head_stride) + 2 * d
    qmask = mask & (h < heads)
    kmask = mask & is_key
    xe = tl.load(q_ptr + off, mask=qmask, other=0.0).to(tl.float32) + tl.load(k_ptr + off, mask=kmask, other=0.0).to(tl.float32)
    xo = tl.load(q_ptr + off + 1, mask=qmask, other=0.0).to(tl.float32) + tl.load(k_ptr + off + 1, mask=kmask, other=0.0).to(tl.float32)
    ye = xe * cos - xo * sin
    yo = xo * cos + xe * sin
    tl.store(q_ptr + off, ye.to(q_ptr.dtype.element_ty), mask=qmask)
    tl.store(q_ptr + off + 1, yo.to(q_ptr.dtype.element_ty), mask=qmask)
    tl.store(k_ptr + off, ye.to(k_ptr.dtype.element_ty), mask=kmask)
    tl.store(k_ptr + off + 1, yo.to(k_ptr.dtype.element_ty), mask=kmask)


class Case:
    """One module's inputs at T tokens and H heads: the projection outputs the chain reads."""

    def __init__(self, tokens, heads, dev):
        g = torch.Generator(device=dev).manual_seed(tokens * 131 + heads)
        self.heads = heads
        self.qkv_lora = torch.randn(tokens, Q_LORA + KV_LORA + ROPE, device=dev, dtype=torch.bfloat16, generator=g)
        self.q = torch.randn(tokens, heads, NOPE + ROPE, device=dev, dtype=torch.bfloat16, generator=g)
        self.w_q = torch.rand(Q_LORA, device=dev, dtype=torch.bfloat16, generator=g) + 0.5
        self.w_kv = torch.rand(KV_LORA, device=dev, dtype=torch.bfloat16, generator=g) + 0.5
        max_pos = 4096
        self.positions = torch.randint(0, max_pos, (tokens,), device=dev, generator=g)
        freqs = torch.rand(max_pos, ROPE // 2, device=dev, generator=g) * 6.28
        self.cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(torch.bfloat16)
        self.q_c_out = torch.empty(tokens, Q_LORA, device=dev, dtype=torch.bfloat16)
        self.kv_c_out = torch.empty(tokens, KV_LORA, device=dev, dtype=torch.bfloat16)

    def native(self):
        q_c, kv_lora = self.qkv_lora.split([Q_LORA, KV_LORA + ROPE], dim=-1)
        q_c = rms_norm_native(q_c, self.w_q, EPS)
        kv_c, k_pe = kv_lora.split([KV_LORA, ROPE], dim=-1)
        kv_c = rms_norm_native(kv_c, self.w_kv, EPS)
        k_pe = k_pe.unsqueeze(1)
        self.q[..., NOPE:], k_pe = rope_native(self.positions, self.q[..., NOPE:], k_pe, self.cache)
        return q_c, kv_c, k_pe

    def fused(self):
        q_c, kv_lora = self.qkv_lora.split([Q_LORA, KV_LORA + ROPE], dim=-1)
        kv_c, k_pe = kv_lora.split([KV_LORA, ROPE], dim=-1)
        t = self.qkv_lora.shape[0]
        _rms_norm_kernel[(t,)](q_c, self.w_q, self.q_c_out, q_c.stride(0), Q_LORA, Q_LORA, EPS, BLOCK=2048)
        _rms_norm_kernel[(t,)](kv_c, self.w_kv, self.kv_c_out, kv_c.stride(0), KV_LORA, KV_LORA, EPS, BLOCK=512)
        q_pe = self.q[..., NOPE:]
        n_pairs = t * (self.heads + 1) * (ROPE // 2)
        _rope_gptj_kernel[(triton.cdiv(n_pairs, 1024),)](self.positions, q_pe, k_pe, self.cache, self.q.stride(0),
                                                         self.q.stride(1), k_pe.stride(0), self.heads, n_pairs,
                                                         HALF=ROPE // 2, BLOCK=1024)
        return self.q_c_out, self.kv_c_out, k_pe


def kernel_count(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def time_chain(fn, replays):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # compile / warm up outside the graph
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(reps, n):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        for _ in range(3):
            graph.replay()
        times = []
        for _ in range(n):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0 / reps)
        del graph
        return times

    # Enough copies of the chain in the graph that a replay lasts about 2 ms: the graph's own
    # launch then costs under 1 % of the time per chain.
    one = statistics.median(timed(1, 5))
    reps = max(1, min(100, int(2000.0 / max(one, 1.0))))
    times = timed(reps, replays)
    return statistics.median(times), min(times), max(times), reps


def self_test(dev):
    c = Case(37, 16, dev)
    q0 = c.q.clone()
    kv0 = c.qkv_lora.clone()
    a = [t.float().clone() for t in c.native()]
    q_native = c.q.float().clone()
    c.q.copy_(q0)
    c.qkv_lora.copy_(kv0)
    b = [t.float().clone() for t in c.fused()]
    names = ["q_c", "kv_c", "k_pe"]
    errs = {n: (x.reshape(y.shape) - y).abs().max().item() for n, x, y in zip(names, a, b)}
    errs["q"] = (q_native - c.q.float()).abs().max().item()
    return errs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--time-budget-s", type=float, default=300)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda:0")
    smi_before = smi_snapshot()
    err = self_test(dev)
    print("native vs fused max abs difference per output", err, flush=True)
    rows, failures = [], []
    t0 = time.time()
    for heads in HEADS:
        for tokens in TOKENS:
            if time.time() - t0 > args.time_budget_s:
                failures.append(f"T{tokens} H{heads}: time budget")
                continue
            try:
                c = Case(tokens, heads, dev)
                for path, fn in (("native", c.native), ("fused", c.fused)):
                    kernels = kernel_count(fn)
                    med, lo, hi, reps = time_chain(fn, args.replays)
                    rows.append(dict(tokens=tokens, heads=heads, path=path, latency_us=round(med, 3),
                                     min_us=round(lo, 3), max_us=round(hi, 3), kernels=kernels, reps=reps))
                    print(tokens, heads, path, kernels, round(med, 2), flush=True)
                del c
            except Exception as e:  # noqa: BLE001 - record and go on
                failures.append(f"T{tokens} H{heads}: {type(e).__name__}: {e}"[:300])
                print(failures[-1], flush=True)
            torch.cuda.empty_cache()
    with open(os.path.join(args.out, "mla_dispatch_chain.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    prov = dict(script="microbench/mla_dispatch_chain.py", date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                gpu=torch.cuda.get_device_name(dev), torch=torch.__version__, cuda=torch.version.cuda,
                triton=triton.__version__, replays=args.replays, self_test_max_abs_diff=err,
                timing="chain captured reps times in one CUDA graph, CUDA events per replay / reps, median over replays",
                nvidia_smi_before=smi_before, nvidia_smi_after=smi_snapshot(), failures=failures)
    json.dump(prov, open(os.path.join(args.out, "provenance.json"), "w"), indent=1)


if __name__ == "__main__":
    main()

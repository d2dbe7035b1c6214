#!/usr/bin/env python3
"""Times the elementwise operators of Vidur's `mlp.csv` profiles on this GPU, the way Vidur did.

Vidur's public profiles (A100, H100, A40) time sarathi-serve's operators inside a one-layer
model forward: the embedding, both RMSNorms, the rotary embedding, the SiLU-and-mul and the
residual add of a decoder block, interleaved with the block's fp16 GEMMs, 20 repeats of the
block in one forward after one untimed warm-up forward, each operator's time being the CUPTI
(torch.profiler / Kineto) duration of its kernels. Cross-generation models of those kernels
train on two HBM GPUs when one of A100/H100 is held out, which cannot tell whether the kernels
scale with DRAM bandwidth or with SM count x clock (docs/calibration.md). This script adds a
third HBM GPU that timed the same kernels the same way.

The kernels are re-implementations (written here) with sarathi-serve's launch geometry: one
thread block per token; RMSNorm with min(hidden, 1024) threads, one pass for the sum of squares
and one to scale; SiLU-and-mul with min(d, 1024) threads over [tokens, 2d] input; NeoX rotary
embedding in place on the q and k views of the QKV output with min(heads x rot_dim / 2, 512)
threads; scalar fp16 loads and stores. The residual add is torch's own (`a + b`). The
embedding is torch's `F.embedding` up to 16 tokens (its indexSelectSmallIndex, as in Vidur's
torch) and above that a replica of the indexSelectLargeIndex kernel that torch <= 2.2 ran there
(torch 2.11 runs a vectorized gather instead, 4-6x faster at 512+ tokens on the H200: not the
kernel Vidur timed). Compiled with NVRTC through CuPy, launched on torch's stream.

Output: one Vidur-format `mlp.csv` per model under `<out>/h200/<org>/<model>/` (only the
elementwise operators' `time_stats.<op>.{min,max,mean,median,std}` columns, in ms, plus
Vidur's shape columns), so `kernelsight import vidur` reads it; `<out>/provenance.json`
(versions, GPU, clocks before/after, kernel names per operator, self-test errors, timings) and
`<out>/smi.csv` (nvidia-smi samples every second).

    python3 microbench/vidur_ops.py --out $OUT/vidur_ops [--time-budget-s 480] [--models a,b]
"""
import argparse
import csv
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from collect import now_utc, smi_snapshot, start_smi_monitor, summarize_smi, versions  # noqa: E402

# Vidur's models (shape columns of its mlp.csv files): n_head, n_kv_head, n_embd,
# n_expanded_embd, vocab_size, use_gated_mlp, TP degrees. The first six are profiled on A100,
# H100 and A40; the Llama-3 pair on A100 only.
MODELS = {
    "meta-llama/Llama-2-7b-hf": (32, 32, 4096, 11008, 32768, True, (1, 2, 4, 8)),
    "internlm/internlm-20b": (40, 40, 5120, 13824, 103168, True, (1, 2, 4, 8)),
    "codellama/CodeLlama-34b-Instruct-hf": (64, 8, 8192, 22016, 32768, True, (1, 2, 4, 8)),
    "meta-llama/Llama-2-70b-hf": (64, 8, 8192, 28672, 32768, True, (1, 2, 4, 8)),
    "Qwen/Qwen-72B": (64, 64, 8192, 24576, 152064, True, (1, 2, 4, 8)),
    "microsoft/phi-2": (32, 32, 2560, 10240, 51200, False, (1,)),
    "meta-llama/Meta-Llama-3-8B": (32, 8, 4096, 14336, 128256, True, (1, 2, 4, 8)),
    "meta-llama/Meta-Llama-3-70B": (64, 8, 8192, 28672, 128256, True, (1, 2, 4, 8)),
}
# Vidur's token grid (the 259 values of every mlp.csv up to 4096 tokens).
TOKENS = [1, 2, 4] + list(range(8, 1025, 8)) + list(range(1040, 2049, 16)) + list(range(2080, 4097, 32))
# Vidur's A100 Llama-3 profiles go on to 32,768 tokens; `--long` times those counts for the
# TP degrees listed here (Llama-3-70B at TP 1 and 2 would take minutes of GEMMs).
LONG_TOKENS = list(range(4160, 8193, 64)) + list(range(8320, 16385, 128)) + list(range(16640, 32769, 256))
LONG_MODELS = {"meta-llama/Meta-Llama-3-8B": (1, 2, 4, 8), "meta-llama/Meta-Llama-3-70B": (4, 8)}
ACTIVE_STEPS = 20  # Vidur's repeats of the block inside one profiled forward
SHAPE_COLUMNS = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp",
                 "num_tokens", "num_tensor_parallel_workers"]
STATS = ["min", "max", "mean", "median", "std"]

KERNELS = r"""
#include <cuda_fp16.h>

// One block per token; sum of squares reduced per warp, then across warps.
extern "C" __global__ void ks_rms_norm(__half* out, const __half* in, const __half* weight,
                                       float eps, int hidden) {
  __shared__ float warp_sums[32];
  __shared__ float inv_rms;
  const __half* row = in + (long long)blockIdx.x * hidden;
  float acc = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = __half2float(row[i]);
    acc += v * v;
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    float s = lane < (int)((blockDim.x + 31) / 32) ? warp_sums[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) inv_rms = rsqrtf(s / hidden + eps);
  }
  __syncthreads();
  __half* orow = out + (long long)blockIdx.x * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    orow[i] = __hmul(__float2half(__half2float(row[i]) * inv_rms), weight[i]);
  }
}

// One block per token over [tokens, 2d] input: out = silu(first half) * second half.
extern "C" __global__ void ks_silu_and_mul(__half* out, const __half* in, int d) {
  const long long t = blockIdx.x;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float x = __half2float(__ldg(in + t * 2 * d + i));
    const __half y = __ldg(in + t * 2 * d + d + i);
    out[t * d + i] = __hmul(__float2half(x / (1.f + expf(-x))), y);
  }
}

__device__ __forceinline__ void rotate_pair(__half* head, const __half* cos_p, const __half* sin_p,
                                            int r, int half_dim) {
  const float c = __half2float(__ldg(cos_p + r)), s = __half2float(__ldg(sin_p + r));
  const float x = __half2float(head[r]), y = __half2float(head[half_dim + r]);
  head[r] = __float2half(x * c - y * s);
  head[half_dim + r] = __float2half(y * c + x * s);
}

// torch's indexSelectLargeIndex as it ran index_select for more than 16 indices before the
// vectorized gather (torch <= 2.2, which Vidur used): a grid-stride loop over the output, 128
// threads per block, at most 8 blocks per SM, one 2-byte element per thread, the index major,
// each offset from the 2-d TensorInfo's div/mod chain (runtime sizes, as torch passes them).
extern "C" __global__ void ks_index_select_large(__half* out, const __half* table, const long long* ids,
                                                 unsigned total, unsigned inner, unsigned out_size0,
                                                 unsigned out_size1, unsigned out_stride0, unsigned out_stride1,
                                                 unsigned in_size0, unsigned in_size1, unsigned in_stride0,
                                                 unsigned in_stride1, unsigned out_select_stride,
                                                 unsigned in_select_stride) {
  for (unsigned linear = blockIdx.x * blockDim.x + threadIdx.x; linear < total; linear += gridDim.x * blockDim.x) {
    const unsigned dst_index = linear / inner, elem = linear % inner;
    const unsigned src_index = (unsigned)ids[dst_index];
    unsigned rest = elem, dst_off = 0, src_off = 0;
    dst_off += (rest % out_size1) * out_stride1; rest /= out_size1;
    dst_off += (rest % out_size0) * out_stride0;
    rest = elem;
    src_off += (rest % in_size1) * in_stride1; rest /= in_size1;
    src_off += (rest % in_size0) * in_stride0;
    out[dst_off + dst_index * out_select_stride] = table[src_off + src_index * in_select_stride];
  }
}

// NeoX-style rotary embedding in place, one block per token, q and k rows of stride *_stride.
extern "C" __global__ void ks_rotary_neox(const long long* positions, __half* q, __half* k,
                                          const __half* cos_sin, int rot_dim, int q_stride,
                                          int k_stride, int heads, int kv_heads, int head_dim) {
  const int t = blockIdx.x;
  const __half* cos_p = cos_sin + positions[t] * rot_dim;
  const int half_dim = rot_dim / 2;
  const __half* sin_p = cos_p + half_dim;
  for (int i = threadIdx.x; i < heads * half_dim; i += blockDim.x) {
    rotate_pair(q + (long long)t * q_stride + (i / half_dim) * head_dim, cos_p, sin_p, i % half_dim, half_dim);
  }
  for (int i = threadIdx.x; i < kv_heads * half_dim; i += blockDim.x) {
    rotate_pair(k + (long long)t * k_stride + (i / half_dim) * head_dim, cos_p, sin_p, i % half_dim, half_dim);
  }
}
"""


def classify(name):
    """Which Vidur operator a kernel belongs to (by name); GEMMs and helpers are 'other'."""
    low = name.lower()
    if "ks_rms_norm" in low:
        return "rmsnorm"
    if "ks_silu_and_mul" in low:
        return "mlp_act"
    if "ks_rotary_neox" in low:
        return "attn_rope"
    if "ks_index_select_large" in low:
        return "emb"
    # torch's index_select: indexSelect{Small,Large}Index, or its vectorized gather for
    # contiguous aligned rows.
    if ("index" in low and "select" in low) or "vectorized_gather" in low:
        return "emb"
    if "functor_add" in low:
        return "add"
    return "other"


class Block:
    """One decoder layer's operators on one TP shard, in Vidur's order (mlp_impl.GPTModel)."""

    def __init__(self, torch, cp, mods, name, tp, max_position):
        n_head, n_kv, n_embd, ffn, vocab, gated, _ = MODELS[name]
        self.torch, self.cp, self.mods = torch, cp, mods
        self.gated = gated
        self.hd = n_embd // n_head
        self.heads, self.kv_heads = n_head // tp, n_kv // tp
        self.q_size, self.kv_size = self.heads * self.hd, self.kv_heads * self.hd
        self.vocab = vocab // tp
        self.ffn = ffn // tp
        dev, f16 = "cuda", torch.float16

        def w(*shape):
            return (torch.rand(*shape, device=dev, dtype=f16) - 0.5) * 2e-3  # sarathi's dummy init range

        self.emb = w(self.vocab, n_embd)
        self.norm_w = [w(n_embd) + 1.0, w(n_embd) + 1.0]
        self.w_qkv = w(self.q_size + 2 * self.kv_size, n_embd)
        self.w_o = w(n_embd, self.q_size)
        self.w_up = w((2 if gated else 1) * self.ffn, n_embd)
        self.w_down = w(n_embd, self.ffn)
        inv = 1.0 / (10000.0 ** (torch.arange(0, self.hd, 2, device=dev, dtype=torch.float32) / self.hd))
        freqs = torch.outer(torch.arange(max_position, device=dev, dtype=torch.float32), inv)
        self.cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(f16).contiguous()
        self.sm_count = torch.cuda.get_device_properties(0).multi_processor_count
        self.stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    def inputs(self, tokens):
        t = self.torch
        ids = t.randint(0, self.vocab, (tokens,), device="cuda", dtype=t.long)
        pos = t.arange(tokens, device="cuda", dtype=t.long)
        return ids, pos

    def _rms(self, x, w):
        out = self.torch.empty_like(x)
        n, h = x.shape
        self.mods["rms"]((n,), (min(h, 1024),), (self.cp.asarray(out), self.cp.asarray(x), self.cp.asarray(w),
                                                 self.cp.float32(1e-5), self.cp.int32(h)), stream=self.stream)
        return out

    def _rope(self, pos, qkv):
        n, stride = qkv.shape[0], qkv.stride(0)
        q = qkv[:, : self.q_size]
        k = qkv[:, self.q_size : self.q_size + self.kv_size]
        cp = self.cp
        # q and k are views into qkv: pass qkv's base pointer offset by their column start.
        base = cp.asarray(qkv)
        self.mods["rope"]((n,), (min(self.heads * self.hd // 2, 512),),
                          (cp.asarray(pos), base, base[:, self.q_size:], cp.asarray(self.cos_sin),
                           cp.int32(self.hd), cp.int32(stride), cp.int32(stride), cp.int32(self.heads),
                           cp.int32(self.kv_heads), cp.int32(self.hd)), stream=self.stream)
        return q, k

    def _embedding(self, ids):
        """F.embedding as Vidur's torch ran it: torch's own indexSelectSmallIndex up to 16
        indices (unchanged in torch 2.11), the replica of indexSelectLargeIndex above that."""
        n = ids.shape[0]
        if n <= 16:
            return self.torch.nn.functional.embedding(ids, self.emb)
        h = self.emb.shape[1]
        out = self.torch.empty((n, h), device="cuda", dtype=self.emb.dtype)
        total = n * h
        cp, u = self.cp, self.cp.uint32
        grid = min((total + 127) // 128, 8 * self.sm_count)
        # After torch's reduceDim on the select dimension both TensorInfos are [1, h] / [h, 1].
        self.mods["emb"]((grid,), (min(total, 128),),
                         (cp.asarray(out), cp.asarray(self.emb), cp.asarray(ids), u(total), u(h), u(1), u(h),
                          u(h), u(1), u(1), u(h), u(h), u(1), u(h), u(h)), stream=self.stream)
        return out

    def _silu_mul(self, x):
        n, two_d = x.shape
        out = self.torch.empty((n, two_d // 2), device="cuda", dtype=x.dtype)
        self.mods["silu"]((n,), (min(two_d // 2, 1024),), (self.cp.asarray(out), self.cp.asarray(x),
                                                         self.cp.int32(two_d // 2)), stream=self.stream)
        return out

    def forward(self, ids, pos, repeats):
        """GPTModel.forward: one embedding, then `repeats` x (embedding + block)."""
        F = self.torch.nn.functional
        h = self._embedding(ids)
        for _ in range(repeats):
            h = self._embedding(ids)
            residual = h
            x = self._rms(h, self.norm_w[0]) if self.gated else F.layer_norm(h, h.shape[-1:])
            qkv = F.linear(x, self.w_qkv)
            if self.gated:
                self._rope(pos, qkv)
            attn = self.torch.randn(qkv.shape[0], self.q_size, device="cuda", dtype=qkv.dtype)
            attn_out = F.linear(attn, self.w_o)
            if self.gated:
                h = residual + attn_out  # untimed in Vidur's block
                residual = h
                x = self._rms(h, self.norm_w[1])
                up = F.linear(x, self.w_up)
                h = F.linear(self._silu_mul(up), self.w_down)
                h = residual + h  # the timed add
            else:
                ff = F.linear(F.gelu(F.linear(x, self.w_up), approximate="tanh"), self.w_down)
                h = attn_out + ff + residual  # phi-2's parallel block: two adds, both timed
        return h

    def expected(self, repeats):
        """Kernels per forward for each operator, and which of them Vidur's timers cover."""
        if self.gated:
            return {"emb": repeats + 1, "rmsnorm": 2 * repeats, "attn_rope": repeats, "mlp_act": repeats,
                    "add": 2 * repeats}
        return {"emb": repeats + 1, "add": 2 * repeats}


def per_op_times(block, counts_kernels, repeats):
    """Per Vidur operator, the list of per-repeat times in us from one forward's kernels."""
    ks = counts_kernels
    out = {}
    emb = ks["emb"][1:]  # the forward's first embedding is outside the timed repeats
    out["emb"] = emb
    if block.gated:
        rms = ks["rmsnorm"]
        out["input_layernorm"] = rms[0::2]
        out["post_attention_layernorm"] = rms[1::2]
        out["attn_rope"] = ks["attn_rope"]
        out["mlp_act"] = ks["mlp_act"]
        out["add"] = ks["add"][1::2]
    else:
        adds = ks["add"]
        out["add"] = [a + b for a, b in zip(adds[0::2], adds[1::2])]
    for k, v in out.items():
        if len(v) != repeats:
            raise RuntimeError(f"{k}: {len(v)} timed kernels, expected {repeats}")
    return out


def self_test(torch, block):
    """Relative error of the three kernels against torch references at one shape."""
    ids, pos = block.inputs(64)
    x = torch.randn(64, block.emb.shape[1], device="cuda", dtype=torch.float16)
    w = block.norm_w[0]
    ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).half() * w
    errs = {"rmsnorm": ((block._rms(x, w).float() - ref.float()).norm() / ref.float().norm()).item()}
    up = torch.randn(64, 2 * block.ffn, device="cuda", dtype=torch.float16)
    a, b = up.float().chunk(2, dim=-1)
    ref = torch.nn.functional.silu(a) * b
    errs["silu_mul"] = ((block._silu_mul(up).float() - ref).norm() / ref.norm()).item()
    qkv = torch.randn(64, block.q_size + 2 * block.kv_size, device="cuda", dtype=torch.float16)
    q0 = qkv[:, : block.q_size].float().view(64, block.heads, block.hd)
    cs = block.cos_sin[pos].float()
    cos, sin = cs[:, : block.hd // 2][:, None, :], cs[:, block.hd // 2 :][:, None, :]
    x1, x2 = q0[..., : block.hd // 2], q0[..., block.hd // 2 :]
    ref = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    block._rope(pos, qkv)
    torch.cuda.synchronize()
    got = qkv[:, : block.q_size].float().view(64, block.heads, block.hd)
    errs["rope"] = ((got - ref).norm() / ref.norm()).item()
    errs["embedding_exact"] = bool(torch.equal(block._embedding(ids), block.emb[ids]))
    return errs


def kernel_events(prof, torch):
    """(start, duration us, name) of every GPU kernel the profiler saw, in start order."""
    evs = []
    for e in prof.profiler.kineto_results.events():
        if e.device_type() != torch.autograd.DeviceType.CUDA:
            continue
        if hasattr(e, "start_ns"):
            evs.append((e.start_ns(), e.duration_ns() / 1000.0, e.name()))
        else:
            evs.append((e.start_us() * 1000, float(e.duration_us()), e.name()))
    evs.sort()
    return evs


def profile_model(torch, cp, mods, name, tp, tokens, names_seen):
    """Vidur-format rows for one (model, tp) over `tokens`: one profiler session around all
    token counts (a session per point costs more than the kernels), split per token count by
    each operator's fixed kernel count."""
    from torch.profiler import ProfilerActivity, profile

    block = Block(torch, cp, mods, name, tp, max(tokens))
    inputs = [block.inputs(t) for t in tokens]
    for ids, pos in inputs:
        block.forward(ids, pos, 2)  # warm-up (cuBLAS heuristics, NVRTC modules)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for ids, pos in inputs:
            block.forward(ids, pos, ACTIVE_STEPS)
        torch.cuda.synchronize()
    by_op = {}
    for _, dur_us, kname in kernel_events(prof, torch):
        op = classify(kname)
        by_op.setdefault(op, []).append(dur_us)
        names_seen.setdefault(op, set()).add(kname[:160])
    want = block.expected(ACTIVE_STEPS)
    got = {k: len(by_op.get(k, [])) for k in want}
    if got != {k: v * len(tokens) for k, v in want.items()}:
        raise RuntimeError(f"{name} tp{tp}: kernels per operator {got}, expected {want} x {len(tokens)} token counts")
    n_head, n_kv, n_embd, ffn, vocab, gated, _ = MODELS[name]
    rows = []
    for i, t in enumerate(tokens):
        mine = {k: by_op[k][i * want[k] : (i + 1) * want[k]] for k in want}
        row = {"n_head": n_head, "n_kv_head": n_kv, "n_embd": n_embd, "n_expanded_embd": ffn,
               "vocab_size": vocab, "use_gated_mlp": gated, "num_tokens": t, "num_tensor_parallel_workers": tp}
        for op, v in per_op_times(block, mine, ACTIVE_STEPS).items():
            ms = [x / 1000.0 for x in v]
            for s, val in zip(STATS, (min(ms), max(ms), statistics.mean(ms), statistics.median(ms), statistics.pstdev(ms))):
                row[f"time_stats.{op}.{s}"] = f"{val:.6f}"
        rows.append(row)
    return block, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--time-budget-s", type=float, default=480.0, help="stop starting new (model, tp) after this")
    ap.add_argument("--models", default="", help="comma-separated subset of the model names")
    ap.add_argument("--token-stride", type=int, default=1, help="use every n-th grid token count")
    ap.add_argument("--long", action="store_true", help="only Vidur's 4,160-32,768 token counts, for LONG_MODELS")
    ap.add_argument("--model-file", help="JSON {name: [n_head, n_kv_head, n_embd, n_expanded_embd, vocab_size, "
                    "gated, [tp, ...]]}: time these models instead of Vidur's")
    args = ap.parse_args()

    def vidur_gpu_dir(device_name):
        # Vidur's profiling folders name the GPU (a100, h100, a40); `kernelsight import vidur` maps them.
        for key, d in (("H200", "h200"), ("H100", "h100"), ("A100", "a100")):
            if key in device_name:
                return d
        raise SystemExit(f"no Vidur GPU folder name for {device_name!r}")

    import cupy as cp
    import torch

    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    prov = {"command": " ".join(sys.argv), "start_utc": now_utc(), "smi_before": smi_snapshot(),
            "versions": versions(torch), "cupy": cp.__version__, "gpu": torch.cuda.get_device_name(0),
            "method": "torch.profiler (CUPTI) kernel durations, 20 block repeats in one forward after a 2-repeat warm-up, "
                      "no L2 flush (Vidur's RECORD_FUNCTION profile method)",
            "runs": [], "failures": []}
    smi_proc, smi_file = start_smi_monitor(os.path.join(args.out, "smi.csv"))
    module = cp.RawModule(code=KERNELS, options=("-std=c++17",))
    mods = {"rms": module.get_function("ks_rms_norm"), "silu": module.get_function("ks_silu_and_mul"),
            "rope": module.get_function("ks_rotary_neox"), "emb": module.get_function("ks_index_select_large")}
    if args.model_file:
        with open(args.model_file) as f:
            extra = {name: (*v[:6], tuple(v[6])) for name, v in json.load(f).items()}
        MODELS.update(extra)
        plan = {m: MODELS[m][6] for m in extra}
    else:
        plan = LONG_MODELS if args.long else {m: MODELS[m][6] for m in MODELS}
    names = [m for m in plan if not args.models or m in args.models.split(",")]
    tokens = (LONG_TOKENS if args.long else TOKENS)[:: args.token_stride]
    names_seen = {}
    try:
        for name in names:
            rows = []
            for tp in plan[name]:
                if time.time() - t0 > args.time_budget_s:
                    prov["failures"].append({"model": name, "tp": tp, "error": "time budget reached, not run"})
                    continue
                t1 = time.time()
                try:
                    block, r = profile_model(torch, cp, mods, name, tp, tokens, names_seen)
                    if "self_test" not in prov and block.gated:
                        prov["self_test"] = self_test(torch, block)
                    rows.extend(r)
                    prov["runs"].append({"model": name, "tp": tp, "rows": len(r), "seconds": round(time.time() - t1, 1)})
                except Exception as e:  # one failing model must not lose the others
                    prov["failures"].append({"model": name, "tp": tp, "error": repr(e)[:500]})
                torch.cuda.empty_cache()
                print(f"{name} tp{tp}: {time.time() - t1:.1f} s", flush=True)
            if rows:
                d = os.path.join(args.out, vidur_gpu_dir(prov["gpu"]), name)
                os.makedirs(d, exist_ok=True)
                cols = [c for c in rows[0] if c.startswith("time_stats.")] + SHAPE_COLUMNS
                with open(os.path.join(d, "mlp.csv"), "w", newline="") as f:
                    wr = csv.DictWriter(f, fieldnames=cols)
                    wr.writeheader()
                    wr.writerows(rows)
    finally:
        if smi_proc is not None:
            smi_proc.terminate()
            smi_proc.wait()
            smi_file.close()
        prov["kernel_names"] = {k: sorted(v)[:40] for k, v in names_seen.items()}
        prov.update({"end_utc": now_utc(), "seconds": round(time.time() - t0, 1), "smi_after": smi_snapshot(),
                     "smi_during": summarize_smi(os.path.join(args.out, "smi.csv"))})
        with open(os.path.join(args.out, "provenance.json"), "w") as f:
            json.dump(prov, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Time vLLM 0.24.0's own Marlin MXFP4 MoE path (gpt-oss's experts under
VLLM_MXFP4_USE_MARLIN=1) on this GPU, with vLLM's compiled kernels.

The device image has no vLLM, so this loads the one compiled library the path needs,
`_moe_C_stable_libtorch.abi3.so` from the PyPI wheel vllm==0.24.0 (built for torch 2.11 / CUDA
13, the image's versions), and calls its ops the way vLLM 0.24.0's FusedMoE does for an MXFP4
checkpoint on the Marlin backend (fused_moe/experts/marlin_moe.py):

  pad hidden to the Marlin multiple (gpt-oss 2880 -> 3072), router topk_softmax (renormalized),
  moe_align_block_size, moe_wna16_marlin_gemm (w13, bias), SwiGLU-OAI, moe_wna16_marlin_gemm
  (w2, bias, router weights), sum over top-k, slice.

Two stand-ins, both elementwise: the SwiGLU-OAI activation (vLLM's `_C.swigluoai_and_mul`
lives in the 110 MB `_C` library that does not travel) is one Triton kernel with the same
reads and writes, and the weights are random bits in Marlin's packed shapes (no repack:
timing does not depend on the values). Routing (`--routing`): balanced (token i takes experts
(i*topk + j) mod E, like aiconfigurator's `balanced_logits` rows; the default), uniform, or the
collector's power law.

Timing: the whole forward captured in one CUDA graph per weight copy; enough copies that the
weights cycled through exceed 4x the L2; median over replays, CUDA events. Output: one CSV row
per shape in the shared kernel-shape schema (op moe, dtype fp4, latency_us) plus provenance JSON.
"""
import argparse
import hashlib
import json
import lzma
import os
import statistics
import subprocess
import sys
import time

import torch
import triton
import triton.language as tl

# vllm.scalar_type.scalar_types.float4_e2m1f.id in vLLM 0.24.0 (ScalarType.id packs
# exponent 2, mantissa 1, signed, finite-values-only, NaN repr none).
FLOAT4_E2M1F_ID = 562949953487106
GPT_OSS_ALPHA, GPT_OSS_LIMIT = 1.702, 7.0
TOKENS = [1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024,
          1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384]


@triton.jit
def _swigluoai_and_mul(x_ptr, y_ptr, n, alpha, limit, BLOCK: tl.constexpr):
    # x rows are [gate0, up0, gate1, up1, ...] (gpt-oss interleaves w13), y = (up + 1) * glu.
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    gate = tl.load(x_ptr + row * 2 * n + 2 * cols, mask=mask).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * n + 2 * cols + 1, mask=mask).to(tl.float32)
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    glu = gate * tl.sigmoid(alpha * gate)
    tl.store(y_ptr + row * n + cols, ((up + 1.0) * glu).to(y_ptr.dtype.element_ty), mask=mask)


def swigluoai_and_mul(out, x):
    rows, n = out.shape
    _swigluoai_and_mul[(rows, triton.cdiv(n, 1024))](x, out, n, GPT_OSS_ALPHA, GPT_OSS_LIMIT, BLOCK=1024)


def round_up(x, m):
    return (x + m - 1) // m * m


class MarlinMoe:
    """One layer's experts in Marlin's MXFP4 layout (shapes of prepare_moe_mxfp4_layer_for_marlin)."""

    def __init__(self, hidden, inter_local, experts, topk, dev):
        self.hidden, self.experts, self.topk = hidden, experts, topk
        self.k = round_up(hidden, 256)          # Mxfp4MoeBackend.MARLIN rounding
        self.n = round_up(inter_local, 128)
        k, n, e = self.k, self.n, experts
        rnd = lambda *s: torch.randint(-2**31, 2**31 - 1, s, dtype=torch.int32, device=dev)
        self.w13 = rnd(e, k // 16, 2 * n * 2)   # 4-bit tiles: (K/16, N*16/8) int32
        self.w2 = rnd(e, n // 16, k * 2)
        # e8m0 scales near 1.0 (exponent bytes 120..134) so the math stays finite.
        sc = lambda *s: torch.randint(120, 134, s, dtype=torch.uint8, device=dev).view(torch.float8_e8m0fnu)
        self.s13 = sc(e, k // 32, 2 * n)
        self.s2 = sc(e, n // 32, k)
        self.b13 = torch.randn(e, 2 * n, dtype=torch.bfloat16, device=dev)
        self.b2 = torch.randn(e, k, dtype=torch.bfloat16, device=dev)
        self.workspace = torch.zeros(torch.cuda.get_device_properties(dev).multi_processor_count * 4,
                                     dtype=torch.int32, device=dev)

    def weight_bytes(self):
        return sum(t.numel() * t.element_size() for t in (self.w13, self.w2, self.s13, self.s2, self.b13, self.b2))


def forward(ops, moe, x, logits):
    m = x.shape[0]
    e, topk, k, n = moe.experts, moe.topk, moe.k, moe.n
    xp = torch.nn.functional.pad(x, (0, k - moe.hidden))
    tw = torch.empty(m, topk, dtype=torch.float32, device=x.device)
    ti = torch.empty(m, topk, dtype=torch.int32, device=x.device)
    tei = torch.empty(m, topk, dtype=torch.int32, device=x.device)
    ops.topk_softmax(tw, ti, tei, logits, True, None)
    for block_m in [8, 16, 32, 48, 64]:         # fused_marlin_moe's block choice
        if m * topk / e / block_m < 0.9:
            break
    padded = ti.numel() + e * (block_m - 1)
    if ti.numel() < e:
        padded = min(ti.numel() * block_m, padded)
    sorted_ids = torch.empty(padded, dtype=torch.int32, device=x.device)
    expert_ids = torch.empty(triton.cdiv(padded, block_m), dtype=torch.int32, device=x.device)
    npad = torch.empty(1, dtype=torch.int32, device=x.device)
    ops.moe_align_block_size(ti, e, block_m, sorted_ids, expert_ids, npad, None)
    cache13 = torch.empty(m * topk * max(2 * n, k), dtype=x.dtype, device=x.device)
    c1 = cache13[: m * topk * 2 * n].view(m * topk, 2 * n)
    c3 = cache13[: m * topk * k].view(m * topk, k)
    c2 = torch.empty(m * topk, n, dtype=x.dtype, device=x.device)
    c1 = ops.moe_wna16_marlin_gemm(xp, c1, moe.w13, moe.b13, moe.s13, None, None, None, None, None,
                                   moe.workspace, sorted_ids, expert_ids, npad, tw, block_m, topk, False,
                                   FLOAT4_E2M1F_ID, m, 2 * n, k, True, False, True, False, -1, -1, -1)
    swigluoai_and_mul(c2, c1)
    c3 = ops.moe_wna16_marlin_gemm(c2, c3, moe.w2, moe.b2, moe.s2, None, None, None, None, None,
                                   moe.workspace, sorted_ids, expert_ids, npad, tw, block_m, 1, True,
                                   FLOAT4_E2M1F_ID, m * topk, k, n, True, False, True, False, -1, -1, -1)
    out = torch.empty(m, k, dtype=x.dtype, device=x.device)
    ops.moe_sum(c3.view(m, topk, k), out)
    return out[:, : moe.hidden]


ROUTINGS = ("balanced", "uniform", "power_law_1.2")


def routed_logits(m, e, topk, routing, dev, seed=1234):
    """Router logits whose top-k are the experts `routing` picks: `balanced` (token i takes
    (i*topk + j) mod E, like aiconfigurator's `balanced_logits`), `uniform` (k distinct experts per
    token, uniformly at random) or `power_law_1.2` (k distinct per token, probability ~
    rank^-1.2 over a random ranking of the experts; the collector's generator, collect.py)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rows = torch.arange(m).unsqueeze(1)
    if routing == "balanced":
        cols = (rows * topk + torch.arange(topk).unsqueeze(0)) % e
    elif routing == "uniform":
        cols = torch.rand(m, e, generator=gen).argsort(dim=1)[:, :topk]
    else:
        alpha = float(routing.removeprefix("power_law_"))
        prob = (torch.arange(e, dtype=torch.float64) + 1) ** -alpha
        prob = prob[torch.randperm(e, generator=gen)]
        cols = torch.multinomial(prob.expand(m, e), topk, replacement=False, generator=gen)
    logits = torch.randn(m, e, generator=gen).mul_(0.01)
    logits[rows, cols] = 10.0
    return logits.to(device=dev, dtype=torch.bfloat16)


def time_shape(ops, copies, m, dev, replays, routing="balanced"):
    x = torch.randn(m, copies[0].hidden, dtype=torch.bfloat16, device=dev)
    logits = routed_logits(m, copies[0].experts, copies[0].topk, routing, dev)
    graphs = []
    for moe in copies:
        forward(ops, moe, x, logits)            # warm up (Triton compile, Marlin config)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            forward(ops, moe, x, logits)
        graphs.append(g)
    for g in graphs * 2:
        g.replay()
    torch.cuda.synchronize()
    times = []
    for i in range(replays):
        g = graphs[i % len(graphs)]
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    del graphs
    return statistics.median(times), min(times), max(times)


def load_ops(blob):
    lib = "/tmp/vllm_moe_C_stable_libtorch.abi3.so"
    if not os.path.exists(lib):
        with lzma.open(blob) as f, open(lib, "wb") as g:
            g.write(f.read())
    torch.ops.load_library(lib)
    return torch.ops._moe_C, hashlib.sha256(open(lib, "rb").read()).hexdigest()


def smi():
    q = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu"
    try:
        return subprocess.check_output(["nvidia-smi", f"--query-gpu={q}", "--format=csv"], text=True)
    except Exception as e:  # noqa: BLE001 - provenance only
        return f"nvidia-smi failed: {e}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blob", required=True, help="xz-compressed _moe_C_stable_libtorch.abi3.so of vllm 0.24.0")
    ap.add_argument("--out", required=True)
    ap.add_argument("--time-budget-s", type=float, default=400)
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--routing", default="balanced", help=f"comma-separated, of {', '.join(ROUTINGS)}")
    ap.add_argument("--cases", help="comma-separated case labels to run (default: all)")
    ap.add_argument("--tp", help="comma-separated moe_tp sizes to run (default: all)")
    args = ap.parse_args()
    routings = args.routing.split(",")
    if any(r not in ROUTINGS for r in routings):
        sys.exit(f"--routing {args.routing}: allowed {', '.join(ROUTINGS)}")
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda:0")
    ops, sha = load_ops(args.blob)
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    # (label, hidden, inter, experts, topk, moe_tp): gpt-oss-120b / -20b at TP 1-8 and the
    # 3584 x 3072 top-16-of-896 checkpoint aiconfigurator timed with this kernel on the H200.
    cases = [("gpt-oss-120b", 2880, 2880, 128, 4, tp) for tp in (8, 4, 2, 1)]
    cases += [("gpt-oss-20b", 2880, 2880, 32, 4, tp) for tp in (8, 4, 2, 1)]
    cases += [("aic-3584x3072-e896", 3584, 3072, 896, 16, 1)]
    if args.cases:
        cases = [c for c in cases if c[0] in args.cases.split(",")]
    if args.tp:
        cases = [c for c in cases if str(c[5]) in args.tp.split(",")]
    rows, failures = [], []
    t0 = time.time()
    for label, hidden, inter, experts, topk, tp in cases:
        one = MarlinMoe(hidden, inter // tp, experts, topk, dev)
        n_copies = max(1, min(8, -(-4 * l2 // one.weight_bytes())))
        copies = [one] + [MarlinMoe(hidden, inter // tp, experts, topk, dev) for _ in range(n_copies - 1)]
        for m in TOKENS:
            if label.startswith("aic") and m > 512:
                break
            for routing in routings:
                if time.time() - t0 > args.time_budget_s:
                    failures.append(f"{label} tp{tp} m{m} {routing}: time budget")
                    break
                try:
                    med, lo, hi = time_shape(ops, copies, m, dev, args.replays, routing)
                except Exception as e:  # noqa: BLE001 - record and go on
                    failures.append(f"{label} tp{tp} m{m} {routing}: {type(e).__name__}: {e}"[:300])
                    print(failures[-1], flush=True)
                    torch.cuda.empty_cache()
                    continue
                rows.append(dict(op="moe", dtype="fp4", num_tokens=m, hidden=hidden, inter=inter, topk=topk,
                                 num_experts=experts, tp=tp, ep=1, latency_us=round(med, 3),
                                 min_us=round(lo, 3), max_us=round(hi, 3), weight_copies=n_copies, case=label,
                                 routing=routing))
                print(label, tp, m, routing, round(med, 2), flush=True)
        del copies, one
        torch.cuda.empty_cache()
    cols = list(rows[0].keys()) if rows else []
    with open(os.path.join(args.out, "marlin_moe.csv"), "w") as f:
        f.write(",".join(cols) + "\n")
        for r in rows:
            f.write(",".join(str(r[c]) for c in cols) + "\n")
    prov = dict(script="microbench/vllm_marlin_moe.py", date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                gpu=torch.cuda.get_device_name(dev), torch=torch.__version__, cuda=torch.version.cuda,
                triton=triton.__version__, vllm_library="vllm==0.24.0 wheel, _moe_C_stable_libtorch.abi3.so "
                "(stripped, non-sm_90 cubins zeroed)", library_sha256=sha, replays=args.replays,
                routing=routings, timing="CUDA graph of the whole forward, CUDA events, median over replays, "
                "weight copies cycled", nvidia_smi=smi(), failures=failures)
    json.dump(prov, open(os.path.join(args.out, "provenance.json"), "w"), indent=1)
    print(f"{len(rows)} rows, {len(failures)} failures", flush=True)


if __name__ == "__main__":
    sys.exit(main())

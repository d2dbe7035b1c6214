#!/usr/bin/env python3
"""Times vLLM 0.24's default sampler on the GPU: what `Sampler.sample` runs for requests with a
temperature and no top-k / top-p / penalties (`vllm/v1/worker/gpu/sample/sampler.py`): the
logits copied to a new fp32 tensor, the Triton Gumbel-max kernel over 1,024-token blocks
(`gumbel_sample`), the argmax over its per-block maxima and the gather of the winning token.
Rows in the shared kernel-shape schema: op `sampling`, dtype fp32 (the sampler's precision),
num_tokens = sequences sampled, hidden = vocabulary size, backend `vllm/gumbel`.

Timing: the four kernels of `REPEATS` samplings captured in one CUDA graph, the graph replayed
`REPLAYS` times between CUDA events, the median replay over `REPEATS`. Random bf16 logits; no L2
flush, since in the engine the logits GEMM has just written them. Needs vLLM on the path
(`microbench/tools/vllm_runtime.sh`).
Usage: python3 microbench/vllm_sampler.py --out OUT.csv
"""
import argparse
import csv
import datetime
import json
import os
import statistics

import torch

from collect import OUTPUT_COLUMNS  # the collector's output schema

REPEATS = 10
REPLAYS = 30
SEQS = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]
VOCABS = [32000, 128256, 151936, 201088, 262208]


def time_sampler(num_seqs, vocab, gumbel_sample):
    dev = "cuda"
    logits = torch.randn(num_seqs, vocab, device=dev, dtype=torch.bfloat16)
    idx_mapping = torch.arange(num_seqs, device=dev, dtype=torch.int32)
    temperature = torch.ones(num_seqs, device=dev, dtype=torch.float32)
    seeds = torch.randint(0, 2**62, (num_seqs,), device=dev, dtype=torch.int64)
    pos = torch.randint(0, 4096, (num_seqs,), device=dev, dtype=torch.int64)

    def one():
        l32 = torch.empty_like(logits, dtype=torch.float32).copy_(logits)
        return gumbel_sample(l32, idx_mapping, temperature, seeds, pos, apply_temperature=False)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):  # compile the Triton kernel, warm the allocator
            one()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(REPEATS):
            out = one()
    for _ in range(3):
        g.replay()
    times = []
    for _ in range(REPLAYS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / REPEATS)
    assert out.shape == (num_seqs,) and int(out.max()) < vocab
    times.sort()
    return statistics.median(times), times[len(times) // 10], times[(9 * len(times)) // 10]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample
    import vllm

    torch.manual_seed(28)
    props = torch.cuda.get_device_properties(0)
    source = f"kernelsight vllm_sampler.py {datetime.date.today().isoformat()} vllm {vllm.__version__}"
    rows = []
    for vocab in VOCABS:
        for n in SEQS:
            med, p10, p90 = time_sampler(n, vocab, gumbel_sample)
            row = {c: "" for c in OUTPUT_COLUMNS}
            row.update(op="sampling", dtype="fp32", num_tokens=n, hidden=vocab, latency_us=f"{med:.4f}", p10_us=f"{p10:.4f}",
                       p90_us=f"{p90:.4f}", reps=REPLAYS, launches_per_rep=REPEATS, method="cuda_graph", backend="vllm/gumbel",
                       gpu="h200_sxm", source=source)
            rows.append(row)
            print(f"sampling seqs={n} vocab={vocab}: {med:.2f} us (p10 {p10:.2f}, p90 {p90:.2f})", flush=True)
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, OUTPUT_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    prov = {"command": "python3 microbench/vllm_sampler.py --out " + os.path.basename(a.out), "device_name": props.name,
            "sm_count": props.multi_processor_count, "torch": torch.__version__, "cuda": torch.version.cuda, "vllm": vllm.__version__,
            "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "repeats_per_graph": REPEATS,
            "replays": REPLAYS, "l2_flush": False}
    with open(os.path.splitext(a.out)[0] + ".provenance.json", "w") as f:
        json.dump(prov, f, indent=1)


if __name__ == "__main__":
    main()

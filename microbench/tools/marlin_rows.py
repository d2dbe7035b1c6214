#!/usr/bin/env python3
"""Shared-schema rows from `microbench/vllm_marlin_moe.py`'s output (its marlin_moe.csv).

    python3 microbench/tools/marlin_rows.py RAW.csv OUT.csv "kernelsight-collect DATE vllm_marlin_moe.py"

Backend and kernel use aiconfigurator's names for the same vLLM 0.24.0 path
(`vllm-0.24.0/w4a16_mxfp4`, `vllm_gptossmxfp4moe_marlin_marlinexperts`), so the rows share a
library category with its L40S Marlin rows. Standard library only.
"""
import csv
import sys

COLS = "op,dtype,num_tokens,hidden,inter,topk,num_experts,tp,ep,latency_us,method,gpu,source,backend,kernel,routing".split(",")


def main():
    raw, out, source = sys.argv[1:4]
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLS)
        for r in csv.DictReader(open(raw)):
            w.writerow(["moe", "fp4", r["num_tokens"], r["hidden"], r["inter"], r["topk"], r["num_experts"], r["tp"],
                        r["ep"], r["latency_us"], "cuda_graph", "h200_sxm", source, "vllm-0.24.0/w4a16_mxfp4",
                        "vllm_gptossmxfp4moe_marlin_marlinexperts", r.get("routing") or "balanced"])


if __name__ == "__main__":
    main()

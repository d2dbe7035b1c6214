#!/usr/bin/env bash
# Session 48's device call, whichever GPU the lent pool gives (writes $OUT/s48.tgz):
#   H200: the owed stages (microbench/owed_measurements.sh) less the static MoE decode (measured
#         twice on H100s), so the capture sweep with its host probe fits: the H200 reference the
#         capture term lacks (docs/validation_e2e.md, "Where the H100 blind TTFT goes wrong");
#   other GPUs: per-run memory records on a token-budget x KV-pool grid, CUDA graphs and eager
#         (plan memory48: llama-3.2-3b, qwen2.5-7b, gemma-3-27b-it-L6, mistral-7b-v0.1-L16);
#         S48_PLAN=selfsize48: transformers sizing its own cache.
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
mkdir -p "$OUT/s48"
if [[ "$gpu" != *H200* && "${S48_H200_ONLY:-0}" == 1 ]]; then
  echo "not an H200: nothing to run (S48_H200_ONLY)"
elif [[ "$gpu" == *H200* ]]; then
  OWED_SKIP=${OWED_SKIP:-static_moe} OWED_BUDGET_S=${S48_BUDGET_S:-560} OUT="$OUT/s48" bash microbench/owed_measurements.sh
else
  nvidia-smi -q -d CLOCK,POWER,PERFORMANCE > "$OUT/s48/smi_q.txt" 2>&1
  (grep -m1 "model name" /proc/cpuinfo; nproc; cat /proc/loadavg) > "$OUT/s48/cpu.txt"
  python3 microbench/e2e/host_speed_probe.py --out "$OUT/s48/probe_0.json" > /dev/null 2>&1
  plan=${S48_PLAN:-memory48}
  PYTHONUNBUFFERED=1 timeout 290 python3 microbench/e2e/harness.py --plan $plan --out "$OUT/s48/mem" > "$OUT/s48/mem.log" 2>&1
  echo "$plan rc=$?"
  python3 microbench/e2e/host_speed_probe.py --out "$OUT/s48/probe_1.json" > /dev/null 2>&1
  tail -5 "$OUT/s48/mem.log"
fi
tar czf /tmp/s48.tgz -C "$OUT" s48 && rm -rf "$OUT/s48" && mv /tmp/s48.tgz "$OUT/s48.tgz"
ls -la "$OUT"

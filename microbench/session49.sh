#!/usr/bin/env bash
# Session 49's device call, whichever GPU the lent pool gives (writes $OUT/s49.tgz):
#   every GPU: plan longctx49 (long prompts at low concurrency, CUDA graphs; pre-registered in
#              microbench/predictions/longctx49.md), host probes before and after;
#   H200 only, after it: the owed capture sweep with its host probe (microbench/owed_measurements.sh
#              stage `capture`), unless S49_SKIP_OWED=1.
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
mkdir -p "$OUT/s49"
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE > "$OUT/s49/smi_q.txt" 2>&1
(grep -m1 "model name" /proc/cpuinfo; nproc; cat /proc/loadavg) > "$OUT/s49/cpu.txt"
python3 microbench/e2e/host_speed_probe.py --out "$OUT/s49/probe_0.json" > /dev/null 2>&1
PYTHONUNBUFFERED=1 timeout 310 python3 microbench/e2e/harness.py --plan longctx49 --out "$OUT/s49/longctx" > "$OUT/s49/longctx.log" 2>&1
echo "longctx49 rc=$?"
python3 microbench/e2e/host_speed_probe.py --out "$OUT/s49/probe_1.json" > /dev/null 2>&1
tail -5 "$OUT/s49/longctx.log"
if [[ "$gpu" == *H200* && "${S49_SKIP_OWED:-0}" != 1 ]]; then
  mkdir -p "$OUT/s49/owed"
  OWED_SKIP=sustained,sdpa,memcpy,fp8,static_moe OWED_BUDGET_S=${S49_OWED_BUDGET_S:-200} OUT="$OUT/s49/owed" bash microbench/owed_measurements.sh
fi
tar czf /tmp/s49.tgz -C "$OUT" s49 && rm -rf "$OUT/s49" && mv /tmp/s49.tgz "$OUT/s49.tgz"
ls -la "$OUT"

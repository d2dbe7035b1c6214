#!/usr/bin/env bash
# Session 47's device call, whichever GPU the lent pool gives (writes $OUT/s47.tgz):
#   H200: the owed stages (microbench/owed_measurements.sh) less the static MoE decode (measured
#         twice on H100s), so the capture sweep with its host probe fits: the H200 reference the
#         capture term lacks (docs/validation_e2e.md, "Where the H100 blind TTFT goes wrong");
#   other GPUs: per-run memory records (peak, what stays allocated, CUDA-graph pools) of
#         llama-3.2-3b and gpt-oss-20b-L8 with graphs (plan memory47), then eager_blind12's runs
#         (four models never run eager off the H200) within 300 s (plan eager_blind47), blind;
#         with S47_SECOND=1, gpt-oss's graph pools shape by shape instead (plan memory47b).
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
mkdir -p "$OUT/s47"
if [[ "$gpu" != *H200* && "${S47_H200_ONLY:-0}" == 1 ]]; then
  echo "not an H200: nothing to run (S47_H200_ONLY)"
elif [[ "$gpu" == *H200* ]]; then
  OWED_SKIP=${OWED_SKIP:-static_moe} OWED_BUDGET_S=${S47_BUDGET_S:-560} OUT="$OUT/s47" bash microbench/owed_measurements.sh
else
  nvidia-smi -q -d CLOCK,POWER,PERFORMANCE > "$OUT/s47/smi_q.txt" 2>&1
  (grep -m1 "model name" /proc/cpuinfo; nproc; cat /proc/loadavg) > "$OUT/s47/cpu.txt"
  python3 microbench/e2e/host_speed_probe.py --out "$OUT/s47/probe_0.json" > /dev/null 2>&1
  if [[ "${S47_SECOND:-0}" == 1 ]]; then  # memory47 and eager_blind47 ran in the first call
    PYTHONUNBUFFERED=1 timeout 170 python3 microbench/e2e/harness.py --plan memory47b --out "$OUT/s47/mem" > "$OUT/s47/mem.log" 2>&1
    echo "memory47b rc=$?"
  else
    PYTHONUNBUFFERED=1 timeout 230 python3 microbench/e2e/harness.py --plan memory47 --out "$OUT/s47/mem" > "$OUT/s47/mem.log" 2>&1
    echo "memory rc=$?"
    PYTHONUNBUFFERED=1 timeout 300 python3 microbench/e2e/harness.py --plan eager_blind47 --out "$OUT/s47/raw" > "$OUT/s47/eager.log" 2>&1
    echo "eager rc=$?"
  fi
  python3 microbench/e2e/host_speed_probe.py --out "$OUT/s47/probe_1.json" > /dev/null 2>&1
  tail -5 "$OUT/s47/mem.log"
fi
tar czf /tmp/s47.tgz -C "$OUT" s47 && rm -rf "$OUT/s47" && mv /tmp/s47.tgz "$OUT/s47.tgz"
ls -la "$OUT"

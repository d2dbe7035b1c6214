#!/usr/bin/env bash
# Session 52's device call, whichever GPU the lent pool gives (writes $OUT/s52.tgz). Stages in
# order of value, within S52_BUDGET_S seconds (default 575):
#   1. plan eager52 with KS_STEP_LOOP_N=10000: every eager step records its vCPU's Python speed
#      just before it was scheduled (`step_loop_ns` in runs.jsonl), with host probes around it;
#   2. cuDNN's plan-build time per head layout (microbench/e2e/sdpa_plan_probe.py, now keyed by
#      layout);
#   3. the long-prompt CUDA-graph decode profile still owed from session 50 (decode_kernels.py),
#      then the static MoE decode profile, if time remains.
# Predictions registered before the call: microbench/predictions/session52.md (stage 3's in
# microbench/predictions/session50.md, section 1).
set -u
BUDGET=${S52_BUDGET_S:-575}
source microbench/record_host.sh
S="$OUT/s52"
echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
record_machine "$S"
record_probe "$S/probe_0.json"
PYTHONUNBUFFERED=1 KS_STEP_LOOP_N=10000 timeout $(( BUDGET > 420 ? 330 : BUDGET - 90 )) \
  python3 microbench/e2e/harness.py --plan eager52 --out "$S/eager" > "$S/eager.log" 2>&1
echo "eager rc=$? at ${SECONDS} s"; tail -3 "$S/eager.log"
record_probe "$S/probe_1.json"
if (( BUDGET - SECONDS > 60 )); then
  timeout 40 python3 microbench/e2e/sdpa_plan_probe.py --out "$S/sdpa_plan_probe.json" > "$S/sdpa_plan_probe.log" 2>&1
  echo "sdpa plan probe rc=$? at ${SECONDS} s"
fi
left=$(( BUDGET - 20 - SECONDS )); (( left > 150 )) && left=150
if (( left > 60 )); then
  PYTHONUNBUFFERED=1 timeout $left python3 microbench/e2e/decode_kernels.py --out "$S/dk" \
    --models llama-3.2-1b,qwen3-0.6b --workloads grid_i8192_o64_c1,grid_i8192_o64_c4 > "$S/dk.log" 2>&1
  echo "decode kernels rc=$? at ${SECONDS} s"
fi
left=$(( BUDGET - 20 - SECONDS ))
if (( left > 90 )); then
  PYTHONUNBUFFERED=1 timeout $left python3 microbench/e2e/static_moe_decode.py --out "$S/static_moe" > "$S/static_moe.log" 2>&1
  echo "static moe rc=$? at ${SECONDS} s"
fi
tar czf /tmp/s52.tgz -C "$OUT" s52 && rm -rf "$S" && mv /tmp/s52.tgz "$OUT/s52.tgz"
ls -la "$OUT"; echo "total ${SECONDS} s"

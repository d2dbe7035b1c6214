#!/usr/bin/env bash
# Session 52's second device call (writes $OUT/s52b.tgz), within S52B_BUDGET_S seconds (default 480):
#   1. cuDNN's plan-build probe with the layouts in reverse order and a Python-loop reading per
#      shape (does the first call's slow llama-3.2-3b row follow the layout or the vCPU?);
#   2. the CUDA-graph decode kernel profile at short context (decode_kernels.py), to compare the
#      GPU idle per replayed kernel with the first call's 8,192-key runs;
#   3. plan eager52 again with KS_STEP_LOOP_N=10000 (a second call of the same runs).
# Predictions registered before the call: microbench/predictions/session52b.md.
set -u
BUDGET=${S52B_BUDGET_S:-480}
source microbench/record_host.sh
S="$OUT/s52b"
echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
record_machine "$S"
record_probe "$S/probe_0.json"
timeout 45 python3 microbench/e2e/sdpa_plan_probe.py --reverse --out "$S/sdpa_plan_probe.json" > "$S/sdpa_plan_probe.log" 2>&1
echo "sdpa plan probe rc=$? at ${SECONDS} s"
PYTHONUNBUFFERED=1 timeout 150 python3 microbench/e2e/decode_kernels.py --out "$S/dk" \
  --models llama-3.2-1b,qwen3-0.6b --workloads grid_i128_o64_c1,grid_i512_o64_c8 > "$S/dk.log" 2>&1
echo "decode kernels rc=$? at ${SECONDS} s"
left=$(( BUDGET - 30 - SECONDS ))
if (( left > 120 )); then
  PYTHONUNBUFFERED=1 KS_STEP_LOOP_N=10000 timeout $left \
    python3 microbench/e2e/harness.py --plan eager52 --out "$S/eager" > "$S/eager.log" 2>&1
  echo "eager rc=$? at ${SECONDS} s"; tail -3 "$S/eager.log"
fi
record_probe "$S/probe_1.json"
tar czf /tmp/s52b.tgz -C "$OUT" s52b && rm -rf "$S" && mv /tmp/s52b.tgz "$OUT/s52b.tgz"
ls -la "$OUT"; echo "total ${SECONDS} s"

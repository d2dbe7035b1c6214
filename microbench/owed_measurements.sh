#!/usr/bin/env bash
# The measurements still owed (docs/calibration.md, docs/validation_e2e.md), one device call,
# (session 48 ran stages 1-3 on an H200: sustained, sdpa, memcpy, fp8; session 49 stage 5,
# calibration/traces/h200_sxm_capture_sweep49/; still owed there: 4),
# whichever GPU the lent pool gives, most wanted first; a stage starts only if its time fits the
# budget (OWED_BUDGET_S, default 540 s), so the archive is always written:
#   1. H200 (or any GPU but an H100): the pre-registered Qwen3-14B sustained-GEMM test with its
#      idle and fine-grained duty phases (microbench/predictions/sustained_gemm_qwen3_14b.md);
#   2. H200 only: transformers' packed attention at few heads (predictions in
#      microbench/predictions/packed_sdpa_few_heads_*; the H100 has these rows) and the memcpy
#      sweep (copy cross-gen lacks the H200's sizes);
#   3. every GPU but an H100 (measured in session 41): the same chain in FP8 (pre-registered in
#      the same file);
#   4. every GPU: why Mixtral's static generate step grows 5.1 ms per sequence (H100, session 44)
#      while its forward does not: microbench/e2e/static_moe_decode.py, now with a generate profile;
#   5. every GPU: the host-speed probe and transformers' capture sweep over depth.
# Writes $OUT/owed.tgz.
set -u
budget=${OWED_BUDGET_S:-540}
# OWED_SKIP: comma-separated stage names not to run (sustained, sdpa, memcpy, fp8, static_moe, capture).
fits() {
  [[ ",${OWED_SKIP:-}," == *",$2,"* ]] && { echo "skipped $2: OWED_SKIP"; return 1; }
  (( SECONDS + $1 < budget )) || { echo "skipped $2: ${SECONDS} s used of ${budget}"; return 1; }
}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE > "$OUT/smi_q.txt" 2>&1
(grep -m1 "model name" /proc/cpuinfo; nproc; cat /proc/loadavg) > "$OUT/cpu.txt"
shapes=7168:5120,5120:5120,34816:5120,5120:17408
# (The H100's pre-registered repeat of the fine phases ran in session 44:
# microbench/data/h100_sxm/sustained_gemm_qwen3_14b_fine44/.)
if [[ "$gpu" != *H100* ]] && fits 170 sustained; then
  timeout 170 python3 microbench/sustained_gemm.py --out "$OUT/sustained_gemm_qwen3_14b" --seconds 12 \
    --shapes $shapes --layers 40 --idle-fracs 0.4,0.1,0.2 --fine-fracs 0.2,0.4 --fine-layers 4 --fine-seconds 8 > "$OUT/sustained.log" 2>&1
  echo "sustained rc=$?"
fi
if [[ "$gpu" == *H200* ]] && fits 100 sdpa; then
  mkdir -p "$OUT/sdpa"
  timeout 100 python3 microbench/collect.py --plan microbench/plans/packed_sdpa_few_heads.csv --out "$OUT/sdpa/packed_sdpa_few_heads.csv" --time-budget-s 80 > "$OUT/sdpa/collect.log" 2>&1
  echo "sdpa rc=$?"
fi
if [[ "$gpu" == *H200* ]] && fits 70 memcpy; then
  mkdir -p "$OUT/copy"
  timeout 70 python3 microbench/collect.py --plan microbench/plans/memcpy_sweep.csv --out "$OUT/copy/memcpy_sweep.csv" --time-budget-s 55 > "$OUT/copy/collect.log" 2>&1
  echo "memcpy rc=$?"
fi
if [[ "$gpu" != *H100* ]] && fits 70 fp8; then
  timeout 70 python3 microbench/sustained_gemm.py --out "$OUT/sustained_gemm_qwen3_14b_fp8" --dtype fp8 --seconds 8 \
    --shapes $shapes --layers 40 --idle-fracs 0.4 > "$OUT/sustained_fp8.log" 2>&1
  echo "sustained fp8 rc=$?"
fi
if fits 130 static_moe; then
  timeout 130 python3 microbench/e2e/static_moe_decode.py --out "$OUT/static_moe" > "$OUT/static_moe.log" 2>&1
  echo "static moe decode rc=$?"
fi
if fits 150 capture; then
  python3 microbench/e2e/host_speed_probe.py --out "$OUT/probe_0.json" > /dev/null 2>&1
  timeout 130 python3 microbench/e2e/host_probe.py --out "$OUT/capture/raw" --probes-only --probes host-probe-g1 \
    --probe-layers 2,4,8,12,24,48 --probe-workloads grid_i128_o64_c1,grid_i512_o64_c8,grid_i2048_o64_c8 \
    --deadline-s $(( budget - SECONDS - 25 < 110 ? budget - SECONDS - 25 : 110 )) > "$OUT/capture.log" 2>&1
  echo "capture rc=$?"
  python3 microbench/e2e/host_speed_probe.py --out "$OUT/probe_1.json" > /dev/null 2>&1
  tail -3 "$OUT/capture.log"
fi
ls -R "$OUT" | head -50
# A device call returns at most a few files: everything goes back as one archive.
tar czf /tmp/owed.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/owed.tgz "$OUT/owed.tgz"
ls -la "$OUT"; echo "total ${SECONDS} s"

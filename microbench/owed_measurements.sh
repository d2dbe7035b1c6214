#!/usr/bin/env bash
# The measurements still owed (and transformers' packed attention at few heads) (docs/calibration.md, docs/validation_e2e.md), one device call,
# whichever GPU the lent pool gives. Every GPU: the host-speed probe and transformers' capture
# sweep over depth (host_probe.py; a host reference for the capture term). On an H200 also the
# memcpy sweep (copy cross-gen lacks the H200's sizes). Every GPU: the pre-registered Qwen3-14B
# sustained-GEMM test (microbench/predictions/sustained_gemm_qwen3_14b.md). Writes under $OUT.
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE > "$OUT/smi_q.txt" 2>&1
(grep -m1 "model name" /proc/cpuinfo; nproc; cat /proc/loadavg) > "$OUT/cpu.txt"
python3 microbench/e2e/host_speed_probe.py --out "$OUT/probe_0.json" > /dev/null 2>&1
# transformers' packed attention at few heads (the host-probe models' 8 x 64): predictions made
# before the measurement are in microbench/predictions/packed_sdpa_few_heads_*.
# The H100 has these rows (microbench/data/h100_sxm/h100_sxm_packed_sdpa_few_heads.csv).
if [[ "$gpu" == *H200* ]]; then
  mkdir -p "$OUT/sdpa"
  python3 microbench/collect.py --plan microbench/plans/packed_sdpa_few_heads.csv --out "$OUT/sdpa/packed_sdpa_few_heads.csv" --time-budget-s 90 > "$OUT/sdpa/collect.log" 2>&1
  echo "sdpa rc=$?"
  mkdir -p "$OUT/copy"
  python3 microbench/collect.py --plan microbench/plans/memcpy_sweep.csv --out "$OUT/copy/memcpy_sweep.csv" --time-budget-s 60 > "$OUT/copy/collect.log" 2>&1
  echo "memcpy rc=$?"
fi
# Pre-registered per GPU: microbench/predictions/sustained_gemm_qwen3_14b.md. The extra idle
# fractions (10, 20 % idle) measure how the power-limit rate depends on a step's idle time.
timeout 200 python3 microbench/sustained_gemm.py --out "$OUT/sustained_gemm_qwen3_14b" --seconds 12 \
  --shapes 7168:5120,5120:5120,34816:5120,5120:17408 --layers 40 --idle-fracs 0.4,0.1,0.2 --fine-fracs 0.2,0.4 --fine-layers 4 --fine-seconds 8 > "$OUT/sustained.log" 2>&1
echo "sustained rc=$?"
python3 microbench/e2e/host_probe.py --out "$OUT/capture/raw" --probes-only --probes host-probe-g1 \
  --probe-layers 2,4,8,12,24,48 --probe-workloads grid_i128_o64_c1,grid_i512_o64_c8,grid_i2048_o64_c8 \
  --deadline-s 110 > "$OUT/capture.log" 2>&1
echo "capture rc=$?"
# The same chain in FP8 (torch._scaled_mm; pre-registered in the same file): does the limit bind
# FP8 GEMMs too?
timeout 75 python3 microbench/sustained_gemm.py --out "$OUT/sustained_gemm_qwen3_14b_fp8" --dtype fp8 --seconds 8 \
  --shapes 7168:5120,5120:5120,34816:5120,5120:17408 --layers 40 --idle-fracs 0.4 > "$OUT/sustained_fp8.log" 2>&1
echo "sustained fp8 rc=$?"
python3 microbench/e2e/host_speed_probe.py --out "$OUT/probe_1.json" > /dev/null 2>&1
tail -3 "$OUT/capture.log"; ls -R "$OUT" | head -50
# A device call returns at most a few files: everything goes back as one archive.
tar czf /tmp/owed.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/owed.tgz "$OUT/owed.tgz"
ls -la "$OUT"

#!/usr/bin/env bash
# One lent machine's host speed next to the serving runs it bounds (session 24): the probe
# (microbench/e2e/host_speed_probe.py) before, between and after a host-bound vLLM plan
# (vllm22ctl: five Qwen3-0.6B runs, the machine-spread reference of run 9) and a host-bound
# transformers plan (hostspeed24hf: three Qwen3-0.6B CUDA-graph runs). Run on the device after
# `vllm_runtime.sh install1` / `install2`; writes $OUT/rep.tgz. Usage: bash host_speed_session.sh TAG
set -u
tag=${1:?machine tag}
W=/tmp/rep/$tag
mkdir -p "$W"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
(grep -m1 "model name" /proc/cpuinfo; nproc; lscpu | grep -i "mhz\|model\|cache\|numa"; cat /proc/loadavg; head -1 /proc/stat) > "$W/cpu.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$W/gpu.txt"
python3 microbench/e2e/host_speed_probe.py --out "$W/probe_0.json" > /dev/null 2>&1
python3 microbench/e2e/host_speed_probe.py --out "$W/probe_1.json" > /dev/null 2>&1
python3 microbench/e2e/vllm_serve.py --plan vllm22ctl --out "$W/vllm" > "$W/vllm.log" 2>&1
python3 microbench/e2e/host_speed_probe.py --out "$W/probe_2.json" > /dev/null 2>&1
python3 microbench/e2e/harness.py --plan hostspeed24hf --out "$W/hf" > "$W/hf.log" 2>&1
python3 microbench/e2e/host_speed_probe.py --out "$W/probe_3.json" > /dev/null 2>&1
(cat /proc/loadavg; head -1 /proc/stat) >> "$W/cpu.txt"
gzip -f "$W"/vllm/*.log "$W"/hf/*.log 2>/dev/null
tar czf "$OUT/rep.tgz" -C /tmp/rep "$tag"
ls -la "$W" "$W/vllm" "$W/hf"

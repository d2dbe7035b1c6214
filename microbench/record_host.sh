# Sourced by the session scripts: what a device call records about its machine next to its data.
#   record_machine DIR   nvidia-smi clocks/power/performance (smi_q.txt) and the CPU (cpu.txt)
#   record_probe FILE    the host-speed probe (microbench/e2e/host_speed_probe.py) as JSON
record_machine() {
  mkdir -p "$1"
  nvidia-smi -q -d CLOCK,POWER,PERFORMANCE > "$1/smi_q.txt" 2>&1
  (grep -m1 "model name" /proc/cpuinfo; nproc; cat /proc/loadavg) > "$1/cpu.txt"
}
record_probe() {
  python3 microbench/e2e/host_speed_probe.py --out "$1" > /dev/null 2>&1 || echo "probe failed: $1"
}

#!/usr/bin/env python3
"""How fast this machine's host runs the kind of work a serving engine's Python loop does.

Lent H200 machines with the same recorded CPU model ran vLLM's host-bound decode ~1.5x apart
(`microbench/data/h200_sxm/vllm_engine/README.md`, run 9). This probe times, in a few seconds,
what such an engine's host does per step, so a machine's speed can be recorded next to its
serving runs (and, once enough machines pair a probe with a serving run, told apart beforehand):

  python_loop_ns     pure-Python interpreter work: ns per iteration of a small arithmetic loop
  dict_list_ns       per-request bookkeeping of the kind schedulers do: ns per dict/list update
  launch_us          host time to enqueue one tiny CUDA kernel (torch, 256 launches per batch,
                     timed before the synchronize), median over batches
  graph_replay_us    host time to enqueue one replay of a captured CUDA graph of 64 tiny kernels
  sync_roundtrip_us  an empty-queue torch.cuda.synchronize() round trip
  thread_handoff_us  one queue.Queue round trip between two threads (vLLM's engine core hands
                     work between its busy loop and its input/output threads this way)
  process_pipe_us    one multiprocessing.Pipe round trip between two processes (vLLM's front
                     end and engine core are separate processes)
  gather_ns          numpy random gather from a 256 MiB array, ns per element (memory latency
                     and the shared L3's contention)
  copy_gbps          numpy copy of a 256 MiB array (the host's memory bandwidth)
  python_loop_spread the slowest over the fastest repeat of python_loop_ns (a host whose vCPUs
                     are shared reads unevenly)
  steal_pct          share of the probe's CPU time the hypervisor gave to other guests
                     (/proc/stat steal over all jiffies, all CPUs, during the probe)
  python_loop_ns_per_cpu  the Python loop pinned to each CPU in turn (median of 3 short runs):
                     whether a slow machine is slow on every vCPU or on some (shared cores)

Medians over repeats. Writes one JSON object (also to --out). Usage:
  python3 microbench/e2e/host_speed_probe.py --out $OUT/host_speed.json
"""
import argparse, json, os, platform, statistics, time


def median_of(fn, repeats):
    return statistics.median(fn() for _ in range(repeats))


def python_loop_ns(n=2_000_000):
    t = time.perf_counter_ns()
    acc = 0
    for i in range(n):
        acc = (acc + i * 7) & 0xFFFF
    return (time.perf_counter_ns() - t) / n


def dict_list_ns(n=300_000):
    reqs = {i: {"tokens": [], "blocks": []} for i in range(256)}
    t = time.perf_counter_ns()
    for i in range(n):
        r = reqs[i & 255]
        r["tokens"].append(i)
        if len(r["tokens"]) > 16:
            r["blocks"].append(r["tokens"])
            r["tokens"] = []
    return (time.perf_counter_ns() - t) / n


def python_loop_ns_per_cpu(repeats=3, n=300_000):
    """{cpu: ns} for every CPU this process may run on; {} where affinity cannot be set."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return {}
    out = {}
    try:
        for cpu in allowed:
            os.sched_setaffinity(0, {cpu})
            out[str(cpu)] = median_of(lambda: python_loop_ns(n), repeats)
    except OSError:
        return {}
    finally:
        os.sched_setaffinity(0, allowed)
    return out


def round_trip_us(send, recv, n):
    """Mean us of `n` send-then-receive round trips to an echoing peer."""
    start = time.perf_counter_ns()
    for i in range(n):
        send(i)
        recv()
    return (time.perf_counter_ns() - start) / n / 1e3


def thread_handoff_us(n=2000):
    import queue, threading

    ping, pong = queue.Queue(), queue.Queue()

    def echo():
        for _ in range(n):
            pong.put(ping.get())

    t = threading.Thread(target=echo)
    t.start()
    us = round_trip_us(ping.put, pong.get, n)
    t.join()
    return us


def _pipe_echo(conn, n):
    for _ in range(n):
        conn.send(conn.recv())


def process_pipe_us(n=2000):
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    p = ctx.Process(target=_pipe_echo, args=(there, n + 100))
    p.start()
    round_trip_us(here.send, here.recv, 100)  # the child's start-up is not part of a round trip
    us = round_trip_us(here.send, here.recv, n)
    p.join()
    return us


def memory_probes(repeats):
    try:
        import numpy as np
    except ImportError:
        return {}
    rng = np.random.default_rng(0)
    big = rng.random(32 << 20)  # 256 MiB of float64: beyond any L3 here
    idx = rng.integers(0, big.size, 1 << 22)
    out = np.empty_like(big)

    def gather_ns():
        t = time.perf_counter_ns()
        big.take(idx)
        return (time.perf_counter_ns() - t) / idx.size

    def copy_gbps():
        t = time.perf_counter_ns()
        np.copyto(out, big)
        return 2 * big.nbytes / (time.perf_counter_ns() - t)

    return {"gather_ns": median_of(gather_ns, repeats), "copy_gbps": median_of(copy_gbps, repeats)}


def gpu_probes(repeats):
    try:
        import torch
    except ImportError:
        return {"gpu": None}
    if not torch.cuda.is_available():
        return {"gpu": None, "torch": torch.__version__}
    x = torch.zeros(16, device="cuda")
    for _ in range(1000):  # warm up the allocator and the launch path
        x.add_(1.0)
    torch.cuda.synchronize()

    def launch_us(batch=256):
        t = time.perf_counter_ns()
        for _ in range(batch):
            x.add_(1.0)
        dt = time.perf_counter_ns() - t
        torch.cuda.synchronize()
        return dt / batch / 1e3

    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x.add_(1.0)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for _ in range(64):
            x.add_(1.0)
    torch.cuda.synchronize()

    def replay_us(n=32):
        t = time.perf_counter_ns()
        for _ in range(n):
            g.replay()
        dt = time.perf_counter_ns() - t
        torch.cuda.synchronize()
        return dt / n / 1e3

    def sync_us(n=200):
        t = time.perf_counter_ns()
        for _ in range(n):
            torch.cuda.synchronize()
        return (time.perf_counter_ns() - t) / n / 1e3

    return {
        "launch_us": median_of(launch_us, repeats * 4),
        "graph_replay_us": median_of(replay_us, repeats * 4),
        "sync_roundtrip_us": median_of(sync_us, repeats),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }


def cpu_facts():
    facts = {"cpu_count": os.cpu_count(), "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        for key in ("model name", "cpu family", "model", "stepping", "microcode", "cpu MHz"):
            vals = [l.split(":", 1)[1].strip() for l in text.splitlines() if l.split(":", 1)[0].strip() == key]
            if vals:
                facts[key.replace(" ", "_")] = vals[0] if key != "cpu MHz" else statistics.median(float(v) for v in vals)
        with open("/proc/loadavg") as f:
            facts["loadavg"] = f.read().split()[:3]
    except OSError:
        pass
    return facts


def probe_in_subprocess(readings=2, repeats=5, timeout_s=120):
    """`readings` probes, each in a fresh interpreter (so no CUDA context outlives it and the
    engine started afterwards sees the GPU's memory as before); the first after a machine starts
    reads slow, hence two. Failures are recorded, not raised: a probe must not stop a run."""
    import subprocess, sys

    out = []
    for _ in range(readings):
        try:
            p = subprocess.run([sys.executable, __file__, "--repeats", str(repeats)], capture_output=True, text=True, timeout=timeout_s)
            out.append(json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr[-500:]})
        except (subprocess.TimeoutExpired, ValueError) as e:
            out.append({"error": str(e)})
    return out


def cpu_jiffies():
    """(steal, total) jiffies over all CPUs, or None where /proc/stat is missing."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out")
    a = ap.parse_args()
    jiffies_before = cpu_jiffies()
    loops = [python_loop_ns() for _ in range(a.repeats)]
    result = {
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **cpu_facts(),
        "python_loop_ns": statistics.median(loops),
        "python_loop_spread": max(loops) / min(loops),
        "dict_list_ns": median_of(dict_list_ns, a.repeats),
        "thread_handoff_us": median_of(thread_handoff_us, a.repeats),
        "process_pipe_us": median_of(process_pipe_us, 3),
        **memory_probes(a.repeats),
        "python_loop_ns_per_cpu": python_loop_ns_per_cpu(),
        **gpu_probes(a.repeats),
    }
    jiffies_after = cpu_jiffies()
    if jiffies_before and jiffies_after and jiffies_after[1] > jiffies_before[1]:
        result["steal_pct"] = 100.0 * (jiffies_after[0] - jiffies_before[0]) / (jiffies_after[1] - jiffies_before[1])
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

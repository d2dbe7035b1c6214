#!/usr/bin/env python3
"""The eager engine's decode steps run in two speeds: how much of a run's TPOT that explains.

In the eager (no CUDA graphs) transformers traces a run's pure-decode steps sit near one time for
a stretch of steps, then ~1.4x that for a stretch (about a second), then back (e.g.
`h200_sxm_eager_layers11` llama-3.1-8b-L2 c1: 41 ms, then 62-71 ms over steps 142-170, then 41).
The CUDA-graph host probes' steps, host-bound too, show no such stretches, so the slow state
belongs to what only eager steps run on the host (cuDNN's plan builds, per-op dispatch).

Per run: the fast step (10th percentile of its pure-decode steps), the share of steps above 1.25x
that ("slow"), and the run's mean step over its fast step. Pooled: the slow/fast ratio k and the
mean slow share. The noise floor this puts under any step model that predicts a run's mean from
its shape: even a model that knew each run's fast step exactly, and only the pooled slow share,
misses the run's mean step by |(1 + (k-1) f_run) / (1 + (k-1) f_pooled) - 1|; printed as the
median and p90 over runs.

Usage: python3 microbench/e2e/eager_step_states.py [TRACE_DIR ...]   (default: every
calibration/traces/*/ with eager runs)
"""
import glob
import json
import os
import statistics
import sys

SLOW_OVER_FAST = 1.25


def quantile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def decode_steps_ms(run):
    cols = run["steps_columns"]
    t0, t1 = cols.index("t_sched_s"), cols.index("t_update_done_s")
    nq, nd = cols.index("num_q_tokens"), cols.index("num_decode_requests")
    return [(s[t1] - s[t0]) * 1e3 for s in run["steps"] if s[nd] > 0 and s[nq] == s[nd] and s[t1] is not None]


def eager_runs(folder):
    for path in sorted(glob.glob(os.path.join(folder, "*", "runs.jsonl"))):
        for line in open(path):
            run = json.loads(line)
            if run.get("cuda_graph_requested") or not run.get("steps"):
                continue
            steps = decode_steps_ms(run)
            if len(steps) >= 10:
                yield run["run_id"], steps


def main():
    folders = sys.argv[1:] or sorted(os.path.dirname(p) for p in glob.glob("calibration/traces/*/README.md"))
    rows = []
    for folder in folders:
        for run_id, steps in eager_runs(folder):
            fast = quantile(steps, 0.1)
            slow = [x for x in steps if x > SLOW_OVER_FAST * fast]
            rows.append((os.path.basename(folder.rstrip("/")), run_id, fast, len(slow) / len(steps),
                         statistics.mean(steps) / fast, slow, [x for x in steps if x <= SLOW_OVER_FAST * fast]))
    if not rows:
        sys.exit("no eager runs with logged steps in " + " ".join(folders))
    print(f"{'folder':28s} {'run':52s} {'fast ms':>8s} {'slow share':>10s} {'mean/fast':>9s}")
    for folder, run_id, fast, share, ratio, _, _ in rows:
        print(f"{folder:28s} {run_id:52s} {fast:8.1f} {share:10.2f} {ratio:9.3f}")
    ks = [statistics.median(s) / statistics.median(f) for *_, s, f in rows if len(s) >= 5 and f]
    k = statistics.median(ks)
    pooled = statistics.mean(r[3] for r in rows)
    floor = [abs((1 + (k - 1) * r[3]) / (1 + (k - 1) * pooled) - 1) * 100 for r in rows]
    print(f"\n{len(rows)} eager runs in {len(set(r[0] for r in rows))} folders; slow / fast step k = {k:.3f} "
          f"(median over {len(ks)} runs with >= 5 slow steps); slow share: mean {pooled:.3f}, "
          f"quartiles {', '.join(f'{q:.3f}' for q in statistics.quantiles([r[3] for r in rows], n=4))}")
    print(f"mean step over fast step: median {statistics.median(r[4] for r in rows):.3f}")
    print(f"noise floor of a mean-step model that knows each run's fast step: median {statistics.median(floor):.1f} %, "
          f"p90 {quantile(floor, 0.9):.1f} %, max {max(floor):.1f} %")


if __name__ == "__main__":
    main()

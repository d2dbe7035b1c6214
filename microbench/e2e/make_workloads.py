#!/usr/bin/env python3
"""Write the end-to-end workload files (seeded, deterministic) for the H200 ground-truth runs.

Format (one CSV per workload, header included):
    arrival_s,prompt_tokens,output_tokens,prefix_group
arrival_s is seconds after the run starts; prefix_group is empty for a request with no shared
prefix, else a small integer: requests of one group share their first `prefix_tokens` tokens
(the length is a per-workload parameter, stored in workloads/prefix_tokens.json, because the
CSV has no column for it).

Workloads:
  grid_i{ISL}_o{OSL}_c{C}  C requests all arriving at t=0 (a batch of C concurrent requests)
  sharegpt_r{RATE}         ShareGPT-like lognormal lengths, Poisson arrivals at RATE req/s
  prefix_r{RATE}           4 groups sharing a 1024-token prefix, Poisson arrivals at RATE req/s
  warm_mix                 unrecorded engine warm-up: varied prompt lengths, batch shrinking 4 -> 1

With --kernelsight BIN, the grid and shared-prefix files come from the simulator's own generator
(`kernelsight workload gen`, which adds a per-request prefix_tokens column); the ShareGPT-like files
stay this script's, because the simulator's sharegpt lengths (mean output 338, tail past 1700
tokens) would not finish within this call's device time on a host-bound engine.

Usage: python3 microbench/e2e/make_workloads.py [--out DIR] [--kernelsight target/debug/kernelsight]
"""
import argparse
import csv
import json
import os
import subprocess
import zlib

import numpy as np

BASE_SEED = 20261129
GRID_ISL = [128, 512, 2048]
GRID_OSL = [64, 128, 256]
GRID_CONC = [1, 8, 32]
# Long prompts at low concurrency (session 49): decode steps whose packed attention runs a few
# CTAs over 8-33 k keys, where the attention base of the few-heads fix moved the predictions most.
LONG_GRID = [(8192, 64, 1), (8192, 64, 4), (4096, 64, 8)]
# (rate req/s, number of requests): about 8-10 s of arrivals each.
SHAREGPT = [(2.0, 20), (5.0, 40), (10.0, 80)]
PREFIX = [(6.0, 48)]
PREFIX_TOKENS = 1024
PREFIX_GROUPS = 4


def rng_for(name: str) -> np.random.Generator:
    # Seed from the workload name so adding a workload never changes the others.
    return np.random.default_rng(BASE_SEED ^ zlib.crc32(name.encode()))


def poisson_arrivals(rng, rate, n):
    gaps = rng.exponential(1.0 / rate, size=n)
    gaps[0] = 0.0  # the first request opens the run
    return np.cumsum(gaps)


def sharegpt_lengths(rng, n):
    # Lognormal ShareGPT-like chat lengths (median prompt ~220 tokens, output ~100), the output
    # clipped at 192 so that one run stays within tens of seconds on a host-bound engine.
    prompt = np.clip(np.round(rng.lognormal(np.log(220), 0.9, n)), 16, 2048).astype(int)
    output = np.clip(np.round(rng.lognormal(np.log(100), 0.6, n)), 8, 192).astype(int)
    return prompt, output


def write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arrival_s", "prompt_tokens", "output_tokens", "prefix_group"])
        for a, p, o, g in rows:
            w.writerow([f"{a:.6f}", int(p), int(o), "" if g is None else int(g)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "workloads"))
    ap.add_argument("--kernelsight", help="path of the kernelsight binary: grid and prefix files from `workload gen`")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    prefix_meta = {}

    def ks(name, *flags):
        subprocess.run([args.kernelsight, "workload", "gen", *flags, "--out", os.path.join(args.out, name + ".csv")],
                       check=True)

    grid = [(isl, osl, c) for isl in GRID_ISL for osl in GRID_OSL for c in GRID_CONC] + LONG_GRID
    for isl, osl, c in grid:
        name = f"grid_i{isl}_o{osl}_c{c}"
        if args.kernelsight:
            ks(name, "--workload", "fixed", "--isl", str(isl), "--osl", str(osl), "--rate", "inf",
               "--num-requests", str(c), "--seed", "0")
        else:
            write(os.path.join(args.out, name + ".csv"), [(0.0, isl, osl, None)] * c)

    for rate, n in SHAREGPT:
        name = f"sharegpt_r{rate:g}"
        rng = rng_for(name)
        arr = poisson_arrivals(rng, rate, n)
        p, o = sharegpt_lengths(rng, n)
        write(os.path.join(args.out, name + ".csv"), [(arr[i], p[i], o[i], None) for i in range(n)])

    for rate, n in PREFIX:
        name = f"prefix_r{rate:g}"
        prefix_meta[name] = PREFIX_TOKENS
        if args.kernelsight:  # suffix and output uniform in [64, 192] and [48, 144]
            ks(name, "--workload", "uniform", "--isl", "128", "--osl", "96", "--range-ratio", "0.5", "--rate", f"{rate:g}",
               "--num-requests", str(n), "--prefix-groups", str(PREFIX_GROUPS), "--prefix-tokens", str(PREFIX_TOKENS),
               "--seed", "6")
            continue
        rng = rng_for(name)
        arr = poisson_arrivals(rng, rate, n)
        groups = rng.integers(0, PREFIX_GROUPS, size=n)
        suffix = rng.integers(32, 257, size=n)
        out = rng.integers(32, 129, size=n)
        rows = [(arr[i], PREFIX_TOKENS + suffix[i], out[i], groups[i]) for i in range(n)]
        write(os.path.join(args.out, name + ".csv"), rows)

    # Warm-up: prefills of several sizes and decode batches of 4, 3, 2 and 1.
    write(os.path.join(args.out, "warm_mix.csv"),
          [(0.0, 64, 4, None), (0.0, 100, 8, None), (0.0, 300, 12, None), (0.0, 1000, 16, None)])

    with open(os.path.join(args.out, "prefix_tokens.json"), "w") as f:
        json.dump(prefix_meta, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Blind comparison: measured rows (shared schema) against prediction files written before the
measurement (`kernelsight kernel --input ... --output ...`), matched on op and shape.
Prints per op and tier: count, median / p90 / max APE %. Standard library only.

    python3 microbench/tools/blind_compare.py MEASURED.csv TIER=PRED.csv [TIER=PRED.csv ...]
"""
import csv
import sys

SHAPE = ("op", "num_heads", "num_kv_heads", "head_dim", "num_tokens", "hidden", "inter", "topk", "num_experts", "tp")


def key(r):
    return tuple(r.get(c, "") for c in SHAPE)


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, round(q * (len(v) - 1)))]


def main():
    measured = {key(r): float(r["latency_us"]) for r in csv.DictReader(open(sys.argv[1]))}
    print(f"{'tier':<10} {'op':<10} {'n':>5} {'median':>7} {'p90':>7} {'max':>7}  (APE %, blind)")
    for arg in sys.argv[2:]:
        tier, path = arg.split("=", 1)
        by_op = {}
        for r in csv.DictReader(open(path)):
            m = measured.get(key(r))
            if m is not None:
                by_op.setdefault(r["op"], []).append(abs(float(r["predicted_us"]) - m) / m * 100)
        for op, v in sorted(by_op.items()):
            print(f"{tier:<10} {op:<10} {len(v):>5} {pct(v, .5):>7.1f} {pct(v, .9):>7.1f} {max(v):>7.1f}")


if __name__ == "__main__":
    main()

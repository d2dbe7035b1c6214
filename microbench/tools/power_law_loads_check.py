"""Checks the collector's power_law_loads routing (aiconfigurator's generator): k distinct experts
per token, and the busiest shard's load and active experts, to compare with
`kernels::cost::Routing::PowerLawLoads`. Run on a machine with torch: python3 microbench/tools/power_law_loads_check.py"""
import sys, torch
sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__file__), ".."))
import collect
g = collect.Gpu(torch, 1234)
for (t, e, k, ep) in [(8192, 256, 8, 8), (4096, 128, 8, 8), (1024, 128, 8, 8), (8, 128, 8, 8), (8192, 128, 8, 32)]:
    for a in (1.2, 1.01):
        loads, act = [], []
        for s in range(16):
            gen = torch.Generator(device="cpu").manual_seed(s)
            ids = g.power_law_loads_ids(t, e, k, ep, a, gen)
            assert ids.shape == (t, k) and all(len(set(r)) == k for r in ids.tolist())
            local = ids < e // ep
            loads.append(int(local.sum())); act.append(len(set(ids[local].tolist())))
        print(f"T={t} E={e} k={k} ep={ep} alpha={a}: busiest/share {sum(loads)/len(loads)/(t*k/ep):.2f} active {sum(act)/len(act):.1f}")

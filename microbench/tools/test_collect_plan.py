#!/usr/bin/env python3
"""Checks the collector's plan validation and flop/byte counts without a GPU (no torch needed).

    python3 microbench/tools/test_collect_plan.py
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "microbench"))
import collect  # noqa: E402

PLAN = os.path.join(ROOT, "microbench", "plans", "h200_default.csv")


def write(text):
    f = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
    f.write(text)
    f.close()
    return f.name


def run_validate(path):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "microbench", "collect.py"), "--plan", path,
                        "--validate-only"], capture_output=True, text=True)
    return p.returncode, p.stderr


def test_default_plan_is_accepted_and_covers_ops():
    rows = collect.read_plan(PLAN)
    ops = {r["op"] for _, r in rows}
    assert ops == set(collect.OPS), set(collect.OPS) - ops


def test_bad_rows_are_named_by_line_and_field():
    path = write("op,dtype,m,n,k\ngemm,bf16,1,2,3\nconv,bf16,1,1,1\ngemm,fp8,16,100,64\ngemm,bf16,1,-2,3\n")
    rc, err = run_validate(path)
    assert rc == 2, err
    assert "line 3: field 'op' = 'conv' is unknown; allowed: gemm" in err, err
    assert "line 4: fp8 GEMM needs n and k divisible by 16" in err, err
    assert "line 5: field 'n' = '-2' must be a non-negative integer" in err, err
    assert "line 2" not in err, err


def test_impossible_shapes_are_refused():
    path = write("op,dtype,batch,seq_len,kv_len,num_heads,num_kv_heads,head_dim,num_tokens,hidden,inter,topk,"
                 "num_experts,tp,ep,backend,routing\n"
                 "attn_prefill,bf16,1,128,,32,6,128,,,,,,,,sdpa_flash,\n"
                 "attn_decode,bf16,100000,,1000000,64,8,128,,,,,,,,triton_paged,\n"
                 "moe,bf16,,,,,,,16,4096,1536,9,8,1,1,grouped_mm,balanced\n"
                 "moe,bf16,,,,,,,16,4096,1536,2,8,1,1,grouped_mm,zipf\n"
                 "attn_prefill,bf16,1,128,64,32,8,128,,,,,,,,sdpa_cudnn,\n")
    rc, err = run_validate(path)
    assert rc == 2
    assert "line 2: num_heads (32) must be a multiple of num_kv_heads (6)" in err, err
    assert "line 3: shape needs about" in err and "GB of device memory" in err, err
    assert "line 4: topk (9) exceeds num_experts (8)" in err, err
    assert "line 5: field 'routing' = 'zipf' is unknown; allowed: balanced, uniform, power_law_1.2" in err, err
    assert "line 6: prefill over a cached prefix" in err, err


def test_unknown_column_is_refused():
    rc, err = run_validate(write("op,dtype,m,n,k,flavour\ngemm,bf16,1,1,1,x\n"))
    assert rc == 2 and "unknown column(s) flavour" in err, err


def test_counts_follow_the_readme_conventions():
    def row(**kw):
        r = {n: 0 for n in collect.NUMERIC}
        r.update({"dtype": "bf16", "routing": ""})
        r.update(kw)
        return r
    g = row(op="gemm", m=8192, n=8192, k=8192)
    assert collect.flops(g) == 2 * 8192 ** 3
    assert collect.hbm_bytes(g) == 3 * 8192 * 8192 * 2
    # Decode, 64 sequences x 4096 cached tokens, 8 KV heads of 128: K and V read once, bf16.
    d = row(op="attn_decode", batch=64, kv_len=4096, num_heads=32, num_kv_heads=8, head_dim=128)
    assert collect.hbm_bytes(d) == 64 * 4096 * 8 * 128 * 2 * 2 + 2 * 64 * 32 * 128 * 2
    # Causal prefill of 4 new tokens after 3 cached: pairs = 4*3 + (1+2+3+4) = 22.
    p = row(op="attn_prefill", batch=1, seq_len=4, kv_len=3, num_heads=1, num_kv_heads=1, head_dim=1)
    assert collect.flops(p) == 4 * 22
    c = row(op="copy", bytes=1 << 30)
    assert collect.hbm_bytes(c) == 2 * (1 << 30)
    assert collect.bus_factor("all_reduce", 2) == 1.0 and collect.bus_factor("all_gather", 4) == 0.75


def test_sanity_ranges_follow_the_gpus_spec_sheet():
    # The H100's measured copy (3.03 TB/s, microbench/data/h100_sxm) is 90 % of its 3.35 TB/s:
    # fine there, flagged against the H200's 4.8 TB/s sheet.
    rows = [{"op": "copy", "bytes": str(1 << 32), "backend": "torch_copy(eager memcpy)", "achieved_tbps": "3.029"},
            {"op": "gemm", "dtype": "bf16", "m": 8192, "n": 8192, "k": 8192, "achieved_tflops": "793.4"}]
    h100 = collect.sanity(rows, "h100_sxm")
    h200 = collect.sanity(rows, "h200_sxm")
    assert h100["copy_tbps"]["ok"] and not h200["copy_tbps"]["ok"], (h100, h200)
    assert h100["gemm_8192_bf16_tflops"]["ok"] and h200["gemm_8192_bf16_tflops"]["ok"]
    assert not collect.sanity(rows, "a100_sxm")["gemm_8192_bf16_tflops"]["ok"]  # above A100's 312 peak
    assert collect.sanity(rows, "no_such_gpu") == {}


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_"):
            fn()
            print("ok", name)

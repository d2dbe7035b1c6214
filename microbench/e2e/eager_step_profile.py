#!/usr/bin/env python3
"""Where an eager transformers continuous-batching step spends its time: torch.profiler (CPU and
CUDA) over one eager run per model, tables sorted by host self time and by GPU time, and cProfile
of the engine's Python. Not a trace: profiling inflates host time.

Writes $OUT/eager-profile-<model>.txt. Usage: python3 microbench/e2e/eager_step_profile.py --out $OUT
"""
import argparse
import cProfile
import io
import os
import pstats
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

# EAGER_PROFILE_MODELS="name:layers,..." picks other models (e.g. "mixtral-8x7b-v0.1:2").
MODELS = [(m.split(":")[0], int(m.split(":")[1])) for m in os.environ.get("EAGER_PROFILE_MODELS", "llama-3.1-8b:2,gpt-oss-20b:2").split(",")]
RUN = {"workload": "grid_i128_o64_c8"}
ENGINE = {"block_size": 256, "max_batch_tokens": 8192, "kv_capacity_tokens": 98304}


def main():
    from torch.profiler import ProfilerActivity, profile
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name, layers in MODELS:
        cfg, _, _ = harness.build_config(name, layers)
        label = f"{name}-L{cfg.num_hidden_layers}"
        model = harness.build_model(cfg)
        harness.cb_run(model, cfg, label, {"workload": "warm_mix"}, ENGINE, a.out, 60, record=False)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            rec = harness.cb_run(model, cfg, label, RUN, ENGINE, a.out, 60, record=False)
        cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=35, max_name_column_width=70)
        gpu = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70)
        pr = cProfile.Profile()  # Python 3.12: sys.monitoring, every thread (the engine's too)
        pr.enable()
        rec2 = harness.cb_run(model, cfg, label, RUN, ENGINE, a.out, 60, record=False)
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(40)
        with open(os.path.join(a.out, f"eager-profile-{label}.txt"), "w") as f:
            f.write(f"{label} {RUN} status {rec['status']} {rec2['status']}\nenv {harness.env_record()}\nnvidia-smi {harness.nvidia_smi()}\n\nby host self time:\n{cpu}\n\nby GPU time:\n{gpu}\n\ncProfile (main thread):\n{s.getvalue()}")
        harness.log(f"{label}: profiled")
        del model


if __name__ == "__main__":
    main()

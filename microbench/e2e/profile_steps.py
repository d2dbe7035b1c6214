#!/usr/bin/env python3
"""Where does a transformers continuous-batching step spend its time: GPU or host?

For each model, replays a few workloads through the same engine as harness.py (eager and CUDA
graphs) with every `ModelRunner.compute_batch` call bracketed by CUDA events on the engine's
compute stream, and records per step: host time of the call, GPU time of the step's work, the
(padded) number of query tokens. One run per model is also traced with torch.profiler and its
top GPU kernels are written out, so the simulator's kernel list can be compared with what ran.

Writes under --out: steps.jsonl (one line per run: steps as [t_call_s, host_call_ms, gpu_ms,
q_tokens_padded]), kernels-<model>.txt (profiler table), env.json, and the harness's own
runs.jsonl / requests.jsonl / models.jsonl for the recorded runs.
Usage: python3 microbench/e2e/profile_steps.py --out $OUT
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MODELS = [("llama-3.1-8b", None), ("qwen3-0.6b", None), ("mixtral-8x7b-v0.1", 8), ("gemma-3-27b-it", 12)]
RUNS = [{"workload": "grid_i512_o64_c8", "cuda_graph": True}, {"workload": "grid_i512_o64_c32", "cuda_graph": True},
        {"workload": "grid_i2048_o64_c8", "cuda_graph": True}, {"workload": "grid_i512_o64_c8"}]
ENGINE = {"block_size": 256, "max_batch_tokens": 8192, "kv_capacity_tokens": 98304}


def install_step_timer(log):
    import torch
    from transformers.generation.continuous_batching import model_runner as mr
    orig = mr.ModelRunner.compute_batch

    def timed(self, model, batch_data):
        stream = self.inputs_and_outputs.compute_stream or torch.cuda.current_stream()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(stream)
        t = time.perf_counter()
        orig(self, model, batch_data)
        host_ms = (time.perf_counter() - t) * 1e3
        e1.record(stream)
        log.append([t, host_ms, e0, e1, int(batch_data["input_ids"].numel())])

    mr.ModelRunner.compute_batch = timed


def main():
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    env = harness.env_record()
    env["started_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    env["plan"] = "profile_steps"
    env["nvidia_smi_before"] = harness.nvidia_smi()
    log = []
    install_step_timer(log)
    for name, layers in MODELS:
        cfg, _, _ = harness.build_config(name, layers)
        label = name if layers is None else f"{name}-L{cfg.num_hidden_layers}"
        model = harness.build_model(cfg)
        harness.append_jsonl(os.path.join(a.out, "models.jsonl"),
                             {"model": label, "base_model": name, "layers_run": cfg.num_hidden_layers,
                              "config_run": model.config.to_dict(), "status": "ok"})
        harness.cb_run(model, cfg, label, {"workload": "warm_mix"}, ENGINE, a.out, 60, record=False)
        for k, run in enumerate(RUNS):
            log.clear()
            t0 = time.perf_counter()
            if k == 0:  # one profiled run per model: the kernels that really ran
                from torch.profiler import ProfilerActivity, profile
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
                    rec = harness.cb_run(model, cfg, label, run, ENGINE, a.out, 40, record=False)
                table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=90)
                shapes = prof.key_averages(group_by_input_shape=True).table(
                    sort_by="cuda_time_total", row_limit=40, max_name_column_width=60, max_shapes_column_width=140)
                with open(os.path.join(a.out, f"kernels-{label}.txt"), "w") as f:
                    f.write(f"{label} {run}\n{table}\n\nby input shape:\n{shapes}\n")
            else:
                rec = harness.cb_run(model, cfg, label, run, ENGINE, a.out, 40)
            torch.cuda.synchronize()
            steps = [[round(t - t0, 6), round(h, 4), round(e0.elapsed_time(e1), 4), q] for t, h, e0, e1, q in log]
            harness.append_jsonl(os.path.join(a.out, "steps.jsonl"),
                                 {"model": label, "run_id": rec["run_id"], "profiled": k == 0, "status": rec["status"],
                                  "engine_resolved": rec.get("engine_resolved"), "steps": steps})
            gpu = sorted(s[2] for s in steps)
            gaps = sorted(steps[i + 1][0] - steps[i][0] for i in range(len(steps) - 1))
            harness.log(f"{rec['run_id']} profiled={k == 0}: {rec['status']} steps={len(steps)} "
                        f"gpu p50 {gpu[len(gpu) // 2] if gpu else 0:.2f} ms, step gap p50 "
                        f"{gaps[len(gaps) // 2] * 1e3 if gaps else 0:.2f} ms")
        del model
        torch.cuda.empty_cache()
    env["nvidia_smi_after"] = harness.nvidia_smi()
    with open(os.path.join(a.out, "env.json"), "w") as f:
        json.dump(env, f, indent=1)


if __name__ == "__main__":
    main()

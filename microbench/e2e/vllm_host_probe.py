#!/usr/bin/env python3
"""Where vLLM's engine core spends host time on steps with prompt tokens (session 21).

Session 20 found that a vLLM step with prompt tokens costs the host far more than a decode
step, modelled as microseconds per layer (piecewise CUDA graphs up to 512 tokens, none above),
and that the per-layer number moved between bursts (0.57-1.18 ms per layer without graphs) and
lone prompts among decodes (a few ms in all). This probe times each piece of every engine-core
step on the device, in the engine's own process (in-process `LLMEngine`, the same engine core,
executor, scheduler and model runner `vllm serve` runs, async scheduling, prefix caching,
chunked prefill at 8,192 tokens, block 16, `FULL_AND_PIECEWISE` graphs up to 512 tokens), with
chosen step contents:

  lone:  one prompt of P tokens into an idle engine
  burst: N prompts of P tokens at once into an idle engine
  join:  one prompt of P tokens arriving while D requests decode

Per step it records host (CPU) wall time of the scheduler, `execute_model` and its parts
(vLLM 0.24 runs its V2 model runner: request-state updates, `prepare_inputs`, `prepare_attn`,
the attention metadata build, the graph replays), `sample_tokens`, and the GPU span of
`execute_model`'s work (CUDA events). A step run without graphs calls the model directly: its
forward is `execute_model` less the timed pieces (`rest_of_execute_us`). Rows: steps.csv (one per executed step, with the scenario), plus
provenance.json. Usage (device, after microbench/tools/vllm_runtime.sh install1/install2):
  PYTHONPATH=/tmp/site python3 microbench/e2e/vllm_host_probe.py --models qwen3-0.6b,llama-3.1-8b --out $OUT/host
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import vllm_stubs  # noqa: E402

vllm_stubs.install()  # also switches vLLM's tracing off (the stubbed opentelemetry)
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process: its methods can be timed

# Host wall time per step; `update_from_output` and `step_fn` are the engine-core loop iteration
# in which the step was launched (update_from_output there processes an earlier step's output).
PHASES = ("step_fn", "schedule", "execute_model", "update_requests", "prepare_inputs", "prepare_attn", "attn_metadata",
          "run_fullgraph", "run_pw_graph", "sample_tokens", "update_from_output")
# execute_model's pieces (the rest is the model call without graphs, and glue)
EXEC_PIECES = ("update_requests", "prepare_inputs", "prepare_attn", "attn_metadata", "run_fullgraph", "run_pw_graph")


class Recorder:
    """Wraps engine-core and model-runner methods with wall clocks; one open step at a time."""

    def __init__(self):
        self.steps, self.cur, self.events, self.hooked = [], None, [], []
        # The scheduler runs before `execute_model` opens the step it scheduled (run 6, recorded
        # before this was fixed, has each step's schedule_us on the step before it).
        self.schedule_us = 0.0

    def timed(self, obj, name, phase, on_enter=None):
        import torch
        fn = getattr(obj, name, None)
        if fn is None:
            print(f"not hooked: {type(obj).__name__}.{name}", flush=True)
            return
        self.hooked.append(f"{type(obj).__name__}.{name}")

        def wrapper(*args, **kwargs):
            if on_enter is not None:
                on_enter(*args, **kwargs)
            gpu = phase == "execute_model"
            if gpu:
                e0 = torch.cuda.Event(enable_timing=True)
                e0.record()
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = (time.perf_counter() - t) * 1e6
                rec = self.cur
                if phase == "schedule":
                    self.schedule_us += dt
                elif rec is not None:
                    rec[phase + "_us"] = rec.get(phase + "_us", 0.0) + dt
                if gpu and rec is not None:
                    e1 = torch.cuda.Event(enable_timing=True)
                    e1.record()
                    self.events.append((rec, e0, e1))
        setattr(obj, name, wrapper)

    def begin(self, scheduler_output):
        so = scheduler_output
        self.cur = {"tokens": so.total_num_scheduled_tokens, "new_reqs": len(so.scheduled_new_reqs),
                    "reqs": len(so.num_scheduled_tokens), "t_start": time.perf_counter(), "schedule_us": self.schedule_us}
        self.schedule_us = 0.0
        self.steps.append(self.cur)

    def resolve_gpu(self):
        import torch
        torch.cuda.synchronize()
        for rec, e0, e1 in self.events:
            rec["execute_gpu_span_us"] = e0.elapsed_time(e1) * 1e3
        self.events.clear()


def start_engine(model, layers, rec):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine
    import vllm_serve
    cfg, original = vllm_serve.model_config(model, layers)
    kwargs = vllm_serve.serving_engine_kwargs(cfg)
    engine = LLMEngine.from_engine_args(EngineArgs(**kwargs))
    core = engine.engine_core.engine_core  # InprocClient -> EngineCore
    worker = core.model_executor.driver_worker
    runner = getattr(worker, "worker", worker).model_runner
    rec.timed(core, "step_fn", "step_fn")
    rec.timed(core.scheduler, "schedule", "schedule")
    rec.timed(core.scheduler, "update_from_output", "update_from_output")
    rec.timed(runner, "execute_model", "execute_model", on_enter=lambda so, *a, **k: rec.begin(so))
    for name in ("finish_requests", "free_states", "add_requests", "update_requests"):
        rec.timed(runner, name, "update_requests")
    rec.timed(runner, "prepare_inputs", "prepare_inputs")
    rec.timed(runner, "prepare_attn", "prepare_attn")
    if getattr(runner, "model_state", None) is not None:
        rec.timed(runner.model_state, "prepare_attn", "attn_metadata")
    if getattr(runner, "cudagraph_manager", None) is not None:
        rec.timed(runner.cudagraph_manager, "run_fullgraph", "run_fullgraph")
        rec.timed(runner.cudagraph_manager, "run_pw_graph", "run_pw_graph")
    rec.timed(runner, "sample_tokens", "sample_tokens")
    return engine, cfg, original, {k: v for k, v in kwargs.items() if k != "model"}


def scenarios(quick):
    """(kind, requests, prompt tokens, decoders) in a fixed shuffled order."""
    import random
    lone = [("lone", 1, p, 0) for p in (128, 256, 384, 480, 512, 544, 640, 768, 1024, 2048, 4096)]
    burst = [("burst", n, p, 0) for n in (2, 4, 8, 16, 32) for p in (64, 128, 512)]
    join = [("join", 1, p, d) for d in (4, 32) for p in (128, 480, 544, 640, 1024, 2048)]
    grid = lone + burst + join
    if quick:
        grid = grid[::4]
    random.Random(0).shuffle(grid)
    return grid


def run_scenario(engine, rec, kind, n, p, decoders, vocab, tag, rng):
    from vllm.sampling_params import SamplingParams
    sp_decode = SamplingParams(max_tokens=64, temperature=1.0, ignore_eos=True, detokenize=False)
    sp_prompt = SamplingParams(max_tokens=2, temperature=1.0, ignore_eos=True, detokenize=False)

    def ids(length):
        return {"prompt_token_ids": [rng.randrange(10, vocab) for _ in range(length)]}

    engine.reset_prefix_cache()
    first_step = len(rec.steps)
    for i in range(decoders):
        engine.add_request(f"{tag}-d{i}", ids(128), sp_decode)
    # the decoders' prefill and a few decode steps, so the joining prompt meets a steady batch
    for _ in range(6 if decoders else 0):
        engine.step()
    mark = len(rec.steps)
    time.sleep(0.02 if decoders == 0 else 0.0)
    for i in range(n):
        engine.add_request(f"{tag}-p{i}", ids(p), sp_prompt)
    t0 = time.perf_counter()
    first_token_ms, aborted = None, False
    while engine.has_unfinished_requests():
        outs = engine.step()
        if first_token_ms is None and any(o.request_id.startswith(f"{tag}-p") and o.outputs and o.outputs[0].token_ids for o in outs):
            first_token_ms = (time.perf_counter() - t0) * 1e3
        if decoders and not aborted and first_token_ms is not None and len(rec.steps) - mark > 8:
            engine.abort_request([f"{tag}-d{i}" for i in range(decoders)])
            aborted = True
    rec.resolve_gpu()
    for j, s in enumerate(rec.steps[first_step:], start=first_step):
        s.update(scenario=kind, requests=n, prompt_tokens=p, decoders=decoders, tag=tag, step_in_scenario=j - mark,
                 first_token_ms=round(first_token_ms, 3) if first_token_ms is not None else "")


def probe_model(model, layers, out, repeats, quick):
    import random
    import torch
    import vllm
    rec = Recorder()
    t0 = time.perf_counter()
    engine, cfg, original, kwargs = start_engine(model, layers, rec)
    startup_s = time.perf_counter() - t0
    vocab = cfg["vocab_size"]
    rng = random.Random(0)
    for k in range(2):  # warm-up: every scenario once, not recorded
        for sc in scenarios(quick):
            run_scenario(engine, rec, *sc, vocab, f"warm{k}", rng)
    rec.steps.clear()
    for r in range(repeats):
        for i, sc in enumerate(scenarios(quick)):
            run_scenario(engine, rec, *sc, vocab, f"r{r}s{i}", rng)
        print(f"{model}: repeat {r} done ({len(rec.steps)} steps)", flush=True)
    cols = ["model", "layers", "repeat_tag", "scenario", "requests", "prompt_tokens", "decoders", "step_in_scenario", "tokens",
            "new_reqs", "reqs"] + [p + "_us" for p in PHASES] + ["rest_of_execute_us", "execute_gpu_span_us", "first_token_ms"]
    path = os.path.join(out, "steps.csv")
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(cols)
        for s in rec.steps:
            s["rest_of_execute_us"] = s.get("execute_model_us", 0.0) - sum(s.get(k + "_us", 0.0) for k in EXEC_PIECES)
            row = {"model": model, "layers": cfg["num_hidden_layers"], "repeat_tag": s.get("tag", ""), **s}
            w.writerow([round(row[c], 1) if isinstance(row.get(c), float) else row.get(c, "") for c in cols])
    return {"model": model, "layers_run": cfg["num_hidden_layers"], "layers_config": original, "startup_s": round(startup_s, 1),
            "steps": len(rec.steps), "hooked": rec.hooked, "vllm": vllm.__version__, "torch": torch.__version__, "engine_kwargs": kwargs}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="qwen3-0.6b,llama-3.1-8b", help="comma-separated NAME or NAME:LAYERS")
    ap.add_argument("--layers", type=int, default=0, help="cut every model to this many layers (0: as configured)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", help="child mode: one model")
    ap.add_argument("--deadline-s", type=float, default=500)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.only:
        # NAME or NAME:LAYERS (that model cut to LAYERS layers: the per-layer share at one width)
        name, _, cut = a.only.partition(":")
        info = probe_model(name, int(cut) if cut else a.layers, a.out, a.repeats, a.quick)
        with open(os.path.join(a.out, f"provenance_{a.only.replace(':', '_L')}.json"), "w") as f:
            json.dump(info, f, indent=1)
        return
    # One child per model (a fresh engine each, and a failure costs one model), within the deadline.
    from harness import cpu_model, nvidia_smi
    prov = {"command": " ".join(sys.argv), "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "nvidia_smi_before": nvidia_smi(),
            "cpu_model": cpu_model(), "models": {}}
    t_end = time.time() + a.deadline_s
    for m in a.models.split(","):
        left = t_end - time.time()
        if left < 60:
            prov["models"][m] = {"skipped": "deadline"}
            continue
        cmd = [sys.executable, os.path.abspath(__file__), "--only", m, "--out", a.out, "--repeats", str(a.repeats), "--layers", str(a.layers)]
        if a.quick:
            cmd.append("--quick")
        try:
            r = subprocess.run(cmd, timeout=left, capture_output=True, text=True)
            prov["models"][m] = {"rc": r.returncode, "stderr_tail": r.stderr[-3000:] if r.returncode else ""}
            print(r.stdout[-2000:], r.stderr[-1500:] if r.returncode else "", flush=True)
        except subprocess.TimeoutExpired:
            prov["models"][m] = {"rc": "timeout"}
        except Exception:
            prov["models"][m] = {"error": traceback.format_exc()[-2000:]}
    prov["nvidia_smi_after"] = nvidia_smi()
    with open(os.path.join(a.out, "provenance.json"), "w") as f:
        json.dump(prov, f, indent=1)


if __name__ == "__main__":
    main()

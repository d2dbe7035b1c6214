#!/usr/bin/env python3
"""End-to-end ground truth from vLLM itself: its serving engine (AsyncLLM: the front end of
`vllm serve`, the engine core in its own process, async scheduling, CUDA graphs, prefix
caching) replaying the simulator's workloads with random (dummy) weights, every token timed.

The traces have the layout of `harness.py`'s (transformers) ones, so `unpack.py`,
`summarize.py` and `kernelsight validate e2e` read them; a run record says
`engine_requested.engine = "vllm"` and the simulator replays it with its `vllm` profile.
Nothing is fitted on these runs.

vLLM is not in the device image: the command that runs this first installs the runtime that
`microbench/tools/vllm_runtime.sh` carries, and sets PYTHONPATH=/tmp/site.

Driver (default): one child process per model of the plan (`plans.json`, entries with
`"engine": "vllm"`), within a deadline. Child (--only NAME): starts the engine, warms it up,
replays each run. A run entry names a workload file and optionally `clients` (closed loop: that
many requests at t=0, then each finished request's client sends the next row at once) and
`limit` (first N rows). Usage:
  PYTHONPATH=/tmp/site python3 microbench/e2e/vllm_serve.py --plan vllm19 --out $OUT
"""
import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import append_jsonl, cpu_model, find_config, log, make_prompts, make_run_id, nvidia_smi, r6, read_workload  # noqa: E402
from host_speed_probe import probe_in_subprocess  # noqa: E402

sys.path.insert(0, os.path.dirname(HERE))
import vllm_stubs  # noqa: E402

# Installed at import, so a spawned engine-core process (which re-imports this module) has it too.
vllm_stubs.install()
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # FlashInfer is not carried

BLOCK_SIZE = 16
MAX_BATCHED_TOKENS = 8192  # `vllm serve`'s default on >= 70 GiB GPUs
MAX_NUM_SEQS = 1024


def serving_engine_kwargs(cfg, max_model_len=8192):
    """Engine arguments of the serving runs (dummy weights, TP 1, async scheduling, prefix
    caching, the default token budget and block size) for a model config written to a folder of
    its own; every vLLM script here starts its engine from these."""
    mdir = tempfile.mkdtemp(prefix="vllm_model_")
    with open(os.path.join(mdir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return dict(model=mdir, load_format="dummy", skip_tokenizer_init=True, tensor_parallel_size=1,
                max_model_len=max_model_len, max_num_batched_tokens=MAX_BATCHED_TOKENS,
                max_num_seqs=MAX_NUM_SEQS, block_size=BLOCK_SIZE, enable_prefix_caching=True, async_scheduling=True,
                gpu_memory_utilization=0.9, seed=0)


def model_config(name, layers):
    with open(find_config(name)) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config", None)  # bf16 dummy weights
    original = cfg.get("num_hidden_layers")
    if layers and layers < original:
        cfg["num_hidden_layers"] = layers
        if isinstance(cfg.get("layer_types"), list):
            cfg["layer_types"] = cfg["layer_types"][:layers]
        if isinstance(cfg.get("max_window_layers"), int):
            cfg["max_window_layers"] = min(cfg["max_window_layers"], layers)
    return cfg, original


async def replay(engine, model_name, run, vocab, out, timeout_s, record=True):
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    rows = read_workload(run["workload"])
    if run.get("limit"):
        rows = rows[: run["limit"]]
    run_id = make_run_id(model_name, run)
    prompts = make_prompts(rows, vocab, seed=zlib.crc32(run["workload"].encode()))
    clients = int(run.get("clients") or 0)
    done = {}
    t0 = time.perf_counter()
    # The engine core stamps its events and outputs with time.monotonic(), the front end its
    # arrivals with time.time(): both put on the run's clock.
    mono0, wall0 = time.monotonic(), time.time()

    async def one(i):
        r = rows[i]
        # Sampled at temperature 1 (greedy decoding of dummy weights is degenerate), EOS
        # ignored: every request makes exactly its requested tokens.
        sp = SamplingParams(max_tokens=r["output_tokens"], temperature=1.0, ignore_eos=True, detokenize=False,
                            output_kind=RequestOutputKind.DELTA, seed=i)
        arrival = time.perf_counter() - t0
        times, engine_times, m = [], [], None
        async for o in engine.generate({"prompt_token_ids": prompts[i]}, sp, request_id=f"{run_id}#{i}"):
            now = time.perf_counter() - t0
            n = len(o.outputs[0].token_ids)
            # A consumer that falls behind gets several steps' tokens in one delta: they share
            # the time it saw them (and the engine-side time of the latest step).
            times.extend([now] * n)
            m = o.metrics
            if m is not None:
                engine_times.extend([m.last_token_ts - mono0] * n)
        stages = None
        if m is not None:
            # Front end received it (input processing done), engine core queued it, first
            # scheduled it, and produced its first token: where the time before a token goes.
            stages = {"frontend_s": r6(m.arrival_time - wall0), "queued_s": r6(m.queued_ts - mono0),
                      "scheduled_s": r6(m.scheduled_ts - mono0), "first_token_engine_s": r6(m.first_token_ts - mono0)}
        done[i] = (arrival, times, engine_times, stages)

    async def client(queue):
        while queue:
            await one(queue.pop(0))

    try:
        if clients:
            queue = list(range(len(rows)))
            work = asyncio.gather(*(client(queue) for _ in range(clients)))
        else:
            async def open_loop():
                tasks = []
                for i, r in enumerate(rows):
                    wait = t0 + r["arrival_s"] - time.perf_counter()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    tasks.append(asyncio.create_task(one(i)))
                await asyncio.gather(*tasks)
            work = open_loop()
        await asyncio.wait_for(work, timeout_s)
        status, error = "ok", None
    except asyncio.TimeoutError:
        status, error = "partial", f"timeout after {timeout_s:.0f} s: {len(done)}/{len(rows)} requests finished"
    duration = time.perf_counter() - t0
    cc = engine.vllm_config.cache_config
    sc = engine.vllm_config.scheduler_config
    comp = engine.vllm_config.compilation_config
    num_blocks = int(cc.num_gpu_blocks or 0)
    settings = {"engine": "vllm", "block_size": cc.block_size, "num_blocks": num_blocks, "layer_groups": 1,
                "max_batch_tokens": sc.max_num_batched_tokens, "max_num_seqs": sc.max_num_seqs,
                "async_scheduling": bool(sc.async_scheduling), "prefix_caching": bool(cc.enable_prefix_caching),
                "chunked_prefill": bool(sc.enable_chunked_prefill), "tp": 1}
    rec = {"run_id": run_id, "model": model_name, "workload": run["workload"], "num_requests": len(rows),
           "prefix_tokens_max": max(r["prefix_tokens"] for r in rows), "recorded": record, "engine_requested": settings,
           "cache": {"num_blocks": num_blocks, "block_size": cc.block_size, "max_batch_tokens": sc.max_num_batched_tokens,
                     "use_prefix_sharing": bool(cc.enable_prefix_caching)},
           "engine_resolved": {"cudagraph_mode": str(comp.cudagraph_mode), "compilation_mode": str(comp.mode),
                               "cudagraph_capture_sizes": list(comp.cudagraph_capture_sizes or [])},
           "status": status, "error": error, "requests_ok": len(done), "duration_s": r6(duration), "steps": [],
           # The run's clock (0 = its start) on the engine's clocks, so that engine-core step logs
           # (`plugin/ks_vllm_hooks.py`, monotonic start times) line up with its requests.
           "clock_origin": {"monotonic_s": round(mono0, 6), "wall_s": round(wall0, 6)}}
    if clients:
        rec["clients"] = clients
    if not record:
        return rec
    for i, r in enumerate(rows):
        q = {"model": model_name, "run_id": run_id, "id": i, "request_id": f"{run_id}#{i}",
             "target_arrival_s": r6(r["arrival_s"]), "prompt_tokens": r["prompt_tokens"],
             "requested_output_tokens": r["output_tokens"], "prefix_group": r["prefix_group"],
             "prefix_tokens": r["prefix_tokens"]}
        if i in done and len(done[i][1]) == r["output_tokens"]:
            arrival, ts, engine_ts, stages = done[i]
            q.update(status="finished", arrival_s=r6(arrival), first_token_s=r6(ts[0]), token_s=[r6(t) for t in ts],
                     finish_s=r6(ts[-1]), output_tokens=len(ts))
            if stages is not None:
                q.update(engine_stages=stages, engine_token_s=[r6(t) for t in engine_ts])
        else:
            q.update(status="missing", error="no complete answer before the run's timeout")
        append_jsonl(os.path.join(out, "requests.jsonl"), q)
    append_jsonl(os.path.join(out, "runs.jsonl"), rec)
    return rec


async def child(plan, entry, out, deadline):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM
    name, layers = entry["name"], entry.get("layers")
    label = f"{name}-L{layers}" if layers else name
    cfg, original = model_config(name, layers)
    kwargs = serving_engine_kwargs(cfg, entry.get("max_model_len", 8192))
    mrec = {"model": label, "base_model": name, "layers_requested": layers, "config_source": f"models/{name}.json",
            "layers_original": original, "layers_run": cfg.get("num_hidden_layers"), "engine": "vllm",
            "engine_kwargs": {k: v for k, v in kwargs.items() if k != "model"}, "config_run": cfg}
    t = time.perf_counter()
    engine = None
    try:
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs), usage_context=UsageContext.OPENAI_API_SERVER)
        mrec["startup_s"] = r6(time.perf_counter() - t)
        mrec["num_gpu_blocks"] = engine.vllm_config.cache_config.num_gpu_blocks
        log(f"{label}: engine up in {mrec['startup_s']:.0f} s, {mrec['num_gpu_blocks']} KV blocks")
        # First-use paths (sampler, prefill shapes outside the captured sizes) before timing.
        await replay(engine, label, {"workload": plan.get("warmup_workload", "warm_mix")}, cfg["vocab_size"], out, 120, record=False)
        await replay(engine, label, {"workload": "grid_i512_o64_c32"}, cfg["vocab_size"], out, 120, record=False)
        for run in entry["runs"]:
            left = deadline - time.time()
            if left < plan.get("min_run_s", 8):
                append_jsonl(os.path.join(out, "runs.jsonl"), {"run_id": make_run_id(label, run), "model": label, "workload": run["workload"],
                                                               "status": "skipped", "error": "time budget of this call used up"})
                continue
            await engine.reset_prefix_cache()  # each run starts cold, as the simulator's replay does
            rec = await replay(engine, label, run, cfg["vocab_size"], out, min(plan.get("run_timeout_s", 60), left - 5))
            log(f"{rec['run_id']}: {rec['status']} {rec['requests_ok']}/{rec['num_requests']} in {rec['duration_s']:.1f} s")
        mrec["status"] = "ok"
    except Exception as ex:
        mrec.update(status="failed", error=f"{type(ex).__name__}: {ex}", traceback=traceback.format_exc()[-3000:])
        log(f"{label}: {mrec['error']}")
    finally:
        mrec["total_s"] = r6(time.perf_counter() - t)
        append_jsonl(os.path.join(out, "models.jsonl"), mrec)
        if engine is not None:
            engine.shutdown()


def env_record(plan_name):
    import torch
    import triton
    import vllm
    return {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "plan": plan_name, "engine": "vllm",
            "vllm": vllm.__version__, "torch": torch.__version__, "triton": triton.__version__, "cuda_runtime": torch.version.cuda,
            "python": sys.version.split()[0], "cpu_count": os.cpu_count(), "cpu_model": cpu_model(),
            # The engine core's host work sets small models' step times, and lent machines differ.
            "engine_step_log": os.environ.get("KS_VLLM_STEP_LOG", ""), "nvidia_smi_before": nvidia_smi(),
            # Same CPU model, ~1.5x apart in vLLM's host work (vllm_engine README, run 9).
            "host_probe": probe_in_subprocess()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", help="child mode: this model of the plan")
    ap.add_argument("--deadline", type=float, help="child mode: unix time to stop starting runs")
    a = ap.parse_args()
    with open(os.path.join(HERE, "plans.json")) as f:
        plan = json.load(f)[a.plan]
    os.makedirs(a.out, exist_ok=True)
    if a.only:
        entry = next(m for m in plan["models"] if m["name"] == a.only)
        asyncio.run(child(plan, entry, a.out, a.deadline))
        return
    env = env_record(a.plan)
    start = time.time()
    deadline = start + plan["deadline_s"]
    for entry in plan["models"]:
        left = deadline - time.time()
        if left < plan.get("min_model_s", 60):
            append_jsonl(os.path.join(a.out, "models.jsonl"), {"model": entry["name"], "status": "skipped", "error": "time budget of this call used up"})
            continue
        model_deadline = min(deadline, time.time() + entry.get("budget_s", left))
        log(f"model {entry['name']}: {model_deadline - time.time():.0f} s")
        # Its own session: a child past the deadline is killed with its engine-core process,
        # which would otherwise keep the GPU's memory.
        p = subprocess.Popen([sys.executable, __file__, "--plan", a.plan, "--out", a.out, "--only", entry["name"],
                              "--deadline", str(model_deadline - 10)], start_new_session=True)
        try:
            if p.wait(timeout=max(30, model_deadline - time.time() + 30)) != 0:
                append_jsonl(os.path.join(a.out, "models.jsonl"), {"model": entry["name"], "status": "failed", "error": f"child exited with {p.returncode}"})
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            append_jsonl(os.path.join(a.out, "models.jsonl"), {"model": entry["name"], "status": "failed", "error": "child killed at the call's deadline"})
    env["nvidia_smi_after"] = nvidia_smi()
    env["total_s"] = round(time.time() - start, 1)
    with open(os.path.join(a.out, "env.json"), "w") as f:
        json.dump(env, f, indent=1)


if __name__ == "__main__":
    main()

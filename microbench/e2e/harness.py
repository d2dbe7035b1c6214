#!/usr/bin/env python3
"""End-to-end ground truth on the GPU: transformers continuous batching with random-weight models.

Driver mode (default): for each model of a plan (plans.json), start one child process (a crash or a
poisoned CUDA context then costs one model only), within a global deadline. Child mode (--only):
build the model with random bf16 weights, time static-batch prefill and decode, then replay each
workload of the plan through transformers' ContinuousBatchingManager and record every request.

Everything is appended as JSON lines under --out:
  env.json        versions, GPU, driver, clocks before/after
  models.jsonl    one line per model: config actually run, build time, memory, status/error
  static.jsonl    one line per static measurement (prefill of B x L, decode steps of B at L)
  runs.jsonl      one line per continuous-batching run: engine settings, per-step log, status/error
  requests.jsonl  one line per request: arrival, first token, every token time, finish, lengths
Times in runs/requests are seconds from the run's t0 (time.perf_counter just before the first
request is submitted). A run entry of a plan names its workload file and optionally `cuda_graph`,
`limit` (first N rows), `clients` (closed loop: N requests at t=0, then each finished request's
client sends the next row at once; the file's arrival times are ignored) and `engine` (keys that
override the plan's engine for this run; `kv_capacity_tokens` / `max_batch_tokens` null leave them
to transformers' memory handler). Usage:
  python3 microbench/e2e/harness.py --plan smoke --out $OUT
"""
import argparse
import contextlib
import csv
import gc
import json
import math
import os
import platform
import subprocess
import sys
import threading
import time
import traceback
import zlib

from host_speed_probe import python_loop_ns  # the probe's loop, timed on the engine thread per step

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


# ----------------------------------------------------------------------------- small helpers
def append_jsonl(path, obj):
    with open(path, "a") as f:
        f.write(json.dumps(obj, separators=(",", ":")) + "\n")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def r6(x):
    return None if x is None else round(float(x), 6)


def nvidia_smi():
    q = ("name,driver_version,pci.bus_id,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,"
         "power.draw,power.limit,temperature.gpu,pstate,memory.used,memory.total")
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return dict(zip(q.split(","), [v.strip() for v in out.split("\n")[0].split(",")]))
    except Exception as e:  # the trace stays useful without it
        return {"error": repr(e)}


def cpu_model():
    """The host CPU's model name: the engines' host work runs on it, and lent machines differ."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


def find_config(name):
    p = os.path.join(REPO, "models", name + ".json")
    if not os.path.exists(p):
        raise FileNotFoundError(f"no config {p}")
    return p


def read_workload(name):
    path = os.path.join(HERE, "workloads", name + ".csv")
    rows = []
    with open(path) as f:
        for i, r in enumerate(csv.DictReader(f)):
            g = (r.get("prefix_group") or "").strip()
            p = (r.get("prefix_tokens") or "").strip()  # per-request column of `kernelsight workload gen`
            rows.append({"id": i, "arrival_s": float(r["arrival_s"]), "prompt_tokens": int(r["prompt_tokens"]),
                         "output_tokens": int(r["output_tokens"]), "prefix_group": int(g) if g else None,
                         "prefix_tokens": int(p) if p else None})
    with open(os.path.join(HERE, "workloads", "prefix_tokens.json")) as f:
        default_prefix = json.load(f).get(name, 0)
    for r in rows:
        if r["prefix_tokens"] is None:
            r["prefix_tokens"] = default_prefix if r["prefix_group"] is not None else 0
    return rows


# ----------------------------------------------------------------------------- model building
def build_config(name, layers):
    """HF config for `name`, text part only, with the layer count cut to `layers` (None: keep)."""
    from transformers import AutoConfig
    with open(find_config(name)) as f:
        d = json.load(f)
    d.pop("quantization_config", None)  # random bf16 weights, never quantized
    if "text_config" in d:  # multimodal checkpoints (gemma-3): run the language model alone
        d = dict(d["text_config"])
    original_layers = d.get("num_hidden_layers")
    if layers is not None and layers < original_layers:
        d["num_hidden_layers"] = layers
        if isinstance(d.get("layer_types"), list):
            d["layer_types"] = d["layer_types"][:layers]
        if isinstance(d.get("max_window_layers"), int):
            d["max_window_layers"] = min(d["max_window_layers"], layers)
    model_type = d.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **d)
    return cfg, original_layers, find_config(name)


def device():
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"  # cpu: only to check the code here, never timed


def sync():
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


MODEL_PEAK_BYTES = [0]  # the peak over a model's runs (each run resets the allocator's peak to measure its own)


def mem_gib(peak=False):
    import torch
    if not torch.cuda.is_available():
        return None
    if peak:
        return max(MODEL_PEAK_BYTES[0], torch.cuda.max_memory_allocated()) / 2**30
    return torch.cuda.memory_allocated() / 2**30


def run_memory_start():
    """Starts a run's own peak: the model's peak so far is kept in MODEL_PEAK_BYTES. The previous
    run's batch processor sits in a reference cycle (its patched methods close over it), so its
    KV cache outlives the run until a full collection: collect first, or this run's peak holds two
    caches (harnesses before session 48 did not; `allocated_uncollected_bytes` says what was left)."""
    import torch
    if not torch.cuda.is_available():
        return None
    MODEL_PEAK_BYTES[0] = max(MODEL_PEAK_BYTES[0], torch.cuda.max_memory_allocated())
    uncollected = torch.cuda.memory_allocated()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    free, total = torch.cuda.mem_get_info()  # what a self-sizing cache sees
    return {"allocated_uncollected_bytes": uncollected, "allocated_before_bytes": torch.cuda.memory_allocated(),
            "reserved_before_bytes": torch.cuda.memory_reserved(), "collected_before_run": True,
            "device_free_before_bytes": free, "device_total_bytes": total}


def run_memory_end(mem):
    """A run's peak and what the allocator holds at its end, with the CUDA-graph private pools
    apart (segments whose pool id is not the default (0, 0)): the memory plan's checks."""
    import torch
    if mem is None:
        return None
    pools = {}
    for seg in torch.cuda.memory_snapshot():
        pid = tuple(seg.get("segment_pool_id", (0, 0)))
        if pid != (0, 0):
            pools[pid] = pools.get(pid, 0) + seg["total_size"]
    mem.update(peak_allocated_bytes=torch.cuda.max_memory_allocated(), allocated_end_bytes=torch.cuda.memory_allocated(),
               reserved_end_bytes=torch.cuda.memory_reserved(), graph_pools=len(pools),
               graph_pool_reserved_bytes=sum(pools.values()))
    return mem


def build_model(cfg):
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    with torch.device(device()):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    sync()
    return model


# ----------------------------------------------------------------------------- static batches
class EventStreamer:
    """generate() hands the prompt, then each new token, to put(); a CUDA event and a host clock
    at each call split the run into prefill and per-step decode times."""

    def __init__(self):
        import torch
        self.torch = torch
        self.events, self.host = [], []

    def put(self, value):
        e = self.torch.cuda.Event(enable_timing=True)
        e.record()
        self.events.append(e)
        self.host.append(time.perf_counter())

    def end(self):
        pass


def static_runs(model, spec, vocab, out, model_name):
    import torch
    from transformers import GenerationConfig
    if not torch.cuda.is_available():  # CUDA events need a GPU; the cpu check skips these
        append_jsonl(os.path.join(out, "static.jsonl"), {"model": model_name, "status": "skipped", "error": "no GPU"})
        return
    g = torch.Generator(device="cuda").manual_seed(1)
    reps = spec.get("reps", 3)
    for B, L in spec.get("prefill", []):
        rec = {"model": model_name, "kind": "prefill", "batch": B, "seq_len": L,
               "attn_implementation": model.config._attn_implementation}
        try:
            ids = torch.randint(10, vocab, (B, L), device="cuda", generator=g)
            times = []
            with torch.no_grad():
                for i in range(reps + 1):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    model(input_ids=ids, use_cache=True, logits_to_keep=1)
                    e.record()
                    torch.cuda.synchronize()
                    if i > 0:  # first call warms up
                        times.append(s.elapsed_time(e))
            rec.update(status="ok", prefill_ms=sorted(times)[len(times) // 2], prefill_ms_all=[r6(t) for t in times])
        except Exception as ex:
            rec.update(status="failed", error=f"{type(ex).__name__}: {ex}")
            torch.cuda.empty_cache()
        append_jsonl(os.path.join(out, "static.jsonl"), rec)
    n_new = spec.get("new_tokens", 24)
    for B, L in spec.get("decode", []):
        rec = {"model": model_name, "kind": "decode", "batch": B, "seq_len": L, "new_tokens": n_new,
               "attn_implementation": model.config._attn_implementation, "cache": "DynamicCache (generate default)"}
        try:
            ids = torch.randint(10, vocab, (B, L), device="cuda", generator=g)
            gc_ = GenerationConfig(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, pad_token_id=0,
                                   eos_token_id=None)
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc_)  # warm-up
                st = EventStreamer()
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc_, streamer=st)
            torch.cuda.synchronize()
            ev = st.events  # [prompt, token 1 (after prefill), token 2, ...]
            gpu = [ev[i].elapsed_time(ev[i + 1]) for i in range(len(ev) - 1)]
            host = [(st.host[i + 1] - st.host[i]) * 1e3 for i in range(len(st.host) - 1)]
            steps = gpu[1:]
            rec.update(status="ok", prefill_ms=r6(gpu[0]), decode_step_ms=[r6(t) for t in steps],
                       decode_step_ms_median=r6(sorted(steps)[len(steps) // 2]) if steps else None,
                       host_step_ms=[r6(t) for t in host])
        except Exception as ex:
            rec.update(status="failed", error=f"{type(ex).__name__}: {ex}")
            torch.cuda.empty_cache()
        append_jsonl(os.path.join(out, "static.jsonl"), rec)


# ----------------------------------------------------------------------------- continuous batching
def make_prompts(rows, vocab, seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    prefixes = {}
    prompts = []
    for r in rows:
        if r["prefix_group"] is not None and r["prefix_tokens"] > 0:
            g = r["prefix_group"]
            if g not in prefixes:  # one long stream per group; each request takes its first prefix_tokens
                prefixes[g] = np.random.default_rng(seed * 1000 + g + 1).integers(10, vocab, 16384).tolist()
            n_pre = min(r["prefix_tokens"], r["prompt_tokens"])
            suffix = rng.integers(10, vocab, r["prompt_tokens"] - n_pre).tolist()
            prompts.append(prefixes[g][:n_pre] + suffix)
        else:
            prompts.append(rng.integers(10, vocab, r["prompt_tokens"]).tolist())
    return prompts


def make_run_id(model_name, run):
    return (f"{model_name}/{run['workload']}" + (f"/closed{run['clients']}" if run.get("clients") else "")
            + ("/cudagraph" if run.get("cuda_graph") else "") + (f"/first{run['limit']}" if run.get("limit") else "")
            + "".join(f"/{k}{v}" for k, v in sorted(run.get("engine", {}).items())))


def num_layer_groups(cfg):
    from transformers.generation.continuous_batching.cache import group_layers_by_attn_type
    groups, types = group_layers_by_attn_type(cfg)
    return len(groups), types


def cb_config_to_dict(c):
    d = {}
    for k, v in vars(c).items():
        if isinstance(v, (int, float, str, bool, type(None))):
            d[k] = v
        elif isinstance(v, (tuple, list)):
            d[k] = list(v)
        else:
            d[k] = repr(v)
    return d


def run_rows(run):
    rows = read_workload(run["workload"])
    return rows[: run["limit"]] if run.get("limit") else rows


def cb_configs(cfg, rows, run, engine):
    """Engine and generation configs of one run, and the engine settings to record. Every rank of a
    tensor-parallel group must build the same ones."""
    from transformers import ContinuousBatchingConfig, GenerationConfig
    n_groups, group_types = num_layer_groups(cfg)
    bs = engine["block_size"]
    # null kv_capacity_tokens / max_batch_tokens: transformers sizes them itself (its memory handler)
    kv = engine.get("kv_capacity_tokens")
    num_blocks = int(math.ceil(kv / bs)) * n_groups if kv else None
    cbc = ContinuousBatchingConfig(block_size=bs, num_blocks=num_blocks, max_batch_tokens=engine.get("max_batch_tokens"),
                                   use_cuda_graph=bool(run.get("cuda_graph", False)), allow_block_sharing=True,
                                   scheduler_type="fifo", seed=0)
    gen = GenerationConfig(do_sample=False, max_new_tokens=max(r["output_tokens"] for r in rows), eos_token_id=-1,
                           pad_token_id=0)
    settings = {"block_size": bs, "num_blocks": num_blocks, "max_batch_tokens": engine.get("max_batch_tokens"),
                "kv_capacity_tokens_per_group": kv, "layer_groups": n_groups,
                "group_types": group_types}
    if "tp" in engine:  # tensor-parallel runs (harness_tp.py) say so; single-GPU records stay as they were
        settings["tp"] = engine["tp"]
    return cbc, gen, settings


# Per request id: soft resets and the first start time (see keep_history_across_soft_resets).
SOFT_RESETS = {}
FIRST_START = {}


def keep_history_across_soft_resets():
    """When the KV cache runs out, transformers evicts a request by a soft reset
    (`OffloadingManager.offload_requests` with no CPU pool): its state is replaced by one whose prompt
    holds the tokens generated so far, with a new creation time and no token timestamps. Keep the
    request's arrival time and earlier timestamps on the new state, and count the resets."""
    from transformers.generation.continuous_batching.requests import RequestState
    orig = RequestState.create_equivalent_initial_request
    if getattr(orig, "kernelsight_patched", False):
        return

    def patched(self):
        new = orig(self)
        new.created_time = self.created_time
        new._timestamps = list(self._timestamps)
        SOFT_RESETS[self.request_id] = SOFT_RESETS.get(self.request_id, 0) + 1
        FIRST_START.setdefault(self.request_id, self.lifespan[0])
        return new

    patched.kernelsight_patched = True
    RequestState.create_equivalent_initial_request = patched


@contextlib.contextmanager
def warmup_failures():
    """The 'Failed to warm up' messages transformers' continuous batching logs meanwhile."""
    import logging
    messages = []

    class Catch(logging.Handler):
        def emit(self, record):
            msg = record.getMessage()
            if "Failed to warm up" in msg:
                messages.append(msg[:400])

    logger, handler = logging.getLogger("ContinuousBatchingLogger"), Catch()
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


_LIBC = None


# KS_STEP_LOOP_N > 0: time host_speed_probe's Python loop of that many iterations on the engine
# thread before every scheduling call (about 1 ms at 10,000), so a run records its vCPU's speed
# step by step: the eager engine's slow stretches are that vCPU slowed in place (session 51).
STEP_LOOP_N = int(os.environ.get("KS_STEP_LOOP_N", "0"))


def current_cpu():
    """The CPU the calling thread runs on (glibc sched_getcpu, a vDSO call well under a microsecond); -1 if unknown."""
    global _LIBC
    try:
        if _LIBC is None:
            import ctypes
            _LIBC = ctypes.CDLL(None)
        return int(_LIBC.sched_getcpu())
    except Exception:
        return -1


def cb_run(model, cfg, model_name, run, engine, out, run_timeout_s, record=True):
    """Replay one workload through the manager API. Returns the run record."""
    import torch

    wl = run["workload"]
    rows = run_rows(run)
    cuda_graph = bool(run.get("cuda_graph", False))
    run_id = make_run_id(model_name, run)
    prompts = make_prompts(rows, cfg.vocab_size, seed=zlib.crc32(wl.encode()))
    engine = {**engine, **run.get("engine", {})}  # a run may resize the cache or the token budget
    cbc, gen, settings = cb_configs(cfg, rows, run, engine)
    rec = {"run_id": run_id, "model": model_name, "workload": wl, "num_requests": len(rows),
           "prefix_tokens_max": max(r["prefix_tokens"] for r in rows), "cuda_graph_requested": cuda_graph, "recorded": record,
           "engine_requested": settings}
    if run.get("clients"):
        rec["clients"] = int(run["clients"])
    manager = None
    steps = []
    t0_box = [0.0]
    t_start = time.perf_counter()
    mem = run_memory_start()
    try:
        manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cbc)
        rec["attn_implementation"] = model.config._attn_implementation  # the paged variant the engine switched to
        t_w = time.perf_counter()
        with warmup_failures() as failures:
            manager.warmup()  # creates the cache and batch processor; captures CUDA graphs if enabled
        rec["warmup_s"] = r6(time.perf_counter() - t_w)
        if failures:  # transformers logs a failed warm-up (out of memory, no blocks) and goes on
            rec["warmup_failed"] = failures[0]
        if mem is not None:  # the cache and masks stay allocated; the warm-up's peak is its budget-filling step
            mem.update(allocated_after_warmup_bytes=torch.cuda.memory_allocated(),
                       warmup_peak_allocated_bytes=torch.cuda.max_memory_allocated())
        bp = manager.batch_processor
        keep_history_across_soft_resets()
        SOFT_RESETS.clear()
        FIRST_START.clear()
        evictions = []  # [t_s, requests evicted] per offload call that evicted any
        orig_offload = bp.offloading_manager.offload_requests

        def offload():
            n = orig_offload()
            if n:
                evictions.append([r6(time.perf_counter() - t0_box[0]), int(n)])
            return n

        bp.offloading_manager.offload_requests = offload

        # Per-step log: when each batch was scheduled, its composition, and when its update ended.
        orig_sched, orig_update = bp.scheduler.schedule_batch, bp.update_batch

        engine_cpus = {}  # CPU -> scheduling calls there: the cores of one host differ in speed (host_speed_probe's per-CPU loop)
        step_cpus = []  # the CPU each logged step was scheduled on: do an eager run's slow stretches follow the core?
        step_loop_ns = []  # KS_STEP_LOOP_N: the engine thread's own Python speed before each scheduling call

        def sched(token_budget, cache_budget):
            # Before the step's start time, so the step's own duration stays clean.
            loop_ns = round(python_loop_ns(STEP_LOOP_N), 2) if STEP_LOOP_N else None
            t = time.perf_counter() - t0_box[0]
            cpu = current_cpu()
            engine_cpus[cpu] = engine_cpus.get(cpu, 0) + 1
            res = orig_sched(token_budget, cache_budget)
            reqs = res[0]
            if reqs:
                n_dec = sum(1 for fs in reqs if fs.query_length == 1)  # one query token: a decode step
                steps.append([r6(t), len(reqs), n_dec, int(res[2]), int(res[3]), None])
                step_cpus.append(cpu)
                if STEP_LOOP_N:
                    step_loop_ns.append(loop_ns)
            return res

        def update():
            orig_update()
            if steps:
                steps[-1][5] = r6(time.perf_counter() - t0_box[0])

        bp.scheduler.schedule_batch = sched
        bp.update_batch = update

        ids = {}
        # Closed loop (`clients`): that many requests at t=0, then each finished request's client
        # sends the next row at once (rows in file order; the file's arrival times are ignored).
        clients = int(run.get("clients") or 0)

        def submit(i):
            ids[manager.add_request(prompts[i], request_id=f"r{i}", max_new_tokens=rows[i]["output_tokens"],
                                    record_timestamps=True, eos_token_id=-1)] = i

        t0_box[0] = t0 = time.perf_counter()
        i = 0
        while i < len(rows) and (i < clients if clients else rows[i]["arrival_s"] <= 0.0):  # the t=0 batch goes in before the loop starts
            submit(i)
            i += 1
        manager.start()
        while not clients and i < len(rows):
            wait = t0 + rows[i]["arrival_s"] - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            submit(i)
            i += 1
        results = {}
        limit_t = t_start + run_timeout_s
        while len(results) < len(rows) and time.perf_counter() < limit_t:
            res = manager.get_result(timeout=0.2)
            if res is not None and res.is_finished():
                results[res.request_id] = res
                if clients and i < len(rows):
                    submit(i)
                    i += 1
            elif res is None and not manager.is_running():
                break
        t_end = time.perf_counter()
        cache = bp.cache
        rec["cache"] = {"num_blocks": cache.num_blocks, "block_size": cache.block_size,
                        "max_batch_tokens": cache.max_batch_tokens, "use_prefix_sharing": cache.use_prefix_sharing,
                        "num_sliding_attention_groups": cache.num_sliding_attention_groups,
                        "prefix_tokens_reused": getattr(cache, "_total_prefix_length", None),
                        "num_key_value_heads": cache.num_key_value_heads, "head_dim": cache.head_dim}
        timed_out = len(results) < len(rows)
        manager.stop(block=True, timeout=30, hard_stop=timed_out)
        rec["memory"] = run_memory_end(mem)
        rec["engine_resolved"] = cb_config_to_dict(manager.continuous_batching_config)
        n_ok = 0
        for rid, idx in ids.items():
            r = results.get(rid)
            row = rows[idx]
            q = {"model": model_name, "run_id": run_id, "id": idx, "request_id": rid,
                 "target_arrival_s": r6(row["arrival_s"]), "prompt_tokens": row["prompt_tokens"],
                 "requested_output_tokens": row["output_tokens"], "prefix_group": row["prefix_group"],
                 "prefix_tokens": row["prefix_tokens"]}
            if r is None:
                q.update(status="missing", error="no result before the run's timeout")
            else:
                ts = [t - t0 for t in (r.timestamps or [])]
                start = FIRST_START.get(rid, r.lifespan[0])
                q.update(status=r.status.name.lower(), error=r.error, arrival_s=r6(r.created_time - t0),
                         scheduled_s=r6(start - t0) if start > 0 else None, soft_resets=SOFT_RESETS.get(rid, 0),
                         first_token_s=r6(ts[0]) if ts else None, token_s=[r6(t) for t in ts],
                         finish_s=r6(r.lifespan[1] - t0) if r.lifespan[1] > 0 else None,
                         output_tokens=len(r.generated_tokens), prompt_tokens_seen=len(r.prompt_ids))
                if r.error is None and len(r.generated_tokens) == row["output_tokens"]:
                    n_ok += 1
            if record:
                append_jsonl(os.path.join(out, "requests.jsonl"), q)
        rec["evictions"] = evictions
        rec["engine_thread_cpus"] = {str(c): n for c, n in sorted(engine_cpus.items())}
        rec["step_cpus"] = step_cpus
        if STEP_LOOP_N:
            # One reading per logged step, taken just before it was scheduled: ns per iteration
            # of host_speed_probe's python loop over KS_STEP_LOOP_N iterations.
            rec["step_loop_ns"] = step_loop_ns
            rec["step_loop_iterations"] = STEP_LOOP_N
        rec.update(status="ok" if n_ok == len(rows) else ("partial" if n_ok else "failed"), requests_ok=n_ok,
                   duration_s=r6(t_end - t0), steps_columns=["t_sched_s", "num_requests", "num_decode_requests",
                                                             "num_q_tokens", "max_kv_read", "t_update_done_s"],
                   steps=steps)
        if timed_out:
            rec["error"] = f"timeout after {run_timeout_s:.0f} s: {len(results)}/{len(rows)} requests finished"
    except Exception as ex:
        rec.update(status="failed", error=f"{type(ex).__name__}: {ex}", traceback=traceback.format_exc()[-3000:])
        try:
            if manager is not None:
                manager.stop(block=True, timeout=10, hard_stop=True)
        except Exception:
            pass
    finally:
        try:
            if manager is not None:
                manager.destroy()
        except Exception:
            pass
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            if rec.get("memory"):  # what the destroyed manager left allocated (its cache, if still referenced)
                rec["memory"]["allocated_after_destroy_bytes"] = torch.cuda.memory_allocated()
    if record:
        append_jsonl(os.path.join(out, "runs.jsonl"), rec)
    return rec


# ----------------------------------------------------------------------------- child: one model
def run_model(plan, entry, out, deadline):
    import torch
    name = entry["name"]
    t_model = time.perf_counter()
    budget_end = min(deadline, time.time() + entry.get("budget_s", 1e9))
    mrec = {"model": name, "base_model": name, "layers_requested": entry.get("layers")}
    model = None
    try:
        cfg, orig_layers, src = build_config(name, entry.get("layers"))
        mrec.update(config_source=os.path.relpath(src, REPO), layers_original=orig_layers,
                    layers_run=cfg.num_hidden_layers)
        if cfg.num_hidden_layers != orig_layers:  # a cut model is a different model: label it so
            name = f"{name}-L{cfg.num_hidden_layers}"
            mrec.update(model=name, base_model=entry["name"])
        t = time.perf_counter()
        model = build_model(cfg)
        mrec["build_s"] = r6(time.perf_counter() - t)
        mrec["params"] = sum(p.numel() for p in model.parameters())
        mrec["weights_gib"] = r6(mem_gib())
        mrec["attn_implementation"] = model.config._attn_implementation
        mrec["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
        mrec["model_class"] = type(model).__name__
        mrec["config_run"] = model.config.to_dict()
        log(f"{name}: built {mrec['params'] / 1e9:.2f} B params, {cfg.num_hidden_layers} layers in {mrec['build_s']:.1f} s")
        static = entry.get("static", plan.get("static"))
        if static:
            t = time.perf_counter()
            static_runs(model, static, cfg.vocab_size, out, name)
            mrec["static_s"] = r6(time.perf_counter() - t)
            log(f"{name}: static runs in {mrec['static_s']:.1f} s")
        engine = plan["engine"]
        # One small unrecorded run warms the engine (kernels, allocator) before the recorded ones.
        cb_run(model, cfg, name, {"workload": plan.get("warmup_workload", "grid_i128_o64_c8")}, engine, out,
               60, record=False)
        runs = entry.get("runs", [])
        for k, run in enumerate(runs):
            left = budget_end - time.time()
            if left < plan.get("min_run_s", 8):
                for rest in runs[k:]:
                    append_jsonl(os.path.join(out, "runs.jsonl"),
                                 {"run_id": make_run_id(name, rest), "model": name, "workload": rest["workload"],
                                  "status": "skipped", "error": "time budget of this call used up", "recorded": True})
                log(f"{name}: skipped {len(runs) - k} runs (time budget)")
                break
            rec = cb_run(model, cfg, name, run, engine, out, min(plan.get("run_timeout_s", 60), left))
            log(f"{rec['run_id']}: {rec['status']} {rec.get('duration_s')} s, {rec.get('requests_ok')}/"
                f"{rec['num_requests']} ok {rec.get('error') or ''}")
        mrec["status"] = "ok"
    except Exception as ex:
        mrec.update(status="failed", error=f"{type(ex).__name__}: {ex}", traceback=traceback.format_exc()[-3000:])
        log(f"{name}: FAILED {mrec['error']}")
    mrec["max_memory_gib"] = r6(mem_gib(peak=True))
    mrec["total_s"] = r6(time.perf_counter() - t_model)
    append_jsonl(os.path.join(out, "models.jsonl"), mrec)


# ----------------------------------------------------------------------------- driver
def env_record():
    import importlib.util
    import torch
    import transformers
    d = {"python": platform.python_version(), "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
         "cudnn": torch.backends.cudnn.version(), "transformers": transformers.__version__,
         "flash_attn_installed": importlib.util.find_spec("flash_attn") is not None,
         "kernels_installed": importlib.util.find_spec("kernels") is not None,
         "platform": platform.platform(), "cpu_count": os.cpu_count(), "cpu_model": cpu_model()}
    # Lent machines of one CPU model run an engine's host work ~1.5x apart (vllm_engine README,
    # run 9): what this one does, probed before this process touches the GPU.
    from host_speed_probe import probe_in_subprocess
    d["host_probe"] = probe_in_subprocess()
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        d.update(gpu=p.name, sm_count=p.multi_processor_count, gpu_memory_gib=round(p.total_memory / 2**30, 2))
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", help="child mode: run this model entry (index into the plan)")
    ap.add_argument("--deadline", type=float, help="child mode: epoch seconds by which to stop")
    args = ap.parse_args()
    with open(os.path.join(HERE, "plans.json")) as f:
        plan = json.load(f)[args.plan]
    os.makedirs(args.out, exist_ok=True)

    if args.only is not None:
        run_model(plan, plan["models"][int(args.only)], args.out, args.deadline)
        return

    start = time.time()
    deadline = start + plan["deadline_s"]
    env = env_record()
    env["nvidia_smi_before"] = nvidia_smi()
    env["plan"] = args.plan
    env["started_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
    log(f"env: {json.dumps(env)}")
    # Written now and again at the end: a call stopped by its own timeout keeps the record.
    with open(os.path.join(args.out, "env.json"), "w") as f:
        json.dump(env, f, indent=1)
    for k, entry in enumerate(plan["models"]):
        left = deadline - time.time()
        if left < plan.get("min_model_s", 25):
            append_jsonl(os.path.join(args.out, "models.jsonl"),
                         {"model": entry["name"], "status": "skipped", "error": "time budget of this call used up"})
            log(f"{entry['name']}: skipped (time budget)")
            continue
        cmd = [sys.executable, os.path.abspath(__file__), "--plan", args.plan, "--out", args.out, "--only", str(k),
               "--deadline", str(deadline)]
        try:
            p = subprocess.run(cmd, timeout=left + 30)
            if p.returncode != 0:
                append_jsonl(os.path.join(args.out, "models.jsonl"),
                             {"model": entry["name"], "status": "failed", "error": f"child exited with {p.returncode}"})
        except subprocess.TimeoutExpired:
            append_jsonl(os.path.join(args.out, "models.jsonl"),
                         {"model": entry["name"], "status": "failed", "error": "child killed at the call's deadline"})
    env["nvidia_smi_after"] = nvidia_smi()
    env["wall_s"] = round(time.time() - start, 1)
    with open(os.path.join(args.out, "env.json"), "w") as f:
        json.dump(env, f, indent=1)
    log(f"done in {env['wall_s']} s")


if __name__ == "__main__":
    main()

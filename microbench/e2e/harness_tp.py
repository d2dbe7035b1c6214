#!/usr/bin/env python3
"""Tensor-parallel end-to-end ground truth: harness.py's static timings and continuous-batching replays, with
the random-weight model sharded over the GPUs of one host by transformers' own tensor-parallel plan.

Driver mode (default, plain python3): records the environment (every GPU, `nvidia-smi topo -m`, NCCL), then starts
one `torchrun --standalone --nproc_per_node N` per model of the plan (plans.json, key `nproc`) within a global
deadline, so a crash or a hang costs one model. Child mode (--only K, under torchrun): every rank builds the same
model from the same seed, then `maybe_distribute_model` shards it by the model's `tp_plan` ("auto": colwise q/k/v,
gate/up and lm_head, rowwise o/down with an all-reduce). transformers 5.17's `from_config` takes no tp_plan (only
`from_pretrained` does), so the harness calls the two steps `from_pretrained` uses itself:
`PreTrainedModel.prepare_distribute_model` (process group, device mesh) and `maybe_distribute_model`.

Rank 0 is the engine's TP driver: it submits the requests and alone writes the records (harness.py's format, with
`"tp": N` in each run's `engine_requested`); the other ranks follow (the engine broadcasts new requests and stop
signals to them) and write to a scratch folder. Every decision that changes the sequence of collectives (skip a run
for time) is taken by rank 0 and broadcast. Extra output: allreduce.jsonl, NCCL all-reduce times over the TP group.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1): the
driver sets them for its children, and a child refuses to start without them. Usage:
  python3 microbench/e2e/harness_tp.py --plan tp2 --out $OUT
"""
import argparse
import gc
import json
import os
import signal
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402  (the single-GPU harness: workloads, static runs, CB replay, records)

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# transformers' CB warns unless this is 0 before the process group exists (NCCL inside CUDA graphs; no graphs here).
ENGINE_ENV = {"NCCL_GRAPH_MIXING_SUPPORT": "0"}


def run_cmd(args):
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=30).stdout
    except Exception as e:  # the trace stays useful without it
        return f"error: {e!r}"


def nvidia_smi_all():
    """One dict per GPU (harness.nvidia_smi reads the first only)."""
    q = ("index,name,driver_version,pci.bus_id,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,"
         "power.limit,temperature.gpu,pstate,memory.used,memory.total")
    out = run_cmd(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"]).strip()
    if out.startswith("error"):
        return [{"error": out}]
    return [dict(zip(q.split(","), [v.strip() for v in line.split(",")])) for line in out.split("\n") if line.strip()]


# ----------------------------------------------------------------------------- child: one model, every rank
class Rank:
    """This process's place in the TP group, the control channel, and where it writes."""

    def __init__(self, out):
        import torch.distributed as dist
        from transformers import PreTrainedModel
        from transformers.distributed import DistributedConfig
        self.dist = dist
        self.world = int(os.environ["WORLD_SIZE"])
        # The same two steps from_pretrained takes for DistributedConfig(tp_size=N): process group + device mesh.
        self.dc, self.device_map, self.mesh = PreTrainedModel.prepare_distribute_model(
            DistributedConfig(tp_size=self.world, tp_plan="auto"))
        self.rank = dist.get_rank()
        self.ctl = dist.new_group(backend="gloo")  # host-side decisions, apart from the NCCL traffic
        self.out = out if self.rank == 0 else f"/tmp/harness_tp_rank{self.rank}"
        os.makedirs(self.out, exist_ok=True)

    def agree(self, value):
        """Rank 0's value, on every rank."""
        box = [value]
        self.dist.broadcast_object_list(box, src=0, group=self.ctl)
        return box[0]

    def log(self, msg):
        if self.rank == 0:
            h.log(msg)


def allreduce_times(rk, sizes_bytes, iters=20):
    """Median time of one bf16 all-reduce over the TP group per size, CUDA events on rank 0."""
    import torch
    if not torch.cuda.is_available():
        return
    for n in sizes_bytes:
        x = torch.ones(n // 2, dtype=torch.bfloat16, device="cuda")
        for _ in range(5):
            rk.dist.all_reduce(x)
        torch.cuda.synchronize()
        rk.dist.barrier(group=rk.ctl)
        times = []
        for _ in range(iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            rk.dist.all_reduce(x)
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e) * 1e3)
        if rk.rank == 0:
            med = sorted(times)[len(times) // 2]
            h.append_jsonl(os.path.join(rk.out, "allreduce.jsonl"),
                           {"op": "all_reduce", "dtype": "bfloat16", "bytes": n, "ranks": rk.world, "iters": iters,
                            "median_us": h.r6(med), "min_us": h.r6(min(times)),
                            "busbw_gbps": h.r6(2 * (rk.world - 1) / rk.world * n / (med * 1e-6) / 1e9)})
        del x
    torch.cuda.empty_cache()


def build_tp_model(rk, cfg):
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)  # the same full weights on every rank, so the shards belong to one model
    with torch.device(rk.device_map):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    # Each full tensor lives until its shard replaces it: the peak memory holds the full weights once.
    model = type(model).maybe_distribute_model(model, rk.dc, rk.mesh)
    model.eval()
    h.sync()
    return model


def local_param_bytes(model):
    from torch.distributed.tensor import DTensor
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size() for p in model.parameters())


def cb_follow(model, cfg, run, engine, run_timeout_s):
    """A non-driver rank's side of one CB run: the same engine, fed and stopped by rank 0 through the engine.
    Errors are logged, not raised, so that this rank stays in step with rank 0 (which records them)."""
    import torch
    manager = None
    try:
        rows = h.run_rows(run)
        cbc, gen, _ = h.cb_configs(cfg, rows, run, engine)
        manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cbc)
        manager.warmup()
        manager.start()
        limit = time.perf_counter() + run_timeout_s + 60  # rank 0 stops the group well before this
        while manager.is_running() and time.perf_counter() < limit:
            time.sleep(0.05)
        manager.stop(block=True, timeout=30)
    except Exception as ex:
        h.log(f"follower rank: {run['workload']}: {type(ex).__name__}: {ex}")
    finally:
        try:
            if manager is not None:
                manager.destroy()
        except Exception:
            pass
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def cb(rk, model, cfg, name, run, engine, run_timeout_s, record=True):
    if rk.rank == 0:
        return h.cb_run(model, cfg, name, run, engine, rk.out, run_timeout_s, record=record)
    cb_follow(model, cfg, run, engine, run_timeout_s)
    return None


def run_model(plan, entry, out, deadline):
    import torch
    for k, v in MULTICAST_OFF.items():
        if os.environ.get(k) != v:
            raise SystemExit(f"refusing to run: {k} must be {v} (NVLink multicast stays off on shared hosts)")
    rk = Rank(out)
    engine = dict(plan["engine"], tp=rk.world)
    name = entry["name"]
    t_model = time.perf_counter()
    budget_end = min(deadline, time.time() + entry.get("budget_s", 1e9))
    mrec = {"model": name, "base_model": name, "layers_requested": entry.get("layers"), "tp": rk.world}
    try:
        if entry.get("allreduce"):
            allreduce_times(rk, plan.get("allreduce_bytes", []))
        cfg, orig_layers, src = h.build_config(name, entry.get("layers"))
        mrec.update(config_source=os.path.relpath(src, h.REPO), layers_original=orig_layers,
                    layers_run=cfg.num_hidden_layers)
        if cfg.num_hidden_layers != orig_layers:  # a cut model is a different model: label it so
            name = f"{name}-L{cfg.num_hidden_layers}"
            mrec.update(model=name, base_model=entry["name"])
        t = time.perf_counter()
        model = build_tp_model(rk, cfg)
        mrec["build_s"] = h.r6(time.perf_counter() - t)
        mrec["params"] = sum(p.numel() for p in model.parameters())  # DTensor numel: the full model's count
        mrec["weights_gib"] = h.r6(h.mem_gib())  # allocated on rank 0 after sharding
        mrec["weights_local_gib"] = h.r6(local_param_bytes(model) / 2**30)  # what rank 0's GEMMs read
        mrec["attn_implementation"] = model.config._attn_implementation
        mrec["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
        mrec["model_class"] = type(model).__name__
        mrec["tp_plan"] = dict(model.tp_plan)
        mrec["config_run"] = model.config.to_dict()
        mrec["config_run"].pop("distributed_config", None)  # not JSON; `tp` above says it
        rk.log(f"{name}: built {mrec['params'] / 1e9:.2f} B params, {cfg.num_hidden_layers} layers, TP{rk.world} "
               f"in {mrec['build_s']:.1f} s")
        static = entry.get("static", plan.get("static"))
        if static:
            t = time.perf_counter()
            h.static_runs(model, static, cfg.vocab_size, rk.out, name)
            mrec["static_s"] = h.r6(time.perf_counter() - t)
            rk.log(f"{name}: static runs in {mrec['static_s']:.1f} s")
        # One small unrecorded run warms the engine (kernels, allocator, NCCL) before the recorded ones.
        cb(rk, model, cfg, name, {"workload": plan.get("warmup_workload", "grid_i128_o64_c8")}, engine, 60,
           record=False)
        runs = entry.get("runs", [])
        for k, run in enumerate(runs):
            left = rk.agree(budget_end - time.time())
            if left < plan.get("min_run_s", 8):
                if rk.rank == 0:
                    for rest in runs[k:]:
                        h.append_jsonl(os.path.join(rk.out, "runs.jsonl"),
                                       {"run_id": h.make_run_id(name, rest), "model": name, "workload": rest["workload"],
                                        "status": "skipped", "error": "time budget of this call used up",
                                        "recorded": True, "engine_requested": {"tp": rk.world}})
                rk.log(f"{name}: skipped {len(runs) - k} runs (time budget)")
                break
            rec = cb(rk, model, cfg, name, run, engine, min(plan.get("run_timeout_s", 60), left))
            if rec is not None:
                rk.log(f"{rec['run_id']}: {rec['status']} {rec.get('duration_s')} s, {rec.get('requests_ok')}/"
                       f"{rec['num_requests']} ok {rec.get('error') or ''}")
        mrec["status"] = "ok"
    except Exception as ex:
        mrec.update(status="failed", error=f"{type(ex).__name__}: {ex}", traceback=traceback.format_exc()[-3000:])
        h.log(f"rank {rk.rank}: {name}: FAILED {mrec['error']}")
    mrec["max_memory_gib"] = h.r6(h.mem_gib(peak=True))
    mrec["total_s"] = h.r6(time.perf_counter() - t_model)
    if rk.rank == 0:
        h.append_jsonl(os.path.join(rk.out, "models.jsonl"), mrec)
    rk.dist.barrier(group=rk.ctl)
    rk.dist.destroy_process_group()
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- driver
def stop_tree(p):
    """End torchrun and its ranks (torchrun starts each rank in a session of its own, so no group kill reaches them):
    SIGTERM lets torchrun stop its ranks; whatever of the tree is left after 15 s gets SIGKILL, by pid."""
    import psutil
    tree = [p.pid] + [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
    p.terminate()
    try:
        p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait()


def env_record(nproc):
    import torch
    d = h.env_record()
    d.update(tp=nproc, gpu_count=torch.cuda.device_count(),
             nccl=".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
             env={k: os.environ.get(k) for k in list(MULTICAST_OFF) + list(ENGINE_ENV)},
             nvidia_smi_topo=run_cmd(["nvidia-smi", "topo", "-m"]),
             nvidia_smi_nvlink=run_cmd(["nvidia-smi", "nvlink", "--status"]))
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", help="child mode, under torchrun: run this model entry (index into the plan)")
    ap.add_argument("--deadline", type=float, help="child mode: epoch seconds by which to stop")
    args = ap.parse_args()
    with open(os.path.join(h.HERE, "plans.json")) as f:
        plan = json.load(f)[args.plan]
    os.makedirs(args.out, exist_ok=True)

    if args.only is not None:
        run_model(plan, plan["models"][int(args.only)], args.out, args.deadline)
        return

    os.environ.update(MULTICAST_OFF)
    os.environ.update(ENGINE_ENV)
    nproc = plan["nproc"]
    start = time.time()
    deadline = start + plan["deadline_s"]
    env = env_record(nproc)
    env["nvidia_smi_before"] = nvidia_smi_all()
    env["plan"] = args.plan
    env["started_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
    h.log(f"env: {json.dumps(env)}")
    for k, entry in enumerate(plan["models"]):
        left = deadline - time.time()
        if left < plan.get("min_model_s", 25):
            h.append_jsonl(os.path.join(args.out, "models.jsonl"),
                           {"model": entry["name"], "status": "skipped", "error": "time budget of this call used up"})
            h.log(f"{entry['name']}: skipped (time budget)")
            continue
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               os.path.abspath(__file__), "--plan", args.plan, "--out", args.out, "--only", str(k),
               "--deadline", str(deadline)]
        t = time.time()
        p = subprocess.Popen(cmd)
        try:
            if p.wait(timeout=left + 20) != 0:
                h.append_jsonl(os.path.join(args.out, "models.jsonl"),
                               {"model": entry["name"], "status": "failed", "error": f"torchrun exited with {p.returncode}"})
        except subprocess.TimeoutExpired:
            stop_tree(p)
            h.append_jsonl(os.path.join(args.out, "models.jsonl"),
                           {"model": entry["name"], "status": "failed", "error": "torchrun killed at the call's deadline"})
        h.log(f"{entry['name']}: torchrun done in {time.time() - t:.1f} s")
    env["nvidia_smi_after"] = nvidia_smi_all()
    env["wall_s"] = round(time.time() - start, 1)
    with open(os.path.join(args.out, "env.json"), "w") as f:
        json.dump(env, f, indent=1)
    h.log(f"done in {env['wall_s']} s")


if __name__ == "__main__":
    main()

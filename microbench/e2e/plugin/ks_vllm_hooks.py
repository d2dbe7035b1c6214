"""Times the pieces of every engine-core step inside the process that runs vLLM's engine core,
the one `vllm serve` / `AsyncLLM` spawns (session 21 found the serving engine core ~12 ms slower
on a burst's prompt step than the in-process engine `vllm_host_probe.py` times, and the two can
only be told apart by timing the serving one itself).

A vLLM general plugin (entry point group `vllm.general_plugins`, declared by the
`ks_vllm_hooks-0.0.dist-info` folder next to this file, so putting this folder on PYTHONPATH
registers it; vLLM loads general plugins in every process, the engine core's included, before it
builds the scheduler and the model runner). It does nothing unless `KS_VLLM_STEP_LOG` names a
CSV file; then it wraps, at class level, the engine core's step, the scheduler's `schedule` and
`update_from_output`, vLLM 0.24's V2 model runner (`execute_model` and its pieces,
`sample_tokens`) and the CUDA-graph replays, and appends one row per step: monotonic and wall
start time (the engine's own request timestamps are monotonic), when `update_from_output` handed
that step's tokens out (`t_output_mono_s`), what the step held and how many requests the
scheduler left waiting, host wall time per piece (us), and the GPU span of `execute_model`'s work
(CUDA events, read once done). Requests reaching the core go to `<log>_adds.csv`: when the input
thread finished `preprocess_add_request` and when the busy loop's `add_request` took them.
The pieces are those of `vllm_host_probe.py`'s `steps.csv`, so `vllm_host_summary.py` reads both.

`KS_VLLM_STEP_GPU=0` leaves the CUDA events out (no GPU span; to measure what they cost).
Usage on the device (after microbench/tools/vllm_runtime.sh install1/install2):
  KS_VLLM_STEP_LOG=$OUT/steps_serving.csv PYTHONPATH=/tmp/site:microbench/e2e/plugin \\
    python3 microbench/e2e/vllm_serve.py --plan ... --out $OUT
"""
import atexit
import csv
import functools
import os
import time

PIECES = ("step_fn", "schedule", "execute_model", "update_requests", "prepare_inputs", "prepare_attn", "attn_metadata",
          "run_fullgraph", "run_pw_graph", "sample_tokens", "update_from_output")
EXEC_PIECES = ("update_requests", "prepare_inputs", "prepare_attn", "attn_metadata", "run_fullgraph", "run_pw_graph")
COLUMNS = ["pid", "t_start_mono_s", "t_start_wall_s", "t_output_mono_s", "tokens", "new_reqs", "reqs", "waiting"] + \
    [p + "_us" for p in PIECES] + ["rest_of_execute_us", "execute_gpu_span_us"]
# Requests reaching the engine core: `preprocess` runs on its input thread, `add` on the busy loop.
ADD_COLUMNS = ["pid", "event", "t_mono_s", "request_id", "prompt_tokens", "us"]

# (module, class, method, piece): what is wrapped where it exists (a missing one is reported).
TARGETS = [
    ("vllm.v1.engine.core", "EngineCore", "step_with_batch_queue", "step_fn"),
    ("vllm.v1.engine.core", "EngineCore", "step", "step_fn"),
    ("vllm.v1.engine.core", "EngineCore", "preprocess_add_request", "preprocess"),
    ("vllm.v1.engine.core", "EngineCore", "add_request", "add"),
    ("vllm.v1.core.sched.scheduler", "Scheduler", "schedule", "schedule"),
    ("vllm.v1.core.sched.scheduler", "Scheduler", "update_from_output", "update_from_output"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "execute_model", "execute_model"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "finish_requests", "update_requests"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "free_states", "update_requests"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "add_requests", "update_requests"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "update_requests", "update_requests"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "prepare_inputs", "prepare_inputs"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "prepare_attn", "prepare_attn"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "sample_tokens", "sample_tokens"),
    ("vllm.v1.worker.gpu.model_states.default", "DefaultModelState", "prepare_attn", "attn_metadata"),
    ("vllm.v1.worker.gpu.cudagraph_utils", "ModelCudaGraphManager", "run_fullgraph", "run_fullgraph"),
    ("vllm.v1.worker.gpu.cudagraph_utils", "ModelCudaGraphManager", "run_pw_graph", "run_pw_graph"),
]


class StepLog:
    """The open step (the latest `execute_model`), steps whose GPU span is pending, and the file."""

    def __init__(self, path, cuda=None):
        self.path, self.cuda = path, cuda
        self.adds_path = os.path.splitext(path)[0] + "_adds.csv"
        self.cur, self.pending, self.done, self.adds = None, [], [], []
        # Steps by their scheduler output, until `update_from_output` hands that step's tokens out.
        self.by_output = {}
        # The scheduler runs before `execute_model` opens the step it scheduled.
        self.schedule_us = 0.0
        self.hooked, self.missing = [], []

    def begin(self, scheduler_output, waiting=""):
        so = scheduler_output
        self.cur = {"pid": os.getpid(), "t_start_mono_s": time.monotonic(), "t_start_wall_s": time.time(),
                    "tokens": so.total_num_scheduled_tokens, "new_reqs": len(so.scheduled_new_reqs), "reqs": len(so.num_scheduled_tokens),
                    "waiting": waiting, "schedule_us": self.schedule_us}
        self.by_output[id(so)] = self.cur
        self.schedule_us = 0.0
        self.settle(block=False)

    def output_handed(self, scheduler_output):
        rec = self.by_output.pop(id(scheduler_output), None)
        if rec is not None:
            rec["t_output_mono_s"] = time.monotonic()

    def request_event(self, event, request, us):
        req = request[0] if isinstance(request, tuple) else request  # preprocess returns (Request, wave)
        self.adds.append({"pid": os.getpid(), "event": event, "t_mono_s": time.monotonic(), "request_id": getattr(req, "request_id", ""),
                          "prompt_tokens": len(getattr(req, "prompt_token_ids", None) or ()), "us": us})

    def add(self, piece, us):
        if piece == "schedule":
            self.schedule_us += us
        elif self.cur is not None:
            self.cur[piece + "_us"] = self.cur.get(piece + "_us", 0.0) + us

    def gpu_events(self, e0, e1):
        if self.cur is not None:
            self.pending.append((self.cur, e0, e1))

    def settle(self, block):
        """Moves steps whose GPU work finished (all of them if `block`) to the file."""
        still = []
        for rec, e0, e1 in self.pending:
            if block or ("t_output_mono_s" in rec and (e1 is None or e1.query())):
                if e1 is not None:  # no events: the GPU span is not recorded
                    if block:
                        e1.synchronize()
                    rec["execute_gpu_span_us"] = e0.elapsed_time(e1) * 1e3
                self.done.append(rec)
            else:
                still.append((rec, e0, e1))
        self.pending = still
        if len(self.done) >= 64 or (block and (self.done or self.adds)):
            self.flush()

    def flush(self):
        new = not os.path.exists(self.path)
        with open(self.path, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(COLUMNS)
            for rec in self.done:
                rec["rest_of_execute_us"] = rec.get("execute_model_us", 0.0) - sum(rec.get(p + "_us", 0.0) for p in EXEC_PIECES)
                w.writerow([round(rec[c], 6 if c.startswith("t_") else 1) if isinstance(rec.get(c), float) else rec.get(c, "") for c in COLUMNS])
        self.done = []
        adds, self.adds = self.adds, []
        if adds:
            new = not os.path.exists(self.adds_path)
            with open(self.adds_path, "a", newline="") as f:
                w = csv.DictWriter(f, ADD_COLUMNS)
                if new:
                    w.writeheader()
                w.writerows(adds)


LOG = None
LAST_WAITING = [""]


def wrap(cls, name, piece, log):
    fn = cls.__dict__[name]

    @functools.wraps(fn)
    def timed(self, *args, **kwargs):
        if piece in ("preprocess", "add"):
            t = time.perf_counter()
            out = fn(self, *args, **kwargs)
            log.request_event(piece, out if piece == "preprocess" else (args[0] if args else kwargs["request"]),
                              (time.perf_counter() - t) * 1e6)
            return out
        if piece == "execute_model":
            log.begin(args[0] if args else kwargs["scheduler_output"], LAST_WAITING[0])
            e0 = log.cuda.Event(enable_timing=True) if log.cuda else None
            if e0 is not None:
                e0.record()
        t = time.perf_counter()
        try:
            return fn(self, *args, **kwargs)
        finally:
            log.add(piece, (time.perf_counter() - t) * 1e6)
            if piece == "schedule":
                LAST_WAITING[0] = len(getattr(self, "waiting", ()))  # requests the scheduler left waiting
            elif piece == "update_from_output":
                log.output_handed(args[0] if args else kwargs["scheduler_output"])
            if piece == "execute_model":
                e1 = log.cuda.Event(enable_timing=True) if e0 is not None else None
                if e1 is not None:
                    e1.record()
                log.gpu_events(e0, e1)

    setattr(cls, name, timed)


def install(path, targets=TARGETS, cuda=None):
    """Wraps every target that exists; returns the log (also `LOG`)."""
    import importlib
    global LOG
    log = StepLog(path, cuda)
    for module, cls_name, name, piece in targets:
        try:
            cls = getattr(importlib.import_module(module), cls_name)
        except (ImportError, AttributeError):
            log.missing.append(f"{module}.{cls_name}")
            continue
        if name in cls.__dict__:
            wrap(cls, name, piece, log)
            log.hooked.append(f"{cls_name}.{name}")
        else:
            log.missing.append(f"{cls_name}.{name}")
    atexit.register(log.settle, True)
    LOG = log
    return log


def register():
    """vLLM's general-plugin entry point: runs in every vLLM process, hooks only when asked."""
    path = os.environ.get("KS_VLLM_STEP_LOG")
    if not path or LOG is not None:
        return
    import torch
    # KS_VLLM_STEP_GPU=0 leaves out the CUDA events (the GPU span), to tell their cost from the
    # wrappers' (run 8: with both, one plain/hooked pair differed by up to 31 %).
    gpu = torch.cuda.is_available() and os.environ.get("KS_VLLM_STEP_GPU", "1") != "0"
    log = install(path, cuda=torch.cuda if gpu else None)
    print(f"ks_vllm_hooks: pid {os.getpid()} hooked {len(log.hooked)} methods, missing {log.missing}", flush=True)

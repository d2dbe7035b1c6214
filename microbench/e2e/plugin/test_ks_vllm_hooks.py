#!/usr/bin/env python3
"""Checks ks_vllm_hooks without vLLM or a GPU: stand-in classes shaped like vLLM 0.24's engine
core, scheduler and V2 model runner are wrapped, a few steps run, and the CSV must hold one row
per step with the pieces' times adding up; the entry point must be discoverable from the
dist-info folder. Run: python3 microbench/e2e/plugin/test_ks_vllm_hooks.py
"""
import csv
import os
import sys
import tempfile
import time
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ks_vllm_hooks  # noqa: E402


class FakeEvent:
    clock = 0.0

    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3  # ms, as torch.cuda.Event


def fake_modules():
    """A module 'fakevllm' with classes whose methods sleep known amounts."""
    m = types.ModuleType("fakevllm")

    class Scheduler:
        def schedule(self):
            time.sleep(0.001)
            return types.SimpleNamespace(total_num_scheduled_tokens=600, scheduled_new_reqs=[1, 2], num_scheduled_tokens={"a": 1, "b": 1, "c": 1})

        def update_from_output(self, so, out):
            time.sleep(0.0005)

    class Runner:
        def prepare_inputs(self, so):
            time.sleep(0.002)

        def execute_model(self, so):
            self.prepare_inputs(so)
            time.sleep(0.003)  # the graph-less model call: the rest of execute_model

        def sample_tokens(self):
            time.sleep(0.001)

    class Core:
        def __init__(self):
            self.scheduler, self.runner = Scheduler(), Runner()

        def add_request(self, request, request_wave=0):
            time.sleep(0.0002)

        def step(self):
            so = self.scheduler.schedule()
            self.runner.execute_model(so)
            self.runner.sample_tokens()
            self.scheduler.update_from_output(so, None)

    m.Scheduler, m.Runner, m.Core = Scheduler, Runner, Core
    sys.modules["fakevllm"] = m
    return m


class HooksTest(unittest.TestCase):
    def test_one_row_per_step_with_its_pieces(self):
        m = fake_modules()
        path = os.path.join(tempfile.mkdtemp(), "steps.csv")
        targets = [("fakevllm", "Core", "step", "step_fn"), ("fakevllm", "Scheduler", "schedule", "schedule"),
                   ("fakevllm", "Runner", "execute_model", "execute_model"), ("fakevllm", "Runner", "prepare_inputs", "prepare_inputs"),
                   ("fakevllm", "Runner", "sample_tokens", "sample_tokens"), ("fakevllm", "Runner", "absent", "run_fullgraph"),
                   ("fakevllm", "Scheduler", "update_from_output", "update_from_output"), ("fakevllm", "Core", "add_request", "add"),
                   ("nomodule.x", "Y", "z", "schedule")]
        log = ks_vllm_hooks.install(path, targets, cuda=types.SimpleNamespace(Event=FakeEvent))
        self.assertEqual(log.missing, ["Runner.absent", "nomodule.x.Y"])
        core = m.Core()
        core.waiting = []
        core.scheduler.waiting = ["w1", "w2"]
        core.add_request(types.SimpleNamespace(request_id="r0", prompt_token_ids=[1] * 7))
        for _ in range(3):
            core.step()
        log.settle(block=True)
        rows = list(csv.DictReader(open(path)))
        self.assertEqual(len(rows), 3)
        r = rows[0]
        self.assertEqual((r["tokens"], r["new_reqs"], r["reqs"]), ("600", "2", "3"))
        us = {k: float(r[k]) for k in ("step_fn_us", "execute_model_us", "prepare_inputs_us", "rest_of_execute_us", "sample_tokens_us")}
        # The schedule call precedes execute_model, which opens the step: it belongs to this row.
        self.assertGreater(float(r["schedule_us"]), 900)
        self.assertGreater(us["prepare_inputs_us"], 1_900)
        self.assertGreater(us["rest_of_execute_us"], 2_900)
        self.assertAlmostEqual(us["execute_model_us"], us["prepare_inputs_us"] + us["rest_of_execute_us"], delta=1.0)
        self.assertGreater(us["step_fn_us"], us["execute_model_us"] + us["sample_tokens_us"])
        self.assertGreater(float(r["execute_gpu_span_us"]), 4_000)
        # Tokens are handed out after the step's sampling, and the scheduler's queue is recorded.
        self.assertGreater(float(r["t_output_mono_s"]) - float(r["t_start_mono_s"]), 0.006)
        self.assertEqual(r["waiting"], "2")
        adds = list(csv.DictReader(open(log.adds_path)))
        self.assertEqual([(a["event"], a["request_id"], a["prompt_tokens"]) for a in adds], [("add", "r0", "7")])
        self.assertGreater(float(adds[0]["us"]), 150)
        self.assertLess(float(adds[0]["t_mono_s"]), float(r["t_start_mono_s"]))

    def test_without_cuda_events_steps_are_still_written(self):
        m = fake_modules()
        path = os.path.join(tempfile.mkdtemp(), "steps.csv")
        targets = [("fakevllm", "Core", "step", "step_fn"), ("fakevllm", "Runner", "execute_model", "execute_model"),
                   ("fakevllm", "Scheduler", "update_from_output", "update_from_output")]
        log = ks_vllm_hooks.install(path, targets, cuda=None)
        core = m.Core()
        for _ in range(2):
            core.step()
        log.settle(block=True)
        with open(path) as f:
            rows = list(csv.DictReader(f))
        self.assertEqual(len(rows), 2)
        self.assertEqual(rows[0]["execute_gpu_span_us"], "")
        self.assertGreater(float(rows[0]["execute_model_us"]), 4_000)

    def test_entry_point_is_discoverable(self):
        from importlib.metadata import entry_points
        sys.path.insert(0, HERE)
        names = [(e.name, e.value) for e in entry_points(group="vllm.general_plugins")]
        self.assertIn(("ks_vllm_hooks", "ks_vllm_hooks:register"), names)


if __name__ == "__main__":
    unittest.main()

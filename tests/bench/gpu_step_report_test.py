#!/usr/bin/env python3
"""bench/gpu/step_report.py on a made-up run and trace: the step time leaves out the first and the traced step, the
MFU is taken against the datasheet peak the run's summary names, kernel kinds merge layers and micro-batches, and a
run below --min-mfu fails."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "gpu", "step_report.py")

RUN = {
    "first_step": 0,
    "iteration_time_s": [9.0, 1.0, 1.2, 0.8, 5.0],  # the first picks algorithms, the last is traced
    "tokens_per_s": 0,
    "summary": {"traced_step": 4, "scenario": {"gpus": 1}, "peak_flops_per_gpu": 989e12,
                "model_flops_per_iteration": 494.5e12},
}


def event(name, seconds, flops, cat="compute"):
    return {"name": name, "cat": cat, "ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": seconds * 1e6,
            "args": {"op": 0, "bytes": 0, "flops": flops, "wait_us": 0}}


TRACE = {"traceEvents": [
    {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0"}},
    event("forward qkv_projection L0 mb0", 0.2, 100e12),
    event("forward qkv_projection L1 mb0", 0.2, 100e12),
    event("backward attention_core L0 mb0", 0.6, 60e12),
    event("all_reduce tensor layer_output L0 mb0", 5.0, 0, cat="collective"),
]}


def run(*extra):
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for name, content in (("run.json", RUN), ("trace.json", TRACE)):
            paths.append(os.path.join(folder, name))
            with open(paths[-1], "w") as f:
                json.dump(content, f)
        return subprocess.run([sys.executable, SCRIPT, *paths, *extra], capture_output=True, text=True)


class StepReportTest(unittest.TestCase):
    def test_step_time_mfu_and_kinds(self):
        result = run("--tokens-per-step", "16384")
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        # median of 1.0, 1.2, 0.8 = 1.0 s; 494.5 TFLOP in it: 494.5 TFLOP/s, half of 989
        self.assertIn("step 1.0000 s", lines[0])
        self.assertIn("16384 tokens/s", lines[0])
        self.assertIn("model 494.5 TFLOP/s per GPU, MFU 50.0 % of the datasheet 989 TFLOP/s", lines[0])
        kinds = {line.split("  ")[1].strip(): line for line in lines[2:]}
        self.assertEqual(set(kinds), {"forward qkv_projection", "backward attention_core"})  # collectives left out
        self.assertIn("40.0 %     500.0 TFLOP/s", kinds["forward qkv_projection"])  # 0.4 of 1 s, 200 TFLOP in 0.4 s
        self.assertIn("60.0 %     100.0 TFLOP/s", kinds["backward attention_core"])

    def test_below_the_mfu_gate_fails(self):
        self.assertEqual(run("--min-mfu", "50").returncode, 0)
        failed = run("--min-mfu", "55")
        self.assertEqual(failed.returncode, 1)
        self.assertIn("MFU 50.0 % < 55 % of the datasheet peak", failed.stdout)


if __name__ == "__main__":
    unittest.main()

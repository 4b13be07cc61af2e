#!/usr/bin/env python3
"""bench/accuracy/vtrain.py on made-up rows in vTrain's file format (a byte-order mark, its column names): every row
is simulated with its plan and its error is predicted / measured - 1; a file that lacks a column, holds a value that
is not a number, or a plan whose TP x DP x PP is not its GPU count is refused by name.

    vtrain_test.py TWIN
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "accuracy", "vtrain.py")
TWIN = None
HEADER = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,tensor parallelism,"
          "data parallelism,pipeline parallelism,iteration time (ms)")


def write(folder, name, lines):
    os.makedirs(os.path.join(folder, "data"), exist_ok=True)
    with open(os.path.join(folder, "data", name), "w", encoding="utf-8-sig") as f:
        f.write("\n".join(lines) + "\n")


def run(folder, *extra):
    return subprocess.run([sys.executable, SCRIPT, "--twin", TWIN, "--data", folder, "--jobs", "2", *extra],
                          capture_output=True, text=True)


class VTrainRows(unittest.TestCase):
    def test_every_row_is_simulated_with_its_plan(self):
        with tempfile.TemporaryDirectory() as folder:
            # 16 GPUs on two nodes with a pipeline, 4 on a part of one node without (the multi-node file has a
            # parameter count in front).
            write(folder, "ground_truth_multi.csv",
                  ["Parameters (billion)," + HEADER, "0.1,16,32,2,1024,16,4,1024,2,4,2,200"])
            write(folder, "ground_truth_single.csv", [HEADER, "4,8,2,1024,16,4,1024,2,2,1,100"])
            out = os.path.join(folder, "rows.json")
            done = run(folder, "--rows", "--json", out)
            self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
            self.assertIn("ground_truth_multi.csv", done.stdout)
            self.assertIn("ground_truth_single.csv", done.stdout)
            with open(out) as f:
                rows = json.load(f)
            self.assertEqual(len(rows), 2)
            for row in rows:
                self.assertGreater(row["iteration_time_s"], 0)
                self.assertAlmostEqual(row["error"], row["iteration_time_s"] / row["measured_s"] - 1)
            self.assertEqual([r["measured_s"] for r in rows], [0.2, 0.1])
            # --only reads one file, and --set reaches every row: half the GEMM rate makes the GEMMs slower.
            slower = os.path.join(folder, "slower.json")
            done = run(folder, "--only", "single", "--set", "cluster.gemm_tflops=115", "--json", slower)
            self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
            with open(slower) as f:
                (row,) = json.load(f)
            self.assertGreater(row["iteration_time_s"], rows[1]["iteration_time_s"])

    def test_bad_files_are_refused_by_name(self):
        cases = [
            ([HEADER.replace(",micro batch", ""), "4,8,1024,16,4,1024,2,2,1,100"], "lacks the column(s) micro batch"),
            ([HEADER, "4,8,2,1024,16,4,1024,2,2,1,fast"], "ground_truth_single.csv:2: a value is not a number"),
            ([HEADER, "4,8,2,1024,16,4,1024,2,4,1,100"],
             "ground_truth_single.csv:2: TP x DP x PP is not the GPU count"),
        ]
        for lines, message in cases:
            with tempfile.TemporaryDirectory() as folder:
                write(folder, "ground_truth_single.csv", lines)
                done = run(folder, "--only", "single")
                self.assertNotEqual(done.returncode, 0, message)
                self.assertIn(message, done.stderr, message)
        with tempfile.TemporaryDirectory() as folder:
            done = run(folder, "--only", "multi")
            self.assertNotEqual(done.returncode, 0)
            self.assertIn("no ground_truth_multi.csv under", done.stderr)


if __name__ == "__main__":
    TWIN = sys.argv.pop(1)
    unittest.main()

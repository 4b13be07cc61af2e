#!/usr/bin/env python3
"""bench/accuracy/run.py's split of a series into time per sequence and fixed time: exact on points of a line,
skipped below three distinct points, and the residual reported when the points are not on a line; and its MAPE,
which leaves out the runs marked mape = false but still reports them."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "accuracy"))
import run  # noqa: E402


def row(series, sequences, published_s, predicted_s):
    return {"series": series, "sequences_per_replica": sequences, "published_s": published_s,
            "iteration_time_s": predicted_s, "error": predicted_s / published_s - 1}


class SplitSeries(unittest.TestCase):
    def test_points_on_a_line_give_its_slope_and_intercept(self):
        # published: 12 s fixed + 0.2 s per sequence; predicted: 6 s + 0.18 s
        rows = [row("s", n, 12 + 0.2 * n, 6 + 0.18 * n) for n in (240, 192, 160)]
        (split,) = run.split_series(rows)
        self.assertAlmostEqual(split["published_per_sequence_s"], 0.2)
        self.assertAlmostEqual(split["published_fixed_s"], 12.0)
        self.assertAlmostEqual(split["twin_per_sequence_s"], 0.18)
        self.assertAlmostEqual(split["twin_fixed_s"], 6.0)
        self.assertAlmostEqual(split["published_worst_residual_s"], 0.0)

    def test_a_constant_or_a_factor_that_explains_the_series_leaves_no_error(self):
        # twin 8 s short on every iteration: the constant explains it, a factor does not
        short = [row("s", n, 12 + 0.2 * n, 4 + 0.2 * n) for n in (240, 192, 160)]
        (split,) = run.split_series(short)
        self.assertAlmostEqual(split["constant_s"], 8.0)
        self.assertAlmostEqual(split["constant_worst_error"], 0.0)
        self.assertGreater(split["factor_worst_error"], 0.01)
        # twin 10 % fast on every time: the factor explains it, a constant does not
        fast = [row("s", n, 12 + 0.2 * n, (12 + 0.2 * n) / 1.1) for n in (240, 192, 160)]
        (split,) = run.split_series(fast)
        self.assertAlmostEqual(split["factor"], 1.1)
        self.assertAlmostEqual(split["factor_worst_error"], 0.0)
        self.assertGreater(split["constant_worst_error"], 0.01)

    def test_fewer_than_three_distinct_points_are_not_split(self):
        rows = [row("s", 240, 60, 50), row("s", 160, 44, 35), row("s", 160, 44.5, 35.5), row(None, 100, 1, 1)]
        self.assertEqual(run.split_series(rows), [])

    def test_failed_runs_are_left_out(self):
        rows = [row("s", n, 12 + 0.2 * n, 6 + 0.18 * n) for n in (240, 192, 160)]
        rows[0]["error"] = "twin failed"
        self.assertEqual(run.split_series(rows), [])

    def test_points_off_a_line_report_their_residual(self):
        rows = [row("s", 240, 60.1, 50), row("s", 192, 50.2, 41), row("s", 160, 44.4, 35)]
        (split,) = run.split_series(rows)
        self.assertGreater(split["published_worst_residual_s"], 0.1)
        self.assertLess(split["published_worst_residual_s"], 0.5)



class MapeByGroup(unittest.TestCase):
    def test_runs_left_out_are_reported_apart_and_not_in_all(self):
        rows = [{"group": "a", "error": 0.02}, {"group": "a", "error": -0.04}, {"group": "b", "error": 0.06},
                {"group": "c", "error": -0.30, "in_mape": False}, {"group": "a", "error": "twin failed"}]
        table = {(g, counted): (mape, bias, runs) for g, mape, bias, runs, counted in run.mape_by_group(rows)}
        self.assertAlmostEqual(table[("a", True)][0], 3.0)
        self.assertAlmostEqual(table[("a", True)][1], -1.0)
        self.assertAlmostEqual(table[("all", True)][0], 4.0)
        self.assertEqual(table[("all", True)][2], 3)
        self.assertAlmostEqual(table[("c", False)][0], 30.0)
        self.assertNotIn(("all", False), table)
        self.assertNotIn(("c", True), table)
        self.assertNotIn(("all-hopper", True), table)  # no Hopper run, no Hopper line

    def test_hopper_runs_have_their_own_mape_and_stay_out_of_all(self):
        rows = [{"group": "a", "error": 0.02}, {"group": "h", "error": -0.20, "generation": "hopper"},
                {"group": "h", "error": -0.10, "generation": "hopper"}]
        table = {(g, counted): (mape, bias, runs) for g, mape, bias, runs, counted in run.mape_by_group(rows)}
        self.assertAlmostEqual(table[("all", True)][0], 2.0)
        self.assertEqual(table[("all", True)][2], 1)
        self.assertAlmostEqual(table[("all-hopper", True)][0], 15.0)
        self.assertAlmostEqual(table[("all-hopper", True)][1], -15.0)
        self.assertEqual(table[("all-hopper", True)][2], 2)



class FlopCounts(unittest.TestCase):
    LLAMA3_405B = {"hidden": 16384, "layers": 126, "heads": 128, "kv_heads": 8, "ffn_hidden": 53248,
                   "seq_len": 8192, "activation": "swiglu"}

    def test_megatron_core_count_gives_nvidias_flops_per_token(self):
        # Megatron-Bridge's performance summary (25.11 container, DGX-H100): Llama 3.1 405B at 292 tokens/s and
        # 737 model TFLOP/s per GPU, i.e. 2.524e12 FLOPs per token; vocabulary 128256.
        per_token = run.megatron_core_flops_per_token(self.LLAMA3_405B, 128256)
        self.assertAlmostEqual(per_token / 2.524e12, 1.0, delta=0.002)

    def test_published_tflops_become_seconds_with_the_runs_own_count(self):
        scenario = {"model": self.LLAMA3_405B, "parallel": {"global_batch": 2048}, "cluster": {"nodes": 1024}}
        narayanan = run.published_seconds({"tflops_per_gpu": 430, "flops_vocab": 128256}, scenario)
        core = run.published_seconds({"tflops_per_gpu": 430, "flops_vocab": 128256, "flop_count": "megatron-core"},
                                     scenario)
        expected = 2048 * 8192 * run.megatron_core_flops_per_token(self.LLAMA3_405B, 128256) / (8192 * 430e12)
        self.assertAlmostEqual(core, expected)
        self.assertNotAlmostEqual(core, narayanan, places=2)  # the 96 h^2 form counts a recompute and no GQA
        per_gpu = run.published_seconds({"tokens_per_s_per_gpu": 292}, scenario)
        self.assertAlmostEqual(per_gpu, 2048 * 8192 / (292 * 8192))

    def test_six_nd_count_is_the_llama3_papers_own(self):
        # The Llama 3 paper (arXiv:2407.21783, Section 1): 3.8e25 FLOPs for 405B parameters on 15.6T tokens, i.e.
        # 6 FLOPs per parameter and token; the released config.json's 405B model has 405.85e9 parameters.
        params = run.dense_parameters(self.LLAMA3_405B, 128256, tied_embeddings=False)
        self.assertAlmostEqual(params / 405.85e9, 1.0, delta=0.0005)
        self.assertAlmostEqual(6 * params * 15.6e12 / 3.8e25, 1.0, delta=0.01)
        scenario = {"model": self.LLAMA3_405B, "parallel": {"global_batch": 2048}, "cluster": {"nodes": 1024},
                    "framework": {"tied_embeddings": False}}
        seconds = run.published_seconds({"tflops_per_gpu": 430, "flops_vocab": 128256, "flop_count": "6nd"}, scenario)
        self.assertAlmostEqual(seconds, 2048 * 8192 * 6 * params / (8192 * 430e12))
        tied = dict(scenario, framework={})  # a tied embedding counts the vocabulary once
        self.assertLess(run.published_seconds({"tflops_per_gpu": 430, "flops_vocab": 128256, "flop_count": "6nd"},
                                              tied), seconds)


if __name__ == "__main__":
    unittest.main()

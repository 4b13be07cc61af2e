#!/usr/bin/env python3
"""Per-layer times of the 22B model against Korthikanti et al., MLSys'23 (arXiv:2205.05198), Table 4: the forward
and backward time of one transformer layer (h 6144, 64 heads, TP 8, micro-batch 4, sequence 2048, Megatron-LM 2022
on a DGX A100), for five ways of recomputing and sharding activations.

    bench/accuracy/layer_times.py                     # finds build*/cli/twin
    bench/accuracy/layer_times.py --twin build/cli/twin --markdown
    bench/accuracy/layer_times.py --max-error 4      # exit 1 beyond 4 % (the test Accuracy.Table4LayerTimes)

twin simulates scenarios/published/megatron-mlsys23-22b.toml at op granularity with a Chrome trace; a layer's
forward time is the start of layer L+1's first forward op minus the start of layer L's (its TP collectives
included), its backward time likewise in the backward pass, which runs layers in reverse (recompute included). L is
the middle layer. The error is twin / measured - 1 (negative: twin is too fast). Python 3.11+ and a built `twin`.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import ROOT, find_twin  # noqa: E402

SCENARIO = os.path.join(ROOT, "scenarios", "published", "megatron-mlsys23-22b.toml")
LAYERS = 48

# Table 4: (experiment, overrides, forward ms, backward ms), as published.
TABLE_4 = [
    ("baseline, no recompute", ["parallel.recompute=none"], 7.7, 11.9),
    ("sequence parallelism", ["parallel.recompute=none", "parallel.sequence_parallel=true"], 7.2, 11.8),
    ("full recompute", ["parallel.recompute=full"], 7.7, 19.5),
    ("selective recompute", ["parallel.recompute=selective"], 7.7, 13.2),
    ("selective + sequence", ["parallel.recompute=selective", "parallel.sequence_parallel=true"], 7.2, 13.1),
]

OP_NAME = re.compile(r"^(forward|recompute|backward) \S+ layer (\d+) micro-batch 0$")  # model::op_label


def layer_starts(trace_path):
    """First start time (us) of each layer's ops on rank 0, per pass: 'forward', and 'backward' (recompute too)."""
    with open(trace_path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    starts = {"forward": {}, "backward": {}}
    for event in events:
        if event.get("ph") != "X" or event.get("pid") != 0:
            continue
        match = OP_NAME.match(event["name"])
        if not match:
            continue
        phase = "forward" if match.group(1) == "forward" else "backward"
        layer = int(match.group(2))
        starts[phase][layer] = min(starts[phase].get(layer, float("inf")), event["ts"])
    return starts


def layer_times_ms(twin, overrides):
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        command = [twin, "sim", SCENARIO, "--granularity", "op", "--quiet", "--trace", trace]
        for item in overrides:
            command += ["--set", item]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"layer_times: {' '.join(command)} failed:\n{result.stderr}")
        starts = layer_starts(trace)
    middle = LAYERS // 2
    forward = (starts["forward"][middle + 1] - starts["forward"][middle]) / 1e3
    backward = (starts["backward"][middle - 1] - starts["backward"][middle]) / 1e3
    return forward, backward


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--twin", help="twin binary (default: the newest build*/cli/twin)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--max-error", type=float,
                        help="exit 1 when a forward or backward time is off by more than this many percent")
    args = parser.parse_args()
    twin = args.twin or find_twin()

    rows = []
    for name, overrides, measured_forward, measured_backward in TABLE_4:
        forward, backward = layer_times_ms(twin, overrides)
        rows.append((name, measured_forward, forward, measured_backward, backward))

    if args.markdown:
        print("| experiment | forward measured | forward twin | error | backward measured | backward twin | error |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, mf, f, mb, b in rows:
            print(f"| {name} | {mf:.1f} ms | {f:.2f} ms | {f / mf - 1:+.1%} | {mb:.1f} ms | {b:.2f} ms | "
                  f"{b / mb - 1:+.1%} |")
    else:
        print(f"{'experiment':24s} {'forward ms':>11s} {'twin':>7s} {'error':>7s} {'backward ms':>12s} {'twin':>7s} "
              f"{'error':>7s}")
        for name, mf, f, mb, b in rows:
            print(f"{name:24s} {mf:11.1f} {f:7.2f} {f / mf - 1:+7.1%} {mb:12.1f} {b:7.2f} {b / mb - 1:+7.1%}")

    if args.max_error is not None:
        worst = max(max(abs(f / mf - 1), abs(b / mb - 1)) for _, mf, f, mb, b in rows)
        if worst * 100 > args.max_error:
            print(f"layer_times: a layer time is off by {worst:.1%}, more than --max-error {args.max_error} %",
                  file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()

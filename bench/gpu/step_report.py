#!/usr/bin/env python3
"""One training step of the executor on a GPU, from `twin run --json RUN --trace TRACE` (exec/ driven by the Program,
as any `twin run --backend cuda` is): its time, tokens/s and model TFLOP/s (72-form model FLOPs, the summary's), the
MFU against the GPU's DATASHEET peak (989 TFLOP/s dense bf16 for an H100 or H200 SXM, 312 for an A100, as
topology/hardware.cpp cites them; given with twin run --peak-gflops or --peak-tflops here; never a measured cuBLASLt
rate), and, from the traced step (every op timed alone), the share of the step's compute and the TFLOP/s of each
kernel kind.

    step_report.py RUN.json TRACE.json [--min-mfu PERCENT] [--tokens-per-step N] [--peak-tflops X]

The step time is the median of the untraced steps after the first (which chooses GEMM algorithms and fills the memory
pool); the traced step synchronizes after every op, so it gives shares, not the step time. Exit status 1 when the MFU
is below --min-mfu.
"""
import argparse
import json
import re
import statistics
import sys

# "forward attention_core L3 mb0" -> "forward attention_core": the layer and micro-batch are not the kernel's kind
_INSTANCE = re.compile(r"\s+(L-?\d+|mb-?\d+|layer -?\d+|micro-batch -?\d+)\b")


def kernel_kind(label):
    return _INSTANCE.sub("", label).strip()


def step_time_s(run):
    times = run["iteration_time_s"]
    traced = run.get("summary", {}).get("traced_step", -1)
    first = run.get("first_step", 0)
    untraced = [t for i, t in enumerate(times) if first + i != traced]
    if len(untraced) > 1:
        untraced = untraced[1:]  # the first step picks algorithms and grows the memory pool
    if not untraced:
        raise SystemExit("step_report: no untraced step to time (run more steps)")
    return statistics.median(untraced)


def kinds(trace):
    """{kind: [seconds, flops]} over the compute ops of every rank of the trace"""
    table = {}
    for event in trace["traceEvents"]:
        if event.get("ph") != "X" or event.get("cat") != "compute":
            continue
        entry = table.setdefault(kernel_kind(event["name"]), [0.0, 0.0])
        entry[0] += event["dur"] / 1e6
        entry[1] += event["args"].get("flops", 0.0)
    return table


def report(run, trace, min_mfu, tokens_per_step=None, peak_tflops=None):
    summary = run["summary"]
    step_s = step_time_s(run)
    gpus = summary["scenario"]["gpus"]
    peak = peak_tflops * 1e12 if peak_tflops else summary.get("peak_flops_per_gpu", 0)
    if not peak > 0:
        raise SystemExit("step_report: no peak: give --peak-tflops, or run twin with --peak-gflops")
    model_flops = summary["model_flops_per_iteration"]
    tflops = model_flops / step_s / gpus / 1e12
    mfu = 100.0 * model_flops / step_s / gpus / peak
    tokens = f"{tokens_per_step / step_s:.0f} tokens/s, " if tokens_per_step else ""
    lines = [f"step {step_s:.4f} s (median of the untraced steps after the first), {tokens}"
             f"model {tflops:.1f} TFLOP/s per GPU, MFU {mfu:.1f} % of the datasheet {peak / 1e12:.0f} TFLOP/s"]
    table = kinds(trace)
    compute_s = sum(seconds for seconds, _ in table.values())
    lines.append(f"per kernel kind, traced step ({compute_s * 1e3:.1f} ms of compute, each op timed alone): "
                 "share, TFLOP/s")
    for kind, (seconds, flops) in sorted(table.items(), key=lambda item: -item[1][0]):
        rate = f"{flops / seconds / 1e12:8.1f}" if seconds > 0 and flops > 0 else "       -"
        lines.append(f"  {kind:<40} {100.0 * seconds / compute_s:5.1f} %  {rate} TFLOP/s")
    ok = min_mfu is None or mfu >= min_mfu
    if min_mfu is not None:
        lines.append(f"MFU {mfu:.1f} % {'>=' if ok else '<'} {min_mfu:.0f} % of the datasheet peak")
    return lines, ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    parser.add_argument("trace")
    parser.add_argument("--min-mfu", type=float, default=None, help="fail below this MFU, in percent")
    parser.add_argument("--tokens-per-step", type=int, default=None, help="global batch x sequence, for tokens/s")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the GPU's datasheet peak (default: the run's, from twin run --peak-gflops)")
    args = parser.parse_args()
    with open(args.run) as f:
        run = json.load(f)
    with open(args.trace) as f:
        trace = json.load(f)
    lines, ok = report(run, trace, args.min_mfu, args.tokens_per_step, args.peak_tflops)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

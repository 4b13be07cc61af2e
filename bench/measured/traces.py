#!/usr/bin/env python3
"""Real GPU profiler traces through twin's reader and `twin compare`: the share of kernel time classified, per trace.

PyTorch profiler (Kineto) traces of real training runs are kept in the tests of Holistic Trace Analysis
(github.com/facebookresearch/HolisticTraceAnalysis, tests/data, MIT License): recommendation models, CNNs and
Transformers on V100, A100 and H100 GPUs, with NCCL. This script reads them from a local clone (nothing of it is
copied into twin: one small trace is kept as test data, see tests/measured/data/README.md), runs
`twin compare PREDICTION TRACE --allow-mismatch --json` on each (the prediction is only the other side of the
comparison: these runs are not twin scenarios) and prints, per trace, the share of GPU kernel time twin classified
into its kernel classes, the classes, and the largest unclassified kernels. Traces stored as Git LFS pointers, CPU-only
traces and files that are not profiler traces are listed as skipped, with why.

    git clone https://github.com/facebookresearch/HolisticTraceAnalysis /tmp/hta
    bench/measured/traces.py --data /tmp/hta [--twin build/cli/twin] [--json out.json]

Exit status 1 when a trace's classified share is under --min-share (default 0.95). Needs a built `twin`.
"""
import argparse
import glob
import gzip
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find_twin(given):
    for candidate in ([given] if given else []) + [os.path.join(ROOT, "build", "cli", "twin")]:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    sys.exit("bench/measured/traces: no twin binary (build it, or pass --twin)")


def kind_of(path):
    """'gpu' for a profiler trace with GPU kernels; otherwise why it is skipped."""
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            head = f.read(200)
            if head.startswith("version https://git-lfs"):
                return "a Git LFS pointer (the trace is not in the clone)"
            text = head + f.read()
    except (OSError, EOFError) as error:
        return f"unreadable: {error}"
    if '"traceEvents"' not in text:
        return "not a Chrome trace"
    if '"cat": "kernel"' not in text and '"cat":"kernel"' not in text:
        return "no GPU kernels (a CPU-only trace)"
    if '"ProfilerStep#' not in text:
        return "gpu-without-steps"
    return "gpu"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a clone of HolisticTraceAnalysis (or any folder of traces)")
    parser.add_argument("--twin", help="the twin binary (default build/cli/twin)")
    parser.add_argument("--json", help="write the per-trace results here")
    parser.add_argument("--min-share", type=float, default=0.95)
    args = parser.parse_args()
    twin = find_twin(args.twin)
    traces = sorted(set(glob.glob(os.path.join(args.data, "**", "*.json"), recursive=True) +
                        glob.glob(os.path.join(args.data, "**", "*.json.gz"), recursive=True)))
    if not traces:
        sys.exit(f"bench/measured/traces: no *.json or *.json.gz under {args.data}")
    work = tempfile.mkdtemp(prefix="twin-traces-")
    prediction = os.path.join(work, "prediction.json")
    subprocess.run([twin, "sim", "gpt-350m-h200", "--quiet", "--json", prediction], check=True,
                   stdout=subprocess.DEVNULL)
    results, skipped = [], []
    for path in traces:
        name = os.path.relpath(path, args.data)
        kind = kind_of(path)
        if kind not in ("gpu", "gpu-without-steps"):
            skipped.append((name, kind))
            continue
        out = os.path.join(work, "compare.json")
        command = [twin, "compare", prediction, path, "--allow-mismatch", "--top", "5", "--json", out]
        if kind == "gpu-without-steps":
            command += ["--iterations", "1"]  # the whole trace as one iteration: the shares do not depend on it
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode != 0:
            skipped.append((name, "twin: " + run.stderr.strip().splitlines()[-1] if run.stderr else "failed"))
            continue
        with open(out) as f:
            comparison = json.load(f)
        kinds = {k["name"].replace(" (s)", ""): k["measured"] for k in comparison["kinds"] if k["measured"] > 0}
        results.append({"trace": name, "classified_share": comparison["classified_share"], "classes": kinds,
                        "unmatched": comparison["unmatched"]})
    print(f"{'classified':>10}  trace")
    for r in results:
        print(f"{100 * r['classified_share']:9.1f}%  {r['trace']}")
        unclassified = [u for u in r["unmatched"] if not u["name"].startswith("class ")]
        for u in unclassified[:3]:
            print(f"{'':13}{100 * u['share']:5.1f} % unclassified: {u['name'][:100]}")
    for name, why in skipped:
        print(f"{'skipped':>10}  {name}: {why}")
    if results:
        weighted = sum(r["classified_share"] for r in results) / len(results)
        print(f"\n{len(results)} GPU traces, mean classified share {100 * weighted:.1f} %, lowest "
              f"{100 * min(r['classified_share'] for r in results):.1f} %; {len(skipped)} files skipped")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"traces": results, "skipped": [{"file": n, "why": w} for n, w in skipped]}, f, indent=1)
    return 1 if any(r["classified_share"] < args.min_share for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

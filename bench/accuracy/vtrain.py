#!/usr/bin/env python3
"""Predicted against measured: every Megatron-DeepSpeed run the vTrain authors measured on A100 nodes.

vTrain (Bang et al., MICRO'24, arXiv:2312.12391) publishes the iteration times it validates against in its
repository: data/ground_truth_multi.csv (109 runs of GPT 3.6B to 175B on 64 to 512 GPUs) and
data/ground_truth_single.csv (1440 runs of small GPTs on 2 to 8 GPUs of one node). This script reads them from a
local clone (nothing of it is copied into twin), simulates each row with `twin sim` on
scenarios/published/vtrain-megatron-deepspeed.toml (which says what is known of the runs and what is assumed) and
prints the error of each, the MAPE of each file, and the error by hidden size, by micro-batch size and by TP
degree.

    git clone https://github.com/VIA-Research/vTrain /tmp/vTrain
    bench/accuracy/vtrain.py --data /tmp/vTrain              # both files; ~2 min on 2 cores
    bench/accuracy/vtrain.py --data /tmp/vTrain --only multi --rows
    bench/accuracy/vtrain.py --data /tmp/vTrain --set cluster.gemm_tflops=267.9 \
                             --set 'cluster.gemm_shape=[6912,16384,2048]'     # today's CUDA 12 GEMM rate

The error is predicted / measured - 1 on the iteration time (negative: twin is too fast). The rows are a check, not
part of the published MAPE of bench/accuracy/run.py: the GPUs' memory, the DeepSpeed release and the ZeRO stage are
not published (docs/accuracy.md). Needs Python 3.11+ and a built `twin`.
"""
import argparse
import concurrent.futures
import csv
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as published  # noqa: E402  (bench/accuracy/run.py: find_twin, simulate)

SCENARIO = "vtrain-megatron-deepspeed.toml"
FILES = {"multi": "ground_truth_multi.csv", "single": "ground_truth_single.csv"}
COLUMNS = ("# GPUs", "global batch", "micro batch", "hidden size", "attention heads", "# layers", "sequence length",
           "tensor parallelism", "data parallelism", "pipeline parallelism", "iteration time (ms)")


def find_file(data, name):
    for candidate in (os.path.join(data, name), os.path.join(data, "data", name)):
        if os.path.isfile(candidate):
            return candidate
    sys.exit(f"bench/accuracy/vtrain: no {name} under {data} (nor under {data}/data); pass the vTrain clone or its "
             f"data folder with --data")


def read_rows(path, kind):
    # The files start with a byte-order mark; utf-8-sig drops it.
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            sys.exit(f"bench/accuracy/vtrain: {path} lacks the column(s) {', '.join(missing)}")
        rows = []
        for line, record in enumerate(reader, start=2):
            try:
                row = {c: int(record[c]) for c in COLUMNS[:-1]}
                row["measured_s"] = float(record["iteration time (ms)"]) / 1000
            except (TypeError, ValueError):
                sys.exit(f"bench/accuracy/vtrain: {path}:{line}: a value is not a number: {record}")
            if row["tensor parallelism"] * row["data parallelism"] * row["pipeline parallelism"] != row["# GPUs"]:
                sys.exit(f"bench/accuracy/vtrain: {path}:{line}: TP x DP x PP is not the GPU count")
            row["file"] = kind
            row["line"] = line
            rows.append(row)
    return rows


def overrides(row):
    gpus = row["# GPUs"]
    sets = {"model.layers": row["# layers"], "model.hidden": row["hidden size"], "model.heads": row["attention heads"],
            "model.seq_len": row["sequence length"], "parallel.tp": row["tensor parallelism"],
            "parallel.pp": row["pipeline parallelism"], "parallel.dp": row["data parallelism"],
            "parallel.micro_batch": row["micro batch"], "parallel.global_batch": row["global batch"],
            "cluster.nodes": max(1, gpus // 8)}
    if gpus < 8:
        sets["cluster.gpus_per_node"] = gpus  # a part of one node, with the NVSwitch between its GPUs
    return [f"{key}={value}" for key, value in sets.items()]


def describe(row):
    return (f"{row['file']}:{row['line']} h{row['hidden size']} L{row['# layers']} s{row['sequence length']} "
            f"TP{row['tensor parallelism']} PP{row['pipeline parallelism']} DP{row['data parallelism']} "
            f"mb{row['micro batch']} B{row['global batch']}")


def summary(label, rows):
    errors = [r["error"] for r in rows]
    if not errors:
        return f"{label:28} no runs"
    mape = 100 * sum(abs(e) for e in errors) / len(errors)
    mean = 100 * sum(errors) / len(errors)
    within = sum(abs(e) <= 0.05 for e in errors)
    return f"{label:28} MAPE {mape:5.1f} %  mean {mean:+6.1f} %  within 5 %: {within:4d} of {len(errors)}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a clone of github.com/VIA-Research/vTrain, or its data/ folder")
    parser.add_argument("--twin", help="twin binary (default: the newest build*/cli/twin)")
    parser.add_argument("--only", choices=sorted(FILES), help="one of the two files")
    parser.add_argument("--rows", action="store_true", help="print every row, not only the summaries")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", help="write the rows with their predictions as JSON")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="one more scenario override for every row (a sensitivity study)")
    args = parser.parse_args()
    twin = args.twin or published.find_twin()

    rows = []
    for kind in ([args.only] if args.only else ["multi", "single"]):
        rows += read_rows(find_file(args.data, FILES[kind]), kind)
    runs = [{"scenario": SCENARIO, "set": overrides(r)} for r in rows]
    done = 0

    def simulate(run):
        nonlocal done
        result = published.simulate(twin, run, False, "auto", args.set)
        done += 1
        if sys.stderr.isatty():
            print(f"\r{done} of {len(runs)} rows simulated", end="", file=sys.stderr, flush=True)
        return result

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(simulate, runs))
    if sys.stderr.isatty():
        print(file=sys.stderr)

    failed = []
    for row, result in zip(rows, results):
        row.update(result)
        if "iteration_time_s" in result:
            row["error"] = result["iteration_time_s"] / row["measured_s"] - 1
        else:
            failed.append(row)
    ok = [r for r in rows if "error" in r]
    if args.rows:
        print(f"{'row':72} {'measured s':>10} {'twin s':>8} {'error':>7}")
        for r in rows:
            if "error" in r:
                print(f"{describe(r):72} {r['measured_s']:10.3f} {r['iteration_time_s']:8.3f} "
                      f"{100 * r['error']:+6.1f}%")
            else:
                print(f"{describe(r):72} {r['measured_s']:10.3f}   failed: {r['error']}")
        print()
    for kind in [k for k in ("multi", "single") if any(r["file"] == k for r in rows)]:
        members = [r for r in ok if r["file"] == kind]
        print(summary(f"{FILES[kind]}", members))
        for key, label in (("hidden size", "hidden"), ("micro batch", "micro-batch"), ("tensor parallelism", "TP")):
            for value in sorted({r[key] for r in members}):
                print("  " + summary(f"{label} {value}", [r for r in members if r[key] == value]))
    for r in failed:
        print(f"failed: {describe(r)}: {r['error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The loop on this machine: PyTorch trains a GPT on the CPU under its profiler; twin calibrates a CPU host profile on
one plan's trace, simulates other plans with it and compares each prediction with PyTorch's measured run of that plan.

bench/measured/torch_cpu_gpt.py trains twin's GPT (hidden 256, 4 heads, sequence 128, fp32, one thread) on every plan
(layers, batch), one step of each in turn, and writes each plan's profiler trace. `twin calibrate` fits the profile on the first plan's trace only;
every other plan is simulated (`twin sim --profile`, cluster.node = "cpu-host", framework.name = "composer": PyTorch's
own kernels, dropout off as in the script) and compared with its trace (`twin compare`): the out-of-sample error of
the iteration time, against the fastest profiled step (the one other work on a shared machine delayed least) and
against the mean step. Prints a table and exits 1 when an out-of-sample error (fastest step) exceeds --tolerance
(default 0.10).

    bench/measured/cpu_loop.py [--twin build/cli/twin] [--plans 2x8,1x8,3x8,2x4,1x16] [--json out.json]

Needs a built twin and Debian's python3-torch (run with any Python 3; the script runs the trainer with
/usr/bin/python3, where Debian installs torch). On a machine other work loads, wall-clock times vary by more than the
tolerance: run it alone.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINER = os.path.join(ROOT, "bench", "measured", "torch_cpu_gpt.py")
SHAPE = {"hidden": 256, "heads": 4, "seq": 128, "vocab": 256}

SCENARIO = """[model]
name = "torch-cpu-gpt"
layers = {layers}
hidden = {hidden}
heads = {heads}
seq_len = {seq}
vocab = {vocab}
dtype = "fp32"

[parallel]
tp = 1
pp = 1
micro_batch = {batch}
global_batch = {batch}

[cluster]
node = "cpu-host"

[framework]
name = "composer"
dropout = false
"""


def run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        sys.exit(f"bench/measured/cpu_loop: {' '.join(command)} failed:\n{result.stdout}{result.stderr}")
    return result.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--twin", default=os.path.join(ROOT, "build", "cli", "twin"))
    parser.add_argument("--python", default="/usr/bin/python3", help="the Python that has torch")
    parser.add_argument("--plans", default="2x8,1x8,3x8,2x4,1x16", help="LAYERSxBATCH, the first one calibrates")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--active", type=int, default=4)
    parser.add_argument("--tolerance", type=float, default=0.10)
    parser.add_argument("--json")
    parser.add_argument("--work", help="keep the traces, profile and scenarios here (default: a temporary folder)")
    args = parser.parse_args()
    plans = [tuple(int(x) for x in p.split("x")) for p in args.plans.split(",")]
    work = args.work or tempfile.mkdtemp(prefix="twin-cpu-loop-")
    os.makedirs(work, exist_ok=True)

    out = run([args.python, TRAINER, "--plans", args.plans, "--hidden", str(SHAPE["hidden"]), "--heads",
               str(SHAPE["heads"]), "--seq", str(SHAPE["seq"]), "--vocab", str(SHAPE["vocab"]), "--steps",
               str(args.steps), "--active", str(args.active), "--trace-dir", work])
    measured = [json.loads(line) for line in out.strip().splitlines() if line.startswith("{")]
    profile = os.path.join(work, "host.toml")
    checks = sum((["--check", m["trace"]] for m in measured[1:]), [])
    calibration = run([args.twin, "calibrate", measured[0]["trace"], *checks, "--out", profile])

    rows = []
    for (layers, batch), m in zip(plans, measured):
        scenario = os.path.join(work, f"scenario_{layers}x{batch}.toml")
        with open(scenario, "w") as f:
            f.write(SCENARIO.format(layers=layers, batch=batch, **SHAPE))
        predicted = os.path.join(work, f"predicted_{layers}x{batch}.json")
        run([args.twin, "sim", scenario, "--profile", profile, "--granularity", "op", "--quiet", "--json", predicted])
        totals = {}
        for statistic, flags in (("fastest", ["--fastest-step"]), ("mean", [])):
            comparison = os.path.join(work, f"compare_{layers}x{batch}_{statistic}.json")
            run([args.twin, "compare", predicted, m["trace"], *flags, "--json", comparison])
            with open(comparison) as f:
                totals[statistic] = json.load(f)["totals"][0]
        rows.append({"layers": layers, "batch": batch, "calibrated_on": (layers, batch) == plans[0],
                     "predicted_s": totals["fastest"]["predicted"], "measured_s": totals["fastest"]["measured"],
                     "error": totals["fastest"]["error"], "mean_step_s": totals["mean"]["measured"],
                     "mean_error": totals["mean"]["error"]})

    print(calibration)
    print(f"{'plan':>10} {'predicted s':>12} {'fastest step':>13} {'error':>8} {'mean step':>10} {'error':>8}")
    for r in rows:
        note = "  (calibrated on: in-sample)" if r["calibrated_on"] else ""
        print(f"{r['layers']:>4}x{r['batch']:<5} {r['predicted_s']:12.4f} {r['measured_s']:13.4f} "
              f"{100 * r['error']:+7.1f}% {r['mean_step_s']:10.4f} {100 * r['mean_error']:+7.1f}%{note}")
    out_of_sample = [r for r in rows if not r["calibrated_on"]]
    worst = max(abs(r["error"]) for r in out_of_sample) if out_of_sample else 0
    print(f"\nout of sample: {len(out_of_sample)} plans, largest error {100 * worst:.1f} % "
          f"(tolerance {100 * args.tolerance:.0f} %)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"plans": rows, "profile": profile}, f, indent=1)
    return 1 if worst > args.tolerance else 0


if __name__ == "__main__":
    sys.exit(main())

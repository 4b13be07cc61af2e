#!/usr/bin/env python3
"""The loop on this machine: PyTorch trains a GPT on the CPU under its profiler; twin calibrates a CPU host profile on
one plan's trace, simulates other plans with it and compares each prediction with PyTorch's measured run of that plan.

bench/measured/torch_cpu_gpt.py trains twin's GPT (hidden 256, 4 heads, sequence 128, fp32, one thread) on every plan
(layers, batch), one step of each in turn, and writes each plan's profiler trace. `twin calibrate` fits the profile on the first plan's trace only;
every other plan is simulated (`twin sim --profile`, cluster.node = "cpu-host", framework.name = "composer": PyTorch's
own kernels, dropout off as in the script) and compared with its trace (`twin compare`): the out-of-sample error of
the iteration time, against the fastest profiled step (the one other work on a shared machine delayed least) and
against the mean step. Then the same loop with twin's own CPU executor: `twin run` of every plan, a profile calibrated
on the first plan's `twin run --trace`, `twin sim` of every plan against the fastest step `twin run` measured. Prints
the tables and exits 1 when an out-of-sample error (fastest step) exceeds --tolerance (default 0.10).

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
    parser.add_argument("--no-executor", action="store_true", help="skip the loop with twin's own executor")
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
    print(f"\nPyTorch, out of sample: {len(out_of_sample)} plans, largest error {100 * worst:.1f} % "
          f"(tolerance {100 * args.tolerance:.0f} %)")
    executor = [] if args.no_executor else twin_executor_loop(args, plans, work)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"plans": rows, "profile": profile, "executor": executor}, f, indent=1)
    worst_executor = max((abs(r["error"]) for r in executor if not r["calibrated_on"]), default=0)
    return 1 if max(worst, worst_executor) > args.tolerance else 0


def twin_executor_loop(args, plans, work):
    """The same with twin's own CPU executor: `twin run` of every plan (in turn, three times, so that load on the
    machine falls on all), `twin calibrate` on the first plan's three traced steps (twin run --trace), `twin sim` of
    every plan with that profile against the fastest step `twin run` measured."""
    environment = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    steps = {plan: [] for plan in plans}
    traces = []
    for repeat in range(3):
        for layers, batch in plans:
            scenario = os.path.join(work, f"scenario_{layers}x{batch}.toml")
            result = os.path.join(work, f"run_{layers}x{batch}_{repeat}.json")
            command = [args.twin, "run", scenario, "--threads", "1", "--steps", str(args.steps), "--quiet", "--json",
                       result]
            if (layers, batch) == plans[0]:  # one traced step (the last) per run of the calibration plan
                traces.append(os.path.join(work, f"twin_run_trace_{repeat}.json"))
                command += ["--trace", traces[-1]]
            run(command, env=environment)
            with open(result) as f:
                steps[(layers, batch)] += json.load(f)["iteration_time_s"][1:]  # the first step warms up
    profile = os.path.join(work, "twin_host.toml")
    print(run([args.twin, "calibrate", *traces, "--out", profile]))
    rows = []
    print(f"{'plan':>10} {'predicted s':>12} {'fastest step':>13} {'error':>8}   (twin run, {3 * (args.steps - 1)} "
          f"steps per plan)")
    for layers, batch in plans:
        predicted = os.path.join(work, f"predicted_run_{layers}x{batch}.json")
        run([args.twin, "sim", os.path.join(work, f"scenario_{layers}x{batch}.toml"), "--profile", profile,
             "--granularity", "op", "--quiet", "--json", predicted])
        with open(predicted) as f:
            predicted_s = json.load(f)["iteration_time_s"]
        fastest = min(steps[(layers, batch)])
        row = {"layers": layers, "batch": batch, "calibrated_on": (layers, batch) == plans[0],
               "predicted_s": predicted_s, "measured_s": fastest, "error": predicted_s / fastest - 1,
               "steps_s": steps[(layers, batch)]}
        rows.append(row)
        note = "  (calibrated on: in-sample)" if row["calibrated_on"] else ""
        print(f"{layers:>4}x{batch:<5} {predicted_s:12.4f} {fastest:13.4f} {100 * row['error']:+7.1f}%{note}")
    return rows


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The loop on this machine: PyTorch trains a GPT on the CPU under its profiler; twin calibrates a CPU host profile on
one plan's traces, simulates other plans with it and compares each prediction with PyTorch's measured run of that plan.

bench/measured/torch_cpu_gpt.py trains twin's GPT (hidden 256, 4 heads, sequence 128, fp32, one thread) on every plan
(layers, batch), one step of each in turn, and writes each plan's profiler trace; it does so --repeats times (each a
fresh process, every thread pool pinned to one thread: OMP, OpenBLAS, MKL), so that a burst of other work on a shared
machine falls on one repeat, not on one plan. `twin calibrate` fits the profile on the first plan's traces of every
repeat together, in the units of that plan's Program (`--scenario`: each GEMM shape at the median of its calls, each
memory-bound class per byte the Program streams for it, the time no Program op stands for per kernel it launches);
every other plan is simulated (`twin sim --profile`, cluster.node = "cpu-host", framework.name = "composer": PyTorch's
own kernels, dropout off as in the script) and compared with its traces (`twin compare --fastest-step`): the
out-of-sample error against each plan's fastest step over all repeats (the one other work delayed least), with the
spread of that plan's fastest step from repeat to repeat, and the spread of its prediction when the profile is
calibrated on one repeat alone (how much the calibration's own noise moves it). Then the same loop with twin's own
CPU executor: `twin run` of every plan (in turn, --repeats times), a profile calibrated on the first plan's traced
steps (twin run --trace), `twin sim` of every plan against the fastest step `twin run` measured. Prints the tables and
exits 1 when an out-of-sample error exceeds --tolerance (default 0.10).

Where the script may (root, or CAP_SYS_NICE), every trainer and `twin run` process runs under the real-time FIFO
scheduler on one core (`chrt -f 50 taskset -c N`, --realtime auto): other work on a shared machine then waits for it
instead of taking its core in time slices, so a step's wall-clock time is again one core's work, as on a machine to
itself (the kernel still lends other work 5 % of each second: /proc/sys/kernel/sched_rt_runtime_us). Memory and cache
traffic from the other cores still reaches it. `--realtime off` measures as any process.

    bench/measured/cpu_loop.py [--twin build/cli/twin] [--plans 2x8,1x8,3x8,2x4,1x16] [--repeats 3] [--json out.json]

Needs a built twin and Debian's python3-torch (run with any Python 3; the script runs the trainer with
/usr/bin/python3, where Debian installs torch). On a machine other work loads, wall-clock times vary by more than the
tolerance: the spreads printed say by how much.
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


def realtime_prefix(mode):
    """The command prefix that runs a measured process under SCHED_FIFO on the last core, or [] where not allowed."""
    if mode == "off":
        return []
    core = str(max(os.sched_getaffinity(0)))
    prefix = ["chrt", "-f", "50", "taskset", "-c", core]
    allowed = subprocess.run(prefix + ["true"], capture_output=True).returncode == 0
    if not allowed:
        if mode == "on":
            sys.exit("bench/measured/cpu_loop: --realtime on, but chrt -f is not allowed here (needs CAP_SYS_NICE)")
        print("bench/measured/cpu_loop: measuring without the real-time scheduler (chrt -f not allowed here)")
        return []
    print(f"bench/measured/cpu_loop: measured processes run under SCHED_FIFO on core {core}")
    return prefix


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
    parser.add_argument("--repeats", type=int, default=3, help="trainer runs (fresh processes), and twin runs per plan")
    parser.add_argument("--tolerance", type=float, default=0.10)
    parser.add_argument("--json")
    parser.add_argument("--no-executor", action="store_true", help="skip the loop with twin's own executor")
    parser.add_argument("--realtime", choices=("auto", "on", "off"), default="auto",
                        help="run the measured processes under SCHED_FIFO on one core (auto: where allowed)")
    parser.add_argument("--work", help="keep the traces, profile and scenarios here (default: a temporary folder)")
    args = parser.parse_args()
    args.prefix = realtime_prefix(args.realtime)
    plans = [tuple(int(x) for x in p.split("x")) for p in args.plans.split(",")]
    work = args.work or tempfile.mkdtemp(prefix="twin-cpu-loop-")
    os.makedirs(work, exist_ok=True)

    # Every thread pool of the trainer and of twin run at one thread: a step's time is one core's work.
    environment = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    measured = []  # per repeat, per plan: the trainer's line
    for repeat in range(args.repeats):
        out = run([*args.prefix, args.python, TRAINER, "--plans", args.plans, "--hidden", str(SHAPE["hidden"]),
                   "--heads", str(SHAPE["heads"]), "--seq", str(SHAPE["seq"]), "--vocab", str(SHAPE["vocab"]),
                   "--steps", str(args.steps), "--active", str(args.active), "--trace-dir",
                   os.path.join(work, f"repeat_{repeat}")], env=environment)
        measured.append([json.loads(line) for line in out.strip().splitlines() if line.startswith("{")])
    for layers, batch in plans:
        with open(os.path.join(work, f"scenario_{layers}x{batch}.toml"), "w") as f:
            f.write(SCENARIO.format(layers=layers, batch=batch, **SHAPE))
    # The profile is fitted in the units of the first plan's Program (--scenario): each memory-bound class per byte the
    # Program streams, the time no Program op stands for per kernel it launches.
    args.calibration_scenario = os.path.join(work, f"scenario_{plans[0][0]}x{plans[0][1]}.toml")
    calibration_traces = [m[0]["trace"] for m in measured]
    profile = os.path.join(work, "host.toml")
    checks = sum((["--check", m[i]["trace"]] for m in measured for i in range(1, len(plans))), [])
    calibration = run([args.twin, "calibrate", *calibration_traces, *checks, "--scenario", args.calibration_scenario,
                       "--out", profile])
    # The calibration's own noise: a profile from each repeat's trace alone.
    single_profiles = []
    for repeat, trace in enumerate(calibration_traces):
        single_profiles.append(os.path.join(work, f"host_repeat_{repeat}.toml"))
        run([args.twin, "calibrate", trace, "--scenario", args.calibration_scenario, "--out", single_profiles[-1]])

    rows = []
    for index, (layers, batch) in enumerate(plans):
        scenario = os.path.join(work, f"scenario_{layers}x{batch}.toml")
        predicted = simulate(args, scenario, profile, os.path.join(work, f"predicted_{layers}x{batch}.json"))
        fastest, mean = [], []
        for repeat in range(args.repeats):
            for statistic, flags, into in (("fastest", ["--fastest-step"], fastest), ("mean", [], mean)):
                comparison = os.path.join(work, f"compare_{layers}x{batch}_{repeat}_{statistic}.json")
                run([args.twin, "compare", predicted["path"], measured[repeat][index]["trace"], *flags, "--json",
                     comparison])
                with open(comparison) as f:
                    into.append(json.load(f)["totals"][0]["measured"])
        singles = [simulate(args, scenario, p, os.path.join(work, f"predicted_{layers}x{batch}_{r}.json"))["s"]
                   for r, p in enumerate(single_profiles)]
        best = min(fastest)
        rows.append({"layers": layers, "batch": batch, "calibrated_on": index == 0, "predicted_s": predicted["s"],
                     "measured_s": best, "error": predicted["s"] / best - 1, "fastest_by_repeat_s": fastest,
                     "spread": max(fastest) / best - 1, "mean_step_s": min(mean),
                     "mean_error": predicted["s"] / min(mean) - 1, "predicted_by_repeat_s": singles,
                     "prediction_spread": max(singles) / min(singles) - 1})

    print(calibration)
    print(f"{'plan':>10} {'predicted s':>12} {'fastest step':>13} {'error':>8} {'spread':>7} {'mean step':>10} "
          f"{'error':>8} {'prediction spread':>18}   ({args.repeats} repeats of {args.active} profiled steps)")
    for r in rows:
        note = "  (calibrated on: in-sample)" if r["calibrated_on"] else ""
        print(f"{r['layers']:>4}x{r['batch']:<5} {r['predicted_s']:12.4f} {r['measured_s']:13.4f} "
              f"{100 * r['error']:+7.1f}% {100 * r['spread']:6.1f}% {r['mean_step_s']:10.4f} "
              f"{100 * r['mean_error']:+7.1f}% {100 * r['prediction_spread']:17.1f}%{note}")
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


def simulate(args, scenario, profile, path):
    run([args.twin, "sim", scenario, "--profile", profile, "--granularity", "op", "--quiet", "--json", path])
    with open(path) as f:
        return {"path": path, "s": json.load(f)["iteration_time_s"]}


def twin_executor_loop(args, plans, work):
    """The same with twin's own CPU executor: `twin run` of every plan (in turn, --repeats times, so that load on the
    machine falls on all), `twin calibrate` on the first plan's traced steps (twin run --trace, --active of them per
    repeat, the fastest third of them), `twin sim` of every plan with that profile against the fastest step `twin run`
    measured."""
    environment = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    steps = {plan: [] for plan in plans}  # per repeat, the steps after the first (which warms up)
    traces = []
    for repeat in range(args.repeats):
        for layers, batch in plans:
            scenario = os.path.join(work, f"scenario_{layers}x{batch}.toml")
            # twin run times one step op by op; the calibration plan runs once per step the profiler records in
            # PyTorch's loop (--active, the last ones), so that both profiles rest on as many steps.
            traced_steps = range(args.steps - args.active + 1, args.steps + 1) if (layers, batch) == plans[0] else [0]
            for traced in traced_steps:
                result = os.path.join(work, f"run_{layers}x{batch}_{repeat}_{traced}.json")
                command = [*args.prefix, args.twin, "run", scenario, "--threads", "1", "--steps", str(args.steps),
                           "--quiet", "--json", result]
                if traced:
                    trace = os.path.join(work, f"twin_run_trace_{repeat}_{traced}.json")
                    command += ["--trace", trace, "--trace-step", str(traced)]
                run(command, env=environment)
                with open(result) as f:
                    times_s = json.load(f)["iteration_time_s"]
                steps[(layers, batch)].append(times_s[1:])
                if traced:
                    traces.append((times_s[traced - 1], trace))
    # Other work only ever delays a step: calibrate on the traced steps it delayed least (the fastest third), as the
    # prediction is set against each plan's fastest step.
    traces = [trace for _, trace in sorted(traces)[:max(1, len(traces) // 3)]]
    profile = os.path.join(work, "twin_host.toml")
    print(run([args.twin, "calibrate", *traces, "--scenario", args.calibration_scenario, "--out", profile]))
    rows = []
    print(f"{'plan':>10} {'predicted s':>12} {'fastest step':>13} {'error':>8} {'spread':>7}   (twin run, "
          f"{args.repeats} runs x {args.steps - 1} steps per plan, {args.active} runs of the first)")
    for layers, batch in plans:
        predicted_s = simulate(args, os.path.join(work, f"scenario_{layers}x{batch}.toml"), profile,
                               os.path.join(work, f"predicted_run_{layers}x{batch}.json"))["s"]
        by_repeat = [min(s) for s in steps[(layers, batch)]]
        fastest = min(by_repeat)
        row = {"layers": layers, "batch": batch, "calibrated_on": (layers, batch) == plans[0],
               "predicted_s": predicted_s, "measured_s": fastest, "error": predicted_s / fastest - 1,
               "fastest_by_repeat_s": by_repeat, "spread": max(by_repeat) / fastest - 1,
               "steps_s": steps[(layers, batch)]}
        rows.append(row)
        note = "  (calibrated on: in-sample)" if row["calibrated_on"] else ""
        print(f"{layers:>4}x{batch:<5} {predicted_s:12.4f} {fastest:13.4f} {100 * row['error']:+7.1f}% "
              f"{100 * row['spread']:6.1f}%{note}")
    return rows


if __name__ == "__main__":
    sys.exit(main())

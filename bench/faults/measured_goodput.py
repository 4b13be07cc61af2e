#!/usr/bin/env python3
"""The measured goodput of a faulty `twin run` set beside what `twin goodput`'s model predicts for it.

One run of N steps with a checkpoint every K steps is run twice: once undisturbed, once with rank R failing at the
start of step S (`--inject-failure S:R`) and `--restarts 1`, which starts it again from the newest checkpoint. The
goodput model (docs/goodput.md, model/program/goodput.hpp) charges one interruption with the work since the last
checkpoint that reached storage and the restart, R = restart + checkpoint load:

    predicted wall = undisturbed wall + lost steps x step time + restart
    lost steps     = (S - 1) mod K   (the failure strikes at the start of step S; steps 1..S-1 were done)

Measured here: each step line's arrival on the run's stderr (one per step for N <= 39), so the lost steps' time
(the failed attempt's steps after the last checkpoint) and the restart (from the line that announces it to the start
of the first step trained again: that step's line less its iteration time from --json) come from the same clock.
The restart is measured, not modelled (`cluster.restart_s` is a cluster's re-queue and start-up, minutes, not a
thread's relaunch): the model's claim checked is the accounting, that the run loses exactly the steps since the last
checkpoint and the restart, no step repeated or lost (the losses are compared with the undisturbed run's, bit for bit).

    python3 bench/faults/measured_goodput.py --twin build/cli/twin [--launcher threads|mpi] [--steps 20 --every 5
        --fail-step 13 --rank 1] [--set parallel.pp=2 ...]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


def run(twin, args, env=None):
    """Runs `twin run ...`; returns (wall seconds, [(arrival seconds since start, line)], exit status)."""
    start = time.monotonic()
    process = subprocess.Popen([twin, "run", *args], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                               env=env)
    lines = []
    for line in process.stderr:
        lines.append((time.monotonic() - start, line.rstrip("\n")))
    status = process.wait()
    return time.monotonic() - start, lines, status


def trial(options):
    """One undisturbed and one faulty run; what each measured."""
    with tempfile.TemporaryDirectory() as scratch:
        common = [options.scenario, "--launcher", options.launcher, "--steps", str(options.steps),
                  "--checkpoint-every", str(options.every), "--threads", "1"]
        for key in options.set:
            common += ["--set", key]
        clean_wall, _, status = run(options.twin, common + ["--checkpoint", f"{scratch}/clean", "--json",
                                                            f"{scratch}/clean.json"])
        if status != 0:
            sys.exit(f"the undisturbed run failed (status {status})")
        faulty_wall, lines, status = run(options.twin, common + [
            "--checkpoint", f"{scratch}/faulty", "--json", f"{scratch}/faulty.json", "--inject-failure",
            f"{options.fail_step}:{options.rank}", "--restarts", "1"])
        if status != 0:
            sys.exit(f"the faulty run failed (status {status}):\n" + "\n".join(line for _, line in lines))
        clean = json.load(open(f"{scratch}/clean.json"))
        faulty = json.load(open(f"{scratch}/faulty.json"))
    step_s = sum(clean["iteration_time_s"]) / len(clean["iteration_time_s"])
    resumed_at = faulty["first_step"]  # the checkpoint the restart resumed from
    restart_at = next(t for t, line in lines if "restart 1 of 1" in line)
    step_lines = [(t, int(m.group(1))) for t, line in lines if (m := re.match(r"step (\d+)/", line))]
    # lost work: from the start of the first step after the checkpoint (its line less a mean step) to the failure
    first_lost = [t for t, step in step_lines if t < restart_at and step == resumed_at + 1]
    lost_s = restart_at - (first_lost[0] - step_s) if first_lost else 0.0
    # restart: from the failure to the start of the first step trained again (its line less its --json time)
    first_again = next(t for t, step in step_lines if t > restart_at)
    restart_s = first_again - faulty["iteration_time_s"][0] - restart_at
    return {"step_s": step_s, "clean_wall": clean_wall, "faulty_wall": faulty_wall, "lost_s": lost_s,
            "restart_s": restart_s, "useful_s": sum(clean["iteration_time_s"]), "resumed_at": resumed_at,
            "lost_steps": options.fail_step - 1 - resumed_at,
            "same_losses": faulty.get("earlier_losses", []) + faulty["losses"] == clean["losses"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--twin", required=True)
    parser.add_argument("--scenario", default="gpt-tiny")
    parser.add_argument("--launcher", default="threads", choices=["threads", "mpi"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=5, help="--checkpoint-every")
    parser.add_argument("--fail-step", type=int, default=13)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--set", action="append", default=["parallel.pp=2"])
    parser.add_argument("--repeat", type=int, default=3, help="pairs of runs; the medians are printed")
    options = parser.parse_args()
    if options.steps > 39:
        sys.exit("--steps at most 39: twin run prints a step line per step only up to there")

    trials = [trial(options) for _ in range(options.repeat)]
    median = lambda key: statistics.median(t[key] for t in trials)
    step_s, clean_wall, faulty_wall = median("step_s"), median("clean_wall"), median("faulty_wall")
    lost_s, restart_s, useful_s = median("lost_s"), median("restart_s"), median("useful_s")
    lost_predicted = (options.fail_step - 1) % options.every
    lost_measured = {t["lost_steps"] for t in trials}
    predicted_wall = clean_wall + lost_predicted * step_s + restart_s
    same = all(t["same_losses"] for t in trials)

    print(f"twin run {options.scenario} ({', '.join(options.set)}), {options.launcher}, {options.steps} steps, "
          f"a checkpoint every {options.every}, rank {options.rank} failing at the start of step {options.fail_step}; "
          f"medians of {options.repeat} pairs of runs")
    print(f"  step time (undisturbed mean)  {step_s:.3f} s")
    print(f"  lost steps  predicted {lost_predicted}, measured {sorted(lost_measured)}")
    print(f"  lost work   predicted {lost_predicted * step_s:.3f} s, measured {lost_s:.3f} s")
    print(f"  restart     measured {restart_s:.3f} s (relaunch, checkpoint load, until the first step again)")
    print(f"  wall        undisturbed {clean_wall:.3f} s; faulty: predicted {predicted_wall:.3f} s, "
          f"measured {faulty_wall:.3f} s ({100 * (faulty_wall / predicted_wall - 1):+.1f} %)")
    print(f"  goodput     undisturbed {useful_s / clean_wall:.3f}; faulty: predicted {useful_s / predicted_wall:.3f}, "
          f"measured {useful_s / faulty_wall:.3f}")
    print(f"  every step trained once, the undisturbed run's losses bit for bit: {'yes' if same else 'NO'}")
    return 0 if same and lost_measured == {lost_predicted} else 1


if __name__ == "__main__":
    sys.exit(main())

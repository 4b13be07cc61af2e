#!/usr/bin/env python3
"""The simulator's scaling table: wall time and peak memory of `twin sim` from 35 to 12,288 nodes at every fidelity.

Two plans, data parallelism scaled with the nodes, each case one `twin sim` under /usr/bin/time -v:
  MT-NLG 530B (scenarios/mtnlg-530b.toml: TP 8, PP 35, global batch 1920) on 35 to 560 DGX A100 nodes;
  Llama 3 405B (scenarios/llama3-405b-98k.toml: TP 8, PP 16, 16 micro-batches per replica) on 128 to 12,288 DGX
  H100 nodes (1,024 to 98,304 GPUs).
A case that runs past the budget is stopped and marked so, and the larger sizes of its plan at that fidelity are
skipped and marked.
Writes a Markdown table (stdout, or --out FILE).

  bench/sim/scaling.py [--twin build/cli/twin] [--budget 120] [--fidelities rank,group,replica] [--out table.md]
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# (label, scenario, nodes, global batch): the batch keeps each plan's micro-batches per replica where they were.
CASES = [("mt-nlg-530b", "mtnlg-530b.toml", nodes, 1920) for nodes in (35, 140, 280, 560)] + [
    ("llama3-405b", "llama3-405b-98k.toml", nodes, nodes) for nodes in (128, 1024, 2048, 4096, 12288)]


def run_case(twin, scenario, nodes, batch, fidelity, budget_s):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "summary.json")
        command = ["/usr/bin/time", "-v", twin, "sim", os.path.join(ROOT, "scenarios", scenario), "--quiet",
                   "--fidelity", fidelity, "--set", f"cluster.nodes={nodes}", "--set",
                   f"parallel.global_batch={batch}", "--json", out]
        # A session of its own, so that a case past the budget is stopped with its simulation child.
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=budget_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return {"status": f"stopped after {budget_s:g} s"}
        done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
        if done.returncode != 0:
            return {"status": "failed: " + done.stderr.strip().splitlines()[-1][:80]}
        wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", done.stderr)
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
        hours, minutes, seconds = (float(g) if g else 0.0 for g in wall.groups())
        with open(out) as f:
            summary = json.load(f)
        return {"status": "ok", "wall_s": 3600 * hours + 60 * minutes + seconds, "rss_mb": int(rss.group(1)) / 1024,
                "iteration_s": summary["iteration_time_s"], "fidelity": summary.get("fidelity", fidelity)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--twin", default=os.path.join(ROOT, "build", "cli", "twin"))
    parser.add_argument("--budget", type=float, default=120, help="seconds a case may take (default 120)")
    parser.add_argument("--fidelities", default="rank,group,replica")
    parser.add_argument("--only", default="", help="regular expression on 'label nodes' (e.g. 'llama3-405b 12288')")
    parser.add_argument("--out", help="write the Markdown table here as well")
    args = parser.parse_args()
    fidelities = args.fidelities.split(",")
    lines = ["| plan | nodes | GPUs | fidelity | iteration s | wall s | peak RSS MB | vs group |",
             "|---|---:|---:|---|---:|---:|---:|---:|"]
    print("\n".join(lines), flush=True)
    slowest = {}  # (label, fidelity) -> (nodes, wall) of the last case run
    group_time = {}
    for label, scenario, nodes, batch in CASES:
        if not re.search(args.only, f"{label} {nodes}"):
            continue
        for fidelity in fidelities:
            last = slowest.get((label, fidelity))
            if last and last[1] < 0:
                row = (f"| {label} | {nodes} | {8 * nodes} | {fidelity} | | skipped (past {args.budget:g} s at "
                       f"{last[0]} nodes) | | |")
            else:
                result = run_case(args.twin, scenario, nodes, batch, fidelity, args.budget)
                if result["status"] != "ok":
                    slowest[(label, fidelity)] = (nodes, -1)
                    row = f"| {label} | {nodes} | {8 * nodes} | {fidelity} | | {result['status']} | | |"
                else:
                    slowest[(label, fidelity)] = (nodes, result["wall_s"])
                    if fidelity == "group":
                        group_time[(label, nodes)] = result["iteration_s"]
                    reference = group_time.get((label, nodes))
                    versus = (f"{100 * (result['iteration_s'] / reference - 1):+.4f} %"
                              if reference and fidelity != "group" else "")
                    row = (f"| {label} | {nodes} | {8 * nodes} | {result['fidelity']} | {result['iteration_s']:.3f} "
                           f"| {result['wall_s']:.1f} | {result['rss_mb']:.0f} | {versus} |")
            lines.append(row)
            print(row, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Issue 40's done-when check: twin.simulate("mtnlg-530b")["iteration_time_s"] is what `twin sim mtnlg-530b --json`
writes, to the last bit; and so is the rest of the summary but the simulator's own wall-clock statistics.

    simulate_matches_cli.py [TWIN]     (default: $TWIN_BINARY, else `twin` on the PATH)
"""
import json
import os
import subprocess
import sys
import tempfile

import twin

# The simulating process's own measurements: they differ from run to run.
WALL_CLOCK = {"wall_s", "peak_rss_bytes", "activities_per_s"}


def without_wall_clock(value):
    if isinstance(value, dict):
        return {k: without_wall_clock(v) for k, v in value.items() if k not in WALL_CLOCK}
    if isinstance(value, list):
        return [without_wall_clock(v) for v in value]
    return value


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TWIN_BINARY", "twin")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "sim.json")
        subprocess.run([binary, "sim", "mtnlg-530b", "--quiet", "--json", path], check=True,
                       stdout=subprocess.DEVNULL)
        with open(path, encoding="utf-8") as f:
            cli = json.load(f)
    python = twin.simulate("mtnlg-530b")
    print(f"twin.simulate: {python['iteration_time_s']!r} s; twin sim --json: {cli['iteration_time_s']!r} s")
    if python["iteration_time_s"] != cli["iteration_time_s"]:
        print("FAIL: the iteration times differ")
        return 1
    if without_wall_clock(python) != without_wall_clock(cli):
        different = sorted(k for k in cli if without_wall_clock(cli.get(k)) != without_wall_clock(python.get(k)))
        print(f"FAIL: the summaries differ in {different}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

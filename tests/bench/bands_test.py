#!/usr/bin/env python3
"""bench/accuracy/bands.json is what `run.py --write-bands` wrote, not a file typed by hand: every published run counted
in the MAPE sits in exactly one band, the band of its own scenario (GPU generation, dense or MoE, precision, as run.py's
band_key reads it), each band's range is the minimum and maximum of its runs' errors, and the text is the writer's
own formatting. (The errors themselves come from simulations: `run.py --write-bands` rewrites them; this test does
not re-simulate, which takes minutes.)"""
import json
import os
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "accuracy"))
import run  # noqa: E402  (bench/accuracy/run.py)


def main():
    with open(run.BANDS) as f:
        text = f.read()
    bands = json.loads(text)
    problems = []
    if text != json.dumps(bands, indent=1) + "\n":
        problems.append("bands.json is not in run.py's formatting (edited by hand?)")
    with open(os.path.join(run.PUBLISHED, "published.toml"), "rb") as f:
        published = {r["name"]: r for r in tomllib.load(f)["run"]}
    expected = {name for name, r in published.items()
                if r.get("mape", True) and (bands["slow_runs"] or not r.get("slow", False))}
    seen = set()
    keys = []
    for band in bands["bands"]:
        key = (band["generation"], band["kind"], band["precision"])
        keys.append(key)
        errors = [r["error"] for r in band["runs"]]
        if not errors or band["error_low"] != min(errors) or band["error_high"] != max(errors):
            problems.append(f"{key}: range {band['error_low']}..{band['error_high']} is not its runs' min..max")
        if [r["name"] for r in band["runs"]] != sorted(r["name"] for r in band["runs"]):
            problems.append(f"{key}: runs not in the writer's order")
        for r in band["runs"]:
            name = r["name"]
            if name in seen:
                problems.append(f"{name}: in two bands")
            seen.add(name)
            if name not in published:
                problems.append(f"{name}: not a run of published.toml")
                continue
            scenario = run.scenario_with_overrides(os.path.join(run.PUBLISHED, published[name]["scenario"]),
                                                   published[name].get("set", []))
            if run.band_key(scenario) != key:
                problems.append(f"{name}: its scenario's band is {run.band_key(scenario)}, not {key}")
    if keys != sorted(keys):
        problems.append("bands not in the writer's order")
    for name in sorted(expected - seen):
        problems.append(f"{name}: counted in the MAPE but in no band (run run.py --write-bands)")
    for name in sorted(seen - expected):
        problems.append(f"{name}: in a band but not counted in the MAPE")
    for p in problems:
        print("bands_test:", p)
    print(f"bands_test: {len(bands['bands'])} bands, {len(seen)} runs, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Random scenario overrides fail cleanly: `twin graph` (and a few `twin sim`, `twin run` and `twin sweep`) with 1 to
4 random `--set`s (a sweep: one, and a random `--vary` of two values).

Every key the scenario loader reads (found in model/scenario/scenario_toml.cpp, so a new key is covered the day it is added) gets
values of every kind: the values the repository's scenarios give it, and zero, negative, huge, fractional, string,
array and boolean ones. Each run must exit 0, or 2 with a `twin: error:` line (a `twin run` that diverges: 1 with its
`twin: error: training diverged` line); a signal, another status or a run past its timeout fails the test. The seed
is fixed, so a failure reproduces with the command it prints.
"""

import argparse
import pathlib
import random
import re
import subprocess
import sys
import tomllib

JUNK = ["0", "1", "2", "3", "7", "8", "16", "128", "-1", "0.5", "3.5", "1e30", "9223372036854775807", "nan",
        "true", "false", '"x"', '""', "[1, 2]", "{a = 1}", "[2048, 2048, 2048]", "[0, 1]"]


def loader_keys(source: pathlib.Path) -> list[str]:
    """The section.key pairs model/scenario/scenario_toml.cpp reads (SectionReader calls such as `model.integer("layers", ...)`)."""
    text = source.read_text()
    keys = set(re.findall(r'\b(model|parallel|cluster|framework|training)\.'
                          r'(?:integer|number|boolean|choice|text|positive_integers|version)\("([a-z_0-9]+)"', text))
    return sorted(f"{section}.{key}" for section, key in keys)


def scenario_values(scenarios: pathlib.Path) -> tuple[list[str], dict[str, dict[str, set[str]]]]:
    """The scenario names under scenarios/ and, per scenario and key, the values it gives the key (TOML literals)."""
    names, values = [], {}
    for path in sorted(scenarios.rglob("*.toml")):
        if path.name == "published.toml":
            continue
        name = str(path.relative_to(scenarios).with_suffix(""))
        names.append(name)
        with path.open("rb") as file:
            table = tomllib.load(file)
        for section, entries in table.items():
            if not isinstance(entries, dict):
                continue
            for key, value in entries.items():
                literal = f'"{value}"' if isinstance(value, str) else str(value).lower() \
                    if isinstance(value, bool) else str(value)
                values.setdefault(name, {}).setdefault(f"{section}.{key}", set()).add(literal)
    return names, values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--twin", required=True)
    parser.add_argument("--source", required=True, help="the repository root")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--graphs", type=int, default=150, help="twin graph runs")
    parser.add_argument("--sims", type=int, default=10, help="twin sim runs (gpt-350m-h200)")
    parser.add_argument("--trainings", type=int, default=10, help="twin run gpt-tiny --steps 1 runs")
    parser.add_argument("--sweeps", type=int, default=5, help="twin sweep gpt-350m-h200 runs")
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()

    root = pathlib.Path(args.source)
    keys = loader_keys(root / "model" / "scenario" / "scenario_toml.cpp")
    if len(keys) < 40:
        print(f"found only {len(keys)} keys in model/scenario/scenario_toml.cpp: has the loader's reader changed?")
        return 1
    names, by_scenario = scenario_values(root / "scenarios")
    every_value: dict[str, set[str]] = {}
    for values in by_scenario.values():
        for key, literals in values.items():
            every_value.setdefault(key, set()).update(literals)
    # twin run trains for real: its overrides take gpt-tiny's own values (and the junk), so that no valid
    # combination is a model that takes minutes a step; a sweep of gpt-350m-h200 (one GPU) its own, since the plans
    # of the larger scenarios (pipelines, expert parallelism) do not fit one GPU; graph and sim take every scenario's.
    pools = {"graph": every_value, "sim": every_value, "run": by_scenario.get("gpt-tiny", {}),
             "sweep": by_scenario.get("gpt-350m-h200", {})}
    rng = random.Random(args.seed)
    extra = {"graph": [], "sim": ["--quiet"], "run": ["--quiet", "--steps", "1", "--timeout", "60"],
             "sweep": ["--jobs", "2"]}

    failures = 0
    accepted = {command: 0 for command in extra}
    # Not gpt-tiny for twin sim: it runs on a cpu-host, which twin sim refuses without the host's measured profile.
    runs = ([("graph", names)] * args.graphs + [("sim", ["gpt-350m-h200"])] * args.sims +
            [("run", ["gpt-tiny"])] * args.trainings + [("sweep", ["gpt-350m-h200"])] * args.sweeps)
    for command, pool in runs:
        overrides = []
        def draw(key):
            # Mostly values some scenario uses, so that many runs get past validation into the Program, the
            # simulator and the executor.
            known = sorted(pools[command].get(key, ()))
            return rng.choice(known) if known and rng.random() < 0.7 else rng.choice(JUNK)

        # A sweep and a training set the keys their scenario gives (any other key's values come from plans that do
        # not fit it, or are junk): so that they get past validation as keys are added; graph covers every key.
        own_keys = sorted(pools[command]) if command in ("sweep", "run") else keys
        for _ in range(rng.randint(1, {"graph": 4, "sweep": 1}.get(command, 2))):
            key = rng.choice(own_keys)
            overrides.append(f"{key}={draw(key)}")
        argv = [args.twin, command, rng.choice(pool)] + extra[command]
        for override in overrides:
            argv += ["--set", override]
        if command == "sweep":  # a key both set and varied is refused: vary another one
            set_keys = {override.split("=")[0] for override in overrides}
            varied = rng.choice([key for key in own_keys if key not in set_keys])
            argv += ["--vary", f"{varied}={draw(varied)},{draw(varied)}"]
        shown = " ".join(f"'{arg}'" if " " in arg or "[" in arg else arg for arg in argv[1:])
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout, cwd=root)
        except subprocess.TimeoutExpired:
            print(f"FAIL (no answer in {args.timeout:g} s): twin {shown}")
            failures += 1
            continue
        accepted[command] += result.returncode == 0
        # A training run that starts and then diverges (a learning rate of 128) is a RunFailure: exit 1 with its one
        # error line naming the step, as the README's error policy says; any other exit 1 is a crash.
        diverged = command == "run" and result.returncode == 1 and "twin: error: training diverged" in result.stderr
        clean = result.returncode == 0 or diverged or (result.returncode == 2 and "twin: error:" in result.stderr)
        if not clean:
            failures += 1
            status = f"signal {-result.returncode}" if result.returncode < 0 else f"exit {result.returncode}"
            print(f"FAIL ({status}): twin {shown}\n    {result.stderr.strip()[-800:]}")
    print(f"{len(runs)} runs with random overrides of {len(keys)} keys, {failures} failed; accepted (exit 0): " +
          ", ".join(f"{command} {count}" for command, count in accepted.items()))
    # Overrides every run refuses would test only the loader's messages, not what runs past them.
    for command, count in accepted.items():
        if count == 0 and any(kind == command for kind, _ in runs):
            print(f"FAIL: no twin {command} run was accepted; the test no longer reaches past validation")
            failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

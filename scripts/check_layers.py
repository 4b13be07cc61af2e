#!/usr/bin/env python3
"""The layers, checked: each folder includes only the folders below it (docs/architecture in the README's folder
table). sim/ and exec/ sit side by side above report/ and model/ and never include each other; model/ knows nothing
of SimGrid or CUDA; kernels/ stands alone. Inside exec/ and model/ the rooms (sub-folders) are floors with the same
rule (ROOMS). Prints every include that breaks a rule and exits 1; silent and 0 when the tree keeps them.

    scripts/check_layers.py [ROOT]
"""
import os
import re
import sys

# folder -> the twin folders its files may include (besides its own)
ALLOWED = {
    "model": set(),
    "report": {"model"},
    "topology": {"model"},
    "measured": {"model", "report"},
    "kernels": set(),
    "sim": {"model", "topology", "report"},
    "exec": {"model", "report", "kernels"},
    "api": {"model", "report", "topology", "sim", "exec", "kernels", "measured"},
    "cli": {"model", "report", "topology", "sim", "exec", "kernels", "measured", "api"},
    "python": {"model", "report", "topology", "sim", "measured", "api"},
}
# layer -> room -> the rooms of the same layer its files may include (besides its own), lowest floor first
ROOMS = {
    "model": {
        "scenario": set(),                             # the validated scenario, its names and errors
        "plan": {"scenario"},                          # ranks, per-rank shapes, schedules, parameter counts
        "ops": {"scenario", "plan"},                   # what each op of a layer computes and moves
        "program": {"scenario", "plan", "ops"},        # the Program and the estimates built on it
    },
    "exec": {
        "core": set(),                                 # tensors, the Backend seam, errors, micro-batches
        "comm": {"core"},                              # communicators
        "cpu": {"core"},                               # the CPU backend
        "shard": {"core"},                             # a rank's parameters and optimizer state
        "cuda": {"core", "comm", "shard"},             # the CUDA backend and device communicators
        "interpreter": {"core", "comm", "shard"},      # the op loop and the features' runners
        "checkpoint": {"core", "shard", "interpreter"},  # shards on disk, manifest, re-shard
        "train": {"core", "comm", "cpu", "cuda", "shard", "interpreter", "checkpoint"},  # trainer, launchers, data
    },
}
# system headers a layer must not reach (model/ knows nothing of SimGrid or CUDA)
FORBIDDEN_SYSTEM = {
    "model": re.compile(r"^(simgrid/|cuda|cublas|nccl)"),
    "report": re.compile(r"^(simgrid/|cuda|cublas|nccl)"),
    "measured": re.compile(r"^(simgrid/|cuda|cublas|nccl)"),
    "exec": re.compile(r"^simgrid/"),
    "api": re.compile(r"^(cuda|cublas|nccl)"),
}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def room_violation(root, layer, path, target):
    """Why an include of `target` from `path` (in `layer`) breaks the rooms' floors, or None."""
    rooms = ROOMS.get(layer)
    parts = target.split("/")
    if not rooms or len(parts) < 3 or parts[0] != layer:
        return None
    inside = os.path.relpath(path, os.path.join(root, layer)).split(os.sep)
    room = inside[0] if len(inside) > 1 else ""
    if room not in rooms:
        return f"{layer}/{inside[0]} is in no room of {layer}/ (the rooms: {', '.join(rooms)})"
    wanted = parts[1]
    if wanted == room or wanted in rooms[room]:
        return None
    if wanted not in rooms:
        return f"{layer}/{room}/ includes {target} ({layer}/{wanted}/ is no room of {layer}/)"
    return f"{layer}/{room}/ includes {target} ({layer}/{wanted}/ is not below {layer}/{room}/)"


def violations(root):
    found = []
    for layer, allowed in ALLOWED.items():
        top = os.path.join(root, layer)
        for directory, _, files in os.walk(top):
            for name in sorted(files):
                if not name.endswith((".hpp", ".cpp", ".cu", ".cuh", ".h")):
                    continue
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        match = INCLUDE.match(line)
                        if not match:
                            continue
                        target = match.group(2)
                        first = target.split("/", 1)[0]
                        where = f"{os.path.relpath(path, root)}:{number}"
                        if match.group(1) == '"' and first in ALLOWED and first != layer and first not in allowed:
                            found.append(f"{where}: {layer}/ includes {target} ({first}/ is not below it)")
                        room_rule = room_violation(root, layer, path, target)
                        if match.group(1) == '"' and room_rule:
                            found.append(f"{where}: {room_rule}")
                        rule = FORBIDDEN_SYSTEM.get(layer)
                        if match.group(1) == "<" and rule and rule.match(target):
                            found.append(f"{where}: {layer}/ includes <{target}>")
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = violations(root)
    for line in found:
        print(line)
    if found:
        print(f"check_layers: {len(found)} include(s) break the layering")
        return 1
    print("check_layers: every include keeps the layering")
    return 0


if __name__ == "__main__":
    sys.exit(main())

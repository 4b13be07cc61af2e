#!/usr/bin/env python3
"""The layers, checked: each folder includes only the folders below it (docs/architecture in the README's folder
table). sim/ and exec/ sit side by side above report/ and model/ and never include each other; model/ knows nothing
of SimGrid or CUDA; kernels/ stands alone. Prints every include that breaks a rule and exits 1; silent and 0 when the
tree keeps them.

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
    "cli": {"model", "report", "topology", "sim", "exec", "kernels", "measured"},
}
# system headers a layer must not reach (model/ knows nothing of SimGrid or CUDA)
FORBIDDEN_SYSTEM = {
    "model": re.compile(r"^(simgrid/|cuda|cublas|nccl)"),
    "report": re.compile(r"^(simgrid/|cuda|cublas|nccl)"),
    "measured": re.compile(r"^(simgrid/|cuda|cublas|nccl)"),
    "exec": re.compile(r"^simgrid/"),
}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


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

#!/usr/bin/env python3
"""scripts/check_layers.py on the tree (it must keep the layers) and on small made-up trees (it must see a planted
include of exec/ from sim/, of sim/ from exec/, of SimGrid from model/, and let the allowed ones pass)."""
import os
import subprocess
import sys
import tempfile

ROOT = os.environ.get("TWIN_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "check_layers.py")


def run(root):
    return subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)


def tree(files):
    root = tempfile.mkdtemp()
    for path, text in files.items():
        os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(root, path), "w") as f:
            f.write(text)
    return root


checks = 9
failures = []
result = run(ROOT)
if result.returncode != 0:
    failures.append("the tree breaks the layering:\n" + result.stdout)

allowed = tree({"sim/a.cpp": '#include "report/summary.hpp"\n#include "model/program/program.hpp"\n',
                "exec/b.cpp": '#include "report/timeline.hpp"\n#include "kernels/cpu/gelu.hpp"\n'})
if run(allowed).returncode != 0:
    failures.append("allowed includes were refused: " + run(allowed).stdout)

for planted, expect in [({"sim/a.cpp": '#include "exec/train/trainer.hpp"\n'}, "sim/ includes exec/train/trainer.hpp"),
                        ({"exec/a.cpp": '  # include "sim/engine.hpp"\n'}, "exec/ includes sim/engine.hpp"),
                        ({"model/a.hpp": "#include <simgrid/s4u.hpp>\n"}, "model/ includes <simgrid/s4u.hpp>"),
                        ({"report/a.hpp": '#include "sim/cost_model.hpp"\n'}, "report/ includes sim/cost_model.hpp"),
                        ({"exec/cpu/a.cpp": '#include "exec/interpreter/interpreter.hpp"\n'},
                         "exec/cpu/ includes exec/interpreter/interpreter.hpp (exec/interpreter/ is not below exec/cpu/)"),
                        ({"model/plan/a.cpp": '#include "model/program/program.hpp"\n'},
                         "model/plan/ includes model/program/program.hpp (model/program/ is not below model/plan/)"),
                        ({"exec/a.cpp": '#include "exec/core/tensor.hpp"\n'}, "exec/a.cpp is in no room of exec/")]:
    result = run(tree(planted))
    if result.returncode != 1 or expect not in result.stdout:
        failures.append(f"planted {planted} not caught: rc {result.returncode}, {result.stdout!r}")

for failure in failures:
    print("FAIL:", failure)
print(f"{checks - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)

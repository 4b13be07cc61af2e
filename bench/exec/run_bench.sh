#!/bin/sh
# The executor's training speed on one rank, next to cblas_sgemm and (when Debian's python3-torch is installed) the
# same model's training step in PyTorch on the same threads.
#   bench/exec/run_bench.sh [BUILD_DIR] [--layers 12 --hidden 512 --heads 8 --seq 256 --batch 8 --steps 3 --threads 2]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
[ $# -gt 0 ] && shift
bench="$build/bench/exec/twin_exec_bench"
[ -x "$bench" ] || { echo "run_bench.sh: $bench not found (ninja -C $build twin_exec_bench)" >&2; exit 2; }
threads=$(nproc)
out=$(mktemp -d)
"$bench" --threads "$threads" --json "$out/twin.json" "$@"

python=""
for candidate in /usr/bin/python3 python3; do
  if command -v "$candidate" > /dev/null 2>&1 && "$candidate" -c "import torch" > /dev/null 2>&1; then
    python=$candidate
    break
  fi
done
if [ -z "$python" ]; then
  echo
  echo "PyTorch: not installed (apt-get install python3-torch for the side-by-side); skipped"
  exit 0
fi
"$python" "$here/torch_step.py" --threads "$threads" "$@" > "$out/torch.json"
"$python" - "$out/twin.json" "$out/torch.json" <<'PY'
import json, sys
twin, torch = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print()
print(f"{'':24}{'step (s)':>10}{'tokens/s':>12}{'GFLOP/s':>10}")
print(f"{'twin exec (cpu)':24}{twin['step_s']:>10.3f}{twin['tokens_per_s']:>12.0f}{twin['achieved_gflops']:>10.1f}")
print(f"{torch['engine']:24}{torch['step_s']:>10.3f}{torch['tokens_per_s']:>12.0f}{torch['achieved_gflops']:>10.1f}")
print(f"twin / pytorch: {torch['step_s'] / twin['step_s']:.2f}x the speed")
PY

#!/usr/bin/env bash
# DeepSeek-V3's pre-training (scenarios/deepseek-v3-h800.toml) against its report: H800 GPU-hours per trillion
# tokens, twin's prediction beside the report's 180K (arXiv:2412.19437, Table 1 and section 1: "180K H800 GPU hours",
# "3.7 days on our cluster with 2048 H800 GPUs"), with the simulation's own wall and CPU time. About 15 minutes of one
# core at replica fidelity (docs/simulator.md, "DualPipe"); prints, never fails on the gap (published runs check
# predictions, they do not tune them).
#   bench/sim/deepseek_v3_h800.sh build/cli/twin
set -euo pipefail
twin=${1:?usage: $0 path/to/twin}
root=$(cd "$(dirname "$0")/../.." && pwd)
json=$(mktemp)
times=$(mktemp)
trap 'rm -f "$json" "$times"' EXIT
TIMEFORMAT='%R %U'
{ time "$twin" sim "$root/scenarios/deepseek-v3-h800.toml" --fidelity replica --train-tokens 1T --quiet \
    --json "$json" > /dev/null; } 2> "$times"
read -r wall user < <(tail -1 "$times")
python3 - "$json" "$wall" "$user" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
t = d["training"]
reported_gpu_hours, reported_days = 180e3, 3.7
print(f"deepseek-v3-h800: {d['iteration_time_s']:.2f} s a step; per trillion tokens {t['gpu_hours'] / 1e3:.0f}K "
      f"GPU-hours, {t['days']:.2f} days (report: 180K, 3.7 days: twin {t['gpu_hours'] / reported_gpu_hours - 1:+.1%})")
print(f"twin sim: wall {float(sys.argv[2]):.0f} s, cpu {float(sys.argv[3]):.0f} s")
PY

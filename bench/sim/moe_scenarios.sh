#!/usr/bin/env bash
# How long `twin sim` takes on the Mixture-of-Experts scenarios at group fidelity: one line per scenario with the
# predicted iteration, the wall time and the CPU time (what the simulation costs on a machine it has to itself);
# exits 1 when one takes more CPU seconds than the budget (default 10: deepseek-v3 took 1.3 s of CPU on the shared
# 2-core machine of 2026-12-03 once group fidelity timed the all-to-alls' bytes inside a node without flows; 229 s
# before).
#   bench/sim/moe_scenarios.sh build/cli/twin [BUDGET_S] [SCENARIO...]   (default: mixtral-8x7b qwen3-30b-a3b
#                                                                          deepseek-v3)
set -euo pipefail
twin=${1:?usage: $0 path/to/twin [budget seconds] [scenario...]}
budget=${2:-10}
shift $(($# < 2 ? $# : 2))
scenarios=("${@:-mixtral-8x7b qwen3-30b-a3b deepseek-v3}")
root=$(cd "$(dirname "$0")/../.." && pwd)
status=0
for scenario in ${scenarios[@]}; do
  json=$(mktemp)
  times=$(mktemp)
  TIMEFORMAT='%R %U'
  { time "$twin" sim "$root/scenarios/$scenario.toml" --fidelity group --quiet --json "$json" > /dev/null; } 2> "$times"
  read -r wall user < <(tail -1 "$times")
  iteration=$(python3 -c "import json, sys; print(f\"{json.load(open(sys.argv[1]))['iteration_time_s']:.2f}\")" "$json")
  printf '%-16s iteration %8s s   twin sim: wall %7.1f s, cpu %7.1f s\n' "$scenario" "$iteration" "$wall" "$user"
  rm -f "$json" "$times"
  if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$user" "$budget"; then
    echo "bench/sim: $scenario took ${user} s of CPU, over the budget of ${budget} s"
    status=1
  fi
done
exit $status

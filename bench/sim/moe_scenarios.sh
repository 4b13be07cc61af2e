#!/usr/bin/env bash
# How long `twin sim` takes on the Mixture-of-Experts scenarios at group fidelity: one line per scenario with the
# predicted iteration and the wall time; exits 1 when one takes longer than the budget (seconds, default 60).
#   bench/sim/moe_scenarios.sh build/cli/twin [BUDGET_S]
set -euo pipefail
twin=${1:?usage: $0 path/to/twin [budget seconds]}
budget=${2:-60}
root=$(cd "$(dirname "$0")/../.." && pwd)
status=0
for scenario in mixtral-8x7b qwen3-30b-a3b deepseek-v3; do
  json=$(mktemp)
  start=$(date +%s.%N)
  "$twin" sim "$root/scenarios/$scenario.toml" --fidelity group --quiet --json "$json"
  wall=$(echo "$(date +%s.%N) - $start" | bc)
  iteration=$(python3 -c "import json, sys; print(f\"{json.load(open(sys.argv[1]))['iteration_time_s']:.2f}\")" "$json")
  printf '%-16s iteration %8s s   twin sim wall %6.1f s\n' "$scenario" "$iteration" "$wall"
  rm -f "$json"
  if (($(echo "$wall > $budget" | bc))); then
    echo "bench/sim: $scenario took ${wall} s, over the budget of ${budget} s"
    status=1
  fi
done
exit $status

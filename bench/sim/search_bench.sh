#!/usr/bin/env bash
# How long `twin search` takes over MT-NLG 530B's whole plan space on 280 DGX A100 nodes (the default scenario): TP,
# PP, virtual stages, DP, micro-batch, recompute (none, selective, full, block), sequence parallelism and ZeRO stage,
# and where its plans went (enumerated, invalid, over memory, pruned by the bound, simulated). Prints one line per
# --max; extra arguments go to every search (a scenario, --jobs, --set ...).
#   bench/sim/search_bench.sh build/cli/twin [--max N ...] [-- EXTRA...]     (default: --max 1, then the default 48)
set -euo pipefail
twin=${1:?usage: $0 path/to/twin [--max N ...] [-- extra search arguments]}
shift
maxes=()
while [[ $# -gt 0 && $1 != "--" ]]; do
  [[ $1 == "--max" ]] && { maxes+=("$2"); shift 2; continue; }
  echo "$0: unknown argument $1" >&2
  exit 2
done
[[ ${1:-} == "--" ]] && shift
[[ ${#maxes[@]} -eq 0 ]] && maxes=(1 48)
json=$(mktemp --suffix .json)
trap 'rm -f "$json"' EXIT
for max in "${maxes[@]}"; do
  start=$(date +%s.%N)
  "$twin" search --vary-recompute --vary-sequence-parallel --vary-zero --jobs 2 --quiet --max "$max" \
    --json "$json" "$@" > /dev/null
  end=$(date +%s.%N)
  python3 - "$json" "$max" "$start" "$end" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
best = d["plans"][0]
print(f"--max {sys.argv[2]}: {d['plans_enumerated']} enumerated, {d['plans_pruned_rules']} invalid, "
      f"{d['plans_pruned_memory']} over memory, {d['plans_pruned_bound']} pruned by the bound, "
      f"{d['plans_simulated']} simulated in {float(sys.argv[4]) - float(sys.argv[3]):.1f} s wall; fastest "
      f"tp {best['tp']} pp {best['pp']} dp {best['dp']} mb {best['micro_batch']} v {best['virtual_stages']} "
      f"{best['recompute']} sp={best['sequence_parallel']} zero {best['zero_stage']}: "
      f"{best['iteration_time_s']:.3f} s (bound {best['iteration_time_bound_s']:.3f} s)")
PY
done

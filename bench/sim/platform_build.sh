#!/usr/bin/env bash
# How long SimGrid takes to build the platform of N DGX A100 nodes (group fidelity, GPT-3 175B's plan on every node):
# the number behind topology::estimated_build_seconds. Prints one line per size; stops each simulation once its
# platform is built (the replay is bench/sim's other business).
#   bench/sim/platform_build.sh build/cli/twin [NODES...]      (default: 5000 10000)
set -euo pipefail
twin=${1:?usage: $0 path/to/twin [nodes...]}
shift
sizes=("${@:-5000 10000}")
for nodes in ${sizes[@]}; do
  log=$(mktemp)
  "$twin" sim gpt3-175b --set cluster.nodes="$nodes" --set parallel.global_batch="$nodes" > /dev/null 2> "$log" &
  pid=$!
  built=""
  while kill -0 "$pid" 2> /dev/null; do
    built=$(grep -o "platform of $nodes nodes built in [0-9.]* s" "$log" || true)
    [[ -n $built ]] && break
    sleep 0.2
  done
  kill "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  built=${built:-$(grep -o "platform of $nodes nodes built in [0-9.]* s" "$log" || echo "platform of $nodes nodes built in under 2 s")}
  echo "$built"
  rm -f "$log"
done

#!/usr/bin/env bash
# How long SimGrid takes to build the platform of N DGX A100 nodes (GPT-3 175B's plan on every node), and the
# process's resident memory once it is built: the numbers behind topology::estimated_build_seconds and
# estimated_platform_bytes. One line per size and fidelity (rank: a host per GPU; group: one per TP group of 8); each
# simulation is stopped once its platform is built (the replay is bench/sim's other business).
#   bench/sim/platform_build.sh build/cli/twin [NODES...]      (default: 1000 100000)
set -euo pipefail
twin=${1:?usage: $0 path/to/twin [nodes...]}
shift
sizes=("${@:-1000 100000}")
for nodes in ${sizes[@]}; do
  for fidelity in group rank; do
    log=$(mktemp)
    "$twin" sim gpt3-175b --fidelity "$fidelity" --set cluster.nodes="$nodes" --set parallel.global_batch="$nodes" \
      > /dev/null 2> "$log" &
    pid=$!
    built=""
    while kill -0 "$pid" 2> /dev/null; do
      built=$(grep -o "platform of $nodes nodes built in [0-9.]* s" "$log" || true)
      [[ -n $built ]] && break
      sleep 0.1
    done
    rss_mb=$(awk '/VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$pid/status" 2> /dev/null || echo "?")
    kill "$pid" 2> /dev/null || true
    wait "$pid" 2> /dev/null || true
    echo "${built:-platform of $nodes nodes: no build line (the run ended first: $(tail -1 "$log"))} ($fidelity fidelity), resident ${rss_mb} MB"
    rm -f "$log"
  done
done

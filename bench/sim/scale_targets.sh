#!/usr/bin/env bash
# Issue 42's three speed targets, timed on this machine (wall and CPU seconds, peak resident memory, the iteration
# time): Llama 3 405B on 98,304 H100 at replica fidelity (target: under 30 s), DeepSeek-V3 on 1,024 H100 at the
# default fidelity (under 60 s), MT-NLG 530B on 560 DGX A100 nodes at rank fidelity (under 60 s). Prints one line per
# case and whether it met its target; never fails on a miss (a timing depends on the machine: docs/simulator.md has
# the 2-core numbers). About 5 minutes on 2 cores, most of it the rank-fidelity case. With --check-group, also Llama 3
# 405B on 98,304 H100 at group fidelity (about 4 more minutes, 1.1 GB) and how far replica fidelity is from it (the
# target: within 0.5 %).
#   bench/sim/scale_targets.sh build/cli/twin [--check-group]
set -euo pipefail
twin=${1:?usage: $0 path/to/twin [--check-group]}
check_group=${2:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
run() {
  local name=$1 target_s=$2
  shift 2
  local json times
  json=${JSON_OUT:-$(mktemp)}
  times=$(mktemp)
  /usr/bin/time -f "%e %U %M" -o "$times" "$twin" sim "$@" --quiet --json "$json" > /dev/null
  read -r wall user rss_kb < "$times"
  python3 - "$json" "$name" "$target_s" "$wall" "$user" "$rss_kb" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
name, target, wall, user, rss = sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
verdict = "" if target == 0 else f"  target under {target:.0f} s: {'met' if wall < target else 'NOT met'}"
print(f"{name:34s} {d['fidelity']:>8s}  iteration {d['iteration_time_s']:8.3f} s  wall {wall:6.1f} s  cpu {user:6.1f} s  "
      f"{rss / 1024:5.0f} MB{verdict}")
PY
  [[ -n ${JSON_OUT:-} ]] || rm -f "$json"
  rm -f "$times"
}
replica_json=$(mktemp)
group_json=$(mktemp)
trap 'rm -f "$replica_json" "$group_json"' EXIT
JSON_OUT=$replica_json run "llama3-405b on 98,304 H100" 30 "$root/scenarios/llama3-405b-98k.toml" --fidelity replica
run "deepseek-v3 on 1,024 H100" 60 "$root/scenarios/deepseek-v3-1024.toml"
run "mt-nlg 530b on 560 nodes" 60 mtnlg-530b --set cluster.nodes=560 --fidelity rank
if [[ $check_group == --check-group ]]; then
  JSON_OUT=$group_json run "llama3-405b on 98,304 H100, group" 0 "$root/scenarios/llama3-405b-98k.toml" \
    --fidelity group
  python3 - "$replica_json" "$group_json" <<'PY'
import json, sys
replica, group = (json.load(open(path))["iteration_time_s"] for path in sys.argv[1:3])
off = (replica / group - 1) * 100
print(f"replica fidelity against group on 98,304 H100: {off:+.4f} % (target: within 0.5 %: {'met' if abs(off) <= 0.5 else 'NOT met'})")
PY
fi

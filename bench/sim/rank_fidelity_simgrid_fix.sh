#!/usr/bin/env bash
# Rank fidelity with SimGrid's own fix for its list walk (issue 42, item 2; docs/simulator.md "Where rank fidelity's
# time goes"). Debian 12's SimGrid 3.32 keeps every detached host-to-host transfer in a std::list that
# CommImpl::finish() searches with list::remove: 62 % of MT-NLG's 560-node run at rank fidelity. SimGrid 3.34 keeps
# them in a std::set instead (upstream commit 5f8fc2c2, "Replaced std::list by std::set to keep track of activities",
# 1 December 2022). This script builds Debian's own SimGrid 3.32 source (`apt-get source`, into a folder of its own,
# nothing installed) with that one change, and times the same twin binary on the same case with Debian's library
# and with the rebuilt one (LD_LIBRARY_PATH): wall and CPU seconds, peak memory, and whether the two JSON summaries
# are byte-identical. 15 to 30 minutes on 2 cores the first time, most of it SimGrid's build (10 to 25 minutes,
# kept in the folder), then about 3.5 minutes.
#   bench/sim/rank_fidelity_simgrid_fix.sh build/cli/twin [FOLDER (default build-simgrid-set)] [NODES (default 560)]
set -euo pipefail
twin=$(realpath "${1:?usage: $0 path/to/twin [folder] [nodes]}")
folder=$(realpath -m "${2:-build-simgrid-set}")
nodes=${3:-560}
mkdir -p "$folder"
lib=$folder/build/lib/libsimgrid.so.3.32
if [[ ! -e $lib ]]; then
  # Debian's source package, through apt with a source list of its own (the machine's lists are left as they are).
  apt_dir=$folder/apt
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/parts"
  cat > "$apt_dir/parts/simgrid-source.sources" <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  apt_opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt_dir/parts"
            -o "Dir::State::Lists=$apt_dir/lists")
  apt-get "${apt_opts[@]}" update > /dev/null
  (cd "$folder" && apt-get "${apt_opts[@]}" source --download-only simgrid=3.32-2 > /dev/null 2>&1)
  rm -rf "$folder/src" && mkdir -p "$folder/src"
  tar -xf "$folder/simgrid_3.32.orig.tar.xz" -C "$folder/src" --strip-components=1
  # The upstream change, re-made on 3.32: the commit's own substitutions in its own five files (the container in
  # ActorImpl.hpp; emplace_back -> insert, remove -> erase in CommImpl, ExecImpl, IoImpl and ActorImpl).
  src=$folder/src
  sed -i 's/std::list<activity::ActivityImplPtr> activities_;/std::set<activity::ActivityImplPtr> activities_;/;
          s/#include <list>/#include <list>\n#include <set>/' "$src/src/kernel/actor/ActorImpl.hpp"
  sed -i 's/activities_\.emplace_back(/activities_.insert(/; s/activities_\.remove(/activities_.erase(/' \
    "$src/src/kernel/activity/CommImpl.cpp" "$src/src/kernel/activity/ExecImpl.cpp" \
    "$src/src/kernel/activity/IoImpl.cpp" "$src/src/kernel/actor/ActorImpl.cpp"
  grep -q 'std::set<activity::ActivityImplPtr> activities_;' "$src/src/kernel/actor/ActorImpl.hpp" ||
    { echo "$0: the change did not apply to SimGrid's source" >&2; exit 1; }
  if grep -rqE 'activities_\.(emplace_back|remove)\(' "$src/src"; then
    echo "$0: a use of the list is left in SimGrid's source" >&2; exit 1
  fi
  # From inside the folder: SimGrid's configure leaves a test program (test_stackgrowth) in the working directory.
  (cd "$folder" && cmake -S "$src" -B "$folder/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -Denable_smpi=OFF \
    -Denable_model-checking=OFF -Denable_documentation=OFF -Denable_java=OFF -Denable_python=OFF -Denable_lto=OFF \
    > "$folder/configure.log" 2>&1)
  echo "building SimGrid 3.32 with the set (10 to 25 minutes on 2 cores)..." >&2
  cmake --build "$folder/build" --target simgrid > "$folder/build.log" 2>&1 ||
    { echo "$0: SimGrid's build failed: $folder/build.log" >&2; exit 1; }
fi
run() {
  local name=$1 json=$2
  shift 2
  local times
  times=$(mktemp)
  env "$@" /usr/bin/time -f "%e %U %M" -o "$times" "$twin" sim mtnlg-530b --set cluster.nodes="$nodes" \
    --fidelity rank --quiet --json "$json" > /dev/null
  read -r wall user rss_kb < "$times"
  rm -f "$times"
  python3 - "$json" "$name" "$wall" "$user" "$rss_kb" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
name, wall, user, rss_kb = sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
print(f"{name:28s} iteration {d['iteration_time_s']:.6f} s  wall {wall:6.1f} s  cpu {user:6.1f} s  {rss_kb / 1024:5.0f} MB")
PY
}
debian_json=$(mktemp)
fixed_json=$(mktemp)
trap 'rm -f "$debian_json" "$fixed_json"' EXIT
echo "MT-NLG 530B on $nodes DGX A100 nodes at rank fidelity, $(nproc) cores:"
run "Debian's SimGrid 3.32" "$debian_json" LD_LIBRARY_PATH=
run "3.32 with the set (3.34's)" "$fixed_json" LD_LIBRARY_PATH="$folder/build/lib"
if cmp -s "$debian_json" "$fixed_json"; then
  echo "JSON summaries byte-identical"
else
  echo "JSON summaries differ" >&2
  exit 1
fi

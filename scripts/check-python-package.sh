#!/usr/bin/env bash
# The Python package as a user installs it (issue 40's done-when, a CI step after the README's test command): a fresh
# virtual environment, `pip install .` reusing the configured build tree (only the module's target is built: the
# tree's libraries are already there), then twin.simulate("mtnlg-530b")'s iteration time against `twin sim --json`'s.
#   scripts/check-python-package.sh [BUILD_DIR]     (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
repo=$(pwd)
python=${PYTHON:-$(command -v /usr/bin/python3 || command -v python3)}  # Debian's, where its python3-venv is
venv=$(mktemp -d "${TMPDIR:-/tmp}/twin-venv.XXXXXX")
# pip configures the tree with the venv's Python, under the three names CMake's FindPython3, FindPython and
# pybind11's FindPythonLibsNew cache it by: put the tree's own back under all three afterwards (its tests run with it,
# and a tree left naming the deleted venv would not configure again). A tree configured without naming one keeps what
# FindPython3 found in its internal _Python3_EXECUTABLE only (a fresh clone's, as the README's commands leave it).
cached() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" 2>/dev/null | head -n 1; }
tree_python=$(cached Python3_EXECUTABLE)
[ -n "$tree_python" ] || tree_python=$(cached _Python3_EXECUTABLE)
# pip's build also points the search paths at its own build environment, deleted once it is done: the tree's back.
paths=()
for name in CMAKE_PREFIX_PATH CMAKE_MODULE_PATH; do
  value=$(cached "$name")
  if [ -n "$value" ]; then paths+=("-D$name=$value"); else paths+=("-U$name"); fi
done
restore() {
  rm -rf "$venv"
  if [ -n "$tree_python" ]; then
    cmake -S . -B "$build" -DPython3_EXECUTABLE="$tree_python" -DPython_EXECUTABLE="$tree_python" \
      -DPYTHON_EXECUTABLE="$tree_python" "${paths[@]}" >/dev/null ||
      echo "check-python-package: could not point $build back at $tree_python (cmake -B $build to see why)" >&2
  fi
  if grep -qE "$venv|/pip-build-env-" "$build/CMakeCache.txt" 2>/dev/null; then  # paths deleted by now
    echo "check-python-package: $build/CMakeCache.txt still names pip's deleted environments:" >&2
    grep -E "$venv|/pip-build-env-" "$build/CMakeCache.txt" >&2
    exit 1
  fi
}
trap restore EXIT
started=$(date +%s)
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check . --config-settings=build-dir="$repo/$build"
echo "check-python-package: pip install . in $(( $(date +%s) - started )) s"
# Outside the checkout, so that `import twin` is the installed package.
(cd "$venv" && "$venv/bin/python" -c "import twin; print(twin.simulate('mtnlg-530b')['iteration_time_s'])")
(cd "$venv" && "$venv/bin/python" "$repo/python/tests/simulate_matches_cli.py" "$repo/$build/cli/twin")

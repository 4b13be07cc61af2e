#!/usr/bin/env bash
# Copies what a GPU machine without Debian's -dev packages and without network needs to build twin's executor, its
# CUDA kernels and their tests, into .deps/ (git-ignored; ~7 MB), for cmake -DTWIN_DEPS_DIR=.deps
# (cmake/TwinDependencies.cmake):
#   .deps/include/{fmt,toml++,nlohmann,CLI}   header-only libraries (fmt with FMT_HEADER_ONLY)
#   .deps/googletest                          googletest's sources (built with the project)
# Run it here, on a machine with the Debian packages (scripts/install-deps.sh), then carry .deps to the GPU machine
# (the device tool: carry [".deps"]); bench/gpu_check.sh picks it up by itself.
set -euo pipefail
cd "$(dirname "$0")/.."

deps=.deps
rm -rf "$deps.tmp"
mkdir -p "$deps.tmp/include"
for header_dir in fmt toml++ nlohmann CLI; do
  source_dir=/usr/include/$header_dir
  [ -d "$source_dir" ] || { echo "prepare-gpu-deps: $source_dir missing (run scripts/install-deps.sh)" >&2; exit 1; }
  cp -r "$source_dir" "$deps.tmp/include/"
done
[ -f /usr/src/googletest/CMakeLists.txt ] || { echo "prepare-gpu-deps: /usr/src/googletest missing (libgtest-dev)" >&2; exit 1; }
cp -r /usr/src/googletest "$deps.tmp/googletest"
rm -rf "$deps"
mv "$deps.tmp" "$deps"
echo "prepare-gpu-deps: $(du -sh "$deps" | cut -f1) in $deps: $(ls "$deps/include" | tr '\n' ' ')+ googletest"

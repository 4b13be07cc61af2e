#!/usr/bin/env bash
# Installs the Debian 12 packages twin builds with, skipping those already present. Uses sudo when not root.
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is optional and not installed here: without it the GPU targets are skipped.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libsimgrid-dev libfmt-dev nlohmann-json3-dev libtomlplusplus-dev libcli11-dev
  libopenblas-dev libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libbenchmark-dev libjemalloc-dev
  zlib1g-dev libprotobuf-dev protobuf-compiler
  python3 python3-dev python3-venv pybind11-dev python3-pytest python3-pandas
  clang libclang-rt-14-dev
  chromium
)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  as_root=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
"${as_root[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"

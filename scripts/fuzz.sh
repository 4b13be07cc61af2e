#!/usr/bin/env bash
# Fuzzes the readers of what users hand twin (tests/fuzz: the scenario TOML and --set overrides, training logs,
# Kineto traces, GPU profiles, checkpoint manifests and shards) with libFuzzer under AddressSanitizer and
# UndefinedBehaviorSanitizer. CI builds with GCC and so does not run them: run this by hand (Debian's clang, apt
# install clang) after changing a reader.
#   scripts/fuzz.sh            each target 12 s (the minute of `ctest -L fuzz`)
#   scripts/fuzz.sh 600        each target 10 minutes
#   scripts/fuzz.sh 60 fuzz_kineto fuzz_scenario    only these
# The build folder is build-fuzz/ (configured once). A finding stops its target with the input written under
# build-fuzz/fuzz/<target>/artifacts/: fix the reader, then copy the input into tests/fuzz/corpus/<target>/ so that
# every later run tries it first. Inputs that found new coverage collect in build-fuzz/fuzz/<target>/corpus/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-12}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(fuzz_scenario fuzz_training_log fuzz_kineto fuzz_gpu_profile fuzz_checkpoint)
fi
if [ ! -f build-fuzz/CMakeCache.txt ]; then
  CC=clang CXX=clang++ cmake -G Ninja -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTWIN_FUZZ=ON \
    -DTWIN_BUILD_BENCH=OFF
fi
cmake -B build-fuzz -DTWIN_FUZZ_SECONDS="$seconds" >/dev/null
cmake --build build-fuzz --target "${targets[@]}"
regex=$(IFS='|'; echo "^Fuzz\\.(${targets[*]})\$")
ctest --test-dir build-fuzz -L fuzz -R "$regex" --output-on-failure

#!/usr/bin/env bash
# The CUDA side of twin on a real GPU (H100/H200/A100), in one short run (~5 minutes on an H200, 16 cores):
#   1. build the CUDA targets (CUDA toolkit + header-only .deps/, no Debian -dev packages, no network)
#   2. every CUDA kernel against its CPU twin on random inputs (tests/kernels_cuda: none may be skipped here)
#   3. the tiny GPT trained 300 steps on kernels/cpu (fp32, in the background) and kernels/cuda (bf16): loss curves
#   4. the cuBLASLt bf16 GEMM peak and the HBM bandwidth of this GPU, as the scenario keys cluster.gemm_tflops,
#      cluster.gemm_shape and cluster.hbm_gb_per_s; and the GEMM rate against its inner dimension K
#   5. a ~1.1B-parameter GPT at seq 2048 on one GPU: tokens/s, model TFLOP/s, MFU against the measured GEMM peak
#   6. the executor on the CUDA backend, when exec/cuda is wired into the build: its tests, then `twin run gpt-tiny`
#      on cpu, cuda, cuda with tp=2 pp=2 (4 ranks sharing the GPU), cuda with FSDP on dp=2 and the tp=2 pp=2 run's
#      step-30 checkpoint resumed on one rank (re-sharded): the loss curves; then
#      scenarios/gpt-350m-h200.toml on this GPU, traced op by op (measured_gpt-350m.trace.json), for `twin compare`
#      against `twin sim`'s trace of the same scenario on a machine with SimGrid (the command is printed)
# Numbers go to $OUT/gpu_check.txt (or build-gpu/gpu_check.txt without $OUT), the full log beside it. Exit status 0
# only when every section passed.
#
# On this workplace's device tool: run scripts/prepare-gpu-deps.sh here first, then
#   run(command="bash bench/gpu_check.sh", carry=[".deps"], timeout_s=540)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=$root/build-gpu
results=${OUT:-$build}
mkdir -p "$build" "$results"
report=$results/gpu_check.txt
log=$results/gpu_check.log
: >"$report"
: >"$log"
started=$SECONDS
failures=()

say() { echo "$*" | tee -a "$report"; }
section() { say ""; say "== $* ($((SECONDS - started)) s)"; }
fail() { failures+=("$1"); say "FAIL: $1"; }
run_logged() { "$@" 2>&1 | tee -a "$log"; return "${PIPESTATUS[0]}"; }

section "machine"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap,clocks.sm,clocks.max.sm --format=csv \
    | tee -a "$report"
  capability=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
else
  say "nvidia-smi not found"
  capability=""
fi
say "nvcc: $(nvcc --version | tail -1)   cmake: $(cmake --version | head -1)   cores: $(nproc)"
architectures=${capability:-"80;90"}  # build for this GPU only: half the compile time

section "1. build (CUDA architectures $architectures)"
# bench/gpu/standalone wraps the project and adds tests/kernels_cuda and bench/gpu if the project does not (yet)
configure=(cmake -G Ninja -S "$root/bench/gpu/standalone" -B "$build" "-DTWIN_ROOT=$root" -DCMAKE_BUILD_TYPE=Release
  -DTWIN_BUILD_TESTS=ON -DTWIN_BUILD_BENCH=ON "-DCMAKE_CUDA_ARCHITECTURES=$architectures"
  -DCMAKE_POLICY_VERSION_MINIMUM=3.5)
[ -d "$root/.deps" ] && configure+=("-DTWIN_DEPS_DIR=$root/.deps")
targets=(twin_kernels_cuda_tests twin_gpt_train twin_gemm_peak)
if ! run_logged "${configure[@]}" >/dev/null; then
  fail "configure (see gpu_check.log)"
  tail -40 "$log"
  say "RESULT: FAIL (${failures[*]})"
  exit 1
fi
for target in "${targets[@]}"; do  # tests/kernels_cuda and bench/gpu must be in the build (docs/cuda.md: CMake)
  if ! ninja -C "$build" -t targets all | grep -q "^$target:"; then
    fail "$target is not in the build"
    say "RESULT: FAIL (${failures[*]})"
    exit 1
  fi
done
if ! run_logged ninja -C "$build" "${targets[@]}" >/dev/null; then
  fail "build (see gpu_check.log)"
  grep -E "error|FAILED" -A3 "$log" | head -40 | tee -a "$report"
  say "RESULT: FAIL (${failures[*]})"
  exit 1
fi
say "built ${targets[*]} in $((SECONDS - started)) s"
# where each program landed (under twin/ when the project adds it, at the top when the wrapper does)
program() { find "$build/" -name "$1" -type f -perm -u+x -not -path "*/CMakeFiles/*" | head -1; }
kernel_tests=$(program twin_kernels_cuda_tests)
gpt_train=$(program twin_gpt_train)
gemm_peak=$(program twin_gemm_peak)
optional=()  # the executor's CUDA side, once the lead has wired exec/cuda (docs/cuda.md)
for target in twin_exec_cuda_tests twin; do
  ninja -C "$build" -t targets all | grep -q "^$target:" && optional+=("$target")
done
if [ ${#optional[@]} -gt 0 ]; then  # built in the background while the GPU works; half the cores
  (ninja -C "$build" -j "$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))" "${optional[@]}" >"$build/optional_build.log" 2>&1
   echo $? >"$build/optional_build.rc") &
  optional_pid=$!
fi

# The CPU reference of the tiny model runs in the background while the GPU works (it needs ~1-2 minutes).
section "3a. tiny GPT on kernels/cpu, in the background"
corpus=$(ls "$root"/data/*.txt 2>/dev/null | head -1)
if [ -z "$corpus" ]; then  # no shipped text yet: the repository's own sources, a fixed byte corpus for this tree
  corpus=$build/corpus.txt
  cat "$root"/README.md "$root"/kernels/cpu/*.hpp "$root"/kernels/cpu/*.cpp "$root"/model/*.cpp >"$corpus"
fi
say "corpus: ${corpus#$root/} ($(wc -c <"$corpus") bytes)"
tiny=(--layers 4 --channels 128 --heads 4 --seq 64 --vocab 256 --batch 16 --steps 300 --timing-warmup 10
  --lr 3e-3 --min-lr 3e-4 --warmup 20 --data "$corpus")
"$gpt_train" --backend cpu "${tiny[@]}" --losses "$results/losses_cpu.txt" \
  >"$build/tiny_cpu.log" 2>&1 &
cpu_pid=$!

section "2. CUDA kernels against their CPU twins"
if run_logged "$kernel_tests" --gtest_brief=1 \
  "--gtest_output=xml:$results/kernels_cuda.xml" >/dev/null; then
  passed=$(grep -c 'result="completed"' "$results/kernels_cuda.xml")
  skipped=$(grep -c 'result="skipped"' "$results/kernels_cuda.xml")
  say "kernel tests: $passed passed, $skipped skipped"
  [ "$skipped" -eq 0 ] || fail "$skipped kernel tests skipped on a GPU machine"
else
  fail "kernel tests"
  grep -E "FAILED|Failure|error" "$log" | head -30 | tee -a "$report"
fi

section "3b. tiny GPT on kernels/cuda"
if ! run_logged "$gpt_train" --backend cuda "${tiny[@]}" --losses "$results/losses_cuda.txt" \
  | grep -E "^(backend|summary)" | tee -a "$report"; then
  fail "tiny GPT on cuda"
fi

section "4. cuBLASLt bf16 GEMM peak, HBM bandwidth and the attention GEMMs' share of it (the [cluster] keys twin sim takes)"
peak=0
# On an A100 the attention fraction checks the cited 0.64, read from Megatron's whole attention (sim/cost_model.cpp).
if run_logged "$gemm_peak" | grep -E "^(device|gemm|peak|hbm|attention|#)" | tee -a "$report"; then
  peak=$(grep "^peak_tflops" "$log" | tail -1 | awk '{print $2}')
else
  fail "GEMM peak"
fi
# The cost model has one GEMM efficiency, tile and wave quantization aside (sim/cost_model.cpp); whether a short inner
# dimension loses more (the epilogue after each tile's main loop: docs/accuracy.md, "What the model leaves out") shows
# at M = N = 8192, where every K has the same tiles and waves.
say "GEMM rate against K at M = N = 8192:"
k_sweep=()
for k in 1024 2048 4096 8192 16384 32768; do k_sweep+=(8192 8192 "$k"); done
run_logged "$gemm_peak" "${k_sweep[@]}" | grep "^gemm" | tee -a "$report" || fail "GEMM rate against K"

section "5. ~1.1B GPT (20 layers, 2048 hidden, 16 heads, seq 2048, vocab 50257) on one GPU"
big=(--backend cuda --layers 20 --channels 2048 --heads 16 --seq 2048 --vocab 50257 --steps 10 --timing-warmup 3
  --peak-tflops "${peak:-0}")
if ! run_logged "$gpt_train" "${big[@]}" --batch 8 | grep -E "^(backend|step|summary)" \
  | tee -a "$report"; then
  say "batch 8 failed (memory?); trying batch 4"
  run_logged "$gpt_train" "${big[@]}" --batch 4 | grep -E "^(backend|step|summary)" \
    | tee -a "$report" || fail "1B GPT"
fi
mfu=$(grep "^summary: backend cuda" "$report" | tail -1 | grep -o "mfu_vs_measured_peak [0-9.]*" | awk '{print $2}')
if [ -n "$mfu" ]; then
  awk -v m="$mfu" 'BEGIN { exit !(m >= 40.0) }' || fail "1B GPT MFU ${mfu}% < 40%"
fi

section "6. the executor on the CUDA backend"
if [[ " ${optional[*]} " != *" twin_exec_cuda_tests "* ]]; then
  say "exec/cuda is not in the build (exec/CMakeLists.txt does not add it yet): skipped"
elif ! wait "$optional_pid" || [ "$(cat "$build/optional_build.rc" 2>/dev/null)" != 0 ]; then
  fail "build of ${optional[*]}"
  grep -E "error|FAILED" -A3 "$build/optional_build.log" | tail -20 | tee -a "$report"
else
  if run_logged "$(program twin_exec_cuda_tests)" --gtest_brief=1 \
    "--gtest_output=xml:$build/exec_cuda.xml" >/dev/null; then
    say "executor tests: $(grep -c 'result="completed"' "$build/exec_cuda.xml") passed," \
      "$(grep -c 'result="skipped"' "$build/exec_cuda.xml") skipped"
  else
    fail "executor tests"
    grep -E "Failure|FAILED|error" "$log" | tail -20 | tee -a "$report"
  fi
  twin=$(program twin)
  if [ -x "$twin" ] && "$twin" run --help 2>&1 | grep -q cuda; then
    run_twin() {  # name, then twin run flags
      local name=$1
      shift
      run_logged "$twin" run "$root/scenarios/gpt-tiny.toml" --steps 60 --quiet --json "$build/run_$name.json" \
        "$@" >/dev/null || fail "twin run ($name)"
    }
    run_twin cpu --backend cpu
    run_twin cuda --backend cuda
    run_twin cuda_tp2_pp2 --backend cuda --set parallel.tp=2 --set parallel.pp=2
    run_twin cuda_fsdp_dp2 --backend cuda --set framework.name=composer --set parallel.zero_stage=3 \
      --set parallel.dp=2
    # A checkpoint of tp=2 pp=2 at step 30, resumed on one rank (re-sharded, master weights included) to step 60.
    rm -rf "$build/ck_reshard"
    run_logged "$twin" run "$root/scenarios/gpt-tiny.toml" --steps 30 --quiet --backend cuda --set parallel.tp=2 \
      --set parallel.pp=2 --checkpoint "$build/ck_reshard" >/dev/null || fail "twin run (checkpoint to re-shard)"
    run_twin cuda_resharded --backend cuda --checkpoint "$build/ck_reshard"
    python3 - "$build" <<'PY' | tee -a "$report"
import json, os, sys
runs = {}
for name in ("cpu", "cuda", "cuda_tp2_pp2", "cuda_fsdp_dp2"):
    path = os.path.join(sys.argv[1], f"run_{name}.json")
    if os.path.exists(path):
        runs[name] = json.load(open(path))
if len(runs) < 4:
    print("twin run: some runs are missing:", sorted(runs))
    sys.exit(1)
cpu, cuda, split, fsdp = (runs[n]["losses"] for n in ("cpu", "cuda", "cuda_tp2_pp2", "cuda_fsdp_dp2"))
rel = lambda a, b: max(abs(x - y) / y for x, y in zip(a, b))
print(f"twin run gpt-tiny, 60 steps: loss cpu {cpu[0]:.4f} -> {cpu[-1]:.4f}, cuda {cuda[0]:.4f} -> {cuda[-1]:.4f}, "
      f"cuda tp2 pp2 {split[0]:.4f} -> {split[-1]:.4f}, cuda FSDP dp2 {fsdp[0]:.4f} -> {fsdp[-1]:.4f}")
print(f"  max relative difference: cuda/cpu {rel(cuda, cpu):.2e}, cuda tp2pp2/cuda {rel(split, cuda):.2e}, "
      f"cuda FSDP/cuda {rel(fsdp, cuda):.2e}; tokens/s cpu {runs['cpu']['tokens_per_s']:.0f} "
      f"cuda {runs['cuda']['tokens_per_s']:.0f}")
ok = rel(cuda, cpu) < 0.03 and rel(split, cuda) < 0.03 and rel(fsdp, cuda) < 0.03 and cuda[-1] < cuda[0]
resharded_path = os.path.join(sys.argv[1], "run_cuda_resharded.json")
if os.path.exists(resharded_path):
    resharded = json.load(open(resharded_path))
    tail = resharded["losses"]
    print(f"  re-sharded tp2 pp2 -> tp1 at step {resharded['first_step']}: losses {tail[0]:.4f} -> {tail[-1]:.4f}, "
          f"max relative difference to the tp2 pp2 run {rel(tail, split[resharded['first_step']:]):.2e}")
    ok = ok and resharded.get("resharded") is True and rel(tail, split[resharded["first_step"]:]) < 0.03
else:
    print("  re-sharded run missing")
    ok = False
print("executor loss curves " + ("agree" if ok else "DISAGREE"))
sys.exit(0 if ok else 1)
PY
    [ "${PIPESTATUS[0]}" -eq 0 ] || fail "executor loss curves"

    # One GPU, measured op by op: the cost model's prediction of the same Program is compared with it elsewhere.
    gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    case "$gpu_name" in
      *H200*) node=dgx-h200 ;;
      *H100*) node=dgx-h100 ;;
      *A100*80GB*) node=dgx-a100 ;;
      *A100*) node=dgx-a100-40gb ;;
      *) node="" ;;
    esac
    if [ -z "$node" ]; then
      say "GPU '$gpu_name' is no GPU of a DGX node twin describes: op-by-op trace skipped"
    elif run_logged "$twin" run "$root/scenarios/gpt-350m-h200.toml" --backend cuda --steps 4 --quiet \
      --set "cluster.node=\"$node\"" --trace "$results/measured_gpt-350m.trace.json" \
      --json "$results/measured_gpt-350m.json" >/dev/null; then
      python3 - "$results/measured_gpt-350m.json" <<'PY' | tee -a "$report"
import json, sys
run = json.load(open(sys.argv[1]))
times = run["iteration_time_s"]
print(f"gpt-350m on this GPU, cuda backend: {len(times)} steps, last {times[-1]:.4f} s, {run['tokens_per_s']:.0f} "
      f"tokens/s, measured {run['summary']['tflops_per_gpu']:.1f} TFLOP/s per GPU")
PY
      say "  op by op, where twin sim is built: twin sim gpt-350m-h200 --set 'cluster.node=\"$node\"' --granularity op" \
        "--trace predicted.json && twin compare predicted.json measured_gpt-350m.trace.json"
    else
      fail "twin run gpt-350m (cuda)"
    fi
  else
    say "twin run has no cuda backend yet (cli): skipped"
  fi
fi

section "3c. loss curves: cuda (bf16) against cpu (fp32)"
wait "$cpu_pid" || fail "tiny GPT on cpu (see tiny_cpu.log)"
cp "$build/tiny_cpu.log" "$results/tiny_cpu.log" 2>/dev/null
grep -E "^(backend|summary)" "$build/tiny_cpu.log" | tee -a "$report"
if [ -s "$results/losses_cpu.txt" ] && [ -s "$results/losses_cuda.txt" ]; then
  python3 - "$results/losses_cpu.txt" "$results/losses_cuda.txt" <<'PY' | tee -a "$report"
import sys
cpu = [float(x) for x in open(sys.argv[1])]
gpu = [float(x) for x in open(sys.argv[2])]
n = min(len(cpu), len(gpu))
rel = [abs(g - c) / c for c, g in zip(cpu, gpu)]
tail = lambda xs: sum(xs[-50:]) / len(xs[-50:])
print(f"steps {n}; loss at 1: cpu {cpu[0]:.4f} cuda {gpu[0]:.4f}; at {n}: cpu {cpu[n-1]:.4f} cuda {gpu[n-1]:.4f}")
print(f"mean of the last 50: cpu {tail(cpu):.4f} cuda {tail(gpu):.4f}; |relative difference| max over the first 10 "
      f"steps {max(rel[:10]):.2e}, mean over all {sum(rel) / n:.2e}")
for step in (1, 10, 50, 100, 200, 300):
    if step <= n:
        print(f"  step {step:4d}: cpu {cpu[step-1]:.4f}  cuda {gpu[step-1]:.4f}")
ok = n == 300 and max(rel[:10]) < 0.01 and abs(tail(gpu) - tail(cpu)) < 0.05 and tail(gpu) < cpu[0] - 1.0
print("loss curves " + ("follow each other" if ok else "DIVERGE"))
sys.exit(0 if ok else 1)
PY
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail "loss curves"
else
  fail "loss files missing"
fi

section "done in $((SECONDS - started)) s"
if [ ${#failures[@]} -eq 0 ]; then
  say "RESULT: PASS"
else
  say "RESULT: FAIL (${failures[*]})"
  exit 1
fi

#!/usr/bin/env bash
# NEEDS .deps/ PREPARED BEFOREHAND, on a machine with the Debian packages: ./scripts/prepare-gpu-deps.sh (the GPU
# machine has no -dev packages and no network). Without .deps/ this script stops at once.
#
# The CUDA side of twin on a real GPU (H200, H100 or A100) in one call, build included, within 8 minutes on an H200:
#   1. build the CUDA targets for this GPU's architecture only (CUDA toolkit + .deps/)
#   2. every CUDA kernel against its CPU twin (tests/kernels_cuda; none may be skipped here), the fused attention
#      against its CPU mirror among them
#   3. the executor on the CUDA backend: its tests (twin_exec_cuda_tests: backend against the CPU backend, staging
#      and NCCL communicators, training), then parity: twin run gpt-tiny on the cpu backend, on cuda, and on cuda with
#      tp=2 pp=2 (4 ranks sharing the GPU): the loss curves must follow each other; then context parallelism: a
#      tiny Llama at cp=2 (2 ranks sharing the GPU) under each way (all_gather, p2p, a2a), cpu against cuda;
#      and a tiny MoE (gpt-tiny with 4 experts, top-2, a shared expert) on cpu, cuda, and cuda with dp=2 ep=2 (2 ranks
#      sharing the GPU: the dispatch and combine all-to-alls), loss curves following each other
#   4. the cuBLASLt bf16 GEMM peak, the HBM bandwidth, the unfused attention GEMMs' share of it, the fused attention's
#      TFLOP/s (the [cluster] keys twin sim takes), and the GEMM rate against K (GEMMs only)
#   5. a ~1.1B GPT step through the executor (bench/gpu/gpt-1b-h200.toml, twin run --backend cuda): MFU against the
#      DATASHEET peak (989 TFLOP/s dense bf16 for H100/H200 SXM, 312 for A100; gate: MFU_GATE, 50 % by default), the
#      share of the step and the TFLOP/s of each kernel kind (bench/gpu/step_report.py), and its trace for twin compare
#   6. FP8 (sm_90 and later, else skipped): cuBLASLt's FP8 GEMM rate beside the bf16 one at 8192^3
#      (twin_fp8_gemm_peak), and twin run gpt-tiny with model.fp8 = "hybrid" on cuda against cpu
# Numbers go to $OUT/gpu_check.txt (or build-gpu/gpu_check.txt without $OUT), the full log beside it. Exit status 0
# only when every section passed.
#
# On this workplace's device tool, after ./scripts/prepare-gpu-deps.sh here:
#   run(command="bash bench/gpu_check.sh", carry=[".deps"], timeout_s=540)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
if [ ! -d "$root/.deps/include" ]; then
  echo "gpu_check: .deps/ is missing: run ./scripts/prepare-gpu-deps.sh on a machine with the Debian packages first," \
    "then carry .deps here" >&2
  exit 2
fi
build=$root/build-gpu
results=${OUT:-$build}
mkdir -p "$build" "$results"
report=$results/gpu_check.txt
log=$results/gpu_check.log
: >"$report"
: >"$log"
started=$SECONDS
failures=()
mfu_gate=${MFU_GATE:-50}

say() { echo "$*" | tee -a "$report"; }
section() { say ""; say "== $* ($((SECONDS - started)) s)"; }
fail() { failures+=("$1"); say "FAIL: $1"; }
run_logged() { "$@" 2>&1 | tee -a "$log"; return "${PIPESTATUS[0]}"; }
finish() {
  section "done in $((SECONDS - started)) s"
  if [ ${#failures[@]} -eq 0 ]; then
    say "RESULT: PASS"
    exit 0
  fi
  say "RESULT: FAIL (${failures[*]})"
  exit 1
}

section "machine"
gpu_name=""
capability=""
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap,clocks.sm,clocks.max.sm --format=csv \
    | tee -a "$report"
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  capability=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
else
  say "nvidia-smi not found"
fi
say "nvcc: $(nvcc --version | tail -1)   cmake: $(cmake --version | head -1)   cores: $(nproc)"
# The node twin describes, and its GPU's datasheet bf16 dense peak (topology/hardware.cpp cites the datasheets: H100
# and H200 SXM 1,979 TFLOPS with sparsity, 989 dense; A100 312).
case "$gpu_name" in
  *H200*) node=dgx-h200 peak_tflops=989 ;;
  *H100*) node=dgx-h100 peak_tflops=989 ;;
  *A100*80GB*) node=dgx-a100 peak_tflops=312 ;;
  *A100*) node=dgx-a100-40gb peak_tflops=312 ;;
  *) node="" peak_tflops=0 ;;
esac
say "node: ${node:-none twin describes}, datasheet peak ${peak_tflops} TFLOP/s dense bf16"

section "1. build (CUDA architecture ${capability:-80;90})"
# bench/gpu/standalone wraps the project and adds tests/kernels_cuda and bench/gpu if the project does not
configure=(cmake -G Ninja -S "$root/bench/gpu/standalone" -B "$build" "-DTWIN_ROOT=$root" -DCMAKE_BUILD_TYPE=Release
  -DTWIN_BUILD_TESTS=ON -DTWIN_BUILD_BENCH=ON "-DCMAKE_CUDA_ARCHITECTURES=${capability:-80;90}"
  -DCMAKE_POLICY_VERSION_MINIMUM=3.5 "-DTWIN_DEPS_DIR=$root/.deps")
targets=(twin_kernels_cuda_tests twin_exec_cuda_tests twin twin_gemm_peak twin_fp8_gemm_peak)
if ! run_logged "${configure[@]}" >/dev/null; then
  fail "configure (see gpu_check.log)"
  tail -40 "$log"
  finish
fi
for target in "${targets[@]}"; do
  ninja -C "$build" -t targets all | grep -q "^$target:" || { fail "$target is not in the build"; finish; }
done
if ! run_logged ninja -C "$build" "${targets[@]}" >/dev/null; then
  fail "build (see gpu_check.log)"
  grep -E "error|FAILED" -A3 "$log" | head -40 | tee -a "$report"
  finish
fi
say "built ${targets[*]} in $((SECONDS - started)) s"
program() { find "$build/" -name "$1" -type f -perm -u+x -not -path "*/CMakeFiles/*" | head -1; }
twin=$(program twin)

# The CPU reference of the parity check runs in the background while the GPU works (gpt-tiny, 60 steps: seconds).
tiny=("$root/scenarios/gpt-tiny.toml" --steps 60 --quiet)
"$twin" run "${tiny[@]}" --backend cpu --json "$build/run_cpu.json" >"$build/run_cpu.log" 2>&1 &
cpu_pid=$!
# and step 6's FP8 reference (sm_90 and later), also in the background
fp8_tiny=("$root/scenarios/gpt-tiny.toml" --steps 60 --quiet --set 'model.dtype="bf16"' --set 'model.fp8="hybrid"')
if [ -n "$capability" ] && [ "$capability" -ge 90 ]; then
  "$twin" run "${fp8_tiny[@]}" --backend cpu --json "$build/run_fp8_cpu.json" >"$build/run_fp8_cpu.log" 2>&1 &
  fp8_cpu_pid=$!
fi
tiny_moe=("$root/scenarios/gpt-tiny.toml" --steps 30 --quiet --set model.experts=4 --set model.top_k=2
  --set model.moe_ffn_hidden=256 --set model.shared_experts=1)
"$twin" run "${tiny_moe[@]}" --backend cpu --json "$build/run_moe_cpu.json" >"$build/run_moe_cpu.log" 2>&1 &
moe_cpu_pid=$!

section "2. CUDA kernels against their CPU twins"
if timeout 180 "$(program twin_kernels_cuda_tests)" --gtest_brief=1 "--gtest_output=xml:$results/kernels_cuda.xml" \
  >>"$log" 2>&1; then
  passed=$(grep -c 'result="completed"' "$results/kernels_cuda.xml")
  skipped=$(grep -c 'result="skipped"' "$results/kernels_cuda.xml")
  say "kernel tests: $passed passed, $skipped skipped"
  [ "$skipped" -eq 0 ] || fail "$skipped kernel tests skipped on a GPU machine"
else
  fail "kernel tests"
  grep -E "FAILED|Failure|error" "$log" | head -30 | tee -a "$report"
fi

section "3a. the executor's tests on the CUDA backend"
if timeout 180 "$(program twin_exec_cuda_tests)" --gtest_brief=1 "--gtest_output=xml:$results/exec_cuda.xml" \
  >>"$log" 2>&1; then
  say "executor tests: $(grep -c 'result="completed"' "$results/exec_cuda.xml") passed," \
    "$(grep -c 'result="skipped"' "$results/exec_cuda.xml") skipped"
else
  fail "executor tests"
  grep -E "Failure|FAILED|error" "$log" | tail -20 | tee -a "$report"
fi

section "3b. parity: twin run gpt-tiny, 60 steps, on cpu, cuda and cuda tp=2 pp=2"
run_logged timeout 120 "$twin" run "${tiny[@]}" --backend cuda --json "$build/run_cuda.json" >/dev/null \
  || fail "twin run gpt-tiny (cuda)"
run_logged timeout 120 "$twin" run "${tiny[@]}" --backend cuda --set parallel.tp=2 --set parallel.pp=2 \
  --json "$build/run_cuda_tp2_pp2.json" >/dev/null || fail "twin run gpt-tiny (cuda, tp=2 pp=2)"
wait "$cpu_pid" || fail "twin run gpt-tiny (cpu, see run_cpu.log)"
python3 - "$build" <<'PY' | tee -a "$report"
import json, os, sys
runs = {}
for name in ("cpu", "cuda", "cuda_tp2_pp2"):
    path = os.path.join(sys.argv[1], f"run_{name}.json")
    if os.path.exists(path):
        runs[name] = json.load(open(path))
if len(runs) < 3:
    print("parity: runs missing:", sorted(set(("cpu", "cuda", "cuda_tp2_pp2")) - set(runs)))
    sys.exit(1)
cpu, cuda, split = (runs[n]["losses"] for n in ("cpu", "cuda", "cuda_tp2_pp2"))
rel = lambda a, b: max(abs(x - y) / y for x, y in zip(a, b))
print(f"loss cpu {cpu[0]:.4f} -> {cpu[-1]:.4f}, cuda {cuda[0]:.4f} -> {cuda[-1]:.4f}, "
      f"cuda tp2 pp2 {split[0]:.4f} -> {split[-1]:.4f}")
print(f"max relative difference: cuda/cpu {rel(cuda, cpu):.2e}, cuda tp2pp2/cpu {rel(split, cpu):.2e}, "
      f"cuda tp2pp2/cuda {rel(split, cuda):.2e} (bf16 against fp32: within 3e-2)")
ok = rel(cuda, cpu) < 0.03 and rel(split, cpu) < 0.03 and rel(split, cuda) < 0.03 and cuda[-1] < cuda[0]
print("parity " + ("holds" if ok else "FAILS"))
sys.exit(0 if ok else 1)
PY
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "parity of the loss curves"

section "3c. context parallelism: a tiny Llama at cp=2 (2 ranks sharing the GPU), each way, on cpu and cuda"
# gpt-tiny made a Llama (RMSNorm, SwiGLU, rotary embeddings, 2 kv heads for 4 query heads), 30 steps under each
# framework.cp_comm; the CPU references run in the background while the GPU works.
llama=("$root/scenarios/gpt-tiny.toml" --steps 30 --quiet --set parallel.cp=2 --set 'model.norm="rmsnorm"'
  --set 'model.activation="swiglu"' --set 'model.position_embedding="rope"' --set model.kv_heads=2
  --set model.linear_bias=false --set framework.tied_embeddings=false --set 'framework.attention="flash2"')
cp_pids=()
for way in all_gather p2p a2a; do
  "$twin" run "${llama[@]}" --set "framework.cp_comm=\"$way\"" --backend cpu --json "$build/run_cp2_${way}_cpu.json" \
    >"$build/run_cp2_${way}_cpu.log" 2>&1 &
  cp_pids+=($!)
done
for way in all_gather p2p a2a; do
  run_logged timeout 120 "$twin" run "${llama[@]}" --set "framework.cp_comm=\"$way\"" --backend cuda \
    --json "$build/run_cp2_${way}_cuda.json" >/dev/null || fail "twin run llama cp=2 $way (cuda)"
done
for pid in "${cp_pids[@]}"; do wait "$pid" || fail "twin run llama cp=2 (cpu, see run_cp2_*_cpu.log)"; done
python3 - "$build" <<'PY' | tee -a "$report"
import json, os, sys
ok = True
for way in ("all_gather", "p2p", "a2a"):
    paths = [os.path.join(sys.argv[1], f"run_cp2_{way}_{backend}.json") for backend in ("cpu", "cuda")]
    if not all(os.path.exists(p) for p in paths):
        print(f"cp=2 {way}: a run is missing")
        ok = False
        continue
    cpu, cuda = (json.load(open(p))["losses"] for p in paths)
    rel = max(abs(x - y) / y for x, y in zip(cuda, cpu))
    good = len(cuda) == len(cpu) and rel < 0.03 and cuda[-1] < cuda[0]
    ok = ok and good
    print(f"cp=2 {way}: loss cpu {cpu[0]:.4f} -> {cpu[-1]:.4f}, cuda {cuda[0]:.4f} -> {cuda[-1]:.4f}, "
          f"max relative difference {rel:.2e} (bf16 against fp32: within 3e-2) {'ok' if good else 'FAILS'}")
print("context-parallel parity " + ("holds" if ok else "FAILS"))
sys.exit(0 if ok else 1)
PY
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "context-parallel parity of the loss curves"

section "3d. MoE: twin run gpt-tiny with 4 experts (top-2, a shared one), 30 steps, on cpu, cuda, cuda dp=2 ep=2"
run_logged timeout 120 "$twin" run "${tiny_moe[@]}" --backend cuda --json "$build/run_moe_cuda.json" >/dev/null \
  || fail "twin run gpt-tiny MoE (cuda)"
run_logged timeout 120 "$twin" run "${tiny_moe[@]}" --backend cuda --set parallel.dp=2 --set parallel.ep=2 \
  --json "$build/run_moe_cuda_dp2_ep2.json" >/dev/null || fail "twin run gpt-tiny MoE (cuda, dp=2 ep=2)"
wait "$moe_cpu_pid" || fail "twin run gpt-tiny MoE (cpu, see run_moe_cpu.log)"
python3 - "$build" <<'PY' | tee -a "$report"
import json, os, sys
names = ("moe_cpu", "moe_cuda", "moe_cuda_dp2_ep2")
runs = {}
for name in names:
    path = os.path.join(sys.argv[1], f"run_{name}.json")
    if os.path.exists(path):
        runs[name] = json.load(open(path))
if len(runs) < 3:
    print("MoE parity: runs missing:", sorted(set(names) - set(runs)))
    sys.exit(1)
cpu, cuda, split = (runs[n]["losses"] for n in names)
aux_cpu, aux_cuda = (runs[n]["aux_losses"] for n in names[:2])
rel = lambda a, b: max(abs(x - y) / y for x, y in zip(a, b))
print(f"MoE loss cpu {cpu[0]:.4f} -> {cpu[-1]:.4f}, cuda {cuda[0]:.4f} -> {cuda[-1]:.4f}, "
      f"cuda dp2 ep2 {split[0]:.4f} -> {split[-1]:.4f}; load-balancing loss cpu {aux_cpu[-1]:.4f}, cuda {aux_cuda[-1]:.4f}")
print(f"max relative difference: cuda/cpu {rel(cuda, cpu):.2e}, cuda dp2ep2/cpu {rel(split, cpu):.2e}, "
      f"cuda dp2ep2/cuda {rel(split, cuda):.2e} (bf16 against fp32: within 3e-2); "
      f"load-balancing loss cuda/cpu {rel(aux_cuda, aux_cpu):.2e} (within 1e-1)")
ok = (rel(cuda, cpu) < 0.03 and rel(split, cpu) < 0.03 and rel(split, cuda) < 0.03 and cuda[-1] < cuda[0]
      and rel(aux_cuda, aux_cpu) < 0.1)
print("MoE parity " + ("holds" if ok else "FAILS"))
sys.exit(0 if ok else 1)
PY
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "MoE parity of the loss curves"

section "4. GEMM peak, HBM bandwidth, attention (the [cluster] keys twin sim takes)"
gemm_peak=$(program twin_gemm_peak)
run_logged timeout 120 "$gemm_peak" | grep -E "^(device|gemm|peak|hbm|attention|flash|#|[a-z_]+ =)" \
  | tee -a "$report" || fail "GEMM peak"
# The cost model has one GEMM efficiency, tile and wave quantization aside (sim/cost_model.cpp); whether a short inner
# dimension loses more shows at M = N = 8192, where every K has the same tiles and waves. GEMMs only.
say "GEMM rate against K at M = N = 8192:"
k_sweep=()
for k in 1024 2048 4096 8192 16384 32768; do k_sweep+=(8192 8192 "$k"); done
run_logged timeout 60 "$gemm_peak" "${k_sweep[@]}" | grep "^gemm" | tee -a "$report" || fail "GEMM rate against K"
# The MAMF rates twin cites are bursts; a training step's GEMMs run back to back, at the board's power limit
# (docs/accuracy.md, "A lead for Blackwell"): 20 s of one 8192^3 GEMM, its first and its settled rate.
say "GEMM rate sustained for 20 s (8192^3, bf16):"
run_logged timeout 60 "$gemm_peak" --sustained 20 | grep -E "^(burst|sustained_)" | tee -a "$report" \
  || fail "sustained GEMM rate"

section "5. ~1.1B GPT step through the executor (bench/gpu/gpt-1b-h200.toml): MFU against the datasheet peak"
if [ -z "$node" ]; then
  fail "GPU '$gpu_name' is no GPU of a node twin describes: no datasheet peak"
else
  big=("$root/bench/gpu/gpt-1b-h200.toml" --backend cuda --steps 6 --quiet --set "cluster.node=\"$node\""
    --peak-gflops "${peak_tflops}000" --json "$results/gpt-1b.json" --trace "$results/measured_gpt-1b.trace.json")
  tokens=$((8 * 2048))
  if ! run_logged timeout 240 "$twin" run "${big[@]}" >/dev/null; then  # an 80 GB GPU: half the batch
    say "8 sequences failed (memory?): 4"
    tokens=$((4 * 2048))
    run_logged timeout 240 "$twin" run "${big[@]}" --set parallel.micro_batch=4 --set parallel.global_batch=4 \
      >/dev/null || fail "twin run gpt-1b (cuda)"
  fi
  if [ -s "$results/gpt-1b.json" ]; then
    python3 "$root/bench/gpu/step_report.py" "$results/gpt-1b.json" "$results/measured_gpt-1b.trace.json" \
      --min-mfu "$mfu_gate" --tokens-per-step "$tokens" | tee -a "$report"
    [ "${PIPESTATUS[0]}" -eq 0 ] || fail "1B GPT MFU below ${mfu_gate} % of the datasheet peak"
    say "  op by op, where twin sim is built: twin sim bench/gpu/gpt-1b-h200.toml --set 'cluster.node=\"$node\"'" \
      "--granularity op --trace predicted.json && twin compare predicted.json measured_gpt-1b.trace.json"
  fi
fi

section "6. FP8 (sm_90 and later): the FP8 GEMM rate beside bf16's, gpt-tiny in FP8 on cuda against cpu"
if [ -z "$capability" ] || [ "$capability" -lt 90 ]; then
  say "skipped: the cuda backend's FP8 GEMMs need sm_90 or later (this GPU is sm_${capability:-unknown})"
else
  run_logged timeout 60 "$(program twin_fp8_gemm_peak)" 8192 8192 8192 | grep -E "^(gemm|fp8)" | tee -a "$report"
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail "FP8 GEMM rate"
  run_logged timeout 120 "$twin" run "${fp8_tiny[@]}" --backend cuda --json "$build/run_fp8_cuda.json" >/dev/null \
    || fail "twin run gpt-tiny fp8 (cuda)"
  wait "$fp8_cpu_pid" || fail "twin run gpt-tiny fp8 (cpu, see run_fp8_cpu.log)"
  python3 - "$build" <<'PY' | tee -a "$report"
import json, os, sys
paths = [os.path.join(sys.argv[1], f"run_fp8_{name}.json") for name in ("cpu", "cuda")]
if not all(os.path.exists(p) for p in paths):
    print("fp8 parity: a run is missing")
    sys.exit(1)
cpu, cuda = (json.load(open(p))["losses"] for p in paths)
worst = max(abs(x - y) / y for x, y in zip(cuda, cpu))
print(f"fp8 hybrid loss cpu {cpu[0]:.4f} -> {cpu[-1]:.4f}, cuda {cuda[0]:.4f} -> {cuda[-1]:.4f}; "
      f"max relative difference {worst:.2e} (FP8 on bf16 against FP8 on fp32: within 3e-2)")
ok = worst < 0.03 and cuda[-1] < cuda[0]
print("fp8 parity " + ("holds" if ok else "FAILS"))
sys.exit(0 if ok else 1)
PY
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail "parity of the FP8 loss curves"
fi

finish

// The measured FP8 GEMMs. Per-tensor scaling: S. Bekman, "Machine Learning Engineering Open Book" (github.com/stas00/
// ml-engineering), compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table", FP8
// (float8_e4m3fn): the best of mamf-finder.py's shape search, each GEMM a torch._scaled_mm with one scale per operand
// (cuBLASLt's FP8 GEMM; compute/accelerator/benchmarks/mamf-finder.py), mean of 100 runs after 50 warm-up.
#include "sim/fp8_gemm.hpp"

#include <stdexcept>
#include <string>

namespace twin::sim {

namespace {

bool starts_with(const std::string& name, std::string_view prefix) {
  return name.rfind(prefix, 0) == 0;
}

// torch._scaled_mm, per-tensor scales (the MAMF table above).
constexpr Fp8GemmMeasurement kH100Tensorwise{1402.6e12, 1024, 9216, 14336,
                                             "H100 SXM, torch 2.7.0+cu126 _scaled_mm (Bekman's MAMF table, FP8)"};
constexpr Fp8GemmMeasurement kH200Tensorwise{1453.4e12, 1280, 4096, 12032,
                                             "H200 SXM, torch 2.7.1+cu128 _scaled_mm (Bekman's MAMF table, FP8)"};
constexpr Fp8GemmMeasurement kB200Tensorwise{3432.5e12, 15360, 4096, 3072,
                                             "B200 SXM, torch 2.7.1+cu128 _scaled_mm (Bekman's MAMF table, FP8)"};
constexpr Fp8GemmMeasurement kGb200Tensorwise{
    3615.6e12, 19456, 5120, 1536, "GB200, torch 2.10.0.dev20250916+cu130 _scaled_mm (Bekman's MAMF table, FP8)"};
// 1 x 128 activation tiles, 128 x 128 weight blocks on Hopper: DeepGEMM (github.com/deepseek-ai/DeepGEMM, README at
// its first release, "Normal GEMMs for dense models", H800 with NVCC 12.8), its largest dense shape: M 4096, N 7168,
// K 16384 at 1358 TFLOPS, 1.2x the authors' CUTLASS 3.6 kernel. The H800 is H100 SXM5's GH100 at the same clocks.
constexpr Fp8GemmMeasurement kHopperBlockwise{1358e12, 4096, 7168, 16384,
                                              "H800 SXM5, DeepGEMM (NVCC 12.8), 1x128 / 128x128 block scales"};

// Blackwell's block-scaled GEMMs against its per-tensor ones, measured: Transformer Engine's GEMM profiling guide
// (NVIDIA/TransformerEngine docs/examples/gemm_profiling/gemm_profiling.rst at 1609c890e, June 2026, "Autocast vs
// Pre-quantized"), benchmarks/gemm/benchmark_gemm.py --pre-quantize on a B300 SXM6 (hidden 4096, intermediate 16384,
// 15,872 tokens: its 12 Fprop, Dgrad and Wgrad GEMMs of a layer, inputs quantized before the timed loop, so each time
// is the GEMM as TE issues it, the MXFP8 scales' swizzle included): FP8 CurrentScaling 6.812 ms a layer, MXFP8
// 7.161 ms. The B300 is the only Blackwell part measured there; its FP8 tensor cores are the B200's generation.
constexpr double kBlockScaledOverPerTensor = 6.812 / 7.161;

}  // namespace

Fp8GemmMeasurement fp8_gemm_measurement(const topology::GpuSpec& gpu, model::Fp8Recipe recipe) {
  if (gpu.fp8_flops <= 0) {
    throw std::invalid_argument("model.fp8: the " + gpu.name + " has no FP8 tensor cores (Hopper and later do)");
  }
  const bool hopper = gpu.compute_capability == 90;
  if (hopper && recipe == model::Fp8Recipe::Mxfp8) {
    throw std::invalid_argument("framework.fp8_recipe = \"mxfp8\" needs Blackwell's block-scaled tensor cores; the " +
                                gpu.name + " has none (delayed, tensorwise or blockwise run on it)");
  }
  if (hopper && recipe == model::Fp8Recipe::Blockwise) return kHopperBlockwise;
  Fp8GemmMeasurement measured;
  if (starts_with(gpu.name, "H100")) {
    measured = kH100Tensorwise;
  } else if (starts_with(gpu.name, "H200")) {
    measured = kH200Tensorwise;
  } else if (starts_with(gpu.name, "H800")) {
    measured = kH100Tensorwise;  // the same GH100 at the same clocks: only its NVLink differs
    measured.source = "H100 SXM's measurement (the H800 is the same GH100; Bekman's MAMF table, FP8)";
    measured.assumed = true;
  } else if (starts_with(gpu.name, "B200")) {
    measured = kB200Tensorwise;
  } else if (starts_with(gpu.name, "GB200")) {
    measured = kGb200Tensorwise;
  } else {
    throw std::invalid_argument("no measured FP8 GEMM for the " + gpu.name);
  }
  if (!hopper && recipe != model::Fp8Recipe::Delayed && recipe != model::Fp8Recipe::Tensorwise) {
    // Blackwell's tensor cores apply block scales inside the MMA (cuBLAS 12.9's block-scaled FP8 matmuls); TE runs
    // FP8 block scaling there as MXFP8 (the same guide: "FP8 Block is emulated via MXFP8"). The per-tensor
    // measurement at the ratio above: the B300's, taken for every Blackwell part.
    measured.flops_per_s *= kBlockScaledOverPerTensor;
    measured.source = "the per-tensor rate x 6.812 / 7.161, TE's pre-quantized MXFP8 against FP8 CurrentScaling "
                      "GEMMs of a layer on a B300 (docs/examples/gemm_profiling)";
    measured.assumed = true;
  }
  return measured;
}

}  // namespace twin::sim

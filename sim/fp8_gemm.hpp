// What an FP8 GEMM achieves, measured: the rates the analytical cost model times FP8 GEMMs at (the way it times
// 16-bit GEMMs at a measured large GEMM's rate, sim/cost_model.cpp), by GPU and by the recipe's scaling, which
// decides the kernel: per-tensor scales (delayed, tensorwise) run cuBLASLt's FP8 GEMM, 1 x 128 / 128 x 128 block
// scales on Hopper a kernel that promotes partial sums to fp32 on the CUDA cores (DeepGEMM, cuBLAS 12.9), MXFP8 the
// block-scaled tensor cores of Blackwell (5 % slower than its per-tensor GEMMs in Transformer Engine's measurement).
#pragma once

#include <string_view>

#include "model/scenario/precision.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {

struct Fp8GemmMeasurement {
  double flops_per_s = 0;
  double m = 0, n = 0, k = 0;  // the GEMM measured: [m, k] x [k, n]
  std::string_view source;     // who measured it, with what software
  bool assumed = false;        // true: another recipe's (or part's) measurement, said why in the source
};

// The measured FP8 GEMM of `gpu` under `recipe`. Throws std::invalid_argument naming the GPU for a part without FP8
// tensor cores (A100) and for MXFP8 on Hopper (its tensor cores have no block scaling).
Fp8GemmMeasurement fp8_gemm_measurement(const topology::GpuSpec& gpu, model::Fp8Recipe recipe);

}  // namespace twin::sim

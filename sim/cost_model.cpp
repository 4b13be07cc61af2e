#include "sim/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace twin::sim {

namespace {

// Compute time of `count` GEMMs [m,k]x[k,n] at `efficiency` of `peak`, with tile and wave quantization: every CTA
// computes one whole tile per wave, and each wave occupies all SMs for one tile's time.
double quantized_time_s(double m, double n, double k, double count, double peak, double efficiency, int sm_count,
                        const std::vector<GemmTile>& tiles) {
  if (m <= 0 || n <= 0 || k <= 0 || count <= 0) return 0;
  // A dimension narrower than every tile: cuBLAS switches to narrow-tile (GEMV-like) kernels, which we take to lose
  // nothing to quantization; such GEMMs end up memory bound anyway.
  int narrowest = std::numeric_limits<int>::max();
  for (const GemmTile& tile : tiles) narrowest = std::min({narrowest, tile.rows, tile.cols});
  if (std::min(m, n) < narrowest) return 2 * m * n * k * count / (peak * efficiency);
  double best = std::numeric_limits<double>::infinity();
  for (const GemmTile& tile : tiles) {
    const double tiles_total = std::ceil(m / tile.rows) * std::ceil(n / tile.cols) * count;
    const double waves = std::ceil(tiles_total / sm_count);
    best = std::min(best, waves * sm_count * 2.0 * tile.rows * tile.cols * k / (peak * efficiency));
  }
  return best;
}

// A measured best-case GEMM: `flops_per_s` achieved on an m x n x k bf16 matmul.
struct GemmMeasurement {
  double flops_per_s, m, n, k;
};

// The efficiency left once the measurement's own tile/wave quantization is accounted for.
double base_efficiency(const topology::GpuSpec& gpu, const GemmMeasurement& measured,
                       const std::vector<GemmTile>& tiles) {
  const double peak = gpu.bf16_flops;
  const double quantized = quantized_time_s(measured.m, measured.n, measured.k, 1, peak, 1.0, gpu.sm_count, tiles);
  const double achieved = 2 * measured.m * measured.n * measured.k / measured.flops_per_s;
  return std::min(1.0, quantized / achieved);
}

}  // namespace

AnalyticalParameters analytical_parameters(const topology::GpuSpec& gpu) {
  AnalyticalParameters p;
  // CTA tiles: NVIDIA Deep Learning Performance Guide, "Matrix Multiplication Background" (tile quantization):
  // cuBLAS's most efficient tiles are 256x128 and 128x256, then 128x128; smaller ones are used for small GEMMs and
  // are less efficient, so only these three are considered.
  p.tiles = {{256, 128}, {128, 256}, {128, 128}};
  // HBM: STREAM-style copy kernels reach about 90% of the datasheet bandwidth on HBM2e/HBM3 GPUs. An assumption,
  // not a measurement of ours: the first number to replace when a GPU measurement lands in bench/.
  p.hbm_efficiency = 0.90;
  // Launch: back-to-back dependent kernels leave a gap of a few microseconds (NVIDIA Technical Blog, "Getting Started
  // with CUDA Graphs", 2019, measures ~2-4 us per kernel of launch overhead); 2 us per kernel.
  p.kernel_launch_s = 2e-6;
  // Large-GEMM efficiency: the maximum achievable matmul FLOPs measured by mamf-finder.py (S. Bekman, "Machine
  // Learning Engineering Open Book", compute/accelerator/README.md, MAMF table, bf16, CUDA 12.x), divided by the
  // peak and by our model's own quantization loss at the measured shape.
  GemmMeasurement measured{};
  if (gpu.name.rfind("A100", 0) == 0) {
    measured = {267.9e12, 6912, 16384, 2048};  // A100 SXM: 267.9 TFLOPS (85.9% of 312)
  } else if (gpu.name.rfind("H100", 0) == 0) {
    measured = {792.1e12, 6144, 17920, 2816};  // H100 SXM: 792.1 TFLOPS (80.1% of 989)
  } else if (gpu.name.rfind("H200", 0) == 0) {
    // No H200 entry; GH200 (the same GH100 die with HBM3e): 821.0 TFLOPS (83.0% of 989).
    measured = {821.0e12, 11264, 19712, 1536};
  } else {
    throw std::invalid_argument("analytical cost model: no parameters for GPU '" + gpu.name + "'");
  }
  p.gemm_efficiency = base_efficiency(gpu, measured, p.tiles);
  return p;
}

AnalyticalCostModel::AnalyticalCostModel(topology::GpuSpec gpu)
    : gpu_(std::move(gpu)), parameters_(analytical_parameters(gpu_)) {}

AnalyticalCostModel::AnalyticalCostModel(topology::GpuSpec gpu, AnalyticalParameters parameters)
    : gpu_(std::move(gpu)), parameters_(std::move(parameters)) {}

double AnalyticalCostModel::memory_time_s(double bytes) const {
  return bytes / (gpu_.hbm_bytes_per_s * parameters_.hbm_efficiency);
}

double AnalyticalCostModel::gemm_time_s(double m, double n, double k, double count, model::DType dtype) const {
  const double compute = quantized_time_s(m, n, k, count, gpu_.peak_flops(dtype), parameters_.gemm_efficiency,
                                          gpu_.sm_count, parameters_.tiles);
  const double operand_bytes = model::dtype_bytes(dtype) * (m * k + k * n + m * n) * count;
  return std::max(compute, memory_time_s(operand_bytes));
}

double AnalyticalCostModel::op_time_s(const model::Scenario& scenario, const model::Op& op) const {
  using model::ComputeKind;
  using model::Phase;
  const model::DType dtype = scenario.model.dtype;
  const double launch = parameters_.kernel_launch_s;
  const bool backward = op.phase == Phase::Backward;
  const double m = static_cast<double>(op.gemm.m), n = static_cast<double>(op.gemm.n);
  const double k = static_cast<double>(op.gemm.k), count = static_cast<double>(op.gemm.count);

  if (op.what == ComputeKind::AttentionCore && count > 0) {
    // Half the GEMMs are Q K^T [s,d]x[d,s] (m=s, n=s, k=d), half P V [s,s]x[s,d] (m=s, n=d, k=s). Backward: the
    // gradients of both (dP: [s,d]x[d,s]; dV, dQ, dK: [s,s]x[s,d]).
    const double half = count / 2;
    const double score_like = gemm_time_s(m, n, k, half, dtype);
    const double value_like = gemm_time_s(m, k, n, half, dtype);
    const double gemms = backward ? score_like + 3 * value_like : score_like + value_like;
    const double operand_bytes = (backward ? 2 : 1) * model::dtype_bytes(dtype) * count * (m * k + k * n + m * n);
    const double softmax = memory_time_s(std::max(0.0, op.bytes - operand_bytes));
    return gemms + softmax + (backward ? 6 : 3) * launch;
  }
  if (count > 0) {
    if (backward) {
      // Input gradient dX = dY W^T: [m,n]x[n,k]; weight gradient dW = X^T dY: [k,m]x[m,n].
      return gemm_time_s(m, k, n, count, dtype) + gemm_time_s(k, n, m, count, dtype) + 2 * launch;
    }
    return gemm_time_s(m, n, k, count, dtype) + launch;
  }
  if (op.flops > 0) {
    // Matrix FLOPs without a shape: no quantization known.
    const double compute = op.flops / (gpu_.peak_flops(dtype) * parameters_.gemm_efficiency);
    return std::max(compute, memory_time_s(op.bytes)) + launch;
  }
  return memory_time_s(op.bytes) + launch;
}

double AnalyticalCostModel::compute_time_s(const model::Scenario& scenario, const model::Op& op) const {
  if (op.what != model::ComputeKind::TransformerLayer) return op_time_s(scenario, op);
  const auto key = std::make_pair(op.layer, static_cast<int>(op.phase));
  if (auto it = layer_cache_.find(key); it != layer_cache_.end()) return it->second;
  double total = 0;
  for (const model::Op& part : model::layer_compute_ops(scenario, op.layer, op.phase)) {
    total += op_time_s(scenario, part);
  }
  layer_cache_.emplace(key, total);
  return total;
}

double FixedCostModel::compute_time_s(const model::Scenario& /*scenario*/, const model::Op& op) const {
  if (op.what == model::ComputeKind::OptimizerStep) return optimizer_s_;
  if (op.what != model::ComputeKind::TransformerLayer) return 0;
  switch (op.phase) {
    case model::Phase::Forward:
      return forward_s_;
    case model::Phase::Backward:
      return backward_s_;
    case model::Phase::Recompute:
      return recompute_s_;
    case model::Phase::Optimizer:
      return optimizer_s_;
  }
  return 0;
}

}  // namespace twin::sim

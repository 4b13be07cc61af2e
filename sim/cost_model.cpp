#include "sim/cost_model.hpp"

#include "model/ops/host_issue.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string_view>
#include <vector>

#include <fmt/core.h>

#include "model/ops/compute_ops.hpp"
#include "model/ops/host_issue.hpp"
#include "sim/fp8_gemm.hpp"
#include "sim/te_host.hpp"

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

// What a GEMM takes at least: its FLOPs at the measured rate its efficiency came from (0 where none). The tile and
// wave model alone would run a GEMM whose tiles fill every wave faster than the measurement whenever the measured
// shape loses some of its own waves (H100 FP8: 1607 TFLOP/s against the 1402.6 measured at 1024 x 9216 x 14336). The
// H100 and later measurements are maximum achievable matmul FLOPS: the best of a brute-force search over shapes
// (mamf-finder.py; S. Bekman, "Machine Learning Engineering Open Book", compute/accelerator/benchmarks/README.md,
// whose suggested H100 range is M, N and K from 0 to 20480 in steps of 256), the ceiling no searched shape passed;
// so no GEMM runs faster than its measured rate, on every GPU (the A100's 8192^3 measurement fills its waves: there
// the ceiling and the tile model agree within 0.2 %).
double ceiling_s(double m, double n, double k, double count, double flops_per_s) {
  return flops_per_s > 0 ? 2 * m * n * k * count / flops_per_s : 0;
}

// A measured best-case GEMM: `flops_per_s` achieved on an m x n x k bf16 matmul.
struct GemmMeasurement {
  double flops_per_s, m, n, k;
};

// The efficiency left once the measurement's own tile/wave quantization is accounted for, against `peak` (the
// 16-bit tensor-core peak unless given).
double base_efficiency(const topology::GpuSpec& gpu, const GemmMeasurement& measured,
                       const std::vector<GemmTile>& tiles, double peak = 0) {
  if (peak <= 0) peak = gpu.bf16_flops;
  const double quantized = quantized_time_s(measured.m, measured.n, measured.k, 1, peak, 1.0, gpu.sm_count, tiles);
  const double achieved = 2 * measured.m * measured.n * measured.k / measured.flops_per_s;
  return std::min(1.0, quantized / achieved);
}

// An A100's streaming kernel reaches 1616 of its 2039 GB/s (the source is cited where analytical_parameters uses it).
constexpr double kA100StreamingFraction = 1616.0 / 2039.0;

// The attention core's batched GEMMs, measured: Dao et al., "FlashAttention" (NeurIPS 2022, arXiv:2205.14135),
// Appendix E.6, Table 20 ("Megatron" row): Megatron-LM's attention (baddbmm Q K^T, fused scale-softmax, bmm P V, the
// context's permute copy), forward + backward, no dropout and no mask, fp16, batch 16 x 8 heads, head dim 64,
// sequence 2048, on an A100-SXM4-40GB: 13.21 ms. The fused softmax is an elementwise kernel at the streaming rate
// (forward: read and write the scores; backward: read the output and its gradient, write the input gradient), so the
// six GEMMs (forward Q K^T and P V, backward dP, dV, dQ, dK: each writes or reads the scores once) take the rest.
// Why slower than streaming: a Q K^T tile has only d = 64 of K to compute before it stores its output, a P V tile is
// only d wide, so little of a GEMM's store or load overlaps its math. Checked, not used to derive it: the same rows
// with dropout (Table 17: 17.41 ms) and the forward and backward alone (Tables 18, 19), in
// tests/sim/framework_test.cpp (AttentionModel.*). Measured on the A100; assumed on H100 / H200.
struct AttentionMeasurement {
  double seconds, batch_heads, seq, head_dim;
};
constexpr AttentionMeasurement kMegatronAttentionA100{13.21e-3, 16 * 8, 2048, 64};

// FlashAttention, measured: T. Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work
// Partitioning" (arXiv:2307.08691), Section 4.1, Figure 4 (A100 80GB SXM4) and the same benchmark on an H100 80GB
// SXM5 (github.com/Dao-AILab/flash-attention, assets/flash2_a100_fwd_bwd_benchmark.png and
// flash2_h100_fwd_bwd_benchmark.png, the README's "Performance" section), panels (c) and (d), "With causal mask":
// forward + backward TFLOP/s of FlashAttention (v1) and FlashAttention-2 at sequence 512 to 16k (batch x sequence =
// 16k tokens, hidden 2048, fp16), counted as the benchmark counts them (benchmarks/benchmark_flash_attention.py):
// forward 4 b s^2 heads d / 2 under the causal mask (the kernels skip the tiles above the diagonal), backward 2.5
// times that (five GEMMs to the forward's two: it recomputes the scores). The forward and backward are timed at the
// same rate: Dao et al. 2022's Tables 18 and 19 (FlashAttention v1, A100 40GB, head dim 64, no mask) put them
// within 10 % of each other at sequence 2048 (57 and 63 TFLOP/s).
struct FlashAttentionRates {
  double d64[6], d128[6];  // TFLOP/s at sequence 512, 1k, 2k, 4k, 8k, 16k
};
constexpr double kFlashSequences[6] = {512, 1024, 2048, 4096, 8192, 16384};
constexpr FlashAttentionRates kFlash1A100{{58, 70, 77, 87, 92, 97}, {55, 62, 69, 76, 80, 83}};
constexpr FlashAttentionRates kFlash2A100{{88, 119, 140, 156, 165, 171}, {99, 133, 155, 173, 182, 189}};
constexpr FlashAttentionRates kFlash1H100{{104, 123, 136, 138, 149, 156}, {98, 109, 108, 126, 135, 137}};
constexpr FlashAttentionRates kFlash2H100{{141, 192, 232, 257, 273, 284}, {163, 221, 265, 294, 308, 328}};

}  // namespace

FlashAttentionRate flash_attention_rate(const topology::GpuSpec& gpu, model::AttentionKind kind, double seq,
                                        double head_dim) {
  if (kind == model::AttentionKind::Unfused) throw std::invalid_argument("flash_attention_rate: not a flash kernel");
  // H200 and H800: the H100's die and clocks (faster HBM, slower NVLink); the kernels are compute bound, so the
  // H100's rates. Blackwell (B200, GB200): no fused-attention measurement by sequence length was found published
  // (FlashAttention-4, Zadouri et al., arXiv:2603.05451, reports its forward's best, 1613 TFLOP/s on a B200): the
  // H100's rates scaled by the ratio of the 16-bit peaks, an assumption (sim/cost_model.cpp's note in
  // docs/accuracy.md).
  const bool hopper = gpu.compute_capability >= 90;
  const double scale = gpu.compute_capability >= 100 ? gpu.bf16_flops / topology::h100_sxm5_80gb().bf16_flops : 1.0;
  const bool v2 = kind == model::AttentionKind::Flash2;
  const FlashAttentionRates& rates = hopper ? (v2 ? kFlash2H100 : kFlash1H100) : (v2 ? kFlash2A100 : kFlash1A100);
  // Head dimensions: the measured 64 and 128. A kernel computes on its head-dimension block: FlashAttention's
  // Triton and CUDA v1 kernels on the next power of two (flash_attn_triton.py: BLOCK_HEADDIM = next_power_of_2(d)),
  // FlashAttention-2 on the next multiple of 32 (its kernels are instantiated for 32, 64, 96, ..., 256); beyond
  // 128 the d128 rate is assumed.
  FlashAttentionRate out;
  out.kernel_head_dim =
      v2 ? std::ceil(head_dim / 32) * 32 : (head_dim <= 64 ? 64.0 : std::pow(2.0, std::ceil(std::log2(head_dim))));
  const double* row = head_dim <= 64 ? rates.d64 : rates.d128;
  // Between measured sequence lengths, linear in log2(s); outside, the nearest measurement.
  const double x = std::clamp(std::log2(seq), std::log2(kFlashSequences[0]), std::log2(kFlashSequences[5]));
  const int i = std::min(4, static_cast<int>(std::floor(x - std::log2(kFlashSequences[0]))));
  const double f = x - std::log2(kFlashSequences[i]);
  out.flops_per_s = scale * 1e12 * (row[i] + f * (row[i + 1] - row[i]));
  return out;
}

namespace {

// The fraction of the streaming rate the attention GEMMs reach, from kMegatronAttentionA100 and the cited A100
// streaming rate (the 40GB part's bandwidth at the 80GB part's measured fraction, as analytical_parameters assumes):
// the measured time less the other kernels' (streaming) and every launch is the GEMMs'.
double attention_gemm_hbm_fraction_measured(double a100_hbm_efficiency, double kernel_launch_s) {
  const AttentionMeasurement& m = kMegatronAttentionA100;
  const double streaming = topology::a100_sxm4_40gb().hbm_bytes_per_s * a100_hbm_efficiency;
  const model::AttentionBenchmarkKernels k =
      model::unmasked_attention_kernels(m.batch_heads, m.seq, m.head_dim, 2, false);
  double gemm_bytes = 0, pass_bytes = 0;
  int launches = 0;
  for (const auto* pass : {&k.forward, &k.backward}) {
    for (const model::Kernel& kernel : *pass) {
      (kernel.kind == model::KernelKind::AttentionGemms ? gemm_bytes : pass_bytes) += kernel.bytes;
      launches += kernel.launches;
    }
  }
  const double elementwise_s = pass_bytes / streaming + launches * kernel_launch_s;
  const double gemm_streaming_s = gemm_bytes / streaming;
  return std::min(1.0, gemm_streaming_s / (m.seconds - elementwise_s));
}

}  // namespace

AnalyticalParameters analytical_parameters(const topology::GpuSpec& gpu) {
  AnalyticalParameters p;
  // CTA tiles: NVIDIA Deep Learning Performance Guide, "Matrix Multiplication Background" (tile quantization):
  // cuBLAS's most efficient tiles are 256x128 and 128x256, then 128x128; smaller ones are used for small GEMMs and
  // are less efficient, so only these three are considered.
  p.tiles = {{256, 128}, {128, 256}, {128, 128}};
  // HBM: the fraction of the datasheet bandwidth a streaming elementwise kernel reaches.
  //   A100 80GB: 0.79, measured: PyTorch `a * 1.2` on 4M fp32 elements runs at 0.202 TFLOP/s, i.e. 1616 GB/s of
  //   reads and writes (8 bytes per FLOP) of the datasheet's 2039 GB/s (M. Li, github.com/mli/transformers-benchmarks,
  //   README "Micro-Benchmarking Summary", VectorMul, micro_bench.ipynb, NGC PyTorch 22.07).
  //   A100 40GB (HBM2 at 1555 GB/s): the same fraction, assumed.
  //   H100 / H200 / H800, B200 / GB200: 0.90, an assumption (STREAM-style kernels reach about 90%); the first number
  //   to replace when a measurement lands in bench/.
  p.hbm_efficiency = gpu.name.rfind("A100", 0) == 0 ? kA100StreamingFraction : 0.90;
  // Launch: back-to-back dependent kernels leave a gap of a few microseconds (NVIDIA Technical Blog, "Getting Started
  // with CUDA Graphs", 2019, measures ~2-4 us per kernel of launch overhead); 2 us per kernel.
  p.kernel_launch_s = 2e-6;
  // Large-GEMM efficiency: a measured large GEMM, divided by the peak and by our model's own quantization loss at
  // the measured shape.
  //   A100: 230 TFLOP/s for a 8192 x 8192 x 8192 fp16 matmul in PyTorch (M. Li, github.com/mli/transformers-
  //   benchmarks, README "Micro-Benchmarking Summary", MatMul FP16 on an A100 80GB, NGC PyTorch 22.07: CUDA 11.7,
  //   cuBLAS 11.10), the CUDA 11 generation every published A100 run of scenarios/published/ used (NGC 20.12 for
  //   Narayanan et al. 2021, 2021-2022 containers for MT-NLG and Korthikanti et al.). Today's CUDA 12 cuBLAS reaches
  //   267.9 TFLOP/s at its best shape (mamf-finder.py, S. Bekman, "Machine Learning Engineering Open Book",
  //   compute/accelerator/README.md, MAMF table: 6912 x 16384 x 2048, bf16); pass that in AnalyticalParameters to
  //   model a current software stack.
  //   H100 / H200, B200 / GB200: maximum achievable matmul FLOPs of the same MAMF table (bf16, CUDA 12.x / 13.0);
  //   H800 (no entry): the H100's.
  GemmMeasurement measured{};
  if (gpu.name.rfind("A100", 0) == 0) {
    // A100 SXM 80GB, CUDA 11.7: 230 TFLOPS (73.7% of 312); the 40GB part has the same SMs and clocks.
    measured = {230e12, 8192, 8192, 8192};
  } else if (gpu.name.rfind("H100", 0) == 0) {
    measured = {792.1e12, 6144, 17920, 2816};  // H100 SXM: 792.1 TFLOPS (80.1% of 989)
  } else if (gpu.name.rfind("H800", 0) == 0) {
    measured = {792.1e12, 6144, 17920, 2816};  // the H100 SXM's: the same GH100 at the same clocks
  } else if (gpu.name.rfind("B200", 0) == 0) {
    measured = {1745.0e12, 1792, 16128, 3072};  // B200 SXM: 1745.0 TFLOPS (77.6% of 2250), torch 2.7.1+cu128
  } else if (gpu.name.rfind("GB200", 0) == 0) {
    measured = {1822.0e12, 4096, 9728, 2048};  // GB200: 1822.0 TFLOPS (72.9% of 2500), torch 2.10 nightly+cu130
  } else if (gpu.name.rfind("H200", 0) == 0) {
    // No H200 entry; GH200 (the same GH100 die with HBM3e): 821.0 TFLOPS (83.0% of 989).
    measured = {821.0e12, 11264, 19712, 1536};
  } else {
    throw std::invalid_argument("analytical cost model: no parameters for GPU '" + gpu.name + "'");
  }
  p.gemm_efficiency = base_efficiency(gpu, measured, p.tiles);
  p.gemm_measured_flops_per_s = measured.flops_per_s;
  p.gemm_measured_shape = {measured.m, measured.n, measured.k};
  // GEMMs by shape: OpenXLA's measured tables (sim/data/gemm_by_shape.csv), sm_90 and B200; none for the A100.
  p.gemm_shapes = gemm_shape_table(gpu.name);
  // Attention GEMMs: measured on an A100 (see kMegatronAttentionA100), relative to the streaming rate, so the same
  // fraction on every GPU unless the cluster measured its own (cluster.attention_gemm_hbm_fraction).
  p.attention_gemm_hbm_fraction = attention_gemm_hbm_fraction_measured(kA100StreamingFraction, p.kernel_launch_s);
  return p;
}

namespace {

// A measurement of the GPU lies between 5 % of what the datasheet allows and all of it: above, it is not this GPU;
// below, no large GEMM or streaming kernel runs that slowly on these parts, so it is a unit slip (GFLOP/s, PB/s).
void check_measurement(std::string_view field, double value, double ceiling, std::string_view ceiling_name,
                       std::string_view unit, const std::string& gpu) {
  if (value > ceiling) {
    throw std::invalid_argument(fmt::format("{} = {:g} exceeds the {}'s {} of {:g} {}; a measured one cannot (is it "
                                            "the scenario's GPU?)",
                                            field, value, gpu, ceiling_name, ceiling, unit));
  }
  if (value < 0.05 * ceiling) {
    throw std::invalid_argument(fmt::format("{} = {:g} is under 5 % of the {}'s {} of {:g} {}: is it in {}?", field,
                                            value, gpu, ceiling_name, ceiling, unit, unit));
  }
}

}  // namespace

double host_s_per_kernel(const model::ClusterSpec& cluster, const topology::NodeSpec& node) {
  return cluster.host_us_per_kernel.value_or(node.host_us_per_kernel) * 1e-6;
}

AnalyticalParameters analytical_parameters(const topology::GpuSpec& gpu, const model::ClusterSpec& cluster) {
  AnalyticalParameters p = analytical_parameters(gpu);
  if (cluster.gemm_tflops > 0) {
    check_measurement("cluster.gemm_tflops", cluster.gemm_tflops, gpu.bf16_flops / 1e12, "16-bit tensor-core peak",
                      "TFLOP/s", gpu.name);
    const GemmMeasurement measured{cluster.gemm_tflops * 1e12, static_cast<double>(cluster.gemm_shape[0]),
                                   static_cast<double>(cluster.gemm_shape[1]),
                                   static_cast<double>(cluster.gemm_shape[2])};
    p.gemm_efficiency = base_efficiency(gpu, measured, p.tiles);
    p.gemm_measured_flops_per_s = measured.flops_per_s;
    p.gemm_measured_shape = {measured.m, measured.n, measured.k};
    p.gemm_measured_here = true;
  }
  if (cluster.hbm_gb_per_s > 0) {
    const double datasheet_gb_per_s = gpu.hbm_bytes_per_s / 1e9;
    check_measurement("cluster.hbm_gb_per_s", cluster.hbm_gb_per_s, datasheet_gb_per_s, "datasheet HBM bandwidth",
                      "GB/s", gpu.name);
    p.hbm_efficiency = cluster.hbm_gb_per_s / datasheet_gb_per_s;
    p.hbm_measured_here = true;
  }
  // The host's time per kernel launched: the cluster's own, or its node's measured host.
  if (cluster.node != model::NodeKind::CpuHost) {
    p.host_s_per_kernel = host_s_per_kernel(cluster, topology::node_spec(cluster.node));
  }
  if (cluster.attention_gemm_hbm_fraction > 0) {
    // A fraction of the streaming rate: at most all of it (the scenario check), and no GEMM streams its operands at
    // under 5 % of HBM (a percentage slip).
    if (cluster.attention_gemm_hbm_fraction < 0.05) {
      throw std::invalid_argument(fmt::format("cluster.attention_gemm_hbm_fraction = {:g} is under 5 % of the "
                                              "streaming rate: is it a percentage? (a fraction: 0 < f <= 1)",
                                              cluster.attention_gemm_hbm_fraction));
    }
    p.attention_gemm_hbm_fraction = cluster.attention_gemm_hbm_fraction;
    p.attention_measured_here = true;
  }
  return p;
}

AnalyticalCostModel::AnalyticalCostModel(topology::GpuSpec gpu)
    : gpu_(std::move(gpu)), parameters_(analytical_parameters(gpu_)) {}

AnalyticalCostModel::AnalyticalCostModel(topology::GpuSpec gpu, AnalyticalParameters parameters)
    : gpu_(std::move(gpu)), parameters_(std::move(parameters)) {}

double AnalyticalCostModel::memory_time_s(double bytes) const {
  return bytes / (gpu_.hbm_bytes_per_s * parameters_.hbm_efficiency);
}

AnalyticalParameters host_parameters(const topology::HostProfile& profile) {
  AnalyticalParameters p;
  p.kernel_launch_s = profile.memory_overhead_s + profile.host_s_per_operator;
  p.gemm_measured_flops_per_s = profile.gemm_flops_per_s;
  p.gemm_measured_here = p.hbm_measured_here = true;
  p.attention_flops_per_s = profile.attention_flops_per_s;
  p.host = std::make_shared<const topology::HostProfile>(profile);
  return p;
}

const AnalyticalCostModel::Fp8Rate& AnalyticalCostModel::fp8_rate(model::Fp8Recipe recipe) const {
  auto it = fp8_rates_.find(recipe);
  if (it == fp8_rates_.end()) {
    const Fp8GemmMeasurement fp8 = fp8_gemm_measurement(gpu_, recipe);
    const GemmMeasurement measured{fp8.flops_per_s, fp8.m, fp8.n, fp8.k};
    it = fp8_rates_.emplace(recipe, Fp8Rate{base_efficiency(gpu_, measured, parameters_.tiles, gpu_.fp8_flops),
                                            fp8.flops_per_s})
             .first;
  }
  return it->second;
}

double AnalyticalCostModel::gemm_ceiling_flops_per_s(model::DType dtype) const {
  // The measurement is a 16-bit GEMM's; another dtype's at the ratio of the peaks.
  return parameters_.gemm_measured_flops_per_s * gpu_.peak_flops(dtype) / gpu_.bf16_flops;
}

double AnalyticalCostModel::fp8_gemm_time_s(double m, double n, double k, double count, model::Fp8Recipe recipe) const {
  const Fp8Rate& rate = fp8_rate(recipe);
  const double tiled =
      quantized_time_s(m, n, k, count, gpu_.fp8_flops, rate.efficiency, gpu_.sm_count, parameters_.tiles);
  const double compute = std::max(tiled, ceiling_s(m, n, k, count, rate.measured_flops_per_s));
  const double operand_bytes = (m * k + k * n + 2 * m * n) * count;
  return std::max(compute, memory_time_s(operand_bytes));
}

double AnalyticalCostModel::gemm_time_s(double m, double n, double k, double count, model::DType dtype,
                                        double hbm_fraction) const {
  if (parameters_.host) return parameters_.host->gemm_time_s(m, n, k, count);
  const double compute = std::max(quantized_time_s(m, n, k, count, gpu_.peak_flops(dtype), parameters_.gemm_efficiency,
                                                   gpu_.sm_count, parameters_.tiles),
                                  ceiling_s(m, n, k, count, gemm_ceiling_flops_per_s(dtype)));
  const double operand_bytes = model::dtype_bytes(dtype) * (m * k + k * n + m * n) * count;
  return std::max(compute, memory_time_s(operand_bytes) / hbm_fraction);
}

// The table's factor is the bf16 column's, applied to FP8 GEMMs too: OpenXLA's FP8 columns for sm_90 exceed the H100's
// dense FP8 peak at large shapes (scripts/openxla_tables.py), so they cannot be read as rates; what a shape loses to
// latency and pipeline fill is taken to be the same fraction in either precision.
double AnalyticalCostModel::weight_gemm_time_s(double m, double n, double k, double count, model::DType dtype,
                                               const model::Fp8Recipe* recipe) const {
  const double modelled = recipe ? fp8_gemm_time_s(m, n, k, count, *recipe) : gemm_time_s(m, n, k, count, dtype);
  const GemmShapeTable* table = parameters_.gemm_shapes;
  if (!table || m <= 0 || n <= 0 || k <= 0 || count <= 0) return modelled;
  const double large_flops_per_s = large_gemm_flops_per_s(dtype, recipe);
  return std::max(modelled, count * 2 * m * n * k / (large_flops_per_s * table->shape_factor(m, n, k)));
}

double AnalyticalCostModel::large_gemm_flops_per_s(model::DType dtype, const model::Fp8Recipe* recipe) const {
  if (recipe) {
    const Fp8Rate& rate = fp8_rate(*recipe);
    return std::min(gpu_.fp8_flops * rate.efficiency, rate.measured_flops_per_s);
  }
  const double ceiling = gemm_ceiling_flops_per_s(dtype);
  const double tiles = gpu_.peak_flops(dtype) * parameters_.gemm_efficiency;
  return ceiling > 0 ? std::min(tiles, ceiling) : tiles;
}

double AnalyticalCostModel::op_time_s(const model::Scenario& scenario, const model::Op& op, int& kernels) const {
  const double launch = parameters_.kernel_launch_s;
  if (!op.breakdown || op.breakdown->kernels.empty()) {
    // An op without its kernels (not from a Program: a test's): one kernel, memory bound unless its FLOPs, at the
    // large-GEMM efficiency without a shape to quantize, take longer.
    const double compute = op.flops / (gpu_.peak_flops(scenario.model.dtype) * parameters_.gemm_efficiency);
    kernels = 1;
    return std::max(compute, memory_time_s(op.bytes)) + launch;
  }
  // The kernels in the order the Program lists them, each with its launches; the attention core's own kernels
  // charge theirs after the op's other times (the order of the additions every golden file was recorded with).
  double seconds = 0;
  int attention_launches = 0;
  kernels = 0;
  // A host whose profile measured its attention core as one kernel (twin's CPU executor runs it fused): the unfused
  // core's GEMMs and passes are that kernel, at its measured rate.
  const bool fused_on_host = parameters_.host && parameters_.attention_flops_per_s > 0;
  for (const model::Kernel& kernel : op.breakdown->kernels) {
    if (fused_on_host &&
        (kernel.kind == model::KernelKind::AttentionOperand || kernel.kind == model::KernelKind::AttentionPasses)) {
      continue;
    }
    if (fused_on_host && kernel.kind == model::KernelKind::AttentionGemms) {
      seconds += flash_attention_s(scenario, op);
      attention_launches += 1;
      kernels += 1;
      continue;
    }
    kernels += kernel.launches;
    switch (kernel.kind) {
      case model::KernelKind::Gemm:
        seconds += gemm_kernels_s(scenario, op) + kernel.launches * launch;
        break;
      case model::KernelKind::Fp8Gemm:
        seconds += fp8_gemm_kernels_s(scenario, op) + kernel.launches * launch;
        break;
      case model::KernelKind::Stream:
        seconds += stream_time_s(op, kernel.bytes) + kernel.launches * launch;
        break;
      case model::KernelKind::AttentionGemms:
        seconds += attention_gemms_s(scenario, op);
        attention_launches += kernel.launches;
        break;
      case model::KernelKind::AttentionOperand:
        seconds += stream_time_s(op, kernel.bytes) / parameters_.attention_gemm_hbm_fraction;
        attention_launches += kernel.launches;
        break;
      case model::KernelKind::AttentionPasses:
        seconds += stream_time_s(op, kernel.bytes);
        attention_launches += kernel.launches;
        break;
      case model::KernelKind::FlashAttention:
        seconds += flash_attention_s(scenario, op);
        attention_launches += kernel.launches;
        break;
    }
  }
  return seconds + attention_launches * launch;
}

// A GEMM op's GEMMs: forward [m,k]x[k,n]; backward the input gradient dX = dY W^T ([m,n]x[n,k]) and the weight
// gradient dW = X^T dY ([k,m]x[m,n]); a zero-bubble schedule's B the first, its W the second.
double AnalyticalCostModel::gemm_kernels_s(const model::Scenario& scenario, const model::Op& op) const {
  const double m = static_cast<double>(op.gemm.m), n = static_cast<double>(op.gemm.n);
  const double k = static_cast<double>(op.gemm.k), count = static_cast<double>(op.gemm.count);
  const model::DType dtype = scenario.model.dtype;
  if (op.phase == model::Phase::WeightGrad) return weight_gemm_time_s(k, n, m, count, dtype);  // a zero-bubble W
  if (op.phase != model::Phase::Backward) return weight_gemm_time_s(m, n, k, count, dtype);
  if (op.defers_weight_grad) return weight_gemm_time_s(m, k, n, count, dtype);  // its B
  return weight_gemm_time_s(m, k, n, count, dtype) + weight_gemm_time_s(k, n, m, count, dtype);
}

double AnalyticalCostModel::stream_time_s(const model::Op& op, double bytes) const {
  if (parameters_.host) return parameters_.host->memory_time_s(std::string(model::to_string(op.what)), bytes);
  return memory_time_s(bytes);
}

// The same in FP8: TE runs the weight-gradient GEMM in FP8 too (fp8_wgrad, Megatron-Core's default); a zero-bubble
// schedule's B and W each its part of the backward's two.
double AnalyticalCostModel::fp8_gemm_kernels_s(const model::Scenario& scenario, const model::Op& op) const {
  const double m = static_cast<double>(op.gemm.m), n = static_cast<double>(op.gemm.n);
  const double k = static_cast<double>(op.gemm.k), count = static_cast<double>(op.gemm.count);
  const model::Fp8Recipe recipe = scenario.framework.fp8_recipe;
  const model::DType dtype = scenario.model.dtype;
  if (op.phase == model::Phase::WeightGrad) return weight_gemm_time_s(k, n, m, count, dtype, &recipe);
  if (op.phase != model::Phase::Backward) return weight_gemm_time_s(m, n, k, count, dtype, &recipe);
  if (op.defers_weight_grad) return weight_gemm_time_s(m, k, n, count, dtype, &recipe);
  return weight_gemm_time_s(m, k, n, count, dtype, &recipe) + weight_gemm_time_s(k, n, m, count, dtype, &recipe);
}

// The attention core's batched GEMMs, at the attention GEMMs' fraction of the streaming rate when memory bound: half
// are Q K^T [s,d]x[d,s] (m = n = s, k = d), half P V [s,s]x[s,d]. Backward: the gradients of both (dP: [s,d]x[d,s];
// dV, dQ, dK: [s,s]x[s,d]).
double AnalyticalCostModel::attention_gemms_s(const model::Scenario& scenario, const model::Op& op) const {
  const double m = static_cast<double>(op.gemm.m), n = static_cast<double>(op.gemm.n);
  const double k = static_cast<double>(op.gemm.k), half = static_cast<double>(op.gemm.count) / 2;
  const double fraction = parameters_.attention_gemm_hbm_fraction;
  const double score_like = gemm_time_s(m, n, k, half, scenario.model.dtype, fraction);
  const double value_like = gemm_time_s(m, k, n, half, scenario.model.dtype, fraction);
  return op.phase == model::Phase::Backward ? score_like + 3 * value_like : score_like + value_like;
}

// FlashAttention's kernel at its measured rate (flash_attention_rate), on the causal FLOPs it computes with its
// head-dimension block: forward 2 b s^2 heads d (m = n = s, k = d, count = 2 b heads), backward 2.5 times that; the
// recompute is a forward.
double AnalyticalCostModel::flash_attention_s(const model::Scenario& scenario, const model::Op& op) const {
  const double m = static_cast<double>(op.gemm.m), n = static_cast<double>(op.gemm.n);
  const double k = static_cast<double>(op.gemm.k), count = static_cast<double>(op.gemm.count);
  const double backward = op.phase == model::Phase::Backward ? 2.5 : 1.0;
  if (parameters_.attention_flops_per_s > 0) {  // measured on this kernel's FLOPs at the model's head dimension
    return backward * count / 2 * 2 * m * n * k / parameters_.attention_flops_per_s;
  }
  const FlashAttentionRate rate = flash_attention_rate(gpu_, scenario.framework.attention, m, k);
  const double forward_flops = count / 2 * 2 * m * n * rate.kernel_head_dim;
  return backward * forward_flops / rate.flops_per_s;
}

double AnalyticalCostModel::gemm_half_s(const model::Scenario& scenario, model::ComputeKind what,
                                        bool weight_gradient) const {
  const model::GemmShape shape = model::weight_gemm_shape(scenario, what);
  const double m = static_cast<double>(shape.m), n = static_cast<double>(shape.n), k = static_cast<double>(shape.k);
  const double count = static_cast<double>(shape.count);
  if (count <= 0) return 0;
  const model::DType dtype = scenario.model.dtype;
  const model::Fp8Recipe recipe = scenario.framework.fp8_recipe;
  const model::Fp8Recipe* fp8 = model::runs_in_fp8(scenario, what) ? &recipe : nullptr;
  return weight_gradient ? weight_gemm_time_s(k, n, m, count, dtype, fp8) : weight_gemm_time_s(m, k, n, count, dtype, fp8);
}

double AnalyticalCostModel::memory_copy_s(double bytes, int kernels) const {
  return bytes > 0 ? memory_time_s(bytes) + kernels * parameters_.kernel_launch_s : 0;
}

double AnalyticalCostModel::compute_time_s(const model::Scenario& scenario, const model::Op& op) const {
  return timed(scenario, op).first;
}

std::pair<double, int> AnalyticalCostModel::timed(const model::Scenario& scenario, const model::Op& op) const {
  int kernels = 0;
  if (!op.breakdown || op.breakdown->parts.empty()) {
    const double seconds = op_time_s(scenario, op, kernels);
    return {seconds, kernels};
  }
  // A fused layer op: the sum of its parts. Every micro-batch's op of a layer and phase shares one breakdown; the
  // cache keeps it alive, so that its address names it.
  if (auto it = layer_cache_.find(op.breakdown.get()); it != layer_cache_.end()) return it->second.timed;
  double total = 0;
  int total_kernels = 0;
  for (const model::Op& part : op.breakdown->parts) {
    total += op_time_s(scenario, part, kernels);
    total_kernels += kernels;
  }
  const auto timed = std::make_pair(total, total_kernels);
  layer_cache_.emplace(op.breakdown.get(), FusedLayerTime{op.breakdown, timed});
  return timed;
}

HostCost AnalyticalCostModel::host_cost(const model::Scenario& scenario, const model::Op& op) const {
  const double per_call_s = parameters_.host_s_per_kernel;
  if (per_call_s <= 0) return {};
  // A collective or a point-to-point message: one call into NCCL. A compute op: the kernels it launches, or the
  // Transformer Engine module calls that launch them. What a CUDA graph issues costs its graph's launch instead, one
  // call.
  if (op.kind != model::OpKind::Compute) {
    if (model::cuda_graph_captures(scenario, op)) return {0, 0, per_call_s};
    return {per_call_s, 1, 0};
  }
  const Issued issued_now = issued(scenario, op);
  return {issued_now.host_s, issued_now.kernels, issued_now.in_graph ? per_call_s : 0};
}

double AnalyticalCostModel::issue_s(const model::Scenario& scenario, const model::Op& op, int kernels) const {
  const double per_call_s = parameters_.host_s_per_kernel;
  const model::TeModule module = model::te_module(scenario, op);
  if (module == model::TeModule::None) return kernels * per_call_s;
  // A grouped module's experts past the first (one more GEMM launch each), and the kernels launched around the
  // module's call.
  double launches_beside = 0;
  static const std::vector<model::Kernel> none;
  for (const model::Kernel& kernel : op.breakdown ? op.breakdown->kernels : none) {
    const bool gemm = kernel.kind == model::KernelKind::Gemm || kernel.kind == model::KernelKind::Fp8Gemm;
    if (module == model::TeModule::GroupedLinear && gemm && op.gemm.count > 1) {
      launches_beside += kernel.launches * (1 - 1.0 / static_cast<double>(op.gemm.count));
    }
    if (kernel.outside_module) launches_beside += kernel.launches;
  }
  return te_module_host_s(module, op.phase, scenario.model.fp8 != model::Fp8Format::None, per_call_s) +
         launches_beside * per_call_s;
}

AnalyticalCostModel::Issued AnalyticalCostModel::issued(const model::Scenario& scenario, const model::Op& op) const {
  if (!op.breakdown || op.breakdown->parts.empty()) {
    if (model::cuda_graph_captures(scenario, op)) return {0, true, 0};
    const int kernels = std::max(1, timed(scenario, op).second);
    return {kernels, false, issue_s(scenario, op, kernels)};
  }
  timed(scenario, op);  // fills the cache entry of its breakdown
  FusedLayerTime& cached = layer_cache_.at(op.breakdown.get());
  if (cached.issued) return *cached.issued;
  Issued sum;
  for (const model::Op& part : op.breakdown->parts) {
    if (model::cuda_graph_captures(scenario, part)) {
      sum.in_graph = true;
      continue;
    }
    int kernels = 0;
    op_time_s(scenario, part, kernels);
    sum.kernels += kernels;
    sum.host_s += issue_s(scenario, part, kernels);
  }
  // A fused op issues at least one launch or graph, as the op it stands for did.
  if (!sum.in_graph && sum.kernels < 1) {
    sum.kernels = 1;
    sum.host_s = std::max(sum.host_s, parameters_.host_s_per_kernel);
  }
  cached.issued = sum;
  return sum;
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
    case model::Phase::WeightGrad:
      return weight_grad_s_;
  }
  return 0;
}

report::LayerParts layer_parts(const CostModel& cost, const model::Scenario& scenario) {
  // A long run has tens of thousands of fused ops but few distinct (layer, phase) pairs.
  auto cache = std::make_shared<std::map<std::pair<int, int>, std::vector<std::pair<model::ComputeKind, double>>>>();
  return [&cost, &scenario, cache](const model::Op& fused) {
    const auto key = std::make_pair(static_cast<int>(fused.layer), static_cast<int>(fused.phase));
    if (auto it = cache->find(key); it != cache->end()) return it->second;
    std::vector<std::pair<model::ComputeKind, double>> parts;
    if (fused.breakdown) {
      for (const model::Op& part : fused.breakdown->parts) {
        parts.emplace_back(part.what, cost.compute_time_s(scenario, part));
      }
    }
    return cache->emplace(key, std::move(parts)).first->second;
  };
}

}  // namespace twin::sim

// twin_gemm_peak: the bf16 GEMM rate this GPU reaches through cuBLASLt (kernels/cuda's gemm), the HBM bandwidth of a
// streaming kernel, the share of it the attention core's batched GEMMs reach (Q K^T and P V of an unfused attention,
// as Megatron-LM runs it), and the rate of twin's fused attention (kernels/cuda/flash_attention.cuh) at the ~1B GPT's
// shape, beside the GEMMs' (the aim: within 2x of their rate per FLOP). Random data (never zeros: they run
// faster than real data), inputs larger than the L2, 3 warm-up runs, then the median of 20 timed with CUDA events.
// Prints one line per measurement, "peak_tflops X", "hbm_gb_per_s Y", "attention_gemm_hbm_fraction Z",
// "flash_attention_tflops F B", and last the [cluster] keys with which `twin sim` models this GPU and software stack
// instead of the cited ones (README, "Scenarios"; sim/cost_model.cpp). MFU is not measured against this peak but
// against the datasheet's (bench/gpu/step_report.py).
//
//   twin_gemm_peak                      squares, the ~1B GPT's linear layers at 16384 rows, HBM, attention
//   twin_gemm_peak M N K [M N K ...]    the given GEMMs only (out (M, N) = inp (M, K) @ weight (N, K)^T)
//   twin_gemm_peak --sustained S        8192^3 back to back for S seconds: the burst rate of the first half-second
//                                       window and the sustained one of the last third, once the board sits at its
//                                       power limit (the MAMF rates twin cites are bursts; a training step's GEMMs
//                                       run back to back: docs/accuracy.md, "A lead for Blackwell")
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "bench/gpu/event_timing.hpp"
#include "kernels/cuda/kernels.cuh"

namespace {

using twin::kernels::cuda::Cublas;

struct Shape {
  int m, n, k;  // out (m, n) = inp (m, k) @ weight (n, k)^T
};

// n bf16 values uniform in [-1, 1), from a per-thread LCG (fast; any values but zeros will do)
std::vector<__nv_bfloat16> random_bf16(std::size_t n, std::uint32_t seed) {
  std::vector<__nv_bfloat16> x(n);
  const unsigned threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> workers;
  for (unsigned w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      std::uint32_t state = seed * 2654435761u + w * 40503u + 1u;
      for (std::size_t i = w; i < n; i += threads) {
        state = state * 1664525u + 1013904223u;
        x[i] = __float2bfloat16_rn(static_cast<float>(state >> 8) / 8388608.0f - 1.0f);
      }
    });
  }
  for (auto& worker : workers) worker.join();
  return x;
}

// `count` random bf16 values (random_bf16) in a new device buffer; cudaFree it.
__nv_bfloat16* device_random_bf16(std::size_t count, std::uint32_t seed) {
  __nv_bfloat16* buffer = nullptr;
  TWIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&buffer), count * 2));
  const auto host = random_bf16(count, seed);
  TWIN_CUDA_CHECK(cudaMemcpy(buffer, host.data(), count * 2, cudaMemcpyHostToDevice));
  return buffer;
}

using twin::bench::Timing;
using twin::bench::time_on;

double time_shape(const Shape& s, Cublas& blas, cudaStream_t stream) {
  const std::size_t a_count = static_cast<std::size_t>(s.m) * s.k, b_count = static_cast<std::size_t>(s.n) * s.k;
  const std::size_t c_count = static_cast<std::size_t>(s.m) * s.n;
  __nv_bfloat16 *inp = device_random_bf16(a_count, 1), *weight = device_random_bf16(b_count, 2), *out = nullptr;
  TWIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), c_count * 2));
  const Timing t = time_on(
      stream, [&] { twin::kernels::cuda::matmul_forward(out, inp, weight, nullptr, s.m, s.k, s.n, blas, stream); });
  const double tflops = 2.0 * s.m * s.n * static_cast<double>(s.k) / t.median_s / 1e12;
  std::printf("gemm bf16 m %d n %d k %d: median %.3f ms (min %.3f), %.1f TFLOP/s\n", s.m, s.n, s.k, t.median_s * 1e3,
              t.min_s * 1e3, tflops);
  cudaFree(inp);
  cudaFree(weight);
  cudaFree(out);
  return tflops;
}

// Read + write bandwidth of an in-place scale x *= 1.2 over 1 GiB of fp32: the kind of streaming kernel the cited
// A100 figure measured (PyTorch `a * 1.2`, 8 bytes per element), and what the cost model's memory-bound ops assume.
double time_hbm_gb_per_s(cudaStream_t stream) {
  const std::size_t n = std::size_t{1} << 28;  // 256 Mi floats
  float* x = nullptr;
  TWIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&x), n * sizeof(float)));
  twin::kernels::cuda::fill(x, n, 1.0f, stream);
  const Timing t = time_on(stream, [&] { twin::kernels::cuda::scale(x, n, 1.2f, stream); });
  const double gb_per_s = 2.0 * n * sizeof(float) / t.median_s / 1e9;
  std::printf("hbm scale fp32 %zu MiB in place: median %.3f ms, %.0f GB/s read + write\n", n * sizeof(float) >> 20,
              t.median_s * 1e3, gb_per_s);
  cudaFree(x);
  return gb_per_s;
}

// The attention core's two forward GEMMs over `heads` heads of one sequence, as Megatron-LM runs them (unfused, bf16
// scores), through the plans kernels/cuda's attention uses (gemm_plan.hpp): scores (seq, seq) = q k^T, then
// out (seq, d) = P v. Both are memory bound; the cost model moves their operands (2 bytes x (mk + kn + mn) per GEMM)
// at attention_gemm_hbm_fraction of the streaming rate. Returns that fraction as measured here, against
// `hbm_gb_per_s`. The cited value (0.64, sim/cost_model.cpp) comes from Megatron's whole attention on an A100 with its
// softmax taken at the streaming rate; on an A100 this measurement checks that reading.
double time_attention_gemms(int heads, int seq, int head_dim, double hbm_gb_per_s, Cublas& blas, cudaStream_t stream) {
  using namespace twin::kernels::cuda;
  const AttentionShape shape{seq, heads, head_dim};
  const std::size_t qkv_count = static_cast<std::size_t>(seq) * shape.qkv_row();
  const std::size_t score_count = static_cast<std::size_t>(heads) * shape.scores_per_head();
  const std::size_t out_count = static_cast<std::size_t>(seq) * shape.hidden();
  __nv_bfloat16 *qkv = device_random_bf16(qkv_count, 3), *scores = device_random_bf16(score_count, 4), *out = nullptr;
  TWIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), out_count * 2));
  const GemmPlan qk = plan_attention_scores(shape, 1.0f / std::sqrt(static_cast<float>(head_dim)));
  const GemmPlan pv = plan_attention_output(shape);
  const Timing t_qk = time_on(stream, [&] { gemm(blas, qk, qkv, qkv, scores, CUDA_R_16BF, stream); });
  const Timing t_pv = time_on(stream, [&] { gemm(blas, pv, qkv, scores, out, CUDA_R_16BF, stream); });
  const double bytes = 2.0 * 2.0 * heads * (static_cast<double>(seq) * seq + 2.0 * seq * head_dim);
  const double gb_per_s = bytes / (t_qk.median_s + t_pv.median_s) / 1e9;
  const double fraction = gb_per_s / hbm_gb_per_s;
  std::printf("attention gemms bf16 %d heads of %d, seq %d: q k^T median %.3f ms, p v %.3f ms, %.0f GB/s, %.2f of the "
              "streaming rate\n",
              heads, head_dim, seq, t_qk.median_s * 1e3, t_pv.median_s * 1e3, gb_per_s, fraction);
  cudaFree(qkv);
  cudaFree(scores);
  cudaFree(out);
  return fraction;
}

// The fused attention at (batch, seq, heads, head_dim), causal: forward and backward TFLOP/s, counting the causal half
// of the score matrix (forward 2 matmuls of B H T^2 D / 2 multiply-adds each: 2 B H T^2 D FLOPs; backward 2.5 times
// that, as FlashAttention-2 counts it, although twin's deterministic backward recomputes S and dP for dq).
void time_flash_attention(int batch, int seq, int heads, int head_dim, cudaStream_t stream) {
  using namespace twin::kernels::cuda;
  const std::size_t qkv_count = static_cast<std::size_t>(batch) * seq * 3 * heads * head_dim;
  const std::size_t out_count = static_cast<std::size_t>(batch) * seq * heads * head_dim;
  __nv_bfloat16 *qkv = device_random_bf16(qkv_count, 5), *dout = device_random_bf16(out_count, 6);
  __nv_bfloat16 *out = nullptr, *dqkv = nullptr;
  float* lse = nullptr;
  TWIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), out_count * 2));
  TWIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dqkv), qkv_count * 2));
  TWIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&lse), static_cast<std::size_t>(batch) * heads * seq * 4));
  const Timing forward = time_on(stream, [&] {
    flash_attention_forward(out, lse, qkv, batch, seq, heads, heads, head_dim, stream);
  });
  const Timing backward = time_on(stream, [&] {
    flash_attention_backward(dqkv, dout, qkv, out, lse, batch, seq, heads, heads, head_dim, stream);
  });
  const double flops = 2.0 * batch * heads * static_cast<double>(seq) * seq * head_dim;
  std::printf("flash attention bf16 causal, %d x %d heads of %d, seq %d: forward median %.3f ms %.1f TFLOP/s, "
              "backward %.3f ms %.1f TFLOP/s\n",
              batch, heads, head_dim, seq, forward.median_s * 1e3, flops / forward.median_s / 1e12,
              backward.median_s * 1e3, 2.5 * flops / backward.median_s / 1e12);
  std::printf("flash_attention_tflops %.1f %.1f\n", flops / forward.median_s / 1e12,
              2.5 * flops / backward.median_s / 1e12);
  cudaFree(qkv);
  cudaFree(dout);
  cudaFree(out);
  cudaFree(dqkv);
  cudaFree(lse);
}

// One 8192^3 bf16 GEMM enqueued back to back for `seconds`, timed in windows of about half a second (CUDA events around
// each batch of GEMMs): prints each window's rate, then "burst_tflops" (the first window) and "sustained_tflops" (the
// median window of the last third), and their ratio.
int time_sustained(double seconds, Cublas& blas, cudaStream_t stream) {
  const Shape s{8192, 8192, 8192};
  const std::size_t count = static_cast<std::size_t>(s.m) * s.k;
  __nv_bfloat16 *inp = device_random_bf16(count, 7), *weight = device_random_bf16(count, 8), *out = nullptr;
  TWIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), count * 2));
  const auto gemm = [&] { twin::kernels::cuda::matmul_forward(out, inp, weight, nullptr, s.m, s.k, s.n, blas, stream); };
  const double flops = 2.0 * s.m * s.n * static_cast<double>(s.k);
  const twin::bench::Timing one = time_on(stream, gemm);
  const int per_window = std::max(1, static_cast<int>(0.5 / one.median_s));
  cudaEvent_t start, stop;
  TWIN_CUDA_CHECK(cudaEventCreate(&start));
  TWIN_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> tflops;
  for (double elapsed_s = 0; elapsed_s < seconds;) {
    TWIN_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < per_window; ++i) gemm();
    TWIN_CUDA_CHECK(cudaEventRecord(stop, stream));
    TWIN_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    TWIN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    elapsed_s += ms / 1e3;
    tflops.push_back(per_window * flops / (ms / 1e3) / 1e12);
    std::printf("sustained window %zu at %.1f s: %.1f TFLOP/s\n", tflops.size(), elapsed_s, tflops.back());
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(inp);
  cudaFree(weight);
  cudaFree(out);
  std::vector<double> last(tflops.end() - static_cast<std::ptrdiff_t>(std::max<std::size_t>(1, tflops.size() / 3)),
                           tflops.end());
  std::sort(last.begin(), last.end());
  const double sustained = last[last.size() / 2];
  std::printf("burst_tflops %.1f\nsustained_tflops %.1f\nsustained_over_burst %.3f\n", tflops.front(), sustained,
              sustained / tflops.front());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::string(argv[1]) == "--sustained") {
      const double seconds = argc > 2 ? std::atof(argv[2]) : 0;
      if (argc != 3 || !(seconds > 0 && seconds <= 600)) {
        std::fprintf(stderr, "usage: twin_gemm_peak --sustained SECONDS (0 < SECONDS <= 600)\n");
        return 2;
      }
      cudaStream_t stream;
      TWIN_CUDA_CHECK(cudaStreamCreate(&stream));
      Cublas blas;
      const int status = time_sustained(seconds, blas, stream);
      cudaStreamDestroy(stream);
      return status;
    }
    std::vector<Shape> shapes;
    const bool gemms_only = argc > 1;  // a sweep of given shapes: no HBM or attention measurement repeated with it
    if (argc > 1) {
      if ((argc - 1) % 3 != 0) {
        std::fprintf(stderr, "usage: twin_gemm_peak [M N K]...\n");
        return 2;
      }
      for (int i = 1; i + 2 < argc; i += 3)
        shapes.push_back({std::atoi(argv[i]), std::atoi(argv[i + 1]), std::atoi(argv[i + 2])});
    } else {
      shapes = {{4096, 4096, 4096},  {8192, 8192, 8192},                                             // squares
                {16384, 6144, 2048}, {16384, 2048, 2048}, {16384, 8192, 2048}, {16384, 2048, 8192},  // 1B GPT layers
                {16384, 50304, 2048}};                                                               // its LM head
    }
    cudaDeviceProp properties{};
    TWIN_CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
    std::printf("device %s, %d SMs, %.0f MiB\n", properties.name, properties.multiProcessorCount,
                properties.totalGlobalMem / 1048576.0);
    cudaStream_t stream;
    TWIN_CUDA_CHECK(cudaStreamCreate(&stream));
    Cublas blas;
    double peak = 0.0;
    Shape peak_shape{};
    for (const Shape& s : shapes) {
      const double tflops = time_shape(s, blas, stream);
      if (tflops > peak) {
        peak = tflops;
        peak_shape = s;
      }
    }
    std::printf("peak_tflops %.1f\n", peak);
    if (gemms_only) {
      cudaStreamDestroy(stream);
      return 0;
    }
    const double hbm = time_hbm_gb_per_s(stream);
    std::printf("hbm_gb_per_s %.0f\n", hbm);
    // The cited measurement's shape (16 sequences x 8 heads of 64, sequence 2048: 128 heads' worth), then heads of 128.
    const double attention = time_attention_gemms(16 * 8, 2048, 64, hbm, blas, stream);
    time_attention_gemms(16 * 8, 2048, 128, hbm, blas, stream);
    std::printf("attention_gemm_hbm_fraction %.2f\n", attention);
    time_flash_attention(8, 2048, 16, 128, stream);  // the ~1B GPT's attention (bench/gpu/gpt-1b-h200.toml)
    time_flash_attention(8, 2048, 32, 64, stream);   // the same width in heads of 64
    std::printf("# [cluster] keys for this GPU and software stack (twin sim uses them instead of the cited values):\n");
    std::printf("gemm_tflops = %.1f\ngemm_shape = [%d, %d, %d]\nhbm_gb_per_s = %.0f\n"
                "attention_gemm_hbm_fraction = %.2f\n",
                peak, peak_shape.m, peak_shape.n, peak_shape.k, hbm, std::min(1.0, attention));
    cudaStreamDestroy(stream);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "twin_gemm_peak: %s\n", e.what());
    return 1;
  }
}

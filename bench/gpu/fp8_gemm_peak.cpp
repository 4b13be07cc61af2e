// twin_fp8_gemm_peak: the FP8 GEMM rate this GPU reaches through cuBLASLt (kernels/cuda/fp8.cuh's try_fp8_gemm, E4M3
// operands, per-tensor scales, bf16 output, full fp32 accumulation), beside the bf16 GEMM's at the same shape, and
// the FP8 linear layer's forward as the cuda backend runs it (amaxes, scales, quantization, then the GEMM). Random
// data, 3 warm-up runs, then the median of 20 timed with CUDA events. Exit status 3 when cuBLASLt has no FP8
// algorithm here (below sm_89).
//
//   twin_fp8_gemm_peak [M N K]          out (M, N) = inp (M, K) @ weight (N, K)^T; 8192 8192 8192 by default
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/gpu/event_timing.hpp"
#include "kernels/cuda/kernels.cuh"

namespace {

namespace k = twin::kernels::cuda;

// `count` bf16 values in [-1, 1) from an LCG (any values but zeros will do), in a new device buffer; cudaFree it.
__nv_bfloat16* device_random_bf16(std::size_t count, std::uint32_t seed) {
  std::vector<__nv_bfloat16> host(count);
  std::uint32_t state = seed * 2654435761u + 1u;
  for (auto& x : host) {
    state = state * 1664525u + 1013904223u;
    x = __float2bfloat16_rn(static_cast<float>(state >> 8) / 8388608.0f - 1.0f);
  }
  __nv_bfloat16* buffer = nullptr;
  TWIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&buffer), count * 2));
  TWIN_CUDA_CHECK(cudaMemcpy(buffer, host.data(), count * 2, cudaMemcpyHostToDevice));
  return buffer;
}

// `launch` enqueues the work on `stream`: its median time over 20 runs after 3 warm-ups (seconds).
template <typename Launch>
double median_s(cudaStream_t stream, Launch launch) {
  return twin::bench::time_on(stream, launch).median_s;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int m = 8192, n = 8192, kk = 8192;
    if (argc == 4) {
      m = std::atoi(argv[1]), n = std::atoi(argv[2]), kk = std::atoi(argv[3]);
    } else if (argc != 1) {
      std::fprintf(stderr, "usage: twin_fp8_gemm_peak [M N K]\n");
      return 2;
    }
    const double flops = 2.0 * m * n * static_cast<double>(kk);
    cudaStream_t stream;
    TWIN_CUDA_CHECK(cudaStreamCreate(&stream));
    k::Cublas blas;
    k::Fp8GemmPlans plans;
    const std::size_t a_count = static_cast<std::size_t>(m) * kk, b_count = static_cast<std::size_t>(n) * kk;
    __nv_bfloat16 *inp = device_random_bf16(a_count, 1), *weight = device_random_bf16(b_count, 2), *out = nullptr;
    TWIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), static_cast<std::size_t>(m) * n * 2));
    std::uint8_t *inp8 = nullptr, *weight8 = nullptr;
    float* scales = nullptr;  // (6): inp scale, inverse; weight scale, inverse; the layer's two amaxes
    TWIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&inp8), a_count));
    TWIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&weight8), b_count));
    TWIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&scales), 6 * sizeof(float)));
    k::fp8_tensor_scale(scales, scales + 1, nullptr, 200.0f, k::Fp8Format::E4M3, stream);
    k::fp8_tensor_scale(scales + 2, scales + 3, nullptr, 200.0f, k::Fp8Format::E4M3, stream);
    k::quantize_fp8(inp8, inp, a_count, scales, k::Fp8Format::E4M3, stream);
    k::quantize_fp8(weight8, weight, b_count, scales + 2, k::Fp8Format::E4M3, stream);
    // out^T (n, m) column-major = weight (n, k) . inp (m, k): A = weight, B = inp (fp8_matmul.cu's fprop)
    const k::Fp8Matrix a{weight8, k::Fp8Format::E4M3, scales + 3}, b{inp8, k::Fp8Format::E4M3, scales + 1};
    if (!k::try_fp8_gemm(blas, plans, n, m, kk, a, b, out, CUDA_R_16BF, false, nullptr, stream)) {
      std::printf("fp8 gemm: cuBLASLt has no FP8 algorithm on this GPU\n");
      return 3;
    }
    const double fp8_s = median_s(
        stream, [&] { k::try_fp8_gemm(blas, plans, n, m, kk, a, b, out, CUDA_R_16BF, false, nullptr, stream); });
    const double bf16_s =
        median_s(stream, [&] { k::matmul_forward(out, inp, weight, nullptr, m, kk, n, blas, stream); });
    const k::Fp8Operand current{k::Fp8Format::E4M3, k::Fp8Scaling::Current, 1.0f};
    const double layer_s = median_s(stream, [&] {
      k::fp8_matmul_forward(out, inp, weight, nullptr, m, kk, n, current, current, scales + 4, blas, plans, stream);
    });
    std::printf("gemm fp8 e4m3 m %d n %d k %d: median %.3f ms, %.1f TFLOP/s\n", m, n, kk, fp8_s * 1e3,
                flops / fp8_s / 1e12);
    std::printf("gemm bf16      m %d n %d k %d: median %.3f ms, %.1f TFLOP/s\n", m, n, kk, bf16_s * 1e3,
                flops / bf16_s / 1e12);
    std::printf("fp8 linear forward (tensorwise: amax, scale, quantize, GEMM): median %.3f ms, %.1f TFLOP/s\n",
                layer_s * 1e3, flops / layer_s / 1e12);
    std::printf("fp8_gemm_tflops %.1f\nfp8_over_bf16 %.2f\n", flops / fp8_s / 1e12, bf16_s / fp8_s);
    for (void* p : {static_cast<void*>(inp), static_cast<void*>(weight), static_cast<void*>(out),
                    static_cast<void*>(inp8), static_cast<void*>(weight8), static_cast<void*>(scales)}) {
      cudaFree(p);
    }
    cudaStreamDestroy(stream);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "twin_fp8_gemm_peak: %s\n", e.what());
    return 1;
  }
}

// Timing GPU work with CUDA events, as twin's GPU microbenchmarks do (gemm_peak.cpp, fp8_gemm_peak.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/check.cuh"

namespace twin::bench {

struct Timing {
  double median_s, min_s;
};

// `launch` enqueues the work on `stream`: 3 warm-up runs, then the median (and min) of 20 timed with CUDA events.
template <typename Launch>
Timing time_on(cudaStream_t stream, Launch launch) {
  cudaEvent_t start, stop;
  TWIN_CUDA_CHECK(cudaEventCreate(&start));
  TWIN_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int run = 0; run < 23; ++run) {
    TWIN_CUDA_CHECK(cudaEventRecord(start, stream));
    launch();
    TWIN_CUDA_CHECK(cudaEventRecord(stop, stream));
    TWIN_CUDA_CHECK(cudaEventSynchronize(stop));
    float elapsed = 0.0f;
    TWIN_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
    if (run >= 3) ms.push_back(elapsed);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2] / 1e3, ms.front() / 1e3};
}

}  // namespace twin::bench

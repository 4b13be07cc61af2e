// Helpers of the CUDA kernel tests: the "skipped: no GPU" guard, device buffers, bf16 host conversions (the CPU twin's,
// kernels/cpu/cast.hpp) and the normalised error that compares a device result with its CPU twin.
//
// Every test that touches the device starts with TWIN_REQUIRE_GPU(): without a usable GPU (no driver, no device, or a
// driver older than the runtime) the test reports SKIPPED with "skipped: no GPU", never a silent pass.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/cpu/cast.hpp"
#include "kernels/cuda/check.cuh"

namespace twin::kernels::cuda::testing {

// true when at least one CUDA device answers (checked once per process)
inline bool gpu_available() {
  static const bool available = [] {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      cudaGetLastError();  // reset the runtime's last error: later checks start clean
      return false;
    }
    return count > 0;
  }();
  return available;
}

#define TWIN_REQUIRE_GPU()                                                                   \
  do {                                                                                       \
    if (!::twin::kernels::cuda::testing::gpu_available()) GTEST_SKIP() << "skipped: no GPU"; \
  } while (0)

// A device allocation of n elements of T, freed on scope exit.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n_ > 0) TWIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), n_ * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return data_; }
  std::size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), n_);
    TWIN_CUDA_CHECK(cudaMemcpy(data_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    TWIN_CUDA_CHECK(cudaDeviceSynchronize());  // surfaces an asynchronous fault of the kernel under test here
    TWIN_CUDA_CHECK(cudaMemcpy(host.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // every byte 0xff: NaN in fp32 and bf16, so an element the kernel under test forgot to write is seen
  void poison() { TWIN_CUDA_CHECK(cudaMemset(data_, 0xff, n_ * sizeof(T))); }

 private:
  T* data_ = nullptr;
  std::size_t n_ = 0;
};

// --- bf16 on the host, through the CPU twin's conversions ------------------------------------------------------------
inline __nv_bfloat16 to_bf16(float x) {
  __nv_bfloat16_raw raw;
  raw.x = cpu::float_to_bf16(x);
  return __nv_bfloat16(raw);
}
inline float to_float(__nv_bfloat16 x) {
  return cpu::bf16_to_float(static_cast<__nv_bfloat16_raw>(x).x);
}
inline std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& x) {
  std::vector<__nv_bfloat16> out;
  out.reserve(x.size());
  for (float v : x) out.push_back(to_bf16(v));
  return out;
}
inline std::vector<float> to_float(const std::vector<__nv_bfloat16>& x) {
  std::vector<float> out;
  out.reserve(x.size());
  for (__nv_bfloat16 v : x) out.push_back(to_float(v));
  return out;
}
// x rounded to bf16 precision: what a bf16 tensor holds, as fp32 for the CPU twin
inline std::vector<float> bf16_rounded(const std::vector<float>& x) {
  return to_float(to_bf16(x));
}

// The normalised error a bf16 result passes at: one bf16 rounding of the result is ~1e-3 normalised.
inline constexpr double kBf16Tolerance = 5e-3;

// A (rows, channels) case of a row kernel (norms), as tests print it.
struct Rows {
  int rows, channels;
};
inline std::ostream& operator<<(std::ostream& out, const Rows& c) {
  return out << "rows " << c.rows << " channels " << c.channels;
}

// --- comparison
// ---------------------------------------------------------------------------------------------------------
// ||got - want||_2 / ||want||_2 within `tolerance` (NaN never passes); names the worst element on failure.
// bf16 carries 8 significant bits: one rounding is at most 2^-9 = 2e-3 relative, so bf16 results pass at 1e-2 and fp32
// results computed from the same bf16 inputs far below it.
template <class Got, class Want>
::testing::AssertionResult normalised_error_below(const Got& got, const Want& want, double tolerance) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << want.size();
  }
  double error = 0.0, norm = 0.0, worst = -1.0;
  std::size_t worst_index = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    const double w = static_cast<double>(want[i]);
    const double d = std::abs(g - w);
    if (!std::isfinite(g)) {
      return ::testing::AssertionFailure() << "element " << i << " of " << got.size() << " is " << g << " (want " << w
                                           << "): unwritten or overflowed";
    }
    error += d * d;
    norm += w * w;
    if (d > worst) worst = d, worst_index = i;
  }
  const double relative = std::sqrt(error) / std::max(std::sqrt(norm), 1e-30);
  if (relative <= tolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "normalised error " << relative << " > " << tolerance << "; worst element "
                                       << worst_index << ": got " << got[worst_index] << ", want " << want[worst_index];
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace twin::kernels::cuda::testing

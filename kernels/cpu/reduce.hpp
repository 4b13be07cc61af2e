// Internal to the CPU kernels: reductions over 8 interleaved partial results. Without -ffast-math a compiler may not
// reorder a single running sum, so such a loop runs one element per cycle; 8 independent lanes vectorize. The order
// of the operations is fixed by n alone: results stay deterministic (and differ from a naive loop's only by rounding).
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>

namespace twin::kernels::cpu::detail {

inline constexpr int kLanes = 8;

// sum over i < n of term(i), accumulated in Accumulator (float or double)
template <class Accumulator, class Term>
inline Accumulator lane_sum(std::size_t n, Term term) {
  Accumulator lanes[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += static_cast<Accumulator>(term(i + l));
  }
  for (int l = 0; i < n; ++i, ++l) lanes[l] += static_cast<Accumulator>(term(i));
  return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

// sum_i a[i] b[i]
inline float dot(const float* a, const float* b, std::size_t n) {
  return lane_sum<float>(n, [&](std::size_t i) { return a[i] * b[i]; });
}

// sum_i a[i]
inline float sum(const float* a, std::size_t n) {
  return lane_sum<float>(n, [&](std::size_t i) { return a[i]; });
}

// max_i a[i], -inf when n = 0 (NaN inputs give an unspecified element: callers feed finite values)
inline float max(const float* a, std::size_t n) {
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, -std::numeric_limits<float>::infinity());
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] = a[i + l] > lanes[l] ? a[i + l] : lanes[l];
  }
  for (int l = 0; i < n; ++i, ++l) lanes[l] = a[i] > lanes[l] ? a[i] : lanes[l];
  return std::max(std::max(std::max(lanes[0], lanes[4]), std::max(lanes[1], lanes[5])),
                  std::max(std::max(lanes[2], lanes[6]), std::max(lanes[3], lanes[7])));
}

}  // namespace twin::kernels::cpu::detail

#include "kernels/cpu/cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/reduce.hpp"

namespace twin::kernels::cpu {

namespace {

// Number of this shard's columns that are real vocabulary entries (global index < valid_vocab).
int valid_local_columns(int vocab_start, int vocab_local, int valid_vocab) {
  return std::clamp(valid_vocab - vocab_start, 0, vocab_local);
}

}  // namespace

void cross_entropy_local_stats(float* stats, const float* logits, const int* targets, int rows, int vocab_start,
                               int vocab_local, int valid_vocab) {
  TWIN_KERNEL_CHECK(rows > 0 && vocab_local > 0 && vocab_start >= 0 && valid_vocab > 0);
  TWIN_KERNEL_CHECK(stats != nullptr && logits != nullptr && targets != nullptr);
  const int columns = valid_local_columns(vocab_start, vocab_local, valid_vocab);
  for (int r = 0; r < rows; ++r) {
    const float* x = logits + static_cast<std::size_t>(r) * vocab_local;
    const int target = targets[r];
    TWIN_KERNEL_CHECK(target >= 0 && target < valid_vocab);
    const std::size_t n = static_cast<std::size_t>(columns);
    const float max_logit = detail::max(x, n);  // -inf when no column is valid
    // terms in float (each within an ulp: exp_cephes, so that the loop vectorizes; a term below e^-87 is 0), their
    // sum in double: over 50k columns a float sum would drop small terms
    const double sum = detail::lane_sum<double>(n, [&](std::size_t v) { return detail::exp_cephes(x[v] - max_logit); });
    const int local_target = target - vocab_start;
    float* s = stats + static_cast<std::size_t>(r) * kCrossEntropyStats;
    s[0] = max_logit;
    s[1] = static_cast<float>(sum);
    s[2] = (local_target >= 0 && local_target < vocab_local) ? x[local_target] : 0.0f;
  }
}

void cross_entropy_combine(float* losses, float* log_sum_exp, const float* gathered_stats, int rows, int shards) {
  TWIN_KERNEL_CHECK(rows > 0 && shards > 0);
  TWIN_KERNEL_CHECK(losses != nullptr && log_sum_exp != nullptr && gathered_stats != nullptr);
  const std::size_t shard_stride = static_cast<std::size_t>(rows) * kCrossEntropyStats;
  for (int r = 0; r < rows; ++r) {
    double max_logit = -std::numeric_limits<double>::infinity();
    for (int s = 0; s < shards; ++s) {
      max_logit = std::max(max_logit, static_cast<double>(gathered_stats[s * shard_stride + r * kCrossEntropyStats]));
    }
    TWIN_KERNEL_CHECK(std::isfinite(max_logit));  // some shard holds a valid column, and the logits are finite
    double sum = 0.0;
    double target_logit = 0.0;
    for (int s = 0; s < shards; ++s) {
      const float* stats = gathered_stats + s * shard_stride + static_cast<std::size_t>(r) * kCrossEntropyStats;
      if (stats[1] > 0.0f) sum += static_cast<double>(stats[1]) * std::exp(static_cast<double>(stats[0]) - max_logit);
      target_logit += stats[2];
    }
    const double lse = max_logit + std::log(sum);
    log_sum_exp[r] = static_cast<float>(lse);
    losses[r] = static_cast<float>(lse - target_logit);
  }
}

void cross_entropy_backward(float* dlogits, const float* logits, const float* log_sum_exp, const int* targets, int rows,
                            int vocab_start, int vocab_local, int valid_vocab, float scale) {
  TWIN_KERNEL_CHECK(rows > 0 && vocab_local > 0 && vocab_start >= 0 && valid_vocab > 0);
  TWIN_KERNEL_CHECK(dlogits != nullptr && logits != nullptr && log_sum_exp != nullptr && targets != nullptr);
  const int columns = valid_local_columns(vocab_start, vocab_local, valid_vocab);
  for (int r = 0; r < rows; ++r) {
    const std::size_t row_offset = static_cast<std::size_t>(r) * vocab_local;
    const float* x = logits + row_offset;
    float* dx = dlogits + row_offset;
    const int target = targets[r];
    TWIN_KERNEL_CHECK(target >= 0 && target < valid_vocab);
    const float lse = log_sum_exp[r];
    const int local_target = target - vocab_start;
    const bool target_is_local = local_target >= 0 && local_target < vocab_local;
    const float target_logit = target_is_local ? x[local_target] : 0.0f;  // read before dx (may alias x) is written
    for (int v = 0; v < columns; ++v) dx[v] = scale * detail::exp_cephes(x[v] - lse);  // p, within an ulp
    std::fill(dx + columns, dx + vocab_local, 0.0f);  // padding: no gradient
    // the target column: scale * (p - 1), subtracting before scaling (exact near p = 1)
    if (target_is_local) dx[local_target] = scale * (std::exp(target_logit - lse) - 1.0f);
  }
}

}  // namespace twin::kernels::cpu

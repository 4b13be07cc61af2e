// Vocab-parallel cross-entropy on the device against its CPU twin, whole and split over shards with padding (skipped
// without a GPU).
#include <gtest/gtest.h>

#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "cuda_test_util.hpp"
#include "kernels/cpu/cross_entropy.hpp"
#include "kernels/cuda/cross_entropy.cuh"

namespace twin::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cpu::testing::random_tokens;
using cpu::testing::random_vector;
using testing::bf16_rounded;
using testing::DeviceBuffer;
using testing::normalised_error_below;
using testing::to_bf16;
using testing::to_float;

// rows of logits over `padded` columns, of which the first `valid` are the vocabulary, split over `shards`
void check_against_cpu(int rows, int padded, int valid, int shards) {
  const int local = padded / shards;
  const auto logits = bf16_rounded(random_vector(static_cast<std::size_t>(rows) * padded, 1, -8.0f, 8.0f));
  const auto targets = random_tokens(rows, valid, 2);
  const float scale = 1.0f / static_cast<float>(rows);
  DeviceBuffer<int> d_targets(targets);
  std::vector<float> gathered(static_cast<std::size_t>(shards) * rows * 3);
  DeviceBuffer<float> d_gathered(gathered.size());
  std::vector<std::vector<float>> shard_logits;
  for (int s = 0; s < shards; ++s) {  // (1) per shard, on both sides
    std::vector<float> x(static_cast<std::size_t>(rows) * local);
    for (int r = 0; r < rows; ++r) {
      for (int v = 0; v < local; ++v) x[r * local + v] = logits[static_cast<std::size_t>(r) * padded + s * local + v];
    }
    float* want_stats = gathered.data() + static_cast<std::size_t>(s) * rows * 3;
    cpu::cross_entropy_local_stats(want_stats, x.data(), targets.data(), rows, s * local, local, valid);
    DeviceBuffer<bf16> d_x(to_bf16(x));
    cross_entropy_local_stats(d_gathered.get() + static_cast<std::size_t>(s) * rows * 3, d_x.get(), d_targets.get(),
                              rows, s * local, local, valid, nullptr);
    shard_logits.push_back(x);
  }
  const auto got_stats = d_gathered.download();
  // stats of a shard without valid columns are (-inf, 0, 0) on both sides; compare the finite ones
  std::vector<float> got_finite, want_finite;
  for (std::size_t i = 0; i < gathered.size(); ++i) {
    if (std::isinf(gathered[i])) {
      EXPECT_EQ(got_stats[i], gathered[i]) << "stat " << i;
      continue;
    }
    got_finite.push_back(got_stats[i]);
    want_finite.push_back(gathered[i]);
  }
  EXPECT_TRUE(normalised_error_below(got_finite, want_finite, 1e-5));

  // (2) on the CPU twin's gathered stats: only the combine differs
  std::vector<float> losses(rows), lse(rows);
  cpu::cross_entropy_combine(losses.data(), lse.data(), gathered.data(), rows, shards);
  DeviceBuffer<float> d_want_gathered(gathered), d_losses(rows), d_lse(rows);
  d_losses.poison(), d_lse.poison();
  cross_entropy_combine(d_losses.get(), d_lse.get(), d_want_gathered.get(), rows, shards, nullptr);
  EXPECT_TRUE(normalised_error_below(d_losses.download(), losses, 1e-6));
  EXPECT_TRUE(normalised_error_below(d_lse.download(), lse, 1e-6));

  // (3) per shard, in place over the logits as the executor does
  for (int s = 0; s < shards; ++s) {
    std::vector<float> dlogits(shard_logits[s].size());
    cpu::cross_entropy_backward(dlogits.data(), shard_logits[s].data(), lse.data(), targets.data(), rows, s * local,
                                local, valid, scale);
    DeviceBuffer<bf16> d_x(to_bf16(shard_logits[s]));
    cross_entropy_backward(d_x.get(), d_x.get(), d_lse.get(), d_targets.get(), rows, s * local, local, valid, scale,
                           nullptr);
    EXPECT_TRUE(normalised_error_below(to_float(d_x.download()), dlogits, 5e-3)) << "shard " << s;
  }
}

TEST(CudaCrossEntropy, OneShardMatchesCpuTwin) {
  TWIN_REQUIRE_GPU();
  check_against_cpu(37, 1000, 1000, 1);
  check_against_cpu(8, 50304, 50257, 1);  // GPT-2's vocabulary, padded
}

TEST(CudaCrossEntropy, ShardsWithPaddingMatchCpuTwin) {
  TWIN_REQUIRE_GPU();
  check_against_cpu(20, 512, 300, 4);  // shard 3 holds padding only
  check_against_cpu(5, 32, 20, 4);
}

}  // namespace
}  // namespace twin::kernels::cuda

// Vocab-parallel cross-entropy: split over 1, 2, 4 shards equals the unsplit computation and a double reference,
// padded columns change nothing, and the backward matches central finite differences.
#include "kernels/cpu/cross_entropy.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernel_test_util.hpp"

namespace twin::kernels::cpu {
namespace {

using testing::all_close;
using testing::numeric_gradient;
using testing::random_tokens;
using testing::random_vector;
using testing::to_double;

struct CrossEntropyResult {
  std::vector<float> losses;       // (rows)
  std::vector<float> log_sum_exp;  // (rows)
  std::vector<float> dlogits;      // (rows, padded_vocab), the shards' columns put back side by side
};

// The three steps as the executor runs them: each shard's local stats, an all-gather, the combine on every shard
// (which must agree to the bit), each shard's backward.
CrossEntropyResult run_vocab_parallel(const std::vector<float>& logits, const std::vector<int>& targets, int rows,
                                      int padded_vocab, int valid_vocab, int shards, float scale) {
  const int vocab_local = padded_vocab / shards;
  std::vector<std::vector<float>> shard_logits(shards, std::vector<float>(rows * vocab_local));
  for (int s = 0; s < shards; ++s)
    for (int r = 0; r < rows; ++r)
      for (int v = 0; v < vocab_local; ++v)
        shard_logits[s][r * vocab_local + v] = logits[r * padded_vocab + s * vocab_local + v];

  std::vector<float> gathered(shards * rows * kCrossEntropyStats);  // (shards, rows, 3)
  for (int s = 0; s < shards; ++s) {
    cross_entropy_local_stats(gathered.data() + s * rows * kCrossEntropyStats, shard_logits[s].data(), targets.data(),
                              rows, s * vocab_local, vocab_local, valid_vocab);
  }
  CrossEntropyResult result{std::vector<float>(rows), std::vector<float>(rows),
                            std::vector<float>(rows * padded_vocab)};
  cross_entropy_combine(result.losses.data(), result.log_sum_exp.data(), gathered.data(), rows, shards);
  for (int s = 0; s < shards; ++s) {
    std::vector<float> losses(rows), lse(rows);
    cross_entropy_combine(losses.data(), lse.data(), gathered.data(), rows, shards);
    EXPECT_TRUE(testing::same_bits(losses, result.losses) && testing::same_bits(lse, result.log_sum_exp));
    std::vector<float> dlogits(rows * vocab_local, std::numeric_limits<float>::quiet_NaN());
    cross_entropy_backward(dlogits.data(), shard_logits[s].data(), lse.data(), targets.data(), rows, s * vocab_local,
                           vocab_local, valid_vocab, scale);
    for (int r = 0; r < rows; ++r)
      for (int v = 0; v < vocab_local; ++v)
        result.dlogits[r * padded_vocab + s * vocab_local + v] = dlogits[r * vocab_local + v];
  }
  return result;
}

// loss[r] = log sum_{v < valid_vocab} exp(x[r, v]) - x[r, target[r]], in double
std::vector<double> losses_reference(const std::vector<double>& logits, const std::vector<int>& targets, int rows,
                                     int padded_vocab, int valid_vocab) {
  std::vector<double> losses(rows);
  for (int r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (int v = 0; v < valid_vocab; ++v) sum += std::exp(logits[r * padded_vocab + v]);
    losses[r] = std::log(sum) - logits[r * padded_vocab + targets[r]];
  }
  return losses;
}

constexpr int kRows = 10, kPaddedVocab = 48, kValidVocab = 45;  // 48 = 4 shards x 12 columns, the last 3 padding

TEST(CpuCrossEntropy, SingleShardMatchesDoubleReference) {
  const auto logits = random_vector(kRows * kPaddedVocab, 1, -4.0f, 4.0f);
  const auto targets = random_tokens(kRows, kValidVocab, 2);
  const auto result = run_vocab_parallel(logits, targets, kRows, kPaddedVocab, kValidVocab, 1, 1.0f);
  const auto want = losses_reference(to_double(logits), targets, kRows, kPaddedVocab, kValidVocab);
  EXPECT_TRUE(all_close(result.losses, want, 1e-5, 1e-5));
}

TEST(CpuCrossEntropy, SplitOverShardsEqualsUnsplit) {
  const auto logits = random_vector(kRows * kPaddedVocab, 3, -8.0f, 8.0f);
  auto targets = random_tokens(kRows, kValidVocab, 4);
  targets[0] = 0;
  targets[1] = kValidVocab - 1;  // the last valid column, in the shard that also holds the padding
  const auto unsplit = run_vocab_parallel(logits, targets, kRows, kPaddedVocab, kValidVocab, 1, 0.25f);
  for (int shards : {2, 4}) {
    const auto split = run_vocab_parallel(logits, targets, kRows, kPaddedVocab, kValidVocab, shards, 0.25f);
    EXPECT_TRUE(all_close(split.losses, unsplit.losses, 1e-6, 1e-6)) << shards << " shards";
    EXPECT_TRUE(all_close(split.log_sum_exp, unsplit.log_sum_exp, 1e-6, 1e-6)) << shards << " shards";
    EXPECT_TRUE(all_close(split.dlogits, unsplit.dlogits, 1e-7, 1e-6)) << shards << " shards";
  }
}

TEST(CpuCrossEntropy, PaddedColumnsChangeNothing) {
  const auto logits = random_vector(kRows * kPaddedVocab, 5, -4.0f, 4.0f);
  const auto targets = random_tokens(kRows, kValidVocab, 6);
  // without padding: the valid columns alone, one shard
  std::vector<float> compact(kRows * kValidVocab);
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < kValidVocab; ++v) compact[r * kValidVocab + v] = logits[r * kPaddedVocab + v];
  const auto without = run_vocab_parallel(compact, targets, kRows, kValidVocab, kValidVocab, 1, 1.0f);
  // with padding holding values that would dominate the softmax, or NaN
  for (float garbage : {1e4f, std::numeric_limits<float>::quiet_NaN()}) {
    auto padded = logits;
    for (int r = 0; r < kRows; ++r)
      for (int v = kValidVocab; v < kPaddedVocab; ++v) padded[r * kPaddedVocab + v] = garbage;
    for (int shards : {1, 2, 4}) {
      const auto with = run_vocab_parallel(padded, targets, kRows, kPaddedVocab, kValidVocab, shards, 1.0f);
      EXPECT_TRUE(all_close(with.losses, without.losses, 1e-6, 1e-6)) << shards << " shards, padding " << garbage;
      for (int r = 0; r < kRows; ++r) {
        for (int v = 0; v < kPaddedVocab; ++v) {
          const float got = with.dlogits[r * kPaddedVocab + v];
          if (v < kValidVocab) {
            EXPECT_NEAR(got, without.dlogits[r * kValidVocab + v], 1e-6f);
          } else {
            EXPECT_EQ(got, 0.0f) << "padded column " << v;
          }
        }
      }
    }
  }
}

TEST(CpuCrossEntropy, ShardWithOnlyPadding) {  // valid 20 of 32 columns over 4 shards: shard 3 holds no valid column
  const int rows = 6, padded_vocab = 32, valid_vocab = 20;
  const auto logits = random_vector(rows * padded_vocab, 7, -3.0f, 3.0f);
  const auto targets = random_tokens(rows, valid_vocab, 8);
  const auto unsplit = run_vocab_parallel(logits, targets, rows, padded_vocab, valid_vocab, 1, 1.0f);
  const auto split = run_vocab_parallel(logits, targets, rows, padded_vocab, valid_vocab, 4, 1.0f);
  EXPECT_TRUE(all_close(split.losses, unsplit.losses, 1e-6, 1e-6));
  EXPECT_TRUE(all_close(split.dlogits, unsplit.dlogits, 1e-7, 1e-6));
  EXPECT_TRUE(all_close(unsplit.losses, losses_reference(to_double(logits), targets, rows, padded_vocab, valid_vocab),
                        1e-5, 1e-5));
}

TEST(CpuCrossEntropy, BackwardMatchesFiniteDifferences) {
  const int rows = 4, padded_vocab = 12, valid_vocab = 10;
  const float scale = 1.0f / rows;  // gradient of the mean loss
  const auto logits = random_vector(rows * padded_vocab, 11, -2.0f, 2.0f);
  const auto targets = random_tokens(rows, valid_vocab, 12);
  auto want = numeric_gradient(
      [&](const std::vector<double>& x) {
        double mean = 0.0;
        for (double loss : losses_reference(x, targets, rows, padded_vocab, valid_vocab)) mean += loss * scale;
        return mean;
      },
      to_double(logits));
  for (int shards : {1, 2}) {
    const auto result = run_vocab_parallel(logits, targets, rows, padded_vocab, valid_vocab, shards, scale);
    EXPECT_TRUE(all_close(result.dlogits, want, 1e-6, 1e-4)) << shards << " shards";
  }
}

TEST(CpuCrossEntropy, BackwardInPlaceOverLogits) {
  const int rows = 5, vocab = 16;
  const auto logits = random_vector(rows * vocab, 21, -2.0f, 2.0f);
  const auto targets = random_tokens(rows, vocab, 22);
  const auto reference = run_vocab_parallel(logits, targets, rows, vocab, vocab, 1, 0.5f);
  auto in_place = logits;
  cross_entropy_backward(in_place.data(), in_place.data(), reference.log_sum_exp.data(), targets.data(), rows, 0, vocab,
                         vocab, 0.5f);
  EXPECT_TRUE(testing::same_bits(in_place, reference.dlogits));
}

TEST(CpuCrossEntropy, RejectsTargetOutsideValidVocab) {
  const int rows = 2, vocab = 8;
  const auto logits = random_vector(rows * vocab, 31);
  std::vector<int> targets = {1, 7};
  std::vector<float> stats(rows * kCrossEntropyStats);
  EXPECT_THROW(cross_entropy_local_stats(stats.data(), logits.data(), targets.data(), rows, 0, vocab, 7),
               std::invalid_argument);  // column 7 is padding
}

}  // namespace
}  // namespace twin::kernels::cpu

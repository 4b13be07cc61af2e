// Vocab-parallel word embedding (split over 1, 2, 4 shards equals the unsplit lookup) and position embedding.
#include "kernels/cpu/embedding.hpp"

#include <gtest/gtest.h>

#include "kernel_test_util.hpp"

namespace twin::kernels::cpu {
namespace {

using testing::random_tokens;
using testing::random_vector;
using testing::same_bits;

constexpr int kEmbeddingRows = 24, kChannels = 6, kVocab = 40;  // vocab divisible by every shard count below

TEST(CpuEmbedding, ForwardLooksUpRows) {
  const auto wte = random_vector(kVocab * kChannels, 1);
  const auto tokens = random_tokens(kEmbeddingRows, kVocab, 2);
  std::vector<float> out(kEmbeddingRows * kChannels);
  embedding_forward(out.data(), tokens.data(), wte.data(), kEmbeddingRows, kChannels, 0, kVocab);
  for (int r = 0; r < kEmbeddingRows; ++r)
    for (int c = 0; c < kChannels; ++c) EXPECT_EQ(out[r * kChannels + c], wte[tokens[r] * kChannels + c]);
}

TEST(CpuEmbedding, VocabParallelForwardSumsToUnsplit) {
  const auto wte = random_vector(kVocab * kChannels, 3);
  const auto tokens = random_tokens(kEmbeddingRows, kVocab, 4);
  std::vector<float> unsplit(kEmbeddingRows * kChannels);
  embedding_forward(unsplit.data(), tokens.data(), wte.data(), kEmbeddingRows, kChannels, 0, kVocab);
  for (int shards : {1, 2, 4}) {
    const int vocab_local = kVocab / shards;
    std::vector<float> sum(kEmbeddingRows * kChannels, 0.0f), part(kEmbeddingRows * kChannels);
    for (int s = 0; s < shards; ++s) {
      const int vocab_start = s * vocab_local;
      embedding_forward(part.data(), tokens.data(), wte.data() + vocab_start * kChannels, kEmbeddingRows, kChannels,
                        vocab_start, vocab_local);
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];  // the executor's TP all-reduce
    }
    EXPECT_TRUE(same_bits(sum, unsplit)) << shards << " shards";
  }
}

TEST(CpuEmbedding, VocabParallelBackwardEqualsUnsplit) {
  auto tokens = random_tokens(kEmbeddingRows, kVocab, 5);
  tokens[3] = tokens[7] = tokens[11] = 17;  // a repeated token accumulates
  const auto dout = random_vector(kEmbeddingRows * kChannels, 6);
  const auto dwte_before = random_vector(kVocab * kChannels, 7);
  auto unsplit = dwte_before;
  embedding_backward(unsplit.data(), dout.data(), tokens.data(), kEmbeddingRows, kChannels, 0, kVocab);
  // reference: dwte[token] += dout[r], rows in order, in double
  std::vector<double> want(dwte_before.begin(), dwte_before.end());
  for (int r = 0; r < kEmbeddingRows; ++r)
    for (int c = 0; c < kChannels; ++c) want[tokens[r] * kChannels + c] += dout[r * kChannels + c];
  EXPECT_TRUE(testing::all_close(unsplit, want, 1e-6, 1e-6));
  for (int shards : {1, 2, 4}) {
    const int vocab_local = kVocab / shards;
    auto split = dwte_before;  // shard s owns rows [s * vocab_local, (s + 1) * vocab_local)
    for (int s = 0; s < shards; ++s) {
      const int vocab_start = s * vocab_local;
      embedding_backward(split.data() + vocab_start * kChannels, dout.data(), tokens.data(), kEmbeddingRows, kChannels,
                         vocab_start, vocab_local);
    }
    EXPECT_TRUE(same_bits(split, unsplit)) << shards << " shards";
  }
}

TEST(CpuEmbedding, RejectsNegativeToken) {
  const auto wte = random_vector(kVocab * kChannels, 8);
  std::vector<int> tokens = {1, -1};
  std::vector<float> out(2 * kChannels);
  EXPECT_THROW(embedding_forward(out.data(), tokens.data(), wte.data(), 2, kChannels, 0, kVocab),
               std::invalid_argument);
}

TEST(CpuPositionEmbedding, ForwardAddsAndBackwardSumsOverBatch) {
  const int B = 3, T = 5, C = 4, max_seq = 8;
  const auto wpe = random_vector(max_seq * C, 11);
  const auto x = random_vector(B * T * C, 12);
  auto out = x;
  position_embedding_forward(out.data(), wpe.data(), B, T, C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) EXPECT_EQ(out[(b * T + t) * C + c], x[(b * T + t) * C + c] + wpe[t * C + c]);

  const auto dout = random_vector(B * T * C, 13);
  const auto dwpe_before = random_vector(max_seq * C, 14);
  auto dwpe = dwpe_before;
  position_embedding_backward(dwpe.data(), dout.data(), B, T, C);
  for (int t = 0; t < max_seq; ++t) {
    for (int c = 0; c < C; ++c) {
      double want = dwpe_before[t * C + c];
      for (int b = 0; b < B && t < T; ++b) want += dout[(b * T + t) * C + c];
      EXPECT_NEAR(dwpe[t * C + c], want, 1e-6) << "t " << t << " c " << c;
    }
  }
}

}  // namespace
}  // namespace twin::kernels::cpu

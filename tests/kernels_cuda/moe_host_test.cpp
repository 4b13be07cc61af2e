// The MoE formulas the CUDA kernels share with the host (kernels/cuda/moe_math.hpp), run on the CPU against
// kernels/cpu/moe.hpp: the router's top-k choice (ties included) and softmaxes, its backward with the load-balancing
// loss, the loss from column sums, the permutation kernels' element bodies and the chunk sort's copies. No GPU needed:
// where the operations are the CPU twin's, the bits are too.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "kernels/cpu/moe.hpp"
#include "kernels/cuda/moe_math.hpp"

namespace twin::kernels::cuda {
namespace {

using cpu::testing::random_vector;

constexpr int kTokens = 64, kExperts = 16, kTopK = 4, kHidden = 24;

// logits on a coarse grid (multiples of 1/4 in [-2, 2]): many equal logits in a row, so ties decide choices
std::vector<float> tied_logits(unsigned seed) {
  std::vector<float> x = random_vector(kTokens * kExperts, seed, -2.0f, 2.0f);
  for (float& v : x) v = std::round(v * 4.0f) / 4.0f;
  return x;
}

// the host run of the device's top-k softmax: moe_math::topk then moe_math::softmax over the chosen logits
void topk_softmax(std::vector<float>& probs, std::vector<int>& experts, const std::vector<float>& logits) {
  probs.assign(kTokens * kTopK, 0.0f);
  experts.assign(kTokens * kTopK, -1);
  for (int t = 0; t < kTokens; ++t) {
    const float* row = logits.data() + t * kExperts;
    int* chosen = experts.data() + t * kTopK;
    moe_math::topk(
        chosen, [row](int e) { return row[e]; }, kExperts, kTopK);
    moe_math::softmax(
        probs.data() + t * kTopK, [row, chosen](int j) { return row[chosen[j]]; }, kTopK);
  }
}

TEST(CudaMoeMath, TopkChoosesAsTheCpuTwinTiesIncluded) {
  for (unsigned seed : {1u, 2u, 3u}) {
    const std::vector<float> logits = tied_logits(seed);
    std::vector<float> want_probs(kTokens * kTopK), probs;
    std::vector<int> want_experts(kTokens * kTopK), experts;
    cpu::moe_topk_softmax_forward(want_probs.data(), want_experts.data(), logits.data(), kTokens, kExperts, kTopK);
    topk_softmax(probs, experts, logits);
    EXPECT_EQ(experts, want_experts) << "seed " << seed;
    EXPECT_EQ(probs, want_probs) << "seed " << seed;  // same operations: same bits
  }
  // a tie the CPU breaks by index: experts 3 and 1 share the largest logit, 1 comes first
  const float row[5] = {0.0f, 2.0f, -1.0f, 2.0f, 1.0f};
  int chosen[3];
  moe_math::topk(
      chosen, [&row](int e) { return row[e]; }, 5, 3);
  EXPECT_EQ(chosen[0], 1);
  EXPECT_EQ(chosen[1], 3);
  EXPECT_EQ(chosen[2], 4);
}

TEST(CudaMoeMath, ANonFiniteRowStillChoosesDistinctExperts) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float row[6] = {nan, 1.0f, nan, nan, 0.5f, nan};
  int chosen[4];
  moe_math::topk(
      chosen, [&row](int e) { return row[e]; }, 6, 4);
  const std::set<int> distinct(chosen, chosen + 4);
  EXPECT_EQ(distinct.size(), 4u);
  for (int e : chosen) EXPECT_TRUE(e >= 0 && e < 6) << e;
}

TEST(CudaMoeMath, RouterScoresAreTheCpuTwins) {
  const std::vector<float> logits = random_vector(kTokens * kExperts, 4, -6.0f, 6.0f);
  std::vector<float> want(logits.size()), got(logits.size());
  cpu::moe_router_scores_forward(want.data(), logits.data(), kTokens, kExperts);
  for (int t = 0; t < kTokens; ++t) {
    const float* row = logits.data() + t * kExperts;
    moe_math::softmax(
        got.data() + t * kExperts, [row](int e) { return row[e]; }, kExperts);
  }
  EXPECT_EQ(got, want);
}

TEST(CudaMoeMath, RouterBackwardIsTheCpuTwinsWithAndWithoutTheLoadBalancingLoss) {
  const std::vector<float> logits = tied_logits(5);
  std::vector<float> probs;
  std::vector<int> experts;
  topk_softmax(probs, experts, logits);
  const std::vector<float> dprobs = random_vector(kTokens * kTopK, 6);
  std::vector<float> scores(logits.size()), counts(kExperts);
  cpu::moe_router_scores_forward(scores.data(), logits.data(), kTokens, kExperts);
  cpu::moe_tokens_per_expert(counts.data(), experts.data(), kTokens, kExperts, kTopK);
  const double total_tokens = 2.0 * kTokens, coeff = 1e-2, loss_grad = 0.25;  // this rank holds half the micro-batch
  for (bool aux : {false, true}) {
    std::vector<float> want(logits.size()), got(logits.size(), std::numeric_limits<float>::quiet_NaN());
    cpu::moe_topk_softmax_backward(want.data(), dprobs.data(), probs.data(), experts.data(), kTokens, kExperts, kTopK);
    if (aux) {
      cpu::moe_aux_loss_backward(want.data(), scores.data(), counts.data(), kTokens, kExperts, kTopK, total_tokens,
                                 coeff, loss_grad);
    }
    const float scale = moe_math::aux_loss_grad_scale(kExperts, kTopK, total_tokens, coeff, loss_grad);
    for (int t = 0; t < kTokens; ++t) {
      const float* s = scores.data() + t * kExperts;
      float* d = got.data() + t * kExperts;
      moe_math::router_backward_row([d](int e, float value) { d[e] = value; }, probs.data() + t * kTopK,
                                    dprobs.data() + t * kTopK, experts.data() + t * kTopK, [s](int e) { return s[e]; },
                                    [&counts](int e) { return counts[e]; }, aux, scale, kExperts, kTopK);
    }
    EXPECT_EQ(got, want) << (aux ? "with" : "without") << " the load-balancing loss";
  }
}

TEST(CudaMoeMath, LoadBalancingLossFromColumnSumsIsTheCpuTwins) {
  const std::vector<float> logits = random_vector(kTokens * kExperts, 7, -3.0f, 3.0f);
  std::vector<float> scores(logits.size()), probs(kTokens * kTopK), counts(kExperts);
  std::vector<int> experts(kTokens * kTopK);
  cpu::moe_router_scores_forward(scores.data(), logits.data(), kTokens, kExperts);
  cpu::moe_topk_softmax_forward(probs.data(), experts.data(), logits.data(), kTokens, kExperts, kTopK);
  cpu::moe_tokens_per_expert(counts.data(), experts.data(), kTokens, kExperts, kTopK);
  const double want = cpu::moe_aux_loss_forward(scores.data(), counts.data(), kTokens, kExperts, kTopK, kTokens, 1e-2);
  std::vector<double> sums(kExperts, 0.0);  // what moe_score_sums computes, here in token order
  for (int t = 0; t < kTokens; ++t) {
    for (int e = 0; e < kExperts; ++e) sums[e] += scores[t * kExperts + e];
  }
  const double got = moe_math::aux_loss(sums.data(), counts.data(), kExperts, kTopK, kTokens, 1e-2);
  EXPECT_NEAR(got, want, 1e-12 * want);  // another order of the same double sum
  EXPECT_GT(want, 0.0);
}

// The permutation kernels' element bodies, run over every element on fp32 buffers: kernels/cpu's bits
TEST(CudaMoeMath, PermutationKernelBodiesAreTheCpuTwins) {
  const std::vector<float> logits = random_vector(kTokens * kExperts, 8);
  std::vector<float> probs;
  std::vector<int> experts;
  topk_softmax(probs, experts, logits);
  std::vector<int> rows(kTokens * kTopK), rows_per_expert(kExperts);
  cpu::moe_permutation(rows.data(), rows_per_expert.data(), experts.data(), kTokens, kExperts, kTopK);
  const std::size_t slots_n = static_cast<std::size_t>(kTokens) * kTopK * kHidden, tokens_n = kTokens * kHidden;
  const std::vector<float> x = random_vector(tokens_n, 9), permuted_grad = random_vector(slots_n, 10);
  const std::vector<float> expert_out = random_vector(slots_n, 11), dy = random_vector(tokens_n, 12);
  std::vector<float> want_permuted(slots_n), want_dx(tokens_n), want_y(tokens_n), want_d_rows(slots_n),
      want_dprobs(kTokens * kTopK);
  cpu::moe_permute_forward(want_permuted.data(), x.data(), rows.data(), kTokens, kHidden, kTopK);
  cpu::moe_permute_backward(want_dx.data(), permuted_grad.data(), rows.data(), kTokens, kHidden, kTopK);
  cpu::moe_unpermute_forward(want_y.data(), expert_out.data(), probs.data(), rows.data(), kTokens, kHidden, kTopK);
  cpu::moe_unpermute_backward(want_d_rows.data(), want_dprobs.data(), dy.data(), expert_out.data(), probs.data(),
                              rows.data(), kTokens, kHidden, kTopK);

  const auto load = [](const std::vector<float>& v) { return [&v](std::size_t at) { return v[at]; }; };
  const auto store = [](std::vector<float>& v) { return [&v](std::size_t at, float value) { v[at] = value; }; };
  const float nan = std::numeric_limits<float>::quiet_NaN();  // an element no body writes stays NaN
  std::vector<float> permuted(slots_n, nan), dx(tokens_n, nan), y(tokens_n, nan), d_rows(slots_n, nan);
  for (std::size_t i = 0; i < slots_n; ++i) {
    moe_math::permute_forward_element(i, store(permuted), load(x), rows.data(), kHidden, kTopK);
    moe_math::unpermute_backward_element(i, store(d_rows), load(dy), probs.data(), rows.data(), kHidden, kTopK);
  }
  for (std::size_t i = 0; i < tokens_n; ++i) {
    moe_math::permute_backward_element(i, store(dx), load(permuted_grad), rows.data(), kHidden, kTopK);
    moe_math::unpermute_forward_element(i, store(y), load(expert_out), probs.data(), rows.data(), kHidden, kTopK);
  }
  EXPECT_EQ(permuted, want_permuted);
  EXPECT_EQ(dx, want_dx);
  EXPECT_EQ(y, want_y);
  EXPECT_EQ(d_rows, want_d_rows);
}

// The chunk sort's copies, planned on the host and applied row by row, against kernels/cpu's sort both ways
TEST(CudaMoeMath, ChunkSortCopiesAreTheCpuTwins) {
  const std::vector<int> chunk_rows = {3, 0, 2, 1, 0, 4, 2, 5};  // 2 peers x 4 local experts, some empty
  const std::vector<int> order = {0, 4, 1, 5, 2, 6, 3, 7};       // expert-major
  const int chunks = 8, rows = 17;
  const std::vector<float> received = random_vector(static_cast<std::size_t>(rows) * kHidden, 13);
  std::vector<float> want(received.size()), want_back(received.size());
  cpu::moe_sort_chunks_forward(want.data(), received.data(), chunk_rows.data(), order.data(), chunks, kHidden);
  cpu::moe_sort_chunks_backward(want_back.data(), want.data(), chunk_rows.data(), order.data(), chunks, kHidden);
  std::vector<moe_math::ChunkCopy> copies;
  ASSERT_TRUE(moe_math::sort_chunk_copies(copies, chunk_rows.data(), order.data(), chunks));
  EXPECT_EQ(copies.size(), 6u);  // the two empty chunks copy nothing
  std::vector<float> sorted(received.size(), std::numeric_limits<float>::quiet_NaN()), back(sorted);
  for (const moe_math::ChunkCopy& c : copies) {
    for (std::size_t e = 0; e < c.rows * kHidden; ++e) {
      sorted[c.sorted_row * kHidden + e] = received[c.unsorted_row * kHidden + e];
      back[c.unsorted_row * kHidden + e] = sorted[c.sorted_row * kHidden + e];
    }
  }
  EXPECT_EQ(sorted, want);
  EXPECT_EQ(back, want_back);
  const std::vector<int> repeated = {0, 4, 1, 5, 2, 6, 3, 3}, negative = {3, 0, 2, -1, 0, 4, 2, 5};
  EXPECT_FALSE(moe_math::sort_chunk_copies(copies, chunk_rows.data(), repeated.data(), chunks));
  EXPECT_FALSE(moe_math::sort_chunk_copies(copies, negative.data(), order.data(), chunks));
  EXPECT_TRUE(copies.empty());
}

}  // namespace
}  // namespace twin::kernels::cuda

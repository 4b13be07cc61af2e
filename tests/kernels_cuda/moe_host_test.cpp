// The MoE formulas the CUDA kernels share with the host (kernels/cuda/moe_math.hpp), run on the CPU against
// kernels/cpu/moe.hpp: the router's top-k choice (ties included) and softmaxes, its backward with the load-balancing
// loss, the loss from column sums, and the permutation's per-element sums. No GPU needed: where the operations are
// the CPU twin's, the bits are too.
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

TEST(CudaMoeMath, PermutationSumsAreTheCpuTwins) {
  const std::vector<float> logits = random_vector(kTokens * kExperts, 8);
  std::vector<float> probs;
  std::vector<int> experts;
  topk_softmax(probs, experts, logits);
  std::vector<int> rows(kTokens * kTopK), rows_per_expert(kExperts);
  cpu::moe_permutation(rows.data(), rows_per_expert.data(), experts.data(), kTokens, kExperts, kTopK);
  const std::vector<float> permuted = random_vector(kTokens * kTopK * kHidden, 9);
  std::vector<float> want_out(kTokens * kHidden), want_dinp(kTokens * kHidden);
  cpu::moe_unpermute_forward(want_out.data(), permuted.data(), probs.data(), rows.data(), kTokens, kHidden, kTopK);
  cpu::moe_permute_backward(want_dinp.data(), permuted.data(), rows.data(), kTokens, kHidden, kTopK);
  std::vector<float> out(want_out.size()), dinp(want_dinp.size());
  for (int t = 0; t < kTokens; ++t) {
    const int* row = rows.data() + t * kTopK;
    const float* p = probs.data() + t * kTopK;
    for (int c = 0; c < kHidden; ++c) {
      const auto x = [&](int j) { return permuted[row[j] * kHidden + c]; };
      out[t * kHidden + c] = moe_math::weighted_sum([p](int j) { return p[j]; }, x, kTopK);
      dinp[t * kHidden + c] = moe_math::slot_sum(x, kTopK);
    }
  }
  EXPECT_EQ(out, want_out);
  EXPECT_EQ(dinp, want_dinp);
}

}  // namespace
}  // namespace twin::kernels::cuda

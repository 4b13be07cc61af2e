// The MoE kernels against hand-computed values, double references and central finite differences.
#include "kernels/cpu/moe.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "kernel_test_util.hpp"

namespace twin::kernels::cpu {
namespace {

using testing::all_close;
using testing::numeric_gradient;
using testing::random_vector;
using testing::to_double;
using testing::weighted_sum;

std::vector<double> softmax_reference(const std::vector<double>& x) {
  double largest = x[0];
  for (double v : x) largest = std::max(largest, v);
  std::vector<double> out(x.size());
  double sum = 0;
  for (std::size_t i = 0; i < x.size(); ++i) sum += out[i] = std::exp(x[i] - largest);
  for (double& v : out) v /= sum;
  return out;
}

// probs (T, k): for fixed chosen experts, the softmax over each token's chosen logits.
std::vector<double> topk_probs_reference(const std::vector<double>& logits, const std::vector<int>& experts, int tokens,
                                         int num_experts, int top_k) {
  std::vector<double> probs;
  for (int t = 0; t < tokens; ++t) {
    std::vector<double> chosen;
    for (int j = 0; j < top_k; ++j) chosen.push_back(logits[t * num_experts + experts[t * top_k + j]]);
    for (double p : softmax_reference(chosen)) probs.push_back(p);
  }
  return probs;
}

// The Switch loss of these logits' full softmax with fixed counts.
double aux_loss_reference(const std::vector<double>& logits, const std::vector<float>& counts, int tokens,
                          int num_experts, int top_k, double total_tokens, double coeff) {
  double sum = 0;
  for (int t = 0; t < tokens; ++t) {
    const std::vector<double> row(logits.begin() + t * num_experts, logits.begin() + (t + 1) * num_experts);
    const std::vector<double> scores = softmax_reference(row);
    for (int e = 0; e < num_experts; ++e) sum += scores[e] * counts[e];
  }
  return coeff * num_experts / (top_k * total_tokens * total_tokens) * sum;
}

TEST(CpuMoe, TopKPicksTheLargestLogitsLowerExpertFirstOnTies) {
  const std::vector<float> logits{1, 3,  2, 3,   // a tie at the top: expert 1 before expert 3
                                  0, -1, 5, 2};  // experts 2 and 3
  std::vector<float> probs(4);
  std::vector<int> experts(4);
  moe_topk_softmax_forward(probs.data(), experts.data(), logits.data(), 2, 4, 2);
  EXPECT_EQ(experts, (std::vector<int>{1, 3, 2, 3}));
  EXPECT_FLOAT_EQ(probs[0], 0.5f);
  EXPECT_FLOAT_EQ(probs[1], 0.5f);
  EXPECT_NEAR(probs[2], 1.0 / (1.0 + std::exp(-3.0)), 1e-7);
  EXPECT_NEAR(probs[3], 1.0 / (1.0 + std::exp(3.0)), 1e-7);
  // top_k = 1: the probability is 1, its gradient 0 (Megatron-Core's softmax over one logit).
  std::vector<float> one(2);
  std::vector<int> first(2);
  moe_topk_softmax_forward(one.data(), first.data(), logits.data(), 2, 4, 1);
  EXPECT_EQ(first, (std::vector<int>{1, 2}));
  EXPECT_EQ(one, (std::vector<float>{1, 1}));
}

TEST(CpuMoe, TopKSoftmaxBackwardMatchesFiniteDifferences) {
  const int tokens = 5, num_experts = 6, top_k = 3;
  const auto logits = random_vector(tokens * num_experts, 11, -2, 2);
  const auto weights = random_vector(tokens * top_k, 12);  // plays dprobs
  std::vector<float> probs(tokens * top_k);
  std::vector<int> experts(tokens * top_k);
  moe_topk_softmax_forward(probs.data(), experts.data(), logits.data(), tokens, num_experts, top_k);
  EXPECT_TRUE(
      all_close(probs, topk_probs_reference(to_double(logits), experts, tokens, num_experts, top_k), 1e-6, 1e-6));
  std::vector<float> dlogits(tokens * num_experts, 7.0f);  // overwritten
  moe_topk_softmax_backward(dlogits.data(), weights.data(), probs.data(), experts.data(), tokens, num_experts, top_k);
  const auto numeric = numeric_gradient(
      [&](const std::vector<double>& x) {
        return weighted_sum(topk_probs_reference(x, experts, tokens, num_experts, top_k), weights);
      },
      to_double(logits));
  EXPECT_TRUE(all_close(dlogits, numeric, 1e-6, 1e-5));
}

TEST(CpuMoe, AuxLossIsTheCoefficientWhenBalanced) {
  // Equal logits (scores 1/E) and every expert chosen T k / E times: coeff * E / (k T^2) * E * (T / E) * (T k / E).
  const int tokens = 8, num_experts = 4, top_k = 2;
  const std::vector<float> logits(tokens * num_experts, 0.3f);
  std::vector<float> scores(logits.size());
  moe_router_scores_forward(scores.data(), logits.data(), tokens, num_experts);
  std::vector<int> experts;
  for (int t = 0; t < tokens; ++t) experts.insert(experts.end(), {(2 * t) % 4, (2 * t + 1) % 4});
  std::vector<float> counts(num_experts);
  moe_tokens_per_expert(counts.data(), experts.data(), tokens, num_experts, top_k);
  EXPECT_EQ(counts, (std::vector<float>{4, 4, 4, 4}));
  EXPECT_NEAR(moe_aux_loss_forward(scores.data(), counts.data(), tokens, num_experts, top_k, tokens, 0.01), 0.01, 1e-9);
  // Two sequence shards of four tokens each, with the micro-batch's counts: their losses sum to the whole.
  const double first = moe_aux_loss_forward(scores.data(), counts.data(), 4, num_experts, top_k, tokens, 0.01);
  const double second =
      moe_aux_loss_forward(scores.data() + 4 * num_experts, counts.data(), 4, num_experts, top_k, tokens, 0.01);
  EXPECT_NEAR(first + second, 0.01, 1e-9);
}

TEST(CpuMoe, AuxLossForwardAndBackwardMatchReferenceAndFiniteDifferences) {
  const int tokens = 6, num_experts = 5, top_k = 2;
  const double total_tokens = 12, coeff = 0.7, loss_grad = 1.3;  // this rank's 6 of a micro-batch's 12 tokens
  const auto logits = random_vector(tokens * num_experts, 21, -2, 2);
  const std::vector<float> counts{5, 3, 7, 1, 8};  // the micro-batch's: 24 = 12 tokens x top 2
  std::vector<float> scores(logits.size());
  moe_router_scores_forward(scores.data(), logits.data(), tokens, num_experts);
  const double loss =
      moe_aux_loss_forward(scores.data(), counts.data(), tokens, num_experts, top_k, total_tokens, coeff);
  EXPECT_NEAR(loss, aux_loss_reference(to_double(logits), counts, tokens, num_experts, top_k, total_tokens, coeff),
              1e-7);
  std::vector<float> dlogits(logits.size(), 0.25f);  // accumulated into
  moe_aux_loss_backward(dlogits.data(), scores.data(), counts.data(), tokens, num_experts, top_k, total_tokens, coeff,
                        loss_grad);
  auto numeric = numeric_gradient(
      [&](const std::vector<double>& x) {
        return loss_grad * aux_loss_reference(x, counts, tokens, num_experts, top_k, total_tokens, coeff);
      },
      to_double(logits));
  for (double& g : numeric) g += 0.25;
  EXPECT_TRUE(all_close(dlogits, numeric, 1e-6, 1e-5));
}

TEST(CpuMoe, PermutationIsExpertMajorTokensInOrder) {
  // token 0 -> experts 1, 0; token 1 -> 0, 2; token 2 -> 1, 2
  const std::vector<int> experts{1, 0, 0, 2, 1, 2};
  std::vector<int> rows(6), rows_per_expert(3);
  moe_permutation(rows.data(), rows_per_expert.data(), experts.data(), 3, 3, 2);
  EXPECT_EQ(rows_per_expert, (std::vector<int>{2, 2, 2}));
  // expert 0: tokens 0, 1 (rows 0, 1); expert 1: tokens 0, 2 (rows 2, 3); expert 2: tokens 1, 2 (rows 4, 5)
  EXPECT_EQ(rows, (std::vector<int>{2, 0, 1, 4, 3, 5}));
  const std::vector<float> x{10, 11, 20, 21, 30, 31};  // 3 tokens, hidden 2
  std::vector<float> permuted(12);
  moe_permute_forward(permuted.data(), x.data(), rows.data(), 3, 2, 2);
  EXPECT_EQ(permuted, (std::vector<float>{10, 11, 20, 21, 10, 11, 30, 31, 20, 21, 30, 31}));
  // Probabilities that sum to one per token bring each token back whole.
  const std::vector<float> probs{0.25f, 0.75f, 0.5f, 0.5f, 1.0f, 0.0f};
  std::vector<float> back(6);
  moe_unpermute_forward(back.data(), permuted.data(), probs.data(), rows.data(), 3, 2, 2);
  EXPECT_TRUE(all_close(back, x, 1e-6, 0));
  EXPECT_THROW(moe_permutation(rows.data(), rows_per_expert.data(), std::vector<int>{1, 1, 0, 2, 1, 2}.data(), 3, 3, 2),
               std::invalid_argument);  // a token choosing one expert twice
}

TEST(CpuMoe, PermutationOffsetsEachExpertByTheRowsOfThoseBefore) {
  // Unequal rows per expert (3, 0, 1, 4): each expert's first row is the sum of the rows before it (0, 3, 3, 4), so an
  // offset taken from the wrong expert's count moves rows. 4 tokens, top 2 of 4 experts.
  const std::vector<int> experts{0, 3,   // token 0
                                 3, 0,   // token 1
                                 2, 3,   // token 2
                                 0, 3};  // token 3
  std::vector<int> rows(8), rows_per_expert(4);
  moe_permutation(rows.data(), rows_per_expert.data(), experts.data(), 4, 4, 2);
  EXPECT_EQ(rows_per_expert, (std::vector<int>{3, 0, 1, 4}));
  // expert 0: tokens 0, 1, 3 -> rows 0, 1, 2; expert 2: token 2 -> row 3; expert 3: tokens 0, 1, 2, 3 -> rows 4..7
  EXPECT_EQ(rows, (std::vector<int>{0, 4, 5, 1, 3, 6, 2, 7}));
  const std::vector<float> x{10, 20, 30, 40};  // 4 tokens, hidden 1
  std::vector<float> permuted(8);
  moe_permute_forward(permuted.data(), x.data(), rows.data(), 4, 1, 2);
  EXPECT_EQ(permuted, (std::vector<float>{10, 20, 40, 30, 10, 20, 30, 40}));
  // A dropped slot (capacity) takes no row: expert 3 keeps three.
  std::vector<int> dropped = experts;
  dropped[7] = kMoeDropped;
  moe_permutation(rows.data(), rows_per_expert.data(), dropped.data(), 4, 4, 2);
  EXPECT_EQ(rows_per_expert, (std::vector<int>{3, 0, 1, 3}));
  EXPECT_EQ(rows, (std::vector<int>{0, 4, 5, 1, 3, 6, 2, kMoeDropped}));
}

TEST(CpuMoe, CapacityIsTheCeilingOfTheShare) {
  // Megatron-Core's get_capacity: ceil(tokens x top_k / experts x capacity_factor), at most every token.
  EXPECT_EQ(moe_capacity(5, 3, 2, 1.0), 4);    // 10 / 3 = 3.33 -> 4 (rounding would give 3)
  EXPECT_EQ(moe_capacity(7, 4, 1, 1.0), 2);    // 1.75 -> 2
  EXPECT_EQ(moe_capacity(8, 4, 2, 1.0), 4);    // whole: 4
  EXPECT_EQ(moe_capacity(10, 4, 2, 1.1), 6);   // 5.5 -> 6
  EXPECT_EQ(moe_capacity(16, 8, 2, 1.05), 5);  // 4.2 -> 5
  EXPECT_EQ(moe_capacity(3, 2, 2, 4.0), 3);    // 12 capped at the 3 tokens
}

TEST(CpuMoe, PermuteAndUnpermuteBackwardsMatchFiniteDifferences) {
  const int tokens = 4, num_experts = 3, top_k = 2, hidden = 5;
  const std::vector<int> experts{2, 0, 1, 2, 0, 1, 2, 1};
  std::vector<int> rows(tokens * top_k), rows_per_expert(num_experts);
  moe_permutation(rows.data(), rows_per_expert.data(), experts.data(), tokens, num_experts, top_k);
  const auto expert_rows = random_vector(tokens * top_k * hidden, 31);
  const auto probs = random_vector(tokens * top_k, 32, 0, 1);
  const auto dout = random_vector(tokens * hidden, 33);
  // unpermute as a function of (expert rows, probs), both in one vector
  auto unpermute = [&](const std::vector<double>& z) {
    std::vector<double> out(tokens * hidden, 0.0);
    for (int t = 0; t < tokens; ++t)
      for (int j = 0; j < top_k; ++j)
        for (int c = 0; c < hidden; ++c)
          out[t * hidden + c] += z[expert_rows.size() + t * top_k + j] * z[rows[t * top_k + j] * hidden + c];
    return weighted_sum(out, dout);
  };
  std::vector<float> joined(expert_rows);
  joined.insert(joined.end(), probs.begin(), probs.end());
  const auto numeric = numeric_gradient(unpermute, to_double(joined));
  std::vector<float> dexpert_rows(expert_rows.size()), dprobs(probs.size());
  moe_unpermute_backward(dexpert_rows.data(), dprobs.data(), dout.data(), expert_rows.data(), probs.data(), rows.data(),
                         tokens, hidden, top_k);
  std::vector<float> analytic(dexpert_rows);
  analytic.insert(analytic.end(), dprobs.begin(), dprobs.end());
  EXPECT_TRUE(all_close(analytic, numeric, 1e-6, 1e-6));
  // permute is linear: <permute(x), y> = <x, permute_backward(y)>
  const auto x = random_vector(tokens * hidden, 34);
  std::vector<float> px(tokens * top_k * hidden), dx(tokens * hidden);
  moe_permute_forward(px.data(), x.data(), rows.data(), tokens, hidden, top_k);
  moe_permute_backward(dx.data(), expert_rows.data(), rows.data(), tokens, hidden, top_k);
  EXPECT_NEAR(weighted_sum(to_double(px), expert_rows), weighted_sum(to_double(x), dx), 1e-5);
}

TEST(CpuMoe, SortChunksReordersAndItsBackwardUndoes) {
  // chunks of 1, 2, 0 and 1 rows: [a | b b | - | c], order 2 0 3 1 -> [- | a | c | b b]
  const std::vector<float> inp{1, 2, 3, 4};
  const std::vector<int> chunk_rows{1, 2, 0, 1}, order{2, 0, 3, 1};
  std::vector<float> out(4), back(4);
  moe_sort_chunks_forward(out.data(), inp.data(), chunk_rows.data(), order.data(), 4, 1);
  EXPECT_EQ(out, (std::vector<float>{1, 4, 2, 3}));
  moe_sort_chunks_backward(back.data(), out.data(), chunk_rows.data(), order.data(), 4, 1);
  EXPECT_EQ(back, inp);
  EXPECT_THROW(
      moe_sort_chunks_forward(out.data(), inp.data(), chunk_rows.data(), std::vector<int>{0, 0, 1, 2}.data(), 4, 1),
      std::invalid_argument);
}

TEST(CpuMoe, GroupedMatmulIsOneGemmPerExpert) {
  const int groups = 3, in_features = 4, out_features = 3;
  const std::vector<int> rows_per_group{2, 0, 3};  // an expert that got no tokens
  const int rows = 5;
  const auto inp = random_vector(rows * in_features, 41);
  const auto weights = random_vector(groups * out_features * in_features, 42);
  const auto dout = random_vector(rows * out_features, 43);
  // reference: row r of group g: out[r, o] = sum_i inp[r, i] weights[g, o, i]
  auto forward = [&](const std::vector<double>& x, const std::vector<double>& w) {
    std::vector<double> out(rows * out_features, 0.0);
    int row = 0;
    for (int g = 0; g < groups; ++g)
      for (int r = 0; r < rows_per_group[g]; ++r, ++row)
        for (int o = 0; o < out_features; ++o)
          for (int i = 0; i < in_features; ++i)
            out[row * out_features + o] += x[row * in_features + i] * w[(g * out_features + o) * in_features + i];
    return out;
  };
  std::vector<float> out(rows * out_features);
  moe_grouped_matmul_forward(out.data(), inp.data(), weights.data(), rows_per_group.data(), groups, in_features,
                             out_features);
  EXPECT_TRUE(all_close(out, forward(to_double(inp), to_double(weights)), 1e-6, 1e-6));
  std::vector<float> dinp(inp.size()), dweights(weights.size(), 0.5f);  // dweights accumulate
  moe_grouped_matmul_backward(dinp.data(), dweights.data(), dout.data(), inp.data(), weights.data(),
                              rows_per_group.data(), groups, in_features, out_features);
  const auto numeric_inp = numeric_gradient(
      [&](const std::vector<double>& x) { return weighted_sum(forward(x, to_double(weights)), dout); }, to_double(inp));
  auto numeric_weights = numeric_gradient(
      [&](const std::vector<double>& w) { return weighted_sum(forward(to_double(inp), w), dout); }, to_double(weights));
  for (double& g : numeric_weights) g += 0.5;
  EXPECT_TRUE(all_close(dinp, numeric_inp, 1e-6, 1e-5));
  EXPECT_TRUE(all_close(dweights, numeric_weights, 1e-6, 1e-5));
  for (int i = 0; i < out_features * in_features; ++i) EXPECT_EQ(dweights[out_features * in_features + i], 0.5f);
}

TEST(CpuMoe, RefusesBadArguments) {
  std::vector<float> logits(8), probs(6);
  std::vector<int> experts(6);
  EXPECT_THROW(moe_topk_softmax_forward(probs.data(), experts.data(), logits.data(), 2, 4, 5), std::invalid_argument);
  EXPECT_THROW(moe_topk_softmax_forward(probs.data(), experts.data(), logits.data(), 2, 4, 0), std::invalid_argument);
  std::vector<float> counts(4);
  const std::vector<int> out_of_range{0, 4};
  EXPECT_THROW(moe_tokens_per_expert(counts.data(), out_of_range.data(), 1, 4, 2), std::invalid_argument);
}

}  // namespace
}  // namespace twin::kernels::cpu

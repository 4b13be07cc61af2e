// The Mixture-of-Experts kernels on the device against their CPU twins (kernels/cpu/moe.hpp; skipped without a GPU):
// the router on bf16-rounded logits (the choice exact, the fp32 probabilities and scores within a few ulp: the
// formulas are the host's, moe_math.hpp), its backward with the load-balancing loss, permute / unpermute, the chunk
// sort and the grouped GEMM with an expert that gets no rows. Host preconditions are checked on any machine.
#include <gtest/gtest.h>

#include <cstddef>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "cuda_test_util.hpp"
#include "kernels/cpu/moe.hpp"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/moe_math.hpp"

namespace twin::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cpu::testing::random_vector;
using testing::bf16_rounded;
using testing::DeviceBuffer;
using testing::kBf16Tolerance;
using testing::normalised_error_below;
using testing::to_bf16;
using testing::to_float;

constexpr int kMoeTokens = 48, kMoeExperts = 8, kMoeTopK = 2, kMoeHidden = 40;

// --- on any machine: preconditions throw before any launch -----------------------------------------------------------

TEST(CudaMoeKernels, PreconditionsThrowBeforeAnyLaunch) {
  float probs = 0;
  int experts = 0;
  bf16 logits{};
  EXPECT_THROW(moe_topk_softmax_forward(&probs, &experts, &logits, 4, 2, 3, nullptr), std::invalid_argument);  // k > E
  EXPECT_THROW(moe_topk_softmax_forward(&probs, &experts, &logits, 0, 2, 1, nullptr), std::invalid_argument);
  bf16 a{}, b{};
  const int chunk_rows[3] = {1, 0, 2};
  const int not_a_permutation[3] = {0, 0, 2};
  EXPECT_THROW(moe_sort_chunks_forward(&a, &b, chunk_rows, not_a_permutation, 3, 4, nullptr), std::invalid_argument);
  const int negative[2] = {1, -1}, order[2] = {1, 0};
  EXPECT_THROW(moe_sort_chunks_backward(&a, &b, negative, order, 2, 4, nullptr), std::invalid_argument);
  EXPECT_THROW(moe_permute_forward(&a, &a, &experts, 1, 4, 1, nullptr), std::invalid_argument);  // out aliases inp
}

// --- with a GPU
// --------------------------------------------------------------------------------------------------------

struct Routing {
  std::vector<float> logits, probs, scores, counts;  // logits bf16-rounded
  std::vector<int> experts, rows, rows_per_expert;
};

Routing cpu_routing(unsigned seed) {
  Routing r;
  r.logits = bf16_rounded(random_vector(kMoeTokens * kMoeExperts, seed, -3.0f, 3.0f));
  r.probs.resize(kMoeTokens * kMoeTopK);
  r.experts.resize(kMoeTokens * kMoeTopK);
  r.scores.resize(kMoeTokens * kMoeExperts);
  r.counts.resize(kMoeExperts);
  r.rows.resize(kMoeTokens * kMoeTopK);
  r.rows_per_expert.resize(kMoeExperts);
  cpu::moe_topk_softmax_forward(r.probs.data(), r.experts.data(), r.logits.data(), kMoeTokens, kMoeExperts, kMoeTopK);
  cpu::moe_router_scores_forward(r.scores.data(), r.logits.data(), kMoeTokens, kMoeExperts);
  cpu::moe_tokens_per_expert(r.counts.data(), r.experts.data(), kMoeTokens, kMoeExperts, kMoeTopK);
  cpu::moe_permutation(r.rows.data(), r.rows_per_expert.data(), r.experts.data(), kMoeTokens, kMoeExperts, kMoeTopK);
  return r;
}

TEST(CudaMoeKernels, RouterMatchesCpuTwin) {
  TWIN_REQUIRE_GPU();
  const Routing r = cpu_routing(1);
  DeviceBuffer<bf16> logits(to_bf16(r.logits));
  DeviceBuffer<float> probs(r.probs.size()), scores(r.scores.size());
  DeviceBuffer<int> experts(r.experts.size());
  probs.poison(), scores.poison();
  moe_topk_softmax_forward(probs.get(), experts.get(), logits.get(), kMoeTokens, kMoeExperts, kMoeTopK, nullptr);
  moe_router_scores_forward(scores.get(), logits.get(), kMoeTokens, kMoeExperts, nullptr);
  EXPECT_EQ(experts.download(), r.experts);
  EXPECT_TRUE(normalised_error_below(probs.download(), r.probs, 1e-6));
  EXPECT_TRUE(normalised_error_below(scores.download(), r.scores, 1e-6));

  // the load-balancing loss from the device's column sums
  DeviceBuffer<float> d_scores(r.scores);
  DeviceBuffer<double> sums(kMoeExperts);
  moe_score_sums(sums.get(), d_scores.get(), kMoeTokens, kMoeExperts, nullptr);
  const std::vector<double> host_sums = sums.download();
  const double want =
      cpu::moe_aux_loss_forward(r.scores.data(), r.counts.data(), kMoeTokens, kMoeExperts, kMoeTopK, kMoeTokens, 1e-2);
  const double got = moe_math::aux_loss(host_sums.data(), r.counts.data(), kMoeExperts, kMoeTopK, kMoeTokens, 1e-2);
  EXPECT_NEAR(got, want, 1e-12 * want);

  // the backward, with the load-balancing loss
  const std::vector<float> dprobs = random_vector(kMoeTokens * kMoeTopK, 2);
  std::vector<float> want_dlogits(kMoeTokens * kMoeExperts);
  cpu::moe_topk_softmax_backward(want_dlogits.data(), dprobs.data(), r.probs.data(), r.experts.data(), kMoeTokens,
                                 kMoeExperts, kMoeTopK);
  cpu::moe_aux_loss_backward(want_dlogits.data(), r.scores.data(), r.counts.data(), kMoeTokens, kMoeExperts, kMoeTopK,
                             kMoeTokens, 1e-2, 0.5);
  const std::vector<int> counts(r.counts.begin(), r.counts.end());
  DeviceBuffer<float> d_dprobs(dprobs), d_probs(r.probs);
  DeviceBuffer<int> d_experts(r.experts), d_counts(counts);
  DeviceBuffer<bf16> dlogits(want_dlogits.size());
  dlogits.poison();
  moe_router_backward(dlogits.get(), d_dprobs.get(), d_probs.get(), d_experts.get(), d_scores.get(), d_counts.get(),
                      kMoeTokens, kMoeExperts, kMoeTopK,
                      moe_math::aux_loss_grad_scale(kMoeExperts, kMoeTopK, kMoeTokens, 1e-2, 0.5), nullptr);
  EXPECT_TRUE(normalised_error_below(to_float(dlogits.download()), want_dlogits, kBf16Tolerance));
}

TEST(CudaMoeKernels, PermutationMatchesCpuTwin) {
  TWIN_REQUIRE_GPU();
  const Routing r = cpu_routing(3);
  const std::size_t slots = r.rows.size();
  const auto x = bf16_rounded(random_vector(kMoeTokens * kMoeHidden, 4));
  const auto expert_out = bf16_rounded(random_vector(slots * kMoeHidden, 5));
  const auto dy = bf16_rounded(random_vector(kMoeTokens * kMoeHidden, 6));
  std::vector<float> permuted(slots * kMoeHidden), y(kMoeTokens * kMoeHidden), d_rows(slots * kMoeHidden),
      dprobs(slots), dx(kMoeTokens * kMoeHidden);
  cpu::moe_permute_forward(permuted.data(), x.data(), r.rows.data(), kMoeTokens, kMoeHidden, kMoeTopK);
  cpu::moe_unpermute_forward(y.data(), expert_out.data(), r.probs.data(), r.rows.data(), kMoeTokens, kMoeHidden,
                             kMoeTopK);
  cpu::moe_unpermute_backward(d_rows.data(), dprobs.data(), dy.data(), expert_out.data(), r.probs.data(), r.rows.data(),
                              kMoeTokens, kMoeHidden, kMoeTopK);
  cpu::moe_permute_backward(dx.data(), d_rows.data(), r.rows.data(), kMoeTokens, kMoeHidden, kMoeTopK);

  DeviceBuffer<int> rows(r.rows);
  DeviceBuffer<float> probs(r.probs), g_dprobs(slots);
  DeviceBuffer<bf16> g_x(to_bf16(x)), g_out(to_bf16(expert_out)), g_dy(to_bf16(dy));
  DeviceBuffer<bf16> g_permuted(permuted.size()), g_y(y.size()), g_d_rows(d_rows.size()), g_dx(dx.size());
  g_permuted.poison(), g_y.poison(), g_d_rows.poison(), g_dprobs.poison(), g_dx.poison();
  moe_permute_forward(g_permuted.get(), g_x.get(), rows.get(), kMoeTokens, kMoeHidden, kMoeTopK, nullptr);
  moe_unpermute_forward(g_y.get(), g_out.get(), probs.get(), rows.get(), kMoeTokens, kMoeHidden, kMoeTopK, nullptr);
  moe_unpermute_backward(g_d_rows.get(), g_dprobs.get(), g_dy.get(), g_out.get(), probs.get(), rows.get(), kMoeTokens,
                         kMoeHidden, kMoeTopK, nullptr);
  EXPECT_EQ(to_float(g_permuted.download()), permuted);  // a gather of bf16 values: exact
  EXPECT_TRUE(normalised_error_below(to_float(g_y.download()), y, kBf16Tolerance));
  EXPECT_TRUE(normalised_error_below(to_float(g_d_rows.download()), d_rows, kBf16Tolerance));
  EXPECT_TRUE(normalised_error_below(g_dprobs.download(), dprobs, 1e-5));
  // the permute's backward on the CPU's (bf16-rounded) row gradients
  const auto d_rows_rounded = bf16_rounded(d_rows);
  cpu::moe_permute_backward(dx.data(), d_rows_rounded.data(), r.rows.data(), kMoeTokens, kMoeHidden, kMoeTopK);
  DeviceBuffer<bf16> g_d_rows_rounded(to_bf16(d_rows_rounded));
  moe_permute_backward(g_dx.get(), g_d_rows_rounded.get(), rows.get(), kMoeTokens, kMoeHidden, kMoeTopK, nullptr);
  EXPECT_EQ(to_float(g_dx.download()), bf16_rounded(dx));  // same fp32 sums, one rounding
}

TEST(CudaMoeKernels, SortChunksAndGroupedGemmMatchCpuTwin) {
  TWIN_REQUIRE_GPU();
  // 2 peers x 3 local experts, local expert 1 receives nothing: chunk (peer i, expert e) at i * 3 + e
  const std::vector<int> chunk_rows = {3, 0, 2, 1, 0, 4};
  const std::vector<int> order = {0, 3, 1, 4, 2, 5};  // expert-major
  const int chunks = 6, rows = std::accumulate(chunk_rows.begin(), chunk_rows.end(), 0);
  const int in_features = 32, out_features = 24;
  const auto received = bf16_rounded(random_vector(static_cast<std::size_t>(rows) * in_features, 7));
  std::vector<float> sorted(received.size()), unsorted(received.size());
  cpu::moe_sort_chunks_forward(sorted.data(), received.data(), chunk_rows.data(), order.data(), chunks, in_features);
  cpu::moe_sort_chunks_backward(unsorted.data(), sorted.data(), chunk_rows.data(), order.data(), chunks, in_features);
  ASSERT_EQ(unsorted, received);  // the backward is the inverse

  DeviceBuffer<bf16> g_received(to_bf16(received)), g_sorted(sorted.size()), g_unsorted(sorted.size());
  moe_sort_chunks_forward(g_sorted.get(), g_received.get(), chunk_rows.data(), order.data(), chunks, in_features,
                          nullptr);
  moe_sort_chunks_backward(g_unsorted.get(), g_sorted.get(), chunk_rows.data(), order.data(), chunks, in_features,
                           nullptr);
  EXPECT_EQ(to_float(g_sorted.download()), sorted);
  EXPECT_EQ(to_float(g_unsorted.download()), received);

  const std::vector<int> rows_per_expert = {chunk_rows[0] + chunk_rows[3], 0, chunk_rows[2] + chunk_rows[5]};
  const auto weights = bf16_rounded(random_vector(3 * out_features * in_features, 8, -0.3f, 0.3f));
  const auto dout = bf16_rounded(random_vector(static_cast<std::size_t>(rows) * out_features, 9));
  std::vector<float> out(static_cast<std::size_t>(rows) * out_features), dinp(sorted.size()),
      dweights(weights.size(), 0.5f);
  cpu::moe_grouped_matmul_forward(out.data(), sorted.data(), weights.data(), rows_per_expert.data(), 3, in_features,
                                  out_features);
  cpu::moe_grouped_matmul_backward(dinp.data(), dweights.data(), dout.data(), sorted.data(), weights.data(),
                                   rows_per_expert.data(), 3, in_features, out_features);
  Cublas blas;
  DeviceBuffer<bf16> g_weights(to_bf16(weights)), g_dout(to_bf16(dout)), g_out(out.size()), g_dinp(dinp.size());
  DeviceBuffer<float> g_dweights(std::vector<float>(weights.size(), 0.5f));
  moe_grouped_matmul_forward(g_out.get(), g_sorted.get(), g_weights.get(), rows_per_expert.data(), 3, in_features,
                             out_features, blas, nullptr);
  moe_grouped_matmul_backward(g_dinp.get(), g_dweights.get(), g_dout.get(), g_sorted.get(), g_weights.get(),
                              rows_per_expert.data(), 3, in_features, out_features, blas, nullptr);
  EXPECT_TRUE(normalised_error_below(to_float(g_out.download()), out, 1e-2));
  EXPECT_TRUE(normalised_error_below(to_float(g_dinp.download()), dinp, 1e-2));
  const std::vector<float> got_dweights = g_dweights.download();
  EXPECT_TRUE(normalised_error_below(got_dweights, dweights, 1e-3));
  // expert 1 had no rows: its gradient is untouched (the 0.5 it started from)
  for (int i = 0; i < out_features * in_features; ++i) {
    ASSERT_EQ(got_dweights[static_cast<std::size_t>(out_features * in_features + i)], 0.5f) << i;
  }
}

}  // namespace
}  // namespace twin::kernels::cuda

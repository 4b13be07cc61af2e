// Context parallelism in the executor, the all_gather way: every plan trains the parity model (exec_test_util.hpp)
// to the single-rank losses, each CP rank on its two chunks of every sequence; the CP attention's backward against
// finite differences; what is refused, by name.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "context_parallel_parity.hpp"
#include "exec/core/backend.hpp"
#include "exec/core/errors.hpp"
#include "exec/train/backend_factory.hpp"
#include "exec/train/context_parallel.hpp"
#include "exec_test_util.hpp"
#include "model/ops/context_parallel.hpp"

namespace twin::exec {
namespace {

using testing::parity_toml;
using testing::scenario;
using testing::train;

// Transformer Engine's fused attention, the all_gather exchanges (what the executor runs of context parallelism).
const std::vector<std::string> kCpKeys = {"framework.attention=\"flash2\"", "framework.cp_comm=\"all_gather\""};

TrainResult run(const std::vector<std::string>& sets) {
  return cp_parity::run_way(kCpKeys, sets);
}

void expect_same_losses(const TrainResult& many, const TrainResult& one, const std::string& plan) {
  cp_parity::expect_same_losses(many, one, plan, "cp parity");
}

using cp_parity::joined;
using cp_parity::kLlamaKeys;
using cp_parity::Plan;

class ExecContextParallelParity : public ::testing::TestWithParam<Plan> {};

// GPT-2's block: learned positions, which each CP rank adds at its chunks' places in the sequence.
TEST_P(ExecContextParallelParity, LossesEqualTheSingleRankRun) {
  static const TrainResult one = run({});
  expect_same_losses(run(GetParam().sets), one, GetParam().name);
}

INSTANTIATE_TEST_SUITE_P(
    Plans, ExecContextParallelParity,
    ::testing::Values(Plan{"cp2", {"parallel.cp=2"}}, Plan{"cp4", {"parallel.cp=4"}},
                      Plan{"cp2_tp2", {"parallel.cp=2", "parallel.tp=2"}},
                      Plan{"cp2_pp2", {"parallel.cp=2", "parallel.pp=2"}},
                      Plan{"cp2_dp2", {"parallel.cp=2", "parallel.dp=2"}},
                      // the distributed optimizer's shards over the dp x cp ranks (DataWithContext)
                      Plan{"cp2_zero1", {"parallel.cp=2", "parallel.zero_stage=1"}},
                      Plan{"cp2_dp2_zero1", {"parallel.cp=2", "parallel.dp=2", "parallel.zero_stage=1"}},
                      Plan{"cp4_dp2", {"parallel.cp=4", "parallel.dp=2"}},
                      Plan{"cp2_tp2_pp2_sequence_parallel",
                           {"parallel.cp=2", "parallel.tp=2", "parallel.pp=2", "parallel.sequence_parallel=true"}},
                      Plan{"cp2_recompute_selective", {"parallel.cp=2", "parallel.recompute=\"selective\""}},
                      Plan{"cp2_pp2_recompute_full",
                           {"parallel.cp=2", "parallel.pp=2", "parallel.recompute=\"full\""}}),
    [](const ::testing::TestParamInfo<Plan>& plan_info) { return std::string(plan_info.param.name); });

// Llama's block: rotary embeddings at each token's position in the sequence, grouped-query attention (2 key/value
// heads, so that with tp 2 each rank gathers one).
TEST(ExecContextParallel, LlamaBlocksAgreeUnderCp2AndCp4WithTpAndPp) {
  const TrainResult one = run(kLlamaKeys);
  for (const auto& plan : std::vector<std::vector<std::string>>{{"parallel.cp=4", "parallel.tp=2"},
                                                                {"parallel.cp=2", "parallel.tp=2", "parallel.pp=2"}}) {
    expect_same_losses(run(joined(kLlamaKeys, plan)), one, "llama " + plan[0] + " " + plan[1]);
  }
}

// A rank's tokens: its two chunks of each sequence, as model::cp_sequence_chunk places them.
TEST(ExecContextParallel, EachRankTakesChunksRAnd2cpMinus1MinusR) {
  MicroBatch whole;
  for (int i = 0; i < 2 * 16; ++i) {  // 2 sequences of 16 tokens
    whole.tokens.push_back(i);
    whole.targets.push_back(100 + i);
  }
  const MicroBatch rank1 = context_parallel_share(whole, 2, 16, 4, 1);  // chunks of 2: 1 and 6
  EXPECT_EQ(rank1.tokens, (std::vector<int>{2, 3, 12, 13, 18, 19, 28, 29}));
  EXPECT_EQ(rank1.targets[0], 102);
  std::vector<int> seen(whole.tokens.size(), 0);
  for (int r = 0; r < 4; ++r) {
    for (int token : context_parallel_share(whole, 2, 16, 4, r).tokens) ++seen[static_cast<std::size_t>(token)];
  }
  for (int count : seen) EXPECT_EQ(count, 1);  // every token on exactly one rank
}

// The loss of every CP rank's output, L = sum_r sum(out_r * w_r), differentiated through context_attention_backward
// (dq, and dK, dV summed over the ranks as the reduce-scatters sum them) against central differences in double.
TEST(ExecContextParallel, AttentionBackwardMatchesFiniteDifferences) {
  const int cp = 2, batch = 2, seq = 8, heads = 2, kv_heads = 1, head_dim = 4, local = seq / cp;
  const int row = (heads + 2 * kv_heads) * head_dim, kv = kv_heads * head_dim, width = heads * head_dim;
  auto backend = make_backend("cpu", BackendOptions{});
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto random = [&](std::size_t count) {
    Tensor t = backend->allocate(count, DType::F32);
    for (std::size_t i = 0; i < count; ++i) t.f32()[i] = normal(rng);
    return t;
  };
  std::vector<Tensor> qkv, weight;
  for (int r = 0; r < cp; ++r) {
    qkv.push_back(random(static_cast<std::size_t>(batch * local * row)));
    weight.push_back(random(static_cast<std::size_t>(batch * local * width)));
  }
  const auto shape_of = [&](int r) { return ContextShape{batch, seq, heads, kv_heads, head_dim, cp, r}; };
  const std::size_t local_kv = static_cast<std::size_t>(batch * local * kv);
  // every rank's keys and values, gathered in rank order
  const auto gather = [&](Tensor& keys, Tensor& values) {
    keys = backend->allocate(local_kv * cp, DType::F32);
    values = backend->allocate(local_kv * cp, DType::F32);
    for (int r = 0; r < cp; ++r) {
      backend->context_kernels().context_split_keys_values(keys.slice(local_kv * r, local_kv),
                                                           values.slice(local_kv * r, local_kv),
                                                           qkv[static_cast<std::size_t>(r)], shape_of(r));
    }
  };
  const auto loss = [&] {
    Tensor keys, values;
    gather(keys, values);
    double total = 0;
    for (int r = 0; r < cp; ++r) {
      Tensor out = backend->allocate(static_cast<std::size_t>(batch * local * width), DType::F32);
      Tensor lse = backend->allocate(static_cast<std::size_t>(batch * local * heads), DType::F32);
      backend->context_kernels().context_attention_forward(out, lse, qkv[static_cast<std::size_t>(r)], keys, values,
                                                           shape_of(r));
      for (std::size_t i = 0; i < out.numel; ++i) total += double(out.f32()[i]) * weight[std::size_t(r)].f32()[i];
    }
    return total;
  };
  // analytic: each rank's backward, its dK, dV shares summed into their owners' qkv gradients
  Tensor keys, values;
  gather(keys, values);
  std::vector<Tensor> dqkv;
  Tensor dkeys_sum = backend->zeros(local_kv * cp, DType::F32), dvalues_sum = backend->zeros(local_kv * cp, DType::F32);
  for (int r = 0; r < cp; ++r) {
    const std::size_t u = static_cast<std::size_t>(r);
    Tensor out = backend->allocate(weight[u].numel, DType::F32);
    Tensor lse = backend->allocate(static_cast<std::size_t>(batch * local * heads), DType::F32);
    backend->context_kernels().context_attention_forward(out, lse, qkv[u], keys, values, shape_of(r));
    dqkv.push_back(backend->allocate(qkv[u].numel, DType::F32));
    Tensor dkeys = backend->allocate(local_kv * cp, DType::F32), dvalues = backend->allocate(local_kv * cp, DType::F32);
    backend->context_kernels().context_attention_backward(dqkv[u], dkeys, dvalues, weight[u], qkv[u], keys, values, out,
                                                          lse, shape_of(r));
    backend->accumulate(dkeys_sum, dkeys);
    backend->accumulate(dvalues_sum, dvalues);
  }
  for (int r = 0; r < cp; ++r) {
    const std::size_t u = static_cast<std::size_t>(r);
    backend->context_kernels().context_put_key_value_grad(dqkv[u], dkeys_sum.slice(local_kv * u, local_kv), false,
                                                          shape_of(r));
    backend->context_kernels().context_put_key_value_grad(dqkv[u], dvalues_sum.slice(local_kv * u, local_kv), true,
                                                          shape_of(r));
  }
  const float step = 1e-2f;
  double worst = 0;
  int checked = 0;
  for (int r = 0; r < cp; ++r) {
    for (std::size_t i = 0; i < qkv[std::size_t(r)].numel; i += 3) {  // q, k and v elements of every token
      float& x = qkv[std::size_t(r)].f32()[i];
      const float saved = x;
      x = saved + step;
      const double plus = loss();
      x = saved - step;
      const double minus = loss();
      x = saved;
      const double numeric = (plus - minus) / (2.0 * step), analytic = dqkv[std::size_t(r)].f32()[i];
      worst = std::max(worst, std::abs(numeric - analytic) / std::max(1.0, std::abs(numeric)));
      EXPECT_NEAR(analytic, numeric, 2e-3 * std::max(1.0, std::abs(numeric))) << "rank " << r << " element " << i;
      ++checked;
    }
  }
  std::printf("[ cp fd ] %d elements, worst relative difference %.1e\n", checked, worst);
}

}  // namespace
}  // namespace twin::exec

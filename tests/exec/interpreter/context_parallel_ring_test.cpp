// Context parallelism in the executor, the p2p ring (framework.cp_comm = "p2p", model/ops/context_parallel_ring.hpp):
// every plan trains the parity model (exec_test_util.hpp) to the single-rank losses, the K/V blocks and their dK/dV
// going around the CP ring as the Program's Send/Recv say; the ring's attention backward against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "context_parallel_parity.hpp"
#include "exec/core/backend.hpp"
#include "exec/train/backend_factory.hpp"
#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

using testing::parity_toml;
using testing::scenario;
using testing::train;

const std::vector<std::string> kRingKeys = {"framework.attention=\"flash2\"", "framework.cp_comm=\"p2p\""};

TrainResult run_ring(const std::vector<std::string>& sets) {
  return cp_parity::run_way(kRingKeys, sets);
}

void expect_same_ring_losses(const TrainResult& many, const TrainResult& one, const std::string& plan) {
  cp_parity::expect_same_losses(many, one, plan, "ring parity");
}

using cp_parity::joined;
using cp_parity::kLlamaKeys;
using cp_parity::Plan;

class ExecContextRingParity : public ::testing::TestWithParam<Plan> {};

// GPT-2's block (learned positions at each chunk's place in the sequence).
TEST_P(ExecContextRingParity, LossesEqualTheSingleRankRun) {
  static const TrainResult one = run_ring({});
  expect_same_ring_losses(run_ring(GetParam().sets), one, GetParam().name);
}

INSTANTIATE_TEST_SUITE_P(
    Plans, ExecContextRingParity,
    ::testing::Values(Plan{"cp2", {"parallel.cp=2"}}, Plan{"cp4", {"parallel.cp=4"}},
                      Plan{"cp2_tp2", {"parallel.cp=2", "parallel.tp=2"}},
                      Plan{"cp2_pp2", {"parallel.cp=2", "parallel.pp=2"}},
                      Plan{"cp2_dp2", {"parallel.cp=2", "parallel.dp=2"}},
                      Plan{"cp2_dp2_zero1", {"parallel.cp=2", "parallel.dp=2", "parallel.zero_stage=1"}},
                      Plan{"cp2_recompute_selective", {"parallel.cp=2", "parallel.recompute=\"selective\""}},
                      Plan{"cp4_pp2_recompute_full",
                           {"parallel.cp=4", "parallel.pp=2", "parallel.recompute=\"full\""}}),
    [](const ::testing::TestParamInfo<Plan>& plan_info) { return std::string(plan_info.param.name); });

// Llama's block: rotary embeddings at each token's place in the sequence, grouped-query attention (2 key/value
// heads: one per TP rank with tp 2, so each ring block carries one head's keys and values).
TEST(ExecContextRing, LlamaBlocksAgreeUnderCp4WithTp) {
  const TrainResult one = run_ring(kLlamaKeys);
  expect_same_ring_losses(run_ring(joined(kLlamaKeys, {"parallel.cp=4", "parallel.tp=2"})), one, "llama cp4 tp2");
}

// The ring's attention as the interpreter runs it, on cp ranks in one process: forward steps merged by their
// log-sum-exp, backward steps whose dK/dV each add to the block's owner, put into each rank's dqkv. The loss
// L = sum_r sum(out_r * w_r) differentiated so, against central differences.
TEST(ExecContextRing, RingAttentionBackwardMatchesFiniteDifferences) {
  const int cp = 3, batch = 2, seq = 12, heads = 2, kv_heads = 1, head_dim = 4, local = seq / cp;
  const int row = (heads + 2 * kv_heads) * head_dim, width = heads * head_dim;
  const std::size_t block = static_cast<std::size_t>(batch * local * 2 * kv_heads * head_dim);
  const std::size_t lse_size = static_cast<std::size_t>(batch * local * heads);
  auto backend = make_backend("cpu", BackendOptions{});
  std::mt19937 rng(7);
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
  const auto blocks = [&] {
    std::vector<Tensor> kv;
    for (int r = 0; r < cp; ++r) {
      kv.push_back(backend->allocate(block, DType::F32));
      backend->context_kernels().context_ring_pack_kv(kv.back(), qkv[std::size_t(r)], shape_of(r));
    }
    return kv;
  };
  const auto forward = [&](const std::vector<Tensor>& kv, int r, Tensor& out, Tensor& lse) {
    out = backend->allocate(weight[std::size_t(r)].numel, DType::F32);
    lse = backend->allocate(lse_size, DType::F32);
    for (int step = 0; step < cp; ++step) {
      const int source = (r - step + cp) % cp;
      backend->context_kernels().context_ring_forward_step(out, lse, qkv[std::size_t(r)], kv[std::size_t(source)],
                                                           source, shape_of(r));
    }
  };
  const auto loss = [&] {
    const std::vector<Tensor> kv = blocks();
    double total = 0;
    for (int r = 0; r < cp; ++r) {
      Tensor out, lse;
      forward(kv, r, out, lse);
      for (std::size_t i = 0; i < out.numel; ++i) total += double(out.f32()[i]) * weight[std::size_t(r)].f32()[i];
    }
    return total;
  };
  const std::vector<Tensor> kv = blocks();
  std::vector<Tensor> dq, dkv;
  for (int r = 0; r < cp; ++r) {
    dq.push_back(backend->zeros(weight[std::size_t(r)].numel, DType::F32));
    dkv.push_back(backend->zeros(block, DType::F32));
  }
  for (int r = 0; r < cp; ++r) {
    Tensor out, lse;
    forward(kv, r, out, lse);
    Tensor delta = backend->allocate(lse_size, DType::F32);
    backend->context_kernels().context_ring_delta(delta, weight[std::size_t(r)], out, shape_of(r));
    for (int step = 0; step < cp; ++step) {
      const int source = (r - step + cp) % cp;
      backend->context_kernels().context_ring_backward_step(dq[std::size_t(r)], dkv[std::size_t(source)],
                                                            weight[std::size_t(r)], qkv[std::size_t(r)],
                                                            kv[std::size_t(source)], lse, delta, source, shape_of(r));
    }
  }
  std::vector<Tensor> dqkv;
  for (int r = 0; r < cp; ++r) {
    dqkv.push_back(backend->allocate(qkv[std::size_t(r)].numel, DType::F32));
    backend->context_kernels().context_ring_put_grads(dqkv.back(), dq[std::size_t(r)], dkv[std::size_t(r)],
                                                      shape_of(r));
  }
  const float step = 1e-2f;
  double worst = 0;
  int checked = 0;
  for (int r = 0; r < cp; ++r) {
    for (std::size_t i = 0; i < qkv[std::size_t(r)].numel; i += 5) {  // q, k and v elements of every token
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
  std::printf("[ ring fd ] %d elements, worst relative difference %.1e\n", checked, worst);
}

}  // namespace
}  // namespace twin::exec

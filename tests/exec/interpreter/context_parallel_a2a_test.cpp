// Context parallelism in the executor, the a2a way (DeepSpeed-Ulysses): every plan trains the parity model
// (exec_test_util.hpp) to the single-rank losses, each CP rank on its two chunks of every sequence and, inside the
// attention core, on the whole sequence of its head group; the exchanged attention's backward against finite
// differences.
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

const std::vector<std::string> kA2aKeys = {"framework.attention=\"flash2\"", "framework.cp_comm=\"a2a\""};

TrainResult run(const std::vector<std::string>& sets) {
  return cp_parity::run_way(kA2aKeys, sets);
}

void expect_same_losses(const TrainResult& many, const TrainResult& one, const std::string& plan) {
  cp_parity::expect_same_losses(many, one, plan, "cp a2a parity");
}

using cp_parity::joined;
using cp_parity::kLlamaKeys;
using cp_parity::Plan;

class ExecContextParallelA2aParity : public ::testing::TestWithParam<Plan> {};

// GPT-2's block (4 heads): learned positions at each token's place in the sequence.
TEST_P(ExecContextParallelA2aParity, LossesEqualTheSingleRankRun) {
  static const TrainResult one = run({});
  expect_same_losses(run(GetParam().sets), one, GetParam().name);
}

INSTANTIATE_TEST_SUITE_P(
    Plans, ExecContextParallelA2aParity,
    ::testing::Values(
        Plan{"cp2", {"parallel.cp=2"}}, Plan{"cp4", {"parallel.cp=4"}},
        Plan{"cp2_tp2", {"parallel.cp=2", "parallel.tp=2"}}, Plan{"cp2_pp2", {"parallel.cp=2", "parallel.pp=2"}},
        Plan{"cp2_dp2", {"parallel.cp=2", "parallel.dp=2"}},
        Plan{"cp2_dp2_zero1", {"parallel.cp=2", "parallel.dp=2", "parallel.zero_stage=1"}},
        Plan{"cp2_tp2_sequence_parallel", {"parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true"}},
        Plan{"cp2_recompute_selective", {"parallel.cp=2", "parallel.recompute=\"selective\""}},
        Plan{"cp2_pp2_recompute_full", {"parallel.cp=2", "parallel.pp=2", "parallel.recompute=\"full\""}}),
    [](const ::testing::TestParamInfo<Plan>& plan_info) { return std::string(plan_info.param.name); });

// Llama's block: rotary embeddings at each token's place in the sequence; grouped queries (2 key/value heads, one per
// CP rank at cp 2), and at tp x cp = 4 four key/value heads (a2a gives each rank whole key/value heads). 4 s.
TEST(ExecContextParallelA2a, LlamaBlocksAgreeUnderCp2WithTpAndPp) {
  const TrainResult grouped = run(kLlamaKeys);
  expect_same_losses(run(joined(kLlamaKeys, {"parallel.cp=2", "parallel.pp=2"})), grouped, "llama gqa cp2 pp2");
  std::vector<std::string> mha = kLlamaKeys;
  mha[3] = "model.kv_heads=4";
  const TrainResult one = run(mha);
  expect_same_losses(run(joined(mha, {"parallel.cp=2", "parallel.tp=2"})), one, "llama cp2 tp2");
}

// Ulysses' attention over `cp` ranks, the exchanges done by hand as the Context group's all-to-alls do them: rank r
// sends block d of its split to rank d, which receives it as its block r.
struct Ulysses {
  int cp, batch, seq, heads, kv_heads, head_dim;
  Backend& backend;
  int local() const { return seq / cp; }
  int row() const { return (heads + 2 * kv_heads) * head_dim; }
  int group_row() const { return row() / cp; }
  ContextShape shape(int r) const { return ContextShape{batch, seq, heads, kv_heads, head_dim, cp, r}; }
  std::size_t rows() const { return static_cast<std::size_t>(batch) * static_cast<std::size_t>(local()); }

  // The all-to-all: out[d] block r <- in[r] block d.
  std::vector<Tensor> exchange(const std::vector<Tensor>& in) const {
    std::vector<Tensor> out;
    const std::size_t block = in[0].numel / static_cast<std::size_t>(cp);
    for (int d = 0; d < cp; ++d) {
      out.push_back(backend.allocate(in[0].numel, DType::F32));
      for (int r = 0; r < cp; ++r) {
        backend.copy(out.back().slice(block * r, block), in[std::size_t(r)].slice(block * d, block));
      }
    }
    return out;
  }
  // Each rank's tokens of `local` (width wide; its range of `heads` from `column`) -> each rank's head group of the
  // whole sequence, in `full` (full_width wide, from full_column).
  void to_heads(const std::vector<Tensor>& local, int width, int column, int range_heads, std::vector<Tensor>& full,
                int full_width, int full_column) const {
    std::vector<Tensor> send;
    for (int r = 0; r < cp; ++r) {
      send.push_back(backend.allocate(rows() * range_heads * head_dim, DType::F32));
      backend.context_kernels().ulysses_split_heads(send.back(), local[std::size_t(r)], width, column, range_heads,
                                                    shape(r));
    }
    const std::vector<Tensor> recv = exchange(send);
    for (int d = 0; d < cp; ++d) {
      backend.context_kernels().ulysses_blocks_to_sequence(full[std::size_t(d)], recv[std::size_t(d)], full_width,
                                                           full_column, range_heads / cp, shape(d));
    }
  }
  void to_tokens(const std::vector<Tensor>& full, int full_width, int full_column, int range_heads,
                 std::vector<Tensor>& local, int width, int column) const {
    std::vector<Tensor> send;
    for (int d = 0; d < cp; ++d) {
      send.push_back(backend.allocate(rows() * range_heads * head_dim, DType::F32));
      backend.context_kernels().ulysses_sequence_to_blocks(send.back(), full[std::size_t(d)], full_width, full_column,
                                                           range_heads / cp, shape(d));
    }
    const std::vector<Tensor> recv = exchange(send);
    for (int r = 0; r < cp; ++r) {
      backend.context_kernels().ulysses_join_heads(local[std::size_t(r)], recv[std::size_t(r)], width, column,
                                                   range_heads, shape(r));
    }
  }
  std::vector<Tensor> allocate_each(std::size_t numel) const {
    std::vector<Tensor> tensors;
    for (int r = 0; r < cp; ++r) tensors.push_back(backend.allocate(numel, DType::F32));
    return tensors;
  }
  // q, k, v to heads (the sections of the packed rows)
  std::vector<Tensor> qkv_to_heads(const std::vector<Tensor>& qkv) const {
    std::vector<Tensor> full = allocate_each(rows() * cp * group_row());
    const int d = head_dim, g = heads / cp, kg = kv_heads / cp;
    to_heads(qkv, row(), 0, heads, full, group_row(), 0);
    to_heads(qkv, row(), heads * d, kv_heads, full, group_row(), g * d);
    to_heads(qkv, row(), (heads + kv_heads) * d, kv_heads, full, group_row(), (g + kg) * d);
    return full;
  }
  // outs (per rank, its tokens) <- qkv (per rank, its tokens); keeps what the backward needs
  std::vector<Tensor> forward(const std::vector<Tensor>& qkv, std::vector<Tensor>& full_qkv,
                              std::vector<Tensor>& full_out, std::vector<Tensor>& lse) const {
    full_qkv = qkv_to_heads(qkv);
    const int g = heads / cp, width = heads * head_dim;
    full_out = allocate_each(rows() * cp * g * head_dim);
    lse = allocate_each(static_cast<std::size_t>(batch * g * seq));
    for (int d = 0; d < cp; ++d) {
      const std::size_t u = std::size_t(d);
      backend.attention_forward(full_out[u], lse[u], full_qkv[u], batch, seq, g, kv_heads / cp, head_dim, Tensor{});
    }
    std::vector<Tensor> out = allocate_each(rows() * width);
    to_tokens(full_out, g * head_dim, 0, heads, out, width, 0);
    return out;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& dout, const std::vector<Tensor>& full_qkv,
                               const std::vector<Tensor>& full_out, const std::vector<Tensor>& lse) const {
    const int g = heads / cp, kg = kv_heads / cp, d = head_dim, width = heads * head_dim;
    std::vector<Tensor> full_dout = allocate_each(rows() * cp * g * d);
    to_heads(dout, width, 0, heads, full_dout, g * d, 0);
    std::vector<Tensor> full_dqkv = allocate_each(rows() * cp * group_row());
    for (int r = 0; r < cp; ++r) {
      const std::size_t u = std::size_t(r);
      backend.attention_backward(full_dqkv[u], full_dout[u], full_qkv[u], full_out[u], lse[u], batch, seq, g, kg, d,
                                 Tensor{});
    }
    std::vector<Tensor> dqkv = allocate_each(rows() * row());
    to_tokens(full_dqkv, group_row(), 0, heads, dqkv, row(), 0);
    to_tokens(full_dqkv, group_row(), g * d, kv_heads, dqkv, row(), heads * d);
    to_tokens(full_dqkv, group_row(), (g + kg) * d, kv_heads, dqkv, row(), (heads + kv_heads) * d);
    return dqkv;
  }
};

// The loss of every CP rank's output, L = sum_r sum(out_r * w_r), through the all-to-alls to heads, the whole-sequence
// attention of each head group and the all-to-alls back, differentiated through the same path backward (dout to
// heads, the attention backward, dq, dk, dv back) against central differences in double.
TEST(ExecContextParallelA2a, AttentionBackwardMatchesFiniteDifferences) {
  auto backend = make_backend("cpu", BackendOptions{});
  const Ulysses u{2, 2, 8, 4, 2, 4, *backend};  // cp 2: two query heads and one key/value head per rank
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto random = [&](std::size_t count) {
    Tensor t = backend->allocate(count, DType::F32);
    for (std::size_t i = 0; i < count; ++i) t.f32()[i] = normal(rng);
    return t;
  };
  std::vector<Tensor> qkv, weight;
  for (int r = 0; r < u.cp; ++r) {
    qkv.push_back(random(u.rows() * static_cast<std::size_t>(u.row())));
    weight.push_back(random(u.rows() * static_cast<std::size_t>(u.heads * u.head_dim)));
  }
  const auto loss = [&] {
    std::vector<Tensor> full_qkv, full_out, lse;
    const std::vector<Tensor> out = u.forward(qkv, full_qkv, full_out, lse);
    double total = 0;
    for (int r = 0; r < u.cp; ++r) {
      for (std::size_t i = 0; i < out[std::size_t(r)].numel; ++i) {
        total += double(out[std::size_t(r)].f32()[i]) * weight[std::size_t(r)].f32()[i];
      }
    }
    return total;
  };
  std::vector<Tensor> full_qkv, full_out, lse;
  u.forward(qkv, full_qkv, full_out, lse);
  const std::vector<Tensor> dqkv = u.backward(weight, full_qkv, full_out, lse);
  const float step = 1e-2f;
  double worst = 0;
  int checked = 0;
  for (int r = 0; r < u.cp; ++r) {
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
  std::printf("[ cp a2a fd ] %d elements, worst relative difference %.1e\n", checked, worst);
}

}  // namespace
}  // namespace twin::exec

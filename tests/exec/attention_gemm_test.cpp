// The CPU backend's GEMM attention against kernels/cpu's scalar reference: same outputs, lse and gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "exec/cpu/attention_gemm.hpp"
#include "exec/cpu/thread_pool.hpp"
#include "kernels/cpu/attention.hpp"

namespace twin::exec::cpu {
namespace {

std::vector<float> random_vector(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// max |a - b| / max |b|
double normalized_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1e-30;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
  }
  return diff / scale;
}

void compare(int batch, int seq, int heads, int head_dim, ThreadPool* pool) {
  const std::size_t tokens = static_cast<std::size_t>(batch) * seq, width = static_cast<std::size_t>(heads) * head_dim;
  const auto qkv = random_vector(3 * tokens * width, 1);
  const auto dout = random_vector(tokens * width, 2);
  std::vector<float> out_ref(tokens * width), lse_ref(static_cast<std::size_t>(batch) * heads * seq);
  std::vector<float> out(out_ref.size()), lse(lse_ref.size());
  kernels::cpu::attention_forward(out_ref.data(), lse_ref.data(), qkv.data(), batch, seq, heads, head_dim);
  attention_forward_gemm(out.data(), lse.data(), qkv.data(), batch, seq, heads, head_dim, pool);
  EXPECT_LT(normalized_error(out, out_ref), 1e-5);
  EXPECT_LT(normalized_error(lse, lse_ref), 1e-5);

  std::vector<float> dqkv_ref(qkv.size()), dqkv(qkv.size(), 123.0f);  // garbage: the kernel overwrites
  kernels::cpu::attention_backward(dqkv_ref.data(), dout.data(), qkv.data(), lse_ref.data(), batch, seq, heads,
                                   head_dim);
  attention_backward_gemm(dqkv.data(), dout.data(), qkv.data(), lse.data(), batch, seq, heads, head_dim, pool);
  EXPECT_LT(normalized_error(dqkv, dqkv_ref), 1e-5);
}

TEST(ExecAttentionGemm, MatchesTheScalarKernels) {
  compare(2, 17, 3, 8, nullptr);
}
TEST(ExecAttentionGemm, MatchesTheScalarKernelsOnAPool) {
  ThreadPool pool(3);
  compare(3, 33, 2, 16, &pool);
}
TEST(ExecAttentionGemm, OneTokenOneHead) {
  compare(1, 1, 1, 4, nullptr);
}

TEST(ExecAttentionGemm, SameBitsWithAndWithoutThePool) {
  const int batch = 2, seq = 24, heads = 4, head_dim = 8;
  const auto qkv = random_vector(3ull * batch * seq * heads * head_dim, 3);
  std::vector<float> a(static_cast<std::size_t>(batch) * seq * heads * head_dim), b(a.size());
  std::vector<float> lse_a(static_cast<std::size_t>(batch) * heads * seq), lse_b(lse_a.size());
  ThreadPool pool(2);
  attention_forward_gemm(a.data(), lse_a.data(), qkv.data(), batch, seq, heads, head_dim, nullptr);
  attention_forward_gemm(b.data(), lse_b.data(), qkv.data(), batch, seq, heads, head_dim, &pool);
  EXPECT_EQ(a, b);
  EXPECT_EQ(lse_a, lse_b);
}

TEST(ExecThreadPool, RunsEveryIndexOnceAndRethrows) {
  ThreadPool pool(4);
  std::vector<int> hits(1000, 0);
  pool.parallel_for(1000, [&](int i) { hits[static_cast<std::size_t>(i)] += 1; });
  EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  EXPECT_THROW(pool.parallel_for(10,
                                 [](int i) {
                                   if (i == 7) throw std::runtime_error("seven");
                                 }),
               std::runtime_error);
  pool.parallel_for(3, [&](int i) { hits[static_cast<std::size_t>(i)] = 0; });  // still usable
  EXPECT_EQ(hits[0], 0);
}

}  // namespace
}  // namespace twin::exec::cpu

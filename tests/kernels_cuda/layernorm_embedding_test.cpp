// LayerNorm (plain and fused with the residual) and the embeddings on the device against their CPU twins (skipped
// without a GPU).
#include <gtest/gtest.h>

#include <ostream>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "cuda_test_util.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/layernorm.hpp"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/layernorm.cuh"

namespace twin::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cpu::testing::random_tokens;
using cpu::testing::random_vector;
using testing::bf16_rounded;
using testing::DeviceBuffer;
using testing::normalised_error_below;
using testing::same_bits;
using testing::to_bf16;
using testing::to_float;
using testing::kBf16Tolerance;
using testing::Rows;

class CudaLayerNorm : public ::testing::TestWithParam<Rows> {};

TEST_P(CudaLayerNorm, ForwardFusedResidualAndBackwardMatchCpuTwin) {
  TWIN_REQUIRE_GPU();
  const auto [rows, C] = GetParam();
  const std::size_t n = static_cast<std::size_t>(rows) * C;
  const auto a = bf16_rounded(random_vector(n, 1, -2.0f, 3.0f)), b = bf16_rounded(random_vector(n, 2));
  const auto weight = bf16_rounded(random_vector(C, 3, 0.5f, 1.5f)), bias = bf16_rounded(random_vector(C, 4));
  // CPU: residual, rounded to bf16 as the device stores it, then LayerNorm
  std::vector<float> residual(n), out(n), mean(rows), rstd(rows);
  cpu::residual_forward(residual.data(), a.data(), b.data(), n);
  residual = bf16_rounded(residual);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), residual.data(), weight.data(), bias.data(), rows, C);

  DeviceBuffer<bf16> d_a(to_bf16(a)), d_b(to_bf16(b)), d_weight(to_bf16(weight)), d_bias(to_bf16(bias));
  DeviceBuffer<bf16> d_residual(n), d_out(n), d_out_fused(n);
  DeviceBuffer<float> d_mean(rows), d_rstd(rows), d_mean_fused(rows), d_rstd_fused(rows);
  d_residual.poison(), d_out.poison(), d_out_fused.poison(), d_mean.poison(), d_rstd.poison();
  residual_layernorm_forward(d_residual.get(), d_out_fused.get(), d_mean_fused.get(), d_rstd_fused.get(), d_a.get(),
                             d_b.get(), d_weight.get(), d_bias.get(), rows, C, nullptr);
  layernorm_forward(d_out.get(), d_mean.get(), d_rstd.get(), d_residual.get(), d_weight.get(), d_bias.get(), rows, C,
                    nullptr);
  EXPECT_TRUE(same_bits(to_float(d_residual.download()), residual));
  EXPECT_TRUE(normalised_error_below(to_float(d_out.download()), out, kBf16Tolerance));
  EXPECT_TRUE(normalised_error_below(d_mean.download(), mean, 1e-5));
  EXPECT_TRUE(normalised_error_below(d_rstd.download(), rstd, 1e-5));
  EXPECT_TRUE(same_bits(to_float(d_out_fused.download()), to_float(d_out.download()))) << "fused = unfused";
  EXPECT_TRUE(same_bits(d_mean_fused.download(), d_mean.download()));

  // backward: dinp, dweight, dbias accumulate onto what they hold
  const auto dout = bf16_rounded(random_vector(n, 5));
  const auto dinp0 = bf16_rounded(random_vector(n, 6));
  const auto dweight0 = random_vector(C, 7), dbias0 = random_vector(C, 8);
  auto dinp = dinp0, dweight = dweight0, dbias = dbias0;
  cpu::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), residual.data(), weight.data(),
                          mean.data(), rstd.data(), rows, C);
  DeviceBuffer<bf16> d_dout(to_bf16(dout)), d_dinp(to_bf16(dinp0));
  DeviceBuffer<float> d_dweight(dweight0), d_dbias(dbias0);
  layernorm_backward(d_dinp.get(), d_dweight.get(), d_dbias.get(), d_dout.get(), d_residual.get(), d_weight.get(),
                     d_mean.get(), d_rstd.get(), rows, C, nullptr);
  EXPECT_TRUE(normalised_error_below(to_float(d_dinp.download()), dinp, kBf16Tolerance));
  EXPECT_TRUE(normalised_error_below(d_dweight.download(), dweight, 1e-4));
  EXPECT_TRUE(normalised_error_below(d_dbias.download(), dbias, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaLayerNorm,
                         ::testing::Values(Rows{1, 1}, Rows{3, 31}, Rows{17, 100}, Rows{130, 768}, Rows{64, 2048}));

TEST(CudaEmbedding, VocabParallelForwardAndBackwardMatchCpuTwin) {
  TWIN_REQUIRE_GPU();
  const int batch = 3, seq = 50, rows = batch * seq, C = 72, vocab = 3000;
  const auto tokens = random_tokens(rows, vocab, 9);
  const auto wte = bf16_rounded(random_vector(static_cast<std::size_t>(vocab) * C, 10));
  const auto wpe = bf16_rounded(random_vector(static_cast<std::size_t>(seq + 5) * C, 11));
  const auto dout = bf16_rounded(random_vector(static_cast<std::size_t>(rows) * C, 12));
  DeviceBuffer<int> d_tokens(tokens);
  DeviceBuffer<bf16> d_wpe(to_bf16(wpe)), d_dout(to_bf16(dout));
  for (auto [vocab_start, vocab_local] : {std::pair{0, vocab}, std::pair{1000, 1500}, std::pair{2900, 100}}) {
    const std::vector<float> wte_local(wte.begin() + static_cast<std::size_t>(vocab_start) * C,
                                       wte.begin() + static_cast<std::size_t>(vocab_start + vocab_local) * C);
    std::vector<float> out(static_cast<std::size_t>(rows) * C);
    cpu::embedding_forward(out.data(), tokens.data(), wte_local.data(), rows, C, vocab_start, vocab_local);
    cpu::position_embedding_forward(out.data(), wpe.data(), batch, seq, C);
    DeviceBuffer<bf16> d_wte(to_bf16(wte_local)), d_out(out.size());
    d_out.poison();
    embedding_forward(d_out.get(), d_tokens.get(), d_wte.get(), rows, C, vocab_start, vocab_local, nullptr);
    position_embedding_forward(d_out.get(), d_wpe.get(), batch, seq, C, nullptr);
    EXPECT_TRUE(normalised_error_below(to_float(d_out.download()), out, kBf16Tolerance)) << vocab_start;

    // backward: accumulates, visits rows in the CPU twin's order: same bits
    auto dwte = random_vector(wte_local.size(), 13);
    auto dwpe = random_vector(wpe.size(), 14);
    DeviceBuffer<float> d_dwte(dwte), d_dwpe(dwpe);
    cpu::embedding_backward(dwte.data(), dout.data(), tokens.data(), rows, C, vocab_start, vocab_local);
    cpu::position_embedding_backward(dwpe.data(), dout.data(), batch, seq, C);
    embedding_backward(d_dwte.get(), d_dout.get(), d_tokens.get(), rows, C, vocab_start, vocab_local, nullptr);
    position_embedding_backward(d_dwpe.get(), d_dout.get(), batch, seq, C, nullptr);
    EXPECT_TRUE(same_bits(d_dwte.download(), dwte)) << vocab_start;
    EXPECT_TRUE(same_bits(d_dwpe.download(), dwpe));
  }
}

TEST(CudaEmbedding, BackwardWithManyRepeatsAcrossTokenTiles) {
  TWIN_REQUIRE_GPU();
  const int rows = 5000, C = 130, vocab = 7;  // > one 1024-token tile, every token repeated ~700 times
  const auto tokens = random_tokens(rows, vocab, 15);
  const auto dout = bf16_rounded(random_vector(static_cast<std::size_t>(rows) * C, 16));
  std::vector<float> dwte(static_cast<std::size_t>(vocab) * C, 0.0f);
  DeviceBuffer<float> d_dwte(dwte);
  cpu::embedding_backward(dwte.data(), dout.data(), tokens.data(), rows, C, 0, vocab);
  DeviceBuffer<int> d_tokens(tokens);
  DeviceBuffer<bf16> d_dout(to_bf16(dout));
  embedding_backward(d_dwte.get(), d_dout.get(), d_tokens.get(), rows, C, 0, vocab, nullptr);
  EXPECT_TRUE(same_bits(d_dwte.download(), dwte));
}

}  // namespace
}  // namespace twin::kernels::cuda

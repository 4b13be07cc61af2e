// The context-parallel kernels (kernels/cuda/context_parallel.cuh) against kernels/cpu/ring_attention.hpp and
// kernels/cpu/rope.hpp on bf16-rounded inputs (skipped without a GPU): rotary embeddings by position, the copies
// (K/V block, Ulysses head groups and sequence order), every ring step forward and backward, the all_gather way; every
// output written. Their preconditions on any machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "cuda_test_util.hpp"
#include "kernels/cpu/ring_attention.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cuda/context_parallel.cuh"

namespace twin::kernels::cuda {
namespace {

namespace ctx = context;
using bf16 = __nv_bfloat16;
using cpu::testing::random_vector;
using testing::bf16_rounded;
using testing::DeviceBuffer;
using testing::normalised_error_below;
using testing::to_bf16;
using testing::to_float;
using Floats = std::vector<float>;

// grouped-query attention over 2 ranks, multi-head over 3
const ctx::Layout kLayouts[] = {{2, 32, 4, 2, 16, 2}, {1, 36, 3, 3, 32, 3}};

cpu::ContextParallelShape cpu_shape(const ctx::Layout& s) {
  cpu::ContextParallelShape c;
  c.batch = s.batch, c.seq = s.seq, c.heads = s.heads, c.kv_heads = s.kv_heads, c.head_dim = s.head_dim, c.cp = s.cp;
  return c;
}

Floats download(const DeviceBuffer<bf16>& x) {
  return to_float(x.download());
}

// --- on any machine -------------------------------------------------------------------------------------------------

TEST(CudaContextLaunch, PreconditionsThrowBeforeAnyLaunch) {
  ctx::Layout s{1, 8, 2, 2, ctx::kMaxHeadDim + 2, 2};
  bf16* none = nullptr;
  float* no_floats = nullptr;
  const ctx::KeyBlocks<const bf16> kv{none, none, 1, 1, 0, 1};
  EXPECT_THROW(context_attention_forward(none, no_floats, none, kv, 0, false, s, nullptr), std::invalid_argument);
  s.head_dim = 8;
  s.seq = 10;  // not a multiple of 2 cp
  EXPECT_THROW(context_attention_delta(no_floats, none, none, s, nullptr), std::invalid_argument);
  s.seq = 8;
  EXPECT_THROW(context_rope(none, s, 2, 0, false, nullptr), std::invalid_argument);  // rank 2 of 2
  EXPECT_THROW(context_gather(none, none, 4, ctx::ColumnRange{8, 6, 4}, nullptr), std::invalid_argument);
}

// --- with a GPU -----------------------------------------------------------------------------------------------------

TEST(CudaContextKernels, RopeAndCopiesMatchTheCpuTwins) {
  TWIN_REQUIRE_GPU();
  for (const ctx::Layout& s : kLayouts) {
    SCOPED_TRACE("cp " + std::to_string(s.cp));
    const int rank = s.cp - 1, chunk = s.chunk_len();
    const Floats qkv = bf16_rounded(random_vector(s.tokens() * s.qkv_width(), 1, -2.0f, 2.0f));
    // rotary embeddings at the chunks' positions (the CPU backend's context_rope_forward)
    Floats want = qkv;
    for (int b = 0; b < s.batch; ++b) {
      for (int part = 0; part < 2; ++part) {
        float* rows = want.data() + (static_cast<std::size_t>(b) * s.local_len() + part * chunk) * s.qkv_width();
        cpu::rope_forward(rows, 1, chunk, s.heads, s.kv_heads, s.head_dim, 10000.f, 0,
                          cpu::cp_chunk_of(rank, part, s.cp) * chunk);
      }
    }
    DeviceBuffer<bf16> d_qkv(to_bf16(qkv));
    context_rope(d_qkv.get(), s, rank, 0, false, nullptr);
    EXPECT_TRUE(normalised_error_below(download(d_qkv), want, 5e-3)) << "rope";
    context_rope(d_qkv.get(), s, rank, 0, true, nullptr);
    EXPECT_TRUE(normalised_error_below(download(d_qkv), qkv, 1e-2)) << "rope, back";

    // the K/V block of a packed qkv
    d_qkv.upload(to_bf16(qkv));
    Floats block(s.tokens() * 2 * s.kv_width());
    cpu::cp_pack_kv(block.data(), qkv.data(), s.batch, s.local_len(), s.heads, s.kv_heads, s.head_dim);
    DeviceBuffer<bf16> d_block(block.size());
    d_block.poison();
    context_gather(d_block.get(), d_qkv.get(), block.size(),
                   ctx::ColumnRange{s.qkv_width(), s.out_width(), 2 * s.kv_width()}, nullptr);
    EXPECT_EQ(download(d_block), block) << "K/V block";

    // Ulysses: the query heads cut into cp groups, and the whole sequence's blocks
    if (s.heads % s.cp == 0) {
      Floats queries(s.tokens() * s.out_width()), send(queries.size());
      for (std::size_t t = 0; t < s.tokens(); ++t) {
        std::copy_n(qkv.begin() + t * s.qkv_width(), s.out_width(), queries.begin() + t * s.out_width());
      }
      cpu::ulysses_split_heads(send.data(), queries.data(), s.batch, s.local_len(), {s.heads}, s.head_dim, s.cp);
      DeviceBuffer<bf16> d_send(send.size());
      d_send.poison();
      context_gather(d_send.get(), d_qkv.get(), send.size(),
                     ctx::HeadGroups{s.tokens(), s.qkv_width(), 0, s.out_width() / s.cp}, nullptr);
      EXPECT_EQ(download(d_send), send) << "split heads";
    }
    const std::size_t width = s.qkv_width() / 2;  // any row: the whole sequence as (B, seq, width)
    const Floats full(qkv.begin(), qkv.begin() + static_cast<std::ptrdiff_t>(s.batch * s.seq * width));
    Floats blocks(full.size());
    cpu::cp_sequence_to_blocks(blocks.data(), full.data(), s.batch, s.seq, static_cast<int>(width), s.cp);
    DeviceBuffer<bf16> d_full(to_bf16(full)), d_blocks(full.size()), d_back(full.size());
    d_blocks.poison();
    d_back.poison();
    const ctx::SequenceBlocks order{s.batch, s.seq, s.cp, width, 0, width};
    context_gather(d_blocks.get(), d_full.get(), full.size(), order, nullptr);
    EXPECT_EQ(download(d_blocks), blocks) << "sequence to blocks";
    context_scatter(d_back.get(), d_blocks.get(), full.size(), order, nullptr);
    EXPECT_EQ(download(d_back), full) << "blocks to sequence";
  }
}

template <class T>
ctx::KeyBlocks<T> ring_kv_block(T* kv, int source, const ctx::Layout& s) {
  return ctx::KeyBlocks<T>{kv, kv + s.kv_width(), 2 * s.kv_width(), 0, source, 1};
}

TEST(CudaContextKernels, RingStepsMatchTheCpuRingSteps) {
  TWIN_REQUIRE_GPU();
  for (const ctx::Layout& s : kLayouts) {
    SCOPED_TRACE("cp " + std::to_string(s.cp));
    const cpu::ContextParallelShape cs = cpu_shape(s);
    const int rank = 1;
    std::vector<Floats> kv;
    for (int r = 0; r < s.cp; ++r) kv.push_back(bf16_rounded(random_vector(s.tokens() * 2 * s.kv_width(), 10 + r)));
    const Floats qkv = bf16_rounded(random_vector(s.tokens() * s.qkv_width(), 2, -2.0f, 2.0f));
    const Floats dout = bf16_rounded(random_vector(s.tokens() * s.out_width(), 3));
    const std::size_t stats = s.tokens() * s.heads;
    Floats out(s.tokens() * s.out_width()), lse(stats), delta(stats), dq(out.size(), 0.0f);
    DeviceBuffer<bf16> d_qkv(to_bf16(qkv)), d_out(out.size()), d_dout(to_bf16(dout));
    DeviceBuffer<bf16> d_dq(to_bf16(dq));
    DeviceBuffer<float> d_lse(stats), d_delta(stats);
    d_out.poison();
    d_lse.poison();
    d_delta.poison();
    for (int step = 0; step < s.cp; ++step) {
      const int source = (rank - step + s.cp) % s.cp;
      cpu::ring_attention_forward_step(out.data(), lse.data(), qkv.data(), kv[source].data(), rank, source, cs);
      DeviceBuffer<bf16> d_kv(to_bf16(kv[source]));
      context_attention_forward(d_out.get(), d_lse.get(), d_qkv.get(), ring_kv_block<const bf16>(d_kv.get(), source, s),
                                rank, step > 0, s, nullptr);
      EXPECT_TRUE(normalised_error_below(download(d_out), out, 1e-2)) << "step " << step << " out";
      EXPECT_TRUE(normalised_error_below(d_lse.download(), lse, 1e-3)) << "step " << step << " lse";
    }
    cpu::ring_attention_delta(delta.data(), dout.data(), out.data(), cs);
    d_out.upload(to_bf16(out));  // the same final output on both sides: the backward alone is compared below
    d_lse.upload(lse);
    context_attention_delta(d_delta.get(), d_dout.get(), d_out.get(), s, nullptr);
    EXPECT_TRUE(normalised_error_below(d_delta.download(), delta, 1e-2)) << "delta";
    d_delta.upload(delta);
    const ctx::Backward<bf16> x{d_dout.get(), d_qkv.get(), d_lse.get(), d_delta.get(), rank};
    for (int step = 0; step < s.cp; ++step) {
      const int source = (rank - step + s.cp) % s.cp;
      Floats dkv(kv[source].size(), 0.0f);
      cpu::ring_attention_backward_step(dq.data(), dkv.data(), dout.data(), qkv.data(), kv[source].data(), lse.data(),
                                        delta.data(), rank, source, cs);
      DeviceBuffer<bf16> d_kv(to_bf16(kv[source])), d_dkv(to_bf16(Floats(dkv.size(), 0.0f)));
      context_attention_backward(d_dq.get(), s.out_width(), ring_kv_block<bf16>(d_dkv.get(), source, s), true, x,
                                 ring_kv_block<const bf16>(d_kv.get(), source, s), s, nullptr);
      EXPECT_TRUE(normalised_error_below(download(d_dq), dq, 2e-2)) << "step " << step << " dq";
      EXPECT_TRUE(normalised_error_below(download(d_dkv), dkv, 2e-2)) << "step " << step << " dkv";
    }
  }
}

TEST(CudaContextKernels, AllGatherMatchesTheCpuAllGather) {
  TWIN_REQUIRE_GPU();
  for (const ctx::Layout& s : kLayouts) {
    SCOPED_TRACE("cp " + std::to_string(s.cp));
    const cpu::ContextParallelShape cs = cpu_shape(s);
    const int rank = 0;
    const std::size_t kvw = s.kv_width(), block = s.tokens() * kvw, stats = s.tokens() * s.heads;
    // every rank's keys and values, (cp, B, L, KV D) each, and the whole sequence's (B, seq, 2 KV D) for the CPU
    const Floats keys = bf16_rounded(random_vector(s.cp * block, 4)),
                 values = bf16_rounded(random_vector(keys.size(), 5));
    Floats packed(2 * keys.size()), kv_full(packed.size());
    for (std::size_t t = 0; t < s.cp * s.tokens(); ++t) {
      std::copy_n(keys.begin() + t * kvw, kvw, packed.begin() + 2 * t * kvw);
      std::copy_n(values.begin() + t * kvw, kvw, packed.begin() + 2 * t * kvw + kvw);
    }
    cpu::cp_blocks_to_sequence(kv_full.data(), packed.data(), s.batch, s.seq, static_cast<int>(2 * kvw), s.cp);
    const Floats qkv = bf16_rounded(random_vector(s.tokens() * s.qkv_width(), 6, -2.0f, 2.0f));
    const Floats dout = bf16_rounded(random_vector(s.tokens() * s.out_width(), 7));
    Floats out(s.tokens() * s.out_width()), lse(stats), delta(stats), dq(out.size(), 0.0f), dkv_full(kv_full.size());
    cpu::all_gather_attention_forward(out.data(), lse.data(), qkv.data(), kv_full.data(), rank, cs);
    cpu::ring_attention_delta(delta.data(), dout.data(), out.data(), cs);
    cpu::all_gather_attention_backward(dq.data(), dkv_full.data(), dout.data(), qkv.data(), kv_full.data(), lse.data(),
                                       delta.data(), rank, cs);
    Floats dblocks(packed.size()), dkeys(keys.size()), dvalues(keys.size());
    cpu::cp_sequence_to_blocks(dblocks.data(), dkv_full.data(), s.batch, s.seq, static_cast<int>(2 * kvw), s.cp);
    for (std::size_t t = 0; t < s.cp * s.tokens(); ++t) {
      std::copy_n(dblocks.begin() + 2 * t * kvw, kvw, dkeys.begin() + t * kvw);
      std::copy_n(dblocks.begin() + 2 * t * kvw + kvw, kvw, dvalues.begin() + t * kvw);
    }

    DeviceBuffer<bf16> d_keys(to_bf16(keys)), d_values(to_bf16(values)), d_qkv(to_bf16(qkv)), d_dout(to_bf16(dout));
    DeviceBuffer<bf16> d_out(out.size()), d_dq(to_bf16(Floats(out.size(), 0.0f))), d_dkeys(keys.size()),
        d_dvalues(keys.size());
    DeviceBuffer<float> d_lse(stats), d_delta(lse);
    d_out.poison();
    d_lse.poison();
    d_dkeys.poison();  // OVERWRITTEN, the blocks this rank's queries never see included
    d_dvalues.poison();
    const ctx::KeyBlocks<const bf16> all{d_keys.get(), d_values.get(), kvw, block, 0, s.cp};
    context_attention_forward(d_out.get(), d_lse.get(), d_qkv.get(), all, rank, false, s, nullptr);
    EXPECT_TRUE(normalised_error_below(download(d_out), out, 1e-2)) << "out";
    EXPECT_TRUE(normalised_error_below(d_lse.download(), lse, 1e-3)) << "lse";
    d_lse.upload(lse);
    d_delta.upload(delta);
    const ctx::Backward<bf16> x{d_dout.get(), d_qkv.get(), d_lse.get(), d_delta.get(), rank};
    const ctx::KeyBlocks<bf16> grads{d_dkeys.get(), d_dvalues.get(), kvw, block, 0, s.cp};
    context_attention_backward(d_dq.get(), s.out_width(), grads, false, x, all, s, nullptr);
    EXPECT_TRUE(normalised_error_below(download(d_dq), dq, 2e-2)) << "dq";
    EXPECT_TRUE(normalised_error_below(download(d_dkeys), dkeys, 2e-2)) << "dkeys";
    EXPECT_TRUE(normalised_error_below(download(d_dvalues), dvalues, 2e-2)) << "dvalues";
  }
}

}  // namespace
}  // namespace twin::kernels::cuda

// Context parallelism's device arithmetic on the CPU, no GPU needed: context_math.hpp's chunk layout, lse merge and
// index maps, and context_attention_rows.hpp's per-thread rows (what context_parallel.cu's kernels run), instantiated
// on fp32 and run over every row, against kernels/cpu/ring_attention.hpp (the CPU backend's context parallelism) and
// kernels/cpu/rope.hpp on the same inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "kernels/cpu/flash_attention.hpp"
#include "kernels/cpu/ring_attention.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cuda/context_attention_rows.hpp"
#include "kernels/cuda/context_math.hpp"

namespace twin::kernels::cuda {
namespace {

namespace ctx = context;
using cpu::testing::random_vector;
using Floats = std::vector<float>;

struct Case {
  int batch, seq, heads, kv_heads, head_dim, cp;
};
std::ostream& operator<<(std::ostream& out, const Case& c) {
  return out << "B " << c.batch << " seq " << c.seq << " H " << c.heads << " KV " << c.kv_heads << " D " << c.head_dim
             << " cp " << c.cp;
}
// grouped and multi-head attention; 2, 3 and 4 ranks
const Case kCases[] = {{2, 24, 4, 2, 8, 2}, {1, 24, 4, 4, 8, 3}, {2, 16, 2, 1, 16, 4}};

ctx::Layout layout(const Case& c) {
  return ctx::Layout{c.batch, c.seq, c.heads, c.kv_heads, c.head_dim, c.cp};
}
cpu::ContextParallelShape shape(const Case& c) {
  cpu::ContextParallelShape s;
  s.batch = c.batch, s.seq = c.seq, s.heads = c.heads, s.kv_heads = c.kv_heads, s.head_dim = c.head_dim, s.cp = c.cp;
  return s;
}

// max |got - want| over max |want|: fp32 results of the same math in another order agree to ~1e-6
::testing::AssertionResult close(const Floats& got, const Floats& want, double tolerance = 2e-5) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << got.size() << " vs " << want.size();
  double scale = 1e-30, worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i]) && got[i] == want[i]) continue;
    if (!std::isfinite(got[i])) return ::testing::AssertionFailure() << "element " << i << " is " << got[i];
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    if (d > worst) worst = d, at = i;
  }
  if (worst <= tolerance * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << at << ": got " << got[at] << ", want " << want[at]
                                       << " (relative error " << worst / scale << ")";
}

template <class Map>
void gather(Floats& compact, const Floats& strided, const Map& map) {
  for (std::size_t e = 0; e < compact.size(); ++e) compact[e] = strided[map(e)];
}
template <class Map>
void scatter(Floats& strided, const Floats& compact, const Map& map) {
  for (std::size_t e = 0; e < compact.size(); ++e) strided[map(e)] = compact[e];
}

// --- the chunk layout, the merge
// --------------------------------------------------------------------------------------

TEST(CudaContextMath, ChunkLayoutIsTheCpuTwins) {
  for (int cp = 1; cp <= 4; ++cp) {
    const int seq = 2 * cp * 3;
    Floats positions(seq), local(seq / cp);
    for (int t = 0; t < seq; ++t) positions[t] = static_cast<float>(t);
    for (int rank = 0; rank < cp; ++rank) {
      for (int part = 0; part < 2; ++part) EXPECT_EQ(ctx::chunk_of(rank, part, cp), cpu::cp_chunk_of(rank, part, cp));
      cpu::cp_take_local(local.data(), positions.data(), 1, seq, 1, cp, rank);
      for (int i = 0; i < seq / cp; ++i) {
        const int position = ctx::position_of(i, rank, seq, cp);
        EXPECT_EQ(position, static_cast<int>(local[i])) << "cp " << cp << " rank " << rank << " token " << i;
        const ctx::Holder holder = ctx::holder_of(position, seq, cp);
        EXPECT_EQ(holder.rank, rank);
        EXPECT_EQ(holder.local, i);
      }
    }
  }
}

TEST(CudaContextMath, MergeIsFlashAttentionMerge) {
  const int len = 6, heads = 2, D = 4;
  const float inf = std::numeric_limits<float>::infinity();
  Floats out = random_vector(len * heads * D, 1), out_b = random_vector(out.size(), 2);
  Floats lse = random_vector(len * heads, 3, -3.0f, 3.0f), lse_b = random_vector(lse.size(), 4, -3.0f, 3.0f);
  lse_b[1] = -inf;           // the second partial saw no key
  lse[2] = -inf;             // the first saw none
  lse[3] = lse_b[3] = -inf;  // neither (head 0, token 3): its output is 0, as a row that saw no key has
  std::fill_n(out.begin() + 3 * heads * D, D, 0.0f);
  lse[4] = lse_b[4] + 40.0f;  // far apart
  Floats want = out, want_lse = lse, got = out, got_lse = lse;
  cpu::flash_attention_merge({want.data(), want.size(), static_cast<std::size_t>(heads * D)}, want_lse.data(),
                             {out_b.data(), out_b.size(), static_cast<std::size_t>(heads * D)}, lse_b.data(), 1, len,
                             heads, D);
  for (int h = 0; h < heads; ++h) {
    for (int t = 0; t < len; ++t) {
      const std::size_t stat = static_cast<std::size_t>(h) * len + t,
                        row = (static_cast<std::size_t>(t) * heads + h) * D;
      const ctx::Merge m = ctx::merge_lse(got_lse[stat], lse_b[stat]);
      got_lse[stat] = m.lse;
      for (int d = 0; d < D; ++d) got[row + d] = m.weight_a * got[row + d] + m.weight_b * out_b[row + d];
    }
  }
  EXPECT_TRUE(close(got, want, 1e-6));
  EXPECT_TRUE(close(got_lse, want_lse, 1e-6));
  EXPECT_EQ(got_lse[3], -inf);
}

// --- the copies
// --------------------------------------------------------------------------------------------------------

TEST(CudaContextMath, CopyMapsAreTheCpuTwins) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const ctx::Layout s = layout(c);
    const std::size_t tokens = s.tokens(), row = s.qkv_width(), q = s.out_width(), kv = s.kv_width();
    const Floats qkv = random_vector(tokens * row, 5);
    // the K/V block of a packed qkv: cp_pack_kv
    Floats want(tokens * 2 * kv), got(want.size());
    cpu::cp_pack_kv(want.data(), qkv.data(), c.batch, s.local_len(), c.heads, c.kv_heads, c.head_dim);
    gather(got, qkv, ctx::ColumnRange{row, q, 2 * kv});
    EXPECT_EQ(got, want) << "K/V block";
    // and back into dqkv's key and value columns (cp_add_kv_gradient onto zeros)
    Floats want_dqkv(qkv.size(), 0.0f), got_dqkv(qkv.size(), 0.0f);
    cpu::cp_add_kv_gradient(want_dqkv.data(), want.data(), c.batch, s.local_len(), c.heads, c.kv_heads, c.head_dim);
    scatter(got_dqkv, got, ctx::ColumnRange{row, q, 2 * kv});
    EXPECT_EQ(got_dqkv, want_dqkv) << "K/V gradient";

    // Ulysses: the key heads of qkv (a column range) cut into cp head groups, if KV divides
    if (c.kv_heads % c.cp == 0) {
      Floats keys(tokens * kv), send(keys.size()), got_send(keys.size());
      gather(keys, qkv, ctx::ColumnRange{row, q, kv});
      cpu::ulysses_split_heads(send.data(), keys.data(), c.batch, s.local_len(), {c.kv_heads}, c.head_dim, c.cp);
      const ctx::HeadGroups groups{tokens, row, q, kv / c.cp};
      gather(got_send, qkv, groups);
      EXPECT_EQ(got_send, send) << "split heads";
      Floats joined(qkv.size(), 0.0f), want_joined(qkv.size(), 0.0f);
      scatter(joined, got_send, groups);
      scatter(want_joined, keys, ctx::ColumnRange{row, q, kv});
      EXPECT_EQ(joined, want_joined) << "join heads";
    }

    // Ulysses: a column range of the whole sequence (B, seq, width) <-> every rank's blocks
    const std::size_t width = row, column = q, range = kv;
    const Floats full = random_vector(static_cast<std::size_t>(c.batch) * c.seq * width, 6);
    Floats part(static_cast<std::size_t>(c.batch) * c.seq * range), blocks(part.size()), got_blocks(part.size());
    for (std::size_t t = 0; t < part.size() / range; ++t) {
      std::copy_n(full.begin() + t * width + column, range, part.begin() + t * range);
    }
    cpu::cp_sequence_to_blocks(blocks.data(), part.data(), c.batch, c.seq, static_cast<int>(range), c.cp);
    const ctx::SequenceBlocks order{c.batch, c.seq, c.cp, width, column, range};
    gather(got_blocks, full, order);
    EXPECT_EQ(got_blocks, blocks) << "sequence to blocks";
    Floats back(full.size(), 0.0f), want_back(full.size(), 0.0f), want_part(part.size());
    scatter(back, got_blocks, order);
    cpu::cp_blocks_to_sequence(want_part.data(), blocks.data(), c.batch, c.seq, static_cast<int>(range), c.cp);
    scatter(want_back, want_part, ctx::ColumnRange{width, column, range});
    EXPECT_EQ(back, want_back) << "blocks to sequence";
  }
}

// --- rotary embeddings by position
// ------------------------------------------------------------------------------------

TEST(CudaContextMath, RopeByPositionIsCpuRopeAtTheChunksPositions) {
  for (const Case& c : kCases) {
    for (int rotary_dim : {c.head_dim, c.head_dim / 2}) {
      SCOPED_TRACE(::testing::PrintToString(c) + " rotary " + std::to_string(rotary_dim));
      const ctx::Layout s = layout(c);
      const int chunk = s.chunk_len(), rank = c.cp - 1;
      const Floats qkv = random_vector(s.tokens() * s.qkv_width(), 7);
      Floats want = qkv, got = qkv;
      for (int b = 0; b < c.batch; ++b) {  // the CPU backend's context_rope_forward
        for (int part = 0; part < 2; ++part) {
          float* rows = want.data() + (static_cast<std::size_t>(b) * s.local_len() + part * chunk) * s.qkv_width();
          cpu::rope_forward(rows, 1, chunk, c.heads, c.kv_heads, c.head_dim, 10000.f, rotary_dim,
                            cpu::cp_chunk_of(rank, part, c.cp) * chunk);
        }
      }
      for (std::size_t e = 0; e < ctx::rope_pairs(rotary_dim, s); ++e) {
        ctx::rope_pair(e, got.data(), rank, rotary_dim, 10000.f, 1.0, s);
      }
      EXPECT_TRUE(close(got, want, 1e-6));
      for (std::size_t e = 0; e < ctx::rope_pairs(rotary_dim, s); ++e) {
        ctx::rope_pair(e, got.data(), rank, rotary_dim, 10000.f, -1.0, s);
      }
      EXPECT_TRUE(close(got, qkv, 1e-5)) << "rotated back";
    }
  }
}

// --- attention: the ring steps and the all_gather way
// -----------------------------------------------------------------

// Every rank's qkv (B, L, (H + 2 KV) D) and output gradient of one case.
struct Ranks {
  std::vector<Floats> qkv, dout, kv;  // kv: each rank's (B, L, 2 KV D) block
};
Ranks random_ranks(const Case& c) {
  const ctx::Layout s = layout(c);
  Ranks r;
  for (int rank = 0; rank < c.cp; ++rank) {
    r.qkv.push_back(random_vector(s.tokens() * s.qkv_width(), 100 + rank, -2.0f, 2.0f));
    r.dout.push_back(random_vector(s.tokens() * s.out_width(), 200 + rank));
    r.kv.emplace_back(s.tokens() * 2 * s.kv_width());
    gather(r.kv.back(), r.qkv.back(), ctx::ColumnRange{s.qkv_width(), s.out_width(), 2 * s.kv_width()});
  }
  return r;
}

template <class T>
ctx::KeyBlocks<T> ring_block(T* kv, int source, const ctx::Layout& s) {
  return ctx::KeyBlocks<T>{kv, kv + s.kv_width(), 2 * s.kv_width(), 0, source, 1};
}

TEST(CudaContextRows, RingStepsAreTheCpuRingSteps) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const ctx::Layout s = layout(c);
    const cpu::ContextParallelShape cs = shape(c);
    Ranks ranks = random_ranks(c);
    for (int rank = 0; rank < c.cp; ++rank) {
      const std::size_t stats = s.tokens() * c.heads;
      Floats out(s.tokens() * s.out_width()), lse(stats), want_out(out.size()), want_lse(stats);
      for (int step = 0; step < c.cp; ++step) {
        const int source = (rank - step + c.cp) % c.cp;
        cpu::ring_attention_forward_step(want_out.data(), want_lse.data(), ranks.qkv[rank].data(),
                                         ranks.kv[source].data(), rank, source, cs);
        const auto kv = ring_block<const float>(ranks.kv[source].data(), source, s);
        for (std::size_t row = 0; row < ctx::query_rows(s); ++row) {
          ctx::forward_row(row, out.data(), lse.data(), ranks.qkv[rank].data(), kv, rank, step > 0, s);
        }
        EXPECT_TRUE(close(out, want_out)) << "rank " << rank << " step " << step << " out";
        EXPECT_TRUE(close(lse, want_lse)) << "rank " << rank << " step " << step << " lse";
      }
      // the backward: delta, then each step's dq += and the source block's dK/dV +=
      Floats delta(stats), want_delta(stats);
      cpu::ring_attention_delta(want_delta.data(), ranks.dout[rank].data(), want_out.data(), cs);
      for (std::size_t row = 0; row < ctx::query_rows(s); ++row) {
        ctx::delta_row(row, delta.data(), ranks.dout[rank].data(), out.data(), s);
      }
      EXPECT_TRUE(close(delta, want_delta)) << "delta";
      Floats dq(out.size(), 0.0f), want_dq(out.size(), 0.0f);
      const ctx::Backward<float> x{ranks.dout[rank].data(), ranks.qkv[rank].data(), want_lse.data(), want_delta.data(),
                                   rank};
      for (int step = 0; step < c.cp; ++step) {
        const int source = (rank - step + c.cp) % c.cp;
        Floats dkv(ranks.kv[source].size(), 0.0f), want_dkv(dkv.size(), 0.0f);
        cpu::ring_attention_backward_step(want_dq.data(), want_dkv.data(), ranks.dout[rank].data(),
                                          ranks.qkv[rank].data(), ranks.kv[source].data(), want_lse.data(),
                                          want_delta.data(), rank, source, cs);
        const auto kv = ring_block<const float>(ranks.kv[source].data(), source, s);
        for (std::size_t row = 0; row < ctx::query_rows(s); ++row) {
          ctx::dq_row(row, dq.data(), s.out_width(), x, kv, s);
        }
        for (std::size_t row = 0; row < ctx::key_rows(1, s); ++row) {
          ctx::dkv_row(row, ring_block<float>(dkv.data(), source, s), x, kv, true, s);
        }
        EXPECT_TRUE(close(dq, want_dq)) << "rank " << rank << " step " << step << " dq";
        EXPECT_TRUE(close(dkv, want_dkv)) << "rank " << rank << " step " << step << " dkv";
      }
    }
  }
}

// What the device stores: the same rows on bf16 tensors (the host path of cuda_bf16.h's conversions), every ring step
// merged into a bf16 output and every backward step accumulated into bf16 dq and dK/dV, stay within bf16 tolerance of
// the CPU's fp32 ring at cp = 4 (the most steps of the cases).
TEST(CudaContextRows, RingStepsOnBf16TensorsStayWithinBf16Tolerance) {
  using bf16 = __nv_bfloat16;
  const auto to_b = [](const Floats& x) {
    std::vector<bf16> out;
    for (float v : x) out.push_back(__float2bfloat16_rn(v));
    return out;
  };
  const auto to_f = [](const std::vector<bf16>& x) {
    Floats out;
    for (bf16 v : x) out.push_back(__bfloat162float(v));
    return out;
  };
  const auto within = [](const Floats& got, const Floats& want, double tolerance) {
    double error = 0, norm = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      error += (got[i] - want[i]) * static_cast<double>(got[i] - want[i]);
      norm += want[i] * static_cast<double>(want[i]);
    }
    return std::sqrt(error / norm) <= tolerance;
  };
  const Case c = kCases[2];
  const ctx::Layout s = layout(c);
  const cpu::ContextParallelShape cs = shape(c);
  Ranks ranks = random_ranks(c);
  for (auto* tensors : {&ranks.qkv, &ranks.dout, &ranks.kv}) {  // bf16-exact inputs on both sides
    for (Floats& t : *tensors) t = to_f(to_b(t));
  }
  const int rank = 1;
  const std::size_t stats = s.tokens() * c.heads;
  Floats want_out(s.tokens() * s.out_width()), want_lse(stats), lse(stats), delta(stats), want_delta(stats);
  std::vector<bf16> out(want_out.size()), dq(want_out.size(), __float2bfloat16_rn(0.0f));
  const std::vector<bf16> qkv = to_b(ranks.qkv[rank]), dout = to_b(ranks.dout[rank]);
  for (int step = 0; step < c.cp; ++step) {
    const int source = (rank - step + c.cp) % c.cp;
    cpu::ring_attention_forward_step(want_out.data(), want_lse.data(), ranks.qkv[rank].data(), ranks.kv[source].data(),
                                     rank, source, cs);
    const std::vector<bf16> kv = to_b(ranks.kv[source]);
    for (std::size_t row = 0; row < ctx::query_rows(s); ++row) {
      ctx::forward_row(row, out.data(), lse.data(), qkv.data(), ring_block<const bf16>(kv.data(), source, s), rank,
                       step > 0, s);
    }
  }
  EXPECT_TRUE(within(to_f(out), want_out, 1e-2)) << "out";
  EXPECT_TRUE(close(lse, want_lse, 1e-3)) << "lse";
  cpu::ring_attention_delta(want_delta.data(), ranks.dout[rank].data(), want_out.data(), cs);
  for (std::size_t row = 0; row < ctx::query_rows(s); ++row)
    ctx::delta_row(row, delta.data(), dout.data(), out.data(), s);
  EXPECT_TRUE(within(delta, want_delta, 1e-2)) << "delta";
  Floats want_dq(want_out.size(), 0.0f);
  const ctx::Backward<bf16> x{dout.data(), qkv.data(), lse.data(), delta.data(), rank};
  for (int step = 0; step < c.cp; ++step) {
    const int source = (rank - step + c.cp) % c.cp;
    Floats want_dkv(ranks.kv[source].size(), 0.0f);
    cpu::ring_attention_backward_step(want_dq.data(), want_dkv.data(), ranks.dout[rank].data(), ranks.qkv[rank].data(),
                                      ranks.kv[source].data(), want_lse.data(), want_delta.data(), rank, source, cs);
    const std::vector<bf16> kv = to_b(ranks.kv[source]);
    std::vector<bf16> dkv(kv.size(), __float2bfloat16_rn(0.0f));
    for (std::size_t row = 0; row < ctx::query_rows(s); ++row) {
      ctx::dq_row(row, dq.data(), s.out_width(), x, ring_block<const bf16>(kv.data(), source, s), s);
    }
    for (std::size_t row = 0; row < ctx::key_rows(1, s); ++row) {
      ctx::dkv_row(row, ring_block<bf16>(dkv.data(), source, s), x, ring_block<const bf16>(kv.data(), source, s), true,
                   s);
    }
    EXPECT_TRUE(within(to_f(dkv), want_dkv, 2e-2)) << "step " << step << " dkv";
  }
  EXPECT_TRUE(within(to_f(dq), want_dq, 2e-2)) << "dq";
}

TEST(CudaContextRows, AllGatherIsTheCpuAllGather) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const ctx::Layout s = layout(c);
    const cpu::ContextParallelShape cs = shape(c);
    const Ranks ranks = random_ranks(c);
    const std::size_t kv = s.kv_width(), block = s.tokens() * kv, row = s.qkv_width(), stats = s.tokens() * c.heads;
    // the all-gathers' outputs: every rank's keys, and values, (cp, B, L, KV D) in rank order
    Floats keys(c.cp * block), values(keys.size()), packed(2 * keys.size()), kv_full(packed.size());
    for (int r = 0; r < c.cp; ++r) {
      Floats k(block), v(block);
      gather(k, ranks.qkv[r], ctx::ColumnRange{row, s.out_width(), kv});
      gather(v, ranks.qkv[r], ctx::ColumnRange{row, s.out_width() + kv, kv});
      std::copy(k.begin(), k.end(), keys.begin() + r * block);
      std::copy(v.begin(), v.end(), values.begin() + r * block);
      std::copy(ranks.kv[r].begin(), ranks.kv[r].end(), packed.begin() + 2 * r * block);
    }
    cpu::cp_blocks_to_sequence(kv_full.data(), packed.data(), c.batch, c.seq, static_cast<int>(2 * kv), c.cp);
    const ctx::KeyBlocks<const float> all{keys.data(), values.data(), kv, block, 0, c.cp};
    for (int rank = 0; rank < c.cp; ++rank) {
      Floats out(s.tokens() * s.out_width()), lse(stats), want_out(out.size()), want_lse(stats);
      cpu::all_gather_attention_forward(want_out.data(), want_lse.data(), ranks.qkv[rank].data(), kv_full.data(), rank,
                                        cs);
      for (std::size_t r = 0; r < ctx::query_rows(s); ++r) {
        ctx::forward_row(r, out.data(), lse.data(), ranks.qkv[rank].data(), all, rank, false, s);
      }
      EXPECT_TRUE(close(out, want_out)) << "rank " << rank << " out";
      EXPECT_TRUE(close(lse, want_lse)) << "rank " << rank << " lse";

      Floats delta(stats), want_dq(out.size(), 0.0f), want_dkv_full(kv_full.size(), 0.0f);
      cpu::ring_attention_delta(delta.data(), ranks.dout[rank].data(), want_out.data(), cs);
      cpu::all_gather_attention_backward(want_dq.data(), want_dkv_full.data(), ranks.dout[rank].data(),
                                         ranks.qkv[rank].data(), kv_full.data(), want_lse.data(), delta.data(), rank,
                                         cs);
      Floats want_blocks(packed.size());
      cpu::cp_sequence_to_blocks(want_blocks.data(), want_dkv_full.data(), c.batch, c.seq, static_cast<int>(2 * kv),
                                 c.cp);
      // dqkv: dq in its query part (stride: the qkv row), zeros elsewhere; dkeys, dvalues OVERWRITTEN
      Floats dqkv(ranks.qkv[rank].size(), 0.0f), dkeys(keys.size(), -7.0f), dvalues(keys.size(), -7.0f);
      const ctx::Backward<float> x{ranks.dout[rank].data(), ranks.qkv[rank].data(), want_lse.data(), delta.data(),
                                   rank};
      for (std::size_t r = 0; r < ctx::query_rows(s); ++r) ctx::dq_row(r, dqkv.data(), row, x, all, s);
      const ctx::KeyBlocks<float> grads{dkeys.data(), dvalues.data(), kv, block, 0, c.cp};
      for (std::size_t r = 0; r < ctx::key_rows(c.cp, s); ++r) ctx::dkv_row(r, grads, x, all, false, s);
      Floats want_dqkv(dqkv.size(), 0.0f), want_dkeys(keys.size()), want_dvalues(keys.size());
      scatter(want_dqkv, want_dq, ctx::ColumnRange{row, 0, s.out_width()});
      for (std::size_t t = 0; t < c.cp * s.tokens(); ++t) {
        std::copy_n(want_blocks.begin() + t * 2 * kv, kv, want_dkeys.begin() + t * kv);
        std::copy_n(want_blocks.begin() + t * 2 * kv + kv, kv, want_dvalues.begin() + t * kv);
      }
      EXPECT_TRUE(close(dqkv, want_dqkv)) << "rank " << rank << " dqkv";
      EXPECT_TRUE(close(dkeys, want_dkeys)) << "rank " << rank << " dkeys";
      EXPECT_TRUE(close(dvalues, want_dvalues)) << "rank " << rank << " dvalues";
    }
  }
}

}  // namespace
}  // namespace twin::kernels::cuda

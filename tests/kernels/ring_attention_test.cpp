// Context-parallel attention (kernels/cpu/ring_attention.hpp) against the whole sequence's flash attention: the
// ring (p2p), all-gather and all-to-all (Ulysses) ways, forward and backward, their exchanges simulated here rank by
// rank in one process; and the causal load balance of 2 cp chunks.
#include "kernels/cpu/ring_attention.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <stdexcept>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/flash_attention.hpp"

namespace twin::kernels::cpu {
namespace {

using std::size_t;
using testing::all_close;
using testing::random_vector;

struct Whole {  // the reference: one rank, the whole sequence
  std::vector<float> qkv, out, lse, dout, dqkv;
};

size_t qkv_width(const ContextParallelShape& s) {
  return static_cast<size_t>(s.heads + 2 * s.kv_heads) * s.head_dim;
}
size_t out_width(const ContextParallelShape& s) {
  return static_cast<size_t>(s.heads) * s.head_dim;
}

Whole whole_sequence(const ContextParallelShape& s, unsigned seed) {
  Whole w;
  w.qkv = random_vector(static_cast<size_t>(s.batch) * s.seq * qkv_width(s), seed);
  w.dout = random_vector(static_cast<size_t>(s.batch) * s.seq * out_width(s), seed + 1);
  w.out.resize(w.dout.size());
  w.lse.resize(static_cast<size_t>(s.batch) * s.heads * s.seq);
  w.dqkv.resize(w.qkv.size());
  flash_attention_forward(w.out.data(), w.lse.data(), w.qkv.data(), s.batch, s.seq, s.heads, s.kv_heads, s.head_dim,
                          s.alibi_slopes);
  flash_attention_backward(w.dqkv.data(), w.dout.data(), w.qkv.data(), w.out.data(), w.lse.data(), s.batch, s.seq,
                           s.heads, s.kv_heads, s.head_dim, s.alibi_slopes);
  return w;
}

std::vector<float> take(const std::vector<float>& full, size_t width, int rank, const ContextParallelShape& s) {
  std::vector<float> local(static_cast<size_t>(s.batch) * s.local_len() * width);
  cp_take_local(local.data(), full.data(), s.batch, s.seq, static_cast<int>(width), s.cp, rank);
  return local;
}

// The whole sequence's lse (batch, H, seq) as rank `rank`'s (2, batch, H, C).
std::vector<float> local_lse(const std::vector<float>& lse, int rank, const ContextParallelShape& s) {
  const int chunk = s.chunk_len();
  std::vector<float> out;
  for (int part = 0; part < 2; ++part) {
    for (int bh = 0; bh < s.batch * s.heads; ++bh) {
      const float* row = lse.data() + static_cast<size_t>(bh) * s.seq + cp_chunk_of(rank, part, s.cp) * chunk;
      out.insert(out.end(), row, row + chunk);
    }
  }
  return out;
}

struct RankState {
  std::vector<float> qkv, kv, out, lse, dout, delta, dq, dkv;
};

// p2p: cp ring steps forward, then backward, every rank's kv block and its gradient going around the ring.
std::vector<RankState> run_ring(const Whole& w, const ContextParallelShape& s) {
  std::vector<RankState> ranks(s.cp);
  for (int r = 0; r < s.cp; ++r) {
    RankState& x = ranks[r];
    x.qkv = take(w.qkv, qkv_width(s), r, s);
    x.dout = take(w.dout, out_width(s), r, s);
    x.kv.resize(cp_kv_block_elements(s));
    cp_pack_kv(x.kv.data(), x.qkv.data(), s.batch, s.local_len(), s.heads, s.kv_heads, s.head_dim);
    x.out.resize(x.dout.size());
    x.lse.resize(2 * static_cast<size_t>(s.batch) * s.heads * s.chunk_len());
    x.delta.resize(x.lse.size());
    x.dq.assign(x.dout.size(), 0.0f);
    x.dkv.assign(x.kv.size(), 0.0f);
  }
  for (int step = 0; step < s.cp; ++step) {
    for (int r = 0; r < s.cp; ++r) {
      const int source = (r - step + s.cp) % s.cp;
      ring_attention_forward_step(ranks[r].out.data(), ranks[r].lse.data(), ranks[r].qkv.data(),
                                  ranks[source].kv.data(), r, source, s);
    }
  }
  for (RankState& x : ranks) ring_attention_delta(x.delta.data(), x.dout.data(), x.out.data(), s);
  for (int step = 0; step < s.cp; ++step) {
    for (int r = 0; r < s.cp; ++r) {
      const int source = (r - step + s.cp) % s.cp;
      RankState& x = ranks[r];
      ring_attention_backward_step(x.dq.data(), ranks[source].dkv.data(), x.dout.data(), x.qkv.data(),
                                   ranks[source].kv.data(), x.lse.data(), x.delta.data(), r, source, s);
    }
  }
  return ranks;
}

// A rank's gradient of its local qkv: dq in the query part, its own kv block's gradient in the rest.
std::vector<float> local_dqkv(const RankState& x, const ContextParallelShape& s) {
  std::vector<float> dqkv(x.qkv.size(), 0.0f);
  const size_t q = out_width(s), row = qkv_width(s);
  for (size_t t = 0; t < static_cast<size_t>(s.batch) * s.local_len(); ++t) {
    std::copy(x.dq.begin() + t * q, x.dq.begin() + (t + 1) * q, dqkv.begin() + t * row);
  }
  cp_add_kv_gradient(dqkv.data(), x.dkv.data(), s.batch, s.local_len(), s.heads, s.kv_heads, s.head_dim);
  return dqkv;
}

const ContextParallelShape kRingShapes[] = {
    {2, 40, 4, 2, 8, 2},    // grouped-query, cp 2: chunks of 10
    {1, 64, 2, 2, 16, 4},   // multi-head, cp 4: chunks of 8
    {1, 96, 4, 1, 8, 4},    // multi-query, chunks of 12
    {1, 160, 2, 1, 32, 2},  // chunks of 40 across a 64-key tile boundary
};

TEST(CpuRingAttention, CausalLoadBalanceOfTwoCpChunks) {
  // cp 4: rank 0 holds chunks 0 and 7, rank 1 chunks 1 and 6, rank 2 chunks 2 and 5, rank 3 chunks 3 and 4.
  const int expected[4][2] = {{0, 7}, {1, 6}, {2, 5}, {3, 4}};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(cp_chunk_of(r, 0, 4), expected[r][0]);
    EXPECT_EQ(cp_chunk_of(r, 1, 4), expected[r][1]);
  }
  // Every ring step costs every rank the same number of visible (query, key) pairs: C^2 + C (C + 1) on the first
  // (own) step, 2 C^2 on each later one.
  const int cp = 4, chunk = 5;
  for (int step = 0; step < cp; ++step) {
    for (int r = 0; r < cp; ++r) {
      const int source = (r - step + cp) % cp;
      long visible = 0;
      for (int qp = 0; qp < 2; ++qp) {
        for (int kp = 0; kp < 2; ++kp) {
          for (int i = 0; i < chunk; ++i) {
            for (int j = 0; j < chunk; ++j) {
              visible += cp_chunk_of(source, kp, cp) * chunk + j <= cp_chunk_of(r, qp, cp) * chunk + i;
            }
          }
        }
      }
      EXPECT_EQ(visible, step == 0 ? chunk * chunk + chunk * (chunk + 1) : 2 * chunk * chunk) << r << " " << step;
    }
  }
  // take / put are inverses.
  const std::vector<float> full = random_vector(2 * 16 * 3, 7);
  std::vector<float> back(full.size(), 0.0f);
  for (int r = 0; r < 2; ++r) {
    std::vector<float> local(full.size() / 2);
    cp_take_local(local.data(), full.data(), 2, 16, 3, 2, r);
    cp_put_local(back.data(), local.data(), 2, 16, 3, 2, r);
  }
  EXPECT_EQ(back, full);
}

TEST(CpuRingAttention, RingEqualsTheWholeSequenceForwardAndBackward) {
  for (const ContextParallelShape& s : kRingShapes) {
    const Whole w = whole_sequence(s, 11);
    const std::vector<RankState> ranks = run_ring(w, s);
    std::vector<float> dqkv(w.qkv.size(), 0.0f);
    for (int r = 0; r < s.cp; ++r) {
      EXPECT_TRUE(all_close(ranks[r].out, take(w.out, out_width(s), r, s), 1e-6, 1e-5)) << "rank " << r;
      EXPECT_TRUE(all_close(ranks[r].lse, local_lse(w.lse, r, s), 1e-6, 1e-5)) << "rank " << r;
      const std::vector<float> local = local_dqkv(ranks[r], s);
      cp_put_local(dqkv.data(), local.data(), s.batch, s.seq, static_cast<int>(qkv_width(s)), s.cp, r);
    }
    EXPECT_TRUE(all_close(dqkv, w.dqkv, 1e-5, 1e-4)) << "cp " << s.cp << " seq " << s.seq;
  }
}

TEST(CpuRingAttention, RingWithAlibiSeesAbsolutePositions) {
  const std::vector<float> slopes = alibi_slopes(4);
  ContextParallelShape s{1, 48, 4, 2, 8, 3};
  s.alibi_slopes = slopes.data();
  const Whole w = whole_sequence(s, 5);
  const std::vector<RankState> ranks = run_ring(w, s);
  for (int r = 0; r < s.cp; ++r) {
    EXPECT_TRUE(all_close(ranks[r].out, take(w.out, out_width(s), r, s), 1e-6, 1e-5)) << "rank " << r;
  }
}

TEST(CpuRingAttention, AllGatherEqualsTheWholeSequence) {
  for (const ContextParallelShape& s : kRingShapes) {
    const Whole w = whole_sequence(s, 3);
    const size_t kv_w = static_cast<size_t>(2 * s.kv_heads) * s.head_dim;
    std::vector<float> kv_full(static_cast<size_t>(s.batch) * s.seq * kv_w);
    cp_pack_kv(kv_full.data(), w.qkv.data(), s.batch, s.seq, s.heads, s.kv_heads, s.head_dim);  // the all-gather
    std::vector<float> dkv_full(kv_full.size(), 0.0f), dqkv(w.qkv.size(), 0.0f);
    for (int r = 0; r < s.cp; ++r) {
      const std::vector<float> qkv = take(w.qkv, qkv_width(s), r, s), dout = take(w.dout, out_width(s), r, s);
      std::vector<float> out(dout.size()), lse(2 * static_cast<size_t>(s.batch) * s.heads * s.chunk_len());
      std::vector<float> delta(lse.size()), dq(dout.size(), 0.0f);
      all_gather_attention_forward(out.data(), lse.data(), qkv.data(), kv_full.data(), r, s);
      EXPECT_TRUE(all_close(out, take(w.out, out_width(s), r, s), 1e-6, 1e-5));
      EXPECT_TRUE(all_close(lse, local_lse(w.lse, r, s), 1e-6, 1e-5));
      ring_attention_delta(delta.data(), dout.data(), out.data(), s);
      all_gather_attention_backward(dq.data(), dkv_full.data(), dout.data(), qkv.data(), kv_full.data(), lse.data(),
                                    delta.data(), r, s);  // summed over ranks: the reduce-scatter
      std::vector<float> local(qkv.size(), 0.0f);
      for (size_t t = 0; t < static_cast<size_t>(s.batch) * s.local_len(); ++t) {
        std::copy(dq.begin() + t * out_width(s), dq.begin() + (t + 1) * out_width(s), local.begin() + t * qkv_width(s));
      }
      cp_put_local(dqkv.data(), local.data(), s.batch, s.seq, static_cast<int>(qkv_width(s)), s.cp, r);
    }
    cp_add_kv_gradient(dqkv.data(), dkv_full.data(), s.batch, s.seq, s.heads, s.kv_heads, s.head_dim);
    EXPECT_TRUE(all_close(dqkv, w.dqkv, 1e-5, 1e-4)) << "cp " << s.cp;
  }
}

// A simulated all-to-all: block d of rank r's send buffer becomes block r of rank d's receive buffer.
std::vector<std::vector<float>> all_to_all(const std::vector<std::vector<float>>& send, int cp) {
  const size_t block = send[0].size() / cp;
  std::vector<std::vector<float>> recv(cp, std::vector<float>(send[0].size()));
  for (int r = 0; r < cp; ++r) {
    for (int d = 0; d < cp; ++d) {
      std::copy(send[r].begin() + d * block, send[r].begin() + (d + 1) * block, recv[d].begin() + r * block);
    }
  }
  return recv;
}

TEST(CpuRingAttention, UlyssesAllToAllEqualsTheWholeSequence) {
  const ContextParallelShape s{2, 32, 4, 2, 8, 2};
  const Whole w = whole_sequence(s, 9);
  const int cp = s.cp, hp = s.heads / cp, kvp = s.kv_heads / cp, D = s.head_dim;
  const std::vector<int> qkv_sections{s.heads, s.kv_heads, s.kv_heads}, out_sections{s.heads};
  const int group_qkv = (hp + 2 * kvp) * D, group_out = hp * D;
  std::vector<std::vector<float>> send(cp), out_send(cp), dout_send(cp), dqkv_send(cp);
  for (int r = 0; r < cp; ++r) {
    const std::vector<float> qkv = take(w.qkv, qkv_width(s), r, s), dout = take(w.dout, out_width(s), r, s);
    send[r].resize(qkv.size());
    ulysses_split_heads(send[r].data(), qkv.data(), s.batch, s.local_len(), qkv_sections, D, cp);
    dout_send[r].resize(dout.size());
    ulysses_split_heads(dout_send[r].data(), dout.data(), s.batch, s.local_len(), out_sections, D, cp);
  }
  const auto recv = all_to_all(send, cp), dout_recv = all_to_all(dout_send, cp);
  for (int r = 0; r < cp; ++r) {  // rank r: every token, head group r
    std::vector<float> qkv(static_cast<size_t>(s.batch) * s.seq * group_qkv);
    std::vector<float> dout(static_cast<size_t>(s.batch) * s.seq * group_out), out(dout.size()), dqkv(qkv.size());
    std::vector<float> lse(static_cast<size_t>(s.batch) * hp * s.seq);
    cp_blocks_to_sequence(qkv.data(), recv[r].data(), s.batch, s.seq, group_qkv, cp);
    cp_blocks_to_sequence(dout.data(), dout_recv[r].data(), s.batch, s.seq, group_out, cp);
    flash_attention_forward(out.data(), lse.data(), qkv.data(), s.batch, s.seq, hp, kvp, D);
    flash_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.batch, s.seq, hp, kvp, D);
    out_send[r].resize(out.size());
    cp_sequence_to_blocks(out_send[r].data(), out.data(), s.batch, s.seq, group_out, cp);
    dqkv_send[r].resize(dqkv.size());
    cp_sequence_to_blocks(dqkv_send[r].data(), dqkv.data(), s.batch, s.seq, group_qkv, cp);
  }
  const auto out_recv = all_to_all(out_send, cp), dqkv_recv = all_to_all(dqkv_send, cp);
  for (int r = 0; r < cp; ++r) {
    std::vector<float> out(static_cast<size_t>(s.batch) * s.local_len() * out_width(s));
    std::vector<float> dqkv(static_cast<size_t>(s.batch) * s.local_len() * qkv_width(s));
    ulysses_join_heads(out.data(), out_recv[r].data(), s.batch, s.local_len(), out_sections, D, cp);
    ulysses_join_heads(dqkv.data(), dqkv_recv[r].data(), s.batch, s.local_len(), qkv_sections, D, cp);
    EXPECT_TRUE(all_close(out, take(w.out, out_width(s), r, s), 1e-6, 1e-5)) << "rank " << r;
    EXPECT_TRUE(all_close(dqkv, take(w.dqkv, qkv_width(s), r, s), 1e-5, 1e-4)) << "rank " << r;
  }
}

TEST(CpuRingAttention, RejectsWhatCannotBeSplit) {
  std::vector<float> buffer(1024, 0.0f);
  const ContextParallelShape uneven{1, 30, 2, 2, 4, 4};  // 30 tokens are not 8 chunks
  EXPECT_THROW(ring_attention_forward_step(buffer.data(), buffer.data(), buffer.data(), buffer.data(), 0, 0, uneven),
               std::invalid_argument);
  const ContextParallelShape fine{1, 32, 2, 2, 4, 4};
  EXPECT_THROW(ring_attention_forward_step(buffer.data(), buffer.data(), buffer.data(), buffer.data(), 0, 4, fine),
               std::invalid_argument);  // no rank 4 of 4
  // Ulysses splits heads: 2 key/value heads cannot go to 4 ranks.
  EXPECT_THROW(ulysses_split_heads(buffer.data(), buffer.data(), 1, 4, {4, 2, 2}, 4, 4), std::invalid_argument);
}

}  // namespace
}  // namespace twin::kernels::cpu

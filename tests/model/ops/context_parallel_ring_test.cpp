// Context parallelism's ring (framework.cp_comm = "p2p") in the Program: per layer and micro-batch, cp attention
// blocks whose FLOPs follow the causal 2 cp chunk layout, the ring's messages with the closed form's bytes, every
// Send matched by a Recv of the same tag, and the blocks waiting for the message that brings their K/V.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include <fmt/format.h>

#include "model/ops/context_parallel.hpp"
#include "model/ops/context_parallel_ring.hpp"
#include "model/program/program.hpp"

namespace twin::model {
namespace {

// Llama 3 8B's shape (32 heads, 8 key/value heads, head dim 128) on 4 layers, TP 2, one sequence per micro-batch
// (at least 2 micro-batches per rank).
Scenario llama(std::int64_t cp, std::string_view recompute = "none", std::string_view comm = "p2p") {
  return parse_scenario(fmt::format(R"(
[model]
name = "llama-ring"
layers = 4
hidden = 4096
heads = 32
kv_heads = 8
ffn_hidden = 14336
seq_len = 8192
vocab = 128256
dtype = "bf16"
norm = "rmsnorm"
activation = "swiglu"
position_embedding = "rope"
linear_bias = false
[parallel]
tp = 2
cp = {}
micro_batch = 1
global_batch = 4
sequence_parallel = true
recompute = "{}"
[cluster]
nodes = {}
node = "dgx-h100"
[framework]
name = "megatron"
tied_embeddings = false
dropout = false
attention = "flash2"
cp_comm = "{}"
)",
                                    cp, recompute, std::max<std::int64_t>(1, cp / 4), comm),
                        "test");
}

CpAttention attention_of(const Scenario& s) {
  return CpAttention{s.parallel.micro_batch, s.model.seq_len, s.model.heads, s.model.key_value_heads(),
                     s.model.head_dim(),     s.parallel.tp,   s.parallel.cp, 2};
}

struct RingOps {
  std::vector<const Op*> sends, recvs, blocks;
};
RingOps ring_ops(const Program& program, int layer, int micro_batch, Phase phase) {
  RingOps ring;
  for (const Op& op : program.stage_ops[0]) {
    if (op.layer != layer || op.micro_batch != micro_batch || op.phase != phase || op.cp_ring_step < 0) continue;
    if (op.kind == OpKind::Send) ring.sends.push_back(&op);
    if (op.kind == OpKind::Recv) ring.recvs.push_back(&op);
    if (op.kind == OpKind::Compute && op.what == ComputeKind::AttentionCore) ring.blocks.push_back(&op);
  }
  return ring;
}

double bytes_of(const std::vector<const Op*>& ops) {
  double bytes = 0;
  for (const Op* op : ops) bytes += op->bytes;
  return bytes;
}

TEST(ContextParallelRing, MessagesCarryTheClosedFormsBytesAtBothGranularities) {
  for (std::int64_t cp : {2, 4, 16}) {
    const Scenario s = llama(cp);
    const CpTraffic forward = cp_forward_traffic(attention_of(s), CpComm::P2P);
    const CpTraffic backward = cp_backward_traffic(attention_of(s), CpComm::P2P);
    for (Granularity granularity : {Granularity::Op, Granularity::Layer}) {
      const Program program = build_program(s, granularity);
      for (int micro_batch : {0, 1}) {
        const RingOps f = ring_ops(program, 2, micro_batch, Phase::Forward);
        const RingOps b = ring_ops(program, 2, micro_batch, Phase::Backward);
        EXPECT_EQ(static_cast<int>(f.sends.size()), forward.point_to_point) << "cp " << cp;
        EXPECT_EQ(static_cast<int>(b.sends.size()), backward.point_to_point) << "cp " << cp;
        EXPECT_DOUBLE_EQ(bytes_of(f.sends), forward.point_to_point_bytes) << "cp " << cp;
        EXPECT_DOUBLE_EQ(bytes_of(b.sends), backward.point_to_point_bytes) << "cp " << cp;
        EXPECT_DOUBLE_EQ(bytes_of(f.recvs), bytes_of(f.sends));
        EXPECT_DOUBLE_EQ(bytes_of(b.recvs), bytes_of(b.sends));
        EXPECT_EQ(static_cast<std::int64_t>(f.blocks.size()), cp);
        EXPECT_EQ(static_cast<std::int64_t>(b.blocks.size()), cp + 1);  // the owner's dK/dV add last
      }
    }
    // One K/V block: 8192 / cp tokens x 8 / 2 key/value heads x 128 x 2 bytes, keys and values.
    EXPECT_DOUBLE_EQ(forward.point_to_point_bytes,
                     static_cast<double>(cp - 1) * 2 * 8192.0 / static_cast<double>(cp) * 4 * 128 * 2);
    EXPECT_DOUBLE_EQ(backward.point_to_point_bytes, 2 * forward.point_to_point_bytes);
  }
}

TEST(ContextParallelRing, BlocksSplitTheCausalPairsAsTheAllGatherCoreDoes) {
  for (std::int64_t cp : {2, 4, 8}) {
    const Program ring = build_program(llama(cp), Granularity::Op);
    const Program gather = build_program(llama(cp, "none", "all_gather"), Granularity::Op);
    for (Phase phase : {Phase::Forward, Phase::Backward}) {
      double whole = 0;
      for (const Op& op : gather.stage_ops[0]) {
        if (op.layer == 1 && op.micro_batch == 0 && op.phase == phase && op.what == ComputeKind::AttentionCore) {
          whole += op.flops;
        }
      }
      const RingOps r = ring_ops(ring, 1, 0, phase);
      double sum = 0;
      for (const Op* block : r.blocks) {
        if (block->cp_ring_step >= cp) continue;  // the dK/dV add: no FLOPs
        sum += block->flops;
        EXPECT_DOUBLE_EQ(block->flops / whole,
                         cp_ring_step_pairs(8192, cp, block->cp_ring_step) / cp_causal_pairs_per_rank(8192, cp));
        EXPECT_EQ(block->gemm.m, 8192 / cp);
        EXPECT_EQ(block->gemm.n, 8192 / cp);
      }
      EXPECT_NEAR(sum, whole, 1e-9 * whole) << "cp " << cp;
    }
    // A later step computes 2 c^2 pairs, the first c (c + 1) + c^2: together the rank's share of the causal pairs.
    double pairs = 0;
    for (int step = 0; step < cp; ++step) pairs += cp_ring_step_pairs(8192, cp, step);
    EXPECT_DOUBLE_EQ(pairs, cp_causal_pairs_per_rank(8192, cp));
  }
}

// The blocks and messages as Transformer Engine orders them: block i (i > 0) and message i wait for message i - 1's
// Recv (the K/V they use); backward, a message carrying dK/dV waits for the block that computed them; every Send
// has one Recv with the same tag, each tag once per layer, micro-batch and phase.
TEST(ContextParallelRing, EachBlockWaitsForTheMessageThatBringsItsKeysAndValues) {
  const Program program = build_program(llama(4, "selective"), Granularity::Op);
  const std::vector<Op>& ops = program.stage_ops[0];
  std::set<std::uint64_t> sent, received;
  int checked = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.cp_ring_step < 0) continue;
    if (is_cp_ring_message(op)) {
      const std::uint64_t key = cp_ring_tag_key(cp_ring_tag(op)) | (std::uint64_t{1} << 40) * op.layer |
                                (std::uint64_t{1} << 50) * op.micro_batch;
      EXPECT_LT(cp_ring_tag_key(cp_ring_tag(op)), kP2PTagKeys);
      EXPECT_TRUE((op.kind == OpKind::Send ? sent : received).insert(key).second) << i;
      EXPECT_EQ(cp_ring_peer(op, 0, 4), op.kind == OpKind::Send ? 1 : 3);
    }
    const bool waits = (op.kind == OpKind::Compute && op.cp_ring_step > 0 && op.cp_ring_step < 4) ||
                       (op.kind == OpKind::Send && op.cp_ring_step > 0);
    if (!waits) continue;
    bool found = false;
    for (std::int32_t dep : op.deps) {
      const Op& before = ops[static_cast<std::size_t>(dep)];
      found |= before.kind == OpKind::Recv && before.cp_ring_step == op.cp_ring_step - 1 && before.layer == op.layer;
    }
    EXPECT_TRUE(found) << i << " " << to_string(op.phase) << " step " << op.cp_ring_step;
    ++checked;
  }
  EXPECT_EQ(sent, received);
  // 4 layers x 4 micro-batches x (forward 3 blocks and 2 sends, recompute as much, backward 3 blocks, 4 sends
  // with a message before them: 1 .. 4 less the one whose message 0 is the first)
  EXPECT_EQ(checked, 4 * 4 * ((3 + 2) + (3 + 2) + (3 + 4)));
  bool recomputed = false;
  for (const Op& op : ops) recomputed |= op.phase == Phase::Recompute && is_cp_ring_message(op);
  EXPECT_TRUE(recomputed);  // selective recompute runs the ring again
}

TEST(ContextParallelRing, BackwardMessagesCarryKeysValuesThenGradients) {
  EXPECT_EQ(cp_ring_backward_messages(2), 2);  // K/V; dK/dV
  EXPECT_EQ(cp_ring_backward_messages(4), 5);  // K/V, K/V, both, dK/dV, dK/dV
  int grads = 0, blocks = 0;
  for (int step = 0; step <= 16; ++step) {
    grads += cp_ring_backward_message(step, 16).key_value_grads ? 1 : 0;
    blocks += cp_ring_backward_message(step, 16).keys_values ? 1 : 0;
  }
  EXPECT_EQ(grads, 15);  // each block's dK/dV: cp - 1 hops back to its owner
  EXPECT_EQ(blocks, 15);
  EXPECT_TRUE(cp_ring_backward_message(1, 2).empty());
}

}  // namespace
}  // namespace twin::model

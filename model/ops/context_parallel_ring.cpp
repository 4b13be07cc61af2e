// The ring's ops (model/ops/context_parallel_ring.hpp says what they are and why).
#include "model/ops/context_parallel_ring.hpp"

#include <memory>
#include <stdexcept>

#include <fmt/format.h>

#include "model/ops/compute_ops.hpp"
#include "model/ops/context_parallel.hpp"

namespace twin::model {

CpRingTag cp_ring_tag(const Op& op) {
  return CpRingTag{op.layer, op.micro_batch, op.phase, op.cp_ring_step};
}

std::uint64_t cp_ring_tag_key(const CpRingTag& tag) {
  if (tag.step < 0 || tag.step > kCpRingMaxSize || tag.layer < 0 || tag.micro_batch < 0) {
    throw std::out_of_range(fmt::format("ring message tag out of range: layer {}, micro-batch {}, message {} (0 to {})",
                                        tag.layer, tag.micro_batch, tag.step, kCpRingMaxSize));
  }
  const auto phase = static_cast<std::uint64_t>(tag.phase) & 3u;
  const auto layer = static_cast<std::uint64_t>(tag.layer) & 511u;
  const auto micro_batch = static_cast<std::uint64_t>(tag.micro_batch) & 4095u;
  return static_cast<std::uint64_t>(tag.step) | phase << 7 | layer << 9 | micro_batch << 18;  // < 2^30
}

bool is_cp_ring_message(const Op& op) {
  return (op.kind == OpKind::Send || op.kind == OpKind::Recv) && op.group == Group::Context;
}

int cp_ring_peer(const Op& op, int cp_rank, int cp) {
  return (cp_rank + (op.kind == OpKind::Send ? 1 : cp - 1)) % cp;
}

CpRingMessage cp_ring_backward_message(int step, int cp) {
  return CpRingMessage{step <= cp - 2, step >= 2 && step <= cp};
}

int cp_ring_backward_messages(int cp) {
  int messages = 0;
  for (int step = 0; step <= cp; ++step) messages += cp_ring_backward_message(step, cp).empty() ? 0 : 1;
  return messages;
}

double cp_ring_step_pairs(std::int64_t seq, std::int64_t cp, int step) {
  const double c = static_cast<double>(seq) / (2.0 * static_cast<double>(cp));
  return step == 0 ? c * (c + 1) + c * c : 2 * c * c;
}

namespace {

// One rank's keys and values: 2 x micro_batch x seq / cp tokens x kv_heads / tp heads x head_dim (CpAttention).
double key_value_block_bytes(const Shapes& x) {
  return 2 * x.e * x.tokens * x.kv_heads_local * x.head_dim;
}

Op ring_message(OpKind kind, Phase phase, int step, double bytes, Payload payload) {
  Op op;
  op.kind = kind;
  op.stream = Stream::Pipeline;
  op.group = Group::Context;
  op.what = ComputeKind::AttentionCore;
  op.phase = phase;
  op.payload = payload;
  op.cp_ring_step = step;
  op.bytes = bytes;
  return op;
}

// Step `step`'s block of the whole attention core: its share of the causal pairs' FLOPs; its kernels on
// [seq / cp queries] x [seq / cp keys], the whole core's over cp (the causal kernel rate times the half of a block's
// pairs a causal kernel computes, 2 c^2: what every step but the first computes unmasked), launched once per step.
Op ring_block(const Op& whole, const Shapes& x, int step) {
  const auto seq = static_cast<std::int64_t>(x.seq), cp = static_cast<std::int64_t>(x.cp);
  Op op = whole;
  op.cp_ring_step = step;
  op.flops = whole.flops * cp_ring_step_pairs(seq, cp, step) / cp_causal_pairs_per_rank(seq, cp);
  op.gemm.n = static_cast<std::int64_t>(x.seq_local);
  auto kernels = std::make_shared<KernelBreakdown>(*whole.breakdown);
  for (Kernel& kernel : kernels->kernels) kernel.bytes /= x.cp;
  op.bytes = whole.bytes / x.cp;
  op.breakdown = std::move(kernels);
  return op;
}

int push(std::vector<Op>& ops, Op op) {
  ops.push_back(std::move(op));
  return static_cast<int>(ops.size()) - 1;
}

}  // namespace

void append_ring_attention_forward(std::vector<Op>& ops, const Shapes& x, Phase phase) {
  const int cp = static_cast<int>(x.cp);
  const Op whole = attention_core(x, phase);
  const int producer = static_cast<int>(ops.size()) - 1;  // the QKV projection, or the op before the layer's ops
  int received = -1;                                      // the Recv of the block the next step computes on
  for (int step = 0; step < cp; ++step) {
    const int block_source = received;
    if (step < cp - 1) {
      Op send = ring_message(OpKind::Send, phase, step, key_value_block_bytes(x), Payload::ContextKeys);
      send.deps.push_back(step == 0 ? producer : block_source);
      push(ops, std::move(send));
      received = push(ops, ring_message(OpKind::Recv, phase, step, key_value_block_bytes(x), Payload::ContextKeys));
    }
    Op block = ring_block(whole, x, step);
    if (step > 0) block.deps.push_back(block_source);
    push(ops, std::move(block));
  }
}

void append_ring_attention_backward(std::vector<Op>& ops, const Shapes& x) {
  const int cp = static_cast<int>(x.cp);
  const Op whole = attention_core(x, Phase::Backward);
  const double block_bytes = key_value_block_bytes(x);
  int previous_recv = -1, previous_block = static_cast<int>(ops.size()) - 1;  // the projection's input gradient
  for (int step = 0; step <= cp; ++step) {
    const CpRingMessage message = cp_ring_backward_message(step, cp);
    const int block_source = previous_recv;  // message step - 1 brought this step's K/V (and accumulator)
    if (!message.empty()) {
      const double bytes = (message.keys_values ? block_bytes : 0) + (message.key_value_grads ? block_bytes : 0);
      const Payload payload = message.keys_values ? Payload::ContextKeys : Payload::ContextKeyGrads;
      Op send = ring_message(OpKind::Send, Phase::Backward, step, bytes, payload);
      if (step == 0 || previous_recv >= 0) send.deps.push_back(step == 0 ? previous_block : previous_recv);
      if (message.key_value_grads) send.deps.push_back(previous_block);
      push(ops, std::move(send));
      previous_recv = push(ops, ring_message(OpKind::Recv, Phase::Backward, step, bytes, payload));
    }
    if (step == cp) break;
    Op block = ring_block(whole, x, step);
    if (step > 0) block.deps.push_back(block_source);
    previous_block = push(ops, std::move(block));
  }
  // The owner adds the accumulated dK/dV of its block to its own share: read both, write the sum.
  Op add = elementwise(ComputeKind::AttentionCore, Phase::Backward, 3 * block_bytes, 1);
  add.cp_ring_step = cp;
  add.deps.push_back(previous_recv);
  push(ops, std::move(add));
}

}  // namespace twin::model

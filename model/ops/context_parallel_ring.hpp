// Context parallelism's ring (framework.cp_comm = "p2p", Transformer Engine's AttnFuncWithCPAndKVP2P; model/
// context_parallel.hpp): per layer and micro-batch, the attention core becomes cp blocks, step i attending the rank's
// queries to the keys/values of CP rank - i, while the next block travels one hop (Send to CP rank + 1, Recv from
// CP rank - 1, on the Pipeline stream: unordered, beside the compute stream).
//
//   forward, recompute   message i (0 .. cp-2): the K/V block held at step i, sent at its start; block i waits for
//                        message i - 1.
//   backward             message i (0 .. cp): the K/V block held at step i (i <= cp-2) and the dK/dV accumulator of
//                        the block held at step i - 1 (i >= 2), sent at step i's start; the last (i = cp) after block
//                        cp-1. A block's accumulator starts at its owner's successor (step 1), gathers each rank's
//                        share as it travels one step behind the K/V, and reaches its owner after cp - 1 hops, where
//                        the owner adds it to its own (step 0) share: the "ring dK/dV add" compute op.
//
// Each message is one Send/Recv pair over Group::Context whose Op::cp_ring_step is its index; the attention blocks
// are AttentionCore compute ops whose Op::cp_ring_step is their step. Op::deps inside a layer's list are indices into
// that list (the stage builder offsets them); -1 names the op just before the layer's first one.
#pragma once

#include <cstdint>
#include <vector>

#include "model/ops/kernel_traffic.hpp"
#include "model/ops/op.hpp"

namespace twin::model {

// A ring message's matching key. Between two CP neighbours messages arrive in the order they were sent (MPI's
// non-overtaking rule; the threads communicator's per-tag queues), so the key only has to tell apart messages that can
// be in flight at once: the layer (mod 2^9), micro-batch (mod 2^12), phase and message index (< 2^7). Under
// kP2PTagKeys, so that it fits an MPI tag.
struct CpRingTag {
  int layer = 0;
  int micro_batch = 0;
  Phase phase = Phase::Forward;
  int step = 0;
};
inline constexpr int kCpRingMaxSize = 127;  // parallel.cp the ring's message index holds (steps 0 .. cp)
CpRingTag cp_ring_tag(const Op& op);
std::uint64_t cp_ring_tag_key(const CpRingTag& tag);

// A Send or Recv of the ring (over Group::Context) rather than of the pipeline.
bool is_cp_ring_message(const Op& op);
// The CP rank a ring message goes to (Send: cp_rank + 1) or comes from (Recv: cp_rank - 1), around the ring.
int cp_ring_peer(const Op& op, int cp_rank, int cp);

// What backward message `step` of a ring of `cp` carries: a K/V block, an accumulated dK/dV block, or both.
struct CpRingMessage {
  bool keys_values = false;
  bool key_value_grads = false;
  bool empty() const { return !keys_values && !key_value_grads; }
};
CpRingMessage cp_ring_backward_message(int step, int cp);
// Messages of a layer's backward ring: cp (cp = 2) or cp + 1.
int cp_ring_backward_messages(int cp);

// Query-key pairs of ring step `step` under the causal mask with the 2 cp chunk layout (every rank the same): the own
// block c (c + 1) + c^2, every other 2 c^2 (the chunk pairs the mask hides wholly are skipped), c = seq / (2 cp).
// Their sum over the cp steps is cp_causal_pairs_per_rank.
double cp_ring_step_pairs(std::int64_t seq, std::int64_t cp, int step);

// The attention core of one layer as the ring runs it, appended to ops: forward or recompute blocks with their
// messages, or the backward's.
void append_ring_attention_forward(std::vector<Op>& ops, const Shapes& x, Phase phase);
void append_ring_attention_backward(std::vector<Op>& ops, const Shapes& x);

}  // namespace twin::model

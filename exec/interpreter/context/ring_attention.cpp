// Context parallelism, the p2p ring (framework.cp_comm = "p2p"; model/ops/context_parallel_ring.hpp has the messages
// and why): each CP rank attends its queries to one K/V block per step, the next block arriving from CP rank - 1
// meanwhile, and sends the block it holds on to CP rank + 1.
//
//   forward, recompute   Send i: the block held at step i (its own at step 0); Recv i: the next one; block i: the
//                        step's attention merged into the output by log-sum-exp (the first overwrites it)
//   backward             the K/V go around again; block 0 keeps the own block's dK/dV, block 1 starts the
//                        accumulator of the block it holds, a later block adds its share to the accumulator that came
//                        with its K/V; the accumulator travels on with the next K/V, and the last message brings each
//                        block's to its owner, which adds it to its own (return_grads)
#include <fmt/format.h>

#include "exec/core/check.hpp"
#include "exec/interpreter/context/ring_attention.hpp"
#include "model/ops/context_parallel_ring.hpp"

namespace twin::exec {

using model::Op;

void RingAttention::exchange(const Op& op) {
  Ring& r = layers_[StashKey::of(op)];
  if (op.kind == model::OpKind::Send) return send(op, r);
  TWIN_EXEC_CHECK(op.kind == model::OpKind::Recv, "{}: not a message of the ring", ctx_.label());
  recv(op, r);
}

void RingAttention::release(int micro_batch, int chunk) {
  std::erase_if(
      layers_, [&](const auto& entry) { return entry.first.micro_batch == micro_batch && entry.first.chunk == chunk; });
}

int RingAttention::peer_rank(const Op& op) const {
  const CommGroup& ring = ctx_.group(model::Group::Context);
  TWIN_EXEC_CHECK(static_cast<int>(ring.members.size()) == ctx_.dims.cp && ring.members[ctx_.dims.cp_rank] == ctx_.rank,
                  "rank {}: the Context group does not list the CP ranks in order", ctx_.rank);
  return ring.members[static_cast<std::size_t>(model::cp_ring_peer(op, ctx_.dims.cp_rank, ctx_.dims.cp))];
}

void RingAttention::send(const Op& op, Ring& r) {
  LayerStash& s = ctx_.stash(op);
  const std::size_t block = numel(ctx_.dims.tokens, 2 * ctx_.dims.kv_heads_local * ctx_.dims.head_dim);
  model::CpRingMessage parts{true, false};
  if (op.phase == model::Phase::Backward) parts = model::cp_ring_backward_message(op.cp_ring_step, ctx_.dims.cp);
  if (parts.keys_values && r.kv.empty()) {  // step 0: this rank's own block
    TWIN_EXEC_CHECK(op.cp_ring_step == 0 && !s.qkv.empty(), "rank {}: {}: no K/V block to send", ctx_.rank,
                    ctx_.label());
    r.kv = ctx_.backend.allocate(block, ctx_.backend.activation_dtype());
    ctx_.backend.context_kernels().context_ring_pack_kv(r.kv, s.qkv, context_shape(ctx_.dims));
  }
  const Tensor& acc = r.acc;
  TWIN_EXEC_CHECK(!parts.key_value_grads || !acc.empty(), "rank {}: {}: no dK/dV to send", ctx_.rank, ctx_.label());
  Tensor message = parts.keys_values ? r.kv : acc;
  if (parts.key_value_grads && parts.keys_values) {
    message = ctx_.backend.allocate(2 * block, r.kv.dtype);
    ctx_.backend.copy(message.slice(0, block), r.kv);
    ctx_.backend.copy(message.slice(block, block), acc);
  }
  ctx_.comm.send(peer_rank(op), model::cp_ring_tag_key(model::cp_ring_tag(op)), message.data, message.bytes());
}

void RingAttention::recv(const Op& op, Ring& r) {
  const std::size_t block = numel(ctx_.dims.tokens, 2 * ctx_.dims.kv_heads_local * ctx_.dims.head_dim);
  model::CpRingMessage parts{true, false};
  if (op.phase == model::Phase::Backward) parts = model::cp_ring_backward_message(op.cp_ring_step, ctx_.dims.cp);
  const std::size_t count = (parts.keys_values ? block : 0) + (parts.key_value_grads ? block : 0);
  Tensor message = ctx_.backend.allocate(count, ctx_.backend.activation_dtype());
  ctx_.comm.recv(peer_rank(op), model::cp_ring_tag_key(model::cp_ring_tag(op)), message.data, message.bytes(),
                 ctx_.label());
  if (parts.keys_values) r.kv_next = message.slice(0, block);
  if (parts.key_value_grads) r.acc_in = message.slice(parts.keys_values ? block : 0, block);
}

// Step i: the queries against CP rank - i's block; then the block that arrived meanwhile is the next step's.
void RingAttention::forward(const Op& op) {
  LayerStash& s = ctx_.stash(op);
  Ring& r = layers_[StashKey::of(op)];
  const int step = op.cp_ring_step, source = (ctx_.dims.cp_rank - step + ctx_.dims.cp) % ctx_.dims.cp;
  TWIN_EXEC_CHECK(!r.kv.empty(), "rank {}: {}: the K/V block of step {} did not arrive", ctx_.rank, ctx_.label(), step);
  if (step == 0) {
    s.attn = ctx_.backend.allocate(numel(ctx_.dims.tokens, ctx_.dims.heads_local * ctx_.dims.head_dim),
                                   ctx_.backend.activation_dtype());
    s.attn_lse = ctx_.backend.allocate(numel(ctx_.dims.batch * ctx_.dims.heads_local, ctx_.dims.seq), DType::F32);
  }
  ctx_.backend.context_kernels().context_ring_forward_step(s.attn, s.attn_lse, s.qkv, r.kv, source,
                                                           context_shape(ctx_.dims));
  r.kv = r.kv_next;  // nothing after the last step: no other rank's keys are kept
  r.kv_next = Tensor{};
}

void RingAttention::backward(const Op& op) {
  Ring& r = layers_[StashKey::of(op)];
  if (op.cp_ring_step == ctx_.dims.cp) return return_grads(op, r);
  BackwardWork& w = ctx_.chunk(op).work;
  LayerStash& s = ctx_.stash(op);
  const int step = op.cp_ring_step, source = (ctx_.dims.cp_rank - step + ctx_.dims.cp) % ctx_.dims.cp;
  TWIN_EXEC_CHECK(!r.kv.empty() && !w.d_attn.empty(), "rank {}: {}: the K/V block of step {} did not arrive", ctx_.rank,
                  ctx_.label(), step);
  const std::size_t block = r.kv.numel;
  if (step == 0) {
    r.dq = ctx_.backend.allocate(w.d_attn.numel, ctx_.backend.activation_dtype());
    ctx_.backend.fill(r.dq, 0.0f);
    r.delta = ctx_.backend.allocate(s.attn_lse.numel, DType::F32);
    ctx_.backend.context_kernels().context_ring_delta(r.delta, w.d_attn, s.attn, context_shape(ctx_.dims));
  }
  Tensor share = ctx_.backend.allocate(block, r.kv.dtype);
  ctx_.backend.fill(share, 0.0f);
  ctx_.backend.context_kernels().context_ring_backward_step(r.dq, share, w.d_attn, s.qkv, r.kv, s.attn_lse, r.delta,
                                                            source, context_shape(ctx_.dims));
  if (step == 0) {
    r.own_dkv = share;  // stays here until the others' shares come back
  } else if (step == 1) {
    r.acc = share;  // the block's accumulator starts with this rank's share
  } else {
    TWIN_EXEC_CHECK(!r.acc_in.empty(), "rank {}: {}: no dK/dV came with the K/V block", ctx_.rank, ctx_.label());
    ctx_.backend.accumulate(r.acc_in, share);
    r.acc = r.acc_in;
    r.acc_in = Tensor{};
  }
  r.kv = r.kv_next;
  r.kv_next = Tensor{};
}

void RingAttention::return_grads(const Op& op, Ring& r) {
  BackwardWork& w = ctx_.chunk(op).work;
  LayerStash& s = ctx_.stash(op);
  TWIN_EXEC_CHECK(!r.acc_in.empty() && !r.own_dkv.empty(), "rank {}: {}: this rank's dK/dV did not return", ctx_.rank,
                  ctx_.label());
  ctx_.backend.accumulate(r.own_dkv, r.acc_in);
  w.d_qkv = ctx_.backend.allocate(s.qkv.numel, ctx_.backend.activation_dtype());
  ctx_.backend.context_kernels().context_ring_put_grads(w.d_qkv, r.dq, r.own_dkv, context_shape(ctx_.dims));
  r.dq = r.own_dkv = r.acc = r.acc_in = r.delta = Tensor{};
  w.d_attn = Tensor{};
  r.kv = r.kv_next = Tensor{};
}

}  // namespace twin::exec

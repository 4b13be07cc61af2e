// Context parallelism, the p2p ring (framework.cp_comm = "p2p"; model/ops/context_parallel_ring.hpp has the messages
// and why): each CP rank attends its queries to one K/V block per step, the next block arriving from CP rank - 1
// meanwhile, and sends the block it holds on to CP rank + 1.
//
//   forward, recompute   Send i: the block held at step i (its own at step 0); Recv i: the next one; block i: the
//                        step's attention merged into the output by log-sum-exp (the first overwrites it)
//   backward             the K/V go around again; block 0 keeps the own block's dK/dV, block 1 starts the
//                        accumulator of the block it holds, a later block adds its share to the accumulator that came
//                        with its K/V; the accumulator travels on with the next K/V, and the last message brings each
//                        block's to its owner, which adds it to its own (ring_return_grads)
#include <fmt/format.h>

#include "exec/core/check.hpp"
#include "exec/interpreter/interpreter.hpp"
#include "model/ops/context_parallel_ring.hpp"

namespace twin::exec {

using model::Op;

int Interpreter::ring_peer_rank(const Op& op) const {
  const CommGroup& ring = group(model::Group::Context);
  TWIN_EXEC_CHECK(static_cast<int>(ring.members.size()) == dims_.cp && ring.members[dims_.cp_rank] == rank_,
                  "rank {}: the Context group does not list the CP ranks in order", rank_);
  return ring.members[static_cast<std::size_t>(model::cp_ring_peer(op, dims_.cp_rank, dims_.cp))];
}

void Interpreter::ring_send(const Op& op) {
  LayerStash& s = stash(op);
  const std::size_t block = numel(dims_.tokens, 2 * dims_.kv_heads_local * dims_.head_dim);
  model::CpRingMessage parts{true, false};
  if (op.phase == model::Phase::Backward) parts = model::cp_ring_backward_message(op.cp_ring_step, dims_.cp);
  if (parts.keys_values && s.ring_kv.empty()) {  // step 0: this rank's own block
    TWIN_EXEC_CHECK(op.cp_ring_step == 0 && !s.qkv.empty(), "rank {}: {}: no K/V block to send", rank_,
                    labels_[current_op_]);
    s.ring_kv = backend_.allocate(block, backend_.activation_dtype());
    backend_.context_kernels().context_ring_pack_kv(s.ring_kv, s.qkv, context_shape());
  }
  const Tensor& acc = chunk(op).work.ring_acc;
  TWIN_EXEC_CHECK(!parts.key_value_grads || !acc.empty(), "rank {}: {}: no dK/dV to send", rank_, labels_[current_op_]);
  Tensor message = parts.keys_values ? s.ring_kv : acc;
  if (parts.key_value_grads && parts.keys_values) {
    message = backend_.allocate(2 * block, s.ring_kv.dtype);
    backend_.copy(message.slice(0, block), s.ring_kv);
    backend_.copy(message.slice(block, block), acc);
  }
  comm_.send(ring_peer_rank(op), model::cp_ring_tag_key(model::cp_ring_tag(op)), message.data, message.bytes());
}

void Interpreter::ring_recv(const Op& op) {
  LayerStash& s = stash(op);
  const std::size_t block = numel(dims_.tokens, 2 * dims_.kv_heads_local * dims_.head_dim);
  model::CpRingMessage parts{true, false};
  if (op.phase == model::Phase::Backward) parts = model::cp_ring_backward_message(op.cp_ring_step, dims_.cp);
  const std::size_t count = (parts.keys_values ? block : 0) + (parts.key_value_grads ? block : 0);
  Tensor message = backend_.allocate(count, backend_.activation_dtype());
  comm_.recv(ring_peer_rank(op), model::cp_ring_tag_key(model::cp_ring_tag(op)), message.data, message.bytes(),
             labels_[current_op_]);
  if (parts.keys_values) s.ring_kv_next = message.slice(0, block);
  if (parts.key_value_grads) chunk(op).work.ring_acc_in = message.slice(parts.keys_values ? block : 0, block);
}

// Step i: the queries against CP rank - i's block; then the block that arrived meanwhile is the next step's.
void Interpreter::ring_block_forward(const Op& op) {
  LayerStash& s = stash(op);
  const int step = op.cp_ring_step, source = (dims_.cp_rank - step + dims_.cp) % dims_.cp;
  TWIN_EXEC_CHECK(!s.ring_kv.empty(), "rank {}: {}: the K/V block of step {} did not arrive", rank_,
                  labels_[current_op_], step);
  if (step == 0) {
    s.attn = backend_.allocate(numel(dims_.tokens, dims_.heads_local * dims_.head_dim), backend_.activation_dtype());
    s.attn_lse = backend_.allocate(numel(dims_.batch * dims_.heads_local, dims_.seq), DType::F32);
  }
  backend_.context_kernels().context_ring_forward_step(s.attn, s.attn_lse, s.qkv, s.ring_kv, source, context_shape());
  s.ring_kv = s.ring_kv_next;  // nothing after the last step: no other rank's keys are kept
  s.ring_kv_next = Tensor{};
}

void Interpreter::ring_block_backward(const Op& op) {
  if (op.cp_ring_step == dims_.cp) return ring_return_grads(op);
  BackwardWork& w = chunk(op).work;
  LayerStash& s = stash(op);
  const int step = op.cp_ring_step, source = (dims_.cp_rank - step + dims_.cp) % dims_.cp;
  TWIN_EXEC_CHECK(!s.ring_kv.empty() && !w.d_attn.empty(), "rank {}: {}: the K/V block of step {} did not arrive",
                  rank_, labels_[current_op_], step);
  const std::size_t block = s.ring_kv.numel;
  if (step == 0) {
    w.ring_dq = backend_.allocate(w.d_attn.numel, backend_.activation_dtype());
    backend_.fill(w.ring_dq, 0.0f);
    w.ring_delta = backend_.allocate(s.attn_lse.numel, DType::F32);
    backend_.context_kernels().context_ring_delta(w.ring_delta, w.d_attn, s.attn, context_shape());
  }
  Tensor share = backend_.allocate(block, s.ring_kv.dtype);
  backend_.fill(share, 0.0f);
  backend_.context_kernels().context_ring_backward_step(w.ring_dq, share, w.d_attn, s.qkv, s.ring_kv, s.attn_lse,
                                                        w.ring_delta, source, context_shape());
  if (step == 0) {
    w.ring_own_dkv = share;  // stays here until the others' shares come back
  } else if (step == 1) {
    w.ring_acc = share;  // the block's accumulator starts with this rank's share
  } else {
    TWIN_EXEC_CHECK(!w.ring_acc_in.empty(), "rank {}: {}: no dK/dV came with the K/V block", rank_,
                    labels_[current_op_]);
    backend_.accumulate(w.ring_acc_in, share);
    w.ring_acc = w.ring_acc_in;
    w.ring_acc_in = Tensor{};
  }
  s.ring_kv = s.ring_kv_next;
  s.ring_kv_next = Tensor{};
}

void Interpreter::ring_return_grads(const Op& op) {
  BackwardWork& w = chunk(op).work;
  LayerStash& s = stash(op);
  TWIN_EXEC_CHECK(!w.ring_acc_in.empty() && !w.ring_own_dkv.empty(), "rank {}: {}: this rank's dK/dV did not return",
                  rank_, labels_[current_op_]);
  backend_.accumulate(w.ring_own_dkv, w.ring_acc_in);
  w.d_qkv = backend_.allocate(s.qkv.numel, backend_.activation_dtype());
  backend_.context_kernels().context_ring_put_grads(w.d_qkv, w.ring_dq, w.ring_own_dkv, context_shape());
  w.ring_dq = w.ring_own_dkv = w.ring_acc = w.ring_acc_in = w.ring_delta = Tensor{};
  w.d_attn = Tensor{};
  s.ring_kv = s.ring_kv_next = Tensor{};
}

}  // namespace twin::exec

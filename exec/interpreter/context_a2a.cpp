// Context parallelism, the a2a way (framework.cp_comm = "a2a", DeepSpeed-Ulysses; model/ops/context_parallel_a2a.cpp):
// each CP rank holds two chunks of every sequence (model::cp_sequence_chunk) and all of its TP rank's heads; around
// the attention core the Program's all-to-alls over the Context group trade that for the whole sequence of 1 / cp of
// the heads (head group d to CP rank d), and back:
//
//   forward, recompute   A2A q, k, v: each rank's block lands in its tokens' places of a packed (B, seq, (H/cp +
//                        2 KV/cp) D) qkv in sequence order  ->  causal attention over the whole sequence, the
//                        one-rank kernel  ->  A2A out: the output's blocks back to their ranks, heads joined
//   backward             A2A dout to heads, in sequence order  ->  attention backward  ->  A2A dq, dk, dv back into
//                        the rank's dqkv
//
// Reordering the received blocks (every rank's two chunks, in rank order) into sequence order gives the causal mask
// each token's place in the sequence, so that the core is the one-rank attention on fewer heads.
#include <vector>

#include "exec/core/check.hpp"
#include "exec/interpreter/interpreter.hpp"

namespace twin::exec {

using model::Op;
using model::Payload;

// Where a payload's tensor lies: its heads and first column in this rank's packed qkv (or output) row, and in the
// head group's packed row.
Interpreter::UlyssesSection Interpreter::ulysses_section(Payload payload) const {
  const int d = dims_.head_dim, h = dims_.heads_local, kv = dims_.kv_heads_local, cp = dims_.cp;
  switch (payload) {
    case Payload::UlyssesKeys:
    case Payload::UlyssesKeyGrads:
      return {kv, h * d, (h / cp) * d};
    case Payload::UlyssesValues:
    case Payload::UlyssesValueGrads:
      return {kv, (h + kv) * d, (h / cp + kv / cp) * d};
    default:  // queries, their gradients; the output and its gradient (its own tensor, from column 0)
      return {h, 0, 0};
  }
}

void Interpreter::ulysses_all_to_all(const Op& op, const Tensor& send, const Tensor& recv) {
  const std::vector<std::size_t> counts(static_cast<std::size_t>(dims_.cp),
                                        send.numel / static_cast<std::size_t>(dims_.cp));
  comm_.all_to_all(group(op.group), send.data, counts, recv.data, counts, send.dtype, labels_[current_op_]);
}

// tokens -> heads: this rank's part of `local` (its tokens, all its heads), the group's part of `full` (the whole
// sequence, head group cp_rank) once every rank's block is in.
void Interpreter::ulysses_to_heads(const Op& op, const Tensor& local, int local_width, const Tensor& full,
                                   int full_width) {
  const UlyssesSection section = ulysses_section(op.payload);
  const ContextShape shape = context_shape();
  const std::size_t elements = numel(dims_.tokens, section.heads * dims_.head_dim);
  Tensor send = backend_.allocate(elements, local.dtype), recv = backend_.allocate(elements, local.dtype);
  backend_.context_kernels().ulysses_split_heads(send, local, local_width, section.column, section.heads, shape);
  ulysses_all_to_all(op, send, recv);
  backend_.context_kernels().ulysses_blocks_to_sequence(full, recv, full_width, section.group_column,
                                                        section.heads / dims_.cp, shape);
}

// heads -> tokens: the inverse.
void Interpreter::ulysses_to_tokens(const Op& op, const Tensor& full, int full_width, const Tensor& local,
                                    int local_width) {
  const UlyssesSection section = ulysses_section(op.payload);
  const ContextShape shape = context_shape();
  const std::size_t elements = numel(dims_.tokens, section.heads * dims_.head_dim);
  Tensor send = backend_.allocate(elements, full.dtype), recv = backend_.allocate(elements, full.dtype);
  backend_.context_kernels().ulysses_sequence_to_blocks(send, full, full_width, section.group_column,
                                                        section.heads / dims_.cp, shape);
  ulysses_all_to_all(op, send, recv);
  backend_.context_kernels().ulysses_join_heads(local, recv, local_width, section.column, section.heads, shape);
}

// The rows of a head group's tensors: the whole sequences of the micro-batch.
int Interpreter::whole_tokens() const {
  return dims_.tokens * dims_.cp;
}

int Interpreter::ulysses_qkv_width() const {
  return (dims_.heads_local + 2 * dims_.kv_heads_local) / dims_.cp * dims_.head_dim;
}

// UlyssesQueries, UlyssesKeys, UlyssesValues: the queries' all-to-all starts the head group's qkv.
void Interpreter::ulysses_qkv_to_heads(const Op& op) {
  LayerStash& s = stash(op);
  TWIN_EXEC_CHECK(!s.qkv.empty(), "rank {}: {}: no qkv to exchange (the QKV projection did not run)", rank_,
                  labels_[current_op_]);
  if (op.payload == Payload::UlyssesQueries) {
    s.ulysses_qkv = backend_.allocate(numel(whole_tokens(), ulysses_qkv_width()), s.qkv.dtype);
  }
  TWIN_EXEC_CHECK(!s.ulysses_qkv.empty(), "rank {}: {}: the queries' all-to-all did not run first", rank_,
                  labels_[current_op_]);
  ulysses_to_heads(op, s.qkv, dims_.qkv_local, s.ulysses_qkv, ulysses_qkv_width());
}

void Interpreter::ulysses_attention_forward(const Op& op) {
  LayerStash& s = stash(op);
  TWIN_EXEC_CHECK(!s.ulysses_qkv.empty(), "layer {}: the queries, keys and values were not exchanged", op.layer);
  const int heads = dims_.heads_local / dims_.cp, seq = dims_.seq * dims_.cp;
  s.ulysses_out = backend_.allocate(numel(whole_tokens(), heads * dims_.head_dim), backend_.activation_dtype());
  s.attn_lse = backend_.allocate(numel(dims_.batch * heads, seq), DType::F32);
  backend_.attention_forward(s.ulysses_out, s.attn_lse, s.ulysses_qkv, dims_.batch, seq, heads,
                             dims_.kv_heads_local / dims_.cp, dims_.head_dim, shard_.alibi_slopes);
}

// UlyssesOutput: the head group's output back to its tokens' ranks, as the projection's input.
void Interpreter::ulysses_output_to_tokens(const Op& op) {
  LayerStash& s = stash(op);
  TWIN_EXEC_CHECK(!s.ulysses_out.empty(), "layer {}: the attention core did not run", op.layer);
  const int width = dims_.heads_local * dims_.head_dim;
  s.attn = backend_.allocate(numel(dims_.tokens, width), s.ulysses_out.dtype);
  ulysses_to_tokens(op, s.ulysses_out, width / dims_.cp, s.attn, width);
}

// UlyssesOutputGrad: the projection's input gradient to heads.
void Interpreter::ulysses_output_grad_to_heads(const Op& op) {
  ChunkState& state = chunk(op);
  TWIN_EXEC_CHECK(!state.work.d_attn.empty(), "layer {}: no attention output gradient to exchange", op.layer);
  const int width = dims_.heads_local * dims_.head_dim;
  state.work.ulysses_dout = backend_.allocate(numel(whole_tokens(), width / dims_.cp), state.work.d_attn.dtype);
  ulysses_to_heads(op, state.work.d_attn, width, state.work.ulysses_dout, width / dims_.cp);
  state.work.d_attn = Tensor{};
}

void Interpreter::ulysses_attention_backward(const Op& op) {
  ChunkState& state = chunk(op);
  LayerStash& s = stash(op);
  TWIN_EXEC_CHECK(!state.work.ulysses_dout.empty() && !s.ulysses_out.empty(),
                  "layer {}: the output gradient was not exchanged, or the output not kept", op.layer);
  const int heads = dims_.heads_local / dims_.cp;
  state.work.ulysses_dqkv = backend_.allocate(s.ulysses_qkv.numel, backend_.activation_dtype());
  backend_.attention_backward(state.work.ulysses_dqkv, state.work.ulysses_dout, s.ulysses_qkv, s.ulysses_out,
                              s.attn_lse, dims_.batch, dims_.seq * dims_.cp, heads, dims_.kv_heads_local / dims_.cp,
                              dims_.head_dim, shard_.alibi_slopes);
  state.work.ulysses_dout = Tensor{};
  s.ulysses_qkv = Tensor{};
  s.ulysses_out = Tensor{};
  // Every column of the rank's dqkv is written by one of the three all-to-alls back.
  state.work.d_qkv = backend_.allocate(numel(dims_.tokens, dims_.qkv_local), backend_.activation_dtype());
}

// UlyssesQueryGrads, UlyssesKeyGrads, UlyssesValueGrads: each part of the head group's dqkv back into the rank's.
void Interpreter::ulysses_grads_to_tokens(const Op& op) {
  ChunkState& state = chunk(op);
  TWIN_EXEC_CHECK(!state.work.ulysses_dqkv.empty() && !state.work.d_qkv.empty(),
                  "layer {}: the attention core's backward did not run", op.layer);
  ulysses_to_tokens(op, state.work.ulysses_dqkv, ulysses_qkv_width(), state.work.d_qkv, dims_.qkv_local);
  if (op.payload == Payload::UlyssesValueGrads) state.work.ulysses_dqkv = Tensor{};
}

}  // namespace twin::exec

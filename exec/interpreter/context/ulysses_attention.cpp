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
#include <map>
#include <vector>

#include <fmt/format.h>

#include "exec/core/check.hpp"
#include "exec/core/errors.hpp"
#include "exec/interpreter/context/ulysses_attention.hpp"

namespace twin::exec {

using model::Op;
using model::Payload;

void UlyssesAttention::exchange(const Op& op) {
  HeadGroup& h = layers_[StashKey::of(op)];
  switch (op.payload) {
    case Payload::UlyssesQueries:
    case Payload::UlyssesKeys:
    case Payload::UlyssesValues:
      return qkv_to_heads(op, h);
    case Payload::UlyssesOutput:
      return output_to_tokens(op, h);
    case Payload::UlyssesOutputGrad:
      return output_grad_to_heads(op, h);
    case Payload::UlyssesQueryGrads:
    case Payload::UlyssesKeyGrads:
    case Payload::UlyssesValueGrads:
      return grads_to_tokens(op, h);
    default:
      throw InternalError(fmt::format("{}: not an exchange of the a2a way", ctx_.label()));
  }
}

void UlyssesAttention::drop_forward(const StashKey& key) {
  const auto it = layers_.find(key);
  if (it == layers_.end()) return;
  it->second.qkv = Tensor{};
  it->second.out = Tensor{};
}

void UlyssesAttention::release(int micro_batch, int chunk) {
  std::erase_if(
      layers_, [&](const auto& entry) { return entry.first.micro_batch == micro_batch && entry.first.chunk == chunk; });
}

// Where a payload's tensor lies: its heads and first column in this rank's packed qkv (or output) row, and in the
// head group's packed row.
UlyssesAttention::Section UlyssesAttention::section(Payload payload) const {
  const int d = ctx_.dims.head_dim, h = ctx_.dims.heads_local, kv = ctx_.dims.kv_heads_local, cp = ctx_.dims.cp;
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

void UlyssesAttention::all_to_all(const Op& op, const Tensor& send, const Tensor& recv) {
  const std::vector<std::size_t> counts(static_cast<std::size_t>(ctx_.dims.cp),
                                        send.numel / static_cast<std::size_t>(ctx_.dims.cp));
  ctx_.comm.all_to_all(ctx_.group(op.group), send.data, counts, recv.data, counts, send.dtype, ctx_.label());
}

// tokens -> heads: this rank's part of `local` (its tokens, all its heads), the group's part of `full` (the whole
// sequence, head group cp_rank) once every rank's block is in.
void UlyssesAttention::to_heads(const Op& op, const Tensor& local, int local_width, const Tensor& full,
                                int full_width) {
  const Section range = section(op.payload);
  const ContextShape shape = context_shape(ctx_.dims);
  const std::size_t elements = numel(ctx_.dims.tokens, range.heads * ctx_.dims.head_dim);
  Tensor send = ctx_.backend.allocate(elements, local.dtype), recv = ctx_.backend.allocate(elements, local.dtype);
  ctx_.backend.context_kernels().ulysses_split_heads(send, local, local_width, range.column, range.heads, shape);
  all_to_all(op, send, recv);
  ctx_.backend.context_kernels().ulysses_blocks_to_sequence(full, recv, full_width, range.group_column,
                                                            range.heads / ctx_.dims.cp, shape);
}

// heads -> tokens: the inverse.
void UlyssesAttention::to_tokens(const Op& op, const Tensor& full, int full_width, const Tensor& local,
                                 int local_width) {
  const Section range = section(op.payload);
  const ContextShape shape = context_shape(ctx_.dims);
  const std::size_t elements = numel(ctx_.dims.tokens, range.heads * ctx_.dims.head_dim);
  Tensor send = ctx_.backend.allocate(elements, full.dtype), recv = ctx_.backend.allocate(elements, full.dtype);
  ctx_.backend.context_kernels().ulysses_sequence_to_blocks(send, full, full_width, range.group_column,
                                                            range.heads / ctx_.dims.cp, shape);
  all_to_all(op, send, recv);
  ctx_.backend.context_kernels().ulysses_join_heads(local, recv, local_width, range.column, range.heads, shape);
}

// The rows of a head group's tensors: the whole sequences of the micro-batch.
int UlyssesAttention::whole_tokens() const {
  return ctx_.dims.tokens * ctx_.dims.cp;
}

int UlyssesAttention::qkv_width() const {
  return (ctx_.dims.heads_local + 2 * ctx_.dims.kv_heads_local) / ctx_.dims.cp * ctx_.dims.head_dim;
}

// UlyssesQueries, UlyssesKeys, UlyssesValues: the queries' all-to-all starts the head group's qkv.
void UlyssesAttention::qkv_to_heads(const Op& op, HeadGroup& h) {
  LayerStash& s = ctx_.stash(op);
  TWIN_EXEC_CHECK(!s.qkv.empty(), "rank {}: {}: no qkv to exchange (the QKV projection did not run)", ctx_.rank,
                  ctx_.label());
  if (op.payload == Payload::UlyssesQueries) {
    h.qkv = ctx_.backend.allocate(numel(whole_tokens(), qkv_width()), s.qkv.dtype);
  }
  TWIN_EXEC_CHECK(!h.qkv.empty(), "rank {}: {}: the queries' all-to-all did not run first", ctx_.rank, ctx_.label());
  to_heads(op, s.qkv, ctx_.dims.qkv_local, h.qkv, qkv_width());
}

void UlyssesAttention::forward(const Op& op) {
  LayerStash& s = ctx_.stash(op);
  HeadGroup& h = layers_[StashKey::of(op)];
  TWIN_EXEC_CHECK(!h.qkv.empty(), "layer {}: the queries, keys and values were not exchanged", op.layer);
  const int heads = ctx_.dims.heads_local / ctx_.dims.cp, seq = ctx_.dims.seq * ctx_.dims.cp;
  h.out = ctx_.backend.allocate(numel(whole_tokens(), heads * ctx_.dims.head_dim), ctx_.backend.activation_dtype());
  s.attn_lse = ctx_.backend.allocate(numel(ctx_.dims.batch * heads, seq), DType::F32);
  ctx_.backend.attention_forward(h.out, s.attn_lse, h.qkv, ctx_.dims.batch, seq, heads,
                                 ctx_.dims.kv_heads_local / ctx_.dims.cp, ctx_.dims.head_dim, ctx_.shard.alibi_slopes);
}

// UlyssesOutput: the head group's output back to its tokens' ranks, as the projection's input.
void UlyssesAttention::output_to_tokens(const Op& op, HeadGroup& h) {
  LayerStash& s = ctx_.stash(op);
  TWIN_EXEC_CHECK(!h.out.empty(), "layer {}: the attention core did not run", op.layer);
  const int width = ctx_.dims.heads_local * ctx_.dims.head_dim;
  s.attn = ctx_.backend.allocate(numel(ctx_.dims.tokens, width), h.out.dtype);
  to_tokens(op, h.out, width / ctx_.dims.cp, s.attn, width);
}

// UlyssesOutputGrad: the projection's input gradient to heads.
void UlyssesAttention::output_grad_to_heads(const Op& op, HeadGroup& h) {
  ChunkState& state = ctx_.chunk(op);
  TWIN_EXEC_CHECK(!state.work.d_attn.empty(), "layer {}: no attention output gradient to exchange", op.layer);
  const int width = ctx_.dims.heads_local * ctx_.dims.head_dim;
  h.dout = ctx_.backend.allocate(numel(whole_tokens(), width / ctx_.dims.cp), state.work.d_attn.dtype);
  to_heads(op, state.work.d_attn, width, h.dout, width / ctx_.dims.cp);
  state.work.d_attn = Tensor{};
}

void UlyssesAttention::backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  LayerStash& s = ctx_.stash(op);
  HeadGroup& h = layers_[StashKey::of(op)];
  TWIN_EXEC_CHECK(!h.dout.empty() && !h.out.empty(),
                  "layer {}: the output gradient was not exchanged, or the output not kept", op.layer);
  const int heads = ctx_.dims.heads_local / ctx_.dims.cp;
  h.dqkv = ctx_.backend.allocate(h.qkv.numel, ctx_.backend.activation_dtype());
  ctx_.backend.attention_backward(h.dqkv, h.dout, h.qkv, h.out, s.attn_lse, ctx_.dims.batch,
                                  ctx_.dims.seq * ctx_.dims.cp, heads, ctx_.dims.kv_heads_local / ctx_.dims.cp,
                                  ctx_.dims.head_dim, ctx_.shard.alibi_slopes);
  h.dout = Tensor{};
  h.qkv = Tensor{};
  h.out = Tensor{};
  // Every column of the rank's dqkv is written by one of the three all-to-alls back.
  state.work.d_qkv =
      ctx_.backend.allocate(numel(ctx_.dims.tokens, ctx_.dims.qkv_local), ctx_.backend.activation_dtype());
}

// UlyssesQueryGrads, UlyssesKeyGrads, UlyssesValueGrads: each part of the head group's dqkv back into the rank's.
void UlyssesAttention::grads_to_tokens(const Op& op, HeadGroup& h) {
  ChunkState& state = ctx_.chunk(op);
  TWIN_EXEC_CHECK(!h.dqkv.empty() && !state.work.d_qkv.empty(), "layer {}: the attention core's backward did not run",
                  op.layer);
  to_tokens(op, h.dqkv, qkv_width(), state.work.d_qkv, ctx_.dims.qkv_local);
  if (op.payload == Payload::UlyssesValueGrads) h.dqkv = Tensor{};
}

}  // namespace twin::exec

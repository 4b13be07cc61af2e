// Context parallelism, the all_gather way (framework.cp_comm = "all_gather"; model/ops/context_parallel.hpp): each CP
// rank holds two chunks of every sequence (model::cp_sequence_chunk), runs everything outside the attention core on
// them alone, and around the attention core runs the Program's exchanges over the Context group:
//
//   forward, recompute   AG keys, AG values  ->  attention core: its queries against the whole sequence, causal by
//                                                 position in the sequence (the gathered K, V are dropped after it)
//   backward             AG keys, AG values  ->  attention core backward: dq, and its share of every rank's dK, dV
//                        ->  RS dK, RS dV: each rank's own key and value gradients, summed over the CP ranks
//
// The learned position embedding and the rotary embedding take each token's position in the whole sequence.
#include <map>

#include <fmt/format.h>

#include "exec/core/check.hpp"
#include "exec/core/errors.hpp"
#include "exec/interpreter/context/all_gather_attention.hpp"

namespace twin::exec {

using model::Op;
using model::Payload;

void AllGatherAttention::exchange(const Op& op) {
  Gathered& g = layers_[StashKey::of(op)];
  switch (op.payload) {
    case Payload::ContextKeys:
      return gather_keys(op, g);
    case Payload::ContextValues:
      return gather_values(op, g);
    case Payload::ContextKeyGrads:
      return scatter_grads(op, g, false);
    case Payload::ContextValueGrads:
      return scatter_grads(op, g, true);
    default:
      throw InternalError(fmt::format("{}: not an exchange of the all_gather way", ctx_.label()));
  }
}

void AllGatherAttention::release(int micro_batch, int chunk) {
  std::erase_if(
      layers_, [&](const auto& entry) { return entry.first.micro_batch == micro_batch && entry.first.chunk == chunk; });
}

// Keys and values are split from the rank's qkv once, at the keys' all-gather; the values wait for theirs.
void AllGatherAttention::gather_keys(const Op& op, Gathered& g) {
  LayerStash& s = ctx_.stash(op);
  TWIN_EXEC_CHECK(!s.qkv.empty(), "rank {}: {}: no keys to gather (the QKV projection did not run)", ctx_.rank,
                  ctx_.label());
  const std::size_t local = numel(ctx_.dims.tokens, ctx_.dims.kv_heads_local * ctx_.dims.head_dim);
  Tensor keys = ctx_.backend.allocate(local, ctx_.backend.activation_dtype());
  g.values_local = ctx_.backend.allocate(local, ctx_.backend.activation_dtype());
  ctx_.backend.context_kernels().context_split_keys_values(keys, g.values_local, s.qkv, context_shape(ctx_.dims));
  g.keys = ctx_.backend.allocate(local * static_cast<std::size_t>(ctx_.dims.cp), keys.dtype);
  ctx_.comm.all_gather(ctx_.group(op.group), keys.data, g.keys.data, local, keys.dtype, ctx_.label());
}

void AllGatherAttention::gather_values(const Op& op, Gathered& g) {
  TWIN_EXEC_CHECK(!g.values_local.empty(), "rank {}: {}: the keys' all-gather did not run first", ctx_.rank,
                  ctx_.label());
  g.values = ctx_.backend.allocate(g.values_local.numel * static_cast<std::size_t>(ctx_.dims.cp), g.values_local.dtype);
  ctx_.comm.all_gather(ctx_.group(op.group), g.values_local.data, g.values.data, g.values_local.numel,
                       g.values_local.dtype, ctx_.label());
  g.values_local = Tensor{};
}

void AllGatherAttention::forward(const Op& op) {
  LayerStash& s = ctx_.stash(op);
  Gathered& g = layers_[StashKey::of(op)];
  TWIN_EXEC_CHECK(!g.keys.empty() && !g.values.empty(), "layer {}: the keys and values were not gathered", op.layer);
  s.attn = ctx_.backend.allocate(numel(ctx_.dims.tokens, ctx_.dims.heads_local * ctx_.dims.head_dim),
                                 ctx_.backend.activation_dtype());
  s.attn_lse = ctx_.backend.allocate(numel(ctx_.dims.batch * ctx_.dims.heads_local, ctx_.dims.seq), DType::F32);
  ctx_.backend.context_kernels().context_attention_forward(s.attn, s.attn_lse, s.qkv, g.keys, g.values,
                                                           context_shape(ctx_.dims));
  g.keys = Tensor{};  // Transformer Engine gathers them again for the backward
  g.values = Tensor{};
}

void AllGatherAttention::backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  LayerStash& s = ctx_.stash(op);
  Gathered& g = layers_[StashKey::of(op)];
  TWIN_EXEC_CHECK(!g.keys.empty() && !g.values.empty(), "layer {}: the keys and values were not gathered", op.layer);
  state.work.d_qkv = ctx_.backend.allocate(s.qkv.numel, ctx_.backend.activation_dtype());
  g.d_keys = ctx_.backend.allocate(g.keys.numel, g.keys.dtype);
  g.d_values = ctx_.backend.allocate(g.values.numel, g.values.dtype);
  ctx_.backend.context_kernels().context_attention_backward(state.work.d_qkv, g.d_keys, g.d_values, state.work.d_attn,
                                                            s.qkv, g.keys, g.values, s.attn, s.attn_lse,
                                                            context_shape(ctx_.dims));
  state.work.d_attn = Tensor{};
  g.keys = Tensor{};
  g.values = Tensor{};
}

// dK and dV of the whole sequence alike: reduce-scattered over Context, this rank's part put into its dQKV.
void AllGatherAttention::scatter_grads(const Op& op, Gathered& g, bool values) {
  ChunkState& state = ctx_.chunk(op);
  Tensor& grads = values ? g.d_values : g.d_keys;
  TWIN_EXEC_CHECK(!grads.empty(), "layer {}: no {} gradients to reduce-scatter", op.layer, values ? "value" : "key");
  const std::size_t local = grads.numel / static_cast<std::size_t>(ctx_.dims.cp);
  Tensor mine = ctx_.backend.allocate(local, grads.dtype);
  ctx_.comm.reduce_scatter(ctx_.group(op.group), grads.data, mine.data, local, mine.dtype, ctx_.label());
  ctx_.backend.context_kernels().context_put_key_value_grad(state.work.d_qkv, mine, values, context_shape(ctx_.dims));
  grads = Tensor{};
}

}  // namespace twin::exec

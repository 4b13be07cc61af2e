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
#include <fmt/format.h>

#include "exec/core/check.hpp"
#include "exec/interpreter/interpreter.hpp"
#include "model/ops/context_parallel.hpp"

namespace twin::exec {

using model::Op;

ContextShape Interpreter::context_shape() const {
  ContextShape shape;
  shape.batch = dims_.batch;
  shape.seq = dims_.seq * dims_.cp;
  shape.heads = dims_.heads_local;
  shape.kv_heads = dims_.kv_heads_local;
  shape.head_dim = dims_.head_dim;
  shape.cp = dims_.cp;
  shape.cp_rank = dims_.cp_rank;
  return shape;
}

// Keys and values are split from the rank's qkv once, at the keys' all-gather; the values wait for theirs.
void Interpreter::gather_context_keys(const Op& op) {
  LayerStash& s = stash(op);
  TWIN_EXEC_CHECK(!s.qkv.empty(), "rank {}: {}: no keys to gather (the QKV projection did not run)", rank_,
                  labels_[current_op_]);
  const std::size_t local = numel(dims_.tokens, dims_.kv_heads_local * dims_.head_dim);
  Tensor keys = backend_.allocate(local, backend_.activation_dtype());
  s.values_local = backend_.allocate(local, backend_.activation_dtype());
  backend_.context_kernels().context_split_keys_values(keys, s.values_local, s.qkv, context_shape());
  s.keys = backend_.allocate(local * static_cast<std::size_t>(dims_.cp), keys.dtype);
  comm_.all_gather(group(op.group), keys.data, s.keys.data, local, keys.dtype, labels_[current_op_]);
}

void Interpreter::gather_context_values(const Op& op) {
  LayerStash& s = stash(op);
  TWIN_EXEC_CHECK(!s.values_local.empty(), "rank {}: {}: the keys' all-gather did not run first", rank_,
                  labels_[current_op_]);
  s.values = backend_.allocate(s.values_local.numel * static_cast<std::size_t>(dims_.cp), s.values_local.dtype);
  comm_.all_gather(group(op.group), s.values_local.data, s.values.data, s.values_local.numel, s.values_local.dtype,
                   labels_[current_op_]);
  s.values_local = Tensor{};
}

void Interpreter::context_attention_forward(const Op& op) {
  LayerStash& s = stash(op);
  TWIN_EXEC_CHECK(!s.keys.empty() && !s.values.empty(), "layer {}: the keys and values were not gathered", op.layer);
  s.attn = backend_.allocate(numel(dims_.tokens, dims_.heads_local * dims_.head_dim), backend_.activation_dtype());
  s.attn_lse = backend_.allocate(numel(dims_.batch * dims_.heads_local, dims_.seq), DType::F32);
  backend_.context_kernels().context_attention_forward(s.attn, s.attn_lse, s.qkv, s.keys, s.values, context_shape());
  s.keys = Tensor{};  // Transformer Engine gathers them again for the backward
  s.values = Tensor{};
}

void Interpreter::context_attention_backward(const Op& op) {
  ChunkState& state = chunk(op);
  LayerStash& s = stash(op);
  TWIN_EXEC_CHECK(!s.keys.empty() && !s.values.empty(), "layer {}: the keys and values were not gathered", op.layer);
  state.work.d_qkv = backend_.allocate(s.qkv.numel, backend_.activation_dtype());
  state.work.d_keys = backend_.allocate(s.keys.numel, s.keys.dtype);
  state.work.d_values = backend_.allocate(s.values.numel, s.values.dtype);
  backend_.context_kernels().context_attention_backward(state.work.d_qkv, state.work.d_keys, state.work.d_values,
                                                        state.work.d_attn, s.qkv, s.keys, s.values, s.attn, s.attn_lse,
                                                        context_shape());
  state.work.d_attn = Tensor{};
  s.keys = Tensor{};
  s.values = Tensor{};
}

// dK and dV of the whole sequence alike: reduce-scattered over Context, this rank's part put into its dQKV.
void Interpreter::scatter_context_grad(const Op& op, bool values) {
  ChunkState& state = chunk(op);
  Tensor& grads = values ? state.work.d_values : state.work.d_keys;
  TWIN_EXEC_CHECK(!grads.empty(), "layer {}: no {} gradients to reduce-scatter", op.layer, values ? "value" : "key");
  const std::size_t local = grads.numel / static_cast<std::size_t>(dims_.cp);
  Tensor mine = backend_.allocate(local, grads.dtype);
  comm_.reduce_scatter(group(op.group), grads.data, mine.data, local, mine.dtype, labels_[current_op_]);
  backend_.context_kernels().context_put_key_value_grad(state.work.d_qkv, mine, values, context_shape());
  grads = Tensor{};
}

void Interpreter::scatter_context_key_grads(const Op& op) {
  scatter_context_grad(op, false);
}

void Interpreter::scatter_context_value_grads(const Op& op) {
  scatter_context_grad(op, true);
}

// Each local chunk of each sequence (rows [b L + part C, + C) of x) at its chunk's positions of wpe.
void Interpreter::context_position_embedding(const Tensor& x, bool backward) {
  const int chunk = dims_.seq / 2;
  const std::size_t rows = numel(chunk, dims_.hidden);
  for (int b = 0; b < dims_.batch; ++b) {
    for (int part = 0; part < 2; ++part) {
      const Tensor mine = x.slice(numel(b * dims_.seq + part * chunk, dims_.hidden), rows);
      const int first = model::cp_sequence_chunk(dims_.cp_rank, part, dims_.cp) * chunk;
      if (backward) {
        backend_.position_embedding_backward(shard_.wpe_grad.slice(numel(first, dims_.hidden), rows), mine, 1, chunk,
                                             dims_.hidden);
      } else {
        backend_.position_embedding_forward(mine, shard_.wpe.slice(numel(first, dims_.hidden), rows), 1, chunk,
                                            dims_.hidden);
      }
    }
  }
}

}  // namespace twin::exec

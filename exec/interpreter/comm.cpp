// Tensor-parallel collectives and pipeline messages. Each collective op names (payload, what): the buffer it works on
// follows from them.
//   LayerOutput  after a row-parallel GEMM (attention projection, MLP down) or the vocab-parallel embedding: the
//                partial sums (T, C) are all-reduced, or reduce-scattered to the rank's sequence shard (T_sp, C)
//   InputGrad    after a column-parallel GEMM's backward (QKV, MLP up, LM head): the partial input gradient, same
//   LayerInput   sequence parallel: all-gather a layernorm output (T_sp, C) -> (T, C) before a column-parallel GEMM
//                (forward, recompute, and again in the backward for its weight gradient)
//   OutputGrad   sequence parallel: all-gather the stream's gradient (T_sp, C) -> (T, C) before a row-parallel
//                GEMM's backward (or the embedding's)
//   CheckpointedInput  DeepSpeed's partition_activations: all-gather a layer's kept 1/t of its input before its
//                recompute
// A sequence shard is a contiguous block of T/tp token rows: every op outside the TP region works row by row.
#include <fmt/core.h>

#include "exec/core/check.hpp"
#include "exec/interpreter/interpreter.hpp"

namespace twin::exec {

using model::CollectiveKind;
using model::ComputeKind;
using model::Op;
using model::Phase;

Tensor& Interpreter::tensor_parallel_buffer(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  switch (op.what) {
    case ComputeKind::Embedding:
      return state.hidden;
    case ComputeKind::AttentionProjection:
      return ctx_.stash(op).proj;
    case ComputeKind::MlpDown:
      return ctx_.stash(op).fc_proj;
    case ComputeKind::QkvProjection:
    case ComputeKind::MlpUp:
    case ComputeKind::LmHead:
      return state.work.d_ln;
    default:
      break;
  }
  throw InternalError(
      fmt::format("rank {}: {}: no tensor-parallel buffer for {}", rank_, ctx_.label(), model::to_string(op.what)));
}

void Interpreter::reduce_tensor_parallel(const Op& op) {
  Tensor& buffer = tensor_parallel_buffer(op);  // (T, C) partial sums
  TWIN_EXEC_CHECK(!buffer.empty(), "rank {}: {}: nothing to reduce", rank_, ctx_.label());
  const std::string& label = ctx_.label();
  if (op.collective == CollectiveKind::AllReduce) {
    comm_.all_reduce(ctx_.group(op.group), buffer.data, buffer.numel, buffer.dtype, label);
    return;
  }
  TWIN_EXEC_CHECK(op.collective == CollectiveKind::ReduceScatter, "{}: expected an all-reduce or reduce-scatter",
                  label);
  Tensor shard = backend_.allocate(buffer.numel / static_cast<std::size_t>(dims_.tp), buffer.dtype);  // (T_sp, C)
  comm_.reduce_scatter(ctx_.group(op.group), buffer.data, shard.data, shard.numel, buffer.dtype, label);
  buffer = shard;
}

void Interpreter::all_gather_sequence(const Op& op, const Tensor& shard, Tensor& full) {
  TWIN_EXEC_CHECK(!shard.empty(), "rank {}: {}: nothing to gather", rank_, ctx_.label());
  full = backend_.allocate(shard.numel * static_cast<std::size_t>(dims_.tp), shard.dtype);  // (T, C)
  comm_.all_gather(ctx_.group(op.group), shard.data, full.data, shard.numel, shard.dtype, ctx_.label());
}

void Interpreter::gather_layer_input(const Op& op) {
  switch (op.what) {
    case ComputeKind::QkvProjection: {
      LayerStash& s = ctx_.stash(op);
      all_gather_sequence(op, s.ln1, s.ln1_full);
      return;
    }
    case ComputeKind::MlpUp: {
      LayerStash& s = ctx_.stash(op);
      all_gather_sequence(op, s.ln2, s.ln2_full);
      return;
    }
    case ComputeKind::LmHead: {
      HeadStash& h = ctx_.chunk(op).head;
      all_gather_sequence(op, h.lnf, h.lnf_full);
      return;
    }
    default:
      throw InternalError(fmt::format("rank {}: {}: no layer input to gather", rank_, ctx_.label()));
  }
}

void Interpreter::gather_output_grad(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  all_gather_sequence(op, state.grad, state.work.grad_full);
}

// DeepSpeed's partition_activations: the layer kept its rank's contiguous 1/t of the flattened input (taken by the
// LN1 op, kept by finish_layer_forward); its recompute needs the whole of it.
void Interpreter::gather_checkpointed_input(const Op& op) {
  LayerStash& s = ctx_.stash(op);
  all_gather_sequence(op, s.x_part, s.x);
  s.x_part = Tensor{};
}

void Interpreter::gather_cross_entropy_stats(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  Tensor gathered;  // (tp, T, 3)
  all_gather_sequence(op, state.head.stats, gathered);
  combine_cross_entropy(state, gathered, dims_.tp);
}

// ---- pipeline -------------------------------------------------------------------------------------------------------
// Forward: the stream (T_sp, C) goes to the next virtual stage; backward: its gradient goes back.

void Interpreter::send(const Op& op) {
  if (op.group == model::Group::Context) return context_->exchange(op);  // the p2p ring
  ChunkState& state = ctx_.chunk(op);
  const Tensor& tensor = op.phase == Phase::Forward ? state.hidden : state.grad;
  TWIN_EXEC_CHECK(!tensor.empty(), "rank {}: {}: nothing to send", rank_, ctx_.label());
  const int peer = program_.layout.rank_on_stage(rank_, op.peer_stage);
  comm_.send(peer, model::p2p_tag_key(model::p2p_tag(op)), tensor.data, tensor.bytes());
}

void Interpreter::pass_through_turn(const Op& last) {
  const bool forward = last.phase == Phase::Forward;
  const Tensor& from = forward ? ctx_.chunk(last).hidden : ctx_.chunk(last).grad;
  TWIN_EXEC_CHECK(!from.empty(), "rank {}: {}: nothing to pass through the V's turn", rank_, ctx_.label());
  Op next = last;  // the other chunk's state: created by its forward (chunk 1), or its forward made it (chunk 0)
  next.chunk = 1 - last.chunk;
  ChunkState& to = ctx_.chunk(next);
  Tensor copy = backend_.allocate(from.numel, from.dtype);
  backend_.copy(copy, from);
  (forward ? to.hidden : to.grad) = copy;
}

void Interpreter::recv(const Op& op) {
  if (op.group == model::Group::Context) return context_->exchange(op);
  ChunkState& state = ctx_.chunk(op);
  Tensor tensor =
      backend_.allocate(static_cast<std::size_t>(dims_.tokens_sp) * dims_.hidden, backend_.activation_dtype());
  const int peer = program_.layout.rank_on_stage(rank_, op.peer_stage);
  comm_.recv(peer, model::p2p_tag_key(model::p2p_tag(op)), tensor.data, tensor.bytes(), ctx_.label());
  (op.phase == Phase::Forward ? state.hidden : state.grad) = tensor;
}

}  // namespace twin::exec

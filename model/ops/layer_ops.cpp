#include "model/ops/layer_ops.hpp"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>

#include "model/ops/compute_ops.hpp"
#include "model/ops/context_parallel_ops.hpp"
#include "model/ops/context_parallel_ring.hpp"
#include "model/ops/moe_host_sync.hpp"
#include "model/ops/moe_ops.hpp"
#include "model/plan/schedule.hpp"

namespace twin::model {
namespace {

// The attention core with its context-parallel exchanges: the ring's blocks and messages (`ring`: framework.cp_comm
// = "p2p" with cp > 1), or the all_gather or a2a way's exchanges around one core op (none when cp == 1).
void context_attention(std::vector<Op>& ops, const Shapes& x, Phase phase, bool ring) {
  if (ring) {
    if (phase == Phase::Backward) {
      append_ring_attention_backward(ops, x);
    } else {
      append_ring_attention_forward(ops, x, phase);
    }
    return;
  }
  gather_context_keys_values(ops, x, phase);
  ops.push_back(attention_core(x, phase));
  if (phase == Phase::Backward) {
    scatter_context_key_value_grads(ops, x);
  } else {
    return_context_output(ops, x, phase);  // a2a: the output back to tokens (the checkpointed function ends with it)
  }
}

// Forward (or recomputed forward) of one transformer layer, op by op.
//
// A parallel block (model.parallel_residual; GPT-J, GPT-NeoX's gpt_j_residual: "x = x + attn(ln(x)) + mlp(ln(x)) ...
// we can do a single allreduce after we add mlp / attn outputs", megatron/model/transformer.py): both layer norms
// read the layer input, the MLP-down GEMM accumulates onto the attention projection's partial sums (C = A B + C: one
// more read of the [tokens, h] partials), one TP all-reduce (reduce-scatter) reduces both branches, and one residual
// op adds x and both biases. GPT-NeoX adds each branch's bias with its dropout before the all-reduce and the residual
// after it, one pass over [tokens, h] more than counted here. With one shared layer norm (model.shared_norm: GPT-J,
// PaLM) there is no second norm, and its output is gathered once under sequence parallelism.
// `moe`: the scenario when this layer's MLP is a Mixture-of-Experts one (model/ops/moe_ops.hpp), which takes the layer
// norm's output where it is (a sequence shard under sequence parallelism) and gives its output back there.
std::vector<Op> layer_forward(const Shapes& x, Phase phase, const Scenario* moe, bool ring) {
  std::vector<Op> ops;
  const double attention_width = x.heads_local * x.head_dim;  // h / t
  ops.push_back(elementwise(ComputeKind::LayerNormAttention, phase, x.layer_norm_forward() * x.tokens_sp * x.h,
                            x.layer_norm_launches(phase)));
  gather_sequence(ops, x, Payload::LayerInput, ComputeKind::QkvProjection, phase);
  ops.push_back(qkv_projection(x, phase));
  context_attention(ops, x, phase, ring);
  ops.push_back(linear(x, ComputeKind::AttentionProjection, phase, x.tokens, x.h, attention_width));
  if (!x.parallel) {
    reduce_across_tensor(ops, x, Payload::LayerOutput, ComputeKind::AttentionProjection, phase);
    ops.push_back(elementwise(ComputeKind::AttentionResidual, phase, x.residual_forward() * x.tokens_sp * x.h,
                              x.residual_launches(phase)));
  }
  if (!x.shared_norm) {
    ops.push_back(elementwise(ComputeKind::LayerNormMlp, phase, x.layer_norm_forward() * x.tokens_sp * x.h,
                              x.layer_norm_launches(phase)));
    if (moe == nullptr) gather_sequence(ops, x, Payload::LayerInput, ComputeKind::MlpUp, phase);
  }
  if (moe != nullptr) {
    for (Op& op : moe_mlp_ops(*moe, x, phase)) ops.push_back(std::move(op));
  } else {
    ops.push_back(linear(x, ComputeKind::MlpUp, phase, x.tokens, x.up_local, x.h));
    ops.push_back(activation(x, phase));
    const double partial_sums = x.parallel ? x.e * x.tokens * x.h : 0;  // reads the attention branch's as C
    ops.push_back(linear(x, ComputeKind::MlpDown, phase, x.tokens, x.h, x.f / x.t, partial_sums));
    reduce_across_tensor(ops, x, Payload::LayerOutput, ComputeKind::MlpDown, phase);
  }
  const int branches = x.parallel ? 2 : 1;
  ops.push_back(elementwise(ComputeKind::MlpResidual, phase, x.residual_forward(branches) * x.tokens_sp * x.h,
                            x.residual_launches(phase, branches)));
  return ops;
}

// Backward of one transformer layer: the forward's ops in reverse, each collective replaced by its adjoint
// (all-reduce of the input gradient of a column-parallel GEMM; with sequence parallelism, all-gather of the output
// gradient before a row-parallel GEMM, re-gather of a column-parallel GEMM's input for its weight gradient, and
// reduce-scatter of its input gradient). A parallel block gathers dy once for both row-parallel GEMMs and keeps an
// all-reduce per branch (its two layer norms differ, so their gradients cannot be summed before them); with one
// shared norm the QKV GEMM's input gradient accumulates onto the MLP-up GEMM's (one more read of the [tokens, h]
// partials), so that one all-reduce serves both.
std::vector<Op> layer_backward(const Shapes& x, const Scenario* moe, bool ring) {
  const Phase phase = Phase::Backward;
  std::vector<Op> ops;
  const double attention_width = x.heads_local * x.head_dim;
  const int branches = x.parallel ? 2 : 1;
  ops.push_back(elementwise(ComputeKind::MlpResidual, phase, x.residual_backward(branches) * x.tokens_sp * x.h,
                            x.residual_launches(phase, branches)));
  if (moe != nullptr) {
    for (Op& op : moe_mlp_ops(*moe, x, phase)) ops.push_back(std::move(op));
  } else {
    gather_sequence(ops, x, Payload::OutputGrad, ComputeKind::MlpDown, phase);
    ops.push_back(linear(x, ComputeKind::MlpDown, phase, x.tokens, x.h, x.f / x.t));
    ops.push_back(activation(x, phase));
    // the MLP-up GEMM's input, for its weight gradient (the shared norm's output: QKV's too)
    gather_sequence(ops, x, Payload::LayerInput, x.shared_norm ? ComputeKind::QkvProjection : ComputeKind::MlpUp,
                    phase);
    ops.push_back(linear(x, ComputeKind::MlpUp, phase, x.tokens, x.up_local, x.h));
  }
  if (!x.shared_norm) {
    if (moe == nullptr) reduce_across_tensor(ops, x, Payload::InputGrad, ComputeKind::MlpUp, phase);
    ops.push_back(elementwise(ComputeKind::LayerNormMlp, phase, x.layer_norm_backward() * x.tokens_sp * x.h,
                              x.layer_norm_launches(phase)));
  }
  if (!x.parallel) {
    ops.push_back(elementwise(ComputeKind::AttentionResidual, phase, x.residual_backward() * x.tokens_sp * x.h,
                              x.residual_launches(phase)));
    gather_sequence(ops, x, Payload::OutputGrad, ComputeKind::AttentionProjection, phase);
  }
  ops.push_back(linear(x, ComputeKind::AttentionProjection, phase, x.tokens, x.h, attention_width));
  context_attention(ops, x, phase, ring);
  if (!x.shared_norm) gather_sequence(ops, x, Payload::LayerInput, ComputeKind::QkvProjection, phase);
  const double mlp_input_gradient = x.shared_norm ? x.e * x.tokens * x.h : 0;  // accumulated onto, read as C
  ops.push_back(qkv_projection(x, phase, mlp_input_gradient));
  reduce_across_tensor(ops, x, Payload::InputGrad, ComputeKind::QkvProjection, phase);
  ops.push_back(elementwise(ComputeKind::LayerNormAttention, phase, x.layer_norm_backward() * x.tokens_sp * x.h,
                            x.layer_norm_launches(phase)));
  return ops;
}

// DeepSpeed's partition_activations (v0.5 runtime/activation_checkpointing/checkpointing.py), around a checkpointed
// layer: its forward keeps `item.view(-1).narrow(...).clone()`, its rank's contiguous 1/t of the input (read and
// write e T h / t); before the recompute gather_partitioned_activations zero-fills a flat [T h] buffer (write e T h),
// copies the rank's part into it (read and write e T h / t) and all-gathers the parts across TP with PyTorch's list
// all_gather, which gathers into NCCL's own flat buffer and copies each part out (read and write e T h). The copies
// ride on the layer's first op, the gather is a blocking TP collective on the compute stream before the recompute.
void partition_checkpointed_input(const Shapes& x, Phase phase, std::vector<Op>& ops) {
  const double input = x.e * x.tokens * x.h, part = input / x.t;
  if (phase == Phase::Forward) {
    add_stream_bytes(ops.front(), 2 * part);
    return;
  }
  add_stream_bytes(ops.front(), input + 2 * part + 2 * input);
  ops.insert(ops.begin(), tensor_collective(CollectiveKind::AllGather, Payload::CheckpointedInput,
                                            ComputeKind::LayerNormAttention, phase, input));
  for (Op& op : ops) {
    for (std::int32_t& dep : op.deps) dep += dep >= 0 ? 1 : 0;  // indices into the layer's list (a CP ring's)
  }
}

// A zero-bubble schedule's B and W of a layer's backward (model/plan/schedule.hpp): each deferrable GEMM op split in
// place, its W in the backward's order (W ops depend on nothing but their B, which ran in an earlier step). An MoE
// layer's MLP (its shared experts' MlpUp and MlpDown among its ops) keeps its weight gradients in B: only its
// attention's two linear layers are split.
struct SplitLayer {
  std::vector<Op> input_grad, weight_grad;
};
SplitLayer split_layer_backward(const Shapes& x, std::vector<Op> backward, bool moe_layer) {
  SplitLayer split;
  for (Op& op : backward) {
    if (op.kind != OpKind::Compute || !deferrable_weight_gradient(op.what)) continue;
    if (moe_layer && op.what != ComputeKind::QkvProjection && op.what != ComputeKind::AttentionProjection) continue;
    SplitBackward parts = split_weight_gradient(x, op);
    op = std::move(parts.input_grad);
    split.weight_grad.push_back(std::move(parts.weight_grad));
  }
  split.input_grad = std::move(backward);
  return split;
}

}  // namespace

std::vector<Op> layer_ops(const Scenario& s, int layer, Phase phase) {
  const Shapes x(s);
  std::vector<Op> ops;
  const bool partitioned = s.framework.partition_activations && s.recompute_of_layer(layer) == Recompute::Full;
  const Scenario* moe = s.is_moe_layer(layer) ? &s : nullptr;
  const bool ring = s.parallel.cp > 1 && s.framework.cp_comm == CpComm::P2P;
  switch (phase) {
    case Phase::Forward:
      ops = layer_forward(x, Phase::Forward, moe, ring);
      if (partitioned) partition_checkpointed_input(x, Phase::Forward, ops);
      break;
    case Phase::Backward:
      ops = layer_backward(x, moe, ring);
      if (splits_backward(s.parallel.schedule)) ops = split_layer_backward(x, std::move(ops), moe != nullptr).input_grad;
      break;
    case Phase::WeightGrad:
      if (splits_backward(s.parallel.schedule)) ops = split_layer_backward(x, layer_backward(x, moe, ring), moe != nullptr).weight_grad;
      break;
    case Phase::Recompute:
      if (s.recompute_of_layer(layer) == Recompute::Full) ops = layer_forward(x, Phase::Recompute, moe, ring);
      if (s.recompute_of_layer(layer) == Recompute::Selective) {
        context_attention(ops, x, Phase::Recompute, ring);  // the recomputed attention exchanges its K, V again
      }
      if (partitioned) partition_checkpointed_input(x, Phase::Recompute, ops);
      break;
    case Phase::Optimizer:
      throw std::invalid_argument("layer_ops: a layer has no optimizer phase");
  }
  for (Op& op : ops) op.layer = layer;
  return ops;
}

// `layer` granularity: one TransformerLayer compute op carrying the sum of the layer's compute, then its collectives
// in their original order. With a CP ring (model/ops/context_parallel_ring.hpp) the ring's blocks and messages stay as
// they are, so that its sends still overlap its blocks: one fused op (and its collectives) for the compute before
// the ring, the ring, one for the compute after it. A compute op the host waits for (model::host_waits_for: the MoE
// dispatcher's split-size sync) closes its fused op, so that the host still waits there and is pulled back to the
// GPU's position at every MoE layer as at op granularity (fused, the wait would otherwise be lost).
std::vector<Op> fuse_layer(const std::vector<Op>& ops) {
  if (ops.empty()) return ops;
  const auto in_ring = [](const Op& op) { return op.cp_ring_step >= 0; };
  const auto first_ring = std::find_if(ops.begin(), ops.end(), in_ring);
  const auto last_ring = std::find_if(ops.rbegin(), ops.rend(), in_ring);
  const auto ring_begin = static_cast<std::size_t>(first_ring - ops.begin());
  const std::size_t ring_end = ops.size() - static_cast<std::size_t>(last_ring - ops.rbegin());
  std::vector<Op> out;
  std::vector<std::int32_t> moved(ops.size(), -1);  // each op's index in `out` (a fused compute op's: its fused op's)
  const auto take = [&](std::size_t i) {
    Op op = ops[i];
    for (std::int32_t& dep : op.deps) dep = dep >= 0 ? moved[static_cast<std::size_t>(dep)] : dep;
    moved[i] = static_cast<std::int32_t>(out.size());
    out.push_back(std::move(op));
  };
  const auto fuse_one = [&](std::size_t begin, std::size_t end) {
    const auto compute = [](const Op& op) { return op.kind == OpKind::Compute; };
    if (std::none_of(ops.begin() + static_cast<std::ptrdiff_t>(begin), ops.begin() + static_cast<std::ptrdiff_t>(end),
                     compute)) {  // collectives after the sync's fused op: no empty fused op before them
      for (std::size_t i = begin; i < end; ++i) take(i);
      return;
    }
    auto parts = std::make_shared<KernelBreakdown>();
    Op fused;
    fused.what = ComputeKind::TransformerLayer;
    fused.phase = ops[begin].phase;
    fused.layer = ops[begin].layer;
    const auto at = static_cast<std::int32_t>(out.size());
    out.push_back(fused);
    for (std::size_t i = begin; i < end; ++i) {
      if (ops[i].kind != OpKind::Compute) continue;
      out[at].flops += ops[i].flops;
      out[at].bytes += ops[i].bytes;
      parts->parts.push_back(ops[i]);
      moved[i] = at;
    }
    for (std::size_t i = begin; i < end; ++i) {
      if (ops[i].kind != OpKind::Compute) take(i);
    }
    out[at].breakdown = std::move(parts);
  };
  // [begin, end) cut after each compute op the host waits for.
  const auto fuse = [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) {
      if (i + 1 == end || (ops[i].kind == OpKind::Compute && host_waits_for(ops[i]))) {
        fuse_one(begin, i + 1);
        begin = i + 1;
      }
    }
  };
  if (first_ring == ops.end()) {
    fuse(0, ops.size());
    return out;
  }
  fuse(0, ring_begin);
  for (std::size_t i = ring_begin; i < ring_end; ++i) take(i);
  fuse(ring_end, ops.size());
  return out;
}

// The embedding's forward, or its recomputation before its backward (DeepSpeed, below).
std::vector<Op> embedding_forward(const Shapes& x, Phase phase) {
  // Vocab-parallel lookup (rows outside this rank's shard give zeros) plus position embedding, then summed across TP;
  // Megatron's embedding dropout follows (read, write, mask). Composer's MPT looks up wte and wpe in two kernels
  // (read and write each) and adds them (read two, write one).
  const double dropout = x.dropout ? 2 * x.e + 1 : 0;
  const double lookup = x.composer ? 7 * x.e : 2 * x.e;
  std::vector<Op> ops{
      elementwise(ComputeKind::Embedding, phase, (lookup + dropout) * x.tokens * x.h, x.embedding_launches(phase))};
  reduce_across_tensor(ops, x, Payload::LayerOutput, ComputeKind::Embedding, phase);
  return ops;
}

std::vector<Op> embedding_backward(const Shapes& x) {
  std::vector<Op> ops;
  gather_sequence(ops, x, Payload::OutputGrad, ComputeKind::Embedding, Phase::Backward);
  // The embedding's backward reads the gradient into the word embedding's. Composer's runs PyTorch's dense embedding
  // backward twice, for wte and wpe (embedding_dense_backward_cuda: zero-fill the table's gradient, one pass over
  // the [tokens, h] gradient, write the touched rows), then adds the tied head's gradient of wte to it (autograd's
  // out-of-place add: read two, write one).
  double bytes = 2 * x.tokens * x.h * x.e;
  if (x.composer) {
    const double tables = x.vocab_local + (x.alibi ? 0 : x.seq);
    bytes = 2 * x.tokens * x.h * x.e + 2 * tables * x.h * x.e + 3 * x.vocab_local * x.h * x.e;
  }
  ops.push_back(elementwise(ComputeKind::Embedding, Phase::Backward, bytes, x.embedding_launches(Phase::Backward)));
  return ops;
}

namespace {

// The final layer norm and the LM head's logits: their forward, or their recomputation before their backward.
std::vector<Op> head_logits(const Shapes& x, Phase phase) {
  std::vector<Op> ops;
  ops.push_back(elementwise(ComputeKind::FinalLayerNorm, phase, x.layer_norm_forward() * x.tokens_sp * x.h,
                            x.layer_norm_launches(phase)));
  gather_sequence(ops, x, Payload::LayerInput, ComputeKind::LmHead, phase);
  ops.push_back(gemm(x, ComputeKind::LmHead, phase, x.tokens, x.vocab_local, x.h));
  return ops;
}

}  // namespace

std::vector<Op> head_forward(const Shapes& x) {
  std::vector<Op> ops = head_logits(x, Phase::Forward);
  // Cross-entropy in fp32 over the rank's vocabulary shard; one all-gather of (max, sum of exp, target logit) per
  // token combines the shards.
  ops.push_back(elementwise(ComputeKind::CrossEntropy, Phase::Forward,
                            x.tokens * x.vocab_local * x.cross_entropy_forward(),
                            x.cross_entropy_launches(Phase::Forward)));
  if (x.tensor_comm) {
    ops.push_back(tensor_collective(CollectiveKind::AllGather, Payload::CrossEntropyStats, ComputeKind::CrossEntropy,
                                    Phase::Forward, x.t * x.tokens * 3 * 4));
  }
  return ops;
}

// `recompute_logits`: the final layer norm and LM head run again between the loss's backward and theirs.
std::vector<Op> head_backward(const Shapes& x, bool recompute_logits) {
  std::vector<Op> ops;
  ops.push_back(elementwise(ComputeKind::CrossEntropy, Phase::Backward,
                            x.tokens * x.vocab_local * x.cross_entropy_backward(),
                            x.cross_entropy_launches(Phase::Backward)));
  if (recompute_logits) {
    for (Op& op : head_logits(x, Phase::Recompute)) ops.push_back(std::move(op));
  }
  gather_sequence(ops, x, Payload::LayerInput, ComputeKind::LmHead, Phase::Backward);
  ops.push_back(gemm(x, ComputeKind::LmHead, Phase::Backward, x.tokens, x.vocab_local, x.h));
  reduce_across_tensor(ops, x, Payload::InputGrad, ComputeKind::LmHead, Phase::Backward);
  ops.push_back(elementwise(ComputeKind::FinalLayerNorm, Phase::Backward, x.layer_norm_backward() * x.tokens_sp * x.h,
                            x.layer_norm_launches(Phase::Backward)));
  return ops;
}

// Full recompute in DeepSpeed's pipeline engine also recomputes the model's ends. PipelineModule.forward wraps every
// `activation_checkpoint_interval` consecutive layers of the stage in a checkpoint when _is_checkpointable says so,
// and that test (deepspeed/runtime/pipe/module.py, v0.5) keeps to transformer layers only for a model class named
// 'GPT2ModelPipe'; for any other it checkpoints every layer that has parameters. Megatron-DeepSpeed's model is
// 'GPTModelPipe' (megatron/model/gpt_model.py, June 2021, interval = --checkpoint-num-layers, 1 by default), so the
// embedding on the first stage and the final layer norm and tied LM head on the last are recomputed before their
// backward, as the transformer layers are. Megatron-LM checkpoints only its transformer layers.
bool recompute_model_ends(const Scenario& s) {
  return s.framework.name == Framework::DeepSpeed && s.parallel.recompute == Recompute::Full;
}

}  // namespace twin::model

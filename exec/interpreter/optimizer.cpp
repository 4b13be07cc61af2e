// Gradient reductions, the global gradient norm, AdamW, and the parameter gathers of ZeRO-1 and ZeRO-3.
//
//   LayerNormGrads   sequence parallel: the TP-replicated parameters (layernorms, row-parallel biases) saw only the
//                    rank's sequence shard; their gradients (the bucket's prefix) are summed across TP
//   EmbeddingGrads   tied embedding with pp > 1: the word-embedding gradients of the first and last stage are summed
//   Gradients        DualPipe first (Group::MirrorStages): every bucket's gradients summed with the mirror stage's copy
//                    DP: the bucket's gradients are summed (all-reduce), or reduce-scattered under ZeRO-1 and ZeRO-3
//                    so that each DP rank holds the sum of its own shard (the loss is already a mean: a sum is the
//                    average). ZeRO-3 reduce-scatters after every micro-batch's backward, see below
//   GradNormSquared  every rank adds the squares of the gradient elements it is the one to count (its ZeRO shard, or
//                    DP rank 0; TP-replicated tensors on TP rank 0; the tied embedding on the first stage), summed
//                    over the world in f64
//   OptimizerStep    AdamW with global-norm clipping on the rank's shard, tensor by tensor (decay for matrices only)
//   Parameters       ZeRO-1: the updated shards are gathered across DP after the step; ZeRO-3: a bucket's shards are
//                    gathered before each forward and backward that reads it (and freed after, exec/shard/model_shard.hpp)
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "exec/core/check.hpp"
#include "exec/interpreter/interpreter.hpp"

namespace twin::exec {

using model::CollectiveKind;
using model::Op;

void Interpreter::reduce_layernorm_grads(const Op& op) {
  Bucket& b = shard_.bucket(op.layer, op.what);
  comm_.all_reduce(group(op.group), b.grads.data, b.replicated_prefix, b.grads.dtype, labels_[current_op_]);
}

void Interpreter::reduce_embedding_grads(const Op& op) {
  const Tensor& grad = shard_.first_stage() ? shard_.wte_grad : shard_.head_grad;  // (V/t, C)
  comm_.all_reduce(group(op.group), grad.data, grad.numel, grad.dtype, labels_[current_op_]);
}

void Interpreter::reduce_data_parallel_grads(const Op& op) {
  if (op.group == model::Group::MirrorStages) {
    sum_mirror_grads();
    return;
  }
  Bucket& b = shard_.bucket(op.layer, op.what, op.group == model::Group::ExpertData);
  if (op.collective == CollectiveKind::AllReduce) {
    comm_.all_reduce(group(op.group), b.grads.data, b.padded_numel, b.grads.dtype, labels_[current_op_]);
  } else {
    const Tensor mine = b.grads.slice(b.shard_offset, b.shard_numel);
    comm_.reduce_scatter(group(op.group), b.grads.data, mine.data, b.shard_numel, b.grads.dtype, labels_[current_op_]);
    // The rank keeps the sum of its own shard; the rest of the buffer held only its partial sums of the others', now
    // counted in their owners' shards. Under ZeRO-3 (a reduce-scatter after every micro-batch) that rest is zeroed:
    // the next micro-batch's backward accumulates only its own contribution there, and the next reduce-scatter adds
    // it to the owner's running sum (the owner's region holds S + g_owner, every other rank's copy g_rank, and their
    // sum is S + the micro-batch's whole gradient). ZeRO-1 reduce-scatters once, after the last micro-batch, and
    // nothing reads the rest before the next step zeroes every gradient: left alone, since under dp_overlap the
    // reduce-scatter may still be reading it (a device communicator defers it, exec/comm/deferred_work.hpp).
    if (!scenario_.shards_parameters()) return;
    const std::size_t end = b.shard_offset + b.shard_numel;
    if (b.shard_offset > 0) backend_.fill(b.grads.slice(0, b.shard_offset), 0.0f);
    if (end < b.padded_numel) backend_.fill(b.grads.slice(end, b.padded_numel - end), 0.0f);
  }
}

// DualPipe: the stage's whole gradient summed with its mirror's, whose buckets are the same layers and ends in another
// chunk order: bucket by bucket in the order of (kind, layer, experts), the same on both.
void Interpreter::sum_mirror_grads() {
  std::vector<Bucket*> buckets;
  for (Bucket& b : shard_.buckets()) buckets.push_back(&b);
  std::sort(buckets.begin(), buckets.end(), [](const Bucket* a, const Bucket* b) {
    return std::tuple(a->what, a->layer, a->experts) < std::tuple(b->what, b->layer, b->experts);
  });
  const CommGroup& pair = group(model::Group::MirrorStages);
  for (Bucket* b : buckets) {
    comm_.all_reduce(pair, b->grads.data, b->padded_numel, b->grads.dtype, labels_[current_op_]);
  }
}

void Interpreter::gradient_norm(const Op& op) {
  // ZeRO-1 or ZeRO-3: shards over dp (x cp); an MoE layer's routed experts: their ExpertData replicas hold the same
  // sums (ZeRO-1: each its shard)
  const bool zero = scenario_.parallel.zero_stage >= 1 && scenario_.parallel.dp * scenario_.parallel.cp > 1;
  const MoeDims& moe = shard_.moe();
  const bool expert_zero = scenario_.parallel.zero_stage >= 1 && moe.edp > 1;
  std::vector<Tensor> counted;  // summed in this order (one host read on a device)
  // DualPipe: the first half of the stages holds every block, embedding and head once; the other half their copies
  const auto& p = scenario_.parallel;
  const bool mirror_copy = p.bidirectional() && coord_.pp >= p.pp / 2;
  for (Bucket& b : shard_.buckets()) {
    if (mirror_copy) break;
    // without shards, DP rank 0's and CP rank 0's replicas
    if (b.experts ? (expert_zero || moe.edp_rank == 0) : (zero || (coord_.dp == 0 && coord_.cp == 0))) {
      const std::size_t begin = b.shard_offset, end = b.shard_offset + b.shard_numel;
      for (const ParamTensor& t : b.tensors) {
        if (t.copy || (t.tp_replicated && coord_.tp != 0)) continue;
        const std::size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
        if (hi > lo) counted.push_back(b.grads.slice(lo, hi - lo));
      }
    }
  }
  double partial = backend_.squared_norm_sum(counted);
  // skip_nonfinite: a rank that saw non-finite logits or a non-finite loss makes the world's norm NaN, so that every
  // rank skips the update (its own gradients may be finite: another stage's NaN never reached them)
  if (saw_nonfinite_) partial = std::numeric_limits<double>::quiet_NaN();
  comm_.all_reduce(group(op.group), &partial, 1, DType::F64, labels_[current_op_]);
  grad_norm_squared_ = partial;
  output_.grad_norm = std::sqrt(partial);
}

double Interpreter::learning_rate(int step) const {
  const auto& t = scenario_.training;
  if (t.warmup_steps > 0 && step < t.warmup_steps) {
    return t.learning_rate * static_cast<double>(step + 1) / static_cast<double>(t.warmup_steps);
  }
  if (t.decay_steps <= t.warmup_steps) return t.learning_rate;
  const double progress =
      std::min(1.0, static_cast<double>(step - t.warmup_steps) / static_cast<double>(t.decay_steps - t.warmup_steps));
  return t.min_learning_rate +
         0.5 * (1.0 + std::cos(3.141592653589793 * progress)) * (t.learning_rate - t.min_learning_rate);
}

void Interpreter::optimizer_step(const Op&) {
  const auto& t = scenario_.training;
  const double norm = std::sqrt(grad_norm_squared_);
  output_.learning_rate = learning_rate(input_->step);
  if (nonfinite(norm, "the gradient norm", true)) {  // before the update: NaN would reach every weight
    output_.skipped = true;                          // skip_nonfinite: weights and Adam state stay as they were
    return;
  }
  AdamWStep step;
  step.learning_rate = static_cast<float>(learning_rate(input_->step));
  step.beta1 = static_cast<float>(t.adam_beta1);
  step.beta2 = static_cast<float>(t.adam_beta2);
  step.eps = static_cast<float>(t.adam_eps);
  step.step = input_->step + 1;
  step.grad_scale = (t.grad_clip > 0 && norm > t.grad_clip) ? static_cast<float>(t.grad_clip / (norm + 1e-6)) : 1.0f;
  output_.learning_rate = step.learning_rate;
  for (Bucket& b : shard_.buckets()) {
    const std::size_t begin = b.shard_offset, end = b.shard_offset + b.shard_numel;
    for (const ParamTensor& tensor : b.tensors) {
      const std::size_t lo = std::max(begin, tensor.offset), hi = std::min(end, tensor.offset + tensor.numel);
      if (hi <= lo) continue;
      step.weight_decay = tensor.decay ? static_cast<float>(t.weight_decay) : 0.0f;
      const Tensor master = b.master.empty() ? Tensor{} : b.master.slice(lo - begin, hi - lo);
      backend_.adamw_update(b.params.slice(lo, hi - lo), master, b.grads.slice(lo, hi - lo),
                            b.adam_m.slice(lo - begin, hi - lo), b.adam_v.slice(lo - begin, hi - lo), step);
    }
  }
}

// Every rank's shard into the whole bucket, in place: after ZeRO-1's step, or before a ZeRO-3 forward or backward.
void Interpreter::gather_parameters(const Op& op) {
  Bucket& b = shard_.bucket(op.layer, op.what, op.group == model::Group::ExpertData);
  const Tensor mine = b.params.slice(b.shard_offset, b.shard_numel);
  comm_.all_gather(group(op.group), mine.data, b.params.data, b.shard_numel, b.params.dtype, labels_[current_op_]);
  b.other_shards_freed = false;
}

}  // namespace twin::exec

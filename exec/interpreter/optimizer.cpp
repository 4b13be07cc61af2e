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
//                    gathered before each forward and backward that reads it (and freed after,
//                    exec/shard/model_shard.hpp)
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "exec/core/check.hpp"
#include "exec/interpreter/optimizer.hpp"

namespace twin::exec {

using model::CollectiveKind;
using model::Op;

void Optimizer::reduce_layernorm_grads(const Op& op) {
  Bucket& b = ctx_.shard.bucket(op.layer, op.what);
  ctx_.comm.all_reduce(ctx_.group(op.group), b.grads.data, b.replicated_prefix, b.grads.dtype, ctx_.label());
}

void Optimizer::reduce_embedding_grads(const Op& op) {
  const Tensor& grad = ctx_.shard.first_stage() ? ctx_.shard.wte_grad : ctx_.shard.head_grad;  // (V/t, C)
  ctx_.comm.all_reduce(ctx_.group(op.group), grad.data, grad.numel, grad.dtype, ctx_.label());
}

void Optimizer::reduce_data_parallel_grads(const Op& op) {
  if (op.group == model::Group::MirrorStages) {
    sum_mirror_grads();
    return;
  }
  Bucket& b = ctx_.shard.bucket(op.layer, op.what, op.group == model::Group::ExpertData);
  if (op.collective == CollectiveKind::AllReduce) {
    ctx_.comm.all_reduce(ctx_.group(op.group), b.grads.data, b.padded_numel, b.grads.dtype, ctx_.label());
  } else {
    const Tensor mine = b.grads.slice(b.shard_offset, b.shard_numel);
    ctx_.comm.reduce_scatter(ctx_.group(op.group), b.grads.data, mine.data, b.shard_numel, b.grads.dtype, ctx_.label());
    // The rank keeps the sum of its own shard; the rest of the buffer held only its partial sums of the others', now
    // counted in their owners' shards. Under ZeRO-3 (a reduce-scatter after every micro-batch) that rest is zeroed:
    // the next micro-batch's backward accumulates only its own contribution there, and the next reduce-scatter adds
    // it to the owner's running sum (the owner's region holds S + g_owner, every other rank's copy g_rank, and their
    // sum is S + the micro-batch's whole gradient). ZeRO-1 reduce-scatters once, after the last micro-batch, and
    // nothing reads the rest before the next step zeroes every gradient: left alone, since under dp_overlap the
    // reduce-scatter may still be reading it (a device communicator defers it, exec/comm/deferred_work.hpp).
    if (!ctx_.scenario.shards_parameters()) return;
    const std::size_t end = b.shard_offset + b.shard_numel;
    if (b.shard_offset > 0) ctx_.backend.fill(b.grads.slice(0, b.shard_offset), 0.0f);
    if (end < b.padded_numel) ctx_.backend.fill(b.grads.slice(end, b.padded_numel - end), 0.0f);
  }
}

// DualPipe: the stage's whole gradient summed with its mirror's, whose buckets are the same layers and ends in another
// chunk order: bucket by bucket in the order of (kind, layer, experts), the same on both.
void Optimizer::sum_mirror_grads() {
  std::vector<Bucket*> buckets;
  for (Bucket& b : ctx_.shard.buckets()) buckets.push_back(&b);
  std::sort(buckets.begin(), buckets.end(), [](const Bucket* a, const Bucket* b) {
    return std::tuple(a->what, a->layer, a->experts) < std::tuple(b->what, b->layer, b->experts);
  });
  const CommGroup& pair = ctx_.group(model::Group::MirrorStages);
  for (Bucket* b : buckets) {
    ctx_.comm.all_reduce(pair, b->grads.data, b->padded_numel, b->grads.dtype, ctx_.label());
  }
}

void Optimizer::gradient_norm(const Op& op) {
  // ZeRO-1 or ZeRO-3: shards over dp (x cp); an MoE layer's routed experts: their ExpertData replicas hold the same
  // sums (ZeRO-1: each its shard)
  const bool zero = ctx_.scenario.parallel.zero_stage >= 1 && ctx_.scenario.parallel.dp * ctx_.scenario.parallel.cp > 1;
  const MoeDims& moe = ctx_.shard.moe();
  const bool expert_zero = ctx_.scenario.parallel.zero_stage >= 1 && moe.edp > 1;
  std::vector<Tensor> counted;  // summed in this order (one host read on a device)
  // DualPipe: the first half of the stages holds every block, embedding and head once; the other half their copies
  const auto& p = ctx_.scenario.parallel;
  const bool mirror_copy = p.bidirectional() && ctx_.coord.pp >= p.pp / 2;
  for (Bucket& b : ctx_.shard.buckets()) {
    if (mirror_copy) break;
    // without shards, DP rank 0's and CP rank 0's replicas
    if (b.experts ? (expert_zero || moe.edp_rank == 0) : (zero || (ctx_.coord.dp == 0 && ctx_.coord.cp == 0))) {
      const std::size_t begin = b.shard_offset, end = b.shard_offset + b.shard_numel;
      for (const ParamTensor& t : b.tensors) {
        if (t.copy || (t.tp_replicated && ctx_.coord.tp != 0)) continue;
        const std::size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
        if (hi > lo) counted.push_back(b.grads.slice(lo, hi - lo));
      }
    }
  }
  double partial = ctx_.backend.squared_norm_sum(counted);
  // skip_nonfinite: a rank that saw non-finite logits or a non-finite loss makes the world's norm NaN, so that every
  // rank skips the update (its own gradients may be finite: another stage's NaN never reached them)
  if (ctx_.saw_nonfinite) partial = std::numeric_limits<double>::quiet_NaN();
  ctx_.comm.all_reduce(ctx_.group(op.group), &partial, 1, DType::F64, ctx_.label());
  grad_norm_squared_ = partial;
  ctx_.output.grad_norm = std::sqrt(partial);
}

double Optimizer::learning_rate(int iteration) const {
  const auto& t = ctx_.scenario.training;
  if (t.warmup_steps > 0 && iteration < t.warmup_steps) {
    return t.learning_rate * static_cast<double>(iteration + 1) / static_cast<double>(t.warmup_steps);
  }
  if (t.decay_steps <= t.warmup_steps) return t.learning_rate;
  const double progress = std::min(
      1.0, static_cast<double>(iteration - t.warmup_steps) / static_cast<double>(t.decay_steps - t.warmup_steps));
  return t.min_learning_rate +
         0.5 * (1.0 + std::cos(3.141592653589793 * progress)) * (t.learning_rate - t.min_learning_rate);
}

void Optimizer::step(const Op&) {
  const auto& t = ctx_.scenario.training;
  const double norm = std::sqrt(grad_norm_squared_);
  ctx_.output.learning_rate = learning_rate(ctx_.input().step);
  if (ctx_.nonfinite(norm, "the gradient norm", true)) {  // before the update: NaN would reach every weight
    ctx_.output.skipped = true;                           // skip_nonfinite: weights and Adam state stay as they were
    return;
  }
  AdamWStep adamw;
  adamw.learning_rate = static_cast<float>(learning_rate(ctx_.input().step));
  adamw.beta1 = static_cast<float>(t.adam_beta1);
  adamw.beta2 = static_cast<float>(t.adam_beta2);
  adamw.eps = static_cast<float>(t.adam_eps);
  adamw.step = ctx_.input().step + 1;
  adamw.grad_scale = (t.grad_clip > 0 && norm > t.grad_clip) ? static_cast<float>(t.grad_clip / (norm + 1e-6)) : 1.0f;
  ctx_.output.learning_rate = adamw.learning_rate;
  for (Bucket& b : ctx_.shard.buckets()) {
    const std::size_t begin = b.shard_offset, end = b.shard_offset + b.shard_numel;
    for (const ParamTensor& tensor : b.tensors) {
      const std::size_t lo = std::max(begin, tensor.offset), hi = std::min(end, tensor.offset + tensor.numel);
      if (hi <= lo) continue;
      adamw.weight_decay = tensor.decay ? static_cast<float>(t.weight_decay) : 0.0f;
      const Tensor master = b.master.empty() ? Tensor{} : b.master.slice(lo - begin, hi - lo);
      ctx_.backend.adamw_update(b.params.slice(lo, hi - lo), master, b.grads.slice(lo, hi - lo),
                                b.adam_m.slice(lo - begin, hi - lo), b.adam_v.slice(lo - begin, hi - lo), adamw);
    }
  }
}

// Every rank's shard into the whole bucket, in place: after ZeRO-1's step, or before a ZeRO-3 forward or backward.
void Optimizer::gather_parameters(const Op& op) {
  Bucket& b = ctx_.shard.bucket(op.layer, op.what, op.group == model::Group::ExpertData);
  const Tensor mine = b.params.slice(b.shard_offset, b.shard_numel);
  ctx_.comm.all_gather(ctx_.group(op.group), mine.data, b.params.data, b.shard_numel, b.params.dtype, ctx_.label());
  b.other_shards_freed = false;
}

}  // namespace twin::exec

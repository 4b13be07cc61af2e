#include <utility>

#include "model/ops/compute_ops.hpp"
#include "model/ops/moe_ops.hpp"
#include "model/ops/optimizer_traffic.hpp"
#include "model/program/estimates.hpp"
#include "model/program/stage_builder.hpp"

namespace twin::model {

// ZeRO-3: PyTorch FSDP's FULL_SHARD as PyTorch 1.13 runs it under Composer (torch/distributed/fsdp/
// fully_sharded_data_parallel.py: _unshard, _reshard, _FreeEventQueue; composer/trainer/dist_strategy.py):
// one FSDP unit per transformer block plus the root (embeddings, final layer norm); a unit's parameters are
// all-gathered in the model dtype before its forward and again before its backward, freed after each, and its
// gradient is reduce-scattered in the model dtype after every micro-batch's backward. With limit_all_gathers the
// CPU issues an all-gather only once at most 2 freed units are still pending: the oldest free (a compute op) is a
// dependency of the gather (_max_num_inflight_all_gathers = 2). Gathers and reduce-scatters share one NCCL
// stream (here the DataParallel stream, in issue order).

int StageBuilder::fsdp_gather(int layer, ComputeKind what, double parameters, Phase phase, const PipelineStep& step) {
  Op op = gradient_op(CollectiveKind::AllGather, data_group_, Payload::Parameters, what, parameters * x_.e,
                      Stream::DataParallel);
  op.phase = phase;
  op.layer = layer;
  op.micro_batch = step.micro_batch;
  if (free_events_.size() >= 2) {
    op.deps.push_back(free_events_.front());
    free_events_.pop_front();
  }
  return emit(std::move(op));
}

void StageBuilder::fsdp_free(int after_op) {
  ops_[static_cast<std::size_t>(after_op)].frees_parameters = true;
  free_events_.push_back(after_op);
}

void StageBuilder::fsdp_reduce(int layer, ComputeKind what, double parameters, int producer, const PipelineStep& step) {
  Op op = gradient_op(CollectiveKind::ReduceScatter, data_group_, Payload::Gradients, what, parameters * x_.e,
                      Stream::DataParallel);
  op.layer = layer;
  op.micro_batch = step.micro_batch;
  op.deps.push_back(producer);
  last_reduce_ = emit(std::move(op));
  if (step.micro_batch == 0) buckets_.push_back({layer, what, parameters, last_reduce_});
}

// Bytes the distributed optimizer all-gathers for a bucket of `parameters`: the model dtype, but with
// framework.fp8_param_gather the GEMM weights in FP8, one byte each (Megatron-Core's param buffer holds their FP8
// data); the embedding, the LM head and the norms stay 16-bit. `layer` -1 with `experts`: a bucket of routed experts
// alone; else the layer's dense parameters, and its routed experts with them when `experts`.
double StageBuilder::gather_bytes(int layer, ComputeKind what, double parameters, bool experts) const {
  if (!s_.framework.fp8_param_gather || what != ComputeKind::TransformerLayer) return parameters * x_.e;
  const double fp8 = (layer >= 0 ? layer_fp8_weights_per_gpu(s_, layer) : 0) +
                     (experts ? expert_parameters_per_gpu(s_) : 0);
  return parameters * x_.e - fp8 * (x_.e - 1);
}

// ZeRO-2 (parallel.zero_stage = 2): a micro-batch's gradient of a layer (or of a model end) is reduce-scattered into
// the rank's shard once its backward is done, on the data-parallel stream, in the gradients' reduction dtype; the
// chunk's last micro-batch reduces as ZeRO-1 does (synchronize_bucket), so the optimizer's buckets stay one per layer.
// Sharded gradients cannot wait for the accumulation to end: FSDP with gradient accumulation reduce-scatters every
// micro-batch unless it keeps the whole gradient (no_sync), which ZeRO-2 exists to avoid.
void StageBuilder::reduce_micro_batch_gradients(int layer, ComputeKind what, double parameters, int producer,
                                                const PipelineStep& step) {
  Op op = gradient_op(CollectiveKind::ReduceScatter, data_group_, Payload::Gradients, what,
                      parameters * grad_reduce_bytes_, Stream::DataParallel);
  op.layer = layer;
  op.micro_batch = step.micro_batch;
  op.deps.push_back(producer);
  emit(std::move(op));
}

// Parameters of the bucket at an end of the model on this rank: the embedding's (its word-embedding shard and the
// position embedding), or the head's (the final layer norm, and the LM head's weight when it is untied or the last
// stage's copy of the tied one). FSDP's root unit is both, on its one stage.
double StageBuilder::end_bucket_parameters(ComputeKind what) const {
  const double word_embedding_shard = d(s_.padded_vocab()) / x_.t * x_.h;
  if (what == ComputeKind::Embedding) return word_embedding_shard + position_embedding_parameters(s_);
  const bool own_head = !s_.framework.tied_embeddings || s_.parallel.ends_apart();
  return 2 * x_.h + (own_head ? word_embedding_shard : 0);
}

Op StageBuilder::gradient_op(CollectiveKind kind, Group group, Payload payload, ComputeKind what, double bytes,
                             Stream stream) const {
  Op op;
  op.kind = OpKind::Collective;
  op.collective = kind;
  op.group = group;
  op.payload = payload;
  op.what = what;
  op.phase = payload == Payload::Parameters ? Phase::Optimizer : Phase::Backward;
  op.stream = stream;
  op.bytes = bytes;
  return op;
}

// A bucket's gradients are final: sum the sequence-parallel replicated parameters across TP, then reduce across
// DP: all-reduce, or reduce-scatter under ZeRO-1. DeepSpeed's ZeRO-1 (v0.5: stage 1 runs runtime/zero/stage2.py
// with contiguous_gradients forced off, so reduce_ipg_grads takes buffered_reduce_fallback, and allreduce_bucket
// sets rank = None) all-reduces the whole gradient and each rank then updates its own partition.
void StageBuilder::synchronize_bucket(int layer, ComputeKind what, double parameters,
                                      double sequence_parallel_parameters) {
  const bool overlapped = s_.parallel.dp_overlap;
  const Stream dp_stream = overlapped ? Stream::DataParallel : Stream::Compute;
  if (x_.sequence_parallel && sequence_parallel_parameters > 0) {
    Op op = gradient_op(CollectiveKind::AllReduce, Group::Tensor, Payload::LayerNormGrads, what,
                        sequence_parallel_parameters * 4, Stream::Compute);
    op.layer = layer;
    emit(std::move(op));
  }
  if (dp_ > 1) {
    const bool scatter = s_.parallel.zero_stage >= 1 && s_.framework.name != Framework::DeepSpeed;
    const auto kind = scatter ? CollectiveKind::ReduceScatter : CollectiveKind::AllReduce;
    Op op = gradient_op(kind, data_group_, Payload::Gradients, what, parameters * grad_reduce_bytes_, dp_stream);
    op.layer = layer;
    if (overlapped) op.deps.push_back(static_cast<int>(ops_.size()) - 1);
    buckets_.push_back({layer, what, parameters, emit(std::move(op)), data_group_});
  } else {
    buckets_.push_back({layer, what, parameters, -1, data_group_});
  }
}

void StageBuilder::synchronize_layer_gradients(int layer) {
  // Sequence-parallel replicated parameters: 2 layernorms (weight, bias) and the 2 row-parallel biases.
  synchronize_bucket(layer, ComputeKind::TransformerLayer, layer_dense_parameters_per_gpu(s_, layer), 6 * x_.h);
  if (s_.is_moe_layer(layer)) synchronize_expert_gradients(layer);
}

// A Mixture-of-Experts layer's routed experts: their gradients reduce over the ranks holding the same expert shards,
// the expert-data-parallel group (Megatron-Core's expert_data_parallel_group, tp x cp x dp / (ep x etp) ranks), as
// the dense ones over DP: all-reduce, or reduce-scatter under ZeRO-1 (its distributed optimizer shards them there).
void StageBuilder::synchronize_expert_gradients(int layer) {
  const double parameters = expert_parameters_per_gpu(s_);
  const int edp = static_cast<int>(s_.parallel.tp * s_.parallel.cp * s_.parallel.dp / (s_.parallel.ep * s_.parallel.etp));
  if (edp <= 1) {
    buckets_.push_back({layer, ComputeKind::TransformerLayer, parameters, -1, Group::ExpertData});
    return;
  }
  const bool overlapped = s_.parallel.dp_overlap;
  const auto kind = s_.parallel.zero_stage >= 1 ? CollectiveKind::ReduceScatter : CollectiveKind::AllReduce;
  Op op = gradient_op(kind, Group::ExpertData, Payload::Gradients, ComputeKind::TransformerLayer,
                      parameters * grad_reduce_bytes_, overlapped ? Stream::DataParallel : Stream::Compute);
  op.layer = layer;
  if (overlapped) op.deps.push_back(static_cast<int>(ops_.size()) - 1);
  buckets_.push_back({layer, ComputeKind::TransformerLayer, parameters, emit(std::move(op)), Group::ExpertData});
}

// DualPipe: this stage's chunk 0 holds the layers of its mirror stage's chunk 1 and the reverse, and both end stages
// an embedding and a head: each parameter lives on the two stages, each copy's gradient from one direction's
// micro-batches. One all-reduce of the stage's whole gradient over the pair sums them before the DP reductions, as
// DeepSeek's example sums them after DualPipe.step (deepseek-ai/DualPipe at 3da1bbe, examples/example_dualpipe.py).
void StageBuilder::sum_mirror_gradients() {
  double parameters = 0;
  for (int chunk = 0; chunk < chunks_; ++chunk) {
    for (int layer = first_layer(chunk); layer < first_layer(chunk) + layers_in(chunk); ++layer) {
      parameters += layer_dense_parameters_per_gpu(s_, layer);
      if (s_.is_moe_layer(layer)) parameters += expert_parameters_per_gpu(s_);
    }
  }
  if (s_.parallel.holds_embedding(stage_)) parameters += end_bucket_parameters(ComputeKind::Embedding);
  if (s_.parallel.holds_head(stage_)) parameters += end_bucket_parameters(ComputeKind::LmHead);
  emit(gradient_op(CollectiveKind::AllReduce, Group::MirrorStages, Payload::Gradients, ComputeKind::TransformerLayer,
                   parameters * grad_reduce_bytes_, Stream::Compute));
}

void StageBuilder::finish_iteration() {
  if (zero3_) {
    finish_sharded_iteration();
    return;
  }
  if (s_.parallel.bidirectional()) sum_mirror_gradients();
  for (int layer : deferred_layers_) synchronize_layer_gradients(layer);
  const bool first = s_.parallel.holds_embedding(stage_), last = s_.parallel.holds_head(stage_);
  const double word_embedding_shard = d(s_.padded_vocab()) / x_.t * x_.h;
  const bool tied_copy = s_.framework.tied_embeddings && s_.parallel.ends_apart();
  if (tied_copy && (first || last)) {
    emit(gradient_op(CollectiveKind::AllReduce, Group::Embedding, Payload::EmbeddingGrads,
                     first ? ComputeKind::Embedding : ComputeKind::LmHead, word_embedding_shard * tied_reduce_bytes_,
                     Stream::Compute));
  }
  if (first) synchronize_bucket(-1, ComputeKind::Embedding, end_bucket_parameters(ComputeKind::Embedding), 0);
  if (last) synchronize_bucket(-1, ComputeKind::LmHead, end_bucket_parameters(ComputeKind::LmHead), 2 * x_.h);

  // Gradient clipping needs the global norm: every rank contributes its partial sum of squares.
  Op norm = gradient_op(CollectiveKind::AllReduce, Group::World, Payload::GradNormSquared, ComputeKind::OptimizerStep,
                        4, Stream::Compute);
  for (const auto& bucket : buckets_) {
    if (bucket.op >= 0 && ops_[bucket.op].stream != Stream::Compute) norm.deps.push_back(bucket.op);
  }
  emit(std::move(norm));

  double local_parameters = 0, expert_parameters = 0;
  for (const auto& bucket : buckets_)
    (bucket.group == Group::ExpertData ? expert_parameters : local_parameters) += bucket.parameters;
  const bool zero = s_.parallel.zero_stage >= 1 && dp_ > 1;
  Op step = optimizer_step_op(s_, local_parameters, dp_, zero);
  if (expert_parameters > 0) {  // sharded over the expert-data-parallel ranks under ZeRO-1
    const int edp = static_cast<int>(s_.parallel.tp * s_.parallel.cp * s_.parallel.dp / (s_.parallel.ep * s_.parallel.etp));
    add_stream_bytes(step, optimizer_step_bytes(s_, expert_parameters, edp, s_.parallel.zero_stage >= 1 && edp > 1));
  }
  const int step_index = emit(std::move(step));

  if (zero && !gathers_under_forward_) {
    const Stream stream = s_.parallel.dp_overlap ? Stream::DataParallel : Stream::Compute;
    for (const auto& bucket : buckets_) {
      if (bucket.group == Group::ExpertData && bucket.op < 0) continue;  // one expert-data-parallel rank: its own
      const bool experts = bucket.group == Group::ExpertData;
      Op op = gradient_op(CollectiveKind::AllGather, bucket.group, Payload::Parameters, bucket.what,
                          experts ? gather_bytes(-1, bucket.what, bucket.parameters, true)
                                  : gather_bytes(bucket.layer, bucket.what, bucket.parameters, false),
                          stream);
      op.layer = bucket.layer;
      op.deps.push_back(step_index);
      emit(std::move(op));
    }
  }
}

// ZeRO-3: the gradients are reduced already (the last reduce-scatter of the last micro-batch; the root's
// _wait_for_post_backward made the compute stream wait for all of them); the norm for clipping over every shard,
// then each rank steps its own shards. Nothing is gathered after the step: the next forward gathers.
void StageBuilder::finish_sharded_iteration() {
  Op norm = gradient_op(CollectiveKind::AllReduce, Group::World, Payload::GradNormSquared, ComputeKind::OptimizerStep,
                        4, Stream::Compute);
  if (last_reduce_ >= 0) norm.deps.push_back(last_reduce_);
  emit(std::move(norm));
  double local_parameters = 0;
  for (const auto& bucket : buckets_) local_parameters += bucket.parameters;
  emit(optimizer_step_op(s_, local_parameters, dp_, true));
}

}  // namespace twin::model

#include "model/program/stage_builder.hpp"

#include <utility>

#include "model/ops/compute_ops.hpp"
#include "model/ops/layer_ops.hpp"
#include "model/ops/moe_ops.hpp"
#include "model/program/estimates.hpp"

namespace twin::model {

StageBuilder::StageBuilder(const Scenario& s, Granularity granularity, const StageSchedule& schedule, int stage)
    : s_(s), x_(s), granularity_(granularity), schedule_(schedule), stage_(stage) {
  stages_ = static_cast<int>(s.parallel.pp);
  chunks_ = static_cast<int>(s.parallel.virtual_stages);
  // Dense gradients reduce over DP x CP (Megatron-Core's "dp-cp" group: each CP rank saw its part of the same
  // sequences); the distributed optimizer shards over it too.
  dp_ = static_cast<int>(s.parallel.dp * s.parallel.cp);
  data_group_ = s.parallel.cp > 1 ? Group::DataWithContext : Group::Data;
  // Megatron-LM reduces gradients in fp32 for bf16 training (it sets accumulate_allreduce_grads_in_fp32 with
  // --bf16), in the model dtype otherwise. DeepSpeed reduces them in the model dtype: v0.5's ZeRO-1
  // (runtime/zero/stage2.py, allreduce_bucket) converts to fp32 only under allreduce_always_fp32, off by default.
  // Composer's DDP reduces the fp32 gradients of its fp32 parameters (autocast); its FSDP reduce-scatters in the
  // model dtype (fsdp_reduce).
  // framework.grad_reduce_in_fp32 = false keeps Megatron's bf16 gradients in bf16 (Megatron-Core's own default).
  const bool fp32_reduction = (s.framework.name == Framework::Megatron && s.model.dtype == DType::BF16 &&
                               s.framework.grad_reduce_in_fp32) ||
                              s.framework.name == Framework::Composer;
  grad_reduce_bytes_ = fp32_reduction ? 4.0 : dtype_bytes(s.model.dtype);
  // DeepSpeed's BF16_Optimizer all-reduces the tied weight's fp32 gradient (weight._hp_grad, pipe/engine.py).
  tied_reduce_bytes_ = s.framework.bf16_optimizer ? 4.0 : grad_reduce_bytes_;
  zero3_ = s.shards_parameters();
  zero2_ = s.parallel.zero_stage == 2 && dp_ > 1;
  gathers_under_forward_ = s.parallel.overlap_param_gather && s.parallel.zero_stage >= 1 && dp_ > 1 && !zero3_;
  combined_ = s.framework.moe_a2a_overlap && !zero3_;
  overlapped_pairs_ = overlaps_pairs(s) && !zero3_;
  last_backward_.assign(chunks_, -1);
  last_weight_grad_.assign(chunks_, -1);
  for (int i = 0; i < static_cast<int>(schedule.size()); ++i) {
    if (schedule[i].pass == Pass::Backward) last_backward_[schedule[i].chunk] = i;
    if (schedule[i].pass == Pass::WeightGrad) last_weight_grad_[schedule[i].chunk] = i;
  }
  split_backward_ = splits_backward(s.parallel.schedule);
}

std::vector<Op> StageBuilder::build() {
  if (gathers_under_forward_ && s_.parallel.schedule == ScheduleKind::Interleaved) dispatch_aligned_gathers();
  // The combined 1F1B merges the steady state's pairs only: forward warmup + k with backward k (a schedule whose
  // warm-up is all its forwards has none).
  const std::vector<bool> pairs = combined_pair_forwards(s_, schedule_, stage_);
  for (int i = 0; i < static_cast<int>(schedule_.size()); ++i) {
    const PipelineStep& step = schedule_[i];
    // The first forward of a chunk waits for its parameter gathers (ParameterGathers): always a warm-up step, alone.
    const bool gathers = gathers_under_forward_ && step.pass == Pass::Forward &&
                         step.micro_batch == s_.parallel.first_micro_batch(step.chunk);
    if (overlapped_pairs_ && step.overlapped && !gathers) {
      // DualPipeV's F&B pair, merged layer by layer as the combined 1F1B's pairs are (overlaps_pairs).
      const int b = i + 1;
      combined_step(&step, &schedule_[b], b == last_backward_[schedule_[b].chunk]);
      i = b;
      continue;
    }
    if (combined_ && !gathers) {
      const bool pair = pairs[static_cast<std::size_t>(i)];
      const PipelineStep* forward = step.pass == Pass::Forward ? &step : nullptr;
      const int b = pair ? i + 1 : i;
      const PipelineStep* backward = schedule_[b].pass == Pass::Backward ? &schedule_[b] : nullptr;
      combined_step(forward, backward, backward != nullptr && b == last_backward_[backward->chunk]);
      i = b;
      continue;
    }
    if (step.pass == Pass::Forward) {
      forward_step(step);
    } else if (step.pass == Pass::WeightGrad) {
      weight_grad_step(step, i == last_weight_grad_[step.chunk]);
    } else {
      backward_step(step, i == last_backward_[step.chunk]);
    }
  }
  finish_iteration();
  return std::move(ops_);
}

int StageBuilder::emit(Op op) {
  ops_.push_back(std::move(op));
  return static_cast<int>(ops_.size()) - 1;
}

void StageBuilder::emit_all(std::vector<Op> ops, const PipelineStep& step, int& wait_for) {
  // An op's deps inside `ops` are indices into it; -1 the op emitted before its first (model/context_parallel_ring).
  const int base = static_cast<int>(ops_.size());
  for (Op& op : ops) {
    for (std::int32_t& dep : op.deps) dep += base;
    std::erase_if(op.deps, [](std::int32_t dep) { return dep < 0; });
    op.micro_batch = step.micro_batch;
    op.chunk = step.chunk;
    if (wait_for >= 0) {
      op.deps.push_back(wait_for);
      wait_for = -1;
    }
    if (pending_gather_ >= 0) {
      op.deps.push_back(pending_gather_);
      pending_gather_ = -1;
    }
    emit(std::move(op));
  }
}

void StageBuilder::emit_layer(int layer, Phase phase, const PipelineStep& step, int& wait_for) {
  auto [it, created] = layer_ops_.try_emplace({layer, phase});
  if (created) {
    it->second = layer_ops(s_, layer, phase);
    if (granularity_ == Granularity::Layer) it->second = fuse_layer(it->second);
  }
  emit_all(it->second, step, wait_for);
}

// Transformer Engine's delayed scaling reduces the amaxes of every FP8 tensor of an fp8_autocast region to their
// maximum when the region ends (reduce_and_update_fp8_tensors: one all-reduce of one fp32 per tensor), over the amax
// reduction group, TP x DP x CP (parallel_state.get_amax_reduction_group); Megatron-Core's region is a model chunk's
// forward, and its backward. Forward the input, weight and output amaxes of the four GEMMs of each layer, backward
// the output gradient's and input gradient's. One op per region, whose group is the group's DP part when there are
// DP replicas or CP ranks (DataWithContext under CP: Megatron-Core builds the group with_context_parallel=True,
// megatron/core/fp8_utils.py get_fp8_context, since a CP rank's amaxes are those of its chunks of each sequence; its
// TP part rides on NVLink inside a node) and its TP part otherwise (a group of one: nothing to time, but the point
// where the region's scales are updated); the executor reduces over TP and that group.
void StageBuilder::reduce_fp8_amaxes(int layers, Phase phase, const PipelineStep& step, int& wait_for) {
  if (s_.model.fp8 == Fp8Format::None || s_.framework.fp8_recipe != Fp8Recipe::Delayed || layers <= 0) return;
  Op op = tensor_collective(CollectiveKind::AllReduce, Payload::Fp8Amax, ComputeKind::TransformerLayer, phase,
                            4.0 * (phase == Phase::Forward ? 3 : 2) * 4 * layers);
  if (dp_ > 1) op.group = data_group_;
  emit_all({op}, step, wait_for);
}

// The V's turn (virtual stages pp - 1 and pp, both on the last stage) passes the activation and its gradient within
// the stage: no message, and the chunk's step follows the other chunk's in the stage's order.
int StageBuilder::recv(const PipelineStep& step, int from_virtual_stage, Phase phase) {
  const int peer = static_cast<int>(s_.parallel.stage_of_virtual_stage(from_virtual_stage));
  if (peer == stage_) return -1;
  Op op;
  op.kind = OpKind::Recv;
  op.stream = Stream::Pipeline;
  op.phase = phase;
  op.micro_batch = step.micro_batch;
  op.chunk = step.chunk;
  op.peer_stage = peer;
  op.tag_virtual_stage = from_virtual_stage;
  op.bytes = x_.tokens_sp * x_.h * x_.e;
  return emit(std::move(op));
}

void StageBuilder::send(const PipelineStep& step, int my_virtual_stage, int to_virtual_stage, Phase phase,
                        int producer) {
  const int peer = static_cast<int>(s_.parallel.stage_of_virtual_stage(to_virtual_stage));
  if (peer == stage_) return;
  Op op;
  op.kind = OpKind::Send;
  op.stream = Stream::Pipeline;
  op.phase = phase;
  op.micro_batch = step.micro_batch;
  op.chunk = step.chunk;
  op.peer_stage = peer;
  op.tag_virtual_stage = my_virtual_stage;
  op.bytes = x_.tokens_sp * x_.h * x_.e;
  op.deps.push_back(producer);
  emit(std::move(op));
}

int StageBuilder::first_layer(int chunk) const {
  return static_cast<int>(s_.first_layer_of_virtual_stage(vs_of(chunk)));
}

int StageBuilder::layers_in(int chunk) const {
  return static_cast<int>(s_.layers_in_virtual_stage(vs_of(chunk)));
}

// parallel.overlap_param_gather (Megatron-Core's --overlap-param-gather): after the optimizer step the updated
// parameters are not gathered at once; the iteration's first forward of a bucket (micro-batch 0 of its chunk)
// waits for the bucket's all-gather (distributed_data_parallel.py, the forward pre-hook). When the gathers are
// dispatched (megatron/core/distributed/param_and_grad_buffer.py, finish_param_sync; pipeline_parallel/
// schedules.py; training/arguments.py):
//   1F1B and GPipe (align_param_gather is forced off): each stage on its own. The first bucket's gather is
//     dispatched by its own forward (after the Recv), so it is exposed; waiting for bucket k's dispatches bucket
//     k + 1's, which starts once the forward before bucket k's has ended and bucket k's gather is done (the
//     DataParallel stream is ordered).
//   interleaved (align_param_gather, on by default): every stage dispatches the gathers of its first two chunks
//     at the start of the schedule, and each later chunk's a few micro-batches ahead of it; twin dispatches them
//     all at the start, which hides a later chunk's gathers at least as well as Megatron's timing does.
// A chunk's buckets in forward order: the embedding (first virtual stage), its layers, the head (last one).
std::vector<StageBuilder::GatherBucket> StageBuilder::gather_buckets(int chunk) const {
  const int vs = vs_of(chunk);
  std::vector<GatherBucket> buckets;
  if (starts_route(vs)) {
    buckets.push_back({-1, ComputeKind::Embedding, end_bucket_parameters(ComputeKind::Embedding)});
  }
  for (int layer = first_layer(chunk); layer < first_layer(chunk) + layers_in(chunk); ++layer) {
    // an MoE layer's routed experts gathered with it (over the expert-data-parallel ranks in Megatron-Core)
    buckets.push_back(
        {layer, ComputeKind::TransformerLayer,
         layer_dense_parameters_per_gpu(s_, layer) + (s_.is_moe_layer(layer) ? expert_parameters_per_gpu(s_) : 0)});
  }
  if (ends_route(vs)) {
    buckets.push_back({-1, ComputeKind::LmHead, end_bucket_parameters(ComputeKind::LmHead)});
  }
  return buckets;
}

int StageBuilder::parameter_gather(const GatherBucket& bucket, int chunk, int after) {
  Op op = gradient_op(CollectiveKind::AllGather, data_group_, Payload::Parameters, bucket.what,
                      gather_bytes(bucket.layer, bucket.what, bucket.parameters, s_.is_moe_layer(bucket.layer)),
                      Stream::DataParallel);
  op.phase = Phase::Forward;
  op.layer = bucket.layer;
  op.micro_batch = 0;
  op.chunk = chunk;
  if (after >= 0) op.deps.push_back(after);
  return emit(std::move(op));
}

// The interleaved schedule's: every chunk's gathers at the start of the stage's ops.
void StageBuilder::dispatch_aligned_gathers() {
  for (int chunk = 0; chunk < chunks_; ++chunk) {
    std::vector<int> ops;
    for (const GatherBucket& bucket : gather_buckets(chunk)) ops.push_back(parameter_gather(bucket, chunk, -1));
    aligned_gathers_.push_back(std::move(ops));
  }
}

// One forward step's view of them: before each bucket's forward, the gather it waits for (pending_gather_, taken
// by the bucket's first op) and, without alignment, the next bucket's dispatch.
class StageBuilder::ParameterGathers {
 public:
  ParameterGathers(StageBuilder& b, const PipelineStep& step) : b_(b), chunk_(step.chunk) {
    if (!b.gathers_under_forward_ || step.micro_batch != b.s_.parallel.first_micro_batch(step.chunk)) return;
    buckets_ = b.gather_buckets(chunk_);
    if (!b.aligned_gathers_.empty()) gathers_ = b.aligned_gathers_[static_cast<std::size_t>(chunk_)];
  }
  void before_bucket(int wait_for) {
    if (next_ >= buckets_.size()) return;
    const bool aligned = !b_.aligned_gathers_.empty();
    if (!aligned) {
      if (next_ == 0) gathers_.push_back(b_.parameter_gather(buckets_[0], chunk_, wait_for));
      if (next_ + 1 < buckets_.size()) {
        gathers_.push_back(b_.parameter_gather(buckets_[next_ + 1], chunk_, next_ == 0 ? -1 : b_.last_op()));
      }
    }
    b_.pending_gather_ = gathers_[next_];
    ++next_;
  }

 private:
  StageBuilder& b_;
  int chunk_;
  std::vector<GatherBucket> buckets_;
  std::vector<int> gathers_;
  std::size_t next_ = 0;
};

void StageBuilder::forward_step(const PipelineStep& step) {
  const int vs = vs_of(step.chunk);
  int wait_for = !starts_route(vs) ? recv(step, vs - 1, Phase::Forward) : -1;
  if (zero3_) {
    // FSDP's root unit (the embeddings and the final layer norm) is gathered at the start of every micro-batch
    // and stays so through its backward; the DataParallel stream's order puts this after the previous
    // micro-batch's reduce-scatters, which the root's backward made the compute stream wait for.
    fsdp_gather(-1, ComputeKind::Embedding, end_bucket_parameters(ComputeKind::Embedding), Phase::Forward, step);
    wait_for = fsdp_gather(-1, ComputeKind::LmHead, end_bucket_parameters(ComputeKind::LmHead), Phase::Forward, step);
  }
  const int first = first_layer(step.chunk), end = first + layers_in(step.chunk);
  ParameterGathers gathers(*this, step);
  if (starts_route(vs)) {
    gathers.before_bucket(wait_for);
    emit_all(embedding_forward(x_), step, wait_for);
  }
  for (int layer = first; layer < end; ++layer) {
    if (zero3_)
      wait_for = fsdp_gather(layer, ComputeKind::TransformerLayer, layer_parameters_per_gpu(s_), Phase::Forward, step);
    gathers.before_bucket(wait_for);
    emit_layer(layer, Phase::Forward, step, wait_for);
    if (zero3_) fsdp_free(last_op());  // FULL_SHARD reshards a block after its forward
  }
  reduce_fp8_amaxes(end - first, Phase::Forward, step, wait_for);
  if (ends_route(vs)) {
    gathers.before_bucket(wait_for);
    emit_all(head_forward(x_), step, wait_for);
  } else {
    send(step, vs, vs + 1, Phase::Forward, last_op());
  }
}

void StageBuilder::backward_step(const PipelineStep& step, bool last_backward_of_chunk) {
  const int vs = vs_of(step.chunk);
  int wait_for = !ends_route(vs) ? recv(step, vs + 1, Phase::Backward) : -1;
  if (ends_route(vs)) emit_all(head_backward(x_, recompute_model_ends(s_)), step, wait_for);
  int gradient_producer = last_op();
  const int first = first_layer(step.chunk);
  const int last = first + layers_in(step.chunk) - 1;
  int prefetched = -1;  // FSDP: the all-gather of the next block in backward order, issued by the previous one
  for (int layer = last; layer >= first; --layer) {
    if (zero3_) {
      // The last block's parameters are gathered in its own pre-backward hook; every other block's was
      // prefetched in the post-backward hook of the block after it (Composer's BACKWARD_POST).
      wait_for = layer == last ? fsdp_gather(layer, ComputeKind::TransformerLayer, layer_parameters_per_gpu(s_),
                                             Phase::Backward, step)
                               : prefetched;
    }
    emit_layer(layer, Phase::Recompute, step, wait_for);
    emit_layer(layer, Phase::Backward, step, wait_for);
    gradient_producer = last_op();  // before any gradient-synchronisation op of this layer
    if (zero3_) {
      // Post-backward hook: reshard the block, prefetch the next one, reduce-scatter this one's gradient (every
      // micro-batch: Composer never enters no_sync), after its backward on the compute stream.
      fsdp_free(gradient_producer);
      if (layer > first) {
        prefetched =
            fsdp_gather(layer - 1, ComputeKind::TransformerLayer, layer_parameters_per_gpu(s_), Phase::Backward, step);
      }
      fsdp_reduce(layer, ComputeKind::TransformerLayer, layer_parameters_per_gpu(s_), gradient_producer, step);
      continue;
    }
    // ZeRO-2 reduces each micro-batch's gradients as the backward makes them; a zero-bubble schedule's W steps make
    // them later, and the two are not combined (scenario_rules_schedule.cpp refuses it).
    if (zero2_ && !last_backward_of_chunk) {
      reduce_micro_batch_gradients(layer, ComputeKind::TransformerLayer, layer_dense_parameters_per_gpu(s_, layer),
                                   gradient_producer, step);
    } else if (last_backward_of_chunk && !split_backward_) {
      layer_gradients_done(layer);
    }
  }
  reduce_fp8_amaxes(last - first + 1, Phase::Backward, step, wait_for);
  if (starts_route(vs)) {
    if (recompute_model_ends(s_)) emit_all(embedding_forward(x_, Phase::Recompute), step, wait_for);
    emit_all(embedding_backward(x_), step, wait_for);
  }
  // ZeRO-2: the model ends' gradients too, every micro-batch but the last (the last one's are the iteration's buckets).
  if (zero2_ && !last_backward_of_chunk) {
    const int producer = last_op();
    for (const ComputeKind end : {ComputeKind::LmHead, ComputeKind::Embedding}) {
      if (end == ComputeKind::Embedding ? starts_route(vs) : ends_route(vs)) {
        reduce_micro_batch_gradients(-1, end, end_bucket_parameters(end), producer, step);
      }
    }
  }
  if (zero3_) {
    // The root's post-backward: reshard it and reduce-scatter its gradient, last.
    const int producer = last_op();
    fsdp_free(producer);
    fsdp_reduce(-1, ComputeKind::LmHead, end_bucket_parameters(ComputeKind::LmHead), producer, step);
    fsdp_reduce(-1, ComputeKind::Embedding, end_bucket_parameters(ComputeKind::Embedding), producer, step);
  }
  if (!starts_route(vs)) send(step, vs, vs - 1, Phase::Backward, gradient_producer);
}

// DualPipe's DP reductions wait for the sum of the two copies (sum_mirror_gradients), after the last W.
void StageBuilder::layer_gradients_done(int layer) {
  if (s_.parallel.dp_overlap && !s_.parallel.bidirectional()) {
    synchronize_layer_gradients(layer);
  } else {
    deferred_layers_.push_back(layer);
  }
}

// W needs no message: its inputs are the B step's, kept on the stage. Layers in backward order, so that with
// dp_overlap the chunk's last layer's reduction starts first, as after a whole backward.
void StageBuilder::weight_grad_step(const PipelineStep& step, bool last_of_chunk) {
  const int first = first_layer(step.chunk);
  for (int layer = first + layers_in(step.chunk) - 1; layer >= first; --layer) {
    int wait_for = -1;
    emit_layer(layer, Phase::WeightGrad, step, wait_for);
    if (last_of_chunk) layer_gradients_done(layer);
  }
}

}  // namespace twin::model

// The stage builder: one stage's schedule (micro-batch, chunk, pass) expanded into the op list every rank of the stage
// runs. Per step:
//   forward:  [Recv activation] [embedding] layers... [final LN, LM head, cross-entropy] [Send activation]
//   backward: [Recv gradient] [cross-entropy, LM head, final LN] (recompute, backward) per layer in reverse
//             [embedding] [Send gradient]
// and the iteration ends with gradient synchronisation (tied-embedding, sequence-parallel and DP reductions), the
// gradient-norm all-reduce and the optimizer step (then the ZeRO-1 parameter all-gather).
//
//   stage_builder.cpp   the steps: layers, ends, point-to-point ops
//   stage_builder_combined.cpp  framework.moe_a2a_overlap: a forward and a backward step merged layer by layer
//                       (model/program/moe_a2a_overlap.hpp)
//   gradient_sync.cpp   gradient synchronisation and parameter sharding: DP buckets, ZeRO-1's gathers, FSDP
#pragma once

#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "model/ops/kernel_traffic.hpp"
#include "model/ops/op.hpp"
#include "model/plan/schedule.hpp"
#include "model/program/moe_a2a_overlap.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::model {

class StageBuilder {
 public:
  StageBuilder(const Scenario& s, Granularity granularity, const StageSchedule& schedule, int stage);
  std::vector<Op> build();

 private:
  int emit(Op op);
  // Appends a sequence of ops for one step; the first one waits for `wait_for` (a Recv) when given, and for
  // pending_gather_ (a parameter gather, parallel.overlap_param_gather) when set.
  void emit_all(std::vector<Op> ops, const PipelineStep& step, int& wait_for);
  void emit_layer(int layer, Phase phase, const PipelineStep& step, int& wait_for);
  // FP8 delayed scaling: the amax reduction at the end of a chunk's forward or backward region (stage_builder.cpp).
  void reduce_fp8_amaxes(int layers, Phase phase, const PipelineStep& step, int& wait_for);
  int recv(const PipelineStep& step, int from_virtual_stage, Phase phase);
  // `producer`: the op whose output is sent (the send waits for it and nothing else).
  void send(const PipelineStep& step, int my_virtual_stage, int to_virtual_stage, Phase phase, int producer);
  int last_op() const { return static_cast<int>(ops_.size()) - 1; }
  // The virtual stage of this stage's chunk (ParallelSpec::virtual_stage).
  int vs_of(int chunk) const { return static_cast<int>(s_.parallel.virtual_stage(stage_, chunk)); }
  // Whether a micro-batch's route starts (the embedding) or ends (the head) at virtual stage `vs`.
  bool starts_route(int vs) const { return s_.parallel.starts_route(vs); }
  bool ends_route(int vs) const { return s_.parallel.ends_route(vs); }
  int first_layer(int chunk) const;
  int layers_in(int chunk) const;
  void forward_step(const PipelineStep& step);
  void backward_step(const PipelineStep& step, bool last_backward_of_chunk);
  // A zero-bubble schedule's W: the chunk's layers' deferred weight gradients, in backward order; the chunk's last one
  // synchronises the gradients (what the last backward does otherwise).
  void weight_grad_step(const PipelineStep& step, bool last_of_chunk);
  // A layer's gradients are complete: reduce them now (dp_overlap) or after the last step.
  void layer_gradients_done(int layer);

  // ---- framework.moe_a2a_overlap: Megatron-Core's combined 1F1B (stage_builder_combined.cpp)
  // One micro-batch's ops so far in a step: its latest op (what its next node waits for), and its Recv until taken.
  struct Chain {
    int last = -1;
    int wait = -1;
  };
  // A forward step, a backward step, or both merged (either may be null, not both).
  void combined_step(const PipelineStep* forward, const PipelineStep* backward, bool last_backward_of_chunk);
  const LayerNodes& nodes_of(int layer, Phase phase);
  void emit_node(const std::vector<Op>& ops, const PipelineStep& step, Chain& chain);
  void forward_layer_alone(int layer, const PipelineStep& step, Chain& chain);
  void layer_pair(int forward_layer, const PipelineStep& forward, Chain& fc, int backward_layer,
                  const PipelineStep& backward, Chain& bc, bool last_backward_of_chunk);
  void finish_backward_layer(int layer, const PipelineStep& step, Chain& chain, bool last_backward_of_chunk);

  // ---- ZeRO-1's parameter gathers under the forward (parallel.overlap_param_gather; gradient_sync.cpp)
  struct GatherBucket {
    int layer;
    ComputeKind what;
    double parameters;
  };
  class ParameterGathers;
  std::vector<GatherBucket> gather_buckets(int chunk) const;
  int parameter_gather(const GatherBucket& bucket, int chunk, int after);
  void dispatch_aligned_gathers();

  // ---- ZeRO-3: FSDP's per-unit gathers, frees and reduce-scatters (gradient_sync.cpp)
  int fsdp_gather(int layer, ComputeKind what, double parameters, Phase phase, const PipelineStep& step);
  void fsdp_free(int after_op);
  void fsdp_reduce(int layer, ComputeKind what, double parameters, int producer, const PipelineStep& step);

  // ---- gradient synchronisation and the optimizer step (gradient_sync.cpp)
  double end_bucket_parameters(ComputeKind what) const;
  Op gradient_op(CollectiveKind kind, Group group, Payload payload, ComputeKind what, double bytes,
                 Stream stream) const;
  void synchronize_bucket(int layer, ComputeKind what, double parameters, double sequence_parallel_parameters);
  void synchronize_layer_gradients(int layer);
  double gather_bytes(int layer, ComputeKind what, double parameters, bool experts) const;
  void reduce_micro_batch_gradients(int layer, ComputeKind what, double parameters, int producer,
                                    const PipelineStep& step);
  void synchronize_expert_gradients(int layer);
  void sum_mirror_gradients();  // DualPipe: the two copies' gradients summed over Group::MirrorStages
  void finish_iteration();
  void finish_sharded_iteration();

  struct Bucket {
    int layer;
    ComputeKind what;
    double parameters;
    int op;                     // index of its DP reduction, -1 without DP
    Group group = Group::Data;  // what it reduces over: Data, or ExpertData for an MoE layer's routed experts
  };

  const Scenario& s_;
  Shapes x_;
  Granularity granularity_;
  const StageSchedule& schedule_;
  int stage_;
  int stages_ = 1, chunks_ = 1;
  int dp_ = 1;                      // the replicas dense gradients reduce over: dp x cp
  Group data_group_ = Group::Data;  // their group: DataWithContext under context parallelism
  double grad_reduce_bytes_ = 4;    // per parameter, DP reduction
  double tied_reduce_bytes_ = 4;    // per parameter, the tied embedding's reduction between first and last stage
  std::vector<int> last_backward_;  // per chunk: index in the schedule of its last backward step
  std::vector<int> last_weight_grad_;  // ... of its last W step (zero-bubble schedules), -1 without
  bool split_backward_ = false;        // the schedule splits each backward into B and W steps
  // (layer, phase) -> the layer's ops for one micro-batch: built once, so that every micro-batch's copy shares their
  // kernel breakdowns
  std::map<std::pair<int, Phase>, std::vector<Op>> layer_ops_;
  bool combined_ = false;                                    // framework.moe_a2a_overlap
  bool overlapped_pairs_ = false;                            // DualPipeV's F&B pairs merged (overlaps_pairs)
  std::map<std::pair<int, Phase>, LayerNodes> layer_nodes_;  // ... each layer's nodes, built once
  std::vector<int> deferred_layers_;
  std::vector<Bucket> buckets_;
  std::vector<Op> ops_;
  bool gathers_under_forward_ = false;  // parallel.overlap_param_gather: ZeRO-1's gathers under the first forward
  std::vector<std::vector<int>> aligned_gathers_;  // ... interleaved: each chunk's, issued at the start
  int pending_gather_ = -1;                        // the gather the next emitted op waits for
  bool zero2_ = false;           // parallel.zero_stage = 2 with DP: each micro-batch's gradients reduce-scattered
  bool zero3_ = false;           // parallel.zero_stage = 3 with dp > 1: FSDP's per-unit gathers and reduce-scatters
  std::deque<int> free_events_;  // FSDP: compute ops after which a unit was freed, oldest first
  int last_reduce_ = -1;         // FSDP: the latest reduce-scatter
};

}  // namespace twin::model

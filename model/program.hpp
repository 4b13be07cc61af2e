// The Program: one training iteration as, for every rank, an ordered list of ops (compute, collective,
// point-to-point). Built once from a Scenario; the simulator replays it, the executor runs it.
//
// Every rank of a pipeline stage runs the same list (its TP and DP peers follow the same schedule), so the Program
// stores one list per stage; groups and peers are named relative to the rank's coordinates (see ranks.hpp).
//
// Execution semantics, which both engines honour:
//   - a rank issues its ops in list order without waiting for them;
//   - an op starts once every op in its `deps` has finished and, on an ordered stream (Compute, DataParallel), once
//     the previous op of that stream has finished;
//   - Pipeline-stream ops (Send/Recv) are unordered: a Send starts when its deps finish and completes when its bytes
//     arrive; a Recv completes when the matching Send's bytes have arrived (matched by P2PTag, never by order);
//   - a collective completes when every member of its group has reached it; all members issue the same collectives
//     in the same order.
// A sequential interpreter (the CPU executor) may simply run the list in order: that is one valid execution.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "model/ranks.hpp"
#include "model/scenario.hpp"
#include "model/schedule.hpp"

namespace twin::model {

enum class OpKind : std::uint8_t { Compute, Collective, Send, Recv };

enum class Phase : std::uint8_t { Forward, Backward, Recompute, Optimizer };

enum class Stream : std::uint8_t {
  Compute,       // kernels, and the collectives that block them (TP; DP when not overlapped)
  DataParallel,  // DP gradient reduction and ZeRO-1 parameter gathering when overlapped with compute
  Pipeline,      // P2P sends and receives (unordered)
};

// What a compute op computes. A Collective op names the compute op whose tensor it carries.
enum class ComputeKind : std::uint8_t {
  Embedding,            // vocab-parallel word embedding lookup + position embedding
  LayerNormAttention,   // input layernorm of a transformer layer
  QkvProjection,        // column-parallel GEMM  [tokens, h] x [h, 3h/t]  ((h + 2 kv_heads d)/t with grouped queries)
  AttentionCore,        // causal softmax(Q K^T / sqrt(d)) V over the rank's heads: two batched GEMMs
  AttentionProjection,  // row-parallel GEMM     [tokens, h/t] x [h/t, h]
  AttentionResidual,    // bias + dropout + residual add
  LayerNormMlp,         // post-attention layernorm
  MlpUp,                // column-parallel GEMM  [tokens, h] x [h, f/t]  (2f/t for SwiGLU: gate and up)
  Gelu,
  Swiglu,       // silu(gate) * up over the MLP-up output's two halves (model.activation = "swiglu")
  MlpDown,      // row-parallel GEMM     [tokens, f/t] x [f/t, h]
  MlpResidual,  // bias + dropout + residual add
  FinalLayerNorm,
  LmHead,            // vocab-parallel GEMM   [tokens, h] x [h, V/t]
  CrossEntropy,      // vocab-parallel softmax cross-entropy
  TransformerLayer,  // `layer` granularity: all compute of one layer in one phase
  OptimizerStep,     // AdamW (with gradient clipping) on the rank's parameter shard (keep it last)
};
inline constexpr std::size_t kComputeKindCount = static_cast<std::size_t>(ComputeKind::OptimizerStep) + 1;

enum class CollectiveKind : std::uint8_t { AllReduce, ReduceScatter, AllGather };

// What a collective carries, so that the executor knows which buffer it reduces or gathers.
enum class Payload : std::uint8_t {
  LayerOutput,        // forward: partial sums of a row-parallel output (AR, or RS with sequence parallelism)
  LayerInput,         // sequence parallel: gather the sequence-sharded input of a column-parallel GEMM
  InputGrad,          // backward: partial input gradient of a column-parallel GEMM (AR, or RS with SP)
  OutputGrad,         // sequence parallel backward: gather the sharded output gradient of a row-parallel GEMM
  CrossEntropyStats,  // per token (local max, local sum of exp, target logit) from each vocab shard (AG)
  LayerNormGrads,     // sequence parallel: gradients of the parameters replicated across TP but applied to a
                      // sequence shard (layernorm weights and biases, row-parallel biases) summed across TP
  EmbeddingGrads,     // tied embedding: word-embedding gradient summed between the first and last stage
  Gradients,          // DP gradient reduction of one bucket (AR, or RS under ZeRO-1)
  Parameters,         // ZeRO-1: updated parameter shards gathered across DP (AG)
  GradNormSquared,    // global gradient norm for clipping: one fp32 partial sum per rank (AR over World)
  CheckpointedInput,  // DeepSpeed's partition_activations: a layer's kept input, 1/t per TP rank, gathered before its
                      // recompute (AG) (keep it last)
};
inline constexpr std::size_t kPayloadCount = static_cast<std::size_t>(Payload::CheckpointedInput) + 1;

enum class Granularity : std::uint8_t {
  Op,     // every GEMM/kernel is an op: what the executor needs
  Layer,  // one compute op per layer and phase (plus its collectives): what a 4480-GPU simulation needs
};

// A GEMM of shape [m, k] x [k, n], `count` times. For a backward op, the shape is the forward one and the op runs
// the two gradient GEMMs (input and weight gradient, same FLOPs each) of each.
struct GemmShape {
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t count = 0;
};

struct Op {
  OpKind kind = OpKind::Compute;
  Phase phase = Phase::Forward;
  Stream stream = Stream::Compute;
  ComputeKind what = ComputeKind::TransformerLayer;   // compute op, or the compute op a collective serves
  CollectiveKind collective = CollectiveKind::AllReduce;
  Group group = Group::Tensor;
  Payload payload = Payload::LayerOutput;
  std::int32_t layer = -1;        // global transformer layer index; -1 outside the layers
  std::int32_t micro_batch = -1;  // -1 for per-iteration ops (gradient reduction, optimizer)
  std::int32_t chunk = -1;        // model chunk on this stage
  std::int32_t peer_stage = -1;   // Send/Recv: the other stage (same dp and tp)
  std::int32_t tag_virtual_stage = -1;  // Send/Recv: virtual stage of the sender (part of the P2P tag)
  double flops = 0;               // matrix-multiply FLOPs on one rank
  double bytes = 0;               // compute: memory traffic; collective: full buffer size per rank (the all-reduce
                                  // size; the gathered size for AG; the input size for RS); P2P: message size
  GemmShape gemm;                 // GEMM ops and the attention core
  // ZeRO-3: once this op is done, FSDP reshards the parameters it ran with (its layer's; at layer -1 the root's, the
  // embedding's and the head's buckets): the other ranks' shards are freed until the next Parameters all-gather.
  bool frees_parameters = false;
  std::vector<std::int32_t> deps; // indices of earlier ops of the same list that must finish first
};

// Matching key of a Send/Recv pair: a Send on stage A to stage B matches the Recv on B from A with the same tag.
struct P2PTag {
  int micro_batch;
  int sender_virtual_stage;
  Phase phase;  // Forward: activation; Backward: activation gradient
  bool operator==(const P2PTag&) const = default;
};
P2PTag p2p_tag(const Op& op);

struct Program {
  Scenario scenario;
  Granularity granularity = Granularity::Op;
  RankLayout layout{1, 1, 1};
  std::vector<StageSchedule> schedule;       // per stage, as build_schedule gave it
  std::vector<std::vector<Op>> stage_ops;    // per stage: the op list every rank of the stage runs

  int stages() const { return static_cast<int>(stage_ops.size()); }
  const std::vector<Op>& ops_of_rank(int rank) const { return stage_ops[layout.coord_of(rank).pp]; }
  std::size_t ops_per_rank(int stage) const { return stage_ops[stage].size(); }
  std::size_t total_ops() const;  // over every rank
  // Matrix-multiply FLOPs of the whole iteration, summed over every rank.
  double total_flops() const;
};

Program build_program(const Scenario& scenario, Granularity granularity = Granularity::Op);

// Ops build_program would put in the stage lists (one rank per stage), from one layer's op count times the layers
// and micro-batches each stage runs, without building anything: what a caller checks against the memory it has
// before building a Program (about kProgramBytesPerOp each) for a scenario with absurd sizes.
double estimated_stage_ops(const Scenario& scenario, Granularity granularity);
// Measured: `twin graph mtnlg-530b` (0.94 M stage ops at op granularity) peaks at 290 MB resident.
inline constexpr double kProgramBytesPerOp = 300;

// The op-granularity compute ops of one transformer layer (global index `layer`) in one phase, for one micro-batch:
// what a `TransformerLayer` op fuses. Used by build_program and by cost models that time fused ops.
std::vector<Op> layer_compute_ops(const Scenario& scenario, int layer, Phase phase);

// Bytes of the copies the framework makes around the attention core in `phase` for one micro-batch (the context's
// layout copy forward, the Q/K/V gradients' concatenation backward): part of an AttentionCore op's bytes, what the
// cost model times at the streaming rate when it times the kernel itself by a measured rate (FlashAttention).
double attention_layout_copy_bytes(const Scenario& scenario, Phase phase);

std::string_view to_string(OpKind kind);
std::string_view to_string(Phase phase);
std::string_view to_string(Stream stream);
std::string_view to_string(ComputeKind kind);
std::string_view to_string(CollectiveKind kind);
std::string_view to_string(Group group);
std::string_view to_string(Payload payload);
std::string_view to_string(Granularity granularity);
std::string_view to_string(Pass pass);

}  // namespace twin::model

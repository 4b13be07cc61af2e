// One op of a rank's list in the Program (program.hpp): a compute op, a collective, or a point-to-point Send/Recv;
// and what a compute op runs, kernel by kernel (KernelBreakdown), as the framework runs it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "model/plan/ranks.hpp"

namespace twin::model {

enum class OpKind : std::uint8_t { Compute, Collective, Send, Recv };

// WeightGrad: a zero-bubble schedule's W (model/plan/schedule.hpp), the weight gradients of a layer's linear layers
// that its Backward ops (B) deferred.
enum class Phase : std::uint8_t { Forward, Backward, Recompute, Optimizer, WeightGrad };

enum class Stream : std::uint8_t {
  Compute,       // kernels, and the collectives that block them (TP; DP when not overlapped)
  DataParallel,  // DP gradient reduction and ZeRO-1 parameter gathering when overlapped with compute
  Pipeline,      // P2P sends and receives (unordered)
  Expert,        // framework.moe_a2a_overlap: an MoE layer's dispatch and combine all-to-alls (and the host's wait for
                 // the split sizes) on Megatron-Core's communication stream (model/program/moe_a2a_overlap.hpp)
};
inline constexpr std::size_t kStreamCount = static_cast<std::size_t>(Stream::Expert) + 1;

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
  Router,            // Mixture-of-Experts: the router's GEMM [tokens, h] x [h, experts] (model/ops/moe_ops.hpp)
  ExpertPermute,     // the router's top-k softmax, and the tokens copied into expert-major rows
  ExpertUp,          // the local experts' up-projections, one GEMM per expert (grouped)
  ExpertDown,        // the local experts' down-projections, one GEMM per expert (grouped)
  ExpertUnpermute,   // the expert rows weighted by their probabilities and summed back into token order
  ExpertSplitsSync,  // the all-to-all dispatcher's copy of the tokens-per-expert counts to the host, and its wait
  TransformerLayer,  // `layer` granularity: all compute of one layer in one phase
  OptimizerStep,     // AdamW (with gradient clipping) on the rank's parameter shard (keep it last)
};
inline constexpr std::size_t kComputeKindCount = static_cast<std::size_t>(ComputeKind::OptimizerStep) + 1;

// AllToAll: every member sends each other member its own share (Op::peer_bytes), as an MoE layer's token dispatch
// and combine over the Expert group.
enum class CollectiveKind : std::uint8_t { AllReduce, ReduceScatter, AllGather, AllToAll };

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
  Tokens,             // Mixture-of-Experts: the expert rows exchanged all-to-all (dispatch, combine, their gradients)
  ExpertCounts,       // Mixture-of-Experts with sequence parallelism: the router's tokens per expert summed over TP
                      // (AR), so that each shard's load-balancing loss sees its micro-batch's counts
  CheckpointedInput,  // DeepSpeed's partition_activations: a layer's kept input, 1/t per TP rank, gathered before its
                      // recompute (AG)
  Fp8Amax,            // FP8: the amaxes of the tensors cast to FP8, reduced to their maximum (AR): delayed scaling's
                      // per region over TP x DP, tensorwise scaling's per sequence-parallel input over TP
  ContextKeys,        // context parallelism (all_gather): a layer's keys gathered across the CP group (AG)
  ContextValues,      // ... its values (AG)
  ContextKeyGrads,    // ... the whole sequence's key gradients reduce-scattered back to their ranks (RS)
  ContextValueGrads,  // ... the value gradients (RS)
  // Context parallelism (a2a, DeepSpeed-Ulysses; model/ops/context_parallel_a2a.cpp): all-to-alls over the CP group that
  // turn "seq / cp tokens, all of the rank's heads" into "the whole sequence, 1 / cp of them" (to heads) and back
  UlyssesQueries,     // forward: the queries to heads
  UlyssesKeys,        // ... the keys to heads
  UlyssesValues,      // ... the values to heads
  UlyssesOutput,      // ... the attention output back to tokens
  UlyssesOutputGrad,  // backward: the output's gradient to heads
  UlyssesQueryGrads,  // ... dQ back to tokens
  UlyssesKeyGrads,    // ... dK back to tokens
  UlyssesValueGrads,  // ... dV back to tokens
  ExpertProbs,        // Mixture-of-Experts, the all-to-all dispatcher: the dispatched rows' routing probabilities, sent
                      // all-to-all after the rows (and their gradients back) (keep it last)
};
inline constexpr std::size_t kPayloadCount = static_cast<std::size_t>(Payload::ExpertProbs) + 1;

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

// A kind of kernel, as the simulator's cost model times it.
enum class KernelKind : std::uint8_t {
  Gemm,              // the op's GEMM by its shape (Op::gemm); a backward op runs its input- and weight-gradient GEMMs
  Stream,            // memory bound: `bytes` through HBM (elementwise passes, copies, reductions)
  AttentionGemms,    // the attention core's batched GEMMs by the op's shape: Q K^T and P V (backward: dP, dV, dQ, dK)
  AttentionOperand,  // bytes the attention GEMMs read beyond their operands, at their rate (ALiBi's bias as C)
  AttentionPasses,   // the unfused attention core's passes over the scores and its layout copies, streaming
  FlashAttention,    // FlashAttention's fused kernel(s), at its measured rate on the op's FLOPs
  Fp8Gemm,           // the op's GEMM(s) as Gemm, with FP8 operands (model.fp8), at the GPU's measured FP8 GEMM rate
};

// Kernels of one kind that a compute op runs back to back: `launches` launches moving `bytes` in all (e.g. the
// QKV projection's bias add, or Megatron's three unfused softmax passes).
struct Kernel {
  KernelKind kind = KernelKind::Stream;
  std::int32_t launches = 1;
  double bytes = 0;
  // Launched by the framework's Python around a Transformer Engine module's call, not by the call (the MoE
  // dispatcher's row copies on a grouped GEMM's op): their host time is their own launches', not the module's.
  bool outside_module = false;
};

struct Op;

// What a compute op runs, decided in model/ for the framework of the scenario: an op-granularity op's kernels (their
// bytes sum to Op::bytes), or a fused TransformerLayer op's parts, the op-granularity compute ops it stands for, each
// with its own kernels. Immutable once built and shared by every op that runs the same (a layer's ops for each
// micro-batch), so that a Program of a million ops holds a few hundred breakdowns.
struct KernelBreakdown {
  std::vector<Kernel> kernels;
  std::vector<Op> parts;
};

struct Op {
  OpKind kind = OpKind::Compute;
  Phase phase = Phase::Forward;
  Stream stream = Stream::Compute;
  ComputeKind what = ComputeKind::TransformerLayer;  // compute op, or the compute op a collective serves
  CollectiveKind collective = CollectiveKind::AllReduce;
  Group group = Group::Tensor;
  Payload payload = Payload::LayerOutput;
  // ZeRO-3: once this op is done, FSDP reshards the parameters it ran with (its layer's; at layer -1 the root's, the
  // embedding's and the head's buckets): the other ranks' shards are freed until the next Parameters all-gather.
  bool frees_parameters = false;
  // A Backward GEMM op whose weight gradient (and its accumulation) a WeightGrad op of the same layer and kind runs
  // later: this op runs only the input-gradient GEMM (a zero-bubble schedule's B).
  bool defers_weight_grad = false;
  std::int32_t layer = -1;              // global transformer layer index; -1 outside the layers
  std::int32_t micro_batch = -1;        // -1 for per-iteration ops (gradient reduction, optimizer)
  std::int32_t chunk = -1;              // model chunk on this stage
  std::int32_t peer_stage = -1;         // Send/Recv: the other stage (same dp and tp)
  std::int32_t tag_virtual_stage = -1;  // Send/Recv: virtual stage of the sender (part of the P2P tag)
  // Context parallelism's ring (framework.cp_comm = "p2p", model/ops/context_parallel_ring.hpp): a message's index in its
  // layer's ring (a Send/Recv over Group::Context), or the step of an attention block; -1 outside the ring.
  std::int32_t cp_ring_step = -1;
  double flops = 0;                     // matrix-multiply FLOPs on one rank
  // Compute: memory traffic (its kernels'); collective: full buffer size per rank (the all-reduce size; the gathered
  // size for AG; the input size for RS); P2P: message size.
  double bytes = 0;
  GemmShape gemm;                                    // GEMM ops and the attention core
  std::shared_ptr<const KernelBreakdown> breakdown;  // compute ops of a Program: what they run
  // AllToAll: bytes member i of the group sends member j at [i * members + j] (the diagonal stays on the rank);
  // shared by every op of the same exchange. Op::bytes is then the member's whole input buffer.
  std::shared_ptr<const std::vector<double>> peer_bytes;
  std::vector<std::int32_t> deps;  // indices of earlier ops of the same list that must finish first
};

// Matching key of a Send/Recv pair: a Send on stage A to stage B matches the Recv on B from A with the same tag.
struct P2PTag {
  int micro_batch;
  int sender_virtual_stage;
  Phase phase;  // Forward: activation; Backward: activation gradient
  bool operator==(const P2PTag&) const = default;
};
P2PTag p2p_tag(const Op& op);

// A P2PTag packed into one integer, what both engines match messages by: bits 0-17 the micro-batch, bits 18-28 the
// sender's virtual stage, bit 29 the phase (1: backward). Under 2^30, so that it fits an MPI tag. Distinct tags give
// distinct keys; throws std::out_of_range for a micro-batch outside [0, kP2PTagMicroBatches), a virtual stage
// outside [0, kP2PTagVirtualStages), or a phase other than Forward and Backward.
inline constexpr int kP2PTagMicroBatches = 1 << 18;
inline constexpr int kP2PTagVirtualStages = 1 << 11;
inline constexpr std::uint64_t kP2PTagKeys = std::uint64_t{1} << 30;  // every key is below it
std::uint64_t p2p_tag_key(const P2PTag& tag);

std::string_view to_string(OpKind kind);
std::string_view to_string(Phase phase);
std::string_view to_string(Stream stream);
std::string_view to_string(ComputeKind kind);
std::string_view to_string(CollectiveKind kind);
std::string_view to_string(Group group);
std::string_view to_string(Payload payload);
std::string_view to_string(Granularity granularity);
std::string_view to_string(KernelKind kind);

}  // namespace twin::model

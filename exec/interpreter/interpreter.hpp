// The interpreter: runs one rank's op list of a Program (op granularity) in order, dispatching every op by
// (kind, what, phase, payload) to a Backend kernel or a Communicator call. The Program says what happens and when;
// this class only knows how to do each op. The list may be run in order because its ops are issued in an order
// every rank agrees on (model/program/program.hpp, execution semantics).
//
// The interpreter is the op loop and the dense layer; each feature is a runner that owns its state, to which the loop
// hands the feature's ops (what they share is the RankContext, rank_context.hpp):
//   interpreter.cpp   the loop, the dispatch tables
//   layers.cpp        transformer layer: forward, recompute, backward; its GEMMs (dense, or FP8's)
//   ends.cpp          embedding, final layernorm, LM head, cross-entropy
//   comm.cpp          tensor-parallel collectives and pipeline sends/receives
// and the runners:
//   moe/              MoeLayer: route -> dispatch -> experts -> combine, the shared experts, the load-balancing loss;
//                     its token dispatcher an object (TokenDispatcher; AllToAllDispatcher)
//   context/          ContextAttention: the attention core under context parallelism, one class per way
//                     (AllGatherAttention, RingAttention, UlyssesAttention)
//   fp8_linear.*      Fp8Linear: the GEMMs the Program runs in FP8, their scales (Fp8State) and amax reductions
//   optimizer.*       Optimizer: gradient reductions (TP, tied embedding, DP / ZeRO-1 / ZeRO-3), global norm, AdamW,
//                     parameter gathers (ZeRO-1 after the step, ZeRO-3 before each layer)
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "exec/interpreter/context/context_attention.hpp"
#include "exec/interpreter/fp8_linear.hpp"
#include "exec/interpreter/iteration.hpp"
#include "exec/interpreter/moe/moe_layer.hpp"  // refuse_unsupported_moe
#include "exec/interpreter/optimizer.hpp"
#include "exec/interpreter/rank_context.hpp"

namespace twin::exec {

class Interpreter {
 public:
  Interpreter(const model::Program& program, int rank, Backend& backend, Communicator& comm, ModelShard& shard);
  ~Interpreter();

  // Runs the rank's whole op list once. `timings`, when given, receives one entry per op (clock: seconds since
  // `epoch`).
  IterationOutput run_iteration(const IterationInput& input, std::vector<OpTiming>* timings = nullptr,
                                double epoch_s = 0);

  const std::vector<model::Op>& ops() const { return ops_; }
  // model.fp8: the FP8 scales and amaxes this rank keeps (null without FP8)
  const Fp8State* fp8_state() const { return fp8_ ? &fp8_->state() : nullptr; }
  Fp8State* fp8_state() { return fp8_ ? &fp8_->state() : nullptr; }
  // "op #12 forward qkv_projection layer 3 micro-batch 1" (model::op_label): how messages name op i
  const std::string& label(std::size_t op_index) const { return ctx_.label(op_index); }

 private:
  using Handler = std::function<void(const model::Op&)>;
  using Method = void (Interpreter::*)(const model::Op&);

  void build_dispatch_tables();
  void find_turns();  // turn_after_
  // ZeRO-3: which bucket each compute op reads, and after which ops FSDP frees a layer's gathered parameters.
  void plan_parameter_lifetimes();
  Bucket* parameters_read_by(const model::Op& op);
  void execute(std::size_t index);
  void release(int micro_batch, int chunk);  // op's (micro-batch, chunk) is done: its state, and its runners', go
  bool recomputing(const model::Op& op) const { return op.phase == model::Phase::Recompute; }
  // The output gradient a backward GEMM reads: gathered across TP if an OutputGrad all-gather just ran, else the
  // stream's gradient itself.
  Tensor take_grad_full(ChunkState& state);
  // Fault injection: a NaN where the op's successors read (exec/train/faults.hpp, nan).
  void poison(const model::Op& op);

  // layers.cpp
  void layernorm_attention_forward(const model::Op& op);
  void qkv_forward(const model::Op& op);
  void attention_core_forward(const model::Op& op);
  void attention_projection_forward(const model::Op& op);
  void attention_residual_forward(const model::Op& op);
  void layernorm_mlp_forward(const model::Op& op);
  void mlp_up_forward(const model::Op& op);
  void gelu_forward(const model::Op& op);
  void swiglu_forward(const model::Op& op);
  void mlp_down_forward(const model::Op& op);
  void mlp_residual_forward(const model::Op& op);
  void finish_layer_forward(const model::Op& op, LayerStash& s);
  // The block's norm over (tokens_sp, C): LayerNorm, or RMSNorm (no mean, no bias: `mean` and `bias` unused).
  void norm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                    const Tensor& bias);
  void norm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd);
  void mlp_residual_backward(const model::Op& op);
  void mlp_down_backward(const model::Op& op);
  void gelu_backward(const model::Op& op);
  void swiglu_backward(const model::Op& op);
  void mlp_up_backward(const model::Op& op);
  void layernorm_mlp_backward(const model::Op& op);
  void attention_residual_backward(const model::Op& op);
  void attention_projection_backward(const model::Op& op);
  void attention_core_backward(const model::Op& op);
  void qkv_backward(const model::Op& op);
  void layernorm_attention_backward(const model::Op& op);
  // A zero-bubble schedule's W of a linear layer: its weight gradient from what its B left (ChunkState::deferred).
  void linear_weight_gradient(const model::Op& op);

  // ends.cpp
  void embedding_forward(const model::Op& op);
  void embedding_backward(const model::Op& op);
  void final_layernorm_forward(const model::Op& op);
  void lm_head_forward(const model::Op& op);
  void cross_entropy_forward(const model::Op& op);
  void combine_cross_entropy(ChunkState& state, const Tensor& gathered_stats, int shards);
  void cross_entropy_backward(const model::Op& op);
  void lm_head_backward(const model::Op& op);
  void final_layernorm_backward(const model::Op& op);

  // comm.cpp
  Tensor& tensor_parallel_buffer(const model::Op& op);
  void reduce_tensor_parallel(const model::Op& op);     // LayerOutput, InputGrad: all-reduce or reduce-scatter
  void gather_layer_input(const model::Op& op);         // LayerInput: all-gather of a sequence-sharded input
  void gather_output_grad(const model::Op& op);         // OutputGrad: all-gather of a sequence-sharded gradient
  void gather_checkpointed_input(const model::Op& op);  // CheckpointedInput: a partitioned layer input, whole again
  void gather_cross_entropy_stats(const model::Op& op);
  void send(const model::Op& op);
  // The V's turn (model::ParallelSpec::v_shape): on the last stage, chunk 0's output is chunk 1's input and chunk 1's
  // input gradient chunk 0's output gradient, passed without a message after the step's last op (turn_after_).
  void pass_through_turn(const model::Op& last);
  void recv(const model::Op& op);
  void all_gather_sequence(const model::Op& op, const Tensor& shard, Tensor& full);

  // layers.cpp: matmul_forward / matmul_backward, or the FP8 runner's when the op's GEMM runs in FP8
  void linear_forward(const model::Op& op, const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias, int rows, int in_features, int out_features);
  void linear_backward(const model::Op& op, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight, int rows, int in_features,
                       int out_features);

  RankContext ctx_;
  // the context's, by the names the dense layer's code reads
  const model::Program& program_;
  const model::Scenario& scenario_;
  const int rank_;
  const model::RankCoord coord_;
  Backend& backend_;
  Communicator& comm_;
  ModelShard& shard_;
  const Dims& dims_;
  const std::vector<model::Op>& ops_;
  std::unique_ptr<MoeLayer> moe_;              // model.experts > 0: the MoE layers' runner
  std::unique_ptr<ContextAttention> context_;  // parallel.cp > 1: the attention core's way (framework.cp_comm)
  std::unique_ptr<Fp8Linear> fp8_;             // model.fp8: the FP8 GEMMs and their scales; null without FP8
  Optimizer optimizer_;                        // gradient reductions, norm, AdamW, parameter gathers
  std::vector<bool> release_after_;  // op i is the last op of its (micro-batch, chunk): drop the state after it
  std::vector<bool> turn_after_;     // op i ends a step at the V's turn: pass its output to the other chunk
  // ZeRO-3 only (empty otherwise), by op index: the bucket whose parameters compute op i reads (it must be gathered
  // then), and the buckets FSDP reshards after op i (the Program's Op::frees_parameters).
  std::vector<Bucket*> parameters_read_;
  std::vector<std::vector<Bucket*>> free_after_;

  static constexpr int kComputeKinds = static_cast<int>(model::kComputeKindCount),
                       kPhases = static_cast<int>(model::Phase::WeightGrad) + 1,
                       kPayloads = static_cast<int>(model::kPayloadCount);
  std::array<std::array<Handler, kPhases>, kComputeKinds> compute_handlers_{};
  std::array<Handler, kPayloads> collective_handlers_{};
};

}  // namespace twin::exec

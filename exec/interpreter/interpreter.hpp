// The interpreter: runs one rank's op list of a Program (op granularity) in order, dispatching every op by
// (kind, what, phase, payload) to a Backend kernel or a Communicator call. The Program says what happens and when;
// this class only knows how to do each op. The list may be run in order because its ops are issued in an order
// every rank agrees on (model/program/program.hpp, execution semantics).
//
// Sections, one file each:
//   interpreter.cpp            the loop, the dispatch tables, the per-(micro-batch, chunk) state
//   interpreter_layers.cpp     transformer layer: forward, recompute, backward
//   interpreter_ends.cpp       embedding, final layernorm, LM head, cross-entropy
//   interpreter_comm.cpp       tensor-parallel collectives and pipeline sends/receives
//   interpreter_moe.cpp        Mixture-of-Experts MLP: router, permutation, all-to-all dispatch and combine, grouped
//                              experts, shared experts, load-balancing loss (interpreter_moe_comm.cpp: its exchanges)
//   interpreter_optimizer.cpp  gradient reductions (TP, tied embedding, DP / ZeRO-1 / ZeRO-3), global norm, AdamW,
//                              parameter gathers (ZeRO-1 after the step, ZeRO-3 before each layer)
//   interpreter_fp8.cpp        the layers' GEMMs, in FP8 where the Program says so, and FP8's amax reductions
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "exec/comm/communicator.hpp"
#include "exec/core/backend.hpp"
#include "exec/core/micro_batch.hpp"
#include "exec/shard/model_shard.hpp"
#include "model/program/program.hpp"

namespace twin::exec {

class Fp8State;

// Where a rank is, for a launcher's watchdog on another thread: marked before every op.
struct RankProgress {
  std::atomic<double> at_s{0};  // steady-clock seconds of the last mark
  std::atomic<int> step{-1}, op{-1};
  void mark(int step_now, int op_now);
};

// Told of every op of a rank just before and just after it runs (the traced step's timing ends after op_done):
// exec/train's straggler detector and slow-rank injection (exec/train/straggler.hpp) keep their own clocks.
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void op_starting(const model::Op& op) = 0;
  virtual void op_done(const model::Op& op) = 0;
};

struct IterationInput {
  int step = 0;                           // 0-based iteration index (learning-rate schedule, Adam step = step + 1)
  std::vector<MicroBatch> micro_batches;  // this DP rank's m micro-batches
  // Skip the update, as a loss scaler does, when the logits, the loss or the gradient norm are non-finite on any rank
  // (the norm's all-reduce carries the verdict to every rank): weights and Adam state stay as they were.
  bool skip_nonfinite = false;
  int poison_after_op = -1;          // fault injection: a NaN after this op (exec/train/faults.hpp, nan); -1: none
  RankProgress* progress = nullptr;  // marked before every op when given
  OpObserver* observer = nullptr;    // told of every op's start and end when given
};

struct IterationOutput {
  double loss_sum = 0;     // sum of the per-token losses this rank counts (last stage, tp rank 0), else 0; NaN when
                           // the logits or the loss were non-finite (skip_nonfinite)
  double loss_tokens = 0;  // how many tokens that sum covers
  double grad_norm = 0;    // global gradient norm before clipping
  double learning_rate = 0;
  bool skipped = false;  // skip_nonfinite: the update was skipped (every rank alike)
  // Mixture-of-Experts: this rank's share of the load-balancing losses (coefficient included) summed over its MoE
  // layers and micro-batches; the shares of all ranks sum to the global batch's (sequence shards add up).
  double aux_loss_sum = 0;
  // model.capacity_factor > 0: the (token, slot) pairs this rank's MoE layers dropped (forward passes, not recompute)
  double moe_dropped_slots = 0;
};

// Measured start and end of one op (seconds since the run's epoch).
struct OpTiming {
  int op_index;
  double start_s, end_s;
};

// Throws a RunError naming the field when `scenario`'s Mixture-of-Experts layers ask for what the executor does not run
// (interpreter/moe.cpp): token dropping off the cpu backend or with tensor parallelism, tensor parallelism without
// sequence parallelism, a shared norm. Nothing for a dense model. (A backend without MoE kernels at all is
// check_supported's refusal, exec/train/check_supported.hpp.)
void refuse_unsupported_moe(const model::Scenario& scenario, std::string_view backend);

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
  const Fp8State* fp8_state() const { return fp8_.get(); }
  Fp8State* fp8_state() { return fp8_.get(); }
  // "op #12 forward qkv_projection layer 3 micro-batch 1" (model::op_label): how messages name op i
  const std::string& label(std::size_t op_index) const { return labels_[op_index]; }

 private:
  // ---- per (micro-batch, chunk) state --------------------------------------------------------------------------
  // Forward tensors one layer keeps for its backward (what is dropped depends on the recompute mode). Shapes are
  // this rank's: tokens = B*T, tokens_sp = tokens / tp under sequence parallelism.
  struct LayerStash {
    Tensor x;                        // (tokens_sp, C) layer input, kept under every recompute mode
    Tensor x_part;                   // DeepSpeed's partition_activations: this TP rank's contiguous 1/t of x, kept
                                     // instead of x between the forward and the recompute
    Tensor ln1, ln1_mean, ln1_rstd;  // (tokens_sp, C), (tokens_sp), (tokens_sp); no mean under RMSNorm
    Tensor ln1_full;                 // (tokens, C) ln1 gathered across TP (sequence parallel), else ln1
    Tensor qkv;                      // (tokens, qkv_local) as (B, T, 3, H/t, D), or [q | k | v] with grouped
                                     // queries; q and k rotated under rotary embeddings
    Tensor attn, attn_lse;           // (tokens, C/t), (B, H/t, T); under context parallelism (2, B, H/t, T/2)
    Tensor keys, values;             // context parallelism: every CP rank's keys, values (cp, tokens, KV/t D), gathered
                                     // for one attention forward or backward (not kept)
    Tensor values_local;             // ... this rank's values, between the keys' all-gather and the values'
    Tensor ring_kv, ring_kv_next;    // the p2p ring: the K/V block this step computes on, the one arriving for the next
    // context parallelism (a2a): the head group's qkv and output over the whole sequence, (B, seq, ...)
    Tensor ulysses_qkv, ulysses_out;
    Tensor proj;                     // (tokens, C) partial sums; (tokens_sp, C) after the TP reduction
    Tensor x2;                       // (tokens_sp, C) residual stream after attention
    Tensor ln2, ln2_mean, ln2_rstd;  // (tokens_sp, C), (tokens_sp), (tokens_sp)
    Tensor ln2_full;                 // (tokens, C)
    Tensor fc;                       // (tokens, up_local) before the activation: F/t, or SwiGLU's [gate | up]
    Tensor gelu;                     // (tokens, F/t) the activation's output (GELU or SwiGLU)
    Tensor fc_proj;                  // (tokens, C) partial sums; (tokens_sp, C) after the TP reduction
  };
  struct HeadStash {
    Tensor x;                        // (tokens_sp, C) input of the final layernorm
    Tensor lnf, lnf_mean, lnf_rstd;  // (tokens_sp, C), (tokens_sp), (tokens_sp)
    Tensor lnf_full;                 // (tokens, C)
    Tensor logits;                   // (tokens, V/t); the backward overwrites it with dlogits
    Tensor stats;                    // (tokens, 3) this shard's cross-entropy statistics
    Tensor losses, lse;              // (tokens), (tokens)
  };
  // Working tensors of a backward pass, alive from one op to the next.
  struct BackwardWork {
    Tensor grad_full;         // (tokens, C) output gradient gathered across TP (sequence parallel)
    Tensor d_hidden;          // (tokens, F/t) gradient of the MLP hidden activation; (tokens, 2F/t) after SwiGLU's
                              // backward
    Tensor d_attn;            // (tokens, C/t)
    Tensor d_qkv;             // (tokens, qkv_local)
    Tensor d_keys, d_values;  // context parallelism: this rank's share of every CP rank's dK, dV (cp, tokens, KV/t D)
    // The p2p ring's backward: dq summed over the steps, this rank's own block's dK/dV (step 0), the travelling
    // accumulator of the block held last (sent on), the one received with it, rowsum(dout * out)
    Tensor ring_dq, ring_own_dkv, ring_acc, ring_acc_in, ring_delta;
    // context parallelism (a2a): the head group's dout and dqkv over the whole sequence, (B, seq, ...)
    Tensor ulysses_dout, ulysses_dqkv;
    Tensor d_ln;      // (tokens, C) partial input gradient of a column-parallel GEMM; (tokens_sp, C)
                      // after the TP reduction
    Tensor d_x_mlp;   // parallel block: LN2's input gradient (tokens_sp, C), which the LN1 op adds to the stream's
    Tensor d_ln_mlp;  // shared norm: the MLP-up GEMM's partial input gradient (tokens, C), summed into QKV's
    Tensor d_out;     // parallel block: the stream's gradient (T, C) as the MLP-down backward took it, for the
                      // attention projection's (gathered once under sequence parallelism)
  };
  // A Mixture-of-Experts MLP's state for one (micro-batch, layer), forward to backward. T = tokens_sp, k = top_k,
  // E = experts, R = the rows this rank's experts received (data-dependent), El = local experts.
  struct MoeStash {
    Tensor scores;                        // (T, E) softmax of the router logits: the load-balancing loss's
    Tensor probs;                         // (T, k) the chosen experts' weights
    std::vector<int> chosen;              // (T, k) expert of each (token, slot), on the host
    Tensor chosen_map;                    // (T, k) int32: the same on the backend (the router's backward reads it)
    std::vector<int> rows;                // (T, k) row of each (token, slot) in the expert-major permuted buffer
    Tensor row_map;                       // (T, k) int32: the same on the backend (permute, unpermute)
    std::vector<int> rows_per_expert;     // (E) of the permuted buffer
    std::vector<float> counts;            // (E) tokens per expert of the whole micro-batch (summed over TP shards)
    std::vector<std::size_t> send_rows;   // (ep) rows sent to each EP peer in the dispatch
    std::vector<std::size_t> recv_rows;   // (ep) rows received from each
    std::vector<int> recv_chunk_rows;     // (ep, El) rows from peer i for local expert e, in the received order
    std::vector<int> expert_rows;         // (El) rows of each local expert the GEMMs see (summed over EP peers, then
                                          // ETP peers)
    std::vector<int> etp_chunk_rows;      // (etp, El) rows of each (ETP peer, local expert) before the ETP gather
    std::vector<std::size_t> etp_rows;    // (etp) each ETP peer's rows
    std::size_t own_rows = 0;             // this rank's rows before the ETP gather
    Tensor permuted;                      // (T k, C) rows in expert-major order (before the dispatch)
    Tensor expert_in;                     // (R, C) the local experts' input, expert-major
    Tensor expert_fc;                     // (R, F_up) before the activation
    Tensor expert_act;                    // (R, F)
    Tensor expert_out;                    // (R, C) before the combine
    Tensor combined;                      // (T k, C) the experts' outputs back in permuted order
    Tensor shared_fc, shared_act;         // (T, S_up), (T, S) the shared experts'
    Tensor d_rows;                        // backward: the gradient in flight along the expert path
    Tensor d_probs;                       // (T, k)
    bool routed_activation_next = false;  // the next activation op is the routed experts' (else the shared ones')
  };
  struct ChunkState {
    Tensor tokens, targets;            // (tokens) int32: on the first / last virtual stage
    Tensor hidden;                     // (tokens_sp, C) residual stream between layers (and stages)
    Tensor grad;                       // (tokens_sp, C) its gradient during the backward
    Tensor embedding;                  // (tokens, C) embedding output before the TP reduction
    std::map<int, LayerStash> layers;  // by global layer index
    std::map<int, MoeStash> moe;       // by global layer index: its MoE MLP's
    HeadStash head;
    BackwardWork work;
    // A zero-bubble schedule's B of a linear layer leaves its W what the weight gradient reads: the GEMM's input
    // (rows, in_f) and its output gradient (rows, out_f), by (layer, ComputeKind).
    struct DeferredWeightGrad {
      Tensor input, d_out;
    };
    std::map<std::pair<int, int>, DeferredWeightGrad> deferred;
  };

  using Handler = void (Interpreter::*)(const model::Op&);

  void build_dispatch_tables();
  void find_turns();  // turn_after_
  // ZeRO-3: which bucket each compute op reads, and after which ops FSDP frees a layer's gathered parameters.
  void plan_parameter_lifetimes();
  Bucket* parameters_read_by(const model::Op& op);
  void execute(std::size_t index);
  ChunkState& chunk(const model::Op& op);
  LayerStash& stash(const model::Op& op);
  bool recomputing(const model::Op& op) const { return op.phase == model::Phase::Recompute; }
  // The output gradient a backward GEMM reads: gathered across TP if an OutputGrad all-gather just ran, else the
  // stream's gradient itself.
  Tensor take_grad_full(ChunkState& state);
  const CommGroup& group(model::Group group) const;
  // Throws TrainingDiverged naming the step, this rank and the op when `value` (a sum or norm of `what`) is not finite:
  // the kernels would otherwise fail on a precondition or spread NaN into the weights.
  // `every_rank`: the value was all-reduced, so every rank raises alike (GuardTripped, printed once under MPI).
  void require_finite(double value, std::string_view what, bool every_rank = false) const;
  // Under skip_nonfinite: notes a non-finite `value` (true) instead of throwing; otherwise require_finite.
  bool nonfinite(double value, std::string_view what, bool every_rank = false);
  // Fault injection: a NaN where the op's successors read (exec/train/faults.hpp, nan).
  void poison(const model::Op& op);

  // interpreter_layers.cpp
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

  // interpreter_context.cpp: context parallelism (the all_gather way)
  ContextShape context_shape() const;
  void gather_context_keys(const model::Op& op);          // ContextKeys: all-gather of every CP rank's keys
  void gather_context_values(const model::Op& op);        // ContextValues: ... values
  void scatter_context_key_grads(const model::Op& op);    // ContextKeyGrads: reduce-scatter of dK to its ranks
  void scatter_context_value_grads(const model::Op& op);  // ContextValueGrads: ... dV
  void scatter_context_grad(const model::Op& op, bool values);
  void context_attention_forward(const model::Op& op);
  void context_attention_backward(const model::Op& op);
  // interpreter_context_ring.cpp: context parallelism, the p2p ring (model/ops/context_parallel_ring.hpp)
  void ring_send(const model::Op& op);  // a ring message to CP rank + 1: K/V, dK/dV or both
  void ring_recv(const model::Op& op);  // ... from CP rank - 1
  void ring_block_forward(const model::Op& op);
  void ring_block_backward(const model::Op& op);
  void ring_return_grads(const model::Op& op);  // the owner's add of its block's returned dK/dV
  int ring_peer_rank(const model::Op& op) const;
  // interpreter_context_a2a.cpp: context parallelism (the a2a way)
  struct UlyssesSection {
    int heads;         // of this TP rank, in the range
    int column;        // the range's first element in the rank's packed row
    int group_column;  // ... in the head group's packed row
  };
  UlyssesSection ulysses_section(model::Payload payload) const;
  int ulysses_qkv_width() const;
  int whole_tokens() const;
  void ulysses_all_to_all(const model::Op& op, const Tensor& send, const Tensor& recv);
  void ulysses_to_heads(const model::Op& op, const Tensor& local, int local_width, const Tensor& full, int full_width);
  void ulysses_to_tokens(const model::Op& op, const Tensor& full, int full_width, const Tensor& local, int local_width);
  void ulysses_qkv_to_heads(const model::Op& op);          // UlyssesQueries, UlyssesKeys, UlyssesValues
  void ulysses_output_to_tokens(const model::Op& op);      // UlyssesOutput
  void ulysses_output_grad_to_heads(const model::Op& op);  // UlyssesOutputGrad
  void ulysses_grads_to_tokens(const model::Op& op);       // UlyssesQueryGrads, UlyssesKeyGrads, UlyssesValueGrads
  void ulysses_attention_forward(const model::Op& op);
  void ulysses_attention_backward(const model::Op& op);
  // The learned position embedding of this rank's tokens (its two chunks of each sequence): out += wpe, or the
  // backward's dwpe += dout.
  void context_position_embedding(const Tensor& x, bool backward);

  // interpreter_ends.cpp
  void embedding_forward(const model::Op& op);
  void embedding_backward(const model::Op& op);
  void final_layernorm_forward(const model::Op& op);
  void lm_head_forward(const model::Op& op);
  void cross_entropy_forward(const model::Op& op);
  void combine_cross_entropy(ChunkState& state, const Tensor& gathered_stats, int shards);
  void cross_entropy_backward(const model::Op& op);
  void lm_head_backward(const model::Op& op);
  void final_layernorm_backward(const model::Op& op);

  // interpreter_comm.cpp
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

  // interpreter_moe.cpp (forward handlers also run the Recompute phase)
  MoeStash& moe_stash(const model::Op& op);
  void shared_up_forward(const model::Op& op);
  void moe_activation_forward(const model::Op& op);
  void shared_down_forward(const model::Op& op);
  void router_forward(const model::Op& op);
  void permute_forward(const model::Op& op);
  void splits_sync(const model::Op& op);  // nothing to run: this executor's split sizes are host values already
  void experts_up_forward(const model::Op& op);
  void experts_down_forward(const model::Op& op);
  void unpermute_forward(const model::Op& op);
  void unpermute_backward(const model::Op& op);
  void experts_down_backward(const model::Op& op);
  void moe_activation_backward(const model::Op& op);
  void experts_up_backward(const model::Op& op);
  void permute_backward(const model::Op& op);
  void router_backward(const model::Op& op);
  void shared_down_backward(const model::Op& op);
  void shared_up_backward(const model::Op& op);
  void build_moe_dispatch_table();
  // interpreter_moe_comm.cpp
  void moe_collective(const model::Op& op);  // Tokens (all-to-all over Expert) and ExpertCounts (AR over Tensor)
  void dispatch_tokens(const model::Op& op, MoeStash& m, bool gradients);
  void combine_tokens(const model::Op& op, MoeStash& m, bool gradients);
  void gather_expert_rows(const model::Op& op, MoeStash& m, bool gradients);   // all-gather over ExpertTensor
  void scatter_expert_rows(const model::Op& op, MoeStash& m, bool gradients);  // reduce-scatter over ExpertTensor
  // interpreter_fp8.cpp: matmul_forward / matmul_backward, or their FP8 twins when the op's GEMM runs in FP8
  void linear_forward(const model::Op& op, const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias, int rows, int in_features, int out_features);
  void linear_backward(const model::Op& op, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight, int rows, int in_features,
                       int out_features);
  void reduce_fp8_amaxes(const model::Op& op);  // Fp8Amax: delayed scaling's regions, tensorwise's SP inputs
  void max_over(model::Group g, std::vector<float>& values, std::string_view label);

  // interpreter_optimizer.cpp
  void reduce_layernorm_grads(const model::Op& op);
  void reduce_embedding_grads(const model::Op& op);
  void reduce_data_parallel_grads(const model::Op& op);
  void sum_mirror_grads();  // DualPipe's two copies (optimizer.cpp)
  void gradient_norm(const model::Op& op);
  void optimizer_step(const model::Op& op);
  void gather_parameters(const model::Op& op);
  double learning_rate(int step) const;

  const model::Program& program_;
  const model::Scenario& scenario_;
  int rank_;
  model::RankCoord coord_;
  Backend& backend_;
  Communicator& comm_;
  ModelShard& shard_;
  const Dims& dims_;
  const std::vector<model::Op>& ops_;
  std::vector<std::string> labels_;
  std::vector<bool> release_after_;  // op i is the last op of its (micro-batch, chunk): drop the state after it
  std::vector<bool> turn_after_;     // op i ends a step at the V's turn: pass its output to the other chunk
  // ZeRO-3 only (empty otherwise), by op index: the bucket whose parameters compute op i reads (it must be gathered
  // then), and the buckets FSDP reshards after op i (the Program's Op::frees_parameters).
  std::vector<Bucket*> parameters_read_;
  std::vector<std::vector<Bucket*>> free_after_;
  int virtual_stages_ = 1;
  std::array<CommGroup, model::kGroupCount> groups_;       // by model::Group
  std::unique_ptr<Fp8State> fp8_;                          // model.fp8: scales and amaxes; null without FP8
  std::map<std::pair<int, int>, float> fp8_input_amaxes_;  // tensorwise SP: reduced input amaxes by (layer, GEMM)

  static constexpr int kComputeKinds = static_cast<int>(model::kComputeKindCount),
                       kPhases = static_cast<int>(model::Phase::WeightGrad) + 1,
                       kPayloads = static_cast<int>(model::kPayloadCount);
  std::array<std::array<Handler, kPhases>, kComputeKinds> compute_handlers_{};
  // The compute ops of an MoE layer's MLP (its shared experts' MlpUp / activation / MlpDown, the router and experts):
  // these handlers take precedence there
  std::array<std::array<Handler, kPhases>, kComputeKinds> moe_handlers_{};
  std::array<Handler, kPayloads> collective_handlers_{};

  // iteration state
  const IterationInput* input_ = nullptr;
  std::map<std::pair<int, int>, ChunkState> chunks_;  // by (micro-batch, chunk)
  std::size_t current_op_ = 0;
  IterationOutput output_;
  double grad_norm_squared_ = 0;
  bool saw_nonfinite_ = false;  // skip_nonfinite: this rank saw non-finite logits or loss this iteration
};

}  // namespace twin::exec

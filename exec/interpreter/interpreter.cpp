// The loop and the dispatch tables. Every op of the rank's list goes through execute(): a compute op to the handler
// of its (what, phase), a collective to the handler of its payload, a Send/Recv to the pipeline handlers.
#include "exec/interpreter/interpreter.hpp"

#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <type_traits>

#include <fmt/core.h>

#include "exec/core/check.hpp"
#include "exec/core/clock.hpp"
#include "exec/core/errors.hpp"
#include "exec/interpreter/moe/all_to_all_dispatcher.hpp"

namespace twin::exec {

using model::CollectiveKind;
using model::ComputeKind;
using model::Op;
using model::OpKind;
using model::Payload;
using model::Phase;

Interpreter::Interpreter(const model::Program& program, int rank, Backend& backend, Communicator& comm,
                         ModelShard& shard)
    : ctx_(program, rank, backend, comm, shard),
      program_(program),
      scenario_(program.scenario),
      rank_(rank),
      coord_(ctx_.coord),
      backend_(backend),
      comm_(comm),
      shard_(shard),
      dims_(ctx_.dims),
      ops_(ctx_.ops),
      optimizer_(ctx_) {
  if (program.granularity != model::Granularity::Op) {
    throw std::invalid_argument("the executor runs op-granularity Programs (build_program(scenario, Granularity::Op))");
  }
  std::map<std::pair<int, int>, std::size_t> last_op;
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    if (ops_[i].micro_batch >= 0 && ops_[i].chunk >= 0) last_op[{ops_[i].micro_batch, ops_[i].chunk}] = i;
  }
  release_after_.assign(ops_.size(), false);
  for (const auto& [key, index] : last_op) release_after_[index] = true;
  find_turns();
  if (scenario_.model.is_moe()) moe_ = std::make_unique<MoeLayer>(ctx_, std::make_unique<AllToAllDispatcher>(ctx_));
  if (dims_.cp > 1) context_ = make_context_attention(ctx_);
  if (scenario_.model.fp8 != model::Fp8Format::None) fp8_ = std::make_unique<Fp8Linear>(ctx_);
  if (moe_ && fp8_) moe_->use_fp8(fp8_.get());
  build_dispatch_tables();
  if (scenario_.shards_parameters()) plan_parameter_lifetimes();
}

Interpreter::~Interpreter() = default;

// The last stage of a V holds virtual stages pp - 1 (chunk 0) and pp (chunk 1): each micro-batch's last forward op of
// chunk 0 and last backward op of chunk 1 end where a Send would go.
void Interpreter::find_turns() {
  turn_after_.assign(ops_.size(), false);
  const auto& p = scenario_.parallel;
  if (!p.v_shape() || coord_.pp != p.pp - 1) return;
  std::map<int, std::size_t> last_forward, last_backward;  // by micro-batch
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    const Op& op = ops_[i];
    if (op.micro_batch < 0) continue;
    if (op.chunk == 0 && op.phase == Phase::Forward) last_forward[op.micro_batch] = i;
    if (op.chunk == 1 && op.phase == Phase::Backward) last_backward[op.micro_batch] = i;
  }
  for (const auto& [micro_batch, index] : last_forward) turn_after_[index] = true;
  for (const auto& [micro_batch, index] : last_backward) turn_after_[index] = true;
}

// ---- ZeRO-3: when a bucket's parameters are whole ------------------------------------------------------------------

// The Program gathers a bucket before the ops that read it (Parameters all-gathers) and marks the op after which FSDP
// reshards it (Op::frees_parameters: a layer's last op of each forward and backward; the root's, the embedding's and
// the head's buckets, after the embedding's backward).
void Interpreter::plan_parameter_lifetimes() {
  parameters_read_.assign(ops_.size(), nullptr);
  free_after_.assign(ops_.size(), {});
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    const Op& op = ops_[i];
    if (op.kind == OpKind::Compute) parameters_read_[i] = parameters_read_by(op);
    if (!op.frees_parameters) continue;
    if (op.layer >= 0) {
      free_after_[i].push_back(&shard_.bucket(op.layer, ComputeKind::TransformerLayer));
    } else {
      if (shard_.first_stage()) free_after_[i].push_back(&shard_.bucket(-1, ComputeKind::Embedding));
      if (shard_.last_stage()) free_after_[i].push_back(&shard_.bucket(-1, ComputeKind::LmHead));
    }
  }
}

// The bucket whose parameters a compute op reads: its layer's for every op of a layer (the weightless ones too: they
// run inside the same gather), the embedding's for the embedding and for the LM head tied to it on the same stage,
// the head's for the final layernorm and an untied (or copied) LM head; none for the loss and the optimizer (which
// updates only this rank's shard).
Bucket* Interpreter::parameters_read_by(const Op& op) {
  if (op.layer >= 0) return &shard_.bucket(op.layer, ComputeKind::TransformerLayer);
  switch (op.what) {
    case ComputeKind::Embedding:
      return &shard_.bucket(-1, ComputeKind::Embedding);
    case ComputeKind::FinalLayerNorm:
      return &shard_.bucket(-1, ComputeKind::LmHead);
    case ComputeKind::LmHead:
      return scenario_.framework.tied_embeddings && shard_.first_stage() ? &shard_.bucket(-1, ComputeKind::Embedding)
                                                                         : &shard_.bucket(-1, ComputeKind::LmHead);
    default:
      return nullptr;
  }
}

// ---- dispatch tables ------------------------------------------------------------------------------------------------

void Interpreter::build_dispatch_tables() {
  using I = Interpreter;
  struct ComputeRoute {
    ComputeKind what;
    Method forward;  // also runs the Recompute phase (the handler reads op.phase)
    Method backward;
  };
  const auto bind = [this](Method method) -> Handler { return [this, method](const Op& op) { (this->*method)(op); }; };
  // clang-format off
  const ComputeRoute compute_routes[] = {
      {ComputeKind::Embedding,           &I::embedding_forward,             &I::embedding_backward},
      {ComputeKind::LayerNormAttention,  &I::layernorm_attention_forward,   &I::layernorm_attention_backward},
      {ComputeKind::QkvProjection,       &I::qkv_forward,                   &I::qkv_backward},
      {ComputeKind::AttentionCore,       &I::attention_core_forward,        &I::attention_core_backward},
      {ComputeKind::AttentionProjection, &I::attention_projection_forward,  &I::attention_projection_backward},
      {ComputeKind::AttentionResidual,   &I::attention_residual_forward,    &I::attention_residual_backward},
      {ComputeKind::LayerNormMlp,        &I::layernorm_mlp_forward,         &I::layernorm_mlp_backward},
      {ComputeKind::MlpUp,               &I::mlp_up_forward,                &I::mlp_up_backward},
      {ComputeKind::Gelu,                &I::gelu_forward,                  &I::gelu_backward},
      {ComputeKind::Swiglu,              &I::swiglu_forward,                &I::swiglu_backward},
      {ComputeKind::MlpDown,             &I::mlp_down_forward,              &I::mlp_down_backward},
      {ComputeKind::MlpResidual,         &I::mlp_residual_forward,          &I::mlp_residual_backward},
      {ComputeKind::FinalLayerNorm,      &I::final_layernorm_forward,       &I::final_layernorm_backward},
      {ComputeKind::LmHead,              &I::lm_head_forward,               &I::lm_head_backward},
      {ComputeKind::CrossEntropy,        &I::cross_entropy_forward,         &I::cross_entropy_backward},
  };
  // clang-format on
  for (const ComputeRoute& route : compute_routes) {
    auto& row = compute_handlers_[static_cast<int>(route.what)];
    row[static_cast<int>(Phase::Forward)] = bind(route.forward);
    row[static_cast<int>(Phase::Recompute)] = bind(route.forward);
    row[static_cast<int>(Phase::Backward)] = bind(route.backward);
  }
  compute_handlers_[static_cast<int>(ComputeKind::OptimizerStep)][static_cast<int>(Phase::Optimizer)] =
      [this](const Op& op) { optimizer_.step(op); };
  for (ComputeKind what :
       {ComputeKind::QkvProjection, ComputeKind::AttentionProjection, ComputeKind::MlpUp, ComputeKind::MlpDown}) {
    compute_handlers_[static_cast<int>(what)][static_cast<int>(Phase::WeightGrad)] =
        bind(&Interpreter::linear_weight_gradient);
  }

  auto route = [&](Payload payload, auto handler) {
    if constexpr (std::is_same_v<decltype(handler), Method>) {
      collective_handlers_[static_cast<int>(payload)] = bind(handler);
    } else {
      collective_handlers_[static_cast<int>(payload)] = handler;
    }
  };
  const auto optimizer = [this](void (Optimizer::*method)(const Op&)) -> Handler {
    return [this, method](const Op& op) { (optimizer_.*method)(op); };
  };
  route(Payload::LayerOutput, &Interpreter::reduce_tensor_parallel);              // row-parallel output: AR, or RS (SP)
  route(Payload::InputGrad, &Interpreter::reduce_tensor_parallel);                // column-parallel dinput: AR, or RS
  route(Payload::LayerInput, &Interpreter::gather_layer_input);                   // SP: gather a GEMM's input
  route(Payload::OutputGrad, &Interpreter::gather_output_grad);                   // SP: gather a GEMM's dout
  route(Payload::CrossEntropyStats, &Interpreter::gather_cross_entropy_stats);    // vocab-parallel CE statistics
  route(Payload::LayerNormGrads, optimizer(&Optimizer::reduce_layernorm_grads));  // SP: replicated params' grads
  route(Payload::EmbeddingGrads, optimizer(&Optimizer::reduce_embedding_grads));  // tied embedding, first + last stage
  route(Payload::Gradients, optimizer(&Optimizer::reduce_data_parallel_grads));   // DP: AR, or RS under ZeRO-1 / 3
  route(Payload::GradNormSquared, optimizer(&Optimizer::gradient_norm));          // global norm for clipping
  route(Payload::Parameters, optimizer(&Optimizer::gather_parameters));           // ZeRO-1 / 3: gather the shards
  route(Payload::CheckpointedInput, &Interpreter::gather_checkpointed_input);     // DeepSpeed: a layer's kept input
  if (moe_) {
    const Handler exchange = [moe = moe_.get()](const Op& op) { moe->exchange(op); };
    route(Payload::Tokens, exchange);        // MoE: dispatch and combine
    route(Payload::ExpertCounts, exchange);  // MoE: tokens per expert over TP, the dispatcher's counts
    route(Payload::ExpertProbs, exchange);   // MoE: the rows' probabilities beside them
  }
  if (fp8_) route(Payload::Fp8Amax, [this](const Op& op) { fp8_->reduce_amaxes(op); });  // FP8: amaxes to their max
  if (context_) {  // CP: the way's exchanges (all_gather: K, V and their gradients; a2a: to heads and back)
    const Handler exchange = [context = context_.get()](const Op& op) { context->exchange(op); };
    for (Payload payload : {Payload::ContextKeys, Payload::ContextValues, Payload::ContextKeyGrads,
                            Payload::ContextValueGrads, Payload::UlyssesQueries, Payload::UlyssesKeys,
                            Payload::UlyssesValues, Payload::UlyssesOutput, Payload::UlyssesOutputGrad,
                            Payload::UlyssesQueryGrads, Payload::UlyssesKeyGrads, Payload::UlyssesValueGrads}) {
      route(payload, exchange);
    }
  }
}

// ---- the loop -------------------------------------------------------------------------------------------------------

IterationOutput Interpreter::run_iteration(const IterationInput& input, std::vector<OpTiming>* timings,
                                           double epoch_s) {
  const auto micro_batches = static_cast<std::size_t>(scenario_.parallel.micro_batches());
  TWIN_EXEC_CHECK(input.micro_batches.size() == micro_batches, "rank {} got {} micro-batches, the plan has {}", rank_,
                  input.micro_batches.size(), micro_batches);
  ctx_.begin_iteration(input);
  if (moe_) moe_->begin_iteration();
  if (context_) context_->begin_iteration();
  shard_.zero_grads();
  if (fp8_) fp8_->begin_iteration();
  if (timings != nullptr) timings->reserve(timings->size() + ops_.size());

  for (std::size_t i = 0; i < ops_.size(); ++i) {
    ctx_.current_op = i;
    if (input.progress != nullptr) input.progress->mark(input.step, static_cast<int>(i));
    const double start = timings ? now_s() : 0;
    if (input.observer != nullptr) input.observer->op_starting(ops_[i]);
    execute(i);
    if (static_cast<int>(i) == input.poison_after_op) poison(ops_[i]);
    if (input.observer != nullptr) input.observer->op_done(ops_[i]);
    if (timings != nullptr) {
      backend_.synchronize();
      timings->push_back(OpTiming{static_cast<int>(i), start - epoch_s, now_s() - epoch_s});
    }
    if (turn_after_[i]) pass_through_turn(ops_[i]);
    if (release_after_[i]) release(ops_[i].micro_batch, ops_[i].chunk);
  }
  TWIN_EXEC_CHECK(ctx_.chunks().empty(), "rank {}: {} micro-batch states left after the iteration", rank_,
                  ctx_.chunks().size());
  return ctx_.output;
}

void Interpreter::release(int micro_batch, int chunk) {
  ctx_.chunks().erase({micro_batch, chunk});
  if (moe_) moe_->release(micro_batch, chunk);
  if (context_) context_->release(micro_batch, chunk);
}

void Interpreter::execute(std::size_t index) {
  const Op& op = ops_[index];
  Handler routed;  // an MoE layer's MLP op, a Send or a Recv (a pointer's capture: no allocation)
  const Handler* handler = &routed;
  switch (op.kind) {
    case OpKind::Compute:
      // an MoE layer's MLP ops (its shared experts' MlpUp / activation / MlpDown, the router and experts) are the
      // MoE runner's
      if (moe_ && op.layer >= 0 && shard_.is_moe_layer(op.layer) && moe_->runs(op)) {
        routed = [moe = moe_.get()](const Op& o) { moe->compute(o); };
      } else {
        handler = &compute_handlers_[static_cast<int>(op.what)][static_cast<int>(op.phase)];
      }
      break;
    case OpKind::Collective:
      handler = &collective_handlers_[static_cast<int>(op.payload)];
      break;
    case OpKind::Send:
      routed = [this](const Op& o) { send(o); };
      break;
    case OpKind::Recv:
      routed = [this](const Op& o) { recv(o); };
      break;
  }
  if (!*handler) {
    throw InternalError(fmt::format("rank {}: {}: the executor has no handler for it", rank_, ctx_.label(index)));
  }
  // ZeRO-3: the freed regions are NaN, which would only surface ops later as a "diverged" loss or gradient norm;
  // name the op that read them and the gather it lacks.
  if (!parameters_read_.empty() && parameters_read_[index] != nullptr && parameters_read_[index]->other_shards_freed) {
    const Bucket& b = *parameters_read_[index];
    const std::string bucket = b.layer >= 0 ? b.name : "the " + b.name;  // "layer 3", "the embedding", "the head"
    throw InternalError(fmt::format(
        "rank {}: {} reads the parameters of {}, but this rank holds only its own shard of them (ZeRO-3 frees the "
        "other ranks' shards after a layer's forward and after its backward): the Program lacks "
        "a Parameters all-gather of {} before this op",
        rank_, ctx_.label(index), bucket, bucket));
  }
  try {
    (*handler)(op);
  } catch (const RunFailure&) {
    throw;  // already names the rank, the op and the group (or, training diverged, the step and the rank)
  } catch (const std::exception& error) {
    throw std::runtime_error(fmt::format("rank {}: {}: {}", rank_, ctx_.label(index), error.what()));
  }
  if (!free_after_.empty())
    for (Bucket* bucket : free_after_[index]) shard_.free_other_shards(*bucket);
}

Tensor Interpreter::take_grad_full(ChunkState& state) {
  Tensor full = state.work.grad_full.empty() ? state.grad : state.work.grad_full;
  state.work.grad_full = Tensor{};
  return full;
}

void RankProgress::mark(int step_now, int op_now) {
  step.store(step_now, std::memory_order_relaxed);
  op.store(op_now, std::memory_order_relaxed);
  at_s.store(now_s(), std::memory_order_relaxed);
}

void Interpreter::poison(const Op& op) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto poison_first = [&](const Tensor& t) {
    if (!t.empty()) backend_.upload_f32(t.slice(0, 1), &nan);
  };
  const auto it = ctx_.chunks().find({op.micro_batch, op.chunk});
  if (op.micro_batch >= 0 && it != ctx_.chunks().end()) {
    poison_first(op.phase == Phase::Backward ? it->second.grad : it->second.hidden);
    return;
  }
  std::vector<Bucket>& buckets = shard_.buckets();
  TWIN_EXEC_CHECK(!buckets.empty(), "rank {} holds no parameters to poison", rank_);
  poison_first(buckets.front().grads);
}

}  // namespace twin::exec

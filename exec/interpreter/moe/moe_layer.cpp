// The Mixture-of-Experts MLP of one layer (model/ops/moe_ops.hpp gives the op order; the Backend's MoE block the
// kernels). Its input is the second layer norm's output, this rank's T = tokens_sp tokens; its output, (T, C) in the
// layer stash's fc_proj, is what the MLP residual adds (no TP reduction: every rank's MoE works on its own tokens).
// Token dropping (model.capacity_factor > 0, cpu backend): after the top-k, each expert keeps the capacity of its
// (token, slot) pairs with the highest probabilities (Megatron-Core's apply_router_token_dropping, drop policy "probs";
// kernels/cpu/moe.hpp's moe_capacity_drop), computed on the host from the downloaded probabilities in permute_forward.
// A dropped pair gets no row (k::kMoeDropped), adds nothing to its token and gets no gradient; the load-balancing loss
// keeps the counts of the top-k before the drop, as Megatron-Core's. No padding to capacity
// (moe_pad_expert_input_to_capacity): the padded rows are zeros, numerically nothing.
//   forward   [shared experts: MlpUp, activation, MlpDown] -> Router (logits, top-k softmax, scores, counts)
//             [-> ExpertCounts all-reduce over TP] [-> their all-gather over the expert grid]
//             -> ExpertPermute (permutation, load-balancing loss) -> ExpertSplitsSync (nothing to run here)
//             [-> dispatch] -> ExpertUp (grouped) -> activation -> ExpertDown (grouped) [-> combine]
//             -> ExpertUnpermute (weighted by the probabilities, added to the shared experts' output)
//   backward  the reverse; Router's backward adds the load-balancing loss's gradient to the top-k softmax's.
// The bracketed dispatch and combine (and the counts' all-gather) are the token dispatcher's (token_dispatcher.hpp);
// with ep = 1 there is no dispatch and the local experts read the permuted rows themselves.
// An activation op of an MoE layer is the routed experts' when it follows ExpertUp (ExpertDown in the backward), else
// the shared experts'. Every kernel runs through the Backend (its MoE block); the integer bookkeeping (permutation
// rows, tokens per expert, split sizes) runs on the host from the chosen experts, downloaded once per layer and
// micro-batch: the host wait Megatron-Core also pays before its all-to-all (model/ops/moe_host_sync.hpp). Rows and
// activations are in the backend's activation dtype; probabilities, scores and the loss fp32.
//
// The load-balancing loss joins the training loss as Megatron-Core adds it (MoEAuxLossAutoScaler, its gradient scaled
// by 1 / micro-batches, then averaged over DP like every gradient): objective = cross-entropy (mean over the global
// batch's tokens) + mean over the global batch's micro-batches of the sum over MoE layers of coeff x balance loss.
#include <algorithm>
#include <numeric>

#include <fmt/core.h>

#include "exec/core/check.hpp"
#include "exec/core/errors.hpp"
#include "exec/interpreter/fp8_linear.hpp"
#include "exec/interpreter/moe/moe_layer.hpp"
#include "kernels/cpu/moe.hpp"  // the host bookkeeping only: moe_tokens_per_expert, moe_permutation
#include "model/ops/compute_ops.hpp"  // runs_in_fp8

namespace twin::exec {

namespace k = kernels::cpu;
using model::ComputeKind;
using model::Op;
using model::Phase;

void refuse_unsupported_moe(const model::Scenario& s, std::string_view backend) {
  if (!s.model.is_moe()) return;
  const auto refuse = [&](std::string_view why) {
    throw RunError(fmt::format("{}: model.experts = {}: {}", s.source, s.model.experts, why));
  };
  if (s.model.capacity_factor > 0 && backend != "cpu") {
    refuse(
        fmt::format("model.capacity_factor = {}: the {} backend trains dropless MoE only (capacity_factor = 0); "
                    "token dropping runs on --backend cpu",
                    s.model.capacity_factor, backend));
  }
  // The dispatcher moves the same rows to the same experts; the executor exchanges them its own way, so the key would
  // do nothing here (it prices the flex dispatcher's deduplicated exchange in twin sim).
  if (s.framework.moe_dispatcher != model::MoeDispatcher::AllToAll) {
    refuse(
        "framework.moe_dispatcher = \"flex\": twin run exchanges every expert's rows itself (the same losses as "
        "any dispatcher); the key is twin sim's, for DeepEP's and HybridEP's deduplicated traffic: leave it out "
        "to train");
  }
  // Padding rows are zeros that change no loss; the executor dispatches the kept rows only, so the key would do nothing
  // here (it prices the drop-and-pad dispatch in twin sim).
  if (s.model.pad_to_capacity) {
    refuse("model.pad_to_capacity: twin run drops tokens without padding the experts' rows (zero rows, the same "
           "losses); the key is twin sim's, for the drop-and-pad dispatch's time: leave it out to train");
  }
  // Megatron-Core computes the capacity from the tokens each rank routes: under TP with sequence parallelism a TP
  // rank's shard, so the tokens it drops are not those one rank routing the whole sequence would drop.
  if (s.model.capacity_factor > 0 && s.parallel.tp > 1) {
    refuse(
        fmt::format("model.capacity_factor = {} with parallel.tp = {}: each TP rank drops within its own sequence "
                    "shard (Megatron-Core's capacity is per rank), which the executor does not run; drop tokens "
                    "with tp = 1",
                    s.model.capacity_factor, s.parallel.tp));
  }
  if (s.parallel.tp > 1 && !s.parallel.sequence_parallel) {
    refuse(
        fmt::format("parallel.tp = {} needs parallel.sequence_parallel = true in the executor (each TP rank routes "
                    "its own sequence shard, as Megatron-Core)",
                    s.parallel.tp));
  }
  if (s.model.shared_norm) refuse("model.shared_norm: an MoE layer needs its own MLP layer norm");
  if (s.parallel.cp > 1) {
    refuse(fmt::format("parallel.cp = {}: the executor does not combine context parallelism with MoE layers yet",
                       s.parallel.cp));
  }
}

namespace {

bool recomputing(const Op& op) {
  return op.phase == Phase::Recompute;
}

}  // namespace

MoeLayer::MoeLayer(RankContext& ctx, std::unique_ptr<TokenDispatcher> dispatcher)
    : ctx_(ctx), dispatcher_(std::move(dispatcher)) {
  using L = MoeLayer;
  struct Route {
    ComputeKind what;
    Handler forward, backward;  // forward also runs the Recompute phase
  };
  // clang-format off
  const Route routes[] = {
      {ComputeKind::MlpUp,            &L::shared_up_forward,    &L::shared_up_backward},
      {ComputeKind::Gelu,             &L::activation_forward,   &L::activation_backward},
      {ComputeKind::Swiglu,           &L::activation_forward,   &L::activation_backward},
      {ComputeKind::MlpDown,          &L::shared_down_forward,  &L::shared_down_backward},
      {ComputeKind::Router,           &L::router_forward,       &L::router_backward},
      {ComputeKind::ExpertPermute,    &L::permute_forward,      &L::permute_backward},
      {ComputeKind::ExpertSplitsSync, &L::splits_sync,          &L::splits_sync},
      {ComputeKind::ExpertUp,         &L::experts_up_forward,   &L::experts_up_backward},
      {ComputeKind::ExpertDown,       &L::experts_down_forward, &L::experts_down_backward},
      {ComputeKind::ExpertUnpermute,  &L::unpermute_forward,    &L::unpermute_backward},
  };
  // clang-format on
  for (const Route& route : routes) {
    auto& row = handlers_[static_cast<int>(route.what)];
    row[static_cast<int>(Phase::Forward)] = route.forward;
    row[static_cast<int>(Phase::Recompute)] = route.forward;
    row[static_cast<int>(Phase::Backward)] = route.backward;
  }
}

MoeLayer::~MoeLayer() = default;

MoeLayer::Handler MoeLayer::handler(const Op& op) const {
  return handlers_[static_cast<int>(op.what)][static_cast<int>(op.phase)];
}

void MoeLayer::compute(const Op& op) {
  (this->*handler(op))(op);
}

void MoeLayer::exchange(const Op& op) {
  MoeStash& m = stash(op);
  if (op.payload == model::Payload::ExpertCounts && op.collective == model::CollectiveKind::AllReduce) {
    // sequence parallel: the router's tokens per expert summed over TP, for the load-balancing loss
    ctx_.comm.all_reduce(ctx_.group(op.group), m.counts.data(), m.counts.size(), DType::F32, ctx_.label());
    return;
  }
  dispatcher_->exchange(op, m);
}

void MoeLayer::begin_iteration() {
  stashes_.clear();
  dispatcher_->clear();
}

void MoeLayer::release(int micro_batch, int chunk) {
  for (auto it = stashes_.begin(); it != stashes_.end();) {
    if (it->first.micro_batch == micro_batch && it->first.chunk == chunk) {
      dispatcher_->release(it->first);
      it = stashes_.erase(it);
    } else {
      ++it;
    }
  }
}

MoeStash& MoeLayer::stash(const Op& op) {
  const StashKey key = StashKey::of(op);
  auto it = stashes_.find(key);
  if (it != stashes_.end()) return it->second;
  TWIN_EXEC_CHECK(op.phase == Phase::Forward, "rank {}: {} finds no MoE state of layer {}", ctx_.rank, ctx_.label(),
                  op.layer);
  return stashes_[key];
}

bool MoeLayer::in_fp8(const Op& op) const {
  return fp8_ != nullptr && model::runs_in_fp8(ctx_.scenario, op.what);
}

void MoeLayer::forget(const Op& op) {
  stashes_.erase(StashKey::of(op));
  dispatcher_->release(StashKey::of(op));
}

// ---- shared experts: one MLP of their summed width on the rank's tokens -----------------------------------------

void MoeLayer::shared_up_forward(const Op& op) {
  LayerStash& s = ctx_.stash(op);
  MoeStash& m = stash(op);
  const LayerTensors& w = ctx_.shard.layer_params(op.layer);
  const MoeDims& d = ctx_.shard.moe();
  m.shared_fc = ctx_.backend.allocate(numel(ctx_.dims.tokens_sp, d.shared_up), ctx_.backend.activation_dtype());
  linear_gemm_forward(ctx_, fp8_, op, m.shared_fc, s.ln2, w.shared_fc_weight, Tensor{}, ctx_.dims.tokens_sp,
                      ctx_.dims.hidden, d.shared_up);
}

void MoeLayer::shared_down_forward(const Op& op) {
  LayerStash& s = ctx_.stash(op);
  MoeStash& m = stash(op);
  const LayerTensors& w = ctx_.shard.layer_params(op.layer);
  s.fc_proj = ctx_.backend.allocate(numel(ctx_.dims.tokens_sp, ctx_.dims.hidden),
                                    ctx_.backend.activation_dtype());  // routed ones add
  linear_gemm_forward(ctx_, fp8_, op, s.fc_proj, m.shared_act, w.shared_fc_proj_weight, Tensor{}, ctx_.dims.tokens_sp,
                      ctx_.shard.moe().shared_ffn, ctx_.dims.hidden);
}

void MoeLayer::activation_forward(const Op& op) {
  MoeStash& m = stash(op);
  const MoeDims& d = ctx_.shard.moe();
  const bool routed = m.routed_activation_next;
  m.routed_activation_next = false;
  const Tensor& inp = routed ? m.expert_fc : m.shared_fc;
  Tensor& out = routed ? m.expert_act : m.shared_act;
  const int rows = routed ? std::accumulate(m.expert_rows.begin(), m.expert_rows.end(), 0) : ctx_.dims.tokens_sp;
  const int width = routed ? d.expert_ffn : d.shared_ffn;
  out = ctx_.backend.allocate(numel(rows, width), ctx_.backend.activation_dtype());
  if (rows == 0) return;  // this rank's experts received no token
  if (ctx_.dims.swiglu) {
    ctx_.backend.swiglu_forward(out, inp, rows, width);
  } else {
    ctx_.backend.gelu_forward(out, inp);
  }
}

// ---- routing ------------------------------------------------------------------------------------------------------

void MoeLayer::router_forward(const Op& op) {
  LayerStash& s = ctx_.stash(op);
  MoeStash& m = stash(op);
  const LayerTensors& w = ctx_.shard.layer_params(op.layer);
  const MoeDims& d = ctx_.shard.moe();
  const int T = ctx_.dims.tokens_sp;
  const Tensor logits = ctx_.backend.allocate(numel(T, d.experts), ctx_.backend.activation_dtype());
  ctx_.backend.matmul_forward(logits, s.ln2, w.router_weight, Tensor{}, T, ctx_.dims.hidden, d.experts);
  m.scores = ctx_.backend.allocate(numel(T, d.experts), DType::F32);
  ctx_.backend.moe_kernels().moe_router_scores_forward(m.scores, logits, T, d.experts);
  ctx_.require_finite(ctx_.backend.sum(m.scores),
                      "the router logits");  // a non-finite logit makes its row's scores NaN
  m.probs = ctx_.backend.allocate(numel(T, d.top_k), DType::F32);
  m.chosen_map = ctx_.backend.allocate(numel(T, d.top_k), DType::I32);
  ctx_.backend.moe_kernels().moe_topk_softmax_forward(m.probs, m.chosen_map, logits, T, d.experts, d.top_k);
  // The host wait of the layer: the chosen experts, from which the host derives counts, rows and split sizes.
  m.chosen.assign(numel(T, d.top_k), 0);
  ctx_.backend.download_i32(m.chosen.data(), m.chosen_map);
  m.counts.assign(static_cast<std::size_t>(d.experts), 0.0f);  // this shard's; an ExpertCounts all-reduce sums them
  k::moe_tokens_per_expert(m.counts.data(), m.chosen.data(), T, d.experts, d.top_k);
}

// Megatron-Core's wait for the tokens-per-expert counts on the host (model/ops/moe_host_sync.hpp): this executor waits
// earlier, in router_forward's download of the chosen experts, and its dispatch exchanges the counts on the host, so
// the op has nothing to run.
void MoeLayer::splits_sync(const Op& /*op*/) {}

void MoeLayer::permute_forward(const Op& op) {
  LayerStash& s = ctx_.stash(op);
  MoeStash& m = stash(op);
  const MoeDims& d = ctx_.shard.moe();
  const int T = ctx_.dims.tokens_sp;
  std::vector<int> kept = m.chosen;  // (T, k) the chosen experts, k::kMoeDropped where the capacity drops
  if (ctx_.scenario.model.capacity_factor > 0) {
    std::vector<float> probs(numel(T, d.top_k));
    ctx_.backend.download_f32(probs.data(), m.probs);
    const int capacity = k::moe_capacity(T, d.experts, d.top_k, ctx_.scenario.model.capacity_factor);
    const int dropped = k::moe_capacity_drop(kept.data(), probs.data(), T, d.experts, d.top_k, capacity);
    if (!recomputing(op)) ctx_.output.moe_dropped_slots += dropped;
  }
  m.rows.assign(numel(T, d.top_k), 0);
  m.rows_per_expert.assign(static_cast<std::size_t>(d.experts), 0);
  k::moe_permutation(m.rows.data(), m.rows_per_expert.data(), kept.data(), T, d.experts, d.top_k);
  m.row_map = ctx_.backend.allocate(numel(T, d.top_k), DType::I32);
  ctx_.backend.upload_i32(m.row_map, m.rows.data());
  m.permuted = ctx_.backend.allocate(numel(T * d.top_k, ctx_.dims.hidden), ctx_.backend.activation_dtype());
  ctx_.backend.moe_kernels().moe_permute_forward(m.permuted, s.ln2, m.row_map, T, ctx_.dims.hidden, d.top_k);
  if (!recomputing(op) && d.aux_loss_coeff > 0) {
    const double micro_batch_tokens = static_cast<double>(ctx_.dims.tokens);  // the counts cover every sequence shard
    ctx_.output.aux_loss_sum += ctx_.backend.moe_kernels().moe_aux_loss_forward(
        m.scores, m.counts, T, d.experts, d.top_k, micro_batch_tokens, d.aux_loss_coeff);
  }
  if (d.ep == 1) {  // no dispatch: this rank holds every expert
    m.expert_in = m.permuted;
    m.expert_rows = m.rows_per_expert;
  }
}

// ---- the local experts: grouped GEMMs over their expert-major rows ---------------------------------------------

void MoeLayer::experts_up_forward(const Op& op) {
  MoeStash& m = stash(op);
  const LayerTensors& w = ctx_.shard.layer_params(op.layer);
  const MoeDims& d = ctx_.shard.moe();
  const int rows = std::accumulate(m.expert_rows.begin(), m.expert_rows.end(), 0);
  m.expert_fc = ctx_.backend.allocate(numel(std::max(rows, 1), d.expert_up), ctx_.backend.activation_dtype());
  if (in_fp8(op)) {
    fp8_->grouped_forward(op, m.expert_fc, m.expert_in, w.expert_fc_weight, m.expert_rows,
                          d.ep_rank * d.local_experts, ctx_.dims.hidden, d.expert_up);
  } else {
    ctx_.backend.moe_kernels().moe_grouped_matmul_forward(m.expert_fc, m.expert_in, w.expert_fc_weight,
                                                          m.expert_rows, ctx_.dims.hidden, d.expert_up);
  }
  m.routed_activation_next = true;
}

void MoeLayer::experts_down_forward(const Op& op) {
  MoeStash& m = stash(op);
  const LayerTensors& w = ctx_.shard.layer_params(op.layer);
  const MoeDims& d = ctx_.shard.moe();
  const int rows = std::accumulate(m.expert_rows.begin(), m.expert_rows.end(), 0);
  m.expert_out = ctx_.backend.allocate(numel(std::max(rows, 1), ctx_.dims.hidden), ctx_.backend.activation_dtype());
  if (in_fp8(op)) {
    fp8_->grouped_forward(op, m.expert_out, m.expert_act, w.expert_fc_proj_weight, m.expert_rows,
                          d.ep_rank * d.local_experts, d.expert_ffn, ctx_.dims.hidden);
  } else if (rows > 0) {
    ctx_.backend.moe_kernels().moe_grouped_matmul_forward(m.expert_out, m.expert_act, w.expert_fc_proj_weight,
                                                          m.expert_rows, d.expert_ffn, ctx_.dims.hidden);
  }
  // no combine (and no ETP reduce-scatter): the rows are this rank's own, in permuted order
  if (d.ep == 1 && d.etp == 1) m.combined = m.expert_out;
}

void MoeLayer::unpermute_forward(const Op& op) {
  LayerStash& s = ctx_.stash(op);
  MoeStash& m = stash(op);
  const MoeDims& d = ctx_.shard.moe();
  const int T = ctx_.dims.tokens_sp;
  const Tensor out = ctx_.backend.allocate(numel(T, ctx_.dims.hidden), ctx_.backend.activation_dtype());
  ctx_.backend.moe_kernels().moe_unpermute_forward(out, m.combined, m.probs, m.row_map, T, ctx_.dims.hidden, d.top_k);
  if (d.shared_ffn > 0) {
    ctx_.backend.accumulate(s.fc_proj, out);
  } else {
    s.fc_proj = out;
  }
  m.permuted = Tensor{};
  m.expert_out = Tensor{};
}

// ---- backward -------------------------------------------------------------------------------------------------------
// state.grad (T, C) is dy, the MLP output's gradient; the MLP input's gradient builds up in state.work.d_ln (permute,
// router, shared experts), which the second layer norm's backward then reads.

void MoeLayer::unpermute_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  MoeStash& m = stash(op);
  const MoeDims& d = ctx_.shard.moe();
  const int T = ctx_.dims.tokens_sp;
  m.d_rows = ctx_.backend.allocate(numel(T * d.top_k, ctx_.dims.hidden), ctx_.backend.activation_dtype());
  m.d_probs = ctx_.backend.allocate(numel(T, d.top_k), DType::F32);
  ctx_.backend.moe_kernels().moe_unpermute_backward(m.d_rows, m.d_probs, state.grad, m.combined, m.probs, m.row_map, T,
                                                    ctx_.dims.hidden, d.top_k);
  m.combined = Tensor{};
}

void MoeLayer::experts_down_backward(const Op& op) {
  MoeStash& m = stash(op);
  const LayerTensors& w = ctx_.shard.layer_params(op.layer);
  const LayerTensors& g = ctx_.shard.layer_grads(op.layer);
  const MoeDims& d = ctx_.shard.moe();
  const int rows = std::accumulate(m.expert_rows.begin(), m.expert_rows.end(), 0);
  const Tensor d_act = ctx_.backend.allocate(numel(std::max(rows, 1), d.expert_ffn), ctx_.backend.activation_dtype());
  if (in_fp8(op)) {
    fp8_->grouped_backward(op, d_act, g.expert_fc_proj_weight, m.d_rows, m.expert_act, w.expert_fc_proj_weight,
                           m.expert_rows, d.ep_rank * d.local_experts, d.expert_ffn, ctx_.dims.hidden);
  } else if (rows > 0) {
    ctx_.backend.moe_kernels().moe_grouped_matmul_backward(d_act, g.expert_fc_proj_weight, m.d_rows, m.expert_act,
                                                           w.expert_fc_proj_weight, m.expert_rows, d.expert_ffn,
                                                           ctx_.dims.hidden);
  }
  m.d_rows = d_act;
  m.expert_act = Tensor{};
  m.routed_activation_next = true;
}

void MoeLayer::activation_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  MoeStash& m = stash(op);
  const MoeDims& d = ctx_.shard.moe();
  const bool routed = m.routed_activation_next;
  m.routed_activation_next = false;
  const Tensor& inp = routed ? m.expert_fc : m.shared_fc;
  Tensor& grad = routed ? m.d_rows : state.work.d_hidden;  // (rows, width) -> (rows, up width)
  const int rows = routed ? std::accumulate(m.expert_rows.begin(), m.expert_rows.end(), 0) : ctx_.dims.tokens_sp;
  const int width = routed ? d.expert_ffn : d.shared_ffn;
  const Tensor d_fc = ctx_.backend.allocate(numel(std::max(rows, 1), routed ? d.expert_up : d.shared_up),
                                            ctx_.backend.activation_dtype());
  if (rows > 0) {
    if (ctx_.dims.swiglu) {
      ctx_.backend.swiglu_backward(d_fc, inp, grad, rows, width);
    } else {
      ctx_.backend.gelu_backward(d_fc.slice(0, numel(rows, width)), inp, grad.slice(0, numel(rows, width)));
    }
  }
  grad = d_fc;
}

void MoeLayer::experts_up_backward(const Op& op) {
  MoeStash& m = stash(op);
  const LayerTensors& w = ctx_.shard.layer_params(op.layer);
  const LayerTensors& g = ctx_.shard.layer_grads(op.layer);
  const MoeDims& d = ctx_.shard.moe();
  const int rows = std::accumulate(m.expert_rows.begin(), m.expert_rows.end(), 0);
  const Tensor d_in =
      ctx_.backend.allocate(numel(std::max(rows, 1), ctx_.dims.hidden), ctx_.backend.activation_dtype());
  if (in_fp8(op)) {
    fp8_->grouped_backward(op, d_in, g.expert_fc_weight, m.d_rows, m.expert_in, w.expert_fc_weight, m.expert_rows,
                           d.ep_rank * d.local_experts, ctx_.dims.hidden, d.expert_up);
  } else if (rows > 0) {
    ctx_.backend.moe_kernels().moe_grouped_matmul_backward(d_in, g.expert_fc_weight, m.d_rows, m.expert_in,
                                                           w.expert_fc_weight, m.expert_rows, ctx_.dims.hidden,
                                                           d.expert_up);
  }
  m.d_rows = d_in;  // expert-major; with ep = 1 also the permuted order
  m.expert_in = Tensor{};
  m.expert_fc = Tensor{};
}

void MoeLayer::permute_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  MoeStash& m = stash(op);
  state.work.d_ln =
      ctx_.backend.allocate(numel(ctx_.dims.tokens_sp, ctx_.dims.hidden), ctx_.backend.activation_dtype());
  ctx_.backend.moe_kernels().moe_permute_backward(state.work.d_ln, m.d_rows, m.row_map, ctx_.dims.tokens_sp,
                                                  ctx_.dims.hidden, ctx_.shard.moe().top_k);
  m.d_rows = Tensor{};
}

void MoeLayer::router_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  LayerStash& s = ctx_.stash(op);
  MoeStash& m = stash(op);
  const LayerTensors& w = ctx_.shard.layer_params(op.layer);
  const LayerTensors& g = ctx_.shard.layer_grads(op.layer);
  const MoeDims& d = ctx_.shard.moe();
  const int T = ctx_.dims.tokens_sp;
  const Tensor d_logits = ctx_.backend.allocate(numel(T, d.experts), ctx_.backend.activation_dtype());
  MoeAuxLoss aux;
  if (d.aux_loss_coeff > 0) {
    const auto& p = ctx_.scenario.parallel;
    const double micro_batches = static_cast<double>(p.global_batch / p.micro_batch);  // of the whole global batch
    aux = MoeAuxLoss{static_cast<double>(ctx_.dims.tokens), d.aux_loss_coeff, 1.0 / micro_batches};
  }
  ctx_.backend.moe_kernels().moe_router_backward(d_logits, m.d_probs, m.probs, m.chosen_map, m.scores, m.counts, T,
                                                 d.experts, d.top_k, aux);
  const Tensor d_ln = ctx_.backend.allocate(numel(T, ctx_.dims.hidden), ctx_.backend.activation_dtype());
  ctx_.backend.matmul_backward(d_ln, g.router_weight, Tensor{}, d_logits, s.ln2, w.router_weight, T, ctx_.dims.hidden,
                               d.experts);
  ctx_.backend.accumulate(state.work.d_ln, d_ln);
  if (d.shared_ffn == 0) forget(op);  // the layer's last MoE op
}

void MoeLayer::shared_down_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  MoeStash& m = stash(op);
  const LayerTensors& w = ctx_.shard.layer_params(op.layer);
  const LayerTensors& g = ctx_.shard.layer_grads(op.layer);
  const MoeDims& d = ctx_.shard.moe();
  state.work.d_hidden =
      ctx_.backend.allocate(numel(ctx_.dims.tokens_sp, d.shared_ffn), ctx_.backend.activation_dtype());
  linear_gemm_backward(ctx_, fp8_, op, state.work.d_hidden, g.shared_fc_proj_weight, Tensor{}, state.grad,
                       m.shared_act, w.shared_fc_proj_weight, ctx_.dims.tokens_sp, d.shared_ffn, ctx_.dims.hidden);
}

void MoeLayer::shared_up_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  LayerStash& s = ctx_.stash(op);
  const LayerTensors& w = ctx_.shard.layer_params(op.layer);
  const LayerTensors& g = ctx_.shard.layer_grads(op.layer);
  const Tensor d_ln =
      ctx_.backend.allocate(numel(ctx_.dims.tokens_sp, ctx_.dims.hidden), ctx_.backend.activation_dtype());
  linear_gemm_backward(ctx_, fp8_, op, d_ln, g.shared_fc_weight, Tensor{}, state.work.d_hidden, s.ln2,
                       w.shared_fc_weight, ctx_.dims.tokens_sp, ctx_.dims.hidden, ctx_.shard.moe().shared_up);
  ctx_.backend.accumulate(state.work.d_ln, d_ln);
  state.work.d_hidden = Tensor{};
  forget(op);  // the layer's last MoE op
}

}  // namespace twin::exec

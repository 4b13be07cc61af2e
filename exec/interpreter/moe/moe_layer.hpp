// The Mixture-of-Experts MLP of a layer, as Megatron-Core's MoELayer (megatron/core/transformer/moe/moe_layer.py):
// route -> dispatch -> experts -> combine, beside the shared experts. The router, the permutation and the grouped
// experts run here; the exchanges between them are the token dispatcher's (token_dispatcher.hpp), an object the
// layer is given. It keeps each (micro-batch, chunk, layer)'s MoeStash from the forward to the backward; what it
// reads of the dense layer is the second layer norm's output (LayerStash::ln2), and it leaves its output where the
// dense MLP's would be (LayerStash::fc_proj) and its input gradient in BackwardWork::d_ln. moe_layer.cpp says how.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string_view>

#include "exec/interpreter/moe/moe_stash.hpp"
#include "exec/interpreter/moe/token_dispatcher.hpp"
#include "exec/interpreter/rank_context.hpp"

namespace twin::exec {

class Fp8Linear;

// Throws a RunError naming the field when `scenario`'s Mixture-of-Experts layers ask for what the executor does not
// run: token dropping off the cpu backend or with tensor parallelism, tensor parallelism without sequence parallelism,
// a shared norm. Nothing for a dense model. (A backend without MoE kernels at all is check_supported's refusal,
// exec/train/check_supported.hpp.)
void refuse_unsupported_moe(const model::Scenario& scenario, std::string_view backend);

class MoeLayer {
 public:
  MoeLayer(RankContext& ctx, std::unique_ptr<TokenDispatcher> dispatcher);
  ~MoeLayer();

  // Whether compute op `op` of an MoE layer is this runner's: its shared experts' MlpUp / activation / MlpDown, the
  // router, the permutation, the experts (forward, recompute, backward).
  bool runs(const model::Op& op) const { return handler(op) != nullptr; }
  void compute(const model::Op& op);
  // The layer's collectives: ExpertCounts (the router's all-reduce over TP here, the dispatcher's all-gather) and
  // Tokens (the dispatcher's).
  void exchange(const model::Op& op);
  // A new iteration, or the end of a (micro-batch, chunk): its stashes go.
  void begin_iteration();
  void release(int micro_batch, int chunk);
  // model.fp8: the runner of the GEMMs model::runs_in_fp8 names (the shared experts', each routed expert's).
  void use_fp8(Fp8Linear* fp8) { fp8_ = fp8; }

 private:
  using Handler = void (MoeLayer::*)(const model::Op&);
  Handler handler(const model::Op& op) const;
  MoeStash& stash(const model::Op& op);
  void forget(const model::Op& op);  // the layer's last MoE op of the backward ran
  bool in_fp8(const model::Op& op) const;

  // route
  void router_forward(const model::Op& op);
  void permute_forward(const model::Op& op);
  void splits_sync(const model::Op& op);  // nothing to run: this executor's split sizes are host values already
  void permute_backward(const model::Op& op);
  void router_backward(const model::Op& op);
  // experts (grouped GEMMs) and their activation, or the shared experts'
  void experts_up_forward(const model::Op& op);
  void activation_forward(const model::Op& op);
  void experts_down_forward(const model::Op& op);
  void experts_down_backward(const model::Op& op);
  void activation_backward(const model::Op& op);
  void experts_up_backward(const model::Op& op);
  void shared_up_forward(const model::Op& op);
  void shared_down_forward(const model::Op& op);
  void shared_down_backward(const model::Op& op);
  void shared_up_backward(const model::Op& op);
  // combine: the experts' rows back to their tokens, weighted
  void unpermute_forward(const model::Op& op);
  void unpermute_backward(const model::Op& op);

  RankContext& ctx_;
  std::unique_ptr<TokenDispatcher> dispatcher_;
  Fp8Linear* fp8_ = nullptr;  // model.fp8: the interpreter's
  static constexpr int kComputeKinds = static_cast<int>(model::kComputeKindCount),
                       kPhases = static_cast<int>(model::Phase::WeightGrad) + 1;
  std::array<std::array<Handler, kPhases>, kComputeKinds> handlers_{};  // by (what, phase)
  std::map<StashKey, MoeStash> stashes_;
};

}  // namespace twin::exec

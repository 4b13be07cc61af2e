// A Mixture-of-Experts layer's parameters (Megatron-Core's MoE layer: router.py TopKRouter, experts.py GroupedMLP,
// shared_experts.py SharedExpertMLP), laid out so that every plan draws the same numbers:
//   layers.L.mlp.router.weight            (E, C)       replicated across TP, in the bucket's replicated prefix (its
//                                                      gradient, from a sequence shard, is summed across TP as the
//                                                      layernorms' are: Megatron-Core marks it sequence-parallel)
//   layers.L.mlp.shared.fc.weight          (S_up, C)   the shared experts as one MLP of their summed width S,
//   replicated layers.L.mlp.shared.fc_proj.weight     (C, S)      across TP and in the prefix too (the executor runs
//   them on the
//                                                      rank's sequence shard; Megatron-Core splits them over TP)
//   layers.L.mlp.experts.G.fc.weight       (F_up, C)   routed expert G (global index): in the layer's experts bucket
//   layers.L.mlp.experts.G.fc_proj.weight  (C, F)      on the EP rank holding G, fc's of the local experts first;
//                                                      split over parallel.etp as a dense MLP is over TP
// Each tensor's random stream follows from its name, so expert G has the same weights on one rank and under every EP
// size. No biases: GroupedMLP has none.
#include <fmt/core.h>

#include "exec/core/check.hpp"
#include "exec/shard/model_shard.hpp"
#include "model/plan/ranks.hpp"
#include "model/program/program.hpp"

namespace twin::exec {

MoeDims::MoeDims(const model::Scenario& s, const model::RankShapes& shapes, model::RankCoord coord) {
  if (!s.model.is_moe()) return;
  const auto narrow = [](std::int64_t width) { return static_cast<int>(width); };
  experts = narrow(shapes.experts);
  top_k = narrow(shapes.top_k);
  const model::RankLayout layout = model::rank_layout(s);
  const model::ExpertCoord expert = layout.expert_coord_of(layout.rank_of(coord));
  ep = layout.ep();
  ep_rank = expert.ep;
  edp = layout.edp();
  edp_rank = expert.edp;
  local_experts = narrow(shapes.local_experts);
  etp = layout.etp();
  etp_rank = expert.etp;
  expert_ffn = narrow(shapes.expert_ffn_local);
  expert_up = narrow(shapes.expert_up_local);
  shared_ffn = narrow(shapes.shared_ffn);
  shared_up = narrow(shapes.shared_up);
  aux_loss_coeff = s.model.moe_aux_loss_coeff;
}

namespace {

ParamTensor matrix(std::string name, std::int64_t rows, std::int64_t cols, Init init, bool tp_replicated,
                   Sharding sharding = Sharding::Replicated) {
  return param_tensor(std::move(name), rows, cols, sharding, init, /*decay=*/true, tp_replicated);
}

}  // namespace

void ModelShard::add_moe_router(Bucket& b, int layer) const {
  const std::string n = fmt::format("layers.{}.mlp.", layer);
  const std::int64_t C = dims_.hidden;
  auto replicated = [&](ParamTensor t) {
    b.replicated_prefix += static_cast<std::size_t>(t.rows * t.cols);
    b.tensors.push_back(std::move(t));
  };
  replicated(matrix(n + "router.weight", moe_.experts, C, Init::Normal, true));
  if (moe_.shared_ffn > 0) {
    replicated(matrix(n + "shared.fc.weight", moe_.shared_up, C, Init::Normal, true));
    replicated(matrix(n + "shared.fc_proj.weight", C, moe_.shared_ffn, Init::ResidualNormal, true));
  }
}

void ModelShard::add_expert_bucket(int layer) {
  Bucket b;
  b.name = fmt::format("layer {} experts", layer);
  b.layer = layer;
  b.what = model::ComputeKind::TransformerLayer;
  b.experts = true;
  const std::int64_t C = dims_.hidden, F = moe_.expert_ffn * moe_.etp, UP = moe_.expert_up * moe_.etp;
  const Sharding up_rows = dims_.swiglu ? Sharding::ExpertGateUpRows : Sharding::ExpertRows;
  const int first = moe_.ep_rank * moe_.local_experts;
  for (int e = first; e < first + moe_.local_experts; ++e) {
    b.tensors.push_back(
        matrix(fmt::format("layers.{}.mlp.experts.{}.fc.weight", layer, e), UP, C, Init::Normal, false, up_rows));
  }
  for (int e = first; e < first + moe_.local_experts; ++e) {
    b.tensors.push_back(matrix(fmt::format("layers.{}.mlp.experts.{}.fc_proj.weight", layer, e), C, F,
                               Init::ResidualNormal, false, Sharding::ExpertColumns));
  }
  add_bucket(std::move(b));
}

void ModelShard::bind_moe_views(const Bucket& b, LayerTensors& values, LayerTensors& grads) const {
  if (b.experts) {  // the local experts' fc's back to back, then their fc_proj's
    const std::size_t fc = static_cast<std::size_t>(moe_.local_experts) * moe_.expert_up * dims_.hidden;
    const std::size_t fc_proj = static_cast<std::size_t>(moe_.local_experts) * dims_.hidden * moe_.expert_ffn;
    TWIN_EXEC_CHECK(b.numel == fc + fc_proj, "bucket {} holds {} elements, its experts {}", b.name, b.numel,
                    fc + fc_proj);
    values.expert_fc_weight = b.params.slice(0, fc);
    grads.expert_fc_weight = b.grads.slice(0, fc);
    values.expert_fc_proj_weight = b.params.slice(fc, fc_proj);
    grads.expert_fc_proj_weight = b.grads.slice(fc, fc_proj);
    return;
  }
  for (const ParamTensor& t : b.tensors) {
    auto bind = [&](Tensor LayerTensors::*field, std::string_view suffix) {
      if (t.name.ends_with(suffix)) {
        values.*field = t.value;
        grads.*field = t.grad;
      }
    };
    bind(&LayerTensors::router_weight, ".mlp.router.weight");
    bind(&LayerTensors::shared_fc_weight, ".mlp.shared.fc.weight");
    bind(&LayerTensors::shared_fc_proj_weight, ".mlp.shared.fc_proj.weight");
  }
  TWIN_EXEC_CHECK(!values.router_weight.empty(), "bucket {} has no router", b.name);
}

}  // namespace twin::exec

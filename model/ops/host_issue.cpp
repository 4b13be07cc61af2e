#include "model/ops/host_issue.hpp"

#include "model/ops/moe_host_sync.hpp"

namespace twin::model {

namespace {

bool pipeline_message(const Op& op) {
  return (op.kind == OpKind::Send || op.kind == OpKind::Recv) && op.group != Group::Context;
}

// The MoE layer's parts whose sizes are the router's data under dropless routing.
bool dropless_token_path(ComputeKind what) {
  switch (what) {
    case ComputeKind::ExpertPermute:
    case ComputeKind::ExpertUp:
    case ComputeKind::ExpertDown:
    case ComputeKind::ExpertUnpermute:
    case ComputeKind::ExpertSplitsSync:
      return true;
    default:
      return false;
  }
}

}  // namespace

bool host_waits_for(const Scenario& s, const Op& op) {
  if (host_waits_for(op)) return true;
  return s.framework.name == Framework::Megatron && s.parallel.pp > 1 && s.parallel.virtual_stages == 1 &&
         pipeline_message(op);
}

bool cuda_graph_captures(const Scenario& s, const Op& op) {
  if (!s.framework.cuda_graphs || op.layer < 0 || op.phase == Phase::Optimizer) return false;
  if (op.kind == OpKind::Send || op.kind == OpKind::Recv) return op.group == Group::Context;  // the CP ring's
  if (op.kind != OpKind::Compute && op.group != Group::Tensor && op.group != Group::Context &&
      op.group != Group::Expert && op.group != Group::ExpertTensor && op.group != Group::ExpertTensorAndExpert) {
    return false;  // data-parallel gradients and parameters: issued by the optimizer's hooks, between graphs
  }
  return s.model.capacity_factor > 0 || !dropless_token_path(op.what);
}

CudaGraphKey cuda_graph_key(const Op& op) {
  return {op.layer, op.micro_batch, op.phase};
}

TeModule te_module(const Scenario& s, const Op& op) {
  if (!s.framework.transformer_engine || op.kind != OpKind::Compute || op.layer < 0) return TeModule::None;
  if (op.phase == Phase::Optimizer || op.phase == Phase::WeightGrad) return TeModule::None;
  const bool moe = s.is_moe_layer(op.layer);
  switch (op.what) {
    case ComputeKind::LayerNormAttention:
      return TeModule::FusedIntoModule;
    case ComputeKind::QkvProjection:
      return TeModule::LayerNormLinear;
    case ComputeKind::AttentionProjection:
    case ComputeKind::MlpDown:
      return TeModule::Linear;
    case ComputeKind::LayerNormMlp:
      return moe ? TeModule::None : TeModule::FusedIntoModule;
    case ComputeKind::MlpUp:
      return moe ? TeModule::Linear : TeModule::LayerNormLinear;
    case ComputeKind::ExpertUp:
    case ComputeKind::ExpertDown:
      return TeModule::GroupedLinear;
    default:
      return TeModule::None;
  }
}

}  // namespace twin::model

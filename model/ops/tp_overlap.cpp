#include "model/ops/tp_overlap.hpp"

namespace twin::model {

HiddenUnder tp_overlap(const Scenario& scenario, const Op& collective) {
  if (!scenario.framework.tp_comm_overlap || collective.kind != OpKind::Collective) return HiddenUnder::Nothing;
  if (collective.group != Group::Tensor || collective.phase != Phase::Backward) return HiddenUnder::Nothing;
  const bool column_parallel = collective.what == ComputeKind::QkvProjection || collective.what == ComputeKind::MlpUp ||
                               collective.what == ComputeKind::LmHead;
  if (!column_parallel) return HiddenUnder::Nothing;
  // The input gradient's all-reduce (or reduce-scatter) runs while the weight gradient is computed ...
  if (collective.payload == Payload::InputGrad) return HiddenUnder::WeightGradient;
  // ... and the sequence-parallel re-gather of the input while the input gradient is computed.
  if (collective.payload == Payload::LayerInput && collective.collective == CollectiveKind::AllGather) {
    return HiddenUnder::InputGradient;
  }
  return HiddenUnder::Nothing;
}

}  // namespace twin::model

#include "model/ops/moe_host_sync.hpp"

#include "model/ops/compute_ops.hpp"

namespace twin::model {

bool splits_sync_before_permutation(const Scenario& s) {
  return s.model.capacity_factor > 0;
}

int expert_splits_sync_launches(const Scenario& s) {
  const bool splits = s.parallel.ep > 1 || s.parallel.etp > 1;
  const int copies = 1 + (splits ? 3 : 0);
  return copies + 1;
}

Op expert_splits_sync(const Scenario& s, Phase phase) {
  const double ep = static_cast<double>(s.parallel.ep), etp = static_cast<double>(s.parallel.etp);
  const double local_experts = static_cast<double>(s.model.experts) / ep;
  // token_dispatcher.py's maybe_move_tensor_to_cpu calls: tokens_per_expert, input_splits, output_splits,
  // output_splits_tp, num_global_tokens_per_local_expert (int64 each).
  const double counts = local_experts + 2 * ep + etp + etp * ep * local_experts;
  return elementwise(ComputeKind::ExpertSplitsSync, phase, 8 * counts, expert_splits_sync_launches(s));
}

Op expert_counts_gather(const Scenario& s, Phase phase) {
  const double members = static_cast<double>(s.parallel.ep * s.parallel.etp);
  Op op = tensor_collective(CollectiveKind::AllGather, Payload::ExpertCounts, ComputeKind::Router, phase,
                            8 * static_cast<double>(s.model.experts) * members);
  op.group = Group::ExpertTensorAndExpert;
  return op;
}

bool host_waits_for(const Op& op) {
  if (op.kind != OpKind::Compute) return false;
  if (op.what == ComputeKind::ExpertSplitsSync) return true;
  // A fused layer op (model/ops/layer_ops.hpp fuse_layer) ends with the sync when one of its parts is one.
  return op.what == ComputeKind::TransformerLayer && op.breakdown != nullptr && !op.breakdown->parts.empty() &&
         host_waits_for(op.breakdown->parts.back());
}

}  // namespace twin::model

#include "model/program/moe_a2a_overlap.hpp"

#include <algorithm>

namespace twin::model {

namespace {

bool is_expert_all_to_all(const Op& op) {
  return op.kind == OpKind::Collective && op.collective == CollectiveKind::AllToAll && op.group == Group::Expert;
}

bool is_token_all_to_all(const Op& op) {
  return is_expert_all_to_all(op) && op.payload == Payload::Tokens;
}

// The end of the dispatch node that begins with the rows' all-to-all at `dispatch`: the probabilities' follows it.
std::size_t dispatch_end(const std::vector<Op>& ops, std::size_t dispatch) {
  const std::size_t next = dispatch + 1;
  const bool probabilities = next < ops.size() && is_expert_all_to_all(ops[next]) &&
                             ops[next].payload == Payload::ExpertProbs;
  return probabilities ? next + 1 : next;
}

// Ops [begin, end) of the layer's list as one node: deps rebased onto the node, those before it -1; its all-to-alls
// (the rows', the probabilities') and the host's wait for the split sizes on the expert stream, when `stream` is.
std::vector<Op> node_of(const std::vector<Op>& ops, std::size_t begin, std::size_t end, Stream stream) {
  std::vector<Op> node(ops.begin() + static_cast<std::ptrdiff_t>(begin),
                       ops.begin() + static_cast<std::ptrdiff_t>(end));
  const auto first = static_cast<std::int32_t>(begin);
  for (Op& op : node) {
    for (std::int32_t& dep : op.deps) dep = dep >= first ? dep - first : -1;
    std::sort(op.deps.begin(), op.deps.end());
    op.deps.erase(std::unique(op.deps.begin(), op.deps.end()), op.deps.end());
    if (is_expert_all_to_all(op) || op.what == ComputeKind::ExpertSplitsSync) op.stream = stream;
  }
  return node;
}

std::size_t index_of_mlp_norm(const std::vector<Op>& ops) {
  const auto it = std::find_if(ops.begin(), ops.end(), [](const Op& op) {
    return op.kind == OpKind::Compute && op.what == ComputeKind::LayerNormMlp;
  });
  return static_cast<std::size_t>(it - ops.begin());
}

}  // namespace

LayerNodes split_layer_nodes(const std::vector<Op>& ops, Phase phase) {
  LayerNodes nodes;
  const std::size_t n = ops.size();
  std::vector<std::size_t> exchanges;  // the dispatch's and the combine's all-to-alls, in list order
  for (std::size_t i = 0; i < n; ++i)
    if (is_token_all_to_all(ops[i])) exchanges.push_back(i);
  const auto set = [&](LayerNode node, std::size_t begin, std::size_t end, Stream stream) {
    nodes[static_cast<std::size_t>(node)] = node_of(ops, begin, end, stream);
  };
  if (phase == Phase::Recompute) {
    set(LayerNode::Attention, 0, n, Stream::Compute);
    return nodes;
  }
  if (exchanges.size() != 2) {  // a dense layer: attention, then the MLP from its layer norm on
    const std::size_t norm = index_of_mlp_norm(ops);
    const std::size_t split = norm == n ? n : (phase == Phase::Forward ? norm : norm + 1);
    if (phase == Phase::Forward) {
      set(LayerNode::Attention, 0, split, Stream::Compute);
      set(LayerNode::Mlp, split, n, Stream::Compute);
    } else {
      set(LayerNode::Mlp, 0, norm == n ? 0 : split, Stream::Compute);
      set(LayerNode::Attention, norm == n ? 0 : split, n, Stream::Compute);
    }
    return nodes;
  }
  if (phase == Phase::Forward) {
    const std::size_t dispatch = exchanges[0], combine = exchanges[1];
    // The host waits for the split sizes at "before_ep_alltoall", inside the dispatch (moe_host_sync.hpp).
    const bool wait_first = dispatch > 0 && ops[dispatch - 1].what == ComputeKind::ExpertSplitsSync;
    const std::size_t dispatch_begin = wait_first ? dispatch - 1 : dispatch;
    set(LayerNode::Attention, 0, dispatch_begin, Stream::Compute);
    set(LayerNode::Dispatch, dispatch_begin, dispatch_end(ops, dispatch), Stream::Expert);
    set(LayerNode::Mlp, dispatch_end(ops, dispatch), combine, Stream::Compute);
    set(LayerNode::Combine, combine, combine + 1, Stream::Expert);
    set(LayerNode::CombineTail, combine + 1, n, Stream::Compute);
    return nodes;
  }
  const std::size_t combine = exchanges[0], dispatch = exchanges[1];  // backward: the combine's adjoint first
  set(LayerNode::Combine, 0, combine + 1, Stream::Expert);
  set(LayerNode::Mlp, combine + 1, dispatch, Stream::Compute);
  set(LayerNode::Dispatch, dispatch, dispatch_end(ops, dispatch), Stream::Expert);
  set(LayerNode::Attention, dispatch_end(ops, dispatch), n, Stream::Compute);
  return nodes;
}

int combined_extra_warmup(const Scenario& s) {
  return s.framework.moe_a2a_overlap ? 1 : 0;
}

std::vector<bool> combined_pair_forwards(const Scenario& s, const StageSchedule& schedule, int stage) {
  const int steps = static_cast<int>(schedule.size());
  std::vector<bool> merged(schedule.size(), false);
  if (!s.framework.moe_a2a_overlap || s.shards_parameters()) return merged;
  const ParallelSpec& p = s.parallel;
  const int warmup = warmup_steps(p.schedule, stage, static_cast<int>(p.pp), static_cast<int>(p.micro_batches()),
                                  static_cast<int>(p.virtual_stages), static_cast<int>(p.microbatch_group),
                                  combined_extra_warmup(s));
  const int forwards = steps / 2;
  for (int i = warmup; i + 1 < steps; i += 2) {
    if ((i - warmup) / 2 >= forwards - warmup) break;
    merged[static_cast<std::size_t>(i)] = schedule[i].pass == Pass::Forward && schedule[i + 1].pass == Pass::Backward;
  }
  return merged;
}

bool overlaps_pairs(const Scenario& s) {
  const ScheduleKind kind = s.parallel.schedule;
  return (kind == ScheduleKind::DualPipeV || kind == ScheduleKind::DualPipe) && s.model.is_moe() && s.parallel.ep > 1;
}

}  // namespace twin::model

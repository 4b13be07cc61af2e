// build_program: every stage's schedule, expanded into ops by the stage builder (stage_builder.hpp).
#include "model/program/program.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "model/ops/compute_ops.hpp"
#include "model/ops/context_parallel_ring.hpp"
#include "model/ops/layer_ops.hpp"
#include "model/program/moe_a2a_overlap.hpp"
#include "model/program/stage_builder.hpp"

namespace twin::model {

double attention_layout_copy_bytes(const Scenario& scenario, Phase phase) {
  return layout_copy_bytes(Shapes(scenario), phase);
}

std::vector<Op> layer_compute_ops(const Scenario& scenario, int layer, Phase phase) {
  std::vector<Op> ops = layer_ops(scenario, layer, phase);
  std::erase_if(ops, [](const Op& op) { return op.kind != OpKind::Compute; });
  return ops;
}

GemmShape weight_gemm_shape(const Scenario& scenario, ComputeKind what) {
  const std::vector<Op> ops =
      what == ComputeKind::LmHead ? head_forward(Shapes(scenario)) : layer_compute_ops(scenario, 0, Phase::Forward);
  for (const Op& op : ops) {
    if (op.what == what && op.kind == OpKind::Compute && op.gemm.count > 0) return op.gemm;
  }
  return {};
}

Op fused_layer_op(const Scenario& scenario, int layer, Phase phase) {
  return fuse_layer(layer_ops(scenario, layer, phase)).front();
}

RankLayout rank_layout(const Scenario& scenario) {
  const auto& p = scenario.parallel;
  return RankLayout(LayoutSizes{static_cast<int>(p.tp), static_cast<int>(p.pp), static_cast<int>(p.dp),
                                static_cast<int>(p.cp), static_cast<int>(p.ep), static_cast<int>(p.etp)});
}

Program build_program(const Scenario& scenario, Granularity granularity) {
  if (auto problems = validation_problems(scenario); !problems.empty()) throw ScenarioError(problems);
  const auto& p = scenario.parallel;
  if (p.cp > kCpRingMaxSize && scenario.framework.cp_comm == CpComm::P2P) {
    throw ScenarioError(
        {fmt::format("parallel.cp = {}: the p2p ring's message tags hold at most {} CP ranks", p.cp, kCpRingMaxSize)});
  }
  // Every pipeline message's tag must pack into one key (p2p_tag_key).
  if (p.pp > 1 && (p.micro_batches() >= kP2PTagMicroBatches || p.pp * p.virtual_stages >= kP2PTagVirtualStages)) {
    throw ScenarioError(
        {fmt::format("parallel: {} micro-batches and {} virtual stages (pp x virtual_stages) exceed "
                     "what a pipeline message's tag holds ({} and {})",
                     p.micro_batches(), p.pp * p.virtual_stages, kP2PTagMicroBatches - 1, kP2PTagVirtualStages - 1)});
  }
  Program program;
  program.scenario = scenario;
  program.granularity = granularity;
  program.layout = rank_layout(scenario);
  program.shapes = rank_shapes(scenario);
  program.schedule = build_schedule(p, combined_extra_warmup(scenario));
  program.stage_ops.reserve(p.pp);
  program.exchange_issue = exchange_issue(scenario);
  for (int stage = 0; stage < p.pp; ++stage) {
    program.stage_ops.push_back(StageBuilder(scenario, granularity, program.schedule[stage], stage).build());
    program.stage_exchanges.push_back(pipeline_exchanges(scenario, program.stage_ops.back(), stage));
  }
  return program;
}

double estimated_stage_ops(const Scenario& scenario, Granularity granularity) {
  const auto count = [&](Phase phase) {
    const std::vector<Op> ops = layer_ops(scenario, 0, phase);
    return static_cast<double>(granularity == Granularity::Layer ? fuse_layer(ops).size() : ops.size());
  };
  // Per layer and micro-batch: forward, recompute, backward (B and W); plus a layer's worth for the micro-batch's P2P,
  // embedding and head ops. Per iteration: gradient reduction and optimizer ops, a few per layer. In double: the
  // point is to catch sizes whose product overflows.
  const double per_layer =
      count(Phase::Forward) + count(Phase::Recompute) + count(Phase::Backward) + count(Phase::WeightGrad);
  const auto& p = scenario.parallel;
  const double stages = static_cast<double>(std::max<std::int64_t>(1, p.pp));
  const double layers_per_stage = static_cast<double>(scenario.model.layers) / stages;
  const double micro_batches = static_cast<double>(p.micro_batches());  // sizes are validated: no division by 0
  return stages * (micro_batches * (layers_per_stage + 1) * per_layer + 8 * (layers_per_stage + 1));
}

std::size_t Program::total_ops() const {
  std::size_t total = 0;
  for (const auto& ops : stage_ops) total += ops.size();
  return total * static_cast<std::size_t>(layout.tp() * layout.dp());
}

double Program::total_flops() const {
  double total = 0;
  for (const auto& ops : stage_ops) {
    for (const auto& op : ops) total += op.flops;
  }
  return total * layout.tp() * layout.dp();
}

namespace {

template <typename Enum, std::size_t N>
std::string_view lookup(const char* const (&names)[N], Enum value) {
  const auto index = static_cast<std::size_t>(value);
  return index < N ? names[index] : "?";
}

}  // namespace

std::string_view to_string(Pass value) {
  static const char* const names[] = {"forward", "backward", "weight_grad"};
  return lookup(names, value);
}

}  // namespace twin::model

// Megatron-Core's all-to-all dispatcher waits on the host for the tokens-per-expert counts once per MoE layer and
// forward (model/ops/moe_host_sync.hpp): the op costs its launches, and with a host model (cluster.host_us_per_kernel)
// the host cannot run ahead of the GPU past it, so a host slower than the kernels loses its lead at every MoE layer.
#include <memory>

#include <gtest/gtest.h>

#include "model/ops/moe_host_sync.hpp"
#include "model/program/program.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/support.hpp"

namespace twin::sim {
namespace {

using testing::make_scenario;
using testing::Plan;

model::Scenario small_moe() {
  return testing::small_moe_scenario();
}

AnalyticalCostModel with_host(const model::Scenario& scenario, double host_us_per_kernel) {
  model::ClusterSpec cluster = scenario.cluster;
  cluster.host_us_per_kernel = host_us_per_kernel;
  const topology::GpuSpec gpu = topology::a100_sxm4_80gb();
  return AnalyticalCostModel(gpu, analytical_parameters(gpu, cluster));
}

double iteration_s(const model::Program& program, const CostModel& cost) {
  return simulate(program, cost, SimOptions{}).timeline.iteration_time_s;
}

// The same Program with the sync's wait taken out: each sync op relabelled as a permutation pass of the same kernels
// (in a fused layer op: its last part, the sync).
model::Program without_waits(model::Program program) {
  for (auto& ops : program.stage_ops) {
    for (model::Op& op : ops) {
      if (!model::host_waits_for(op)) continue;
      if (op.what != model::ComputeKind::TransformerLayer) {
        op.what = model::ComputeKind::ExpertPermute;
        continue;
      }
      auto parts = std::make_shared<model::KernelBreakdown>(*op.breakdown);
      parts->parts.back().what = model::ComputeKind::ExpertPermute;
      op.breakdown = std::move(parts);
    }
  }
  return program;
}

int host_syncs(const model::Program& program, int stage) {
  int syncs = 0;
  for (const model::Op& op : program.stage_ops[static_cast<std::size_t>(stage)]) syncs += model::host_waits_for(op);
  return syncs;
}

TEST(MoeHostSync, TheSyncCostsItsLaunches) {
  model::Scenario s = small_moe();
  const AnalyticalCostModel cost = with_host(s, 0);
  // Without an exchange, one copy (tokens_per_expert) and the first kernel after the wait; with EP, the three split
  // tensors' copies too.
  for (const std::int64_t ep : {1, 4}) {
    s.parallel.ep = ep;
    const model::Op sync = model::expert_splits_sync(s, model::Phase::Forward);
    const int launches = ep > 1 ? 5 : 2;
    EXPECT_DOUBLE_EQ(cost.compute_time_s(s, sync),
                     launches * cost.parameters().kernel_launch_s + cost.memory_time_s(sync.bytes));
    EXPECT_EQ(cost.kernel_count(s, sync), launches);
  }
}

TEST(MoeHostSync, ASlowHostLosesItsLeadAtEverySync) {
  const model::Scenario s = small_moe();
  const model::Program program = model::build_program(s);
  const model::Program free_host = without_waits(program);
  // A host never behind: the wait is free, only the op's own time counts, the same in both.
  EXPECT_DOUBLE_EQ(iteration_s(program, with_host(s, 0)), iteration_s(free_host, with_host(s, 0)));
  // A host of 10 us a kernel: ahead of the GPU during the attention's long kernels, behind it over the experts' short
  // ones (16 GEMM launches per grouped GEMM of a few microseconds each). Without the waits it enters each MoE MLP
  // far ahead and the GPU never waits for it; with them it enters from the GPU's position, and the forward's 2 x 16
  // GEMM launches after each sync (320 us of host) outrun the GPU's work between them (the grouped GEMMs and the two
  // all-to-alls, about half of that): more than ten launches' worth (100 us) lost at each of the stage's 4 MoE
  // layers x 2 micro-batches.
  const AnalyticalCostModel host = with_host(s, 10);
  const double waiting = iteration_s(program, host), running_ahead = iteration_s(free_host, host);
  EXPECT_GT(waiting - running_ahead, 4 * 2 * 10 * 10e-6) << waiting << " " << running_ahead;
}

// At layer granularity (twin sim's default) the sync ends its fused layer op (model::fuse_layer), so the host still
// waits there: one sync per MoE layer and forward at both granularities, and the slow host loses its lead as above.
TEST(MoeHostSync, LayerGranularityKeepsTheSyncs) {
  const model::Scenario s = small_moe();
  const model::Program op = model::build_program(s), layer = model::build_program(s, model::Granularity::Layer);
  EXPECT_EQ(host_syncs(op, 0), 4 * 2);  // 4 MoE layers x 2 micro-batches, forward only (no recompute)
  EXPECT_EQ(host_syncs(layer, 0), host_syncs(op, 0));
  const AnalyticalCostModel host = with_host(s, 10);
  const double waiting = iteration_s(layer, host), running_ahead = iteration_s(without_waits(layer), host);
  EXPECT_GT(waiting - running_ahead, 4 * 2 * 10 * 10e-6) << waiting << " " << running_ahead;
  // The fused ops still carry the layer's whole compute: with a free host both granularities' times agree closely
  // (layer granularity runs a layer's collectives after its fused compute: 2 % covers that reordering).
  EXPECT_NEAR(iteration_s(layer, with_host(s, 0)) / iteration_s(op, with_host(s, 0)), 1.0, 0.02);
}

TEST(MoeHostSync, DenseProgramsHaveNoSync) {
  Plan plan;
  plan.layers = 2;
  plan.dp = 2;
  plan.gpus_per_node = 2;
  const model::Scenario dense = make_scenario(plan);
  const model::Program program = model::build_program(dense);
  for (const auto& ops : program.stage_ops) {
    for (const model::Op& op : ops) EXPECT_FALSE(model::host_waits_for(op));
  }
  EXPECT_DOUBLE_EQ(iteration_s(program, with_host(dense, 20)),
                   iteration_s(without_waits(program), with_host(dense, 20)));
}

// One sync per MoE layer and micro-batch, in the forward only (the backward reuses the forward's counts); a dense
// Program has none.
TEST(MoeHostSync, OnePerMoeLayerAndForwardMicroBatch) {
  const model::Scenario s = small_moe();
  const model::Program program = model::build_program(s);
  const int micro_batches = static_cast<int>(s.parallel.micro_batches());
  ASSERT_EQ(micro_batches, 2);
  int forward = 0, backward = 0;
  for (const model::Op& op : program.stage_ops[0]) {
    if (!model::host_waits_for(op)) continue;
    (op.phase == model::Phase::Forward ? forward : backward) += 1;
  }
  EXPECT_EQ(forward, 4 * micro_batches);
  EXPECT_EQ(backward, 0);
  // with no host model the sync is an ordinary op: relabelling it moves nothing; with one, the MoE program slows
  // while the relabelled one does not lose its lead
  const double fast = iteration_s(program, with_host(s, 0)), slow = iteration_s(program, with_host(s, 10));
  EXPECT_GT(slow, fast);

  Plan plan;
  plan.layers = 2;
  plan.dp = 2;
  plan.gpus_per_node = 2;
  const model::Program dense = model::build_program(make_scenario(plan));
  for (const auto& ops : dense.stage_ops) {
    for (const model::Op& op : ops) EXPECT_FALSE(model::host_waits_for(op));
  }
}

}  // namespace
}  // namespace twin::sim

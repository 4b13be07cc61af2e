// The host thread that issues each rank's kernels (cluster.host_us_per_kernel): the GPU cannot run ahead of it, so
// microsecond kernels run at the host's pace, and kernels of milliseconds hide it; the kernel counts it charges are
// the launches the cost model counts.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "model/program/program.hpp"
#include "report/summary.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/support.hpp"

namespace twin::sim {
namespace {

using testing::make_scenario;
using testing::Plan;
using testing::tiny_kernels;

AnalyticalCostModel with_host(const model::Scenario& scenario, double host_us_per_kernel) {
  model::ClusterSpec cluster = scenario.cluster;
  cluster.host_us_per_kernel = host_us_per_kernel;
  const topology::GpuSpec gpu = topology::a100_sxm4_80gb();
  return AnalyticalCostModel(gpu, analytical_parameters(gpu, cluster));
}

struct Simulated {
  double iteration_s = 0;
  report::Summary summary;
};

Simulated run(const model::Program& program, const CostModel& cost, Fidelity fidelity = Fidelity::Auto) {
  SimOptions options;
  options.fidelity = fidelity;
  const SimResult result = simulate(program, cost, options);
  return {result.timeline.iteration_time_s,
          report::summarize(program, result.timeline, result.peak_flops_per_gpu, "sim")};
}

// Every kernel and call the host of stage `stage`'s ranks issues in one iteration.
double host_seconds(const model::Program& program, const CostModel& cost, int stage) {
  double seconds = 0;
  for (const model::Op& op : program.stage_ops[stage]) seconds += cost.host_cost(program.scenario, op).seconds;
  return seconds;
}

TEST(HostPacing, AHostSlowerThanTheKernelsSetsTheIterationTime) {
  const model::Scenario scenario = make_scenario(tiny_kernels());
  const model::Program program = model::build_program(scenario, model::Granularity::Layer);
  const Simulated gpu_only = run(program, with_host(scenario, 0));
  const AnalyticalCostModel slow_host = with_host(scenario, 100);
  const Simulated paced = run(program, slow_host);
  const double host_s = host_seconds(program, slow_host, 0);
  ASSERT_GT(host_s, 10 * gpu_only.iteration_s);  // 100 us a kernel against kernels of a few microseconds
  // The GPU follows the host: it ends after the host's last launch, and at most the GPU's own work later.
  EXPECT_GE(paced.iteration_s, host_s);
  EXPECT_LE(paced.iteration_s, host_s + gpu_only.iteration_s);
  // The GPU's work is unchanged; the rest of the iteration is the host's, reported as such.
  const report::TimeSplit& split = paced.summary.split;
  EXPECT_NEAR(split.compute_s, gpu_only.summary.split.compute_s, 1e-9);
  EXPECT_GT(split.host_s, 0.8 * paced.iteration_s);
  EXPECT_NEAR(split.compute_s + split.tp_s + split.dp_s + split.pp_s + split.host_s + split.bubble_s,
              paced.iteration_s, 1e-9 * paced.iteration_s);
  EXPECT_DOUBLE_EQ(gpu_only.summary.split.host_s, 0);
}

TEST(HostPacing, KernelsOfMillisecondsHideTheHost) {
  Plan plan;
  plan.layers = 4;
  plan.hidden = 8192;
  plan.heads = 64;
  plan.seq = 2048;
  plan.tp = 8;
  plan.global_batch = 4;
  const model::Scenario scenario = make_scenario(plan);
  const model::Program program = model::build_program(scenario, model::Granularity::Layer);
  const Simulated gpu_only = run(program, with_host(scenario, 0));
  const Simulated paced = run(program, with_host(scenario, 30));
  // Only the first launch of the iteration shows: the host is ahead from then on.
  EXPECT_GT(paced.iteration_s, gpu_only.iteration_s);
  EXPECT_LT(paced.iteration_s, gpu_only.iteration_s * 1.001);
  EXPECT_LT(paced.summary.split.host_s, 0.001 * paced.iteration_s);
}

TEST(HostPacing, RankAndGroupFidelityAndBothGranularitiesAgree) {
  // A pipeline with TP: the host's pace through sends, receives and TP collectives.
  Plan plan = tiny_kernels();
  plan.tp = 2;
  plan.pp = 2;
  plan.dp = 2;
  plan.gpus_per_node = 8;
  plan.global_batch = 8;
  plan.recompute = "full";
  const model::Scenario scenario = make_scenario(plan);
  const AnalyticalCostModel cost = with_host(scenario, 50);
  const model::Program layers = model::build_program(scenario, model::Granularity::Layer);
  const double rank = run(layers, cost, Fidelity::Rank).iteration_s;
  const double group = run(layers, cost, Fidelity::Group).iteration_s;
  EXPECT_NEAR(group, rank, 0.01 * rank);
  // Every kernel its own op, each waiting for its own launch: the fused layer ops' approximation holds.
  const double kernels = run(model::build_program(scenario, model::Granularity::Op), cost, Fidelity::Rank).iteration_s;
  EXPECT_NEAR(kernels, rank, 0.05 * rank);
  // And the host paces it: twice the host's time per kernel, nearly twice the iteration.
  const double slower = run(layers, with_host(scenario, 100), Fidelity::Rank).iteration_s;
  EXPECT_GT(slower, 1.8 * rank);
}

// A cost model that reads each op's GPU time and host cost from a table, by the op's `layer` field (its row).
class ScriptedCost : public CostModel {
 public:
  struct Row {
    double gpu_s, host_s;
    int kernels;
  };
  explicit ScriptedCost(std::vector<Row> rows) : rows_(std::move(rows)) {}
  std::string name() const override { return "scripted"; }
  double compute_time_s(const model::Scenario&, const model::Op& op) const override { return rows_.at(op.layer).gpu_s; }
  HostCost host_cost(const model::Scenario&, const model::Op& op) const override {
    return {rows_.at(op.layer).host_s, rows_.at(op.layer).kernels};
  }

 private:
  std::vector<Row> rows_;
};

// Four compute ops on one GPU, the second a host sync (an MoE layer's wait for its token counts), worked by hand from
// the host model's rules (sim/stage_plan.cpp pace_host, sim/replayer.cpp): the host issues op i's kernels over
// [I_i, I_i + h_i] (I_i the sum of the h before it), the first at I_i + h_i / k_i; an op runs from max(ready, first
// issue + lag) and ends no earlier than its last issue + lag + its last kernel (gpu_s / k_i); a sync ending at E sets
// the lag to max(lag, E - its last issue). In microseconds:
//   op 0  gpu 100, host 10 (1 kernel)   issues [0, 10]   runs 10 .. 110
//   op 1  gpu 5, host 10 (2), the sync  issues [10, 20]  runs 110 .. 115; the lag becomes 115 - 20 = 95
//   op 2  gpu 2, host 40 (4)            issues [20, 60]  first kernel at 30 + 95 = 125, the last issued at 60 + 95 =
//                                                        155, done at 155.5; busy for its 2 us at the end: 153.5
//   op 3  gpu 1, host 10 (1)            issues [60, 70]  ready 155.5, issued at 70 + 95 = 165, done 166
// Each planted error changes a number: the first kernel at I + h (op 2 would end at 157), the last kernel's time as
// gpu_s (157), the lag from the sync's first issue (100: op 3 ends at 171), no lag at all (op 3 ends at 118).
TEST(HostPacing, ASmallCaseFollowsTheHostModelsClosedForm) {
  Plan plan = tiny_kernels();
  plan.gpus_per_node = 1;
  const model::Scenario scenario = make_scenario(plan);
  std::vector<model::Op> ops(4);
  for (int i = 0; i < 4; ++i) ops[i].layer = i;
  ops[1].what = model::ComputeKind::ExpertSplitsSync;
  const model::Program program = testing::hand_program(scenario, {ops});
  const double us = 1e-6;
  const ScriptedCost cost({{100 * us, 10 * us, 1}, {5 * us, 10 * us, 2}, {2 * us, 40 * us, 4}, {1 * us, 10 * us, 1}});
  for (const Fidelity fidelity : {Fidelity::Rank, Fidelity::Group}) {
    SimOptions options;
    options.fidelity = fidelity;
    const SimResult result = simulate(program, cost, options);
    ASSERT_EQ(result.timeline.ranks.size(), 1u);
    const std::vector<report::OpSpan>& spans = result.timeline.ranks[0].spans;
    ASSERT_EQ(spans.size(), 4u);
    const double want[4][3] = {{0, 10, 110}, {110, 110, 115}, {115, 153.5, 155.5}, {155.5, 165, 166}};
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(spans[i].start_s, want[i][0] * us, 1e-12) << "op " << i << " start";
      EXPECT_NEAR(spans[i].active_s, want[i][1] * us, 1e-12) << "op " << i << " active";
      EXPECT_NEAR(spans[i].end_s, want[i][2] * us, 1e-12) << "op " << i << " end";
    }
    EXPECT_NEAR(result.timeline.iteration_time_s, 166 * us, 1e-12);
  }
}

TEST(HostCost, AComputeOpChargesTheKernelsItsLaunchOverheadCounts) {
  // The kernel counts the host is charged for are the launches the GPU time counts: a model with 1 ms per launch
  // takes exactly kernels x 1 ms longer than one without, op by op, fused layer ops included, for every framework.
  std::vector<model::Scenario> scenarios;
  Plan plan = tiny_kernels();
  plan.tp = 2;
  plan.gpus_per_node = 2;
  plan.recompute = "full";
  scenarios.push_back(make_scenario(plan));  // Megatron, fused kernels, dropout
  model::Scenario unfused = scenarios.back();
  unfused.framework.fused_kernels = false;
  unfused.framework.dropout = false;
  scenarios.push_back(unfused);
  model::Scenario deepspeed = scenarios.back();
  deepspeed.framework.name = model::Framework::DeepSpeed;
  deepspeed.framework.fused_kernels = true;
  deepspeed.framework.bf16_optimizer = true;
  deepspeed.parallel.zero_stage = 1;
  scenarios.push_back(deepspeed);
  model::Scenario flash = scenarios.front();
  flash.framework.attention = model::AttentionKind::Flash2;
  flash.model.position_embedding = model::PositionEmbedding::Rope;
  scenarios.push_back(flash);
  model::Scenario alibi = scenarios.front();
  alibi.model.position_embedding = model::PositionEmbedding::Alibi;
  scenarios.push_back(alibi);

  const topology::GpuSpec gpu = topology::a100_sxm4_80gb();
  for (const model::Scenario& s : scenarios) {
    AnalyticalParameters none = analytical_parameters(gpu, s.cluster);
    none.kernel_launch_s = 0;
    AnalyticalParameters slow = none;
    slow.kernel_launch_s = 1e-3;
    slow.host_s_per_kernel = 1e-6;
    const AnalyticalCostModel without(gpu, none), with(gpu, slow);
    for (const model::Granularity granularity : {model::Granularity::Op, model::Granularity::Layer}) {
      const model::Program program = model::build_program(s, granularity);
      for (const model::Op& op : program.stage_ops[0]) {
        const HostCost host = with.host_cost(s, op);
        if (op.kind != model::OpKind::Compute) {
          EXPECT_EQ(host.kernels, 1);  // one call into NCCL
          continue;
        }
        const int kernels = with.kernel_count(s, op);
        EXPECT_GE(kernels, 1) << model::to_string(op.what);
        EXPECT_NEAR(with.compute_time_s(s, op) - without.compute_time_s(s, op), kernels * 1e-3, 1e-9)
            << model::to_string(op.what) << " " << model::to_string(op.phase);
        EXPECT_EQ(host.kernels, kernels);
        EXPECT_DOUBLE_EQ(host.seconds, kernels * 1e-6);
      }
    }
  }
  // No host time per kernel given: no host cost at all.
  EXPECT_DOUBLE_EQ(AnalyticalCostModel(gpu).host_cost(scenarios.front(), model::Op{}).seconds, 0);
}

}  // namespace
}  // namespace twin::sim

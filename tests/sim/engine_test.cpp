// The engine as a whole: rank and group fidelity agree, runs are reproducible, bad input is reported.
#include <gtest/gtest.h>

#include <cmath>

#include "model/program/estimates.hpp"
#include "report/summary.hpp"
#include "report/trace.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/support.hpp"

namespace twin::sim {
namespace {

using testing::make_scenario;
using testing::Plan;
using testing::sixteen_nodes;

TEST(Fidelity, RankAndGroupAgreeOnSixteenNodes) {
  const model::Program program = model::build_program(make_scenario(sixteen_nodes()), model::Granularity::Layer);
  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  SimOptions options;
  options.fidelity = Fidelity::Rank;
  const SimResult rank = simulate(program, cost, options);
  options.fidelity = Fidelity::Group;
  const SimResult group = simulate(program, cost, options);
  EXPECT_EQ(rank.stats.actors, 128);
  EXPECT_EQ(group.stats.actors, 16);
  const double t_rank = rank.timeline.iteration_time_s, t_group = group.timeline.iteration_time_s;
  EXPECT_GT(t_rank, 0);
  // 0.1 % (docs/simulator.md: every published run agrees within 0.012 %); measured here 0.003 %: a 0.5 % error of
  // group fidelity's analytical TP collectives is seen (RingAllReduce.InsideANodeOnNvlink)
  EXPECT_NEAR(t_group, t_rank, 0.001 * t_rank);
}

TEST(Fidelity, TwoRunsGiveIdenticalJson) {
  Plan plan = sixteen_nodes();
  plan.dp_overlap = true;
  const model::Program program = model::build_program(make_scenario(plan), model::Granularity::Layer);
  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  SimOptions options;
  options.record_ranks = {0, 5, 127};
  const auto json = [&] {
    const SimResult result = simulate(program, cost, options);
    const report::Summary summary = report::summarize(program, result.timeline, result.peak_flops_per_gpu, "sim");
    return report::summary_to_json(summary).dump(2) + report::chrome_trace(program, result.timeline);
  };
  const std::string first = json();
  EXPECT_EQ(first, json());
}

TEST(Fidelity, AutoPicksGroupAboveTheThreshold) {
  const model::Program program = model::build_program(make_scenario(sixteen_nodes()), model::Granularity::Layer);
  SimOptions options;
  EXPECT_EQ(choose_fidelity(program, options), Fidelity::Group);  // 128 GPUs, above the default 64
  options.group_fidelity_above_gpus = 128;
  EXPECT_EQ(choose_fidelity(program, options), Fidelity::Rank);
  options.group_fidelity_above_gpus = 100;
  EXPECT_EQ(choose_fidelity(program, options), Fidelity::Group);
  options.placement = "dp-tp-pp";  // TP groups spread over nodes: no group fidelity
  EXPECT_EQ(choose_fidelity(program, options), Fidelity::Rank);
  options.fidelity = Fidelity::Group;
  EXPECT_THROW(choose_fidelity(program, options), SimulationError);
  options.placement = "tp-dp";
  EXPECT_THROW(choose_fidelity(program, options), SimulationError);
}

TEST(Errors, CpuClusterIsRejected) {
  Plan plan;
  plan.node = "cpu-host";
  const model::Program program = model::build_program(make_scenario(plan), model::Granularity::Layer);
  EXPECT_THROW(simulate(program, FixedCostModel(1, 1)), SimulationError);
}

TEST(Errors, DeadlockIsReported) {
  Plan plan;
  plan.tp = 4;
  plan.pp = 2;
  plan.layers = 2;
  // Each stage waits for a message the other never sends.
  model::Op recv;
  recv.kind = model::OpKind::Recv;
  recv.stream = model::Stream::Pipeline;
  recv.micro_batch = 0;
  recv.bytes = 1e6;
  model::Op from_one = recv, from_zero = recv;
  from_one.peer_stage = 1;
  from_one.tag_virtual_stage = 1;
  from_one.phase = model::Phase::Backward;
  from_zero.peer_stage = 0;
  from_zero.tag_virtual_stage = 0;
  const auto program = testing::hand_program(make_scenario(plan), {{from_one}, {from_zero}});
  try {
    simulate(program, FixedCostModel(1, 1));
    FAIL() << "no error";
  } catch (const SimulationError& error) {
    EXPECT_NE(std::string(error.what()).find("deadlock"), std::string::npos) << error.what();
  }
}

TEST(Summary, MtNlgShapedNumbersAreConsistent) {
  // A small pipeline: the TFLOP/s per GPU, MFU and time split follow from the iteration time.
  Plan plan = sixteen_nodes();
  const model::Program program = model::build_program(make_scenario(plan), model::Granularity::Layer);
  const SimResult result = simulate(program, AnalyticalCostModel(topology::a100_sxm4_80gb()));
  const report::Summary s = report::summarize(program, result.timeline, result.peak_flops_per_gpu, "sim");
  const double T = s.iteration_time_s;
  EXPECT_NEAR(s.tflops_per_gpu, model::reported_flops_per_iteration(program.scenario) / (T * 128) / 1e12, 1e-9);
  EXPECT_GT(s.mfu, 0.1);
  EXPECT_LT(s.mfu, 0.9);
  for (const report::StageSummary& stage : s.stages) {
    const auto& x = stage.split;
    EXPECT_NEAR(x.compute_s + x.tp_s + x.dp_s + x.pp_s + x.bubble_s, T, 1e-9 * T);
    EXPECT_GT(x.tp_s, 0);  // TP all-reduces on the compute stream
    // About the 1F1B bubble (p-1)/(m+p-1) = 3/19: the last stage, with the LM head, waits a little less.
    EXPECT_GT(stage.bubble_fraction, 0.7 * 3.0 / 19);
    EXPECT_LT(stage.bubble_fraction, 0.5);
  }
}

TEST(Summary, ComputeByKindIsTheSameAtEitherGranularityAndAddsUpToTheComputeTime) {
  // Layer granularity, its fused ops split by the cost model's parts, against every kernel replayed as its own op.
  Plan plan = sixteen_nodes();
  plan.nodes = 4;
  plan.dp = 1;
  const model::Scenario scenario = make_scenario(plan);
  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  const auto summary_at = [&](model::Granularity granularity) {
    const model::Program program = model::build_program(scenario, granularity);
    const SimResult result = simulate(program, cost);
    return report::summarize(program, result.timeline, result.peak_flops_per_gpu, "sim", 0,
                             layer_parts(cost, program.scenario));
  };
  const report::Summary layer = summary_at(model::Granularity::Layer), op = summary_at(model::Granularity::Op);
  ASSERT_EQ(layer.stages.size(), op.stages.size());
  const auto index = [](model::ComputeKind kind) { return static_cast<std::size_t>(kind); };
  for (std::size_t stage = 0; stage < layer.stages.size(); ++stage) {
    const report::ComputeByKind& a = layer.stages[stage].compute_by_kind;
    const report::ComputeByKind& b = op.stages[stage].compute_by_kind;
    double total = 0;
    for (std::size_t kind = 0; kind < model::kComputeKindCount; ++kind) {
      EXPECT_NEAR(a[kind], b[kind], 1e-9 * (1 + b[kind])) << "stage " << stage << " " << kind;
      total += a[kind];
    }
    EXPECT_DOUBLE_EQ(a[index(model::ComputeKind::TransformerLayer)], 0) << stage;
    EXPECT_GT(a[index(model::ComputeKind::MlpUp)], a[index(model::ComputeKind::Gelu)]) << stage;
    EXPECT_NEAR(total, layer.stages[stage].split.compute_s, 1e-9 * layer.iteration_time_s) << stage;
  }
  EXPECT_GT(layer.compute_by_kind[index(model::ComputeKind::LmHead)], 0);  // the last stage's, averaged
}

}  // namespace
}  // namespace twin::sim

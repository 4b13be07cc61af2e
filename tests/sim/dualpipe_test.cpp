// parallel.schedule = "dualpipe" (model/plan/schedule.hpp) in the simulator: with fixed layer times and an ideal
// network its bubble is the closed form derived from DeepSeek-V3's Table 2; with the analytical cost model its
// prediction differs from DualPipeV's on the same plan, and its memory holds the second copy of the parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "model/plan/schedule.hpp"
#include "model/program/estimates.hpp"
#include "model/program/program.hpp"
#include "report/summary.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/support.hpp"

namespace twin::sim {
namespace {

using testing::make_scenario;
using testing::Plan;

// Table 2's bubble (PP/2 - 1)(F&B + B - 3W), F, B, W a block's times, B a whole backward: with every layer's F = B =
// W = 1 ms and no overlap gain (F&B = F + B + W = 3F, B = 2F) that is 2 (PP/2 - 1) F; the schedule idles half of it,
// each direction's start (p/2 - 1) F, over m (F + B + W) busy (tests/model replay_test.cpp proves it for unequal
// times too). 8 stages of two 2-layer blocks, F = 2 ms: (6 m + 6) ms, bubble 3 / (3 m + 3).
TEST(DualPipeSim, IdealBubbleIsHalfTheTablesForm) {
  for (const int m : {16, 24}) {
    Plan plan;
    plan.layers = 16;
    plan.pp = 8;
    plan.virtual_stages = 2;
    plan.global_batch = m;
    plan.schedule = "dualpipe";
    const model::Program program = model::build_program(make_scenario(plan), model::Granularity::Layer);
    for (const Fidelity fidelity : {Fidelity::Rank, Fidelity::Group}) {
      SimOptions options;
      options.ideal_network = true;
      options.fidelity = fidelity;
      const SimResult result = simulate(program, FixedCostModel(1e-3, 1e-3, 0, 0, 1e-3), options);
      EXPECT_NEAR(result.timeline.iteration_time_s, (6 * m + 6) * 1e-3, 1e-9) << "m = " << m;
      const double bubble = report::summarize(program, result.timeline, 312e12, "dualpipe").bubble_fraction;
      EXPECT_NEAR(bubble, 3.0 / (3 * m + 3), 1e-6) << "m = " << m;
      EXPECT_NEAR(model::ideal_bubble_fraction(program.scenario.parallel), bubble, 1e-6) << "m = " << m;
    }
  }
}

report::Summary simulate_schedule(model::Scenario s, model::ScheduleKind schedule) {
  s.parallel.schedule = schedule;
  s.parallel.virtual_stages = 2;
  EXPECT_TRUE(model::validation_problems(s).empty()) << model::validation_problems(s).front();
  const model::Program program = model::build_program(s, model::Granularity::Layer);
  const SimResult result = simulate(program, AnalyticalCostModel(topology::a100_sxm4_80gb()), SimOptions{});
  return report::summarize(program, result.timeline, result.peak_flops_per_gpu, "sim");
}

// The same plan (8 layers, pp 4, dp 2, 16 micro-batches of 1024 tokens on A100s) under DualPipe and DualPipeV: the
// same model FLOPs, another prediction (each DualPipe stage runs blocks of 2 layers for half the micro-batches, a
// DualPipeV stage chunks of 1 layer for all of them, and DualPipe adds the pair's gradient sum), and the weights,
// gradients and optimizer state of the second copy: a middle stage holds twice DualPipeV's layers.
TEST(DualPipeSim, DiffersFromDualPipeVAndHoldsTheSecondCopy) {
  Plan dense;
  dense.layers = 8;
  dense.pp = 4;
  dense.dp = 2;
  dense.global_batch = 32;
  model::Scenario s = make_scenario(dense);
  s.framework.tied_embeddings = false;
  const report::Summary dual = simulate_schedule(s, model::ScheduleKind::DualPipe);
  const report::Summary v = simulate_schedule(s, model::ScheduleKind::DualPipeV);
  EXPECT_DOUBLE_EQ(dual.model_flops, v.model_flops);
  EXPECT_GT(std::abs(dual.iteration_time_s - v.iteration_time_s), 1e-3 * v.iteration_time_s)
      << dual.iteration_time_s << " s against " << v.iteration_time_s << " s";
  s.parallel.virtual_stages = 2;
  s.parallel.schedule = model::ScheduleKind::DualPipe;
  const model::MemoryEstimate dual_memory = model::estimate_memory(s);
  s.parallel.schedule = model::ScheduleKind::DualPipeV;
  const model::MemoryEstimate v_memory = model::estimate_memory(s);
  for (const int stage : {1, 2}) {
    EXPECT_DOUBLE_EQ(dual_memory.stages[stage].parameters, 2 * v_memory.stages[stage].parameters);
    EXPECT_DOUBLE_EQ(dual_memory.stages[stage].weights_bytes, 2 * v_memory.stages[stage].weights_bytes);
    EXPECT_DOUBLE_EQ(dual_memory.stages[stage].optimizer_bytes, 2 * v_memory.stages[stage].optimizer_bytes);
  }
  EXPECT_GT(dual.memory.peak_bytes, v.memory.peak_bytes);
}

}  // namespace
}  // namespace twin::sim

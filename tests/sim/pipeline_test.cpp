// With infinite bandwidth, zero latency and fixed compute times, the simulated bubble is the textbook one:
// (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v m + p-1) for the interleaved schedule.
#include <gtest/gtest.h>

#include "report/summary.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/support.hpp"

namespace twin::sim {
namespace {

using testing::Plan;

double simulated_bubble(const Plan& plan, Fidelity fidelity, double* iteration_s = nullptr) {
  const model::Program program = model::build_program(testing::make_scenario(plan), model::Granularity::Layer);
  const FixedCostModel cost(1e-3, 2e-3);  // forward 1 ms, backward 2 ms per layer op
  SimOptions options;
  options.ideal_network = true;
  options.fidelity = fidelity;
  const SimResult result = simulate(program, cost, options);
  if (iteration_s != nullptr) *iteration_s = result.timeline.iteration_time_s;
  const report::Summary summary = report::summarize(program, result.timeline, 312e12, "test");
  EXPECT_EQ(static_cast<int>(summary.stages.size()), plan.pp);
  return summary.bubble_fraction;
}

TEST(IdealPipeline, OneFOneBBubble) {
  for (const int m : {8, 16, 32}) {
    Plan plan;
    plan.layers = 8;
    plan.pp = 8;
    plan.global_batch = m;
    double iteration = 0;
    const double bubble = simulated_bubble(plan, Fidelity::Rank, &iteration);
    const double ideal = 7.0 / (m + 7.0);
    EXPECT_NEAR(bubble, ideal, 0.005 * ideal) << "m = " << m;
    EXPECT_NEAR(iteration, (m + 7) * 3e-3, 1e-9) << "m = " << m;  // (m + p - 1) (f + b)
  }
}

TEST(IdealPipeline, GPipeBubble) {
  Plan plan;
  plan.layers = 4;
  plan.pp = 4;
  plan.tp = 2;
  plan.global_batch = 12;
  plan.schedule = "gpipe";
  const double ideal = 3.0 / (12 + 3.0);
  EXPECT_NEAR(simulated_bubble(plan, Fidelity::Rank), ideal, 0.005 * ideal);
}

TEST(IdealPipeline, InterleavedBubble) {
  for (const int m : {8, 16}) {
    Plan plan;
    plan.layers = 16;
    plan.pp = 4;
    plan.tp = 2;
    plan.global_batch = m;
    plan.schedule = "interleaved";
    plan.virtual_stages = 2;
    const double ideal = 3.0 / (2.0 * m + 3.0);
    EXPECT_NEAR(simulated_bubble(plan, Fidelity::Rank), ideal, 0.005 * ideal) << "m = " << m;
    EXPECT_NEAR(simulated_bubble(plan, Fidelity::Group), ideal, 0.005 * ideal) << "m = " << m;
  }
}

}  // namespace
}  // namespace twin::sim

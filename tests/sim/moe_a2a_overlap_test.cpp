// framework.moe_a2a_overlap (model/program/moe_a2a_overlap.hpp) in the simulator: an MoE plan whose all-to-alls are exposed
// runs faster with them under the other micro-batch's compute, by no more than the exposed all-to-all time it had
// (report/summary.cpp's time split, "ep"), at both granularities, with and without a pipeline.
#include <gtest/gtest.h>

#include "model/program/program.hpp"
#include "report/summary.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/support.hpp"

namespace twin::sim {
namespace {

using testing::make_scenario;
using testing::Plan;

// 16 GPUs, 16 experts of which each token picks 4.
model::Scenario moe(Plan plan, int ep) {
  plan.hidden = 2048;
  plan.heads = 16;
  plan.seq = 2048;
  plan.vocab = 4096;
  model::Scenario s = make_scenario(plan);
  s.model.experts = 16;
  s.model.top_k = 4;
  s.model.moe_ffn_hidden = 1024;
  s.parallel.ep = ep;
  return s;
}

report::Summary run(const model::Scenario& s, model::Granularity granularity) {
  const model::Program program = model::build_program(s, granularity);
  const SimResult result = simulate(program, AnalyticalCostModel(topology::a100_sxm4_80gb()));
  return report::summarize(program, result.timeline, result.peak_flops_per_gpu, "sim");
}

// Without a pipeline the iteration can shrink by no more than the exposed all-to-all time; with one, also by the
// time a stage waited for its neighbours' (their exposed all-to-alls delayed what they sent it).
void expect_faster_by_at_most_the_exposed_all_to_alls(model::Scenario s) {
  for (const model::Granularity granularity : {model::Granularity::Op, model::Granularity::Layer}) {
    s.framework.moe_a2a_overlap = false;
    const report::Summary exposed = run(s, granularity);
    s.framework.moe_a2a_overlap = true;
    const report::Summary overlapped = run(s, granularity);
    const auto name = model::to_string(granularity);
    EXPECT_GT(exposed.split.ep_s, 0.1 * exposed.iteration_time_s) << name;  // there is something to hide
    EXPECT_LT(overlapped.iteration_time_s, 0.97 * exposed.iteration_time_s) << name;
    const double waits = s.parallel.pp > 1 ? exposed.split.pp_s + exposed.split.bubble_s : 0;
    EXPECT_GT(overlapped.iteration_time_s, exposed.iteration_time_s - exposed.split.ep_s - waits) << name;
    EXPECT_GT(overlapped.split.compute_s, 0.99 * exposed.split.compute_s) << name;  // the kernels stay serial
    EXPECT_LT(overlapped.split.ep_s, exposed.split.ep_s) << name;
    // The bubble counts the expert stream's exposed all-to-alls as busy, as it did on the compute stream.
    EXPECT_LT(overlapped.bubble_fraction, exposed.bubble_fraction + 0.02) << name;
  }
}

TEST(MoeA2aOverlap, WithoutAPipelineHidesPartOfTheExposedAllToAlls) {
  Plan plan;
  plan.layers = 4;
  plan.dp = 16;
  plan.nodes = 2;
  plan.global_batch = 64;                                           // 4 micro-batches: F0, three merged steps, B3
  expect_faster_by_at_most_the_exposed_all_to_alls(moe(plan, 16));  // EP over both nodes
}

TEST(MoeA2aOverlap, InterleavedHidesPartOfTheExposedAllToAlls) {
  Plan plan;
  plan.layers = 8;
  plan.pp = 2;
  plan.dp = 8;
  plan.schedule = "interleaved";
  plan.virtual_stages = 2;
  plan.global_batch = 64;  // 8 micro-batches
  plan.gpus_per_node = 4;
  plan.nodes = 4;  // a stage's 8 EP ranks over two nodes
  expect_faster_by_at_most_the_exposed_all_to_alls(moe(plan, 8));
}

}  // namespace
}  // namespace twin::sim

// parallel.schedule = "zb-h1", "zb-v" and "dualpipev" (model/plan/schedule.hpp) in the simulator: with fixed layer
// times and an ideal network its bubble is the paper's closed form, and with the analytical cost model it moves the
// prediction of every plan family it applies to (dense, context-parallel, expert-parallel; both granularities, both
// fidelities) below 1F1B's with the same FLOPs and, to launch overheads, the same compute.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "model/plan/schedule.hpp"
#include "model/program/program.hpp"
#include "report/summary.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/support.hpp"

namespace twin::sim {
namespace {

using testing::make_scenario;
using testing::Plan;

// Qi et al., ICLR 2024, Table 1: 1F1B idles (p - 1)(F + B + W) per stage, ZB-H1 (p - 1)(F + B - W) (W <= F), over an
// iteration of m (F + B + W) plus that. One layer per stage, F = B = W = 1 ms: ZB-H1's bubble is a third of 1F1B's
// time.
TEST(ZeroBubbleSim, IdealBubbleIsThePapersClosedForm) {
  for (const int m : {8, 16}) {
    Plan plan;
    plan.layers = 8;
    plan.pp = 8;
    plan.global_batch = m;
    for (const Fidelity fidelity : {Fidelity::Rank, Fidelity::Group}) {
      SimOptions options;
      options.ideal_network = true;
      options.fidelity = fidelity;
      plan.schedule = "zb-h1";
      const model::Program zb = model::build_program(make_scenario(plan), model::Granularity::Layer);
      const SimResult zb_result = simulate(zb, FixedCostModel(1e-3, 1e-3, 0, 0, 1e-3), options);
      plan.schedule = "1f1b";
      const model::Program base = model::build_program(make_scenario(plan), model::Granularity::Layer);
      const SimResult base_result = simulate(base, FixedCostModel(1e-3, 2e-3), options);
      EXPECT_NEAR(zb_result.timeline.iteration_time_s, (3 * m + 7) * 1e-3, 1e-9) << "m = " << m;
      EXPECT_NEAR(base_result.timeline.iteration_time_s, (3 * m + 3 * 7) * 1e-3, 1e-9) << "m = " << m;
      const double bubble = report::summarize(zb, zb_result.timeline, 312e12, "zb").bubble_fraction;
      EXPECT_NEAR(bubble, 7.0 / (3 * m + 7), 1e-6) << "m = " << m;
      // the closed form twin search orders its plans by, the same as simulated for both schedules
      EXPECT_NEAR(model::ideal_bubble_fraction(zb.scenario.parallel), bubble, 1e-6) << "m = " << m;
      const double base_bubble = report::summarize(base, base_result.timeline, 312e12, "1f1b").bubble_fraction;
      EXPECT_NEAR(model::ideal_bubble_fraction(base.scenario.parallel), base_bubble, 1e-6) << "m = " << m;
    }
  }
}

// ZB-V and DualPipeV (schedule.hpp): with a chunk's F = B = W and m >= 2p each stage idles only the V's start,
// (p - 1) F, over 2 m (F + B + W) busy. 8 stages of two one-layer chunks, 1 ms each; the replay (tests/model) proves
// ZB-V's form for unequal times, and DualPipeV within its table's.
TEST(ZeroBubbleSim, TheVsIdleOnlyTheVsStart) {
  for (const auto& [schedule, m] : {std::pair{"zb-v", 16}, std::pair{"zb-v", 24}, std::pair{"dualpipev", 16}}) {
    Plan plan;
    plan.layers = 16;
    plan.pp = 8;
    plan.virtual_stages = 2;
    plan.global_batch = m;
    plan.schedule = schedule;
    const model::Program zb = model::build_program(make_scenario(plan), model::Granularity::Layer);
    for (const Fidelity fidelity : {Fidelity::Rank, Fidelity::Group}) {
      SimOptions options;
      options.ideal_network = true;
      options.fidelity = fidelity;
      const SimResult result = simulate(zb, FixedCostModel(1e-3, 1e-3, 0, 0, 1e-3), options);
      EXPECT_NEAR(result.timeline.iteration_time_s, (6 * m + 7) * 1e-3, 1e-9) << schedule << " m = " << m;
      const double bubble = report::summarize(zb, result.timeline, 312e12, schedule).bubble_fraction;
      EXPECT_NEAR(bubble, 7.0 / (6 * m + 7), 1e-6) << schedule << " m = " << m;
      EXPECT_NEAR(model::ideal_bubble_fraction(zb.scenario.parallel), bubble, 1e-6) << schedule << " m = " << m;
    }
  }
}

// 16 experts of which each token picks 4 (moe_a2a_overlap_test.cpp's).
model::Scenario zb_moe(Plan plan, int ep) {
  plan.hidden = 1024;
  plan.heads = 16;
  plan.vocab = 4096;
  model::Scenario s = make_scenario(plan);
  s.model.experts = 16;
  s.model.top_k = 4;
  s.model.moe_ffn_hidden = 1024;
  s.parallel.ep = ep;
  return s;
}

report::Summary run(model::Scenario s, model::ScheduleKind schedule, model::Granularity granularity, Fidelity fidelity,
                    double* flops) {
  s.parallel.schedule = schedule;
  s.parallel.virtual_stages = s.parallel.v_shape() ? 2 : 1;
  EXPECT_TRUE(model::validation_problems(s).empty()) << model::validation_problems(s).front();
  const model::Program program = model::build_program(s, granularity);
  *flops = program.total_flops();
  SimOptions options;
  options.fidelity = fidelity;
  const SimResult result = simulate(program, AnalyticalCostModel(topology::a100_sxm4_80gb()), options);
  return report::summarize(program, result.timeline, result.peak_flops_per_gpu, "sim");
}

void expect_faster_with_the_same_work(const model::Scenario& s, const char* name,
                                      model::ScheduleKind schedule = model::ScheduleKind::ZeroBubbleH1) {
  for (const model::Granularity granularity : {model::Granularity::Op, model::Granularity::Layer}) {
    for (const Fidelity fidelity : {Fidelity::Rank, Fidelity::Group}) {
      double base_flops = 0, zb_flops = 0;
      const report::Summary base = run(s, model::ScheduleKind::OneFOneB, granularity, fidelity, &base_flops);
      const report::Summary zb = run(s, schedule, granularity, fidelity, &zb_flops);
      const std::string where =
          std::string(name) + " " + std::string(model::to_string(granularity)) + " " + std::string(to_string(fidelity));
      EXPECT_EQ(zb_flops, base_flops) << where;  // B and W sum to the backward's FLOPs
      // at least 0.5 %, beyond the launch overheads the split adds (the MoE plan, whose expert MLP keeps its weight
      // gradients in B, gains 2 %; the dense ones more)
      EXPECT_LT(zb.iteration_time_s, 0.995 * base.iteration_time_s) << where;
      EXPECT_LT(zb.bubble_fraction, base.bubble_fraction) << where;
      // the same kernels, one more launch per split GEMM: within 1 %
      EXPECT_NEAR(zb.split.compute_s, base.split.compute_s, 0.01 * base.split.compute_s) << where;
    }
  }
}

TEST(ZeroBubbleSim, ShrinksTheBubbleOfDenseContextAndExpertParallelPlans) {
  Plan dense;
  dense.layers = 8;
  dense.hidden = 1024;
  dense.pp = 4;
  dense.dp = 2;
  dense.global_batch = 16;
  expect_faster_with_the_same_work(make_scenario(dense), "dense pp 4 dp 2");

  model::Scenario cp = make_scenario(dense);
  cp.parallel.dp = 1;
  cp.parallel.cp = 2;
  cp.framework.attention = model::AttentionKind::Flash2;
  expect_faster_with_the_same_work(cp, "pp 4 cp 2");

  Plan experts = dense;
  experts.layers = 4;
  experts.pp = 2;
  experts.dp = 4;
  expect_faster_with_the_same_work(zb_moe(experts, 4), "MoE pp 2 ep 4");
}

// ZB-V and DualPipeV against 1F1B: the same FLOPs, faster, on a dense plan and an expert-parallel one (8 and 4
// micro-batches, 2 pp for DualPipeV). Untied embeddings: tied, the
// V (both ends of the model on stage 0) also drops the word embedding's gradient all-reduce between the end stages,
// which runs on the compute stream (1.5 % of the dense plan's compute time), and the compute would not compare.
TEST(ZeroBubbleSim, TheVsShrinkTheBubbleOfDenseAndExpertParallelPlans) {
  Plan dense;
  dense.layers = 8;
  dense.hidden = 1024;
  dense.pp = 4;
  dense.dp = 2;
  dense.global_batch = 16;
  model::Scenario untied = make_scenario(dense);
  untied.framework.tied_embeddings = false;
  expect_faster_with_the_same_work(untied, "zb-v dense pp 4 dp 2", model::ScheduleKind::ZeroBubbleV);
  expect_faster_with_the_same_work(untied, "dualpipev dense pp 4 dp 2", model::ScheduleKind::DualPipeV);
  Plan experts = dense;
  experts.layers = 4;
  experts.pp = 2;
  experts.dp = 4;
  model::Scenario experts_untied = zb_moe(experts, 4);
  experts_untied.framework.tied_embeddings = false;
  expect_faster_with_the_same_work(experts_untied, "zb-v MoE pp 2 ep 4", model::ScheduleKind::ZeroBubbleV);
  expect_faster_with_the_same_work(experts_untied, "dualpipev MoE pp 2 ep 4", model::ScheduleKind::DualPipeV);
}

}  // namespace
}  // namespace twin::sim

// FP8 under the schedules that split the backward (parallel.schedule = "zb-h1", "dualpipe"; issue 41): the B and W of
// an FP8 linear layer are costed as the unsplit op's parts, so that FP8 moves such a plan's prediction as it moves
// 1F1B's (tests/sim/mechanism_matrix_test.cpp's "fp8" row: faster, by 1 % to 50 %), at both granularities and
// fidelities, and the split costs what the unsplit backward costs.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "model/ops/layer_ops.hpp"
#include "model/program/program.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/support.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {
namespace {

using testing::make_scenario;
using testing::Plan;

// 8 layers of hidden 4096 on 4 H100 nodes: TP 8 (sequence parallel) x PP 2 x DP 2, 8 micro-batches per pipeline.
model::Scenario h100_plan(const std::string& schedule, bool fp8, model::Fp8Recipe recipe) {
  Plan plan;
  plan.layers = 8;
  plan.hidden = 4096;
  plan.heads = 32;
  plan.seq = 2048;
  plan.vocab = 32000;
  plan.tp = 8;
  plan.pp = 2;
  plan.dp = 2;
  plan.global_batch = 16;
  plan.sequence_parallel = true;
  plan.nodes = 4;
  plan.node = "dgx-h100";
  plan.schedule = schedule;
  plan.virtual_stages = schedule == "dualpipe" ? 2 : 1;
  model::Scenario s = make_scenario(plan);
  s.framework.tied_embeddings = false;  // DualPipe's two ends each hold a head
  s.framework.transformer_engine = true;
  if (fp8) {
    s.model.fp8 = model::Fp8Format::Hybrid;
    s.framework.fp8_recipe = recipe;
  }
  EXPECT_TRUE(model::validation_problems(s).empty()) << model::validation_problems(s).front();
  return s;
}

double iteration_s(const model::Scenario& s, model::Granularity granularity, Fidelity fidelity) {
  const AnalyticalCostModel cost(topology::h100_sxm5_80gb());
  SimOptions options;
  options.fidelity = fidelity;
  return simulate(model::build_program(s, granularity), cost, options).timeline.iteration_time_s;
}

// FP8 faster than bf16 by the mechanism row's 1 % to 50 %, delayed and blockwise, op and layer granularity (within
// the matrix's 4 % of each other: a layer's collectives run after its fused compute), rank and group fidelity.
TEST(Fp8ZeroBubbleSim, Fp8MovesZeroBubbleAndDualPipePlansAsItMovesOneFOneB) {
  for (const std::string schedule : {"zb-h1", "dualpipe"}) {
    for (const Fidelity fidelity : {Fidelity::Rank, Fidelity::Group}) {
      for (const auto granularity : {model::Granularity::Op, model::Granularity::Layer}) {
        const std::string where = schedule + " " + std::string(to_string(fidelity)) + " " +
                                  std::string(model::to_string(granularity));
        const double bf16 = iteration_s(h100_plan(schedule, false, {}), granularity, fidelity);
        for (const model::Fp8Recipe recipe : {model::Fp8Recipe::Delayed, model::Fp8Recipe::Blockwise}) {
          const double fp8 = iteration_s(h100_plan(schedule, true, recipe), granularity, fidelity);
          const double change = fp8 / bf16 - 1;
          std::printf("[ fp8 zb ] %-32s %-9s bf16 %.4f s, fp8 %.4f s (%+.1f %%)\n", where.c_str(),
                      std::string(to_string(recipe)).c_str(), bf16, fp8, 100 * change);
          EXPECT_LT(change, -0.01) << where << " " << to_string(recipe) << ": " << bf16 << " s -> " << fp8 << " s";
          EXPECT_GT(change, -0.5) << where << " " << to_string(recipe) << ": " << bf16 << " s -> " << fp8 << " s";
          if (granularity == model::Granularity::Layer) {
            const double op = iteration_s(h100_plan(schedule, true, recipe), model::Granularity::Op, fidelity);
            EXPECT_NEAR(fp8 / op, 1.0, 0.04) << where << " " << to_string(recipe);
          }
        }
      }
    }
  }
}

// B and W of an FP8 linear layer cost the unsplit backward's time: their GEMMs are the unsplit op's two (the dgrad
// [m, k] = [m, n] x [n, k], the wgrad [k, n] = [k, m] x [m, n]) at the FP8 rate, their streams its streams, their
// launches its launches (H100's measured launch gap and efficiencies).
TEST(Fp8ZeroBubbleSim, BAndWCostTheUnsplitFp8Backward) {
  const topology::GpuSpec gpu = topology::h100_sxm5_80gb();
  const model::Scenario one_f_one_b = h100_plan("1f1b", true, model::Fp8Recipe::Blockwise);
  const model::Scenario zb = h100_plan("zb-h1", true, model::Fp8Recipe::Blockwise);
  const AnalyticalCostModel cost(gpu, analytical_parameters(gpu, zb.cluster));
  double whole = 0, split = 0, weight = 0;
  int weight_ops = 0;
  for (const model::Op& op : model::layer_ops(one_f_one_b, 0, model::Phase::Backward)) {
    if (op.kind == model::OpKind::Compute) whole += cost.compute_time_s(one_f_one_b, op);
  }
  for (const model::Phase phase : {model::Phase::Backward, model::Phase::WeightGrad}) {
    for (const model::Op& op : model::layer_ops(zb, 0, phase)) {
      if (op.kind != model::OpKind::Compute) continue;
      const double t = cost.compute_time_s(zb, op);
      split += t;
      if (phase == model::Phase::WeightGrad) {
        weight += t;
        ++weight_ops;
      }
    }
  }
  EXPECT_EQ(weight_ops, 4);
  EXPECT_GT(weight, 0.2 * whole);  // the four wgrad GEMMs: a third of the backward's GEMM FLOPs and more
  EXPECT_NEAR(split, whole, 1e-9 * whole) << whole << " s unsplit, " << split << " s split";
}

}  // namespace
}  // namespace twin::sim

// Mixture-of-Experts in FP8 (model.fp8): the routed experts' GEMMs, each local expert with its own scales, and the
// shared experts' (exec/interpreter/fp8_experts.cpp), on the tiny MoE. Expert-parallel plans train to one rank's
// losses under delayed and tensorwise scaling, and delayed scaling gives each expert the one-rank run's weight scale
// wherever it lives (its amaxes reduced by global expert, not by local position). Blockwise and MXFP8 too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "exec/interpreter/fp8_state.hpp"
#include "exec_test_util.hpp"
#include "fp8_scales.hpp"
#include "tiny_moe.hpp"

namespace twin::exec {
namespace {

using testing::scenario;
using testing::tiny_moe_toml;

constexpr int kSteps = 4;

std::vector<double> losses(const std::vector<std::string>& sets) {
  std::vector<std::string> all = {"model.dtype=\"bf16\""};
  all.insert(all.end(), sets.begin(), sets.end());
  TrainOptions options;
  options.steps = kSteps;
  options.comm_timeout_s = 120;
  return testing::train(scenario(tiny_moe_toml(), all), options).losses;
}

double worst_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return worst;
}

const std::vector<std::string> kDelayed = {"model.fp8=\"hybrid\""};
const std::vector<std::string> kTensorwise = {"model.fp8=\"hybrid\"", "framework.fp8_recipe=\"tensorwise\""};
const std::vector<std::string> kBlockwise = {"model.fp8=\"hybrid\"", "framework.fp8_recipe=\"blockwise\""};
const std::vector<std::string> kMxfp8 = {"model.fp8=\"hybrid\"", "framework.fp8_recipe=\"mxfp8\""};

// As the dense FP8 plans (fp8_training_test.cpp, kFp8PlanTolerance): FP8 rounding is discontinuous, so an element
// that another plan's summation order (~1e-7) tips over a rounding boundary moves by one FP8 step; DP replicas
// reduce delayed scaling's amaxes over micro-batches one rank sees one after the other; and under tensorwise scaling
// an expert's GEMM on an EP plan quantizes the rows of every DP replica's micro-batch together (one amax), where one
// rank quantizes each micro-batch's rows alone. Measured over 4 steps: delayed dp 2 ep 2 2.2e-4, dp 4 ep 2 3.0e-4,
// tp 2 ep 2 1.2e-5, tp 2 dp 2 ep 2 etp 2 2.2e-4; tensorwise 3.3e-4, 3.4e-4, 1.1e-4, 1.6e-4; blockwise 1e-9 (its
// scales are per tile, of the rows alone); mxfp8 4.5e-9, 3.0e-9, 9.6e-5, 9.6e-5; 1e-3 is 3x the largest. FP8 itself moves these
// losses by ~1e-3 (checked below: the FP8 run is not bf16's).
constexpr double kFp8MoePlanTolerance = 1e-3;

TEST(ExecMoeFp8, ExpertParallelPlansTrainToOneRanksLosses) {
  for (const auto* recipe : {&kDelayed, &kTensorwise, &kBlockwise, &kMxfp8}) {
    const std::vector<double> one = losses(*recipe);
    const std::vector<double> bf16 = losses({});
    EXPECT_GT(worst_relative(one, bf16), 1e-5) << "the FP8 run trained bf16's losses";
    for (const std::vector<std::string>& plan : std::vector<std::vector<std::string>>{
             {"parallel.dp=2", "parallel.ep=2"},
             {"parallel.dp=4", "parallel.ep=2"},  // two replicas of each expert, which may see rows or none
             {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.ep=2"},
             {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.dp=2", "parallel.ep=2",
              "parallel.etp=2"}}) {
      std::vector<std::string> sets = *recipe;
      sets.insert(sets.end(), plan.begin(), plan.end());
      const std::vector<double> many = losses(sets);
      ASSERT_EQ(many.size(), one.size());
      const double worst = worst_relative(many, one);
      std::printf("[ moe fp8 parity ] %-34s %-40s losses %.7f %.7f %.7f %.7f max relative difference %.1e\n",
                  recipe->back().c_str(), (plan.front() + " " + plan.back()).c_str(),
                  many[0], many[1], many[2], many[3], worst);
      EXPECT_LE(worst, kFp8MoePlanTolerance) << plan.back();
    }
  }
}

// Delayed scaling, one iteration: each expert's weight scale on the rank that holds it under tp 2 with ep 2 (no DP:
// the same micro-batches in the same order) is the one-rank run's, bit for bit, for every global expert: the weights
// are the same, and each expert's amax is reduced with its own. Positional reduction (local expert 0 of rank 0 with
// local expert 0 of rank 1) would give experts 0 and 2 the larger of their two amaxes.
TEST(ExecMoeFp8, EachExpertKeepsItsOwnDelayedWeightScaleUnderExpertParallelism) {
  using fp8_scales::ScaleKey;
  const std::vector<std::string> sets = {"model.dtype=\"bf16\"", "model.fp8=\"hybrid\""};
  const auto one = fp8_scales::scales_after_one_iteration(scenario(tiny_moe_toml(), sets));
  std::vector<std::string> ep = sets;
  ep.insert(ep.end(), {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.ep=2"});
  const auto two = fp8_scales::scales_after_one_iteration(scenario(tiny_moe_toml(), ep));
  ASSERT_EQ(one.size(), 1u);
  ASSERT_EQ(two.size(), 2u);
  int experts_seen = 0;
  for (const auto& [key, scale] : one[0]) {
    const auto [layer, what, role] = key;
    if (what < kExpertTensors || role != 1) continue;  // the routed experts' weights
    ++experts_seen;
    const int expert = (what - kExpertTensors) / 2, holder = expert / 2;  // 4 experts over ep 2
    const auto it = two[static_cast<std::size_t>(holder)].find(key);
    ASSERT_NE(it, two[static_cast<std::size_t>(holder)].end()) << "layer " << layer << " expert " << expert;
    EXPECT_EQ(it->second, scale) << "layer " << layer << " expert " << expert;
    EXPECT_NE(scale, 1.0f);  // updated by the iteration
    EXPECT_EQ(two[static_cast<std::size_t>(1 - holder)].count(key), 0u);  // the other rank holds none of it
  }
  EXPECT_EQ(experts_seen, 3 * 4 * 2);  // 3 MoE layers x 4 experts x (up, down)
}

}  // namespace
}  // namespace twin::exec

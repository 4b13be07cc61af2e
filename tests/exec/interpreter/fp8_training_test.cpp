// FP8 training on the CPU (emulated: exec/interpreter/fp8.cpp, docs/fp8.md): the tiny model's loss curve under each
// recipe stays within a stated tolerance of the 16-bit run's, and FP8's amax reductions make plans agree.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "exec/comm/threads_communicator.hpp"
#include "exec/interpreter/fp8_state.hpp"
#include "exec/interpreter/interpreter.hpp"
#include "exec/shard/model_shard.hpp"
#include "exec_test_util.hpp"
#include "fp8_scales.hpp"
#include "kernels/cpu/matmul.hpp"

namespace twin::exec {
namespace {

using testing::scenario;

// ---- (b) the loss curve against the 16-bit run's ------------------------------------------------------------------
// gpt-tiny (scenarios/gpt-tiny.toml: 4 layers, hidden 128, 16 x 64 tokens a step) on the shipped corpus, in bf16 (the
// CPU computes it in fp32: the reference is FP8's absence, not bf16's rounding), kSteps steps. The measure is the
// mean loss of the last kTail steps (single steps wander by a few per cent between any two runs of this model:
// docs/fp8.md), and the bound kCurveTolerance holds it within 2 % relative of the reference's. Six runs of 30 steps
// (the fewest where the loss has left its first fall).
// Thirty steps amplify a GEMM's last bits into per-cent differences of the loss, and OpenBLAS's last bits depend on
// the CPU it picks its kernel for (an AMD EPYC with AVX-512 gave e4m3_delayed 2.61 % where this machine gave under 2):
// so these runs multiply with the portable GEMM (kernels/cpu/matmul.hpp set_portable_gemm: one summation order in
// baseline x86-64 code, the same bits on every x86-64 CPU) on a fixed thread count (the CPU backend's threads split
// rows, never a sum), and the numbers compared are the same on every machine: the tolerance is checked against one
// value per recipe, not against one machine's.
constexpr int kSteps = 30, kTail = 10;
constexpr double kCurveTolerance = 0.02;
constexpr int kThreads = 2;

// The portable GEMM for the lifetime of this object (process-wide: the runs' rank threads all see it).
class PortableGemm {
 public:
  PortableGemm() : was_(kernels::cpu::portable_gemm()) { kernels::cpu::set_portable_gemm(true); }
  ~PortableGemm() { kernels::cpu::set_portable_gemm(was_); }
  PortableGemm(const PortableGemm&) = delete;
  PortableGemm& operator=(const PortableGemm&) = delete;

 private:
  bool was_;
};

std::vector<double> tiny_losses(const std::vector<std::string>& sets) {
  std::vector<model::Override> overrides = {model::parse_override("model.dtype=\"bf16\"")};
  for (const auto& text : sets) overrides.push_back(model::parse_override(text));
  const model::Scenario s = model::load_scenario(testing::source_dir() + "/scenarios/gpt-tiny.toml", overrides);
  TrainOptions options;
  options.steps = kSteps;
  options.threads_per_rank = kThreads;
  options.trace_step = -2;
  const PortableGemm portable;
  return train_threads(model::build_program(s, model::Granularity::Op), testing::corpus(), options).losses;
}

double tail_mean(const std::vector<double>& losses) {
  return std::accumulate(losses.end() - kTail, losses.end(), 0.0) / kTail;
}

struct Recipe {
  const char* name;
  std::vector<std::string> sets;
};

// One test over the five recipes: under ctest each test is a process of its own, and each would train the bf16
// reference again (ten runs instead of six).
TEST(ExecFp8Curve, EachRecipeStaysWithinTheToleranceOfBf16) {
  const std::vector<double> reference = tiny_losses({});
  const double bf16 = tail_mean(reference);
  for (const Recipe& recipe :
       {Recipe{"hybrid_delayed", {"model.fp8=\"hybrid\""}}, Recipe{"e4m3_delayed", {"model.fp8=\"e4m3\""}},
        Recipe{"hybrid_tensorwise", {"model.fp8=\"hybrid\"", "framework.fp8_recipe=\"tensorwise\""}},
        Recipe{"e4m3_blockwise", {"model.fp8=\"e4m3\"", "framework.fp8_recipe=\"blockwise\""}},
        Recipe{"e4m3_mxfp8", {"model.fp8=\"e4m3\"", "framework.fp8_recipe=\"mxfp8\""}}}) {
    const std::vector<double> losses = tiny_losses(recipe.sets);
    ASSERT_EQ(losses.size(), reference.size());
    const double fp8 = tail_mean(losses);
    const double relative = std::abs(fp8 - bf16) / bf16;
    std::printf("[ fp8 ] %-18s loss step 1 %.4f, %d %.4f; mean of the last %d %.4f (bf16 %.4f): %.2f %%\n",
                recipe.name, losses.front(), kSteps, losses.back(), kTail, fp8, bf16, 100 * relative);
    EXPECT_LT(losses.back(), losses.front() - 2.0) << recipe.name << " did not learn";
    EXPECT_LE(relative, kCurveTolerance) << recipe.name;
  }
}

// ---- (c) plans agree --------------------------------------------------------------------------------------------
// The parity model (tests/exec/interpreter/parity_test.cpp: 8 layers, hidden 128, global batch 8 of 1, 5 steps) in FP8.
constexpr int kParitySteps = 4;

std::vector<double> parity_losses(const std::vector<std::string>& sets) {
  std::vector<std::string> all = {"model.dtype=\"bf16\""};
  all.insert(all.end(), sets.begin(), sets.end());
  TrainOptions options;
  options.steps = kParitySteps;
  options.comm_timeout_s = 120;
  return testing::train(scenario(testing::parity_toml(), all), options).losses;
}

double worst_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return worst;
}

void expect_parity(const char* name, const std::vector<std::string>& recipe, const std::vector<std::string>& plan,
                   double tolerance) {
  static std::map<std::vector<std::string>, std::vector<double>> one_rank;  // by recipe: each run once
  if (!one_rank.count(recipe)) one_rank[recipe] = parity_losses(recipe);
  const std::vector<double>& one = one_rank[recipe];
  std::vector<std::string> sets = recipe;
  sets.insert(sets.end(), plan.begin(), plan.end());
  const std::vector<double> many = parity_losses(sets);
  ASSERT_EQ(one.size(), many.size());
  const double worst = worst_relative(many, one);
  std::printf(
      "[ fp8 parity ] %-28s losses %.7f %.7f %.7f %.7f (one rank %.7f %.7f %.7f %.7f) max relative "
      "difference %.1e\n",
      name, many[0], many[1], many[2], many[3], one[0], one[1], one[2], one[3], worst);
  EXPECT_LE(worst, tolerance) << name;
}

// Losses: near, not exact. FP8 rounding is discontinuous: where a plan sums in another order (TP's partial GEMMs,
// DP's gradient sums: ~1e-7 relative), an element that lies that close to a rounding boundary of its FP8 grid rounds
// the other way, a change of one FP8 step (6 to 12 %) in one operand element; and DP replicas reduce their amaxes
// over micro-batches that one rank sees one after the other, so delayed scaling's scales differ under DP by design.
// Measured over 4 steps (before the parity model's fifth, a steep step where FP8 runs part by 1e-2): delayed tp 2
// 2.1e-4, dp 2 2.4e-4; tensorwise tp 2 with sequence parallelism 6.5e-4 (each TP rank scales its weight shard by its
// own amax, as Transformer Engine's current scaling does), dp 2 2.0e-5; FP8 itself moves these losses by ~1e-3.
constexpr double kFp8PlanTolerance = 2e-3;

TEST(ExecFp8Parity, DelayedScalingAgreesUnderTensorAndDataParallelism) {
  expect_parity("delayed tp 2", {"model.fp8=\"hybrid\""}, {"parallel.tp=2"}, kFp8PlanTolerance);
  expect_parity("delayed dp 2", {"model.fp8=\"hybrid\""}, {"parallel.dp=2"}, kFp8PlanTolerance);
}

TEST(ExecFp8Parity, TensorwiseScalingAgreesUnderSequenceParallelismAndDataParallelism) {
  const std::vector<std::string> tensorwise = {"model.fp8=\"hybrid\"", "framework.fp8_recipe=\"tensorwise\""};
  expect_parity("tensorwise tp 2 sp", tensorwise, {"parallel.tp=2", "parallel.sequence_parallel=true"},
                kFp8PlanTolerance);
  expect_parity("tensorwise dp 2", tensorwise, {"parallel.dp=2"}, kFp8PlanTolerance);
}

// The schedules that split the backward (issue 41): an FP8 linear layer's B computes dX and keeps the quantized
// operands' scales, its W computes dW later from the same values with the same scales. That the split itself is exact
// is ZeroBubbleH1TrainsAsOneFOneBBitForBit's (below: ZB-H1 is pp 2 1F1B bit for bit under every recipe). Against one
// rank, a pipeline sums some values in another order (~1e-7), and FP8 rounding is discontinuous: how many elements
// that tips over a rounding boundary depends on the CPU's kernels, not on the schedule. With per-block scales
// (blockwise) a tipped element moves its own block's values only: within 1e-5 (the parity plans' bound for pipelines),
// measured 4.0e-10 to 4.3e-6 on an AMD EPYC and 2.9e-10 to 6.7e-6 on an Intel Xeon with AVX-512 and AMX. With
// per-tensor scales (delayed, whose history carries an amax into the next step's scale of the whole tensor, and
// tensorwise) one tip rescales whole tensors: delayed 3.7e-6 on the EPYC but 2.9e-5 to 3.3e-5 on the Xeon, for pp 2
// 1F1B as for the split schedules (ZB-H1's losses are 1F1B's there too), so these take kFp8PlanTolerance, the bound
// of TP and DP, whose sums reorder the same way.
// DualPipe holds two copies of each layer (one per direction), each with its own delayed-scaling history, as each
// copy's Transformer Engine modules keep their own: the up direction's first micro-batch is cast with the scale of 1
// where one rank casts it with the down direction's last amax, so its first step's loss already differs (1.9e-5) and
// delayed scaling agrees within kFp8PlanTolerance only (measured 2.5e-4), by design, as DP replicas do. Tensorwise on
// DualPipe (5.4e-5) has no history: the copies' gradients summed in another order tip more roundings where one
// per-tensor scale moves with them; within kFp8PlanTolerance too.
constexpr double kSplitTolerance = 1e-5;

TEST(ExecFp8Parity, SchedulesThatSplitTheBackwardTrainAsOneRank) {
  const std::vector<std::string> delayed = {"model.fp8=\"hybrid\""};
  const std::vector<std::string> blockwise = {"model.fp8=\"e4m3\"", "framework.fp8_recipe=\"blockwise\""};
  const std::vector<std::string> tensorwise = {"model.fp8=\"hybrid\"", "framework.fp8_recipe=\"tensorwise\""};
  const auto v = [](const char* schedule) {
    return std::vector<std::string>{"parallel.pp=2", "parallel.virtual_stages=2",
                                    "parallel.schedule=\"" + std::string(schedule) + "\""};
  };
  for (const auto& [name, recipe, tolerance] : {std::tuple{"delayed", delayed, kFp8PlanTolerance},
                                                 std::tuple{"blockwise", blockwise, kSplitTolerance}}) {
    expect_parity((std::string(name) + " pp 2 zb-h1").c_str(), recipe, {"parallel.pp=2", "parallel.schedule=\"zb-h1\""},
                  tolerance);
    for (const char* schedule : {"zb-v", "dualpipev"}) {
      expect_parity((std::string(name) + " pp 2 " + schedule).c_str(), recipe, v(schedule), tolerance);
    }
  }
  expect_parity("tensorwise pp 2 zb-h1", tensorwise, {"parallel.pp=2", "parallel.schedule=\"zb-h1\""},
                kFp8PlanTolerance);
  expect_parity("blockwise pp 2 dualpipe", blockwise, v("dualpipe"), kSplitTolerance);
  expect_parity("tensorwise pp 2 dualpipe", tensorwise, v("dualpipe"), kFp8PlanTolerance);
  expect_parity("delayed pp 2 dualpipe", delayed, v("dualpipe"), kFp8PlanTolerance);
}

// The split itself is exact: ZB-H1's W quantizes what its B kept with B's scales and accumulates dW in 1F1B's
// micro-batch order, so on the same stages ZB-H1 trains to 1F1B's losses bit for bit, under each recipe (a W that
// quantized with the scales of its own time, or a B that recorded no amax, would part them under delayed scaling).
TEST(ExecFp8Parity, ZeroBubbleH1TrainsAsOneFOneBBitForBit) {
  for (const std::vector<std::string>& recipe :
       {std::vector<std::string>{"model.fp8=\"hybrid\""},
        std::vector<std::string>{"model.fp8=\"e4m3\"", "framework.fp8_recipe=\"blockwise\""},
        std::vector<std::string>{"model.fp8=\"hybrid\"", "framework.fp8_recipe=\"tensorwise\""}}) {
    std::vector<std::string> one_f_one_b = recipe;
    one_f_one_b.push_back("parallel.pp=2");
    std::vector<std::string> zb = one_f_one_b;
    zb.push_back("parallel.schedule=\"zb-h1\"");
    EXPECT_EQ(parity_losses(zb), parity_losses(one_f_one_b)) << recipe.back();
  }
}

// Scales: what the losses cannot show (a TP plan that skipped the amax reduction trains to losses as close: 1.5e-4).
// After one iteration of delayed scaling, every weight scale a TP rank holds is the one-rank run's, bit for bit (the
// weights are the same, and the max over the shards' amaxes is the whole tensor's), and so are the first layer's input
// scales up to the amax's fp32 rounding; a shard scaled by its own amax would be off by its share of the range
// (percent). Deeper activations and the gradients agree only to ~6 %: within one forward, an element that TP's
// summation order (1e-7) tips over an FP8 rounding boundary moves by one FP8 step, and what it feeds differs by more
// than 1e-7, so that more elements tip, layer after layer.
using fp8_scales::ScaleKey;
using fp8_scales::scales_after_one_iteration;

TEST(ExecFp8Parity, DelayedScalesUnderTensorParallelismAreTheOneRanksScales) {
  const std::vector<std::string> sets = {"model.dtype=\"bf16\"", "model.fp8=\"hybrid\""};
  const auto one = scales_after_one_iteration(scenario(testing::parity_toml(), sets));
  std::vector<std::string> tp = sets;
  tp.push_back("parallel.tp=2");
  const auto two = scales_after_one_iteration(scenario(testing::parity_toml(), tp));
  ASSERT_EQ(one.size(), 1u);
  ASSERT_EQ(two.size(), 2u);
  // every layer's four FP8 GEMMs, three tensors each
  const auto layers = static_cast<std::size_t>(scenario(testing::parity_toml(), sets).model.layers);
  ASSERT_EQ(one[0].size(), layers * 4 * 3);
  double worst_weight = 0, worst_first_input = 0, worst_other = 0;
  for (const auto& rank : two) {
    ASSERT_EQ(rank.size(), one[0].size());
    for (const auto& [key, scale] : rank) {
      const auto [layer, what, role] = key;
      const double expected = one[0].at(key), relative = std::abs(scale - expected) / expected;
      EXPECT_NE(expected, 1.0) << "layer " << layer << ": the scale was never updated";
      if (role == static_cast<int>(Fp8State::Role::Weight)) {
        EXPECT_EQ(scale, expected) << "layer " << layer << " GEMM " << what << ": the weight's scale";
        worst_weight = std::max(worst_weight, relative);
      } else if (role == static_cast<int>(Fp8State::Role::Input) && layer == 0) {
        worst_first_input = std::max(worst_first_input, relative);
      } else {
        worst_other = std::max(worst_other, relative);
      }
    }
  }
  std::printf(
      "[ fp8 parity ] delayed tp 2 scales against one rank's: weights %.1e, first layer's inputs %.1e, the "
      "rest %.1e\n",
      worst_weight, worst_first_input, worst_other);
  EXPECT_LE(worst_first_input, 1e-6);
  EXPECT_LE(worst_other, 0.15);
}

// Delayed scaling under ZB-H1: the amax history sees the same amaxes in the same steps (B records the output
// gradient's at its cast; W records none), so after one iteration every scale each stage holds is the one-rank run's,
// bit for bit.
TEST(ExecFp8Parity, DelayedScalesUnderZeroBubbleAreTheOneRanksScales) {
  const std::vector<std::string> sets = {"model.dtype=\"bf16\"", "model.fp8=\"hybrid\""};
  const auto one = scales_after_one_iteration(scenario(testing::parity_toml(), sets));
  std::vector<std::string> zb = sets;
  zb.insert(zb.end(), {"parallel.pp=2", "parallel.schedule=\"zb-h1\""});
  const auto two = scales_after_one_iteration(scenario(testing::parity_toml(), zb));
  ASSERT_EQ(two.size(), 2u);
  std::size_t seen = 0;
  for (const auto& stage : two) {
    for (const auto& [key, scale] : stage) {
      EXPECT_EQ(scale, one[0].at(key)) << "layer " << std::get<0>(key) << " GEMM " << std::get<1>(key) << " role "
                                       << std::get<2>(key);
      ++seen;
    }
  }
  EXPECT_EQ(seen, one[0].size());
}

}  // namespace
}  // namespace twin::exec

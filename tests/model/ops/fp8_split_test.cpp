// An FP8 linear layer's backward split into a zero-bubble schedule's B and W (model/ops/compute_ops.hpp,
// split_weight_gradient): B the dgrad FP8 GEMM and the output gradient's cast, W the wgrad FP8 GEMM and the
// accumulation, summing to the unsplit op; the schedules that split the backward accept FP8; the deferred W's inputs
// are kept in FP8.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "model/ops/compute_ops.hpp"
#include "model/ops/layer_ops.hpp"
#include "model/program/estimates.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

struct Sums {
  double flops = 0, bytes = 0, kernel_bytes = 0;
  int launches = 0, fp8_gemm_launches = 0;
};

Sums sums_of(const std::vector<Op>& ops) {
  Sums s;
  for (const Op& op : ops) {
    if (op.kind != OpKind::Compute) continue;
    s.flops += op.flops;
    s.bytes += op.bytes;
    for (const Kernel& kernel : op.breakdown->kernels) {
      s.kernel_bytes += kernel.bytes;
      s.launches += kernel.launches;
      if (kernel.kind == KernelKind::Fp8Gemm) s.fp8_gemm_launches += kernel.launches;
    }
  }
  return s;
}

// 4 layers, TP 2 (sequence parallel or not, so that the column-parallel GEMMs' transposes show), 2 stages.
Scenario fp8_plan(Fp8Recipe recipe, bool sequence_parallel, bool accumulation_fusion) {
  Scenario s = testing::make_scenario(4, 256, 8, 128, 1024, 2, 2, 1, 1, 8);
  s.cluster.node = NodeKind::DgxH100;  // FP8 tensor cores
  s.framework.transformer_engine = true;  // FP8 runs through TE's modules
  s.model.fp8 = Fp8Format::Hybrid;
  s.framework.fp8_recipe = recipe;
  s.parallel.sequence_parallel = sequence_parallel;
  s.framework.gradient_accumulation_fusion = accumulation_fusion;
  return s;
}

// B + W of every layer equal the unsplit backward in FLOPs, bytes, kernel bytes and launches; the four FP8 GEMMs'
// two launches go one to B (dgrad) and one to W (wgrad), and W holds nothing but its wgrad GEMM and accumulation.
TEST(Fp8ZeroBubbleSplit, BAndWSumToTheUnsplitFp8Backward) {
  for (const Fp8Recipe recipe : {Fp8Recipe::Delayed, Fp8Recipe::Tensorwise, Fp8Recipe::Blockwise}) {
    for (const bool sp : {false, true}) {
      for (const bool fusion : {false, true}) {
        Scenario s = fp8_plan(recipe, sp, fusion);
        const std::string where = std::string(to_string(recipe)) + (sp ? " sp" : "") + (fusion ? " fused" : "");
        const Sums whole = sums_of(layer_ops(s, 0, Phase::Backward));
        s.parallel.schedule = ScheduleKind::ZeroBubbleH1;
        ASSERT_TRUE(validation_problems(s).empty()) << where;
        const std::vector<Op> b = layer_ops(s, 0, Phase::Backward), w = layer_ops(s, 0, Phase::WeightGrad);
        const Sums input = sums_of(b), weight = sums_of(w);
        EXPECT_GT(whole.fp8_gemm_launches, 0) << where;
        EXPECT_DOUBLE_EQ(input.flops + weight.flops, whole.flops) << where;
        EXPECT_DOUBLE_EQ(input.bytes + weight.bytes, whole.bytes) << where;
        EXPECT_DOUBLE_EQ(input.kernel_bytes + weight.kernel_bytes, whole.kernel_bytes) << where;
        EXPECT_EQ(input.launches + weight.launches, whole.launches) << where;
        EXPECT_EQ(weight.fp8_gemm_launches, 4) << where;  // QKV, projection, MLP up and down: one wgrad each
        EXPECT_EQ(input.fp8_gemm_launches, whole.fp8_gemm_launches - 4) << where;
        for (const Op& op : w) {
          ASSERT_EQ(op.phase, Phase::WeightGrad) << where;
          const std::vector<Kernel>& kernels = op.breakdown->kernels;
          ASSERT_EQ(kernels.front().kind, KernelKind::Fp8Gemm) << where;
          // dW = X^T dY reads X [m, k] and dY [m, n] in one byte, writes dW [k, n] in e bytes
          const double m = static_cast<double>(op.gemm.m), n = static_cast<double>(op.gemm.n);
          const double k = static_cast<double>(op.gemm.k);
          EXPECT_DOUBLE_EQ(kernels.front().bytes, m * k + m * n + 2 * k * n) << where;
          EXPECT_EQ(kernels.size(), fusion ? 1u : 2u) << where;  // the accumulation kernel, unless fused
        }
      }
    }
  }
}

// The four schedules that split the backward accept FP8 (DeepSeek-V3 trained blockwise FP8 on DualPipe).
TEST(Fp8ZeroBubbleSplit, SchedulesThatSplitTheBackwardAcceptFp8) {
  for (const auto& [kind, chunks] : {std::pair{ScheduleKind::ZeroBubbleH1, 1}, std::pair{ScheduleKind::ZeroBubbleV, 2},
                                     std::pair{ScheduleKind::DualPipeV, 2}, std::pair{ScheduleKind::DualPipe, 2}}) {
    Scenario s = fp8_plan(Fp8Recipe::Blockwise, false, true);
    s.parallel.schedule = kind;
    s.parallel.virtual_stages = chunks;
    s.framework.tied_embeddings = false;
    const std::vector<std::string> problems = validation_problems(s);
    EXPECT_TRUE(problems.empty()) << to_string(kind) << ": " << (problems.empty() ? "" : problems.front());
  }
}

// A deferred W keeps its GEMM's quantized operands (TE's WeightGradStore): one byte per element where bf16 took two,
// plus blockwise's fp32 scale per 128 elements.
TEST(Fp8ZeroBubbleSplit, DeferredWeightGradientInputsAreKeptInFp8) {
  Scenario s = fp8_plan(Fp8Recipe::Delayed, false, true);
  s.parallel.schedule = ScheduleKind::ZeroBubbleH1;
  const double fp8 = deferred_weight_grad_bytes(s, 0);
  s.framework.fp8_recipe = Fp8Recipe::Blockwise;
  const double blockwise = deferred_weight_grad_bytes(s, 0);
  s.model.fp8 = Fp8Format::None;
  const double bf16 = deferred_weight_grad_bytes(s, 0);
  EXPECT_DOUBLE_EQ(fp8, bf16 / 2);
  EXPECT_DOUBLE_EQ(blockwise, fp8 * (1 + 4.0 / 128));
}

}  // namespace
}  // namespace twin::model

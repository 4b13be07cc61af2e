// The routed experts' GEMMs in FP8 (model.fp8), as Transformer Engine's GroupedLinear runs them under Megatron-Core:
// each local expert's GEMM with its own casts (input rows, weight; backward the output gradient), the same kernel
// list a dense FP8 GEMM carries, once per local expert (model/ops/compute_ops.cpp, fp8_gemm_kernels). The FLOPs do
// not change; without FP8 there is no FP8 kernel; dense FP8 GEMMs keep their one GEMM and their casts.
#include <gtest/gtest.h>

#include <map>
#include <utility>

#include "model/ops/compute_ops.hpp"
#include "model/program/estimates.hpp"
#include "model/program/program.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

using testing::make_scenario;

// 16 experts over ep 4: 4 local experts a rank.
Scenario moe(Fp8Format fp8, Fp8Recipe recipe = Fp8Recipe::Delayed) {
  Scenario s = make_scenario(4, 256, 8, 128, 1000, 1, 2, 8, 1, 16);
  s.model.experts = 16;
  s.model.top_k = 2;
  s.parallel.ep = 4;
  s.model.fp8 = fp8;
  s.framework.fp8_recipe = recipe;
  s.framework.transformer_engine = fp8 != Fp8Format::None;
  s.cluster.node = NodeKind::DgxH100;
  return s;
}
constexpr int kLocalExperts = 4;

struct Kernels {
  int fp8_gemm = 0, gemm = 0, stream_first = 0;  // GEMM launches; the launches of the kernel after the GEMM
  double flops = 0, gemm_bytes = 0;
};

// The first ExpertUp and ExpertDown op of each phase on stage 0.
std::map<std::pair<ComputeKind, Phase>, Kernels> expert_kernels(const Scenario& s) {
  std::map<std::pair<ComputeKind, Phase>, Kernels> out;
  const Program program = build_program(s);
  for (const Op& op : program.stage_ops[0]) {
    if (op.kind != OpKind::Compute || (op.what != ComputeKind::ExpertUp && op.what != ComputeKind::ExpertDown)) {
      continue;
    }
    const auto key = std::make_pair(op.what, op.phase);
    if (out.count(key) > 0) continue;
    Kernels k;
    k.flops = op.flops;
    const auto& kernels = op.breakdown->kernels;
    k.fp8_gemm = kernels.front().kind == KernelKind::Fp8Gemm ? kernels.front().launches : 0;
    k.gemm = kernels.front().kind == KernelKind::Gemm ? kernels.front().launches : 0;
    k.gemm_bytes = kernels.front().bytes;
    k.stream_first = kernels.size() > 1 && kernels[1].kind == KernelKind::Stream ? kernels[1].launches : 0;
    EXPECT_EQ(op.gemm.count, kLocalExperts);
    out[key] = k;
  }
  return out;
}

TEST(MoeFp8, ExpertGemmsRunInFp8WhereModelFp8IsSet) {
  const Scenario fp8 = moe(Fp8Format::Hybrid), bf16 = moe(Fp8Format::None);
  for (const ComputeKind what : {ComputeKind::ExpertUp, ComputeKind::ExpertDown, ComputeKind::MlpUp,
                                 ComputeKind::MlpDown}) {  // routed experts; shared experts are the MLP's kinds
    EXPECT_TRUE(runs_in_fp8(fp8, what)) << to_string(what);
    EXPECT_FALSE(runs_in_fp8(bf16, what)) << to_string(what);
  }
  EXPECT_FALSE(runs_in_fp8(fp8, ComputeKind::Router));  // a plain torch GEMM in Megatron-Core
}

// Per local expert: forward one FP8 GEMM and two casts (its input rows, its weight), backward two FP8 GEMMs (input
// and weight gradients) and one cast (its output gradient). 16-bit: the GEMMs only, no FP8 kernel.
TEST(MoeFp8, EachLocalExpertLaunchesItsOwnFp8GemmsAndCasts) {
  for (const Fp8Recipe recipe : {Fp8Recipe::Delayed, Fp8Recipe::Tensorwise}) {
    const auto fp8 = expert_kernels(moe(Fp8Format::Hybrid, recipe));
    const auto bf16 = expert_kernels(moe(Fp8Format::None));
    ASSERT_EQ(fp8.size(), 4u);
    for (const auto& [key, k] : fp8) {
      const bool backward = key.second == Phase::Backward;
      EXPECT_EQ(k.fp8_gemm, (backward ? 2 : 1) * kLocalExperts) << to_string(key.first);
      EXPECT_EQ(k.gemm, 0);
      EXPECT_EQ(k.stream_first, (backward ? 1 : 2) * kLocalExperts) << to_string(key.first);
      const Kernels& b = bf16.at(key);
      EXPECT_DOUBLE_EQ(k.flops, b.flops) << to_string(key.first);  // FP8 changes the operands, not the FLOPs
      EXPECT_EQ(b.fp8_gemm, 0);
      EXPECT_EQ(b.gemm, (backward ? 2 : 1) * kLocalExperts);
      EXPECT_LT(k.gemm_bytes, b.gemm_bytes);  // one-byte operands
    }
  }
}

// The FP8 GEMM reads every local expert's one-byte weight: forward the rows' [m, k] input, the experts' [k, n]
// weights, the [m, n] 16-bit output.
TEST(MoeFp8, TheForwardGemmReadsEveryExpertsWeightInOneByte) {
  Shapes x(moe(Fp8Format::Hybrid));
  const double m = 512, n = 64, k = 256;
  const Op one = expert_linear(x, ComputeKind::ExpertDown, Phase::Forward, m, n, k, 1);
  const Op four = expert_linear(x, ComputeKind::ExpertDown, Phase::Forward, m, n, k, 4);
  EXPECT_DOUBLE_EQ(four.breakdown->kernels.front().bytes - one.breakdown->kernels.front().bytes, 3 * k * n);
  EXPECT_DOUBLE_EQ(four.flops, one.flops);
  EXPECT_EQ(four.gemm.m, 128);
  EXPECT_EQ(four.gemm.count, 4);
}

// A dense FP8 layer as before: one GEMM launch forward (two backward); the QKV and MLP-up input casts are fused into
// their layer norms (one cast forward, the weight's), the projection's and MLP-down's are not (two).
TEST(MoeFp8, DenseFp8GemmsKeepTheirKernels) {
  Scenario s = make_scenario(4, 256, 8, 128, 1000, 2, 2, 2, 1, 8);
  s.model.fp8 = Fp8Format::Hybrid;
  s.framework.transformer_engine = true;
  s.cluster.node = NodeKind::DgxH100;
  const Program program = build_program(s);
  int seen = 0;
  for (const Op& op : program.stage_ops[0]) {
    if (op.kind != OpKind::Compute || !op.breakdown || op.breakdown->parts.size() > 0) continue;
    const auto& kernels = op.breakdown->kernels;
    if (kernels.empty() || kernels.front().kind != KernelKind::Fp8Gemm) continue;
    const bool backward = op.phase == Phase::Backward;
    EXPECT_EQ(kernels.front().launches, backward ? 2 : 1);
    const bool fused = op.what == ComputeKind::QkvProjection || op.what == ComputeKind::MlpUp;
    if (!backward) {
      EXPECT_EQ(kernels.at(1).launches, fused ? 1 : 2) << to_string(op.what);
    }
    EXPECT_EQ(op.gemm.count, 1);
    ++seen;
  }
  EXPECT_GT(seen, 0);
}

// Memory: Transformer Engine keeps an FP8 copy of each GEMM weight and its transpose (2 bytes an element); an MoE
// layer's GEMM weights are its attention's two and its local experts' (GroupedLinear caches one FP8 weight per
// expert), not a dense MLP's. Here 4 of 16 experts a rank (ep 4), no shared expert, GeLU, 2 MoE layers a stage.
TEST(MoeFp8, TheFp8WeightCopiesAreTheAttentionsAndTheLocalExperts) {
  const Scenario fp8 = moe(Fp8Format::Hybrid), bf16 = moe(Fp8Format::None);
  const double h = 256, attention = h * 3 * h + h * h, f = static_cast<double>(fp8.moe_ffn_hidden());
  const double local_experts = 4 * (h * f + f * h);
  const double added = estimate_memory(fp8).stages[0].weights_bytes - estimate_memory(bf16).stages[0].weights_bytes;
  EXPECT_DOUBLE_EQ(added, 2 * 2 * (attention + local_experts));
}

}  // namespace
}  // namespace twin::model

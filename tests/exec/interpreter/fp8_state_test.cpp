// Fp8State: which format and scale each operand of an FP8 GEMM takes, when (exec/interpreter/fp8_state.hpp).
#include <gtest/gtest.h>

#include "exec/core/errors.hpp"
#include "exec/interpreter/fp8_state.hpp"
#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

using model::ComputeKind;
using model::Phase;
using Scaling = Fp8Operand::Scaling;

Fp8State state(const std::vector<std::string>& sets) {
  std::vector<std::string> all = {"model.dtype=\"bf16\""};
  all.insert(all.end(), sets.begin(), sets.end());
  return Fp8State(testing::scenario(testing::small_toml(), all));
}

model::Op gemm(Phase phase, int micro_batch, int layer = 1, ComputeKind what = ComputeKind::MlpUp) {
  model::Op op;
  op.phase = phase;
  op.micro_batch = micro_batch;
  op.layer = layer;
  op.what = what;
  return op;
}

// One region of each phase: record the amaxes, then update with them (a group of one reduces nothing).
void end_region(Fp8State& fp8, Phase phase) {
  fp8.update(phase, fp8.pending(phase));
}

TEST(ExecFp8State, HybridDelayedScalesFromTheLastRegionAndE5M2GradientsOnly) {
  Fp8State fp8 = state({"model.fp8=\"hybrid\""});
  fp8.begin_iteration();
  Fp8GemmOperands q = fp8.operands(gemm(Phase::Forward, 0));
  EXPECT_FALSE(q.input.e5m2);
  EXPECT_FALSE(q.weight.e5m2);
  EXPECT_EQ(q.input.scaling, Scaling::PerTensor);
  EXPECT_EQ(q.input.scale, 1.0f);  // nothing seen yet: TE's initial scale
  EXPECT_EQ(q.weight.scale, 1.0f);
  fp8.record(gemm(Phase::Forward, 0), Fp8Amaxes{2.0f, 4.0f, 0});
  EXPECT_EQ(fp8.pending(Phase::Forward), (std::vector<float>{2.0f, 4.0f}));
  end_region(fp8, Phase::Forward);
  EXPECT_EQ(fp8.scale(1, ComputeKind::MlpUp, Fp8State::Role::Input), 224.0f);   // 448 / 2
  EXPECT_EQ(fp8.scale(1, ComputeKind::MlpUp, Fp8State::Role::Weight), 112.0f);  // 448 / 4

  q = fp8.operands(gemm(Phase::Backward, 0));
  EXPECT_TRUE(q.gradient.e5m2);
  EXPECT_FALSE(q.input.e5m2);
  EXPECT_EQ(q.gradient.scale, 1.0f);
  EXPECT_EQ(q.input.scale, 1.0f) << "the backward reads the FP8 copies its forward made, at the forward's scales";
  EXPECT_EQ(q.weight.scale, 1.0f);
  fp8.record(gemm(Phase::Backward, 0), Fp8Amaxes{0, 0, 8.0f});
  end_region(fp8, Phase::Backward);
  EXPECT_EQ(fp8.scale(1, ComputeKind::MlpUp, Fp8State::Role::OutputGradient), 7168.0f);  // 57344 / 8

  q = fp8.operands(gemm(Phase::Forward, 1));
  EXPECT_EQ(q.input.scale, 224.0f);
  EXPECT_EQ(q.weight.scale, 1.0f) << "the weight's FP8 copy is made once per iteration, at its first micro-batch";
  EXPECT_EQ(fp8.operands(gemm(Phase::Backward, 1)).gradient.scale, 7168.0f);
  EXPECT_EQ(fp8.operands(gemm(Phase::Recompute, 1)).input.scale, 224.0f);
  fp8.begin_iteration();
  EXPECT_EQ(fp8.operands(gemm(Phase::Forward, 0)).weight.scale, 112.0f);
}

TEST(ExecFp8State, ARegionUpdatesOnlyTheTensorsItSawWithTheReducedAmaxes) {
  Fp8State fp8 = state({"model.fp8=\"e4m3\""});
  fp8.begin_iteration();
  for (int layer : {0, 1}) {
    fp8.operands(gemm(Phase::Forward, 0, layer, ComputeKind::QkvProjection));
    fp8.record(gemm(Phase::Forward, 0, layer, ComputeKind::QkvProjection), Fp8Amaxes{1.0f, 1.0f, 0});
  }
  fp8.update(Phase::Forward, {2.0f, 4.0f, 7.0f, 14.0f});  // by layer: (input, weight)
  EXPECT_EQ(fp8.scale(0, ComputeKind::QkvProjection, Fp8State::Role::Input), 224.0f);
  EXPECT_EQ(fp8.scale(1, ComputeKind::QkvProjection, Fp8State::Role::Weight), 32.0f);
  EXPECT_TRUE(fp8.pending(Phase::Forward).empty());
  EXPECT_THROW(fp8.update(Phase::Forward, {1.0f}), std::exception);  // a region's amaxes the ranks disagree on
  fp8.operands(gemm(Phase::Backward, 0, 0, ComputeKind::QkvProjection));
  fp8.record(gemm(Phase::Backward, 0, 0, ComputeKind::QkvProjection), Fp8Amaxes{0, 0, 4.0f});
  fp8.update(Phase::Backward, {4.0f});
  EXPECT_EQ(fp8.scale(0, ComputeKind::QkvProjection, Fp8State::Role::OutputGradient), 112.0f);  // E4M3: 448 / 4
  EXPECT_FALSE(fp8.operands(gemm(Phase::Backward, 0, 0, ComputeKind::QkvProjection)).gradient.e5m2);
}

// What a checkpoint keeps (saved) and puts back (restore): another state restored from it scales every operand as
// the first does; a history of another length (another amax_history_len) is refused naming the tensor.
TEST(ExecFp8State, SavedStateRestoresTheSameScales) {
  Fp8State fp8 = state({"model.fp8=\"hybrid\""});
  fp8.begin_iteration();
  fp8.operands(gemm(Phase::Forward, 0, 1, ComputeKind::MlpDown));
  fp8.record(gemm(Phase::Forward, 0, 1, ComputeKind::MlpDown), Fp8Amaxes{3.0f, 0.5f, 0});
  end_region(fp8, Phase::Forward);
  fp8.operands(gemm(Phase::Backward, 0, 1, ComputeKind::MlpDown));
  fp8.record(gemm(Phase::Backward, 0, 1, ComputeKind::MlpDown), Fp8Amaxes{0, 0, 0.25f});
  end_region(fp8, Phase::Backward);
  const std::vector<Fp8TensorScales> saved = fp8.saved();
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(saved[0].layer, 1);
  EXPECT_EQ(saved[0].scale[0], 448.0f / 3.0f);
  EXPECT_EQ(saved[0].scale[2], 57344.0f / 0.25f);  // E5M2's gradient
  Fp8State resumed = state({"model.fp8=\"hybrid\""});
  resumed.restore(saved);
  EXPECT_EQ(resumed.saved(), saved);
  for (auto role : {Fp8State::Role::Input, Fp8State::Role::Weight, Fp8State::Role::OutputGradient}) {
    EXPECT_EQ(resumed.scale(1, ComputeKind::MlpDown, role), fp8.scale(1, ComputeKind::MlpDown, role));
  }
  resumed.begin_iteration();
  EXPECT_EQ(resumed.operands(gemm(Phase::Forward, 0, 1, ComputeKind::MlpDown)).weight.scale, 448.0f / 0.5f);
  std::vector<Fp8TensorScales> longer = saved;
  longer[0].amax_history[1] = {0.5f, 0.5f};
  EXPECT_THROW(resumed.restore(longer), RunError);
}

TEST(ExecFp8State, OtherRecipesScaleFromTheTensorsThemselves) {
  Fp8State tensorwise = state({"model.fp8=\"hybrid\"", "framework.fp8_recipe=\"tensorwise\""});
  Fp8GemmOperands q = tensorwise.operands(gemm(Phase::Forward, 0));
  EXPECT_EQ(q.input.scaling, Scaling::Current);
  EXPECT_EQ(q.weight.scaling, Scaling::Current);
  EXPECT_TRUE(tensorwise.operands(gemm(Phase::Backward, 0)).gradient.e5m2);
  tensorwise.record(gemm(Phase::Forward, 0), Fp8Amaxes{2.0f, 2.0f, 0});
  EXPECT_TRUE(tensorwise.pending(Phase::Forward).empty());  // nothing to reduce
  Fp8State blockwise = state({"model.fp8=\"e4m3\"", "framework.fp8_recipe=\"blockwise\""});
  q = blockwise.operands(gemm(Phase::Backward, 0));
  EXPECT_EQ(q.input.scaling, Scaling::Tiles);
  EXPECT_EQ(q.weight.scaling, Scaling::Blocks);
  EXPECT_EQ(q.gradient.scaling, Scaling::Tiles);
  Fp8State mxfp8 = state({"model.fp8=\"e4m3\"", "framework.fp8_recipe=\"mxfp8\""});
  q = mxfp8.operands(gemm(Phase::Backward, 0));
  EXPECT_EQ(q.weight.scaling, Scaling::Mx);
  EXPECT_FALSE(q.gradient.e5m2);
}

}  // namespace
}  // namespace twin::exec

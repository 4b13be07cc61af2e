// Parallel blocks (model.parallel_residual: GPT-J, GPT-NeoX's gpt_j_residual): y = x + attn(ln1(x)) + mlp(ln2(x)).
// The key, the Program's ops and collectives, the activation memory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "model/program/estimates.hpp"
#include "model/program/program.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

using ::testing::Contains;
using testing::first_layer_ops;
using ::testing::HasSubstr;
using testing::make_scenario;
using testing::problems_of;

Scenario parallel_of(Scenario s) {
  s.model.parallel_residual = true;
  return s;
}

long count(const std::vector<Op>& ops, OpKind kind, ComputeKind what) {
  return std::count_if(ops.begin(), ops.end(), [&](const Op& op) { return op.kind == kind && op.what == what; });
}

long count_collectives(const std::vector<Op>& ops, CollectiveKind kind, Payload payload) {
  return std::count_if(ops.begin(), ops.end(), [&](const Op& op) {
    return op.kind == OpKind::Collective && op.collective == kind && op.payload == payload;
  });
}

long collectives(const std::vector<Op>& ops) {
  return std::count_if(ops.begin(), ops.end(), [](const Op& op) { return op.kind == OpKind::Collective; });
}

double flops(const std::vector<Op>& ops) {
  double sum = 0;
  for (const Op& op : ops) sum += op.flops;
  return sum;
}

TEST(ParallelResidual, OneAllReduceForwardTwoBackward) {
  const Scenario sequential = make_scenario(2, 1024, 16, 512, 1000, 4, 1, 1, 1, 1);  // tp 4
  const Scenario parallel = parallel_of(sequential);
  const auto forward = first_layer_ops(parallel, Phase::Forward);
  const auto backward = first_layer_ops(parallel, Phase::Backward);
  // Forward: both branches' partial sums reduced at once, after the MLP-down GEMM; the sequential block reduces
  // after each row-parallel GEMM.
  EXPECT_EQ(collectives(first_layer_ops(sequential, Phase::Forward)), 2);
  EXPECT_EQ(collectives(forward), 1);
  EXPECT_EQ(count(forward, OpKind::Collective, ComputeKind::MlpDown), 1);
  // Backward: each column-parallel GEMM's input gradient is still reduced before its own layer norm.
  EXPECT_EQ(collectives(backward), 2);
  EXPECT_EQ(count(backward, OpKind::Collective, ComputeKind::QkvProjection), 1);
  EXPECT_EQ(count(backward, OpKind::Collective, ComputeKind::MlpUp), 1);
  // One residual op, after the reduction; no residual between the branches.
  EXPECT_EQ(count(forward, OpKind::Compute, ComputeKind::AttentionResidual), 0);
  EXPECT_EQ(count(backward, OpKind::Compute, ComputeKind::AttentionResidual), 0);
  const auto reduce =
      std::find_if(forward.begin(), forward.end(), [](const Op& op) { return op.kind == OpKind::Collective; });
  ASSERT_NE(reduce, forward.end());
  EXPECT_EQ((reduce + 1)->what, ComputeKind::MlpResidual);
  // The same GEMMs, so the same FLOPs.
  EXPECT_DOUBLE_EQ(flops(forward), flops(first_layer_ops(sequential, Phase::Forward)));
  EXPECT_DOUBLE_EQ(flops(backward), flops(first_layer_ops(sequential, Phase::Backward)));
  EXPECT_DOUBLE_EQ(build_program(parallel).total_flops(), build_program(sequential).total_flops());
}

TEST(ParallelResidual, UnderSequenceParallelismOneReduceScatterAndOneGradientGather) {
  Scenario sequential = make_scenario(2, 1024, 16, 512, 1000, 4, 1, 1, 1, 1);
  sequential.parallel.sequence_parallel = true;
  const Scenario parallel = parallel_of(sequential);
  const auto forward = first_layer_ops(parallel, Phase::Forward), backward = first_layer_ops(parallel, Phase::Backward);
  // Forward: each layer norm's output gathered for its branch, the summed partials reduce-scattered once.
  EXPECT_EQ(count_collectives(forward, CollectiveKind::AllGather, Payload::LayerInput), 2);
  EXPECT_EQ(count_collectives(forward, CollectiveKind::ReduceScatter, Payload::LayerOutput), 1);
  EXPECT_EQ(collectives(forward), 3);
  EXPECT_EQ(collectives(first_layer_ops(sequential, Phase::Forward)), 4);
  // Backward: dy gathered once for both row-parallel GEMMs (twice in the sequential block), the layer norms'
  // outputs re-gathered for the weight gradients, each branch's input gradient reduce-scattered.
  EXPECT_EQ(count_collectives(backward, CollectiveKind::AllGather, Payload::OutputGrad), 1);
  EXPECT_EQ(
      count_collectives(first_layer_ops(sequential, Phase::Backward), CollectiveKind::AllGather, Payload::OutputGrad),
      2);
  EXPECT_EQ(count_collectives(backward, CollectiveKind::AllGather, Payload::LayerInput), 2);
  EXPECT_EQ(count_collectives(backward, CollectiveKind::ReduceScatter, Payload::InputGrad), 2);
  // The layer norms and the residual op work on the rank's 512 / 4 tokens.
  EXPECT_DOUBLE_EQ(testing::bytes_of(parallel, Phase::Forward, ComputeKind::MlpResidual), (3 * 2 + 1) * 128 * 1024.0);
  EXPECT_DOUBLE_EQ(testing::bytes_of(parallel, Phase::Forward, ComputeKind::LayerNormMlp), 2 * 2 * 128 * 1024.0);
}

TEST(ParallelResidual, OneSharedNormReducesBothBranchesOnceEachWay) {
  // GPT-J / PaLM: one layer norm feeds both branches. Forward as the two-norm block less LN2; backward the QKV GEMM's
  // input gradient adds onto the MLP-up GEMM's, one all-reduce for both.
  Scenario s = parallel_of(make_scenario(2, 1024, 16, 512, 1000, 4, 1, 1, 1, 1));
  s.model.shared_norm = true;
  const auto forward = first_layer_ops(s, Phase::Forward), backward = first_layer_ops(s, Phase::Backward);
  EXPECT_EQ(collectives(forward), 1);
  EXPECT_EQ(collectives(backward), 1);
  EXPECT_EQ(count(backward, OpKind::Collective, ComputeKind::QkvProjection), 1);
  EXPECT_EQ(count(forward, OpKind::Compute, ComputeKind::LayerNormMlp), 0);
  EXPECT_EQ(count(backward, OpKind::Compute, ComputeKind::LayerNormMlp), 0);
  const Scenario two_norms = parallel_of(make_scenario(2, 1024, 16, 512, 1000, 4, 1, 1, 1, 1));
  EXPECT_DOUBLE_EQ(testing::bytes_of(s, Phase::Backward, ComputeKind::QkvProjection) -
                       testing::bytes_of(two_norms, Phase::Backward, ComputeKind::QkvProjection),
                   2.0 * 512 * 1024);
  EXPECT_DOUBLE_EQ(build_program(s).total_flops(), build_program(two_norms).total_flops());
  // One norm's weight and bias fewer per layer, and one norm output fewer kept (2 s b h).
  Scenario no_scores = s, no_scores_two = two_norms;
  no_scores.framework.attention = no_scores_two.framework.attention = AttentionKind::Flash2;
  no_scores.parallel.tp = no_scores_two.parallel.tp = 1;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(no_scores_two) - activation_bytes_per_layer(no_scores), 2 * 512.0 * 1024);
  // Sequence parallel: the norm's output gathered once forward and once backward, one reduce-scatter each way.
  s.parallel.sequence_parallel = true;
  const auto sp_forward = first_layer_ops(s, Phase::Forward), sp_backward = first_layer_ops(s, Phase::Backward);
  EXPECT_EQ(count_collectives(sp_forward, CollectiveKind::AllGather, Payload::LayerInput), 1);
  EXPECT_EQ(count_collectives(sp_forward, CollectiveKind::ReduceScatter, Payload::LayerOutput), 1);
  EXPECT_EQ(count_collectives(sp_backward, CollectiveKind::AllGather, Payload::OutputGrad), 1);
  EXPECT_EQ(count_collectives(sp_backward, CollectiveKind::AllGather, Payload::LayerInput), 1);
  EXPECT_EQ(count_collectives(sp_backward, CollectiveKind::ReduceScatter, Payload::InputGrad), 1);
  EXPECT_EQ(collectives(sp_backward), 3);
}

TEST(ParallelResidual, TheMlpDownGemmAddsOntoTheAttentionBranch) {
  const Scenario sequential = make_scenario(2, 1024, 16, 512, 1000, 4, 1, 1, 1, 1);
  const Scenario parallel = parallel_of(sequential);
  const double e = 2, tokens = 512, h = 1024;
  // C = A B + C reads the attention projection's partial sums once more.
  EXPECT_DOUBLE_EQ(testing::bytes_of(parallel, Phase::Forward, ComputeKind::MlpDown) -
                       testing::bytes_of(sequential, Phase::Forward, ComputeKind::MlpDown),
                   e * tokens * h);
  // The residual op: fused bias-dropout-add of x and the reduced sum (3 e + a 1-byte mask) forward; backward two
  // fork accumulations (3 e each), dropout's backward (2 e + 1) and both biases' gradients (e each), which the
  // sequential block spends over two residual ops (each one accumulation, one dropout, one bias).
  EXPECT_DOUBLE_EQ(testing::bytes_of(parallel, Phase::Forward, ComputeKind::MlpResidual), (3 * e + 1) * tokens * h);
  EXPECT_DOUBLE_EQ(testing::bytes_of(parallel, Phase::Backward, ComputeKind::MlpResidual),
                   (6 * e + 2 * e + 1 + 2 * e) * tokens * h);
  EXPECT_DOUBLE_EQ(testing::bytes_of(sequential, Phase::Backward, ComputeKind::MlpResidual) +
                       testing::bytes_of(sequential, Phase::Backward, ComputeKind::AttentionResidual),
                   2 * (3 * e + 2 * e + 1 + e) * tokens * h);
}

TEST(ParallelResidual, ItsLayerKeepsOneInputAndOneMask) {
  // Korthikanti's 34 s b h (no TP, no recompute, FlashAttention: no scores) less the second layer norm's input
  // (2: it is the first's) and one dropout mask (1): 31.
  Scenario sequential = make_scenario(2, 1024, 16, 1024, 32000, 1, 1, 1, 1, 1);
  sequential.framework.attention = AttentionKind::Flash2;
  const double sbh = 1024.0 * 1024;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(sequential), 34 * sbh);
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(parallel_of(sequential)), 31 * sbh);
  // Under full recompute a layer keeps its input either way.
  sequential.parallel.recompute = Recompute::Full;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(parallel_of(sequential)), activation_bytes_per_layer(sequential));
}

TEST(ParallelResidual, TheKeyLoadsRoundTripsAndRefusesWhatIsNotBuilt) {
  const std::string base =
      "[model]\nname = \"m\"\nlayers = 2\nhidden = 256\nheads = 8\nseq_len = 64\nvocab = 100\n"
      "parallel_residual = true\n[parallel]\ntp = 2\n[cluster]\nnode = \"cpu-host\"\n";
  EXPECT_TRUE(problems_of(base).empty());
  const Scenario s = parse_scenario(base, "text");
  EXPECT_TRUE(s.model.parallel_residual);
  EXPECT_EQ(to_toml(parse_scenario(to_toml(s), "round-trip")), to_toml(s));
  EXPECT_FALSE(make_scenario(2, 64, 4, 32, 100, 1, 1, 1, 1, 1).model.parallel_residual);  // GPT-2's block by default
  std::string composer = base;
  composer.replace(composer.find("tp = 2"), 6, "tp = 1");
  composer += "[framework]\nname = \"composer\"\n";
  EXPECT_THAT(problems_of(composer), Contains(HasSubstr("parallel_residual must keep their defaults")));
  std::string alone = base;
  alone.replace(alone.find("parallel_residual = true"), 24, "shared_norm = true");
  EXPECT_THAT(problems_of(alone),
              Contains(HasSubstr("model.shared_norm lets one layer norm feed both branches of a parallel "
                                 "block: it needs model.parallel_residual = true")));
  std::string typo = base;
  typo.replace(typo.find("parallel_residual = true"), 24, "parallel_residual = \"yes\"");
  EXPECT_THAT(problems_of(typo), Contains(HasSubstr("model.parallel_residual")));
}

TEST(ParallelResidual, GptNeox20bHasItsParameterCountAndFits) {
  // scenarios/gpt-neox-20b.toml: per layer QKV 6144 x 18432 and the MLP's 6144 x 24576 and back, the attention output
  // 6144 x 6144, each with its bias, and two layer norms (weight and bias); the 50432-row input and (untied) output
  // embeddings, and the final layer norm. No position embedding (rotary), parallel or not the same tensors.
  const Scenario s = load_scenario(testing::source_dir() + "/scenarios/gpt-neox-20b.toml");
  EXPECT_TRUE(s.model.parallel_residual);
  EXPECT_EQ(s.model.rotary_dim(), 24);  // a quarter of 96
  EXPECT_EQ(s.padded_vocab(), 50432);
  const double h = 6144, f = 24576, V = 50432;
  const double layer = (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h;
  EXPECT_DOUBLE_EQ(count_parameters(s).total, 44 * layer + 2 * V * h + 2 * h);
  EXPECT_DOUBLE_EQ(count_parameters(s).total, 20554567680.0);
  const MemoryEstimate memory = estimate_memory(s);
  EXPECT_TRUE(memory.fits) << memory.peak_bytes / 1e9 << " GB";
  EXPECT_GT(build_program(s, Granularity::Layer).total_flops(), 0);
}

}  // namespace
}  // namespace twin::model

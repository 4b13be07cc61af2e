// Memory of Mixture-of-Experts layers (model/program/estimates.hpp: the top-k-expanded activations), model.head_dim (the
// attention's width apart from hidden) and the MoE scenarios shipped in scenarios/ (their parameter counts).
#include <gtest/gtest.h>

#include <gmock/gmock.h>

#include "model/ops/moe_ops.hpp"
#include "model/program/estimates.hpp"
#include "model/program/program.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

using testing::make_scenario;

Scenario moe_scenario(int top_k, double skew) {
  Scenario s = make_scenario(4, 256, 8, 128, 1000, 1, 2, 4, 1, 16);
  s.model.activation = Activation::Swiglu;
  s.model.ffn_hidden = 512;
  s.model.experts = 8;
  s.model.top_k = top_k;
  s.model.moe_ffn_hidden = 96;
  s.parallel.ep = 4;
  s.model.expert_load_skew = skew;
  return s;
}

// An MoE layer keeps, per micro-batch, on the hottest EP rank: T x top_k x (its share x ep) rows of the permuted input
// (h), the up GEMM's output (2 w with SwiGLU), the activation's output (w) and an fp32 probability, and the router's
// fp32 [T, E] probabilities, in place of the dense MLP's up output (2 f) and activation output (f).
TEST(MoeMemory, AnMoeLayerStashesTheTopKExpandedRows) {
  const Scenario s = moe_scenario(2, 0);
  const double T = 128, h = 256, w = 96, f = 512, e = 2;
  const double rows = T * 2;  // balanced: each EP rank receives a quarter of every peer's rows, ep x 1/4 = 1
  const double expected = rows * (e * (h + 2 * w + w) + 4) + T * 8 * 4 - T * e * (2 * f + f);
  EXPECT_DOUBLE_EQ(moe_activation_bytes_per_layer(s) - activation_bytes_per_layer(s), expected);
}

TEST(MoeMemory, StageActivationsGrowWithTopKAndWithSkew) {
  const Scenario two = moe_scenario(2, 0), four = moe_scenario(4, 0), skewed = moe_scenario(2, 1.2);
  const MemoryEstimate m2 = estimate_memory(two), m4 = estimate_memory(four), ms = estimate_memory(skewed);
  const double T = 128, h = 256, w = 96, e = 2;
  for (std::size_t stage = 0; stage < m2.stages.size(); ++stage) {
    // Every layer of the stage is MoE: the stash grows by the in-flight layers (micro-batches in flight x the stage's
    // 2 layers) x T x 2 more choices x one row's bytes.
    const double layers_in_flight = 2.0 * m2.stages[stage].in_flight_micro_batches;
    EXPECT_NEAR(m4.stages[stage].activations_bytes - m2.stages[stage].activations_bytes,
                layers_in_flight * T * 2 * (e * (h + 3 * w) + 4), 1e-6);
    EXPECT_GT(ms.stages[stage].activations_bytes, m2.stages[stage].activations_bytes);  // the hottest rank holds more
  }
}

// Megatron-Core's combined 1F1B (framework.moe_a2a_overlap, model/program/moe_a2a_overlap.hpp) runs one more warm-up
// forward, then merges each steady forward with a backward layer by layer, forward layer i beside backward layer
// n - 1 - i: the forward stashes a layer as the backward frees one, so the peak is 1F1B's plus the one layer both hold
// at once, on every stage, without a pipeline and interleaved (a whole micro-batch more if counted step by step).
TEST(MoeMemory, TheCombinedOneFOneBHoldsOneLayerMoreThanOneFOneB) {
  for (const int pp : {1, 2}) {
    Scenario plain = make_scenario(8, 256, 8, 128, 1000, 1, pp, 4, 1, 16);
    plain.model.activation = Activation::Swiglu;
    plain.model.ffn_hidden = 512;
    plain.model.experts = 8;
    plain.model.top_k = 2;
    plain.model.moe_ffn_hidden = 96;
    plain.parallel.ep = 4;
    if (pp > 1) {  // Megatron-Core's overlap takes a pipeline only interleaved
      plain.parallel.schedule = ScheduleKind::Interleaved;
      plain.parallel.virtual_stages = 2;
    }
    Scenario combined = plain;
    combined.framework.moe_a2a_overlap = true;
    const MemoryEstimate without = estimate_memory(plain), with = estimate_memory(combined);
    ASSERT_EQ(with.stages.size(), static_cast<std::size_t>(pp));
    for (std::size_t stage = 0; stage < with.stages.size(); ++stage) {
      EXPECT_NEAR(with.stages[stage].activations_bytes - without.stages[stage].activations_bytes,
                  moe_activation_bytes_per_layer(plain), 1e-6 * without.stages[stage].activations_bytes)
          << "pp " << pp << ", stage " << stage;
    }
  }
}

// model.head_dim given as hidden / heads changes nothing; given apart from it, the attention is heads x head_dim wide:
// the QKV and output projections' weights and FLOPs, and the attention core's, scale with it.
TEST(HeadDim, GivenAsHiddenOverHeadsChangesNothing) {
  const Scenario plain = make_scenario(4, 256, 8, 128, 1000, 2, 2, 1, 1, 8);
  Scenario given = plain;
  given.model.head_dim_given = 32;
  EXPECT_EQ(count_parameters(given).total, count_parameters(plain).total);
  EXPECT_EQ(model_flops_per_iteration(given, false), model_flops_per_iteration(plain, false));
  EXPECT_EQ(estimate_memory(given).peak_bytes, estimate_memory(plain).peak_bytes);
  const Program a = build_program(plain, Granularity::Op), b = build_program(given, Granularity::Op);
  ASSERT_EQ(a.stage_ops[0].size(), b.stage_ops[0].size());
  for (std::size_t i = 0; i < a.stage_ops[0].size(); ++i) {
    EXPECT_EQ(a.stage_ops[0][i].flops, b.stage_ops[0][i].flops);
    EXPECT_EQ(a.stage_ops[0][i].bytes, b.stage_ops[0][i].bytes);
  }
}

TEST(HeadDim, WidensTheAttentionApartFromHidden) {
  const Scenario plain = make_scenario(4, 256, 8, 128, 1000, 1, 1, 1, 1, 8);
  Scenario wide = plain;
  wide.model.head_dim_given = 64;  // 8 heads x 64 = 512 over hidden 256
  EXPECT_TRUE(validation_problems(wide).empty());
  const double h = 256, a = 512, seq = 128, tokens = 8 * seq, layers = 4;
  // Per layer: QKV h x 3a (and its 3a biases) in place of h x 3h, the projection a x h in place of h x h.
  EXPECT_DOUBLE_EQ(count_parameters(wide).per_layer - count_parameters(plain).per_layer, (4 * h + 3) * (a - h));
  // Forward + backward (3 passes) of those GEMMs, 2 FLOPs per multiply-add, and the core's 4 s a per token.
  EXPECT_DOUBLE_EQ(model_flops_per_iteration(wide, false) - model_flops_per_iteration(plain, false),
                   3 * tokens * layers * (2 * 4 * h * (a - h) + 4 * seq * (a - h)));
  auto core_flops = [](const Scenario& s) {
    double flops = 0;
    for (const Op& op : layer_compute_ops(s, 0, Phase::Forward))
      flops += op.what == ComputeKind::AttentionCore ? op.flops : 0;
    return flops;
  };
  EXPECT_DOUBLE_EQ(core_flops(wide), 2 * core_flops(plain));
  // Without head_dim, hidden must split into whole heads; with it, it need not.
  Scenario odd = plain;
  odd.model.hidden = 250;
  EXPECT_THAT(validation_problems(odd), ::testing::Contains(::testing::HasSubstr("model.head_dim")));
  odd.model.head_dim_given = 32;
  EXPECT_TRUE(validation_problems(odd).empty());
}

// The shipped MoE scenarios' sizes against their sources: Qwen3-30B-A3B 30.5 B parameters, 3.3 B active (Qwen3
// Technical Report, Table 2 / the model card); DeepSeek-V3 671 B, 37 B active (its report, abstract), which the
// grouped-query stand-in for multi-head latent attention overstates by 61 layers x 63 M attention weights (3.8 B).
TEST(MoeScenarios, ParameterCountsMatchTheirSources) {
  const Scenario qwen = load_scenario(testing::source_dir() + "/scenarios/qwen3-30b-a3b.toml");
  const MoeParameterCount q = count_moe_parameters(qwen);
  EXPECT_NEAR(q.total / 30.5e9, 1, 0.01);
  EXPECT_NEAR(q.active / 3.3e9, 1, 0.03);
  EXPECT_TRUE(estimate_memory(qwen).fits);
  const Scenario deepseek = load_scenario(testing::source_dir() + "/scenarios/deepseek-v3.toml");
  const MoeParameterCount ds = count_moe_parameters(deepseek);
  const double stand_in = 61 * (7168.0 * (16384 + 2 * 1024) + 16384.0 * 7168 - 187.1e6);
  EXPECT_NEAR((ds.total - stand_in) / 671e9, 1, 0.01);
  EXPECT_NEAR((ds.active - stand_in) / 37e9, 1, 0.03);
  EXPECT_TRUE(estimate_memory(deepseek).fits);
}

}  // namespace
}  // namespace twin::model

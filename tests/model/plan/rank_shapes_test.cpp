// RankShapes on dense, TP (with sequence parallelism and grouped-query attention), CP, EP and ETP plans, against
// widths worked out by hand from the model and the plan; and the simulator's Shapes and the Program as views of it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/ops/kernel_traffic.hpp"
#include "model/plan/rank_shapes.hpp"
#include "model/program/program.hpp"
#include "model/scenario/scenario.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

using testing::make_scenario;

// Refuses a case whose plan the rules would not take: the hand-worked widths below are only promised there.
void expect_valid(const Scenario& s) {
  EXPECT_EQ(validation_problems(s), std::vector<std::string>{});
}

TEST(RankShapes, DenseOnOneRankIsTheWholeModel) {
  // GPT-2 small: 12 heads of 64, 4 x 768 MLP, 50257 tokens padded to a multiple of 128.
  const Scenario s = make_scenario(2, 768, 12, 1024, 50257, 1, 1, 1, 4, 4);
  expect_valid(s);
  const RankShapes r = rank_shapes(s);
  EXPECT_EQ(r.micro_batch, 4);
  EXPECT_EQ(r.seq_len, 1024);
  EXPECT_EQ(r.seq_local, 1024);
  EXPECT_EQ(r.tokens, 4096);
  EXPECT_FALSE(r.sequence_parallel);
  EXPECT_EQ(r.tokens_sp, 4096);
  EXPECT_EQ(r.hidden, 768);
  EXPECT_EQ(r.head_dim, 64);
  EXPECT_EQ(r.heads_local, 12);
  EXPECT_EQ(r.kv_heads_local, 12);
  EXPECT_EQ(r.qkv_local, 3 * 768);
  EXPECT_EQ(r.rotary_dim, 64);
  EXPECT_EQ(r.ffn, 3072);
  EXPECT_EQ(r.ffn_local, 3072);
  EXPECT_EQ(r.up_local, 3072);
  EXPECT_EQ(r.vocab, 50257);
  EXPECT_EQ(r.vocab_local, 50304);  // 393 x 128
  EXPECT_EQ(r.vocab_start(0), 0);
  EXPECT_EQ(r.experts, 0);  // dense: no expert widths at all
  EXPECT_EQ(r.local_experts, 0);
  EXPECT_EQ(r.expert_ffn_local, 0);
  EXPECT_EQ(r.shared_up, 0);
}

TEST(RankShapes, TensorParallelSplitsHeadsMlpVocabularyAndSequence) {
  // Llama-2 7B's layer with 8 key/value heads, SwiGLU and a quarter of each head rotated, on tp 4 with sequence
  // parallelism.
  Scenario s = make_scenario(4, 4096, 32, 4096, 32000, 4, 1, 2, 1, 8);
  s.model.kv_heads = 8;
  s.model.activation = Activation::Swiglu;
  s.model.ffn_hidden = 11008;
  s.model.position_embedding = PositionEmbedding::Rope;
  s.model.rotary_fraction = 0.25;
  s.parallel.sequence_parallel = true;
  expect_valid(s);
  const RankShapes r = rank_shapes(s);
  EXPECT_EQ(r.tokens, 4096);
  EXPECT_TRUE(r.sequence_parallel);
  EXPECT_EQ(r.tokens_sp, 1024);
  EXPECT_EQ(r.head_dim, 128);
  EXPECT_EQ(r.heads_local, 8);
  EXPECT_EQ(r.kv_heads_local, 2);
  EXPECT_EQ(r.qkv_local, (8 + 2 * 2) * 128);
  EXPECT_EQ(r.rotary_dim, 32);
  EXPECT_EQ(r.ffn, 11008);
  EXPECT_EQ(r.ffn_local, 2752);
  EXPECT_EQ(r.up_local, 2 * 2752);  // [gate | up]
  EXPECT_EQ(r.vocab_local, 8064);   // 32000 padded to 63 x (128 x 4) = 32256, over 4
  EXPECT_EQ(r.vocab_start(3), 3 * 8064);
}

TEST(RankShapes, ContextParallelSplitsEachSequence) {
  Scenario s = make_scenario(2, 1024, 16, 8192, 32000, 2, 1, 2, 2, 8);
  s.parallel.cp = 2;
  s.parallel.sequence_parallel = true;
  s.framework.attention = AttentionKind::Flash2;
  s.cluster.gpus_per_node = 8;
  expect_valid(s);
  const RankShapes r = rank_shapes(s);
  EXPECT_EQ(r.seq_len, 8192);
  EXPECT_EQ(r.seq_local, 4096);  // two chunks of 2048
  EXPECT_EQ(r.tokens, 2 * 4096);
  EXPECT_EQ(r.tokens_sp, 2 * 4096 / 2);
  EXPECT_EQ(r.heads_local, 8);  // cp splits tokens, not heads
}

Scenario moe_scenario(int tp, int dp, int ep, int etp) {
  Scenario s = make_scenario(2, 2048, 16, 2048, 32000, tp, 1, dp, 1, 8 * dp);
  s.model.activation = Activation::Swiglu;
  s.model.experts = 8;
  s.model.top_k = 2;
  s.model.moe_ffn_hidden = 1408;
  s.model.shared_experts = 2;
  s.parallel.ep = ep;
  s.parallel.etp = etp;
  s.parallel.sequence_parallel = tp > 1;  // Megatron-Core's MoE with tp > 1 needs it
  return s;
}

TEST(RankShapes, ExpertParallelSplitsTheExperts) {
  const Scenario s = moe_scenario(1, 4, 4, 1);
  expect_valid(s);
  const RankShapes r = rank_shapes(s);
  EXPECT_EQ(r.experts, 8);
  EXPECT_EQ(r.top_k, 2);
  EXPECT_EQ(r.local_experts, 2);
  EXPECT_EQ(r.expert_ffn_local, 1408);
  EXPECT_EQ(r.expert_up_local, 2 * 1408);
  EXPECT_EQ(r.shared_ffn, 2 * 1408);  // both shared experts as one MLP, replicated
  EXPECT_EQ(r.shared_up, 2 * 2 * 1408);
}

TEST(RankShapes, ExpertTensorParallelSplitsEachExpert) {
  const Scenario s = moe_scenario(2, 2, 2, 2);
  expect_valid(s);
  const RankShapes r = rank_shapes(s);
  EXPECT_EQ(r.local_experts, 4);
  EXPECT_EQ(r.expert_ffn_local, 704);
  EXPECT_EQ(r.expert_up_local, 2 * 704);
  EXPECT_EQ(r.shared_ffn, 2 * 1408);  // not split by etp
  EXPECT_EQ(r.heads_local, 8);        // the dense part still by tp
}

TEST(RankShapes, TheSimulatorsShapesAndTheProgramAreViewsOfIt) {
  Scenario s = make_scenario(4, 4096, 32, 4096, 32000, 4, 2, 1, 1, 8);
  s.model.kv_heads = 8;
  s.model.activation = Activation::Swiglu;
  s.parallel.sequence_parallel = true;
  expect_valid(s);
  const RankShapes r = rank_shapes(s);
  const Shapes x(s);
  EXPECT_EQ(x.rank, r);
  EXPECT_EQ(x.tokens, static_cast<double>(r.tokens));
  EXPECT_EQ(x.tokens_sp, static_cast<double>(r.tokens_sp));
  EXPECT_EQ(x.heads_local, static_cast<double>(r.heads_local));
  EXPECT_EQ(x.kv_heads_local, static_cast<double>(r.kv_heads_local));
  EXPECT_EQ(x.qkv_local, static_cast<double>(r.qkv_local));
  EXPECT_EQ(x.up_local, static_cast<double>(r.up_local));
  EXPECT_EQ(x.vocab_local, static_cast<double>(r.vocab_local));
  EXPECT_EQ(build_program(s).shapes, r);
}

TEST(RankShapes, AScenarioNotYetValidatedDividesByNoZero) {
  Scenario s = make_scenario(2, 768, 12, 1024, 50257, 1, 1, 1, 4, 4);
  s.parallel.tp = 0;
  s.parallel.cp = 0;
  const RankShapes r = rank_shapes(s);
  EXPECT_EQ(r.heads_local, 12);
  EXPECT_EQ(r.seq_local, 1024);
}

}  // namespace
}  // namespace twin::model

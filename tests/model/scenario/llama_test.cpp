// Llama-style blocks (model.norm = "rmsnorm", activation = "swiglu", position_embedding = "rope", kv_heads,
// linear_bias = false): the scenario keys, the counts, the Program's ops.
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
using ::testing::HasSubstr;
using testing::make_scenario;
using testing::problems_of;

Scenario llama2_70b() {
  return load_scenario(testing::source_dir() + "/scenarios/llama2-70b.toml");
}

// Llama 2 7B's shape (its config.json: 32 layers, hidden 4096, 32 heads, MLP 11008, vocabulary 32000) on one GPU.
Scenario llama2_7b() {
  Scenario s = make_scenario(32, 4096, 32, 4096, 32000, 1, 1, 1, 1, 1);
  s.model.norm = Norm::RmsNorm;
  s.model.activation = Activation::Swiglu;
  s.model.position_embedding = PositionEmbedding::Rope;
  s.model.ffn_hidden = 11008;
  s.model.linear_bias = false;
  s.framework.tied_embeddings = false;
  return s;
}

TEST(Llama, ParameterCountsAreMetasOwn) {
  // Meta's checkpoints hold 6,738,415,616 (7B) and 68,976,648,192 (70B) parameters: the counts of Hugging Face's
  // LlamaForCausalLM, sum(p.numel()), for these configs.
  EXPECT_DOUBLE_EQ(count_parameters(llama2_7b()).total, 6738415616.0);
  Scenario unpadded = llama2_70b();  // Megatron pads the vocabulary to a multiple of 128 x tp: 32768 at tp 8
  unpadded.parallel.tp = 1;
  EXPECT_DOUBLE_EQ(count_parameters(unpadded).total, 68976648192.0);
  EXPECT_DOUBLE_EQ(count_parameters(llama2_70b()).total - count_parameters(unpadded).total, 2.0 * 768 * 8192);
  // Per layer: Q and O h^2 each, K and V h kv d each, three MLP matrices h f, two RMSNorm weights.
  const double h = 8192, kv_d = 8 * 128, f = 28672;
  EXPECT_DOUBLE_EQ(count_parameters(llama2_70b()).per_layer, 2 * h * h + 2 * h * kv_d + 3 * h * f + 2 * h);
  EXPECT_DOUBLE_EQ(count_parameters(llama2_70b()).final_layer_norm, h);
  EXPECT_DOUBLE_EQ(position_embedding_parameters(llama2_70b()), 0);
}

TEST(Llama, StageParametersAddUpToTheModel) {
  Scenario s = llama2_70b();
  double sum = 0;
  for (int stage = 0; stage < s.parallel.pp; ++stage) sum += parameters_per_gpu(s, stage) * s.parallel.tp;
  // Every TP rank holds the replicated norms: tp - 1 extra copies of 2 h per layer and of the final norm.
  const double replicated = (s.parallel.tp - 1) * (2.0 * 8192 * 80 + 8192);
  EXPECT_DOUBLE_EQ(sum, count_parameters(s).total + replicated);
}

TEST(Llama, ModelFlopsAreSixTimesTheGemmParametersPlusAttention) {
  // Kaplan et al.'s 6 N per token (N the parameters the GEMMs multiply by: the layers' matrices and the LM head),
  // plus the attention scores' 12 l s h (Q K^T and P V, forward and backward): written without Narayanan's terms.
  const Scenario s = llama2_70b();
  const double tokens = 1024.0 * 4096, l = 80, h = 8192, seq = 4096, V = static_cast<double>(s.padded_vocab());
  const double matrices = l * (count_parameters(s).per_layer - 2 * h) + V * h;
  EXPECT_NEAR(model_flops_per_iteration(s, false) / (tokens * (6 * matrices + 12 * l * seq * h)), 1.0, 1e-12);
  // The Program's GEMM FLOPs are the same count (selective recompute adds the attention core's forward once more).
  Scenario none = s;
  none.parallel.recompute = Recompute::None;
  EXPECT_NEAR(build_program(none, Granularity::Layer).total_flops() / model_flops_per_iteration(s, false), 1.0, 1e-9);
}

TEST(Llama, TheLayersGemmsHaveGroupedQueryAndSwigluWidths) {
  const Scenario s = llama2_70b();  // tp 8: 8 query heads and 1 key/value head per rank, head dim 128
  const std::vector<Op> forward = layer_compute_ops(s, 0, Phase::Forward);
  auto find = [&](ComputeKind what) {
    return *std::find_if(forward.begin(), forward.end(), [&](const Op& op) { return op.what == what; });
  };
  EXPECT_EQ(find(ComputeKind::QkvProjection).gemm.n, (8 + 2 * 1) * 128);
  EXPECT_EQ(find(ComputeKind::MlpUp).gemm.n, 2 * 28672 / 8);
  EXPECT_EQ(find(ComputeKind::MlpDown).gemm.k, 28672 / 8);
  EXPECT_EQ(std::count_if(forward.begin(), forward.end(), [](const Op& op) { return op.what == ComputeKind::Gelu; }),
            0);
  // SwiGLU reads the two halves and writes one (fused: 3 e per output element).
  EXPECT_DOUBLE_EQ(find(ComputeKind::Swiglu).bytes, 3.0 * 2 * 4096 * 28672 / 8);
  EXPECT_EQ(to_string(ComputeKind::Swiglu), "swiglu");
}

TEST(Llama, GroupedQueriesRotaryAndNoBiasesChangeTheMemoryTraffic) {
  Scenario gpt = make_scenario(4, 1024, 16, 2048, 32000, 2, 1, 1, 1, 1);
  gpt.framework.attention = AttentionKind::Flash2;
  Scenario grouped = gpt;
  grouped.model.kv_heads = 4;
  // FlashAttention reads K and V and writes their gradients at the key/value heads' width.
  EXPECT_LT(testing::bytes_of(grouped, Phase::Forward, ComputeKind::AttentionCore),
            testing::bytes_of(gpt, Phase::Forward, ComputeKind::AttentionCore));
  // Rotary embeddings add a fused pass over Q and K each way, on the QKV projection that they follow (bytes beyond
  // its operands: timed at the streaming rate): 2 e (Q + K) per token; the attention core is unchanged.
  Scenario rotary = grouped;
  rotary.model.position_embedding = PositionEmbedding::Rope;
  const double e = 2, tokens = 2048, q = 8 * 64, k = 2 * 64;  // per rank: 8 query heads, 2 key/value heads
  for (const Phase phase : {Phase::Forward, Phase::Backward}) {
    EXPECT_DOUBLE_EQ(testing::bytes_of(rotary, phase, ComputeKind::QkvProjection) -
                         testing::bytes_of(grouped, phase, ComputeKind::QkvProjection),
                     2 * e * tokens * (q + k));
    EXPECT_DOUBLE_EQ(testing::bytes_of(rotary, phase, ComputeKind::AttentionCore),
                     testing::bytes_of(grouped, phase, ComputeKind::AttentionCore));
  }
  // Without FlashAttention, grouped-query attention expands K and V to the query heads first.
  Scenario unfused = grouped;
  unfused.framework.attention = AttentionKind::Unfused;
  Scenario unfused_mha = gpt;
  unfused_mha.framework.attention = AttentionKind::Unfused;
  EXPECT_DOUBLE_EQ(
      attention_layout_copy_bytes(unfused, Phase::Forward) - attention_layout_copy_bytes(unfused_mha, Phase::Forward),
      2 * e * tokens * (k + q));
  // No linear biases: the QKV projection loses its bias pass, the unfused GELU its bias add.
  Scenario unbiased = gpt;
  unbiased.model.linear_bias = false;
  EXPECT_LT(testing::bytes_of(unbiased, Phase::Forward, ComputeKind::QkvProjection),
            testing::bytes_of(gpt, Phase::Forward, ComputeKind::QkvProjection));
  unbiased.framework.fused_kernels = false;
  gpt.framework.fused_kernels = false;
  EXPECT_LT(testing::bytes_of(unbiased, Phase::Forward, ComputeKind::Gelu),
            testing::bytes_of(gpt, Phase::Forward, ComputeKind::Gelu));
}

TEST(Llama, ActivationMemoryFollowsTheWidths) {
  // Korthikanti's 34 s b h per layer (no TP, no recompute, FlashAttention: no scores) for a GPT block, and for the
  // 70B's: Q 2, K and V 2 x 2 x kv/heads, the projection's input 2, the SwiGLU up output 2 u/h, its product 2 f/h.
  Scenario gpt = make_scenario(2, 1024, 16, 1024, 32000, 1, 1, 1, 1, 1);
  gpt.framework.attention = AttentionKind::Flash2;
  const double sbh = 1024.0 * 1024;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(gpt), 34 * sbh);
  Scenario s = llama2_70b();
  s.parallel.tp = 1;
  s.parallel.sequence_parallel = false;
  s.parallel.recompute = Recompute::None;
  const double h = 8192, f = 28672, llama_sbh = 4096.0 * 8192;
  // 8 replicated: no dropout, so no masks
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(s), llama_sbh * (8 + 2 + 4 * 8.0 / 64 + 2 + 2 * 2 * f / h + 2 * f / h));
}

TEST(Llama, KeysLoadValidateAndRoundTrip) {
  const Scenario s = llama2_70b();
  EXPECT_EQ(s.model.norm, Norm::RmsNorm);
  EXPECT_EQ(s.model.activation, Activation::Swiglu);
  EXPECT_EQ(s.model.position_embedding, PositionEmbedding::Rope);
  EXPECT_EQ(s.model.key_value_heads(), 8);
  EXPECT_FALSE(s.model.linear_bias);
  const Scenario again = parse_scenario(to_toml(s), "round-trip");
  EXPECT_EQ(to_toml(again), to_toml(s));
  // Defaults: a GPT-2 block.
  const Scenario gpt = make_scenario(2, 64, 4, 32, 100, 1, 1, 1, 1, 1);
  EXPECT_EQ(gpt.model.norm, Norm::LayerNorm);
  EXPECT_EQ(gpt.model.activation, Activation::Gelu);
  EXPECT_EQ(gpt.model.key_value_heads(), 4);
  EXPECT_TRUE(gpt.model.linear_bias);
}

TEST(Llama, BadKeysAreNamed) {
  const std::string base =
      "[model]\nname = \"m\"\nlayers = 2\nhidden = 256\nheads = 8\nseq_len = 64\nvocab = 100\n"
      "[parallel]\ntp = 2\n[cluster]\nnode = \"cpu-host\"\n";
  EXPECT_TRUE(problems_of(base + "").empty());
  auto with_model = [&](const std::string& keys) {
    std::string text = base;
    text.insert(text.find("[parallel]"), keys);
    return problems_of(text);
  };
  EXPECT_TRUE(with_model("kv_heads = 2\nnorm = \"rmsnorm\"\nactivation = \"swiglu\"\nposition_embedding = \"rope\"\n"
                         "linear_bias = false\n")
                  .empty());
  EXPECT_THAT(with_model("kv_heads = 3\n"),
              Contains(HasSubstr("model.heads (8) must be divisible by model.kv_heads (3)")));
  EXPECT_THAT(with_model("kv_heads = 1\n"),
              Contains(HasSubstr("model.kv_heads (1) must be divisible by parallel.tp (2)")));
  EXPECT_THAT(with_model("kv_heads = 0\n"), Contains(HasSubstr("model.kv_heads must be positive")));
  EXPECT_THAT(with_model("kv_heads = -2\n"), Contains(HasSubstr("model.kv_heads must be positive")));
  EXPECT_THAT(with_model("norm = \"batchnorm\"\n"),
              Contains(HasSubstr("model.norm: unknown value \"batchnorm\" (expected one of layernorm, rmsnorm)")));
  EXPECT_THAT(with_model("activation = \"relu\"\n"),
              Contains(HasSubstr("model.activation: unknown value \"relu\" (expected one of gelu, swiglu)")));
  EXPECT_THAT(with_model("linear_bias = 1\n"), Contains(HasSubstr("model.linear_bias")));
  // Rotary embeddings rotate pairs: an odd head dimension (hidden 264 / 8 heads = 33) is refused.
  std::string odd = base;
  odd.replace(odd.find("hidden = 256"), 12, "hidden = 264");
  odd.insert(odd.find("[parallel]"), "position_embedding = \"rope\"\n");
  EXPECT_THAT(problems_of(odd), Contains(HasSubstr("model.hidden / model.heads = 33 must be even")));
  // Partial rotary embeddings (hidden 256 / 8 heads = 32 dimensions a head): whole pairs, with rope only.
  std::string rope = base;
  rope.insert(rope.find("[parallel]"), "position_embedding = \"rope\"\n");
  auto with_fraction = [&](const std::string& text, const std::string& fraction) {
    std::string t = text;
    t.insert(t.find("[parallel]"), "rotary_fraction = " + fraction + "\n");
    return problems_of(t);
  };
  EXPECT_TRUE(with_fraction(rope, "0.25").empty());
  EXPECT_EQ(parse_scenario(rope, "t").model.rotary_dim(), 32);
  EXPECT_THAT(
      with_fraction(rope, "0.1"),
      Contains(HasSubstr("model.rotary_fraction = 0.1 rotates int(32 x 0.1) = 3 dimensions of each head: it must be a "
                         "positive even number")));
  EXPECT_THAT(with_fraction(rope, "0"), Contains(HasSubstr("model.rotary_fraction must be in (0, 1], got 0")));
  EXPECT_THAT(with_fraction(rope, "1.5"), Contains(HasSubstr("model.rotary_fraction must be in (0, 1], got 1.5")));
  EXPECT_THAT(
      with_fraction(base, "0.5"),
      Contains(HasSubstr("model.rotary_fraction = 0.5 needs model.position_embedding = \"rope\" (got \"learned\")")));
  // Composer runs MPT's blocks only.
  std::string composer = base;
  composer.replace(composer.find("tp = 2"), 6, "tp = 1");
  composer.insert(composer.find("[parallel]"), "norm = \"rmsnorm\"\n");
  composer += "[framework]\nname = \"composer\"\n";
  EXPECT_THAT(problems_of(composer), Contains(HasSubstr("framework.name = \"composer\" runs MPT's blocks")));
}

}  // namespace
}  // namespace twin::model

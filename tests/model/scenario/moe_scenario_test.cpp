// The Mixture-of-Experts scenario keys: read, defaulted, round-tripped, and every rule refusing by name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/scenario/scenario.hpp"

namespace twin::model {
namespace {

using ::testing::HasSubstr;

// 8 layers on 16 GPUs (tp 2, dp 8), 8 experts over ep 4.
constexpr const char* kMoe = R"(
[model]
name = "tiny-moe"
layers = 8
hidden = 256
heads = 8
seq_len = 128
vocab = 1000
experts = 8
top_k = 2
moe_ffn_hidden = 512
shared_experts = 1
dense_layers = 1
expert_load_skew = 0.5

[parallel]
tp = 2
pp = 1
micro_batch = 1
global_batch = 32
sequence_parallel = true
ep = 4

[cluster]
nodes = 2
node = "dgx-a100"
)";

std::string moe_problems_of(const std::string& text, const std::vector<Override>& overrides = {}) {
  try {
    parse_scenario(text, "moe.toml", overrides);
  } catch (const ScenarioError& error) {
    std::string out;
    for (const auto& problem : error.problems()) out += problem + "\n";
    return out;
  }
  return {};
}

TEST(MoeScenario, ReadsTheKeysAndRoundTrips) {
  const Scenario s = parse_scenario(kMoe, "moe.toml");
  EXPECT_TRUE(s.model.is_moe());
  EXPECT_EQ(s.model.experts, 8);
  EXPECT_EQ(s.model.top_k, 2);
  EXPECT_EQ(s.moe_ffn_hidden(), 512);
  EXPECT_EQ(s.model.shared_experts, 1);
  EXPECT_EQ(s.parallel.ep, 4);
  EXPECT_EQ(s.parallel.etp, 1);
  EXPECT_DOUBLE_EQ(s.model.expert_load_skew, 0.5);
  EXPECT_FALSE(s.is_moe_layer(0));  // dense_layers = 1
  EXPECT_TRUE(s.is_moe_layer(1));
  const Scenario back = parse_scenario(to_toml(s), "back.toml");
  EXPECT_EQ(to_toml(back), to_toml(s));
  EXPECT_EQ(back.parallel.ep, 4);
  EXPECT_EQ(back.model.dense_layers, 1);
}

TEST(MoeScenario, DefaultsAreMegatronsAndADenseModelWritesNoMoeKeys) {
  const Scenario s = parse_scenario(kMoe, "moe.toml", {{"model.moe_ffn_hidden", "2048"}});
  EXPECT_EQ(s.moe_ffn_hidden(), 2048);
  std::string dense = kMoe;
  for (const char* key : {"experts = 8\n", "top_k = 2\n", "moe_ffn_hidden = 512\n", "shared_experts = 1\n",
                          "dense_layers = 1\n", "expert_load_skew = 0.5\n", "ep = 4\n"}) {
    dense.erase(dense.find(key), std::string(key).size());
  }
  const Scenario d = parse_scenario(dense, "dense.toml");
  EXPECT_FALSE(d.model.is_moe());
  EXPECT_FALSE(d.is_moe_layer(3));
  EXPECT_EQ(d.model.top_k, 2);  // --moe-router-topk's default
  EXPECT_EQ(to_toml(d).find("experts"), std::string::npos);
  EXPECT_EQ(to_toml(d).find("ep ="), std::string::npos);
}

TEST(MoeScenario, MoeKeysWithoutExpertsAreRefusedByName) {
  const std::string problems = moe_problems_of(kMoe, {{"model.experts", "0"}});
  for (const char* key : {"model.top_k", "model.moe_ffn_hidden", "model.shared_experts", "model.dense_layers",
                          "model.expert_load_skew"}) {
    EXPECT_THAT(problems, HasSubstr(std::string(key) + " is a Mixture-of-Experts key")) << key;
  }
  // The sizes of the expert grid too (checked once the fields could be read).
  std::string dense = kMoe;
  for (const char* key : {"experts = 8\n", "top_k = 2\n", "moe_ffn_hidden = 512\n", "shared_experts = 1\n",
                          "dense_layers = 1\n", "expert_load_skew = 0.5\n"}) {
    dense.erase(dense.find(key), std::string(key).size());
  }
  EXPECT_THAT(moe_problems_of(dense), HasSubstr("parallel.ep = 4 and parallel.etp = 1 split the experts"));
}

TEST(MoeScenario, EachRuleNamesItsField) {
  const std::vector<std::pair<Override, std::string>> cases = {
      {{"model.top_k", "9"}, "model.top_k must be in [1, model.experts = 8], got 9"},
      {{"model.top_k", "0"}, "model.top_k must be in [1, model.experts = 8], got 0"},
      {{"parallel.ep", "3"}, "model.experts (8) must be divisible by parallel.ep (3)"},
      {{"parallel.ep", "0"}, "parallel.ep must be a positive integer, got 0"},
      {{"parallel.etp", "3"}, "model.moe_ffn_hidden (512) must be divisible by parallel.etp (3)"},
      {{"model.dense_layers", "8"}, "model.dense_layers must be in [0, model.layers = 8)"},
      {{"model.capacity_factor", "-1"}, "model.capacity_factor must be >= 0"},
      {{"model.expert_load_skew", "-0.5"}, "model.expert_load_skew must be in [0, 10]"},
      {{"model.shared_experts", "-1"}, "model.shared_experts must be >= 0"},
      {{"model.experts", "-2"}, "model.experts must be >= 0"},
      {{"model.moe_ffn_hidden", "0"}, "model.moe_ffn_hidden must be positive"},
      {{"parallel.sequence_parallel", "false"},
       "parallel.ep = 4 with parallel.tp = 2 needs "
       "parallel.sequence_parallel = true"},
      {{"model.dtype", "fp16"}, "Megatron-LM refuses expert parallelism in fp16"},
      {{"parallel.zero_stage", "3"}, "parallel.zero_stage = 3"},
  };
  for (const auto& [override, expected] : cases) {
    EXPECT_THAT(moe_problems_of(kMoe, {override}), HasSubstr(expected)) << override.key << "=" << override.value;
  }
  // ep x etp must divide tp x cp x dp = 16: ep 8 x etp 4 = 32 does not (8 experts over 8, width 512 over 4).
  EXPECT_THAT(
      moe_problems_of(kMoe, {{"parallel.ep", "8"}, {"parallel.etp", "4"}}),
      HasSubstr("parallel.ep x parallel.etp (8 x 4) must divide parallel.tp x parallel.cp x parallel.dp (2 x 1 x 8)"));
  EXPECT_EQ(moe_problems_of(kMoe, {{"parallel.ep", "8"}, {"parallel.etp", "2"}}), "");
  // With cp 2 the 16 GPUs are tp 2 x cp 2 x dp 4: the expert grid spans the cp ranks too (Megatron-Core folds cp into
  // the expert-data dimension), so ep 8 x etp 2 = 16 fits (tp x dp alone, 8, would refuse it) and 8 x 4 does not.
  const Override flash = {"framework.attention", "flash2"}, cp = {"parallel.cp", "2"};
  EXPECT_EQ(moe_problems_of(kMoe, {flash, cp, {"parallel.ep", "8"}, {"parallel.etp", "2"}}), "");
  EXPECT_EQ(moe_problems_of(kMoe, {flash, cp, {"parallel.ep", "4"}, {"parallel.etp", "4"}}), "");
  EXPECT_THAT(moe_problems_of(kMoe, {flash, cp, {"parallel.ep", "8"}, {"parallel.etp", "4"}}),
              HasSubstr("parallel.ep x parallel.etp (8 x 4) must divide parallel.tp x parallel.cp x parallel.dp "
                        "(2 x 2 x 4)"));
}

TEST(MoeScenario, PaddingToCapacityNeedsACapacityAndRoundTrips) {
  EXPECT_THAT(moe_problems_of(kMoe, {{"model.pad_to_capacity", "true"}}),
              HasSubstr("model.pad_to_capacity pads every expert to its capacity: it needs model.capacity_factor > 0"));
  EXPECT_THAT(moe_problems_of(kMoe, {{"model.experts", "0"}, {"model.pad_to_capacity", "true"}}),
              HasSubstr("model.pad_to_capacity is a Mixture-of-Experts key"));
  const Scenario padded =
      parse_scenario(kMoe, "moe.toml", {{"model.capacity_factor", "1.25"}, {"model.pad_to_capacity", "true"}});
  EXPECT_TRUE(padded.model.pad_to_capacity);
  EXPECT_THAT(to_toml(padded), HasSubstr("pad_to_capacity = true"));
  EXPECT_TRUE(parse_scenario(to_toml(padded), "back.toml").model.pad_to_capacity);
  EXPECT_EQ(to_toml(parse_scenario(kMoe, "moe.toml")).find("pad_to_capacity"), std::string::npos);
}

TEST(MoeScenario, TheFlexDispatcherIsAnMoeKeyAndRoundTrips) {
  const Override flex{"framework.moe_dispatcher", "\"flex\""};
  const std::string named = "framework.moe_dispatcher = \"flex\" (Megatron-Core's --moe-token-dispatcher-type flex)";
  const std::string dense =
      "[model]\nname = \"tiny\"\nlayers = 4\nhidden = 256\nheads = 8\nseq_len = 128\nvocab = 1000\n"
      "[parallel]\ntp = 2\nmicro_batch = 1\nglobal_batch = 32\n[cluster]\nnodes = 2\nnode = \"dgx-a100\"\n";
  EXPECT_THAT(
      moe_problems_of(dense, {flex}),
      HasSubstr(named + " deduplicates the tokens sent across expert-parallel ranks: it is a Mixture-of-Experts key, "
                        "it needs model.experts > 0 (got 0)"));
  // At ep = 1 it exchanges nothing: accepted (twin sim notes it), so that twin search keeps those plans.
  EXPECT_EQ(moe_problems_of(kMoe, {{"parallel.ep", "1"}, flex}), "");
  EXPECT_THAT(moe_problems_of(kMoe, {{"parallel.etp", "2"}, flex}), HasSubstr(named + " with parallel.etp = 2"));
  EXPECT_THAT(moe_problems_of(kMoe, {{"model.capacity_factor", "1"}, {"model.pad_to_capacity", "true"}, flex}),
              HasSubstr(named + " with model.pad_to_capacity"));
  EXPECT_THAT(moe_problems_of(kMoe, {{"framework.moe_dispatcher", "\"allgather\""}}), HasSubstr("moe_dispatcher"));
  const Scenario s = parse_scenario(kMoe, "moe.toml", {flex});
  EXPECT_EQ(s.framework.moe_dispatcher, MoeDispatcher::Flex);
  EXPECT_THAT(to_toml(s), HasSubstr("moe_dispatcher = \"flex\""));
  EXPECT_EQ(parse_scenario(to_toml(s), "back.toml").framework.moe_dispatcher, MoeDispatcher::Flex);
  EXPECT_EQ(to_toml(parse_scenario(kMoe, "moe.toml")).find("moe_dispatcher"), std::string::npos);
}

}  // namespace
}  // namespace twin::model

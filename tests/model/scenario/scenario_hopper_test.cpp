// The scenario keys of Hopper and Blackwell training: context parallelism (parallel.cp, framework.cp_comm), FP8
// (model.fp8, framework.fp8_recipe), the new nodes and fabrics (cluster.node, cluster.fabric, cluster.rail_optimized),
// and Llama 3's pipeline (parallel.microbatch_group, parallel.account_for_embedding / account_for_loss): defaults,
// round trips, the split of layers, and one clear problem per mistake.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/program/estimates.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::model {
namespace {

using ::testing::HasSubstr;

constexpr const char* kSmall = R"(
[model]
name = "small"
layers = 8
hidden = 256
heads = 8
seq_len = 128
vocab = 1000

[parallel]
tp = 2
pp = 2
micro_batch = 2
global_batch = 16

[cluster]
nodes = 1
node = "dgx-h100"

[framework]
attention = "flash2"
)";

std::string problems(const std::vector<std::string>& overrides, const std::string& text = kSmall) {
  std::vector<Override> parsed;
  for (const std::string& item : overrides) parsed.push_back(parse_override(item));
  try {
    parse_scenario(text, "case.toml", parsed);
  } catch (const ScenarioError& error) {
    std::string out;
    for (const auto& problem : error.problems()) out += problem + "\n";
    return out;
  }
  return "";
}

Scenario parsed(const std::vector<std::string>& overrides, const std::string& text = kSmall) {
  std::vector<Override> list;
  for (const std::string& item : overrides) list.push_back(parse_override(item));
  return parse_scenario(text, "case.toml", list);
}

TEST(HopperScenario, DefaultsLeaveThePlanAsBefore) {
  const Scenario s = parsed({});
  EXPECT_EQ(s.parallel.cp, 1);
  EXPECT_EQ(s.parallel.dp, 2);
  EXPECT_EQ(s.framework.cp_comm, CpComm::P2P);
  EXPECT_EQ(s.model.fp8, Fp8Format::None);
  EXPECT_EQ(s.framework.fp8_recipe, Fp8Recipe::Delayed);  // Megatron-Core's default
  EXPECT_EQ(s.cluster.fabric, Fabric::NodeDefault);
  EXPECT_FALSE(s.cluster.rail_optimized);
  EXPECT_EQ(s.parallel.microbatch_group, 0);
  // None of them is written when at its default: a scenario's TOML reads as before.
  const std::string toml = to_toml(s);
  for (const char* key : {"cp =", "cp_comm", "fp8", "fabric", "rail_optimized", "microbatch_group", "account_for"}) {
    EXPECT_EQ(toml.find(key), std::string::npos) << key;
  }
}

TEST(HopperScenario, ContextParallelSharesTheWorldWithTpPpDp) {
  const Scenario s = parsed({"parallel.cp=2", "framework.cp_comm=all_gather"});
  EXPECT_EQ(s.parallel.dp, 1);  // 8 GPUs / (tp 2 * cp 2 * pp 2)
  EXPECT_EQ(s.parallel.world_size(), 8);
  EXPECT_EQ(s.framework.cp_comm, CpComm::AllGather);
  EXPECT_EQ(s.parallel.micro_batches(), 8);  // CP ranks share sequences: the batch splits over dp alone
  const Scenario again = parse_scenario(to_toml(s), "again.toml");
  EXPECT_EQ(to_toml(again), to_toml(s));
  EXPECT_EQ(again.parallel.cp, 2);
  EXPECT_THAT(problems({"parallel.cp=3"}), HasSubstr("not a multiple of tp*cp*pp = 12"));
  EXPECT_THAT(problems({"parallel.cp=2", "parallel.dp=2"}),
              HasSubstr("parallel.tp * parallel.cp * parallel.pp * parallel.dp = 2 * 2 * 2 * 2 = 16 does not match "
                        "the cluster's 8 GPUs"));
}

TEST(HopperScenario, ContextParallelRules) {
  EXPECT_THAT(problems({"parallel.cp=2", "model.seq_len=130"}),
              HasSubstr("model.seq_len (130) must be divisible by 2 * parallel.cp (4)"));
  EXPECT_THAT(problems({"parallel.cp=2", "framework.attention=unfused"}),
              HasSubstr("framework.attention must be \"flash2\""));
  EXPECT_THAT(problems({"parallel.cp=2", "framework.cp_comm=a2a", "model.kv_heads=2"}),
              HasSubstr("model.heads (8) and the key/value heads (2) must be divisible by 4"));
  EXPECT_EQ(problems({"parallel.cp=2", "framework.cp_comm=a2a"}), "");
  EXPECT_THAT(problems({"parallel.cp=2", "model.position_embedding=alibi"}), HasSubstr("takes no attention bias"));
  EXPECT_THAT(problems({"framework.cp_comm=ring"}),
              HasSubstr("framework.cp_comm: unknown value \"ring\" (expected one of p2p, all_gather, a2a)"));
  EXPECT_THAT(problems({"parallel.cp=0"}), HasSubstr("parallel.cp must be a positive integer, got 0"));
}

TEST(HopperScenario, Fp8NeedsFp8TensorCores) {
  const Scenario s = parsed({"model.fp8=hybrid", "framework.fp8_recipe=tensorwise"});
  EXPECT_EQ(s.model.fp8, Fp8Format::Hybrid);
  EXPECT_EQ(s.framework.fp8_recipe, Fp8Recipe::Tensorwise);
  EXPECT_EQ(to_toml(parse_scenario(to_toml(s), "again.toml")), to_toml(s));
  EXPECT_THAT(problems({"model.fp8=e4m3", "cluster.node=dgx-a100"}),
              HasSubstr("model.fp8 needs FP8 tensor cores (Hopper or Blackwell); cluster.node = \"dgx-a100\""));
  EXPECT_THAT(problems({"model.fp8=e4m3", "framework.fp8_recipe=mxfp8"}),
              HasSubstr("\"mxfp8\" needs Blackwell's block-scaled tensor cores"));
  EXPECT_EQ(problems({"model.fp8=e4m3", "framework.fp8_recipe=mxfp8", "cluster.node=dgx-b200"}), "");
  EXPECT_THAT(problems({"framework.fp8_recipe=blockwise"}), HasSubstr("it needs model.fp8"));
  EXPECT_THAT(problems({"model.fp8=hybrid", "model.dtype=fp32"}), HasSubstr("model.dtype must be \"bf16\""));
  EXPECT_THAT(problems({"model.fp8=e5m2"}), HasSubstr("expected one of none, hybrid, e4m3"));
}

TEST(HopperScenario, NodesAndFabrics) {
  const Scenario rack = parsed({"cluster.node=gb200-nvl72", "parallel.dp=18", "parallel.global_batch=36"});
  EXPECT_EQ(rack.cluster.gpus_per_node, 72);
  EXPECT_EQ(rack.parallel.world_size(), 72);
  const Scenario roce = parsed({"cluster.fabric=roce", "cluster.rail_optimized=true"});
  EXPECT_EQ(roce.cluster.fabric, Fabric::Roce);
  EXPECT_TRUE(roce.cluster.rail_optimized);
  EXPECT_EQ(to_toml(parse_scenario(to_toml(roce), "again.toml")), to_toml(roce));
  EXPECT_THAT(problems({"cluster.fabric=ethernet"}),
              HasSubstr("(expected one of node, infiniband-hdr, infiniband-ndr, infiniband-xdr, roce)"));
}

// Llama 3 405B's split (arXiv:2407.21783, 3.3.2): 126 layers over 16 stages x 8 chunks, the embedding and the loss
// each counted as a layer, so the first chunk holds the embedding alone and the last the head and loss alone.
TEST(HopperScenario, EmbeddingAndLossCountAsLayers) {
  Scenario s =
      parsed({"model.layers=126", "parallel.pp=16", "parallel.tp=1", "parallel.dp=1", "cluster.nodes=2",
              "parallel.schedule=interleaved", "parallel.virtual_stages=8", "parallel.global_batch=32",
              "parallel.micro_batch=1", "parallel.account_for_embedding=true", "parallel.account_for_loss=true"});
  EXPECT_EQ(s.layers_in_virtual_stage(0), 0);
  EXPECT_EQ(s.layers_in_virtual_stage(1), 1);
  EXPECT_EQ(s.layers_in_virtual_stage(127), 0);
  EXPECT_EQ(s.layers_on_stage(0), 7);   // its first chunk has no layer
  EXPECT_EQ(s.layers_on_stage(15), 7);  // its last chunk has no layer
  EXPECT_EQ(s.layers_on_stage(1), 8);
  EXPECT_EQ(s.first_layer_of_virtual_stage(2), 1);
  std::int64_t total = 0;
  for (int stage = 0; stage < 16; ++stage) total += s.layers_on_stage(stage);
  EXPECT_EQ(total, 126);
  EXPECT_EQ(to_toml(parse_scenario(to_toml(s), "again.toml")), to_toml(s));
  EXPECT_THAT(problems({"parallel.account_for_embedding=true"}),
              HasSubstr("makes 9: it must be divisible by parallel.pp * parallel.virtual_stages (2 * 1 = 2)"));
  EXPECT_THAT(problems({"parallel.account_for_embedding=true", "parallel.first_stage_layers=2"}),
              HasSubstr("give one (Megatron-Core refuses both)"));
}

TEST(HopperScenario, LighterEndStagesSplitOverTheirChunks) {
  // 12 layers, 3 stages x 2 chunks: the first stage 2 (1 per chunk), the last 2, the middle 8 (4 per chunk).
  const Scenario s =
      parsed({"model.layers=12", "parallel.pp=3", "parallel.tp=1", "cluster.gpus_per_node=3", "parallel.dp=1",
              "parallel.schedule=interleaved", "parallel.virtual_stages=2", "parallel.global_batch=6",
              "parallel.micro_batch=1", "parallel.first_stage_layers=2", "parallel.last_stage_layers=2"});
  const int expected[] = {1, 4, 1, 1, 4, 1};  // virtual stage = chunk * pp + stage
  for (int vs = 0; vs < 6; ++vs) EXPECT_EQ(s.layers_in_virtual_stage(vs), expected[vs]) << vs;
}

TEST(HopperScenario, MicroBatchGroupsLetAnyNumberOfMicroBatchesInterleave) {
  // 6 micro-batches on 4 stages: not a multiple, refused in groups of pp; in one group of 6 it runs.
  const std::vector<std::string> plan = {"parallel.pp=4",
                                         "parallel.tp=1",
                                         "parallel.dp=2",
                                         "model.layers=8",
                                         "parallel.schedule=interleaved",
                                         "parallel.virtual_stages=2",
                                         "parallel.global_batch=12",
                                         "parallel.micro_batch=1"};
  EXPECT_THAT(problems(plan), HasSubstr("or give parallel.microbatch_group"));
  std::vector<std::string> grouped = plan;
  grouped.push_back("parallel.microbatch_group=6");
  const Scenario s = parsed(grouped);
  EXPECT_EQ(s.parallel.microbatch_group, 6);
  EXPECT_TRUE(estimate_memory(s).stages.size() == 4);
  grouped.back() = "parallel.microbatch_group=7";
  EXPECT_THAT(problems(grouped),
              HasSubstr("parallel.microbatch_group (7) must be 1 to the micro-batches per pipeline"));
  EXPECT_THAT(problems({"parallel.microbatch_group=2"}), HasSubstr("it needs parallel.schedule = \"interleaved\""));
}

}  // namespace
}  // namespace twin::model

// Golden files: small simulations whose whole summary (simulated times to the last digit) is committed under
// tests/sim/golden/. Any change to the cost model, the collectives, the platform or the replay shows up here as a
// diff to review. After an intended change: TWIN_UPDATE_GOLDEN=1 ./twin_sim_tests --gtest_filter='Golden*'
// rewrites the files; commit them with the change that explains them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "sim/cost_model.hpp"
#include "report/summary.hpp"
#include "sim/simulate.hpp"
#include "support.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {
namespace {

using testing::make_scenario;
using testing::Plan;

struct GoldenCase {
  const char* name;
  Plan plan;
  Fidelity fidelity;
  std::string framework = "megatron";
  bool llama = false;  // RMSNorm, SwiGLU, rotary embeddings, 4 key/value heads, no biases, untied, FlashAttention-2
};

void PrintTo(const GoldenCase& c, std::ostream* out) { *out << c.name; }

std::vector<GoldenCase> cases() {
  Plan one_node;  // TP 2 x PP 2 x DP 2 on one DGX A100, 1F1B, full recompute
  one_node.tp = 2;
  one_node.pp = 2;
  one_node.dp = 2;
  one_node.global_batch = 8;
  one_node.recompute = "full";
  Plan interleaved;  // TP 4 x PP 2 x DP 2 on two nodes, interleaved v = 2, SP, ZeRO-1, DP overlap
  interleaved.tp = 4;
  interleaved.pp = 2;
  interleaved.dp = 2;
  interleaved.nodes = 2;
  interleaved.global_batch = 8;
  interleaved.schedule = "interleaved";
  interleaved.virtual_stages = 2;
  interleaved.sequence_parallel = true;
  interleaved.recompute = "selective";
  interleaved.zero_stage = 1;
  interleaved.dp_overlap = true;
  Plan deepspeed = one_node;  // the same plan through DeepSpeed's pipeline engine, across 4 nodes
  deepspeed.tp = 8;
  deepspeed.pp = 4;
  deepspeed.dp = 1;
  deepspeed.nodes = 4;
  return {{"one_node_1f1b_rank", one_node, Fidelity::Rank},
          {"two_nodes_interleaved_rank", interleaved, Fidelity::Rank},
          {"two_nodes_interleaved_group", interleaved, Fidelity::Group},
          {"four_nodes_deepspeed_group", deepspeed, Fidelity::Group, "deepspeed"},
          {"two_nodes_llama_interleaved_group", interleaved, Fidelity::Group, "megatron", true}};
}

std::string golden_path(const std::string& name) {
  const char* dir = std::getenv("TWIN_SOURCE_DIR");
  return std::string(dir ? dir : TWIN_SOURCE_DIR_FALLBACK) + "/tests/sim/golden/" + name + ".json";
}

class Golden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(Golden, SummaryMatchesTheCommittedFile) {
  const GoldenCase& c = GetParam();
  model::Scenario scenario = make_scenario(c.plan);
  scenario.framework.name = c.framework == "deepspeed" ? model::Framework::DeepSpeed : model::Framework::Megatron;
  if (c.llama) {
    scenario.model.norm = model::Norm::RmsNorm;
    scenario.model.activation = model::Activation::Swiglu;
    scenario.model.position_embedding = model::PositionEmbedding::Rope;
    scenario.model.kv_heads = 4;
    scenario.model.linear_bias = false;
    scenario.model.ffn_hidden = 2816;
    scenario.framework.tied_embeddings = false;
    scenario.framework.attention = model::AttentionKind::Flash2;
    ASSERT_TRUE(model::validation_problems(scenario).empty());
  }
  const model::Program program = model::build_program(scenario, model::Granularity::Layer);
  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  SimOptions options;
  options.fidelity = c.fidelity;
  const SimResult result = simulate(program, cost, options);
  const report::Summary summary = report::summarize(program, result.timeline, result.peak_flops_per_gpu, "sim", 0,
                                                    layer_parts(cost, program.scenario));
  const std::string actual = report::summary_to_json(summary).dump(1) + "\n";

  const std::string path = golden_path(c.name);
  if (std::getenv("TWIN_UPDATE_GOLDEN")) {
    std::ofstream(path) << actual;
    GTEST_SKIP() << "rewrote " << path;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in) << path << " is missing: run with TWIN_UPDATE_GOLDEN=1 to write it";
  std::stringstream expected;
  expected << in.rdbuf();
  EXPECT_EQ(actual, expected.str()) << "the simulated summary of " << c.name << " changed; if intended, rewrite the "
                                    << "golden files (TWIN_UPDATE_GOLDEN=1) and commit them with the change";
}

INSTANTIATE_TEST_SUITE_P(Simulations, Golden, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<GoldenCase>& case_info) {
                           return std::string(case_info.param.name);
                         });

}  // namespace
}  // namespace twin::sim

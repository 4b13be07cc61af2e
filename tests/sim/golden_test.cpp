// Golden files: small simulations whose whole summary (simulated times to the last digit) is committed under
// tests/sim/golden/. Any change to the cost model, the collectives, the platform or the replay shows up here as a
// diff to review. Besides the dense plans: Mixture of Experts (ep 4, skewed), context parallelism (cp 2, p2p ring),
// FP8 (hybrid, delayed) and a host slower than its kernels (cluster.host_us_per_kernel). After an intended change:
// TWIN_UPDATE_GOLDEN=1 TWIN_SOURCE_DIR=$PWD build/tests/sim/twin_sim_tests --gtest_filter='*Golden*' (from the
// repository root) rewrites the files; commit them with the change that explains them.
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
  std::vector<std::string> sets = {};  // overrides on top of the plan
  // The cost model of the scenario's own GPU and cluster (its host model included); false: the A100's defaults, as
  // the first five files were written with.
  bool scenario_costs = false;
  // Layer: one fused op per layer and phase; Op: every kernel an op (the MoE host sync is an op of its own only there).
  model::Granularity granularity = model::Granularity::Layer;
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
  // Mixture of Experts: 8 experts (top 2, skewed load) over ep 4 on TP 2 x PP 2 x DP 2, one node.
  Plan moe = one_node;
  moe.layers = 4;
  moe.sequence_parallel = true;
  moe.recompute = "none";
  const std::vector<std::string> moe_sets = {"model.experts=8", "model.top_k=2", "model.moe_ffn_hidden=2048",
                                             "parallel.ep=4", "model.expert_load_skew=0.5"};
  // A host of 10 us a kernel ahead of its GPU over attention and behind it over 16 local experts' GEMM launches
  // (64 experts over ep 4, as tests/sim/moe_host_sync_test.cpp): it loses its lead at each layer's token-count sync.
  Plan moe_host;
  moe_host.layers = 4;
  moe_host.hidden = 2048;
  moe_host.seq = 2048;
  moe_host.vocab = 4096;
  moe_host.dp = 4;
  moe_host.gpus_per_node = 4;
  const std::vector<std::string> moe_host_sets = {"model.experts=64", "model.top_k=2", "model.moe_ffn_hidden=256",
                                                  "parallel.ep=4", "cluster.host_us_per_kernel=10"};
  // Context parallelism: TP 2 x CP 2 x DP 2 on one DGX H100 at 8k tokens, Llama-style, FlashAttention-2.
  Plan cp = one_node;
  cp.pp = 1;
  cp.layers = 4;
  cp.seq = 8192;
  cp.node = "dgx-h100";
  cp.sequence_parallel = true;
  cp.recompute = "none";
  // FP8 (hybrid, delayed scaling) on DGX H100s: TP 2 x PP 2 x DP 2.
  Plan fp8 = one_node;
  fp8.node = "dgx-h100";
  fp8.sequence_parallel = true;
  // A host slower than its microsecond kernels (cluster.host_us_per_kernel = 20): PP 2 on two GPUs.
  Plan host;
  host.layers = 4;
  host.hidden = 256;
  host.heads = 4;
  host.seq = 256;
  host.vocab = 1024;
  host.pp = 2;
  host.global_batch = 4;
  host.gpus_per_node = 2;
  return {{"one_node_1f1b_rank", one_node, Fidelity::Rank},
          {"moe_ep4_rank", moe, Fidelity::Rank, "megatron", false, moe_sets, true},
          {"moe_ep4_group", moe, Fidelity::Group, "megatron", false, moe_sets, true},
          {"context_parallel_cp2_group", cp, Fidelity::Group, "megatron", true,
           {"parallel.cp=2", "framework.cp_comm=\"p2p\"", "framework.attention=\"flash2\""}, true},
          {"fp8_hybrid_delayed_rank", fp8, Fidelity::Rank, "megatron", false, {"model.fp8=\"hybrid\""}, true},
          {"host_paced_pp2_rank", host, Fidelity::Rank, "megatron", false, {"cluster.host_us_per_kernel=20"}, true},
          {"moe_ep4_host_paced_op_rank", moe_host, Fidelity::Rank, "megatron", false, moe_host_sets, true,
           model::Granularity::Op},
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
  model::Scenario scenario = make_scenario(c.plan, c.sets);
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
  const model::Program program = model::build_program(scenario, c.granularity);
  const topology::GpuSpec gpu = c.scenario_costs ? topology::node_spec(scenario.cluster.node).gpu
                                                 : topology::a100_sxm4_80gb();
  const AnalyticalCostModel cost(gpu, c.scenario_costs ? analytical_parameters(gpu, scenario.cluster)
                                                       : analytical_parameters(gpu));
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

// api/: scenarios by name or text with overrides, the field an error names, a simulation called twice in one process
// (each isolated), and a sweep simulated here whose refused variant says why in its row.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "api/twin.hpp"

namespace twin::api {
namespace {

TEST(Api, ScenarioByNameAndOverridesAsTheCommandLineTakesThem) {
  const model::Scenario by_name = scenario_named("gpt3-175b", parse_overrides({"cluster.nodes=64"}));
  EXPECT_EQ(by_name.cluster.nodes, 64);
  EXPECT_EQ(by_name.parallel.dp * by_name.parallel.tp * by_name.parallel.pp * by_name.parallel.cp, 512);
  const model::Scenario from_text =
      scenario_from_text(model::to_toml(by_name), parse_overrides({"cluster.nodes=32", "parallel.dp=4"}));
  EXPECT_EQ(from_text.cluster.nodes, 32);
  EXPECT_EQ(from_text.model.layers, by_name.model.layers);
}

TEST(Api, AScenarioErrorNamesItsField) {
  try {
    scenario_named("gpt3-175b", parse_overrides({"model.layers=0"}));
    FAIL() << "a model without layers loaded";
  } catch (const model::ScenarioError& error) {
    EXPECT_EQ(field_of(error), "model.layers") << error.what();
  }
  try {
    scenario_named("no-such-scenario");
    FAIL() << "a missing scenario loaded";
  } catch (const UserError& error) {
    EXPECT_EQ(field_of(error), "");
  }
}

TEST(Api, ASimulationRunsAgainInTheSameProcessWithTheSameResult) {
  const model::Scenario s = scenario_named("gpt3-175b", parse_overrides({"parallel.global_batch=128"}));
  const nlohmann::json first = sim_document(simulate(s, {}), {});
  SimRequest request;
  request.train_tokens = "300B";
  const nlohmann::json second = sim_document(simulate(s, request), request);
  EXPECT_GT(first.at("iteration_time_s").get<double>(), 0);
  EXPECT_EQ(first.at("iteration_time_s"), second.at("iteration_time_s"));
  EXPECT_FALSE(first.contains("training"));
  EXPECT_GT(second.at("training").at("gpu_hours").get<double>(), 0);
}

// cluster.usd_per_gpu_hour prices a --train-tokens run on every plan family (pp 1, 1F1B and interleaved pp 2, EP 2,
// CP 2) at both fidelities and granularities: the cost is the price times the run's GPU-hours, absent without the
// key, and --usd-per-gpu-hour wins over it. It moves no iteration time (a price is not a cost of the hardware).
TEST(Api, TheScenariosPriceCostsTheRunOnEveryPlanFamily) {
  const std::string base = R"(
[model]
name = "priced-gpt"
layers = 4
hidden = 512
heads = 8
seq_len = 512
vocab = 8192
dtype = "bf16"
[parallel]
tp = 2
micro_batch = 1
global_batch = 8
[cluster]
node = "dgx-h100"
[framework]
name = "megatron"
attention = "flash2"
)";
  const std::vector<std::vector<std::string>> families = {
      {"parallel.pp=1", "cluster.gpus_per_node=4", "parallel.dp=2"},
      {"parallel.pp=2", "cluster.gpus_per_node=8", "parallel.dp=2"},
      {"parallel.pp=2", "cluster.gpus_per_node=8", "parallel.dp=2", "parallel.schedule=interleaved",
       "parallel.virtual_stages=2"},
      {"parallel.pp=1", "cluster.gpus_per_node=4", "parallel.dp=2", "model.experts=4", "model.top_k=2",
       "parallel.ep=2", "parallel.sequence_parallel=true"},
      {"parallel.pp=1", "cluster.gpus_per_node=8", "parallel.dp=2", "parallel.cp=2"},
  };
  for (const auto& family : families) {
    std::vector<std::string> priced = family;
    priced.push_back("cluster.usd_per_gpu_hour=3");
    const model::Scenario plain = scenario_from_text(base, parse_overrides(family));
    const model::Scenario with_price = scenario_from_text(base, parse_overrides(priced));
    for (const char* fidelity : {"rank", "group"}) {
      for (const char* granularity : {"op", "layer"}) {
        SCOPED_TRACE(family.back() + " " + fidelity + " " + granularity);
        SimRequest request;
        request.fidelity = fidelity;
        request.granularity = granularity;
        request.train_tokens = "1B";
        const nlohmann::json unpriced = sim_document(simulate(plain, request), request);
        const nlohmann::json doc = sim_document(simulate(with_price, request), request);
        EXPECT_FALSE(unpriced.at("training").contains("cost_usd"));
        const nlohmann::json& training = doc.at("training");
        EXPECT_GT(training.at("gpu_hours").get<double>(), 0);
        EXPECT_DOUBLE_EQ(training.at("cost_usd").get<double>(), 3 * training.at("gpu_hours").get<double>());
        EXPECT_EQ(doc.at("iteration_time_s"), unpriced.at("iteration_time_s"));
        request.usd_per_gpu_hour = 2;  // the flag wins
        const nlohmann::json flagged = sim_document(simulate(with_price, request), request);
        EXPECT_DOUBLE_EQ(flagged.at("training").at("cost_usd").get<double>(),
                         2 * flagged.at("training").at("gpu_hours").get<double>());
      }
    }
  }
}

TEST(Api, ASweepSimulatedHereGivesARowPerVariantAndSaysWhyOneWasRefused) {
  SweepRequest request;
  request.scenario = "gpt3-175b";
  request.sets = {"parallel.global_batch=128"};
  request.varies = {"parallel.tp=3,8"};
  const Sweep result = sweep(request);
  const nlohmann::json rows = sweep_rows(result, request);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_NE(rows[0].at("error").get<std::string>().find("invalid: "), std::string::npos);
  EXPECT_EQ(rows[1].at("error"), "");
  EXPECT_GT(rows[1].at("iteration_time_s").get<double>(), 0);
  EXPECT_EQ(sweep_document(result, request).at("varied"), nlohmann::json::array({"parallel.tp"}));
}

}  // namespace
}  // namespace twin::api

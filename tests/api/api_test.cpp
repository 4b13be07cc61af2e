// api/: scenarios by name or text with overrides, the field an error names, a simulation called twice in one process
// (each isolated), and a sweep simulated here whose refused variant says why in its row.
#include <gtest/gtest.h>

#include <string>

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

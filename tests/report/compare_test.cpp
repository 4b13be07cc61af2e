#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sim/report/compare.hpp"

namespace twin::report {
namespace {

using ::testing::HasSubstr;

nlohmann::json summary(double time, double tflops, int dp, double stage0_busy) {
  return {{"scenario", {{"tp", 8}, {"pp", 2}, {"dp", dp}, {"micro_batches", 16}}},
          {"engine", "sim"},
          {"iteration_time_s", time},
          {"tflops_per_gpu", tflops},
          {"bubble_fraction", 0.1},
          {"time_split", {{"compute", 0.7}, {"tp", 0.1}, {"pp", 0.05}, {"dp", 0.05}, {"bubble", 0.1}}},
          {"stages", {{{"stage", 0}, {"busy_s", stage0_busy}}, {{"stage", 1}, {"busy_s", 9.0}}}}};
}

TEST(Compare, ErrorsAreRelativeToTheMeasurement) {
  const Comparison c = compare_summaries(summary(10.0, 100, 4, 8.0), summary(12.0, 83.3, 4, 10.0));
  ASSERT_GE(c.totals.size(), 3u);
  EXPECT_EQ(c.totals[0].name, "iteration time (s)");
  EXPECT_NEAR(c.totals[0].error(), 0.2, 1e-12);
  ASSERT_EQ(c.stages.size(), 2u);
  EXPECT_NEAR(c.stages[0].error(), 0.25, 1e-12);
  // The time split is in seconds: compute 0.7 * 10 measured against 0.7 * 12 predicted.
  EXPECT_DOUBLE_EQ(c.totals[3].reference, 7.0);
  EXPECT_DOUBLE_EQ(c.totals[3].candidate, 8.4);
  EXPECT_THAT(comparison_table(c), HasSubstr("+20.0%"));
}

TEST(Compare, ComputeByKindComparesTheKindsBothTimedInALayersOrder) {
  nlohmann::json measured = summary(10.0, 100, 4, 8.0), predicted = summary(12.0, 83.3, 4, 10.0);
  measured["compute_by_kind_s"] = {{"mlp_up", 2.0}, {"qkv_projection", 1.0}, {"gelu", 0.5}};
  predicted["compute_by_kind_s"] = {{"mlp_up", 2.5}, {"qkv_projection", 0.9}, {"transformer_layer", 4.0}};
  const Comparison c = compare_summaries(measured, predicted);
  ASSERT_EQ(c.kinds.size(), 2u);  // gelu measured only, transformer_layer predicted only
  EXPECT_EQ(c.kinds[0].name, "qkv_projection (s)");
  EXPECT_NEAR(c.kinds[0].error(), -0.1, 1e-12);
  EXPECT_EQ(c.kinds[1].name, "mlp_up (s)");
  EXPECT_NEAR(c.kinds[1].error(), 0.25, 1e-12);
  EXPECT_THAT(comparison_table(c), HasSubstr("compute by kernel"));
  // Without the key on either side there is nothing to compare.
  EXPECT_TRUE(compare_summaries(summary(10.0, 100, 4, 8.0), predicted).kinds.empty());
  nlohmann::json broken = measured;
  broken["compute_by_kind_s"]["mlp_up"] = -1;
  try {
    find_summary(broken, "bad.json");
    FAIL() << "expected CompareError";
  } catch (const CompareError& error) {
    EXPECT_THAT(error.what(), HasSubstr("\"compute_by_kind_s.mlp_up\" must be a number of seconds >= 0, got -1"));
  }
}

TEST(Compare, RefusesDifferentPlans) {
  try {
    compare_summaries(summary(10.0, 100, 4, 8.0), summary(10.0, 100, 8, 8.0));
    FAIL() << "expected CompareError";
  } catch (const CompareError& error) {
    EXPECT_THAT(error.what(), HasSubstr("dp is 4 in the measurement and 8 in the prediction"));
  }
}

TEST(Compare, FindsTheSummaryOfARunDocument) {
  const nlohmann::json run = {{"losses", {5.5, 5.0}}, {"summary", summary(1.0, 1.0, 1, 1.0)}};
  EXPECT_EQ(&find_summary(run, "run.json"), &run["summary"]);
  EXPECT_THROW(find_summary(nlohmann::json{{"losses", 1}}, "x.json"), CompareError);
}

TEST(Compare, ASummaryWithAFieldOfTheWrongKindIsRefusedByName) {
  auto refused = [](nlohmann::json document) {
    try {
      find_summary(document, "bad.json");
    } catch (const CompareError& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  nlohmann::json negative_time = summary(10.0, 100, 4, 8.0);
  negative_time["iteration_time_s"] = -1;
  EXPECT_THAT(refused(negative_time), HasSubstr("bad.json: \"iteration_time_s\" must be a positive number"));
  nlohmann::json zero_time = summary(10.0, 100, 4, 8.0);
  zero_time["iteration_time_s"] = 0;
  EXPECT_THAT(refused(zero_time), HasSubstr("\"iteration_time_s\""));
  nlohmann::json text_split = summary(10.0, 100, 4, 8.0);
  text_split["time_split"]["compute"] = "x";
  EXPECT_THAT(refused(text_split), HasSubstr("\"time_split.compute\" must be a fraction in [0, 1], got \"x\""));
  nlohmann::json negative_tflops = summary(10.0, -5, 4, 8.0);
  EXPECT_THAT(refused(negative_tflops), HasSubstr("\"tflops_per_gpu\""));
  nlohmann::json text_stages = summary(10.0, 100, 4, 8.0);
  text_stages["stages"] = "x";
  EXPECT_THAT(refused(text_stages), HasSubstr("\"stages\" must be an array"));
  nlohmann::json text_scenario = summary(10.0, 100, 4, 8.0);
  text_scenario["scenario"] = 5;
  EXPECT_THAT(refused(text_scenario), HasSubstr("\"scenario\" must be an object"));
  nlohmann::json text_dp = summary(10.0, 100, 4, 8.0);
  text_dp["scenario"]["dp"] = "four";
  EXPECT_THAT(refused(text_dp), HasSubstr("\"scenario.dp\" must be an integer"));
  EXPECT_EQ(refused(summary(10.0, 100, 4, 8.0)), "accepted");
}

}  // namespace
}  // namespace twin::report

// report/within_days.hpp on rows made here: which rows finish within the days (failures counted where the rows carry
// goodput), and the one that does with the fewest GPUs, ties to the fewest GPU-hours.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "report/within_days.hpp"

namespace {

using nlohmann::json;
namespace report = twin::report;

// A sweep row: `gpus` GPUs, a run of `days` days (GPU-hours gpus x days x 24), `with_failures` days with goodput.
json row(int gpus, double days, double with_failures = 0) {
  json r{{"gpus", gpus}, {"error", ""}, {"training", {{"days", days}, {"gpu_hours", gpus * days * 24}}}};
  if (with_failures > 0) {
    r["training"]["days_with_failures"] = with_failures;
    r["goodput"] = {{"goodput_fraction", days / with_failures}};
  }
  return r;
}

TEST(WithinDays, TheFewestGpusThatFinishWin) {
  json rows = json::array({row(64, 40), row(128, 20), row(256, 11), json{{"gpus", 32}, {"error", "failed: x"}}});
  report::mark_finishes_in_days(rows, 30);
  EXPECT_FALSE(rows[0]["finishes_in_days"].get<bool>());
  EXPECT_TRUE(rows[1]["finishes_in_days"].get<bool>());
  EXPECT_TRUE(rows[2]["finishes_in_days"].get<bool>());
  EXPECT_FALSE(rows[3].contains("finishes_in_days"));  // no result, no answer
  EXPECT_EQ(report::fewest_gpus_within_days(rows), 1u);
  EXPECT_DOUBLE_EQ(*report::fastest_days(rows), 11);
}

TEST(WithinDays, TiesGoToTheFewestGpuHours) {
  // Two plans on 128 GPUs: the later one finishes in fewer days, hence fewer GPU-hours.
  json rows = json::array({row(256, 5), row(128, 20), row(128, 15)});
  report::mark_finishes_in_days(rows, 30);
  EXPECT_EQ(report::fewest_gpus_within_days(rows), 2u);
}

TEST(WithinDays, GoodputDaysCountAndNoneMayFinish) {
  json rows = json::array({row(128, 29, 31), row(256, 15, 16)});
  report::mark_finishes_in_days(rows, 30);
  EXPECT_FALSE(rows[0]["finishes_in_days"].get<bool>());  // 29 days of training, 31 with failures
  EXPECT_EQ(report::fewest_gpus_within_days(rows), 1u);
  report::mark_finishes_in_days(rows, 10);
  EXPECT_FALSE(report::fewest_gpus_within_days(rows).has_value());
  EXPECT_DOUBLE_EQ(*report::fastest_days(rows), 16);
}

TEST(WithinDays, ASearchRowsGpusAreItsPlans) {
  const json plan{{"tp", 8}, {"cp", 2}, {"pp", 4}, {"dp", 3}};
  EXPECT_DOUBLE_EQ(report::row_gpus(plan), 192);
}

}  // namespace

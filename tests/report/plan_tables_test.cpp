// The columns of the search and sweep tables: their CSV, and search's --sort.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/scenario/errors.hpp"
#include "report/plan_tables.hpp"

namespace twin::report {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json plan(int tp, double seconds, double tflops, const std::string& error = "") {
  return {{"node", "dgx-h100"},
          {"tp", tp},
          {"pp", 2},
          {"dp", 4},
          {"cp", 1},
          {"ep", 1},
          {"etp", 1},
          {"micro_batch", 1},
          {"schedule", "1f1b"},
          {"virtual_stages", 1},
          {"recompute", "none"},
          {"recompute_num_layers", 0},
          {"sequence_parallel", tp > 1},
          {"zero_stage", 1},
          {"memory_per_gpu_bytes", 2.0 * 1024 * 1024 * 1024},
          {"fits", error.empty()},
          {"iteration_time_s", seconds},
          {"tflops_per_gpu", tflops},
          {"bubble_fraction", 0.125},
          {"error", error}};
}

TEST(PlanTables, TheSearchCsvHasALinePerPlanAndQuotesWhatNeedsIt) {
  const json rows = {plan(8, 2.5, 150), plan(4, 3.0, 120, "failed: a \"bad\", odd plan")};
  const std::string csv = report::csv(search_columns(rows), rows);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "tp,pp,dp,mb,schedule,chunks,recompute,sharding,iter_s,tflops,bubble,mem_gib,fits,error");
  EXPECT_THAT(csv, HasSubstr("\n8,2,4,1,1f1b,1,none,sp zero1,2.5000,150.0,12.5,2.0,yes,\n"));
  EXPECT_THAT(csv, HasSubstr("\n4,2,4,1,1f1b,1,none,sp zero1,,,,,,\"failed: a \"\"bad\"\", odd plan\"\n"));
}

TEST(PlanTables, TheSweepCsvStartsWithTheVariedKeys) {
  const json row = {{"set", {{"cluster.nodes", "64"}}},
                    {"gpus", 512},
                    {"iteration_time_s", 10.0},
                    {"tflops_per_gpu", 1.0},
                    {"bubble_fraction", 0.0},
                    {"memory_per_gpu_bytes", 0.0},
                    {"fits", true},
                    {"tokens_per_s", 3.0},
                    {"error", ""}};
  const std::string csv = report::csv(sweep_columns({"cluster.nodes"}, json{row}), json{row});
  EXPECT_EQ(csv,
            "cluster.nodes,gpus,iter_s,tflops,bubble,mem_gib,fits,tokens_per_s,error\n"
            "64,512,10.0000,1.0,0.0,0.0,yes,3,\n");
}

TEST(PlanTables, SortOrdersByAnyColumnFailuresLast) {
  const json rows = {plan(8, 2.5, 150), plan(2, 3.5, 90, "failed: x"), plan(4, 2.0, 160), plan(1, 4.0, 80)};
  const auto columns = search_columns(rows, true);
  EXPECT_EQ(sorted_order(columns, rows, "tp", "--sort"), (std::vector<std::size_t>{3, 2, 0, 1}));
  EXPECT_EQ(sorted_order(columns, rows, "iter_s", "--sort"), (std::vector<std::size_t>{2, 0, 3, 1}));
  EXPECT_EQ(sorted_order(columns, rows, "TFLOP/s", "--sort"), (std::vector<std::size_t>{2, 0, 3, 1}));  // largest first
  EXPECT_EQ(sorted_order(columns, rows, "days", "--sort"), (std::vector<std::size_t>{0, 2, 3, 1}));     // none: kept
}

// --sort finishes (with --days): the plans that finish in time first, in their order, then those that do not, then
// the failed ones; known before any row has the column, so that the flag is checked before the work.
TEST(PlanTables, SortByFinishesPutsThePlansThatFinishFirst) {
  json rows = {plan(8, 2.5, 150), plan(2, 3.5, 90, "failed: x"), plan(4, 2.0, 160), plan(1, 4.0, 80)};
  rows[0]["finishes_in_days"] = false;
  rows[2]["finishes_in_days"] = true;
  rows[3]["finishes_in_days"] = true;
  EXPECT_EQ(sorted_order(search_columns(rows), rows, "finishes", "--sort"), (std::vector<std::size_t>{2, 3, 0, 1}));
  EXPECT_NO_THROW(sorted_order(search_columns(json::array(), true), json::array(), "finishes", "--sort"));
  const std::string csv = report::csv(search_columns(rows), rows);
  EXPECT_THAT(csv.substr(0, csv.find('\n')), HasSubstr(",finishes,error"));
  EXPECT_THAT(csv, HasSubstr(",no,\n"));
}

TEST(PlanTables, AnUnknownSortColumnIsRefusedByName) {
  try {
    sorted_order(search_columns(json::array(), true), json::array(), "speed", "--sort");
    FAIL() << "an unknown column was taken";
  } catch (const UserError& error) {
    EXPECT_THAT(error.what(), HasSubstr("--sort 'speed': no such column"));
    EXPECT_THAT(error.what(), HasSubstr("iter_s"));
  }
}

}  // namespace
}  // namespace twin::report

// `--days D` of twin sweep and twin search (issue 40, item 5): with --train-tokens, whether each variant or plan
// finishes within D days, and which does with the fewest GPUs. D is computed from the rows of a first run without
// --days, so no test hard-codes a simulated time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tests/cli/run_twin.hpp"

namespace {

#ifdef TWIN_HAVE_SIMGRID

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Result = twin::testing::ShellResult;

Result twin(const std::string& arguments) {
  return twin::testing::run_shell(std::string(TWIN_BINARY) + " " + arguments + " 2>&1");
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("twin-days-test-" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir / name;
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// GPT 1.3B on DGX A100 nodes: a second per iteration, so a sweep or a search of a few plans takes a second or two.
std::string small_scenario() {
  const fs::path path = scratch("gpt-1.3b.toml");
  std::ofstream(path) << "[model]\nname = \"gpt-1.3b\"\nlayers = 24\nhidden = 2048\nheads = 16\nseq_len = 2048\n"
                         "vocab = 50257\n[parallel]\ntp = 2\npp = 2\nglobal_batch = 32\nrecompute = \"full\"\n"
                         "[cluster]\nnodes = 2\nnode = \"dgx-a100\"\n";
  return path.string() + " --quiet --jobs 2 --train-tokens 10B";
}

// The sweep over 1, 2 and 4 nodes, with `flags`; its JSON document.
nlohmann::json sweep(const std::string& flags, Result* printed = nullptr) {
  const fs::path path = scratch("sweep.json");
  const Result r =
      twin("sweep " + small_scenario() + " --vary cluster.nodes=1,2,4 --json " + path.string() + " " + flags);
  EXPECT_EQ(r.status, 0) << r.output;
  if (printed) *printed = r;
  return read_json(path);
}

TEST(Days, SweepNamesTheFewestGpusThatFinish) {
  const nlohmann::json plain = sweep("")["variants"];
  ASSERT_EQ(plain.size(), 3u);
  const double one_node_days = plain[0]["training"]["days"].get<double>();
  const double two_node_days = plain[1]["training"]["days"].get<double>();
  ASSERT_GT(one_node_days, two_node_days);              // more GPUs train sooner here (data parallelism)
  EXPECT_FALSE(plain[0].contains("finishes_in_days"));  // not asked

  // Between the one-node and the two-node run: one node does not finish, two and four do, two is the answer.
  const double days = (one_node_days + two_node_days) / 2;
  Result printed;
  const fs::path csv = scratch("sweep.csv");
  const nlohmann::json answered = sweep(fmt::format("--days {} --csv {}", days, csv.string()), &printed);
  const nlohmann::json& variants = answered["variants"];
  EXPECT_FALSE(variants[0]["finishes_in_days"].get<bool>());
  EXPECT_TRUE(variants[1]["finishes_in_days"].get<bool>());
  EXPECT_TRUE(variants[2]["finishes_in_days"].get<bool>());
  ASSERT_TRUE(answered["fewest_gpus_within_days"].is_object());
  EXPECT_EQ(answered["fewest_gpus_within_days"]["set"]["cluster.nodes"], "2");
  EXPECT_EQ(answered["fewest_gpus_within_days"]["gpus"], variants[1]["gpus"]);
  EXPECT_THAT(printed.output, HasSubstr("finishes"));
  EXPECT_THAT(printed.output,
              HasSubstr(fmt::format("fewest GPUs that finish within {} days: cluster.nodes=2 (", days)));
  std::ifstream csv_in(csv);
  const std::string csv_text((std::istreambuf_iterator<char>(csv_in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(csv_text, HasSubstr(",finishes,"));
  EXPECT_THAT(csv_text, HasSubstr(",no,"));

  // Under the fastest: none finishes, and the line says how long the fastest takes.
  double fastest = one_node_days;
  for (const auto& v : plain) fastest = std::min(fastest, v["training"]["days"].get<double>());
  const nlohmann::json none = sweep(fmt::format("--days {}", fastest / 2), &printed);
  EXPECT_TRUE(none["fewest_gpus_within_days"].is_null());
  for (const auto& v : none["variants"]) EXPECT_FALSE(v["finishes_in_days"].get<bool>());
  EXPECT_THAT(printed.output,
              HasSubstr(fmt::format("none finishes in {} days; the fastest takes {:.3g} days", fastest / 2, fastest)));
}

TEST(Days, GoodputCountsTheDaysLostToFailures) {
  // Between the two-node run's days and its days with failures: it finishes only while failures are not counted.
  const nlohmann::json two_nodes = sweep("--goodput")["variants"][1]["training"];
  const double days = two_nodes["days"].get<double>(), with_failures = two_nodes["days_with_failures"].get<double>();
  ASSERT_LT(days, with_failures);
  const double deadline = (days + with_failures) / 2;
  EXPECT_TRUE(sweep(fmt::format("--days {}", deadline))["variants"][1]["finishes_in_days"].get<bool>());
  EXPECT_FALSE(sweep(fmt::format("--days {} --goodput", deadline))["variants"][1]["finishes_in_days"].get<bool>());
}

TEST(Days, SearchNamesThePlanThatFinishesOnTheFewestGpuHours) {
  // Every plan of a search has the scenario's 16 GPUs: among those that finish, the fewest GPU-hours win.
  const fs::path path = scratch("search.json");
  // 4 layers and 8 sequences: --max proves its plans the fastest, simulating more than it lists.
  const std::string search = "search " + small_scenario() +
                             " --set model.layers=4 --set parallel.global_batch=8 --max 3 --json " + path.string();
  ASSERT_EQ(twin(search).status, 0);
  const nlohmann::json plans = read_json(path)["plans"];
  ASSERT_EQ(plans.size(), 3u);
  double slowest = 0, fastest = 1e300, fewest_hours = 1e300;
  for (const auto& plan : plans) {
    slowest = std::max(slowest, plan["training"]["days"].get<double>());
    fastest = std::min(fastest, plan["training"]["days"].get<double>());
    fewest_hours = std::min(fewest_hours, plan["training"]["gpu_hours"].get<double>());
  }
  const Result r = twin(search + fmt::format(" --days {}", slowest));
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json answered = read_json(path);
  for (const auto& plan : answered["plans"]) EXPECT_TRUE(plan["finishes_in_days"].get<bool>());
  EXPECT_DOUBLE_EQ(answered["fewest_gpus_within_days"]["training"]["gpu_hours"].get<double>(), fewest_hours);
  EXPECT_THAT(r.output, HasSubstr("fewest GPUs that finish within"));
  EXPECT_THAT(r.output, HasSubstr("(16 GPUs, "));

  const Result none = twin(search + fmt::format(" --days {}", fastest / 2));
  ASSERT_EQ(none.status, 0) << none.output;
  EXPECT_TRUE(read_json(path)["fewest_gpus_within_days"].is_null());
  EXPECT_THAT(none.output, HasSubstr("none finishes in"));
}

TEST(Days, RefusedByNameWithoutATrainingRunOrAPositiveNumber) {
  const std::string scenario = scratch("gpt-1.3b.toml").string();
  small_scenario();  // writes it
  for (const std::string& command : {"sweep " + scenario + " --vary cluster.nodes=1,2", "search " + scenario}) {
    const Result untimed = twin(command + " --quiet --days 30");
    EXPECT_EQ(untimed.status, 2) << command;
    EXPECT_THAT(untimed.output, HasSubstr("twin: error: --days asks whether a training run finishes in time: give its "
                                          "length with --train-tokens"));
    for (const char* bad : {"0", "-3", "soon", "inf"}) {
      const Result refused = twin(command + " --quiet --train-tokens 1B --days " + bad);
      EXPECT_EQ(refused.status, 2) << command << " --days " << bad;
      EXPECT_THAT(refused.output, HasSubstr("twin: error: --days: must be a number of days above 0")) << bad;
    }
  }
}

#endif  // TWIN_HAVE_SIMGRID

}  // namespace

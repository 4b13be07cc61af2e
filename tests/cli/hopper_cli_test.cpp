// The Hopper and Blackwell commands as the README shows them: its two examples (an H100 run of MLPerf and a GB200
// NVL72 rack) line for line, the memory verdict of a plan that does not fit, and `twin search --vary-node`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/cli/run_twin.hpp"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using Result = twin::testing::ShellResult;

// Run from the source tree, as the README's commands are.
Result twin(const std::string& arguments) {
  return twin::testing::run_shell("cd '" + std::string(TWIN_SOURCE_DIR) + "' && " + std::string(TWIN_BINARY) + " " +
                                  arguments + " 2>&1");
}

// The lines the README prints under `$ twin COMMAND`, up to the block's "  ..." or its end.
std::vector<std::string> readme_example(const std::string& command) {
  std::ifstream readme(std::string(TWIN_SOURCE_DIR) + "/README.md");
  std::vector<std::string> lines;
  std::string line;
  bool inside = false;
  while (std::getline(readme, line)) {
    if (!inside) {
      inside = line == "$ twin " + command;
      continue;
    }
    if (line == "  ..." || line == "```") break;
    lines.push_back(line);
  }
  return lines;
}

void expect_readme_example(const std::string& command) {
  const std::vector<std::string> expected = readme_example(command);
  ASSERT_GE(expected.size(), 8u) << "README.md has no example `$ twin " << command << "`";
  const Result r = twin(command + " --quiet");
  ASSERT_EQ(r.status, 0) << r.output;
  std::istringstream printed(r.output);
  std::string line;
  for (const std::string& want : expected) {
    ASSERT_TRUE(std::getline(printed, line)) << "twin printed fewer lines than the README: " << want;
    EXPECT_EQ(line, want);
  }
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("twin-hopper-cli-" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir / name;
}

#ifdef TWIN_HAVE_SIMGRID
TEST(HopperCli, TheReadmesH100Example) { expect_readme_example("sim scenarios/published/mlperf-gpt3-175b-h100.toml"); }

TEST(HopperCli, TheReadmesGb200Nvl72Example) { expect_readme_example("sim llama3-70b-gb200"); }
#endif

// Llama 3 405B at 128K tokens without context parallelism (the paper splits it with CP 16): the verdict gives the
// figure.
TEST(HopperCli, APlanThatDoesNotFitSaysByHowMuch) {
  const Result r = twin("graph scenarios/published/llama3-405b-meta.toml --set model.seq_len=131072 "
                        "--set parallel.global_batch=128 --set cluster.nodes=16");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::ContainsRegex("fits +NO \\(peak [0-9]+\\.[0-9] GiB of 80\\.0 GiB\\)"));
}

#ifdef TWIN_HAVE_SIMGRID
// --vary-node: each node kind with the scenario's GPUs in whole nodes (GB200 NVL72: one rack of 72).
TEST(HopperCli, SearchVariesTheNode) {
  const fs::path json_path = scratch("search.json");
  const Result r = twin("search llama3-70b-gb200 --vary-node dgx-h100,dgx-h200,gb200-nvl72 --max 6 --jobs 2 --quiet "
                        "--set model.layers=8 --set parallel.global_batch=72 --json " + json_path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("on 72 GPUs of 9 x dgx-h100, 9 x dgx-h200, 1 x gb200-nvl72"));
  const nlohmann::json plans = nlohmann::json::parse(std::ifstream(json_path))["plans"];
  std::set<std::string> nodes;
  for (const auto& plan : plans) {
    nodes.insert(plan["node"].get<std::string>());
    EXPECT_EQ(plan["nodes"].get<int>() * (plan["node"] == "gb200-nvl72" ? 72 : 8), 72);
    EXPECT_EQ(plan["error"], "") << plan.dump();
  }
  // --max 6 shows the 6 fastest plans of the three kinds (before branch and bound, the first 6 by ideal bubble, taken
  // from each kind in turn): the fastest may all be of one kind; every kind's plans were enumerated and bounded.
  EXPECT_GE(nodes.size(), 1u) << plans.dump();
  const nlohmann::json document = nlohmann::json::parse(std::ifstream(json_path));
  EXPECT_EQ(document["plans_enumerated"].get<int>(),
            document["plans_pruned_rules"].get<int>() + document["plans_pruned_memory"].get<int>() +
                document["plans_pruned_bound"].get<int>() + document["plans_simulated"].get<int>());
  const Result bad = twin("search llama3-70b-gb200 --vary-node dgx-h100,dgx-h9000 --quiet");
  EXPECT_EQ(bad.status, 2) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("twin: error:"));
  EXPECT_THAT(bad.output, HasSubstr("dgx-h9000"));
  const Result uneven = twin("search gpt3-175b --vary-node gb200-nvl72 --quiet");  // 1024 GPUs: not racks of 72
  EXPECT_EQ(uneven.status, 2) << uneven.output;
  EXPECT_THAT(uneven.output, HasSubstr("twin: error: --vary-node gb200-nvl72: the scenario's 1024 GPUs do not fill "
                                       "whole nodes of 72 GPUs"));
}
#endif

}  // namespace

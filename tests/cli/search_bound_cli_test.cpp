// `twin search` by branch and bound: the plans are simulated in order of a lower bound on their iteration time until
// the bound proves the --max fastest. The rows it shows are the fastest rows of --all (which fails if the bound ever
// exceeds a plan's simulated time), and its counts add up in the JSON and on stdout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/run_twin.hpp"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

#ifdef TWIN_HAVE_SIMGRID

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("twin-search-bound-test-" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir / name;
}

// A wide GPT (2 layers of h = 8192) on the 8 GPUs of one DGX A100 node: 19 plans fit, each simulated in a fraction of
// a second, and large GEMMs, so that the bound (half the simulated time or more) spares some.
std::string wide_scenario() {
  const fs::path path = scratch("gpt-wide.toml");
  std::ofstream(path) << "[model]\nname = \"gpt-wide\"\nlayers = 2\nhidden = 8192\nheads = 64\nseq_len = 1024\n"
                         "vocab = 32000\n[parallel]\ntp = 1\npp = 1\nglobal_batch = 8\n"
                         "[cluster]\nnodes = 1\nnode = \"dgx-a100\"\n";
  return path.string();
}

struct Searched {
  twin::testing::ShellResult result;
  nlohmann::json document;
};

Searched search(const std::string& flags, const std::string& name, int jobs = 2) {
  const fs::path json = scratch(name);
  Searched out;
  out.result = twin::testing::run_shell(std::string(TWIN_BINARY) + " search " + wide_scenario() + " --jobs " +
                                        std::to_string(jobs) + " --quiet --json " + json.string() + " " + flags +
                                        " 2>&1");
  std::ifstream in(json);
  if (in) out.document = nlohmann::json::parse(in);
  return out;
}

std::string row_key(const nlohmann::json& row) {
  return row.at("tp").dump() + " " + row.at("pp").dump() + " " + row.at("micro_batch").dump() + " " +
         row.at("schedule").get<std::string>() + " " + row.at("virtual_stages").dump() + " " +
         row.at("recompute").get<std::string>() + " " + row.at("recompute_num_layers").dump();
}

// --max 3 with one job and with three: a batch's plans past the bound's stop are dropped, so the document is the same
// byte for byte, whatever the batch.
TEST(SearchBound, ThePrunedSearchShowsTheFastestRowsOfAllWhateverTheJobs) {
  const Searched all = search("--all", "all.json");
  ASSERT_EQ(all.result.status, 0) << all.result.output;
  const Searched pruned = search("--max 3", "pruned.json", 1);
  ASSERT_EQ(pruned.result.status, 0) << pruned.result.output;
  const Searched three_jobs = search("--max 3", "pruned-3.json", 3);
  ASSERT_EQ(three_jobs.result.status, 0) << three_jobs.result.output;
  EXPECT_EQ(three_jobs.document.dump(), pruned.document.dump());
  const nlohmann::json& every = all.document.at("plans");
  const nlohmann::json& best = pruned.document.at("plans");
  ASSERT_EQ(best.size(), 3u);
  ASSERT_GT(every.size(), 10u);
  for (std::size_t i = 0; i < best.size(); ++i) {
    EXPECT_EQ(row_key(best[i]), row_key(every[i])) << "row " << i;
    EXPECT_EQ(best[i].at("iteration_time_s"), every[i].at("iteration_time_s")) << "row " << i;
  }
  // Every plan's bound lies under its simulated time (the property the pruning rests on).
  for (const nlohmann::json& row : every) {
    EXPECT_GT(row.at("iteration_time_bound_s").get<double>(), 0);
    EXPECT_LE(row.at("iteration_time_bound_s").get<double>(), row.at("iteration_time_s").get<double>());
  }
  // --all simulates every plan that fits; the bound spared some here.
  EXPECT_EQ(all.document.at("plans_simulated"), all.document.at("plans_that_fit"));
  EXPECT_EQ(all.document.at("plans_pruned_bound"), 0);
  EXPECT_GT(pruned.document.at("plans_pruned_bound").get<int>(), 0);
  EXPECT_LT(pruned.document.at("plans_simulated").get<int>(), all.document.at("plans_simulated").get<int>());
}

TEST(SearchBound, TheCountsAddUpInTheJsonAndOnStdout) {
  const Searched pruned = search("--max 2 --memory-headroom 60", "counts.json");
  ASSERT_EQ(pruned.result.status, 0) << pruned.result.output;
  const nlohmann::json& d = pruned.document;
  for (const char* key : {"plans_enumerated", "plans_pruned_rules", "plans_pruned_memory", "plans_pruned_bound",
                          "plans_simulated", "plans_that_fit", "rejected_for_memory"}) {
    ASSERT_TRUE(d.contains(key)) << key;
  }
  const int enumerated = d.at("plans_enumerated").get<int>();
  EXPECT_EQ(enumerated, d.at("plans_pruned_rules").get<int>() + d.at("plans_pruned_memory").get<int>() +
                            d.at("plans_pruned_bound").get<int>() + d.at("plans_simulated").get<int>());
  EXPECT_EQ(d.at("plans_that_fit").get<int>(),
            d.at("plans_pruned_bound").get<int>() + d.at("plans_simulated").get<int>());
  EXPECT_EQ(d.at("rejected_for_memory"), d.at("plans_pruned_memory"));
  EXPECT_GT(d.at("plans_pruned_memory").get<int>(), 0);  // 60 GiB of headroom leaves some plans out
  EXPECT_GT(d.at("plans_pruned_rules").get<int>(), 0);   // micro-batches that do not divide the batch, ...
  EXPECT_THAT(pruned.result.output,
              HasSubstr(std::to_string(enumerated) + " plans enumerated, " + d.at("plans_pruned_rules").dump() +
                        " invalid, " + d.at("plans_pruned_memory").dump() + " over memory, " +
                        d.at("plans_pruned_bound").dump() + " pruned by the bound, " +
                        d.at("plans_simulated").dump() + " simulated"));
}

#endif

}  // namespace

// `twin search` and `twin sweep` under mpirun: the variants spread over 3 ranks (on this machine's 2 cores, hence
// --oversubscribe), rank 0 prints and writes exactly what one process does, and a rank that fails or is killed is
// named while the other ranks' rows are kept.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/run_twin.hpp"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

#if defined(TWIN_HAVE_SIMGRID) && defined(TWIN_HAVE_RUN_COMMAND)

fs::path scratch_dir() {
  return fs::temp_directory_path() / ("twin-mpi-cli-test-" + std::to_string(getpid()));
}

fs::path scratch(const std::string& name) {
  fs::create_directories(scratch_dir());
  return scratch_dir() / name;
}

struct RemoveScratch : ::testing::Environment {
  void TearDown() override { fs::remove_all(scratch_dir()); }
};
const auto* const kRemoveScratch = ::testing::AddGlobalTestEnvironment(new RemoveScratch);

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The small GPT of cli_test.cpp: a 1.3B model on two DGX A100 nodes, a fraction of a second per simulation.
std::string small_scenario() {
  const fs::path path = scratch("gpt-1.3b.toml");
  std::ofstream(path) << "[model]\nname = \"gpt-1.3b\"\nlayers = 24\nhidden = 2048\nheads = 16\nseq_len = 2048\n"
                         "vocab = 50257\n[parallel]\ntp = 2\npp = 2\nglobal_batch = 32\nrecompute = \"full\"\n"
                         "[cluster]\nnodes = 2\nnode = \"dgx-a100\"\n";
  return path.string();
}

bool have_mpirun() {
  return twin::testing::run_shell("command -v mpirun >/dev/null 2>&1").status == 0;
}

// `twin ARGUMENTS`, alone (`ranks` 0) or under mpirun with that many ranks; stdout into `out`, stderr returned.
twin::testing::ShellResult twin(const std::string& arguments, int ranks, const fs::path& out,
                                const std::string& environment = "", const std::string& mpirun_flags = "") {
  std::string launcher;
  if (ranks > 0) {
    launcher = "mpirun -n " + std::to_string(ranks) + " --oversubscribe --bind-to none " + mpirun_flags +
               (geteuid() == 0 ? " --allow-run-as-root " : " ");
    if (!environment.empty()) launcher += "-x " + environment.substr(0, environment.find('=')) + " ";
  }
  return twin::testing::run_shell(environment + " " + launcher + TWIN_BINARY + " " + arguments + " 2>&1 >" +
                                  out.string());
}

// Six variants: rank r of 3 simulates variants r and r + 3, in that order (one at a time).
const std::string kSweep = " --vary parallel.pp=1,2,4 --vary parallel.micro_batch=1,2 --jobs 1 --quiet --json ";

TEST(MpiCli, SearchUnderMpirunWritesWhatOneProcessWrites) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (apt install openmpi-bin)";
  const std::string search =
      "search " + small_scenario() + " --set model.layers=4 --set parallel.global_batch=8 --max 5 --quiet --json ";
  const auto one = twin(search + scratch("one.json").string(), 0, scratch("one.out"));
  ASSERT_EQ(one.status, 0) << one.output;
  const auto three = twin(search + scratch("three.json").string(), 3, scratch("three.out"));
  ASSERT_EQ(three.status, 0) << three.output;
  EXPECT_EQ(read_text(scratch("three.json")), read_text(scratch("one.json")));  // byte for byte
  EXPECT_EQ(read_text(scratch("three.out")), read_text(scratch("one.out")));    // printed once, by rank 0
  EXPECT_EQ(nlohmann::json::parse(read_text(scratch("one.json")))["plans"].size(), 5u);
}

TEST(MpiCli, SweepUnderMpirunWritesWhatOneProcessWrites) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (apt install openmpi-bin)";
  const auto one = twin("sweep " + small_scenario() + kSweep + scratch("one.json").string(), 0, scratch("one.out"));
  ASSERT_EQ(one.status, 0) << one.output;
  const auto three =
      twin("sweep " + small_scenario() + kSweep + scratch("three.json").string(), 3, scratch("three.out"));
  ASSERT_EQ(three.status, 0) << three.output;
  EXPECT_EQ(read_text(scratch("three.json")), read_text(scratch("one.json")));
  EXPECT_EQ(read_text(scratch("three.out")), read_text(scratch("one.out")));
}

// The variants of `failed_rank` it had not reported fail naming it; every other variant is one process's.
void expect_rank_named(const std::string& fault, int failed_rank, const std::string& mpirun_flags,
                       const std::string& why) {
  const auto one = twin("sweep " + small_scenario() + kSweep + scratch("one.json").string(), 0, scratch("one.out"));
  ASSERT_EQ(one.status, 0) << one.output;
  const auto three = twin("sweep " + small_scenario() + kSweep + scratch("three.json").string(), 3,
                          scratch("three.out"), "TWIN_SEARCH_FAULT=" + fault, mpirun_flags);
  ASSERT_EQ(three.status, 0) << three.output;  // some variants succeeded: a sweep with failed rows
  EXPECT_THAT(three.output, HasSubstr("twin: warning: rank " + std::to_string(failed_rank) + " of 3 " + why));
  const auto alone = nlohmann::json::parse(read_text(scratch("one.json")))["variants"];
  const auto spread = nlohmann::json::parse(read_text(scratch("three.json")))["variants"];
  ASSERT_EQ(spread.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    if (i == failed_rank + 3) {  // its second variant: the fault strikes after its first outcome left
      EXPECT_THAT(spread[i]["error"].get<std::string>(), HasSubstr("rank " + std::to_string(failed_rank) + " " + why));
      EXPECT_EQ(spread[i]["iteration_time_s"], 0.0);
    } else {
      EXPECT_EQ(spread[i], alone[i]) << "variant " << i;
    }
  }
}

TEST(MpiCli, ARankThatFailsIsNamedAndTheOthersRowsAreKept) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (apt install openmpi-bin)";
  expect_rank_named("throw:rank=2", 2, "", "failed: failed on purpose");
}

// A rank killed outright: mpirun's --enable-recovery keeps the others running (by default mpirun ends the whole job,
// naming the rank itself); rank 0 hears nothing from it for kSilentRankS (10 s) and names it.
TEST(MpiCli, ARankKilledIsNamedAndTheOthersRowsAreKept) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (apt install openmpi-bin)";
  expect_rank_named("kill:rank=1", 1, "--enable-recovery", "fell silent");
}

#endif

}  // namespace

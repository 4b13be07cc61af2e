// `twin goodput`, and `--goodput` and the degradation flags of sim, search and sweep, as a user runs them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/run_twin.hpp"

namespace {

// `twin goodput` is built with the simulator (it simulates the iteration unless given one), as sim, search, sweep.
#ifdef TWIN_HAVE_SIMGRID

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using Result = twin::testing::ShellResult;

Result twin(const std::string& arguments) {
  return twin::testing::run_shell(std::string(TWIN_BINARY) + " " + arguments + " 2>&1");
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("twin-goodput-test-" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir / name;
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

const std::string kOneGpu = "gpt-350m-h200 --quiet";
const std::string kLlama3At16k =
    std::string(TWIN_SOURCE_DIR) + "/scenarios/published/llama3-405b-meta.toml --set cluster.nodes=2048 --quiet";

// The paper's 419 unexpected interruptions in 54 days on 16,384 H100 (arXiv:2407.21783, sec. 3.3.4).
TEST(GoodputCli, Llama3At16kGpusPredictsThePapersInterruptionsPerDay) {
  const fs::path json = scratch("llama3.json");
  const Result r =
      twin("goodput " + kLlama3At16k + " --iteration-time 10 --train-tokens 15.6T --json " + json.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("interruptions per day"));
  const nlohmann::json g = read_json(json);
  const double per_day = g.at("failures_per_day").get<double>();
  EXPECT_GT(per_day, 419.0 / 54 / 1.5);
  EXPECT_LT(per_day, 419.0 / 54 * 1.5);
  const double goodput = g.at("goodput_fraction").get<double>();
  EXPECT_GT(goodput, 0.5);
  EXPECT_LT(goodput, 1.0);
  EXPECT_GT(g.at("optimal_checkpoint_interval_s").get<double>(), 10);
  // 15.6 T tokens of 16 M per iteration at 10 s: 11.3 days without failures, that over the goodput with them
  const double days = std::ceil(15.6e12 / (2048.0 * 8192)) * 10 / 86400;
  EXPECT_NEAR(g.at("training_days_with_failures").get<double>(), days / goodput, 1e-6 * days);
  EXPECT_EQ(g.at("gpus").get<int>(), 16384);
}

TEST(GoodputCli, MonteCarloAgreesWithTheClosedFormAndKnobsMoveIt) {
  const fs::path json = scratch("mc.json");
  const Result r =
      twin("goodput " + kLlama3At16k + " --iteration-time 10 --monte-carlo 100 --seed 3 --json " + json.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json g = read_json(json);
  const nlohmann::json& mc = g.at("monte_carlo");
  // 30 days of training a run, not a whole number of intervals: the last partial one moves the mean by well under
  // 0.1 % of a 30-day run; the interval is the 95 % one.
  EXPECT_NEAR(mc.at("goodput_fraction").get<double>(), g.at("goodput_fraction").get<double>(),
              mc.at("confidence95").get<double>() + 0.001);
  EXPECT_GT(mc.at("failures_mean").get<double>(), 100);
  // a given interval far from the optimum, asynchronous against blocking saving: each moves it (the failure
  // rates, storage and restart keys: tests/model/program/goodput_test.cpp)
  const auto goodput_with = [&](const std::string& extra) {
    const Result one = twin("goodput " + kLlama3At16k + " --iteration-time 10 --json " + json.string() + " " + extra);
    EXPECT_EQ(one.status, 0) << one.output;
    return read_json(json).at("goodput_fraction").get<double>();
  };
  const double base = g.at("goodput_fraction").get<double>();
  EXPECT_LT(goodput_with("--checkpoint-interval 36000"), base);
  EXPECT_GT(goodput_with("--set framework.async_checkpoint=true"), base);
}

TEST(GoodputCli, BadInputIsOneLineNamingIt) {
  Result r = twin("goodput " + kOneGpu + " --iteration-time 10 --set cluster.restart_s=-1");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("twin: error:"));
  EXPECT_THAT(r.output, HasSubstr("cluster.restart_s"));
  r = twin("goodput " + kOneGpu + " --iteration-time 10 --checkpoint-interval 5");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--checkpoint-interval"));
  EXPECT_THAT(r.output, HasSubstr("one iteration"));
  r = twin("goodput " + kOneGpu + " --iteration-time 10 --set cluster.gpu_failures_per_gpu_hour=2");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("cluster.gpu_failures_per_gpu_hour"));
}

TEST(GoodputCli, SimWithASlowGpuReportsWhereTheTimeWent) {
  const fs::path json = scratch("slow.json");
  Result r = twin("sim " + kOneGpu + " --slow-gpu 0:1.5 --json " + json.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("degraded: iteration"));
  EXPECT_THAT(r.output, HasSubstr("stage 0 (rank 0): its own compute"));
  const nlohmann::json s = read_json(json);
  EXPECT_GT(s.at("iteration_time_s").get<double>(),
            1.3 * s.at("degraded").at("healthy_iteration_time_s").get<double>());
  r = twin("sim " + kOneGpu + " --slow-gpu 5:2");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--slow-gpu: rank 5 is past the job's 1 ranks"));
}

TEST(GoodputCli, SweepAndSimCountFailuresInTheirTrainingDays) {
  const fs::path json = scratch("sweep.json");
  const Result r = twin("sweep " + kOneGpu + " --vary cluster.restart_s=60,6000 --goodput --train-tokens 1B --json " +
                        json.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("most useful tokens per second"));
  const nlohmann::json variants = read_json(json).at("variants");
  ASSERT_EQ(variants.size(), 2u);
  const double quick = variants[0].at("goodput").at("goodput_fraction").get<double>();
  EXPECT_GT(quick, variants[1].at("goodput").at("goodput_fraction").get<double>());
  const nlohmann::json& training = variants[0].at("training");
  EXPECT_NEAR(training.at("days_with_failures").get<double>(), training.at("days").get<double>() / quick,
              1e-9 * training.at("days").get<double>());
}

TEST(GoodputCli, SearchRanksPlansByIterationTimeOverGoodput) {
  const fs::path json = scratch("search.json");
  const Result r = twin("search " + kOneGpu + " --goodput --max 2 --jobs 2 --json " + json.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("most useful work per wall-clock second first"));
  const nlohmann::json plans = read_json(json).at("plans");
  ASSERT_GE(plans.size(), 2u);
  double previous = 0;
  for (const nlohmann::json& plan : plans) {
    const double effective =
        plan.at("iteration_time_s").get<double>() / plan.at("goodput").at("goodput_fraction").get<double>();
    EXPECT_GE(effective, previous);
    previous = effective;
  }
}
#endif

}  // namespace

// What `twin sim` says beside its prediction about how far to trust it: the error band of the published runs like its
// plan, and notes on keys that change nothing on this plan (issue 45).
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
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/cli/run_twin.hpp"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

using Result = twin::testing::ShellResult;

// Run from the source tree, as the README's commands are.
Result twin(const std::string& arguments) {
  return twin::testing::run_shell("cd '" + std::string(TWIN_SOURCE_DIR) + "' && " + std::string(TWIN_BINARY) + " " +
                                  arguments + " 2>&1");
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("twin-accuracy-cli-" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir / name;
}

// The iteration time `twin <arguments>` predicts, read from its JSON (a scratch file `name`); NaN, and a failure, when
// it does not run.
double iteration_s(const std::string& arguments, const std::string& name) {
  const fs::path json_path = scratch(name);
  const Result r = twin(arguments + " --json " + json_path.string());
  EXPECT_EQ(r.status, 0) << arguments << "\n" << r.output;
  if (r.status != 0) return std::nan("");
  const double t = read_json(json_path)["iteration_time_s"].get<double>();
  fs::remove(json_path);
  return t;
}

// Mixtral's plan drops tokens past a capacity factor of 1.0: a skewed router changes nothing, and twin says so; without
// the cap (dropless) the same skew slows the plan and no note is printed. A smaller global batch keeps it quick.
TEST(AccuracyCli, SimSaysWhenACapacityFactorCapsTheExpertSkew) {
  const std::string base =
      "sim scenarios/mixtral-8x7b.toml --set parallel.global_batch=64 --set model.expert_load_skew=1";
  const fs::path capped_json = scratch("capped.json"), dropless_json = scratch("dropless.json");
  const Result capped = twin(base + " --json " + capped_json.string());
  ASSERT_EQ(capped.status, 0) << capped.output;
  EXPECT_THAT(capped.output, HasSubstr("note: model.expert_load_skew = 1 does not change this prediction: "
                                       "model.capacity_factor = 1 caps"));
  const nlohmann::json notes = read_json(capped_json)["notes"];
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_THAT(notes[0].get<std::string>(), HasSubstr("model.expert_load_skew"));

  const Result dropless = twin(base + " --set model.capacity_factor=0 --json " + dropless_json.string());
  ASSERT_EQ(dropless.status, 0) << dropless.output;
  EXPECT_THAT(dropless.output, Not(HasSubstr("expert_load_skew = 1 does not change")));
  EXPECT_TRUE(read_json(dropless_json)["notes"].empty());
  EXPECT_GT(read_json(dropless_json)["iteration_time_s"].get<double>(),
            read_json(capped_json)["iteration_time_s"].get<double>());
  fs::remove_all(capped_json.parent_path());
}

// Megatron-Core's --moe-pad-expert-input-to-capacity is model.pad_to_capacity: the drop-and-pad dispatch without the
// split-size sync (tests/sim/pad_to_capacity_test.cpp); without a capacity factor it is refused by name.
TEST(AccuracyCli, PaddingToCapacityIsMegatronsFlagAndNeedsACapacity) {
  const std::string base = "sim scenarios/mixtral-8x7b.toml --set parallel.global_batch=64 --quiet";
  const double flag = iteration_s(base + " --moe-pad-expert-input-to-capacity", "pad-flag.json");
  EXPECT_EQ(flag, iteration_s(base + " --set model.pad_to_capacity=true", "pad-key.json"));
  EXPECT_NE(flag, iteration_s(base, "pad-none.json"));
  const Result dropless = twin(base + " --set model.capacity_factor=0 --moe-pad-expert-input-to-capacity");
  EXPECT_EQ(dropless.status, 2);
  EXPECT_THAT(dropless.output, HasSubstr("twin: error:"));
  EXPECT_THAT(dropless.output, HasSubstr("model.pad_to_capacity pads every expert to its capacity: it needs "
                                         "model.capacity_factor > 0"));
}

// Megatron-Core's --moe-token-dispatcher-type sets framework.moe_dispatcher: flex sends fewer bytes than alltoall on
// Mixtral at EP 4 (two experts a rank: a token that picks both crosses once where the all-to-all sends it twice; at
// EP 8, one expert a rank, the two send the same), and a dispatcher twin does not model is refused by name.
TEST(AccuracyCli, TheTokenDispatcherIsMegatronsFlag) {
  const std::string base =
      "sim scenarios/mixtral-8x7b.toml --set parallel.global_batch=64 --set model.capacity_factor=0 "
      "--set parallel.ep=4 --quiet";
  const double flag = iteration_s(base + " --moe-token-dispatcher-type flex", "flex-flag.json");
  EXPECT_EQ(flag, iteration_s(base + " --set framework.moe_dispatcher=flex", "flex-key.json"));
  EXPECT_LT(flag, iteration_s(base + " --moe-token-dispatcher-type alltoall", "flex-none.json"));
  // At EP 8, one expert a rank in one node, the two send the same, and twin says so.
  const Result ep8 =
      twin("sim scenarios/mixtral-8x7b.toml --set parallel.global_batch=64 --moe-token-dispatcher-type flex");
  ASSERT_EQ(ep8.status, 0) << ep8.output;
  EXPECT_THAT(ep8.output, HasSubstr("note: framework.moe_dispatcher = \"flex\" does not change this prediction: it "
                                    "sends what the all-to-all dispatcher does here (model.experts = 8 over "
                                    "parallel.ep = 8"));
  const Result ep1 = twin(
      "sim scenarios/mixtral-8x7b.toml --set parallel.global_batch=64 --set parallel.ep=1 --moe-token-dispatcher-type "
      "flex");
  ASSERT_EQ(ep1.status, 0) << ep1.output;
  EXPECT_THAT(ep1.output, HasSubstr("note: framework.moe_dispatcher = \"flex\" does not change this prediction: "
                                    "parallel.ep = 1 exchanges no tokens"));
  const Result allgather = twin(base + " --moe-token-dispatcher-type allgather");
  EXPECT_EQ(allgather.status, 2);
  EXPECT_THAT(allgather.output, HasSubstr("twin: error:"));
  EXPECT_THAT(allgather.output, HasSubstr("--moe-token-dispatcher-type"));
}

// framework.cp_comm chooses how CP ranks exchange keys and values; at cp 1 there is none, and twin says so.
TEST(AccuracyCli, SimSaysWhenTheCpExchangeHasNothingToExchange) {
  const fs::path json_path = scratch("cp1.json");
  const Result sim =
      twin("sim scenarios/gpt-350m-h200.toml --set 'framework.cp_comm=\"all_gather\"' --json " + json_path.string());
  ASSERT_EQ(sim.status, 0) << sim.output;
  EXPECT_THAT(sim.output, HasSubstr("note: framework.cp_comm = \"all_gather\" does not change this prediction: "
                                    "parallel.cp = 1"));
  EXPECT_EQ(read_json(json_path)["notes"].size(), 1u);
  const Result cp2 = twin(
      "sim scenarios/gpt-350m-h200.toml --set parallel.cp=2 --set cluster.gpus_per_node=2 "
      "--set 'framework.cp_comm=\"all_gather\"' --set 'framework.attention=\"flash2\"'");
  ASSERT_EQ(cp2.status, 0) << cp2.output;
  EXPECT_THAT(cp2.output, Not(HasSubstr("note: framework.cp_comm")));
}

// The band of bench/accuracy/bands.json with this key, or null.
nlohmann::json band_of(const std::string& generation, const std::string& kind, const std::string& precision) {
  const nlohmann::json bands = read_json(fs::path(TWIN_SOURCE_DIR) / "bench/accuracy/bands.json");
  for (const nlohmann::json& band : bands["bands"]) {
    if (band["generation"] == generation && band["kind"] == kind && band["precision"] == precision) return band;
  }
  return nullptr;
}

// Beside the iteration time, the band: T / (1 + the band's highest error) to T / (1 + its lowest), the published runs
// of the plan's GPU generation, dense or MoE, and precision; none when there are no such runs. The plans: GPT-tiny
// on one A100 (dense, bf16), an H200 dense one (and the same on A100s with --gpu), and Mixtral on A100 (no A100 MoE
// runs were published in the set).
TEST(AccuracyCli, SimPrintsTheBandBesideTheIterationTime) {
  struct Case {
    std::string arguments, generation, kind, precision;
  };
  const std::vector<Case> cases = {
      {"sim scenarios/gpt-tiny.toml --set cluster.node=dgx-a100 --set cluster.gpus_per_node=1 --set model.dtype=bf16",
       "ampere", "dense", "bf16"},
      {"sim scenarios/gpt-350m-h200.toml", "hopper", "dense", "bf16"},
      // the GPU simulated, not the scenario's: an H200 plan on A100s takes the A100 runs' band
      {"sim scenarios/gpt-350m-h200.toml --gpu a100", "ampere", "dense", "bf16"},
      {"sim scenarios/mixtral-8x7b.toml --set parallel.global_batch=64 --set cluster.node=dgx-a100", "ampere", "moe",
       "bf16"}};
  for (const Case& c : cases) {
    const fs::path json_path = scratch("band.json");
    const Result sim = twin(c.arguments + " --json " + json_path.string());
    ASSERT_EQ(sim.status, 0) << sim.output;
    // The line right after the iteration time.
    const auto iteration = sim.output.find("  iteration time");
    ASSERT_NE(iteration, std::string::npos) << sim.output;
    const std::string next = sim.output.substr(sim.output.find('\n', iteration) + 1, 8);
    EXPECT_EQ(next, "  band: ") << sim.output;
    const nlohmann::json summary = read_json(json_path);
    ASSERT_TRUE(summary.contains("iteration_time_band_s")) << c.arguments;
    const nlohmann::json& source = summary["band_source"];
    EXPECT_EQ(source["generation"], c.generation);
    EXPECT_EQ(source["kind"], c.kind);
    EXPECT_EQ(source["precision"], c.precision);
    const nlohmann::json band = band_of(c.generation, c.kind, c.precision);
    if (band.is_null()) {
      EXPECT_TRUE(summary["iteration_time_band_s"].is_null());
      EXPECT_TRUE(source["runs"].empty());
      EXPECT_THAT(sim.output,
                  HasSubstr("band: none (no published runs of " + c.generation + " " + c.kind + " " + c.precision));
      continue;
    }
    const double t = summary["iteration_time_s"].get<double>();
    const auto range = summary["iteration_time_band_s"];
    ASSERT_EQ(range.size(), 2u);
    EXPECT_NEAR(range[0].get<double>(), t / (1 + band["error_high"].get<double>()), 1e-9 * t);
    EXPECT_NEAR(range[1].get<double>(), t / (1 + band["error_low"].get<double>()), 1e-9 * t);
    EXPECT_EQ(source["runs"].size(), band["runs"].size());
    EXPECT_THAT(sim.output, HasSubstr("(published runs: " + std::to_string(band["runs"].size()) + " of " +
                                      c.generation + " " + c.kind + " " + c.precision));
  }
}

}  // namespace

// What `twin sim` says beside its prediction about how far to trust it: notes on keys that change nothing on this
// plan (issue 45).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int status = -1;
  std::string output;  // stdout and stderr
};

// Run from the source tree, as the README's commands are.
Result twin(const std::string& arguments) {
  Result result;
  const std::string command =
      "cd '" + std::string(TWIN_SOURCE_DIR) + "' && " + std::string(TWIN_BINARY) + " " + arguments + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe.get())) result.output += buffer.data();
  const int status = pclose(pipe.release());
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
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

// Mixtral's plan drops tokens past a capacity factor of 1.0: a skewed router changes nothing, and twin says so; without
// the cap (dropless) the same skew slows the plan and no note is printed. A smaller global batch keeps it quick.
TEST(AccuracyCli, SimSaysWhenACapacityFactorCapsTheExpertSkew) {
  const std::string base = "sim scenarios/mixtral-8x7b.toml --set parallel.global_batch=64 --set model.expert_load_skew=1";
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

}  // namespace

// Every command's --help ends with two examples (cli/examples.cpp), and each example is one the command takes: its
// flags are the command's own, its scenario one that ships. A renamed flag or scenario fails here, not in a reader's
// terminal.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/run_twin.hpp"

namespace {

std::vector<std::string> commands() {
  std::vector<std::string> names = {"graph", "compare", "calibrate", "report"};
#ifdef TWIN_HAVE_SIMGRID
  for (const char* name : {"sim", "search", "sweep", "goodput"}) names.emplace_back(name);
#endif
#ifdef TWIN_HAVE_RUN_COMMAND
  names.emplace_back("run");
#endif
  return names;
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string word; in >> word;) out.push_back(word);
  return out;
}

TEST(CliHelp, EveryCommandShowsTwoExamplesItTakes) {
  for (const std::string& command : commands()) {
    SCOPED_TRACE(command);
    const auto help = twin::testing::run_shell(std::string(TWIN_BINARY) + " " + command + " --help 2>&1");
    ASSERT_EQ(help.status, 0) << help.output;
    const auto at = help.output.find("\nExamples:\n");
    ASSERT_NE(at, std::string::npos) << help.output;
    std::istringstream lines(help.output.substr(at + 11));
    int examples = 0;
    for (std::string line; std::getline(lines, line);) {
      const std::vector<std::string> w = words(line);
      if (w.size() < 3 || w[0] != "twin" || w[1] != command) continue;
      ++examples;
      for (const std::string& word : w) {
        if (word.rfind("--", 0) != 0) continue;
        const std::string flag = word.substr(0, word.find('='));
        EXPECT_THAT(help.output.substr(0, at), ::testing::HasSubstr(flag + " ")) << line;
      }
      // The second word is a shipped scenario's name, or a file the reader brings (it has an extension).
      if (w[2].find('.') == std::string::npos) {
        EXPECT_TRUE(std::filesystem::exists(std::string(TWIN_SOURCE_DIR) + "/scenarios/" + w[2] + ".toml")) << line;
      }
    }
    EXPECT_EQ(examples, 2) << help.output.substr(at);
  }
}

}  // namespace

// The one mapping of errors to what `twin` prints and exits with (model/scenario/errors.hpp).
#include <gtest/gtest.h>

#include <stdexcept>

#include "model/scenario/errors.hpp"
#include "model/scenario/scenario.hpp"

namespace twin {
namespace {

TEST(Errors, AUserErrorPrintsEveryProblemAndExitsTwo) {
  const model::ScenarioError error(std::vector<std::string>{"a.toml: model.layers must be a positive integer, got 0",
                                                            "a.toml: parallel.tp must be a positive integer, got 0"});
  EXPECT_EQ(exit_status(error), kExitUsage);
  const auto lines = error_lines(error);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "error: a.toml: model.layers must be a positive integer, got 0");
  EXPECT_EQ(lines[1], "error: a.toml: parallel.tp must be a positive integer, got 0");
  EXPECT_STREQ(error.what(), "a.toml: model.layers must be a positive integer, got 0");
}

TEST(Errors, ARunFailureIsAnErrorThatExitsOne) {
  const RunFailure error("rank 3 stopped answering at step 7");
  EXPECT_EQ(exit_status(error), kExitFailure);
  EXPECT_EQ(error_lines(error), std::vector<std::string>{"error: rank 3 stopped answering at step 7"});
}

TEST(Errors, AnythingElseIsAnInternalErrorThatExitsOne) {
  EXPECT_EQ(exit_status(InternalError("no bucket")), kExitFailure);
  EXPECT_EQ(error_lines(InternalError("no bucket")), std::vector<std::string>{"internal error: no bucket"});
  EXPECT_EQ(error_lines(std::out_of_range("vector")), std::vector<std::string>{"internal error: vector"});
  EXPECT_EQ(exit_status(std::out_of_range("vector")), kExitFailure);
}

TEST(Errors, OneProblemIsOneLineAndAnEmptyListStillSaysSomething) {
  EXPECT_EQ(error_lines(UserError("--steps: must be at least 1, got 0")),
            std::vector<std::string>{"error: --steps: must be at least 1, got 0"});
  EXPECT_EQ(error_lines(UserError(std::vector<std::string>{})).size(), 1u);
}

}  // namespace
}  // namespace twin

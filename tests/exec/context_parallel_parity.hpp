// What the context-parallel executor tests share, one way or another (framework.cp_comm): a run of the parity model
// (exec_test_util.hpp) under a way and plan, Llama's block keys, and the check that a plan's losses and gradient norms
// equal the single-rank run's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "exec_test_util.hpp"

namespace twin::exec::cp_parity {

inline constexpr int kSteps = 3;
inline constexpr double kRelativeTolerance = 1e-5;

// Llama's block with grouped-query attention: 2 key/value heads for the parity model's 4 query heads.
inline const std::vector<std::string> kLlamaKeys = {
    "model.norm=\"rmsnorm\"", "model.activation=\"swiglu\"", "model.position_embedding=\"rope\"",
    "model.kv_heads=2",       "model.linear_bias=false",     "framework.tied_embeddings=false"};

inline std::vector<std::string> joined(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// kSteps steps of the parity model with the way's keys and the plan's.
inline TrainResult run_way(const std::vector<std::string>& way, const std::vector<std::string>& sets) {
  TrainOptions options;
  options.steps = kSteps;
  options.comm_timeout_s = 120;
  return testing::train(testing::scenario(testing::parity_toml(), joined(way, sets)), options);
}

// Every step's loss within kRelativeTolerance of the single-rank run's, its gradient norm within 1e-4; prints the
// worst difference under `label`.
inline void expect_same_losses(const TrainResult& many, const TrainResult& one, const std::string& plan,
                               const char* label) {
  ASSERT_EQ(many.losses.size(), one.losses.size()) << plan;
  double worst = 0;
  for (std::size_t i = 0; i < one.losses.size(); ++i) {
    const double relative = std::abs(many.losses[i] - one.losses[i]) / std::abs(one.losses[i]);
    worst = std::max(worst, relative);
    EXPECT_LE(relative, kRelativeTolerance)
        << plan << " step " << i << ": " << many.losses[i] << " vs " << one.losses[i];
    EXPECT_NEAR(many.grad_norms[i], one.grad_norms[i], 1e-4 * one.grad_norms[i]) << plan << " step " << i;
  }
  std::printf("[ %s ] %-30s losses %.7f %.7f %.7f   max relative difference %.1e\n", label, plan.c_str(),
              many.losses[0], many.losses[1], many.losses[2], worst);
}

using testing::Plan;

}  // namespace twin::exec::cp_parity

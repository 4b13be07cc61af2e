// framework.moe_a2a_overlap (model/program/moe_a2a_overlap.hpp) in the executor: the combined 1F1B interleaves one
// micro-batch's forward nodes with another's backward nodes, and the executor runs that list in order. Each
// micro-batch's ops keep their order and the backwards keep theirs, so a bf16 MoE model trains to the same losses,
// load-balancing losses and gradient norms as with the overlap off, with and without an interleaved pipeline.
#include <gtest/gtest.h>

#include <algorithm>

#include "model/program/program.hpp"

#include "exec_test_util.hpp"
#include "tiny_moe.hpp"

namespace twin::exec {
namespace {

using testing::scenario;
using testing::train;

model::Scenario plan(std::vector<std::string> sets, bool overlap) {
  // the tiny MoE in bf16 (the overlap needs a 16-bit dtype), EP carved out of DP
  sets.insert(sets.begin(), {"model.dtype=\"bf16\"", "parallel.dp=2", "parallel.ep=2"});
  sets.push_back(overlap ? "framework.moe_a2a_overlap=true" : "framework.moe_a2a_overlap=false");
  return scenario(testing::tiny_moe_toml(), sets);
}

// The ops on the expert stream: what tells a merged Program from the plain one (the executor runs either in order).
std::size_t expert_stream_ops(const model::Scenario& s) {
  std::size_t count = 0;
  for (const auto& ops : model::build_program(s, model::Granularity::Op).stage_ops) {
    count +=
        std::count_if(ops.begin(), ops.end(), [](const model::Op& op) { return op.stream == model::Stream::Expert; });
  }
  return count;
}

TrainResult run(const std::vector<std::string>& sets, bool overlap) {
  const model::Scenario s = plan(sets, overlap);
  EXPECT_EQ(expert_stream_ops(s) > 0, overlap) << "the Program the executor runs is the merged one only with the key";
  TrainOptions options;
  options.steps = 3;
  options.comm_timeout_s = 120;
  return train(s, options);
}

void expect_same_training(const std::vector<std::string>& sets) {
  const TrainResult off = run(sets, false), on = run(sets, true);
  ASSERT_EQ(on.losses.size(), off.losses.size());
  ASSERT_FALSE(off.losses.empty());
  for (std::size_t i = 0; i < off.losses.size(); ++i) {
    EXPECT_NEAR(on.losses[i], off.losses[i], 1e-6 * off.losses[i]) << "step " << i;
    EXPECT_NEAR(on.aux_losses[i], off.aux_losses[i], 1e-6 * off.aux_losses[i]) << "step " << i;
    EXPECT_NEAR(on.grad_norms[i], off.grad_norms[i], 1e-6 * off.grad_norms[i]) << "step " << i;
  }
  EXPECT_LT(off.losses.back(), off.losses.front());  // it trains
}

TEST(ExecMoeA2aOverlap, WithoutAPipelineTrainsAsWithoutTheOverlap) {
  expect_same_training({});
}

TEST(ExecMoeA2aOverlap, InterleavedTrainsAsWithoutTheOverlap) {
  expect_same_training({"parallel.pp=2", "parallel.schedule=\"interleaved\"", "parallel.virtual_stages=2"});
}

}  // namespace
}  // namespace twin::exec

// Failures end a run quickly with an error naming the rank: a rank that throws (its peers fail fast, not after the
// timeout), a rank that silently disappears (its peers time out naming it), a run that diverges, and a ZeRO-3 Program
// that lacks a parameter gather.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include <fmt/core.h>

#include "exec/comm/communicator.hpp"
#include "exec/core/check.hpp"
#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

const std::vector<std::string> kFourRanks = {"parallel.tp=2", "parallel.pp=2"};

std::string failure_of(const TrainOptions& options, double& seconds) {
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    testing::train(testing::scenario(testing::small_toml(), kFourRanks), options);
  } catch (const std::exception& error) {
    message = error.what();
  }
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return message;
}

TEST(ExecFailure, ARankThatThrowsStopsEveryRankAtOnce) {
  TrainOptions options;
  options.steps = 3;
  options.comm_timeout_s = 60;
  options.fault = FaultInjection{FaultInjection::Mode::Throw, 2, 1};
  double seconds = 0;
  const std::string message = failure_of(options, seconds);
  EXPECT_EQ(message, "rank 2: injected failure at step 2");  // step 1 counted from 0, as messages count from 1
  EXPECT_LT(seconds, 20.0);                                  // far from the 60 s timeout
}

TEST(ExecFailure, ADeadRankIsNamedWhenItsPeersTimeOut) {
  TrainOptions options;
  options.steps = 3;
  // Long enough that a live rank slowed by a loaded machine does not time out its peers first, short enough to keep
  // the test quick. Rank 2 (blocked on rank 3) and rank 0 (blocked on rank 2) reach their deadlines at nearly the
  // same time; before a timeout recorded the world's failure under the communicator's lock, rank 0 could wake just
  // after rank 2 had stopped waiting and name rank 2 alone (2 runs in 6 under a parallel build; since, 10 in 10;
  // ExecThreadsCommunicator.AVictimThatTimesOutFirstIsTheStoryItsWaitersTell).
  options.comm_timeout_s = 3.0;
  options.fault = FaultInjection{FaultInjection::Mode::Kill, 3, 1};
  double seconds = 0;
  const std::string message = failure_of(options, seconds);
  EXPECT_NE(message.find("timed out after 3 s"), std::string::npos) << message;
  // The first rank to time out names rank 3 directly, or a victim waiting for it and the chain that ends at rank 3.
  const bool named = message.find("rank 3 did not arrive") != std::string::npos ||
                     message.find("from rank 3 timed out") != std::string::npos ||
                     message.find("on a chain that ends at rank 3 (") != std::string::npos;
  EXPECT_TRUE(named) << message;
  EXPECT_LT(seconds, 20.0);
}

// A run that diverges stops with one sentence naming the step and the rank, raised before a kernel's precondition on
// finite logits could fail, and before NaN reaches the weights.
std::string divergence_of(const std::vector<std::string>& sets) {
  TrainOptions options;
  options.steps = 4;
  options.guards.weight_growth_limit = 0;  // the non-finite values' own check (the guard would stop a step earlier)
  try {
    testing::train(testing::scenario(testing::small_toml(), sets), options);
  } catch (const TrainingDiverged& error) {
    return error.what();
  }
  return "";
}

TEST(ExecFailure, ADivergingRunSaysSoNamingTheStepAndTheRank) {
  const std::string huge_rate = divergence_of({"parallel.tp=2", "parallel.pp=2", "training.learning_rate=1e30"});
  EXPECT_EQ(huge_rate.rfind("training diverged: ", 0), 0u) << huge_rate;
  EXPECT_NE(huge_rate.find("became non-finite"), std::string::npos) << huge_rate;
  EXPECT_NE(huge_rate.find(" at step 2 on rank "), std::string::npos) << huge_rate;
  EXPECT_NE(huge_rate.find("lower training.learning_rate (now 1e+30)"), std::string::npos) << huge_rate;
  EXPECT_EQ(huge_rate.find("precondition"), std::string::npos) << huge_rate;

  const std::string huge_init = divergence_of({"training.init_std=1e37"});  // the logits overflow float at once
  EXPECT_NE(huge_init.find("training diverged: the logits became non-finite (NaN) at step 1 on rank 0 (op #"),
            std::string::npos)
      << huge_init;
  EXPECT_NE(huge_init.find("training.init_std (now 1e+37)"), std::string::npos) << huge_init;
}

// ZeRO-3 keeps only a rank's own shard of a bucket outside its gathers, the rest NaN: a Program that lacks one
// Parameters all-gather must not train on whatever the buffer held, but stop at the first op that reads the bucket,
// naming it and the missing gather.
struct MissingGather {
  model::Phase phase;
  int layer, micro_batch;
  model::ComputeKind what;
  std::string reader;  // the label of the op that then reads the freed parameters, less its "op #N "
  std::string bucket;
};

TEST(ExecFailure, AZeroThreeProgramThatLacksAGatherNamesIt) {
  using model::ComputeKind;
  using model::Phase;
  const auto s = testing::scenario(testing::small_toml(),
                                   {"framework.name=\"composer\"", "parallel.dp=2", "parallel.zero_stage=3"});
  const MissingGather cases[] = {
      // freed after the previous micro-batch's backward of the layer
      {Phase::Forward, 1, 1, ComputeKind::TransformerLayer, "forward layernorm_attention layer 1 micro-batch 1",
       "layer 1"},
      // freed after the layer's forward (its backward gather is the prefetch issued after layer 1's backward)
      {Phase::Backward, 0, 0, ComputeKind::TransformerLayer, "backward mlp_residual layer 0 micro-batch 0", "layer 0"},
      // freed since initialisation: the root bucket of the final layer norm
      {Phase::Forward, -1, 0, ComputeKind::LmHead, "forward final_layernorm micro-batch 0", "the head"},
      // the root, freed after the previous micro-batch's embedding backward
      {Phase::Forward, -1, 1, ComputeKind::Embedding, "forward embedding micro-batch 1", "the embedding"},
  };
  for (const MissingGather& missing : cases) {
    model::Program program = model::build_program(s, model::Granularity::Op);
    std::vector<model::Op>& ops = program.stage_ops[0];
    const auto gather = std::find_if(ops.begin(), ops.end(), [&](const model::Op& op) {
      return op.kind == model::OpKind::Collective && op.payload == model::Payload::Parameters &&
             op.phase == missing.phase && op.layer == missing.layer && op.micro_batch == missing.micro_batch &&
             op.what == missing.what;
    });
    ASSERT_NE(gather, ops.end()) << missing.reader;
    ops.erase(gather);  // the executor runs the list in order: the other ops' dependencies do not matter to it
    TrainOptions options;
    options.steps = 1;
    options.threads_per_rank = 1;
    options.trace_step = -2;
    std::string message;
    try {
      train_threads(program, testing::corpus(), options);
    } catch (const InternalError& error) {
      message = error.what();
    }
    EXPECT_NE(message.find(fmt::format("{} reads the parameters of {}, but this rank holds only its own shard",
                                       missing.reader, missing.bucket)),
              std::string::npos)
        << message;
    EXPECT_NE(
        message.find(fmt::format("the Program lacks a Parameters all-gather of {} before this op", missing.bucket)),
        std::string::npos)
        << message;
  }
}

}  // namespace
}  // namespace twin::exec

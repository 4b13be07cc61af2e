// Mixture-of-Experts checkpoints re-shard across expert-parallel sizes: each routed expert's tensors are named by its
// global index, so a checkpoint written with 2 experts a rank (ep 2) resumes with all 4 on one rank and with one a rank
// (ep 4), ZeRO-1 over the expert-data-parallel ranks included, and trains on as the uninterrupted run does.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "exec/checkpoint/checkpoint.hpp"
#include "exec/checkpoint/fp8.hpp"
#include "exec/core/errors.hpp"
#include "exec/cpu/cpu_backend.hpp"
#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

namespace fs = std::filesystem;

model::Scenario moe(const std::vector<std::string>& plan) {
  std::vector<std::string> sets = {"model.experts=4", "model.top_k=2", "model.moe_ffn_hidden=96",
                                   "model.shared_experts=1"};
  sets.insert(sets.end(), plan.begin(), plan.end());
  return testing::scenario(testing::small_toml(), sets);
}

TrainResult train_moe_with_checkpoints(const model::Scenario& s, int steps, const std::string& dir) {
  TrainOptions options;
  options.steps = steps;
  options.checkpoint_dir = dir;
  return testing::train(s, options);
}

void expect_losses(const std::vector<double>& got, const std::vector<double>& uninterrupted, std::size_t first,
                   const char* plan) {
  ASSERT_EQ(got.size(), uninterrupted.size() - first) << plan;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], uninterrupted[first + i], 1e-5 * uninterrupted[first + i]) << plan << " step " << first + i;
  }
}

TEST(ExecMoeCheckpoint, ExpertParallelSizesReshardIntoEachOther) {
  const auto ep2 = moe({"parallel.dp=4", "parallel.ep=2", "parallel.zero_stage=1"});
  TrainOptions options;
  options.steps = 5;
  const auto uninterrupted = testing::train(ep2, options).losses;
  for (const auto& [name, plan] : std::vector<std::pair<const char*, std::vector<std::string>>>{
           {"ep 1 on one rank", {}},
           {"ep 4", {"parallel.dp=4", "parallel.ep=4"}},
           {"ep 2 x etp 2", {"parallel.dp=4", "parallel.ep=2", "parallel.etp=2"}},
           {"ep 2 over tp 2 x dp 2",
            {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.dp=2", "parallel.ep=2",
             "parallel.zero_stage=1"}}}) {
    const std::string dir = testing::temp_dir("moe-reshard");
    train_moe_with_checkpoints(ep2, 3, dir);
    const auto resumed = train_moe_with_checkpoints(moe(plan), 5, dir);
    EXPECT_TRUE(resumed.resharded) << name;
    EXPECT_EQ(resumed.first_step, 3) << name;
    expect_losses(resumed.losses, uninterrupted, 3, name);
    fs::remove_all(dir);
  }
}

// FP8 delayed scaling: each routed expert's scales and amax history live on the EP rank that holds it, which under
// ep 2 over dp 2 is DP rank 1 for experts 2 and 3; one rank resuming the checkpoint takes every expert's state (2
// layers x 4 experts x up and down), each from the rank that held it, and trains on within FP8's plan tolerance
// (tests/exec/interpreter/moe_fp8_test.cpp: 1e-3).
TEST(ExecMoeCheckpoint, Fp8ExpertScalesReshardFromTheRanksThatHeldThem) {
  const auto ep2 = moe({"model.dtype=\"bf16\"", "model.fp8=\"hybrid\"", "parallel.dp=2", "parallel.ep=2"});
  const auto one_rank = moe({"model.dtype=\"bf16\"", "model.fp8=\"hybrid\""});
  TrainOptions options;
  options.steps = 4;
  const auto uninterrupted = testing::train(ep2, options).losses;
  const std::string dir = testing::temp_dir("moe-fp8-reshard");
  train_moe_with_checkpoints(ep2, 2, dir);
  const fs::path step = fs::path(dir) / "step-00000002";
  const Manifest manifest = read_manifest(step);
  cpu::CpuBackend backend;
  const ModelShard shard(one_rank, model::RankCoord{}, backend);
  int experts = 0;
  for (const Fp8TensorScales& gemm : read_fp8_state_resharded(step, manifest, ep2, shard)) {
    if (gemm.what < kExpertTensors) continue;
    ++experts;
    const int holder = (gemm.what - kExpertTensors) / 2 / 2;  // old rank: 2 experts a rank
    const auto old = read_fp8_state(step, manifest, holder);
    EXPECT_NE(std::find(old.begin(), old.end(), gemm), old.end()) << "layer " << gemm.layer << " key " << gemm.what;
  }
  EXPECT_EQ(experts, 2 * 4 * 2);
  const auto resumed = train_moe_with_checkpoints(one_rank, 4, dir);
  EXPECT_TRUE(resumed.resharded);
  ASSERT_EQ(resumed.losses.size(), 2u);
  for (std::size_t k = 0; k < 2; ++k) {
    EXPECT_NEAR(resumed.losses[k], uninterrupted[2 + k], 1e-3 * uninterrupted[2 + k]) << "step " << 2 + k;
  }
  fs::remove_all(dir);
}

TEST(ExecMoeCheckpoint, AnotherNumberOfExpertsIsRefusedByName) {
  const std::string dir = testing::temp_dir("moe-reshard-experts");
  train_moe_with_checkpoints(moe({"parallel.dp=2", "parallel.ep=2"}), 1, dir);
  try {
    train_moe_with_checkpoints(moe({"model.experts=8"}), 2, dir);
    ADD_FAILURE() << "8 experts resumed 4 experts' checkpoint";
  } catch (const RunError& error) {
    EXPECT_NE(std::string(error.what()).find("model.experts"), std::string::npos) << error.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace twin::exec

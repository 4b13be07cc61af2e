// FP8 delayed scaling in checkpoints: its scales and amax histories are saved beside each rank's shard
// (exec/checkpoint/fp8.hpp), so a resumed run quantizes as the uninterrupted one does and gives its losses bit for bit
// (under TP and DP, and under CP, where the amaxes reduce over dp x cp); under another plan each layer's state is
// taken from its old stage; and a checkpoint without them (an older twin's) or with a state file missing is refused,
// naming the field or the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec/checkpoint/checkpoint.hpp"
#include "exec/checkpoint/fp8.hpp"
#include "exec/checkpoint/io.hpp"
#include "exec/core/errors.hpp"
#include "exec/cpu/cpu_backend.hpp"
#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

namespace fs = std::filesystem;
using testing::scenario;
using testing::small_toml;

const std::vector<std::string> kDelayedFp8 = {"model.dtype=\"bf16\"", "model.fp8=\"hybrid\"",
                                              "framework.fp8_recipe=\"delayed\""};

model::Scenario delayed(const std::vector<std::string>& plan) {
  std::vector<std::string> sets = kDelayedFp8;
  sets.insert(sets.end(), plan.begin(), plan.end());
  return scenario(small_toml(), sets);
}

TrainResult train_fp8(const model::Scenario& s, int steps, const std::string& dir = {}) {
  TrainOptions options;
  options.steps = steps;
  options.checkpoint_dir = dir;
  options.comm_timeout_s = 120;
  return testing::train(s, options);
}

// The message of the RunError that resuming from `dir` raises ("" if none).
std::string fp8_resume_error(const model::Scenario& s, const std::string& dir) {
  try {
    train_fp8(s, 4, dir);
  } catch (const RunError& error) {
    return error.what();
  }
  return "";
}

TEST(ExecFp8Checkpoint, DelayedScalingResumesBitForBit) {
  for (const auto& plan : std::vector<std::vector<std::string>>{
           {},
           {"parallel.tp=2", "parallel.pp=2", "parallel.dp=2", "parallel.zero_stage=1"},
           {"framework.attention=\"flash2\"", "parallel.cp=2", "parallel.tp=2"}}) {
    const auto s = delayed(plan);
    const std::string name = ::testing::PrintToString(plan);
    const auto uninterrupted = train_fp8(s, 4).losses;
    const std::string dir = testing::temp_dir("fp8-delayed-resume");
    train_fp8(s, 2, dir);
    // What was saved: every GEMM of every layer, scales past their first update (1 is the scale before any amax)
    const fs::path step = fs::path(dir) / "step-00000002";
    const Manifest manifest = read_manifest(step);
    ASSERT_EQ(manifest.fp8_states.size(), static_cast<std::size_t>(manifest.world_size)) << name;
    const auto saved = read_fp8_state(step, manifest, 0);
    const int layers_on_rank_0 = plan.size() > 1 && plan[1] == "parallel.pp=2" ? 1 : 2;
    EXPECT_EQ(saved.size(), static_cast<std::size_t>(4 * layers_on_rank_0)) << name;
    for (const Fp8TensorScales& gemm : saved) {
      for (std::size_t role = 0; role < 3; ++role) {
        EXPECT_NE(gemm.scale[role], 1.0f) << name << " layer " << gemm.layer << " GEMM " << gemm.what;
        EXPECT_TRUE(std::isfinite(gemm.scale[role])) << name;
      }
    }
    const auto resumed = train_fp8(s, 4, dir);
    EXPECT_EQ(resumed.first_step, 2) << name;
    EXPECT_EQ(resumed.losses, std::vector<double>(uninterrupted.begin() + 2, uninterrupted.end())) << name;  // exact
    fs::remove_all(dir);
  }
}

// A tensor count the file's bytes cannot hold is a corrupt file, refused before the records are allocated (a count
// of 4G asked for 4G records: fuzz_checkpoint). The checksum matches, so that the count's own check is what refuses.
TEST(ExecFp8Checkpoint, ACountPastWhatTheFileHoldsIsRefusedBeforeItIsAllocated) {
  const fs::path step = testing::temp_dir("fp8-state-count");
  Fp8TensorScales gemm;
  gemm.scale = {1, 2, 3};
  const ShardRecord written = write_fp8_state(step, 0, 1, 2, {gemm});
  std::string bytes;
  {
    std::ifstream in(step / written.file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // magic (8), version, rank, world size (4 each), step (8), then the count
  constexpr std::size_t kCountAt = 8 + 4 + 4 + 4 + 8;
  ASSERT_GT(bytes.size(), kCountAt + 4);
  const std::uint32_t huge = 0xfffffff0u;
  std::memcpy(bytes.data() + kCountAt, &huge, sizeof(huge));
  std::ofstream(step / written.file, std::ios::binary | std::ios::trunc) << bytes;
  Manifest manifest;
  manifest.world_size = 1;
  manifest.step = 2;
  manifest.fp8_states = {ShardRecord{0, written.file, bytes.size(), fnv1a(bytes.data(), bytes.size())}};
  try {
    read_fp8_state(step, manifest, 0);
    ADD_FAILURE() << "a count of 4G tensors in " << bytes.size() << " bytes was read";
  } catch (const RunError& error) {
    EXPECT_NE(std::string(error.what()).find("is corrupt: 4294967280 tensors in"), std::string::npos) << error.what();
  }
  fs::remove_all(step);
}

// The scales are what makes the resumed run exact: the same checkpoint with every scale put back to 1 (what a run
// that does not keep them starts from) resumes to other losses.
TEST(ExecFp8Checkpoint, ScalesStartedAgainAt1WouldGiveOtherLosses) {
  const auto s = delayed({});
  const auto uninterrupted = train_fp8(s, 4).losses;
  const std::string dir = testing::temp_dir("fp8-delayed-reset");
  train_fp8(s, 2, dir);
  const fs::path step = fs::path(dir) / "step-00000002";
  Manifest manifest = read_manifest(step);
  auto reset = read_fp8_state(step, manifest, 0);
  for (Fp8TensorScales& gemm : reset) gemm.scale = {1, 1, 1};
  manifest.fp8_states = {write_fp8_state(step, 0, 1, 2, reset)};
  write_manifest(step, manifest);
  const auto resumed = train_fp8(s, 4, dir);
  EXPECT_NE(resumed.losses[0], uninterrupted[2]);
  fs::remove_all(dir);
}

// Under another plan each layer's state comes from the first rank of its old stage: TP 2 x PP 2 into one rank and
// back. The losses are the uninterrupted run's within what FP8 allows across plans (fp8_training_test.cpp,
// kFp8PlanTolerance 2e-3: a sum in another order tips an element over an FP8 rounding boundary).
TEST(ExecFp8Checkpoint, DelayedScalingIsReshardedLayerByLayer) {
  const auto written = delayed({"parallel.tp=2", "parallel.pp=2"});
  const auto uninterrupted = train_fp8(written, 4).losses;
  const std::string dir = testing::temp_dir("fp8-delayed-reshard");
  train_fp8(written, 2, dir);
  const fs::path step = fs::path(dir) / "step-00000002";
  const Manifest manifest = read_manifest(step);
  // one rank of the new plan gets layer 0's state from old rank 0 and layer 1's from old rank 2 (stage 1)
  const auto one_rank = delayed({});
  cpu::CpuBackend backend;
  const ModelShard shard(one_rank, model::RankCoord{}, backend);
  const auto state = read_fp8_state_resharded(step, manifest, written, shard);
  ASSERT_EQ(state.size(), 8u);
  const auto stage_0 = read_fp8_state(step, manifest, 0), stage_1 = read_fp8_state(step, manifest, 2);
  for (const Fp8TensorScales& gemm : state) {
    const auto& old = gemm.layer == 0 ? stage_0 : stage_1;
    EXPECT_NE(std::find(old.begin(), old.end(), gemm), old.end()) << "layer " << gemm.layer << " GEMM " << gemm.what;
  }
  const auto resumed = train_fp8(one_rank, 4, dir);
  EXPECT_TRUE(resumed.resharded);
  ASSERT_EQ(resumed.losses.size(), 2u);
  for (std::size_t k = 0; k < 2; ++k) {
    EXPECT_NEAR(resumed.losses[k], uninterrupted[2 + k], 2e-3 * uninterrupted[2 + k]) << "step " << 2 + k;
  }
  EXPECT_TRUE(train_fp8(written, 5, dir).resharded);  // and back
  fs::remove_all(dir);
}

// A checkpoint of a twin that did not keep the state: its manifest has no fp8_states. Resuming it would restart the
// scales at 1 and leave the run it continues, so it is refused, naming the field.
TEST(ExecFp8Checkpoint, ACheckpointWithoutTheStateIsRefusedByName) {
  const auto s = delayed({"parallel.dp=2"});
  const std::string dir = testing::temp_dir("fp8-delayed-old");
  train_fp8(s, 2, dir);
  const fs::path step = fs::path(dir) / "step-00000002";
  {  // a state file gone: named
    const fs::path gone = step / fp8_state_file_name(1);
    fs::rename(gone, fs::path(dir) / "aside.bin");
    const std::string error = fp8_resume_error(s, dir);
    EXPECT_NE(error.find(gone.string()), std::string::npos) << error;
    fs::rename(fs::path(dir) / "aside.bin", gone);
  }
  Manifest manifest = read_manifest(step);
  manifest.fp8_states.clear();  // as an older twin wrote it
  write_manifest(step, manifest);
  for (int rank = 0; rank < 2; ++rank) fs::remove(step / fp8_state_file_name(rank));
  const std::string error = fp8_resume_error(s, dir);
  EXPECT_NE(error.find((step / "manifest.json").string() + "' has no fp8_states"), std::string::npos) << error;
  EXPECT_NE(error.find("--no-resume"), std::string::npos) << error;
  // another recipe keeps no state and resumes from it
  auto tensorwise = scenario(small_toml(), {"model.dtype=\"bf16\"", "model.fp8=\"hybrid\"", "parallel.dp=2",
                                            "framework.fp8_recipe=\"tensorwise\""});
  EXPECT_EQ(train_fp8(tensorwise, 3, dir).first_step, 2);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace twin::exec

// Checkpoints: resuming continues bit for bit (also after a real SIGKILL of a training process, and under ZeRO-3, whose
// ranks save only their shards of the parameters); a checkpoint of another plan is re-sharded and trains on as the
// uninterrupted run does; and a truncated, corrupt, misnamed or foreign checkpoint (or one with a directory or a link
// loop where a file should be) is refused with a message naming the file and what differs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "exec/checkpoint/checkpoint.hpp"
#include "exec/checkpoint/io.hpp"
#include "exec/core/errors.hpp"
#include "exec/cpu/cpu_backend.hpp"
#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

namespace fs = std::filesystem;
using testing::scenario;
using testing::small_toml;
using testing::train;

const std::vector<std::string> kPlan = {"parallel.pp=2", "parallel.dp=2", "parallel.zero_stage=1"};

TrainResult train_with_checkpoints(const model::Scenario& s, int steps, const std::string& dir, int every = 0) {
  TrainOptions options;
  options.steps = steps;
  options.checkpoint_dir = dir;
  options.checkpoint_every = every;
  return train(s, options);
}

// The message of the RunError that resuming from `dir` with scenario `s` raises ("" if none).
std::string resume_error(const model::Scenario& s, const std::string& dir, int steps = 4) {
  try {
    train_with_checkpoints(s, steps, dir);
  } catch (const RunError& error) {
    return error.what();
  }
  return "";
}

TEST(ExecCheckpoint, ResumingContinuesBitForBit) {
  const auto s = scenario(small_toml(), kPlan);
  TrainOptions options;
  options.steps = 8;
  const auto uninterrupted = train(s, options).losses;
  const std::string dir = testing::temp_dir("resume");
  const auto first = train_with_checkpoints(s, 4, dir);
  EXPECT_EQ(first.losses, std::vector<double>(uninterrupted.begin(), uninterrupted.begin() + 4));
  EXPECT_TRUE(fs::exists(dir + "/step-00000004/manifest.json"));
  const auto resumed = train_with_checkpoints(s, 8, dir);
  EXPECT_EQ(resumed.first_step, 4);
  EXPECT_EQ(resumed.earlier_losses, first.losses);
  EXPECT_EQ(resumed.losses, std::vector<double>(uninterrupted.begin() + 4, uninterrupted.end()));  // exact
  fs::remove_all(dir);
}

// ZeRO-3: outside its gathers a rank holds only its shard of the parameters (the rest NaN): each rank saves that
// shard, as it saves its shard of the Adam state, and resuming restores it and the rest freed, so that the resumed run
// continues bit for bit.
TEST(ExecCheckpoint, ZeroThreeSavesEachRanksShardAndResumesBitForBit) {
  const auto s = scenario(small_toml(), {"framework.name=\"composer\"", "parallel.dp=2", "parallel.zero_stage=3"});
  TrainOptions options;
  options.steps = 6;
  const auto uninterrupted = train(s, options).losses;
  const std::string dir = testing::temp_dir("zero3");
  const auto first = train_with_checkpoints(s, 3, dir);
  EXPECT_EQ(first.losses, std::vector<double>(uninterrupted.begin(), uninterrupted.begin() + 3));

  // What the files hold: every rank's own shard of each bucket, finite; read back, the rest is freed again.
  const fs::path step = dir + "/step-00000003";
  const Manifest manifest = read_manifest(step);
  const model::Program program = model::build_program(s, model::Granularity::Op);
  cpu::CpuBackend backend;
  for (int rank = 0; rank < 2; ++rank) {
    ModelShard shard(s, program.layout.coord_of(rank), backend);
    read_shard(step, manifest, rank, shard, backend);
    for (const Bucket& b : shard.buckets()) {
      std::vector<float> params(b.padded_numel);
      backend.download_f32(params.data(), b.params);
      std::size_t finite = 0, freed = 0;
      for (std::size_t k = 0; k < b.padded_numel; ++k) {
        const bool mine = k >= b.shard_offset && k < b.shard_offset + b.shard_numel;
        finite += mine && std::isfinite(params[k]);
        freed += !mine && std::isnan(params[k]);
      }
      EXPECT_EQ(finite, b.shard_numel) << b.name << " of rank " << rank;
      EXPECT_EQ(freed, b.padded_numel - b.shard_numel) << b.name << " of rank " << rank;
      EXPECT_TRUE(b.other_shards_freed);
    }
  }

  const auto resumed = train_with_checkpoints(s, 6, dir);
  EXPECT_EQ(resumed.first_step, 3);
  EXPECT_EQ(resumed.losses, std::vector<double>(uninterrupted.begin() + 3, uninterrupted.end()));  // exact
  fs::remove_all(dir);
}

// Resuming under another plan re-shards the checkpoint: every element of every full tensor, with its Adam state, goes
// to the rank of the new plan that holds it. The math does not depend on the plan (the same global batch, the same
// initialisation), so the resumed losses are the uninterrupted run's up to the order of fp32 sums (the cross-plan
// agreement of ExecParity); a tensor element put in the wrong place, or Adam's state lost, moves them by far more
// (checked: zeroed Adam state alone moves step 5's loss by 0.12).
void expect_same_trajectory(const std::vector<double>& resumed, const std::vector<double>& uninterrupted, int from) {
  ASSERT_EQ(resumed.size() + static_cast<std::size_t>(from), uninterrupted.size());
  for (std::size_t k = 0; k < resumed.size(); ++k) {
    EXPECT_NEAR(resumed[k], uninterrupted[from + k], 1e-6 * std::abs(uninterrupted[from + k])) << "step " << from + k;
  }
}

TEST(ExecCheckpoint, AnotherPlanIsReshardedAndTrainsOnAsTheUninterruptedRun) {
  const auto plan_a =
      scenario(small_toml(), {"parallel.tp=2", "parallel.pp=2", "parallel.dp=2", "parallel.zero_stage=1"});
  TrainOptions options;
  options.steps = 8;
  const auto uninterrupted = train(plan_a, options).losses;
  const std::string dir = testing::temp_dir("reshard");
  train_with_checkpoints(plan_a, 4, dir);
  // 8 ranks (ZeRO-1: Adam's state in halves across DP) into 2 (one stage per layer, whole tensors, another
  // micro-batch), then back into the first plan.
  const auto plan_b = scenario(small_toml(), {"parallel.pp=2", "parallel.micro_batch=1"});
  TrainOptions resume;
  resume.steps = 6;
  resume.checkpoint_dir = dir;
  std::vector<std::string> notes;
  resume.on_note = [&notes](const std::string& note) { notes.push_back(note); };
  const auto resharded = train(plan_b, resume);
  EXPECT_TRUE(resharded.resharded);
  EXPECT_EQ(resharded.first_step, 4);
  EXPECT_NE(std::find(notes.begin(), notes.end(),
                      "re-sharded from TP 2 x PP 2 x DP 2 (ZeRO 1) to TP 1 x PP 2 x DP 1 (ZeRO 0)"),
            notes.end())
      << ::testing::PrintToString(notes);
  EXPECT_NE(
      std::find(notes.begin(), notes.end(), "changed since the checkpoint: parallel.tp: 2 in the checkpoint, 1 now"),
      notes.end())
      << ::testing::PrintToString(notes);
  expect_same_trajectory(resharded.losses, std::vector<double>(uninterrupted.begin(), uninterrupted.begin() + 6), 4);
  const auto back = train_with_checkpoints(plan_a, 8, dir);
  EXPECT_TRUE(back.resharded);
  expect_same_trajectory(back.losses, uninterrupted, 6);
  // The same plan again reads each rank's own shard.
  EXPECT_FALSE(train_with_checkpoints(plan_a, 9, dir).resharded);
  fs::remove_all(dir);
}

// Under parallel.overlap_param_gather the updated parameters are gathered only by the next forward: a checkpoint's
// ZeRO-1 replicas hold stale copies of the regions other DP ranks own. Re-sharding takes each element from its owner.
TEST(ExecCheckpoint, ReshardingTakesEachParameterFromItsOwnerNotAStaleReplica) {
  const auto overlapped = scenario(small_toml(), {"parallel.dp=2", "parallel.zero_stage=1", "parallel.dp_overlap=true",
                                                  "parallel.overlap_param_gather=true"});
  TrainOptions options;
  options.steps = 6;
  const auto uninterrupted = train(overlapped, options).losses;
  const std::string dir = testing::temp_dir("reshard-stale");
  train_with_checkpoints(overlapped, 3, dir);
  const auto resumed = train_with_checkpoints(scenario(small_toml(), {"parallel.tp=2"}), 6, dir);
  EXPECT_TRUE(resumed.resharded);
  expect_same_trajectory(resumed.losses, uninterrupted, 3);
  fs::remove_all(dir);
  // In the same plan each rank reads its own file back, stale regions included, and the first forward's gathers
  // refresh them: bit for bit.
  train_with_checkpoints(overlapped, 3, dir);
  const auto same_plan = train_with_checkpoints(overlapped, 6, dir);
  EXPECT_FALSE(same_plan.resharded);
  EXPECT_EQ(same_plan.losses, std::vector<double>(uninterrupted.begin() + 3, uninterrupted.end()));
  fs::remove_all(dir);
}

// A Llama-style block splits its tensors in the ways a GPT-2 block does not: grouped-query QKV rows (whole query heads
// and whole key/value heads per rank), SwiGLU's gate and up halves, an untied LM head. TP 2 into TP 1 x PP 2.
TEST(ExecCheckpoint, ALlamaStyleBlockIsReshardedAcrossTensorParallelism) {
  const std::vector<std::string> llama = {
      "model.norm=\"rmsnorm\"", "model.activation=\"swiglu\"", "model.position_embedding=\"rope\"",
      "model.kv_heads=2",       "model.linear_bias=false",     "framework.tied_embeddings=false"};
  auto with = [&](std::vector<std::string> plan) {
    plan.insert(plan.begin(), llama.begin(), llama.end());
    return scenario(small_toml(), plan);
  };
  const auto tensor_parallel = with({"parallel.tp=2"});
  TrainOptions options;
  options.steps = 6;
  const auto uninterrupted = train(tensor_parallel, options).losses;
  const std::string dir = testing::temp_dir("reshard-llama");
  train_with_checkpoints(tensor_parallel, 3, dir);
  const auto resumed = train_with_checkpoints(with({"parallel.pp=2"}), 6, dir);
  EXPECT_TRUE(resumed.resharded);
  expect_same_trajectory(resumed.losses, uninterrupted, 3);
  fs::remove_all(dir);
}

// ZeRO-3's files hold each rank's shard of the parameters alone; re-sharded into Megatron's tensor and interleaved
// pipeline plan, and from there into ZeRO-3 over another number of ranks, the run goes on as if never stopped.
TEST(ExecCheckpoint, ZeroThreeShardsAreReshardedIntoOtherPlansAndBack) {
  const auto fsdp = scenario(
      small_toml(), {"model.layers=4", "framework.name=\"composer\"", "parallel.dp=4", "parallel.zero_stage=3"});
  TrainOptions options;
  options.steps = 6;
  const auto uninterrupted = train(fsdp, options).losses;
  const std::string dir = testing::temp_dir("reshard-zero3");
  train_with_checkpoints(fsdp, 2, dir);
  const auto interleaved =
      scenario(small_toml(), {"model.layers=4", "parallel.tp=2", "parallel.pp=2", "parallel.schedule=\"interleaved\"",
                              "parallel.virtual_stages=2", "parallel.dp=2"});
  const auto megatron = train_with_checkpoints(interleaved, 4, dir);
  EXPECT_TRUE(megatron.resharded);
  expect_same_trajectory(megatron.losses, std::vector<double>(uninterrupted.begin(), uninterrupted.begin() + 4), 2);
  const auto fsdp_two = scenario(
      small_toml(), {"model.layers=4", "framework.name=\"composer\"", "parallel.dp=2", "parallel.zero_stage=3"});
  const auto back = train_with_checkpoints(fsdp_two, 6, dir);
  EXPECT_TRUE(back.resharded);
  expect_same_trajectory(back.losses, uninterrupted, 4);
  fs::remove_all(dir);
}

TEST(ExecCheckpoint, KeepsTheNewestAndIgnoresIncompleteOnes) {
  const auto s = scenario(small_toml());
  const std::string dir = testing::temp_dir("keep");
  train_with_checkpoints(s, 6, dir, 2);
  EXPECT_FALSE(fs::exists(dir + "/step-00000002"));
  EXPECT_TRUE(fs::exists(dir + "/step-00000004/manifest.json"));
  EXPECT_TRUE(fs::exists(dir + "/step-00000006/manifest.json"));
  fs::remove(dir + "/step-00000006/manifest.json");  // as if killed before the manifest
  EXPECT_EQ(latest_checkpoint(dir)->filename(), "step-00000004");
  const auto resumed = train_with_checkpoints(s, 6, dir, 2);
  EXPECT_EQ(resumed.first_step, 4);
  fs::remove_all(dir);
}

// A length read from a shard (a bucket's name) past the file's end is a truncated file, refused before anything of
// that length is allocated (fuzz_checkpoint found a 4 GiB allocation: tests/fuzz/corpus/fuzz_checkpoint/).
TEST(ExecCheckpointReader, ALengthPastTheEndIsATruncatedFile) {
  const std::string bytes = std::string("\xf0\xff\xff\xff", 4) + "abc";
  const fs::path path = "rank-00000.bin";
  BinaryReader in(bytes, path, "shard");
  const auto length = in.get<std::uint32_t>();
  EXPECT_EQ(length, 0xfffffff0u);
  EXPECT_EQ(in.remaining(), 3u);
  try {
    in.take_string(length);
    FAIL() << "a length of 4 GiB in 7 bytes was taken";
  } catch (const RunError& error) {
    EXPECT_NE(std::string(error.what()).find("checkpoint shard 'rank-00000.bin' is truncated"), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(in.take_string(3), "abc");
  EXPECT_TRUE(in.at_end());
}

class ExecBrokenCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::temp_dir("broken");
    train_with_checkpoints(scenario(small_toml(), {"parallel.tp=2"}), 2, dir_);
    step_ = dir_ + "/step-00000002";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_, step_;
};

TEST_F(ExecBrokenCheckpoint, TruncatedShard) {
  const std::string shard = step_ + "/rank-00001.bin";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  const std::string message = resume_error(scenario(small_toml(), {"parallel.tp=2"}), dir_);
  EXPECT_NE(message.find("checkpoint shard '" + shard + "' is truncated"), std::string::npos) << message;
}

TEST_F(ExecBrokenCheckpoint, CorruptShard) {
  const std::string shard = step_ + "/rank-00000.bin";
  std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(static_cast<std::streamoff>(fs::file_size(shard) / 2));
  file.put('\x7f');
  file.close();
  const std::string message = resume_error(scenario(small_toml(), {"parallel.tp=2"}), dir_);
  EXPECT_NE(message.find("checkpoint shard '" + shard + "' is corrupt"), std::string::npos) << message;
}

TEST_F(ExecBrokenCheckpoint, TruncatedManifest) {
  const std::string manifest = step_ + "/manifest.json";
  fs::resize_file(manifest, 100);
  const std::string message = resume_error(scenario(small_toml(), {"parallel.tp=2"}), dir_);
  EXPECT_NE(message.find("checkpoint manifest '" + manifest + "' is corrupt or truncated"), std::string::npos)
      << message;
}

// Another global batch is another order of the data (the sequences of step i are drawn from i * global_batch on):
// refused like another model, with each difference.
TEST_F(ExecBrokenCheckpoint, AnotherGlobalBatch) {
  const std::string message = resume_error(scenario(small_toml(), {"parallel.pp=2", "parallel.global_batch=16"}), dir_);
  EXPECT_NE(message.find("checkpoint '" + step_ + "' was written by another model, global batch or data set"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("parallel.global_batch: 8 in the checkpoint, 16 now"), std::string::npos) << message;
  EXPECT_EQ(message.find("parallel.pp"), std::string::npos) << message;  // a plan change alone would be re-sharded
}

// Re-sharding reads the old plan's shards with read_shard's checks: a corrupt one is named.
TEST_F(ExecBrokenCheckpoint, CorruptShardOfAnotherPlan) {
  const std::string shard = step_ + "/rank-00001.bin";
  std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(static_cast<std::streamoff>(fs::file_size(shard) / 2));
  file.put('\x7f');
  file.close();
  const std::string message = resume_error(scenario(small_toml(), {"parallel.pp=2"}), dir_);
  EXPECT_NE(message.find("checkpoint shard '" + shard + "' is corrupt"), std::string::npos) << message;
}

// A manifest whose world size is not its own scenario's plan (both edited by hand, consistently enough that the
// scenario loads) cannot be re-sharded from: named, with both sizes.
TEST_F(ExecBrokenCheckpoint, AWorldSizeThatIsNotThePlansOwn) {
  const std::string manifest = step_ + "/manifest.json";
  std::string text = testing::read_text(manifest);
  const std::string from = "\\ndp = 1\\n";  // inside the JSON string of the scenario's TOML
  const auto at = text.find(from);
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, from.size(), "\\ndp = 2\\n");
  const std::string gpus = "gpus_per_node = 2";  // and the cluster to match, so that the scenario loads
  ASSERT_NE(text.find(gpus), std::string::npos) << text;
  text.replace(text.find(gpus), gpus.size(), "gpus_per_node = 4");
  std::ofstream(manifest, std::ios::trunc) << text;
  const std::string message = resume_error(scenario(small_toml(), {"parallel.pp=2"}), dir_);
  EXPECT_NE(message.find("checkpoint manifest '" + manifest +
                         "' says world_size 2, but its plan TP 2 x PP 1 x DP 2 has 4 ranks"),
            std::string::npos)
      << message;
}

TEST_F(ExecBrokenCheckpoint, AnotherModel) {
  const std::string message =
      resume_error(scenario(small_toml(), {"parallel.tp=2", "model.layers=4", "model.hidden=128"}), dir_);
  EXPECT_NE(message.find("model.layers: 2 in the checkpoint, 4 now"), std::string::npos) << message;
  EXPECT_NE(message.find("model.hidden: 64 in the checkpoint, 128 now"), std::string::npos) << message;
}

TEST_F(ExecBrokenCheckpoint, ALlamaStyleBlock) {  // RMSNorm has no bias, SwiGLU's fc is twice as wide, ...
  const std::string message =
      resume_error(scenario(small_toml(), {"parallel.tp=2", "model.norm=\"rmsnorm\"", "model.activation=\"swiglu\"",
                                           "model.kv_heads=2", "model.linear_bias=false"}),
                   dir_);
  for (const char* expected :
       {"model.norm: layernorm in the checkpoint, rmsnorm now", "model.activation: gelu in the checkpoint, swiglu now",
        "model.kv_heads: 4 in the checkpoint, 2 now", "model.linear_bias: true in the checkpoint, false now"}) {
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
}

TEST_F(ExecBrokenCheckpoint, AParallelBlock) {  // the same tensors, wired otherwise: another model
  const std::string message =
      resume_error(scenario(small_toml(), {"parallel.tp=2", "model.parallel_residual=true"}), dir_);
  EXPECT_NE(message.find("model.parallel_residual: false in the checkpoint, true now"), std::string::npos) << message;
  const std::string rotary = resume_error(
      scenario(small_toml(), {"parallel.tp=2", "model.position_embedding=\"rope\"", "model.rotary_fraction=0.5"}),
      dir_);
  EXPECT_NE(rotary.find("model.rotary_fraction: 1 in the checkpoint, 0.5 now"), std::string::npos) << rotary;
  const std::string shared = resume_error(
      scenario(small_toml(), {"parallel.tp=2", "model.parallel_residual=true", "model.shared_norm=true"}), dir_);
  EXPECT_NE(shared.find("model.shared_norm: false in the checkpoint, true now"), std::string::npos) << shared;
}

TEST_F(ExecBrokenCheckpoint, AnotherPositionEmbedding) {  // ALiBi has no wpe: the same buckets would not line up
  const std::string message =
      resume_error(scenario(small_toml(), {"parallel.tp=2", "model.position_embedding=\"alibi\""}), dir_);
  EXPECT_NE(message.find("model.position_embedding: learned in the checkpoint, alibi now"), std::string::npos)
      << message;
}

TEST_F(ExecBrokenCheckpoint, AnotherDataSet) {
  TrainOptions options;
  options.steps = 4;
  options.checkpoint_dir = dir_;
  options.threads_per_rank = 1;
  const auto s = scenario(small_toml(), {"parallel.tp=2"});
  const model::Program program = model::build_program(s, model::Granularity::Op);
  std::string other_text;
  for (int i = 0; i < 200; ++i) other_text += "a different text altogether. ";
  const TextDataset other = text_from_string(other_text, "other.txt");
  std::string message;
  try {
    train_threads(program, other, options);
  } catch (const RunError& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("data: the checkpoint was trained on"), std::string::npos) << message;
}

// A folder copied (or renamed) to another step's name is refused, naming it and both steps; the cleanup of old
// checkpoints neither counts it as a newer checkpoint nor removes it, and the real one survives both.
TEST_F(ExecBrokenCheckpoint, FolderNamedForAnotherStep) {
  const std::string copy = dir_ + "/step-00000007";
  fs::copy(step_, copy, fs::copy_options::recursive);
  const std::string message = resume_error(scenario(small_toml(), {"parallel.tp=2"}), dir_, 8);
  EXPECT_NE(message.find("checkpoint '" + copy + "' is named for step 7 but its manifest says step 2"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("rename it to step-00000002"), std::string::npos) << message;
  prune_checkpoints(dir_, 1);
  EXPECT_TRUE(fs::exists(step_ + "/manifest.json"));
  EXPECT_TRUE(fs::exists(copy + "/manifest.json"));
}

TEST_F(ExecBrokenCheckpoint, ShardIsADirectory) {
  const std::string shard = step_ + "/rank-00000.bin";
  fs::remove(shard);
  fs::create_directory(shard);
  const std::string message = resume_error(scenario(small_toml(), {"parallel.tp=2"}), dir_);
  EXPECT_NE(message.find("checkpoint file '" + shard + "' is unreadable: it is a directory, not a regular file"),
            std::string::npos)
      << message;
}

TEST_F(ExecBrokenCheckpoint, ManifestIsADirectory) {
  const std::string manifest = step_ + "/manifest.json";
  fs::remove(manifest);
  fs::create_directory(manifest);
  const std::string message = resume_error(scenario(small_toml(), {"parallel.tp=2"}), dir_);
  EXPECT_NE(message.find("checkpoint file '" + manifest + "' is unreadable: it is a directory, not a regular file"),
            std::string::npos)
      << message;
}

TEST_F(ExecBrokenCheckpoint, ManifestIsASymlinkToItself) {
  const std::string manifest = step_ + "/manifest.json";
  fs::remove(manifest);
  fs::create_symlink("manifest.json", manifest);
  const std::string message = resume_error(scenario(small_toml(), {"parallel.tp=2"}), dir_);
  EXPECT_NE(
      message.find("checkpoint file '" + manifest + "' is missing or unreadable: Too many levels of symbolic links"),
      std::string::npos)
      << message;
  prune_checkpoints(dir_, 1);  // does not throw either
}

// A number out of its field's range is named as written, not as what it wraps around to.
TEST_F(ExecBrokenCheckpoint, OutOfRangeManifestValues) {
  const std::string manifest = step_ + "/manifest.json";
  const std::string original = testing::read_text(manifest);
  auto resume_with = [&](const std::string& from, const std::string& to) {
    std::string text = original;
    const auto at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
    std::ofstream(manifest, std::ios::trunc) << text;
    return resume_error(scenario(small_toml(), {"parallel.tp=2"}), dir_);
  };
  const std::string corrupt = "checkpoint manifest '" + manifest + "' is corrupt: ";
  std::string message = resume_with("\"step\": 2,", "\"step\": 1e30,");
  EXPECT_NE(message.find(corrupt + "step is 1e+30, expected a whole number from 0 to 2147483647"), std::string::npos)
      << message;
  message = resume_with("\"step\": 2,", "\"step\": 99999999999,");
  EXPECT_NE(message.find(corrupt + "step is 99999999999, expected a whole number from 0 to 2147483647"),
            std::string::npos)
      << message;
  const auto json = nlohmann::json::parse(original);
  const std::string bytes = fmt::format("\"bytes\": {},", json["shards"][0]["bytes"].get<std::uint64_t>());
  message = resume_with(bytes, "\"bytes\": -5,");
  EXPECT_NE(message.find(corrupt + "shards[0].bytes is -5, expected a whole number from 0 to 18446744073709551615"),
            std::string::npos)
      << message;
  message = resume_with("\"world_size\": 2\n", "\"world_size\": 2.5\n");
  EXPECT_NE(message.find(corrupt + "world_size is 2.5, expected a whole number"), std::string::npos) << message;
}

// Adam's settings may change on resume, as the learning rate may; the change is noted, not silent.
// The losses a manifest records are covered by its checksum: an edited loss is a corrupt manifest, named.
TEST_F(ExecBrokenCheckpoint, EditedLossesInTheManifest) {
  const std::string manifest = step_ + "/manifest.json";
  nlohmann::json json = nlohmann::json::parse(testing::read_text(manifest));
  ASSERT_TRUE(json.contains("losses_fnv1a64"));
  json["losses"][1] = json["losses"][1].get<double>() * 0.5;
  std::ofstream(manifest) << json.dump(2);
  const std::string message = resume_error(scenario(small_toml(), {"parallel.tp=2"}), dir_);
  EXPECT_NE(message.find("checkpoint manifest '" + manifest + "' is corrupt: its losses do not match losses_fnv1a64"),
            std::string::npos)
      << message;
}

// A second run on a checkpoint directory in use is refused, naming the holder (pid and host); the lock goes with its
// holder.
TEST(ExecCheckpoint, ALockKeepsASecondRunOutOfTheDirectory) {
  const std::string dir = testing::temp_dir("lock");
  {
    const CheckpointLock held(dir);
    std::string message;
    try {
      train_with_checkpoints(scenario(small_toml()), 1, dir);
    } catch (const RunError& error) {
      message = error.what();
    }
    EXPECT_NE(
        message.find(fmt::format("--checkpoint '{}' is in use by another twin run (pid {} on host ", dir, ::getpid())),
        std::string::npos)
        << message;
    EXPECT_FALSE(fs::exists(dir + "/step-00000001"));
  }
  EXPECT_EQ(train_with_checkpoints(scenario(small_toml()), 1, dir).losses.size(), 1u);  // released
  fs::remove_all(dir);
}

// A step folder without a manifest newer than the newest complete checkpoint is an interrupted write: listed (the
// resumed run says it ignores it), and resuming starts before it.
TEST(ExecCheckpoint, UnfinishedCheckpointsAreListed) {
  const std::string dir = testing::temp_dir("unfinished");
  train_with_checkpoints(scenario(small_toml()), 2, dir, 1);
  fs::remove(dir + "/step-00000002/manifest.json");
  EXPECT_EQ(unfinished_checkpoints(dir), std::vector<fs::path>{fs::path(dir) / "step-00000002"});
  EXPECT_EQ(latest_checkpoint(dir), fs::path(dir) / "step-00000001");
  fs::remove_all(dir);
}

TEST(ExecCheckpoint, ChangedAdamSettingsAreNoted) {
  const std::string dir = testing::temp_dir("adam");
  train_with_checkpoints(scenario(small_toml()), 2, dir);
  TrainOptions options;
  options.steps = 3;
  options.checkpoint_dir = dir;
  std::vector<std::string> notes;
  options.on_note = [&notes](const std::string& note) { notes.push_back(note); };
  const auto resumed =
      train(scenario(small_toml(), {"training.adam_beta1=0.8", "training.adam_beta2=0.99", "training.adam_eps=1e-6"}),
            options);
  EXPECT_EQ(resumed.first_step, 2);
  auto noted = [&notes](const std::string& text) {
    return std::find(notes.begin(), notes.end(), "changed since the checkpoint: " + text) != notes.end();
  };
  EXPECT_TRUE(noted("training.adam_beta1: 0.9 in the checkpoint, 0.8 now")) << ::testing::PrintToString(notes);
  EXPECT_TRUE(noted("training.adam_beta2: 0.95 in the checkpoint, 0.99 now")) << ::testing::PrintToString(notes);
  EXPECT_TRUE(noted("training.adam_eps: 1e-08 in the checkpoint, 1e-06 now")) << ::testing::PrintToString(notes);
  fs::remove_all(dir);
}

#ifdef TWIN_BINARY
// A broken checkpoint is a user's error (exit 2, one line), not an internal one.
TEST(ExecCheckpoint, ABrokenCheckpointIsOneClearLineFromTheCli) {
  const std::string dir = testing::temp_dir("broken-cli");
  const std::string scenario_file = dir + "/small.toml";
  std::ofstream(scenario_file) << small_toml();
  const std::string data = testing::source_dir() + "/data/corpus.txt";
  auto twin_run = [&](const std::string& steps) {
    return std::vector<std::string>{TWIN_BINARY, "run",     scenario_file, "--data",       data,        "--threads",
                                    "1",         "--steps", steps,         "--checkpoint", dir + "/ck", "--quiet"};
  };
  ASSERT_EQ(testing::run_command(twin_run("2"), dir + "/first.log"), 0) << testing::read_text(dir + "/first.log");
  const std::string shard = dir + "/ck/step-00000002/rank-00000.bin";
  fs::remove(shard);
  fs::create_directory(shard);
  EXPECT_EQ(testing::run_command(twin_run("4"), dir + "/resumed.log"), 2);
  EXPECT_EQ(testing::read_text(dir + "/resumed.log"),
            "twin: error: checkpoint file '" + shard + "' is unreadable: it is a directory, not a regular file\n");
  fs::remove_all(dir);
}

// From the command line: a checkpoint of TP 2 resumed under PP 2 is re-sharded, the run says so on stderr and in
// --json, and its losses are the uninterrupted TP 2 run's.
TEST(ExecCheckpoint, TwinRunReshardsAnotherPlansCheckpointAndSaysSo) {
  const std::string dir = testing::temp_dir("reshard-cli");
  const std::string scenario_file = dir + "/small.toml";
  std::ofstream(scenario_file) << small_toml();
  const std::string data = testing::source_dir() + "/data/corpus.txt";
  auto twin_run = [&](const std::string& steps, const std::string& plan, const std::string& checkpoint,
                      const std::string& json) {
    return std::vector<std::string>{TWIN_BINARY, "run",     scenario_file, "--data", data, "--threads",
                                    "1",         "--steps", steps,         "--set",  plan, "--checkpoint",
                                    checkpoint,  "--json",  json};
  };
  ASSERT_EQ(
      testing::run_command(twin_run("6", "parallel.tp=2", dir + "/clean", dir + "/clean.json"), dir + "/clean.log"), 0)
      << testing::read_text(dir + "/clean.log");
  ASSERT_EQ(testing::run_command(twin_run("3", "parallel.tp=2", dir + "/ck", dir + "/first.json"), dir + "/first.log"),
            0)
      << testing::read_text(dir + "/first.log");
  ASSERT_EQ(
      testing::run_command(twin_run("6", "parallel.pp=2", dir + "/ck", dir + "/resumed.json"), dir + "/resumed.log"), 0)
      << testing::read_text(dir + "/resumed.log");
  const std::string log = testing::read_text(dir + "/resumed.log");
  EXPECT_NE(log.find("re-sharded from TP 2 x PP 1 x DP 1 (ZeRO 0) to TP 1 x PP 2 x DP 1 (ZeRO 0)"), std::string::npos)
      << log;
  const auto resumed = nlohmann::json::parse(testing::read_text(dir + "/resumed.json"));
  const auto clean = nlohmann::json::parse(testing::read_text(dir + "/clean.json"));
  EXPECT_TRUE(resumed["resharded"].get<bool>());
  EXPECT_EQ(resumed["first_step"].get<int>(), 3);
  const auto all = clean["losses"].get<std::vector<double>>();
  expect_same_trajectory(resumed["losses"].get<std::vector<double>>(), all, 3);
  fs::remove_all(dir);
}

// A real process killed with SIGKILL in the middle of a run resumes from its last complete checkpoint and produces the
// losses an uninterrupted run produces, bit for bit.
TEST(ExecCheckpoint, SigkillThenResumeGivesTheUninterruptedLosses) {
  const std::string dir = testing::temp_dir("sigkill");
  const std::string scenario_file = dir + "/small.toml";
  std::ofstream(scenario_file) << small_toml();
  const std::string data = testing::source_dir() + "/data/corpus.txt";
  auto command = [&](const std::string& checkpoints, const std::string& json) {
    return std::vector<std::string>{
        TWIN_BINARY, "run",    scenario_file,  "--set",     "parallel.tp=2",      "--steps", "60",
        "--data",    data,     "--checkpoint", checkpoints, "--checkpoint-every", "3",       "--threads",
        "1",         "--json", json,           "--quiet"};
  };
  // 1. killed mid-run, as soon as the checkpoint of step 6 is complete
  testing::Child victim(command(dir + "/killed", dir + "/killed.json"), dir + "/killed.log");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(dir + "/killed/step-00000006/manifest.json") && std::chrono::steady_clock::now() < deadline &&
         victim.running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  victim.kill_now();
  ASSERT_EQ(victim.wait(), 128 + SIGKILL)
      << "the run ended before it could be killed: " << testing::read_text(dir + "/killed.log");
  ASSERT_FALSE(fs::exists(dir + "/killed.json"));
  // 2. resumed to the end
  ASSERT_EQ(testing::run_command(command(dir + "/killed", dir + "/resumed.json"), dir + "/resumed.log"), 0)
      << testing::read_text(dir + "/resumed.log");
  // 3. uninterrupted
  ASSERT_EQ(testing::run_command(command(dir + "/clean", dir + "/clean.json"), dir + "/clean.log"), 0)
      << testing::read_text(dir + "/clean.log");
  const auto resumed = nlohmann::json::parse(testing::read_text(dir + "/resumed.json"));
  const auto clean = nlohmann::json::parse(testing::read_text(dir + "/clean.json"));
  const int first = resumed["first_step"].get<int>();
  EXPECT_FALSE(resumed["resharded"].get<bool>());
  EXPECT_GE(first, 6);
  EXPECT_EQ(first % 3, 0);
  const auto all = clean["losses"].get<std::vector<double>>();
  ASSERT_EQ(all.size(), 60u);
  EXPECT_EQ(resumed["losses"].get<std::vector<double>>(), std::vector<double>(all.begin() + first, all.end()));
  EXPECT_EQ(resumed["earlier_losses"].get<std::vector<double>>(),
            std::vector<double>(all.begin(), all.begin() + first));
  std::printf(
      "[ checkpoint ] killed after step >= 6, resumed at step %d: %zu losses identical to the uninterrupted run\n",
      first, all.size() - static_cast<std::size_t>(first));
  fs::remove_all(dir);
}
#endif

}  // namespace
}  // namespace twin::exec

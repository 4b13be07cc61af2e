// The memory model on published Hopper plans (model/program/estimates.hpp): a plan that trained on 80 GB H100s fits them, the
// Llama 3 405B plan misses only by what ZeRO-1 keeps and Meta's FSDP shards (published.toml's memory_why), and the
// same model at 128K tokens without context parallelism, which the Llama 3 paper splits with CP 16, does not fit by
// more than ten times.
#include <gtest/gtest.h>

#include "model/program/estimates.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

Scenario published(const std::string& file, const std::vector<Override>& overrides = {}) {
  return load_scenario(testing::source_dir() + "/scenarios/published/" + file, overrides);
}

TEST(PublishedMemory, MlperfGpt3PlanFitsItsH100s) {
  // MLPerf Training v4.0, 512 H100 80GB: TP 4, PP 8, 4 virtual stages, micro-batch 2, FP8, no recompute.
  const MemoryEstimate m = estimate_memory(published("mlperf-gpt3-175b-h100.toml"));
  EXPECT_DOUBLE_EQ(m.capacity_bytes, 80 * kGiB);
  EXPECT_TRUE(m.fits) << m.peak_bytes / kGiB << " GiB";
  EXPECT_GT(m.peak_bytes, 0.9 * m.capacity_bytes);  // no recompute at micro-batch 2: the plan fills the GPU
}

TEST(PublishedMemory, Llama3PlanMissesOnlyByTheGradientsFsdpShards) {
  // Meta's FSDP shards the gradients over DP where ZeRO-1 keeps each GPU's whole fp32 copy: with them sharded, every
  // stage of the 8K plan fits 80 GB.
  const Scenario s = published("llama3-405b-meta.toml");
  const MemoryEstimate m = estimate_memory(s);
  EXPECT_FALSE(m.fits);
  const double dp = static_cast<double>(s.parallel.dp);
  ASSERT_EQ(dp, 64);
  for (const StageMemory& stage : m.stages) {
    const double sharded = stage.peak_bytes - stage.gradients_bytes * (1 - 1 / dp);
    EXPECT_LT(sharded, m.capacity_bytes) << "stage " << stage.stage << ": " << sharded / kGiB << " GiB";
  }
  EXPECT_GT(m.peak_bytes, m.capacity_bytes);
}

TEST(PublishedMemory, Llama3At128kTokensWithoutContextParallelismDoesNotFit) {
  const Scenario s = published("llama3-405b-meta.toml", {parse_override("model.seq_len=131072"),
                                                         parse_override("parallel.global_batch=128"),
                                                         parse_override("cluster.nodes=16")});
  const MemoryEstimate m = estimate_memory(s);
  EXPECT_FALSE(m.fits);
  EXPECT_GT(m.peak_bytes, 10 * m.capacity_bytes) << m.peak_bytes / kGiB << " GiB";
}

}  // namespace
}  // namespace twin::model

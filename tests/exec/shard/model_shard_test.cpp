// Parameter shards: every plan draws the same full model from the same seed (Megatron's splits reassembled give the
// single-rank tensors bit for bit), padded vocabulary rows are zero, buckets are laid out as the Program expects.
#include <gtest/gtest.h>

#include <cmath>

#include "exec/cpu/cpu_backend.hpp"
#include "exec/shard/model_shard.hpp"
#include "exec_test_util.hpp"
#include "kernels/cpu/attention.hpp"
#include "model/program/estimates.hpp"
#include "tiny_moe.hpp"

namespace twin::exec {
namespace {

using model::RankCoord;

std::vector<float> values(ModelShard& shard, Backend& backend, const std::string& name) {
  for (Bucket& b : shard.buckets()) {
    for (ParamTensor& t : b.tensors) {
      if (t.name == name && !t.copy) {
        std::vector<float> host(t.numel);
        backend.download_f32(host.data(), t.value);
        return host;
      }
    }
  }
  ADD_FAILURE() << "no tensor " << name;
  return {};
}

struct Shards {
  model::Scenario scenario;
  cpu::CpuBackend backend;
  std::vector<std::unique_ptr<ModelShard>> ranks;  // by tp rank, pp stage 0 and 1 as asked
  Shards(const std::vector<std::string>& sets, int stage) : scenario(testing::scenario(testing::parity_toml(), sets)) {
    for (int tp = 0; tp < scenario.parallel.tp; ++tp) {
      ranks.push_back(std::make_unique<ModelShard>(scenario, RankCoord{0, stage, tp}, backend));
      ranks.back()->initialize(scenario.training.seed);
    }
  }
};

TEST(ExecModelShard, TensorParallelShardsReassembleTheSingleRankModel) {
  Shards one({}, 0), two({"parallel.tp=2"}, 0);
  const int C = 128, F = 512, H = 4, D = 32, t = 2;
  // qkv: local rows (3, H/t, D) of full rows (3, H, D)
  const auto full_qkv = values(*one.ranks[0], one.backend, "layers.2.attn.qkv.weight");
  for (int r = 0; r < t; ++r) {
    const auto local = values(*two.ranks[r], two.backend, "layers.2.attn.qkv.weight");
    ASSERT_EQ(local.size(), full_qkv.size() / t);
    for (int which = 0; which < 3; ++which)
      for (int h = 0; h < H / t; ++h)
        for (int d = 0; d < D; ++d)
          for (int c = 0; c < C; ++c) {
            const std::size_t local_row = (which * (H / t) + h) * D + d,
                              full_row = (which * H + r * (H / t) + h) * D + d;
            ASSERT_EQ(local[local_row * C + c], full_qkv[full_row * C + c]);
          }
  }
  // row-parallel projection: columns; column-parallel fc: rows
  const auto full_proj = values(*one.ranks[0], one.backend, "layers.2.attn.proj.weight");
  const auto full_fc = values(*one.ranks[0], one.backend, "layers.2.mlp.fc.weight");
  const auto full_fc_proj = values(*one.ranks[0], one.backend, "layers.2.mlp.fc_proj.weight");
  for (int r = 0; r < t; ++r) {
    const auto proj = values(*two.ranks[r], two.backend, "layers.2.attn.proj.weight");
    for (int o = 0; o < C; ++o)
      for (int i = 0; i < C / t; ++i) ASSERT_EQ(proj[o * (C / t) + i], full_proj[o * C + r * (C / t) + i]);
    const auto fc = values(*two.ranks[r], two.backend, "layers.2.mlp.fc.weight");
    for (std::size_t k = 0; k < fc.size(); ++k) ASSERT_EQ(fc[k], full_fc[r * fc.size() + k]);
    const auto fc_proj = values(*two.ranks[r], two.backend, "layers.2.mlp.fc_proj.weight");
    for (int o = 0; o < C; ++o)
      for (int i = 0; i < F / t; ++i) ASSERT_EQ(fc_proj[o * (F / t) + i], full_fc_proj[o * F + r * (F / t) + i]);
    // replicated: identical
    EXPECT_EQ(values(*two.ranks[r], two.backend, "wpe"), values(*one.ranks[0], one.backend, "wpe"));
    // vocab-parallel embedding rows
    const auto wte = values(*two.ranks[r], two.backend, "wte");
    const auto full_wte = values(*one.ranks[0], one.backend, "wte");
    for (std::size_t k = 0; k < wte.size(); ++k) ASSERT_EQ(wte[k], full_wte[r * wte.size() + k]);
  }
}

TEST(ExecModelShard, AlibiHoldsNoPositionEmbeddingAndItsOwnHeadsSlopes) {
  Shards learned({"parallel.tp=2"}, 0), alibi({"parallel.tp=2", "model.position_embedding=\"alibi\""}, 0);
  const int H = 4, T = 64, C = 128;
  const std::vector<float> slopes = kernels::cpu::alibi_slopes(H);
  for (int r = 0; r < 2; ++r) {
    ModelShard& shard = *alibi.ranks[r];
    EXPECT_TRUE(shard.wpe.empty());
    EXPECT_TRUE(learned.ranks[r]->alibi_slopes.empty());
    // the embedding bucket is the learned one less the position embedding
    EXPECT_EQ(learned.ranks[r]->bucket(-1, model::ComputeKind::Embedding).numel -
                  shard.bucket(-1, model::ComputeKind::Embedding).numel,
              static_cast<std::size_t>(T * C));
    // rank r's heads are [2r, 2r + 2): their slopes, not the first two
    std::vector<float> local(2);
    ASSERT_EQ(shard.alibi_slopes.numel, local.size());
    alibi.backend.download_f32(local.data(), shard.alibi_slopes);
    EXPECT_EQ(local, std::vector<float>(slopes.begin() + 2 * r, slopes.begin() + 2 * r + 2)) << "tp rank " << r;
  }
  // and the word embedding is drawn as before
  EXPECT_EQ(values(*alibi.ranks[1], alibi.backend, "wte"), values(*learned.ranks[1], learned.backend, "wte"));
}

TEST(ExecModelShard, PipelineStagesHoldTheSameLayersAsOneStage) {
  Shards one({}, 0), later({"parallel.pp=2"}, 1);
  EXPECT_TRUE(later.ranks[0]->has_layer(5));
  EXPECT_FALSE(later.ranks[0]->has_layer(2));
  EXPECT_EQ(values(*later.ranks[0], later.backend, "layers.5.mlp.fc.weight"),
            values(*one.ranks[0], one.backend, "layers.5.mlp.fc.weight"));
  // the last stage's copy of the tied word embedding equals the first stage's embedding
  std::vector<float> copy;
  for (Bucket& b : later.ranks[0]->buckets()) {
    for (ParamTensor& t : b.tensors) {
      if (t.name == "wte" && t.copy) {
        copy.resize(t.numel);
        later.backend.download_f32(copy.data(), t.value);
      }
    }
  }
  EXPECT_EQ(copy, values(*one.ranks[0], one.backend, "wte"));
}

TEST(ExecModelShard, UnevenStagesHoldTheirOwnCounts) {
  // 8 layers as 1 + 3 + 3 + 1 (parallel.first_stage_layers / last_stage_layers): stage 1 holds layers 1..3.
  const std::vector<std::string> uneven{"parallel.pp=4", "parallel.first_stage_layers=1",
                                        "parallel.last_stage_layers=1"};
  Shards first(uneven, 0), second(uneven, 1), last(uneven, 3);
  EXPECT_TRUE(first.ranks[0]->has_layer(0));
  EXPECT_FALSE(first.ranks[0]->has_layer(1));
  for (int layer = 1; layer <= 3; ++layer) EXPECT_TRUE(second.ranks[0]->has_layer(layer)) << layer;
  EXPECT_FALSE(second.ranks[0]->has_layer(4));
  EXPECT_TRUE(last.ranks[0]->has_layer(7));
  EXPECT_FALSE(last.ranks[0]->has_layer(6));
}

TEST(ExecModelShard, PaddedVocabularyRowsAreZero) {
  Shards shards({"model.vocab=300", "parallel.tp=2"}, 0);  // padded to 512: 256 rows per rank
  const auto last = values(*shards.ranks[1], shards.backend, "wte");
  const int C = 128;
  ASSERT_EQ(last.size(), 256u * C);
  for (int row = 0; row < 256; ++row) {
    const bool padding = 256 + row >= 300;
    bool all_zero = true;
    for (int c = 0; c < C; ++c) all_zero = all_zero && last[row * C + c] == 0.0f;
    EXPECT_EQ(all_zero, padding) << "row " << 256 + row;
  }
}

TEST(ExecModelShard, BucketsHoldWhatTheProgramCounts) {
  const auto s = testing::scenario(testing::parity_toml(), {"parallel.tp=2", "parallel.pp=2"});
  cpu::CpuBackend backend;
  ModelShard shard(s, RankCoord{0, 0, 1}, backend);
  EXPECT_EQ(static_cast<double>(shard.bucket(0, model::ComputeKind::TransformerLayer).numel),
            model::layer_parameters_per_gpu(s));
  double total = 0;
  for (const Bucket& b : shard.buckets()) total += static_cast<double>(b.numel);
  EXPECT_EQ(total, model::parameters_per_gpu(s, 0));
  ModelShard last(s, RankCoord{0, 1, 1}, backend);
  total = 0;
  for (const Bucket& b : last.buckets()) total += static_cast<double>(b.numel);
  EXPECT_EQ(total, model::parameters_per_gpu(s, 1));
}

TEST(ExecModelShard, LlamaShardsReassembleTheSingleRankModel) {
  const std::vector<std::string> llama = {
      "model.norm=\"rmsnorm\"", "model.activation=\"swiglu\"", "model.position_embedding=\"rope\"",
      "model.kv_heads=2",       "model.linear_bias=false",     "framework.tied_embeddings=false"};
  std::vector<std::string> tp2 = llama;
  tp2.push_back("parallel.tp=2");
  Shards one(llama, 0), two(tp2, 0);
  const int C = 128, F = 512, H = 4, KV = 2, D = 32, t = 2;
  // qkv: full rows (H D | KV D | KV D); each rank keeps its H/t query heads and its KV/t key/value heads of each
  const auto full_qkv = values(*one.ranks[0], one.backend, "layers.1.attn.qkv.weight");
  ASSERT_EQ(full_qkv.size(), std::size_t(H + 2 * KV) * D * C);
  for (int r = 0; r < t; ++r) {
    const auto local = values(*two.ranks[r], two.backend, "layers.1.attn.qkv.weight");
    ASSERT_EQ(local.size(), full_qkv.size() / t);
    const int q_local = H / t * D, kv_local = KV / t * D;
    for (int row = 0; row < q_local + 2 * kv_local; ++row) {
      const int full_row =
          row < q_local ? r * q_local + row
                        : H * D + (row - q_local) / kv_local * KV * D + r * kv_local + (row - q_local) % kv_local;
      for (int c = 0; c < C; ++c) ASSERT_EQ(local[row * C + c], full_qkv[full_row * C + c]) << "row " << row;
    }
    // fc: full rows [gate (F) | up (F)]; each rank keeps its F/t rows of both halves, gate first
    const auto full_fc = values(*one.ranks[0], one.backend, "layers.1.mlp.fc.weight");
    const auto fc = values(*two.ranks[r], two.backend, "layers.1.mlp.fc.weight");
    ASSERT_EQ(fc.size(), std::size_t(2 * F / t) * C);
    for (int half = 0; half < 2; ++half)
      for (int i = 0; i < F / t; ++i)
        for (int c = 0; c < C; ++c)
          ASSERT_EQ(fc[(half * (F / t) + i) * C + c], full_fc[(half * F + r * (F / t) + i) * C + c]);
  }
  // RMSNorm has a weight and no bias, and there are no linear biases nor a position embedding.
  for (const Bucket& b : two.ranks[0]->buckets()) {
    for (const ParamTensor& tensor : b.tensors) {
      EXPECT_EQ(tensor.name.find("bias"), std::string::npos) << tensor.name;
      EXPECT_NE(tensor.name, "wpe");
    }
  }
  EXPECT_EQ(static_cast<double>(two.ranks[1]->bucket(0, model::ComputeKind::TransformerLayer).numel),
            model::layer_parameters_per_gpu(two.scenario));
}

TEST(ExecModelShard, ZeroOneShardsPartitionEachBucket) {
  const auto s = testing::scenario(testing::parity_toml(), {"parallel.dp=3", "parallel.zero_stage=1",
                                                            "parallel.global_batch=9", "parallel.micro_batch=3"});
  cpu::CpuBackend backend;
  std::size_t covered = 0, padded = 0;
  for (int dp = 0; dp < 3; ++dp) {
    ModelShard shard(s, RankCoord{dp, 0, 0}, backend);
    const Bucket& b = shard.bucket(-1, model::ComputeKind::Embedding);
    EXPECT_EQ(b.shard_offset, b.shard_numel * static_cast<std::size_t>(dp));
    EXPECT_EQ(b.adam_m.numel, b.shard_numel);
    covered += b.shard_numel;
    padded = b.padded_numel;
  }
  EXPECT_EQ(covered, padded);
}

TEST(ExecModelShard, ZeroThreeHoldsOnlyItsOwnShardOfTheParameters) {
  // dp 3 divides no bucket: each rank's shard is a third of the padded bucket, the last one ending in zero padding.
  const auto sharded = testing::scenario(testing::parity_toml(), {"framework.name=\"composer\"", "parallel.dp=3",
                                                                  "parallel.zero_stage=3", "parallel.global_batch=9"});
  const auto whole = testing::scenario(testing::parity_toml(), {"parallel.global_batch=9"});
  cpu::CpuBackend backend;
  ModelShard one(whole, RankCoord{0, 0, 0}, backend);
  one.initialize(whole.training.seed);
  for (int dp = 0; dp < 3; ++dp) {
    ModelShard shard(sharded, RankCoord{dp, 0, 0}, backend);
    shard.initialize(sharded.training.seed);
    for (std::size_t i = 0; i < shard.buckets().size(); ++i) {
      const Bucket& b = shard.buckets()[i];
      const Bucket& reference = one.buckets()[i];
      ASSERT_EQ(b.name, reference.name);
      EXPECT_TRUE(b.parameters_sharded);
      EXPECT_TRUE(b.other_shards_freed);
      EXPECT_EQ(b.shard_numel * 3, b.padded_numel);
      std::vector<float> params(b.padded_numel), expected(reference.numel);
      backend.download_f32(params.data(), b.params);
      backend.download_f32(expected.data(), reference.params);
      std::size_t mismatched = 0, held = 0;
      for (std::size_t k = 0; k < b.padded_numel; ++k) {
        const bool mine = k >= b.shard_offset && k < b.shard_offset + b.shard_numel;
        if (!mine) {
          mismatched += !std::isnan(params[k]);  // freed: another rank's
        } else {
          mismatched += params[k] != (k < b.numel ? expected[k] : 0.0f);  // the single-rank draw, then padding
          ++held;
        }
      }
      EXPECT_EQ(mismatched, 0u) << b.name << " on dp rank " << dp;
      EXPECT_EQ(held, b.shard_numel);
    }
  }
  // ZeRO-1 keeps every parameter (it gathers them after each step)
  const auto zero_one = testing::scenario(testing::parity_toml(), {"parallel.dp=2", "parallel.zero_stage=1"});
  ModelShard zero_one_shard(zero_one, RankCoord{1, 0, 0}, backend);
  for (const Bucket& b : zero_one_shard.buckets()) EXPECT_FALSE(b.parameters_sharded) << b.name;
}

// Dims and MoeDims are views of model::RankShapes and of the plan's rank layout, context parallelism included: with cp
// = 2, dp = 2 and ep = 2 the expert grid has edp = tp cp dp / (etp ep) = 2, and rank 3 (cp 1, dp 1) is EP rank 1 (a
// layout built with cp = 1 put it at EP rank 0 with edp = 1).
TEST(ExecModelShard, DimsAndMoeDimsViewTheRankShapesAndTheWholeLayout) {
  const model::Scenario s = testing::scenario(
      testing::tiny_moe_toml(),
      {"parallel.cp=2", "parallel.dp=2", "parallel.ep=2", "framework.attention=\"flash2\"", "model.kv_heads=2"});
  const model::RankShapes shapes = model::rank_shapes(s);
  const model::RankLayout layout = model::rank_layout(s);
  ASSERT_EQ(layout.world_size(), 4);
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    const RankCoord coord = layout.coord_of(rank);
    const Dims dims(s, shapes, coord.tp, coord.cp);
    EXPECT_EQ(dims.seq, 16);  // 32 tokens over cp 2
    EXPECT_EQ(dims.tokens, shapes.tokens);
    EXPECT_EQ(dims.kv_heads_local, 2);
    EXPECT_EQ(dims.qkv_local, (4 + 2 * 2) * 16);
    const MoeDims moe(s, shapes, coord);
    const model::ExpertCoord expert = layout.expert_coord_of(rank);
    EXPECT_EQ(moe.edp, 2);
    EXPECT_EQ(moe.ep_rank, expert.ep) << "rank " << rank;
    EXPECT_EQ(moe.edp_rank, expert.edp) << "rank " << rank;
    EXPECT_EQ(moe.local_experts, 2);
    EXPECT_EQ(moe.expert_ffn, 96);
    EXPECT_EQ(moe.shared_up, 96);
  }
  EXPECT_EQ(MoeDims(s, shapes, layout.coord_of(3)).ep_rank, 1);
}

}  // namespace
}  // namespace twin::exec

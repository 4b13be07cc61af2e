// Parity: every plan trains the same model on the same global batches, so its per-step losses equal the single-rank
// run's (up to the order of floating-point sums): 8 layers, hidden 128, 4 heads, seq 64, global batch 8, 5 steps.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

using testing::parity_toml;
using testing::scenario;
using testing::train;

constexpr int kParitySteps = 5;
constexpr double kRelativeTolerance = 1e-5;

const TrainResult& reference_run() {
  static const TrainResult result = [] {
    TrainOptions options;
    options.steps = kParitySteps;
    return train(scenario(parity_toml()), options);
  }();
  return result;
}

const std::vector<double>& reference_losses() {
  return reference_run().losses;
}

using testing::Plan;

class ExecParityTest : public ::testing::TestWithParam<Plan> {};

TEST_P(ExecParityTest, LossesEqualTheSingleRankRun) {
  const Plan& plan = GetParam();
  TrainOptions options;
  options.steps = kParitySteps;
  options.comm_timeout_s = 120;
  const TrainResult result = train(scenario(parity_toml(), plan.sets), options);
  const std::vector<double>& losses = result.losses;
  const std::vector<double>& expected = reference_losses();
  ASSERT_EQ(losses.size(), expected.size());
  double worst = 0;
  for (std::size_t i = 0; i < losses.size(); ++i) {
    const double relative = std::abs(losses[i] - expected[i]) / std::abs(expected[i]);
    worst = std::max(worst, relative);
    EXPECT_LE(relative, kRelativeTolerance) << plan.name << " step " << i << ": " << losses[i] << " vs " << expected[i];
  }
  // The gradient norm before clipping too: with clipping at every step (norms above grad_clip 1.0), a gradient off by
  // a global factor trains to the same losses (ExecGradientParity compares each parameter's gradient).
  const std::vector<double>& norms = reference_run().grad_norms;
  ASSERT_EQ(result.grad_norms.size(), norms.size());
  for (std::size_t i = 0; i < norms.size(); ++i) {
    EXPECT_GT(norms[i], 1.0) << "step " << i << ": clipping is not active, the comment above is stale";
    // 1e-4: the fifth step's norm (32, a steep spot) is the most sensitive to the order of fp32 sums (TP plans: 1.2e-5)
    EXPECT_NEAR(result.grad_norms[i], norms[i], 1e-4 * norms[i]) << plan.name << " step " << i;
  }
  std::printf("[ parity ] %-34s losses %.7f %.7f %.7f %.7f %.7f   max relative difference %.1e\n", plan.name, losses[0],
              losses[1], losses[2], losses[3], losses[4], worst);
}

INSTANTIATE_TEST_SUITE_P(
    Plans, ExecParityTest,
    ::testing::Values(
        Plan{"tp2", {"parallel.tp=2"}}, Plan{"pp2", {"parallel.pp=2"}}, Plan{"dp2", {"parallel.dp=2"}},
        Plan{"tp2_pp2_dp2", {"parallel.tp=2", "parallel.pp=2", "parallel.dp=2"}},
        Plan{"pp4_interleaved_v2", {"parallel.pp=4", "parallel.virtual_stages=2", "parallel.schedule=\"interleaved\""}},
        Plan{"dp2_zero1", {"parallel.dp=2", "parallel.zero_stage=1"}},
        Plan{"tp2_pp2_dp2_zero1", {"parallel.tp=2", "parallel.pp=2", "parallel.dp=2", "parallel.zero_stage=1"}},
        Plan{"pp2_dp2_zero1_overlap_param_gather",
             {"parallel.pp=2", "parallel.dp=2", "parallel.zero_stage=1", "parallel.dp_overlap=true",
              "parallel.overlap_param_gather=true"}},
        Plan{"pp2_v2_dp2_zero1_overlap_param_gather",
             {"parallel.pp=2", "parallel.virtual_stages=2", "parallel.schedule=\"interleaved\"", "parallel.dp=2",
              "parallel.zero_stage=1", "parallel.dp_overlap=true", "parallel.overlap_param_gather=true"}},
        Plan{"tp2_sequence_parallel", {"parallel.tp=2", "parallel.sequence_parallel=true"}},
        // Llama 3's pipeline: the embedding and the loss counted as layers (10 over 2 x 5 chunks: the first and last
        // chunk hold no transformer layer), micro-batches in groups of 3 (8 is no multiple of it), lighter end
        // stages under interleaving
        Plan{"pp2_v5_embedding_and_loss_as_layers",
             {"parallel.pp=2", "parallel.virtual_stages=5", "parallel.schedule=\"interleaved\"",
              "parallel.account_for_embedding=true", "parallel.account_for_loss=true"}},
        Plan{"pp2_v2_microbatch_group_3",
             {"parallel.pp=2", "parallel.virtual_stages=2", "parallel.schedule=\"interleaved\"",
              "parallel.microbatch_group=3"}},
        Plan{"pp4_v2_lighter_end_stages",
             {"parallel.pp=4", "parallel.virtual_stages=2", "parallel.schedule=\"interleaved\"",
              "parallel.first_stage_layers=2", "parallel.last_stage_layers=2"}},
        Plan{"recompute_full", {"parallel.recompute=\"full\""}},
        Plan{"recompute_selective", {"parallel.recompute=\"selective\""}},
        // Megatron's block recompute: of each chunk's 2 layers only the first runs forward again
        Plan{"pp2_v2_recompute_block_1_of_2",
             {"parallel.pp=2", "parallel.virtual_stages=2", "parallel.schedule=\"interleaved\"",
              "parallel.recompute=\"full\"", "parallel.recompute_num_layers=1"}},
        // DeepSpeed's full recompute also runs the embedding, final layer norm and LM head again before their backward
        Plan{"deepspeed_tp2_pp2_recompute_full",
             {"framework.name=\"deepspeed\"", "parallel.tp=2", "parallel.pp=2", "parallel.recompute=\"full\""}},
        // DeepSpeed's partition_activations: each layer keeps half its input, gathered across TP before the recompute
        Plan{"deepspeed_tp2_pp2_partition_activations",
             {"framework.name=\"deepspeed\"", "parallel.tp=2", "parallel.pp=2", "parallel.recompute=\"full\"",
              "framework.partition_activations=true"}},
        // DeepSpeed's ZeRO-1 all-reduces the whole gradient, then each rank updates its partition
        Plan{"deepspeed_tp2_pp2_dp2_zero1",
             {"framework.name=\"deepspeed\"", "parallel.tp=2", "parallel.pp=2", "parallel.dp=2",
              "parallel.zero_stage=1"}},
        Plan{"pp2_gpipe", {"parallel.pp=2", "parallel.schedule=\"gpipe\""}},
        // ZB-H1: each backward's B now, the linear layers' W deferred (4 stages: stage s defers s of them)
        // (the gradient reductions after each chunk's last W, under the backward with dp_overlap)
        Plan{"pp4_dp2_zero1_zb_h1_dp_overlap_recompute_full",
             {"parallel.pp=4", "parallel.dp=2", "parallel.zero_stage=1", "parallel.dp_overlap=true",
              "parallel.schedule=\"zb-h1\"", "parallel.recompute=\"full\""}},
        // ZB-V: two chunks per stage in a V (stage 0 holds both ends, the last stage passes the turn to itself)
        Plan{"pp2_v2_zb_v", {"parallel.pp=2", "parallel.virtual_stages=2", "parallel.schedule=\"zb-v\""}},
        Plan{"tp2_sp_pp2_v2_dp2_zero1_zb_v_dp_overlap",
             {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.pp=2", "parallel.virtual_stages=2",
              "parallel.dp=2", "parallel.zero_stage=1", "parallel.dp_overlap=true", "parallel.schedule=\"zb-v\""}},
        // DualPipeV on the same V: 4 micro-batches (2 pp), whole backwards where it enables no zero bubble
        Plan{"pp2_v2_dualpipev", {"parallel.pp=2", "parallel.virtual_stages=2", "parallel.schedule=\"dualpipev\""}},
        // DualPipe: two copies of the model, half the micro-batches down through chunk 0, half up through chunk 1,
        // the copies' gradients summed over (s, pp - 1 - s); both stages of pp 2 hold the tied embedding as one
        // direction's embedding and the other's head
        Plan{"pp2_v2_dualpipe", {"parallel.pp=2", "parallel.virtual_stages=2", "parallel.schedule=\"dualpipe\""}},
        Plan{"pp4_v2_dualpipe", {"parallel.pp=4", "parallel.virtual_stages=2", "parallel.schedule=\"dualpipe\""}},
        // Each direction's blocks 1, 2, 2, 3 layers: stage 0 holds the down block of 1 and the up block of 3.
        Plan{"pp4_v2_dualpipe_uneven_1_2_2_3",
             {"parallel.pp=4", "parallel.virtual_stages=2", "parallel.schedule=\"dualpipe\"",
              "parallel.first_stage_layers=1", "parallel.last_stage_layers=3"}},
        Plan{"tp2_sp_pp2_v2_dp2_zero1_dualpipe_dp_overlap",
             {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.pp=2", "parallel.virtual_stages=2",
              "parallel.dp=2", "parallel.zero_stage=1", "parallel.dp_overlap=true", "parallel.schedule=\"dualpipe\""}},
        // lighter end stages: 1 + 3 + 3 + 1 of the 8 layers
        Plan{"pp4_uneven_1_3_3_1", {"parallel.pp=4", "parallel.first_stage_layers=1", "parallel.last_stage_layers=1"}},
        Plan{"micro_batch4", {"parallel.micro_batch=4"}},
        Plan{"everything_at_once",
             {"parallel.tp=2", "parallel.pp=2", "parallel.dp=2", "parallel.sequence_parallel=true",
              "parallel.zero_stage=1", "parallel.recompute=\"full\"", "parallel.dp_overlap=true"}},
        Plan{"padded_vocabulary_512", {"parallel.vocab_pad_multiple=512"}},
        // Composer's FSDP FULL_SHARD: every layer gathered before its forward and again before its backward, freed
        // after each, its gradient reduce-scattered after every micro-batch (dp 2: 4 micro-batches a rank, dp 4: 2)
        Plan{"composer_dp2_zero3", {"framework.name=\"composer\"", "parallel.dp=2", "parallel.zero_stage=3"}},
        Plan{"composer_dp4_zero3", {"framework.name=\"composer\"", "parallel.dp=4", "parallel.zero_stage=3"}},
        Plan{"composer_dp2_zero3_recompute_full",
             {"framework.name=\"composer\"", "parallel.dp=2", "parallel.zero_stage=3", "parallel.recompute=\"full\""}},
        Plan{"composer_dp4_zero3_recompute_full",
             {"framework.name=\"composer\"", "parallel.dp=4", "parallel.zero_stage=3", "parallel.recompute=\"full\""}},
        // 2 micro-batches of 2 sequences a rank: the reduce-scatters accumulate over larger micro-batches
        Plan{"composer_dp2_zero3_micro_batch2",
             {"framework.name=\"composer\"", "parallel.dp=2", "parallel.zero_stage=3", "parallel.micro_batch=2"}},
        // Composer without sharding: PyTorch DDP, its bucket all-reduces under the backward
        Plan{"composer_dp2_ddp", {"framework.name=\"composer\"", "parallel.dp=2", "parallel.dp_overlap=true"}}),
    [](const ::testing::TestParamInfo<Plan>& plan_info) { return std::string(plan_info.param.name); });

TEST(ExecParity, SingleRankLossesStartNearLogVocabularyAndFall) {
  const std::vector<double>& losses = reference_losses();
  std::printf("[ parity ] %-34s losses %.7f %.7f %.7f %.7f %.7f\n", "reference (1 rank)", losses[0], losses[1],
              losses[2], losses[3], losses[4]);
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.3);
  EXPECT_LT(losses.back(), losses.front());
}

TEST(ExecParity, AlibiAgreesAcrossPlansAndIsAnotherModel) {
  // ALiBi's slopes belong to the global heads: with tp 4 each rank holds one head of the 4, and a rank using its
  // local index would give every head the first slope. And no position embedding: it is not the learned model.
  TrainOptions options;
  options.steps = 3;
  const std::string alibi = "model.position_embedding=\"alibi\"";
  const auto one = train(scenario(parity_toml(), {alibi}), options).losses;
  ASSERT_EQ(one.size(), 3u);
  for (const auto& plan :
       std::vector<std::vector<std::string>>{{alibi, "parallel.tp=4"},
                                             {alibi, "parallel.tp=2", "parallel.pp=2", "parallel.dp=2",
                                              "parallel.sequence_parallel=true", "parallel.recompute=\"full\""}}) {
    const auto many = train(scenario(parity_toml(), plan), options).losses;
    ASSERT_EQ(many.size(), one.size());
    for (std::size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(many[i], one[i], kRelativeTolerance * one[i]) << plan[1];
  }
  const std::vector<double>& learned = reference_losses();
  EXPECT_GT(std::abs(one[2] - learned[2]), 1e-4) << "ALiBi trained the learned-position model";
}

TEST(ExecParity, ZeroThreeWithPaddedShardsAndUntiedEmbeddingsAgrees) {
  // dp 3 does not divide the buckets (a layer's 198272 parameters, the head's 256): the last rank's shard ends in
  // padding. Untied, the LM head has its own weight in the head bucket, gathered with the final layer norm.
  TrainOptions options;
  options.steps = 3;
  for (const std::vector<std::string>& model : std::vector<std::vector<std::string>>{
           {"parallel.global_batch=6"}, {"parallel.global_batch=6", "framework.tied_embeddings=false"}}) {
    const auto one = train(scenario(parity_toml(), model), options).losses;
    std::vector<std::string> sharded = model;
    sharded.insert(sharded.end(), {"framework.name=\"composer\"", "parallel.dp=3", "parallel.zero_stage=3"});
    const auto many = train(scenario(parity_toml(), sharded), options).losses;
    ASSERT_EQ(one.size(), many.size());
    for (std::size_t i = 0; i < one.size(); ++i)
      EXPECT_NEAR(many[i], one[i], kRelativeTolerance * one[i]) << model.back();
  }
}

TEST(ExecParity, UntiedEmbeddingsAgreeAcrossPlans) {
  TrainOptions options;
  options.steps = 3;
  const auto one = train(scenario(parity_toml(), {"framework.tied_embeddings=false"}), options).losses;
  const auto many =
      train(scenario(parity_toml(), {"framework.tied_embeddings=false", "parallel.tp=2", "parallel.pp=2"}), options)
          .losses;
  ASSERT_EQ(one.size(), many.size());
  for (std::size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(many[i], one[i], kRelativeTolerance * one[i]);
}

TEST(ExecParity, LlamaBlocksAgreeAcrossPlansAndAreAnotherModel) {
  // RMSNorm, SwiGLU (the fc's gate and up halves split across TP rank by rank), rotary embeddings, 2 key/value heads
  // for 4 query heads (with tp 2: one per rank, shared by its two query heads), no biases, untied embeddings.
  TrainOptions options;
  options.steps = 3;
  const std::vector<std::string> llama = {
      "model.norm=\"rmsnorm\"", "model.activation=\"swiglu\"", "model.position_embedding=\"rope\"",
      "model.kv_heads=2",       "model.linear_bias=false",     "framework.tied_embeddings=false"};
  const auto one = train(scenario(parity_toml(), llama), options).losses;
  ASSERT_EQ(one.size(), 3u);
  for (const auto& plan : std::vector<std::vector<std::string>>{
           {"parallel.tp=2", "parallel.pp=2", "parallel.dp=2"},
           {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.recompute=\"selective\"", "parallel.dp=2",
            "parallel.zero_stage=1"},
           {"parallel.tp=2", "parallel.pp=2", "parallel.recompute=\"full\"", "parallel.schedule=\"interleaved\"",
            "parallel.virtual_stages=2", "parallel.global_batch=8", "parallel.micro_batch=2"}}) {
    std::vector<std::string> sets = llama;
    sets.insert(sets.end(), plan.begin(), plan.end());
    const auto many = train(scenario(parity_toml(), sets), options).losses;
    ASSERT_EQ(many.size(), one.size());
    for (std::size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(many[i], one[i], kRelativeTolerance * one[i]) << plan[1];
  }
  const std::vector<double>& gpt = reference_losses();
  EXPECT_GT(std::abs(one[2] - gpt[2]), 1e-4) << "the Llama-style keys trained the GPT-2 block";
  EXPECT_LT(one.back(), one.front());
}

TEST(ExecParity, ParallelBlocksAgreeAcrossPlansAndAreAnotherModel) {
  // GPT-NeoX's block: attention and MLP in parallel (one TP all-reduce of both branches' partial sums forward, two
  // backward, both layer norms on the layer input), rotary embeddings on a quarter of each head (8 of 32 dimensions),
  // untied embeddings. With tp 2 a branch reduced alone, or a bias added on every rank before the reduction, would not
  // give the single-rank losses.
  TrainOptions options;
  options.steps = 3;
  const std::string parallel = "model.parallel_residual=true";
  const std::vector<std::string> neox = {parallel, "model.position_embedding=\"rope\"", "model.rotary_fraction=0.25",
                                         "framework.tied_embeddings=false"};
  const auto one = train(scenario(parity_toml(), neox), options).losses;
  ASSERT_EQ(one.size(), 3u);
  for (const auto& plan : std::vector<std::vector<std::string>>{
           {"parallel.tp=2", "parallel.pp=2", "parallel.dp=2"},
           {"parallel.tp=4", "parallel.recompute=\"selective\"", "parallel.dp=2", "parallel.zero_stage=1"},
           {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.pp=2", "parallel.recompute=\"full\""},
           {"parallel.tp=2", "parallel.pp=2", "parallel.recompute=\"full\"", "parallel.schedule=\"interleaved\"",
            "parallel.virtual_stages=2", "parallel.global_batch=8", "parallel.micro_batch=2"},
           {"parallel.tp=2", "parallel.pp=2", "framework.name=\"deepspeed\"", "parallel.recompute=\"full\""}}) {
    std::vector<std::string> sets = neox;
    sets.insert(sets.end(), plan.begin(), plan.end());
    const auto many = train(scenario(parity_toml(), sets), options).losses;
    ASSERT_EQ(many.size(), one.size());
    for (std::size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(many[i], one[i], kRelativeTolerance * one[i]) << plan[0];
  }
  std::vector<std::string> sequential = neox, whole_rotary = neox;
  sequential[0] = "model.parallel_residual=false";
  whole_rotary[2] = "model.rotary_fraction=1";
  const auto sequential_losses = train(scenario(parity_toml(), sequential), options).losses;
  const auto whole_rotary_losses = train(scenario(parity_toml(), whole_rotary), options).losses;
  EXPECT_GT(std::abs(one[2] - sequential_losses[2]), 1e-4) << "model.parallel_residual trained the sequential block";
  EXPECT_GT(std::abs(one[2] - whole_rotary_losses[2]), 1e-5) << "model.rotary_fraction changed nothing";

  // PaLM's block: one layer norm for both branches (so one TP reduction of both input gradients), SwiGLU, rotary
  // embeddings, 2 key/value heads, no biases.
  const std::vector<std::string> palm = {parallel,
                                         "model.shared_norm=true",
                                         "model.activation=\"swiglu\"",
                                         "model.position_embedding=\"rope\"",
                                         "model.kv_heads=2",
                                         "model.linear_bias=false",
                                         "framework.tied_embeddings=false"};
  const auto palm_one = train(scenario(parity_toml(), palm), options).losses;
  for (const auto& plan : std::vector<std::vector<std::string>>{
           {"parallel.tp=2", "parallel.pp=2", "parallel.dp=2"},
           {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.recompute=\"full\"", "parallel.dp=2"}}) {
    std::vector<std::string> sets = palm;
    sets.insert(sets.end(), plan.begin(), plan.end());
    const auto many = train(scenario(parity_toml(), sets), options).losses;
    ASSERT_EQ(many.size(), palm_one.size());
    for (std::size_t i = 0; i < palm_one.size(); ++i) {
      EXPECT_NEAR(many[i], palm_one[i], kRelativeTolerance * palm_one[i]) << "shared norm, " << plan[0];
    }
  }
  EXPECT_LT(one.back(), one.front());
}

}  // namespace
}  // namespace twin::exec

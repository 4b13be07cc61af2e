// The [framework] keys that change what work is done (dropout, kernel fusion, TP overlap, gradient accumulation
// fusion), their effect on the Program's bytes, and the published scenarios (scenarios/published/) loading.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "model/program/estimates.hpp"
#include "model/program/program.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

using testing::bytes_of;
using ::testing::Contains;
using ::testing::HasSubstr;
using testing::problems_of;

constexpr const char* kBase = R"(
[model]
name = "small"
layers = 4
hidden = 1024
heads = 16
seq_len = 1024
vocab = 1000
dtype = "fp16"

[parallel]
tp = 2
pp = 2
micro_batch = 2
global_batch = 16

[cluster]
nodes = 1
node = "dgx-a100"
)";

TEST(FrameworkKeys, DefaultsAreMegatronOf2021) {
  const Scenario s = parse_scenario(kBase, "case.toml");
  EXPECT_TRUE(s.framework.dropout);
  EXPECT_TRUE(s.framework.fused_kernels);
  EXPECT_FALSE(s.framework.tp_comm_overlap);
  EXPECT_FALSE(s.framework.gradient_accumulation_fusion);
  EXPECT_TRUE(s.framework.pipeline_gather_copies);
}

TEST(FrameworkKeys, SequenceParallelismBringsMegatron2022Defaults) {
  // The key goes in [parallel], before kBase's [cluster].
  std::string text = kBase;
  text.insert(text.find("[cluster]"), "sequence_parallel = true\n");
  const Scenario s = parse_scenario(text, "case.toml");
  EXPECT_TRUE(s.parallel.sequence_parallel);
  EXPECT_TRUE(s.framework.tp_comm_overlap);
  EXPECT_TRUE(s.framework.gradient_accumulation_fusion);
  // A key the scenario sets wins, whatever the order of the sections.
  const Scenario explicit_off = parse_scenario(
      "[framework]\ntp_comm_overlap = false\ngradient_accumulation_fusion = false\n" + text, "case.toml");
  EXPECT_FALSE(explicit_off.framework.tp_comm_overlap);
  EXPECT_FALSE(explicit_off.framework.gradient_accumulation_fusion);
  // And --set turns sequence parallelism on with the same defaults.
  const Scenario overridden = parse_scenario(kBase, "case.toml", {parse_override("parallel.sequence_parallel=true")});
  EXPECT_TRUE(overridden.framework.tp_comm_overlap);
}

TEST(FrameworkKeys, ParseAndRoundTrip) {
  const Scenario s = parse_scenario(std::string(kBase) + R"(
[framework]
name = "deepspeed"
dropout = false
fused_kernels = false
tp_comm_overlap = true
gradient_accumulation_fusion = true
pipeline_gather_copies = false
)",
                                    "case.toml");
  EXPECT_FALSE(s.framework.dropout);
  EXPECT_FALSE(s.framework.fused_kernels);
  EXPECT_TRUE(s.framework.tp_comm_overlap);
  EXPECT_TRUE(s.framework.gradient_accumulation_fusion);
  EXPECT_FALSE(s.framework.pipeline_gather_copies);
  const Scenario again = parse_scenario(to_toml(s), "again.toml");
  EXPECT_EQ(to_toml(again), to_toml(s));
  EXPECT_TRUE(again.framework.tp_comm_overlap);
  EXPECT_FALSE(again.framework.pipeline_gather_copies);
}

TEST(FrameworkKeys, Bf16OptimizerIsDeepSpeedsWithBf16AndZero1) {
  std::string deepspeed = kBase;
  deepspeed.replace(deepspeed.find("dtype = \"fp16\""), 14, "dtype = \"bf16\"");
  deepspeed.insert(deepspeed.find("[cluster]"), "zero_stage = 1\n");
  deepspeed += "[framework]\nname = \"deepspeed\"\nbf16_optimizer = true\n";
  const Scenario s = parse_scenario(deepspeed, "case.toml");
  EXPECT_TRUE(s.framework.bf16_optimizer);
  EXPECT_TRUE(parse_scenario(to_toml(s), "again.toml").framework.bf16_optimizer);
  EXPECT_FALSE(parse_scenario(kBase, "case.toml").framework.bf16_optimizer);
  // Each rule it breaks is named.
  std::string megatron_fp16 = std::string(kBase) + "[framework]\nbf16_optimizer = true\n";
  const auto problems = problems_of(megatron_fp16);
  ASSERT_EQ(problems.size(), 3u);
  EXPECT_THAT(problems[0], HasSubstr("framework.bf16_optimizer is DeepSpeed's"));
  EXPECT_THAT(problems[1], HasSubstr("model.dtype must be \"bf16\", got \"fp16\""));
  EXPECT_THAT(problems[2], HasSubstr("parallel.zero_stage must be 1, got 0"));
}

TEST(FrameworkKeys, DeepSpeedVersionNamesTheReleaseWhoseEngineRan) {
  const std::string deepspeed = std::string(kBase) + "[framework]\nname = \"deepspeed\"\n";
  // Not given: the engine of v0.5 (2021), whole gradients between stages, the activation first in a step.
  const Scenario plain = parse_scenario(deepspeed, "case.toml");
  EXPECT_EQ(deepspeed_release(plain.framework), (std::array<int, 3>{0, 5, 0}));
  EXPECT_FALSE(deepspeed_partitions_gradients(plain.framework));
  EXPECT_FALSE(deepspeed_gradient_first_in_step(plain.framework));
  EXPECT_THAT(to_toml(plain), ::testing::Not(HasSubstr("deepspeed_version")));
  // The two changes twin times, at the releases that made them (0.5.4, 0.8.3), and a MAJOR.MINOR release.
  auto with = [&](const std::string& version) {
    return parse_scenario(deepspeed + "deepspeed_version = \"" + version + "\"\n", "case.toml");
  };
  EXPECT_FALSE(deepspeed_partitions_gradients(with("0.5.3").framework));
  EXPECT_TRUE(deepspeed_partitions_gradients(with("0.5.4").framework));
  EXPECT_FALSE(deepspeed_gradient_first_in_step(with("0.8.2").framework));
  EXPECT_TRUE(deepspeed_gradient_first_in_step(with("0.8.3").framework));
  EXPECT_TRUE(deepspeed_gradient_first_in_step(with("0.10").framework));  // 0.10.0, after 0.9.5 (not 0.1)
  EXPECT_EQ(with("0.10").framework.deepspeed_version, (std::array<int, 3>{0, 10, 0}));
  // It round-trips through the scenario's TOML.
  const Scenario given = with("0.9.5");
  EXPECT_EQ(parse_scenario(to_toml(given), "again.toml").framework.deepspeed_version, (std::array<int, 3>{0, 9, 5}));
  // BF16_Optimizer without a release is the engine it was read in, v0.6.2: gradients partitioned.
  Scenario bf16 = plain;
  bf16.framework.bf16_optimizer = true;
  EXPECT_EQ(deepspeed_release(bf16.framework), (std::array<int, 3>{0, 6, 2}));
  EXPECT_TRUE(deepspeed_partitions_gradients(bf16.framework));
  // Megatron has no DeepSpeed release.
  Scenario megatron = given;
  megatron.framework.name = Framework::Megatron;
  EXPECT_FALSE(deepspeed_gradient_first_in_step(megatron.framework));
}

TEST(FrameworkKeys, AWrongDeepSpeedVersionIsNamed) {
  const std::string deepspeed = std::string(kBase) + "[framework]\nname = \"deepspeed\"\n";
  for (const std::string value : {"0.9", "\"0.9.5.1\"", "\"v0.9.5\"", "\"0.9.\"", "\"9\"", "\"\"", "\"0.9.5rc1\""}) {
    const auto problems = problems_of(deepspeed + "deepspeed_version = " + value + "\n");
    ASSERT_EQ(problems.size(), 1u) << value;
    EXPECT_THAT(problems[0], HasSubstr("framework.deepspeed_version: expected a release such as \"0.9.5\"")) << value;
  }
  auto problem = [&](const std::string& text) {
    const auto problems = problems_of(text);
    return problems.size() == 1 ? problems[0] : "problems: " + std::to_string(problems.size());
  };
  EXPECT_THAT(problem(deepspeed + "deepspeed_version = \"0.2.9\"\n"),
              HasSubstr("predates DeepSpeed's pipeline engine"));
  EXPECT_THAT(problem(std::string(kBase) + "[framework]\ndeepspeed_version = \"0.9.5\"\n"),
              HasSubstr("framework.deepspeed_version is DeepSpeed's release: it needs framework.name = \"deepspeed\""));
  std::string bf16 = kBase;
  bf16.replace(bf16.find("dtype = \"fp16\""), 14, "dtype = \"bf16\"");
  bf16.insert(bf16.find("[cluster]"), "zero_stage = 1\n");
  bf16 += "[framework]\nname = \"deepspeed\"\nbf16_optimizer = true\n";
  EXPECT_THAT(problem(bf16 + "deepspeed_version = \"0.6.1\"\n"), HasSubstr("first released in 0.6.2"));
  EXPECT_TRUE(problems_of(bf16 + "deepspeed_version = \"0.6.2\"\n").empty());
}

TEST(FrameworkKeys, WrongTypesNameTheField) {
  for (const char* key : {"dropout", "fused_kernels", "tp_comm_overlap", "gradient_accumulation_fusion",
                          "pipeline_gather_copies", "bf16_optimizer", "partition_activations"}) {
    const auto problems = problems_of(std::string(kBase) + "[framework]\n" + key + " = \"yes\"\n");
    ASSERT_EQ(problems.size(), 1u) << key;
    EXPECT_THAT(problems[0], HasSubstr(std::string("framework.") + key + ": expected true or false"));
  }
}

TEST(FrameworkKeys, DropoutWritesMasksAndRunsItsPasses) {
  Scenario with = parse_scenario(kBase, "case.toml");
  Scenario without = with;
  without.framework.dropout = false;
  // Attention dropout over b * heads/t * s^2 scores: read, write (2 bytes each in fp16) and a 1-byte mask.
  const double scores = 2.0 * (16 / 2) * 1024 * 1024;
  EXPECT_DOUBLE_EQ(bytes_of(with, Phase::Forward, ComputeKind::AttentionCore) -
                       bytes_of(without, Phase::Forward, ComputeKind::AttentionCore),
                   scores * (2 * 2 + 1));
  // Bias + dropout + residual add writes a 1-byte mask per element of [tokens, h].
  EXPECT_DOUBLE_EQ(bytes_of(with, Phase::Forward, ComputeKind::MlpResidual) -
                       bytes_of(without, Phase::Forward, ComputeKind::MlpResidual),
                   2.0 * 1024 * 1024);
}

TEST(FrameworkKeys, TheResidualsBackwardAccumulatesTheGradientsThatMeetAtItsFork) {
  // The residual stream feeds the layer norm and the residual add: autograd adds their two gradients (read two,
  // write one), whatever the framework; Megatron's backward also runs dropout's (read dy and mask, write dx) and the
  // bias gradient's sum (read dx).
  const Scenario with_dropout = parse_scenario(kBase, "case.toml");
  Scenario without = with_dropout;
  without.framework.dropout = false;
  const double e = 2, elements = 2.0 * 1024 * 1024;  // micro-batch x seq x hidden
  EXPECT_DOUBLE_EQ(bytes_of(with_dropout, Phase::Backward, ComputeKind::MlpResidual), elements * (3 * e + 3 * e + 1));
  EXPECT_DOUBLE_EQ(bytes_of(without, Phase::Backward, ComputeKind::MlpResidual), elements * (3 * e + e));
}

TEST(FrameworkKeys, FusedKernelsMoveFewerBytes) {
  const Scenario fused = parse_scenario(kBase, "case.toml");
  Scenario unfused = fused;
  unfused.framework.fused_kernels = false;
  for (ComputeKind what : {ComputeKind::AttentionCore, ComputeKind::AttentionResidual, ComputeKind::Gelu}) {
    EXPECT_LT(bytes_of(fused, Phase::Forward, what), bytes_of(unfused, Phase::Forward, what)) << to_string(what);
  }
  // GEMMs do the same work either way.
  EXPECT_DOUBLE_EQ(bytes_of(fused, Phase::Forward, ComputeKind::MlpUp),
                   bytes_of(unfused, Phase::Forward, ComputeKind::MlpUp));
}

double optimizer_bytes(const Scenario& s) {
  const Program program = build_program(s, Granularity::Layer);
  for (const Op& op : program.stage_ops[0]) {
    if (op.kind == OpKind::Compute && op.what == ComputeKind::OptimizerStep) return op.bytes;
  }
  return 0;
}

TEST(FrameworkKeys, OptimizerTrafficFollowsTheFramework) {
  Scenario fp16 = parse_scenario(kBase, "case.toml");
  Scenario bf16 = fp16;
  bf16.model.dtype = DType::BF16;
  // Megatron with fp16 copies, unscales and checks its gradients; bf16 uses the fp32 main gradients in place.
  EXPECT_GT(optimizer_bytes(fp16), optimizer_bytes(bf16));
  // ZeRO-1 updates 1/dp of the parameters here (dp = 2 on this 8-GPU node).
  Scenario zero = bf16;
  zero.parallel.zero_stage = 1;
  EXPECT_LT(optimizer_bytes(zero), optimizer_bytes(bf16));
  Scenario deepspeed = fp16;
  deepspeed.framework.name = Framework::DeepSpeed;
  EXPECT_NE(optimizer_bytes(deepspeed), optimizer_bytes(fp16));
  // Byte by byte, per parameter this stage holds: Megatron bf16 without ZeRO reads and writes 50 (zeroing the main
  // gradients 4, dividing them by the DP size 8, norm 4, Adam 28, copy back 6); with fp16, 64 under its own DDP
  // (flatten and copy back 8, divide 4, fp32 copy 6, unscale 8, norm 4, Adam 28, copy back 6), 60 under PyTorch DDP,
  // which folds the division into its copy. DeepSpeed fp16 ZeRO-1 (stage2.py, v0.5) on dp = 2: the flatten,
  // divide and copy back around its all-reduce (12) and the all-gather's copy-out (4) on every parameter; on its
  // half, the overflow check in fp32 (10), the norm in fp64 (18), flattening into fp32 (10), unscale (8), Adam (28),
  // copy back (6).
  const double local = optimizer_bytes(bf16) / 50;
  EXPECT_DOUBLE_EQ(optimizer_bytes(fp16), local * 64);
  Scenario torch_ddp = fp16;
  torch_ddp.parallel.dp_overlap = true;
  EXPECT_DOUBLE_EQ(optimizer_bytes(torch_ddp), local * 60);
  deepspeed.parallel.zero_stage = 1;
  EXPECT_DOUBLE_EQ(optimizer_bytes(deepspeed), local * (12 + 4) + local / 2 * (10 + 18 + 10 + 8 + 28 + 6));
  // DeepSpeed's BF16_Optimizer (v0.6.2) on dp = 2: the fp32 gradients converted to bf16 for the all-reduce, divided
  // and copied back (6 + 4 + 6), the all-gather's copy-out (4), the norm over every fp32 gradient (4), their zeroing
  // (4); on its half, Adam (28) and the copy into bf16 (6).
  Scenario bf16_optimizer = deepspeed;
  bf16_optimizer.model.dtype = DType::BF16;
  bf16_optimizer.framework.bf16_optimizer = true;
  EXPECT_DOUBLE_EQ(optimizer_bytes(bf16_optimizer), local * (16 + 4 + 4 + 4) + local / 2 * (28 + 6));
}

TEST(FrameworkKeys, Bf16OptimizerReducesTheFp32GradientsInBf16) {
  Scenario s = parse_scenario(kBase, "case.toml");
  s.model.dtype = DType::BF16;
  s.framework.name = Framework::DeepSpeed;
  s.parallel.zero_stage = 1;
  s.parallel.pp = 2;
  auto collective_bytes = [](const Scenario& scenario, Group group) {
    double bytes = 0;
    for (const auto& ops : build_program(scenario).stage_ops) {
      for (const Op& op : ops) {
        if (op.kind == OpKind::Collective && op.group == group && op.phase != Phase::Optimizer) bytes += op.bytes;
      }
    }
    return bytes;
  };
  Scenario bf16_optimizer = s;
  bf16_optimizer.framework.bf16_optimizer = true;
  // communication_data_type is bf16 without fp16 or ZeRO in DeepSpeed's config: the DP all-reduce moves as many
  // bytes as v0.5's 16-bit one; the tied embedding's all-reduce is of its fp32 gradient (weight._hp_grad).
  EXPECT_DOUBLE_EQ(collective_bytes(bf16_optimizer, Group::Data), collective_bytes(s, Group::Data));
  EXPECT_GT(collective_bytes(s, Group::Embedding), 0);
  EXPECT_DOUBLE_EQ(collective_bytes(bf16_optimizer, Group::Embedding), 2 * collective_bytes(s, Group::Embedding));
}

// Recompute ops of kind `what` on `stage`, one micro-batch's worth (m micro-batches per iteration).
int recomputed(const Program& program, int stage, ComputeKind what) {
  int count = 0;
  for (const Op& op : program.stage_ops[stage]) {
    if (op.kind == OpKind::Compute && op.phase == Phase::Recompute && op.what == what) ++count;
  }
  return count;
}

TEST(FrameworkKeys, DeepSpeedFullRecomputeAlsoRecomputesTheModelEnds) {
  // DeepSpeed's PipelineModule checkpoints every layer with parameters of Megatron-DeepSpeed's GPTModelPipe, not
  // only the transformer layers: the embedding, the final layer norm and the LM head run again before their backward.
  Scenario megatron = parse_scenario(kBase, "case.toml");
  megatron.parallel.recompute = Recompute::Full;
  Scenario deepspeed = megatron;
  deepspeed.framework.name = Framework::DeepSpeed;
  const std::int64_t m = megatron.parallel.micro_batches();
  const Program ds = build_program(deepspeed, Granularity::Op);
  const Program mg = build_program(megatron, Granularity::Op);
  const int first = 0, last = static_cast<int>(deepspeed.parallel.pp) - 1;
  EXPECT_EQ(recomputed(ds, first, ComputeKind::Embedding), m);
  EXPECT_EQ(recomputed(ds, last, ComputeKind::FinalLayerNorm), m);
  EXPECT_EQ(recomputed(ds, last, ComputeKind::LmHead), m);
  EXPECT_EQ(recomputed(ds, last, ComputeKind::CrossEntropy), 0);  // the loss is outside the checkpoints
  for (ComputeKind what : {ComputeKind::Embedding, ComputeKind::FinalLayerNorm, ComputeKind::LmHead}) {
    EXPECT_EQ(recomputed(mg, first, what) + recomputed(mg, last, what), 0) << to_string(what);
  }
  // The recomputed LM head comes after the loss's backward and before the head's own backward.
  const auto& ops = ds.stage_ops[last];
  const auto position = [&](Phase phase, ComputeKind what) {
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind == OpKind::Compute && ops[i].phase == phase && ops[i].what == what) return i;
    }
    return ops.size();
  };
  EXPECT_LT(position(Phase::Backward, ComputeKind::CrossEntropy), position(Phase::Recompute, ComputeKind::LmHead));
  EXPECT_LT(position(Phase::Recompute, ComputeKind::LmHead), position(Phase::Backward, ComputeKind::LmHead));
  // Without recompute DeepSpeed checkpoints nothing.
  deepspeed.parallel.recompute = Recompute::None;
  EXPECT_EQ(recomputed(build_program(deepspeed, Granularity::Op), last, ComputeKind::LmHead), 0);
}

TEST(FrameworkKeys, DeepSpeedPartitionedActivationsAreGatheredBeforeTheRecompute) {
  // DeepSpeed's partition_activations (v0.5 runtime/activation_checkpointing/checkpointing.py): the forward keeps the
  // rank's 1/t of each checkpointed layer's input (a clone), the recompute first zero-fills the whole input, copies
  // the part in and all-gathers the parts across TP (PyTorch's list all_gather copies them out of NCCL's buffer).
  Scenario whole = parse_scenario(kBase, "case.toml");
  whole.framework.name = Framework::DeepSpeed;
  whole.parallel.recompute = Recompute::Full;
  Scenario partitioned = whole;
  partitioned.framework.partition_activations = true;
  const double t = static_cast<double>(whole.parallel.tp);
  const double input = dtype_bytes(whole.model.dtype) * static_cast<double>(whole.model.seq_len) *
                       static_cast<double>(whole.parallel.micro_batch) * static_cast<double>(whole.model.hidden);
  ASSERT_GT(t, 1);
  const std::vector<Op> recompute = testing::first_layer_ops(partitioned, Phase::Recompute);
  ASSERT_FALSE(recompute.empty());
  EXPECT_EQ(recompute.front().kind, OpKind::Collective);
  EXPECT_EQ(recompute.front().payload, Payload::CheckpointedInput);
  EXPECT_EQ(recompute.front().collective, CollectiveKind::AllGather);
  EXPECT_EQ(recompute.front().group, Group::Tensor);
  EXPECT_DOUBLE_EQ(recompute.front().bytes, input);
  EXPECT_EQ(recompute[1].what, ComputeKind::LayerNormAttention);
  EXPECT_DOUBLE_EQ(recompute[1].bytes - testing::first_layer_ops(whole, Phase::Recompute).front().bytes,
                   input + 2 * input / t + 2 * input);
  EXPECT_DOUBLE_EQ(testing::first_layer_ops(partitioned, Phase::Forward).front().bytes -
                       testing::first_layer_ops(whole, Phase::Forward).front().bytes,
                   2 * input / t);
  // Nothing else changes: the backward, and the recompute's other ops.
  EXPECT_EQ(testing::first_layer_ops(partitioned, Phase::Backward).size(),
            testing::first_layer_ops(whole, Phase::Backward).size());
  EXPECT_EQ(recompute.size(), testing::first_layer_ops(whole, Phase::Recompute).size() + 1);
  // A layer keeps 1/t of its input.
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(partitioned), activation_bytes_per_layer(whole) / t);
  EXPECT_LT(estimate_memory(partitioned).peak_bytes, estimate_memory(whole).peak_bytes);
}

TEST(FrameworkKeys, PartitionedActivationsNeedDeepSpeedsFullRecomputeAcrossTp) {
  const std::string base = std::string(kBase) + "[framework]\nname = \"deepspeed\"\npartition_activations = true\n";
  const std::string needs = "framework.partition_activations is DeepSpeed's activation checkpointing option: it needs";
  std::string full = base;
  full.insert(full.find("[cluster]"), "recompute = \"full\"\n");
  EXPECT_TRUE(problems_of(full).empty()) << ::testing::PrintToString(problems_of(full));
  EXPECT_THAT(problems_of(base), Contains(HasSubstr(needs + " parallel.recompute = \"full\", got \"none\"")));
  std::string megatron = full;
  megatron.replace(megatron.find("name = \"deepspeed\""), 18, "name = \"megatron\"");
  EXPECT_THAT(problems_of(megatron), Contains(HasSubstr(needs + " framework.name = \"deepspeed\", got \"megatron\"")));
  std::string one_rank = full;
  one_rank.replace(one_rank.find("tp = "), 6, "tp = 1");
  EXPECT_THAT(problems_of(one_rank), Contains(HasSubstr(needs + " parallel.tp > 1 to partition across, got 1")));
}

TEST(PublishedScenarios, EveryOneLoads) {
  const std::filesystem::path dir = testing::source_dir() + "/scenarios/published";
  int loaded = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".toml" || name == "published.toml") continue;
    EXPECT_NO_THROW(load_scenario(entry.path())) << name;
    ++loaded;
  }
  EXPECT_GE(loaded, 16);
}

}  // namespace
}  // namespace twin::model

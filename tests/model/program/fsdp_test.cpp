// framework.name = "composer" (MosaicML's MPT under PyTorch 1.13), parallel.zero_stage = 3 (FSDP FULL_SHARD) and
// framework.attention (FlashAttention): the scenario's rules, the Program's per-unit gathers and reduce-scatters,
// PyTorch's kernels and the memory estimate.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "model/program/estimates.hpp"
#include "model/program/program.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

using testing::bytes_of;
using ::testing::HasSubstr;
using testing::problems_of;

// MPT-shaped: 4 layers on 8 GPUs, 2 micro-batches per GPU.
constexpr const char* kComposer = R"(
[model]
name = "mpt-small"
layers = 4
hidden = 1024
heads = 8
seq_len = 2048
vocab = 50368
dtype = "bf16"

[parallel]
micro_batch = 4
global_batch = 64
recompute = "full"
zero_stage = 3
vocab_pad_multiple = 64

[cluster]
nodes = 1
node = "dgx-a100"

[framework]
name = "composer"
attention = "flash1"
dropout = false
)";

std::string with(std::string text, const std::string& section, const std::string& line) {
  const std::size_t at = text.find("[" + section + "]");
  const std::size_t end = text.find('\n', at);
  text.insert(end + 1, line + "\n");
  return text;
}

// `text` with its first `what` replaced by `by`; a `what` it lacks is a broken test, not a silent no-op.
std::string replaced(std::string text, const std::string& what, const std::string& by) {
  const std::size_t at = text.find(what);
  if (at == std::string::npos) throw std::logic_error("replaced: no '" + what + "' in the scenario");
  return text.replace(at, what.size(), by);
}

TEST(Composer, LoadsAndRoundTrips) {
  const Scenario s = parse_scenario(kComposer, "case.toml");
  EXPECT_EQ(s.framework.name, Framework::Composer);
  EXPECT_EQ(s.framework.attention, AttentionKind::Flash1);
  EXPECT_EQ(s.parallel.zero_stage, 3);
  EXPECT_EQ(s.parallel.dp, 8);
  EXPECT_EQ(s.padded_vocab(), 50368);
  const Scenario again = parse_scenario(to_toml(s), "again.toml");
  EXPECT_EQ(again.framework.name, Framework::Composer);
  EXPECT_EQ(again.framework.attention, AttentionKind::Flash1);
  EXPECT_EQ(again.parallel.zero_stage, 3);
}

TEST(Composer, RefusesWhatItCannotRunNamingTheField) {
  EXPECT_THAT(problems_of(with(kComposer, "parallel", "tp = 2")),
              ::testing::Contains(HasSubstr("parallel.tp must be 1")));
  EXPECT_THAT(problems_of(with(kComposer, "parallel", "pp = 2")),
              ::testing::Contains(HasSubstr("parallel.pp must be 1")));
  std::string selective = replaced(kComposer, "\"full\"", "\"selective\"");
  EXPECT_THAT(problems_of(selective), ::testing::Contains(HasSubstr("parallel.recompute must be")));
  std::string zero1 = replaced(kComposer, "zero_stage = 3", "zero_stage = 1");
  EXPECT_THAT(problems_of(zero1), ::testing::Contains(HasSubstr("zero_stage must be 3 (FULL_SHARD) or 0 (DDP)")));
  std::string ddp = replaced(kComposer, "zero_stage = 3", "zero_stage = 0");
  EXPECT_THAT(problems_of(ddp), ::testing::Contains(HasSubstr("parallel.dp_overlap must be true")));
  EXPECT_TRUE(problems_of(with(ddp, "parallel", "dp_overlap = true")).empty());
  EXPECT_THAT(problems_of(with(kComposer, "framework", "fused_kernels = true")),
              ::testing::Contains(HasSubstr("framework.fused_kernels selects Megatron-LM's fused kernels")));
  // ZeRO-3 is FSDP's, as Composer runs it; Megatron plans stop at ZeRO-2, Composer's have no ZeRO-2.
  std::string megatron = replaced(kComposer, "\"composer\"", "\"megatron\"");
  EXPECT_THAT(problems_of(megatron), ::testing::Contains(HasSubstr("parallel.zero_stage = 3 is PyTorch FSDP's")));
  std::string stage2 = replaced(kComposer, "zero_stage = 3", "zero_stage = 2");
  EXPECT_THAT(problems_of(stage2), ::testing::Contains(HasSubstr("parallel.zero_stage = 2 (gradients sharded every micro-batch) is modelled on Megatron's")));
}

TEST(Composer, FlashAttentionTakesHeadsUpToItsKernelsLargestBlock) {
  // 1024 / 4 = 256 per head: too wide for FlashAttention v1 (128), fine for v2 (256).
  std::string wide = replaced(kComposer, "heads = 8", "heads = 4");
  EXPECT_THAT(problems_of(wide), ::testing::Contains(HasSubstr("takes heads of at most 128 dimensions")));
  std::string v2 = replaced(wide, "\"flash1\"", "\"flash2\"");
  EXPECT_TRUE(problems_of(v2).empty());
  EXPECT_THAT(problems_of(with(kComposer, "framework", "attention = \"flash3\"")).front(), HasSubstr("attention"));
}

struct OpIndex {
  std::vector<int> gathers, reductions;
  std::map<int, int> first_compute_of_layer_forward;  // layer -> index (micro-batch 0)
};

OpIndex index_of(const std::vector<Op>& ops) {
  OpIndex index;
  for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
    const Op& op = ops[i];
    if (op.kind == OpKind::Collective && op.payload == Payload::Parameters) index.gathers.push_back(i);
    if (op.kind == OpKind::Collective && op.payload == Payload::Gradients) index.reductions.push_back(i);
    if (op.kind == OpKind::Compute && op.phase == Phase::Forward && op.layer >= 0 && op.micro_batch == 0 &&
        !index.first_compute_of_layer_forward.contains(op.layer)) {
      index.first_compute_of_layer_forward[op.layer] = i;
    }
  }
  return index;
}

TEST(FullShard, EveryUnitIsGatheredBeforeEachPassAndReduceScatteredEveryMicroBatch) {
  const Scenario s = parse_scenario(kComposer, "case.toml");
  const Program program = build_program(s, Granularity::Op);
  const std::vector<Op>& ops = program.stage_ops[0];
  const OpIndex index = index_of(ops);
  const int layers = 4, micro_batches = static_cast<int>(s.parallel.micro_batches());
  ASSERT_EQ(micro_batches, 2);
  // Per micro-batch: the root's two buckets once, each block before its forward and again before its backward.
  EXPECT_EQ(index.gathers.size(), static_cast<std::size_t>(micro_batches * (2 + 2 * layers)));
  // Per micro-batch: every block's gradient and the root's two buckets.
  EXPECT_EQ(index.reductions.size(), static_cast<std::size_t>(micro_batches * (layers + 2)));
  for (int i : index.gathers) {
    EXPECT_EQ(ops[i].collective, CollectiveKind::AllGather);
    EXPECT_EQ(ops[i].stream, Stream::DataParallel);
    EXPECT_EQ(ops[i].group, Group::Data);
  }
  for (int i : index.reductions) {
    EXPECT_EQ(ops[i].collective, CollectiveKind::ReduceScatter);
    EXPECT_EQ(ops[i].stream, Stream::DataParallel);
    // in the model dtype (bf16), the layer's whole bucket
    if (ops[i].layer >= 0) {
      EXPECT_DOUBLE_EQ(ops[i].bytes, 2 * layer_parameters_per_gpu(s));
    }
  }
  // A block's forward waits for its own gather.
  for (int layer = 0; layer < layers; ++layer) {
    const Op& first = ops[index.first_compute_of_layer_forward.at(layer)];
    ASSERT_EQ(first.deps.size(), 1u) << "layer " << layer;
    const Op& gather = ops[first.deps[0]];
    EXPECT_EQ(gather.payload, Payload::Parameters);
    EXPECT_EQ(gather.layer, layer);
    EXPECT_EQ(gather.phase, Phase::Forward);
  }
  // Nothing is gathered after the optimizer step (the next forward gathers), and the norm waits for the last
  // reduce-scatter.
  const auto step = std::find_if(ops.begin(), ops.end(), [](const Op& op) {
    return op.what == ComputeKind::OptimizerStep && op.kind == OpKind::Compute;
  });
  ASSERT_NE(step, ops.end());
  EXPECT_EQ(step + 1, ops.end());
  const Op& norm = *(step - 1);
  EXPECT_EQ(norm.payload, Payload::GradNormSquared);
  EXPECT_THAT(norm.deps, ::testing::Contains(index.reductions.back()));
}

TEST(FullShard, TheRateLimiterLetsTwoFreedUnitsPendBeforeTheNextGather) {
  // limit_all_gathers: block L's forward gather waits for block L-2's forward to end (its free).
  const Program program = build_program(parse_scenario(kComposer, "case.toml"), Granularity::Op);
  const std::vector<Op>& ops = program.stage_ops[0];
  std::map<int, int> last_forward_of_layer;  // micro-batch 0
  for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
    if (ops[i].kind == OpKind::Compute && ops[i].phase == Phase::Forward && ops[i].micro_batch == 0 &&
        ops[i].layer >= 0) {
      last_forward_of_layer[ops[i].layer] = i;
    }
  }
  int checked = 0;
  for (const Op& op : ops) {
    if (op.payload != Payload::Parameters || op.phase != Phase::Forward || op.micro_batch != 0 || op.layer < 2)
      continue;
    ASSERT_EQ(op.deps.size(), 1u) << "layer " << op.layer;
    EXPECT_EQ(op.deps[0], last_forward_of_layer.at(op.layer - 2)) << "layer " << op.layer;
    ++checked;
  }
  EXPECT_EQ(checked, 2);  // layers 2 and 3
}

TEST(FullShard, TheProgramMarksEachReshardAfterTheLastOpThatReadsTheUnit) {
  // FSDP frees a block after its forward and after its backward (not between its recompute and its backward), and
  // the root after the embedding's backward: once per micro-batch each, on the last op of the pass.
  const Scenario s = parse_scenario(kComposer, "case.toml");
  for (const Granularity granularity : {Granularity::Op, Granularity::Layer}) {
    const Program program = build_program(s, granularity);
    const std::vector<Op>& ops = program.stage_ops[0];
    std::map<std::tuple<int, int, int>, int> last_of_pass;  // (micro-batch, layer, phase) -> its last op
    for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
      if (ops[i].kind == OpKind::Compute && ops[i].micro_batch >= 0)
        last_of_pass[{ops[i].micro_batch, ops[i].layer, static_cast<int>(ops[i].phase)}] = i;
    }
    std::map<std::tuple<int, int, int>, int> marked;
    for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
      if (!ops[i].frees_parameters) continue;
      const std::tuple<int, int, int> pass{ops[i].micro_batch, ops[i].layer, static_cast<int>(ops[i].phase)};
      ASSERT_EQ(ops[i].kind, OpKind::Compute) << i;
      EXPECT_EQ(last_of_pass.at(pass), i) << "op " << i << " is not the last of its pass";
      EXPECT_NE(ops[i].phase, Phase::Recompute) << i;
      if (ops[i].layer < 0) {
        EXPECT_EQ(ops[i].what, ComputeKind::Embedding) << i;
      }
      ++marked[pass];
    }
    const int layers = 4, micro_batches = 2;
    EXPECT_EQ(marked.size(), static_cast<std::size_t>(micro_batches * (2 * layers + 1)));
    const auto times_marked = [&](int mb, int layer, Phase phase) {
      const auto it = marked.find({mb, layer, static_cast<int>(phase)});
      return it == marked.end() ? 0 : it->second;
    };
    for (int mb = 0; mb < micro_batches; ++mb) {
      for (int layer = 0; layer < layers; ++layer) {
        EXPECT_EQ(times_marked(mb, layer, Phase::Forward), 1) << mb << " " << layer;
        EXPECT_EQ(times_marked(mb, layer, Phase::Backward), 1) << mb << " " << layer;
      }
      EXPECT_EQ(times_marked(mb, -1, Phase::Backward), 1) << mb;
    }
  }
  // Without ZeRO-3 nothing is resharded.
  std::string ddp = replaced(kComposer, "zero_stage = 3", "zero_stage = 0");
  ddp = with(ddp, "parallel", "dp_overlap = true");
  const Program replicated = build_program(parse_scenario(ddp, "case.toml"), Granularity::Op);
  for (const Op& op : replicated.stage_ops[0]) EXPECT_FALSE(op.frees_parameters);
}

TEST(FullShard, WithOneRankThereIsNothingToShard) {
  std::string one = kComposer;
  one = with(one, "cluster", "gpus_per_node = 1");
  one = replaced(one, "global_batch = 64", "global_batch = 8");
  const Program program = build_program(parse_scenario(one, "case.toml"), Granularity::Op);
  for (const Op& op : program.stage_ops[0]) {
    EXPECT_FALSE(op.kind == OpKind::Collective && op.group == Group::Data) << to_string(op.payload);
  }
}

TEST(FullShard, TheLayerGranularityKeepsTheSameCollectives) {
  const Scenario s = parse_scenario(kComposer, "case.toml");
  auto collectives = [&](Granularity g) {
    std::vector<std::pair<int, int>> out;
    const Program program = build_program(s, g);
    for (const Op& op : program.stage_ops[0]) {
      if (op.kind == OpKind::Collective) out.emplace_back(static_cast<int>(op.payload), op.layer);
    }
    return out;
  };
  EXPECT_EQ(collectives(Granularity::Op), collectives(Granularity::Layer));
}

TEST(ComposerKernels, PyTorchsLinearCarriesItsBiasInTheGemmAndSumsItsGradient) {
  const Scenario composer = parse_scenario(kComposer, "case.toml");
  const double e = 2, tokens = 4 * 2048, h = 1024;
  // The QKV GEMM's operands only, forward (no separate bias add, as Megatron's F.linear has); backward its
  // operands twice plus the bias gradient's read of the output gradient.
  const double qkv_operands = e * (tokens * h + h * 3 * h + tokens * 3 * h);
  EXPECT_DOUBLE_EQ(bytes_of(composer, Phase::Forward, ComputeKind::QkvProjection), qkv_operands);
  EXPECT_DOUBLE_EQ(bytes_of(composer, Phase::Backward, ComputeKind::QkvProjection),
                   2 * qkv_operands + e * tokens * 3 * h);
  // The residual: a plain add (dropout at p = 0 launches nothing); backward autograd's accumulation of two
  // gradients. GELU: one pass each way, no bias.
  EXPECT_DOUBLE_EQ(bytes_of(composer, Phase::Forward, ComputeKind::MlpResidual), 3 * e * tokens * h);
  EXPECT_DOUBLE_EQ(bytes_of(composer, Phase::Backward, ComputeKind::MlpResidual), 3 * e * tokens * h);
  EXPECT_DOUBLE_EQ(bytes_of(composer, Phase::Forward, ComputeKind::Gelu), 2 * e * tokens * 4 * h);
  EXPECT_DOUBLE_EQ(bytes_of(composer, Phase::Backward, ComputeKind::Gelu), 3 * e * tokens * 4 * h);
}

TEST(ComposerKernels, TheLossAndTheTwoTrainingMetricsPassOverTheLogits) {
  const Scenario s = parse_scenario(kComposer, "case.toml");
  const Program program = build_program(s, Granularity::Op);
  double forward = 0, backward = 0;
  for (const Op& op : program.stage_ops[0]) {
    if (op.what != ComputeKind::CrossEntropy || op.micro_batch != 0 || op.kind != OpKind::Compute) continue;
    (op.phase == Phase::Backward ? backward : forward) += op.bytes;
  }
  const double logits = 4.0 * 2048 * 50368, e = 2;
  // xentropy: two reads forward, one read and one write backward; each metric: log_softmax in bf16 (three reads,
  // one write) and its cast to fp32 (read e, write 4).
  EXPECT_DOUBLE_EQ(forward, logits * (2 * e + 2 * (4 * e + e + 4)));
  EXPECT_DOUBLE_EQ(backward, logits * 2 * e);
}

TEST(FlashAttention, KeepsNoScoresInHbmOrInTheStash) {
  Scenario flash = parse_scenario(kComposer, "case.toml");
  Scenario unfused = flash;
  unfused.framework.attention = AttentionKind::Unfused;
  const double scores_bytes = 2.0 * 4 * 8 * 2048 * 2048;  // one bf16 copy of the scores of a micro-batch
  // The unfused core moves the scores several times; FlashAttention moves only head-wide tensors.
  EXPECT_GT(bytes_of(unfused, Phase::Forward, ComputeKind::AttentionCore), 2 * scores_bytes);
  EXPECT_LT(bytes_of(flash, Phase::Forward, ComputeKind::AttentionCore), scores_bytes / 3);
  // Same model FLOPs (Narayanan's count) either way.
  double flash_flops = 0, unfused_flops = 0;
  for (const Op& op : layer_compute_ops(flash, 0, Phase::Forward)) flash_flops += op.flops;
  for (const Op& op : layer_compute_ops(unfused, 0, Phase::Forward)) unfused_flops += op.flops;
  EXPECT_DOUBLE_EQ(flash_flops, unfused_flops);
  // Korthikanti's 5 a s / h term (the scores' stash) goes without recompute.
  flash.parallel.recompute = unfused.parallel.recompute = Recompute::None;
  const double sbh = 2048.0 * 4 * 1024;
  // (no dropout: its two 1-byte masks per element are not kept)
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(flash), sbh * 32);
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(unfused), sbh * (32 + 5.0 * 8 * 2048 / 1024));
}

TEST(FullShard, MemoryShardsTheWholeModelStateAndHoldsTheGatheredUnits) {
  const Scenario s = parse_scenario(kComposer, "case.toml");
  const MemoryEstimate memory = estimate_memory(s);
  ASSERT_EQ(memory.stages.size(), 1u);
  const StageMemory& m = memory.stages[0];
  const double params = m.parameters, block = layer_parameters_per_gpu(s), root = params - 4 * block;
  // fp32 parameters, gradients and Adam's two moments, all sharded 8 ways; plus the bf16 units gathered at once.
  EXPECT_DOUBLE_EQ(m.weights_bytes, params * 4 / 8 + 2 * (root + 3 * block));
  EXPECT_DOUBLE_EQ(m.gradients_bytes, params * 4 / 8 + 2 * std::max(root, block));
  EXPECT_DOUBLE_EQ(m.optimizer_bytes, params * 8 / 8);
  // Unsharded (DDP) it would hold 16 bytes a parameter.
  std::string ddp = with(kComposer, "parallel", "dp_overlap = true");
  ddp = replaced(ddp, "zero_stage = 3", "zero_stage = 0");
  const StageMemory d = estimate_memory(parse_scenario(ddp, "ddp.toml")).stages[0];
  EXPECT_DOUBLE_EQ(d.weights_bytes + d.gradients_bytes + d.optimizer_bytes, 16 * params);
}

}  // namespace
}  // namespace twin::model

// Every compute op of a Program carries its kernels (model::KernelBreakdown), decided in model/ for the scenario's
// framework: their bytes add up to the op's, a fused layer op's parts are the op-granularity ops it stands for, the
// breakdowns are shared among micro-batches, and the kernel counts follow the frameworks' kernels.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "model/program/program.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

using testing::make_scenario;

struct Case {
  std::string name;
  Scenario scenario;
};

// The frameworks and model variants whose kernels differ.
std::vector<Case> cases() {
  const Scenario base = make_scenario(4, 256, 8, 128, 1000, 2, 2, 2, 1, 8);
  std::vector<Case> all{{"megatron", base}};
  Scenario unfused = base;
  unfused.framework.fused_kernels = false;
  unfused.model.position_embedding = PositionEmbedding::Alibi;
  unfused.parallel.recompute = Recompute::Full;
  all.push_back({"megatron_unfused_alibi_recompute", unfused});
  Scenario deepspeed = base;
  deepspeed.framework.name = Framework::DeepSpeed;
  deepspeed.framework.bf16_optimizer = true;
  deepspeed.framework.partition_activations = true;
  deepspeed.parallel.recompute = Recompute::Full;
  deepspeed.parallel.zero_stage = 1;
  all.push_back({"deepspeed_bf16_partitioned", deepspeed});
  Scenario llama = base;
  llama.model.activation = Activation::Swiglu;
  llama.model.position_embedding = PositionEmbedding::Rope;
  llama.model.kv_heads = 2;
  llama.model.linear_bias = false;
  llama.framework.attention = AttentionKind::Flash2;
  llama.parallel.sequence_parallel = true;
  all.push_back({"llama_flash_sp", llama});
  Scenario neox = base;
  neox.model.parallel_residual = true;
  neox.model.shared_norm = true;
  neox.model.dtype = DType::FP16;
  neox.parallel.recompute = Recompute::Selective;
  all.push_back({"parallel_shared_norm_fp16", neox});
  Scenario composer = make_scenario(4, 256, 8, 128, 1000, 1, 1, 4, 1, 8);
  composer.framework.name = Framework::Composer;
  composer.parallel.zero_stage = 3;
  composer.framework.attention = AttentionKind::Flash2;
  all.push_back({"composer_fsdp", composer});
  return all;
}

double kernel_bytes(const Op& op) {
  double bytes = 0;
  for (const Kernel& kernel : op.breakdown->kernels) bytes += kernel.bytes;
  return bytes;
}

TEST(Breakdown, EveryComputeOpCarriesKernelsThatAddUpToItsBytes) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    ASSERT_TRUE(validation_problems(c.scenario).empty());
    const Program program = build_program(c.scenario, Granularity::Op);
    int compute_ops = 0;
    for (const auto& ops : program.stage_ops) {
      for (const Op& op : ops) {
        if (op.kind != OpKind::Compute) {
          EXPECT_EQ(op.breakdown, nullptr) << to_string(op.kind);
          continue;
        }
        ++compute_ops;
        ASSERT_NE(op.breakdown, nullptr) << to_string(op.what) << " " << to_string(op.phase);
        ASSERT_FALSE(op.breakdown->kernels.empty()) << to_string(op.what);
        EXPECT_TRUE(op.breakdown->parts.empty());
        EXPECT_NEAR(kernel_bytes(op), op.bytes, 1e-9 * op.bytes) << to_string(op.what) << " " << to_string(op.phase);
        int launches = 0;
        for (const Kernel& kernel : op.breakdown->kernels) {
          EXPECT_GE(kernel.launches, 0);
          EXPECT_GE(kernel.bytes, 0);
          launches += kernel.launches;
        }
        EXPECT_GE(launches, 1) << to_string(op.what);
        const bool gemm_kernel = op.breakdown->kernels.front().kind == KernelKind::Gemm;
        EXPECT_EQ(gemm_kernel, op.gemm.count > 0 && op.what != ComputeKind::AttentionCore) << to_string(op.what);
      }
    }
    EXPECT_GT(compute_ops, 0);
  }
}

TEST(Breakdown, AFusedLayerOpsPartsAreTheLayersComputeOps) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Program program = build_program(c.scenario, Granularity::Layer);
    int fused = 0;
    for (const auto& ops : program.stage_ops) {
      for (const Op& op : ops) {
        if (op.kind != OpKind::Compute || op.what != ComputeKind::TransformerLayer) continue;
        ++fused;
        ASSERT_NE(op.breakdown, nullptr);
        EXPECT_TRUE(op.breakdown->kernels.empty());
        const std::vector<Op> expected = layer_compute_ops(c.scenario, op.layer, op.phase);
        ASSERT_EQ(op.breakdown->parts.size(), expected.size());
        double bytes = 0, flops = 0;
        for (std::size_t i = 0; i < expected.size(); ++i) {
          const Op& part = op.breakdown->parts[i];
          EXPECT_EQ(part.what, expected[i].what);
          EXPECT_EQ(part.phase, expected[i].phase);
          EXPECT_DOUBLE_EQ(part.bytes, expected[i].bytes);
          ASSERT_NE(part.breakdown, nullptr);
          EXPECT_EQ(part.breakdown->kernels.size(), expected[i].breakdown->kernels.size());
          bytes += part.bytes;
          flops += part.flops;
        }
        EXPECT_DOUBLE_EQ(op.bytes, bytes);
        EXPECT_DOUBLE_EQ(op.flops, flops);
      }
    }
    EXPECT_GT(fused, 0);
  }
}

TEST(Breakdown, EveryMicroBatchSharesTheLayersBreakdowns) {
  // 64 micro-batches on 2 stages of 2 layers: the layers' ops of every micro-batch point at the same few breakdowns.
  const Scenario s = make_scenario(4, 256, 8, 128, 1000, 2, 2, 1, 1, 64);
  for (const Granularity granularity : {Granularity::Op, Granularity::Layer}) {
    const Program program = build_program(s, granularity);
    std::set<const KernelBreakdown*> layer_breakdowns;
    int layer_ops = 0;
    for (const auto& ops : program.stage_ops) {
      for (const Op& op : ops) {
        if (op.kind != OpKind::Compute || op.layer < 0) continue;
        ++layer_ops;
        layer_breakdowns.insert(op.breakdown.get());
      }
    }
    const std::size_t per_layer_and_phase = granularity == Granularity::Layer ? 1 : 12;
    EXPECT_GE(layer_ops, 64 * 4 * 2);
    EXPECT_LE(layer_breakdowns.size(), 4 * 3 * per_layer_and_phase) << to_string(granularity);
  }
}

// Layer 0's op `what` in `phase`.
Op op_of(const Scenario& s, ComputeKind what, Phase phase) {
  for (const Op& op : layer_compute_ops(s, 0, phase)) {
    if (op.what == what) return op;
  }
  const Program program = build_program(s, Granularity::Op);
  for (const Op& op : program.stage_ops.back()) {
    if (op.kind == OpKind::Compute && op.what == what && op.phase == phase) return op;
  }
  ADD_FAILURE() << "no " << to_string(what) << " op";
  return {};
}

std::vector<std::pair<KernelKind, int>> kinds_and_launches(const Op& op) {
  std::vector<std::pair<KernelKind, int>> out;
  if (!op.breakdown) return out;
  for (const Kernel& kernel : op.breakdown->kernels) out.emplace_back(kernel.kind, kernel.launches);
  return out;
}

using Kernels = std::vector<std::pair<KernelKind, int>>;

TEST(Breakdown, TheAttentionCoreRunsItsFrameworksKernels) {
  Scenario s = make_scenario(2, 256, 8, 128, 1000, 2, 1, 1, 1, 4);
  // Megatron: two batched GEMMs (four backward); the fused softmax, dropout and the layout copy.
  EXPECT_EQ(kinds_and_launches(op_of(s, ComputeKind::AttentionCore, Phase::Forward)),
            (Kernels{{KernelKind::AttentionGemms, 2}, {KernelKind::AttentionPasses, 3}}));
  EXPECT_EQ(kinds_and_launches(op_of(s, ComputeKind::AttentionCore, Phase::Backward)),
            (Kernels{{KernelKind::AttentionGemms, 4}, {KernelKind::AttentionPasses, 3}}));
  // Unfused: scale, mask and softmax; ALiBi's bias expanded into the scores (one more pass) and read back as C.
  s.framework.fused_kernels = false;
  s.model.position_embedding = PositionEmbedding::Alibi;
  const Op alibi = op_of(s, ComputeKind::AttentionCore, Phase::Forward);
  EXPECT_EQ(kinds_and_launches(alibi), (Kernels{{KernelKind::AttentionGemms, 2},
                                                {KernelKind::AttentionOperand, 0},
                                                {KernelKind::AttentionPasses, 3 + 1 + 1 + 1}}));
  const double scores = 1 * 4 * 128.0 * 128, e = 2;  // micro-batch 1, 8 / 2 heads, bf16
  EXPECT_DOUBLE_EQ(alibi.breakdown->kernels[1].bytes, e * scores);
  // FlashAttention: one kernel forward; backward its preprocess, the kernel and dQ's conversion; the layout copies.
  s = make_scenario(2, 256, 8, 128, 1000, 2, 1, 1, 1, 4);
  s.framework.attention = AttentionKind::Flash2;
  EXPECT_EQ(kinds_and_launches(op_of(s, ComputeKind::AttentionCore, Phase::Forward)),
            (Kernels{{KernelKind::FlashAttention, 1}, {KernelKind::Stream, 1}}));
  EXPECT_EQ(kinds_and_launches(op_of(s, ComputeKind::AttentionCore, Phase::Backward)),
            (Kernels{{KernelKind::FlashAttention, 3}, {KernelKind::Stream, 1}}));
}

TEST(Breakdown, ElementwiseKernelCountsFollowTheFramework) {
  Scenario megatron = make_scenario(2, 256, 8, 128, 1000, 2, 1, 1, 1, 4);
  const auto launches = [](const Scenario& s, ComputeKind what, Phase phase) {
    const Op op = op_of(s, what, phase);
    int total = 0;
    if (!op.breakdown) return -1;
    for (const Kernel& kernel : op.breakdown->kernels) total += kernel.launches;
    return total;
  };
  EXPECT_EQ(launches(megatron, ComputeKind::AttentionResidual, Phase::Forward), 1);  // fused bias-dropout-add
  EXPECT_EQ(launches(megatron, ComputeKind::LayerNormMlp, Phase::Backward), 3);
  EXPECT_EQ(launches(megatron, ComputeKind::Gelu, Phase::Forward), 1);          // fused bias-GeLU
  EXPECT_EQ(launches(megatron, ComputeKind::CrossEntropy, Phase::Forward), 6);  // cast, max, sub, exp, sum, div
  Scenario unfused = megatron;
  unfused.framework.fused_kernels = false;
  EXPECT_EQ(launches(unfused, ComputeKind::AttentionResidual, Phase::Forward), 3);  // bias add, dropout, add
  EXPECT_EQ(launches(unfused, ComputeKind::Gelu, Phase::Forward), 2);               // bias add, GeLU
  Scenario fp32 = megatron;
  fp32.model.dtype = DType::FP32;
  EXPECT_EQ(launches(fp32, ComputeKind::CrossEntropy, Phase::Forward), 5);  // no cast
  Scenario parallel = megatron;
  parallel.model.parallel_residual = true;
  EXPECT_EQ(launches(parallel, ComputeKind::MlpResidual, Phase::Backward), 2);  // both forks' accumulations
  Scenario composer = make_scenario(2, 256, 8, 128, 1000, 1, 1, 1, 1, 4);
  composer.framework.name = Framework::Composer;
  EXPECT_EQ(launches(composer, ComputeKind::LayerNormMlp, Phase::Backward), 2);
  EXPECT_EQ(launches(composer, ComputeKind::Embedding, Phase::Backward), 7);
  // A weight-gradient GEMM: the two GEMMs, then Megatron's fp32 main_grad.add_() (one kernel), or DeepSpeed's
  // BF16_Optimizer's conversion and add (two).
  EXPECT_EQ(kinds_and_launches(op_of(megatron, ComputeKind::MlpUp, Phase::Backward)),
            (Kernels{{KernelKind::Gemm, 2}, {KernelKind::Stream, 1}}));
  Scenario bf16_optimizer = megatron;
  bf16_optimizer.framework.name = Framework::DeepSpeed;
  bf16_optimizer.framework.bf16_optimizer = true;
  bf16_optimizer.parallel.zero_stage = 1;
  EXPECT_EQ(kinds_and_launches(op_of(bf16_optimizer, ComputeKind::MlpUp, Phase::Backward)),
            (Kernels{{KernelKind::Gemm, 2}, {KernelKind::Stream, 2}}));
  // The QKV projection's unfused bias: its own kernel after the GEMM.
  EXPECT_EQ(kinds_and_launches(op_of(megatron, ComputeKind::QkvProjection, Phase::Forward)),
            (Kernels{{KernelKind::Gemm, 1}, {KernelKind::Stream, 1}}));
}

}  // namespace
}  // namespace twin::model

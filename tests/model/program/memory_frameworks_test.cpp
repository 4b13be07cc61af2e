// What the frameworks keep and move, by their own switches (model/program/estimates.hpp, stage_builder.cpp):
// Megatron's bf16 gradient buffer (framework.grad_reduce_in_fp32 = false) and Transformer Engine's FP8 parameters
// (framework.fp8_param_gather), and gradients sharded every micro-batch (parallel.zero_stage = 2). Each must lower the memory estimate and the bytes of the exchange it changes on every
// plan family it applies to (pp 1, 1F1B pp 2, interleaved, ep 2, cp 2), and is refused by name where it does not
// apply (ZeRO-2 raises its exchange's bytes instead, m-fold). (Both fidelities of the simulator replay the same Program: the bytes checked here are what each times.)
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "model/program/estimates.hpp"
#include "model/program/program.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

// A small Llama-like Megatron plan on 16 H100; `parallel` and `extra` add keys to their sections.
std::string plan(const std::string& parallel, const std::string& model_extra = "", const std::string& framework = "") {
  return fmt::format(R"(
[model]
name = "small"
layers = 8
hidden = 1024
heads = 8
kv_heads = 2
ffn_hidden = 2816
seq_len = 2048
vocab = 32000
dtype = "bf16"
norm = "rmsnorm"
activation = "swiglu"
position_embedding = "rope"
linear_bias = false
{}
[parallel]
tp = 2
micro_batch = 1
global_batch = 32
sequence_parallel = true
zero_stage = 1
dp_overlap = true
{}
[cluster]
nodes = 2
node = "dgx-h100"

[framework]
name = "megatron"
dropout = false
attention = "flash2"
{}
)",
                     model_extra, parallel, framework);
}

struct Family {
  const char* name;
  const char* parallel;
  const char* model;
};
const Family kFamilies[] = {
    {"pp 1", "pp = 1\n", ""},
    {"1f1b pp 2", "pp = 2\nschedule = \"1f1b\"\n", ""},
    {"interleaved", "pp = 2\nschedule = \"interleaved\"\nvirtual_stages = 2\n", ""},
    {"ep 2", "pp = 2\nep = 2\n", "experts = 4\ntop_k = 2\nmoe_ffn_hidden = 1024\n"},
    {"cp 2", "pp = 2\ncp = 2\n", ""},
};

// Bytes of the stage's data-parallel exchanges of `payload` (gradient reductions or parameter gathers), both groups.
double exchange_bytes(const Program& program, int stage, Payload payload) {
  double bytes = 0;
  for (const Op& op : program.stage_ops[stage]) {
    if (op.kind == OpKind::Collective && op.payload == payload) bytes += op.bytes;
  }
  return bytes;
}

TEST(MemoryFrameworks, Bf16GradientsHalveTheBufferAndItsReductionOnEveryPlanFamily) {
  for (const Family& family : kFamilies) {
    SCOPED_TRACE(family.name);
    const Scenario fp32 = parse_scenario(plan(family.parallel, family.model), "fp32.toml");
    const Scenario bf16 = parse_scenario(plan(family.parallel, family.model, "grad_reduce_in_fp32 = false"), "b.toml");
    const MemoryEstimate a = estimate_memory(fp32), b = estimate_memory(bf16);
    for (std::size_t stage = 0; stage < a.stages.size(); ++stage) {
      // Megatron's distrib_optimizer.md: 6 + 12/d bytes per parameter with fp32 gradients, 4 + 16/d with 16-bit ones.
      EXPECT_DOUBLE_EQ(b.stages[stage].gradients_bytes, a.stages[stage].gradients_bytes / 2);
      EXPECT_DOUBLE_EQ(b.stages[stage].optimizer_bytes, a.stages[stage].optimizer_bytes * 16 / 12);
      EXPECT_EQ(b.stages[stage].activations_bytes, a.stages[stage].activations_bytes);
    }
    EXPECT_LT(b.peak_bytes, a.peak_bytes);
    const Program p32 = build_program(fp32, Granularity::Layer), p16 = build_program(bf16, Granularity::Layer);
    for (int stage = 0; stage < p32.stages(); ++stage) {
      const double reduced = exchange_bytes(p32, stage, Payload::Gradients);
      ASSERT_GT(reduced, 0);
      EXPECT_DOUBLE_EQ(exchange_bytes(p16, stage, Payload::Gradients), reduced / 2);
      // the parameters the optimizer gathers are bf16 either way
      EXPECT_DOUBLE_EQ(exchange_bytes(p16, stage, Payload::Parameters), exchange_bytes(p32, stage, Payload::Parameters));
    }
  }
}

TEST(MemoryFrameworks, Fp8ParametersKeepNoSixteenBitCopyAndGatherInOneByteOnEveryPlanFamily) {
  for (const Family& family : kFamilies) {
    SCOPED_TRACE(family.name);
    const std::string fp8_model = std::string(family.model) + "fp8 = \"hybrid\"\n";
    const Scenario bf16 = parse_scenario(plan(family.parallel, family.model), "bf16.toml");
    const Scenario copies = parse_scenario(plan(family.parallel, fp8_model), "fp8.toml");
    const Scenario params = parse_scenario(plan(family.parallel, fp8_model, "fp8_param_gather = true"), "p.toml");
    const MemoryEstimate m16 = estimate_memory(bf16), m8 = estimate_memory(copies), mp = estimate_memory(params);
    for (std::size_t stage = 0; stage < m16.stages.size(); ++stage) {
      // FP8 data and its transpose where the bf16 weight was: as many bytes as bf16, 2 fewer per GEMM weight than
      // bf16 weights beside TE's FP8 copies.
      EXPECT_DOUBLE_EQ(mp.stages[stage].weights_bytes, m16.stages[stage].weights_bytes);
      EXPECT_LT(mp.stages[stage].weights_bytes, m8.stages[stage].weights_bytes);
      EXPECT_EQ(mp.stages[stage].activations_bytes, m8.stages[stage].activations_bytes);
    }
    // FP8 with FP8 parameters keeps less than bf16 (its one-byte GEMM inputs), FP8 without them more.
    EXPECT_LT(mp.peak_bytes, m16.peak_bytes);
    EXPECT_GT(m8.peak_bytes, mp.peak_bytes);
    const Program p8 = build_program(copies, Granularity::Layer), pp = build_program(params, Granularity::Layer);
    for (int stage = 0; stage < p8.stages(); ++stage) {
      const double gathered = exchange_bytes(p8, stage, Payload::Parameters);
      ASSERT_GT(gathered, 0);
      // the GEMM weights are most of a stage's parameters: well under the 16-bit bytes, above one byte each
      EXPECT_LT(exchange_bytes(pp, stage, Payload::Parameters), 0.75 * gathered);
      EXPECT_GT(exchange_bytes(pp, stage, Payload::Parameters), 0.5 * gathered);
      EXPECT_DOUBLE_EQ(exchange_bytes(pp, stage, Payload::Gradients), exchange_bytes(p8, stage, Payload::Gradients));
    }
  }
}

TEST(MemoryFrameworks, ZeroTwoShardsTheGradientsAndReducesThemEveryMicroBatchOnEveryDenseFamily) {
  for (const Family& family : kFamilies) {
    if (std::string(family.model).find("experts") != std::string::npos) continue;  // refused below
    SCOPED_TRACE(family.name);
    const std::string text = plan(family.parallel, family.model);
    std::string sharded = text;
    sharded.replace(sharded.find("zero_stage = 1"), 14, "zero_stage = 2");
    const Scenario one = parse_scenario(text, "one.toml"), two = parse_scenario(sharded, "two.toml");
    const MemoryEstimate a = estimate_memory(one), b = estimate_memory(two);
    const double shards = static_cast<double>(one.parallel.dp * one.parallel.cp);
    for (std::size_t stage = 0; stage < a.stages.size(); ++stage) {
      // the rank's 1/(dp cp) of the fp32 gradients, and at most one chunk's whole gradients in flight
      EXPECT_GE(b.stages[stage].gradients_bytes, a.stages[stage].gradients_bytes / shards);
      const double chunk_bound = a.stages[stage].gradients_bytes / shards +
                                 4 * static_cast<double>(one.layers_on_stage(0)) * layer_parameters_per_gpu(one);
      EXPECT_LE(b.stages[stage].gradients_bytes, chunk_bound * (1 + 1e-12));  // 1F1B: the chunk is the stage
      EXPECT_LT(b.stages[stage].gradients_bytes, a.stages[stage].gradients_bytes);
      EXPECT_EQ(b.stages[stage].optimizer_bytes, a.stages[stage].optimizer_bytes);
    }
    EXPECT_LT(b.peak_bytes, a.peak_bytes);
    // Every micro-batch's gradients cross the data-parallel group: m times ZeRO-1's bytes, the parameters gathered
    // once as before.
    const double m = static_cast<double>(one.parallel.micro_batches());
    const Program p1 = build_program(one, Granularity::Layer), p2 = build_program(two, Granularity::Layer);
    for (int stage = 0; stage < p1.stages(); ++stage) {
      EXPECT_DOUBLE_EQ(exchange_bytes(p2, stage, Payload::Gradients), m * exchange_bytes(p1, stage, Payload::Gradients));
      EXPECT_DOUBLE_EQ(exchange_bytes(p2, stage, Payload::Parameters), exchange_bytes(p1, stage, Payload::Parameters));
    }
  }
}

TEST(MemoryFrameworks, TheSwitchesAreRefusedByNameWhereTheyDoNotApply) {
  const auto refused = [](const std::string& text, const std::string& key) {
    const std::vector<std::string> problems = testing::problems_of(text);
    bool named = false;
    for (const std::string& problem : problems) named = named || problem.find(key) != std::string::npos;
    return named;
  };
  const std::string pp1 = "pp = 1\n";
  // bf16 gradients are Megatron's bf16 choice: not with DeepSpeed, not with fp16 (or even restated there)
  std::string deepspeed = plan(pp1, "", "grad_reduce_in_fp32 = false");
  deepspeed.replace(deepspeed.find("name = \"megatron\""), 17, "name = \"deepspeed\"");
  EXPECT_TRUE(refused(deepspeed, "framework.grad_reduce_in_fp32"));
  std::string fp16 = plan(pp1, "", "grad_reduce_in_fp32 = true");
  fp16.replace(fp16.find("dtype = \"bf16\""), 14, "dtype = \"fp16\"");
  EXPECT_TRUE(refused(fp16, "framework.grad_reduce_in_fp32"));
  EXPECT_TRUE(testing::problems_of(plan(pp1, "", "grad_reduce_in_fp32 = false")).empty());
  // FP8 parameters need FP8 training and the distributed optimizer
  EXPECT_TRUE(refused(plan(pp1, "", "fp8_param_gather = true"), "framework.fp8_param_gather"));
  std::string no_zero = plan(pp1, "fp8 = \"hybrid\"\n", "fp8_param_gather = true");
  no_zero.replace(no_zero.find("zero_stage = 1"), 14, "zero_stage = 0");
  EXPECT_TRUE(refused(no_zero, "framework.fp8_param_gather"));
  EXPECT_TRUE(testing::problems_of(plan(pp1, "fp8 = \"hybrid\"\n", "fp8_param_gather = true")).empty());
  // ZeRO-2: Megatron's dense plans, their gradients reduced under the backward
  std::string moe = plan("pp = 2\nep = 2\n", "experts = 4\ntop_k = 2\nmoe_ffn_hidden = 1024\n");
  moe.replace(moe.find("zero_stage = 1"), 14, "zero_stage = 2");
  EXPECT_TRUE(refused(moe, "parallel.zero_stage = 2"));
  std::string stage2 = plan(pp1);
  stage2.replace(stage2.find("zero_stage = 1"), 14, "zero_stage = 2");
  EXPECT_TRUE(testing::problems_of(stage2).empty());
  std::string exposed = stage2;
  exposed.replace(exposed.find("dp_overlap = true"), 17, "dp_overlap = false");
  EXPECT_TRUE(refused(exposed, "parallel.zero_stage = 2"));
  std::string deepspeed2 = stage2;
  deepspeed2.replace(deepspeed2.find("name = \"megatron\""), 17, "name = \"deepspeed\"");
  EXPECT_TRUE(refused(deepspeed2, "parallel.zero_stage = 2"));
}

}  // namespace
}  // namespace twin::model

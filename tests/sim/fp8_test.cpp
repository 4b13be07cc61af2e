// FP8 in the simulator: the layers' GEMMs at the cited measured FP8 rate (not the datasheet peak), the casts around
// them as memory-bound kernels, the amax reductions as collectives; an FP8 iteration between the 16-bit one and half
// of it.
#include <gtest/gtest.h>

#include "model/ops/compute_ops.hpp"
#include "model/program/program.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/context_parallel_scenarios.hpp"
#include "tests/sim/support.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {
namespace {

using model::Fp8Recipe;
using testing::make_scenario;
using testing::Plan;

TEST(Fp8, GemmsRunAtTheCitedMeasuredRate) {
  // At its measured shape an FP8 GEMM runs at the measured rate: 1402.6 TFLOP/s on an H100 (torch._scaled_mm, Bekman's
  // MAMF table), 71 % of the 1979 TFLOP/s datasheet peak; DeepGEMM's blockwise 1358 at its own shape.
  const AnalyticalCostModel h100(topology::h100_sxm5_80gb());
  const double m = 1024, n = 9216, k = 14336;
  EXPECT_NEAR(2 * m * n * k / h100.fp8_gemm_time_s(m, n, k, 1, Fp8Recipe::Tensorwise), 1402.6e12, 1e9);
  EXPECT_NEAR(2 * m * n * k / h100.fp8_gemm_time_s(m, n, k, 1, Fp8Recipe::Delayed), 1402.6e12, 1e9);
  EXPECT_NEAR(2 * 4096.0 * 7168 * 16384 / h100.fp8_gemm_time_s(4096, 7168, 16384, 1, Fp8Recipe::Blockwise), 1358e12,
              1e9);
  const AnalyticalCostModel b200(topology::b200_sxm_180gb());
  EXPECT_NEAR(2 * 15360.0 * 4096 * 3072 / b200.fp8_gemm_time_s(15360, 4096, 3072, 1, Fp8Recipe::Tensorwise), 3432.5e12,
              1e9);
  // MXFP8 at the per-tensor measurement times TE's measured block-scaled ratio (sim/fp8_gemm.cpp): 5 % slower.
  EXPECT_NEAR(2 * 15360.0 * 4096 * 3072 / b200.fp8_gemm_time_s(15360, 4096, 3072, 1, Fp8Recipe::Mxfp8),
              3432.5e12 * 6.812 / 7.161, 1e9);
  // A large FP8 GEMM is faster than its 16-bit twin and slower than the FP8 datasheet peak allows.
  const double bf16 = h100.gemm_time_s(8192, 8192, 8192, 1, model::DType::BF16);
  const double fp8 = h100.fp8_gemm_time_s(8192, 8192, 8192, 1, Fp8Recipe::Delayed);
  EXPECT_LT(fp8, bf16);
  EXPECT_GT(fp8, 2 * 8192.0 * 8192 * 8192 / topology::h100_sxm5_80gb().fp8_flops);
  EXPECT_THROW(AnalyticalCostModel(topology::a100_sxm4_80gb()).fp8_gemm_time_s(m, n, k, 1, Fp8Recipe::Delayed),
               std::invalid_argument);
}

Plan h100_plan() {
  Plan plan;
  plan.layers = 8;
  plan.hidden = 4096;
  plan.heads = 32;
  plan.seq = 2048;
  plan.vocab = 32000;
  plan.tp = 8;
  plan.pp = 2;
  plan.dp = 2;
  plan.micro_batch = 1;
  plan.global_batch = 16;
  plan.sequence_parallel = true;
  plan.nodes = 4;
  plan.node = "dgx-h100";
  return plan;
}

TEST(Fp8, TheProgramRunsTheLayersGemmsInFp8WithTheirCasts) {
  model::Scenario s = make_scenario(h100_plan());
  s.model.fp8 = model::Fp8Format::Hybrid;
  s.framework.transformer_engine = true;  // FP8 runs through TE's modules
  EXPECT_TRUE(model::runs_in_fp8(s, model::ComputeKind::MlpUp));
  EXPECT_FALSE(model::runs_in_fp8(s, model::ComputeKind::LmHead));  // the output layer stays in bf16
  EXPECT_FALSE(model::runs_in_fp8(s, model::ComputeKind::AttentionCore));
  const model::Program program = model::build_program(s, model::Granularity::Op);
  int fp8_gemms = 0, amax = 0;
  double gathered = 0;
  for (const model::Op& op : program.stage_ops[0]) {
    if (op.kind == model::OpKind::Compute && op.breakdown) {
      for (const model::Kernel& kernel : op.breakdown->kernels) fp8_gemms += kernel.kind == model::KernelKind::Fp8Gemm;
    }
    amax += op.payload == model::Payload::Fp8Amax && op.kind == model::OpKind::Collective;
    if (op.kind == model::OpKind::Collective && op.payload == model::Payload::LayerInput &&
        op.phase == model::Phase::Forward && op.layer == 0 && op.micro_batch == 0) {
      gathered += op.bytes;
    }
  }
  // 4 layers on stage 0, 4 GEMMs each, forward and backward, 8 micro-batches.
  EXPECT_EQ(fp8_gemms, 4 * 4 * 2 * 8);
  // Delayed scaling: one amax all-reduce per chunk forward and backward and micro-batch.
  EXPECT_EQ(amax, 2 * 8);
  // The sequence-parallel gathers of the QKV and MLP-up inputs move one byte per element.
  EXPECT_DOUBLE_EQ(gathered, 2 * 2048.0 * 4096 * 1);
}

TEST(Fp8, AnIterationTakesBetweenItsBf16TimeAndHalfOfIt) {
  const model::Scenario bf16 = make_scenario(h100_plan());
  model::Scenario fp8 = bf16;
  fp8.model.fp8 = model::Fp8Format::Hybrid;
  fp8.framework.transformer_engine = true;  // FP8 runs through TE's modules
  const AnalyticalCostModel cost(topology::h100_sxm5_80gb());
  const double t16 = simulate(model::build_program(bf16, model::Granularity::Layer), cost).timeline.iteration_time_s;
  const double t8 = simulate(model::build_program(fp8, model::Granularity::Layer), cost).timeline.iteration_time_s;
  EXPECT_LT(t8, t16);
  EXPECT_GT(t8, t16 / 2);
  // Each recipe costs differently: tensorwise reads every cast tensor once more for its amax.
  model::Scenario tensorwise = fp8;
  tensorwise.framework.fp8_recipe = Fp8Recipe::Tensorwise;
  const double tt =
      simulate(model::build_program(tensorwise, model::Granularity::Layer), cost).timeline.iteration_time_s;
  EXPECT_GT(tt, t8 * 0.999);
  // No more than bf16's time, within 2 %: on these TP-8 shards (N or K of 512 to 2048 per rank) the amax pass takes
  // back about what FP8's GEMMs gain once no GEMM runs past its measured rate (0.04 % slower when the ceiling came);
  // Transformer Engine's own measurement has FP8 slower than bf16 at small shapes (issue #445: 1024^3 on an H100).
  EXPECT_LT(tt, t16 * 1.02);
  EXPECT_LT(t8, t16 * 0.99);  // delayed scaling, with no amax pass, still gains
}

// Under context parallelism a rank's amaxes are those of its two chunks of each sequence: delayed scaling reduces them
// over the CP ranks too (Megatron-Core's amax reduction group is built with_context_parallel=True:
// megatron/core/fp8_utils.py, get_fp8_context), so the Program's amax all-reduce runs over DataWithContext even
// without DP replicas, and costs time: Llama 3 8B on TP 8 x CP 2, one node per CP rank, crosses the fabric.
TEST(Fp8, DelayedAmaxesReduceOverTheContextParallelRanks) {
  model::Scenario s = cp_scenarios::llama3_8b(8192, 2);
  s.model.fp8 = model::Fp8Format::Hybrid;
  s.framework.transformer_engine = true;  // FP8 runs through TE's modules
  const model::Program program = model::build_program(s, model::Granularity::Layer);
  ASSERT_EQ(program.layout.group_members(model::Group::DataWithContext, 0).size(), 2u);
  const SimResult result = simulate(program, AnalyticalCostModel(topology::h100_sxm5_80gb()));
  const auto& ops = program.stage_ops[0];
  int amax = 0;
  for (const report::OpSpan& span : result.timeline.ranks[0].spans) {
    const model::Op& op = ops[static_cast<std::size_t>(span.op)];
    if (op.kind != model::OpKind::Collective || op.payload != model::Payload::Fp8Amax) continue;
    ++amax;
    EXPECT_EQ(op.group, model::Group::DataWithContext) << "op " << span.op;
    EXPECT_GT(span.end_s, span.active_s) << "op " << span.op << ": an all-reduce across two nodes takes time";
  }
  EXPECT_EQ(amax, 2 * 2);  // a forward and a backward region per micro-batch, 2 micro-batches
  // Without CP (and DP) the group is TP's: the region's scales update with nothing to reduce across nodes.
  model::Scenario one = cp_scenarios::llama3_8b(8192, 1);
  one.model.fp8 = model::Fp8Format::Hybrid;
  one.framework.transformer_engine = true;  // FP8 runs through TE's modules
  int regions = 0;
  for (const model::Op& op : model::build_program(one, model::Granularity::Layer).stage_ops[0]) {
    if (op.kind == model::OpKind::Collective && op.payload == model::Payload::Fp8Amax) {
      ++regions;
      EXPECT_EQ(op.group, model::Group::Tensor);
    }
  }
  EXPECT_GT(regions, 0) << "the Program without CP has no amax region to check";
}

}  // namespace
}  // namespace twin::sim

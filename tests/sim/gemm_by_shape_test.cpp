// GEMMs by shape (sim/measured_tables.hpp, sim/data/gemm_by_shape.csv: OpenXLA's measured bf16 rates): a weight GEMM
// is no faster than the large-GEMM rate times the measured shape factor, on the GPUs with a table (GH100, B200); the
// A100 has none and keeps its tile-quantized model. The factor falls with the shape (a 2048-row expert GEMM runs at
// well under the large-GEMM rate), and the cost engages at layer and op granularity alike.
#include <gtest/gtest.h>

#include "model/program/program.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/support.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {
namespace {

TEST(GemmByShape, TheTablesCoverTheGpusThatHaveOne) {
  EXPECT_NE(gemm_shape_table(topology::h100_sxm5_80gb().name), nullptr);
  EXPECT_NE(gemm_shape_table(topology::h200_sxm_141gb().name), nullptr);
  EXPECT_NE(gemm_shape_table("B200-SXM-180GB"), nullptr);
  EXPECT_EQ(gemm_shape_table("GB200-186GB"), gemm_shape_table("B200-SXM-180GB"));  // the same die: B200's table
  EXPECT_EQ(gemm_shape_table(topology::a100_sxm4_80gb().name), nullptr);           // OpenXLA has no sm_80 table
}

TEST(GemmByShape, TheFactorFallsWithTheShapeAndIsOneAtTheLargest) {
  for (const char* gpu : {"H100-SXM5-80GB", "B200-SXM-180GB"}) {
    const GemmShapeTable& table = *gemm_shape_table(gpu);
    EXPECT_DOUBLE_EQ(table.shape_factor(4096, 4096, 4096), 1.0) << gpu;
    EXPECT_DOUBLE_EQ(table.shape_factor(16384, 8192, 65536), 1.0) << gpu;  // past the grid: its edge
    double previous = 0;
    for (const double m : {256.0, 512.0, 1024.0, 2048.0, 4096.0}) {  // square GEMMs: more work, closer to peak
      const double factor = table.shape_factor(m, m, m);
      EXPECT_GT(factor, previous) << gpu << " m = " << m;
      previous = factor;
    }
    // Between two grid points the rate lies between theirs (log-linear interpolation).
    const double low = table.flops_per_s(2048, 1024, 2048), high = table.flops_per_s(2048, 2048, 2048);
    const double between = table.flops_per_s(2048, 1536, 2048);
    EXPECT_GT(between, std::min(low, high));
    EXPECT_LT(between, std::max(low, high));
  }
}

// Qwen3-30B-A3B's expert GEMMs on EP 8 at micro-batch 1: 16 local experts of 2048 rows each, hidden 2048, width 768.
TEST(GemmByShape, ExpertGemmsRunWellUnderTheLargeGemmRate) {
  const topology::GpuSpec gpu = topology::h100_sxm5_80gb();
  const AnalyticalCostModel shaped(gpu);
  AnalyticalParameters without = analytical_parameters(gpu);
  without.gemm_shapes = nullptr;
  const AnalyticalCostModel unshaped(gpu, without);
  const auto bf16 = model::DType::BF16;
  const double up = shaped.weight_gemm_time_s(2048, 1536, 2048, 16, bf16);
  const double down = shaped.weight_gemm_time_s(2048, 2048, 768, 16, bf16);
  // The table puts these shapes at 0.55 to 0.76 of 4096^3's rate; tile and wave quantization alone (16 GEMMs' tiles
  // counted as one grid) at 0.9 or more: at least 10 % slower, and no more than twice.
  EXPECT_GT(up, 1.1 * unshaped.weight_gemm_time_s(2048, 1536, 2048, 16, bf16));
  EXPECT_GT(down, 1.1 * unshaped.weight_gemm_time_s(2048, 2048, 768, 16, bf16));
  EXPECT_LT(up, 2.0 * unshaped.weight_gemm_time_s(2048, 1536, 2048, 16, bf16));
  // The down GEMM (K = 768) loses more than the up GEMM (K = 2048) per FLOP.
  EXPECT_GT(down / (2048.0 * 2048 * 768), up / (2048.0 * 1536 * 2048));
  // A large dense GEMM: the quantized model, as before (the factor is 1 there).
  EXPECT_DOUBLE_EQ(shaped.weight_gemm_time_s(8192, 8192, 8192, 1, bf16),
                   unshaped.weight_gemm_time_s(8192, 8192, 8192, 1, bf16));
  // FP8 takes the same factor on its own large-GEMM rate.
  const model::Fp8Recipe recipe = model::Fp8Recipe::Tensorwise;
  EXPECT_GT(shaped.weight_gemm_time_s(2048, 1536, 2048, 16, bf16, &recipe),
            1.1 * unshaped.weight_gemm_time_s(2048, 1536, 2048, 16, bf16, &recipe));
}

TEST(GemmByShape, TheA100KeepsItsModel) {
  const topology::GpuSpec gpu = topology::a100_sxm4_80gb();
  const AnalyticalCostModel cost(gpu);
  EXPECT_EQ(cost.parameters().gemm_shapes, nullptr);
  EXPECT_DOUBLE_EQ(cost.weight_gemm_time_s(2048, 1536, 2048, 16, model::DType::BF16),
                   cost.gemm_time_s(2048, 1536, 2048, 16, model::DType::BF16));
}

model::Scenario small_moe_h100(int pp) {
  testing::Plan plan;
  plan.layers = 4;
  plan.hidden = 2048;
  plan.heads = 16;
  plan.seq = 2048;
  plan.vocab = 4096;
  plan.pp = pp;
  plan.dp = 4;
  plan.global_batch = 8;
  plan.gpus_per_node = 4 * pp;
  plan.node = "dgx-h100";
  model::Scenario s = testing::make_scenario(plan);
  s.model.experts = 64;
  s.model.top_k = 4;
  s.model.moe_ffn_hidden = 768;
  s.parallel.ep = 4;
  return s;
}

// The shape cost engages wherever a weight GEMM is timed: in a fused layer op's parts (layer granularity) and in the
// op-by-op Program, on one stage and on two, by about the same amount.
TEST(GemmByShape, EngagesAtLayerAndOpGranularity) {
  const topology::GpuSpec gpu = topology::h100_sxm5_80gb();
  const AnalyticalCostModel shaped(gpu);
  AnalyticalParameters without = analytical_parameters(gpu);
  without.gemm_shapes = nullptr;
  const AnalyticalCostModel unshaped(gpu, without);
  for (const int pp : {1, 2}) {
    const model::Scenario s = small_moe_h100(pp);
    double moved_s[2] = {0, 0};
    int i = 0;
    for (const model::Granularity granularity : {model::Granularity::Layer, model::Granularity::Op}) {
      const model::Program program = model::build_program(s, granularity);
      const double with_s = simulate(program, shaped).timeline.iteration_time_s;
      const double before_s = simulate(program, unshaped).timeline.iteration_time_s;
      EXPECT_GT(with_s, before_s * 1.02) << "pp " << pp << " granularity " << i;
      moved_s[i++] = with_s - before_s;
    }
    // Layer and op granularity time the same GEMMs; only the order of their other ops' overlaps differs.
    EXPECT_NEAR(moved_s[0], moved_s[1], 0.1 * moved_s[1]) << "pp " << pp;
  }
}

}  // namespace
}  // namespace twin::sim

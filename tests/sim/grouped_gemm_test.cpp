// The experts' grouped GEMM as the analytical cost model times it (model/ops/moe_ops.cpp gives each expert GEMM op
// gemm.m = rows / local experts and gemm.count = local experts): the dense GEMM model applied to each expert's
// [rows / E, k] x [k, n], with its tile and wave quantization, and memory bound on every expert's weight when the
// rows per expert are few. No grouped-GEMM efficiency of its own: twin has no cited measurement of one.
#include <gtest/gtest.h>

#include "sim/cost_model.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {
namespace {

TEST(GroupedGemm, FewRowsPerExpertCostMoreThanOneGemmOfTheSameFlops) {
  const AnalyticalCostModel cost(topology::h100_sxm5_80gb());
  const double rows = 32768, n = 1536, k = 2048;  // Qwen3-30B-A3B's up GEMM on 4096 tokens x top 8
  const double one = cost.gemm_time_s(rows, n, k, 1, model::DType::BF16);
  double previous = one;
  for (const double experts : {16.0, 64.0, 256.0, 1024.0}) {
    const double grouped = cost.gemm_time_s(rows / experts, n, k, experts, model::DType::BF16);
    EXPECT_GE(grouped, previous * (1 - 1e-12)) << experts << " experts";  // never faster with fewer rows each
    previous = grouped;
  }
  // At 32 rows per expert (1024 experts), reading the experts' weights bounds it: 2 bytes x k x n each.
  const double weights_s = cost.memory_time_s(2 * k * n * 1024);
  EXPECT_GE(previous, weights_s * (1 - 1e-12));
  EXPECT_GT(previous, 2 * one);
}

}  // namespace
}  // namespace twin::sim

// The measured FP8 GEMM rates: below each part's FP8 peak, above what its 16-bit GEMMs reach, and the recipes each
// part can run.
#include "sim/fp8_gemm.hpp"

#include <gtest/gtest.h>

#include <stdexcept>

namespace twin::sim {
namespace {

using model::Fp8Recipe;

TEST(Fp8Gemm, MeasuredRatesLieBetweenThe16BitPeakAndTheFp8Peak) {
  for (const topology::GpuSpec& gpu :
       {topology::h100_sxm5_80gb(), topology::h200_sxm_141gb(), topology::h800_sxm5_80gb(), topology::b200_sxm_180gb(),
        topology::gb200_186gb()}) {
    for (Fp8Recipe recipe : {Fp8Recipe::Delayed, Fp8Recipe::Tensorwise, Fp8Recipe::Blockwise}) {
      const Fp8GemmMeasurement measured = fp8_gemm_measurement(gpu, recipe);
      EXPECT_LT(measured.flops_per_s, gpu.fp8_flops) << gpu.name;
      EXPECT_GT(measured.flops_per_s, gpu.bf16_flops) << gpu.name;  // FP8 is worth it: faster than any 16-bit GEMM
      EXPECT_GT(measured.m * measured.n * measured.k, 0);
      EXPECT_FALSE(measured.source.empty());
    }
  }
  EXPECT_DOUBLE_EQ(fp8_gemm_measurement(topology::h100_sxm5_80gb(), Fp8Recipe::Delayed).flops_per_s, 1402.6e12);
  EXPECT_DOUBLE_EQ(fp8_gemm_measurement(topology::h100_sxm5_80gb(), Fp8Recipe::Blockwise).flops_per_s, 1358e12);
  EXPECT_DOUBLE_EQ(fp8_gemm_measurement(topology::b200_sxm_180gb(), Fp8Recipe::Mxfp8).flops_per_s, 3432.5e12);
  EXPECT_TRUE(fp8_gemm_measurement(topology::b200_sxm_180gb(), Fp8Recipe::Mxfp8).assumed);
  EXPECT_FALSE(fp8_gemm_measurement(topology::h200_sxm_141gb(), Fp8Recipe::Tensorwise).assumed);
  EXPECT_TRUE(fp8_gemm_measurement(topology::h800_sxm5_80gb(), Fp8Recipe::Tensorwise).assumed);
}

TEST(Fp8Gemm, RefusesWhatThePartCannotRun) {
  EXPECT_THROW(fp8_gemm_measurement(topology::a100_sxm4_80gb(), Fp8Recipe::Delayed), std::invalid_argument);
  try {
    fp8_gemm_measurement(topology::h100_sxm5_80gb(), Fp8Recipe::Mxfp8);
    FAIL() << "MXFP8 on a Hopper part was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("fp8_recipe"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace twin::sim

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
  // Blackwell's block-scaled GEMMs at the per-tensor rate times TE's measured ratio (B300, pre-quantized MXFP8
  // against FP8 CurrentScaling: 6.812 / 7.161 ms a layer), on both Blackwell parts and for both block recipes.
  EXPECT_DOUBLE_EQ(fp8_gemm_measurement(topology::b200_sxm_180gb(), Fp8Recipe::Mxfp8).flops_per_s,
                   3432.5e12 * 6.812 / 7.161);
  EXPECT_DOUBLE_EQ(fp8_gemm_measurement(topology::gb200_186gb(), Fp8Recipe::Mxfp8).flops_per_s,
                   3615.6e12 * 6.812 / 7.161);
  EXPECT_DOUBLE_EQ(fp8_gemm_measurement(topology::b200_sxm_180gb(), Fp8Recipe::Blockwise).flops_per_s,
                   fp8_gemm_measurement(topology::b200_sxm_180gb(), Fp8Recipe::Mxfp8).flops_per_s);
  EXPECT_TRUE(fp8_gemm_measurement(topology::b200_sxm_180gb(), Fp8Recipe::Mxfp8).assumed);
  EXPECT_NE(fp8_gemm_measurement(topology::b200_sxm_180gb(), Fp8Recipe::Mxfp8).source.find("gemm_profiling"),
            std::string_view::npos);
  EXPECT_FALSE(fp8_gemm_measurement(topology::h200_sxm_141gb(), Fp8Recipe::Tensorwise).assumed);
  EXPECT_TRUE(fp8_gemm_measurement(topology::h800_sxm5_80gb(), Fp8Recipe::Tensorwise).assumed);
}

// Each part's rate is its own cited measurement (sim/fp8_gemm.cpp's sources), shape included: a part given another's
// row (the H200 the H100's 1402.6 TFLOP/s) fails here, which the range check above cannot see.
TEST(Fp8Gemm, EachPartHasItsCitedMeasurement) {
  struct Cited {
    topology::GpuSpec gpu;
    Fp8Recipe recipe;
    double flops_per_s, m, n, k;
  };
  const Cited table[] = {
      {topology::h100_sxm5_80gb(), Fp8Recipe::Delayed, 1402.6e12, 1024, 9216, 14336},
      {topology::h100_sxm5_80gb(), Fp8Recipe::Tensorwise, 1402.6e12, 1024, 9216, 14336},
      {topology::h200_sxm_141gb(), Fp8Recipe::Delayed, 1453.4e12, 1280, 4096, 12032},
      {topology::h200_sxm_141gb(), Fp8Recipe::Tensorwise, 1453.4e12, 1280, 4096, 12032},
      {topology::h800_sxm5_80gb(), Fp8Recipe::Delayed, 1402.6e12, 1024, 9216, 14336},
      {topology::b200_sxm_180gb(), Fp8Recipe::Delayed, 3432.5e12, 15360, 4096, 3072},
      {topology::gb200_186gb(), Fp8Recipe::Tensorwise, 3615.6e12, 19456, 5120, 1536},
      // DeepGEMM's H800 measurement stands for every Hopper part under block scales
      {topology::h100_sxm5_80gb(), Fp8Recipe::Blockwise, 1358e12, 4096, 7168, 16384},
      {topology::h200_sxm_141gb(), Fp8Recipe::Blockwise, 1358e12, 4096, 7168, 16384},
  };
  for (const Cited& c : table) {
    const Fp8GemmMeasurement measured = fp8_gemm_measurement(c.gpu, c.recipe);
    EXPECT_EQ(measured.flops_per_s, c.flops_per_s) << c.gpu.name << " recipe " << static_cast<int>(c.recipe);
    EXPECT_EQ(measured.m, c.m) << c.gpu.name;
    EXPECT_EQ(measured.n, c.n) << c.gpu.name;
    EXPECT_EQ(measured.k, c.k) << c.gpu.name;
  }
  EXPECT_NE(fp8_gemm_measurement(topology::h200_sxm_141gb(), Fp8Recipe::Delayed).source.find("H200"),
            std::string_view::npos);
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

// FP8 format and recipe names (Megatron-Core's --fp8-format and --fp8-recipe) and what each implies.
#include "model/scenario/precision.hpp"

#include <gtest/gtest.h>

namespace twin::model {
namespace {

TEST(Precision, NamesAreMegatronCoresFlags) {
  for (Fp8Format format : {Fp8Format::None, Fp8Format::Hybrid, Fp8Format::E4M3}) {
    EXPECT_EQ(fp8_format_from_name(to_string(format)), format);
  }
  for (Fp8Recipe recipe : {Fp8Recipe::Delayed, Fp8Recipe::Tensorwise, Fp8Recipe::Blockwise, Fp8Recipe::Mxfp8}) {
    EXPECT_EQ(fp8_recipe_from_name(to_string(recipe)), recipe);
  }
  EXPECT_FALSE(fp8_format_from_name("e5m2").has_value());  // TE refuses pure E5M2 training
  EXPECT_FALSE(fp8_recipe_from_name("nvfp4").has_value());
}

TEST(Precision, HybridReadsGradientsInE5M2) {
  EXPECT_EQ(fp8_element(Fp8Format::Hybrid, true), Fp8Element::E5M2);
  EXPECT_EQ(fp8_element(Fp8Format::Hybrid, false), Fp8Element::E4M3);
  EXPECT_EQ(fp8_element(Fp8Format::E4M3, true), Fp8Element::E4M3);
}

TEST(Precision, RecipesScaleAndReduceDifferently) {
  EXPECT_TRUE(fp8_recipe_reduces_amax(Fp8Recipe::Delayed));
  EXPECT_FALSE(fp8_recipe_reduces_amax(Fp8Recipe::Mxfp8));
  EXPECT_DOUBLE_EQ(fp8_scale_bytes_per_element(Fp8Recipe::Mxfp8), 1.0 / 32);      // one E8M0 byte per 32
  EXPECT_DOUBLE_EQ(fp8_scale_bytes_per_element(Fp8Recipe::Blockwise), 1.0 / 32);  // one fp32 per 128
  EXPECT_DOUBLE_EQ(fp8_scale_bytes_per_element(Fp8Recipe::Delayed), 0);
}

}  // namespace
}  // namespace twin::model

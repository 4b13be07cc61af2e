// FP8 names (one table of them: scenario_names.hpp) and what each format and recipe implies.
#include "model/scenario/precision.hpp"

#include "model/scenario/scenario_names.hpp"

namespace twin::model {

std::string_view to_string(Fp8Format format) {
  return names::name_of(names::kFp8Formats, format);
}
std::string_view to_string(Fp8Recipe recipe) {
  return names::name_of(names::kFp8Recipes, recipe);
}
std::optional<Fp8Format> fp8_format_from_name(std::string_view name) {
  return names::value_named(names::kFp8Formats, name);
}
std::optional<Fp8Recipe> fp8_recipe_from_name(std::string_view name) {
  return names::value_named(names::kFp8Recipes, name);
}

Fp8Element fp8_element(Fp8Format format, bool output_gradient) {
  return format == Fp8Format::Hybrid && output_gradient ? Fp8Element::E5M2 : Fp8Element::E4M3;
}

bool fp8_recipe_reduces_amax(Fp8Recipe recipe) {
  return recipe == Fp8Recipe::Delayed;
}

double fp8_scale_bytes_per_element(Fp8Recipe recipe) {
  switch (recipe) {
    case Fp8Recipe::Blockwise:
      return 4.0 / 128;
    case Fp8Recipe::Mxfp8:
      return 1.0 / 32;
    case Fp8Recipe::Delayed:
    case Fp8Recipe::Tensorwise:
      break;
  }
  return 0;
}

}  // namespace twin::model

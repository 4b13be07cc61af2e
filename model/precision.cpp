#include "model/precision.hpp"

namespace twin::model {

namespace {
template <class Enum>
struct Named {
  Enum value;
  std::string_view name;
};
constexpr Named<Fp8Format> kFormats[] = {
    {Fp8Format::None, "none"}, {Fp8Format::Hybrid, "hybrid"}, {Fp8Format::E4M3, "e4m3"}};
constexpr Named<Fp8Recipe> kRecipes[] = {{Fp8Recipe::Delayed, "delayed"},
                                         {Fp8Recipe::Tensorwise, "tensorwise"},
                                         {Fp8Recipe::Blockwise, "blockwise"},
                                         {Fp8Recipe::Mxfp8, "mxfp8"}};

template <class Enum, std::size_t N>
std::string_view name_in(const Named<Enum> (&table)[N], Enum value) {
  for (const auto& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return "?";
}

template <class Enum, std::size_t N>
std::optional<Enum> value_in(const Named<Enum> (&table)[N], std::string_view name) {
  for (const auto& entry : table) {
    if (entry.name == name) return entry.value;
  }
  return std::nullopt;
}
}  // namespace

std::string_view to_string(Fp8Format format) {
  return name_in(kFormats, format);
}
std::string_view to_string(Fp8Recipe recipe) {
  return name_in(kRecipes, recipe);
}
std::optional<Fp8Format> fp8_format_from_name(std::string_view name) {
  return value_in(kFormats, name);
}
std::optional<Fp8Recipe> fp8_recipe_from_name(std::string_view name) {
  return value_in(kRecipes, name);
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

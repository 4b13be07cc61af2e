// Token counts: a number, then at most one scale letter.
#include "api/token_count.hpp"

#include <cctype>
#include <cmath>
#include <exception>
#include <utility>

#include <fmt/core.h>

#include "model/scenario/errors.hpp"

namespace twin::api {

std::pair<double, std::size_t> leading_number(const std::string& text) {
  try {
    std::size_t used = 0;
    const double value = std::stod(text, &used);
    return {value, used};
  } catch (const std::exception&) {
    return {0.0, 0};
  }
}

double parse_token_count(const std::string& flag, const std::string& text) {
  auto [value, used] = leading_number(text);
  // A trailing k, M, B (or G) or T, in either case, scales the number.
  constexpr std::pair<char, double> kSuffixes[] = {{'k', 1e3}, {'m', 1e6}, {'b', 1e9}, {'g', 1e9}, {'t', 1e12}};
  double scale = 1;
  if (used > 0 && used + 1 == text.size()) {
    const char suffix = static_cast<char>(std::tolower(static_cast<unsigned char>(text.back())));
    for (const auto& [letter, factor] : kSuffixes) {
      if (letter == suffix) {
        scale = factor;
        ++used;
      }
    }
  }
  value *= scale;
  if (used == 0 || used != text.size() || !std::isfinite(value) || value < 1 || value > 1e18) {
    throw UserError(
        fmt::format("{}: expected a number of tokens from 1 to 1e18 (300e9, 300B, 1.4T), got '{}'", flag, text));
  }
  return value;
}

}  // namespace twin::api

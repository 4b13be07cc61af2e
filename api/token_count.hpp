// A number of tokens as people write it: 300e9, 300B, 1.4T, 500M.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

namespace twin::api {

// The number `text` starts with, and how many characters it took (0: it starts with none): what a flag's value with a
// unit after its number ("300B", "5%") reads first.
std::pair<double, std::size_t> leading_number(const std::string& text);

// Suffixes k, M, B or G, T (either case); at least one and at most 1e18. Throws UserError naming `flag` otherwise.
double parse_token_count(const std::string& flag, const std::string& text);

}  // namespace twin::api

// A number of tokens as people write it: 300e9, 300B, 1.4T, 500M.
#pragma once

#include <string>

namespace twin::api {

// Suffixes k, M, B or G, T (either case); at least one and at most 1e18. Throws UserError naming `flag` otherwise.
double parse_token_count(const std::string& flag, const std::string& text);

}  // namespace twin::api

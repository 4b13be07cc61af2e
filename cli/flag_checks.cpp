// The checks of numeric and file flags at parse time, before any work, with messages a person can read.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <system_error>
#include <utility>

#include <unistd.h>

#include <fmt/core.h>

#include "api/token_count.hpp"
#include "cli/commands.hpp"

namespace twin::cli {

namespace fs = std::filesystem;

CLI::Validator output_file() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        if (path.empty()) return "the file name is empty";
        std::error_code error;
        if (fs::is_directory(path, error)) return fmt::format("'{}' is a directory: give a file name", path);
        const fs::path parent = fs::path(path).parent_path();
        if (!parent.empty() && !fs::is_directory(parent, error)) {
          return fmt::format("'{}': there is no directory '{}'", path, parent.string());
        }
        return {};
      },
      "FILE");
}

CLI::Validator between(double minimum, double maximum) {
  return CLI::Validator(
      [minimum, maximum](std::string& text) -> std::string {
        const auto [value, used] = api::leading_number(text);
        if (used == 0 || used != text.size() || !std::isfinite(value)) {
          return fmt::format("expected a finite number, got '{}'", text);
        }
        if (value < minimum) return fmt::format("must be at least {}, got {}", minimum, text);
        if (value > maximum) return fmt::format("must be at most {}, got {}", maximum, text);
        return {};
      },
      std::isfinite(maximum) ? fmt::format("{}..{}", minimum, maximum) : fmt::format(">={}", minimum));
}


CLI::Validator token_count(const std::string& flag) {
  return CLI::Validator(
      [flag](std::string& text) -> std::string {
        try {
          parse_token_count(flag, text);
        } catch (const UserError& error) {
          return error.what();
        }
        return {};
      },
      "TOKENS");
}

CLI::Validator at_least(double minimum) {
  return between(minimum, std::numeric_limits<double>::infinity());
}

}  // namespace twin::cli

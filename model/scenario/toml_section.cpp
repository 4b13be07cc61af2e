// The TOML reader's checks: each value's type and range, with the place it came from.
#include "model/scenario/toml_section.hpp"

#include <cmath>
#include <limits>
#include <sstream>

namespace twin::model {

bool parse_version(std::string_view text, std::array<int, 3>& out) {
  std::array<int, 3> parts{0, 0, 0};
  std::size_t part = 0, digits = 0;
  for (const char c : text) {
    if (c == '.') {
      if (digits == 0 || ++part > 2) return false;
      digits = 0;
    } else if (c >= '0' && c <= '9') {
      if (++digits > 4) return false;  // no release numbers this long
      parts[part] = parts[part] * 10 + (c - '0');
    } else {
      return false;
    }
  }
  if (digits == 0 || part < 1) return false;
  out = parts;
  return true;
}

const toml::table* section_table(const toml::table& root, std::string_view name, const std::string& source,
                                 std::vector<std::string>& problems) {
  const toml::node* node = root.get(name);
  if (!node) return nullptr;
  if (!node->is_table()) {
    problems.push_back(fmt::format("{}: [{}] must be a table", source, name));
    return nullptr;
  }
  return node->as_table();
}

void SectionReader::integer(std::string_view key, std::int64_t& out) {
  const toml::node* node = take(key);
  if (!node) return;
  if (auto value = node->value_exact<std::int64_t>()) {
    // Every size fits in 31 bits; beyond, products of sizes (tp * pp * dp, nodes * GPUs) could overflow.
    constexpr std::int64_t kLargest = std::numeric_limits<std::int32_t>::max();
    if (*value > kLargest || *value < -kLargest) {
      problem(*node, key, fmt::format("{} is too large (at most {})", *value, kLargest));
      return;
    }
    out = *value;
  } else {
    problem(*node, key, fmt::format("expected an integer, got {}", describe(*node)));
  }
}

void SectionReader::number(std::string_view key, std::optional<double>& out) {
  if (!has(key)) return;
  double value = 0;
  const std::size_t problems_before = problems_.size();
  number(key, value);
  if (problems_.size() == problems_before) out = value;
}

void SectionReader::number(std::string_view key, double& out) {
  const toml::node* node = take(key);
  if (!node) return;
  if (node->is_floating_point() || node->is_integer()) {
    const double value = node->value<double>().value_or(0.0);
    // TOML spells nan and inf; no quantity of a scenario is either.
    if (!std::isfinite(value)) {
      problem(*node, key, fmt::format("expected a finite number, got {}", describe(*node)));
      return;
    }
    out = value;
  } else {
    problem(*node, key, fmt::format("expected a number, got {}", describe(*node)));
  }
}

void SectionReader::boolean(std::string_view key, bool& out) {
  const toml::node* node = take(key);
  if (!node) return;
  if (auto value = node->value_exact<bool>()) {
    out = *value;
  } else {
    problem(*node, key, fmt::format("expected true or false, got {}", describe(*node)));
  }
}

void SectionReader::text(std::string_view key, std::string& out) {
  const toml::node* node = take(key);
  if (!node) return;
  if (auto value = node->value_exact<std::string>()) {
    out = *value;
  } else {
    problem(*node, key, fmt::format("expected a string, got {}", describe(*node)));
  }
}

void SectionReader::version(std::string_view key, std::array<int, 3>& out) {
  const toml::node* node = take(key);
  if (!node) return;
  const auto value = node->value_exact<std::string>();
  if (!value || !parse_version(*value, out)) {
    problem(*node, key,
            fmt::format("expected a release such as \"0.9.5\" (MAJOR.MINOR or MAJOR.MINOR.PATCH, "
                        "quoted), got {}",
                        describe(*node)));
  }
}

void SectionReader::unsigned_integer(std::string_view key, std::uint64_t& out) {
  std::int64_t value = static_cast<std::int64_t>(out);
  const bool present = has(key);
  integer(key, value);
  if (present && value < 0) {
    problems_.push_back(fmt::format("{}: {}.{} must be >= 0, got {}", source_, section_, key, value));
  }
  out = static_cast<std::uint64_t>(value);
}

void SectionReader::reject_unknown_keys() {
  if (!table_) return;
  for (auto&& [key, node] : *table_) {
    if (read_.count(std::string(key.str()))) continue;
    problem(node, key.str(), "unknown key");
  }
}

const toml::node* SectionReader::take(std::string_view key) {
  read_.insert(std::string(key));
  if (!table_) return nullptr;
  return table_->get(key);
}

std::string SectionReader::describe(const toml::node& node) {
  std::ostringstream out;
  if (node.is_string()) {
    out << "the string \"" << *node.value<std::string>() << "\"";
  } else if (node.is_table()) {
    out << "a table";
  } else if (node.is_array()) {
    out << "the array " << *node.as_array();
  } else if (node.is_boolean()) {
    out << (*node.value<bool>() ? "true" : "false");
  } else if (node.is_floating_point()) {
    // 8.0, not 8; 1e+30, not 1.e+30
    std::string shortest = fmt::format("{}", *node.value<double>());
    if (shortest.find_first_of(".einaEINA") == std::string::npos) shortest += ".0";
    out << "the float " << shortest;
  } else {
    node.visit([&out](auto&& value) {
      if constexpr (toml::is_value<decltype(value)>) out << *value;
    });
  }
  return out.str();
}

void SectionReader::problem(const toml::node& node, std::string_view key, const std::string& what) {
  const auto& begin = node.source().begin;
  if (begin.line > 0) {
    problems_.push_back(fmt::format("{}:{}:{}: {}.{}: {}", source_, begin.line, begin.column, section_, key, what));
  } else {
    problems_.push_back(fmt::format("{} (--set {}.{}): {}.{}: {}", source_, section_, key, section_, key, what));
  }
}

}  // namespace twin::model

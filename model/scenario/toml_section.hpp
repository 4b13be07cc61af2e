// Reading one [section] of a scenario's TOML into typed fields, collecting every problem (naming the file, line and
// column, or the --set that gave the value) instead of stopping at the first. Internal to model/.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "model/scenario/scenario_names.hpp"

namespace twin::model {

// "0.9.5" or "0.9" (patch 0) into {0, 9, 5}; false for anything else (a missing part, a sign, a suffix).
bool parse_version(std::string_view text, std::array<int, 3>& out);

// The table of [name], or nullptr when the document has none (or, with a problem, when it is not a table).
const toml::table* section_table(const toml::table& root, std::string_view name, const std::string& source,
                                 std::vector<std::string>& problems);

// Reads one [section] of the document into typed fields, collecting problems instead of stopping at the first.
class SectionReader {
 public:
  SectionReader(const toml::table* table, std::string section, std::string source, std::vector<std::string>& problems)
      : table_(table), section_(std::move(section)), source_(std::move(source)), problems_(problems) {}

  bool has(std::string_view key) const { return table_ && table_->contains(key); }

  // Each reads `key` when the section has it into `out` (left as it is otherwise), or records why it cannot.
  void integer(std::string_view key, std::int64_t& out);  // an integer of at most 31 bits
  void number(std::string_view key, double& out);         // a finite number (an integer is taken too)
  void number(std::string_view key, std::optional<double>& out);  // the same, set only when the section has it

  // An array of exactly N integers, each in 1..2^31-1 (a shape).
  template <std::size_t N>
  void positive_integers(std::string_view key, std::array<std::int64_t, N>& out) {
    const toml::node* node = take(key);
    if (!node) return;
    const toml::array* array = node->as_array();
    std::array<std::int64_t, N> values{};
    bool ok = array && array->size() == N;
    for (std::size_t i = 0; ok && i < N; ++i) {
      const auto value = (*array)[i].value_exact<std::int64_t>();
      ok = value && *value > 0 && *value <= std::numeric_limits<std::int32_t>::max();
      if (ok) values[i] = *value;
    }
    if (!ok) {
      problem(*node, key, fmt::format("expected an array of {} positive integers, got {}", N, describe(*node)));
      return;
    }
    out = values;
  }

  void boolean(std::string_view key, bool& out);
  void text(std::string_view key, std::string& out);
  // A software release, "0.9.5" or "0.9" (a string: as a TOML number 0.10 would read as 0.1).
  void version(std::string_view key, std::array<int, 3>& out);

  void unsigned_integer(std::string_view key, std::uint64_t& out);  // >= 0

  // One of the names of `table` (case-insensitive).
  template <typename Enum, std::size_t N>
  void choice(std::string_view key, Enum& out, const names::EnumName<Enum> (&table)[N]) {
    const toml::node* node = take(key);
    if (!node) return;
    auto value = node->value_exact<std::string>();
    if (!value) {
      problem(*node, key,
              fmt::format("expected one of {} (a string), got {}", names::allowed_names(table), describe(*node)));
      return;
    }
    for (const auto& entry : table) {
      if (names::lowercase(*value) == entry.name) {
        out = entry.value;
        return;
      }
    }
    problem(*node, key, fmt::format("unknown value \"{}\" (expected one of {})", *value, names::allowed_names(table)));
  }

  // Call after every known key was read: whatever is left is unknown.
  void reject_unknown_keys();

  // Marks keys that are valid but read elsewhere.
  void expect(std::string_view key) { read_.insert(std::string(key)); }

 private:
  const toml::node* take(std::string_view key);         // marks `key` read; nullptr when absent
  static std::string describe(const toml::node& node);  // "the string \"x\"", "the float 8.0", ...
  void problem(const toml::node& node, std::string_view key, const std::string& what);

  const toml::table* table_;
  std::string section_;
  std::string source_;
  std::vector<std::string>& problems_;
  std::set<std::string> read_;
};

}  // namespace twin::model

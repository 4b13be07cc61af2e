// Columns of the plan tables, their CSV and their sort.
#include "report/plan_tables.hpp"

#include <algorithm>
#include <cctype>
#include <numeric>
#include <optional>

#include <fmt/format.h>

#include "model/scenario/errors.hpp"

namespace twin::report {

namespace {

using nlohmann::json;

constexpr double kGiB = 1024.0 * 1024 * 1024;

double number_at(const json& row, const char* key) {
  const auto found = row.find(key);
  return found != row.end() && found->is_number() ? found->get<double>() : 0.0;
}
double training_at(const json& row, const char* key) {
  const auto found = row.find("training");
  return found != row.end() ? number_at(*found, key) : 0.0;
}
std::string text_at(const json& row, const char* key) {
  const auto found = row.find(key);
  if (found == row.end()) return "";
  return found->is_string() ? found->get<std::string>() : found->dump();
}

// A number column: `digits` after the point; empty where the row has no result.
Column numeric(std::string name, std::string heading, std::function<double(const json&)> value, int digits,
               bool larger_first = false) {
  auto text = [value, digits](const json& row) {
    return row_simulated(row) ? fmt::format("{:.{}f}", value(row), digits) : std::string();
  };
  return {std::move(name), std::move(heading), text, value, larger_first};
}
Column integer(const char* key, std::string heading) {
  return {key, std::move(heading), [key](const json& row) { return text_at(row, key); },
          [key](const json& row) { return number_at(row, key); }};
}
Column textual(std::string name, std::string heading, std::function<std::string(const json&)> text) {
  return {std::move(name), std::move(heading), std::move(text), {}};
}

bool any_row_has(const json& rows, const char* key) {
  return std::any_of(rows.begin(), rows.end(), [key](const json& row) { return row.contains(key); });
}
bool any_row_above_one(const json& rows, const char* key) {
  return std::any_of(rows.begin(), rows.end(), [key](const json& row) { return number_at(row, key) > 1; });
}

// The result columns both tables end with.
void add_results(std::vector<Column>& columns, const json& rows, bool every) {
  columns.push_back(numeric(
      "iter_s", "iter s", [](const json& r) { return number_at(r, "iteration_time_s"); }, 4));
  columns.push_back(numeric(
      "tflops", "TFLOP/s", [](const json& r) { return number_at(r, "tflops_per_gpu"); }, 1, true));
  columns.push_back(numeric(
      "bubble", "bubble %", [](const json& r) { return 100 * number_at(r, "bubble_fraction"); }, 1));
  columns.push_back(numeric(
      "mem_gib", "mem GiB", [](const json& r) { return number_at(r, "memory_per_gpu_bytes") / kGiB; }, 1));
  columns.push_back(textual(
      "fits", "fits", [](const json& r) { return row_simulated(r) ? (r.value("fits", false) ? "yes" : "NO") : ""; }));
  if (any_row_has(rows, "tokens_per_s")) {  // a sweep's
    columns.push_back(numeric(
        "tokens_per_s", "tokens/s", [](const json& r) { return number_at(r, "tokens_per_s"); }, 0, true));
  }
  if (every || any_row_has(rows, "goodput")) {
    columns.push_back(numeric(
        "goodput", "goodput %",
        [](const json& r) {
          return r.contains("goodput") ? 100 * number_at(r.at("goodput"), "goodput_fraction") : 0.0;
        },
        1, true));
  }
  if (every || any_row_has(rows, "training")) {
    columns.push_back(numeric(
        "days", "days", [](const json& r) { return training_at(r, "days"); }, 1));
    columns.push_back(numeric(
        "gpu_hours", "GPU-hours", [](const json& r) { return training_at(r, "gpu_hours"); }, 0));
    const bool priced =
        std::any_of(rows.begin(), rows.end(), [](const json& r) { return training_at(r, "cost_usd") > 0; });
    if (every || priced)
      columns.push_back(numeric(
          "cost_usd", "USD", [](const json& r) { return training_at(r, "cost_usd"); }, 0));
  }
  if (every || any_row_has(rows, "finishes_in_days")) {  // --days; sorted with the plans that finish first
    const auto finishes = [](const json& r) {
      const auto found = r.find("finishes_in_days");
      return found != r.end() && found->is_boolean() ? std::optional<bool>(found->get<bool>()) : std::nullopt;
    };
    columns.push_back({"finishes", "finishes",
                       [finishes](const json& r) {
                         const std::optional<bool> yes = finishes(r);
                         return yes ? std::string(*yes ? "yes" : "no") : std::string();
                       },
                       [finishes](const json& r) { return finishes(r).value_or(false) ? 1.0 : 0.0; }, true});
  }
  columns.push_back(textual("error", "error", [](const json& r) { return text_at(r, "error"); }));
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

}  // namespace

bool row_simulated(const json& row) {
  return text_at(row, "error").empty();
}

std::vector<Column> search_columns(const json& rows, bool every) {
  std::vector<Column> columns;
  std::vector<std::string> nodes;
  for (const json& row : rows) nodes.push_back(text_at(row, "node"));
  if (every || std::adjacent_find(nodes.begin(), nodes.end(), std::not_equal_to<>()) != nodes.end()) {
    columns.push_back(textual("node", "node", [](const json& r) { return text_at(r, "node"); }));
  }
  for (const char* key : {"tp", "pp", "dp"}) columns.push_back(integer(key, key));
  for (const char* key : {"cp", "ep", "etp"}) {
    if (every || any_row_above_one(rows, key)) columns.push_back(integer(key, key));
  }
  columns.push_back(integer("micro_batch", "mb"));
  columns.back().name = "mb";
  columns.push_back(textual("schedule", "schedule", [](const json& r) { return text_at(r, "schedule"); }));
  columns.push_back(integer("virtual_stages", "chunks"));
  columns.back().name = "chunks";
  columns.push_back(textual("recompute", "recompute", [](const json& r) {
    const double layers = number_at(r, "recompute_num_layers");
    return layers > 0 ? fmt::format("block {}", layers) : text_at(r, "recompute");
  }));
  columns.push_back(textual("sharding", "sharding", [](const json& r) {
    std::string out = r.value("sequence_parallel", false) ? "sp" : "";
    const double zero = number_at(r, "zero_stage");
    if (zero > 0) out += fmt::format("{}zero{}", out.empty() ? "" : " ", zero);
    return out.empty() ? std::string("-") : out;
  }));
  if (every || any_row_has(rows, "precision")) {
    columns.push_back(textual("precision", "precision", [](const json& r) { return text_at(r, "precision"); }));
  }
  add_results(columns, rows, every);
  return columns;
}

std::vector<Column> sweep_columns(const std::vector<std::string>& varied, const json& rows) {
  std::vector<Column> columns;
  for (const std::string& key : varied) {
    columns.push_back(textual(key, key, [key](const json& r) {
      const auto set = r.find("set");
      return set != r.end() && set->contains(key) ? text_at(*set, key.c_str()) : std::string();
    }));
  }
  columns.push_back(integer("gpus", "GPUs"));
  add_results(columns, rows, false);
  return columns;
}

std::string csv(const std::vector<Column>& columns, const json& rows) {
  const auto cell = [](const std::string& text) {
    if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
    std::string quoted = "\"";
    for (const char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    return quoted + "\"";
  };
  std::string out;
  for (std::size_t c = 0; c < columns.size(); ++c) out += (c ? "," : "") + cell(columns[c].name);
  out += "\n";
  for (const json& row : rows) {
    for (std::size_t c = 0; c < columns.size(); ++c) out += (c ? "," : "") + cell(columns[c].text(row));
    out += "\n";
  }
  return out;
}

const Column& column_named(const std::vector<Column>& columns, const std::string& name, const std::string& flag) {
  const auto column = std::find_if(columns.begin(), columns.end(), [&](const Column& c) {
    return lower(c.name) == lower(name) || lower(c.heading) == lower(name);
  });
  if (column == columns.end()) {
    std::string names;
    for (const Column& c : columns) names += (names.empty() ? "" : ", ") + c.name;
    throw UserError(fmt::format("{} '{}': no such column (the columns: {})", flag, name, names));
  }
  return *column;
}

std::vector<std::size_t> sorted_order(const std::vector<Column>& columns, const json& rows, const std::string& name,
                                      const std::string& flag) {
  const Column* column = &column_named(columns, name, flag);
  std::vector<std::size_t> order(rows.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const json &x = rows[a], &y = rows[b];
    if (row_simulated(x) != row_simulated(y)) return row_simulated(x);  // rows without a result last
    if (!column->number) return column->text(x) < column->text(y);
    const double u = column->number(x), v = column->number(y);
    return column->larger_first ? u > v : u < v;
  });
  return order;
}

}  // namespace twin::report

// The sections of a sweep's page (summary, the curve of iteration time against the varied key, time split,
// variants) and of a search's (summary, ranked plans, time split, plans). The tables are plan_tables' columns.
#include <cstdlib>

#include <fmt/format.h>

#include "report/html_parts.hpp"
#include "report/html_report.hpp"
#include "report/html_sections.hpp"
#include "report/plan_tables.hpp"

namespace twin::report::html {

namespace {

using nlohmann::json;

std::string table_of(const std::vector<Column>& columns, const json& rows) {
  std::vector<std::string> header;
  for (const Column& column : columns) header.push_back(column.heading);
  std::vector<std::vector<std::string>> cells;
  for (const json& row : rows) {
    std::vector<std::string> line;
    for (const Column& column : columns) line.push_back(column.text(row));
    cells.push_back(std::move(line));
  }
  return table(header, cells);
}

std::string split_section(const std::vector<std::string>& labels, const json& rows) {
  std::vector<StackedBar> bars;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (!row_simulated(rows[i])) continue;
    const double seconds = rows[i].value("iteration_time_s", 0.0);
    bars.push_back({labels[i], split_seconds(rows[i].value("time_split", json::object()), seconds)});
  }
  return section("time-split", "Where the iteration goes",
                 "<p class=\"note\">Mean of the stages of each simulation (report/summary.hpp).</p>\n"
                 "<div class=\"scroll\">" +
                     stacked_bars(bars, time_split_parts(), "s") + "</div>\n");
}

// "tp 8 pp 4 dp 2 mb 1 interleaved v2": a plan as a chart's label.
std::string plan_label(const json& row) {
  std::string label = fmt::format("tp {} pp {} dp {}", row.value("tp", 1), row.value("pp", 1), row.value("dp", 1));
  if (row.value("cp", 1) > 1) label += fmt::format(" cp {}", row.value("cp", 1));
  if (row.value("ep", 1) > 1) label += fmt::format(" ep {}", row.value("ep", 1));
  if (row.value("etp", 1) > 1) label += fmt::format(" etp {}", row.value("etp", 1));
  label += fmt::format(" mb {} {}", row.value("micro_batch", 1), row.value("schedule", ""));
  if (row.value("virtual_stages", 1) > 1) label += fmt::format(" v{}", row.value("virtual_stages", 1));
  if (row.value("recompute", "none") != "none") label += " rc " + row.value("recompute", "");
  return label;
}

bool is_number(const std::string& text, double& value) {
  char* end = nullptr;
  value = std::strtod(text.c_str(), &end);
  return !text.empty() && end == text.c_str() + text.size();
}

}  // namespace

std::string sweep_sections(const json& d) {
  const json& rows = required(d, "variants");
  std::vector<std::string> varied = required(d, "varied").get<std::vector<std::string>>();
  std::vector<std::string> labels;
  for (const json& row : rows) {
    std::string label;
    for (const std::string& key : varied) {
      const json& set = row.value("set", json::object());
      const std::string value = set.contains(key) ? set.at(key).get<std::string>() : "?";
      label += (label.empty() ? "" : ", ") + (varied.size() > 1 ? key + "=" + value : value);
    }
    labels.push_back(label);
  }
  std::vector<Point> points;
  bool numeric = varied.size() == 1;
  std::size_t fastest = rows.size();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (!row_simulated(rows[i])) continue;
    double x = 0;
    numeric &= is_number(labels[i], x);
    points.push_back({labels[i], x, rows[i].value("iteration_time_s", 0.0)});
    if (fastest == rows.size() || points.back().y < rows[fastest].value("iteration_time_s", 0.0)) fastest = i;
  }
  std::string keys;
  for (const std::string& key : varied) keys += (keys.empty() ? "" : ", ") + key;
  std::vector<std::pair<std::string, std::string>> facts_list = {
      {"model", d.value("scenario", "")},
      {"varied", keys},
      {"variants", fmt::format("{} ({} simulated)", rows.size(), points.size())}};
  if (fastest < rows.size()) {
    facts_list.emplace_back("fastest",
                            fmt::format("{}{}: {:.4f} s per iteration", varied.size() == 1 ? varied[0] + "=" : "",
                                        labels[fastest], rows[fastest].value("iteration_time_s", 0.0)));
  }
  return section("summary", "Summary", facts(facts_list)) +
         section("curve", "Iteration time against " + keys, line_chart(points, numeric, keys, "iteration time (s)")) +
         split_section(labels, rows) + section("variants", "Variants", table_of(sweep_columns(varied, rows), rows));
}

std::string search_sections(const json& d) {
  const json& rows = required(d, "plans");
  std::vector<std::string> labels;
  std::vector<Bar> bars;
  for (const json& row : rows) {
    labels.push_back(plan_label(row));
    if (row_simulated(row)) {
      const double seconds = row.value("iteration_time_s", 0.0);
      bars.push_back({labels.back(), seconds,
                      fmt::format("{:.4f} s{}", seconds, row.value("fits", false) ? "" : " (does not fit)")});
    }
  }
  std::vector<std::pair<std::string, std::string>> facts_list = {
      {"model", d.value("scenario", "")},
      {"plans", d.contains("plans_simulated")
                    ? fmt::format("{} shown, {} simulated of {} that fit ({} enumerated: {} invalid, {} rejected for "
                                  "memory, {} pruned by the bound)",
                                  rows.size(), d.value("plans_simulated", 0), d.value("plans_that_fit", 0),
                                  d.value("plans_enumerated", 0), d.value("plans_pruned_rules", 0),
                                  d.value("rejected_for_memory", 0), d.value("plans_pruned_bound", 0))
                    : fmt::format("{} simulated of {} that fit ({} rejected for memory)", rows.size(),
                                  d.value("plans_that_fit", 0), d.value("rejected_for_memory", 0))},
      {"memory headroom", d.value("memory_headroom", std::string())}};
  if (!bars.empty()) facts_list.emplace_back("fastest", bars.front().label + ": " + bars.front().text);
  if (!rows.empty() && rows.front().contains("precision")) {
    facts_list.emplace_back("precision", rows.front().value("precision", ""));
  }
  return section("summary", "Summary", facts(facts_list)) +
         section("ranking", "Plans ranked by iteration time",
                 "<div class=\"scroll\">" + bar_chart(bars, "#4e79a7") + "</div>\n") +
         split_section(labels, rows) + section("plans", "Plans", table_of(search_columns(rows), rows));
}

}  // namespace twin::report::html

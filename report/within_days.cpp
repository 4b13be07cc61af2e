// Rows against a deadline: the days a row's training takes, the GPUs it takes them on, the winner.
#include "report/within_days.hpp"

#include <limits>

#include "report/plan_tables.hpp"

namespace twin::report {

namespace {

using nlohmann::json;

double number_or(const json& object, const char* key, double otherwise) {
  const auto found = object.find(key);
  return found != object.end() && found->is_number() ? found->get<double>() : otherwise;
}

}  // namespace

double training_gpu_hours(const json& row) {
  const double hours = number_or(row.at("training"), "gpu_hours", 0);
  const auto goodput = row.find("goodput");
  if (goodput == row.end()) return hours;
  const double fraction = number_or(*goodput, "goodput_fraction", 1);
  return fraction > 0 ? hours / fraction : std::numeric_limits<double>::infinity();
}

std::optional<double> training_days(const json& row) {
  if (!row_simulated(row) || !row.contains("training")) return std::nullopt;
  const json& training = row.at("training");
  // With goodput the days with failures are the ones the calendar sees.
  const char* key = row.contains("goodput") && training.contains("days_with_failures") ? "days_with_failures" : "days";
  const auto found = training.find(key);
  if (found == training.end() || !found->is_number()) return std::nullopt;
  return found->get<double>();
}

double row_gpus(const json& row) {
  if (row.contains("gpus")) return number_or(row, "gpus", 0);
  return number_or(row, "tp", 1) * number_or(row, "cp", 1) * number_or(row, "pp", 1) * number_or(row, "dp", 1);
}

void mark_finishes_in_days(json& rows, double days) {
  for (json& row : rows) {
    const std::optional<double> taken = training_days(row);
    if (taken) row["finishes_in_days"] = *taken <= days;
  }
}

std::optional<std::size_t> fewest_gpus_within_days(const json& rows) {
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const json& row = rows[i];
    if (!row.value("finishes_in_days", false)) continue;
    if (!best) {
      best = i;
      continue;
    }
    const json& other = rows[*best];
    const double gpus = row_gpus(row), other_gpus = row_gpus(other);
    if (gpus < other_gpus || (gpus == other_gpus && training_gpu_hours(row) < training_gpu_hours(other))) best = i;
  }
  return best;
}

std::optional<double> fastest_days(const json& rows) {
  std::optional<double> fastest;
  for (const json& row : rows) {
    const std::optional<double> days = training_days(row);
    if (days && (!fastest || *days < *fastest)) fastest = days;
  }
  return fastest;
}

}  // namespace twin::report

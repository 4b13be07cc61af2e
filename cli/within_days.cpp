// --days: its check, its column and the line that answers it.
#include "cli/within_days.hpp"

#include <cmath>
#include <optional>

#include <fmt/core.h>

#include "api/simulation.hpp"
#include "model/scenario/errors.hpp"
#include "report/within_days.hpp"

namespace twin::cli {

void add_days_option(CLI::App& command, double& days, const std::string& what) {
  command
      .add_option("--days", days,
                  fmt::format("with --train-tokens: say whether each {} finishes within this many days (failures "
                              "counted with --goodput), and which does with the fewest GPUs",
                              what))
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              std::size_t used = 0;
              const double value = std::stod(text, &used);
              if (used == text.size() && std::isfinite(value) && value > 0) return {};
            } catch (const std::exception&) {
            }
            return fmt::format("must be a number of days above 0, got '{}'", text);
          },
          "DAYS"));
}

std::string finishes_cell(const nlohmann::json& row) {
  const auto found = row.find("finishes_in_days");
  if (found == row.end() || !found->is_boolean()) return "";
  return found->get<bool>() ? "yes" : "no";
}

std::string plan_text(const nlohmann::json& row) {
  const auto count = [&](const char* key) { return row.value(key, 1); };
  std::string shape = fmt::format("tp {} x pp {} x dp {}", count("tp"), count("pp"), count("dp"));
  if (count("cp") > 1) shape += fmt::format(" x cp {}", count("cp"));
  if (count("ep") > 1) shape += fmt::format(", ep {}", count("ep"));
  const int chunks = count("virtual_stages");
  return fmt::format("{}, mb {}, {}{}, recompute {} on {} x {}", shape, count("micro_batch"), row.value("schedule", ""),
                     chunks > 1 ? fmt::format(" v={}", chunks) : "", row.value("recompute", ""), row.value("nodes", 0),
                     row.value("node", ""));
}

namespace {

// "1 day", "30 days", "0.5 days".
std::string days_text(double days) {
  return days == 1 ? std::string("1 day") : fmt::format("{} days", days);
}

}  // namespace

void print_within_days(const nlohmann::json& rows, double days,
                       const std::function<std::string(const nlohmann::json& row)>& describe) {
  const std::optional<std::size_t> best = report::fewest_gpus_within_days(rows);
  if (best) {
    const nlohmann::json& row = rows[*best];
    fmt::print("\n  fewest GPUs that finish within {}: {} ({:.0f} GPUs, {:.3g} days, {} GPU-hours)\n", days_text(days),
               describe(row), report::row_gpus(row), report::training_days(row).value_or(0),
               api::with_scale(report::training_gpu_hours(row)));
    return;
  }
  const std::optional<double> fastest = report::fastest_days(rows);
  if (fastest) {
    fmt::print("\n  none finishes in {}; the fastest takes {:.3g} days\n", days_text(days), *fastest);
  } else {
    fmt::print("\n  none finishes in {} (none was simulated)\n", days_text(days));
  }
}

}  // namespace twin::cli

// `--days D` of twin sweep and twin search: with --train-tokens, which variants or plans finish within D days, and
// the one that does with the fewest GPUs (the rows' side: report/within_days.hpp).
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace twin::cli {

// Adds --days to `command`, a number of days above 0 (0: not given).
void add_days_option(CLI::App& command, double& days, const std::string& what);
// A table's "finishes" cell for a row: "yes", "no", or blank when the row has no answer.
std::string finishes_cell(const nlohmann::json& row);
// A search row's plan in a few words: "tp 2 x pp 2 x dp 4, mb 1, 1f1b on 2 x dgx-a100" (cp and ep where above 1).
std::string plan_text(const nlohmann::json& row);
// The answer after the table: the row with the fewest GPUs that finishes within `days` (named by `describe`), or
// "none finishes in D days; the fastest takes X days".
void print_within_days(const nlohmann::json& rows, double days,
                       const std::function<std::string(const nlohmann::json& row)>& describe);

}  // namespace twin::cli

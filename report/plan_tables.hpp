// The columns of the search and sweep tables as data, read from the rows of their JSON documents
// (report/plan_documents.hpp): one list serves `--csv` (one line per plan or variant), search's `--sort COLUMN` and
// the tables of `twin report`, so that the three never disagree about what a column holds.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace twin::report {

struct Column {
  std::string name;     // the CSV header and the --sort name: iter_s, tflops, mem_gib, ...
  std::string heading;  // the terminal table's heading: "iter s", "TFLOP/s", "mem GiB", ...
  std::function<std::string(const nlohmann::json& row)> text;  // the cell as the CSV and the HTML show it
  // The value a sort orders by; empty for a text column (ordered by its text).
  std::function<double(const nlohmann::json& row)> number;
  bool larger_first = false;  // TFLOP/s, goodput: the best first when sorted
};

// The search table's columns for these rows (search_row_json): node, tp, pp, dp, cp, ep, etp, mb, schedule, chunks,
// recompute, sharding, iter_s, tflops, bubble, mem_gib, fits, then goodput, days, gpu_hours and cost_usd where the
// rows have them (`every`: every one of them, empty where a row has none: what --sort takes), finishes where they have
// finishes_in_days (--days), and error.
std::vector<Column> search_columns(const nlohmann::json& rows, bool every = false);
// The sweep table's columns (sweep_row_json): each varied key, then gpus, iter_s, tflops, bubble, mem_gib, fits,
// tokens_per_s, goodput, days, gpu_hours, cost_usd and finishes where the rows have them, and error.
std::vector<Column> sweep_columns(const std::vector<std::string>& varied, const nlohmann::json& rows);

// Whether a search or sweep row has a result: no `error`, or an empty one.
bool row_simulated(const nlohmann::json& row);

// RFC 4180 CSV: the names, then a line per row; a cell with a comma, quote or line break is quoted.
std::string csv(const std::vector<Column>& columns, const nlohmann::json& rows);

// The column named `name` (its name or heading, either case). Throws UserError naming `flag` and `name` and listing
// the columns when none has that name.
const Column& column_named(const std::vector<Column>& columns, const std::string& name, const std::string& flag);

// The order of `rows` by the column named `name` (its name or heading, either case): ascending, TFLOP/s and
// goodput descending; ties and rows without a result (an error) keep their order, the latter last. Throws
// UserError naming `flag` and `name` and listing the columns when no column has that name.
std::vector<std::size_t> sorted_order(const std::vector<Column>& columns, const nlohmann::json& rows,
                                      const std::string& name, const std::string& flag);

}  // namespace twin::report

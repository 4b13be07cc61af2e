// Two Chrome traces (`twin sim --trace`, `twin run --trace`) of one Program, op by op: every op both recorded, timed
// from when its work began to its end, summed per rank by op class, and the ops whose times differ most.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/compare.hpp"  // CompareError, relative_error

namespace twin::report {

// Whether `document` is a Chrome trace (an object with a "traceEvents" array) rather than a summary.
bool is_trace(const nlohmann::json& document);

// What an op is, without where it sits in the iteration: its trace label less the layer, the micro-batch and the
// peer stage ("backward mlp_up L3 mb2" -> "backward mlp_up", "send forward mb0 to stage 1" -> "send forward").
std::string op_class(std::string_view label);

struct ComparedOp {
  int rank = 0;
  int op = 0;  // index in its stage's op list
  std::string label;
  double reference_s = 0, candidate_s = 0;
};

struct ComparedClass {
  std::string name;                         // op_class of its ops
  double ops = 0;                           // per rank
  double reference_s = 0, candidate_s = 0;  // per rank, summed over its ops
  double error() const { return relative_error(candidate_s, reference_s); }
};

struct TraceComparison {
  std::string reference_engine, candidate_engine;
  std::vector<int> ranks;              // recorded in both traces: the ones compared
  std::size_t ops = 0;                 // ops compared, over those ranks
  ComparedClass total;                 // every compared op ("all ops")
  std::vector<ComparedClass> classes;  // largest measured time first
  std::vector<ComparedOp> largest;     // the ops whose times differ most, largest difference first
};

// Every op that both traces recorded (same rank, same index in its stage's list), timed from when its work began to
// its end: a collective's wait for its last member, and a Recv's for its sender, are left out (a trace event's
// "dur" less its "wait_us"). `top` ops are listed in `largest`. Throws CompareError, naming the file (`reference_what`,
// `candidate_what`) and the event or field, for a document that is not a trace or has a malformed op event, and for
// traces of different Programs (an op whose label differs, a rank with another op count) or with no rank in common.
TraceComparison compare_traces(const nlohmann::json& reference, const std::string& reference_what,
                               const nlohmann::json& candidate, const std::string& candidate_what, std::size_t top);

// A readable table of it: one line per op class, then the `largest` ops.
std::string trace_comparison_table(const TraceComparison& comparison);

// The same as JSON: {"mode": "ops", "predicted_engine", "measured_engine", "ranks", "ops", "total" and "classes":
// [{"name", "ops", "predicted_s", "measured_s", "error"}], "largest": [{"rank", "op", "label", "predicted_s",
// "measured_s", "error"}]}.
nlohmann::json trace_comparison_to_json(const TraceComparison& comparison);

}  // namespace twin::report

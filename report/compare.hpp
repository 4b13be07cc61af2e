// Two results of the same Program side by side (a prediction and a measurement, or two predictions), with the
// relative error of each value: two summaries (iteration time, throughput, bubble, time split, compute by kernel kind
// and per-stage busy time), or two Chrome traces, op by op.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace twin::report {

class CompareError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The summary object inside a `twin sim --json` (top level) or `twin run --json` (its "summary") document.
// Throws CompareError naming `what` when the document has none, or naming `what` and the field when a field that
// comparing reads is of the wrong type or out of range (a time <= 0, a fraction beyond [0, 1], nan).
const nlohmann::json& find_summary(const nlohmann::json& document, const std::string& what);

// (candidate - reference) / reference: negative when the candidate (the prediction) is below the measurement; 0 when
// there is no reference to be relative to.
inline double relative_error(double candidate, double reference) {
  return reference != 0 ? (candidate - reference) / reference : 0.0;
}

struct ComparedValue {
  std::string name;
  double reference = 0;  // the measurement
  double candidate = 0;  // the prediction
  double error() const { return relative_error(candidate, reference); }
};

struct Comparison {
  std::string reference_engine, candidate_engine;
  // What differs between the two runs (model, plan, hardware), compared anyway (--allow-mismatch): shown first.
  std::vector<std::string> mismatches;
  std::vector<ComparedValue> totals;  // iteration time, TFLOP/s per GPU, bubble, time split
  std::vector<ComparedValue> kinds;   // compute seconds by kernel kind (mean of stages), kinds timed in both
  std::vector<ComparedValue> stages;  // busy seconds per stage present in both
};

// The hardware a name describes, in one spelling for comparing: "a100-80gb", "a100-40gb", "h100", "h200", "cpu"
// (from "dgx-a100", "A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB", "cpu-host", "cpu", ...); otherwise the name in lower
// case; "" for "".
std::string hardware_family(std::string_view name);

// What differs between the runs two summary objects describe: the model (name, layers, hidden, heads, sequence), the
// plan (tp, pp, dp, micro-batches, micro-batch, global batch, GPUs) and the hardware, each as "FIELD is X in the
// measurement and Y in the prediction". A field either side does not record is not compared.
std::vector<std::string> run_differences(const nlohmann::json& reference, const nlohmann::json& candidate);

// `reference` (measured) and `candidate` (predicted) are summary objects (find_summary). They must describe the same
// run (run_differences): a difference throws CompareError naming every field that differs and both values, unless
// `allow_mismatch`, when the differences are kept in Comparison::mismatches and the table opens with them.
Comparison compare_summaries(const nlohmann::json& reference, const nlohmann::json& candidate,
                             bool allow_mismatch = false);

// A readable table of the comparison.
std::string comparison_table(const Comparison& comparison);

// The same as JSON (`twin compare --json`): {"mode": "summary", "predicted_engine", "measured_engine", "totals",
// "kinds", "stages"}, each an array of {"name", "predicted", "measured", "error"} (error: relative to the
// measurement; null when the measurement is 0).
nlohmann::json comparison_to_json(const Comparison& comparison);

// --- Op by op: two Chrome traces (`twin sim --trace`, `twin run --trace`) of one Program ---

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

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

#include "model/scenario/errors.hpp"

namespace twin::report {

// Two documents that cannot be compared, or one that is not what it claims: the user's files (model/scenario/errors.hpp).
class CompareError : public UserError {
 public:
  using UserError::UserError;
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
// The same for JSON: null when there is no reference to be relative to.
nlohmann::json error_json(double candidate, double reference);

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

}  // namespace twin::report

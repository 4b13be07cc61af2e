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

#include "model/errors.hpp"

namespace twin::report {

// Two documents that cannot be compared, or one that is not what it claims: the user's files (model/errors.hpp).
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
  std::vector<ComparedValue> totals;  // iteration time, TFLOP/s per GPU, bubble, time split
  std::vector<ComparedValue> kinds;   // compute seconds by kernel kind (mean of stages), kinds timed in both
  std::vector<ComparedValue> stages;  // busy seconds per stage present in both
};

// `reference` (measured) and `candidate` (predicted) are summary objects (find_summary). Their plans (tp, pp, dp,
// micro-batches) must match; a difference throws CompareError naming the field and both values.
Comparison compare_summaries(const nlohmann::json& reference, const nlohmann::json& candidate);

// A readable table of the comparison.
std::string comparison_table(const Comparison& comparison);

// The same as JSON (`twin compare --json`): {"mode": "summary", "predicted_engine", "measured_engine", "totals",
// "kinds", "stages"}, each an array of {"name", "predicted", "measured", "error"} (error: relative to the
// measurement; null when the measurement is 0).
nlohmann::json comparison_to_json(const Comparison& comparison);

}  // namespace twin::report

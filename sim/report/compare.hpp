// Two summaries of the same Program side by side (a prediction and a measurement, or two predictions): iteration
// time, throughput, bubble, time split, compute by kernel kind and per-stage busy time, with the relative error of
// each.
#pragma once

#include <stdexcept>
#include <string>
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

struct ComparedValue {
  std::string name;
  double reference = 0;  // the measurement
  double candidate = 0;  // the prediction
  double error() const { return reference != 0 ? (candidate - reference) / reference : 0.0; }
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

}  // namespace twin::report

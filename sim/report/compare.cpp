#include "sim/report/compare.hpp"

#include <fmt/format.h>

namespace twin::report {
namespace {

double number(const nlohmann::json& object, const char* key, const char* document) {
  if (!object.contains(key) || !object[key].is_number()) {
    throw CompareError(fmt::format("{}: summary has no number \"{}\"", document, key));
  }
  return object[key].get<double>();
}

}  // namespace

const nlohmann::json& find_summary(const nlohmann::json& document, const std::string& what) {
  if (document.is_object() && document.contains("iteration_time_s") && document.contains("stages")) return document;
  if (document.is_object() && document.contains("summary") && document["summary"].is_object()) {
    return document["summary"];
  }
  throw CompareError(what + ": not a twin summary (expected the JSON of `twin sim --json` or `twin run --json`)");
}

Comparison compare_summaries(const nlohmann::json& reference, const nlohmann::json& candidate) {
  for (const char* field : {"tp", "pp", "dp", "micro_batches"}) {
    const auto& a = reference.at("scenario");
    const auto& b = candidate.at("scenario");
    if (a.value(field, -1) != b.value(field, -1)) {
      throw CompareError(fmt::format("not the same plan: {} is {} in the measurement and {} in the prediction", field,
                                     a.value(field, -1), b.value(field, -1)));
    }
  }
  Comparison c;
  c.reference_engine = reference.value("engine", "?");
  c.candidate_engine = candidate.value("engine", "?");
  c.totals.push_back({"iteration time (s)", number(reference, "iteration_time_s", "measured"),
                      number(candidate, "iteration_time_s", "predicted")});
  c.totals.push_back({"model TFLOP/s per GPU", number(reference, "tflops_per_gpu", "measured"),
                      number(candidate, "tflops_per_gpu", "predicted")});
  c.totals.push_back({"bubble fraction", number(reference, "bubble_fraction", "measured"),
                      number(candidate, "bubble_fraction", "predicted")});
  const double t_ref = number(reference, "iteration_time_s", "measured");
  const double t_can = number(candidate, "iteration_time_s", "predicted");
  if (reference.contains("time_split") && candidate.contains("time_split")) {
    // Fractions of the iteration in each, shown as seconds so that the errors add up to the time's error.
    for (const char* part : {"compute", "tp", "pp", "dp", "bubble"}) {
      const std::string name = std::string(part) == "bubble" ? "fill/drain (s)" : std::string(part) + " (s)";
      c.totals.push_back(
          {name, reference["time_split"].value(part, 0.0) * t_ref, candidate["time_split"].value(part, 0.0) * t_can});
    }
  }
  for (const auto& a : reference.at("stages")) {
    for (const auto& b : candidate.at("stages")) {
      if (a.value("stage", -1) == b.value("stage", -2)) {
        c.stages.push_back(
            {fmt::format("stage {} busy (s)", a.value("stage", -1)), a.value("busy_s", 0.0), b.value("busy_s", 0.0)});
      }
    }
  }
  return c;
}

std::string comparison_table(const Comparison& c) {
  std::string out;
  auto line = std::back_inserter(out);
  fmt::format_to(line, "  predicted: {}\n  measured:  {}\n\n", c.candidate_engine, c.reference_engine);
  fmt::format_to(line, "  {:<24} {:>14} {:>14} {:>9}\n", "", "predicted", "measured", "error");
  auto row = [&line](const ComparedValue& v) {
    fmt::format_to(line, "  {:<24} {:>14.4f} {:>14.4f} {:>+8.1f}%\n", v.name, v.candidate, v.reference,
                   100 * v.error());
  };
  for (const auto& v : c.totals) row(v);
  if (!c.stages.empty()) fmt::format_to(line, "\n");
  for (const auto& v : c.stages) row(v);
  return out;
}

}  // namespace twin::report

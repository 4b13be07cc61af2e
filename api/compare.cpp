// Which comparison a pair of inputs asks for, decided by what they hold: traces, a measured run, seconds, summaries.
#include "api/compare.hpp"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <optional>
#include <system_error>

#include <fmt/core.h>

#include "measured/compare_measured.hpp"
#include "measured/measured_run.hpp"
#include "model/scenario/errors.hpp"
#include "model/scenario/files.hpp"
#include "report/compare.hpp"
#include "report/compare_traces.hpp"

namespace twin::api {
namespace {

// "60.1" -> 60.1 seconds; anything else is a file.
std::optional<double> as_seconds(const std::string& text) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  if (!(value > 0) || !std::isfinite(value) || value > 1e9) {
    throw UserError(fmt::format("measured iteration time must be a number of seconds in (0, 1e9], got {}", text));
  }
  return value;
}

// A prediction against a published iteration time: the time, and the TFLOP/s it implies.
Comparison against_seconds(const nlohmann::json& predicted, double seconds) {
  const double t = predicted.at("iteration_time_s").get<double>();
  const double tflops = predicted.at("tflops_per_gpu").get<double>();
  report::Comparison c;
  c.candidate_engine = predicted.value("engine", "?");
  c.reference_engine = "published";
  c.totals.push_back({"iteration time (s)", seconds, t});
  c.totals.push_back({"model TFLOP/s per GPU", tflops * t / seconds, tflops});
  return {report::comparison_table(c), report::comparison_to_json(c)};
}

Comparison compare_unwrapped(const nlohmann::json& predicted_document, const std::string& predicted_name,
                             const std::string& measured, const CompareRequest& r) {
  if (report::is_trace(predicted_document)) {
    if (as_seconds(measured)) {
      throw UserError(
          fmt::format("'{}' is a trace: compare it with another trace (twin run --trace, twin sim "
                      "--trace), not with an iteration time",
                      predicted_name));
    }
    return compare_documents(predicted_document, predicted_name, read_json_file(measured), measured, r);
  }
  const nlohmann::json& predicted = report::find_summary(predicted_document, predicted_name);
  if (const auto seconds = as_seconds(measured)) return against_seconds(predicted, *seconds);
  if (measured::is_measured_input(measured)) {
    measured::MeasuredRun run = measured::read_measured(measured, r.iterations, r.fastest_step);
    if (r.fastest_step) measured::use_fastest_iteration(run);
    const measured::MeasuredComparison comparison =
        measured::compare_with_measured(predicted, run, r.allow_mismatch, r.top);
    return {measured::measured_comparison_table(comparison), measured::measured_comparison_to_json(comparison)};
  }
  return compare_documents(predicted_document, predicted_name, read_json_file(measured), measured, r);
}

}  // namespace

nlohmann::json read_json_file(const std::string& path) {
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) {
    throw UserError(fmt::format("'{}' is a directory, not a JSON file", path));
  }
  const std::string text = model::read_input_file(path, "JSON file", model::kMaxSummaryBytes);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    throw UserError(fmt::format("'{}' is not valid JSON: {}", path, error.what()));
  }
}

Comparison compare(const nlohmann::json& predicted, const std::string& predicted_name, const std::string& measured,
                   const CompareRequest& request) {
  try {
    return compare_unwrapped(predicted, predicted_name, measured, request);
  } catch (const report::CompareError& error) {
    throw UserError(error.what());
  } catch (const measured::MeasuredError& error) {
    throw UserError(error.what());
  }
}

Comparison compare_documents(const nlohmann::json& predicted, const std::string& predicted_name,
                             const nlohmann::json& measured, const std::string& measured_name,
                             const CompareRequest& r) {
  try {
    if (report::is_trace(predicted)) {
      if (!report::is_trace(measured)) {
        throw UserError(fmt::format("'{}' is a trace but '{}' is not: compare two traces, or two summaries (--json)",
                                    predicted_name, measured_name));
      }
      const report::TraceComparison comparison =
          report::compare_traces(measured, measured_name, predicted, predicted_name, r.top);
      return {report::trace_comparison_table(comparison), report::trace_comparison_to_json(comparison)};
    }
    if (report::is_trace(measured)) {
      throw UserError(fmt::format("'{}' is a trace but '{}' is not: compare two traces, or two summaries (--json)",
                                  measured_name, predicted_name));
    }
    const auto comparison =
        report::compare_summaries(report::find_summary(measured, measured_name),
                                  report::find_summary(predicted, predicted_name), r.allow_mismatch);
    return {report::comparison_table(comparison), report::comparison_to_json(comparison)};
  } catch (const report::CompareError& error) {
    throw UserError(error.what());
  } catch (const measured::MeasuredError& error) {
    throw UserError(error.what());
  }
}

}  // namespace twin::api

// twin compare PREDICTED MEASURED: a prediction next to a measurement of the same plan.
//   twin sim mtnlg-530b --json predicted.json && twin compare predicted.json 60.1
//   twin compare predicted.json measured.json       (measured.json from `twin run --json`, or another `twin sim`)
//   twin compare predicted.trace.json measured.trace.json   (two --trace files of one Program: op by op)
#include <charconv>
#include <cmath>
#include <filesystem>
#include <string>
#include <system_error>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "measured/compare_measured.hpp"
#include "measured/measured_run.hpp"
#include "model/scenario/files.hpp"
#include "report/compare.hpp"
#include "report/compare_traces.hpp"

namespace twin::cli {
namespace {

nlohmann::json read_json(const std::string& path) {
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

}  // namespace

void register_compare_command(CLI::App& app) {
  auto predicted_path = std::make_shared<std::string>();
  auto measured = std::make_shared<std::string>();
  auto top = std::make_shared<std::size_t>(10);
  auto json_path = std::make_shared<std::string>();
  auto allow_mismatch = std::make_shared<bool>(false);
  auto iterations = std::make_shared<int>(0);
  auto fastest = std::make_shared<bool>(false);
  CLI::App* command = app.add_subcommand(
      "compare",
      "compare a prediction (twin sim --json) with a measurement (twin run --json, PyTorch profiler traces, a "
      "Megatron-LM / NeMo / torchtitan log, or an iteration time in seconds): iteration time, TFLOP/s, bubble, "
      "time split, compute by kernel kind, per stage or rank; or two traces (--trace) op by op");
  command->add_option("predicted", *predicted_path, "summary JSON (or trace) of the prediction")->required();
  command
      ->add_option("measured", *measured,
                   "summary JSON (or trace) of the measurement; a PyTorch profiler trace (.json, .json.gz) or a "
                   "directory of them (one per rank); a Megatron-LM, NeMo or torchtitan log; or an iteration time in "
                   "seconds")
      ->required();
  command->add_flag("--allow-mismatch", *allow_mismatch,
                    "compare even when the two sides differ in model, plan or hardware (each difference is printed "
                    "first, as a warning)");
  command->add_option("--iterations", *iterations,
                      "with a profiler trace that has no ProfilerStep#N ranges: the iterations it holds")
      ->check(CLI::Range(1, 1000000));
  command->add_flag("--fastest-step", *fastest,
                    "with profiler traces: each rank's iteration time is its fastest ProfilerStep (the one other work "
                    "on a shared machine delayed least), not the mean, and its kernel times by class are that step's");
  command->add_option("--top", *top, "with two traces: list the N ops whose times differ most (default 10)")
      ->check(CLI::Range(0, 100000));
  command->add_option("--json", *json_path, "also write the comparison as JSON to this file")->check(output_file());
  command->callback([predicted_path, measured, top, json_path, allow_mismatch, iterations, fastest] {
    // The table on stdout; with --json the same as JSON, written atomically.
    auto report_it = [&json_path](const std::string& table, const nlohmann::json& json) {
      fmt::print("{}", table);
      if (!json_path->empty()) write_file_atomically(*json_path, json.dump(2) + "\n");
    };
    try {
      require_outputs_before_work({{"--json", *json_path}},
                                  {{"the prediction", *predicted_path}, {"the measurement", *measured}});
      const nlohmann::json predicted_document = read_json(*predicted_path);
      if (report::is_trace(predicted_document)) {
        if (as_seconds(*measured)) {
          throw UserError(
              fmt::format("'{}' is a trace: compare it with another trace (twin run --trace, twin sim "
                          "--trace), not with an iteration time",
                          *predicted_path));
        }
        const nlohmann::json measured_document = read_json(*measured);
        if (!report::is_trace(measured_document)) {
          throw UserError(fmt::format("'{}' is a trace but '{}' is not: compare two traces, or two summaries (--json)",
                                      *predicted_path, *measured));
        }
        const report::TraceComparison comparison =
            report::compare_traces(measured_document, *measured, predicted_document, *predicted_path, *top);
        report_it(report::trace_comparison_table(comparison), report::trace_comparison_to_json(comparison));
        return;
      }
      const nlohmann::json& predicted = report::find_summary(predicted_document, *predicted_path);
      if (const auto seconds = as_seconds(*measured)) {
        const double t = predicted.at("iteration_time_s").get<double>();
        const double tflops = predicted.at("tflops_per_gpu").get<double>();
        report::Comparison c;
        c.candidate_engine = predicted.value("engine", "?");
        c.reference_engine = "published";
        c.totals.push_back({"iteration time (s)", *seconds, t});
        c.totals.push_back({"model TFLOP/s per GPU", tflops * t / *seconds, tflops});
        report_it(report::comparison_table(c), report::comparison_to_json(c));
        return;
      }
      if (measured::is_measured_input(*measured)) {
        measured::MeasuredRun run = measured::read_measured(*measured, *iterations, *fastest);
        if (*fastest) measured::use_fastest_iteration(run);
        const measured::MeasuredComparison comparison =
            measured::compare_with_measured(predicted, run, *allow_mismatch, *top);
        report_it(measured::measured_comparison_table(comparison), measured::measured_comparison_to_json(comparison));
        return;
      }
      const nlohmann::json measured_document = read_json(*measured);
      if (report::is_trace(measured_document)) {
        throw UserError(fmt::format("'{}' is a trace but '{}' is not: compare two traces, or two summaries (--json)",
                                    *measured, *predicted_path));
      }
      const auto comparison =
          report::compare_summaries(report::find_summary(measured_document, *measured), predicted, *allow_mismatch);
      report_it(report::comparison_table(comparison), report::comparison_to_json(comparison));
    } catch (const report::CompareError& error) {
      throw UserError(error.what());
    } catch (const measured::MeasuredError& error) {
      throw UserError(error.what());
    }
  });
}

}  // namespace twin::cli

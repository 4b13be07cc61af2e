// twin compare PREDICTED MEASURED: a prediction next to a measurement of the same plan.
//   twin sim mtnlg-530b --json predicted.json && twin compare predicted.json 60.1
//   twin compare predicted.json measured.json       (measured.json from `twin run --json`, or another `twin sim`)
//   twin compare predicted.trace.json measured.trace.json   (two --trace files of one Program: op by op)
// Parse, call the library (api/compare.hpp), print.
#include <memory>
#include <string>

#include <fmt/core.h>

#include "api/compare.hpp"
#include "cli/commands.hpp"

namespace twin::cli {

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
    require_outputs_before_work({{"--json", *json_path}},
                                {{"the prediction", *predicted_path}, {"the measurement", *measured}});
    api::CompareRequest request;
    request.allow_mismatch = *allow_mismatch;
    request.iterations = *iterations;
    request.fastest_step = *fastest;
    request.top = *top;
    const api::Comparison comparison =
        api::compare(api::read_json_file(*predicted_path), *predicted_path, *measured, request);
    // The table on stdout; with --json the same as JSON, written atomically.
    fmt::print("{}", comparison.table);
    if (!json_path->empty()) write_file_atomically(*json_path, comparison.document.dump(2) + "\n");
  });
}

}  // namespace twin::cli

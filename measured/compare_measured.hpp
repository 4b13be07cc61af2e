// A prediction (`twin sim --json`) next to a real run (PyTorch profiler traces, or a Megatron-LM / NeMo / torchtitan
// log): iteration time, compute by kernel class, exposed communication, each rank's iteration time and their spread,
// with errors; every kernel class the Program has no op for, and every kernel no rule classified, listed by name with
// its share of the kernel time.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "measured/measured_run.hpp"
#include "report/compare.hpp"

namespace twin::measured {

struct UnmatchedKernels {
  std::string name;        // a kernel's name, or "class copy" for a class the Program has no op for
  double seconds = 0;      // per iteration, mean over ranks
  double share = 0;        // of the kernel time
};

struct MeasuredComparison {
  report::Comparison values;  // totals (iteration, exposed communication, ...), kinds (by class), stages (by rank)
  std::vector<UnmatchedKernels> unmatched;
  std::vector<std::string> notes;  // how a measured value was derived (e.g. from throughput)
  double classified_share = 0;     // of the kernel time (traces)
};

// What differs between the prediction and the run, as far as the run's input records it: hardware (GPU or CPU),
// world size, and from a log's arguments the plan and the model. Each "FIELD is X in the measurement and Y in the
// prediction".
std::vector<std::string> run_differences(const nlohmann::json& predicted_summary, const MeasuredRun& run);

// Throws report::CompareError naming every difference unless `allow_mismatch` (then they lead the table).
MeasuredComparison compare_with_measured(const nlohmann::json& predicted_summary, const MeasuredRun& run,
                                         bool allow_mismatch = false, std::size_t top = 10);

std::string measured_comparison_table(const MeasuredComparison& comparison);
// {"mode": "measured", "mismatches", "predicted_engine", "measured_engine", "totals", "kinds", "ranks" (each a list of
// {"name", "predicted", "measured", "error"}), "unmatched": [{"name", "seconds", "share"}], "notes",
// "classified_share"}.
nlohmann::json measured_comparison_to_json(const MeasuredComparison& comparison);

}  // namespace twin::measured

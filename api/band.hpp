// The band of a prediction: how far twin has been off on the published runs like the plan it simulates (issue 45,
// item 6). The runs' errors are bench/accuracy/bands.json, written by `bench/accuracy/run.py --write-bands` and
// embedded in twin when it is built (api/CMakeLists.txt).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/scenario/scenario.hpp"

namespace twin::api {

struct PredictionBand {
  // The band's key: the generation of the GPU simulated ("ampere", "hopper", "blackwell"), "dense" or "moe", and
  // the precision (model.fp8 set: "fp8", else model.dtype).
  std::string generation, kind, precision;
  std::vector<std::string> runs;         // the published runs of that key (none: no band)
  double error_low = 0, error_high = 0;  // their signed errors, predicted / published - 1
  double low_s = 0, high_s = 0;          // the iteration time those errors allow: T / (1 + high) .. T / (1 + low)

  bool found() const { return !runs.empty(); }
};

// The band of `s` simulated on GPUs named `gpu_name` (topology's GpuSpec::name) around its `iteration_time_s`.
PredictionBand prediction_band(const model::Scenario& s, const std::string& gpu_name, double iteration_time_s);

// "band: 1.23-1.45 s (published runs: ...)", or what there is instead of one.
std::string band_line(const PredictionBand& band);

// JSON `iteration_time_band_s` ([low, high], or null) and `band_source`.
void add_band_json(const PredictionBand& band, nlohmann::json& summary);

}  // namespace twin::api

#include "api/band.hpp"

#include <fmt/format.h>

namespace twin::api {

std::string_view embedded_bands_json();  // band_data.cpp, generated from bench/accuracy/bands.json

namespace {

// The generation of the GPU simulated (its name: "A100-SXM4-80GB", "H100-SXM5-80GB", "GB200-186GB", ...), as
// bench/accuracy/run.py's gpu_generation reads the cluster.node names of the runs (dgx-a100, dgx-h100, gb200-nvl72,
// ...): the simulated GPU, not the scenario's, under `twin sim --gpu`.
std::string gpu_generation(const std::string& gpu_name) {
  const auto has = [&](const char* part) { return gpu_name.find(part) != std::string::npos; };
  if (has("A100")) return "ampere";
  if (has("H100") || has("H200") || has("H800")) return "hopper";
  if (has("B200")) return "blackwell";
  return gpu_name;
}

}  // namespace

PredictionBand prediction_band(const model::Scenario& s, const std::string& gpu_name, double iteration_time_s) {
  PredictionBand band;
  band.generation = gpu_generation(gpu_name);
  band.kind = s.model.is_moe() ? "moe" : "dense";
  band.precision = s.model.fp8 != model::Fp8Format::None ? "fp8" : std::string(model::to_string(s.model.dtype));
  static const nlohmann::json bands = nlohmann::json::parse(embedded_bands_json());
  for (const nlohmann::json& one : bands.at("bands")) {
    if (one.at("generation") != band.generation || one.at("kind") != band.kind ||
        one.at("precision") != band.precision) {
      continue;
    }
    for (const nlohmann::json& run : one.at("runs")) band.runs.push_back(run.at("name").get<std::string>());
    band.error_low = one.at("error_low").get<double>();
    band.error_high = one.at("error_high").get<double>();
    // A run twin predicted e too slow (e > 0) says the true time is T / (1 + e).
    band.low_s = iteration_time_s / (1 + band.error_high);
    band.high_s = iteration_time_s / (1 + band.error_low);
  }
  return band;
}

std::string band_line(const PredictionBand& band) {
  const std::string key = fmt::format("{} {} {}", band.generation, band.kind, band.precision);
  if (!band.found()) {
    return fmt::format("band: none (no published runs of {} in bench/accuracy/bands.json to say how far off twin is)",
                       key);
  }
  return fmt::format("band: {:.2f}-{:.2f} s (published runs: {} of {}, twin off by {:+.1f} % to {:+.1f} %)", band.low_s,
                     band.high_s, band.runs.size(), key, 100 * band.error_low, 100 * band.error_high);
}

void add_band_json(const PredictionBand& band, nlohmann::json& summary) {
  summary["iteration_time_band_s"] =
      band.found() ? nlohmann::json::array({band.low_s, band.high_s}) : nlohmann::json(nullptr);
  summary["band_source"] = {{"file", "bench/accuracy/bands.json"},
                            {"generation", band.generation},
                            {"kind", band.kind},
                            {"precision", band.precision},
                            {"runs", band.runs},
                            {"error_low", band.error_low},
                            {"error_high", band.error_high}};
}

}  // namespace twin::api

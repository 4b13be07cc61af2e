#include "cli/band.hpp"

#include <fmt/format.h>

namespace twin::cli {

std::string_view embedded_bands_json();  // band_data.cpp, generated from bench/accuracy/bands.json

namespace {

// bench/accuracy/run.py's gpu_generation, on the same cluster.node names.
std::string gpu_generation(model::NodeKind node) {
  const std::string name(model::to_string(node));
  if (name.find("a100") != std::string::npos) return "ampere";
  if (name.find("h100") != std::string::npos || name.find("h200") != std::string::npos ||
      name.find("h800") != std::string::npos) {
    return "hopper";
  }
  if (name.find("b200") != std::string::npos) return "blackwell";
  return name;
}

}  // namespace

PredictionBand prediction_band(const model::Scenario& s, double iteration_time_s) {
  PredictionBand band;
  band.generation = gpu_generation(s.cluster.node);
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

}  // namespace twin::cli

// Scenario names resolve in one folder; the Program's size is checked against this host's memory before it is built.
#include "api/scenario.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <system_error>

#include <fmt/core.h>

#include "model/scenario/errors.hpp"

namespace twin::api {
namespace {

namespace fs = std::filesystem;

std::optional<std::string>& chosen_directory() {
  static std::optional<std::string> directory;
  return directory;
}

fs::path scenario_dir() {
  return scenario_directory();
}

}  // namespace

std::string scenario_directory() {
  if (chosen_directory()) return *chosen_directory();
  if (const char* dir = std::getenv("TWIN_SCENARIOS")) return dir;
  return TWIN_SCENARIO_DIR;
}

void set_scenario_directory(const std::string& directory) {
  chosen_directory() = directory;
}

std::string resolve_scenario_path(const std::string& name_or_path) {
  std::error_code ignored;
  if (fs::is_regular_file(name_or_path, ignored)) return name_or_path;
  if (fs::exists(name_or_path, ignored)) {
    throw UserError(fmt::format("scenario '{}' is {}, not a TOML file", name_or_path,
                                fs::is_directory(name_or_path, ignored) ? "a directory" : "not a regular file"));
  }
  const fs::path dir = scenario_dir();
  for (const fs::path& candidate : {dir / name_or_path, dir / (name_or_path + ".toml"),
                                    dir / "published" / name_or_path, dir / "published" / (name_or_path + ".toml")}) {
    if (fs::is_regular_file(candidate, ignored)) return candidate.string();
  }
  throw UserError(
      fmt::format("scenario '{}': no such file, and no {}.toml under {}", name_or_path, name_or_path, dir.string()));
}

double available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

model::Program build_program_within_memory(const model::Scenario& scenario, model::Granularity granularity) {
  require_program_fits_memory(scenario, granularity);
  return model::build_program(scenario, granularity);
}

void require_program_fits_memory(const model::Scenario& scenario, model::Granularity granularity) {
  const double ops = model::estimated_stage_ops(scenario, granularity);
  const double needed = ops * model::kProgramBytesPerOp, available = available_memory_bytes();
  if (available > 0 && needed > 0.8 * available) {
    constexpr double GiB = 1024.0 * 1024 * 1024;
    const auto& p = scenario.parallel;
    throw UserError(fmt::format(
        "the Program of {} would hold about {:.3g} ops ({:.1f} GiB; this machine has {:.1f} GiB available): "
        "{} layers over {} stages, {} micro-batches per pipeline, at {} granularity. Check model.layers and "
        "parallel.global_batch{}",
        scenario.model.name, ops, needed / GiB, available / GiB, scenario.model.layers, p.pp, p.micro_batches(),
        model::to_string(granularity), granularity == model::Granularity::Op ? ", or use --granularity layer" : ""));
  }
}

std::vector<model::Override> parse_overrides(const std::vector<std::string>& sets) {
  std::vector<model::Override> overrides;
  for (const std::string& text : sets) overrides.push_back(model::parse_override(text));
  return overrides;
}

model::Scenario scenario_named(const std::string& name_or_path, const std::vector<model::Override>& overrides) {
  return model::load_scenario(resolve_scenario_path(name_or_path), overrides);
}

model::Scenario scenario_from_text(const std::string& toml_text, const std::vector<model::Override>& overrides,
                                   const std::string& source_name) {
  return model::parse_scenario(toml_text, source_name, overrides);
}

model::Granularity parse_granularity(const std::string& text, const std::string& flag) {
  if (text == "op") return model::Granularity::Op;
  if (text == "layer") return model::Granularity::Layer;
  throw UserError(fmt::format("{} must be \"op\" or \"layer\", got \"{}\"", flag, text));
}

std::string field_of(const UserError& error) {
  static const std::regex kField(R"(\b(model|parallel|cluster|framework|training)\.([a-z][a-z0-9_]*))");
  for (const std::string& problem : error.problems()) {
    // After the scenario's own name ("model.toml: ..."), which every problem of a file starts with.
    const std::size_t colon = problem.find(": ");
    const std::string text = colon == std::string::npos ? problem : problem.substr(colon + 2);
    std::smatch match;
    if (std::regex_search(text, match, kField)) return match.str(0);
  }
  return "";
}

}  // namespace twin::api

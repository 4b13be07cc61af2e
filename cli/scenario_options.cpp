// Scenario selection shared by every subcommand: positional SCENARIO, --set overrides, Megatron-style aliases.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include <fmt/core.h>

#include "cli/commands.hpp"

namespace twin::cli {
namespace {

namespace fs = std::filesystem;

fs::path scenario_dir() {
  if (const char* dir = std::getenv("TWIN_SCENARIOS")) return dir;
  return TWIN_SCENARIO_DIR;
}

// Megatron-LM's flag names for the keys a scenario shares with its arguments.
struct Alias {
  const char* flag;
  const char* key;
  const char* help;
};
constexpr Alias kAliases[] = {
    {"--tensor-model-parallel-size", "parallel.tp", "alias of --set parallel.tp=N"},
    {"--pipeline-model-parallel-size", "parallel.pp", "alias of --set parallel.pp=N"},
    {"--data-parallel-size", "parallel.dp", "alias of --set parallel.dp=N"},
    {"--micro-batch-size", "parallel.micro_batch", "alias of --set parallel.micro_batch=N"},
    {"--global-batch-size", "parallel.global_batch", "alias of --set parallel.global_batch=N"},
    {"--num-layers", "model.layers", "alias of --set model.layers=N"},
    {"--hidden-size", "model.hidden", "alias of --set model.hidden=N"},
    {"--num-attention-heads", "model.heads", "alias of --set model.heads=N"},
    {"--ffn-hidden-size", "model.ffn_hidden", "alias of --set model.ffn_hidden=N"},
    {"--seq-length", "model.seq_len", "alias of --set model.seq_len=N"},
    {"--nodes", "cluster.nodes", "alias of --set cluster.nodes=N"},
    {"--decoder-first-pipeline-num-layers", "parallel.first_stage_layers",
     "alias of --set parallel.first_stage_layers=N"},
    {"--decoder-last-pipeline-num-layers", "parallel.last_stage_layers", "alias of --set parallel.last_stage_layers=N"},
    {"--recompute-num-layers", "parallel.recompute_num_layers",
     "alias of --set parallel.recompute_num_layers=N (Megatron's block method: full recompute of N layers per chunk)"},
};

}  // namespace

void add_scenario_options(CLI::App& command, ScenarioOptions& options) {
  command.add_option("scenario", options.scenario,
                     fmt::format("scenario TOML file, or a name under scenarios/ (default: {})", options.scenario));
  command.add_option("--set", options.sets, "override a scenario key, e.g. --set parallel.pp=35 (repeatable)")
      ->type_name("KEY=VALUE");
  for (const Alias& alias : kAliases) {
    command
        .add_option_function<long long>(
            alias.flag,
            [&options, key = std::string(alias.key)](const long long& value) {
              options.aliases.push_back({key, std::to_string(value)});
            },
            alias.help)
        ->type_name("N")
        ->group("Megatron-style aliases");
  }
  command
      .add_option_function<std::string>(
          "--recompute",
          [&options](const std::string& value) {
            options.aliases.push_back({"parallel.recompute", value});
          },
          "alias of --set parallel.recompute=none|selective|full")
      ->group("Megatron-style aliases");
  command
      .add_option_function<long long>(
          "--virtual-stages",
          [&options](const long long& value) {
            options.aliases.push_back({"parallel.virtual_stages", std::to_string(value)});
            options.aliases.push_back({"parallel.schedule", "interleaved"});
          },
          "model chunks per stage; selects the interleaved schedule")
      ->type_name("N")
      ->group("Megatron-style aliases");
}

std::string resolve_scenario_path(const std::string& name_or_path) {
  std::error_code ignored;
  if (fs::is_regular_file(name_or_path, ignored)) return name_or_path;
  const fs::path dir = scenario_dir();
  for (const fs::path& candidate : {dir / name_or_path, dir / (name_or_path + ".toml"),
                                    dir / "published" / name_or_path, dir / "published" / (name_or_path + ".toml")}) {
    if (fs::is_regular_file(candidate, ignored)) return candidate.string();
  }
  throw UserError(
      fmt::format("scenario '{}': no such file, and no {}.toml under {}", name_or_path, name_or_path, dir.string()));
}

model::Scenario load_scenario(const ScenarioOptions& options) {
  std::vector<model::Override> overrides;
  for (const auto& text : options.sets) overrides.push_back(model::parse_override(text));
  overrides.insert(overrides.end(), options.aliases.begin(), options.aliases.end());
  return model::load_scenario(resolve_scenario_path(options.scenario), overrides);
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
  return model::build_program(scenario, granularity);
}

CLI::Validator output_file() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        std::error_code error;
        if (fs::is_directory(path, error)) return fmt::format("'{}' is a directory: give a file name", path);
        const fs::path parent = fs::path(path).parent_path();
        if (!parent.empty() && !fs::is_directory(parent, error)) {
          return fmt::format("'{}': there is no directory '{}'", path, parent.string());
        }
        return {};
      },
      "FILE");
}

CLI::Validator at_least(double minimum) {
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        double value = 0;
        std::size_t used = 0;
        try {
          value = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) return fmt::format("expected a number, got '{}'", text);
        if (value < minimum) return fmt::format("must be at least {}, got {}", minimum, text);
        return {};
      },
      fmt::format(">={}", minimum));
}

void write_file_atomically(const std::string& path, const std::string& contents) {
  const fs::path target(path);
  const fs::path temporary = target.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw UserError(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.flush();
    if (!out) {
      out.close();
      std::error_code ignored;
      fs::remove(temporary, ignored);
      throw UserError(fmt::format("writing '{}' failed (disk full?)", path));
    }
  }
  std::error_code error;
  fs::rename(temporary, target, error);
  if (error) {
    std::error_code ignored;
    fs::remove(temporary, ignored);  // leave nothing half-done behind
    throw UserError(fmt::format("cannot rename '{}' to '{}': {}", temporary.string(), path, error.message()));
  }
}

}  // namespace twin::cli

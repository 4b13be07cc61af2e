// twin sweep SCENARIO --vary KEY=V1,V2,...: how does the prediction move with a key (or a few)?
// Every combination of the --vary values is the scenario with those overrides on top of --set. Each is loaded and
// checked here first, so a variant the scenario loader refuses shows why in its row; the rest are simulated with
// `twin sim` in child processes, --jobs at a time, and printed in the order of the combinations.
#include <algorithm>
#include <cstdio>
#include <set>
#include <thread>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/simulation_pool.hpp"
#include "cli/simulation_ranks.hpp"

namespace twin::cli {
namespace {

constexpr std::size_t kMaxVariants = 256;

struct SweepOptions {
  ScenarioOptions scenario;
  std::vector<std::string> varies;
  int jobs = 0;  // 0: hardware threads
  std::string json_path;
  std::string train_tokens;  // passed on to each `twin sim --train-tokens` (empty: not asked)
  std::string usd_per_gpu_hour;  // passed on to each `twin sim --usd-per-gpu-hour` (empty: not asked)
  bool goodput = false;      // --goodput: each variant's goodput, and the one with most useful tokens per second
  bool quiet = false;        // nothing on stderr but errors
};

// One --vary: a scenario key and the values it takes, in order.
struct Axis {
  std::string key;
  std::vector<std::string> values;
};

// "280,350,420" -> 280 | 350 | 420. A comma inside [...], {...} or a quoted string belongs to the value, so arrays
// and strings sweep too: "[8192,8192,8192],[4096,4096,4096]", "\"1f1b\",\"interleaved\"".
std::vector<std::string> split_values(const std::string& flag, const std::string& list) {
  std::vector<std::string> values;
  std::string current;
  int depth = 0;
  char quote = 0;
  for (const char c : list) {
    if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '[' || c == '{') {
      ++depth;
    } else if (c == ']' || c == '}') {
      if (--depth < 0) throw UserError(fmt::format("--vary {}: a '{}' closes nothing", flag, c));
    } else if (c == ',' && depth == 0) {
      values.push_back(current);
      current.clear();
      continue;
    }
    current += c;
  }
  if (quote != 0 || depth != 0) throw UserError(fmt::format("--vary {}: an unclosed quote or bracket", flag));
  values.push_back(current);
  for (const std::string& value : values) {
    if (value.find_first_not_of(" \t") == std::string::npos) {
      throw UserError(fmt::format("--vary {}: an empty value (give KEY=V1,V2,...)", flag));
    }
  }
  return values;
}

Axis parse_vary(const std::string& flag) {
  const auto equals = flag.find('=');
  if (equals == std::string::npos || equals == 0) {
    throw UserError(fmt::format("--vary {}: expected KEY=V1,V2,... (e.g. --vary cluster.nodes=280,350,420)", flag));
  }
  Axis axis{flag.substr(0, equals), split_values(flag, flag.substr(equals + 1))};
  const auto dot = axis.key.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == axis.key.size()) {
    throw UserError(fmt::format("--vary {}: KEY is section.key, as for --set (e.g. cluster.nodes, parallel.tp)", flag));
  }
  return axis;
}

// What a --set or an alias sets: the text before its '='.
std::string key_of(const std::string& set) {
  return set.substr(0, set.find('='));
}

struct Variant {
  std::vector<std::string> values;  // one per axis
  std::string invalid;              // why the scenario loader refused it
  std::int64_t gpus = 0;
  double tokens_per_iteration = 0;
  SimulationOutcome outcome;
};

// The problems of a refused scenario, on one line.
std::string joined(const std::vector<std::string>& problems) {
  std::string out;
  for (const std::string& problem : problems) out += (out.empty() ? "" : "; ") + problem;
  return out;
}

// A child's last stderr line without the "twin: error: " every error line starts with.
std::string without_prefix(std::string line) {
  for (const std::string prefix : {"twin: error: ", "twin: internal error: "}) {
    if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
  }
  return line;
}

void run_sweep(const SweepOptions& o) {
  std::vector<Axis> axes;
  std::set<std::string> given;
  for (const std::string& set : o.scenario.sets) given.insert(key_of(set));
  for (const auto& alias : o.scenario.aliases) given.insert(alias.key);
  std::size_t combinations = 1;
  for (const std::string& flag : o.varies) {
    Axis axis = parse_vary(flag);
    for (const Axis& other : axes) {
      if (other.key == axis.key) throw UserError(fmt::format("--vary gives {} twice", axis.key));
    }
    if (given.count(axis.key) > 0) {
      throw UserError(fmt::format("--vary and --set (or its alias) both give {}: keep one", axis.key));
    }
    combinations *= axis.values.size();
    if (combinations > kMaxVariants) {
      throw UserError(fmt::format("--vary gives more than {} combinations: split the sweep", kMaxVariants));
    }
    axes.push_back(std::move(axis));
  }

  // Every combination, the first axis slowest, each loaded and checked.
  std::vector<Variant> variants(combinations);
  for (std::size_t i = 0; i < combinations; ++i) {
    std::size_t rest = i;
    for (std::size_t a = axes.size(); a-- > 0;) {
      variants[i].values.insert(variants[i].values.begin(), axes[a].values[rest % axes[a].values.size()]);
      rest /= axes[a].values.size();
    }
  }
  const std::string scenario_path = resolve_scenario_path(o.scenario.scenario);
  require_outputs_before_work({{"--json", o.json_path}}, {{"the scenario", scenario_path}});
  std::string model_name;
  std::vector<std::vector<std::string>> override_lists;
  std::vector<std::size_t> simulated;  // indices of the variants that are simulated
  for (std::size_t i = 0; i < variants.size(); ++i) {
    ScenarioOptions options = o.scenario;
    for (std::size_t a = 0; a < axes.size(); ++a) options.sets.push_back(axes[a].key + "=" + variants[i].values[a]);
    try {
      // The keys Megatron-style flags derive follow the variant (--num-layers-per-virtual-pipeline-stage under a
      // varied parallel.pp).
      const std::vector<model::Override> overrides = scenario_overrides(options);
      const model::Scenario s = model::load_scenario(scenario_path, overrides);
      if (s.cluster.node == model::NodeKind::CpuHost) {
        throw UserError("twin sweep simulates GPU clusters; this variant runs on CPU hosts (cluster.node = cpu-host)");
      }
      variants[i].gpus = s.cluster.total_gpus();
      variants[i].tokens_per_iteration = static_cast<double>(s.parallel.global_batch * s.model.seq_len);
      if (model_name.empty()) model_name = s.model.name;
      override_lists.push_back(as_sets(overrides));
      simulated.push_back(i);
    } catch (const model::ScenarioError& error) {
      variants[i].invalid = joined(error.problems());
    } catch (const UserError& error) {
      variants[i].invalid = error.what();
    }
  }
  if (simulated.empty()) {
    // Nothing to simulate: every variant is a mistake in what was typed, reported as such (exit 2).
    std::vector<std::string> problems;
    for (const Variant& v : variants) {
      if (std::find(problems.begin(), problems.end(), v.invalid) == problems.end()) problems.push_back(v.invalid);
    }
    throw model::ScenarioError(problems);
  }

  const int jobs = o.jobs > 0 ? o.jobs : default_jobs();
  const bool quiet = o.quiet || launched_rank().rank != 0;  // under mpirun / srun rank 0 speaks for all
  std::string keys;
  for (const Axis& axis : axes) keys += (keys.empty() ? "" : " x ") + axis.key;
  if (!quiet) {
    fmt::print(stderr,
               "twin sweep: {} variants of {} ({} refused by the scenario checks); simulating {} with {} jobs\n",
               variants.size(), keys, variants.size() - simulated.size(), simulated.size(), jobs);
  }
  const std::vector<std::string> extra = child_sim_arguments(o.train_tokens, o.usd_per_gpu_hour, o.goodput);
  const std::optional<std::vector<SimulationOutcome>> outcomes =
      simulate_across_ranks(scenario_path, override_lists, jobs, "sweep", extra, !quiet);
  if (!outcomes) return;  // a rank other than 0 of an MPI job: rank 0 has its outcomes
  for (std::size_t j = 0; j < simulated.size(); ++j) variants[simulated[j]].outcome = (*outcomes)[j];

  fmt::print("{}: {} variants of {}\n\n", model_name, variants.size(), keys);
  std::vector<std::size_t> widths;
  std::string header = " ";
  for (std::size_t a = 0; a < axes.size(); ++a) {
    std::size_t width = axes[a].key.size();
    for (const std::string& value : axes[a].values) width = std::max(width, value.size());
    widths.push_back(width);
    header += fmt::format(" {:>{}}", axes[a].key, width);
  }
  const bool training = !o.train_tokens.empty();
  fmt::print("{} {:>6} {:>10} {:>9} {:>8} {:>9} {:>5} {:>12}{}\n", header, "GPUs", "iter s", "TFLOP/s", "bubble",
             "mem GiB", "fits", "tokens/s",
             fmt::format("{}{}", o.goodput ? fmt::format(" {:>8} {:>12}", "goodput", "useful tok/s") : "",
                         training ? fmt::format(" {:>9} {:>12}", "days", "GPU-hours") : ""));
  std::string best_row;  // --goodput: the variant with the most useful tokens per second
  double best_useful_tokens_per_s = 0;
  nlohmann::json results = nlohmann::json::array();
  std::size_t succeeded = 0;
  for (const Variant& v : variants) {
    std::string row = " ";
    nlohmann::json set = nlohmann::json::object();
    for (std::size_t a = 0; a < axes.size(); ++a) {
      row += fmt::format(" {:>{}}", v.values[a], widths[a]);
      set[axes[a].key] = v.values[a];
    }
    nlohmann::json entry{{"set", set},
                         {"gpus", v.gpus},
                         {"iteration_time_s", 0.0},
                         {"tflops_per_gpu", 0.0},
                         {"bubble_fraction", 0.0},
                         {"memory_per_gpu_bytes", 0.0},
                         {"fits", false},
                         {"tokens_per_s", 0.0}};
    std::string error = !v.invalid.empty()         ? "invalid: " + v.invalid
                        : !v.outcome.error.empty() ? "failed: " + without_prefix(v.outcome.error)
                                                   : "";
    if (error.empty()) {
      const auto& summary = v.outcome.summary;
      const double seconds = summary.at("iteration_time_s").get<double>();
      const double memory = summary.at("memory_per_gpu_bytes").get<double>();
      entry["iteration_time_s"] = seconds;
      entry["tflops_per_gpu"] = summary.at("tflops_per_gpu").get<double>();
      entry["bubble_fraction"] = summary.at("bubble_fraction").get<double>();
      entry["time_split"] = summary.value("time_split", nlohmann::json::object());
      entry["memory_per_gpu_bytes"] = memory;
      const bool fits = summary.at("memory").at("fits").get<bool>();
      entry["fits"] = fits;
      entry["tokens_per_s"] = seconds > 0 ? v.tokens_per_iteration / seconds : 0.0;
      std::string training_columns;
      double goodput = 1;
      if (o.goodput) {
        entry["goodput"] = summary.at("goodput");
        goodput = summary.at("goodput").at("goodput_fraction").get<double>();
        const double useful = entry["tokens_per_s"].get<double>() * goodput;
        training_columns = fmt::format(" {:>7.1f}% {:>12.0f}", 100 * goodput, useful);
        if (useful > best_useful_tokens_per_s) best_useful_tokens_per_s = useful, best_row = row;
      }
      if (training) {
        // With --goodput the days count failures (and the GPU-hours the wall time they cost).
        entry["training"] = summary.at("training");
        const double days = summary.at("training").value(o.goodput ? "days_with_failures" : "days", 0.0);
        training_columns += fmt::format(" {:>9.1f} {:>12.0f}", days,
                                        summary.at("training").at("gpu_hours").get<double>() / goodput);
      }
      fmt::print("{} {:>6} {:>10.3f} {:>9.1f} {:>7.1f}% {:>9.1f} {:>5} {:>12.0f}{}\n", row, v.gpus, seconds,
                 entry["tflops_per_gpu"].get<double>(), 100 * entry["bubble_fraction"].get<double>(),
                 memory / (1024.0 * 1024 * 1024), fits ? "yes" : "NO", entry["tokens_per_s"].get<double>(),
                 training_columns);
      ++succeeded;
    } else {
      fmt::print("{}  {}\n", row, error);
    }
    entry["error"] = error;
    results.push_back(std::move(entry));
  }
  if (o.goodput && !best_row.empty()) {
    fmt::print("\n  most useful tokens per second, failures counted:{} ({:.0f})\n", best_row,
               best_useful_tokens_per_s);
  }
  if (!o.json_path.empty()) {
    nlohmann::json varied = nlohmann::json::array();
    for (const Axis& axis : axes) varied.push_back(axis.key);
    write_file_atomically(
        o.json_path,
        nlohmann::json{{"scenario", model_name}, {"varied", varied}, {"variants", results}}.dump(1) + "\n");
  }
  if (succeeded == 0) {
    // Every simulation refused what it was given (exit 2), or some failed: a mistake typed, or a failed run.
    bool mistakes = true;
    for (const Variant& v : variants) mistakes &= !v.invalid.empty() || v.outcome.exit_status == 2;
    fmt::print(stderr, "twin: error: no variant could be simulated (each row says why)\n");
    throw CLI::RuntimeError(mistakes ? 2 : 1);
  }
}

}  // namespace

void register_sweep_command(CLI::App& app) {
  auto o = std::make_shared<SweepOptions>();
  CLI::App* command = app.add_subcommand(
      "sweep", "simulate the scenario at each value of one or more keys (--vary cluster.nodes=280,350,420)");
  add_scenario_options(*command, o->scenario);
  command
      ->add_option("--vary", o->varies,
                   "a key and its values, KEY=V1,V2,... (repeatable: every combination is simulated)")
      ->type_name("KEY=V1,V2,...")
      ->required();
  command
      ->add_option("--jobs", o->jobs,
                   "simulations at a time on each host (default: one per core, shared among the MPI ranks on it)")
      ->check(between(1, 1024));
  command->add_option("--json", o->json_path, "write every variant and its result as JSON")->check(output_file());
  command
      ->add_option("--usd-per-gpu-hour", o->usd_per_gpu_hour,
                   "with --train-tokens: each plan's GPU-hours priced at this many dollars per GPU-hour (JSON "
                   "training.cost_usd)")
      ->check(between(0.001, 1000));
  command
      ->add_option("--train-tokens", o->train_tokens,
                   "also estimate each variant's whole training run of this many tokens: days, GPU-hours")
      ->check(token_count("--train-tokens"));
  command->add_flag("--goodput", o->goodput,
                    "each variant's goodput by the scenario's failure model (twin goodput), its useful tokens per "
                    "second, --train-tokens days with failures, and the variant with the most useful tokens per "
                    "second");
  command->add_flag("--quiet", o->quiet, "no progress on stderr (errors still)");
  command->callback([o] { run_sweep(*o); });
}

}  // namespace twin::cli

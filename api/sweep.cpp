// A sweep's variants: the --vary values parsed, every combination loaded and checked, the valid ones simulated.
#include "api/sweep.hpp"

#include <algorithm>
#include <optional>
#include <set>

#include <fmt/core.h>

#include "api/scenario.hpp"
#include "model/scenario/errors.hpp"
#include "report/plan_documents.hpp"
#include "report/within_days.hpp"

namespace twin::api {
namespace {

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

SweepAxis parse_vary(const std::string& flag) {
  const auto equals = flag.find('=');
  if (equals == std::string::npos || equals == 0) {
    throw UserError(fmt::format("--vary {}: expected KEY=V1,V2,... (e.g. --vary cluster.nodes=280,350,420)", flag));
  }
  SweepAxis axis{flag.substr(0, equals), split_values(flag, flag.substr(equals + 1))};
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

// The problems of a refused scenario, on one line.
std::string joined(const std::vector<std::string>& problems) {
  std::string out;
  for (const std::string& problem : problems) out += (out.empty() ? "" : "; ") + problem;
  return out;
}

std::vector<SweepAxis> parse_axes(const SweepRequest& request) {
  std::set<std::string> given(request.given_keys.begin(), request.given_keys.end());
  for (const std::string& set : request.sets) given.insert(key_of(set));
  std::vector<SweepAxis> axes;
  std::size_t combinations = 1;
  for (const std::string& flag : request.varies) {
    SweepAxis axis = parse_vary(flag);
    for (const SweepAxis& other : axes) {
      if (other.key == axis.key) throw UserError(fmt::format("--vary gives {} twice", axis.key));
    }
    if (given.count(axis.key) > 0) {
      throw UserError(fmt::format("--vary and --set (or its alias) both give {}: keep one", axis.key));
    }
    combinations *= axis.values.size();
    if (combinations > kMaxSweepVariants) {
      throw UserError(fmt::format("--vary gives more than {} combinations: split the sweep", kMaxSweepVariants));
    }
    axes.push_back(std::move(axis));
  }
  if (axes.empty()) throw UserError("--vary: give at least one KEY=V1,V2,... (e.g. --vary cluster.nodes=280,350,420)");
  return axes;
}

// Loads the variant with its overrides; records why the loader refused it, or what it is.
void load_variant(const SweepRequest& request, Sweep& sweep, SweepVariant& variant) {
  std::vector<std::string> variant_sets;
  for (std::size_t a = 0; a < sweep.axes.size(); ++a)
    variant_sets.push_back(sweep.axes[a].key + "=" + variant.values[a]);
  try {
    std::vector<model::Override> overrides;
    if (request.overrides_of) {
      overrides = request.overrides_of(variant_sets);
    } else {
      overrides = parse_overrides(request.sets);
      for (const model::Override& one : parse_overrides(variant_sets)) overrides.push_back(one);
    }
    const model::Scenario s = model::load_scenario(sweep.scenario_path, overrides);
    if (s.cluster.node == model::NodeKind::CpuHost) {
      throw UserError("twin sweep simulates GPU clusters; this variant runs on CPU hosts (cluster.node = cpu-host)");
    }
    variant.gpus = s.cluster.total_gpus();
    variant.tokens_per_iteration = static_cast<double>(s.parallel.global_batch * s.model.seq_len);
    if (sweep.model_name.empty()) sweep.model_name = s.model.name;
    for (const model::Override& one : overrides) variant.sets.push_back(one.key + "=" + one.value);
    ++sweep.simulated;
  } catch (const model::ScenarioError& error) {
    variant.invalid = joined(error.problems());
  } catch (const UserError& error) {
    variant.invalid = error.what();
  }
}

// A child's last stderr line without the "twin: error: " every error line starts with.
std::string without_prefix(std::string line) {
  for (const std::string prefix : {"twin: error: ", "twin: internal error: "}) {
    if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
  }
  return line;
}

}  // namespace

std::string Sweep::keys() const {
  std::string out;
  for (const SweepAxis& axis : axes) out += (out.empty() ? "" : " x ") + axis.key;
  return out;
}

Sweep prepare_sweep(const SweepRequest& request) {
  Sweep sweep;
  sweep.axes = parse_axes(request);
  std::size_t combinations = 1;
  for (const SweepAxis& axis : sweep.axes) combinations *= axis.values.size();
  sweep.scenario_path = resolve_scenario_path(request.scenario);
  // Every combination, the first axis slowest, each loaded and checked.
  sweep.variants.resize(combinations);
  for (std::size_t i = 0; i < combinations; ++i) {
    std::size_t rest = i;
    SweepVariant& variant = sweep.variants[i];
    for (std::size_t a = sweep.axes.size(); a-- > 0;) {
      const auto& values = sweep.axes[a].values;
      variant.values.insert(variant.values.begin(), values[rest % values.size()]);
      rest /= values.size();
    }
    load_variant(request, sweep, variant);
  }
  if (sweep.simulated == 0) {
    // Nothing to simulate: every variant is a mistake in what was typed, reported as such.
    std::vector<std::string> problems;
    for (const SweepVariant& v : sweep.variants) {
      if (std::find(problems.begin(), problems.end(), v.invalid) == problems.end()) problems.push_back(v.invalid);
    }
    throw model::ScenarioError(problems);
  }
  return sweep;
}

void run_sweep(Sweep& sweep, const SweepRequest& request, const VariantSimulator& simulator) {
  std::vector<std::vector<std::string>> override_lists;
  std::vector<std::size_t> simulated;  // indices of the variants that are simulated
  for (std::size_t i = 0; i < sweep.variants.size(); ++i) {
    if (!sweep.variants[i].invalid.empty()) continue;
    override_lists.push_back(sweep.variants[i].sets);
    simulated.push_back(i);
  }
  const std::vector<VariantOutcome> outcomes = simulator(sweep.scenario_path, override_lists, request.extras);
  for (std::size_t j = 0; j < simulated.size() && j < outcomes.size(); ++j) {
    sweep.variants[simulated[j]].outcome = outcomes[j];
  }
}

Sweep sweep(const SweepRequest& request, const VariantSimulator& simulator) {
  Sweep result = prepare_sweep(request);
  run_sweep(result, request, simulator);
  return result;
}

nlohmann::json sweep_rows(const Sweep& sweep, const SweepRequest& request) {
  nlohmann::json rows = nlohmann::json::array();
  for (const SweepVariant& v : sweep.variants) {
    report::SweepRow row;
    for (std::size_t a = 0; a < sweep.axes.size(); ++a) row.set.emplace_back(sweep.axes[a].key, v.values[a]);
    row.gpus = v.gpus;
    row.tokens_per_iteration = v.tokens_per_iteration;
    row.error = !v.invalid.empty()         ? "invalid: " + v.invalid
                : !v.outcome.error.empty() ? "failed: " + without_prefix(v.outcome.error)
                                           : "";
    row.summary = v.outcome.summary;
    rows.push_back(report::sweep_row_json(row, request.extras.goodput, !request.extras.train_tokens.empty()));
  }
  if (request.within_days > 0) report::mark_finishes_in_days(rows, request.within_days);
  return rows;
}

nlohmann::json sweep_document(const Sweep& sweep, const SweepRequest& request) {
  std::vector<std::string> varied;
  for (const SweepAxis& axis : sweep.axes) varied.push_back(axis.key);
  const nlohmann::json rows = sweep_rows(sweep, request);
  nlohmann::json document = report::sweep_document(sweep.model_name, varied, rows);
  if (request.within_days > 0) {
    const std::optional<std::size_t> best = report::fewest_gpus_within_days(rows);
    document["fewest_gpus_within_days"] = best ? rows[*best] : nlohmann::json(nullptr);
  }
  return document;
}

}  // namespace twin::api
